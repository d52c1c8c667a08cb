//! The f32 fast path (`F32Plan`, rounding on the f32 bit pattern through an exponent-byte
//! table) must give bit-identical results to the general f64 path (`Format::round_rule`),
//! which the oracle tests check against softposit, half and slow references.
//!
//! Covered: every exponent byte with the mantissas that sit on, just below and just above
//! each possible rounding position (ties and near-ties for every `s`), 1e6 random patterns,
//! both signs, every rounding mode, for formats of each family and every case of the table
//! (exact, round, tiny, posit clamps, slow), from a separate input and in place. The exhaustive comparison over all 2^32 inputs
//! is `#[ignore]`d and run by `.ci/run`.

use qcandle::backend::f32_plan::{F32Plan, RunRounder};
use qcandle::format::rounding::{NearestAway, NearestEven, RoundingRule, Stochastic, TowardZero};
use qcandle::philox::Stream;
use qcandle::Format;
use rayon::prelude::*;

const FORMATS: &[&str] = &[
    "posit<8,0>",
    "posit<8,2>",
    "posit<16,1>",
    "posit<16,3>",
    "posit<32,2>",
    "posit<6,5>",
    "posit<10,4>",
    "fp16",
    "bf16",
    "e4m3",
    "float<4,3,fn,sat>",
    "e5m2",
    "float<5,2,sat>",
    "e2m1",
    "float<5,2,nosub>",
    "float<8,23,fin>",
    "fixed<8,4>",
    "fixed<8,4,sym>",
    "fixed<16,20,noclamp>",
    "fixed<32,0>",
];

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
        || (a.is_nan() && b.is_nan() && a.is_sign_negative() == b.is_sign_negative())
}

/// The vectorised pass over `xs` with the general path for the elements it leaves, from a separate input and in place (where elements left to the general path keep their input and are
/// found again by `needs_slow` on the buffer, as `kernels::cpu` does).
fn runs<P: RunRounder, R: RoundingRule>(
    plan: &P,
    xs: &[f32],
    rule: R,
    random: &[u32],
    slow: impl Fn(f64, u32) -> f64,
) -> (Vec<f32>, Vec<f32>) {
    let fix = |x: f32, r: u32| slow(x as f64, r) as f32;
    let mut run = vec![0f32; xs.len()];
    if plan.round_run(xs, &mut run, rule, random) {
        for (j, &x) in xs.iter().enumerate() {
            if plan.needs_slow(x) {
                run[j] = fix(x, random[j]);
            }
        }
    }
    let mut in_place = xs.to_vec();
    if plan.round_run_in_place(&mut in_place, rule, random) {
        for (v, &r) in in_place.iter_mut().zip(random) {
            if plan.needs_slow(*v) {
                *v = fix(*v, r);
            }
        }
    }
    (run, in_place)
}

/// Counts inputs where the fast path differs from the general path: both the per-element
/// `F32Plan::round` and the vectorised `F32Plan::round_run` (with its general-path fixups).
fn mismatches<R: RoundingRule>(
    format: &Format,
    rule: R,
    inputs: impl Iterator<Item = u32>,
) -> usize {
    let plan = F32Plan::new(format, R::KIND).expect("elementwise format");
    let slow = |v: f64, r: u32| format.round_rule(v, rule, r);
    let xs: Vec<f32> = inputs.map(f32::from_bits).collect();
    let random: Vec<u32> = xs.iter().map(|x| random_word(x.to_bits())).collect();
    let (run, in_place) = runs(&plan, &xs, rule, &random, slow);
    let mut bad = 0;
    for (j, &x) in xs.iter().enumerate() {
        let fast = plan.round(x, rule, random[j], slow);
        let general = format.round_rule(x as f64, rule, random[j]) as f32;
        if !same(fast, general) || !same(run[j], general) || !same(in_place[j], general) {
            if bad < 5 {
                eprintln!(
                    "{format} {:?}: x = {x:e} ({:#010x}): fast {fast:e} run {:e} general {general:e}",
                    R::KIND,
                    x.to_bits(),
                    run[j]
                );
            }
            bad += 1;
        }
    }
    bad
}

/// A cheap well-mixed random word per input (the fast and general paths only need to agree
/// for the same word; the Philox stream itself is tested elsewhere).
fn random_word(bits: u32) -> u32 {
    let mut h = bits.wrapping_mul(0x9E37_79B9) ^ 0x85EB_CA6B;
    h ^= h >> 16;
    h = h.wrapping_mul(0x7FEB_352D);
    h ^ (h >> 15)
}

