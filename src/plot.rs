//! Training-curve plots as PNG images.
//!
//! [`training_curves`] draws one picture with two panels side by side: the training loss per
//! epoch on the left and the test top-1 accuracy per epoch on the right, one line per
//! [`Series`] with a legend. One series per panel plots a single run; several plot a
//! comparison of runs or number formats.
//!
//! Rendering is pure Rust: [`plotters`]' bitmap backend with an embedded DejaVu Sans font
//! drawn through `ab_glyph`, so no system font library is needed. The file is written
//! atomically (see [`crate::io::write_atomically`]).

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;

/// Width of the picture [`training_curves`] writes, in pixels.
pub const WIDTH: u32 = 1200;
/// Height of the picture [`training_curves`] writes, in pixels.
pub const HEIGHT: u32 = 500;

/// The font all text is drawn with (DejaVu Sans; see `assets/README.md` for its license).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Line colours, one per series in turn (the "tab10" palette, which stays distinguishable
/// for the common kinds of colour blindness better than pure primaries).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Series with at most this many points get a marker on every point (so that a short run,
/// or a single epoch, is visible and its epochs can be counted).
const MARKERS_UP_TO: usize = 40;

/// One curve: a label for the legend and its `(epoch, value)` points, in drawing order.
///
/// Points whose coordinates are not finite (NaN, infinity) are skipped and break the line
/// there, so a diverged run shows where it stopped being plottable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Legend text; an empty label leaves the series out of the legend.
    pub label: String,
    /// `(x, y)` points: x is the epoch, y the value.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series from a label and its `(epoch, value)` points.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            label: label.into(),
            points,
        }
    }
}

/// Writes a PNG of [`WIDTH`] x [`HEIGHT`] pixels to `path`: `title` across the top, "train
/// loss" against epoch on the left (one line per series in `loss`) and "test top-1 accuracy
/// (%)" against epoch on the right (one line per series in `accuracy`), each with a legend.
///
/// Axis ranges come from the finite points with a small margin; a panel with no finite
/// point, a single point, or all-equal values still gets a usable range. The file is written
/// to a temporary file in the same directory and renamed into place, so `path` is either the
/// complete picture or untouched. Missing parent directories are created, as for the other
/// outputs of this crate (see [`crate::io::write_atomically`]).
///
/// # Errors
/// When the directory cannot be created, or the picture cannot be drawn or written.
pub fn training_curves(
    title: &str,
    loss: &[Series],
    accuracy: &[Series],
    path: &Path,
) -> Result<()> {
    register_font()?;
    crate::io::write_atomically(path, |tmp| {
        render(title, loss, accuracy, tmp)
            .with_context(|| format!("cannot draw the training curves into {}", path.display()))
    })
}

/// Registers the embedded font as plotters' "sans-serif" family (the family its default
/// text styles use), once per process.
pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded font cannot be loaded"))
    }
}

/// Draws the picture into `file` (whose extension must be `.png`).
fn render(title: &str, loss: &[Series], accuracy: &[Series], file: &Path) -> Result<()> {
    let root = BitMapBackend::new(file, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let body = if title.is_empty() {
        root.clone()
    } else {
        root.titled(title, ("sans-serif", 22))?
    };
    let (left, right) = body.split_horizontally(WIDTH / 2);
    panel(
        &left,
        "train loss",
        ("epoch", "loss"),
        loss,
        SeriesLabelPosition::UpperRight,
    )?;
    panel(
        &right,
        "test top-1 accuracy (%)",
        ("epoch", "accuracy (%)"),
        accuracy,
        SeriesLabelPosition::LowerRight,
    )?;
    root.present()?;
    Ok(())
}

/// Draws one panel: axes from the data, one line per series, and a legend at `legend`.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    legend: SeriesLabelPosition,
) -> Result<()> {
    let finite = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| x.is_finite() && y.is_finite())
    };
    let x = axis_range(finite().map(|p| p.0), Some(0.5));
    let y = axis_range(finite().map(|p| p.1), None);

    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .x_label_formatter(&|x| {
            if x.fract() == 0.0 {
                format!("{x:.0}")
            } else {
                format!("{x}")
            }
        })
        .y_desc(y_desc)
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;

    let mut labelled = false;
    for (i, s) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let style = colour.stroke_width(2);
        let segments = finite_segments(&s.points);
        // One (possibly empty) series carries the legend entry, so a run without a single
        // finite value is still named in the legend.
        let mut first = true;
        for segment in segments
            .iter()
            .map(Vec::as_slice)
            .chain(std::iter::once(&[][..]).filter(|_| segments.is_empty()))
        {
            let drawn = chart.draw_series(LineSeries::new(segment.iter().copied(), style))?;
            if first && !s.label.is_empty() {
                drawn.label(s.label.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
                labelled = true;
            }
            first = false;
        }
        if s.points.len() <= MARKERS_UP_TO {
            chart.draw_series(
                segments
                    .iter()
                    .flatten()
                    .map(|&p| Circle::new(p, 3, colour.filled())),
            )?;
        }
    }
    if labelled {
        chart
            .configure_series_labels()
            .position(legend)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
    }
    Ok(())
}

