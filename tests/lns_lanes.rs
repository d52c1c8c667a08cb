//! The fast LNS matrix product (`qcandle::lns::lns_gemm_lanes`) against the scalar definition
//! (`LnsArith::mul` and `LnsArith::add`, `k` ascending from zero, bias last), bit for bit:
//! every implementation, `f` from 3 to 30 (exact tables, the f64 evaluation with its exact
//! fallback, the table implementation), odd shapes and partial tiles, biases per row and per
//! column, zeros, exact cancellation, saturation, flush to zero, operands outside the range,
//! NaN, and differences next to the singularity of db where the f64 path leaves the
//! decision to the exact evaluation; and the 32-bit kernel (AVX-512 and AVX2) of the exact tables at
//! its bounds (`|k| <= 2^28`, formats up to 30 bits, and the i64 kernels past them), tiles
//! of every width and row pairs with zero operands in one row. The f32 entry of the layers
//! (`qcandle::quire::gemm_lns::lns_gemm_f32`) in bands of rows on pools of 2 to 4 threads,
//! every operand layout, against the definition on the operands' nearest codes.

mod common;
#[path = "common/isa_cap.rs"]
mod isa_cap;
#[path = "common/layouts.rs"]
mod layouts;

use common::SplitMix;
use isa_cap::on_every_isa;
use layouts::{pool, Layouts};
use qcandle::format::lns::Lns;
use qcandle::lns::{lns_gemm_lanes, GaussLog, LnsArith, LnsBias, LnsError, LnsValue, LANES};
use qcandle::quire::gemm_cpu::Bias;
use qcandle::quire::gemm_lns::lns_gemm_f32;

/// The definition: `c = 0; c = c + a b` for `p` ascending; `c = c + bias`.
fn scalar(
    ar: &LnsArith,
    a: &[LnsValue],
    b: &[LnsValue],
    (m, k, n): (usize, usize, usize),
    bias: LnsBias,
) -> Vec<LnsValue> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut c = LnsValue::Zero;
            for p in 0..k {
                c = ar.add(c, ar.mul(a[i * k + p], b[p * n + j]));
            }
            out.push(match bias {
                LnsBias::None => c,
                LnsBias::PerRow(v) => ar.add(c, v[i]),
                LnsBias::PerCol(v) => ar.add(c, v[j]),
            });
        }
    }
    out
}

fn fast(
    ar: &LnsArith,
    a: &[LnsValue],
    b: &[LnsValue],
    dims: (usize, usize, usize),
    bias: LnsBias,
    parallel: bool,
) -> Vec<LnsValue> {
    let mut out = vec![LnsValue::NaN; dims.0 * dims.2];
    lns_gemm_lanes(ar, a, b, dims, bias, &mut out, parallel).unwrap();
    out
}

/// Both products (parallel and not) equal the definition.
fn check(ar: &LnsArith, a: &[LnsValue], b: &[LnsValue], dims: (usize, usize, usize), what: &str) {
    let (m, _, n) = dims;
    let mut rng = SplitMix(m as u64 * 31 + n as u64);
    let l = ar.lns();
    let row_bias = codes(l, m, 2, 5, &mut rng);
    let col_bias = codes(l, n, 2, 5, &mut rng);
    for bias in [
        LnsBias::None,
        LnsBias::PerRow(&row_bias),
        LnsBias::PerCol(&col_bias),
    ] {
        let want = scalar(ar, a, b, dims, bias);
        on_every_isa(|isa| {
            for parallel in [true, false] {
                let got = fast(ar, a, b, dims, bias, parallel);
                let bad: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
                if let Some(&i) = bad.first() {
                    panic!(
                        "lns<{},{}> {:?} {what} {dims:?} {bias:?} {isa:?} parallel {parallel}: {} of {} outputs differ; output {i} is {:?}, the definition {:?}",
                        l.w(),
                        l.f(),
                        ar.gauss(),
                        bad.len(),
                        want.len(),
                        got[i],
                        want[i]
                    );
                }
            }
        });
    }
}

/// `len` random codes within `2^±spread` of 1, one in `zeros` zero.
fn codes(l: Lns, len: usize, spread: i64, zeros: u64, rng: &mut SplitMix) -> Vec<LnsValue> {
    (0..len)
        .map(|_| {
            if rng.below(zeros) == 0 {
                LnsValue::Zero
            } else {
                let span = (2 * spread) << l.f();
                let k = (rng.below(span as u64 + 1) as i64 - (spread << l.f()))
                    .clamp(l.k_min(), l.k_max());
                LnsValue::finite(l, rng.coin(), k).unwrap()
            }
        })
        .collect()
}

