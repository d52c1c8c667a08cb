//! The exact definition of a quire GEMM: `round(A · B + bias)` by a `Quire` per output,
//! products of `k` ascending, the bias last. The including test declares it with
//! `#[path = "common/quire_reference.rs"] mod quire_reference;`.

use qcandle::format::Posit;
use qcandle::quire::gemm_cpu::Bias;
use qcandle::quire::Quire;

/// `round(A · B + bias)` for row-major `a` (`m x k`) and `b` (`k x n`) on the posit's grid.
pub fn quire_reference(
    posit: Posit,
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
    bias: Bias,
) -> Vec<f64> {
    let mut q = Quire::new(posit).expect("quire");
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            q.clear();
            for t in 0..k {
                q.add_product(a[i * k + t], b[t * n + j]);
            }
            match bias {
                Bias::None => {}
                Bias::PerRow(v) => q.add(v[i]),
                Bias::PerCol(v) => q.add(v[j]),
            }
            out.push(q.to_posit());
        }
    }
    out
}
