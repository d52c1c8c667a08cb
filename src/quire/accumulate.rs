//! The `accumulate` setting of a layer: how the multiply-adds of its GEMMs are computed.
//!
//! A layer (`QLinear`, `QConv2d`) runs three GEMMs, each in one format `F`, the format of
//! the number category its result belongs to:
//!
//! | GEMM | result | `F` |
//! |---|---|---|
//! | forward `Y = X·Wᵀ + b` (convolutions: `W·cols + b`) | layer output | `activation` |
//! | input gradient `dX = dY·W` (convolutions: the transposed convolution) | error | `error` |
//! | weight gradient `dW = dYᵀ·X`, bias gradient `db = Σ dY` | parameter gradient | `gradient` |
//!
//! The operands of a GEMM are first rounded to `F` (nearest even), as an arithmetic unit in
//! `F` converts what it is given; in a config that uses one format for these categories
//! (the posit and LNS training setups) they already lie on `F` and this changes nothing,
//! except for the first layer's input data. Then, for every output, with `k` the summation
//! index:
//!
//! | setting | rule |
//! |---|---|
//! | `f32` | the default: candle's f32 GEMM (no operand rounding); the layer's quantizers round its output and error as before. |
//! | `quire` | `F` a posit: every product and the bias summed exactly in a quire, one rounding to `F` per output. |
//! | `naive` | `s = 0; s = F(s + F(a_k b_k))` for `k` ascending; `s = F(s + bias)`. Any elementwise format but LNS. |
//! | `naive:<A>` | `p = F(a_k b_k)`, `s = A(s + p)`, `k` ascending from `s = 0`; `s = A(s + bias)`; output `F(s)`. |
//! | `fma:<A>` | `s = A(s + a_k b_k)` with one rounding per multiply-add, `k` ascending from `s = 0`; `s = A(s + bias)`; output `F(s)`. |
//! | `lns:<impl>` | `F` an lns format: exact products, every sum by Gaussian logarithms (`ideal`, `truncated`, `table`), `k` ascending from zero, bias added last. |
//!
//! Every rounding is to nearest, ties to even (the category's own rounding mode, stochastic
//! included, is applied afterwards by the layer's quantizers, which leave values on the grid
//! unchanged). The bias is one more term: inside the quire, the last rounded add otherwise.
//! The bias gradient is the sum of `dY` over the batch (and pixels), a GEMM with a column of
//! ones under the same rule.
//!
//! A setting that cannot apply is an error when the layer is built: `quire` with a format
//! that is not a posit, `naive` on block formats (they round blocks, not single
//! operations) or on LNS (whose arithmetic is `lns:<impl>`), `lns:` on a format that is not
//! lns, and any setting other than `f32` in a layer without an `activation`, `error` or
//! `gradient` format.

use std::fmt;
use std::str::FromStr;

use crate::format::Format;
use crate::lns::GaussLog;

/// How the Gaussian logarithms of an `lns:<impl>` setting are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LnsSum {
    /// `lns:ideal`: correctly rounded sums ([`GaussLog::Ideal`]).
    Ideal,
    /// `lns:truncated`: sums truncated in the logarithm ([`GaussLog::Truncated`]).
    Truncated,
    /// `lns:table` (`None`: xlns's defaults, `grid_bits = (f - 5) / 2` and no guard bits)
    /// or `lns:table:<grid_bits>:<guard_bits>` ([`GaussLog::Table`]).
    Table(Option<(u32, u32)>),
}

impl LnsSum {
    /// The Gaussian-log implementation for a format with `f` fraction bits.
    pub fn gauss_log(self, f: u32) -> GaussLog {
        match self {
            LnsSum::Ideal => GaussLog::Ideal,
            LnsSum::Truncated => GaussLog::Truncated,
            LnsSum::Table(bits) => {
                let (grid_bits, guard_bits) = bits.unwrap_or((f.saturating_sub(5) / 2, 0));
                GaussLog::Table {
                    grid_bits,
                    guard_bits,
                }
            }
        }
    }
}

