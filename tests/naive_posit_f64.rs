//! The posit rounding on f64 patterns (`quire::posit_f64`) against `Posit::round`
//! (nearest even) bit for bit, and the naive GEMM of the wider posits
//! (`quire::naive_posit_f64`, through `gemm_cpu::naive_gemm`) under every instruction set
//! this CPU has against the definition one scalar operation at a time: `c = R(c + R(a_t ·
//! b_t))` from zero, `k` ascending, then `R(c + bias)`, each operation computed in f64
//! rounded to odd and rounded once by `Format::round`.
//!
//! The rounding is checked on every posit value of the smaller posits and on samples of
//! the larger ones, with the midpoints between neighbours and the f64 values next to each,
//! every power of two in and around the range with its neighbours, random values in every
//! binade, minpos and maxpos neighbourhoods, zeros, subnormals, Inf and NaN. The GEMMs take
//! odd shapes (one row or column, `k = 0`, partial tiles), sums that cancel, saturate at
//! maxpos and come back, values near minpos, bias per row and per column, and NaR/Inf
//! operands.

mod common;
#[path = "common/isa_cap.rs"]
mod isa_cap;

use common::{Mismatches, SplitMix};
use isa_cap::on_every_isa;
use qcandle::format::{Posit, Rounding};
use qcandle::quire::gemm_cpu::{naive_gemm, Bias};
use qcandle::quire::naive_posit_f64::{naive_gemm_reference, NaivePositF64};
use qcandle::quire::posit_f64::PositF64;
use qcandle::quire::round_odd::{add_odd, mul_odd};
use qcandle::Format;

fn posit(n: u32, es: u32) -> Posit {
    Posit::new(n, es).expect("a posit")
}

/// Same bits, or both NaN.
fn same(x: f64, y: f64) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// `x` and its f64 neighbours on both sides.
fn with_neighbours(x: f64) -> [f64; 5] {
    let b = x.to_bits();
    [
        x,
        f64::from_bits(b.wrapping_add(1)),
        f64::from_bits(b.wrapping_sub(1)),
        f64::from_bits(b.wrapping_add(2)),
        f64::from_bits(b.wrapping_sub(2)),
    ]
}

/// The inputs for posit `p`: around every value (all patterns for `n <= 16`, else samples
/// and the first and last patterns of each regime), around the arithmetic midpoint of each
/// value and the next, every power of two from beyond minpos to beyond maxpos, random
/// values in each binade, and the special values.
fn inputs(p: &Posit, rng: &mut SplitMix) -> Vec<f64> {
    let n = p.n();
    let top = 1u32 << (n - 1); // NaR; positive patterns are 1..top
    let mut patterns: Vec<u32> = if n <= 16 {
        (0..top).collect()
    } else {
        (0..60_000).map(|_| rng.next_u32() % top).collect()
    };
    // Both ends of every regime (and a few patterns around them).
    for len in 1..n {
        let ones = ((1u64 << len) - 1) << (n - 1 - len);
        for base in [(ones as u32) & (top - 1), 1u32 << (n - 1 - len)] {
            for d in 0..4u32 {
                patterns.push(base.wrapping_add(d) % top);
                patterns.push(base.wrapping_sub(d) % top);
            }
        }
    }
    patterns.extend([0, 1, 2, 3, top - 1, top - 2, top - 3]);
    let mut xs = Vec::new();
    for &q in &patterns {
        let v = p.decode(q);
        let w = p.decode((q + 1).min(top - 1));
        xs.extend(with_neighbours(v));
        xs.extend(with_neighbours((v + w) / 2.0));
    }
    let s = p.max_scale();
    for e in -s - 3..=s + 3 {
        let v = 2f64.powi(e);
        xs.extend(with_neighbours(v));
        xs.extend(with_neighbours(1.5 * v));
        for _ in 0..8 {
            let m = 1.0 + (rng.next_u64() >> 12) as f64 / (1u64 << 52) as f64;
            xs.push(m * v);
        }
    }
    xs.extend([
        0.0,
        f64::MIN_POSITIVE,
        f64::MIN_POSITIVE / 4.0,
        f64::from_bits(1),
        f64::MAX,
        1e300,
        1e-300,
        f64::INFINITY,
        f64::NAN,
    ]);
    let negated: Vec<f64> = xs.iter().map(|x| -x).collect();
    xs.extend(negated);
    xs
}

