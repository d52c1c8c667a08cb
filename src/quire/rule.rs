//! One GEMM's arithmetic: an [`Accumulate`] setting resolved for the format `F` the GEMM
//! computes in ([`GemmRule`]), and the three rules of a layer ([`LayerArith`]).
//!
//! A rule rounds the GEMM's operands to `F` ([`GemmRule::operands`]), runs the kernel of its
//! setting on f64 row-major slices ([`GemmRule::gemm`]) and hands back each output as the
//! f32 a tensor of `F` holds ([`GemmRule::output`]). The kernels:
//!
//! * `quire`: [`super::gemm_cpu::quire_gemm`] (the narrowest exact accumulator);
//! * `naive`: [`super::gemm_cpu::naive_gemm`] (i16 lanes for posit<8,0>, operation tables
//!   for other 8-bit formats); from f32 operands ([`GemmRule::gemm_f32`]) the 8-bit formats
//!   take the register kernel where it runs with roundings specialised to the format
//!   ([`super::naive_special`]: AVX2 with F16C, and AVX-512 but for posit<8,0>, whose i16
//!   lanes are faster there);
//! * `naive:<A>` and `fma:<A>`: [`super::gemm_acc`];
//! * `lns:<impl>`: [`super::gemm_lns`].
//!
//! Each is checked against a scalar reference loop in `tests/accumulate_layers.rs`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;

use super::accumulate::Accumulate;
use super::accumulator::quire_support;
use super::gemm_acc::{fma_gemm, naive_sum_gemm, products_exact};
use super::gemm_checked;
use super::gemm_cpu::{accumulator_for, naive_gemm, quire_gemm, Accumulator, Bias, Dims, OpTables};
use super::gemm_lns::{lns_gemm, lns_gemm_f32};
use super::int_operand::IntOperand;
use super::naive_f32::NaiveF32;
use super::naive_p8;
use super::p8_lanes;
use super::p8_units::is_posit8_0;
use super::quire_i16::{self, Operand};
use crate::format::rounding::NearestEven;
use crate::format::{Format, Posit};
use crate::lns::{GaussLog, LnsArith, LnsValue};

/// The arithmetic of one GEMM (see the module docs and [`super::accumulate`]).
#[derive(Debug, Clone)]
pub enum GemmRule {
    /// Exact sums in a quire of this posit, one rounding per output.
    Quire(Posit),
    /// Every product and partial sum rounded to the format.
    Naive(Format),
    /// Products rounded to `op`, sums to `acc`, the output to `op`.
    NaiveSum {
        /// The GEMM's format `F`.
        op: Format,
        /// The accumulator's format.
        acc: Format,
    },
    /// One rounding to `acc` per multiply-add, the output rounded to `op`.
    Fma {
        /// The GEMM's format `F`.
        op: Format,
        /// The accumulator's format.
        acc: Format,
    },
    /// LNS arithmetic of one lns format.
    Lns(LnsArith),
}

/// Why `format` cannot take single-operation rounding (`naive`, `naive:<A>`, `fma:<A>`), if
/// it cannot.
fn elementwise(format: &Format, role: &str) -> Result<(), String> {
    match format {
        Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => Err(format!(
            "{role} {format} rounds whole blocks, not single operations"
        )),
        Format::Lns(_) => Err(format!(
            "{role} {format} is logarithmic: its arithmetic is accumulate = \"lns:<impl>\""
        )),
        Format::Posit(p) => quire_support(*p),
        Format::Float(_) | Format::Fixed(_) => Ok(()),
    }
}

