//! Whole Fashion-MNIST training epochs of several configs in one run: one trainer per config,
//! taking the epoch's batches in turn, each batch stepped by every trainer before the next.
//! Each config's epoch time is the sum of its step times, and its ratio to the first config
//! (the baseline) is the figure of merit: both see the same machine at the same moments, so
//! the ratio holds still where separate runs drift by ±20% on a shared machine (see
//! `common/epochs.rs`).
//!
//! Run: `cargo bench --bench epoch_ratio` (float32 against posit<16,1> on `lenet5-unpadded`,
//! batch 128, Adam lr 1e-3: the recipe of `qcandle train --epochs 1`), or name the model
//! and configs: `cargo bench --bench epoch_ratio -- lenet5 float32 'posit<16,1>' bf16`. A config
//! is a preset, a format or a config file (`examples/configs/quire-posit_16_1.toml`: every
//! layer in posit<16,1> quire arithmetic). An argument `images=N` runs the epoch on the first
//! `N` training images only (`N / 128` steps), for slow configs. Needs the full
//! Fashion-MNIST (`apt-get install dataset-fashion-mnist`).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

/// Interleaved epochs, shared with `stats_cost`.
#[path = "common/epochs.rs"]
mod epochs;

use std::process::ExitCode;

fn main() -> ExitCode {
    threads::tune_cpu_threads_on_main();
    let all = epochs::bench_args();
    let limit = all
        .iter()
        .find_map(|a| a.strip_prefix("images=").and_then(|n| n.parse().ok()));
    let args: Vec<String> = all
        .into_iter()
        .filter(|a| !a.starts_with("images="))
        .collect();
    let model = args.first().cloned().unwrap_or("lenet5-unpadded".into());
    let mut configs: Vec<String> = args.iter().skip(1).cloned().collect();
    if configs.is_empty() {
        configs = vec!["float32".into(), "posit<16,1>".into()];
    }
    match run(&model, &configs, limit) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epoch_ratio: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(model: &str, configs: &[String], limit: Option<usize>) -> anyhow::Result<()> {
    let batches = epochs::epoch_batches(limit)?;
    let mut trainers = configs
        .iter()
        .map(|name| epochs::trainer(model, name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let times = epochs::interleaved_epoch(&mut trainers, &batches)?;
    println!(
        "{model}, {} steps of batch 128, configs alternating step by step:",
        batches.len()
    );
    let base = times[0].wall.as_secs_f64();
    for (name, time) in configs.iter().zip(&times) {
        let s = time.wall.as_secs_f64();
        println!("  {name:<12} {s:7.3} s   {:.3}x {}", s / base, configs[0]);
    }
    Ok(())
}
