//! The f32 fast paths of MX and NVFP4 (`backend::mx_plan`, `backend::nvfp4_plan` and the
//! CPU kernels that run them) must give the bits of the scalar rules of `format::mx` and
//! `format::nvfp4` (which `tests/mx_oracle.rs` checks against an exact reference), in every
//! rounding mode, stochastic included (same seed, same stream word per element).
//!
//! Covered: the MX lane step for every exponent byte of the block maximum (every scale) and
//! every input exponent byte, with mantissas on, just below and just above every rounding
//! position; the NVFP4 thresholds and block-scale search around every E4M3 midpoint; and
//! whole tensors through the kernel (compiled for AVX-512 or AVX2 where the CPU has them):
//! every element code and midpoint with its f32 neighbours under many scales, subnormal
//! inputs, NaN, ±Inf and zero blocks, rows whose last block is short, blocks along other
//! axes (MX: tiles of zero, NaN, Inf and subnormal blocks and maxima on and around powers of
//! two, with short last blocks and leftover columns), tensors of several chunks, from a separate input and in place, and f64 tensors
//! (which keep the general path) against the same rule.

mod common;
use common::{Mismatches, SplitMix};
#[path = "common/strided_mx.rs"]
mod strided_mx;
use strided_mx::mx_names;
use strided_mx::{strided_tensor, STRIDED_SHAPES};

use qcandle::backend::cpu::quantize_slice;
use qcandle::backend::mx_plan::{mag_bits, MxF32Plan};
use qcandle::backend::nvfp4_plan::{threshold, Nvfp4F32Plan, Nvfp4Scales, NAN_ROW};
use qcandle::format::mx::{ElementFormat, MxElement, MxGrid};
use qcandle::format::nvfp4::e4m3_saturating;
use qcandle::format::rounding::{NearestAway, NearestEven, RoundingRule, Stochastic, TowardZero};
use qcandle::format::{Mx, Nvfp4};
use qcandle::philox::Stream;
use qcandle::{Format, Rounding};

const MODES: [Rounding; 5] = [
    Rounding::NearestEven,
    Rounding::NearestAway,
    Rounding::TowardZero,
    Rounding::Stochastic { bits: 23 },
    Rounding::Stochastic { bits: 4 },
];

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
}

/// Calls `f` with the rule type of `mode`.
macro_rules! with_rule {
    ($mode:expr, $f:ident ( $($arg:expr),* )) => {
        match $mode {
            Rounding::NearestEven => $f($($arg,)* NearestEven),
            Rounding::NearestAway => $f($($arg,)* NearestAway),
            Rounding::TowardZero => $f($($arg,)* TowardZero),
            Rounding::Stochastic { bits } => $f($($arg,)* Stochastic { bits }),
        }
    };
}

// ---------------------------------------------------------------------------------------
// The scalar rules, element by element
// ---------------------------------------------------------------------------------------

/// Largest magnitude of every block (NaN and ±Inf as +Inf), element by element.
fn block_amax(xs: &[f64], grid: &MxGrid) -> Vec<f64> {
    let mut amax = vec![0f64; grid.count()];
    for (i, &x) in xs.iter().enumerate() {
        let b = grid.block_of(i);
        let m = if x.is_finite() {
            x.abs()
        } else {
            f64::INFINITY
        };
        amax[b] = amax[b].max(m);
    }
    amax
}

/// MX by the scalar rule of `format::mx`: every element with its block's scale.
fn mx_scalar<R: RoundingRule>(
    mx: &Mx,
    dims: &[usize],
    xs: &[f64],
    stream: Stream,
    rule: R,
) -> Vec<f64> {
    let grid = MxGrid::new(32, mx.dim(), dims, "mx").unwrap();
    let amax = block_amax(xs, &grid);
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let scale = mx.scale_exponent(amax[grid.block_of(i)]);
            mx.round(x, scale, rule, stream.at(i as u64))
        })
        .collect()
}

