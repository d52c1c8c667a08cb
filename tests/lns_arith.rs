//! LNS arithmetic (`qcandle::lns`) against the high-precision reference of
//! `tests/common/lns_reference.rs` (series evaluation at 320 bits, no code shared with src/):
//! the Gaussian logarithms of every implementation, sums, products and quotients of code
//! pairs, conversions to and from f64, the named edge cases, and the naive matrix product.

mod common;
#[path = "common/lns_reference.rs"]
mod reference;

use common::SplitMix;
use num_bigint::BigInt;
use qcandle::format::lns::Lns;
use qcandle::lns::{lns_matmul, lns_matmul_f64, GaussLog, LnsArith, LnsError, LnsValue};
use reference::Place;

fn lns(w: u32, f: u32) -> Lns {
    Lns::new(w, f).unwrap()
}

fn arith(l: Lns, g: GaussLog) -> LnsArith {
    LnsArith::new(l, g).unwrap()
}

/// xlns's default table for `f`: grid `2^-((f-5)/2)`, no guard bits.
fn xlns_table(f: u32) -> GaussLog {
    GaussLog::Table {
        grid_bits: f.saturating_sub(5) / 2,
        guard_bits: 0,
    }
}

/// The table configurations whose worst errors the module docs state.
fn documented_tables(f: u32) -> Vec<GaussLog> {
    let g = f.saturating_sub(5) / 2;
    vec![
        xlns_table(f),
        GaussLog::Table {
            grid_bits: g,
            guard_bits: 4,
        },
        GaussLog::Table {
            grid_bits: (g + 2).min(f),
            guard_bits: 4,
        },
    ]
}

/// Worst |error| (in units of k) of sb and db over the `zs`, for an implementation.
#[derive(Debug, Default, Clone, Copy)]
struct Worst {
    sb: f64,
    db: f64,
}

/// Checks Ideal (nearest) and Truncated (floor) exactly against the reference at every `z`
/// of `zs` and returns the worst errors of the `tables`.
fn check_gauss(f: u32, zs: &[i64], tables: &[GaussLog]) -> Vec<Worst> {
    let w = if f + 2 < 8 { 8 } else { f + 2 };
    let l = lns(w.min(32), f);
    let ideal = arith(l, GaussLog::Ideal);
    let trunc = arith(l, GaussLog::Truncated);
    let tabs: Vec<LnsArith> = tables.iter().map(|&g| arith(l, g)).collect();
    let mut worst = vec![Worst::default(); tabs.len()];
    for &z in zs {
        let sb = reference::sb(z, f);
        assert_eq!(
            ideal.sb(z),
            reference::nearest(&sb),
            "f = {f}: Ideal sb({z})"
        );
        let (fl, exact) = reference::floor(&sb);
        assert!(
            !exact || z == 0,
            "f = {f}: sb({z}) is an integer only at z = 0"
        );
        assert_eq!(trunc.sb(z), fl, "f = {f}: Truncated sb({z})");
        for (t, wst) in tabs.iter().zip(worst.iter_mut()) {
            wst.sb = wst.sb.max(reference::error(t.sb(z), &sb).abs());
        }
        if z == 0 {
            continue;
        }
        let db = reference::db(z, f);
        assert_eq!(
            ideal.db(z),
            Some(reference::nearest(&db)),
            "f = {f}: Ideal db({z})"
        );
        let (fl, exact) = reference::floor(&db);
        assert!(
            !exact || z == -(1 << f),
            "f = {f}: db({z}) is an integer only at z = -2^f"
        );
        assert_eq!(trunc.db(z), Some(fl), "f = {f}: Truncated db({z})");
        for (t, wst) in tabs.iter().zip(worst.iter_mut()) {
            wst.db = wst.db.max(reference::error(t.db(z).unwrap(), &db).abs());
        }
    }
    for (g, wst) in tables.iter().zip(&worst) {
        eprintln!("| {g:?} | {f} | {:.4} | {:.4} |", wst.sb, wst.db);
    }
    worst
}

/// Every z from -(f+3) 2^f to 0.
fn every_z(f: u32) -> Vec<i64> {
    (-((f as i64 + 3) << f)..=0).collect()
}

/// `n` random z in [-(f+3) 2^f, 0], with 0, -1, -2^f and the ends.
fn sampled_z(f: u32, n: usize, seed: u64) -> Vec<i64> {
    let span = (f as u64 + 3) << f;
    let mut rng = SplitMix(seed);
    let mut zs: Vec<i64> = (0..n).map(|_| -(rng.below(span + 1) as i64)).collect();
    zs.extend([0, -1, -(1 << f), -(span as i64)]);
    zs
}

#[test]
fn ideal_and_truncated_gaussian_logs_are_exact_for_every_z_of_small_f() {
    for f in [0, 1, 2, 3, 4, 5, 6, 8, 10] {
        check_gauss(f, &every_z(f), &[]);
    }
}

/// The documented worst errors (module docs of `qcandle::lns`), per f and table config, as
/// (sb, db) upper bounds in units of k: the measured figures rounded up at the third decimal.
fn documented_bound(f: u32, config: usize) -> (f64, f64) {
    match (f, config) {
        (8, 0) => (1.662, 1.565),
        (8, 1) => (1.797, 1.450),
        (8, 2) => (0.568, 0.965),
        (12, 0) => (1.615, 1.943),
        (12, 1) => (1.878, 1.961),
        (12, 2) => (0.607, 1.012),
        (20, 0) => (1.577, 1.928),
        (20, 1) => (1.856, 1.602),
        (20, 2) => (0.604, 1.023),
        _ => panic!("no documented bound for f = {f}, table {config}"),
    }
}

