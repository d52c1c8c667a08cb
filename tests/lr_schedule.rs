//! The learning-rate schedule (warmup, cosine and linear decay) and the optimizer settings
//! of a training run: the rates are the formula's, training runs each step at its rate with
//! the given weight decay and beta2, a resumed run continues the schedule, and runs without
//! these settings keep their identity.

#[path = "common/training.rs"]
mod training;

use candle_core::Module;
use candle_nn::VarMap;
use qcandle::data::Dataset;
use qcandle::io::read_tensors;
use qcandle::nn::QConfig;
use qcandle::optim::{AdamWParams, Decay, DecayShape, LpAdamW, LrSchedule, ParamQuant};
use qcandle::sweep::{Plan, Spec};
use qcandle::train::{train, OptimizerKind, RunRecord, TrainOptions, Trainer};
use training::without_time;

type R = anyhow::Result<()>;

fn schedule(warmup: usize, decay: Option<(DecayShape, usize)>) -> LrSchedule {
    LrSchedule {
        warmup,
        decay: decay.map(|(shape, epochs)| Decay { shape, epochs }),
    }
}

#[test]
fn warmup_rises_linearly_then_holds_the_base_rate() {
    let s = schedule(8, None);
    for step in 0..8 {
        // (s + 1) / W with W a power of two: exact in binary.
        assert_eq!(
            s.lr(0.5, step, 100),
            0.5 * (step + 1) as f64 / 8.0,
            "{step}"
        );
    }
    for step in 8..500 {
        assert_eq!(s.lr(3e-3, step, 100), 3e-3, "{step}");
    }
    let constant = LrSchedule::default();
    assert!(constant.is_constant());
    assert!(!s.is_constant());
    for step in [0, 1, 99, 10_000] {
        assert_eq!(constant.lr(1e-3, step, 10), 1e-3);
    }
}

#[test]
fn cosine_and_linear_decays_follow_their_formulas() {
    // 7 epochs of 10 steps: the decay runs from step W = 20 to T = 70.
    let (w, per_epoch, epochs) = (20usize, 10usize, 7usize);
    let t = epochs * per_epoch;
    let cosine = schedule(w, Some((DecayShape::Cosine, epochs)));
    let linear = schedule(w, Some((DecayShape::Linear, epochs)));
    for step in 0..w {
        let warm = (step + 1) as f64 / w as f64;
        assert_eq!(cosine.factor(step, per_epoch), warm);
        assert_eq!(linear.factor(step, per_epoch), warm);
    }
    for step in w..t + 30 {
        let done = (step.min(t) - w) as f64 / (t - w) as f64;
        // (1 + cos πp) / 2 = cos²(πp / 2): the same value by another expression.
        let half = (std::f64::consts::FRAC_PI_2 * done).cos();
        let got = cosine.factor(step, per_epoch);
        assert!((got - half * half).abs() <= 1e-15, "{step}: {got}");
        // (T − s) / (T − W), from integers.
        let left = (t - step.min(t)) as f64 / (t - w) as f64;
        let got = linear.factor(step, per_epoch);
        assert!((got - left).abs() <= 1e-15, "{step}: {got}");
    }
    assert_eq!(cosine.factor(w, per_epoch), 1.0);
    assert!((cosine.factor(w + (t - w) / 2, per_epoch) - 0.5).abs() <= 1e-15);
    assert_eq!(cosine.factor(t, per_epoch), 0.0);
    assert_eq!(linear.factor(t + 5, per_epoch), 0.0);
    assert!(cosine.factor(t - 1, per_epoch) > 0.0);
    // Decreasing after the warmup.
    for step in w..t {
        assert!(cosine.factor(step + 1, per_epoch) < cosine.factor(step, per_epoch));
    }
}