/// NVFP4 by the scalar rule of `format::nvfp4`.
fn nvfp4_scalar<R: RoundingRule>(
    nv: &Nvfp4,
    dims: &[usize],
    xs: &[f64],
    stream: Stream,
    rule: R,
) -> Vec<f64> {
    let grid = MxGrid::new(16, nv.dim(), dims, "nvfp4").unwrap();
    let amax_t = xs
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()));
    let s_t = Nvfp4::tensor_scale(amax_t);
    let amax = block_amax(xs, &grid);
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let s_b = Nvfp4::block_scale(amax[grid.block_of(i)], s_t);
            Nvfp4::round(x, s_b, s_t, rule, stream.at(i as u64))
        })
        .collect()
}

/// Quantizes the f32 tensor `xs` (shape `dims`) with the kernel, from a separate input and
/// in place, and the same values as an f64 tensor, and compares all three with the scalar
/// rule in every mode. Returns the number of elements compared.
fn check_tensor(name: &str, dims: &[usize], xs: &[f32], bad: &mut Mismatches) -> u64 {
    let format: Format = name.parse().unwrap();
    let wide: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
    let mut checked = 0;
    for (m, mode) in MODES.into_iter().enumerate() {
        let stream = Stream::new(0x5eed + m as u64, 3);
        let want: Vec<f64> = match &format {
            Format::Mx(mx) => with_rule!(mode, mx_scalar(mx, dims, &wide, stream)),
            Format::Nvfp4(nv) => with_rule!(mode, nvfp4_scalar(nv, dims, &wide, stream)),
            _ => unreachable!("a block-scaled format"),
        };
        let mut out = vec![0f32; xs.len()];
        quantize_slice(Some(xs), &mut out, dims, &format, mode, Some(stream)).unwrap();
        let mut in_place = xs.to_vec();
        quantize_slice(None, &mut in_place, dims, &format, mode, Some(stream)).unwrap();
        let mut out64 = vec![0f64; xs.len()];
        quantize_slice(Some(&wide), &mut out64, dims, &format, mode, Some(stream)).unwrap();
        for i in 0..xs.len() {
            let w = want[i] as f32;
            let at = || {
                format!(
                    "{name} {dims:?} {mode}: x[{i}] = {:e} ({:#x})",
                    xs[i],
                    xs[i].to_bits()
                )
            };
            bad.check(same(out[i], w), || {
                format!("{}: got {:e}, want {w:e}", at(), out[i])
            });
            bad.check(same(in_place[i], w), || {
                format!("{} in place: got {:e}, want {w:e}", at(), in_place[i])
            });
            bad.check(
                out64[i].to_bits() == want[i].to_bits() || (out64[i].is_nan() && want[i].is_nan()),
                || format!("{} f64: got {:e}, want {:e}", at(), out64[i], want[i]),
            );
            checked += 1;
        }
    }
    checked
}

/// The f32 neighbours of `v` (below, `v` rounded to f32, above).
fn around(v: f64) -> [f32; 3] {
    let f = v as f32;
    let bits = f.to_bits();
    [
        f32::from_bits(bits.saturating_sub(1)),
        f,
        f32::from_bits(bits + 1),
    ]
}

// ---------------------------------------------------------------------------------------
// MX
// ---------------------------------------------------------------------------------------

