//! Naive GEMMs (every multiply and add rounded) against step-by-step loops of independent
//! arithmetic: softposit `P8E0` and `P16E1`, the exact reference for wider posits, the
//! `half` crate for fp16, exactly rounded bf16 operations (the exact value rounded to odd on
//! f32's grid, then `half`), and an OCP e4m3 reference written here; the operation tables of
//! every posit of at most 8 bits and of e4m3 on all pattern pairs; NaN inputs in formats
//! without a NaN pattern.

mod common;
#[path = "common/exact.rs"]
mod exact;

use common::reference::{ldexp, two_pow};
use common::{Mismatches, SplitMix};
use exact::{f64_units, same, tensor, values, Draw, Gemm, Ref, Term};

use candle_core::{Device, Tensor};
use half::f16;
use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive, Zero};
use qcandle::quire::gemm_cpu::{naive_gemm, Bias, OpTables};
use qcandle::quire::{conv2d, linear, naive_matmul, Accumulation};
use qcandle::Format;
use softposit::{PxE1, P16E1, P8E0};

fn same32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Random f32 (any value, NaN included) for naive GEMM inputs.
fn random_f32(rng: &mut SplitMix, scale: f64) -> f32 {
    match rng.below(40) {
        0 => f32::NAN,
        1 => 0.0,
        _ => {
            let m = (rng.next_u64() >> 11) as f64 / two_pow(53) * 2.0 - 1.0;
            let e = rng.below(12) as i32 - 6;
            (m * scale * two_pow(e)) as f32
        }
    }
}

