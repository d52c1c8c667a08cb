//! The checked f64 quire GEMM (`qcandle::quire::gemm_checked`) against a `Quire` per output,
//! bit for bit: random GEMMs in posit<16,1>, posit<32,2>, posit<8,2> and posit<8,1> (odd
//! shapes, `k` up to 20,000, biases per row and per column, serial and parallel), sums built
//! to land exactly on a rounding boundary (the (n+1)-bit midpoint patterns, in every kind of
//! binade), a few units of minpos² from one, cancellations to zero and to minpos² under
//! maxpos² terms, NaR (NaN, ±Inf) operands and biases, zero rows, maxpos and minpos
//! operands, and the f32 entry with both layouts of each operand. The number of outputs
//! that fell back to the exact path is checked: every constructed boundary and cancellation
//! falls back, ordinary random products do not.

mod common;
#[path = "common/exact.rs"]
mod exact;
#[path = "common/layouts.rs"]
mod layouts;
#[path = "common/quire_reference.rs"]
mod quire_reference;

use common::{Mismatches, SplitMix};
use exact::{same, Ref, Term};
use layouts::Layouts;
use quire_reference::quire_reference;

use num_bigint::BigInt;
use qcandle::format::rounding::NearestEven;
use qcandle::format::Posit;
use qcandle::quire::gemm_checked;
use qcandle::quire::gemm_cpu::{accumulator_for, quire_gemm, quire_gemm_with, Accumulator, Bias};

fn posit(n: u32, es: u32) -> Posit {
    Posit::new(n, es).expect("posit")
}

/// Runs the checked GEMM serial and parallel, compares both with the quire; returns the
/// number of fallbacks (the same in both runs).
fn check(
    mm: &mut Mismatches,
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: (usize, usize, usize),
    bias: Bias,
    what: &str,
) -> usize {
    let (m, _, n) = dims;
    let want = quire_reference(posit, a, b, dims, bias);
    let mut counts = Vec::new();
    for parallel in [false, true] {
        let mut got = vec![0.0; m * n];
        counts.push(gemm_checked::gemm_f64(
            posit, a, b, dims, bias, &mut got, parallel,
        ));
        for (o, (&g, &w)) in got.iter().zip(&want).enumerate() {
            mm.check(same(g, w), || {
                format!(
                    "{what} posit<{},{}> {dims:?} parallel {parallel} out[{}][{}]: got {g:e}, quire {w:e}",
                    posit.n(),
                    posit.es(),
                    o / n,
                    o % n
                )
            });
        }
    }
    assert_eq!(counts[0], counts[1], "{what}: fallbacks serial vs parallel");
    counts[0]
}

/// A value of roughly normal distribution (sum of uniforms), rounded to `posit`.
fn normalish(p: Posit, rng: &mut SplitMix) -> f64 {
    let s: f64 = (0..4)
        .map(|_| rng.below(1 << 20) as f64 / (1u64 << 20) as f64)
        .sum();
    p.round((s - 2.0) * 1.7, NearestEven, 0)
}

#[test]
fn the_checked_path_is_picked_where_the_exact_f64_and_i16_paths_end() {
    use Accumulator::*;
    assert_eq!(accumulator_for(posit(8, 0), 400), I16);
    assert_eq!(accumulator_for(posit(8, 1), 31), F64);
    assert_eq!(accumulator_for(posit(8, 1), 32), F64Checked);
    assert_eq!(accumulator_for(posit(8, 2), 1), F64Checked);
    assert_eq!(accumulator_for(posit(16, 1), 401), F64Checked);
    assert_eq!(accumulator_for(posit(16, 1), 73_729), F64Checked);
    assert_eq!(accumulator_for(posit(32, 2), 1), F64Checked);
    assert_eq!(accumulator_for(posit(16, 5), 1), F64Checked);
    // Beyond the bound's 2^32 terms: the integer paths again.
    assert_eq!(accumulator_for(posit(16, 1), (1 << 32) + 1), Wide);
    assert_eq!(accumulator_for(posit(32, 2), (1 << 32) + 1), Wide);
    // Forcing a path that is not exact is an error, not a wrong result.
    let mut out = [0.0];
    for (acc, p) in [
        (I16, posit(16, 1)),
        (F64, posit(16, 1)),
        (I128, posit(32, 2)),
    ] {
        let e = quire_gemm_with(
            acc,
            p,
            &[1.0],
            &[1.0],
            (1, 1, 1),
            Bias::None,
            &mut out,
            false,
        )
        .expect_err("not exact");
        assert!(e.contains("not exact"), "{e}");
    }
}

