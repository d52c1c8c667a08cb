//! The naive GEMM of posit<8,0> in i16 lanes: `c = round(c + round(a_t · b_t))` from
//! `c = 0`, `k` ascending, then `c = round(c + bias)`, every value an i16 in units of
//! minpos ([`super::p8_units`], whose module docs prove the arithmetic).
//!
//! Each lane is one output column `j` and runs the definition in its own order, so
//! vectorising across columns changes no output's order of operations. Per step `t` of a
//! row `i`, the products `round(a_it · b_tj)` of all columns come from the 128-entry row of
//! the product table for `a_it` ([`P8Units::prod`]), looked up by each `b_tj`'s magnitude
//! pattern and negated where `b_tj < 0`; the sum is rounded by [`super::p8_units`]'s integer
//! steps.
//!
//! The kernels, chosen at run time ([`crate::backend::isa`]), give the same bits:
//!
//! * **AVX-512 (F, BW).** 32 lanes a register. The product row sits in four registers
//!   (`vpermt2w` looks up 64 entries, bit 6 of the magnitude picks the half, `vpmovw2m`'s
//!   sign mask negates); the sum is rounded by `vpabsw`, `vpminuw`, two `vpermt2w` look-ups
//!   of the binade's shift and bias, `vpsllvw`, `vpsrlvw`, `vpternlogd`, adds and a masked
//!   negation. Two rows of `A` against four tiles of 32 columns make eight independent
//!   chains per step, which hides the latency of one step's dependent operations; the
//!   table rows are loaded once per row and step and serve all four tiles, the codes of `B`
//!   and their masks once per tile and step and serve both rows.
//! * **Portable (and AVX2).** The same i16 values one lane at a time, the sum rounded by a
//!   table of [`super::p8_units::round_sum`] over every sum (`P8Units::round`). AVX2 has
//!   no word permutes across a register, so it takes this path.
//!
//! `B` is stored as lane codes (`k` rows of `n` padded to whole tiles, the padding 0, whose
//! products are 0): the magnitude pattern, bit 15 the sign. A NaR operand (NaN, ±Inf) makes
//! its row or column NaR, as does a NaR bias term; the kernels read 0 in its place and the
//! output is overwritten.

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims, OpTables};
use super::int_operand::IntOperand;
use super::p8_units::{posit8_0, P8Units};
use super::quire_i16::Operand;
#[cfg(target_arch = "x86_64")]
use crate::backend::isa::{self, Isa};
use crate::format::Format;

/// Columns of one tile (i16 lanes of a 512-bit register).
pub const LANES: usize = 32;

/// Rows of `A` per kernel call.
const ROWS: usize = 2;

/// The operands of one GEMM in the kernels' layout.
struct Operands {
    /// `A`'s patterns, `m x k` row-major (NaR read as its table row of zeros).
    a: Vec<u8>,
    /// `B`'s lane codes, `k` rows of `stride` (padded with 0).
    b: Vec<i16>,
    /// `n` rounded up to whole tiles.
    stride: usize,
    /// Rows of `A` holding a NaR.
    row_nar: Vec<bool>,
    /// Columns of `B` holding a NaR.
    col_nar: Vec<bool>,
}

/// The NaR pattern.
const NAR: u8 = 0x80;

/// `n` rounded up to a multiple of [`LANES`].
fn padded(n: usize) -> usize {
    n.div_ceil(LANES) * LANES
}

impl Operands {
    /// From f64 operands (`a` `m x k`, `b` `k x n`, row-major): each value's pattern as the
    /// operation tables find it (a value off the grid is rounded).
    fn from_f64(tables: &P8Units, a: &[f64], b: &[f64], (m, k, n): Dims) -> Operands {
        let ops = OpTables::get(&Format::Posit(posit8_0())).expect("posit<8,0> has tables");
        let a: Vec<u8> = a[..m * k]
            .par_iter()
            .with_min_len(4096)
            .map(|&x| ops.pattern(x))
            .collect();
        let row_nar = (0..m).map(|i| a[i * k..i * k + k].contains(&NAR)).collect();
        let stride = padded(n);
        let mut codes = vec![0i16; k * stride];
        let mut col_nar = vec![false; n];
        for (t, row) in codes.chunks_mut(stride.max(1)).take(k).enumerate() {
            for (j, (c, nar)) in row.iter_mut().zip(col_nar.iter_mut()).enumerate() {
                let p = ops.pattern(b[t * n + j]);
                if p == NAR {
                    *nar = true;
                } else {
                    *c = tables.lane_code(tables.units[p as usize]);
                }
            }
        }
        Operands {
            a,
            b: codes,
            stride,
            row_nar,
            col_nar,
        }
    }

