//! Testing policy: lns<w,f> rounding is checked against an exact reference that shares no
//! code with `src/format`. Its one primitive is `floor(log2|x| * 2^g)` for an f64 (or any
//! dyadic rational) `x`, computed two independent ways:
//!
//! - by big integers: for `x = M 2^E`, `floor(log2|x| 2^g) = E 2^g + bitlen(M^(2^g)) - 1`
//!   (`g <= 11`: the power has up to 110,000 bits);
//! - by a 200-bit fixed-point logarithm: `ln v = 2 atanh((v - 1)/(v + 1))` summed term by
//!   term in big integers, divided by `ln 2 = 2 atanh(1/3)`, with an error below 2^-180;
//!   a floor is taken only when the fixed-point value is farther than that bound from an
//!   integer, and the test fails rather than guess otherwise (any `g` up to 60).
//!
//! From that primitive the reference derives every mode from its definition (nearest: the
//! floor of `2t`; stochastic: the floor of `t 2^b`; underflow and overflow by the rules of
//! the module docs) and the correctly rounded f64 of `2^(k/2^f)` (the candidate from `exp2`,
//! moved until the exact value lies between its midpoints). Results are compared bit for
//! bit.

mod common;
use common::{Mismatches, SplitMix};

use num_bigint::{BigInt, BigUint};
use num_traits::{One, ToPrimitive, Zero};
use qcandle::format::lns::LnsCode;
use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::Lns;
use qcandle::{Format, Rounding};
use rayon::prelude::*;

// ---------------------------------------------------------------------------------------
// The exact reference
// ---------------------------------------------------------------------------------------

/// A positive dyadic rational `n 2^e`.
#[derive(Clone, Debug)]
struct Dyadic {
    n: BigUint,
    e: i64,
}

impl Dyadic {
    fn of(x: f64) -> Dyadic {
        let x = x.abs();
        assert!(x.is_finite() && x > 0.0);
        let bits = x.to_bits();
        let biased = (bits >> 52) as i64;
        let frac = bits & ((1 << 52) - 1);
        if biased == 0 {
            Dyadic {
                n: BigUint::from(frac),
                e: -1074,
            }
        } else {
            Dyadic {
                n: BigUint::from(frac | (1 << 52)),
                e: biased - 1075,
            }
        }
    }

    /// `(a + b) / 2`.
    fn midpoint(a: &Dyadic, b: &Dyadic) -> Dyadic {
        let e = a.e.min(b.e);
        let n = (&a.n << (a.e - e) as usize) + (&b.n << (b.e - e) as usize);
        Dyadic { n, e: e - 1 }
    }

    fn is_power_of_two(&self) -> bool {
        self.n.count_ones() == 1
    }

    /// `log2` when this is a power of two.
    fn exact_log2(&self) -> i64 {
        self.e + self.n.bits() as i64 - 1
    }
}

/// `floor(log2(x) 2^g)` by big integer powers (`g <= 11`).
fn floor_log_pow(x: &Dyadic, g: u32) -> i64 {
    assert!(g <= 11);
    let p = x.n.pow(1u32 << g);
    (x.e << g) + p.bits() as i64 - 1
}

const PREC: u64 = 200;

/// `atanh(s)` for `s = num/den` in [0, 1/2], in units of 2^-PREC (error below 4 units per
/// term, under 500 units in all).
fn atanh_fixed(num: &BigUint, den: &BigUint) -> BigUint {
    let s = (num << PREC as usize) / den;
    let s2 = (&s * &s) >> PREC as usize;
    let mut power = s;
    let mut sum = BigUint::zero();
    let mut i = 1u32;
    while !power.is_zero() {
        sum += &power / i;
        power = (&power * &s2) >> PREC as usize;
        i += 2;
    }
    sum
}

/// `log2(x)` in units of 2^-PREC, off by less than [`LOG_ERROR`] units.
fn log2_fixed(x: &Dyadic) -> BigInt {
    let b = x.n.bits() as i64;
    let half = BigUint::one() << (b - 1) as usize;
    // ln(v) for v = n / 2^(b-1) in [1, 2): 2 atanh((n - h) / (n + h)), argument below 1/3.
    let ln_v = atanh_fixed(&(&x.n - &half), &(&x.n + &half)) << 1;
    static LN_2: std::sync::OnceLock<BigUint> = std::sync::OnceLock::new();
    let ln_2 = LN_2.get_or_init(|| atanh_fixed(&BigUint::one(), &BigUint::from(3u32)) << 1);
    let frac = (ln_v << PREC as usize) / ln_2;
    (BigInt::from(x.e + b - 1) << PREC as usize) + BigInt::from(frac)
}

