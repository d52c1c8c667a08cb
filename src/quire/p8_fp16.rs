//! The naive posit<8,0> sums in binary16 lanes (AVX-512 FP16 and VBMI), a kernel of
//! [`super::p8_lanes`] with the same bits as its i16 kernels: `c = round(c + round(a_t ·
//! b_tj))` from 0, `t` ascending, each lane one output column.
//!
//! # Values
//!
//! A value of `u` units of minpos ([`super::p8_units`]) is the binary16 number `u · 2^-10`:
//! exact (a posit<8,0> value has at most six significant bits) and normal (`1 <= |u| <=
//! 4096` gives `2^-10 ..= 4`). The scale `2^-10` leaves room above maxpos for the
//! saturation below.
//!
//! # Products
//!
//! `round(a_t · b_tj)` comes from the product table ([`super::p8_units::P8Units::prod`]) as
//! binary16 bits ([`Fp16Table`]): each row's 128 entries split into a plane of low bytes and
//! a plane of high bytes, 128 bytes (two registers) each. `vpermt2b` looks up 64 columns in
//! one plane (the index is each column's key, [`to_bytes`]: `vpermt2b` reads its low seven
//! bits, the magnitude pattern), the key's bit 7 (the column's sign) is exclusive-ored into
//! the high bytes (the rounding is symmetric), and `vpunpcklbw` and `vpunpckhbw` interleave
//! the two planes' bytes into words. The interleave works within
//! 128-bit lanes, so `B`'s patterns are stored in the order that brings the words out in
//! column order ([`to_bytes`]): in each group of 64 columns, byte `16ℓ + 8h + i` holds
//! column `32h + 8ℓ + i` (`ℓ < 4`, `h < 2`, `i < 8`).
//!
//! # Sums
//!
//! `y = fl16(c + p)` (`vaddph`) is the exact sum `v = c + p` except where `|v| > 2048` units
//! and `v` is odd (`|v| < 4096`, binary16's spacing is two units there) or not a multiple of
//! four (above). Rounding `y` instead of `v` gives the same posit:
//!
//! * `|v| >= 4096`: both round to maxpos (`fl16` is monotone and 4096 is a binary16 number).
//! * odd `v` with `2048 < |v| < 4096`: one term is odd, so below 64 units, and the other
//!   within 64 units of `|v|`, where posit<8,0> has only 2048 and 4096. So `|v|` lies
//!   within 64 units of 2048 or 4096, far from the only rounding boundary of that binade
//!   (the tie 3072), and `y`, within one unit of `v`, rounds alike.
//!
//! `y` is rounded as `(y + M) - M` (`vaddph`, `vsubph`, nearest even), with `M` from a
//! 32-entry table by `y`'s exponent field (`vpermw`) and `y`'s sign (so `|y + M| = |y| +
//! |M|` and the rounding is symmetric). Where `M`'s spacing is `2^q` and `|y|` small enough
//! that `y + M` stays in `M`'s binade, `y + M` rounds `y` to a multiple of `2^q`, ties to
//! the even multiple when `M` is an even multiple, and the subtraction is exact. By
//! exponent field `E` (`|y|` in units is in `[2^(E-5), 2^(E-4))`):
//!
//! | `E` | `\|y\|` in units | `M` | spacing of `M` (units) |
//! |---|---|---|---|
//! | `0 ..= 10` (and zero) | below 64 | 1.5 | 1 (the sums are whole units: exact) |
//! | `11 + e`, `e = 0 ..= 4` | `[64·2^e, 64·2^(e+1))` | `1.5 · 2^(2e+1)` | `2^(2e+1)`, the posit's |
//! | 16 | `[2048, 4096)` | `3074 = 1.5 · 2^11 + 2` | 2048 |
//! | 17, 18 | `[4096, 8192]` | `8188 = 2^13 - 4` | 4096 |
//!
//! Ties to the even multiple are ties to the even pattern in binades 0 to 4
//! ([`super::p8_units`]). The top binade's tie 3072 must go down to 2048 (the even pattern,
//! the odd multiple): its `M` is one spacing odd, so the tie goes to the even multiple of
//! `y + M`, which is the odd multiple of `y`. Above maxpos, `y + 8188` lies in `[8192,
//! 8196]`, where binary16's spacing is 8: it rounds to 8192 (the tie 8196 to the even 8192),
//! and the result is 4 (maxpos) for every such `y`.
//!
//! `tests/naive_p8_lanes.rs` checks every product and every sum of two finite values, and
//! whole GEMMs, against the exact operation tables with this kernel and without it.

use std::sync::OnceLock;

use half::f16;

use super::p8_lanes::Columns;
use super::p8_units::P8Units;