/// Every exponent byte, with mantissas at and around every rounding position.
fn structured_inputs() -> Vec<u32> {
    let mut v = Vec::new();
    for sign in [0u32, 0x8000_0000] {
        for eb in 0..256u32 {
            let mut mants = vec![0u32, 1, 2, 0x7f_ffff, 0x40_0000, 0x3f_ffff];
            for s in 1..24u32 {
                let half = 1u32 << (s - 1);
                for base in [0u32, 1 << s, 0x7f_ffff & !((1 << s) - 1)] {
                    for m in [half - 1, half, half + 1] {
                        mants.push((base | m) & 0x7f_ffff);
                    }
                }
            }
            v.extend(mants.into_iter().map(|m| sign | (eb << 23) | m));
        }
    }
    v
}

fn random_inputs(n: usize) -> Vec<u32> {
    let stream = Stream::new(2024, 7);
    (0..n as u64).map(|i| stream.at(i)).collect()
}

fn check_all_rules(inputs: &[u32]) {
    let mut total = 0;
    for name in FORMATS {
        let format: Format = name.parse().unwrap();
        total += mismatches(&format, NearestEven, inputs.iter().copied());
        total += mismatches(&format, NearestAway, inputs.iter().copied());
        total += mismatches(&format, TowardZero, inputs.iter().copied());
        total += mismatches(&format, Stochastic { bits: 23 }, inputs.iter().copied());
        total += mismatches(&format, Stochastic { bits: 4 }, inputs.iter().copied());
    }
    assert_eq!(total, 0, "fast path differs from the general path");
}

#[test]
fn fast_path_equals_general_path_at_every_rounding_position() {
    check_all_rules(&structured_inputs());
}

#[test]
fn fast_path_equals_general_path_on_random_f32() {
    check_all_rules(&random_inputs(200_000));
}

#[test]
fn block_floating_point_has_no_elementwise_plan() {
    let format: Format = "block<8>".parse().unwrap();
    assert!(F32Plan::new(&format, NearestEven::KIND).is_none());
}

