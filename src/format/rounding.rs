//! Rounding modes, and the integer decision each one makes.
//!
//! Every format in this crate rounds by the same integer step: a finite magnitude is written
//! as an integer significand `m` times a power of two, the target grid keeps `m >> s`, and the
//! discarded remainder `rem = m mod 2^s` decides whether the kept count goes up by one:
//!
//! | mode | rounds up when |
//! |---|---|
//! | nearest-even | `rem > 2^(s-1)`, or `rem == 2^(s-1)` and the kept value is odd |
//! | nearest-away | `rem >= 2^(s-1)` |
//! | toward-zero | never (magnitudes are truncated) |
//! | stochastic, k bits | `r < floor(rem * 2^k / 2^s)` for a uniform k-bit random `r` |
//!
//! Stochastic rounding therefore goes up with probability equal to the distance to the lower
//! neighbour in units of the gap, truncated to k bits, exactly as hardware stochastic rounding
//! with k random bits does; with k = 23 it is unbiased to within 2^-23 of a gap. Signs are
//! handled outside (rounding acts on magnitudes), so every mode is symmetric about zero.

use std::fmt;
use std::str::FromStr;

use crate::error::FormatError;

/// How a value between two representable neighbours is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rounding {
    /// Round to nearest, ties to the even neighbour (IEEE-754 default; posit standard).
    #[default]
    NearestEven,
    /// Round to nearest, ties away from zero.
    NearestAway,
    /// Truncate the magnitude (round toward zero).
    TowardZero,
    /// Round up with probability proportional to the distance from the lower neighbour,
    /// using `bits` random bits (1..=23).
    Stochastic {
        /// Number of random bits compared against the truncated distance.
        bits: u32,
    },
}

/// The largest number of random bits stochastic rounding accepts.
pub const MAX_STOCHASTIC_BITS: u32 = 23;

impl Rounding {
    /// Stochastic rounding with `bits` random bits, validated to 1..=23.
    pub fn stochastic(bits: u32) -> Result<Self, FormatError> {
        if !(1..=MAX_STOCHASTIC_BITS).contains(&bits) {
            return Err(FormatError::OutOfRange {
                format: "stochastic",
                param: "bits",
                value: bits as i64,
                valid: "1..=23",
            });
        }
        Ok(Rounding::Stochastic { bits })
    }

    /// Whether this mode consumes random bits.
    pub fn is_stochastic(&self) -> bool {
        matches!(self, Rounding::Stochastic { .. })
    }
}

impl fmt::Display for Rounding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rounding::NearestEven => write!(f, "nearest-even"),
            Rounding::NearestAway => write!(f, "nearest-away"),
            Rounding::TowardZero => write!(f, "toward-zero"),
            Rounding::Stochastic { bits } if *bits == MAX_STOCHASTIC_BITS => {
                write!(f, "stochastic")
            }
            Rounding::Stochastic { bits } => write!(f, "stochastic:{bits}"),
        }
    }
}

impl FromStr for Rounding {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| FormatError::Parse {
            what: "rounding",
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "nearest-even" | "nearest" | "rne" => Ok(Rounding::NearestEven),
            "nearest-away" | "rna" => Ok(Rounding::NearestAway),
            "toward-zero" | "rtz" => Ok(Rounding::TowardZero),
            "stochastic" | "sr" => Ok(Rounding::Stochastic {
                bits: MAX_STOCHASTIC_BITS,
            }),
            _ => {
                if let Some(b) = t.strip_prefix("stochastic:") {
                    let bits: u32 = b
                        .parse()
                        .map_err(|_| err("the number of random bits must be an integer 1..=23"))?;
                    Rounding::stochastic(bits)
                } else {
                    Err(err(
                        "expected nearest-even, nearest-away, toward-zero, stochastic or stochastic:<bits>",
                    ))
                }
            }
        }
    }
}

/// Which rounding decision a [`RoundingRule`] makes; a constant per rule type so that
/// `match R::KIND` in a monomorphised kernel compiles to straight-line code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleKind {
    /// Ties to even.
    NearestEven,
    /// Ties away from zero.
    NearestAway,
    /// Truncation.
    TowardZero,
    /// Random-bit comparison.
    Stochastic,
}

/// A rounding mode as a type, so kernels are monomorphised per mode.
pub trait RoundingRule: Copy + Send + Sync {
    /// The decision this rule makes.
    const KIND: RuleKind;

    /// Whether to round the kept count up, given the remainder `rem` of `s` discarded bits
    /// (`s >= 1`, possibly >= 64, in which case `rem < 2^63` is the whole significand), the
    /// parity of the kept value and 32 random bits (only stochastic rules read them).
    fn up(&self, rem: u64, s: u32, odd: bool, random: u32) -> bool;

