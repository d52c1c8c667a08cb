//! Running a sweep's points as a Slurm job array.
//!
//! A sweep's points are numbered, and each point is one training run that
//! `qcandle sweep task SPEC --dir DIR --index I` performs from its index alone, so one array
//! job covers a sweep: task `I` of the array runs point `I`. This module writes the batch
//! script, hands it to `sbatch` and reads the array's states back from `squeue`:
//!
//! - [`array_spec`]: the indices as `--array`'s value, runs of consecutive indices compressed
//!   (`0-3,5,7-9%2`), so resubmitting the unfinished points of a sweep is one short line.
//! - [`sbatch_script`]: the script, whose `#SBATCH` lines carry every option (the job's log
//!   files go to `DIR/slurm/`, see [`log_dir`]) and whose body runs the task with absolute
//!   paths, so a compute node sharing the filesystem needs nothing else.
//! - [`submit`] and [`queue_states`]: `sbatch` and `squeue`, with a clear error where Slurm is
//!   missing or refuses.
//!
//! Paths reach two parsers: `sbatch` reads the `#SBATCH` lines (quotes and backslash escapes,
//! `#` starts a comment, and `%` starts a file-name pattern in `--output`) and bash runs the
//! body. Each gets its own quoting; a newline, which neither `#SBATCH` line could hold, is
//! refused.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

/// The folder of a sweep directory that holds the array tasks' log files
/// (`DIR/slurm/JOB_TASK.out`). It must exist before the job starts: Slurm does not create
/// the folders of log files.
pub fn log_dir(dir: &Path) -> PathBuf {
    dir.join("slurm")
}

/// The value of `sbatch --array` for `indices` (in any order, repeats allowed): the sorted
/// unique indices with runs of consecutive ones written as ranges, e.g. `0-3,5,7-9`, and
/// `%K` appended when at most `K` tasks may run at once. Fails on an empty list and on
/// `max_parallel` 0.
pub fn array_spec(indices: &[usize], max_parallel: Option<usize>) -> Result<String> {
    if indices.is_empty() {
        bail!("no sweep points to submit: the Slurm array would be empty");
    }
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut start = sorted[0];
    let mut end = start;
    for &index in &sorted[1..] {
        if index == end + 1 {
            end = index;
        } else {
            parts.push(range_text(start, end));
            start = index;
            end = index;
        }
    }
    parts.push(range_text(start, end));
    let mut spec = parts.join(",");
    match max_parallel {
        Some(0) => bail!("--max-parallel must be at least 1"),
        Some(k) => spec.push_str(&format!("%{k}")),
        None => {}
    }
    Ok(spec)
}

/// `a` alone or `a-b`.
fn range_text(start: usize, end: usize) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

/// The resources and limits of a sweep's array job; `None` leaves a setting to the
/// cluster's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// The partition (`--partition`).
    pub partition: Option<String>,
    /// GPUs for each task (`--gpus-per-task`).
    pub gpus_per_task: Option<u32>,
    /// CPUs for each task (`--cpus-per-task`); the task runs that many compute threads.
    pub cpus_per_task: Option<u32>,
    /// The time limit of each task, in any form Slurm reads (`--time`, e.g. `2:00:00`).
    pub time: Option<String>,
    /// At most this many tasks run at once (`--array=...%K`).
    pub max_parallel: Option<usize>,
    /// Further `sbatch` options, each written verbatim on its own `#SBATCH` line
    /// (e.g. `--account=proj`, `--qos=short`).
    pub extra_args: Vec<String>,
    /// The device given to `sweep submit --device`, passed on to every task (`None`: the
    /// spec's).
    pub device: Option<crate::device::DeviceSpec>,
}

