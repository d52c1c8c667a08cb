//! `qcandle inspect`: what rounding each tensor of a trained model to a format would do,
//! without training: the statistics of [`crate::stats::RoundingStats`] per tensor, and its
//! histogram of log2|x| against the format's grid, as text and as a picture.
//!
//! Each float tensor is rounded whole with nearest-even rounding through a quantizer observed
//! by a [`Collector`], the path training uses, so the figures are those `train --stats` would
//! record for the same values.

use std::sync::Arc;

use anyhow::Result;
use candle_core::Tensor;

use super::summary::{grid_of, Placement};
use crate::format::Format;
use crate::ops::{quantize_no_grad, Quant};
use crate::stats::{Collector, RoundingStats};

/// One tensor's rounding to one format.
#[derive(Debug, Clone)]
pub struct Inspected {
    /// The tensor's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// The format.
    pub format: Format,
    /// What rounding did.
    pub stats: RoundingStats,
}

/// Rounds every float tensor of `tensors` to `format` (nearest-even) and records what that
/// did; tensors of other dtypes are left out.
pub fn inspect(tensors: &[(String, Tensor)], format: &Format) -> Result<Vec<Inspected>> {
    let mut rows = Vec::new();
    for (name, t) in tensors {
        if !t.dtype().is_float() {
            continue;
        }
        let collector = Arc::new(Collector::new());
        let q = Quant::new(*format);
        q.tap().attach(Some(collector.clone()));
        collector.set_on(true);
        quantize_no_grad(&t.to_device(&candle_core::Device::Cpu)?, &q)?;
        rows.push(Inspected {
            name: name.clone(),
            shape: t.dims().to_vec(),
            format: *format,
            stats: collector.take().unwrap_or_default(),
        });
    }
    Ok(rows)
}

/// A markdown table of `rows`: per tensor and format, SQNR, relative error and bias, the
/// fractions flushed, at the largest and smallest magnitude and turned NaN/Inf, and where the
/// values lie against the format (below its range, above it, in its densest region).
pub fn table(rows: &[Inspected]) -> String {
    let mut out = String::from(
        "| tensor | shape | format | SQNR (dB) | rel. error | rel. bias | flushed % | at max % \
         | at min % | NaN/Inf % | below range % | above range % | in densest % |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.2}", 100.0 * v));
    let sci = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2e}"));
    for r in rows {
        let s = &r.stats;
        let placement =
            grid_of(&r.format.to_string()).and_then(|g| Placement::of(&s.histogram, &g));
        let shape: Vec<String> = r.shape.iter().map(|d| d.to_string()).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            shape.join("x"),
            r.format,
            s.sqnr_db().map_or("-".into(), |v| format!("{v:.1}")),
            sci(s.relative_error()),
            sci(s.relative_bias()),
            pct(Some(s.fraction(s.flushed))),
            pct(Some(s.fraction(s.at_max))),
            pct(Some(s.fraction(s.at_min))),
            pct(Some(s.fraction(s.became_nonfinite))),
            pct(placement.map(|p| p.below_range)),
            pct(placement.map(|p| p.above_range)),
            pct(placement.map(|p| p.in_densest)),
        ));
    }
    out
}

/// Width of the longest bar of [`histogram_text`].
const BAR: usize = 40;

/// The histogram of one row as text: one line per binade from the lowest nonempty one (or the
/// format's range end) to the highest, with the count, a bar, and where the binade lies
/// against the format (`below range`, `densest`, `above range`; blank inside the range).
pub fn histogram_text(row: &Inspected) -> String {
    let bins = row.stats.histogram.bins();
    let grid = grid_of(&row.format.to_string());
    let mut out = format!(
        "{} ({} values, {} zero) against {}",
        row.name, row.stats.count, row.stats.zero_inputs, row.format
    );
    match &grid {
        Some(g) => out.push_str(&format!(
            ": range 2^{} ({:e}) to 2^{} ({:e}), densest 2^{} to 2^{}\n",
            g.range_binades().0,
            g.min_positive,
            g.range_binades().1,
            g.max_finite,
            g.densest().0,
            g.densest().1 + 1
        )),
        None => out.push_str(": no fixed grid (the scale depends on each block)\n"),
    }
    let Some((&(first, _), &(last, _))) = bins.first().zip(bins.last()) else {
        out.push_str("  (no nonzero finite value)\n");
        return out;
    };
    let most = bins.iter().map(|b| b.1).max().unwrap_or(1);
    out.push_str("  log2|x|      count\n");
    for k in first..=last {
        let c = row.stats.histogram.count(k);
        let bar = "#".repeat((c as f64 / most as f64 * BAR as f64).ceil() as usize);
        let place = grid.as_ref().map_or("", |g| {
            let (lo, hi) = g.range_binades();
            let (dlo, dhi) = g.densest();
            if k < lo {
                "below range"
            } else if k > hi {
                "above range"
            } else if (dlo..=dhi).contains(&k) {
                "densest"
            } else {
                ""
            }
        });
        out.push_str(&format!("  {k:>7} {c:>10} {bar:<BAR$} {place}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_is_inspected_as_training_would_record_it() {
        let t = Tensor::new(
            &[0.1f32, -1.7, 2.6, 300.0, 1e-9, 0.0],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let ints = Tensor::new(&[1u32, 2], &candle_core::Device::Cpu).unwrap();
        let format: Format = "posit<8,0>".parse().unwrap();
        let rows = inspect(&[("w".into(), t), ("labels".into(), ints)], &format).unwrap();
        assert_eq!(rows.len(), 1, "integer tensors are left out");
        let s = &rows[0].stats;
        assert_eq!((s.count, s.at_max, s.at_min, s.zero_inputs), (6, 1, 1, 1));
        let table = table(&rows);
        assert!(table.contains("| w | 6 | posit<8,0> | 2.1 |"), "{table}");
        let text = histogram_text(&rows[0]);
        assert!(text.contains("range 2^-6"), "{text}");
        // 1e-9 lies in binade -30, below the range; 300 in binade 8, above it; 1.7 in the
        // densest binade 0.
        let line = |k: i32| {
            text.lines()
                .find(|l| l.trim_start().starts_with(&format!("{k} ")))
                .unwrap()
                .to_string()
        };
        assert!(line(-30).ends_with("below range"), "{text}");
        assert!(line(8).ends_with("above range"), "{text}");
        assert!(line(0).ends_with("densest"), "{text}");
        assert!(line(-20).contains(" 0 "), "{text}");
    }
}
