//! Whole Fashion-MNIST training epochs of several configs in one run: one trainer per config,
//! taking the epoch's batches in turn, each batch stepped by every trainer before the next.
//! Each config's epoch time is the sum of its step times, and its ratio to the first config
//! (the baseline) is the figure of merit: both see the same machine at the same moments, so
//! the ratio holds still where separate runs drift by ±20% on a shared machine.
//!
//! Run: `cargo bench --bench epoch_ratio` (float32 against posit<16,1> on `lenet5-unpadded`,
//! batch 128, Adam lr 1e-3: the recipe of `qcandle train --epochs 1`), or name the model
//! and configs: `cargo bench --bench epoch_ratio -- lenet5 float32 'posit<16,1>' bf16`. Needs the
//! full Fashion-MNIST (`apt-get install dataset-fashion-mnist`).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use qcandle::data::{load, DatasetName};
use qcandle::nn::QConfig;
use qcandle::train::{OptimizerKind, TrainOptions, Trainer};

fn main() -> ExitCode {
    threads::tune_cpu_threads();
    // `cargo bench` passes `--bench`; the remaining arguments are the model and configs.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let model = args.first().cloned().unwrap_or("lenet5-unpadded".into());
    let mut configs: Vec<String> = args.iter().skip(1).cloned().collect();
    if configs.is_empty() {
        configs = vec!["float32".into(), "posit<16,1>".into()];
    }
    match run(&model, &configs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epoch_ratio: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(model: &str, configs: &[String]) -> anyhow::Result<()> {
    let data = load(DatasetName::FashionMnist, None)?;
    let batches = data
        .train_batches(128, 1, 0)?
        .collect::<Result<Vec<_>, _>>()?;
    let mut trainers = configs
        .iter()
        .map(|name| {
            let options = TrainOptions {
                model: model.into(),
                config_name: name.clone(),
                epochs: 1,
                batch: 128,
                lr: 1e-3,
                optimizer: OptimizerKind::Adam,
                seed: 0,
                train_limit: None,
                device: qcandle::device::DeviceSpec::Cpu,
            };
            Trainer::new(options, QConfig::load(name)?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut times = vec![Duration::ZERO; trainers.len()];
    for (images, labels) in &batches {
        for (trainer, time) in trainers.iter_mut().zip(&mut times) {
            let start = Instant::now();
            trainer.step(images, labels)?;
            *time += start.elapsed();
        }
    }
    println!(
        "{model}, {} steps of batch 128, configs alternating step by step:",
        batches.len()
    );
    let base = times[0].as_secs_f64();
    for (name, time) in configs.iter().zip(&times) {
        let s = time.as_secs_f64();
        println!("  {name:<12} {s:7.3} s   {:.3}x {}", s / base, configs[0]);
    }
    Ok(())
}
