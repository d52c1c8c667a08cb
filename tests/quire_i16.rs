//! The integer quire GEMM of posit<8,0>-like formats against the quire, bit for bit:
//! `IntRound` and `Es0Lanes` (posit<n,0> by magic constants) against the posit rounding on
//! every small sum and on sums near each power of two up to 2^53; `Es0Lanes` against the
//! quantize kernel on a dense sample of f32s; every `int_dot` kernel this CPU runs (VNNI and not, 512-bit, 256-bit,
//! portable) against a plain i64 loop (odd rows, columns off the 4-tile, `k` off the 16- and
//! 32-lane vectors and the 512- and 1024-element chunks, several cache panels, long rows of
//! ±maxpos² products that wrap an i32 lane widened too late); `IntOperand` against the
//! quantize kernel on a dense sample of f32s (every f32 in an ignored test);
//! `quire_i16::gemm_f32` in all four operand layouts, under each instruction-set cap, and
//! `gemm_f64` against a `Quire` per output on adversarial operands (NaN, ±Inf, values beyond
//! maxpos and below minpos, ties, signed zeros, f32 subnormals) with and without biases; and
//! `GemmRule::gemm_f32`'s dispatch (the i16 and checked quires and naive posit<8,0>).

#[path = "common/isa_cap.rs"]
mod isa_cap;
#[path = "common/layouts.rs"]
mod layouts;
#[path = "common/quire_reference.rs"]
mod quire_reference;

use layouts::Layouts;
use qcandle::backend::cpu::quantize_slice;
use qcandle::backend::isa::{self, Isa};
use qcandle::format::rounding::NearestEven;
use qcandle::format::Rounding;
use qcandle::format::{Format, Posit};
use qcandle::quire::es0_lanes::Es0Lanes;
use qcandle::quire::gemm_cpu::{accumulator_for, quire_gemm, Accumulator, Bias};
use qcandle::quire::int_dot::Kernel;
use qcandle::quire::int_operand::IntOperand;
use qcandle::quire::int_pairs::{self, PairPacked};
use qcandle::quire::int_round::IntRound;
use qcandle::quire::quire_i16::{gemm_f32, gemm_f64, Operand};
use qcandle::quire::{int_dot, Accumulate, GemmRule};
use quire_reference::quire_reference;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An adversarial f32 for a posit with `maxpos = 2^s`.
    fn value(&mut self, s: i32) -> f32 {
        match self.below(16) {
            0 => f32::NAN,
            1 => {
                if self.below(2) == 0 {
                    f32::INFINITY
                } else {
                    f32::NEG_INFINITY
                }
            }
            2 => 0.0,
            3 => -0.0,
            4 => f32::from_bits(1 + self.below(1000) as u32), // subnormal
            5 => (2f32).powi(s) * (1.0 + self.below(100) as f32), // beyond maxpos
            6 => (2f32).powi(-s - 2) * (self.below(5) as f32 - 2.0), // below minpos
            7 => {
                // A tie between neighbouring grid values near 1.
                1.0 + (2 * self.below(32) + 1) as f32 / 64.0
            }
            _ => {
                let e = self.below(2 * s as u64 + 4) as i32 - s - 2;
                let m = 1.0 + self.below(1 << 20) as f32 / (1 << 20) as f32;
                let v = m * (2f32).powi(e);
                if self.below(2) == 0 {
                    v
                } else {
                    -v
                }
            }
        }
    }
}

