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
//!   pattern, the exponent field of `x` plus `bits(Y_j) - bits(1.0)`, a carry into the
//!   exponent where `Y_j = 2`.
//!
//! # Finding `j`
//!
//! The mantissa's top `g` bits index a table of buckets. Neighbouring thresholds are at least
//! `(2^(1/2^f) - 1) 2^23 > ln 2 2^(23-f)` mantissas apart, so with `g = f + 1` (a bucket
//! spans `2^(22-f)` mantissas) a bucket holds at most one threshold; the plan checks this and
//! takes more index bits where it fails (thresholds are whole mantissas, so their gaps can
//! be one shorter). Four tables indexed by the bucket hold its first code `j0`, the one
//! threshold `T` it may contain (`2^23`, never reached, when none) and the output offsets of
//! `j0` and `j0 + 1`, so `j = j0 + (M >= T)` is one compare (with AVX2, one gather per
//! table).
//!
//! # Stochastic rounding
//!
//! `j` is `floor(t)` less `E 2^f` from the toward-zero thresholds (kept values included: a
//! kept input never rounds up, since its fraction relative to the kept code is negative, its
//! estimate below the error bound, and `c >= 2^-23` more than twice that bound). The step
//! up compares the fraction with the threshold `c = (r + 1) / 2^b` exactly as the scalar
//! path does: the estimate `phi = log2_significand(m) 2^f - j` is within
//! `LOG2_ERROR 2^f` of the true fraction (`lns_approx.rs` proves the bound), so it decides
//! whenever it is farther than that from `c`; the rest (a vanishing fraction of the inputs)
//! take the scalar path.
//!
//! # Clamps
//!
//! The code `k = b 2^f - 127 2^f + j` (`b` the exponent byte) is formed in integers and
//! checked against the range: above `k_max` the result is `±max` (every mode saturates);
//! below `k_min`, deterministic rules give `±min` or zero, and since rounding is monotone in
//! `|x|` that is one comparison of the magnitude bits with the first pattern whose scalar
//! code is not zero (found by bisection with the scalar rounding when the plan is built).
//! Stochastic rounding below `min` (a ratio of magnitudes against the random bits) takes the
//! scalar path.
//!
//! # What takes the scalar path
//!
//! Exponent bytes 0 (subnormals), 254 (results that may leave f32's range) and 255 (Inf,
//! NaN); stochastic underflow and the stochastic decisions within the error bound; and
//! formats with `f > MAX_FRACTION_BITS` (the tables would grow past a few MiB). Zeros are
//! written directly (the lns zero is unsigned: `±0` gives `+0`).

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

