//! The naive GEMM's register kernel (`quire::naive_lanes`, through `NaiveF32::gemm`) under
//! every instruction set this CPU has (`backend::isa::set_cap`) against the definition one
//! scalar operation at a time: `c = S(c + P(a_t · b_t))` from zero, `k` ascending, then
//! `S(c + bias)` and, with an accumulator format, the output rounded to the operand format;
//! each operation computed in f64 rounded to odd and rounded once by `Format::round`.
//! Posits and floats, `naive` and `naive:<A>` (also mixing posit and float), odd shapes
//! with partial tiles, bias per column and per row, and edge values: zeros, values near
//! minpos and maxpos (saturation), products below the float's range, NaR and NaN, float
//! overflow. The f32 entry (`NaiveF32::gemm_f32`) in bands of rows on pools of 2 to 4
//! threads, every operand layout, against the f64 entry.
//!
//! The cap is process-wide, so the tests of this file take a lock while they hold one.

mod common;
#[path = "common/isa_cap.rs"]
mod isa_cap;
#[path = "common/layouts.rs"]
mod layouts;
#[path = "common/operands.rs"]
mod operands;

use common::SplitMix;
use isa_cap::on_every_isa;
use layouts::{pool, Layouts};
use operands::values;
use qcandle::backend::f32_plan::F32Plan;
use qcandle::format::rounding::RuleKind;
use qcandle::format::Rounding;
use qcandle::quire::gemm_cpu::Bias;
use qcandle::quire::naive_f32::NaiveF32;
use qcandle::quire::naive_lanes::{tile, Accumulator, Products, TILE};
use qcandle::quire::round_odd::{add_odd, mul_odd};
use qcandle::Format;

fn fmt(s: &str) -> Format {
    s.parse().expect("a format")
}

/// The definition, one output at a time (see the file docs); `acc` `None` for `naive`.
fn reference(
    op: &Format,
    acc: Option<&Format>,
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
    bias: &Bias,
) -> Vec<f64> {
    let p = |x: f64| op.round(x, Rounding::NearestEven, 0);
    let s = |x: f64| acc.unwrap_or(op).round(x, Rounding::NearestEven, 0);
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut c = 0.0;
            for t in 0..k {
                c = s(add_odd(c, p(mul_odd(a[i * k + t], b[t * n + j]))));
            }
            let bias_term = match bias {
                Bias::None => None,
                Bias::PerRow(v) => Some(v[i]),
                Bias::PerCol(v) => Some(v[j]),
            };
            if let Some(v) = bias_term {
                c = s(add_odd(c, v));
            }
            out[i * n + j] = if acc.is_some() { p(c) } else { c };
        }
    }
    out
}

fn same(x: f64, y: f64) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// The kernel of `(op, acc)` against the definition on `a`, `b`; panics with the first
/// mismatches.
fn check(
    what: &str,
    op: &Format,
    acc: Option<&Format>,
    a: &[f64],
    b: &[f64],
    dims: (usize, usize, usize),
    bias: Bias,
) {
    let kernel = match acc {
        None => NaiveF32::new(op),
        Some(acc) => NaiveF32::with_accumulator(op, acc, false),
    }
    .unwrap_or_else(|| panic!("{what}: the formats take the f32 kernel"));
    let (m, _, n) = dims;
    for parallel in [false, true] {
        let mut out = vec![0.0; m * n];
        kernel.gemm(a, b, dims, bias, &mut out, parallel);
        let want = reference(op, acc, a, b, dims, &bias);
        let bad: Vec<String> = out
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (x, y))| !same(**x, **y))
            .take(5)
            .map(|(i, (x, y))| format!("out[{i}] = {x:e}, definition {y:e}"))
            .collect();
        assert!(bad.is_empty(), "{what}: {}", bad.join("; "));
    }
}

/// `naive` and `naive:<A>` pairs the kernel takes: same shape, mixed shapes, exact and
/// inexact products.
const PAIRS: &[(&str, Option<&str>)] = &[
    ("posit<16,1>", None),
    ("posit<16,2>", None),
    ("posit<16,0>", None),
    ("posit<8,0>", None),
    ("posit<12,1>", None),
    ("posit<24,1>", None),
    ("fp16", None),
    ("e4m3", None),
    ("e5m2", None),
    ("float<5,2>", None),
    ("float<4,3,fn>", None),
    ("float<5,10,sat>", None),
    ("float<5,10,nosub>", None),
    ("e4m3", Some("fp16")),
    ("e5m2", Some("fp16")),
    ("e4m3", Some("posit<16,1>")),
    ("posit<8,0>", Some("posit<16,1>")),
    ("posit<16,1>", Some("fp16")),
    ("fp16", Some("e5m2")),
    ("e4m3", Some("bf16")),
    ("e5m2", Some("bf16")),
    ("fp16", Some("bf16")),
    ("float<5,6>", Some("float<5,3>")),
];