/// Posits whose values are i16 multiples of minpos.
fn i16_posits() -> Vec<Posit> {
    [
        "posit<8,0>",
        "posit<7,0>",
        "posit<6,0>",
        "posit<5,1>",
        "posit<4,0>",
    ]
    .iter()
    .map(|s| match s.parse::<Format>().expect("format") {
        Format::Posit(p) => p,
        _ => unreachable!(),
    })
    .collect()
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn int_round_equals_the_posit_rounding() {
    let mut rng = Rng(1);
    for posit in i16_posits() {
        let table = IntRound::get(posit).expect("a table for small posits");
        let unit = (2f64).powi(-2 * posit.max_scale());
        let check = |t: i64| {
            let want = posit.round(t as f64 * unit, NearestEven, 0);
            let got = f64::from(table.round(t));
            assert!(same(got, want), "{posit:?} t = {t}: {got} vs {want}");
        };
        for t in -(1i64 << 21)..=1i64 << 21 {
            check(t);
        }
        for l in 0..53 {
            for d in -3i64..=3 {
                let t = (1i64 << l) + d;
                if t.unsigned_abs() < 1 << 53 {
                    check(t);
                    check(-t);
                }
            }
        }
        for _ in 0..100_000 {
            let t = (rng.next() >> (11 + rng.below(50))) as i64;
            check(t);
            check(-t);
        }
    }
}

#[test]
fn every_int_kernel_equals_a_plain_loop() {
    // Each kernel's sums through `gemm_map` and, with terms, clamped and scaled through
    // `gemm_clamped`.
    let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.supported()).collect();
    assert!(kernels.contains(&Kernel::Portable));
    let mut rng = Rng(2);
    // Odd rows (4-row tiles padded), columns off the 4-tile, `k` off the 16- and 32-lane
    // vectors and the 512- and 1024-element i32 chunks, several cache panels, and long
    // rows of maxpos products that overflow an i32 lane not widened in time.
    for &(m, k, n, extreme) in &[
        (1, 1, 1, false),
        (3, 15, 5, false),
        (7, 17, 9, false),
        (5, 31, 6, false),
        (6, 33, 7, false),
        (5, 513, 6, false),
        (9, 400, 13, false),
        (4, 1100, 131, false),
        (2, 2048, 70, false),
        (6, 0, 3, false),
        (5, 5000, 6, true),
        (3, 2049, 5, true),
    ] {
        let mut draw = |len: usize| -> Vec<i16> {
            (0..len)
                .map(|_| match (extreme, rng.below(4)) {
                    (true, 0) => -4096,
                    (true, _) => 4096,
                    (false, 0) => 4096,
                    (false, 1) => -4096,
                    _ => rng.below(8193) as i16 - 4096,
                })
                .collect()
        };
        check_int_kernels(&kernels, (m, k, n), draw(m * k), draw(n * k), extreme);
    }
    // Values of a few hundred units, whose sums the 512-bit kernels keep in i32 lanes
    // (`int_dot::fits_i32`), at lengths past the 1024-element chunk; then products of
    // ±4095 and ±4096 at k = 128, where row 0 and column 0 (all positive) total
    // 128 · 4095² < 2^31 (still narrow) and 2^31 (not: an i32 would wrap).
    for &(m, k, n, mag) in &[(6, 1100, 9, 300), (5, 2048, 7, 700), (3, 4000, 5, 100)] {
        let mut draw = |len: usize| -> Vec<i16> {
            (0..len)
                .map(|_| rng.below(2 * mag + 1) as i16 - mag as i16)
                .collect()
        };
        let (a, bt) = (draw(m * k), draw(n * k));
        assert!(int_dot::fits_i32(&a, &bt, k));
        check_int_kernels(&kernels, (m, k, n), a, bt, false);
    }
    for v in [4095i16, 4096] {
        let (m, k, n) = (5, 128, 6);
        let a: Vec<i16> = (0..m * k)
            .map(|i| if i >= k && i % 7 == 3 { -v } else { v })
            .collect();
        let mut bt = vec![v; n * k];
        bt[k..2 * k].fill(-v);
        assert_eq!(int_dot::fits_i32(&a, &bt, k), v == 4095);
        check_int_kernels(&kernels, (m, k, n), a, bt, false);
    }
}

/// `int_dot::fits_i32` finds the largest magnitude wherever it lies (a vector's lanes, the
/// tail past whole vectors, `i16::MIN`), under every instruction-set cap: it decides `k ·
/// max|a| · max|b| < 2^31` exactly at the edge.
#[test]
fn fits_i32_finds_the_largest_magnitude_anywhere() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    let mut cases = Vec::new();
    for len in [1, 31, 32, 33, 64, 100, 1000] {
        for at in [0, len / 2, len - 1] {
            for big in [4096i16, -4096, i16::MIN] {
                cases.push((len, at, big));
            }
        }
    }
    let mut rng = Rng(43);
    for cap in [None, Some(Isa::Avx2), Some(Isa::Portable)] {
        isa::set_cap(cap);
        for &(len, at, big) in &cases {
            let mut a: Vec<i16> = (0..len).map(|_| rng.below(7) as i16 - 3).collect();
            a[at] = big;
            let edge = (1usize << 31) / usize::from(big.unsigned_abs());
            let one = [1i16];
            let (below, at_edge) = (
                int_dot::fits_i32(&a, &one, edge - 1),
                int_dot::fits_i32(&a, &one, edge),
            );
            // The operands swapped give the same answer.
            let swapped = int_dot::fits_i32(&one, &a, edge - 1);
            isa::set_cap(None);
            assert!(
                below && swapped && !at_edge,
                "{cap:?} len {len} at {at} value {big}: {below} {swapped} {at_edge}"
            );
            isa::set_cap(cap);
        }
        isa::set_cap(None);
    }
    assert!(int_dot::fits_i32(&[], &[], 1 << 40));
}

