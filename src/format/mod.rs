//! Number formats: what values exist, and how an f64 is rounded to one of them.
//!
//! Each family lives in its own file with pure scalar functions ([`Posit`], [`Float`],
//! [`Fixed`], [`Block`], [`Lns`]); they share the integer rounding step in [`grid`] and the rounding
//! modes in [`rounding`]. No tensors here: the CPU kernels, the CUDA header
//! `cuda/quant.cuh` and the tests all call or mirror these functions.
//!
//! A [`Format`] is validated when it is built and prints as a string that parses back to
//! the same format: `posit<8,0>`, `float<5,2>`, `float<4,3,fn,sat>`, `fixed<8,4>`,
//! `block<8>`, `block<8,dim=0>`, `lns<8,3>`, or a preset name (`fp16`, `bf16`, `tf32`, `e5m2`, `e4m3`,
//! `e3m2`, `e2m3`, `e2m1`, `posit8`, `posit16`, `posit32`). Float presets display as their
//! names. The posit presets follow the 2022 Posit Standard (es = 2 at every width:
//! `posit8` is `posit<8,2>`); other posits, such as the older `posit<8,0>` and
//! `posit<16,1>`, are spelled out.
//!
//! Block-scaled formats: the OCP MX formats [`Mx`] (`mxfp8_e4m3`, `mxfp8_e5m2`,
//! `mxfp6_e3m2`, `mxfp6_e2m3`, `mxfp4_e2m1`, `mxint8`: 32-element blocks with an E8M0
//! scale) and [`Nvfp4`] (`nvfp4`: 16-element E2M1 blocks with an E4M3 scale and an f32
//! tensor scale), blocks along the last axis or, as `mxfp8_e4m3<dim=0>` and
//! `nvfp4<dim=0>`, along another. Their math is in [`mx`] and [`nvfp4`].

pub mod block;
pub mod fixed;
pub mod float;
pub mod grid;
pub mod lns;
pub(crate) mod lns_approx;
mod lns_exact;
pub(crate) mod lns_small_f;
pub mod mx;
pub mod nvfp4;
mod pattern;
pub mod posit;
pub mod rounding;

use std::fmt;
use std::str::FromStr;

pub use block::{Block, BlockScope};
pub use fixed::Fixed;
pub use float::{Float, Overflow, Specials};
pub use lns::Lns;
pub use mx::{Mx, MxElement};
pub use nvfp4::Nvfp4;
pub use posit::Posit;
pub use rounding::{Rounding, RoundingRule};

use crate::error::FormatError;
use rounding::{NearestAway, NearestEven, Stochastic, TowardZero};

/// A number format that tensors can be rounded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// posit(n, es).
    Posit(Posit),
    /// IEEE-style float(exp, man) with options.
    Float(Float),
    /// Fixed point (wl, fl).
    Fixed(Fixed),
    /// Block floating point with wl-bit elements.
    Block(Block),
    /// Logarithmic number system lns<w,f>.
    Lns(Lns),
    /// OCP MX: 32-element blocks with an E8M0 scale.
    Mx(Mx),
    /// NVFP4: 16-element E2M1 blocks with an E4M3 scale, and an f32 tensor scale.
    Nvfp4(Nvfp4),
}

/// How a named format is defined: a float's (exp, man, overflow, specials) with
/// subnormals, or a posit's (n, es).
#[derive(Debug, Clone, Copy)]
enum Definition {
    Float(u32, u32, Overflow, Specials),
    Posit(u32, u32),
    Mx(MxElement),
    Nvfp4,
}

impl Definition {
    fn format(self) -> Format {
        let format = match self {
            Definition::Float(e, m, o, s) => {
                Float::with_options(e, m, true, o, s).map(Format::Float)
            }
            Definition::Posit(n, es) => Format::posit(n, es),
            Definition::Mx(element) => Ok(Format::Mx(Mx::new(element, -1))),
            Definition::Nvfp4 => Ok(Format::Nvfp4(Nvfp4::new(-1))),
        };
        format.expect("preset definitions are valid formats")
    }
}

