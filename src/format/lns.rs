//! The logarithmic number system lns<w,f>: a value is zero or `±2^(k / 2^f)`, where `k` is a
//! (w-1)-bit two's complement integer read as a fixed-point base-2 logarithm with `f`
//! fraction bits (`B = 2^(2^-f)` is the base and `k` the exponent: the value is `±B^k`).
//!
//! # Encoding
//!
//! A `w`-bit pattern holds the sign in bit `w-1` (1 is negative) and `k` in the low `w-1`
//! bits as two's complement. The most negative `k`, `-2^(w-2)`, is reserved: with sign 0 it
//! is zero, with sign 1 it is NaN. Every other pattern is a finite nonzero value, so the
//! magnitudes are `2^(k/2^f)` for `k` in `[k_min, k_max] = [-2^(w-2) + 1, 2^(w-2) - 1]`,
//! symmetric about 1. There is no infinity.

use crate::error::FormatError;

/// A validated lns<w,f> format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lns {
    w: u32,
    f: u32,
}

impl Lns {
    /// lns<w,f> with `3 <= w <= 32` bits and `0 <= f <= w - 2` fraction bits of the
    /// logarithm.
    pub fn new(w: u32, f: u32) -> Result<Self, FormatError> {
        if !(3..=32).contains(&w) {
            return Err(FormatError::OutOfRange {
                format: "lns",
                param: "w",
                value: w as i64,
                valid: "3..=32",
            });
        }
        if f > w - 2 {
            return Err(FormatError::Inconsistent {
                format: "lns",
                reason: format!(
                    "f = {f} fraction bits do not fit the {} bits of the logarithm beside its sign and integer part (f <= w - 2 = {})",
                    w - 1,
                    w - 2
                ),
            });
        }
        Ok(Lns { w, f })
    }

    /// Bits per value.
    pub fn w(&self) -> u32 {
        self.w
    }

    /// Fraction bits of the logarithm.
    pub fn f(&self) -> u32 {
        self.f
    }

    /// The smallest exponent of a nonzero value, `-2^(w-2) + 1`.
    pub fn k_min(&self) -> i64 {
        -(1i64 << (self.w - 2)) + 1
    }

    /// The largest exponent, `2^(w-2) - 1`.
    pub fn k_max(&self) -> i64 {
        (1i64 << (self.w - 2)) - 1
    }

    /// The reserved exponent field, `-2^(w-2)`: zero with sign 0, NaN with sign 1.
    pub fn k_reserved(&self) -> i64 {
        -(1i64 << (self.w - 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked_and_the_exponent_range_is_symmetric() {
        assert!(Lns::new(2, 0).is_err());
        assert!(Lns::new(33, 4).is_err());
        assert!(Lns::new(8, 7).is_err());
        let l = Lns::new(8, 3).unwrap();
        assert_eq!((l.k_min(), l.k_max(), l.k_reserved()), (-63, 63, -64));
        let l = Lns::new(32, 30).unwrap();
        assert_eq!((l.k_min(), l.k_max()), (-(1 << 30) + 1, (1 << 30) - 1));
    }
}
