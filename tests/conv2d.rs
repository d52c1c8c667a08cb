//! Tests of `qcandle::ops::conv2d` and `qcandle::ops::max_pool2d` on `Device::Cpu`.
//!
//! Testing policy: candle's own `Tensor::conv2d` / `max_pool2d_with_stride` and their
//! backward passes are the reference for values and gradients (compared with a tolerance of
//! 1e-5 relative to the largest reference magnitude, since summation orders differ), finite
//! differences check the gradients independently of candle, and a direct loop is the
//! reference where candle has no backward (overlapping pooling windows). Bad shapes must be
//! errors, never panics. Every test can fail.

/// The tool's CPU thread settings (applied once, before a test's first candle op), so that
/// the tests run as the tool does.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Conv2dConfig;
use qcandle::ops::{conv2d, conv2d_relu, max_pool2d};

type Result<T> = anyhow::Result<T>;

const CPU: Device = Device::Cpu;

/// Deterministic values in [-1, 1).
fn rand_vec(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn rand(dims: &[usize], seed: u64) -> Result<Tensor> {
    threads::tune_cpu_threads();
    let n = dims.iter().product();
    Ok(Tensor::from_vec(rand_vec(n, seed), dims, &CPU)?)
}

fn cfg(padding: usize, stride: usize, dilation: usize) -> Conv2dConfig {
    Conv2dConfig {
        padding,
        stride,
        dilation,
        groups: 1,
        cudnn_fwd_algo: None,
    }
}

/// `max |a - b| <= tol * max |b|` (and equal shapes).
fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) -> Result<()> {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes differ");
    let a = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    let err = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max abs error {err:e} exceeds {tol:e} x {scale:e}"
    );
    Ok(())
}

/// candle's convolution plus a broadcast bias: the reference.
fn candle_conv(x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2dConfig) -> Result<Tensor> {
    let y = x.conv2d(w, c.padding, c.stride, c.dilation, c.groups)?;
    Ok(match b {
        Some(b) => y.broadcast_add(&b.reshape((1, b.dim(0)?, 1, 1))?)?,
        None => y,
    })
}

/// (N, C, H, W, OC, KH, KW, padding, stride, dilation, bias)
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    bool,
);

const CASES: &[Case] = &[
    (4, 1, 32, 32, 6, 5, 5, 0, 1, 1, true),  // LeNet conv1
    (3, 6, 14, 14, 16, 5, 5, 0, 1, 1, true), // LeNet conv2
    (1, 3, 9, 7, 5, 3, 3, 1, 1, 1, true),    // batch 1, odd sizes, padding
    (2, 4, 11, 13, 3, 3, 2, 0, 2, 1, false), // stride 2, odd, rectangular kernel
    (3, 2, 10, 9, 4, 3, 3, 2, 2, 1, true),   // stride 2 with padding
    (2, 3, 12, 11, 2, 3, 3, 1, 1, 2, true),  // dilation 2
    (5, 2, 8, 8, 3, 2, 3, 3, 3, 2, false),   // everything at once, padding > kernel
    (1, 1, 5, 5, 1, 5, 5, 0, 1, 1, true),    // kernel covers the image: 1x1 output
    (2, 17, 6, 5, 9, 1, 1, 0, 1, 1, true),   // 1x1 kernel, many channels
];

/// `[y, dx, dw, db]` of `sum(conv(x, w, b) * r)`; db is a zero scalar without a bias.
type Results = [Tensor; 4];

fn grad(g: &candle_core::backprop::GradStore, t: &Tensor) -> Result<Tensor> {
    Ok(g.get(t)
        .ok_or_else(|| anyhow::anyhow!("missing gradient"))?
        .clone())
}