/// The batch script that runs the sweep points `indices` of the sweep `spec` (named
/// `name`) in `dir` as the tasks of one array job: `#SBATCH` lines for the job name (the
/// sweep's name, see [`job_name`]), the array ([`array_spec`]), the log files
/// (`DIR/slurm/%A_%a.out`: job id, task index), the working directory (`dir`) and each
/// option of `opts` that is set, then a body that sets `RAYON_NUM_THREADS` from
/// `SLURM_CPUS_PER_TASK` (when Slurm sets it) and runs
/// `EXE sweep task SPEC --dir DIR --index $SLURM_ARRAY_TASK_ID`.
///
/// `exe`, `spec` and `dir` must be absolute: the task runs on another node, in `dir`. The
/// caller creates [`log_dir`] before submitting. Fails on relative paths, on a path or
/// option holding a newline (no `#SBATCH` line can hold one), on a directory path holding a
/// backslash (which would turn off Slurm's `%A`/`%a` patterns in the log file name), on
/// zero CPUs or GPUs, on an extra argument that is not an option (`-...`) and on what
/// [`array_spec`] refuses.
pub fn sbatch_script(
    opts: &SubmitOptions,
    exe: &Path,
    spec: &Path,
    name: &str,
    dir: &Path,
    indices: &[usize],
) -> Result<String> {
    let exe = absolute_text(exe, "the qcandle executable")?;
    let spec_text = absolute_text(spec, "the sweep spec")?;
    let dir_text = absolute_text(dir, "the sweep directory")?;
    if dir_text.contains('\\') {
        bail!(
            "the sweep directory {dir_text} contains a backslash, which would turn off \
             Slurm's %A/%a patterns in the log file names: use a directory without one"
        );
    }
    let array = array_spec(indices, opts.max_parallel)?;
    let output = format!(
        "{}/%A_%a.out",
        log_dir(dir).to_string_lossy().replace('%', "%%")
    );

    let mut lines = vec![
        "#!/bin/bash".to_string(),
        sbatch_line("job-name", &job_name(name)),
        sbatch_line("array", &array),
        sbatch_line("output", &output),
        sbatch_line("chdir", &dir_text),
    ];
    if let Some(partition) = &opts.partition {
        lines.push(sbatch_line(
            "partition",
            checked_value(partition, "--partition")?,
        ));
    }
    if let Some(gpus) = opts.gpus_per_task {
        lines.push(sbatch_line(
            "gpus-per-task",
            &positive(gpus, "--gpus-per-task")?,
        ));
    }
    if let Some(cpus) = opts.cpus_per_task {
        lines.push(sbatch_line(
            "cpus-per-task",
            &positive(cpus, "--cpus-per-task")?,
        ));
    }
    if let Some(time) = &opts.time {
        lines.push(sbatch_line("time", checked_value(time, "--time")?));
    }
    for arg in &opts.extra_args {
        lines.push(format!("#SBATCH {}", checked_extra_arg(arg)?));
    }
    lines.push(String::new());
    lines.push(body(&exe, &spec_text, &dir_text, opts.device));
    Ok(lines.join("\n"))
}

/// The script's body: fails outside an array task, sizes the thread pool to the task's
/// CPUs, then becomes the sweep task.
fn body(exe: &str, spec: &str, dir: &str, device: Option<crate::device::DeviceSpec>) -> String {
    let device = device.map_or(String::new(), |d| format!(" --device {d}"));
    format!(
        r#"set -euo pipefail
: "${{SLURM_ARRAY_TASK_ID:?runs as a task of a Slurm array job: submit it with sbatch}}"
if [ -n "${{SLURM_CPUS_PER_TASK:-}}" ]; then
    export RAYON_NUM_THREADS="$SLURM_CPUS_PER_TASK"
fi
exec {} sweep task {} --dir {} --index "$SLURM_ARRAY_TASK_ID"{device}
"#,
        shell_quote(exe),
        shell_quote(spec),
        shell_quote(dir),
    )
}

/// The path as text, refused when relative, not UTF-8 or holding a newline.
fn absolute_text(path: &Path, what: &str) -> Result<String> {
    if !path.is_absolute() {
        bail!(
            "{what} {} must be an absolute path (the task runs on another node)",
            path.display()
        );
    }
    let text = path
        .to_str()
        .with_context(|| format!("{what} {} is not valid UTF-8", path.display()))?;
    if text.contains(['\n', '\r']) {
        bail!("{what} {text:?} contains a line break, which a batch script cannot hold");
    }
    Ok(text.to_string())
}