/// The named formats, in display order: (name, description, definition). The only list of
/// preset names: parsing, display and `qcandle formats` all read it.
const PRESETS: &[(&str, &str, Definition)] = {
    use Definition::{Float as F, Mx as X, Posit as P};
    use MxElement::*;
    use Overflow::*;
    use Specials::*;
    &[
        ("fp16", "IEEE binary16", F(5, 10, Infinity, Ieee)),
        ("bf16", "bfloat16", F(8, 7, Infinity, Ieee)),
        ("tf32", "NVIDIA TensorFloat-32", F(8, 10, Infinity, Ieee)),
        (
            "e5m2",
            "OCP FP8 E5M2 (IEEE specials)",
            F(5, 2, Infinity, Ieee),
        ),
        (
            "e4m3",
            "OCP FP8 E4M3 (no Inf, NaN at S.1111.111)",
            F(4, 3, Infinity, FiniteNan),
        ),
        (
            "e3m2",
            "OCP MX FP6 E3M2 (no Inf/NaN, saturating)",
            F(3, 2, Saturate, Finite),
        ),
        (
            "e2m3",
            "OCP MX FP6 E2M3 (no Inf/NaN, saturating)",
            F(2, 3, Saturate, Finite),
        ),
        (
            "e2m1",
            "OCP MX FP4 E2M1 (no Inf/NaN, saturating)",
            F(2, 1, Saturate, Finite),
        ),
        ("posit8", "posit standard 2022, posit<8,2>", P(8, 2)),
        ("posit16", "posit standard 2022, posit<16,2>", P(16, 2)),
        ("posit32", "posit standard 2022, posit<32,2>", P(32, 2)),
        (
            "mxfp8_e4m3",
            "OCP MX: 32 x e4m3 (sat. 448) + E8M0 scale, 8.25 bits/elem",
            X(Fp8E4m3),
        ),
        (
            "mxfp8_e5m2",
            "OCP MX: 32 x e5m2 (sat. 57344) + E8M0 scale, 8.25 bits/elem",
            X(Fp8E5m2),
        ),
        (
            "mxfp6_e3m2",
            "OCP MX: 32 x e3m2 + E8M0 scale, 6.25 bits/elem",
            X(Fp6E3m2),
        ),
        (
            "mxfp6_e2m3",
            "OCP MX: 32 x e2m3 + E8M0 scale, 6.25 bits/elem",
            X(Fp6E2m3),
        ),
        (
            "mxfp4_e2m1",
            "OCP MX: 32 x e2m1 + E8M0 scale, 4.25 bits/elem",
            X(Fp4E2m1),
        ),
        (
            "mxint8",
            "OCP MX: 32 x int8 (x 2^-6, +-127/64) + E8M0 scale, 8.25 bits/elem",
            X(Int8),
        ),
        (
            "nvfp4",
            "NVIDIA: 16 x e2m1 + e4m3 scale, f32 tensor scale, 4.5 bits/elem",
            Definition::Nvfp4,
        ),
    ]
};

/// The format a preset name stands for.
fn preset(name: &str) -> Option<Format> {
    PRESETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, d)| d.format())
}

/// The preset name a float displays as, if it is a float preset. Posits always display as
/// `posit<n,es>`.
fn float_preset_name(float: &Float) -> Option<&'static str> {
    PRESETS
        .iter()
        .find(|(_, _, d)| matches!(d, Definition::Float(..)) && d.format() == Format::Float(*float))
        .map(|(name, _, _)| *name)
}

impl Format {
    /// posit(n, es); see [`Posit::new`].
    pub fn posit(n: u32, es: u32) -> Result<Self, FormatError> {
        Posit::new(n, es).map(Format::Posit)
    }
    /// IEEE-style float(exp, man); see [`Float::new`].
    pub fn float(exp: u32, man: u32) -> Result<Self, FormatError> {
        Float::new(exp, man).map(Format::Float)
    }
    /// Clamped fixed point (wl, fl); see [`Fixed::new`].
    pub fn fixed(wl: u32, fl: i32) -> Result<Self, FormatError> {
        Fixed::new(wl, fl).map(Format::Fixed)
    }
    /// Block floating point over the whole tensor; see [`Block::new`].
    pub fn block(wl: u32) -> Result<Self, FormatError> {
        Block::new(wl, BlockScope::Tensor).map(Format::Block)
    }

    /// Logarithmic number system (w, f); see [`Lns::new`].
    pub fn lns(w: u32, f: u32) -> Result<Self, FormatError> {
        Lns::new(w, f).map(Format::Lns)
    }

    /// Every named format with a one-line description, in display order.
    pub fn presets() -> Vec<(&'static str, &'static str, Format)> {
        PRESETS
            .iter()
            .map(|(name, desc, definition)| (*name, *desc, definition.format()))
            .collect()
    }

    /// Bits per element (for block floating point, MX and NVFP4: per element without the
    /// shared scales, which add 8 bits per block: 0.25 bits per MX element, 0.5 per NVFP4
    /// element, plus NVFP4's 32-bit tensor scale).
    pub fn bits(&self) -> u32 {
        match self {
            Format::Posit(p) => p.n(),
            Format::Float(f) => f.bits(),
            Format::Fixed(f) => f.wl(),
            Format::Block(b) => b.wl(),
            Format::Lns(l) => l.w(),
            Format::Mx(m) => m.element().bits(),
            Format::Nvfp4(_) => 4,
        }
    }