/// The runs of consecutive finite points of `points` (non-finite points split the line).
fn finite_segments(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    points
        .split(|&(x, y)| !(x.is_finite() && y.is_finite()))
        .filter(|run| !run.is_empty())
        .map(<[_]>::to_vec)
        .collect()
}

/// A plotting range covering `values` (all finite) with a 5% margin on each side; `0..1`
/// for no values. When all are equal the range is the value +- `flat_pad`, or +- 10% of it
/// (+- 0.5 around zero) without one.
fn axis_range(values: impl Iterator<Item = f64>, flat_pad: Option<f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return 0.0..1.0;
    }
    let span = hi - lo;
    let pad = if span > 0.0 && span.is_finite() {
        span * 0.05
    } else if let Some(pad) = flat_pad {
        pad
    } else if lo != 0.0 {
        lo.abs() * 0.1
    } else {
        0.5
    };
    // Clamped, as the margin can overflow near the ends of f64.
    let (a, b) = ((lo - pad).max(f64::MIN), (hi + pad).min(f64::MAX));
    if a < b {
        a..b
    } else {
        // The margin vanished (too small for the values' magnitude, or subnormal).
        let pad = lo.abs().max(1.0) * 0.1;
        (lo - pad).max(f64::MIN)..(hi + pad).min(f64::MAX)
    }
}

/// Width and height of the pictures [`heatmap`] and [`lines`] write, in pixels.
pub const SQUARE: (u32, u32) = (900, 650);

/// A table of values to draw as a heatmap: one row per `rows` label, one column per
/// `columns` label; `None` leaves a cell blank.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// The title across the top.
    pub title: String,
    /// What the rows are (the y axis's description).
    pub row_desc: String,
    /// What the columns are (the x axis's description).
    pub column_desc: String,
    /// Row labels, top to bottom.
    pub rows: Vec<String>,
    /// Column labels, left to right.
    pub columns: Vec<String>,
    /// `values[r][c]`: the cell of row `r` and column `c`.
    pub values: Vec<Vec<Option<f64>>>,
}

/// Writes `grid` as a heatmap PNG of [`SQUARE`] pixels to `path` (atomically): each cell
/// coloured from light (the smallest finite value) to dark (the largest) and labelled with
/// its value to one decimal; blank and non-finite cells are grey and unlabelled.
///
/// # Errors
/// When `values` does not have one entry per row and column, or the picture cannot be
/// drawn or written.
pub fn heatmap(grid: &Grid, path: &Path) -> Result<()> {
    let shape_ok = grid.values.len() == grid.rows.len()
        && grid.values.iter().all(|r| r.len() == grid.columns.len());
    if !shape_ok || grid.rows.is_empty() || grid.columns.is_empty() {
        return Err(anyhow!(
            "a heatmap needs one value per row and column ({} rows, {} columns)",
            grid.rows.len(),
            grid.columns.len()
        ));
    }
    register_font()?;
    crate::io::write_atomically(path, |tmp| {
        render_heatmap(grid, tmp)
            .with_context(|| format!("cannot draw the heatmap into {}", path.display()))
    })
}

