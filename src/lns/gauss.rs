//! The Gaussian logarithms `sb(z) = log_B(1 + B^z)` and `db(z) = log_B|1 - B^z|` on the
//! code grid: exact and rounded to nearest ([`GaussLog::Ideal`]), exact and truncated
//! ([`GaussLog::Truncated`]), or from tables ([`GaussLog::Table`]).
//!
//! Arguments and results are integers in units of the last place of `k` (`2^-f` in log2).
//! Both functions are evaluated for `z <= 0` and extended to `z > 0` by the identities
//! `sb(z) = z + sb(-z)` and `db(z) = z + db(-z)`, which every implementation applies to its
//! own value at `-z`.
//!
//! # The table implementation
//!
//! It mirrors `sbdb_ufunc_interpsbcotrdb_g*` of the `xlns` project's `xlnsconf`
//! (`interp_cotran_ufunc.py`): linear interpolation of sb, and Arnold's cotransformation of db,
//! with `J = f - grid_bits`:
//!
//! * sb: a table `T[i] = round(2^g sb(-i 2^J))` (`g` guard bits) on the grid of multiples
//!   of `2^J`, down to `z = -(f+g+2) 2^f` (below it the entry would be 0). For
//!   `z = zh + zl`, `zh` the grid point at or below `z` and `0 <= zl < 2^J`,
//!   `v = T(zh) + floor((T(zh + 2^J) - T(zh)) zl / 2^J)` (xlns's `((szhp1 - szh) * zl) >> J`),
//!   then `sb = floor((v + 2^(g-1)) / 2^g)` (xlns's rounding add and guard mask; `sb = v` for
//!   `g = 0`).
//! * db: for `-z = z2 + z1` with `z2` a multiple of `2^J` and `0 <= z1 < 2^J`,
//!   `1 - B^z = B^D2 (1 + B^(-z2 - D2 + D1))` with `D1 = db(-z1)`, `D2 = db(-z2)`, so
//!   `db(z) = D2 + sb(-z2 - D2 + D1)`, the sb from the interpolation above. `D1` comes from a
//!   table of the `2^J - 1` values next to the singularity and `D2` from a table on the grid
//!   (both rounded to nearest, no guard bits); `z2 = 0` gives `D1` and `z1 = 0` gives `D2`
//!   (the special cases xlns adds to its flawed first version).
//!
//! xlns's own defaults are `grid_bits = (f - 5) / 2` and no guard bits; its `_g2`, `_g4`,
//! `_g6` variants are `guard_bits` 2, 4, 6 (their `extra` variants, which also refine the
//! grid, are `grid_bits = (f + guard_bits - 5) / 2`). Differences from xlns: the table entries are rounded
//! exactly (xlns rounds an f64 evaluation), and the tables stop where the entries become 0
//! (xlns evaluates its "ideal" function everywhere).

use std::sync::{Arc, OnceLock};

use rayon::prelude::*;

use crate::format::lns::Lns;

use super::error::LnsError;
use super::exact::{self, Direction, Gauss};
use super::gauss_f64::GaussF64;

/// How an LNS adder evaluates the Gaussian logarithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GaussLog {
    /// sb and db rounded to the nearest unit exactly: the sum of two codes is the code
    /// nearest to the exact sum in the logarithm (correct rounding).
    Ideal,
    /// sb and db rounded toward -inf exactly: the sum's logarithm is truncated to the code
    /// grid, so the result's magnitude is never above the exact sum's.
    Truncated,
    /// Tables on a grid `2^-grid_bits` apart in log2, linear interpolation of sb with
    /// `guard_bits` extra fraction bits, cotransformation of db (see the module docs).
    /// Needs `grid_bits <= f`, `f - grid_bits <= 16` and `f + guard_bits <= 40`.
    Table {
        /// Fraction bits of the table grid (`J = f - grid_bits` bits of `z` are interpolated).
        grid_bits: u32,
        /// Extra fraction bits of the sb table's entries and of the interpolation.
        guard_bits: u32,
    },
}

