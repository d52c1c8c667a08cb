//! Testing policy: fixed point and block floating point are checked against an integer
//! reference that shares no code with `src/format`. A finite f64 is split exactly into
//! `m * 2^e` (integer `m`), the count `k = round(x / 2^q)` is computed in u128 integer
//! arithmetic from the discarded remainder, clamped in i128 and scaled back; the block
//! exponent comes from the f64's bit pattern. Results are compared bit for bit (NaN matches
//! NaN, and the sign of zero counts). Hand-constructed ties, with their binary expansion in a
//! comment, pin each rounding mode independently of the reference.

mod common;
use common::{Mismatches, SplitMix};

use qcandle::format::block::block_max;
use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::{Block, BlockScope, Fixed};
use qcandle::{Format, Rounding};
use rayon::prelude::*;

// ---------------------------------------------------------------------------------------
// Helpers and the integer reference
// ---------------------------------------------------------------------------------------

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Exact 2^q for q in f64's range, subnormal powers included (built from the bit pattern).
fn exp2(q: i32) -> f64 {
    assert!((-1074..=1023).contains(&q), "2^{q} is not an f64");
    if q >= -1022 {
        f64::from_bits(((q + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (q + 1074))
    }
}

/// A finite nonzero |x| as an integer times a power of two: `|x| = m * 2^e` exactly.
fn split(x: f64) -> (u64, i32) {
    let bits = x.abs().to_bits();
    let biased = (bits >> 52) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    if biased == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), biased - 1075)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Even,
    Away,
    Zero,
    Sr { bits: u32, random: u32 },
}

