//! The lns f32 fast path (`backend::lns_plan`) against the scalar rounding
//! (`Lns::round_stored` with f32 storage), bit for bit: at every threshold mantissa and its
//! neighbours, every bucket boundary, every exponent byte (zeros, subnormals, Inf, NaN, both
//! signs), in every rounding mode; through the CPU kernel (from a source and in place); and,
//! as ignored tests, over all 2^32 f32 patterns for two formats.

use qcandle::backend::cpu::quantize_slice;
use qcandle::backend::lns_plan::{LnsF32Plan, MAX_FRACTION_BITS};
use qcandle::format::lns::Lns;
use qcandle::format::rounding::{
    NearestAway, NearestEven, RoundingRule, RuleKind, Stochastic, TowardZero,
};
use qcandle::philox::Stream;
use qcandle::{Format, Rounding};
use rayon::prelude::*;

/// Formats with f = 0, 3, 7, 10, 16, 23 and w from 3 to 32.
fn formats() -> Vec<Lns> {
    [
        (3, 0),
        (8, 0),
        (32, 0),
        (5, 3),
        (8, 3),
        (12, 3),
        (9, 7),
        (12, 7),
        (16, 7),
        (12, 10),
        (16, 10),
        (32, 10),
        (18, 16),
        (32, 16),
        (25, 23),
        (32, 23),
    ]
    .iter()
    .map(|&(w, f)| Lns::new(w, f).unwrap())
    .collect()
}

fn scalar<R: RoundingRule>(lns: &Lns, x: f32, rule: R, random: u32) -> f32 {
    lns.round_stored(x as f64, rule, random, |v| v as f32 as f64) as f32
}

fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Mantissas where the code may change or the bucket changes, with neighbours: the f32
/// mantissas near each nearest midpoint `2^((j + 1/2)/2^f)`, each value `2^(j/2^f)` and its
/// stored f32, and each bucket boundary.
fn critical_mantissas(lns: &Lns, index_bits: u32) -> Vec<u32> {
    let f = lns.f();
    let n = 1u64 << f;
    let mut out = vec![0, 1, 2, (1 << 23) - 2, (1 << 23) - 1];
    let mut near = |v: f64| {
        let m = ((v - 1.0) * (1u64 << 23) as f64).floor() as i64;
        for d in -2..=2 {
            let c = m + d;
            if (0..1 << 23).contains(&c) {
                out.push(c as u32);
            }
        }
    };
    for j in 0..n {
        near(((j as f64 + 0.5) / n as f64).exp2());
        near((j as f64 / n as f64).exp2());
        let stored = Lns::new(32, f).unwrap().value(j as i64) as f32 as f64;
        if stored < 2.0 {
            near(stored);
        }
    }
    for b in 0..1u32 << index_bits {
        let start = b << (23 - index_bits);
        out.extend([start, start.saturating_sub(1), start + 1]);
    }
    out.retain(|&m| m < 1 << 23);
    out.sort_unstable();
    out.dedup();
    out
}

/// Random words that exercise stochastic rounding: both ends and a few mixed ones.
const WORDS: [u32; 4] = [0, u32::MAX, 0x8000_0000, 0x1234_5678];

/// Compares the plan with the scalar rounding for `mantissas` x `bytes` x both signs;
/// returns how many inputs the fast path decided.
fn compare<R: RoundingRule>(
    lns: &Lns,
    plan: &LnsF32Plan,
    rule: R,
    mantissas: &[u32],
    bytes: &[u32],
) -> usize {
    let words: &[u32] = if R::KIND == RuleKind::Stochastic {
        &WORDS
    } else {
        &[0]
    };
    mantissas
        .par_iter()
        .map(|&m| {
            let mut fast = 0;
            for &byte in bytes {
                for sign in [0, 1u32 << 31] {
                    let x = f32::from_bits(sign | byte << 23 | m);
                    for &r in words {
                        let want = scalar(lns, x, rule, r);
                        let got = plan.round(x, rule, r);
                        assert!(
                            same(got, want),
                            "lns<{},{}> {:?} x = {x:e} ({:#010x}) r = {r:#x}: fast {got:e} ({:#010x}) vs scalar {want:e} ({:#010x})",
                            lns.w(),
                            lns.f(),
                            R::KIND,
                            x.to_bits(),
                            got.to_bits(),
                            want.to_bits()
                        );
                        fast += plan.round_fast(x, rule, r).is_some() as usize;
                    }
                }
            }
            fast
        })
        .sum()
}