/// The MX lane step equals the scalar rule for a block maximum of every exponent byte (every
/// scale, zero, subnormal and NaN maxima) and inputs of every exponent byte, with the
/// mantissas on, just below and just above every rounding position, both signs, in every
/// mode (random words of every size, and the ones at the stochastic threshold's edges);
/// also the step without the case of a step above the value, on the inputs it is for.
#[test]
fn mx_lane_step_equals_the_scalar_rule_at_every_scale_and_rounding_position() {
    fn check<R: RoundingRule>(mx: &Mx, words: &[u32], rule: R) -> (u64, Mismatches) {
        let plan = MxF32Plan::new(mx);
        let mut lows = vec![0u32, 1, 0x0040_0000, 0x007f_ffff];
        for s in 1..=23u32 {
            let half = 1u32 << (s - 1);
            for low in [half - 1, half, half + 1, (1 << s) - 1, (1 << s) | half] {
                lows.push(low & 0x007f_ffff);
            }
        }
        let mut bad = Mismatches::default();
        let mut checked = 0;
        for amax_byte in 0..=255u32 {
            let amax = mag_bits((amax_byte << 23) | 0x0012_3456);
            let block = plan.block(amax);
            let scale = MxF32Plan::scale_exponent(mx, amax);
            for byte in 0..=amax_byte.min(254) {
                for &low in &lows {
                    for sign in [0, 0x8000_0000] {
                        let bits = sign | (byte << 23) | low;
                        let x = f32::from_bits(bits);
                        for &r in words {
                            let (got, slow) = plan.round_lane::<R, true>(bits, r, block, rule);
                            let want = mx.round(x as f64, scale, rule, r) as f32;
                            checked += 1;
                            if slow {
                                // Left to the scalar rule, and unchanged.
                                bad.check(byte == 0 && got == bits || block.is_nan(), || {
                                    format!("{mx} {:?}: {x:e} flagged", R::KIND)
                                });
                                continue;
                            }
                            bad.check(same(f32::from_bits(got), want), || {
                                format!(
                                    "{mx} {:?} amax {amax:#x}: x {x:e} ({bits:#x}) r {r:#x}: got {:e}, want {want:e}",
                                    R::KIND,
                                    f32::from_bits(got)
                                )
                            });
                            // The step without the tiny case, where it applies.
                            let abs = bits & 0x7fff_ffff;
                            if abs == 0 || abs >= MxF32Plan::tiny_below(block) {
                                let (plain, _) = plan.round_lane::<R, false>(bits, r, block, rule);
                                bad.check(plain == got, || {
                                    format!(
                                        "{mx} {:?} amax {amax:#x}: x {x:e} without the tiny case",
                                        R::KIND
                                    )
                                });
                            }
                        }
                    }
                }
            }
        }
        (checked, bad)
    }
    let mut total = 0;
    let mut all = Mismatches::default();
    for element in MxElement::ALL {
        let mx = Mx::new(element, -1);
        for mode in MODES {
            let words: &[u32] = if mode.is_stochastic() {
                &[0, u32::MAX, 0x8000_0000, 0x1234_5678, 0xcafe_f00d]
            } else {
                &[0]
            };
            let (n, bad) = with_rule!(mode, check(&mx, words));
            total += n;
            all = all.merge(bad);
        }
    }
    all.assert_none_of("MX lane step", total);
}

/// Blocks of scale `2^x` holding every element value, every midpoint and the f32 values
/// on either side of them, both signs (the first element of each block of 32 is the
/// largest value, which fixes the scale).
fn mx_boundary_blocks(element: MxElement, x: i32) -> Vec<f32> {
    let s = 2f64.powi(x);
    let top = element.max_normal();
    // The nonnegative element values, decoded from their codes.
    let values: Vec<f64> = match element.format() {
        ElementFormat::Float(f) => (0..1u32 << (f.bits() - 1))
            .map(|c| f.decode(c))
            .filter(|v| v.is_finite() && *v <= top)
            .collect(),
        ElementFormat::Fixed(f) => (0..=127).map(|c| c as f64 * f.quantum()).collect(),
    };
    let mut vals = Vec::new();
    for w in values.windows(2) {
        for v in [w[0], 0.5 * (w[0] + w[1])] {
            for f in around(v * s) {
                vals.push(f);
                vals.push(-f);
            }
        }
    }
    vals.extend(around(top * s * 1.01));
    let mut out = Vec::new();
    for chunk in vals.chunks(31) {
        out.push((top * s) as f32);
        out.extend_from_slice(chunk);
        out.resize(out.len().div_ceil(32) * 32, 0.0);
    }
    out
}

