//! The round-to-odd helpers that every final rounding of the quire GEMMs goes through
//! (`add_odd`, `mul_odd`, `u128_to_f64_odd`, `i128_to_f64_odd`) against exact big-integer
//! results rounded to odd.

mod common;
#[path = "common/exact.rs"]
mod exact;

use common::reference::two_pow;
use common::{Mismatches, SplitMix};
use exact::{f64_units, ref_odd, same};

use num_bigint::BigInt;
use num_traits::Zero;
use qcandle::quire::round_odd::{add_odd, i128_to_f64_odd, mul_odd, u128_to_f64_odd};

/// A random normal f64 with exponent in `-lim..lim` and a full or short significand.
fn random_f64(rng: &mut SplitMix, lim: i32) -> f64 {
    let e = rng.below(2 * lim as u64) as i32 - lim;
    let mut m = 1.0 + (rng.next_u64() >> 12) as f64 / two_pow(52);
    if rng.below(4) == 0 {
        m = (m * 8.0).floor() / 8.0;
    }
    let x = m * two_pow(e);
    if rng.coin() {
        -x
    } else {
        x
    }
}

/// `add_odd(x, y)` is the exact sum when it fits, else its truncation with the last bit set,
/// for random pairs (near and far exponents, cancellation) and named edge cases.
#[test]
fn add_odd_is_the_exact_sum_rounded_to_odd() {
    let mut rng = SplitMix(1900);
    let mut mm = Mismatches::default();
    let mut pairs: Vec<(f64, f64)> = vec![
        (1.0, two_pow(-60)),
        (1.0, -two_pow(-60)), // just below a power of two: 1 - 2^-53
        (1.0, -two_pow(-53)), // exact
        (two_pow(52), 0.5),   // tie in nearest: even -> odd neighbour
        (two_pow(52), 1.5),
        (1.0, -1.0),
        (0.0, -0.0),
        (-0.0, -0.0),
        (3.0, two_pow(-1000)),
        (f64::MAX / 2.0, f64::MAX / 4.0),
    ];
    for i in 0..200_000 {
        let x = random_f64(&mut rng, 900);
        let y = match i % 4 {
            0 => random_f64(&mut rng, 900),
            1 => x * (1.0 + random_f64(&mut rng, 30)), // nearby
            2 => -x + random_f64(&mut rng, 50) * x.abs() * two_pow(-30), // cancellation
            _ => x * random_f64(&mut rng, 70),         // up to 2^70 apart
        };
        pairs.push((x, y));
    }
    for (x, y) in pairs {
        let exact = f64_units(x) + f64_units(y);
        let want = if exact.is_zero() {
            x + y
        } else {
            ref_odd(&exact, 1074)
        };
        let got = add_odd(x, y);
        mm.check(same(got, want), || {
            format!("add_odd({x:e}, {y:e}) = {got:e}, expected {want:e}")
        });
    }
    mm.assert_none("add_odd");
}

/// `mul_odd(x, y)` is the exact product when it fits, else its truncation with the last bit
/// set, for random pairs whose product stays normal, and named edge cases.
#[test]
fn mul_odd_is_the_exact_product_rounded_to_odd() {
    let mut rng = SplitMix(2000);
    let mut mm = Mismatches::default();
    let mut pairs: Vec<(f64, f64)> = vec![
        (1.0 + two_pow(-52), 1.0 + two_pow(-52)),
        (1.0 - two_pow(-53), 1.0 + two_pow(-52)),
        (3.0, 1.0 / 3.0),
        (-0.0, 5.0),
        (two_pow(500), two_pow(400)),
        (two_pow(-500), two_pow(-400)),
    ];
    for _ in 0..200_000 {
        pairs.push((random_f64(&mut rng, 500), random_f64(&mut rng, 500)));
    }
    for (x, y) in pairs {
        let exact = f64_units(x) * f64_units(y); // units 2^-2148
        let want = if exact.is_zero() {
            x * y
        } else {
            ref_odd(&exact, 2148)
        };
        let got = mul_odd(x, y);
        mm.check(same(got, want), || {
            format!("mul_odd({x:e}, {y:e}) = {got:e}, expected {want:e}")
        });
    }
    mm.assert_none("mul_odd");
}

/// `u128_to_f64_odd` and `i128_to_f64_odd` on every bit length, all-ones values, just above
/// 2^53, and the extremes.
#[test]
fn u128_and_i128_to_f64_odd_match_exact_reference() {
    let mut rng = SplitMix(2100);
    let mut mm = Mismatches::default();
    let mut us: Vec<u128> = vec![
        0,
        1,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        (1 << 54) + 1,
        (1 << 54) + 2,
        (1 << 55) + 4,
        u64::MAX as u128,
        u128::MAX,
        u128::MAX >> 1,
        1 << 127,
    ];
    for bits in 1..=128u32 {
        for _ in 0..500 {
            let v = ((rng.next_u64() as u128) << 64 | rng.next_u64() as u128) >> (128 - bits);
            us.push(v | 1 << (bits - 1));
            us.push((1u128 << (bits - 1)) | (rng.below(4) as u128));
        }
    }
    for &u in &us {
        let want = ref_odd(&BigInt::from(u), 0);
        let got = u128_to_f64_odd(u);
        mm.check(same(got, want), || {
            format!("u128_to_f64_odd({u:#x}) = {got:e}, expected {want:e}")
        });
        if u <= i128::MAX as u128 {
            for v in [u as i128, -(u as i128)] {
                let want = ref_odd(&BigInt::from(v), 0);
                let got = i128_to_f64_odd(v);
                mm.check(same(got, want), || {
                    format!("i128_to_f64_odd({v}) = {got:e}")
                });
            }
        }
    }
    let want = ref_odd(&BigInt::from(i128::MIN), 0);
    assert_eq!(i128_to_f64_odd(i128::MIN), want);
    assert_eq!(want, -two_pow(127));
    mm.assert_none("u128/i128 to f64 odd");
}
