//! `quire_gemm` and the tensor ops built on it against the exact reference: each
//! accumulator path (I16, F64, I128, Wide; the path asserted, with the i16 path's chunk and
//! tile edges and the i128/wide limit), biases accumulated inside the quire, NaR and ±Inf
//! rows and columns, `quire_matmul` batched and broadcast, `linear`, `conv2d` against a
//! direct loop over the receptive field, empty shapes, and inputs whose posit value lies
//! beyond their dtype's range.

mod common;
#[path = "common/exact.rs"]
mod exact;

use common::reference::two_pow;
use common::{Mismatches, SplitMix};
use exact::{compare, p, same, t2, tensor, values, Draw, Gemm, Ref, Term};

use candle_core::{DType, Device, Tensor};
use num_bigint::BigInt;
use num_traits::Zero;
use qcandle::quire::gemm_cpu::{
    accumulator_exact, accumulator_for, quire_gemm, quire_gemm_with, Accumulator, Bias,
};
use qcandle::quire::{conv2d, linear, matmul, quire_matmul, Accumulation};
use qcandle::Format;

/// Reference convolution: direct loop over the receptive field, exact sums.
#[allow(clippy::too_many_arguments)]
fn conv_reference(
    r: &Ref,
    x: &[u32],
    (nb, c, h, wd): (usize, usize, usize, usize),
    w: &[u32],
    (oc, kh, kw): (usize, usize, usize),
    bias: Option<&[u32]>,
    stride: usize,
    pad: usize,
) -> (Vec<f64>, usize, usize) {
    let oh = (h + 2 * pad - kh) / stride + 1;
    let ow = (wd + 2 * pad - kw) / stride + 1;
    let mut out = Vec::new();
    for b in 0..nb {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut terms = Vec::new();
                    for ci in 0..c {
                        for i in 0..kh {
                            for j in 0..kw {
                                let y = (oy * stride + i) as isize - pad as isize;
                                let xx = (ox * stride + j) as isize - pad as isize;
                                if y < 0 || xx < 0 || y >= h as isize || xx >= wd as isize {
                                    continue;
                                }
                                let xv = x[((b * c + ci) * h + y as usize) * wd + xx as usize];
                                let wv = w[((o * c + ci) * kh + i) * kw + j];
                                terms.push(Term::Product(wv, xv));
                            }
                        }
                    }
                    if let Some(bias) = bias {
                        terms.push(Term::Single(bias[o]));
                    }
                    let e = r.exact(&terms);
                    out.push(r.value(e.map_or(r.nar(), |e| r.round(&e))));
                }
            }
        }
    }
    (out, oh, ow)
}

/// The path each format takes, at the documented limits.
#[test]
fn accumulator_for_picks_the_narrowest_exact_path() {
    use Accumulator::*;
    // posit<8,0>: s = 6, i16 operands, exact while terms · 2^24 <= 2^53, i.e. terms < 2^29.
    assert_eq!(accumulator_for(p(8, 0), 1), I16);
    assert_eq!(accumulator_for(p(8, 0), 1000), I16);
    assert_eq!(accumulator_for(p(8, 0), (1 << 29) - 1), I16);
    // posit<7,1>: s = 10, too wide for i16 operands, f64 while terms < 2^13.
    assert_eq!(accumulator_for(p(7, 1), (1 << 13) - 1), F64);
    // Past the exact f64 paths: the checked f64 GEMM, up to 2^32 terms.
    assert_eq!(accumulator_for(p(7, 1), 1 << 13), F64Checked);
    assert_eq!(accumulator_for(p(8, 0), 1 << 29), F64Checked);
    // posit<8,1>: s = 12, f64 for fewer than 32 terms.
    assert_eq!(accumulator_for(p(8, 1), 31), F64);
    assert_eq!(accumulator_for(p(8, 1), 32), F64Checked);
    assert_eq!(accumulator_for(p(8, 2), 1), F64Checked);
    assert_eq!(accumulator_for(p(16, 1), 1), F64Checked);
    assert_eq!(accumulator_for(p(16, 1), 1 << 14), F64Checked);
    assert_eq!(accumulator_for(p(16, 2), 1), F64Checked);
    assert_eq!(accumulator_for(p(32, 2), 1), F64Checked);
    assert_eq!(accumulator_for(p(16, 5), 1), F64Checked);
    // Beyond 2^32 terms: i128 while the sum fits 126 bits (posit<8,1>: 48 + 33 bits), else
    // the quire (posit<8,2>: 96 + 33 bits; posit<16,1>: 112 + 33).
    assert_eq!(accumulator_for(p(8, 1), (1 << 32) + 1), I128);
    assert_eq!(accumulator_for(p(8, 2), (1 << 32) + 1), Wide);
    assert_eq!(accumulator_for(p(16, 1), (1 << 32) + 1), Wide);
    // Zero terms count as one.
    assert_eq!(accumulator_for(p(8, 0), 0), I16);
    // Which accumulators are exact for a format and a number of terms.
    assert!(accumulator_exact(I128, p(16, 1), 1 << 20));
    assert!(!accumulator_exact(I128, p(16, 2), 1));
    assert!(!accumulator_exact(F64, p(16, 1), 1));
    assert!(!accumulator_exact(I16, p(8, 1), 1));
    assert!(accumulator_exact(Wide, p(32, 2), 1 << 40));
}

