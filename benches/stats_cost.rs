//! What recording rounding statistics costs a training epoch: three trainers of the same
//! model and config (no statistics, `--stats every=50`, `--stats every=1`) take the epoch's
//! batches in turn, each batch stepped by every trainer before the next, as in
//! `benches/epoch_ratio.rs` (see `common/epochs.rs`). Each trainer's epoch time is the sum of
//! its step times (with the sampled steps' recording), and its ratio to the trainer without
//! statistics is the figure of merit: all three see the same machine at the same moments.
//! Both clocks are reported: wall-clock time, and the process's CPU time (every thread),
//! which leaves out waiting for a core on a loaded machine.
//!
//! Run: `cargo bench --bench stats_cost` (LeNet-5, posit<8,0> in every category, batch 128,
//! Adam lr 1e-3, the full Fashion-MNIST epoch: the recipe of `qcandle train --epochs 1`), or
//! name the model, the config and a training-image limit:
//! `cargo bench --bench stats_cost -- lenet5 bf16 20000`. Needs the full Fashion-MNIST
//! (`apt-get install dataset-fashion-mnist`).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

/// Interleaved epochs, shared with `epoch_ratio`.
#[path = "common/epochs.rs"]
mod epochs;

use std::process::ExitCode;

use qcandle::run_stats::StatsEvery;

fn main() -> ExitCode {
    threads::tune_cpu_threads_on_main();
    let args = epochs::bench_args();
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
    let batches = epochs::epoch_batches(limit)?;
    let settings: [(&str, Option<usize>); 3] = [
        ("no stats", None),
        ("every=50", Some(50)),
        ("every=1", Some(1)),
    ];
    let mut trainers = settings
        .iter()
        .map(|(_, every)| {
            let mut trainer = epochs::trainer(model, config)?;
            if let Some(n) = every {
                trainer.enable_stats(StatsEvery(*n))?;
            }
            Ok(trainer)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let times = epochs::interleaved_epoch(&mut trainers, &batches)?;
    let samples: Vec<usize> = trainers
        .iter_mut()
        .map(|t| t.take_stats_samples().len())
        .collect();
    println!(
        "{model} {config}, {} steps of batch 128, settings alternating step by step:",
        batches.len()
    );
    let (base_wall, base_cpu) = (times[0].wall.as_secs_f64(), times[0].cpu.as_secs_f64());
    for (((name, _), time), samples) in settings.iter().zip(&times).zip(&samples) {
        let (wall, cpu) = (time.wall.as_secs_f64(), time.cpu.as_secs_f64());
        println!(
            "  {name:<9} wall {wall:8.3} s {:.3}x   cpu {cpu:8.3} s {:.3}x no stats   \
             ({samples} site samples)",
            wall / base_wall,
            cpu / base_cpu
        );
    }
    Ok(())
}
