//! Multiplication, division, addition and subtraction of LNS values of one format.

use crate::format::lns::Lns;

use super::error::LnsError;
use std::sync::{Arc, OnceLock};

use super::gauss::{GaussEval, GaussLog, SumsRef};
use super::gauss_f64::GaussF64;
use super::value::LnsValue;

/// The arithmetic of one lns<w,f> format with one Gaussian-log implementation.
///
/// Operands are read as the exact numbers `±B^k` (any `k`); every result is a value of the
/// format: a `k` above `k_max` saturates to `k_max`, one below `k_min` flushes to zero.
#[derive(Debug, Clone)]
pub struct LnsArith {
    lns: Lns,
    gauss: GaussLog,
    eval: GaussEval,
    /// The f64 evaluation of the fast matrix product (`f >= 11`, ideal and truncated),
    /// built on first use.
    fast: Arc<OnceLock<GaussF64>>,
}

impl LnsArith {
    /// The arithmetic of `lns` with `gauss` (building its tables); refuses table parameters
    /// the format cannot use.
    pub fn new(lns: Lns, gauss: GaussLog) -> Result<Self, LnsError> {
        Ok(LnsArith {
            lns,
            gauss,
            eval: GaussEval::new(lns, gauss)?,
            fast: Arc::default(),
        })
    }

    /// The format.
    pub fn lns(&self) -> Lns {
        self.lns
    }

    /// The Gaussian-log implementation.
    pub fn gauss(&self) -> GaussLog {
        self.gauss
    }

    /// `sb(z) = 2^f log2(1 + 2^(z/2^f))` as this implementation evaluates it, in units of the
    /// last place of `k`: the `k` of `B^0 + B^z` is `sb(z)` (before saturation).
    pub fn sb(&self, z: i64) -> i64 {
        self.eval.sb(z, self.lns.f())
    }

    /// `db(z) = 2^f log2|1 - 2^(z/2^f)|` as this implementation evaluates it; `None` at
    /// `z = 0`, where `1 - B^0` is exactly zero.
    pub fn db(&self, z: i64) -> Option<i64> {
        (z != 0).then(|| self.eval.db(z, self.lns.f()))
    }

    /// The sums' evaluation for the fast matrix product ([`super::lanes`]).
    pub(crate) fn sums(&self) -> SumsRef<'_> {
        self.eval.sums(self.lns.f(), &self.fast)
    }

    /// `a * b`: signs XOR, exponents added exactly. `0 * x = 0` for every finite `x`; NaN
    /// in either operand gives NaN.
    pub fn mul(&self, a: LnsValue, b: LnsValue) -> LnsValue {
        match (a, b) {
            (LnsValue::NaN, _) | (_, LnsValue::NaN) => LnsValue::NaN,
            (LnsValue::Zero, _) | (_, LnsValue::Zero) => LnsValue::Zero,
            (
                LnsValue::Finite {
                    negative: sa,
                    k: ka,
                },
                LnsValue::Finite {
                    negative: sb,
                    k: kb,
                },
            ) => LnsValue::saturate(self.lns, sa ^ sb, ka as i64 + kb as i64),
        }
    }

    /// `a / b`: signs XOR, exponents subtracted exactly. `x / 0` is NaN for every `x` (zero
    /// included: the format has no infinity), `0 / x = 0` for finite `x`; NaN in either
    /// operand gives NaN.
    pub fn div(&self, a: LnsValue, b: LnsValue) -> LnsValue {
        match (a, b) {
            (LnsValue::NaN, _) | (_, LnsValue::NaN) | (_, LnsValue::Zero) => LnsValue::NaN,
            (LnsValue::Zero, _) => LnsValue::Zero,
            (
                LnsValue::Finite {
                    negative: sa,
                    k: ka,
                },
                LnsValue::Finite {
                    negative: sb,
                    k: kb,
                },
            ) => LnsValue::saturate(self.lns, sa ^ sb, ka as i64 - kb as i64),
        }
    }

    /// `a + b` by the Gaussian logarithms: with `|a| >= |b|` and `z = k_b - k_a <= 0`, the
    /// result is `a`'s sign with `k_a + sb(z)` (same signs) or `k_a + db(z)` (opposite signs;
    /// `z = 0` cancels exactly to zero). `0 + x = x`; NaN in either operand gives NaN.
    pub fn add(&self, a: LnsValue, b: LnsValue) -> LnsValue {
        match (a, b) {
            (LnsValue::NaN, _) | (_, LnsValue::NaN) => LnsValue::NaN,
            (LnsValue::Zero, x) | (x, LnsValue::Zero) => self.bring_in(x),
            (
                LnsValue::Finite {
                    negative: sa,
                    k: ka,
                },
                LnsValue::Finite {
                    negative: sb,
                    k: kb,
                },
            ) => {
                let (sign, big, z) = if ka >= kb {
                    (sa, ka as i64, kb as i64 - ka as i64)
                } else {
                    (sb, kb as i64, ka as i64 - kb as i64)
                };
                if sa == sb {
                    LnsValue::saturate(self.lns, sign, big + self.eval.sb(z, self.lns.f()))
                } else if z == 0 {
                    LnsValue::Zero
                } else {
                    LnsValue::saturate(self.lns, sign, big + self.eval.db(z, self.lns.f()))
                }
            }
        }
    }

    /// `a - b = a + (-b)`.
    pub fn sub(&self, a: LnsValue, b: LnsValue) -> LnsValue {
        self.add(a, -b)
    }

    /// An operand brought into the format (saturated or flushed) as a result.
    fn bring_in(&self, x: LnsValue) -> LnsValue {
        match x {
            LnsValue::Finite { negative, k } => LnsValue::saturate(self.lns, negative, k as i64),
            other => other,
        }
    }
}
