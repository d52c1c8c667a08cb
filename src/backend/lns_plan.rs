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
//! f32 normal. So, for `2^-126 <= 2^E` and `2^(E + 1) <= 2^127`:
//!
//! - `J` is a nondecreasing step function of `M`: `J(M)` is the number of thresholds
//!   `T_i <= M`, `T_i` the smallest mantissa whose code in binade 0 is at least `i + 1`.
//!   The thresholds are found by searching with the exact scalar rounding itself
//!   ([`Lns::round_code_stored`] of lns<32,f>, whose binade 0 holds no clamp), starting from
//!   an f64 estimate (`2^((i + 1/2)/2^f)` for nearest, `2^((i + 1)/2^f)` for toward-zero);
//!   they are right by construction, kept values included.
//! - The output is `2^E` times the f32 `Y_j` of `2^(j/2^f)` (`Y_(2^f) = 2`): on the bit
//!   pattern, the exponent field of `x` plus `bits(Y_j) - bits(1.0)`, a carry into the
//!   exponent where `Y_j = 2`.
//!
//! # Finding `j`
//!
//! The mantissa's top `g` bits index a table of buckets. Neighbouring thresholds are at least
//! `(2^(1/2^f) - 1) 2^23 > ln 2 2^(23-f)` mantissas apart, so with `g = f + 1` (a bucket
//! spans `2^(22-f)` mantissas) a bucket holds at most one threshold; the plan checks this and
//! takes more index bits where it fails. A bucket stores its first code `j0`, the one
//! threshold `T` it may contain (`2^23`, never reached, when none) and both output offsets,
//! so `j = j0 + (M >= T)` is one load and one compare.
//!
//! # Stochastic rounding
//!
//! `j` is `floor(t)` less `E 2^f` from the toward-zero thresholds (kept values included: a
//! kept input never rounds up, since its estimated fraction lies just below zero). The step
//! up compares the fraction with the threshold `c = (r + 1) / 2^b` exactly as the scalar
//! path does: the estimate `phi = log2_significand(m) 2^f - j` is within
//! `LOG2_ERROR 2^f` of the true fraction (`lns_approx.rs` proves the bound), so it decides
//! whenever it is farther than that from `c`; the rest (a vanishing fraction of the inputs)
//! take the scalar path.
//!
//! # What takes the scalar path
//!
//! f32 subnormals, Inf and NaN; the binades where a code would leave `[k_min, k_max]`
//! (saturation, underflow) or the result f32's normal range; the stochastic decisions within
//! the error bound; and formats with `f > MAX_FRACTION_BITS` (the tables would grow past a
//! few MiB). Zeros are written directly (the lns zero is unsigned: `±0` gives `+0`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use crate::format::lns::{Lns, LnsCode};
use crate::format::lns_approx::{log2_significand, LOG2_ERROR};
use crate::format::rounding::{NearestAway, NearestEven, RoundingRule, RuleKind, TowardZero};
use crate::philox::Stream;

const SIGN: u32 = 0x8000_0000;
const EXPONENT: u32 = 0x7f80_0000;
const MANTISSA: u32 = 0x007f_ffff;
/// `2^23`: a threshold no mantissa reaches.
const NEVER: u32 = 1 << 23;

/// The largest `f` with a fast path (its bucket table has `2^(f+1)` entries of 16 bytes).
pub const MAX_FRACTION_BITS: u32 = 16;

/// Elements per parallel work item (a multiple of 4, so each Philox block stays in one).
const CHUNK: usize = 1 << 14;
/// Elements per run of the branch-free pass (its random words and flags are staged in
/// stack buffers of this size).
const RUN: usize = 1024;

/// One bucket of mantissas (those with the same top `g` bits).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(16))]
struct Bucket {
    /// The mantissa from which the code is `j0 + 1` ([`NEVER`] if not in this bucket).
    threshold: u32,
    /// The output offset of `j0`: `bits(Y_j0) - bits(1.0)`.
    low: u32,
    /// The output offset of `j0 + 1`.
    high: u32,
    /// The code offset of the bucket's first mantissa.
    j0: u32,
}