fn check_format<R: RoundingRule>(lns: &Lns, rule: R) {
    let Some(plan) = LnsF32Plan::new(lns, R::KIND) else {
        assert!(
            lns.f() > MAX_FRACTION_BITS,
            "lns<{},{}> has no plan",
            lns.w(),
            lns.f()
        );
        return;
    };
    assert!(plan.index_bits() <= 23);
    let mantissas = critical_mantissas(lns, plan.index_bits());
    // Every critical mantissa in binade 0; a subset of them in the binades around both
    // clamps and the ends of f32's range; a sparser subset with every exponent byte.
    let fast = compare(lns, &plan, rule, &mantissas, &[127]);
    assert!(
        fast > 0,
        "lns<{},{}>: the fast path decided nothing",
        lns.w(),
        lns.f()
    );
    let n = 1i64 << lns.f();
    let mut ends: Vec<u32> = vec![0, 1, 2, 126, 128, 252, 253, 254, 255];
    for k in [lns.k_min(), lns.k_max(), lns.k_min() - n] {
        let byte = k.div_euclid(n) + 127;
        ends.extend(
            (byte - 2..=byte + 2)
                .filter(|b| (0..256).contains(b))
                .map(|b| b as u32),
        );
    }
    ends.sort_unstable();
    ends.dedup();
    let subset: Vec<u32> = mantissas
        .iter()
        .copied()
        .step_by(mantissas.len().div_ceil(2048).max(1))
        .collect();
    compare(lns, &plan, rule, &subset, &ends);
    let all_bytes: Vec<u32> = (0..256).collect();
    let sparse: Vec<u32> = mantissas
        .iter()
        .copied()
        .step_by(mantissas.len().div_ceil(256).max(1))
        .collect();
    compare(lns, &plan, rule, &sparse, &all_bytes);
}

#[test]
fn nearest_even_equals_the_scalar_rounding_at_every_threshold() {
    for lns in formats() {
        check_format(&lns, NearestEven);
    }
}

#[test]
fn nearest_away_equals_the_scalar_rounding_at_every_threshold() {
    for lns in formats() {
        check_format(&lns, NearestAway);
    }
}

#[test]
fn toward_zero_equals_the_scalar_rounding_at_every_threshold_with_kept_values() {
    for lns in formats() {
        check_format(&lns, TowardZero);
    }
}

#[test]
fn stochastic_equals_the_scalar_rounding_at_every_threshold() {
    for lns in formats() {
        for bits in [3, 23] {
            check_format(&lns, Stochastic { bits });
        }
    }
}

