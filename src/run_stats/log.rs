//! The statistics of a run's finished epochs as files: `stats.csv` (one row per sampled step
//! and site: the raw sums and counts, then the derived figures), `stats_hist.csv` (the
//! nonempty histogram bins of each row) and their reading back, exactly, when a run resumes.
//!
//! Raw sums are written in Rust's shortest round-trip notation (`{:e}`), so a file read back
//! gives the same bits and a resumed run's statistics equal an uninterrupted run's.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

use super::recorder::Sample;
use crate::io::{csv_field, csv_fields};
use crate::stats::{RoundingStats, Site};

/// The samples of a run's finished epochs, in recording order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsLog {
    /// Every sample, epoch by epoch.
    pub samples: Vec<Sample>,
}

/// The columns of `stats.csv`.
pub const STATS_HEADER: &str = "epoch,step,steps,every,layer,category,format,count,\
nonfinite_inputs,zero_inputs,exact,flushed,at_max,at_min,became_nonfinite,sum_x2,sum_e2,sum_e,\
sum_abs_x,rel_error,sqnr_db,mean_error,rel_bias";

/// The columns of `stats_hist.csv`: one row per nonempty bin `2^log2_bin <= |x| <
/// 2^(log2_bin+1)`.
pub const HIST_HEADER: &str = "epoch,step,layer,category,log2_bin,count";

/// An optional figure as CSV: empty when undefined.
fn opt(v: Option<f64>, precision: usize) -> String {
    v.map_or(String::new(), |v| format!("{v:.precision$e}"))
}

impl StatsLog {
    /// The epochs with samples, in order, each once.
    pub fn epochs(&self) -> Vec<usize> {
        let mut epochs: Vec<usize> = self.samples.iter().map(|s| s.epoch).collect();
        epochs.dedup();
        epochs
    }

    /// Keeps the samples of epochs up to `last` only.
    pub fn truncate_to(&mut self, last: usize) {
        self.samples.retain(|s| s.epoch <= last);
    }

    /// `stats.csv`.
    pub fn stats_csv(&self) -> String {
        let mut csv = format!("{STATS_HEADER}\n");
        for s in &self.samples {
            let t = &s.stats;
            let sqnr = t.sqnr_db().map_or(String::new(), |v| {
                if v.is_finite() {
                    format!("{v:.4}")
                } else {
                    "inf".into()
                }
            });
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:e},{:e},{:e},{:e},{},{},{},{}\n",
                s.epoch,
                s.step,
                s.steps,
                s.every,
                csv_field(&s.site.layer),
                csv_field(&s.site.category),
                csv_field(&s.format),
                t.count,
                t.nonfinite_inputs,
                t.zero_inputs,
                t.exact,
                t.flushed,
                t.at_max,
                t.at_min,
                t.became_nonfinite,
                t.sum_x2,
                t.sum_e2,
                t.sum_e,
                t.sum_abs_x,
                opt(t.relative_error(), 6),
                sqnr,
                opt(t.mean_error(), 6),
                opt(t.relative_bias(), 6),
            ));
        }
        csv
    }

    /// `stats_hist.csv`.
    pub fn hist_csv(&self) -> String {
        let mut csv = format!("{HIST_HEADER}\n");
        for s in &self.samples {
            let (layer, category) = (csv_field(&s.site.layer), csv_field(&s.site.category));
            for (k, count) in s.stats.histogram.bins() {
                csv.push_str(&format!(
                    "{},{},{layer},{category},{k},{count}\n",
                    s.epoch, s.step
                ));
            }
        }
        csv
    }

    /// Reads back what [`StatsLog::stats_csv`] and [`StatsLog::hist_csv`] wrote.
    pub fn parse(stats_csv: &str, hist_csv: &str) -> Result<StatsLog> {
        let mut lines = stats_csv.lines();
        if lines.next() != Some(STATS_HEADER) {
            bail!("stats.csv does not start with the header `{STATS_HEADER}`");
        }
        let mut samples = Vec::new();
        let mut index = BTreeMap::new();
        for (i, line) in lines.enumerate() {
            let sample = parse_sample(line).with_context(|| format!("stats.csv line {}", i + 2))?;
            let key = (sample.epoch, sample.step, sample.site.clone());
            if index.insert(key, samples.len()).is_some() {
                bail!(
                    "stats.csv line {}: a second row for the same step and site",
                    i + 2
                );
            }
            samples.push(sample);
        }
        let mut lines = hist_csv.lines();
        if lines.next() != Some(HIST_HEADER) {
            bail!("stats_hist.csv does not start with the header `{HIST_HEADER}`");
        }
        for (i, line) in lines.enumerate() {
            let f = csv_fields(line);
            let context = || format!("stats_hist.csv line {}", i + 2);
            if f.len() != 6 {
                bail!("{}: expected 6 fields, found {}", context(), f.len());
            }
            let key = (
                num(&f[0]).with_context(context)?,
                num(&f[1]).with_context(context)?,
                Site::new(f[2].clone(), f[3].clone()),
            );
            let k: i32 = f[4]
                .parse()
                .with_context(|| format!("{}: log2_bin", context()))?;
            let count: u64 = num(&f[5]).with_context(context)?;
            let Some(&at) = index.get(&key) else {
                bail!("{}: no row of stats.csv for this step and site", context());
            };
            samples[at].stats.histogram.add_to_bin(k, count);
        }
        Ok(StatsLog { samples })
    }
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T> {
    s.parse()
        .map_err(|_| anyhow::anyhow!("`{s}` is not a whole number"))
}

