//! The naive GEMM's vectorised kernels for formats that round through f32.
//!
//! [`NaiveF32::gemm`] keeps the running sums in registers, [`naive_lanes::TILE`] output
//! columns at a time ([`super::naive_lanes`], whose docs prove each step; on AVX-512 and
//! AVX2 CPUs [`super::naive_special`] where both formats have a rounding of their own), and
//! adds the bias
//! and rounds the outputs per row with the run rounding below. The row kernel
//! ([`NaiveF32::row`]) serves `fma:<A>` and operands off the f32 grid:
//!
//! For one output row, each step `t` forms the products `a_t · b_t[j]` for the whole row,
//! rounds them, adds them to the row's running sums and rounds again, each rounding a run
//! through the format's branch-free f32 plan ([`F32Plan`], the quantize kernel's fast path).
//! The operations are computed in f64 (products of these formats are exact there, sums
//! are rounded to odd) and narrowed to f32 by rounding to odd, which keeps a correct final
//! rounding for any format with at most 22 significand bits: so every step is the correctly
//! rounded operation, bit for bit the same as the general path.
//!
//! Applies to posits with n <= 24 and maxpos^2 <= 2^125, and floats with at most 21
//! mantissa bits whose squared range lies inside f32's normal range (fp16, e5m2, e4m3, ...),
//! so that no product or sum leaves f32's normal range.
//!
//! The same kernel serves `naive:<A>` and `fma:<A>` ([`super::gemm_acc`]) when both the
//! operand format `F` and the accumulator `A` apply: products rounded with `F`'s plan (or,
//! fused, left exact in f64), sums with `A`'s, the output with `F`'s. A sum of a value of `F`
//! and one of `A` is zero or at least the smaller of their smallest magnitudes, and below
//! twice the larger maximum, so it stays inside f32's normal range too. The accumulator
//! may also be IEEE binary32 (`fp32`: the native f32 add, or the fused multiply-add for
//! `fma`; the bias added in f64 rounded to odd and converted), or a float with f32's
//! exponent range and at most 22 significand bits (bf16): [`naive_lanes`]'s docs prove
//! both. `fma:<A>` runs in registers where `A` is binary32 or the operands have at most 12
//! significand bits (their products are f32 values); otherwise in the row kernel, whose
//! products are exact in f64 and whose sums are rounded to odd there (narrowed to odd for
//! a plan accumulator, converted to f32 for binary32).

use rayon::prelude::*;

use super::gemm_cpu::{for_rows, Bias, Dims};
use super::lane_round::LaneRound;
use super::layer_io::transpose_into;
use super::naive_lanes::{self, Accumulator, Products, TILE};
use super::quire_i16::Operand;
use super::round_odd::{add_odd, mul_odd};
use super::scratch;
use crate::backend::f32_plan::F32Plan;
use crate::format::float::{Overflow, Specials};
use crate::format::rounding::{NearestEven, RuleKind};
use crate::format::Format;
use crate::team::{self, Threading};

/// `v` narrowed to f32 with rounding to odd (inputs inside f32's normal range).
#[inline(always)]
fn to_f32_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f as f64 == v || f.to_bits() & 1 == 1 {
        return f;
    }
    let away = v.abs() > (f as f64).abs();
    f32::from_bits(if away {
        f.to_bits() + 1
    } else {
        f.to_bits() - 1
    })
}

/// Nearest-even rounding of f32 runs to one format.
struct RunRounding {
    plan: F32Plan,
    format: Format,
    /// The most significand bits a value of the format has.
    significand_bits: u32,
    /// The rounding specialised to the format, where it has one.
    lanes: Option<LaneRound>,
}

impl RunRounding {
    /// The rounding of an operand format (or an accumulator of the same reach): posits with
    /// n <= 24 and maxpos^2 <= 2^125, floats with at most 21 mantissa bits whose squared
    /// range lies inside f32's normal range.
    fn new(format: &Format) -> Option<Self> {
        let (fits, significand_bits) = match format {
            Format::Posit(p) => (
                p.n() <= 24 && 2 * p.max_scale() <= 125,
                p.n().saturating_sub(2 + p.es()),
            ),
            Format::Float(f) => {
                let (lo, hi) = (f.min_positive(), f.max_value());
                let range = lo * lo >= f64::from(f32::MIN_POSITIVE) && hi * hi < 2f64.powi(127);
                (f.man() <= 21 && range, f.man() + 1)
            }
            _ => (false, 0),
        };
        if !fits {
            return None;
        }
        Self::with_plan(format, significand_bits)
    }

