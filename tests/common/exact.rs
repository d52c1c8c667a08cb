//! The exact posit reference of the quire tests (included by each `tests/quire_*.rs` file,
//! which also declare `common`): values and sums held as big integers in units of minpos²,
//! and the standard's rounding by exact comparison with the (n+1)-bit boundaries. It shares
//! no code with src/; `tests/quire_reference.rs` checks it against softposit.

#![allow(dead_code)] // each test file uses part of it

use std::cmp::Ordering;

use candle_core::{DType, Device, Tensor};
use num_bigint::BigInt;
use num_traits::{One, Signed, ToPrimitive, Zero};
use qcandle::format::Posit;
use qcandle::quire::Quire;
use qcandle::Format;

use crate::common::reference::{ldexp, posit_parts, posit_value};
use crate::common::{Mismatches, SplitMix};

/// A finite f64 as an exact big integer in units of `2^-1074`.
pub fn f64_units(x: f64) -> BigInt {
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
pub fn ref_odd(x: &BigInt, u: u32) -> f64 {
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
pub fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// The value of a decoded posit in units of `2^-u` (must be an integer there).
pub fn decoded_units((neg, sig, exp): (bool, u64, i32), u: u32) -> BigInt {
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
pub enum Term {
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
pub enum Draw {
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
pub struct Ref {
    pub n: u32,
    pub es: u32,
    pub s: u32,
    /// Every n-bit pattern's value in units of minpos (None for NaR), when n <= 16.
    pub units: Vec<Option<BigInt>>,
    /// Every positive (n+1)-bit pattern's value in units of minpos², when n <= 16.
    pub bounds: Vec<BigInt>,
}

impl Ref {
    pub fn new(n: u32, es: u32) -> Ref {
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
                .map(|p| posit_parts(p as u64, n, es).map(|d| decoded_units(d, s)))
                .collect();
            r.bounds = (0..1u64 << n)
                .map(|q| decoded_units(posit_parts(q, n + 1, es).unwrap(), 2 * s))
                .collect();
        }
        r
    }

    pub fn posit(&self) -> Posit {
        Posit::new(self.n, self.es).unwrap()
    }

    pub fn format(&self) -> Format {
        Format::Posit(self.posit())
    }

    pub fn name(&self) -> String {
        format!("posit<{},{}>", self.n, self.es)
    }

    pub fn mask(&self) -> u32 {
        ((1u64 << self.n) - 1) as u32
    }

    pub fn nar(&self) -> u32 {
        1 << (self.n - 1)
    }

    pub fn maxp(&self) -> u32 {
        self.nar() - 1
    }

    pub fn one(&self) -> u32 {
        1 << (self.n - 2)
    }

    pub fn neg(&self, p: u32) -> u32 {
        p.wrapping_neg() & self.mask()
    }

    /// Value of pattern `p` in units of minpos; None for NaR.
    pub fn minpos_units(&self, p: u32) -> Option<BigInt> {
        if self.units.is_empty() {
            posit_parts(p as u64, self.n, self.es).map(|d| decoded_units(d, self.s))
        } else {
            self.units[p as usize].clone()
        }
    }

    /// Value of the non-NaR pattern `p` in units of minpos².
    pub fn sq_units(&self, p: u32) -> BigInt {
        self.minpos_units(p).expect("not NaR") << self.s as usize
    }

    /// Value of the positive (n+1)-bit pattern `q` in units of minpos².
    pub fn bound(&self, q: u32) -> BigInt {
        if self.bounds.is_empty() {
            decoded_units(
                posit_parts(q as u64, self.n + 1, self.es).unwrap(),
                2 * self.s,
            )
        } else {
            self.bounds[q as usize].clone()
        }
    }

    /// Value of pattern `p` as f64 (exact for every format tested here); NaN for NaR.
    pub fn value(&self, p: u32) -> f64 {
        posit_value(p as u64, self.n, self.es)
    }

    /// The pattern of the exact value `x * 2^-2s`, rounded by the standard's rule.
    pub fn round(&self, x: &BigInt) -> u32 {
        self.round_at(x, 2 * self.s)
    }

    /// The pattern of the exact value `x * 2^-u`, rounded by the standard's rule.
    pub fn round_at(&self, x: &BigInt, u: u32) -> u32 {
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
    pub fn round_f64(&self, x: f64) -> u32 {
        if !x.is_finite() {
            return self.nar();
        }
        self.round_at(&f64_units(x), 1074)
    }

    /// A random pattern (never NaR).
    pub fn draw(&self, rng: &mut SplitMix, how: Draw) -> u32 {
        let how = match how {
            Draw::Mixed => [Draw::Uniform, Draw::NearOne, Draw::Extreme][rng.below(3) as usize],
            h => h,
        };
        loop {
            let p = match how {
                Draw::Uniform | Draw::Mixed => rng.next_u64() as u32 & self.mask(),
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

    pub fn random_term(&self, rng: &mut SplitMix, how: Draw) -> Term {
        let (a, b) = (self.draw(rng, how), self.draw(rng, how));
        match rng.below(4) {
            0 => Term::Product(a, b),
            1 => Term::NegProduct(a, b),
            2 => Term::Single(a),
            _ => Term::Bits(a, b),
        }
    }

    /// The exact value of a term in units of minpos²; None when an operand is NaR.
    pub fn term_units(&self, t: Term) -> Option<BigInt> {
        Some(match t {
            Term::Product(a, b) | Term::Bits(a, b) => {
                self.minpos_units(a)? * self.minpos_units(b)?
            }
            Term::NegProduct(a, b) => -(self.minpos_units(a)? * self.minpos_units(b)?),
            Term::Single(a) => self.minpos_units(a)? << self.s as usize,
        })
    }

    /// The exact sum of `terms` in units of minpos²; None when NaR was involved.
    pub fn exact(&self, terms: &[Term]) -> Option<BigInt> {
        let mut sum = BigInt::zero();
        for &t in terms {
            sum += self.term_units(t)?;
        }
        Some(sum)
    }

    /// Terms whose exact sum is `target` (units of minpos², > 0): greedily the largest
    /// `posit * w` at most the remainder, with `w` one of minpos, 1 and maxpos (so that some
    /// choice lands where posits are dense, also for large es).
    pub fn decompose(&self, target: &BigInt) -> Vec<Term> {
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
    pub fn largest_at_most(&self, key: impl Fn(u32) -> BigInt, x: &BigInt) -> u32 {
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

pub fn apply(q: &mut Quire, r: &Ref, t: Term) {
    match t {
        Term::Product(a, b) => q.add_product(r.value(a), r.value(b)),
        Term::NegProduct(a, b) => q.sub_product(r.value(a), r.value(b)),
        Term::Single(a) => q.add(r.value(a)),
        Term::Bits(a, b) => q.add_product_bits(a, b),
    }
}

pub fn p(n: u32, es: u32) -> Posit {
    Posit::new(n, es).unwrap()
}

/// One GEMM's operands as bit patterns (row-major `a` (m x k), `b` (k x n)) and an optional bias.
pub struct Gemm {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: Vec<u32>,
    pub b: Vec<u32>,
    pub bias: Option<(bool, Vec<u32>)>, // (per row, values)
}

impl Gemm {
    pub fn random(
        r: &Ref,
        rng: &mut SplitMix,
        (m, k, n): (usize, usize, usize),
        how: Draw,
    ) -> Gemm {
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
    pub fn exact(&self, r: &Ref, i: usize, j: usize) -> Option<BigInt> {
        let mut terms: Vec<Term> = (0..self.k)
            .map(|t| Term::Product(self.a[i * self.k + t], self.b[t * self.n + j]))
            .collect();
        if let Some((per_row, v)) = &self.bias {
            terms.push(Term::Single(v[if *per_row { i } else { j }]));
        }
        r.exact(&terms)
    }

    pub fn expected(&self, r: &Ref) -> Vec<f64> {
        (0..self.m * self.n)
            .map(|o| {
                let x = self.exact(r, o / self.n, o % self.n);
                r.value(x.map_or(r.nar(), |x| r.round(&x)))
            })
            .collect()
    }
}

pub fn compare(mm: &mut Mismatches, got: &[f64], want: &[f64], what: impl Fn(usize) -> String) {
    assert_eq!(got.len(), want.len());
    for (o, (&g, &w)) in got.iter().zip(want).enumerate() {
        mm.check(same(g, w), || {
            format!("{}: got {g:e}, expected {w:e}", what(o))
        });
    }
}

pub fn tensor(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
}

pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

pub fn t2(r: usize, c: usize) -> Tensor {
    Tensor::ones((r, c), DType::F32, &Device::Cpu).unwrap()
}
