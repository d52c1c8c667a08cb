//! Testing policy: the MX and NVFP4 formats are checked against a slow exact reference
//! that shares no code with `src/format`. Element values are decoded from every code by the
//! formula of the specification (exponent and mantissa fields); blocks are formed from
//! explicit multi-indices; the scale exponent `floor(log2 amax)` is found by comparing with
//! powers of two; and an element is rounded by choosing among the decoded values with exact
//! big-integer comparisons (nearest by distance, ties to the even code or away; toward zero:
//! the largest value not above; stochastic: the exact distance ratio truncated to the random
//! bits). NVFP4's scales are chosen the same way among the f32 and E4M3 values around the
//! exact quotients. Results are compared bit for bit (NaN matches NaN, the sign of zero
//! counts).

mod common;
use common::{Mismatches, SplitMix};

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use num_bigint::BigInt;
use qcandle::format::mx::MxElement;
use qcandle::philox::Stream;
use qcandle::{quantize, Format, Quant, Rounding};

// ---------------------------------------------------------------------------------------
// The exact reference
// ---------------------------------------------------------------------------------------

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Exact 2^q, subnormal powers included (from the bit pattern).
fn exp2(q: i32) -> f64 {
    assert!((-1074..=1023).contains(&q), "2^{q} is not an f64");
    if q >= -1022 {
        f64::from_bits(((q + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (q + 1074))
    }
}

/// `x · 2^1200` as an exact integer (every finite f64 is a multiple of 2^-1074).
fn big(x: f64) -> BigInt {
    let bits = x.abs().to_bits();
    let biased = (bits >> 52) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    let (m, e) = if biased == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), biased - 1075)
    };
    let v = BigInt::from(m) << ((e + 1200) as usize);
    if x < 0.0 {
        -v
    } else {
        v
    }
}

/// `floor(log2 a)` for a positive finite `a`, by comparison with powers of two.
fn floor_log2(a: f64) -> i32 {
    let mut k = 0;
    while exp2(k) > a {
        k -= 1;
    }
    while k < 1023 && exp2(k + 1) <= a {
        k += 1;
    }
    k
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Even,
    Away,
    Zero,
    Sr(u32),
}

impl Mode {
    fn rounding(self) -> Rounding {
        match self {
            Mode::Even => Rounding::NearestEven,
            Mode::Away => Rounding::NearestAway,
            Mode::Zero => Rounding::TowardZero,
            Mode::Sr(bits) => Rounding::Stochastic { bits },
        }
    }
}

const MODES: [Mode; 5] = [
    Mode::Even,
    Mode::Away,
    Mode::Zero,
    Mode::Sr(23),
    Mode::Sr(4),
];

/// An element type decoded from its codes: the nonnegative values with their codes,
/// ascending, and whether zero is signed.
struct Elements {
    values: Vec<(u32, f64)>,
    signed_zero: bool,
}

impl Elements {
    /// FP elements with `e` exponent and `m` mantissa bits; `skip` tells the codes that are
    /// not finite values (NaN/Inf patterns).
    fn fp(e: u32, m: u32, skip: impl Fn(u32, u32) -> bool) -> Self {
        let bias = (1i32 << (e - 1)) - 1;
        let mut values = Vec::new();
        for code in 0..(1u32 << (e + m)) {
            let (ef, mf) = (code >> m, code & ((1 << m) - 1));
            if skip(ef, mf) {
                continue;
            }
            let v = if ef == 0 {
                mf as f64 * exp2(1 - bias - m as i32)
            } else {
                ((1u32 << m) + mf) as f64 * exp2(ef as i32 - bias - m as i32)
            };
            values.push((code, v));
        }
        values.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
        Elements {
            values,
            signed_zero: true,
        }
    }