#[test]
fn gaussian_log_worst_errors_f8_f12_every_z() {
    for f in [8, 12] {
        let tables = documented_tables(f);
        let worst = check_gauss(f, &every_z(f), &tables);
        for (i, w) in worst.iter().enumerate() {
            let (sb, db) = documented_bound(f, i);
            assert!(w.sb <= sb && w.db <= db, "f = {f}, {:?}: {w:?}", tables[i]);
        }
    }
}

#[test]
fn gaussian_log_worst_errors_f20_sampled() {
    let f = 20;
    let tables = documented_tables(f);
    let worst = check_gauss(f, &sampled_z(f, 20_000, 20), &tables);
    for (i, w) in worst.iter().enumerate() {
        let (sb, db) = documented_bound(f, i);
        assert!(w.sb <= sb && w.db <= db, "f = {f}, {:?}: {w:?}", tables[i]);
    }
}

#[test]
fn ideal_and_truncated_gaussian_logs_are_exact_at_f23_and_f30_sampled() {
    check_gauss(23, &sampled_z(23, 3000, 23), &[]);
    check_gauss(30, &sampled_z(30, 3000, 30), &[]);
}

#[test]
fn gaussian_logs_far_below_zero_vanish() {
    // z <= -(f+2) 2^f: sb in (0, 0.37), db in (-0.49, 0).
    for f in [0, 3, 10] {
        let l = lns(16, f);
        for g in [GaussLog::Ideal, GaussLog::Truncated, xlns_table(f)] {
            let a = arith(l, g);
            for z in [-((f as i64 + 2) << f), -1 << 40, i32::MIN as i64 * 2] {
                let floor = g == GaussLog::Truncated;
                assert_eq!(a.sb(z), 0, "{g:?} sb({z})");
                assert_eq!(a.db(z), Some(if floor { -1 } else { 0 }), "{g:?} db({z})");
            }
        }
    }
}

/// The magnitude `2^(k/2^f)` of a code in the reference's fixed point.
fn magnitude(k: i32, f: u32) -> BigInt {
    reference::pow2(k as i64, f)
}

/// The expected `a + b` under `GaussLog::Ideal` (`floor = false`) or `Truncated`
/// (`floor = true`), from the exact sum of the two values in the reference's arithmetic.
fn expected_sum(l: Lns, a: LnsValue, b: LnsValue, floor: bool) -> LnsValue {
    let f = l.f();
    let (sa, ka, sb, kb) = match (a, b) {
        (LnsValue::NaN, _) | (_, LnsValue::NaN) => return LnsValue::NaN,
        (LnsValue::Zero, x) | (x, LnsValue::Zero) => return x,
        (
            LnsValue::Finite {
                negative: sa,
                k: ka,
            },
            LnsValue::Finite {
                negative: sb,
                k: kb,
            },
        ) => (sa, ka, sb, kb),
    };
    let va = if sa {
        -magnitude(ka, f)
    } else {
        magnitude(ka, f)
    };
    let vb = if sb {
        -magnitude(kb, f)
    } else {
        magnitude(kb, f)
    };
    let sum = va + vb;
    if sum == BigInt::from(0) {
        return LnsValue::Zero;
    }
    let negative = sum < BigInt::from(0);
    let logk = reference::log_units(&if negative { -sum } else { sum }, f);
    let k = if floor {
        match reference::place(&logk) {
            // Exact only for x + x (doubling) and 2x - x.
            Place::AtInteger(n) => n,
            Place::Between(n) => n,
        }
    } else {
        reference::nearest(&logk)
    };
    if k > l.k_max() {
        LnsValue::Finite {
            negative,
            k: l.k_max() as i32,
        }
    } else if k < l.k_min() {
        LnsValue::Zero
    } else {
        LnsValue::Finite {
            negative,
            k: k as i32,
        }
    }
}

/// Every pattern of `l`.
fn all_codes(l: Lns) -> Vec<LnsValue> {
    (0..1u32 << l.w())
        .map(|b| LnsValue::from_bits(l, b).unwrap())
        .collect()
}

/// Checks `add` and `sub` of every pair of codes of `l` for Ideal and Truncated.
fn check_all_sums(l: Lns) {
    let ideal = arith(l, GaussLog::Ideal);
    let trunc = arith(l, GaussLog::Truncated);
    let codes = all_codes(l);
    for &a in &codes {
        for &b in &codes {
            let want = expected_sum(l, a, b, false);
            assert_eq!(ideal.add(a, b), want, "{l:?} Ideal {a:?} + {b:?}");
            assert_eq!(ideal.sub(a, -b), want, "{l:?} Ideal {a:?} - -{b:?}");
            let want = expected_sum(l, a, b, true);
            assert_eq!(trunc.add(a, b), want, "{l:?} Truncated {a:?} + {b:?}");
        }
    }
}

#[test]
fn sums_of_every_pair_of_lns_7_3_codes_are_the_reference_roundings() {
    check_all_sums(lns(7, 3));
}

#[test]
fn sums_with_f_zero_and_f_w_minus_2() {
    check_all_sums(lns(8, 0));
    check_all_sums(lns(8, 6));
}