/// Random GEMMs: any patterns (NaR excluded), patterns near ±1, and ±minpos/±maxpos with
/// their neighbours, mixed per element (large cancellations included), against the quire.
#[test]
fn random_checked_gemms_equal_a_quire_per_output() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(2811);
    let cases: &[(u32, u32, usize, usize, usize)] = &[
        (16, 1, 1, 1, 1),
        (16, 1, 5, 1, 3),
        (16, 1, 7, 33, 9),
        (16, 1, 13, 400, 11),
        (16, 1, 3, 3000, 4),
        (16, 1, 2, 20_000, 3),
        (32, 2, 7, 33, 9),
        (32, 2, 5, 700, 6),
        (32, 2, 2, 3000, 3),
        (8, 2, 9, 50, 11),
        (8, 2, 4, 2000, 5),
        (8, 1, 6, 100, 7),
        (12, 3, 4, 25, 6),
    ];
    let mut total = 0;
    for (ci, &(pn, pes, m, k, n)) in cases.iter().enumerate() {
        let r = Ref::new(pn, pes);
        let p = r.posit();
        for variant in 0..3 {
            let how = [
                exact::Draw::Mixed,
                exact::Draw::NearOne,
                exact::Draw::Uniform,
            ][variant];
            let a: Vec<f64> = (0..m * k).map(|_| r.value(r.draw(&mut rng, how))).collect();
            let b: Vec<f64> = (0..k * n).map(|_| r.value(r.draw(&mut rng, how))).collect();
            let rows: Vec<f64> = (0..m).map(|_| r.value(r.draw(&mut rng, how))).collect();
            let cols: Vec<f64> = (0..n).map(|_| r.value(r.draw(&mut rng, how))).collect();
            for bias in [Bias::None, Bias::PerRow(&rows), Bias::PerCol(&cols)] {
                let what = format!("case {ci} variant {variant} {bias:?}");
                total += check(&mut mm, p, &a, &b, (m, k, n), bias, &what);
            }
        }
    }
    println!("random: {total} fallbacks");
    mm.assert_none("checked GEMM vs quire");
}

/// Roughly normal operands, the kind a layer sees: no output needs the exact path.
#[test]
fn ordinary_products_do_not_fall_back() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(77);
    for (pn, pes, m, k, n) in [
        (16, 1, 37, 1000, 29),
        (16, 1, 8, 5000, 8),
        (8, 2, 20, 400, 20),
    ] {
        let p = posit(pn, pes);
        let a: Vec<f64> = (0..m * k).map(|_| normalish(p, &mut rng)).collect();
        let b: Vec<f64> = (0..k * n).map(|_| normalish(p, &mut rng)).collect();
        let bias: Vec<f64> = (0..n).map(|_| normalish(p, &mut rng)).collect();
        let fallbacks = check(&mut mm, p, &a, &b, (m, k, n), Bias::PerCol(&bias), "normal");
        assert_eq!(fallbacks, 0, "posit<{pn},{pes}> {m}x{k}x{n}");
    }
    mm.assert_none("ordinary products");
}

/// Rows of `A` (against a column of `B`) whose exact sums are the given targets in units
/// of minpos² (signed): each target decomposed into products, the rows padded with zeros.
fn rows_for(r: &Ref, targets: &[BigInt]) -> (Vec<f64>, Vec<f64>, usize) {
    let decomposed: Vec<(bool, Vec<Term>)> = targets
        .iter()
        .map(|t| {
            (
                t < &BigInt::from(0),
                r.decompose(&t.magnitude().clone().into()),
            )
        })
        .collect();
    let k = decomposed.iter().map(|(_, d)| d.len()).max().unwrap_or(1);
    // B holds, per term position, one column per row (n = rows): output (i, i) is the
    // target; the rest are other sums, also compared.
    let m = targets.len();
    let mut a = vec![0.0; m * k];
    let mut b = vec![0.0; k * m];
    for (i, (negative, terms)) in decomposed.iter().enumerate() {
        for (t, term) in terms.iter().enumerate() {
            let Term::Product(x, w) = *term else {
                unreachable!("decompose gives products")
            };
            let v = r.value(x);
            a[i * k + t] = if *negative { -v } else { v };
            b[t * m + i] = r.value(w);
        }
    }
    (a, b, k)
}

