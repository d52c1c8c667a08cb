//! The naive GEMM's vectorised f32 row kernel against the definition, one scalar operation
//! at a time: `c = round(c + round(a_t · b_t))` from zero, `k` ascending, bias last, each
//! operation computed in f64 rounded to odd and rounded once to the format.

mod common;

use common::SplitMix;
use qcandle::format::Rounding;
use qcandle::quire::gemm_cpu::{naive_gemm, Bias};
use qcandle::quire::naive_f32::NaiveF32;
use qcandle::quire::round_odd::{add_odd, mul_odd};
use qcandle::Format;

/// A reproducible spread of values over the format's range (ties, tiny, huge, signs).
fn values(format: &Format, count: usize, seed: u64) -> Vec<f64> {
    let max = format.max_finite().unwrap().min(1e30);
    let min = format.min_positive().unwrap();
    let mut rng = SplitMix(seed);
    (0..count)
        .map(|i| {
            let state = rng.next_u64();
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let v = match i % 7 {
                0 => max * u,
                1 => min * (1.0 + 3.0 * u),
                2 => 0.0,
                _ => (2.0 * u - 1.0) * 4.0f64.powf(6.0 * u - 3.0),
            };
            let v = if state >> 63 == 1 { -v } else { v };
            format.round(v, Rounding::NearestEven, 0)
        })
        .collect()
}

fn reference(
    format: &Format,
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
    bias: &[f64],
) -> Vec<f64> {
    let round = |x: f64| format.round(x, Rounding::NearestEven, 0);
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut c = 0.0;
            for t in 0..k {
                c = round(add_odd(c, round(mul_odd(a[i * k + t], b[t * n + j]))));
            }
            out[i * n + j] = round(add_odd(c, bias[j]));
        }
    }
    out
}

fn same(x: f64, y: f64) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

#[test]
fn the_f32_row_kernel_equals_the_scalar_definition_for_posits_and_narrow_floats() {
    for name in [
        "posit<16,1>",
        "posit<16,2>",
        "posit<12,2>",
        "posit<24,1>",
        "posit<10,0>",
        "fp16",
        "float<5,2>",
        "float<4,3,fn>",
        "float<5,10,nosub>",
        "float<5,10,sat>",
        "e3m2",
    ] {
        let format: Format = name.parse().unwrap();
        assert!(
            NaiveF32::new(&format).is_some(),
            "{name} takes the row kernel"
        );
        let (m, k, n) = (7, 61, 37);
        let a = values(&format, m * k, 1);
        let b = values(&format, k * n, 2);
        let bias = values(&format, n, 3);
        let mut out = vec![0.0; m * n];
        naive_gemm(
            &format,
            &a,
            &b,
            (m, k, n),
            Bias::PerCol(&bias),
            &mut out,
            false,
        );
        let expected = reference(&format, &a, &b, (m, k, n), &bias);
        let bad: Vec<String> = out
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(_, (x, y))| !same(**x, **y))
            .take(5)
            .map(|(i, (x, y))| format!("out[{i}] = {x:e}, definition {y:e}"))
            .collect();
        assert!(bad.is_empty(), "{name}: {}", bad.join("; "));
    }
}

#[test]
fn formats_outside_f32_range_or_precision_take_the_general_path() {
    for name in [
        "bf16",
        "posit<32,2>",
        "posit<16,4>",
        "float<5,23>",
        "fixed<16,8>",
    ] {
        let format: Format = name.parse().unwrap();
        assert!(NaiveF32::new(&format).is_none(), "{name}");
    }
}

#[test]
fn nar_and_overflow_propagate_through_the_row_kernel() {
    let p: Format = "posit<16,1>".parse().unwrap();
    let a = [1.0, f64::NAN, 2.0];
    let b = [3.0, 4.0, 5.0];
    let mut out = [0.0; 1];
    naive_gemm(&p, &a, &b, (1, 3, 1), Bias::None, &mut out, false);
    assert!(out[0].is_nan(), "NaR is sticky");
    // fp16: 60000 + 60000 overflows to Inf; -60000 + 60000 is exactly 0.
    let h: Format = "fp16".parse().unwrap();
    let mut out = [0.0; 2];
    naive_gemm(
        &h,
        &[60000.0, 60000.0],
        &[1.0, -1.0, 1.0, 1.0],
        (1, 2, 2),
        Bias::None,
        &mut out,
        false,
    );
    assert_eq!(out, [f64::INFINITY, 0.0]);
}

/// Operands off the f32 grid (not values of the format: the definition still rounds each
/// product and sum) take the row kernel, in `A` or in `B`: the tiles, which read operands as
/// f32, would round them first. The operand just above the midpoint between 1 and the next
/// value `1 + u` (the even neighbour is 1) times 1 rounds up to `1 + u`; read as f32 it
/// would be the midpoint itself, which rounds to 1.
#[test]
fn operands_off_the_f32_grid_take_the_row_kernel() {
    for (name, u) in [
        ("posit<16,1>", 2f64.powi(-12)),
        ("fp16", 2f64.powi(-10)),
        ("e4m3", 0.125),
    ] {
        let format: Format = name.parse().unwrap();
        let kernel = NaiveF32::new(&format).expect("the f32 kernel");
        let off = 1.0 + u / 2.0 + 2f64.powi(-40);
        assert_ne!(f64::from(off as f32), off, "off the f32 grid");
        let (m, k, n) = (3, 17, 70);
        for off_in_a in [false, true] {
            let mut a = values(&format, m * k, 4);
            let mut b = values(&format, k * n, 5);
            // Output (1, j) starts with the term off · 1 (or 1 · off for j = 5).
            if off_in_a {
                a[k] = off;
                b[..n].fill(1.0);
            } else {
                a[k] = 1.0;
                b[5] = off;
            }
            let mut out = vec![0.0; m * n];
            kernel.gemm(&a, &b, (m, k, n), Bias::None, &mut out, false);
            let expected = reference(&format, &a, &b, (m, k, n), &vec![0.0; n]);
            let bad = out
                .iter()
                .zip(&expected)
                .filter(|(x, y)| !same(**x, **y))
                .count();
            assert_eq!(bad, 0, "{name}, off-grid operand in A: {off_in_a}");
            // The first term alone (k = 1) is the rounding of the off-grid product.
            let mut one = [0.0];
            let (x, y) = if off_in_a { (off, 1.0) } else { (1.0, off) };
            kernel.gemm(&[x], &[y], (1, 1, 1), Bias::None, &mut one, false);
            assert_eq!(one[0], 1.0 + u, "{name}: {x} · {y}");
        }
    }
}
