//! OCP Microscaling (MX v1.0) block formats: blocks of 32 consecutive elements along one
//! axis share an E8M0 scale `2^X`, and each element is an FP8, FP6, FP4 or INT8 number.
//!
//! Spelling: the six names of the specification, `mxfp8_e4m3`, `mxfp8_e5m2`, `mxfp6_e3m2`,
//! `mxfp6_e2m3`, `mxfp4_e2m1`, `mxint8`, block along the last axis; `mxfp8_e4m3<dim=0>`
//! picks another axis (negative dims count from the end; `<dim=-1>` is the default and
//! displays without the brackets).
//!
//! # Blocks
//! Along the block axis of length `L`, elements `32k .. min(32k + 32, L)` form block `k`
//! (a shorter last block is a block of its own); elements at the same other coordinates
//! and in the same `index_along_axis / 32` share a scale ([`MxGrid`]).
//!
//! # Scale
//! With `amax` the block's largest magnitude (exact, from the bits; NaN counts as larger
//! than everything):
//!
//! - `X = floor(log2 amax) - emax_elem`, where `emax_elem` is the binade of the element's
//!   largest normal (e4m3 8, e5m2 15, e3m2 4, e2m3 2, e2m1 2, int8 0);
//! - `X < -127` becomes `-127`; `X > 127` makes the block NaN (E8M0's NaN scale, 0xFF);
//! - a block holding NaN or ±Inf is NaN: all its elements become NaN;
//! - an all-zero block takes `X = -127` (its elements are zeros whatever the scale).
//!
//! # Elements
//! Each element is `x / 2^X` (exact) rounded to the element format with the rounding mode
//! (nearest-even, nearest-away, toward-zero, stochastic), subnormals kept, magnitudes
//! above the largest normal saturated to it (no element is Inf or NaN: e4m3 448, e5m2
//! 57344, e3m2 28, e2m3 7.5, e2m1 6), then multiplied by `2^X` (exact). The FP elements
//! keep the sign of zero (`-0` and negative values that round to 0 give `-0`).
//!
//! MXINT8 elements are 8-bit two's complement with an implicit scale `2^-6`. Like
//! microxcaling (`int8`: 8 bits with sign, `max_norm = 127/64`), the range is symmetric,
//! `±127/64`: the code `0x80` (-2) is never produced (the specification allows it; a block
//! whose largest element rounds to -2 gets -127/64 instead). Zero is unsigned, as in
//! two's complement.
//!
//! # Where this differs from microxcaling (`_quantize_mx`, CPU path)
//! The rule above is exact. microxcaling computes it in f32 and differs from it in:
//!
//! 1. the scale: `floor(log2(amax))` in f32 rounds `log2` up to an integer when `amax` lies
//!    within an f32 ulp below a power of two: `63.999996` gets `X = 6 - 8` instead of
//!    `5 - 8`, so under `mxfp8_e4m3` it becomes 64 where the rule gives 56 (64 saturates to
//!    `448 · 2^-3 = 56` in the block scaled by `2^-3`);
//! 2. the element rounding: its `"nearest"` is `floor(|x| + 0.5)` in f32, which rounds up a
//!    value just below a tie when the addition rounds (`0.49999997 + 0.5` is 1 in f32); its
//!    `"even"` mode has the same addition. Here a value below a tie always rounds down;
//! 3. the all-zero block takes `X = floor(log2 2^-126) - emax` there, clamped to -127
//!    (`-126` for int8); the values are zeros either way, only the packed scale differs;
//! 4. its default `"nearest"` is ties away from zero, here [`Rounding::NearestAway`]; the
//!    default here is nearest-even (the OCP specification's roundTiesToEven).
//!
//! [`Rounding::NearestAway`]: super::Rounding::NearestAway

use std::fmt;

use super::fixed::Fixed;
use super::float::{Float, Overflow, Specials};
use super::grid::{parts, pow2};
use super::rounding::RoundingRule;
use crate::error::FormatError;

/// Elements per MX block.
pub const MX_BLOCK: usize = 32;