#[test]
fn sums_at_the_narrowest_width() {
    check_all_sums(lns(3, 0));
    check_all_sums(lns(3, 1));
}

#[test]
fn products_and_quotients_of_every_pair_of_lns_6_2_codes() {
    let l = lns(6, 2);
    let a = arith(l, GaussLog::Ideal);
    let codes = all_codes(l);
    for &x in &codes {
        for &y in &codes {
            let (p, q) = (a.mul(x, y), a.div(x, y));
            match (x, y) {
                (LnsValue::NaN, _) | (_, LnsValue::NaN) => {
                    assert!(p.is_nan() && q.is_nan(), "{x:?}, {y:?}");
                }
                (_, LnsValue::Zero) => {
                    assert!(p.is_zero() && q.is_nan(), "{x:?} * / 0");
                }
                (LnsValue::Zero, _) => assert!(p.is_zero() && q.is_zero(), "0 * / {y:?}"),
                (
                    LnsValue::Finite {
                        negative: sx,
                        k: kx,
                    },
                    LnsValue::Finite {
                        negative: sy,
                        k: ky,
                    },
                ) => {
                    let (mx, my) = (magnitude(kx, 2), magnitude(ky, 2));
                    let prod = reference::log_units(&((&mx * &my) >> reference::P), 2);
                    let quot = reference::log_units(&((&mx << reference::P) / &my), 2);
                    for (got, exact, what) in [(p, prod, "*"), (q, quot, "/")] {
                        let k = match reference::place(&exact) {
                            Place::AtInteger(k) => k,
                            Place::Between(_) => panic!("{x:?} {what} {y:?} is not a code"),
                        };
                        let want = if k > l.k_max() {
                            LnsValue::Finite {
                                negative: sx != sy,
                                k: l.k_max() as i32,
                            }
                        } else if k < l.k_min() {
                            LnsValue::Zero
                        } else {
                            LnsValue::Finite {
                                negative: sx != sy,
                                k: k as i32,
                            }
                        };
                        assert_eq!(got, want, "{x:?} {what} {y:?}");
                    }
                }
            }
        }
    }
}

/// Every implementation, for `l`: the tables only for `f <= 20` (they are built from exact
/// evaluations of sb and db at up to a million grid points, too slow for a test beyond that).
fn every_impl(l: Lns) -> Vec<LnsArith> {
    let f = l.f();
    let mut v = vec![arith(l, GaussLog::Ideal), arith(l, GaussLog::Truncated)];
    if f <= 20 {
        v.extend(documented_tables(f).into_iter().map(|g| arith(l, g)));
    }
    v
}

/// A sample of codes of `l`: the extremes, ±1 and random ones.
fn some_finite(l: Lns, n: usize, seed: u64) -> Vec<LnsValue> {
    let mut rng = SplitMix(seed);
    let span = (l.k_max() - l.k_min() + 1) as u64;
    let mut v: Vec<LnsValue> = [l.k_min(), l.k_min() + 1, -1, 0, 1, l.k_max() - 1, l.k_max()]
        .into_iter()
        .map(|k| LnsValue::finite(l, false, k).unwrap())
        .collect();
    v.extend((0..n).map(|_| {
        let k = l.k_min() + rng.below(span) as i64;
        LnsValue::finite(l, rng.coin(), k).unwrap()
    }));
    let negs: Vec<LnsValue> = v.iter().map(|&x| -x).collect();
    v.extend(negs);
    v
}

#[test]
fn zero_operands() {
    let l = lns(10, 4);
    for a in every_impl(l) {
        for x in some_finite(l, 20, 1) {
            assert_eq!(a.add(LnsValue::Zero, x), x);
            assert_eq!(a.add(x, LnsValue::Zero), x);
            assert_eq!(a.sub(LnsValue::Zero, x), -x);
            assert_eq!(a.mul(LnsValue::Zero, x), LnsValue::Zero);
            assert_eq!(a.mul(x, LnsValue::Zero), LnsValue::Zero);
            assert_eq!(a.div(LnsValue::Zero, x), LnsValue::Zero);
            assert_eq!(
                a.div(x, LnsValue::Zero),
                LnsValue::NaN,
                "x / 0 has no infinity"
            );
        }
        assert_eq!(a.add(LnsValue::Zero, LnsValue::Zero), LnsValue::Zero);
        assert_eq!(a.div(LnsValue::Zero, LnsValue::Zero), LnsValue::NaN);
    }
}

#[test]
fn nan_operands() {
    let l = lns(10, 4);
    let nan = LnsValue::NaN;
    for a in every_impl(l) {
        let mut xs = some_finite(l, 10, 2);
        xs.extend([LnsValue::Zero, nan]);
        for x in xs {
            for r in [
                a.add(nan, x),
                a.add(x, nan),
                a.sub(x, nan),
                a.mul(nan, x),
                a.mul(x, nan),
                a.div(nan, x),
                a.div(x, nan),
            ] {
                assert_eq!(r, nan, "{:?} with {x:?}", a.gauss());
            }
        }
    }
}

#[test]
fn x_plus_minus_x_is_zero() {
    for l in [lns(10, 4), lns(3, 1), lns(32, 30)] {
        for a in every_impl(l) {
            for x in some_finite(l, 20, 3) {
                assert_eq!(a.add(x, -x), LnsValue::Zero, "{:?} {x:?}", a.gauss());
                assert_eq!(a.sub(x, x), LnsValue::Zero, "{:?} {x:?}", a.gauss());
            }
        }
    }
}

