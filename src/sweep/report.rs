//! A sweep's results in one table, a summary over seeds, and plots.
//!
//! [`write()`] writes into the sweep directory:
//!
//! - `report.csv`: one row per point: `run`, one column per axis, `status`, `epochs` (finished),
//!   `top1`, `top5`, `train_loss` (of the last finished epoch), `seconds` (training steps,
//!   summed over epochs), with a PTQ step one `ptq <method> top1` column per method, and
//!   when some point's run has rounding statistics (`stats` in the spec's `[base]`) the
//!   summary of its last epoch's statistics ([`RunSummary`], the figures `qcandle stats`
//!   shows): `worst_site` (`layer/category` with the lowest SQNR), `worst_sqnr_db`,
//!   `max_flushed_pct` and `max_saturated_pct` (the largest percentages of nonzero inputs
//!   flushed to zero and saturated to the format's largest magnitude over its sites); empty
//!   for runs without statistics (a config that rounds nothing has none).
//! - `report.md`: the same table (statistics columns `worst site`, `worst SQNR dB`, `max
//!   flushed %`, `max saturated %`), and when `seed` is an axis the mean ± sample standard
//!   deviation over seeds of every group of points equal in the other axes (finished points
//!   only; `n` says how many).
//! - `curves.png`: train loss and test top-1 per epoch of every point.
//! - `heatmap.png`, when two format-like axes (`category` and `format`, a category and
//!   `config`, ...) vary together: the mean top-1 of each pair of their values.
//! - `bits.png`, when the points' formats span two or more bit widths: mean top-1 against
//!   bit width, one line per category (see [`format_bits`]).
//!
//! Only results whose files pass their digests are reported ([`super::point::state`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::plan::{Plan, Point};
use super::point::{state, State, SweepDir};
use super::spec::{Key, Value};
use crate::format::Format;
use crate::io::csv_field;
use crate::plot::Series;
use crate::run_stats::summary::RunSummary;
use crate::train::RunRecord;

/// One point's results.
#[derive(Debug, Clone)]
pub struct Row {
    /// The point.
    pub point: Point,
    /// How far it got.
    pub state: State,
    /// Its checked run record, when it has one.
    pub record: Option<RunRecord>,
    /// Top-1 of each PTQ method (`posit<8,0> quire`, ...), as `ptq.csv` lists them.
    pub ptq: Vec<(String, f64)>,
    /// The summary of the run's rounding statistics, when it has them (`stats.json`).
    pub stats: Option<RunSummary>,
}

impl Row {
    /// The last finished epoch's top-1, top-5 and train loss.
    pub fn last(&self) -> Option<(f64, f64, f64)> {
        let e = self.record.as_ref()?.epochs.last()?;
        Some((e.top1, e.top5, e.train_loss))
    }

    /// The point's value of `key` as the report shows it (`-` for an axis of another grid).
    pub fn axis_text(&self, key: Key) -> String {
        self.point
            .axis(key)
            .map_or("-".to_string(), Value::to_string)
    }
}

/// The results of every point of `plan` in `dir`.
pub fn gather(plan: &Plan, dir: &SweepDir) -> Vec<Row> {
    plan.points
        .iter()
        .map(|point| {
            let (state, record) = state(dir, point);
            let ptq = read_ptq(&dir.run_dir(&point.name));
            let stats = record
                .as_ref()
                .and_then(|r| read_stats(&dir.run_dir(&point.name), r));
            Row {
                point: point.clone(),
                state,
                record,
                ptq,
                stats,
            }
        })
        .collect()
}

/// `ptq/ptq.csv`'s (method, top-1) pairs; none when it is missing or unreadable.
fn read_ptq(run_dir: &Path) -> Vec<(String, f64)> {
    let Ok(text) = std::fs::read_to_string(run_dir.join("ptq").join("ptq.csv")) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields = crate::io::csv_fields(line);
            Some((fields.first()?.clone(), fields.get(1)?.parse().ok()?))
        })
        .collect()
}