/// The results of `conv` (ours or candle's) with every argument a variable.
fn run(
    conv: impl Fn(&Tensor, &Tensor, Option<&Tensor>, &Conv2dConfig) -> Result<Tensor>,
    (x, w, b): (&Tensor, &Tensor, Option<&Tensor>),
    r: &Tensor,
    c: &Conv2dConfig,
) -> Result<Results> {
    let xv = Var::from_tensor(x)?;
    let wv = Var::from_tensor(w)?;
    let bv = b.map(Var::from_tensor).transpose()?;
    let y = conv(xv.as_tensor(), wv.as_tensor(), bv.as_deref(), c)?;
    let g = (&y * r)?.sum_all()?.backward()?;
    let db = match &bv {
        Some(b) => grad(&g, b)?,
        None => Tensor::zeros(1, DType::F32, &CPU)?,
    };
    Ok([y, grad(&g, &xv)?, grad(&g, &wv)?, db])
}

fn ours(x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2dConfig) -> Result<Tensor> {
    Ok(conv2d(x, w, b, c)?)
}

/// The results by direct loops in f64, from the definition of the convolution.
fn reference(
    (x, w, b): (&Tensor, &Tensor, Option<&Tensor>),
    r: &Tensor,
    c: &Conv2dConfig,
) -> Result<Results> {
    let (n, ci, h, wd) = x.dims4()?;
    let (oc, _, kh, kw) = w.dims4()?;
    let (oh, ow) = (r.dim(2)?, r.dim(3)?);
    let f = |t: &Tensor| -> Result<Vec<f64>> {
        Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
    };
    let (xs, ws, rs) = (f(x)?, f(w)?, f(r)?);
    let bs = match b {
        Some(b) => f(b)?,
        None => vec![0.0; oc],
    };
    let mut y = vec![0f64; n * oc * oh * ow];
    let (mut dx, mut dw, mut db) = (vec![0f64; xs.len()], vec![0f64; ws.len()], vec![0f64; oc]);
    for i in 0..n {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let yi = ((i * oc + o) * oh + oy) * ow + ox;
                    let mut acc = bs[o];
                    db[o] += rs[yi];
                    for ch in 0..ci {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let yy =
                                    (oy * c.stride + ki * c.dilation) as isize - c.padding as isize;
                                let xx =
                                    (ox * c.stride + kj * c.dilation) as isize - c.padding as isize;
                                if yy < 0 || xx < 0 || yy as usize >= h || xx as usize >= wd {
                                    continue;
                                }
                                let xi = ((i * ci + ch) * h + yy as usize) * wd + xx as usize;
                                let wi = ((o * ci + ch) * kh + ki) * kw + kj;
                                acc += xs[xi] * ws[wi];
                                dx[xi] += rs[yi] * ws[wi];
                                dw[wi] += rs[yi] * xs[xi];
                            }
                        }
                    }
                    y[yi] = acc;
                }
            }
        }
    }
    let t = |v: Vec<f64>, d: &[usize]| Tensor::from_vec(v, d, &CPU);
    let db = match b {
        Some(_) => t(db, &[oc])?,
        None => Tensor::zeros(1, DType::F64, &CPU)?,
    };
    Ok([t(y, r.dims())?, t(dx, x.dims())?, t(dw, w.dims())?, db])
}

fn case_args(i: usize, case: &Case) -> Result<(Tensor, Tensor, Option<Tensor>, Conv2dConfig)> {
    let &(n, c, h, w, oc, kh, kw, p, s, d, bias) = case;
    let seed = i as u64 * 10;
    let b = bias.then(|| rand(&[oc], seed + 3)).transpose()?;
    Ok((
        rand(&[n, c, h, w], seed + 1)?,
        rand(&[oc, c, kh, kw], seed + 2)?,
        b,
        cfg(p, s, d),
    ))
}

fn check(ours: &Results, want: &Results, what: &str) -> Result<()> {
    for ((a, b), name) in ours.iter().zip(want).zip(["y", "dx", "dw", "db"]) {
        assert_close(a, b, 1e-5, &format!("{what} {name}"))?;
    }
    Ok(())
}

#[test]
fn forward_and_input_weight_bias_gradients_equal_a_direct_f64_loop() -> Result<()> {
    for (i, case) in CASES.iter().enumerate() {
        let (x, w, b, c) = case_args(i, case)?;
        let args = (&x, &w, b.as_ref());
        let y = conv2d(&x, &w, b.as_ref(), &c)?;
        let r = rand(y.dims(), i as u64 + 100)?;
        check(
            &run(ours, args, &r, &c)?,
            &reference(args, &r, &c)?,
            &format!("case {i}"),
        )?;
    }
    Ok(())
}