/// [`every_int_kernel_equals_a_plain_loop`] on one pair of operands: every kernel, serial
/// and parallel, against the plain sums; `extreme` operands also make column 0 the row 0's
/// copy and column 1 its negation (sums of ±maxpos² only).
fn check_int_kernels(
    kernels: &[Kernel],
    (m, k, n): (usize, usize, usize),
    a: Vec<i16>,
    mut bt: Vec<i16>,
    extreme: bool,
) {
    {
        if extreme {
            // Column 0 meets row 0 in +maxpos² products only; column 1 in -maxpos².
            bt[..k].copy_from_slice(&a[..k]);
            for t in 0..k {
                bt[k + t] = -a[t];
            }
        }
        let want: Vec<i64> = (0..m * n)
            .map(|idx| {
                let (i, j) = (idx / n, idx % n);
                (0..k)
                    .map(|t| a[i * k + t] as i64 * bt[j * k + t] as i64)
                    .sum()
            })
            .collect();
        if extreme {
            assert_eq!(want[0], k as i64 * (1 << 24));
        }
        for &kernel in kernels {
            for parallel in [false, true] {
                let mut got = vec![0i64; m * n];
                int_dot::gemm_map(
                    kernel,
                    &a,
                    &bt,
                    (m, k, n),
                    &mut got,
                    parallel,
                    |_, _, s, d| d.copy_from_slice(&s[..d.len()]),
                );
                let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                assert_eq!(bad, 0, "{kernel:?} ({m},{k},{n}): {bad} sums differ");
                // The map sees each output's own indices.
                let mut at = vec![(0usize, 0usize); m * n];
                int_dot::gemm_map(
                    kernel,
                    &a,
                    &bt,
                    (m, k, n),
                    &mut at,
                    parallel,
                    |i, j, _, d| {
                        for (c, p) in d.iter_mut().enumerate() {
                            *p = (i, j + c);
                        }
                    },
                );
                assert!(at
                    .iter()
                    .enumerate()
                    .all(|(idx, &p)| p == (idx / n, idx % n)));
                // With terms per row and column, clamped and scaled (the fused AVX2
                // tiles): terms that push totals past the cap both ways and back.
                let cap = (1i64 << 19) + 3;
                let row_term: Vec<i64> = (0..m as i64).map(|i| (i % 3 - 1) << 20).collect();
                let col_term: Vec<i64> = (0..n as i64).map(|j| (j % 5 - 2) * 77_777).collect();
                let unit = (2f32).powi(-12);
                let mut got = vec![7f32; m * n];
                let terms = (&row_term[..], &col_term[..]);
                int_dot::gemm_clamped(
                    kernel,
                    &a,
                    &bt,
                    (m, k, n),
                    terms,
                    (cap, unit),
                    &mut got,
                    parallel,
                );
                let bad = (0..m * n)
                    .filter(|&idx| {
                        let (i, j) = (idx / n, idx % n);
                        let t = (want[idx] + row_term[i] + col_term[j]).clamp(-cap, cap);
                        got[idx] != t as f32 * unit
                    })
                    .count();
                assert_eq!(bad, 0, "{kernel:?} clamped ({m},{k},{n}): {bad} differ");
            }
        }
        let mut got = vec![0i64; m * n];
        int_dot::gemm(&a, &bt, (m, k, n), &mut got, true);
        assert_eq!(got, want, "gemm ({m},{k},{n})");
    }
}

/// `R(x)` by the quantize kernel's posit rounding (NaN for NaR).
fn quantized(posit: Posit, xs: &[f32]) -> Vec<f32> {
    let mut r = vec![0f32; xs.len()];
    quantize_slice(
        Some(xs),
        &mut r,
        &[xs.len()],
        &Format::Posit(posit),
        Rounding::NearestEven,
        None,
    )
    .expect("quantize");
    r
}

/// `R(x) · 2^s` by the quantize kernel's posit rounding, `None` for NaR.
fn quantized_int(posit: Posit, xs: &[f32]) -> Vec<Option<i16>> {
    let scale = (2f32).powi(posit.max_scale());
    quantized(posit, xs)
        .iter()
        .map(|&v| v.is_finite().then_some((v * scale) as i16))
        .collect()
}

fn check_int_operand(posit: Posit, xs: &[f32]) {
    let table = IntOperand::get(posit).expect("a table for small posits");
    let want = quantized_int(posit, xs);
    check_keys(posit, &table, xs, &want);
    for (isa, parallel) in caps() {
        isa::set_cap(isa);
        check_fill(posit, &table, xs, &want, parallel, isa);
        isa::set_cap(None);
    }
}

/// `IntOperand::int` of each of `xs` against `want`.
fn check_keys(posit: Posit, table: &IntOperand, xs: &[f32], want: &[Option<i16>]) {
    let bad: Vec<_> = xs
        .iter()
        .zip(want)
        .filter(|(x, w)| table.int(**x) != **w)
        .map(|(x, w)| (x.to_bits(), table.int(*x), *w))
        .take(5)
        .collect();
    assert!(bad.is_empty(), "{posit:?}: (bits, table, kernel) {bad:x?}");
}