/// Bound on the error of [`log2_fixed`], in units of 2^-PREC (generous: about 4 units per
/// series term of each logarithm, amplified by less than 3 in the division).
const LOG_ERROR: u64 = 1 << 12;

/// `floor(log2(x) 2^g)` from the 200-bit logarithm; panics when it cannot decide.
fn floor_log_series(x: &Dyadic, g: u32) -> i64 {
    if x.is_power_of_two() {
        return x.exact_log2() << g;
    }
    // Shift by 2^12 so the value is positive and the floor is a plain shift.
    thread_local! {
        static LAST: std::cell::RefCell<Option<(BigUint, i64, BigInt)>> = const { std::cell::RefCell::new(None) };
    }
    let log = LAST.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((n, e, log)) if *n == x.n && *e == x.e => log.clone(),
            _ => {
                let log = log2_fixed(x);
                *last = Some((x.n.clone(), x.e, log.clone()));
                log
            }
        }
    });
    let offset = BigInt::from(4096i64) << PREC as usize;
    let scaled = ((log + offset) << g as usize)
        .to_biguint()
        .expect("log2 above -4096");
    let unit = BigUint::one() << PREC as usize;
    let rem = &scaled % &unit;
    let margin = BigUint::from(LOG_ERROR) << g as usize;
    assert!(
        rem > margin && &unit - &rem > margin,
        "the 200-bit reference cannot decide floor(log2({x:?}) 2^{g})"
    );
    (scaled >> PREC as usize).to_i64().unwrap() - (4096i64 << g)
}

/// Which exact floor the reference uses.
#[derive(Clone, Copy)]
enum Oracle {
    Pow,
    Series,
}

impl Oracle {
    fn floor_log(self, x: &Dyadic, g: u32) -> i64 {
        match self {
            Oracle::Pow => floor_log_pow(x, g),
            Oracle::Series => floor_log_series(x, g),
        }
    }

    /// Whether `2^(k/2^f) > x` (false when equal).
    fn exp_above(self, k: i64, f: u32, x: &Dyadic) -> bool {
        if x.is_power_of_two() {
            return k > x.exact_log2() << f;
        }
        // log2 x is irrational: k/2^f > log2 x exactly when k > floor(log2(x) 2^f).
        k > self.floor_log(x, f)
    }
}

fn next_up(x: f64) -> f64 {
    f64::from_bits(x.to_bits() + 1)
}

fn next_down(x: f64) -> f64 {
    f64::from_bits(x.to_bits() - 1)
}

/// The f64 nearest to `2^(k/2^f)`, from its definition: a candidate moved until the exact
/// value lies between its midpoints (ties only for powers of two, which are exact).
fn ref_value(k: i64, f: u32, oracle: Oracle) -> f64 {
    if k.rem_euclid(1 << f) == 0 {
        let q = k >> f;
        return match q {
            -1022..=1023 => f64::from_bits(((q + 1023) as u64) << 52),
            -1074..=-1023 => f64::from_bits(1 << (q + 1074)),
            q if q > 1023 => f64::INFINITY,
            _ => 0.0,
        };
    }
    let mut c = (k as f64 / (1u64 << f) as f64).exp2();
    loop {
        // Midpoint with the next larger f64 (MAX's upper midpoint bounds rounding to Inf).
        let upper = if c == f64::MAX {
            Dyadic {
                n: (BigUint::one() << 54usize) - 1u32,
                e: 1024 - 54,
            }
        } else if c == 0.0 {
            Dyadic {
                n: BigUint::one(),
                e: -1075,
            }
        } else if c.is_infinite() {
            c = f64::MAX;
            continue;
        } else {
            Dyadic::midpoint(&Dyadic::of(c), &Dyadic::of(next_up(c)))
        };
        if c < f64::INFINITY && oracle.exp_above(k, f, &upper) {
            c = if c == f64::MAX {
                return f64::INFINITY;
            } else {
                next_up(c)
            };
            continue;
        }
        if c == 0.0 {
            return 0.0;
        }
        let lower = if c == f64::from_bits(1) {
            Dyadic {
                n: BigUint::one(),
                e: -1075,
            }
        } else {
            Dyadic::midpoint(&Dyadic::of(next_down(c)), &Dyadic::of(c))
        };
        if !oracle.exp_above(k, f, &lower) {
            c = next_down(c);
            continue;
        }
        return c;
    }
}

