//! `qcandle sweep` on this machine: a point trained by a sweep equals the same `qcandle
//! train` run bit for bit; a second run skips finished points (checked, not just present);
//! a failing point is recorded and the others go on; SIGTERM stops the workers and the next
//! run resumes; a task whose spec changed after planning is refused; the report's files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_qcandle");

fn qcandle(args: &[&str], cwd: &Path) -> Output {
    Command::new(EXE)
        .args(args)
        .current_dir(cwd)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("the binary runs")
}

/// `qcandle sweep COMMAND SPEC --dir DIR EXTRA...`, run in `cwd`.
fn run_sweep(cwd: &Path, command: &str, spec: &Path, dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "sweep",
        command,
        spec.to_str().unwrap(),
        "--dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    qcandle(&args, cwd)
}

/// [`run_sweep`] of a command that must succeed.
fn sweep_ok(cwd: &Path, command: &str, spec: &Path, dir: &Path, extra: &[&str]) {
    let o = run_sweep(cwd, command, spec, dir, extra);
    assert!(o.status.success(), "sweep {command}: {}", text(&o.stderr));
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A small, fast spec: the MLP on 256 embedded images.
fn write_spec(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("spec.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"t\"\n[base]\nmodel = \"mlp\"\ndata = \"embedded\"\ntrain-limit = 256\nbatch = 64\n{body}"
        ),
    )
    .unwrap();
    path
}

/// metrics.csv without the (wall-clock) seconds column.
fn metrics_without_time(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(',').unwrap().0.to_string())
        .collect()
}

#[test]
fn a_sweep_point_equals_the_same_train_run_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        "epochs = 2\n[grid]\nconfig = [\"posit<16,1>\"]\nseed = [3]\n",
    );
    let sweep = tmp.path().join("sw");
    let o = run_sweep(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let by_hand = tmp.path().join("by-hand");
    let o = qcandle(
        &[
            "train",
            "--model",
            "mlp",
            "--data",
            "embedded",
            "--train-limit",
            "256",
            "--batch",
            "64",
            "--epochs",
            "2",
            "--config",
            "posit<16,1>",
            "--seed",
            "3",
            "--quiet",
            "--out",
            by_hand.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let point = sweep.join("runs").join("posit_16_1-s3");
    assert_eq!(metrics_without_time(&point), metrics_without_time(&by_hand));
    for file in ["model.safetensors", "checkpoint.safetensors", "config.toml"] {
        assert_eq!(
            std::fs::read(point.join(file)).unwrap(),
            std::fs::read(by_hand.join(file)).unwrap(),
            "{file}"
        );
    }
}

#[test]
fn a_second_run_skips_finished_points_and_repairs_damaged_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "epochs = 1\n[grid]\nseed = [0, 1]\n");
    let sweep = tmp.path().join("sw");
    let run = |workers: &str| {
        qcandle(
            &[
                "sweep",
                "run",
                spec.to_str().unwrap(),
                "--dir",
                sweep.to_str().unwrap(),
                "--workers",
                workers,
                "--quiet",
            ],
            tmp.path(),
        )
    };
    let o = run("2");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("2 finished now, 0 already finished"),
        "{}",
        text(&o.stderr)
    );
    let model = sweep.join("runs/s1/model.safetensors");
    let before = std::fs::read(&model).unwrap();
    let o = run("1");
    assert!(
        text(&o.stderr).contains("0 finished now, 2 already finished"),
        "{}",
        text(&o.stderr)
    );
    // A damaged result is not "finished": the point runs again and its file is rewritten
    // from the checkpoint, byte for byte.
    std::fs::write(&model, b"damaged").unwrap();
    let o = run("1");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("1 finished now, 1 already finished"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(&model).unwrap(), before);
}

