//! [`Quire`] against the exact reference, bit for bit, through every entry point and every
//! accessor: random vectors, massive cancellation, minpos²/maxpos² terms, 100k-term vectors,
//! every (n+1)-bit boundary (ties) of every format with n <= 16 and one minpos² either side,
//! every 8-bit product and every 6-bit fused a·b + c, off-grid operands and NaR; for
//! posit<8,0>, <8,1>, <8,2>, <16,1>, <16,2>, the odd ones <6,0>, <10,1>, <12,3>, <16,5> (the
//! widest supported, maxpos = 2^448) and <32,2>. Mismatches are collected (count and first
//! few) rather than stopping at the first one.

mod common;
#[path = "common/exact.rs"]
mod exact;

use common::reference::two_pow;
use common::{Mismatches, SplitMix};
use exact::{apply, ref_odd, same, Draw, Ref, Term};

use num_bigint::BigInt;
use num_traits::Zero;
use qcandle::quire::Quire;

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

/// Patterns to test neighbours of: every positive pattern below maxpos for n <= 16, else
/// both ends of the range and a random sample.
fn tie_patterns(r: &Ref, rng: &mut SplitMix) -> Vec<u32> {
    let maxp = r.maxp();
    if r.n <= 16 {
        return (1..maxp).collect();
    }
    let mut ps: Vec<u32> = (1..40).chain(maxp - 40..maxp).collect();
    ps.extend((0..400).map(|_| 1 + rng.below(maxp as u64 - 1) as u32));
    ps
}

/// One call on a quire with an f64 argument.
type QuireOp = fn(&mut Quire, f64);

/// Random vectors of every length from 1 to 2000 (mostly short), through every entry point
/// of the quire, checked after random prefixes and at the end.
#[test]
fn quire_matches_exact_reference_on_random_vectors() {
    let mut all = Mismatches::default();
    let mut checks = 0u64;
    for (fi, &(n, es)) in QUIRE_FORMATS.iter().enumerate() {
        let r = Ref::new(n, es);
        let mut rng = SplitMix(100 + fi as u64);
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
        let mut rng = SplitMix(200 + fi as u64);
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
        let mut rng = SplitMix(300 + fi as u64);
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

/// Sums exactly at the boundary between neighbouring patterns p and p + 1 (the (n+1)-bit
/// pattern `(p << 1) | 1`) round to the even one; one minpos² below or above goes to p or
/// p + 1. Positive and negative, in the uniform and the cut-exponent zones.
#[test]
fn quire_rounds_sums_at_n_plus_1_bit_boundaries_ties_to_even() {
    let mut mm = Mismatches::default();
    let mut checks = 0;
    for (fi, &(n, es)) in QUIRE_FORMATS.iter().enumerate() {
        let r = Ref::new(n, es);
        let mut rng = SplitMix(400 + fi as u64);
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
    let mut rng = SplitMix(500);
    for &(n, es) in &[(8, 0), (8, 2), (16, 1), (12, 3)] {
        let r = Ref::new(n, es);
        for i in 0..300 {
            let e = rng.below(2 * r.s as u64 + 8) as i32 - r.s as i32 - 4;
            let f = |rng: &mut SplitMix| {
                let m = 1.0 + (rng.next_u64() >> 11) as f64 / two_pow(53);
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