    /// Largest finite value (block floating point, MX, NVFP4: relative to the block, so
    /// `None`).
    pub fn max_finite(&self) -> Option<f64> {
        match self {
            Format::Posit(p) => Some(p.max_pos()),
            Format::Float(f) => Some(f.max_value()),
            Format::Fixed(f) => Some(f.max_value()),
            Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => None,
            Format::Lns(l) => Some(l.max_value()),
        }
    }

    /// Smallest positive value (block floating point, MX, NVFP4: `None`, it depends on the
    /// block).
    pub fn min_positive(&self) -> Option<f64> {
        match self {
            Format::Posit(p) => Some(p.min_pos()),
            Format::Float(f) => Some(f.min_positive()),
            Format::Fixed(f) => Some(f.quantum()),
            Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => None,
            Format::Lns(l) => Some(l.min_positive()),
        }
    }

    /// Gap between 1 and the next larger value (for block floating point and MX: in a block
    /// whose largest element is in [1, 2); NVFP4: E2M1's gap at 1, in units of the block's
    /// scales).
    pub fn epsilon(&self) -> f64 {
        match self {
            Format::Posit(p) => p.epsilon(),
            Format::Float(f) => f.epsilon(),
            Format::Fixed(f) => f.quantum(),
            Format::Block(b) => grid::pow2(2 - b.wl() as i32),
            Format::Lns(l) => l.epsilon(),
            Format::Mx(m) => m.element().epsilon(),
            Format::Nvfp4(_) => nvfp4::e2m1().epsilon(),
        }
    }

    /// Rounds one value. Block floating point, MX and NVFP4 treat `x` as a block (and
    /// tensor) of its own; use [`Block::round`], [`Mx::round`] or [`Nvfp4::round`] to give
    /// the block's scale. `random` is read only by stochastic
    /// rounding (its top `bits` bits).
    pub fn round(&self, x: f64, rounding: Rounding, random: u32) -> f64 {
        match rounding {
            Rounding::NearestEven => self.round_rule(x, NearestEven, random),
            Rounding::NearestAway => self.round_rule(x, NearestAway, random),
            Rounding::TowardZero => self.round_rule(x, TowardZero, random),
            Rounding::Stochastic { bits } => self.round_rule(x, Stochastic { bits }, random),
        }
    }

