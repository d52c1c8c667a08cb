//! Loss scaling: the loss is multiplied by a scale `S` before the backward pass, so that
//! small errors and weight gradients land in the range of a low-precision format, and the
//! gradients are divided by `S` again before the update rule reads them.
//!
//! A format with a smallest positive value `m` flushes every error below about `m/2` to zero
//! (e4m3: `m = 2^-9`). Differentiation is linear in the seed gradient `dL/dL`, so starting the
//! backward pass from `S` instead of 1 multiplies every error and weight gradient by `S`
//! (exactly, in binary floating point, when `S` is a power of two and nothing over- or
//! underflows): values that would flush are kept, at the price of overflow when `S` is too
//! large (Micikevicius et al., *Mixed Precision Training*, ICLR 2018; PyTorch's
//! `torch.amp.GradScaler`).
//!
//! Where the scale enters and leaves a training step ([`crate::optim`]'s `Q_g` is the
//! `gradient` rounding of the optimizer):
//!
//! 1. The forward pass and the loss `L` are not scaled (the reported loss is `L`).
//! 2. The backward pass starts from `S·L` (one f32 multiply of the loss): every `error`
//!    rounding in the layers' backward, every GEMM of the backward pass (under any
//!    `accumulate` setting) and the layers' weight-gradient roundings see the scaled values.
//! 3. The optimizer rounds each weight gradient with `Q_g` *as it is, scaled*, then multiplies
//!    it by `1/S` in the working dtype (f32): `g = Q_g(S·∇θ) · (1/S)`. The update rule, weight
//!    decay and the optimizer state see unscaled gradients.
//!
//! Why `Q_g` sees the scaled gradient: the `gradient` category models the format the
//! weight-gradient GEMM writes its result in (under `naive:`/`fma:` accumulation the GEMM
//! itself rounds to it), and in the mixed-precision recipe that result is stored in the low
//! format at the scaled magnitude and only unscaled in high precision (f32) before the update
//! (Micikevicius et al. 2018, section 3.3: "weight gradients ... unscaled ... before the
//! weight update"; GradScaler's `unscale_` acts on the gradients as the backward pass stored
//! them). Unscaling before `Q_g` would round the unscaled gradient to the low format and
//! flush exactly the small gradients the scale was meant to keep, and would round a gradient
//! twice, at two magnitudes, under the `naive:` and `fma:` settings.
//!
//! `1/S` is computed in f64 and rounded to f32, as GradScaler does; for a power-of-two `S` it
//! is exact and so is the unscaling (absent underflow). The scale itself is an f32.
//!
//! Settings ([`LossScale`]): none (the default; no multiply happens at all, so a run is the
//! same bit for bit as without loss scaling), a static scale, or dynamic scaling with
//! GradScaler's rule ([`DynamicScale`], defaults init `2^16`, growth factor 2, backoff factor
//! 0.5, growth interval 2000). After each backward pass of a dynamic run the optimizer checks
//! every unscaled gradient: if any is Inf or NaN, nothing is updated (no weight, optimizer
//! state or step count changes; the step is counted as skipped) and `S ← S·backoff`;
//! otherwise the step is taken and, after `growth_interval` consecutive steps without
//! overflow, `S ← S·growth` (kept as it is when that product is not finite in f32, as
//! GradScaler does). A scale backed off below f32's smallest normal number (`2^-126`) is an
//! error: the gradients are then non-finite at every scale. A static scale is never checked or
//! changed: an overflow reaches the weights and the run stops at its NaN loss.
//!
//! The dynamic state ([`LossScaler`]: the current scale, the steps since the last overflow or
//! growth, the skipped steps) is part of a run's checkpoint, so a resumed run continues bit for
//! bit.

use std::fmt;
use std::str::FromStr;

use candle_core::Result;

/// Returns a plain message error (no backtrace: these are errors of the user's input).
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(candle_core::Error::Msg(format!($($arg)*)))
    };
}

/// GradScaler's parameters of dynamic loss scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicScale {
    /// The scale of the first step (default `2^16`).
    pub init: f32,
    /// The factor the scale grows by after `growth_interval` steps without overflow
    /// (default 2; 1 never grows).
    pub growth_factor: f64,
    /// The factor the scale shrinks by after an overflow (default 0.5).
    pub backoff_factor: f64,
    /// Consecutive steps without overflow after which the scale grows (default 2000).
    pub growth_interval: u64,
}

