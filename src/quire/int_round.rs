//! Rounding exact integer sums to a posit by table look-up: the last step of the integer
//! quire GEMMs ([`super::gemm_cpu::Accumulator::I16`]).
//!
//! An exact sum is an integer `t` in units `u = minpos^2`, and its output is
//! `R(t) = round(t · u)` (nearest, ties to the even pattern). `R` is a non-decreasing step
//! function of `t`. Split `|t|` by its bit length `L`: for `L <= K` the table holds `R` of
//! every `t`; for `L > K` the key is the top `K` bits `q = |t| >> (L - K)` and a sticky bit
//! (whether any lower bit is set). Two integers with one key lie in one of the intervals
//! `{q·2^sh}` or `(q·2^sh, (q+1)·2^sh)` (`sh = L - K`), and `R` is constant on the second
//! exactly when `R(q·2^sh + 1) = R((q+1)·2^sh - 1)`, its ends, since `R` is monotone. The
//! table is built only when that holds for every key (for some `K` up to 12),
//! so each entry is `R` of every integer with its key. Above the bit length where `R` has
//! reached its value at `2^53` (the posit saturates at maxpos), every `t` gets that value.
//! Negative sums have a table of their own, so nothing is assumed about symmetry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::format::grid::pow2;
use crate::format::rounding::NearestEven;
use crate::format::Posit;

/// The widest key tried (top bits of `|t|`).
const MAX_KEY_BITS: u32 = 12;

/// Sums of magnitude below `2^LIMIT_BITS` (the callers' exactness bound).
const LIMIT_BITS: u32 = 53;

/// The most entries a table may have.
const MAX_ENTRIES: usize = 1 << 16;

/// `R(t) = posit.round(t · 2^-2s)` for integer `t` with `|t| < 2^53`, by table (see the
/// module docs).
#[derive(Debug)]
pub struct IntRound {
    key_bits: u32,
    /// Magnitudes are capped here, `2^(top + 1) - 1`: every bit length above `top` gives
    /// the saturated values.
    cap: u64,
    /// Per sign (positive, negative): `R` of every `|t| < 2^key_bits`, then one block of
    /// `2^(key_bits + 1)` keys per bit length `key_bits + 1 ..= top + 1` (the last one all
    /// saturated values).
    tables: [Vec<f32>; 2],
}

impl IntRound {
    /// The table of `posit` (built once per process), or `None` where it would not be
    /// exact or small (see the module docs).
    pub fn get(posit: Posit) -> Option<Arc<IntRound>> {
        type Cache = Mutex<HashMap<Posit, Option<Arc<IntRound>>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let mut cache = CACHE.get_or_init(Default::default).lock().ok()?;
        cache
            .entry(posit)
            .or_insert_with(|| IntRound::build(posit).map(Arc::new))
            .clone()
    }

    fn build(posit: Posit) -> Option<IntRound> {
        let unit = pow2(-2 * posit.max_scale());
        let r = |t: i64| posit.round(t as f64 * unit, NearestEven, 0);
        (1..=MAX_KEY_BITS).find_map(|k| IntRound::with_key(&r, k))
    }

    fn with_key(r: &impl Fn(i64) -> f64, k: u32) -> Option<IntRound> {
        let f32_of = |v: f64| -> Option<f32> { (f64::from(v as f32) == v).then_some(v as f32) };
        let mut tables = [Vec::new(), Vec::new()];
        let mut saturated = [0f32; 2];
        let mut top = [0u32; 2];
        for (side, sign) in [1i64, -1].into_iter().enumerate() {
            let rs = |t: i64| r(sign * t);
            let end = rs((1i64 << LIMIT_BITS) - 1);
            // The smallest bit length from which every `|t|` rounds to `end`.
            let first = (k + 1..=LIMIT_BITS).find(|&l| rs(1i64 << (l - 1)) == end)?;
            let table = &mut tables[side];
            for t in 0..1i64 << k {
                table.push(f32_of(rs(t))?);
            }
            for l in k + 1..first {
                let sh = l - k;
                for q in 1i64 << (k - 1)..1i64 << k {
                    let lo = q << sh;
                    let hi = (q + 1) << sh;
                    if rs(lo + 1) != rs(hi - 1) {
                        return None;
                    }
                    table.push(f32_of(rs(lo))?);
                    table.push(f32_of(rs(lo + 1))?);
                }
                if table.len() > MAX_ENTRIES {
                    return None;
                }
            }
            saturated[side] = f32_of(end)?;
            top[side] = first - 1;
        }
        // One `top` for both signs: the larger, the smaller side's extra bit lengths
        // holding its saturated value, and one more length of saturated values for the cap.
        let t = top[0].max(top[1]);
        for (side, table) in tables.iter_mut().enumerate() {
            let want = (1usize << k) + (t + 1 - k) as usize * (1usize << k);
            table.resize(want, saturated[side]);
        }
        // The key of 0 is 0 on both sides: `R(0)`.
        (tables[0][0] == tables[1][0]).then_some(())?;
        Some(IntRound {
            key_bits: k,
            cap: (1u64 << (t + 1)) - 1,
            tables,
        })
    }

    /// `R(t)` as the f32 the posit value is (`|t| < 2^53`).
    #[inline]
    pub fn round(&self, t: i64) -> f32 {
        let side = usize::from(t < 0);
        let mag = t.unsigned_abs().min(self.cap);
        let len = u64::BITS - (mag | 1).leading_zeros();
        let k = self.key_bits;
        let idx = if len <= k {
            mag as usize
        } else {
            let sh = len - k;
            let q = (mag >> sh) as usize - (1usize << (k - 1));
            let sticky = usize::from(mag & ((1u64 << sh) - 1) != 0);
            (1usize << k) + (((len - k - 1) as usize) << k) + 2 * q + sticky
        };
        self.tables[side][idx]
    }
}