/// The summary of the run's `stats.json` when its checked `record` lists one (its digest was
/// checked); none when it has none or it is unreadable.
fn read_stats(run_dir: &Path, record: &RunRecord) -> Option<RunSummary> {
    if !record.files.contains_key("stats.json") {
        return None;
    }
    let text = std::fs::read_to_string(run_dir.join("stats.json")).ok()?;
    RunSummary::from_summary_json(&text).ok().flatten()
}

/// The statistics columns of `report.md`, present when some row has statistics.
pub const STATS_COLUMNS: [&str; 4] = [
    "worst site",
    "worst SQNR dB",
    "max flushed %",
    "max saturated %",
];

/// The statistics columns of `report.csv`, present when some row has statistics.
pub const STATS_CSV_COLUMNS: [&str; 4] = [
    "worst_site",
    "worst_sqnr_db",
    "max_flushed_pct",
    "max_saturated_pct",
];

/// Whether some row has statistics (the report then has their columns).
fn has_stats(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.stats.is_some())
}

/// The statistics cells of a row: the last epoch's worst site (`layer/category`) and its SQNR
/// (two decimals; `inf` when exact), the largest percentages flushed to zero and saturated
/// over its sites (three decimals); empty without statistics.
pub fn stats_cells(row: &Row) -> Vec<String> {
    let Some(s) = &row.stats else {
        return vec![String::new(); STATS_COLUMNS.len()];
    };
    let sqnr = match s.worst_sqnr_db {
        Some(v) if v.is_finite() => format!("{v:.2}"),
        Some(v) if v > 0.0 => "inf".to_string(),
        Some(_) => "-inf".to_string(),
        None => String::new(),
    };
    vec![
        format!("{}/{}", s.worst.layer, s.worst.category),
        sqnr,
        format!("{:.3}", 100.0 * s.max_flushed),
        format!("{:.3}", 100.0 * s.max_at_max),
    ]
}

/// The PTQ methods over all rows, in first-seen order.
fn ptq_methods(rows: &[Row]) -> Vec<String> {
    let mut methods: Vec<String> = Vec::new();
    for (m, _) in rows.iter().flat_map(|r| &r.ptq) {
        if !methods.contains(m) {
            methods.push(m.clone());
        }
    }
    methods
}

/// The per-point table as CSV (see the module docs for its columns).
pub fn csv(plan: &Plan, rows: &[Row]) -> String {
    let methods = ptq_methods(rows);
    let mut header: Vec<String> = vec!["run".into()];
    header.extend(plan.axes.iter().map(|k| k.name().to_string()));
    header.extend(["status", "epochs", "top1", "top5", "train_loss", "seconds"].map(String::from));
    header.extend(methods.iter().map(|m| format!("ptq {m} top1")));
    let stats = has_stats(rows);
    if stats {
        header.extend(STATS_CSV_COLUMNS.map(String::from));
    }
    let mut out = header
        .iter()
        .map(|h| csv_field(h))
        .collect::<Vec<_>>()
        .join(",");
    out.push('\n');
    for row in rows {
        let mut fields = vec![row.point.name.clone()];
        fields.extend(plan.axes.iter().map(|&k| row.axis_text(k)));
        fields.push(row.state.word().to_string());
        fields.extend(measurements(row));
        fields.extend(methods.iter().map(|m| ptq_cell(row, m)));
        if stats {
            fields.extend(stats_cells(row));
        }
        out.push_str(
            &fields
                .iter()
                .map(|f| csv_field(f))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    out
}

/// `epochs, top1, top5, train_loss, seconds` of a row (empty cells without results).
fn measurements(row: &Row) -> Vec<String> {
    match (&row.record, row.last()) {
        (Some(record), Some((top1, top5, loss))) => {
            let seconds: f64 = record.epochs.iter().map(|e| e.seconds).sum();
            vec![
                record.epochs.len().to_string(),
                format!("{top1:.2}"),
                format!("{top5:.2}"),
                format!("{loss:.4}"),
                format!("{seconds:.1}"),
            ]
        }
        _ => vec![
            "0".into(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ],
    }
}

fn ptq_cell(row: &Row, method: &str) -> String {
    row.ptq
        .iter()
        .find(|(m, _)| m == method)
        .map_or(String::new(), |(_, v)| format!("{v:.2}"))
}

/// Mean and sample standard deviation (n-1; `None` for fewer than two values).
pub fn mean_std(values: &[f64]) -> (f64, Option<f64>) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, None);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some(var.sqrt()))
}