    /// From f32 operands not yet rounded, each in either layout: rounded and converted by
    /// the quire's operand table ([`IntOperand`]), `A` row-major and `Bᵀ` row-major (so
    /// that each column's NaR flag is a row's), then `B` laid out as codes.
    fn from_f32(tables: &P8Units, a: Operand, b: Operand, (m, k, n): Dims, par: bool) -> Self {
        let conv = IntOperand::get(posit8_0()).expect("posit<8,0> has an operand table");
        let (mut au, mut bu) = (vec![0i16; m * k], vec![0i16; n * k]);
        let (mut row_nar, mut col_nar) = (vec![false; m], vec![false; n]);
        let mut fill_a = || conv.fill(a.data, a.transposed, (m, k), &mut au, &mut row_nar, par);
        let mut fill_b = || conv.fill(b.data, !b.transposed, (n, k), &mut bu, &mut col_nar, par);
        if par {
            rayon::join(fill_a, fill_b);
        } else {
            fill_a();
            fill_b();
        }
        let a: Vec<u8> = au.iter().map(|&u| tables.pattern_of(u)).collect();
        let stride = padded(n);
        let mut codes = vec![0i16; k * stride];
        if n > 0 {
            for (t, row) in codes.chunks_mut(stride).enumerate() {
                for (j, c) in row[..n].iter_mut().enumerate() {
                    *c = tables.lane_code(bu[j * k + t]);
                }
            }
        }
        Operands {
            a,
            b: codes,
            stride,
            row_nar,
            col_nar,
        }
    }
}

/// The bias terms in units (`None` for NaR), per row or per column.
enum BiasUnits {
    None,
    PerRow(Vec<Option<i16>>),
    PerCol(Vec<Option<i16>>),
}

impl BiasUnits {
    fn new(tables: &P8Units, bias: Bias) -> BiasUnits {
        let ops = OpTables::get(&Format::Posit(posit8_0())).expect("posit<8,0> has tables");
        let units = |v: &[f64]| -> Vec<Option<i16>> {
            v.iter()
                .map(|&x| {
                    let p = ops.pattern(x);
                    (p != NAR).then(|| tables.units[p as usize])
                })
                .collect()
        };
        match bias {
            Bias::None => BiasUnits::None,
            Bias::PerRow(v) => BiasUnits::PerRow(units(v)),
            Bias::PerCol(v) => BiasUnits::PerCol(units(v)),
        }
    }

    /// The term of output `(i, j)`: `Some(None)` for NaR.
    #[inline]
    fn at(&self, i: usize, j: usize) -> Option<Option<i16>> {
        match self {
            BiasUnits::None => None,
            BiasUnits::PerRow(v) => Some(v[i]),
            BiasUnits::PerCol(v) => Some(v[j]),
        }
    }
}

/// The sums of rows `a` (each `k` patterns) against all of `B`, into `acc` (`a.len()` rows
/// of `stride`), on the path of [`isa::active`].
fn sums(tables: &P8Units, a: &[&[u8]], b: &[i16], stride: usize, k: usize, acc: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if isa::active() == Isa::Avx512 {
        // SAFETY: the CPU has AVX-512 F and BW (`isa::active`); `b` holds `k` rows of
        // `stride` codes and `acc` `a.len()` rows of `stride`, a multiple of LANES, and
        // every pattern indexes a 128-entry row of the 256-row product table.
        unsafe {
            match *a {
                [r0, r1] => avx512::rows::<2>(&tables.prod, [r0, r1], b, stride, k, acc),
                [r0] => avx512::rows::<1>(&tables.prod, [r0], b, stride, k, acc),
                _ => unreachable!("one or two rows"),
            }
        }
        return;
    }
    rows_portable(tables, a, b, stride, k, acc);
}

