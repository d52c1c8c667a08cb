//! The f32 fast path of lns<w,f>: rounding decided on the f32 bit pattern by table lookups,
//! bit-identical to [`Lns::round_stored`] with f32 storage for every f32 input.
//!
//! # Why a table per binade suffices
//!
//! A normal f32 `x = ±2^E (1 + M / 2^23)` has the scaled logarithm
//! `t = log2|x| 2^f = E 2^f + log2(1 + M / 2^23) 2^f`, and `0 <= log2(1 + M/2^23) < 1`: one
//! binade of the input spans exactly `2^f` codes, and the code is `k = E 2^f + j` where
//! `j = J(M)` depends on the 23-bit mantissa `M` alone (and the rounding mode), as long as no
//! clamp applies (every code `E 2^f ..= (E + 1) 2^f` lies in `[k_min, k_max]`). That holds for
//! the kept-values rule too: the stored value of a code is the f32 of the f64 nearest to
//! `2^(k/2^f)`, and with `k = E 2^f + j` that f64 is `2^E` times the f64 nearest to
//! `2^(j/2^f)` (scaling by a power of two is exact in f64, and f32 exponents are far inside
//! f64's normal range), and rounding to f32 commutes with the scaling while the result is an
//! f32 normal. So, for `2^-126 <= 2^E` and `2^(E + 1) <= 2^127` (and the clamps below):
//!
//! - `J` is a nondecreasing step function of `M`: `J(M)` is the number of thresholds
//!   `T_i <= M`, `T_i` the smallest mantissa whose code in binade 0 is at least `i + 1`.
//!   The thresholds are found by searching with the exact scalar rounding itself
//!   ([`Lns::round_code_stored`] of lns<32,f>, whose binade 0 holds no clamp), starting from
//!   an f64 estimate (`2^((i + 1/2)/2^f)` for nearest, `2^((i + 1)/2^f)` for toward-zero);
//!   they are right by construction, kept values included.
//! - The output is `2^E` times the f32 `Y_j` of `2^(j/2^f)` (`Y_(2^f) = 2`): on the bit
//!   pattern, the exponent field of `x` plus `off_j = bits(Y_j) - bits(1.0)`, a carry into
//!   the exponent where `Y_j = 2`.
//!
//! # Deterministic rules: one lookup
//!
//! The mantissa's top `g` bits index a table of buckets. Neighbouring thresholds are at least
//! `(2^(1/2^f) - 1) 2^23 > ln 2 2^(23-f)` mantissas apart, so with `g >= f + 1` (a bucket
//! spans at most `2^(22-f)` mantissas) a bucket holds at most one threshold; the plan checks
//! this and takes more index bits where it fails (thresholds are whole mantissas, so their
//! gaps can be one shorter). One 64-bit entry per bucket holds the output offset `low` of
//! the bucket's first code (24 bits: `off_(2^f) = 2^23`), the step `delta` to the next
//! code's offset (below `2^(24-f)`: `2^23 (2^((j+1)/2^f) - 2^(j/2^f)) < 2^24 ln 2 2^-f`) and
//! the threshold's position `toff` within the bucket (`23 - g` bits; a bucket without a
//! threshold has `toff = 0` and `delta = 0`, so its step adds nothing). The offset is
//! `low + delta` where the mantissa's low bits reach `toff`, else `low`: one lookup and one
//! compare. The fields take `(23 - g) + 24 + (24 - f)` bits, so `g >= 7 - f` as well
//! (`g = 4` for lns<8,3>, `g = f + 1` from `f = 3` on).
//!
//! The clamps are magnitude compares: the unclamped code `E 2^f + J(M)` is nondecreasing in
//! `|x|` (within a binade `J` is; across a boundary it goes from at most `E 2^f + 2^f` to
//! `(E + 1) 2^f`), so the inputs whose code exceeds `k_max` are the magnitudes from one
//! pattern `p_over` on (the result is `±max`, every mode saturates), and those below `k_min`
//! the magnitudes below a pattern `p_min`. Below `k_min` deterministic rules give `±min` or
//! zero, and since rounding is monotone in `|x|` that is one more compare with the first
//! pattern whose scalar code is not zero. The three patterns are found by bisection when the
//! plan is built (the first two on the table's code, the last with the scalar rounding).
//!
//! # Stochastic rounding: the step up decided in the mantissa domain
//!
//! A second bucket table (32-bit entries: the bucket's first code `j0` and its threshold's
//! position, `2^(23-g)` where it has none) gives `j`, `floor(t)` less `E 2^f` from the
//! toward-zero thresholds (kept values included: such an input is the f32 `A_j / 2^23` below
//! `2^(j/2^f)`, and the step below does not move it). The scalar rule rounds up when
//! `frac(t) >= c = (r + 1) / 2^b` (`r` the top `b` random bits), that is when
//! `x >= 2^((j + c)/2^f)` on the binade-0 significand `x = X / 2^23`, `X = 2^23 + M`: with
//! `A_j = 2^23 + off_j` (the stored f32 of code `j`, an integer in f32) and
//! `corr_j = 2^23 2^(j/2^f) - A_j` (its distance from the exact value, at most half a unit
//! plus the f64 rounding), and `E = 2^(c/2^f)`,
//!
//! `up  <=>  D = M - off_j >= G = A_j (E - 1) + corr_j E`.
//!
//! `D` is an integer, exact in f32. The kernel computes `G' = A_j P + corr'_j` in f32, where
//! `P` is a Taylor polynomial of `E - 1 = expm1(a)`, `a = c ln 2 / 2^f <= ln 2 / 2^f`, with
//! `N` terms (`N = 3` from `f = 7` on, 6 for `f` in 2..=6, 10 below: the truncation,
//! `a^N / (N + 1)! / (1 - a)` of `P`, stays below `2^-26`), evaluated by Horner's rule, and
//! `corr'_j` is `corr_j` rounded to f32. Two tables indexed by the code hold `off_j` (read
//! again at `j + 1` for the result when rounding up) and `corr'_j`; with the bucket table
//! that is three lookups, which the AVX-512 pass makes register permutes where the tables
//! hold at most 32 entries (`f <= 4`) and gathers otherwise.
//!
//! The bound (`u = 2^-24`, every quantity positive, so no cancellation): `a` carries two
//! roundings (`ln 2 / 2^f` to f32, the product with the exact `r + 1`), which change `P` by
//! a relative `1.4 * 2u` at most (`d ln(expm1 a) / d ln a <= 1.4` for `a <= ln 2`); Horner's
//! rule with positive coefficients and argument, the coefficients rounded, is within
//! `gamma_(2N+1)` of the polynomial (`gamma_n = n u / (1 - n u)`); the product `a s`, the
//! product with `A_j` and the sum with `corr'_j` add one rounding each. With
//! `G_max = 2^24 (2^(2^-f) - 1)`:
//!
//! `|G' - G| <= G_max (rho + 2u) + u (G_max + 1) + 0.51 (2^(2^-f) - 1) + 2^-25 + 2^-29`,
//!
//! `rho = gamma_(2N+1) + 3u + 2^-26` (the relative error of `P`), the third term the
//! `corr_j (E - 1)` the kernel drops, the next two the rounding of `corr_j` and the f64
//! error of the value it comes from. The plan computes this bound `delta` (in f64, rounded
//! up) and the kernel decides `up` when `fl(D - G') > 2 delta`, `down` when it is below
//! `-2 delta` (the factor 2 covers the rounding of the difference); otherwise the element
//! takes the scalar path. `delta` stays below a thousandth of the gap between thresholds
//! (`ln 2 2^(23-f)` units) for every `f`, so a vanishing fraction of the inputs takes the
//! scalar path; tests check the bound against an f64 evaluation of `G` for every `f`, both
//! evaluation orders, and that share.
//!
//! Stochastic rounding below `min` (a ratio of magnitudes against the random bits) takes the
//! scalar path; its clamps compare the code `k = b 2^f - 127 2^f + j` (`b` the exponent
//! byte) with the range.
//!
//! # What takes the scalar path
//!
//! Exponent bytes 0 (subnormals), 254 (results that may leave f32's range) and 255 (Inf,
//! NaN); stochastic underflow and the stochastic decisions within the error bound; and
//! formats with `f > MAX_FRACTION_BITS` (the tables would grow past a few MiB). Zeros are
//! written directly (the lns zero is unsigned: `±0` gives `+0`). The vectorised pass writes
//! such elements unchanged (so the in-place pass stores whole vectors) and flags them; the
//! scalar path then rounds them from their input.

