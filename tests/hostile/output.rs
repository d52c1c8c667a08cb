//! Standard output that cannot be written: a full device is an error naming standard
//! output (exit 1, no panic), a reader that closed the pipe ends the tool quietly (status
//! 141, as SIGPIPE would), and in both cases a training run's files are complete. A closed
//! standard error loses notes, never the run.

use std::path::Path;
use std::process::{Output, Stdio};

use crate::cli::{assert_clean_failure, command, stderr};

/// Runs the tool with standard output (and standard error, if `close_stderr`) going to a
/// pipe whose reading end is already closed.
fn with_closed_pipe(args: &[&str], close_stderr: bool) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut command = command(args);
    if close_stderr {
        command.stdout(writer.try_clone().unwrap()).stderr(writer);
    } else {
        command.stdout(writer).stderr(Stdio::piped());
    }
    command.output().unwrap()
}

/// Runs the tool with standard output on `/dev/full` (every write fails: no space left).
fn with_full_stdout(args: &[&str]) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    command(args)
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn train_args(out: &Path) -> Vec<String> {
    [
        "train",
        "--data",
        "embedded",
        "--model",
        "mlp",
        "--train-limit",
        "256",
        "--epochs",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_full_stdout_is_an_error_naming_it() {
    for args in [&["formats"][..], &["--help"][..]] {
        let o = with_full_stdout(args);
        if args == ["--help"] {
            // clap's own help printing: it must not panic either.
            assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
            continue;
        }
        assert_clean_failure(&o, &["cannot write to standard output", "no space"]);
    }
}

#[test]
fn a_closed_pipe_ends_the_tool_quietly() {
    let o = with_closed_pipe(&["formats"], false);
    assert_eq!(o.status.code(), Some(141), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}

#[test]
fn training_results_survive_an_unwritable_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let (full, closed) = (dir.path().join("full"), dir.path().join("closed"));
    let o = with_full_stdout(&as_strs(&train_args(&full)));
    assert_clean_failure(&o, &["standard output"]);
    let o = with_closed_pipe(&as_strs(&train_args(&closed)), true);
    assert_eq!(o.status.code(), Some(141));
    for run in [&full, &closed] {
        let record = qcandle::train::load_checked_run(run).unwrap();
        assert_eq!(record.epochs.len(), 2, "{}", run.display());
    }
}