#[test]
fn equal_operands_double_exactly() {
    // z = 0: sb(0) = 2^f exactly in every implementation.
    for l in [lns(10, 4), lns(8, 0), lns(8, 6), lns(32, 30)] {
        let f = l.f() as i64;
        for a in every_impl(l) {
            let ks = [l.k_min(), -3, 0, 5, l.k_max() - (1 << f)];
            for k in ks
                .into_iter()
                .filter(|&k| k >= l.k_min() && k + (1 << f) <= l.k_max())
            {
                let x = LnsValue::finite(l, true, k).unwrap();
                let want = LnsValue::finite(l, true, k + (1 << f)).unwrap();
                assert_eq!(a.add(x, x), want, "{:?} {x:?}", a.gauss());
            }
        }
    }
}

/// `2^e` as a code of `l`, when it is one.
fn power_of_two(l: Lns, e: i64) -> Option<LnsValue> {
    LnsValue::finite(l, false, e << l.f()).ok()
}

#[test]
fn overflow_saturates_to_the_largest_magnitude() {
    for l in [lns(10, 4), lns(32, 0), lns(32, 30)] {
        let max = LnsValue::finite(l, false, l.k_max()).unwrap();
        let min = LnsValue::finite(l, false, l.k_min()).unwrap();
        for a in every_impl(l) {
            assert_eq!(a.add(max, max), max, "{:?}", a.gauss());
            assert_eq!(a.add(-max, -max), -max);
            assert_eq!(a.mul(max, max), max);
            assert_eq!(a.mul(-max, max), -max);
            assert_eq!(a.div(max, -min), -max);
            if let (Some(two), Some(half)) = (power_of_two(l, 1), power_of_two(l, -1)) {
                assert_eq!(a.mul(max, two), max);
                assert_eq!(a.div(max, half), max);
            }
        }
    }
}

#[test]
fn underflow_flushes_to_zero() {
    for l in [lns(10, 4), lns(32, 0), lns(32, 30)] {
        let min = LnsValue::finite(l, false, l.k_min()).unwrap();
        let max = LnsValue::finite(l, false, l.k_max()).unwrap();
        let next = LnsValue::finite(l, false, l.k_min() + 1).unwrap();
        for a in every_impl(l) {
            assert_eq!(a.mul(min, -min), LnsValue::Zero, "{:?}", a.gauss());
            assert_eq!(a.div(min, max), LnsValue::Zero);
            if let Some(half) = power_of_two(l, -1) {
                assert_eq!(a.mul(min, half), LnsValue::Zero);
            }
            // B^(k_min+1) - B^k_min = B^(k_min + 1 + db(-1)), below k_min when f > 0
            // (db(-1) = -1 for f = 0: the difference is B^k_min itself).
            let want = if l.f() > 0 { LnsValue::Zero } else { min };
            assert_eq!(a.sub(next, min), want, "{:?}", a.gauss());
        }
    }
}

#[test]
fn a_far_smaller_operand_leaves_the_sum_unchanged() {
    // Very negative z: sb(z) -> 0 and db(z) -> 0, the sum is the larger operand (one unit
    // below it when db is truncated).
    for l in [lns(10, 4), lns(16, 8), lns(32, 0), lns(32, 20)] {
        let big = LnsValue::finite(l, false, l.k_max()).unwrap();
        let tiny = LnsValue::finite(l, true, l.k_min()).unwrap();
        for a in every_impl(l) {
            let floor = a.gauss() == GaussLog::Truncated;
            assert_eq!(a.add(big, -tiny), big, "{:?}", a.gauss());
            assert_eq!(a.add(-tiny, big), big);
            let below = LnsValue::finite(l, false, l.k_max() - 1).unwrap();
            assert_eq!(a.add(big, tiny), if floor { below } else { big });
        }
    }
}

#[test]
fn widest_formats_add_as_the_reference_on_samples() {
    // w = 32: f = 0 (values up to 2^(2^30)) and f = w - 2 = 30. The reference sum is
    // B^k_a (1 ± B^z) with 1 ± B^z in the reference's arithmetic.
    for l in [lns(32, 0), lns(32, 30), lns(32, 16)] {
        let f = l.f();
        let ideal = arith(l, GaussLog::Ideal);
        let trunc = arith(l, GaussLog::Truncated);
        let mut rng = SplitMix(u64::from(f) + 7);
        let xs = some_finite(l, 200, 5);
        for _ in 0..400 {
            let x = xs[rng.below(xs.len() as u64) as usize];
            // Close exponents half of the time, so sb and db are not all zero.
            let y = if rng.coin() {
                xs[rng.below(xs.len() as u64) as usize]
            } else if let LnsValue::Finite { k, .. } = x {
                let k = (k as i64 - rng.below(3 << f) as i64).max(l.k_min());
                LnsValue::finite(l, rng.coin(), k).unwrap()
            } else {
                unreachable!()
            };
            let (
                LnsValue::Finite {
                    negative: sx,
                    k: kx,
                },
                LnsValue::Finite {
                    negative: sy,
                    k: ky,
                },
            ) = (x, y)
            else {
                unreachable!()
            };
            let (big, sign, z) = if kx >= ky {
                (kx as i64, sx, ky as i64 - kx as i64)
            } else {
                (ky as i64, sy, kx as i64 - ky as i64)
            };
            let (want_n, want_f) = if z == 0 && sx != sy {
                (None, None)
            } else if z < -(40i64 << f) {
                (Some(big), Some(big - (sx != sy) as i64))
            } else {
                let g = if sx == sy {
                    reference::sb(z, f)
                } else {
                    reference::db(z, f)
                };
                (
                    Some(big + reference::nearest(&g)),
                    Some(big + reference::floor(&g).0),
                )
            };
            let bring = |k: Option<i64>| match k {
                None => LnsValue::Zero,
                Some(k) if k < l.k_min() => LnsValue::Zero,
                Some(k) => LnsValue::Finite {
                    negative: sign,
                    k: k.min(l.k_max()) as i32,
                },
            };
            assert_eq!(ideal.add(x, y), bring(want_n), "{l:?} {x:?} + {y:?}");
            assert_eq!(trunc.add(x, y), bring(want_f), "{l:?} {x:?} + {y:?}");
        }
    }
}

