//! Formats and rounding modes as the plain C structs of `cuda/quant.cuh` (`QcFormat`,
//! `QcRounding`): what the CUDA kernels and the host build of the header take.

use crate::format::float::{Overflow, Specials};
use crate::format::{Format, Rounding};

/// A format as `QcFormat` of `cuda/quant.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QcFormat {
    /// 0 posit, 1 float, 2 fixed, 3 block, 4 MX, 5 NVFP4, 6 lns.
    pub family: i32,
    /// posit n, float exponent bits, fixed/block word length, MX element
    /// ([`MxElement::code`](crate::format::MxElement::code)), lns width.
    pub a: i32,
    /// posit es, float mantissa bits, fixed fraction length, lns fraction bits of the log.
    pub b: i32,
    /// float: bit 0 subnormals, bit 1 saturate, bits 2-3 specials (0 ieee, 1 fn, 2 fin);
    /// fixed: bit 0 clamp, bit 1 symmetric.
    pub flags: i32,
}

impl QcFormat {
    /// The ints of a validated format (the block's dim is host-side only).
    pub fn new(format: &Format) -> Self {
        match format {
            Format::Posit(p) => QcFormat {
                family: 0,
                a: p.n() as i32,
                b: p.es() as i32,
                flags: 0,
            },
            Format::Float(f) => {
                let specials = match f.specials() {
                    Specials::Ieee => 0,
                    Specials::FiniteNan => 1,
                    Specials::Finite => 2,
                };
                QcFormat {
                    family: 1,
                    a: f.exp() as i32,
                    b: f.man() as i32,
                    flags: f.subnormals() as i32
                        | ((f.overflow() == Overflow::Saturate) as i32) << 1
                        | specials << 2,
                }
            }
            Format::Fixed(f) => QcFormat {
                family: 2,
                a: f.wl() as i32,
                b: f.fl(),
                flags: f.clamp() as i32 | (f.symmetric() as i32) << 1,
            },
            Format::Block(b) => QcFormat {
                family: 3,
                a: b.wl() as i32,
                b: 0,
                flags: 0,
            },
            Format::Lns(l) => QcFormat {
                family: 6,
                a: l.w() as i32,
                b: l.f() as i32,
                flags: 0,
            },
            Format::Mx(m) => QcFormat {
                family: 4,
                a: m.element().code(),
                b: 0,
                flags: 0,
            },
            Format::Nvfp4(_) => QcFormat {
                family: 5,
                a: 0,
                b: 0,
                flags: 0,
            },
        }
    }
}

/// A rounding mode as `QcRounding` of `cuda/quant.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QcRounding {
    /// 0 nearest-even, 1 nearest-away, 2 toward-zero, 3 stochastic.
    pub mode: i32,
    /// Random bits of stochastic rounding (0 otherwise).
    pub bits: i32,
}

impl QcRounding {
    /// The ints of a rounding mode.
    pub fn new(rounding: Rounding) -> Self {
        match rounding {
            Rounding::NearestEven => QcRounding { mode: 0, bits: 0 },
            Rounding::NearestAway => QcRounding { mode: 1, bits: 0 },
            Rounding::TowardZero => QcRounding { mode: 2, bits: 0 },
            Rounding::Stochastic { bits } => QcRounding {
                mode: 3,
                bits: bits as i32,
            },
        }
    }
}