impl Default for DynamicScale {
    fn default() -> Self {
        DynamicScale {
            init: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// How a training run scales its loss (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LossScale {
    /// No loss scaling.
    #[default]
    None,
    /// A fixed scale.
    Static(f32),
    /// A scale adjusted by overflow checks.
    Dynamic(DynamicScale),
}

impl LossScale {
    /// Whether this is no loss scaling.
    pub fn is_none(&self) -> bool {
        *self == LossScale::None
    }

    /// Checks the setting: a scale finite and at least f32's smallest normal number, a
    /// growth factor finite and >= 1, a backoff factor in (0, 1), a growth interval >= 1.
    /// The message names each value that is wrong.
    pub fn validate(&self) -> Result<()> {
        let scale_ok = |s: f32| s.is_finite() && s >= f32::MIN_POSITIVE;
        let mut problems = Vec::new();
        match *self {
            LossScale::None => {}
            LossScale::Static(s) => {
                if !scale_ok(s) {
                    problems.push(format!(
                        "a static scale must be a finite number >= 2^-126 (as an f32), got {s}"
                    ));
                }
            }
            LossScale::Dynamic(d) => {
                if !scale_ok(d.init) {
                    problems.push(format!(
                        "init must be a finite number >= 2^-126 (as an f32), got {}",
                        d.init
                    ));
                }
                if !(d.growth_factor.is_finite() && d.growth_factor >= 1.0) {
                    problems.push(format!(
                        "growth_factor must be a finite number >= 1, got {}",
                        d.growth_factor
                    ));
                }
                if !(d.backoff_factor > 0.0 && d.backoff_factor < 1.0) {
                    problems.push(format!(
                        "backoff_factor must lie in (0, 1), got {}",
                        d.backoff_factor
                    ));
                }
                if d.growth_interval == 0 {
                    problems.push("growth_interval must be at least 1, got 0".to_string());
                }
            }
        }
        if !problems.is_empty() {
            bail!("invalid loss_scale: {}", problems.join("; "))
        }
        Ok(())
    }
}

/// `none`, a number (a static scale), `dynamic` (GradScaler's defaults) or
/// `dynamic:init=65536,growth_factor=2,backoff_factor=0.5,growth_interval=2000` (any of the
/// four, in any order; the others at their defaults). The setting is validated.
impl FromStr for LossScale {
    type Err = candle_core::Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let setting = if s == "none" {
            LossScale::None
        } else if let Some(rest) = s.strip_prefix("dynamic") {
            let mut d = DynamicScale::default();
            let rest = match rest.strip_prefix(':') {
                Some(r) => r,
                None if rest.is_empty() => "",
                None => {
                    bail!("invalid loss_scale `{s}`: expected `dynamic` or `dynamic:key=value,...`")
                }
            };
            for item in rest.split(',').filter(|i| !i.trim().is_empty()) {
                let Some((key, value)) = item.split_once('=') else {
                    bail!("invalid loss_scale `{s}`: `{item}` is not key=value")
                };
                d.set(key.trim(), value.trim())?;
            }
            LossScale::Dynamic(d)
        } else {
            match s.parse::<f64>() {
                Ok(x) => LossScale::Static(x as f32),
                Err(_) => bail!(
                    "invalid loss_scale `{s}`: expected none, a number (a static scale), \
                     dynamic, or dynamic:init=...,growth_factor=...,backoff_factor=...,\
                     growth_interval=..."
                ),
            }
        };
        setting.validate()?;
        Ok(setting)
    }
}

impl DynamicScale {
    /// Sets the parameter named `key` (`init`, `growth_factor`, `backoff_factor`,
    /// `growth_interval`) from its text.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let real = || {
            value.parse::<f64>().map_err(|_| {
                candle_core::Error::Msg(format!(
                    "invalid loss_scale: {key} must be a number, got `{value}`"
                ))
            })
        };
        match key {
            "init" => self.init = real()? as f32,
            "growth_factor" => self.growth_factor = real()?,
            "backoff_factor" => self.backoff_factor = real()?,
            "growth_interval" => {
                self.growth_interval = value.parse().map_err(|_| {
                    candle_core::Error::Msg(format!(
                        "invalid loss_scale: growth_interval must be an integer >= 1, got \
                         `{value}`"
                    ))
                })?
            }
            _ => bail!(
                "invalid loss_scale: unknown parameter `{key}`; expected init, growth_factor, \
                 backoff_factor or growth_interval"
            ),
        }
        Ok(())
    }
}