/// The neighbouring f64 above or below `x > 0`.
fn neighbour(x: f64, up: bool) -> f64 {
    f64::from_bits(if up { x.to_bits() + 1 } else { x.to_bits() - 1 })
}

/// Checks that `to_f64` of `±B^k` is the f64 nearest to it (normal results only): the f64
/// scaled by `2^-q` is compared with the reference's `2^(r/2^f)`, as are its neighbours.
fn check_to_f64(l: Lns, k: i64) {
    let f = l.f();
    let v = LnsValue::finite(l, k % 2 != 0, k).unwrap();
    let x = v.to_f64(l);
    assert_eq!(x.is_sign_negative(), k % 2 != 0);
    let q = k.div_euclid(1 << f);
    let m = reference::pow2(k.rem_euclid(1 << f), f);
    let scale = 2f64.powi(-q as i32);
    let dist = |y: f64| (reference::from_f64(y * scale) - &m).magnitude().clone();
    let d = dist(x.abs());
    for up in [true, false] {
        let n = neighbour(x.abs(), up);
        assert!(
            d < dist(n),
            "{l:?} k = {k}: {x} is not the nearest f64 ({n} is nearer)"
        );
    }
}

#[test]
fn to_f64_is_correctly_rounded() {
    let l = lns(16, 8);
    for k in l.k_min()..=l.k_max() {
        check_to_f64(l, k);
    }
    let mut rng = SplitMix(64);
    for (w, f) in [(32, 20), (32, 30), (24, 22)] {
        let l = lns(w, f);
        // Normal results: 2^-1000 .. 2^1000.
        let lo = l.k_min().max(-1000 << f);
        let hi = l.k_max().min(1000 << f);
        for _ in 0..3000 {
            check_to_f64(l, lo + rng.below((hi - lo + 1) as u64) as i64);
        }
        check_to_f64(l, lo);
        check_to_f64(l, hi);
    }
}

#[test]
fn to_f64_is_correctly_rounded_in_the_subnormal_range() {
    // lns<32,20> reaches 2^-1024: x 2^1074 is the integer N in x's bits, and the exact
    // value times 2^1074 must be within half a unit of N.
    let l = lns(32, 20);
    let mut rng = SplitMix(1074);
    let ks = (0..2000).map(|_| l.k_min() + rng.below(2 << 20) as i64);
    for k in ks.chain([l.k_min(), l.k_min() + 1]) {
        let x = LnsValue::finite(l, false, k).unwrap().to_f64(l);
        assert!(x < f64::MIN_POSITIVE);
        let n = BigInt::from(x.to_bits()) << reference::P;
        let t = reference::pow2(k + (1074 << 20), 20);
        let half = reference::one() >> 1u32;
        assert!((n - t).magnitude() < half.magnitude(), "k = {k}: {x:e}");
    }
}

#[test]
fn to_f64_at_the_ends_of_the_f64_range() {
    let l = lns(32, 0);
    let v = |k: i64| LnsValue::finite(l, false, k).unwrap().to_f64(l);
    assert_eq!(v(1023), f64::MAX / (2.0 - f64::EPSILON));
    assert_eq!(v(1024), f64::INFINITY, "beyond the largest f64");
    assert_eq!(v(-1022), f64::MIN_POSITIVE);
    assert_eq!(v(-1074), f64::from_bits(1), "the smallest subnormal");
    assert_eq!(v(-1075), 0.0, "half the smallest subnormal: a tie, to even");
    assert_eq!(v(-1076), 0.0);
    let l = lns(32, 1);
    let v = |k: i64| LnsValue::finite(l, true, k).unwrap().to_f64(l);
    assert_eq!(v(2047), -std::f64::consts::SQRT_2 * 2f64.powi(1023));
    assert_eq!(v(2048), f64::NEG_INFINITY);
    assert_eq!(v(-2149), -f64::from_bits(1), "2^-1074.5 is above the tie");
    assert_eq!(v(-2150), -0.0);
    // 2^-1069.5 = 22.63 * 2^-1074: a subnormal with 5 significant bits.
    assert_eq!(v(-2139), -f64::from_bits(23));
    assert_eq!(LnsValue::Zero.to_f64(l), 0.0);
    assert!(LnsValue::NaN.to_f64(l).is_nan());
}

