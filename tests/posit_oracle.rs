//! Testing policy: posit rounding is proved bit for bit against two independent oracles.
//!
//! * softposit 0.4.0, only through the conversions that docs/ORACLES.md lists as
//!   exact (`P8E0`, `P32E2::from_f32`, `PxE1<N>`, `PxE2<N>`; never `P16E1` or
//!   `P32E2::from_f64`): 1e6 seeded random f32 per format (random bit patterns, values near 1,
//!   near minpos/maxpos and on the exact rounding boundaries) plus every special f32, and,
//!   behind `--ignored`, every one of the 2^32 f32 bit patterns for posit<8,0> and
//!   posit<16,1>. Both the pattern (`encode`) and the value (`round`, nearest-even) must match.
//! * The slow reference decoder of tests/common/reference.rs, written from the standard's
//!   definition (the bit string is parsed into sign, regime run, possibly cut exponent bits
//!   and fraction), sharing no code with src/.
//!   The boundary between neighbouring patterns p and p+1 is the value of the (n+1)-bit
//!   pattern "p then 1"; every pair of neighbours of every posit<n, es> with 3 <= n <= 16 and
//!   es <= 3 is checked at, just below and just above that boundary, in every rounding mode,
//!   including the exact up-probability of stochastic rounding.
//!
//! Decoding is checked exhaustively (n <= 16) and on random patterns (n > 16) against the
//! reference and for round trips; clamping (never 0, never NaR) and specials (NaN, ±Inf, -0)
//! for every es at n in {2, 3, 5, 8, 16, 32}. The named facts of docs/ORACLES.md (geometric
//! boundaries in the cut-exponent zones) have their own tests. Mismatches are collected and
//! reported (count and first few) rather than stopping at the first one.

mod common;
use common::reference::{posit_value, two_pow};
use common::{Mismatches, SplitMix};

use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::Posit;
use qcandle::{Format, Rounding};
use rayon::prelude::*;
use softposit::{PxE1, PxE2, P32E2, P8E0};

// ---------------------------------------------------------------------------------------
// Independent helpers (no code from src/).
// ---------------------------------------------------------------------------------------

/// Largest positive pattern (maxpos) of an n-bit posit.
fn maxpos_pattern(n: u32) -> u64 {
    (1u64 << (n - 1)) - 1
}

/// `log2(maxpos) = (n - 2) 2^es`, from the definition.
fn max_scale(n: u32, es: u32) -> i32 {
    ((n - 2) << es) as i32
}

/// Next f64 towards +Inf (finite, nonzero or zero input).
fn next_up(x: f64) -> f64 {
    if x == 0.0 {
        return f64::from_bits(1);
    }
    let b = x.to_bits();
    f64::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}

/// Next f64 towards -Inf.
fn next_down(x: f64) -> f64 {
    -next_up(-x)
}

/// The same value, counting every NaN as equal and +0 distinct from -0.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Positive normal f64 as `(m, e)` with `v = m 2^(e-52)`, `2^52 <= m < 2^53`.
fn split(v: f64) -> (u64, i32) {
    let b = v.to_bits();
    assert!(
        v > 0.0 && (b >> 52) != 0,
        "split needs a positive normal f64"
    );
    ((b & ((1 << 52) - 1)) | (1 << 52), (b >> 52) as i32 - 1023)
}

/// Exact `floor((x - lo) 2^bits / (hi - lo))` for positive normal `lo <= x <= hi`, with
/// `hi / lo < 2^10`.
fn exact_threshold(x: f64, lo: f64, hi: f64, bits: u32) -> u128 {
    let (mlo, elo) = split(lo);
    let (mx, ex) = split(x);
    let (mhi, ehi) = split(hi);
    assert!(ehi - elo < 10);
    let xi = (mx as u128) << (ex - elo);
    let hii = (mhi as u128) << (ehi - elo);
    let loi = mlo as u128;
    ((xi - loi) << bits) / (hii - loi)
}

fn posit(n: u32, es: u32) -> Posit {
    Posit::new(n, es).unwrap_or_else(|e| panic!("posit<{n},{es}> must be valid: {e}"))
}

// ---------------------------------------------------------------------------------------
// 1. softposit oracles on random and special f32.
// ---------------------------------------------------------------------------------------

/// An oracle: an f32 to (right-aligned n-bit pattern, decoded value).
type Oracle = fn(f32) -> (u32, f64);

