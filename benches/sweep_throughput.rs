//! Sweep throughput: the same points trained in this process one after the other (the
//! training itself, the baseline) and by `qcandle sweep run` with 1 and 2 workers, in one
//! run. The runner's cost per point is the 1-worker wall time minus the baseline, divided by
//! the points: starting a process, reading the spec and the data, checking states, writing
//! the plan and the logs.
//!
//! Run: `cargo bench --bench sweep_throughput` (8 points: LeNet-5 on 2,048 embedded images,
//! one epoch each; two seeds x four configs), or give the point count's seeds:
//! `cargo bench --bench sweep_throughput -- 4` for 4 seeds (16 points).

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use qcandle::sweep::{Plan, Spec};

const CONFIGS: &str = r#"["float32", "posit<16,1>", "bf16", "posit<8,1>"]"#;

fn main() -> ExitCode {
    threads::tune_cpu_threads_on_main();
    let seeds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    match run(seeds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sweep_throughput: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(seeds: usize) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let seed_list: Vec<String> = (0..seeds).map(|s| s.to_string()).collect();
    let spec_path = tmp.path().join("bench.toml");
    std::fs::write(
        &spec_path,
        format!(
            "name = \"bench\"\n[base]\nmodel = \"lenet5\"\ndata = \"embedded\"\nepochs = 1\n\
             train-limit = 2048\n[grid]\nconfig = {CONFIGS}\nseed = [{}]\n",
            seed_list.join(", ")
        ),
    )?;
    let plan = Plan::expand(&Spec::load(&spec_path)?)?;
    let n = plan.points.len();

    let data = qcandle::data::embedded()?;
    let start = Instant::now();
    for (i, point) in plan.points.iter().enumerate() {
        let s = &point.settings;
        let out = tmp.path().join(format!("baseline-{i}"));
        qcandle::train::train(&data, &s.options, &s.config, Some(&out), true)?;
    }
    let baseline = start.elapsed().as_secs_f64();

    let mut walls = Vec::new();
    for workers in [1, 2] {
        let dir = tmp.path().join(format!("sweep-{workers}"));
        walls.push((workers, sweep(&spec_path, &dir, workers)?));
    }
    println!("{n} points (LeNet-5, 2,048 embedded images, 1 epoch each)");
    println!("| how | wall s | s/point | points/min | ratio to in-process |");
    println!("|---|---|---|---|---|");
    println!(
        "| in-process train(), one after the other (baseline) | {baseline:.2} | {:.3} | {:.1} | 1.00 |",
        baseline / n as f64,
        60.0 * n as f64 / baseline
    );
    for (workers, wall) in &walls {
        println!(
            "| sweep run --workers {workers} | {wall:.2} | {:.3} | {:.1} | {:.2} |",
            wall / n as f64,
            60.0 * n as f64 / wall,
            wall / baseline
        );
    }
    let one = walls[0].1;
    println!(
        "\nrunner cost per point beyond the training (1 worker minus in-process, / points): {:.3} s",
        (one - baseline) / n as f64
    );
    Ok(())
}

/// Wall-clock seconds of `qcandle sweep run SPEC --dir DIR --workers W`.
fn sweep(spec: &Path, dir: &Path, workers: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_qcandle"))
        .args(["sweep", "run"])
        .arg(spec)
        .arg("--dir")
        .arg(dir)
        .args(["--workers", &workers.to_string(), "--quiet"])
        .env_remove("RAYON_NUM_THREADS")
        .status()?;
    anyhow::ensure!(status.success(), "the sweep with {workers} workers failed");
    Ok(start.elapsed().as_secs_f64())
}
