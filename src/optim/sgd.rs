//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

use candle_core::backprop::GradStore;
use candle_core::{bail, Result, Tensor, Var};

use super::{export, import, step_gradients, LpOptimizer, ParamQuant, Slot};

/// Hyper-parameters of [`LpSgd`], with PyTorch's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdParams {
    /// Learning rate `η` (default 1e-3).
    pub lr: f64,
    /// Momentum factor `μ` (default 0: no momentum buffer).
    pub momentum: f64,
    /// Dampening `τ` of the gradient in the momentum update (default 0).
    pub dampening: f64,
    /// L2 weight decay `λ`, added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false; needs momentum > 0 and dampening 0).
    pub nesterov: bool,
}

impl Default for SgdParams {
    fn default() -> Self {
        SgdParams {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl SgdParams {
    /// Errors on values PyTorch rejects.
    fn validate(&self) -> Result<()> {
        let Self {
            lr,
            momentum,
            weight_decay,
            ..
        } = *self;
        if ![lr, momentum, weight_decay].iter().all(|x| *x >= 0.0) {
            bail!("LpSgd: lr ({lr}), momentum ({momentum}) and weight_decay ({weight_decay}) must be >= 0")
        }
        if self.nesterov && (momentum <= 0.0 || self.dampening != 0.0) {
            bail!("LpSgd: Nesterov momentum requires a momentum > 0 and zero dampening")
        }
        Ok(())
    }
}

/// PyTorch's SGD with per-parameter low-precision gradient, momentum buffer, weight and
/// accumulator (see the [module docs](super) for the rule and where each rounding happens).
#[derive(Debug)]
pub struct LpSgd {
    slots: Vec<Slot>,
    params: SgdParams,
}

const KEYS: &[&str] = &["momentum_buffer"];

impl LpSgd {
    /// An optimizer over `params`, each var with its quantizations. Errors on a non-float
    /// var and on invalid hyper-parameters.
    pub fn new(params: Vec<(Var, ParamQuant)>, config: SgdParams) -> Result<Self> {
        config.validate()?;
        let slots = params
            .into_iter()
            .map(|(v, q)| Slot::new(v, q, true, KEYS.len()))
            .collect::<Result<_>>()?;
        Ok(LpSgd {
            slots,
            params: config,
        })
    }

    /// One step over every var that has a gradient in `grads`.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.scaled_step(grads, 1.0, false).map(|_| ())
    }

    /// One step on the gradients of a loss multiplied by `scale`, skipped (returning false)
    /// when `skip_non_finite` and a gradient is Inf or NaN; see [`LpOptimizer::scaled_step`].
    pub fn scaled_step(
        &mut self,
        grads: &GradStore,
        scale: f32,
        skip_non_finite: bool,
    ) -> Result<bool> {
        match step_gradients(&self.slots, grads, scale, skip_non_finite)? {
            Some(gradients) => self.update(gradients).map(|_| true),
            None => Ok(false),
        }
    }

    /// The update of every slot from its gradient (`None`: no gradient, skipped).
    fn update(&mut self, gradients: Vec<Option<Tensor>>) -> Result<()> {
        let SgdParams {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        } = self.params;
        for (slot, g) in self.slots.iter_mut().zip(gradients) {
            let Some(mut g) = g else {
                continue;
            };
            slot.step += 1;
            let w = slot.weight();
            if weight_decay != 0.0 {
                g = (g + w.affine(weight_decay, 0.0)?)?;
            }
            let mut buf = None;
            if momentum != 0.0 {
                let b = match &slot.state[0] {
                    // A copy: the buffer is rounded in place and `g` may be the caller's.
                    None => g.copy()?,
                    Some(b) => (b.affine(momentum, 0.0)? + g.affine(1.0 - dampening, 0.0)?)?,
                };
                g = if nesterov {
                    (g + b.affine(momentum, 0.0)?)?
                } else {
                    b.clone()
                };
                buf = Some(b);
            }
            let new = (w - g.affine(lr, 0.0)?)?;
            if let Some(b) = buf {
                slot.store_state(0, b)?;
            }
            slot.store_weight(new)?;
        }
        Ok(())
    }

    /// Computes the gradients of `loss` and takes a step.
    pub fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        self.step(&loss.backward()?)
    }

    /// The learning rate.
    pub fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    /// Sets the learning rate (for schedules).
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr
    }

    /// The hyper-parameters.
    pub fn params(&self) -> &SgdParams {
        &self.params
    }

    /// The parameters' vars, in constructor order.
    pub fn vars(&self) -> Vec<Var> {
        self.slots.iter().map(|s| s.var.clone()).collect()
    }

    /// The state as named tensors (per parameter `i`: `{i}.step`, `{i}.momentum_buffer`
    /// once created, `{i}.accumulator`, `{i}.calls.*`); see the [module docs](super).
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        export(&self.slots, KEYS)
    }

    /// Loads state written by [`LpSgd::state_tensors`] (of an optimizer over the same
    /// parameters); entries not given keep their current value.
    pub fn load_state_tensors<S: AsRef<str>>(
        &mut self,
        state: impl IntoIterator<Item = (S, Tensor)>,
    ) -> Result<()> {
        import(&mut self.slots, KEYS, state)
    }
}

impl candle_nn::Optimizer for LpSgd {
    type Config = SgdParams;

    /// Full-precision SGD over the float vars among `vars` (others are left out, as
    /// candle's optimizers do).
    fn new(vars: Vec<Var>, config: SgdParams) -> Result<Self> {
        let params = vars
            .into_iter()
            .filter(|v| v.dtype().is_float())
            .map(|v| (v, ParamQuant::default()))
            .collect();
        LpSgd::new(params, config)
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        LpSgd::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        LpSgd::learning_rate(self)
    }

    fn set_learning_rate(&mut self, lr: f64) {
        LpSgd::set_learning_rate(self, lr)
    }
}

impl LpOptimizer for LpSgd {
    fn scaled_step(&mut self, grads: &GradStore, scale: f32, skip: bool) -> Result<bool> {
        LpSgd::scaled_step(self, grads, scale, skip)
    }

    fn learning_rate(&self) -> f64 {
        LpSgd::learning_rate(self)
    }

    fn set_learning_rate(&mut self, lr: f64) {
        LpSgd::set_learning_rate(self, lr)
    }

    fn vars(&self) -> Vec<Var> {
        LpSgd::vars(self)
    }

    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        LpSgd::state_tensors(self)
    }

    fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()> {
        LpSgd::load_state_tensors(self, state)
    }
}
