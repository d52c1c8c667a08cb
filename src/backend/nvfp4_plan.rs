//! The f32 fast path of NVFP4 for the deterministic rounding modes: every choice made by
//! integer comparisons of f32 bit patterns with precomputed thresholds, no division.
//!
//! NVFP4 rounds exact quotients (see [`crate::format::nvfp4`]): the block scale is the E4M3
//! value nearest to `amax_b / (6 · s_t)` and the element the E2M1 value chosen for
//! `x / d`, `d = s_b · s_t`. Both choices are monotone in the dividend, so each is the number
//! of boundaries the dividend passes: a boundary is a midpoint between neighbours (nearest
//! rules) or a value (toward zero) times the divisor, `B = m · c`, an exact f64 (at most
//! 31 significant bits). For an f32 magnitude `a` and a real `B > 0`:
//!
//! - `a > B` exactly when `bits(a) > bits(down(B))`, with `down(B)` the largest f32 at or
//!   below `B` (the order of nonnegative f32 patterns is the order of their values, subnormals
//!   included; `B` below the smallest subnormal gives `down(B) = 0`);
//! - `a = B` is possible only where `B` is an f32; a tie that goes up (ties away, ties to the
//!   even neighbour above, or toward zero reaching the value) is then `a >= B`, i.e.
//!   `bits(a) > bits(B) - 1`.
//!
//! So each boundary becomes an integer threshold `t` with "passes" meaning `bits(a) > t`.
//! The block scale is the count of the 126 E4M3 midpoint thresholds below `bits(amax_b)`
//! (a binary search over a sorted table), and each E4M3 scale has a row of 16 words: the 7
//! E2M1 thresholds, the results `fl32(v · d)` for the E2M1 values `v` (the value the
//! scalar rule stores, rounded once to f32) as the first and the steps between consecutive
//! ones, and the mask of the sign bit (0 in the NaN row, whose result is the scalar rule's
//! NaN). An element's result is the first result plus the steps of the thresholds its
//! magnitude passes, with its sign: 7 compares, masks and adds per element. A zero scale's
//! row and the NaN row pass no threshold; the zero row gives ±0.

use crate::format::nvfp4::e4m3_saturating;
use crate::format::rounding::RuleKind;

const SIGN: u32 = 0x8000_0000;

/// Row of the NaN block scale.
pub const NAN_ROW: usize = 127;