/// Every accumulator path (`quire_gemm_with`, each case's path forced) and `quire_gemm`
/// (the path it picks), with and without biases per row and per column, serial and
/// parallel, with NaR rows and columns in some cases.
#[test]
fn quire_gemm_matches_reference_on_every_accumulator_path() {
    use Accumulator::*;
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(600);
    let mut seen = Vec::new();
    // (n, es, m, k, n, path)
    let cases: &[(u32, u32, usize, usize, usize, Accumulator)] = &[
        (8, 0, 7, 33, 9, I16),
        (8, 0, 40, 300, 17, I16),
        (7, 1, 4, 100, 5, F64),
        (8, 1, 5, 30, 6, F64),
        (8, 1, 5, 40, 6, I128),
        (8, 1, 5, 40, 6, F64Checked),
        (8, 2, 9, 50, 11, I128),
        (8, 2, 9, 50, 11, F64Checked),
        (16, 1, 12, 70, 5, I128),
        (16, 1, 12, 70, 5, F64Checked),
        (16, 1, 2, 20_000, 3, Wide),
        (16, 1, 2, 20_000, 3, F64Checked),
        (16, 2, 8, 60, 7, Wide),
        (16, 2, 8, 60, 7, F64Checked),
        (12, 3, 4, 25, 6, Wide),
        (12, 3, 4, 25, 6, F64Checked),
        (6, 0, 3, 200, 4, I16),
        (10, 1, 6, 10, 6, I128),
        (6, 0, 6, 2, 6, I16),
        (16, 5, 3, 30, 4, Wide),
        (32, 2, 3, 30, 4, Wide),
        (32, 2, 3, 30, 4, F64Checked),
    ];
    for (ci, &(pn, pes, m, k, n, path)) in cases.iter().enumerate() {
        let r = Ref::new(pn, pes);
        for variant in 0..4 {
            let how = [Draw::Mixed, Draw::NearOne, Draw::Uniform, Draw::Mixed][variant];
            let mut g = Gemm::random(&r, &mut rng, (m, k, n), how);
            let bias_kind = variant % 3; // none, per row, per col
            if bias_kind > 0 {
                let len = if bias_kind == 1 { m } else { n };
                let v = (0..len).map(|_| r.draw(&mut rng, how)).collect();
                g.bias = Some((bias_kind == 1, v));
            }
            if variant == 3 {
                // NaR in row 1 of a and column 2 of b (when they exist).
                if m > 1 {
                    g.a[k + rng.below(k as u64) as usize] = r.nar();
                }
                if n > 2 {
                    g.b[rng.below(k as u64) as usize * n + 2] = r.nar();
                }
            }
            seen.push(path);
            let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
            let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
            let bias_v: Option<Vec<f64>> = g
                .bias
                .as_ref()
                .map(|(_, v)| v.iter().map(|&p| r.value(p)).collect());
            let bias = match (&g.bias, &bias_v) {
                (Some((true, _)), Some(v)) => Bias::PerRow(v),
                (Some((false, _)), Some(v)) => Bias::PerCol(v),
                _ => Bias::None,
            };
            let want = g.expected(&r);
            for (parallel, forced) in [(false, true), (true, true), (true, false)] {
                let mut out = vec![0.0; m * n];
                if forced {
                    quire_gemm_with(path, r.posit(), &a, &b, (m, k, n), bias, &mut out, parallel)
                        .expect("an exact path");
                } else {
                    quire_gemm(r.posit(), &a, &b, (m, k, n), bias, &mut out, parallel);
                }
                compare(&mut mm, &out, &want, |o| {
                    format!(
                        "case {ci} {} ({m}x{k}x{n}, {path:?} forced {forced}) variant {variant} parallel {parallel} out[{}][{}]",
                        r.name(),
                        o / n,
                        o % n
                    )
                });
                if variant == 3 {
                    for (o, v) in out.iter().enumerate() {
                        let nar = (m > 1 && o / n == 1) || (n > 2 && o % n == 2);
                        mm.check(v.is_nan() == nar, || {
                            format!(
                                "case {ci} {}: NaR leaks to out[{}][{}] = {v}",
                                r.name(),
                                o / n,
                                o % n
                            )
                        });
                    }
                }
            }
        }
    }
    for path in [I16, F64, F64Checked, I128, Wide] {
        assert!(seen.contains(&path), "{path:?} not covered");
    }
    mm.assert_none("quire_gemm vs reference");
}

