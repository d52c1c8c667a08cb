//! Testing policy: float rounding is checked against oracles that share no code with
//! `src/format`: the `half` crate for fp16 and bf16 on f32 inputs, and a slow reference that
//! enumerates every value of a format from its definition (exponent field, mantissa,
//! specials, subnormals), sorts them and rounds by searching the sorted list. Results are
//! compared bit for bit (a NaN matches any NaN; the sign of zero counts). The 2^32-input
//! sweeps are `#[ignore]`d; run them with
//! `cargo test --release --test float_oracle -- --ignored`. Format and rounding strings
//! (parsing, Display round trips, error messages) are tested at the end of this file.

mod common;
use common::reference::{float_value, two_pow};
use common::{Mismatches, SplitMix};

use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::{Block, BlockScope, Fixed, Float, Overflow, Posit, Specials};
use qcandle::{Format, Rounding};
use rayon::prelude::*;

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

/// Bit-for-bit equality, except that any NaN matches any NaN.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn float(exp: u32, man: u32, sub: bool, overflow: Overflow, specials: Specials) -> Float {
    Float::with_options(exp, man, sub, overflow, specials)
        .unwrap_or_else(|e| panic!("float({exp},{man},{sub},{overflow:?},{specials:?}): {e}"))
}

fn preset(name: &str) -> Float {
    match name.parse::<Format>() {
        Ok(Format::Float(f)) => f,
        other => panic!("{name} is not a float preset: {other:?}"),
    }
}

/// The float presets with their parameters written out from the IEEE / OCP definitions.
fn preset_definitions() -> Vec<(&'static str, Float)> {
    use Overflow::*;
    use Specials::*;
    vec![
        ("fp16", float(5, 10, true, Infinity, Ieee)),
        ("bf16", float(8, 7, true, Infinity, Ieee)),
        ("tf32", float(8, 10, true, Infinity, Ieee)),
        ("e5m2", float(5, 2, true, Infinity, Ieee)),
        ("e4m3", float(4, 3, true, Infinity, FiniteNan)),
        ("e3m2", float(3, 2, true, Saturate, Finite)),
        ("e2m3", float(2, 3, true, Saturate, Finite)),
        ("e2m1", float(2, 1, true, Saturate, Finite)),
    ]
}

/// Every valid option combination for (exp, man); the invalid ones are checked to error.
fn option_grid(exp: u32, man: u32) -> Vec<Float> {
    let mut out = Vec::new();
    for sub in [true, false] {
        for specials in [Specials::Ieee, Specials::FiniteNan, Specials::Finite] {
            for overflow in [Overflow::Infinity, Overflow::Saturate] {
                let ieee_without_mantissa = specials == Specials::Ieee && man == 0;
                let finite_to_infinity =
                    specials == Specials::Finite && overflow == Overflow::Infinity;
                let valid = !ieee_without_mantissa && !finite_to_infinity;
                let r = Float::with_options(exp, man, sub, overflow, specials);
                assert_eq!(
                    r.is_ok(),
                    valid,
                    "float({exp},{man},{sub},{overflow:?},{specials:?}) validity: {r:?}"
                );
                if let Ok(f) = r {
                    out.push(f);
                }
            }
        }
    }
    out
}

fn small_grid() -> Vec<Float> {
    let mut v = Vec::new();
    for exp in 2..=8 {
        for man in 0..=7 {
            v.extend(option_grid(exp, man));
        }
    }
    v
}

fn label(f: &Float) -> String {
    Format::Float(*f).to_string()
}

// ---------------------------------------------------------------------------------------
// The slow reference: enumerate, sort, search
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Even,
    Away,
    Zero,
    Sr { bits: u32, random: u32 },
}

fn lib_round(f: &Float, x: f64, mode: Mode) -> f64 {
    match mode {
        Mode::Even => f.round(x, NearestEven, 0),
        Mode::Away => f.round(x, NearestAway, 0),
        Mode::Zero => f.round(x, TowardZero, 0),
        Mode::Sr { bits, random } => f.round(x, Stochastic { bits }, random),
    }
}

struct Reference {
    f: Float,
    exp: u32,
    man: u32,
    sub: bool,
    overflow: Overflow,
    specials: Specials,
    /// Every finite non-negative value, ascending, `values[0] == 0`.
    values: Vec<f64>,
    /// The value after max if the exponent range were unbounded: max plus the gap of max's
    /// binade (Ieee: the Inf pattern's binade, FiniteNan: the NaN pattern's value).
    next: f64,
}

impl Reference {
    /// `exp`, `man` and the options are given explicitly (not read back from `f`).
    fn new(
        f: Float,
        exp: u32,
        man: u32,
        sub: bool,
        overflow: Overflow,
        specials: Specials,
    ) -> Self {
        let mut values = Vec::new();
        for field in 0..(1u32 << exp) {
            for m in 0..(1u32 << man) {
                if field == 0 && m != 0 && !sub {
                    continue;
                }
                let v = float_value(exp, man, specials, u64::from((field << man) | m));
                if v.is_finite() {
                    values.push(v);
                }
            }
        }
        values.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert!(values.windows(2).all(|w| w[0] < w[1]), "duplicate values");
        assert_eq!(values[0], 0.0);
        let max = *values.last().unwrap();
        let mut e = 0i32;
        while two_pow(e) > max {
            e -= 1;
        }
        while two_pow(e + 1) <= max {
            e += 1;
        }
        let next = max + two_pow(e - man as i32);
        Reference {
            f,
            exp,
            man,
            sub,
            overflow,
            specials,
            values,
            next,
        }
    }