/// The portable kernel: one lane at a time, sums rounded by table.
fn rows_portable(t: &P8Units, a: &[&[u8]], b: &[i16], stride: usize, k: usize, acc: &mut [i16]) {
    for (row, c) in a.iter().zip(acc.chunks_mut(stride)) {
        c.fill(0);
        for (step, &x) in row[..k].iter().enumerate() {
            let products = &t.prod[x as usize * 128..][..128];
            for (c, &code) in c.iter_mut().zip(&b[step * stride..][..stride]) {
                let p = products[(code & 127) as usize];
                let neg = code >> 15;
                *c = t.round(*c + ((p ^ neg) - neg));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::LANES;
    use crate::quire::p8_units::{BIAS, CAP, SHIFT};

    /// Tiles of [`LANES`] columns summed together.
    const TILES: usize = 4;

    /// The constants of the sum's rounding.
    #[derive(Clone, Copy)]
    struct Consts {
        shift: [__m512i; 2],
        bias: [__m512i; 2],
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

/// The GEMM on operands in the kernels' layout: each output as `to(Some(units))`, or
/// `to(None)` where it is NaR.
fn run<T: Send>(
    ops: &Operands,
    (m, k, n): Dims,
    bias: &BiasUnits,
    out: &mut [T],
    parallel: bool,
    to: impl Fn(Option<i16>) -> T + Sync,
) {
    let tables = P8Units::get();
    if n == 0 || m == 0 {
        return;
    }
    let stride = ops.stride;
    let group = |g: usize, dst: &mut [T], acc: &mut Vec<i16>| {
        let first = g * ROWS;
        let rows = dst.len() / n;
        let a: Vec<&[u8]> = (first..first + rows)
            .map(|i| &ops.a[i * k..i * k + k])
            .collect();
        acc.resize(rows * stride, 0);
        sums(tables, &a, &ops.b, stride, k, acc);
        for (r, (o, c)) in dst.chunks_mut(n).zip(acc.chunks(stride)).enumerate() {
            let i = first + r;
            for (j, (o, &c)) in o.iter_mut().zip(c).enumerate() {
                let nar = ops.row_nar[i] || ops.col_nar[j];
                *o = to(match bias.at(i, j) {
                    _ if nar => None,
                    None => Some(c),
                    Some(None) => None,
                    Some(Some(v)) => Some(tables.round(c + v)),
                });
            }
        }
    };
    let out = &mut out[..m * n];
    if parallel {
        out.par_chunks_mut(ROWS * n)
            .enumerate()
            .for_each_init(Vec::new, |acc, (g, dst)| group(g, dst, acc));
    } else {
        let mut acc = Vec::new();
        for (g, dst) in out.chunks_mut(ROWS * n).enumerate() {
            group(g, dst, &mut acc);
        }
    }
}

/// `out (m x n) = A · B [+ bias]` in posit<8,0>, every multiply and add rounded, `k`
/// ascending from zero, the bias last; `a` (`m x k`), `b` (`k x n`) and the bias f64 values
/// of the posit (others are rounded to it first), NaN and ±Inf read as NaR. `parallel`
/// spreads rows over the rayon pool.
pub fn gemm_f64(a: &[f64], b: &[f64], dims: Dims, bias: Bias, out: &mut [f64], parallel: bool) {
    let (m, k, n) = dims;
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    let tables = P8Units::get();
    let ops = Operands::from_f64(tables, a, b, dims);
    let bias = BiasUnits::new(tables, bias);
    run(&ops, dims, &bias, out, parallel, |u| {
        u.map_or(f64::NAN, |u| f64::from(u) / 64.0)
    });
}

/// [`gemm_f64`] from f32 operands not yet rounded to posit<8,0> (each in either layout,
/// rounded to nearest even), the bias already rounded: the outputs as f32 (NaR as NaN).
pub fn gemm_f32(a: Operand, b: Operand, dims: Dims, bias: Bias, parallel: bool) -> Vec<f32> {
    let (m, k, n) = dims;
    assert!(a.data.len() >= m * k && b.data.len() >= k * n);
    let tables = P8Units::get();
    let ops = Operands::from_f32(tables, a, b, dims, parallel);
    let bias = BiasUnits::new(tables, bias);
    let mut out = vec![0f32; m * n];
    run(&ops, dims, &bias, &mut out, parallel, |u| {
        u.map_or(f32::NAN, |u| f32::from(u) / 64.0)
    });
    out
}