fn sp_p8e0(x: f32) -> (u32, f64) {
    let p = P8E0::from_f32(x);
    (p.to_bits() as u32, p.to_f64())
}

fn sp_p32e2(x: f32) -> (u32, f64) {
    let p = P32E2::from_f32(x);
    (p.to_bits(), p.to_f64())
}

/// `PxE1<N>` keeps its pattern in the top N bits of a u32.
fn sp_pxe1<const N: u32>(x: f32) -> (u32, f64) {
    let p = PxE1::<N>::from_f32(x);
    (p.to_bits() >> (32 - N), p.to_f64())
}

fn sp_pxe2<const N: u32>(x: f32) -> (u32, f64) {
    let p = PxE2::<N>::from_f32(x);
    (p.to_bits() >> (32 - N), p.to_f64())
}

macro_rules! oracle_table {
    ($f:ident; $($n:literal)*) => {
        [$(($n, $f::<$n> as Oracle)),*]
    };
}

/// Special f32 inputs: signed zeros, infinities, NaNs, subnormals, extremes, and the
/// format's minpos/maxpos with their f32 neighbours and beyond.
fn special_f32(n: u32, es: u32) -> Vec<f32> {
    let s = max_scale(n, es);
    let mut v = vec![
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffff_ffff),
        f32::from_bits(0x7fc0_0001),
        f32::from_bits(1),
        f32::from_bits(2),
        f32::from_bits(3),
        f32::from_bits(0x0040_0000),
        f32::from_bits(0x007f_ffff),
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(f32::MIN_POSITIVE.to_bits() + 1),
        f32::EPSILON,
        1.0,
        1.5,
        0.5,
        3.0,
        f32::from_bits(0x3f80_0001),
        f32::from_bits(0x3f7f_ffff),
    ];
    for scale in [s, -s] {
        let c = two_pow(scale) as f32;
        v.extend([
            c,
            f32::from_bits(c.to_bits() + 1),
            f32::from_bits(c.to_bits() - 1),
            c * 2.0,
            c * 0.5,
            c * 1.5,
            c * 0.75,
        ]);
    }
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// `count` seeded inputs for posit<n, es>, in five families (i mod 5): random f32 bit
/// patterns (two of five), values near 1, values within a few binades of minpos and maxpos,
/// and the exact nearest-even boundaries (the (n+1)-bit "p then 1" values) or their f32
/// neighbours. Signs are random.
fn sample_f32(n: u32, es: u32, count: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix(seed ^ ((n as u64) << 40) ^ ((es as u64) << 48));
    let s = max_scale(n, es);
    let maxpat = maxpos_pattern(n);
    (0..count)
        .map(|i| {
            let r = rng.next_u64();
            let r2 = rng.next_u64();
            let sign = ((r >> 63) as u32) << 31;
            let mant = (r as u32) & 0x007f_ffff;
            let random_bits = (r2 >> 32) as u32;
            let bits = match i % 5 {
                0 | 1 => random_bits,
                2 => {
                    // 1 +- d ulp with d spread over all magnitudes up to 2^23.
                    let d = mant >> ((r >> 40) % 24);
                    let b = if (r >> 39) & 1 == 1 {
                        0x3f80_0000 + d
                    } else {
                        0x3f80_0000 - d
                    };
                    sign | b
                }
                3 => {
                    let d = ((r >> 40) % 6) as i32 - 3;
                    let scale = if (r >> 38) & 1 == 1 { s + d } else { -s + d };
                    let biased = scale + 127;
                    if (1..=254).contains(&biased) {
                        sign | ((biased as u32) << 23) | mant
                    } else {
                        random_bits
                    }
                }
                _ => {
                    let p = 1 + (r2 % (maxpat - 1));
                    let b = posit_value((p << 1) | 1, n + 1, es);
                    let b32 = b as f32;
                    if b32 as f64 == b {
                        let ulp_step = (r >> 40) % 3;
                        let m = b32.to_bits() + ulp_step as u32;
                        sign | (m - 1)
                    } else {
                        random_bits
                    }
                }
            };
            f32::from_bits(bits)
        })
        .collect()
}