/// The reference's nearest code to `x`: the log rounded to nearest and saturated, and below
/// the smallest magnitude `min` the format's value-domain rule (`|x| > min/2` gives `±min`,
/// `|x| < min/2` zero, the tie, an exact power of two only for `f = 0`, zero).
fn reference_nearest(l: Lns, x: f64) -> LnsValue {
    let f = l.f();
    let ax = reference::from_f64(x.abs());
    let k = reference::nearest(&reference::log_units(&ax, f));
    if k >= l.k_min() {
        return LnsValue::Finite {
            negative: x < 0.0,
            k: k.min(l.k_max()) as i32,
        };
    }
    let half_min = reference::pow2(l.k_min() - (1 << f), f);
    let tolerance = BigInt::from(1) << (reference::P - reference::MARGIN);
    let above = &ax - &half_min;
    if above.magnitude() <= tolerance.magnitude() {
        assert_eq!(f, 0, "min/2 is a power of two only for f = 0");
        LnsValue::Zero
    } else if above > BigInt::from(0) {
        LnsValue::Finite {
            negative: x < 0.0,
            k: l.k_min() as i32,
        }
    } else {
        LnsValue::Zero
    }
}

#[test]
fn nearest_is_the_nearest_code_in_the_logarithm_and_the_value_below_min() {
    let mut rng = SplitMix(99);
    for (w, f, span) in [
        (16, 8, 70),
        (10, 4, 10),
        (32, 20, 260),
        (32, 30, 2),
        (8, 0, 70),
    ] {
        let l = lns(w, f);
        for _ in 0..3000 {
            let x = rng.float_between(-span, span);
            assert_eq!(
                LnsValue::nearest(l, x),
                reference_nearest(l, x),
                "{l:?} {x:e}"
            );
        }
    }
}

#[test]
fn nearest_edge_cases() {
    let l = lns(10, 4);
    let max = LnsValue::finite(l, false, l.k_max()).unwrap();
    assert_eq!(
        LnsValue::nearest(l, f64::INFINITY),
        max,
        "no infinity: saturates"
    );
    assert_eq!(LnsValue::nearest(l, f64::NEG_INFINITY), -max);
    assert_eq!(LnsValue::nearest(l, 1e300), max);
    assert_eq!(LnsValue::nearest(l, f64::NAN), LnsValue::NaN);
    assert_eq!(LnsValue::nearest(l, -0.0), LnsValue::Zero);
    // k_min = -255, min = 2^-15.9375: below it the format decides in the value, so 2^-16
    // (k = -256, the reserved field) is above min/2 = 2^-16.9375 and rounds to min, 2^-17 to
    // zero.
    let min = LnsValue::finite(l, false, l.k_min()).unwrap();
    assert_eq!(LnsValue::nearest(l, 2f64.powi(-16)), min);
    assert_eq!(LnsValue::nearest(l, -2f64.powi(-17)), LnsValue::Zero);
    let half_min = min.to_f64(l) / 2.0;
    assert_eq!(LnsValue::nearest(l, half_min * (1.0 + 1e-12)), min);
    assert_eq!(
        LnsValue::nearest(l, half_min * (1.0 - 1e-12)),
        LnsValue::Zero
    );
    // f = 0: min/2 = 2^-64 is an f64, a tie, to zero (the even pattern).
    let l0 = lns(8, 0);
    let min0 = LnsValue::finite(l0, false, l0.k_min()).unwrap();
    assert_eq!(
        LnsValue::nearest(l0, 2f64.powi(-64)),
        LnsValue::Zero,
        "the tie"
    );
    assert_eq!(LnsValue::nearest(l0, neighbour(2f64.powi(-64), true)), min0);
    assert_eq!(LnsValue::nearest(l, f64::from_bits(1)), LnsValue::Zero);
    let min = LnsValue::finite(l, true, l.k_min()).unwrap();
    assert_eq!(LnsValue::nearest(l, min.to_f64(l)), min);
}

#[test]
fn nearest_inverts_to_f64_for_every_code() {
    for l in [lns(12, 6), lns(8, 0), lns(16, 14), lns(3, 1)] {
        for v in all_codes(l).into_iter().filter(|v| !v.is_nan()) {
            assert_eq!(LnsValue::nearest(l, v.to_f64(l)), v, "{l:?}");
        }
    }
}

#[test]
fn patterns_at_the_width_limits() {
    for l in [lns(3, 0), lns(3, 1)] {
        let codes = all_codes(l);
        assert_eq!(codes.len(), 8);
        assert_eq!(codes[0b010], LnsValue::Zero);
        assert_eq!(codes[0b110], LnsValue::NaN);
        let finite: Vec<i32> = codes
            .iter()
            .filter_map(|v| match v {
                LnsValue::Finite { negative: false, k } => Some(*k),
                _ => None,
            })
            .collect();
        assert_eq!(finite, [0, 1, -1], "lns<3,f> codes 0b000, 0b001, 0b011");
        for (bits, v) in codes.iter().enumerate() {
            assert_eq!(v.to_bits(l).unwrap(), bits as u32);
        }
        assert!(LnsValue::from_bits(l, 8).is_err());
    }
    let l = lns(32, 30);
    for bits in [
        0,
        1,
        0x3fff_ffff,
        0x4000_0000,
        0x7fff_ffff,
        0x8000_0000,
        0xc000_0000,
        u32::MAX,
    ] {
        let v = LnsValue::from_bits(l, bits).unwrap();
        assert_eq!(v.to_bits(l).unwrap(), bits);
    }
    assert_eq!(LnsValue::from_bits(l, 0x4000_0000).unwrap(), LnsValue::Zero);
    assert_eq!(LnsValue::from_bits(l, 0xc000_0000).unwrap(), LnsValue::NaN);
    assert_eq!(
        LnsValue::from_bits(l, u32::MAX).unwrap(),
        LnsValue::Finite {
            negative: true,
            k: -1
        }
    );
    assert!(matches!(
        LnsValue::finite(l, false, l.k_reserved()),
        Err(LnsError::Exponent { .. })
    ));
    let out_of_range = LnsValue::Finite {
        negative: false,
        k: i32::MIN,
    };
    assert!(out_of_range.to_bits(l).is_err());
}

