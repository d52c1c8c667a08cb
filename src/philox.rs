//! Philox4x32-10, the counter-based generator of Salmon et al. (SC'11) used by cuRAND and
//! JAX: a keyed bijection of a 128-bit counter, so any element's random bits can be computed
//! directly from its position, on any thread or device, with no state to carry.
//!
//! Stochastic rounding keys it with the 64-bit seed and counts with
//! `(block, call)`: element `i` of the `call`-th stochastic quantization reads word `i % 4`
//! of the output for counter `[i / 4 (lo, hi), call (lo, hi)]`. Results therefore depend
//! only on (seed, call, element index), never on the thread count or device.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32 with 10 rounds on counter `ctr` and key `key`.
#[inline(always)]
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = ctr;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The random-bit stream of one stochastic quantization: (seed, call) fixed, indexed by
/// element position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    key: [u32; 2],
    call: u64,
}

impl Stream {
    /// The stream for the `call`-th stochastic rounding under `seed`.
    pub fn new(seed: u64, call: u64) -> Self {
        Stream {
            key: [seed as u32, (seed >> 32) as u32],
            call,
        }
    }

    /// The seed this stream was built from.
    pub fn seed(&self) -> u64 {
        self.key[0] as u64 | (self.key[1] as u64) << 32
    }

    /// The call index this stream was built from.
    pub fn call(&self) -> u64 {
        self.call
    }

    /// The four 32-bit words for elements `4 * block .. 4 * block + 4`.
    #[inline(always)]
    pub fn block(&self, block: u64) -> [u32; 4] {
        philox4x32_10(
            [
                block as u32,
                (block >> 32) as u32,
                self.call as u32,
                (self.call >> 32) as u32,
            ],
            self.key,
        )
    }

    /// The words of elements `4 * first_block ..`, one per element of `out` (whose length
    /// need not be a multiple of 4). Computes eight blocks at a time in struct-of-arrays
    /// form so the rounds vectorise.
    #[inline(always)]
    // Indexing lanes across the four counter words is the struct-of-arrays layout the
    // vectoriser needs.
    #[allow(clippy::needless_range_loop)]
    pub fn fill(&self, first_block: u64, out: &mut [u32]) {
        const LANES: usize = 8;
        let mut groups = out.chunks_mut(4 * LANES);
        let mut block = first_block;
        for group in &mut groups {
            let mut c = [[0u32; LANES]; 4];
            for lane in 0..LANES {
                let b = block + lane as u64;
                c[0][lane] = b as u32;
                c[1][lane] = (b >> 32) as u32;
                c[2][lane] = self.call as u32;
                c[3][lane] = (self.call >> 32) as u32;
            }
            let mut k = self.key;
            for round in 0..10 {
                if round > 0 {
                    k[0] = k[0].wrapping_add(W0);
                    k[1] = k[1].wrapping_add(W1);
                }
                for lane in 0..LANES {
                    let (hi0, lo0) = mulhilo(M0, c[0][lane]);
                    let (hi1, lo1) = mulhilo(M1, c[2][lane]);
                    let (c1, c3) = (c[1][lane], c[3][lane]);
                    c[0][lane] = hi1 ^ c1 ^ k[0];
                    c[1][lane] = lo1;
                    c[2][lane] = hi0 ^ c3 ^ k[1];
                    c[3][lane] = lo0;
                }
            }
            for (j, w) in group.iter_mut().enumerate() {
                *w = c[j % 4][j / 4];
            }
            block += LANES as u64;
        }
    }