/// OCP e4m3 reference: the value of every pattern (bias 7, subnormals, S.1111.111 = NaN).
fn e4m3_value(p: u8) -> f64 {
    let (s, e, m) = (p >> 7, (p >> 3) & 15, p & 7);
    if e == 15 && m == 7 {
        return f64::NAN;
    }
    let v = if e == 0 {
        m as f64 / 8.0 * two_pow(-6)
    } else {
        (1.0 + m as f64 / 8.0) * two_pow(e as i32 - 7)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

/// OCP e4m3 rounding of an exact f64: nearest magnitude, ties to the even pattern, the sign
/// kept (also on zero); beyond 464 (the midpoint to the missing 480) NaN; NaN stays NaN.
fn e4m3_round(x: f64) -> u8 {
    if x.is_nan() || x.abs() > 464.0 {
        return 0x7f | if x.is_sign_negative() { 0x80 } else { 0 };
    }
    let ax = x.abs();
    let mut best = 0u8;
    for p in 1..=0x7eu8 {
        let (d, db) = ((e4m3_value(p) - ax).abs(), (e4m3_value(best) - ax).abs());
        if d < db || (d == db && p % 2 == 0) {
            best = p;
        }
    }
    best | if x.is_sign_negative() { 0x80 } else { 0 }
}

/// The exact value `x * 2^-u` rounded to odd on f32's grid (24 bits, or f32's subnormal
/// quantum 2^-149; ±Inf from 2^128 up). Rounding that once more to a format with at most 22
/// significand bits and a quantum no finer than 2^-147 is the correct rounding of `x`.
fn ref_odd_f32(x: &BigInt, u: u32) -> f32 {
    assert!(!x.is_zero());
    let ax = x.abs();
    let e = ax.bits() as i64 - 1 - u as i64; // floor(log2 |value|)
    let v = if e >= 128 {
        f32::INFINITY
    } else {
        let q = (e - 23).max(-149);
        let shift = (q + u as i64) as usize;
        let kept = &ax >> shift;
        let lost = ax != (&kept << shift);
        let kept = kept.to_u64().unwrap() | lost as u64;
        ldexp(kept as f64, q) as f32
    };
    if x.is_negative() {
        -v
    } else {
        v
    }
}

/// The exactly rounded bf16 product and sum, through the exact value rounded to odd on
/// f32's grid and then `half::bf16::from_f32` (exact rounding per docs/ORACLES.md).
fn bf16_mul(x: half::bf16, y: half::bf16) -> half::bf16 {
    let (a, b) = (x.to_f64(), y.to_f64());
    if !(a * b).is_finite() || a * b == 0.0 {
        return half::bf16::from_f64(a * b); // NaN, Inf and signed zeros: exact in f64
    }
    half::bf16::from_f32(ref_odd_f32(&(f64_units(a) * f64_units(b)), 2148))
}

fn bf16_add(x: half::bf16, y: half::bf16) -> half::bf16 {
    let (a, b) = (x.to_f64(), y.to_f64());
    let exact = if a.is_finite() && b.is_finite() {
        f64_units(a) + f64_units(b)
    } else {
        BigInt::zero()
    };
    if exact.is_zero() {
        return half::bf16::from_f64(a + b); // NaN, Inf and (signed) zeros are exact
    }
    half::bf16::from_f32(ref_odd_f32(&exact, 1074))
}

/// The posit<8,0> operation tables equal softposit's P8E0 `*` and `+` on all 65536 pattern
/// pairs (and the exact reference, in the next test).
#[test]
fn posit8_0_op_tables_equal_softposit_on_all_65536_pairs() {
    let t = OpTables::get(&Format::posit(8, 0).unwrap()).unwrap();
    let mut mm = Mismatches::default();
    for a in 0..=255u8 {
        mm.check(
            same(t.decode[a as usize], P8E0::from_bits(a).to_f64()),
            || format!("decode {a:#x}"),
        );
        for b in 0..=255u8 {
            let (pa, pb) = (P8E0::from_bits(a), P8E0::from_bits(b));
            let i = (a as usize) << 8 | b as usize;
            let (mul, add) = ((pa * pb).to_bits(), (pa + pb).to_bits());
            mm.check(t.mul[i] == mul, || {
                format!("{a:#x} * {b:#x}: {:#x} vs {mul:#x}", t.mul[i])
            });
            mm.check(t.add[i] == add, || {
                format!("{a:#x} + {b:#x}: {:#x} vs {add:#x}", t.add[i])
            });
        }
    }
    mm.assert_none_of("posit<8,0> tables vs P8E0", 2 * 65536);
}

/// The tables of every posit of at most 8 bits equal the exact reference rounding of the
/// exact product and sum, on all pattern pairs (NaR in, NaR out).
#[test]
fn small_posit_op_tables_equal_exact_reference_rounding() {
    let mut mm = Mismatches::default();
    for &(n, es) in &[
        (8, 0),
        (8, 1),
        (8, 2),
        (8, 3),
        (6, 0),
        (7, 2),
        (5, 1),
        (3, 0),
    ] {
        let r = Ref::new(n, es);
        let t = OpTables::get(&r.format()).unwrap();
        for a in 0..1u32 << n {
            mm.check(same(t.decode[a as usize], r.value(a)), || {
                format!("{} decode {a:#x}", r.name())
            });
            for b in 0..1u32 << n {
                let i = (a as usize) << 8 | b as usize;
                let mul = r
                    .exact(&[Term::Product(a, b)])
                    .map_or(r.nar(), |x| r.round(&x));
                let add = r
                    .exact(&[Term::Single(a), Term::Single(b)])
                    .map_or(r.nar(), |x| r.round(&x));
                mm.check(t.mul[i] as u32 == mul, || {
                    format!("{} {a:#x} * {b:#x}: {:#x} vs {mul:#x}", r.name(), t.mul[i])
                });
                mm.check(t.add[i] as u32 == add, || {
                    format!("{} {a:#x} + {b:#x}: {:#x} vs {add:#x}", r.name(), t.add[i])
                });
            }
        }
    }
    mm.assert_none("small posit tables vs reference");
}

/// Naive posit<8,0> matmul, linear (bias added last) and conv2d equal step-by-step loops of
/// softposit P8E0 arithmetic: `acc = acc + a*b`, k ascending, from zero.
#[test]
fn naive_posit8_0_equals_softposit_p8e0_loop() {
    let fmt = Format::posit(8, 0).unwrap();
    let mut rng = SplitMix(1300);
    let mut mm = Mismatches::default();
    let sp = |x: f32| P8E0::from_f32(x);
    let pat = |x: f32| P8E0::from_f32(x).to_bits();
    for &(m, k, n) in &[(1, 1, 1), (7, 50, 9), (16, 300, 12)] {
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, 4.0)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, 4.0)).collect();
        let bias: Vec<f32> = (0..n).map(|_| random_f32(&mut rng, 4.0)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        // linear(x, w) with w = b^T and the bias.
        let wt = bt.t().unwrap().contiguous().unwrap();
        let biast = Tensor::from_vec(bias.clone(), n, &Device::Cpu).unwrap();
        let got_lin = linear(&at, &wt, Some(&biast), &fmt, Accumulation::Naive)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = P8E0::ZERO;
                for t in 0..k {
                    acc += sp(a[i * k + t]) * sp(b[t * n + j]);
                }
                let (g, w) = (pat(got[i * n + j]), acc.to_bits());
                mm.check(g == w, || {
                    format!("matmul {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
                let w = (acc + sp(bias[j])).to_bits();
                let g = pat(got_lin[i * n + j]);
                mm.check(g == w, || {
                    format!("linear {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
            }
        }
    }
    // conv2d: the sum runs over (channel, kernel row, kernel column) ascending; padding
    // contributes exact zeros.
    let (nb, c, h, wd, oc, kh, kw, s, pd) = (2, 2, 6, 5, 3, 3, 2, 2, 1);
    let x: Vec<f32> = (0..nb * c * h * wd)
        .map(|_| random_f32(&mut rng, 2.0))
        .collect();
    let w: Vec<f32> = (0..oc * c * kh * kw)
        .map(|_| random_f32(&mut rng, 2.0))
        .collect();
    let bias: Vec<f32> = (0..oc).map(|_| random_f32(&mut rng, 2.0)).collect();
    let xt = Tensor::from_vec(x.clone(), (nb, c, h, wd), &Device::Cpu).unwrap();
    let wt = Tensor::from_vec(w.clone(), (oc, c, kh, kw), &Device::Cpu).unwrap();
    let bt = Tensor::from_vec(bias.clone(), oc, &Device::Cpu).unwrap();
    let out = conv2d(&xt, &wt, Some(&bt), s, pd, &fmt, Accumulation::Naive).unwrap();
    let (oh, ow) = ((h + 2 * pd - kh) / s + 1, (wd + 2 * pd - kw) / s + 1);
    assert_eq!(out.dims(), &[nb, oc, oh, ow]);
    let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut idx = 0;
    for b in 0..nb {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = P8E0::ZERO;
                    for ci in 0..c {
                        for i in 0..kh {
                            for j in 0..kw {
                                let y = (oy * s + i) as isize - pd as isize;
                                let xx = (ox * s + j) as isize - pd as isize;
                                let xv = if y < 0 || xx < 0 || y >= h as isize || xx >= wd as isize
                                {
                                    P8E0::ZERO
                                } else {
                                    sp(x[((b * c + ci) * h + y as usize) * wd + xx as usize])
                                };
                                acc += sp(w[((o * c + ci) * kh + i) * kw + j]) * xv;
                            }
                        }
                    }
                    let want = (acc + sp(bias[o])).to_bits();
                    let g = pat(got[idx]);
                    mm.check(g == want, || {
                        format!("conv out[{idx}]: {g:#x} vs {want:#x}")
                    });
                    idx += 1;
                }
            }
        }
    }
    mm.assert_none("naive posit<8,0> vs P8E0 loop");
}

/// Naive posit<16,1> (the f64 round-to-odd path) equals a loop of softposit `P16E1`
/// arithmetic, bias last (inputs converted with the exact `PxE1<16>::from_f32`).
#[test]
fn naive_posit16_1_equals_softposit_p16e1_loop() {
    let fmt = Format::posit(16, 1).unwrap();
    let mut rng = SplitMix(1500);
    let mut mm = Mismatches::default();
    let pat = |x: f32| (PxE1::<16>::from_f32(x).to_bits() >> 16) as u16;
    let sp = |x: f32| P16E1::from_bits(pat(x));
    for &(m, k, n) in &[(1, 1, 1), (6, 80, 7), (9, 400, 5)] {
        let scale = [1.0, 100.0, 1e6][k % 3];
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, scale)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, scale)).collect();
        let bias: Vec<f32> = (0..n).map(|_| random_f32(&mut rng, scale)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let wt = bt.t().unwrap().contiguous().unwrap();
        let biast = Tensor::from_vec(bias.clone(), n, &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let got_lin = linear(&at, &wt, Some(&biast), &fmt, Accumulation::Naive)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = P16E1::ZERO;
                for t in 0..k {
                    acc += sp(a[i * k + t]) * sp(b[t * n + j]);
                }
                let (g, w) = (pat(got[i * n + j]), acc.to_bits());
                mm.check(g == w, || {
                    format!("matmul {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
                let w = (acc + sp(bias[j])).to_bits();
                let g = pat(got_lin[i * n + j]);
                mm.check(g == w, || {
                    format!("linear {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
            }
        }
    }
    mm.assert_none("naive posit<16,1> vs P16E1 loop");
}

/// Naive GEMMs of posits without a softposit type (and posit<16,2>, <32,2>) equal a loop of
/// exactly rounded reference operations.
#[test]
fn naive_wider_posits_equal_exact_reference_operation_loop() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(1600);
    for &(pn, pes) in &[(16, 2), (12, 3), (10, 1), (32, 2), (16, 5)] {
        let r = Ref::new(pn, pes);
        let (m, k, n) = (4, 40, 5);
        let g = Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed);
        let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
        let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
        let mut out = vec![0.0; m * n];
        naive_gemm(&r.format(), &a, &b, (m, k, n), Bias::None, &mut out, true);
        let via_op =
            values(&naive_matmul(&tensor(&a, &[m, k]), &tensor(&b, &[k, n]), &r.format()).unwrap());
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0u32;
                for t in 0..k {
                    let prod = r.round(
                        &r.exact(&[Term::Product(g.a[i * k + t], g.b[t * n + j])])
                            .unwrap(),
                    );
                    acc = r.round(&r.exact(&[Term::Single(acc), Term::Single(prod)]).unwrap());
                }
                let want = r.value(acc);
                let o = i * n + j;
                mm.check(same(out[o], want), || {
                    format!("{} [{i}][{j}]: {:e} vs {want:e}", r.name(), out[o])
                });
                mm.check(same(via_op[o], want), || {
                    format!("{} op [{i}][{j}]", r.name())
                });
            }
        }
    }
    mm.assert_none("naive wider posits vs reference loop");
}