    /// The rounding of an accumulator format: those of [`RunRounding::new`], and floats with
    /// at most 21 mantissa bits, values inside f32's range and overflow to infinity (bf16,
    /// `float<8,m>`; see the module docs).
    fn accumulator(format: &Format) -> Option<Self> {
        match format {
            Format::Float(f)
                if f.man() <= 21
                    && f.max_value() <= f64::from(f32::MAX)
                    && f.overflow() == Overflow::Infinity =>
            {
                Self::with_plan(format, f.man() + 1)
            }
            _ => Self::new(format),
        }
    }

    fn with_plan(format: &Format, significand_bits: u32) -> Option<Self> {
        Some(RunRounding {
            plan: F32Plan::new(format, RuleKind::NearestEven)?,
            format: *format,
            significand_bits,
            lanes: LaneRound::new(format),
        })
    }

    /// Rounds `src` into `dst` (the fast path, then the general path where it does not apply).
    #[inline]
    fn round(&self, src: &[f32], dst: &mut [f32]) {
        crate::backend::cpu::round_nearest_run(&self.plan, src, dst, |x| {
            self.format.round_rule(x, NearestEven, 0)
        });
    }
}

/// The accumulator of the specialised register kernel.
#[derive(Clone, Copy)]
enum SumRound<'a> {
    Round(&'a LaneRound),
    Binary32,
}

/// The specialised roundings of products (none for fused products) and sums.
type SpecialLanes<'a> = (Option<&'a LaneRound>, SumRound<'a>);

