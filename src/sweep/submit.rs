//! A sweep on Slurm: submitting its unfinished points as one array job, and reading the
//! queue back for `qcandle sweep status`.
//!
//! [`submit`] plans the sweep (writing `plan.json`, which every array task checks its index
//! against), picks the points that still need a run, writes `DIR/sweep.sbatch`
//! ([`slurm::sbatch_script`]) and hands it to `sbatch`. Each job submitted is recorded in
//! `DIR/slurm/jobs.json` ([`JobsRecord`]): job id, point indices, time. [`queue`] asks
//! `squeue` about the recorded jobs, so a point waiting in the queue shows as queued
//! ([`status_text`]) rather than pending.
//!
//! A point is submitted unless it is finished, being written by a process (its run
//! directory is locked) or already waiting or running as a task of a recorded job that
//! `squeue` still lists: submitting again after a partial run, a failure or a cancelled job
//! sends exactly the points left. The sweep directory is locked while submitting, so a
//! submission never races a local `sweep run` or another submission over the same files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::plan::Plan;
use super::point::{state, State, SweepDir};
use super::slurm::{self, SubmitOptions};
use crate::io::write_atomically;
use crate::run_dir::RunLock;

/// One array job submitted for a sweep, as `jobs.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Slurm's job id.
    pub job_id: String,
    /// The `--array` value.
    pub array: String,
    /// The point indices, the array's task ids.
    pub indices: Vec<usize>,
    /// The spec file the tasks read.
    pub spec: PathBuf,
    /// When it was submitted, in seconds since the Unix epoch.
    pub submitted_unix: u64,
}

/// `DIR/slurm/jobs.json`: every job submitted for the sweep, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsRecord {
    /// The jobs.
    pub jobs: Vec<Job>,
}

/// The path of `jobs.json` in the sweep directory `dir`.
pub fn jobs_file(dir: &SweepDir) -> PathBuf {
    slurm::log_dir(dir.root()).join("jobs.json")
}

/// The path of the batch script in the sweep directory `dir`.
pub fn script_file(dir: &SweepDir) -> PathBuf {
    dir.root().join("sweep.sbatch")
}

/// The jobs recorded in `dir` (none when `jobs.json` does not exist).
pub fn read_jobs(dir: &SweepDir) -> Result<JobsRecord> {
    let path = jobs_file(dir);
    if !path.exists() {
        return Ok(JobsRecord::default());
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a record of Slurm jobs (damaged?)",
            path.display()
        )
    })
}

/// Adds `job` to `dir`'s `jobs.json`, written atomically.
fn record_job(dir: &SweepDir, job: Job) -> Result<()> {
    let mut record = read_jobs(dir)?;
    record.jobs.push(job);
    let text = serde_json::to_string_pretty(&record)?;
    write_atomically(&jobs_file(dir), |tmp| {
        std::fs::write(tmp, text).with_context(|| format!("cannot write {}", tmp.display()))
    })
}

/// A task of a recorded job that Slurm's queue still lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedTask {
    /// The array task as Slurm names it: `JOB_INDEX`.
    pub task: String,
    /// Its state in the queue (`PENDING`, `RUNNING`, `COMPLETING`, ...).
    pub state: String,
}

/// What Slurm's queue says about a sweep's recorded jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queue {
    /// `jobs.json` records no job: the sweep was never submitted from this directory.
    NoJobs,
    /// The queue could not be asked; why.
    Unknown(String),
    /// The recorded jobs' tasks still in the queue, by point index (a later job's task
    /// replaces an earlier one's for the same point).
    Tasks(BTreeMap<usize, QueuedTask>),
}

impl Queue {
    /// The queued task of the point `index`, if the queue lists one.
    pub fn task(&self, index: usize) -> Option<&QueuedTask> {
        match self {
            Queue::Tasks(tasks) => tasks.get(&index),
            Queue::NoJobs | Queue::Unknown(_) => None,
        }
    }
}