/// The job's name: the sweep's name with every character but ASCII letters, digits, `.`,
/// `_` and `-` replaced by `_` (a job name is a label, not a path), or `sweep` when empty.
pub fn job_name(sweep: &str) -> String {
    let name: String = sweep
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "sweep".to_string()
    } else {
        name
    }
}

/// `#SBATCH --NAME="VALUE"`, quoted for sbatch's own parser: inside double quotes a
/// backslash escapes the next character and `#` does not start a comment.
fn sbatch_line(name: &str, value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    format!("#SBATCH --{name}={quoted}")
}

/// `value` when it is not empty and holds no line break.
fn checked_value<'a>(value: &'a str, flag: &str) -> Result<&'a str> {
    if value.trim().is_empty() {
        bail!("{flag} is empty");
    }
    if value.contains(['\n', '\r']) {
        bail!("{flag} {value:?} contains a line break, which a batch script cannot hold");
    }
    Ok(value)
}

/// `n` as text when it is at least 1.
fn positive(n: u32, flag: &str) -> Result<String> {
    if n == 0 {
        bail!("{flag} must be at least 1 (leave it out for the cluster's default)");
    }
    Ok(n.to_string())
}

/// An extra `sbatch` argument, checked: one line, starting with `-` (sbatch would ignore
/// anything else on an `#SBATCH` line without a word).
fn checked_extra_arg(arg: &str) -> Result<&str> {
    let arg = checked_value(arg, "--sbatch-arg")?;
    if !arg.starts_with('-') {
        bail!("--sbatch-arg {arg:?} is not an sbatch option: it must start with '-' (e.g. --account=NAME)");
    }
    Ok(arg)
}

/// `s` as one bash word: in single quotes, each `'` written as `'\''`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Submits the batch script `script` with `sbatch --parsable` and returns the job id;
/// returns `None` without running anything when `dry_run`. Fails with a clear message when
/// `sbatch` is not installed, and with sbatch's own message when it refuses the job.
pub fn submit(script: &Path, dry_run: bool) -> Result<Option<String>> {
    submit_using(None, script, dry_run)
}

/// [`submit`], looking `sbatch` up in `search_path` instead of `PATH` when given.
fn submit_using(
    search_path: Option<&OsStr>,
    script: &Path,
    dry_run: bool,
) -> Result<Option<String>> {
    if dry_run {
        return Ok(None);
    }
    let mut command = slurm_command("sbatch", search_path);
    command.arg("--parsable").arg(script);
    let output = match command.output() {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => bail!(
            "sbatch not found: is this a Slurm login node? Submit from a machine where \
             Slurm's commands are on PATH, or run the sweep with local workers \
             (scripts/slurm-local.sh starts a one-node cluster for trying it out)"
        ),
        Err(e) => return Err(e).context("cannot run sbatch"),
    };
    if !output.status.success() {
        bail!(
            "sbatch refused {} ({}): {}",
            script.display(),
            output.status,
            stderr_text(&output)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    parse_job_id(&stdout).map(Some)
}

/// The job id in `sbatch --parsable`'s output: `ID` or `ID;CLUSTER`.
fn parse_job_id(stdout: &str) -> Result<String> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    let id = line.map(|l| l.split(';').next().unwrap_or("").trim());
    match id {
        Some(id) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => Ok(id.to_string()),
        _ => bail!(
            "sbatch accepted the job but printed no job id (its output: {:?})",
            stdout.trim()
        ),
    }
}

/// The states (`PENDING`, `RUNNING`, ...) of the tasks of array job `job_id` that are still
/// in Slurm's queue, by task index, from
/// `squeue --noheader --array --jobs ID --format=%K|%T`. Tasks that have left the queue
/// (finished) are absent, and a job Slurm no longer knows gives an empty map. `None` when
/// `squeue` is not installed.
pub fn queue_states(job_id: &str) -> Result<Option<BTreeMap<usize, String>>> {
    queue_states_using(None, job_id)
}

/// [`queue_states`], looking `squeue` up in `search_path` instead of `PATH` when given.
fn queue_states_using(
    search_path: Option<&OsStr>,
    job_id: &str,
) -> Result<Option<BTreeMap<usize, String>>> {
    let mut command = slurm_command("squeue", search_path);
    command
        .args(["--noheader", "--array", "--jobs", job_id])
        .arg("--format=%K|%T");
    let output = match command.output() {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context("cannot run squeue"),
    };
    if !output.status.success() {
        let stderr = stderr_text(&output);
        // A job that finished a while ago has left the controller's memory.
        if stderr.contains("Invalid job id specified") {
            return Ok(Some(BTreeMap::new()));
        }
        bail!(
            "squeue failed for job {job_id} ({}): {stderr}",
            output.status
        );
    }
    parse_queue_states(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("unexpected squeue output for job {job_id}"))
        .map(Some)
}

/// The task states in squeue's `%K|%T` lines: the index column is one index, or a list of
/// indices and ranges for tasks still pending together (`[4-9%2]`, `1,3,5-7`, `0-8:2`).
/// Lines of a job that is not an array (`N/A`) are skipped.
fn parse_queue_states(stdout: &str) -> Result<BTreeMap<usize, String>> {
    let mut states = BTreeMap::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((indices, state)) = line.split_once('|') else {
            bail!("line {line:?} is not INDEX|STATE");
        };
        let state = state.trim();
        if state.is_empty() {
            bail!("line {line:?} has no state");
        }
        if indices.trim() == "N/A" {
            continue;
        }
        for index in expand_indices(indices)
            .with_context(|| format!("line {line:?} has no task index or range"))?
        {
            states.insert(index, state.to_string());
        }
    }
    Ok(states)
}