/// posit<16,1> at the I128 limit: 16383 maxpos² terms (the largest sum the i128 path takes
/// in one chunk), then the same with a bias (16384 terms: Wide, i128 chunks gathered in a
/// quire); each also cancelled down to one minpos²; the checked f64 path (`quire_gemm`) on
/// the same sums.
#[test]
fn quire_gemm_i128_and_wide_paths_meet_at_2_pow_14_terms_for_posit16_1() {
    let r = Ref::new(16, 1);
    let posit = r.posit();
    let (maxpos, minpos) = (r.value(r.maxp()), r.value(1));
    let mut mm = Mismatches::default();
    for (k, bias) in [(16383usize, false), (16383, true), (16384, false)] {
        let terms = k + usize::from(bias);
        assert_eq!(accumulator_for(posit, terms), Accumulator::F64Checked);
        for path in [
            Accumulator::I128,
            Accumulator::Wide,
            Accumulator::F64Checked,
        ] {
            // Row 0: all maxpos·maxpos (saturates); row 1: -maxpos·maxpos.
            // Row 2: half +maxpos², half -maxpos², one minpos·minpos: exactly minpos².
            let m = 3;
            let mut a = vec![maxpos; m * k];
            for t in 0..k {
                a[k + t] = -maxpos;
                a[2 * k + t] = if t % 2 == 0 { maxpos } else { -maxpos };
            }
            let mut b = vec![maxpos; k];
            a[2 * k + k - 1] = minpos;
            b[k - 1] = minpos;
            // With an odd k the row-2 pairs are (k - 1) / 2 each way when the last one is minpos².
            let bias_v = [0.0];
            let bias_b = if bias {
                Bias::PerCol(&bias_v)
            } else {
                Bias::None
            };
            let mut out = vec![0.0; m];
            quire_gemm_with(path, posit, &a, &b, (m, k, 1), bias_b, &mut out, false)
                .expect("exact");
            let pattern_of = |x: f64| match x {
                x if x == maxpos => r.maxp(),
                x if x == -maxpos => r.neg(r.maxp()),
                x if x == minpos => 1,
                _ => unreachable!(),
            };
            let exact = |row: usize| -> BigInt {
                let mut sum = BigInt::zero();
                for t in 0..k {
                    let (x, y) = (a[row * k + t], b[t]);
                    let ux = r.minpos_units(pattern_of(x)).unwrap();
                    let uy = r.minpos_units(pattern_of(y)).unwrap();
                    sum += ux * uy;
                }
                sum
            };
            for (row, &got) in out.iter().enumerate() {
                let want = r.value(r.round(&exact(row)));
                mm.check(same(got, want), || {
                    format!("k = {k}, bias {bias} ({path:?}): row {row} {got:e} vs {want:e}")
                });
            }
            if k % 2 == 1 {
                assert_eq!(out[2], minpos, "k = {k}: cancels to minpos² -> minpos");
            }
            assert_eq!((out[0], out[1]), (maxpos, -maxpos), "k = {k}");
        }
    }
    mm.assert_none("i128/wide limit");
}