/// The precomputed f32 fast path for one lns format and rounding rule.
#[derive(Debug, Clone)]
pub struct LnsF32Plan {
    lns: Lns,
    kind: RuleKind,
    /// `23 - g`: the mantissa shift that gives the bucket index.
    shift: u32,
    /// Per bucket (struct of arrays, one gather each): the mantissa from which the code is
    /// `j0 + 1` ([`NEVER`] if not in the bucket), the output offsets of `j0` and `j0 + 1`
    /// (`bits(Y_j) - bits(1.0)`), and `j0`, the code offset of the bucket's first mantissa.
    threshold: Vec<u32>,
    low: Vec<u32>,
    high: Vec<u32>,
    j0: Vec<u32>,
    /// `bits(Y_j) - bits(1.0)` for `j` in `0..=2^f` (stochastic rounding steps past the
    /// bucket's two).
    offsets: Vec<u32>,
    /// `f`, and `127 * 2^f` (the code of the exponent byte `b` is `b 2^f - bias`).
    f: u32,
    bias: i32,
    k_min: i32,
    k_max: i32,
    /// The f32 bits of the stored `max` and `min` magnitudes.
    max_bits: u32,
    min_bits: u32,
    /// The smallest magnitude bits whose code is not zero (deterministic rules; below `min`,
    /// the result is `min` from here on and zero before).
    underflow: u32,
    /// `2^f` and `LOG2_ERROR 2^f` (stochastic).
    scale: f64,
    eta: f64,
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
        let mut g = f + 1;
        let (threshold, low, high, j0) = loop {
            if let Some(tables) = Self::buckets(&thresholds, &offsets, g) {
                break tables;
            }
            if g == 23 {
                return None;
            }
            g += 1;
        };
        // Underflow: the scalar code of a magnitude is zero below one f32 pattern (rounding
        // is monotone), found by bisection.
        let (mut lo, mut hi) = (0u32, 0x7f80_0000u32);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if code(lns, f32::from_bits(mid) as f64, kind) == LnsCode::Zero {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Some(LnsF32Plan {
            lns: *lns,
            kind,
            shift: 23 - g,
            threshold,
            low,
            high,
            j0,
            offsets,
            f,
            bias: 127 << f,
            k_min: lns.k_min() as i32,
            k_max: lns.k_max() as i32,
            max_bits: (lns.max_value() as f32).to_bits(),
            min_bits: (lns.min_positive() as f32).to_bits(),
            underflow: lo,
            scale: n as f64,
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

    /// The bucket tables with `g` index bits (threshold, low, high, j0), or `None` if a
    /// bucket would hold two thresholds.
    #[allow(clippy::type_complexity)]
    fn buckets(
        thresholds: &[u32],
        offsets: &[u32],
        g: u32,
    ) -> Option<(Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>)> {
        let shift = 23 - g;
        for pair in thresholds.windows(2) {
            if pair[1] != NEVER && pair[0] >> shift == pair[1] >> shift {
                return None;
            }
        }
        let size = 1usize << g;
        let mut tables = (
            Vec::with_capacity(size),
            Vec::with_capacity(size),
            Vec::with_capacity(size),
            Vec::with_capacity(size),
        );
        let mut j0 = 0usize;
        for idx in 0..1u32 << g {
            let start = idx << shift;
            while j0 < thresholds.len() && thresholds[j0] <= start {
                j0 += 1;
            }
            tables.0.push(thresholds.get(j0).copied().unwrap_or(NEVER));
            tables.1.push(offsets[j0]);
            tables.2.push(offsets[(j0 + 1).min(offsets.len() - 1)]);
            tables.3.push(j0 as u32);
        }
        Some(tables)
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
        // Exponent bytes 1..=253: normal inputs whose results stay normal.
        let mut slow = (byte.wrapping_sub(1) > 252) & !zero;
        let m = abs & MANTISSA;
        let i = (m >> self.shift) as usize;
        // SAFETY: `m < 2^23`, so `i < 2^(23 - shift)`, the tables' length.
        let (threshold, low, high, j0) = unsafe {
            (
                *self.threshold.get_unchecked(i),
                *self.low.get_unchecked(i),
                *self.high.get_unchecked(i),
                *self.j0.get_unchecked(i),
            )
        };
        let step = m >= threshold;
        let j = j0 + step as u32;
        let k = ((byte << self.f) + j) as i32 - self.bias;
        let (offset, k) = if R::KIND == RuleKind::Stochastic {
            // Below min, stochastic rounding compares |x| / min with the random bits.
            slow |= k < self.k_min;
            let significand = ((m | NEVER) as u64) << 29;
            let phi = log2_significand(significand) * self.scale - j as f64;
            let b = rule.random_bits();
            let c = ((random >> (32 - b)) + 1) as f64 * f64::from_bits((1023 - b as u64) << 52);
            let up = phi > c;
            slow |= ((phi - c).abs() <= self.eta) & !zero;
            let j = ((j + up as u32) as usize).min(self.offsets.len() - 1);
            // SAFETY: `j` is clamped to the table.
            (unsafe { *self.offsets.get_unchecked(j) }, k + up as i32)
        } else {
            (if step { high } else { low }, k)
        };
        let value = ((abs & EXPONENT) + offset) | sign;
        let tiny = if abs >= self.underflow {
            self.min_bits | sign
        } else {
            0
        };
        let out = if zero {
            0
        } else if k < self.k_min {
            tiny
        } else if k > self.k_max {
            self.max_bits | sign
        } else {
            value
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

    /// The branch-free pass over one run: writes each fast-path result to `dst` and its
    /// slow flag to `flags`; returns whether any flag is set. No calls and no data-dependent
    /// branches, so it vectorises (table reads become gathers).
    #[inline(always)]
    fn pass<R: RoundingRule>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u8],
    ) -> bool {
        let mut any = 0u8;
        for (((o, &x), &r), flag) in dst.iter_mut().zip(src).zip(random).zip(flags) {
            let (out, slow) = self.round_one(x.to_bits(), r, rule);
            *o = f32::from_bits(out);
            *flag = slow as u8;
            any |= slow as u8;
        }
        any != 0
    }

    /// [`LnsF32Plan::pass`], compiled for AVX2 (gathers) when the CPU has it.
    #[inline(always)]
    fn pass_dispatch<R: RoundingRule>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u8],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, checked just above.
                return unsafe { self.pass_avx2(src, dst, rule, random, flags) };
            }
        }
        self.pass(src, dst, rule, random, flags)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn pass_avx2<R: RoundingRule>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
        flags: &mut [u8],
    ) -> bool {
        self.pass(src, dst, rule, random, flags)
    }

    /// Rounds one run (at most [`RUN`] elements) from `src` into `dst`: the branch-free
    /// pass, then the scalar path for the elements it flags.
    #[inline(always)]
    fn run<R: RoundingRule>(&self, src: &[f32], dst: &mut [f32], rule: R, random: &[u32]) {
        let mut flags = [0u8; RUN];
        let flags = &mut flags[..src.len()];
        if self.pass_dispatch(src, dst, rule, random, flags) {
            for (((o, &x), &r), &flag) in dst.iter_mut().zip(src).zip(random).zip(&*flags) {
                if flag != 0 {
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