#[test]
fn register_kernel_equals_the_definition_on_every_instruction_set() {
    on_every_isa(|isa| {
        for &(op, acc) in PAIRS {
            let (opf, accf) = (fmt(op), acc.map(fmt));
            // n = 150: two full tiles and a partial one; n = 7: one partial tile.
            for (seed, dims) in [(1, (5, 37, 150)), (2, (3, 61, 7)), (3, (2, 1, 65))] {
                let (m, k, n) = dims;
                let a = values(&opf, m * k, seed);
                let b = values(&opf, k * n, seed + 10);
                let bias_f = accf.unwrap_or(opf);
                let col = values(&bias_f, n, seed + 20);
                let row = values(&bias_f, m, seed + 30);
                let what = format!("{op} sums in {acc:?}, {isa:?}, {dims:?}");
                check(&what, &opf, accf.as_ref(), &a, &b, dims, Bias::None);
                check(&what, &opf, accf.as_ref(), &a, &b, dims, Bias::PerCol(&col));
                check(&what, &opf, accf.as_ref(), &a, &b, dims, Bias::PerRow(&row));
            }
            // No terms: the sum is zero (plus the bias).
            let bias = [1.5, -0.25];
            check(
                "k = 0",
                &opf,
                accf.as_ref(),
                &[],
                &[],
                (1, 0, 2),
                Bias::PerCol(&bias),
            );
        }
    });
}

/// Long sums of large values saturate posits at maxpos and overflow fp16 (to Inf, then the
/// scalar definition takes the tile), products far below the floats' range round to zero
/// or the smallest subnormal, and sums of opposite values cancel exactly.
#[test]
fn saturation_overflow_and_cancellation_equal_the_definition() {
    on_every_isa(|isa| {
        for &(op, acc) in PAIRS {
            let (opf, accf) = (fmt(op), acc.map(fmt));
            let (max, min) = (opf.max_finite().unwrap(), opf.min_positive().unwrap());
            let (m, k, n) = (4, 40, 70);
            let a: Vec<f64> = (0..m * k)
                .map(|i| match i / k {
                    0 => max,
                    1 => min,
                    2 => (if i % 2 == 0 { 1.0 } else { -1.0 }) * max,
                    _ => opf.round(1.0 + (i % 5) as f64 / 8.0, Rounding::NearestEven, 0),
                })
                .collect();
            let b: Vec<f64> = (0..k * n)
                .map(|i| match i % 4 {
                    0 => max,
                    1 => min,
                    2 => 1.0,
                    _ => -min,
                })
                .collect();
            let what = format!("{op} sums in {acc:?}, {isa:?}, edge values");
            check(&what, &opf, accf.as_ref(), &a, &b, (m, k, n), Bias::None);
        }
    });
}

/// A NaR (NaN) operand makes its outputs NaN and takes only its own tile off the register
/// kernel: the other tiles still equal the definition.
#[test]
fn nar_and_nan_take_their_tile_to_the_definition() {
    on_every_isa(|isa| {
        for &(op, acc) in PAIRS {
            let (opf, accf) = (fmt(op), acc.map(fmt));
            let (m, k, n) = (3, 9, 140);
            let a = values(&opf, m * k, 7);
            let mut b = values(&opf, k * n, 8);
            b[4 * n + 70] = f64::NAN;
            let what = format!("{op} sums in {acc:?}, {isa:?}, NaN operand");
            check(&what, &opf, accf.as_ref(), &a, &b, (m, k, n), Bias::None);
            let kernel = NaiveF32::new(&opf).unwrap();
            let mut out = vec![0.0; m * n];
            kernel.gemm(&a, &b, (m, k, n), Bias::None, &mut out, false);
            assert!(out[70].is_nan() && out[n + 70].is_nan(), "{what}");
        }
    });
}

