//! Low-precision optimizers: update rules against the formulas, agreement with candle's
//! own optimizers, and where each rounding lands.
//!
//! Update rules are checked against references written here from PyTorch's formulas in
//! f64 (one element at a time), on hand-picked gradients over 2–3 steps. Rounding is checked
//! with the scalar `Format::round` as the oracle: a value lies on a format's grid iff it
//! rounds to itself. Every test can fail.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer;
use qcandle::optim::{
    AdamParams, AdamWParams, LpAdam, LpAdamW, LpOptimizer, LpSgd, OptimLp, ParamQuant, SgdParams,
};
use qcandle::{Format, Quant, Rounding};

type Result<T> = anyhow::Result<T>;

const CPU: Device = Device::Cpu;
const NE: Rounding = Rounding::NearestEven;

fn var(v: &[f32]) -> Result<Var> {
    Ok(Var::new(v, &CPU)?)
}

fn q(format: &str) -> Quant {
    Quant::parse(format, "nearest-even").expect("test formats parse")
}

fn fmt(format: &str) -> Format {
    format.parse().expect("test formats parse")
}

fn vals(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// A gradient store holding `g` for each var.
fn grads(pairs: &[(&Var, &[f32])]) -> Result<GradStore> {
    let mut store = GradStore::default();
    for (v, g) in pairs {
        store.insert(v.as_tensor(), Tensor::new(*g, &CPU)?);
    }
    Ok(store)
}

fn assert_close(actual: &[f32], expected: &[f64], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let tol = 2e-6 * e.abs().max(1.0);
        assert!(
            (a as f64 - e).abs() <= tol,
            "{what}[{i}]: got {a}, expected {e}"
        );
    }
}

fn assert_on_grid(values: &[f32], format: &Format, what: &str) {
    for (i, &x) in values.iter().enumerate() {
        let r = format.round(x as f64, NE, 0);
        assert_eq!(r, x as f64, "{what}[{i}] = {x} is not a {format} value");
    }
}

fn state(entries: &[(String, Tensor)], name: &str) -> Result<Vec<f32>> {
    let t = entries
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("state has no entry {name}"));
    vals(&t.1)
}

const GRADS: [[f32; 3]; 3] = [[0.5, -0.25, 0.125], [0.3, 0.1, -0.4], [-0.2, 0.45, 0.05]];
const W0: [f32; 3] = [1.0, -2.0, 0.5];

/// PyTorch's SGD on one element, in f64: the weights after each step.
fn ref_sgd(w0: &[f32], steps: &[[f32; 3]], p: SgdParams) -> Vec<Vec<f64>> {
    let mut w: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
    let mut buf: Vec<Option<f64>> = vec![None; w.len()];
    let mut out = Vec::new();
    for g in steps {
        for i in 0..w.len() {
            let mut d = g[i] as f64 + p.weight_decay * w[i];
            if p.momentum != 0.0 {
                let b = match buf[i] {
                    None => d,
                    Some(b) => p.momentum * b + (1.0 - p.dampening) * d,
                };
                buf[i] = Some(b);
                d = if p.nesterov { d + p.momentum * b } else { b };
            }
            w[i] -= p.lr * d;
        }
        out.push(w.clone());
    }
    out
}

fn check_sgd_against_reference(p: SgdParams, what: &str) -> Result<()> {
    let w = var(&W0)?;
    let mut opt = LpSgd::new(vec![(w.clone(), ParamQuant::none())], p)?;
    let expected = ref_sgd(&W0, &GRADS, p);
    for (k, g) in GRADS.iter().enumerate() {
        opt.step(&grads(&[(&w, g)])?)?;
        assert_close(
            &vals(w.as_tensor())?,
            &expected[k],
            &format!("{what} step {k}"),
        );
    }
    Ok(())
}

#[test]
fn sgd_plain_step_is_w_minus_lr_g() -> Result<()> {
    let p = SgdParams {
        lr: 0.5,
        ..SgdParams::default()
    };
    // By hand: 1 - 0.5*0.5 = 0.75, then 0.75 - 0.5*0.3 = 0.6, then 0.6 + 0.5*0.2 = 0.7.
    let w = var(&[1.0])?;
    let mut opt = LpSgd::new(vec![(w.clone(), ParamQuant::none())], p)?;
    let mut seen = Vec::new();
    for g in [0.5f32, 0.3, -0.2] {
        opt.step(&grads(&[(&w, &[g])])?)?;
        seen.push(vals(w.as_tensor())?[0]);
    }
    assert_close(&seen, &[0.75, 0.6, 0.7], "plain sgd");
    check_sgd_against_reference(p, "plain sgd")
}

