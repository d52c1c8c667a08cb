//! Block floating point with per-slice blocks (`block<wl,dim=d>`) on f32 tensors: the
//! vectorised per-slice pass against the scalar `Block::round` with each block's maximum
//! found by a plain loop, element by element.
//!
//! The shapes make slices that cross the kernel's runs of 1024 elements and its parallel
//! chunks of 2^14, slices whose length is not a multiple of 4 (so a slice starts inside a
//! Philox block of four words), slices of one element, and blocks made of many separate
//! slices. Blocks hold NaN, ±Inf, zeros, f32 subnormals, all-zero blocks and blocks whose
//! maximum is subnormal. Allocating and in-place calls, strided views and empty tensors are
//! checked; stochastic rounding reads element `i`'s word from `Stream::new(seed, 0).at(i)`,
//! `i` being the logical row-major index.

mod common;

use candle_core::{Device, Tensor};
use common::SplitMix;
use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::{Block, BlockScope};
use qcandle::philox::Stream;
use qcandle::{quantize, quantize_, Format, Quant, Rounding};

const CPU: Device = Device::Cpu;

const MODES: [Rounding; 5] = [
    Rounding::NearestEven,
    Rounding::NearestAway,
    Rounding::TowardZero,
    Rounding::Stochastic { bits: 23 },
    Rounding::Stochastic { bits: 3 },
];

/// `Block::round` with the rounding given as a value.
fn block_round(b: &Block, x: f64, max: f64, mode: Rounding, r: u32) -> f64 {
    match mode {
        Rounding::NearestEven => b.round(x, max, NearestEven, r),
        Rounding::NearestAway => b.round(x, max, NearestAway, r),
        Rounding::TowardZero => b.round(x, max, TowardZero, r),
        Rounding::Stochastic { bits } => b.round(x, max, Stochastic { bits }, r),
    }
}

/// The expected result: each block's largest finite magnitude by a plain loop over the
/// elements (block of element `i`: `(i / inner) % count`), then `Block::round` per element.
fn reference(
    xs: &[f32],
    dims: &[usize],
    wl: u32,
    dim: usize,
    mode: Rounding,
    seed: u64,
) -> Vec<f32> {
    let b = Block::new(wl, BlockScope::Dim(dim as i64)).unwrap();
    let inner: usize = dims[dim + 1..].iter().product();
    let count = dims[dim];
    let block_of = |i: usize| (i / inner) % count;
    let mut max = vec![0f64; count];
    for (i, &x) in xs.iter().enumerate() {
        if x.is_finite() {
            max[block_of(i)] = max[block_of(i)].max((x as f64).abs());
        }
    }
    let stream = Stream::new(seed, 0);
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let r = if mode.is_stochastic() {
                stream.at(i as u64)
            } else {
                0
            };
            block_round(&b, x as f64, max[block_of(i)], mode, r) as f32
        })
        .collect()
}

/// Same bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The first differing element, described.
fn first_mismatch(got: &[f32], want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements, expected {}", got.len(), want.len()));
    }
    let i = (0..got.len()).find(|&i| !same(got[i], want[i]))?;
    Some(format!(
        "element {i}: got {:e} ({:#x}), expected {:e}",
        got[i],
        got[i].to_bits(),
        want[i]
    ))
}

/// Values over many binades, with NaN, ±Inf, zeros and subnormals sprinkled in; every
/// slice along `dim` whose index is a multiple of 5 is scaled into the subnormal range
/// (its block's maximum is subnormal), and slice 1 along `dim` is all zeros.
fn input(dims: &[usize], dim: usize, seed: u64) -> Vec<f32> {
    let n: usize = dims.iter().product();
    let inner: usize = dims[dim + 1..].iter().product();
    let count = dims[dim];
    let mut rng = SplitMix(seed);
    (0..n)
        .map(|i| {
            let slice = (i / inner) % count;
            if slice == 1 && count > 2 {
                return 0.0;
            }
            let x = match rng.below(64) {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => 0.0,
                4 => -0.0,
                5 => f32::from_bits(1 + rng.below(0x7f_ffff) as u32),
                _ => rng.float_between(-10, 10) as f32,
            };
            if slice.is_multiple_of(5) && count > 5 && x.is_finite() {
                x * 2f32.powi(-130)
            } else {
                x
            }
        })
        .collect()
}