/// `quire_matmul` on batched (2, 3, m, k) · (2, 3, k, n) and broadcast (4, m, k) · (k, n)
/// inputs equals the reference per batch item, on each path; f32 inputs give f32 outputs.
#[test]
fn quire_matmul_batched_and_broadcast_match_reference() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(700);
    for &(pn, pes) in &[(8, 0), (8, 2), (16, 1), (16, 2)] {
        let r = Ref::new(pn, pes);
        let fmt = r.format();
        let (m, k, n) = (5, 23, 4);
        // Batched: 6 items, each its own b.
        let gs: Vec<Gemm> = (0..6)
            .map(|_| Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed))
            .collect();
        let a: Vec<f64> = gs
            .iter()
            .flat_map(|g| g.a.iter().map(|&p| r.value(p)))
            .collect();
        let b: Vec<f64> = gs
            .iter()
            .flat_map(|g| g.b.iter().map(|&p| r.value(p)))
            .collect();
        let out =
            quire_matmul(&tensor(&a, &[2, 3, m, k]), &tensor(&b, &[2, 3, k, n]), &fmt).unwrap();
        assert_eq!(out.dims(), &[2, 3, m, n]);
        let want: Vec<f64> = gs.iter().flat_map(|g| g.expected(&r)).collect();
        compare(&mut mm, &values(&out), &want, |o| {
            format!("{} batched out[{o}]", r.name())
        });
        // Broadcast b.
        let shared = Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed);
        let mut gs: Vec<Gemm> = (0..4)
            .map(|_| Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed))
            .collect();
        gs.iter_mut().for_each(|g| g.b = shared.b.clone());
        let a: Vec<f64> = gs
            .iter()
            .flat_map(|g| g.a.iter().map(|&p| r.value(p)))
            .collect();
        let b: Vec<f64> = shared.b.iter().map(|&p| r.value(p)).collect();
        let out = quire_matmul(&tensor(&a, &[4, m, k]), &tensor(&b, &[k, n]), &fmt).unwrap();
        assert_eq!(out.dims(), &[4, m, n]);
        let want: Vec<f64> = gs.iter().flat_map(|g| g.expected(&r)).collect();
        compare(&mut mm, &values(&out), &want, |o| {
            format!("{} broadcast out[{o}]", r.name())
        });
        // f32 in, f32 out; `matmul` with Accumulation::Quire is the same op.
        let g = &gs[0];
        let a32: Vec<f32> = g.a.iter().map(|&p| r.value(p) as f32).collect();
        let b32: Vec<f32> = g.b.iter().map(|&p| r.value(p) as f32).collect();
        let at = Tensor::from_vec(a32, (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b32, (k, n), &Device::Cpu).unwrap();
        let out = matmul(&at, &bt, &fmt, Accumulation::Quire).unwrap();
        assert_eq!(out.dtype(), DType::F32);
        compare(&mut mm, &values(&out), &g.expected(&r), |o| {
            format!("{} f32 out[{o}]", r.name())
        });
    }
    mm.assert_none("quire_matmul");
}