/// Ideal, truncated and (where the format allows) xlns's default table.
fn impls(l: Lns) -> Vec<LnsArith> {
    let table = GaussLog::Table {
        grid_bits: l.f().saturating_sub(5) / 2,
        guard_bits: 0,
    };
    [GaussLog::Ideal, GaussLog::Truncated, table]
        .into_iter()
        .filter_map(|g| LnsArith::new(l, g).ok())
        .collect()
}

const FORMATS: [(u32, u32); 13] = [
    (8, 3),
    (12, 6),
    (16, 8),
    (16, 10),
    (24, 4),
    (30, 10),
    (32, 9),
    (16, 11),
    (20, 12),
    (24, 16),
    (26, 23),
    (32, 23),
    (32, 30),
];

#[test]
fn random_products_equal_the_definition() {
    for (w, f) in FORMATS {
        let l = Lns::new(w, f).unwrap();
        let mut rng = SplitMix(u64::from(w * 100 + f));
        for ar in impls(l) {
            for dims @ (m, k, n) in [
                (1, 1, 1),
                (3, 5, 2),
                (2, 9, 8),
                (3, 17, 10),
                (2, 9, 20),
                (2, 40, LANES),
                (2, 37, LANES + 13),
                (4, 0, 3),
                (1, 64, 2 * LANES + 1),
            ] {
                let a = codes(l, m * k, 3, 5, &mut rng);
                let b = codes(l, k * n, 3, 5, &mut rng);
                check(&ar, &a, &b, dims, "random");
            }
        }
    }
}

/// `±B^k`, `k` clamped into the range.
fn finite(l: Lns, negative: bool, k: i64) -> LnsValue {
    LnsValue::finite(l, negative, k.clamp(l.k_min(), l.k_max())).unwrap()
}

/// Columns that cancel exactly (`x - x`), come back from zero, and differ by a few units
/// next to the singularity of db (`u` from 1 to past the f64 path's near table, where its
/// bound sends doubtful cases to the exact decision).
#[test]
fn cancellation_and_near_differences_equal_the_definition() {
    for (w, f) in FORMATS {
        let l = Lns::new(w, f).unwrap();
        for ar in impls(l) {
            let k = 9;
            let n = 2 * LANES + 5;
            let a = vec![LnsValue::ONE; k];
            let mut b = vec![LnsValue::Zero; k * n];
            for j in 0..n {
                let base = (j as i64 * 7919) % (1 << f).max(1);
                let u = [1, 2, 3, 1000, 1023, 1024, 1025, 1500, 3001, 1 << 12][j % 10];
                let col = [
                    finite(l, false, base),
                    finite(l, true, base), // exact cancellation to zero
                    finite(l, true, base), // zero + x
                    finite(l, false, (base + u).min(l.k_max())), // a difference next to 1 - B^-u
                    finite(l, j % 3 == 0, base - 2 * u),
                    LnsValue::Zero,
                    finite(l, true, (base + u).min(l.k_max())),
                    finite(l, false, base + 1),
                    finite(l, j % 2 == 0, base),
                ];
                for (p, v) in col.into_iter().enumerate() {
                    b[p * n + j] = v;
                }
            }
            check(&ar, &a, &b, (1, k, n), "cancellation");
            // Each difference at f >= 11 alone, scaled over the range.
            let a2: Vec<LnsValue> = (0..3)
                .map(|i| finite(l, false, i * (l.k_max() / 4)))
                .collect();
            check(&ar, &a2, &b[..3 * n], (1, 3, n), "scaled");
        }
    }
}