fn modes_for(x: f64) -> Vec<Mode> {
    let r =
        ((x.to_bits() ^ 0x1234_5678_9abc_def0).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32;
    vec![
        Mode::Even,
        Mode::Away,
        Mode::Zero,
        Mode::Sr {
            bits: 23,
            random: 0,
        },
        Mode::Sr {
            bits: 23,
            random: 0x8000_0000,
        },
        Mode::Sr {
            bits: 23,
            random: u32::MAX,
        },
        Mode::Sr {
            bits: 23,
            random: r,
        },
        Mode::Sr { bits: 4, random: r },
    ]
}

/// `|x| = m 2^e` rounded to a whole number of quanta `2^q`: returns the count (saturated
/// far beyond any range tested) and whether it is exact (no bits were discarded).
fn round_count(m: u64, e: i32, q: i32, mode: Mode) -> (u128, bool) {
    let sh = e - q;
    if sh >= 0 {
        let c = if sh > 70 {
            1u128 << 120
        } else {
            (m as u128) << sh
        };
        return (c, true);
    }
    let s = (-sh) as u32;
    if s > 100 {
        // m < 2^53: the value is below 2^-47 quanta; only "up" could make it nonzero, and
        // no mode goes up (nearest: below half; stochastic: threshold floor(rem 2^k / 2^s) = 0).
        return (0, m == 0);
    }
    let m = m as u128;
    let int = m >> s;
    let rem = m - (int << s);
    let half = 1u128 << (s - 1);
    let up = match mode {
        Mode::Even => rem > half || (rem == half && int % 2 == 1),
        Mode::Away => rem >= half,
        Mode::Zero => false,
        Mode::Sr { bits, random } => ((random >> (32 - bits)) as u128) < (rem << bits) >> s,
    };
    (int + up as u128, rem == 0)
}

/// Reference for a `wl`-bit two's complement grid of quanta `2^q`: sign-magnitude rounding,
/// clamp to `[-2^(wl-1) (+1 if sym), 2^(wl-1) - 1]` quanta, zero is +0.
fn grid_ref(x: f64, q: i32, wl: u32, clamp: bool, sym: bool, mode: Mode) -> f64 {
    let kmax = (1i128 << (wl - 1)) - 1;
    let kmin = -(1i128 << (wl - 1)) + sym as i128;
    if x.is_nan() {
        return f64::NAN;
    }
    if x.is_infinite() {
        return match (clamp, x > 0.0) {
            (false, _) => x,
            (true, true) => kmax as f64 * exp2(q),
            (true, false) => kmin as f64 * exp2(q),
        };
    }
    if x == 0.0 {
        return 0.0;
    }
    let (m, e) = split(x);
    let (c, exact) = round_count(m, e, q, mode);
    let k = if x < 0.0 { -(c as i128) } else { c as i128 };
    let kc = if clamp { k.clamp(kmin, kmax) } else { k };
    if kc == 0 {
        return 0.0;
    }
    if exact && kc == k {
        return x; // on the grid and in range: unchanged (k may be huge without clamping)
    }
    kc as f64 * exp2(q) // |kc| < 2^53 and q >= -1074 here: exact
}

fn fixed_ref(f: &Fixed, x: f64, mode: Mode) -> f64 {
    grid_ref(x, -f.fl(), f.wl(), f.clamp(), f.symmetric(), mode)
}

/// Block exponent from the bit pattern of the largest finite magnitude (None: no finite
/// nonzero element).
fn block_exponent_ref(block: &[f64]) -> Option<i32> {
    let mut best: Option<f64> = None;
    for &v in block {
        if v.is_finite() && v != 0.0 && best.is_none_or(|b| v.abs() > b) {
            best = Some(v.abs());
        }
    }
    let bits = best?.to_bits();
    let biased = (bits >> 52) as i32;
    Some(if biased == 0 {
        bits.ilog2() as i32 - 1074
    } else {
        biased - 1023
    })
}

fn block_ref(x: f64, exponent: Option<i32>, wl: u32, mode: Mode) -> f64 {
    if !x.is_finite() {
        return x;
    }
    match exponent {
        None => 0.0,
        Some(e) => grid_ref(x, e - (wl as i32 - 2), wl, true, false, mode),
    }
}

fn lib_fixed(f: &Fixed, x: f64, mode: Mode) -> f64 {
    match mode {
        Mode::Even => f.round(x, NearestEven, 0),
        Mode::Away => f.round(x, NearestAway, 0),
        Mode::Zero => f.round(x, TowardZero, 0),
        Mode::Sr { bits, random } => f.round(x, Stochastic { bits }, random),
    }
}

fn lib_block(b: &Block, x: f64, max: f64, mode: Mode) -> f64 {
    match mode {
        Mode::Even => b.round(x, max, NearestEven, 0),
        Mode::Away => b.round(x, max, NearestAway, 0),
        Mode::Zero => b.round(x, max, TowardZero, 0),
        Mode::Sr { bits, random } => b.round(x, max, Stochastic { bits }, random),
    }
}

fn fixed(wl: u32, fl: i32, clamp: bool, sym: bool) -> Fixed {
    Fixed::with_options(wl, fl, clamp, sym).unwrap()
}

fn fixed_name(f: &Fixed) -> String {
    Format::Fixed(*f).to_string()
}

// ---------------------------------------------------------------------------------------
// 3. Fixed point
// ---------------------------------------------------------------------------------------

fn fixed_grid() -> Vec<Fixed> {
    let mut v = Vec::new();
    for wl in [2, 4, 8, 16] {
        for fl in [-2, 0, 3, 8] {
            for clamp in [true, false] {
                for sym in [false, true] {
                    v.push(fixed(wl, fl, clamp, sym));
                }
            }
        }
    }
    v
}

/// Every count in range and a few beyond, at offsets 0, 1/4, 1/2 (tie) +- 1 ulp, 3/4 of a
/// quantum, both signs; extremes; random values over a wide span.
fn fixed_probes(f: &Fixed) -> Vec<f64> {
    let quantum = exp2(-f.fl());
    let top = 1i64 << (f.wl() - 1);
    let mut v = Vec::new();
    for k in (-top - 3)..=(top + 3) {
        let base = k as f64 * quantum;
        let tie = base + quantum / 2.0;
        v.extend([
            base,
            base + quantum / 4.0,
            tie.next_down(),
            tie,
            tie.next_up(),
            base + quantum * 0.75,
        ]);
    }
    v.extend([
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN,
        f64::from_bits(1),
        -f64::from_bits(1),
        f64::MIN_POSITIVE,
        1e300,
        -1e300,
        quantum / 2.0,
        -quantum / 2.0,
        (quantum / 2.0).next_down(),
        -(quantum / 2.0).next_up(),
    ]);
    let mut rng = SplitMix(f.wl() as u64 * 1000 + (f.fl() + 100) as u64);
    for _ in 0..5000 {
        v.push(rng.float_between(-f.fl() - 60, f.wl() as i32 - f.fl() + 8));
    }
    v
}

#[test]
fn fixed_rounds_like_the_integer_reference() {
    // wl in {2,4,8,16} x fl in {-2,0,3,8} x clamp x symmetric, every mode.
    let (n, mm) = fixed_grid()
        .into_par_iter()
        .map(|f| {
            let mut mm = Mismatches::default();
            let mut n = 0u64;
            for x in fixed_probes(&f) {
                for mode in modes_for(x) {
                    n += 1;
                    let (got, want) = (lib_fixed(&f, x, mode), fixed_ref(&f, x, mode));
                    if !same(got, want) {
                        mm.record(|| {
                            format!(
                                "{}: {x:e} ({mode:?}) -> {got:e}, reference {want:e}",
                                fixed_name(&f)
                            )
                        });
                    }
                }
            }
            (n, mm)
        })
        .reduce(
            || (0, Mismatches::default()),
            |(a, x), (b, y)| (a + b, x.merge(y)),
        );
    mm.assert_none_of("fixed vs integer reference", n);
}

#[test]
fn fixed_range_accessors_match_the_integer_range() {
    for f in fixed_grid() {
        let q = exp2(-f.fl());
        let top = (1i64 << (f.wl() - 1)) as f64;
        assert_eq!(f.quantum(), q, "{}", fixed_name(&f));
        assert_eq!(f.max_value(), (top - 1.0) * q, "{}", fixed_name(&f));
        let min = if f.symmetric() {
            -(top - 1.0) * q
        } else {
            -top * q
        };
        assert_eq!(f.min_value(), min, "{}", fixed_name(&f));
    }
    assert_eq!(fixed(32, 0, true, false).max_value(), 2147483647.0);
    assert_eq!(fixed(32, 64, true, false).min_value(), -(2f64.powi(-33)));
    assert_eq!(fixed(2, -64, true, true).max_value(), 2f64.powi(64));
}

/// A hand-computed tie: (wl, fl, clamp, sym, x, nearest-even, nearest-away, toward-zero).
type Tie = (u32, i32, bool, bool, f64, f64, f64, f64);

#[rustfmt::skip]
const TIES: &[Tie] = &[
    // fixed<8,3>: quantum 1/8, counts -128..=127, values -16..=15.875.
    // 0.0625 = 0b0.0001 = 0.5 quanta: between 0 (even) and 0.125.
    (8, 3, true, false, 0.0625, 0.0, 0.125, 0.0),
    // 0.1875 = 0b0.0011 = 1.5 quanta: between 0.125 (1, odd) and 0.25 (2, even).
    (8, 3, true, false, 0.1875, 0.25, 0.25, 0.125),
    // 0.3125 = 0b0.0101 = 2.5 quanta: between 0.25 (2, even) and 0.375.
    (8, 3, true, false, 0.3125, 0.25, 0.375, 0.25),
    // -0.3125 = -0b0.0101: the mirror image (sign-magnitude rounding).
    (8, 3, true, false, -0.3125, -0.25, -0.375, -0.25),
    // -0.0625 = -0b0.0001 = -0.5 quanta: to +0 (never -0) or -0.125.
    (8, 3, true, false, -0.0625, 0.0, -0.125, 0.0),
    // 15.9375 = 0b1111.1111 = 127.5 quanta: 128 is even but out of range, clamps to 127.
    (8, 3, true, false, 15.9375, 15.875, 15.875, 15.875),
    // ... without clamping 128 quanta = 16 is kept.
    (8, 3, false, false, 15.9375, 16.0, 16.0, 15.875),
    // -16.0625 = -0b10000.0001 = -128.5 quanta: -128 (even, in range) or -129 (clamped).
    (8, 3, true, false, -16.0625, -16.0, -16.0, -16.0),
    (8, 3, false, false, -16.0625, -16.0, -16.125, -16.0),
    // symmetric: the range ends at -127 quanta = -15.875.
    (8, 3, true, true, -16.0625, -15.875, -15.875, -15.875),
    // fixed<4,-2>: quantum 4, counts -8..=7, values -32..=28.
    // 6 = 0b110 = 1.5 quanta: between 4 (1, odd) and 8 (2, even).
    (4, -2, true, false, 6.0, 8.0, 8.0, 4.0),
    // 10 = 0b1010 = 2.5 quanta: between 8 (2, even) and 12.
    (4, -2, true, false, 10.0, 8.0, 12.0, 8.0),
    // 30 = 0b11110 = 7.5 quanta: 8 quanta = 32 clamps to 28.
    (4, -2, true, false, 30.0, 28.0, 28.0, 28.0),
    (4, -2, false, false, 30.0, 32.0, 32.0, 28.0),
    // -2 = -0b10 = -0.5 quanta.
    (4, -2, true, false, -2.0, 0.0, -4.0, 0.0),
    // fixed<2,0>: counts -2..=1.
    // 0.5 = 0b0.1.
    (2, 0, true, false, 0.5, 0.0, 1.0, 0.0),
    // 1.5 = 0b1.1: 2 is even but clamps to 1.
    (2, 0, true, false, 1.5, 1.0, 1.0, 1.0),
    // -1.5 = -0b1.1: -2 is in range (two's complement), -1 when symmetric.
    (2, 0, true, false, -1.5, -2.0, -2.0, -1.0),
    (2, 0, true, true, -1.5, -1.0, -1.0, -1.0),
    // -2.5 = -0b10.1: -2 (even) or -3, clamped to -2.
    (2, 0, true, false, -2.5, -2.0, -2.0, -2.0),
    (2, 0, false, false, -2.5, -2.0, -3.0, -2.0),
    // fixed<16,8>: quantum 2^-8.
    // 1 + 2^-9 = 0b1.000000001 = 256.5 quanta.
    (16, 8, true, false, 1.001953125, 1.0, 1.00390625, 1.0),
    // 1 + 3 2^-9 = 0b1.000000011 = 257.5 quanta.
    (16, 8, true, false, 1.005859375, 1.0078125, 1.0078125, 1.00390625),
    // 127.998046875 = 0b1111111.111111111 = 32767.5 quanta: 32768 clamps to 32767.
    (16, 8, true, false, 127.998046875, 127.99609375, 127.99609375, 127.99609375),
    (16, 8, false, false, 127.998046875, 128.0, 128.0, 127.99609375),
    // fixed<8,0>: 2.5 = 0b10.1 and 3.5 = 0b11.1 (the classic pair), -2.5.
    (8, 0, true, false, 2.5, 2.0, 3.0, 2.0),
    (8, 0, true, false, 3.5, 4.0, 4.0, 3.0),
    (8, 0, true, false, -2.5, -2.0, -3.0, -2.0),
];

#[test]
fn fixed_ties_follow_each_rounding_mode() {
    for &(wl, fl, clamp, sym, x, even, away, zero) in TIES {
        let f = fixed(wl, fl, clamp, sym);
        let name = fixed_name(&f);
        let got = [
            f.round(x, NearestEven, 0),
            f.round(x, NearestAway, 0),
            f.round(x, TowardZero, 0),
            // A tie is half a quantum: 23-bit stochastic rounding goes up for draws below
            // 2^22 (top bit 0) and down from 2^22 on.
            f.round(x, Stochastic { bits: 23 }, 0),
            f.round(x, Stochastic { bits: 23 }, 0x7fff_ffff),
            f.round(x, Stochastic { bits: 23 }, 0x8000_0000),
            f.round(x, Stochastic { bits: 1 }, 0),
            f.round(x, Stochastic { bits: 1 }, u32::MAX),
        ];
        let want = [even, away, zero, away, away, zero, away, zero];
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                same(*g, w),
                "{name}: {x} case {i}: got {got:?}, want {want:?}"
            );
        }
        // The reference agrees with the hand-computed table.
        for (mode, w) in [(Mode::Even, even), (Mode::Away, away), (Mode::Zero, zero)] {
            assert!(
                same(fixed_ref(&f, x, mode), w),
                "reference on {name} {x} {mode:?}"
            );
        }
        // One ulp off the tie, every nearest mode agrees on the nearer side.
        let (below, above) = (
            x.abs().next_down().copysign(x),
            x.abs().next_up().copysign(x),
        );
        let near_zero = f.round(below, NearestAway, 0);
        let far = f.round(above, NearestEven, 0);
        assert!(
            same(near_zero, fixed_ref(&f, below, Mode::Even)),
            "{name}: {below}"
        );
        assert!(
            same(far, fixed_ref(&f, above, Mode::Away)),
            "{name}: {above}"
        );
    }
}

