//! The `accumulate` setting of `QLinear` and `QConv2d`: forward output, input gradient,
//! weight gradient and bias gradient against scalar reference loops written here, bit for
//! bit, for posit, float, fixed-point and LNS formats and every rule (`quire`, `naive`,
//! `naive:<A>`, `fma:<A>`, `lns:<impl>`), on odd shapes, batched, with and without bias,
//! convolutions with stride, padding and dilation.
//!
//! The reference computes every operation exactly with big integers (`common/exact.rs`:
//! values in units of 2^-1074, products in units of 2^-2148), narrows the exact result to an
//! f64 rounded to odd there, and rounds that with the format's scalar `Format::round`
//! (nearest even); zero results take IEEE signs (`x + y` of two zeros keeps a shared sign,
//! an exact cancellation is +0, a product with a zero factor has the XOR sign). LNS sums
//! and products are `LnsArith`'s scalar operations, one at a time. The loops index the
//! tensors directly (no im2col): forward over `(c, i, j)`, weight gradient over
//! `(n, oy, ox)`, input gradient over `(o, i, j)` with zero terms where no output pixel
//! reads the input pixel, as `qcandle::quire::layer_conv` documents.
//!
//! Candle adds each parameter's gradient into a zero tensor, which turns a -0 into +0, so
//! gradients are compared after the same `+ 0.0`.

mod common;
#[path = "common/exact.rs"]
mod exact;
#[path = "common/gemm_reference.rs"]
mod gemm_reference;

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Conv2dConfig, VarBuilder, VarMap};
use gemm_reference::{fmt, Arith};
use qcandle::nn::{QConfig, QConv2d, QLinear, QMatMul};
use qcandle::quire::{rule_linear, Accumulate, LayerArith};

use common::{Mismatches, SplitMix};

/// `v` as a gradient reaches a variable (a -0 becomes +0).
fn as_grad(v: f32) -> f32 {
    v + 0.0
}

fn random_values(rng: &mut SplitMix, n: usize, lo: i32, hi: i32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if rng.below(17) == 0 {
                0.0
            } else {
                rng.float_between(lo, hi) as f32
            }
        })
        .collect()
}

/// A config with `format` in the weight, activation, error and gradient categories and
/// the given `accumulate` setting.
fn config(format: &str, setting: &str) -> QConfig {
    QConfig::from_toml(&format!(
        "weight = \"{format}\"\nactivation = \"{format}\"\nerror = \"{format}\"\ngradient = \"{format}\"\naccumulate = \"{setting}\"\n"
    ))
    .expect("the config parses")
}

fn set_var(varmap: &VarMap, name: &str, values: &[f32], shape: &[usize]) {
    let data = varmap.data().lock().expect("var map");
    let t = Tensor::from_vec(values.to_vec(), shape, &Device::Cpu).expect("tensor");
    data.get(name).expect("variable").set(&t).expect("set");
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn compare(m: &mut Mismatches, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        m.check(same, || format!("{what}[{i}]: got {g:e}, want {w:e}"));
    }
}

/// The setting, the format, and the binades of the inputs.
struct Case {
    format: &'static str,
    setting: &'static str,
    lo: i32,
    hi: i32,
}

const CASES: &[Case] = &[
    Case {
        format: "posit<8,0>",
        setting: "quire",
        lo: -4,
        hi: 2,
    },
    Case {
        format: "posit<8,0>",
        setting: "naive",
        lo: -4,
        hi: 2,
    },
    Case {
        format: "posit<8,2>",
        setting: "quire",
        lo: -6,
        hi: 3,
    },
    Case {
        format: "posit<16,1>",
        setting: "quire",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "posit<16,1>",
        setting: "naive",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "posit<16,1>",
        setting: "naive:fp32",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "posit<16,1>",
        setting: "fma:posit<16,1>",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "posit<32,2>",
        setting: "quire",
        lo: -10,
        hi: 4,
    },
    Case {
        format: "posit<32,2>",
        setting: "naive",
        lo: -10,
        hi: 4,
    },
    Case {
        format: "e4m3",
        setting: "naive",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "e4m3",
        setting: "naive:fp16",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "e4m3",
        setting: "naive:bf16",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "e4m3",
        setting: "fma:fp32",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "e5m2",
        setting: "fma:fp16",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "fp16",
        setting: "naive",
        lo: -8,
        hi: 3,
    },
    // Accumulators coarser than the operands: every sum's rounding shows.
    Case {
        format: "fp16",
        setting: "naive:bf16",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "posit<16,1>",
        setting: "fma:e5m2",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "bf16",
        setting: "naive",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "bf16",
        setting: "fma:fp32",
        lo: -8,
        hi: 3,
    },
    Case {
        format: "fixed<16,8>",
        setting: "naive",
        lo: -4,
        hi: 2,
    },
    Case {
        format: "lns<16,8>",
        setting: "lns:ideal",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "lns<16,8>",
        setting: "lns:truncated",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "lns<20,12>",
        setting: "lns:table",
        lo: -6,
        hi: 2,
    },
    Case {
        format: "lns<24,14>",
        setting: "lns:ideal",
        lo: -6,
        hi: 2,
    },
];