/// The fused ReLU equals our convolution followed by candle's ReLU, in value and in all
/// three gradients, on every case (ReLU kills roughly half of the outputs).
#[test]
fn fused_relu_equals_conv2d_then_relu_with_all_gradients() -> Result<()> {
    let relu_after = |x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2dConfig| {
        Ok(conv2d(x, w, b, c)?.relu()?)
    };
    let fused =
        |x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2dConfig| Ok(conv2d_relu(x, w, b, c)?);
    let (mut zeros, mut total) = (0, 0);
    for (i, case) in CASES.iter().enumerate() {
        let (x, w, b, c) = case_args(i, case)?;
        let args = (&x, &w, b.as_ref());
        let y = conv2d(&x, &w, b.as_ref(), &c)?;
        let r = rand(y.dims(), i as u64 + 200)?;
        let got = run(fused, args, &r, &c)?;
        check(&got, &run(relu_after, args, &r, &c)?, &format!("case {i}"))?;
        let y = got[0].flatten_all()?.to_vec1::<f32>()?;
        assert!(y.iter().all(|&v| v >= 0.0), "case {i}: negative output");
        zeros += y.iter().filter(|&&v| v == 0.0).count();
        total += y.len();
    }
    assert!(
        zeros > total / 4 && zeros < total * 3 / 4,
        "{zeros} of {total} zero"
    );
    Ok(())
}

/// candle's conv2d backward fails when the input-gradient sizes differ between height and
/// width (it derives the output padding of both from the height); those cases are checked
/// against the loop above only, and there must be few of them.
#[test]
fn forward_and_input_weight_bias_gradients_equal_candle_conv2d() -> Result<()> {
    let mut compared = 0;
    for (i, case) in CASES.iter().enumerate() {
        let (x, w, b, c) = case_args(i, case)?;
        let args = (&x, &w, b.as_ref());
        let y = conv2d(&x, &w, b.as_ref(), &c)?;
        let r = rand(y.dims(), i as u64 + 100)?;
        let Ok(theirs) = run(candle_conv, args, &r, &c) else {
            continue;
        };
        check(&run(ours, args, &r, &c)?, &theirs, &format!("case {i}"))?;
        compared += 1;
    }
    // Cases 3, 4 and 6 hit that candle limitation.
    assert!(
        compared + 3 >= CASES.len(),
        "candle compared on {compared} cases only"
    );
    Ok(())
}

#[test]
fn strided_input_views_give_the_values_and_gradients_of_candle_and_the_loop() -> Result<()> {
    // A transposed view (H and W swapped), a narrowed view (offset and row gaps) and a
    // channel-permuted view: none is contiguous.
    let base = rand(&[3, 4, 12, 10], 7)?;
    let views = [
        base.transpose(2, 3)?,
        base.narrow(2, 1, 9)?.narrow(3, 2, 7)?,
        base.permute((1, 0, 2, 3))?.narrow(1, 0, 3)?,
    ];
    for (i, x) in views.iter().enumerate() {
        assert!(!x.is_contiguous());
        let ch = x.dim(1)?;
        let w = rand(&[5, ch, 3, 3], 8 + i as u64)?.transpose(2, 3)?; // a strided weight too
        let b = rand(&[5], 9)?;
        let c = cfg(1, 2, 1);
        let args = (x, &w, Some(&b));
        let y = conv2d(x, &w, Some(&b), &c)?;
        let r = rand(y.dims(), 10)?;
        let got = run(ours, args, &r, &c)?;
        check(
            &got,
            &reference(args, &r, &c)?,
            &format!("view {i} vs loop"),
        )?;
        if let Ok(theirs) = run(candle_conv, args, &r, &c) {
            check(&got, &theirs, &format!("view {i} vs candle"))?;
        }
    }
    Ok(())
}

/// `sum(conv(x, w, b) * r)` in f64 from the f32 output.
fn loss(x: &Tensor, w: &Tensor, b: &Tensor, r: &[f64], c: &Conv2dConfig) -> Result<f64> {
    let y = conv2d(x, w, Some(b), c)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(y.iter().zip(r).map(|(&y, r)| y as f64 * r).sum())
}

