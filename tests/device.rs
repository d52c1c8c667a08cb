//! Training and post-training quantization on a chosen device (`--device`).
//!
//! On any machine: the spellings of a device, its serialized form, runs written before the
//! device was recorded, the device as part of a run's identity, and the command line's
//! errors for a device it cannot open. With a CUDA device (the `cuda` feature and a GPU):
//! training and PTQ on it against the CPU. Without one, those tests print
//! "skipped: no CUDA device" and pass.

/// The shared training set-up: the embedded subset, short LeNet-5 runs.
#[path = "common/training.rs"]
mod training;

use std::path::Path;
use std::process::{Command, Output};

use candle_core::{DType, Device, Tensor};
use qcandle::data::Dataset;
use qcandle::device::{DeviceError, DeviceSpec};
use qcandle::nn::QConfig;
use qcandle::train::{
    identity_differences, load_run, train, OptimizerKind, RunRecord, TrainOptions, Trainer,
};

type R = anyhow::Result<()>;

fn qcandle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qcandle"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

use training::subset;

fn options(config: &str, device: DeviceSpec) -> TrainOptions {
    TrainOptions {
        batch: 32,
        device,
        ..training::lenet5_options(config, 1, 5)
    }
}

fn record(device: DeviceSpec) -> RunRecord {
    RunRecord {
        options: options("float32", device),
        config: QConfig::float32().to_toml(),
        data: "embedded".into(),
        dataset: "fashion-mnist".into(),
        data_sha256: "ab".repeat(32),
        epochs: Vec::new(),
        files: Default::default(),
    }
}

#[test]
fn every_spelling_parses_to_its_device_and_displays_canonically() -> R {
    let cases = [
        ("cpu", DeviceSpec::Cpu, "cpu"),
        ("cuda", DeviceSpec::Cuda(0), "cuda:0"),
        ("cuda:0", DeviceSpec::Cuda(0), "cuda:0"),
        ("cuda:1", DeviceSpec::Cuda(1), "cuda:1"),
        ("cuda:12", DeviceSpec::Cuda(12), "cuda:12"),
        ("cuda:007", DeviceSpec::Cuda(7), "cuda:7"),
    ];
    for (spelling, device, canonical) in cases {
        let parsed: DeviceSpec = spelling.parse()?;
        assert_eq!(parsed, device, "{spelling}");
        assert_eq!(parsed.to_string(), canonical, "{spelling}");
        assert_eq!(canonical.parse::<DeviceSpec>()?, device, "{canonical}");
    }
    assert_eq!(DeviceSpec::default(), DeviceSpec::Cpu);
    assert_eq!(DeviceSpec::Cpu.kind(), "cpu");
    assert_eq!(DeviceSpec::Cuda(0).kind(), "cuda");
    assert_eq!(DeviceSpec::Cuda(3).kind(), "cuda");
    Ok(())
}

#[test]
fn a_bad_spelling_is_an_error_naming_it_and_listing_the_spellings() {
    let too_big = format!("cuda:{}0", usize::MAX);
    let bad = [
        "",
        "gpu",
        "CPU",
        "Cuda",
        " cpu",
        "cpu ",
        "cuda:",
        "cuda:-1",
        "cuda:+1",
        "cuda:x",
        "cuda:1:2",
        "cuda0",
        "cuda:1.0",
        too_big.as_str(),
    ];
    for spelling in bad {
        let e = spelling
            .parse::<DeviceSpec>()
            .expect_err(&format!("`{spelling}` must be refused"));
        assert_eq!(e, DeviceError::Unknown(spelling.to_string()));
        let message = e.to_string();
        assert!(message.contains(&format!("`{spelling}`")), "{message}");
        for listed in ["cpu", "cuda", "cuda:N"] {
            assert!(message.contains(listed), "{message}");
        }
    }
}

#[test]
fn a_device_is_serialized_as_its_canonical_spelling() -> R {
    for device in [DeviceSpec::Cpu, DeviceSpec::Cuda(0), DeviceSpec::Cuda(2)] {
        let json = serde_json::to_string(&device)?;
        assert_eq!(json, format!("\"{device}\""));
        assert_eq!(serde_json::from_str::<DeviceSpec>(&json)?, device);
    }
    assert_eq!(
        serde_json::from_str::<DeviceSpec>("\"cuda\"")?,
        DeviceSpec::Cuda(0)
    );
    let e = serde_json::from_str::<DeviceSpec>("\"tpu\"").unwrap_err();
    assert!(e.to_string().contains("unknown device `tpu`"), "{e}");
    assert!(serde_json::from_str::<DeviceSpec>("0").is_err());
    Ok(())
}

#[test]
fn the_cpu_opens_as_candles_cpu_device() -> R {
    assert!(DeviceSpec::Cpu.open()?.is_cpu());
    Ok(())
}