/// `QLinear` with `setting`: output, and the gradients of `sum(y · g)` w.r.t. the input,
/// the weight and the bias, against the reference; `lead` are the batch dimensions.
fn check_linear(case: &Case, lead: &[usize], inp: usize, out: usize, seed: u64) -> Mismatches {
    let f = fmt(case.format);
    let cfg = config(case.format, case.setting);
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QLinear::new(inp, out, vb.pp("fc"), &cfg).expect("layer");
    let mut rng = SplitMix(seed);
    let rows: usize = lead.iter().product();
    let (lo, hi) = (case.lo, case.hi);
    let w = random_values(&mut rng, out * inp, lo, hi);
    let b = random_values(&mut rng, out, lo, hi);
    let x = random_values(&mut rng, rows * inp, lo, hi);
    let g: Vec<f32> = (0..rows * out)
        .map(|_| rng.float_between(lo, hi) as f32)
        .collect();
    set_var(&varmap, "fc.weight", &w, &[out, inp]);
    set_var(&varmap, "fc.bias", &b, &[out]);
    let mut xshape = lead.to_vec();
    xshape.push(inp);
    let mut yshape = lead.to_vec();
    yshape.push(out);
    let xv = Var::from_tensor(&Tensor::from_vec(x.clone(), xshape, &Device::Cpu).unwrap()).unwrap();
    let y = layer.forward(xv.as_tensor()).expect("forward");
    let gt = Tensor::from_vec(g.clone(), yshape, &Device::Cpu).unwrap();
    let grads = (&y * &gt)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .expect("backward");
    let var = |name: &str| {
        let data = varmap.data().lock().unwrap();
        data.get(name).unwrap().as_tensor().clone()
    };
    let dw = f32s(grads.get(&var("fc.weight")).expect("dW"));
    let db = f32s(grads.get(&var("fc.bias")).expect("db"));
    let dx = f32s(grads.get(xv.as_tensor()).expect("dX"));

    // The reference: weights rounded to the weight format, then each GEMM's operands to its.
    let wq: Vec<f64> = w
        .iter()
        .map(|&v| f.round(v as f64, qcandle::Rounding::NearestEven, 0))
        .collect();
    let bq: Vec<f64> = b
        .iter()
        .map(|&v| f.round(v as f64, qcandle::Rounding::NearestEven, 0))
        .collect();
    let fwd = Arith::new(case.setting, f);
    let (err, grd) = (Arith::new(case.setting, f), Arith::new(case.setting, f));
    let op = |a: &Arith, v: f64| a.operand(v as f32);
    let mut want_y = vec![0f32; rows * out];
    for r in 0..rows {
        for o in 0..out {
            let terms: Vec<(f64, f64)> = (0..inp)
                .map(|t| (fwd.operand(x[r * inp + t]), op(&fwd, wq[o * inp + t])))
                .collect();
            let v = fwd.dot(&terms, Some(op(&fwd, bq[o])));
            // The activation quantizer after the GEMM.
            want_y[r * out + o] =
                f.round(v as f32 as f64, qcandle::Rounding::NearestEven, 0) as f32;
        }
    }
    // The error quantizer rounds the incoming gradient.
    let dy: Vec<f32> = g
        .iter()
        .map(|&v| f.round(v as f64, qcandle::Rounding::NearestEven, 0) as f32)
        .collect();
    let mut want_dx = vec![0f32; rows * inp];
    for r in 0..rows {
        for t in 0..inp {
            let terms: Vec<(f64, f64)> = (0..out)
                .map(|o| (err.operand(dy[r * out + o]), op(&err, wq[o * inp + t])))
                .collect();
            want_dx[r * inp + t] = as_grad(err.dot(&terms, None) as f32);
        }
    }
    let mut want_dw = vec![0f32; out * inp];
    let mut want_db = vec![0f32; out];
    for o in 0..out {
        for t in 0..inp {
            let terms: Vec<(f64, f64)> = (0..rows)
                .map(|r| (grd.operand(dy[r * out + o]), grd.operand(x[r * inp + t])))
                .collect();
            want_dw[o * inp + t] = as_grad(grd.dot(&terms, None) as f32);
        }
        let terms: Vec<(f64, f64)> = (0..rows)
            .map(|r| (grd.operand(dy[r * out + o]), 1.0))
            .collect();
        want_db[o] = as_grad(grd.dot(&terms, None) as f32);
    }
    let mut m = Mismatches::default();
    let what = format!(
        "{} {} linear {lead:?}x{inp}->{out}",
        case.format, case.setting
    );
    compare(&mut m, &format!("{what} y"), &f32s(&y), &want_y);
    compare(&mut m, &format!("{what} dX"), &dx, &want_dx);
    compare(&mut m, &format!("{what} dW"), &dw, &want_dw);
    compare(&mut m, &format!("{what} db"), &db, &want_db);
    m
}

