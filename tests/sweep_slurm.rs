//! `qcandle sweep submit` and `sweep status` with Slurm.
//!
//! The cluster test starts a real one-node cluster with `scripts/slurm-local.sh` in a
//! temporary directory, submits the smoke sweep to it, waits for the array, runs the same
//! sweep with local workers and checks every point is the same bit for bit. Where the cluster
//! cannot start it is skipped with the reason, unless `QCANDLE_REQUIRE_SLURM` is set (CI sets
//! it), which makes that a failure. The other tests put fake `sbatch` and `squeue` commands
//! on the tool's `PATH`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Set: a cluster that cannot start fails the test instead of skipping it.
const REQUIRE_SLURM: &str = "QCANDLE_REQUIRE_SLURM";

/// How long the cluster test waits for the array job.
const ARRAY_TIMEOUT: Duration = Duration::from_secs(900);

/// Tests that write an executable or start processes hold this lock: a process forked while
/// another test has a file open for writing keeps it open, and executing that file then
/// fails ("text file busy").
static PROCESSES: Mutex<()> = Mutex::new(());

fn processes() -> MutexGuard<'static, ()> {
    PROCESSES.lock().unwrap_or_else(|e| e.into_inner())
}

fn smoke_spec() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sweeps/smoke.toml")
}

