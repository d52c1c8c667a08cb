//! The naive GEMM of posits past the f32 kernels (posit<32,2>, posit<24,1>, ...) in f64:
//! from `c = 0`, for `t` ascending, `c = R(c + R(a_t · b_tj))`, then `c = R(c + bias)`, with
//! `R` the posit's nearest-even rounding and every product and sum computed in f64 rounded
//! to odd ([`super::round_odd`], whose docs prove that one rounding of that value is the
//! correctly rounded operation). `R` is the pattern rounding of [`super::posit_f64`], the
//! same value as [`Format::round`] (tested bit for bit); so the result is the definition's,
//! [`naive_gemm_reference`], bit for bit.
//!
//! # Scalar rows
//!
//! The portable path is the definition's loop with the fast rounding, one output row at a
//! time.
//!
//! # AVX-512 tiles
//!
//! Where the CPU (and the cap of [`crate::backend::isa::set_cap`]) has AVX-512, a row's
//! outputs run in tiles (one f64 lane per output, 8 lanes a vector): 32 columns of one row,
//! then at most 8 columns of a block of up to four rows (so that narrow outputs, such as a
//! convolution's weight gradient, still run several independent chains; the last `n mod
//! 8` columns in lanes that load zeros past the row's end and are not stored); the outputs
//! of a row or column with a non-finite operand run the scalar loop. In a tile every step
//! is the scalar step, with these changes, none of which changes a bit:
//!
//! * **Round to odd is the odd one of the results rounded up and down**, else the upward
//!   one (`vmulpd`/`vaddpd` with the rounding direction in the instruction). An exact result
//!   rounds both ways to itself; of the two neighbours of an inexact finite result, which
//!   have the same sign, exactly one has an odd pattern, and rounding to odd picks it. The
//!   operands are finite posit values (`es <= 4`), so every product and sum is finite and
//!   either zero or normal (`minpos² >= 2^-960`), and an inexact result is never near zero.
//!   An exact zero sum `x + (-x)` rounds up to `+0` and down to `-0`: the upward one, `+0`,
//!   is the f64 sum the definition computes.
//! * **Doubled values.** Each `a_t` is doubled (exact), so every product, sum and rounded
//!   value is twice the definition's: scaling by two commutes with rounding up, down and to
//!   odd, and with the posit rounding, as long as the values stay normal f64 (they do, by
//!   the bounds above). For a normal `|x|` the pattern of `2|x|` is that of `|x|` plus
//!   `2^52`, which is the rounding's raised `t`: the lanes read `t` from the doubled value
//!   and its rounded `t` is the doubled result, with no `2^52` added or removed. The sums
//!   are halved at the end (exact).
//! * **Computed masks.** Instead of the per-regime tables, the rounding bit is computed:
//!   with `top = t >> (52 + es) = k + 1024 / 2^es`, regime `k` keeps `fb = n - 1 - len - es`
//!   fraction bits, `len = max(k + 2, 1 - k)` its length, so `s = 52 - fb = max(top + c1,
//!   c2 - top)` for two constants; the mask is `-1 << s` (`vpsllvq`), the increment
//!   `!mask >> 1`, the parity bit `t & -mask` (`-mask = 2^s`), a lane mask that adds one.
//!   The parity of the two regimes whose pattern ends in the regime (`len = n - 1`: `k =
//!   n - 3` and `k = -(n - 2)`) is the regime's last bit, 0 and 1, while bit `s` of `t` is
//!   the low bit of `k` (`1024 / 2^es` is even): they differ in both regimes exactly when
//!   `n` is even, where the lanes flip the parity there. maxpos (`t` at the upper clamp,
//!   regime `n - 2`, which the tables keep with mask all ones) is put back as it is, since
//!   the computed `s` would round its bits.
//! * **Zeros.** A product's rounding sends `t = 0` (a zero product) to `+0`. A sum of two
//!   posit values (both multiples of minpos) is `+0` or at least minpos in magnitude, so
//!   the sum's rounding skips the lower clamp; `t = 0` has `top = 0`, whose `s` is at least
//!   64 (`1 - k >= 65`), so the mask is 0 and the result `+0`.

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims};
use super::posit_f64::PositF64;
use super::round_odd::{add_odd, mul_odd};
use crate::format::rounding::NearestEven;
use crate::format::Format;

/// `out (m x n) = A · B [+ bias]` in `format` with every multiply and add rounded (nearest
/// even), `k` ascending from zero, the bias added last: the naive GEMM's definition, one
/// operation at a time with [`Format::round`]'s general rounding (the reference of the
/// faster paths, and their fallback for formats they do not take).
pub fn naive_gemm_reference(
    format: &Format,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    let round = |x: f64| format.round_rule(x, NearestEven, 0);
    rows(round, a, b, dims, bias, out, parallel, 1, |_, _, _| {});
}

