//! When `naive:<A>` sums are exact: the grid argument of RESULTS.md's accumulator table.
//!
//! Every value of a float format `F` with subnormals is an integer multiple of its smallest
//! positive value `u` (`2^-9` for e4m3, `2^-16` for e5m2), and so is every product rounded
//! to `F`, which is a value of `F`. An accumulator `A` with `p` significand bits (and a
//! smallest positive value that divides `u`) holds every multiple of `u` up to `2^p · u` in
//! magnitude exactly. So where every partial sum of an output stays within `2^p · u`, each
//! `A(s + F(a_k b_k))` of `naive:<A>` is exact, and the GEMM's output is `F` of the exact sum
//! of the rounded products, the same for every such `A`: fp16 (`p = 11`) up to 4 for e4m3
//! operands and up to `2^-5` for e5m2 ones, fp32 far beyond, bf16 (`p = 8`) only up to 0.5
//! and `2^-8`.
//!
//! These tests compare `naive_sum_gemm` (the vectorised kernel where it applies, the
//! general loop otherwise) with that exact sum, computed in f64 (exact: the products of
//! these formats are exact in f64 and the sums are multiples of `u` far below `2^53 · u`)
//! and rounded with the scalar `Format::round`; and they check that the bound is needed:
//! beyond it, bf16 sums do change outputs.

mod common;
#[path = "common/operands.rs"]
mod operands;

use common::SplitMix;
use operands::{fmt, round};
use qcandle::quire::gemm_acc::naive_sum_gemm;
use qcandle::quire::gemm_cpu::Bias;
use qcandle::Format;

/// Significand bits (with the implicit one) of a float format.
fn significand_bits(f: &Format) -> i32 {
    match f {
        Format::Float(x) => x.man() as i32 + 1,
        _ => panic!("a float format"),
    }
}

/// `m · k` values of `f`, of magnitude at most `scale`, some of them zero or subnormal.
fn operands(rng: &mut SplitMix, f: &Format, count: usize, scale: f64) -> Vec<f64> {
    (0..count)
        .map(|_| {
            let r = rng.next_u32() as f64 / u32::MAX as f64;
            let tiny = 2f64.powi(-(rng.below(12) as i32));
            let sign = if rng.coin() { -1.0 } else { 1.0 };
            round(f, sign * r * scale * tiny)
        })
        .collect()
}

/// For each output: `F` of the exact sum of the rounded products, and the largest partial
/// sum's magnitude.
fn exact_outputs(
    f: &Format,
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut peak) = (0.0f64, 0.0f64);
            for t in 0..k {
                s += round(f, a[i * k + t] * b[t * n + j]);
                peak = peak.max(s.abs());
            }
            out.push((round(f, s), peak));
        }
    }
    out
}

/// Outputs within `A`'s exact bound equal the exact reference (counted), and the number of
/// outputs beyond the bound that differ from it.
fn compare(op: &str, acc: &str, scale: f64, seed: u64) -> (usize, usize, usize) {
    let (f, a_fmt) = (fmt(op), fmt(acc));
    let u = f.min_positive().expect("a smallest positive value");
    let bound = 2f64.powi(significand_bits(&a_fmt)) * u;
    let dims = (9, 150, 7);
    let mut rng = SplitMix(seed);
    let a = operands(&mut rng, &f, dims.0 * dims.1, scale);
    let b = operands(&mut rng, &f, dims.1 * dims.2, scale);
    let mut got = vec![0.0; dims.0 * dims.2];
    naive_sum_gemm(&f, &a_fmt, &a, &b, dims, Bias::None, &mut got, false);
    let (mut inside, mut beyond_differ, mut beyond) = (0, 0, 0);
    for (idx, (&g, &(want, peak))) in got.iter().zip(&exact_outputs(&f, &a, &b, dims)).enumerate() {
        if peak <= bound {
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{op} operands, naive:{acc}, output {idx}: got {g:e}, exact sum rounded {want:e} (partial sums up to {peak:e} <= {bound:e})"
            );
            inside += 1;
        } else {
            beyond += 1;
            beyond_differ += usize::from(g.to_bits() != want.to_bits());
        }
    }
    (inside, beyond, beyond_differ)
}

#[test]
fn fp16_and_fp32_sums_of_fp8_products_are_exact_within_the_grid_bound() {
    // Operand scales that keep most partial sums within fp16's bound (4 for e4m3, 2^-5 for
    // e5m2), so that the comparison covers many outputs.
    for (op, scale) in [("e4m3", 0.25), ("e5m2", 2f64.powi(-5))] {
        for acc in ["fp16", "fp32"] {
            let mut checked = 0;
            for seed in 0..8 {
                checked += compare(op, acc, scale, 0x6163_6331 + seed).0;
            }
            assert!(
                checked >= 200,
                "{op}, naive:{acc}: only {checked} outputs within the bound"
            );
        }
    }
}

#[test]
fn bf16_sums_are_exact_within_their_bound_and_round_beyond_it() {
    // A small scale for sums within bf16's bound (0.5 for e4m3, 2^-8 for e5m2), a larger
    // one for sums beyond it.
    for (op, small, large) in [
        ("e4m3", 2f64.powi(-3), 1.0),
        ("e5m2", 2f64.powi(-7), 2f64.powi(-3)),
    ] {
        let (mut inside, mut beyond, mut differ) = (0, 0, 0);
        for seed in 0..8 {
            inside += compare(op, "bf16", small, 0x6263_6331 + seed).0;
            let (_, b, d) = compare(op, "bf16", large, 0x6263_6341 + seed);
            beyond += b;
            differ += d;
        }
        assert!(inside > 0, "{op}: no output within bf16's bound");
        assert!(
            differ > 0,
            "{op}: none of {beyond} outputs beyond bf16's bound changed (the bound would not be needed)"
        );
    }
}
