//! Why an LNS pattern, exponent, table or matrix shape is refused.

use thiserror::Error;

/// Bad input to the LNS arithmetic: every message names the format or shape and the
/// offending value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LnsError {
    /// A bit pattern with bits set above the format's `w` bits.
    #[error("lns<{w},{f}>: pattern {bits:#x} has bits set above the format's {w} bits")]
    Pattern {
        /// Bits per value.
        w: u32,
        /// Fraction bits of the logarithm.
        f: u32,
        /// The pattern that was given.
        bits: u32,
    },
    /// An exponent outside the format's `[k_min, k_max]`.
    #[error("lns<{w},{f}>: exponent k = {k} is outside [{k_min}, {k_max}]")]
    Exponent {
        /// Bits per value.
        w: u32,
        /// Fraction bits of the logarithm.
        f: u32,
        /// The exponent that was given.
        k: i64,
        /// The smallest exponent of a nonzero value.
        k_min: i64,
        /// The largest exponent.
        k_max: i64,
    },
    /// Gaussian-log table parameters the format cannot use.
    #[error("lns<{w},{f}> Gaussian-log table: {reason}")]
    Table {
        /// Bits per value.
        w: u32,
        /// Fraction bits of the logarithm.
        f: u32,
        /// What is wrong, with the valid range.
        reason: String,
    },
    /// Matrix operands whose lengths do not match the shape.
    #[error("lns_matmul: {reason}")]
    Shape {
        /// The shape and lengths that disagree.
        reason: String,
    },
}
