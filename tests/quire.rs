//! Testing policy: the quire and the GEMMs built on it are checked bit for bit against a slow
//! exact reference that shares no code with src/.
//!
//! * The reference decodes posit patterns by the standard's definition (cross-checked against
//!   softposit's exact decoders on every pattern), holds every value and every dot product as
//!   a big integer in units of minpos² (num-bigint), and rounds an exact value to a pattern by
//!   the standard's rule: find the neighbouring patterns p, p + 1 by exact comparison; the
//!   boundary between them is the value of the (n+1)-bit pattern `(p << 1) | 1`; ties go to the
//!   even pattern; |x| > maxpos gives maxpos, 0 < |x| < minpos gives minpos. It is itself
//!   checked against softposit's exact conversions and the named facts of ORACLES.md.
//! * [`Quire`] (every entry point, every accessor) on random vectors, massive cancellation,
//!   minpos²/maxpos² terms, 100k-term vectors, every (n+1)-bit boundary (ties) of every
//!   format with n <= 16 and one minpos² either side, every 8-bit product and every 6-bit
//!   fused a·b + c, off-grid operands and NaR, for posit<8,0>, <8,1>, <8,2>, <16,1>, <16,2>
//!   and the odd ones <6,0>, <10,1>, <12,3>, <16,5> (the widest supported, maxpos = 2^448)
//!   and <32,2>.
//! * `quire_gemm` on each accumulator path (I16, F64, I128, Wide; the path asserted, with the
//!   i16 path's chunk and tile edges), with biases, NaR and ±Inf rows/columns, and the tensor
//!   ops (`quire_matmul`, batched and broadcast, `linear`, `conv2d` against a direct loop
//!   over the receptive field, inputs whose posit value lies beyond their dtype's range).
//! * softposit's quires where they are exact (`Q8E0` below 2^19, `Q16E1` on random long
//!   vectors and every boundary), and their wraps (Q8E0 at 2^19, Q16E1 at 2^71), pinned.
//! * Naive GEMMs against step-by-step loops of independent arithmetic: softposit `P8E0` and
//!   `P16E1` (checked first against the reference; `PxE1<16>` arithmetic is wrong, pinned),
//!   the `half` crate for fp16, exactly rounded bf16 operations, an OCP e4m3 reference and
//!   the exact reference; the tables of every posit of at most 8 bits and of e4m3 on all
//!   pattern pairs; NaN in formats without a NaN pattern.
//! * Round-to-odd helpers against exact big-integer results.
//! * Invalid inputs give errors, not panics.
//!
//! Mismatches are collected (count and first few) rather than stopping at the first one.

mod common;
use common::Mismatches;

use std::cmp::Ordering;

use candle_core::{DType, Device, Tensor};
use half::f16;
use num_bigint::BigInt;
use num_traits::{One, Signed, ToPrimitive, Zero};
use qcandle::format::Posit;
use qcandle::quire::gemm_cpu::{
    accumulator_for, naive_gemm, quire_gemm, Accumulator, Bias, OpTables,
};
use qcandle::quire::round_odd::{add_odd, i128_to_f64_odd, mul_odd, u128_to_f64_odd};
use qcandle::quire::{conv2d, linear, matmul, naive_matmul, quire_matmul, Accumulation, Quire};
use qcandle::Format;
use softposit::{PxE1, PxE2, P16E1, P8E0, Q16E1, Q8E0};

// ---------------------------------------------------------------------------------------
// Independent helpers (no code from src/).
// ---------------------------------------------------------------------------------------

/// SplitMix64: a tiny fixed-seed generator, so every run sees the same inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// `2^s` built from its bits (`s` must be a normal f64 exponent).
fn two_pow(s: i32) -> f64 {
    assert!((-1022..=1023).contains(&s), "2^{s} is not a normal f64");
    f64::from_bits(((s + 1023) as u64) << 52)
}

/// `x * 2^e`, exact whenever the result is a normal f64.
fn ldexp(mut x: f64, mut e: i64) -> f64 {
    while e > 1000 {
        x *= two_pow(1000);
        e -= 1000;
    }
    while e < -1000 {
        x *= two_pow(-1000);
        e += 1000;
    }
    x * two_pow(e as i32)
}

/// A finite f64 as an exact big integer in units of `2^-1074`.
fn f64_units(x: f64) -> BigInt {
    assert!(x.is_finite());
    if x == 0.0 {
        return BigInt::zero();
    }
    let bits = x.to_bits();
    let field = ((bits >> 52) & 0x7ff) as i64;
    let frac = bits & ((1 << 52) - 1);
    let (m, e) = if field == 0 {
        (frac, -1074)
    } else {
        (frac | 1 << 52, field - 1075)
    };
    let v = BigInt::from(m) << (e + 1074) as usize;
    if x < 0.0 {
        -v
    } else {
        v
    }
}

/// The exact value `x * 2^-u` rounded to odd at 53 bits: exact when it fits, else the
/// truncated significand with its last bit set. The result must be a normal f64.
fn ref_odd(x: &BigInt, u: u32) -> f64 {
    if x.is_zero() {
        return 0.0;
    }
    let ax = x.abs();
    let len = ax.bits();
    let (m, e) = if len <= 53 {
        (ax.to_u64().unwrap(), -(u as i64))
    } else {
        let shift = len - 53;
        let kept = &ax >> shift as usize;
        let lost = ax != (&kept << shift as usize);
        (
            kept.to_u64().unwrap() | lost as u64,
            shift as i64 - u as i64,
        )
    };
    let v = ldexp(m as f64, e);
    if x.is_negative() {
        -v
    } else {
        v
    }
}

/// Bitwise equality that treats every NaN as equal.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn same32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// A posit value read from its bit string by the standard's definition: sign (two's
/// complement), regime run and its terminator, `es` exponent bits (those past the end are 0),
/// then the fraction. `Some((negative, sig, exp))` for `(-1)^negative * sig * 2^exp`; zero has
/// `sig = 0`; NaR gives None. `2 <= n <= 33`.
fn ref_decode(bits: u64, n: u32, es: u32) -> Option<(bool, u64, i32)> {
    assert!((2..=33).contains(&n));
    let mask = (1u64 << n) - 1;
    let p = bits & mask;
    let sign_bit = 1u64 << (n - 1);
    if p == 0 {
        return Some((false, 0, 0));
    }
    if p == sign_bit {
        return None;
    }
    let negative = p & sign_bit != 0;
    let mag = if negative { p.wrapping_neg() & mask } else { p };
    let len = n - 1; // bits after the sign
    let bit = |i: u32| (mag >> (len - 1 - i)) & 1;
    let first = bit(0);
    let mut run = 1;
    while run < len && bit(run) == first {
        run += 1;
    }
    let k = if first == 1 {
        run as i32 - 1
    } else {
        -(run as i32)
    };
    let mut i = run + 1; // skip the terminator (possibly past the end)
    let mut e = 0u64;
    for _ in 0..es {
        e <<= 1;
        if i < len {
            e |= bit(i);
        }
        i += 1;
    }
    let (mut frac, mut flen) = (0u64, 0u32);
    while i < len {
        frac = (frac << 1) | bit(i);
        flen += 1;
        i += 1;
    }
    let scale = (k << es) + e as i32;
    Some((negative, (1 << flen) | frac, scale - flen as i32))
}

fn ref_decode_f64(bits: u64, n: u32, es: u32) -> f64 {
    match ref_decode(bits, n, es) {
        None => f64::NAN,
        Some((_, 0, _)) => 0.0,
        Some((neg, sig, exp)) => {
            let v = ldexp(sig as f64, exp as i64);
            if neg {
                -v
            } else {
                v
            }
        }
    }
}

/// The value of a decoded posit in units of `2^-u` (must be an integer there).
fn decoded_units((neg, sig, exp): (bool, u64, i32), u: u32) -> BigInt {
    let shift = exp + u as i32;
    assert!(shift >= 0, "not a multiple of 2^-{u}");
    let v = BigInt::from(sig) << shift as usize;
    if neg {
        -v
    } else {
        v
    }
}

/// One term of a dot product, on bit patterns.
#[derive(Debug, Clone, Copy)]
enum Term {
    /// `+ a * b` through `Quire::add_product` (f64 values).
    Product(u32, u32),
    /// `- a * b` through `Quire::sub_product`.
    NegProduct(u32, u32),
    /// `+ a` through `Quire::add`.
    Single(u32),
    /// `+ a * b` through `Quire::add_product_bits`.
    Bits(u32, u32),
}

/// How random patterns are drawn.
#[derive(Debug, Clone, Copy)]
enum Draw {
    /// Any pattern but NaR.
    Uniform,
    /// Within a few hundred patterns of ±1.
    NearOne,
    /// ±minpos, ±maxpos and their neighbours.
    Extreme,
    /// One of the three, per pattern.
    Mixed,
}

/// The exact reference for posit(n, es): values in units of minpos = 2^-s, sums in units of
/// minpos² = 2^-2s, and the standard's rounding by exact comparison.
struct Ref {
    n: u32,
    es: u32,
    s: u32,
    /// Every n-bit pattern's value in units of minpos (None for NaR), when n <= 16.
    units: Vec<Option<BigInt>>,
    /// Every positive (n+1)-bit pattern's value in units of minpos², when n <= 16.
    bounds: Vec<BigInt>,
}

impl Ref {
    fn new(n: u32, es: u32) -> Ref {
        let s = (n - 2) << es;
        let mut r = Ref {
            n,
            es,
            s,
            units: Vec::new(),
            bounds: Vec::new(),
        };
        if n <= 16 {
            r.units = (0..1u32 << n)
                .map(|p| ref_decode(p as u64, n, es).map(|d| decoded_units(d, s)))
                .collect();
            r.bounds = (0..1u64 << n)
                .map(|q| decoded_units(ref_decode(q, n + 1, es).unwrap(), 2 * s))
                .collect();
        }
        r
    }

    fn posit(&self) -> Posit {
        Posit::new(self.n, self.es).unwrap()
    }

    fn format(&self) -> Format {
        Format::Posit(self.posit())
    }

    fn name(&self) -> String {
        format!("posit<{},{}>", self.n, self.es)
    }

    fn mask(&self) -> u32 {
        ((1u64 << self.n) - 1) as u32
    }

    fn nar(&self) -> u32 {
        1 << (self.n - 1)
    }

    fn maxp(&self) -> u32 {
        self.nar() - 1
    }

    fn one(&self) -> u32 {
        1 << (self.n - 2)
    }

    fn neg(&self, p: u32) -> u32 {
        p.wrapping_neg() & self.mask()
    }

    /// Value of pattern `p` in units of minpos; None for NaR.
    fn minpos_units(&self, p: u32) -> Option<BigInt> {
        if self.units.is_empty() {
            ref_decode(p as u64, self.n, self.es).map(|d| decoded_units(d, self.s))
        } else {
            self.units[p as usize].clone()
        }
    }

    /// Value of the non-NaR pattern `p` in units of minpos².
    fn sq_units(&self, p: u32) -> BigInt {
        self.minpos_units(p).expect("not NaR") << self.s as usize
    }

    /// Value of the positive (n+1)-bit pattern `q` in units of minpos².
    fn bound(&self, q: u32) -> BigInt {
        if self.bounds.is_empty() {
            decoded_units(
                ref_decode(q as u64, self.n + 1, self.es).unwrap(),
                2 * self.s,
            )
        } else {
            self.bounds[q as usize].clone()
        }
    }

    /// Value of pattern `p` as f64 (exact for every format tested here); NaN for NaR.
    fn value(&self, p: u32) -> f64 {
        ref_decode_f64(p as u64, self.n, self.es)
    }

    /// The pattern of the exact value `x * 2^-2s`, rounded by the standard's rule.
    fn round(&self, x: &BigInt) -> u32 {
        self.round_at(x, 2 * self.s)
    }