/// A group of points equal in every axis but `seed`.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The group's value of every axis but `seed`, in axis order (`-` where its grid has
    /// no such axis).
    pub key: Vec<String>,
    /// The points in the group.
    pub points: usize,
    /// The last top-1, top-5 and train loss of its finished points.
    pub finished: Vec<(f64, f64, f64)>,
}

/// The rows grouped by every axis but `seed`, in first-seen order (empty when `seed` is not
/// an axis).
pub fn groups(plan: &Plan, rows: &[Row]) -> Vec<Group> {
    if !plan.axes.contains(&Key::Seed) {
        return Vec::new();
    }
    let others: Vec<Key> = plan
        .axes
        .iter()
        .copied()
        .filter(|&k| k != Key::Seed)
        .collect();
    let mut groups: Vec<Group> = Vec::new();
    for row in rows {
        let key: Vec<String> = others.iter().map(|&k| row.axis_text(k)).collect();
        let index = match groups.iter().position(|g| g.key == key) {
            Some(i) => i,
            None => {
                groups.push(Group {
                    key,
                    points: 0,
                    finished: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let group = &mut groups[index];
        group.points += 1;
        if row.state == State::Finished {
            if let Some(last) = row.last() {
                group.finished.push(last);
            }
        }
    }
    groups
}

fn pm(values: &[f64], decimals: usize) -> String {
    if values.is_empty() {
        return "-".into();
    }
    match mean_std(values) {
        (m, Some(s)) => format!("{m:.decimals$} ± {s:.decimals$}"),
        (m, None) => format!("{m:.decimals$}"),
    }
}

/// The markdown report (see the module docs); `plots` are the pictures to show, as paths
/// relative to the report.
pub fn markdown(plan: &Plan, rows: &[Row], plots: &[String]) -> String {
    let mut md = format!("# Sweep `{}`\n\n", plan.spec.name);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for row in rows {
        *counts.entry(row.state.word()).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
    md.push_str(&format!(
        "Spec `{}`: {} points ({}).\n\n",
        plan.spec.path.display(),
        rows.len(),
        counts.join(", ")
    ));
    let groups = groups(plan, rows);
    if !groups.is_empty() {
        let others: Vec<Key> = plan
            .axes
            .iter()
            .copied()
            .filter(|&k| k != Key::Seed)
            .collect();
        md.push_str("## Mean ± standard deviation over seeds (finished points)\n\n");
        let mut header: Vec<String> = others.iter().map(|k| k.name().to_string()).collect();
        header.extend(["n", "top-1 %", "top-5 %", "train loss"].map(String::from));
        md.push_str(&table_header(&header));
        for g in &groups {
            let column =
                |f: fn(&(f64, f64, f64)) -> f64| -> Vec<f64> { g.finished.iter().map(f).collect() };
            let mut cells = g.key.clone();
            cells.push(format!("{}/{}", g.finished.len(), g.points));
            cells.push(pm(&column(|t| t.0), 2));
            cells.push(pm(&column(|t| t.1), 2));
            cells.push(pm(&column(|t| t.2), 4));
            md.push_str(&table_row(&cells));
        }
        md.push('\n');
    }
    md.push_str("## Every point\n\n");
    let methods = ptq_methods(rows);
    let mut header = vec!["run".to_string()];
    header.extend(plan.axes.iter().map(|k| k.name().to_string()));
    header.extend(
        [
            "status",
            "epochs",
            "top-1 %",
            "top-5 %",
            "train loss",
            "seconds",
        ]
        .map(String::from),
    );
    header.extend(methods.iter().map(|m| format!("PTQ {m} top-1 %")));
    let stats = has_stats(rows);
    if stats {
        header.extend(STATS_COLUMNS.map(String::from));
    }
    md.push_str(&table_header(&header));
    for row in rows {
        let mut cells = vec![format!("`{}`", row.point.name)];
        cells.extend(plan.axes.iter().map(|&k| row.axis_text(k)));
        cells.push(match &row.state {
            State::Finished | State::Pending | State::Running => row.state.word().to_string(),
            other => other.to_string(),
        });
        cells.extend(measurements(row));
        cells.extend(methods.iter().map(|m| ptq_cell(row, m)));
        if stats {
            cells.extend(stats_cells(row));
        }
        md.push_str(&table_row(&cells));
    }
    if !plots.is_empty() {
        md.push_str("\n## Plots\n\n");
        for p in plots {
            md.push_str(&format!("![{p}]({p})\n\n"));
        }
    }
    md
}

fn table_header(cells: &[String]) -> String {
    format!("{}|{}\n", table_row(cells), "---|".repeat(cells.len()))
}

fn table_row(cells: &[String]) -> String {
    let escaped: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
    format!("| {} |\n", escaped.join(" | "))
}

/// The mean top-1 of the finished rows matching each pair of values of the axes `a` and
/// `b` (among the points whose only other axis is `seed`) (rows: `a`'s values, columns: `b`'s, in first-seen order); `None` when fewer than two
/// values of either vary among rows that have both.
pub fn heatmap_grid(rows: &[Row], a: Key, b: Key) -> Option<crate::plot::Grid> {
    // Points that vary only `a`, `b` and the seed: a point of another grid that also sets,
    // say, an accumulator is another experiment, not another seed of the cell.
    let both: Vec<&Row> = rows
        .iter()
        .filter(|r| r.point.axis(a).is_some() && r.point.axis(b).is_some())
        .filter(|r| {
            r.point
                .axes
                .iter()
                .all(|(k, _)| [a, b, Key::Seed].contains(k))
        })
        .collect();
    let distinct = |k: Key| {
        let mut seen: Vec<String> = Vec::new();
        for r in &both {
            let v = r.axis_text(k);
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        seen
    };
    let (row_labels, column_labels) = (distinct(a), distinct(b));
    if row_labels.len() < 2 || column_labels.len() < 2 {
        return None;
    }
    let values = row_labels
        .iter()
        .map(|rv| {
            column_labels
                .iter()
                .map(|cv| {
                    let top1: Vec<f64> = both
                        .iter()
                        .filter(|r| r.axis_text(a) == *rv && r.axis_text(b) == *cv)
                        .filter(|r| r.state == State::Finished)
                        .filter_map(|r| r.last().map(|l| l.0))
                        .collect();
                    (!top1.is_empty()).then(|| mean_std(&top1).0)
                })
                .collect()
        })
        .collect();
    Some(crate::plot::Grid {
        title: format!("test top-1 (%) by {a} and {b}, mean over seeds"),
        row_desc: a.to_string(),
        column_desc: b.to_string(),
        rows: row_labels,
        columns: column_labels,
        values,
    })
}

/// The bit width of the numbers a point varies and the series it belongs to: a
/// `category` + `format` point gives the format's width in a series per category (and per
/// value of the category axes it also has, such as an accumulator), a category
/// axis (`weight = ...`) the same, a `config` that is a format (or `float32`: 32 bits) its
/// width in the series `config`. `None` for points without a format axis.
pub fn format_bits(row: &Row) -> Option<(u32, String)> {
    let bits = |q: &Option<crate::nn::QuantSpec>| q.map_or(32, |q| q.format.bits());
    if let Some(Value::Quant(q)) = row.point.axis(Key::Format) {
        // Other categories the point sets (an accumulator) make a series of their own.
        let mut label = row.axis_text(Key::Category);
        for (key, value) in &row.point.axes {
            if let Key::Quant(c) = key {
                label.push_str(&format!(", {c} {value}"));
            }
        }
        return Some((bits(q), label));
    }
    for (key, value) in &row.point.axes {
        if let (Key::Quant(c), Value::Quant(q)) = (key, value) {
            return Some((bits(q), c.key().to_string()));
        }
    }
    match row.point.axis(Key::Config)? {
        Value::Text(s) if s == "float32" => Some((32, "config".to_string())),
        Value::Text(s) => s
            .parse::<Format>()
            .ok()
            .map(|f| (f.bits(), "config".to_string())),
        _ => None,
    }
}

/// Mean top-1 of the finished points against their [`format_bits`], one series per
/// series name, each point the mean over the points of that width (formats and seeds).
pub fn bits_series(rows: &[Row]) -> Vec<Series> {
    let mut series: Vec<(String, BTreeMap<u32, Vec<f64>>)> = Vec::new();
    for row in rows.iter().filter(|r| r.state == State::Finished) {
        let (Some((bits, label)), Some((top1, _, _))) = (format_bits(row), row.last()) else {
            continue;
        };
        let index = match series.iter().position(|(l, _)| *l == label) {
            Some(i) => i,
            None => {
                series.push((label, BTreeMap::new()));
                series.len() - 1
            }
        };
        series[index].1.entry(bits).or_default().push(top1);
    }
    series
        .into_iter()
        .map(|(label, by_bits)| {
            let points = by_bits
                .into_iter()
                .map(|(bits, v)| (f64::from(bits), mean_std(&v).0))
                .collect();
            Series::new(label, points)
        })
        .collect()
}

/// Writes `report.md`, `report.csv` and the plots into the sweep directory; returns the
/// paths written.
pub fn write(plan: &Plan, dir: &SweepDir) -> Result<Vec<PathBuf>> {
    let rows = gather(plan, dir);
    let root = dir.root();
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let mut written = Vec::new();
    let mut plots = Vec::new();
    let with_records: Vec<&Row> = rows.iter().filter(|r| r.record.is_some()).collect();
    if !with_records.is_empty() {
        let (mut loss, mut accuracy) = (Vec::new(), Vec::new());
        for row in &with_records {
            let (l, a) = row
                .record
                .as_ref()
                .expect("filtered")
                .curves(&row.point.name);
            loss.push(l);
            accuracy.push(a);
        }
        let path = root.join("curves.png");
        crate::plot::training_curves(
            &format!("sweep {}", plan.spec.name),
            &loss,
            &accuracy,
            &path,
        )?;
        plots.push("curves.png".to_string());
        written.push(path);
    }
    let format_axes: Vec<Key> = plan
        .axes
        .iter()
        .copied()
        .filter(|k| k.is_format_like())
        .collect();
    let pair = format_axes.iter().enumerate().find_map(|(i, &a)| {
        format_axes[i + 1..]
            .iter()
            .find_map(|&b| heatmap_grid(&rows, a, b))
    });
    if let Some(grid) = &pair {
        let path = root.join("heatmap.png");
        crate::plot::heatmap(grid, &path)?;
        plots.push("heatmap.png".to_string());
        written.push(path);
    }
    let series = bits_series(&rows);
    let widths: std::collections::BTreeSet<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0 as u64))
        .collect();
    if widths.len() >= 2 {
        let path = root.join("bits.png");
        crate::plot::lines(
            "test top-1 against bit width (mean over formats of a width and seeds)",
            "bits",
            "test top-1 (%)",
            &series,
            &path,
        )?;
        plots.push("bits.png".to_string());
        written.push(path);
    }
    let write_text = |name: &str, text: &str| -> Result<PathBuf> {
        let path = root.join(name);
        crate::io::write_atomically(&path, |tmp| {
            std::fs::write(tmp, text).with_context(|| format!("cannot write {}", tmp.display()))
        })?;
        Ok(path)
    };
    written.push(write_text("report.csv", &csv(plan, &rows))?);
    written.push(write_text("report.md", &markdown(plan, &rows, &plots))?);
    Ok(written)
}
