//! Loss scaling: the optimizer rounds the scaled gradient and unscales it (checked against
//! values computed here), skips a step whose gradients overflow; in training, no scaling is
//! the default, a power-of-two scale is exact in f32, dynamic scaling backs off and grows by
//! GradScaler's rule, resumes bit for bit, and makes e4m3 errors train.

/// The shared training set-up: the embedded subset, short LeNet-5 runs.
#[path = "common/training.rs"]
mod training;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer;
use qcandle::io::read_tensors;
use qcandle::nn::QConfig;
use qcandle::optim::{
    AdamParams, DynamicScale, LossScale, LpAdam, LpSgd, OptimLp, ParamQuant, SgdParams,
};
use qcandle::train::{train, OptimizerKind, TrainOptions, Trainer};
use qcandle::Quant;
use training::{subset, without_time};

type R = anyhow::Result<()>;

const CPU: Device = Device::Cpu;

/// e4m3 for every GEMM operand and result, f32 moments and weight copy (the accumulator
/// table's e4m3 row, `examples/sweeps/configs/fp8-e4m3.toml`).
const E4M3: &str = r#"
weight = "e4m3"
activation = "e4m3"
error = "e4m3"
gradient = "e4m3"
accumulator = "float<8,23>"
"#;

fn config(text: &str, loss_scale: LossScale) -> anyhow::Result<QConfig> {
    let mut c = QConfig::from_toml(text)?;
    c.loss_scale = loss_scale;
    Ok(c)
}

fn dynamic(init: f32, growth_interval: u64) -> LossScale {
    LossScale::Dynamic(DynamicScale {
        init,
        growth_interval,
        ..DynamicScale::default()
    })
}

fn options(name: &str, epochs: usize) -> TrainOptions {
    training::lenet5_options(name, epochs, 5)
}

fn vals(t: &Tensor) -> anyhow::Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// Every variable of a trainer's model, by name.
fn weights(trainer: &Trainer) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    let data = trainer.varmap().data().lock().unwrap();
    let mut w: Vec<(String, Vec<f32>)> = data
        .iter()
        .map(|(n, v)| Ok((n.clone(), vals(v.as_tensor())?)))
        .collect::<anyhow::Result<_>>()?;
    w.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(w)
}

/// The model a run directory holds.
fn model(dir: &std::path::Path) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    read_tensors(&dir.join("model.safetensors"))?
        .into_iter()
        .map(|(n, t)| Ok((n, vals(&t)?)))
        .collect()
}

fn store(v: &Var, g: &[f32]) -> anyhow::Result<GradStore> {
    let mut s = GradStore::default();
    s.insert(v.as_tensor(), Tensor::new(g, &CPU)?);
    Ok(s)
}

fn e4m3_gradient() -> ParamQuant {
    ParamQuant {
        gradient: Some(Quant::parse("e4m3", "nearest-even").unwrap()),
        ..ParamQuant::none()
    }
}

/// A gradient below e4m3's smallest subnormal (2^-9) flushes to zero unscaled; scaled by
/// 2^10 it is rounded on the grid and unscaled after, so SGD moves the weight by exactly
/// lr·g. e4m3 rounds 2^-12·1.3 · 2^10 = 0.325 to 0.3125 (3 fraction bits), so the step is
/// 0.3125·2^-10 (not 1.3·2^-12): the rounding happens at the scaled magnitude. A scale that
/// is not a power of two (3·2^10) is unscaled by the f32 reciprocal of the scale.
#[test]
fn the_optimizer_rounds_the_scaled_gradient_and_unscales_it_after() -> R {
    let g = 1.3 * 2f32.powi(-12);
    let lr = 0.5f32;
    let sgd = |scale: f32| -> anyhow::Result<f32> {
        let w = Var::new(&[1.0f32], &CPU)?;
        let mut opt = LpSgd::new(
            vec![(w.clone(), e4m3_gradient())],
            SgdParams {
                lr: lr as f64,
                ..SgdParams::default()
            },
        )?;
        // The store holds the gradient of the scaled loss.
        assert!(opt.scaled_step(&store(&w, &[g * scale])?, scale, true)?);
        Ok(vals(w.as_tensor())?[0])
    };
    assert_eq!(sgd(1.0)?, 1.0, "unscaled, the gradient flushes");
    assert_eq!(sgd(1024.0)?, 1.0 - lr * 0.3125 * 2f32.powi(-10));
    // g·3072 = 0.975 rounds to 1.0 in e4m3 (spacing 2^-4 in [0.5, 1)).
    let expected = 1.0 - lr * (1.0f64 / 3072.0) as f32;
    assert_eq!(sgd(3072.0)?, expected);
    Ok(())
}