    /// The pattern of the exact value `x * 2^-u`, rounded by the standard's rule.
    fn round_at(&self, x: &BigInt, u: u32) -> u32 {
        if x.is_zero() {
            return 0;
        }
        let two_s = 2 * self.s;
        // Compare `ax` (units 2^-U) with values in units 2^-2s shifted by `sv`.
        let (ax, sv) = if u >= two_s {
            (x.abs(), (u - two_s) as usize)
        } else {
            (x.abs() << (two_s - u) as usize, 0)
        };
        let cmp = |v: BigInt| ax.cmp(&(v << sv));
        let maxp = self.maxp();
        let mag = if cmp(self.sq_units(maxp)) != Ordering::Less {
            maxp
        } else if cmp(self.sq_units(1)) != Ordering::Greater {
            1
        } else {
            // value(lo) < |x| < value(hi)
            let (mut lo, mut hi) = (1u32, maxp);
            let mut exact = None;
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                match cmp(self.sq_units(mid)) {
                    Ordering::Equal => {
                        exact = Some(mid);
                        break;
                    }
                    Ordering::Less => hi = mid,
                    Ordering::Greater => lo = mid,
                }
            }
            match exact {
                Some(p) => p,
                None => match cmp(self.bound((lo << 1) | 1)) {
                    Ordering::Less => lo,
                    Ordering::Greater => lo + 1,
                    Ordering::Equal if lo % 2 == 0 => lo,
                    Ordering::Equal => lo + 1,
                },
            }
        };
        if x.is_negative() {
            self.neg(mag)
        } else {
            mag
        }
    }

    /// The pattern of a finite f64 rounded by the standard's rule (NaN and ±Inf give NaR).
    fn round_f64(&self, x: f64) -> u32 {
        if !x.is_finite() {
            return self.nar();
        }
        self.round_at(&f64_units(x), 1074)
    }

    /// A random pattern (never NaR).
    fn draw(&self, rng: &mut Rng, how: Draw) -> u32 {
        let how = match how {
            Draw::Mixed => [Draw::Uniform, Draw::NearOne, Draw::Extreme][rng.below(3) as usize],
            h => h,
        };
        loop {
            let p = match how {
                Draw::Uniform | Draw::Mixed => rng.next() as u32 & self.mask(),
                Draw::NearOne => {
                    let span = 1u64 << (self.n - 3).min(8);
                    let p = self.one() + rng.below(span) as u32 - (span / 2) as u32;
                    if rng.coin() {
                        self.neg(p)
                    } else {
                        p
                    }
                }
                Draw::Extreme => {
                    let m = self.maxp();
                    let p = [1, 2, 3, m, m - 1, m - 2][rng.below(6) as usize];
                    if rng.coin() {
                        self.neg(p)
                    } else {
                        p
                    }
                }
            };
            if p != self.nar() {
                return p;
            }
        }
    }

    fn random_term(&self, rng: &mut Rng, how: Draw) -> Term {
        let (a, b) = (self.draw(rng, how), self.draw(rng, how));
        match rng.below(4) {
            0 => Term::Product(a, b),
            1 => Term::NegProduct(a, b),
            2 => Term::Single(a),
            _ => Term::Bits(a, b),
        }
    }

    /// The exact value of a term in units of minpos²; None when an operand is NaR.
    fn term_units(&self, t: Term) -> Option<BigInt> {
        Some(match t {
            Term::Product(a, b) | Term::Bits(a, b) => {
                self.minpos_units(a)? * self.minpos_units(b)?
            }
            Term::NegProduct(a, b) => -(self.minpos_units(a)? * self.minpos_units(b)?),
            Term::Single(a) => self.minpos_units(a)? << self.s as usize,
        })
    }

    /// The exact sum of `terms` in units of minpos²; None when NaR was involved.
    fn exact(&self, terms: &[Term]) -> Option<BigInt> {
        let mut sum = BigInt::zero();
        for &t in terms {
            sum += self.term_units(t)?;
        }
        Some(sum)
    }

    /// Terms whose exact sum is `target` (units of minpos², > 0): greedily the largest
    /// `posit * w` at most the remainder, with `w` one of minpos, 1 and maxpos (so that some
    /// choice lands where posits are dense, also for large es).
    fn decompose(&self, target: &BigInt) -> Vec<Term> {
        let mut rest = target.clone();
        let mut terms = Vec::new();
        // (pattern of w, log2 of w in units of minpos)
        let scales = [(1, 0), (self.one(), self.s), (self.maxp(), 2 * self.s)];
        while rest.is_positive() {
            assert!(
                terms.len() < 1000,
                "{}: decomposition of {target:#x} does not converge (rest {rest:#x}, last terms {:?})",
                self.name(),
                &terms[terms.len() - 5..]
            );
            let mut best: Option<(BigInt, Term)> = None;
            for (w, shift) in scales {
                if (BigInt::one() << shift as usize) > rest {
                    continue;
                }
                let key = |p: u32| self.minpos_units(p).unwrap() << shift as usize;
                let p = self.largest_at_most(key, &rest);
                let c = key(p);
                if best.as_ref().is_none_or(|(b, _)| c > *b) {
                    best = Some((c, Term::Product(p, w)));
                }
            }
            let (c, t) = best.expect("minpos·minpos fits any positive remainder");
            rest -= c;
            terms.push(t);
        }
        terms
    }

    /// The largest positive pattern `p` with `key(p) <= x` (`key` increasing, `key(1) <= x`).
    fn largest_at_most(&self, key: impl Fn(u32) -> BigInt, x: &BigInt) -> u32 {
        let (mut lo, mut hi) = (1u32, self.maxp() + 1); // key(lo) <= x < key(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if key(mid) <= *x {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// Formats the quire is checked on.
const QUIRE_FORMATS: &[(u32, u32)] = &[
    (8, 0),
    (8, 1),
    (8, 2),
    (16, 1),
    (16, 2),
    (6, 0),
    (10, 1),
    (12, 3),
    (16, 5),
    (32, 2),
];

fn apply(q: &mut Quire, r: &Ref, t: Term) {
    match t {
        Term::Product(a, b) => q.add_product(r.value(a), r.value(b)),
        Term::NegProduct(a, b) => q.sub_product(r.value(a), r.value(b)),
        Term::Single(a) => q.add(r.value(a)),
        Term::Bits(a, b) => q.add_product_bits(a, b),
    }
}

/// Checks every accessor of `q` against the exact sum (None: NaR).
fn check_quire(
    r: &Ref,
    q: &Quire,
    exact: Option<&BigInt>,
    mm: &mut Mismatches,
    what: impl Fn() -> String,
) {
    let want = exact.map_or(r.nar(), |x| r.round(x));
    let got = q.to_bits();
    mm.check(got == want, || {
        format!(
            "{} {}: to_bits {got:#x}, expected {want:#x}",
            r.name(),
            what()
        )
    });
    let (gv, wv) = (q.to_posit(), r.value(want));
    mm.check(same(gv, wv), || {
        format!("{} {}: to_posit {gv:e}, expected {wv:e}", r.name(), what())
    });
    let (go, wo) = (
        q.to_f64_odd(),
        exact.map_or(f64::NAN, |x| ref_odd(x, 2 * r.s)),
    );
    mm.check(same(go, wo), || {
        format!(
            "{} {}: to_f64_odd {go:e}, expected {wo:e}",
            r.name(),
            what()
        )
    });
    mm.check(q.is_nar() == exact.is_none(), || {
        format!("{} {}: is_nar {}", r.name(), what(), q.is_nar())
    });
}

/// Runs `terms` through a fresh quire and checks the result.
fn check_terms(r: &Ref, terms: &[Term], mm: &mut Mismatches, what: impl Fn() -> String) {
    let mut q = Quire::new(r.posit()).unwrap();
    for &t in terms {
        apply(&mut q, r, t);
    }
    check_quire(r, &q, r.exact(terms).as_ref(), mm, what);
}

// ---------------------------------------------------------------------------------------
// 1. The reference itself.
// ---------------------------------------------------------------------------------------

macro_rules! decoder_vs_pxe {
    ($mm:expr, $ty:ident, $es:expr, $($n:literal),*) => {$(
        for p in 0..1u32 << $n {
            let want = $ty::<$n>::from_bits(p << (32 - $n)).to_f64();
            let got = ref_decode_f64(p as u64, $n, $es);
            $mm.check(same(got, want), || {
                format!("{}<{}> pattern {p:#x}: reference {got:e}, softposit {want:e}", stringify!($ty), $n)
            });
        }
    )*};
}

/// The reference decoder equals softposit's exact decoders (`to_f64` of every type) on every
/// pattern of P8E0, P16E1, PxE1<3..=16> and PxE2<4..=16>.
#[test]
fn reference_decoder_matches_softposit_on_every_pattern() {
    let mut mm = Mismatches::default();
    for p in 0..=255u8 {
        let (got, want) = (ref_decode_f64(p as u64, 8, 0), P8E0::from_bits(p).to_f64());
        mm.check(same(got, want), || {
            format!("P8E0 {p:#x}: {got:e} vs {want:e}")
        });
    }
    for p in 0..=u16::MAX {
        let (got, want) = (
            ref_decode_f64(p as u64, 16, 1),
            P16E1::from_bits(p).to_f64(),
        );
        mm.check(same(got, want), || {
            format!("P16E1 {p:#x}: {got:e} vs {want:e}")
        });
    }
    decoder_vs_pxe!(mm, PxE1, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    decoder_vs_pxe!(mm, PxE2, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    mm.assert_none("reference decoder vs softposit");
}

/// The reference rounding equals softposit's exact conversions (P8E0, PxE1<N>, PxE2<N>) on
/// random f64 inputs, and reproduces the named facts of ORACLES.md.
#[test]
fn reference_rounding_matches_softposit_conversions_and_oracle_facts() {
    let mut mm = Mismatches::default();
    let mut rng = Rng(1);
    let refs = [
        Ref::new(8, 0),
        Ref::new(16, 1),
        Ref::new(10, 1),
        Ref::new(8, 2),
        Ref::new(16, 2),
    ];
    for _ in 0..20_000 {
        // Random f64 spanning every posit's range, with short and long significands.
        let e = rng.below(130) as i32 - 65;
        let m = (rng.next() >> 11) as f64 / two_pow(53) + 1.0;
        let m = if rng.coin() {
            m
        } else {
            (m * 64.0).floor() / 64.0
        };
        let x = if rng.coin() { m } else { -m } * two_pow(e);
        let sp = [
            P8E0::from_f64(x).to_bits() as u32,
            PxE1::<16>::from_f64(x).to_bits() >> 16,
            PxE1::<10>::from_f64(x).to_bits() >> 22,
            PxE2::<8>::from_f64(x).to_bits() >> 24,
            PxE2::<16>::from_f64(x).to_bits() >> 16,
        ];
        for (r, want) in refs.iter().zip(sp) {
            let got = r.round_f64(x);
            mm.check(got == want, || {
                format!("{} round({x:e}): {got:#x}, softposit {want:#x}", r.name())
            });
        }
    }
    mm.assert_none("reference rounding vs softposit");

    // ORACLES.md: geometric boundaries where exponent bits are cut off.
    let p16 = &refs[1];
    let p = |x: f64| p16.value(p16.round_f64(x));
    assert_eq!(
        p(two_pow(27)),
        two_pow(26),
        "2^27 ties to the even pattern (2^26)"
    );
    assert_eq!(p(1.5 * two_pow(27)), two_pow(28));
    assert_eq!(p(two_pow(27) * (1.0 + 1e-12)), two_pow(28));
    assert_eq!(p(two_pow(-27) * (1.0 + 1e-12)), two_pow(-26));
    assert_eq!(p(1e30), two_pow(28), "beyond maxpos saturates");
    assert_eq!(p(1e-30), two_pow(-28), "below minpos gives minpos");
    assert_eq!(p(-1e-30), -two_pow(-28));
    let p82 = &refs[3];
    assert_eq!(p82.value(p82.round_f64(144179.2)), 262144.0);
    assert_eq!(p82.round_f64(f64::INFINITY), 0x80);
    assert_eq!(p82.round_f64(0.0), 0);
}

// ---------------------------------------------------------------------------------------
// 1. Quire against the exact reference.
// ---------------------------------------------------------------------------------------

/// Random vectors of every length from 1 to 2000 (mostly short), through every entry point
/// of the quire, checked after random prefixes and at the end.
#[test]
fn quire_matches_exact_reference_on_random_vectors() {
    let mut all = Mismatches::default();
    let mut checks = 0u64;
    for (fi, &(n, es)) in QUIRE_FORMATS.iter().enumerate() {
        let r = Ref::new(n, es);
        let mut rng = Rng(100 + fi as u64);
        let mut mm = Mismatches::default();
        let mut q = Quire::new(r.posit()).unwrap();
        for v in 0..1000 {
            let len = match v % 4 {
                0 => 1 + rng.below(4) as usize,
                1 => 1 + rng.below(64) as usize,
                2 => 1 + rng.below(400) as usize,
                _ => 1 + rng.below(2000) as usize,
            };
            let how = [Draw::Uniform, Draw::NearOne, Draw::Mixed][v % 3];
            q.clear();
            let mut sum = BigInt::zero();
            for i in 0..len {
                let t = r.random_term(&mut rng, how);
                apply(&mut q, &r, t);
                sum += r.term_units(t).unwrap();
                if i + 1 == len || rng.below(64) == 0 {
                    checks += 1;
                    check_quire(&r, &q, Some(&sum), &mut mm, || {
                        format!("vector {v} ({how:?}), after {} of {len} terms", i + 1)
                    });
                }
            }
        }
        all = all.merge(mm);
    }
    all.assert_none_of("quire vs exact reference, random vectors", checks);
}

/// x·y terms and their negations in shuffled order, plus one tiny term, leave exactly the tiny
/// term; large sums (maxpos² terms) cancelling to residues of a few minpos².
#[test]
fn quire_is_exact_under_massive_cancellation() {
    let mut mm = Mismatches::default();
    for (fi, &(n, es)) in QUIRE_FORMATS.iter().enumerate() {
        let r = Ref::new(n, es);
        let mut rng = Rng(200 + fi as u64);
        let (maxp, one) = (r.maxp(), r.one());
        // Tiny residues: minpos², -minpos², minpos·1, 3·minpos² (not a product of posits
        // alone but a sum), minpos·(1 + eps).
        let tinies: Vec<Vec<Term>> = vec![
            vec![Term::Product(1, 1)],
            vec![Term::NegProduct(1, 1)],
            vec![Term::Product(1, one)],
            vec![Term::Product(1, 1), Term::Product(1, 2), Term::Bits(1, 1)],
            vec![Term::Product(1, one + 1)],
        ];
        for (ti, tiny) in tinies.iter().enumerate() {
            for len in [1usize, 10, 500] {
                let mut terms: Vec<Term> = (0..len)
                    .map(|_| {
                        let (a, b) = (r.draw(&mut rng, Draw::Mixed), r.draw(&mut rng, Draw::Mixed));
                        Term::Product(a, b)
                    })
                    .collect();
                let mut back: Vec<Term> = terms
                    .iter()
                    .map(|t| match *t {
                        Term::Product(a, b) if rng.coin() => Term::NegProduct(a, b),
                        Term::Product(a, b) => Term::Bits(r.neg(a), b),
                        _ => unreachable!(),
                    })
                    .collect();
                rng.shuffle(&mut back);
                let at = rng.below(len as u64) as usize;
                terms.splice(at..at, tiny.iter().copied());
                terms.extend(back);
                let exact = r.exact(&terms).unwrap();
                assert_eq!(exact, r.exact(tiny).unwrap(), "the big terms cancel");
                check_terms(&r, &terms, &mut mm, || {
                    format!("residue {ti} after {len} cancelling pairs")
                });
            }
        }
        // maxpos² sums cancelling to a few minpos².
        for residue in [1u32, 2, 3, 5] {
            let mut terms = vec![Term::Product(maxp, maxp); 64];
            terms.extend(vec![Term::NegProduct(maxp, maxp); 63]);
            terms.push(Term::NegProduct(maxp, maxp));
            for _ in 0..residue {
                terms.push(Term::Product(1, 1));
            }
            rng.shuffle(&mut terms);
            check_terms(&r, &terms, &mut mm, || {
                format!("64 maxpos² - 64 maxpos² + {residue} minpos²")
            });
        }
        // Explicit expectations for the simplest residues.
        let mut q = Quire::new(r.posit()).unwrap();
        q.add_product(r.value(maxp), r.value(maxp));
        q.add_product(r.value(1), r.value(1));
        q.sub_product(r.value(maxp), r.value(maxp));
        assert_eq!(
            q.to_bits(),
            1,
            "{}: maxpos² + minpos² - maxpos² gives minpos",
            r.name()
        );
        q.sub_product(r.value(1), r.value(1));
        assert_eq!(
            q.to_bits(),
            0,
            "{}: ... - minpos² gives exactly 0",
            r.name()
        );
        q.sub_product(r.value(1), r.value(1));
        assert_eq!(
            q.to_bits(),
            r.neg(1),
            "{}: -minpos² gives -minpos",
            r.name()
        );
    }
    mm.assert_none("quire under massive cancellation");
}

/// Single and repeated minpos·minpos and maxpos·maxpos terms (and their mixes) round to the
/// reference, with the saturating results spelled out.
#[test]
fn quire_handles_minpos_squared_and_maxpos_squared_terms() {
    let mut mm = Mismatches::default();
    for &(n, es) in QUIRE_FORMATS {
        let r = Ref::new(n, es);
        let (maxp, one) = (r.maxp(), r.one());
        let mut cases: Vec<(String, Vec<Term>)> = vec![
            ("minpos²".into(), vec![Term::Product(1, 1)]),
            ("maxpos²".into(), vec![Term::Product(maxp, maxp)]),
            ("-maxpos²".into(), vec![Term::NegProduct(maxp, maxp)]),
            ("maxpos·minpos".into(), vec![Term::Product(maxp, 1)]),
            ("maxpos·-minpos".into(), vec![Term::Bits(maxp, r.neg(1))]),
            ("1000 minpos²".into(), vec![Term::Product(1, 1); 1000]),
            ("1000 maxpos²".into(), vec![Term::Product(maxp, maxp); 1000]),
            (
                "maxpos² + minpos²".into(),
                vec![Term::Product(maxp, maxp), Term::Product(1, 1)],
            ),
            (
                "maxpos - minpos²".into(),
                vec![Term::Single(maxp), Term::NegProduct(1, 1)],
            ),
            (
                "1 - minpos²".into(),
                vec![Term::Single(one), Term::NegProduct(1, 1)],
            ),
        ];
        // maxpos·(maxpos - 1 ulp) - maxpos·maxpos: a large negative difference.
        cases.push((
            "maxpos·prev(maxpos) - maxpos²".into(),
            vec![Term::Product(maxp, maxp - 1), Term::NegProduct(maxp, maxp)],
        ));
        for (what, terms) in &cases {
            check_terms(&r, terms, &mut mm, || what.clone());
        }
        let bits = |terms: &[Term]| {
            let mut q = Quire::new(r.posit()).unwrap();
            terms.iter().for_each(|&t| apply(&mut q, &r, t));
            q.to_bits()
        };
        assert_eq!(bits(&cases[0].1), 1, "{}: minpos² gives minpos", r.name());
        assert_eq!(
            bits(&cases[1].1),
            maxp,
            "{}: maxpos² gives maxpos",
            r.name()
        );
        assert_eq!(bits(&cases[2].1), r.neg(maxp), "{}", r.name());
        assert_eq!(bits(&cases[3].1), one, "{}: maxpos·minpos is 1", r.name());
        assert_eq!(bits(&cases[6].1), maxp, "{}: 1000 maxpos²", r.name());
    }
    mm.assert_none("minpos² and maxpos² terms");
}

/// 100k-term vectors: random, 100k maxpos² (far past 4s bits, into the carry bits), and
/// 100k maxpos² cancelled by 100k -maxpos² around one minpos².
#[test]
fn quire_is_exact_on_100k_term_vectors() {
    let mut mm = Mismatches::default();
    for (fi, &(n, es)) in [(8, 0), (8, 2), (16, 1), (16, 2), (12, 3)]
        .iter()
        .enumerate()
    {
        let r = Ref::new(n, es);
        let mut rng = Rng(300 + fi as u64);
        let maxp = r.maxp();
        let random: Vec<Term> = (0..100_000)
            .map(|_| r.random_term(&mut rng, Draw::Mixed))
            .collect();
        check_terms(&r, &random, &mut mm, || "100k random terms".into());
        let big = vec![Term::Product(maxp, maxp); 100_000];
        check_terms(&r, &big, &mut mm, || "100k maxpos²".into());
        let mut q = Quire::new(r.posit()).unwrap();
        big.iter().for_each(|&t| apply(&mut q, &r, t));
        assert_eq!(q.to_bits(), maxp, "{}: 100k maxpos² saturates", r.name());
        let mut cancel = big.clone();
        cancel.push(Term::Product(1, 1));
        cancel.extend(vec![Term::NegProduct(maxp, maxp); 100_000]);
        check_terms(&r, &cancel, &mut mm, || "100k maxpos² cancelled".into());
        let mut q = Quire::new(r.posit()).unwrap();
        cancel.iter().for_each(|&t| apply(&mut q, &r, t));
        assert_eq!(
            q.to_bits(),
            1,
            "{}: the residue minpos² gives minpos",
            r.name()
        );
    }
    mm.assert_none("100k-term vectors");
}

/// Patterns to test neighbours of: every positive pattern below maxpos for n <= 16, else
/// both ends of the range and a random sample.
fn tie_patterns(r: &Ref, rng: &mut Rng) -> Vec<u32> {
    let maxp = r.maxp();
    if r.n <= 16 {
        return (1..maxp).collect();
    }
    let mut ps: Vec<u32> = (1..40).chain(maxp - 40..maxp).collect();
    ps.extend((0..400).map(|_| 1 + rng.below(maxp as u64 - 1) as u32));
    ps
}

/// Sums exactly at the boundary between neighbouring patterns p and p + 1 (the (n+1)-bit
/// pattern `(p << 1) | 1`) round to the even one; one minpos² below or above goes to p or
/// p + 1. Positive and negative, in the uniform and the cut-exponent zones.
#[test]
fn quire_rounds_sums_at_n_plus_1_bit_boundaries_ties_to_even() {
    let mut mm = Mismatches::default();
    let mut checks = 0;
    for (fi, &(n, es)) in QUIRE_FORMATS.iter().enumerate() {
        let r = Ref::new(n, es);
        let mut rng = Rng(400 + fi as u64);
        for p in tie_patterns(&r, &mut rng) {
            let bound = r.bound((p << 1) | 1);
            let at_bound = r.decompose(&bound);
            assert_eq!(r.exact(&at_bound).unwrap(), bound);
            for (delta, want) in [
                (0i32, if p % 2 == 0 { p } else { p + 1 }),
                (-1, p),
                (1, p + 1),
            ] {
                let target = &bound + delta;
                // The reference agrees with the expectation (it is not the thing under test,
                // but a wrong reference must not pass silently).
                assert_eq!(
                    r.round(&target),
                    want,
                    "{} reference at p = {p:#x}",
                    r.name()
                );
                let mut terms = at_bound.clone();
                match delta {
                    -1 => terms.push(Term::NegProduct(1, 1)),
                    1 => terms.push(Term::Product(1, 1)),
                    _ => {}
                }
                rng.shuffle(&mut terms);
                checks += 2;
                check_terms(&r, &terms, &mut mm, || {
                    format!("boundary of {p:#x}|{:#x} {delta:+} minpos²", p + 1)
                });
                let negated: Vec<Term> = terms
                    .iter()
                    .map(|t| match *t {
                        Term::Product(a, b) => Term::NegProduct(a, b),
                        Term::NegProduct(a, b) => Term::Product(a, b),
                        _ => unreachable!(),
                    })
                    .collect();
                check_terms(&r, &negated, &mut mm, || {
                    format!("negated boundary of {p:#x}|{:#x} {delta:+} minpos²", p + 1)
                });
            }
        }
    }
    mm.assert_none_of("quire at (n+1)-bit rounding boundaries", checks);
}

/// One call on a quire with an f64 argument.
type QuireOp = fn(&mut Quire, f64);

/// A NaR (or NaN, or ±Inf, which rounds to NaR) operand makes the quire NaR, also times zero
/// and through later terms that would cancel, until `clear`.
#[test]
fn quire_nar_is_sticky_until_clear() {
    for &(n, es) in QUIRE_FORMATS {
        let r = Ref::new(n, es);
        let name = r.name();
        let nar_ops: [(&str, QuireOp); 6] = [
            ("add_product(NaN, x)", |q, x| q.add_product(f64::NAN, x)),
            ("sub_product(x, NaN)", |q, x| q.sub_product(x, f64::NAN)),
            ("add(NaN)", |q, _| q.add(f64::NAN)),
            ("add(Inf)", |q, _| q.add(f64::INFINITY)),
            ("add_product(-Inf, 0)", |q, _| {
                q.add_product(f64::NEG_INFINITY, 0.0)
            }),
            ("add_product(NaN, 0)", |q, _| q.add_product(f64::NAN, 0.0)),
        ];
        for (what, op) in nar_ops {
            let mut q = Quire::new(r.posit()).unwrap();
            q.add_product(r.value(r.one()), r.value(r.one()));
            op(&mut q, 3.0);
            assert!(q.is_nar(), "{name} {what}");
            assert_eq!(q.to_bits(), r.nar(), "{name} {what}");
            assert!(
                q.to_posit().is_nan() && q.to_f64_odd().is_nan(),
                "{name} {what}"
            );
            q.sub_product(r.value(r.one()), r.value(r.one()));
            q.add(0.0);
            assert_eq!(q.to_bits(), r.nar(), "{name} {what}: sticky");
            q.clear();
            assert!(!q.is_nar(), "{name} {what}: clear");
            assert_eq!(
                (q.to_bits(), q.to_f64_odd()),
                (0, 0.0),
                "{name} {what}: clear"
            );
            q.add(2.0);
            assert_eq!(
                q.to_bits(),
                r.round_f64(2.0),
                "{name} {what}: usable after clear"
            );
        }
        let mut q = Quire::new(r.posit()).unwrap();
        q.add_product_bits(r.nar(), 0);
        assert!(q.is_nar(), "{name} add_product_bits(NaR, 0)");
        q.add_product_bits(1, 1);
        assert_eq!(q.to_bits(), r.nar(), "{name} NaR pattern: sticky");
    }
}

/// Operands off the posit grid are rounded to the format (nearest, ties to even) before the
/// exact product: the result equals the reference on the rounded operands.
#[test]
fn quire_rounds_off_grid_operands_first() {
    let mut mm = Mismatches::default();
    let mut rng = Rng(500);
    for &(n, es) in &[(8, 0), (8, 2), (16, 1), (12, 3)] {
        let r = Ref::new(n, es);
        for i in 0..300 {
            let e = rng.below(2 * r.s as u64 + 8) as i32 - r.s as i32 - 4;
            let f = |rng: &mut Rng| {
                let m = 1.0 + (rng.next() >> 11) as f64 / two_pow(53);
                if rng.coin() {
                    -m
                } else {
                    m
                }
            };
            let (x, y) = (f(&mut rng) * two_pow(e), f(&mut rng));
            let (px, py) = (r.round_f64(x), r.round_f64(y));
            let terms = [
                Term::Product(px, py),
                Term::NegProduct(py, py),
                Term::Single(px),
            ];
            let mut q = Quire::new(r.posit()).unwrap();
            q.add_product(x, y);
            q.sub_product(y, y);
            q.add(x);
            check_quire(&r, &q, r.exact(&terms).as_ref(), &mut mm, || {
                format!("case {i}: x = {x:e}, y = {y:e}")
            });
        }
    }
    mm.assert_none("off-grid operands");
}

// ---------------------------------------------------------------------------------------
// 2. quire_gemm and the tensor ops.
// ---------------------------------------------------------------------------------------

fn p(n: u32, es: u32) -> Posit {
    Posit::new(n, es).unwrap()
}

/// The path each format takes, at the documented limits.
#[test]
fn accumulator_for_picks_the_narrowest_exact_path() {
    use Accumulator::*;
    // posit<8,0>: s = 6, i16 operands, exact while terms · 2^24 <= 2^53, i.e. terms < 2^29.
    assert_eq!(accumulator_for(p(8, 0), 1), I16);
    assert_eq!(accumulator_for(p(8, 0), 1000), I16);
    assert_eq!(accumulator_for(p(8, 0), (1 << 29) - 1), I16);
    // posit<7,1>: s = 10, too wide for i16 operands, f64 while terms < 2^13.
    assert_eq!(accumulator_for(p(7, 1), (1 << 13) - 1), F64);
    assert_eq!(accumulator_for(p(8, 0), 1 << 29), I128);
    // posit<8,1>: s = 12, f64 for fewer than 32 terms.
    assert_eq!(accumulator_for(p(8, 1), 31), F64);
    assert_eq!(accumulator_for(p(8, 1), 32), I128);
    // posit<8,2>: s = 24, i128 up to 2^30 terms.
    assert_eq!(accumulator_for(p(8, 2), 1), I128);
    assert_eq!(accumulator_for(p(8, 2), (1 << 30) - 1), I128);
    assert_eq!(accumulator_for(p(8, 2), 1 << 30), Wide);
    // posit<16,1>: s = 28, i128 below 2^14 terms.
    assert_eq!(accumulator_for(p(16, 1), 1), I128);
    assert_eq!(accumulator_for(p(16, 1), (1 << 14) - 1), I128);
    assert_eq!(accumulator_for(p(16, 1), 1 << 14), Wide);
    // posit<16,2>: s = 56, 2s > 62: always a quire.
    assert_eq!(accumulator_for(p(16, 2), 1), Wide);
    assert_eq!(accumulator_for(p(32, 2), 1), Wide);
    assert_eq!(accumulator_for(p(16, 5), 1), Wide);
    // Zero terms count as one.
    assert_eq!(accumulator_for(p(8, 0), 0), I16);
}

/// One GEMM's operands as bit patterns (row-major `a` (m x k), `b` (k x n)) and an optional bias.
struct Gemm {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<u32>,
    b: Vec<u32>,
    bias: Option<(bool, Vec<u32>)>, // (per row, values)
}

impl Gemm {
    fn random(r: &Ref, rng: &mut Rng, (m, k, n): (usize, usize, usize), how: Draw) -> Gemm {
        Gemm {
            m,
            k,
            n,
            a: (0..m * k).map(|_| r.draw(rng, how)).collect(),
            b: (0..k * n).map(|_| r.draw(rng, how)).collect(),
            bias: None,
        }
    }

    /// The exact output (i, j) in units of minpos²; None for NaR.
    fn exact(&self, r: &Ref, i: usize, j: usize) -> Option<BigInt> {
        let mut terms: Vec<Term> = (0..self.k)
            .map(|t| Term::Product(self.a[i * self.k + t], self.b[t * self.n + j]))
            .collect();
        if let Some((per_row, v)) = &self.bias {
            terms.push(Term::Single(v[if *per_row { i } else { j }]));
        }
        r.exact(&terms)
    }

    fn expected(&self, r: &Ref) -> Vec<f64> {
        (0..self.m * self.n)
            .map(|o| {
                let x = self.exact(r, o / self.n, o % self.n);
                r.value(x.map_or(r.nar(), |x| r.round(&x)))
            })
            .collect()
    }
}

fn compare(mm: &mut Mismatches, got: &[f64], want: &[f64], what: impl Fn(usize) -> String) {
    assert_eq!(got.len(), want.len());
    for (o, (&g, &w)) in got.iter().zip(want).enumerate() {
        mm.check(same(g, w), || {
            format!("{}: got {g:e}, expected {w:e}", what(o))
        });
    }
}

/// `quire_gemm` on every accumulator path (asserting the path), with and without biases per
/// row and per column, serial and parallel, with NaR rows and columns in some cases.
#[test]
fn quire_gemm_matches_reference_on_every_accumulator_path() {
    use Accumulator::*;
    let mut mm = Mismatches::default();
    let mut rng = Rng(600);
    let mut seen = Vec::new();
    // (n, es, m, k, n, path)
    let cases: &[(u32, u32, usize, usize, usize, Accumulator)] = &[
        (8, 0, 7, 33, 9, I16),
        (8, 0, 40, 300, 17, I16),
        (7, 1, 4, 100, 5, F64),
        (8, 1, 5, 30, 6, F64),
        (8, 1, 5, 40, 6, I128),
        (8, 2, 9, 50, 11, I128),
        (16, 1, 12, 70, 5, I128),
        (16, 1, 2, 20_000, 3, Wide),
        (16, 2, 8, 60, 7, Wide),
        (12, 3, 4, 25, 6, Wide),
        (6, 0, 3, 200, 4, I16),
        (10, 1, 6, 10, 6, I128),
        (6, 0, 6, 2, 6, I16),
        (16, 5, 3, 30, 4, Wide),
        (32, 2, 3, 30, 4, Wide),
    ];
    for (ci, &(pn, pes, m, k, n, path)) in cases.iter().enumerate() {
        let r = Ref::new(pn, pes);
        for variant in 0..4 {
            let how = [Draw::Mixed, Draw::NearOne, Draw::Uniform, Draw::Mixed][variant];
            let mut g = Gemm::random(&r, &mut rng, (m, k, n), how);
            let bias_kind = variant % 3; // none, per row, per col
            if bias_kind > 0 {
                let len = if bias_kind == 1 { m } else { n };
                let v = (0..len).map(|_| r.draw(&mut rng, how)).collect();
                g.bias = Some((bias_kind == 1, v));
            }
            if variant == 3 {
                // NaR in row 1 of a and column 2 of b (when they exist).
                if m > 1 {
                    g.a[k + rng.below(k as u64) as usize] = r.nar();
                }
                if n > 2 {
                    g.b[rng.below(k as u64) as usize * n + 2] = r.nar();
                }
            }
            let terms = k + usize::from(g.bias.is_some());
            assert_eq!(
                accumulator_for(r.posit(), terms),
                path,
                "case {ci}: {} with {terms} terms",
                r.name()
            );
            seen.push(path);
            let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
            let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
            let bias_v: Option<Vec<f64>> = g
                .bias
                .as_ref()
                .map(|(_, v)| v.iter().map(|&p| r.value(p)).collect());
            let bias = match (&g.bias, &bias_v) {
                (Some((true, _)), Some(v)) => Bias::PerRow(v),
                (Some((false, _)), Some(v)) => Bias::PerCol(v),
                _ => Bias::None,
            };
            let want = g.expected(&r);
            for parallel in [false, true] {
                let mut out = vec![0.0; m * n];
                quire_gemm(r.posit(), &a, &b, (m, k, n), bias, &mut out, parallel);
                compare(&mut mm, &out, &want, |o| {
                    format!(
                        "case {ci} {} ({m}x{k}x{n}, {path:?}) variant {variant} parallel {parallel} out[{}][{}]",
                        r.name(),
                        o / n,
                        o % n
                    )
                });
                if variant == 3 {
                    for (o, v) in out.iter().enumerate() {
                        let nar = (m > 1 && o / n == 1) || (n > 2 && o % n == 2);
                        mm.check(v.is_nan() == nar, || {
                            format!(
                                "case {ci} {}: NaR leaks to out[{}][{}] = {v}",
                                r.name(),
                                o / n,
                                o % n
                            )
                        });
                    }
                }
            }
        }
    }
    for path in [I16, F64, I128, Wide] {
        assert!(seen.contains(&path), "{path:?} not covered");
    }
    mm.assert_none("quire_gemm vs reference");
}

/// posit<16,1> at the I128 limit: 16383 maxpos² terms (the largest sum the i128 path takes),
/// then the same with a bias (16384 terms: Wide); each also cancelled down to one minpos².
#[test]
fn quire_gemm_i128_and_wide_paths_meet_at_2_pow_14_terms_for_posit16_1() {
    let r = Ref::new(16, 1);
    let posit = r.posit();
    let (maxpos, minpos) = (r.value(r.maxp()), r.value(1));
    let mut mm = Mismatches::default();
    for (k, bias) in [(16383usize, false), (16383, true), (16384, false)] {
        let terms = k + usize::from(bias);
        let path = accumulator_for(posit, terms);
        assert_eq!(
            path,
            if terms < 1 << 14 {
                Accumulator::I128
            } else {
                Accumulator::Wide
            }
        );
        // Row 0: all maxpos·maxpos (saturates); row 1: -maxpos·maxpos.
        // Row 2: half +maxpos², half -maxpos², one minpos·minpos: exactly minpos².
        let m = 3;
        let mut a = vec![maxpos; m * k];
        for t in 0..k {
            a[k + t] = -maxpos;
            a[2 * k + t] = if t % 2 == 0 { maxpos } else { -maxpos };
        }
        let mut b = vec![maxpos; k];
        a[2 * k + k - 1] = minpos;
        b[k - 1] = minpos;
        // With an odd k the row-2 pairs are (k - 1) / 2 each way when the last one is minpos².
        let bias_v = [0.0];
        let bias_b = if bias {
            Bias::PerCol(&bias_v)
        } else {
            Bias::None
        };
        let mut out = vec![0.0; m];
        quire_gemm(posit, &a, &b, (m, k, 1), bias_b, &mut out, false);
        let pattern_of = |x: f64| match x {
            x if x == maxpos => r.maxp(),
            x if x == -maxpos => r.neg(r.maxp()),
            x if x == minpos => 1,
            _ => unreachable!(),
        };
        let exact = |row: usize| -> BigInt {
            let mut sum = BigInt::zero();
            for t in 0..k {
                let (x, y) = (a[row * k + t], b[t]);
                let ux = r.minpos_units(pattern_of(x)).unwrap();
                let uy = r.minpos_units(pattern_of(y)).unwrap();
                sum += ux * uy;
            }
            sum
        };
        for (row, &got) in out.iter().enumerate() {
            let want = r.value(r.round(&exact(row)));
            mm.check(same(got, want), || {
                format!("k = {k}, bias {bias} ({path:?}): row {row} {got:e} vs {want:e}")
            });
        }
        if k % 2 == 1 {
            assert_eq!(out[2], minpos, "k = {k}: cancels to minpos² -> minpos");
        }
        assert_eq!((out[0], out[1]), (maxpos, -maxpos), "k = {k}");
    }
    mm.assert_none("i128/wide limit");
}

fn tensor(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// `quire_matmul` on batched (2, 3, m, k) · (2, 3, k, n) and broadcast (4, m, k) · (k, n)
/// inputs equals the reference per batch item, on each path; f32 inputs give f32 outputs.
#[test]
fn quire_matmul_batched_and_broadcast_match_reference() {
    let mut mm = Mismatches::default();
    let mut rng = Rng(700);
    for &(pn, pes) in &[(8, 0), (8, 2), (16, 1), (16, 2)] {
        let r = Ref::new(pn, pes);
        let fmt = r.format();
        let (m, k, n) = (5, 23, 4);
        // Batched: 6 items, each its own b.
        let gs: Vec<Gemm> = (0..6)
            .map(|_| Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed))
            .collect();
        let a: Vec<f64> = gs
            .iter()
            .flat_map(|g| g.a.iter().map(|&p| r.value(p)))
            .collect();
        let b: Vec<f64> = gs
            .iter()
            .flat_map(|g| g.b.iter().map(|&p| r.value(p)))
            .collect();
        let out =
            quire_matmul(&tensor(&a, &[2, 3, m, k]), &tensor(&b, &[2, 3, k, n]), &fmt).unwrap();
        assert_eq!(out.dims(), &[2, 3, m, n]);
        let want: Vec<f64> = gs.iter().flat_map(|g| g.expected(&r)).collect();
        compare(&mut mm, &values(&out), &want, |o| {
            format!("{} batched out[{o}]", r.name())
        });
        // Broadcast b.
        let shared = Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed);
        let mut gs: Vec<Gemm> = (0..4)
            .map(|_| Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed))
            .collect();
        gs.iter_mut().for_each(|g| g.b = shared.b.clone());
        let a: Vec<f64> = gs
            .iter()
            .flat_map(|g| g.a.iter().map(|&p| r.value(p)))
            .collect();
        let b: Vec<f64> = shared.b.iter().map(|&p| r.value(p)).collect();
        let out = quire_matmul(&tensor(&a, &[4, m, k]), &tensor(&b, &[k, n]), &fmt).unwrap();
        assert_eq!(out.dims(), &[4, m, n]);
        let want: Vec<f64> = gs.iter().flat_map(|g| g.expected(&r)).collect();
        compare(&mut mm, &values(&out), &want, |o| {
            format!("{} broadcast out[{o}]", r.name())
        });
        // f32 in, f32 out; `matmul` with Accumulation::Quire is the same op.
        let g = &gs[0];
        let a32: Vec<f32> = g.a.iter().map(|&p| r.value(p) as f32).collect();
        let b32: Vec<f32> = g.b.iter().map(|&p| r.value(p) as f32).collect();
        let at = Tensor::from_vec(a32, (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b32, (k, n), &Device::Cpu).unwrap();
        let out = matmul(&at, &bt, &fmt, Accumulation::Quire).unwrap();
        assert_eq!(out.dtype(), DType::F32);
        compare(&mut mm, &values(&out), &g.expected(&r), |o| {
            format!("{} f32 out[{o}]", r.name())
        });
    }
    mm.assert_none("quire_matmul");
}

/// `linear` with Accumulation::Quire: the bias is one more term inside the quire (one rounding
/// per output), on each path. Includes a case where rounding the dot product before adding
/// the bias would differ.
#[test]
fn quire_linear_accumulates_the_bias_inside_the_quire() {
    let mut mm = Mismatches::default();
    let mut rng = Rng(800);
    for &(pn, pes) in &[(8, 0), (8, 2), (16, 1), (16, 2)] {
        let r = Ref::new(pn, pes);
        let fmt = r.format();
        let (rows, inp, outf) = (6, 37, 5);
        // x (rows, in) is `a`; w (out, in) is b transposed.
        let mut g = Gemm::random(&r, &mut rng, (rows, inp, outf), Draw::Mixed);
        let bias: Vec<u32> = (0..outf).map(|_| r.draw(&mut rng, Draw::Mixed)).collect();
        g.bias = Some((false, bias.clone()));
        let x: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
        let mut w = vec![0.0; outf * inp];
        for t in 0..inp {
            for o in 0..outf {
                w[o * inp + t] = r.value(g.b[t * outf + o]);
            }
        }
        let bv: Vec<f64> = bias.iter().map(|&p| r.value(p)).collect();
        let out = linear(
            &tensor(&x, &[rows, inp]),
            &tensor(&w, &[outf, inp]),
            Some(&tensor(&bv, &[outf])),
            &fmt,
            Accumulation::Quire,
        )
        .unwrap();
        assert_eq!(out.dims(), &[rows, outf]);
        compare(&mut mm, &values(&out), &g.expected(&r), |o| {
            format!("{} linear out[{o}]", r.name())
        });
    }
    // posit<8,0>: 1 + 1/64 (not a posit: ties to 1) plus bias 1/64 is exactly 1 + 1/32 in
    // the quire; rounding first would give round(1 + 1/64) = 1.
    let fmt = Format::posit(8, 0).unwrap();
    let x = tensor(&[1.0, 0.015625], &[1, 2]);
    let w = tensor(&[1.0, 1.0], &[1, 2]);
    let b = tensor(&[0.015625], &[1]);
    let out = linear(&x, &w, Some(&b), &fmt, Accumulation::Quire).unwrap();
    assert_eq!(values(&out), [1.03125]);
    mm.assert_none("quire linear");
}

/// Reference convolution: direct loop over the receptive field, exact sums.
#[allow(clippy::too_many_arguments)]
fn conv_reference(
    r: &Ref,
    x: &[u32],
    (nb, c, h, wd): (usize, usize, usize, usize),
    w: &[u32],
    (oc, kh, kw): (usize, usize, usize),
    bias: Option<&[u32]>,
    stride: usize,
    pad: usize,
) -> (Vec<f64>, usize, usize) {
    let oh = (h + 2 * pad - kh) / stride + 1;
    let ow = (wd + 2 * pad - kw) / stride + 1;
    let mut out = Vec::new();
    for b in 0..nb {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut terms = Vec::new();
                    for ci in 0..c {
                        for i in 0..kh {
                            for j in 0..kw {
                                let y = (oy * stride + i) as isize - pad as isize;
                                let xx = (ox * stride + j) as isize - pad as isize;
                                if y < 0 || xx < 0 || y >= h as isize || xx >= wd as isize {
                                    continue;
                                }
                                let xv = x[((b * c + ci) * h + y as usize) * wd + xx as usize];
                                let wv = w[((o * c + ci) * kh + i) * kw + j];
                                terms.push(Term::Product(wv, xv));
                            }
                        }
                    }
                    if let Some(bias) = bias {
                        terms.push(Term::Single(bias[o]));
                    }
                    let e = r.exact(&terms);
                    out.push(r.value(e.map_or(r.nar(), |e| r.round(&e))));
                }
            }
        }
    }
    (out, oh, ow)
}