/// The tile itself finishes in registers for finite operands (it does not hand every tile
/// to the scalar definition) and its sums equal the definition's before the bias.
#[test]
fn tiles_of_finite_operands_finish_in_registers() {
    on_every_isa(|isa| {
        for op in ["posit<16,1>", "posit<16,2>", "posit<8,0>", "e4m3", "fp16"] {
            let f = fmt(op);
            let plan = F32Plan::new(&f, RuleKind::NearestEven).unwrap();
            let exact = matches!(op, "posit<16,2>" | "posit<8,0>" | "e4m3");
            let k = 50;
            let posit = op.starts_with("posit");
            // Floats: magnitudes in [1/2, 2), so that sums of 50 products cannot overflow.
            let moderate = |count: usize, seed: u64| -> Vec<f64> {
                let mut rng = SplitMix(seed);
                (0..count)
                    .map(|_| {
                        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                        f.round(
                            4f64.powf(u - 0.5) * (2.0 * (u * 1e6).fract().round() - 1.0),
                            Rounding::NearestEven,
                            0,
                        )
                    })
                    .collect()
            };
            let (a, b) = if posit {
                (values(&f, k, 11), values(&f, k * TILE, 12))
            } else {
                (moderate(k, 11), moderate(k * TILE, 12))
            };
            let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
            let mut acc = [0f32; TILE];
            let products = if exact {
                Products::RoundedExact
            } else {
                Products::Rounded
            };
            let done = tile(
                &plan,
                Accumulator::Plan(&plan),
                products,
                &a32,
                &b32,
                TILE,
                &mut acc,
            );
            let want = reference(&f, None, &a, &b, (1, k, TILE), &Bias::None);
            assert!(done, "{op} {isa:?}: the tile finished in registers");
            for (j, (&got, &w)) in acc.iter().zip(&want).enumerate() {
                assert!(
                    same(got as f64, w),
                    "{op} {isa:?} column {j}: {got:e}, definition {w:e}"
                );
            }
        }
    });
}

/// posit<16,1> products near 1 have up to 26 bits: pairs whose exact product lies one unit
/// of 2^-24 off a midpoint between neighbouring posits (where a product rounded to nearest
/// in f32 would land on the midpoint and round to even, possibly the wrong way). Each pair
/// is one column: `b` is diagonal, so output `j` is `P(x_j y_j)` plus exact zeros.
#[test]
fn posit16_products_next_to_a_midpoint_round_correctly() {
    let f = fmt("posit<16,1>");
    // x = 1 + i/4096 and y = 1 + j/4096 are posit<16,1> values (12 fraction bits near 1);
    // 2^24 x y = (4096 + i)(4096 + j), and the midpoints of [1, 2) are the odd multiples
    // of 2^11 there.
    let mut pairs = Vec::new();
    for i in (1..4096u64).step_by(3) {
        for j in (1..4096u64).step_by(2) {
            let p = (4096 + i) * (4096 + j);
            if p < 1 << 25 && matches!(p % (1 << 12), 2047 | 2049) {
                pairs.push((1.0 + i as f64 / 4096.0, 1.0 + j as f64 / 4096.0));
            }
        }
    }
    assert!(pairs.len() >= 2 * TILE, "{} pairs found", pairs.len());
    on_every_isa(|isa| {
        for group in pairs.chunks_exact(TILE).take(4) {
            let a: Vec<f64> = group.iter().map(|p| p.0).collect();
            let mut b = vec![0.0; TILE * TILE];
            for (j, p) in group.iter().enumerate() {
                b[j * TILE + j] = p.1;
            }
            let what = format!("pairs from {:?}, {isa:?}", group[0]);
            check(&what, &f, None, &a, &b, (1, TILE, TILE), Bias::None);
        }
    });
}

/// The register kernel with roundings specialised to the formats (`quire::naive_special`,
/// on AVX-512 and on AVX2) finishes tiles of finite operands in registers, with the definition's sums: naive
/// posit<16,1> (products of up to 26 bits), e4m3 into fp16 (hardware conversion), bf16
/// (integer rounding) and posit<16,1> sums, and fp16 operands into fp16. A NaN operand
/// hands the tile to the scalar definition.
#[test]
fn specialised_tiles_equal_the_definition() {
    use qcandle::quire::lane_round::LaneRound;
    use qcandle::quire::naive_special::{self, SumLanes};
    on_every_isa(|isa| {
        for (op, acc) in [
            ("posit<16,1>", None),
            ("e4m3", Some("fp16")),
            ("e4m3", Some("bf16")),
            ("e4m3", Some("posit<16,1>")),
            ("fp16", None),
            ("e5m2", None),
        ] {
            let (opf, accf) = (fmt(op), acc.map(fmt));
            let sum_f = accf.unwrap_or(opf);
            let (r_op, r_sum) = (
                LaneRound::new(&opf).unwrap(),
                LaneRound::new(&sum_f).unwrap(),
            );
            let k = 60;
            let a = values(&opf, k, 21);
            let mut b = values(&opf, k * TILE, 22);
            let exact = matches!(op, "e4m3" | "e5m2" | "fp16");
            let products = if exact {
                Products::RoundedExact
            } else {
                Products::Rounded
            };
            let want = reference(&opf, accf.as_ref(), &a, &b, (1, k, TILE), &Bias::None);
            let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
            let mut acc32 = [0f32; TILE];
            let run = |b: &[f64], acc32: &mut [f32; TILE]| {
                let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
                let sum = SumLanes::Round(&r_sum);
                naive_special::tile(
                    Some(&r_op),
                    sum,
                    products,
                    &a32,
                    &b32,
                    (TILE, TILE),
                    acc32,
                    false,
                )
            };
            let Some(done) = run(&b, &mut acc32) else {
                assert_eq!(
                    isa,
                    qcandle::backend::isa::Isa::Portable,
                    "{op}: {isa:?} runs it"
                );
                continue;
            };
            // Finite sums finish in registers (the reference's outputs are the sums rounded
            // to the operand format, so compare where the accumulator is that format).
            let finite = want.iter().all(|v| v.is_finite());
            assert_eq!(done, finite, "{op} into {acc:?}: done");
            if done && acc.is_none() {
                for (j, (&got, &w)) in acc32.iter().zip(&want).enumerate() {
                    assert!(
                        same(got as f64, w),
                        "{op} column {j}: {got:e}, definition {w:e}"
                    );
                }
            }
            if done {
                for (j, &got) in acc32.iter().enumerate() {
                    let w = opf.round(got as f64, Rounding::NearestEven, 0);
                    assert!(
                        same(w, want[j]),
                        "{op} into {acc:?} column {j}: {w:e}, {:e}",
                        want[j]
                    );
                }
            }
            b[3 * TILE + 5] = f64::NAN;
            assert_eq!(run(&b, &mut acc32), Some(false), "{op}: a NaN operand");
        }
    });
}

