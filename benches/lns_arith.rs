//! LNS additions per second (`qcandle::lns::LnsArith::add`) for each Gaussian-log
//! implementation, against f64 additions of the same values (the baseline, first entry).
//!
//! Formats lns<16,10> and lns<24,16>; 4096 pairs of positive and negative codes whose
//! exponents differ by `|z| < (f+2) 2^f` (where sb and db are not yet at their far value, so
//! no pair takes the far-apart shortcut). Throughput is in additions; the ratio of each
//! entry's elem/s to `f64-add`'s is the figure of merit. For lns<16,10> `Ideal` and
//! `Truncated` are table lookups (tabulated for `f <= 10`); for lns<24,16> they decide every
//! rounding by interval arithmetic (u128 fixed point, big integers when undecided). The tables are built before timing. The
//! `Table` entries are xlns's default grid (`(f - 5) / 2` bits) and a finer one with guards.
//!
//! Run: `cargo bench --bench lns_arith`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qcandle::format::lns::Lns;
use qcandle::lns::{GaussLog, LnsArith, LnsValue};

const PAIRS: usize = 4096;

/// SplitMix64 step.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn pairs(lns: Lns) -> Vec<(LnsValue, LnsValue)> {
    let f = lns.f() as i64;
    let reach = (f + 2) << f;
    let mut s = 11u64;
    (0..PAIRS)
        .map(|_| {
            let ka = (next(&mut s) % reach as u64) as i64;
            let kb = ka - (next(&mut s) % reach as u64) as i64;
            let a = LnsValue::finite(lns, next(&mut s) & 1 == 1, ka).unwrap();
            let b = LnsValue::finite(lns, next(&mut s) & 1 == 1, kb).unwrap();
            (a, b)
        })
        .collect()
}

fn bench_add(c: &mut Criterion) {
    for (w, f) in [(16, 10), (24, 16)] {
        bench_format(c, Lns::new(w, f).unwrap());
    }
}

fn bench_format(c: &mut Criterion, lns: Lns) {
    let codes = pairs(lns);
    let values: Vec<(f64, f64)> = codes
        .iter()
        .map(|&(a, b)| (a.to_f64(lns), b.to_f64(lns)))
        .collect();
    let mut g = c.benchmark_group(format!("lns<{},{}>-add", lns.w(), lns.f()));
    g.throughput(Throughput::Elements(PAIRS as u64));
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g.bench_function("f64-add", |b| {
        b.iter(|| {
            let mut acc = 0.0;
            for &(x, y) in black_box(&values) {
                acc += black_box(x + y);
            }
            acc
        })
    });
    let impls = [
        GaussLog::Ideal,
        GaussLog::Truncated,
        GaussLog::Table {
            grid_bits: (lns.f() - 5) / 2,
            guard_bits: 0,
        },
        GaussLog::Table {
            grid_bits: (lns.f() - 5) / 2 + 2,
            guard_bits: 4,
        },
    ];
    for gauss in impls {
        let arith = LnsArith::new(lns, gauss).unwrap();
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{gauss:?}")),
            &arith,
            |b, arith| {
                b.iter(|| {
                    let mut last = LnsValue::Zero;
                    for &(x, y) in black_box(&codes) {
                        last = black_box(arith.add(x, y));
                    }
                    last
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench_add);
criterion_main!(benches);