    /// [`Stream::fill`] with AVX-512 intrinsics: sixteen blocks (64 words) per step, one
    /// block per 32-bit lane of four counter vectors, four independent steps interleaved
    /// (each round waits on the products of the one before, so a single step leaves the
    /// multipliers idle for most of their latency). The 32x32-bit products come from
    /// `vpmuludq` on the even lanes and on the odd lanes shifted down; their high and low
    /// halves are merged by masked in-lane shuffles (the partner dword of each 64-bit
    /// product swapped in), and the three-way XOR of each round is one `vpternlogd` with
    /// the round key, broadcast once per call. The lanes are then transposed into element
    /// order. The words are those of [`Stream::fill`] (tested), whose scalar loop finishes
    /// the last partial step.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fill_avx512(&self, first_block: u64, out: &mut [u32]) {
        use std::arch::x86_64::*;
        const STEP: usize = 64;
        // (hi, lo) of the 32x32-bit products of every lane of `c` with `m`: the even lanes'
        // 64-bit products sit in `even`, the odd lanes' in `odd`; swapping the dwords of
        // each 64-bit lane (`CDAB`) moves a product's other half next to the one in place.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn mulhilo16(m: __m512i, c: __m512i) -> (__m512i, __m512i) {
            let even = _mm512_mul_epu32(c, m);
            let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(c), m);
            let hi = _mm512_mask_shuffle_epi32::<_MM_PERM_CDAB>(odd, 0x5555, even);
            let lo = _mm512_mask_shuffle_epi32::<_MM_PERM_CDAB>(even, 0xaaaa, odd);
            (hi, lo)
        }
        // One Philox round on sixteen blocks.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn round16(c: [__m512i; 4], m0: __m512i, m1: __m512i, key: &[__m512i; 2]) -> [__m512i; 4] {
            let (hi0, lo0) = mulhilo16(m0, c[0]);
            let (hi1, lo1) = mulhilo16(m1, c[2]);
            [
                _mm512_ternarylogic_epi32::<0x96>(hi1, c[1], key[0]),
                lo1,
                _mm512_ternarylogic_epi32::<0x96>(hi0, c[3], key[1]),
                lo0,
            ]
        }
        // Stores sixteen blocks' words in element order: each 128-bit lane L of u_j gets
        // the four words of block 4L + j (32- and 64-bit unpacks), then a 4x4 transpose of
        // the 128-bit lanes puts the blocks in order.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn store_blocks(c: [__m512i; 4], out: &mut [u32]) {
            let t0 = _mm512_unpacklo_epi32(c[0], c[1]);
            let t1 = _mm512_unpackhi_epi32(c[0], c[1]);
            let t2 = _mm512_unpacklo_epi32(c[2], c[3]);
            let t3 = _mm512_unpackhi_epi32(c[2], c[3]);
            let u0 = _mm512_unpacklo_epi64(t0, t2);
            let u1 = _mm512_unpackhi_epi64(t0, t2);
            let u2 = _mm512_unpacklo_epi64(t1, t3);
            let u3 = _mm512_unpackhi_epi64(t1, t3);
            let v0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u0, u1);
            let v1 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u2, u3);
            let v2 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u0, u1);
            let v3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u2, u3);
            let words = [
                _mm512_shuffle_i32x4::<0b10_00_10_00>(v0, v1),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(v0, v1),
                _mm512_shuffle_i32x4::<0b10_00_10_00>(v2, v3),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(v2, v3),
            ];
            for (part, w) in out.chunks_exact_mut(16).zip(words) {
                // SAFETY: `part` holds 16 u32 (64 bytes); unaligned store.
                unsafe { _mm512_storeu_si512(part.as_mut_ptr().cast(), w) };
            }
        }
        let m0 = _mm512_set1_epi32(M0 as i32);
        let m1 = _mm512_set1_epi32(M1 as i32);
        let call_lo = _mm512_set1_epi32(self.call as u32 as i32);
        let call_hi = _mm512_set1_epi32((self.call >> 32) as u32 as i32);
        let mut keys = [[_mm512_setzero_si512(); 2]; 10];
        let mut k = self.key;
        for (round, key) in keys.iter_mut().enumerate() {
            if round > 0 {
                k[0] = k[0].wrapping_add(W0);
                k[1] = k[1].wrapping_add(W1);
            }
            *key = [
                _mm512_set1_epi32(k[0] as i32),
                _mm512_set1_epi32(k[1] as i32),
            ];
        }
        let lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        // The counters of blocks `block + lane`: the low words, and the high words with the
        // carry out of the low ones (a lane whose low word wrapped is below the first).
        let counters = |block: u64| {
            let base = _mm512_set1_epi32(block as u32 as i32);
            let lo = _mm512_add_epi32(base, lanes);
            let carry = _mm512_cmplt_epu32_mask(lo, base);
            let hi = _mm512_set1_epi32((block >> 32) as u32 as i32);
            [
                lo,
                _mm512_mask_add_epi32(hi, carry, hi, _mm512_set1_epi32(1)),
                call_lo,
                call_hi,
            ]
        };
        // Four independent steps per iteration: each round waits on the previous one's
        // products, so interleaving chains keeps the multipliers busy.
        const CHAINS: usize = 4;
        let mut groups = out.chunks_exact_mut(CHAINS * STEP);
        let mut block = first_block;
        for group in &mut groups {
            let mut st: [[__m512i; 4]; CHAINS] =
                std::array::from_fn(|i| counters(block.wrapping_add(16 * i as u64)));
            for key in &keys {
                for c in st.iter_mut() {
                    *c = round16(*c, m0, m1, key);
                }
            }
            for (c, part) in st.into_iter().zip(group.chunks_exact_mut(STEP)) {
                store_blocks(c, part);
            }
            block = block.wrapping_add(16 * CHAINS as u64);
        }
        let mut steps = groups.into_remainder().chunks_exact_mut(STEP);
        for step in &mut steps {
            let mut a = counters(block);
            for key in &keys {
                a = round16(a, m0, m1, key);
            }
            store_blocks(a, step);
            block = block.wrapping_add(16);
        }
        self.fill(block, steps.into_remainder());
    }

    /// The 32 random bits of element `index`.
    pub fn at(&self, index: u64) -> u32 {
        self.block(index / 4)[(index % 4) as usize]
    }
}