    /// [`Format::round`] with the rule as a type (monomorphised kernels use this).
    #[inline(always)]
    pub fn round_rule<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> f64 {
        match self {
            Format::Posit(p) => p.round(x, rule, random),
            Format::Float(f) => f.round(x, rule, random),
            Format::Fixed(f) => f.round(x, rule, random),
            Format::Block(b) => b.round(x, block::block_max([x]), rule, random),
            Format::Lns(l) => l.round(x, rule, random),
            Format::Mx(m) => m.round(x, m.scale_exponent(x.abs()), rule, random),
            Format::Nvfp4(_) => {
                let s_t = Nvfp4::tensor_scale(block::block_max([x]));
                Nvfp4::round(x, Nvfp4::block_scale(x.abs(), s_t), s_t, rule, random)
            }
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Format::Posit(p) => write!(f, "posit<{},{}>", p.n(), p.es()),
            Format::Float(fl) => {
                if let Some(name) = float_preset_name(fl) {
                    return write!(f, "{name}");
                }
                write!(f, "float<{},{}", fl.exp(), fl.man())?;
                match fl.specials() {
                    Specials::Ieee => {}
                    Specials::FiniteNan => write!(f, ",fn")?,
                    Specials::Finite => write!(f, ",fin")?,
                }
                if fl.overflow() == Overflow::Saturate && fl.specials() != Specials::Finite {
                    write!(f, ",sat")?;
                }
                if !fl.subnormals() {
                    write!(f, ",nosub")?;
                }
                write!(f, ">")
            }
            Format::Fixed(x) => {
                write!(f, "fixed<{},{}", x.wl(), x.fl())?;
                if !x.clamp() {
                    write!(f, ",noclamp")?;
                }
                if x.symmetric() {
                    write!(f, ",sym")?;
                }
                write!(f, ">")
            }
            Format::Block(b) => match b.scope() {
                BlockScope::Tensor => write!(f, "block<{}>", b.wl()),
                BlockScope::Dim(d) => write!(f, "block<{},dim={}>", b.wl(), d),
            },
            Format::Lns(l) => write!(f, "lns<{},{}>", l.w(), l.f()),
            Format::Mx(m) => write!(f, "{m}"),
            Format::Nvfp4(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for Format {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let input = s.trim().to_ascii_lowercase().replace(' ', "");
        let err = |reason: String| FormatError::Parse {
            what: "format",
            input: s.to_string(),
            reason,
        };
        if let Some(format) = preset(&input) {
            return Ok(format);
        }
        if let Some(format) = parse_block_scaled(&input) {
            return format.map_err(err);
        }
        let (family, args) = input
            .strip_suffix('>')
            .and_then(|t| t.split_once('<'))
            .ok_or_else(|| {
                err("expected family<args> (posit<8,0>, float<5,2>, fixed<8,4>, block<8>, lns<8,3>) or a preset name (see `qcandle formats`; MX and NVFP4 names take <dim=d>)".into())
            })?;
        let parts: Vec<&str> = args.split(',').collect();
        let int = |i: usize, name: &str| -> Result<i64, FormatError> {
            parts
                .get(i)
                .ok_or_else(|| err(format!("missing parameter `{name}`")))?
                .parse::<i64>()
                .map_err(|_| err(format!("parameter `{name}` must be an integer")))
        };
        let unsigned = |i: usize, name: &str| -> Result<u32, FormatError> {
            let v = int(i, name)?;
            u32::try_from(v).map_err(|_| err(format!("parameter `{name}` must be >= 0")))
        };
        match family {
            "posit" => {
                if parts.len() != 2 {
                    return Err(err("posit takes exactly <n,es>".into()));
                }
                Format::posit(unsigned(0, "n")?, unsigned(1, "es")?)
            }
            "float" => {
                let (exp, man) = (unsigned(0, "exp")?, unsigned(1, "man")?);
                let mut sub = true;
                let mut overflow = Overflow::Infinity;
                let mut specials = Specials::Ieee;
                for flag in &parts[2..] {
                    match *flag {
                        "nosub" => sub = false,
                        "sat" => overflow = Overflow::Saturate,
                        "fn" => specials = Specials::FiniteNan,
                        "fin" => {
                            specials = Specials::Finite;
                            overflow = Overflow::Saturate;
                        }
                        "ieee" => specials = Specials::Ieee,
                        other => {
                            return Err(err(format!(
                                "unknown float option `{other}` (nosub, sat, fn, fin, ieee)"
                            )))
                        }
                    }
                }
                Float::with_options(exp, man, sub, overflow, specials).map(Format::Float)
            }
            "fixed" => {
                let wl = unsigned(0, "wl")?;
                let fl = int(1, "fl")?;
                let fl = i32::try_from(fl).map_err(|_| FormatError::OutOfRange {
                    format: "fixed",
                    param: "fl",
                    value: fl,
                    valid: "-64..=64",
                })?;
                let mut clamp = true;
                let mut sym = false;
                for flag in &parts[2..] {
                    match *flag {
                        "noclamp" => clamp = false,
                        "clamp" => clamp = true,
                        "sym" => sym = true,
                        other => {
                            return Err(err(format!(
                                "unknown fixed option `{other}` (noclamp, sym)"
                            )))
                        }
                    }
                }
                Fixed::with_options(wl, fl, clamp, sym).map(Format::Fixed)
            }
            "block" => {
                let wl = unsigned(0, "wl")?;
                let scope = match parts.get(1) {
                    None => BlockScope::Tensor,
                    Some(p) if parts.len() == 2 => {
                        let d = p
                            .strip_prefix("dim=")
                            .ok_or_else(|| err(format!("unknown block option `{p}` (dim=<d>)")))?;
                        BlockScope::Dim(
                            d.parse()
                                .map_err(|_| err("block dim must be an integer".into()))?,
                        )
                    }
                    Some(_) => return Err(err("block takes <wl> or <wl,dim=d>".into())),
                };
                Block::new(wl, scope).map(Format::Block)
            }
            "lns" => {
                if parts.len() != 2 {
                    return Err(err("lns takes exactly <w,f>".into()));
                }
                Format::lns(unsigned(0, "w")?, unsigned(1, "f")?)
            }
            other => Err(err(format!(
                "unknown format family `{other}` (posit, float, fixed, block, lns)"
            ))),
        }
    }
}

/// An MX or NVFP4 name, with an optional `<dim=d>`: `None` when `input` is neither.
fn parse_block_scaled(input: &str) -> Option<Result<Format, String>> {
    let (name, rest) = input.split_at(input.find('<').unwrap_or(input.len()));
    if let Some(element) = MxElement::from_name(name) {
        return Some(mx::parse_dim(rest).map(|d| Format::Mx(Mx::new(element, d))));
    }
    (name == "nvfp4").then(|| mx::parse_dim(rest).map(|d| Format::Nvfp4(Nvfp4::new(d))))
}
