//! Fixed(wl, fl): two's complement fixed point with `wl` bits of which `fl` are fractional.
//!
//! Values are `k * 2^-fl` for integers `k` in `[-2^(wl-1), 2^(wl-1) - 1]`; the symmetric
//! option drops `-2^(wl-1)` so the range is `±(2^(wl-1) - 1) 2^-fl`. A magnitude is rounded
//! to a multiple of `2^-fl` (sign-magnitude, so every mode is symmetric about 0), then
//! clamped to the range (default) or left on the unbounded grid (`noclamp`). Zero is
//! unsigned (two's complement has one zero), so results are never -0.0. NaN stays NaN;
//! ±Inf clamps to the range ends, or stays ±Inf without clamping.

use super::grid::{parts, pow2, round_to_multiple};
use super::rounding::RoundingRule;
use crate::error::FormatError;

/// A validated fixed-point format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fixed {
    wl: u32,
    fl: i32,
    clamp: bool,
    symmetric: bool,
}

impl Fixed {
    /// Fixed point with `2 <= wl <= 32` word bits and `-64 <= fl <= 64` fraction bits,
    /// clamped, full two's complement range.
    pub fn new(wl: u32, fl: i32) -> Result<Self, FormatError> {
        Self::with_options(wl, fl, true, false)
    }

    /// Fixed point with the clamp and symmetric options given.
    pub fn with_options(
        wl: u32,
        fl: i32,
        clamp: bool,
        symmetric: bool,
    ) -> Result<Self, FormatError> {
        if !(2..=32).contains(&wl) {
            return Err(FormatError::OutOfRange {
                format: "fixed",
                param: "wl",
                value: wl as i64,
                valid: "2..=32",
            });
        }
        if !(-64..=64).contains(&fl) {
            return Err(FormatError::OutOfRange {
                format: "fixed",
                param: "fl",
                value: fl as i64,
                valid: "-64..=64",
            });
        }
        Ok(Fixed {
            wl,
            fl,
            clamp,
            symmetric,
        })
    }

    /// Word length in bits.
    pub fn wl(&self) -> u32 {
        self.wl
    }
    /// Fractional bits.
    pub fn fl(&self) -> i32 {
        self.fl
    }
    /// Whether values are clamped to the range.
    pub fn clamp(&self) -> bool {
        self.clamp
    }
    /// Whether the most negative code is excluded.
    pub fn symmetric(&self) -> bool {
        self.symmetric
    }
    /// Largest value, `(2^(wl-1) - 1) 2^-fl`.
    pub fn max_value(&self) -> f64 {
        ((1u64 << (self.wl - 1)) - 1) as f64 * pow2(-self.fl)
    }
    /// Most negative value, `-2^(wl-1) 2^-fl` (or `-max` when symmetric).
    pub fn min_value(&self) -> f64 {
        if self.symmetric {
            -self.max_value()
        } else {
            -((1u64 << (self.wl - 1)) as f64) * pow2(-self.fl)
        }
    }
    /// Quantum `2^-fl`.
    pub fn quantum(&self) -> f64 {
        pow2(-self.fl)
    }

    /// Rounds `x` to this format with `rule`.
    #[inline(always)]
    pub fn round<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> f64 {
        round_fixed(
            x,
            -self.fl,
            self.wl,
            self.clamp,
            self.symmetric,
            rule,
            random,
        )
    }
}

/// Rounds `x` to multiples of `2^q` with a `wl`-bit two's complement range (shared with
/// block floating point, whose `q` comes from the block).
#[inline(always)]
pub(crate) fn round_fixed<R: RoundingRule>(
    x: f64,
    q: i32,
    wl: u32,
    clamp: bool,
    symmetric: bool,
    rule: R,
    random: u32,
) -> f64 {
    if x.is_nan() {
        return x;
    }
    if q < -1074 {
        // A grid finer than f64's subnormals: every f64 is on it, and none can be outside
        // a range whose ends are at least 2^(wl-1) quanta (only block floating point gets
        // here, whose range covers the block).
        return if x == 0.0 { 0.0 } else { x };
    }
    let top = (1u64 << (wl - 1)) as f64 * pow2(q);
    let max = top - pow2(q);
    let min = if symmetric { -max } else { -top };
    if x.is_infinite() {
        return if !clamp {
            x
        } else if x > 0.0 {
            max
        } else {
            min
        };
    }
    if x == 0.0 {
        return 0.0;
    }
    let v = round_to_multiple(parts(x), q, rule, random);
    if v == 0.0 {
        return 0.0;
    }
    let v = if x < 0.0 { -v } else { v };
    if clamp {
        v.clamp(min, max)
    } else {
        v
    }
}
