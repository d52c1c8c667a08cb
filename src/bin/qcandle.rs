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
    /// Post-training quantization: evaluate a trained model in float32, float16, int8 and
    /// each format with naive and quire arithmetic; save the quantized model.
    Ptq(PtqArgs),
    /// Round a normal sample to every preset, then train LeNet-5 on the embedded
    /// Fashion-MNIST subset in float32 and posit16 and print both accuracies, then evaluate
    /// the float32 model in posit<8,0> (post-training quantization).
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

#[derive(clap::Args)]
struct PtqArgs {
    /// The model file: a run's model.safetensors (f32) or a quantized model written by ptq.
    #[arg(long)]
    model: PathBuf,
    /// Formats to evaluate (repeatable); posits get a naive and a quire row. Default: the
    /// quantized model's format, else posit<8,0>.
    #[arg(long = "format")]
    formats: Vec<Format>,
    /// The model of the zoo (default: from the run.json beside the model file, or the
    /// quantized model's metadata).
    #[arg(long)]
    arch: Option<String>,
    /// Dataset: fashion-mnist, mnist, or embedded (default: the run's dataset).
    #[arg(long)]
    data: Option<String>,
    /// Directory of the IDX .gz files (default: $QCANDLE_DATA, then the dataset's
    /// standard location).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Output directory for ptq.md, ptq.csv and the quantized models (default: beside the
    /// model file, in ptq/).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The dataset `--data` names (fashion-mnist, mnist or embedded), read from `dir` if given.
fn load_data(name: &str, dir: Option<&std::path::Path>) -> Result<Dataset> {
    Ok(name.parse::<qcandle::data::DataSource>()?.load(dir)?)
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

/// The dataset the run holding `model` was trained on, from its run.json: the embedded
/// subset, or the named dataset read from the directory the run used.
fn dataset_of_run(model: &std::path::Path) -> Result<Option<Dataset>> {
    let Some(dir) = model.parent().filter(|d| d.join("run.json").exists()) else {
        return Ok(None);
    };
    let run = qcandle::train::load_run(dir)?;
    if run.data == "embedded" {
        return Ok(Some(qcandle::data::embedded()?));
    }
    if run.dataset.is_empty() {
        return Ok(None);
    }
    let path = std::path::Path::new(&run.data);
    Ok(Some(qcandle::data::load(run.dataset.parse()?, Some(path))?))
}

fn run_ptq(args: PtqArgs) -> Result<()> {
    let arch = match &args.arch {
        Some(a) => Some(a.parse::<ModelKind>()?),
        None => qcandle::ptq::model_file::model_of_run(&args.model)?,
    };
    let weights = qcandle::ptq::read_weights(&args.model, arch)?;
    let formats = if !args.formats.is_empty() {
        args.formats.clone()
    } else {
        vec![weights.format.unwrap_or("posit<8,0>".parse()?)]
    };
    let data = match &args.data {
        Some(name) => load_data(name, args.data_dir.as_deref())?,
        None => dataset_of_run(&args.model)?.with_context(|| {
            format!(
                "cannot tell which dataset {} was trained on; pass --data",
                args.model.display()
            )
        })?,
    };
    let out = args.out.clone().unwrap_or_else(|| {
        args.model
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("ptq")
    });
    eprintln!(
        "post-training quantization of {} ({}) on {} ({})",
        args.model.display(),
        weights.model,
        data.name.as_str(),
        data.source
    );
    let f32_bytes = match weights.format {
        None => std::fs::metadata(&args.model)?.len(),
        Some(_) => {
            4 * weights
                .tensors
                .values()
                .map(|t| t.elem_count() as u64)
                .sum::<u64>()
        }
    };
    let table = ptq_table(&weights, &data, &formats, &out, f32_bytes)?;
    print!("{table}");
    Ok(())
}

/// Evaluates every method, writes ptq.md, ptq.csv and one quantized model per format
/// under `out`, and returns the markdown report.
fn ptq_table(
    weights: &qcandle::ptq::Weights,
    data: &Dataset,
    formats: &[Format],
    out: &std::path::Path,
    f32_bytes: u64,
) -> Result<String> {
    let rows = qcandle::ptq::evaluate_methods(weights, data, formats, |m, s| {
        eprintln!("  {m}: top-1 {:.2}% ({:.1} s)", s.top1, s.seconds);
    })?;
    let mut report = qcandle::ptq::markdown(&rows);
    report.push_str(
        "\nTop-1/top-5 ties go to the lower class index (a stable sort of the logits).\n",
    );
    for format in formats {
        let name = format.to_string().replace(['<', '>', ','], "_");
        let path = out.join(format!("model-{}.safetensors", name.trim_end_matches('_')));
        let bytes = qcandle::ptq::write_quantized(&path, weights, format)?;
        report.push_str(&format!(
            "{format} model: {} ({bytes} bytes; the f32 model {f32_bytes} bytes, {:.3}x)\n",
            path.display(),
            bytes as f64 / f32_bytes as f64
        ));
    }
    qcandle::io::write_atomically(&out.join("ptq.md"), |p| Ok(std::fs::write(p, &report)?))?;
    let csv = qcandle::ptq::csv(&rows);
    qcandle::io::write_atomically(&out.join("ptq.csv"), |p| Ok(std::fs::write(p, &csv)?))?;
    Ok(report)
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
    let runs = std::path::Path::new("runs").join("demo");
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
        let out = runs.join(format!("lenet5-{config_name}-e{epochs}-s{seed}"));
        // The demo's own directory: a fresh run every time, never a stale one resumed.
        if out.exists() {
            std::fs::remove_dir_all(&out)
                .with_context(|| format!("cannot clear {}", out.display()))?;
        }
        let config = QConfig::preset(config_name)?;
        let records = train(&data, &options, &config, Some(&out), false)?;
        let last = records.last().context("no epochs were run")?;
        let seconds: f64 = records.iter().map(|r| r.seconds).sum();
        println!(
            "| {config_name} | {:.4} | {:.2}% | {:.2}% | {seconds:.1} |",
            last.train_loss, last.top1, last.top5
        );
    }
    let model = runs.join(format!(
        "lenet5-float32-e{epochs}-s{seed}/model.safetensors"
    ));
    println!(
        "\nPost-training quantization of the float32 model ({}) on the same test images\n",
        model.display()
    );
    let weights = qcandle::ptq::read_weights(&model, Some(ModelKind::Lenet5))?;
    let f32_bytes = std::fs::metadata(&model)?.len();
    let out = model.with_file_name("ptq");
    print!(
        "{}",
        ptq_table(&weights, &data, &["posit<8,0>".parse()?], &out, f32_bytes)?
    );
    Ok(())
}

fn main() -> Result<()> {
    qcandle::ops::threads::tune_cpu_threads();
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
        Command::Ptq(args) => run_ptq(args)?,
        Command::Compare { runs, plot, title } => run_compare(&runs, plot.as_deref(), &title)?,
        Command::Demo {
            samples,
            epochs,
            seed,
        } => run_demo(samples, epochs, seed)?,
    }
    Ok(())
}
