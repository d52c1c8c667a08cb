//! The magic-constant posit rounding of doubled values (`quire::posit_magic`), the naive
//! GEMM's AVX2 rounding, against `Posit::round` (the definition, in f64): every grid point,
//! midpoint and quarter point of every binade it claims (and their f32 neighbours), both
//! signs; products of random values and of values built next to a midpoint; zero; the
//! binades it must refuse (cut exponent bits next to minpos and maxpos); the posits it
//! admits.

mod common;

use common::SplitMix;
use qcandle::format::rounding::Rounding;
use qcandle::format::{Format, Posit};
use qcandle::quire::posit_magic::PositMagic;

/// Posits with the form, across `n` and `es`.
const ADMITTED: &[&str] = &[
    "posit<16,1>",
    "posit<16,2>",
    "posit<16,0>",
    "posit<12,1>",
    "posit<8,0>",
    "posit<10,2>",
    "posit<17,0>",
    "posit<9,3>",
    "posit<12,2>",
];

fn posit(s: &str) -> Posit {
    match s.parse::<Format>().expect("a format") {
        Format::Posit(p) => p,
        other => panic!("{s} is {other:?}"),
    }
}

/// The definition on doubled values: `2 · round(y / 2)` (halving and doubling are exact).
fn doubled_round(p: Posit, y: f64) -> f32 {
    (2.0 * Format::Posit(p).round(y / 2.0, Rounding::NearestEven, 0)) as f32
}

/// The number of fraction bits of the binade `2^e` of `p` (negative where exponent bits
/// are cut), from the encoding: `rl(k) = max(k + 2, 1 - k)` regime bits, `k = ⌊e / 2^es⌋`.
fn fraction_bits(p: Posit, e: i32) -> i32 {
    let k = e >> p.es();
    let rl = if k >= 0 { k + 2 } else { 1 - k };
    p.n() as i32 - 1 - rl - p.es() as i32
}

#[test]
fn every_claimed_binade_rounds_as_the_posit() {
    for name in ADMITTED {
        let p = posit(name);
        let m = PositMagic::new(&p).unwrap_or_else(|| panic!("{name}: no form"));
        // The finest grid of the posit, and two more bits: grid points, midpoints and
        // quarter points.
        let fb_max = p.n() as i32 - 3 - p.es() as i32;
        let step = 1u32 << (23 - fb_max - 2);
        let mut claimed = 0;
        for field in 1..255u32 {
            // A doubled value's binade is e + 1 for the posit's binade e.
            let e = field as i32 - 128;
            let in_posit_range = e.abs() <= p.max_scale();
            let claims = m.in_range(field << 23);
            assert_eq!(
                claims,
                in_posit_range && fraction_bits(p, e) >= 1,
                "{name}: binade 2^{e} of the posit"
            );
            if !claims {
                continue;
            }
            claimed += 1;
            for frac in (0..1u32 << 23).step_by(step as usize) {
                for delta in [-1i32, 0, 1] {
                    let bits = (field << 23) | frac.wrapping_add_signed(delta) & 0x7f_ffff;
                    for sign in [0, 0x8000_0000] {
                        let y = f32::from_bits(bits | sign);
                        let got = m
                            .round(y)
                            .unwrap_or_else(|| panic!("{name}: {y:e} refused"));
                        let want = doubled_round(p, f64::from(y));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{name}: doubled {y:e} ({:#010x}) gives {got:e}, the posit {want:e}",
                            y.to_bits()
                        );
                    }
                }
            }
        }
        assert!(claimed >= 4, "{name}: {claimed} binades");
        // Zero (either sign) is claimed and rounds to +0.
        for z in [0.0f32, -0.0] {
            assert_eq!(m.round(z).map(f32::to_bits), Some(0), "{name}: {z}");
        }
    }
}

#[test]
fn products_round_as_the_posit() {
    for name in ADMITTED {
        let p = posit(name);
        let f = Format::Posit(p);
        let m = PositMagic::new(&p).expect("a form");
        let mut rng = SplitMix(17);
        let mut value = |scale: f64| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let v = (2.0 * u - 1.0) * scale.powf(2.0 * u - 1.0);
            f.round(v, Rounding::NearestEven, 0)
        };
        let mut checked = 0;
        for i in 0..200_000 {
            let scale = [16.0, 4096.0, 1e6][i % 3];
            let (x, y) = (value(scale), value(scale));
            // x doubled, as the kernel holds it; the exact product in f64 (at most 36 bits).
            let (x2, y32) = (2.0 * x as f32, y as f32);
            let want = doubled_round(p, 2.0 * x * y);
            match m.mul(x2, y32) {
                Some(got) => {
                    checked += 1;
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{name}: {x:e} · {y:e} gives {:e}, the posit {:e}",
                        got / 2.0,
                        want / 2.0
                    );
                }
                // Refused only where the f32 product lies in a binade without a fraction
                // bit (its exponent field less 128 is the posit's binade) or is not zero.
                None => {
                    let field = ((x2 * y32).to_bits() >> 23 & 0xff) as i32;
                    let e = field - 128;
                    assert!(
                        field != 0 && (fraction_bits(p, e) < 1 || e.abs() > p.max_scale()),
                        "{name}: {x:e} · {y:e} refused in binade 2^{e}"
                    );
                }
            }
        }
        assert!(checked > 100_000, "{name}: {checked} products in range");
    }
}

/// Products next to a midpoint of posit<16,1> near 1: `x = 1 + i/4096`, `y = 1 + j/4096`
/// with `4096² x y` one unit from an odd multiple of `2^11`: the f32 product is the
/// midpoint itself, and only the fused addition of `M` sees the unit.
#[test]
fn products_one_unit_from_a_midpoint_round_as_the_posit() {
    let p = posit("posit<16,1>");
    let m = PositMagic::new(&p).expect("a form");
    let mut found = 0;
    for i in 1..4096u64 {
        for j in 1..4096u64 {
            let q = (4096 + i) * (4096 + j);
            if q >= 1 << 25 || !matches!(q % (1 << 12), 2047 | 2049) {
                continue;
            }
            let (x, y) = (1.0 + i as f64 / 4096.0, 1.0 + j as f64 / 4096.0);
            let got = m.mul(2.0 * x as f32, y as f32).expect("in range");
            let want = doubled_round(p, 2.0 * x * y);
            assert_eq!(got.to_bits(), want.to_bits(), "{x} · {y}");
            found += 1;
        }
    }
    assert!(found > 1000, "{found} pairs");
}

#[test]
fn posits_without_the_form_are_refused() {
    for name in [
        "posit<18,1>",
        "posit<32,2>",
        "posit<5,2>",
        "posit<16,5>",
        "posit<14,3>",
    ] {
        assert!(PositMagic::new(&posit(name)).is_none(), "{name}");
    }
}