/// Products and sums beyond the largest value saturate, below the smallest flush to zero,
/// and operands outside the range are read exactly.
#[test]
fn saturation_and_flush_equal_the_definition() {
    for (w, f) in FORMATS {
        let l = Lns::new(w, f).unwrap();
        let mut rng = SplitMix(u64::from(f) + 7);
        for ar in impls(l) {
            let (m, k, n) = (3, 11, LANES + 3);
            let edge = |rng: &mut SplitMix| {
                let (lo, hi) = (l.k_min(), l.k_max());
                let k = match rng.below(6) {
                    0 => hi - rng.below(3) as i64,
                    1 => lo + rng.below(3) as i64,
                    2 => hi / 2 + 1 - rng.below(3) as i64,
                    3 => lo / 2 - 1 + rng.below(3) as i64,
                    4 => 0,
                    _ => return LnsValue::Zero,
                };
                finite(l, rng.coin(), k)
            };
            let a: Vec<LnsValue> = (0..m * k).map(|_| edge(&mut rng)).collect();
            let b: Vec<LnsValue> = (0..k * n).map(|_| edge(&mut rng)).collect();
            check(&ar, &a, &b, (m, k, n), "edges");
            // Operands a few units outside the range (the arithmetic reads them exactly).
            let outside = |v: LnsValue, d: i32| match v {
                LnsValue::Finite { negative, k } if k != 0 => LnsValue::Finite {
                    negative,
                    k: k + d * k.signum(),
                },
                other => other,
            };
            let a: Vec<LnsValue> = a.iter().map(|&v| outside(v, 3)).collect();
            let want_bias: Vec<LnsValue> = (0..n)
                .map(|j| outside(finite(l, j % 2 == 0, l.k_max() - (j % 3) as i64), 2))
                .collect();
            let dims = (m, k, n);
            let bias = LnsBias::PerCol(&want_bias);
            let want = scalar(&ar, &a, &b, dims, bias);
            on_every_isa(|isa| {
                assert_eq!(
                    fast(&ar, &a, &b, dims, bias, true),
                    want,
                    "lns<{w},{f}> {:?} {isa:?} outside the range",
                    ar.gauss()
                );
            });
        }
    }
}

/// Sums `1 + B^-u` and differences `1 - B^-u` whose f64 estimate lies within `10^-4` units
/// of a rounding boundary (a half for ideal, an integer for truncated): inside the bound of
/// the f64 path at `f = 30`, so these lanes go to the exact decision, in tiles whose other
/// lanes do not.
#[test]
fn lanes_near_a_rounding_boundary_equal_the_definition() {
    let (w, f) = (32, 30);
    let l = Lns::new(w, f).unwrap();
    let scale = (1u64 << f) as f64;
    for ar in impls(l).into_iter().take(2) {
        let target = if ar.gauss() == GaussLog::Ideal {
            0.5
        } else {
            0.0
        };
        let mut rng = SplitMix(99);
        let mut near = Vec::new();
        while near.len() < 3 * LANES {
            let u = 2048 + rng.below(30 << f) as i64;
            let same = near.len() % 2 == 0;
            let t = (-(u as f64) / scale).exp2();
            let v = (if same { 1.0 + t } else { 1.0 - t }).log2() * scale;
            let fr = v - v.floor();
            if (fr - target).abs().min((fr - target - 1.0).abs()) < 1e-4 {
                near.push((u, same));
            }
        }
        // Column j: 1, then ±B^-u (a sum or a difference near a boundary), then a far term;
        // every third column an ordinary sum instead.
        let (k, n) = (3, near.len());
        let mut b = vec![LnsValue::Zero; k * n];
        for (j, &(u, same)) in near.iter().enumerate() {
            let u = if j % 3 == 2 { 12345 + j as i64 } else { u };
            b[j] = LnsValue::ONE;
            b[n + j] = finite(l, !same, -u);
            b[2 * n + j] = finite(l, j % 2 == 0, -(1 << 20) - j as i64);
        }
        check(&ar, &[LnsValue::ONE; 3], &b, (1, k, n), "near a boundary");
    }
}

#[test]
fn a_nan_operand_is_the_definitions_nan() {
    let l = Lns::new(16, 8).unwrap();
    let mut rng = SplitMix(3);
    for ar in impls(l) {
        let (m, k, n) = (4, 6, 5);
        let mut a = codes(l, m * k, 2, 4, &mut rng);
        let b = codes(l, k * n, 2, 4, &mut rng);
        a[7] = LnsValue::NaN;
        check(&ar, &a, &b, (m, k, n), "nan");
        let got = fast(&ar, &a, &b, (m, k, n), LnsBias::None, true);
        assert!(got[n..2 * n].iter().all(|v| v.is_nan()), "row 1 is NaN");
        assert!(!got[0].is_nan());
    }
}