#[test]
fn a_decay_that_ends_before_the_warmup_is_refused() {
    let s = schedule(100, Some((DecayShape::Cosine, 2)));
    let e = s.validate(50).unwrap_err();
    assert!(e.contains("step 100") && e.contains("100 warmup"), "{e}");
    assert!(s.validate(51).is_ok());
    let e = schedule(0, Some((DecayShape::Linear, 0)))
        .validate(10)
        .unwrap_err();
    assert!(e.contains("decay-epochs"), "{e}");
}

/// The transformer on the first 96 modadd pairs, batch 32 (3 steps per epoch), AdamW.
fn transformer_options(epochs: usize) -> TrainOptions {
    TrainOptions {
        model: "transformer".into(),
        config_name: "float32".into(),
        epochs,
        batch: 32,
        lr: 3e-3,
        optimizer: OptimizerKind::AdamW,
        seed: 4,
        train_limit: Some(96),
        device: qcandle::device::DeviceSpec::Cpu,
        schedule: LrSchedule::default(),
        weight_decay: None,
        beta2: None,
    }
}

fn modadd() -> Dataset {
    training::threads::tune_cpu_threads();
    qcandle::data::modadd::modadd(qcandle::data::modadd::MODADD_P).expect("modadd")
}

fn model_values(dir: &std::path::Path) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    read_tensors(&dir.join("model.safetensors"))?
        .into_iter()
        .map(|(n, t)| Ok((n, t.flatten_all()?.to_vec1::<f32>()?)))
        .collect()
}

fn varmap_values(varmap: &VarMap) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    let mut values: Vec<(String, Vec<f32>)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(n, v)| Ok((n.clone(), v.as_tensor().flatten_all()?.to_vec1::<f32>()?)))
        .collect::<anyhow::Result<_>>()?;
    values.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(values)
}

#[test]
fn training_runs_each_step_at_its_scheduled_rate_with_the_given_adamw_settings() -> R {
    let data = modadd();
    let epochs = 3;
    let options = TrainOptions {
        schedule: schedule(4, Some((DecayShape::Cosine, epochs))),
        weight_decay: Some(1.0),
        beta2: Some(0.98),
        ..transformer_options(epochs)
    };
    let dir = tempfile::tempdir()?;
    train(&data, &options, &QConfig::float32(), Some(dir.path()), true)?;

    // The same model stepped by hand: an LpAdamW built here with the settings, the rate of
    // each step computed here (warmup (s+1)/4, then (1 + cos(π (s − 4)/5)) / 2 over the 9
    // steps of the 3 epochs).
    let constant = transformer_options(epochs);
    let reference = Trainer::new(constant.clone(), QConfig::float32())?;
    let vars = reference.varmap().all_vars();
    let params = vars
        .into_iter()
        .map(|v| (v, ParamQuant::default()))
        .collect();
    let mut optimizer = LpAdamW::new(
        params,
        AdamWParams {
            lr: 1.0,
            beta2: 0.98,
            weight_decay: 1.0,
            ..Default::default()
        },
    )?;
    let subset = data.subset(96, usize::MAX)?;
    let mut rates = Vec::new();
    for epoch in 1..=epochs {
        for (i, batch) in subset.train_batches(32, epoch, constant.seed)?.enumerate() {
            let s = (epoch - 1) * 3 + i;
            let factor = if s < 4 {
                (s + 1) as f64 / 4.0
            } else {
                (1.0 + (std::f64::consts::PI * ((s - 4) as f64 / 5.0)).cos()) / 2.0
            };
            let rate = 3e-3 * factor;
            rates.push(rate);
            optimizer.set_learning_rate(rate);
            let (images, labels) = batch?;
            let logits = reference.model().forward(&images)?;
            optimizer.backward_step(&candle_nn::loss::cross_entropy(&logits, &labels)?)?;
        }
    }
    assert_eq!(rates.len(), 9);
    assert_eq!(
        model_values(dir.path())?,
        varmap_values(reference.varmap())?
    );
    Ok(())
}