/// The reference rounding of `x` (see the policy above): the code, from the exact floors.
fn ref_code(lns: &Lns, x: f64, mode: Rounding, random: u32, oracle: Oracle) -> LnsCode {
    if x.is_nan() {
        return LnsCode::Nan;
    }
    if x == 0.0 {
        return LnsCode::Zero;
    }
    let negative = x < 0.0;
    let max = LnsCode::Value {
        negative,
        k: lns.k_max(),
    };
    let min = LnsCode::Value {
        negative,
        k: lns.k_min(),
    };
    if x.is_infinite() {
        return max;
    }
    let f = lns.f();
    let d = Dyadic::of(x);
    let floor_t = oracle.floor_log(&d, f);
    if floor_t > lns.k_max() {
        return max;
    }
    // Kept values: an input equal to the f64 value of the code above floor(t) (which can lie
    // below 2^((floor t + 1)/2^f) by a fraction of an ulp) keeps that code when rounding
    // toward zero or stochastically (only codes of the format: `next >= k_min`).
    let next = floor_t + 1;
    let kept = matches!(mode, Rounding::TowardZero | Rounding::Stochastic { .. })
        && (lns.k_min()..=lns.k_max()).contains(&next)
        && x.abs() >= (next as f64 / (1u64 << f) as f64).exp2() * (1.0 - 1e-12)
        && x.abs() == ref_value(next, f, oracle);
    if kept {
        return LnsCode::Value { negative, k: next };
    }
    let k = match mode {
        Rounding::TowardZero => floor_t,
        Rounding::NearestEven | Rounding::NearestAway => {
            (oracle.floor_log(&d, f + 1) + 1).div_euclid(2)
        }
        Rounding::Stochastic { bits } => {
            if floor_t < lns.k_min() {
                // Up to min with probability |x| / min64, truncated to `bits` bits.
                let min64 = Dyadic::of(ref_value(lns.k_min(), f, oracle));
                let e = d.e + bits as i64 - min64.e;
                let threshold = if e >= 0 {
                    (&d.n << e as usize) / &min64.n
                } else {
                    &d.n / (&min64.n << (-e) as usize)
                };
                let r = BigUint::from(random >> (32 - bits));
                return if r < threshold { min } else { LnsCode::Zero };
            }
            let j = oracle.floor_log(&d, f + bits);
            let kept = j >> bits;
            let frac = j & ((1 << bits) - 1);
            kept + (((random >> (32 - bits)) as i64) < frac) as i64
        }
    };
    if k > lns.k_max() {
        return max;
    }
    if k >= lns.k_min() {
        return LnsCode::Value { negative, k };
    }
    // Underflow: compare |x| with min / 2 = 2^((k_min - 2^f) / 2^f).
    let boundary = lns.k_min() - (1 << f);
    let exact_tie = d.is_power_of_two() && d.exact_log2() << f == boundary;
    let above_half = floor_t > boundary || (floor_t == boundary && !exact_tie);
    match mode {
        Rounding::TowardZero => LnsCode::Zero,
        _ if above_half => min,
        Rounding::NearestAway if exact_tie => min,
        _ => LnsCode::Zero,
    }
}

fn rule_code(lns: &Lns, x: f64, mode: Rounding, random: u32) -> LnsCode {
    match mode {
        Rounding::NearestEven => lns.round_code(x, NearestEven, random),
        Rounding::NearestAway => lns.round_code(x, NearestAway, random),
        Rounding::TowardZero => lns.round_code(x, TowardZero, random),
        Rounding::Stochastic { bits } => lns.round_code(x, Stochastic { bits }, random),
    }
}

const MODES: [Rounding; 3] = [
    Rounding::NearestEven,
    Rounding::NearestAway,
    Rounding::TowardZero,
];