/// One tile by the specialised register kernel ([`super::naive_special`]): `None` where
/// there are no specialised roundings or the CPU does not run that kernel.
/// `operands_finite`: `a` and the tile's rows of `b` are known to be finite; `width`: the
/// tile's columns that are outputs.
#[allow(unused_variables)]
fn special_tile(
    special: Option<SpecialLanes<'_>>,
    products: Products,
    a: &[f32],
    b: &[f32],
    (stride, width): (usize, usize),
    acc: &mut [f32; TILE],
    operands_finite: bool,
) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::naive_special::{self, SumLanes};
        let (op, sum) = special?;
        let sum = match sum {
            SumRound::Round(r) => SumLanes::Round(r),
            SumRound::Binary32 => SumLanes::Binary32,
        };
        naive_special::tile(
            op,
            sum,
            products,
            a,
            b,
            (stride, width),
            acc,
            operands_finite,
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Whether every value of `v` is finite (a pass without early exits, which vectorises).
fn finite(v: &[f32]) -> bool {
    v.iter().fold(true, |all, x| all & x.is_finite())
}

/// For each tile of [`TILE`] columns of `bf` (`k` rows of `stride`), whether its values are
/// all finite.
fn tile_finite(bf: &[f32], k: usize, stride: usize) -> Vec<bool> {
    let mut tiles = vec![true; stride / TILE];
    for row in bf[..k * stride].chunks_exact(stride.max(1)) {
        for (f, part) in tiles.iter_mut().zip(row.chunks_exact(TILE)) {
            *f &= finite(part);
        }
    }
    tiles
}

/// `prepare(src, dst)` in pieces of 4096 values, on the rayon pool when `parallel`.
fn prepare_chunks(
    prepare: &(impl Fn(&[f32], &mut [f32]) + Sync),
    src: &[f32],
    dst: &mut [f32],
    parallel: bool,
) {
    if parallel {
        dst.par_chunks_mut(4096)
            .zip(src.par_chunks(4096))
            .for_each(|(d, s)| prepare(s, d));
    } else {
        prepare(src, dst);
    }
}

/// `B` (`k x n`) as f32 rows padded with zeros to whole tiles (`k x stride`, `stride` the
/// next multiple of [`TILE`]): `fill(t, dst)` writes row `t` into its first `n` elements and
/// says whether it could (`None` as soon as one row could not).
fn padded(k: usize, n: usize, mut fill: impl FnMut(usize, &mut [f32]) -> bool) -> Option<Vec<f32>> {
    let stride = n.div_ceil(TILE) * TILE;
    let mut bf = vec![0f32; k * stride];
    if n > 0 {
        for (t, dst) in bf.chunks_mut(stride).enumerate() {
            if !fill(t, &mut dst[..n]) {
                return None;
            }
        }
    }
    Some(bf)
}

/// How a kernel rounds its sums.
enum Sums {
    /// To the operand format (`naive`).
    Operand,
    /// To an accumulator format through its plan.
    Plan(Box<RunRounding>),
    /// To IEEE binary32: the native f32 add or fused multiply-add.
    Binary32,
}

/// Whether `format` is IEEE binary32 (`fp32`, `float<8,23>` with subnormals, Inf and NaN).
pub fn is_binary32(format: &Format) -> bool {
    matches!(format, Format::Float(f)
        if f.exp() == 8 && f.man() == 23 && f.subnormals() && f.bias() == 127
            && f.specials() == Specials::Ieee && f.overflow() == Overflow::Infinity)
}

/// The row kernel of one operand format and one accumulator format.
pub struct NaiveF32 {
    op: RunRounding,
    sums: Sums,
    /// Products left exact and added with one rounding (`fma`).
    fused: bool,
}

impl NaiveF32 {
    /// The kernel of `naive` in `format`, where it applies (see the module docs).
    pub fn new(format: &Format) -> Option<Self> {
        Some(NaiveF32 {
            op: RunRounding::new(format)?,
            sums: Sums::Operand,
            fused: false,
        })
    }

    /// The kernel of `naive:<acc>` (`fused` false) or `fma:<acc>` (`fused` true, products
    /// of `op` exact in f64) for operands in `op`, where it applies.
    pub fn with_accumulator(op: &Format, acc: &Format, fused: bool) -> Option<Self> {
        let op = RunRounding::new(op)?;
        let sums = if is_binary32(acc) {
            Sums::Binary32
        } else {
            Sums::Plan(Box::new(RunRounding::accumulator(acc)?))
        };
        Some(NaiveF32 { op, sums, fused })
    }

    /// The plan rounding of the sums (`None` for binary32).
    fn sum_plan(&self) -> Option<&RunRounding> {
        match &self.sums {
            Sums::Operand => Some(&self.op),
            Sums::Plan(r) => Some(r),
            Sums::Binary32 => None,
        }
    }

    /// `v` (an f64 rounded to odd, or exact) rounded to the accumulator format.
    fn round_sum(&self, v: f64) -> f64 {
        match self.sum_plan() {
            Some(r) => r.format.round_rule(v, NearestEven, 0),
            None => f64::from(v as f32),
        }
    }

    /// Whether tiles run the register kernel with roundings specialised to the formats
    /// ([`super::naive_special`]) on this CPU (or under its instruction-set cap): a tile of
    /// no terms is run to find out.
    pub fn specialised(&self) -> bool {
        let mut tile = [0f32; TILE];
        special_tile(
            self.special_lanes(),
            self.products(),
            &[],
            &[],
            (TILE, TILE),
            &mut tile,
            true,
        )
        .is_some()
    }

    /// The kind of products the register kernel forms.
    fn products(&self) -> Products {
        if self.fused {
            Products::Fused
        } else if self.exact_products() {
            Products::RoundedExact
        } else {
            Products::Rounded
        }
    }

    /// Whether operands of the operand format have products that are f32 values.
    fn exact_products(&self) -> bool {
        self.op.significand_bits <= 12
    }

    /// `out (m x n) = A (m x k) · B (k x n) [+ bias]` under this kernel's rule, `a`, `b`
    /// and the bias row-major on the formats' grids (`parallel`: rows on the rayon pool).
    ///
    /// The sums run in registers, [`TILE`] columns at a time ([`naive_lanes::tile`]); a
    /// tile the register kernel leaves behind (NaR, NaN, Inf) is summed by the scalar
    /// definition; the bias and the output rounding follow on the row. Operands that are
    /// not f32 values (off the grid), and `fma` into a plan accumulator with operands of
    /// more than 12 significand bits, take the row kernel ([`NaiveF32::row`]) instead.
    pub fn gemm(
        &self,
        a: &[f64],
        b: &[f64],
        (m, k, n): Dims,
        bias: Bias,
        out: &mut [f64],
        parallel: bool,
    ) {
        assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
        let is_f32 = |v: &f64| v.is_nan() || f64::from(*v as f32) == *v;
        let fused_lanes = matches!(self.sums, Sums::Binary32) || self.exact_products();
        // B as f32 padded to whole tiles, checked on the f32 grid as it is copied.
        let copy = |t: usize, dst: &mut [f32]| {
            let src = &b[t * n..t * n + n];
            src.iter().zip(dst).all(|(v, d)| {
                *d = *v as f32;
                is_f32(v)
            })
        };
        let bf = if !self.fused || fused_lanes {
            padded(k, n, copy)
        } else {
            None
        };
        let registers = bf.is_some() && a[..m * k].iter().all(is_f32);
        let bias_of = |i: usize| -> Option<Vec<f64>> {
            match bias {
                Bias::None => None,
                Bias::PerCol(v) => Some(v[..n].to_vec()),
                Bias::PerRow(v) => Some(vec![v[i]; n]),
            }
        };
        if !registers {
            let row = |i: usize, dst: &mut [f64]| {
                let bias_row = bias_of(i);
                self.row(&a[i * k..i * k + k], &b[..k * n], bias_row.as_deref(), dst);
            };
            return for_rows(out, m, n, parallel, row);
        }
        let af: Vec<f32> = a[..m * k].iter().map(|&v| v as f32).collect();
        let bf = bf.expect("checked above");
        let stride = n.div_ceil(TILE) * TILE;
        let finite = tile_finite(&bf, k, stride);
        self.tiled(&af, &bf, &finite, (m, k, n), bias, out, parallel);
    }

    /// [`NaiveF32::gemm`] straight from f32 operands not yet rounded (each in either
    /// layout), as the f32 outputs: the operands rounded to the operand format in f32 (the
    /// same values as rounding them in f64 first: the rounding is correct either way), then
    /// the register kernel, without the f64 copies. `None` where the register kernel does
    /// not apply (`fma` into a plan accumulator with operands of more than 12 significand
    /// bits); the bias, if any, already rounded.
    ///
    /// With `round` false the operands are already values of the operand format (as
    /// f32), and are copied into the kernel's layout without rounding them again.
    pub fn gemm_f32(
        &self,
        a: Operand,
        b: Operand,
        (m, k, n): Dims,
        bias: Bias,
        parallel: bool,
        round: bool,
    ) -> Option<Vec<f32>> {
        if !self.runs_f32() {
            return None;
        }
        let prepare = |src: &[f32], dst: &mut [f32]| {
            if round {
                self.op.round(src, dst);
            } else {
                dst.copy_from_slice(src);
            }
        };
        let mut out = vec![0f32; m * n];
        if m == 0 || n == 0 {
            return Some(out);
        }
        let (bands, inside) = Threading::of(parallel, (m, k, n)).bands();
        // B (k x n) in the kernel's layout, rows padded with zeros to whole tiles, and which
        // tiles are finite: once, on the calling thread (threaded only for a single band).
        let stride = n.div_ceil(TILE) * TILE;
        let layout_b = || {
            let mut bf = scratch::take::<f32>(k * stride);
            if b.transposed {
                // Stored as Bᵀ (n x k): rounded as it is stored, then transposed into place.
                let bt = &b.data[..n * k];
                let rounded;
                let bt = if round {
                    let mut r = vec![0f32; n * k];
                    prepare_chunks(&prepare, bt, &mut r, inside);
                    rounded = r;
                    &rounded[..]
                } else {
                    bt
                };
                transpose_into(bt, n, k, &mut bf, stride, inside);
                for row in bf.chunks_mut(stride.max(1)) {
                    row[n..].fill(0.0);
                }
            } else {
                for (t, row) in bf.chunks_mut(stride.max(1)).enumerate() {
                    prepare(&b.data[t * n..t * n + n], &mut row[..n]);
                    row[n..].fill(0.0);
                }
            }
            let finite = tile_finite(&bf, k, stride);
            (bf, finite)
        };
        // Each band rounds its own rows of A and sums them.
        let band = |(bf, finite): &(scratch::Scratch<f32>, Vec<bool>),
                    (r0, out): (usize, &mut [f32])| {
            let rows = out.len() / n;
            let stored = a.band((m, k), r0..r0 + rows);
            let mut af = vec![0f32; rows * k];
            if a.transposed {
                // Stored as the band's transpose (k x rows).
                let mut t = vec![0f32; rows * k];
                transpose_into(&stored, k, rows, &mut t, k, inside);
                prepare_chunks(&prepare, &t, &mut af, inside);
            } else {
                prepare_chunks(&prepare, &stored, &mut af, inside);
            }
            let bias = match bias {
                Bias::PerRow(v) => Bias::PerRow(&v[r0..r0 + rows]),
                other => other,
            };
            let mut sums = vec![0f64; rows * n];
            self.tiled(&af, bf, finite, (rows, k, n), bias, &mut sums, inside);
            for (o, s) in out.iter_mut().zip(sums) {
                *o = s as f32;
            }
        };
        let tasks = team::row_bands(&mut out, n, bands, 1);
        team::run(bands - 1, layout_b, tasks, band);
        Some(out)
    }

    /// Whether [`NaiveF32::gemm_f32`] runs: all but `fma` into a plan accumulator with
    /// operands of more than 12 significand bits.
    pub fn runs_f32(&self) -> bool {
        !self.fused || matches!(self.sums, Sums::Binary32) || self.exact_products()
    }

    /// The register kernel of [`NaiveF32::gemm`] on `af` (`m x k`, row-major) and `bf`
    /// (`k x n`, each row padded to whole tiles: see [`padded`]), both values of the
    /// operand format (Inf and NaN allowed); `tile_finite` from [`tile_finite`].
    #[allow(clippy::too_many_arguments)]
    fn tiled(
        &self,
        af: &[f32],
        bf: &[f32],
        tile_finite: &[bool],
        (m, k, n): Dims,
        bias: Bias,
        out: &mut [f64],
        parallel: bool,
    ) {
        let bias_of = |i: usize| -> Option<Vec<f64>> {
            match bias {
                Bias::None => None,
                Bias::PerCol(v) => Some(v[..n].to_vec()),
                Bias::PerRow(v) => Some(vec![v[i]; n]),
            }
        };
        let stride = n.div_ceil(TILE) * TILE;
        let accumulator = match self.sum_plan() {
            Some(r) => Accumulator::Plan(&r.plan),
            None => Accumulator::Binary32,
        };
        let products = self.products();
        let special = self.special_lanes();
        // Which rows of A are finite, found once for all tiles.
        let row_finite: Vec<bool> = (0..m).map(|i| finite(&af[i * k..i * k + k])).collect();
        let row = |i: usize, dst: &mut [f64]| {
            let x = &af[i * k..i * k + k];
            let mut sums = vec![0f32; n];
            let mut tile = [0f32; TILE];
            for col in (0..n).step_by(TILE) {
                let width = TILE.min(n - col);
                let tile_b = &bf[col..];
                let finite = row_finite[i] && tile_finite[col / TILE];
                let done = special_tile(
                    special,
                    products,
                    x,
                    tile_b,
                    (stride, width),
                    &mut tile,
                    finite,
                )
                .unwrap_or_else(|| {
                    naive_lanes::tile(
                        &self.op.plan,
                        accumulator,
                        products,
                        x,
                        tile_b,
                        stride,
                        &mut tile,
                    )
                });
                for (j, s) in sums[col..col + width].iter_mut().enumerate() {
                    *s = if done {
                        tile[j]
                    } else {
                        let xs: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
                        let ys: Vec<f64> = (0..k)
                            .map(|t| f64::from(bf[t * stride + col + j]))
                            .collect();
                        self.scalar_sum(&xs, &ys, 1) as f32
                    };
                }
            }
            let bias_row = bias_of(i);
            self.finish(sums, bias_row.as_deref(), dst);
        };
        for_rows(out, m, n, parallel, row);
    }

    /// The specialised roundings of the register kernel, where both the operand format
    /// (unless the products are fused) and the accumulator have one.
    fn special_lanes(&self) -> Option<SpecialLanes<'_>> {
        let op = self.op.lanes.as_ref();
        let sum = match &self.sums {
            Sums::Operand => SumRound::Round(op?),
            Sums::Plan(r) => SumRound::Round(r.lanes.as_ref()?),
            Sums::Binary32 => SumRound::Binary32,
        };
        if op.is_none() && !self.fused {
            return None;
        }
        Some((op, sum))
    }

    /// One output's sum by the definition in f64 (each operation rounded to odd, then to
    /// the format): `xs` against `b[0], b[stride], ...`.
    fn scalar_sum(&self, xs: &[f64], b: &[f64], stride: usize) -> f64 {
        let op = self.op.format;
        xs.iter().enumerate().fold(0.0, |c, (t, &x)| {
            let y = b[t * stride];
            let term = if self.fused {
                x * y
            } else {
                op.round_rule(mul_odd(x, y), NearestEven, 0)
            };
            self.round_sum(add_odd(c, term))
        })
    }

    /// The bias step and the output rounding of one row of sums (values of the
    /// accumulator format, as f32), into `out`.
    fn finish(&self, mut acc: Vec<f32>, bias: Option<&[f64]>, out: &mut [f64]) {
        let mut tmp = vec![0f32; acc.len()];
        if let Some(bias) = bias {
            match self.sum_plan() {
                Some(sum) => {
                    for ((s, &c), &v) in tmp.iter_mut().zip(&acc).zip(bias) {
                        *s = to_f32_odd(add_odd(c as f64, v));
                    }
                    sum.round(&tmp, &mut acc);
                }
                None => {
                    for (c, &v) in acc.iter_mut().zip(bias) {
                        *c = add_odd(*c as f64, v) as f32;
                    }
                }
            }
        }
        if !matches!(self.sums, Sums::Operand) {
            // The output in the operand format.
            tmp.copy_from_slice(&acc);
            self.op.round(&tmp, &mut acc);
        }
        for (o, &c) in out.iter_mut().zip(&acc) {
            *o = c as f64;
        }
    }

    /// One output row: `out[j] = round(... round(round(0 + round(a_0 b_0j)) + ...) + bias_j)`
    /// (with an accumulator: sums rounded to it, products to the operand format or fused,
    /// the result rounded to the operand format)
    /// for `a` (k values), `b` (k x n, row-major) and the row's bias (if any).
    pub fn row(&self, a: &[f64], b: &[f64], bias: Option<&[f64]>, out: &mut [f64]) {
        let n = out.len();
        let mut acc = vec![0f32; n];
        let mut tmp = vec![0f32; n];
        let mut prod = vec![0f32; n];
        let sum = self.sum_plan();
        // Binary32 sums: the f64 sum rounded to odd, narrowed by the f32 conversion (the
        // correct rounding); plan sums: narrowed to odd, then rounded by the plan.
        let narrow = |v: f64| match sum {
            Some(_) => to_f32_odd(v),
            None => v as f32,
        };
        for (t, &x) in a.iter().enumerate() {
            let brow = &b[t * n..t * n + n];
            // Products of two such values are exact in f64 (at most 2 x 22 significand bits).
            if self.fused {
                for ((s, &c), &y) in tmp.iter_mut().zip(&acc).zip(brow) {
                    *s = narrow(add_odd(c as f64, x * y));
                }
            } else {
                for (p, &y) in tmp.iter_mut().zip(brow) {
                    *p = to_f32_odd(x * y);
                }
                self.op.round(&tmp, &mut prod);
                for ((s, &c), &p) in tmp.iter_mut().zip(&acc).zip(&prod) {
                    *s = narrow(add_odd(c as f64, p as f64));
                }
            }
            match sum {
                Some(sum) => sum.round(&tmp, &mut acc),
                None => acc.copy_from_slice(&tmp),
            }
        }
        self.finish(acc, bias, out);
    }
}