/// `LaneRound::sums_exact`, which lets the AVX2 kernel add without rounding to odd: where
/// it holds, every sum of two values of the format is an f32 (all pairs checked); where it
/// does not, the largest value plus the smallest positive one is no f32, except for
/// float<4,10>, whose sums are all f32s though the bound misses it (a large value's
/// neighbours are coarse: the bound is sufficient, not necessary).
#[test]
fn sums_exact_holds_where_every_pair_of_values_sums_to_an_f32() {
    use qcandle::quire::lane_round::LaneRound;
    // x + y is an f32: the f64 sum is exact (TwoSum's error is zero) and an f32.
    let sum_is_f32 = |x: f64, y: f64| {
        let s = x + y;
        let yy = s - x;
        let error = (x - (s - yy)) + (y - yy);
        error == 0.0 && f64::from(s as f32) == s
    };
    let every_pair_sums_to_an_f32 = |values: &[f64]| {
        values
            .iter()
            .all(|&x| values.iter().all(|&y| sum_is_f32(x, y)))
    };
    let cases = [
        ("posit<8,0>", true),
        ("posit<6,1>", true),
        ("posit<10,0>", true),
        ("posit<13,0>", true),
        ("posit<7,1>", true),
        ("posit<14,0>", false),
        ("posit<8,1>", false),
        ("posit<8,2>", false),
        ("posit<16,1>", false),
        ("e4m3", true),
        ("float<4,3,fn,sat>", true),
        ("float<3,2>", true),
        ("float<2,1>", true),
        ("float<4,9>", true),
        ("float<4,10>", false),
        ("e5m2", false),
        ("fp16", false),
        ("bf16", false),
    ];
    for (name, exact) in cases {
        let format = fmt(name);
        let lanes = LaneRound::new(&format).unwrap_or_else(|| panic!("{name}: lanes"));
        assert_eq!(lanes.sums_exact(), exact, "{name}: sums_exact");
        let values = common::finite_values(&format);
        if exact || name == "float<4,10>" {
            assert!(
                every_pair_sums_to_an_f32(&values),
                "{name}: a sum is no f32"
            );
        } else {
            let max = values.iter().fold(0f64, |m, v| m.max(v.abs()));
            let min = values
                .iter()
                .filter(|v| **v > 0.0)
                .fold(f64::INFINITY, |m, &v| m.min(v));
            assert!(!sum_is_f32(max, min), "{name}: {max:e} + {min:e} is an f32");
        }
    }
}