/// The matrix fill (sixteen keys at a time on AVX-512, eight on AVX2) under the cap set now,
/// as rows of 37 and as their transpose, against `want`; `cap` names it in a failure.
fn check_fill(
    posit: Posit,
    table: &IntOperand,
    xs: &[f32],
    want: &[Option<i16>],
    parallel: bool,
    cap: Option<Isa>,
) {
    let cols = 37;
    let rows = xs.len() / cols;
    let xs = &xs[..rows * cols];
    let want_row = |r: usize| &want[r * cols..r * cols + cols];
    let xt: Vec<f32> = (0..rows * cols)
        .map(|i| xs[(i % rows) * cols + i / rows])
        .collect();
    // Rows as they are (`fill`), and padded with zeros to 64 (`fill_padded`, into a buffer
    // of other values: every padding element must be written).
    for (src, transposed) in [(xs, false), (&xt[..], true)] {
        for stride in [cols, 64] {
            let mut dst = vec![7i16; rows * stride];
            let mut nar = vec![true; rows];
            if stride == cols {
                table.fill(src, transposed, (rows, cols), &mut dst, &mut nar, parallel);
            } else {
                let dims = (rows, cols);
                table.fill_padded(
                    src,
                    transposed,
                    dims,
                    (&mut dst, stride),
                    &mut nar,
                    parallel,
                );
            }
            let mut bad = 0;
            for r in 0..rows {
                let w = want_row(r);
                bad += usize::from(nar[r] != w.iter().any(|v| v.is_none()));
                let row = &dst[r * stride..(r + 1) * stride];
                for (d, v) in row.iter().zip(w) {
                    bad += usize::from(*d != v.unwrap_or(0));
                }
                bad += row[cols..].iter().filter(|&&d| d != 0).count();
            }
            assert_eq!(
                bad, 0,
                "{posit:?} fill {cap:?} parallel {parallel} transposed {transposed} stride {stride}: {bad} differ"
            );
        }
    }
}

/// Every top-13-bit significand, with low bits 0, 1, a middle and all ones, in every binade
/// from well below minpos to well above maxpos of the posits here, both signs; then a
/// stride over all f32s, and the specials.
fn dense_f32s() -> Vec<f32> {
    let mut xs = Vec::new();
    for e in 127 - 12..=127 + 10u32 {
        for top in 0..1u32 << 13 {
            for low in [0, 1, 0x155, 0x3ff] {
                let bits = e << 23 | top << 10 | low;
                xs.push(f32::from_bits(bits));
                xs.push(f32::from_bits(bits | 1 << 31));
            }
        }
    }
    xs.extend((0..u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)));
    xs.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ]);
    xs
}

#[test]
fn int_operand_equals_the_quantize_kernel() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    let xs = dense_f32s();
    for posit in i16_posits() {
        check_int_operand(posit, &xs);
    }
}

/// posit<n,0> for `n = 3..=8`, the formats of `Es0Lanes`.
fn es0_posits() -> Vec<Posit> {
    (3..=8)
        .map(|n| match format!("posit<{n},0>").parse::<Format>() {
            Ok(Format::Posit(p)) => p,
            other => panic!("posit<{n},0>: {other:?}"),
        })
        .collect()
}

/// The magic-constant rounding of posit<n,0> (vector lanes and its scalar definition)
/// against the quantize kernel on the dense sample: every value, the top binade's tie
/// `1.5 · 2^(n-3)` (to `2^(n-3)`, the even pattern), magnitudes below minpos (to minpos)
/// and above maxpos (to maxpos), ±0 (to +0), NaN and ±Inf (NaN); and only posit<n,0> with
/// `3 <= n <= 8` has it.
#[test]
fn es0_lanes_equal_the_quantize_kernel() {
    let xs = dense_f32s();
    for posit in es0_posits() {
        let lanes = Es0Lanes::new(posit).expect("posit<n,0>");
        let want = quantized(posit, &xs);
        // The posit's NaR is `f32::NAN` (that bit pattern, whatever NaN came in); its zero +0.
        let same = |a: f32, b: f32| {
            let nar = |v: f32| if v.is_nan() { f32::NAN } else { v };
            a.to_bits() == nar(b).to_bits()
        };
        let mut got = xs.clone();
        lanes.round_in_place(&mut got);
        let bad: Vec<_> = (0..xs.len())
            .filter(|&i| !same(got[i], want[i]) || !same(lanes.round(xs[i]), want[i]))
            .map(|i| (xs[i], got[i], lanes.round(xs[i]), want[i]))
            .take(5)
            .collect();
        assert!(
            bad.is_empty(),
            "{posit:?}: (x, lanes, scalar, kernel) {bad:?}"
        );
        // The tie, lanes and scalar (a whole vector of it, and a scalar tail).
        let tie = 1.5 * (2f32).powi(posit.n() as i32 - 3);
        let mut ties = [tie; 9];
        lanes.round_in_place(&mut ties);
        assert_eq!(ties, [tie / 1.5; 9], "{posit:?}");
        assert_eq!(lanes.round(tie), tie / 1.5, "{posit:?}");
    }
    for refused in [
        "posit<9,0>",
        "posit<2,0>",
        "posit<5,1>",
        "posit<8,2>",
        "posit<16,1>",
    ] {
        let Ok(Format::Posit(p)) = refused.parse::<Format>() else {
            panic!("{refused}");
        };
        assert_eq!(Es0Lanes::new(p), None, "{refused}");
    }
}