    fn of(name: &str) -> Self {
        match name {
            "mxfp8_e4m3" => Self::fp(4, 3, |e, m| e == 15 && m == 7),
            "mxfp8_e5m2" => Self::fp(5, 2, |e, _| e == 31),
            "mxfp6_e3m2" => Self::fp(3, 2, |_, _| false),
            "mxfp6_e2m3" => Self::fp(2, 3, |_, _| false),
            "mxfp4_e2m1" | "nvfp4" => Self::fp(2, 1, |_, _| false),
            // Two's complement with scale 2^-6, symmetric: codes 0..=127 and their negatives.
            "mxint8" => Elements {
                values: (0..128u32).map(|c| (c, c as f64 * exp2(-6))).collect(),
                signed_zero: false,
            },
            other => panic!("no element type {other}"),
        }
    }

    fn max(&self) -> f64 {
        self.values.last().unwrap().1
    }

    /// The binade of the largest value.
    fn emax(&self) -> i32 {
        floor_log2(self.max())
    }

    /// Rounds `x` to `values · scale` (`scale` a positive f64, the products exact) with
    /// `mode`: the exact choice among the values.
    fn round(&self, x: f64, scale: f64, mode: Mode, random: u32) -> f64 {
        if x.is_nan() {
            return f64::NAN;
        }
        let ax = big(x.abs());
        let scale_big = big(scale);
        let one = big(1.0);
        // value · scale as an integer at the scale of `ax` (both carry 2^1200).
        let at = |v: f64| big(v) * &scale_big / &one;
        let n = self.values.len();
        let lo_i = self.values.iter().rposition(|&(_, v)| at(v) <= ax).unwrap();
        let lo = &self.values[lo_i];
        let v = if at(lo.1) == ax || lo_i + 1 == n {
            lo.1
        } else {
            let hi = &self.values[lo_i + 1];
            let (l, h) = (at(lo.1), at(hi.1));
            match mode {
                Mode::Zero => lo.1,
                Mode::Even | Mode::Away => {
                    let twice = &ax * 2;
                    let sum = &l + &h;
                    // Above the midpoint, or on it when the tie goes to hi: away from
                    // zero, or hi's code is the even one.
                    let tie_up = mode == Mode::Away || hi.0.is_multiple_of(2);
                    if twice > sum || (twice == sum && tie_up) {
                        hi.1
                    } else {
                        lo.1
                    }
                }
                Mode::Sr(k) => {
                    let threshold = ((&ax - &l) << (k as usize)) / (&h - &l);
                    if BigInt::from(random >> (32 - k)) < threshold {
                        hi.1
                    } else {
                        lo.1
                    }
                }
            }
        };
        let v = v * scale;
        if x < 0.0 || (x == 0.0 && x.is_sign_negative()) {
            if v == 0.0 && !self.signed_zero {
                0.0
            } else {
                -v
            }
        } else {
            v
        }
    }
}

/// The blocks of a tensor of shape `dims`: groups of element indices that share a scale
/// (`size` consecutive elements along `dim`, the other coordinates equal), from explicit
/// multi-indices.
fn blocks(dims: &[usize], dim: i64, size: usize) -> Vec<Vec<usize>> {
    let dims: Vec<usize> = if dims.is_empty() {
        vec![1]
    } else {
        dims.to_vec()
    };
    let axis = if dim < 0 {
        (dim + dims.len() as i64) as usize
    } else {
        dim as usize
    };
    let n: usize = dims.iter().product();
    let mut groups: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
    for i in 0..n {
        let mut rest = i;
        let mut index = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            index[d] = rest % dims[d];
            rest /= dims[d];
        }
        index[axis] /= size;
        groups.entry(index).or_default().push(i);
    }
    let mut out: Vec<Vec<usize>> = groups.into_values().collect();
    out.sort();
    out
}

/// The reference MX rounding of a whole tensor (values in logical order).
fn mx_reference(
    name: &str,
    dim: i64,
    dims: &[usize],
    xs: &[f64],
    mode: Mode,
    seed: u64,
) -> Vec<f64> {
    let el = Elements::of(name);
    let stream = Stream::new(seed, 0);
    let mut out = vec![f64::NAN; xs.len()];
    for block in blocks(dims, dim, 32) {
        let scale = if block.iter().any(|&i| !xs[i].is_finite()) {
            None
        } else {
            let amax = block.iter().fold(0f64, |m, &i| m.max(xs[i].abs()));
            if amax == 0.0 {
                Some(-127)
            } else {
                let x = floor_log2(amax) - el.emax();
                (x <= 127).then_some(x.max(-127))
            }
        };
        for &i in &block {
            out[i] = match scale {
                None => f64::NAN,
                Some(e) => el.round(xs[i], exp2(e), mode, stream.at(i as u64)),
            };
        }
    }
    out
}

