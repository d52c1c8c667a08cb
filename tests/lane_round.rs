//! The specialised roundings of the naive register kernel (`quire::lane_round`: integer
//! rounding for bf16-like floats, the magic-constant addition for fp16/e5m2/e4m3, per-regime
//! tables for posits with n <= 17) against `Format::round`, bit for bit, both the scalar
//! definition and the vector lanes of each instruction set this CPU has (AVX-512, and AVX2
//! with its arithmetic form of the posit tables; with the hardware's binary16 conversion
//! and without):
//! every f32 exponent byte with its fraction's low bits varied at every position, every
//! value of the format, every midpoint between neighbours and the f32 values next to those,
//! minpos/maxpos and the overflow threshold's neighbourhoods, subnormals, zeros and Inf.
//! NaN inputs give NaN or Inf (the kernel hands such lanes to the scalar definition). All
//! 2^32 patterns: the ignored test at the end.

mod common;
#[path = "common/isa_cap.rs"]
mod isa_cap;

use common::{Mismatches, SplitMix};
use isa_cap::on_every_isa;
use qcandle::backend::isa::{self, Isa};
use qcandle::format::rounding::Rounding;
use qcandle::quire::lane_round::{round_raised_run, round_run, LaneRound};
use qcandle::Format;

fn fmt(s: &str) -> Format {
    s.parse().expect("a format")
}

/// Formats that have a specialised rounding.
const FORMATS: &[&str] = &[
    "posit<16,1>",
    "posit<8,0>",
    "posit<16,0>",
    "posit<16,2>",
    "posit<12,1>",
    "posit<9,3>",
    "posit<5,4>",
    "posit<7,3>",
    "posit<17,1>",
    "posit<17,0>",
    "posit<5,2>",
    "e4m3",
    "e5m2",
    "fp16",
    "bf16",
    "float<8,10>",
    "float<8,1>",
    "float<5,2>",
    "float<4,3,fn>",
    "float<5,10,sat>",
    "float<3,2>",
    "float<6,9>",
];

/// Formats the roundings do not take (they keep the quantize plan).
const OTHERS: &[&str] = &[
    "posit<18,1>",
    "posit<24,1>",
    "float<5,10,nosub>",
    "float<8,23>",
    "float<8,7,sat>",
    "fixed<8,4>",
];

/// The test inputs of `format` (see the file docs).
fn inputs(format: &Format) -> Vec<f32> {
    let mut xs: Vec<f32> = Vec::new();
    for byte in 0..=255u32 {
        for j in 0..23 {
            for low in [1u32 << j, (1 << j) - 1, (1 << j) + 1, (1 << (j + 1)) - 1] {
                xs.push(f32::from_bits((byte << 23) | (low & 0x7f_ffff)));
            }
        }
        let mut rng = SplitMix(u64::from(byte) + 1);
        for _ in 0..64 {
            xs.push(f32::from_bits((byte << 23) | (rng.next_u32() & 0x7f_ffff)));
        }
    }
    let values: Vec<f64> = common::finite_values(format)
        .into_iter()
        .filter(|v| *v >= 0.0)
        .collect();
    let mut near = |v: f64| {
        let x = v as f32;
        xs.extend([x, x.next_up(), x.next_down()]);
    };
    for w in values.windows(2) {
        near(w[0]);
        near((w[0] + w[1]) / 2.0);
    }
    let max = *values.last().expect("values");
    near(max);
    // The overflow threshold (half a step above the largest value) and far beyond.
    let step = max - values[values.len() - 2];
    near(max + step / 2.0);
    near(max * 4.0);
    for e in -130..=130 {
        near(2f64.powi(e));
    }
    xs.extend([f32::MAX, f32::INFINITY, f32::MIN_POSITIVE, 1e-45]);
    let negative: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(negative);
    xs
}