/// `linear` with Accumulation::Quire: the bias is one more term inside the quire (one rounding
/// per output), on each path. Includes a case where rounding the dot product before adding
/// the bias would differ.
#[test]
fn quire_linear_accumulates_the_bias_inside_the_quire() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(800);
    for &(pn, pes) in &[(8, 0), (8, 2), (16, 1), (16, 2)] {
        let r = Ref::new(pn, pes);
        let fmt = r.format();
        let (rows, inp, outf) = (6, 37, 5);
        // x (rows, in) is `a`; w (out, in) is b transposed.
        let mut g = Gemm::random(&r, &mut rng, (rows, inp, outf), Draw::Mixed);
        let bias: Vec<u32> = (0..outf).map(|_| r.draw(&mut rng, Draw::Mixed)).collect();
        g.bias = Some((false, bias.clone()));
        let x: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
        let mut w = vec![0.0; outf * inp];
        for t in 0..inp {
            for o in 0..outf {
                w[o * inp + t] = r.value(g.b[t * outf + o]);
            }
        }
        let bv: Vec<f64> = bias.iter().map(|&p| r.value(p)).collect();
        let out = linear(
            &tensor(&x, &[rows, inp]),
            &tensor(&w, &[outf, inp]),
            Some(&tensor(&bv, &[outf])),
            &fmt,
            Accumulation::Quire,
        )
        .unwrap();
        assert_eq!(out.dims(), &[rows, outf]);
        compare(&mut mm, &values(&out), &g.expected(&r), |o| {
            format!("{} linear out[{o}]", r.name())
        });
    }
    // posit<8,0>: 1 + 1/64 (not a posit: ties to 1) plus bias 1/64 is exactly 1 + 1/32 in
    // the quire; rounding first would give round(1 + 1/64) = 1.
    let fmt = Format::posit(8, 0).unwrap();
    let x = tensor(&[1.0, 0.015625], &[1, 2]);
    let w = tensor(&[1.0, 1.0], &[1, 2]);
    let b = tensor(&[0.015625], &[1]);
    let out = linear(&x, &w, Some(&b), &fmt, Accumulation::Quire).unwrap();
    assert_eq!(values(&out), [1.03125]);
    mm.assert_none("quire linear");
}

/// `conv2d` with Accumulation::Quire equals a direct loop of the exact reference over the
/// receptive field: stride 2 with padding 1, stride 1 with padding 2 and a non-square
/// kernel, one image (parallel GEMM) and several (parallel images), with and without bias.
#[test]
fn quire_conv2d_matches_direct_reference_loop() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(900);
    for &(pn, pes) in &[(8, 0), (16, 1), (16, 2)] {
        let r = Ref::new(pn, pes);
        let fmt = r.format();
        for &(nb, c, h, wd, oc, kh, kw, stride, pad, with_bias) in &[
            (
                3usize, 2usize, 7usize, 6usize, 3usize, 3usize, 3usize, 2usize, 1usize, true,
            ),
            (1, 3, 5, 8, 2, 2, 3, 1, 2, true),
            (2, 1, 9, 9, 4, 5, 5, 2, 1, false),
        ] {
            let x: Vec<u32> = (0..nb * c * h * wd)
                .map(|_| r.draw(&mut rng, Draw::Mixed))
                .collect();
            let w: Vec<u32> = (0..oc * c * kh * kw)
                .map(|_| r.draw(&mut rng, Draw::Mixed))
                .collect();
            let bias: Vec<u32> = (0..oc).map(|_| r.draw(&mut rng, Draw::Mixed)).collect();
            let bias = with_bias.then_some(bias.as_slice());
            let (want, oh, ow) =
                conv_reference(&r, &x, (nb, c, h, wd), &w, (oc, kh, kw), bias, stride, pad);
            let xt = tensor(
                &x.iter().map(|&p| r.value(p)).collect::<Vec<_>>(),
                &[nb, c, h, wd],
            );
            let wt = tensor(
                &w.iter().map(|&p| r.value(p)).collect::<Vec<_>>(),
                &[oc, c, kh, kw],
            );
            let bt =
                bias.map(|b| tensor(&b.iter().map(|&p| r.value(p)).collect::<Vec<_>>(), &[oc]));
            let out = conv2d(
                &xt,
                &wt,
                bt.as_ref(),
                stride,
                pad,
                &fmt,
                Accumulation::Quire,
            )
            .unwrap();
            assert_eq!(out.dims(), &[nb, oc, oh, ow]);
            compare(&mut mm, &values(&out), &want, |o| {
                format!(
                    "{} conv {nb}x{c}x{h}x{wd} * {oc}x{c}x{kh}x{kw} s{stride} p{pad}: out[{o}]",
                    r.name()
                )
            });
        }
    }
    mm.assert_none("quire conv2d");
}