/// Every element value, midpoint and f32 neighbour under scales from the clamp at -127 (the
/// scaled values are f32 subnormals, left to the scalar rule) to the largest an f32 block
/// has, in every mode: the kernel gives the scalar rule's bits.
#[test]
fn mx_every_code_and_midpoint_at_many_scales() {
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for element in MxElement::ALL {
        let name = element.name();
        let top = 127 - element.emax();
        for x in [
            -127,
            -126,
            -125,
            -120,
            -100,
            -30,
            -7,
            -1,
            0,
            1,
            5,
            60,
            100,
            top - 1,
            top,
        ] {
            let xs = mx_boundary_blocks(element, x);
            checked += check_tensor(name, &[xs.len() / 32, 32], &xs, &mut bad);
        }
    }
    bad.assert_none_of("MX codes and midpoints", checked);
}

/// Random values of every magnitude with zeros, -0, subnormals, NaN and ±Inf blocks, in
/// shapes whose blocks are aligned, short at the end of a row, along other axes, and
/// spread over several chunks of the kernel (more than one thread's work).
fn special_tensor(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix(seed);
    let mut xs: Vec<f32> = Vec::with_capacity(n);
    for i in 0..n {
        let region = (i / 97) % 6;
        let v = match rng.below(16) {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(rng.next_u32() & 0x807f_ffff),
            3 => rng.float_between(-140, -120) as f32,
            _ => match region {
                0 => rng.float_between(-10, 10) as f32,
                1 => rng.float_between(-130, -100) as f32,
                2 => rng.float_between(100, 127) as f32,
                3 => rng.float_between(-149, -126) as f32,
                4 => (rng.float_between(-3, 3) * 64.0).round() as f32 / 64.0,
                _ => rng.float_between(-40, 40) as f32,
            },
        };
        xs.push(v);
    }
    for (i, x) in xs.iter_mut().enumerate() {
        match i % 4099 {
            17 => *x = f32::NAN,
            1000 => *x = f32::INFINITY,
            2000 => *x = f32::NEG_INFINITY,
            3000 => *x = f32::from_bits(0xffc0_1234),
            _ => {}
        }
    }
    xs
}

const SHAPES: [(&[usize], i64); 11] = [
    (&[64, 96], -1),
    (&[3, 70], -1),
    (&[5, 48], -1),
    (&[7, 33], -1),
    (&[1, 1], -1),
    (&[37, 3, 5], 0),
    (&[3, 40, 7], 1),
    (&[3, 40, 7], -2),
    (&[40, 2, 19], 0),
    (&[700, 64], -1),
    (&[300, 111], -1),
];

#[test]
fn mx_special_values_and_shapes_equal_the_scalar_rule() {
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for name in mx_names() {
        for (s, (dims, dim)) in SHAPES.iter().enumerate() {
            let n: usize = dims.iter().product();
            let xs = special_tensor(n, 100 + s as u64);
            let format = if *dim == -1 {
                name.to_string()
            } else {
                format!("{name}<dim={dim}>")
            };
            checked += check_tensor(&format, dims, &xs, &mut bad);
        }
    }
    bad.assert_none_of("MX special values and shapes", checked);
}

/// Blocks along a non-last axis (the strided tile path for the deterministic rules): every
/// MX element format, dims 0 and 1 of 3-D tensors, rows not a multiple of 32, columns not a
/// multiple of the lane count, NaN, Inf and zero blocks, subnormal inputs, block maxima on
/// and around powers of two, from a source and in place.
#[test]
fn mx_blocks_along_other_axes_equal_the_scalar_rule() {
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for name in mx_names() {
        for (s, (dims, dim)) in STRIDED_SHAPES.iter().enumerate() {
            let xs = strided_tensor(dims, *dim, 0x57_0000 + s as u64);
            let format = format!("{name}<dim={dim}>");
            checked += check_tensor(&format, dims, &xs, &mut bad);
        }
    }
    bad.assert_none_of("MX blocks along other axes", checked);
}

// ---------------------------------------------------------------------------------------
// NVFP4
// ---------------------------------------------------------------------------------------