#[cfg(target_arch = "x86_64")]
mod avx512;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use super::cpu::fill_dispatch;
#[cfg(target_arch = "x86_64")]
use super::isa::{self, Isa};
use crate::format::lns::{Lns, LnsCode};
use crate::format::rounding::{NearestAway, NearestEven, RoundingRule, RuleKind, TowardZero};
use crate::philox::Stream;

const SIGN: u32 = 0x8000_0000;
const EXPONENT: u32 = 0x7f80_0000;
const MANTISSA: u32 = 0x007f_ffff;
/// `2^23`: a threshold no mantissa reaches.
const NEVER: u32 = 1 << 23;
/// The 24-bit field of an output offset (`off_(2^f) = 2^23`).
const OFFSET: u64 = 0x00ff_ffff;
/// The bits of the f32 `2^23`: `TWO_23 + i` is the f32 `2^23 + i` for `0 <= i <= 2^23`.
const TWO_23: u32 = 0x4b00_0000;

/// The largest `f` with a fast path (its bucket table has `2^(f+1)` entries of 8 bytes).
pub const MAX_FRACTION_BITS: u32 = 16;

/// Elements per parallel work item (a multiple of 4, so each Philox block stays in one).
const CHUNK: usize = 1 << 14;
/// Elements per run of the vectorised pass (its random words and flags are staged in
/// stack buffers of this size).
const RUN: usize = 1024;
/// Elements per group of the vectorised pass: one AVX-512 vector of f32.
const GROUP: usize = 16;

