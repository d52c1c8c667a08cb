//! Block floating point block(wl): a block of values shares one exponent, and each element
//! is a `wl`-bit two's complement integer scaled by it.
//!
//! The shared exponent is the binade `E = floor(log2 max|x|)` of the block's largest finite
//! magnitude. Elements are rounded to multiples of `2^(E - (wl - 2))`, so the largest element
//! keeps `wl - 2` fraction bits beside its leading bit and the sign, and clamped to
//! `[-2^(wl-1), 2^(wl-1) - 1] * 2^(E - (wl - 2))` (the largest element may round up to
//! `2^(E+1)`, which clamps to the top code, as in QPyTorch's block_quantize).
//!
//! The block is the whole tensor ([`BlockScope::Tensor`]) or each slice `x.select(dim, i)`
//! ([`BlockScope::Dim`], QPyTorch's `dim` argument). ±Inf elements pass through unchanged,
//! NaN elements come out quiet with their sign and payload, and neither takes part in
//! choosing the exponent; a block with no finite nonzero
//! element is returned as it is (zeros become +0).
//!
//! `BlockGrid` places the elements of a tensor of a given shape into the blocks of a
//! scope; the CPU and the CUDA kernels both group elements by it.

use super::fixed::round_fixed;

/// The quiet bit of an f64 NaN (the top fraction bit).
const QUIET_NAN_BIT: u64 = 1 << 51;
use super::grid::parts;
use super::rounding::RoundingRule;
use crate::error::FormatError;

/// Which elements share an exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BlockScope {
    /// The whole tensor is one block.
    #[default]
    Tensor,
    /// Each slice `x.select(dim, i)` is a block; negative dims count from the end.
    Dim(i64),
}

/// A validated block floating point format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    wl: u32,
    scope: BlockScope,
}

impl Block {
    /// Block floating point with `2 <= wl <= 32` bits per element.
    pub fn new(wl: u32, scope: BlockScope) -> Result<Self, FormatError> {
        if !(2..=32).contains(&wl) {
            return Err(FormatError::OutOfRange {
                format: "block",
                param: "wl",
                value: wl as i64,
                valid: "2..=32",
            });
        }
        Ok(Block { wl, scope })
    }

    /// Bits per element.
    pub fn wl(&self) -> u32 {
        self.wl
    }

    /// Which elements share an exponent.
    pub fn scope(&self) -> BlockScope {
        self.scope
    }

    /// Rounds `x` in a block whose largest finite magnitude is `block_max` (0 if none).
    #[inline(always)]
    pub fn round<R: RoundingRule>(&self, x: f64, block_max: f64, rule: R, random: u32) -> f64 {
        if x.is_nan() {
            // Quiet, with its sign and payload (IEEE 754's propagation). Set explicitly: a
            // compiler may fold an f32 -> f64 -> f32 round trip to nothing, which would let
            // a signalling NaN through on one path and not on another.
            return f64::from_bits(x.to_bits() | QUIET_NAN_BIT);
        }
        if x.is_infinite() {
            return x;
        }
        if block_max == 0.0 || x == 0.0 {
            return 0.0;
        }
        let e = parts(block_max).e;
        round_fixed(
            x,
            e - (self.wl as i32 - 2),
            self.wl,
            true,
            false,
            rule,
            random,
        )
    }
}

/// Largest finite magnitude among `values` (0 when there is none).
pub fn block_max<I: IntoIterator<Item = f64>>(values: I) -> f64 {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, |m, v| m.max(v.abs()))
}

/// How the elements of a contiguous tensor of shape `dims` are grouped into blocks: element
/// `i` (logical row-major index) is in block `(i / inner) % count`.
///
/// Both are at least 1. For a tensor with elements that is what the shape gives (every
/// dimension is at least 1); an empty tensor has no element to place, and clamping keeps
/// the index arithmetic of every kernel (the CPU's and the CUDA one) free of division by
/// zero without a special case there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockGrid {
    inner: usize,
    count: usize,
}

impl BlockGrid {
    /// The grid of `scope` over a tensor of shape `dims`; an error when a `dim` scope names
    /// no dimension of the tensor (empty or not).
    pub(crate) fn new(scope: BlockScope, dims: &[usize]) -> Result<Self, FormatError> {
        match scope {
            BlockScope::Tensor => Ok(BlockGrid { inner: 1, count: 1 }),
            BlockScope::Dim(d) => {
                let rank = dims.len() as i64;
                let resolved = if d < 0 { d + rank } else { d };
                if resolved < 0 || resolved >= rank {
                    return Err(FormatError::Inconsistent {
                        format: "block",
                        reason: format!(
                            "dim={d} is out of range for a tensor of rank {rank} (shape {dims:?})"
                        ),
                    });
                }
                let r = resolved as usize;
                Ok(BlockGrid {
                    inner: dims[r + 1..].iter().product::<usize>().max(1),
                    count: dims[r].max(1),
                })
            }
        }
    }

    /// Consecutive elements per block slice (the product of the dimensions after the
    /// block dimension), at least 1.
    pub(crate) fn inner(&self) -> usize {
        self.inner
    }

    /// Number of blocks (the size of the block dimension), at least 1.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The block of element `i` (logical row-major index).
    #[inline(always)]
    pub(crate) fn block_of(&self, i: usize) -> usize {
        if self.count == 1 {
            0
        } else {
            (i / self.inner) % self.count
        }
    }
}