/// FNV-1a over `bytes`: turns names into stream keys (the stream seed or call index of a
/// named variable), stable across runs and platforms.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 fill gives the words of `at` for starts where the 32-bit low counter
    /// word carries into the high one inside a step, and for lengths around the 64-word
    /// step and the 256-word group of four interleaved steps (where single steps, then the
    /// scalar fill, finish), with a call index above 2^32.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_fill_gives_the_same_words_as_at() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        let stream = Stream::new(0xfeed_beef_0123_4567, (1 << 32) + 5);
        for first_block in [0u64, 3, (1 << 32) - 7, (5 << 32) - 30] {
            for len in [
                0usize, 5, 63, 64, 65, 127, 128, 200, 255, 256, 257, 320, 511, 1024, 1100,
            ] {
                let mut out = vec![0u32; len];
                // SAFETY: the CPU supports AVX-512 F, checked above.
                unsafe { stream.fill_avx512(first_block, &mut out) };
                for (j, &w) in out.iter().enumerate() {
                    let block = first_block.wrapping_add(j as u64 / 4);
                    let want = stream.block(block)[j % 4];
                    assert_eq!(w, want, "block {first_block} len {len} j {j}");
                }
            }
        }
    }

    #[test]
    fn fill_gives_the_same_words_as_at_for_any_start_and_length() {
        let stream = Stream::new(0x1234_5678_9abc_def0, 77);
        for first_block in [0u64, 1, 5, (1 << 32) - 3] {
            for len in [0usize, 1, 3, 4, 31, 32, 33, 100] {
                let mut out = vec![0u32; len];
                stream.fill(first_block, &mut out);
                for (j, &w) in out.iter().enumerate() {
                    assert_eq!(
                        w,
                        stream.at(4 * first_block + j as u64),
                        "block {first_block} len {len} j {j}"
                    );
                }
            }
        }
    }
}