    fn max(&self) -> f64 {
        *self.values.last().unwrap()
    }

    fn overflow_value(&self, mode: Mode) -> f64 {
        if mode == Mode::Zero || self.overflow == Overflow::Saturate {
            self.max()
        } else if self.specials == Specials::Ieee {
            f64::INFINITY
        } else {
            f64::NAN
        }
    }

    fn round(&self, x: f64, mode: Mode) -> f64 {
        if x.is_nan() {
            return f64::NAN;
        }
        if x == 0.0 {
            return x;
        }
        let mag = if x.is_infinite() {
            match (self.specials, self.overflow) {
                (Specials::Ieee, _) => f64::INFINITY,
                (_, Overflow::Saturate) => self.max(),
                _ => f64::NAN,
            }
        } else {
            self.round_magnitude(x.abs(), mode)
        };
        if x < 0.0 {
            -mag
        } else {
            mag
        }
    }

    fn round_magnitude(&self, a: f64, mode: Mode) -> f64 {
        let n = self.values.len();
        let i = self.values.partition_point(|&v| v <= a); // >= 1 since values[0] == 0
        let (lo, hi, hi_virtual) = if i == n {
            if a >= self.next {
                return self.overflow_value(mode);
            }
            (self.max(), self.next, true)
        } else {
            (self.values[i - 1], self.values[i], false)
        };
        if a == lo {
            return lo;
        }
        let gap = hi - lo; // a power of two, exact
        let mid = lo + gap / 2.0; // exact
        let up = match mode {
            // Ties go to the neighbour that is an even multiple of the gap: for man >= 1 the
            // one with the even mantissa (the virtual value after max included); for man = 0
            // the unbounded-exponent grid of the module docs (2^e vs 2^(e+1): 2^(e+1)); 0
            // always wins against the smallest positive value.
            Mode::Even => a > mid || (a == mid && (hi / gap) % 2.0 == 0.0),
            Mode::Away => a >= mid,
            Mode::Zero => false,
            Mode::Sr { bits, random } => {
                let threshold = ((a - lo) / gap * two_pow(bits as i32)).floor();
                ((random >> (32 - bits)) as f64) < threshold
            }
        };
        if !up {
            lo
        } else if hi_virtual {
            self.overflow_value(mode)
        } else {
            hi
        }
    }

    /// Inputs at and around every rounding boundary, non-negative.
    fn probes(&self) -> Vec<f64> {
        let mut p = Vec::with_capacity(self.values.len() * 6 + 16);
        let mut pairs: Vec<(f64, f64)> = self.values.windows(2).map(|w| (w[0], w[1])).collect();
        pairs.push((self.max(), self.next));
        for (lo, hi) in pairs {
            let gap = hi - lo;
            let mid = lo + gap / 2.0;
            p.extend([
                lo,
                lo + gap / 4.0,
                mid.next_down(),
                mid,
                mid.next_up(),
                lo + gap * 0.75,
            ]);
        }
        let next = self.next;
        p.extend([
            next.next_down(),
            next,
            next.next_up(),
            next * 1.5,
            next * 2.0,
            next * 1e30,
            f64::MAX,
            f64::from_bits(1), // smallest f64 subnormal
            f64::MIN_POSITIVE,
            1e-300,
            f32::from_bits(1) as f64,
            f32::MIN_POSITIVE as f64,
            1.0,
            std::f64::consts::PI,
        ]);
        p
    }