/// The naive GEMM of a posit that [`PositF64`] rounds (see the module docs).
#[derive(Debug, Clone)]
pub struct NaivePositF64 {
    round: PositF64,
}

impl NaivePositF64 {
    /// The GEMM of `format`, where [`PositF64`] takes it.
    pub fn new(format: &Format) -> Option<Self> {
        PositF64::new(format).map(|round| NaivePositF64 { round })
    }

    /// `out (m x n) = A · B [+ bias]`, the same bits as [`naive_gemm_reference`]. `parallel`
    /// spreads rows over the rayon pool.
    pub fn gemm(
        &self,
        a: &[f64],
        b: &[f64],
        dims: Dims,
        bias: Bias,
        out: &mut [f64],
        parallel: bool,
    ) {
        let (m, k, n) = dims;
        assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
        let round = |x: f64| self.round.round(x);
        #[cfg(target_arch = "x86_64")]
        if let Some(lanes) = avx512::Lanes::new(&self.round, a, b, dims) {
            // Blocks of up to four rows give narrow tiles independent chains (rows), while
            // leaving each thread of the pool a block.
            let threads = if parallel {
                rayon::current_num_threads()
            } else {
                1
            };
            let block = (m / threads).clamp(1, avx512::MAX_ROWS);
            let tiles =
                |i: usize, dst: &mut [f64], pending: &mut [bool]| lanes.block(i, dst, pending);
            rows(round, a, b, dims, bias, out, parallel, block, tiles);
            return;
        }
        rows(round, a, b, dims, bias, out, parallel, 1, |_, _, _| {});
    }
}