#[test]
fn short_slices_are_refused() {
    let l = Lns::new(16, 8).unwrap();
    let ar = LnsArith::new(l, GaussLog::Ideal).unwrap();
    let x = [LnsValue::ONE; 6];
    let mut out = [LnsValue::Zero; 4];
    for (a, b, bias, o) in [
        (&x[..5], &x[..], LnsBias::None, 4),
        (&x[..], &x[..5], LnsBias::None, 4),
        (&x[..], &x[..], LnsBias::None, 3),
        (&x[..], &x[..], LnsBias::PerRow(&x[..1]), 4),
        (&x[..], &x[..], LnsBias::PerCol(&x[..1]), 4),
    ] {
        let e = lns_gemm_lanes(&ar, a, b, (2, 3, 2), bias, &mut out[..o], true).unwrap_err();
        assert!(matches!(e, LnsError::Shape { .. }), "{e}");
    }
    let e = lns_gemm_lanes(
        &ar,
        &x,
        &x,
        (usize::MAX, 2, 1),
        LnsBias::None,
        &mut out,
        true,
    )
    .unwrap_err();
    assert!(e.to_string().contains("fewer"), "{e}");
}

/// The 32-bit kernel's bounds: ranges and operands at `±2^28` and just past (where the
/// product goes to the 64-bit kernels), formats of 30 bits (the widest it takes) and wider,
/// with extreme products that saturate and flush and sums that cancel.
#[test]
fn i32_lane_bounds_equal_the_definition() {
    for (w, f) in [(30, 10), (30, 0), (29, 7), (31, 10), (32, 4), (16, 8)] {
        let l = Lns::new(w, f).unwrap();
        let (lo, hi) = (l.k_min(), l.k_max());
        let mut rng = SplitMix(u64::from(w * 64 + f));
        for ar in impls(l).into_iter().take(2) {
            for outside in [0i64, 1 << 28, (1 << 28) + 1, -(1 << 28), -(1 << 28) - 1] {
                let (m, k, n) = (3, 13, 37);
                let pick = |rng: &mut SplitMix| -> LnsValue {
                    let k = match rng.below(9) {
                        0 => hi,
                        1 => lo,
                        2 => hi / 2 + 1 - rng.below(3) as i64,
                        3 => lo / 2 - 1 + rng.below(3) as i64,
                        4 if outside != 0 => outside,
                        5 => 0,
                        6 => return LnsValue::Zero,
                        _ => rng.below(1 << (f + 3)) as i64 - (1 << (f + 2)),
                    };
                    LnsValue::Finite {
                        negative: rng.coin(),
                        k: k as i32,
                    }
                };
                let a: Vec<LnsValue> = (0..m * k).map(|_| pick(&mut rng)).collect();
                let mut b: Vec<LnsValue> = (0..k * n).map(|_| pick(&mut rng)).collect();
                // Column 0: x - x at full scale (exact cancellation at k_max and k_min).
                for p in 0..k {
                    b[p * n] = finite(l, p % 2 == 1, if p < 6 { hi } else { lo });
                }
                check(&ar, &a, &b, (m, k, n), "i32 bounds");
            }
        }
    }
}

/// Every tile width from 1 to past two tiles, one to three rows (pairs and a row alone), and
/// rows of `A` with zeros where the other row of their pair has none.
#[test]
fn tiles_of_every_width_equal_the_definition() {
    let l = Lns::new(16, 8).unwrap();
    let mut rng = SplitMix(17);
    for ar in impls(l).into_iter().take(2) {
        for n in (1..=70).chain([127, 128, 129]) {
            for m in 1..=3 {
                let k = 7;
                let mut a = codes(l, m * k, 2, 1000, &mut rng);
                // Row 0 zero at p = 1, row 1 zero at p = 2, both zero at p = 4.
                for (i, p) in [(0, 1), (1, 2), (0, 4), (1, 4)] {
                    if i < m {
                        a[i * k + p] = LnsValue::Zero;
                    }
                }
                let b = codes(l, k * n, 2, 6, &mut rng);
                check(&ar, &a, &b, (m, k, n), "widths");
            }
        }
    }
}