/// `naive` in the 8-bit formats takes the register kernel's f32 entry where it runs with
/// specialised roundings (AVX2 with F16C, AVX-512; with sums exact in f32 for posit<8,0>
/// and e4m3), posit<8,0> its i16 lanes on AVX-512 and one lane at a time without the
/// register kernel, the others the operation tables through the rounded f64 path: the
/// same bits as the f64 definition under every cap, from f32 operands off the grid, with
/// a bias.
#[test]
fn naive_8bit_formats_take_the_register_kernel_where_it_is_specialised() {
    use qcandle::backend::isa::Isa;
    use qcandle::quire::quire_i16::Operand;
    use qcandle::quire::{Accumulate, GemmRule};
    on_every_isa(|isa| {
        for name in [
            "posit<8,0>",
            "e4m3",
            "e5m2",
            "posit<8,1>",
            "float<4,3,fn,sat>",
        ] {
            let format = fmt(name);
            let rule = GemmRule::new(&Accumulate::Naive, &format)
                .expect("rule")
                .expect("not f32");
            let kernel = NaiveF32::new(&format).expect("the register kernel admits it");
            let specialised = kernel.specialised();
            assert_eq!(
                specialised,
                isa != Isa::Portable,
                "{name}: specialised under {isa:?}"
            );
            let (m, k, n) = (3, 45, 70);
            let mut rng = SplitMix(7);
            let scale = format.max_finite().expect("finite") / 8.0;
            let mut draw = |len: usize| -> Vec<f32> {
                (0..len)
                    .map(|_| ((rng.next_u32() as f64 / 2f64.powi(31) - 1.0) * scale) as f32)
                    .collect()
            };
            let (a, b) = (draw(m * k), draw(k * n));
            let bias = rule.operands(&draw(n));
            let got = rule.gemm_f32(
                Operand::rows(&a),
                Operand::rows(&b),
                (m, k, n),
                Bias::PerCol(&bias),
                true,
            );
            let p8 = name == "posit<8,0>";
            assert_eq!(
                got.is_some(),
                specialised || p8,
                "{name} under {isa:?}: f32 entry"
            );
            let (av, bv) = (rule.operands(&a), rule.operands(&b));
            let mut want = vec![0.0; m * n];
            rule.gemm(&av, &bv, (m, k, n), Bias::PerCol(&bias), &mut want, true);
            let got = got.unwrap_or_else(|| want.iter().map(|&v| v as f32).collect());
            let bad = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| !same(f64::from(**g), **w))
                .count();
            assert_eq!(bad, 0, "{name} under {isa:?}: {bad} of {} differ", m * n);
        }
    });
}

/// A sum whose f32 rounding lands on a midpoint of the format while the exact sum lies
/// below it is rounded by the definition, not twice: in float<5,11> (12-bit significands,
/// products exact in f32) `(1 + 2^-11) + (2^-12 - 2^-24)` is a tie in f32 that rounds up
/// to the midpoint `1 + 2^-11 + 2^-12`, which would then go to the even `1 + 2^-10`; the
/// exact sum rounds to `1 + 2^-11`. Sums of such formats are rounded to odd first (they
/// are not exact in f32: `LaneRound::sums_exact`).
#[test]
fn a_sum_rounded_to_a_midpoint_in_f32_is_rounded_once() {
    let format = fmt("float<5,11>");
    let c = 1.0 + 2f64.powi(-11);
    let t = 2f64.powi(-12) - 2f64.powi(-24);
    for v in [c, t] {
        assert_eq!(
            format.round(v, Rounding::NearestEven, 0),
            v,
            "{v:e} is a value"
        );
    }
    let want = format.round(c + t, Rounding::NearestEven, 0);
    assert_eq!(want, c, "the definition");
    let f32_first = format.round(f64::from((c + t) as f32), Rounding::NearestEven, 0);
    assert_eq!(f32_first, 1.0 + 2f64.powi(-10), "rounded twice");
    on_every_isa(|isa| {
        let n = 2 * TILE + 3;
        let b: Vec<f64> = [vec![c; n], vec![t; n]].concat();
        let what = format!("double rounding, {isa:?}");
        check(&what, &format, None, &[1.0, 1.0], &b, (1, 2, n), Bias::None);
    });
}

