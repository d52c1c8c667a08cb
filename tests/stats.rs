//! Rounding statistics of training runs (`train --stats`, `qcandle stats`, `qcandle
//! inspect`): they change no number of the training, they are the statistics of the tensors
//! rounded, and they resume with the run without loss or duplication.

/// The shared training set-up: the embedded subset, short LeNet-5 runs.
#[path = "common/training.rs"]
mod training;

use std::path::Path;
use std::process::Command;

use qcandle::nn::{QConfig, QuantSpec};
use qcandle::run_stats::{StatsEvery, StatsLog};
use qcandle::stats::{Limits, RoundingStats};
use qcandle::train::{train_with_stats, TrainOptions};
use qcandle::{quantize, Quant, Rounding};
use training::{subset, without_time};

type R = anyhow::Result<()>;

const EXE: &str = env!("CARGO_BIN_EXE_qcandle");

fn options(epochs: usize) -> TrainOptions {
    training::lenet5_options("mixed", epochs, 5)
}

/// Every category rounded, stochastic rounding in two of them, and a weight copy.
fn mixed_config() -> anyhow::Result<QConfig> {
    let mut config = QConfig::load("posit<8,0>")?;
    config.base.error = Some(QuantSpec::nearest("e5m2".parse()?));
    config.base.activation = Some(QuantSpec {
        format: "posit<16,1>".parse()?,
        rounding: Rounding::stochastic(12)?,
    });
    config.base.gradient = Some(QuantSpec {
        format: "bf16".parse()?,
        rounding: Rounding::stochastic(8)?,
    });
    config.base.accumulator = Some(QuantSpec::nearest("float<8,23>".parse()?));
    Ok(config)
}