fn exhaustive<R: RoundingRule>(name: &str, rule: R) {
    let format: Format = name.parse().unwrap();
    let bad: usize = (0..1u64 << 16)
        .into_par_iter()
        .map(|hi| {
            let lo = (hi << 16) as u32;
            mismatches(&format, rule, (0..1u32 << 16).map(move |l| lo | l))
        })
        .sum();
    assert_eq!(bad, 0, "{name}: fast path differs on {bad} f32 inputs");
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn fast_path_equals_general_path_on_every_f32_nearest_even() {
    for name in ["posit<8,0>", "posit<16,1>", "e4m3", "fixed<8,4>"] {
        exhaustive(name, NearestEven);
    }
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn fast_path_equals_general_path_on_every_f32_stochastic() {
    exhaustive("posit<16,1>", Stochastic { bits: 23 });
}

/// The block fast path against `Block::round` for blocks whose maxima sit in every binade
/// class (normal, near the top of f32, tiny), on the structured inputs, every mode.
#[test]
fn block_fast_path_equals_general_path() {
    use qcandle::backend::f32_plan::BlockF32Plan;
    use qcandle::format::{Block, BlockScope};
    fn check<R: RoundingRule>(rule: R, inputs: &[u32]) -> usize {
        let stream = Stream::new(5, 1);
        let mut bad = 0;
        for wl in [2u32, 4, 8, 16, 32] {
            let b = Block::new(wl, BlockScope::Tensor).unwrap();
            for max in [
                1.0f64,
                3.7,
                1e-3,
                6e37,
                f32::MAX as f64,
                1.2e-38,
                3e-41,
                0.0,
            ] {
                let plan = BlockF32Plan::new(&b, max);
                let slow = |v: f64, r: u32| b.round(v, max, rule, r);
                let xs: Vec<f32> = inputs.iter().map(|&b| f32::from_bits(b)).collect();
                let random: Vec<u32> = inputs.iter().map(|&b| stream.at(b as u64)).collect();
                let (run, in_place) = runs(&plan, &xs, rule, &random, slow);
                for (j, &x) in xs.iter().enumerate() {
                    let r = random[j];
                    let fast = plan.round(x, rule, r, slow);
                    let general = b.round(x as f64, max, rule, r) as f32;
                    if !same(fast, general) || !same(run[j], general) || !same(in_place[j], general)
                    {
                        if bad < 5 {
                            eprintln!("block<{wl}> max {max:e} {:?}: x = {x:e}: fast {fast:e} general {general:e}", R::KIND);
                        }
                        bad += 1;
                    }
                }
            }
        }
        bad
    }
    let inputs = structured_inputs();
    let bad = check(NearestEven, &inputs)
        + check(NearestAway, &inputs)
        + check(TowardZero, &inputs)
        + check(Stochastic { bits: 23 }, &inputs)
        + check(Stochastic { bits: 3 }, &inputs);
    assert_eq!(bad, 0);
}

/// The uniform-grid plan the kernel rounds fixed point with (`BlockF32Plan::from_fixed`:
/// the rounding bit from the exponent byte, no table) equals the general path at every
/// rounding position of every exponent byte and on random inputs, allocating and in place,
/// for clamped, symmetric, unclamped and 32-bit fixed point, quanta of 2^-64 and 2^64, and
/// every mode.
#[test]
fn fixed_uniform_grid_plan_equals_general_path() {
    use qcandle::backend::f32_plan::BlockF32Plan;
    fn check<R: RoundingRule>(rule: R, inputs: &[u32]) -> usize {
        let mut bad = 0;
        // The list's fixed point, and grids at the ends of the fl range.
        let extremes = [
            "fixed<8,64>",
            "fixed<8,-64>",
            "fixed<31,40,sym>",
            "fixed<4,-20,noclamp>",
        ];
        for name in FORMATS
            .iter()
            .filter(|n| n.starts_with("fixed"))
            .chain(&extremes)
        {
            let format: Format = name.parse().expect("a format");
            let Format::Fixed(f) = format else {
                unreachable!("{name} is fixed point")
            };
            let plan = BlockF32Plan::from_fixed(&f);
            let slow = |v: f64, r: u32| f.round(v, rule, r);
            let xs: Vec<f32> = inputs.iter().map(|&b| f32::from_bits(b)).collect();
            let random: Vec<u32> = inputs.iter().map(|&b| random_word(b)).collect();
            let (run, in_place) = runs(&plan, &xs, rule, &random, slow);
            for (j, &x) in xs.iter().enumerate() {
                let general = f.round(x as f64, rule, random[j]) as f32;
                if !same(run[j], general) || !same(in_place[j], general) {
                    if bad < 5 {
                        eprintln!(
                            "{name} {:?}: x = {x:e}: run {:e} in place {:e} general {general:e}",
                            R::KIND,
                            run[j],
                            in_place[j]
                        );
                    }
                    bad += 1;
                }
            }
        }
        bad
    }
    let mut inputs = structured_inputs();
    inputs.extend(random_inputs(1 << 16));
    let bad = check(NearestEven, &inputs)
        + check(NearestAway, &inputs)
        + check(TowardZero, &inputs)
        + check(Stochastic { bits: 23 }, &inputs)
        + check(Stochastic { bits: 3 }, &inputs);
    assert_eq!(bad, 0);
}

/// The kernel itself (`backend::cpu::quantize_slice` on f32, which rounds fixed point through
/// the uniform-grid plan) against `Fixed::round` with the same stream words, on every f32
/// bit pattern, nearest-even and stochastic. Each run of 2^16 patterns is rounded with its
/// own stream (call index = the run), element `j` reading word `j`.
#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn kernel_fixed_point_equals_general_path_on_every_f32() {
    use qcandle::backend::cpu::quantize_slice;
    use qcandle::Rounding;
    let format: Format = "fixed<8,4>".parse().unwrap();
    for rounding in [Rounding::NearestEven, Rounding::Stochastic { bits: 23 }] {
        let bad: usize = (0..1u64 << 16)
            .into_par_iter()
            .map(|hi| {
                let src: Vec<f32> = (0..1u32 << 16)
                    .map(|l| f32::from_bits(((hi as u32) << 16) | l))
                    .collect();
                let stream = Stream::new(17, hi);
                let mut out = vec![0f32; src.len()];
                quantize_slice(
                    Some(&src),
                    &mut out,
                    &[src.len()],
                    &format,
                    rounding,
                    Some(stream),
                )
                .expect("fixed point rounds any shape");
                let mut words = vec![0u32; src.len()];
                if rounding.is_stochastic() {
                    stream.fill(0, &mut words);
                }
                src.iter()
                    .zip(&out)
                    .zip(&words)
                    .filter(|((&x, &y), &r)| !same(y, format.round(x as f64, rounding, r) as f32))
                    .count()
            })
            .sum();
        assert_eq!(
            bad, 0,
            "{format} {rounding}: the kernel differs on {bad} f32 inputs"
        );
    }
}
