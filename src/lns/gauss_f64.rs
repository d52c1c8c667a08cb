//! The exactly rounded Gaussian logarithms ([`GaussLog::Ideal`](super::GaussLog::Ideal) and
//! [`GaussLog::Truncated`](super::GaussLog::Truncated)) for `11 <= f <= 30`, evaluated in
//! f64 with a proven error bound and decided exactly ([`super::exact`]) only where the f64
//! value lies within that bound of a rounding boundary.
//!
//! # Evaluation
//!
//! For `z = -u <= 0` (units of `2^-f`), `u = q 2^f + r` with `0 <= r < 2^f`:
//!
//! * `t = 2^(-u/2^f) = 2^-q · H[r >> l] · L[r mod 2^l]`, from two tables of
//!   `H[i] = 2^(-i 2^l / 2^f)` and `L[j] = 2^(-j / 2^f)` (`l = f / 2`), each entry the f64
//!   nearest to a 128-bit lower bound within 256 units of `2^-127` of the true value
//!   ([`crate::format::lns_approx::exp2_fraction`]): relative error at most
//!   `2^-53 (1 + 2^-60)`. The product adds one more rounding and `2^-q` is exact (`t` stays
//!   above `2^-32` wherever it is evaluated), so `t = t_true (1 + e_t)`,
//!   `|e_t| <= 3.01 · 2^-53`.
//! * `w = 1 + t` (sb) or `w = 1 - t` (db), one rounding `|rho| <= 2^-53` (none for
//!   `t >= 1/2`, Sterbenz): `w = w_true (1 + a)(1 + rho)` with `|a| <= 3.01 · 2^-53 t / w`.
//! * `log2 w = e + log2(m / 2^52)`, `e` and `m` the exponent and 53-bit significand of `w`
//!   (exact), the second term by [`log2_significand`] within [`LOG2_ERROR`].
//!
//! The error of the computed `log2 w` is therefore below
//! `LOG2_ERROR + log2(e) (|a| + |rho|) (1 + 2^-19) <= LOG2_ERROR + 2^-52 (1 + 3 t / w)`
//! (`|a| < 2^-19` for every `u >= 1` up to `f = 30`), and in units of `2^-f` below
//! `2^f` times that. `v = 2^f log2(m / 2^52)` is an exact scaling, and `e 2^f` is an exact
//! integer, so only `v`'s fraction decides the rounding: nearest needs it away from `1/2`,
//! truncation away from 0 and 1, each by more than the bound, which the code takes twice as
//! large to cover the rounding of its own computation, with `t / w` replaced by
//! `2^-e >= 1 / w > t / w` (`e` the exponent of `w`, so `w >= 2^e`, and `t < 1`): a bound at
//! most twice as wide next to the singularity, without a division. Inside it the exact evaluation
//! decides. For `f = 23` the bound is about `2^-20` units away from the singularity of db,
//! so the exact path is rare.
//!
//! Near the singularity (`1 - t` small) the bound grows like `2^f / u`; the first
//! [`NEAR`] values of db (`1 <= u < NEAR`) are tabulated exactly at construction instead.
//! Past `u >= (f+2) 2^f` the values are known without evaluation (0, or -1 for a truncated
//! db; see [`super::exact::gauss_log`]).
//!
//! The fast matrix product evaluates many lanes at once (`GaussF64::sum_lane`): the same
//! function written without branches (the table reads unchecked, the halving in the
//! logarithm a select, the cases above selects or "undecided"), so each lane performs the
//! same IEEE operations in the same order as the scalar evaluation, in a vector register,
//! and the bound above holds for it unchanged.

use crate::format::lns_approx::{exp2_fraction, log2_unit, LOG2_ERROR};

use super::exact::{gauss_log, Direction, Gauss};

/// The number of db values next to the singularity tabulated exactly.
pub(crate) const NEAR: usize = 1 << 10;

/// The smallest `f` the f64 evaluation serves (below it the exact tables of every `z` are
/// small enough).
pub(crate) const MIN_F: u32 = 11;
/// The largest `f`: [`exp2_fraction`]'s.
pub(crate) const MAX_F: u32 = crate::format::lns_approx::MAX_FRACTION_BITS;

/// sb and db of one `f`, rounded in one direction, by f64 evaluation (see the module docs).
#[derive(Debug)]
pub(crate) struct GaussF64 {
    f: u32,
    dir: Direction,
    /// `2^f`.
    scale: f64,
    /// `(f+2) 2^f`: from this `u` on, sb and db are their far values.
    far: i64,
    sb_far: i64,
    db_far: i64,
    /// Bits of `r` indexing the low table.
    low_bits: u32,
    high: Vec<f64>,
    low: Vec<f64>,
    /// `db(-u)` for `1 <= u < NEAR` (entry 0 unused).
    near: Vec<i64>,
}