/// `1 / (i + 1)!` for `i = 0..10`, rounded to f32: the Taylor coefficients of
/// `expm1(a) / a`.
const EXPM1_TERMS: [f32; 10] = [
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
];

/// The precomputed f32 fast path for one lns format and rounding rule.
#[derive(Debug, Clone)]
pub struct LnsF32Plan {
    lns: Lns,
    kind: RuleKind,
    /// `23 - g`: the mantissa shift that gives the bucket index.
    shift: u32,
    /// Deterministic rules: per bucket `toff | low << shift | delta << (shift + 24)`.
    det: Vec<u64>,
    /// Stochastic rounding: per bucket `toff | j0 << (shift + 1)` (`toff = 2^shift`: none).
    sr_buckets: Vec<u32>,
    /// Stochastic rounding: per code `j` in `0..=2^f`, the output offset `off_j` and the
    /// bits of the f32 `corr'_j` (0 at `j = 2^f`, never read).
    sr_off: Vec<u32>,
    sr_corr: Vec<u32>,
    /// Stochastic rounding: whether the three tables fit in two vectors of 16 lanes each,
    /// so that the AVX-512 pass permutes registers instead of gathering (`f <= 4`).
    sr_small: bool,
    /// `f`, and `127 * 2^f` (the code of the exponent byte `b` is `b 2^f - bias`).
    f: u32,
    bias: i32,
    k_min: i32,
    k_max: i32,
    /// The f32 bits of the stored `max` and `min` magnitudes.
    max_bits: u32,
    min_bits: u32,
    /// Deterministic rules: the smallest magnitude bits whose code is not zero (below `min`,
    /// the result is `min` from here on and zero before), the first magnitude whose code
    /// reaches `k_min` and the first whose code exceeds `k_max`.
    underflow: u32,
    p_min: u32,
    p_over: u32,
    /// Stochastic rounding: `ln 2 / 2^f` in f32, the Taylor terms `N` and the decision
    /// margin `2 delta` (see the module docs).
    ln2_scaled: f32,
    terms: usize,
    margin: f32,
}

/// The code of `1 + m / 2^23` in lns<32,f> (binade 0, no clamp) with a rule of `kind`
/// (stochastic: its floor, toward-zero with kept values).
fn binade_code(l32: &Lns, m: u32, kind: RuleKind) -> i64 {
    match code(l32, 1.0 + m as f64 / NEVER as f64, kind) {
        LnsCode::Value { negative: false, k } => k,
        other => unreachable!("1 <= x < 2 rounds to a positive code, not {other:?}"),
    }
}

/// The scalar code of `x` with f32 storage and a deterministic rule of `kind` (stochastic:
/// toward-zero).
fn code(lns: &Lns, x: f64, kind: RuleKind) -> LnsCode {
    let stored = |v: f64| v as f32 as f64;
    match kind {
        RuleKind::NearestEven => lns.round_code_stored(x, NearestEven, 0, stored),
        RuleKind::NearestAway => lns.round_code_stored(x, NearestAway, 0, stored),
        RuleKind::TowardZero | RuleKind::Stochastic => {
            lns.round_code_stored(x, TowardZero, 0, stored)
        }
    }
}

