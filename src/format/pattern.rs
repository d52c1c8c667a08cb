//! Bit patterns of the formats that have them: posits, floats and lns, whose every value is
//! one pattern of [`Format::bits`] bits. Fixed point and block formats have no patterns here
//! (their values are kept as floats), so encoding or decoding them is an error.
//!
//! Packing tensors ([`crate::ops::pack`]) and the operation tables of the naive posit GEMM
//! ([`crate::quire::gemm_cpu::OpTables`]) both read and write patterns through these two
//! functions.

use super::Format;
use crate::error::FormatError;

impl Format {
    /// The bit pattern of `x` rounded to the format (nearest, ties to even): posits give NaR
    /// for NaN and ±Inf; floats fail for NaN when they have no NaN pattern; lns gives its NaN
    /// pattern for NaN and ±max for ±Inf. Fixed point and
    /// block formats have no patterns: an error.
    pub fn encode(&self, x: f64) -> Result<u32, FormatError> {
        match self {
            Format::Posit(p) => Ok(p.encode(x)),
            Format::Float(f) => f.encode(x),
            Format::Lns(l) => Ok(l.encode(x)),
            Format::Fixed(_) | Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => {
                Err(self.no_patterns())
            }
        }
    }

    /// The value of a pattern of [`Format::bits`] bits: posits, floats and lns. Fixed point and
    /// block formats have no patterns: an error.
    pub fn decode(&self, pattern: u32) -> Result<f64, FormatError> {
        match self {
            Format::Posit(p) => Ok(p.decode(pattern)),
            Format::Float(f) => Ok(f.decode(pattern)),
            Format::Lns(l) => Ok(l.decode(pattern)),
            Format::Fixed(_) | Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => {
                Err(self.no_patterns())
            }
        }
    }

    fn no_patterns(&self) -> FormatError {
        FormatError::Inconsistent {
            format: match self {
                Format::Fixed(_) => "fixed",
                Format::Mx(_) => "mx",
                Format::Nvfp4(_) => "nvfp4",
                _ => "block",
            },
            reason: format!("{self} has no bit patterns (its values are kept as floats)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_round_trip_and_fixed_point_has_none() {
        for name in [
            "posit<8,0>",
            "posit16",
            "e4m3",
            "e2m1",
            "fp16",
            "lns<8,3>",
            "lns<12,0>",
        ] {
            let f: Format = name.parse().unwrap();
            for p in 0..(1u32 << f.bits().min(12)) {
                let v = f.decode(p).unwrap();
                if !v.is_nan() {
                    assert_eq!(
                        f.decode(f.encode(v).unwrap()).unwrap().to_bits(),
                        v.to_bits(),
                        "{name} {p:#x}"
                    );
                }
            }
        }
        let fixed: Format = "fixed<8,4>".parse().unwrap();
        assert!(fixed
            .encode(1.0)
            .unwrap_err()
            .to_string()
            .contains("fixed<8,4>"));
        assert!("block<8>".parse::<Format>().unwrap().decode(0).is_err());
    }
}
