//! What recording rounding statistics costs a training epoch: three trainers of the same
//! model and config (no statistics, `--stats every=50`, `--stats every=1`) take the epoch's
//! batches in turn, each batch stepped by every trainer before the next, as in
//! `benches/epoch_ratio.rs`. Each trainer's epoch time is the sum of its step times (with the
//! sampled steps' recording), and its ratio to the trainer without statistics is the figure
//! of merit: all three see the same machine at the same moments.
//!
//! Run: `cargo bench --bench stats_cost` (LeNet-5, posit<8,0> in every category, batch 128,
//! Adam lr 1e-3, the full Fashion-MNIST epoch: the recipe of `qcandle train --epochs 1`), or
//! name the model, the config and a training-image limit:
//! `cargo bench --bench stats_cost -- lenet5 bf16 20000`. Needs the full Fashion-MNIST
//! (`apt-get install dataset-fashion-mnist`).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use qcandle::data::{load, DatasetName};
use qcandle::nn::QConfig;
use qcandle::run_stats::StatsEvery;
use qcandle::train::{OptimizerKind, TrainOptions, Trainer};

fn main() -> ExitCode {
    threads::tune_cpu_threads();
    // `cargo bench` passes `--bench`; the remaining arguments are model, config and limit.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let model = args.first().cloned().unwrap_or("lenet5".into());
    let config = args.get(1).cloned().unwrap_or("posit<8,0>".into());
    let limit = args.get(2).and_then(|n| n.parse().ok());
    match run(&model, &config, limit) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stats_cost: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(model: &str, config: &str, limit: Option<usize>) -> anyhow::Result<()> {
    let mut data = load(DatasetName::FashionMnist, None)?;
    if let Some(n) = limit {
        data = data.subset(n, usize::MAX)?;
    }
    let batches = data
        .train_batches(128, 1, 0)?
        .collect::<Result<Vec<_>, _>>()?;
    let settings: [(&str, Option<usize>); 3] = [
        ("no stats", None),
        ("every=50", Some(50)),
        ("every=1", Some(1)),
    ];
    let mut trainers = settings
        .iter()
        .map(|(_, every)| {
            let options = TrainOptions {
                model: model.into(),
                config_name: config.into(),
                epochs: 1,
                batch: 128,
                lr: 1e-3,
                optimizer: OptimizerKind::Adam,
                seed: 0,
                train_limit: None,
                device: qcandle::device::DeviceSpec::Cpu,
            };
            let mut trainer = Trainer::new(options, QConfig::load(config)?)?;
            if let Some(n) = every {
                trainer.enable_stats(StatsEvery(*n))?;
            }
            Ok(trainer)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let steps = batches.len();
    let mut times = vec![Duration::ZERO; trainers.len()];
    for (i, (images, labels)) in batches.iter().enumerate() {
        for (trainer, time) in trainers.iter_mut().zip(&mut times) {
            let start = Instant::now();
            trainer.train_step(images, labels, 1, i + 1, steps)?;
            *time += start.elapsed();
        }
    }
    let samples: Vec<usize> = trainers
        .iter_mut()
        .map(|t| t.take_stats_samples().len())
        .collect();
    println!("{model} {config}, {steps} steps of batch 128, settings alternating step by step:");
    let base = times[0].as_secs_f64();
    for (((name, _), time), samples) in settings.iter().zip(&times).zip(&samples) {
        let s = time.as_secs_f64();
        println!(
            "  {name:<9} {s:8.3} s   {:.3}x no stats   ({samples} site samples)",
            s / base
        );
    }
    Ok(())
}
