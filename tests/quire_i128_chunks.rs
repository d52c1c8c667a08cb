//! The i128 quire GEMM beyond 2^14 terms in posit<16,1> (chunked i128 sums gathered in a
//! quire) against a `Quire` per output, bit for bit: sums of maxpos² that would overflow a
//! single i128, cancellations down to minpos², NaR operands and biases, tiles of one to
//! four columns; the checked f64 path, which `quire_gemm` picks for these sums, on the same
//! inputs.

use qcandle::format::rounding::NearestEven;
use qcandle::format::{Format, Posit};
use qcandle::quire::gemm_cpu::{accumulator_for, quire_gemm, quire_gemm_with, Accumulator, Bias};
use qcandle::quire::Quire;

fn posit16_1() -> Posit {
    match "posit<16,1>".parse::<Format>().expect("format") {
        Format::Posit(p) => p,
        _ => unreachable!(),
    }
}

#[test]
fn chunked_i128_sums_equal_the_quire() {
    let posit = posit16_1();
    let maxpos = posit.round(f64::MAX, NearestEven, 0);
    let minpos = posit.round(f64::MIN_POSITIVE, NearestEven, 0);
    let mut state = 7u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let (m, k, n) = (3, 40_000, 5);
    assert_eq!(accumulator_for(posit, k), Accumulator::F64Checked);
    let mut a = vec![0.0; m * k];
    let mut b = vec![0.0; k * n];
    for (idx, v) in a.iter_mut().enumerate() {
        let row = idx / k;
        *v = match (row, next() % 8) {
            (0, _) => maxpos,
            (1, r) if r < 6 => {
                if idx % 2 == 0 {
                    maxpos
                } else {
                    -maxpos
                }
            }
            (_, 0) => minpos,
            _ => posit.round((next() as f64 / 2e9 - 1.0) * 1e3, NearestEven, 0),
        };
    }
    for (idx, v) in b.iter_mut().enumerate() {
        *v = match next() % 6 {
            0 => maxpos,
            1 => -maxpos,
            2 => minpos,
            _ => posit.round((next() as f64 / 2e9 - 1.0) * 1e-3, NearestEven, 0),
        };
        if idx == 3 * n + 4 {
            *v = f64::NAN;
        }
    }
    let row_bias = [maxpos, f64::NAN, -minpos];
    let col_bias = [1.0, -maxpos, minpos, 0.0, 2.5];
    for bias in [Bias::None, Bias::PerRow(&row_bias), Bias::PerCol(&col_bias)] {
        for n in 1..=n {
            let bn: Vec<f64> = (0..k).flat_map(|t| b[t * 5..t * 5 + n].to_vec()).collect();
            // The chunked i128 path (forced) and the path `quire_gemm` picks (checked f64).
            let mut got = vec![0.0; m * n];
            quire_gemm_with(
                Accumulator::Wide,
                posit,
                &a,
                &bn,
                (m, k, n),
                bias,
                &mut got,
                true,
            )
            .expect("exact");
            let mut picked = vec![0.0; m * n];
            quire_gemm(posit, &a, &bn, (m, k, n), bias, &mut picked, true);
            let mut q = Quire::new(posit).expect("quire");
            for i in 0..m {
                for j in 0..n {
                    q.clear();
                    for t in 0..k {
                        q.add_product(a[i * k + t], bn[t * n + j]);
                    }
                    match bias {
                        Bias::None => {}
                        Bias::PerRow(v) => q.add(v[i]),
                        Bias::PerCol(v) => q.add(v[j]),
                    }
                    let want = q.to_posit();
                    for (path, g) in [
                        ("i128 chunks", got[i * n + j]),
                        ("picked", picked[i * n + j]),
                    ] {
                        assert!(
                            (g.is_nan() && want.is_nan()) || g.to_bits() == want.to_bits(),
                            "{path}: n = {n} ({i},{j}): {g:e} vs {want:e}"
                        );
                    }
                }
            }
        }
    }
}