impl GemmRule {
    /// The rule of `setting` for a GEMM in `format`; `None` for `f32`; an error naming why
    /// the setting cannot apply to the format.
    pub fn new(setting: &Accumulate, format: &Format) -> Result<Option<GemmRule>, String> {
        let f = *format;
        Ok(Some(match setting {
            Accumulate::F32 => return Ok(None),
            Accumulate::Quire => match f {
                Format::Posit(p) => {
                    quire_support(p)?;
                    GemmRule::Quire(p)
                }
                other => {
                    return Err(format!(
                        "quire needs a posit format, got {other} (naive, naive:<format> and fma:<format> take any elementwise format)"
                    ))
                }
            },
            Accumulate::Naive => {
                elementwise(&f, "naive:")?;
                GemmRule::Naive(f)
            }
            Accumulate::NaiveSum(acc) => {
                elementwise(&f, "naive:<format>: the operand format")?;
                elementwise(acc, "naive:<format>: the accumulator")?;
                GemmRule::NaiveSum { op: f, acc: *acc }
            }
            Accumulate::Fma(acc) => {
                elementwise(&f, "fma:<format>: the operand format")?;
                elementwise(acc, "fma:<format>: the accumulator")?;
                if !products_exact(&f) {
                    return Err(format!(
                        "fma:<format> needs operand products exact in f64 (at most 26 significand bits, products inside f64's normal range); {f} has more"
                    ));
                }
                GemmRule::Fma { op: f, acc: *acc }
            }
            Accumulate::Lns(sum) => match f {
                Format::Lns(l) => GemmRule::Lns(lns_arith(l, sum.gauss_log(l.f()))?),
                other => {
                    return Err(format!(
                        "{setting} needs an lns format, got {other}"
                    ))
                }
            },
        }))
    }

    /// The format `F` the GEMM computes in (its operands' and its result's).
    pub fn format(&self) -> Format {
        match self {
            GemmRule::Quire(p) => Format::Posit(*p),
            GemmRule::Naive(f) => *f,
            GemmRule::NaiveSum { op, .. } | GemmRule::Fma { op, .. } => *op,
            GemmRule::Lns(a) => Format::Lns(a.lns()),
        }
    }

    /// `x` rounded to `F` (nearest even), as the f64 value the kernels take.
    #[inline]
    pub fn operand(&self, x: f32) -> f64 {
        self.format().round_rule(f64::from(x), NearestEven, 0)
    }

    /// Every element of `xs` rounded to `F` ([`GemmRule::operand`]), in parallel: through
    /// the quantize kernel's f32 fast path where every value of `F` is an f32 (so rounding
    /// in f32 is rounding the value), else one element at a time in f64.
    pub fn operands(&self, xs: &[f32]) -> Vec<f64> {
        let format = self.format();
        if let Format::Lns(l) = format {
            // The code nearest to each f32 (LnsValue::nearest is the format's nearest-even
            // rounding), as its value.
            return xs
                .par_iter()
                .with_min_len(4096)
                .map(|&x| LnsValue::nearest(l, f64::from(x)).to_f64(l))
                .collect();
        }
        if let Some(rounded) = self.rounded_f32(xs) {
            return rounded
                .par_iter()
                .with_min_len(4096)
                .map(|&v| f64::from(v))
                .collect();
        }
        xs.par_iter()
            .with_min_len(4096)
            .map(|&x| format.round_rule(f64::from(x), NearestEven, 0))
            .collect()
    }

    /// `xs` rounded to `F` in f32 through the quantize kernel's f32 fast path, where every
    /// value of `F` is an f32 (so rounding in f32 is rounding the value) and that path
    /// applies.
    fn rounded_f32(&self, xs: &[f32]) -> Option<Vec<f32>> {
        let format = self.format();
        if !values_are_f32(&format) {
            return None;
        }
        let mut rounded = vec![0f32; xs.len()];
        crate::backend::cpu::quantize_slice(
            Some(xs),
            &mut rounded,
            &[xs.len()],
            &format,
            crate::format::Rounding::NearestEven,
            None,
        )
        .ok()?;
        Some(rounded)
    }

