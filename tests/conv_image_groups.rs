//! How a rule convolution runs its GEMMs, checked bit for bit against the plain way:
//!
//! * images grouped into one GEMM (`qcandle::quire::image_gemm`): the output and the three
//!   gradients of `rule_conv2d_grouped` for 2, 3 and all images per GEMM, and of
//!   `rule_conv2d` (its own grouping), against one image per GEMM, for every kind of rule,
//!   on convolutions with stride, padding, dilation, non-square kernels, batch 1 and odd
//!   channel counts;
//! * the checked quire's input gradient through col2im (`conv_input_grad`) against a quire
//!   per input pixel summing the transposed convolution's terms, on values whose sums fall
//!   on rounding boundaries (so the exact fallback runs), zeros, and NaR operands;
//! * the checked quire's weight and bias gradients summed group by group
//!   (`conv_weight_grad`) against a quire per weight, on the same kinds of values;
//! * a NaN input pixel, for every kind of rule and each operand path (f32 column matrices
//!   for the register kernel, f64 for the others): NaN in exactly the outputs and weight
//!   gradients whose sums read it, a zero weight's term included.
//!
//! `tests/accumulate_layers.rs` checks the layers against scalar reference loops.

mod common;

use candle_core::{Device, Tensor, Var};
use candle_nn::Conv2dConfig;
use qcandle::backend::im2col::ConvGeom;
use qcandle::format::Format;
use qcandle::format::Posit;
use qcandle::quire::conv_input_grad::input_grad;
use qcandle::quire::conv_weight_grad::weight_grad;
use qcandle::quire::layer_conv::rule_conv2d_grouped;
use qcandle::quire::{rule_conv2d, Accumulate, LayerArith, Quire};

use common::{Mismatches, SplitMix};

/// A convolution's shape: batch, channels, image, output channels, kernel, stride,
/// padding, dilation.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oc: usize,
    kh: usize,
    kw: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
}

const SHAPES: &[Shape] = &[
    // LeNet-5's second convolution, smaller batch.
    Shape {
        n: 5,
        c: 6,
        h: 12,
        w: 12,
        oc: 16,
        kh: 5,
        kw: 5,
        stride: 1,
        padding: 0,
        dilation: 1,
    },
    // Batch 1, odd channel counts, padding.
    Shape {
        n: 1,
        c: 3,
        h: 7,
        w: 6,
        oc: 5,
        kh: 3,
        kw: 3,
        stride: 1,
        padding: 1,
        dilation: 1,
    },
    // Stride and padding, a non-square kernel.
    Shape {
        n: 4,
        c: 3,
        h: 9,
        w: 8,
        oc: 3,
        kh: 3,
        kw: 2,
        stride: 2,
        padding: 1,
        dilation: 1,
    },
    // Dilation, one input channel.
    Shape {
        n: 7,
        c: 1,
        h: 8,
        w: 9,
        oc: 2,
        kh: 2,
        kw: 3,
        stride: 1,
        padding: 2,
        dilation: 2,
    },
    // Stride 3 with gaps, one output channel.
    Shape {
        n: 3,
        c: 2,
        h: 10,
        w: 7,
        oc: 1,
        kh: 3,
        kw: 3,
        stride: 3,
        padding: 2,
        dilation: 1,
    },
];

/// `(format, setting)`: the checked f64 quire, the i16 quire, and a rule of each other kind.
const RULES: &[(&str, &str)] = &[
    ("posit<16,1>", "quire"),
    ("posit<8,0>", "quire"),
    ("posit<32,2>", "quire"),
    ("posit<16,1>", "naive"),
    ("e4m3", "naive:fp16"),
    ("bf16", "fma:fp32"),
    ("lns<16,8>", "lns:ideal"),
];

fn arith(format: &str, setting: &str) -> LayerArith {
    let f: Format = format.parse().expect("format");
    let s: Accumulate = setting.parse().expect("setting");
    LayerArith::new(&s, Some(f), Some(f), Some(f))
        .expect("rules")
        .expect("not f32")
}

