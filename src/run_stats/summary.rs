//! Figures per epoch and site, pooled over the epoch's sampled steps, and where the inputs
//! lay against the format's grid: the JSON summary (`stats.json`) and the `qcandle stats`
//! table.
//!
//! Pooling adds the sums and counts of every sample of the epoch at a site (in recording
//! order), so an epoch's SQNR is `10 log10(Σx² / Σe²)` over all its sampled roundings there.
//! Placement against the grid ([`Placement`]) is exact: a value in a binade below that of
//! the format's smallest positive value is below it, one in a binade above that of its
//! largest finite value is above it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::log::StatsLog;
use crate::stats::{FormatGrid, Log2Histogram, RoundingStats, Site};

/// One site's statistics pooled over one epoch's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    /// The epoch.
    pub epoch: usize,
    /// The site.
    pub site: Site,
    /// The format rounded to.
    pub format: String,
    /// The pooled sums and counts.
    pub stats: RoundingStats,
}

/// Fractions of the nonzero finite inputs, from the histogram, against the format's grid
/// (by whole binades: a value above the largest finite value but in its binade counts as in
/// range, as does one below the smallest positive value in its binade).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    /// Below the smallest positive value (binades below its binade).
    pub below_range: f64,
    /// Above the largest finite value (binades above its binade).
    pub above_range: f64,
    /// In the densest region (see [`crate::stats::grid`]).
    pub in_densest: f64,
}

impl Placement {
    /// Where the values counted in `histogram` lie against `grid`; `None` when the histogram
    /// is empty.
    pub fn of(histogram: &Log2Histogram, grid: &FormatGrid) -> Option<Self> {
        let total = histogram.total();
        if total == 0 {
            return None;
        }
        let (lo, hi) = grid.range_binades();
        let (dlo, dhi) = grid.densest();
        let (mut below, mut above, mut dense) = (0, 0, 0);
        for (k, c) in histogram.bins() {
            below += if k < lo { c } else { 0 };
            above += if k > hi { c } else { 0 };
            dense += if (dlo..=dhi).contains(&k) { c } else { 0 };
        }
        let f = |c: u64| c as f64 / total as f64;
        Some(Placement {
            below_range: f(below),
            above_range: f(above),
            in_densest: f(dense),
        })
    }
}

/// The statistics of every site pooled per epoch, ordered by epoch then site.
pub fn pooled(log: &StatsLog) -> Vec<Pooled> {
    let mut map: BTreeMap<(usize, Site), Pooled> = BTreeMap::new();
    for s in &log.samples {
        map.entry((s.epoch, s.site.clone()))
            .and_modify(|p| p.stats.merge(&s.stats))
            .or_insert_with(|| Pooled {
                epoch: s.epoch,
                site: s.site.clone(),
                format: s.format.clone(),
                stats: s.stats.clone(),
            });
    }
    map.into_values().collect()
}

/// The grid of a format as the log names it (`None` for formats without a fixed grid).
pub fn grid_of(format: &str) -> Option<FormatGrid> {
    FormatGrid::of(&format.parse().ok()?)
}

/// A figure for JSON: a number, `"inf"`/`"-inf"`, or null when undefined.
fn number(v: Option<f64>) -> Value {
    match v {
        Some(v) if v.is_finite() => json!(v),
        Some(v) if v > 0.0 => json!("inf"),
        Some(v) if v < 0.0 => json!("-inf"),
        _ => Value::Null,
    }
}

/// The figures of one pooled entry as a JSON object.
fn pooled_json(p: &Pooled) -> Value {
    let s = &p.stats;
    let placement = grid_of(&p.format).and_then(|g| Placement::of(&s.histogram, &g));
    json!({
        "epoch": p.epoch,
        "layer": p.site.layer,
        "category": p.site.category,
        "format": p.format,
        "elements": s.count,
        "rel_error": number(s.relative_error()),
        "sqnr_db": number(s.sqnr_db()),
        "mean_error": number(s.mean_error()),
        "rel_bias": number(s.relative_bias()),
        "exact": s.fraction(s.exact),
        "flushed": s.fraction(s.flushed),
        "at_max": s.fraction(s.at_max),
        "at_min": s.fraction(s.at_min),
        "became_nonfinite": s.fraction(s.became_nonfinite),
        "nonfinite_inputs": s.nonfinite_inputs,
        "below_range": number(placement.map(|p| p.below_range)),
        "above_range": number(placement.map(|p| p.above_range)),
        "in_densest": number(placement.map(|p| p.in_densest)),
    })
}