/// `conv2d` with Accumulation::Quire equals a direct loop of the exact reference over the
/// receptive field: stride 2 with padding 1, stride 1 with padding 2 and a non-square
/// kernel, one image (parallel GEMM) and several (parallel images), with and without bias.
#[test]
fn quire_conv2d_matches_direct_reference_loop() {
    let mut mm = Mismatches::default();
    let mut rng = Rng(900);
    for &(pn, pes) in &[(8, 0), (16, 1), (16, 2)] {
        let r = Ref::new(pn, pes);
        let fmt = r.format();
        for &(nb, c, h, wd, oc, kh, kw, stride, pad, with_bias) in &[
            (
                3usize, 2usize, 7usize, 6usize, 3usize, 3usize, 3usize, 2usize, 1usize, true,
            ),
            (1, 3, 5, 8, 2, 2, 3, 1, 2, true),
            (2, 1, 9, 9, 4, 5, 5, 2, 1, false),
        ] {
            let x: Vec<u32> = (0..nb * c * h * wd)
                .map(|_| r.draw(&mut rng, Draw::Mixed))
                .collect();
            let w: Vec<u32> = (0..oc * c * kh * kw)
                .map(|_| r.draw(&mut rng, Draw::Mixed))
                .collect();
            let bias: Vec<u32> = (0..oc).map(|_| r.draw(&mut rng, Draw::Mixed)).collect();
            let bias = with_bias.then_some(bias.as_slice());
            let (want, oh, ow) =
                conv_reference(&r, &x, (nb, c, h, wd), &w, (oc, kh, kw), bias, stride, pad);
            let xt = tensor(
                &x.iter().map(|&p| r.value(p)).collect::<Vec<_>>(),
                &[nb, c, h, wd],
            );
            let wt = tensor(
                &w.iter().map(|&p| r.value(p)).collect::<Vec<_>>(),
                &[oc, c, kh, kw],
            );
            let bt =
                bias.map(|b| tensor(&b.iter().map(|&p| r.value(p)).collect::<Vec<_>>(), &[oc]));
            let out = conv2d(
                &xt,
                &wt,
                bt.as_ref(),
                stride,
                pad,
                &fmt,
                Accumulation::Quire,
            )
            .unwrap();
            assert_eq!(out.dims(), &[nb, oc, oh, ow]);
            compare(&mut mm, &values(&out), &want, |o| {
                format!(
                    "{} conv {nb}x{c}x{h}x{wd} * {oc}x{c}x{kh}x{kw} s{stride} p{pad}: out[{o}]",
                    r.name()
                )
            });
        }
    }
    mm.assert_none("quire conv2d");
}