/// The precomputed f32 fast path for one lns format and rounding rule.
#[derive(Debug, Clone)]
pub struct LnsF32Plan {
    lns: Lns,
    kind: RuleKind,
    /// `23 - g`: the mantissa shift that gives the bucket index.
    shift: u32,
    buckets: Vec<Bucket>,
    /// `bits(Y_j) - bits(1.0)` for `j` in `0..=2^f` (stochastic rounding steps past the
    /// bucket's two).
    offsets: Vec<u32>,
    /// The exponent bytes of the fast path: `byte - lo <= span` (wrapping).
    lo: u32,
    span: u32,
    /// `2^f` and `LOG2_ERROR 2^f` (stochastic).
    scale: f64,
    eta: f64,
}

/// The code of `1 + m / 2^23` in lns<32,f> (binade 0, no clamp) with a rule of `kind`
/// (stochastic: its floor, toward-zero with kept values).
fn binade_code(l32: &Lns, m: u32, kind: RuleKind) -> i64 {
    let x = 1.0 + m as f64 / NEVER as f64;
    let stored = |v: f64| v as f32 as f64;
    let code = match kind {
        RuleKind::NearestEven => l32.round_code_stored(x, NearestEven, 0, stored),
        RuleKind::NearestAway => l32.round_code_stored(x, NearestAway, 0, stored),
        RuleKind::TowardZero | RuleKind::Stochastic => {
            l32.round_code_stored(x, TowardZero, 0, stored)
        }
    };
    match code {
        LnsCode::Value { negative: false, k } => k,
        other => unreachable!("1 <= x < 2 rounds to a positive code, not {other:?}"),
    }
}