/// The fp16 naive GEMM (f64 round-to-odd path) equals a loop of `half::f16` arithmetic: an
/// f16 product is exact in f32, and an f32 sum of two f16 values rounded to f16 is correctly
/// rounded (24 >= 2·11 + 2 bits, so double rounding is innocuous). Overflow to Inf, Inf - Inf
/// = NaN, subnormals and signed zeros included.
#[test]
fn naive_fp16_equals_half_f16_loop() {
    let fmt: Format = "fp16".parse().unwrap();
    let mut rng = SplitMix(1700);
    let mut mm = Mismatches::default();
    let h = |x: f32| f16::from_f32(x);
    for &(m, k, n, scale) in &[
        (5, 60, 6, 1.0),
        (4, 200, 3, 300.0),
        (3, 50, 4, 1e-3),
        (3, 30, 3, 2e-5),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, scale)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, scale)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = f16::ZERO;
                for t in 0..k {
                    let prod = h(h(a[i * k + t]).to_f32() * h(b[t * n + j]).to_f32());
                    acc = h(acc.to_f32() + prod.to_f32());
                }
                let (g, w) = (got[i * n + j], acc.to_f32());
                mm.check(same32(g, w), || {
                    format!("{m}x{k}x{n} s{scale} [{i}][{j}]: {g:e} vs {w:e}")
                });
            }
        }
    }
    mm.assert_none("naive fp16 vs half loop");
}