/// The smallest E8M0 scale exponent.
pub const SCALE_MIN: i32 = -127;
/// The largest E8M0 scale exponent (254 of the 255 codes are 2^-127 ..= 2^127; 0xFF is NaN).
pub const SCALE_MAX: i32 = 127;

/// The element type of an MX format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MxElement {
    /// FP8 E4M3 (max 448).
    Fp8E4m3,
    /// FP8 E5M2 (max 57344; no Inf in MX elements).
    Fp8E5m2,
    /// FP6 E3M2 (max 28).
    Fp6E3m2,
    /// FP6 E2M3 (max 7.5).
    Fp6E2m3,
    /// FP4 E2M1 (max 6).
    Fp4E2m1,
    /// INT8, two's complement with scale 2^-6 (here symmetric, max 127/64).
    Int8,
}

/// An element's scalar format: a saturating float or symmetric fixed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementFormat {
    /// A float with subnormals that saturates at its largest normal.
    Float(Float),
    /// INT8 as fixed<8,6,sym>.
    Fixed(Fixed),
}

impl ElementFormat {
    /// Rounds `x` (an element already divided by the block scale) with `rule`.
    #[inline(always)]
    pub fn round<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> f64 {
        match self {
            ElementFormat::Float(f) => f.round(x, rule, random),
            ElementFormat::Fixed(f) => f.round(x, rule, random),
        }
    }
}

impl MxElement {
    /// Every element type, in display order.
    pub const ALL: [MxElement; 6] = [
        MxElement::Fp8E4m3,
        MxElement::Fp8E5m2,
        MxElement::Fp6E3m2,
        MxElement::Fp6E2m3,
        MxElement::Fp4E2m1,
        MxElement::Int8,
    ];

    /// The specification's name of the MX format with this element (`mxfp8_e4m3`).
    pub fn name(self) -> &'static str {
        match self {
            MxElement::Fp8E4m3 => "mxfp8_e4m3",
            MxElement::Fp8E5m2 => "mxfp8_e5m2",
            MxElement::Fp6E3m2 => "mxfp6_e3m2",
            MxElement::Fp6E2m3 => "mxfp6_e2m3",
            MxElement::Fp4E2m1 => "mxfp4_e2m1",
            MxElement::Int8 => "mxint8",
        }
    }

    /// The element type named `name` (`mxfp8_e4m3`, ...).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The element's number in `QcFormat` of `cuda/quant.cuh` (its index in [`MxElement::ALL`]).
    pub fn code(self) -> i32 {
        Self::ALL
            .iter()
            .position(|&e| e == self)
            .expect("ALL lists every element") as i32
    }

    /// Bits per element (sign included).
    pub fn bits(self) -> u32 {
        match self {
            MxElement::Fp8E4m3 | MxElement::Fp8E5m2 | MxElement::Int8 => 8,
            MxElement::Fp6E3m2 | MxElement::Fp6E2m3 => 6,
            MxElement::Fp4E2m1 => 4,
        }
    }

    /// The binade of the largest normal element, subtracted from the block maximum's
    /// binade to give the scale.
    pub fn emax(self) -> i32 {
        match self {
            MxElement::Fp8E4m3 => 8,
            MxElement::Fp8E5m2 => 15,
            MxElement::Fp6E3m2 => 4,
            MxElement::Fp6E2m3 | MxElement::Fp4E2m1 => 2,
            MxElement::Int8 => 0,
        }
    }

    /// The scalar format the elements are rounded to.
    pub fn format(self) -> ElementFormat {
        let float = |e, m, specials| {
            Float::with_options(e, m, true, Overflow::Saturate, specials)
                .map(ElementFormat::Float)
                .expect("MX element formats are valid")
        };
        match self {
            MxElement::Fp8E4m3 => float(4, 3, Specials::FiniteNan),
            MxElement::Fp8E5m2 => float(5, 2, Specials::Ieee),
            MxElement::Fp6E3m2 => float(3, 2, Specials::Finite),
            MxElement::Fp6E2m3 => float(2, 3, Specials::Finite),
            MxElement::Fp4E2m1 => float(2, 1, Specials::Finite),
            MxElement::Int8 => ElementFormat::Fixed(
                Fixed::with_options(8, 6, true, true).expect("fixed<8,6,sym> is valid"),
            ),
        }
    }

    /// The largest element magnitude.
    pub fn max_normal(self) -> f64 {
        match self.format() {
            ElementFormat::Float(f) => f.max_value(),
            ElementFormat::Fixed(f) => f.max_value(),
        }
    }

    /// The smallest positive element magnitude (a subnormal for the FP elements).
    pub fn min_positive(self) -> f64 {
        match self.format() {
            ElementFormat::Float(f) => f.min_positive(),
            ElementFormat::Fixed(f) => f.quantum(),
        }
    }

    /// The gap between 1 and the next element value.
    pub fn epsilon(self) -> f64 {
        match self.format() {
            ElementFormat::Float(f) => f.epsilon(),
            ElementFormat::Fixed(f) => f.quantum(),
        }
    }
}