/// NaN (NaR) inputs in one row of `a` and one column of `b` make exactly that row and
/// column of the output NaN, on each path, through the tensor op.
#[test]
fn quire_matmul_nar_rows_and_cols_give_nan_only_in_their_outputs() {
    let mut rng = SplitMix(1000);
    for &(pn, pes, k) in &[
        (8, 0, 20),
        (8, 2, 20),
        (16, 1, 20),
        (16, 1, 16384),
        (16, 2, 20),
    ] {
        let r = Ref::new(pn, pes);
        let (m, n) = (4, 5);
        let mut g = Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed);
        g.a[2 * k + 3] = r.nar();
        g.b[(k - 1) * n + 1] = r.nar();
        let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
        let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
        let out =
            values(&quire_matmul(&tensor(&a, &[m, k]), &tensor(&b, &[k, n]), &r.format()).unwrap());
        let want = g.expected(&r);
        for (o, (&v, &w)) in out.iter().zip(&want).enumerate() {
            let nar = o / n == 2 || o % n == 1;
            assert_eq!(
                v.is_nan(),
                nar,
                "{} k = {k}: out[{}][{}] = {v}",
                r.name(),
                o / n,
                o % n
            );
            assert!(same(v, w), "{} k = {k}: out[{o}] {v:e} vs {w:e}", r.name());
        }
    }
}

/// Empty dot products (k = 0) give exact zeros (plus the bias), and empty outputs (m = 0 or
/// n = 0) give empty tensors, for both accumulations.
#[test]
fn empty_dot_products_give_zero_and_empty_shapes_give_empty_outputs() {
    for name in ["posit<8,0>", "posit<16,1>", "posit<16,2>"] {
        let fmt: Format = name.parse().unwrap();
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            let a = Tensor::zeros((3, 0), DType::F32, &Device::Cpu).unwrap();
            let b = Tensor::zeros((0, 2), DType::F32, &Device::Cpu).unwrap();
            let out = matmul(&a, &b, &fmt, acc).unwrap();
            assert_eq!(out.dims(), &[3, 2]);
            assert_eq!(values(&out), [0.0; 6], "{name} {acc:?}");
            let w = Tensor::zeros((2, 0), DType::F32, &Device::Cpu).unwrap();
            let bias = tensor(&[1.5, -2.0], &[2]).to_dtype(DType::F32).unwrap();
            let out = linear(&a, &w, Some(&bias), &fmt, acc).unwrap();
            assert_eq!(
                values(&out),
                [1.5, -2.0, 1.5, -2.0, 1.5, -2.0],
                "{name} {acc:?}"
            );
            let a0 = Tensor::zeros((0, 4), DType::F32, &Device::Cpu).unwrap();
            let b0 = Tensor::zeros((4, 0), DType::F32, &Device::Cpu).unwrap();
            assert_eq!(matmul(&a0, &t2(4, 2), &fmt, acc).unwrap().dims(), &[0, 2]);
            assert_eq!(matmul(&t2(3, 4), &b0, &fmt, acc).unwrap().dims(), &[3, 0]);
        }
    }
}

/// Inputs are rounded to the posit as values, not in the input's dtype: an f16 65504 is
/// posit<16,1>/<16,2> 65536 (beyond f16), so 65504 · 0.5 is 32768; f32::MAX is
/// posit<16,5> 2^128 (beyond f32), so f32::MAX · 2^-100 is 2^28.
#[test]
fn inputs_are_rounded_as_values_beyond_the_range_of_their_dtype() {
    let mut mm = Mismatches::default();
    let cases: [(u32, DType, f64, f64, f64); 3] = [
        (1, DType::F16, 65504.0, 0.5, 32768.0),
        (2, DType::F16, 65504.0, 0.5, 32768.0),
        (5, DType::F32, f32::MAX as f64, two_pow(-100), two_pow(28)),
    ];
    for (es, dt, x, y, want) in cases {
        let r = Ref::new(16, es);
        // The expectation from the reference: round(round(x) · round(y)).
        let exact = r
            .exact(&[Term::Product(r.round_f64(x), r.round_f64(y))])
            .unwrap();
        assert_eq!(
            r.value(r.round(&exact)),
            want,
            "{}: the expectation itself",
            r.name()
        );
        let a = tensor(&[x], &[1, 1]).to_dtype(dt).unwrap();
        let b = tensor(&[y], &[1, 1]).to_dtype(dt).unwrap();
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            let got = values(&matmul(&a, &b, &r.format(), acc).unwrap())[0];
            mm.check(got == want, || {
                format!(
                    "{} {dt:?} {acc:?}: {x:e} · {y:e} gives {got:e}, expected {want:e}",
                    r.name()
                )
            });
        }
    }
    mm.assert_none("inputs rounded beyond their dtype's range");
}

