//! The CPU quantize kernel (`backend::cpu::quantize_slice` on f32) under every instruction
//! set this CPU has (`backend::isa::set_cap`: the portable, AVX2 and AVX-512 compilations of
//! the vectorised passes and of the Philox fill) against the scalar rounding with the same
//! stream words, bit for bit: lns (deterministic rules and stochastic rounding, the permuted
//! and the gathered tables) and the stochastic rows of the elementwise formats and block
//! floating point, from a source and in place, on inputs with zeros, subnormals, Inf, NaN,
//! values near every clamp, values already on the lns grid, and lengths that end in partial
//! groups, runs and chunks; and NVFP4 in every mode, blocks along the last and other axes,
//! with stochastic inputs on and near the decision boundaries of their own stream words,
//! and block maxima on and around every E4M3 block-scale boundary; and MX with blocks along
//! a non-last axis (the strided tile path) in every mode and element format.
//!
//! The cap is process-wide, so the tests of this file take a lock while they hold one.

#[path = "common/isa_cap.rs"]
mod isa_cap;
#[path = "common/strided_mx.rs"]
mod strided_mx;

use isa_cap::{available, CAP};
use qcandle::backend::cpu::quantize_slice;
use qcandle::backend::isa;
use qcandle::format::block::block_max;
use qcandle::format::lns::Lns;
use qcandle::format::mx::MxGrid;
use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::{Mx, Nvfp4};
use qcandle::philox::Stream;
use qcandle::{Format, Rounding};

/// Inputs across many binades with the specials mixed in, plus the lns<8,3> grid (values
/// that stochastic and toward-zero rounding keep).
fn inputs(n: usize) -> Vec<f32> {
    let lns = Lns::new(8, 3).unwrap();
    let grid: Vec<f32> = (lns.k_min()..=lns.k_max())
        .map(|k| lns.value(k) as f32)
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bits = (state >> 32) as u32;
            match i % 101 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::NAN,
                3 => f32::INFINITY,
                4 => f32::NEG_INFINITY,
                5 => f32::from_bits(bits & 0x807f_ffff),
                6 => f32::MAX,
                7..=16 => grid[bits as usize % grid.len()] * if bits & 1 == 0 { 1.0 } else { -1.0 },
                _ => {
                    let byte = if i % 7 == 0 {
                        (bits >> 8) & 0xff
                    } else {
                        112 + (bits >> 8) % 30
                    };
                    f32::from_bits((bits & 0x807f_ffff) | byte << 23)
                }
            }
        })
        .collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Runs the kernel under every available instruction set, from a source and in place, and
/// compares each element with `reference(i, x, word)`.
fn check(format: &Format, rounding: Rounding, xs: &[f32], reference: impl Fn(f32, u32) -> f32) {
    check_with(Stream::new(0x5eed, 3), format, rounding, xs, reference)
}

/// [`check`] with a given stream.
fn check_with(
    stream: Stream,
    format: &Format,
    rounding: Rounding,
    xs: &[f32],
    reference: impl Fn(f32, u32) -> f32,
) {
    let want: Vec<f32> = xs
        .iter()
        .enumerate()
        .map(|(i, &x)| reference(x, stream.at(i as u64)))
        .collect();
    let _lock = CAP.lock().unwrap_or_else(|e| e.into_inner());
    for isa in available() {
        isa::set_cap(Some(isa));
        let mut out = vec![0f32; xs.len()];
        let dims = [xs.len()];
        quantize_slice(Some(xs), &mut out, &dims, format, rounding, Some(stream)).unwrap();
        let mut in_place = xs.to_vec();
        quantize_slice(None, &mut in_place, &dims, format, rounding, Some(stream)).unwrap();
        isa::set_cap(None);
        let bad: Vec<usize> = (0..xs.len())
            .filter(|&i| !same(out[i], want[i]) || !same(in_place[i], want[i]))
            .collect();
        if let Some(&i) = bad.first() {
            panic!(
                "{format} {rounding} {isa:?}: {} mismatches, first [{i}] {:e} ({:#010x}): {:e} / {:e} in place vs {:e}",
                bad.len(),
                xs[i],
                xs[i].to_bits(),
                out[i],
                in_place[i],
                want[i]
            );
        }
    }
}

const ROUNDINGS: [Rounding; 5] = [
    Rounding::NearestEven,
    Rounding::NearestAway,
    Rounding::TowardZero,
    Rounding::Stochastic { bits: 23 },
    Rounding::Stochastic { bits: 5 },
];

