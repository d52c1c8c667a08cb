//! Scalar rounding: `Format::round` in every mode, and the Philox stream that feeds
//! stochastic rounding.
//!
//! Testing policy: expected values never come from the code under test. They are
//! hand-derived tables (each with its bit patterns in a comment), Random123's published
//! known answers, the decoders of tests/common/reference.rs written from the format
//! definitions (and checked here against SoftPosit), exact integer arithmetic for stochastic thresholds, and statistical bounds
//! at 4 sigma over fixed-seed random words, so every run is deterministic. The literal
//! stochastic results pin the random stream: changing them breaks reproducibility of
//! every recorded run, so only change them on purpose. Every test can fail.

mod common;

use std::sync::OnceLock;

use qcandle::format::{Overflow, Specials};
use qcandle::philox::{philox4x32_10, Stream};
use qcandle::{Format, Rounding};
use rayon::prelude::*;

use common::reference::{float_value, posit_value, two_pow};

// ---------------------------------------------------------------------------------------
// Independent reference: the decoders of tests/common, and neighbours written from the
// format definitions.
// ---------------------------------------------------------------------------------------

fn fmt(s: &str) -> Format {
    s.parse()
        .unwrap_or_else(|e| panic!("format {s:?} must parse: {e}"))
}

const NE: Rounding = Rounding::NearestEven;
const NA: Rounding = Rounding::NearestAway;
const TZ: Rounding = Rounding::TowardZero;
const SR: Rounding = Rounding::Stochastic { bits: 23 };

/// The nonnegative values of a posit or float format, as an increasing function of the
/// pattern `0..=max_pattern`.
#[derive(Clone, Copy)]
enum Grid {
    Posit {
        n: u32,
        es: u32,
    },
    Float {
        exp: u32,
        man: u32,
        specials: Specials,
    },
}

impl Grid {
    fn of(f: &Format) -> Option<Grid> {
        match f {
            Format::Posit(p) => Some(Grid::Posit {
                n: p.n(),
                es: p.es(),
            }),
            Format::Float(fl) => {
                assert!(fl.subnormals(), "the reference grid assumes subnormals");
                Some(Grid::Float {
                    exp: fl.exp(),
                    man: fl.man(),
                    specials: fl.specials(),
                })
            }
            _ => None,
        }
    }

    fn value(&self, p: u64) -> f64 {
        match *self {
            Grid::Posit { n, es } => posit_value(p, n, es),
            Grid::Float { exp, man, specials } => float_value(exp, man, specials, p),
        }
    }

    fn max_pattern(&self) -> u64 {
        match *self {
            Grid::Posit { n, .. } => (1u64 << (n - 1)) - 1,
            Grid::Float { exp, man, specials } => {
                let all = (1u64 << (exp + man)) - 1;
                match specials {
                    Specials::Ieee => (((1u64 << exp) - 1) << man) - 1,
                    Specials::FiniteNan => all - 1,
                    Specials::Finite => all,
                }
            }
        }
    }