/// The indices of a task-index column: brackets and the `%K` limit dropped, then a
/// comma-separated list of `I`, `A-B` and `A-B:STEP`.
fn expand_indices(text: &str) -> Result<Vec<usize>> {
    let text = text.trim();
    let text = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let text = text.split_once('%').map_or(text, |(list, _limit)| list);
    let mut indices = Vec::new();
    for part in text.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((range, step)) => (range, number(step)?),
            None => (part, 1),
        };
        if step == 0 {
            bail!("step 0 in {part:?}");
        }
        let (start, end) = match range.split_once('-') {
            Some((start, end)) => (number(start)?, number(end)?),
            None => (number(range)?, number(range)?),
        };
        if end < start {
            bail!("range {part:?} ends before it starts");
        }
        indices.extend((start..=end).step_by(step));
    }
    Ok(indices)
}

/// A decimal number.
fn number(text: &str) -> Result<usize> {
    text.trim()
        .parse()
        .with_context(|| format!("{text:?} is not a number"))
}

/// A Slurm command, looked up in `search_path` when given (the child's `PATH`).
fn slurm_command(program: &str, search_path: Option<&OsStr>) -> Command {
    let mut command = Command::new(program);
    if let Some(path) = search_path {
        command.env("PATH", path);
    }
    command
}

