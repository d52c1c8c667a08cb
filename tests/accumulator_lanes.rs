//! `naive:<A>` and `fma:<A>` with IEEE binary32 (`fp32`) and bf16 accumulators in the
//! vectorised kernel (`quire::naive_lanes` through `naive_sum_gemm` and `fma_gemm`) against
//! the definition, under every instruction set this CPU has (`backend::isa::set_cap`).
//!
//! The definition is computed here with big integers (`common/exact.rs`): each exact
//! product, sum or multiply-add narrowed to an f64 rounded to odd and rounded once by the
//! scalar `Format::round` (binary32 as `float<8,23>` through that general path, not the f64
//! to f32 conversion); zero results take IEEE signs. With a NaN or Inf among the values of
//! an operation the result is NaN or Inf, computed in f64. Operand formats e4m3, e5m2,
//! fp16, posit<8,0> and posit<16,1> (and `float<8,10>` as another accumulator with f32's
//! exponent range), odd shapes with partial tiles, long sums, bias per column and per row,
//! NaN, NaR and Inf operands, and multiply-adds that overflow binary32.
//!
//! The cap is process-wide, so the tests of this file take a lock while they hold one.

mod common;
#[path = "common/exact.rs"]
mod exact;
#[path = "common/isa_cap.rs"]
mod isa_cap;
#[path = "common/operands.rs"]
mod operands;

use common::{Mismatches, SplitMix};
use exact::{f64_units, ref_odd};
use isa_cap::on_every_isa;
use num_bigint::BigInt;
use num_traits::Zero;
use operands::{fmt, round, values};
use qcandle::backend::f32_plan::F32Plan;
use qcandle::format::rounding::RuleKind;
use qcandle::quire::gemm_acc::{fma_gemm, naive_sum_gemm};
use qcandle::quire::gemm_cpu::Bias;
use qcandle::quire::naive_f32::NaiveF32;
use qcandle::quire::naive_lanes::{tile, Accumulator, Products, TILE};
use qcandle::Format;

/// The operand formats, and the accumulators each is summed in.
const OPERANDS: &[&str] = &["e4m3", "e5m2", "fp16", "posit<8,0>", "posit<16,1>"];
const ACCUMULATORS: &[&str] = &["fp32", "bf16", "float<8,10>"];

/// The exact `x · 2^-u` as an f64 rounded to odd (a zero is +0).
fn exact_value(x: &BigInt, u: u32) -> f64 {
    if x.is_zero() {
        0.0
    } else {
        ref_odd(x, u)
    }
}

/// `a · b` exactly, rounded to odd; a zero product has the XOR of the signs.
fn exact_product(a: f64, b: f64) -> f64 {
    if a == 0.0 || b == 0.0 || !a.is_finite() || !b.is_finite() {
        return a * b;
    }
    exact_value(&(f64_units(a) * f64_units(b)), 2148)
}

/// `x + y` exactly, rounded to odd; two zeros keep a shared sign, a cancellation is +0.
fn exact_sum(x: f64, y: f64) -> f64 {
    if (x == 0.0 && y == 0.0) || !x.is_finite() || !y.is_finite() {
        return x + y;
    }
    exact_value(&(f64_units(x) + f64_units(y)), 1074)
}

/// `s + a · b` exactly, rounded to odd (IEEE signs for a zero result).
fn exact_fma(s: f64, a: f64, b: f64) -> f64 {
    if !s.is_finite() || !a.is_finite() || !b.is_finite() {
        return s + a * b;
    }
    let p = f64_units(a) * f64_units(b) + (f64_units(s) << 1074usize);
    if p.is_zero() {
        return s + a * b;
    }
    exact_value(&p, 2148)
}

/// One GEMM's rule: operand format, accumulator, and whether multiply-adds are fused.
#[derive(Clone, Copy)]
struct Rule {
    op: Format,
    acc: Format,
    fused: bool,
}

impl Rule {
    fn name(&self, op: &str, acc: &str) -> String {
        format!("{}:{acc} on {op}", if self.fused { "fma" } else { "naive" })
    }

    /// The sums before the bias, `m x n`, by the definition.
    fn sums(&self, a: &[f64], b: &[f64], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for t in 0..k {
                    let (x, y) = (a[i * k + t], b[t * n + j]);
                    let exact = if self.fused {
                        exact_fma(s, x, y)
                    } else {
                        exact_sum(s, round(&self.op, exact_product(x, y)))
                    };
                    s = round(&self.acc, exact);
                }
                out[i * n + j] = s;
            }
        }
        out
    }

    /// The outputs: the bias added to the sums, then rounded to the operand format.
    fn outputs(&self, sums: &[f64], n: usize, bias: &Bias) -> Vec<f64> {
        sums.iter()
            .enumerate()
            .map(|(idx, &s)| {
                let v = match bias {
                    Bias::None => None,
                    Bias::PerRow(v) => Some(v[idx / n]),
                    Bias::PerCol(v) => Some(v[idx % n]),
                };
                let s = v.map_or(s, |v| round(&self.acc, exact_sum(s, v)));
                round(&self.op, s)
            })
            .collect()
    }

    /// The library's GEMM of this rule.
    fn gemm(&self, a: &[f64], b: &[f64], dims: (usize, usize, usize), bias: Bias) -> [Vec<f64>; 2] {
        [false, true].map(|parallel| {
            let mut out = vec![0.0; dims.0 * dims.2];
            if self.fused {
                fma_gemm(&self.op, &self.acc, a, b, dims, bias, &mut out, parallel);
            } else {
                naive_sum_gemm(&self.op, &self.acc, a, b, dims, bias, &mut out, parallel);
            }
            out
        })
    }
}