fn run(format: &str, mode: Mode, seed: u64, t: &Tensor) -> Tensor {
    let q = Quant::new(format.parse().unwrap())
        .with_rounding(mode.rounding())
        .with_seed(seed);
    quantize(t, &q).unwrap()
}

fn to_f64s(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Quantizes the f32 tensor of `xs` (shape `dims`) in every mode and compares with the
/// reference; also the f64 tensor of the same values.
fn check_mx(name: &str, dim: i64, dims: &[usize], xs: &[f64], bad: &mut Mismatches) -> u64 {
    let format = if dim == -1 {
        name.to_string()
    } else {
        format!("{name}<dim={dim}>")
    };
    let mut checked = 0;
    for dtype in [DType::F32, DType::F64] {
        let t = Tensor::from_slice(xs, dims, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let input = to_f64s(&t);
        for mode in MODES {
            let seed = 0x5eed ^ checked;
            let got = to_f64s(&run(&format, mode, seed, &t));
            let want = mx_reference(name, dim, dims, &input, mode, seed);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let w = if dtype == DType::F32 {
                    w as f32 as f64
                } else {
                    w
                };
                bad.check(same(g, w), || {
                    format!(
                        "{format} {dtype:?} {mode:?}: x[{i}] = {:e}: got {g:e}, want {w:e}",
                        input[i]
                    )
                });
                checked += 1;
            }
        }
    }
    checked
}

/// The six OCP MX element formats by name, in the order of `MxElement::ALL`.
fn mx_names() -> [&'static str; 6] {
    MxElement::ALL.map(MxElement::name)
}

/// Test values for a block of scale `2^x`: every element value, the midpoints between
/// neighbours (ties) and the f32 values just off them, both signs; in blocks of 32 whose
/// first element fixes the scale (the largest element value times 2^x).
fn boundary_blocks(el: &Elements, x: i32) -> Vec<f64> {
    let s = exp2(x);
    let mut vals = Vec::new();
    for w in el.values.windows(2) {
        let (a, b) = (w[0].1 * s, w[1].1 * s);
        let mid = 0.5 * (a + b);
        let m32 = mid as f32;
        for v in [
            a,
            mid,
            f32::from_bits(m32.to_bits() - 1) as f64,
            f32::from_bits(m32.to_bits() + 1) as f64,
        ] {
            vals.push(v);
            vals.push(-v);
        }
    }
    // Above the largest value: saturates.
    let top = exp2(el.emax() + 1 + x);
    vals.push(top * (1.0 - exp2(-20)));
    vals.push(-el.max() * s * 1.01);
    let mut out = Vec::new();
    for chunk in vals.chunks(31) {
        out.push(el.max() * s);
        out.extend_from_slice(chunk);
        out.resize(out.len().div_ceil(32) * 32, 0.0);
    }
    out
}

// ---------------------------------------------------------------------------------------
// MX: exhaustive boundaries, scales, special blocks
// ---------------------------------------------------------------------------------------

/// Every element value, every midpoint (tie) and the f32 values on either side of it, both
/// signs, for scales from the clamp at -127 to the largest an f32 block can have, in every
/// mode: the quantized tensor equals the exact reference bit for bit (f32 and f64 tensors).
#[test]
fn mx_every_code_tie_and_neighbour_matches_the_exact_reference() {
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for name in mx_names() {
        let el = Elements::of(name);
        let top = 127 - el.emax();
        for x in [-127, -120, -30, -1, 0, 3, 60, top] {
            let xs = boundary_blocks(&el, x);
            checked += check_mx(name, -1, &[xs.len() / 32, 32], &xs, &mut bad);
        }
    }
    bad.assert_none_of("MX boundaries", checked);
}

/// Random blocks of every magnitude, zeros, subnormal f32 inputs, and blocks whose
/// maximum sits at or just below a power of two, over odd shapes (a shorter last block).
#[test]
fn mx_random_blocks_and_odd_shapes_match_the_exact_reference() {
    let mut rng = SplitMix(7);
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for name in mx_names() {
        for (rows, cols) in [(3, 70), (1, 1), (2, 31), (5, 33), (4, 64)] {
            let mut xs = Vec::new();
            for r in 0..rows {
                let (lo, hi) = [(-150, -120), (-10, 10), (100, 127), (-149, -140), (0, 1)][r % 5];
                for c in 0..cols {
                    let v = match (r + c) % 7 {
                        0 => 0.0,
                        1 => -0.0,
                        2 => exp2(rng.below(20) as i32 - 5) * (1.0 - exp2(-24)),
                        3 => exp2(rng.below(20) as i32 - 5),
                        // Tiny beside the row's magnitudes: x · 2^-X is below f32's
                        // normal range (or zero) once scaled.
                        4 => rng.float_between(-149, -126),
                        _ => rng.float_between(lo, hi),
                    };
                    xs.push(v as f32 as f64);
                }
            }
            checked += check_mx(name, -1, &[rows, cols], &xs, &mut bad);
        }
    }
    bad.assert_none_of("MX random blocks", checked);
}

/// dim=0, dim=1 and negative dims on 3-D tensors: blocks along that axis.
#[test]
fn mx_blocks_along_other_axes_match_the_exact_reference() {
    let mut rng = SplitMix(11);
    let dims = [37, 3, 5];
    let n: usize = dims.iter().product();
    let xs: Vec<f64> = (0..n)
        .map(|i| rng.float_between(-20, 20) * if i % 13 == 0 { 1e3 } else { 1.0 })
        .map(|v| v as f32 as f64)
        .collect();
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for name in ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8"] {
        for dim in [0, 1, 2, -3, -2] {
            checked += check_mx(name, dim, &dims, &xs, &mut bad);
        }
        // 40 along dim 1: blocks of 32 and 8.
        let dims = [3, 40, 2];
        checked += check_mx(name, 1, &dims, &xs[..240], &mut bad);
    }
    bad.assert_none_of("MX blocks along other axes", checked);
}

