//! Where a format's values lie: how many positive values each binade `[2^k, 2^(k+1))` holds,
//! the format's range, and its densest region.
//!
//! - **Count per binade.** Posits and floats: their positive values are the positive bit
//!   patterns up to the largest finite one, in increasing order, so the count of binade `k` is
//!   the number of patterns below `2^(k+1)` less the number below `2^k` (two binary searches
//!   over [`Format::decode`]). lns<w,f>: the values `2^(j/2^f)`, `k_min <= j <= k_max`, of
//!   binade `k` are those with `floor(j / 2^f) = k`. fixed<wl,fl>: the multiples `m · 2^-fl`,
//!   `1 <= m <= 2^(wl-1) - 1`, with `2^(k+fl) <= m < 2^(k+fl+1)`. Block floating point, MX and
//!   NVFP4 scale their grid by each block's largest element, so they have no fixed grid
//!   ([`FormatGrid::of`] gives `None`). Binades outside f64's range (`-1074..=1023`; only
//!   wide lns formats reach them) are left out.
//! - **Range.** `min_positive` to `max_finite` ([`Format::min_positive`],
//!   [`Format::max_finite`]).
//! - **Densest region.** The binades holding the most values: where a value is rounded with
//!   the smallest relative error. For a float these are its normal binades (`2^M` values each;
//!   subnormal binades hold fewer, and the top binade of an `fn` format one fewer), for a posit
//!   the binades around 1 (the regime takes the fewest bits there: `[2^-1, 2^1)` for
//!   posit<8,0>, `[2^-2, 2^2)` for posit<16,1>), for fixed point its top binade, for lns every
//!   binade alike. The set is contiguous for every format here; [`FormatGrid::densest`] gives
//!   its first and last binade.

use crate::format::grid::pow2;
use crate::format::Format;

use super::histogram::binade;

/// The lowest binade considered: that of f64's smallest subnormal.
const LOWEST: i32 = -1074;
/// The highest binade considered: that of f64's largest finite value.
const HIGHEST: i32 = 1023;

/// A format's positive values by binade (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct FormatGrid {
    /// `(k, n)`: binade `k` holds `n >= 1` positive values, in increasing `k`.
    pub per_binade: Vec<(i32, u64)>,
    /// The smallest positive value.
    pub min_positive: f64,
    /// The largest finite value.
    pub max_finite: f64,
}

impl FormatGrid {
    /// The grid of `format`; `None` for formats whose grid depends on the data (block
    /// floating point, MX, NVFP4).
    pub fn of(format: &Format) -> Option<Self> {
        let min_positive = format.min_positive()?;
        let max_finite = format.max_finite()?;
        let per_binade = match format {
            Format::Posit(p) => by_patterns(format, 1, (1u32 << (p.n() - 1)) - 1)?,
            Format::Float(_) => by_patterns(format, 1, format.encode(max_finite).ok()?)?,
            Format::Lns(l) => {
                let per = 1i64 << l.f();
                let (lo, hi) = (l.k_min().div_euclid(per), l.k_max().div_euclid(per));
                let (lo, hi) = (lo.max(i64::from(LOWEST)), hi.min(i64::from(HIGHEST)));
                (lo..=hi)
                    .map(|k| {
                        let first = (k * per).max(l.k_min());
                        let last = ((k + 1) * per - 1).min(l.k_max());
                        (k as i32, (last - first + 1) as u64)
                    })
                    .collect()
            }
            Format::Fixed(f) => {
                let top = (1u64 << (f.wl() - 1)) - 1;
                // m in [2^j, 2^(j+1)) for j = 0 ..= wl - 2; binade k = j - fl.
                (0..=63 - top.leading_zeros() as i32)
                    .map(|j| {
                        let first = 1u64 << j;
                        let last = ((1u64 << (j + 1)) - 1).min(top);
                        (j - f.fl(), last - first + 1)
                    })
                    .filter(|&(k, _)| (LOWEST..=HIGHEST).contains(&k))
                    .collect()
            }
            Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => return None,
        };
        Some(FormatGrid {
            per_binade,
            min_positive,
            max_finite,
        })
    }

    /// The count of values in binade `k`.
    pub fn count(&self, k: i32) -> u64 {
        self.per_binade.iter().find(|p| p.0 == k).map_or(0, |p| p.1)
    }

    /// The first and last binade of the densest region (the binades holding the most
    /// values).
    pub fn densest(&self) -> (i32, i32) {
        let most = self.per_binade.iter().map(|p| p.1).max().unwrap_or(0);
        let mut dense = self.per_binade.iter().filter(|p| p.1 == most).map(|p| p.0);
        let first = dense.next().unwrap_or(0);
        (first, dense.next_back().unwrap_or(first))
    }