/// The scalar lns rounding with f32 storage.
fn lns_scalar(lns: &Lns, rounding: Rounding, x: f32, r: u32) -> f32 {
    let stored = |v: f64| v as f32 as f64;
    let x = x as f64;
    (match rounding {
        Rounding::NearestEven => lns.round_stored(x, NearestEven, r, stored),
        Rounding::NearestAway => lns.round_stored(x, NearestAway, r, stored),
        Rounding::TowardZero => lns.round_stored(x, TowardZero, r, stored),
        Rounding::Stochastic { bits } => lns.round_stored(x, Stochastic { bits }, r, stored),
    }) as f32
}

#[test]
fn lns_kernel_equals_the_scalar_rounding_on_every_instruction_set() {
    // 3 chunks and a tail that ends inside a group.
    let xs = inputs(3 * (1 << 14) + 1000 + 7);
    // f = 3 and 4 permute their stochastic tables in registers, f = 5 and 10 gather them;
    // lns<20,16> has the largest tables, lns<12,0> ten Taylor terms, lns<28,20> no plan.
    for (w, f) in [
        (8, 3),
        (12, 4),
        (12, 5),
        (16, 10),
        (12, 0),
        (9, 1),
        (20, 16),
        (28, 20),
    ] {
        let lns = Lns::new(w, f).unwrap();
        for rounding in ROUNDINGS {
            check(&Format::Lns(lns), rounding, &xs, |x, r| {
                lns_scalar(&lns, rounding, x, r)
            });
        }
    }
}

/// Inputs whose mantissa lies within two units of the stochastic threshold
/// `2^23 (2^((j + c)/2^f) - 1)` their own stream word sets (`c = (r + 1) / 2^bits`), for
/// random codes `j` and binades: the decisions the error bound leaves to the scalar path
/// and those just outside it.
fn near_stochastic_thresholds(lns: &Lns, bits: u32, stream: Stream, n: usize) -> Vec<f32> {
    let f = lns.f();
    (0..n)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
            let r = (stream.at(i as u64) >> (32 - bits)) as f64;
            let c = (r + 1.0) / (1u64 << bits) as f64;
            let j = (h % (1 << f)) as f64;
            let t = (((j + c) / (1u64 << f) as f64).exp2() - 1.0) * (1u64 << 23) as f64;
            let m = (t.floor() as i64 + (i % 5) as i64 - 2).clamp(0, (1 << 23) - 1) as u32;
            let byte = 120 + (h >> 20) as u32 % 16;
            let sign = ((h >> 30) & 1) as u32;
            f32::from_bits(sign << 31 | byte << 23 | m)
        })
        .collect()
}

#[test]
fn lns_stochastic_kernel_decides_near_its_thresholds_like_the_scalar_rounding() {
    let stream = Stream::new(0x5eed, 11);
    for (w, f) in [(8, 3), (12, 4), (12, 5), (16, 10), (12, 0), (20, 16)] {
        let lns = Lns::new(w, f).unwrap();
        for bits in [23, 5] {
            let xs = near_stochastic_thresholds(&lns, bits, stream, 40_000);
            let rounding = Rounding::Stochastic { bits };
            check_with(stream, &Format::Lns(lns), rounding, &xs, |x, r| {
                lns_scalar(&lns, rounding, x, r)
            });
        }
    }
}

#[test]
fn elementwise_kernels_equal_the_general_path_on_every_instruction_set() {
    let xs = inputs(2 * (1 << 14) + 517);
    for name in [
        "posit<8,0>",
        "posit<16,1>",
        "posit<8,2>",
        "e4m3",
        "bf16",
        "e5m2",
        "fp16",
        "float<5,2,nosub>",
        "float<4,3,fn,sat>",
        "fixed<8,4>",
    ] {
        let format: Format = name.parse().unwrap();
        for rounding in ROUNDINGS {
            check(&format, rounding, &xs, |x, r| {
                format.round(x as f64, rounding, r) as f32
            });
        }
    }
}