/// Bytes of one row of [`Fp16Table`]: a plane of 128 low bytes, then 128 high bytes.
const ROW_BYTES: usize = 256;

/// Columns looked up by one `vpermt2b`.
pub const GROUP: usize = 64;

/// The product table as binary16 bits of `units · 2^-10`, in byte planes (see the module
/// docs).
pub struct Fp16Table {
    planes: Vec<u8>,
}

impl Fp16Table {
    /// The table (built on first use from [`P8Units::prod`]).
    pub fn get() -> &'static Fp16Table {
        static TABLE: OnceLock<Fp16Table> = OnceLock::new();
        TABLE.get_or_init(|| {
            let prod = &P8Units::get().prod;
            let mut planes = vec![0u8; 256 * ROW_BYTES];
            for (row, entries) in planes.chunks_mut(ROW_BYTES).zip(prod.chunks(128)) {
                let (lo, hi) = row.split_at_mut(128);
                for ((l, h), &u) in lo.iter_mut().zip(hi).zip(entries) {
                    [*l, *h] = value(u).to_le_bytes();
                }
            }
            Fp16Table { planes }
        })
    }
}

/// The binary16 bits of a value of `u` units (`|u| <= 8192`).
pub fn value(u: i16) -> u16 {
    f16::from_f32(f32::from(u) / 1024.0).to_bits()
}

/// Row length of `B`'s bytes for a code stride of `stride`.
pub fn byte_stride(stride: usize) -> usize {
    stride.div_ceil(GROUP) * GROUP
}

/// `B`'s keys as the kernel reads them: `k` rows of [`byte_stride`] bytes from `k` rows of
/// `stride` lane codes, each a column's magnitude pattern with its sign in bit 7, each group
/// of 64 columns in the order of the module docs (byte `16ℓ + 8h + i` holds column `32h +
/// 8ℓ + i`), the padding 0.
pub fn to_bytes(codes: &[i16], (k, stride): (usize, usize), bytes: &mut Vec<u8>) {
    let bs = byte_stride(stride);
    bytes.clear();
    bytes.resize(k * bs, 0);
    for (dst, src) in bytes
        .chunks_mut(bs.max(1))
        .zip(codes.chunks(stride.max(1)))
        .take(k)
    {
        for (out, group) in dst.chunks_mut(GROUP).zip(src.chunks(GROUP)) {
            #[cfg(target_arch = "x86_64")]
            if supported() {
                // SAFETY: the CPU has AVX-512 F and BW; `out` holds 64 bytes, `group` at
                // most 64 codes.
                unsafe { x86::group_keys(group, out) };
                continue;
            }
            group_keys(group, out);
        }
    }
}

/// [`to_bytes`] of one group of at most 64 codes into `out` (64 bytes), one code at a time.
fn group_keys(group: &[i16], out: &mut [u8]) {
    // Runs of eight columns: column 32h + 8ℓ + i to byte 16ℓ + 8h + i.
    for (run, cols) in group.chunks(8).enumerate() {
        let (h, l) = (run / 4, run % 4);
        for (d, &code) in out[16 * l + 8 * h..].iter_mut().zip(cols) {
            *d = ((code as u16 >> 8) as u8 & 0x80) | (code as u8 & 0x7f);
        }
    }
}

/// The `M` of the rounding by exponent field (see the module docs), binary16 bits.
const MAGIC: [u16; 32] = magic();

const fn magic() -> [u16; 32] {
    let mut m = [0u16; 32];
    let mut e = 0;
    while e < 32 {
        let v = if e <= 10 {
            1.5
        } else if e <= 15 {
            1.5 * (1u32 << (2 * (e - 11) + 1)) as f32
        } else if e == 16 {
            3074.0
        } else {
            8188.0
        };
        m[e] = f16::from_f32_const(v).to_bits();
        e += 1;
    }
    m
}

/// The rounding of a sum `y` by the magic constants (`(y + M) - M`, `M` with `y`'s sign),
/// on one lane: the scalar form of the kernel's steps, for tests.
pub fn round_sum(y: f16) -> f16 {
    let m = f16::from_bits(MAGIC[usize::from((y.to_bits() >> 10) & 31)] | (y.to_bits() & 0x8000));
    // binary16 sums through f32 are correctly rounded (24 >= 2·11 + 2 bits).
    let s = f16::from_f32(y.to_f32() + m.to_f32());
    f16::from_f32(s.to_f32() - m.to_f32())
}