#[cfg(not(feature = "cuda"))]
#[test]
fn a_cuda_device_without_cuda_support_is_an_error_saying_how_to_get_it() {
    for device in [DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)] {
        let e = device.open().unwrap_err();
        assert_eq!(e, DeviceError::NoCudaSupport(device));
        let message = e.to_string();
        assert!(message.starts_with(&format!("{device}: ")), "{message}");
        assert!(message.contains("built without CUDA support"), "{message}");
        assert!(message.contains("--features cuda"), "{message}");
    }
}

#[cfg(feature = "cuda")]
#[test]
fn a_gpu_the_machine_lacks_is_an_error_naming_it_with_the_reason() {
    let device = DeviceSpec::Cuda(999);
    let e = device.open().unwrap_err();
    let DeviceError::Unavailable {
        device: named,
        reason,
    } = &e
    else {
        panic!("expected Unavailable, got {e:?}")
    };
    assert_eq!(*named, device);
    assert!(!reason.is_empty());
    assert!(e.to_string().starts_with("cannot open cuda:999: "), "{e}");
}

#[test]
fn options_written_before_the_device_was_recorded_read_as_cpu() -> R {
    let mut json = serde_json::to_value(options("float32", DeviceSpec::Cuda(1)))?;
    assert_eq!(json["device"], "cuda:1");
    json.as_object_mut().unwrap().remove("device");
    let old: TrainOptions = serde_json::from_value(json)?;
    assert_eq!(old.device, DeviceSpec::Cpu);
    Ok(())
}

#[test]
fn a_run_json_without_a_device_reads_as_cpu_and_resumes_on_the_cpu() -> R {
    let data = subset(64, 50);
    let dir = tempfile::tempdir()?;
    let mut opts = options("float32", DeviceSpec::Cpu);
    opts.model = "mlp".into();
    train(&data, &opts, &QConfig::float32(), Some(dir.path()), true)?;
    let path = dir.path().join("run.json");
    let mut run: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    assert_eq!(run["options"]["device"], "cpu");
    run["options"].as_object_mut().unwrap().remove("device");
    std::fs::write(&path, serde_json::to_string_pretty(&run)?)?;
    assert_eq!(load_run(dir.path())?.options.device, DeviceSpec::Cpu);
    opts.epochs = 2;
    let records = train(&data, &opts, &QConfig::float32(), Some(dir.path()), true)?;
    assert_eq!(records.len(), 2);
    Ok(())
}

#[test]
fn the_device_kind_is_part_of_a_run_and_the_gpu_number_is_not() {
    let cpu = record(DeviceSpec::Cpu);
    let (cuda0, cuda1) = (record(DeviceSpec::Cuda(0)), record(DeviceSpec::Cuda(1)));
    assert_eq!(identity_differences(&cpu, &cpu), Vec::<String>::new());
    assert_eq!(
        identity_differences(&cpu, &cuda0),
        ["device: cpu in the directory, cuda now"]
    );
    assert_eq!(
        identity_differences(&cuda1, &cpu),
        ["device: cuda in the directory, cpu now"]
    );
    assert_eq!(identity_differences(&cuda0, &cuda1), Vec::<String>::new());
}

/// `qcandle train --device <device>` on a tiny run into `out`.
fn train_on(device: &str, out: &Path) -> Output {
    let out = out.to_str().expect("a UTF-8 path");
    qcandle(&[
        "train",
        "--model",
        "mlp",
        "--data",
        "embedded",
        "--epochs",
        "1",
        "--train-limit",
        "64",
        "--quiet",
        "--device",
        device,
        "--out",
        out,
    ])
}

#[test]
fn train_on_a_device_it_cannot_open_fails_with_status_1_and_creates_no_run_directory() -> R {
    let dir = tempfile::tempdir()?;
    #[cfg(not(feature = "cuda"))]
    let devices = [
        (
            "cuda",
            "cuda:0: this qcandle was built without CUDA support",
        ),
        (
            "cuda:3",
            "cuda:3: this qcandle was built without CUDA support",
        ),
    ];
    #[cfg(feature = "cuda")]
    let devices = [("cuda:999", "cannot open cuda:999: ")];
    for (device, expected) in devices {
        let out = dir.path().join(format!("run-{device}"));
        let o = train_on(device, &out);
        assert_eq!(o.status.code(), Some(1), "{device}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{device}: {}", stderr(&o));
        assert!(!out.exists(), "{device}: {} was created", out.display());
    }
    Ok(())
}

