//! `qcandle sweep`: the subcommands over a sweep spec (see [`qcandle::sweep`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Subcommand;

use qcandle::sweep::{local, report, Plan, Spec, SweepDir};

use super::write_stdout;

/// The sweep subcommands.
#[derive(Subcommand)]
pub enum SweepCommand {
    /// List the points of a spec: index, run name and axis values.
    Plan {
        /// The sweep spec (TOML).
        spec: PathBuf,
    },
    /// Run the unfinished points on this machine, N at a time; again, it skips finished
    /// points and resumes interrupted ones.
    Run {
        /// The sweep spec (TOML).
        spec: PathBuf,
        /// Sweep directory (default: sweeps/<name>).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Points run at once; the machine's cores are split between them.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Run one point (what each local worker and each Slurm array task runs).
    Task {
        /// The sweep spec (TOML).
        spec: PathBuf,
        /// Sweep directory (default: sweeps/<name>).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The point's index (`qcandle sweep plan` lists them).
        #[arg(long)]
        index: usize,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// The state of every point: pending, partial, running, finished, failed.
    Status {
        /// The sweep spec (TOML).
        spec: PathBuf,
        /// Sweep directory (default: sweeps/<name>).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Write report.md, report.csv and plots of the points' results into the sweep
    /// directory.
    Report {
        /// The sweep spec (TOML).
        spec: PathBuf,
        /// Sweep directory (default: sweeps/<name>).
        #[arg(long)]
        dir: Option<PathBuf>,
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
fn open(spec: &Path, dir: Option<PathBuf>) -> Result<(Plan, SweepDir)> {
    let spec = Spec::load(spec)?;
    let plan = Plan::expand(&spec).with_context(|| format!("sweep spec {}", spec.path.display()))?;
    let dir = dir.unwrap_or_else(|| qcandle::sweep::default_dir(&spec.name));
    Ok((plan, SweepDir::new(dir)))
}

/// Runs a sweep subcommand.
pub fn run(command: SweepCommand) -> Result<()> {
    match command {
        SweepCommand::Plan { spec } => plan(&spec),
        SweepCommand::Run {
            spec,
            dir,
            workers,
            quiet,
        } => run_local(&spec, dir, workers, quiet),
        SweepCommand::Task {
            spec,
            dir,
            index,
            quiet,
        } => {
            let (plan, dir) = open(&spec, dir)?;
            qcandle::sweep::run_point(&dir, &plan, index, quiet)
        }
        SweepCommand::Status { spec, dir } => status(&spec, dir),
        SweepCommand::Report { spec, dir } => {
            let (plan, dir) = open(&spec, dir)?;
            for path in report::write(&plan, &dir)? {
                outln!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

fn plan(spec: &Path) -> Result<()> {
    let (plan, _) = open(spec, None)?;
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

fn status(spec: &Path, dir: Option<PathBuf>) -> Result<()> {
    let (plan, dir) = open(spec, dir)?;
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
            row.state,
            row.point.settings.options.epochs
        );
    }
    let finished = rows
        .iter()
        .filter(|r| r.state == qcandle::sweep::State::Finished)
        .count();
    outln!("\n{finished} of {} points finished ({})", rows.len(), dir.root().display());
    Ok(())
}

fn run_local(spec: &Path, dir: Option<PathBuf>, workers: usize, quiet: bool) -> Result<()> {
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    let (plan, dir) = open(spec, dir)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("cannot install the Ctrl-C/SIGTERM handler")?;
    let options = local::LocalOptions {
        workers,
        threads: None,
        exe: std::env::current_exe().context("cannot find the qcandle executable")?,
        spec: local::absolute(spec)?,
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