/// The smallest positive f64 whose `floor(log2 2^g)` reaches `j` (an exact boundary search
/// around `2^(j/2^g)`).
fn first_at_or_above(j: i64, g: u32, oracle: Oracle) -> f64 {
    let reaches = |x: f64| oracle.floor_log(&Dyadic::of(x), g) >= j;
    let mut c = (j as f64 / (1u64 << g) as f64).exp2();
    while !reaches(c) {
        c = next_up(c);
    }
    while c > f64::from_bits(1) && reaches(next_down(c)) {
        c = next_down(c);
    }
    c
}

fn check(lns: &Lns, x: f64, mode: Rounding, random: u32, oracle: Oracle, bad: &mut Mismatches) {
    for x in [x, -x] {
        let want = ref_code(lns, x, mode, random, oracle);
        let got = rule_code(lns, x, mode, random);
        bad.check(got == want, || {
            format!(
                "lns<{},{}> {mode} {x:e} (r {random:#x}): got {got:?}, want {want:?}",
                lns.w(),
                lns.f()
            )
        });
    }
}

// ---------------------------------------------------------------------------------------
// Rounding boundaries
// ---------------------------------------------------------------------------------------

/// The (w, f) pairs whose every boundary is tested: two widths per f <= 10 (fewer for the
/// largest f, where each big-integer power has ~10^5 bits).
fn boundary_formats() -> Vec<Lns> {
    let mut v = Vec::new();
    for f in 0..=10u32 {
        let widths: &[u32] = match f {
            0..=6 => &[f + 3, f + 5],
            7..=8 => &[f + 2, f + 4],
            _ => &[f + 2],
        };
        for &w in widths {
            v.push(Lns::new(w, f).unwrap());
        }
    }
    v
}

#[test]
fn every_nearest_and_toward_zero_boundary_for_f_up_to_10() {
    let bad = boundary_formats()
        .par_iter()
        .map(|lns| {
            let mut bad = Mismatches::default();
            let f = lns.f();
            // Nearest: the f64s either side of 2^((2k+1)/2^(f+1)), from below min/2 to above max.
            for k in lns.k_min() - 1..=lns.k_max() {
                let hi = first_at_or_above(2 * k + 1, f + 1, Oracle::Pow);
                let lo = next_down(hi);
                // No f64 is a tie: the boundary lies strictly between lo and hi.
                let d = Dyadic::of(hi);
                bad.check(
                    !(d.is_power_of_two() && d.exact_log2() << (f + 1) == 2 * k + 1),
                    || format!("{hi:e} is a nearest tie"),
                );
                for x in [lo, hi] {
                    for mode in MODES {
                        check(lns, x, mode, 0, Oracle::Pow, &mut bad);
                    }
                }
            }
            // Toward zero and the linear underflow boundary: the f64s either side of each
            // value 2^(k/2^f), and of min/2.
            for k in (lns.k_min() - (1 << f))..=lns.k_max() + 1 {
                if k < lns.k_min() - 1 && k != lns.k_min() - (1 << f) {
                    continue;
                }
                let at = first_at_or_above(k, f, Oracle::Pow);
                for x in [next_down(at), at, next_up(at)] {
                    for mode in MODES {
                        check(lns, x, mode, 0, Oracle::Pow, &mut bad);
                    }
                }
            }
            bad
        })
        .reduce(Mismatches::default, Mismatches::merge);
    bad.assert_none("lns boundaries");
}

#[test]
fn the_representable_values_are_kept_only_where_they_are_f64s() {
    // 2^(k/2^f) is an f64 only for k a multiple of 2^f: toward zero keeps it, and the f64
    // just below it goes down a code.
    let lns = Lns::new(10, 3).unwrap();
    for k in (lns.k_min()..=lns.k_max()).filter(|k| k % 8 == 0) {
        let x = 2f64.powi((k / 8) as i32);
        let code = lns.round_code(x, TowardZero, 0);
        assert_eq!(code, LnsCode::Value { negative: false, k }, "{x}");
        if k > lns.k_min() {
            let below = lns.round_code(next_down(x), TowardZero, 0);
            assert_eq!(
                below,
                LnsCode::Value {
                    negative: false,
                    k: k - 1
                },
                "below {x}"
            );
        }
    }
    // k not a multiple of 2^f: the f64s either side of 2^(3/8) round toward zero to 2 and
    // 3, except that the f64 value of k = 3 (which may lie below 2^(3/8)) is kept.
    let at = first_at_or_above(3, 3, Oracle::Pow);
    assert_eq!(
        lns.round_code(at, TowardZero, 0),
        LnsCode::Value {
            negative: false,
            k: 3
        }
    );
    let below = next_down(at);
    let want = if below == lns.value(3) { 3 } else { 2 };
    assert_eq!(
        lns.round_code(below, TowardZero, 0),
        LnsCode::Value {
            negative: false,
            k: want
        }
    );
}