/// The quire's output rounding by `Es0Lanes::round_sums` (four lanes at a time, the rest
/// scalar) against the posit rounding of exact sums: every sum up to `2^21` units of
/// `minpos^2` of either sign (past maxpos for every n here), sums near every power of two
/// up to `2^53` (the clamp before the conversion to f32), and random ones; under each cap.
#[test]
fn es0_lanes_round_sums_as_the_posit() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(9);
    let mut ts: Vec<i64> = (-(1i64 << 21)..=1i64 << 21).collect();
    for l in 0..53 {
        for d in -3i64..=3 {
            let t = (1i64 << l) + d;
            if t.unsigned_abs() < 1 << 53 {
                ts.extend([t, -t]);
            }
        }
    }
    for _ in 0..100_000 {
        let t = (rng.next() >> (11 + rng.below(50))) as i64;
        ts.extend([t, -t]);
    }
    // An odd length: a scalar tail after the vectors.
    ts.push(5);
    for posit in es0_posits() {
        let lanes = Es0Lanes::new(posit).expect("posit<n,0>");
        let unit = (2f64).powi(-2 * posit.max_scale());
        // Each cap once (the thread setting does not reach this code).
        for (cap, _) in caps().into_iter().filter(|&(_, parallel)| parallel) {
            isa::set_cap(cap);
            let mut got = vec![7f32; ts.len()];
            lanes.round_sums(&ts, &mut got);
            isa::set_cap(None);
            let bad: Vec<_> = ts
                .iter()
                .zip(&got)
                .filter(|&(&t, &g)| {
                    !same(f64::from(g), posit.round(t as f64 * unit, NearestEven, 0))
                })
                .take(5)
                .collect();
            assert!(bad.is_empty(), "{posit:?} cap {cap:?}: (t, got) {bad:?}");
        }
    }
}

/// Every f32 of posit<8,0>: the table's keys once, and the fill under the detected
/// instruction set and each narrower cap (one cap at a time, the f32s split over the
/// threads; each fill runs on one thread).
#[test]
#[ignore]
fn int_operand_equals_the_quantize_kernel_on_every_f32() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    use rayon::prelude::*;
    let posit = i16_posits()[0];
    let table = IntOperand::get(posit).expect("a table for small posits");
    let step = 1u64 << 20;
    // The caps of `caps()` (each once: the fills here run on one thread).
    let cap_passes = caps().into_iter().filter(|&(_, parallel)| parallel);
    for (cap, _) in cap_passes {
        isa::set_cap(cap);
        (0..(1u64 << 32) / step).into_par_iter().for_each(|chunk| {
            let xs: Vec<f32> = (chunk * step..(chunk + 1) * step)
                .map(|b| f32::from_bits(b as u32))
                .collect();
            let want = quantized_int(posit, &xs);
            if cap.is_none() {
                check_keys(posit, &table, &xs, &want);
            }
            check_fill(posit, &table, &xs, &want, false, cap);
        });
        isa::set_cap(None);
    }
}

/// The quire's result of `round(Σ a·b + bias)` with every operand rounded first.
fn reference(
    posit: Posit,
    a: &[f32],
    b: &[f32],
    dims: (usize, usize, usize),
    bias: &Bias,
) -> Vec<f64> {
    let r = |v: &[f32]| -> Vec<f64> {
        v.iter()
            .map(|&x| posit.round(f64::from(x), NearestEven, 0))
            .collect()
    };
    quire_reference(posit, &r(a), &r(b), dims, *bias)
}

/// Instruction-set caps (`None`: the best, VNNI where the CPU has it) and thread settings
/// of the f32 entry: the caps take the AVX2 and portable kernels on a CPU with AVX-512.
/// The cap is process-wide; the other tests of this file give the same bits under any cap.
fn caps() -> Vec<(Option<Isa>, bool)> {
    let mut v = vec![(None, false), (None, true)];
    v.extend(
        Isa::ALL
            .into_iter()
            .filter(|&i| i < isa::detected())
            .map(|i| (Some(i), true)),
    );
    v
}