fn float(s: &str) -> Result<f64> {
    s.parse()
        .map_err(|_| anyhow::anyhow!("`{s}` is not a number"))
}

fn parse_sample(line: &str) -> Result<Sample> {
    let f = csv_fields(line);
    let columns = STATS_HEADER.split(',').count();
    if f.len() != columns {
        bail!("expected {columns} fields, found {}", f.len());
    }
    let stats = RoundingStats {
        count: num(&f[7])?,
        nonfinite_inputs: num(&f[8])?,
        zero_inputs: num(&f[9])?,
        exact: num(&f[10])?,
        flushed: num(&f[11])?,
        at_max: num(&f[12])?,
        at_min: num(&f[13])?,
        became_nonfinite: num(&f[14])?,
        sum_x2: float(&f[15])?,
        sum_e2: float(&f[16])?,
        sum_e: float(&f[17])?,
        sum_abs_x: float(&f[18])?,
        histogram: Default::default(),
    };
    if stats.nonfinite_inputs + stats.became_nonfinite > stats.count {
        bail!("more non-finite elements than elements");
    }
    Ok(Sample {
        epoch: num(&f[0])?,
        step: num(&f[1])?,
        steps: num(&f[2])?,
        every: num(&f[3])?,
        site: Site::new(f[4].clone(), f[5].clone()),
        format: f[6].clone(),
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Limits;

    fn sample(epoch: usize, step: usize, layer: &str, x: &[f32], q: &[f32]) -> Sample {
        let format: crate::Format = "posit<8,0>".parse().unwrap();
        Sample {
            epoch,
            step,
            steps: 10,
            every: 5,
            site: Site::new(layer, "error"),
            format: format.to_string(),
            stats: RoundingStats::of(x, q, Limits::of::<f32>(&format)),
        }
    }

    #[test]
    fn the_files_read_back_to_the_same_samples_bit_for_bit() {
        let log = StatsLog {
            samples: vec![
                sample(
                    1,
                    5,
                    "fc1",
                    &[0.1, -1.7, 1e-9, 0.0],
                    &[0.09375, -1.6875, 0.015625, 0.0],
                ),
                sample(1, 10, "fc1", &[1.0 / 3.0, 300.0], &[0.328125, 64.0]),
                sample(2, 5, "conv1", &[f32::NAN, 2.6], &[f32::NAN, 2.625]),
                sample(2, 5, "fc1", &[1.0], &[1.0]),
            ],
        };
        let back = StatsLog::parse(&log.stats_csv(), &log.hist_csv()).unwrap();
        assert_eq!(back, log);
        assert_eq!(back.epochs(), [1, 2]);
        // The format's comma is quoted.
        assert!(log.stats_csv().contains(",\"posit<8,0>\","));
        let mut cut = log.clone();
        cut.truncate_to(1);
        assert_eq!(cut.samples.len(), 2);
    }

    #[test]
    fn damaged_files_are_refused_with_the_line() {
        let log = StatsLog {
            samples: vec![sample(1, 5, "fc1", &[0.1], &[0.09375])],
        };
        let (stats, hist) = (log.stats_csv(), log.hist_csv());
        let e = StatsLog::parse(&stats.replace(",5,10,", ",x,10,"), &hist).unwrap_err();
        assert!(format!("{e:#}").contains("stats.csv line 2"), "{e:#}");
        let e = StatsLog::parse(&stats, &hist.replace("fc1", "fc9")).unwrap_err();
        assert!(format!("{e:#}").contains("no row of stats.csv"), "{e:#}");
        let e = StatsLog::parse("epoch\n", &hist).unwrap_err();
        assert!(e.to_string().contains("header"), "{e}");
        let doubled = format!("{stats}{}", stats.lines().nth(1).unwrap());
        assert!(StatsLog::parse(&doubled, &hist).is_err());
    }
}