/// The e4m3 tables (the 8-bit float table path) equal the reference on all pattern pairs
/// (sums and products of e4m3 values are exact in f64), and the naive GEMM equals a loop of
/// reference operations.
#[test]
fn naive_e4m3_equals_ocp_reference() {
    let fmt: Format = "e4m3".parse().unwrap();
    let t = OpTables::get(&fmt).unwrap();
    let mut mm = Mismatches::default();
    assert_eq!(e4m3_round(464.0), 0x7e, "464 ties to 448");
    assert_eq!(e4m3_round(464.1), 0x7f);
    assert_eq!(e4m3_value(0x7e), 448.0);
    let pat = |v: f64| if v.is_nan() { 0x7f } else { e4m3_round(v) };
    for a in 0..=255u8 {
        mm.check(same(t.decode[a as usize], e4m3_value(a)), || {
            format!("decode {a:#x}")
        });
        for b in 0..=255u8 {
            let i = (a as usize) << 8 | b as usize;
            let (x, y) = (e4m3_value(a), e4m3_value(b));
            let (mul, add) = (e4m3_round(x * y), e4m3_round(x + y));
            // NaN patterns compare by value (either sign).
            let ok = |g: u8, w: u8| g == w || (e4m3_value(g).is_nan() && e4m3_value(w).is_nan());
            mm.check(ok(t.mul[i], mul), || {
                format!("{a:#x} * {b:#x}: {:#x} vs {mul:#x}", t.mul[i])
            });
            mm.check(ok(t.add[i], add), || {
                format!("{a:#x} + {b:#x}: {:#x} vs {add:#x}", t.add[i])
            });
        }
    }
    let mut rng = SplitMix(1800);
    for &(m, k, n, scale) in &[(5, 30, 4, 1.0), (4, 100, 5, 5.0), (3, 40, 3, 0.05)] {
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, scale)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, scale)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f64;
                for t in 0..k {
                    let x = e4m3_value(pat(a[i * k + t] as f64));
                    let y = e4m3_value(pat(b[t * n + j] as f64));
                    let prod = e4m3_value(pat(x * y));
                    acc = e4m3_value(pat(acc + prod));
                }
                let g = got[i * n + j];
                mm.check(same(g as f64, acc), || {
                    format!("{m}x{k}x{n} [{i}][{j}]: {g:e} vs {acc:e}")
                });
            }
        }
    }
    mm.assert_none("e4m3 tables and naive GEMM vs reference");
}