/// NaN or ±Inf makes its block NaN (all elements), not the neighbouring blocks; an
/// all-zero block stays zeros (-0 kept by FP elements, +0 for int8); a block whose scale
/// would be above 127 is NaN; one below -127 is clamped.
#[test]
fn mx_special_blocks() {
    for name in mx_names() {
        let el = Elements::of(name);
        let mut xs = vec![1.5f32; 128];
        xs[3] = f32::NAN;
        xs[40] = f32::INFINITY;
        xs[70] = f32::NEG_INFINITY;
        for x in &mut xs[96..] {
            *x = 0.0;
        }
        xs[97] = -0.0;
        let t = Tensor::from_slice(&xs, 128, &Device::Cpu).unwrap();
        let y = run(name, Mode::Even, 0, &t).to_vec1::<f32>().unwrap();
        assert!(y[..96].iter().all(|v| v.is_nan()), "{name}: NaN/Inf blocks");
        assert!(y[96..].iter().all(|&v| v == 0.0), "{name}: zero block");
        assert_eq!(
            y[97].is_sign_negative(),
            el.signed_zero,
            "{name}: sign of -0"
        );
        // Above 127: an f64 block with amax 2^200 is NaN; 2^-1074 clamps to -127 and
        // rounds to 0 (far below the smallest element at that scale).
        let t = Tensor::new(&[exp2(200), 1.0, exp2(-1074), -exp2(-1070)], &Device::Cpu).unwrap();
        let t = t.reshape((4, 1)).unwrap();
        let y = to_f64s(&run(name, Mode::Even, 0, &t));
        assert!(y[0].is_nan() && y[1] == 1.0, "{name}: {y:?}");
        assert_eq!(y[2], 0.0, "{name}");
        assert!(
            y[3] == 0.0 && y[3].is_sign_negative() == el.signed_zero,
            "{name}"
        );
    }
}

