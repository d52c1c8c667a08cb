//! `qcandle`: the command-line tool. Thin: every subcommand composes library functions.
//!
//! Output: results go to standard output, notes and progress to standard error. Writing to
//! a full or failing standard output is an error (exit status 1) and a reader that closed
//! the pipe (`qcandle formats | head -3`) ends the tool quietly with status 141, as if
//! killed by SIGPIPE like other command-line tools; either way every result file already
//! written stays. A closed or full standard error loses notes, never a run.

#[path = "qcandle/curve_labels.rs"]
mod curve_labels;
#[path = "qcandle/threads.rs"]
mod threads;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use qcandle::data::Dataset;
use qcandle::device::DeviceSpec;
use qcandle::nn::{ModelKind, QConfig};
use qcandle::optim::{Decay, DecayShape, LossScale, LrSchedule};
use qcandle::run_stats::StatsEvery;
use qcandle::train::{train, train_with_stats, OptimizerKind, TrainOptions};
use qcandle::{quantize, Format, Quant, Rounding};

/// The reader of standard output closed the pipe.
#[derive(Debug)]
struct ClosedPipe;

impl std::fmt::Display for ClosedPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for ClosedPipe {}

/// Exit status for a closed standard output: 128 + SIGPIPE, what a shell reports for a
/// tool that SIGPIPE ended.
const CLOSED_PIPE_STATUS: u8 = 141;

/// Writes formatted text to standard output and flushes it: [`ClosedPipe`] when the reader
/// has gone, an error naming standard output for any other failure (a full disk).
fn write_stdout(args: std::fmt::Arguments) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_fmt(args)
        .and_then(|()| stdout.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => anyhow::Error::new(ClosedPipe),
            _ => anyhow::Error::new(e).context("cannot write to standard output"),
        })
}

/// `print!` that returns the write's error from the enclosing function instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { write_stdout(format_args!($($arg)*))? };
}

/// `println!` that returns the write's error from the enclosing function.
macro_rules! outln {
    () => { write_stdout(format_args!("\n"))? };
    ($($arg:tt)*) => { write_stdout(format_args!("{}\n", format_args!($($arg)*)))? };
}

/// `eprintln!` that never panics: a note lost to a closed or full standard error is not
/// worth a run.
macro_rules! note {
    ($($arg:tt)*) => {{ let _ = writeln!(std::io::stderr(), $($arg)*); }};
}

