//! Reference decoders written from the format definitions, sharing no code with `src/`:
//! the value of a posit pattern (sign, regime run and terminator, `es` exponent bits, the
//! fraction) and of a float pattern (bias, subnormals, the specials of the format's option),
//! and the exact powers of two they are built from. The oracle test files check these
//! decoders against SoftPosit's and the `half` crate's on every pattern.

#![allow(dead_code)] // each test file uses part of it

use qcandle::format::Specials;

/// `2^q`, exact for every q where it is a normal or subnormal f64; +Inf above, 0 below.
pub fn two_pow(q: i32) -> f64 {
    if q > 1023 {
        f64::INFINITY
    } else if q >= -1022 {
        f64::from_bits(((q + 1023) as u64) << 52)
    } else if q >= -1074 {
        f64::from_bits(1u64 << (q + 1074))
    } else {
        0.0
    }
}

/// `x * 2^e`, exact whenever the result is a normal f64.
pub fn ldexp(mut x: f64, mut e: i64) -> f64 {
    while e > 1000 {
        x *= two_pow(1000);
        e -= 1000;
    }
    while e < -1000 {
        x *= two_pow(-1000);
        e += 1000;
    }
    x * two_pow(e as i32)
}

/// The `n`-bit posit pattern `bits` (its low `n` bits, `2 <= n <= 33`) read by the
/// standard's definition: sign (two's complement), regime run and its terminator, `es`
/// exponent bits (those past the end are 0), then the fraction. `Some((negative, sig, exp))`
/// for `(-1)^negative * sig * 2^exp`; zero has `sig = 0`; NaR gives `None`.
pub fn posit_parts(bits: u64, n: u32, es: u32) -> Option<(bool, u64, i32)> {
    assert!((2..=33).contains(&n));
    let mask = (1u64 << n) - 1;
    let p = bits & mask;
    let sign_bit = 1u64 << (n - 1);
    if p == 0 {
        return Some((false, 0, 0));
    }
    if p == sign_bit {
        return None;
    }
    let negative = p & sign_bit != 0;
    let mag = if negative { p.wrapping_neg() & mask } else { p };
    let len = n - 1; // bits after the sign
    let bit = |i: u32| (mag >> (len - 1 - i)) & 1;
    let first = bit(0);
    let mut run = 1;
    while run < len && bit(run) == first {
        run += 1;
    }
    let k = if first == 1 {
        run as i32 - 1
    } else {
        -(run as i32)
    };
    let mut i = run + 1; // skip the terminator (possibly past the end)
    let mut e = 0u64;
    for _ in 0..es {
        e <<= 1;
        if i < len {
            e |= bit(i);
        }
        i += 1;
    }
    let (mut frac, mut flen) = (0u64, 0u32);
    while i < len {
        frac = (frac << 1) | bit(i);
        flen += 1;
        i += 1;
    }
    let scale = (k << es) + e as i32;
    Some((negative, (1 << flen) | frac, scale - flen as i32))
}

/// Value of the `n`-bit posit pattern `bits` (see [`posit_parts`]); NaR gives NaN. Exact:
/// every posit with `n <= 33` and `es <= 5` is a normal f64.
pub fn posit_value(bits: u64, n: u32, es: u32) -> f64 {
    match posit_parts(bits, n, es) {
        None => f64::NAN,
        Some((_, 0, _)) => 0.0,
        Some((negative, sig, exp)) => {
            let v = ldexp(sig as f64, exp as i64);
            if negative {
                -v
            } else {
                v
            }
        }
    }
}

/// Value of the float pattern `pattern` with `exp` exponent and `man` mantissa bits:
/// `(-1)^s 2^(E-bias) (1 + M/2^man)` with bias `2^(exp-1) - 1`, subnormals `M 2^(1-bias-man)`
/// at E = 0, and in the all-ones exponent the specials of `specials` (IEEE: Inf and NaN;
/// finite-NaN: NaN at the all-ones mantissa only; finite: none).
pub fn float_value(exp: u32, man: u32, specials: Specials, pattern: u64) -> f64 {
    let bias = (1i32 << (exp - 1)) - 1;
    let m = pattern & ((1u64 << man) - 1);
    let e = ((pattern >> man) & ((1u64 << exp) - 1)) as i32;
    let negative = (pattern >> (exp + man)) & 1 == 1;
    let all_ones = (1i32 << exp) - 1;
    let v = if e == all_ones && specials == Specials::Ieee {
        if m == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if e == all_ones && specials == Specials::FiniteNan && m == (1u64 << man) - 1 {
        f64::NAN
    } else if e == 0 {
        m as f64 * two_pow(1 - bias - man as i32)
    } else {
        ((1u64 << man) + m) as f64 * two_pow(e - bias - man as i32)
    };
    if negative {
        -v
    } else {
        v
    }
}