    /// Largest pattern whose value is `<= a` (a >= 0, a <= max).
    fn floor_pattern(&self, a: f64) -> u64 {
        let (mut lo, mut hi) = (0u64, self.max_pattern());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.value(mid) <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// The representable neighbours `lo <= a < hi` of a magnitude `a > 0` strictly inside the
/// format's positive range, from the reference grids.
fn neighbours(f: &Format, a: f64) -> (f64, f64) {
    assert!(a > 0.0);
    match f {
        Format::Fixed(x) => {
            let q = two_pow(-x.fl());
            let lo = (a / q).floor() * q;
            (lo, lo + q)
        }
        Format::Block(b) => {
            // A single value is its own block: binade E, quantum 2^(E - (wl - 2)).
            let e = a.log2().floor() as i32;
            let q = two_pow(e - (b.wl() as i32 - 2));
            let lo = (a / q).floor() * q;
            (lo, lo + q)
        }
        _ => {
            let g = Grid::of(f).unwrap();
            let p = g.floor_pattern(a);
            assert!(p < g.max_pattern(), "{a} is not below the max of {f}");
            (g.value(p), g.value(p + 1))
        }
    }
}

/// A nonnegative f64 as `m * 2^e` with integer m.
fn split(x: f64) -> (u128, i32) {
    assert!(x >= 0.0 && x.is_finite());
    let bits = x.to_bits();
    let biased = (bits >> 52) as i32;
    let frac = (bits & ((1u64 << 52) - 1)) as u128;
    if biased == 0 {
        (frac, -1074)
    } else {
        (frac | (1u128 << 52), biased - 1075)
    }
}

/// `floor((a - lo) / (hi - lo) * 2^k)`, exactly (0 <= lo <= a < hi).
fn threshold(a: f64, lo: f64, hi: f64, k: u32) -> u128 {
    if lo == 0.0 && a < hi * two_pow(-(k as i32) - 2) {
        return 0; // far below one 2^-k step (keeps the integers small)
    }
    let parts = [split(a), split(lo), split(hi)];
    let e0 = parts
        .iter()
        .filter(|(m, _)| *m != 0)
        .map(|&(_, e)| e)
        .min()
        .unwrap();
    let int = |(m, e): (u128, i32)| -> u128 {
        if m == 0 {
            return 0;
        }
        let sh = (e - e0) as u32;
        assert!(
            sh + 53 + k < 127,
            "values too far apart for exact arithmetic"
        );
        m << sh
    };
    let (a, lo, hi) = (int(parts[0]), int(parts[1]), int(parts[2]));
    ((a - lo) << k) / (hi - lo)
}

/// The exact distance `(a - lo) / (hi - lo)` as an f64 (for statistics).
fn distance(a: f64, lo: f64, hi: f64) -> f64 {
    threshold(a, lo, hi, 60) as f64 / two_pow(60)
}

/// Equality that treats NaN as equal to NaN and tells -0.0 from +0.0.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn reference_posit_decoder_agrees_with_softposit() {
    for b in 0..=u8::MAX {
        let want = softposit::P8E0::from_bits(b).to_f64();
        let got = posit_value(b as u64, 8, 0);
        assert!(
            same(want, got),
            "posit<8,0> {b:#04x}: {got} vs softposit {want}"
        );
    }
    for b in 0..=u16::MAX {
        let want = softposit::P16E1::from_bits(b).to_f64();
        let got = posit_value(b as u64, 16, 1);
        assert!(
            same(want, got),
            "posit<16,1> {b:#06x}: {got} vs softposit {want}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1. Philox4x32-10 known answers.
// ---------------------------------------------------------------------------------------

#[test]
fn philox4x32_10_matches_random123_known_answers() {
    // Random123 kat_vectors, "philox4x32 10" lines: counter, key, expected output.
    assert_eq!(
        philox4x32_10([0, 0, 0, 0], [0, 0]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

#[test]
fn stream_element_i_reads_word_i_mod_4_of_block_i_div_4() {
    // Counter [i/4 lo, i/4 hi, call lo, call hi], key [seed lo, seed hi]; 64-bit seed,
    // call and block index so that the high words are exercised.
    let seed = 0x0123_4567_89ab_cdefu64;
    for call in [0u64, 1, 0x1_0000_0002] {
        let s = Stream::new(seed, call);
        for i in [0u64, 1, 2, 3, 4, 7, 4 * 0x1_0000_0001 + 2] {
            let b = i / 4;
            let words = philox4x32_10(
                [b as u32, (b >> 32) as u32, call as u32, (call >> 32) as u32],
                [seed as u32, (seed >> 32) as u32],
            );
            assert_eq!(s.at(i), words[(i % 4) as usize], "call {call} index {i}");
            assert_eq!(s.block(b), words, "call {call} block {b}");
        }
    }
    assert_ne!(Stream::new(1, 0).at(0), Stream::new(2, 0).at(0));
    assert_ne!(Stream::new(1, 0).at(0), Stream::new(1, 1).at(0));
}

// ---------------------------------------------------------------------------------------
// 2. Hand-built ties and near-ties.
// ---------------------------------------------------------------------------------------

/// One hand-derived case: the results of nearest-even, nearest-away and toward-zero, and
/// whether `-x` must give exactly the negated results (false where a range is asymmetric).
struct Case {
    format: &'static str,
    x: f64,
    ne: f64,
    na: f64,
    tz: f64,
    mirror: bool,
}

const fn case(format: &'static str, x: f64, ne: f64, na: f64, tz: f64) -> Case {
    Case {
        format,
        x,
        ne,
        na,
        tz,
        mirror: true,
    }
}

const P27: f64 = 134217728.0; // 2^27
const TINY: f64 = 1.0 / (1u64 << 40) as f64; // 2^-40, a near-tie offset

#[rustfmt::skip]
const CASES: &[Case] = &[
    // ---- posit<8,0>: [1,2) is 0_10_fffff, gap 2^-5.
    // 1 = 0_10_00000 (even), 1+2^-5 = 0_10_00001 (odd); tie 1+2^-6.
    case("posit<8,0>", 1.0 + 1.0 / 64.0, 1.0, 1.0 + 1.0 / 32.0, 1.0),
    // near-ties either side of it.
    case("posit<8,0>", 1.0 + 1.0 / 64.0 - TINY, 1.0, 1.0, 1.0),
    case("posit<8,0>", 1.0 + 1.0 / 64.0 + TINY, 1.0 + 1.0 / 32.0, 1.0 + 1.0 / 32.0, 1.0),
    // 1+2^-5 = 0_10_00001 (odd), 1+2^-4 = 0_10_00010 (even); tie 1+3*2^-6.
    case("posit<8,0>", 1.0 + 3.0 / 64.0, 1.0625, 1.0625, 1.03125),
    // [4,8) is 0_1110_fff, gap 1/2: 4 = 0_1110_000, 4.5 = 0_1110_001; tie 4.25.
    case("posit<8,0>", 4.25, 4.0, 4.5, 4.0),
    // 4.5 = 0_1110_001 (odd), 5 = 0_1110_010; tie 4.75.
    case("posit<8,0>", 4.75, 5.0, 5.0, 4.5),
    // 32 = 0_111111_0 (even), maxpos 64 = 0_1111111 (odd); the 9-bit pattern between them,
    // 0_111111_01, is 48: the tie.
    case("posit<8,0>", 48.0, 32.0, 64.0, 32.0),
    case("posit<8,0>", 48.0 + TINY * 64.0, 64.0, 64.0, 32.0),
    // minpos 2^-6 = 0_0000001 (odd), 2^-5 = 0_000001_0 (even); tie 1.5 * 2^-6.
    case("posit<8,0>", 1.5 / 64.0, 1.0 / 32.0, 1.0 / 32.0, 1.0 / 64.0),
    // Below minpos and above maxpos every mode saturates (never 0, never NaR).
    case("posit<8,0>", 1.0 / 128.0, 1.0 / 64.0, 1.0 / 64.0, 1.0 / 64.0),
    case("posit<8,0>", 1e-30, 1.0 / 64.0, 1.0 / 64.0, 1.0 / 64.0),
    case("posit<8,0>", 100.0, 64.0, 64.0, 64.0),
    // ---- posit<16,1>: [1,2) is 0_10_0_ffffffffffff, gap 2^-12.
    // 1 = 0_10_0_000000000000 (even), 1+2^-12 = ..._000000000001; tie 1+2^-13.
    case("posit<16,1>", 1.0 + 1.0 / 8192.0, 1.0, 1.0 + 1.0 / 4096.0, 1.0),
    case("posit<16,1>", 1.0 + 1.0 / 8192.0 + TINY, 1.0 + 1.0 / 4096.0, 1.0 + 1.0 / 4096.0, 1.0),
    // No fraction bits left: 2^24 = 0_1111111111111_0_0 (0x7ffc, even pattern although
    // 2^24 is an odd multiple of its gap 2^24), 2^25 = 0_1111111111111_0_1 (0x7ffd); tie 1.5*2^24.
    case("posit<16,1>", 1.5 * 16777216.0, 16777216.0, 33554432.0, 16777216.0),
    // 2^25 = 0x7ffd (odd), 2^26 = 0_11111111111111_0 (0x7ffe, even); tie 1.5*2^25.
    case("posit<16,1>", 1.5 * 33554432.0, 67108864.0, 67108864.0, 33554432.0),
    // Exponent bit cut off: 2^26 = 0x7ffe (even), maxpos 2^28 = 0x7fff; the 17-bit pattern
    // between them, 0_11111111111111_0_1, is 2^27: a geometric, not arithmetic, tie.
    case("posit<16,1>", P27, 67108864.0, 268435456.0, 67108864.0),
    case("posit<16,1>", P27 - TINY * P27, 67108864.0, 67108864.0, 67108864.0),
    case("posit<16,1>", P27 + TINY * P27, 268435456.0, 268435456.0, 67108864.0),
    // 1.125*2^27 is nearer 2^26 in value but above the pattern boundary 2^27: goes up.
    case("posit<16,1>", 1.125 * P27, 268435456.0, 268435456.0, 67108864.0),
    // 1.25*2^27 is the arithmetic midpoint of 2^26 and 2^28; by pattern it is not a tie.
    case("posit<16,1>", 1.25 * P27, 268435456.0, 268435456.0, 67108864.0),
    // minpos 2^-28 = 0x0001 (odd), 2^-26 = 0_0000000000000_1_0 (0x0002, even); the
    // 17-bit pattern 0_00000000000000_1_1 between them is 2^-27: the tie.
    case("posit<16,1>", 1.0 / P27, 1.0 / 67108864.0, 1.0 / 67108864.0, 1.0 / 268435456.0),
    // 1.125*2^-27 is nearer minpos in value but above the pattern boundary.
    case("posit<16,1>", 1.125 / P27, 1.0 / 67108864.0, 1.0 / 67108864.0, 1.0 / 268435456.0),
    case("posit<16,1>", (1.0 - TINY) / P27, 1.0 / 268435456.0, 1.0 / 268435456.0, 1.0 / 268435456.0),
    // ---- fp16: [1,2) is 0_01111_mmmmmmmmmm, gap 2^-10.
    // 1 = 0_01111_0000000000 (even), 1+2^-10 = 0_01111_0000000001; tie 1+2^-11.
    case("fp16", 1.0 + 1.0 / 2048.0, 1.0, 1.0 + 1.0 / 1024.0, 1.0),
    case("fp16", 1.0 + 1.0 / 2048.0 - TINY, 1.0, 1.0, 1.0),
    // 1+2^-10 = ..._0000000001 (odd), 1+2^-9 = ..._0000000010; tie 1+3*2^-11.
    case("fp16", 1.0 + 3.0 / 2048.0, 1.0 + 1.0 / 512.0, 1.0 + 1.0 / 512.0, 1.0 + 1.0 / 1024.0),
    // max 65504 = 0_11110_1111111111 (odd); the next step 65536 is 0_11111_0000000000 = Inf:
    // tie 65520 goes to Inf (even), toward-zero stays finite.
    case("fp16", 65520.0, f64::INFINITY, f64::INFINITY, 65504.0),
    case("fp16", 65520.0 - 1.0 / 64.0, 65504.0, 65504.0, 65504.0),
    // 0 = 0_00000_0000000000 (even), min subnormal 2^-24 = 0_00000_0000000001; tie 2^-25.
    case("fp16", 1.0 / 33554432.0, 0.0, 1.0 / 16777216.0, 0.0),
    // 2^-24 = ..._0000000001 (odd), 2^-23 = ..._0000000010; tie 3*2^-25.
    case("fp16", 3.0 / 33554432.0, 2.0 / 16777216.0, 2.0 / 16777216.0, 1.0 / 16777216.0),
    // largest subnormal 1023*2^-24 = 0_00000_1111111111 (odd), min normal 2^-14 =
    // 0_00001_0000000000; tie 1023.5*2^-24.
    case("fp16", 1023.5 / 16777216.0, 1.0 / 16384.0, 1.0 / 16384.0, 1023.0 / 16777216.0),
    // ---- e4m3 (bias 7): [1,2) is 0_0111_mmm, gap 1/8.
    // 1 = 0_0111_000, 1.125 = 0_0111_001; tie 1.0625.
    case("e4m3", 1.0625, 1.0, 1.125, 1.0),
    case("e4m3", 1.0625 + TINY, 1.125, 1.125, 1.0),
    // 1.125 = 0_0111_001 (odd), 1.25 = 0_0111_010; tie 1.1875.
    case("e4m3", 1.1875, 1.25, 1.25, 1.125),
    // max 448 = 0_1111_110 (even); 480 would be 0_1111_111 = NaN: the tie 464 goes to 448,
    // away-from-zero overflows to NaN (no Inf), toward-zero stays finite.
    case("e4m3", 464.0, 448.0, f64::NAN, 448.0),
    case("e4m3", 464.0 + TINY * 512.0, f64::NAN, f64::NAN, 448.0),
    // 0 = 0_0000_000, min subnormal 2^-9 = 0_0000_001; tie 2^-10.
    case("e4m3", 1.0 / 1024.0, 0.0, 1.0 / 512.0, 0.0),
    // 2^-9 = 0_0000_001 (odd), 2^-8 = 0_0000_010; tie 3*2^-10.
    case("e4m3", 3.0 / 1024.0, 1.0 / 256.0, 1.0 / 256.0, 1.0 / 512.0),
    // ---- e5m2 (bias 15): [1,2) is 0_01111_mm, gap 1/4.
    // 1 = 0_01111_00, 1.25 = 0_01111_01; tie 1.125.
    case("e5m2", 1.125, 1.0, 1.25, 1.0),
    // 1.25 = ..._01 (odd), 1.5 = ..._10; tie 1.375.
    case("e5m2", 1.375, 1.5, 1.5, 1.25),
    case("e5m2", 1.375 - TINY, 1.25, 1.25, 1.25),
    // max 57344 = 0_11110_11 (odd), next 65536 = 0_11111_00 = Inf; tie 61440.
    case("e5m2", 61440.0, f64::INFINITY, f64::INFINITY, 57344.0),
    case("e5m2", 61440.0 - TINY * 65536.0, 57344.0, 57344.0, 57344.0),
    // 0 = 0_00000_00, min subnormal 2^-16 = 0_00000_01; tie 2^-17.
    case("e5m2", 1.0 / 131072.0, 0.0, 1.0 / 65536.0, 0.0),
    // ---- fixed<8,4>: k/16 for k in -128..=127.
    // 1 = 0001.0000 (k=16, even), 1.0625 = 0001.0001; tie 1+1/32.
    case("fixed<8,4>", 1.0 + 1.0 / 32.0, 1.0, 1.0625, 1.0),
    case("fixed<8,4>", 1.0 + 1.0 / 32.0 + TINY, 1.0625, 1.0625, 1.0),
    // 1/16 = 0000.0001 (odd), 1/8 = 0000.0010; tie 3/32.
    case("fixed<8,4>", 3.0 / 32.0, 0.125, 0.125, 0.0625),
    // 0 = 0000.0000 (even), 1/16 = 0000.0001; tie 1/32 (zero is unsigned: -1/32 gives +0).
    case("fixed<8,4>", 1.0 / 32.0, 0.0, 0.0625, 0.0),
    // max 7.9375 = 0111.1111 (odd): the tie 7.96875 rounds to 8, which clamps back.
    Case { format: "fixed<8,4>", x: 7.96875, ne: 7.9375, na: 7.9375, tz: 7.9375, mirror: false },
    // -8 = 1000.0000 exists: -7.96875 (tie of -7.9375 = 1000.0001 and -8) goes to the even
    // count 128; the range is asymmetric, so no mirror.
    Case { format: "fixed<8,4>", x: -7.96875, ne: -8.0, na: -8.0, tz: -7.9375, mirror: false },
    Case { format: "fixed<8,4>", x: -8.03125, ne: -8.0, na: -8.0, tz: -8.0, mirror: false },
];

fn check_cases(mode: Rounding, pick: fn(&Case) -> f64) {
    let mut failures = Vec::new();
    for c in CASES {
        let f = fmt(c.format);
        let got = f.round(c.x, mode, 0);
        let want = pick(c);
        // Fixed-point zero is unsigned: -1/32 may give +0 where the table says 0.
        let unsigned_zero = got == 0.0 && want == 0.0 && c.format.starts_with("fixed");
        if !same(got, want) && !unsigned_zero {
            failures.push(format!(
                "{} {mode} of {:e}: got {got:e}, want {want:e}",
                c.format, c.x
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn nearest_even_ties_go_to_the_even_pattern() {
    check_cases(NE, |c| c.ne);
}

#[test]
fn nearest_away_ties_go_away_from_zero() {
    check_cases(NA, |c| c.na);
}

#[test]
fn toward_zero_truncates_the_magnitude() {
    check_cases(TZ, |c| c.tz);
}

#[test]
fn every_mode_is_symmetric_for_negatives() {
    let mut failures = Vec::new();
    for c in CASES.iter().filter(|c| c.mirror) {
        let f = fmt(c.format);
        for (mode, want) in [(NE, c.ne), (NA, c.na), (TZ, c.tz)] {
            let got = f.round(-c.x, mode, 0);
            let want = if matches!(f, Format::Posit(_) | Format::Fixed(_)) && want == 0.0 {
                0.0 // posit and fixed-point zero is unsigned
            } else {
                -want
            };
            if !same(got, want) {
                failures.push(format!(
                    "{} {mode} of {:e}: got {got:e}, want {want:e}",
                    c.format, -c.x
                ));
            }
        }
        // Stochastic: the same random word gives the mirrored result.
        for r in [0u32, 0x4000_0000, 0x8000_0000, 0xdead_beef, u32::MAX] {
            let (p, n) = (f.round(c.x, SR, r), f.round(-c.x, SR, r));
            if !(same(n, -p) || (n == 0.0 && p == 0.0)) {
                failures.push(format!(
                    "{} stochastic r={r:#x}: f({}) = {p}, f(-x) = {n}",
                    c.format, c.x
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Exhaustive comparison with the reference between every pair of neighbours.
// ---------------------------------------------------------------------------------------

/// Whether the reference rounds a magnitude `a` in `(lo, hi)` up to hi. `boundary` is where
/// nearest rounding switches from lo to hi, `lo_even` says which neighbour a tie picks, and
/// `thr` is the exact `floor(distance * 2^bits)` for stochastic modes.
fn reference_up(a: f64, boundary: f64, lo_even: bool, mode: Rounding, thr: u128, r: u32) -> bool {
    match mode {
        Rounding::NearestEven => a > boundary || (a == boundary && !lo_even),
        Rounding::NearestAway => a >= boundary,
        Rounding::TowardZero => false,
        Rounding::Stochastic { bits } => ((r >> (32 - bits)) as u128) < thr,
    }
}

const MODES: [Rounding; 6] = [
    NE,
    NA,
    TZ,
    Rounding::Stochastic { bits: 23 },
    Rounding::Stochastic { bits: 8 },
    Rounding::Stochastic { bits: 1 },
];
const WORDS: [u32; 6] = [
    0,
    1 << 31,
    (1 << 31) - 1,
    0x2545_f491,
    0xc2b2_ae35,
    u32::MAX,
];

/// Probe points in `[lo, hi)`.
fn probes(lo: f64, hi: f64, boundary: f64) -> Vec<f64> {
    let mid = lo + (hi - lo) / 2.0;
    let mut v = vec![
        lo,
        lo.next_up(),
        boundary,
        boundary.next_up(),
        boundary.next_down(),
        mid,
        mid.next_up(),
        mid.next_down(),
        lo + (hi - lo) * 0.25,
        lo + (hi - lo) * 0.9,
        hi.next_down(),
    ];
    v.retain(|&x| x >= lo && x < hi);
    v
}

/// Compares `f.round` with the reference at the probes of `[lo, hi)` and their negations,
/// in every mode; `over` replaces `hi` where hi lies beyond the format's max.
fn compare_pair(
    f: &Format,
    lo: f64,
    hi: f64,
    boundary: f64,
    lo_even: bool,
    over: Option<f64>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for a in probes(lo, hi, boundary) {
        for mode in MODES {
            let (words, thr): (&[u32], u128) = match mode {
                Rounding::Stochastic { bits } if a != lo => (&WORDS, threshold(a, lo, hi, bits)),
                _ => (&[0], 0),
            };
            for &r in words {
                let up = a != lo && reference_up(a, boundary, lo_even, mode, thr, r);
                let want = match (up, over) {
                    (false, _) => lo,
                    (true, None) => hi,
                    (true, Some(o)) => o,
                };
                for (x, w) in [(a, want), (-a, -want)] {
                    let got = f.round(x, mode, r);
                    let w = if w == 0.0 && matches!(f, Format::Fixed(_)) {
                        0.0
                    } else {
                        w
                    };
                    if !same(got, w) && failures.len() < 20 {
                        failures.push(format!("{f} {mode} r={r:#x} of {x:e} (in [{lo:e}, {hi:e})): got {got:e}, want {w:e}"));
                    }
                }
            }
        }
    }
    failures
}

#[test]
fn posit_rounding_matches_the_pattern_reference_between_all_neighbours() {
    let mut failures = Vec::new();
    for (n, es) in [(8, 0), (8, 1), (8, 2), (10, 3), (16, 1), (16, 2)] {
        let f = Format::posit(n, es).unwrap();
        let max_pattern = (1u64 << (n - 1)) - 1;
        let values: Vec<f64> = (0..=max_pattern).map(|p| posit_value(p, n, es)).collect();
        for p in 1..max_pattern {
            let (lo, hi) = (values[p as usize], values[p as usize + 1]);
            // The (n+1)-bit pattern between p and p+1 is where rounding the pattern switches.
            let boundary = posit_value(2 * p + 1, n + 1, es);
            failures.extend(compare_pair(&f, lo, hi, boundary, p % 2 == 0, None));
        }
        // Outside [minpos, maxpos] every mode saturates, never to 0 or NaR.
        let (minpos, maxpos) = (values[1], values[max_pattern as usize]);
        for mode in MODES {
            for a in [minpos / 2.0, minpos.next_down(), minpos * 1e-9, 5e-324] {
                let got = f.round(a, mode, 0x1234_5678);
                if got != minpos {
                    failures.push(format!(
                        "{f} {mode} of {a:e}: got {got:e}, want minpos {minpos:e}"
                    ));
                }
            }
            for a in [maxpos, maxpos.next_up(), maxpos * 1.5, 1e300, f64::MAX] {
                let got = f.round(-a, mode, 0x1234_5678);
                if got != -maxpos {
                    failures.push(format!("{f} {mode} of {:e}: got {got:e}, want -maxpos", -a));
                }
            }
        }
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(f.round(x, NE, 0).is_nan(), "{f}: {x} must give NaR");
        }
        assert_eq!(f.round(-0.0, NE, 0).to_bits(), 0, "{f}: posit zero is +0");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn float_rounding_matches_the_ieee_reference_between_all_neighbours() {
    let mut failures = Vec::new();
    for name in [
        "fp16",
        "bf16",
        "e5m2",
        "e4m3",
        "e3m2",
        "e2m3",
        "e2m1",
        "float<3,1,fn>",
        "float<4,2,sat>",
    ] {
        let f = fmt(name);
        let Format::Float(fl) = f else { unreachable!() };
        let (exp, man, specials) = (fl.exp(), fl.man(), fl.specials());
        let max_pattern = Grid::of(&f).unwrap().max_pattern();
        let values: Vec<f64> = (0..=max_pattern + 1)
            .map(|p| float_value(exp, man, specials, p))
            .collect();
        let max = values[max_pattern as usize];
        // Above max the unbounded grid continues with max's gap; results there overflow.
        let overflow = if fl.overflow() == Overflow::Saturate {
            max
        } else if specials == Specials::Ieee {
            f64::INFINITY
        } else {
            f64::NAN
        };
        // The gap in max's binade (the value below max may lie in the binade below).
        let top_gap = two_pow(max.log2().floor() as i32 - man as i32);
        for p in 0..=max_pattern {
            let lo = values[p as usize];
            let (hi, over) = if p < max_pattern {
                (values[p as usize + 1], None)
            } else {
                (max + top_gap, Some(overflow))
            };
            failures.extend(compare_pair(
                &f,
                lo,
                hi,
                lo + (hi - lo) / 2.0,
                p % 2 == 0,
                over,
            ));
        }
        for mode in MODES {
            let want = if mode == TZ { max } else { overflow };
            for a in [max + 2.0 * top_gap, 1e300] {
                let got = f.round(a, mode, 0);
                if !same(got, want) {
                    failures.push(format!(
                        "{name} {mode} of {a:e}: got {got:e}, want {want:e}"
                    ));
                }
            }
        }
        let inf = if specials == Specials::Ieee {
            f64::INFINITY
        } else if fl.overflow() == Overflow::Saturate {
            max
        } else {
            f64::NAN
        };
        assert!(same(f.round(f64::INFINITY, NE, 0), inf), "{name}: +Inf");
        assert!(
            same(f.round(f64::NEG_INFINITY, TZ, 0), -inf),
            "{name}: -Inf"
        );
        assert!(
            same(f.round(-0.0, NE, 0), -0.0),
            "{name}: -0 keeps its sign"
        );
        assert!(f.round(f64::NAN, NE, 0).is_nan(), "{name}: NaN");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn fixed_rounding_matches_the_reference_and_clamps() {
    let mut failures = Vec::new();
    for (wl, fl) in [(8, 4), (6, -2), (12, 10)] {
        let f = Format::fixed(wl, fl).unwrap();
        let q = two_pow(-fl);
        let top = (1i64 << (wl - 1)) as f64;
        for k in 0..(1i64 << (wl - 1)) - 1 {
            let lo = k as f64 * q;
            failures.extend(compare_pair(&f, lo, lo + q, lo + q / 2.0, k % 2 == 0, None));
        }
        let (max, min) = ((top - 1.0) * q, -top * q);
        for mode in MODES {
            for (x, want) in [
                (max + q / 4.0, max),
                (1e30, max),
                (f64::INFINITY, max),
                (min - q / 4.0, min),
                (-1e30, min),
                (f64::NEG_INFINITY, min),
            ] {
                let got = f.round(x, mode, 0x8000_0000);
                if got != want {
                    failures.push(format!("{f} {mode} of {x:e}: got {got:e}, want {want:e}"));
                }
            }
        }
        assert!(f.round(f64::NAN, NE, 0).is_nan());
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// 3. Stochastic rounding: unbiased in value, P(up) = truncated distance.
// ---------------------------------------------------------------------------------------

const SAMPLES: usize = 10_000_000;

/// 10^7 independent random words: Philox under a fixed seed, call 0, elements 0..N.
fn random_words() -> &'static [u32] {
    static WORDS: OnceLock<Vec<u32>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let s = Stream::new(0x5eed_cafe_f00d_0001, 0);
        (0..SAMPLES as u64 / 4)
            .into_par_iter()
            .flat_map_iter(|b| s.block(b))
            .collect()
    })
}

/// Rounds `x` SAMPLES times with independent random words and checks the mean against x
/// at 4 sigma; every result must be one of the two neighbours.
fn check_unbiased(f: &Format, x: f64) -> Result<(), String> {
    let a = x.abs();
    let (lo, hi) = neighbours(f, a);
    let (lo, hi) = if x < 0.0 { (-lo, -hi) } else { (lo, hi) };
    let p = distance(a, lo.abs(), hi.abs());
    let ups: usize = random_words()
        .par_chunks(1 << 16)
        .map(|chunk| {
            let mut ups = 0;
            for &r in chunk {
                let y = f.round(x, SR, r);
                if y == hi {
                    ups += 1;
                } else if y != lo {
                    return usize::MAX / 2; // not a neighbour: poison the count
                }
            }
            ups
        })
        .sum();
    if ups >= usize::MAX / 2 {
        return Err(format!(
            "{f}: stochastic rounding of {x:e} left the neighbours {lo:e}, {hi:e}"
        ));
    }
    let n = SAMPLES as f64;
    let gap = (hi - lo).abs();
    let mean = lo + (hi - lo) * (ups as f64 / n);
    let sigma = gap * (p * (1.0 - p) / n).sqrt();
    let err = (mean - x).abs();
    if err < 4.0 * sigma {
        Ok(())
    } else {
        Err(format!(
            "{f}: mean of {SAMPLES} stochastic roundings of {x:e} is {mean:e} (P(up) {:.6} vs distance {p:.6}), |mean - x| = {:.2} sigma",
            ups as f64 / n,
            err / sigma
        ))
    }
}

/// x at fraction `t` of the way from `lo` to `hi`.
fn between(lo: f64, hi: f64, t: f64) -> f64 {
    lo + (hi - lo) * t
}

/// Points for a posit or float format: a negative interior point, one between the smallest
/// positive value and its upper neighbour (for posits with es >= 1 a non-uniform gap whose
/// ends are powers of two 2^es binades apart), one between max's lower neighbour and max,
/// (the interval between 0 and the smallest float is covered by the exhaustive tests).
fn grid_points(f: &Format) -> Vec<f64> {
    let g = Grid::of(f).unwrap();
    let m = g.max_pattern();
    vec![
        -1.3,
        between(g.value(1), g.value(2), 0.37),
        between(g.value(m - 1), g.value(m), 0.61),
    ]
}

fn run_unbiased(formats: &[Format]) {
    let cases: Vec<(Format, f64)> = formats
        .iter()
        .flat_map(|f| grid_points(f).into_iter().map(move |x| (*f, x)))
        .collect();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(f, x)| check_unbiased(f, *x).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The distinct preset formats of one family.
fn presets(family: fn(&Format) -> bool) -> Vec<Format> {
    let mut out: Vec<Format> = Vec::new();
    for (_, _, f) in Format::presets() {
        if family(&f) && !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

#[test]
fn stochastic_rounding_is_unbiased_for_16_to_19_bit_float_presets() {
    let formats = presets(|f| f.bits() > 8 && matches!(f, Format::Float(_)));
    assert_eq!(formats.len(), 3, "fp16, bf16, tf32");
    run_unbiased(&formats);
}

#[test]
fn stochastic_rounding_is_unbiased_for_fp8_presets() {
    let formats = presets(|f| f.bits() == 8 && matches!(f, Format::Float(_)));
    assert_eq!(formats.len(), 2, "e5m2, e4m3");
    run_unbiased(&formats);
}

#[test]
fn stochastic_rounding_is_unbiased_for_fp6_and_fp4_presets() {
    let formats = presets(|f| f.bits() < 8 && matches!(f, Format::Float(_)));
    assert_eq!(formats.len(), 3, "e3m2, e2m3, e2m1");
    run_unbiased(&formats);
}

/// Every distinct posit preset plus the required ones.
fn posits() -> Vec<Format> {
    let mut formats = presets(|f| matches!(f, Format::Posit(_)));
    for f in ["posit<8,0>", "posit<8,2>", "posit<16,1>", "posit<16,2>"].map(fmt) {
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    formats
}

#[test]
fn stochastic_rounding_is_unbiased_for_8_bit_posits_near_minpos_and_maxpos() {
    let formats: Vec<Format> = posits().into_iter().filter(|f| f.bits() == 8).collect();
    assert_eq!(formats.len(), 2, "posit<8,0>, posit<8,2>");
    run_unbiased(&formats);
}

#[test]
fn stochastic_rounding_is_unbiased_for_16_bit_posits_near_minpos_and_maxpos() {
    let formats: Vec<Format> = posits().into_iter().filter(|f| f.bits() == 16).collect();
    assert_eq!(formats.len(), 2, "posit<16,1>, posit<16,2>");
    run_unbiased(&formats);
}

#[test]
fn stochastic_rounding_is_unbiased_for_32_bit_posits_near_minpos_and_maxpos() {
    let formats: Vec<Format> = posits().into_iter().filter(|f| f.bits() == 32).collect();
    assert_eq!(formats.len(), 1, "posit<32,2>");
    run_unbiased(&formats);
}

#[test]
fn stochastic_rounding_is_unbiased_for_fixed_and_block() {
    let fixed = fmt("fixed<8,4>");
    let block = fmt("block<8>");
    let failures: Vec<String> = [
        (fixed, -1.3),
        (fixed, 0.42 / 16.0),          // between 0 and the quantum
        (fixed, 7.9375 - 0.61 / 16.0), // just below max
        (block, 1.3),                  // quantum 2^-6
        (block, -1000.3),              // quantum 2^3
    ]
    .iter()
    .filter_map(|(f, x)| check_unbiased(f, *x).err())
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn stochastic_up_probability_is_the_distance_truncated_to_k_bits() {
    // Enumerating the top k bits over all 2^k values makes P(up) exact:
    // #ups / 2^k == floor(distance * 2^k) / 2^k. The low 32-k bits are filled with
    // varying junk, which must be ignored.
    let p16 = fmt("posit<16,1>");
    let p8_2 = fmt("posit<8,2>");
    let p16_2 = fmt("posit<16,2>");
    let g = Grid::of(&p8_2).unwrap();
    let points: Vec<(Format, f64)> = vec![
        (fmt("fp16"), 1.3),
        (fmt("fp16"), -1.0 - 0.5 / 1024.0), // distance exactly 1/2
        (fmt("fp16"), 1.0 + 1.0 / 1024.0 / 1000.0), // distance below 2^-8
        (fmt("e4m3"), 440.0),
        (fmt("bf16"), 3.0e-39), // subnormal
        (fmt("fixed<8,4>"), 0.7),
        (fmt("block<8>"), -3.3),
        (p16, 1.2 * P27),  // between 2^26 and maxpos 2^28: non-uniform gap
        (p16, -1.7 / P27), // between minpos 2^-28 and 2^-26
        (p16_2, 1.0e-16),
        (p8_2, between(g.value(1), g.value(2), 0.123_456)), // above minpos
        (p8_2, between(g.value(126), g.value(127), 0.876_543)), // below maxpos
    ];
    let mut failures = Vec::new();
    for (f, x) in points {
        let (lo, hi) = neighbours(&f, x.abs());
        let hi_signed = if x < 0.0 { -hi } else { hi };
        for k in [1u32, 3, 8, 23] {
            let want = threshold(x.abs(), lo, hi, k);
            let mode = Rounding::stochastic(k).unwrap();
            let ups: u64 = (0..1u32 << k)
                .into_par_iter()
                .map(|top| {
                    let junk = top.wrapping_mul(0x9e37_79b9) >> k;
                    let r = (top << (32 - k)) | junk;
                    (f.round(x, mode, r) == hi_signed) as u64
                })
                .sum();
            if ups as u128 != want {
                failures.push(format!("{f} of {x:e} with {k} bits: {ups} of 2^{k} went up, want floor(distance * 2^{k}) = {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn stochastic_bits_outside_1_to_23_are_rejected() {
    assert!(Rounding::stochastic(0).is_err());
    assert!(Rounding::stochastic(24).is_err());
    assert_eq!(Rounding::stochastic(23).unwrap(), SR);
    assert_eq!(
        "stochastic:8".parse::<Rounding>().unwrap(),
        Rounding::Stochastic { bits: 8 }
    );
    assert!("stochastic:0".parse::<Rounding>().is_err());
}

// ---------------------------------------------------------------------------------------
// 4. Value stability: literal results for fixed (seed, call, index).
// ---------------------------------------------------------------------------------------

#[test]
fn stochastic_results_are_pinned_for_fixed_seed_call_and_index() {
    // Computed once and written down; a change means recorded runs no longer reproduce.
    let s = Stream::new(42, 0);
    let words: Vec<u32> = (0..8).map(|i| s.at(i)).collect();
    assert_eq!(words, PINNED_WORDS_SEED42_CALL0);

    // 1.3 lies between 1.28125 = 0_10_01001 and 1.3125 = 0_10_01010 of posit<8,0>;
    // distance 0.6, so roughly 3 in 5 go up.
    let p8 = fmt("posit<8,0>");
    let got: Vec<f64> = (0..8).map(|i| p8.round(1.3, SR, s.at(i))).collect();
    assert_eq!(got, PINNED_POSIT8_1P3_SEED42_CALL0);

    let s7 = Stream::new(42, 7);
    let e4m3 = fmt("e4m3");
    let got: Vec<f64> = (0..8).map(|i| e4m3.round(-0.3, SR, s7.at(i))).collect();
    assert_eq!(got, PINNED_E4M3_M0P3_SEED42_CALL7);

    let big = Stream::new(0xffff_ffff_0000_0001, 1 << 40);
    let got: Vec<f64> = (0..8)
        .map(|i| {
            fmt("posit<16,1>").round(
                1.2 * P27,
                Rounding::Stochastic { bits: 8 },
                big.at((1 << 34) + i),
            )
        })
        .collect();
    assert_eq!(got, PINNED_POSIT16_LARGE);
}

/// `Stream::new(42, 0).at(0..8)`.
const PINNED_WORDS_SEED42_CALL0: [u32; 8] = [
    0x9ceaf053, 0x77f5493b, 0x12bf50ad, 0x5742b3d7, 0xfcdb2127, 0x53ba6cfd, 0x838f5a6e, 0x744e06fb,
];
/// posit<8,0>, 1.3, stochastic (23 bits), seed 42, call 0, indices 0..8. With distance 0.6
/// a word goes up iff it is below 0.6 * 2^32 = 0x9999999a: only 0x9ceaf053 and 0xfcdb2127
/// stay down.
const PINNED_POSIT8_1P3_SEED42_CALL0: [f64; 8] = [
    1.28125, 1.3125, 1.3125, 1.3125, 1.28125, 1.3125, 1.3125, 1.3125,
];
/// e4m3, -0.3 (between -0.28125 and -0.3125, distance 0.6), seed 42, call 7, indices 0..8.
const PINNED_E4M3_M0P3_SEED42_CALL7: [f64; 8] = [
    -0.3125, -0.28125, -0.3125, -0.3125, -0.28125, -0.3125, -0.3125, -0.3125,
];
/// posit<16,1>, 1.2 * 2^27 (between 2^26 and 2^28, distance 0.4667), 8 random bits,
/// seed 0xffff_ffff_0000_0001, call 2^40, indices 2^34..2^34+8 (high counter words in use).
const PINNED_POSIT16_LARGE: [f64; 8] = [
    67108864.0,
    67108864.0,
    268435456.0,
    67108864.0,
    67108864.0,
    67108864.0,
    67108864.0,
    268435456.0,
];