#[path = "qcandle/sweep.rs"]
mod sweep;

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
    /// their curves (labelled by config, or by run directory when configs repeat).
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
    /// Rounding statistics of a run trained with --stats: a table of its sites (layer and
    /// category), worst SQNR first, and pictures (SQNR heatmaps, histograms against the
    /// format, flushed and saturated fractions over time).
    Stats {
        /// The run directory.
        run: PathBuf,
        /// Where to write the pictures (default: the run directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// What rounding each tensor of a model file to a format does, without training: the
    /// rounding error and a histogram of log2|x| against the format.
    Inspect {
        /// A .safetensors file of float tensors (a run's model.safetensors).
        model: PathBuf,
        /// Formats (repeatable).
        #[arg(long = "format", required = true)]
        formats: Vec<Format>,
        /// Also draw the histograms against each format into this PNG file (one file per
        /// format: the format's name is added before the extension when there are several).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print the table only, without the text histograms.
        #[arg(long)]
        brief: bool,
    },
    /// Post-training quantization: evaluate a trained model in float32, float16, int8 and
    /// each format with naive and quire arithmetic; save the quantized model.
    Ptq(PtqArgs),
    /// Sweeps: a grid of training runs from one spec file, run locally or on Slurm, and
    /// their report.
    Sweep {
        #[command(subcommand)]
        command: sweep::SweepCommand,
    },
    /// Round a normal sample to every preset, then train LeNet-5 on the embedded
    /// Fashion-MNIST subset in float32 and posit<16,1> and print both accuracies, then evaluate
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
    /// Model: mlp, lenet5, lenet5-unpadded, cifarnet, lenet5-classic, transformer.
    #[arg(long, default_value = "lenet5")]
    model: String,
    /// Dataset: fashion-mnist, mnist, embedded (the Fashion-MNIST subset in the binary), or modadd (modular addition mod 97, generated; for the transformer).
    #[arg(long, default_value = "fashion-mnist")]
    data: String,
    /// Directory of the IDX .gz files (default: $QCANDLE_DATA, then the dataset's
    /// standard location).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Quantization config: a preset (float32, fp8, or a format preset such as bf16 or
    /// posit16 = posit<16,2>, meaning that format in every category), any format
    /// (posit<16,1>, float<5,2>) meaning the same, or a .toml/.json file.
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
    /// Steps of linear learning-rate warmup: step s (from 0) of the run at lr·(s+1)/N.
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// Learning-rate decay after the warmup, to 0 at the end of --decay-epochs: cosine or
    /// linear (default: none, the rate stays at --lr).
    #[arg(long)]
    decay: Option<DecayShape>,
    /// The epoch at whose end the decay reaches 0 (default: --epochs). Fixed, a run asked
    /// for more epochs later resumes with the same rates.
    #[arg(long, requires = "decay")]
    decay_epochs: Option<usize>,
    /// Weight decay (default: the optimizer's: adamw 1e-2, adam and sgd 0).
    #[arg(long)]
    weight_decay: Option<f64>,
    /// Adam's and AdamW's beta2 (default 0.999).
    #[arg(long)]
    beta2: Option<f64>,
    /// Loss scaling: none, a number (a static scale), dynamic (PyTorch GradScaler's
    /// defaults: init 65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000) or
    /// dynamic:init=N,growth_factor=G,backoff_factor=B,growth_interval=K (any of them).
    /// Given, it replaces the config's `loss_scale` and is recorded in the run's config (so
    /// it is part of the run). Default: the config's, else none.
    #[arg(long)]
    loss_scale: Option<LossScale>,
    /// Seed of the initial weights, the batch order and stochastic rounding (default: the
    /// config file's `seed`, else 0). Given, it replaces the config's seed.
    #[arg(long)]
    seed: Option<u64>,
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
    /// Device: cpu, cuda (the first GPU) or cuda:N. Its kind (cpu or cuda) is part of the
    /// run: a run resumes only on the same kind.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Record rounding statistics of every layer and category every N steps and at each
    /// epoch's last step (`--stats` alone: every=50) into stats.csv, stats_hist.csv and
    /// stats.json; CPU only. Changes no number of the training.
    #[arg(long, value_name = "every=N", num_args = 0..=1, default_missing_value = "every=50")]
    stats: Option<StatsEvery>,
}