/// The first pattern in `lo..hi` where the nondecreasing predicate `reached` holds (`hi`
/// if none), by bisection.
fn first_pattern(mut lo: u32, mut hi: u32, reached: impl Fn(u32) -> bool) -> u32 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if reached(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// `G' = A_j P + corr'_j` of the stochastic decision (see the module docs), `P` the
/// `N`-term Taylor polynomial of `expm1(a)` by Horner's rule.
#[inline(always)]
fn stochastic_estimate<const N: usize>(a_j: f32, corr: f32, a: f32) -> f32 {
    let mut s = EXPM1_TERMS[N - 1];
    for &q in EXPM1_TERMS[..N - 1].iter().rev() {
        s = s * a + q;
    }
    a_j * (a * s) + corr
}

/// `n u / (1 - n u)` with `u = 2^-24`: the relative error bound of `n` f32 roundings.
fn gamma(n: usize) -> f64 {
    let nu = n as f64 / (1u64 << 24) as f64;
    nu / (1.0 - nu)
}

impl LnsF32Plan {
    /// The plan for `lns` and rules of `kind`; `None` when `f > MAX_FRACTION_BITS`.
    pub fn new(lns: &Lns, kind: RuleKind) -> Option<Self> {
        let f = lns.f();
        if f > MAX_FRACTION_BITS {
            return None;
        }
        let n = 1i64 << f;
        let l32 = Lns::new(32, f).expect("f <= 16 fits lns<32,f>");
        let thresholds = Self::thresholds(&l32, kind);
        let offsets: Vec<u32> = (0..=n)
            .map(|j| (l32.value(j) as f32).to_bits() - 1f32.to_bits())
            .collect();
        let stochastic = kind == RuleKind::Stochastic;
        let mut g = if stochastic {
            f + 1
        } else {
            (f + 1).max(7u32.saturating_sub(f))
        };
        while !Self::one_per_bucket(&thresholds, 23 - g) {
            if g == 22 {
                return None;
            }
            g += 1;
        }
        let shift = 23 - g;
        let mut plan = LnsF32Plan {
            lns: *lns,
            kind,
            shift,
            det: Vec::new(),
            sr_buckets: Vec::new(),
            sr_off: Vec::new(),
            sr_corr: Vec::new(),
            sr_small: false,
            f,
            bias: 127 << f,
            k_min: lns.k_min() as i32,
            k_max: lns.k_max() as i32,
            max_bits: (lns.max_value() as f32).to_bits(),
            min_bits: (lns.min_positive() as f32).to_bits(),
            underflow: 0,
            p_min: 0,
            p_over: 0,
            ln2_scaled: (std::f64::consts::LN_2 / n as f64) as f32,
            terms: if f >= 7 {
                3
            } else if f >= 2 {
                6
            } else {
                10
            },
            margin: 0.0,
        };
        if stochastic {
            plan.sr_buckets = Self::stochastic_buckets(&thresholds, shift);
            plan.sr_corr = (0..=n)
                .map(|j| {
                    if j == n {
                        return 0;
                    }
                    // 2^23 2^(j/2^f) - A_j, exact in f64 (both are multiples of 2^-29
                    // below 2^25), to within the f64 rounding of the value (2^-30).
                    let a = NEVER as f64 + offsets[j as usize] as f64;
                    ((l32.value(j) * NEVER as f64 - a) as f32).to_bits()
                })
                .collect();
            plan.sr_off = offsets;
            plan.sr_small = plan.sr_buckets.len() <= 32 && plan.sr_off.len() <= 32;
            plan.margin = 2.0 * plan.decision_bound() as f32;
        } else {
            plan.det = Self::deterministic_buckets(&thresholds, &offsets, shift)?;
            // The bisections below read the plan's own code, which is nondecreasing in the
            // magnitude (see the module docs).
            let (p_min, p_over) = {
                let unclamped = |abs: u32| plan.unclamped_code(&thresholds, abs);
                let (k_min, k_max) = (plan.k_min as i64, plan.k_max as i64);
                (
                    first_pattern(0x0080_0000, EXPONENT, |a| unclamped(a) >= k_min),
                    first_pattern(0x0080_0000, EXPONENT, |a| unclamped(a) > k_max),
                )
            };
            plan.p_min = p_min;
            plan.p_over = p_over;
            plan.underflow = first_pattern(0, EXPONENT, |a| {
                code(lns, f32::from_bits(a) as f64, kind) != LnsCode::Zero
            });
        }
        Some(plan)
    }

    /// `T_i` for `i` in `0..2^f`: the smallest mantissa whose code is at least `i + 1`
    /// ([`NEVER`] when none is), found from an f64 estimate and corrected with the exact
    /// rounding.
    fn thresholds(l32: &Lns, kind: RuleKind) -> Vec<u32> {
        let f = l32.f();
        let n = 1u32 << f;
        let half = match kind {
            RuleKind::NearestEven | RuleKind::NearestAway => 0.5,
            _ => 0.0,
        };
        let top = binade_code(l32, MANTISSA, kind);
        let mut out = Vec::with_capacity(n as usize);
        let mut prev = 0u32;
        for i in 0..n {
            let target = i as i64 + 1;
            if target > top {
                out.push(NEVER);
                continue;
            }
            let v = ((i as f64 + 1.0 - half) / n as f64).exp2();
            let est = ((v - 1.0) * NEVER as f64)
                .ceil()
                .clamp(0.0, MANTISSA as f64) as u32;
            let mut m = est.max(prev);
            while m > prev && binade_code(l32, m - 1, kind) >= target {
                m -= 1;
            }
            while binade_code(l32, m, kind) < target {
                m += 1;
            }
            out.push(m);
            prev = m;
        }
        out
    }

    /// Whether buckets of `2^shift` mantissas hold at most one threshold each.
    fn one_per_bucket(thresholds: &[u32], shift: u32) -> bool {
        thresholds
            .windows(2)
            .all(|pair| pair[1] == NEVER || pair[0] >> shift != pair[1] >> shift)
    }

    /// `(j0, the threshold in the bucket if any)` for each bucket of `2^shift` mantissas.
    fn bucket_codes(thresholds: &[u32], shift: u32) -> Vec<(usize, Option<u32>)> {
        let mut j0 = 0usize;
        (0..1u32 << (23 - shift))
            .map(|idx| {
                let start = idx << shift;
                while j0 < thresholds.len() && thresholds[j0] <= start {
                    j0 += 1;
                }
                let t = thresholds
                    .get(j0)
                    .copied()
                    .filter(|&t| t != NEVER && t >> shift == idx);
                (j0, t)
            })
            .collect()
    }

    /// The 64-bit bucket entries of deterministic rules, or `None` if a field would not fit.
    fn deterministic_buckets(thresholds: &[u32], offsets: &[u32], shift: u32) -> Option<Vec<u64>> {
        Self::bucket_codes(thresholds, shift)
            .into_iter()
            .map(|(j0, t)| {
                let low = offsets[j0] as u64;
                let (toff, delta) = match t {
                    Some(t) => (
                        (t & ((1 << shift) - 1)) as u64,
                        (offsets[j0 + 1] - offsets[j0]) as u64,
                    ),
                    None => (0, 0),
                };
                (delta < 1 << (40 - shift)).then_some(toff | low << shift | delta << (shift + 24))
            })
            .collect()
    }

    /// The 32-bit bucket entries of stochastic rounding (toward-zero thresholds).
    fn stochastic_buckets(thresholds: &[u32], shift: u32) -> Vec<u32> {
        Self::bucket_codes(thresholds, shift)
            .into_iter()
            .map(|(j0, t)| {
                let toff = t.map_or(1 << shift, |t| t & ((1 << shift) - 1));
                toff | (j0 as u32) << (shift + 1)
            })
            .collect()
    }

    /// The code of a normal magnitude pattern before the clamps, from the thresholds.
    fn unclamped_code(&self, thresholds: &[u32], abs: u32) -> i64 {
        let m = abs & MANTISSA;
        let j = thresholds.partition_point(|&t| t <= m) as i64;
        ((abs >> 23) as i64) * (1 << self.f) - self.bias as i64 + j
    }

    /// The bound `delta` on `|G' - G|` of the stochastic decision, in units of `2^-23` of
    /// the significand (see the module docs), rounded up.
    fn decision_bound(&self) -> f64 {
        let u = 1.0 / (1u64 << 24) as f64;
        let big = (1.0 / (1u64 << self.f) as f64).exp2() - 1.0;
        let g_max = (1u64 << 24) as f64 * big;
        let rho = gamma(2 * self.terms + 1) + 3.0 * u + 1.0 / (1u64 << 26) as f64;
        let bound = g_max * (rho + 2.0 * u)
            + u * (g_max + 1.0)
            + 0.51 * big
            + 1.0 / (1u64 << 25) as f64
            + 1.0 / (1u64 << 29) as f64;
        // Rounded up, with room for the f64 arithmetic above.
        bound * (1.0 + 1e-6)
    }

    /// The format this plan rounds to.
    pub fn lns(&self) -> &Lns {
        &self.lns
    }

    /// The rule kind this plan was built for.
    pub fn kind(&self) -> RuleKind {
        self.kind
    }

    /// The mantissa bits that index the bucket table (`g`: `f + 1` for stochastic rounding,
    /// `max(f + 1, 7 - f)` for deterministic rules, more where thresholds crowd).
    pub fn index_bits(&self) -> u32 {
        23 - self.shift
    }

    /// The decision margin `2 delta` of stochastic rounding in units of `2^-23` of the
    /// significand (0 for deterministic rules).
    pub fn stochastic_margin(&self) -> f32 {
        self.margin
    }

    /// [`LnsF32Plan::new`] through a process-wide cache: each (format, rule kind) plan is
    /// built once and shared (building one searches `2^f` thresholds with the exact
    /// rounding).
    pub fn shared(lns: &Lns, kind: RuleKind) -> Option<Arc<Self>> {
        type Cache = Mutex<HashMap<(Lns, RuleKind), Option<Arc<LnsF32Plan>>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        if lns.f() > MAX_FRACTION_BITS {
            return None;
        }
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        if let Some(plan) = cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(*lns, kind))
        {
            return plan.clone();
        }
        // Built outside the lock; two threads may both build a plan (the same one).
        let plan = Self::new(lns, kind).map(Arc::new);
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((*lns, kind), plan.clone());
        plan
    }

    /// The fast-path result's bits for `bits` (an f32 pattern) with a deterministic rule,
    /// and whether the element needs the scalar path instead (its result is then `bits`,
    /// unchanged). Branch-free.
    #[inline(always)]
    fn round_deterministic(&self, bits: u32) -> (u32, bool) {
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        let byte = abs >> 23;
        let zero = abs == 0;
        // Exponent bytes 1..=253: normal inputs whose results stay normal.
        let slow = (byte.wrapping_sub(1) > 252) & !zero;
        let m = abs & MANTISSA;
        let low_mask = (1u32 << self.shift) - 1;
        // SAFETY: `m < 2^23`, so the index is below `2^(23 - shift)`, the table's length.
        let e = unsafe { *self.det.get_unchecked((m >> self.shift) as usize) };
        let toff = e as u32 & low_mask;
        let low = (e >> self.shift) as u32 & OFFSET as u32;
        let delta = (e >> (self.shift + 24)) as u32;
        let step = (m & low_mask) >= toff;
        let offset = low + if step { delta } else { 0 };
        let value = ((abs & EXPONENT) + offset) | sign;
        let tiny = if abs >= self.underflow {
            self.min_bits | sign
        } else {
            0
        };
        let out = if zero {
            0
        } else if abs < self.p_min {
            tiny
        } else if abs >= self.p_over {
            self.max_bits | sign
        } else {
            value
        };
        (if slow { bits } else { out }, slow)
    }

    /// [`LnsF32Plan::round_deterministic`] for stochastic rounding with `N` Taylor terms:
    /// `random` the element's word, `drop` `32 - b` (the shift to its top `b` bits) and
    /// `kappa` `ln 2 / 2^f / 2^b`.
    #[inline(always)]
    fn round_stochastic<const N: usize>(
        &self,
        bits: u32,
        random: u32,
        drop: u32,
        kappa: f32,
    ) -> (u32, bool) {
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        let byte = abs >> 23;
        let zero = abs == 0;
        let m = abs & MANTISSA;
        let low_mask = (1u32 << self.shift) - 1;
        // SAFETY: `m < 2^23`, so the index is below `2^(23 - shift)`, the table's length.
        let e = unsafe { *self.sr_buckets.get_unchecked((m >> self.shift) as usize) };
        let toff = e & ((low_mask << 1) | 1);
        let step = (m & low_mask) >= toff;
        let j = (e >> (self.shift + 1)) + step as u32;
        let k = ((byte << self.f) + j) as i32 - self.bias;
        // Exponent bytes 1..=253, and no underflow (a ratio against the random bits).
        let mut slow = ((byte.wrapping_sub(1) > 252) | (k < self.k_min)) & !zero;
        // SAFETY: toward-zero codes within a binade are below `2^f`; the tables hold `2^f + 1`.
        let (off, corr) = unsafe {
            (
                *self.sr_off.get_unchecked(j as usize),
                f32::from_bits(*self.sr_corr.get_unchecked(j as usize)),
            )
        };
        // D = M - off_j (exact: X - A_j of two f32 integers in [2^23, 2^24]) against
        // G' = A_j P + corr'_j, P = expm1(a) by Horner's rule.
        let x = f32::from_bits(TWO_23 | m);
        let a_j = f32::from_bits(TWO_23 + off);
        let a = ((random >> drop) + 1) as f32 * kappa;
        let diff = (x - a_j) - stochastic_estimate::<N>(a_j, corr, a);
        let up = diff > self.margin;
        slow |= (diff.abs() <= self.margin) & !zero;
        // SAFETY: `j + 1 <= 2^f`, within the table.
        let offset = unsafe { *self.sr_off.get_unchecked((j + up as u32) as usize) };
        let value = ((abs & EXPONENT) + offset) | sign;
        let out = if zero {
            0
        } else if k + up as i32 > self.k_max {
            self.max_bits | sign
        } else {
            value
        };
        (if slow { bits } else { out }, slow)
    }

    /// Rounds `x` on the fast path, or `None` where it needs the scalar path
    /// ([`Lns::round_stored`] with f32 storage).
    #[inline]
    pub fn round_fast<R: RoundingRule>(&self, x: f32, rule: R, random: u32) -> Option<f32> {
        debug_assert_eq!(R::KIND, self.kind);
        let bits = x.to_bits();
        let (out, slow) = if R::KIND == RuleKind::Stochastic {
            let b = rule.random_bits();
            let kappa = self.ln2_scaled * (1.0 / (1u64 << b) as f32);
            match self.terms {
                3 => self.round_stochastic::<3>(bits, random, 32 - b, kappa),
                6 => self.round_stochastic::<6>(bits, random, 32 - b, kappa),
                _ => self.round_stochastic::<10>(bits, random, 32 - b, kappa),
            }
        } else {
            self.round_deterministic(bits)
        };
        (!slow).then(|| f32::from_bits(out))
    }

    /// Rounds `x`: the fast path, or the scalar path where it does not apply.
    #[inline]
    pub fn round<R: RoundingRule>(&self, x: f32, rule: R, random: u32) -> f32 {
        self.round_fast(x, rule, random)
            .unwrap_or_else(|| self.slow(x, rule, random))
    }

    /// The scalar path for one element.
    #[cold]
    fn slow<R: RoundingRule>(&self, x: f32, rule: R, random: u32) -> f32 {
        self.lns
            .round_stored(x as f64, rule, random, |v| v as f32 as f64) as f32
    }

    /// The branch-free pass over one run: `out[i] = step(src[i], random[i])` (in place when
    /// `src` is `None`), in fixed groups of [`GROUP`] elements copied into arrays (so each
    /// group vectorises in full), with bit `j` of `flags[g]` set where element `16 g + j`
    /// needs the scalar path. Returns whether any flag is set.
    #[inline(always)]
    fn pass(
        src: Option<&[f32]>,
        out: &mut [f32],
        random: &[u32],
        flags: &mut [u16],
        step: impl Fn(u32, u32) -> (u32, bool),
    ) -> bool {
        let n = out.len();
        let full = n - n % GROUP;
        let mut any = 0u16;
        for (g, flag) in (0..full).step_by(GROUP).zip(flags.iter_mut()) {
            let x: [f32; GROUP] = match src {
                Some(s) => s[g..g + GROUP].try_into().expect("a full group"),
                None => out[g..g + GROUP].try_into().expect("a full group"),
            };
            let r: [u32; GROUP] = random[g..g + GROUP].try_into().expect("a full group");
            let o: &mut [f32; GROUP] = (&mut out[g..g + GROUP]).try_into().expect("a full group");
            let mut mask = 0u16;
            for j in 0..GROUP {
                let (bits, slow) = step(x[j].to_bits(), r[j]);
                o[j] = f32::from_bits(bits);
                mask |= (slow as u16) << j;
            }
            *flag = mask;
            any |= mask;
        }
        if full < n {
            let mut mask = 0u16;
            for j in full..n {
                let x = src.map_or(out[j], |s| s[j]);
                let (bits, slow) = step(x.to_bits(), random[j]);
                out[j] = f32::from_bits(bits);
                mask |= (slow as u16) << (j - full);
            }
            flags[full / GROUP] = mask;
            any |= mask;
        }
        any != 0
    }

    /// The vectorised pass of one run for rule `R` (`random` holds a word per element;
    /// deterministic rules ignore it).
    #[inline(always)]
    fn run_pass<R: RoundingRule>(
        &self,
        src: Option<&[f32]>,
        out: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u16],
    ) -> bool {
        if R::KIND != RuleKind::Stochastic {
            return Self::pass(src, out, random, flags, |x, _| self.round_deterministic(x));
        }
        let b = rule.random_bits();
        let kappa = self.ln2_scaled * (1.0 / (1u64 << b) as f32);
        let drop = 32 - b;
        match self.terms {
            3 => Self::pass(src, out, random, flags, |x, r| {
                self.round_stochastic::<3>(x, r, drop, kappa)
            }),
            6 => Self::pass(src, out, random, flags, |x, r| {
                self.round_stochastic::<6>(x, r, drop, kappa)
            }),
            _ => Self::pass(src, out, random, flags, |x, r| {
                self.round_stochastic::<10>(x, r, drop, kappa)
            }),
        }
    }

    /// [`LnsF32Plan::run_pass`], compiled for AVX-512 or AVX2 when the kernels may use them
    /// ([`isa::active`](super::isa::active)).
    #[inline(always)]
    fn pass_dispatch<R: RoundingRule>(
        &self,
        src: Option<&[f32]>,
        out: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u16],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match isa::active() {
                Isa::Avx512 if R::KIND == RuleKind::Stochastic => {
                    let b = rule.random_bits();
                    let kappa = self.ln2_scaled * (1.0 / (1u64 << b) as f32);
                    // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL (checked by
                    // `isa::active`), and this is a stochastic plan.
                    return unsafe {
                        avx512::stochastic_pass(self, src, out, random, flags, 32 - b, kappa)
                    };
                }
                // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL (checked by `isa::active`).
                Isa::Avx512 => return unsafe { self.pass_avx512(src, out, rule, random, flags) },
                // SAFETY: the CPU supports AVX2 (checked by `isa::active`).
                Isa::Avx2 => return unsafe { self.pass_avx2(src, out, rule, random, flags) },
                Isa::Portable => {}
            }
        }
        self.run_pass(src, out, rule, random, flags)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    unsafe fn pass_avx512<R: RoundingRule>(
        &self,
        src: Option<&[f32]>,
        out: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u16],
    ) -> bool {
        self.run_pass(src, out, rule, random, flags)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn pass_avx2<R: RoundingRule>(
        &self,
        src: Option<&[f32]>,
        out: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u16],
    ) -> bool {
        self.run_pass(src, out, rule, random, flags)
    }

    /// Rounds one run (at most [`RUN`] elements) into `out`, from `src` or in place: the
    /// vectorised pass, then the scalar path for the elements it flags (which it left
    /// unchanged, so in place their input is still there).
    #[inline(always)]
    fn run<R: RoundingRule>(&self, src: Option<&[f32]>, out: &mut [f32], rule: R, random: &[u32]) {
        let mut flags = [0u16; RUN / GROUP];
        if !self.pass_dispatch(src, out, rule, random, &mut flags) {
            return;
        }
        for (g, &mask) in flags.iter().enumerate() {
            let mut mask = mask;
            while mask != 0 {
                let i = g * GROUP + mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let x = src.map_or(out[i], |s| s[i]);
                out[i] = self.slow(x, rule, random[i]);
            }
        }
    }

    /// Rounds `src` into `dst` (or `dst` in place when `src` is `None`), in parallel over
    /// chunks; element `i` reads the stream's word `i` (stochastic rules).
    pub fn quantize<R: RoundingRule>(
        &self,
        src: Option<&[f32]>,
        dst: &mut [f32],
        stream: Option<Stream>,
        rule: R,
    ) {
        let work = |chunk: usize, out: &mut [f32]| {
            let base = chunk * CHUNK;
            let mut words = [0u32; RUN];
            let mut start = 0;
            while start < out.len() {
                let len = RUN.min(out.len() - start);
                let first = base + start;
                if let Some(stream) = stream.filter(|_| R::KIND == RuleKind::Stochastic) {
                    fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
                }
                let inp = src.map(|s| &s[first..first + len]);
                self.run(inp, &mut out[start..start + len], rule, &words[..len]);
                start += len;
            }
        };
        if dst.len() <= CHUNK {
            work(0, dst);
        } else if !super::cpu::in_parallel(dst.len()) {
            for (c, out) in dst.chunks_mut(CHUNK).enumerate() {
                work(c, out);
            }
        } else {
            dst.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(c, out)| work(c, out));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate `G'` of the stochastic decision is within `delta` (half the margin) of
    /// `G = A_j (E - 1) + corr_j E`, computed in f64 from the correctly rounded f64 of
    /// `2^(j/2^f)` (error about 2^-28 units), for every `f` with a plan, codes and random
    /// words across their ranges (both ends included) and several random-bit counts;
    /// evaluated as the portable code does (products and sums rounded apart) and as the
    /// AVX-512 code does (fused multiply-adds).
    #[test]
    fn stochastic_estimate_is_within_the_bound() {
        let mut state = 0x853c_49e6_748f_ea9bu64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 32) as u32
        };
        for f in 0..=MAX_FRACTION_BITS {
            let lns = Lns::new(32, f).unwrap();
            let plan = LnsF32Plan::new(&lns, RuleKind::Stochastic).unwrap();
            let n = 1u32 << f;
            let delta = plan.margin as f64 / 2.0;
            let mut worst = 0f64;
            for i in 0..20_000u32 {
                let j = match i {
                    0 => 0,
                    1 => n - 1,
                    _ => next() % n,
                };
                let b = [23, 5, 1][i as usize % 3];
                let r = match i % 7 {
                    0 => 0,
                    1 => u32::MAX,
                    _ => next(),
                };
                let rb = (r >> (32 - b)) + 1;
                let kappa = plan.ln2_scaled * (1.0 / (1u64 << b) as f32);
                let a = rb as f32 * kappa;
                let off = plan.sr_off[j as usize];
                let corr = f32::from_bits(plan.sr_corr[j as usize]);
                let a_j = f32::from_bits(TWO_23 + off);
                let separate = match plan.terms {
                    3 => stochastic_estimate::<3>(a_j, corr, a),
                    6 => stochastic_estimate::<6>(a_j, corr, a),
                    _ => stochastic_estimate::<10>(a_j, corr, a),
                };
                let mut s = EXPM1_TERMS[plan.terms - 1];
                for &q in EXPM1_TERMS[..plan.terms - 1].iter().rev() {
                    s = s.mul_add(a, q);
                }
                let fused = a_j.mul_add(a * s, corr);
                let c = rb as f64 / (1u64 << b) as f64;
                let e = (c / n as f64).exp2();
                let g = lns.value(j as i64) * NEVER as f64 * e - a_j as f64;
                for est in [separate, fused] {
                    let err = (est as f64 - g).abs();
                    worst = worst.max(err / delta);
                    assert!(
                        err <= delta,
                        "f = {f}, j = {j}, b = {b}, r = {r:#x}: |{est} - {g}| > {delta}"
                    );
                }
            }
            // The bound is not vacuous: the estimate uses a fair share of it somewhere,
            // and it stays far below the gap between thresholds.
            assert!(worst > 1e-3, "f = {f}: worst error {worst} of the bound");
            let gap = (1u64 << 23) as f64 * std::f64::consts::LN_2 / n as f64;
            assert!(
                delta < gap / 1000.0,
                "f = {f}: bound {delta} against gap {gap}"
            );
        }
    }

    /// The Taylor polynomial's truncation, `a^N / (N + 1)! / (1 - a)` relative to `P` at
    /// the largest `a = ln 2 / 2^f`, is within the `2^-26` the bound assumes.
    #[test]
    fn taylor_terms_suffice_for_every_fraction_width() {
        for f in 0..=MAX_FRACTION_BITS {
            let lns = Lns::new(32, f).unwrap();
            let plan = LnsF32Plan::new(&lns, RuleKind::Stochastic).unwrap();
            let a = std::f64::consts::LN_2 / (1u64 << f) as f64;
            let factorial: f64 = (1..=plan.terms + 1).map(|i| i as f64).product();
            let truncation = a.powi(plan.terms as i32) / factorial / (1.0 - a);
            assert!(
                truncation <= 1.0 / (1u64 << 26) as f64,
                "f = {f}: {} terms leave {truncation:e}",
                plan.terms
            );
        }
    }
}
