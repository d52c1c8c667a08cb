//! The scalar reference of one GEMM under an `accumulate` rule (`tests/accumulate_layers.rs`
//! describes it): every operation computed exactly with big integers (`common/exact.rs`),
//! narrowed to an f64 rounded to odd and rounded with the format's scalar `Format::round`
//! (nearest even), zero results with IEEE signs; LNS sums and products are `LnsArith`'s
//! scalar operations, one at a time. The including test declares `exact` at its root.

#![allow(dead_code)] // each test uses part of it

use crate::exact::{f64_units, ref_odd};
use num_bigint::BigInt;
use num_traits::Zero;
use qcandle::format::rounding::NearestEven;
use qcandle::lns::{GaussLog, LnsArith, LnsValue};
use qcandle::Format;

/// One GEMM's arithmetic, as the reference computes it.
pub enum Arith {
    Quire(Format),
    Naive(Format),
    NaiveSum(Format, Format),
    Fma(Format, Format),
    Lns(LnsArith, Format),
}

pub fn fmt(s: &str) -> Format {
    match s {
        "fp32" => Format::float(8, 23).expect("binary32"),
        _ => s.parse().expect("a format"),
    }
}

impl Arith {
    /// The reference arithmetic of `setting` for a GEMM in `f` (parsed here, independently).
    pub fn new(setting: &str, f: Format) -> Arith {
        if setting == "quire" {
            Arith::Quire(f)
        } else if setting == "naive" {
            Arith::Naive(f)
        } else if let Some(a) = setting.strip_prefix("naive:") {
            Arith::NaiveSum(f, fmt(a))
        } else if let Some(a) = setting.strip_prefix("fma:") {
            Arith::Fma(f, fmt(a))
        } else if let Some(imp) = setting.strip_prefix("lns:") {
            let Format::Lns(l) = f else {
                panic!("lns rules take lns formats")
            };
            let gauss = match imp {
                "ideal" => GaussLog::Ideal,
                "truncated" => GaussLog::Truncated,
                "table" => GaussLog::Table {
                    grid_bits: l.f().saturating_sub(5) / 2,
                    guard_bits: 0,
                },
                other => panic!("unknown lns rule {other}"),
            };
            Arith::Lns(LnsArith::new(l, gauss).expect("lns arithmetic"), f)
        } else {
            panic!("unknown setting {setting}")
        }
    }

    pub fn format(&self) -> Format {
        match self {
            Arith::Quire(f) | Arith::Naive(f) | Arith::NaiveSum(f, _) | Arith::Fma(f, _) => *f,
            Arith::Lns(_, f) => *f,
        }
    }

    /// An operand: the tensor's f32 rounded to the GEMM's format.
    pub fn operand(&self, x: f32) -> f64 {
        self.format()
            .round(x as f64, qcandle::Rounding::NearestEven, 0)
    }

    /// The dot product of `terms` (in order) plus `bias` last, as the rule computes it.
    pub fn dot(&self, terms: &[(f64, f64)], bias: Option<f64>) -> f64 {
        let round = |f: &Format, x: f64| f.round_rule(x, NearestEven, 0);
        match self {
            Arith::Quire(f) => {
                let mut sum = BigInt::zero();
                for &(a, b) in terms {
                    sum += f64_units(a) * f64_units(b);
                }
                if let Some(v) = bias {
                    sum += f64_units(v) << 1074usize;
                }
                round(f, exact_value(&sum, 2148))
            }
            Arith::Naive(f) => {
                let mut s = 0.0;
                for &(a, b) in terms {
                    s = round(f, exact_sum(s, round(f, exact_product(a, b))));
                }
                if let Some(v) = bias {
                    s = round(f, exact_sum(s, v));
                }
                s
            }
            Arith::NaiveSum(f, acc) => {
                let mut s = 0.0;
                for &(a, b) in terms {
                    s = round(acc, exact_sum(s, round(f, exact_product(a, b))));
                }
                if let Some(v) = bias {
                    s = round(acc, exact_sum(s, v));
                }
                round(f, s)
            }
            Arith::Fma(f, acc) => {
                let mut s = 0.0;
                for &(a, b) in terms {
                    s = round(acc, exact_fma(s, a, b));
                }
                if let Some(v) = bias {
                    s = round(acc, exact_sum(s, v));
                }
                round(f, s)
            }
            Arith::Lns(arith, f) => {
                let Format::Lns(l) = f else { unreachable!() };
                let code = |v: f64| LnsValue::nearest(*l, v);
                let mut c = LnsValue::Zero;
                for &(a, b) in terms {
                    c = arith.add(c, arith.mul(code(a), code(b)));
                }
                if let Some(v) = bias {
                    c = arith.add(c, code(v));
                }
                c.to_f64(*l)
            }
        }
    }
}

/// The exact `x · 2^-u` as an f64 rounded to odd (a zero is +0).
pub fn exact_value(x: &BigInt, u: u32) -> f64 {
    if x.is_zero() {
        0.0
    } else {
        ref_odd(x, u)
    }
}

/// `a · b` exactly, rounded to odd; a zero product has the XOR of the signs.
pub fn exact_product(a: f64, b: f64) -> f64 {
    if a == 0.0 || b == 0.0 {
        return a * b;
    }
    exact_value(&(f64_units(a) * f64_units(b)), 2148)
}

/// `x + y` exactly, rounded to odd; two zeros keep a shared sign, a cancellation is +0.
pub fn exact_sum(x: f64, y: f64) -> f64 {
    if x == 0.0 && y == 0.0 {
        return x + y;
    }
    exact_value(&(f64_units(x) + f64_units(y)), 1074)
}

/// `s + a · b` exactly, rounded to odd (IEEE signs for a zero result).
pub fn exact_fma(s: f64, a: f64, b: f64) -> f64 {
    let p = f64_units(a) * f64_units(b) + (f64_units(s) << 1074usize);
    if p.is_zero() {
        return s + a * b;
    }
    exact_value(&p, 2148)
}