/// Compares `encode`, `round` (nearest-even) and `decode` of the oracle's pattern with the
/// oracle on one input.
fn compare_one(posit: &Posit, oracle: Oracle, x: f32, fails: &mut Mismatches) {
    let (sp_bits, sp_val) = oracle(x);
    let xd = x as f64;
    let enc = posit.encode(xd);
    let val = posit.round(xd, NearestEven, 0);
    let dec = posit.decode(sp_bits);
    if enc != sp_bits || !same(val, sp_val) || !same(dec, sp_val) {
        fails.record(|| {
            format!(
                "posit<{},{}> x = {x:e} (f32 bits {:#010x}): softposit {sp_bits:#x} = {sp_val:e}; \
                 ours encode {enc:#x}, round {val:e}, decode(softposit) {dec:e}",
                posit.n(),
                posit.es(),
                x.to_bits()
            )
        });
    }
}

fn compare_on_samples(n: u32, es: u32, oracle: Oracle, count: usize) -> Mismatches {
    let p = posit(n, es);
    let mut inputs = special_f32(n, es);
    inputs.extend(sample_f32(n, es, count, 0x5eed_0001));
    inputs
        .par_chunks(1 << 14)
        .map(|chunk| {
            let mut f = Mismatches::default();
            for &x in chunk {
                compare_one(&p, oracle, x, &mut f);
            }
            f
        })
        .reduce(Mismatches::default, Mismatches::merge)
}

const SAMPLES: usize = 1_000_000;

#[test]
fn posit8_es0_encode_and_round_match_softposit_p8e0_on_1e6_f32_and_specials() {
    compare_on_samples(8, 0, sp_p8e0, SAMPLES).assert_none("posit<8,0> vs P8E0");
}

#[test]
fn posit32_es2_encode_and_round_match_softposit_p32e2_from_f32_on_1e6_f32_and_specials() {
    compare_on_samples(32, 2, sp_p32e2, SAMPLES).assert_none("posit<32,2> vs P32E2::from_f32");
}

#[test]
fn posit_n_es1_encode_and_round_match_softposit_pxe1_for_every_n_3_to_32() {
    let table = oracle_table!(sp_pxe1; 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24
        25 26 27 28 29 30 31 32);
    let mut all = Mismatches::default();
    for (n, oracle) in table {
        // docs/ORACLES.md: PxE1<32> trips softposit's own overflow checks outside release builds.
        if n == 32 && cfg!(debug_assertions) {
            continue;
        }
        all = all.merge(compare_on_samples(n, 1, oracle, SAMPLES));
    }
    all.assert_none("posit<n,1> vs PxE1<n>");
}

#[test]
fn posit_n_es2_encode_and_round_match_softposit_pxe2_for_every_n_4_to_32() {
    let table = oracle_table!(sp_pxe2; 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24
        25 26 27 28 29 30 31 32);
    let mut all = Mismatches::default();
    for (n, oracle) in table {
        all = all.merge(compare_on_samples(n, 2, oracle, SAMPLES));
    }
    all.assert_none("posit<n,2> vs PxE2<n>");
}

// ---------------------------------------------------------------------------------------
// 2. Exhaustive over all 2^32 f32 bit patterns.
// ---------------------------------------------------------------------------------------

