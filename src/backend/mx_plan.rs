//! The f32 fast path of the MX formats: an element of a block of scale `2^X` rounded on its
//! f32 bit pattern, with the rounding bit computed from the exponent byte.
//!
//! An MX element is `round(x / 2^X) · 2^X` (see [`crate::format::mx`]). Scaling by `2^X`
//! moves the element format's grid along with it: for an FP element with `man` mantissa
//! bits and smallest normal binade `emin`, the value `x` of binade `e` is rounded to a
//! multiple of `2^q` with `q = max(e, emin + X) - man`, and for INT8 (fixed point with
//! `2^-6` steps) to a multiple of `2^(X - 6)`. Writing `qmin` for the exponent of the
//! element's smallest step (`emin - man`, or `-6`), both are `q = max(e - man, qmin + X)`
//! (INT8 has `man` "infinite": its grid is uniform). On the f32 pattern of a normal `x`
//! (exponent byte `b = e + 127`, the mantissa field's last bit worth `2^(b - 150)`) that
//! is rounding the magnitude bits at bit
//!
//! `s = q + 150 - b = max(k - b, s_min)`, with `k = qmin + X + 150` per block and
//! `s_min = 23 - man` (0 for INT8),
//!
//! exactly the step of the elementwise [`F32Plan`](super::f32_plan::F32Plan): keep the
//! bits above `s`, let the rounding rule decide from the rest, and let a carry run into the
//! exponent field. `s >= 24` means the step exceeds the value (0 or one step, `2^(qmin +
//! X)`); results above the block's largest value `max · 2^X` saturate to it. Every step
//! and limit is an f32 (at least `2^-143` for a scale of at least `2^-127`, at most
//! `448 · 2^119`), so the result is exact and equals the scalar rule's.
//!
//! The block parameters (`k`, the limit, the step) follow from the exponent byte of the
//! block maximum alone: `X = max(byte - 127 - emax, -127)` for a normal maximum, `-127` for
//! a zero or subnormal one (whose binade is at most `-127`), and a NaN block for byte 255
//! (NaN and ±Inf count as +Inf). The plan holds them in a 256-entry table.
//!
//! Subnormal f32 inputs (exponent byte 0, whose binade is not their byte's) are left to the
//! general path: the pass writes them unchanged and flags them. NaN blocks give the NaN of
//! the scalar rule (`f64::NAN as f32`) in every element.

use crate::format::mx::{ElementFormat, Mx, SCALE_MIN};
use crate::format::rounding::RoundingRule;

const SIGN: u32 = 0x8000_0000;

/// The limit marking a NaN block (no finite limit is this large).
const NAN_LIMIT: u32 = u32::MAX;

/// The bits of the NaN the scalar rule gives (`f64::NAN as f32`).
pub const NAN_BITS: u32 = 0x7fc0_0000;

/// The rounding parameters of one block (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MxBlock {
    /// `qmin + X + 150`: the rounding bit is `max(k - byte, s_min)`.
    pub k: i32,
    /// Magnitude bits of the block's largest value, `max · 2^X` ([`u32::MAX`]: a NaN block).
    pub limit: u32,
    /// Magnitude bits of the block's smallest step, `2^(qmin + X)`.
    pub tiny: u32,
}

impl MxBlock {
    /// Whether this is a NaN block.
    pub fn is_nan(&self) -> bool {
        self.limit == NAN_LIMIT
    }
}

/// The f32 fast path of one MX format: the block parameters per exponent byte of the block
/// maximum, and the element's lowest rounding bit.
#[derive(Debug, Clone)]
pub struct MxF32Plan {
    blocks: [MxBlock; 256],
    /// `23 - man` for FP elements, 0 for INT8.
    s_min: i32,
    /// All ones where zero keeps its sign (FP elements), 0 where it has none (INT8).
    signed_zero: u32,
}

/// Magnitude bits of an f32 for the block maxima: NaN and ±Inf become +Inf's bits.
#[inline(always)]
pub fn mag_bits(bits: u32) -> u32 {
    (bits & !SIGN).min(0x7f80_0000)
}

/// The f32 bits of `2^e` (`-149 <= e <= 127`).
fn pow2_bits(e: i32) -> u32 {
    (crate::format::grid::pow2(e) as f32).to_bits()
}

impl MxF32Plan {
    /// The plan of `mx`.
    pub fn new(mx: &Mx) -> Self {
        let emax = mx.element().emax();
        let (qmin, s_min, max, signed_zero) = match mx.element().format() {
            ElementFormat::Float(f) => (
                f.emin() - f.man() as i32,
                23 - f.man() as i32,
                f.max_value(),
                u32::MAX,
            ),
            ElementFormat::Fixed(f) => (-f.fl(), 0, f.max_value(), 0),
        };
        let mut blocks = [MxBlock {
            k: 0,
            limit: NAN_LIMIT,
            tiny: 0,
        }; 256];
        for (byte, block) in blocks.iter_mut().enumerate().take(255) {
            let x = if byte == 0 {
                SCALE_MIN
            } else {
                (byte as i32 - 127 - emax).max(SCALE_MIN)
            };
            *block = MxBlock {
                k: qmin + x + 150,
                limit: ((max * crate::format::grid::pow2(x)) as f32).to_bits(),
                tiny: pow2_bits(qmin + x),
            };
        }
        MxF32Plan {
            blocks,
            s_min,
            signed_zero,
        }
    }