#[derive(clap::Args)]
struct PtqArgs {
    /// The model file: a run's model.safetensors (f32) or a quantized model written by ptq.
    #[arg(long)]
    model: PathBuf,
    /// Formats to evaluate (repeatable): posits (a naive and a quire row), floats and
    /// clamped fixed point (a naive row), LNS (lns:ideal and lns:table rows), MX and NVFP4
    /// (f32 sums of operands blocked along the input channels); each model is also saved. A
    /// format followed by accumulate settings gives one row per setting instead:
    /// `"e4m3 naive:fp16 naive:fp32 fma:fp32"`, `"posit<8,0> naive quire naive:fp16"`,
    /// `"lns<12,6> lns:ideal lns:table"`. Block floating point and `noclamp` fixed point are
    /// refused, as is a setting the format cannot take. The transformer is built with a
    /// config per row instead: float32, float16, and per format f32, naive and (posits) quire
    /// sums, or the settings given. Default: the quantized model's format, else posit<8,0>.
    #[arg(long = "format")]
    formats: Vec<qcandle::ptq::FormatRows>,
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
    /// Device of the evaluation: cpu, cuda (the first GPU) or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

/// Rounds every float tensor of `input` to `format` and writes all of its tensors, the
/// others unchanged, to `output`.
fn run_quantize(
    format: Format,
    rounding: Rounding,
    seed: u64,
    input: &std::path::Path,
    output: &std::path::Path,
) -> Result<()> {
    let q = Quant::new(format).with_rounding(rounding).with_seed(seed);
    let done = qcandle::io::rewrite_float_tensors(input, output, |t| Ok(quantize(t, &q)?))?;
    if done.metadata_dropped > 0 {
        note!(
            "warning: {} has {} metadata entries, which an .npy file cannot hold; they are not in {}",
            input.display(),
            done.metadata_dropped,
            output.display()
        );
    }
    outln!(
        "{}: {} of {} tensors rounded to {format} ({rounding}), {} copied unchanged -> {}",
        input.display(),
        done.rounded,
        done.rounded + done.copied,
        done.copied,
        output.display()
    );
    Ok(())
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

/// Ctrl-C and SIGTERM stop training between two steps, never while an epoch's results are
/// being written (see [`qcandle::train::request_stop`]).
fn stop_training_on_signals() -> Result<()> {
    ctrlc::set_handler(qcandle::train::request_stop)
        .context("cannot install the Ctrl-C/SIGTERM handler")
}

fn run_train(args: TrainArgs) -> Result<()> {
    stop_training_on_signals()?;
    let mut config = QConfig::load(&args.config)?;
    if let Some(loss_scale) = args.loss_scale {
        config.loss_scale = loss_scale;
    }
    let options = TrainOptions {
        // The model's canonical name when it has one; `validate` names an unknown one.
        model: args
            .model
            .parse::<ModelKind>()
            .map_or(args.model.clone(), |m| m.to_string()),
        config_name: args.config.clone(),
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr,
        optimizer: args.optimizer,
        // The flag wins when given, then the config's seed (0 unless the file sets one).
        seed: args.seed.unwrap_or(config.seed),
        train_limit: args.train_limit,
        device: args.device,
        schedule: LrSchedule {
            warmup: args.warmup,
            decay: args.decay.map(|shape| Decay {
                shape,
                epochs: args.decay_epochs.unwrap_or(args.epochs),
            }),
        },
        weight_decay: args.weight_decay,
        beta2: args.beta2,
    };
    // Everything is checked before the data is read and before --out is created.
    options.validate()?;
    options.device.open()?;
    if args.stats.is_some() && options.device != DeviceSpec::Cpu {
        anyhow::bail!(
            "--stats records rounding statistics on the CPU only; train on {} without it",
            options.device
        );
    }
    let data = load_data(&args.data, args.data_dir.as_deref())?;
    let out = args
        .out
        .unwrap_or_else(|| qcandle::train::default_out(&options, &args.data));
    note!(
        "training {} on {} ({}) with config {}, seed {}, {} epochs, on {} -> {}",
        options.model,
        args.data,
        data.source,
        options.config_name,
        options.seed,
        options.epochs,
        options.device,
        out.display()
    );
    let records = train_with_stats(&data, &options, &config, Some(&out), args.quiet, args.stats)?;
    out!("{}", qcandle::train::metrics_csv(&records));
    if let Some(kib) = peak_rss_kib() {
        note!("peak resident memory: {:.1} MiB", kib as f64 / 1024.0);
    }
    Ok(())
}

fn run_compare(runs: &[PathBuf], plot: Option<&std::path::Path>, title: &str) -> Result<()> {
    // Every run is read and the plot path checked before the first line of the table, so
    // a bad argument leaves no partial table behind.
    let records = runs
        .iter()
        .map(|dir| finished_run(dir))
        .collect::<Result<Vec<_>>>()?;
    if let Some(path) = plot {
        check_plot_path(path)?;
    }
    let dir_names: Vec<String> = runs
        .iter()
        .map(|dir| {
            dir.file_name()
                .map_or(dir.display().to_string(), |n| n.to_string_lossy().into())
        })
        .collect();
    let configs: Vec<String> = records
        .iter()
        .map(|r| r.options.config_name.clone())
        .collect();
    let labels = curve_labels::curve_labels(&configs, &dir_names);
    let (mut loss, mut accuracy) = (Vec::new(), Vec::new());
    outln!(
        "| run | config | epochs | train loss | test top-1 | test top-5 | best top-1 | s/epoch |"
    );
    outln!("|---|---|---|---|---|---|---|---|");
    for ((name, record), label) in dir_names.iter().zip(&records).zip(&labels) {
        let last = record
            .epochs
            .last()
            .expect("finished_run refuses runs without a finished epoch");
        let best = record.epochs.iter().map(|e| e.top1).fold(0.0, f64::max);
        let seconds =
            record.epochs.iter().map(|e| e.seconds).sum::<f64>() / record.epochs.len() as f64;
        outln!(
            "| {name} | {} | {} | {:.4} | {:.2} | {:.2} | {best:.2} | {seconds:.1} |",
            record.options.config_name,
            last.epoch,
            last.train_loss,
            last.top1,
            last.top5
        );
        let (l, a) = record.curves(label);
        loss.push(l);
        accuracy.push(a);
    }
    if let Some(path) = plot {
        qcandle::plot::training_curves(title, &loss, &accuracy, path)?;
        note!("wrote {}", path.display());
    }
    Ok(())
}

/// The run record of the run directory `dir`, which must hold a run.json with at least
/// one finished epoch.
fn finished_run(dir: &std::path::Path) -> Result<qcandle::train::RunRecord> {
    if !dir.is_dir() {
        anyhow::bail!(
            "{}: no such run directory (one holding the run.json that `qcandle train` writes)",
            dir.display()
        );
    }
    if !dir.join("run.json").is_file() {
        anyhow::bail!(
            "{}: not a run directory: it holds no run.json (the record `qcandle train` writes)",
            dir.display()
        );
    }
    let record = qcandle::train::load_checked_run(dir)?;
    if record.epochs.is_empty() {
        anyhow::bail!("{} has no finished epoch", dir.display());
    }
    Ok(record)
}

/// Checks that `--plot` names a `.png` file that can be written: not a directory, ending
/// in `.png`, in a directory that can be created and written.
fn check_plot_path(path: &std::path::Path) -> Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "--plot {} is a directory; give the path of a .png file to write",
            path.display()
        );
    }
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        anyhow::bail!(
            "--plot {}: the plot is a PNG image; give a file path ending in .png",
            path.display()
        );
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    qcandle::ptq::prepare_out_dir(dir).with_context(|| format!("--plot {}", path.display()))
}

