//! One LeNet-5 training step (batch 128, Adam lr 1e-3: forward, cross-entropy, backward,
//! optimizer step) with every category quantized, against the same step in plain f32, in
//! one run. The figure of merit is the time ratio to `float32`. Each model trains on the
//! embedded Fashion-MNIST subset's batches in turn, as in an epoch.
//!
//! The same for the zoo's transformer (batch 64 of modadd's training pairs, AdamW lr 3e-3,
//! f32 sums): float32 against every category rounded to bf16, posit<16,1>, the `fp8` preset
//! and mxfp8_e4m3. After its criterion group the transformer's configs also step in turn,
//! batch by batch, in one loop, and the ratio of each config's CPU time to float32's is
//! printed: every config sees the same machine at the same moments (`-- interleaved` runs
//! that comparison alone).
//!
//! Every figure is the process's CPU time (all threads, `common/cpu_time.rs`), so time spent
//! waiting for a core on a loaded machine does not count. Run: `cargo bench --bench
//! train_step` (`-- transformer` for the transformer alone; `RAYON_NUM_THREADS=1
//! CANDLE_NUM_THREADS=1` for one thread).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

/// The trainer of the epoch benches' recipe.
#[path = "common/epochs.rs"]
mod epochs;

use std::time::Duration;

use candle_core::Tensor;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use epochs::cpu_time::{process_cpu_ns, ProcessCpuTime};
use qcandle::train::{OptimizerKind, Trainer};

type Group<'a> = BenchmarkGroup<'a, ProcessCpuTime>;

/// The transformer's configs, float32 (the baseline) first.
const TRANSFORMER_PRESETS: [&str; 5] = ["float32", "bf16", "posit<16,1>", "fp8", "mxfp8_e4m3"];

/// Steps per config of the interleaved transformer comparison (after as many warm-up steps).
const INTERLEAVED_STEPS: usize = 200;

/// A group of step benches with the sampling both groups use.
fn step_group<'a>(c: &'a mut Criterion<ProcessCpuTime>, name: &str) -> Group<'a> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    group
}

/// Benches `trainer`'s step as `id`, cycling through `batches` as an epoch does.
fn bench_steps(
    group: &mut Group<'_>,
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

fn bench_train_step(c: &mut Criterion<ProcessCpuTime>) {
    threads::tune_cpu_threads_on_main();
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

fn transformer_trainer(preset: &str) -> Trainer {
    epochs::trainer_with("transformer", preset, 64, 3e-3, OptimizerKind::AdamW).expect("a trainer")
}

fn bench_transformer_step(c: &mut Criterion<ProcessCpuTime>) {
    threads::tune_cpu_threads_on_main();
    let data = qcandle::data::modadd::modadd(qcandle::data::modadd::MODADD_P).expect("modadd");
    let batches: Vec<(Tensor, Tensor)> = data
        .train_batches(64, 1, 0)
        .expect("batches")
        .collect::<Result<_, _>>()
        .expect("a batch");
    let mut group = step_group(c, "transformer_step_b64");
    for preset in TRANSFORMER_PRESETS {
        let label = qcandle::train::config_label(preset);
        let trainer = transformer_trainer(preset);
        bench_steps(
            &mut group,
            format!("transformer/{label}"),
            trainer,
            &batches,
        );
    }
    group.finish();
    let args = epochs::bench_args();
    let interleaved = "transformer_step_b64/interleaved";
    if args.is_empty() || args.iter().any(|a| interleaved.contains(a.as_str())) {
        interleaved_transformer_steps(&batches);
    }
}

/// Steps every transformer config in turn, batch by batch, and prints each config's CPU
/// time per step and its ratio to float32's (of the sums, and the median of the per-round
/// ratios).
fn interleaved_transformer_steps(batches: &[(Tensor, Tensor)]) {
    let mut trainers: Vec<Trainer> = TRANSFORMER_PRESETS.map(transformer_trainer).into();
    let mut cpu = vec![Vec::with_capacity(INTERLEAVED_STEPS); trainers.len()];
    let rounds = batches
        .iter()
        .cycle()
        .take(2 * INTERLEAVED_STEPS)
        .enumerate();
    for (round, (inputs, labels)) in rounds {
        for (trainer, times) in trainers.iter_mut().zip(&mut cpu) {
            let start = process_cpu_ns();
            trainer.step(inputs, labels).expect("a step");
            if round >= INTERLEAVED_STEPS {
                times.push((process_cpu_ns() - start) as f64);
            }
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split(' ').take(3).collect::<Vec<_>>().join(" ");
    println!(
        "transformer_step_b64 interleaved: {INTERLEAVED_STEPS} steps per config after as many \
         warm-up steps, process CPU time, load average {load}"
    );
    let base: f64 = cpu[0].iter().sum();
    for (preset, times) in TRANSFORMER_PRESETS.iter().zip(&cpu) {
        let sum: f64 = times.iter().sum();
        let mut ratios: Vec<f64> = times.iter().zip(&cpu[0]).map(|(t, b)| t / b).collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "  {preset:<12} {:7.2} ms/step   {:.3}x float32 (median of rounds {:.3}x)",
            sum / times.len() as f64 / 1e6,
            sum / base,
            ratios[ratios.len() / 2]
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ProcessCpuTime);
    targets = bench_train_step, bench_transformer_step
}
criterion_main!(benches);
