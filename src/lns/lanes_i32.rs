//! The fast LNS matrix product ([`super::lanes`]) for the exact tables (`f <= 10`) in
//! 32-bit lanes: sixteen lanes per vector and per gather in AVX-512, eight in AVX2 (the
//! submodule `avx2`, the same steps), for formats and operands whose exponents fit the
//! bounds below. The same bits as the scalar definition, which [`super::lanes`] states.
//!
//! # Representation
//!
//! A running sum or a product is two i32 lanes: the exponent `k` and the sign (0, or -1 for
//! negative: all bits set, so that the signs' difference masks the offset of `db`).
//! Zero is the exponent [`ZK`] `= -2^30` with any sign. The kernel runs only where
//! `|k_min|, k_max < 2^28` (formats up to 30 bits) and every operand of `A` and `B` has
//! `|k| <= 2^28` (operands outside the range are read exactly, as everywhere), so that:
//!
//! * a product's exponent `k_a + k_b` lies in `[-2^29, 2^29]`, and one with a zero operand
//!   in `[-2^30 - 2^28, -2^30 + 2^28]`, below `k_min`: bringing it into the range (saturate
//!   above `k_max`, flush below `k_min` to [`ZK`]) gives the zero of the definition without
//!   a test for zero operands;
//! * the distance `u = |k_c - k_p|` of two nonzero terms (both in the range) is at most
//!   `2^29 - 2`, and of a zero and a nonzero term at least `2^30 - 2^28 > 2^29`: `u >> 29`
//!   is 0 exactly when neither is zero.
//!
//! # One step
//!
//! The sum `c ⊕ p` of two terms is `k_big + T[i]` brought into the range, with the sign of
//! the term with the larger `k`, from one gather in the table `T` ([`table`]):
//!
//! `T = [sb(0) … sb(-(len-1)), sb_far, 0, 0,  D0, db(-1) … db(-(len-1)), db_far, 0, 0]`
//!
//! at `i = min(u, len) + (u >> 29) + (signs differ ? len + 3 : 0)`. Every case of the
//! scalar addition ([`super::lanes`]'s `Range::add`, which is `LnsArith::add`) comes out of
//! this one formula:
//!
//! * both nonzero: `u >> 29 = 0`, and `T[i]` is the exact table's `sb(-u)` or `db(-u)`
//!   (its far value from `u = len` on), as the scalar look-up reads it;
//! * exact cancellation (`u = 0`, signs differ): `T[i] = D0 = -2^29`, so
//!   `k_big + D0 < -2^28 < k_min` flushes to zero;
//! * one term zero: `u >> 29` is 1 or 2, `T[i] = 0` (whichever sign the zero has), so the
//!   result is the other term, already in the range, with its sign (its `k` is the larger);
//! * both zero: `k_big = ZK`, `T[i]` is `sb(0) <= 2^10` or `D0`: the result flushes to zero.
//!
//! Every value stays within i32 (the extremes are `-2^30 - 2^28` and `ZK + D0`), and every
//! index within `T` (`u >> 29 <= 2`). The integer operations are those of the scalar path
//! on the same values, so each lane's sum is the definition's; `p` runs ascending in every
//! lane, a zero `a[i][p]` skips its step (every product is zero, and `c ⊕ 0 = c`), and the
//! bias is added afterwards by the scalar addition.
//!
//! # Tiles
//!
//! A row runs in tiles of four vectors (64 columns in AVX-512, 32 in AVX2) against one row of `A` and the next
//! row of `A` together (two rows per pass share the loads of `B` and double the
//! independent chains that hide the gathers' latency); the last tile of a row is one to
//! four vectors, the last one masked (its unused lanes compute bounded values that are
//! never stored). A zero `a[i][p]` skips step `p` of its own row only.
//!
//! # Cost
//!
//! The gathers dominate: sixteen table reads per vector and step, which the processor
//! serves at about one element per cycle however they are issued (two 8-lane gathers, a
//! 16-bit table, or scalar reads measured no faster). The rest of a step is about
//! seventeen vector instructions (nineteen in AVX2, whose eight-lane gathers serve about
//! as many elements per cycle). Without AVX2 (or past the bounds) the product runs in the
//! 64-bit lanes of [`super::lanes_vec`], with the same results.

use std::arch::x86_64::*;

use super::gauss::ExactTables;
use super::lanes::{bring_operand, unpack, LnsBias, Range, ZERO};
use super::value::LnsValue;
use crate::backend::isa::{self, Isa};

mod avx2;