fn random(rng: &mut SplitMix, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.float_between(-6, 3) as f32).collect()
}

fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// The output and `(dX, dW, db)` of `sum(conv(x, w) + b) · g)`, the per-image GEMMs
/// `group` images at a time (None: `rule_conv2d`'s own choice).
fn run(s: &Shape, arith: &LayerArith, group: Option<usize>, seed: u64) -> [Vec<u32>; 4] {
    run_with(s, arith, group, seed, None)
}

/// [`run`] with input element `pixel.0` set to `pixel.1` and the weight's first element
/// set to zero.
fn run_with(
    s: &Shape,
    arith: &LayerArith,
    group: Option<usize>,
    seed: u64,
    pixel: Option<(usize, f32)>,
) -> [Vec<u32>; 4] {
    let mut rng = SplitMix(seed);
    let oh = (s.h + 2 * s.padding - s.dilation * (s.kh - 1) - 1) / s.stride + 1;
    let ow = (s.w + 2 * s.padding - s.dilation * (s.kw - 1) - 1) / s.stride + 1;
    let dev = &Device::Cpu;
    let var = |v: Vec<f32>, shape: &[usize]| {
        Var::from_tensor(&Tensor::from_vec(v, shape, dev).unwrap()).unwrap()
    };
    let mut xv = random(&mut rng, s.n * s.c * s.h * s.w);
    let mut wv = random(&mut rng, s.oc * s.c * s.kh * s.kw);
    if let Some((i, v)) = pixel {
        xv[i] = v;
        wv[0] = 0.0;
    }
    let x = var(xv, &[s.n, s.c, s.h, s.w]);
    let w = var(wv, &[s.oc, s.c, s.kh, s.kw]);
    let b = var(random(&mut rng, s.oc), &[s.oc]);
    let g = Tensor::from_vec(
        random(&mut rng, s.n * s.oc * oh * ow),
        (s.n, s.oc, oh, ow),
        dev,
    )
    .unwrap();
    let cfg = Conv2dConfig {
        padding: s.padding,
        stride: s.stride,
        dilation: s.dilation,
        groups: 1,
        cudnn_fwd_algo: None,
    };
    let (xt, wt, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
    let y = match group {
        Some(images) => rule_conv2d_grouped(xt, wt, Some(bt), &cfg, arith, images),
        None => rule_conv2d(xt, wt, Some(bt), &cfg, arith),
    }
    .expect("forward");
    assert_eq!(y.dims(), [s.n, s.oc, oh, ow]);
    let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
    let grad = |t: &Tensor| bits(grads.get(t).expect("gradient"));
    [bits(&y), grad(xt), grad(wt), grad(bt)]
}

#[test]
fn grouped_image_gemms_equal_one_image_per_gemm() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (ri, &(format, setting)) in RULES.iter().enumerate() {
        let a = arith(format, setting);
        for (si, s) in SHAPES.iter().enumerate() {
            let seed = (ri * 31 + si) as u64;
            let want = run(s, &a, Some(1), seed);
            for group in [Some(2), Some(3), Some(s.n), None] {
                let got = run(s, &a, group, seed);
                for (what, (g, w)) in ["y", "dX", "dW", "db"].iter().zip(got.iter().zip(&want)) {
                    let bad = g.iter().zip(w).filter(|(g, w)| g != w).count();
                    m.check(bad == 0, || {
                        format!("{format} {setting} {s:?} group {group:?}: {what} differs in {bad} of {} elements", w.len())
                    });
                    checked += 1;
                }
            }
        }
    }
    m.assert_none_of("grouped convolution GEMMs", checked);
}

/// The output coordinate that reads input coordinate `v` through tap `t`, if any.
fn reader(s: &Shape, v: usize, t: usize, out: usize) -> Option<usize> {
    let u = (v + s.padding).checked_sub(t * s.dilation)?;
    (u % s.stride == 0 && u / s.stride < out).then_some(u / s.stride)
}