/// The row loop of the definition with rounding `round`, in blocks of `block` rows (the
/// last one shorter); `tiles(i, dst, pending)` may first compute some of the sums of the
/// block from row `i` (`dst`, row-major, without the bias), clearing their `pending` flags:
/// the scalar loop computes the others.
#[allow(clippy::too_many_arguments)]
fn rows(
    round: impl Fn(f64) -> f64 + Sync,
    a: &[f64],
    b: &[f64],
    (m, k, n): Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
    block: usize,
    tiles: impl Fn(usize, &mut [f64], &mut [bool]) + Sync,
) {
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n && block > 0);
    if n == 0 {
        return;
    }
    let rows = |bi: usize, dst: &mut [f64]| {
        let i0 = bi * block;
        dst.fill(0.0);
        // The outputs the tiles left to the scalar loop.
        let mut pending = vec![true; dst.len()];
        tiles(i0, dst, &mut pending);
        for (r, (dst, pending)) in dst.chunks_mut(n).zip(pending.chunks(n)).enumerate() {
            let i = i0 + r;
            let scalar = pending.iter().any(|&p| p);
            for t in (0..k).filter(|_| scalar) {
                let x = a[i * k + t];
                let brow = &b[t * n..t * n + n];
                for ((c, &y), &p) in dst.iter_mut().zip(brow).zip(pending) {
                    if p {
                        *c = round(add_odd(*c, round(mul_odd(x, y))));
                    }
                }
            }
            for (j, c) in dst.iter_mut().enumerate() {
                if let Some(v) = bias.at(i, j) {
                    *c = round(add_odd(*c, v));
                }
            }
        }
    };
    let out = &mut out[..m * n];
    if parallel {
        out.par_chunks_mut(block * n)
            .enumerate()
            .for_each(|(bi, dst)| rows(bi, dst));
    } else {
        out.chunks_mut(block * n)
            .enumerate()
            .for_each(|(bi, dst)| rows(bi, dst));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::super::gemm_cpu::Dims;
    use super::super::posit_f64::PositF64;
    use crate::backend::isa::{self, Isa};

    /// The most rows of a block ([`Lanes::block`]).
    pub(super) const MAX_ROWS: usize = 4;

    /// Rounding up and down, exceptions suppressed.
    const UP: i32 = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
    /// See [`UP`].
    const DOWN: i32 = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;

    /// The rounding's constants, computed from the posit (see the module docs).
    #[derive(Clone, Copy)]
    struct Consts {
        /// `52 + es`.
        shift: u32,
        /// `t` of minpos and maxpos (doubled values: the patterns of `2 minpos`, `2 maxpos`).
        t_lo: i64,
        t_hi: i64,
        /// `s = max(top + c1, c2 - top)`.
        c1: i64,
        c2: i64,
        /// The `top` of the two regimes whose parity is flipped (`n` even), else -1.
        flip_a: i64,
        flip_b: i64,
    }

    /// A GEMM's operands checked for the tiles: which rows of `a` and columns of `b` are
    /// finite.
    pub(super) struct Lanes<'a> {
        c: Consts,
        a: &'a [f64],
        b: &'a [f64],
        dims: Dims,
        row_finite: Vec<bool>,
        col_finite: Vec<bool>,
    }

    impl<'a> Lanes<'a> {
        /// The tiles of a GEMM, where the CPU (under the cap) has AVX-512.
        pub(super) fn new(r: &PositF64, a: &'a [f64], b: &'a [f64], dims: Dims) -> Option<Self> {
            if isa::active() != Isa::Avx512 {
                return None;
            }
            let (m, k, n) = dims;
            let p = r.posit();
            let (nb, es) = (p.n() as i64, p.es() as i64);
            let big = 1024 >> es;
            let even = nb % 2 == 0;
            let c = Consts {
                shift: 52 + es as u32,
                t_lo: (p.min_pos().to_bits() + (1 << 52)) as i64,
                t_hi: (p.max_pos().to_bits() + (1 << 52)) as i64,
                // s = 53 - n + es + len, len = max(k + 2, 1 - k), k = top - big.
                c1: 55 - nb + es - big,
                c2: 54 - nb + es + big,
                flip_a: if even { nb - 3 + big } else { -1 },
                flip_b: if even { 2 - nb + big } else { -1 },
            };
            let mut col_finite = vec![true; n];
            for t in 0..k {
                for (f, y) in col_finite.iter_mut().zip(&b[t * n..t * n + n]) {
                    *f &= y.is_finite();
                }
            }
            let row_finite = (0..m)
                .map(|i| a[i * k..i * k + k].iter().all(|x| x.is_finite()))
                .collect();
            Some(Lanes {
                c,
                a,
                b,
                dims,
                row_finite,
                col_finite,
            })
        }

        /// The sums (no bias) of the block of `dst.len() / n` rows from row `i0` (at most
        /// [`MAX_ROWS`]), their `pending` flags cleared, in tiles of 32 columns of one row
        /// and tiles of at most 8 columns of every row of the block, where the operands are
        /// finite; the other outputs are left as they are.
        pub(super) fn block(&self, i0: usize, dst: &mut [f64], pending: &mut [bool]) {
            let (_, k, n) = self.dims;
            let rows = dst.len() / n;
            assert!(rows <= MAX_ROWS && pending.len() == dst.len());
            if k == 0 {
                return;
            }
            let finite_rows = (i0..i0 + rows).all(|i| self.row_finite[i]);
            let a = &self.a[i0 * k..(i0 + rows) * k];
            let mut j = 0;
            while j < n {
                let w = if j + 32 <= n { 32 } else { (n - j).min(8) };
                if self.col_finite[j..j + w].iter().all(|&f| f) {
                    let b = &self.b[j..];
                    let out = &mut dst[j..];
                    // SAFETY (every call): AVX-512 F is present (checked in `new`).
                    if w == 32 || !finite_rows {
                        for r in (0..rows).filter(|&r| self.row_finite[i0 + r]) {
                            let (a, out) = (&a[r * k..r * k + k], &mut out[r * n..]);
                            unsafe {
                                if w == 32 {
                                    tile::<1, 4>(&self.c, a, k, b, n, out, w);
                                } else {
                                    tile::<1, 1>(&self.c, a, k, b, n, out, w);
                                }
                            }
                            pending[r * n + j..r * n + j + w].fill(false);
                        }
                    } else {
                        unsafe {
                            match rows {
                                1 => tile::<1, 1>(&self.c, a, k, b, n, out, w),
                                2 => tile::<2, 1>(&self.c, a, k, b, n, out, w),
                                3 => tile::<3, 1>(&self.c, a, k, b, n, out, w),
                                _ => tile::<4, 1>(&self.c, a, k, b, n, out, w),
                            }
                        }
                        for r in 0..rows {
                            pending[r * n + j..r * n + j + w].fill(false);
                        }
                    }
                }
                j += w;
            }
        }
    }

    /// Of an operation's results rounded up and down, the odd one, else the upward one.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn odd_of(up: __m512d, down: __m512d) -> __m512i {
        let (up, down) = (_mm512_castpd_si512(up), _mm512_castpd_si512(down));
        let down_is_odd = _mm512_test_epi64_mask(down, _mm512_set1_epi64(1));
        _mm512_mask_blend_epi64(down_is_odd, up, down)
    }

    /// The posit rounding of doubled values `v` (patterns), giving doubled results. `SUM`:
    /// `v` is a sum of two posit values (no lower clamp, see the module docs).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn round<const SUM: bool>(c: &Consts, v: __m512i) -> __m512i {
        let sign_bit = _mm512_set1_epi64(i64::MIN);
        let ones = _mm512_set1_epi64(-1);
        let t_hi = _mm512_set1_epi64(c.t_hi);
        let sign = _mm512_and_si512(v, sign_bit);
        let abs = _mm512_andnot_si512(sign_bit, v);
        let (t, nonzero) = if SUM {
            (_mm512_min_epi64(abs, t_hi), !0)
        } else {
            let nonzero = _mm512_test_epi64_mask(abs, abs);
            let t = _mm512_mask_max_epi64(abs, nonzero, abs, _mm512_set1_epi64(c.t_lo));
            (_mm512_min_epi64(t, t_hi), nonzero)
        };
        let top = _mm512_srl_epi64(t, _mm_cvtsi64_si128(c.shift as i64));
        let s = _mm512_max_epi64(
            _mm512_add_epi64(top, _mm512_set1_epi64(c.c1)),
            _mm512_sub_epi64(_mm512_set1_epi64(c.c2), top),
        );
        let mask = _mm512_sllv_epi64(ones, s);
        let half = _mm512_srli_epi64::<1>(_mm512_andnot_si512(mask, ones));
        // Bit s of t (`-mask = 2^s`), flipped in the two regimes ending in the regime.
        let mut odd = _mm512_test_epi64_mask(t, _mm512_sub_epi64(_mm512_setzero_si512(), mask));
        if c.flip_a >= 0 {
            odd ^= _mm512_cmpeq_epi64_mask(top, _mm512_set1_epi64(c.flip_a))
                | _mm512_cmpeq_epi64_mask(top, _mm512_set1_epi64(c.flip_b));
        }
        let up = _mm512_add_epi64(t, half);
        // `up - (-1)` in the odd lanes.
        let r = _mm512_and_si512(_mm512_mask_sub_epi64(up, odd, up, ones), mask);
        let r = _mm512_mask_mov_epi64(r, _mm512_cmpeq_epi64_mask(t, t_hi), t_hi);
        _mm512_maskz_or_epi64(nonzero, r, sign)
    }

    /// One tile of `R` rows and the first `cols` of `8 V` columns (`cols > 8 (V - 1)`):
    /// `acc[r n + j] = ` the naive sum of `a[r k..r k + k] · b[.., j]` (no bias), `n` and `k`
    /// the strides of `acc` and `a`. `b` starts at the tile's first column, rows `n` apart;
    /// the lanes past `cols` load zeros (finite, and never stored).
    #[target_feature(enable = "avx512f")]
    fn tile<const R: usize, const V: usize>(
        c: &Consts,
        a: &[f64],
        k: usize,
        b: &[f64],
        n: usize,
        acc: &mut [f64],
        cols: usize,
    ) {
        assert!(cols > 8 * (V - 1) && cols <= 8 * V && a.len() >= (R - 1) * k + k);
        assert!(acc.len() >= (R - 1) * n + cols);
        assert!(k == 0 || b.len() >= (k - 1) * n + cols);
        let c = *c;
        // The lanes of each vector inside the tile.
        let lanes: [__mmask8; V] =
            std::array::from_fn(|v| (0xffu32 >> (8 * (v + 1)).saturating_sub(cols)) as u8);
        let mut sum = [[_mm512_setzero_si512(); V]; R];
        for t in 0..k {
            let row = b[t * n..].as_ptr();
            // SAFETY: the lanes loaded lie inside `b` (asserted above); masked lanes are
            // not read.
            let y: [__m512d; V] =
                std::array::from_fn(|v| unsafe { _mm512_maskz_loadu_pd(lanes[v], row.add(8 * v)) });
            for (r, sums) in sum.iter_mut().enumerate() {
                let xv = _mm512_set1_pd(2.0 * a[r * k + t]);
                for (s, &y) in sums.iter_mut().zip(&y) {
                    let p = odd_of(
                        _mm512_mul_round_pd::<UP>(xv, y),
                        _mm512_mul_round_pd::<DOWN>(xv, y),
                    );
                    let p = _mm512_castsi512_pd(round::<false>(&c, p));
                    let cur = _mm512_castsi512_pd(*s);
                    let q = odd_of(
                        _mm512_add_round_pd::<UP>(cur, p),
                        _mm512_add_round_pd::<DOWN>(cur, p),
                    );
                    *s = round::<true>(&c, q);
                }
            }
        }
        for (r, sums) in sum.iter().enumerate() {
            for (v, s) in sums.iter().enumerate() {
                let x = _mm512_mul_pd(_mm512_castsi512_pd(*s), _mm512_set1_pd(0.5));
                // SAFETY: the lanes stored lie inside `acc` (asserted above).
                unsafe { _mm512_mask_storeu_pd(acc.as_mut_ptr().add(r * n + 8 * v), lanes[v], x) };
            }
        }
    }
}
