//! Sweeps: one spec file expands into many training runs (formats x categories x seeds x
//! any option), run locally by worker processes or as a Slurm job array, resumable, and
//! gathered into one report.
//!
//! - [`spec`]: the TOML spec and its checks (`[base]`, `[grid]`, `[zip]`, `exclude`, `ptq`).
//! - [`plan`]: the spec expanded into numbered, named points with their settings.
//! - [`point`]: a sweep directory's layout, a point's state, and running one point (what a
//!   local worker and a Slurm array task both do).
//! - [`local`]: the local backend: N worker processes, a progress bar, clean stops.
//! - [`slurm`]: the Slurm backend: an array job over the unfinished points.
//! - [`submit`]: a sweep submitted to Slurm (`sweep submit`) and its queued tasks
//!   (`sweep status`).
//! - [`report`]: `report.md`, `report.csv` and plots over the points' results.
//!
//! Reproducibility: a point's run is an ordinary `qcandle train` run directory (same
//! identity, lock, digests and resume rules; see [`crate::train`]), so a point trained by a
//! Slurm task equals the same point trained locally bit for bit, and `qcandle compare` reads
//! points like any run.

pub mod local;
pub mod plan;
pub mod point;
pub mod report;
pub mod slurm;
pub mod spec;
pub mod submit;

pub use plan::{Plan, Point, Settings};
pub use point::{run_point, state, State, SweepDir};
pub use spec::{Key, Spec, Value};

/// The default directory of the sweep `name`: `sweeps/<name>`.
pub fn default_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new("sweeps").join(name)
}