/// Asks `squeue` about the jobs recorded in `dir` (see [`Queue`]).
pub fn queue(dir: &SweepDir) -> Queue {
    let record = match read_jobs(dir) {
        Ok(record) => record,
        Err(e) => return Queue::Unknown(format!("{e:#}")),
    };
    if record.jobs.is_empty() {
        return Queue::NoJobs;
    }
    let mut tasks = BTreeMap::new();
    for job in &record.jobs {
        match slurm::queue_states(&job.job_id) {
            Ok(Some(states)) => {
                for (index, state) in states {
                    let task = format!("{}_{index}", job.job_id);
                    tasks.insert(index, QueuedTask { task, state });
                }
            }
            Ok(None) => return Queue::Unknown("squeue is not on PATH".to_string()),
            Err(e) => return Queue::Unknown(format!("{e:#}")),
        }
    }
    Queue::Tasks(tasks)
}

/// The status of a point for `qcandle sweep status`: its state from its files, except that
/// a point with a task in the queue that is neither finished nor being written shows as
/// `queued (STATE, job JOB_INDEX)`, and one being written names its task.
pub fn status_text(state: &State, queued: Option<&QueuedTask>) -> String {
    match (state, queued) {
        (State::Finished, _) | (_, None) => state.to_string(),
        (State::Running, Some(q)) => format!("running (job {})", q.task),
        (_, Some(q)) => format!("queued ({}, job {})", q.state, q.task),
    }
}

/// The points of a sweep sorted by whether they are to be submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Indices of the points to submit.
    pub to_submit: Vec<usize>,
    /// How many points are finished.
    pub finished: usize,
    /// Names of the points being written by a process now.
    pub running: Vec<String>,
    /// Indices of the points already waiting or running in Slurm's queue.
    pub queued: Vec<usize>,
}

/// Sorts the points of `plan` in `dir`: finished, being written, in `queue`, or to submit.
pub fn select(plan: &Plan, dir: &SweepDir, queue: &Queue) -> Selection {
    let mut selection = Selection::default();
    for point in &plan.points {
        match state(dir, point).0 {
            State::Finished => selection.finished += 1,
            State::Running => selection.running.push(point.name.clone()),
            _ if queue.task(point.index).is_some() => selection.queued.push(point.index),
            _ => selection.to_submit.push(point.index),
        }
    }
    selection
}

/// What to submit and how.
#[derive(Debug, Clone)]
pub struct Request {
    /// The `qcandle` executable the tasks run (made absolute).
    pub exe: PathBuf,
    /// The spec file (made absolute).
    pub spec: PathBuf,
    /// The job's resources and limits.
    pub options: SubmitOptions,
    /// Write the script, submit nothing.
    pub dry_run: bool,
}

/// What [`submit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The points by state; `to_submit` empty: nothing was written or submitted.
    pub selection: Selection,
    /// The queue as asked before submitting ([`Queue::Unknown`]: points of earlier jobs
    /// still queued may be submitted twice; a second task of a point finds it finished or
    /// being written and leaves it).
    pub queue: Queue,
    /// The batch script written, when there was something to submit.
    pub script: Option<PathBuf>,
    /// The `--array` value.
    pub array: Option<String>,
    /// The job id, when submitted (not with `dry_run`).
    pub job_id: Option<String>,
}

/// Submits the unfinished points of `plan` to Slurm (see the module docs): locks `dir`,
/// writes `plan.json`, picks the points ([`select`]), writes `DIR/sweep.sbatch` and creates
/// `DIR/slurm/` for the tasks' logs, then, unless `request.dry_run`, submits the script
/// and records the job in `jobs.json`. With no point to submit, writes no script and
/// submits nothing.
pub fn submit(plan: &Plan, dir: &SweepDir, request: &Request) -> Result<Submission> {
    let _lock = RunLock::acquire(dir.root()).context("the sweep directory")?;
    dir.write_plan(plan)?;
    let queue = queue(dir);
    let selection = select(plan, dir, &queue);
    let mut submission = Submission {
        selection,
        queue,
        script: None,
        array: None,
        job_id: None,
    };
    if submission.selection.to_submit.is_empty() {
        return Ok(submission);
    }
    let indices = &submission.selection.to_submit;
    let exe = absolute(&request.exe)?;
    let spec = absolute(&request.spec)?;
    let root = absolute(dir.root())?;
    let text = slurm::sbatch_script(
        &request.options,
        &exe,
        &spec,
        &plan.spec.name,
        &root,
        indices,
    )?;
    let logs = slurm::log_dir(&root);
    std::fs::create_dir_all(&logs)
        .with_context(|| format!("cannot create the log directory {}", logs.display()))?;
    let script = script_file(&SweepDir::new(&root));
    write_atomically(&script, |tmp| {
        std::fs::write(tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))
    })?;
    let array = slurm::array_spec(indices, request.options.max_parallel)?;
    submission.script = Some(script.clone());
    submission.array = Some(array.clone());
    let Some(job_id) = slurm::submit(&script, request.dry_run)? else {
        return Ok(submission);
    };
    let job = Job {
        job_id: job_id.clone(),
        array,
        indices: indices.clone(),
        spec,
        submitted_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    record_job(dir, job).with_context(|| {
        format!("Slurm accepted job {job_id}, but it could not be recorded for `sweep status`")
    })?;
    submission.job_id = Some(job_id);
    Ok(submission)
}

