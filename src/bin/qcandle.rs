//! `qcandle`: the command-line tool. Thin: every subcommand composes library functions.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use qcandle::data::Dataset;
use qcandle::io::{read_tensors, write_tensors};
use qcandle::nn::{ModelKind, QConfig};
use qcandle::train::{train, OptimizerKind, TrainOptions};
use qcandle::{quantize, Format, Quant, Rounding};

#[derive(Parser)]
#[command(
    name = "qcandle",
    version,
    about = "Low-precision arithmetic simulation on candle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Table of every preset format: bits, range, epsilon.
    Formats,
    /// Round every float tensor of an .npy or .safetensors file to a format.
    Quantize {
        /// Target format: posit<8,0>, float<5,2>, fixed<8,4>, block<8>, e4m3, bf16, ...
        #[arg(long)]
        format: Format,
        /// nearest-even, nearest-away, toward-zero, stochastic, stochastic:<bits>.
        #[arg(long, default_value = "nearest-even")]
        rounding: Rounding,
        /// Seed of the stochastic-rounding stream.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Input file (.npy or .safetensors).
        input: PathBuf,
        /// Output file (.npy or .safetensors), written atomically.
        output: PathBuf,
    },
    /// Train a model of the zoo under a quantization config; results go to --out.
    Train(TrainArgs),
    /// Compare finished runs: a markdown table of their last epochs and one PNG of all
    /// their curves.
    Compare {
        /// Run directories (each holds the run.json that `train` writes).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Where to write the PNG.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Title of the plot.
        #[arg(long, default_value = "")]
        title: String,
    },
    /// Round a normal sample to every preset, then train LeNet-5 on the embedded
    /// Fashion-MNIST subset in float32 and posit16 and print both accuracies.
    Demo {
        /// Number of samples of the rounding table.
        #[arg(long, default_value_t = 1 << 16)]
        samples: usize,
        /// Training epochs on the embedded subset.
        #[arg(long, default_value_t = 2)]
        epochs: usize,
        /// Seed of the sample, the initial weights, the batch order and stochastic rounding.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Model: mlp, lenet5, lenet5-unpadded, cifarnet.
    #[arg(long, default_value = "lenet5")]
    model: String,
    /// Dataset: fashion-mnist, mnist, or embedded (the Fashion-MNIST subset in the binary).
    #[arg(long, default_value = "fashion-mnist")]
    data: String,
    /// Directory of the IDX .gz files (default: $QCANDLE_DATA, then the dataset's
    /// standard location).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Quantization config: a preset (float32, bf16, posit16, posit32, posit8, fp8) or a
    /// .toml/.json file.
    #[arg(long, default_value = "float32")]
    config: String,
    /// Number of epochs.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Mini-batch size.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Optimizer: adam, adamw, sgd (momentum 0.9).
    #[arg(long, default_value = "adam")]
    optimizer: OptimizerKind,
    /// Seed of the initial weights, the batch order and stochastic rounding.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Use only the first N training images.
    #[arg(long)]
    train_limit: Option<usize>,
    /// Output directory (default runs/<model>-<data>-<config>-s<seed>); a run there with
    /// the same settings resumes.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn load_data(name: &str, dir: Option<&std::path::Path>) -> Result<Dataset> {
    Ok(match name {
        "embedded" => qcandle::data::embedded()?,
        _ => qcandle::data::load(name.parse()?, dir)?,
    })
}

/// The process's peak resident set size (VmHWM), where /proc provides it.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn run_train(args: TrainArgs) -> Result<()> {
    let mut data = load_data(&args.data, args.data_dir.as_deref())?;
    if let Some(n) = args.train_limit {
        data = data.subset(n, usize::MAX)?;
    }
    let config = QConfig::load(&args.config)?;
    let options = TrainOptions {
        model: args.model.parse::<ModelKind>()?.to_string(),
        config_name: args.config.clone(),
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr,
        optimizer: args.optimizer,
        seed: args.seed,
    };
    let out = args
        .out
        .unwrap_or_else(|| qcandle::train::default_out(&options, &args.data));
    eprintln!(
        "training {} on {} ({}) with config {}, {} epochs -> {}",
        options.model,
        args.data,
        data.source,
        options.config_name,
        options.epochs,
        out.display()
    );
    let records = train(&data, &options, &config, Some(&out), args.quiet)?;
    print!("{}", qcandle::train::metrics_csv(&records));
    if let Some(kib) = peak_rss_kib() {
        eprintln!("peak resident memory: {:.1} MiB", kib as f64 / 1024.0);
    }
    Ok(())
}