#[test]
fn a_failing_point_is_recorded_and_the_others_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("no-data");
    std::fs::create_dir(&empty).unwrap();
    // The mnist point's data directory holds no files: it fails when it loads them.
    let spec = tmp.path().join("spec.toml");
    std::fs::write(
        &spec,
        "name = \"t\"\n[base]\nmodel = \"mlp\"\ntrain-limit = 128\nepochs = 1\n\
         [[grid]]\ndata = [\"embedded\"]\n[[grid]]\ndata = [\"mnist\"]\ndata-dir = [\"no-data\"]\n",
    )
    .unwrap();
    let sweep = tmp.path().join("sw");
    let o = run_sweep(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("1 of 2 points failed"), "{err}");
    let failure = std::fs::read_to_string(sweep.join("failed/mnist-no-data.txt")).unwrap();
    assert!(failure.contains("no-data"), "{failure}");
    assert!(sweep.join("runs/embedded/run.json").exists());
    let o = run_sweep(tmp.path(), "status", &spec, &sweep, &[]);
    let out = text(&o.stdout);
    assert!(out.contains("| embedded | finished |"), "{out}");
    assert!(out.contains("| mnist-no-data | failed: "), "{out}");
    assert!(out.contains("1 of 2 points finished"), "{out}");
    // The report lists both, the failure with its status.
    let o = run_sweep(tmp.path(), "report", &spec, &sweep, &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let csv = std::fs::read_to_string(sweep.join("report.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "run,data,data-dir,status,epochs,top1,top5,train_loss,seconds"
    );
    assert!(
        lines[1].starts_with("embedded,embedded,-,finished,1,"),
        "{csv}"
    );
    assert!(
        lines[2].starts_with("mnist-no-data,mnist,no-data,failed,0,"),
        "{csv}"
    );
}

#[test]
fn sigterm_stops_the_workers_and_the_next_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "epochs = 40\n[grid]\nseed = [0]\n");
    let sweep = tmp.path().join("sw");
    let mut child = Command::new(EXE)
        .args([
            "sweep",
            "run",
            spec.to_str().unwrap(),
            "--dir",
            sweep.to_str().unwrap(),
            "--quiet",
        ])
        .env("RAYON_NUM_THREADS", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_json = sweep.join("runs/s0/run.json");
    let start = Instant::now();
    while !run_json.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no epoch finished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(child.id());
    let stopped = Instant::now();
    let status = child.wait().unwrap();
    assert!(stopped.elapsed() < Duration::from_secs(20), "slow to stop");
    assert_eq!(status.code(), Some(130));
    let done = qcandle::train::load_checked_run(&sweep.join("runs/s0"))
        .unwrap()
        .epochs
        .len();
    assert!((1..40).contains(&done), "{done} epochs");
    // Stopped, not failed: the worker stopped between two steps, never while saving.
    assert!(!sweep.join("failed/s0.txt").exists());
    // The worker is gone: the run directory's lock is free, so the state is not "running".
    let o = run_sweep(tmp.path(), "status", &spec, &sweep, &[]);
    assert!(
        text(&o.stdout).contains("| s0 | partial"),
        "{}",
        text(&o.stdout)
    );
    // Resumed with one epoch more, the finished epochs are kept as they were.
    let before = metrics_without_time(&sweep.join("runs/s0"));
    let spec = write_spec(
        tmp.path(),
        &format!("epochs = {}\n[grid]\nseed = [0]\n", done + 1),
    );
    let o = run_sweep(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let after = metrics_without_time(&sweep.join("runs/s0"));
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(after[..before.len()], before[..]);
}

/// Sends SIGTERM to `pid` with the `kill` command.
fn sigterm(pid: u32) {
    let ok = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

#[test]
fn a_task_checks_its_index_against_the_recorded_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "epochs = 1\n[grid]\nseed = [0, 1]\n");
    let sweep = tmp.path().join("sw");
    let o = run_sweep(tmp.path(), "task", &spec, &sweep, &["--index", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("index 2 is beyond the plan's 2 points"),
        "{}",
        text(&o.stderr)
    );
    std::fs::create_dir_all(&sweep).unwrap();
    std::fs::write(
        sweep.join("plan.json"),
        r#"{"sweep":"t","points":[{"index":0,"name":"s0","digest":"0000"}]}"#,
    )
    .unwrap();
    let o = run_sweep(tmp.path(), "task", &spec, &sweep, &["--index", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("no longer gives the point 0"),
        "{}",
        text(&o.stderr)
    );
    assert!(!sweep.join("runs").exists());
}

#[test]
fn two_sweeps_cannot_share_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "epochs = 40\n[grid]\nseed = [0]\n");
    let sweep = tmp.path().join("sw");
    let mut first = Command::new(EXE)
        .args([
            "sweep",
            "run",
            spec.to_str().unwrap(),
            "--dir",
            sweep.to_str().unwrap(),
            "--quiet",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !sweep.join("plan.json").exists() {
        assert!(start.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = run_sweep(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
    sigterm(first.id());
    let _ = first.wait();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("in use by another run"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn plan_lists_every_point_and_report_draws_the_heatmap() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        "epochs = 1\n[grid]\ncategory = [\"weight\", \"activation\"]\nformat = [\"bf16\", \"posit<16,1>\"]\n",
    );
    let o = qcandle(&["sweep", "plan", spec.to_str().unwrap()], tmp.path());
    let out = text(&o.stdout);
    assert!(out.contains("4 points"), "{out}");
    assert!(
        out.contains("| 3 | activation-posit_16_1 | activation | posit<16,1> |"),
        "{out}"
    );
    let sweep = tmp.path().join("sw");
    let dir = sweep.to_str().unwrap();
    let o = run_sweep(
        tmp.path(),
        "run",
        &spec,
        &sweep,
        &["--workers", "2", "--quiet"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = qcandle(
        &["sweep", "report", spec.to_str().unwrap(), "--dir", dir],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    for png in ["curves.png", "heatmap.png"] {
        let bytes = std::fs::read(sweep.join(png)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
    }
    let md = std::fs::read_to_string(sweep.join("report.md")).unwrap();
    assert!(md.contains("4 points (4 finished)"), "{md}");
    assert!(md.contains("![heatmap.png](heatmap.png)"), "{md}");
    // One bit width only (16): no bit-width plot.
    assert!(!sweep.join("bits.png").exists());
}

#[test]
fn the_ptq_step_is_part_of_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("spec.toml");
    std::fs::write(
        &spec,
        "name = \"t\"\nptq = [\"posit<8,0>\"]\n[base]\nmodel = \"mlp\"\ndata = \"embedded\"\n\
         train-limit = 256\nepochs = 1\n",
    )
    .unwrap();
    let sweep = tmp.path().join("sw");
    let args = [
        "sweep",
        "run",
        spec.to_str().unwrap(),
        "--dir",
        sweep.to_str().unwrap(),
        "--quiet",
    ];
    let o = qcandle(&args, tmp.path());
    assert!(o.status.success(), "{}", text(&o.stderr));
    let csv = sweep.join("runs/t/ptq/ptq.csv");
    let first = std::fs::read_to_string(&csv).unwrap();
    // Methods whose format holds a comma are quoted, so every row has the header's columns.
    assert!(first.contains("\n\"posit<8,0> quire\","), "{first}");
    let columns = |l: &str| qcandle::io::csv_fields(l).len();
    assert!(first.lines().all(|l| columns(l) == 7), "{first}");
    let model = std::fs::read(sweep.join("runs/t/model.safetensors")).unwrap();
    // Without its PTQ rows the point is not finished; running again redoes only the PTQ step.
    std::fs::remove_file(&csv).unwrap();
    let o = qcandle(&args, tmp.path());
    assert!(
        text(&o.stderr).contains("1 finished now, 0 already finished"),
        "{}",
        text(&o.stderr)
    );
    let again = std::fs::read_to_string(&csv).unwrap();
    let accuracy = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| l.rsplit_once(',').unwrap().0.to_string())
            .collect()
    };
    assert_eq!(accuracy(&again), accuracy(&first));
    assert_eq!(
        std::fs::read(sweep.join("runs/t/model.safetensors")).unwrap(),
        model
    );
}

#[test]
fn a_device_that_cannot_be_opened_stops_the_sweep_before_any_point() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "epochs = 1\n[grid]\nseed = [0, 1]\n");
    let sweep = tmp.path().join("sw");
    let o = run_sweep(
        tmp.path(),
        "run",
        &spec,
        &sweep,
        &["--device", "cuda:7", "--quiet"],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    // Without the cuda feature, or on a machine without that GPU.
    assert!(
        err.contains("without CUDA support") || err.contains("cannot open cuda:7"),
        "{err}"
    );
    assert!(!sweep.join("runs").exists());
    let o = qcandle(
        &["sweep", "plan", spec.to_str().unwrap(), "--device", "gpu"],
        tmp.path(),
    );
    // A usage error (status 2), as for any bad flag value.
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("gpu"), "{}", text(&o.stderr));
}

#[test]
fn status_and_report_refuse_a_sweep_directory_that_does_not_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "epochs = 1\n");
    let missing = tmp.path().join("typo");
    for command in ["status", "report"] {
        let o = qcandle(
            &[
                "sweep",
                command,
                spec.to_str().unwrap(),
                "--dir",
                missing.to_str().unwrap(),
            ],
            tmp.path(),
        );
        assert_eq!(o.status.code(), Some(1), "{command}");
        assert!(
            text(&o.stderr).contains("no such sweep directory"),
            "{}",
            text(&o.stderr)
        );
        assert!(!missing.exists(), "{command} created it");
    }
}

/// The last epoch's figures of a run's `stats.json`, read independently of the report: the
/// (layer/category, SQNR) of the lowest SQNR (a number; `inf` sorts last) and the largest
/// flushed and saturated fractions.
fn stats_json_figures(run: &Path) -> (String, f64, f64, f64) {
    let text = std::fs::read_to_string(run.join("stats.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entries = json["per_epoch"].as_array().unwrap();
    let last = entries.iter().map(|e| e["epoch"].as_u64().unwrap()).max();
    let last: Vec<&serde_json::Value> = entries
        .iter()
        .filter(|e| e["epoch"].as_u64() == last)
        .collect();
    let sqnr = |e: &serde_json::Value| e["sqnr_db"].as_f64().unwrap_or(f64::INFINITY);
    let worst = last
        .iter()
        .min_by(|a, b| sqnr(a).total_cmp(&sqnr(b)))
        .unwrap();
    let max = |key: &str| {
        last.iter()
            .map(|e| e[key].as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    (
        format!(
            "{}/{}",
            worst["layer"].as_str().unwrap(),
            worst["category"].as_str().unwrap()
        ),
        sqnr(worst),
        max("flushed"),
        max("at_max"),
    )
}

#[test]
fn a_sweep_with_stats_reports_what_each_runs_statistics_say() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        "epochs = 1\nstats = \"every=2\"\n[grid]\nconfig = [\"float32\", \"posit<8,0>\", \"fp8\"]\n",
    );
    let sweep = tmp.path().join("sw");
    sweep_ok(
        tmp.path(),
        "run",
        &spec,
        &sweep,
        &["--workers", "2", "--quiet"],
    );
    sweep_ok(tmp.path(), "report", &spec, &sweep, &[]);
    let csv = std::fs::read_to_string(sweep.join("report.csv")).unwrap();
    let mut lines = csv.lines().map(qcandle::io::csv_fields);
    let header = lines.next().unwrap();
    let column = |name: &str| header.iter().position(|h| h == name).expect(name);
    let (run_col, site_col, sqnr_col) =
        (column("run"), column("worst_site"), column("worst_sqnr_db"));
    let (flushed_col, saturated_col) = (column("max_flushed_pct"), column("max_saturated_pct"));
    let rows: Vec<Vec<String>> = lines.collect();
    assert_eq!(rows.len(), 3, "{csv}");
    let mut flushing = 0;
    for row in &rows {
        let run = sweep.join("runs").join(&row[run_col]);
        let cells = [
            &row[site_col],
            &row[sqnr_col],
            &row[flushed_col],
            &row[saturated_col],
        ];
        if row[run_col] == "float32" {
            // Nothing rounded: no statistics, empty cells.
            assert!(!run.join("stats.json").exists());
            assert!(cells.iter().all(|c| c.is_empty()), "{row:?}");
            continue;
        }
        let (site, sqnr, flushed, saturated) = stats_json_figures(&run);
        assert_eq!(
            cells.map(String::as_str),
            [
                site.as_str(),
                &format!("{sqnr:.2}"),
                &format!("{:.3}", 100.0 * flushed),
                &format!("{:.3}", 100.0 * saturated),
            ],
            "{}",
            row[run_col]
        );
        flushing += usize::from(flushed > 0.0);
        // Every epoch sampled at the spec's interval.
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("stats.json")).unwrap())
                .unwrap();
        assert_eq!(json["epochs"][0]["every"], 2);
        // `qcandle stats` puts the same site first, with the same SQNR.
        let o = qcandle(&["stats", run.to_str().unwrap()], tmp.path());
        assert!(o.status.success(), "{}", text(&o.stderr));
        let table = text(&o.stdout);
        let (layer, category) = site.split_once('/').unwrap();
        let first = table
            .lines()
            .find(|l| l.starts_with("| ") && !l.starts_with("| layer"))
            .unwrap();
        assert!(
            first.starts_with(&format!("| {layer} | {category} | ")),
            "{first}\n{table}"
        );
        assert!(first.contains(&format!(" | {sqnr:.1} | ")), "{first}");
    }
    // fp8 flushes some gradients: the figures are not all zero by construction.
    assert!(flushing > 0, "{csv}");
    let md = std::fs::read_to_string(sweep.join("report.md")).unwrap();
    assert!(md.contains("| worst site | worst SQNR dB | max flushed % | max saturated % |"));
}

#[test]
fn statistics_resume_with_the_run_and_are_never_added_to_trained_epochs() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sw");
    let run = sweep.join("runs/t");
    let epochs_recorded = || -> Vec<(u64, u64)> {
        let text = std::fs::read_to_string(run.join("stats.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json["epochs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["epoch"].as_u64().unwrap(), e["every"].as_u64().unwrap()))
            .collect()
    };
    let body =
        |epochs: usize, stats: &str| format!("epochs = {epochs}\nconfig = \"posit<8,0>\"\n{stats}");
    // One epoch with statistics, by the command a Slurm array task runs, then a second by a
    // local worker: the resumed run has both.
    let spec = write_spec(tmp.path(), &body(1, "stats = 3"));
    sweep_ok(
        tmp.path(),
        "task",
        &spec,
        &sweep,
        &["--index", "0", "--quiet"],
    );
    assert_eq!(epochs_recorded(), [(1, 3)]);
    let spec = write_spec(tmp.path(), &body(2, "stats = \"every=3\""));
    sweep_ok(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
    assert_eq!(epochs_recorded(), [(1, 3), (2, 3)]);
    // Another interval, or statistics asked of a run trained without: a conflict, not resumed.
    for stats in ["stats = 5", "stats = true"] {
        let spec = write_spec(tmp.path(), &body(3, stats));
        let o = run_sweep(tmp.path(), "status", &spec, &sweep, &[]);
        let out = text(&o.stdout) + &text(&o.stderr);
        assert!(out.contains("conflict"), "{out}");
        let o = run_sweep(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
        assert!(!o.status.success(), "{}", text(&o.stderr));
        let err = std::fs::read_to_string(sweep.join("failed/t.txt")).unwrap();
        assert!(
            err.contains("statistics cannot be added to trained epochs"),
            "{err}"
        );
        assert!(err.contains("trained epochs 1-2 of"), "{err}");
    }
    assert_eq!(epochs_recorded(), [(1, 3), (2, 3)]);
    // Without `stats` the run resumes and the report still shows its statistics.
    let spec = write_spec(tmp.path(), &body(3, "stats = false"));
    sweep_ok(tmp.path(), "run", &spec, &sweep, &["--quiet"]);
    sweep_ok(tmp.path(), "report", &spec, &sweep, &[]);
    let csv = std::fs::read_to_string(sweep.join("report.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("worst_site"), "{csv}");
}
