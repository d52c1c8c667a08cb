//! The high-precision LNS reference of `tests/lns_arith.rs`: real numbers as big integers in
//! units of `2^-P` (P = 320), `exp` and `ln` by their Taylor and `atanh` series, and from
//! them `2^(z/2^f)`, the Gaussian logarithms and exact sums. It shares no code or method with
//! src/lns (which bounds `2^(j/2^s)` by chains of integer square roots): every series here is
//! summed until its terms vanish at 320 bits, so each result is within `2^-300` of the truth,
//! and a decision is only made when the value is at least `2^-200` from the rounding
//! boundary (the callers assert that, except in the exact cases they name).

#![allow(dead_code)] // each test uses part of it

use std::sync::OnceLock;

use num_bigint::BigInt;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Fraction bits of every fixed-point number.
pub const P: u32 = 320;
/// Closest distance to a rounding boundary the reference decides at, in bits below a unit.
pub const MARGIN: u32 = 200;

/// 1 in fixed point.
pub fn one() -> BigInt {
    BigInt::one() << P
}

fn mul(a: &BigInt, b: &BigInt) -> BigInt {
    (a * b) >> P
}

/// ln 2 = 2 atanh(1/3).
pub fn ln2() -> &'static BigInt {
    static LN2: OnceLock<BigInt> = OnceLock::new();
    LN2.get_or_init(|| 2 * atanh(&(one() / 3)))
}

/// `atanh(t) = t + t^3/3 + t^5/5 + ...` for `0 <= t <= 1/3`.
fn atanh(t: &BigInt) -> BigInt {
    let t2 = mul(t, t);
    let mut term = t.clone();
    let mut sum = BigInt::zero();
    let mut n = 1u64;
    while !term.is_zero() {
        sum += &term / n;
        term = mul(&term, &t2);
        n += 2;
    }
    sum
}

/// `exp(y)` for `|y| <= 1`.
fn exp(y: &BigInt) -> BigInt {
    let mut term = one();
    let mut sum = one();
    let mut n = 1u64;
    loop {
        term = mul(&term, y) / n;
        if term.is_zero() {
            return sum;
        }
        sum += &term;
        n += 1;
    }
}

/// `ln(v)` for `v > 0`: `v = 2^e m`, `m` in [1, 2), `ln m = 2 atanh((m-1)/(m+1))`.
pub fn ln(v: &BigInt) -> BigInt {
    assert!(v.is_positive());
    let e = v.bits() as i64 - 1 - P as i64;
    let m = if e >= 0 { v >> e } else { v << -e };
    let t = ((&m - one()) << P) / (&m + one());
    e * ln2() + 2 * atanh(&t)
}

/// `2^(j / 2^s)` for any integer `j`.
pub fn pow2(j: i64, s: u32) -> BigInt {
    let q = j.div_euclid(1 << s);
    let r = j.rem_euclid(1 << s);
    let frac = BigInt::from(r) << (P - s);
    let v = exp(&mul(&frac, ln2()));
    if q >= 0 {
        v << q
    } else {
        v >> -q
    }
}

/// `2^f log2(v)`: the `k` (unrounded) of a magnitude `v`.
pub fn log_units(v: &BigInt, f: u32) -> BigInt {
    (ln(v) << (P + f)) / ln2()
}

/// `sb(z) = 2^f log2(1 + 2^(z/2^f))` in units (fixed point), `z <= 0`.
pub fn sb(z: i64, f: u32) -> BigInt {
    assert!(z <= 0);
    log_units(&(one() + pow2(z, f)), f)
}

/// `db(z) = 2^f log2(1 - 2^(z/2^f))` in units (fixed point), `z < 0`.
pub fn db(z: i64, f: u32) -> BigInt {
    assert!(z < 0);
    log_units(&(one() - pow2(z, f)), f)
}

/// How a fixed-point value sits relative to the integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Within `2^-MARGIN` of this integer.
    AtInteger(i64),
    /// Strictly between `floor` and `floor + 1`, farther than `2^-MARGIN` from both.
    Between(i64),
}

/// Where `v` lies among the integers.
pub fn place(v: &BigInt) -> Place {
    let tol = BigInt::one() << (P - MARGIN);
    let near = (v + (&one() >> 1u32)) >> P; // nearest integer (floor of v + 1/2)
    if (v - (&near << P)).abs() <= tol {
        return Place::AtInteger(near.to_i64().unwrap());
    }
    Place::Between((v >> P).to_i64().unwrap())
}

/// The integer nearest to `v`; panics when `v` is within `2^-MARGIN` of a half-integer.
pub fn nearest(v: &BigInt) -> i64 {
    let shifted = v + (&one() >> 1u32);
    match place(&shifted) {
        Place::Between(n) => n,
        Place::AtInteger(_) => panic!("the reference cannot decide the rounding of a near-tie"),
    }
}

/// `floor(v)`, with the integer itself when `v` is within `2^-MARGIN` of it: the callers
/// accept that only where the exact value is known to be that integer.
pub fn floor(v: &BigInt) -> (i64, bool) {
    match place(v) {
        Place::AtInteger(n) => (n, true),
        Place::Between(n) => (n, false),
    }
}

/// `n - v` in units, as f64 (an error of an integer result `n` against the reference `v`).
pub fn error(n: i64, v: &BigInt) -> f64 {
    let d = (BigInt::from(n) << P) - v;
    d.to_f64().unwrap() / (P as f64).exp2()
}

/// A finite f64 as a fixed-point number (exact: needs `|x| >= 2^-P`).
pub fn from_f64(x: f64) -> BigInt {
    let bits = x.abs().to_bits();
    let field = ((bits >> 52) & 0x7ff) as i64;
    let frac = (bits & ((1 << 52) - 1)) as i64;
    let (m, e) = if field == 0 {
        (frac, -1074)
    } else {
        (frac | (1 << 52), field - 1075)
    };
    let v = BigInt::from(m);
    let sh = e + P as i64;
    let v = if sh >= 0 { v << sh } else { v >> -sh };
    if x < 0.0 {
        -v
    } else {
        v
    }
}
