//! The kernels of the naive posit<8,0> GEMM ([`super::naive_p8`]) on i16 values in units of
//! minpos ([`super::p8_units`]), and the conversions of values to the look-up keys.
//!
//! [`sums`] runs rows of `A` against all of `B`: each lane is one output column `j` and runs
//! the definition in its own order (`c = round(c + round(a_t · b_tj))` from 0, `t`
//! ascending), so vectorising across columns changes no output's order of operations. Per
//! step, the products of all columns come from the 128-entry row of the product table for
//! `a_t` ([`P8Units::prod`]), keyed by each column's magnitude pattern and negated where
//! `b_tj < 0`; the sum is rounded by [`super::p8_units`]'s integer steps.
//!
//! Chosen at run time ([`crate::backend::isa`]), with the same bits:
//!
//! * **AVX-512 (F, BW).** 32 lanes a register. The product row sits in four registers:
//!   `vpermt2w` looks up 64 entries, bit 6 of the magnitude pattern picks the half, and the
//!   code's sign bit (`vpmovw2m`) negates. The sum is rounded by `vpabsw`, `vpminuw`, two
//!   `vpermt2w` look-ups of the binade's shift and bias, `vpsllvw`, `vpsrlvw`, `vpternlogd`,
//!   adds and a masked negation. Two rows of `A` against up to four tiles of 32 columns
//!   make eight independent chains per step, enough to hide the latency of one step's
//!   dependent operations (on the AMD EPYC of the benches, sixteen chains were no faster:
//!   the step, about 25 vector instructions with the register copies of the destructive
//!   permutes, is bound by instruction throughput); each table row is loaded once per row
//!   and step and serves every tile, each tile's codes and masks once per step and serve
//!   both rows.
//! * **AVX-512 FP16 and VBMI** ([`super::p8_fp16`]), where the CPU has them: the values as
//!   binary16 numbers, the products by byte look-ups, the sums by `vaddph` and a rounding
//!   by magic constants, about half the instructions of the i16 step.
//! * **Portable (and AVX2).** The same i16 values one lane at a time, the sum rounded by
//!   the table of every sum ([`P8Units::round`]). AVX2 has no word permutes across a
//!   register, so it would take this path; the rules send naive posit<8,0> on AVX2 to the
//!   register kernel instead, which rounds f32 lanes by magic constants
//!   ([`super::es0_lanes`]).
//!
//! The conversions [`to_codes`] and [`to_rows`] compute
//! [`super::p8_units::magnitude_pattern`] (AVX-512: 32 values a step, the same look-ups
//! by binade as the rounding).

use super::p8_units::{lane_code, row_index, P8Units};
#[cfg(target_arch = "x86_64")]
use crate::backend::isa::{self, Isa};

use std::sync::atomic::{AtomicBool, Ordering};

use super::p8_fp16;

/// Columns of one tile (i16 lanes of a 512-bit register).
pub const LANES: usize = 32;

/// `B` as the kernels of [`sums`] read it.
pub struct Columns<'a> {
    /// `k` rows of `stride` lane codes ([`lane_code`]), read by all but the binary16 kernel.
    pub codes: &'a [i16],
    /// The row length of `codes`, a multiple of 32.
    pub stride: usize,
    /// [`p8_fp16::to_bytes`] of `codes`, for the kernels that read it
    /// ([`Kernel::reads_bytes`]; empty for the others).
    pub bytes: &'a [u8],
}

/// The kernels of [`sums`], all with the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// One lane at a time, the sum rounded by table.
    Portable,
    /// i16 lanes of AVX-512 F and BW.
    Avx512Bw,
    /// binary16 lanes of AVX-512 FP16 and VBMI ([`p8_fp16`]).
    Avx512Fp16,
}

/// Whether [`Kernel::best`] may pick [`Kernel::Avx512Fp16`].
static FP16: AtomicBool = AtomicBool::new(true);

