//! `OptimLp`: low-precision gradients, weights and accumulators around any candle optimizer.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use candle_nn::Optimizer;

use super::{all_finite, export, import, unscale, LpOptimizer, ParamQuant, Slot};

/// Wraps an optimizer `O`: its gradients are rounded before it reads them, and the weights
/// it writes are rounded after (through an accumulator where one is set); see the
/// [module docs](super).
///
/// The `momentum` quantization of a [`ParamQuant`] is ignored: the inner optimizer's own
/// state (momentum buffers, moments) is private to it and stays in its precision. Use
/// [`super::LpSgd`], [`super::LpAdam`] or [`super::LpAdamW`] to round optimizer state. The
/// accumulator has the var's dtype, since the inner optimizer updates it through the var.
#[derive(Debug)]
pub struct OptimLp<O> {
    inner: O,
    slots: Vec<Slot>,
}

impl<O: Optimizer> OptimLp<O> {
    /// Wraps `inner`, rounding each var of `params` with its quantizations (the vars are
    /// normally the ones `inner` optimizes; vars of `inner` not listed are not rounded).
    /// Errors on a non-float var.
    pub fn new(inner: O, params: Vec<(Var, ParamQuant)>) -> Result<Self> {
        let slots = params
            .into_iter()
            .map(|(v, q)| Slot::new(v, q, false, 0))
            .collect::<Result<_>>()?;
        Ok(OptimLp { inner, slots })
    }

    /// One step: gradients rounded, accumulators loaded into their vars, the inner step,
    /// then the weights rounded. Vars without a gradient in `grads` are left alone.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.scaled_step(grads, 1.0, false).map(|_| ())
    }

    /// [`OptimLp::step`] on the gradients of a loss multiplied by `scale`: every gradient the
    /// inner optimizer reads is unscaled (multiplied by `1/scale`), a listed var's after its
    /// `gradient` rounding; skipped (returning false) when `skip_non_finite` and any of them
    /// is Inf or NaN. See [`LpOptimizer::scaled_step`].
    pub fn scaled_step(
        &mut self,
        grads: &GradStore,
        scale: f32,
        skip_non_finite: bool,
    ) -> Result<bool> {
        let mut rounded = GradStore::default();
        for id in grads.get_ids() {
            if let Some(g) = grads.get_id(*id) {
                rounded.insert_id(*id, unscale(g, scale)?);
            }
        }
        let mut stepped = Vec::with_capacity(self.slots.len());
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.quant.gradient.is_some() {
                let Some(g) = slot.gradient(grads, scale)? else {
                    continue;
                };
                rounded.insert(slot.var.as_tensor(), g);
            } else if grads.get(slot.var.as_tensor()).is_none() {
                continue;
            }
            stepped.push(i);
        }
        if skip_non_finite {
            let ids: Vec<_> = rounded.get_ids().copied().collect();
            if !all_finite(ids.iter().filter_map(|id| rounded.get_id(*id)))? {
                return Ok(false);
            }
        }
        for &i in &stepped {
            self.slots[i].load_accumulator_into_var()?;
        }
        self.inner.step(&rounded)?;
        for i in stepped {
            let slot = &mut self.slots[i];
            slot.step += 1;
            slot.round_var()?;
        }
        Ok(true)
    }

    /// Computes the gradients of `loss` and takes a step.
    pub fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        self.step(&loss.backward()?)
    }

    /// The inner optimizer's learning rate.
    pub fn learning_rate(&self) -> f64 {
        self.inner.learning_rate()
    }

    /// Sets the inner optimizer's learning rate.
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.inner.set_learning_rate(lr)
    }

    /// The vars given to [`OptimLp::new`], in that order (the ones the wrapper rounds).
    pub fn vars(&self) -> Vec<Var> {
        self.slots.iter().map(|s| s.var.clone()).collect()
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// The wrapped optimizer, mutably (to change its hyper-parameters).
    pub fn inner_mut(&mut self) -> &mut O {
        &mut self.inner
    }

    /// The wrapper's own state as named tensors (per parameter `i`: `{i}.step`,
    /// `{i}.accumulator`, `{i}.calls.*`); the inner optimizer's state is not included.
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        export(&self.slots, &[])
    }

    /// Loads state written by [`OptimLp::state_tensors`]; entries not given keep their
    /// current value.
    pub fn load_state_tensors<S: AsRef<str>>(
        &mut self,
        state: impl IntoIterator<Item = (S, Tensor)>,
    ) -> Result<()> {
        import(&mut self.slots, &[], state)
    }
}

impl<O: Optimizer> Optimizer for OptimLp<O> {
    type Config = O::Config;

    /// `O` over `vars` with no quantization.
    fn new(vars: Vec<Var>, config: O::Config) -> Result<Self> {
        let params = vars
            .iter()
            .filter(|v| v.dtype().is_float())
            .map(|v| (v.clone(), ParamQuant::default()))
            .collect();
        OptimLp::new(O::new(vars, config)?, params)
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        OptimLp::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        OptimLp::learning_rate(self)
    }

    fn set_learning_rate(&mut self, lr: f64) {
        OptimLp::set_learning_rate(self, lr)
    }
}

impl<O: Optimizer> LpOptimizer for OptimLp<O> {
    fn scaled_step(&mut self, grads: &GradStore, scale: f32, skip: bool) -> Result<bool> {
        Self::scaled_step(self, grads, scale, skip)
    }

    fn learning_rate(&self) -> f64 {
        Self::learning_rate(self)
    }

    fn set_learning_rate(&mut self, lr: f64) {
        Self::set_learning_rate(self, lr)
    }

    fn vars(&self) -> Vec<Var> {
        Self::vars(self)
    }

    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        Self::state_tensors(self)
    }

    fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()> {
        Self::load_state_tensors(self, state)
    }
}