/// `stats.json`: the epochs and their sampling, each site's format with its range and
/// densest region (log2 of binades), the figures of every site pooled per epoch, and the last
/// epoch's histograms beside the format's values per binade.
pub fn summary_json(log: &StatsLog) -> String {
    let pooled = pooled(log);
    let mut epochs = Vec::new();
    for epoch in log.epochs() {
        let samples: Vec<_> = log.samples.iter().filter(|s| s.epoch == epoch).collect();
        let mut steps: Vec<usize> = samples.iter().map(|s| s.step).collect();
        steps.dedup();
        epochs.push(json!({
            "epoch": epoch,
            "every": samples.first().map(|s| s.every),
            "steps": samples.first().map(|s| s.steps),
            "sampled_steps": steps,
        }));
    }
    let mut sites: BTreeMap<&Site, &str> = BTreeMap::new();
    for s in &log.samples {
        sites.entry(&s.site).or_insert(&s.format);
    }
    let sites: Vec<Value> = sites
        .into_iter()
        .map(|(site, format)| {
            let grid = grid_of(format);
            json!({
                "layer": site.layer,
                "category": site.category,
                "format": format,
                "min_positive": grid.as_ref().map(|g| g.min_positive),
                "max_finite": grid.as_ref().map(|g| g.max_finite),
                "range_log2": grid.as_ref().map(|g| [g.range_binades().0, g.range_binades().1]),
                "densest_log2": grid.as_ref().map(|g| [g.densest().0, g.densest().1]),
            })
        })
        .collect();
    let last = log.epochs().last().copied();
    let histograms: Vec<Value> = pooled
        .iter()
        .filter(|p| Some(p.epoch) == last)
        .map(|p| {
            json!({
                "epoch": p.epoch,
                "layer": p.site.layer,
                "category": p.site.category,
                "bins": p.stats.histogram.bins(),
                "grid": grid_of(&p.format).map(|g| g.per_binade),
            })
        })
        .collect();
    let summary = json!({
        "epochs": epochs,
        "sites": sites,
        "per_epoch": pooled.iter().map(pooled_json).collect::<Vec<_>>(),
        "final_histograms": histograms,
    });
    serde_json::to_string_pretty(&summary).expect("a JSON value serialises")
}

/// The last epoch's pooled sites, worst first: lowest SQNR first, undefined SQNR last.
pub fn worst_first(log: &StatsLog) -> Vec<Pooled> {
    let last = log.epochs().last().copied();
    let mut rows: Vec<Pooled> = pooled(log)
        .into_iter()
        .filter(|p| Some(p.epoch) == last)
        .collect();
    let key = |p: &Pooled| p.stats.sqnr_db().unwrap_or(f64::INFINITY);
    rows.sort_by(|a, b| key(a).total_cmp(&key(b)).then(a.site.cmp(&b.site)));
    rows
}

/// A run's statistics in a few figures (the columns `qcandle sweep report` adds): the last
/// epoch's worst site by SQNR ([`worst_first`]'s first) and the largest fractions of
/// nonzero inputs flushed to zero and saturated to the largest magnitude over its sites.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// The last epoch with statistics.
    pub epoch: usize,
    /// Its site with the lowest SQNR (sites with an undefined SQNR come last).
    pub worst: Site,
    /// That site's SQNR in dB (`None`: undefined, no nonzero input).
    pub worst_sqnr_db: Option<f64>,
    /// The largest fraction flushed to zero over the epoch's sites.
    pub max_flushed: f64,
    /// The largest fraction saturated to the largest magnitude over the epoch's sites.
    pub max_at_max: f64,
}

impl RunSummary {
    /// The summary of `log`; `None` when it holds no sample.
    pub fn of(log: &StatsLog) -> Option<Self> {
        let rows = worst_first(log);
        let first = rows.first()?;
        let max = |f: fn(&RoundingStats) -> u64| {
            rows.iter()
                .map(|p| p.stats.fraction(f(&p.stats)))
                .fold(0.0, f64::max)
        };
        Some(RunSummary {
            epoch: first.epoch,
            worst: first.site.clone(),
            worst_sqnr_db: first.stats.sqnr_db(),
            max_flushed: max(|s| s.flushed),
            max_at_max: max(|s| s.at_max),
        })
    }