    /// The parameters of a block whose maximum has the magnitude bits `amax` (from
    /// [`mag_bits`]).
    #[inline(always)]
    pub fn block(&self, amax: u32) -> MxBlock {
        self.blocks[(amax >> 23) as usize]
    }

    /// The scale exponent of a block whose maximum has the magnitude bits `amax` (`None`:
    /// a NaN block), as [`Mx::scale_exponent`] gives it, for the general path.
    pub fn scale_exponent(mx: &Mx, amax: u32) -> Option<i32> {
        mx.scale_exponent(f32::from_bits(amax) as f64)
    }

    /// Magnitude bits below which a nonzero normal input of `block` has a step above its
    /// value (`s >= 24`, i.e. exponent byte at most `k - 24`): a block whose smallest nonzero
    /// magnitude is at or above this can skip that case ([`MxF32Plan::round_lane`] with
    /// `TINY` false).
    #[inline(always)]
    pub fn tiny_below(block: MxBlock) -> u32 {
        ((block.k - 23).clamp(0, 255) as u32) << 23
    }

    /// Rounds the f32 pattern `bits` in `block` with `rule` (random word `r`): the result's
    /// bits and whether the element needs the general path (a nonzero subnormal input,
    /// written unchanged outside NaN blocks). Branch-free, so loops over it vectorise.
    /// With `TINY` false the case of a step above the value is left out (cheaper, notably
    /// for stochastic rounding): only for inputs that are zero, subnormal or at least
    /// [`MxF32Plan::tiny_below`].
    #[inline(always)]
    pub fn round_lane<R: RoundingRule, const TINY: bool>(
        &self,
        bits: u32,
        r: u32,
        block: MxBlock,
        rule: R,
    ) -> (u32, bool) {
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        let byte = abs >> 23;
        let slow = (byte == 0) & (abs != 0);
        // Elements left to the general path round at bit 0 with no limit: unchanged.
        let keep = 0u32.wrapping_sub(slow as u32);
        let shift = (block.k - byte as i32).max(self.s_min) & !(keep as i32);
        let s = shift.min(23) as u32;
        // At s = 23 the kept count is the hidden bit alone (odd).
        let odd = ((abs >> s) & 1) | (s == 23) as u32;
        let rounded = rule.round_bits(abs, s, odd, r);
        let mag = if TINY {
            let m = (abs & 0x007f_ffff) | 0x0080_0000;
            let tiny_s = shift.clamp(24, 255) as u32;
            let tiny = block.tiny & 0u32.wrapping_sub(rule.up_tiny(m, tiny_s, r) as u32);
            if shift >= 24 {
                tiny
            } else {
                rounded
            }
        } else {
            rounded
        };
        let mag = mag.min(block.limit | keep) & 0u32.wrapping_sub((abs != 0) as u32);
        let zero_sign = self.signed_zero | 0u32.wrapping_sub((mag != 0) as u32);
        let out = mag | (sign & zero_sign);
        let out = if block.is_nan() { NAN_BITS } else { out };
        (out, slow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::mx::MxElement;

    /// The table's scale exponent is the format's for a maximum of every exponent byte
    /// (zero, subnormal, normal, ±Inf and NaN maxima).
    #[test]
    fn block_table_follows_the_scale_exponent() {
        for element in MxElement::ALL {
            let mx = Mx::new(element, -1);
            let plan = MxF32Plan::new(&mx);
            for byte in 0..=255u32 {
                for low in [0, 1, 0x0040_0000, 0x007f_ffff] {
                    let amax = mag_bits((byte << 23) | low);
                    let block = plan.block(amax);
                    let want = MxF32Plan::scale_exponent(&mx, amax);
                    let at = format!("{element:?} amax {amax:#x}");
                    match want {
                        None => assert!(block.is_nan(), "{at}"),
                        Some(x) => {
                            let qmin = block.k - 150 - x;
                            let top = element.max_normal() * crate::format::grid::pow2(x);
                            assert!(!block.is_nan(), "{at}");
                            assert_eq!(f32::from_bits(block.limit) as f64, top, "{at}");
                            let step = element.min_positive() * crate::format::grid::pow2(x);
                            assert_eq!(f32::from_bits(block.tiny) as f64, step, "{at}");
                            assert_eq!(crate::format::grid::pow2(qmin), element.min_positive());
                        }
                    }
                }
            }
        }
    }
}