#[test]
fn linear_layers_equal_the_reference_in_every_rule() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (i, case) in CASES.iter().enumerate() {
        for (lead, inp, out) in [
            (vec![3], 7, 5),
            (vec![2, 3], 7, 5),
            (vec![1], 1, 1),
            (vec![4], 33, 2),
        ] {
            let r = check_linear(case, &lead, inp, out, 1 + i as u64);
            checked += 1;
            m = m.merge(r);
        }
    }
    m.assert_none_of("linear layers", checked);
}

/// The op without a bias (`QLinear` always has one).
#[test]
fn linear_op_without_bias_equals_the_reference() {
    let mut m = Mismatches::default();
    for case in CASES {
        let f = fmt(case.format);
        let setting: Accumulate = case.setting.parse().expect("setting");
        let arith = LayerArith::new(&setting, Some(f), Some(f), Some(f))
            .expect("rules")
            .expect("not f32");
        let mut rng = SplitMix(99);
        let (rows, inp, out) = (3, 7, 5);
        let x = random_values(&mut rng, rows * inp, case.lo, case.hi);
        let w = random_values(&mut rng, out * inp, case.lo, case.hi);
        let xt = Tensor::from_vec(x.clone(), (rows, inp), &Device::Cpu).unwrap();
        let wt = Tensor::from_vec(w.clone(), (out, inp), &Device::Cpu).unwrap();
        let y = f32s(&rule_linear(&xt, &wt, None, &arith).expect("op"));
        let a = Arith::new(case.setting, f);
        let mut want = vec![0f32; rows * out];
        for r in 0..rows {
            for o in 0..out {
                let terms: Vec<(f64, f64)> = (0..inp)
                    .map(|t| (a.operand(x[r * inp + t]), a.operand(w[o * inp + t])))
                    .collect();
                want[r * out + o] = a.dot(&terms, None) as f32;
            }
        }
        compare(
            &mut m,
            &format!("{} {} no bias", case.format, case.setting),
            &y,
            &want,
        );
    }
    m.assert_none("linear op without bias");
}

/// Geometry of a convolution case.
struct Conv {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oc: usize,
    k: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
}

