//! The f32 fast path of stochastic NVFP4: the scalar rule's decision made from an f32
//! quotient estimate without dividing, with the elements it cannot decide flagged for the
//! scalar rule.
//!
//! The scalar rule (see [`crate::format::nvfp4`]) rounds the f64 quotient
//! `q = fl64(a / d)` (`a = |x|`, `d = s_b · s_t`) to E2M1 stochastically: with `u` the E2M1
//! step at `q` (`2^(max(e, 0) - 1)` for `q` in binade `e`), `lo` the E2M1 value at or below
//! `q` and `z = (q - lo) / u · 2^k` (`k` random bits), it goes up to `lo + u` exactly when
//! `r < floor(z)` for the `k`-bit random word `r`, i.e. when `r + 1 <= z`; it saturates at 6.
//! The value stored is `fl32(v · d)` for the chosen E2M1 value `v`, with the sign of `x`.
//!
//! # The estimate and its error
//! Here `q` is estimated in f32 as `q' = fl32(a · fl32(1/d))` (one multiplication; `1/d`
//! per block), within a relative `2^-22.9` of `q` (three roundings of at most `2^-24`, and
//! f64's `2^-53`). On `q'` everything else is exact: `t = q' / u` (a power of two),
//! `floor(t)`, `z' = (t - floor(t)) · 2^k`. Since `q < 4u`, `|z' - z| < 2^(k - 20.9)` when
//! `q'` and `q` lie in the same E2M1 interval; then the decisions `r + 1 <= z'` and
//! `r + 1 <= z` differ only if `|z' - (r + 1)| < 2^(k - 20.9)`. When they lie in
//! neighbouring intervals (across an E2M1 value `g`), `z'` is that close to `2^k` or to 0:
//! if `q' < g <= q` the rule gives `g`, and so does the estimate unless `r + 1 = 2^k`; if
//! `q < g <= q'` the estimate gives `g`, and so does the rule unless `r + 1 = 2^k`. So an
//! element is flagged when `|z' - (r + 1)| < 2^(k - 19)` (the band, wider than the error),
//! or when `z' <` the band and `r + 1 = 2^k` (and `q' > 0`: a zero quotient is exact, or is
//! `q`'s underflow, which the rule rounds to 0 too); every other element takes the
//! estimate's decision, which is the rule's. Flags are rare (about `2^-18` of the elements
//! for data that is not on the decision boundaries).
//!
//! # The stored value
//! `fl32(v · d)` without f64: `d = d_h + d_l` with `d_h = fl32(d)` and `d_l = d - d_h` (exact
//! in f32: `d` has at most 28 significant bits), so `fma(v, d_h, v · d_l)` rounds `v · d`
//! exactly once (`v · d_l` is exact: `v` has at most 2 significant bits).
//!
//! # Blocks
//! A block of scale 0 has `1/d`, `d_h` and `d_l` 0: every element is ±0, as the rule gives.
//! A NaN block's elements are the rule's NaN (its ±Inf and NaN elements are flagged). Blocks
//! whose divisor is outside `[2^-100, 2^120]` (only in tensors whose largest magnitude is
//! below about `2^-90`, where `1/d` or `d_l` would leave f32's normal range) have a NaN
//! `1/d`, which flags every element.

use crate::backend::mx_plan::NAN_BITS;
use crate::backend::nvfp4_plan::{Nvfp4Scales, NAN_ROW};

const SIGN: u32 = 0x8000_0000;

/// The per-block constants of the stochastic lane step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SrRow {
    /// `fl32(1 / d)` (0 for a zero scale or a NaN block, NaN where the block is left to
    /// the scalar rule).
    pub inv: f32,
    /// `fl32(d)`.
    pub d_hi: f32,
    /// `d - fl32(d)`.
    pub d_lo: f32,
    /// All ones for a NaN block, else 0.
    pub nan: u32,
}

/// The random-bit count `k` and the constants it fixes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SrBits {
    /// Random bits compared (`1..=23`).
    pub k: u32,
    /// `2^k`.
    pub scale: f32,
    /// `2^(k - 19)`: the half-width of the band where an element is flagged.
    pub band: f32,
}

impl SrBits {
    /// The constants for `k` random bits (`1..=23`).
    pub fn new(k: u32) -> Self {
        let pow2 = |e: i32| crate::format::grid::pow2(e) as f32;
        SrBits {
            k,
            scale: pow2(k as i32),
            band: pow2(k as i32 - 19),
        }
    }
}

/// The stochastic NVFP4 fast path for one tensor scale: the block scales and the constants
/// of every E4M3 scale code.
#[derive(Debug, Clone)]
pub struct Nvfp4SrPlan {
    /// The block scales.
    pub scales: Nvfp4Scales,
    /// One row per E4M3 code (0 ..= 126), then the NaN block ([`NAN_ROW`]).
    rows: [SrRow; 128],
}