fn read(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn log_of(dir: &Path) -> anyhow::Result<StatsLog> {
    let text = |f: &str| std::fs::read_to_string(dir.join(f));
    StatsLog::parse(&text("stats.csv")?, &text("stats_hist.csv")?)
}

#[test]
fn recording_statistics_changes_no_bit_of_the_training() -> R {
    let data = subset(640, 200);
    let config = mixed_config()?;
    let dir = tempfile::tempdir()?;
    let plain = dir.path().join("plain");
    let records = train_with_stats(&data, &options(2), &config, Some(&plain), true, None)?;
    for every in [1, 3] {
        let with = dir.path().join(format!("every{every}"));
        let stats = Some(StatsEvery(every));
        let recorded = train_with_stats(&data, &options(2), &config, Some(&with), true, stats)?;
        assert_eq!(
            without_time(&recorded),
            without_time(&records),
            "every={every}"
        );
        for file in ["model.safetensors", "checkpoint.safetensors", "metrics.csv"] {
            if file == "metrics.csv" {
                // The seconds column differs; every other column is equal.
                let cut = |b: Vec<u8>| -> Vec<String> {
                    String::from_utf8(b)
                        .unwrap()
                        .lines()
                        .map(|l| l.rsplit_once(',').unwrap().0.to_string())
                        .collect()
                };
                assert_eq!(cut(read(&with, file)), cut(read(&plain, file)));
            } else {
                assert_eq!(
                    read(&with, file),
                    read(&plain, file),
                    "{file}, every={every}"
                );
            }
        }
        let log = log_of(&with)?;
        // 640 images in batches of 64: 10 steps per epoch.
        let mut steps: Vec<(usize, usize)> =
            log.samples.iter().map(|s| (s.epoch, s.step)).collect();
        steps.dedup();
        let expected: Vec<(usize, usize)> = (1..=2)
            .flat_map(|e| {
                (1..=10)
                    .filter(move |s| s % every == 0 || *s == 10)
                    .map(move |s| (e, s))
            })
            .collect();
        assert_eq!(steps, expected, "every={every}");
    }
    assert!(!plain.join("stats.csv").exists());
    Ok(())
}

#[test]
fn every_site_is_recorded_once_with_the_tensors_it_rounds() -> R {
    let data = subset(640, 200);
    let config = mixed_config()?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    train_with_stats(
        &data,
        &options(1),
        &config,
        Some(&out),
        true,
        Some(StatsEvery(4)),
    )?;
    let log = log_of(&out)?;
    let step4: Vec<_> = log.samples.iter().filter(|s| s.step == 4).collect();
    let sites: Vec<String> = step4.iter().map(|s| s.site.to_string()).collect();
    let mut expected = vec!["input/activation".to_string()];
    for layer in ["conv1", "conv2", "fc1", "fc2", "fc3"] {
        for category in [
            "accumulator",
            "activation",
            "error",
            "gradient",
            "momentum",
            "weight",
        ] {
            expected.push(format!("{layer}/{category}"));
        }
    }
    expected.sort();
    assert_eq!(sites, expected);
    let at = |site: &str| step4.iter().find(|s| s.site.to_string() == site).unwrap();
    // The optimizer rounds each parameter once per step (weight and bias: conv1 has 6x1x5x5
    // + 6 = 156), the forward pass's rounding of the weights is not counted again; Adam's
    // two moments are both rounded.
    assert_eq!(at("conv1/weight").stats.count, 156);
    assert_eq!(at("conv1/gradient").stats.count, 156);
    assert_eq!(at("conv1/accumulator").stats.count, 156);
    assert_eq!(at("conv1/momentum").stats.count, 312);
    assert_eq!(at("fc1/weight").stats.count, 400 * 120 + 120);
    // conv1's output: 64 images x 6 x 28 x 28; its error the same shape.
    assert_eq!(at("conv1/activation").stats.count, 64 * 6 * 28 * 28);
    assert_eq!(at("conv1/error").stats.count, 64 * 6 * 28 * 28);
    assert_eq!(at("conv1/error").format, "e5m2");
    // The input's rounding is that of the step's batch, computed here independently.
    let (images, _) = data.train_batches(64, 1, 5)?.nth(3).unwrap()?;
    let x = images.flatten_all()?.to_vec1::<f32>()?;
    let format: qcandle::Format = "posit<16,1>".parse()?;
    let q = Quant::new(format)
        .with_rounding(Rounding::stochastic(12)?)
        .with_seed(0);
    // Stochastic rounding draws other bits here, but the counts that do not depend on the
    // drawn bits and the histogram of the inputs must agree.
    let y = quantize(&images, &q)?.flatten_all()?.to_vec1::<f32>()?;
    let ours = RoundingStats::of(&x, &y, Limits::of::<f32>(&format));
    let recorded = &at("input/activation").stats;
    assert_eq!(recorded.count, ours.count);
    assert_eq!(recorded.zero_inputs, ours.zero_inputs);
    assert_eq!(recorded.sum_x2, ours.sum_x2);
    assert_eq!(recorded.sum_abs_x, ours.sum_abs_x);
    assert_eq!(recorded.histogram, ours.histogram);
    Ok(())
}

#[test]
fn statistics_resume_with_the_run_without_loss_or_duplication() -> R {
    let data = subset(640, 200);
    let config = mixed_config()?;
    let dir = tempfile::tempdir()?;
    let (straight, resumed) = (dir.path().join("straight"), dir.path().join("resumed"));
    let stats = Some(StatsEvery(3));
    train_with_stats(&data, &options(3), &config, Some(&straight), true, stats)?;
    train_with_stats(&data, &options(1), &config, Some(&resumed), true, stats)?;
    train_with_stats(&data, &options(3), &config, Some(&resumed), true, stats)?;
    for file in ["stats.csv", "stats_hist.csv", "stats.json"] {
        assert_eq!(read(&resumed, file), read(&straight, file), "{file}");
    }
    let log = log_of(&resumed)?;
    assert_eq!(log.epochs(), [1, 2, 3]);
    // A resume without --stats keeps what was recorded, and records nothing new.
    train_with_stats(&data, &options(4), &config, Some(&resumed), true, None)?;
    assert_eq!(log_of(&resumed)?, log);
    // The files are checked with the run's other files.
    let record = qcandle::train::load_checked_run(&resumed)?;
    for file in qcandle::run_stats::FILES {
        assert!(record.files.contains_key(file), "{file}");
    }
    Ok(())
}

#[test]
fn damaged_statistics_are_reported_and_later_epochs_recorded() -> R {
    let data = subset(320, 100);
    let config = mixed_config()?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    let stats = Some(StatsEvery(2));
    train_with_stats(&data, &options(1), &config, Some(&out), true, stats)?;
    let csv = std::fs::read_to_string(out.join("stats.csv"))?;
    std::fs::write(out.join("stats.csv"), &csv[..csv.len() / 2])?;
    let records = train_with_stats(&data, &options(2), &config, Some(&out), true, stats)?;
    assert_eq!(records.len(), 2);
    let log = log_of(&out)?;
    assert_eq!(
        log.epochs(),
        [2],
        "epoch 1's statistics are lost, epoch 2's recorded"
    );
    qcandle::train::load_checked_run(&out)?;
    Ok(())
}

fn qcandle(args: &[&str]) -> std::process::Output {
    Command::new(EXE)
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn the_stats_and_inspect_commands_print_tables_and_draw_pictures() -> R {
    let dir = tempfile::tempdir()?;
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let common = [
        "train",
        "--data",
        "embedded",
        "--config",
        "posit<8,0>",
        "--epochs",
        "1",
        "--train-limit",
        "256",
        "--batch",
        "64",
        "--quiet",
        "--out",
        run_s,
    ];
    // Refused before anything is created.
    let bad = qcandle(&[&common[..], &["--stats", "every=0"]].concat());
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("every=N"));
    assert!(!run.exists());
    let plain = qcandle(&common);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let none = qcandle(&["stats", run_s]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("holds no rounding statistics"));
    // --stats alone: every 50 steps and the last; the 4 steps of this epoch give step 4.
    let longer = [
        "train",
        "--data",
        "embedded",
        "--config",
        "posit<8,0>",
        "--epochs",
        "2",
        "--train-limit",
        "256",
        "--batch",
        "64",
        "--quiet",
        "--out",
        run_s,
        "--stats",
    ];
    let with = qcandle(&longer);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert_eq!(log_of(&run)?.epochs(), [2]);
    let shown = qcandle(&["stats", run_s]);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let table = String::from_utf8(shown.stdout)?;
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| layer"))
        .collect();
    assert_eq!(rows.len(), 26, "{table}");
    // Worst first: posit<8,0> errors lie below minpos, their SQNR is the lowest.
    assert!(rows[0].contains("| error |"), "{table}");
    let sqnr = |row: &str| {
        row.split('|')
            .nth(4)
            .unwrap()
            .trim()
            .parse::<f64>()
            .unwrap()
    };
    assert!(rows.windows(2).all(|w| sqnr(w[0]) <= sqnr(w[1])), "{table}");
    for png in [
        "stats-sqnr-error.png",
        "stats-hist-error.png",
        "stats-flush.png",
    ] {
        let bytes = std::fs::read(run.join(png))?;
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
    }
    let model = run.join("model.safetensors");
    let plot = dir.path().join("inspect.png");
    let inspected = qcandle(&[
        "inspect",
        model.to_str().unwrap(),
        "--format",
        "posit<8,0>",
        "--format",
        "e4m3",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(
        inspected.status.success(),
        "{}",
        String::from_utf8_lossy(&inspected.stderr)
    );
    let text = String::from_utf8(inspected.stdout)?;
    // 10 tensors, two formats; the weights are already on posit<8,0>'s grid.
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| conv") || l.starts_with("| fc"))
        .collect();
    assert_eq!(rows.len(), 20, "{text}");
    assert!(
        rows.iter()
            .filter(|r| r.contains("posit<8,0>"))
            .all(|r| r.contains("| inf |") || r.contains("| - |")),
        "{text}"
    );
    assert!(text.contains("conv1.weight (150 values"), "{text}");
    for name in ["inspect-posit_8_0.png", "inspect-e4m3.png"] {
        assert!(dir.path().join(name).is_file(), "{name}");
    }
    let missing = qcandle(&["inspect", "/nonexistent.safetensors", "--format", "e4m3"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent.safetensors"));
    Ok(())
}