/// NaN (NaR) inputs in one row of `a` and one column of `b` make exactly that row and
/// column of the output NaN, on each path, through the tensor op.
#[test]
fn quire_matmul_nar_rows_and_cols_give_nan_only_in_their_outputs() {
    let mut rng = Rng(1000);
    for &(pn, pes, k) in &[
        (8, 0, 20),
        (8, 2, 20),
        (16, 1, 20),
        (16, 1, 16384),
        (16, 2, 20),
    ] {
        let r = Ref::new(pn, pes);
        let (m, n) = (4, 5);
        let mut g = Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed);
        g.a[2 * k + 3] = r.nar();
        g.b[(k - 1) * n + 1] = r.nar();
        let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
        let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
        let out =
            values(&quire_matmul(&tensor(&a, &[m, k]), &tensor(&b, &[k, n]), &r.format()).unwrap());
        let want = g.expected(&r);
        for (o, (&v, &w)) in out.iter().zip(&want).enumerate() {
            let nar = o / n == 2 || o % n == 1;
            assert_eq!(
                v.is_nan(),
                nar,
                "{} k = {k}: out[{}][{}] = {v}",
                r.name(),
                o / n,
                o % n
            );
            assert!(same(v, w), "{} k = {k}: out[{o}] {v:e} vs {w:e}", r.name());
        }
    }
}