#[test]
fn fixed_zero_is_unsigned() {
    for f in fixed_grid() {
        for x in [
            -0.0,
            0.0,
            -f64::from_bits(1),
            -(f.quantum() / 4.0),
            -(f.quantum() / 2.0),
        ] {
            for mode in [
                Rounding::NearestEven,
                Rounding::TowardZero,
                Rounding::Stochastic { bits: 8 },
            ] {
                let got = Format::Fixed(f).round(x, mode, u32::MAX);
                assert_eq!(
                    got.to_bits(),
                    0,
                    "{}: {x:e} {mode} -> {got:e}",
                    fixed_name(&f)
                );
            }
        }
    }
}

#[test]
fn fixed_nan_stays_nan_and_infinities_clamp_or_pass() {
    for f in fixed_grid() {
        for mode in [
            Rounding::NearestEven,
            Rounding::NearestAway,
            Rounding::TowardZero,
            Rounding::Stochastic { bits: 23 },
        ] {
            let r = |x: f64| Format::Fixed(f).round(x, mode, 12345);
            assert!(r(f64::NAN).is_nan(), "{}", fixed_name(&f));
            assert!(r(-f64::NAN).is_nan(), "{}", fixed_name(&f));
            if f.clamp() {
                assert_eq!(r(f64::INFINITY), f.max_value(), "{}", fixed_name(&f));
                assert_eq!(r(f64::NEG_INFINITY), f.min_value(), "{}", fixed_name(&f));
                assert_eq!(r(1e300), f.max_value(), "{}", fixed_name(&f));
                assert_eq!(r(-1e300), f.min_value(), "{}", fixed_name(&f));
            } else {
                assert_eq!(r(f64::INFINITY), f64::INFINITY, "{}", fixed_name(&f));
                assert_eq!(
                    r(f64::NEG_INFINITY),
                    f64::NEG_INFINITY,
                    "{}",
                    fixed_name(&f)
                );
                assert_eq!(
                    r(1e300),
                    1e300,
                    "{}: on the grid, unbounded",
                    fixed_name(&f)
                );
            }
        }
    }
}