/// The exponent of zero.
const ZK: i32 = -(1 << 30);
/// The table entry of exact cancellation (`db(0) = -inf`).
const D0: i32 = -(1 << 29);
/// The largest `|k|` of an operand (and, less one, of the range) the kernel takes.
const K_BOUND: i64 = 1 << 28;
/// `u >> FAR_SHIFT` is nonzero exactly when a term is zero.
const FAR_SHIFT: u32 = 29;
/// Vectors of sixteen lanes per tile.
const VECS: usize = 4;
/// Lanes per vector.
const VL: usize = 16;

/// The look-up table of the module docs from the exact tables' `sb` and `db` (`len`
/// entries each, `db[0]` unused) and their far values.
pub(super) fn table(sb: &[i64], sb_far: i64, db: &[i64], db_far: i64) -> Vec<i32> {
    let len = sb.len();
    debug_assert_eq!(db.len(), len);
    let fit = |v: i64| i32::try_from(v).expect("exact table entries of f <= 10 fit i32");
    let mut t = Vec::with_capacity(2 * len + 6);
    t.extend(sb.iter().map(|&v| fit(v)));
    t.extend([fit(sb_far), 0, 0, D0]);
    t.extend(db[1..].iter().map(|&v| fit(v)));
    t.extend([fit(db_far), 0, 0]);
    t
}

/// `B`'s exponents ([`ZK`] for zero) and signs (0, or -1 for negative: all ones, so that
/// the signs select the `db` half of the table with one `and`), row-major, for the
/// kernel: built where the kernel applies to the format and to `B`.
pub(super) struct Right {
    bk: Vec<i32>,
    bs: Vec<i32>,
    /// Each row's smallest and largest exponent ([`ZK`] the smallest where it holds a zero).
    bounds: Vec<(i32, i32)>,
}

impl Right {
    /// `B` (packed codes of `rows` rows, no NaN) laid out for the kernel, or `None` where the kernel does
    /// not run: a CPU (or cap) without AVX2, a range past `±(2^28 - 1)` or an operand of
    /// `B` with `|k| > 2^28`.
    pub(super) fn new(range: Range, bp: &[i64], rows: usize) -> Option<Right> {
        let runs = kernel().is_some()
            && range.k_min() > -K_BOUND
            && range.k_max() < K_BOUND
            && bp.iter().all(fits);
        runs.then(|| {
            let (bk, bs): (Vec<i32>, Vec<i32>) = bp
                .iter()
                .map(|&c| {
                    if c == ZERO {
                        (ZK, 0)
                    } else {
                        ((c >> 1) as i32, -((c & 1) as i32))
                    }
                })
                .unzip();
            let n = bp.len() / rows.max(1);
            let bounds = bk
                .chunks(n.max(1))
                .map(|row| {
                    let lo = row.iter().copied().min().unwrap_or(0);
                    let hi = row.iter().copied().max().unwrap_or(0);
                    (lo, hi)
                })
                .collect();
            Right { bk, bs, bounds }
        })
    }
}

/// Whether the kernel takes the rows `ap` of `A` (packed codes, no NaN): every operand with
/// `|k| <= 2^28`.
pub(super) fn takes_rows(ap: &[i64]) -> bool {
    ap.iter().all(fits)
}

/// A packed operand the kernel takes: zero, or `|k| <= 2^28`.
fn fits(c: &i64) -> bool {
    *c == ZERO || (*c >> 1).abs() <= K_BOUND
}

/// The compiled kernel for the active instruction set (AVX-512 or AVX2), if any.
fn kernel() -> Option<Isa> {
    match isa::active() {
        Isa::Avx512 => Some(Isa::Avx512),
        Isa::Avx2 => Some(Isa::Avx2),
        Isa::Portable => None,
    }
}

/// The operands of one pass: exponents and signs of `B` (`n` columns), the table and the
/// range.
struct Pass<'a> {
    bk: &'a [i32],
    bs: &'a [i32],
    bounds: &'a [(i32, i32)],
    n: usize,
    table: &'a [i32],
    len: i32,
    range: Range,
}

impl Pass<'_> {
    /// Whether every product of the nonzero `x` (packed) with row `p` of `B` is nonzero and
    /// within the range: then the step need not bring it in.
    #[inline(always)]
    fn in_range(&self, x: i64, p: usize) -> bool {
        let (lo, hi) = self.bounds[p];
        let kx = x >> 1;
        kx + i64::from(lo) >= self.range.k_min() && kx + i64::from(hi) <= self.range.k_max()
    }
}