impl LnsF32Plan {
    /// The plan for `lns` and rules of `kind`; `None` when `f > MAX_FRACTION_BITS` or no
    /// binade of f32 lies inside the format's range.
    pub fn new(lns: &Lns, kind: RuleKind) -> Option<Self> {
        let f = lns.f();
        if f > MAX_FRACTION_BITS {
            return None;
        }
        // Binades E whose codes E 2^f ..= (E + 1) 2^f all lie in [k_min, k_max], with
        // inputs and results f32 normals (E in -126..=126).
        let n = 1i64 << f;
        let e_lo =
            (-126i64).max(lns.k_min().div_euclid(n) + (lns.k_min().rem_euclid(n) != 0) as i64);
        let e_hi = 126i64.min(lns.k_max().div_euclid(n) - 1);
        if e_lo > e_hi {
            return None;
        }
        let l32 = Lns::new(32, f).expect("f <= 16 fits lns<32,f>");
        let thresholds = Self::thresholds(&l32, kind);
        let offsets: Vec<u32> = (0..=n)
            .map(|j| (l32.value(j) as f32).to_bits() - 1f32.to_bits())
            .collect();
        let mut g = f + 1;
        let buckets = loop {
            if let Some(b) = Self::buckets(&thresholds, &offsets, g) {
                break b;
            }
            if g == 23 {
                return None;
            }
            g += 1;
        };
        Some(LnsF32Plan {
            lns: *lns,
            kind,
            shift: 23 - g,
            buckets,
            offsets,
            lo: (e_lo + 127) as u32,
            span: (e_hi - e_lo) as u32,
            scale: (n as f64),
            eta: LOG2_ERROR * n as f64,
        })
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

    /// The bucket table with `g` index bits, or `None` if a bucket would hold two
    /// thresholds.
    fn buckets(thresholds: &[u32], offsets: &[u32], g: u32) -> Option<Vec<Bucket>> {
        let shift = 23 - g;
        for pair in thresholds.windows(2) {
            if pair[1] != NEVER && pair[0] >> shift == pair[1] >> shift {
                return None;
            }
        }
        let mut buckets = Vec::with_capacity(1 << g);
        let mut j0 = 0usize;
        for idx in 0..1u32 << g {
            let start = idx << shift;
            while j0 < thresholds.len() && thresholds[j0] <= start {
                j0 += 1;
            }
            let threshold = thresholds.get(j0).copied().unwrap_or(NEVER);
            buckets.push(Bucket {
                threshold,
                low: offsets[j0],
                high: offsets[(j0 + 1).min(offsets.len() - 1)],
                j0: j0 as u32,
            });
        }
        Some(buckets)
    }

    /// The format this plan rounds to.
    pub fn lns(&self) -> &Lns {
        &self.lns
    }

    /// The rule kind this plan was built for.
    pub fn kind(&self) -> RuleKind {
        self.kind
    }

    /// The mantissa bits that index the bucket table (`g`, normally `f + 1`).
    pub fn index_bits(&self) -> u32 {
        23 - self.shift
    }

    /// The exponent bytes the fast path covers, `lo..=hi`.
    pub fn exponent_bytes(&self) -> std::ops::RangeInclusive<u32> {
        self.lo..=self.lo + self.span
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

    /// The fast-path result's bits for `bits` (an f32 pattern) and whether the element needs
    /// the scalar path instead (its result is then a placeholder). Branch-free.
    #[inline(always)]
    fn round_one<R: RoundingRule>(&self, bits: u32, random: u32, rule: R) -> (u32, bool) {
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        let byte = abs >> 23;
        let zero = abs == 0;
        let slow = (byte.wrapping_sub(self.lo) > self.span) & !zero;
        let m = abs & MANTISSA;
        let bucket = self.buckets[(m >> self.shift) as usize];
        let step = m >= bucket.threshold;
        let (offset, slow) = if R::KIND == RuleKind::Stochastic {
            let j = bucket.j0 + step as u32;
            let significand = ((m | NEVER) as u64) << 29;
            let phi = log2_significand(significand) * self.scale - j as f64;
            let b = rule.random_bits();
            let c = ((random >> (32 - b)) + 1) as f64 * f64::from_bits((1023 - b as u64) << 52);
            let up = phi > c;
            let unsure = (phi - c).abs() <= self.eta;
            let j = (j + up as u32) as usize;
            (
                self.offsets[j.min(self.offsets.len() - 1)],
                slow | (unsure & !zero),
            )
        } else {
            (if step { bucket.high } else { bucket.low }, slow)
        };
        let out = if zero {
            0
        } else {
            ((abs & EXPONENT) + offset) | sign
        };
        (out, slow)
    }

    /// Rounds `x` on the fast path, or `None` where it needs the scalar path
    /// ([`Lns::round_stored`] with f32 storage).
    #[inline]
    pub fn round_fast<R: RoundingRule>(&self, x: f32, rule: R, random: u32) -> Option<f32> {
        debug_assert_eq!(R::KIND, self.kind);
        let (out, slow) = self.round_one(x.to_bits(), random, rule);
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

    /// Rounds one run (at most [`RUN`] elements) from `src` into `dst`.
    #[inline(always)]
    fn run<R: RoundingRule>(&self, src: &[f32], dst: &mut [f32], rule: R, random: &[u32]) {
        let mut flags = [false; RUN];
        let mut any = false;
        let stochastic = R::KIND == RuleKind::Stochastic;
        for (j, (o, &x)) in dst.iter_mut().zip(src).enumerate() {
            let r = if stochastic { random[j] } else { 0 };
            let (out, slow) = self.round_one(x.to_bits(), r, rule);
            *o = f32::from_bits(out);
            flags[j] = slow;
            any |= slow;
        }
        if any {
            for (j, (o, &x)) in dst.iter_mut().zip(src).enumerate() {
                if flags[j] {
                    let r = if stochastic { random[j] } else { 0 };
                    *o = self.slow(x, rule, r);
                }
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
            let mut staged = [0f32; RUN];
            let mut start = 0;
            while start < out.len() {
                let len = RUN.min(out.len() - start);
                let first = base + start;
                if let Some(stream) = stream.filter(|_| R::KIND == RuleKind::Stochastic) {
                    stream.fill((first / 4) as u64, &mut words[..len]);
                }
                let o = &mut out[start..start + len];
                let inp = match src {
                    Some(s) => &s[first..first + len],
                    None => {
                        staged[..len].copy_from_slice(o);
                        &staged[..len]
                    }
                };
                self.run(inp, o, rule, &words[..len]);
                start += len;
            }
        };
        if dst.len() <= CHUNK {
            work(0, dst);
        } else {
            dst.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(c, out)| work(c, out));
        }
    }
}
