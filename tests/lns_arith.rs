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
            grid_bits: g + 2,
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
        assert_eq!(ideal.sb(z), reference::nearest(&sb), "f = {f}: Ideal sb({z})");
        let (fl, exact) = reference::floor(&sb);
        assert!(!exact || z == 0, "f = {f}: sb({z}) is an integer only at z = 0");
        assert_eq!(trunc.sb(z), fl, "f = {f}: Truncated sb({z})");
        for (t, wst) in tabs.iter().zip(worst.iter_mut()) {
            wst.sb = wst.sb.max(reference::error(t.sb(z), &sb).abs());
        }
        if z == 0 {
            continue;
        }
        let db = reference::db(z, f);
        assert_eq!(ideal.db(z), Some(reference::nearest(&db)), "f = {f}: Ideal db({z})");
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
        eprintln!(
            "| {g:?} | {f} | {:.4} | {:.4} |",
            wst.sb, wst.db
        );
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
    for f in [0, 1, 2, 3, 4, 5, 6, 8] {
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