/// The product of packed codes (`ap` m x k with [`takes_rows`] true, `right` the kernel's
/// `B`, k x n, no NaN) into `out`: row pairs in parallel when `parallel`, each as the
/// module docs describe, then the bias by the scalar addition.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
    sums: &ExactTables,
    range: Range,
    ap: &[i64],
    right: &Right,
    (m, k, n): (usize, usize, usize),
    bias: LnsBias,
    biasp: &[i64],
    out: &mut [LnsValue],
    parallel: bool,
) {
    let isa = kernel().expect("Right::new checked that a kernel runs");
    let table = sums.lane_table();
    let pass = Pass {
        bk: &right.bk,
        bs: &right.bs,
        bounds: &right.bounds,
        n,
        table,
        len: sums.len() as i32,
        range,
    };
    let rows = |pair: usize, dst: &mut [LnsValue]| {
        let i0 = 2 * pair;
        let two = dst.len() == 2 * n;
        let a0 = &ap[i0 * k..(i0 + 1) * k];
        let a1 = if two {
            &ap[(i0 + 1) * k..(i0 + 2) * k]
        } else {
            a0
        };
        debug_assert_eq!(right.bounds.len(), k);
        let mut codes = vec![ZERO; 2 * n];
        match isa {
            // SAFETY: `kernel` returns AVX-512 only where the CPU has F/BW/DQ/VL.
            Isa::Avx512 => unsafe { row_pair(&pass, a0, a1, &mut codes) },
            // SAFETY: `kernel` returns AVX2 only where the CPU has AVX2 and FMA.
            _ => unsafe { avx2::row_pair(&pass, a0, a1, &mut codes) },
        }
        for (r, dst_row) in dst.chunks_mut(n).enumerate() {
            let i = i0 + r;
            for (j, (d, &c)) in dst_row.iter_mut().zip(&codes[r * n..]).enumerate() {
                let bv = match bias {
                    LnsBias::None => None,
                    LnsBias::PerRow(_) => Some(biasp[i]),
                    LnsBias::PerCol(_) => Some(biasp[j]),
                };
                let c = match bv {
                    // `0 + x` brings an operand into the range; otherwise its exact k is used.
                    Some(bv) if c == ZERO => bring_operand(range, bv),
                    Some(bv) => range.add(sums, c, bv),
                    None => c,
                };
                *d = unpack(c);
            }
        }
    };
    let out = &mut out[..m * n];
    if parallel {
        use rayon::prelude::*;
        out.par_chunks_mut(2 * n)
            .enumerate()
            .for_each(|(pair, d)| rows(pair, d));
    } else {
        out.chunks_mut(2 * n)
            .enumerate()
            .for_each(|(pair, d)| rows(pair, d));
    }
}

/// The packed code of a lane's exponent and sign.
#[inline(always)]
fn code(k: i32, s: i32) -> i64 {
    if k == ZK {
        ZERO
    } else {
        (i64::from(k) << 1) | i64::from(s & 1)
    }
}

/// Rows `a0` and `a1` of the product (the same slice when there is one row), as packed
/// codes into `codes` (`2 n`: the first row, then the second).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn row_pair(pass: &Pass, a0: &[i64], a1: &[i64], codes: &mut [i64]) {
    let n = pass.n;
    let mut j0 = 0;
    while j0 < n {
        let width = (VECS * VL).min(n - j0);
        let vecs = width.div_ceil(VL);
        let rem = width - (vecs - 1) * VL;
        let last: __mmask16 = if rem == VL { 0xffff } else { (1 << rem) - 1 };
        let mut k_out = [[0i32; VECS * VL]; 2];
        let mut s_out = [[0i32; VECS * VL]; 2];
        match vecs {
            1 => tile::<1>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
            2 => tile::<2>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
            3 => tile::<3>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
            _ => tile::<4>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
        }
        for r in 0..2 {
            for jj in 0..width {
                codes[r * n + j0 + jj] = code(k_out[r][jj], s_out[r][jj]);
            }
        }
        j0 += width;
    }
}

/// The table, range and constants of a step, in vectors.
#[derive(Clone, Copy)]
struct Consts {
    k_min: __m512i,
    k_max: __m512i,
    zk: __m512i,
    len: __m512i,
    db_off: __m512i,
    table: *const i32,
}

