//! One point of a sweep: where its files live, how far it got, and running it.
//!
//! Layout of a sweep directory `DIR`:
//!
//! | path                    | what                                                        |
//! |-------------------------|-------------------------------------------------------------|
//! | `plan.json`             | the points as last planned: index, name, settings digest   |
//! | `runs/<name>/`          | the point's run directory (`qcandle train`'s layout), `ptq/` inside |
//! | `failed/<name>.txt`     | the error of the point's last failed attempt               |
//! | `logs/<name>.log`       | the output of its local attempts                           |
//! | `report.md`, `report.csv`, `*.png` | `qcandle sweep report`                         |
//!
//! A point is finished when its run directory passes [`crate::train::load_checked_run`] (every
//! file's digest), holds at least the epochs asked for, is the same run as the point (model,
//! options, config contents), and, when the sweep has a PTQ step, its `ptq/ptq.csv` has a row
//! for every format, and, when the spec asks for rounding statistics (`stats`), every
//! trained epoch has them at the asked interval. Statistics are not part of a run's identity
//! (they change no number of it; names, digests and `run.json` are the same with or without
//! them), but they cannot be added to an epoch after it was trained: a run whose trained
//! epochs lack them is a conflict, not resumed, since resuming would record only the later
//! epochs (delete its directory to train it again with them). A resumed run with statistics
//! reads back those of its trained epochs and records the rest, so it ends complete. A config
//! that rounds nothing has no statistics to record. Running a point ([`run_point`]) is the same code for a local worker and
//! a Slurm array task: it trains (resuming what an interrupted attempt left), then runs the
//! PTQ step, and records a failure's error in `failed/<name>.txt`.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::plan::{Plan, PlanRecord, Point};
use crate::io::write_atomically;
use crate::nn::ModelKind;
use crate::train::{identity_differences, load_checked_run, RunRecord};

/// The paths of a sweep directory (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepDir {
    root: PathBuf,
}

impl SweepDir {
    /// The sweep directory `root` (not created).
    pub fn new(root: impl Into<PathBuf>) -> SweepDir {
        SweepDir { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `plan.json`.
    pub fn plan_file(&self) -> PathBuf {
        self.root.join("plan.json")
    }

    /// The run directory of the point `name`.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.root.join("runs").join(name)
    }

    /// Where the point `name`'s last failure is recorded.
    pub fn failure_file(&self, name: &str) -> PathBuf {
        self.root.join("failed").join(format!("{name}.txt"))
    }

    /// The log of the point `name`'s local attempts.
    pub fn log_file(&self, name: &str) -> PathBuf {
        self.root.join("logs").join(format!("{name}.log"))
    }

    /// Writes `plan.json` for `plan`.
    pub fn write_plan(&self, plan: &Plan) -> Result<()> {
        let text = serde_json::to_string_pretty(&plan.record())?;
        write_text(&self.plan_file(), &text)
    }

    /// The recorded plan, if there is one.
    pub fn read_plan(&self) -> Result<Option<PlanRecord>> {
        let path = self.plan_file();
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let record = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a sweep plan (damaged?)", path.display()))?;
        Ok(Some(record))
    }
}

/// How far a point got.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Nothing run yet.
    Pending,
    /// Some epochs finished (`done` of `total`), or training finished but not the PTQ step.
    Partial {
        /// Finished epochs.
        done: usize,
        /// Epochs asked for.
        total: usize,
    },
    /// Every epoch and the PTQ step finished, files checked.
    Finished,
    /// Another process is writing the run now.
    Running,
    /// The last attempt failed with this error (its first line).
    Failed(String),
    /// The run directory holds something that is not this point's run (why).
    Conflict(String),
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Pending => f.write_str("pending"),
            State::Partial { done, total } => write!(f, "partial ({done}/{total} epochs)"),
            State::Finished => f.write_str("finished"),
            State::Running => f.write_str("running"),
            State::Failed(e) => write!(f, "failed: {e}"),
            State::Conflict(e) => write!(f, "conflict: {e}"),
        }
    }
}

impl State {
    /// The one-word status of report tables: pending, partial, finished, running, failed,
    /// conflict.
    pub fn word(&self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Partial { .. } => "partial",
            State::Finished => "finished",
            State::Running => "running",
            State::Failed(_) => "failed",
            State::Conflict(_) => "conflict",
        }
    }
}

