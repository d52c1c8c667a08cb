//! softposit as an oracle for the quire and the naive GEMMs: its quires agree with ours
//! where they are exact (`Q8E0` below 2^19, `Q16E1` on random long vectors and every
//! boundary sum) and their wraps are pinned (Q8E0 at 2^19, Q16E1 at 2^71, where our quire
//! gives maxpos); `P16E1` addition and multiplication are correctly rounded (checked against
//! the exact reference) and `PxE1<16>` arithmetic is wrong, pinned, so the naive tests use
//! the former.

mod common;
#[path = "common/exact.rs"]
mod exact;

use common::reference::two_pow;
use common::{Mismatches, SplitMix};
use exact::{apply, p, ref_odd, Draw, Ref, Term};

use num_bigint::BigInt;
use num_traits::{One, Signed, Zero};
use qcandle::quire::Quire;
use softposit::{PxE1, P16E1, P8E0, Q16E1, Q8E0};

/// softposit's Q8E0 (an i32 holding value · 2^12) agrees with our quire bit for bit on random
/// vectors whose partial sums all stay below 2^19 in magnitude.
#[test]
fn softposit_q8e0_agrees_while_the_sum_stays_below_2_pow_19() {
    let r = Ref::new(8, 0);
    let mut rng = SplitMix(1100);
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
    let mut rng = SplitMix(1200);
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
    let mut rng = SplitMix(1400);
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