// ---------------------------------------------------------------------------------------
// 3. softposit's quires.
// ---------------------------------------------------------------------------------------

/// softposit's Q8E0 (an i32 holding value · 2^12) agrees with our quire bit for bit on random
/// vectors whose partial sums all stay below 2^19 in magnitude.
#[test]
fn softposit_q8e0_agrees_while_the_sum_stays_below_2_pow_19() {
    let r = Ref::new(8, 0);
    let mut rng = Rng(1100);
    let mut mm = Mismatches::default();
    let (mut in_range, mut total) = (0, 0);
    let limit = BigInt::one() << (19 + 12); // 2^19 in units of minpos² = 2^-12
    for v in 0..2000 {
        let len = 1 + rng.below(if v % 2 == 0 { 50 } else { 2000 }) as usize;
        let how = [Draw::Uniform, Draw::NearOne, Draw::Mixed][v % 3];
        let terms: Vec<Term> = (0..len).map(|_| r.random_term(&mut rng, how)).collect();
        let mut sp = Q8E0::init();
        let mut ours = Quire::new(r.posit()).unwrap();
        let mut sum = BigInt::zero();
        let mut ok = true;
        for &t in &terms {
            let b = |x: u32| P8E0::from_bits(x as u8);
            match t {
                Term::Product(a, c) | Term::Bits(a, c) => sp.add_product(b(a), b(c)),
                Term::NegProduct(a, c) => sp.sub_product(b(a), b(c)),
                Term::Single(a) => sp += b(a),
            }
            apply(&mut ours, &r, t);
            sum += r.term_units(t).unwrap();
            ok &= sum.abs() < limit;
        }
        total += 1;
        if ok {
            in_range += 1;
            let (got, want) = (ours.to_bits(), sp.to_posit().to_bits() as u32);
            mm.check(got == want, || {
                format!("vector {v}: ours {got:#x}, Q8E0 {want:#x}")
            });
            mm.check(want == r.round(&sum), || {
                format!("vector {v}: Q8E0 vs reference")
            });
        }
    }
    assert!(
        in_range * 10 >= total * 9,
        "only {in_range} of {total} vectors in range"
    );
    mm.assert_none_of("Q8E0 vs our quire", in_range);
}

/// The documented difference: 128 products of 64·64 sum to 2^19, which Q8E0's i32 cannot
/// hold (it wraps to 0x8000_0000, which it then resets to 0): SoftPosit gives 0, our quire
/// saturates to maxpos = 64. Passing 2^19 without hitting it wraps Q8E0 to a negative sum.
#[test]
fn softposit_q8e0_wraps_at_2_pow_19_where_our_quire_gives_maxpos() {
    let r = Ref::new(8, 0);
    let (max, half) = (P8E0::from_bits(0x7f), P8E0::from_f64(32.0));
    let mut sp = Q8E0::init();
    let mut ours = Quire::new(r.posit()).unwrap();
    for _ in 0..127 {
        sp.add_product(max, max);
        ours.add_product(64.0, 64.0);
    }
    assert_eq!(sp.to_posit().to_f64(), 64.0, "127 · 4096 still fits Q8E0");
    sp.add_product(max, max);
    ours.add_product(64.0, 64.0);
    assert_eq!(
        sp.to_posit().to_f64(),
        0.0,
        "SoftPosit: 128 · 4096 wraps to 0"
    );
    assert_eq!(ours.to_posit(), 64.0, "ours: maxpos");
    assert_eq!(ours.to_bits(), 0x7f);

    let mut sp = Q8E0::init();
    let mut ours = Quire::new(r.posit()).unwrap();
    for _ in 0..127 {
        sp.add_product(max, max);
        ours.add_product(64.0, 64.0);
    }
    // 2^19 - 4096 + 2048 + 1536 + 2048 = 2^19 + 1536, never exactly 2^19 on the way.
    for (x, y) in [(max, half), (max, P8E0::from_f64(24.0)), (max, half)] {
        sp.add_product(x, y);
        ours.add_product(x.to_f64(), y.to_f64());
    }
    assert!(
        sp.to_posit().to_f64() < 0.0,
        "SoftPosit: 2^19 + 1536 wraps negative"
    );
    assert_eq!(ours.to_posit(), 64.0);
}

/// softposit's Q16E1 (an i128 holding value · 2^56) agrees with the exact reference and our
/// quire on random long vectors, whose sums stay far below its 2^71 wrap.
#[test]
fn softposit_q16e1_agrees_on_random_long_vectors() {
    let r = Ref::new(16, 1);
    let mut rng = Rng(1200);
    let mut mm = Mismatches::default();
    let mut checks = 0;
    for v in 0..2000 {
        let len = 1 + rng.below([10, 200, 3000][v % 3]) as usize;
        let how = [Draw::Uniform, Draw::NearOne, Draw::Mixed, Draw::Extreme][v % 4];
        let terms: Vec<Term> = (0..len).map(|_| r.random_term(&mut rng, how)).collect();
        let mut sp = Q16E1::init();
        let mut ours = Quire::new(r.posit()).unwrap();
        for &t in &terms {
            let b = |x: u32| P16E1::from_bits(x as u16);
            match t {
                Term::Product(a, c) | Term::Bits(a, c) => sp.add_product(b(a), b(c)),
                Term::NegProduct(a, c) => sp.sub_product(b(a), b(c)),
                Term::Single(a) => sp += b(a),
            }
            apply(&mut ours, &r, t);
        }
        let sum = r.exact(&terms).unwrap();
        let want = r.round(&sum);
        let (got, sp_bits) = (ours.to_bits(), sp.to_posit().to_bits() as u32);
        checks += 1;
        mm.check(got == want, || {
            format!("vector {v}: ours {got:#x}, reference {want:#x}")
        });
        mm.check(sp_bits == want, || {
            format!("vector {v} ({how:?}, {len} terms, sum {:e}): Q16E1 {sp_bits:#x}, reference {want:#x}", ref_odd(&sum, 56))
        });
    }
    mm.assert_none_of("Q16E1 vs reference", checks);
}

/// Q16E1 wraps at 2^71: 2^15 products of maxpos·maxpos (2^56 each) make its i128 exactly
/// 0x8000.., which it resets to 0; our quire gives maxpos.
#[test]
fn softposit_q16e1_wraps_at_2_pow_71_where_our_quire_gives_maxpos() {
    let max = P16E1::from_bits(0x7fff);
    let maxpos = two_pow(28);
    let mut sp = Q16E1::init();
    let mut ours = Quire::new(p(16, 1)).unwrap();
    for _ in 0..(1 << 15) - 1 {
        sp.add_product(max, max);
        ours.add_product(maxpos, maxpos);
    }
    assert_eq!(
        sp.to_posit().to_f64(),
        maxpos,
        "2^71 - 2^56 still fits Q16E1"
    );
    sp.add_product(max, max);
    ours.add_product(maxpos, maxpos);
    assert_eq!(
        sp.to_posit().to_f64(),
        0.0,
        "SoftPosit: 2^15 maxpos² wraps to 0"
    );
    assert_eq!(ours.to_posit(), maxpos);
}

// ---------------------------------------------------------------------------------------
// 4. Naive GEMMs.
// ---------------------------------------------------------------------------------------

/// The posit<8,0> operation tables equal softposit's P8E0 `*` and `+` on all 65536 pattern
/// pairs (and the exact reference, in the next test).
#[test]
fn posit8_0_op_tables_equal_softposit_on_all_65536_pairs() {
    let t = OpTables::get(&Format::posit(8, 0).unwrap()).unwrap();
    let mut mm = Mismatches::default();
    for a in 0..=255u8 {
        mm.check(
            same(t.decode[a as usize], P8E0::from_bits(a).to_f64()),
            || format!("decode {a:#x}"),
        );
        for b in 0..=255u8 {
            let (pa, pb) = (P8E0::from_bits(a), P8E0::from_bits(b));
            let i = (a as usize) << 8 | b as usize;
            let (mul, add) = ((pa * pb).to_bits(), (pa + pb).to_bits());
            mm.check(t.mul[i] == mul, || {
                format!("{a:#x} * {b:#x}: {:#x} vs {mul:#x}", t.mul[i])
            });
            mm.check(t.add[i] == add, || {
                format!("{a:#x} + {b:#x}: {:#x} vs {add:#x}", t.add[i])
            });
        }
    }
    mm.assert_none_of("posit<8,0> tables vs P8E0", 2 * 65536);
}

/// The tables of every posit of at most 8 bits equal the exact reference rounding of the
/// exact product and sum, on all pattern pairs (NaR in, NaR out).
#[test]
fn small_posit_op_tables_equal_exact_reference_rounding() {
    let mut mm = Mismatches::default();
    for &(n, es) in &[
        (8, 0),
        (8, 1),
        (8, 2),
        (8, 3),
        (6, 0),
        (7, 2),
        (5, 1),
        (3, 0),
    ] {
        let r = Ref::new(n, es);
        let t = OpTables::get(&r.format()).unwrap();
        for a in 0..1u32 << n {
            mm.check(same(t.decode[a as usize], r.value(a)), || {
                format!("{} decode {a:#x}", r.name())
            });
            for b in 0..1u32 << n {
                let i = (a as usize) << 8 | b as usize;
                let mul = r
                    .exact(&[Term::Product(a, b)])
                    .map_or(r.nar(), |x| r.round(&x));
                let add = r
                    .exact(&[Term::Single(a), Term::Single(b)])
                    .map_or(r.nar(), |x| r.round(&x));
                mm.check(t.mul[i] as u32 == mul, || {
                    format!("{} {a:#x} * {b:#x}: {:#x} vs {mul:#x}", r.name(), t.mul[i])
                });
                mm.check(t.add[i] as u32 == add, || {
                    format!("{} {a:#x} + {b:#x}: {:#x} vs {add:#x}", r.name(), t.add[i])
                });
            }
        }
    }
    mm.assert_none("small posit tables vs reference");
}

/// Random f32 (any value, NaN included) for naive GEMM inputs.
fn random_f32(rng: &mut Rng, scale: f64) -> f32 {
    match rng.below(40) {
        0 => f32::NAN,
        1 => 0.0,
        _ => {
            let m = (rng.next() >> 11) as f64 / two_pow(53) * 2.0 - 1.0;
            let e = rng.below(12) as i32 - 6;
            (m * scale * two_pow(e)) as f32
        }
    }
}