/// The dataset the run holding `model` was trained on, from its run.json: the embedded
/// subset, modadd (generated), or the named dataset read from the directory the run used.
fn dataset_of_run(model: &std::path::Path) -> Result<Option<Dataset>> {
    let Some(dir) = model.parent().filter(|d| d.join("run.json").exists()) else {
        return Ok(None);
    };
    let run = qcandle::train::load_run(dir)?;
    if run.data == "embedded" {
        return Ok(Some(qcandle::data::embedded()?));
    }
    if run.data == qcandle::data::DataSource::MODADD {
        return Ok(Some(load_data(&run.data, None)?));
    }
    if run.dataset.is_empty() {
        return Ok(None);
    }
    let path = std::path::Path::new(&run.data);
    Ok(Some(qcandle::data::load(run.dataset.parse()?, Some(path))?))
}

fn run_ptq(args: PtqArgs) -> Result<()> {
    let device = args.device.open()?;
    let arch = match &args.arch {
        Some(a) => Some(a.parse::<ModelKind>()?),
        None => qcandle::ptq::model_file::model_of_run(&args.model)?,
    };
    let weights = qcandle::ptq::read_weights(&args.model, arch)?;
    let formats = if !args.formats.is_empty() {
        args.formats.clone()
    } else {
        vec![weights.format.unwrap_or("posit<8,0>".parse()?).into()]
    };
    qcandle::ptq::check_formats(&formats)?;
    let data = match &args.data {
        Some(name) => load_data(name, args.data_dir.as_deref())?,
        None => dataset_of_run(&args.model)?.with_context(|| {
            format!(
                "cannot tell which dataset {} was trained on; pass --data",
                args.model.display()
            )
        })?,
    };
    weights.model.check_input(data.test_images.dims())?;
    let out = args.out.clone().unwrap_or_else(|| {
        args.model
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("ptq")
    });
    note!(
        "post-training quantization of {} ({}) on {} ({}), on {}",
        args.model.display(),
        weights.model,
        data.name.as_str(),
        data.source,
        args.device
    );
    let f32_bytes = match weights.format {
        None => std::fs::metadata(&args.model)
            .with_context(|| format!("cannot read {}", args.model.display()))?
            .len(),
        Some(_) => {
            4 * weights
                .tensors
                .values()
                .map(|t| t.elem_count() as u64)
                .sum::<u64>()
        }
    };
    let table = ptq_table(&weights, &data, &formats, &out, f32_bytes, &device)?;
    out!("{table}");
    Ok(())
}