#[test]
fn gradients_match_central_finite_differences() -> Result<()> {
    // The loss is linear in each argument, so a large step is exact up to f32 rounding.
    let c = cfg(1, 2, 2);
    let (x, w, b) = (
        rand(&[2, 3, 9, 8], 21)?,
        rand(&[4, 3, 3, 2], 22)?,
        rand(&[4], 23)?,
    );
    let (xv, wv, bv) = (
        Var::from_tensor(&x)?,
        Var::from_tensor(&w)?,
        Var::from_tensor(&b)?,
    );
    let y = conv2d(xv.as_tensor(), wv.as_tensor(), Some(bv.as_tensor()), &c)?;
    let r32 = rand(y.dims(), 24)?;
    let r: Vec<f64> = r32
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .map(|&v| v as f64)
        .collect();
    let grads = (&y * &r32)?.sum_all()?.backward()?;
    let h = 0.25f32;
    for (k, var) in [&xv, &wv, &bv].into_iter().enumerate() {
        let analytic = grads
            .get(var)
            .ok_or_else(|| anyhow::anyhow!("missing gradient"))?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let v0 = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        let dims = var.dims().to_vec();
        for j in 0..v0.len() {
            let shifted = |delta: f32| -> Result<f64> {
                let mut v = v0.clone();
                v[j] += delta;
                let t = Tensor::from_vec(v, dims.as_slice(), &CPU)?;
                let args = [&x, &w, &b].map(|a| a.clone());
                let mut args = args;
                args[k] = t;
                loss(&args[0], &args[1], &args[2], &r, &c)
            };
            let fd = (shifted(h)? - shifted(-h)?) / (2.0 * h as f64);
            let a = analytic[j] as f64;
            assert!(
                (fd - a).abs() <= 2e-4 * (1.0 + a.abs()),
                "argument {k} element {j}: analytic {a}, finite difference {fd}"
            );
        }
    }
    Ok(())
}

#[test]
fn input_gradient_is_skipped_for_a_plain_data_input() -> Result<()> {
    let x = rand(&[2, 1, 8, 8], 31)?; // a data batch: tracks no gradient
    let w = Var::from_tensor(&rand(&[3, 1, 3, 3], 32)?)?;
    let y = conv2d(&x, w.as_tensor(), None, &cfg(0, 1, 1))?;
    let grads = y.sum_all()?.backward()?;
    assert!(grads.get(&x).is_none(), "an input gradient was computed");
    assert!(grads.get(&w).is_some(), "the weight gradient is missing");
    Ok(())
}

#[test]
fn input_gradient_is_computed_for_a_variable_or_derived_input() -> Result<()> {
    let xv = Var::from_tensor(&rand(&[2, 2, 8, 8], 33)?)?;
    let w = Var::from_tensor(&rand(&[3, 2, 3, 3], 34)?)?;
    let hidden = xv.as_tensor().affine(2.0, 0.0)?; // an activation: tracks through an op
    for x in [xv.as_tensor().clone(), hidden] {
        let ours = conv2d(&x, w.as_tensor(), None, &cfg(1, 1, 1))?;
        let theirs = candle_conv(&x, w.as_tensor(), None, &cfg(1, 1, 1))?;
        let g_ours = ours.sum_all()?.backward()?;
        let g_theirs = theirs.sum_all()?.backward()?;
        let missing = || anyhow::anyhow!("missing input gradient");
        assert_close(
            g_ours.get(&xv).ok_or_else(missing)?,
            g_theirs.get(&xv).ok_or_else(missing)?,
            1e-5,
            "dx",
        )?;
    }
    Ok(())
}

