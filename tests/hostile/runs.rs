//! Training runs a user can get wrong: a directory holds one run, named by every setting
//! that changes its results (compared by contents, not spelling); one writer at a time;
//! damaged files are found before their numbers are trusted; options are checked before
//! anything is created; the leftovers of a killed writer are removed; floats in `run.json`
//! survive a resume bit for bit.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::cli::{assert_clean_failure, command, qcandle, qcandle_in, stderr, stdout};

/// `train` on the embedded subset, small and fast: an MLP on the first `limit` images (all
/// 6000 when `None`), then `extra`.
fn train_with<'a>(out: &'a str, limit: Option<&'a str>, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "train", "--data", "embedded", "--model", "mlp", "--quiet", "--out", out,
    ];
    if let Some(limit) = limit {
        args.extend(["--train-limit", limit]);
    }
    args.extend_from_slice(extra);
    args
}

/// [`train_with`] on 512 images.
fn train_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    train_with(out, Some("512"), extra)
}

fn train_ok(out: &Path, extra: &[&str]) -> std::process::Output {
    let out = out.to_str().unwrap();
    let o = qcandle(&train_args(out, extra));
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Flips one byte in the middle of a file.
fn damage(path: &Path) {
    let mut bytes = read(path);
    let i = bytes.len() / 2;
    bytes[i] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_different_train_limit_is_another_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = run.to_str().unwrap();
    train_ok(&run, &["--epochs", "1"]);
    // Resuming with another limit would mix two runs.
    let o = qcandle(&train_with(out, Some("256"), &["--epochs", "2"]));
    assert_clean_failure(&o, &["different run", "train-limit: 512", "256 now"]);
    // Without any limit: all images.
    let o = qcandle(&train_with(out, None, &["--epochs", "2"]));
    assert_clean_failure(&o, &["train-limit: 512", "none"]);
    // Nor is a finished run reported under another limit.
    let o = qcandle(&train_with(out, Some("256"), &["--epochs", "1"]));
    assert_clean_failure(&o, &["train-limit: 512", "256 now"]);
    let record = qcandle::train::load_run(&run).unwrap();
    assert_eq!(record.options.train_limit, Some(512));
    assert_eq!(record.epochs.len(), 1);
}

#[test]
fn every_setting_that_differs_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train_ok(&run, &["--epochs", "1"]);
    let o = qcandle(&train_args(
        run.to_str().unwrap(),
        &[
            "--epochs", "1", "--lr", "0.01", "--seed", "4", "--batch", "32",
        ],
    ));
    assert_clean_failure(&o, &["lr: 0.001", "0.01 now", "seed: 0", "batch: 128"]);
    let o = qcandle(&train_args(
        run.to_str().unwrap(),
        &["--epochs", "1", "--config", "posit<16,1>"],
    ));
    assert_clean_failure(&o, &["config"]);
    let o = qcandle(&train_args(
        run.to_str().unwrap(),
        &["--epochs", "1", "--optimizer", "sgd"],
    ));
    assert_clean_failure(&o, &["optimizer: adam", "sgd now"]);
}

#[test]
fn a_config_path_spelled_two_ways_is_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("x.toml"),
        "weight = \"posit<16,1>\"\nactivation = \"bf16\"\n",
    )
    .unwrap();
    let args = |config: &'static str, epochs: &'static str| {
        train_args("run", &["--config", config, "--epochs", epochs])
    };
    let o = qcandle_in(Some(dir.path()), &args("./x.toml", "1"));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = qcandle_in(Some(dir.path()), &args("x.toml", "2"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 3, "{}", stdout(&o)); // header + 2 epochs
                                                                 // The same name with other contents is another run.
    std::fs::write(dir.path().join("x.toml"), "weight = \"posit<8,0>\"\n").unwrap();
    let o = qcandle_in(Some(dir.path()), &args("x.toml", "3"));
    assert_clean_failure(&o, &["config", "x.toml", "differ"]);
}

/// The IDX files of the full Fashion-MNIST, where installed.
fn fashion_mnist() -> Option<PathBuf> {
    let dir = PathBuf::from(qcandle::data::FASHION_MNIST_DEFAULT_DIR);
    dir.join(qcandle::data::FILES[0]).exists().then_some(dir)
}

