//! What one `--format` of post-training quantization asks for: a number format and,
//! optionally, the accumulate settings of its rows.
//!
//! `FORMAT` alone gives the format's default rows (see [`super::methods`]); `FORMAT SETTING
//! ...` (space-separated, each an `accumulate` setting of [`crate::quire::accumulate`]) gives
//! exactly one row per setting, in the order given, so that a row's name in the table (`e4m3
//! naive:fp16`) is also the spec that asks for it:
//!
//! ```text
//! posit<8,0>                          naive and quire rows
//! posit<8,0> naive quire naive:fp16   the same and products in posit<8,0>, sums in fp16
//! e4m3 naive:fp32 fma:fp32            two rows with fp32 accumulators
//! lns<12,6> lns:ideal lns:table       LNS sums, correctly rounded and by table
//! ```
//!
//! Whether each setting applies to the format is checked with the other formats
//! ([`super::check_formats`]), before anything is evaluated.

use std::fmt;
use std::str::FromStr;

use anyhow::{anyhow, bail};

use crate::format::Format;
use crate::quire::Accumulate;

/// A format and the accumulate settings of its rows (empty: the format's default rows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatRows {
    /// The number format of the weights and activations.
    pub format: Format,
    /// The rows' accumulate settings, in order; empty for the default rows.
    pub settings: Vec<Accumulate>,
}

impl From<Format> for FormatRows {
    fn from(format: Format) -> Self {
        FormatRows {
            format,
            settings: Vec::new(),
        }
    }
}

impl FromStr for FormatRows {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let mut words = s.split_whitespace();
        let first = words
            .next()
            .ok_or_else(|| anyhow!("an empty format: expected `FORMAT [SETTING ...]`"))?;
        let format: Format = first.parse().map_err(|e| anyhow!("`{first}`: {e}"))?;
        let mut settings = Vec::new();
        for word in words {
            let setting: Accumulate = word.parse().map_err(|e| {
                anyhow!(
                    "`{s}`: {e} (a format may be followed by accumulate settings, separated by spaces)"
                )
            })?;
            if settings.contains(&setting) {
                bail!("`{s}`: the row `{format} {setting}` is asked for twice");
            }
            settings.push(setting);
        }
        Ok(FormatRows { format, settings })
    }
}

impl fmt::Display for FormatRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.format)?;
        for s in &self.settings {
            write!(f, " {}", setting_name(s))?;
        }
        Ok(())
    }
}

/// `setting` as a row's name gives it: its own text, except that an accumulator in IEEE
/// binary32 (`float<8,23>`) is written `fp32`, as it is asked for.
pub fn setting_name(setting: &Accumulate) -> String {
    let fp32 = Format::float(8, 23).ok();
    match setting {
        Accumulate::NaiveSum(a) if Some(*a) == fp32 => "naive:fp32".to_string(),
        Accumulate::Fma(a) if Some(*a) == fp32 => "fma:fp32".to_string(),
        other => other.to_string(),
    }
}