/// A command's stderr, trimmed, or a note that it printed nothing.
fn stderr_text(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if text.is_empty() {
        "(no message on stderr)".to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::{Mutex, MutexGuard};

    use super::*;

    /// Tests that write an executable and run a process hold this lock: a process forked by
    /// another test while a file is open for writing would keep it open, and executing the
    /// file then fails ("text file busy").
    static PROCESSES: Mutex<()> = Mutex::new(());

    fn processes() -> MutexGuard<'static, ()> {
        PROCESSES.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes an executable `/bin/sh` script named `name` in `dir`.
    fn fake_command(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn search_path(dir: &Path) -> OsString {
        dir.as_os_str().to_owned()
    }

    fn message(e: anyhow::Error) -> String {
        format!("{e:#}")
    }

    // ---- array_spec

    #[test]
    fn array_spec_of_one_index_is_the_index() {
        assert_eq!(array_spec(&[7], None).unwrap(), "7");
        assert_eq!(array_spec(&[0], Some(1)).unwrap(), "0%1");
    }

    #[test]
    fn array_spec_compresses_runs_and_keeps_gaps() {
        assert_eq!(array_spec(&[0, 1, 2, 3], None).unwrap(), "0-3");
        assert_eq!(
            array_spec(&[0, 1, 2, 3, 5, 7, 8, 9], None).unwrap(),
            "0-3,5,7-9"
        );
        assert_eq!(array_spec(&[1, 3, 5], None).unwrap(), "1,3,5");
        assert_eq!(array_spec(&[4, 5, 10, 11], None).unwrap(), "4-5,10-11");
    }

    #[test]
    fn array_spec_sorts_and_drops_repeats() {
        assert_eq!(
            array_spec(&[9, 3, 0, 8, 1, 2, 7, 5, 3, 0], None).unwrap(),
            "0-3,5,7-9"
        );
        assert_eq!(array_spec(&[2, 2, 2], None).unwrap(), "2");
    }

    #[test]
    fn array_spec_appends_the_parallel_limit() {
        assert_eq!(
            array_spec(&[0, 1, 2, 3, 5, 7, 8, 9], Some(2)).unwrap(),
            "0-3,5,7-9%2"
        );
    }

    #[test]
    fn array_spec_refuses_an_empty_list_and_a_zero_limit() {
        assert!(message(array_spec(&[], None).unwrap_err()).contains("empty"));
        assert!(message(array_spec(&[1], Some(0)).unwrap_err()).contains("--max-parallel"));
    }

    #[test]
    fn array_spec_expands_back_to_the_indices() {
        let indices = [12, 0, 5, 6, 7, 30, 31, 1, 29];
        let spec = array_spec(&indices, Some(3)).unwrap();
        let mut expected = indices.to_vec();
        expected.sort_unstable();
        assert_eq!(expand_indices(&spec).unwrap(), expected);
    }

    // ---- sbatch_script

    fn script_for(opts: &SubmitOptions, dir: &str) -> Result<String> {
        sbatch_script(
            opts,
            Path::new("/opt/bin/qcandle"),
            Path::new("/home/u/sweeps/lr grid.toml"),
            "lr grid",
            Path::new(dir),
            &[0, 1, 2, 4],
        )
    }

    fn sbatch_lines(script: &str) -> Vec<&str> {
        script
            .lines()
            .filter(|l| l.starts_with("#SBATCH"))
            .collect()
    }

    #[test]
    fn sbatch_script_has_the_job_lines_and_only_the_options_given() {
        let script = script_for(&SubmitOptions::default(), "/scratch/run").unwrap();
        assert!(script.starts_with("#!/bin/bash\n"));
        assert_eq!(
            sbatch_lines(&script),
            [
                r#"#SBATCH --job-name="lr_grid""#,
                r#"#SBATCH --array="0-2,4""#,
                r#"#SBATCH --output="/scratch/run/slurm/%A_%a.out""#,
                r#"#SBATCH --chdir="/scratch/run""#,
            ]
        );
        assert!(!script.contains("partition") && !script.contains("cpus-per-task"));
    }

    #[test]
    fn sbatch_script_writes_every_option_set() {
        let opts = SubmitOptions {
            partition: Some("gpu".into()),
            gpus_per_task: Some(1),
            cpus_per_task: Some(8),
            time: Some("2:00:00".into()),
            max_parallel: Some(3),
            extra_args: vec!["--account=proj".into(), "--qos short".into()],
            device: Some(crate::device::DeviceSpec::Cuda(1)),
        };
        let script = script_for(&opts, "/scratch/run").unwrap();
        let lines = sbatch_lines(&script);
        for expected in [
            r#"#SBATCH --array="0-2,4%3""#,
            r#"#SBATCH --partition="gpu""#,
            r#"#SBATCH --gpus-per-task="1""#,
            r#"#SBATCH --cpus-per-task="8""#,
            r#"#SBATCH --time="2:00:00""#,
            "#SBATCH --account=proj",
            "#SBATCH --qos short",
        ] {
            assert!(lines.contains(&expected), "{expected} missing in\n{script}");
        }
        // sbatch stops reading #SBATCH lines at the first command: all come before the body.
        let last_option = script.rfind("#SBATCH").unwrap();
        assert!(last_option < script.find("set -euo").unwrap());
        // The device given to submit reaches every task's command.
        assert!(
            script.contains("--index \"$SLURM_ARRAY_TASK_ID\" --device cuda:1\n"),
            "{script}"
        );
    }

    #[test]
    fn sbatch_script_refuses_line_breaks_in_options() {
        let cases = [
            SubmitOptions {
                partition: Some("gpu\n#SBATCH --mem=1".into()),
                ..Default::default()
            },
            SubmitOptions {
                time: Some("1:00\r".into()),
                ..Default::default()
            },
            SubmitOptions {
                extra_args: vec!["--qos=a\necho hi".into()],
                ..Default::default()
            },
        ];
        for opts in cases {
            let e = message(script_for(&opts, "/scratch/run").unwrap_err());
            assert!(e.contains("line break"), "{e}");
        }
        let e = message(script_for(&SubmitOptions::default(), "/scratch/a\nb").unwrap_err());
        assert!(
            e.contains("sweep directory") && e.contains("line break"),
            "{e}"
        );
    }

    #[test]
    fn sbatch_script_refuses_bad_options() {
        let bad = [
            (
                SubmitOptions {
                    cpus_per_task: Some(0),
                    ..Default::default()
                },
                "--cpus-per-task",
            ),
            (
                SubmitOptions {
                    gpus_per_task: Some(0),
                    ..Default::default()
                },
                "--gpus-per-task",
            ),
            (
                SubmitOptions {
                    partition: Some(" ".into()),
                    ..Default::default()
                },
                "--partition is empty",
            ),
            (
                SubmitOptions {
                    extra_args: vec!["account=proj".into()],
                    ..Default::default()
                },
                "not an sbatch option",
            ),
            (
                SubmitOptions {
                    max_parallel: Some(0),
                    ..Default::default()
                },
                "--max-parallel",
            ),
        ];
        for (opts, expected) in bad {
            let e = message(script_for(&opts, "/scratch/run").unwrap_err());
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn sbatch_script_refuses_relative_paths_and_backslashes() {
        let opts = SubmitOptions::default();
        let (exe, spec, dir) = (Path::new("/b/q"), Path::new("/s.toml"), Path::new("/d"));
        for (exe, spec, dir, expected) in [
            (Path::new("qcandle"), spec, dir, "executable"),
            (exe, Path::new("s.toml"), dir, "sweep spec"),
            (exe, spec, Path::new("runs"), "sweep directory"),
        ] {
            let e = message(sbatch_script(&opts, exe, spec, "s", dir, &[0]).unwrap_err());
            assert!(e.contains(expected) && e.contains("absolute"), "{e}");
        }
        let e = message(script_for(&opts, r"/scratch/a\b").unwrap_err());
        assert!(e.contains("backslash"), "{e}");
    }

    #[test]
    fn sbatch_script_escapes_quotes_and_percent_signs_for_sbatch() {
        let script = script_for(&SubmitOptions::default(), r#"/s/50% "x" #1"#).unwrap();
        let lines = sbatch_lines(&script);
        assert!(lines.contains(&r#"#SBATCH --output="/s/50%% \"x\" #1/slurm/%A_%a.out""#));
        assert!(lines.contains(&r#"#SBATCH --chdir="/s/50% \"x\" #1""#));
    }

    #[test]
    fn job_name_is_the_sweep_name_as_a_label() {
        assert_eq!(job_name("smoke"), "smoke");
        assert_eq!(job_name("lr grid;rm.v2"), "lr_grid_rm.v2");
        assert_eq!(job_name(""), "sweep");
    }

    /// Runs the script's body with bash the way a task would, with a fake qcandle that
    /// records its arguments and thread count, in a directory whose name holds spaces and
    /// both quotes.
    fn run_body(task_env: &[(&str, &str)]) -> (Output, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(r#"it's a "sweep" $HOME"#);
        fs::create_dir_all(&dir).unwrap();
        let record = dir.join("record");
        let exe = fake_command(
            &dir,
            "q candle",
            &format!(
                "printf '%s\\n' \"$@\" \"threads=$RAYON_NUM_THREADS\" > {}",
                shell_quote(record.to_str().unwrap())
            ),
        );
        let spec = dir.join("spec 'one'.toml");
        let script =
            sbatch_script(&SubmitOptions::default(), &exe, &spec, "one", &dir, &[3]).unwrap();
        let script_path = dir.join("sweep.sbatch");
        fs::write(&script_path, script).unwrap();
        let mut command = Command::new("bash");
        command.arg(&script_path).env_remove("SLURM_ARRAY_TASK_ID");
        command.env_remove("SLURM_CPUS_PER_TASK");
        command.env("RAYON_NUM_THREADS", "99");
        command.envs(task_env.iter().copied());
        let output = command.output().unwrap();
        (output, tmp)
    }

    #[test]
    fn script_body_runs_the_task_with_quoted_paths_and_the_task_cpus() {
        let _guard = processes();
        let (output, tmp) = run_body(&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_CPUS_PER_TASK", "2")]);
        assert!(output.status.success(), "{output:?}");
        let dir = tmp.path().join(r#"it's a "sweep" $HOME"#);
        let record = fs::read_to_string(dir.join("record")).unwrap();
        let expected = [
            "sweep".to_string(),
            "task".to_string(),
            dir.join("spec 'one'.toml").to_str().unwrap().to_string(),
            "--dir".to_string(),
            dir.to_str().unwrap().to_string(),
            "--index".to_string(),
            "3".to_string(),
            "threads=2".to_string(),
        ];
        assert_eq!(record.lines().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn script_body_keeps_the_thread_setting_without_a_cpu_count() {
        let _guard = processes();
        let (output, tmp) = run_body(&[("SLURM_ARRAY_TASK_ID", "0")]);
        assert!(output.status.success(), "{output:?}");
        let record = fs::read_to_string(tmp.path().join(r#"it's a "sweep" $HOME/record"#));
        assert_eq!(record.unwrap().lines().last(), Some("threads=99"));
    }

    #[test]
    fn script_body_fails_outside_an_array_task() {
        let _guard = processes();
        let (output, tmp) = run_body(&[]);
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("SLURM_ARRAY_TASK_ID"), "{stderr}");
        assert!(!tmp.path().join(r#"it's a "sweep" $HOME/record"#).exists());
    }

    // ---- submit

    #[test]
    fn job_id_is_the_part_before_the_cluster_name() {
        assert_eq!(parse_job_id("1234\n").unwrap(), "1234");
        assert_eq!(parse_job_id("1234;gpu-cluster\n").unwrap(), "1234");
        assert_eq!(parse_job_id("\n 77 \n").unwrap(), "77");
        for bad in ["", "\n", "Submitted batch job\n", ";c", "12a"] {
            assert!(parse_job_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn submit_runs_sbatch_parsable_and_returns_the_job_id() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        let args = bin.path().join("args");
        let body = format!(
            "printf '%s\\n' \"$@\" > {}\necho '4242;cluster1'",
            shell_quote(args.to_str().unwrap())
        );
        fake_command(bin.path(), "sbatch", &body);
        let script = Path::new("/runs/a b/sweep.sbatch");
        let id = submit_using(Some(&search_path(bin.path())), script, false).unwrap();
        assert_eq!(id.as_deref(), Some("4242"));
        let args = fs::read_to_string(args).unwrap();
        assert_eq!(
            args.lines().collect::<Vec<_>>(),
            ["--parsable", "/runs/a b/sweep.sbatch"]
        );
    }

    #[test]
    fn submit_dry_run_runs_nothing() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        let ran = bin.path().join("ran");
        let body = format!("echo x > {}\necho 1", shell_quote(ran.to_str().unwrap()));
        fake_command(bin.path(), "sbatch", &body);
        let id = submit_using(Some(&search_path(bin.path())), Path::new("/s"), true).unwrap();
        assert_eq!(id, None);
        assert!(!ran.exists());
    }

    #[test]
    fn submit_without_sbatch_says_so() {
        let _guard = processes();
        let empty = tempfile::tempdir().unwrap();
        let e = submit_using(Some(&search_path(empty.path())), Path::new("/s"), false);
        let e = message(e.unwrap_err());
        assert!(
            e.starts_with("sbatch not found: is this a Slurm login node?"),
            "{e}"
        );
    }

    #[test]
    fn refused_submission_reports_sbatch_stderr() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        let body = "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1";
        fake_command(bin.path(), "sbatch", body);
        let e = submit_using(
            Some(&search_path(bin.path())),
            Path::new("/r/s.sbatch"),
            false,
        );
        let e = message(e.unwrap_err());
        assert!(e.contains("sbatch refused /r/s.sbatch"), "{e}");
        assert!(e.contains("Invalid partition name specified"), "{e}");
    }

    #[test]
    fn submission_without_a_job_id_is_an_error() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        fake_command(bin.path(), "sbatch", "echo 'Submitted batch job'");
        let e = submit_using(Some(&search_path(bin.path())), Path::new("/s"), false);
        assert!(message(e.unwrap_err()).contains("no job id"));
    }

    // ---- queue_states

    fn states(pairs: &[(usize, &str)]) -> BTreeMap<usize, String> {
        pairs.iter().map(|&(i, s)| (i, s.to_string())).collect()
    }

    #[test]
    fn queue_lines_expand_pending_ranges() {
        let out = "0|RUNNING\n1|COMPLETING\n[4-9%2]|PENDING\n";
        let mut expected = states(&[(0, "RUNNING"), (1, "COMPLETING")]);
        for i in 4..=9 {
            expected.insert(i, "PENDING".into());
        }
        assert_eq!(parse_queue_states(out).unwrap(), expected);
        assert_eq!(
            parse_queue_states("2-3%2|PENDING\n").unwrap(),
            states(&[(2, "PENDING"), (3, "PENDING")])
        );
        assert_eq!(
            parse_queue_states("[1,3,5-6]|PENDING\n0-6:3|SUSPENDED\n").unwrap(),
            states(&[
                (0, "SUSPENDED"),
                (1, "PENDING"),
                (3, "SUSPENDED"),
                (5, "PENDING"),
                (6, "SUSPENDED"),
            ])
        );
    }

    #[test]
    fn queue_lines_skip_non_array_jobs_and_blank_lines() {
        assert_eq!(
            parse_queue_states("\nN/A|PENDING\n  \n3|RUNNING\n").unwrap(),
            states(&[(3, "RUNNING")])
        );
        assert!(parse_queue_states("").unwrap().is_empty());
    }

    #[test]
    fn malformed_queue_lines_are_errors() {
        for bad in [
            "RUNNING\n",
            "x|RUNNING\n",
            "3|\n",
            "[5-2]|PENDING\n",
            "0-4:0|PENDING\n",
        ] {
            assert!(parse_queue_states(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn queue_states_runs_squeue_for_the_array() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        let args = bin.path().join("args");
        let body = format!(
            "printf '%s\\n' \"$@\" > {}\nprintf '0|RUNNING\\n[1-2%%1]|PENDING\\n'",
            shell_quote(args.to_str().unwrap())
        );
        fake_command(bin.path(), "squeue", &body);
        let got = queue_states_using(Some(&search_path(bin.path())), "77").unwrap();
        assert_eq!(
            got,
            Some(states(&[(0, "RUNNING"), (1, "PENDING"), (2, "PENDING")]))
        );
        let args = fs::read_to_string(args).unwrap();
        assert_eq!(
            args.lines().collect::<Vec<_>>(),
            ["--noheader", "--array", "--jobs", "77", "--format=%K|%T"]
        );
    }

    #[test]
    fn queue_states_without_squeue_is_none() {
        let _guard = processes();
        let empty = tempfile::tempdir().unwrap();
        let got = queue_states_using(Some(&search_path(empty.path())), "1").unwrap();
        assert_eq!(got, None);
    }

    #[test]
    fn a_job_squeue_no_longer_knows_has_no_queued_tasks() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        let body = "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1";
        fake_command(bin.path(), "squeue", body);
        let got = queue_states_using(Some(&search_path(bin.path())), "5").unwrap();
        assert_eq!(got, Some(BTreeMap::new()));
    }

    #[test]
    fn a_failing_squeue_reports_its_stderr() {
        let _guard = processes();
        let bin = tempfile::tempdir().unwrap();
        let body = "echo 'squeue: error: Unable to contact slurm controller' >&2\nexit 1";
        fake_command(bin.path(), "squeue", body);
        let e = queue_states_using(Some(&search_path(bin.path())), "5").unwrap_err();
        let e = message(e);
        assert!(
            e.contains("job 5") && e.contains("Unable to contact slurm controller"),
            "{e}"
        );
    }
}