fn same(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// Compares the scalar definition with `Format::round` (where `scalar`), and the vector
/// lanes of the active instruction set (where it has them) with the scalar definition, on
/// `xs`.
fn compare(
    name: &str,
    format: &Format,
    r: &LaneRound,
    xs: &[f32],
    scalar: bool,
    bad: &mut Mismatches,
) {
    for &x in xs.iter().filter(|_| scalar) {
        let got = r.round(x);
        if !x.is_finite() {
            // The kernel checks the inputs of roundings that clamp specials.
            bad.check(!r.keeps_specials() || !got.is_finite(), || {
                format!("{name}: round({x:e}) = {got:e}, not Inf or NaN")
            });
            continue;
        }
        let want = format.round(f64::from(x), Rounding::NearestEven, 0) as f32;
        bad.check(same(got, want), || {
            format!(
                "{name}: round({x:e} = {:#x}) = {got:e}, Format::round {want:e}",
                x.to_bits()
            )
        });
    }
    // The hardware conversion is a second kind only for binary16.
    let halves: &[bool] = if r.is_binary16() {
        &[false, true]
    } else {
        &[false]
    };
    for &hardware_half in halves {
        let mut out = vec![0f32; xs.len()];
        let Some(isa) = round_run(r, hardware_half, xs, &mut out) else {
            continue;
        };
        for (&x, &got) in xs.iter().zip(&out) {
            if !x.is_finite() {
                bad.check(!r.keeps_specials() || !got.is_finite(), || {
                    format!("{name} {isa:?}: {x:e} -> {got:e}, not Inf or NaN")
                });
                continue;
            }
            let want = r.round(x);
            bad.check(same(got, want), || {
                format!(
                    "{name} {isa:?} (hardware half {hardware_half}): {x:e} = {:#x} -> {got:e}, \
                     scalar {want:e}",
                    x.to_bits()
                )
            });
        }
    }
}

#[test]
fn specialised_roundings_equal_format_round() {
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for name in FORMATS {
        let format = fmt(name);
        let r = LaneRound::new(&format).unwrap_or_else(|| panic!("{name} has a rounding"));
        let xs = inputs(&format);
        on_every_isa(|isa| {
            checked += xs.len() as u64;
            compare(name, &format, &r, &xs, isa == Isa::Portable, &mut bad);
        });
    }
    bad.assert_none_of("specialised roundings", checked);
}

/// Every posit the tables serve has the arithmetic form of AVX2 ([`RegimeArith`]): the
/// table's entries and the form agree (checked when the table is built), and the form's
/// parity flip is what changes the even posits' cut regimes (without it their ties
/// round the wrong way).
#[test]
fn posit_tables_have_an_arithmetic_form() {
    use qcandle::quire::lane_round::PositTable;
    for name in FORMATS.iter().filter(|n| n.starts_with("posit")) {
        let Format::Posit(p) = fmt(name) else {
            unreachable!()
        };
        let table = PositTable::new(&p).expect("a table");
        let arith = table
            .arith
            .unwrap_or_else(|| panic!("{name}: no arithmetic form"));
        // The minpos regime's tie: the midpoint between minpos and the next value, on t.
        let t_tie = table.t_lo + (1 << (table.shift - 1));
        assert_eq!(
            arith.round_t(t_tie, table.shift),
            table.round_t(t_tie),
            "{name}"
        );
        let unflipped = qcandle::quire::lane_round::RegimeArith {
            flip: i32::MAX,
            ..arith
        };
        let differs = unflipped.round_t(t_tie, table.shift) != table.round_t(t_tie);
        assert_eq!(
            differs,
            p.n() % 2 == 0,
            "{name}: the flip at the minpos tie"
        );
    }
}

/// `naive` in a posit rounds doubled values (`quire::lane_round_avx512::POSIT_RAISED`), and
/// its sums without the lower clamp and the zero test (`POSIT_SUM`). The latter rests on
/// every value being a multiple of minpos (checked here for every posit above), so that a
/// sum of two values is `+0` or at least minpos in magnitude. On the inputs above whose
/// doubles are normal f32, and for the sums on those that are `+0` or at least minpos, the
/// f32 sums and differences of neighbouring values (which cancel down to minpos) and of
/// random pairs, both equal the scalar definition.
#[test]
fn posit_roundings_of_doubled_values() {
    let mut bad = Mismatches::default();
    let mut checked = 0u64;
    for name in FORMATS.iter().filter(|n| n.starts_with("posit")) {
        let format = fmt(name);
        let values = common::finite_values(&format);
        let minpos = values
            .iter()
            .copied()
            .filter(|&v| v > 0.0)
            .fold(f64::MAX, f64::min);
        for &v in &values {
            // v / minpos is exact: minpos is a power of two.
            assert_eq!(
                (v / minpos).fract(),
                0.0,
                "{name}: {v:e} is no multiple of minpos"
            );
        }
        let r = LaneRound::new(&format).expect("a rounding");
        let doubles_normal = |x: &f32| {
            x.to_bits() == 0 || (2.0 * x.abs()).is_normal() && x.abs() >= f32::MIN_POSITIVE
        };
        let xs: Vec<f32> = inputs(&format).into_iter().filter(doubles_normal).collect();
        let is_sum = |x: &f32| x.to_bits() == 0 || f64::from(x.abs()) >= minpos;
        let mut sums: Vec<f32> = xs.iter().copied().filter(is_sum).collect();
        for w in values.windows(2) {
            sums.extend([
                (w[1] - w[0]) as f32,
                (w[0] + w[1]) as f32,
                (w[0] - w[0]) as f32,
            ]);
        }
        let mut rng = SplitMix(values.len() as u64);
        for _ in 0..20_000 {
            let pick = |rng: &mut SplitMix| values[rng.next_u32() as usize % values.len()];
            let (x, y) = (pick(&mut rng), pick(&mut rng));
            sums.push((x + y) as f32);
        }
        assert!(sums.iter().all(|x| is_sum(x) && doubles_normal(x)));
        on_every_isa(|_| {
            for (kind, inputs, is_sums) in [("doubled", &xs, false), ("sums", &sums, true)] {
                let mut out = vec![0f32; inputs.len()];
                let Some(isa) = round_raised_run(&r, is_sums, inputs, &mut out) else {
                    continue;
                };
                checked += inputs.len() as u64;
                for (&x, &got) in inputs.iter().zip(&out) {
                    let want = r.round(x);
                    bad.check(same(got, want), || {
                        format!(
                            "{name} {kind} {isa:?}: {x:e} = {:#x} -> {got:e}, scalar {want:e}",
                            x.to_bits()
                        )
                    });
                }
            }
        });
    }
    bad.assert_none_of("posit roundings of doubled values", checked);
}

#[test]
fn the_roundings_apply_only_where_the_docs_say() {
    for name in OTHERS {
        assert!(LaneRound::new(&fmt(name)).is_none(), "{name}");
    }
    assert!(LaneRound::new(&fmt("fp16")).unwrap().is_binary16());
    for name in ["e5m2", "float<5,10,sat>", "bf16", "posit<16,1>"] {
        let r = LaneRound::new(&fmt(name)).unwrap();
        assert!(!r.is_binary16(), "{name}");
    }
    // Formats that overflow to Inf or NaN keep specials; posits and saturating floats clamp.
    for (name, keeps) in [
        ("fp16", true),
        ("e4m3", true),
        ("bf16", true),
        ("float<5,10,sat>", false),
        ("posit<16,1>", false),
    ] {
        assert_eq!(
            LaneRound::new(&fmt(name)).unwrap().keeps_specials(),
            keeps,
            "{name}"
        );
    }
}

/// Ties near 1: the midpoint between two neighbours rounds to the even one, and the f32
/// values on either side to the nearer one (a rounding that broke ties away from zero, or
/// read the wrong parity bit, fails here).
#[test]
fn ties_go_to_the_even_neighbour() {
    for (name, lo, hi, even) in [
        ("posit<16,1>", 1.0, 1.0 + 1.0 / 4096.0, 1.0),
        (
            "posit<16,1>",
            1.0 + 1.0 / 4096.0,
            1.0 + 2.0 / 4096.0,
            1.0 + 2.0 / 4096.0,
        ),
        ("e4m3", 1.0, 1.125, 1.0),
        ("e4m3", 1.125, 1.25, 1.25),
        ("fp16", 1.0, 1.0 + 1.0 / 1024.0, 1.0),
        ("bf16", 1.0, 1.0 + 1.0 / 128.0, 1.0),
        (
            "bf16",
            1.0 + 1.0 / 128.0,
            1.0 + 2.0 / 128.0,
            1.0 + 2.0 / 128.0,
        ),
    ] {
        let format = fmt(name);
        let r = LaneRound::new(&format).unwrap();
        let mid = ((lo + hi) / 2.0) as f32;
        for (x, want) in [
            (mid, even),
            (mid.next_down(), lo),
            (mid.next_up(), hi),
            (-mid, -even),
        ] {
            assert_eq!(r.round(x), want as f32, "{name}: {x:e}");
            let mut out = [0f32];
            on_every_isa(|_| {
                for hardware_half in [false, true] {
                    if let Some(isa) = round_run(&r, hardware_half, &[x], &mut out) {
                        assert_eq!(out[0], want as f32, "{name} {isa:?}: {x:e}");
                    }
                }
            });
        }
    }
}

/// All 2^32 f32 patterns for posit<16,1>, e4m3, e5m2, fp16 and bf16 (about a minute a
/// format on two cores): `cargo test --release --test lane_round -- --ignored`. The scalar
/// definition against `Format::round`, and the lanes of each vector instruction set this
/// CPU has against it.
#[test]
#[ignore]
fn every_f32_pattern() {
    let _guard = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    let vector: Vec<Isa> = isa_cap::available()
        .into_iter()
        .filter(|&isa| isa >= Isa::Avx2)
        .collect();
    let passes: Vec<(Option<Isa>, bool)> = match vector.split_last() {
        // The widest set's lanes in the pass that checks the scalar definition.
        Some((_, narrower)) => std::iter::once((None, true))
            .chain(narrower.iter().map(|&isa| (Some(isa), false)))
            .collect(),
        None => vec![(None, true)],
    };
    for name in ["posit<16,1>", "e4m3", "e5m2", "fp16", "bf16"] {
        let format = fmt(name);
        let r = LaneRound::new(&format).unwrap();
        for &(cap, scalar) in &passes {
            isa::set_cap(cap);
            every_pattern_under_cap(name, &format, &r, scalar);
        }
        isa::set_cap(None);
    }
}

/// The patterns of [`every_f32_pattern`] under the cap set now.
fn every_pattern_under_cap(name: &str, format: &Format, r: &LaneRound, scalar: bool) {
    use std::thread;
    let threads = thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let chunk = (1u64 << 32) / threads;
    let bad = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                s.spawn(move || {
                    let mut bad = Mismatches::default();
                    let mut xs = Vec::with_capacity(1 << 16);
                    let mut p = w * chunk;
                    while p < (w + 1) * chunk {
                        xs.clear();
                        xs.extend((p..p + (1 << 16)).map(|b| f32::from_bits(b as u32)));
                        compare(name, format, r, &xs, scalar, &mut bad);
                        p += 1 << 16;
                    }
                    bad
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker"))
            .fold(Mismatches::default(), Mismatches::merge)
    });
    bad.assert_none_of(name, 1 << 32);
}