/// `path` made absolute against the working directory (symbolic links kept: a compute
/// node sees the same names as this one).
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Spec;

    fn smoke_plan(dir: &Path) -> Plan {
        let text = r#"
name = "t"
[base]
model = "mlp"
data = "embedded"
epochs = 1
[grid]
seed = [0, 1, 2]
"#;
        let spec = Spec::parse(text, &dir.join("t.toml")).unwrap();
        Plan::expand(&spec).unwrap()
    }

    fn queued(pairs: &[(usize, &str)]) -> Queue {
        Queue::Tasks(
            pairs
                .iter()
                .map(|&(i, s)| {
                    let task = QueuedTask {
                        task: format!("9_{i}"),
                        state: s.to_string(),
                    };
                    (i, task)
                })
                .collect(),
        )
    }

    #[test]
    fn queued_points_show_their_task_unless_finished() {
        let task = QueuedTask {
            task: "17_3".into(),
            state: "PENDING".into(),
        };
        assert_eq!(
            status_text(&State::Pending, Some(&task)),
            "queued (PENDING, job 17_3)"
        );
        let failed = State::Failed("boom".into());
        assert_eq!(
            status_text(&failed, Some(&task)),
            "queued (PENDING, job 17_3)"
        );
        assert_eq!(status_text(&failed, None), "failed: boom");
        assert_eq!(status_text(&State::Finished, Some(&task)), "finished");
        assert_eq!(
            status_text(&State::Running, Some(&task)),
            "running (job 17_3)"
        );
    }

    #[test]
    fn selection_leaves_out_running_and_queued_points() {
        let tmp = tempfile::tempdir().unwrap();
        let plan = smoke_plan(tmp.path());
        let dir = SweepDir::new(tmp.path().join("sweep"));
        let all = select(&plan, &dir, &Queue::NoJobs);
        assert_eq!(all.to_submit, [0, 1, 2]);

        let _busy = RunLock::acquire(&dir.run_dir(&plan.points[1].name)).unwrap();
        let some = select(&plan, &dir, &queued(&[(2, "PENDING")]));
        assert_eq!(some.to_submit, [0]);
        assert_eq!(some.running, [plan.points[1].name.clone()]);
        assert_eq!(some.queued, [2]);
        assert_eq!(some.finished, 0);

        let unknown = select(&plan, &dir, &Queue::Unknown("no squeue".into()));
        assert_eq!(unknown.to_submit, [0, 2]);
    }

    #[test]
    fn jobs_are_appended_to_the_record() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SweepDir::new(tmp.path());
        assert_eq!(read_jobs(&dir).unwrap(), JobsRecord::default());
        let job = |id: &str| Job {
            job_id: id.into(),
            array: "0-1".into(),
            indices: vec![0, 1],
            spec: "/s.toml".into(),
            submitted_unix: 5,
        };
        record_job(&dir, job("1")).unwrap();
        record_job(&dir, job("2")).unwrap();
        let record = read_jobs(&dir).unwrap();
        assert_eq!(record.jobs, [job("1"), job("2")]);
    }

    #[test]
    fn a_damaged_jobs_record_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SweepDir::new(tmp.path());
        std::fs::create_dir_all(jobs_file(&dir).parent().unwrap()).unwrap();
        std::fs::write(jobs_file(&dir), "{not json").unwrap();
        let e = format!("{:#}", read_jobs(&dir).unwrap_err());
        assert!(e.contains("jobs.json") && e.contains("damaged"), "{e}");
        match queue(&dir) {
            Queue::Unknown(why) => assert!(why.contains("jobs.json"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
