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