#[test]
fn fixed_stochastic_rounding_is_unbiased_to_within_its_bits() {
    // fixed<8,0>: x = 2 + 5/16 = 0b10.0101 goes up with probability exactly 5/16 for k >= 4
    // random bits; over every 4-bit draw exactly 5 of 16 go up.
    let f = fixed(8, 0, true, false);
    let x = 2.3125;
    let ups = (0u32..16)
        .filter(|r| f.round(x, Stochastic { bits: 4 }, r << 28) == 3.0)
        .count();
    assert_eq!(ups, 5);
    // With 2 bits the distance truncates to floor(5/16 * 4) = 1 of 4 draws.
    let ups = (0u32..4)
        .filter(|r| f.round(x, Stochastic { bits: 2 }, r << 30) == 3.0)
        .count();
    assert_eq!(ups, 1);
    // Negative: the magnitude goes up (away from zero) with the same probability.
    let ups = (0u32..16)
        .filter(|r| f.round(-x, Stochastic { bits: 4 }, r << 28) == -3.0)
        .count();
    assert_eq!(ups, 5);
}

#[test]
fn format_round_dispatches_to_fixed_round() {
    let mut rng = SplitMix(99);
    for s in ["fixed<8,4>", "fixed<8,4,noclamp,sym>", "fixed<16,-2>"] {
        let fmt: Format = s.parse().unwrap();
        let Format::Fixed(f) = fmt else { panic!("{s}") };
        for _ in 0..5000 {
            let x = rng.float_between(-12, 20);
            let r = rng.next_u32();
            for (a, b) in [
                (
                    fmt.round(x, Rounding::NearestEven, r),
                    fixed_ref(&f, x, Mode::Even),
                ),
                (
                    fmt.round(x, Rounding::NearestAway, r),
                    fixed_ref(&f, x, Mode::Away),
                ),
                (
                    fmt.round(x, Rounding::TowardZero, r),
                    fixed_ref(&f, x, Mode::Zero),
                ),
                (
                    fmt.round(x, Rounding::Stochastic { bits: 7 }, r),
                    fixed_ref(&f, x, Mode::Sr { bits: 7, random: r }),
                ),
            ] {
                assert!(same(a, b), "{s}: {x:e}: {a:e} vs reference {b:e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. Block floating point
// ---------------------------------------------------------------------------------------

fn block(wl: u32) -> Block {
    Block::new(wl, BlockScope::Tensor).unwrap()
}

/// Rounds a whole block with the library (block_max from the library).
fn lib_block_all(b: &Block, xs: &[f64], mode: Mode) -> Vec<f64> {
    let max = block_max(xs.iter().copied());
    xs.iter().map(|&x| lib_block(b, x, max, mode)).collect()
}

fn ref_block_all(wl: u32, xs: &[f64], mode: Mode) -> Vec<f64> {
    let e = block_exponent_ref(xs);
    xs.iter().map(|&x| block_ref(x, e, wl, mode)).collect()
}

fn check_block(wl: u32, xs: &[f64], mm: &mut Mismatches) -> u64 {
    let b = block(wl);
    let mut n = 0;
    // block_max itself: the largest finite magnitude.
    let want_max =
        xs.iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| if v.abs() > m { v.abs() } else { m });
    let got_max = block_max(xs.iter().copied());
    if !same(got_max, want_max) {
        mm.record(|| format!("block_max({xs:?}) = {got_max:e}, want {want_max:e}"));
    }
    for mode in modes_for(xs.first().copied().unwrap_or(0.0)) {
        let got = lib_block_all(&b, xs, mode);
        let want = ref_block_all(wl, xs, mode);
        for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
            n += 1;
            if !same(*g, *w) {
                mm.record(|| {
                    format!(
                        "block<{wl}> max {got_max:e} (E {:?}): {x:e} ({mode:?}) -> {g:e}, reference {w:e}",
                        block_exponent_ref(xs)
                    )
                });
            }
        }
    }
    n
}

/// A random block: magnitudes spread over `span` binades around 2^center, with zeros, NaN
/// and ±Inf sprinkled in, and elements placed exactly on ties of the block's grid.
fn random_block(rng: &mut SplitMix, wl: u32, center: i32, span: i32) -> Vec<f64> {
    let len = 1 + rng.below(12) as usize;
    let mut xs: Vec<f64> = (0..len)
        .map(|_| rng.float_between(center - span, center + 1))
        .collect();
    if let Some(e) = block_exponent_ref(&xs) {
        let q = e - (wl as i32 - 2);
        if (-1073..=1000).contains(&q) {
            // Ties (k + 1/2) 2^q for random in-range k, within the block's binade.
            for _ in 0..3 {
                let k = rng.below(1 << (wl - 1).min(40)) as f64;
                let t = (k + 0.5) * exp2(q);
                if t.is_finite() && t <= exp2(e + 1) && t != 0.0 {
                    xs.push(if rng.below(2) == 0 { t } else { -t });
                }
            }
        }
    }
    for _ in 0..rng.below(3) {
        let special =
            [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY][rng.below(5) as usize];
        let at = rng.below(xs.len() as u64 + 1) as usize;
        xs.insert(at, special);
    }
    xs
}

#[test]
fn block_rounds_like_the_integer_reference_on_random_blocks() {
    // Normal-range blocks around 1, around 2^±100, and around the f32 subnormal range.
    let wls = [2u32, 3, 4, 5, 8, 12, 16, 24, 32];
    let (n, mm) = wls
        .into_par_iter()
        .map(|wl| {
            let mut rng = SplitMix(wl as u64);
            let mut mm = Mismatches::default();
            let mut n = 0;
            for (center, span) in [
                (0, 3),
                (0, 40),
                (100, 10),
                (-100, 10),
                (-140, 10),
                (-126, 2),
            ] {
                for _ in 0..3000 {
                    let xs = random_block(&mut rng, wl, center, span);
                    n += check_block(wl, &xs, &mut mm);
                }
            }
            (n, mm)
        })
        .reduce(
            || (0, Mismatches::default()),
            |(a, x), (b, y)| (a + b, x.merge(y)),
        );
    mm.assert_none_of("block vs integer reference", n);
}

#[test]
fn block_ties_follow_each_rounding_mode() {
    // block<4>, block max 1.5 = 0b1.1: E = 0, quantum 2^(0-2) = 0.25, counts -8..=7.
    let b = block(4);
    #[rustfmt::skip]
    let cases: &[(f64, f64, f64, f64)] = &[
        // 0.375 = 0b0.011 = 1.5 quanta: 0.25 (odd) or 0.5 (even).
        (0.375, 0.5, 0.5, 0.25),
        // 0.625 = 0b0.101 = 2.5 quanta: 0.5 (even) or 0.75.
        (0.625, 0.5, 0.75, 0.5),
        // -0.125 = -0b0.001 = -0.5 quanta: +0 or -0.25.
        (-0.125, 0.0, -0.25, 0.0),
        // 1.375 = 0b1.011 = 5.5 quanta: 1.25 (odd) or 1.5 (even).
        (1.375, 1.5, 1.5, 1.25),
        // 0.1 is not a tie: 0.4 quanta.
        (0.1, 0.0, 0.0, 0.0),
    ];
    for &(x, even, away, zero) in cases {
        let got = [
            b.round(x, 1.5, NearestEven, 0),
            b.round(x, 1.5, NearestAway, 0),
            b.round(x, 1.5, TowardZero, 0),
        ];
        for (g, w) in got.iter().zip([even, away, zero]) {
            assert!(
                same(*g, w),
                "block<4> max 1.5: {x} -> {got:?}, want {:?}",
                [even, away, zero]
            );
        }
        let e = block_exponent_ref(&[1.5]);
        for (mode, w) in [(Mode::Even, even), (Mode::Away, away), (Mode::Zero, zero)] {
            assert!(same(block_ref(x, e, 4, mode), w), "reference {x} {mode:?}");
        }
    }
}

#[test]
fn block_max_element_rounding_up_clamps_to_the_top_code() {
    // block<4>, max 1.875 = 0b1.111 = 7.5 quanta of 0.25: nearest gives 8 quanta = 2^(E+1),
    // which clamps to the top code 7 = 1.75; the negative twin -8 quanta = -2 is in range.
    let b = block(4);
    assert_eq!(b.round(1.875, 1.875, NearestEven, 0), 1.75);
    assert_eq!(b.round(1.875, 1.875, NearestAway, 0), 1.75);
    assert_eq!(b.round(1.875, 1.875, TowardZero, 0), 1.75);
    assert_eq!(b.round(-1.875, 1.875, NearestEven, 0), -2.0);
    assert_eq!(b.round(-1.875, 1.875, TowardZero, 0), -1.75);
    assert_eq!(b.round(1.9, 1.9, NearestEven, 0), 1.75);
    // Through Format::round, a value is a block of its own.
    let fmt: Format = "block<4>".parse().unwrap();
    assert_eq!(fmt.round(1.9, Rounding::NearestEven, 0), 1.75);
    assert_eq!(fmt.round(-1.9, Rounding::NearestEven, 0), -2.0);
    assert_eq!(
        fmt.round(12.0, Rounding::NearestEven, 0),
        12.0,
        "12 = 0b1100: 6 quanta of 2"
    );
    // block<2>: quanta of 2^E, counts -2..=1; max 1.5 = 0b1.1 rounds to 2 and clamps to 1.
    let b2 = block(2);
    assert_eq!(b2.round(1.5, 1.5, NearestEven, 0), 1.0);
    assert_eq!(b2.round(-1.5, 1.5, NearestEven, 0), -2.0);
    assert_eq!(b2.round(0.5, 1.5, NearestEven, 0), 0.0);
    assert_eq!(b2.round(0.5, 1.5, NearestAway, 0), 1.0);
    // block<8>, max 255.9 in binade 7: quantum 2^(7-6) = 2, top code 127 = 254.
    let b8 = block(8);
    assert_eq!(b8.round(255.9, 255.9, NearestEven, 0), 254.0);
    assert_eq!(b8.round(-255.9, 255.9, NearestEven, 0), -256.0);
    assert_eq!(
        b8.round(3.0, 255.9, NearestEven, 0),
        4.0,
        "3 = 0b11 is 1.5 quanta of 2"
    );
}

#[test]
fn block_zeros_and_all_zero_blocks_give_positive_zero() {
    for wl in [2, 4, 8, 32] {
        let b = block(wl);
        for xs in [
            vec![0.0, -0.0],
            vec![-0.0],
            vec![0.0, -0.0, f64::NAN, f64::INFINITY],
            vec![-0.0, 3.0, 0.0],
            vec![-1e-30, 1.0],
        ] {
            let max = block_max(xs.iter().copied());
            for &x in &xs {
                if x == 0.0 || (x.is_finite() && x.abs() < max * 2f64.powi(-(wl as i32) - 2)) {
                    let got = b.round(x, max, NearestEven, 0);
                    assert_eq!(got.to_bits(), 0, "block<{wl}> {xs:?}: {x:e} -> {got:e}");
                }
            }
        }
    }
    assert_eq!(block_max([0.0, -0.0]), 0.0);
    assert_eq!(block_max(std::iter::empty()), 0.0);
}

#[test]
fn block_nan_and_inf_elements_pass_through_and_do_not_set_the_exponent() {
    let xs = [f64::NAN, f64::INFINITY, 0.3, f64::NEG_INFINITY, -1.0];
    let max = block_max(xs);
    assert_eq!(max, 1.0);
    assert_eq!(block_max([f64::NAN, f64::INFINITY]), 0.0);
    let b = block(4);
    let out: Vec<f64> = xs
        .iter()
        .map(|&x| b.round(x, max, NearestEven, 0))
        .collect();
    assert!(out[0].is_nan());
    assert_eq!(out[1], f64::INFINITY);
    assert_eq!(out[2], 0.25, "0.3 = 1.2 quanta of 0.25");
    assert_eq!(out[3], f64::NEG_INFINITY);
    assert_eq!(out[4], -1.0);
    // A block of only non-finite values and zeros: specials unchanged, zeros +0.
    for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0] {
        let got = b.round(x, 0.0, NearestEven, 0);
        assert!(same(got, if x == 0.0 { 0.0 } else { x }), "{x} -> {got}");
    }
}

/// NaN elements come out of the quantize op quiet, with sign and payload, whichever path
/// rounds them: f32 runs (the vectorised pass leaves them to the general path), f64, whole
/// tensor and per-slice blocks, and an all-special block (no finite maximum).
#[test]
fn block_nan_elements_come_out_quiet_with_sign_and_payload() -> candle_core::Result<()> {
    use candle_core::{Device, Tensor};
    use qcandle::{quantize, Quant};
    let nans32 = [0x7f80_0001u32, 0xff81_2345, 0x7fc0_0007, 0xffff_ffff];
    let quiet32 = |b: u32| b | 0x0040_0000;
    for format in ["block<8>", "block<8,dim=0>", "block<4,dim=1>"] {
        for rounding in ["nearest-even", "stochastic"] {
            let q = Quant::parse(format, rounding).expect("a valid format");
            for finite in [true, false] {
                // 2 x 40: NaNs among finite values (or among infinities only).
                let mut v: Vec<u32> = (0..80)
                    .map(|i| {
                        if finite {
                            (0.37f32 * (i as f32 - 40.0)).to_bits()
                        } else {
                            f32::INFINITY.to_bits() | ((i as u32 & 1) << 31)
                        }
                    })
                    .collect();
                for (k, &n) in nans32.iter().enumerate() {
                    v[7 + 19 * k] = n;
                }
                let x: Vec<f32> = v.iter().map(|&b| f32::from_bits(b)).collect();
                let t = Tensor::from_vec(x.clone(), (2, 40), &Device::Cpu)?;
                let got: Vec<u32> = quantize(&t, &q)?
                    .flatten_all()?
                    .to_vec1::<f32>()?
                    .iter()
                    .map(|y| y.to_bits())
                    .collect();
                for (k, &n) in nans32.iter().enumerate() {
                    let i = 7 + 19 * k;
                    assert_eq!(got[i], quiet32(n), "{format} {rounding} f32 {n:#x}");
                }
                if !finite {
                    let nan_at: Vec<usize> = (0..nans32.len()).map(|k| 7 + 19 * k).collect();
                    for i in (0..80).filter(|i| !nan_at.contains(i)) {
                        assert_eq!(got[i], v[i], "{format}: infinities pass unchanged");
                    }
                }
                // The same in f64: the quiet bit is bit 51, the payload is kept.
                let x64: Vec<f64> = v
                    .iter()
                    .map(|&b| {
                        if f32::from_bits(b).is_nan() {
                            f64::from_bits(
                                ((b as u64 >> 31) << 63)
                                    | 0x7ff0_0000_0000_0000
                                    | (b & 0x3f_ffff) as u64,
                            )
                        } else {
                            f32::from_bits(b) as f64
                        }
                    })
                    .collect();
                let t = Tensor::from_vec(x64.clone(), (2, 40), &Device::Cpu)?;
                let got = quantize(&t, &q)?.flatten_all()?.to_vec1::<f64>()?;
                for k in 0..nans32.len() {
                    let i = 7 + 19 * k;
                    let want = x64[i].to_bits() | (1 << 51);
                    assert_eq!(got[i].to_bits(), want, "{format} {rounding} f64 {i}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn block_with_f32_subnormal_maximum_rounds_on_its_grid() {
    // max = 3 x 2^-140 (an f32 subnormal): E = -139, block<8> quantum 2^-145.
    let b = block(8);
    let max = 3.0 * 2f64.powi(-140);
    assert_eq!(b.round(max, max, NearestEven, 0), max);
    let x = 2f64.powi(-146); // half a quantum: ties to 0
    assert_eq!(b.round(x, max, NearestEven, 0), 0.0);
    assert_eq!(b.round(x, max, NearestAway, 0), 2f64.powi(-145));
    let x = 3.0 * 2f64.powi(-146); // 1.5 quanta: ties to 2
    assert_eq!(b.round(x, max, NearestEven, 0), 2f64.powi(-144));
    // And every f32 subnormal as a block maximum, against the reference.
    let mut mm = Mismatches::default();
    let mut n = 0;
    for bits in (1u32..1 << 23).step_by(997) {
        let m = f32::from_bits(bits) as f64;
        for wl in [2, 4, 8, 16] {
            n += check_block(wl, &[m, m / 3.0, -m * 0.7, m / 5.0], &mut mm);
        }
    }
    mm.assert_none_of("blocks with f32 subnormal maxima", n);
}

#[test]
fn block_with_tiny_f64_maximum_keeps_its_grid() {
    // The element grid 2^(E - (wl-2)) can lie below 2^-1022 (f64 subnormal powers) or even
    // below 2^-1074; elements are f64 values, so they are then already on the grid and
    // come back unchanged. Maxima: f64 subnormals, and small normals where wl is large.
    let tiny = f64::from_bits(1); // 2^-1074
    let cases: &[(u32, Vec<f64>)] = &[
        (8, vec![3.0 * tiny, tiny, -2.0 * tiny]),
        (
            8,
            vec![
                f64::from_bits(0x000f_ffff_ffff_ffff),
                tiny,
                -f64::from_bits(12345),
            ],
        ),
        (4, vec![2f64.powi(-1030), 2f64.powi(-1032) * 3.0]),
        (
            32,
            vec![
                2f64.powi(-1000),
                2f64.powi(-1020) * 3.0,
                -(2f64.powi(-1010)),
            ],
        ),
        (32, vec![1.5 * 2f64.powi(-1022), 2f64.powi(-1050)]),
    ];
    let mut mm = Mismatches::default();
    let mut n = 0;
    for (wl, xs) in cases {
        n += check_block(*wl, xs, &mut mm);
    }
    // Pinned: with E = -1073 and block<8> the grid is 2^-1079; 3 x 2^-1074 stays.
    let got = block(8).round(3.0 * tiny, 3.0 * tiny, NearestEven, 0);
    if got != 3.0 * tiny {
        mm.record(|| format!("block<8> max 3x2^-1074: 3x2^-1074 -> {got:e}"));
    }
    // And block<32> with max 2^-1000 (grid 2^-1030): the max itself stays.
    let m = 2f64.powi(-1000);
    let got = block(32).round(m, m, NearestEven, 0);
    if got != m {
        mm.record(|| format!("block<32> max 2^-1000: 2^-1000 -> {got:e}"));
    }
    mm.assert_none_of("blocks with tiny f64 maxima", n + 2);
}

#[test]
fn block_scope_does_not_change_scalar_rounding() {
    // Block::round is per element given the block maximum; the scope only matters for
    // tensors. Both scopes give the same scalar results.
    let a = Block::new(8, BlockScope::Tensor).unwrap();
    let b = Block::new(8, BlockScope::Dim(1)).unwrap();
    let mut rng = SplitMix(5);
    for _ in 0..10000 {
        let max = rng.float_between(-30, 30).abs();
        let x = rng.float_between(-40, 0) * max;
        assert!(same(
            a.round(x, max, NearestEven, 0),
            b.round(x, max, NearestEven, 0)
        ));
        assert!(same(
            a.round(x, max, NearestEven, 0),
            block_ref(x, block_exponent_ref(&[max]), 8, Mode::Even)
        ));
    }
}
