//! Exact decisions by interval arithmetic: bounds on `2^(j / 2^s)`, the sign of
//! `1 ± 2^(z/2^f) - 2^(c/2^(f+1))`, and from them the Gaussian logarithms rounded to nearest
//! or toward -inf.
//!
//! # Bounds on `2^(j/2^s)`
//!
//! At precision `p` every quantity is a pair of integers `lo <= v * 2^p <= hi`. The roots
//! `2^(2^-t)` come from a chain of integer square roots (`floor(sqrt(2^(2p+1)))`, then
//! `floor(sqrt(lo * 2^p))` and `floor(sqrt(hi * 2^p)) + 1`), and `2^(j/2^s)` with `j = q 2^s + r`,
//! `0 <= r < 2^s`, is `2^q` times the product of the roots `2^(2^-(s-i))` of the set bits `i`
//! of `r`, each product rounded down in `lo` and up in `hi`. Every step keeps the true value
//! inside `[lo, hi]`, so a comparison decided by disjoint intervals is exact. The Gaussian-log
//! comparisons run first in u128 at `p = 126` (values below 4; the roots are the 128-bit
//! ones rounded outward), then with big integers at 128 bits, and an undecided comparison
//! is repeated at twice the precision (256, 512, ... bits); it terminates
//! because the two sides are never equal except in the cases that are tested for up front:
//!
//! With `y = 2^(1/2^(f+1))`, whose minimal polynomial is `t^(2^(f+1)) - 2` (Eisenstein at 2),
//! the powers `1, y, ..., y^(2^(f+1)-1)` are linearly independent over the rationals. So
//! `1 ± y^(2z) = y^c` forces both exponents to be multiples of `2^(f+1)`, which leaves
//! `1 + 2^a = 2^b` and `1 - 2^a = 2^b` in integers: only `1 + 1 = 2` (`z = 0`, `sb = 2^f`)
//! and `1 - 1/2 = 1/2` (`z = -2^f`, `db = -2^f`). In particular sb and db are never an odd
//! multiple of a half unit, so rounding to nearest never meets a tie.

use std::cmp::Ordering;
use std::sync::OnceLock;

use num_bigint::BigUint;

/// Bits of precision of the first attempt at every decision.
const FIRST_PRECISION: u32 = 128;
/// The precision at which a decision gives up with a panic: a guard against an internal error
/// (the two sides of every comparison differ, see the module docs, so refinement ends; no
/// input in the tests needs more than the first precision's doublings).
const LAST_PRECISION: u32 = 1 << 16;
/// Most fraction bits `s` of an exponent `j / 2^s` that the root chain covers.
const MAX_ROOT_BITS: u32 = 64;
/// Most fraction bits `f` of the logarithm the Gaussian-log functions accept.
pub(crate) const MAX_GAUSS_F: u32 = 40;

/// `lo <= v * 2^p <= hi` for a positive real `v`.
struct Bounds {
    lo: BigUint,
    hi: BigUint,
}

/// `ceil(x / 2^n)`.
fn ceil_shr(x: BigUint, n: u32) -> BigUint {
    let round = (BigUint::from(1u32) << n) - 1u32;
    (x + round) >> n
}

/// Bounds on the roots `2^(2^-t)`, `t = 1..=MAX_ROOT_BITS`, at precision `p` (index `t - 1`).
fn roots(p: u32) -> Vec<Bounds> {
    let mut out: Vec<Bounds> = Vec::with_capacity(MAX_ROOT_BITS as usize);
    let lo = (BigUint::from(1u32) << (2 * p + 1)).sqrt();
    // sqrt(2) * 2^p is irrational, so it lies strictly above its floor.
    let hi = &lo + 1u32;
    out.push(Bounds { lo, hi });
    for _ in 1..MAX_ROOT_BITS {
        let prev = out.last().expect("the chain starts with one root");
        // sqrt(v) 2^p = sqrt(v 2^p * 2^p).
        let lo = (&prev.lo << p).sqrt();
        let hi = (&prev.hi << p).sqrt() + 1u32;
        out.push(Bounds { lo, hi });
    }
    out
}

