//! GEMMs with an accumulator format of their own: `naive:<A>` (products rounded to the
//! operand format `F`, sums to `A`) and `fma:<A>` (one rounding to `A` per multiply-add).
//!
//! For each output, `k` ascending from `s = 0`:
//!
//! * `naive:<A>`: `s = A(s + F(a_k b_k))`;
//! * `fma:<A>`: `s = A(s + a_k b_k)`, the exact `s + a_k b_k` rounded once;
//!
//! then `s = A(s + bias)` and the output is `F(s)`. Every rounding is to nearest, ties to
//! even.
//!
//! # Why each step is correctly rounded
//!
//! An operation is computed in f64 rounded to odd ([`super::round_odd`]) and then rounded
//! to the format; for a format with at most 51 significand bits (every format here) that is
//! the correct rounding of the exact result. For `fma`, the product `a_k b_k` of two values
//! with at most 26 significand bits each is exact in f64 (checked when the rule is built:
//! [`products_exact`]), so `add_odd(s, a_k b_k)` is the exact `s + a_k b_k` rounded to odd.
//!
//! Where the accumulator is IEEE binary32 (`fp32`, `float<8,23>`), its rounding is the f64
//! to f32 conversion, which is exactly that rounding (subnormals, overflow to infinity).
//!
//! Where the operand format rounds through f32 runs (fp16, e5m2, e4m3, posits with n <= 24
//! and maxpos² <= 2^125) and the accumulator is binary32, bf16, or such a format, the
//! vectorised kernel of [`super::naive_f32`] computes the same bits; the loop below serves
//! the other pairs.

use super::gemm_cpu::{for_rows, Bias, Dims};
use super::naive_f32::NaiveF32;
use super::round_odd::{add_odd, mul_odd};
use crate::format::float::{Overflow, Specials};
use crate::format::rounding::NearestEven;
use crate::format::Format;

/// Whether every product of two values of `format` is exact in f64: at most 26 significand
/// bits, and products inside f64's normal range.
pub fn products_exact(format: &Format) -> bool {
    let bits = match format {
        Format::Posit(p) => p.n().saturating_sub(2 + p.es()),
        Format::Float(f) => f.man() + 1,
        Format::Fixed(_) => format.bits(),
        _ => return false,
    };
    let range_ok = match (format.max_finite(), format.min_positive()) {
        (Some(max), Some(min)) => max * max < f64::MAX && min * min >= f64::MIN_POSITIVE,
        _ => false,
    };
    bits <= 26 && range_ok
}

/// A rounding to one format, with IEEE binary32 as the f32 conversion.
#[derive(Clone, Copy)]
struct Rounder {
    format: Format,
    ieee32: bool,
}

impl Rounder {
    fn new(format: &Format) -> Self {
        let ieee32 = matches!(format, Format::Float(f)
            if f.exp() == 8 && f.man() == 23 && f.subnormals()
                && f.specials() == Specials::Ieee && f.overflow() == Overflow::Infinity);
        Rounder {
            format: *format,
            ieee32,
        }
    }

    #[inline(always)]
    fn round(&self, x: f64) -> f64 {
        if self.ieee32 {
            x as f32 as f64
        } else {
            self.format.round_rule(x, NearestEven, 0)
        }
    }
}

/// The shared loop: `step(s, a, b)` is one multiply-add into the accumulator.
#[allow(clippy::too_many_arguments)]
fn accumulate_gemm(
    op: Rounder,
    acc: Rounder,
    a: &[f64],
    b: &[f64],
    (m, k, n): Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
    step: impl Fn(f64, f64, f64) -> f64 + Sync,
) {
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    let row = |i: usize, dst: &mut [f64]| {
        dst.fill(0.0);
        for t in 0..k {
            let x = a[i * k + t];
            let brow = &b[t * n..t * n + n];
            for (s, &y) in dst.iter_mut().zip(brow) {
                *s = step(*s, x, y);
            }
        }
        for (j, s) in dst.iter_mut().enumerate() {
            let v = match bias {
                Bias::None => *s,
                Bias::PerRow(v) => acc.round(add_odd(*s, v[i])),
                Bias::PerCol(v) => acc.round(add_odd(*s, v[j])),
            };
            *s = op.round(v);
        }
    };
    for_rows(out, m, n, parallel, row);
}

/// `out = F(A · B + bias)` with products rounded to `op` and sums to `acc` (see the module
/// docs); operands on `op`'s grid. Where both formats round through f32 runs, the
/// vectorised row kernel ([`super::naive_f32`]) computes the same bits.
#[allow(clippy::too_many_arguments)]
pub fn naive_sum_gemm(
    op: &Format,
    acc: &Format,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    if let Some(kernel) = NaiveF32::with_accumulator(op, acc, false) {
        return kernel.gemm(a, b, dims, bias, out, parallel);
    }
    let (op, acc) = (Rounder::new(op), Rounder::new(acc));
    let step = |s: f64, x: f64, y: f64| acc.round(add_odd(s, op.round(mul_odd(x, y))));
    accumulate_gemm(op, acc, a, b, dims, bias, out, parallel, step)
}

/// `out = F(A · B + bias)` with one rounding to `acc` per multiply-add (see the module
/// docs); operands on `op`'s grid, whose products must be exact ([`products_exact`]).
#[allow(clippy::too_many_arguments)]
pub fn fma_gemm(
    op: &Format,
    acc: &Format,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    debug_assert!(products_exact(op));
    if let Some(kernel) = NaiveF32::with_accumulator(op, acc, true) {
        return kernel.gemm(a, b, dims, bias, out, parallel);
    }
    let (op, acc) = (Rounder::new(op), Rounder::new(acc));
    let step = |s: f64, x: f64, y: f64| acc.round(add_odd(s, x * y));
    accumulate_gemm(op, acc, a, b, dims, bias, out, parallel, step)
}
