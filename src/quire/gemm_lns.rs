//! The LNS GEMM of `accumulate = "lns:<impl>"`: `C = A · B [+ bias]` in the arithmetic of an
//! lns format ([`LnsArith`]).
//!
//! Operands are the f64 values of lns codes (a tensor's values rounded to the format), or
//! f32 values not yet rounded; each becomes the code nearest to it ([`LnsValue::nearest`],
//! which returns a code's own value as that code). For each output, `c = 0`, then
//! `c = c ⊕ (a_k ⊗ b_k)` for `k` ascending, with `⊗` the exact product (saturated or
//! flushed into the range) and `⊕` the Gaussian-log sum of the arithmetic's
//! implementation, then `c = c ⊕ bias`; the output is the code's value. This is
//! [`crate::lns::lns_matmul`]'s order, with the bias added last, computed by the lanes of
//! [`crate::lns::lns_gemm_lanes`] (many outputs' sums in flight at once, the same bits).
//!
//! The product runs in bands of output rows (`team`): the caller packs `B`'s codes once
//! while the pool's helpers wake, then every thread takes bands, each converting its own
//! rows of `A`, computing them on its thread and writing its outputs. Each output's
//! operations are the same whichever band and thread compute it.

use std::ops::Range;

use super::gemm_cpu::{Bias, Dims};
use super::quire_i16::Operand;
use crate::lns::lanes::{gemm_rows, pack, PackedRight};
use crate::lns::{LnsArith, LnsBias, LnsValue};
use crate::team::{self, Threading};

/// `out = A · B [+ bias]` in `arith`'s LNS arithmetic (see the module docs), for row-major
/// f64 operands.
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
    let lns = arith.lns();
    let code = |x: f64| pack(LnsValue::nearest(lns, x));
    banded(
        arith,
        (m, k, n),
        bias,
        parallel,
        || b[..k * n].iter().map(|&x| code(x)).collect(),
        |rows| {
            a[rows.start * k..rows.end * k]
                .iter()
                .map(|&x| code(x))
                .collect()
        },
        &mut out[..m * n],
        |v| v.to_f64(lns),
    );
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
    assert!(a.data.len() >= m * k && b.data.len() >= k * n);
    let lns = arith.lns();
    let code = |x: f32| pack(LnsValue::nearest(lns, f64::from(x)));
    let pack_b = || {
        if !b.transposed {
            return b.data[..k * n].iter().map(|&x| code(x)).collect();
        }
        // Stored `n x k`: each stored row is a column of `B`.
        let mut codes = vec![0; k * n];
        for (j, col) in b.data[..k * n].chunks_exact(k.max(1)).enumerate() {
            for (p, &x) in col.iter().enumerate() {
                codes[p * n + j] = code(x);
            }
        }
        codes
    };
    let pack_a = |rows: Range<usize>| -> Vec<i64> {
        if !a.transposed {
            return a.data[rows.start * k..rows.end * k]
                .iter()
                .map(|&x| code(x))
                .collect();
        }
        // Stored `k x m`: row `p` holds column `p` of `A`.
        let mut codes = Vec::with_capacity(rows.len() * k);
        for i in rows {
            codes.extend((0..k).map(|p| code(a.data[p * m + i])));
        }
        codes
    };
    let mut out = vec![0f32; m * n];
    banded(
        arith,
        (m, k, n),
        bias,
        parallel,
        pack_b,
        pack_a,
        &mut out,
        |v| v.to_f64(lns) as f32,
    );
    out
}

/// The product in bands of output rows (module docs): `pack_b` gives `B`'s packed codes
/// (row-major `k x n`, on the calling thread), `pack_a(rows)` those of rows `rows` of `A`
/// (row-major), `write` each output's value.
#[allow(clippy::too_many_arguments)]
fn banded<O: Send>(
    arith: &LnsArith,
    (m, k, n): Dims,
    bias: Bias,
    parallel: bool,
    pack_b: impl FnOnce() -> Vec<i64>,
    pack_a: impl Fn(Range<usize>) -> Vec<i64> + Sync,
    out: &mut [O],
    write: impl Fn(LnsValue) -> O + Sync,
) {
    if m == 0 || n == 0 {
        return;
    }
    let lns = arith.lns();
    let bias_codes: Vec<LnsValue> = match bias {
        Bias::None => Vec::new(),
        Bias::PerRow(v) => v[..m].iter().map(|&x| LnsValue::nearest(lns, x)).collect(),
        Bias::PerCol(v) => v[..n].iter().map(|&x| LnsValue::nearest(lns, x)).collect(),
    };
    let (bands, inside) = Threading::of(parallel, (m, k, n)).bands();
    let band = |right: &PackedRight, (r0, out): (usize, &mut [O])| {
        let rows = out.len() / n;
        let ap = pack_a(r0..r0 + rows);
        let lns_bias = match bias {
            Bias::None => LnsBias::None,
            Bias::PerRow(_) => LnsBias::PerRow(&bias_codes[r0..r0 + rows]),
            Bias::PerCol(_) => LnsBias::PerCol(&bias_codes),
        };
        let mut c = vec![LnsValue::Zero; rows * n];
        gemm_rows(arith, &ap, right, rows, lns_bias, &mut c, inside);
        for (o, &v) in out.iter_mut().zip(&c) {
            *o = write(v);
        }
    };
    // Bands of whole pairs of rows (the 32-bit kernel's passes).
    let tasks = team::row_bands(out, n, bands, 2);
    team::run(
        bands - 1,
        || PackedRight::new(arith, pack_b(), (k, n)),
        tasks,
        band,
    );
}
