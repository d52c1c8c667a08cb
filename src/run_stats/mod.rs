//! Per-layer, per-category rounding statistics of a training run (`qcandle train --stats`),
//! their files, table and pictures, and the inspection of a trained model (`qcandle
//! inspect`).
//!
//! While training with statistics, every quantizer of the model and of the optimizer that
//! rounds at a (layer, category) site reports to that site's collector
//! ([`crate::stats::Collector`]); the collectors are switched on for the sampled steps only
//! (every `N`-th step of an epoch and its last step, [`StatsEvery`]), so the other steps run
//! as without statistics. What is recorded, per sampled step and site, is
//! [`crate::stats::RoundingStats`]: relative error and SQNR, bias, the fractions flushed to
//! zero, at the format's largest and smallest magnitude and turned NaN/Inf, and the histogram
//! of log2|x| before rounding. The forward pass's rounding of the weights is not observed: the
//! optimizer keeps the weights on their grid, so that rounding changes nothing; the `weight`
//! category is the optimizer's rounding of each updated weight (and bias), `momentum` pools
//! every optimizer state tensor (Adam's two moments), `input` is the model's input.
//!
//! Files in the run directory, written atomically with the epoch's other results and listed
//! in `run.json` with their digests ([`log`](mod@log), [`summary`](mod@summary)):
//! `stats.csv` (one row per sampled step and site), `stats_hist.csv` (their histogram bins)
//! and `stats.json` (the figures pooled per epoch, each site's format range and densest
//! region, the last epoch's histograms). A resumed run reads the first two back and goes on
//! from the next epoch, so no epoch is lost or recorded twice. `qcandle stats RUN` prints
//! [`summary::worst_first_table`] and draws the pictures of [`plots`](mod@plots). A sweep
//! records them in every point when its spec's `[base]` sets `stats` (see
//! [`crate::sweep::point`] for when such a point is finished), and `qcandle sweep report`
//! adds each run's [`summary::RunSummary`], read from its `stats.json`.

pub mod inspect;
pub mod log;
pub mod plots;
pub mod recorder;
pub mod summary;

pub use log::StatsLog;
pub use recorder::{Sample, StatsEvery, StatsRecorder};

/// The statistics files of a run directory, in the order they are written.
pub const FILES: [&str; 3] = ["stats.csv", "stats_hist.csv", "stats.json"];