/// Sums exactly on a rounding boundary (the value of each (n+1)-bit pattern between two
/// posits) fall back and round as the quire does (ties to the even pattern); sums a few
/// units of minpos² away round as the quire does.
#[test]
fn sums_on_and_near_rounding_boundaries_equal_the_quire() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(5);
    for (pn, pes) in [(16, 1), (8, 2), (8, 1), (12, 3)] {
        let r = Ref::new(pn, pes);
        let p = r.posit();
        // Lower neighbours: the smallest, near one, the largest, and random ones.
        let mut lows: Vec<u32> = vec![
            1,
            2,
            3,
            r.one() - 1,
            r.one(),
            r.one() + 1,
            r.maxp() - 2,
            r.maxp() - 1,
        ];
        lows.extend((0..24).map(|_| 1 + rng.below(u64::from(r.maxp() - 1)) as u32));
        let boundaries: Vec<BigInt> = lows.iter().map(|&lo| r.bound((lo << 1) | 1)).collect();
        for sign in [1, -1] {
            let targets: Vec<BigInt> = boundaries.iter().map(|b| b * sign).collect();
            let (a, b, k) = rows_for(&r, &targets);
            let m = targets.len();
            // Column i of B pairs with row i: the diagonal outputs are the boundaries.
            let diag_bias = vec![0.0; m];
            let what = format!("posit<{pn},{pes}> boundaries sign {sign}");
            let fallbacks = check(
                &mut mm,
                p,
                &a,
                &b,
                (m, k, m),
                Bias::PerRow(&diag_bias),
                &what,
            );
            assert!(
                fallbacks >= m,
                "{what}: {fallbacks} fallbacks for {m} sums on a boundary"
            );
            // A single column: exactly the boundaries, each falling back.
            let col: Vec<f64> = (0..k).map(|t| b[t * m]).collect();
            let first_row = &a[..k];
            let fb = check(&mut mm, p, first_row, &col, (1, k, 1), Bias::None, &what);
            assert_eq!(fb, 1, "{what}: the first boundary did not fall back");
            for d in [-3i64, -2, -1, 1, 2, 3] {
                let near: Vec<BigInt> = targets.iter().map(|t| t + d).collect();
                let (a, b, k) = rows_for(&r, &near);
                check(
                    &mut mm,
                    p,
                    &a,
                    &b,
                    (m, k, m),
                    Bias::None,
                    &format!("{what} + {d}"),
                );
            }
        }
    }
    mm.assert_none("boundary sums");
}

/// Sums on a rounding boundary that the bias completes (the products sum to the boundary
/// less the bias): every one falls back, and the exact path adds the bias as the quire
/// does, for small sums (an i128 total) and sums near maxpos (past 2^53 units of minpos²),
/// biases of either sign from minpos to maxpos.
#[test]
fn boundary_sums_completed_by_the_bias_equal_the_quire() {
    let mut mm = Mismatches::default();
    for (pn, pes) in [(16, 1), (8, 2), (8, 1), (12, 3)] {
        let r = Ref::new(pn, pes);
        let p = r.posit();
        let lows: Vec<u32> = vec![1, 3, r.one() - 1, r.one() + 7, r.maxp() - 2];
        let biases = [
            1,
            r.one(),
            r.one() + 3,
            r.maxp(),
            r.neg(r.one() - 2),
            r.neg(2),
        ];
        for &beta in &biases {
            let beta_units = r.sq_units(beta);
            for sign in [1, -1] {
                let targets: Vec<BigInt> = lows
                    .iter()
                    .map(|&lo| r.bound((lo << 1) | 1) * sign)
                    .collect();
                let rest: Vec<BigInt> = targets.iter().map(|t| t - &beta_units).collect();
                let (a, b, k) = rows_for(&r, &rest);
                let m = targets.len();
                let bias = vec![r.value(beta); m];
                let what = format!("posit<{pn},{pes}> bias {:e} sign {sign}", r.value(beta));
                let fallbacks = check(&mut mm, p, &a, &b, (m, k, m), Bias::PerRow(&bias), &what);
                assert!(
                    fallbacks >= m,
                    "{what}: {fallbacks} fallbacks for {m} sums on a boundary"
                );
            }
        }
    }
    mm.assert_none("boundary sums completed by the bias");
}