fn same(x: f64, y: f64) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// Every rule of the file: operand format, accumulator, fused.
fn rules() -> Vec<(String, Rule)> {
    let mut rules = Vec::new();
    for op in OPERANDS {
        for acc in ACCUMULATORS {
            for fused in [false, true] {
                let rule = Rule {
                    op: fmt(op),
                    acc: fmt(acc),
                    fused,
                };
                rules.push((rule.name(op, acc), rule));
            }
        }
    }
    rules
}

/// The GEMM of `rule` against the definition on `a`, `b` with no bias, a bias per column
/// and one per row, under every instruction set, serial and parallel.
fn check(what: &str, rule: &Rule, a: &[f64], b: &[f64], dims: (usize, usize, usize), seed: u64) {
    let (m, _, n) = dims;
    let col = values(&rule.op, n, seed + 20);
    let row = values(&rule.op, m, seed + 30);
    let biases = [Bias::None, Bias::PerCol(&col), Bias::PerRow(&row)];
    let sums = rule.sums(a, b, dims);
    let wanted: Vec<Vec<f64>> = biases
        .iter()
        .map(|bias| rule.outputs(&sums, n, bias))
        .collect();
    let mut bad = Mismatches::default();
    on_every_isa(|isa| {
        for (bias, want) in biases.iter().zip(&wanted) {
            for (parallel, got) in rule.gemm(a, b, dims, *bias).iter().enumerate() {
                for (idx, (&g, &w)) in got.iter().zip(want).enumerate() {
                    bad.check(same(g, w), || {
                        format!("{isa:?} {bias:?} parallel {parallel} out[{idx}] = {g:e}, definition {w:e}")
                    });
                }
            }
        }
    });
    bad.assert_none(&format!("{what} {dims:?}"));
}

#[test]
fn the_rules_take_the_vector_kernel() {
    for (what, rule) in rules() {
        assert!(
            NaiveF32::with_accumulator(&rule.op, &rule.acc, rule.fused).is_some(),
            "{what}: not in the vector kernel"
        );
    }
}

#[test]
fn fp32_and_bf16_sums_equal_the_definition_on_every_instruction_set() {
    for (what, rule) in rules() {
        // Partial tiles, several tiles, a single term, and sums far longer than a tile.
        for (seed, dims) in [
            (1, (5, 37, 150)),
            (2, (3, 61, 7)),
            (3, (2, 1, 65)),
            (4, (2, 300, 70)),
        ] {
            let (m, k, n) = dims;
            let a = values(&rule.op, m * k, seed);
            let b = values(&rule.op, k * n, seed + 10);
            check(&what, &rule, &a, &b, dims, seed);
        }
        // No terms: the output is the bias rounded.
        check(&what, &rule, &[], &[], (2, 0, 3), 5);
    }
}

/// Sums of moderate values of one sign and of both signs: the accumulators' own rounding
/// (bf16 rounds most sums, binary32 the long ones) and exact cancellation.
#[test]
fn long_sums_round_in_the_accumulator_as_the_definition() {
    for (what, rule) in rules() {
        let (m, k, n) = (4, 500, 67);
        let mut rng = SplitMix(0x6163_636b);
        let mut moderate = |count: usize, signed: bool| -> Vec<f64> {
            (0..count)
                .map(|_| {
                    let v = 1.0 + rng.below(1 << 20) as f64 / (1u64 << 20) as f64;
                    let sign = if signed && rng.coin() { -1.0 } else { 1.0 };
                    round(&rule.op, sign * v)
                })
                .collect()
        };
        let a = moderate(m * k, false);
        let b = moderate(k * n, true);
        check(&what, &rule, &a, &b, (m, k, n), 6);
        let b = moderate(k * n, false);
        check(&what, &rule, &a, &b, (m, k, n), 7);
    }
}

/// NaN (NaR) and Inf operands, and Inf against -Inf in one sum: their outputs are NaN or
/// Inf as by the definition, and only their own tiles leave the registers.
#[test]
fn nan_and_inf_operands_equal_the_definition() {
    for (what, rule) in rules() {
        let (m, k, n) = (3, 9, 140);
        let a = values(&rule.op, m * k, 7);
        let mut b = values(&rule.op, k * n, 8);
        b[4 * n + 70] = f64::NAN;
        let has_inf = round(&rule.op, f64::INFINITY).is_infinite();
        if has_inf {
            b[2 * n + 3] = f64::INFINITY;
            b[5 * n + 3] = f64::NEG_INFINITY;
            b[6 * n + 130] = f64::INFINITY;
        }
        check(&what, &rule, &a, &b, (m, k, n), 9);
    }
}

