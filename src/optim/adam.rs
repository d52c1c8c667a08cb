//! Adam (L2 weight decay) and AdamW (decoupled weight decay) with bias correction.

use candle_core::backprop::GradStore;
use candle_core::{bail, Result, Tensor, Var};

use super::{export, import, step_gradients, LpOptimizer, ParamQuant, Slot};

/// Hyper-parameters of [`LpAdam`], with the defaults of PyTorch's `torch.optim.Adam`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamParams {
    /// Learning rate `η` (default 1e-3).
    pub lr: f64,
    /// Decay `β₁` of the first moment (default 0.9).
    pub beta1: f64,
    /// Decay `β₂` of the second moment (default 0.999).
    pub beta2: f64,
    /// Term `ε` added to the denominator (default 1e-8).
    pub eps: f64,
    /// L2 weight decay `λ`, added to the gradient (default 0).
    pub weight_decay: f64,
}

impl Default for AdamParams {
    fn default() -> Self {
        AdamParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Hyper-parameters of [`LpAdamW`], with the defaults of PyTorch's `torch.optim.AdamW`
/// (the same fields as [`AdamParams`]; only the default weight decay differs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    /// Learning rate `η` (default 1e-3).
    pub lr: f64,
    /// Decay `β₁` of the first moment (default 0.9).
    pub beta1: f64,
    /// Decay `β₂` of the second moment (default 0.999).
    pub beta2: f64,
    /// Term `ε` added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay `λ`: `w ← (1 − ηλ) w` each step (default 1e-2).
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        AdamWParams {
            weight_decay: 1e-2,
            ..AdamWParams::from(AdamParams::default())
        }
    }
}

impl From<AdamParams> for AdamWParams {
    fn from(p: AdamParams) -> Self {
        let AdamParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = p;
        AdamWParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        }
    }
}

impl From<AdamWParams> for AdamParams {
    fn from(p: AdamWParams) -> Self {
        let AdamWParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = p;
        AdamParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        }
    }
}

impl AdamParams {
    /// Errors on values PyTorch rejects.
    fn validate(&self, name: &str) -> Result<()> {
        let AdamParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = *self;
        if ![lr, eps, weight_decay].iter().all(|x| *x >= 0.0) {
            bail!("{name}: lr ({lr}), eps ({eps}) and weight_decay ({weight_decay}) must be >= 0")
        }
        if !(0.0..1.0).contains(&beta1) || !(0.0..1.0).contains(&beta2) {
            bail!("{name}: betas ({beta1}, {beta2}) must lie in [0, 1)")
        }
        Ok(())
    }
}

const KEYS: &[&str] = &["exp_avg", "exp_avg_sq"];

/// The shared implementation: `decoupled` selects AdamW's weight decay.
#[derive(Debug)]
struct Core {
    slots: Vec<Slot>,
    params: AdamParams,
    decoupled: bool,
}

impl Core {
    fn new(params: Vec<(Var, ParamQuant)>, config: AdamParams, decoupled: bool) -> Result<Self> {
        config.validate(if decoupled { "LpAdamW" } else { "LpAdam" })?;
        let slots = params
            .into_iter()
            .map(|(v, q)| Slot::new(v, q, true, KEYS.len()))
            .collect::<Result<_>>()?;
        Ok(Core {
            slots,
            params: config,
            decoupled,
        })
    }

    fn scaled_step(&mut self, grads: &GradStore, scale: f32, skip: bool) -> Result<bool> {
        match step_gradients(&self.slots, grads, scale, skip)? {
            Some(gradients) => self.update(gradients).map(|_| true),
            None => Ok(false),
        }
    }

    /// The update of every slot from its gradient (`None`: no gradient, skipped).
    fn update(&mut self, gradients: Vec<Option<Tensor>>) -> Result<()> {
        let AdamParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.params;
        for (slot, g) in self.slots.iter_mut().zip(gradients) {
            let Some(mut g) = g else {
                continue;
            };
            slot.step += 1;
            let t = slot.step.min(i32::MAX as u64) as i32;
            let mut w = slot.weight();
            if weight_decay != 0.0 {
                if self.decoupled {
                    w = w.affine(1.0 - lr * weight_decay, 0.0)?;
                } else {
                    g = (g + w.affine(weight_decay, 0.0)?)?;
                }
            }
            let g2 = g.sqr()?;
            let m = match &slot.state[0] {
                None => g.affine(1.0 - beta1, 0.0)?,
                Some(m) => (m.affine(beta1, 0.0)? + g.affine(1.0 - beta1, 0.0)?)?,
            };
            let v = match &slot.state[1] {
                None => g2.affine(1.0 - beta2, 0.0)?,
                Some(v) => (v.affine(beta2, 0.0)? + g2.affine(1.0 - beta2, 0.0)?)?,
            };
            let bias1 = 1.0 - beta1.powi(t);
            let bias2 = 1.0 - beta2.powi(t);
            let denom = v.sqrt()?.affine(1.0 / bias2.sqrt(), eps)?;
            let new = (w - (&m / denom)?.affine(lr / bias1, 0.0)?)?;
            slot.store_state(0, m)?;
            slot.store_state(1, v)?;
            slot.store_weight(new)?;
        }
        Ok(())
    }
}