fn run_compare(runs: &[PathBuf], plot: Option<&std::path::Path>, title: &str) -> Result<()> {
    let (mut loss, mut accuracy) = (Vec::new(), Vec::new());
    println!(
        "| run | config | epochs | train loss | test top-1 | test top-5 | best top-1 | s/epoch |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for dir in runs {
        let record = qcandle::train::load_run(dir)?;
        let last = record
            .epochs
            .last()
            .with_context(|| format!("{} has no finished epoch", dir.display()))?;
        let best = record.epochs.iter().map(|e| e.top1).fold(0.0, f64::max);
        let seconds =
            record.epochs.iter().map(|e| e.seconds).sum::<f64>() / record.epochs.len() as f64;
        let name = dir
            .file_name()
            .map_or(dir.display().to_string(), |n| n.to_string_lossy().into());
        println!(
            "| {name} | {} | {} | {:.4} | {:.2} | {:.2} | {best:.2} | {seconds:.1} |",
            record.options.config_name, last.epoch, last.train_loss, last.top1, last.top5
        );
        let (l, a) = record.curves(&record.options.config_name);
        loss.push(l);
        accuracy.push(a);
    }
    if let Some(path) = plot {
        qcandle::plot::training_curves(title, &loss, &accuracy, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn run_demo(samples: usize, epochs: usize, seed: u64) -> Result<()> {
    print!("{}", qcandle::report::demo_report(samples, seed)?);
    let data = qcandle::data::embedded()?;
    println!(
        "\nLeNet-5 on the embedded Fashion-MNIST subset ({}), {epochs} epochs, Adam lr 1e-3, batch 128\n",
        data.source
    );
    println!("| config | train loss | test top-1 | test top-5 | seconds |");
    println!("|---|---|---|---|---|");
    for config_name in ["float32", "posit16"] {
        let options = TrainOptions {
            model: "lenet5".into(),
            config_name: config_name.into(),
            epochs,
            batch: 128,
            lr: 1e-3,
            optimizer: OptimizerKind::Adam,
            seed,
        };
        let records = train(&data, &options, &QConfig::preset(config_name)?, None, false)?;
        let last = records.last().context("no epochs were run")?;
        let seconds: f64 = records.iter().map(|r| r.seconds).sum();
        println!(
            "| {config_name} | {:.4} | {:.2}% | {:.2}% | {seconds:.1} |",
            last.train_loss, last.top1, last.top5
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Formats => print!("{}", qcandle::report::formats_table()),
        Command::Quantize {
            format,
            rounding,
            seed,
            input,
            output,
        } => {
            let q = Quant::new(format).with_rounding(rounding).with_seed(seed);
            let tensors = read_tensors(&input)?;
            let mut out = Vec::with_capacity(tensors.len());
            let mut rounded = 0;
            for (name, t) in tensors {
                let t = if t.dtype().is_float() {
                    rounded += 1;
                    quantize(&t, &q).with_context(|| format!("tensor {name}"))?
                } else {
                    t
                };
                out.push((name, t));
            }
            write_tensors(&output, &out)?;
            println!(
                "{}: {rounded} of {} tensors rounded to {format} ({rounding}) -> {}",
                input.display(),
                out.len(),
                output.display()
            );
        }
        Command::Train(args) => run_train(args)?,
        Command::Compare { runs, plot, title } => run_compare(&runs, plot.as_deref(), &title)?,
        Command::Demo {
            samples,
            epochs,
            seed,
        } => run_demo(samples, epochs, seed)?,
    }
    Ok(())
}