#[test]
fn the_same_data_in_another_directory_is_the_same_run() {
    let Some(original) = fashion_mnist() else {
        eprintln!("skipped: Fashion-MNIST is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for (i, file) in qcandle::data::FILES.iter().enumerate() {
        let bytes = read(&original.join(file));
        if i == 3 {
            // One file stored uncompressed: the same labels.
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw)
                .unwrap();
            std::fs::write(copy.join(file.trim_end_matches(".gz")), raw).unwrap();
        } else {
            std::fs::write(copy.join(file), bytes).unwrap();
        }
    }
    let run = dir.path().join("run");
    let out = run.to_str().unwrap();
    let (original, copy) = (original.to_str().unwrap(), copy.to_str().unwrap());
    let train = |extra: &[&str]| {
        let base = ["train", "--model", "mlp", "--train-limit", "256", "--quiet"];
        qcandle(&[&base[..], &["--out", out], extra].concat())
    };
    let o = train(&["--epochs", "1", "--data-dir", original]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = train(&["--epochs", "2", "--data-dir", copy]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(qcandle::train::load_run(&run).unwrap().epochs.len(), 2);
    // Other images are other data.
    let o = train(&["--epochs", "3", "--data", "embedded"]);
    assert_clean_failure(&o, &["data:", "differ"]);
}

#[test]
fn a_locked_directory_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let lock = qcandle::run_dir::RunLock::acquire(&run).unwrap();
    let o = qcandle(&train_args(run.to_str().unwrap(), &["--epochs", "1"]));
    assert_clean_failure(&o, &["in use", &std::process::id().to_string()]);
    assert!(!run.join("run.json").exists());
    drop(lock);
    train_ok(&run, &["--epochs", "1"]);
}

#[test]
fn two_concurrent_trainings_into_one_directory_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = run.to_str().unwrap();
    // LeNet-5 on all 6000 images: long enough for the second to start meanwhile.
    let args = [
        "train", "--data", "embedded", "--quiet", "--epochs", "2", "--out", out,
    ];
    let mut first = command(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first holds the lock (it writes its process id into the lock file).
    let lock_file = run.join(qcandle::run_dir::LOCK_FILE);
    let pid = first.id().to_string();
    for _ in 0..600 {
        if std::fs::read_to_string(&lock_file).is_ok_and(|t| t.trim() == pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = qcandle(&args);
    let first_status = first.wait().unwrap();
    assert!(first_status.success());
    assert_clean_failure(&second, &["in use", &pid]);
    let record = qcandle::train::load_checked_run(&run).unwrap();
    assert_eq!(record.epochs.len(), 2);
}

#[test]
fn damaged_results_of_a_finished_run_are_found_and_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let first = train_ok(&run, &["--epochs", "2"]);
    let model = read(&run.join("model.safetensors"));
    let metrics = read(&run.join("metrics.csv"));
    damage(&run.join("model.safetensors"));
    damage(&run.join("metrics.csv"));
    // `compare` reads what it reports: it refuses the damaged run.
    let o = qcandle(&["compare", run.to_str().unwrap()]);
    assert_clean_failure(&o, &["metrics.csv", "model.safetensors", "damaged"]);
    assert_eq!(stdout(&o), "", "nothing printed before the error");
    // Reporting the finished run again checks, says so and rewrites both from the
    // checkpoint: the same bytes as before and the same numbers.
    let again = train_ok(&run, &["--epochs", "2"]);
    let err = stderr(&again);
    assert!(err.contains("model.safetensors is damaged"), "{err}");
    assert!(err.contains("rewritten from the checkpoint"), "{err}");
    assert_eq!(read(&run.join("model.safetensors")), model);
    assert_eq!(read(&run.join("metrics.csv")), metrics);
    assert_eq!(stdout(&again), stdout(&first));
    let o = qcandle(&["compare", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_damaged_or_truncated_checkpoint_says_so_and_how_to_recover() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train_ok(&run, &["--epochs", "1"]);
    let checkpoint = run.join("checkpoint.safetensors");
    let bytes = read(&checkpoint);
    std::fs::write(&checkpoint, &bytes[..bytes.len() / 2]).unwrap();
    let o = qcandle(&train_args(run.to_str().unwrap(), &["--epochs", "2"]));
    assert_clean_failure(
        &o,
        &[
            "checkpoint.safetensors",
            "truncated",
            "delete the directory",
        ],
    );
    // A checkpoint of the right length with other contents.
    let mut edited = bytes.clone();
    let last = edited.len() - 1;
    edited[last] ^= 1;
    std::fs::write(&checkpoint, &edited).unwrap();
    let o = qcandle(&train_args(run.to_str().unwrap(), &["--epochs", "2"]));
    assert_clean_failure(
        &o,
        &["checkpoint.safetensors", "damaged", "delete the directory"],
    );
    // A truncated run.json.
    std::fs::write(&checkpoint, &bytes).unwrap();
    let record = read(&run.join("run.json"));
    std::fs::write(run.join("run.json"), &record[..record.len() / 2]).unwrap();
    let o = qcandle(&train_args(run.to_str().unwrap(), &["--epochs", "2"]));
    assert_clean_failure(&o, &["run.json", "truncated", "delete the directory"]);
}

#[test]
fn a_killed_writers_temporary_files_are_removed_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train_ok(&run, &["--epochs", "1"]);
    let leftovers = [
        ".tmpAbC123",
        ".curves.png.4242.partial.png",
        ".model.safetensors.4242.partial.safetensors",
    ];
    for name in leftovers {
        std::fs::write(run.join(name), b"half written").unwrap();
    }
    std::fs::write(run.join("notes.txt"), b"the user's own file").unwrap();
    let o = train_ok(&run, &["--epochs", "2"]);
    for name in leftovers {
        assert!(!run.join(name).exists(), "{name} left behind");
        assert!(stderr(&o).contains(name), "{}", stderr(&o));
    }
    assert!(run.join("notes.txt").exists());
}

#[test]
fn fewer_epochs_than_a_run_finished_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train_ok(&run, &["--epochs", "2"]);
    let o = qcandle(&train_args(run.to_str().unwrap(), &["--epochs", "1"]));
    assert_clean_failure(&o, &["already holds 2 finished epochs"]);
}

#[test]
fn bad_options_are_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = run.to_str().unwrap();
    for (option, value) in [
        ("--batch", "0"),
        ("--lr", "nan"),
        ("--lr", "inf"),
        ("--lr", "-1"),
        ("--lr", "0"),
        ("--epochs", "0"),
        ("--train-limit", "0"),
    ] {
        let flag = format!("{option}={value}");
        let o = qcandle(&train_with(out, None, &[&flag]));
        let name = option.trim_start_matches("--");
        let name = if name == "model" {
            "unknown model"
        } else {
            name
        };
        assert_clean_failure(&o, &[name]);
        assert!(!run.exists(), "{flag} created {out}");
    }
    let o = qcandle(&[
        "train",
        "--data",
        "embedded",
        "--model",
        "resnet1000",
        "--out",
        out,
    ]);
    assert_clean_failure(&o, &["unknown model", "resnet1000"]);
    assert!(!run.exists());
}

#[test]
fn an_unwritable_output_is_found_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    // A regular file, and a directory under one.
    let o = qcandle(&train_args(file.to_str().unwrap(), &["--epochs", "1"]));
    assert_clean_failure(&o, &["not a directory"]);
    let under = file.join("run");
    let o = qcandle(&train_args(under.to_str().unwrap(), &["--epochs", "1"]));
    assert_clean_failure(&o, &["cannot create the output directory"]);
    // A directory that exists but takes no files (even for root): /proc.
    let o = qcandle(&train_args("/proc", &["--epochs", "1"]));
    assert_clean_failure(&o, &["/proc", "not writable"]);
    assert!(!stderr(&o).contains("loss"), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
}

#[test]
fn run_json_floats_survive_a_resume_bit_for_bit() {
    // A value whose shortest spelling the default JSON float parser reads one unit in the
    // last place off.
    for x in [1.5454552541387843f64, 2.2250738585072014e-308, 0.1, 1e300] {
        let back: f64 = serde_json::from_str(&serde_json::to_string(&x).unwrap()).unwrap();
        assert_eq!(back.to_bits(), x.to_bits(), "{x:?}");
    }
    let mut rng = super::Rng::new(17);
    for _ in 0..200_000 {
        let x = f64::from_bits(rng.next_u64());
        if x.is_finite() {
            let back: f64 = serde_json::from_str(&serde_json::to_string(&x).unwrap()).unwrap();
            assert_eq!(back.to_bits(), x.to_bits(), "{x:?}");
        }
    }
    // End to end: three epochs straight, and one then two more.
    let dir = tempfile::tempdir().unwrap();
    let (straight, resumed) = (dir.path().join("a"), dir.path().join("b"));
    train_ok(&straight, &["--epochs", "3"]);
    train_ok(&resumed, &["--epochs", "1"]);
    train_ok(&resumed, &["--epochs", "3"]);
    let (a, b) = (
        qcandle::train::load_run(&straight).unwrap(),
        qcandle::train::load_run(&resumed).unwrap(),
    );
    assert_eq!(a.epochs.len(), 3);
    for (x, y) in a.epochs.iter().zip(&b.epochs) {
        assert_eq!(x.train_loss.to_bits(), y.train_loss.to_bits());
        assert_eq!(x.test_loss.to_bits(), y.test_loss.to_bits());
        assert_eq!((x.top1, x.top5), (y.top1, y.top5));
    }
    for file in ["model.safetensors", "checkpoint.safetensors"] {
        assert_eq!(
            read(&straight.join(file)),
            read(&resumed.join(file)),
            "{file}"
        );
    }
}

#[test]
fn a_layer_pattern_that_matches_no_layer_is_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.toml"),
        "weight = \"bf16\"\n[[layer]]\npattern = \"fc_1\"\nweight = \"none\"\n\
         [[layer]]\npattern = \"fc*\"\nactivation = \"bf16\"\n",
    )
    .unwrap();
    let o = qcandle_in(
        Some(dir.path()),
        &train_args("run", &["--config", "c.toml", "--epochs", "1"]),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("pattern `fc_1` matches no layer of mlp"),
        "{err}"
    );
    assert!(!err.contains("`fc*`"), "{err}");
}

#[test]
fn a_model_the_data_does_not_fit_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = run.to_str().unwrap();
    let o = qcandle(&[
        "train", "--data", "embedded", "--model", "cifarnet", "--epochs", "1", "--out", out,
    ]);
    assert_clean_failure(&o, &["cifarnet needs 3x32x32 images", "1x28x28"]);
    assert!(!run.exists());
}