/// `bits(a) > threshold(b, tie_up)` exactly when `a > b`, or `a == b` and `tie_up`, for f32
/// magnitudes around positive boundaries of every kind: f32 values, values between two f32s, below
/// the smallest subnormal and above f32::MAX.
#[test]
fn nvfp4_thresholds_decide_as_exact_comparisons() {
    let mut rng = SplitMix(21);
    let mut bounds: Vec<f64> = vec![
        1e-50,
        2f64.powi(-149),
        1.5 * 2f64.powi(-149),
        2f64.powi(-150),
        f32::MAX as f64,
        f32::MAX as f64 * (1.0 + 2f64.powi(-30)),
        1e300,
    ];
    for _ in 0..20000 {
        let b = rng.float_between(-160, 128).abs();
        bounds.push(b);
        bounds.push(b as f32 as f64);
    }
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for &b in bounds.iter().filter(|&&b| b > 0.0) {
        for tie_up in [false, true] {
            let t = threshold(b, tie_up);
            let f = (b as f32).to_bits().min(0x7f7f_ffff);
            for a in [f.saturating_sub(1), f, f + 1, t, t.wrapping_add(1), 0] {
                let af = f32::from_bits(a) as f64;
                if !af.is_finite() {
                    continue;
                }
                let want = af > b || (af == b && tie_up);
                checked += 1;
                bad.check((a > t) == want, || {
                    format!("b {b:e} tie_up {tie_up}: a {af:e} passes {}", a > t)
                });
            }
        }
    }
    bad.assert_none_of("thresholds", checked);
}

/// Tensor scales of several kinds: powers of two and not, the smallest (a subnormal f32,
/// for tensors whose largest magnitude is subnormal), the largest, and 1 (a zero tensor).
const NVFP4_TENSOR_MAXIMA: [f64; 11] = [
    2688.0, 1.0, 3.3e-3, 1e-40, 7.77e30, 3.4e38, 1.2345, 1e-44, 1e-45, 0.0, 6.1e-5,
];

/// The block scale from the estimate and its two compares gives [`Nvfp4::block_scale`] for
/// maxima on, below and above every E4M3 value and midpoint times `6 s_t` (their f32
/// neighbours, and the midpoint thresholds and their neighbours as bit patterns: the
/// subnormal scales, the smallest normal, 448 and beyond included), zero, and random
/// magnitudes of every exponent, for tensor scales of every kind.
#[test]
fn nvfp4_block_scale_equals_the_scalar_rule() {
    let e4m3 = e4m3_saturating();
    let mut rng = SplitMix(0x5ca1e);
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for amax_t in NVFP4_TENSOR_MAXIMA {
        let s_t = Nvfp4::tensor_scale(amax_t as f32 as f64);
        let scales = Nvfp4Scales::new(s_t);
        let c = 6.0 * s_t;
        let mut maxima: Vec<u32> = vec![0, 1, 2, 0x7f7f_ffff, 0x7f7f_fffe];
        for code in 0..127u32 {
            let v = e4m3.decode(code);
            let next = e4m3.decode(code + 1).min(600.0);
            let mid = 0.5 * (v + next);
            for q in [v, mid] {
                maxima.extend(around(q * c).map(f32::to_bits));
            }
            for tie_up in [false, true] {
                let t = threshold(mid * c, tie_up);
                maxima.extend([t.saturating_sub(1), t, t + 1, t + 2]);
            }
        }
        for _ in 0..20_000 {
            maxima.push(rng.next_u32() & 0x7fff_ffff);
        }
        for amax in maxima.into_iter().filter(|&a| a < 0x7f80_0000) {
            let a = f32::from_bits(amax);
            let row = scales.row_of(amax);
            let want = Nvfp4::block_scale(a as f64, s_t);
            checked += 1;
            bad.check(Nvfp4Scales::block_scale(row) == want, || {
                format!("s_t {s_t:e} amax {a:e} ({amax:#x}): row {row}, want {want:e}")
            });
        }
        let nan = scales.row_of(mag_bits(f32::NAN.to_bits()));
        bad.check(
            nan == NAN_ROW && scales.row_of(0x7f80_0000) == NAN_ROW,
            || "NaN row".to_string(),
        );
    }
    bad.assert_none_of("block scales", checked);
}

