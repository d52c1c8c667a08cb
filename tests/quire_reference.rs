//! The exact posit reference that the quire tests trust, checked first: its decoder equals
//! softposit's exact decoders (`to_f64`) on every pattern of P8E0, P16E1, PxE1<3..=16> and
//! PxE2<4..=16>, and its rounding (the standard's rule, by exact comparison with the
//! (n+1)-bit boundaries) equals softposit's exact conversions and reproduces the named facts
//! of docs/ORACLES.md.
//!
//! The reference itself (tests/common/exact.rs) shares no code with src/: it decodes posit
//! patterns by the standard's definition, holds every value and every dot product as a big
//! integer in units of minpos² (num-bigint), and rounds an exact value to a pattern by
//! finding the neighbouring patterns p, p + 1 and comparing with the value of the (n+1)-bit
//! pattern `(p << 1) | 1`; ties go to the even pattern; |x| > maxpos gives maxpos,
//! 0 < |x| < minpos gives minpos.

mod common;
#[path = "common/exact.rs"]
mod exact;

use common::reference::{posit_value, two_pow};
use common::{Mismatches, SplitMix};
use exact::{same, Ref};

use softposit::{PxE1, PxE2, P16E1, P8E0};

macro_rules! decoder_vs_pxe {
    ($mm:expr, $ty:ident, $es:expr, $($n:literal),*) => {$(
        for p in 0..1u32 << $n {
            let want = $ty::<$n>::from_bits(p << (32 - $n)).to_f64();
            let got = posit_value(p as u64, $n, $es);
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
        let (got, want) = (posit_value(p as u64, 8, 0), P8E0::from_bits(p).to_f64());
        mm.check(same(got, want), || {
            format!("P8E0 {p:#x}: {got:e} vs {want:e}")
        });
    }
    for p in 0..=u16::MAX {
        let (got, want) = (posit_value(p as u64, 16, 1), P16E1::from_bits(p).to_f64());
        mm.check(same(got, want), || {
            format!("P16E1 {p:#x}: {got:e} vs {want:e}")
        });
    }
    decoder_vs_pxe!(mm, PxE1, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    decoder_vs_pxe!(mm, PxE2, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    mm.assert_none("reference decoder vs softposit");
}

/// The reference rounding equals softposit's exact conversions (P8E0, PxE1<N>, PxE2<N>) on
/// random f64 inputs, and reproduces the named facts of docs/ORACLES.md.
#[test]
fn reference_rounding_matches_softposit_conversions_and_oracle_facts() {
    let mut mm = Mismatches::default();
    let mut rng = SplitMix(1);
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
        let m = (rng.next_u64() >> 11) as f64 / two_pow(53) + 1.0;
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

    // docs/ORACLES.md: geometric boundaries where exponent bits are cut off.
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