/// One step of one vector: `(k, s) = (k, s) ⊕ (kx + ky, sx ^ sy)` (see the module docs).
/// `CLAMP` false: every product is known nonzero and within the range
/// ([`Pass::in_range`]), so it is not brought into the range.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn step<const CLAMP: bool>(
    c: &Consts,
    kx: __m512i,
    sx: __m512i,
    ky: __m512i,
    sy: __m512i,
    k: &mut __m512i,
    s: &mut __m512i,
) {
    // The product brought into the range (a zero operand flushes).
    let mut kp = _mm512_add_epi32(kx, ky);
    if CLAMP {
        let under = _mm512_cmplt_epi32_mask(kp, c.k_min);
        kp = _mm512_mask_mov_epi32(_mm512_min_epi32(kp, c.k_max), under, c.zk);
    }
    let sp = _mm512_xor_si512(sx, sy);
    // The sum.
    let u = _mm512_abs_epi32(_mm512_sub_epi32(*k, kp));
    let p_bigger = _mm512_cmplt_epi32_mask(*k, kp);
    let big = _mm512_max_epi32(*k, kp);
    let neg = _mm512_mask_blend_epi32(p_bigger, *s, sp);
    // (s ^ sp) & db_off: 0x28 is (A ^ B) & C.
    let off = _mm512_ternarylogic_epi32::<0x28>(*s, sp, c.db_off);
    let i = _mm512_add_epi32(
        _mm512_add_epi32(
            _mm512_min_epi32(u, c.len),
            _mm512_srli_epi32::<FAR_SHIFT>(u),
        ),
        off,
    );
    // SAFETY: every index lies within the table (module docs).
    let t = unsafe { _mm512_i32gather_epi32::<4>(i, c.table.cast()) };
    let r = _mm512_add_epi32(big, t);
    let under = _mm512_cmplt_epi32_mask(r, c.k_min);
    *k = _mm512_mask_mov_epi32(_mm512_min_epi32(r, c.k_max), under, c.zk);
    *s = neg;
}

/// One tile of `V` vectors at columns `j0..` for two rows of `A` (the last vector's lanes
/// `last`), into `k_out` and `s_out`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn tile<const V: usize>(
    pass: &Pass,
    a0: &[i64],
    a1: &[i64],
    j0: usize,
    last: __mmask16,
    k_out: &mut [[i32; VECS * VL]; 2],
    s_out: &mut [[i32; VECS * VL]; 2],
) {
    let c = Consts {
        k_min: _mm512_set1_epi32(pass.range.k_min() as i32),
        k_max: _mm512_set1_epi32(pass.range.k_max() as i32),
        zk: _mm512_set1_epi32(ZK),
        len: _mm512_set1_epi32(pass.len),
        db_off: _mm512_set1_epi32(pass.len + 3),
        table: pass.table.as_ptr(),
    };
    let n = pass.n;
    let mut k0 = [c.zk; V];
    let mut s0 = [_mm512_setzero_si512(); V];
    let mut k1 = [c.zk; V];
    let mut s1 = [_mm512_setzero_si512(); V];
    let split = |x: i64| {
        if x == ZERO {
            (c.zk, _mm512_setzero_si512())
        } else {
            (
                _mm512_set1_epi32((x >> 1) as i32),
                _mm512_set1_epi32(-((x & 1) as i32)),
            )
        }
    };
    for (p, (&x0, &x1)) in a0.iter().zip(a1).enumerate() {
        let (z0, z1) = (x0 == ZERO, x1 == ZERO);
        if z0 && z1 {
            continue;
        }
        let (kx0, sx0) = split(x0);
        let (kx1, sx1) = split(x1);
        let (in0, in1) = (pass.in_range(x0, p), pass.in_range(x1, p));
        let at = p * n + j0;
        let bk = &pass.bk[at..];
        let bs = &pass.bs[at..];
        for v in 0..V {
            let mask = if v + 1 == V { last } else { 0xffff };
            // SAFETY: the lanes of `mask` lie within row `p` of B (`j0 + 16 v + lane < n`).
            let (ky, sy) = unsafe {
                (
                    _mm512_maskz_loadu_epi32(mask, bk.as_ptr().add(v * VL)),
                    _mm512_maskz_loadu_epi32(mask, bs.as_ptr().add(v * VL)),
                )
            };
            // A zero a[i][p] skips the step of its row (`c ⊕ 0 = c`).
            match (z0, in0) {
                (true, _) => {}
                (false, true) => step::<false>(&c, kx0, sx0, ky, sy, &mut k0[v], &mut s0[v]),
                (false, false) => step::<true>(&c, kx0, sx0, ky, sy, &mut k0[v], &mut s0[v]),
            }
            match (z1, in1) {
                (true, _) => {}
                (false, true) => step::<false>(&c, kx1, sx1, ky, sy, &mut k1[v], &mut s1[v]),
                (false, false) => step::<true>(&c, kx1, sx1, ky, sy, &mut k1[v], &mut s1[v]),
            }
        }
    }
    for v in 0..V {
        // SAFETY: each output array holds VECS vectors.
        unsafe {
            _mm512_storeu_si512(k_out[0].as_mut_ptr().add(v * VL).cast(), k0[v]);
            _mm512_storeu_si512(s_out[0].as_mut_ptr().add(v * VL).cast(), s0[v]);
            _mm512_storeu_si512(k_out[1].as_mut_ptr().add(v * VL).cast(), k1[v]);
            _mm512_storeu_si512(s_out[1].as_mut_ptr().add(v * VL).cast(), s1[v]);
        }
    }
}