/// The roots at the first precision, computed once.
fn first_roots() -> &'static [Bounds] {
    static ROOTS: OnceLock<Vec<Bounds>> = OnceLock::new();
    ROOTS.get_or_init(|| roots(FIRST_PRECISION))
}

/// Bounds on `2^(j / 2^s) * 2^p` from the roots at precision `p`. Needs `s <= 64`.
fn pow2(j: i64, s: u32, p: u32, roots: &[Bounds]) -> Bounds {
    debug_assert!(s <= MAX_ROOT_BITS);
    let q = if s == 64 {
        if j < 0 {
            -1
        } else {
            0
        }
    } else {
        j >> s
    };
    let r = (j as i128 - ((q as i128) << s)) as u128;
    let one = BigUint::from(1u32) << p;
    let (mut lo, mut hi) = (one.clone(), one);
    for i in 0..s {
        if (r >> i) & 1 == 1 {
            // Bit i weighs 2^(i - s): the root 2^(2^-(s - i)).
            let c = &roots[(s - i - 1) as usize];
            lo = (lo * &c.lo) >> p;
            hi = ceil_shr(hi * &c.hi, p);
        }
    }
    if q >= 0 {
        Bounds {
            lo: lo << q as u64,
            hi: hi << q as u64,
        }
    } else {
        let n = u32::try_from(-q).unwrap_or(u32::MAX);
        Bounds {
            lo: lo >> n,
            hi: ceil_shr(hi, n),
        }
    }
}

/// Runs `decide` at precisions 128, 256, ... bits until it returns an answer.
fn refine<T>(mut decide: impl FnMut(u32, &[Bounds]) -> Option<T>) -> T {
    if let Some(t) = decide(FIRST_PRECISION, first_roots()) {
        return t;
    }
    let mut p = 2 * FIRST_PRECISION;
    while p <= LAST_PRECISION {
        if let Some(t) = decide(p, &roots(p)) {
            return t;
        }
        p *= 2;
    }
    unreachable!("an exact comparison stayed undecided at {LAST_PRECISION} bits")
}

/// Orders two intervals; `None` when they overlap.
fn order(a_lo: &BigUint, a_hi: &BigUint, b_lo: &BigUint, b_hi: &BigUint) -> Option<Ordering> {
    if a_hi < b_lo {
        Some(Ordering::Less)
    } else if a_lo > b_hi {
        Some(Ordering::Greater)
    } else {
        None
    }
}

/// Which Gaussian logarithm: `sb` for `1 + B^z`, `db` for `|1 - B^z|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gauss {
    /// `sb(z) = log_B(1 + B^z)`.
    Sum,
    /// `db(z) = log_B |1 - B^z|`.
    Difference,
}

/// Rounding of a Gaussian logarithm to an integer number of units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// To the nearest integer (never a tie, see the module docs).
    Nearest,
    /// Toward -inf.
    Floor,
}

/// Fraction bits of the fast first stage's fixed point (values below 4 fit a u128).
const FAST_P: u32 = 126;

/// The roots `2^(2^-t)` as u128 bounds at [`FAST_P`] bits (from the big-integer chain).
fn fast_roots() -> &'static [(u128, u128)] {
    static ROOTS: OnceLock<Vec<(u128, u128)>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let to_u128 = |x: &BigUint| {
            let d = x.to_u64_digits();
            assert!(d.len() <= 2, "a root below 2 fits 128 bits");
            d.iter()
                .rev()
                .fold(0u128, |acc, &w| (acc << 64) | w as u128)
        };
        let shift = FIRST_PRECISION - FAST_P;
        first_roots()
            .iter()
            .map(|b| {
                let lo = &b.lo >> shift;
                let hi = ceil_shr(b.hi.clone(), shift);
                (to_u128(&lo), to_u128(&hi))
            })
            .collect()
    })
}

/// `floor(a b / 2^FAST_P)` and whether it was exact, for a product below `4 * 2^FAST_P`.
fn fast_mul(a: u128, b: u128) -> (u128, bool) {
    const M: u128 = (1 << 64) - 1;
    let (a1, a0, b1, b0) = (a >> 64, a & M, b >> 64, b & M);
    let (p00, p01, p10, p11) = (a0 * b0, a0 * b1, a1 * b0, a1 * b1);
    let mid = (p00 >> 64) + (p01 & M) + (p10 & M);
    let lo = (p00 & M) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    debug_assert!(hi < 1 << FAST_P, "a product below 4");
    let q = (hi << (128 - FAST_P)) | (lo >> FAST_P);
    (q, lo & ((1 << FAST_P) - 1) == 0)
}

