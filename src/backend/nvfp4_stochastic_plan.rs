//! The f32 fast path of stochastic NVFP4: the scalar rule's decision made from a quotient
//! estimate without dividing, with the elements it cannot decide flagged for the scalar rule.
//!
//! The scalar rule (see [`crate::format::nvfp4`]) rounds the f64 quotient
//! `q = fl64(a / d)` (`a = |x|`, `d = s_b · s_t`) to E2M1 stochastically: with `u` the E2M1
//! step at `q` (`2^(max(e, 0) - 1)` for `q` in binade `e`), `lo` the E2M1 value at or below
//! `q` and `z = (q - lo) / u · 2^k` (`k` random bits), it goes up to `lo + u` exactly when
//! `r < floor(z)` for the `k`-bit random word `r`, i.e. when `r + 1 <= z`; it saturates at 6.
//! The value stored is `fl32(v · d)` for the chosen E2M1 value `v`, with the sign of `x`.
//!
//! Here `q` is estimated as `q' = fl64(a · fl64(1/d))` (one multiplication; `1/d` per
//! block), within a relative `2^-51` of `a / d` and so of `q`. On `q'` everything else is
//! exact: `t = q' / u` (a power of two), `floor(t)`, `z' = (t - floor(t)) · 2^k`. From
//! `|q' - q| <= 2^-51 q` follows `|z' - z| <= 2^(k - 49) <= 2^-26` when `q'` and `q` lie in
//! the same E2M1 interval; then the decisions `r + 1 <= z'` and `r + 1 <= z` differ only if
//! `|z' - (r + 1)| <= 2^-26`. When they lie in neighbouring intervals (across an E2M1 value
//! `g`), `z'` is within `2^-26` of `2^k` or of 0: if `q' < g <= q` the rule gives `g`, and
//! so does the estimate unless `r + 1 = 2^k`; if `q < g <= q'` the estimate gives `g`, and
//! so does the rule unless `r + 1 = 2^k`. So an element is flagged when
//! `|z' - (r + 1)| < 2^-24`, or when `z' < 2^-24` and `r + 1 = 2^k` (and `q' > 0`: a zero
//! quotient is exact); every other element takes the estimate's decision, which is the
//! rule's. Flags are rare (about `2^-23` of the elements for random data).
//!
//! A block of scale 0 has `d = 0` and `1/d` taken as 0: every element is ±0, as the rule
//! gives. A NaN block's elements are the rule's NaN.

use crate::backend::mx_plan::NAN_BITS;
use crate::backend::nvfp4_plan::{Nvfp4Scales, NAN_ROW};

const SIGN: u32 = 0x8000_0000;

/// Half-width of the band around a decision boundary where an element is flagged (`2^-24`,
/// four times the largest error of the estimate `z'`).
const BAND: f64 = 1.0 / (1u64 << 24) as f64;

/// The divisor of an NVFP4 block and its reciprocal (both 0 for a zero scale, NaN for a NaN
/// block).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SrBlock {
    /// `d = s_b · s_t`.
    pub d: f64,
    /// `fl64(1 / d)` (0 where `d` is 0).
    pub inv: f64,
}

/// The stochastic NVFP4 fast path for one tensor scale: the block scales and the divisor
/// and reciprocal of every E4M3 scale code.
#[derive(Debug, Clone)]
pub struct Nvfp4SrPlan {
    /// The block scales.
    pub scales: Nvfp4Scales,
    /// One block per E4M3 code (0 ..= 126), then the NaN block ([`NAN_ROW`]).
    blocks: [SrBlock; 128],
}

impl Nvfp4SrPlan {
    /// The plan for tensor scale `s_t`.
    pub fn new(s_t: f64) -> Self {
        let mut blocks = [SrBlock { d: 0.0, inv: 0.0 }; 128];
        for (row, block) in blocks.iter_mut().enumerate() {
            let d = Nvfp4Scales::block_scale(row) * s_t;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            *block = SrBlock { d, inv };
        }
        debug_assert!(blocks[NAN_ROW].d.is_nan());
        Nvfp4SrPlan {
            scales: Nvfp4Scales::new(s_t),
            blocks,
        }
    }