/// A NaN input pixel makes exactly the outputs and weight gradients whose sums read it NaN
/// (NaR in posits), a zero weight's term included (NaN · 0 is NaN), and leaves every other
/// output, the input gradient and the bias gradient as they are with a zero there.
#[test]
fn a_nan_input_pixel_reaches_exactly_the_sums_that_read_it() {
    let rules = [RULES, &[("e4m3", "naive"), ("posit<8,0>", "naive")]].concat();
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (ri, &(format, setting)) in rules.iter().enumerate() {
        let a = arith(format, setting);
        for (si, s) in SHAPES.iter().enumerate() {
            let oh = (s.h + 2 * s.padding - s.dilation * (s.kh - 1) - 1) / s.stride + 1;
            let ow = (s.w + 2 * s.padding - s.dilation * (s.kw - 1) - 1) / s.stride + 1;
            // A pixel of the last image and channel, inside the image.
            let (pn, pc, py, px) = (s.n - 1, s.c - 1, s.h / 2, s.w - 2);
            let at = ((pn * s.c + pc) * s.h + py) * s.w + px;
            let seed = (ri * 37 + si) as u64;
            let nan = run_with(s, &a, None, seed, Some((at, f32::NAN)));
            let zero = run_with(s, &a, None, seed, Some((at, 0.0)));
            let reads = |i: usize, j: usize, oy: usize, ox: usize| {
                reader(s, py, i, oh) == Some(oy) && reader(s, px, j, ow) == Some(ox)
            };
            let mut y_reads = vec![false; s.n * s.oc * oh * ow];
            let mut dw_reads = vec![false; s.oc * s.c * s.kh * s.kw];
            for o in 0..s.oc {
                for (i, j) in (0..s.kh).flat_map(|i| (0..s.kw).map(move |j| (i, j))) {
                    for (oy, ox) in (0..oh).flat_map(|oy| (0..ow).map(move |ox| (oy, ox))) {
                        if reads(i, j, oy, ox) {
                            y_reads[((pn * s.oc + o) * oh + oy) * ow + ox] = true;
                            dw_reads[((o * s.c + pc) * s.kh + i) * s.kw + j] = true;
                        }
                    }
                }
            }
            let none = vec![false; nan[1].len().max(nan[3].len())];
            for (what, idx, read) in [
                ("y", 0, &y_reads),
                ("dX", 1, &none),
                ("dW", 2, &dw_reads),
                ("db", 3, &none),
            ] {
                for (e, (&g, &z)) in nan[idx].iter().zip(&zero[idx]).enumerate() {
                    let ok = if read[e] {
                        f32::from_bits(g).is_nan()
                    } else {
                        g == z
                    };
                    m.check(ok, || {
                        format!(
                            "{format} {setting} {s:?}: {what}[{e}] = {:e} (reads the NaN: {})",
                            f32::from_bits(g),
                            read[e]
                        )
                    });
                    checked += 1;
                }
            }
        }
    }
    m.assert_none_of("outputs next to a NaN pixel", checked);
}

