//! A run directory kept safe: one writer at a time, files checked before they are trusted,
//! and the leftovers of a killed writer removed.
//!
//! - **Lock.** A writer holds an advisory lock ([`std::fs::File::try_lock`], `flock` on Unix)
//!   on `DIR/.lock` for as long as it writes. A second writer fails at once, naming the
//!   process that holds the directory. The lock goes with the process (killed or not), so a
//!   killed run never leaves a stale lock. The file itself stays: deleting it would let two
//!   writers lock two different files of the same name.
//! - **Digests.** Every file a run writes is recorded in `run.json` with its SHA-256
//!   ([`Digests`]); resuming, reporting a finished run and `compare` check them first, so a
//!   damaged or edited file is named instead of being read as results.
//! - **Leftovers.** Files are written atomically (a temporary file renamed into place, see
//!   [`crate::io::write_atomically`]); a writer killed mid-write leaves its temporary file
//!   behind, and [`remove_leftovers`] deletes them under the lock.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// The lock file's name inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// The exclusive right to write a run directory, held until dropped.
#[derive(Debug)]
pub struct RunLock {
    dir: PathBuf,
    _file: File,
}

impl RunLock {
    /// Creates `dir` if needed and locks it, failing at once if another process (or another
    /// lock in this process) holds it, or if files cannot be created in it.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let mut file = open_in_output_dir(dir, LOCK_FILE)?;
        let path = dir.join(LOCK_FILE);
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => String::from("another process"),
                    pid => format!("process {pid}"),
                };
                bail!(
                    "{} is in use by another run ({holder}); wait for it to finish or choose \
                     another output directory",
                    dir.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
        file.set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(RunLock {
            dir: dir.to_path_buf(),
            _file: file,
        })
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Creates the output directory `dir` (with its parents) if needed and opens the file `name`
/// in it for reading and writing, created if missing and never truncated: the check that
/// files can be created there, shared by every command that writes a directory. The error
/// names the directory and says whether it is not a directory, cannot be created or takes
/// no files.
pub fn open_in_output_dir(dir: &Path, name: &str) -> Result<File> {
    if dir.exists() && !dir.is_dir() {
        bail!("the output directory {} is not a directory", dir.display());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    let path = dir.join(name);
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| {
            format!(
                "the output directory {} is not writable (cannot create {})",
                dir.display(),
                path.display()
            )
        })
}

/// Deletes the temporary files that a writer killed mid-write left in `dir`
/// ([`crate::io::is_temporary_name`]). Returns their names.
/// Call it only while holding the directory's [`RunLock`].
pub fn remove_leftovers(lock: &RunLock) -> Result<Vec<String>> {
    let dir = lock.dir();
    let mut removed = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::io::is_temporary_name(&name) && entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}

/// The SHA-256 of a file's contents, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// File names (relative to the run directory) and their SHA-256 digests.
pub type Digests = BTreeMap<String, String>;

/// How a recorded file fails its check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The file is gone.
    Missing(String),
    /// The file's contents are not those recorded.
    Changed(String),
}

impl Damage {
    /// The damaged file's name.
    pub fn file(&self) -> &str {
        match self {
            Damage::Missing(f) | Damage::Changed(f) => f,
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Missing(file) => write!(f, "{file} is missing"),
            Damage::Changed(file) => write!(
                f,
                "{file} is damaged (its contents differ from what the run wrote: truncated or \
                 edited)"
            ),
        }
    }
}

/// The digests of `files` in `dir`.
pub fn digests(dir: &Path, files: &[&str]) -> Result<Digests> {
    files
        .iter()
        .map(|f| Ok((f.to_string(), sha256_file(&dir.join(f))?)))
        .collect()
}

/// The recorded files of `dir` that are missing or whose contents changed.
pub fn check(dir: &Path, recorded: &Digests) -> Vec<Damage> {
    recorded
        .iter()
        .filter_map(|(file, digest)| {
            let path = dir.join(file);
            if !path.is_file() {
                return Some(Damage::Missing(file.clone()));
            }
            match sha256_file(&path) {
                Ok(d) if d == *digest => None,
                _ => Some(Damage::Changed(file.clone())),
            }
        })
        .collect()
}