/// The state of `point` in `dir`, with its checked run record when it has one.
pub fn state(dir: &SweepDir, point: &Point) -> (State, Option<RunRecord>) {
    let run_dir = dir.run_dir(&point.name);
    if is_locked(&run_dir) {
        return (State::Running, None);
    }
    let failure = std::fs::read_to_string(dir.failure_file(&point.name))
        .ok()
        .map(|text| text.lines().next().unwrap_or("").to_string());
    let fallback = |failure: Option<String>, otherwise: State| match failure {
        Some(e) => State::Failed(e),
        None => otherwise,
    };
    if !run_dir.join("run.json").exists() {
        return (fallback(failure, State::Pending), None);
    }
    let record = match load_checked_run(&run_dir) {
        Ok(r) => r,
        Err(e) => return (fallback(failure, State::Conflict(first_line(&e))), None),
    };
    if let Some(why) = differs(point, &record).or_else(|| stats_gap(&run_dir, point, &record)) {
        return (State::Conflict(why), Some(record));
    }
    let (done, total) = (record.epochs.len(), point.settings.options.epochs);
    let finished = done >= total && ptq_done(&run_dir, point);
    let state = if finished {
        State::Finished
    } else {
        fallback(failure, State::Partial { done, total })
    };
    (state, Some(record))
}

/// Why the run in a point's directory is not the point's run, if it is not (the data is
/// not compared: that needs the data loaded; training compares it).
fn differs(point: &Point, record: &RunRecord) -> Option<String> {
    let ours = RunRecord {
        options: point.settings.options.clone(),
        config: point.settings.config.to_toml(),
        data: record.data.clone(),
        dataset: record.dataset.clone(),
        data_sha256: record.data_sha256.clone(),
        epochs: Vec::new(),
        files: Default::default(),
    };
    let diffs = identity_differences(record, &ours);
    (!diffs.is_empty()).then(|| format!("the directory holds another run ({})", diffs.join("; ")))
}

/// Why the run in `run_dir` (whose checked record is `record`) lacks statistics its point
/// asks for, if it does: with `stats = "every=N"`, every trained epoch must have statistics
/// recorded every N steps, since they cannot be added to an epoch after it was trained. A
/// config that rounds nothing has no site to record, so its runs never have statistics.
fn stats_gap(run_dir: &Path, point: &Point, record: &RunRecord) -> Option<String> {
    let every = point.settings.stats?;
    if !rounds_anything(&point.settings.config) || record.epochs.is_empty() {
        return None;
    }
    let recorded = recorded_stats_epochs(run_dir, record);
    let missing: Vec<usize> = (1..=record.epochs.len())
        .filter(|e| !recorded.contains(&(*e, every.0)))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let had = if recorded.is_empty() {
        "none".to_string()
    } else {
        let list: Vec<String> = recorded
            .iter()
            .map(|(e, n)| format!("epoch {e} every={n}"))
            .collect();
        list.join(", ")
    };
    Some(format!(
        "the spec asks for rounding statistics every={}, but trained epochs {} of {} have none \
         at that interval (recorded: {had}); statistics cannot be added to trained epochs: \
         delete {} to train the point again with them, or change `stats` in the spec",
        every.0,
        ranges(&missing),
        run_dir.display(),
        run_dir.display()
    ))
}