#[test]
fn grouping_zero_images_is_an_error() {
    let a = arith("posit<16,1>", "quire");
    let x = Tensor::zeros((1, 1, 4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::zeros((1, 1, 2, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
    let err = rule_conv2d_grouped(&x, &w, None, &Conv2dConfig::default(), &a, 0).unwrap_err();
    assert!(err.to_string().contains("at least one image"), "{err}");
}

/// `dX` of `w` and `dy` by a quire per input pixel over the terms `(o, i, j)`.
fn input_grad_reference(
    posit: Posit,
    w: &[f64],
    dy: &[f64],
    g: &ConvGeom,
    oc: usize,
    n: usize,
) -> Vec<f32> {
    let (c, h, wd) = (g.channels, g.height, g.width);
    let (kh, kw) = (g.kernel_h, g.kernel_w);
    let (s, d, p) = (g.stride, g.dilation, g.padding);
    let from = |v: usize, t: usize, size: usize| -> Option<usize> {
        let u = (v + p).checked_sub(t * d)?;
        (u % s == 0 && u / s < size).then_some(u / s)
    };
    let mut out = vec![0f32; n * c * h * wd];
    let mut q = Quire::new(posit).unwrap();
    for b in 0..n {
        for ch in 0..c {
            for y in 0..h {
                for x in 0..wd {
                    q.clear();
                    for o in 0..oc {
                        for i in 0..kh {
                            for j in 0..kw {
                                let e = match (from(y, i, g.out_h), from(x, j, g.out_w)) {
                                    (Some(oy), Some(ox)) => {
                                        dy[((b * oc + o) * g.out_h + oy) * g.out_w + ox]
                                    }
                                    _ => 0.0,
                                };
                                q.add_product(w[((o * c + ch) * kh + i) * kw + j], e);
                            }
                        }
                    }
                    out[((b * c + ch) * h + y) * wd + x] = q.to_posit() as f32;
                }
            }
        }
    }
    out
}

/// Operands of a checked-gradient test, both on posit<16,1>'s grid: `(p, q)` with `p` the
/// operand of the weights' role (the weights, or the input) and `q` the output gradient.
/// `kind` 0 and 3: random; 1 and 2: integers in `p` and half-integers in `q`, whose sums fall
/// in `[256, 1024)` where posit<16,1>'s spacing is 1 or 2, so many land on a rounding
/// boundary (the caller adds zeros for 2 and NaR operands for 3).
fn gradient_operands(
    posit: Posit,
    kind: usize,
    seed: u64,
    np: usize,
    nq: usize,
) -> (Vec<f64>, Vec<f64>) {
    let round = |v: f64| posit.round(v, qcandle::format::rounding::NearestEven, 0);
    let mut rng = SplitMix(seed);
    match kind {
        0 | 3 => (
            (0..np).map(|_| round(rng.float_between(-6, 3))).collect(),
            (0..nq).map(|_| round(rng.float_between(-6, 3))).collect(),
        ),
        _ => (
            (0..np).map(|_| (1 + rng.below(8)) as f64).collect(),
            (0..nq).map(|_| (16 + rng.below(48)) as f64 * 0.5).collect(),
        ),
    }
}

#[test]
fn checked_input_gradient_equals_a_quire_per_pixel() {
    let posit = Posit::new(16, 1).unwrap();
    let mut m = Mismatches::default();
    let mut fallbacks = 0;
    let mut checked = 0;
    for (si, s) in SHAPES.iter().enumerate() {
        let g = ConvGeom::new(
            (s.c, s.h, s.w),
            (s.kh, s.kw),
            s.stride,
            s.padding,
            s.dilation,
        )
        .unwrap();
        let (wn, dyn_) = (s.oc * g.rows(), s.n * s.oc * g.cols());
        for kind in 0..4 {
            // 0: random; 1: sums on rounding boundaries; 2: like 1 with zeros; 3: random
            // with NaR operands (`gradient_operands`).
            let seed = 1000 + (si * 4 + kind) as u64;
            let (mut w, mut dy) = gradient_operands(posit, kind, seed, wn, dyn_);
            if kind == 2 {
                for v in dy.iter_mut().step_by(3) {
                    *v = 0.0;
                }
                w[0] = 0.0;
            }
            if kind == 3 {
                dy[dyn_ / 2] = f64::NAN;
                w[wn - 1] = f64::INFINITY;
            }
            let (got, count) = input_grad(posit, &w, &dy, &g, s.oc);
            fallbacks += count;
            let want = input_grad_reference(posit, &w, &dy, &g, s.oc, s.n);
            assert_eq!(got.len(), want.len());
            for (e, (a, b)) in got.iter().zip(&want).enumerate() {
                let same = (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
                m.check(same, || {
                    format!("{s:?} kind {kind}: dX[{e}] = {a:e}, want {b:e}")
                });
                checked += 1;
            }
        }
    }
    m.assert_none_of("checked input gradient", checked);
    assert!(fallbacks > 0, "no sum reached the exact path");
}

/// `[dW | db]` (`OC x K+1`) of `x` and `dy` by a quire per output over the terms `(n, q)`.
fn weight_grad_reference(
    posit: Posit,
    x: &[f64],
    dy: &[f64],
    g: &ConvGeom,
    oc: usize,
    n: usize,
) -> Vec<f64> {
    let (c, h, wd) = (g.channels, g.height, g.width);
    let (kh, kw) = (g.kernel_h, g.kernel_w);
    let (s, d, p) = (g.stride, g.dilation, g.padding);
    let at = |o: usize, t: usize, size: usize| (o * s + t * d).checked_sub(p).filter(|&v| v < size);
    let rows = g.rows() + 1;
    let mut out = vec![0.0; oc * rows];
    let mut q = Quire::new(posit).unwrap();
    for o in 0..oc {
        for r in 0..rows {
            q.clear();
            for b in 0..n {
                for oy in 0..g.out_h {
                    for ox in 0..g.out_w {
                        let e = dy[((b * oc + o) * g.out_h + oy) * g.out_w + ox];
                        let v = if r == rows - 1 {
                            1.0
                        } else {
                            let (ch, i, j) = (r / (kh * kw), r / kw % kh, r % kw);
                            match (at(oy, i, h), at(ox, j, wd)) {
                                (Some(y), Some(xx)) => x[((b * c + ch) * h + y) * wd + xx],
                                _ => 0.0,
                            }
                        };
                        q.add_product(e, v);
                    }
                }
            }
            out[o * rows + r] = q.to_posit();
        }
    }
    out
}

#[test]
fn checked_weight_gradient_equals_a_quire_per_weight() {
    let posit = Posit::new(16, 1).unwrap();
    let mut m = Mismatches::default();
    let mut fallbacks = 0;
    let mut checked = 0;
    for (si, s) in SHAPES.iter().enumerate() {
        let g = ConvGeom::new(
            (s.c, s.h, s.w),
            (s.kh, s.kw),
            s.stride,
            s.padding,
            s.dilation,
        )
        .unwrap();
        let (xn, dyn_) = (s.n * g.image_len(), s.n * s.oc * g.cols());
        let rows = g.rows() + 1;
        for kind in 0..4 {
            // As for the input gradient (`gradient_operands`).
            let seed = 2000 + (si * 4 + kind) as u64;
            let (mut x, mut dy) = gradient_operands(posit, kind, seed, xn, dyn_);
            if kind == 2 {
                for v in x.iter_mut().step_by(3) {
                    *v = 0.0;
                }
                dy[0] = 0.0;
            }
            if kind == 3 {
                x[xn / 2] = f64::NAN;
                dy[dyn_ - 1] = f64::INFINITY;
            }
            for with in [(true, true), (true, false), (false, true)] {
                let (got, count) = weight_grad(posit, &x, &dy, &g, s.oc, with);
                fallbacks += count;
                let want = weight_grad_reference(posit, &x, &dy, &g, s.oc, s.n);
                // The reference's columns this call computes.
                let cols: Vec<usize> = (0..rows)
                    .filter(|&r| if r == rows - 1 { with.1 } else { with.0 })
                    .collect();
                assert_eq!(got.len(), s.oc * cols.len(), "{s:?} {with:?}");
                for o in 0..s.oc {
                    for (e, &r) in cols.iter().enumerate() {
                        let (a, b) = (got[o * cols.len() + e], want[o * rows + r]);
                        let same = (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
                        m.check(same, || {
                            format!("{s:?} kind {kind} {with:?}: out[{o}][{r}] = {a:e}, want {b:e}")
                        });
                        checked += 1;
                    }
                }
            }
        }
    }
    m.assert_none_of("checked weight gradient", checked);
    assert!(fallbacks > 0, "no sum reached the exact path");
}