/// A validated MX format: an element type and the block axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mx {
    element: MxElement,
    dim: i64,
}

impl Mx {
    /// The MX format with `element`, blocks along `dim` (negative counts from the end).
    pub fn new(element: MxElement, dim: i64) -> Self {
        Mx { element, dim }
    }

    /// The element type.
    pub fn element(&self) -> MxElement {
        self.element
    }

    /// The block axis as given (negative counts from the end; -1 is the default).
    pub fn dim(&self) -> i64 {
        self.dim
    }

    /// The scale exponent `X` of a block whose largest magnitude is `amax` (NaN or ±Inf
    /// when the block holds one): `None` for a NaN block. See the module docs.
    #[inline(always)]
    pub fn scale_exponent(&self, amax: f64) -> Option<i32> {
        shared_exponent(amax, self.element.emax())
    }

    /// Rounds `x` in a block of scale exponent `scale` (`None`: a NaN block).
    #[inline(always)]
    pub fn round<R: RoundingRule>(&self, x: f64, scale: Option<i32>, rule: R, random: u32) -> f64 {
        round_element(&self.element.format(), x, scale, rule, random)
    }
}

/// `floor(log2 amax) - emax` clamped below at -127; `None` above 127 or for NaN/Inf.
#[inline(always)]
pub fn shared_exponent(amax: f64, emax: i32) -> Option<i32> {
    if !amax.is_finite() {
        return None;
    }
    if amax == 0.0 {
        return Some(SCALE_MIN);
    }
    let x = parts(amax).e - emax;
    if x > SCALE_MAX {
        None
    } else {
        Some(x.max(SCALE_MIN))
    }
}

/// `element.round(x / 2^X) * 2^X`, NaN for a NaN block. Both scalings are exact in f64
/// except where `x / 2^X` falls below f64's normal range; such a value is below 2^-1000,
/// far under half the smallest element (2^-17 at least), so it rounds to ±0 under every
/// mode either way.
#[inline(always)]
pub fn round_element<R: RoundingRule>(
    element: &ElementFormat,
    x: f64,
    scale: Option<i32>,
    rule: R,
    random: u32,
) -> f64 {
    match scale {
        None => f64::NAN,
        Some(e) => element.round(x * pow2(-e), rule, random) * pow2(e),
    }
}

impl fmt::Display for Mx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.element.name())?;
        if self.dim != -1 {
            write!(f, "<dim={}>", self.dim)?;
        }
        Ok(())
    }
}

/// Parses the `<dim=d>` suffix of an MX or NVFP4 name (`rest` is what follows the name:
/// empty or `<dim=d>`); the default is -1.
pub(crate) fn parse_dim(rest: &str) -> Result<i64, String> {
    if rest.is_empty() {
        return Ok(-1);
    }
    let d = rest
        .strip_prefix("<dim=")
        .and_then(|r| r.strip_suffix('>'))
        .ok_or_else(|| format!("expected nothing or `<dim=d>` after the name, not `{rest}`"))?;
    d.parse::<i64>()
        .map_err(|_| format!("the block dim must be an integer, not `{d}`"))
}