/// Shapes and the block dimension: slices crossing runs and chunks, slice lengths that are
/// not multiples of 4, slices of one element, blocks made of many separate slices.
const CASES: &[(&[usize], usize)] = &[
    (&[7, 3001], 0),
    (&[3, 20_011], 0),
    (&[5, 4099, 3], 1),
    (&[40_000, 3], 1),
    (&[12_001, 3], 0),
    (&[2, 9, 1030], 1),
    (&[64, 256], 0),
    (&[1, 17], 0),
    (&[17], 0),
];

#[test]
fn per_slice_blocks_equal_the_scalar_rounding_allocating_and_in_place() -> anyhow::Result<()> {
    let mut failures = Vec::new();
    for (k, &(dims, dim)) in CASES.iter().enumerate() {
        let xs = input(dims, dim, 100 + k as u64);
        let x = Tensor::from_vec(xs.clone(), dims, &CPU)?;
        for wl in [2u32, 8, 25] {
            let format: Format = format!("block<{wl},dim={dim}>").parse()?;
            for mode in MODES {
                let want = reference(&xs, dims, wl, dim, mode, 9);
                let q = Quant::new(format).with_rounding(mode).with_seed(9);
                let got = quantize(&x, &q)?.flatten_all()?.to_vec1::<f32>()?;
                if let Some(m) = first_mismatch(&got, &want) {
                    failures.push(format!("{dims:?} {format} {mode}: {m}"));
                }
                let y = x.copy()?;
                quantize_(&y, &Quant::new(format).with_rounding(mode).with_seed(9))?;
                let got = y.flatten_all()?.to_vec1::<f32>()?;
                if let Some(m) = first_mismatch(&got, &want) {
                    failures.push(format!("{dims:?} {format} {mode} in place: {m}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// A block dimension counted from the end names the same blocks.
#[test]
fn negative_block_dims_name_the_same_slices() -> anyhow::Result<()> {
    let dims = [5usize, 4099, 3];
    let xs = input(&dims, 1, 3);
    let x = Tensor::from_vec(xs.clone(), &dims[..], &CPU)?;
    for mode in MODES {
        let want = reference(&xs, &dims, 8, 1, mode, 2);
        let q = Quant::new("block<8,dim=-2>".parse()?)
            .with_rounding(mode)
            .with_seed(2);
        let got = quantize(&x, &q)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            first_mismatch(&got, &want).is_none(),
            "{mode}: {:?}",
            first_mismatch(&got, &want)
        );
    }
    Ok(())
}

/// A transposed (strided) view is rounded in its logical order: the same as rounding its
/// contiguous copy, and as the reference on the copy's values; in place, the view's
/// elements in the underlying storage are rounded.
#[test]
fn strided_views_round_in_logical_order() -> anyhow::Result<()> {
    let base = Tensor::from_vec(input(&[3001, 7], 0, 5), (3001, 7), &CPU)?;
    let view = base.t()?; // shape (7, 3001), strides (1, 7)
    let xs = view.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    for mode in MODES {
        let want = reference(&xs, &[7, 3001], 8, 0, mode, 4);
        let q = Quant::new("block<8,dim=0>".parse()?)
            .with_rounding(mode)
            .with_seed(4);
        let got = quantize(&view, &q)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            first_mismatch(&got, &want).is_none(),
            "{mode}: {:?}",
            first_mismatch(&got, &want)
        );
        let storage = base.copy()?;
        let strided = storage.t()?;
        quantize_(
            &strided,
            &Quant::new("block<8,dim=0>".parse()?)
                .with_rounding(mode)
                .with_seed(4),
        )?;
        let got = strided.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            first_mismatch(&got, &want).is_none(),
            "{mode} in place: {:?}",
            first_mismatch(&got, &want)
        );
    }
    Ok(())
}

/// Empty tensors round to empty tensors of the same shape, whichever dimension is empty;
/// a block dimension the tensor does not have is still an error.
#[test]
fn empty_tensors_round_to_empty_tensors() -> anyhow::Result<()> {
    for dims in [[0usize, 5], [5, 0]] {
        let x = Tensor::zeros(&dims[..], candle_core::DType::F32, &CPU)?;
        for dim in [0, 1] {
            let q = Quant::new(format!("block<8,dim={dim}>").parse()?);
            let y = quantize(&x, &q)?;
            assert_eq!(y.dims(), &dims[..]);
            quantize_(&x, &q)?;
        }
        let q = Quant::new("block<8,dim=2>".parse()?);
        assert!(
            quantize(&x, &q).is_err(),
            "{dims:?}: dim 2 of a rank-2 tensor"
        );
    }
    Ok(())
}
