//! Tables for lns formats with few fraction bits (`f <= 10`): the f64 values of the
//! fractions `2^(r/2^f)`, and the f64 boundaries of nearest rounding, so that converting a
//! code to f64 and an f64 to its nearest code are a look-up, a multiplication or an add.
//! Built on first use for each `f`, from the exact paths they replace.
//!
//! # Values
//!
//! For `k = q 2^f + r` (`0 <= r < 2^f`) with `q` a normal f64 exponent (`-1022..=1023`),
//! the correctly rounded `2^(k/2^f) = 2^q 2^(r/2^f)` is the 53-bit rounding of
//! `2^(r/2^f)` (which does not depend on `q`) times `2^q`. So it is `V[r] 2^q` with
//! `V[r]` the exact path's value at `k = r`, and the product is exact (a normal result, or
//! `+inf` exactly where the exact path overflows too: `V[r] = 2` at `q = 1023`).
//!
//! # Nearest rounding
//!
//! The nearest `k` to a normal `x = 2^e m` (`1 <= m < 2`) is `e 2^f + j`, `j` the number of
//! boundaries `M_i = 2^((i + 1/2)/2^f)` (`0 <= i < 2^f`) below `m` (ties cannot happen:
//! `M_i` is irrational). `C_i`, the smallest f64 above `M_i`, is found by asking the exact
//! rounding ([`Lns::round_code`]) about an estimate and its neighbours; then `m > M_i`
//! exactly when `m >= C_i`. The count is read in two steps: the significand's top `f + 1`
//! fraction bits pick a bucket of width `2^-(f+1)`, and since the boundaries lie at least
//! `M_(i+1) - M_i > ln 2 / 2^f > 2^-(f+1)` apart, at most one of them lies inside a
//! bucket: the count is the number below the bucket's start plus one comparison with the
//! next boundary. Results outside the format's range (and zeros, subnormals, infinities,
//! NaN) are left to the exact path.

use std::sync::OnceLock;

use super::lns::{Lns, LnsCode};
use super::rounding::NearestEven;

/// The largest `f` with tables.
pub(crate) const MAX_F: u32 = 10;

const MANT_BITS: u32 = 52;
const MANT_MASK: u64 = (1 << MANT_BITS) - 1;

/// `V[r]`, the f64 of `2^(r/2^f)`, for each `f <= MAX_F`.
static VALUES: [OnceLock<Vec<f64>>; MAX_F as usize + 1] = [const { OnceLock::new() }; 11];

/// The boundaries of nearest rounding for each `f <= MAX_F`.
static NEAREST: [OnceLock<Boundaries>; MAX_F as usize + 1] = [const { OnceLock::new() }; 11];

/// The boundaries of nearest rounding of one `f` (module docs).
struct Boundaries {
    /// The fraction bits of `C_i` (`1 <= C_i < 2`), then `2^52` (above every significand).
    c: Vec<u64>,
    /// For each bucket of the top `f + 1` fraction bits, how many `C_i` lie at or below
    /// its start.
    below: Vec<u16>,
}

/// The f64 of `2^(k/2^f)` for `f <= MAX_F` and `k / 2^f` (rounded down) a normal f64
/// exponent; `None` otherwise. `exact` is the exact path, which fills the table.
#[inline]
pub(crate) fn value(k: i64, f: u32, exact: fn(i64, u32) -> f64) -> Option<f64> {
    let q = k >> f;
    if f > MAX_F || !(-1022..=1023).contains(&q) {
        return None;
    }
    let v = VALUES[f as usize].get_or_init(|| (0..1i64 << f).map(|r| exact(r, f)).collect());
    let r = (k & ((1 << f) - 1)) as usize;
    Some(v[r] * super::grid::pow2(q as i32))
}