/// Formats without a NaN pattern (OCP e2m1, e3m2) keep NaN inputs NaN in a naive GEMM
/// (the README: NaN stays NaN), like every other format.
#[test]
fn naive_nan_inputs_stay_nan_in_formats_without_nan_patterns() {
    for name in [
        "e2m1",
        "e3m2",
        "e2m3",
        "e4m3",
        "e5m2",
        "posit<8,0>",
        "fixed<8,4>",
    ] {
        let fmt: Format = name.parse().unwrap();
        let a = tensor(&[f64::NAN, 1.0, 1.0, 1.0], &[2, 2]);
        let b = tensor(&[1.0, 0.0, 1.0, 1.0], &[2, 2]);
        let out = values(&naive_matmul(&a, &b, &fmt).unwrap());
        assert!(
            out[0].is_nan() && out[1].is_nan(),
            "{name}: NaN row gives {out:?}"
        );
        assert_eq!(&out[2..], &[2.0, 1.0], "{name}");
    }
}

/// The bf16 naive GEMM takes the general path (f64 round-to-odd, then the format's
/// rounding: bf16's subnormal products are outside the f32 fast path) and equals a loop of
/// exactly rounded bf16 operations, with overflow to Inf, Inf - Inf and subnormals.
#[test]
fn naive_bf16_equals_exactly_rounded_bf16_loop() {
    let fmt: Format = "bf16".parse().unwrap();
    let mut rng = SplitMix(2300);
    let mut mm = Mismatches::default();
    let h = half::bf16::from_f32;
    let mut seen = [0usize; 3];
    // Values 2^e · m with e in -lo..hi: products reach bf16's subnormals and overflow.
    let draw = |rng: &mut SplitMix, lo: i32, hi: i32| -> f32 {
        if rng.below(50) == 0 {
            return f32::NAN;
        }
        let e = rng.below((lo + hi) as u64) as i32 - lo;
        let m = 1.0 + (rng.next_u64() >> 11) as f64 / two_pow(53);
        let v = (m * two_pow(e)) as f32;
        if rng.coin() {
            -v
        } else {
            v
        }
    };
    for &(m, k, n, lo, hi) in &[
        (4, 50, 5, 10, 10),
        (3, 40, 4, 80, 0),
        (3, 40, 4, 0, 64),
        (5, 200, 3, 30, 30),
        (3, 20, 3, 0, 70),
    ] {
        // The last case: positive values without NaN, so that sums overflow to Inf.
        let positive = hi == 70;
        let d = |rng: &mut SplitMix| match draw(rng, lo, hi) {
            v if positive && v.is_nan() => 1.0,
            v if positive => v.abs(),
            v => v,
        };
        let a: Vec<f32> = (0..m * k).map(|_| d(&mut rng)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| d(&mut rng)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = half::bf16::ZERO;
                for t in 0..k {
                    let prod = bf16_mul(h(a[i * k + t]), h(b[t * n + j]));
                    let pv = prod.to_f32().abs();
                    seen[0] += (pv > 0.0 && pv < f32::MIN_POSITIVE) as usize;
                    acc = bf16_add(acc, prod);
                }
                let (g, w) = (got[i * n + j], acc.to_f32());
                seen[1] += w.is_infinite() as usize;
                seen[2] += w.is_nan() as usize;
                mm.check(same32(g, w), || {
                    format!("{m}x{k}x{n} 2^-{lo}..2^{hi} [{i}][{j}]: {g:e} vs {w:e}")
                });
            }
        }
    }
    assert!(
        seen.iter().all(|&c| c > 0),
        "subnormal products, Inf, NaN outputs: {seen:?}"
    );
    mm.assert_none("naive bf16 vs exactly rounded loop");
}