/// `2^(-s / 2^f)` for `0 <= s < 2^f`, the f64 nearest to a lower bound within `2^-119` relative.
fn neg_exp2(s: u64, f: u32) -> f64 {
    if s == 0 {
        return 1.0;
    }
    // 2^(-s/2^f) = 2^((2^f - s)/2^f) / 2, and exp2_fraction bounds 2^127 times the power.
    let y = exp2_fraction((1u64 << f) - s, f);
    (y as f64) * 2f64.powi(-128)
}

impl GaussF64 {
    /// The tables for `f` in `MIN_F..=MAX_F` and rounding direction `dir`.
    pub(crate) fn new(f: u32, dir: Direction) -> Self {
        assert!((MIN_F..=MAX_F).contains(&f), "f = {f} outside the f64 path");
        let low_bits = f / 2;
        let high = (0..1u64 << (f - low_bits))
            .map(|i| neg_exp2(i << low_bits, f))
            .collect();
        let low = (0..1u64 << low_bits).map(|j| neg_exp2(j, f)).collect();
        let near = (0..NEAR as i64)
            .map(|u| match u {
                0 => 0,
                u => gauss_log(Gauss::Difference, -u, f, dir),
            })
            .collect();
        let far = (f as i64 + 2) << f;
        GaussF64 {
            f,
            dir,
            scale: (1u64 << f) as f64,
            far,
            sb_far: gauss_log(Gauss::Sum, -far, f, dir),
            db_far: gauss_log(Gauss::Difference, -far, f, dir),
            low_bits,
            high,
            low,
            near,
        }
    }

    /// `t = 2^(-u/2^f)` for `0 <= u < far`.
    #[inline(always)]
    fn pow(&self, u: i64) -> f64 {
        debug_assert!((0..self.far).contains(&u));
        let q = u >> self.f;
        let r = (u & ((1 << self.f) - 1)) as usize;
        // SAFETY: `r < 2^f`, so `r >> low_bits < 2^(f - low_bits) = high.len()` and
        // `r mod 2^low_bits < low.len()` (unchecked so that lanes gather without branches).
        let (h, l) = unsafe {
            (
                *self.high.get_unchecked(r >> self.low_bits),
                *self.low.get_unchecked(r & ((1 << self.low_bits) - 1)),
            )
        };
        // 2^-q exactly (q <= f + 1 <= 31).
        h * l * f64::from_bits(((1023 - q) as u64) << 52)
    }

    /// The integer of `2^f log2 w` rounded in this direction, or `None` when the estimate
    /// is within its error bound of a boundary (`w = 1 ± t`, `0 < t < 1`).
    #[inline(always)]
    fn round_log(&self, w: f64) -> Option<i64> {
        let (n, decided) = self.round_log_lane(w);
        decided.then_some(n)
    }

    /// [`GaussF64::round_log`] without branches: the rounded integer and whether it is
    /// decided (false within the error bound of a boundary, where the integer is
    /// meaningless). `log2(m / 2^52)` is [`log2_unit`] of `w`'s significand as an f64 in
    /// `[1, 2)`, the same value [`log2_significand`](crate::format::lns_approx::log2_significand)
    /// computes from the integer `m`.
    #[inline(always)]
    fn round_log_lane(&self, w: f64) -> (i64, bool) {
        const FRACTION: u64 = (1 << 52) - 1;
        let bits = w.to_bits();
        let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
        let unit = f64::from_bits((bits & FRACTION) | 1f64.to_bits());
        let v = log2_unit(unit) * self.scale;
        // 2^-e >= t / w (see the module docs): -e <= 33 for every w formed here.
        let inv_w = f64::from_bits(((1023 - e) as u64) << 52);
        let bound = 2.0 * self.scale * (LOG2_ERROR + f64::EPSILON * (1.0 + 3.0 * inv_w));
        // SAFETY: `w` lies in (0, 2] (`t` in (0, 1]), so `log2_unit` lies in [0, 1] and
        // 0 <= v <= 2^f <= 2^30: the truncation to i32 is defined, exact, and the floor.
        let fl: i32 = unsafe { v.to_int_unchecked() };
        let fr = v - f64::from(fl);
        let nearest = self.dir == Direction::Nearest;
        let n = i64::from(fl) + i64::from(nearest & (fr > 0.5));
        let decided = if nearest {
            (fr - 0.5).abs() > bound
        } else {
            fr > bound && fr < 1.0 - bound
        };
        ((e << self.f) + n, decided)
    }