/// Bounds on `2^(j / 2^s) * 2^FAST_P` in u128, or `None` when the value is not in
/// `[2^-100, 2)` (the fast stage leaves it to the big integers).
fn fast_pow2(j: i64, s: u32) -> Option<(u128, u128)> {
    let q = j >> s;
    if !(-100..=0).contains(&q) {
        return None;
    }
    let r = (j - (q << s)) as u64;
    let roots = fast_roots();
    let (mut lo, mut hi) = (1u128 << FAST_P, 1u128 << FAST_P);
    for i in 0..s {
        if (r >> i) & 1 == 1 {
            let (clo, chi) = roots[(s - i - 1) as usize];
            lo = fast_mul(lo, clo).0;
            let (h, exact) = fast_mul(hi, chi);
            hi = h + u128::from(!exact);
        }
    }
    let n = (-q) as u32;
    let up = u128::from(hi & ((1u128 << n) - 1) != 0);
    Some((lo >> n, (hi >> n) + up))
}

/// [`cmp_gauss`] in u128 fixed point; `None` when the bounds overlap or a value is out of the
/// fast stage's range.
fn fast_cmp_gauss(op: Gauss, z: i64, f: u32, c: i64) -> Option<Ordering> {
    let (tlo, thi) = fast_pow2(z, f)?;
    let one = 1u128 << FAST_P;
    let (lo, hi) = match op {
        Gauss::Sum => (one + tlo, one + thi),
        Gauss::Difference => (one.saturating_sub(thi), one - tlo),
    };
    // 2^(c/2^(f+1)) may reach [2, 4): compare half of both sides then.
    let (lo, hi, c) = if c > 0 {
        (lo >> 1, (hi >> 1) + (hi & 1), c - (1i64 << (f + 1)))
    } else {
        (lo, hi, c)
    };
    let (rlo, rhi) = fast_pow2(c, f + 1)?;
    if hi < rlo {
        Some(Ordering::Less)
    } else if lo > rhi {
        Some(Ordering::Greater)
    } else {
        None
    }
}

/// Orders `1 ± 2^(z / 2^f)` against `2^(c / 2^(f+1))` exactly, for `z <= 0` (`z < 0` for the
/// difference) and `f <= MAX_GAUSS_F`: by 126-bit fixed point in u128 first, then by big
/// integers at 128, 256, ... bits when that leaves it undecided.
fn cmp_gauss(op: Gauss, z: i64, f: u32, c: i64) -> Ordering {
    match op {
        Gauss::Sum if z == 0 && c == 1i64 << (f + 1) => return Ordering::Equal,
        Gauss::Difference if z == -(1i64 << f) && c == -(1i64 << (f + 1)) => {
            return Ordering::Equal
        }
        _ => {}
    }
    if let Some(o) = fast_cmp_gauss(op, z, f, c) {
        return o;
    }
    slow_cmp_gauss(op, z, f, c)
}

/// [`cmp_gauss`] by big integers only.
fn slow_cmp_gauss(op: Gauss, z: i64, f: u32, c: i64) -> Ordering {
    refine(|p, roots| {
        let t = pow2(z, f, p, roots);
        let one = BigUint::from(1u32) << p;
        let (lo, hi) = match op {
            Gauss::Sum => (&one + &t.lo, &one + &t.hi),
            Gauss::Difference => {
                // 0 < 1 - 2^x, so 0 is a valid lower bound when t.hi reaches 1.
                let lo = if t.hi < one {
                    &one - &t.hi
                } else {
                    BigUint::default()
                };
                (lo, &one - &t.lo)
            }
        };
        let r = pow2(c, f + 1, p, roots);
        order(&lo, &hi, &r.lo, &r.hi)
    })
}

