//! [`LpOptimizer`]: what every low-precision optimizer of this module does, behind one
//! trait, so that a program can pick the update rule at run time (`Box<dyn LpOptimizer>`).
//!
//! candle's own [`candle_nn::Optimizer`] (also implemented by each optimizer here, in full
//! precision) cannot be a trait object, since its constructor returns `Self`, and has no
//! notion of exported state; this trait has no constructor and carries the state.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

/// A low-precision optimizer: steps, learning rate, its parameters and its state as named
/// tensors (see the [module docs](super) for the rules and the state's entry names).
///
/// Implemented by [`super::LpSgd`], [`super::LpAdam`], [`super::LpAdamW`] and
/// [`super::OptimLp`], each required method by the type's inherent method of the same name
/// (`step` and `backward_step` are provided, the same as the inherent ones): code that
/// holds a concrete optimizer calls those without importing this trait, and without clashing
/// with [`candle_nn::Optimizer`]'s `step` where both traits are in scope. Object safe: a
/// `Box<dyn LpOptimizer>` holds any of them.
pub trait LpOptimizer {
    /// One step over every var that has a gradient in `grads`; the others are left alone.
    /// [`LpOptimizer::scaled_step`] with scale 1 and no check.
    fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.scaled_step(grads, 1.0, false).map(|_| ())
    }

    /// One step on `grads`, the gradients of a loss multiplied by `scale` (loss scaling, see
    /// [`super::loss_scale`]): each gradient is rounded with the parameter's `gradient`
    /// quantization as it is (scaled), then multiplied by `1/scale` before the update rule
    /// reads it. With `skip_non_finite`, when any of those gradients holds an Inf or NaN no
    /// parameter is updated (weights, state and step counts stay as they are) and the result
    /// is false; otherwise it is true. `scale` 1 without the check is [`LpOptimizer::step`].
    fn scaled_step(&mut self, grads: &GradStore, scale: f32, skip_non_finite: bool)
        -> Result<bool>;

    /// Computes the gradients of `loss` and takes a step.
    fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        self.step(&loss.backward()?)
    }

    /// The learning rate.
    fn learning_rate(&self) -> f64;

    /// Sets the learning rate (for schedules).
    fn set_learning_rate(&mut self, lr: f64);

    /// The parameters' vars, in constructor order.
    fn vars(&self) -> Vec<Var>;

    /// The state as named tensors (per parameter `i`: `{i}.step`, the update rule's state
    /// entries once created, `{i}.accumulator`, `{i}.calls.*`), ready for a `.safetensors`
    /// file.
    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>>;

    /// Loads state written by [`LpOptimizer::state_tensors`] of an optimizer of the same kind
    /// over the same parameters; entries not given keep their current value. Unknown names
    /// and mismatched shapes are errors.
    fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()>;
}