    /// [`GaussF64::sum`] without branches, for many lanes at once: the value and whether it
    /// is decided. `u >= far` and a sum at `u = 0` are selected as `sum` returns them;
    /// undecided (the value meaningless): a difference with `u < NEAR` (`sum`'s near
    /// table, rare in a product) and estimates within the bound of a boundary (`sum`'s exact
    /// fallback). Where decided, the value is `sum(u, same)`: the same operations on the
    /// same numbers.
    #[inline(always)]
    pub(crate) fn sum_lane(&self, u: i64, same: bool) -> (i64, bool) {
        let far = u >= self.far;
        let inside = u >= 1 && !far && (same || u >= NEAR as i64);
        // Any u inside keeps the table reads in bounds for the other lanes.
        let t = self.pow(if inside { u } else { 1 });
        let w = 1.0 + if same { t } else { -t };
        let (n, decided) = self.round_log_lane(w);
        let far_value = if same { self.sb_far } else { self.db_far };
        let doubling = same & (u == 0);
        let value = if far {
            far_value
        } else if doubling {
            1 << self.f
        } else {
            n
        };
        (value, far | doubling | (inside & decided))
    }

    /// `sb(-u)` when `same`, else `db(-u)` (0 at `u = 0`): `w = 1 ± t` chosen without a
    /// branch.
    #[inline(always)]
    pub(crate) fn sum(&self, u: i64, same: bool) -> i64 {
        if u >= self.far {
            return if same { self.sb_far } else { self.db_far };
        }
        if !same && (u as usize) < NEAR {
            return self.near[u as usize];
        }
        if u == 0 {
            return 1 << self.f;
        }
        let t = self.pow(u);
        let w = 1.0 + if same { t } else { -t };
        self.round_log(w).unwrap_or_else(|| {
            let op = if same { Gauss::Sum } else { Gauss::Difference };
            gauss_log(op, -u, self.f, self.dir)
        })
    }

    /// `sb(-u)` for `u >= 0`.
    #[cfg(test)]
    pub(crate) fn sb(&self, u: i64) -> i64 {
        self.sum(u, true)
    }

    /// `db(-u)` for `u >= 1`.
    #[cfg(test)]
    pub(crate) fn db(&self, u: i64) -> i64 {
        self.sum(u, false)
    }

    #[cfg(test)]
    /// `sb(-u)` by the f64 path alone, `None` where it would decide exactly: for tests of
    /// the bound.
    pub(crate) fn sb_estimate(&self, u: i64) -> Option<i64> {
        (u > 0 && u < self.far).then(|| self.round_log(1.0 + self.pow(u)))?
    }