/// A step whose gradients hold an Inf or NaN (after rounding and unscaling) changes nothing
/// when checked: no weight, no state, no step count; the same step unchecked does.
#[test]
fn a_checked_step_with_a_non_finite_gradient_changes_nothing() -> R {
    for bad in [f32::INFINITY, f32::NAN, 1000.0] {
        // 1000 overflows e4m3 (max 448) to NaN.
        let (w, u) = (Var::new(&[1.0f32, 2.0], &CPU)?, Var::new(&[3.0f32], &CPU)?);
        let params = vec![
            (w.clone(), e4m3_gradient()),
            (u.clone(), ParamQuant::none()),
        ];
        let mut opt = LpAdam::new(params, AdamParams::default())?;
        let mut s = store(&w, &[0.25, 0.5])?;
        s.insert(u.as_tensor(), Tensor::new(&[0.5f32], &CPU)?);
        assert!(opt.scaled_step(&s, 2.0, true)?);
        let before = (vals(w.as_tensor())?, vals(u.as_tensor())?);
        let state_before = opt.state_tensors()?;
        // The bad value is in `w`'s gradient; `u`'s is fine and is not updated either.
        let mut s = store(&w, &[0.25, bad])?;
        s.insert(u.as_tensor(), Tensor::new(&[0.5f32], &CPU)?);
        assert!(!opt.scaled_step(&s, 2.0, true)?, "{bad}");
        assert_eq!(
            (vals(w.as_tensor())?, vals(u.as_tensor())?),
            before,
            "{bad}"
        );
        let state_after = opt.state_tensors()?;
        assert_eq!(state_after.len(), state_before.len());
        for ((n, a), (m, b)) in state_before.iter().zip(&state_after) {
            assert_eq!(n, m);
            assert_eq!(
                vals(&a.to_dtype(DType::F64)?)?,
                vals(&b.to_dtype(DType::F64)?)?,
                "{bad}: {n}"
            );
        }
        // Unchecked, the same step goes ahead (and `u` moves).
        assert!(opt.scaled_step(&s, 2.0, false)?);
        assert_ne!(vals(u.as_tensor())?, before.1, "{bad}");
    }
    Ok(())
}

/// The wrapper around a candle optimizer unscales every gradient it passes on and skips the
/// same way.
#[test]
fn the_wrapper_of_a_candle_optimizer_unscales_and_skips() -> R {
    let w = Var::new(&[1.0f32], &CPU)?;
    let inner = candle_nn::SGD::new(vec![w.clone()], 0.5)?;
    let mut opt = OptimLp::new(inner, vec![(w.clone(), e4m3_gradient())])?;
    let g = 1.3 * 2f32.powi(-12);
    assert!(opt.scaled_step(&store(&w, &[g * 1024.0])?, 1024.0, true)?);
    let moved = 1.0 - 0.5 * 0.3125 * 2f32.powi(-10);
    assert_eq!(vals(w.as_tensor())?, [moved]);
    assert!(!opt.scaled_step(&store(&w, &[f32::NAN])?, 1024.0, true)?);
    assert_eq!(vals(w.as_tensor())?, [moved]);
    Ok(())
}

/// No `loss_scale` is the default: the config text has no such key (so run identities and
/// names stay as they were), `"none"` reads as the default, and a scale of 1 (the scaled
/// path, multiplying the loss by 1) trains the same numbers bit for bit as no scaling under
/// e4m3 roundings.
#[test]
fn no_loss_scale_is_the_default_and_a_scale_of_one_changes_nothing() -> R {
    let plain = QConfig::from_toml(E4M3)?;
    assert_eq!(plain.loss_scale, LossScale::None);
    assert!(
        !plain.to_toml().contains("loss_scale"),
        "{}",
        plain.to_toml()
    );
    let none = QConfig::from_toml(&format!("{E4M3}loss_scale = \"none\"\n"))?;
    assert_eq!(none, plain);
    let data = subset(640, 200);
    let a = train(&data, &options("a", 1), &plain, None, true)?;
    let one = config(E4M3, LossScale::Static(1.0))?;
    let b = train(&data, &options("b", 1), &one, None, true)?;
    assert_eq!(a[0].loss_scale, None);
    assert_eq!(b[0].loss_scale, Some(1.0));
    let strip = |r: &[qcandle::train::EpochRecord]| {
        without_time(r)
            .into_iter()
            .map(|e| (e.train_loss, e.test_loss, e.top1, e.top5))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&a), strip(&b));
    Ok(())
}