#[test]
fn block_kernel_equals_the_general_path_on_every_instruction_set() {
    let xs = inputs(2 * (1 << 14) + 517);
    let max = block_max(xs.iter().map(|&x| x as f64));
    for name in ["block<8>", "block<4>", "block<16>"] {
        let format: Format = name.parse().unwrap();
        let Format::Block(b) = format else {
            unreachable!("{name} is block floating point")
        };
        for rounding in ROUNDINGS {
            check(&format, rounding, &xs, |x, r| {
                let x = x as f64;
                (match rounding {
                    Rounding::NearestEven => b.round(x, max, NearestEven, r),
                    Rounding::NearestAway => b.round(x, max, NearestAway, r),
                    Rounding::TowardZero => b.round(x, max, TowardZero, r),
                    Rounding::Stochastic { bits } => b.round(x, max, Stochastic { bits }, r),
                }) as f32
            });
        }
    }
}

/// The same seed and call give the same bits on every instruction set and in every run;
/// another call index gives other bits (the stream reaches the kernel).
#[test]
fn stochastic_results_depend_on_the_seed_and_call_only() {
    let xs = inputs(1 << 15);
    let dims = [xs.len()];
    let rounding = Rounding::Stochastic { bits: 23 };
    let _lock = CAP.lock().unwrap_or_else(|e| e.into_inner());
    for name in [
        "lns<8,3>",
        "lns<16,10>",
        "posit<8,0>",
        "e4m3",
        "bf16",
        "block<8>",
    ] {
        let format: Format = name.parse().unwrap();
        let run = |call: u64| {
            let mut out = xs.clone();
            quantize_slice(
                None,
                &mut out,
                &dims,
                &format,
                rounding,
                Some(Stream::new(9, call)),
            )
            .unwrap();
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let first = run(1);
        for isa in available() {
            isa::set_cap(Some(isa));
            assert_eq!(run(1), first, "{name} {isa:?}");
            isa::set_cap(None);
        }
        assert_ne!(run(2), first, "{name}: the call index changes nothing");
    }
}

/// NVFP4 by the scalar rule of `format::nvfp4` (f32 storage), blocks along `dim` of `dims`.
fn nvfp4_scalar(
    dims: &[usize],
    dim: i64,
    xs: &[f32],
    rounding: Rounding,
    stream: Stream,
) -> Vec<f32> {
    let grid = MxGrid::new(16, dim, dims, "nvfp4").unwrap();
    let amax_t = xs
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, &x| m.max(x.abs() as f64));
    let s_t = Nvfp4::tensor_scale(amax_t);
    let amax = block_amax(&grid, xs);
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let s_b = Nvfp4::block_scale(amax[grid.block_of(i)], s_t);
            let (x, r) = (x as f64, stream.at(i as u64));
            (match rounding {
                Rounding::NearestEven => Nvfp4::round(x, s_b, s_t, NearestEven, r),
                Rounding::NearestAway => Nvfp4::round(x, s_b, s_t, NearestAway, r),
                Rounding::TowardZero => Nvfp4::round(x, s_b, s_t, TowardZero, r),
                Rounding::Stochastic { bits } => Nvfp4::round(x, s_b, s_t, Stochastic { bits }, r),
            }) as f32
        })
        .collect()
}

/// Runs the kernel on a tensor of shape `dims` under every available instruction set, from
/// a source and in place, against `want`.
fn check_tensor(
    format: &Format,
    rounding: Rounding,
    dims: &[usize],
    xs: &[f32],
    want: &[f32],
    stream: Stream,
) {
    let _lock = CAP.lock().unwrap_or_else(|e| e.into_inner());
    for isa in available() {
        isa::set_cap(Some(isa));
        let mut out = vec![0f32; xs.len()];
        quantize_slice(Some(xs), &mut out, dims, format, rounding, Some(stream)).unwrap();
        let mut in_place = xs.to_vec();
        quantize_slice(None, &mut in_place, dims, format, rounding, Some(stream)).unwrap();
        isa::set_cap(None);
        let bad: Vec<usize> = (0..xs.len())
            .filter(|&i| !same(out[i], want[i]) || !same(in_place[i], want[i]))
            .collect();
        if let Some(&i) = bad.first() {
            panic!(
                "{format} {dims:?} {rounding} {isa:?}: {} mismatches, first [{i}] {:e} ({:#010x}): {:e} / {:e} in place vs {:e}",
                bad.len(),
                xs[i],
                xs[i].to_bits(),
                out[i],
                in_place[i],
                want[i]
            );
        }
    }
}

