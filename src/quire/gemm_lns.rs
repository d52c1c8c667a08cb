//! The LNS GEMM of `accumulate = "lns:<impl>"`: `C = A · B [+ bias]` in the arithmetic of an
//! lns format ([`LnsArith`]).
//!
//! Operands are the f64 values of lns codes (a tensor's values rounded to the format); each
//! becomes its code again ([`LnsValue::nearest`], which returns the code of its own value).
//! For each output, `c = 0`, then `c = c ⊕ (a_k ⊗ b_k)` for `k` ascending, with `⊗` the
//! exact product (saturated or flushed into the range) and `⊕` the Gaussian-log sum of the
//! arithmetic's implementation, then `c = c ⊕ bias`; the output is the code's f64 value. This
//! is [`crate::lns::lns_matmul`]'s order, with the bias added last.

use rayon::prelude::*;

use super::gemm_cpu::{for_rows, Bias, Dims};
use crate::lns::{LnsArith, LnsValue};

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
    if n == 0 {
        return;
    }
    let lns = arith.lns();
    let code = |v: &f64| LnsValue::nearest(lns, *v);
    let ac: Vec<LnsValue> = a[..m * k].par_iter().map(code).collect();
    let bc: Vec<LnsValue> = b[..k * n].par_iter().map(code).collect();
    let bias_code = |v: f64| LnsValue::nearest(lns, v);
    let row = |i: usize, dst: &mut [f64]| {
        let mut acc = vec![LnsValue::Zero; n];
        for t in 0..k {
            let x = ac[i * k + t];
            for (c, &y) in acc.iter_mut().zip(&bc[t * n..t * n + n]) {
                *c = arith.add(*c, arith.mul(x, y));
            }
        }
        for (j, (o, c)) in dst.iter_mut().zip(acc).enumerate() {
            let c = match bias {
                Bias::None => c,
                Bias::PerRow(v) => arith.add(c, bias_code(v[i])),
                Bias::PerCol(v) => arith.add(c, bias_code(v[j])),
            };
            *o = c.to_f64(lns);
        }
    };
    for_rows(out, m, n, parallel, row);
}
