//! One LeNet-5 training step (batch 128, Adam lr 1e-3: forward, cross-entropy, backward,
//! optimizer step) with every category quantized, against the same step in plain f32, in
//! one run. The figure of merit is the time ratio to `float32`. Each model trains on the
//! embedded Fashion-MNIST subset's batches in turn, as in an epoch.
//!
//! The same for the zoo's transformer (batch 64 of modadd's training pairs, AdamW lr 3e-3,
//! f32 sums): float32 against every category rounded to bf16 and to posit<16,1>.
//! Run: `cargo bench --bench train_step` (`-- transformer` for the transformer alone).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

/// The trainer of the epoch benches' recipe.
#[path = "common/epochs.rs"]
mod epochs;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use qcandle::nn::QConfig;
use qcandle::train::{OptimizerKind, TrainOptions, Trainer};

fn bench_train_step(c: &mut Criterion) {
    threads::tune_cpu_threads();
    // Steps cycle through the embedded subset's batches: repeating one batch would fit it
    // until the errors shrink towards the formats' smallest values, which real training
    // does not see (and which the f32 fast path of posits sends to the slow path).
    let data = qcandle::data::embedded().expect("the embedded subset loads");
    let batches: Vec<(candle_core::Tensor, candle_core::Tensor)> = data
        .train_batches(128, 1, 0)
        .expect("batches")
        .collect::<Result<_, _>>()
        .expect("a batch");
    let mut group = c.benchmark_group("lenet5_step_b128");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    for (model, preset) in [
        ("lenet5", "float32"),
        ("lenet5", "posit<16,1>"),
        ("lenet5", "bf16"),
        ("lenet5", "posit<8,0>"),
        ("lenet5-unpadded", "float32"),
        ("lenet5-unpadded", "posit<16,1>"),
    ] {
        let mut trainer = epochs::trainer(model, preset).expect("a trainer");
        let mut next = batches.iter().cycle();
        let label = qcandle::train::config_label(preset);
        group.bench_function(format!("{model}/{label}"), |b| {
            b.iter(|| {
                let (images, labels) = next.next().expect("a batch");
                trainer.step(images, labels).expect("a step")
            })
        });
    }
    group.finish();
}

fn bench_transformer_step(c: &mut Criterion) {
    threads::tune_cpu_threads();
    let data = qcandle::data::modadd::modadd(qcandle::data::modadd::MODADD_P).expect("modadd");
    let batches: Vec<(candle_core::Tensor, candle_core::Tensor)> = data
        .train_batches(64, 1, 0)
        .expect("batches")
        .collect::<Result<_, _>>()
        .expect("a batch");
    let mut group = c.benchmark_group("transformer_step_b64");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    for preset in ["float32", "bf16", "posit<16,1>"] {
        let options = TrainOptions {
            model: "transformer".into(),
            config_name: preset.into(),
            epochs: 1,
            batch: 64,
            lr: 3e-3,
            optimizer: OptimizerKind::AdamW,
            seed: 0,
            train_limit: None,
            device: qcandle::device::DeviceSpec::Cpu,
        };
        let config = QConfig::load(preset).expect("a preset or a format");
        let mut trainer = Trainer::new(options, config).expect("a trainer");
        let mut next = batches.iter().cycle();
        let label = qcandle::train::config_label(preset);
        group.bench_function(format!("transformer/{label}"), |b| {
            b.iter(|| {
                let (tokens, labels) = next.next().expect("a batch");
                trainer.step(tokens, labels).expect("a step")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_train_step, bench_transformer_step);
criterion_main!(benches);