#[test]
fn sgd_momentum_buffer_starts_at_gradient_then_mu_b_plus_g() -> Result<()> {
    let p = SgdParams {
        lr: 0.1,
        momentum: 0.9,
        ..SgdParams::default()
    };
    // Element 0 by hand: b = 0.5, w = 0.95; b = 0.45 + 0.3 = 0.75, w = 0.875;
    // b = 0.675 - 0.2 = 0.475, w = 0.8275.
    let w = var(&[1.0])?;
    let mut opt = LpSgd::new(vec![(w.clone(), ParamQuant::none())], p)?;
    let mut seen = Vec::new();
    for g in [0.5f32, 0.3, -0.2] {
        opt.step(&grads(&[(&w, &[g])])?)?;
        seen.push(vals(w.as_tensor())?[0]);
    }
    assert_close(&seen, &[0.95, 0.875, 0.8275], "momentum sgd");
    check_sgd_against_reference(p, "momentum sgd")
}

#[test]
fn sgd_dampening_scales_the_gradient_only_after_the_first_step() -> Result<()> {
    let p = SgdParams {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        ..SgdParams::default()
    };
    // By hand: b = 0.5 (undamped), w = 0.95; b = 0.45 + 0.15 = 0.6, w = 0.89.
    let w = var(&[1.0])?;
    let mut opt = LpSgd::new(vec![(w.clone(), ParamQuant::none())], p)?;
    opt.step(&grads(&[(&w, &[0.5])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.95], "dampened step 1");
    opt.step(&grads(&[(&w, &[0.3])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.89], "dampened step 2");
    check_sgd_against_reference(p, "dampened sgd")
}

#[test]
fn sgd_nesterov_steps_along_g_plus_mu_b() -> Result<()> {
    let p = SgdParams {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        ..SgdParams::default()
    };
    // By hand: b = 0.5, d = 0.5 + 0.45 = 0.95, w = 0.905; b = 0.75, d = 0.3 + 0.675, w = 0.8075.
    let w = var(&[1.0])?;
    let mut opt = LpSgd::new(vec![(w.clone(), ParamQuant::none())], p)?;
    opt.step(&grads(&[(&w, &[0.5])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.905], "nesterov step 1");
    opt.step(&grads(&[(&w, &[0.3])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.8075], "nesterov step 2");
    check_sgd_against_reference(p, "nesterov sgd")
}

#[test]
fn sgd_weight_decay_adds_lambda_w_to_the_gradient_before_momentum() -> Result<()> {
    let p = SgdParams {
        lr: 0.1,
        momentum: 0.5,
        weight_decay: 0.1,
        ..SgdParams::default()
    };
    // By hand: d = 0.5 + 0.1 = 0.6, w = 0.94; d = 0.3 + 0.094, b = 0.3 + 0.394, w = 0.8706.
    let w = var(&[1.0])?;
    let mut opt = LpSgd::new(vec![(w.clone(), ParamQuant::none())], p)?;
    opt.step(&grads(&[(&w, &[0.5])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.94], "decay step 1");
    opt.step(&grads(&[(&w, &[0.3])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.8706], "decay step 2");
    check_sgd_against_reference(p, "decayed sgd")
}

#[test]
fn sgd_backward_step_follows_the_loss_gradient() -> Result<()> {
    // loss = sum((w - t)^2), gradient 2 (w - t).
    let w = var(&[1.0, -1.0])?;
    let t = Tensor::new(&[0.5f32, 0.5], &CPU)?;
    let mut opt = LpSgd::new(
        vec![(w.clone(), ParamQuant::none())],
        SgdParams {
            lr: 0.25,
            ..SgdParams::default()
        },
    )?;
    let loss = (w.as_tensor() - &t)?.sqr()?.sum_all()?;
    opt.backward_step(&loss)?;
    // w - 0.25 * 2 (w - t) = (w + t) / 2.
    assert_close(&vals(w.as_tensor())?, &[0.75, -0.25], "backward step");
    Ok(())
}

/// PyTorch's Adam (decoupled = false) or AdamW (true) in f64: the weights after each step.
fn ref_adam(w0: &[f32], steps: &[[f32; 3]], p: AdamParams, decoupled: bool) -> Vec<Vec<f64>> {
    let mut w: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
    let (mut m, mut v) = (vec![0.0; w.len()], vec![0.0; w.len()]);
    let mut out = Vec::new();
    for (k, g) in steps.iter().enumerate() {
        let t = (k + 1) as i32;
        for i in 0..w.len() {
            let mut g = g[i] as f64;
            if decoupled {
                w[i] *= 1.0 - p.lr * p.weight_decay;
            } else {
                g += p.weight_decay * w[i];
            }
            m[i] = p.beta1 * m[i] + (1.0 - p.beta1) * g;
            v[i] = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
            let denom = v[i].sqrt() / (1.0 - p.beta2.powi(t)).sqrt() + p.eps;
            w[i] -= p.lr / (1.0 - p.beta1.powi(t)) * m[i] / denom;
        }
        out.push(w.clone());
    }
    out
}

/// Hyper-parameters where bias correction, eps placement and decay all move the result.
fn adam_test_params() -> AdamParams {
    AdamParams {
        lr: 0.1,
        beta1: 0.8,
        beta2: 0.9,
        eps: 0.05,
        weight_decay: 0.2,
    }
}

#[test]
fn adam_matches_bias_corrected_formula_with_l2_decay() -> Result<()> {
    let p = adam_test_params();
    // Step 1 of element 0 by hand: g = 0.5 + 0.2 = 0.7, m = 0.14, v = 0.049,
    // denom = sqrt(0.049 / 0.1) + 0.05 = 0.75, w = 1 - 0.1 / 0.2 * 0.14 / 0.75.
    let step1 = 1.0 - 0.1 / 0.2 * 0.14 / 0.75;
    let w = var(&W0)?;
    let mut opt = LpAdam::new(vec![(w.clone(), ParamQuant::none())], p)?;
    let expected = ref_adam(&W0, &GRADS, p, false);
    assert_close(&[expected[0][0] as f32], &[step1], "reference step 1");
    for (k, g) in GRADS.iter().enumerate() {
        opt.step(&grads(&[(&w, g)])?)?;
        assert_close(
            &vals(w.as_tensor())?,
            &expected[k],
            &format!("adam step {k}"),
        );
    }
    Ok(())
}

#[test]
fn adamw_decays_weights_decoupled_from_the_moments() -> Result<()> {
    let p = adam_test_params();
    // Step 1 of element 0 by hand: w = 1 - 0.02 = 0.98, m = 0.1, v = 0.025,
    // denom = 0.5 + 0.05 = 0.55, w = 0.98 - 0.5 * 0.1 / 0.55.
    let step1 = 0.98 - 0.5 * 0.1 / 0.55;
    let w = var(&W0)?;
    let mut opt = LpAdamW::new(vec![(w.clone(), ParamQuant::none())], p.into())?;
    let expected = ref_adam(&W0, &GRADS, p, true);
    assert_close(&[expected[0][0] as f32], &[step1], "reference step 1");
    for (k, g) in GRADS.iter().enumerate() {
        opt.step(&grads(&[(&w, g)])?)?;
        assert_close(
            &vals(w.as_tensor())?,
            &expected[k],
            &format!("adamw step {k}"),
        );
    }
    Ok(())
}

#[test]
fn defaults_are_pytorch_defaults() {
    let s = SgdParams::default();
    assert_eq!(
        (s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov),
        (1e-3, 0.0, 0.0, 0.0, false)
    );
    let a = AdamParams::default();
    assert_eq!(
        (a.lr, a.beta1, a.beta2, a.eps, a.weight_decay),
        (1e-3, 0.9, 0.999, 1e-8, 0.0)
    );
    let w = AdamWParams::default();
    assert_eq!(
        (w.lr, w.beta1, w.beta2, w.eps, w.weight_decay),
        (1e-3, 0.9, 0.999, 1e-8, 1e-2)
    );
}

/// A small regression problem: loss = mean((x w - y)^2) over fixed data.
fn regression_loss(w: &Var) -> Result<Tensor> {
    let x = Tensor::new(
        &[[1.0f32, 2.0, -1.0], [0.5, -1.5, 2.0], [3.0, 0.25, 1.0]],
        &CPU,
    )?;
    let y = Tensor::new(&[[1.0f32], [-2.0], [0.5]], &CPU)?;
    Ok(x.matmul(&w.as_tensor().reshape((3, 1))?)?
        .sub(&y)?
        .sqr()?
        .mean_all()?)
}

#[test]
fn unquantized_lp_sgd_equals_candle_sgd_bit_for_bit() -> Result<()> {
    let (a, b) = (var(&W0)?, var(&W0)?);
    let mut ours = <LpSgd as Optimizer>::new(
        vec![a.clone()],
        SgdParams {
            lr: 0.05,
            ..SgdParams::default()
        },
    )?;
    let mut theirs = candle_nn::SGD::new(vec![b.clone()], 0.05)?;
    for _ in 0..5 {
        ours.backward_step(&regression_loss(&a)?)?;
        theirs.backward_step(&regression_loss(&b)?)?;
        assert_eq!(vals(a.as_tensor())?, vals(b.as_tensor())?);
    }
    assert_ne!(
        vals(a.as_tensor())?,
        W0.to_vec(),
        "the weights must have moved"
    );
    Ok(())
}

fn assert_near(a: &[f32], b: &[f32], what: &str) {
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

#[test]
fn unquantized_lp_adam_equals_candle_adamw_with_zero_decay() -> Result<()> {
    let (a, b) = (var(&W0)?, var(&W0)?);
    let lr = 0.05;
    let mut ours = <LpAdam as Optimizer>::new(
        vec![a.clone()],
        AdamParams {
            lr,
            ..AdamParams::default()
        },
    )?;
    let mut theirs = candle_nn::AdamW::new(
        vec![b.clone()],
        candle_nn::ParamsAdamW {
            lr,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    for k in 0..6 {
        ours.backward_step(&regression_loss(&a)?)?;
        theirs.backward_step(&regression_loss(&b)?)?;
        assert_near(
            &vals(a.as_tensor())?,
            &vals(b.as_tensor())?,
            &format!("step {k}"),
        );
    }
    assert_ne!(
        vals(a.as_tensor())?,
        W0.to_vec(),
        "the weights must have moved"
    );
    Ok(())
}

#[test]
fn unquantized_lp_adamw_equals_candle_adamw() -> Result<()> {
    let (a, b) = (var(&W0)?, var(&W0)?);
    let params = candle_nn::ParamsAdamW {
        lr: 0.05,
        weight_decay: 0.3,
        ..Default::default()
    };
    let mut ours = <LpAdamW as Optimizer>::new(
        vec![a.clone()],
        AdamWParams {
            lr: params.lr,
            beta1: params.beta1,
            beta2: params.beta2,
            eps: params.eps,
            weight_decay: params.weight_decay,
        },
    )?;
    let mut theirs = candle_nn::AdamW::new(vec![b.clone()], params)?;
    for k in 0..6 {
        ours.backward_step(&regression_loss(&a)?)?;
        theirs.backward_step(&regression_loss(&b)?)?;
        assert_near(
            &vals(a.as_tensor())?,
            &vals(b.as_tensor())?,
            &format!("step {k}"),
        );
    }
    Ok(())
}

/// Varied gradients that are on no coarse grid.
fn rough_grads(step: usize) -> [f32; 3] {
    let s = step as f32;
    [0.137 + 0.05 * s, -0.291 * (1.0 + s), 0.0731 - 0.11 * s]
}

#[test]
fn quantized_sgd_keeps_weights_and_momentum_buffers_on_their_grids() -> Result<()> {
    let (wf, mf) = ("posit<8,0>", "fixed<8,5>");
    let w = var(&[0.3, -0.7, 1.1])?;
    let quant = ParamQuant {
        weight: Some(q(wf)),
        momentum: Some(q(mf)),
        ..ParamQuant::default()
    };
    let p = SgdParams {
        lr: 0.0371,
        momentum: 0.9,
        ..SgdParams::default()
    };
    let mut opt = LpSgd::new(vec![(w.clone(), quant)], p)?;
    for k in 0..3 {
        opt.step(&grads(&[(&w, &rough_grads(k))])?)?;
        assert_on_grid(&vals(w.as_tensor())?, &fmt(wf), "weight");
        let s = opt.state_tensors()?;
        assert_on_grid(
            &state(&s, "0.momentum_buffer")?,
            &fmt(mf),
            "momentum buffer",
        );
    }
    Ok(())
}

#[test]
fn quantized_adam_keeps_weights_moments_and_accumulator_on_their_grids() -> Result<()> {
    let (wf, mf, af) = ("e4m3", "posit<8,1>", "fixed<16,12>");
    let w = var(&[0.3, -0.7, 1.1])?;
    let quant = ParamQuant {
        weight: Some(q(wf)),
        momentum: Some(q(mf)),
        accumulator: Some(q(af)),
        ..ParamQuant::default()
    };
    let mut opt = LpAdam::new(
        vec![(w.clone(), quant)],
        AdamParams {
            lr: 0.0123,
            weight_decay: 0.01,
            ..AdamParams::default()
        },
    )?;
    for k in 0..3 {
        opt.step(&grads(&[(&w, &rough_grads(k))])?)?;
        let s = opt.state_tensors()?;
        assert_on_grid(&vals(w.as_tensor())?, &fmt(wf), "weight");
        assert_on_grid(&state(&s, "0.exp_avg")?, &fmt(mf), "exp_avg");
        assert_on_grid(&state(&s, "0.exp_avg_sq")?, &fmt(mf), "exp_avg_sq");
        assert_on_grid(&state(&s, "0.accumulator")?, &fmt(af), "accumulator");
    }
    Ok(())
}

#[test]
fn with_accumulator_the_var_is_the_weight_rounding_of_the_accumulator() -> Result<()> {
    let (wf, af) = ("posit<8,0>", "fp16");
    let w = var(&[0.3, -0.7, 1.1])?;
    let quant = ParamQuant {
        weight: Some(q(wf)),
        accumulator: Some(q(af)),
        ..ParamQuant::default()
    };
    let mut opt = LpSgd::new(
        vec![(w.clone(), quant)],
        SgdParams {
            lr: 0.01,
            momentum: 0.5,
            ..SgdParams::default()
        },
    )?;
    let (wf, af) = (fmt(wf), fmt(af));
    for k in 0..4 {
        opt.step(&grads(&[(&w, &rough_grads(k))])?)?;
        let acc = state(&opt.state_tensors()?, "0.accumulator")?;
        assert_on_grid(&acc, &af, "accumulator");
        let expected: Vec<f32> = acc
            .iter()
            .map(|&a| wf.round(a as f64, NE, 0) as f32)
            .collect();
        assert_eq!(
            vals(w.as_tensor())?,
            expected,
            "step {k}: var = round_w(acc)"
        );
        assert_ne!(
            acc, expected,
            "step {k}: the accumulator must be finer than the var"
        );
    }
    Ok(())
}

/// `n` SGD steps of lr 0.01 and gradient 1 from w = 1 with weights in fixed<8,4> (spacing
/// 1/16), with or without a fixed<16,12> accumulator: the var after each step.
fn small_updates(n: usize, accumulate: bool) -> Result<Vec<f32>> {
    let w = var(&[1.0])?;
    let quant = ParamQuant {
        weight: Some(q("fixed<8,4>")),
        accumulator: accumulate.then(|| q("fixed<16,12>")),
        ..ParamQuant::default()
    };
    let mut opt = LpSgd::new(
        vec![(w.clone(), quant)],
        SgdParams {
            lr: 0.01,
            ..SgdParams::default()
        },
    )?;
    let mut out = Vec::new();
    for _ in 0..n {
        opt.step(&grads(&[(&w, &[1.0])])?)?;
        out.push(vals(w.as_tensor())?[0]);
    }
    Ok(out)
}

#[test]
fn updates_below_weight_spacing_add_up_in_the_accumulator() -> Result<()> {
    // Without an accumulator, 1 - 0.01 rounds back to 1 every step.
    assert_eq!(small_updates(10, false)?, vec![1.0; 10]);
    // With one, a_{k+1} = round_a(a_k - 0.01) (f32 arithmetic) and the var is round_w(a).
    let (wf, af) = (fmt("fixed<8,4>"), fmt("fixed<16,12>"));
    let mut a = 1.0f32;
    let mut expected = Vec::new();
    for _ in 0..10 {
        a = af.round((a - 0.01f32 * 1.0) as f64, NE, 0) as f32;
        expected.push(wf.round(a as f64, NE, 0) as f32);
    }
    let got = small_updates(10, true)?;
    assert_eq!(got, expected);
    // 1 - 10 * 0.01 ≈ 0.9, whose nearest sixteenth is 0.875.
    assert_eq!(*got.last().unwrap(), 0.875);
    Ok(())
}

#[test]
fn half_precision_var_accumulates_in_an_f32_accumulator() -> Result<()> {
    let run = |accumulate: bool| -> Result<f32> {
        let w = Var::new(&[half::f16::ONE], &CPU)?;
        let quant = ParamQuant {
            accumulator: accumulate.then(|| q("fixed<24,20>")),
            ..ParamQuant::default()
        };
        let mut opt = LpSgd::new(
            vec![(w.clone(), quant)],
            SgdParams {
                lr: 1e-4,
                ..SgdParams::default()
            },
        )?;
        let mut store = GradStore::default();
        store.insert(w.as_tensor(), Tensor::new(&[half::f16::ONE], &CPU)?);
        for _ in 0..20 {
            opt.step(&store)?;
        }
        if accumulate {
            let s = opt.state_tensors()?;
            let acc = &s.iter().find(|(n, _)| n == "0.accumulator").unwrap().1;
            assert_eq!(acc.dtype(), DType::F32);
        }
        assert_eq!(w.dtype(), DType::F16);
        Ok(vals(w.as_tensor())?[0])
    };
    // 1e-4 is below half of f16's spacing 2^-11 just under 1: an f16 weight stays stuck.
    assert_eq!(run(false)?, 1.0);
    let moved = run(true)?;
    assert!(
        (moved as f64 - 0.998).abs() < 1e-3 && moved < 1.0,
        "got {moved}"
    );
    Ok(())
}

#[test]
fn gradient_is_rounded_before_the_update_and_before_weight_decay() -> Result<()> {
    // fixed<8,4>: 0.03 -> 0, 0.1 -> 0.125, -0.22 -> -0.25.
    let w = var(&[1.0, 1.0, 1.0])?;
    let quant = ParamQuant {
        gradient: Some(q("fixed<8,4>")),
        ..ParamQuant::default()
    };
    let mut opt = LpSgd::new(
        vec![(w.clone(), quant.clone())],
        SgdParams {
            lr: 1.0,
            ..SgdParams::default()
        },
    )?;
    opt.step(&grads(&[(&w, &[0.03, 0.1, -0.22])])?)?;
    assert_eq!(vals(w.as_tensor())?, [1.0, 0.875, 1.25]);

    // With decay 0.1: d = round(g) + 0.1 w (rounding after the decay would give
    // round(0.13) = 0.125 for the first element).
    let w = var(&[1.0, 1.0, 1.0])?;
    let mut opt = LpSgd::new(
        vec![(w.clone(), quant.clone())],
        SgdParams {
            lr: 1.0,
            weight_decay: 0.1,
            ..SgdParams::default()
        },
    )?;
    opt.step(&grads(&[(&w, &[0.03, 0.1, -0.22])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.9, 0.775, 1.15], "decayed");

    // Adam moves each element by about lr·sign(g), except where the gradient rounds to 0.
    let w = var(&[1.0, 1.0, 1.0])?;
    let mut opt = LpAdam::new(
        vec![(w.clone(), quant)],
        AdamParams {
            lr: 0.5,
            ..AdamParams::default()
        },
    )?;
    opt.step(&grads(&[(&w, &[0.03, 0.1, -0.22])])?)?;
    assert_close(&vals(w.as_tensor())?, &[1.0, 0.5, 1.5], "adam");
    Ok(())
}

#[test]
fn momentum_buffer_is_stored_rounded_and_read_rounded_next_step() -> Result<()> {
    // fixed<8,2> (spacing 0.25). Step 1: b = 0.4 is used unrounded (w = 1 - 0.4 = 0.6)
    // and stored as 0.5. Step 2: b = 0.5 * 0.5 + 0.1 = 0.35, w = 0.6 - 0.35 = 0.25.
    let w = var(&[1.0])?;
    let quant = ParamQuant {
        momentum: Some(q("fixed<8,2>")),
        ..ParamQuant::default()
    };
    let mut opt = LpSgd::new(
        vec![(w.clone(), quant)],
        SgdParams {
            lr: 1.0,
            momentum: 0.5,
            ..SgdParams::default()
        },
    )?;
    opt.step(&grads(&[(&w, &[0.4])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.6], "step 1");
    assert_eq!(state(&opt.state_tensors()?, "0.momentum_buffer")?, [0.5]);
    opt.step(&grads(&[(&w, &[0.1])])?)?;
    assert_close(&vals(w.as_tensor())?, &[0.25], "step 2");
    assert_eq!(state(&opt.state_tensors()?, "0.momentum_buffer")?, [0.25]);
    Ok(())
}

#[test]
fn optim_lp_around_candle_sgd_equals_lp_sgd_bit_for_bit() -> Result<()> {
    for accumulate in [false, true] {
        let quant = || ParamQuant {
            gradient: Some(q("posit<8,0>")),
            weight: Some(q("e4m3")),
            accumulator: accumulate.then(|| q("fp16")),
            ..ParamQuant::default()
        };
        let (a, b) = (var(&W0)?, var(&W0)?);
        let mut ours = LpSgd::new(
            vec![(a.clone(), quant())],
            SgdParams {
                lr: 0.03,
                ..SgdParams::default()
            },
        )?;
        let inner = candle_nn::SGD::new(vec![b.clone()], 0.03)?;
        let mut wrapped = OptimLp::new(inner, vec![(b.clone(), quant())])?;
        for k in 0..6 {
            ours.backward_step(&regression_loss(&a)?)?;
            wrapped.backward_step(&regression_loss(&b)?)?;
            assert_eq!(
                vals(a.as_tensor())?,
                vals(b.as_tensor())?,
                "accumulator {accumulate}, step {k}"
            );
        }
        assert_on_grid(&vals(b.as_tensor())?, &fmt("e4m3"), "wrapped weight");
        assert_ne!(
            vals(b.as_tensor())?,
            W0.to_vec(),
            "the weights must have moved"
        );
        if accumulate {
            let s = wrapped.state_tensors()?;
            assert_eq!(
                state(&s, "0.accumulator")?,
                state(&ours.state_tensors()?, "0.accumulator")?
            );
        }
    }
    Ok(())
}

#[test]
fn optim_lp_rounds_the_gradient_the_inner_optimizer_reads() -> Result<()> {
    let w = var(&[1.0, 1.0, 1.0])?;
    let other = var(&[2.0])?;
    let inner = candle_nn::SGD::new(vec![w.clone(), other.clone()], 1.0)?;
    let quant = ParamQuant {
        gradient: Some(q("fixed<8,4>")),
        ..ParamQuant::default()
    };
    let mut opt = OptimLp::new(inner, vec![(w.clone(), quant)])?;
    opt.step(&grads(&[(&w, &[0.03, 0.1, -0.22]), (&other, &[0.03])])?)?;
    assert_eq!(vals(w.as_tensor())?, [1.0, 0.875, 1.25]);
    // A var the wrapper does not list still gets its unrounded gradient.
    assert_close(&vals(other.as_tensor())?, &[1.97], "unlisted var");
    assert_eq!(opt.learning_rate(), 1.0);
    opt.set_learning_rate(0.5);
    assert_eq!(opt.inner().learning_rate(), 0.5);
    Ok(())
}

#[test]
fn vars_without_a_gradient_are_skipped_and_keep_their_step_count() -> Result<()> {
    let (a, b) = (var(&[1.0, 2.0])?, var(&[3.0])?);
    let p = AdamParams {
        lr: 0.1,
        ..AdamParams::default()
    };
    let quant = ParamQuant {
        weight: Some(q("posit<8,0>")),
        ..ParamQuant::default()
    };
    let mut opt = LpAdam::new(vec![(a.clone(), quant), (b.clone(), ParamQuant::none())], p)?;
    opt.step(&grads(&[(&a, &[0.5, -0.5])])?)?;
    opt.step(&grads(&[(&a, &[0.5, -0.5])])?)?;
    assert_eq!(vals(b.as_tensor())?, [3.0], "no gradient, no change");
    let s = opt.state_tensors()?;
    assert_eq!(state(&s, "0.step")?, [2.0]);
    assert_eq!(state(&s, "1.step")?, [0.0]);
    assert!(s.iter().all(|(n, _)| !n.starts_with("1.exp_avg")));
    // b's first step is bias-corrected as step 1, so it moves by lr (as step 3 it would
    // move by about 0.064).
    opt.step(&grads(&[(&b, &[1.0])])?)?;
    assert_close(&vals(b.as_tensor())?, &[2.9], "first step of b");
    assert_on_grid(&vals(a.as_tensor())?, &fmt("posit<8,0>"), "a");
    Ok(())
}

/// A quantized Adam over two vars with a stochastic-rounding gradient quantization.
#[cfg(feature = "cli")]
fn resumable_adam(a: &Var, b: &Var) -> Result<LpAdam> {
    let quant = |seed| -> Result<ParamQuant> {
        Ok(ParamQuant {
            gradient: Some(Quant::parse("e4m3", "stochastic:8")?.with_seed(seed)),
            momentum: Some(q("bf16")),
            weight: Some(q("posit<16,1>")),
            accumulator: Some(q("fixed<24,18>")),
        })
    };
    Ok(LpAdam::new(
        vec![(a.clone(), quant(1)?), (b.clone(), quant(2)?)],
        AdamParams {
            lr: 0.02,
            weight_decay: 0.05,
            ..AdamParams::default()
        },
    )?)
}

/// Through the tool's tensor files (`qcandle::io`, part of the `cli` feature).
#[cfg(feature = "cli")]
#[test]
fn exported_state_resumes_to_identical_results() -> Result<()> {
    let wb = [0.25f32, -1.5];
    let (a, b) = (var(&W0)?, var(&wb)?);
    let mut straight = resumable_adam(&a, &b)?;
    let loss = |a: &Var, b: &Var| -> Result<Tensor> {
        Ok((regression_loss(a)? + b.as_tensor().sqr()?.sum_all()?)?)
    };
    for _ in 0..2 {
        straight.backward_step(&loss(&a, &b)?)?;
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("optim.safetensors");
    qcandle::io::write_tensors(&path, &straight.state_tensors()?)?;
    let weights = (a.as_tensor().copy()?, b.as_tensor().copy()?);
    for _ in 0..3 {
        straight.backward_step(&loss(&a, &b)?)?;
    }

    let resume = |load: bool| -> Result<Vec<f32>> {
        let (a2, b2) = (Var::from_tensor(&weights.0)?, Var::from_tensor(&weights.1)?);
        let mut opt = resumable_adam(&a2, &b2)?;
        if load {
            opt.load_state_tensors(qcandle::io::read_tensors(&path)?)?;
        }
        for _ in 0..3 {
            opt.backward_step(&loss(&a2, &b2)?)?;
        }
        Ok([vals(a2.as_tensor())?, vals(b2.as_tensor())?].concat())
    };
    let expected = [vals(a.as_tensor())?, vals(b.as_tensor())?].concat();
    assert_eq!(resume(true)?, expected);
    assert_ne!(
        resume(false)?,
        expected,
        "a fresh optimizer must not resume the run"
    );
    Ok(())
}

#[test]
fn sgd_momentum_state_resumes_to_identical_results() -> Result<()> {
    let p = SgdParams {
        lr: 0.05,
        momentum: 0.9,
        nesterov: true,
        ..SgdParams::default()
    };
    let quant = || ParamQuant {
        momentum: Some(q("fp16")),
        ..ParamQuant::default()
    };
    let a = var(&W0)?;
    let mut opt = LpSgd::new(vec![(a.clone(), quant())], p)?;
    opt.backward_step(&regression_loss(&a)?)?;
    let saved = opt.state_tensors()?;
    let b = Var::from_tensor(&a.as_tensor().copy()?)?;
    opt.backward_step(&regression_loss(&a)?)?;
    let mut resumed = LpSgd::new(vec![(b.clone(), quant())], p)?;
    resumed.load_state_tensors(saved)?;
    resumed.backward_step(&regression_loss(&b)?)?;
    assert_eq!(vals(a.as_tensor())?, vals(b.as_tensor())?);
    Ok(())
}

/// Each optimizer of the module over the var `w`, boxed, with a momentum format and an
/// accumulator so that every one has state to export.
fn each_optimizer_boxed(w: &Var) -> Result<Vec<(&'static str, Box<dyn LpOptimizer>)>> {
    let quant = ParamQuant {
        momentum: Some(q("bf16")),
        weight: Some(q("e4m3")),
        accumulator: Some(q("fp16")),
        ..ParamQuant::default()
    };
    let params = || vec![(w.clone(), quant.clone())];
    let sgd = SgdParams {
        lr: 0.05,
        momentum: 0.9,
        ..SgdParams::default()
    };
    let adam = adam_test_params();
    let inner = candle_nn::SGD::new(vec![w.clone()], 0.05)?;
    Ok(vec![
        ("LpSgd", Box::new(LpSgd::new(params(), sgd)?)),
        ("LpAdam", Box::new(LpAdam::new(params(), adam)?)),
        ("LpAdamW", Box::new(LpAdamW::new(params(), adam.into())?)),
        ("OptimLp", Box::new(OptimLp::new(inner, params())?)),
    ])
}

#[test]
fn boxed_optimizers_set_the_rate_list_their_vars_and_resume() -> Result<()> {
    let (a, c) = (var(&W0)?, var(&W0)?);
    let originals = each_optimizer_boxed(&a)?;
    let resumed = each_optimizer_boxed(&c)?;
    for ((what, mut opt), (_, mut resumed)) in originals.into_iter().zip(resumed) {
        a.set(&Tensor::new(&W0, &CPU)?)?;
        let vars = opt.vars();
        assert_eq!(vars.len(), 1, "{what}: vars");
        assert_eq!(
            vars[0].as_tensor().id(),
            a.as_tensor().id(),
            "{what}: the var"
        );
        opt.set_learning_rate(0.02);
        assert_eq!(opt.learning_rate(), 0.02, "{what}: learning rate");
        resumed.set_learning_rate(0.02);
        opt.backward_step(&regression_loss(&a)?)?;
        opt.step(&grads(&[(&a, &rough_grads(1))])?)?;
        resumed.load_state_tensors(opt.state_tensors()?)?;
        c.set(a.as_tensor())?;
        for k in 2..4 {
            opt.step(&grads(&[(&a, &rough_grads(k))])?)?;
            resumed.step(&grads(&[(&c, &rough_grads(k))])?)?;
        }
        assert_ne!(
            vals(a.as_tensor())?,
            W0.to_vec(),
            "{what}: the weights moved"
        );
        assert_eq!(
            vals(a.as_tensor())?,
            vals(c.as_tensor())?,
            "{what}: resumed from the exported state"
        );
    }
    Ok(())
}

#[test]
fn invalid_settings_and_state_are_errors_not_panics() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    let one = |p: SgdParams| LpSgd::new(vec![(w.clone(), ParamQuant::none())], p);
    assert!(one(SgdParams {
        nesterov: true,
        ..SgdParams::default()
    })
    .is_err());
    assert!(one(SgdParams {
        momentum: 0.9,
        dampening: 0.1,
        nesterov: true,
        ..SgdParams::default()
    })
    .is_err());
    assert!(one(SgdParams {
        lr: -1.0,
        ..SgdParams::default()
    })
    .is_err());
    let adam = |p: AdamParams| LpAdam::new(vec![(w.clone(), ParamQuant::none())], p);
    assert!(adam(AdamParams {
        beta1: 1.0,
        ..AdamParams::default()
    })
    .is_err());
    assert!(adam(AdamParams {
        eps: f64::NAN,
        ..AdamParams::default()
    })
    .is_err());

    let ints = Var::new(&[1u32, 2], &CPU)?;
    assert!(LpSgd::new(
        vec![(ints.clone(), ParamQuant::none())],
        SgdParams::default()
    )
    .is_err());
    // The candle-trait constructor leaves non-float vars out, as candle's optimizers do.
    assert!(<LpSgd as Optimizer>::new(vec![ints], SgdParams::default())?
        .vars()
        .is_empty());

    let mut opt = one(SgdParams {
        momentum: 0.5,
        ..SgdParams::default()
    })?;
    let t = Tensor::new(&[0.0f32, 0.0], &CPU)?;
    let load = |opt: &mut LpSgd, name: &str, t: &Tensor| {
        opt.load_state_tensors(vec![(name.to_string(), t.clone())])
    };
    assert!(load(&mut opt, "0.momentum_buffer", &t).is_ok());
    assert!(load(&mut opt, "0.exp_avg", &t).is_err(), "unknown key");
    assert!(
        load(&mut opt, "1.momentum_buffer", &t).is_err(),
        "no such parameter"
    );
    assert!(load(&mut opt, "momentum_buffer", &t).is_err(), "no index");
    assert!(
        load(&mut opt, "0.accumulator", &t).is_err(),
        "no accumulator"
    );
    assert!(
        load(&mut opt, "0.calls.gradient", &t).is_err(),
        "no gradient quant"
    );
    let wrong = Tensor::new(&[0.0f32, 0.0, 0.0], &CPU)?;
    assert!(
        load(&mut opt, "0.momentum_buffer", &wrong).is_err(),
        "shape"
    );
    assert!(load(&mut opt, "0.step", &Tensor::new(-1i64, &CPU)?).is_err());

    // A gradient of the wrong shape is an error too.
    let mut store = GradStore::default();
    store.insert(w.as_tensor(), Tensor::new(&[1.0f32, 2.0, 3.0], &CPU)?);
    assert!(opt.step(&store).is_err());
    Ok(())
}