    /// The binades of the smallest and the largest positive value.
    pub fn range_binades(&self) -> (i32, i32) {
        (
            binade(self.min_positive).unwrap_or(LOWEST),
            binade(self.max_finite).unwrap_or(HIGHEST),
        )
    }
}

/// Counts per binade of the values of patterns `lo..=hi`, which increase with the pattern.
fn by_patterns(format: &Format, lo: u32, hi: u32) -> Option<Vec<(i32, u64)>> {
    let value = |p: u32| format.decode(p).unwrap_or(f64::NAN);
    // The number of patterns in lo..=hi whose value is below t.
    let below = |t: f64| -> u64 {
        let (mut a, mut b) = (lo as u64, hi as u64 + 1);
        while a < b {
            let mid = a + (b - a) / 2;
            if value(mid as u32) < t {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        a - lo as u64
    };
    let first = binade(value(lo))?;
    let last = binade(value(hi))?;
    Some(
        (first..=last)
            .map(|k| (k, below(pow2(k + 1)) - below(pow2(k))))
            .filter(|p| p.1 > 0)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(name: &str) -> FormatGrid {
        FormatGrid::of(&name.parse().unwrap()).unwrap()
    }

    /// The count per binade by decoding every pattern (formats of at most 16 bits).
    fn by_enumeration(name: &str) -> Vec<(i32, u64)> {
        let f: Format = name.parse().unwrap();
        let mut counts = std::collections::BTreeMap::new();
        for p in 0..(1u32 << f.bits()) {
            let v = f.decode(p).unwrap();
            if v > 0.0 && v.is_finite() {
                *counts.entry(binade(v).unwrap()).or_insert(0u64) += 1;
            }
        }
        counts.into_iter().collect()
    }

    #[test]
    fn counts_per_binade_equal_the_enumerated_patterns() {
        for name in [
            "posit<8,0>",
            "posit<8,2>",
            "posit<16,1>",
            "posit<6,3>",
            "e4m3",
            "e5m2",
            "e2m1",
            "fp16",
            "bf16",
            "float<4,3,nosub>",
            "lns<8,3>",
            "lns<10,0>",
        ] {
            assert_eq!(grid(name).per_binade, by_enumeration(name), "{name}");
        }
    }

    #[test]
    fn posit8_has_32_values_in_each_binade_around_one() {
        let g = grid("posit<8,0>");
        assert_eq!(
            (g.count(-1), g.count(0), g.count(1), g.count(-2)),
            (32, 32, 16, 16)
        );
        assert_eq!(g.densest(), (-1, 0));
        assert_eq!(g.range_binades(), (-6, 6));
        assert_eq!(g.per_binade.iter().map(|p| p.1).sum::<u64>(), 127);
        assert_eq!(grid("posit<16,1>").densest(), (-2, 1));
    }

    #[test]
    fn floats_are_densest_over_their_normal_binades() {
        let e4m3 = grid("e4m3");
        assert_eq!(e4m3.densest(), (-6, 7));
        assert_eq!((e4m3.count(8), e4m3.count(-9), e4m3.count(-7)), (7, 1, 4));
        assert_eq!(grid("bf16").densest(), (-126, 127));
        assert_eq!(grid("fp16").range_binades(), (-24, 15));
    }

    #[test]
    fn fixed_point_and_lns_grids_are_counted_by_formula() {
        let fixed = grid("fixed<8,4>");
        // Multiples of 1/16 from 1/16 to 127/16: 1, 2, 4, 8, 16, 32, 64 per binade.
        assert_eq!(
            fixed.per_binade,
            vec![
                (-4, 1),
                (-3, 2),
                (-2, 4),
                (-1, 8),
                (0, 16),
                (1, 32),
                (2, 64)
            ]
        );
        assert_eq!(fixed.densest(), (2, 2));
        // lns<8,3>: j in -63..=63, 8 per binade; binade -8 holds only j = -63..=-57.
        let lns = grid("lns<8,3>");
        assert_eq!(lns.count(-8), 7);
        assert_eq!(lns.count(7), 8);
        assert_eq!(lns.densest(), (-7, 7));
    }

    #[test]
    fn the_densest_region_is_contiguous_and_block_formats_have_no_grid() {
        for (name, _, format) in Format::presets() {
            let Some(g) = FormatGrid::of(&format) else {
                assert!(format.max_finite().is_none(), "{name}");
                continue;
            };
            let (lo, hi) = g.densest();
            let most = g.count(lo);
            assert!((lo..=hi).all(|k| g.count(k) == most), "{name}");
        }
        assert!(FormatGrid::of(&"block<8>".parse().unwrap()).is_none());
        assert!(FormatGrid::of(&"mxfp8_e4m3".parse().unwrap()).is_none());
    }
}