/// `QConv2d` with `setting`: output and the three gradients against the direct loops.
fn check_conv(case: &Case, g: &Conv, seed: u64) -> Mismatches {
    let f = fmt(case.format);
    let cfg = config(case.format, case.setting);
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let conv = Conv2dConfig {
        padding: g.padding,
        stride: g.stride,
        dilation: g.dilation,
        groups: 1,
        cudnn_fwd_algo: None,
    };
    let layer = QConv2d::new(g.c, g.oc, g.k, conv, vb.pp("conv"), &cfg).expect("layer");
    let mut rng = SplitMix(seed);
    let (lo, hi) = (case.lo, case.hi);
    let (n, c, h, wd, oc, k) = (g.n, g.c, g.h, g.w, g.oc, g.k);
    let (s, p, d) = (g.stride, g.padding, g.dilation);
    let oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
    let ow = (wd + 2 * p - d * (k - 1) - 1) / s + 1;
    let w = random_values(&mut rng, oc * c * k * k, lo, hi);
    let b = random_values(&mut rng, oc, lo, hi);
    let x = random_values(&mut rng, n * c * h * wd, lo, hi);
    let gy: Vec<f32> = (0..n * oc * oh * ow)
        .map(|_| rng.float_between(lo, hi) as f32)
        .collect();
    set_var(&varmap, "conv.weight", &w, &[oc, c, k, k]);
    set_var(&varmap, "conv.bias", &b, &[oc]);
    let xv = Var::from_tensor(&Tensor::from_vec(x.clone(), (n, c, h, wd), &Device::Cpu).unwrap())
        .unwrap();
    let y = layer.forward(xv.as_tensor()).expect("forward");
    assert_eq!(y.dims(), [n, oc, oh, ow]);
    let gt = Tensor::from_vec(gy.clone(), (n, oc, oh, ow), &Device::Cpu).unwrap();
    let grads = (&y * &gt)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .expect("backward");
    let var = |name: &str| {
        let data = varmap.data().lock().unwrap();
        data.get(name).unwrap().as_tensor().clone()
    };
    let dw = f32s(grads.get(&var("conv.weight")).expect("dW"));
    let db = f32s(grads.get(&var("conv.bias")).expect("db"));
    let dx = f32s(grads.get(xv.as_tensor()).expect("dX"));

    let rnd = |v: f32| f.round(v as f64, qcandle::Rounding::NearestEven, 0);
    let wq: Vec<f64> = w.iter().map(|&v| rnd(v)).collect();
    let bq: Vec<f64> = b.iter().map(|&v| rnd(v)).collect();
    let dy: Vec<f32> = gy.iter().map(|&v| rnd(v) as f32).collect();
    let a = Arith::new(case.setting, f);
    let wi = |o: usize, ch: usize, i: usize, j: usize| ((o * c + ch) * k + i) * k + j;
    let xi = |b: usize, ch: usize, y: usize, x: usize| ((b * c + ch) * h + y) * wd + x;
    let yi = |b: usize, o: usize, y: usize, x: usize| ((b * oc + o) * oh + y) * ow + x;
    // The input pixel a tap reads (None: padding).
    let at = |o: usize, t: usize, size: usize| -> Option<usize> {
        (o * s + t * d).checked_sub(p).filter(|&v| v < size)
    };
    let mut want_y = vec![0f32; n * oc * oh * ow];
    for bn in 0..n {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut terms = Vec::new();
                    for ch in 0..c {
                        for i in 0..k {
                            for j in 0..k {
                                let xval = match (at(oy, i, h), at(ox, j, wd)) {
                                    (Some(yy), Some(xx)) => a.operand(x[xi(bn, ch, yy, xx)]),
                                    _ => 0.0,
                                };
                                terms.push((a.operand(wq[wi(o, ch, i, j)] as f32), xval));
                            }
                        }
                    }
                    let v = a.dot(&terms, Some(a.operand(bq[o] as f32)));
                    want_y[yi(bn, o, oy, ox)] = rnd(v as f32) as f32;
                }
            }
        }
    }
    let mut want_dw = vec![0f32; oc * c * k * k];
    let mut want_db = vec![0f32; oc];
    for o in 0..oc {
        for ch in 0..c {
            for i in 0..k {
                for j in 0..k {
                    let mut terms = Vec::new();
                    for bn in 0..n {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let xval = match (at(oy, i, h), at(ox, j, wd)) {
                                    (Some(yy), Some(xx)) => a.operand(x[xi(bn, ch, yy, xx)]),
                                    _ => 0.0,
                                };
                                terms.push((a.operand(dy[yi(bn, o, oy, ox)]), xval));
                            }
                        }
                    }
                    want_dw[wi(o, ch, i, j)] = as_grad(a.dot(&terms, None) as f32);
                }
            }
        }
        let mut terms = Vec::new();
        for bn in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    terms.push((a.operand(dy[yi(bn, o, oy, ox)]), 1.0));
                }
            }
        }
        want_db[o] = as_grad(a.dot(&terms, None) as f32);
    }
    // The output pixel that reads input coordinate `v` through tap `t`, if any.
    let from = |v: usize, t: usize, size: usize| -> Option<usize> {
        let u = (v + p).checked_sub(t * d)?;
        (u % s == 0 && u / s < size).then_some(u / s)
    };
    let mut want_dx = vec![0f32; n * c * h * wd];
    for bn in 0..n {
        for ch in 0..c {
            for yy in 0..h {
                for xx in 0..wd {
                    let mut terms = Vec::new();
                    for o in 0..oc {
                        for i in 0..k {
                            for j in 0..k {
                                let e = match (from(yy, i, oh), from(xx, j, ow)) {
                                    (Some(oy), Some(ox)) => a.operand(dy[yi(bn, o, oy, ox)]),
                                    _ => 0.0,
                                };
                                terms.push((a.operand(wq[wi(o, ch, i, j)] as f32), e));
                            }
                        }
                    }
                    want_dx[xi(bn, ch, yy, xx)] = as_grad(a.dot(&terms, None) as f32);
                }
            }
        }
    }
    let mut m = Mismatches::default();
    let what = format!(
        "{} {} conv {n}x{c}x{h}x{wd} k{k} s{s} p{p} d{d} -> {oc}",
        case.format, case.setting
    );
    compare(&mut m, &format!("{what} y"), &f32s(&y), &want_y);
    compare(&mut m, &format!("{what} dX"), &dx, &want_dx);
    compare(&mut m, &format!("{what} dW"), &dw, &want_dw);
    compare(&mut m, &format!("{what} db"), &db, &want_db);
    m
}

