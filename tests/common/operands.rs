//! Operands for the accumulation tests: values of a format over its whole range, formats by
//! the short names the tests use, and nearest-even rounding.

use qcandle::format::rounding::Rounding;
use qcandle::Format;

use crate::common::SplitMix;

/// A format by name, with `fp32` for IEEE binary32 (`float<8,23>`).
#[allow(dead_code)] // each test file uses part of it
pub fn fmt(s: &str) -> Format {
    match s {
        "fp32" => Format::float(8, 23).expect("binary32"),
        _ => s.parse().expect("a format"),
    }
}

/// `x` rounded to `f`, nearest even.
pub fn round(f: &Format, x: f64) -> f64 {
    f.round(x, Rounding::NearestEven, 0)
}

/// Values of `format` over its range: random magnitudes around 1, values near the smallest
/// and largest magnitudes, zeros, and both signs.
#[allow(dead_code)] // each test file uses part of it
pub fn values(format: &Format, count: usize, seed: u64) -> Vec<f64> {
    let max = format.max_finite().unwrap();
    let min = format.min_positive().unwrap();
    let mut rng = SplitMix(seed);
    (0..count)
        .map(|i| {
            let state = rng.next_u64();
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let v = match i % 11 {
                0 => max * u,
                1 => min * (1.0 + 3.0 * u),
                2 => 0.0,
                3 => max,
                4 => min,
                _ => (2.0 * u - 1.0) * 4.0f64.powf(6.0 * u - 3.0),
            };
            let v = if state >> 63 == 1 { -v } else { v };
            round(format, v)
        })
        .collect()
}