#[test]
fn train_refuses_a_misspelt_device_listing_the_spellings() -> R {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    let o = train_on("gpu", &out);
    assert!(matches!(o.status.code(), Some(1 | 2)), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unknown device `gpu`"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("cuda:N"), "{}", stderr(&o));
    assert!(!out.exists());
    Ok(())
}

#[test]
fn train_on_the_cpu_says_so_and_records_it() -> R {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    let o = train_on("cpu", &out);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(", on cpu -> "), "{}", stderr(&o));
    assert_eq!(load_run(&out)?.options.device, DeviceSpec::Cpu);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
#[test]
fn resuming_a_cpu_run_on_cuda_is_refused_before_anything_is_touched() -> R {
    // Without CUDA support the device cannot be opened, so the command stops there; the
    // comparison with the directory's run is `the_device_kind_is_part_of_a_run_...`.
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    assert!(train_on("cpu", &out).status.success());
    let before = std::fs::read(out.join("run.json"))?;
    let o = train_on("cuda", &out);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("cuda:0"), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("run.json"))?, before);
    Ok(())
}

#[test]
fn ptq_on_a_device_it_cannot_open_fails_with_status_1_before_reading_anything() -> R {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("ptq");
    let model = dir.path().join("model.safetensors");
    let device = if cfg!(feature = "cuda") {
        "cuda:999"
    } else {
        "cuda"
    };
    let o = qcandle(&[
        "ptq",
        "--model",
        model.to_str().unwrap(),
        "--data",
        "embedded",
        "--device",
        device,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("cuda:"), "{e}");
    assert!(
        e.contains("built without CUDA support") || e.contains("cannot open cuda:999"),
        "{e}"
    );
    assert!(!out.exists());
    Ok(())
}

// ---- On a CUDA device ----

/// The first CUDA device, or None (with the skip message) where there is none.
fn gpu() -> Option<Device> {
    match DeviceSpec::Cuda(0).open() {
        Ok(dev) => Some(dev),
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// The losses of the first epoch's steps (the running mean after each) and the variables
/// afterwards (on the CPU, sorted by name) of LeNet-5 under `config` on `device`.
fn steps(config: &str, device: DeviceSpec, data: &Dataset) -> anyhow::Result<Trained> {
    let mut opts = options(config, device);
    // SGD: its update is proportional to the gradient, so a difference in the last bits of
    // a gradient stays as small in the weights (Adam's first steps move every weight by
    // about lr whatever the gradient's size, so a gradient near zero could move either way).
    opts.optimizer = OptimizerKind::Sgd;
    opts.lr = 0.02;
    let mut trainer = Trainer::new(opts, QConfig::load(config)?)?;
    let initial = variables(&trainer)?;
    let mut losses = Vec::new();
    trainer.train_epoch(data, 1, |_, _, mean| losses.push(mean))?;
    Ok(Trained {
        initial,
        losses,
        weights: variables(&trainer)?,
    })
}

struct Trained {
    initial: Vec<(String, Vec<f32>)>,
    losses: Vec<f64>,
    weights: Vec<(String, Vec<f32>)>,
}

fn variables(trainer: &Trainer) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    let data = trainer.varmap().data().lock().unwrap();
    let mut vars = data
        .iter()
        .map(|(name, var)| {
            let t = var.as_tensor().to_device(&Device::Cpu)?;
            Ok((name.clone(), t.flatten_all()?.to_vec1::<f32>()?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(vars)
}

fn bits(vars: &[(String, Vec<f32>)]) -> Vec<(String, Vec<u32>)> {
    vars.iter()
        .map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// Trains a few steps on the CPU and on the GPU and checks that the losses agree to
/// `loss_rel` (relative) and every weight to `weight_abs`.
fn cuda_matches_cpu(config: &str, loss_rel: f64, weight_abs: f32) -> R {
    if gpu().is_none() {
        return Ok(());
    }
    let data = subset(256, 100);
    let cpu = steps(config, DeviceSpec::Cpu, &data)?;
    let cuda = steps(config, DeviceSpec::Cuda(0), &data)?;
    // Initialisation (Philox on the host) and its rounding (the quantize kernel) are exact.
    assert_eq!(bits(&cpu.initial), bits(&cuda.initial), "{config}");
    assert_eq!(cpu.losses.len(), 8);
    assert_eq!(cuda.losses.len(), cpu.losses.len());
    for (i, (a, b)) in cpu.losses.iter().zip(&cuda.losses).enumerate() {
        assert!(
            (a - b).abs() <= loss_rel * a.abs(),
            "{config}, step {i}: cpu loss {a}, cuda {b}"
        );
    }
    let mut moved = 0usize;
    for (((name, c), (_, g)), (_, start)) in cpu.weights.iter().zip(&cuda.weights).zip(&cpu.initial)
    {
        for (i, (x, y)) in c.iter().zip(g).enumerate() {
            assert!(
                (x - y).abs() <= weight_abs,
                "{config}: {name}[{i}]: cpu {x}, cuda {y}"
            );
        }
        moved += c.iter().zip(start).filter(|(x, s)| x != s).count();
    }
    // The comparison means something only if training moved the weights.
    assert!(moved > 100, "{config}: only {moved} weights changed");
    Ok(())
}

/// Tolerances: candle's CUDA convolution and matrix product sum in another order than the
/// CPU's, so each sum differs in its last bits (relative 1e-6 for these sizes); over eight
/// SGD steps such differences stay far below 1e-4 relative in the loss and 1e-4 in a
/// weight (LeNet's weights are below 1 in magnitude).
#[test]
fn lenet5_float32_trains_on_cuda_as_on_the_cpu_to_the_last_bits() -> R {
    cuda_matches_cpu("float32", 1e-4, 1e-4)
}

/// Tolerances: a sum that differs in its last bits rounds, now and then, to the
/// neighbouring posit<16,1> value (12 fraction bits near 1: a step of 2^-12 = 2.4e-4
/// relative), and such a step propagates; 1e-3 relative in the loss and 2e-3 in a weight
/// (eight posit<16,1> steps at magnitude 1) allow a few of them per value.
#[test]
fn lenet5_posit16_trains_on_cuda_as_on_the_cpu_within_a_few_posit_steps() -> R {
    cuda_matches_cpu("posit<16,1>", 1e-3, 2e-3)
}

#[test]
fn a_cuda_run_writes_f32_files_and_resumes_from_its_checkpoint_on_the_device() -> R {
    if gpu().is_none() {
        return Ok(());
    }
    let data = subset(128, 100);
    let (once, twice) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let config = QConfig::load("posit<16,1>")?;
    let mut opts = options("posit<16,1>", DeviceSpec::Cuda(0));
    opts.epochs = 2;
    let whole = train(&data, &opts, &config, Some(once.path()), true)?;
    opts.epochs = 1;
    train(&data, &opts, &config, Some(twice.path()), true)?;
    opts.epochs = 2;
    let resumed = train(&data, &opts, &config, Some(twice.path()), true)?;
    let without_time = training::without_time;
    // The same device computes alike run after run (no atomics in the kernels used).
    assert_eq!(without_time(&resumed), without_time(&whole));
    assert_eq!(load_run(twice.path())?.options.device, DeviceSpec::Cuda(0));
    for name in ["model.safetensors", "checkpoint.safetensors"] {
        let tensors = qcandle::io::read_tensors(&twice.path().join(name))?;
        let weights: Vec<&Tensor> = tensors
            .iter()
            .filter(|(n, _)| name == "model.safetensors" || n.starts_with("model."))
            .map(|(_, t)| t)
            .collect();
        assert!(!weights.is_empty(), "{name}");
        assert!(weights.iter().all(|t| t.dtype() == DType::F32), "{name}");
    }
    // The CPU refuses to continue it.
    let e = train(
        &data,
        &TrainOptions {
            epochs: 3,
            device: DeviceSpec::Cpu,
            ..opts
        },
        &config,
        Some(twice.path()),
        true,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("device: cuda in the directory, cpu now"),
        "{e}"
    );
    Ok(())
}

#[test]
fn ptq_on_cuda_gives_the_cpus_posit_rows_exactly() -> R {
    let Some(gpu) = gpu() else {
        return Ok(());
    };
    let data = subset(256, 300);
    let dir = tempfile::tempdir()?;
    let opts = options("float32", DeviceSpec::Cpu);
    train(&data, &opts, &QConfig::float32(), Some(dir.path()), true)?;
    let weights = qcandle::ptq::read_weights(
        &dir.path().join("model.safetensors"),
        Some(qcandle::nn::ModelKind::Lenet5),
    )?;
    let formats = [
        "posit<8,0>".parse()?,
        "posit<16,1>".parse()?,
        "e4m3 naive:fp16".parse()?,
        "lns<8,3>".parse()?,
    ];
    let cpu = qcandle::ptq::evaluate_methods(&weights, &data, &formats, |_, _| {})?;
    let on_gpu = weights.to_device(&gpu)?;
    assert!(on_gpu.device().is_cuda());
    let cuda = qcandle::ptq::evaluate_methods(&on_gpu, &data, &formats, |_, _| {})?;
    assert_eq!(cpu.len(), cuda.len());
    for ((method, a), (_, b)) in cpu.iter().zip(&cuda) {
        match method {
            // Posit GEMMs give the CPU's bits on either device, as do the rules (computed
            // on the host).
            qcandle::ptq::Method::Format { .. } | qcandle::ptq::Method::Rule { .. } => {
                assert_eq!(
                    (a.top1, a.top5, a.tied),
                    (b.top1, b.top5, b.tied),
                    "{method}"
                )
            }
            // Float sums in another order (int8: its activation scales are float maxima): a
            // logit near a tie may rank differently.
            _ => assert!((a.top1 - b.top1).abs() <= 1.0, "{method}: {a:?} {b:?}"),
        }
    }
    Ok(())
}