/// The (epoch, sampling interval) pairs the run's `stats.json` records (none without one;
/// its digest was checked with the run's other files).
fn recorded_stats_epochs(run_dir: &Path, record: &RunRecord) -> Vec<(usize, usize)> {
    if !record.files.contains_key("stats.json") {
        return Vec::new();
    }
    let Ok(text) = std::fs::read_to_string(run_dir.join("stats.json")) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    json["epochs"]
        .as_array()
        .map(|epochs| {
            epochs
                .iter()
                .filter_map(|e| {
                    let n = |k: &str| e[k].as_u64().and_then(|v| usize::try_from(v).ok());
                    Some((n("epoch")?, n("every")?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `config` rounds any category of any layer (a run of one that does not has no
/// statistics to record).
fn rounds_anything(config: &crate::nn::QConfig) -> bool {
    let base = crate::nn::Category::ALL
        .iter()
        .any(|&c| config.base.get(c).is_some());
    base || config
        .layers
        .iter()
        .any(|o| o.set.values().any(Option::is_some))
}

/// Sorted numbers as ranges: `1-3, 5`.
fn ranges(numbers: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let mut j = i;
        while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            numbers[i].to_string()
        } else {
            format!("{}-{}", numbers[i], numbers[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// Whether `run_dir` is locked by a writer (a live process holding `.lock`).
fn is_locked(run_dir: &Path) -> bool {
    let Ok(file) = File::open(run_dir.join(crate::run_dir::LOCK_FILE)) else {
        return false;
    };
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Whether the PTQ step of `point` has written the first row of every format (true without
/// one).
fn ptq_done(run_dir: &Path, point: &Point) -> bool {
    if point.settings.ptq.is_empty() {
        return true;
    }
    let Ok(csv) = std::fs::read_to_string(run_dir.join("ptq").join("ptq.csv")) else {
        return false;
    };
    point.settings.ptq.iter().all(|spec| {
        let Some(&first) = crate::ptq::row_settings(spec).first() else {
            return true;
        };
        let row = crate::ptq::plan_method(spec.format, first).to_string();
        csv.lines()
            .any(|l| crate::io::csv_fields(l).first() == Some(&row))
    })
}

fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}").lines().next().unwrap_or("").to_string()
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    write_atomically(path, |tmp| {
        std::fs::write(tmp, text).with_context(|| format!("cannot write {}", tmp.display()))
    })
}

/// Checks that the point at `index` of `plan` is the one `dir`'s `plan.json` recorded (a
/// spec edited after a Slurm submission would otherwise run another point under the index).
pub fn check_planned(dir: &SweepDir, plan: &Plan, index: usize) -> Result<()> {
    let Some(point) = plan.points.get(index) else {
        bail!(
            "index {index} is beyond the plan's {} points (0..={})",
            plan.points.len(),
            plan.points.len().saturating_sub(1)
        );
    };
    if let Some(record) = dir.read_plan()? {
        let planned = record.points.get(index);
        let same =
            planned.is_some_and(|p| p.name == point.name && p.digest == point.settings.digest());
        if !same {
            bail!(
                "the spec no longer gives the point {index} that {} recorded ({}): it was \
                 edited after the sweep was planned; run `qcandle sweep run` or `sweep submit` \
                 again to plan it anew",
                dir.plan_file().display(),
                planned.map_or("none".to_string(), |p| format!("`{}`", p.name)),
            );
        }
    }
    Ok(())
}

/// Runs the point at `index`: trains it in its run directory (resuming an interrupted
/// attempt; a finished one is checked and left alone; one another process is writing is an
/// error, not recorded as the point's failure), then the PTQ step when the sweep has
/// one and it has not been done. A failure is recorded in `failed/<name>.txt` and returned;
/// success removes that record. `quiet` hides the progress bars.
pub fn run_point(dir: &SweepDir, plan: &Plan, index: usize, quiet: bool) -> Result<()> {
    check_planned(dir, plan, index)?;
    let point = &plan.points[index];
    let (current, record) = state(dir, point);
    match current {
        State::Finished => return Ok(()),
        // Not a failure of the point: whoever holds it records its outcome.
        State::Running => bail!(
            "sweep point {index} `{}`: {} is being written by another process",
            point.name,
            dir.run_dir(&point.name).display()
        ),
        _ => {}
    }
    // Resuming would record statistics of the later epochs only.
    let result = match record.and_then(|r| stats_gap(&dir.run_dir(&point.name), point, &r)) {
        Some(why) => Err(anyhow::anyhow!(why)),
        None => train_and_quantize(dir, point, quiet),
    };
    let failure = dir.failure_file(&point.name);
    match &result {
        Ok(()) => {
            if failure.exists() {
                std::fs::remove_file(&failure)
                    .with_context(|| format!("cannot remove {}", failure.display()))?;
            }
        }
        // A stop asked for is not the point's failure: it resumes next time.
        Err(e) if e.is::<crate::train::Stopped>() => {}
        Err(e) => {
            // The error is returned either way; a failure to record it is secondary.
            let _ = write_text(&failure, &format!("{e:#}\n"));
        }
    }
    result.with_context(|| format!("sweep point {index} `{}`", point.name))
}

fn train_and_quantize(dir: &SweepDir, point: &Point, quiet: bool) -> Result<()> {
    let s = &point.settings;
    let run_dir = dir.run_dir(&point.name);
    let data = s.data.load(s.data_dir.as_deref())?;
    crate::train::train_with_stats(&data, &s.options, &s.config, Some(&run_dir), quiet, s.stats)?;
    if ptq_done(&run_dir, point) {
        return Ok(());
    }
    let model_path = run_dir.join("model.safetensors");
    let kind: ModelKind = s.options.model.parse()?;
    let weights = crate::ptq::read_weights(&model_path, Some(kind))?;
    let f32_bytes = std::fs::metadata(&model_path)
        .with_context(|| format!("cannot read {}", model_path.display()))?
        .len();
    crate::ptq::run(
        &weights,
        &data,
        &s.ptq,
        &run_dir.join("ptq"),
        f32_bytes,
        &s.options.device.open()?,
        |_, _| {},
    )?;
    Ok(())
}