/// The tables of [`GaussLog::Table`] for one format.
#[derive(Debug)]
pub(crate) struct Tables {
    /// `J`: the grid step is `2^J` units.
    j: u32,
    /// Guard bits of the sb table.
    g: u32,
    /// `sb[i] = round(2^g sb(-i 2^J))`; entries past the end are 0.
    sb: Vec<i64>,
    /// `db_grid[i] = round(db(-i 2^J))` for `i >= 1` (entry 0 unused); past the end 0.
    db_grid: Vec<i64>,
    /// `db_near[z1] = round(db(-z1))` for `1 <= z1 < 2^J` (entry 0 unused).
    db_near: Vec<i64>,
}

impl Tables {
    /// Largest `f - grid_bits`: the near-singularity db table has `2^J` entries.
    const MAX_J: u32 = 16;
    /// Largest number of grid entries per table.
    const MAX_GRID: u64 = 1 << 20;

    fn new(lns: Lns, grid_bits: u32, guard_bits: u32) -> Result<Self, LnsError> {
        let f = lns.f();
        let refuse = |reason: String| LnsError::Table {
            w: lns.w(),
            f,
            reason,
        };
        if grid_bits > f {
            return Err(refuse(format!(
                "grid_bits = {grid_bits} is finer than the format's f = {f} (valid: 0..={f})"
            )));
        }
        let j = f - grid_bits;
        if j > Self::MAX_J {
            return Err(refuse(format!(
                "f - grid_bits = {j} would need a table of 2^{j} values next to the singularity of db (valid: grid_bits >= f - {})",
                Self::MAX_J
            )));
        }
        if f + guard_bits > exact::MAX_GAUSS_F {
            return Err(refuse(format!(
                "f + guard_bits = {} exceeds {} (valid: guard_bits <= {})",
                f + guard_bits,
                exact::MAX_GAUSS_F,
                exact::MAX_GAUSS_F - f
            )));
        }
        let g = guard_bits;
        // Grid points down to -(f+g+2) 2^f (sb) and -(f+2) 2^f (db), where the entries reach 0.
        let sb_len = ((f + g + 2) as u64) << grid_bits;
        if sb_len > Self::MAX_GRID {
            return Err(refuse(format!(
                "(f + guard_bits + 2) 2^grid_bits = {sb_len} grid entries exceed {} (use fewer grid_bits)",
                Self::MAX_GRID
            )));
        }
        let db_len = ((f + 2) as u64) << grid_bits;
        let sb = (0..=sb_len as i64)
            .into_par_iter()
            .map(|i| exact::gauss_log(Gauss::Sum, -(i << j) << g, f + g, Direction::Nearest))
            .collect();
        let db_grid = (0..=db_len as i64)
            .into_par_iter()
            .map(|i| match i {
                0 => 0,
                i => exact::gauss_log(Gauss::Difference, -(i << j), f, Direction::Nearest),
            })
            .collect();
        let db_near = (0..1i64 << j)
            .into_par_iter()
            .map(|z1| match z1 {
                0 => 0,
                z1 => exact::gauss_log(Gauss::Difference, -z1, f, Direction::Nearest),
            })
            .collect();
        Ok(Tables {
            j,
            g,
            sb,
            db_grid,
            db_near,
        })
    }

    /// Below this `z` every table has ended (they reach `-(f+g+2) 2^f > -2^46`): sb and db
    /// are 0 there.
    const FAR: i64 = -(1 << 50);

    /// sb at `z <= 0`, with `g` guard bits, by interpolation.
    fn sb_fine(&self, z: i64) -> i64 {
        if z < Self::FAR {
            return 0;
        }
        let i = -(z >> self.j); // grid point zh = -i 2^J <= z
        let zl = z - ((z >> self.j) << self.j);
        let at = |i: i64| self.sb.get(i as usize).copied().unwrap_or(0);
        let lo = at(i);
        if zl == 0 {
            lo
        } else {
            lo + (((at(i - 1) - lo) * zl) >> self.j)
        }
    }

    /// sb at any `z`.
    fn sb(&self, z: i64) -> i64 {
        if z > 0 {
            return z + self.sb(-z);
        }
        let v = self.sb_fine(z);
        if self.g == 0 {
            v
        } else {
            (v + (1 << (self.g - 1))) >> self.g
        }
    }

