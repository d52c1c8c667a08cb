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

use candle_core::Tensor;
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use qcandle::train::{OptimizerKind, Trainer};

/// A group of step benches with the sampling both groups use.
fn step_group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    group
}

/// Benches `trainer`'s step as `id`, cycling through `batches` as an epoch does.
fn bench_steps(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: String,
    mut trainer: Trainer,
    batches: &[(Tensor, Tensor)],
) {
    let mut next = batches.iter().cycle();
    group.bench_function(id, |b| {
        b.iter(|| {
            let (inputs, labels) = next.next().expect("a batch");
            trainer.step(inputs, labels).expect("a step")
        })
    });
}

fn bench_train_step(c: &mut Criterion) {
    threads::tune_cpu_threads();
    // Steps cycle through the embedded subset's batches: repeating one batch would fit it
    // until the errors shrink towards the formats' smallest values, which real training
    // does not see (and which the f32 fast path of posits sends to the slow path).
    let data = qcandle::data::embedded().expect("the embedded subset loads");
    let batches: Vec<(Tensor, Tensor)> = data
        .train_batches(128, 1, 0)
        .expect("batches")
        .collect::<Result<_, _>>()
        .expect("a batch");
    let mut group = step_group(c, "lenet5_step_b128");
    for (model, preset) in [
        ("lenet5", "float32"),
        ("lenet5", "posit<16,1>"),
        ("lenet5", "bf16"),
        ("lenet5", "posit<8,0>"),
        ("lenet5-unpadded", "float32"),
        ("lenet5-unpadded", "posit<16,1>"),
    ] {
        let trainer = epochs::trainer(model, preset).expect("a trainer");
        let label = qcandle::train::config_label(preset);
        bench_steps(&mut group, format!("{model}/{label}"), trainer, &batches);
    }
    group.finish();
}

fn bench_transformer_step(c: &mut Criterion) {
    threads::tune_cpu_threads();
    let data = qcandle::data::modadd::modadd(qcandle::data::modadd::MODADD_P).expect("modadd");
    let batches: Vec<(Tensor, Tensor)> = data
        .train_batches(64, 1, 0)
        .expect("batches")
        .collect::<Result<_, _>>()
        .expect("a batch");
    let mut group = step_group(c, "transformer_step_b64");
    for preset in ["float32", "bf16", "posit<16,1>"] {
        let trainer = epochs::trainer_with("transformer", preset, 64, 3e-3, OptimizerKind::AdamW)
            .expect("a trainer");
        let label = qcandle::train::config_label(preset);
        bench_steps(
            &mut group,
            format!("transformer/{label}"),
            trainer,
            &batches,
        );
    }
    group.finish();
}

criterion_group!(benches, bench_train_step, bench_transformer_step);
criterion_main!(benches);