/// `LaneRound::rounds_plain_sums` and `LaneRound::contains`, which let the kernels sum with
/// the native f32 add (the argument and its check in `quire::lane_round`'s docs): claimed
/// for floats of at most 11 significand bits, for posits up to posit<16,2> and
/// posit<17,0>, not for 12-bit floats or posit<17,1>; where claimed, the native sum
/// rounded to the accumulator is the correctly rounded sum for every pair of an operand
/// value and an accumulator value (the 8-bit operand formats against every value of fp16,
/// bf16 and e5m2); for every pair of values of each posit of at most 12 bits; for fp16 and
/// bf16 summed in themselves, for every positive value of the binade at the smallest
/// normal, of the binade at 1, of the top binade and every power of two, each against
/// every value (the negative ones round as their mirror images); and for posit<16,1>,
/// posit<16,2> and posit<17,0>, for 64 random positive values in each binade from 1/8 to
/// 4 (where they have most bits) and every power of two, each against every value.
/// `contains` is compared with the operand format's every value.
#[test]
fn plain_sums_round_correctly_where_claimed() {
    use qcandle::quire::lane_round::LaneRound;
    use rayon::prelude::*;
    let lanes = |name: &str| LaneRound::new(&fmt(name)).unwrap_or_else(|| panic!("{name}"));
    for (name, claimed) in [
        ("fp16", true),
        ("bf16", true),
        ("e5m2", true),
        ("e4m3", true),
        ("float<6,10>", true),
        ("float<8,10>", true),
        ("float<5,11>", false),
        ("float<8,11>", false),
        ("float<4,12>", false),
        ("posit<8,0>", true),
        ("posit<8,1>", true),
        ("posit<12,2>", true),
        ("posit<16,0>", true),
        ("posit<16,1>", true),
        ("posit<16,2>", true),
        ("posit<17,0>", true),
        ("posit<17,1>", false),
    ] {
        assert_eq!(lanes(name).rounds_plain_sums(), claimed, "{name}");
    }
    // (accumulator, operand format, contains)
    for (acc, op, contains) in [
        ("fp16", "e4m3", true),
        ("fp16", "e5m2", true),
        ("bf16", "e4m3", true),
        ("bf16", "e5m2", true),
        ("e5m2", "e5m2", true),
        ("fp16", "float<5,10,sat>", true),
        ("float<4,3,fn,sat>", "e4m3", true),
        ("e4m3", "float<4,3>", true),
        ("float<4,3>", "e4m3", false),
        ("bf16", "fp16", false),
        ("e5m2", "e4m3", false),
        ("e4m3", "e5m2", false),
        ("fp16", "float<6,3>", false),
        ("float<5,3>", "float<5,6>", false),
        // Contained, but posits are not claimed.
        ("fp16", "posit<8,0>", false),
    ] {
        let (accf, opf) = (fmt(acc), fmt(op));
        let every = common::finite_values(&opf)
            .iter()
            .all(|&v| accf.round(v, Rounding::NearestEven, 0) == v);
        let posit = op.starts_with("posit");
        assert_eq!(every, contains || posit, "{op} in {acc}: the values");
        assert_eq!(lanes(acc).contains(&lanes(op)), contains, "{op} in {acc}");
    }
    let plain_is_correct = |acc: &Format, xs: &[f64], ys: &[f64]| -> usize {
        xs.par_iter()
            .map(|&x| {
                ys.iter()
                    .filter(|&&y| {
                        let plain = f64::from(x as f32 + y as f32);
                        let (got, want) = (
                            acc.round(plain, Rounding::NearestEven, 0),
                            acc.round(add_odd(x, y), Rounding::NearestEven, 0),
                        );
                        !same(got, want)
                    })
                    .count()
            })
            .sum()
    };
    for (acc, op) in [
        ("fp16", "e4m3"),
        ("fp16", "e5m2"),
        ("bf16", "e4m3"),
        ("bf16", "e5m2"),
        ("e5m2", "e5m2"),
    ] {
        let (accf, opf) = (fmt(acc), fmt(op));
        let (xs, ys) = (common::finite_values(&accf), common::finite_values(&opf));
        let bad = plain_is_correct(&accf, &xs, &ys);
        assert_eq!(bad, 0, "{op} into {acc}: {bad} plain sums rounded wrongly");
    }
    for (name, emin, emax) in [("fp16", -14, 15), ("bf16", -126, 127)] {
        let format = fmt(name);
        let all = common::finite_values(&format);
        let binade = |e: i32| {
            all.iter()
                .copied()
                .filter(move |v| *v >= 2f64.powi(e) && *v < 2f64.powi(e + 1))
        };
        let mut xs: Vec<f64> = binade(emin).chain(binade(0)).chain(binade(emax)).collect();
        xs.extend((emin..=emax).map(|e| 2f64.powi(e)));
        let bad = plain_is_correct(&format, &xs, &all);
        assert_eq!(bad, 0, "{name}: {bad} plain sums rounded wrongly");
    }
    for n in 3..=12 {
        for es in 0..=2 {
            let format = fmt(&format!("posit<{n},{es}>"));
            if !lanes(&format!("posit<{n},{es}>")).rounds_plain_sums() {
                continue;
            }
            let all = common::finite_values(&format);
            let bad = plain_is_correct(&format, &all, &all);
            assert_eq!(bad, 0, "posit<{n},{es}>: {bad} plain sums rounded wrongly");
        }
    }
    let mut rng = SplitMix(11);
    for name in ["posit<16,1>", "posit<16,2>", "posit<17,0>"] {
        let format = fmt(name);
        let all = common::finite_values(&format);
        let mut xs: Vec<f64> = all
            .iter()
            .copied()
            .filter(|v| *v > 0.0 && v.log2().fract() == 0.0)
            .collect();
        for e in -3..2 {
            let binade: Vec<f64> = all
                .iter()
                .copied()
                .filter(|v| *v >= 2f64.powi(e) && *v < 2f64.powi(e + 1))
                .collect();
            xs.extend((0..64).map(|_| binade[rng.below(binade.len() as u64) as usize]));
        }
        let bad = plain_is_correct(&format, &xs, &all);
        assert_eq!(bad, 0, "{name}: {bad} plain sums rounded wrongly");
    }
}