    /// The block of E4M3 code `row` (or [`NAN_ROW`]).
    #[inline(always)]
    pub fn block(&self, row: usize) -> SrBlock {
        self.blocks[row]
    }

    /// Rounds the f32 pattern `bits` in `block` with `k` random bits (`1..=23`) of the
    /// word `r`: the bits the scalar rule stores, and whether the element must be redone by
    /// the scalar rule instead (see the module docs). Branch-free, so loops over it
    /// vectorise.
    #[inline(always)]
    pub fn round_lane(bits: u32, r: u32, block: SrBlock, k: u32) -> (u32, bool) {
        let sign = bits & SIGN;
        let a = f32::from_bits(bits ^ sign) as f64;
        let q = a * block.inv;
        // The binade of q, at least 0 (E2M1's subnormal step 1/2 covers q < 1).
        let e = (((q.to_bits() >> 52) as i64) - 1023).clamp(0, 1023) as u64;
        let inv_u = f64::from_bits((1024 - e) << 52); // 2^(1 - e)
        let u = f64::from_bits((1022 + e) << 52); // 2^(e - 1)
        let t = q * inv_u;
        let floor = t.floor();
        let scale = f64::from_bits((1023 + k as u64) << 52); // 2^k
        let z = (t - floor) * scale;
        let r1 = ((r >> (32 - k)) + 1) as f64;
        let up = r1 <= z;
        let v = ((floor + up as u32 as f64) * u).min(6.0);
        let mag = ((v * block.d) as f32).to_bits();
        let nan = block.d.is_nan();
        let near = ((z - r1).abs() < BAND) | ((z < BAND) & (r1 == scale));
        let flag = near & (q != 0.0) & !nan;
        let out = if nan { NAN_BITS } else { mag | sign };
        (out, flag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::rounding::Stochastic;
    use crate::format::Nvfp4;

    /// The lane step equals the scalar rule wherever it does not flag, on quotients that are
    /// exactly the decision boundaries `lo + (r + 1) u / 2^k` (where the estimate is off by
    /// an ulp for divisors whose reciprocal is inexact), and flags some of them.
    #[test]
    fn unflagged_lanes_equal_the_scalar_rule_on_decision_boundaries() {
        let mut flagged = 0;
        let mut wrong_if_unflagged = 0;
        let mut checked = 0;
        for s_t in [3.0 * 2f64.powi(-10), 5.0 / 8.0, 7.0 * 2f64.powi(-20), 1.0] {
            let plan = Nvfp4SrPlan::new(s_t);
            for row in [1usize, 9, 56, 77, 126] {
                let block = plan.block(row);
                let s_b = Nvfp4Scales::block_scale(row);
                for k in [2u32, 4, 9] {
                    let rule = Stochastic { bits: k };
                    let lows = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
                    let units = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0];
                    for (&lo, &u) in lows.iter().zip(&units) {
                        for j in 0..(1u32 << k) {
                            let target = lo + (j + 1) as f64 * u / (1u32 << k) as f64;
                            let x = (target * block.d) as f32;
                            let r = j << (32 - k);
                            for x in [x, -x] {
                                let (got, flag) = Nvfp4SrPlan::round_lane(x.to_bits(), r, block, k);
                                let want = Nvfp4::round(x as f64, s_b, s_t, rule, r) as f32;
                                checked += 1;
                                if flag {
                                    flagged += 1;
                                    wrong_if_unflagged += (got != want.to_bits()) as u32;
                                } else {
                                    assert_eq!(
                                        got,
                                        want.to_bits(),
                                        "s_t {s_t:e} row {row} k {k} x {x:e} r {r:#x}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000);
        assert!(flagged > 0, "no boundary flagged");
        assert!(wrong_if_unflagged > 0, "the flags never mattered");
    }
}