/// Exact cancellation to zero, and maxpos² terms cancelled down to minpos² in every order
/// (the f64 sum is 0 or minpos² depending on the order): all fall back, all equal the quire.
#[test]
fn cancellations_fall_back_and_equal_the_quire() {
    let mut mm = Mismatches::default();
    for (pn, pes) in [(16, 1), (32, 2), (8, 2)] {
        let p = posit(pn, pes);
        let (maxpos, minpos) = (p.max_pos(), p.min_pos());
        let x = p.round(1.375, NearestEven, 0);
        let y = p.round(-3.25, NearestEven, 0);
        // Each row against the column of ones... B is per row of terms.
        let rows: Vec<Vec<(f64, f64)>> = vec![
            vec![(x, y), (-x, y)],
            vec![(maxpos, maxpos), (-maxpos, maxpos), (minpos, minpos)],
            vec![(maxpos, maxpos), (minpos, minpos), (-maxpos, maxpos)],
            vec![(minpos, minpos), (maxpos, maxpos), (maxpos, -maxpos)],
            vec![
                (maxpos, maxpos),
                (maxpos, maxpos),
                (-maxpos, maxpos),
                (-maxpos, maxpos),
                (-minpos, minpos),
            ],
            vec![(maxpos, minpos), (-minpos, maxpos), (x, minpos)],
        ];
        let k = rows.iter().map(Vec::len).max().unwrap();
        for (ri, terms) in rows.iter().enumerate() {
            let mut a = vec![0.0; k];
            let mut b = vec![0.0; k];
            for (t, &(u, v)) in terms.iter().enumerate() {
                a[t] = u;
                b[t] = v;
            }
            let what = format!("posit<{pn},{pes}> cancellation {ri}");
            let fb = check(&mut mm, p, &a, &b, (1, k, 1), Bias::None, &what);
            assert_eq!(fb, 1, "{what}: no fallback");
        }
        // Half +maxpos², half -maxpos² over 20,000 terms (beyond one i128 chunk for
        // posit<16,1>), then one minpos²: exactly minpos².
        let k = 20_001;
        let a: Vec<f64> = (0..k)
            .map(|t| match t {
                t if t == k - 1 => minpos,
                t if t % 2 == 0 => maxpos,
                _ => -maxpos,
            })
            .collect();
        let b: Vec<f64> = (0..k)
            .map(|t| if t == k - 1 { minpos } else { maxpos })
            .collect();
        let what = format!("posit<{pn},{pes}> long cancellation");
        let fb = check(&mut mm, p, &a, &b, (1, k, 1), Bias::None, &what);
        assert_eq!(fb, 1, "{what}: no fallback");
        let mut out = [0.0];
        gemm_checked::gemm_f64(p, &a, &b, (1, k, 1), Bias::None, &mut out, false);
        assert_eq!(out[0], minpos, "{what}");
    }
    mm.assert_none("cancellations");
}

/// NaR operands (NaN, ±Inf) and biases make exactly their rows, columns or outputs NaR;
/// zero rows and columns are exact without the fallback; maxpos and minpos operands.
#[test]
fn nar_zero_and_extreme_operands() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(31);
    for (pn, pes) in [(16, 1), (32, 2), (8, 2)] {
        let p = posit(pn, pes);
        let (m, k, n) = (6, 40, 5);
        let mut a: Vec<f64> = (0..m * k).map(|_| normalish(p, &mut rng)).collect();
        let mut b: Vec<f64> = (0..k * n).map(|_| normalish(p, &mut rng)).collect();
        a[k + 7] = f64::NAN; // row 1
        a[2 * k + 3] = f64::INFINITY; // row 2
        b[5 * n + 1] = f64::NEG_INFINITY; // column 1
        a[3 * k..4 * k].fill(0.0); // row 3: zeros
        for t in 0..k {
            b[t * n + 3] = 0.0; // column 3: zeros
            a[4 * k + t] = if t % 3 == 0 {
                p.max_pos()
            } else {
                -p.min_pos()
            }; // row 4
        }
        b[2] = p.max_pos();
        b[4] = -p.min_pos();
        let row_bias = [1.0, 0.0, -2.0, 0.0, 0.5, f64::NAN];
        let col_bias = [0.0, 1.0, f64::INFINITY, 0.0, -0.25];
        for (bias, nar_bias) in [
            (Bias::None, None),
            (Bias::PerRow(&row_bias), Some((true, 5))),
            (Bias::PerCol(&col_bias), Some((false, 2))),
        ] {
            let what = format!("posit<{pn},{pes}> NaR {bias:?}");
            check(&mut mm, p, &a, &b, (m, k, n), bias, &what);
            let mut out = vec![0.0; m * n];
            let fallbacks = gemm_checked::gemm_f64(p, &a, &b, (m, k, n), bias, &mut out, false);
            for i in 0..m {
                for j in 0..n {
                    let nar = i == 1
                        || i == 2
                        || j == 1
                        || match nar_bias {
                            Some((true, r)) => i == r,
                            Some((false, c)) => j == c,
                            None => false,
                        };
                    let v = out[i * n + j];
                    mm.check(v.is_nan() == nar, || format!("{what}: out[{i}][{j}] = {v}"));
                    // Zero row or column without a bias term: exactly zero.
                    if (i == 3 || j == 3) && !nar && matches!(bias, Bias::None) {
                        mm.check(v.to_bits() == 0, || format!("{what}: out[{i}][{j}] = {v}"));
                    }
                }
            }
            // Neither NaR nor the zero rows and columns need the exact path here (row 4's
            // maxpos and minpos terms do not cancel).
            assert_eq!(fallbacks, 0, "{what}");
        }
    }
    mm.assert_none("NaR, zeros and extremes");
}