/// Multiply-adds of posit<9,3>'s largest values (products up to 2^112) overflow binary32
/// after 2^16 terms: `fma:fp32` outputs become Inf (the lanes hand the tile to the scalar
/// definition), while bf16 sums stay at its largest value and `naive` (products rounded
/// to maxpos = 2^56) never overflows.
#[test]
fn sums_past_binary32s_range_equal_the_definition() {
    let op = fmt("posit<9,3>");
    let max = op.max_finite().unwrap();
    let (m, k, n) = (1, 70_000, 3);
    let a = vec![max; m * k];
    let b: Vec<f64> = (0..k * n)
        .map(|i| {
            if i % n == 2 {
                -max
            } else {
                max / (1 + i % n) as f64
            }
        })
        .map(|v| round(&op, v))
        .collect();
    for acc in ["fp32", "bf16"] {
        for fused in [false, true] {
            let rule = Rule {
                op,
                acc: fmt(acc),
                fused,
            };
            let what = rule.name("posit<9,3>", acc);
            assert!(
                NaiveF32::with_accumulator(&op, &rule.acc, fused).is_some(),
                "{what}"
            );
            let sums = rule.sums(&a, &b, (m, k, n));
            if fused && acc == "fp32" {
                assert!(
                    sums[0].is_infinite() && sums[2].is_infinite(),
                    "{what}: {sums:?}"
                );
            }
            check(&what, &rule, &a, &b, (m, k, n), 10);
        }
    }
}

/// The tile itself finishes in registers for finite operands (it does not hand every tile
/// to the scalar definition) and its sums equal the definition's.
#[test]
fn tiles_of_finite_operands_finish_in_registers() {
    on_every_isa(|isa| {
        for (what, rule) in rules() {
            let plan_of = |f: &Format| F32Plan::new(f, RuleKind::NearestEven).unwrap();
            let op_plan = plan_of(&rule.op);
            let acc_plan = plan_of(&rule.acc);
            let accumulator = if rule.acc == fmt("fp32") {
                Accumulator::Binary32
            } else {
                Accumulator::Plan(&acc_plan)
            };
            let bits = match rule.op {
                Format::Posit(p) => p.n() - 2 - p.es(),
                Format::Float(f) => f.man() + 1,
                _ => unreachable!(),
            };
            let products = match (rule.fused, bits <= 12) {
                (true, false) if !matches!(accumulator, Accumulator::Binary32) => continue,
                (true, _) => Products::Fused,
                (false, true) => Products::RoundedExact,
                (false, false) => Products::Rounded,
            };
            let k = 50;
            // At most 8 in magnitude: no product overflows an operand format.
            let clamp =
                |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| x.clamp(-8.0, 8.0)).collect() };
            let a = clamp(values(&rule.op, k, 11));
            let b = clamp(values(&rule.op, k * TILE, 12));
            let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
            let mut acc = [0f32; TILE];
            let done = tile(&op_plan, accumulator, products, &a32, &b32, TILE, &mut acc);
            assert!(done, "{what} {isa:?}: the tile finished in registers");
            let want = rule.sums(&a, &b, (1, k, TILE));
            for (j, (&got, &w)) in acc.iter().zip(&want).enumerate() {
                assert!(
                    same(got as f64, w),
                    "{what} {isa:?} column {j}: {got:e}, definition {w:e}"
                );
            }
        }
    });
}

/// `fma:<A>` keeps every bit of a product: posit<16,1> products near 1 have up to 26
/// significand bits, more than binary32 holds. Output `(i, j)` is `A(-1 + x_i y_j)` rounded
/// to posit<16,1> (`a` rows `[-1, x_i]`, `b` rows `[1, ..., 1]` and `[y_0, ..., y_n]`):
/// exact in binary32 when fused, while a product rounded to f32 first loses the low bits.
#[test]
fn fused_products_keep_every_bit() {
    let op = fmt("posit<16,1>");
    let (m, k, n) = (64, 2, 70);
    let odd = |i: usize| 1.0 + (2 * i + 1) as f64 / 4096.0;
    let a: Vec<f64> = (0..m).flat_map(|i| [-1.0, odd(3 * i)]).collect();
    let b: Vec<f64> = (0..k * n)
        .map(|idx| if idx < n { 1.0 } else { odd(5 * (idx - n) + 1) })
        .collect();
    for acc in ["fp32", "bf16"] {
        let rule = Rule {
            op,
            acc: fmt(acc),
            fused: true,
        };
        if acc == "fp32" {
            // The sums are exact: the test would see a product rounded before the add.
            let sums = rule.sums(&a, &b, (m, k, n));
            assert_eq!(sums[1], odd(0) * odd(6) - 1.0, "exact in binary32");
        }
        check(&rule.name("posit<16,1>", acc), &rule, &a, &b, (m, k, n), 11);
    }
}