#[test]
fn other_dtypes_and_grouped_convolutions_fall_back_to_candle() -> Result<()> {
    let x = rand(&[2, 4, 7, 7], 41)?;
    let w = rand(&[6, 2, 3, 3], 42)?;
    let b = rand(&[6], 43)?;
    let grouped = Conv2dConfig {
        groups: 2,
        ..cfg(1, 1, 1)
    };
    assert_close(
        &conv2d(&x, &w, Some(&b), &grouped)?,
        &candle_conv(&x, &w, Some(&b), &grouped)?,
        1e-6,
        "groups 2",
    )?;
    let w4 = rand(&[3, 4, 3, 3], 44)?;
    let b3 = rand(&[3], 45)?;
    let (x64, w64, b64) = (
        x.to_dtype(DType::F64)?,
        w4.to_dtype(DType::F64)?,
        b3.to_dtype(DType::F64)?,
    );
    let y = conv2d(&x64, &w64, Some(&b64), &cfg(0, 2, 1))?;
    assert_eq!(y.dtype(), DType::F64);
    assert_close(
        &y,
        &candle_conv(&x64, &w64, Some(&b64), &cfg(0, 2, 1))?,
        1e-12,
        "f64",
    )?;
    Ok(())
}

#[test]
fn bad_shapes_and_parameters_are_errors_not_panics() -> Result<()> {
    let x = rand(&[2, 3, 8, 8], 51)?;
    let w = rand(&[4, 3, 3, 3], 52)?;
    let c = cfg(0, 1, 1);
    let bad: Vec<(&str, candle_core::Result<Tensor>)> = vec![
        (
            "channel mismatch",
            conv2d(&x, &rand(&[4, 2, 3, 3], 53)?, None, &c),
        ),
        ("bias length", conv2d(&x, &w, Some(&rand(&[3], 54)?), &c)),
        ("bias rank", conv2d(&x, &w, Some(&rand(&[1, 4], 54)?), &c)),
        (
            "kernel too large",
            conv2d(&x, &rand(&[4, 3, 9, 3], 55)?, None, &c),
        ),
        (
            "dilated kernel too large",
            conv2d(&x, &w, None, &cfg(0, 1, 4)),
        ),
        ("stride 0", conv2d(&x, &w, None, &cfg(0, 0, 1))),
        ("dilation 0", conv2d(&x, &w, None, &cfg(0, 1, 0))),
        (
            "groups 0",
            conv2d(&x, &w, None, &Conv2dConfig { groups: 0, ..c }),
        ),
        ("3-d input", conv2d(&rand(&[3, 8, 8], 56)?, &w, None, &c)),
        ("3-d weight", conv2d(&x, &rand(&[4, 3, 3], 57)?, None, &c)),
        (
            "dtype mismatch",
            conv2d(&x, &w.to_dtype(DType::F64)?, None, &c),
        ),
        ("max-pool kernel 0", max_pool2d(&x, 0, 1)),
        ("max-pool stride 0", max_pool2d(&x, 2, 0)),
        ("max-pool kernel too large", max_pool2d(&x, 9, 1)),
        (
            "max-pool 3-d input",
            max_pool2d(&rand(&[3, 8, 8], 58)?, 2, 2),
        ),
    ];
    for (what, r) in bad {
        assert!(r.is_err(), "{what}: expected an error");
    }
    Ok(())
}

/// The max-pool input gradient by direct loops: each window's gradient goes to its first
/// maximum in row-major order.
fn pool_grad_reference(x: &Tensor, r: &Tensor, k: usize, s: usize) -> Result<Vec<f32>> {
    let (n, c, h, w) = x.dims4()?;
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let rs = r.flatten_all()?.to_vec1::<f32>()?;
    let (oh, ow) = ((h - k) / s + 1, (w - k) / s + 1);
    let mut want = vec![0f32; xs.len()];
    for plane in 0..n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = None::<(usize, f32)>;
                for i in 0..k {
                    for j in 0..k {
                        let at = plane * h * w + (oy * s + i) * w + ox * s + j;
                        if best.is_none_or(|(_, v)| xs[at] > v) {
                            best = Some((at, xs[at]));
                        }
                    }
                }
                if let Some((at, _)) = best {
                    want[at] += rs[(plane * oh + oy) * ow + ox];
                }
            }
        }
    }
    Ok(want)
}

