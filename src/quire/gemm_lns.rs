//! The LNS GEMM of `accumulate = "lns:<impl>"`: `C = A · B [+ bias]` in the arithmetic of an
//! lns format ([`LnsArith`]).
//!
//! Operands are the f64 values of lns codes (a tensor's values rounded to the format); each
//! becomes its code again ([`LnsValue::nearest`], which returns the code of its own value).
//! For each output, `c = 0`, then `c = c ⊕ (a_k ⊗ b_k)` for `k` ascending, with `⊗` the
//! exact product (saturated or flushed into the range) and `⊕` the Gaussian-log sum of the
//! arithmetic's implementation, then `c = c ⊕ bias`; the output is the code's f64 value. This
//! is [`crate::lns::lns_matmul`]'s order, with the bias added last, computed by
//! [`lns_gemm_lanes`] (many outputs' sums in flight at once, the same bits).

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims};
use super::quire_i16::Operand;
use crate::lns::{lns_gemm_lanes, LnsArith, LnsBias, LnsValue};

/// `out = A · B [+ bias]` in `arith`'s LNS arithmetic (see the module docs).
pub fn lns_gemm(
    arith: &LnsArith,
    a: &[f64],
    b: &[f64],
    (m, k, n): Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    if n == 0 || m == 0 {
        return;
    }
    let lns = arith.lns();
    let codes = |v: &[f64]| -> Vec<LnsValue> {
        v.par_iter()
            .with_min_len(1024)
            .map(|&x| LnsValue::nearest(lns, x))
            .collect()
    };
    let c = product(
        arith,
        &codes(&a[..m * k]),
        &codes(&b[..k * n]),
        (m, k, n),
        bias,
        parallel,
    );
    out[..m * n]
        .par_iter_mut()
        .with_min_len(1024)
        .zip(c.par_iter().with_min_len(1024))
        .for_each(|(o, v)| *o = v.to_f64(lns));
}

/// [`lns_gemm`] straight from f32 operands not yet rounded (each in either layout), as the
/// f32 outputs: each operand's code is the one nearest to its f32 (the same code as rounding
/// it to the format first), the outputs the f32 of each code's f64 value.
pub fn lns_gemm_f32(
    arith: &LnsArith,
    a: Operand,
    b: Operand,
    (m, k, n): Dims,
    bias: Bias,
    parallel: bool,
) -> Vec<f32> {
    let lns = arith.lns();
    let codes = |v: &[f32]| -> Vec<LnsValue> {
        v.par_iter()
            .with_min_len(1024)
            .map(|&x| LnsValue::nearest(lns, f64::from(x)))
            .collect()
    };
    let ac = codes(&a.row_major(m, k)[..m * k]);
    let bc = codes(&b.row_major(k, n)[..k * n]);
    let c = product(arith, &ac, &bc, (m, k, n), bias, parallel);
    c.par_iter()
        .with_min_len(1024)
        .map(|v| v.to_f64(lns) as f32)
        .collect()
}

/// The product of codes with the bias (f64 values) rounded in.
fn product(
    arith: &LnsArith,
    ac: &[LnsValue],
    bc: &[LnsValue],
    (m, k, n): Dims,
    bias: Bias,
    parallel: bool,
) -> Vec<LnsValue> {
    let lns = arith.lns();
    let codes =
        |v: &[f64]| -> Vec<LnsValue> { v.iter().map(|&x| LnsValue::nearest(lns, x)).collect() };
    let bias_codes = match bias {
        Bias::None => Vec::new(),
        Bias::PerRow(v) => codes(&v[..m]),
        Bias::PerCol(v) => codes(&v[..n]),
    };
    let lns_bias = match bias {
        Bias::None => LnsBias::None,
        Bias::PerRow(_) => LnsBias::PerRow(&bias_codes),
        Bias::PerCol(_) => LnsBias::PerCol(&bias_codes),
    };
    let mut c = vec![LnsValue::Zero; m * n];
    lns_gemm_lanes(arith, ac, bc, (m, k, n), lns_bias, &mut c, parallel)
        .expect("the shapes were checked by the callers");
    c
}