/// The `accumulate` setting of a layer (see the module docs for each rule).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Accumulate {
    /// `f32`: candle's f32 GEMMs, the layer as without the setting.
    #[default]
    F32,
    /// `quire`: exact sums of posit products, one rounding per output.
    Quire,
    /// `naive`: every product and every partial sum rounded to the GEMM's format.
    Naive,
    /// `naive:<format>`: products rounded to the GEMM's format, sums to this format
    /// (`fp32` names IEEE binary32, `float<8,23>`).
    NaiveSum(Format),
    /// `fma:<format>`: one rounding per multiply-add, into this format.
    Fma(Format),
    /// `lns:<impl>`: LNS arithmetic (exact products, Gaussian-log sums).
    Lns(LnsSum),
}

impl Accumulate {
    /// Every setting's spelling, for error messages.
    pub const SPELLINGS: &'static str =
        "f32, quire, naive, naive:<format>, fma:<format>, lns:ideal, lns:truncated, lns:table or lns:table:<grid_bits>:<guard_bits>";

    /// Whether this is the default f32 GEMM.
    pub fn is_f32(&self) -> bool {
        *self == Accumulate::F32
    }
}

/// A setting that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("accumulate `{input}`: {reason}")]
pub struct AccumulateError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Accumulate {
    type Err = AccumulateError;

    fn from_str(s: &str) -> Result<Self, AccumulateError> {
        let err = |reason: String| AccumulateError {
            input: s.to_string(),
            reason,
        };
        let format = |f: &str, what: &str| {
            if f.is_empty() {
                return Err(err(format!(
                    "`{what}:` needs a format, as in `{what}:fp16`"
                )));
            }
            if f == "fp32" {
                // IEEE binary32, the accumulator of most hardware; no format preset has the name.
                return Format::float(8, 23).map_err(|e| err(e.to_string()));
            }
            Format::from_str(f).map_err(|e| err(format!("{what}:<format>: {e}")))
        };
        let (head, rest) = match s.split_once(':') {
            Some((h, r)) => (h, Some(r)),
            None => (s, None),
        };
        match (head, rest) {
            ("f32", None) => Ok(Accumulate::F32),
            ("quire", None) => Ok(Accumulate::Quire),
            ("naive", None) => Ok(Accumulate::Naive),
            ("naive", Some(f)) => Ok(Accumulate::NaiveSum(format(f, "naive")?)),
            ("fma", Some(f)) => Ok(Accumulate::Fma(format(f, "fma")?)),
            ("fma", None) => Err(err(
                "`fma` needs an accumulator format, as in `fma:fp32`".into()
            )),
            ("lns", Some(imp)) => parse_lns(imp).map(Accumulate::Lns).map_err(err),
            ("lns", None) => Err(err(
                "`lns` needs an implementation: lns:ideal, lns:truncated or lns:table".into(),
            )),
            _ => Err(err(format!("expected one of {}", Accumulate::SPELLINGS))),
        }
    }
}

fn parse_lns(imp: &str) -> Result<LnsSum, String> {
    let parts: Vec<&str> = imp.split(':').collect();
    let number = |p: &str, what: &str| {
        p.parse::<u32>().map_err(|_| {
            format!("lns:table:<grid_bits>:<guard_bits>: {what} `{p}` is not an integer >= 0")
        })
    };
    match parts.as_slice() {
        ["ideal"] => Ok(LnsSum::Ideal),
        ["truncated"] => Ok(LnsSum::Truncated),
        ["table"] => Ok(LnsSum::Table(None)),
        ["table", grid, guard] => Ok(LnsSum::Table(Some((
            number(grid, "grid_bits")?,
            number(guard, "guard_bits")?,
        )))),
        _ => Err(format!(
            "unknown LNS adder `{imp}`; expected ideal, truncated, table or table:<grid_bits>:<guard_bits>"
        )),
    }
}

impl fmt::Display for Accumulate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Accumulate::F32 => f.write_str("f32"),
            Accumulate::Quire => f.write_str("quire"),
            Accumulate::Naive => f.write_str("naive"),
            Accumulate::NaiveSum(a) => write!(f, "naive:{a}"),
            Accumulate::Fma(a) => write!(f, "fma:{a}"),
            Accumulate::Lns(LnsSum::Ideal) => f.write_str("lns:ideal"),
            Accumulate::Lns(LnsSum::Truncated) => f.write_str("lns:truncated"),
            Accumulate::Lns(LnsSum::Table(None)) => f.write_str("lns:table"),
            Accumulate::Lns(LnsSum::Table(Some((grid, guard)))) => {
                write!(f, "lns:table:{grid}:{guard}")
            }
        }
    }
}