/// NaN and ±Inf operands (±Inf is no posit value, so it can only come from outside the
/// format's grid) make their row or column NaN on every path, never a finite result.
#[test]
fn quire_gemm_treats_infinite_operands_as_nar_on_every_path() {
    for &(pn, pes, k) in &[(8, 0, 5), (7, 1, 5), (8, 2, 5), (16, 1, 5), (16, 2, 5)] {
        let posit = p(pn, pes);
        let path = accumulator_for(posit, k + 1);
        let (m, n) = (3, 3);
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let mut a = vec![1.0; m * k];
            let mut b = vec![0.5; k * n];
            a[k + 2] = bad; // row 1
            b[3 * n + 2] = bad; // column 2
            for bias in [Bias::None, Bias::PerRow(&[bad, 1.0, 1.0])] {
                let mut out = vec![0.0; m * n];
                quire_gemm(posit, &a, &b, (m, k, n), bias, &mut out, false);
                for (o, v) in out.iter().enumerate() {
                    let nar =
                        o / n == 1 || o % n == 2 || (o / n == 0 && !matches!(bias, Bias::None));
                    let want = if nar {
                        f64::NAN
                    } else {
                        k as f64 * 0.5 + if matches!(bias, Bias::None) { 0.0 } else { 1.0 }
                    };
                    assert!(
                        same(*v, want),
                        "posit<{pn},{pes}> ({path:?}) {bad}: out[{o}] = {v}, expected {want}"
                    );
                }
            }
        }
    }
}

/// The i16 path sums 64 products per i32 chunk in 1 x 4 output tiles: every k around the
/// chunk size and every n around the tile width, with maxpos² terms that fill the chunks,
/// and a 100k-term dot product.
#[test]
fn quire_gemm_i16_path_is_exact_at_chunk_and_tile_edges() {
    let r = Ref::new(8, 0);
    let posit = r.posit();
    let mut rng = SplitMix(2200);
    let mut mm = Mismatches::default();
    for k in [1, 2, 63, 64, 65, 127, 128, 129, 1000] {
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 9] {
            assert_eq!(accumulator_for(posit, k), Accumulator::I16);
            let how = if (k + n) % 2 == 0 {
                Draw::Extreme
            } else {
                Draw::Mixed
            };
            let g = Gemm::random(&r, &mut rng, (2, k, n), how);
            let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
            let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
            let mut out = vec![0.0; 2 * n];
            quire_gemm(posit, &a, &b, (2, k, n), Bias::None, &mut out, n % 2 == 0);
            compare(&mut mm, &out, &g.expected(&r), |o| {
                format!("k = {k}, n = {n}: out[{o}]")
            });
        }
    }
    // maxpos² (2^24 units) in every term: each chunk sums to 2^30; then cancelled to minpos².
    let k = 100_001;
    let mut a = vec![64.0; 2 * k];
    let b = vec![64.0; k];
    for t in 0..k {
        a[k + t] = if t % 2 == 0 { 64.0 } else { -64.0 };
    }
    a[2 * k - 1] = r.value(1);
    let mut out = vec![0.0; 2];
    quire_gemm(posit, &a, &b, (2, k, 1), Bias::None, &mut out, false);
    assert_eq!(out, [64.0, 1.0], "saturates; cancels to 64 · minpos = 1");
    mm.assert_none("i16 path edges");
}