/// Runs [`qcandle::ptq::run`] on `device`, printing each method's top-1 to standard error as
/// it is evaluated; returns the markdown report.
fn ptq_table(
    weights: &qcandle::ptq::Weights,
    data: &Dataset,
    formats: &[qcandle::ptq::FormatRows],
    out: &std::path::Path,
    f32_bytes: u64,
    device: &candle_core::Device,
) -> Result<String> {
    let progress = |m: qcandle::ptq::Method, s: &qcandle::ptq::Score| {
        note!("  {m}: top-1 {:.2}% ({:.1} s)", s.top1, s.seconds);
    };
    let report = qcandle::ptq::run(weights, data, formats, out, f32_bytes, device, progress)?;
    Ok(report.markdown)
}

/// `qcandle stats RUN`: the table of the run's statistics, worst first, and its pictures.
fn run_stats(run: &std::path::Path, out: Option<&std::path::Path>) -> Result<()> {
    let record = finished_run(run)?;
    if !record.files.contains_key("stats.csv") {
        anyhow::bail!(
            "{} holds no rounding statistics: train it with --stats (running the same command \
             with --stats and more --epochs records the new epochs)",
            run.display()
        );
    }
    let read = |name: &str| {
        std::fs::read_to_string(run.join(name))
            .with_context(|| format!("cannot read {}", run.join(name).display()))
    };
    let log = qcandle::run_stats::StatsLog::parse(&read("stats.csv")?, &read("stats_hist.csv")?)
        .with_context(|| format!("{}", run.display()))?;
    let epochs = log.epochs();
    let (first, last) = (epochs.first().copied(), epochs.last().copied());
    let dir = out.unwrap_or(run);
    qcandle::ptq::prepare_out_dir(dir)?;
    let title = format!("{} {}", record.options.model, record.options.config_name);
    let written = qcandle::run_stats::plots::write_plots(&log, &title, dir)?;
    outln!(
        "{}: rounding statistics of epochs {} to {}, last epoch pooled over its sampled steps, \
         worst SQNR first\n",
        run.display(),
        first.unwrap_or(0),
        last.unwrap_or(0)
    );
    out!("{}", qcandle::run_stats::summary::worst_first_table(&log));
    for path in written {
        note!("wrote {}", path.display());
    }
    Ok(())
}

/// `qcandle inspect MODEL --format F`: per tensor and format, the table and the histograms.
fn run_inspect(
    model: &std::path::Path,
    formats: &[Format],
    plot: Option<&std::path::Path>,
    brief: bool,
) -> Result<()> {
    if let Some(path) = plot {
        check_plot_path(path)?;
    }
    let tensors = qcandle::io::read_tensors(model)?;
    let mut all = Vec::new();
    for format in formats {
        let rows = qcandle::run_stats::inspect::inspect(&tensors, format)?;
        if let Some(path) = plot {
            let path = if formats.len() > 1 {
                let label = qcandle::train::config_label(&format.to_string());
                let stem = path
                    .file_stem()
                    .map_or("inspect".into(), |s| s.to_string_lossy());
                path.with_file_name(format!("{stem}-{label}.png"))
            } else {
                path.to_path_buf()
            };
            let panels: Vec<_> = rows
                .iter()
                .map(|r| qcandle::run_stats::plots::Panel {
                    caption: r.name.clone(),
                    histogram: r.stats.histogram.clone(),
                    format: r.format.to_string(),
                })
                .collect();
            let title = format!("{}: log2|x| against {format}", model.display());
            qcandle::run_stats::plots::histograms(&title, &panels, &path)?;
            note!("wrote {}", path.display());
        }
        all.extend(rows);
    }
    if all.is_empty() {
        anyhow::bail!("{} holds no float tensor", model.display());
    }
    out!("{}", qcandle::run_stats::inspect::table(&all));
    if !brief {
        for row in &all {
            outln!();
            out!("{}", qcandle::run_stats::inspect::histogram_text(row));
        }
    }
    Ok(())
}