/// Where microxcaling's f32 arithmetic departs from the exact rule (module docs of
/// `format::mx`), the exact rule is followed.
#[test]
fn mx_departures_from_microxcaling_follow_the_exact_rule() {
    // 1. 63.999996 = 64 - 2^-18: floor(log2) = 5, X = 5 - 8 = -3; 63.999996 · 8 = 511.99997
    //    saturates to 448, times 2^-3 is 56. (f32 log2 gives 6, X = -2, and 64.)
    let x = 64.0f32 - exp2(-18) as f32;
    let t = Tensor::new(&[x], &Device::Cpu).unwrap();
    assert_eq!(
        run("mxfp8_e4m3", Mode::Even, 0, &t)
            .to_vec1::<f32>()
            .unwrap(),
        [56.0]
    );
    // 2. Just below a tie: in a block of scale 2^0 (amax 1), mxint8 steps are 2^-6;
    //    (0.5 - 2^-25) · 2^-6 is below the tie between 0 and 2^-6, so it rounds to 0
    //    (f32's floor(0.49999997 + 0.5) rounds the sum up to 1 and gives 2^-6).
    let below = ((0.5 - exp2(-25)) * exp2(-6)) as f32;
    let t = Tensor::new(&[1.0f32, below, -below], &Device::Cpu).unwrap();
    for mode in [Mode::Even, Mode::Away] {
        assert_eq!(
            run("mxint8", mode, 0, &t).to_vec1::<f32>().unwrap(),
            [1.0, 0.0, 0.0]
        );
    }
    // And the tie itself: ties-to-even gives 0, ties-away 2^-6.
    let t = Tensor::new(&[1.0f32, exp2(-7) as f32], &Device::Cpu).unwrap();
    assert_eq!(
        run("mxint8", Mode::Even, 0, &t).to_vec1::<f32>().unwrap()[1],
        0.0
    );
    assert_eq!(
        run("mxint8", Mode::Away, 0, &t).to_vec1::<f32>().unwrap()[1],
        exp2(-6) as f32
    );
}

/// f16 and bf16 tensors: the result is the reference on the stored inputs, stored back
/// (exactly representable); also strided views and in-place rounding.
#[test]
fn mx_half_types_and_strided_views_agree_with_the_reference() {
    let mut rng = SplitMix(3);
    let xs: Vec<f32> = (0..6 * 40)
        .map(|_| rng.float_between(-12, 12) as f32)
        .collect();
    let t = Tensor::from_slice(&xs, (6, 40), &Device::Cpu).unwrap();
    let mut bad = Mismatches::default();
    for name in mx_names() {
        for dtype in [DType::F16, DType::BF16] {
            let th = t.to_dtype(dtype).unwrap();
            let input = to_f64s(&th);
            for mode in [Mode::Even, Mode::Zero, Mode::Sr(23)] {
                let got = run(name, mode, 9, &th);
                assert_eq!(got.dtype(), dtype);
                let got = to_f64s(&got);
                let want = mx_reference(name, -1, &[6, 40], &input, mode, 9);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    bad.check(same(g, w), || {
                        format!("{name} {dtype:?} {mode:?} [{i}]: {g:e} vs {w:e}")
                    });
                }
            }
        }
        // A transposed view rounds as its contiguous copy (blocks along its own last axis).
        let tt = t.t().unwrap();
        let a = to_f64s(&run(name, Mode::Even, 0, &tt));
        let b = to_f64s(&run(name, Mode::Even, 0, &tt.contiguous().unwrap()));
        bad.check(a == b, || format!("{name}: strided view"));
    }
    bad.assert_none("MX half types");
}