/// Plain sums are only taken where the accumulator contains the operand format: float<5,6>
/// products into float<5,3> sums (both take plain sums alone) would round `2^-17 + 272`
/// as the f32 `272`, a tie of float<5,3> that goes to `256`, where the exact sum goes to
/// `288`; the kernel gives the definition's under every cap.
#[test]
fn a_product_finer_than_the_accumulator_is_summed_exactly() {
    let (op, acc) = (fmt("float<5,6>"), fmt("float<5,3>"));
    let round = |v: f64| acc.round(v, Rounding::NearestEven, 0);
    let tiny = 2f64.powi(-17);
    assert_eq!(round(tiny), tiny, "a value of the accumulator");
    assert_eq!(round(tiny + 272.0), 288.0, "the definition");
    assert_eq!(
        round(f64::from(tiny as f32 + 272.0)),
        256.0,
        "rounded twice"
    );
    on_every_isa(|isa| {
        let n = 2 * TILE + 3;
        let a = [2f64.powi(-9), 16.0];
        let b: Vec<f64> = [vec![2f64.powi(-8); n], vec![17.0; n]].concat();
        let what = format!("a finer product, {isa:?}");
        check(&what, &op, Some(&acc), &a, &b, (1, 2, n), Bias::None);
    });
}

/// Naive posit sums on AVX-512 and AVX2 round by magic constants where every product and sum
/// of a step lies in a binade with a uniform grid, and redo the step with the general
/// rounding where one does not (`quire::posit_magic`): tiles of moderate values (all steps
/// by magic constants), the same with zeros in `a` (skipped steps) and in a column of `b`
/// (zero products and sums), with a few steps of values near minpos (products below the
/// uniform binades) and of values near maxpos (sums past them), and rows whose every step
/// leaves the uniform binades (products past maxpos: the kernel stops trying after its
/// trial steps and takes the general rounding for the rest), against the definition. The
/// widths 64, 64 and 22 run the whole tile and the narrow half.
#[test]
fn magic_constant_steps_and_general_steps_equal_the_definition() {
    let mut rng = SplitMix(91);
    let mut moderate = |f: &Format, count: usize| -> Vec<f64> {
        (0..count)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let v = (2.0 * u - 1.0) * 4.0f64.powf(4.0 * u - 2.0);
                f.round(v, Rounding::NearestEven, 0)
            })
            .collect()
    };
    on_every_isa(|isa| {
        for name in ["posit<16,1>", "posit<16,2>", "posit<12,1>", "posit<16,0>"] {
            let f = fmt(name);
            let (min, max) = (f.min_positive().unwrap(), f.max_finite().unwrap());
            let dims @ (m, k, n) = (3, 300, 150);
            let a = moderate(&f, m * k);
            let b = moderate(&f, k * n);
            let what = |case: &str| format!("{name}, {case}, {isa:?}");
            check(&what("moderate"), &f, None, &a, &b, dims, Bias::None);
            let (mut a0, mut b0) = (a.clone(), b.clone());
            for t in (0..m * k).step_by(3) {
                a0[t] = 0.0;
            }
            for t in 0..k {
                b0[t * n + 70] = 0.0;
            }
            check(&what("zeros"), &f, None, &a0, &b0, dims, Bias::None);
            let (mut a1, mut b1) = (a.clone(), b.clone());
            for t in [5, 150, 299] {
                a1[t] = 3.0 * min;
                a1[k + t] = -min;
            }
            for t in [7, 200] {
                b1[t * n + 3] = max;
                b1[t * n + 100] = -max / 4.0;
                a1[2 * k + t] = max / 16.0;
            }
            check(
                &what("near minpos and maxpos"),
                &f,
                None,
                &a1,
                &b1,
                dims,
                Bias::None,
            );
            let mut a2 = a.clone();
            for (t, v) in a2.iter_mut().enumerate().skip(k) {
                let big = if t % 2 == 0 { max / 4.0 } else { -max / 2.0 };
                *v = f.round(big * (1.0 + v.abs().min(1.0)), Rounding::NearestEven, 0);
            }
            let b2: Vec<f64> = b
                .iter()
                .map(|&v| f.round(v.signum() * (64.0 + v.abs()), Rounding::NearestEven, 0))
                .collect();
            let case = "every step past maxpos";
            check(&what(case), &f, None, &a2, &b2, dims, Bias::None);
        }
    });
}

/// Every value of posit<n,0> (`3 <= n <= 8`; zero, both signs), found by rounding every
/// multiple of minpos up to maxpos (every value is one).
fn every_value(f: &Format) -> Vec<f64> {
    let (min, max) = (f.min_positive().unwrap(), f.max_finite().unwrap());
    let steps = (max / min) as u64;
    let mut bits: Vec<u64> = (0..=steps)
        .map(|k| f.round(k as f64 * min, Rounding::NearestEven, 0).to_bits())
        .collect();
    bits.sort_unstable();
    bits.dedup();
    let positive: Vec<f64> = bits.into_iter().map(f64::from_bits).collect();
    positive
        .iter()
        .map(|v| -v)
        .filter(|&v| v != 0.0)
        .chain(positive.iter().copied())
        .collect()
}

