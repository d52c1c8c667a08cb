//! Human-readable reports: the table of formats and rounding-error statistics.

use candle_core::{Device, Result, Tensor};

use crate::format::Format;
use crate::ops::{quantize, Quant};
use crate::philox::Stream;
use crate::Rounding;

/// One line of `qcandle formats`.
#[derive(Debug, Clone)]
pub struct FormatRow {
    /// Preset name.
    pub name: &'static str,
    /// What the preset is.
    pub description: &'static str,
    /// The format.
    pub format: Format,
}

/// Formats that are not presets but worth a row: the posits used before the 2022 Posit
/// Standard fixed es = 2, and one example of each other family.
const OTHER_FORMATS: [(&str, &str); 5] = [
    (
        "posit<8,0>",
        "8-bit posit with es = 0 (before the 2022 standard)",
    ),
    (
        "posit<16,1>",
        "16-bit posit with es = 1 (before the 2022 standard)",
    ),
    ("fixed<8,4>", "example of the family"),
    ("block<8>", "example of the family"),
    (
        "lns<8,3>",
        "example of the family (logarithmic, base 2^(1/8))",
    ),
];

/// The table of every preset and of a few formats that are not (posits with the es of
/// before the 2022 standard, an example of each other family): name, the format as it
/// displays (and parses back), bits, range and epsilon.
pub fn formats_table() -> String {
    let mut out = format!(
        "{:<12} {:<20} {:>4} {:>12} {:>12} {:>10}  {}\n",
        "name", "format", "bits", "max", "min>0", "eps(1)", "description"
    );
    let others = OTHER_FORMATS.map(|(spelling, description)| {
        let format: Format = spelling.parse().expect("the other formats parse");
        ("-", description, format)
    });
    for (name, description, format) in Format::presets().into_iter().chain(others) {
        out.push_str(&format_row(name, &format, description));
    }
    out
}

/// One row of [`formats_table`].
fn format_row(name: &str, format: &Format, description: &str) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4e}"));
    format!(
        "{:<12} {:<20} {:>4} {:>12} {:>12} {:>10.3e}  {}\n",
        name,
        format.to_string(),
        format.bits(),
        opt(format.max_finite()),
        opt(format.min_positive()),
        format.epsilon(),
        description
    )
}

/// Rounding error of `y = q(x)` against `x`, over the finite elements of `x`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    /// Normwise relative error `||y - x||_2 / ||x||_2`.
    pub relative_rms: f64,
    /// Bias: `sum(y - x) / sum|x|` (0 for unbiased rounding of symmetric data).
    pub bias: f64,
    /// Fraction of elements left unchanged.
    pub exact: f64,
    /// Fraction of nonzero elements that became zero, Inf or NaN.
    pub lost: f64,
}

/// Compares `x` with its rounded version `y` element by element.
pub fn error_stats(x: &[f32], y: &[f32]) -> ErrorStats {
    let (mut err2, mut norm2, mut diff, mut abs) = (0.0, 0.0, 0.0, 0.0);
    let (mut exact, mut lost, mut n) = (0usize, 0usize, 0usize);
    for (&a, &b) in x.iter().zip(y) {
        if !a.is_finite() {
            continue;
        }
        n += 1;
        if a == b {
            exact += 1;
        }
        if a != 0.0 && (!b.is_finite() || b == 0.0) {
            lost += 1;
        }
        if b.is_finite() {
            let d = b as f64 - a as f64;
            err2 += d * d;
            diff += d;
        }
        norm2 += (a as f64) * (a as f64);
        abs += (a as f64).abs();
    }
    let n = n.max(1) as f64;
    ErrorStats {
        relative_rms: (err2 / norm2).sqrt(),
        bias: diff / abs,
        exact: exact as f64 / n,
        lost: lost as f64 / n,
    }
}

/// `n` standard-normal samples (Box-Muller over the Philox stream of `seed`).
pub fn normal_samples(n: usize, seed: u64) -> Vec<f32> {
    let stream = Stream::new(seed, u64::MAX);
    (0..n)
        .map(|i| {
            let w = stream.block(i as u64);
            let u1 = ((w[0] as f64) + 1.0) / 4294967297.0;
            let u2 = (w[1] as f64) / 4294967296.0;
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

/// The `demo` report: a normal sample (mean 0, std 1) rounded to every preset, to the other
/// formats of [`formats_table`] and to `block<4>` with nearest-even and stochastic rounding.
pub fn demo_report(n: usize, seed: u64) -> Result<String> {
    let x = normal_samples(n, seed);
    let t = Tensor::from_slice(&x, n, &Device::Cpu)?;
    let mut names: Vec<String> = Format::presets().iter().map(|p| p.0.to_string()).collect();
    names.extend(OTHER_FORMATS.map(|(spelling, _)| spelling.to_string()));
    names.push("block<4>".to_string());
    let mut out = format!(
        "{n} samples of N(0, 1), seed {seed}: relative error of each format\n\n\
         | format | rounding | rel. error (2-norm) | bias | exact | lost (0/Inf/NaN) |\n\
         |---|---|---|---|---|---|\n"
    );
    for name in names {
        let format: Format = name.parse()?;
        for rounding in [Rounding::NearestEven, Rounding::Stochastic { bits: 23 }] {
            let q = Quant::new(format).with_rounding(rounding).with_seed(seed);
            let y = quantize(&t, &q)?.to_vec1::<f32>()?;
            let s = error_stats(&x, &y);
            out.push_str(&format!(
                "| {name} | {rounding} | {:.3e} | {:+.2e} | {:.2}% | {:.3}% |\n",
                s.relative_rms,
                s.bias,
                100.0 * s.exact,
                100.0 * s.lost
            ));
        }
    }
    Ok(out)
}
