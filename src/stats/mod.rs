//! Rounding statistics: what a rounding did to a tensor, where a format's values lie, and
//! the collectors through which quantizers report what they did.
//!
//! - [`RoundingStats`] ([`rounding`](mod@rounding)): relative error (2-norm) and SQNR, bias, the
//!   fractions flushed to zero, at the format's largest and smallest magnitude and turned
//!   NaN/±Inf, and a histogram of log2|x| before rounding, from one pass over the values
//!   before and after.
//! - [`Log2Histogram`] ([`histogram`](mod@histogram)): exact counts per binade.
//! - [`FormatGrid`] ([`grid`](mod@grid)): the format's values per binade, its range and its
//!   densest region (the binades holding the most values).
//! - [`Collector`], [`Tap`], [`Site`] ([`collector`](mod@collector)): a quantizer's tap
//!   reports its roundings to an attached collector while that is switched on; with none,
//!   rounding is unchanged and costs one atomic read more.
//!
//! `qcandle train --stats` attaches a collector to every (layer, category) of a model and its
//! optimizer and switches them on for the sampled steps (see `run_stats` with the `cli`
//! feature).

pub mod collector;
pub mod grid;
pub mod histogram;
pub mod rounding;

pub use collector::{Collector, Site, Tap};
pub use grid::FormatGrid;
pub use histogram::{binade, Log2Histogram};
pub use rounding::{Limits, RoundingStats};