#[test]
fn table_parameters_the_format_cannot_use_are_refused() {
    let l = lns(24, 20);
    for (grid_bits, guard_bits) in [(21, 0), (3, 0), (20, 21)] {
        let e = LnsArith::new(
            l,
            GaussLog::Table {
                grid_bits,
                guard_bits,
            },
        )
        .unwrap_err();
        assert!(matches!(e, LnsError::Table { .. }), "{e}");
        assert!(e.to_string().contains("valid"), "{e}");
    }
    let e = LnsArith::new(
        lns(32, 30),
        GaussLog::Table {
            grid_bits: 20,
            guard_bits: 0,
        },
    );
    assert!(e.is_err(), "(30 + 2) 2^20 grid entries");
}

/// A plain triple loop: `c[i][j] = (((0 + a[i][0] b[0][j]) + a[i][1] b[1][j]) + ...)`.
fn scalar_matmul(
    ar: &LnsArith,
    a: &[LnsValue],
    b: &[LnsValue],
    (m, k, n): (usize, usize, usize),
) -> Vec<LnsValue> {
    let mut c = Vec::new();
    for i in 0..m {
        for j in 0..n {
            let mut acc = LnsValue::Zero;
            for p in 0..k {
                let prod = ar.mul(a[i * k + p], b[p * n + j]);
                acc = ar.add(acc, prod);
            }
            c.push(acc);
        }
    }
    c
}

/// `len` random codes of `l` within `±2^spread` of 1, one in ten zero.
fn random_codes(l: Lns, len: usize, spread: i64, rng: &mut SplitMix) -> Vec<LnsValue> {
    (0..len)
        .map(|_| {
            if rng.below(10) == 0 {
                LnsValue::Zero
            } else {
                let span = (2 * spread) << l.f();
                let k = rng.below(span as u64 + 1) as i64 - (spread << l.f());
                LnsValue::finite(l, rng.coin(), k).unwrap()
            }
        })
        .collect()
}

#[test]
fn lns_matmul_equals_a_scalar_reference_loop() {
    let l = lns(12, 6);
    let mut rng = SplitMix(5);
    for ar in every_impl(l) {
        for shape @ (m, k, n) in [(5, 7, 3), (1, 40, 1), (4, 1, 6)] {
            let a = random_codes(l, m * k, 3, &mut rng);
            let b = random_codes(l, k * n, 3, &mut rng);
            let c = lns_matmul(&ar, &a, &b, m, k, n).unwrap();
            assert_eq!(
                c,
                scalar_matmul(&ar, &a, &b, shape),
                "{:?} {shape:?}",
                ar.gauss()
            );
        }
    }
}

#[test]
fn lns_matmul_refuses_mismatched_shapes() {
    let l = lns(12, 6);
    let ar = arith(l, GaussLog::Ideal);
    let x = [LnsValue::ONE; 6];
    for (a, b, m, k, n) in [(&x[..5], &x[..], 2, 3, 2), (&x[..], &x[..4], 2, 3, 2)] {
        let e = lns_matmul(&ar, a, b, m, k, n).unwrap_err();
        assert!(matches!(e, LnsError::Shape { .. }), "{e}");
    }
    let e = lns_matmul(&ar, &x, &x, usize::MAX, 2, 1).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    // k = 0: both operands are empty, the product would still have m n elements.
    let e = lns_matmul(&ar, &[], &[], usize::MAX, 0, 2).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    let e = lns_matmul(&ar, &[], &[], 1 << 31, 0, 1 << 31).unwrap_err();
    assert!(e.to_string().contains("allocate"), "{e}");
    assert!(lns_matmul_f64(&ar, &[1.0; 3], &[1.0; 2], 1, 2, 1).is_err());
}

#[test]
fn lns_matmul_of_empty_shapes() {
    let ar = arith(lns(12, 6), GaussLog::Ideal);
    let x = [LnsValue::ONE; 6];
    assert!(lns_matmul(&ar, &[], &x[..0], 0, 3, 0).unwrap().is_empty());
    assert!(lns_matmul(&ar, &x[..3], &[], 1, 3, 0).unwrap().is_empty());
    // k = 0: every dot product is the empty sum, zero.
    assert_eq!(
        lns_matmul(&ar, &[], &[], 2, 0, 3).unwrap(),
        vec![LnsValue::Zero; 6]
    );
}

/// Per-operation relative error bound `2^(e/2^f) - 1` for an error of `e` units of k.
fn relative(e: f64, f: u32) -> f64 {
    (e / (f as f64).exp2()).exp2() - 1.0
}