#[test]
fn a_scheduled_run_interrupted_and_resumed_equals_an_uninterrupted_one() -> R {
    let data = modadd();
    let options = |epochs| TrainOptions {
        schedule: schedule(5, Some((DecayShape::Linear, 4))),
        ..transformer_options(epochs)
    };
    let dir = tempfile::tempdir()?;
    let (straight, resumed) = (dir.path().join("straight"), dir.path().join("resumed"));
    let config = QConfig::load("bf16")?;
    let full = train(&data, &options(4), &config, Some(&straight), true)?;
    let first = train(&data, &options(2), &config, Some(&resumed), true)?;
    assert_eq!(first.len(), 2);
    let rest = train(&data, &options(4), &config, Some(&resumed), true)?;
    assert_eq!(without_time(&rest), without_time(&full));
    assert_eq!(model_values(&straight)?, model_values(&resumed)?);
    // Without the schedule the same run ends elsewhere (the schedule is in effect).
    let plain = dir.path().join("plain");
    train(&data, &transformer_options(4), &config, Some(&plain), true)?;
    assert_ne!(model_values(&plain)?, model_values(&straight)?);
    Ok(())
}

#[test]
fn a_changed_schedule_or_optimizer_setting_is_a_different_run() -> R {
    let data = modadd();
    let dir = tempfile::tempdir()?;
    let config = QConfig::float32();
    let with = TrainOptions {
        schedule: schedule(2, None),
        ..transformer_options(1)
    };
    train(&data, &with, &config, Some(dir.path()), true)?;
    for (other, named) in [
        (transformer_options(2), "lr schedule"),
        (
            TrainOptions {
                schedule: schedule(2, Some((DecayShape::Cosine, 2))),
                ..transformer_options(2)
            },
            "lr schedule",
        ),
        (
            TrainOptions {
                weight_decay: Some(1.0),
                ..with.clone()
            },
            "weight-decay",
        ),
        (
            TrainOptions {
                beta2: Some(0.98),
                ..with.clone()
            },
            "beta2",
        ),
    ] {
        let e = train(&data, &other, &config, Some(dir.path()), true).unwrap_err();
        assert!(e.to_string().contains(named), "{named}: {e}");
    }
    // The same schedule resumes with more epochs.
    let more = TrainOptions {
        epochs: 2,
        ..with.clone()
    };
    assert_eq!(
        train(&data, &more, &config, Some(dir.path()), true)?.len(),
        2
    );
    Ok(())
}

#[test]
fn bad_settings_are_refused_by_name() {
    let bad = [
        (
            TrainOptions {
                beta2: Some(1.0),
                ..transformer_options(1)
            },
            "beta2",
        ),
        (
            TrainOptions {
                beta2: Some(0.98),
                optimizer: OptimizerKind::Sgd,
                ..transformer_options(1)
            },
            "sgd has none",
        ),
        (
            TrainOptions {
                weight_decay: Some(-1.0),
                ..transformer_options(1)
            },
            "weight-decay",
        ),
        (
            TrainOptions {
                schedule: schedule(0, Some((DecayShape::Cosine, 0))),
                ..transformer_options(1)
            },
            "decay-epochs",
        ),
    ];
    for (options, named) in bad {
        let e = options.validate().unwrap_err();
        assert!(e.to_string().contains(named), "{named}: {e}");
    }
    // A decay ending within the warmup: refused once the steps per epoch are known (3 here).
    let e = train(
        &modadd(),
        &TrainOptions {
            schedule: schedule(9, Some((DecayShape::Cosine, 3))),
            ..transformer_options(3)
        },
        &QConfig::float32(),
        None,
        true,
    )
    .unwrap_err();
    assert!(e.to_string().contains("9 warmup steps"), "{e}");
}