#[test]
fn every_stored_value_is_kept_by_the_fast_path() {
    // Rounding the f32 of every value again gives it back, in every mode (toward-zero and
    // stochastic through the kept-values rule where the f32 lies below 2^(k/2^f)).
    for (w, f) in [(12, 7), (16, 10), (20, 16)] {
        let lns = Lns::new(w, f).unwrap();
        let values: Vec<f32> = (lns.k_min()..=lns.k_max())
            .map(|k| lns.value(k) as f32)
            .filter(|v| v.is_normal())
            .collect();
        for kind in [
            RuleKind::NearestEven,
            RuleKind::TowardZero,
            RuleKind::Stochastic,
        ] {
            let plan = LnsF32Plan::new(&lns, kind).unwrap();
            for &v in &values {
                for r in WORDS {
                    let (got, want) = match kind {
                        RuleKind::NearestEven => (
                            plan.round(v, NearestEven, r),
                            scalar(&lns, v, NearestEven, r),
                        ),
                        RuleKind::TowardZero => {
                            (plan.round(v, TowardZero, r), scalar(&lns, v, TowardZero, r))
                        }
                        _ => {
                            let rule = Stochastic { bits: 23 };
                            (plan.round(v, rule, r), scalar(&lns, v, rule, r))
                        }
                    };
                    assert_eq!(got, want, "lns<{w},{f}> {kind:?} {v:e} r = {r:#x}");
                    if kind != RuleKind::Stochastic {
                        assert_eq!(got, v, "lns<{w},{f}> {kind:?} {v:e}");
                    }
                }
            }
        }
    }
}

/// Bucket tables index the mantissa's top `f + 1` bits (stochastic rounding), and at
/// least 7 - f bits for deterministic rules, whose 64-bit entries hold the offset step
/// (`24 - f` bits) beside the threshold's position.
#[test]
fn plans_index_the_mantissas_top_f_plus_one_bits() {
    for (w, f) in [(3, 0), (8, 3), (16, 10), (32, 16)] {
        let lns = Lns::new(w, f).unwrap();
        for kind in [RuleKind::NearestEven, RuleKind::TowardZero] {
            let plan = LnsF32Plan::new(&lns, kind).unwrap();
            assert_eq!(
                plan.index_bits(),
                (f + 1).max(7u32.saturating_sub(f)),
                "lns<{w},{f}> {kind:?}"
            );
        }
        let plan = LnsF32Plan::new(&lns, RuleKind::Stochastic).unwrap();
        assert_eq!(plan.index_bits(), f + 1, "lns<{w},{f}> stochastic");
    }
    assert!(LnsF32Plan::new(&Lns::new(32, 17).unwrap(), RuleKind::NearestEven).is_none());
}

/// Inputs for the kernel tests: a spread over many binades with specials mixed in.
fn kernel_inputs(n: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bits = (state >> 32) as u32;
            match i % 97 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::NAN,
                3 => f32::INFINITY,
                4 => f32::from_bits(bits & 0x807f_ffff),
                _ => {
                    // Exponent bytes spread around 127, some far out.
                    let byte = if i % 5 == 0 {
                        (bits >> 8) & 0xff
                    } else {
                        107 + (bits >> 8) % 40
                    };
                    f32::from_bits((bits & 0x807f_ffff) | byte << 23)
                }
            }
        })
        .collect()
}

#[test]
fn the_cpu_kernel_equals_the_scalar_rounding_from_a_source_and_in_place() {
    let n = 3 * (1 << 14) + 123;
    let xs = kernel_inputs(n);
    let stream = Stream::new(5, 2);
    for (w, f) in [(8, 3), (16, 10), (12, 0), (20, 16), (28, 20)] {
        let lns = Lns::new(w, f).unwrap();
        let format = Format::Lns(lns);
        for rounding in [
            Rounding::NearestEven,
            Rounding::NearestAway,
            Rounding::TowardZero,
            Rounding::Stochastic { bits: 23 },
            Rounding::Stochastic { bits: 4 },
        ] {
            let want: Vec<f32> = xs
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    let r = stream.at(i as u64);
                    match rounding {
                        Rounding::NearestEven => scalar(&lns, x, NearestEven, r),
                        Rounding::NearestAway => scalar(&lns, x, NearestAway, r),
                        Rounding::TowardZero => scalar(&lns, x, TowardZero, r),
                        Rounding::Stochastic { bits } => scalar(&lns, x, Stochastic { bits }, r),
                    }
                })
                .collect();
            let mut out = vec![0f32; n];
            quantize_slice(Some(&xs), &mut out, &[n], &format, rounding, Some(stream)).unwrap();
            let mut inplace = xs.clone();
            quantize_slice(None, &mut inplace, &[n], &format, rounding, Some(stream)).unwrap();
            for (i, (&x, &want)) in xs.iter().zip(&want).enumerate() {
                let (a, b) = (out[i], inplace[i]);
                assert!(
                    same(a, want) && same(b, want),
                    "lns<{w},{f}> {rounding} [{i}] {x:e}: {a:e} / {b:e} vs {want:e}"
                );
            }
        }
    }
}