/// Naive posit<8,0> matmul, linear (bias added last) and conv2d equal step-by-step loops of
/// softposit P8E0 arithmetic: `acc = acc + a*b`, k ascending, from zero.
#[test]
fn naive_posit8_0_equals_softposit_p8e0_loop() {
    let fmt = Format::posit(8, 0).unwrap();
    let mut rng = Rng(1300);
    let mut mm = Mismatches::default();
    let sp = |x: f32| P8E0::from_f32(x);
    let pat = |x: f32| P8E0::from_f32(x).to_bits();
    for &(m, k, n) in &[(1, 1, 1), (7, 50, 9), (16, 300, 12)] {
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, 4.0)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, 4.0)).collect();
        let bias: Vec<f32> = (0..n).map(|_| random_f32(&mut rng, 4.0)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        // linear(x, w) with w = b^T and the bias.
        let wt = bt.t().unwrap().contiguous().unwrap();
        let biast = Tensor::from_vec(bias.clone(), n, &Device::Cpu).unwrap();
        let got_lin = linear(&at, &wt, Some(&biast), &fmt, Accumulation::Naive)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = P8E0::ZERO;
                for t in 0..k {
                    acc += sp(a[i * k + t]) * sp(b[t * n + j]);
                }
                let (g, w) = (pat(got[i * n + j]), acc.to_bits());
                mm.check(g == w, || {
                    format!("matmul {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
                let w = (acc + sp(bias[j])).to_bits();
                let g = pat(got_lin[i * n + j]);
                mm.check(g == w, || {
                    format!("linear {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
            }
        }
    }
    // conv2d: the sum runs over (channel, kernel row, kernel column) ascending; padding
    // contributes exact zeros.
    let (nb, c, h, wd, oc, kh, kw, s, pd) = (2, 2, 6, 5, 3, 3, 2, 2, 1);
    let x: Vec<f32> = (0..nb * c * h * wd)
        .map(|_| random_f32(&mut rng, 2.0))
        .collect();
    let w: Vec<f32> = (0..oc * c * kh * kw)
        .map(|_| random_f32(&mut rng, 2.0))
        .collect();
    let bias: Vec<f32> = (0..oc).map(|_| random_f32(&mut rng, 2.0)).collect();
    let xt = Tensor::from_vec(x.clone(), (nb, c, h, wd), &Device::Cpu).unwrap();
    let wt = Tensor::from_vec(w.clone(), (oc, c, kh, kw), &Device::Cpu).unwrap();
    let bt = Tensor::from_vec(bias.clone(), oc, &Device::Cpu).unwrap();
    let out = conv2d(&xt, &wt, Some(&bt), s, pd, &fmt, Accumulation::Naive).unwrap();
    let (oh, ow) = ((h + 2 * pd - kh) / s + 1, (wd + 2 * pd - kw) / s + 1);
    assert_eq!(out.dims(), &[nb, oc, oh, ow]);
    let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut idx = 0;
    for b in 0..nb {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = P8E0::ZERO;
                    for ci in 0..c {
                        for i in 0..kh {
                            for j in 0..kw {
                                let y = (oy * s + i) as isize - pd as isize;
                                let xx = (ox * s + j) as isize - pd as isize;
                                let xv = if y < 0 || xx < 0 || y >= h as isize || xx >= wd as isize
                                {
                                    P8E0::ZERO
                                } else {
                                    sp(x[((b * c + ci) * h + y as usize) * wd + xx as usize])
                                };
                                acc += sp(w[((o * c + ci) * kh + i) * kw + j]) * xv;
                            }
                        }
                    }
                    let want = (acc + sp(bias[o])).to_bits();
                    let g = pat(got[idx]);
                    mm.check(g == want, || {
                        format!("conv out[{idx}]: {g:#x} vs {want:#x}")
                    });
                    idx += 1;
                }
            }
        }
    }
    mm.assert_none("naive posit<8,0> vs P8E0 loop");
}

/// softposit's `PxE1<16>` arithmetic is wrong (it decodes correctly, but `*` and `+` treat
/// the operands as another layout: 2·3 = 32, 2 + 3 = 10; `+` also never returns on some
/// mixed-sign pairs such as 0x6adb + 0x9ccc), so it is no oracle for posit<16,1> arithmetic.
#[test]
fn softposit_pxe1_16_arithmetic_is_wrong() {
    let f = |x: f64| PxE1::<16>::from_f64(x);
    assert_eq!((f(2.0) * f(3.0)).to_f64(), 32.0);
    assert_eq!((f(2.0) + f(3.0)).to_f64(), 10.0);
    // PxE1<32> is right on the same inputs.
    let g = |x: f64| PxE1::<32>::from_f64(x);
    assert_eq!(
        ((g(2.0) * g(3.0)).to_f64(), (g(2.0) + g(3.0)).to_f64()),
        (6.0, 5.0)
    );
}

/// softposit's `P16E1` `*` and `+` (on bit patterns; only its conversions from floats are
/// buggy) are correctly rounded against the exact reference on random pattern pairs, NaR
/// included, so they serve as the posit<16,1> naive oracle.
#[test]
fn softposit_p16e1_add_and_mul_are_correctly_rounded() {
    let r = Ref::new(16, 1);
    let mut rng = Rng(1400);
    let mut mm = Mismatches::default();
    let sp = |p: u32| P16E1::from_bits(p as u16);
    for i in 0..200_000 {
        let how = [Draw::Uniform, Draw::NearOne, Draw::Mixed, Draw::Extreme][i % 4];
        let (a, b) = (r.draw(&mut rng, how), r.draw(&mut rng, how));
        let b = if i % 1000 == 0 { r.nar() } else { b };
        let mul = r
            .exact(&[Term::Product(a, b)])
            .map_or(r.nar(), |x| r.round(&x));
        let add = r
            .exact(&[Term::Single(a), Term::Single(b)])
            .map_or(r.nar(), |x| r.round(&x));
        let (gm, ga) = (
            (sp(a) * sp(b)).to_bits() as u32,
            (sp(a) + sp(b)).to_bits() as u32,
        );
        mm.check(gm == mul, || {
            format!("{a:#x} * {b:#x}: P16E1 {gm:#x}, reference {mul:#x}")
        });
        mm.check(ga == add, || {
            format!("{a:#x} + {b:#x}: P16E1 {ga:#x}, reference {add:#x}")
        });
    }
    mm.assert_none_of("P16E1 ops vs reference", 400_000);
}

/// Naive posit<16,1> (the f64 round-to-odd path) equals a loop of softposit `P16E1`
/// arithmetic, bias last (inputs converted with the exact `PxE1<16>::from_f32`).
#[test]
fn naive_posit16_1_equals_softposit_p16e1_loop() {
    let fmt = Format::posit(16, 1).unwrap();
    let mut rng = Rng(1500);
    let mut mm = Mismatches::default();
    let pat = |x: f32| (PxE1::<16>::from_f32(x).to_bits() >> 16) as u16;
    let sp = |x: f32| P16E1::from_bits(pat(x));
    for &(m, k, n) in &[(1, 1, 1), (6, 80, 7), (9, 400, 5)] {
        let scale = [1.0, 100.0, 1e6][k % 3];
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, scale)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, scale)).collect();
        let bias: Vec<f32> = (0..n).map(|_| random_f32(&mut rng, scale)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let wt = bt.t().unwrap().contiguous().unwrap();
        let biast = Tensor::from_vec(bias.clone(), n, &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let got_lin = linear(&at, &wt, Some(&biast), &fmt, Accumulation::Naive)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = P16E1::ZERO;
                for t in 0..k {
                    acc += sp(a[i * k + t]) * sp(b[t * n + j]);
                }
                let (g, w) = (pat(got[i * n + j]), acc.to_bits());
                mm.check(g == w, || {
                    format!("matmul {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
                let w = (acc + sp(bias[j])).to_bits();
                let g = pat(got_lin[i * n + j]);
                mm.check(g == w, || {
                    format!("linear {m}x{k}x{n} [{i}][{j}]: {g:#x} vs {w:#x}")
                });
            }
        }
    }
    mm.assert_none("naive posit<16,1> vs P16E1 loop");
}

/// Naive GEMMs of posits without a softposit type (and posit<16,2>, <32,2>) equal a loop of
/// exactly rounded reference operations.
#[test]
fn naive_wider_posits_equal_exact_reference_operation_loop() {
    let mut mm = Mismatches::default();
    let mut rng = Rng(1600);
    for &(pn, pes) in &[(16, 2), (12, 3), (10, 1), (32, 2), (16, 5)] {
        let r = Ref::new(pn, pes);
        let (m, k, n) = (4, 40, 5);
        let g = Gemm::random(&r, &mut rng, (m, k, n), Draw::Mixed);
        let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
        let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
        let mut out = vec![0.0; m * n];
        naive_gemm(&r.format(), &a, &b, (m, k, n), Bias::None, &mut out, true);
        let via_op =
            values(&naive_matmul(&tensor(&a, &[m, k]), &tensor(&b, &[k, n]), &r.format()).unwrap());
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0u32;
                for t in 0..k {
                    let prod = r.round(
                        &r.exact(&[Term::Product(g.a[i * k + t], g.b[t * n + j])])
                            .unwrap(),
                    );
                    acc = r.round(&r.exact(&[Term::Single(acc), Term::Single(prod)]).unwrap());
                }
                let want = r.value(acc);
                let o = i * n + j;
                mm.check(same(out[o], want), || {
                    format!("{} [{i}][{j}]: {:e} vs {want:e}", r.name(), out[o])
                });
                mm.check(same(via_op[o], want), || {
                    format!("{} op [{i}][{j}]", r.name())
                });
            }
        }
    }
    mm.assert_none("naive wider posits vs reference loop");
}

/// The fp16 naive GEMM (f64 round-to-odd path) equals a loop of `half::f16` arithmetic: an
/// f16 product is exact in f32, and an f32 sum of two f16 values rounded to f16 is correctly
/// rounded (24 >= 2·11 + 2 bits, so double rounding is innocuous). Overflow to Inf, Inf - Inf
/// = NaN, subnormals and signed zeros included.
#[test]
fn naive_fp16_equals_half_f16_loop() {
    let fmt: Format = "fp16".parse().unwrap();
    let mut rng = Rng(1700);
    let mut mm = Mismatches::default();
    let h = |x: f32| f16::from_f32(x);
    for &(m, k, n, scale) in &[
        (5, 60, 6, 1.0),
        (4, 200, 3, 300.0),
        (3, 50, 4, 1e-3),
        (3, 30, 3, 2e-5),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, scale)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, scale)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = f16::ZERO;
                for t in 0..k {
                    let prod = h(h(a[i * k + t]).to_f32() * h(b[t * n + j]).to_f32());
                    acc = h(acc.to_f32() + prod.to_f32());
                }
                let (g, w) = (got[i * n + j], acc.to_f32());
                mm.check(same32(g, w), || {
                    format!("{m}x{k}x{n} s{scale} [{i}][{j}]: {g:e} vs {w:e}")
                });
            }
        }
    }
    mm.assert_none("naive fp16 vs half loop");
}