/// A spec's one float32 point; its digest below was computed before the schedule and
/// optimizer settings existed (`qcandle sweep run` of this spec wrote it to plan.json).
const TINY: &str = r#"
name = "tiny"
[base]
model = "transformer"
data = "modadd"
epochs = 1
batch = 64
lr = 3e-3
optimizer = "adamw"
train-limit = 128
[[grid]]
config = ["float32"]
seed = [0]
"#;

/// `options` of the run.json that the run of TINY's point wrote before these settings
/// existed.
const OLD_OPTIONS: &str = r#"{
  "model": "transformer",
  "config_name": "float32",
  "epochs": 1,
  "batch": 64,
  "lr": 0.003,
  "optimizer": "adamw",
  "seed": 0,
  "train_limit": 128,
  "device": "cpu"
}"#;

fn plan(text: &str) -> anyhow::Result<Plan> {
    Plan::expand(&Spec::parse(text, std::path::Path::new("spec.toml"))?)
}

#[test]
fn runs_without_the_new_settings_keep_their_identity_and_digest() -> R {
    let point = &plan(TINY)?.points[0];
    assert_eq!(point.settings.digest(), "02354fd0ab61008f");
    assert_eq!(point.name, "float32-s0");
    let options = &point.settings.options;
    assert_eq!(serde_json::to_string_pretty(options)?, OLD_OPTIONS);
    let old: TrainOptions = serde_json::from_str(OLD_OPTIONS)?;
    assert_eq!(&old, options);
    assert!(old.schedule.is_constant());
    // A run.json written before, read now: the same run.
    let record = RunRecord {
        options: old,
        config: String::new(),
        data: String::new(),
        dataset: String::new(),
        data_sha256: String::new(),
        epochs: Vec::new(),
        files: Default::default(),
    };
    let now = RunRecord {
        options: options.clone(),
        ..record.clone()
    };
    assert!(qcandle::train::identity_differences(&record, &now).is_empty());
    Ok(())
}

#[test]
fn a_spec_sets_the_schedule_and_optimizer_settings() -> R {
    let spec = TINY.replace(
        "train-limit = 128",
        "train-limit = 128\nwarmup = 50\ndecay = \"cosine\"\nweight-decay = 1.0\nbeta2 = 0.98",
    );
    let point = &plan(&spec)?.points[0];
    let o = &point.settings.options;
    assert_eq!(o.schedule, schedule(50, Some((DecayShape::Cosine, 1))));
    assert_eq!((o.weight_decay, o.beta2), (Some(1.0), Some(0.98)));
    assert_ne!(point.settings.digest(), "02354fd0ab61008f");
    let json = serde_json::to_value(o)?;
    assert_eq!(json["schedule"]["warmup"], 50);
    assert_eq!(json["beta2"], 0.98);
    // decay-epochs fixes the end; as an axis it names the points.
    let spec = TINY
        .replace("train-limit = 128", "train-limit = 128\ndecay = \"linear\"")
        .replace("seed = [0]", "seed = [0]\ndecay-epochs = [3, 5]");
    let axis = plan(&spec)?;
    let ends: Vec<_> = axis
        .points
        .iter()
        .map(|p| p.settings.options.schedule.decay.map(|d| d.epochs))
        .collect();
    assert_eq!(ends, [Some(3), Some(5)]);
    assert_eq!(axis.points[1].name, "float32-s0-decay-e5");
    for (line, named) in [
        ("decay = \"step\"", "unknown decay `step`"),
        ("decay-epochs = 3", "decay is `none`"),
        ("beta2 = 1.5", "beta2 must lie in [0, 1)"),
        (
            "weight-decay = -0.1",
            "weight decay must be finite and >= 0",
        ),
        ("warmup = -1", "warmup"),
    ] {
        let text = TINY.replace("train-limit = 128", &format!("train-limit = 128\n{line}"));
        let e = format!("{:#}", plan(&text).unwrap_err());
        assert!(e.contains(named), "{line}: {e}");
    }
    Ok(())
}