/// The NVFP4 lane step equals the scalar rule for every E4M3 block scale, deterministic
/// modes, on the E2M1 values and midpoints times the divisor and their f32 neighbours.
#[test]
fn nvfp4_lane_step_equals_the_scalar_rule_for_every_block_scale() {
    fn check<R: RoundingRule>(s_t: f64, rule: R, bad: &mut Mismatches) -> u64 {
        let plan = Nvfp4F32Plan::new(s_t, R::KIND).expect("a deterministic rule");
        let e2m1 = [
            0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0,
        ];
        let mut checked = 0;
        for row in 0..=NAN_ROW {
            let s_b = Nvfp4Scales::block_scale(row);
            let d = if s_b.is_nan() {
                s_t
            } else {
                s_b.max(2f64.powi(-9)) * s_t
            };
            for m in e2m1 {
                // A block with a non-finite element is a NaN block.
                for a in around(m * d).into_iter().filter(|a| a.is_finite()) {
                    for x in [a, -a] {
                        let got = Nvfp4F32Plan::round_lane(x.to_bits(), plan.row(row));
                        let want = Nvfp4::round(x as f64, s_b, s_t, rule, 0) as f32;
                        checked += 1;
                        bad.check(same(f32::from_bits(got), want), || {
                            format!(
                                "{:?} s_t {s_t:e} s_b {s_b:e}: x {x:e}: got {:e}, want {want:e}",
                                R::KIND,
                                f32::from_bits(got)
                            )
                        });
                    }
                }
            }
        }
        checked
    }
    let mut bad = Mismatches::default();
    let mut checked = 0;
    for amax_t in NVFP4_TENSOR_MAXIMA {
        let s_t = Nvfp4::tensor_scale(amax_t as f32 as f64);
        checked += check(s_t, NearestEven, &mut bad);
        checked += check(s_t, NearestAway, &mut bad);
        checked += check(s_t, TowardZero, &mut bad);
    }
    bad.assert_none_of("NVFP4 lane step", checked);
}

/// Tensors whose blocks take many scales (under a tensor scale that is not a power of two),
/// with elements on the E2M1 midpoints and values of their block and the f32 neighbours;
/// then random values with special blocks in every shape: the kernel gives the scalar
/// rule's bits in every mode (stochastic included).
#[test]
fn nvfp4_tensors_equal_the_scalar_rule() {
    let mut bad = Mismatches::default();
    let mut checked = 0;
    let amax_t = (2688.0 * 1.3) as f32;
    let s_t = Nvfp4::tensor_scale(amax_t as f64);
    let e4m3 = e4m3_saturating();
    let mut xs = Vec::new();
    for code in 1..127u32 {
        let d = e4m3.decode(code) * s_t;
        let mut block = vec![(6.0 * d) as f32];
        for m in [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 3.0] {
            for a in around(m * d) {
                block.push(if block.len() % 2 == 0 { a } else { -a });
            }
        }
        block.truncate(16);
        block.resize(16, 0.0);
        xs.extend(block);
    }
    xs[0] = amax_t;
    checked += check_tensor("nvfp4", &[xs.len() / 16, 16], &xs, &mut bad);
    // The same blocks in tensors of tiny and huge magnitude: divisors outside the stochastic
    // lane step's range (every element left to the scalar rule), subnormal tensor scales,
    // subnormal inputs and scales near f32::MAX.
    for factor in [2f64.powi(-100), 2f64.powi(-125), 1e-42, 2f64.powi(100)] {
        let scaled: Vec<f32> = xs.iter().map(|&x| (x as f64 * factor) as f32).collect();
        checked += check_tensor("nvfp4", &[scaled.len() / 16, 16], &scaled, &mut bad);
    }
    for (s, (dims, dim)) in SHAPES.iter().enumerate() {
        let n: usize = dims.iter().product();
        let xs = special_tensor(n, 200 + s as u64);
        let format = if *dim == -1 {
            "nvfp4".to_string()
        } else {
            format!("nvfp4<dim={dim}>")
        };
        checked += check_tensor(&format, dims, &xs, &mut bad);
    }
    bad.assert_none_of("NVFP4 tensors", checked);
}
