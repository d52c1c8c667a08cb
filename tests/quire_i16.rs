//! The integer quire GEMM of posit<8,0>-like formats against the quire, bit for bit:
//! `IntRound` against the posit rounding on every small sum and on sums near each power of
//! two up to 2^53; the blocked `int_dot::gemm` against a plain i64 loop (odd rows, columns
//! off the 4-tile, `k` off the 16-lane and 512-element chunks, several cache panels);
//! `quire_i16::gemm_f32` in all four operand layouts and `gemm_f64` against a `Quire` per
//! output on adversarial operands (NaN, ±Inf, values beyond maxpos and below minpos, ties,
//! signed zeros, f32 subnormals) with and without biases; and `GemmRule::gemm_f32`'s
//! dispatch (taken for the i16 quire only).

use qcandle::format::rounding::NearestEven;
use qcandle::format::{Format, Posit};
use qcandle::quire::gemm_cpu::{accumulator_for, quire_gemm, Accumulator, Bias};
use qcandle::quire::int_round::IntRound;
use qcandle::quire::quire_i16::{gemm_f32, gemm_f64, Operand};
use qcandle::quire::{int_dot, Accumulate, GemmRule, Quire};

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
fn blocked_int_gemm_equals_a_plain_loop() {
    let mut rng = Rng(2);
    for &(m, k, n) in &[
        (1, 1, 1),
        (3, 15, 5),
        (7, 17, 9),
        (5, 513, 6),
        (4, 1100, 131),
        (2, 2048, 70),
        (6, 0, 3),
    ] {
        let mut draw = |len: usize| -> Vec<i16> {
            (0..len)
                .map(|_| match rng.below(4) {
                    0 => 4096,
                    1 => -4096,
                    _ => rng.below(8193) as i16 - 4096,
                })
                .collect()
        };
        let a = draw(m * k);
        let bt = draw(n * k);
        for parallel in [false, true] {
            let mut got = vec![0i64; m * n];
            int_dot::gemm(&a, &bt, (m, k, n), &mut got, parallel);
            for i in 0..m {
                for j in 0..n {
                    let want: i64 = (0..k)
                        .map(|t| a[i * k + t] as i64 * bt[j * k + t] as i64)
                        .sum();
                    assert_eq!(got[i * n + j], want, "({m},{k},{n}) at ({i},{j})");
                }
            }
        }
    }
}

/// The quire's result of `round(Σ a·b + bias)` with every operand rounded first.
fn reference(
    posit: Posit,
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    bias: &Bias,
) -> Vec<f64> {
    let r = |x: f32| posit.round(f64::from(x), NearestEven, 0);
    let mut out = Vec::new();
    let mut q = Quire::new(posit).expect("quire");
    for i in 0..m {
        for j in 0..n {
            q.clear();
            for t in 0..k {
                q.add_product(r(a[i * k + t]), r(b[t * n + j]));
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

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

#[test]
fn i16_quire_gemm_equals_the_quire_in_every_layout() {
    let mut rng = Rng(3);
    for posit in i16_posits() {
        let s = posit.max_scale();
        for &(m, k, n) in &[(1, 1, 1), (3, 7, 5), (9, 33, 6), (5, 600, 7), (2, 1100, 67)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.value(s)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.value(s)).collect();
            let rb = |rng: &mut Rng, len: usize| -> Vec<f64> {
                (0..len)
                    .map(|_| posit.round(f64::from(rng.value(s)), NearestEven, 0))
                    .collect()
            };
            let (row_bias, col_bias) = (rb(&mut rng, m), rb(&mut rng, n));
            let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
            for bias in [Bias::None, Bias::PerRow(&row_bias), Bias::PerCol(&col_bias)] {
                let want = reference(posit, &a, &b, (m, k, n), &bias);
                for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                    let ao = Operand {
                        data: if a_t { &at } else { &a },
                        transposed: a_t,
                    };
                    let bo = Operand {
                        data: if b_t { &bt } else { &b },
                        transposed: b_t,
                    };
                    for parallel in [false, true] {
                        let got =
                            gemm_f32(posit, ao, bo, (m, k, n), bias, parallel).expect("f32 values");
                        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                same(f64::from(*g), *w),
                                "{posit:?} ({m},{k},{n}) layout {a_t}/{b_t} at {idx}: {g} vs {w}"
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

#[test]
fn gemm_f32_dispatches_to_the_i16_quire_only() {
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
    for (setting, format) in [
        ("quire", "posit<16,1>"),
        ("naive", "posit<8,0>"),
        ("naive:fp16", "e4m3"),
    ] {
        let f: Format = format.parse().expect("format");
        let acc: Accumulate = setting.parse().expect("setting");
        let rule = GemmRule::new(&acc, &f).expect("rule").expect("not f32");
        assert!(rule
            .gemm_f32(op, op, (2, 2, 2), Bias::None, false)
            .is_none());
        // gemm_any falls back to the rounded f64 path: the same as gemm.
        let got = rule.gemm_any(op, op, (2, 2, 2));
        let v = rule.operands(&x);
        let mut want = vec![0.0; 4];
        rule.gemm(&v, &v, (2, 2, 2), Bias::None, &mut want, false);
        assert_eq!(got, want, "{setting} {format}");
    }
}