#[test]
fn conv_layers_equal_the_reference_in_every_rule() {
    let geoms = [
        Conv {
            n: 2,
            c: 3,
            h: 7,
            w: 6,
            oc: 4,
            k: 3,
            stride: 2,
            padding: 1,
            dilation: 1,
        },
        Conv {
            n: 3,
            c: 2,
            h: 6,
            w: 7,
            oc: 3,
            k: 2,
            stride: 1,
            padding: 0,
            dilation: 2,
        },
        Conv {
            n: 1,
            c: 1,
            h: 5,
            w: 5,
            oc: 2,
            k: 3,
            stride: 3,
            padding: 2,
            dilation: 1,
        },
        // Unit stride with padding (the input gradient's run copies, clipped both sides).
        Conv {
            n: 2,
            c: 2,
            h: 6,
            w: 5,
            oc: 3,
            k: 3,
            stride: 1,
            padding: 2,
            dilation: 1,
        },
        Conv {
            n: 1,
            c: 2,
            h: 5,
            w: 7,
            oc: 2,
            k: 3,
            stride: 1,
            padding: 1,
            dilation: 2,
        },
    ];
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (i, case) in CASES.iter().enumerate() {
        for (gi, g) in geoms.iter().enumerate() {
            m = m.merge(check_conv(case, g, 100 + (i * 3 + gi) as u64));
            checked += 1;
        }
    }
    m.assert_none_of("conv layers", checked);
}

/// `QMatMul` with `setting`: the product and the gradients of `sum(y · g)` w.r.t. both
/// operands against the reference; `lead` are the batch dimensions. With `b_transposed` the
/// right operand is handed over as the transpose of a `(.., n, k)` variable (as attention
/// hands over `kᵀ`).
fn check_matmul(
    case: &Case,
    lead: &[usize],
    (m, k, n): (usize, usize, usize),
    b_transposed: bool,
    seed: u64,
) -> Mismatches {
    check_matmul_in(case, case.format, lead, (m, k, n), b_transposed, seed)
}