    /// The summary from the text of a run's `stats.json` ([`summary_json`]), which gives the
    /// same figures as [`RunSummary::of`] of its log without reading the per-step files;
    /// `None` when it holds no site.
    pub fn from_summary_json(text: &str) -> anyhow::Result<Option<Self>> {
        use anyhow::Context;
        let json: Value = serde_json::from_str(text).context("stats.json is not JSON")?;
        let entries = json["per_epoch"]
            .as_array()
            .context("stats.json has no `per_epoch` list")?;
        let field = |e: &Value, key: &str| -> anyhow::Result<f64> {
            match &e[key] {
                Value::Null => Ok(f64::NAN),
                Value::String(s) if s == "inf" => Ok(f64::INFINITY),
                Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
                v => v
                    .as_f64()
                    .with_context(|| format!("stats.json: `{key}` is not a number: {v}")),
            }
        };
        let mut rows = Vec::new();
        for e in entries {
            let text = |key: &str| {
                e[key]
                    .as_str()
                    .map(str::to_string)
                    .with_context(|| format!("stats.json: `{key}` is not a string"))
            };
            let epoch = e["epoch"]
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .context("stats.json: `epoch` is not a count")?;
            let site = Site::new(text("layer")?, text("category")?);
            let sqnr = field(e, "sqnr_db")?;
            let sqnr = (!sqnr.is_nan()).then_some(sqnr);
            rows.push(Entry {
                epoch,
                site,
                sqnr,
                flushed: field(e, "flushed")?,
                at_max: field(e, "at_max")?,
            });
        }
        let Some(last) = rows.iter().map(|r| r.epoch).max() else {
            return Ok(None);
        };
        rows.retain(|r| r.epoch == last);
        let key = |r: &Entry| r.sqnr.unwrap_or(f64::INFINITY);
        rows.sort_by(|a, b| key(a).total_cmp(&key(b)).then(a.site.cmp(&b.site)));
        let max = |f: fn(&Entry) -> f64| rows.iter().map(f).fold(0.0, f64::max);
        let (max_flushed, max_at_max) = (max(|r| r.flushed), max(|r| r.at_max));
        let worst = rows.swap_remove(0);
        Ok(Some(RunSummary {
            epoch: last,
            worst: worst.site,
            worst_sqnr_db: worst.sqnr,
            max_flushed,
            max_at_max,
        }))
    }
}

/// One site's figures of one epoch, as `stats.json` gives them.
struct Entry {
    epoch: usize,
    site: Site,
    sqnr: Option<f64>,
    flushed: f64,
    at_max: f64,
}

/// A percentage with two decimals, or `-`.
fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.2}", 100.0 * v))
}