/// Whether the CPU has what the kernel needs (AVX-512 F, BW, VBMI and FP16).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx512bw") && has!("avx512vbmi") && has!("avx512fp16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The sums of one or two rows `a` (product table rows, at least `k` each) against all of
/// `b`, into `acc` (`a.len()` rows of `b.stride`) in units.
///
/// # Panics
/// Where the CPU lacks the kernel's instructions ([`supported`]) or the bounds do not hold.
pub fn sums(a: &[&[u8]], b: &Columns, k: usize, acc: &mut [i16]) {
    let table = Fp16Table::get();
    assert!(supported(), "the CPU lacks AVX-512 FP16 or VBMI");
    assert!(b.stride.is_multiple_of(32) && b.codes.len() >= k * b.stride);
    assert!(b.bytes.len() >= k * byte_stride(b.stride) && acc.len() >= a.len() * b.stride);
    assert!(a.iter().all(|r| r.len() >= k));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has the instructions (asserted); the bounds are asserted above, and
    // every row index (a byte) is below 256, the table's rows.
    unsafe {
        match *a {
            [r0, r1] => x86::rows::<2>(&table.planes, [r0, r1], b, k, acc),
            [r0] => x86::rows::<1>(&table.planes, [r0], b, k, acc),
            _ => panic!("one or two rows"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    use super::{byte_stride, Columns, GROUP, MAGIC, ROW_BYTES};

    /// Tiles of 32 columns summed together.
    const TILES: usize = 4;

    /// Constant registers of the kernel.
    #[derive(Clone, Copy)]
    struct Consts {
        magic: __m512i,
        sign: __m512i,
        sign_byte: __m512i,
        scale: __m512i,
    }

    /// A two-operand binary16 instruction on 32 lanes as a function.
    macro_rules! binary_ph {
        ($name:ident, $insn:literal, $what:literal) => {
            #[doc = concat!("`", $what, "` in binary16 lanes (`", $insn, "`).")]
            #[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
            #[inline]
            fn $name(a: __m512i, b: __m512i) -> __m512i {
                let r;
                // SAFETY: the instruction reads and writes registers only; the CPU has
                // AVX512-FP16 (this function's target features).
                unsafe {
                    asm!(concat!($insn, " {r}, {a}, {b}"), r = lateout(zmm_reg) r,
                         a = in(zmm_reg) a, b = in(zmm_reg) b,
                         options(pure, nomem, nostack, preserves_flags))
                };
                r
            }
        };
    }

    binary_ph!(add_ph, "vaddph", "a + b");
    binary_ph!(sub_ph, "vsubph", "a - b");

    /// Whole binary16 values `a · s` to i16 (`vmulph`, `vcvtph2w`).
    #[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
    #[inline]
    fn to_units(a: __m512i, s: __m512i) -> __m512i {
        let r;
        // SAFETY: the instructions read and write registers only; the CPU has AVX512-FP16.
        unsafe {
            asm!("vmulph {r}, {a}, {s}", "vcvtph2w {r}, {r}", r = out(zmm_reg) r,
                 a = in(zmm_reg) a, s = in(zmm_reg) s, options(pure, nomem, nostack, preserves_flags))
        };
        r
    }

    /// The rounded sum of 32 lanes (see the module docs).
    #[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
    #[inline]
    fn round(y: __m512i, k: &Consts) -> __m512i {
        let m = _mm512_permutexvar_epi16(_mm512_srli_epi16::<10>(y), k.magic);
        // m | (y & sign)
        let m = _mm512_ternarylogic_epi32::<0xF8>(m, y, k.sign);
        sub_ph(add_ph(y, m), m)
    }

    /// Columns `col .. col + J·32` of `R` rows (`col` a multiple of [`GROUP`]).
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512fp16")]
    #[inline]
    unsafe fn block<const R: usize, const J: usize>(
        planes: &[u8],
        a: [&[u8]; R],
        b: &Columns,
        (col, k): (usize, usize),
        acc: &mut [i16],
        kc: &Consts,
    ) {
        let mut c = [[_mm512_setzero_si512(); J]; R];
        let (stride, bs) = (b.stride, byte_stride(b.stride));
        let bytes = b.bytes.as_ptr();
        for t in 0..k {
            let mut rows = [[_mm512_setzero_si512(); 4]; R];
            for (r, regs) in rows.iter_mut().enumerate() {
                // SAFETY: a row index is below 256, the table's rows.
                let p = unsafe { planes.as_ptr().add(a[r][t] as usize * ROW_BYTES) };
                for (q, reg) in regs.iter_mut().enumerate() {
                    *reg = unsafe { _mm512_loadu_si512(p.add(q * 64) as *const _) };
                }
            }
            for g in 0..J.div_ceil(2) {
                // SAFETY: row t of the bytes holds `bs >= col + 64·(g + 1)` bytes.
                let idx =
                    unsafe { _mm512_loadu_si512(bytes.add(t * bs + col + g * GROUP) as *const _) };
                for r in 0..R {
                    let [l0, l1, h0, h1] = rows[r];
                    let lo = _mm512_permutex2var_epi8(l0, idx, l1);
                    let hi = _mm512_permutex2var_epi8(h0, idx, h1);
                    // The column's sign (bit 7 of its key) into the high byte: hi ^ (idx & 0x80).
                    let hi = _mm512_ternarylogic_epi32::<0x78>(hi, idx, kc.sign_byte);
                    for h in 0..2 {
                        let j = 2 * g + h;
                        if j >= J {
                            break;
                        }
                        let p = if h == 0 {
                            _mm512_unpacklo_epi8(lo, hi)
                        } else {
                            _mm512_unpackhi_epi8(lo, hi)
                        };
                        c[r][j] = round(add_ph(c[r][j], p), kc);
                    }
                }
            }
        }
        for (r, row) in c.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                // SAFETY: `acc` holds R rows of `stride >= col + 32·J`.
                unsafe {
                    _mm512_storeu_si512(
                        acc.as_mut_ptr().add(r * stride + col + 32 * j) as *mut _,
                        to_units(v, kc.scale),
                    )
                };
            }
        }
    }

    /// The keys of one group of at most 64 codes into `out` (64 bytes), in the order of
    /// [`super::to_bytes`]: each code `w` to the low byte of `w | (w >> 8)` (the pattern,
    /// and the sign from bit 15 to bit 7), then the two halves' runs of eight interleaved.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW; `src` holds at most 64 codes, `out` at least 64 bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn group_keys(src: &[i16], out: &mut [u8]) {
        assert!(src.len() <= GROUP && out.len() >= GROUP);
        // The keys of codes `first .. first + 32` (those past the end read as 0).
        let keys = |first: usize| {
            let len = src.len().saturating_sub(first).min(32);
            let live: __mmask32 = if len == 0 { 0 } else { u32::MAX >> (32 - len) };
            // SAFETY: the mask enables `len` codes from `first`, all inside `src`.
            let w = unsafe { _mm512_maskz_loadu_epi16(live, src.as_ptr().wrapping_add(first)) };
            let k = _mm512_cvtepi16_epi8(_mm512_or_si512(w, _mm512_srli_epi16::<8>(w)));
            _mm512_castsi256_si512(k)
        };
        let order = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
        let bytes = _mm512_permutex2var_epi64(keys(0), order, keys(32));
        // SAFETY: `out` holds 64 bytes (asserted).
        unsafe { _mm512_storeu_si512(out.as_mut_ptr() as *mut _, bytes) };
    }

    /// The sums of `R` rows against all of `B` (see [`super::sums`]).
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VBMI and FP16; the bounds of [`super::sums`] hold.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512fp16")]
    pub(super) unsafe fn rows<const R: usize>(
        planes: &[u8],
        a: [&[u8]; R],
        b: &Columns,
        k: usize,
        acc: &mut [i16],
    ) {
        let kc = Consts {
            // SAFETY: MAGIC holds 32 u16, one 512-bit vector.
            magic: unsafe { _mm512_loadu_si512(MAGIC.as_ptr() as *const _) },
            sign: _mm512_set1_epi16(i16::MIN),
            sign_byte: _mm512_set1_epi8(i8::MIN),
            // 1024 in binary16.
            scale: _mm512_set1_epi16(0x6400),
        };
        let mut col = 0;
        while col < b.stride {
            // SAFETY: the caller's bounds, and `col + tiles·32 <= stride`.
            unsafe {
                match (b.stride - col) / 32 {
                    1 => block::<R, 1>(planes, a, b, (col, k), acc, &kc),
                    2 => block::<R, 2>(planes, a, b, (col, k), acc, &kc),
                    3 => block::<R, 3>(planes, a, b, (col, k), acc, &kc),
                    _ => block::<R, TILES>(planes, a, b, (col, k), acc, &kc),
                }
            }
            col += TILES * 32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector conversion of a group equals the scalar one, for every length from 1 to
    /// 64 (the masked loads of a partial group), both signs and patterns from 0 to 127.
    #[test]
    fn vector_keys_equal_scalar_keys() {
        if !supported() {
            return;
        }
        for len in 1..=GROUP {
            let codes: Vec<i16> = (0..len)
                .map(|j| {
                    ((j * 37 + len) % 128) as i16 | if (j + len) % 3 == 0 { i16::MIN } else { 0 }
                })
                .collect();
            let (mut want, mut got) = ([0u8; GROUP], [0u8; GROUP]);
            group_keys(&codes, &mut want);
            // SAFETY: the CPU has the instructions (checked above).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                x86::group_keys(&codes, &mut got)
            };
            assert_eq!(got, want, "{len} codes");
        }
    }
}
