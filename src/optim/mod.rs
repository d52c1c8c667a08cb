//! Optimizers whose gradients, state and weights are rounded to low-precision formats.
//!
//! Each parameter comes with a [`ParamQuant`]: up to four quantizations applied during a
//! step, with the semantics of QPyTorch's `OptimLP`. Write `Q_g`, `Q_m`, `Q_w`, `Q_a` for
//! rounding with `gradient`, `momentum`, `weight` and `accumulator` (an absent one is the
//! identity), `w` for the weight the update lands in and `θ` for the model's var.
//!
//! One step of one parameter (vars without a gradient are skipped entirely):
//!
//! 1. `g = Q_g(∇θ)`: the gradient is rounded before anything else reads it. A step on the
//!    gradients of a loss multiplied by a loss scale `S` ([`LpOptimizer::scaled_step`], see
//!    [`loss_scale`]) rounds the scaled gradient and unscales it after: `g = Q_g(∇θ) · (1/S)`,
//!    and may skip the whole step (nothing updated) when any such `g` is Inf or NaN.
//! 2. The update rule (below) computes the new state and `w'` from `g`, `w` and the
//!    stored state in the working dtype, with no rounding in between.
//! 3. Every state tensor updated in this step is stored as `Q_m(state)`. As in QPyTorch the
//!    update of this step reads the unrounded new state; the next step reads the rounded one.
//! 4. Without an accumulator, `w = θ` and `θ ← Q_w(w')`. With an accumulator the optimizer
//!    keeps its own copy `a` of the weights (f32 for f16/bf16 vars, else the var's dtype;
//!    initialised to `Q_a(θ)`), `w = a`, and `a ← Q_a(w')`, `θ ← Q_w(a)`: updates smaller
//!    than the spacing of `Q_w` add up in `a` until they move `θ`.
//!
//! Update rules, at step `t` (counted per parameter, from 1), learning rate `η`, weight decay
//! `λ`:
//!
//! * [`LpSgd`] (PyTorch's `torch.optim.SGD`, momentum `μ`, dampening `τ`):
//!   `g ← g + λ w`; `b ← g` at the first step, else `b ← μ b + (1 − τ) g`;
//!   `d = g + μ b` (Nesterov) or `d = b`; `w' = w − η d` (without momentum `d = g`).
//! * [`LpAdam`] (`torch.optim.Adam`, L2 decay): `g ← g + λ w`; `m ← β₁ m + (1 − β₁) g`;
//!   `v ← β₂ v + (1 − β₂) g²` (`m = v = 0` before the first step);
//!   `w' = w − η/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)`.
//! * [`LpAdamW`] (`torch.optim.AdamW`, decoupled decay): as Adam without `λ w` in the
//!   gradient, and `w ← (1 − ηλ) w` before the moment update is subtracted.
//!
//! [`OptimLp`] wraps any [`candle_nn::Optimizer`] with the same steps 1 and 4; the inner
//! optimizer's own state is out of its reach, so `Q_m` is not applied there (use [`LpSgd`],
//! [`LpAdam`] or [`LpAdamW`] to round optimizer state).
//!
//! All four implement [`LpOptimizer`], so a program that picks the update rule at run time
//! holds a `Box<dyn LpOptimizer>`; each is also a [`candle_nn::Optimizer`]. Every optimizer
//! exports its state as named tensors (`state_tensors`, ready for a `.safetensors` file:
//! `qcandle::io::write_tensors` with the `cli` feature, or candle's `safetensors::save`) and
//! loads it back (`load_state_tensors`): entry names are
//! `"{i}.{key}"` with `i` the parameter's index in the constructor's list and `key` one of
//! `step` (an i64 scalar), `momentum_buffer`, `exp_avg`, `exp_avg_sq`, `accumulator`, and
//! `calls.{gradient,momentum,weight,accumulator}` (the call counters of stochastic
//! quantizations, so that a resumed run draws the same random bits).

mod adam;
pub mod loss_scale;
mod lp;
mod lp_optimizer;
pub mod schedule;
mod sgd;

pub use adam::{AdamParams, AdamWParams, LpAdam, LpAdamW};
pub use loss_scale::{DynamicScale, LossScale, LossScaler};
pub use lp::OptimLp;
pub use lp_optimizer::LpOptimizer;
pub use schedule::{Decay, DecayShape, LrSchedule};
pub use sgd::{LpSgd, SgdParams};

use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Result, Tensor, Var};

use crate::ops::{quantize_, quantize_no_grad, Quant};

/// The quantizations applied to one parameter during an optimizer step (each optional).
#[derive(Debug, Clone, Default)]
pub struct ParamQuant {
    /// Rounds the gradient before the optimizer reads it.
    pub gradient: Option<Quant>,
    /// Rounds optimizer state (momentum buffer, Adam moments) each time it is updated.
    pub momentum: Option<Quant>,
    /// Rounds the weight written to the model's var.
    pub weight: Option<Quant>,
    /// When set, the optimizer keeps a separate weight copy rounded with this quantization,
    /// and the var receives that copy rounded with `weight`.
    pub accumulator: Option<Quant>,
}