/// OCP e4m3 reference: the value of every pattern (bias 7, subnormals, S.1111.111 = NaN).
fn e4m3_value(p: u8) -> f64 {
    let (s, e, m) = (p >> 7, (p >> 3) & 15, p & 7);
    if e == 15 && m == 7 {
        return f64::NAN;
    }
    let v = if e == 0 {
        m as f64 / 8.0 * two_pow(-6)
    } else {
        (1.0 + m as f64 / 8.0) * two_pow(e as i32 - 7)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

/// OCP e4m3 rounding of an exact f64: nearest magnitude, ties to the even pattern, the sign
/// kept (also on zero); beyond 464 (the midpoint to the missing 480) NaN; NaN stays NaN.
fn e4m3_round(x: f64) -> u8 {
    if x.is_nan() || x.abs() > 464.0 {
        return 0x7f | if x.is_sign_negative() { 0x80 } else { 0 };
    }
    let ax = x.abs();
    let mut best = 0u8;
    for p in 1..=0x7eu8 {
        let (d, db) = ((e4m3_value(p) - ax).abs(), (e4m3_value(best) - ax).abs());
        if d < db || (d == db && p % 2 == 0) {
            best = p;
        }
    }
    best | if x.is_sign_negative() { 0x80 } else { 0 }
}

/// The e4m3 tables (the 8-bit float table path) equal the reference on all pattern pairs
/// (sums and products of e4m3 values are exact in f64), and the naive GEMM equals a loop of
/// reference operations.
#[test]
fn naive_e4m3_equals_ocp_reference() {
    let fmt: Format = "e4m3".parse().unwrap();
    let t = OpTables::get(&fmt).unwrap();
    let mut mm = Mismatches::default();
    assert_eq!(e4m3_round(464.0), 0x7e, "464 ties to 448");
    assert_eq!(e4m3_round(464.1), 0x7f);
    assert_eq!(e4m3_value(0x7e), 448.0);
    let pat = |v: f64| if v.is_nan() { 0x7f } else { e4m3_round(v) };
    for a in 0..=255u8 {
        mm.check(same(t.decode[a as usize], e4m3_value(a)), || {
            format!("decode {a:#x}")
        });
        for b in 0..=255u8 {
            let i = (a as usize) << 8 | b as usize;
            let (x, y) = (e4m3_value(a), e4m3_value(b));
            let (mul, add) = (e4m3_round(x * y), e4m3_round(x + y));
            // NaN patterns compare by value (either sign).
            let ok = |g: u8, w: u8| g == w || (e4m3_value(g).is_nan() && e4m3_value(w).is_nan());
            mm.check(ok(t.mul[i], mul), || {
                format!("{a:#x} * {b:#x}: {:#x} vs {mul:#x}", t.mul[i])
            });
            mm.check(ok(t.add[i], add), || {
                format!("{a:#x} + {b:#x}: {:#x} vs {add:#x}", t.add[i])
            });
        }
    }
    let mut rng = Rng(1800);
    for &(m, k, n, scale) in &[(5, 30, 4, 1.0), (4, 100, 5, 5.0), (3, 40, 3, 0.05)] {
        let a: Vec<f32> = (0..m * k).map(|_| random_f32(&mut rng, scale)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| random_f32(&mut rng, scale)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f64;
                for t in 0..k {
                    let x = e4m3_value(pat(a[i * k + t] as f64));
                    let y = e4m3_value(pat(b[t * n + j] as f64));
                    let prod = e4m3_value(pat(x * y));
                    acc = e4m3_value(pat(acc + prod));
                }
                let g = got[i * n + j];
                mm.check(same(g as f64, acc), || {
                    format!("{m}x{k}x{n} [{i}][{j}]: {g:e} vs {acc:e}")
                });
            }
        }
    }
    mm.assert_none("e4m3 tables and naive GEMM vs reference");
}

/// Formats without a NaN pattern (OCP e2m1, e3m2) keep NaN inputs NaN in a naive GEMM
/// (the README: NaN stays NaN), like every other format.
#[test]
fn naive_nan_inputs_stay_nan_in_formats_without_nan_patterns() {
    for name in [
        "e2m1",
        "e3m2",
        "e2m3",
        "e4m3",
        "e5m2",
        "posit<8,0>",
        "fixed<8,4>",
    ] {
        let fmt: Format = name.parse().unwrap();
        let a = tensor(&[f64::NAN, 1.0, 1.0, 1.0], &[2, 2]);
        let b = tensor(&[1.0, 0.0, 1.0, 1.0], &[2, 2]);
        let out = values(&naive_matmul(&a, &b, &fmt).unwrap());
        assert!(
            out[0].is_nan() && out[1].is_nan(),
            "{name}: NaN row gives {out:?}"
        );
        assert_eq!(&out[2..], &[2.0, 1.0], "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// 5. Round-to-odd helpers.
// ---------------------------------------------------------------------------------------

/// A random normal f64 with exponent in `-lim..lim` and a full or short significand.
fn random_f64(rng: &mut Rng, lim: i32) -> f64 {
    let e = rng.below(2 * lim as u64) as i32 - lim;
    let mut m = 1.0 + (rng.next() >> 12) as f64 / two_pow(52);
    if rng.below(4) == 0 {
        m = (m * 8.0).floor() / 8.0;
    }
    let x = m * two_pow(e);
    if rng.coin() {
        -x
    } else {
        x
    }
}

/// `add_odd(x, y)` is the exact sum when it fits, else its truncation with the last bit set,
/// for random pairs (near and far exponents, cancellation) and named edge cases.
#[test]
fn add_odd_is_the_exact_sum_rounded_to_odd() {
    let mut rng = Rng(1900);
    let mut mm = Mismatches::default();
    let mut pairs: Vec<(f64, f64)> = vec![
        (1.0, two_pow(-60)),
        (1.0, -two_pow(-60)), // just below a power of two: 1 - 2^-53
        (1.0, -two_pow(-53)), // exact
        (two_pow(52), 0.5),   // tie in nearest: even -> odd neighbour
        (two_pow(52), 1.5),
        (1.0, -1.0),
        (0.0, -0.0),
        (-0.0, -0.0),
        (3.0, two_pow(-1000)),
        (f64::MAX / 2.0, f64::MAX / 4.0),
    ];
    for i in 0..200_000 {
        let x = random_f64(&mut rng, 900);
        let y = match i % 4 {
            0 => random_f64(&mut rng, 900),
            1 => x * (1.0 + random_f64(&mut rng, 30)), // nearby
            2 => -x + random_f64(&mut rng, 50) * x.abs() * two_pow(-30), // cancellation
            _ => x * random_f64(&mut rng, 70),         // up to 2^70 apart
        };
        pairs.push((x, y));
    }
    for (x, y) in pairs {
        let exact = f64_units(x) + f64_units(y);
        let want = if exact.is_zero() {
            x + y
        } else {
            ref_odd(&exact, 1074)
        };
        let got = add_odd(x, y);
        mm.check(same(got, want), || {
            format!("add_odd({x:e}, {y:e}) = {got:e}, expected {want:e}")
        });
    }
    mm.assert_none("add_odd");
}

/// `mul_odd(x, y)` is the exact product when it fits, else its truncation with the last bit
/// set, for random pairs whose product stays normal, and named edge cases.
#[test]
fn mul_odd_is_the_exact_product_rounded_to_odd() {
    let mut rng = Rng(2000);
    let mut mm = Mismatches::default();
    let mut pairs: Vec<(f64, f64)> = vec![
        (1.0 + two_pow(-52), 1.0 + two_pow(-52)),
        (1.0 - two_pow(-53), 1.0 + two_pow(-52)),
        (3.0, 1.0 / 3.0),
        (-0.0, 5.0),
        (two_pow(500), two_pow(400)),
        (two_pow(-500), two_pow(-400)),
    ];
    for _ in 0..200_000 {
        pairs.push((random_f64(&mut rng, 500), random_f64(&mut rng, 500)));
    }
    for (x, y) in pairs {
        let exact = f64_units(x) * f64_units(y); // units 2^-2148
        let want = if exact.is_zero() {
            x * y
        } else {
            ref_odd(&exact, 2148)
        };
        let got = mul_odd(x, y);
        mm.check(same(got, want), || {
            format!("mul_odd({x:e}, {y:e}) = {got:e}, expected {want:e}")
        });
    }
    mm.assert_none("mul_odd");
}

/// `u128_to_f64_odd` and `i128_to_f64_odd` on every bit length, all-ones values, just above
/// 2^53, and the extremes.
#[test]
fn u128_and_i128_to_f64_odd_match_exact_reference() {
    let mut rng = Rng(2100);
    let mut mm = Mismatches::default();
    let mut us: Vec<u128> = vec![
        0,
        1,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        (1 << 54) + 1,
        (1 << 54) + 2,
        (1 << 55) + 4,
        u64::MAX as u128,
        u128::MAX,
        u128::MAX >> 1,
        1 << 127,
    ];
    for bits in 1..=128u32 {
        for _ in 0..500 {
            let v = ((rng.next() as u128) << 64 | rng.next() as u128) >> (128 - bits);
            us.push(v | 1 << (bits - 1));
            us.push((1u128 << (bits - 1)) | (rng.below(4) as u128));
        }
    }
    for &u in &us {
        let want = ref_odd(&BigInt::from(u), 0);
        let got = u128_to_f64_odd(u);
        mm.check(same(got, want), || {
            format!("u128_to_f64_odd({u:#x}) = {got:e}, expected {want:e}")
        });
        if u <= i128::MAX as u128 {
            for v in [u as i128, -(u as i128)] {
                let want = ref_odd(&BigInt::from(v), 0);
                let got = i128_to_f64_odd(v);
                mm.check(same(got, want), || {
                    format!("i128_to_f64_odd({v}) = {got:e}")
                });
            }
        }
    }
    let want = ref_odd(&BigInt::from(i128::MIN), 0);
    assert_eq!(i128_to_f64_odd(i128::MIN), want);
    assert_eq!(want, -two_pow(127));
    mm.assert_none("u128/i128 to f64 odd");
}

// ---------------------------------------------------------------------------------------
// 6. Errors, not panics.
// ---------------------------------------------------------------------------------------

fn t2(r: usize, c: usize) -> Tensor {
    Tensor::ones((r, c), DType::F32, &Device::Cpu).unwrap()
}

fn posit8() -> Format {
    Format::posit(8, 0).unwrap()
}

#[test]
fn matmul_with_mismatched_shapes_is_an_error() {
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        assert!(matmul(&t2(2, 3), &t2(4, 5), &posit8(), acc).is_err());
        let a = Tensor::ones((3, 2, 4), DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::ones((2, 4, 5), DType::F32, &Device::Cpu).unwrap();
        assert!(
            matmul(&a, &b, &posit8(), acc).is_err(),
            "batch 3 vs batch 2"
        );
        assert!(linear(&t2(2, 3), &t2(4, 5), None, &posit8(), acc).is_err());
        let x = Tensor::ones((1, 3, 5, 5), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((2, 2, 3, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(
            conv2d(&x, &w, None, 1, 0, &posit8(), acc).is_err(),
            "channels 3 vs 2"
        );
    }
}

#[test]
fn rank_1_inputs_are_an_error() {
    let v = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        assert!(matmul(&v, &t2(4, 2), &posit8(), acc).is_err());
        assert!(matmul(&t2(2, 4), &v, &posit8(), acc).is_err());
        assert!(linear(&v, &t2(2, 4), None, &posit8(), acc).is_err());
        assert!(conv2d(&v, &v, None, 1, 0, &posit8(), acc).is_err());
    }
}

#[test]
fn integer_dtypes_are_an_error() {
    for dt in [DType::U8, DType::U32, DType::I64] {
        let a = Tensor::ones((2, 3), dt, &Device::Cpu).unwrap();
        let b = Tensor::ones((3, 2), dt, &Device::Cpu).unwrap();
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            assert!(matmul(&a, &b, &posit8(), acc).is_err(), "{dt:?}");
            assert!(matmul(&t2(2, 3), &b, &posit8(), acc).is_err(), "{dt:?} b");
            assert!(
                linear(&a, &t2(2, 3), None, &posit8(), acc).is_err(),
                "{dt:?}"
            );
        }
    }
}

#[test]
fn quire_with_a_float_fixed_or_block_format_is_an_error() {
    for name in ["fp16", "e4m3", "bf16", "fixed<8,4>", "block<8>"] {
        let fmt: Format = name.parse().unwrap();
        assert!(quire_matmul(&t2(2, 3), &t2(3, 2), &fmt).is_err(), "{name}");
        assert!(
            linear(&t2(2, 3), &t2(2, 3), None, &fmt, Accumulation::Quire).is_err(),
            "{name}"
        );
        assert!(Accumulation::Quire.check(&fmt).is_err(), "{name}");
    }
}

#[test]
fn naive_with_a_block_format_is_an_error() {
    for name in ["block<8>", "block<4,dim=0>"] {
        let fmt: Format = name.parse().unwrap();
        assert!(naive_matmul(&t2(2, 3), &t2(3, 2), &fmt).is_err(), "{name}");
        let x = Tensor::ones((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((1, 1, 2, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(
            conv2d(&x, &w, None, 1, 0, &fmt, Accumulation::Naive).is_err(),
            "{name}"
        );
    }
    // The other elementwise formats are accepted.
    for name in ["fp16", "e4m3", "fixed<8,4>", "posit<16,1>"] {
        let fmt: Format = name.parse().unwrap();
        assert!(naive_matmul(&t2(2, 3), &t2(3, 2), &fmt).is_ok(), "{name}");
    }
}

/// posit<32,5> (maxpos = 2^960) and posit<32,4> (2^480) are beyond MAX_SCALE = 448;
/// posit<16,5> (2^448) is the widest accepted.
#[test]
fn posits_beyond_the_quire_range_are_an_error() {
    for (n, es) in [(32, 5), (32, 4), (20, 5)] {
        let fmt = Format::posit(n, es).unwrap();
        assert!(Quire::new(p(n, es)).is_err(), "posit<{n},{es}>");
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            assert!(
                matmul(&t2(2, 3), &t2(3, 2), &fmt, acc).is_err(),
                "posit<{n},{es}> {acc:?}"
            );
        }
    }
    assert!(Quire::new(p(16, 5)).is_ok());
    assert!(quire_matmul(&t2(2, 3), &t2(3, 2), &Format::posit(16, 5).unwrap()).is_ok());
}

#[test]
fn conv2d_kernel_larger_than_the_padded_input_is_an_error() {
    let x = Tensor::ones((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones((1, 1, 7, 7), DType::F32, &Device::Cpu).unwrap();
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        assert!(
            conv2d(&x, &w, None, 1, 1, &posit8(), acc).is_err(),
            "7x7 on 4x4 + 2"
        );
        assert!(
            conv2d(&x, &w, None, 1, 2, &posit8(), acc).is_ok(),
            "7x7 on 4x4 + 4 fits"
        );
        assert!(
            conv2d(&x, &w, None, 0, 2, &posit8(), acc).is_err(),
            "stride 0"
        );
    }
}

#[test]
fn bias_of_the_wrong_length_is_an_error() {
    let b3 = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    let b22 = Tensor::ones((2, 2), DType::F32, &Device::Cpu).unwrap();
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        // linear: 4 outputs.
        assert!(linear(&t2(2, 5), &t2(4, 5), Some(&b3), &posit8(), acc).is_err());
        assert!(linear(&t2(2, 5), &t2(4, 5), Some(&b22), &posit8(), acc).is_err());
        // conv2d: 2 output channels.
        let x = Tensor::ones((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((2, 1, 3, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(conv2d(&x, &w, Some(&b3), 1, 0, &posit8(), acc).is_err());
    }
}

// ---------------------------------------------------------------------------------------
// Shapes and dtypes at the edges.
// ---------------------------------------------------------------------------------------

/// Empty dot products (k = 0) give exact zeros (plus the bias), and empty outputs (m = 0 or
/// n = 0) give empty tensors, for both accumulations.
#[test]
fn empty_dot_products_give_zero_and_empty_shapes_give_empty_outputs() {
    for name in ["posit<8,0>", "posit<16,1>", "posit<16,2>"] {
        let fmt: Format = name.parse().unwrap();
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            let a = Tensor::zeros((3, 0), DType::F32, &Device::Cpu).unwrap();
            let b = Tensor::zeros((0, 2), DType::F32, &Device::Cpu).unwrap();
            let out = matmul(&a, &b, &fmt, acc).unwrap();
            assert_eq!(out.dims(), &[3, 2]);
            assert_eq!(values(&out), [0.0; 6], "{name} {acc:?}");
            let w = Tensor::zeros((2, 0), DType::F32, &Device::Cpu).unwrap();
            let bias = tensor(&[1.5, -2.0], &[2]).to_dtype(DType::F32).unwrap();
            let out = linear(&a, &w, Some(&bias), &fmt, acc).unwrap();
            assert_eq!(
                values(&out),
                [1.5, -2.0, 1.5, -2.0, 1.5, -2.0],
                "{name} {acc:?}"
            );
            let a0 = Tensor::zeros((0, 4), DType::F32, &Device::Cpu).unwrap();
            let b0 = Tensor::zeros((4, 0), DType::F32, &Device::Cpu).unwrap();
            assert_eq!(matmul(&a0, &t2(4, 2), &fmt, acc).unwrap().dims(), &[0, 2]);
            assert_eq!(matmul(&t2(3, 4), &b0, &fmt, acc).unwrap().dims(), &[3, 0]);
        }
    }
}

/// Inputs are rounded to the posit as values, not in the input's dtype: an f16 65504 is
/// posit<16,1>/<16,2> 65536 (beyond f16), so 65504 · 0.5 is 32768; f32::MAX is
/// posit<16,5> 2^128 (beyond f32), so f32::MAX · 2^-100 is 2^28.
#[test]
fn inputs_are_rounded_as_values_beyond_the_range_of_their_dtype() {
    let mut mm = Mismatches::default();
    let cases: [(u32, DType, f64, f64, f64); 3] = [
        (1, DType::F16, 65504.0, 0.5, 32768.0),
        (2, DType::F16, 65504.0, 0.5, 32768.0),
        (5, DType::F32, f32::MAX as f64, two_pow(-100), two_pow(28)),
    ];
    for (es, dt, x, y, want) in cases {
        let r = Ref::new(16, es);
        // The expectation from the reference: round(round(x) · round(y)).
        let exact = r
            .exact(&[Term::Product(r.round_f64(x), r.round_f64(y))])
            .unwrap();
        assert_eq!(
            r.value(r.round(&exact)),
            want,
            "{}: the expectation itself",
            r.name()
        );
        let a = tensor(&[x], &[1, 1]).to_dtype(dt).unwrap();
        let b = tensor(&[y], &[1, 1]).to_dtype(dt).unwrap();
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            let got = values(&matmul(&a, &b, &r.format(), acc).unwrap())[0];
            mm.check(got == want, || {
                format!(
                    "{} {dt:?} {acc:?}: {x:e} · {y:e} gives {got:e}, expected {want:e}",
                    r.name()
                )
            });
        }
    }
    mm.assert_none("inputs rounded beyond their dtype's range");
}

/// NaN and ±Inf operands (±Inf is no posit value, so it can only come from outside the
/// format's grid) make their row or column NaN on every path, never a finite result.
#[test]
fn quire_gemm_treats_infinite_operands_as_nar_on_every_path() {
    for &(pn, pes, k) in &[(8, 0, 5), (7, 1, 5), (8, 2, 5), (16, 1, 5), (16, 2, 5)] {
        let posit = p(pn, pes);
        let path = accumulator_for(posit, k + 1);
        let (m, n) = (3, 3);
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let mut a = vec![1.0; m * k];
            let mut b = vec![0.5; k * n];
            a[k + 2] = bad; // row 1
            b[3 * n + 2] = bad; // column 2
            for bias in [Bias::None, Bias::PerRow(&[bad, 1.0, 1.0])] {
                let mut out = vec![0.0; m * n];
                quire_gemm(posit, &a, &b, (m, k, n), bias, &mut out, false);
                for (o, v) in out.iter().enumerate() {
                    let nar =
                        o / n == 1 || o % n == 2 || (o / n == 0 && !matches!(bias, Bias::None));
                    let want = if nar {
                        f64::NAN
                    } else {
                        k as f64 * 0.5 + if matches!(bias, Bias::None) { 0.0 } else { 1.0 }
                    };
                    assert!(
                        same(*v, want),
                        "posit<{pn},{pes}> ({path:?}) {bad}: out[{o}] = {v}, expected {want}"
                    );
                }
            }
        }
    }
}

/// The i16 path sums 64 products per i32 chunk in 1 x 4 output tiles: every k around the
/// chunk size and every n around the tile width, with maxpos² terms that fill the chunks,
/// and a 100k-term dot product.
#[test]
fn quire_gemm_i16_path_is_exact_at_chunk_and_tile_edges() {
    let r = Ref::new(8, 0);
    let posit = r.posit();
    let mut rng = Rng(2200);
    let mut mm = Mismatches::default();
    for k in [1, 2, 63, 64, 65, 127, 128, 129, 1000] {
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 9] {
            assert_eq!(accumulator_for(posit, k), Accumulator::I16);
            let how = if (k + n) % 2 == 0 {
                Draw::Extreme
            } else {
                Draw::Mixed
            };
            let g = Gemm::random(&r, &mut rng, (2, k, n), how);
            let a: Vec<f64> = g.a.iter().map(|&p| r.value(p)).collect();
            let b: Vec<f64> = g.b.iter().map(|&p| r.value(p)).collect();
            let mut out = vec![0.0; 2 * n];
            quire_gemm(posit, &a, &b, (2, k, n), Bias::None, &mut out, n % 2 == 0);
            compare(&mut mm, &out, &g.expected(&r), |o| {
                format!("k = {k}, n = {n}: out[{o}]")
            });
        }
    }
    // maxpos² (2^24 units) in every term: each chunk sums to 2^30; then cancelled to minpos².
    let k = 100_001;
    let mut a = vec![64.0; 2 * k];
    let b = vec![64.0; k];
    for t in 0..k {
        a[k + t] = if t % 2 == 0 { 64.0 } else { -64.0 };
    }
    a[2 * k - 1] = r.value(1);
    let mut out = vec![0.0; 2];
    quire_gemm(posit, &a, &b, (2, k, 1), Bias::None, &mut out, false);
    assert_eq!(out, [64.0, 1.0], "saturates; cancels to 64 · minpos = 1");
    mm.assert_none("i16 path edges");
}

/// softposit's Q8E0 and Q16E1 round sums at every boundary between neighbouring patterns
/// (exactly at the (n+1)-bit boundary and one minpos² either side, both signs) as the
/// standard does, like our quire.
#[test]
fn softposit_q8e0_and_q16e1_round_every_boundary_sum_like_the_reference() {
    fn run<Q>(r: &Ref, mut q: Q, add: impl Fn(&mut Q, Term), bits: impl Fn(&Q) -> u32) -> u64 {
        let mut mm = Mismatches::default();
        let mut checks = 0;
        for p in 1..r.maxp() {
            let at_bound = r.decompose(&r.bound((p << 1) | 1));
            for delta in [-1i32, 0, 1] {
                for negate in [false, true] {
                    let mut terms = at_bound.clone();
                    match delta {
                        -1 => terms.push(Term::NegProduct(1, 1)),
                        1 => terms.push(Term::Product(1, 1)),
                        _ => {}
                    }
                    if negate {
                        for t in terms.iter_mut() {
                            *t = match *t {
                                Term::Product(a, b) => Term::NegProduct(a, b),
                                Term::NegProduct(a, b) => Term::Product(a, b),
                                other => other,
                            };
                        }
                    }
                    let want = r.round(&r.exact(&terms).unwrap());
                    for &t in &terms {
                        add(&mut q, t);
                    }
                    let got = bits(&q);
                    checks += 1;
                    mm.check(got == want, || {
                        format!("{} boundary {p:#x} {delta:+} minpos² (negated {negate}): {got:#x}, reference {want:#x}", r.name())
                    });
                    // Back to zero for the next sum.
                    for &t in &terms {
                        add(
                            &mut q,
                            match t {
                                Term::Product(a, b) => Term::NegProduct(a, b),
                                Term::NegProduct(a, b) => Term::Product(a, b),
                                other => other,
                            },
                        );
                    }
                }
            }
        }
        mm.assert_none_of(
            &format!("softposit quire at {} boundaries", r.name()),
            checks,
        );
        checks
    }
    let r8 = Ref::new(8, 0);
    let b8 = |x: u32| P8E0::from_bits(x as u8);
    run(
        &r8,
        Q8E0::init(),
        |q, t| match t {
            Term::Product(a, b) => q.add_product(b8(a), b8(b)),
            Term::NegProduct(a, b) => q.sub_product(b8(a), b8(b)),
            _ => unreachable!(),
        },
        |q| q.to_posit().to_bits() as u32,
    );
    let r16 = Ref::new(16, 1);
    let b16 = |x: u32| P16E1::from_bits(x as u16);
    run(
        &r16,
        Q16E1::init(),
        |q, t| match t {
            Term::Product(a, b) => q.add_product(b16(a), b16(b)),
            Term::NegProduct(a, b) => q.sub_product(b16(a), b16(b)),
            _ => unreachable!(),
        },
        |q| q.to_posit().to_bits() as u32,
    );
}

/// The exact value `x * 2^-u` rounded to odd on f32's grid (24 bits, or f32's subnormal
/// quantum 2^-149; ±Inf from 2^128 up). Rounding that once more to a format with at most 22
/// significand bits and a quantum no finer than 2^-147 is the correct rounding of `x`.
fn ref_odd_f32(x: &BigInt, u: u32) -> f32 {
    assert!(!x.is_zero());
    let ax = x.abs();
    let e = ax.bits() as i64 - 1 - u as i64; // floor(log2 |value|)
    let v = if e >= 128 {
        f32::INFINITY
    } else {
        let q = (e - 23).max(-149);
        let shift = (q + u as i64) as usize;
        let kept = &ax >> shift;
        let lost = ax != (&kept << shift);
        let kept = kept.to_u64().unwrap() | lost as u64;
        ldexp(kept as f64, q) as f32
    };
    if x.is_negative() {
        -v
    } else {
        v
    }
}

/// The exactly rounded bf16 product and sum, through the exact value rounded to odd on
/// f32's grid and then `half::bf16::from_f32` (exact rounding per ORACLES.md).
fn bf16_mul(x: half::bf16, y: half::bf16) -> half::bf16 {
    let (a, b) = (x.to_f64(), y.to_f64());
    if !(a * b).is_finite() || a * b == 0.0 {
        return half::bf16::from_f64(a * b); // NaN, Inf and signed zeros: exact in f64
    }
    half::bf16::from_f32(ref_odd_f32(&(f64_units(a) * f64_units(b)), 2148))
}

fn bf16_add(x: half::bf16, y: half::bf16) -> half::bf16 {
    let (a, b) = (x.to_f64(), y.to_f64());
    let exact = if a.is_finite() && b.is_finite() {
        f64_units(a) + f64_units(b)
    } else {
        BigInt::zero()
    };
    if exact.is_zero() {
        return half::bf16::from_f64(a + b); // NaN, Inf and (signed) zeros are exact
    }
    half::bf16::from_f32(ref_odd_f32(&exact, 1074))
}

/// The bf16 naive GEMM takes the general path (f64 round-to-odd, then the format's
/// rounding: bf16's subnormal products are outside the f32 fast path) and equals a loop of
/// exactly rounded bf16 operations, with overflow to Inf, Inf - Inf and subnormals.
#[test]
fn naive_bf16_equals_exactly_rounded_bf16_loop() {
    let fmt: Format = "bf16".parse().unwrap();
    let mut rng = Rng(2300);
    let mut mm = Mismatches::default();
    let h = half::bf16::from_f32;
    let mut seen = [0usize; 3];
    // Values 2^e · m with e in -lo..hi: products reach bf16's subnormals and overflow.
    let draw = |rng: &mut Rng, lo: i32, hi: i32| -> f32 {
        if rng.below(50) == 0 {
            return f32::NAN;
        }
        let e = rng.below((lo + hi) as u64) as i32 - lo;
        let m = 1.0 + (rng.next() >> 11) as f64 / two_pow(53);
        let v = (m * two_pow(e)) as f32;
        if rng.coin() {
            -v
        } else {
            v
        }
    };
    for &(m, k, n, lo, hi) in &[
        (4, 50, 5, 10, 10),
        (3, 40, 4, 80, 0),
        (3, 40, 4, 0, 64),
        (5, 200, 3, 30, 30),
        (3, 20, 3, 0, 70),
    ] {
        // The last case: positive values without NaN, so that sums overflow to Inf.
        let positive = hi == 70;
        let d = |rng: &mut Rng| match draw(rng, lo, hi) {
            v if positive && v.is_nan() => 1.0,
            v if positive => v.abs(),
            v => v,
        };
        let a: Vec<f32> = (0..m * k).map(|_| d(&mut rng)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| d(&mut rng)).collect();
        let at = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
        let bt = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
        let got = naive_matmul(&at, &bt, &fmt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut acc = half::bf16::ZERO;
                for t in 0..k {
                    let prod = bf16_mul(h(a[i * k + t]), h(b[t * n + j]));
                    let pv = prod.to_f32().abs();
                    seen[0] += (pv > 0.0 && pv < f32::MIN_POSITIVE) as usize;
                    acc = bf16_add(acc, prod);
                }
                let (g, w) = (got[i * n + j], acc.to_f32());
                seen[1] += w.is_infinite() as usize;
                seen[2] += w.is_nan() as usize;
                mm.check(same32(g, w), || {
                    format!("{m}x{k}x{n} 2^-{lo}..2^{hi} [{i}][{j}]: {g:e} vs {w:e}")
                });
            }
        }
    }
    assert!(
        seen.iter().all(|&c| c > 0),
        "subnormal products, Inf, NaN outputs: {seen:?}"
    );
    mm.assert_none("naive bf16 vs exactly rounded loop");
}

/// Every product a·b of 8-bit posits, and every fused a·b + c of 6-bit posits (NaR
/// included), through the quire against the reference.
#[test]
fn quire_rounds_every_product_and_fused_multiply_add_of_small_posits() {
    let mut all = Mismatches::default();
    let mut checks = 0u64;
    for &(n, es) in &[(8, 0), (8, 1), (8, 2), (8, 3), (6, 0), (6, 1), (6, 2)] {
        let r = Ref::new(n, es);
        let mut q = Quire::new(r.posit()).unwrap();
        let mut mm = Mismatches::default();
        let cs: Vec<Option<u32>> = if n == 6 {
            (0..1u32 << n).map(Some).collect()
        } else {
            vec![None]
        };
        for a in 0..1u32 << n {
            for b in 0..1u32 << n {
                for &c in &cs {
                    let mut terms = vec![Term::Bits(a, b)];
                    terms.extend(c.map(Term::Single));
                    q.clear();
                    terms.iter().for_each(|&t| apply(&mut q, &r, t));
                    checks += 1;
                    check_quire(&r, &q, r.exact(&terms).as_ref(), &mut mm, || {
                        format!("{a:#x} * {b:#x} + {c:?}")
                    });
                }
            }
        }
        all = all.merge(mm);
    }
    all.assert_none_of("every small product and fused multiply-add", checks);
}