/// The max-pool forward by direct loops: each window's first maximum in row-major order (a
/// later value wins only when strictly greater, so a NaN never replaces and a leading NaN
/// stays).
fn pool_reference(x: &Tensor, k: usize, s: usize) -> Result<Vec<f32>> {
    let (n, c, h, w) = x.dims4()?;
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let (oh, ow) = ((h - k) / s + 1, (w - k) / s + 1);
    let mut want = Vec::with_capacity(n * c * oh * ow);
    for plane in 0..n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = None::<f32>;
                for i in 0..k {
                    for j in 0..k {
                        let v = xs[plane * h * w + (oy * s + i) * w + ox * s + j];
                        if best.is_none_or(|b| v > b) {
                            best = Some(v);
                        }
                    }
                }
                want.push(best.expect("a non-empty window"));
            }
        }
    }
    Ok(want)
}

/// Windows full of ties and NaNs, on the 2x2/2 pairwise path (unit-stride rows) and the
/// general path (other windows, transposed views): forward and gradient follow the first
/// maximum.
#[test]
fn max_pool_ties_and_nans_follow_the_first_maximum() -> Result<()> {
    let levels = [-1.0, 0.0, 1.0, f32::NAN];
    for (i, &(dims, k, s)) in [([2, 3, 9, 10], 2, 2), ([2, 2, 9, 9], 3, 2)]
        .iter()
        .enumerate()
    {
        let len = dims.iter().product();
        let v: Vec<f32> = rand_vec(len, 90 + i as u64)
            .iter()
            .map(|r| levels[((r + 1.0) * 2.0) as usize % 4])
            .collect();
        let base = Tensor::from_vec(v, &dims, &CPU)?;
        for x in [
            base.clone(),
            base.transpose(2, 3)?,
            base.narrow(3, 1, dims[3] - 1)?,
        ] {
            let (y, dx, r) = pool_both(&x, k, s)?;
            let got = y.flatten_all()?.to_vec1::<f32>()?;
            let want = pool_reference(&x.contiguous()?, k, s)?;
            assert!(got.iter().any(|v| v.is_nan()), "the case has NaN windows");
            let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            assert!(
                got.iter().zip(&want).all(|(a, b)| same(a, b)),
                "forward {dims:?} k={k}"
            );
            assert_pool_gradient(&x, &dx, &r, k, s, &format!("{dims:?} k={k}"))?;
        }
    }
    Ok(())
}

/// The device path built from candle ops gives the forward values and gradients of the CPU
/// op (tie-free data: which of equal maxima it picks is the device's), on overlapping,
/// strided, odd-sized and non-contiguous inputs, and in f64.
#[test]
fn max_pool_by_gather_equals_the_cpu_op() -> Result<()> {
    use qcandle::ops::max_pool2d_by_gather;
    for (i, &(dims, k, s)) in [
        ([3, 4, 28, 28], 2, 2),
        ([2, 3, 9, 7], 2, 2),
        ([2, 3, 9, 8], 3, 2),
        ([1, 2, 7, 7], 3, 1),
        ([3, 1, 8, 11], 2, 3),
    ]
    .iter()
    .enumerate()
    {
        let base = rand(&dims, 120 + i as u64)?;
        for x in [base.clone(), base.transpose(2, 3)?] {
            let r = rand(max_pool2d(&x, k, s)?.dims(), 121)?;
            let grads = |pool: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
                         x: &Tensor|
             -> Result<(Vec<f32>, Vec<f32>)> {
                let v = Var::from_tensor(x)?;
                let y = pool(v.as_tensor())?;
                let g = (&y * &r.to_dtype(y.dtype())?)?.sum_all()?.backward()?;
                let dx = g
                    .get(&v)
                    .ok_or_else(|| anyhow::anyhow!("missing gradient"))?;
                let f = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
                Ok((f(&y)?, f(dx)?))
            };
            let want = grads(&|t| max_pool2d(t, k, s), &x)?;
            let got = grads(&|t| max_pool2d_by_gather(t, k, s), &x)?;
            assert_eq!(got, want, "{dims:?} k={k} s={s}");
            // f64 takes the gather path inside max_pool2d.
            let got64 = grads(&|t| max_pool2d(t, k, s), &x.to_dtype(DType::F64)?)?;
            assert_eq!(got64, want, "f64 {dims:?} k={k} s={s}");
        }
    }
    Ok(())
}