/// In f32 (nothing rounded) a power-of-two scale is exact: every backward value is the
/// unscaled one times 2^k and the unscaling divides it back exactly, so the weights equal
/// those of no scaling bit for bit, for SGD and Adam. A scale of 3 is not exact, and the
/// weights then differ (the comparison can tell).
#[test]
fn a_power_of_two_static_scale_gives_the_same_weights_in_f32() -> R {
    let data = subset(512, 100);
    for optimizer in [OptimizerKind::Sgd, OptimizerKind::Adam] {
        let opts = TrainOptions {
            optimizer,
            lr: if optimizer == OptimizerKind::Sgd {
                0.05
            } else {
                1e-3
            },
            ..options("f32", 1)
        };
        let run = |scale: LossScale| -> anyhow::Result<Vec<(String, Vec<f32>)>> {
            let mut trainer = Trainer::new(opts.clone(), config("", scale)?)?;
            trainer.train_epoch(&data, 1, |_, _, _| {})?;
            weights(&trainer)
        };
        let reference = run(LossScale::None)?;
        for k in [-3, 10, 24] {
            let w = run(LossScale::Static(2f32.powi(k)))?;
            assert!(
                w == reference,
                "{optimizer}: scale 2^{k} changed the weights"
            );
        }
        assert!(
            run(LossScale::Static(3.0))? != reference,
            "{optimizer}: scale 3 left the weights bit for bit unchanged"
        );
    }
    Ok(())
}

/// An overflow in the backward pass (e4m3 errors above 448 round to NaN) skips the step:
/// the weights stay bit for bit, the scale halves and the skip is counted; then steps are
/// taken. e4m3 at 2^16 overflows (the output error reaches 2^16/64 = 1024).
#[test]
fn dynamic_scaling_skips_an_overflowing_step_and_halves_the_scale() -> R {
    let data = subset(64 * 8, 100);
    let mut trainer = Trainer::new(options("dyn", 1), config(E4M3, dynamic(65536.0, 2000))?)?;
    let batches: Vec<(Tensor, Tensor)> = data.train_batches(64, 1, 5)?.collect::<Result<_, _>>()?;
    let mut scale = 65536.0;
    let mut skipped = 0;
    let mut taken = 0;
    for (images, labels) in &batches {
        let before = weights(&trainer)?;
        trainer.step(images, labels)?;
        let scaler = trainer.loss_scaler().expect("a scaler");
        if scaler.skipped() > skipped {
            assert_eq!(
                weights(&trainer)?,
                before,
                "a skipped step moved the weights"
            );
            assert_eq!(scaler.scale(), scale / 2.0);
            assert_eq!(scaler.good_steps(), 0);
            skipped += 1;
            scale /= 2.0;
        } else {
            assert_ne!(weights(&trainer)?, before, "a taken step left the weights");
            assert_eq!(scaler.scale(), scale);
            taken += 1;
            assert_eq!(scaler.good_steps(), taken);
        }
        assert_eq!(scaler.skipped(), skipped);
    }
    assert!(
        skipped >= 1 && taken >= 1,
        "{skipped} skipped, {taken} taken"
    );
    Ok(())
}

/// Without overflows (f32) the scale grows by the growth factor after each `growth_interval`
/// steps and not before.
#[test]
fn dynamic_scaling_grows_after_the_growth_interval() -> R {
    let data = subset(64 * 7, 100);
    let setting = LossScale::Dynamic(DynamicScale {
        init: 4.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 3,
    });
    let mut trainer = Trainer::new(options("grow", 1), config("", setting)?)?;
    let mut scales = Vec::new();
    for batch in data.train_batches(64, 1, 5)? {
        let (images, labels) = batch?;
        trainer.step(&images, &labels)?;
        let s = trainer.loss_scaler().unwrap();
        scales.push((s.scale(), s.good_steps(), s.skipped()));
    }
    assert_eq!(
        scales,
        [
            (4.0, 1, 0),
            (4.0, 2, 0),
            (8.0, 0, 0),
            (8.0, 1, 0),
            (8.0, 2, 0),
            (16.0, 0, 0),
            (16.0, 1, 0)
        ]
    );
    Ok(())
}