/// How the elements of a contiguous tensor of shape `dims` fall into blocks of `size`
/// consecutive elements along one axis: element `(o, a, k)` (outer index, index along the
/// axis, inner index) is in block `(o * blocks_along + a / size) * inner + k`.
///
/// Every count is at least 1, so the kernels (CPU and CUDA) divide by none of them as zero,
/// also for an empty tensor (which has no element to place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MxGrid {
    /// Elements per block along the axis.
    size: usize,
    /// Length of the block axis.
    len: usize,
    /// Product of the dimensions after the axis.
    inner: usize,
    /// Blocks along the axis, `ceil(len / size)`.
    along: usize,
    /// Product of the dimensions before the axis.
    outer: usize,
}

impl MxGrid {
    /// The grid of blocks of `size` elements along `dim` of a tensor of shape `dims`; an
    /// error when `dim` names no dimension. A scalar is a tensor of shape `[1]`.
    pub fn new(
        size: usize,
        dim: i64,
        dims: &[usize],
        format: &'static str,
    ) -> Result<Self, FormatError> {
        let dims: &[usize] = if dims.is_empty() { &[1] } else { dims };
        let rank = dims.len() as i64;
        let resolved = if dim < 0 { dim + rank } else { dim };
        if resolved < 0 || resolved >= rank {
            return Err(FormatError::Inconsistent {
                format,
                reason: format!(
                    "dim={dim} is out of range for a tensor of rank {rank} (shape {dims:?})"
                ),
            });
        }
        let r = resolved as usize;
        let size = size.max(1);
        let len = dims[r].max(1);
        Ok(MxGrid {
            size,
            len,
            inner: dims[r + 1..].iter().product::<usize>().max(1),
            along: len.div_ceil(size),
            outer: dims[..r].iter().product::<usize>().max(1),
        })
    }

    /// Elements per block along the axis.
    pub fn size(&self) -> usize {
        self.size
    }
    /// Length of the block axis (at least 1).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the grid has no block (never: every count is at least 1).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Product of the dimensions after the axis (at least 1).
    pub fn inner(&self) -> usize {
        self.inner
    }
    /// Blocks along the axis (at least 1).
    pub fn along(&self) -> usize {
        self.along
    }
    /// Product of the dimensions before the axis (at least 1).
    pub fn outer(&self) -> usize {
        self.outer
    }
    /// Number of blocks.
    pub fn count(&self) -> usize {
        self.outer * self.along * self.inner
    }

    /// The block of element `i` (logical row-major index).
    #[inline(always)]
    pub fn block_of(&self, i: usize) -> usize {
        let k = i % self.inner;
        let a = (i / self.inner) % self.len;
        let o = i / (self.inner * self.len);
        (o * self.along + a / self.size) * self.inner + k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_limits_are_the_specifications() {
        let max: Vec<f64> = MxElement::ALL.iter().map(|e| e.max_normal()).collect();
        assert_eq!(max, [448.0, 57344.0, 28.0, 7.5, 6.0, 127.0 / 64.0]);
        for e in MxElement::ALL {
            // emax is the binade of the largest normal.
            assert_eq!(parts(e.max_normal()).e, e.emax(), "{e:?}");
        }
    }

    #[test]
    fn grid_places_blocks_along_the_axis() {
        // Shape [2, 70, 3], blocks along dim 1: 3 blocks per (outer, inner) pair.
        let g = MxGrid::new(32, 1, &[2, 70, 3], "mx").unwrap();
        assert_eq!((g.along(), g.count()), (3, 18));
        let idx = |o: usize, a: usize, k: usize| (o * 70 + a) * 3 + k;
        assert_eq!(g.block_of(idx(0, 31, 2)), 2);
        assert_eq!(g.block_of(idx(0, 32, 2)), 5);
        assert_eq!(g.block_of(idx(0, 69, 0)), 6);
        assert_eq!(g.block_of(idx(1, 0, 0)), 9);
        let empty = MxGrid::new(32, -1, &[0, 0], "mx").unwrap();
        assert_eq!((empty.count(), empty.block_of(0)), (1, 0));
        assert!(MxGrid::new(32, 2, &[4, 4], "mx").is_err());
        assert_eq!(MxGrid::new(32, -1, &[], "mx").unwrap().count(), 1);
    }
}