    /// Operands for [`GemmRule::gemm_f32_rounded`]: `xs` rounded to `F` where every value of
    /// `F` is an f32, else as they are (the kernel rounds them).
    pub fn operands_f32<'a>(&self, xs: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        match self.rounded_f32(xs) {
            Some(rounded) => std::borrow::Cow::Owned(rounded),
            None => std::borrow::Cow::Borrowed(xs),
        }
    }

    /// The f32 a tensor holds for the kernel's output `v` (a value of `F`).
    #[inline]
    pub fn output(v: f64) -> f32 {
        v as f32
    }

    /// `A (m x k) · B (k x n) [+ bias]` under this rule straight from f32 operands not yet
    /// rounded to `F`, each in either layout, as the f32 outputs; the bias (if any) already
    /// rounded. `None` where the rule has no such path (then round with
    /// [`GemmRule::operands`] and call [`GemmRule::gemm`]): today the i16 quire of
    /// posit<8,0> ([`super::quire_i16`]), the checked f64 quire of the other posits
    /// ([`super::gemm_checked`]), naive posit<8,0> on AVX-512 ([`super::naive_p8`]), the
    /// register kernel of `naive` (for the 8-bit formats only where
    /// [`NaiveF32::specialised`]; posit<8,0> without it takes [`super::naive_p8`]),
    /// `naive:<A>` and `fma:<A>` ([`NaiveF32::gemm_f32`], where it applies) and the LNS
    /// rules ([`super::gemm_lns`]), the same bits as the f64 path.
    pub fn gemm_f32(
        &self,
        a: Operand,
        b: Operand,
        dims: Dims,
        bias: Bias,
        parallel: bool,
    ) -> Option<Vec<f32>> {
        self.run_f32(a, b, dims, bias, parallel, false)
    }

    /// [`GemmRule::gemm_f32`] of operands from [`GemmRule::operands_f32`] (any pieces of
    /// them, in any arrangement): the register kernel takes them without rounding them
    /// again, the other kernels as [`GemmRule::gemm_f32`] does (rounding a value of `F`
    /// gives it back).
    pub fn gemm_f32_rounded(
        &self,
        a: Operand,
        b: Operand,
        dims: Dims,
        bias: Bias,
        parallel: bool,
    ) -> Option<Vec<f32>> {
        self.run_f32(a, b, dims, bias, parallel, true)
    }

    /// The kernel of [`GemmRule::gemm_f32`], picked once; `rounded`: the operands come
    /// from [`GemmRule::operands_f32`].
    fn run_f32(
        &self,
        a: Operand,
        b: Operand,
        dims: Dims,
        bias: Bias,
        parallel: bool,
        rounded: bool,
    ) -> Option<Vec<f32>> {
        Some(match self.f32_kernel(dims.1 + bias_terms(&bias))? {
            F32Kernel::QuireI16(p) => quire_i16::gemm_f32(p, a, b, dims, bias, parallel)?,
            F32Kernel::QuireChecked(p) => gemm_checked::gemm_f32(p, a, b, dims, bias, parallel).0,
            F32Kernel::Lns(arith) => lns_gemm_f32(arith, a, b, dims, bias, parallel),
            F32Kernel::NaiveP8 => naive_p8::gemm_f32(a, b, dims, bias, parallel),
            F32Kernel::Registers(kernel) => {
                // Operands from `operands_f32` are values of `F` where those are f32s.
                let round = !(rounded && values_are_f32(&self.format()));
                kernel.gemm_f32(a, b, dims, bias, parallel, round)?
            }
        })
    }

    /// Whether a GEMM of `terms` terms per output (the bias included) runs best from f32
    /// operands rounded once by [`GemmRule::operands_f32`], through
    /// [`GemmRule::gemm_f32_rounded`]: where the register kernel runs, which copies them
    /// as they are. The other kernels convert f32 operands as they round them, so layers
    /// whose operand matrices repeat values (a convolution's column matrices repeat each
    /// input up to KH·KW times) hand them f64 operands rounded once instead.
    pub fn takes_rounded_f32(&self, terms: usize) -> bool {
        matches!(self.f32_kernel(terms), Some(F32Kernel::Registers(_)))
            && values_are_f32(&self.format())
    }

    /// The kernel [`GemmRule::gemm_f32`] runs for `terms` terms per output, if any.
    fn f32_kernel(&self, terms: usize) -> Option<F32Kernel<'_>> {
        Some(match self {
            GemmRule::Quire(p) => match accumulator_for(*p, terms) {
                Accumulator::I16 if IntOperand::get(*p).is_some() => F32Kernel::QuireI16(*p),
                Accumulator::F64Checked => F32Kernel::QuireChecked(*p),
                _ => return None,
            },
            GemmRule::Lns(arith) => F32Kernel::Lns(arith),
            // posit<8,0>: i16 lanes on AVX-512.
            GemmRule::Naive(f) if is_posit8_0(f) && p8_lanes::avx512() => F32Kernel::NaiveP8,
            // The 8-bit formats: the register kernel where it runs with specialised
            // roundings (faster than the operation tables and than posit<8,0>'s lanes summed
            // one at a time), else those.
            GemmRule::Naive(f) if OpTables::get(f).is_some() || is_posit8_0(f) => {
                match NaiveF32::new(f).filter(NaiveF32::specialised) {
                    Some(kernel) => F32Kernel::Registers(Box::new(kernel)),
                    None if is_posit8_0(f) => F32Kernel::NaiveP8,
                    None => return None,
                }
            }
            GemmRule::Naive(f) => F32Kernel::Registers(Box::new(NaiveF32::new(f)?)),
            GemmRule::NaiveSum { op, acc } => {
                F32Kernel::Registers(Box::new(NaiveF32::with_accumulator(op, acc, false)?))
            }
            GemmRule::Fma { op, acc } => {
                F32Kernel::Registers(Box::new(NaiveF32::with_accumulator(op, acc, true)?))
            }
        })
        .filter(|k| !matches!(k, F32Kernel::Registers(r) if !r.runs_f32()))
    }

    /// `A (m x k) · B (k x n)` (no bias) under this rule from f32 operands not yet rounded,
    /// as f64 outputs: [`GemmRule::gemm_f32`] where it applies, else the operands rounded
    /// ([`GemmRule::operands`], row-major) and [`GemmRule::gemm`], in parallel.
    pub fn gemm_any(&self, a: Operand, b: Operand, dims: Dims) -> Vec<f64> {
        let (m, k, n) = dims;
        if let Some(v) = self.gemm_f32(a, b, dims, Bias::None, true) {
            return v.into_iter().map(f64::from).collect();
        }
        let av = self.operands(&a.row_major(m, k));
        let bv = self.operands(&b.row_major(k, n));
        let mut out = vec![0.0; m * n];
        self.gemm(&av, &bv, dims, Bias::None, &mut out, true);
        out
    }

    /// `out (m x n) = A (m x k) · B (k x n) [+ bias]` under this rule; `a`, `b` and the
    /// bias row-major and already rounded to `F`. `parallel` spreads rows over the rayon
    /// pool (leave it off inside an outer parallel loop).
    pub fn gemm(
        &self,
        a: &[f64],
        b: &[f64],
        dims: Dims,
        bias: Bias,
        out: &mut [f64],
        parallel: bool,
    ) {
        match self {
            GemmRule::Quire(p) => quire_gemm(*p, a, b, dims, bias, out, parallel),
            GemmRule::Naive(f) => naive_gemm(f, a, b, dims, bias, out, parallel),
            GemmRule::NaiveSum { op, acc } => {
                naive_sum_gemm(op, acc, a, b, dims, bias, out, parallel)
            }
            GemmRule::Fma { op, acc } => fma_gemm(op, acc, a, b, dims, bias, out, parallel),
            GemmRule::Lns(arith) => lns_gemm(arith, a, b, dims, bias, out, parallel),
        }
    }
}