/// A markdown table of [`worst_first`]: SQNR, relative error and bias of the last epoch, the
/// fractions flushed, at the largest and smallest magnitude and turned NaN/Inf, and where the
/// inputs lay against the format (below its range, in its densest region).
pub fn worst_first_table(log: &StatsLog) -> String {
    let mut out = String::from(
        "| layer | category | format | SQNR (dB) | rel. error | rel. bias | flushed % | at max % \
         | at min % | NaN/Inf % | below range % | in densest % |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in worst_first(log) {
        let s = &p.stats;
        let placement = grid_of(&p.format).and_then(|g| Placement::of(&s.histogram, &g));
        let sci = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2e}"));
        let sqnr = s.sqnr_db().map_or("-".into(), |v| format!("{v:.1}"));
        out.push_str(&format!(
            "| {} | {} | {} | {sqnr} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            p.site.layer,
            p.site.category,
            p.format,
            sci(s.relative_error()),
            sci(s.relative_bias()),
            pct(Some(s.fraction(s.flushed))),
            pct(Some(s.fraction(s.at_max))),
            pct(Some(s.fraction(s.at_min))),
            pct(Some(s.fraction(s.became_nonfinite))),
            pct(placement.map(|p| p.below_range)),
            pct(placement.map(|p| p.in_densest)),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_stats::Sample;
    use crate::stats::Limits;

    fn sample(epoch: usize, step: usize, layer: &str, x: &[f32], q: &[f32]) -> Sample {
        let format: crate::Format = "posit<8,0>".parse().unwrap();
        Sample {
            epoch,
            step,
            steps: 2,
            every: 1,
            site: Site::new(layer, "gradient"),
            format: format.to_string(),
            stats: RoundingStats::of(x, q, Limits::of::<f32>(&format)),
        }
    }

    #[test]
    fn placement_counts_values_outside_the_range_and_in_the_densest_binades() {
        let grid = grid_of("posit<8,0>").unwrap();
        let mut h = Log2Histogram::new();
        // Below minpos 2^-6 (binade -7), at minpos (binade -6: in range), densest (-1, 0),
        // above maxpos 64 (binade 7 and up; 100 lies above maxpos but in its binade 6, and
        // counts as in range).
        for x in [0.01, 2f64.powi(-6), 0.5, 1.5, 1.9, 200.0, 3.0, 100.0, 300.0] {
            h.add(x);
        }
        let p = Placement::of(&h, &grid).unwrap();
        assert_eq!(
            (p.below_range, p.above_range, p.in_densest),
            (1.0 / 9.0, 2.0 / 9.0, 3.0 / 9.0)
        );
        assert!(Placement::of(&Log2Histogram::new(), &grid).is_none());
    }

    #[test]
    fn epochs_pool_their_samples_and_the_worst_site_comes_first() {
        let log = StatsLog {
            samples: vec![
                sample(1, 1, "fc1", &[1.0, 2.0], &[1.0, 2.0]),
                sample(1, 1, "fc2", &[0.1], &[0.09375]),
                sample(2, 1, "fc1", &[3.0], &[3.0]),
                sample(2, 2, "fc1", &[1e-9, 1.0], &[0.015625, 1.0]),
                sample(2, 2, "fc2", &[1.0 / 3.0], &[0.328125]),
            ],
        };
        let pooled = pooled(&log);
        assert_eq!(pooled.len(), 4);
        let fc1 = &pooled[2];
        assert_eq!((fc1.epoch, fc1.site.layer.as_str()), (2, "fc1"));
        assert_eq!(
            (fc1.stats.count, fc1.stats.at_min, fc1.stats.exact),
            (3, 1, 2)
        );
        assert_eq!(fc1.stats.histogram.bins(), vec![(-30, 1), (0, 1), (1, 1)]);
        // Epoch 2: fc1 has SQNR 10 log10(10 / (2^-6 - 1e-9)^2) = 46.1 dB, fc2 10 log10((1/3)^2
        // / (1/3 - 0.328125)^2) = 36.1 dB: fc2 is worse.
        let worst = worst_first(&log);
        assert_eq!(worst[0].site.layer, "fc2");
        assert!((worst[0].stats.sqnr_db().unwrap() - 36.12).abs() < 0.01);
        assert!((worst[1].stats.sqnr_db().unwrap() - 46.12).abs() < 0.01);
        let table = worst_first_table(&log);
        assert!(table
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("| fc2 | gradient | posit<8,0> | 36.1 |"));
        let json: Value = serde_json::from_str(&summary_json(&log)).unwrap();
        assert_eq!(json["per_epoch"].as_array().unwrap().len(), 4);
        assert_eq!(json["per_epoch"][0]["sqnr_db"], "inf");
        assert_eq!(json["epochs"][1]["sampled_steps"], json!([1, 2]));
        assert_eq!(json["sites"][0]["densest_log2"], json!([-1, 0]));
        assert_eq!(json["final_histograms"].as_array().unwrap().len(), 2);
        // The run's summary: fc2 worst; fc1 of epoch 2 has 1 of 3 nonzero inputs at minpos,
        // none flushed or saturated.
        let summary = RunSummary::of(&log).unwrap();
        assert_eq!((summary.epoch, summary.worst.layer.as_str()), (2, "fc2"));
        assert_eq!((summary.max_flushed, summary.max_at_max), (0.0, 0.0));
        let from_json = RunSummary::from_summary_json(&summary_json(&log)).unwrap();
        assert_eq!(from_json, Some(summary));
    }

    #[test]
    fn the_run_summary_takes_the_largest_fractions_and_puts_undefined_sqnr_last() {
        // The rounded values are given by hand: fc1 has 1 of 2 nonzero inputs flushed to
        // zero, fc2 1 of 4 at posit<8,0>'s largest value 64, fc3 zeros only (its SQNR is
        // undefined, so it is not the worst site although its error is zero as well).
        let log = StatsLog {
            samples: vec![
                sample(1, 1, "fc1", &[1.0, 0.001], &[1.0, 0.0]),
                sample(1, 1, "fc2", &[1.0, 2.0, 4.0, 100.0], &[1.0, 2.0, 4.0, 64.0]),
                sample(1, 1, "fc3", &[0.0, 0.0], &[0.0, 0.0]),
            ],
        };
        let summary = RunSummary::of(&log).unwrap();
        assert_eq!(summary.max_flushed, 0.5);
        assert_eq!(summary.max_at_max, 0.25);
        // SQNR: fc1 10 log10(1.000001 / 1e-6) = 60 dB, fc2 10 log10(10021 / 36^2) = 8.9 dB.
        assert_eq!(summary.worst, Site::new("fc2", "gradient"));
        assert!((summary.worst_sqnr_db.unwrap() - 8.884).abs() < 1e-3);
        assert_eq!(
            RunSummary::from_summary_json(&summary_json(&log)).unwrap(),
            Some(summary)
        );
        assert_eq!(
            RunSummary::from_summary_json(&summary_json(&StatsLog::default())).unwrap(),
            None
        );
        assert!(RunSummary::from_summary_json("{}").is_err());
    }
}