    /// db at `z < 0` by cotransformation.
    fn db(&self, z: i64) -> i64 {
        if z < Self::FAR {
            return 0;
        }
        let u = -z;
        let z2 = (u >> self.j) << self.j;
        let z1 = u - z2;
        let near = |z1: i64| self.db_near[z1 as usize];
        if z2 == 0 {
            return near(z1);
        }
        let d2 = self
            .db_grid
            .get((z2 >> self.j) as usize)
            .copied()
            .unwrap_or(0);
        if z1 == 0 {
            return d2;
        }
        d2 + self.sb(-z2 - d2 + near(z1))
    }
}

/// sb and db at every `z` where they can differ from their far value, rounded exactly: the
/// evaluation of [`GaussLog::Ideal`] and [`GaussLog::Truncated`] for small `f`.
#[derive(Debug)]
pub(crate) struct ExactTables {
    /// `sb[-z]` for `-(f+2) 2^f < z <= 0`.
    sb: Vec<i64>,
    /// `db[-z]` for `-(f+2) 2^f < z < 0` (entry 0 unused).
    db: Vec<i64>,
    /// sb and db below the tables (0, and -1 for a truncated db).
    sb_far: i64,
    db_far: i64,
    /// `sb`, `sb_far`, `db`, `db_far` in one vector (the fast matrix product's look-up).
    both: Vec<i64>,
    /// The 32-bit lanes' table ([`super::lanes_i32::table`]).
    #[cfg(target_arch = "x86_64")]
    lane_table: Vec<i32>,
}

impl ExactTables {
    /// Largest `f` tabulated: `(f+2) 2^f` entries per function, 12 288 for `f = 10`.
    const MAX_F: u32 = 10;

    fn new(f: u32, dir: Direction) -> Self {
        let len = (f as i64 + 2) << f;
        let sb: Vec<i64> = (0..len)
            .into_par_iter()
            .map(|u| exact::gauss_log(Gauss::Sum, -u, f, dir))
            .collect();
        let db: Vec<i64> = (0..len)
            .into_par_iter()
            .map(|u| match u {
                0 => 0,
                u => exact::gauss_log(Gauss::Difference, -u, f, dir),
            })
            .collect();
        let sb_far = exact::gauss_log(Gauss::Sum, -len, f, dir);
        let db_far = exact::gauss_log(Gauss::Difference, -len, f, dir);
        let both = [&sb[..], &[sb_far], &db[..], &[db_far]].concat();
        ExactTables {
            #[cfg(target_arch = "x86_64")]
            lane_table: super::lanes_i32::table(&sb, sb_far, &db, db_far),
            sb,
            db,
            sb_far,
            db_far,
            both,
        }
    }

    /// Entries of each of the `sb` and `db` tables (`(f+2) 2^f`).
    pub(crate) fn len(&self) -> usize {
        self.sb.len()
    }

    /// The 32-bit lanes' table ([`super::lanes_i32::table`]).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn lane_table(&self) -> &[i32] {
        &self.lane_table
    }
}

/// A [`GaussLog`] ready to evaluate for one format (with its tables built).
#[derive(Debug, Clone)]
pub(crate) enum GaussEval {
    /// sb and db rounded exactly in direction `dir`, from tables for `f <= 10`, evaluated
    /// on every call above.
    Exact {
        dir: Direction,
        tables: Option<Arc<ExactTables>>,
    },
    Table(Arc<Tables>),
}

impl GaussEval {
    /// Builds the tables `gauss` needs for `lns`; refuses table parameters it cannot use.
    pub(crate) fn new(lns: Lns, gauss: GaussLog) -> Result<Self, LnsError> {
        let exact = |dir| GaussEval::Exact {
            dir,
            tables: (lns.f() <= ExactTables::MAX_F)
                .then(|| Arc::new(ExactTables::new(lns.f(), dir))),
        };
        Ok(match gauss {
            GaussLog::Ideal => exact(Direction::Nearest),
            GaussLog::Truncated => exact(Direction::Floor),
            GaussLog::Table {
                grid_bits,
                guard_bits,
            } => GaussEval::Table(Arc::new(Tables::new(lns, grid_bits, guard_bits)?)),
        })
    }