/// The spelling [`LossScale::from_str`] reads back to the same setting: `none`, the static
/// scale (shortest round-trip f32 spelling) or `dynamic:` with all four parameters.
impl fmt::Display for LossScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossScale::None => f.write_str("none"),
            LossScale::Static(s) => write!(f, "{s:?}"),
            LossScale::Dynamic(d) => write!(
                f,
                "dynamic:init={:?},growth_factor={:?},backoff_factor={:?},growth_interval={}",
                d.init, d.growth_factor, d.backoff_factor, d.growth_interval
            ),
        }
    }
}

/// The state of a run's loss scaling: the current scale, and for dynamic scaling the steps
/// since the last overflow or growth and the steps skipped so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaler {
    setting: LossScale,
    scale: f32,
    good_steps: u64,
    skipped: u64,
}

impl LossScaler {
    /// The scaler of `setting` at the start of a run; `None` without loss scaling. Errors on
    /// an invalid setting.
    pub fn new(setting: LossScale) -> Result<Option<Self>> {
        setting.validate()?;
        let scale = match setting {
            LossScale::None => return Ok(None),
            LossScale::Static(s) => s,
            LossScale::Dynamic(d) => d.init,
        };
        Ok(Some(LossScaler {
            setting,
            scale,
            good_steps: 0,
            skipped: 0,
        }))
    }

    /// The scale of the next step.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Whether steps are checked for overflow (and skipped when one is found): dynamic
    /// scaling only.
    pub fn checks_overflow(&self) -> bool {
        matches!(self.setting, LossScale::Dynamic(_))
    }

    /// Steps skipped for an overflow so far in the run.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Consecutive steps taken since the last overflow or growth.
    pub fn good_steps(&self) -> u64 {
        self.good_steps
    }

    /// Updates the state after a step: `taken` is false when the step was skipped for an
    /// overflow. A static scaler never changes. An error when the backed-off scale falls
    /// below `2^-126`.
    pub fn update(&mut self, taken: bool) -> Result<()> {
        let LossScale::Dynamic(d) = self.setting else {
            return Ok(());
        };
        if !taken {
            self.skipped += 1;
            self.good_steps = 0;
            let backed = (f64::from(self.scale) * d.backoff_factor) as f32;
            if backed < f32::MIN_POSITIVE {
                bail!(
                    "dynamic loss scaling: the gradients are Inf or NaN at every scale down to \
                     {} (after {} skipped steps); the backward pass overflows whatever the scale",
                    self.scale,
                    self.skipped
                )
            }
            self.scale = backed;
            return Ok(());
        }
        self.good_steps += 1;
        if self.good_steps >= d.growth_interval {
            let grown = (f64::from(self.scale) * d.growth_factor) as f32;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.good_steps = 0;
        }
        Ok(())
    }

    /// The state to save: (scale, steps since the last overflow or growth, skipped steps).
    pub fn state(&self) -> (f32, u64, u64) {
        (self.scale, self.good_steps, self.skipped)
    }