impl ParamQuant {
    /// No quantization at all: the optimizer behaves as its full-precision counterpart.
    pub fn none() -> Self {
        Self::default()
    }

    fn named(&self) -> [(&'static str, Option<&Quant>); 4] {
        [
            ("gradient", self.gradient.as_ref()),
            ("momentum", self.momentum.as_ref()),
            ("weight", self.weight.as_ref()),
            ("accumulator", self.accumulator.as_ref()),
        ]
    }
}

/// One parameter of an optimizer: its var, quantizations, accumulator and state.
///
/// Tensors held here are replaced, never written in place after they are stored, so the
/// clones handed out by [`Slot::export`] stay valid.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) var: Var,
    pub(crate) quant: ParamQuant,
    /// The accumulator copy of the weights (present iff `quant.accumulator` is).
    acc: Option<Tensor>,
    /// Steps this parameter took (steps with a gradient).
    pub(crate) step: u64,
    /// Optimizer state tensors, named by the optimizer's state keys.
    pub(crate) state: Vec<Option<Tensor>>,
}

impl Slot {
    /// A parameter with `n_state` empty state tensors. `widen` keeps the accumulator of a
    /// half-precision var in f32 (the inner optimizer of [`OptimLp`] needs the var's dtype).
    pub(crate) fn new(var: Var, quant: ParamQuant, widen: bool, n_state: usize) -> Result<Self> {
        if !var.dtype().is_float() {
            bail!(
                "optimizer: parameter of dtype {:?} is not a float tensor",
                var.dtype()
            )
        }
        let acc = match &quant.accumulator {
            Some(q) => {
                let dtype = if widen {
                    work_dtype(var.dtype())
                } else {
                    var.dtype()
                };
                let a = var.as_detached_tensor().to_dtype(dtype)?.copy()?;
                quantize_(&a, q)?;
                Some(a)
            }
            None => None,
        };
        Ok(Slot {
            var,
            quant,
            acc,
            step: 0,
            state: vec![None; n_state],
        })
    }

    /// The dtype the update is computed in.
    pub(crate) fn dtype(&self) -> DType {
        self.acc.as_ref().map_or(self.var.dtype(), Tensor::dtype)
    }

    /// The parameter's gradient rounded with `gradient`, in the working dtype, then
    /// multiplied by `1/scale` when `scale` is not 1 (the gradients of a scaled loss; see
    /// [`loss_scale`]); `None` when the store holds no gradient for the var.
    pub(crate) fn gradient(&self, grads: &GradStore, scale: f32) -> Result<Option<Tensor>> {
        let Some(g) = grads.get(self.var.as_tensor()) else {
            return Ok(None);
        };
        let g = match &self.quant.gradient {
            Some(q) => quantize_no_grad(g, q)?,
            None => g.detach(),
        };
        unscale(&g.to_dtype(self.dtype())?, scale).map(Some)
    }

    /// The weight the update lands in: the accumulator, or the var (detached).
    pub(crate) fn weight(&self) -> Tensor {
        match &self.acc {
            Some(a) => a.clone(),
            None => self.var.as_detached_tensor(),
        }
    }

    /// Stores the updated weight `new` (a freshly computed tensor, rounded here in place).
    pub(crate) fn store_weight(&mut self, new: Tensor) -> Result<()> {
        match &self.quant.accumulator {
            Some(qa) => {
                quantize_(&new, qa)?;
                let w = match &self.quant.weight {
                    Some(qw) => quantize_no_grad(&new, qw)?,
                    None => new.clone(),
                };
                self.var.set(&w.to_dtype(self.var.dtype())?)?;
                self.acc = Some(new);
            }
            None => {
                if let Some(qw) = &self.quant.weight {
                    quantize_(&new, qw)?;
                }
                self.var.set(&new)?;
            }
        }
        Ok(())
    }

    /// Stores state tensor `k` (a freshly computed tensor), rounded in place with `momentum`.
    pub(crate) fn store_state(&mut self, k: usize, t: Tensor) -> Result<()> {
        if let Some(q) = &self.quant.momentum {
            quantize_(&t, q)?;
        }
        self.state[k] = Some(t);
        Ok(())
    }

    /// The weights after a step of an inner optimizer that updated the var in place:
    /// `a ← Q_a(θ)`, `θ ← Q_w(a)`, or `θ ← Q_w(θ)` without an accumulator.
    pub(crate) fn round_var(&mut self) -> Result<()> {
        if self.acc.is_some() {
            let new = self.var.as_detached_tensor().copy()?;
            return self.store_weight(new);
        }
        if let Some(qw) = &self.quant.weight {
            quantize_(self.var.as_tensor(), qw)?;
        }
        Ok(())
    }

    /// Loads the accumulator into the var (before an inner optimizer's step).
    pub(crate) fn load_accumulator_into_var(&self) -> Result<()> {
        if let Some(a) = &self.acc {
            self.var.set(a)?;
        }
        Ok(())
    }
}