/// Each block's largest magnitude in f64, infinite where the block holds a NaN or an Inf.
fn block_amax(grid: &MxGrid, xs: &[f32]) -> Vec<f64> {
    let mut amax = vec![0f64; grid.count()];
    for (i, &x) in xs.iter().enumerate() {
        let m = if x.is_finite() {
            x.abs() as f64
        } else {
            f64::INFINITY
        };
        let b = grid.block_of(i);
        amax[b] = amax[b].max(m);
    }
    amax
}

/// MX by the scalar rule of `format::mx` (f32 storage), blocks along `dim` of `dims`.
fn mx_scalar(mx: &Mx, dims: &[usize], xs: &[f32], rounding: Rounding, stream: Stream) -> Vec<f32> {
    let grid = MxGrid::new(32, mx.dim(), dims, "mx").unwrap();
    let amax = block_amax(&grid, xs);
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let scale = mx.scale_exponent(amax[grid.block_of(i)]);
            let (x, r) = (x as f64, stream.at(i as u64));
            (match rounding {
                Rounding::NearestEven => mx.round(x, scale, NearestEven, r),
                Rounding::NearestAway => mx.round(x, scale, NearestAway, r),
                Rounding::TowardZero => mx.round(x, scale, TowardZero, r),
                Rounding::Stochastic { bits } => mx.round(x, scale, Stochastic { bits }, r),
            }) as f32
        })
        .collect()
}

/// MX with blocks along a non-last axis (the strided tile path: 16 lanes compiled for
/// AVX-512, AVX2 and portable code) in every mode and every element format, on tiles
/// mixing zero, NaN, Inf and subnormal blocks with maxima on and around powers of two, rows
/// not a multiple of 32 and columns not a multiple of the lane count.
#[test]
fn mx_strided_kernel_equals_the_scalar_rule_on_every_instruction_set() {
    let stream = Stream::new(0x5eed, 17);
    for name in strided_mx::mx_names() {
        for (s, (dims, dim)) in strided_mx::STRIDED_SHAPES.iter().enumerate() {
            let xs = strided_mx::strided_tensor(dims, *dim, 0x150 + s as u64);
            let format: Format = format!("{name}<dim={dim}>").parse().unwrap();
            let Format::Mx(mx) = &format else {
                unreachable!("an MX format")
            };
            for rounding in ROUNDINGS {
                let want = mx_scalar(mx, dims, &xs, rounding, stream);
                check_tensor(&format, rounding, dims, &xs, &want, stream);
            }
        }
    }
}

/// NVFP4 in every mode on the mixed inputs (zeros, subnormals, Inf and NaN blocks, every
/// binade), blocks along the last axis (aligned, and with a short last block) and along
/// another axis, over several chunks.
#[test]
fn nvfp4_kernel_equals_the_scalar_rule_on_every_instruction_set() {
    let stream = Stream::new(0x5eed, 5);
    for (dims, dim) in [
        (vec![2 * (1 << 14) / 48 + 3, 48], -1i64),
        (vec![700, 37], -1),
        (vec![37, 3, 301], 0),
        (vec![5, 40, 111], 1),
    ] {
        let n: usize = dims.iter().product();
        let xs = inputs(n);
        let name = if dim == -1 {
            "nvfp4".to_string()
        } else {
            format!("nvfp4<dim={dim}>")
        };
        let format: Format = name.parse().unwrap();
        for rounding in ROUNDINGS {
            let want = nvfp4_scalar(&dims, dim, &xs, rounding, stream);
            check_tensor(&format, rounding, &dims, &xs, &want, stream);
        }
    }
}