#[test]
fn i16_quire_gemm_equals_the_quire_in_every_layout() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(3);
    for posit in i16_posits() {
        let s = posit.max_scale();
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 7, 5),
            (9, 33, 6),
            (5, 600, 7),
            (2, 1100, 67),
            (6, 2100, 5),
            // Past one task's 64 rows of both integer matrices of the f64 path.
            (67, 9, 131),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.value(s)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.value(s)).collect();
            let rb = |rng: &mut Rng, len: usize| -> Vec<f64> {
                (0..len)
                    .map(|_| posit.round(f64::from(rng.value(s)), NearestEven, 0))
                    .collect()
            };
            let (row_bias, col_bias) = (rb(&mut rng, m), rb(&mut rng, n));
            let layouts = Layouts::new(&a, &b, (m, k, n));
            for bias in [Bias::None, Bias::PerRow(&row_bias), Bias::PerCol(&col_bias)] {
                let want = reference(posit, &a, &b, (m, k, n), &bias);
                for ((a_t, b_t), ao, bo) in layouts.each() {
                    for (isa, parallel) in caps() {
                        isa::set_cap(isa);
                        let got =
                            gemm_f32(posit, ao, bo, (m, k, n), bias, parallel).expect("f32 values");
                        isa::set_cap(None);
                        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                same(f64::from(*g), *w),
                                "{posit:?} ({m},{k},{n}) layout {a_t}/{b_t} {isa:?} at {idx}: {g} vs {w}"
                            );
                        }
                    }
                }
                let r = |x: &f32| posit.round(f64::from(*x), NearestEven, 0);
                let (af, bf): (Vec<f64>, Vec<f64>) =
                    (a.iter().map(r).collect(), b.iter().map(r).collect());
                let mut got = vec![0.0; m * n];
                gemm_f64(posit, &af, &bf, (m, k, n), bias, &mut got, true);
                let mut via = vec![0.0; m * n];
                quire_gemm(posit, &af, &bf, (m, k, n), bias, &mut via, false);
                for ((g, v), w) in got.iter().zip(&via).zip(&want) {
                    assert!(
                        same(*g, *w) && same(*v, *w),
                        "{posit:?} f64 path: {g} {v} vs {w}"
                    );
                }
            }
        }
    }
}

