//! The local backend: a sweep's unfinished points run as child processes, `workers` at a
//! time, on this machine.
//!
//! Each child is `qcandle sweep task SPEC --dir DIR --index I` (the code a Slurm array task
//! runs too), with the machine's cores split between the workers through
//! `RAYON_NUM_THREADS` and its output appended to `DIR/logs/<name>.log`. A child that fails
//! is recorded (`DIR/failed/<name>.txt`) and the others go on. The sweep directory is locked
//! for the whole run, so two local sweeps never share it; each point's run directory is
//! locked by the child that trains it, so a point that a Slurm task (or anyone) is training
//! is left alone.
//!
//! Stopping: when `stop` becomes true (the tool sets it on Ctrl-C or SIGTERM) no new point
//! starts, the running children get SIGTERM and are waited for. Training writes its results
//! after every epoch, atomically, so a stopped point loses only its unfinished epoch and the
//! next run resumes it.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::plan::Plan;
use super::point::{state, State, SweepDir};
use crate::run_dir::RunLock;

/// How the local backend runs.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Points run at once (at least 1).
    pub workers: usize,
    /// CPU threads in all (split between the workers); `None`: the machine's.
    pub threads: Option<usize>,
    /// The `qcandle` executable the children run.
    pub exe: PathBuf,
    /// The spec file, as the children are given it.
    pub spec: PathBuf,
    /// No progress bar.
    pub quiet: bool,
}

/// What a local run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Points already finished before the run (checked, not run again).
    pub already_finished: usize,
    /// Points being written by another process, left alone.
    pub busy: Vec<String>,
    /// Points finished by this run.
    pub finished: Vec<String>,
    /// Points that failed: name and error.
    pub failed: Vec<(String, String)>,
    /// Points stopped or never started because the run was stopped.
    pub stopped: Vec<String>,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
}

/// A running child.
struct Running {
    child: Child,
    name: String,
    started: Instant,
}

/// Runs every unfinished point of `plan` in `dir` (see the module docs). Returns what
/// happened; failed points are in the outcome, not an error. Errors: the directory cannot
/// be created or locked, a child cannot be started.
pub fn run(plan: &Plan, dir: &SweepDir, options: &LocalOptions, stop: &AtomicBool) -> Result<Outcome> {
    let start = Instant::now();
    let _lock = RunLock::acquire(dir.root()).context("the sweep directory")?;
    dir.write_plan(plan)?;
    for warning in &plan.warnings {
        note(&format!("warning: {warning}"));
    }
    let mut outcome = Outcome::default();
    let mut queue = VecDeque::new();
    for point in &plan.points {
        match state(dir, point).0 {
            State::Finished => outcome.already_finished += 1,
            State::Running => outcome.busy.push(point.name.clone()),
            _ => queue.push_back(point.index),
        }
    }
    let workers = options.workers.max(1);
    let threads = options
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let per_child = (threads / workers).max(1);
    let bar = progress_bar(options.quiet, queue.len());
    let mut running: Vec<Running> = Vec::new();
    loop {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        while running.len() < workers {
            let Some(index) = queue.pop_front() else { break };
            running.push(spawn(plan, dir, options, index, per_child)?);
        }
        if running.is_empty() {
            break;
        }
        bar.set_message(status_message(&running, &outcome));
        std::thread::sleep(Duration::from_millis(50));
        let mut i = 0;
        while i < running.len() {
            match running[i].child.try_wait()? {
                None => i += 1,
                Some(status) => {
                    let done = running.swap_remove(i);
                    let seconds = done.started.elapsed().as_secs_f64();
                    if status.success() {
                        bar.suspend(|| note(&format!("finished {} ({seconds:.1} s)", done.name)));
                        outcome.finished.push(done.name);
                    } else {
                        let error = failure_of(dir, &done.name, &status.to_string());
                        bar.suspend(|| note(&format!("FAILED {}: {error}", done.name)));
                        outcome.failed.push((done.name, error));
                    }
                    bar.inc(1);
                    bar.set_message(status_message(&running, &outcome));
                }
            }
        }
    }
    if !running.is_empty() || !queue.is_empty() {
        for r in &running {
            terminate(&r.child);
        }
        for mut r in running {
            let _ = r.child.wait();
            outcome.stopped.push(r.name);
        }
        outcome
            .stopped
            .extend(queue.iter().map(|&i| plan.points[i].name.clone()));
    }
    bar.finish_and_clear();
    outcome.seconds = start.elapsed().as_secs_f64();
    Ok(outcome)
}

/// Starts the child that runs point `index`, its output appended to the point's log.
fn spawn(
    plan: &Plan,
    dir: &SweepDir,
    options: &LocalOptions,
    index: usize,
    threads: usize,
) -> Result<Running> {
    let name = plan.points[index].name.clone();
    let log_path = dir.log_file(&name);
    if let Some(parent) = log_path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let _ = writeln!(log, "== point {index} `{name}`, {threads} threads");
    let child = Command::new(&options.exe)
        .arg("sweep")
        .arg("task")
        .arg(&options.spec)
        .arg("--dir")
        .arg(dir.root())
        .arg("--index")
        .arg(index.to_string())
        .arg("--quiet")
        .env("RAYON_NUM_THREADS", threads.to_string())
        .env_remove("CANDLE_NUM_THREADS")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", options.exe.display()))?;
    Ok(Running {
        child,
        name,
        started: Instant::now(),
    })
}

/// Asks a child to stop (SIGTERM; it has no state to save beyond its finished epochs).
fn terminate(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a pid this process spawned and has not reaped yet (the child
        // is waited for only after this call), so the pid names that child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// The error a failed child recorded, else its exit status with the log's path.
fn failure_of(dir: &SweepDir, name: &str, status: &str) -> String {
    std::fs::read_to_string(dir.failure_file(name))
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string))
        .unwrap_or_else(|| {
            format!(
                "the worker exited with {status}; see {}",
                dir.log_file(name).display()
            )
        })
}

fn status_message(running: &[Running], outcome: &Outcome) -> String {
    format!(
        "running {}, failed {}",
        running.len(),
        outcome.failed.len()
    )
}

fn progress_bar(quiet: bool, len: usize) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    let style = indicatif::ProgressStyle::with_template(
        "sweep [{bar:30}] {pos}/{len} done, {msg}  {elapsed_precise} (ETA {eta})",
    )
    .expect("a valid template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(500));
    bar
}

fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// The path a child is given for the spec: absolute, so a child started in another
/// directory finds it.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}