#[test]
fn lns_matmul_drift_from_the_f64_product() {
    // lns<20,12> (magnitudes 2^-64..2^64), entries uniform in [-1, 1], 16x64x16. The a priori
    // bound of recursive summation: |c - c_f64| <= ((1+d_in)^2 (1+d)^k - 1) sum_p |a||b|,
    // with d_in = 2^(0.5/2^f) - 1 (rounding the inputs in) and d = 2^(e/2^f) - 1 for an
    // implementation whose sb and db are at most e units off.
    let l = lns(20, 12);
    let f = l.f();
    let (m, k, n) = (16, 64, 16);
    let mut rng = SplitMix(2024);
    let mut uniform = |len: usize| -> Vec<f64> {
        (0..len)
            .map(|_| (rng.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
            .collect()
    };
    let (a, b) = (uniform(m * k), uniform(k * n));
    let d_in = relative(0.5, f);
    let tables = documented_tables(f);
    let mut impls = vec![(GaussLog::Ideal, 0.5), (GaussLog::Truncated, 1.0)];
    for (i, &t) in tables.iter().enumerate() {
        let (sb, db) = documented_bound(f, i);
        impls.push((t, sb.max(db)));
    }
    for (g, e) in impls {
        let c = lns_matmul_f64(&arith(l, g), &a, &b, m, k, n).unwrap();
        let bound_factor = (1.0 + d_in).powi(2) * (1.0 + relative(e, f)).powi(k as i32) - 1.0;
        let (mut worst, mut mean) = (0.0f64, 0.0f64);
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut scale) = (0.0, 0.0);
                for p in 0..k {
                    exact += a[i * k + p] * b[p * n + j];
                    scale += (a[i * k + p] * b[p * n + j]).abs();
                }
                let rel = (c[i * n + j] - exact).abs() / scale;
                assert!(
                    rel <= bound_factor * (1.0 + 1e-9),
                    "{g:?} c[{i}][{j}]: {rel:e} above the bound {bound_factor:e}"
                );
                worst = worst.max(rel);
                mean += rel / (m * n) as f64;
            }
        }
        eprintln!(
            "lns<20,12> 16x64x16 {g:?}: |c - c_f64| / sum|a||b|: worst {worst:.3e}, mean {mean:.3e} (bound {bound_factor:.3e})"
        );
    }
}

#[test]
fn sb_and_db_take_any_z() {
    // z > 0 by sb(z) = z + sb(-z), db(z) = z + db(-z); z = 0 has no db; the extremes of i64
    // are far values.
    let l = lns(12, 8);
    for a in every_impl(l) {
        let floor = a.gauss() == GaussLog::Truncated;
        for z in [1, 5, 255, 256, 3000, 1 << 20] {
            assert_eq!(a.sb(z), z + a.sb(-z), "{:?} sb({z})", a.gauss());
            assert_eq!(
                a.db(z),
                Some(z + a.db(-z).unwrap()),
                "{:?} db({z})",
                a.gauss()
            );
        }
        assert_eq!(a.db(0), None, "1 - B^0 is exactly zero");
        assert_eq!(a.sb(i64::MIN), 0);
        assert_eq!(a.db(i64::MIN), Some(if floor { -1 } else { 0 }));
        assert_eq!(a.sb(i64::MAX), i64::MAX);
        assert_eq!(a.db(i64::MAX), Some(i64::MAX - floor as i64));
    }
}

/// `LnsValue::nearest` (a shortcut where an estimate of the logarithm decides) against the
/// format's own exact rounding and the reference, on the inputs the shortcut must get right:
/// codes' own f64 values and their f32s (near an integer logarithm), and the f64s nearest to
/// the midpoints `2^((k + 1/2)/2^f)` between two codes (the shortcut must leave those to
/// the exact rounding), across the range and at its ends.
#[test]
fn nearest_of_codes_and_of_midpoints_is_the_formats_rounding() {
    use qcandle::format::rounding::NearestEven;
    let mut rng = SplitMix(123);
    for (w, f) in [
        (8, 3),
        (16, 8),
        (16, 10),
        (24, 16),
        (31, 23),
        (32, 23),
        (32, 30),
    ] {
        let l = lns(w, f);
        // Values of lns<32,f+1> (value() takes any k): odd k' are the midpoints of lns<w,f>.
        let finer = lns(32, (f + 1).min(30));
        for i in 0..2000 {
            let k = match i % 4 {
                0 => l.k_max() - rng.below(3) as i64,
                1 => l.k_min() + rng.below(3) as i64,
                _ => l.k_min() + rng.below((l.k_max() - l.k_min()) as u64) as i64,
            };
            let code = LnsValue::finite(l, rng.coin(), k).unwrap();
            let v = code.to_f64(l);
            let mid = if f < 30 {
                finer.value(2 * k + 1).min(f64::MAX)
            } else {
                v * (1.0 + 2.0 * f64::EPSILON)
            };
            for x in [
                v,
                f64::from(v as f32),
                mid,
                -mid,
                mid * (1.0 + f64::EPSILON),
            ] {
                if !x.is_finite() || x == 0.0 {
                    continue;
                }
                let want: LnsValue = l.round_code(x, NearestEven, 0).into();
                assert_eq!(LnsValue::nearest(l, x), want, "{l:?} k = {k}: {x:e}");
                if x == v {
                    assert_eq!(want, code, "{l:?}: a code's value rounds to the code");
                }
            }
            if i % 50 == 0 {
                assert_eq!(
                    LnsValue::nearest(l, mid),
                    reference_nearest(l, mid),
                    "{l:?} {mid:e}"
                );
            }
        }
    }
}