/// A random f32 (any value: NaN, ±Inf, zeros, beyond maxpos, below minpos included).
fn random_f32(rng: &mut SplitMix) -> f32 {
    match rng.below(60) {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        3 => 0.0,
        4 => -0.0,
        5 => 1e30,
        6 => -1e-30,
        _ => {
            let m = (rng.below(1 << 24) as f32 / (1 << 23) as f32) - 1.0;
            m * 2f32.powi(rng.below(20) as i32 - 10)
        }
    }
}

/// The f32 entry (operands rounded on the way in, each in either layout) equals the quire
/// on the rounded operands, output by output, and the f64 entry's fallback count.
#[test]
fn the_f32_entry_equals_the_quire_in_every_layout() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(909);
    for shape in [
        (16, 1, 9, 70, 13),
        (16, 1, 3, 1000, 5),
        (32, 2, 7, 45, 6),
        (8, 2, 5, 64, 4),
    ] {
        f32_entry_case(&mut mm, &mut rng, shape);
    }
    mm.assert_none("f32 entry");
}

/// The same where the output is cut into bands of rows, one per thread (at least 16 rows
/// each, from 2^16 multiply-adds): bands of unequal heights, `A` stored transposed (each
/// band gathers its columns), a bias per row (each band takes its part), on pools of 2, 3
/// and 4 threads (the calling thread outside the pool).
#[test]
fn the_f32_entry_in_bands_equals_the_quire() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(910);
    for threads in [2, 3, 4] {
        let pool = layouts::pool(threads);
        for shape in [
            (16, 1, 37, 61, 41),
            (16, 1, 70, 40, 30),
            (32, 2, 33, 45, 50),
        ] {
            pool.install(|| f32_entry_case(&mut mm, &mut rng, shape));
        }
    }
    mm.assert_none("f32 entry in bands");
}

/// One shape of the f32 entry's tests: random operands with NaR, zeros and extremes, every
/// layout, no bias and a bias per column and per row, serial and parallel.
fn f32_entry_case(
    mm: &mut Mismatches,
    rng: &mut SplitMix,
    (pn, pes, m, k, n): (u32, u32, usize, usize, usize),
) {
    let p = posit(pn, pes);
    let a32: Vec<f32> = (0..m * k).map(|_| random_f32(rng)).collect();
    let b32: Vec<f32> = (0..k * n).map(|_| random_f32(rng)).collect();
    let round = |v: &[f32]| -> Vec<f64> {
        v.iter()
            .map(|&x| p.round(f64::from(x), NearestEven, 0))
            .collect()
    };
    let (a, b) = (round(&a32), round(&b32));
    let layouts = Layouts::new(&a32, &b32, (m, k, n));
    let col_bias: Vec<f64> = (0..n).map(|_| normalish(p, rng)).collect();
    let row_bias: Vec<f64> = (0..m).map(|_| normalish(p, rng)).collect();
    for bias in [Bias::None, Bias::PerCol(&col_bias), Bias::PerRow(&row_bias)] {
        let want = quire_reference(p, &a, &b, (m, k, n), bias);
        let mut f64_out = vec![0.0; m * n];
        let f64_fallbacks = gemm_checked::gemm_f64(p, &a, &b, (m, k, n), bias, &mut f64_out, true);
        for ((ta, tb), opa, opb) in layouts.each() {
            for parallel in [false, true] {
                let (got, fallbacks) =
                    gemm_checked::gemm_f32(p, opa, opb, (m, k, n), bias, parallel);
                assert_eq!(
                    fallbacks, f64_fallbacks,
                    "posit<{pn},{pes}> {m}x{k}x{n} layouts {ta} {tb}"
                );
                for (o, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let w32 = w as f32;
                    mm.check((g.is_nan() && w32.is_nan()) || g.to_bits() == w32.to_bits(), || {
                        format!("posit<{pn},{pes}> {m}x{k}x{n} layouts ({ta}, {tb}) {bias:?} out[{o}]: {g:e} vs {w32:e}")
                    });
                }
            }
        }
    }
}