    /// sb at any `z` in units of `2^-f`.
    pub(crate) fn sb(&self, z: i64, f: u32) -> i64 {
        match self {
            GaussEval::Table(t) => t.sb(z),
            _ if z > 0 => z + self.sb(-z, f),
            GaussEval::Exact {
                tables: Some(t), ..
            } => {
                t.sb.get(z.unsigned_abs() as usize)
                    .copied()
                    .unwrap_or(t.sb_far)
            }
            GaussEval::Exact { dir, tables: None } => exact::gauss_log(Gauss::Sum, z, f, *dir),
        }
    }

    /// db at `z != 0` in units of `2^-f`.
    pub(crate) fn db(&self, z: i64, f: u32) -> i64 {
        debug_assert!(z != 0);
        if z > 0 {
            return z + self.db(-z, f);
        }
        match self {
            GaussEval::Table(t) => t.db(z),
            GaussEval::Exact {
                tables: Some(t), ..
            } => {
                t.db.get(z.unsigned_abs() as usize)
                    .copied()
                    .unwrap_or(t.db_far)
            }
            GaussEval::Exact { dir, tables: None } => {
                exact::gauss_log(Gauss::Difference, z, f, *dir)
            }
        }
    }
}

/// sb and db at `z = -u` (`u >= 0`), exactly as an arithmetic evaluates them: the interface
/// of the fast matrix product ([`super::lanes`]).
pub(crate) trait Sums: Sync {
    /// `sb(-u)` when `same` (operands of the same sign), else `db(-u)`; any value for
    /// `db` at `u = 0` (exact cancellation, which the caller handles).
    fn sum(&self, u: i64, same: bool) -> i64;
}

impl Sums for ExactTables {
    /// One look-up in `[sb..., sb_far, db..., db_far]`, without a branch on the signs.
    #[inline(always)]
    fn sum(&self, u: i64, same: bool) -> i64 {
        let len = self.sb.len();
        let i = (u as u64).min(len as u64) as usize + usize::from(!same) * (len + 1);
        // SAFETY: `i <= len + (len + 1) < both.len() = 2 len + 2` (unchecked so that
        // lanes gather without branches).
        unsafe { *self.both.get_unchecked(i) }
    }
}

/// [`Sums`] for many lanes at once ([`super::lanes_vec`]): the value without branches and
/// whether it is [`Sums::sum`]'s (where not, the caller asks `sum`).
pub(crate) trait LaneSums: Sums {
    /// `(sum(u, same), true)`, or `(anything, false)`.
    fn lane(&self, u: i64, same: bool) -> (i64, bool);
}

impl LaneSums for ExactTables {
    #[inline(always)]
    fn lane(&self, u: i64, same: bool) -> (i64, bool) {
        (self.sum(u, same), true)
    }
}

impl LaneSums for GaussF64 {
    #[inline(always)]
    fn lane(&self, u: i64, same: bool) -> (i64, bool) {
        self.sum_lane(u, same)
    }
}

impl Sums for Tables {
    #[inline(always)]
    fn sum(&self, u: i64, same: bool) -> i64 {
        if same {
            Tables::sb(self, -u)
        } else if u == 0 {
            0
        } else {
            Tables::db(self, -u)
        }
    }
}

impl Sums for GaussF64 {
    #[inline(always)]
    fn sum(&self, u: i64, same: bool) -> i64 {
        GaussF64::sum(self, u, same)
    }
}

/// The evaluation behind an arithmetic's sums, for the fast matrix product.
pub(crate) enum SumsRef<'a> {
    /// Exact tables of every `z` (ideal and truncated, `f <= 10`).
    Exact(&'a ExactTables),
    /// The f64 evaluation with exact fallback (ideal and truncated, `f >= 11`).
    F64(&'a GaussF64),
    /// The table implementation.
    Table(&'a Tables),
}

impl GaussEval {
    /// The evaluation the fast matrix product uses: the same values as [`GaussEval::sb`] and
    /// [`GaussEval::db`]; `f64` is built on first use for `f >= 11`.
    pub(crate) fn sums<'a>(&'a self, f: u32, f64: &'a OnceLock<GaussF64>) -> SumsRef<'a> {
        match self {
            GaussEval::Table(t) => SumsRef::Table(t),
            GaussEval::Exact {
                tables: Some(t), ..
            } => SumsRef::Exact(t),
            GaussEval::Exact { dir, tables: None } => {
                SumsRef::F64(f64.get_or_init(|| GaussF64::new(f, *dir)))
            }
        }
    }
}