#[test]
fn every_value_is_kept_in_every_mode() {
    // Rounding a rounded value changes nothing, also where the f64 value lies below the
    // exact 2^(k/2^f) (the log-domain floor alone would take it down a code).
    let mut below_exact = 0;
    for (w, f) in [(10u32, 3u32), (12, 7), (14, 10)] {
        let lns = Lns::new(w, f).unwrap();
        for k in lns.k_min()..=lns.k_max() {
            let v = lns.value(k);
            let want = LnsCode::Value { negative: false, k };
            if lns.round_code(v, NearestEven, 0) != want {
                panic!("lns<{w},{f}> nearest moves the value of {k}");
            }
            for r in [0, 0x8000_0000, u32::MAX] {
                assert_eq!(lns.round_code(v, TowardZero, r), want, "lns<{w},{f}> {k}");
                assert_eq!(
                    lns.round_code(v, Stochastic { bits: 23 }, r),
                    want,
                    "lns<{w},{f}> {k}"
                );
            }
            if ref_code(&lns, v, Rounding::NearestEven, 0, Oracle::Pow) != want {
                panic!("reference moves {k}");
            }
            below_exact += (floor_log_pow(&Dyadic::of(v), f) < k) as u32;
        }
    }
    assert!(
        below_exact > 100,
        "values below their exact logarithm: {below_exact}"
    );
}

#[test]
fn every_stochastic_threshold_for_small_f() {
    // With b random bits the thresholds are (j 2^b + r + 1) / 2^(f+b): the f64s either side
    // of each, with the draws r and r + 1 that decide there.
    let bits = 4;
    let bad = [(6u32, 0u32), (7, 2), (9, 5), (9, 6)]
        .par_iter()
        .map(|&(w, f)| {
            let lns = Lns::new(w, f).unwrap();
            let mut bad = Mismatches::default();
            let mode = Rounding::Stochastic { bits };
            for j in (lns.k_min() << bits)..(lns.k_max() << bits) {
                let hi = first_at_or_above(j, f + bits, Oracle::Pow);
                for x in [next_down(hi), hi] {
                    for r in [j & 15, (j + 15) & 15, 15] {
                        check(&lns, x, mode, (r as u32) << 28, Oracle::Pow, &mut bad);
                    }
                }
            }
            // The linear underflow: values below min against random draws.
            let mut rng = SplitMix(w as u64);
            for _ in 0..2000 {
                let x = lns.min_positive() * (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                if x > 0.0 {
                    check(&lns, x, mode, rng.next_u32(), Oracle::Pow, &mut bad);
                }
            }
            bad
        })
        .reduce(Mismatches::default, Mismatches::merge);
    bad.assert_none("lns stochastic thresholds");
}

// ---------------------------------------------------------------------------------------
// Random inputs at every f up to 23
// ---------------------------------------------------------------------------------------

/// A random f64 around the format's range (a third below min, a third above max).
fn random_input(lns: &Lns, rng: &mut SplitMix) -> f64 {
    let span = lns.k_max() as f64 / (1u64 << lns.f()) as f64;
    let lo = (-span * 1.1).max(-1074.0) as i32;
    let hi = (span * 1.1).min(1023.0) as i32 + 1;
    let x = rng.float_between(lo, hi);
    if rng.coin() {
        -x
    } else {
        x
    }
}

#[test]
fn a_million_random_inputs_for_f_up_to_23_in_every_mode() {
    let bad = (0..64u64)
        .into_par_iter()
        .map(|chunk| {
            let mut rng = SplitMix(0x1a5 + chunk);
            let mut bad = Mismatches::default();
            for i in 0..15_625 {
                let f = (i % 24) as u32;
                let w = ((f + 2).max(3) + rng.below((31 - f) as u64) as u32).min(32);
                let lns = Lns::new(w, f).unwrap();
                let x = random_input(&lns, &mut rng);
                let bits = 1 + rng.below(23) as u32;
                let random = rng.next_u32();
                for mode in MODES.into_iter().chain([Rounding::Stochastic { bits }]) {
                    let want = ref_code(&lns, x, mode, random, Oracle::Series);
                    let got = rule_code(&lns, x, mode, random);
                    bad.check(got == want, || {
                        format!(
                            "lns<{w},{f}> {mode} {x:e} (r {random:#x}): got {got:?}, want {want:?}"
                        )
                    });
                }
            }
            bad
        })
        .reduce(Mismatches::default, Mismatches::merge);
    bad.assert_none_of("lns random inputs", 64 * 15_625);
}

#[test]
fn inputs_near_boundaries_at_large_f() {
    // Random boundaries j / 2^(f+1) for f up to 30 and the f64s either side of each: the
    // inputs where a fast log2 alone could not decide.
    let bad = (0..16u64)
        .into_par_iter()
        .map(|chunk| {
            let mut rng = SplitMix(0xb0d + chunk);
            let mut bad = Mismatches::default();
            for _ in 0..200 {
                let f = 11 + rng.below(20) as u32;
                let lns = Lns::new(32, f).unwrap();
                let span = (lns.k_max() >> f).clamp(1, 1000);
                let j = (rng.below((2 * span as u64) << (f + 1)) as i64) - (span << (f + 1));
                let hi = first_at_or_above(j, f + 1, Oracle::Series);
                for x in [next_down(hi), hi] {
                    for mode in MODES {
                        check(&lns, x, mode, 0, Oracle::Series, &mut bad);
                    }
                }
            }
            bad
        })
        .reduce(Mismatches::default, Mismatches::merge);
    bad.assert_none("lns boundaries at large f");
}

// ---------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn every_value_of_small_f_is_the_correctly_rounded_f64() {
    // lns<15,2> and lns<16,3> reach past f64's range both ways (Inf, subnormals, zero).
    let bad = [(15u32, 2u32), (16, 3), (12, 0), (13, 6), (18, 8)]
        .par_iter()
        .map(|&(w, f)| {
            let lns = Lns::new(w, f).unwrap();
            let mut bad = Mismatches::default();
            for k in lns.k_min()..=lns.k_max() {
                let got = lns.value(k);
                let want = ref_value(k, f, Oracle::Pow);
                bad.check(same(got, want), || {
                    format!("lns<{w},{f}> k {k}: got {got:e}, want {want:e}")
                });
            }
            bad
        })
        .reduce(Mismatches::default, Mismatches::merge);
    bad.assert_none("lns values, every k");
}

