//! Learning-rate schedules: a linear warmup followed by an optional cosine or linear decay,
//! as a function of the step number only, so that a run resumed from a checkpoint continues
//! the schedule where it stopped.
//!
//! Write `η` for the base learning rate, `s` for the 0-based index of an optimizer step
//! counted over the whole run (`s = (epoch − 1) · steps_per_epoch + step_in_epoch`), `W` for
//! the warmup steps and `T` for the step at which the decay ends. The rate of step `s` is
//!
//! * warmup, `s < W`: `η · (s + 1) / W` (the first step at `η / W`, step `W − 1` at `η`);
//! * no decay: `η` for every `s ≥ W`;
//! * after the warmup, with `p = min(1, (s − W) / (T − W))` the fraction of the decay done:
//!   cosine, `η · (1 + cos(π p)) / 2`; linear, `η · (1 − p)`. Both start at `η` when the
//!   warmup ends and reach 0 at step `T`, where the rate stays (an optimizer step at rate 0
//!   leaves the weights as they are, weight decay included).
//!
//! The decay's end is a number of epochs ([`Decay::epochs`]), fixed by the run's settings
//! rather than derived from its epoch count, so that a run asked for more epochs resumes
//! with the rates of its first epochs unchanged. Without warmup and decay the schedule is
//! [constant](LrSchedule::is_constant): every step at `η`, as training was before schedules
//! existed.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The shape of a decay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayShape {
    /// Half a cosine period: `(1 + cos(π p)) / 2`.
    Cosine,
    /// A straight line: `1 − p`.
    Linear,
}

impl FromStr for DecayShape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cosine" => Ok(DecayShape::Cosine),
            "linear" => Ok(DecayShape::Linear),
            _ => Err(format!("unknown decay `{s}`; decays: cosine, linear")),
        }
    }
}

impl fmt::Display for DecayShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecayShape::Cosine => "cosine",
            DecayShape::Linear => "linear",
        })
    }
}

/// A decay of the learning rate to 0 after the warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decay {
    /// Its shape.
    pub shape: DecayShape,
    /// The epoch at whose end the rate reaches 0 (`T = epochs · steps_per_epoch`).
    pub epochs: usize,
}

/// A warmup and an optional decay (see the [module docs](self) for the formula).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Steps of linear warmup (0: none).
    #[serde(default)]
    pub warmup: usize,
    /// The decay after the warmup (none: the rate stays at the base rate).
    #[serde(default)]
    pub decay: Option<Decay>,
}

impl LrSchedule {
    /// Whether every step runs at the base rate (no warmup, no decay).
    pub fn is_constant(&self) -> bool {
        self.warmup == 0 && self.decay.is_none()
    }

    /// Checks the schedule for runs of `steps_per_epoch` steps per epoch: a decay ends after
    /// at least one epoch and after the warmup. The message names what is wrong.
    pub fn validate(&self, steps_per_epoch: usize) -> Result<(), String> {
        if let Some(d) = self.decay {
            if d.epochs == 0 {
                return Err("decay-epochs must be at least 1, got 0".into());
            }
            let end = d.epochs.saturating_mul(steps_per_epoch);
            if end <= self.warmup {
                return Err(format!(
                    "the decay ends at step {end} ({} epochs of {steps_per_epoch} steps), not \
                     after the {} warmup steps",
                    d.epochs, self.warmup
                ));
            }
        }
        Ok(())
    }

    /// The factor the base rate is multiplied by at the 0-based step `step` of the run, for
    /// `steps_per_epoch` steps per epoch: in (0, 1] during the warmup, in [0, 1] after.
    pub fn factor(&self, step: usize, steps_per_epoch: usize) -> f64 {
        if step < self.warmup {
            return (step + 1) as f64 / self.warmup as f64;
        }
        let Some(d) = self.decay else {
            return 1.0;
        };
        let end = d.epochs.saturating_mul(steps_per_epoch);
        let span = end.saturating_sub(self.warmup);
        let p = if span == 0 {
            1.0
        } else {
            ((step - self.warmup) as f64 / span as f64).min(1.0)
        };
        match d.shape {
            DecayShape::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * p).cos()),
            DecayShape::Linear => 1.0 - p,
        }
    }

    /// The learning rate of the 0-based step `step` for base rate `lr`.
    pub fn lr(&self, lr: f64, step: usize, steps_per_epoch: usize) -> f64 {
        lr * self.factor(step, steps_per_epoch)
    }
}

impl fmt::Display for LrSchedule {
    /// `constant`, or the warmup and decay: `warmup 200, cosine to 0 at epoch 20`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_constant() {
            return f.write_str("constant");
        }
        let mut parts = Vec::new();
        if self.warmup > 0 {
            parts.push(format!("warmup {} steps", self.warmup));
        }
        if let Some(d) = self.decay {
            parts.push(format!("{} decay to 0 at epoch {}", d.shape, d.epochs));
        }
        f.write_str(&parts.join(", "))
    }
}