/// `2^f * log2(1 ± 2^(z/2^f))` in f64: a starting guess within a few units.
fn estimate(op: Gauss, z: i64, f: u32) -> f64 {
    let scale = (f as f64).exp2();
    let x = z as f64 / scale;
    let ln = match op {
        Gauss::Sum => x.exp2().ln_1p(),
        Gauss::Difference => (-(x * std::f64::consts::LN_2).exp_m1()).ln(),
    };
    scale * ln / std::f64::consts::LN_2
}

/// The Gaussian logarithm `op` at `z` (units of `2^-f`) rounded to an integer number of
/// units. Needs `z <= 0` (`z < 0` for the difference) and `f <= MAX_GAUSS_F`.
///
/// For `z <= -(f+2) 2^f` the value lies in `(0, 1/(4 ln 2))` for the sum and in
/// `(-1/(3 ln 2), 0)` for the difference (from `ln(1+u) <= u` and `-ln(1-u) <= u/(1-u)` with
/// `u = 2^(z/2^f) <= 2^-(f+2)`), both inside half a unit of 0, so the answer is known without
/// evaluation.
pub(crate) fn gauss_log(op: Gauss, z: i64, f: u32, dir: Direction) -> i64 {
    debug_assert!(f <= MAX_GAUSS_F);
    debug_assert!(z < 0 || (z == 0 && op == Gauss::Sum));
    if z <= -((f as i64 + 2) << f) {
        return match (op, dir) {
            (Gauss::Difference, Direction::Floor) => -1,
            _ => 0,
        };
    }
    let guess = estimate(op, z, f);
    let mut m = match dir {
        Direction::Nearest => guess.round(),
        Direction::Floor => guess.floor(),
    } as i64;
    // The answer m satisfies lower(m) <= value < upper(m) in half units:
    // nearest: (2m - 1, 2m + 1); floor: [2m, 2m + 2).
    let (below, above) = match dir {
        Direction::Nearest => (-1, 1),
        Direction::Floor => (0, 2),
    };
    loop {
        if cmp_gauss(op, z, f, 2 * m + above) != Ordering::Less {
            m += 1;
        } else if cmp_gauss(op, z, f, 2 * m + below) == Ordering::Less {
            m -= 1;
        } else {
            return m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_bounds_contain_the_f64_roots() {
        for (i, b) in first_roots().iter().enumerate() {
            let t = i as i32 + 1;
            let want = (2f64).powf((2f64).powi(-t));
            let scale = (FIRST_PRECISION as f64).exp2();
            let lo = b.lo.to_string().parse::<f64>().unwrap() / scale;
            let hi = b.hi.to_string().parse::<f64>().unwrap() / scale;
            assert!(
                lo <= want * (1.0 + 1e-15) && hi >= want * (1.0 - 1e-15),
                "t = {t}"
            );
            assert!(
                &b.hi - &b.lo <= BigUint::from(64u32),
                "t = {t}: bounds too wide"
            );
        }
    }

    #[test]
    fn the_fast_stage_agrees_with_the_big_integers() {
        // SplitMix64 over z in [-(f+3) 2^f, 0] and c near 2 sb(z) or 2 db(z).
        let mut s = 3u64;
        let mut next = || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = s;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        let mut decided = 0;
        for f in [0u32, 1, 4, 10, 23, 30, 40] {
            for _ in 0..400 {
                let span = (f as u64 + 3) << f;
                let z = -((next() % span) as i64) - 1;
                for op in [Gauss::Sum, Gauss::Difference] {
                    let guess = (2.0 * estimate(op, z, f)).round() as i64;
                    for c in guess - 2..=guess + 2 {
                        if let Some(o) = fast_cmp_gauss(op, z, f, c) {
                            decided += 1;
                            assert_eq!(o, slow_cmp_gauss(op, z, f, c), "{op:?} {z} {f} {c}");
                        }
                    }
                }
            }
        }
        assert!(decided > 20_000, "the fast stage decided only {decided}");
    }

    #[test]
    fn the_exact_integer_cases_are_found() {
        for f in [0, 1, 5, 23, 40] {
            for dir in [Direction::Nearest, Direction::Floor] {
                assert_eq!(gauss_log(Gauss::Sum, 0, f, dir), 1 << f);
                assert_eq!(gauss_log(Gauss::Difference, -(1 << f), f, dir), -(1 << f));
            }
        }
    }
}