fn run_demo(samples: usize, epochs: usize, seed: u64) -> Result<()> {
    out!("{}", qcandle::report::demo_report(samples, seed)?);
    let data = qcandle::data::embedded()?;
    outln!(
        "\nLeNet-5 on the embedded Fashion-MNIST subset ({}), {epochs} epochs, Adam lr 1e-3, batch 128\n",
        data.source
    );
    outln!("| config | train loss | test top-1 | test top-5 | seconds |");
    outln!("|---|---|---|---|---|");
    let runs = std::path::Path::new("runs").join("demo");
    for config_name in ["float32", "posit<16,1>"] {
        let options = TrainOptions {
            model: "lenet5".into(),
            config_name: config_name.into(),
            epochs,
            batch: 128,
            lr: 1e-3,
            optimizer: OptimizerKind::Adam,
            seed,
            train_limit: None,
            device: DeviceSpec::Cpu,
            schedule: Default::default(),
            weight_decay: None,
            beta2: None,
        };
        let label = qcandle::train::config_label(config_name);
        let out = runs.join(format!("lenet5-{label}-e{epochs}-s{seed}"));
        // The demo's own directory: a fresh run every time, never a stale one resumed.
        if out.exists() {
            std::fs::remove_dir_all(&out)
                .with_context(|| format!("cannot clear {}", out.display()))?;
        }
        let config = QConfig::load(config_name)?;
        let records = train(&data, &options, &config, Some(&out), false)?;
        let last = records.last().context("no epochs were run")?;
        let seconds: f64 = records.iter().map(|r| r.seconds).sum();
        outln!(
            "| {config_name} | {:.4} | {:.2}% | {:.2}% | {seconds:.1} |",
            last.train_loss,
            last.top1,
            last.top5
        );
    }
    let model = runs.join(format!(
        "lenet5-float32-e{epochs}-s{seed}/model.safetensors"
    ));
    outln!(
        "\nPost-training quantization of the float32 model ({}) on the same test images\n",
        model.display()
    );
    let weights = qcandle::ptq::read_weights(&model, Some(ModelKind::Lenet5))?;
    let f32_bytes = std::fs::metadata(&model)?.len();
    let out = model.with_file_name("ptq");
    out!(
        "{}",
        ptq_table(
            &weights,
            &data,
            &["posit<8,0>".parse()?],
            &out,
            f32_bytes,
            &candle_core::Device::Cpu
        )?
    );
    Ok(())
}

fn main() -> ExitCode {
    threads::tune_cpu_threads_on_main();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<ClosedPipe>() => ExitCode::from(CLOSED_PIPE_STATUS),
        Err(e) if e.is::<sweep::Stopped>() || e.is::<qcandle::train::Stopped>() => {
            note!("{e}");
            ExitCode::from(sweep::STOPPED_STATUS)
        }
        Err(e) => {
            note!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Formats => out!("{}", qcandle::report::formats_table()),
        Command::Quantize {
            format,
            rounding,
            seed,
            input,
            output,
        } => run_quantize(format, rounding, seed, &input, &output)?,
        Command::Train(args) => run_train(args)?,
        Command::Ptq(args) => run_ptq(args)?,
        Command::Stats { run, out } => run_stats(&run, out.as_deref())?,
        Command::Inspect {
            model,
            formats,
            plot,
            brief,
        } => run_inspect(&model, &formats, plot.as_deref(), brief)?,
        Command::Sweep { command } => sweep::run(command)?,
        Command::Compare { runs, plot, title } => run_compare(&runs, plot.as_deref(), &title)?,
        Command::Demo {
            samples,
            epochs,
            seed,
        } => run_demo(samples, epochs, seed)?,
    }
    Ok(())
}