/// Empty tensors and scalars: no division by zero, a scalar is a block of one.
#[test]
fn mx_and_nvfp4_empty_tensors_and_scalars() {
    for name in mx_names()
        .iter()
        .copied()
        .chain(["nvfp4", "nvfp4<dim=0>", "mxint8<dim=0>"])
    {
        for dims in [vec![0usize], vec![0, 5], vec![3, 0], vec![0, 0, 0]] {
            let t = Tensor::zeros(dims.as_slice(), DType::F32, &Device::Cpu).unwrap();
            let y = run(name, Mode::Sr(23), 1, &t);
            assert_eq!(y.dims(), dims.as_slice(), "{name}");
        }
        let t = Tensor::new(3.0f32, &Device::Cpu).unwrap();
        let y = run(name, Mode::Even, 0, &t).to_scalar::<f32>().unwrap();
        let f: Format = name.parse().unwrap();
        assert_eq!(y, f.round(3.0, Rounding::NearestEven, 0) as f32, "{name}");
    }
    // A dim the tensor does not have is an error, not a panic.
    let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    let q = Quant::new("mxfp8_e4m3<dim=2>".parse().unwrap());
    assert!(quantize(&t, &q).unwrap_err().to_string().contains("dim=2"));
    let q = Quant::new("nvfp4<dim=-3>".parse().unwrap());
    assert!(quantize(&t, &q).is_err());
}

/// The mean of many stochastic roundings equals the input within 4 standard deviations
/// (every result one of the two neighbours), for every MX element type.
#[test]
fn mx_stochastic_rounding_is_unbiased() {
    const BLOCKS: usize = 1 << 15;
    for name in mx_names() {
        let el = Elements::of(name);
        let x = -0.37 * el.values[3].1 - 0.63 * el.values[4].1;
        let (lo, hi) = (-el.values[3].1, -el.values[4].1);
        let mut xs = vec![x as f32; BLOCKS * 32];
        for b in 0..BLOCKS {
            xs[b * 32] = el.max() as f32;
        }
        let t = Tensor::from_slice(&xs, xs.len(), &Device::Cpu).unwrap();
        let y = run(name, Mode::Sr(23), 42, &t).to_vec1::<f32>().unwrap();
        let samples: Vec<f64> = y
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 32 != 0)
            .map(|(_, &v)| v as f64)
            .collect();
        let x = x as f32 as f64;
        assert!(
            samples.iter().all(|&v| v == lo || v == hi),
            "{name}: not a neighbour"
        );
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let p = (x - lo) / (hi - lo);
        let sigma = (hi - lo).abs() * (p * (1.0 - p) / n).sqrt();
        assert!(
            (mean - x).abs() < 4.0 * sigma,
            "{name}: mean {mean} vs {x} ({sigma})"
        );
    }
}

// ---------------------------------------------------------------------------------------
// NVFP4
// ---------------------------------------------------------------------------------------

/// The f32 nearest to `a / d` (ties to the even pattern), by exact comparison of the f32
/// values around the f64 quotient.
fn nearest_f32_quotient(a: f64, d: f64) -> f64 {
    let c = (a / d) as f32;
    let mut best: Option<(BigInt, f32)> = None;
    for bits in [c.to_bits().saturating_sub(1), c.to_bits(), c.to_bits() + 1] {
        let v = f32::from_bits(bits);
        if !v.is_finite() {
            continue;
        }
        let dist = (big(v as f64) * big(d) / big(1.0) - big(a))
            .magnitude()
            .clone();
        let dist = BigInt::from(dist);
        let better = match &best {
            None => true,
            Some((bd, bv)) => dist < *bd || (dist == *bd && bits % 2 == 0 && bv.to_bits() % 2 == 1),
        };
        if better {
            best = Some((dist, v));
        }
    }
    best.unwrap().1 as f64
}

/// The reference NVFP4 rounding of a tensor (deterministic modes).
fn nvfp4_reference(dim: i64, dims: &[usize], xs: &[f64], mode: Mode) -> Vec<f64> {
    let e4m3 = Elements::of("mxfp8_e4m3");
    let e2m1 = Elements::of("nvfp4");
    let amax_t = xs
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
    let s_t = if amax_t == 0.0 {
        1.0
    } else {
        nearest_f32_quotient(amax_t, 2688.0).clamp(exp2(-149), f32::MAX as f64)
    };
    let mut out = vec![f64::NAN; xs.len()];
    for block in blocks(dims, dim, 16) {
        if block.iter().any(|&i| !xs[i].is_finite()) {
            continue;
        }
        let amax = block.iter().fold(0f64, |m, &i| m.max(xs[i].abs()));
        // The E4M3 value v nearest to amax / (6 s_t): round amax on the grid v · 6 s_t.
        let s_b = e4m3.round(amax, 6.0 * s_t, Mode::Even, 0) / (6.0 * s_t);
        for &i in &block {
            out[i] = if s_b == 0.0 {
                if xs[i].is_sign_negative() {
                    -0.0
                } else {
                    0.0
                }
            } else {
                e2m1.round(xs[i], s_b * s_t, mode, 0)
            };
        }
    }
    out
}

