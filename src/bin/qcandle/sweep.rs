//! `qcandle sweep`: the subcommands over a sweep spec (see [`qcandle::sweep`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Subcommand;

use qcandle::device::DeviceSpec;
use qcandle::sweep::slurm::SubmitOptions;
use qcandle::sweep::submit::{self, Queue};
use qcandle::sweep::{local, report, Plan, Spec, SweepDir};

use super::write_stdout;

/// The sweep a subcommand works on: its spec, the device of its points, its directory.
#[derive(clap::Args)]
pub struct Target {
    /// The sweep spec (TOML).
    spec: PathBuf,
    /// Device of every point whose spec does not vary it: cpu, cuda, cuda:N (default: the
    /// spec's `device`, else cpu).
    #[arg(long)]
    device: Option<DeviceSpec>,
    /// Sweep directory (default: sweeps/<name>).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The sweep subcommands.
#[derive(Subcommand)]
pub enum SweepCommand {
    /// List the points of a spec: index, run name and axis values.
    Plan {
        /// The sweep spec (TOML).
        spec: PathBuf,
        /// Device of every point whose spec does not vary it: cpu, cuda, cuda:N (default:
        /// the spec's `device`, else cpu).
        #[arg(long)]
        device: Option<DeviceSpec>,
    },
    /// Run the unfinished points on this machine, N at a time; again, it skips finished
    /// points and resumes interrupted ones.
    Run {
        #[command(flatten)]
        target: Target,
        /// Points run at once; the machine's cores are split between them.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Submit the unfinished points to Slurm as one array job (task I runs point I); again,
    /// it submits only what is neither finished, running nor queued.
    Submit {
        /// The spec, device and directory; the directory must be on a filesystem the
        /// compute nodes share, and every task is given the device.
        #[command(flatten)]
        target: Target,
        /// Slurm partition (default: the cluster's).
        #[arg(long)]
        partition: Option<String>,
        /// GPUs for each task.
        #[arg(long)]
        gpus_per_task: Option<u32>,
        /// CPUs for each task; the task trains with that many threads.
        #[arg(long)]
        cpus_per_task: Option<u32>,
        /// Time limit of each task, as Slurm reads it (e.g. 2:00:00).
        #[arg(long)]
        time: Option<String>,
        /// At most this many tasks run at once.
        #[arg(long)]
        max_parallel: Option<usize>,
        /// A further sbatch option, written verbatim (e.g. --sbatch-arg=--account=proj);
        /// repeatable.
        #[arg(long = "sbatch-arg", allow_hyphen_values = true)]
        sbatch_args: Vec<String>,
        /// Write the sweep directory's plan.json and sweep.sbatch; submit nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run one point (what each local worker and each Slurm array task runs).
    Task {
        #[command(flatten)]
        target: Target,
        /// The point's index (`qcandle sweep plan` lists them).
        #[arg(long)]
        index: usize,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// The state of every point: pending, partial, running, finished, failed, and queued
    /// when a submitted Slurm task waits for it.
    Status {
        #[command(flatten)]
        target: Target,
    },
    /// Write report.md, report.csv and plots of the points' results into the sweep
    /// directory.
    Report {
        #[command(flatten)]
        target: Target,
    },
}

/// Exit status of a sweep stopped by a signal: 128 + SIGINT, what a shell reports for a
/// tool that Ctrl-C ended.
pub const STOPPED_STATUS: u8 = 130;

/// A sweep that was stopped before every point ran.
#[derive(Debug)]
pub struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the sweep was stopped")
    }
}

impl std::error::Error for Stopped {}

/// The spec read and expanded, and its sweep directory.
fn open(spec: &Path, dir: Option<PathBuf>, device: Option<DeviceSpec>) -> Result<(Plan, SweepDir)> {
    let mut spec = Spec::load(spec)?;
    if let Some(device) = device {
        spec.set_device(device);
    }
    let plan =
        Plan::expand(&spec).with_context(|| format!("sweep spec {}", spec.path.display()))?;
    let dir = dir.unwrap_or_else(|| qcandle::sweep::default_dir(&spec.name));
    Ok((plan, SweepDir::new(dir)))
}

/// Runs a sweep subcommand.
pub fn run(command: SweepCommand) -> Result<()> {
    match command {
        SweepCommand::Plan { spec, device } => plan(&spec, device),
        SweepCommand::Run {
            target: Target { spec, device, dir },
            workers,
            quiet,
        } => run_local(&spec, dir, device, workers, quiet),
        SweepCommand::Submit {
            target: Target { spec, device, dir },
            partition,
            gpus_per_task,
            cpus_per_task,
            time,
            max_parallel,
            sbatch_args,
            dry_run,
        } => {
            let options = SubmitOptions {
                partition,
                gpus_per_task,
                cpus_per_task,
                time,
                max_parallel,
                extra_args: sbatch_args,
                device,
            };
            submit_to_slurm(&spec, dir, options, dry_run)
        }
        SweepCommand::Task {
            target: Target { spec, device, dir },
            index,
            quiet,
        } => {
            super::stop_training_on_signals()?;
            let (plan, dir) = open(&spec, dir, device)?;
            qcandle::sweep::run_point(&dir, &plan, index, quiet)
        }
        SweepCommand::Status {
            target: Target { spec, device, dir },
        } => status(&spec, dir, device),
        SweepCommand::Report {
            target: Target { spec, device, dir },
        } => {
            let (plan, dir) = open(&spec, dir, device)?;
            require_dir(&dir)?;
            for path in report::write(&plan, &dir)? {
                outln!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

fn plan(spec: &Path, device: Option<DeviceSpec>) -> Result<()> {
    let (plan, _) = open(spec, None, device)?;
    for warning in &plan.warnings {
        note!("warning: {warning}");
    }
    outln!(
        "sweep `{}`: {} points ({})\n",
        plan.spec.name,
        plan.points.len(),
        spec.display()
    );
    let mut header = vec!["index".to_string(), "run".to_string()];
    header.extend(plan.axes.iter().map(|k| k.to_string()));
    outln!("| {} |", header.join(" | "));
    outln!("|{}", "---|".repeat(header.len()));
    for p in &plan.points {
        let mut cells = vec![p.index.to_string(), p.name.clone()];
        cells.extend(
            plan.axes
                .iter()
                .map(|&k| p.axis(k).map_or("-".to_string(), |v| v.to_string())),
        );
        outln!("| {} |", cells.join(" | "));
    }
    Ok(())
}

fn submit_to_slurm(
    spec: &Path,
    dir: Option<PathBuf>,
    options: SubmitOptions,
    dry_run: bool,
) -> Result<()> {
    let (plan, dir) = open(spec, dir, options.device)?;
    for warning in &plan.warnings {
        note!("warning: {warning}");
    }
    let request = submit::Request {
        exe: std::env::current_exe().context("cannot find the qcandle executable")?,
        spec: spec.to_path_buf(),
        options,
        dry_run,
    };
    let done = submit::submit(&plan, &dir, &request)?;
    let s = &done.selection;
    if let Queue::Unknown(why) = &done.queue {
        note!(
            "warning: could not ask Slurm's queue about this sweep's earlier jobs ({why}): \
             points they still hold may be submitted again"
        );
    }
    note!(
        "sweep `{}`: {} points: {} finished, {} running, {} queued in Slurm, {} to submit",
        plan.spec.name,
        plan.points.len(),
        s.finished,
        s.running.len(),
        s.queued.len(),
        s.to_submit.len()
    );
    let (Some(script), Some(array)) = (&done.script, &done.array) else {
        outln!("nothing to submit: every point is finished, running or queued");
        return Ok(());
    };
    let follow = format!(
        "qcandle sweep status {} --dir {}",
        spec.display(),
        dir.root().display()
    );
    match &done.job_id {
        Some(job) => {
            outln!(
                "submitted job {job}: array {array} ({} points)",
                s.to_submit.len()
            );
            outln!("follow it with: {follow}");
            outln!(
                "task logs: {}",
                qcandle::sweep::slurm::log_dir(dir.root()).display()
            );
        }
        None => {
            outln!(
                "wrote {} (array {array}, {} points); not submitted (--dry-run)",
                script.display(),
                s.to_submit.len()
            );
            outln!("submit it with `qcandle sweep submit` without --dry-run (which records the job for `sweep status`)");
        }
    }
    Ok(())
}

/// Refuses a sweep directory that does not exist (a mistyped `--dir` would otherwise report
/// every point as pending).
fn require_dir(dir: &SweepDir) -> Result<()> {
    if !dir.root().is_dir() {
        bail!(
            "{}: no such sweep directory; run the sweep first (`qcandle sweep run` or `sweep \
             submit`) or pass the --dir it used",
            dir.root().display()
        );
    }
    Ok(())
}

fn status(spec: &Path, dir: Option<PathBuf>, device: Option<DeviceSpec>) -> Result<()> {
    let (plan, dir) = open(spec, dir, device)?;
    require_dir(&dir)?;
    let queue = submit::queue(&dir);
    let rows = report::gather(&plan, &dir);
    outln!("| index | run | status | epochs | top-1 % |");
    outln!("|---|---|---|---|---|");
    for row in &rows {
        let top1 = row.last().map_or(String::new(), |l| format!("{:.2}", l.0));
        let epochs = row.record.as_ref().map_or(0, |r| r.epochs.len());
        outln!(
            "| {} | {} | {} | {epochs}/{} | {top1} |",
            row.point.index,
            row.point.name,
            submit::status_text(&row.state, queue.task(row.point.index)),
            row.point.settings.options.epochs
        );
    }
    let finished = rows
        .iter()
        .filter(|r| r.state == qcandle::sweep::State::Finished)
        .count();
    let queued = rows
        .iter()
        .filter(|r| {
            r.state != qcandle::sweep::State::Finished && queue.task(r.point.index).is_some()
        })
        .count();
    outln!(
        "\n{finished} of {} points finished, {queued} queued in Slurm ({})",
        rows.len(),
        dir.root().display()
    );
    if let Queue::Unknown(why) = &queue {
        outln!("could not ask Slurm's queue about the submitted jobs ({why}): the states are from the sweep directory only");
    }
    Ok(())
}

fn run_local(
    spec: &Path,
    dir: Option<PathBuf>,
    device: Option<DeviceSpec>,
    workers: usize,
    quiet: bool,
) -> Result<()> {
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    let (plan, dir) = open(spec, dir, device)?;
    // Every device the points use opens here, before any worker starts: a binary without
    // CUDA support or a missing GPU is one clear error, not a failure of every point.
    let mut devices: Vec<DeviceSpec> = Vec::new();
    for point in &plan.points {
        let d = point.settings.options.device;
        if !devices.contains(&d) {
            d.open()?;
            devices.push(d);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("cannot install the Ctrl-C/SIGTERM handler")?;
    let options = local::LocalOptions {
        workers,
        threads: None,
        exe: std::env::current_exe().context("cannot find the qcandle executable")?,
        spec: local::absolute(spec)?,
        device,
        quiet,
    };
    note!(
        "sweep `{}`: {} points, {workers} worker(s) -> {}",
        plan.spec.name,
        plan.points.len(),
        dir.root().display()
    );
    let outcome = local::run(&plan, &dir, &options, &stop)?;
    note!(
        "{} finished now, {} already finished, {} failed, {} busy elsewhere, {} stopped ({:.1} s)",
        outcome.finished.len(),
        outcome.already_finished,
        outcome.failed.len(),
        outcome.busy.len(),
        outcome.stopped.len(),
        outcome.seconds
    );
    for name in &outcome.busy {
        note!("  {name}: being written by another process; left alone");
    }
    if !outcome.stopped.is_empty() {
        note!("stopped: running the same command again resumes the unfinished points");
        return Err(Stopped.into());
    }
    if !outcome.failed.is_empty() {
        for (name, error) in &outcome.failed {
            note!("  {name}: {error}");
        }
        bail!(
            "{} of {} points failed; their errors are in {} and their output in {}",
            outcome.failed.len(),
            plan.points.len(),
            dir.root().join("failed").display(),
            dir.root().join("logs").display()
        );
    }
    Ok(())
}
