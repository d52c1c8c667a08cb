//! Training epochs of several trainers interleaved step by step, for the epoch benches
//! (`epoch_ratio`, `stats_cost`; shared through `#[path]`): every trainer steps a batch
//! before any takes the next, so all of them see the same machine at the same moments, and
//! each trainer's epoch time is the sum of its step times. The ratio of two trainers' sums
//! in one run is the figure of merit: separate runs drift by ±20% on a shared machine.
//!
//! Each step is timed twice: in wall-clock time and in the process's CPU time (every
//! thread; see `cpu_time.rs`), which leaves out the time spent waiting for a core while
//! other processes load the machine.

#![allow(dead_code)] // each bench uses part of it

use std::time::{Duration, Instant};

use candle_core::Tensor;
use qcandle::data::{load, DatasetName};
use qcandle::nn::QConfig;
use qcandle::train::{OptimizerKind, TrainOptions, Trainer};

/// The process's CPU time (shared with the benches that include this file).
#[path = "cpu_time.rs"]
pub mod cpu_time;

/// The bench's own arguments: those `cargo bench` passes after `--` (its `--bench` flag
/// left out).
pub fn bench_args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect()
}

/// The batches of one Fashion-MNIST training epoch (batch 128, epoch 1, seed 0), of the
/// first `limit` training images when given. Needs the full dataset
/// (`apt-get install dataset-fashion-mnist`).
pub fn epoch_batches(limit: Option<usize>) -> anyhow::Result<Vec<(Tensor, Tensor)>> {
    let mut data = load(DatasetName::FashionMnist, None)?;
    if let Some(n) = limit {
        data = data.subset(n, usize::MAX)?;
    }
    Ok(data
        .train_batches(128, 1, 0)?
        .collect::<Result<Vec<_>, _>>()?)
}

/// A CPU trainer of `model` under `config` with the recipe of `qcandle train --epochs 1`:
/// batch 128, Adam lr 1e-3, seed 0.
pub fn trainer(model: &str, config: &str) -> anyhow::Result<Trainer> {
    trainer_with(model, config, 128, 1e-3, OptimizerKind::Adam)
}

/// A CPU trainer of `model` under `config` for one epoch at seed 0 with the given batch,
/// learning rate and optimizer.
pub fn trainer_with(
    model: &str,
    config: &str,
    batch: usize,
    lr: f64,
    optimizer: OptimizerKind,
) -> anyhow::Result<Trainer> {
    let options = TrainOptions {
        model: model.into(),
        config_name: config.into(),
        epochs: 1,
        batch,
        lr,
        optimizer,
        seed: 0,
        train_limit: None,
        device: qcandle::device::DeviceSpec::Cpu,
        schedule: Default::default(),
        weight_decay: None,
        beta2: None,
    };
    Trainer::new(options, QConfig::load(config)?)
}

/// One trainer's epoch time: summed wall-clock and process CPU time of its steps.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpochTime {
    /// Wall-clock time.
    pub wall: Duration,
    /// CPU time of the process (every thread) during the trainer's steps.
    pub cpu: Duration,
}

/// Steps every trainer through `batches` (epoch 1), batch by batch in turn, each step by
/// `Trainer::train_step` (which records statistics on a trainer's sampled steps); returns
/// each trainer's [`EpochTime`].
pub fn interleaved_epoch(
    trainers: &mut [Trainer],
    batches: &[(Tensor, Tensor)],
) -> anyhow::Result<Vec<EpochTime>> {
    let steps = batches.len();
    let mut times = vec![EpochTime::default(); trainers.len()];
    for (i, (images, labels)) in batches.iter().enumerate() {
        for (trainer, time) in trainers.iter_mut().zip(&mut times) {
            let (wall, cpu) = (Instant::now(), cpu_time::process_cpu_ns());
            trainer.train_step(images, labels, 1, i + 1, steps)?;
            time.cpu += Duration::from_nanos(cpu_time::process_cpu_ns() - cpu);
            time.wall += wall.elapsed();
        }
    }
    Ok(times)
}