impl GemmRule {
    /// [`GemmRule::gemm`] with `B` given as its transpose `bt` (`n x k`, row-major): read in
    /// place by the checked f64 quire ([`super::gemm_checked`]), transposed first for the
    /// other kernels.
    pub fn gemm_bt(
        &self,
        a: &[f64],
        bt: &[f64],
        dims: Dims,
        bias: Bias,
        out: &mut [f64],
        parallel: bool,
    ) {
        let (_, k, n) = dims;
        if let GemmRule::Quire(p) = self {
            if accumulator_for(*p, k + bias_terms(&bias)) == Accumulator::F64Checked {
                let (a, b) = (
                    gemm_checked::F64Operand::rows(a),
                    gemm_checked::F64Operand {
                        data: bt,
                        transposed: true,
                    },
                );
                gemm_checked::gemm_f64_layout(*p, a, b, dims, bias, out, parallel);
                return;
            }
        }
        let b = super::layer_io::transpose(bt, n, k);
        self.gemm(a, &b, dims, bias, out, parallel);
    }
}

/// The kernel of [`GemmRule::gemm_f32`].
enum F32Kernel<'a> {
    /// The i16 quire of posit<8,0> ([`super::quire_i16`]).
    QuireI16(Posit),
    /// The checked f64 quire ([`super::gemm_checked`]).
    QuireChecked(Posit),
    /// LNS arithmetic ([`super::gemm_lns`]).
    Lns(&'a LnsArith),
    /// Naive posit<8,0> in i16 lanes ([`super::naive_p8`]).
    NaiveP8,
    /// The register kernel ([`NaiveF32`]).
    Registers(Box<NaiveF32>),
}