    /// Restores a state saved by [`LossScaler::state`]; an error when it cannot be this
    /// setting's (a scale not finite and positive, a static scale other than the setting's,
    /// a count of good steps not below the growth interval).
    pub fn restore(&mut self, (scale, good_steps, skipped): (f32, u64, u64)) -> Result<()> {
        if !(scale.is_finite() && scale >= f32::MIN_POSITIVE) {
            bail!("loss scaler state: the scale must be finite and >= 2^-126, got {scale}")
        }
        match self.setting {
            LossScale::Static(s) if s != scale || good_steps != 0 || skipped != 0 => bail!(
                "loss scaler state: a static scale of {s} cannot hold scale {scale}, {good_steps} \
                 good steps and {skipped} skipped steps"
            ),
            LossScale::Dynamic(d) if good_steps >= d.growth_interval => bail!(
                "loss scaler state: {good_steps} steps since the last overflow, not below the \
                 growth interval {}",
                d.growth_interval
            ),
            _ => {}
        }
        self.scale = scale;
        self.good_steps = good_steps;
        self.skipped = skipped;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(init: f32, interval: u64) -> LossScaler {
        LossScaler::new(LossScale::Dynamic(DynamicScale {
            init,
            growth_interval: interval,
            ..DynamicScale::default()
        }))
        .unwrap()
        .unwrap()
    }

    #[test]
    fn an_overflow_halves_the_scale_and_resets_the_count() {
        let mut s = dynamic(1024.0, 3);
        s.update(true).unwrap();
        s.update(true).unwrap();
        assert_eq!(s.state(), (1024.0, 2, 0));
        s.update(false).unwrap();
        assert_eq!(s.state(), (512.0, 0, 1));
    }

    #[test]
    fn the_scale_doubles_after_the_growth_interval_and_not_before() {
        let mut s = dynamic(1024.0, 3);
        for expected in [
            (1024.0, 1, 0),
            (1024.0, 2, 0),
            (2048.0, 0, 0),
            (2048.0, 1, 0),
        ] {
            s.update(true).unwrap();
            assert_eq!(s.state(), expected);
        }
    }

    #[test]
    fn a_growth_past_f32_max_keeps_the_scale() {
        let big = 2f32.powi(127);
        let mut s = dynamic(big, 1);
        s.update(true).unwrap();
        assert_eq!(s.state(), (big, 0, 0));
    }

    #[test]
    fn backing_off_below_the_smallest_normal_is_an_error() {
        let mut s = dynamic(2f32.powi(-125), 10);
        s.update(false).unwrap();
        assert_eq!(s.scale(), 2f32.powi(-126));
        let e = s.update(false).unwrap_err().to_string();
        assert!(e.contains("every scale"), "{e}");
    }

    #[test]
    fn a_static_scaler_never_changes() {
        let mut s = LossScaler::new(LossScale::Static(8.0)).unwrap().unwrap();
        s.update(false).unwrap();
        s.update(true).unwrap();
        assert_eq!(s.state(), (8.0, 0, 0));
        assert!(!s.checks_overflow());
        assert!(LossScaler::new(LossScale::None).unwrap().is_none());
    }

    #[test]
    fn settings_read_back_from_their_spelling() {
        let cases = [
            LossScale::None,
            LossScale::Static(1024.0),
            LossScale::Static(0.1),
            LossScale::Dynamic(DynamicScale::default()),
            LossScale::Dynamic(DynamicScale {
                init: 8.0,
                growth_factor: 1.5,
                backoff_factor: 0.25,
                growth_interval: 7,
            }),
        ];
        for c in cases {
            assert_eq!(c.to_string().parse::<LossScale>().unwrap(), c, "{c}");
        }
        assert_eq!(
            "dynamic".parse::<LossScale>().unwrap(),
            LossScale::Dynamic(DynamicScale::default())
        );
        assert_eq!(
            "dynamic:growth_interval=5".parse::<LossScale>().unwrap(),
            LossScale::Dynamic(DynamicScale {
                growth_interval: 5,
                ..DynamicScale::default()
            })
        );
    }

    #[test]
    fn invalid_settings_are_errors_naming_the_value() {
        let cases = [
            ("0", "static scale"),
            ("-2", "static scale"),
            ("NaN", "static scale"),
            ("inf", "static scale"),
            ("1e39", "static scale"),
            ("1e-50", "static scale"),
            ("dynamic:init=0", "init"),
            ("dynamic:growth_factor=0.5", "growth_factor"),
            ("dynamic:growth_factor=NaN", "growth_factor"),
            ("dynamic:backoff_factor=1", "backoff_factor"),
            ("dynamic:backoff_factor=0", "backoff_factor"),
            ("dynamic:growth_interval=0", "growth_interval"),
            ("dynamic:growth_interval=-1", "growth_interval"),
            ("dynamic:speed=2", "unknown parameter"),
            ("dynamic:init", "key=value"),
            ("dynamical", "expected"),
            ("large", "expected"),
        ];
        for (text, named) in cases {
            let e = text.parse::<LossScale>().unwrap_err().to_string();
            assert!(e.contains(named), "{text}: {e}");
        }
    }

    #[test]
    fn a_restored_state_must_fit_the_setting() {
        let mut s = dynamic(1024.0, 3);
        s.restore((256.0, 2, 5)).unwrap();
        assert_eq!(s.state(), (256.0, 2, 5));
        assert!(s.restore((256.0, 3, 5)).is_err());
        assert!(s.restore((f32::NAN, 0, 0)).is_err());
        assert!(s.restore((0.0, 0, 0)).is_err());
        let mut st = LossScaler::new(LossScale::Static(8.0)).unwrap().unwrap();
        st.restore((8.0, 0, 0)).unwrap();
        assert!(st.restore((4.0, 0, 0)).is_err());
    }
}