    #[cfg(test)]
    /// `db(-u)` by the f64 path alone (no near table), `None` where it would decide
    /// exactly: for tests of the bound.
    pub(crate) fn db_estimate(&self, u: i64) -> Option<i64> {
        (u > 0 && u < self.far).then(|| self.round_log(1.0 - self.pow(u)))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = self.0;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        }
    }

    const DIRS: [Direction; 2] = [Direction::Nearest, Direction::Floor];

    #[test]
    fn the_table_entries_are_the_f64_powers() {
        for f in [MIN_F, 23, MAX_F] {
            let g = GaussF64::new(f, Direction::Nearest);
            let mut rng = Rng(f as u64);
            for _ in 0..2000 {
                let u = (rng.next() % g.far as u64) as i64;
                let want = (-(u as f64) / g.scale).exp2();
                let got = g.pow(u);
                assert!(
                    ((got - want) / want).abs() < 8.0 * f64::EPSILON,
                    "f = {f}, u = {u}: {got} against {want}"
                );
            }
        }
    }

    #[test]
    fn sums_and_differences_equal_the_exact_roundings_on_samples() {
        for f in [MIN_F, 12, 16, 20, 23, 27, MAX_F] {
            for dir in DIRS {
                let g = GaussF64::new(f, dir);
                let mut rng = Rng(1000 + f as u64);
                let mut us: Vec<i64> = (0..3000)
                    .map(|i| {
                        // Half the samples near the singularity and past the near table.
                        let span = if i % 2 == 0 {
                            g.far + 10
                        } else {
                            1 << (f / 2 + 4)
                        };
                        (rng.next() % span as u64) as i64
                    })
                    .collect();
                us.extend([
                    0,
                    1,
                    2,
                    (1 << f) - 1,
                    1 << f,
                    (1 << f) + 1,
                    g.far - 1,
                    g.far,
                ]);
                us.extend(NEAR as i64 - 2..NEAR as i64 + 2);
                for u in us {
                    let sb = gauss_log(Gauss::Sum, -u, f, dir);
                    assert_eq!(g.sb(u), sb, "sb f = {f} {dir:?} u = {u}");
                    if u > 0 {
                        let db = gauss_log(Gauss::Difference, -u, f, dir);
                        assert_eq!(g.db(u), db, "db f = {f} {dir:?} u = {u}");
                    }
                }
            }
        }
    }

    /// The lanes' evaluation: where it claims a value, the value is the scalar `sum`'s (the
    /// exact rounding); it decides every sum at `u = 0` and past the far end, and leaves
    /// undecided at most half of the samples (a third lie next to the singularity). Fails when a select or the bound of the lanes is wrong.
    #[test]
    fn the_lanes_evaluation_is_the_sum_where_decided() {
        for f in [MIN_F, 16, 23, MAX_F] {
            for dir in DIRS {
                let g = GaussF64::new(f, dir);
                let mut rng = Rng(500 + f as u64);
                let mut us: Vec<i64> = (0..4000)
                    .map(|i| match i % 3 {
                        0 => (rng.next() % (g.far as u64 + 100)) as i64,
                        1 => (rng.next() % (4 * NEAR as u64)) as i64,
                        _ => g.far + (rng.next() % 1000) as i64 - 500,
                    })
                    .collect();
                us.extend([
                    0,
                    1,
                    NEAR as i64 - 1,
                    NEAR as i64,
                    g.far - 1,
                    g.far,
                    1 << 40,
                ]);
                let mut undecided = 0;
                for &u in &us {
                    for same in [true, false] {
                        let (v, decided) = g.sum_lane(u, same);
                        if decided {
                            assert_eq!(v, g.sum(u, same), "f = {f} {dir:?} u = {u} same {same}");
                        } else {
                            undecided += 1;
                            let near = !same && u < NEAR as i64;
                            assert!(
                                near || u >= 1,
                                "f = {f} {dir:?} u = {u} same {same} left undecided"
                            );
                        }
                    }
                }
                // A third of the samples lie next to the singularity, where at f = 30 the
                // bound exceeds a unit for the differences: at most half stay undecided.
                assert!(
                    undecided < us.len(),
                    "f = {f} {dir:?}: {undecided} of {} undecided",
                    2 * us.len()
                );
            }
        }
    }

    /// Without the near table, the f64 path's error grows like `2^f / u` next to the
    /// singularity of db: at `f = 30` it is many units for small `u`, so every value the
    /// estimate claims must still be exact, and many must be left to the exact decision.
    /// This fails when the bound is dropped or too small.
    #[test]
    fn the_bound_leaves_every_doubtful_difference_to_the_exact_decision() {
        for f in [23, MAX_F] {
            for dir in DIRS {
                let g = GaussF64::new(f, dir);
                let mut undecided = 0;
                for u in 1..3000 {
                    match g.db_estimate(u) {
                        Some(d) => assert_eq!(
                            d,
                            gauss_log(Gauss::Difference, -u, f, dir),
                            "f = {f} {dir:?} u = {u}"
                        ),
                        None => undecided += 1,
                    }
                }
                // At f = 30 the error reaches many units for small u.
                assert!(
                    f < MAX_F || undecided > 100,
                    "f = {f} {dir:?}: only {undecided} left undecided"
                );
            }
        }
    }

    /// Values within a small distance of a rounding boundary, found with the exact
    /// evaluation at `f + 10` bits (`2^10 sb_f(z) = sb_(f+10)(2^10 z)`): the estimate either
    /// agrees with the exact rounding or leaves the decision.
    #[test]
    fn sums_near_a_rounding_boundary_are_decided_exactly() {
        let f = 30;
        let g = 10;
        for dir in DIRS {
            let fast = GaussF64::new(f, dir);
            let mut rng = Rng(77);
            let mut near = 0;
            let mut undecided = 0;
            for _ in 0..100_000 {
                let u = 1 + (rng.next() % (fast.far as u64 - 1)) as i64;
                // The fraction of sb in units of 2^-g, from the f64 estimate: only candidates
                // near the boundary go to the (slow) finer exact evaluation.
                let t = fast.pow(u);
                let v = (1.0 + t).log2() * fast.scale;
                let fr = v - v.floor();
                let target = if dir == Direction::Nearest { 0.5 } else { 0.0 };
                let dist = (fr - target).abs().min((fr - target - 1.0).abs());
                if dist > 1e-3 {
                    continue;
                }
                let fine = gauss_log(Gauss::Sum, -(u << g), f + g, Direction::Floor);
                let boundary = if dir == Direction::Nearest {
                    1 << (g - 1)
                } else {
                    0
                };
                let off = (fine.rem_euclid(1 << g) - boundary).abs();
                if off > 2 && off < (1 << g) - 2 {
                    continue;
                }
                near += 1;
                match fast.sb_estimate(u) {
                    Some(s) => assert_eq!(s, gauss_log(Gauss::Sum, -u, f, dir), "u = {u}"),
                    None => undecided += 1,
                }
                assert_eq!(fast.sb(u), gauss_log(Gauss::Sum, -u, f, dir), "u = {u}");
            }
            assert!(near > 0, "{dir:?}: no sample within 2^-{g} of a boundary");
            assert!(
                undecided > 0,
                "{dir:?}: no sample left to the exact decision"
            );
        }
    }
}