/// The posits checked: both sides of the f32 kernels' limit, `n` up to 32, `es` 0 to 4.
const POSITS: &[(u32, u32)] = &[
    (3, 0),
    (5, 2),
    (8, 1),
    (12, 3),
    (16, 1),
    (16, 4),
    (18, 0),
    (18, 2),
    (19, 1),
    (20, 3),
    (23, 0),
    (24, 1),
    (25, 2),
    (28, 4),
    (31, 3),
    (32, 0),
    (32, 1),
    (32, 2),
    (32, 3),
    (32, 4),
];

#[test]
fn rounding_matches_posit_round() {
    let mut bad = Mismatches::default();
    let mut checked = 0u64;
    let mut rng = SplitMix(7);
    for &(n, es) in POSITS {
        let p = posit(n, es);
        let r = PositF64::of(&p).expect("es <= 4");
        for x in inputs(&p, &mut rng) {
            let want = p.round(x, qcandle::format::rounding::NearestEven, 0);
            let got = r.round(x);
            checked += 1;
            bad.check(same(got, want), || {
                format!(
                    "posit<{n},{es}> x = {x:e} ({:#x}): {got:e}, want {want:e}",
                    x.to_bits()
                )
            });
        }
    }
    bad.assert_none_of("PositF64::round", checked);
}

#[test]
fn rounding_is_taken_only_where_it_applies() {
    assert!(PositF64::of(&posit(32, 5)).is_none());
    assert!(PositF64::of(&posit(2, 0)).is_none());
    assert!(PositF64::new(&"e4m3".parse().expect("e4m3")).is_none());
    assert!(PositF64::new(&"posit<32,2>".parse().expect("posit")).is_some());
}

/// The definition (see the file docs), one output at a time.
fn reference(
    f: &Format,
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
    bias: &Bias,
) -> Vec<f64> {
    let r = |x: f64| f.round(x, Rounding::NearestEven, 0);
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut c = 0.0;
            for t in 0..k {
                c = r(add_odd(c, r(mul_odd(a[i * k + t], b[t * n + j]))));
            }
            let term = match bias {
                Bias::None => None,
                Bias::PerRow(v) => Some(v[i]),
                Bias::PerCol(v) => Some(v[j]),
            };
            if let Some(v) = term {
                c = r(add_odd(c, v));
            }
            out[i * n + j] = c;
        }
    }
    out
}

/// Operand kinds of a GEMM case.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Magnitudes around 1 (products and sums in the regimes with most fraction bits).
    Moderate,
    /// Magnitudes over the whole range, so that sums saturate at maxpos and come back, and
    /// products fall below minpos.
    Wide,
    /// Pairs `x`, `-x` down the `k` axis: sums that cancel to zero exactly.
    Cancelling,
    /// Magnitudes near minpos and near maxpos only.
    Extremes,
}

fn operand(p: &Posit, kind: Values, rng: &mut SplitMix) -> f64 {
    let s = p.max_scale();
    let x = match kind {
        Values::Moderate | Values::Cancelling => rng.float_between(-6, 6),
        Values::Wide => rng.float_between(-s - 2, s + 2),
        Values::Extremes => {
            if rng.coin() {
                rng.float_between(-s - 1, -s + 3)
            } else {
                rng.float_between(s - 3, s + 1)
            }
        }
    };
    match rng.below(12) {
        0 => 0.0,
        1 => 2f64.powi(rng.below(7) as i32 - 3),
        _ => p.round(x, qcandle::format::rounding::NearestEven, 0),
    }
}

