//! Round-to-odd f64 arithmetic: exact results kept recoverable for one later rounding.
//!
//! Rounding to odd keeps the exact value's leading 52 bits after the point and sets the last
//! bit whenever anything below it was lost. Rounding such a value once more, to any format
//! with at most 51 significand bits (every posit with n <= 32 keeps at most 29 pattern bits
//! after its regime and exponent, floats at most 24), gives the same result as rounding the
//! exact value directly: the binade, every kept bit, the guard bit and the sticky bit are
//! all preserved. So a sum or product computed here and then rounded by
//! [`Format::round`](crate::format::Format::round) is correctly rounded, with no double
//! rounding, although the f64 operation itself was inexact.

/// The f64 next to `s` in the direction of `err` (`s` rounded to nearest, `err` the exact
/// remainder), when that makes `s` odd; `s` itself when it is exact or already odd.
#[inline(always)]
fn to_odd(s: f64, err: f64) -> f64 {
    if err == 0.0 || s.to_bits() & 1 == 1 || !s.is_finite() {
        return s;
    }
    // `s` is even and inexact: the exact value lies strictly between `s` and its neighbour
    // towards `err`, which is odd.
    let away = (err > 0.0) == (s > 0.0);
    let bits = s.to_bits();
    f64::from_bits(if away { bits + 1 } else { bits - 1 })
}

/// `x + y` rounded to odd (TwoSum gives the exact remainder; exact for finite inputs).
#[inline(always)]
pub fn add_odd(x: f64, y: f64) -> f64 {
    let s = x + y;
    let yy = s - x;
    let err = (x - (s - yy)) + (y - yy);
    to_odd(s, err)
}

/// `x * y` rounded to odd (the remainder from a fused multiply-add; exact while the
/// product stays above f64's subnormal range, which every posit product with maxpos up to
/// 2^448 does).
#[inline(always)]
pub fn mul_odd(x: f64, y: f64) -> f64 {
    let p = x * y;
    to_odd(p, x.mul_add(y, -p))
}

/// A 128-bit integer magnitude as f64, rounded to odd.
#[inline]
pub fn u128_to_f64_odd(m: u128) -> f64 {
    if m < 1 << 53 {
        return m as f64;
    }
    let shift = 75 - m.leading_zeros(); // keeps 53 bits
    let kept = (m >> shift) as u64;
    let sticky = m & ((1u128 << shift) - 1) != 0;
    (kept | sticky as u64) as f64 * f64::powi(2.0, shift as i32)
}

/// A 128-bit signed integer as f64, rounded to odd.
#[inline]
pub fn i128_to_f64_odd(v: i128) -> f64 {
    let m = u128_to_f64_odd(v.unsigned_abs());
    if v < 0 {
        -m
    } else {
        m
    }
}
