//! The naive LNS matrix product: exact products, every sum through the Gaussian logarithms.

use rayon::prelude::*;

use crate::format::lns::Lns;

use super::arith::LnsArith;
use super::error::LnsError;
use super::value::LnsValue;

/// Checks that `len` elements make a `rows x cols` matrix.
fn check_shape(name: &str, len: usize, rows: usize, cols: usize) -> Result<(), LnsError> {
    match rows.checked_mul(cols) {
        Some(n) if n == len => Ok(()),
        Some(n) => Err(LnsError::Shape {
            reason: format!("{name} has {len} elements, a {rows}x{cols} matrix has {n}"),
        }),
        None => Err(LnsError::Shape {
            reason: format!("{name}: {rows}x{cols} elements overflow usize"),
        }),
    }
}

/// `c = a b` for row-major `a` (m x k) and `b` (k x n): each `c[i][j]` starts at zero and adds
/// the exact products `a[i][p] b[p][j]` (rounded into the format only by saturation or
/// flush) one at a time, `p` ascending, through `arith`'s addition. Rows are computed in
/// parallel; the result does not depend on the thread count.
pub fn lns_matmul(
    arith: &LnsArith,
    a: &[LnsValue],
    b: &[LnsValue],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<LnsValue>, LnsError> {
    check_shape("a", a.len(), m, k)?;
    check_shape("b", b.len(), k, n)?;
    let len = m.checked_mul(n).ok_or_else(|| LnsError::Shape {
        reason: format!("the {m}x{n} product's elements overflow usize"),
    })?;
    let mut c = Vec::new();
    c.try_reserve_exact(len).map_err(|e| LnsError::Shape {
        reason: format!("cannot allocate the {m}x{n} product: {e}"),
    })?;
    c.resize(len, LnsValue::Zero);
    if n == 0 {
        return Ok(c);
    }
    c.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let a_row = &a[i * k..(i + 1) * k];
        for (j, out) in row.iter_mut().enumerate() {
            let mut acc = LnsValue::Zero;
            for (p, &x) in a_row.iter().enumerate() {
                acc = arith.add(acc, arith.mul(x, b[p * n + j]));
            }
            *out = acc;
        }
    });
    Ok(c)
}

/// [`lns_matmul`] on f64 matrices: every element rounded in with [`LnsValue::nearest`], the
/// product's elements returned as their exact values correctly rounded to f64.
pub fn lns_matmul_f64(
    arith: &LnsArith,
    a: &[f64],
    b: &[f64],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f64>, LnsError> {
    let lns: Lns = arith.lns();
    let round_in = |x: &[f64]| x.iter().map(|&v| LnsValue::nearest(lns, v)).collect();
    let a: Vec<LnsValue> = round_in(a);
    let b: Vec<LnsValue> = round_in(b);
    let c = lns_matmul(arith, &a, &b, m, k, n)?;
    Ok(c.into_iter().map(|v| v.to_f64(lns)).collect())
}