    fn modes(x: f64) -> Vec<Mode> {
        let h = (x.to_bits() ^ (x.to_bits() >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let r = (h >> 32) as u32;
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
            Mode::Sr { bits: 3, random: r },
            Mode::Sr { bits: 1, random: 0 },
        ]
    }

    /// Every probe, both signs, every mode: library vs reference.
    fn check(&self) -> (u64, Mismatches) {
        let mut mm = Mismatches::default();
        let mut n = 0u64;
        let mut inputs = self.probes();
        inputs.extend([0.0, f64::INFINITY, f64::NAN]);
        for &a in &inputs {
            for x in [a, -a] {
                for mode in Self::modes(x) {
                    n += 1;
                    let want = self.round(x, mode);
                    let got = lib_round(&self.f, x, mode);
                    if !same(want, got) {
                        mm.record(|| {
                            format!(
                                "{}: round({x:e} = {:#x}, {mode:?}) = {got:e}, reference {want:e}",
                                label(&self.f),
                                x.to_bits()
                            )
                        });
                    }
                }
            }
        }
        (n, mm)
    }

    /// Accessors against the enumeration.
    fn check_accessors(&self) -> Mismatches {
        let mut mm = Mismatches::default();
        let f = &self.f;
        let bias = (1i32 << (self.exp - 1)) - 1;
        let checks: [(&str, f64, f64); 5] = [
            ("max_value", f.max_value(), self.max()),
            ("min_positive", f.min_positive(), self.values[1]),
            ("bias", f.bias() as f64, bias as f64),
            ("emin", f.emin() as f64, (1 - bias) as f64),
            ("bits", f.bits() as f64, (1 + self.exp + self.man) as f64),
        ];
        for (name, got, want) in checks {
            if !same(got, want) {
                mm.record(|| format!("{}: {name} = {got:e}, expected {want:e}", label(f)));
            }
        }
        let params = (f.exp(), f.man(), f.subnormals(), f.overflow(), f.specials());
        let want = (self.exp, self.man, self.sub, self.overflow, self.specials);
        if params != want {
            mm.record(|| format!("{}: parameters {params:?}, expected {want:?}", label(f)));
        }
        mm
    }
}

// ---------------------------------------------------------------------------------------
// 1. fp16 / bf16 against the `half` crate
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum HalfOracle {
    Fp16Round,
    Bf16Round,
    Fp16Encode,
    Bf16Encode,
}

fn is_nan16(p: u32, exp_mask: u32, man_mask: u32) -> bool {
    p < 1 << 16 && p & exp_mask == exp_mask && p & man_mask != 0
}

fn half_mismatch(oracle: HalfOracle, fp16: &Float, bf16: &Float, bits: u32) -> Option<String> {
    let x = f32::from_bits(bits);
    let xd = x as f64;
    match oracle {
        HalfOracle::Fp16Round | HalfOracle::Bf16Round => {
            let (got, want) = match oracle {
                HalfOracle::Fp16Round => (
                    fp16.round(xd, NearestEven, 0),
                    half::f16::from_f32(x).to_f32() as f64,
                ),
                _ => (
                    bf16.round(xd, NearestEven, 0),
                    half::bf16::from_f32(x).to_f32() as f64,
                ),
            };
            (!same(got, want))
                .then(|| format!("{oracle:?} {bits:#010x} ({x:e}): got {got:e}, half {want:e}"))
        }
        HalfOracle::Fp16Encode | HalfOracle::Bf16Encode => {
            let (got, want, exp_mask, man_mask) = match oracle {
                HalfOracle::Fp16Encode => (
                    fp16.encode(xd),
                    half::f16::from_f32(x).to_bits() as u32,
                    0x7c00,
                    0x03ff,
                ),
                _ => (
                    bf16.encode(xd),
                    half::bf16::from_f32(x).to_bits() as u32,
                    0x7f80,
                    0x007f,
                ),
            };
            let ok = match got {
                Ok(p) if x.is_nan() => {
                    is_nan16(p, exp_mask, man_mask) && is_nan16(want, exp_mask, man_mask)
                }
                Ok(p) => p == want,
                Err(_) => false,
            };
            (!ok).then(|| format!("{oracle:?} {bits:#010x} ({x:e}): got {got:?}, half {want:#06x}"))
        }
    }
}

fn half_sweep(oracle: HalfOracle, inputs: impl Iterator<Item = u32>) -> (u64, Mismatches) {
    let (fp16, bf16) = (preset("fp16"), preset("bf16"));
    let mut mm = Mismatches::default();
    let mut n = 0;
    for bits in inputs {
        n += 1;
        if let Some(s) = half_mismatch(oracle, &fp16, &bf16, bits) {
            mm.record(|| s);
        }
    }
    (n, mm)
}

fn half_sweep_all(oracle: HalfOracle) {
    let t = std::time::Instant::now();
    let (n, mm) = (0u32..1 << 16)
        .into_par_iter()
        .map(|hi| half_sweep(oracle, (0u32..1 << 16).map(move |lo| (hi << 16) | lo)))
        .reduce(
            || (0, Mismatches::default()),
            |(n1, m1), (n2, m2)| (n1 + n2, m1.merge(m2)),
        );
    assert_eq!(n, 1u64 << 32);
    println!("{oracle:?}: all 2^32 f32 inputs in {:.1?}", t.elapsed());
    mm.assert_none_of(&format!("{oracle:?} on every f32"), n);
}

/// 1e6 random f32 bit patterns plus the specials and every f32 exponent's edges.
fn random_f32_bits() -> Vec<u32> {
    let mut rng = SplitMix(0x5eed_0f16_0b16);
    let mut v: Vec<u32> = (0..1_000_000).map(|_| rng.next_u32()).collect();
    for e in 0..=255u32 {
        for m in [
            0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0x7f_ffff,
        ] {
            let b = (e << 23) | m;
            v.extend([b, b | 0x8000_0000]);
        }
    }
    v
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn fp16_round_matches_half_on_every_f32() {
    half_sweep_all(HalfOracle::Fp16Round);
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn bf16_round_matches_half_on_every_f32() {
    half_sweep_all(HalfOracle::Bf16Round);
}

#[test]
#[ignore = "exhaustive: run with --release -- --ignored"]
fn fp16_and_bf16_encode_match_half_bits_on_every_f32() {
    half_sweep_all(HalfOracle::Fp16Encode);
    half_sweep_all(HalfOracle::Bf16Encode);
}

#[test]
fn fp16_round_matches_half_on_random_f32() {
    let (n, mm) = half_sweep(HalfOracle::Fp16Round, random_f32_bits().into_iter());
    mm.assert_none_of("fp16 round vs half (random)", n);
}

#[test]
fn bf16_round_matches_half_on_random_f32() {
    let (n, mm) = half_sweep(HalfOracle::Bf16Round, random_f32_bits().into_iter());
    mm.assert_none_of("bf16 round vs half (random)", n);
}

#[test]
fn fp16_and_bf16_encode_match_half_bits_on_random_f32() {
    for oracle in [HalfOracle::Fp16Encode, HalfOracle::Bf16Encode] {
        let (n, mm) = half_sweep(oracle, random_f32_bits().into_iter());
        mm.assert_none_of(&format!("{oracle:?} (random)"), n);
    }
}

#[test]
fn f32_subnormal_inputs_round_like_half() {
    // Every positive and negative f32 subnormal: bf16 has f32's exponent range, so these
    // land on bf16's subnormal grid (multiples of 2^-133); fp16 flushes them to ±0.
    let inputs = (1u32..1 << 23).flat_map(|b| [b, b | 0x8000_0000]);
    for oracle in [
        HalfOracle::Fp16Round,
        HalfOracle::Bf16Round,
        HalfOracle::Bf16Encode,
    ] {
        let (n, mm) = half_sweep(oracle, inputs.clone());
        mm.assert_none_of(&format!("{oracle:?} on f32 subnormals"), n);
    }
}

#[test]
fn fp16_and_bf16_decode_match_half_on_every_pattern() {
    let (fp16, bf16) = (preset("fp16"), preset("bf16"));
    let mut mm = Mismatches::default();
    for p in 0u32..1 << 16 {
        let got = fp16.decode(p);
        let want = half::f16::from_bits(p as u16).to_f64();
        if !same(got, want) {
            mm.record(|| format!("fp16 decode({p:#06x}) = {got:e}, half {want:e}"));
        }
        let got = bf16.decode(p);
        let want = half::bf16::from_bits(p as u16).to_f64();
        if !same(got, want) {
            mm.record(|| format!("bf16 decode({p:#06x}) = {got:e}, half {want:e}"));
        }
    }
    mm.assert_none_of("decode vs half", 2 << 16);
}

// ---------------------------------------------------------------------------------------
// 2. The enumerated reference
// ---------------------------------------------------------------------------------------

#[test]
fn presets_have_their_defining_parameters() {
    for (name, def) in preset_definitions() {
        assert_eq!(preset(name), def, "{name}");
        assert_eq!(
            name.parse::<Format>().unwrap(),
            Format::Float(def),
            "{name}"
        );
    }
}

#[test]
fn every_float_preset_rounds_like_the_enumerated_reference() {
    // bf16 (2^15 values) and tf32 (2^18 values) are small enough to enumerate in full.
    let (n, mm) = preset_definitions()
        .into_par_iter()
        .map(|(name, f)| {
            let r = Reference::new(
                preset(name),
                f.exp(),
                f.man(),
                f.subnormals(),
                f.overflow(),
                f.specials(),
            );
            let (n, mm) = r.check();
            (n, mm.merge(r.check_accessors()))
        })
        .reduce(
            || (0, Mismatches::default()),
            |(a, x), (b, y)| (a + b, x.merge(y)),
        );
    mm.assert_none_of("presets vs reference", n);
}

#[test]
fn every_small_float_rounds_like_the_enumerated_reference() {
    // (exp, man) in 2..=8 x 0..=7, subnormals on/off, every valid specials/overflow pair.
    let mut cases = Vec::new();
    for exp in 2..=8u32 {
        for man in 0..=7u32 {
            for f in option_grid(exp, man) {
                cases.push((exp, man, f));
            }
        }
    }
    // man = 0 has no IEEE variant: 6 combinations instead of 10.
    assert_eq!(cases.len(), 7 * (6 + 7 * 10));
    let (n, mm) = cases
        .into_par_iter()
        .map(|(exp, man, f)| {
            // exp and man come from the loop, not from the accessors.
            let r = Reference::new(f, exp, man, f.subnormals(), f.overflow(), f.specials());
            let (n, mm) = r.check();
            (n, mm.merge(r.check_accessors()))
        })
        .reduce(
            || (0, Mismatches::default()),
            |(a, x), (b, y)| (a + b, x.merge(y)),
        );
    mm.assert_none_of("small float grid vs reference", n);
}

#[test]
fn nosub_formats_hold_only_zero_below_the_smallest_normal() {
    // Below 2^emin only 0 and 2^emin exist; the midpoint 2^(emin-1) ties to 0.
    for exp in 2..=8u32 {
        for man in 0..=7u32 {
            for f in option_grid(exp, man)
                .into_iter()
                .filter(|f| !f.subnormals())
            {
                let tiny = two_pow(f.emin());
                assert_eq!(f.min_positive(), tiny, "{}", label(&f));
                let half = tiny / 2.0;
                let cases = [
                    (half, 0.0, tiny, 0.0),
                    (half.next_up(), tiny, tiny, 0.0),
                    (half.next_down(), 0.0, 0.0, 0.0),
                    (tiny.next_down(), tiny, tiny, 0.0),
                    (tiny * 0.25, 0.0, 0.0, 0.0),
                ];
                for (x, even, away, zero) in cases {
                    for s in [1.0, -1.0] {
                        let x = s * x;
                        let got = [
                            f.round(x, NearestEven, 0),
                            f.round(x, NearestAway, 0),
                            f.round(x, TowardZero, 0),
                        ];
                        let want = [s * even, s * away, s * zero];
                        for (g, w) in got.iter().zip(want) {
                            assert!(
                                same(*g, w),
                                "{}: {x:e} -> {got:?}, want {want:?}",
                                label(&f)
                            );
                        }
                    }
                }
            }
        }
    }
}

fn small_formats_and_fp16() -> Vec<Float> {
    let mut v: Vec<Float> = small_grid().into_iter().filter(|f| f.bits() <= 8).collect();
    v.extend(
        preset_definitions()
            .into_iter()
            .map(|(_, f)| f)
            .filter(|f| f.bits() <= 16),
    );
    v
}

#[test]
fn decode_matches_the_definition_and_encode_inverts_it_for_every_pattern() {
    let mut mm = Mismatches::default();
    let mut n = 0u64;
    for f in small_formats_and_fp16() {
        let (exp, man) = (f.exp(), f.man());
        let canonical = f.encode(f64::NAN).ok();
        for p in 0u32..1 << f.bits() {
            n += 1;
            let field = (p >> man) & ((1 << exp) - 1);
            let m = p & ((1 << man) - 1);
            if field == 0 && m != 0 && !f.subnormals() {
                // Not a value of a nosub format; decode of such patterns is unspecified.
                continue;
            }
            let want = float_value(exp, man, f.specials(), u64::from(p));
            let got = f.decode(p);
            if !same(got, want) {
                mm.record(|| format!("{}: decode({p:#x}) = {got:e}, want {want:e}", label(&f)));
            }
            // Upper bits are ignored.
            let got_hi = f.decode(p | (u32::MAX << f.bits()));
            if !same(got_hi, want) {
                mm.record(|| format!("{}: decode ignores upper bits of {p:#x}", label(&f)));
            }
            let back = f.encode(got);
            let ok = if want.is_nan() {
                canonical.is_some() && back.as_ref().ok() == canonical.as_ref()
            } else {
                back == Ok(p)
            };
            if !ok {
                mm.record(|| {
                    format!(
                        "{}: encode(decode({p:#x}) = {got:e}) = {back:?} (canonical NaN {canonical:?})",
                        label(&f)
                    )
                });
            }
        }
    }
    mm.assert_none_of("decode/encode round trip", n);
}

#[test]
fn encode_of_nan_is_a_nan_pattern_and_errors_without_nan() {
    for f in small_formats_and_fp16() {
        let r = f.encode(f64::NAN);
        match f.specials() {
            Specials::Finite => {
                let e = r.expect_err("finite formats have no NaN encoding");
                assert!(e.to_string().contains("NaN"), "{e}");
            }
            _ => {
                let p = r.unwrap();
                assert!(f.decode(p).is_nan(), "{}: {p:#x}", label(&f));
                assert_eq!(
                    f.encode(-f64::NAN).unwrap(),
                    p,
                    "{}: one canonical NaN",
                    label(&f)
                );
            }
        }
        // Non-NaN inputs always encode, and to the pattern of their rounded value.
        for x in [0.3, -1e30, f64::INFINITY, -0.0, 1e-30] {
            let p = f.encode(x);
            let v = f.round(x, NearestEven, 0);
            if v.is_nan() {
                assert!(
                    p.is_ok_and(|p| f.decode(p).is_nan()),
                    "{}: {x:e}",
                    label(&f)
                );
            } else {
                assert!(same(f.decode(p.unwrap()), v), "{}: {x:e}", label(&f));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Pinned facts
// ---------------------------------------------------------------------------------------

fn all_modes() -> [Rounding; 6] {
    [
        Rounding::NearestEven,
        Rounding::NearestAway,
        Rounding::TowardZero,
        Rounding::Stochastic { bits: 23 },
        Rounding::Stochastic { bits: 1 },
        Rounding::Stochastic { bits: 8 },
    ]
}

fn fr(f: &Float, x: f64) -> f64 {
    f.round(x, NearestEven, 0)
}

#[test]
fn e4m3_max_is_448_ties_down_and_overflows_to_nan() {
    let f = preset("e4m3");
    assert_eq!(f.max_value(), 448.0);
    assert_eq!(fr(&f, 448.0), 448.0);
    assert_eq!(
        fr(&f, 464.0),
        448.0,
        "464 = 0b1_1101_0000 ties to the even 448 (0.1111.110)"
    );
    assert_eq!(fr(&f, -464.0), -448.0);
    assert_eq!(fr(&f, 463.9), 448.0);
    assert!(fr(&f, 464.0f64.next_up()).is_nan());
    assert!(fr(&f, 465.0).is_nan());
    assert!(fr(&f, -465.0).is_nan());
    assert!(f.round(465.0, NearestAway, 0).is_nan());
    assert!(
        f.round(464.0, NearestAway, 0).is_nan(),
        "away from zero: 464 -> 480 -> NaN"
    );
    assert_eq!(f.round(1e9, TowardZero, 0), 448.0, "toward zero saturates");
    assert!(fr(&f, f64::INFINITY).is_nan());
    assert!(fr(&f, f64::NEG_INFINITY).is_nan());
    assert_eq!(f.encode(448.0), Ok(0x7e));
    assert_eq!(f.encode(f64::NAN), Ok(0x7f));
    assert!(f.decode(0x7f).is_nan() && f.decode(0xff).is_nan());
    assert_eq!(f.decode(0x7e), 448.0);
    assert_eq!(f.min_positive(), 2f64.powi(-9));
    let sat: Float = match "float<4,3,fn,sat>".parse::<Format>().unwrap() {
        Format::Float(f) => f,
        _ => unreachable!(),
    };
    assert_eq!(fr(&sat, 465.0), 448.0);
    assert_eq!(fr(&sat, -1e30), -448.0);
    assert_eq!(fr(&sat, f64::INFINITY), 448.0);
    assert_eq!(fr(&sat, f64::NEG_INFINITY), -448.0);
}

#[test]
fn e5m2_max_is_57344_and_61440_ties_to_inf() {
    let f = preset("e5m2");
    assert_eq!(f.max_value(), 57344.0);
    assert_eq!(fr(&f, 61440.0f64.next_down()), 57344.0);
    assert_eq!(
        fr(&f, 61440.0),
        f64::INFINITY,
        "57344 = 1.11 x 2^15 is odd, tie goes up"
    );
    assert_eq!(fr(&f, -61440.0), f64::NEG_INFINITY);
    assert_eq!(f.round(61440.0, TowardZero, 0), 57344.0);
    assert_eq!(f.round(f64::INFINITY, TowardZero, 0), f64::INFINITY);
    assert_eq!(f.min_positive(), 2f64.powi(-16));
}

#[test]
fn fp16_65520_overflows_to_inf() {
    let f = preset("fp16");
    assert_eq!(f.max_value(), 65504.0);
    assert_eq!(fr(&f, 65519.99), 65504.0);
    assert_eq!(fr(&f, 65520.0), f64::INFINITY);
    assert_eq!(fr(&f, -65520.0), f64::NEG_INFINITY);
    assert_eq!(f.round(65520.0, TowardZero, 0), 65504.0);
    assert_eq!(f.round(1e300, TowardZero, 0), 65504.0);
    assert_eq!(f.min_positive(), 2f64.powi(-24));
    assert_eq!(
        fr(&f, 2f64.powi(-25)),
        0.0,
        "half the smallest subnormal ties to 0"
    );
    assert_eq!(
        fr(&f, 3.0 * 2f64.powi(-25)),
        2f64.powi(-23),
        "1.5 quanta ties to 2"
    );
}

#[test]
fn e2m1_values_are_exactly_the_ocp_set() {
    let f = preset("e2m1");
    let mut got: Vec<f64> = (0u32..8).map(|p| f.decode(p)).collect();
    got.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(got, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
    // Every f64 input rounds into the set; 5 ties to the even 4 (1.00 x 2^2).
    assert_eq!(fr(&f, 5.0), 4.0);
    assert_eq!(fr(&f, 7.0), 6.0, "beyond max: saturate");
    assert_eq!(fr(&f, 1e300), 6.0);
    assert_eq!(fr(&f, f64::INFINITY), 6.0);
    assert_eq!(fr(&f, -f64::INFINITY), -6.0);
    assert_eq!(fr(&f, 0.25), 0.0);
    assert_eq!(fr(&f, 0.75), 1.0);
    assert_eq!(fr(&f, 2.5), 2.0);
    assert_eq!(fr(&f, 3.5), 4.0);
    assert_eq!(f.round(5.0, NearestAway, 0), 6.0);
    assert_eq!(f.max_value(), 6.0);
    assert_eq!(f.min_positive(), 0.5);
}

#[test]
fn e3m2_max_is_28_and_e2m3_max_is_7_5() {
    let e3m2 = preset("e3m2");
    assert_eq!(e3m2.max_value(), 28.0);
    assert_eq!(fr(&e3m2, 30.0), 28.0);
    assert_eq!(fr(&e3m2, 1e9), 28.0);
    assert_eq!(e3m2.min_positive(), 0.0625);
    let e2m3 = preset("e2m3");
    assert_eq!(e2m3.max_value(), 7.5);
    assert_eq!(fr(&e2m3, 7.75), 7.5);
    assert_eq!(fr(&e2m3, -100.0), -7.5);
    assert_eq!(e2m3.min_positive(), 0.125);
}

fn every_float_format() -> Vec<Float> {
    let mut v = small_grid();
    v.extend(preset_definitions().into_iter().map(|(_, f)| f));
    v
}

#[test]
fn nan_input_stays_nan_in_every_format_and_mode() {
    for f in every_float_format() {
        for mode in all_modes() {
            for r in [0, 0x8000_0000, u32::MAX] {
                for x in [f64::NAN, -f64::NAN, f64::from_bits(0x7ff0_0000_0000_0001)] {
                    let got = Format::Float(f).round(x, mode, r);
                    assert!(got.is_nan(), "{}: {mode} NaN -> {got}", label(&f));
                }
            }
        }
    }
}

#[test]
fn signed_zero_keeps_its_sign_in_every_format_and_mode() {
    for f in every_float_format() {
        // Inputs that round to zero in every mode (r = u32::MAX never rounds up).
        let tiny = [0.0, f.min_positive() / 4.0, f64::from_bits(1), 1e-300];
        for mode in all_modes() {
            for x in tiny {
                let p = Format::Float(f).round(x, mode, u32::MAX);
                let n = Format::Float(f).round(-x, mode, u32::MAX);
                assert_eq!(
                    p.to_bits(),
                    0.0f64.to_bits(),
                    "{}: {mode} {x:e} -> {p:e}",
                    label(&f)
                );
                assert_eq!(
                    n.to_bits(),
                    (-0.0f64).to_bits(),
                    "{}: {mode} -{x:e} -> {n:e}",
                    label(&f)
                );
            }
        }
        assert_eq!(f.encode(-0.0), Ok(1 << (f.bits() - 1)), "{}", label(&f));
        assert_eq!(f.encode(0.0), Ok(0), "{}", label(&f));
    }
}

#[test]
fn f32_subnormal_inputs_round_like_the_reference() {
    // Every 4099th f32 subnormal plus the edges, both signs, against the reference of every
    // preset (tf32 and bf16 keep them on their subnormal grids; the others flush).
    let mut bits: Vec<u32> = (1u32..1 << 23).step_by(4099).collect();
    bits.extend([
        1,
        2,
        3,
        (1 << 23) - 1,
        1 << 22,
        (1 << 22) + 1,
        1 << 9,
        3 << 9,
        1 << 12,
    ]);
    let mut mm = Mismatches::default();
    let mut n = 0;
    for (_, f) in preset_definitions() {
        let r = Reference::new(f, f.exp(), f.man(), true, f.overflow(), f.specials());
        for &b in &bits {
            for x in [f32::from_bits(b) as f64, -(f32::from_bits(b) as f64)] {
                for mode in Reference::modes(x) {
                    n += 1;
                    let (got, want) = (lib_round(&f, x, mode), r.round(x, mode));
                    if !same(got, want) {
                        mm.record(|| {
                            format!("{}: {x:e} {mode:?}: {got:e}, want {want:e}", label(&f))
                        });
                    }
                }
            }
        }
    }
    mm.assert_none_of("f32 subnormal inputs", n);
    // Spot values: tf32's smallest subnormal is 2^(-126-10) = 2^-136, so 2^-149 and 2^-137
    // (half of it, a tie with 0) round to 0 and 3 x 2^-137 (a tie between 2^-136 and
    // 2^-135) goes to the even 2^-135; bf16's is 2^-133 and 3 x 2^-134 goes to 2^-132.
    let (tf32, bf16) = (preset("tf32"), preset("bf16"));
    assert_eq!(fr(&tf32, 2f64.powi(-149)), 0.0);
    assert_eq!(fr(&tf32, 2f64.powi(-137)), 0.0);
    assert_eq!(fr(&tf32, 3.0 * 2f64.powi(-137)), 2f64.powi(-135));
    assert_eq!(fr(&bf16, 3.0 * 2f64.powi(-134)), 2f64.powi(-132));
    assert_eq!(fr(&bf16, -(2f64.powi(-149))), -0.0);
    assert!(fr(&bf16, -(2f64.powi(-149))).is_sign_negative());
}

#[test]
fn format_round_dispatches_to_float_round() {
    let mut rng = SplitMix(7);
    for (name, f) in preset_definitions() {
        let fmt: Format = name.parse().unwrap();
        for _ in 0..2000 {
            let x = f64::from_bits(rng.next_u64());
            let r = rng.next_u32();
            let pairs = [
                (
                    fmt.round(x, Rounding::NearestEven, r),
                    f.round(x, NearestEven, r),
                ),
                (
                    fmt.round(x, Rounding::NearestAway, r),
                    f.round(x, NearestAway, r),
                ),
                (
                    fmt.round(x, Rounding::TowardZero, r),
                    f.round(x, TowardZero, r),
                ),
                (
                    fmt.round(x, Rounding::Stochastic { bits: 5 }, r),
                    f.round(x, Stochastic { bits: 5 }, r),
                ),
            ];
            for (a, b) in pairs {
                assert!(same(a, b), "{name}: {x:e}: {a:e} vs {b:e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. Format and rounding strings
// ---------------------------------------------------------------------------------------

fn parse(s: &str) -> Format {
    s.parse::<Format>()
        .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

fn parse_err(s: &str) -> String {
    match s.parse::<Format>() {
        Ok(f) => panic!("{s:?} should not parse, got {f:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_preset_and_generic_format_string_parses_to_its_definition() {
    use Overflow::*;
    use Specials::*;
    for (name, def) in preset_definitions() {
        assert_eq!(parse(name), Format::Float(def), "{name}");
        assert_eq!(
            parse(&name.to_uppercase()),
            Format::Float(def),
            "{name} upper case"
        );
    }
    let cases: &[(&str, Format)] = &[
        (
            "float<5,2>",
            Format::Float(float(5, 2, true, Infinity, Ieee)),
        ),
        (
            "float<4,3,fn>",
            Format::Float(float(4, 3, true, Infinity, FiniteNan)),
        ),
        (
            "float<2,1,fin>",
            Format::Float(float(2, 1, true, Saturate, Finite)),
        ),
        (
            "float<5,2,nosub>",
            Format::Float(float(5, 2, false, Infinity, Ieee)),
        ),
        (
            "float<5,2,sat>",
            Format::Float(float(5, 2, true, Saturate, Ieee)),
        ),
        (
            "float<4,3,fn,sat>",
            Format::Float(float(4, 3, true, Saturate, FiniteNan)),
        ),
        (
            "float<3,0,fn>",
            Format::Float(float(3, 0, true, Infinity, FiniteNan)),
        ),
        (
            "float< 5 , 2 >",
            Format::Float(float(5, 2, true, Infinity, Ieee)),
        ),
        (
            "fixed<8,4>",
            Format::Fixed(Fixed::with_options(8, 4, true, false).unwrap()),
        ),
        (
            "fixed<8,4,noclamp,sym>",
            Format::Fixed(Fixed::with_options(8, 4, false, true).unwrap()),
        ),
        (
            "fixed<8,-3>",
            Format::Fixed(Fixed::with_options(8, -3, true, false).unwrap()),
        ),
        (
            "block<8>",
            Format::Block(Block::new(8, BlockScope::Tensor).unwrap()),
        ),
        (
            "block<8,dim=0>",
            Format::Block(Block::new(8, BlockScope::Dim(0)).unwrap()),
        ),
        (
            "block<8,dim=-1>",
            Format::Block(Block::new(8, BlockScope::Dim(-1)).unwrap()),
        ),
        ("posit<8,0>", Format::Posit(Posit::new(8, 0).unwrap())),
        ("posit8", Format::Posit(Posit::new(8, 2).unwrap())),
        ("posit16", Format::Posit(Posit::new(16, 2).unwrap())),
        ("posit32", Format::Posit(Posit::new(32, 2).unwrap())),
    ];
    for (s, want) in cases {
        assert_eq!(&parse(s), want, "{s}");
    }
    for (name, _, f) in Format::presets() {
        assert_eq!(parse(name), f, "{name}");
    }
}

#[test]
fn format_display_parses_back_to_the_same_format() {
    let mut formats: Vec<Format> = Format::presets().into_iter().map(|(_, _, f)| f).collect();
    for exp in 2..=8 {
        for man in 0..=23 {
            formats.extend(option_grid(exp, man).into_iter().map(Format::Float));
        }
    }
    for wl in 2..=32 {
        for fl in [-64, -7, -1, 0, 1, 4, 31, 64] {
            for clamp in [true, false] {
                for sym in [true, false] {
                    formats.push(Format::Fixed(
                        Fixed::with_options(wl, fl, clamp, sym).unwrap(),
                    ));
                }
            }
        }
        for scope in [
            BlockScope::Tensor,
            BlockScope::Dim(0),
            BlockScope::Dim(3),
            BlockScope::Dim(-1),
        ] {
            formats.push(Format::Block(Block::new(wl, scope).unwrap()));
        }
        for es in 0..=5 {
            formats.push(Format::Posit(Posit::new(wl, es).unwrap()));
        }
    }
    for f in formats {
        let s = f.to_string();
        let back = s.parse::<Format>();
        assert_eq!(back, Ok(f), "{f:?} displays as {s:?}");
        assert_eq!(back.unwrap().to_string(), s);
    }
    // Float presets display as their names.
    for (name, def) in preset_definitions() {
        assert_eq!(Format::Float(def).to_string(), name);
    }
}

#[test]
fn invalid_format_parameters_error_naming_the_parameter() {
    let cases = [
        ("float<9,2>", "`exp`"),
        ("float<1,2>", "`exp`"),
        ("float<5,24>", "`man`"),
        ("float<5,-1>", "`man`"),
        ("float<x,2>", "`exp`"),
        ("float<5>", "`man`"),
        ("posit<40,2>", "`n`"),
        ("posit<1,0>", "`n`"),
        ("posit<8,6>", "`es`"),
        ("fixed<1,0>", "`wl`"),
        ("fixed<33,0>", "`wl`"),
        ("fixed<8,65>", "`fl`"),
        ("fixed<8,-65>", "`fl`"),
        ("fixed<8,99999999999>", "`fl`"),
        ("block<1>", "`wl`"),
        ("block<33>", "`wl`"),
        ("float<5,2,bogus>", "bogus"),
        ("fixed<8,4,bogus>", "bogus"),
        ("block<8,bogus>", "bogus"),
        ("float<3,0>", "man"),
    ];
    for (s, needle) in cases {
        let e = parse_err(s);
        assert!(
            e.contains(needle),
            "{s:?}: error {e:?} should mention {needle}"
        );
    }
    // The constructors agree with the parser.
    assert!(Float::new(3, 0).is_err());
    assert!(Float::with_options(5, 2, true, Overflow::Infinity, Specials::Finite).is_err());
}

#[test]
fn fin_float_string_parses_and_saturates() {
    let f = match parse("float<2,1,fin>") {
        Format::Float(f) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!(f.specials(), Specials::Finite);
    assert_eq!(f.overflow(), Overflow::Saturate);
    assert_eq!(fr(&f, 100.0), 6.0);
    assert_eq!(fr(&f, f64::INFINITY), 6.0);
    assert_eq!(f.round(7.0, NearestAway, 0), 6.0);
}

#[test]
fn unknown_format_names_error() {
    for s in [
        "",
        "fp8",
        "e4m4",
        "fp32",
        "posit",
        "float",
        "float<5,2",
        "float5,2>",
        "int8",
        "quux<1,2>",
        "posit<8,0,1>",
        "block<8,dim=x>",
        "block<8,dim=0,dim=1>",
    ] {
        let e = parse_err(s);
        assert!(!e.is_empty(), "{s:?}");
    }
}

#[test]
fn rounding_strings_parse_and_round_trip() {
    let cases = [
        ("nearest-even", Rounding::NearestEven),
        ("nearest-away", Rounding::NearestAway),
        ("toward-zero", Rounding::TowardZero),
        ("stochastic", Rounding::Stochastic { bits: 23 }),
        ("stochastic:8", Rounding::Stochastic { bits: 8 }),
        ("stochastic:1", Rounding::Stochastic { bits: 1 }),
    ];
    for (s, want) in cases {
        let r: Rounding = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(r, want, "{s}");
        assert_eq!(r.to_string(), s, "{s} displays as itself");
        assert_eq!(r.to_string().parse::<Rounding>(), Ok(r));
    }
    for bits in 1..=23 {
        let r = Rounding::stochastic(bits).unwrap();
        assert_eq!(r.to_string().parse::<Rounding>(), Ok(r), "{bits}");
    }
    assert_eq!(
        "stochastic:23".parse::<Rounding>(),
        Ok(Rounding::Stochastic { bits: 23 })
    );
}

#[test]
fn stochastic_bits_out_of_range_error_mentions_bits() {
    for s in [
        "stochastic:0",
        "stochastic:24",
        "stochastic:99",
        "stochastic:x",
        "stochastic:-1",
    ] {
        let e = s
            .parse::<Rounding>()
            .expect_err(&format!("{s} should not parse"))
            .to_string();
        assert!(e.contains("bits"), "{s}: {e}");
    }
    for s in ["", "nearest-odd", "up", "stochastic8"] {
        assert!(s.parse::<Rounding>().is_err(), "{s}");
    }
    assert!(Rounding::stochastic(0).is_err() && Rounding::stochastic(24).is_err());
}