/// Lets [`Kernel::best`] pick the binary16 kernel where the CPU has it (`true`, the default)
/// or keeps it to the i16 kernel, process-wide: for tests and comparisons of the kernels,
/// which give the same bits.
pub fn allow_fp16(allowed: bool) {
    FP16.store(allowed, Ordering::Relaxed);
}

impl Kernel {
    /// The kernel for the instruction set in use ([`isa::active`]).
    pub fn best() -> Kernel {
        if !avx512() {
            Kernel::Portable
        } else if FP16.load(Ordering::Relaxed) && p8_fp16::supported() {
            Kernel::Avx512Fp16
        } else {
            Kernel::Avx512Bw
        }
    }

    /// Whether this kernel reads `B`'s bytes ([`p8_fp16::to_bytes`]) besides its codes.
    pub fn reads_bytes(self) -> bool {
        self == Kernel::Avx512Fp16
    }
}

/// Whether the AVX-512 kernels run (elsewhere the sums run one lane at a time).
pub fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa::active() == Isa::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The sums of rows `a` (product table rows, [`row_index`], at least `k` each) against
/// `B` (`b.codes`: `k` rows of `b.stride` lane codes, [`lane_code`], the stride a multiple
/// of [`LANES`]; `b.bytes` as [`Kernel::reads_bytes`] says), into `acc` (`a.len()` rows of
/// the stride): from 0, `t` ascending, `c_j = round(c_j + round(a_t · b_tj))`. One or two
/// rows, by `kernel` (one the CPU runs, as [`Kernel::best`] gives).
pub fn sums(kernel: Kernel, tables: &P8Units, a: &[&[u8]], b: &Columns, k: usize, acc: &mut [i16]) {
    let stride = b.stride;
    let b_codes = b.codes;
    assert!(
        stride.is_multiple_of(LANES)
            && b_codes.len() >= k * stride
            && acc.len() >= a.len() * stride
    );
    assert!(a.iter().all(|r| r.len() >= k) && tables.prod.len() == 256 * 128);
    match kernel {
        Kernel::Avx512Fp16 => return p8_fp16::sums(a, b, k, acc),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Bw => {
            assert!(avx512(), "the AVX-512 kernel on a CPU without it");
            // SAFETY: the CPU has AVX-512 F and BW (`isa::active`); the bounds are asserted
            // above, and every row index is below 256.
            unsafe {
                match *a {
                    [r0, r1] => avx512::rows::<2>(&tables.prod, [r0, r1], b_codes, stride, k, acc),
                    [r0] => avx512::rows::<1>(&tables.prod, [r0], b_codes, stride, k, acc),
                    _ => panic!("one or two rows"),
                }
            }
            return;
        }
        _ => {}
    }
    for (row, c) in a.iter().zip(acc.chunks_mut(stride)) {
        c.fill(0);
        for (step, &x) in row[..k].iter().enumerate() {
            let products = &tables.prod[x as usize * 128..][..128];
            for (c, &code) in c.iter_mut().zip(&b_codes[step * stride..][..stride]) {
                let p = products[(code & 127) as usize];
                let neg = code >> 15;
                *c = tables.round(*c + ((p ^ neg) - neg));
            }
        }
    }
}

/// Each value in units (`|u| <= 4096`, a value of the posit) to its lane code
/// ([`lane_code`]), in place.
pub fn to_codes(v: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has AVX-512 F and BW (`isa::active`).
        unsafe { avx512::to_codes(v) };
        return;
    }
    v.iter_mut().for_each(|u| *u = lane_code(*u));
}