fn compare_every_f32(n: u32, es: u32, oracle: Oracle) -> Mismatches {
    let p = posit(n, es);
    (0u32..=0xffff)
        .into_par_iter()
        .map(|hi| {
            let mut f = Mismatches::default();
            for lo in 0u32..=0xffff {
                compare_one(&p, oracle, f32::from_bits((hi << 16) | lo), &mut f);
            }
            f
        })
        .reduce(Mismatches::default, Mismatches::merge)
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn posit8_es0_matches_softposit_p8e0_on_every_f32() {
    let t = std::time::Instant::now();
    let f = compare_every_f32(8, 0, sp_p8e0);
    println!(
        "posit<8,0> over 2^32 f32: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    f.assert_none("posit<8,0> vs P8E0 on every f32");
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn posit16_es1_matches_softposit_pxe1_16_on_every_f32() {
    let t = std::time::Instant::now();
    let f = compare_every_f32(16, 1, sp_pxe1::<16>);
    println!(
        "posit<16,1> over 2^32 f32: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    f.assert_none("posit<16,1> vs PxE1<16> on every f32");
}

// ---------------------------------------------------------------------------------------
// 3. Boundaries from the standard's definition.
// ---------------------------------------------------------------------------------------

/// One pair of neighbouring positive patterns `p`, `p + 1` of posit<n, es>, with their
/// values and the boundary `b` (the (n+1)-bit pattern `p` then 1), all from the reference.
struct Pair {
    n: u32,
    es: u32,
    p: u32,
    lo: f64,
    hi: f64,
    b: f64,
}

impl Pair {
    fn name(&self) -> String {
        format!(
            "posit<{},{}> p = {:#x}: [{:e}, {:e}], boundary {:e}",
            self.n, self.es, self.p, self.lo, self.hi, self.b
        )
    }
}

/// Every neighbouring pair of every posit<n, es>, 3 <= n <= 16, es <= 3.
fn for_each_pair(mut f: impl FnMut(&Posit, &Pair)) {
    for n in 3..=16u32 {
        for es in 0..=3u32 {
            let posit = posit(n, es);
            for p in 1..maxpos_pattern(n) {
                let lo = posit_value(p, n, es);
                let hi = posit_value(p + 1, n, es);
                let b = posit_value((p << 1) | 1, n + 1, es);
                assert!(
                    0.0 < lo && lo < b && b < hi,
                    "reference: posit<{n},{es}> p = {p:#x} gives {lo:e} < {b:e} < {hi:e}?"
                );
                let pair = Pair {
                    n,
                    es,
                    p: p as u32,
                    lo,
                    hi,
                    b,
                };
                f(&posit, &pair);
            }
        }
    }
}

/// The f64 neighbours of `b` and, where `b` is an f32, its f32 neighbours: `(below, above)`.
fn neighbours_of(b: f64) -> Vec<(f64, f64)> {
    let mut v = vec![(next_down(b), next_up(b))];
    let b32 = b as f32;
    if b32 as f64 == b {
        v.push((
            f32::from_bits(b32.to_bits() - 1) as f64,
            f32::from_bits(b32.to_bits() + 1) as f64,
        ));
    }
    v
}

#[test]
fn posit_nearest_even_switches_at_the_n_plus_1_bit_boundary_and_ties_to_even_pattern() {
    let mut f = Mismatches::default();
    let mut f32_checked = 0u64;
    for_each_pair(|posit, pr| {
        let mask = posit.mask();
        let p = pr.p;
        let (even_pat, even_val) = if p & 1 == 0 {
            (p, pr.lo)
        } else {
            (p + 1, pr.hi)
        };
        for sign in [1.0f64, -1.0] {
            let pat = |q: u32| {
                if sign > 0.0 {
                    q
                } else {
                    q.wrapping_neg() & mask
                }
            };
            let mut expect = |x: f64, want_pat: u32, want: f64, what: &str| {
                let got = posit.round(sign * x, NearestEven, 0);
                let enc = posit.encode(sign * x);
                f.check(same(got, sign * want) && enc == pat(want_pat), || {
                    format!(
                        "{}: nearest-even {what} x = {:e}: want {:#x} = {:e}, got encode {enc:#x}, round {got:e}",
                        pr.name(),
                        sign * x,
                        pat(want_pat),
                        sign * want
                    )
                });
            };
            expect(pr.b, even_pat, even_val, "tie");
            expect(pr.lo, p, pr.lo, "at lo");
            expect(pr.hi, p + 1, pr.hi, "at hi");
            for (below, above) in neighbours_of(pr.b) {
                expect(below, p, pr.lo, "below boundary");
                expect(above, p + 1, pr.hi, "above boundary");
            }
        }
        if pr.b as f32 as f64 == pr.b {
            f32_checked += 1;
        }
    });
    f.assert_none("nearest-even boundaries");
    assert!(
        f32_checked > 100_000,
        "f32 neighbours were checked only {f32_checked} times"
    );
}

#[test]
fn posit_nearest_away_sends_the_boundary_tie_to_the_larger_magnitude() {
    let mut f = Mismatches::default();
    for_each_pair(|posit, pr| {
        for sign in [1.0f64, -1.0] {
            let mut expect = |x: f64, want: f64, what: &str| {
                let got = posit.round(sign * x, NearestAway, 0);
                f.check(same(got, sign * want), || {
                    format!(
                        "{}: nearest-away {what} x = {:e}: want {:e}, got {got:e}",
                        pr.name(),
                        sign * x,
                        sign * want
                    )
                });
            };
            expect(pr.b, pr.hi, "tie");
            expect(pr.lo, pr.lo, "at lo");
            for (below, above) in neighbours_of(pr.b) {
                expect(below, pr.lo, "below boundary");
                expect(above, pr.hi, "above boundary");
            }
        }
    });
    f.assert_none("nearest-away boundaries");
}

#[test]
fn posit_toward_zero_keeps_lower_pattern_on_the_whole_half_open_gap() {
    let mut f = Mismatches::default();
    for_each_pair(|posit, pr| {
        let inside = [
            pr.lo,
            next_up(pr.lo),
            next_down(pr.b),
            pr.b,
            next_up(pr.b),
            0.5 * (pr.lo + pr.hi),
            next_down(pr.hi),
        ];
        for sign in [1.0f64, -1.0] {
            for x in inside {
                let got = posit.round(sign * x, TowardZero, 0);
                f.check(same(got, sign * pr.lo), || {
                    format!(
                        "{}: toward-zero x = {:e}: want {:e}, got {got:e}",
                        pr.name(),
                        sign * x,
                        sign * pr.lo
                    )
                });
            }
            let got = posit.round(sign * pr.hi, TowardZero, 0);
            f.check(same(got, sign * pr.hi), || {
                format!("{}: toward-zero at hi: got {got:e}", pr.name())
            });
        }
    });
    f.assert_none("toward-zero gaps");
}

/// Stochastic rounding with k random bits goes up exactly when the top k bits of `random`
/// (as an integer r) are below `floor((x - lo) 2^k / (hi - lo))`: up with probability equal
/// to the value fraction of the gap (truncated to k bits), also in the cut-exponent zones
/// where the gap is not a power of two in units of the input.
#[test]
fn posit_stochastic_rounds_up_iff_random_is_below_the_truncated_value_fraction_of_gap() {
    let mut f = Mismatches::default();
    for_each_pair(|posit, pr| {
        let xs = [
            pr.b,
            next_up(pr.lo),
            next_down(pr.hi),
            next_up(pr.b),
            next_down(pr.b),
            pr.lo + 0.3 * (pr.hi - pr.lo),
            pr.lo + 0.9 * (pr.hi - pr.lo),
        ];
        for x in xs {
            if !(pr.lo < x && x < pr.hi) {
                continue;
            }
            for bits in [1u32, 5, 23] {
                let t = exact_threshold(x, pr.lo, pr.hi, bits);
                let top = (1u128 << bits) - 1;
                let candidates = [0, t.saturating_sub(1), t, t + 1, top];
                for r in candidates.into_iter().filter(|&r| r <= top) {
                    // Low bits below the top `bits` must not matter: fill them.
                    let random = ((r as u32) << (32 - bits)) | (0x5a5a_5a5a_u32 >> bits);
                    let want = if r < t { pr.hi } else { pr.lo };
                    let rule = Stochastic { bits };
                    for sign in [1.0f64, -1.0] {
                        let got = posit.round(sign * x, rule, random);
                        f.check(same(got, sign * want), || {
                            format!(
                                "{}: stochastic:{bits} x = {:e} r = {r} (threshold {t}): want {:e}, got {got:e}",
                                pr.name(),
                                sign * x,
                                sign * want
                            )
                        });
                    }
                }
            }
        }
    });
    f.assert_none("stochastic up-probability");
}

/// Named fact (docs/ORACLES.md): posit<16,1> between 2^26 and maxpos 2^28 switches at 2^27, not
/// at the arithmetic midpoint 1.68e8; softposit's `PxE1<16>` agrees.
#[test]
fn posit16_es1_rounds_above_2p27_up_to_maxpos_2p28_and_below_2p27_down_to_2p26() {
    let p = posit(16, 1);
    let (lo, mid, hi) = (two_pow(26), two_pow(27), two_pow(28));
    assert_eq!(p.max_pos(), hi);
    let cases = [
        (next_up(mid), hi),
        (1.5e8, hi), // nearer 2^26 in value, but above the geometric boundary
        (1.6e8, hi),
        (1.9e8, hi),
        (next_down(hi), hi),
        (next_down(mid), lo),
        (1.0e8, lo),
        (mid, lo), // tie: 2^26 = 0x7ffe is the even pattern
    ];
    for (x, want) in cases {
        assert_eq!(p.round(x, NearestEven, 0), want, "posit<16,1> round({x:e})");
        assert_eq!(
            p.round(-x, NearestEven, 0),
            -want,
            "posit<16,1> round({:e})",
            -x
        );
        assert_eq!(
            PxE1::<16>::from_f64(x).to_f64(),
            want,
            "PxE1<16> from_f64({x:e})"
        );
    }
    assert_eq!(p.encode(mid), 0x7ffe);
    assert_eq!(p.encode(next_up(mid)), 0x7fff);
    assert_eq!(p.round(mid, NearestAway, 0), hi);
}

/// Named fact: the mirror near minpos, posit<16,1> between minpos 2^-28 and 2^-26 switches
/// at 2^-27, and the tie goes to the even pattern 2 (2^-26).
#[test]
fn posit16_es1_rounds_between_minpos_and_2pm26_at_the_geometric_midpoint_2pm27() {
    let p = posit(16, 1);
    let (lo, mid, hi) = (two_pow(-28), two_pow(-27), two_pow(-26));
    assert_eq!(p.min_pos(), lo);
    let arith_mid = 0.5 * (lo + hi);
    let cases = [
        (next_down(mid), lo),
        (mid, hi), // tie: minpos = 0x0001 is odd
        (next_up(mid), hi),
        (0.9 * arith_mid, hi),
    ];
    for (x, want) in cases {
        assert_eq!(p.round(x, NearestEven, 0), want, "posit<16,1> round({x:e})");
        assert_eq!(
            PxE1::<16>::from_f64(x).to_f64(),
            want,
            "PxE1<16> from_f64({x:e})"
        );
    }
    assert_eq!(p.encode(mid), 0x0002);
    assert_eq!(p.round(mid, NearestAway, 0), hi);
    assert_eq!(p.round(next_up(mid), TowardZero, 0), lo);
}

/// Named fact: posit<8,2> rounds 144179.2 to 262144 = 2^18 although 65536 = 2^16 is nearer:
/// the patterns 0x7c (2^16) and 0x7d (2^18) meet at the 9-bit value 2^17.
#[test]
fn posit8_es2_rounds_144179_2_to_262144_not_to_the_nearer_65536() {
    let p = posit(8, 2);
    assert_eq!(p.round(144179.2, NearestEven, 0), 262144.0);
    assert_eq!(p.round(-144179.2, NearestEven, 0), -262144.0);
    assert_eq!(p.encode(144179.2), 0x7d);
    assert_eq!(p.round(next_down(131072.0), NearestEven, 0), 65536.0);
    assert_eq!(p.round(131072.0, NearestEven, 0), 65536.0); // tie, 0x7c even
    assert_eq!(PxE2::<8>::from_f64(144179.2).to_f64(), 262144.0);
}

// ---------------------------------------------------------------------------------------
// 4. Decoding and round trips.
// ---------------------------------------------------------------------------------------

/// Checks pattern `q` of posit<n, es>: decode equals the reference, encode inverts decode,
/// and the decoded value rounds to itself in every mode.
fn check_pattern(posit: &Posit, q: u32, f: &mut Mismatches) {
    let (n, es) = (posit.n(), posit.es());
    let v = posit.decode(q);
    let r = posit_value(q as u64, n, es);
    f.check(same(v, r), || {
        format!("posit<{n},{es}> decode({q:#x}) = {v:e}, reference {r:e}")
    });
    let enc = posit.encode(v);
    f.check(enc == q, || {
        format!("posit<{n},{es}> encode(decode({q:#x}) = {v:e}) = {enc:#x}")
    });
    let rounds = [
        posit.round(v, NearestEven, 0),
        posit.round(v, NearestAway, 0),
        posit.round(v, TowardZero, 0),
        posit.round(v, Stochastic { bits: 23 }, 0),
        posit.round(v, Stochastic { bits: 23 }, u32::MAX),
    ];
    for got in rounds {
        f.check(same(got, v), || {
            format!("posit<{n},{es}> pattern {q:#x} = {v:e} rounds to {got:e}")
        });
    }
}

#[test]
fn posit_encode_inverts_decode_on_every_pattern_for_n_2_to_16_and_es_0_to_5() {
    let mut f = Mismatches::default();
    let mut checked = 0u64;
    for n in 2..=16u32 {
        for es in 0..=5u32 {
            let posit = posit(n, es);
            for q in 0..=posit.mask() {
                check_pattern(&posit, q, &mut f);
                checked += 1;
            }
        }
    }
    f.assert_none("exhaustive round trip");
    assert_eq!(checked, 6 * ((1u64 << 17) - 4));
}

#[test]
fn posit32_es2_encode_inverts_decode_on_1e6_random_patterns_and_extremes() {
    let posit = posit(32, 2);
    let mut rng = SplitMix(0x32e2);
    let mut patterns: Vec<u32> = (0..SAMPLES).map(|_| rng.next_u64() as u32).collect();
    patterns.extend([
        0,
        1,
        2,
        0x7fff_ffff,
        0x7fff_fffe,
        0x8000_0000,
        0x8000_0001,
        u32::MAX,
    ]);
    let f = patterns
        .par_chunks(1 << 14)
        .map(|c| {
            let mut f = Mismatches::default();
            for &q in c {
                check_pattern(&posit, q, &mut f);
            }
            f
        })
        .reduce(Mismatches::default, Mismatches::merge);
    f.assert_none("posit<32,2> round trip");
}

#[test]
fn posit_encode_inverts_decode_on_random_patterns_for_n_17_to_32_and_es_0_to_5() {
    let mut f = Mismatches::default();
    let mut rng = SplitMix(0x1732);
    for n in 17..=32u32 {
        for es in 0..=5u32 {
            let posit = posit(n, es);
            let mask = posit.mask();
            for q in [0, 1, mask >> 1, posit.nar(), posit.nar() + 1, mask] {
                check_pattern(&posit, q, &mut f);
            }
            for _ in 0..20_000 {
                check_pattern(&posit, rng.next_u64() as u32 & mask, &mut f);
            }
        }
    }
    f.assert_none("round trip, n = 17..=32");
}

#[test]
fn posit_nar_decodes_to_nan_and_nan_encodes_back_to_nar_for_every_n_and_es() {
    for n in 2..=32u32 {
        for es in 0..=5u32 {
            let p = posit(n, es);
            assert_eq!(p.nar(), 1u32 << (n - 1), "posit<{n},{es}> NaR pattern");
            let v = p.decode(p.nar());
            assert!(v.is_nan(), "posit<{n},{es}> decode(NaR) = {v}");
            assert_eq!(p.encode(v), p.nar(), "posit<{n},{es}> encode(NaN)");
            assert!(p.round(v, NearestEven, 0).is_nan());
            // Bits above the n pattern bits are ignored.
            if n < 32 {
                assert!(p.decode(p.nar() | (1 << n)).is_nan());
            }
        }
    }
}

#[test]
fn posit_decode_is_strictly_increasing_in_signed_pattern_order_for_n_2_to_16() {
    for n in 2..=16u32 {
        for es in 0..=5u32 {
            let p = posit(n, es);
            let nar = p.nar();
            let mask = p.mask();
            // Signed order: NaR + 1 (most negative) ... mask (-minpos), 0, 1 ... NaR - 1.
            let mut prev = f64::NEG_INFINITY;
            let mut q = (nar + 1) & mask;
            while q != nar {
                let v = p.decode(q);
                assert!(
                    v > prev,
                    "posit<{n},{es}> decode({q:#x}) = {v:e} not above the previous {prev:e}"
                );
                prev = v;
                q = (q + 1) & mask;
            }
            assert_eq!(prev, p.max_pos(), "posit<{n},{es}> largest value");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. Clamping and specials.
// ---------------------------------------------------------------------------------------

const CLAMP_NS: [u32; 6] = [2, 3, 5, 8, 16, 32];

/// `x` rounded in every mode through both APIs (`Posit::round` with each rule type and
/// `Format::round` with each `Rounding`), labelled. Stochastic modes use several draws.
fn all_modes(posit: &Posit, x: f64) -> Vec<(String, f64)> {
    let format = Format::posit(posit.n(), posit.es()).expect("valid posit");
    let mut out = vec![
        (
            "Posit::round nearest-even".to_string(),
            posit.round(x, NearestEven, 0),
        ),
        (
            "Posit::round nearest-away".to_string(),
            posit.round(x, NearestAway, 0),
        ),
        (
            "Posit::round toward-zero".to_string(),
            posit.round(x, TowardZero, 0),
        ),
    ];
    let mut modes = vec![
        Rounding::NearestEven,
        Rounding::NearestAway,
        Rounding::TowardZero,
    ];
    for bits in [1u32, 8, 23] {
        modes.push(Rounding::Stochastic { bits });
        for r in [0u32, 1, 0x8000_0000, u32::MAX] {
            out.push((
                format!("Posit::round stochastic:{bits} r = {r:#x}"),
                posit.round(x, Stochastic { bits }, r),
            ));
        }
    }
    for mode in modes {
        for r in [0u32, 0x8000_0000, u32::MAX] {
            out.push((
                format!("Format::round {mode} r = {r:#x}"),
                format.round(x, mode, r),
            ));
        }
    }
    out
}

#[test]
fn posit_nonzero_below_minpos_rounds_to_signed_minpos_in_every_mode() {
    let mut f = Mismatches::default();
    for n in CLAMP_NS {
        for es in 0..=5u32 {
            let p = posit(n, es);
            let minpos = two_pow(-max_scale(n, es));
            assert_eq!(p.min_pos(), minpos, "posit<{n},{es}> min_pos");
            let tiny = [
                next_down(minpos),
                0.75 * minpos,
                0.5 * minpos,
                next_up(0.5 * minpos),
                minpos * two_pow(-20),
                f64::MIN_POSITIVE,
                f64::from_bits(1),
                f32::from_bits(1) as f64,
            ];
            for x in tiny.into_iter().filter(|&x| x < minpos) {
                for sign in [1.0f64, -1.0] {
                    for (mode, got) in all_modes(&p, sign * x) {
                        f.check(same(got, sign * minpos), || {
                            format!(
                                "posit<{n},{es}> {mode}: x = {:e} gave {got:e}, want {:e}",
                                sign * x,
                                sign * minpos
                            )
                        });
                    }
                    let enc = p.encode(sign * x);
                    let want = if sign > 0.0 { 1 } else { p.mask() };
                    f.check(enc == want, || {
                        format!("posit<{n},{es}> encode({:e}) = {enc:#x}", sign * x)
                    });
                }
            }
        }
    }
    f.assert_none("below minpos");
}

#[test]
fn posit_above_maxpos_rounds_to_signed_maxpos_never_nar_in_every_mode() {
    let mut f = Mismatches::default();
    for n in CLAMP_NS {
        for es in 0..=5u32 {
            let p = posit(n, es);
            let maxpos = two_pow(max_scale(n, es));
            assert_eq!(p.max_pos(), maxpos, "posit<{n},{es}> max_pos");
            let huge = [
                next_up(maxpos),
                1.5 * maxpos,
                2.0 * maxpos,
                next_down(2.0 * maxpos),
                maxpos * two_pow(40),
                f64::MAX,
                f32::MAX as f64,
            ];
            for x in huge.into_iter().filter(|&x| x > maxpos && x.is_finite()) {
                for sign in [1.0f64, -1.0] {
                    for (mode, got) in all_modes(&p, sign * x) {
                        f.check(same(got, sign * maxpos), || {
                            format!(
                                "posit<{n},{es}> {mode}: x = {:e} gave {got:e}, want {:e}",
                                sign * x,
                                sign * maxpos
                            )
                        });
                    }
                    let enc = p.encode(sign * x);
                    let want = if sign > 0.0 { p.nar() - 1 } else { p.nar() + 1 };
                    f.check(enc == want, || {
                        format!(
                            "posit<{n},{es}> encode({:e}) = {enc:#x}, want {want:#x}",
                            sign * x
                        )
                    });
                }
            }
        }
    }
    f.assert_none("above maxpos");
}

#[test]
fn posit_nan_and_infinities_round_to_nar_in_every_mode() {
    let mut f = Mismatches::default();
    let specials = [
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    for n in CLAMP_NS {
        for es in 0..=5u32 {
            let p = posit(n, es);
            for x in specials {
                for (mode, got) in all_modes(&p, x) {
                    f.check(got.is_nan(), || {
                        format!("posit<{n},{es}> {mode}: {x} gave {got:e}, want NaR (NaN)")
                    });
                }
                let enc = p.encode(x);
                f.check(enc == p.nar(), || {
                    format!("posit<{n},{es}> encode({x}) = {enc:#x}, want NaR")
                });
            }
        }
    }
    f.assert_none("NaN and infinities");
}

#[test]
fn posit_negative_zero_rounds_to_positive_zero_in_every_mode() {
    let mut f = Mismatches::default();
    for n in CLAMP_NS {
        for es in 0..=5u32 {
            let p = posit(n, es);
            for x in [0.0f64, -0.0] {
                for (mode, got) in all_modes(&p, x) {
                    f.check(got.to_bits() == 0, || {
                        format!("posit<{n},{es}> {mode}: {x:?} gave {got:?}, want +0.0")
                    });
                }
                let enc = p.encode(x);
                f.check(enc == 0, || {
                    format!("posit<{n},{es}> encode({x:?}) = {enc:#x}")
                });
            }
            f.check(p.decode(0).to_bits() == 0, || {
                format!("posit<{n},{es}> decode(0) is not +0.0")
            });
        }
    }
    f.assert_none("negative zero");
}