    /// Stochastic decision for a non-uniform gap: round up when the k-bit truncation of
    /// `num / den` exceeds the random draw. Deterministic rules never call this.
    fn up_ratio(&self, num: u128, den: u128, random: u32) -> bool;

    /// Branch-free rounding of 32-bit magnitude bits at bit `s` (0..=23; 0 leaves `abs`
    /// unchanged): keeps the bits above `s` and adds `1 << s` when the rule says so. `odd` is
    /// the kept value's parity (0 or 1). Same decision as [`RoundingRule::up`], written for
    /// the f32 fast path so that it vectorises.
    fn round_bits(&self, abs: u32, s: u32, odd: u32, random: u32) -> u32;

    /// Branch-free decision for a grid coarser than the value: round the significand `m`
    /// (`2^23 <= m < 2^24`) at bit `s >= 24`, where the kept count is 0 (even). Same decision
    /// as [`RoundingRule::up`].
    fn up_tiny(&self, m: u32, s: u32, random: u32) -> bool;

    /// The random bits a stochastic rule compares (0 for deterministic rules), for
    /// decisions that are not made on a binary remainder (the log domain of lns).
    #[inline(always)]
    fn random_bits(&self) -> u32 {
        0
    }
}

/// `rem` compared with half of `2^s`.
#[inline(always)]
fn cmp_half(rem: u64, s: u32) -> std::cmp::Ordering {
    if s > 64 {
        std::cmp::Ordering::Less
    } else {
        let half = 1u64 << (s - 1);
        rem.cmp(&half)
    }
}

/// Ties to even.
#[derive(Debug, Clone, Copy, Default)]
pub struct NearestEven;
/// Ties away from zero.
#[derive(Debug, Clone, Copy, Default)]
pub struct NearestAway;
/// Truncation toward zero.
#[derive(Debug, Clone, Copy, Default)]
pub struct TowardZero;
/// Stochastic rounding with `bits` random bits (1..=23).
#[derive(Debug, Clone, Copy)]
pub struct Stochastic {
    /// Number of random bits.
    pub bits: u32,
}

impl RoundingRule for NearestEven {
    const KIND: RuleKind = RuleKind::NearestEven;
    #[inline(always)]
    fn up(&self, rem: u64, s: u32, odd: bool, _random: u32) -> bool {
        match cmp_half(rem, s) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => odd,
            std::cmp::Ordering::Less => false,
        }
    }
    fn up_ratio(&self, _num: u128, _den: u128, _random: u32) -> bool {
        unreachable!("nearest rules decide non-uniform gaps from the bit pattern")
    }
    #[inline(always)]
    fn round_bits(&self, abs: u32, s: u32, odd: u32, _random: u32) -> u32 {
        // Adding half - 1 + odd carries into bit s exactly when rem > half, or rem == half
        // and the kept value is odd.
        let (half, mask) = half_and_mask(s);
        (abs + (half.wrapping_sub(1).wrapping_add(odd) & mask)) & !mask
    }
    #[inline(always)]
    fn up_tiny(&self, m: u32, s: u32, _random: u32) -> bool {
        // Only at s = 24 can m reach half the quantum; the tie (m = 2^23) goes to the even 0.
        (s == 24) & (m > 0x0080_0000)
    }
}

/// `abs` with the bits below `s` cleared.
#[inline(always)]
fn truncate(abs: u32, s: u32) -> u32 {
    abs & !((1u32 << s) - 1)
}

/// `2^(s-1)` (0 for s = 0) and `2^s - 1`.
#[inline(always)]
fn half_and_mask(s: u32) -> (u32, u32) {
    let unit = 1u32 << s;
    (unit >> 1, unit - 1)
}

impl RoundingRule for NearestAway {
    const KIND: RuleKind = RuleKind::NearestAway;
    #[inline(always)]
    fn up(&self, rem: u64, s: u32, _odd: bool, _random: u32) -> bool {
        cmp_half(rem, s) != std::cmp::Ordering::Less
    }
    fn up_ratio(&self, _num: u128, _den: u128, _random: u32) -> bool {
        unreachable!("nearest rules decide non-uniform gaps from the bit pattern")
    }
    #[inline(always)]
    fn round_bits(&self, abs: u32, s: u32, _odd: u32, _random: u32) -> u32 {
        let (half, mask) = half_and_mask(s);
        (abs + half) & !mask
    }
    #[inline(always)]
    fn up_tiny(&self, _m: u32, s: u32, _random: u32) -> bool {
        s == 24
    }
}