/// `dx`, the op's input gradient of `sum(max_pool(x) * r)`, equals the direct loop's.
fn assert_pool_gradient(
    x: &Tensor,
    dx: &Tensor,
    r: &Tensor,
    k: usize,
    s: usize,
    what: &str,
) -> Result<()> {
    let want = pool_grad_reference(&x.contiguous()?, r, k, s)?;
    assert_eq!(dx.flatten_all()?.to_vec1::<f32>()?, want, "backward {what}");
    Ok(())
}

/// Forward values and the input gradient of `sum(max_pool(x) * r)` for our op, with `r`.
fn pool_both(x: &Tensor, k: usize, s: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let xv = Var::from_tensor(x)?;
    let y = max_pool2d(xv.as_tensor(), k, s)?;
    let r = rand(y.dims(), 70)?;
    let g = (&y * &r)?.sum_all()?.backward()?;
    let dx = g
        .get(&xv)
        .ok_or_else(|| anyhow::anyhow!("missing gradient"))?
        .clone();
    Ok((y, dx, r))
}

/// The forward values equal candle's; the backward is checked against the direct loop, not
/// candle: candle 0.11.1's max-pool backward scales each gradient by 1/k^2 (it multiplies by
/// the window average of the max mask), is wrong when the size is not a multiple of the
/// window, and refuses overlapping windows.
#[test]
fn max_pool_backward_adds_each_window_gradient_at_its_first_maximum() -> Result<()> {
    for (i, &(dims, k, s)) in [
        ([4, 6, 28, 28], 2, 2),
        ([2, 3, 10, 8], 2, 2),
        ([2, 3, 9, 7], 2, 2),
        ([2, 3, 9, 8], 3, 2),
        ([1, 2, 7, 7], 3, 1),
        ([3, 1, 8, 11], 2, 3),
    ]
    .iter()
    .enumerate()
    {
        let base = rand(&dims, 80 + i as u64)?;
        let views = [
            base.clone(),
            base.narrow(3, 1, dims[3] - 1)?,
            base.transpose(2, 3)?,
        ];
        for x in views {
            let (y, dx, r) = pool_both(&x, k, s)?;
            assert_eq!(
                y.flatten_all()?.to_vec1::<f32>()?,
                x.max_pool2d_with_stride(k, s)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
                "forward {dims:?}"
            );
            assert_pool_gradient(&x, &dx, &r, k, s, &format!("{dims:?}"))?;
        }
    }
    Ok(())
}

#[test]
fn max_pool_gradient_matches_central_finite_differences() -> Result<()> {
    // Distinct values 1/len apart, so a step of a quarter of that moves no maximum.
    let dims = [2, 2, 7, 7];
    let len: usize = dims.iter().product();
    let keys = rand_vec(len, 90);
    let mut order: Vec<usize> = (0..len).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    let mut v0 = vec![0f32; len];
    for (rank, &at) in order.iter().enumerate() {
        v0[at] = rank as f32 / len as f32;
    }
    let x = Tensor::from_vec(v0.clone(), &dims, &CPU)?;
    let (k, s) = (3, 2);
    let (_, dx, r) = pool_both(&x, k, s)?;
    let dx = dx.flatten_all()?.to_vec1::<f32>()?;
    let r = r.flatten_all()?.to_vec1::<f32>()?;
    let loss = |v: Vec<f32>| -> Result<f64> {
        let y = max_pool2d(&Tensor::from_vec(v, &dims, &CPU)?, k, s)?;
        let y = y.flatten_all()?.to_vec1::<f32>()?;
        Ok(y.iter().zip(&r).map(|(&a, &b)| a as f64 * b as f64).sum())
    };
    let h = 0.25 / len as f32;
    for j in 0..len {
        let (mut up, mut down) = (v0.clone(), v0.clone());
        up[j] += h;
        down[j] -= h;
        let fd = (loss(up)? - loss(down)?) / (up_minus_down(&v0, j, h));
        assert!(
            (fd - dx[j] as f64).abs() <= 1e-3 * (1.0 + fd.abs()),
            "element {j}: analytic {}, finite difference {fd}",
            dx[j]
        );
    }
    Ok(())
}

