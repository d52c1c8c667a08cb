//! Recording during training: one [`Collector`] per (layer, category) site, attached to every
//! quantizer of the model and the optimizer that rounds there, switched on for the sampled
//! steps only.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::ops::Quant;
use crate::stats::{Collector, RoundingStats, Site};

/// How often `train --stats` records: every `every`-th step of an epoch (1-based: steps
/// `every`, `2·every`, ...) and the epoch's last step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsEvery(pub usize);

/// The sampling interval of `--stats` given without a value.
pub const DEFAULT_EVERY: usize = 50;

impl Default for StatsEvery {
    fn default() -> Self {
        StatsEvery(DEFAULT_EVERY)
    }
}

impl FromStr for StatsEvery {
    type Err = anyhow::Error;

    /// `every=N` or `N`, N >= 1.
    fn from_str(s: &str) -> Result<Self> {
        let n = s.strip_prefix("every=").unwrap_or(s);
        match n.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(StatsEvery(n)),
            _ => bail!("--stats takes every=N with N a whole number of steps >= 1, got `{s}`"),
        }
    }
}

impl StatsEvery {
    /// Whether step `step` (1-based) of an epoch of `steps` steps is recorded.
    pub fn is_sampled(self, step: usize, steps: usize) -> bool {
        step.is_multiple_of(self.0) || step == steps
    }
}

/// What one sampled step did at one site.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The epoch (1-based).
    pub epoch: usize,
    /// The step within the epoch (1-based).
    pub step: usize,
    /// The epoch's number of steps.
    pub steps: usize,
    /// The sampling interval in force.
    pub every: usize,
    /// Where the rounding happened.
    pub site: Site,
    /// The format rounded to (as it displays).
    pub format: String,
    /// The step's roundings at the site, merged.
    pub stats: RoundingStats,
}

impl Sample {
    /// The training progress in epochs at the end of this step (`epoch - 1 + step/steps`).
    pub fn progress(&self) -> f64 {
        (self.epoch - 1) as f64 + self.step as f64 / self.steps.max(1) as f64
    }
}

/// The collectors of a training run's sites and the samples of the epoch in progress.
#[derive(Debug)]
pub struct StatsRecorder {
    every: StatsEvery,
    sites: BTreeMap<Site, (String, Arc<Collector>)>,
    pending: Vec<Sample>,
}

impl StatsRecorder {
    /// Attaches a collector per site to `quants` (quantizers without a site are left alone;
    /// quantizers of one site share its collector).
    pub fn attach(every: StatsEvery, quants: &[Quant]) -> Self {
        let mut sites: BTreeMap<Site, (String, Arc<Collector>)> = BTreeMap::new();
        for q in quants {
            let Some(site) = q.site() else { continue };
            let (_, collector) = sites
                .entry(site.clone())
                .or_insert_with(|| (q.format().to_string(), Arc::new(Collector::new())));
            q.tap().attach(Some(collector.clone()));
        }
        StatsRecorder {
            every,
            sites,
            pending: Vec::new(),
        }
    }

    /// The sampling interval.
    pub fn every(&self) -> StatsEvery {
        self.every
    }

    /// The sites observed, in order.
    pub fn sites(&self) -> Vec<&Site> {
        self.sites.keys().collect()
    }

    /// Switches every collector on or off.
    pub fn set_on(&self, on: bool) {
        for (_, c) in self.sites.values() {
            c.set_on(on);
        }
    }

    /// Takes what the collectors recorded as the samples of step `step` of `steps` in
    /// `epoch` (sites that rounded nothing give none).
    pub fn collect(&mut self, epoch: usize, step: usize, steps: usize) {
        for (site, (format, collector)) in &self.sites {
            if let Some(stats) = collector.take() {
                self.pending.push(Sample {
                    epoch,
                    step,
                    steps,
                    every: self.every.0,
                    site: site.clone(),
                    format: format.clone(),
                    stats,
                });
            }
        }
    }

    /// The samples recorded since the last call (those of the finished epoch).
    pub fn take_samples(&mut self) -> Vec<Sample> {
        std::mem::take(&mut self.pending)
    }

    /// Drops what was recorded (the samples of an epoch that did not finish).
    pub fn discard(&mut self) {
        self.pending.clear();
        for (_, c) in self.sites.values() {
            c.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parses_with_or_without_its_name_and_refuses_zero() {
        assert_eq!("every=7".parse::<StatsEvery>().unwrap(), StatsEvery(7));
        assert_eq!("3".parse::<StatsEvery>().unwrap(), StatsEvery(3));
        for bad in ["every=0", "every=", "x", "-1", "every=2.5"] {
            let e = bad.parse::<StatsEvery>().unwrap_err().to_string();
            assert!(e.contains("every=N"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_sampled_steps_are_the_multiples_and_the_last() {
        let every = StatsEvery(50);
        let sampled: Vec<usize> = (1..=120).filter(|&s| every.is_sampled(s, 120)).collect();
        assert_eq!(sampled, [50, 100, 120]);
        let all: Vec<usize> = (1..=3)
            .filter(|&s| StatsEvery(1).is_sampled(s, 3))
            .collect();
        assert_eq!(all, [1, 2, 3]);
    }
}