/// Every exact accumulator gives the checked path's bits (`quire_gemm_with`), and
/// `quire_gemm` picks the checked path.
#[test]
fn every_exact_accumulator_gives_the_same_bits() {
    use Accumulator::*;
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(4242);
    for (pn, pes, m, k, n) in [
        (16, 1, 5, 300, 7),
        (8, 2, 6, 90, 5),
        (8, 1, 4, 40, 3),
        (16, 2, 3, 50, 4),
    ] {
        let r = Ref::new(pn, pes);
        let p = r.posit();
        let a: Vec<f64> = (0..m * k)
            .map(|_| r.value(r.draw(&mut rng, exact::Draw::Mixed)))
            .collect();
        let b: Vec<f64> = (0..k * n)
            .map(|_| r.value(r.draw(&mut rng, exact::Draw::Mixed)))
            .collect();
        let rows: Vec<f64> = (0..m)
            .map(|_| r.value(r.draw(&mut rng, exact::Draw::NearOne)))
            .collect();
        assert_eq!(accumulator_for(p, k + 1), F64Checked);
        let mut want = vec![0.0; m * n];
        quire_gemm(p, &a, &b, (m, k, n), Bias::PerRow(&rows), &mut want, true);
        for acc in [F64Checked, I128, Wide] {
            let mut out = vec![0.0; m * n];
            match quire_gemm_with(
                acc,
                p,
                &a,
                &b,
                (m, k, n),
                Bias::PerRow(&rows),
                &mut out,
                false,
            ) {
                Ok(()) => {
                    for (o, (&g, &w)) in out.iter().zip(&want).enumerate() {
                        mm.check(same(g, w), || {
                            format!("posit<{pn},{pes}> {acc:?} out[{o}]: {g:e} vs {w:e}")
                        });
                    }
                }
                Err(e) => assert!(acc == I128 && 2 * p.max_scale() > 62, "{e}"),
            }
        }
    }
    mm.assert_none("accumulators");
}

/// Sums whose f64 evaluation loses low bits under a maxpos² term that later cancels: in
/// posit<16,1>, `2^56 + 1024 + 6 - 2^56` summed in order is 1024 in f64 (2^56's spacing
/// is 16), which rounds to the posit 1024, while the exact 1030 rounds to 1032. The error
/// is within the bound, so these fall back; a bound a few times too small would let the f64
/// result through.
#[test]
fn lossy_f64_sums_fall_back_and_equal_the_quire() {
    let mut mm = Mismatches::default();
    let p = posit(16, 1);
    let x = p.max_pos();
    assert_eq!(p.round(1030.0, NearestEven, 0), 1032.0);
    let mut fallbacks = 0;
    let mut rows = 0;
    for small in [6.0, 5.0, 7.0, 2.0, -6.0, -2.0] {
        for order in [
            [0, 1, 2, 3],
            [1, 0, 2, 3],
            [0, 2, 1, 3],
            [1, 2, 0, 3],
            [0, 1, 3, 2],
        ] {
            let terms = [(x, x), (1024.0, 1.0), (small, 1.0), (-x, x)];
            let a: Vec<f64> = order.iter().map(|&t| terms[t].0).collect();
            let b: Vec<f64> = order.iter().map(|&t| terms[t].1).collect();
            let what = format!("1024 + {small} under maxpos², order {order:?}");
            fallbacks += check(&mut mm, p, &a, &b, (1, 4, 1), Bias::None, &what);
            rows += 1;
        }
    }
    mm.assert_none("lossy sums");
    assert_eq!(fallbacks, rows, "every lossy sum falls back");
}