fn check_nvfp4(dim: i64, dims: &[usize], xs: &[f64], bad: &mut Mismatches) -> u64 {
    let format = if dim == -1 {
        "nvfp4".to_string()
    } else {
        format!("nvfp4<dim={dim}>")
    };
    let mut checked = 0;
    for dtype in [DType::F32, DType::F64] {
        let t = Tensor::from_slice(xs, dims, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let input = to_f64s(&t);
        for mode in [Mode::Even, Mode::Away, Mode::Zero] {
            let got = to_f64s(&run(&format, mode, 0, &t));
            let want = nvfp4_reference(dim, dims, &input, mode);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let w = if dtype == DType::F32 {
                    w as f32 as f64
                } else {
                    w
                };
                bad.check(same(g, w), || {
                    format!(
                        "{format} {dtype:?} {mode:?}: x[{i}] = {:e}: got {g:e}, want {w:e}",
                        input[i]
                    )
                });
                checked += 1;
            }
        }
    }
    checked
}

/// Random tensors of many magnitudes, with ties of the element grid built from the scales
/// the reference chooses, zeros, and a NaN/Inf block: the exact reference, bit for bit.
#[test]
fn nvfp4_matches_the_exact_reference() {
    let mut rng = SplitMix(5);
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for (lo, hi) in [(-3, 3), (-40, 40), (-140, -120), (100, 126)] {
        let mut xs: Vec<f64> = (0..16 * 24)
            .map(|_| rng.float_between(lo, hi) as f32 as f64)
            .collect();
        for v in &mut xs[16..32] {
            *v = 0.0;
        }
        checked += check_nvfp4(-1, &[24, 16], &xs, &mut bad);
        checked += check_nvfp4(0, &[16, 24], &xs, &mut bad);
        checked += check_nvfp4(-1, &[8, 48], &xs, &mut bad);
        checked += check_nvfp4(1, &[3, 37, 2], &xs[..222], &mut bad);
        // One NaN and one Inf block.
        let mut special = xs.clone();
        special[40] = f64::NAN;
        special[70] = f64::NEG_INFINITY;
        checked += check_nvfp4(-1, &[24, 16], &special, &mut bad);
    }
    // Ties: blocks whose elements are exact midpoints of the e2m1 grid of their scales
    // (amax 6 · s_b · s_t with s_t = 1 / 2688 rounded to f32, s_b on the e4m3 grid).
    let s_t = nearest_f32_quotient(6.0 * 448.0, 2688.0);
    assert_eq!(s_t, 1.0);
    let mut xs = Vec::new();
    for s_b in [448.0, 1.0, 0.5, 0.125, 13.0, exp2(-9)] {
        let d = s_b * s_t;
        let mut block = vec![6.0 * d];
        for m in [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] {
            block.push(m * d);
            block.push(-m * d);
        }
        block.push(-6.0 * d);
        xs.extend(block);
    }
    xs[0] = 6.0 * 448.0;
    checked += check_nvfp4(-1, &[xs.len() / 16, 16], &xs, &mut bad);
    bad.assert_none_of("NVFP4", checked);
}