/// Blocks of known scale (under a tensor scale that is not a power of two, so `1/d` is
/// inexact) whose elements lie within two f32 units of the stochastic decision boundary
/// `lo + (r + 1) u / 2^k` their own stream word sets: the decisions the estimate leaves to
/// the scalar rule and those just outside its band, aligned and along another axis.
#[test]
fn nvfp4_stochastic_kernel_decides_near_its_thresholds_like_the_scalar_rule() {
    let stream = Stream::new(0x5eed, 13);
    let e4m3 = qcandle::format::nvfp4::e4m3_saturating();
    let amax_t = (2688.0 * 1.3) as f32;
    let s_t = Nvfp4::tensor_scale(amax_t as f64);
    let lows = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let units = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0];
    for bits in [23, 4] {
        let rounding = Rounding::Stochastic { bits };
        for (dims, dim) in [(vec![3000, 16], -1i64), (vec![16, 3000], 0)] {
            let n = 3000 * 16;
            let grid = MxGrid::new(16, dim, &dims, "nvfp4").unwrap();
            // Each block's scale code, and its first element pinning it.
            let code = |b: usize| 1 + (b as u32 * 37) % 126;
            let mut firsts = vec![None; grid.count()];
            let xs: Vec<f32> = (0..n)
                .map(|i| {
                    let b = grid.block_of(i);
                    let d = e4m3.decode(code(b)) * s_t;
                    if i == 0 {
                        return amax_t;
                    }
                    if firsts[b].is_none() {
                        firsts[b] = Some(i);
                        return (6.0 * d) as f32;
                    }
                    let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
                    let r = (stream.at(i as u64) >> (32 - bits)) as f64;
                    let g = (h % 7) as usize;
                    let t = lows[g] + (r + 1.0) * units[g] / (1u64 << bits) as f64;
                    let x = (t * d) as f32;
                    let x = f32::from_bits((x.to_bits() as i64 + (i % 5) as i64 - 2) as u32);
                    if h & 8 == 0 {
                        x
                    } else {
                        -x
                    }
                })
                .collect();
            let name = if dim == -1 {
                "nvfp4".to_string()
            } else {
                format!("nvfp4<dim={dim}>")
            };
            let want = nvfp4_scalar(&dims, dim, &xs, rounding, stream);
            check_tensor(&name.parse().unwrap(), rounding, &dims, &xs, &want, stream);
        }
    }
}

/// The elements of a block whose largest magnitude is `m`: `m` itself, zeros of both signs
/// and fractions of `m` of both signs (each at most `m` after rounding to f32).
fn block_with_max(m: f32) -> [f32; 16] {
    let parts = [
        1.0, -0.37, 0.81, 0.0, -0.0, 0.5, -0.123, 0.999, 0.125, -0.66, 0.25, 0.75, -0.05, 0.9, 0.0,
        -0.33,
    ];
    parts.map(|p: f64| (m as f64 * p) as f32)
}

/// Blocks whose maxima lie on and one f32 unit around every E4M3 block-scale boundary (each
/// midpoint between neighbouring scale codes times `6 s_t`, as the exact threshold of both
/// tie directions, and each scale value times `6 s_t`): subnormal scales, the smallest
/// normal and 448 included, under a tensor scale that is not a power of two, the smallest
/// (subnormal) tensor scale and a huge one. Blocks aligned along the last axis, in rows with
/// a short last block (the row's first 8 elements again), and along the first axis; every
/// mode, every instruction set, from a source and in place.
#[test]
fn nvfp4_block_scale_boundaries_on_every_instruction_set() {
    use qcandle::backend::nvfp4_plan::scale_boundary_maxima;
    let stream = Stream::new(0x5eed, 17);
    for amax_t in [(2688.0 * 1.3) as f32, 1e-42, 3.0e-39, 1.0e30] {
        let s_t = Nvfp4::tensor_scale(amax_t as f64);
        let mut maxima = scale_boundary_maxima(s_t);
        maxima.retain(|&m| f32::from_bits(m) <= amax_t);
        maxima.sort_unstable();
        maxima.dedup();
        // The tensor's largest magnitude first, so that it fixes `s_t`.
        let blocks: Vec<[f32; 16]> = std::iter::once(amax_t.to_bits())
            .chain(maxima)
            .map(|m| block_with_max(f32::from_bits(m)))
            .collect();
        let nb = blocks.len();
        let aligned: Vec<f32> = blocks.iter().flatten().copied().collect();
        let short: Vec<f32> = blocks
            .iter()
            .flat_map(|b| b.iter().chain(&b[..8]).copied())
            .collect();
        let across: Vec<f32> = (0..16 * nb).map(|i| blocks[i % nb][i / nb]).collect();
        for (dims, dim, xs) in [
            (vec![nb, 16], -1i64, &aligned),
            (vec![nb, 24], -1, &short),
            (vec![16, nb], 0, &across),
        ] {
            let name = if dim == -1 {
                "nvfp4".to_string()
            } else {
                format!("nvfp4<dim={dim}>")
            };
            let format: Format = name.parse().unwrap();
            for rounding in ROUNDINGS {
                let want = nvfp4_scalar(&dims, dim, xs, rounding, stream);
                check_tensor(&format, rounding, &dims, xs, &want, stream);
            }
        }
    }
}