/// E2M1 values, ascending (code order).
const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The threshold of boundary `b` (positive: every boundary is a positive multiple of a
/// positive divisor): `bits(a) > t` exactly when the f32 magnitude `a` is above `b`, or
/// equal to it when `tie_up`.
pub fn threshold(b: f64, tie_up: bool) -> u32 {
    let f = b as f32;
    let down = if f.is_infinite() || f as f64 > b {
        // Rounded up (or past f32::MAX): the f32 below.
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    let exact = down as f64 == b;
    down.to_bits() - (exact & tie_up) as u32
}

/// The NVFP4 block scales under one tensor scale: the E4M3 code of a block's scale found
/// from its maximum by thresholds (for every rounding mode; the scale always rounds to
/// nearest-even).
#[derive(Debug, Clone)]
pub struct Nvfp4Scales {
    /// The E4M3 midpoint thresholds on block maxima, padded with `u32::MAX` to 128.
    thresholds: [u32; 128],
}

impl Nvfp4Scales {
    /// The block-scale thresholds for tensor scale `s_t`.
    pub fn new(s_t: f64) -> Self {
        let e4m3 = e4m3_saturating();
        let c = 6.0 * s_t;
        let mut thresholds = [u32::MAX; 128];
        for k in 0..126u32 {
            let mid = 0.5 * (e4m3.decode(k) + e4m3.decode(k + 1));
            // Ties go to the even code: up from an odd code k.
            thresholds[k as usize] = threshold(mid * c, k % 2 == 1);
        }
        Nvfp4Scales { thresholds }
    }

    /// The row of a block whose maximum has the magnitude bits `amax` (NaN and ±Inf as
    /// +Inf's bits): the E4M3 code of its scale, or [`NAN_ROW`]. A branch-free binary
    /// search for the number of thresholds below `amax`.
    #[inline(always)]
    pub fn row_of(&self, amax: u32) -> usize {
        if amax >= 0x7f80_0000 {
            return NAN_ROW;
        }
        let t = &self.thresholds;
        let mut i = 0;
        for step in [64, 32, 16, 8, 4, 2, 1] {
            i += step * (t[i + step - 1] < amax) as usize;
        }
        i
    }

    /// The block scale of a row, as
    /// [`Nvfp4::block_scale`](crate::format::Nvfp4::block_scale) gives it (NaN for the NaN
    /// row).
    pub fn block_scale(row: usize) -> f64 {
        if row == NAN_ROW {
            f64::NAN
        } else {
            e4m3_saturating().decode(row as u32)
        }
    }
}

/// The NVFP4 fast path for one tensor scale and one deterministic rounding rule: the block
/// scales and a row of thresholds and results per scale.
#[derive(Debug, Clone)]
pub struct Nvfp4F32Plan {
    /// The block scales.
    pub scales: Nvfp4Scales,
    /// One row per E4M3 scale code (0 ..= 126 ascending, 127 NaN): 7 E2M1 thresholds, the
    /// result below the first, the 7 steps to the next result (wrapping differences of the
    /// bits), the sign mask.
    rows: Vec<[u32; 16]>,
}

impl Nvfp4F32Plan {
    /// The plan for tensor scale `s_t` and the deterministic rule `kind`; `None` for
    /// stochastic rounding (which draws on the f64 quotient).
    pub fn new(s_t: f64, kind: RuleKind) -> Option<Self> {
        if kind == RuleKind::Stochastic {
            return None;
        }
        let e4m3 = e4m3_saturating();
        let mut rows = Vec::with_capacity(128);
        for code in 0..127u32 {
            let s_b = e4m3.decode(code);
            let mut row = [0u32; 16];
            row[15] = SIGN;
            if s_b == 0.0 {
                // Passes no threshold: ±0.
                row[..7].fill(u32::MAX);
                rows.push(row);
                continue;
            }
            let d = s_b * s_t;
            for j in 0..7 {
                let mid = 0.5 * (E2M1[j] + E2M1[j + 1]) * d;
                row[j] = match kind {
                    RuleKind::TowardZero => threshold(E2M1[j + 1] * d, true),
                    RuleKind::NearestAway => threshold(mid, true),
                    // Ties go to the even code: up from an odd code j.
                    _ => threshold(mid, j % 2 == 1),
                };
            }
            // The first result, then the steps between consecutive results.
            let results = E2M1.map(|v| ((v * d) as f32).to_bits());
            row[7] = results[0];
            for j in 0..7 {
                row[8 + j] = results[j + 1].wrapping_sub(results[j]);
            }
            rows.push(row);
        }
        let mut nan = [0u32; 16];
        nan[..7].fill(u32::MAX);
        nan[7] = super::mx_plan::NAN_BITS;
        rows.push(nan);
        Some(Nvfp4F32Plan {
            scales: Nvfp4Scales::new(s_t),
            rows,
        })
    }

    /// The row of E4M3 code `row` (or [`NAN_ROW`]).
    #[inline(always)]
    pub fn row(&self, row: usize) -> &[u32; 16] {
        &self.rows[row]
    }

    /// Rounds the f32 pattern `bits` with `row`: the bits the scalar rule stores. The
    /// thresholds passed are a prefix, so adding the steps of those passed gives the result
    /// of the last one (compares, masks and adds, which vectorise; a select of the result
    /// compiled to a load per element).
    #[inline(always)]
    pub fn round_lane(bits: u32, row: &[u32; 16]) -> u32 {
        let abs = bits & !SIGN;
        let mut mag = row[7];
        for j in 0..7 {
            let passed = 0u32.wrapping_sub((abs > row[j]) as u32);
            mag = mag.wrapping_add(row[8 + j] & passed);
        }
        mag | (bits & SIGN & row[15])
    }
}