/// The nearest code of `lns` to `x` (`f <= MAX_F`) when `x` is normal and the code lies in
/// the range; `None` otherwise.
#[inline]
pub(crate) fn nearest(lns: Lns, x: f64) -> Option<(bool, i64)> {
    let f = lns.f();
    if f > MAX_F {
        return None;
    }
    let bits = x.to_bits();
    let biased = ((bits >> MANT_BITS) & 0x7ff) as i64;
    if biased == 0 || biased == 0x7ff {
        return None;
    }
    let t = NEAREST[f as usize].get_or_init(|| Boundaries::new(f));
    let m = bits & MANT_MASK;
    let j = t.below[(m >> (MANT_BITS - f - 1)) as usize] as usize;
    let count = j as i64 + i64::from(m >= t.c[j]);
    let k = ((biased - 1023) << f) + count;
    (lns.k_min()..=lns.k_max())
        .contains(&k)
        .then_some((bits >> 63 == 1, k))
}

impl Boundaries {
    fn new(f: u32) -> Self {
        // A format with this f whose range holds every k of [0, 2^f].
        let wide = Lns::new(32, f).expect("lns<32,f> is a format for f <= 10");
        let k_of = |m: f64| match wide.round_code(m, NearestEven, 0) {
            LnsCode::Value { k, .. } => k,
            other => unreachable!("1 <= m < 2 rounds to a value, not {other:?}"),
        };
        let scale = (1u64 << f) as f64;
        let mut c: Vec<u64> = (0..1i64 << f)
            .map(|i| {
                let mut m = ((i as f64 + 0.5) / scale).exp2();
                while k_of(m) <= i {
                    m = m.next_up();
                }
                while k_of(m.next_down()) > i {
                    m = m.next_down();
                }
                m.to_bits() & MANT_MASK
            })
            .collect();
        c.push(1 << MANT_BITS);
        let shift = MANT_BITS - f - 1;
        let below = (0..1u64 << (f + 1))
            .map(|b| c.iter().take_while(|&&ci| ci <= b << shift).count() as u16)
            .collect();
        Boundaries { c, below }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::rounding::NearestEven;

    /// The table's answer against the exact rounding, where the table answers.
    fn check(lns: Lns, x: f64) {
        if let Some((negative, k)) = nearest(lns, x) {
            let want = lns.round_code(x, NearestEven, 0);
            assert_eq!(
                LnsCode::Value { negative, k },
                want,
                "lns<{},{}> x = {x:e}",
                lns.w(),
                lns.f()
            );
        }
    }

    /// Every boundary and its neighbours, in several binades and both signs, and a sweep of
    /// significands, against the exact rounding; every value against the exact path.
    #[test]
    fn tables_equal_the_exact_paths() {
        for f in 0..=MAX_F {
            let lns = Lns::new((f + 6).max(8), f).unwrap();
            let t = NEAREST[f as usize].get_or_init(|| Boundaries::new(f));
            for &ci in &t.c[..t.c.len() - 1] {
                let m = f64::from_bits((1023 << MANT_BITS) | ci);
                for x in [m.next_down().next_down(), m.next_down(), m, m.next_up()] {
                    for e in [-3, 0, 1, 2] {
                        let x = x * 2f64.powi(e);
                        check(lns, x);
                        check(lns, -x);
                    }
                }
            }
            for i in 0..100_000u64 {
                let m = f64::from_bits(
                    (1023 << MANT_BITS) | (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & MANT_MASK),
                );
                check(lns, m);
                check(lns, m / 2.0);
            }
            let wide = Lns::new(32, f).unwrap();
            for k in (-(1i64 << (f + 4))..1 << (f + 4)).chain([-1022 << f, 1023 << f | 5]) {
                let got = value(k, f, |k, f| Lns::new(32, f).unwrap().value_exact(k));
                assert_eq!(
                    got.map(f64::to_bits),
                    Some(wide.value_exact(k).to_bits()),
                    "f = {f}, k = {k}"
                );
            }
        }
    }
}