/// The scales: tensor scale amax / 2688 rounded to f32 (1 for a zero tensor), block
/// scales saturating at 448 and 0 for a block far below the tensor's maximum, whose
/// elements are then ±0.
#[test]
fn nvfp4_scales_and_zero_blocks() {
    use qcandle::format::Nvfp4;
    assert_eq!(Nvfp4::tensor_scale(0.0), 1.0);
    assert_eq!(Nvfp4::tensor_scale(2688.0), 1.0);
    assert_eq!(Nvfp4::tensor_scale(1.0), nearest_f32_quotient(1.0, 2688.0));
    assert_eq!(Nvfp4::tensor_scale(exp2(-149)), exp2(-149));
    assert_eq!(Nvfp4::tensor_scale(1e300), f32::MAX as f64);
    assert_eq!(Nvfp4::block_scale(2688.0, 1.0), 448.0);
    assert_eq!(Nvfp4::block_scale(6.0, 1.0), 1.0);
    assert_eq!(Nvfp4::block_scale(6.0 * exp2(-11), 1.0), 0.0);
    assert!(Nvfp4::block_scale(f64::NAN, 1.0).is_nan());
    // Under s_t = 1, a block of maximum 2^-9 has the quotient 2^-9 / 6, below half the
    // smallest E4M3 subnormal (2^-10): scale 0, and its elements are ±0.
    let mut xs = vec![2688.0f32; 16];
    xs.extend([exp2(-9) as f32, -(exp2(-9) as f32)].repeat(8));
    let t = Tensor::from_slice(&xs, (2, 16), &Device::Cpu).unwrap();
    let y = run("nvfp4", Mode::Even, 0, &t)
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(&y[..16], &[2688.0; 16]);
    assert!(y[16..].iter().all(|&v| v == 0.0));
    assert!(y[17].is_sign_negative());
    // An all-zero tensor stays zeros.
    let t = Tensor::zeros(33, DType::F32, &Device::Cpu).unwrap();
    assert!(run("nvfp4", Mode::Even, 0, &t)
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));
}

/// Stochastic NVFP4: every result is one of the two neighbours and the mean equals the
/// input within 4 standard deviations.
#[test]
fn nvfp4_stochastic_rounding_is_unbiased() {
    const BLOCKS: usize = 1 << 15;
    // Tensor and block maximum 6 · 448 · s_t with s_t = 1: element grid at scale 448.
    let x = 2.3 * 448.0;
    let (lo, hi) = (2.0 * 448.0, 3.0 * 448.0);
    let mut xs = vec![x as f32; BLOCKS * 16];
    for b in 0..BLOCKS {
        xs[b * 16] = 2688.0;
    }
    let t = Tensor::from_slice(&xs, xs.len(), &Device::Cpu).unwrap();
    let y = run("nvfp4", Mode::Sr(23), 8, &t).to_vec1::<f32>().unwrap();
    let samples: Vec<f64> = y
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 16 != 0)
        .map(|(_, &v)| v as f64)
        .collect();
    assert!(samples.iter().all(|&v| v == lo || v == hi));
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let p = (x - lo) / (hi - lo);
    let sigma = (hi - lo) * (p * (1.0 - p) / n).sqrt();
    assert!((mean - x).abs() < 4.0 * sigma, "mean {mean} vs {x}");
}

// ---------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------

/// Every MX and NVFP4 spelling displays canonically and parses back; bad options are
/// clear errors.
#[test]
fn names_round_trip_and_bad_options_are_errors() {
    for name in mx_names().iter().chain(&["nvfp4"]) {
        for spelling in [
            name.to_string(),
            format!("{name}<dim=0>"),
            format!("{name}<dim=-2>"),
        ] {
            let f: Format = spelling.parse().unwrap();
            assert_eq!(f.to_string(), spelling);
            assert_eq!(f.to_string().parse::<Format>().unwrap(), f);
            assert_eq!(f.max_finite(), None);
        }
        let f: Format = format!("{name}<dim=-1>").parse().unwrap();
        assert_eq!(f.to_string(), *name);
        for bad in [
            format!("{name}<dim=x>"),
            format!("{name}<4>"),
            format!("{name}<dim=0"),
        ] {
            let e = bad.parse::<Format>().unwrap_err().to_string();
            assert!(e.contains(&bad), "{e}");
        }
    }
    let bits: Vec<u32> = mx_names()
        .iter()
        .map(|n| n.parse::<Format>().unwrap().bits())
        .collect();
    assert_eq!(bits, [8, 8, 6, 6, 4, 8]);
    assert_eq!("nvfp4".parse::<Format>().unwrap().bits(), 4);
    let presets: Vec<&str> = Format::presets().iter().map(|p| p.0).collect();
    for name in mx_names().iter().chain(&["nvfp4"]) {
        assert!(presets.contains(name), "{name} is a preset");
    }
}
