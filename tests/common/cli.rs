//! Running the `qcandle` binary, for the test targets that drive the tool as a user would
//! (`tests/cli.rs`, `tests/hostile/`): the binary with arguments and standard input closed,
//! its captured output as text, and the check that it failed cleanly.
//!
//! Included with `#[path]` by those targets only: the binary (and `CARGO_BIN_EXE_qcandle`)
//! exists with the `cli` feature alone, so `tests/common/mod.rs` cannot hold this.

#![allow(dead_code)] // each test target uses part of it

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The path of the `qcandle` binary Cargo built for the tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_qcandle");

/// The tool with `args` and standard input closed, not yet started (set its outputs or its
/// directory, then run or spawn it).
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    command.args(args).stdin(Stdio::null());
    command
}

/// Runs the tool with `args` in the working directory `cwd` (none: the test's own), its
/// standard output and error captured.
pub fn qcandle_in(cwd: Option<&Path>, args: &[&str]) -> Output {
    let mut command = command(args);
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    command.output().expect("the binary runs")
}

/// Runs the tool with `args`, its standard output and error captured.
pub fn qcandle(args: &[&str]) -> Output {
    qcandle_in(None, args)
}

/// Runs the tool with `args` under `sh -c` after the shell commands `prelude` (a umask, a
/// resource limit), in the working directory `cwd` (none: the test's own).
pub fn qcandle_after(prelude: &str, cwd: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("{prelude}; exec \"$0\" \"$@\""))
        .arg(BINARY)
        .args(args)
        .stdin(Stdio::null());
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    command.output().expect("sh runs")
}

/// The tool's standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The tool's standard output, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts the tool failed cleanly: exit status 1, no panic or abort, and a message on
/// standard error containing every one of `words` (case-insensitive).
#[track_caller]
pub fn assert_clean_failure(o: &Output, words: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected exit 1, got {:?}: {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    let lower = err.to_lowercase();
    for w in words {
        assert!(
            lower.contains(&w.to_lowercase()),
            "`{w}` missing from: {err}"
        );
    }
}