/// `len` f32s within `2^±spread` of 1 (one in 97 times `2^100`, past the range of lns<16,8>
/// and lns<12,4>: they saturate), one in `zeros` zero.
fn f32s(len: usize, spread: f64, zeros: u64, rng: &mut SplitMix) -> Vec<f32> {
    (0..len)
        .map(|i| {
            if rng.below(zeros) == 0 {
                0.0
            } else {
                let e = (rng.below(1 << 20) as f64 / f64::from(1 << 20) * 2.0 - 1.0) * spread;
                let far = if i % 97 == 5 { 2f64.powi(100) } else { 1.0 };
                let x = (2f64.powf(e) * far) as f32;
                if rng.coin() {
                    -x
                } else {
                    x
                }
            }
        })
        .collect()
}

/// The f32 entry (bands of rows on pools of 2 to 4 threads, parallel or not, every layout,
/// every instruction set) against the definition on the nearest codes, output by output:
/// the exact tables in 32-bit lanes (lns<16,8>, with saturated operands and products), the f64
/// evaluation (lns<20,12>) and the table implementation (lns<12,4>), with no bias, a bias
/// per row and per column, zeros, a NaN in a row of the second band (its row is NaN, the
/// others unchanged) and a NaN in `B` (its column is NaN).
#[test]
fn the_f32_entry_in_bands_equals_the_definition() {
    let mut rng = SplitMix(41);
    let table = GaussLog::Table {
        grid_bits: 2,
        guard_bits: 0,
    };
    let cases = [
        ((16, 8), GaussLog::Ideal, (37, 61, 41)),
        ((16, 8), GaussLog::Truncated, (70, 40, 30)),
        ((20, 12), GaussLog::Ideal, (40, 33, 20)),
        ((12, 4), table, (36, 20, 9)),
    ];
    for ((w, f), gauss, dims @ (m, k, n)) in cases {
        let l = Lns::new(w, f).unwrap();
        let ar = LnsArith::new(l, gauss).unwrap();
        let mut a = f32s(m * k, 3.0, 6, &mut rng);
        let mut b = f32s(k * n, 3.0, 6, &mut rng);
        for nan in [None, Some(true), Some(false)] {
            match nan {
                // Row 20 lies in the second band of any split of these shapes.
                Some(true) => a[20 * k + 3] = f32::NAN,
                Some(false) => b[2 * n + 4] = f32::NAN,
                None => {}
            }
            let row_bias = f32s(m, 2.0, 5, &mut rng);
            let col_bias = f32s(n, 2.0, 5, &mut rng);
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
            let (row_bias, col_bias) = (wide(&row_bias), wide(&col_bias));
            let near = |v: &[f32]| -> Vec<LnsValue> {
                v.iter()
                    .map(|&x| LnsValue::nearest(l, f64::from(x)))
                    .collect()
            };
            let near64 = |v: &[f64]| -> Vec<LnsValue> {
                v.iter().map(|&x| LnsValue::nearest(l, x)).collect()
            };
            let (ac, bc) = (near(&a), near(&b));
            let (rc, cc) = (near64(&row_bias), near64(&col_bias));
            let layouts = Layouts::new(&a, &b, dims);
            for (bias, lns_bias) in [
                (Bias::None, LnsBias::None),
                (Bias::PerRow(&row_bias), LnsBias::PerRow(&rc)),
                (Bias::PerCol(&col_bias), LnsBias::PerCol(&cc)),
            ] {
                let want: Vec<f32> = scalar(&ar, &ac, &bc, dims, lns_bias)
                    .iter()
                    .map(|v| v.to_f64(l) as f32)
                    .collect();
                match nan {
                    Some(true) => assert!(want[20 * n..21 * n].iter().all(|v| v.is_nan())),
                    Some(false) => assert!((0..m).all(|i| want[i * n + 4].is_nan())),
                    None => assert!(want.iter().all(|v| !v.is_nan())),
                }
                on_every_isa(|isa| {
                    for threads in [2, 3, 4] {
                        pool(threads).install(|| {
                            for (layout, opa, opb) in layouts.each() {
                                for parallel in [true, false] {
                                    let got = lns_gemm_f32(&ar, opa, opb, dims, bias, parallel);
                                    let bad = (0..want.len())
                                        .filter(|&i| got[i].to_bits() != want[i].to_bits())
                                        .count();
                                    assert_eq!(
                                        bad, 0,
                                        "lns<{w},{f}> {gauss:?} {dims:?} nan {nan:?} {bias:?} {isa:?} {threads} threads, transposed {layout:?}, parallel {parallel}"
                                    );
                                }
                            }
                        });
                    }
                });
            }
        }
    }
}
