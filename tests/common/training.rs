//! The training set-up of the test targets that train LeNet-5 on the embedded Fashion-MNIST
//! subset (`tests/train.rs`, `tests/stats.rs`, `tests/device.rs`, `tests/ptq.rs`): the subset
//! under the tool's CPU thread settings, the options of a short run, and epoch records
//! without their (wall-clock) seconds, for comparing runs bit for bit.
//!
//! Included with `#[path]` by those targets only (it brings the tool's `threads.rs`).

#![allow(dead_code)] // each test target uses part of it

/// The tool's CPU thread settings (applied once, before a test's first candle op), so that
/// the tests run as the tool does.
#[path = "../../src/bin/qcandle/threads.rs"]
pub mod threads;

use qcandle::data::Dataset;
use qcandle::train::{EpochRecord, OptimizerKind, TrainOptions};

/// The first `train` training and `test` test images of the embedded subset, with the
/// tool's thread settings applied.
pub fn subset(train: usize, test: usize) -> Dataset {
    threads::tune_cpu_threads();
    qcandle::data::embedded()
        .expect("the embedded subset loads")
        .subset(train, test)
        .expect("a subset")
}

/// LeNet-5 on the CPU for `epochs` epochs under the config named `config`, batch 64, Adam
/// lr 1e-3, seed `seed`.
pub fn lenet5_options(config: &str, epochs: usize, seed: u64) -> TrainOptions {
    TrainOptions {
        model: "lenet5".into(),
        config_name: config.into(),
        epochs,
        batch: 64,
        lr: 1e-3,
        optimizer: OptimizerKind::Adam,
        seed,
        train_limit: None,
        device: qcandle::device::DeviceSpec::Cpu,
        schedule: Default::default(),
        weight_decay: None,
        beta2: None,
    }
}

/// `records` with every epoch's seconds set to zero (the rest is bit-for-bit reproducible).
pub fn without_time(records: &[EpochRecord]) -> Vec<EpochRecord> {
    records
        .iter()
        .map(|r| EpochRecord {
            seconds: 0.0,
            ..r.clone()
        })
        .collect()
}