/// A GEMM case's operands (`b` row-major `k x n`); `special` puts a NaR (NaN) or an Inf in
/// one row of `a` and one column of `b`.
fn operands(
    p: &Posit,
    kind: Values,
    (m, k, n): (usize, usize, usize),
    special: bool,
    rng: &mut SplitMix,
) -> (Vec<f64>, Vec<f64>) {
    let mut a: Vec<f64> = (0..m * k).map(|_| operand(p, kind, rng)).collect();
    let mut b: Vec<f64> = (0..k * n).map(|_| operand(p, kind, rng)).collect();
    if let Values::Cancelling = kind {
        // a_{t+1} = a_t, b_{t+1} = -b_t: each pair of products cancels exactly.
        for t in (1..k).step_by(2) {
            for i in 0..m {
                a[i * k + t] = a[i * k + t - 1];
            }
            for j in 0..n {
                b[t * n + j] = -b[(t - 1) * n + j];
            }
        }
    }
    if special && k > 0 {
        let i = rng.below(m as u64) as usize;
        a[i * k + rng.below(k as u64) as usize] = f64::NAN;
        let j = rng.below(n as u64) as usize;
        let t = rng.below(k as u64) as usize;
        b[t * n + j] = if rng.coin() {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        };
    }
    (a, b)
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 0, 1),
    (2, 0, 40),
    (1, 1, 1),
    (1, 7, 8),
    (3, 5, 7),
    (2, 9, 33),
    (1, 40, 41),
    (4, 33, 64),
    (3, 100, 72),
    (2, 500, 45),
    (5, 3, 120),
    (6, 50, 25),
    (7, 20, 10),
    (4, 300, 3),
    (9, 2, 17),
];

fn check_gemms(name: &str, seed: u64) {
    let f: Format = name.parse().expect("a posit");
    let Format::Posit(p) = f else {
        panic!("a posit")
    };
    let fast = NaivePositF64::new(&f).expect("taken");
    on_every_isa(|isa| {
        let mut rng = SplitMix(seed);
        let mut bad = Mismatches::default();
        let mut checked = 0u64;
        for &dims in SHAPES {
            let (m, _, n) = dims;
            for kind in [
                Values::Moderate,
                Values::Wide,
                Values::Cancelling,
                Values::Extremes,
            ] {
                for special in [false, true] {
                    let (a, b) = operands(&p, kind, dims, special, &mut rng);
                    let rows: Vec<f64> = (0..m).map(|_| operand(&p, kind, &mut rng)).collect();
                    let cols: Vec<f64> = (0..n).map(|_| operand(&p, kind, &mut rng)).collect();
                    for bias in [Bias::None, Bias::PerRow(&rows), Bias::PerCol(&cols)] {
                        let want = reference(&f, &a, &b, dims, &bias);
                        let mut outs = [vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]];
                        naive_gemm(&f, &a, &b, dims, bias, &mut outs[0], true);
                        fast.gemm(&a, &b, dims, bias, &mut outs[1], false);
                        naive_gemm_reference(&f, &a, &b, dims, bias, &mut outs[2], false);
                        for (which, out) in outs.iter().enumerate() {
                            for (o, (g, w)) in out.iter().zip(&want).enumerate() {
                                checked += 1;
                                bad.check(same(*g, *w), || {
                                    format!(
                                        "{name} {isa:?} path {which} {dims:?} {kind:?} \
                                         special {special} {bias:?} out {o}: {g:e}, want {w:e}"
                                    )
                                });
                            }
                        }
                    }
                }
            }
        }
        bad.assert_none_of(&format!("{name} naive GEMM under {isa:?}"), checked);
    });
}

#[test]
fn gemm_posit_32_2() {
    check_gemms("posit<32,2>", 1);
}

#[test]
fn gemm_posit_24_1() {
    check_gemms("posit<24,1>", 2);
}

#[test]
fn gemm_posit_19_3() {
    check_gemms("posit<19,3>", 3);
}

#[test]
fn gemm_posit_32_4() {
    check_gemms("posit<32,4>", 4);
}