/// [`check_matmul`] with the error category in `error` (the activation category in the
/// case's format).
fn check_matmul_in(
    case: &Case,
    error: &str,
    lead: &[usize],
    (m, k, n): (usize, usize, usize),
    b_transposed: bool,
    seed: u64,
) -> Mismatches {
    let f = fmt(case.format);
    let fe = fmt(error);
    let cfg = QConfig::from_toml(&format!(
        "activation = \"{}\"\nerror = \"{error}\"\naccumulate = \"{}\"\n",
        case.format, case.setting
    ))
    .expect("the config parses");
    let op = QMatMul::new("attn", &cfg).expect("op");
    let mut rng = SplitMix(seed);
    let batch: usize = lead.iter().product();
    let (lo, hi) = (case.lo, case.hi);
    let a = random_values(&mut rng, batch * m * k, lo, hi);
    let b = random_values(&mut rng, batch * k * n, lo, hi);
    let g: Vec<f32> = (0..batch * m * n)
        .map(|_| rng.float_between(lo, hi) as f32)
        .collect();
    let shape = |r: usize, c: usize| {
        let mut s = lead.to_vec();
        s.extend([r, c]);
        s
    };
    let av =
        Var::from_tensor(&Tensor::from_vec(a.clone(), shape(m, k), &Device::Cpu).unwrap()).unwrap();
    // The variable holds `b` as stored (`k x n` per batch element) or its transpose.
    let bv = if b_transposed {
        let bt: Vec<f32> = (0..batch * n * k)
            .map(|i| {
                let (bi, r) = (i / (n * k), i % (n * k));
                b[bi * k * n + (r % k) * n + r / k]
            })
            .collect();
        Var::from_tensor(&Tensor::from_vec(bt, shape(n, k), &Device::Cpu).unwrap()).unwrap()
    } else {
        Var::from_tensor(&Tensor::from_vec(b.clone(), shape(k, n), &Device::Cpu).unwrap()).unwrap()
    };
    let rank = lead.len() + 2;
    let b_in = if b_transposed {
        bv.as_tensor().transpose(rank - 2, rank - 1).unwrap()
    } else {
        bv.as_tensor().clone()
    };
    let y = op.forward(av.as_tensor(), &b_in).expect("forward");
    assert_eq!(y.dims(), shape(m, n).as_slice());
    let gt = Tensor::from_vec(g.clone(), shape(m, n), &Device::Cpu).unwrap();
    let grads = (&y * &gt)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .expect("backward");
    let da = f32s(grads.get(av.as_tensor()).expect("dA"));
    let db_stored = f32s(grads.get(bv.as_tensor()).expect("dB"));

    // The reference: the operands rounded by the activation quantizer, the products by the
    // rule, the output by the activation quantizer again; the incoming gradient rounded by
    // the error quantizer, both gradient products by the rule (error format), and each
    // gradient rounded by its operand's error quantizer.
    let q = |v: f64| f.round(v, qcandle::Rounding::NearestEven, 0);
    let qe = |v: f64| fe.round(v, qcandle::Rounding::NearestEven, 0);
    let aq: Vec<f64> = a.iter().map(|&v| q(v as f64)).collect();
    let bq: Vec<f64> = b.iter().map(|&v| q(v as f64)).collect();
    let dy: Vec<f64> = g.iter().map(|&v| qe(v as f64)).collect();
    let fwd = Arith::new(case.setting, f);
    let err = Arith::new(case.setting, fe);
    let op_of = |r: &Arith, v: f64| r.operand(v as f32);
    let mut want_y = vec![0f32; batch * m * n];
    let mut want_da = vec![0f32; batch * m * k];
    let mut want_db = vec![0f32; batch * k * n];
    for bi in 0..batch {
        let (ao, bo, yo) = (bi * m * k, bi * k * n, bi * m * n);
        for i in 0..m {
            for j in 0..n {
                let terms: Vec<(f64, f64)> = (0..k)
                    .map(|t| {
                        (
                            op_of(&fwd, aq[ao + i * k + t]),
                            op_of(&fwd, bq[bo + t * n + j]),
                        )
                    })
                    .collect();
                want_y[yo + i * n + j] = q(fwd.dot(&terms, None) as f32 as f64) as f32;
            }
        }
        for i in 0..m {
            for t in 0..k {
                let terms: Vec<(f64, f64)> = (0..n)
                    .map(|j| {
                        (
                            op_of(&err, dy[yo + i * n + j]),
                            op_of(&err, bq[bo + t * n + j]),
                        )
                    })
                    .collect();
                want_da[ao + i * k + t] = as_grad(qe(err.dot(&terms, None) as f32 as f64) as f32);
            }
        }
        for t in 0..k {
            for j in 0..n {
                let terms: Vec<(f64, f64)> = (0..m)
                    .map(|i| {
                        (
                            op_of(&err, aq[ao + i * k + t]),
                            op_of(&err, dy[yo + i * n + j]),
                        )
                    })
                    .collect();
                want_db[bo + t * n + j] = as_grad(qe(err.dot(&terms, None) as f32 as f64) as f32);
            }
        }
    }
    // The gradient of a transposed variable, back in `k x n` order.
    let db: Vec<f32> = if b_transposed {
        (0..batch * k * n)
            .map(|i| {
                let (bi, r) = (i / (k * n), i % (k * n));
                db_stored[bi * n * k + (r % n) * k + r / n]
            })
            .collect()
    } else {
        db_stored
    };
    let mut mm = Mismatches::default();
    let what = format!(
        "{} (errors {error}) {} matmul {lead:?}x{m}x{k}x{n}{}",
        case.format,
        case.setting,
        if b_transposed { " (bᵀ)" } else { "" }
    );
    compare(&mut mm, &format!("{what} y"), &f32s(&y), &want_y);
    compare(&mut mm, &format!("{what} dA"), &da, &want_da);
    compare(&mut mm, &format!("{what} dB"), &db, &want_db);
    mm
}