/// Naive posit<n,0> (`3 <= n <= 8`, whose AVX2 kernel rounds by magic constants in every
/// binade, `quire::es0_lanes`) on every pair of values: the product of each pair (one
/// output per pair, `k = 1`) and the rounded sum of each pair (`k = 2`: `c = v_i · 1`, then
/// `c + 1 · v_j`). That meets every rounding boundary of the format: products below minpos
/// (to minpos, never 0) and above maxpos (saturated), zero products, exact cancellation,
/// and the top binade's tie `1.5 · 2^(n-3)`, which goes down to `2^(n-3)` (the even
/// pattern), as products (posit<8,0>: 6 · 8 = 48) and as sums (32 + 16).
#[test]
fn posit_n0_products_and_sums_of_every_pair_equal_the_definition() {
    on_every_isa(|isa| {
        for n in 3..=8 {
            let f = fmt(&format!("posit<{n},0>"));
            let v = every_value(&f);
            let count = v.len();
            assert_eq!(
                count,
                (1 << n) - 1,
                "posit<{n},0> has 2^n - 1 finite values"
            );
            let what = |case: &str| format!("posit<{n},0>, {case}, {isa:?}");
            check(
                &what("products"),
                &f,
                None,
                &v,
                &v,
                (count, 1, count),
                Bias::None,
            );
            let a: Vec<f64> = v.iter().flat_map(|&x| [x, 1.0]).collect();
            let b: Vec<f64> = [vec![1.0; count], v.clone()].concat();
            check(
                &what("sums"),
                &f,
                None,
                &a,
                &b,
                (count, 2, count),
                Bias::None,
            );
        }
    });
}

/// The f32 entry of the register kernel, in bands of rows (pools of 2, 3 and 4 threads,
/// parallel or not), against its f64 entry (which the tests above hold to the definition)
/// output by output: every operand layout, operands rounded by the entry or already
/// rounded, no bias, a bias per row and per column, and a NaN or NaR in a row of the second
/// band and in `B` (their row and column take the definition's path).
#[test]
fn the_f32_entry_in_bands_equals_the_f64_entry() {
    use qcandle::quire::{Accumulate, GemmRule};
    let mut rng = SplitMix(29);
    for (op, acc, dims @ (m, k, n)) in [
        ("posit<16,1>", None, (37, 61, 41)),
        ("e4m3", Some("fp16"), (70, 40, 30)),
        ("posit<8,0>", None, (33, 20, 70)),
        ("fp16", None, (40, 33, 17)),
    ] {
        let format = fmt(op);
        let kernel = match acc {
            None => NaiveF32::new(&format),
            Some(acc) => NaiveF32::with_accumulator(&format, &fmt(acc), false),
        }
        .expect("the register kernel");
        let rule = GemmRule::new(&Accumulate::Naive, &format)
            .expect("rule")
            .expect("not f32");
        let scale = format.max_finite().expect("finite") / 64.0;
        let mut draw = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| ((rng.next_u32() as f64 / 2f64.powi(31) - 1.0) * scale) as f32)
                .collect()
        };
        let (mut a, mut b) = (draw(m * k), draw(k * n));
        let (row_bias, col_bias) = (rule.operands(&draw(m)), rule.operands(&draw(n)));
        for nan in [false, true] {
            if nan {
                // Row 20 lies in the second band of any split of these shapes.
                a[20 * k + 3] = f32::NAN;
                b[2 * n + 4] = f32::NAN;
            }
            let (av, bv) = (rule.operands(&a), rule.operands(&b));
            let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let (ar, br) = (as_f32(&av), as_f32(&bv));
            for bias in [Bias::None, Bias::PerRow(&row_bias), Bias::PerCol(&col_bias)] {
                let mut want = vec![0.0; m * n];
                kernel.gemm(&av, &bv, dims, bias, &mut want, false);
                on_every_isa(|isa| {
                    for (round, layouts) in [
                        (true, Layouts::new(&a, &b, dims)),
                        (false, Layouts::new(&ar, &br, dims)),
                    ] {
                        for threads in [2, 3, 4] {
                            pool(threads).install(|| {
                                for (layout, opa, opb) in layouts.each() {
                                    for parallel in [true, false] {
                                        let got: Vec<f32> = kernel
                                            .gemm_f32(opa, opb, dims, bias, parallel, round)
                                            .expect("the f32 entry runs");
                                        let bad = got
                                            .iter()
                                            .zip(&want)
                                            .filter(|(g, w)| !same(f64::from(**g), **w as f32 as f64))
                                            .count();
                                        assert_eq!(
                                            bad, 0,
                                            "{op} {acc:?} {dims:?} nan {nan} {bias:?} {isa:?} {threads} threads, transposed {layout:?}, parallel {parallel}, round {round}"
                                        );
                                    }
                                }
                            });
                        }
                    }
                });
            }
        }
    }
}