macro_rules! adam_api {
    ($name:ident, $params:ident, $decoupled:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug)]
        pub struct $name(Core);

        impl $name {
            /// An optimizer over `params`, each var with its quantizations. Errors on a
            /// non-float var and on invalid hyper-parameters.
            pub fn new(params: Vec<(Var, ParamQuant)>, config: $params) -> Result<Self> {
                Core::new(params, config.into(), $decoupled).map($name)
            }

            /// One step over every var that has a gradient in `grads`.
            pub fn step(&mut self, grads: &GradStore) -> Result<()> {
                self.0.scaled_step(grads, 1.0, false).map(|_| ())
            }

            /// One step on the gradients of a loss multiplied by `scale`, skipped (returning
            /// false) when `skip_non_finite` and a gradient is Inf or NaN; see
            /// [`LpOptimizer::scaled_step`].
            pub fn scaled_step(
                &mut self,
                grads: &GradStore,
                scale: f32,
                skip_non_finite: bool,
            ) -> Result<bool> {
                self.0.scaled_step(grads, scale, skip_non_finite)
            }

            /// Computes the gradients of `loss` and takes a step.
            pub fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
                self.step(&loss.backward()?)
            }

            /// The learning rate.
            pub fn learning_rate(&self) -> f64 {
                self.0.params.lr
            }

            /// Sets the learning rate (for schedules).
            pub fn set_learning_rate(&mut self, lr: f64) {
                self.0.params.lr = lr
            }

            /// The hyper-parameters.
            pub fn params(&self) -> $params {
                self.0.params.into()
            }

            /// The parameters' vars, in constructor order.
            pub fn vars(&self) -> Vec<Var> {
                self.0.slots.iter().map(|s| s.var.clone()).collect()
            }

            /// The state as named tensors (per parameter `i`: `{i}.step`, `{i}.exp_avg` and
            /// `{i}.exp_avg_sq` once created, `{i}.accumulator`, `{i}.calls.*`); see the
            /// [module docs](super).
            pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
                export(&self.0.slots, KEYS)
            }

            /// Loads state written by `state_tensors` (of an optimizer over the same
            /// parameters); entries not given keep their current value.
            pub fn load_state_tensors<S: AsRef<str>>(
                &mut self,
                state: impl IntoIterator<Item = (S, Tensor)>,
            ) -> Result<()> {
                import(&mut self.0.slots, KEYS, state)
            }
        }

        impl LpOptimizer for $name {
            fn scaled_step(&mut self, grads: &GradStore, scale: f32, skip: bool) -> Result<bool> {
                $name::scaled_step(self, grads, scale, skip)
            }

            fn learning_rate(&self) -> f64 {
                $name::learning_rate(self)
            }

            fn set_learning_rate(&mut self, lr: f64) {
                $name::set_learning_rate(self, lr)
            }

            fn vars(&self) -> Vec<Var> {
                $name::vars(self)
            }

            fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
                $name::state_tensors(self)
            }

            fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()> {
                $name::load_state_tensors(self, state)
            }
        }

        impl candle_nn::Optimizer for $name {
            type Config = $params;

            /// Full precision over the float vars among `vars` (others are left out, as
            /// candle's optimizers do).
            fn new(vars: Vec<Var>, config: $params) -> Result<Self> {
                let params = vars
                    .into_iter()
                    .filter(|v| v.dtype().is_float())
                    .map(|v| (v, ParamQuant::default()))
                    .collect();
                $name::new(params, config)
            }

            fn step(&mut self, grads: &GradStore) -> Result<()> {
                $name::step(self, grads)
            }

            fn learning_rate(&self) -> f64 {
                $name::learning_rate(self)
            }

            fn set_learning_rate(&mut self, lr: f64) {
                $name::set_learning_rate(self, lr)
            }
        }
    };
}

adam_api!(
    LpAdam,
    AdamParams,
    false,
    "PyTorch's Adam (L2 weight decay added to the gradient) with per-parameter low-precision \
     gradient, moments, weight and accumulator (see the [module docs](super) for the rule and \
     where each rounding happens)."
);

adam_api!(
    LpAdamW,
    AdamWParams,
    true,
    "PyTorch's AdamW (decoupled weight decay) with per-parameter low-precision gradient, \
     moments, weight and accumulator (see the [module docs](super) for the rule and where \
     each rounding happens)."
);
