//! Error types: invalid format parameters and malformed format or rounding strings.

use thiserror::Error;

/// An invalid number format, rounding mode, or a string that names neither.
///
/// Every message names the offending parameter and its valid range, so a
/// configuration typo is found from the error alone.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    /// A numeric parameter is outside its valid range.
    #[error("{format}: parameter `{param}` = {value} is out of range (valid: {valid})")]
    OutOfRange {
        /// The format family (`posit`, `float`, ...).
        format: &'static str,
        /// The parameter's name.
        param: &'static str,
        /// The value that was given.
        value: i64,
        /// The valid range, in words.
        valid: &'static str,
    },
    /// A combination of options that the format cannot represent.
    #[error("{format}: {reason}")]
    Inconsistent {
        /// The format family.
        format: &'static str,
        /// Why the combination is invalid.
        reason: String,
    },
    /// A string that is not a format or rounding name.
    #[error("cannot parse {what} from {input:?}: {reason}")]
    Parse {
        /// What was being parsed (`format` or `rounding`).
        what: &'static str,
        /// The input string.
        input: String,
        /// What was expected.
        reason: String,
    },
}

impl From<FormatError> for candle_core::Error {
    fn from(e: FormatError) -> Self {
        candle_core::Error::Msg(e.to_string())
    }
}