impl RoundingRule for TowardZero {
    const KIND: RuleKind = RuleKind::TowardZero;
    #[inline(always)]
    fn up(&self, _rem: u64, _s: u32, _odd: bool, _random: u32) -> bool {
        false
    }
    fn up_ratio(&self, _num: u128, _den: u128, _random: u32) -> bool {
        false
    }
    #[inline(always)]
    fn round_bits(&self, abs: u32, s: u32, _odd: u32, _random: u32) -> u32 {
        truncate(abs, s)
    }
    #[inline(always)]
    fn up_tiny(&self, _m: u32, _s: u32, _random: u32) -> bool {
        false
    }
}

impl RoundingRule for Stochastic {
    const KIND: RuleKind = RuleKind::Stochastic;
    #[inline(always)]
    fn random_bits(&self) -> u32 {
        self.bits
    }
    #[inline(always)]
    fn up(&self, rem: u64, s: u32, _odd: bool, random: u32) -> bool {
        let k = self.bits;
        // floor(rem * 2^k / 2^s): the distance to the lower neighbour truncated to k bits.
        let threshold = if s >= k {
            let sh = s - k;
            if sh >= 64 {
                0
            } else {
                rem >> sh
            }
        } else {
            rem << (k - s)
        };
        ((random >> (32 - k)) as u64) < threshold
    }
    fn up_ratio(&self, num: u128, den: u128, random: u32) -> bool {
        let threshold = (num << self.bits) / den;
        ((random >> (32 - self.bits)) as u128) < threshold
    }
    #[inline(always)]
    fn round_bits(&self, abs: u32, s: u32, _odd: u32, random: u32) -> u32 {
        let k = self.bits;
        let rem = abs & ((1u32 << s) - 1);
        // floor(rem * 2^k / 2^s) in 32-bit lanes (k, s <= 23): a right shift by s - k, or a
        // left shift by k - s, which cannot overflow since rem < 2^s. Both shifts are
        // computed (amounts wrap) and one is selected, so the vectorised loop has no branch.
        let down = rem.wrapping_shr(s.wrapping_sub(k));
        let left = rem.wrapping_shl(k.wrapping_sub(s));
        let threshold = if s >= k { down } else { left };
        let up = (random >> (32 - k)) < threshold;
        truncate(abs, s) + ((up as u32) << s)
    }
    #[inline(always)]
    fn up_tiny(&self, m: u32, s: u32, random: u32) -> bool {
        // floor(m * 2^k / 2^s) with s - k >= 1 and m < 2^24; shifts past 31 leave 0.
        let shift = s.saturating_sub(self.bits);
        let threshold = if shift < 32 { m >> (shift & 31) } else { 0 };
        (random >> (32 - self.bits)) < threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for test inputs (xorshift64*).
    fn words(seed: u64) -> impl Iterator<Item = u32> {
        let mut x = seed | 1;
        std::iter::repeat_with(move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
        })
    }

    /// The branch-free stochastic step of the f32 path makes the decision of
    /// [`Stochastic::up`] (the general path's) at every bit position and random-bit count,
    /// including the remainders 0 and all ones, the random words 0 and all ones, and the
    /// random word equal to the threshold (which must not round up).
    #[test]
    fn stochastic_round_bits_decides_as_up() {
        let mut gen = words(7);
        for k in 1..=23 {
            let rule = Stochastic { bits: k };
            for s in 0..=23u32 {
                let mask = (1u32 << s) - 1;
                for _ in 0..400 {
                    let abs = gen.next().unwrap() & 0x7fff_ffff;
                    let picks = [abs, abs & !mask, abs | mask];
                    for abs in picks {
                        let rem = abs & mask;
                        let threshold = ((rem as u64) << k) >> s;
                        let at_threshold = ((threshold.min((1 << k) - 1)) as u32) << (32 - k);
                        for r in [0, u32::MAX, gen.next().unwrap(), at_threshold] {
                            let up = s > 0 && rule.up(rem as u64, s, false, r);
                            let want = (abs & !mask) + ((up as u32) << s);
                            let got = rule.round_bits(abs, s, 0, r);
                            assert_eq!(got, want, "k {k} s {s} abs {abs:#x} r {r:#x}");
                        }
                    }
                }
            }
        }
    }

    /// The stochastic decision for a quantum above the value equals [`Stochastic::up`] for
    /// bit positions from 24 to past 64 (where the whole significand is below the draw).
    #[test]
    fn stochastic_up_tiny_decides_as_up() {
        let mut gen = words(11);
        for k in 1..=23 {
            let rule = Stochastic { bits: k };
            for s in 24..=80u32 {
                for _ in 0..200 {
                    let m = 0x0080_0000 | (gen.next().unwrap() & 0x007f_ffff);
                    for r in [0, u32::MAX, gen.next().unwrap()] {
                        let want = rule.up(m as u64, s, false, r);
                        assert_eq!(rule.up_tiny(m, s, r), want, "k {k} s {s} m {m:#x} r {r:#x}");
                    }
                }
            }
        }
    }
}