/// The number of bias terms (0 or 1).
fn bias_terms(bias: &Bias) -> usize {
    usize::from(!matches!(bias, Bias::None))
}

/// Whether every value of `format` is an f32: posits, floats and fixed point of at most 24
/// bits whose range lies inside f32's (LNS values are irrational, block formats round blocks).
fn values_are_f32(format: &Format) -> bool {
    let elementwise = matches!(
        format,
        Format::Posit(_) | Format::Float(_) | Format::Fixed(_)
    );
    let (max, min) = (format.max_finite(), format.min_positive());
    elementwise
        && format.bits() <= 24
        && max.is_some_and(|m| m <= f64::from(f32::MAX))
        && min.is_some_and(|m| m >= 2f64.powi(-149))
}

/// The LNS arithmetic of `(lns, gauss)`, built once per process (its tables take a while).
fn lns_arith(lns: crate::format::lns::Lns, gauss: GaussLog) -> Result<LnsArith, String> {
    type Cache = Mutex<HashMap<(u32, u32, GaussLog), LnsArith>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (lns.w(), lns.f(), gauss);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(a) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(a);
    }
    let arith = LnsArith::new(lns, gauss).map_err(|e| e.to_string())?;
    if let Ok(mut c) = cache.lock() {
        c.insert(key, arith.clone());
    }
    Ok(arith)
}

/// The rules of a layer's three GEMMs: forward (in the activation format), input gradient
/// (error format) and weight and bias gradients (gradient format).
#[derive(Debug, Clone)]
pub struct LayerArith {
    /// The setting they come from.
    pub setting: Accumulate,
    /// `Y = X·Wᵀ + b`, in the activation format.
    pub forward: GemmRule,
    /// `dX = dY·W`, in the error format.
    pub input_grad: GemmRule,
    /// `dW = dYᵀ·X` and `db = Σ dY`, in the gradient format.
    pub weight_grad: GemmRule,
}

/// The rule of `setting` for the GEMM `gemm` computed in the format of `category` (`f`); an
/// error naming the category when it has no format or the format cannot take the setting.
/// `setting` is not `f32`.
pub(crate) fn category_rule(
    setting: &Accumulate,
    f: Option<Format>,
    category: &str,
    gemm: &str,
) -> Result<GemmRule, String> {
    let f = f.ok_or_else(|| {
        format!(
            "accumulate = \"{setting}\" needs a{} {category} format: the {gemm} is computed in it (set {category}, or use accumulate = \"f32\")",
            if category == "error" || category == "activation" { "n" } else { "" }
        )
    })?;
    GemmRule::new(setting, &f)
        .map_err(|e| format!("accumulate = \"{setting}\" in the {category} format ({gemm}): {e}"))?
        .ok_or_else(|| "f32 has no rule".to_string())
}

impl LayerArith {
    /// The rules of `setting` for a layer whose activation, error and gradient formats are
    /// given; `None` for `f32`; an error naming the category at fault.
    pub fn new(
        setting: &Accumulate,
        activation: Option<Format>,
        error: Option<Format>,
        gradient: Option<Format>,
    ) -> Result<Option<LayerArith>, String> {
        if setting.is_f32() {
            return Ok(None);
        }
        let rule = |f, category, gemm| category_rule(setting, f, category, gemm);
        Ok(Some(LayerArith {
            setting: *setting,
            forward: rule(activation, "activation", "forward GEMM")?,
            input_grad: rule(error, "error", "input-gradient GEMM")?,
            weight_grad: rule(gradient, "gradient", "weight-gradient GEMM")?,
        }))
    }
}