fn render_heatmap(grid: &Grid, file: &Path) -> Result<()> {
    use plotters::coord::ranged1d::SegmentValue;
    let root = BitMapBackend::new(file, SQUARE).into_drawing_area();
    root.fill(&WHITE)?;
    let (ncols, nrows) = (grid.columns.len() as i32, grid.rows.len() as i32);
    let mut chart = ChartBuilder::on(&root)
        .caption(&grid.title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(110)
        // Integer ranges are inclusive: `0..n - 1` holds the n cells.
        .build_cartesian_2d(
            (0..ncols - 1).into_segmented(),
            (0..nrows - 1).into_segmented(),
        )?;
    // Row 0 is drawn at the top: the y coordinate of row r is nrows - 1 - r.
    let label = |labels: &[String], v: &SegmentValue<i32>, flip: bool| match v {
        SegmentValue::CenterOf(i) => {
            let i = if flip { nrows - 1 - i } else { *i };
            usize::try_from(i)
                .ok()
                .and_then(|i| labels.get(i))
                .cloned()
                .unwrap_or_default()
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(grid.columns.len())
        .y_labels(grid.rows.len())
        .x_label_formatter(&|v| label(&grid.columns, v, false))
        .y_label_formatter(&|v| label(&grid.rows, v, true))
        .x_desc(grid.column_desc.as_str())
        .y_desc(grid.row_desc.as_str())
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    let finite = || {
        grid.values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
    };
    let lo = finite().fold(f64::INFINITY, f64::min);
    let hi = finite().fold(f64::NEG_INFINITY, f64::max);
    let edge = |i: i32, n: i32| {
        if i < n {
            SegmentValue::Exact(i)
        } else {
            SegmentValue::Last
        }
    };
    for (r, row) in grid.values.iter().enumerate() {
        let y = nrows - 1 - r as i32;
        for (c, value) in row.iter().enumerate() {
            let x = c as i32;
            let corners = [
                (edge(x, ncols), edge(y, nrows)),
                (edge(x + 1, ncols), edge(y + 1, nrows)),
            ];
            let Some(v) = value.filter(|v| v.is_finite()) else {
                chart.draw_series(std::iter::once(Rectangle::new(
                    corners,
                    RGBColor(220, 220, 220).filled(),
                )))?;
                continue;
            };
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 1.0 };
            let colour = shade(t);
            chart.draw_series(std::iter::once(Rectangle::new(corners, colour.filled())))?;
            let ink = if t > 0.55 { WHITE } else { BLACK };
            let style = ("sans-serif", 15).into_font().color(&ink).pos(
                plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Center,
                    plotters::style::text_anchor::VPos::Center,
                ),
            );
            chart.draw_series(std::iter::once(Text::new(
                format!("{v:.1}"),
                (SegmentValue::CenterOf(x), SegmentValue::CenterOf(y)),
                style,
            )))?;
        }
    }
    root.present()?;
    Ok(())
}

/// A colour from light yellow (`t` = 0) to dark blue (`t` = 1).
fn shade(t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * t).round() as u8;
    RGBColor(mix(255, 8), mix(247, 48), mix(188, 107))
}

/// Writes a PNG of [`SQUARE`] pixels to `path` (atomically): `y_desc` against `x_desc`, one
/// line with a marker on every point per series, with a legend.
///
/// # Errors
/// When the picture cannot be drawn or written.
pub fn lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    path: &Path,
) -> Result<()> {
    register_font()?;
    crate::io::write_atomically(path, |tmp| {
        let root = BitMapBackend::new(tmp, SQUARE).into_drawing_area();
        root.fill(&WHITE)?;
        let body = if title.is_empty() {
            root.clone()
        } else {
            root.titled(title, ("sans-serif", 20))?
        };
        let legend = SeriesLabelPosition::LowerRight;
        panel(&body, "", (x_desc, y_desc), series, legend)?;
        root.present()?;
        Ok(())
    })
    .with_context(|| format!("cannot draw {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_range_covers_the_values_with_a_margin() {
        let r = axis_range([1.0, 3.0].into_iter(), None);
        assert!(r.start < 1.0 && r.end > 3.0 && r.end - r.start < 2.5);
    }

    #[test]
    fn axis_range_is_nonempty_for_no_one_or_equal_values() {
        for values in [
            vec![],
            vec![0.0],
            vec![2.5, 2.5],
            vec![-1e-9],
            vec![f64::MAX],
        ] {
            for flat_pad in [None, Some(0.5)] {
                let r = axis_range(values.iter().copied(), flat_pad);
                assert!(r.start < r.end, "{values:?} gave {r:?}");
                assert!(
                    r.start.is_finite() && r.end.is_finite(),
                    "{values:?} gave {r:?}"
                );
                for &v in &values {
                    assert!(r.start <= v && v <= r.end, "{v} outside {r:?}");
                }
            }
        }
    }

    #[test]
    fn non_finite_points_split_a_series_into_segments() {
        let nan = f64::NAN;
        let pts = [
            (0.0, 1.0),
            (1.0, nan),
            (2.0, 2.0),
            (3.0, 3.0),
            (f64::INFINITY, 1.0),
        ];
        assert_eq!(
            finite_segments(&pts),
            vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]
        );
        assert!(finite_segments(&[(nan, nan)]).is_empty());
    }
}