/// Each value in units (`|u| <= 4096`, a value of the posit) to its product table row
/// ([`row_index`]).
pub fn to_rows(units: &[i16], rows: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has AVX-512 F, BW and VL (`isa::active`).
        unsafe { avx512::to_rows(units, rows) };
        return;
    }
    for (r, &u) in rows.iter_mut().zip(units) {
        *r = row_index(u);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::LANES;
    use crate::quire::p8_units::{BIAS, CAP, OFFSET, SHIFT};

    /// Tiles of [`LANES`] columns summed together.
    const TILES: usize = 4;

    /// The constants of the sum's rounding.
    #[derive(Clone, Copy)]
    struct Consts {
        shift: [__m512i; 2],
        bias: [__m512i; 2],
        offset: [__m512i; 2],
        cap: __m512i,
        ones: __m512i,
        one: __m512i,
        bit6: __m512i,
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    fn consts() -> Consts {
        // SAFETY: each table holds 64 i16, two 512-bit vectors.
        let load = |t: &[i16; 64], half: usize| unsafe {
            _mm512_loadu_si512(t.as_ptr().add(half * 32) as *const _)
        };
        Consts {
            shift: [load(&SHIFT, 0), load(&SHIFT, 1)],
            bias: [load(&BIAS, 0), load(&BIAS, 1)],
            offset: [load(&OFFSET, 0), load(&OFFSET, 1)],
            cap: _mm512_set1_epi16(CAP),
            ones: _mm512_set1_epi16(-1),
            one: _mm512_set1_epi16(1),
            bit6: _mm512_set1_epi16(0x40),
        }
    }

    /// [`crate::quire::p8_units::round_sum`] of 32 lanes.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn round(v: __m512i, k: &Consts) -> __m512i {
        let a = _mm512_min_epu16(_mm512_abs_epi16(v), k.cap);
        let idx = _mm512_srli_epi16::<6>(a);
        let s = _mm512_permutex2var_epi16(k.shift[0], idx, k.shift[1]);
        let bias = _mm512_permutex2var_epi16(k.bias[0], idx, k.bias[1]);
        let mask = _mm512_sllv_epi16(k.ones, s);
        // (a >> s) & !mask & 1: bit s of a, 0 where s = 0.
        let odd = _mm512_ternarylogic_epi32::<0x20>(_mm512_srlv_epi16(a, s), mask, k.one);
        let r = _mm512_and_si512(_mm512_add_epi16(_mm512_add_epi16(a, bias), odd), mask);
        _mm512_mask_sub_epi16(r, _mm512_movepi16_mask(v), _mm512_setzero_si512(), r)
    }

    /// Columns `col .. col + J·LANES` of `R` rows.
    // The steps index the pattern rows, the codes and the sums together.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn block<const R: usize, const J: usize>(
        prod: &[i16],
        a: [&[u8]; R],
        b: &[i16],
        (stride, col, k): (usize, usize, usize),
        acc: &mut [i16],
        kc: &Consts,
    ) {
        let mut c = [[_mm512_setzero_si512(); J]; R];
        let bp = b.as_ptr();
        for t in 0..k {
            let mut rows = [[_mm512_setzero_si512(); 4]; R];
            for (r, regs) in rows.iter_mut().enumerate() {
                // SAFETY: a pattern is below 256, its row 128 entries of the table.
                let p = unsafe { prod.as_ptr().add(a[r][t] as usize * 128) };
                for (q, reg) in regs.iter_mut().enumerate() {
                    *reg = unsafe { _mm512_loadu_si512(p.add(q * LANES) as *const _) };
                }
            }
            for j in 0..J {
                // SAFETY: row t of `b` holds `stride >= col + J·LANES` codes.
                let code =
                    unsafe { _mm512_loadu_si512(bp.add(t * stride + col + j * LANES) as *const _) };
                let high = _mm512_test_epi16_mask(code, kc.bit6);
                let neg = _mm512_movepi16_mask(code);
                for r in 0..R {
                    let [t0, t1, t2, t3] = rows[r];
                    let lo = _mm512_permutex2var_epi16(t0, code, t1);
                    let hi = _mm512_permutex2var_epi16(t2, code, t3);
                    let p = _mm512_mask_blend_epi16(high, lo, hi);
                    let cur = c[r][j];
                    let v = _mm512_mask_sub_epi16(_mm512_add_epi16(cur, p), neg, cur, p);
                    c[r][j] = round(v, kc);
                }
            }
        }
        for (r, row) in c.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                // SAFETY: `acc` holds R rows of `stride >= col + J·LANES`.
                unsafe {
                    _mm512_storeu_si512(
                        acc.as_mut_ptr().add(r * stride + col + j * LANES) as *mut _,
                        v,
                    )
                };
            }
        }
    }

    /// The magnitude patterns of 32 values in units, and the mask of the negative ones
    /// ([`crate::quire::p8_units::magnitude_pattern`]).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn magnitude(u: __m512i, k: &Consts) -> (__m512i, __mmask32) {
        let a = _mm512_abs_epi16(u);
        let idx = _mm512_srli_epi16::<6>(_mm512_min_epu16(a, k.cap));
        let s = _mm512_permutex2var_epi16(k.shift[0], idx, k.shift[1]);
        let offset = _mm512_permutex2var_epi16(k.offset[0], idx, k.offset[1]);
        let m = _mm512_add_epi16(_mm512_srlv_epi16(a, s), offset);
        (m, _mm512_movepi16_mask(u))
    }

    /// Values in units to lane codes, in place (see [`super::to_codes`]).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn to_codes(v: &mut [i16]) {
        let k = consts();
        let sign = _mm512_set1_epi16(i16::MIN);
        for chunk in v.chunks_mut(LANES) {
            let live = (u64::MAX >> (64 - chunk.len())) as __mmask32;
            // SAFETY: the mask enables the chunk's elements only.
            let u = unsafe { _mm512_maskz_loadu_epi16(live, chunk.as_ptr()) };
            let (m, neg) = magnitude(u, &k);
            // m - 0x8000 = m | 0x8000 (m < 128).
            let code = _mm512_mask_sub_epi16(m, neg, m, sign);
            // SAFETY: as the load.
            unsafe { _mm512_mask_storeu_epi16(chunk.as_mut_ptr(), live, code) };
        }
    }

    /// Values in units to product table rows (see [`super::to_rows`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) fn to_rows(units: &[i16], rows: &mut [u8]) {
        let k = consts();
        let bit7 = _mm512_set1_epi16(0x80);
        for (src, dst) in units.chunks(LANES).zip(rows.chunks_mut(LANES)) {
            let len = src.len().min(dst.len());
            let live = (u64::MAX >> (64 - len)) as __mmask32;
            // SAFETY: the mask enables `len` elements of each slice.
            let u = unsafe { _mm512_maskz_loadu_epi16(live, src.as_ptr()) };
            let (m, neg) = magnitude(u, &k);
            let row = _mm512_cvtepi16_epi8(_mm512_mask_add_epi16(m, neg, m, bit7));
            // SAFETY: as the load.
            unsafe { _mm256_mask_storeu_epi8(dst.as_mut_ptr() as *mut i8, live, row) };
        }
    }

    /// The sums of `R` rows against all of `B` (see [`super::sums`]).
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW; `b` holds `k` rows of `stride` (a multiple of
    /// [`LANES`]) codes, each row of `a` at least `k` patterns, `acc` `R` rows of `stride`,
    /// and `prod` 256 rows of 128 entries.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn rows<const R: usize>(
        prod: &[i16],
        a: [&[u8]; R],
        b: &[i16],
        stride: usize,
        k: usize,
        acc: &mut [i16],
    ) {
        let kc = consts();
        let mut col = 0;
        while col < stride {
            let dims = (stride, col, k);
            // SAFETY: the caller's bounds, and `col + tiles·LANES <= stride`.
            unsafe {
                match (stride - col) / LANES {
                    1 => block::<R, 1>(prod, a, b, dims, acc, &kc),
                    2 => block::<R, 2>(prod, a, b, dims, acc, &kc),
                    3 => block::<R, 3>(prod, a, b, dims, acc, &kc),
                    _ => block::<R, TILES>(prod, a, b, dims, acc, &kc),
                }
            }
            col += TILES * LANES;
        }
    }
}