/// The exact f32 distance between `v[j] + h` and `v[j] - h`.
fn up_minus_down(v: &[f32], j: usize, h: f32) -> f64 {
    (v[j] + h) as f64 - (v[j] - h) as f64
}

/// The gradients are sums over the batch; they are bit-identical on 1, 2 and 3 threads
/// (fixed partial sums added in order), so a training run does not depend on the machine's
/// core count.
#[test]
fn gradients_are_bit_identical_on_any_thread_count() -> Result<()> {
    let x = rand(&[40, 3, 11, 9], 71)?;
    let w = rand(&[5, 3, 3, 3], 72)?;
    let b = rand(&[5], 73)?;
    let c = cfg(1, 1, 1);
    let r = rand(&[40, 5, 11, 9], 74)?;
    let on = |threads: usize| -> Result<Vec<Vec<f32>>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        pool.install(|| {
            let got = run(ours, (&x, &w, Some(&b)), &r, &c)?;
            got.iter()
                .map(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
                .collect()
        })
    };
    let one = on(1)?;
    assert_eq!(one, on(2)?);
    assert_eq!(one, on(3)?);
    Ok(())
}

/// The quantizer fused into the op gives the bits of the convolution followed by a
/// separate `Quantizer` (values and all three gradients), with and without the ReLU, in
/// stochastic rounding, where the streams must also be drawn in the same order.
#[test]
fn fused_quantizer_equals_a_separate_quantizer_bit_for_bit() -> Result<()> {
    use qcandle::{Quant, Rounding};
    // Stochastic rounding and block formats round the whole output at once; elementwise
    // formats with deterministic rounding round each image (forward) and each chunk of the
    // masked gradient (backward) on their own.
    let settings = [
        ("posit<8,1>", "e5m2", Rounding::stochastic(12)?),
        ("posit<8,1>", "e5m2", Rounding::NearestEven),
        ("posit<16,1>", "posit<8,0>", Rounding::TowardZero),
        ("block<8>", "block<6>", Rounding::NearestEven),
    ];
    for (out_format, err_format, rounding) in settings {
        let quants = || -> Result<(Quant, Quant)> {
            let out = Quant::new(out_format.parse()?)
                .with_rounding(rounding)
                .with_seed(5);
            let err = Quant::new(err_format.parse()?)
                .with_rounding(rounding)
                .with_seed(6);
            Ok((out, err))
        };
        fused_equals_separate(&format!("{out_format}/{err_format} {rounding:?}"), quants)?;
    }
    Ok(())
}

fn fused_equals_separate(
    label: &str,
    quants: impl Fn() -> Result<(qcandle::Quant, qcandle::Quant)>,
) -> Result<()> {
    use candle_core::Module;
    use qcandle::ops::conv2d_quantized;
    use qcandle::Quantizer;
    for (i, case) in CASES.iter().enumerate() {
        let (x, w, b, c) = case_args(i, case)?;
        let args = (&x, &w, b.as_ref());
        let y = conv2d(&x, &w, b.as_ref(), &c)?;
        let r = rand(y.dims(), i as u64 + 300)?;
        for relu in [false, true] {
            let (o1, e1) = quants()?;
            let q1 = Quantizer::new(Some(o1), Some(e1));
            let fused = |x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2dConfig| {
                Ok(conv2d_quantized(x, w, b, c, relu, Some(&q1))?)
            };
            let (o2, e2) = quants()?;
            let q = Quantizer::new(Some(o2), Some(e2));
            let separate = |x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2dConfig| {
                let y = if relu {
                    conv2d_relu(x, w, b, c)?
                } else {
                    conv2d(x, w, b, c)?
                };
                Ok(q.forward(&y)?)
            };
            let got = run(fused, args, &r, &c)?;
            let want = run(separate, args, &r, &c)?;
            for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                let g = g.flatten_all()?.to_vec1::<f32>()?;
                let w = w.flatten_all()?.to_vec1::<f32>()?;
                let first = g
                    .iter()
                    .zip(&w)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    first.is_none() && g.len() == w.len(),
                    "{label}, case {i}, relu {relu}, result {t}: element {first:?} differs"
                );
            }
        }
    }
    Ok(())
}
