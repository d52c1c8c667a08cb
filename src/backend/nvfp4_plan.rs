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
//! The block scale is the count of the 126 E4M3 midpoint thresholds below `bits(amax_b)`,
//! found without a search (see "The block scale" below), and each E4M3 scale has a row of 16
//! words: the 7
//! E2M1 thresholds, the results `fl32(v · d)` for the E2M1 values `v` (the value the
//! scalar rule stores, rounded once to f32) as the first and the steps between consecutive
//! ones, and the mask of the sign bit (0 in the NaN row, whose result is the scalar rule's
//! NaN). An element's result is the first result plus the steps of the thresholds its
//! magnitude passes, with its sign: 7 compares, masks and adds per element. A zero scale's
//! row and the NaN row pass no threshold; the zero row gives ±0.
//!
//! # The block scale
//! The count `n` of thresholds below `bits(amax_b)` is the exact rule's E4M3 code of
//! `y = amax_b / c` (`c = 6 · s_t`). An estimate `y' = fl64(amax_b · fl64(1/c))` is within a
//! relative `2^-51` of `y`, and neighbouring E4M3 midpoints are at least a relative `2^-4`
//! apart (`2^-9` apart in the subnormal range, where `y'`'s absolute error is below
//! `2^-55`), so at most one midpoint lies between `y` and `y'`. The E4M3 code `c0` nearest
//! to `y'` (ties up), read from the bits of `y'` (its exponent and top 3 mantissa bits,
//! rounded; `y' · 2^9` rounded to an integer below `2^-6`) and clamped to 126, is the count of midpoints
//! below `y'` give or take one, hence `n ∈ {c0 - 1, c0, c0 + 1}`. Since the thresholds are
//! sorted, `n = c0 + [t_c0 < bits(amax_b)] - [t_(c0-1) >= bits(amax_b)]` (no `t_126`; no
//! `t_-1`): two compares with exact thresholds, so the code is the exact rule's whatever the
//! estimate's rounding.

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

/// The f32 block maxima (bit patterns) at, and one f32 unit around, every E4M3 scale value
/// and every scale threshold (both tie directions) under the tensor scale `s_t`: the maxima
/// on which a block-scale computation can go wrong by one code. Unsorted, with repeats.
pub fn scale_boundary_maxima(s_t: f64) -> Vec<u32> {
    let e4m3 = crate::format::nvfp4::e4m3_saturating();
    let c = 6.0 * s_t;
    let mut maxima = Vec::new();
    for code in 0..127u32 {
        let v = e4m3.decode(code);
        let f = ((v * c) as f32).to_bits();
        maxima.extend([f.saturating_sub(1), f, f + 1]);
        if code < 126 {
            let mid = 0.5 * (v + e4m3.decode(code + 1)) * c;
            for tie_up in [false, true] {
                let t = threshold(mid, tie_up);
                maxima.extend([t.saturating_sub(1), t, t + 1]);
            }
        }
    }
    maxima
}

/// The NVFP4 block scales under one tensor scale: the E4M3 code of a block's scale found
/// from its maximum by thresholds (for every rounding mode; the scale always rounds to
/// nearest-even).
#[derive(Debug, Clone)]
pub struct Nvfp4Scales {
    /// `fl64(1 / (6 s_t))`: the estimate's factor.
    inv_c: f64,
    /// The E4M3 midpoint thresholds on block maxima, `u32::MAX` at 126 and 127 (no
    /// midpoint above the largest code).
    thresholds: [u32; 128],
    /// `thresholds[c - 1] + 1` at `c >= 1`, 0 at 0: a maximum below it is below code `c`.
    lower: [u32; 128],
}

/// The E4M3 code of the smallest normal scale, `2^-6`.
const E4M3_MIN_NORMAL_CODE: i64 = 8;

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
        let mut lower = [0u32; 128];
        for k in 1..128 {
            // Every midpoint threshold is at most f32::MAX's bits, so this does not wrap.
            lower[k] = thresholds[k - 1].wrapping_add(1);
        }
        Nvfp4Scales {
            inv_c: 1.0 / c,
            thresholds,
            lower,
        }
    }

    /// What the estimate subtracts from the rounded exponent and top 3 mantissa bits of an
    /// f64 (`bits >> 49`) to rebase them so that `2^-6` (biased exponent 1017) is code 8.
    pub const NORMAL_CODE_OFFSET: i64 = 1017 * 8 - E4M3_MIN_NORMAL_CODE;

    /// `2^52`, whose ulp is 1: adding it to `y · 2^9` rounds that to an integer in the low
    /// bits (the estimate of a subnormal scale's code).
    pub const SUBNORMAL_MAGIC: f64 = (1u64 << 52) as f64;

    /// The E4M3 code nearest to `y >= 0` (ties up), clamped to 126: within one of the count
    /// of E4M3 midpoints below `y`.
    #[inline(always)]
    fn code_estimate(y: f64) -> usize {
        // Exponent and top 3 mantissa bits of y, rounded at the 4th, rebased so that 2^-6
        // (biased exponent 1017) is code 8.
        let normal = ((y.to_bits() + (1 << 48)) >> 49) as i64 - Self::NORMAL_CODE_OFFSET;
        // Subnormal scales: y · 2^9 rounded to an integer by adding 2^52 (whose ulp is 1),
        // read from the bits (no conversion; for y >= 2^-6 the value is not used).
        const MAGIC: f64 = Nvfp4Scales::SUBNORMAL_MAGIC;
        let subnormal = ((y * 512.0 + MAGIC).to_bits() - MAGIC.to_bits()) as i64;
        let code = if y >= 1.0 / 64.0 { normal } else { subnormal };
        code.min(126) as usize
    }

    /// What [`row_of`](Self::row_of) reads, for its vector form: the estimate's factor
    /// `fl64(1/(6 s_t))`, the midpoint threshold above each code (`u32::MAX` from 126 on)
    /// and the lowest maximum of each code (0 for code 0).
    pub fn tables(&self) -> (f64, &[u32; 128], &[u32; 128]) {
        (self.inv_c, &self.thresholds, &self.lower)
    }

    /// The row of a block whose maximum has the magnitude bits `amax` (NaN and ±Inf as
    /// +Inf's bits): the E4M3 code of its scale, or [`NAN_ROW`]. The code of the estimate
    /// `amax / (6 s_t)`, corrected by one exact threshold compare on each side (see the
    /// module docs).
    #[inline(always)]
    pub fn row_of(&self, amax: u32) -> usize {
        if amax >= 0x7f80_0000 {
            return NAN_ROW;
        }
        let c0 = Self::code_estimate(f32::from_bits(amax) as f64 * self.inv_c);
        let up = (self.thresholds[c0] < amax) as usize;
        let down = (amax < self.lower[c0]) as usize;
        c0 + up - down
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