/// `g · (1/scale)`, `1/scale` computed in f64 and rounded to `g`'s dtype (GradScaler's
/// `unscale_`); `g` itself when `scale` is 1.
pub(crate) fn unscale(g: &Tensor, scale: f32) -> Result<Tensor> {
    if scale == 1.0 {
        return Ok(g.clone());
    }
    let inv = Tensor::new(1.0 / f64::from(scale), g.device())?.to_dtype(g.dtype())?;
    g.broadcast_mul(&inv)
}

/// The gradients the update rule reads, one per slot (see [`Slot::gradient`]), or `None`
/// when `skip_non_finite` and any of them holds an Inf or NaN.
pub(crate) fn step_gradients(
    slots: &[Slot],
    grads: &GradStore,
    scale: f32,
    skip_non_finite: bool,
) -> Result<Option<Vec<Option<Tensor>>>> {
    let gradients: Vec<Option<Tensor>> = slots
        .iter()
        .map(|s| s.gradient(grads, scale))
        .collect::<Result<_>>()?;
    if skip_non_finite && !all_finite(gradients.iter().flatten())? {
        return Ok(None);
    }
    Ok(Some(gradients))
}

/// Whether every element of `tensors` is finite, with one scalar read back: `Σ (x − x)` is 0
/// when every `x` is finite and NaN otherwise (`Inf − Inf` and `NaN − NaN` are NaN), and
/// cannot overflow whatever the magnitudes.
pub(crate) fn all_finite<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Result<bool> {
    let mut total: Option<Tensor> = None;
    for t in tensors {
        let d = t.sub(t)?.sum_all()?.to_dtype(DType::F32)?;
        total = Some(match total {
            None => d,
            Some(s) => (s + d)?,
        });
    }
    match total {
        None => Ok(true),
        Some(t) => Ok(t.to_scalar::<f32>()? == 0.0),
    }
}

/// f32 for half-precision dtypes, else the dtype itself.
fn work_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// The named state tensors of `slots`, with `keys` naming each slot's state entries.
pub(crate) fn export(slots: &[Slot], keys: &[&str]) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    let device = candle_core::Device::Cpu;
    for (i, s) in slots.iter().enumerate() {
        out.push((format!("{i}.step"), Tensor::new(s.step as i64, &device)?));
        for (key, t) in keys.iter().zip(&s.state) {
            if let Some(t) = t {
                out.push((format!("{i}.{key}"), t.clone()));
            }
        }
        if let Some(a) = &s.acc {
            out.push((format!("{i}.accumulator"), a.clone()));
        }
        for (kind, q) in s.quant.named() {
            if let Some(q) = q.filter(|q| q.rounding().is_stochastic()) {
                out.push((
                    format!("{i}.calls.{kind}"),
                    Tensor::new(q.calls() as i64, &device)?,
                ));
            }
        }
    }
    Ok(out)
}

/// Loads entries written by [`export`] into `slots`; entries not given are left as they
/// are. Unknown names and mismatched shapes are errors.
pub(crate) fn import<S: AsRef<str>>(
    slots: &mut [Slot],
    keys: &[&str],
    state: impl IntoIterator<Item = (S, Tensor)>,
) -> Result<()> {
    for (name, t) in state {
        let name = name.as_ref();
        let parsed = name
            .split_once('.')
            .and_then(|(i, key)| Some((i.parse::<usize>().ok()?, key)));
        let Some((i, key)) = parsed else {
            bail!("optimizer state: entry name {name:?} is not \"<index>.<key>\"")
        };
        let Some(slot) = slots.get_mut(i) else {
            bail!(
                "optimizer state: entry {name:?} names parameter {i}, the optimizer has {}",
                slots.len()
            )
        };
        if key == "step" {
            slot.step = scalar_u64(&t, name)?;
        } else if let Some(kind) = key.strip_prefix("calls.") {
            let Some((_, q)) = slot.quant.named().into_iter().find(|(k, _)| *k == kind) else {
                bail!("optimizer state: unknown entry {name:?}")
            };
            let Some(q) = q else {
                bail!("optimizer state: entry {name:?} for a quantization this parameter lacks")
            };
            q.set_calls(scalar_u64(&t, name)?);
        } else {
            let is_acc = key == "accumulator";
            let k = keys.iter().position(|k| *k == key);
            if !is_acc && k.is_none() {
                bail!("optimizer state: unknown entry {name:?}")
            }
            if is_acc && slot.acc.is_none() {
                bail!("optimizer state: entry {name:?} for a parameter without accumulator")
            }
            if t.shape() != slot.var.shape() {
                bail!(
                    "optimizer state: entry {name:?} has shape {:?}, the parameter {:?}",
                    t.shape(),
                    slot.var.shape()
                )
            }
            let t = t
                .to_device(slot.var.device())?
                .to_dtype(slot.dtype())?
                .copy()?;
            match k {
                Some(k) => slot.state[k] = Some(t),
                None => slot.acc = Some(t),
            }
        }
    }
    Ok(())
}

fn scalar_u64(t: &Tensor, name: &str) -> Result<u64> {
    let v = t.to_dtype(DType::I64)?.to_scalar::<i64>()?;
    if v < 0 {
        bail!("optimizer state: entry {name:?} must be non-negative, got {v}")
    }
    Ok(v as u64)
}