impl Nvfp4SrPlan {
    /// The plan for tensor scale `s_t`.
    pub fn new(s_t: f64) -> Self {
        let mut rows = [SrRow {
            inv: 0.0,
            d_hi: 0.0,
            d_lo: 0.0,
            nan: 0,
        }; 128];
        for (code, row) in rows.iter_mut().enumerate().take(NAN_ROW) {
            let d = Nvfp4Scales::block_scale(code) * s_t;
            let in_range = (2f64.powi(-100)..=2f64.powi(120)).contains(&d);
            if d == 0.0 {
                continue;
            }
            let d_hi = d as f32;
            *row = SrRow {
                inv: if in_range { (1.0 / d) as f32 } else { f32::NAN },
                d_hi,
                d_lo: (d - d_hi as f64) as f32,
                nan: 0,
            };
        }
        rows[NAN_ROW].nan = u32::MAX;
        Nvfp4SrPlan {
            scales: Nvfp4Scales::new(s_t),
            rows,
        }
    }

    /// The row of E4M3 code `row` (or [`NAN_ROW`]).
    #[inline(always)]
    pub fn row(&self, row: usize) -> SrRow {
        self.rows[row]
    }

    /// Rounds the f32 pattern `bits` in a block of `row` with the random word `r`: the bits
    /// the scalar rule stores, and whether the element must be redone by the scalar rule
    /// instead (see the module docs). Branch-free, so loops over it vectorise.
    #[inline(always)]
    pub fn round_lane(bits: u32, r: u32, row: SrRow, sr: SrBits) -> (u32, bool) {
        let sign = bits & SIGN;
        let a = f32::from_bits(bits ^ sign);
        let q = a * row.inv;
        // The binade of q, clamped to 0 ..= 3 (E2M1's subnormal step 1/2 covers q < 1; from
        // binade 3 on every result saturates).
        // The exponent field of 2^e (NaN's sign bit masked off).
        let e_field = (q.to_bits() & 0x7f80_0000).clamp(127 << 23, 130 << 23);
        let inv_u = f32::from_bits((255 << 23) - e_field); // 2^(1 - e)
        let u = f32::from_bits(e_field - (1 << 23)); // 2^(e - 1)
        let t = q * inv_u;
        let floor = t.floor();
        let z = (t - floor) * sr.scale;
        let r1 = ((r >> (32 - sr.k)) + 1) as f32;
        let up = r1 <= z;
        let v = ((floor + if up { 1.0 } else { 0.0 }) * u).min(6.0);
        let mag = v.mul_add(row.d_hi, v * row.d_lo).to_bits();
        // Near r + 1, or near 0 when r + 1 = 2^k: `z < band + (r + 1 - 2^k)` holds only then
        // (otherwise `r + 1 - 2^k <= -1`). A NaN `z` is near: the negated compare holds for
        // it. `z` is NaN exactly when `q` is not finite: Inf and NaN inputs (only in NaN
        // blocks, whose `1/d` is 0) and every element of a block whose `1/d` is NaN; all go
        // to the scalar rule (a NaN `q` is not 0).
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let close = !((z - r1).abs() >= sr.band);
        let near = close | (z < sr.band + (r1 - sr.scale));
        let flag = near & (q != 0.0);
        let out = ((mag | sign) & !row.nan) | (NAN_BITS & row.nan);
        (out, flag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::rounding::Stochastic;
    use crate::format::Nvfp4;

    /// The lane step equals the scalar rule wherever it does not flag, on quotients that are
    /// exactly the decision boundaries `lo + (r + 1) u / 2^k` and their f32 neighbours (where
    /// the estimate can fall on either side), and flags some of them where it would be
    /// wrong.
    #[test]
    fn unflagged_lanes_equal_the_scalar_rule_on_decision_boundaries() {
        let mut flagged = 0;
        let mut wrong_if_unflagged = 0;
        let mut checked = 0;
        for s_t in [3.0 * 2f64.powi(-10), 5.0 / 8.0, 7.0 * 2f64.powi(-20), 1.0] {
            let plan = Nvfp4SrPlan::new(s_t);
            for code in [1usize, 9, 56, 77, 126] {
                let row = plan.row(code);
                let s_b = Nvfp4Scales::block_scale(code);
                let d = s_b * s_t;
                for k in [2u32, 4, 9] {
                    let rule = Stochastic { bits: k };
                    let lows = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
                    let units = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0];
                    for (&lo, &u) in lows.iter().zip(&units) {
                        for j in 0..(1u32 << k) {
                            let target = lo + (j + 1) as f64 * u / (1u32 << k) as f64;
                            let x = (target * d) as f32;
                            let r = j << (32 - k);
                            let near = [x.to_bits() - 1, x.to_bits(), x.to_bits() + 1];
                            for x in near.map(f32::from_bits) {
                                for x in [x, -x] {
                                    let (got, flag) = Nvfp4SrPlan::round_lane(
                                        x.to_bits(),
                                        r,
                                        row,
                                        SrBits::new(k),
                                    );
                                    let want = Nvfp4::round(x as f64, s_b, s_t, rule, r) as f32;
                                    checked += 1;
                                    if flag {
                                        flagged += 1;
                                        wrong_if_unflagged += (got != want.to_bits()) as u32;
                                    } else {
                                        assert_eq!(
                                            got,
                                            want.to_bits(),
                                            "s_t {s_t:e} code {code} k {k} x {x:e} r {r:#x}"
                                        );
                                    }
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