#[test]
fn attention_matmuls_equal_the_reference_in_every_rule() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (i, case) in CASES.iter().enumerate() {
        for (lead, dims, transposed) in [
            (vec![3], (3, 5, 2), false),
            (vec![2, 3], (4, 7, 3), true),
            (vec![1], (1, 1, 1), false),
            (vec![2, 1, 2], (2, 33, 5), true),
            (vec![4], (5, 2, 6), false),
        ] {
            let r = check_matmul(case, &lead, dims, transposed, 100 + i as u64);
            checked += 1;
            m = m.merge(r);
        }
    }
    m.assert_none_of("attention matmuls", checked);
}

/// The product computes in the activation format and both gradients in the error format:
/// with the two formats apart, a rule taken from the wrong one shows.
#[test]
fn attention_matmul_gradients_compute_in_the_error_format() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (format, setting, error) in [
        ("posit<16,1>", "naive", "posit<8,0>"),
        ("posit<16,1>", "quire", "posit<8,2>"),
        ("e4m3", "fma:fp32", "e5m2"),
        ("bf16", "naive", "fp16"),
    ] {
        let case = Case {
            format,
            setting,
            lo: -6,
            hi: 2,
        };
        for (lead, dims, transposed) in [(vec![2, 3], (4, 7, 3), true), (vec![3], (3, 9, 2), false)]
        {
            m = m.merge(check_matmul_in(
                &case,
                error,
                &lead,
                dims,
                transposed,
                7 + checked,
            ));
            checked += 1;
        }
    }
    m.assert_none_of("attention matmuls with their own error format", checked);
}

/// The matmul's rules come from its own `[[layer]]` entry: a pattern naming the products
/// gives them the rule, other products keep f32 sums, and a setting the formats cannot take
/// is refused when the product is built, naming it.
#[test]
fn layer_patterns_reach_the_attention_matmuls() {
    let base = "activation = \"posit<8,0>\"\nerror = \"posit<8,0>\"\n";
    let patterned = QConfig::from_toml(&format!(
        "{base}[[layer]]\npattern = \"*.scores\"\naccumulate = \"naive\"\n"
    ))
    .expect("config");
    let global = QConfig::from_toml(&format!("{base}accumulate = \"naive\"\n")).expect("config");
    let mut rng = SplitMix(7);
    let a = Tensor::from_vec(
        random_values(&mut rng, 2 * 3 * 40, -4, 2),
        (2, 3, 40),
        &Device::Cpu,
    )
    .unwrap();
    let b = Tensor::from_vec(
        random_values(&mut rng, 2 * 40 * 4, -4, 2),
        (2, 40, 4),
        &Device::Cpu,
    )
    .unwrap();
    let run = |name: &str, cfg: &QConfig| {
        f32s(&QMatMul::new(name, cfg).unwrap().forward(&a, &b).unwrap())
    };
    let naive = run("x", &global);
    assert_eq!(run("block0.scores", &patterned), naive);
    assert_ne!(
        run("block0.mix", &patterned),
        naive,
        "f32 sums do not round each partial sum"
    );

    let float = QConfig::from_toml(
        "activation = \"e4m3\"\nerror = \"e4m3\"\n[[layer]]\npattern = \"*.mix\"\naccumulate = \"quire\"\n",
    )
    .expect("config");
    assert!(QMatMul::new("block0.scores", &float).is_ok());
    let e = QMatMul::new("block0.mix", &float).unwrap_err().to_string();
    assert!(
        e.contains("block0.mix") && e.contains("quire needs a posit"),
        "{e}"
    );
    let no_error = QConfig::from_toml("activation = \"posit<16,1>\"\naccumulate = \"naive\"\n")
        .expect("config");
    let e = QMatMul::new("attn", &no_error).unwrap_err().to_string();
    assert!(e.contains("needs an error format"), "{e}");
}