/// The scalar rounding of every nonnegative f32 pattern up to +Inf, as the steps of a
/// nondecreasing function: `(first pattern, result bits)`, found by bisection with the
/// scalar rounding (deterministic rounding is monotone in `|x|`, and the bit order of
/// nonnegative f32s is their order, so between two steps the result is constant).
fn scalar_steps<R: RoundingRule>(lns: &Lns, rule: R) -> Vec<(u32, u32)> {
    const TOP: u32 = 0x7f80_0000;
    let result = |p: u32| scalar(lns, f32::from_bits(p), rule, 0).to_bits();
    let mut steps = vec![(0, result(0))];
    loop {
        let (p, r) = *steps.last().unwrap();
        if result(TOP) == r {
            return steps;
        }
        let (mut lo, mut hi) = (p + 1, TOP);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if result(mid) == r {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let next = result(lo);
        assert!(
            next > r,
            "the scalar rounding is not monotone at {lo:#010x}"
        );
        steps.push((lo, next));
    }
}

/// All 2^32 f32 patterns through the kernel against the scalar rounding: the nonnegative
/// ones read off [`scalar_steps`], negative ones the negated result (zero stays +0, signs
/// are handled apart), NaNs give NaN.
fn exhaustive<R: RoundingRule>(lns: Lns, rule: R, rounding: Rounding) {
    // A positive result of zero is then the zero code (+0 for both signs).
    assert_ne!(lns.min_positive() as f32, 0.0);
    let format = Format::Lns(lns);
    let steps = scalar_steps(&lns, rule);
    // The negation of -x's rounding is x's: check on every step and its predecessor.
    for &(p, _) in &steps {
        for q in [p, p.saturating_sub(1)] {
            let neg = scalar(&lns, -f32::from_bits(q), rule, 0).to_bits();
            let pos = scalar(&lns, f32::from_bits(q), rule, 0).to_bits();
            assert_eq!(neg, if pos == 0 { 0 } else { pos | 1 << 31 }, "{q:#010x}");
        }
    }
    const BLOCK: u64 = 1 << 22;
    let failures: usize = (0..(1u64 << 32) / BLOCK)
        .into_par_iter()
        .map(|b| {
            let first = (b * BLOCK) as u32;
            let xs: Vec<f32> = (0..BLOCK as u32)
                .map(|i| f32::from_bits(first + i))
                .collect();
            let mut out = vec![0f32; BLOCK as usize];
            quantize_slice(
                Some(&xs),
                &mut out,
                &[BLOCK as usize],
                &format,
                rounding,
                None,
            )
            .unwrap();
            let mut step = steps.partition_point(|&(p, _)| p <= first & 0x7fff_ffff) - 1;
            let mut bad = 0;
            for (&x, &got) in xs.iter().zip(&out) {
                let bits = x.to_bits();
                let abs = bits & 0x7fff_ffff;
                let want = if abs > 0x7f80_0000 {
                    f32::NAN
                } else {
                    while step + 1 < steps.len() && steps[step + 1].0 <= abs {
                        step += 1;
                    }
                    let r = steps[step].1;
                    f32::from_bits(if r == 0 { 0 } else { r | (bits & 1 << 31) })
                };
                if !same(got, want) {
                    if bad < 5 {
                        eprintln!(
                            "lns<{},{}> {rounding} {x:e} ({bits:#010x}): {got:e} vs {want:e}",
                            lns.w(),
                            lns.f()
                        );
                    }
                    bad += 1;
                }
            }
            bad
        })
        .sum();
    assert_eq!(failures, 0, "mismatches");
}

#[test]
#[ignore = "all 2^32 f32 inputs; run by .ci/run with --ignored"]
fn every_f32_rounds_like_the_scalar_path_lns_8_3_nearest_even() {
    exhaustive(Lns::new(8, 3).unwrap(), NearestEven, Rounding::NearestEven);
}

#[test]
#[ignore = "all 2^32 f32 inputs; run by .ci/run with --ignored"]
fn every_f32_rounds_like_the_scalar_path_lns_16_10_toward_zero() {
    exhaustive(Lns::new(16, 10).unwrap(), TowardZero, Rounding::TowardZero);
}

#[test]
#[ignore = "all 2^32 f32 inputs; run by .ci/run with --ignored"]
fn every_f32_rounds_like_the_scalar_path_lns_12_7_nearest_away() {
    exhaustive(Lns::new(12, 7).unwrap(), NearestAway, Rounding::NearestAway);
}

#[test]
fn inputs_below_min_are_not_kept_as_codes_outside_the_format() {
    // 2^(-1006/8) is an f32 (and the stored value of k = -1006 in a wide format), but lns<5,3>
    // ends at k_min = -7: toward-zero and stochastic give zero, not the input.
    let lns = Lns::new(5, 3).unwrap();
    let x = (-1006f64 / 8.0).exp2() as f32;
    assert_eq!(x.to_bits(), 0x009837f0);
    assert_eq!(scalar(&lns, x, TowardZero, 0), 0.0);
    assert_eq!(scalar(&lns, x, Stochastic { bits: 23 }, u32::MAX), 0.0);
    let plan = LnsF32Plan::new(&lns, RuleKind::TowardZero).unwrap();
    assert_eq!(plan.round(x, TowardZero, 0), 0.0);
}

/// Stochastic rounding on random inputs (N(0, 1)-like magnitudes and every binade) with
/// random words and several random-bit counts: the per-element fast path equals the scalar
/// rounding, and it leaves almost every element to itself (the error bound is far below
/// the gaps between thresholds).
#[test]
fn stochastic_fast_path_equals_the_scalar_rounding_and_decides_almost_everything() {
    let stream = Stream::new(77, 5);
    for (w, f, most_slow) in [(8, 3, 1e-4), (16, 10, 1e-4), (12, 0, 1e-4), (20, 16, 1e-3)] {
        let lns = Lns::new(w, f).unwrap();
        let plan = LnsF32Plan::new(&lns, RuleKind::Stochastic).unwrap();
        let n = 400_000u64;
        let slow: usize = (0..n)
            .into_par_iter()
            .map(|i| {
                let bits = stream.at(2 * i);
                let r = stream.at(2 * i + 1);
                let byte = if i % 4 == 0 {
                    bits >> 24
                } else {
                    125 + (bits >> 24) % 5
                };
                let x = f32::from_bits((bits & 0x807f_ffff) | byte << 23);
                let rule = Stochastic {
                    bits: [23, 8, 1][i as usize % 3],
                };
                let want = scalar(&lns, x, rule, r);
                let got = plan.round(x, rule, r);
                assert!(
                    same(got, want),
                    "lns<{w},{f}> {x:e} r = {r:#x} bits {}: {got:e} vs {want:e}",
                    rule.bits
                );
                // Binades 2^-2 ..= 2^2, inside every one of these formats' range (stochastic
                // underflow takes the scalar path by design).
                let inside = i % 4 != 0;
                (inside && plan.round_fast(x, rule, r).is_none()) as usize
            })
            .sum();
        let share = slow as f64 / (n as f64 * 0.75);
        assert!(
            share <= most_slow,
            "lns<{w},{f}>: {share} of the inputs take the scalar path"
        );
    }
}