#[test]
fn random_values_of_large_f_are_the_correctly_rounded_f64() {
    let bad = (0..8u64)
        .into_par_iter()
        .map(|chunk| {
            let mut rng = SplitMix(0x7a1 + chunk);
            let mut bad = Mismatches::default();
            for _ in 0..2500 {
                let f = 9 + rng.below(22) as u32;
                let lns = Lns::new(32, f).unwrap();
                // k anywhere in f64's range, and past it at both ends.
                let span = 1100i64 << f;
                let k = (rng.below(2 * span as u64) as i64 - span).clamp(lns.k_min(), lns.k_max());
                let got = lns.value(k);
                let want = ref_value(k, f, Oracle::Series);
                bad.check(same(got, want), || {
                    format!("lns<32,{f}> k {k}: got {got:e}, want {want:e}")
                });
            }
            bad
        })
        .reduce(Mismatches::default, Mismatches::merge);
    bad.assert_none("lns values, random k");
}

#[test]
fn f32_values_are_distinct_up_to_f_22_and_shared_from_f_23() {
    for (f, shared) in [(22u32, false), (23, true)] {
        let lns = Lns::new(32, f).unwrap();
        let values: Vec<f32> = (0..1i64 << f).map(|k| lns.value(k) as f32).collect();
        let collisions = values.windows(2).filter(|p| p[0] == p[1]).count();
        assert_eq!(
            collisions > 0,
            shared,
            "f = {f}: {collisions} neighbours share an f32"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Stochastic rounding is unbiased in the log domain
// ---------------------------------------------------------------------------------------

#[test]
fn stochastic_rounding_is_unbiased_in_the_log_domain() {
    const N: u32 = 100_000;
    let mut rng = SplitMix(0x5eed);
    for (w, f, bits) in [(8u32, 3u32, 23u32), (16, 10, 23), (12, 2, 8), (32, 20, 23)] {
        let lns = Lns::new(w, f).unwrap();
        for _ in 0..8 {
            let x = rng.float_between(-4, 4);
            let d = Dyadic::of(x);
            // frac(t) to 23 bits from the exact reference; the expected P(up) is its
            // truncation to `bits` bits.
            let j = floor_log_series(&d, f + 23);
            let floor_t = j >> 23;
            let frac23 = (j & ((1 << 23) - 1)) as f64 / (1u64 << 23) as f64;
            let p = (frac23 * (1u64 << bits) as f64).floor() / (1u64 << bits) as f64;
            let ups: u32 = (0..N)
                .map(
                    |_| match lns.round_code(x, Stochastic { bits }, rng.next_u32()) {
                        LnsCode::Value { k, .. } => {
                            assert!(k == floor_t || k == floor_t + 1, "{x}: k {k}");
                            (k - floor_t) as u32
                        }
                        other => panic!("{x}: {other:?}"),
                    },
                )
                .sum();
            let mean = ups as f64 / N as f64;
            let sigma = (p * (1.0 - p) / N as f64).sqrt().max(1.0 / N as f64);
            assert!(
                (mean - p).abs() < 4.0 * sigma,
                "lns<{w},{f}> {x}: mean code offset {mean} vs fraction {p} (4 sigma = {})",
                4.0 * sigma
            );
            assert!(frac23 - p < 1.0 / (1u64 << bits) as f64);
        }
    }
}

#[test]
fn stochastic_underflow_is_unbiased_in_value() {
    const N: u32 = 100_000;
    let lns = Lns::new(6, 1).unwrap();
    let min = lns.min_positive();
    let mut rng = SplitMix(0xdead);
    for frac in [0.1, 0.5, 0.93] {
        let x = min * frac;
        let mean: f64 = (0..N)
            .map(|_| lns.round(x, Stochastic { bits: 23 }, rng.next_u32()))
            .sum::<f64>()
            / N as f64;
        let sigma = min * (frac * (1.0 - frac) / N as f64).sqrt();
        assert!((mean - x).abs() < 4.0 * sigma, "{x}: mean {mean}");
    }
}

// ---------------------------------------------------------------------------------------
// Edge cases, parsing and patterns
// ---------------------------------------------------------------------------------------

#[test]
fn specials_saturation_and_underflow_in_every_mode() {
    let lns = Lns::new(8, 3).unwrap();
    let (max, min) = (lns.max_value(), lns.min_positive());
    let rules: [Rounding; 4] = [
        Rounding::NearestEven,
        Rounding::NearestAway,
        Rounding::TowardZero,
        Rounding::Stochastic { bits: 23 },
    ];
    for mode in rules {
        let f = Format::Lns(lns);
        let r = |x: f64| f.round(x, mode, 0x8000_0000);
        assert_eq!(r(0.0).to_bits(), 0f64.to_bits(), "{mode} zero");
        assert_eq!(
            r(-0.0).to_bits(),
            0f64.to_bits(),
            "{mode} -0 is the unsigned zero"
        );
        assert!(r(f64::NAN).is_nan(), "{mode} NaN");
        assert_eq!(r(f64::INFINITY), max, "{mode} Inf saturates");
        assert_eq!(r(f64::NEG_INFINITY), -max, "{mode} -Inf saturates");
        assert_eq!(r(1e300), max, "{mode} overflow");
        assert_eq!(r(-max * 1.5), -max, "{mode} overflow");
        assert_eq!(r(1e-300), 0.0, "{mode} deep underflow");
        assert_eq!(r(f64::from_bits(1)), 0.0, "{mode} subnormal input");
        assert_eq!(r(max), max, "{mode} max is kept");
        assert_eq!(r(-min), -min, "{mode} -min is kept");
    }
    // Nearest underflow at min/2 in the linear domain; toward zero flushes.
    let half = min / 2.0;
    assert_eq!(lns.round(half * 1.0001, NearestEven, 0), min);
    assert_eq!(lns.round(half * 0.9999, NearestEven, 0), 0.0);
    assert_eq!(lns.round(min * 0.9999, TowardZero, 0), 0.0);
    // f = 0: min/2 is a power of two, a tie: even (zero) or away (min).
    let l0 = Lns::new(6, 0).unwrap();
    let half0 = l0.min_positive() / 2.0;
    assert_eq!(l0.round(half0, NearestEven, 0), 0.0);
    assert_eq!(l0.round(-half0, NearestAway, 0), -l0.min_positive());
    // Subnormal f64 inputs in a format that reaches them.
    let wide = Lns::new(32, 20).unwrap();
    let tiny = f64::from_bits(3);
    assert_eq!(
        wide.round_code(tiny, NearestEven, 0),
        ref_code(&wide, tiny, Rounding::NearestEven, 0, Oracle::Series)
    );
}

#[test]
fn patterns_round_trip_and_name_zero_and_nan() {
    let lns = Lns::new(8, 3).unwrap();
    assert_eq!(
        lns.encode(0.0),
        0x40,
        "zero: sign 0, reserved exponent 1000000"
    );
    assert_eq!(lns.encode(f64::NAN), 0xc0);
    assert_eq!(lns.encode(1.0), 0x00);
    assert_eq!(lns.encode(-2.0), 0x88, "sign 1, k = 8");
    assert_eq!(lns.encode(0.5), 0x78, "k = -8");
    assert!(lns.decode(0xc0).is_nan());
    assert_eq!(lns.decode(0x40), 0.0);
    for p in 0..256u32 {
        let v = lns.decode(p);
        if !v.is_nan() {
            assert_eq!(lns.encode(v), p, "{p:#x} = {v}");
            assert_eq!(lns.decode(p | 0xffff_ff00), v, "upper bits are ignored");
        }
    }
    let f = Format::Lns(lns);
    assert_eq!(f.encode(1.0).unwrap(), 0);
    assert_eq!(f.decode(0x88).unwrap(), -2.0);
}

#[test]
fn lns_parses_displays_and_reports_its_limits() {
    let f: Format = "lns<8,3>".parse().unwrap();
    assert_eq!(f, Format::Lns(Lns::new(8, 3).unwrap()));
    assert_eq!(f.to_string(), "lns<8,3>");
    assert_eq!(
        " LNS< 16 , 10 >".parse::<Format>().unwrap().to_string(),
        "lns<16,10>"
    );
    for bad in [
        "lns<8>",
        "lns<8,3,1>",
        "lns<2,0>",
        "lns<8,7>",
        "lns<33,4>",
        "lns<8,-1>",
        "lns<a,3>",
    ] {
        assert!(bad.parse::<Format>().is_err(), "{bad}");
    }
    assert_eq!(f.bits(), 8);
    // max = 2^(63/8), min = 2^(-63/8), epsilon = 2^(1/8) - 1.
    let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-15;
    assert!(close(f.max_finite().unwrap(), 2f64.powf(63.0 / 8.0)));
    assert!(close(f.min_positive().unwrap(), 2f64.powf(-63.0 / 8.0)));
    assert!(close(f.epsilon(), 2f64.powf(1.0 / 8.0) - 1.0));
}

#[test]
fn the_log2_estimate_error_is_far_inside_its_bound() {
    // Indirect: rounding at f = 30 (margins of 2^-14) agrees with the reference on random
    // inputs, and the exact fallback is exercised by inputs right at boundaries above.
    let lns = Lns::new(32, 30).unwrap();
    let mut rng = SplitMix(0x109);
    let mut bad = Mismatches::default();
    for _ in 0..3000 {
        let x = rng.float_between(-50, 50);
        check(&lns, x, Rounding::NearestEven, 0, Oracle::Series, &mut bad);
    }
    bad.assert_none("lns<32,30> random");
}

#[test]
fn rounding_modes_agree_with_format_round() {
    let f = Format::Lns(Lns::new(10, 4).unwrap());
    let lns = Lns::new(10, 4).unwrap();
    let mut rng = SplitMix(7);
    for _ in 0..1000 {
        let x = rng.float_between(-20, 20);
        let r = rng.next_u32();
        assert!(same(
            f.round(x, Rounding::NearestEven, r),
            lns.round(x, NearestEven, r)
        ));
        assert!(same(
            f.round(x, Rounding::NearestAway, r),
            lns.round(x, NearestAway, r)
        ));
        assert!(same(
            f.round(x, Rounding::TowardZero, r),
            lns.round(x, TowardZero, r)
        ));
        let sr = Rounding::Stochastic { bits: 9 };
        assert!(same(
            f.round(x, sr, r),
            lns.round(x, Stochastic { bits: 9 }, r)
        ));
    }
}