/// The f32 entry in bands of rows (pools of 2, 3 and 4 threads, every instruction set,
/// parallel or not) against the quire, output by output: every operand layout, no bias, a
/// bias per row (offset to each band's rows) and per column, shapes whose rows split
/// unevenly, and a NaN in a row past the first band and ±Inf in `B` (their row and column
/// NaR).
#[test]
fn the_f32_entry_in_bands_equals_the_quire() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(41);
    for posit in i16_posits() {
        let s = posit.max_scale();
        for &(m, k, n) in &[(70, 40, 30), (37, 61, 41), (99, 25, 33)] {
            // Finite operands (the adversarial draw's NaN and ±Inf replaced), then one NaN
            // in row m/2 + 1 (past the first band of any split) and ±Inf in two rows of `B`.
            let mut finite = |len: usize| -> Vec<f32> {
                (0..len)
                    .map(|_| Some(rng.value(s)).filter(|v| v.is_finite()).unwrap_or(0.75))
                    .collect()
            };
            let (a, b) = (finite(m * k), finite(k * n));
            let (row_bias, col_bias) = {
                let r = |v: Vec<f32>| -> Vec<f64> {
                    v.iter()
                        .map(|&x| posit.round(f64::from(x), NearestEven, 0))
                        .collect()
                };
                (r(finite(m)), r(finite(n)))
            };
            for special in [false, true] {
                let (mut a, mut b) = (a.clone(), b.clone());
                if special {
                    a[(m / 2 + 1) * k + 3] = f32::NAN;
                    b[2 * n + 4] = f32::INFINITY;
                    b[(k - 1) * n] = f32::NEG_INFINITY;
                }
                let layouts = Layouts::new(&a, &b, (m, k, n));
                for bias in [Bias::None, Bias::PerRow(&row_bias), Bias::PerCol(&col_bias)] {
                    let want = reference(posit, &a, &b, (m, k, n), &bias);
                    for threads in [2, 3, 4] {
                        layouts::pool(threads).install(|| {
                            for ((a_t, b_t), ao, bo) in layouts.each() {
                                for (isa, parallel) in caps() {
                                    isa::set_cap(isa);
                                    let got = gemm_f32(posit, ao, bo, (m, k, n), bias, parallel)
                                        .expect("f32 values");
                                    isa::set_cap(None);
                                    let bad = got
                                        .iter()
                                        .zip(&want)
                                        .filter(|(g, w)| !same(f64::from(**g), **w))
                                        .count();
                                    assert_eq!(
                                        bad, 0,
                                        "{posit:?} ({m},{k},{n}) special {special} {bias:?} {threads} threads, layout {a_t}/{b_t} {isa:?} parallel {parallel}"
                                    );
                                }
                            }
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn gemm_f32_dispatches_to_the_quire_paths_and_the_naive_register_kernels() {
    let x = [1.5f32, -2.0, 0.25, 3.0];
    let op = Operand::rows(&x);
    let p8: Format = "posit<8,0>".parse().expect("format");
    let Format::Posit(posit) = p8 else {
        unreachable!()
    };
    assert_eq!(accumulator_for(posit, 2), Accumulator::I16);
    let quire = GemmRule::new(&Accumulate::Quire, &p8)
        .expect("rule")
        .expect("not f32");
    let got = quire.gemm_f32(op, op, (2, 2, 2), Bias::None, false);
    assert_eq!(
        got,
        gemm_f32(posit, op, op, (2, 2, 2), Bias::None, false),
        "quire posit<8,0>"
    );
    assert!(got.is_some());
    // quire posit<16,1>: the checked f64 GEMM's f32 entry, the same bits as the f64 path.
    let p16: Format = "posit<16,1>".parse().expect("format");
    let quire16 = GemmRule::new(&Accumulate::Quire, &p16)
        .expect("rule")
        .expect("not f32");
    let got = quire16
        .gemm_f32(op, op, (2, 2, 2), Bias::None, false)
        .expect("an f32 entry");
    let v = quire16.operands(&x);
    let mut want = vec![0.0; 4];
    quire16.gemm(&v, &v, (2, 2, 2), Bias::None, &mut want, false);
    assert_eq!(got, want.iter().map(|&w| w as f32).collect::<Vec<_>>());
    // Naive posit<8,0> has its own f32 path (`naive_p8`), with the bits of the f64 one.
    let naive = GemmRule::new(&Accumulate::Naive, &p8)
        .expect("rule")
        .expect("not f32");
    let got = naive
        .gemm_f32(op, op, (2, 2, 2), Bias::None, false)
        .expect("naive posit<8,0> has an f32 path");
    let v = naive.operands(&x);
    let mut want = vec![0.0; 4];
    naive.gemm(&v, &v, (2, 2, 2), Bias::None, &mut want, false);
    let got: Vec<f64> = got.into_iter().map(f64::from).collect();
    assert_eq!(got, want, "naive posit<8,0>");
    // naive:fp16 on e4m3 takes the register kernel's f32 entry, with the f64 path's bits.
    let round_trip = |rule: &GemmRule| {
        let v = rule.operands(&x);
        let mut want = vec![0.0; 4];
        rule.gemm(&v, &v, (2, 2, 2), Bias::None, &mut want, false);
        want
    };
    let e4m3: Format = "e4m3".parse().expect("format");
    let acc: Accumulate = "naive:fp16".parse().expect("setting");
    let rule = GemmRule::new(&acc, &e4m3).expect("rule").expect("not f32");
    let got = rule
        .gemm_f32(op, op, (2, 2, 2), Bias::None, false)
        .expect("naive:fp16 on e4m3 has an f32 path");
    let got: Vec<f64> = got.into_iter().map(f64::from).collect();
    assert_eq!(got, round_trip(&rule), "naive:fp16 e4m3");
    // naive e4m3: the register kernel where it runs with specialised roundings, else none
    // (the 8-bit operation tables: gemm_any falls back to the rounded f64 path); the same
    // bits either way (which route runs under which cap: `tests/naive_lanes.rs`).
    let rule = GemmRule::new(&Accumulate::Naive, &e4m3)
        .expect("rule")
        .expect("not f32");
    if let Some(got) = rule.gemm_f32(op, op, (2, 2, 2), Bias::None, false) {
        let got: Vec<f64> = got.into_iter().map(f64::from).collect();
        assert_eq!(got, round_trip(&rule), "naive e4m3, f32 entry");
    }
    assert_eq!(
        rule.gemm_any(op, op, (2, 2, 2)),
        round_trip(&rule),
        "naive e4m3"
    );
}

/// `clamp(Σ_t a[i][t] · bt[j][t] + row_term[i] + col_term[j], ±cap) · unit`, the plain loop.
fn clamped_sums(
    a: &[i16],
    bt: &[i16],
    (m, k, n): (usize, usize, usize),
    (row_term, col_term): (&[i64], &[i64]),
    (cap, unit): (i64, f32),
) -> Vec<f32> {
    (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            let s: i64 = (0..k)
                .map(|t| i64::from(a[i * k + t]) * i64::from(bt[j * k + t]))
                .sum();
            (s + row_term[i] + col_term[j]).clamp(-cap, cap) as f32 * unit
        })
        .collect()
}

/// `int_pairs::gemm_clamped` into a buffer of 7s: whether it ran, and the buffer.
fn pair_clamped(
    a: &[i16],
    packed: &PairPacked,
    (m, k): (usize, usize),
    terms: (&[i64], &[i64]),
    bounds: (i64, f32),
    parallel: bool,
) -> (bool, Vec<f32>) {
    let mut got = vec![7f32; m * packed.n()];
    let ran = int_pairs::gemm_clamped(a, packed, (m, k), terms, bounds, &mut got, parallel);
    (ran, got)
}

/// The pair-packed kernel (`int_pairs`: `B` packed by pairs of `k`, one output per lane)
/// against the plain loop, with terms per row and column that push totals past the cap both
/// ways: several blocks of 64 rows and a partial one, tiles of 8 rows and a partial one
/// (`m` = 150, 13, 8, 70); one pair of `k`, one k-block of 128 pairs, several and a partial
/// one (`k` = 2 to 600); columns off the 16-lane vectors and the 48-column panels (`n` = 1,
/// 17, 48, 50, 97); serial and parallel. At the i32 bound's edge (`k = 128`, all ±4095) it
/// runs; past it (±4096: 128 · 4096² = 2^31) it declines and writes nothing. Without AVX-512
/// (a cap) nothing is packed.
#[test]
fn the_pair_packed_kernel_equals_a_plain_loop() {
    let _cap = isa_cap::CAP.lock().unwrap_or_else(|e| e.into_inner());
    // Held (`_cap`): no other test of this file changes the cap meanwhile.
    let avx512 = isa::detected() == Isa::Avx512;
    let mut rng = Rng(41);
    let cap = (1i64 << 19) + 3;
    let unit = (2f32).powi(-12);
    let shapes = [
        (150, 600, 97),
        (8, 2, 1),
        (13, 256, 17),
        (64, 258, 50),
        (70, 34, 48),
    ];
    for (m, k, n) in shapes {
        let mut draw =
            |len: usize| -> Vec<i16> { (0..len).map(|_| rng.below(1401) as i16 - 700).collect() };
        let (a, bt) = (draw(m * k), draw(n * k));
        let row_term: Vec<i64> = (0..m as i64).map(|i| (i % 3 - 1) << 20).collect();
        let col_term: Vec<i64> = (0..n as i64).map(|j| (j % 5 - 2) * 77_777).collect();
        let terms = (&row_term[..], &col_term[..]);
        let Some(packed) = PairPacked::new(&bt, n, k) else {
            assert!(!avx512, "AVX-512 BW but nothing packed");
            continue;
        };
        assert_eq!(
            packed.max_magnitude(),
            bt.iter().map(|x| x.unsigned_abs()).max().unwrap()
        );
        let want = clamped_sums(&a, &bt, (m, k, n), terms, (cap, unit));
        for parallel in [false, true] {
            let (ran, got) = pair_clamped(&a, &packed, (m, k), terms, (cap, unit), parallel);
            assert!(ran, "({m},{k},{n}) declined");
            let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(bad, 0, "({m},{k},{n}) parallel {parallel}: {bad} differ");
        }
    }
    if avx512 {
        let (m, k, n) = (9, 128, 18);
        for (edge, runs) in [(4095i16, true), (4096, false)] {
            // Signs alternate by row and column: every product of row 0 and column 0 is +edge².
            let a: Vec<i16> = (0..m * k)
                .map(|x| if (x / k) % 2 == 0 { edge } else { -edge })
                .collect();
            let bt: Vec<i16> = (0..n * k)
                .map(|x| if (x / k) % 3 == 1 { -edge } else { edge })
                .collect();
            let zeros = (vec![0i64; m], vec![0i64; n]);
            let terms = (&zeros.0[..], &zeros.1[..]);
            let packed = PairPacked::new(&bt, n, k).expect("AVX-512 packs");
            let bounds = ((1 << 24) - 1, 1.0);
            let (ran, got) = pair_clamped(&a, &packed, (m, k), terms, bounds, false);
            assert_eq!(ran, runs, "edge {edge}");
            if runs {
                let want = clamped_sums(&a, &bt, (m, k, n), terms, bounds);
                assert_eq!(got, want, "edge {edge}");
            } else {
                assert!(
                    got.iter().all(|&v| v == 7.0),
                    "edge {edge}: written though declined"
                );
            }
        }
    }
    isa::set_cap(Some(Isa::Avx2));
    let packed = PairPacked::new(&[1, 2, 3, 4], 1, 4);
    isa::set_cap(None);
    assert!(packed.is_none(), "packed under the AVX2 cap");
}