/// `qcandle ARGS` with `env` set for it.
fn qcandle(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qcandle"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("cannot run qcandle")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The output of a command that must succeed.
fn succeeded(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

// ---- fake Slurm commands

/// Writes an executable `/bin/sh` script named `name` in `dir`.
fn fake_command(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A fake `sbatch` that appends its arguments to `calls` and prints job id 4242.
fn fake_sbatch(bin: &Path, calls: &Path) {
    let body = format!(
        "printf '%s\\n' \"$@\" >> '{}'\necho '4242;local'",
        path_str(calls)
    );
    fake_command(bin, "sbatch", &body);
}

#[test]
fn dry_run_writes_the_script_and_submits_nothing() {
    let _guard = processes();
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let calls = tmp.path().join("sbatch-calls");
    fake_sbatch(&bin, &calls);
    let dir = tmp.path().join("sweep");
    let spec = smoke_spec();
    let args = [
        "sweep",
        "submit",
        path_str(&spec),
        "--dir",
        path_str(&dir),
        "--cpus-per-task",
        "3",
        "--sbatch-arg",
        "--account=proj",
        "--dry-run",
    ];
    let out = succeeded(
        qcandle(&args, &[("PATH", path_str(&bin))]),
        "submit --dry-run",
    );
    assert!(out.contains("not submitted (--dry-run)"), "{out}");
    assert!(!calls.exists(), "sbatch ran");
    assert!(!dir.join("slurm/jobs.json").exists());
    assert!(dir.join("slurm").is_dir(), "the log directory is made");
    assert!(dir.join("plan.json").is_file());

    let script = fs::read_to_string(dir.join("sweep.sbatch")).unwrap();
    for line in [
        r#"#SBATCH --job-name="smoke""#,
        r#"#SBATCH --array="0-3""#,
        r#"#SBATCH --cpus-per-task="3""#,
        "#SBATCH --account=proj",
    ] {
        assert!(
            script.lines().any(|l| l == line),
            "{line} missing:\n{script}"
        );
    }
    let exe = fs::canonicalize(env!("CARGO_BIN_EXE_qcandle")).unwrap();
    let exe_named =
        script.contains(path_str(&exe)) || script.contains(env!("CARGO_BIN_EXE_qcandle"));
    assert!(exe_named && script.contains(path_str(&spec)), "{script}");
}

#[test]
fn submitting_without_sbatch_says_so() {
    let _guard = processes();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sweep");
    let spec = smoke_spec();
    let args = ["sweep", "submit", path_str(&spec), "--dir", path_str(&dir)];
    let o = qcandle(&args, &[("PATH", path_str(tmp.path()))]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let stderr = text(&o.stderr);
    assert!(
        stderr.contains("sbatch not found: is this a Slurm login node?"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.join("slurm/jobs.json").exists());
}

#[test]
fn submission_is_recorded_and_status_shows_the_queue() {
    let _guard = processes();
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let calls = tmp.path().join("sbatch-calls");
    fake_sbatch(&bin, &calls);
    let dir = tmp.path().join("sweep");
    let spec = smoke_spec();
    let env = [("PATH", path_str(&bin))];
    let submit = ["sweep", "submit", path_str(&spec), "--dir", path_str(&dir)];

    let out = succeeded(qcandle(&submit, &env), "submit");
    assert!(
        out.contains("submitted job 4242: array 0-3 (4 points)"),
        "{out}"
    );
    assert!(out.contains("qcandle sweep status"), "{out}");
    let script = dir.join("sweep.sbatch");
    let called: Vec<String> = fs::read_to_string(&calls)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        called,
        [
            "--parsable",
            path_str(&std::path::absolute(&script).unwrap())
        ]
    );
    let jobs: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("slurm/jobs.json")).unwrap()).unwrap();
    assert_eq!(jobs["jobs"][0]["job_id"], "4242");
    assert_eq!(jobs["jobs"][0]["indices"], serde_json::json!([0, 1, 2, 3]));
    assert!(jobs["jobs"][0]["submitted_unix"].as_u64().unwrap() > 0);

    // The queue lists task 0 running and the others pending.
    fake_command(&bin, "squeue", "printf '0|RUNNING\\n[1-3]|PENDING\\n'");
    let status = ["sweep", "status", path_str(&spec), "--dir", path_str(&dir)];
    let out = succeeded(qcandle(&status, &env), "status");
    assert!(out.contains("| queued (RUNNING, job 4242_0) |"), "{out}");
    assert!(out.contains("| queued (PENDING, job 4242_3) |"), "{out}");
    assert!(
        out.contains("0 of 4 points finished, 4 queued in Slurm"),
        "{out}"
    );

    // Queued points are not submitted again.
    let out = succeeded(qcandle(&submit, &env), "second submit");
    assert!(out.contains("nothing to submit"), "{out}");
    assert_eq!(fs::read_to_string(&calls).unwrap().lines().count(), 2);

    // A job that left the queue unfinished: its points are submitted again.
    fake_command(&bin, "squeue", "printf '2|PENDING\\n'");
    let out = succeeded(qcandle(&submit, &env), "third submit");
    assert!(out.contains("array 0-1,3 (3 points)"), "{out}");

    // Without squeue, status says it could not ask.
    fs::remove_file(bin.join("squeue")).unwrap();
    let out = succeeded(qcandle(&status, &env), "status without squeue");
    assert!(out.contains("could not ask Slurm's queue"), "{out}");
    assert!(out.contains("| pending |"), "{out}");
}

// ---- a real cluster

/// A one-node cluster started by `scripts/slurm-local.sh` in a temporary directory, stopped
/// when dropped (a failing test included).
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the cluster, or says why it could not.
    fn start() -> Result<Cluster, String> {
        let have = |program: &str| {
            Command::new("sh")
                .args(["-c", &format!("command -v {program}")])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if std::env::var_os(REQUIRE_SLURM).is_none()
            && !["sbatch", "slurmctld", "slurmd", "munged"]
                .iter()
                .all(|p| have(p) || Path::new("/usr/sbin").join(p).exists())
        {
            return Err("Slurm (slurm-wlm) or munge is not installed".into());
        }
        let cluster = Cluster {
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-local.sh");
        let o = Command::new("bash")
            .arg(script)
            .arg(cluster.dir.path())
            .output()
            .map_err(|e| format!("cannot run scripts/slurm-local.sh: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "scripts/slurm-local.sh failed ({}):\n{}",
                o.status,
                text(&o.stderr)
            ));
        }
        Ok(cluster)
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-local.sh");
        let o = Command::new("bash")
            .arg(script)
            .arg("--stop")
            .arg(self.dir.path())
            .output();
        if let Ok(o) = o {
            if !o.status.success() {
                eprintln!("stopping the cluster failed: {}", text(&o.stderr));
            }
        }
    }
}

/// The array tasks' log files, for a failure message.
fn task_logs(dir: &Path) -> String {
    let mut all = String::new();
    if let Ok(entries) = fs::read_dir(dir.join("slurm")) {
        for entry in entries.flatten() {
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            all.push_str(&format!("---- {}\n", entry.path().display()));
            for line in tail.into_iter().rev() {
                all.push_str(line);
                all.push('\n');
            }
        }
    }
    all
}

/// Whether `squeue` still lists a task of job `job`.
fn in_queue(job: &str, conf: &Path) -> bool {
    let o = Command::new("squeue")
        .args(["--noheader", "--array", "--jobs", job, "--format=%i %T"])
        .env("SLURM_CONF", conf)
        .output()
        .expect("cannot run squeue");
    // A job that left the queue long ago is unknown to squeue: an error, not a listing.
    o.status.success() && !text(&o.stdout).trim().is_empty()
}

/// A CSV file without its last column, `seconds` (the one thing that may differ between
/// runs). The last field is cut rather than a column counted: a method name such as
/// `posit<8,0> naive` holds a comma.
fn without_seconds(path: &Path) -> String {
    let csv = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        csv.lines().next().is_some_and(|h| h.ends_with(",seconds")),
        "{} does not end its columns with seconds",
        path.display()
    );
    csv.lines()
        .map(|line| line.rsplit_once(',').map_or(line, |(rest, _)| rest))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.safetensors` file under `dir`, by path relative to it.
fn tensor_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "safetensors") {
                let relative = path.strip_prefix(dir).unwrap().to_path_buf();
                files.insert(relative, fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// A safetensors file's header (parsed: its keys' order aside) and its tensor data.
fn safetensors_parts<'a>(bytes: &'a [u8], what: &str) -> (serde_json::Value, &'a [u8]) {
    let size = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + size])
        .unwrap_or_else(|e| panic!("{what}: not a safetensors header: {e}"));
    (header, &bytes[8 + size..])
}

/// The run directories of a sweep directory, by point name.
fn point_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_sweep_on_slurm_equals_the_same_sweep_run_locally() {
    let _guard = processes();
    let cluster = match Cluster::start() {
        Ok(cluster) => cluster,
        Err(why) if std::env::var_os(REQUIRE_SLURM).is_none() => {
            eprintln!("skipped: the Slurm cluster cannot start ({why}); set {REQUIRE_SLURM}=1 to make this a failure");
            return;
        }
        Err(why) => panic!("{REQUIRE_SLURM} is set but the Slurm cluster cannot start: {why}"),
    };
    let conf = cluster.conf();
    let env = [("SLURM_CONF", path_str(&conf))];
    let tmp = tempfile::tempdir().unwrap();
    let (on_slurm, local) = (tmp.path().join("slurm"), tmp.path().join("local"));
    let spec = smoke_spec();

    // One CPU per task: the tasks train with one thread, the local run below with all the
    // machine's, so the comparison also checks that results do not depend on threads.
    let submit = [
        "sweep",
        "submit",
        path_str(&spec),
        "--dir",
        path_str(&on_slurm),
        "--cpus-per-task",
        "1",
        "--time",
        "30:00",
    ];
    let out = succeeded(qcandle(&submit, &env), "sweep submit");
    let job = out
        .split("submitted job ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no job id in:\n{out}"))
        .to_string();

    let status = [
        "sweep",
        "status",
        path_str(&spec),
        "--dir",
        path_str(&on_slurm),
    ];
    let mut saw_queued = false;
    let start = Instant::now();
    while in_queue(&job, &conf) {
        let out = succeeded(qcandle(&status, &env), "sweep status");
        saw_queued |= out.contains(&format!("job {job}_"));
        assert!(!out.contains("| failed"), "{out}\n{}", task_logs(&on_slurm));
        assert!(
            start.elapsed() < ARRAY_TIMEOUT,
            "job {job} still queued after {ARRAY_TIMEOUT:?}:\n{out}\n{}",
            task_logs(&on_slurm)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(saw_queued, "sweep status never showed a task of job {job}");
    let out = succeeded(qcandle(&status, &env), "sweep status");
    assert!(
        out.contains("4 of 4 points finished, 0 queued"),
        "{out}\n{}",
        task_logs(&on_slurm)
    );
    let again = succeeded(qcandle(&submit, &env), "second sweep submit");
    assert!(again.contains("nothing to submit"), "{again}");

    let run = [
        "sweep",
        "run",
        path_str(&spec),
        "--dir",
        path_str(&local),
        "--workers",
        "1",
        "--quiet",
    ];
    succeeded(qcandle(&run, &[]), "local sweep run");

    let names = point_names(&on_slurm);
    assert_eq!(names.len(), 4);
    assert_eq!(names, point_names(&local));
    for name in &names {
        let (a, b) = (
            on_slurm.join("runs").join(name),
            local.join("runs").join(name),
        );
        for csv in ["metrics.csv", "ptq/ptq.csv"] {
            assert_eq!(
                without_seconds(&a.join(csv)),
                without_seconds(&b.join(csv)),
                "{name}/{csv} differs"
            );
        }
        let (ta, tb) = (tensor_files(&a), tensor_files(&b));
        assert!(ta.contains_key(Path::new("model.safetensors")), "{name}");
        assert_eq!(
            ta.keys().collect::<Vec<_>>(),
            tb.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (file, bytes) in &ta {
            let what = format!("{name}/{}", file.display());
            let (header_a, data_a) = safetensors_parts(bytes, &what);
            let (header_b, data_b) = safetensors_parts(&tb[file], &what);
            assert_eq!(header_a, header_b, "{what}: the headers differ");
            assert!(data_a == data_b, "{what}: the tensor data differs");
            // The quantized models' metadata has two keys whose order in the file follows a
            // hash map's, so only the trained files are compared byte for byte.
            if file.parent() == Some(Path::new("")) {
                assert!(bytes == &tb[file], "{what} differs");
            }
        }
    }
}