/// A run with dynamic scaling stopped after epoch 1 and resumed equals the uninterrupted run
/// (records, scale, skipped steps, model): the scaler's state is in the checkpoint. The
/// growth interval (5) does not divide the 10 steps of an epoch plus the skips, so the state
/// at the epoch's end is not a fresh one. The directory refuses the run without scaling.
#[test]
fn a_resumed_dynamic_run_equals_an_uninterrupted_one() -> R {
    let data = subset(640, 200);
    let cfg = config(E4M3, dynamic(65536.0, 5))?;
    let dir = tempfile::tempdir()?;
    let (straight, resumed) = (dir.path().join("straight"), dir.path().join("resumed"));
    let full = train(&data, &options("ls", 3), &cfg, Some(&straight), true)?;
    train(&data, &options("ls", 1), &cfg, Some(&resumed), true)?;
    let checkpoint = read_tensors(&resumed.join("checkpoint.safetensors"))?;
    let names: Vec<&str> = checkpoint.iter().map(|(n, _)| n.as_str()).collect();
    for entry in ["scaler.scale", "scaler.good_steps", "scaler.skipped_steps"] {
        assert!(names.contains(&entry), "{entry} missing from {names:?}");
    }
    let rest = train(&data, &options("ls", 3), &cfg, Some(&resumed), true)?;
    assert_eq!(without_time(&rest), without_time(&full));
    assert_eq!(model(&straight)?, model(&resumed)?);
    assert!(full[0].skipped_steps.unwrap() >= 1, "{full:?}");
    // The scale changes during the run (it backs off, then grows every 5 good steps).
    let scales: Vec<f32> = full.iter().map(|r| r.loss_scale.unwrap()).collect();
    assert!(scales.windows(2).any(|w| w[0] != w[1]), "{scales:?}");
    let csv = std::fs::read_to_string(resumed.join("metrics.csv"))?;
    assert!(
        csv.starts_with("epoch,train_loss,test_loss,top1,top5,seconds,loss_scale,skipped_steps\n")
    );
    let e = train(
        &data,
        &options("ls", 4),
        &QConfig::from_toml(E4M3)?,
        Some(&resumed),
        true,
    )
    .unwrap_err();
    assert!(e.to_string().contains("different run"), "{e}");
    Ok(())
}

/// e4m3 errors flush to zero and the network stays at chance; with dynamic loss scaling the
/// same run learns.
#[test]
fn e4m3_everywhere_learns_with_dynamic_loss_scaling_only() -> R {
    let data = subset(3000, 1000);
    let without = train(
        &data,
        &options("e4m3", 1),
        &config(E4M3, LossScale::None)?,
        None,
        true,
    )?;
    let with = train(
        &data,
        &options("e4m3-ls", 1),
        &config(E4M3, LossScale::Dynamic(DynamicScale::default()))?,
        None,
        true,
    )?;
    println!("without: {without:?}\nwith: {with:?}");
    // Chance is 10% top-1.
    assert!(without[0].top1 < 20.0, "{without:?}");
    assert!(with[0].top1 > 40.0, "{with:?}");
    Ok(())
}

/// The config's `loss_scale` in each spelling, written back and read again unchanged, and
/// every invalid value an error naming `loss_scale` and what is wrong.
#[test]
fn loss_scale_settings_read_write_and_invalid_ones_are_named() -> R {
    let read = |line: &str| QConfig::from_toml(&format!("{E4M3}{line}\n"));
    let cases = [
        ("loss_scale = 1024", LossScale::Static(1024.0)),
        ("loss_scale = 0.5", LossScale::Static(0.5)),
        (
            "loss_scale = \"dynamic\"",
            LossScale::Dynamic(DynamicScale::default()),
        ),
        (
            "loss_scale = \"dynamic:growth_interval=7\"",
            dynamic(65536.0, 7),
        ),
        (
            "loss_scale = { init = 256.0, growth_interval = 7 }",
            dynamic(256.0, 7),
        ),
    ];
    for (line, expected) in cases {
        let c = read(line)?;
        assert_eq!(c.loss_scale, expected, "{line}");
        assert_eq!(QConfig::from_toml(&c.to_toml())?, c, "{line}");
    }
    let invalid = [
        ("loss_scale = 0", "static scale"),
        ("loss_scale = -4", "static scale"),
        ("loss_scale = \"nan\"", "static scale"),
        ("loss_scale = 1e40", "static scale"),
        ("loss_scale = { init = 0.0 }", "init"),
        ("loss_scale = { growth_factor = 0.5 }", "growth_factor"),
        ("loss_scale = { backoff_factor = 1.5 }", "backoff_factor"),
        ("loss_scale = { growth_interval = 0 }", "growth_interval"),
        ("loss_scale = { growth_interval = 2.5 }", "growth_interval"),
        ("loss_scale = { speed = 2 }", "unknown parameter"),
        ("loss_scale = { init = \"big\" }", "expected a number"),
        ("loss_scale = true", "expected a number"),
        ("loss_scale = \"huge\"", "expected none"),
    ];
    for (line, named) in invalid {
        let e = read(line).unwrap_err().to_string();
        assert!(e.contains("loss_scale") && e.contains(named), "{line}: {e}");
    }
    Ok(())
}
