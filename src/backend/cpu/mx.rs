//! The CPU kernels of the block-scaled formats, MX and NVFP4: every block's largest
//! magnitude (NaN and ±Inf count as +Inf, which makes the block NaN), then each element
//! rounded with its block's scale.
//!
//! f32 data takes the integer fast paths of [`mx_plan`](crate::backend::mx_plan) and
//! [`nvfp4_plan`](crate::backend::nvfp4_plan), which give the scalar rules' bits without
//! dividing: a block's parameters follow from the bits of its maximum (a table lookup for
//! MX, an estimate corrected by two exact threshold compares for NVFP4's E4M3 scale), and
//! elements are rounded many lanes at a time, compiled for AVX-512 or AVX2 where the CPU has
//! them (integer operations only, so every instruction set gives the same bits).
//!
//! - Blocks of aligned consecutive elements (along the last axis, whose length is a
//!   multiple of the block size): one pass does both steps on each run of [`RUN`] elements
//!   while it is in cache (MX block by block; NVFP4 the rows of all the run's blocks first,
//!   so that their scale computations overlap, then the elements); the parameters of a
//!   block are the same in all its lanes. NVFP4's rows are computed 16 blocks at a time in
//!   AVX-512 lanes where the CPU has it ([`nvfp4_rows`](super::nvfp4_rows), the same rows as
//!   block by block), and each NVFP4 run asks the cache for the next run's lines while it is
//!   rounded: a run is 4 KiB, and the hardware prefetchers stop at page boundaries, so the
//!   first pass over each run waited for memory.
//! - MX blocks along a non-last axis of inner stride `S >= 16` (the product of the dims
//!   after the block axis), deterministic rules: the rows of one block index are a
//!   contiguous slab of at most 32 rows of `S` elements, and column `c` of the slab is one
//!   block. Each tile of 32 rows by 16 columns is done in one pass while it is in cache: the
//!   16 columns' maxima by a lane-wise max over the rows, each lane's block parameters from
//!   the same table as the aligned path (so the same scale as the scalar rule, NaN and Inf
//!   blocks included), then each row of 16 elements rounded with its lane's parameters by
//!   the same lane step. A short last block is a slab of fewer rows; the last `S mod 16`
//!   columns are done lane by lane with the same step. The rows of a tile are `4 · S` bytes
//!   apart, a walk the hardware prefetchers do not follow, so the maxima pass asks for each
//!   row's line four tiles ahead (in the next slab past the last column); this changes no
//!   value and took the pass from waiting on memory most of its time to about the copy's
//!   speed. Stochastic rounding keeps the walked
//!   path below (its random word is the element's word of the stream).
//! - Other blocks (along another axis, or with a shorter last block): the maxima come from
//!   a first pass (an integer max over magnitude bits, vectorised across the inner
//!   dimension), and each run is walked block segment by segment, the parameters of each
//!   element's block staged per lane (MX) or looked up per element (NVFP4).
//!
//! MX leaves subnormal f32 inputs to the scalar rule (their binade is not their exponent
//! byte's); the pass writes them unchanged and the run is scanned for them afterwards.
//! Stochastic NVFP4 decides from an f32 quotient estimate
//! ([`nvfp4_stochastic_plan`](crate::backend::nvfp4_stochastic_plan)) and leaves the few
//! elements near a decision boundary to the scalar rule the same way. Other dtypes go
//! through f64: those elements take the scalar rules, with the block scales computed once
//! per block.

use rayon::prelude::*;

use super::{fill_dispatch, for_each_chunk, in_parallel, map_elements, Element};
use super::{CHUNK, RUN};
use crate::backend::mx_plan::{mag_bits, MxBlock, MxF32Plan};
use crate::backend::nvfp4_plan::{Nvfp4F32Plan, Nvfp4Scales};
use crate::backend::nvfp4_stochastic_plan::{Nvfp4SrPlan, SrBits, SrRow};
use crate::format::mx::{MxGrid, MX_BLOCK};
use crate::format::nvfp4::NVFP4_BLOCK;
use crate::format::rounding::RuleKind;
use crate::format::{block, Mx, Nvfp4, RoundingRule};
use crate::philox::Stream;

/// Magnitude of an element for the maxima: NaN and ±Inf become +Inf.
#[inline(always)]
fn magnitude<T: Element>(x: T) -> f64 {
    let v = x.to_f64();
    if v.is_finite() {
        v.abs()
    } else {
        f64::INFINITY
    }
}

/// The largest `key` of every block of `grid` (`zero` for none), in parallel over rows; for
/// blocks along another axis the maxima are taken across the inner dimension, which
/// vectorises.
fn block_maxima<T: Element, M: Copy + Send + Sync>(
    data: &[T],
    grid: &MxGrid,
    zero: M,
    key: impl Fn(T) -> M + Sync,
    max: impl Fn(M, M) -> M + Sync,
) -> Vec<M> {
    let mut amax = vec![zero; grid.count()];
    if data.is_empty() {
        return amax;
    }
    let row = grid.len() * grid.inner();
    let row_blocks = grid.along() * grid.inner();
    let rows = (CHUNK / row).max(1);
    let work = |(data, amax): (&[T], &mut [M])| {
        for (data, amax) in data.chunks(row).zip(amax.chunks_mut(row_blocks)) {
            if grid.inner() == 1 {
                for (xs, m) in data.chunks(grid.size()).zip(amax.iter_mut()) {
                    *m = xs.iter().fold(zero, |m, &x| max(m, key(x)));
                }
            } else {
                let inner = grid.inner();
                for (a, xs) in data.chunks(inner).enumerate() {
                    let blocks = &mut amax[(a / grid.size()) * inner..][..inner];
                    for (m, &x) in blocks.iter_mut().zip(xs) {
                        *m = max(*m, key(x));
                    }
                }
            }
        }
    };
    if in_parallel(data.len()) {
        data.par_chunks(row * rows)
            .zip(amax.par_chunks_mut(row_blocks * rows))
            .for_each(work);
    } else {
        data.chunks(row * rows)
            .zip(amax.chunks_mut(row_blocks * rows))
            .for_each(work);
    }
    amax
}

/// Largest magnitude of every block of `grid` (NaN and ±Inf count as +Inf).
fn block_amax<T: Element>(data: &[T], grid: &MxGrid) -> Vec<f64> {
    block_maxima(data, grid, 0f64, magnitude, f64::max)
}

/// Largest magnitude of every block of an f32 tensor as magnitude bits (NaN and ±Inf as
/// +Inf's bits; the order of the bits is the order of the magnitudes).
fn block_amax_bits(data: &[f32], grid: &MxGrid) -> Vec<u32> {
    block_maxima(data, grid, 0u32, |x: f32| mag_bits(x.to_bits()), u32::max)
}

/// The next run of a chunk, whose cache lines a run asks for while it is rounded: its output
/// and, from a source, its input (empty after a chunk's last run). A hint only: it changes
/// no result. A run is 4 KiB, about a page, and the hardware prefetchers stop at page
/// boundaries, so without it each run's first pass waits for memory.
#[derive(Clone, Copy)]
struct NextRun<'a> {
    out: &'a [f32],
    inp: Option<&'a [f32]>,
}

impl NextRun<'_> {
    /// Asks for the lines of block `j` (`j < RUN / 16`) of the next run; block 0 also asks
    /// for the run's last element (a run may start anywhere in a line, so it touches one
    /// line more than it has blocks).
    #[inline(always)]
    fn prefetch(&self, j: usize) {
        prefetch_at(self.out, j);
        if let Some(inp) = self.inp {
            prefetch_at(inp, j);
        }
    }
}

/// Asks for the line of `xs[16 j]` (and for `j` 0 that of `xs`'s last element).
#[inline(always)]
fn prefetch_at(xs: &[f32], j: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of x86_64; a prefetch reads nothing and cannot fault (and
        // the addresses are elements of `xs`).
        let prefetch = |x: &f32| unsafe { _mm_prefetch::<_MM_HINT_T0>((x as *const f32).cast()) };
        if let Some(x) = xs.get(j * NVFP4_BLOCK) {
            prefetch(x);
        }
        if j == 0 {
            if let Some(x) = xs.last() {
                prefetch(x);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (xs, j);
}

/// Calls `f(start, run, next)` for each run of [`RUN`] elements of the chunk `out` that
/// starts at element `base` of the tensor, with the next run of the chunk (from `src` when
/// given).
fn for_each_run(
    src: Option<&[f32]>,
    base: usize,
    out: &mut [f32],
    mut f: impl FnMut(usize, &mut [f32], NextRun<'_>),
) {
    let mut start = 0;
    let mut rest = out;
    while !rest.is_empty() {
        let len = RUN.min(rest.len());
        let (o, tail) = std::mem::take(&mut rest).split_at_mut(len);
        let next_len = RUN.min(tail.len());
        let next = NextRun {
            out: &tail[..next_len],
            inp: src.map(|s| &s[base + start + len..][..next_len]),
        };
        f(start, o, next);
        rest = tail;
        start += len;
    }
}

/// A pass over one run that [`run_simd`] compiles for AVX-512 or AVX2 (its `run` is inlined
/// into a function with those target features).
trait SimdPass {
    /// Runs the pass; true if some element needs the scalar rule.
    fn run(self) -> bool;
}

/// Runs `pass` compiled for AVX-512 or AVX2 when the CPU has them.
#[inline(always)]
fn run_simd<P: SimdPass>(pass: P) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if super::has_avx512() {
            // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL, checked just above.
            return unsafe { run_avx512(pass) };
        }
        if super::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA, checked just above.
            return unsafe { run_avx2(pass) };
        }
    }
    pass.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn run_avx512<P: SimdPass>(pass: P) -> bool {
    pass.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<P: SimdPass>(pass: P) -> bool {
    pass.run()
}

/// Walks the blocks of a grid from an element index on, in logical order.
struct Walker {
    grid: MxGrid,
    o: usize,
    a: usize,
    k: usize,
}

impl Walker {
    fn at(grid: MxGrid, i: usize) -> Self {
        Walker {
            grid,
            k: i % grid.inner(),
            a: (i / grid.inner()) % grid.len(),
            o: i / (grid.inner() * grid.len()),
        }
    }

    /// Splits the next `n` elements into segments: `put(start, len, first_block, step)`,
    /// where the elements of a segment are in blocks `first_block + j * step` (`step` 0: one
    /// block; 1: consecutive blocks).
    #[inline(always)]
    fn segments(&mut self, n: usize, mut put: impl FnMut(usize, usize, usize, usize)) {
        let g = self.grid;
        let mut start = 0;
        while start < n {
            let first = (self.o * g.along() + self.a / g.size()) * g.inner() + self.k;
            if g.inner() == 1 {
                let len = (g.size() - self.a % g.size())
                    .min(g.len() - self.a)
                    .min(n - start);
                put(start, len, first, 0);
                start += len;
                self.a += len;
            } else {
                let len = (g.inner() - self.k).min(n - start);
                put(start, len, first, 1);
                start += len;
                self.k += len;
                if self.k == g.inner() {
                    self.k = 0;
                    self.a += 1;
                }
            }
            if self.a == g.len() {
                self.a = 0;
                self.o += 1;
            }
        }
    }
}

/// Whether an f32 is a nonzero subnormal (the MX fast path leaves those to the scalar rule).
#[inline(always)]
fn is_subnormal(x: f32) -> bool {
    let abs = x.to_bits() & 0x7fff_ffff;
    (abs != 0) & (abs < 0x0080_0000)
}

/// Redoes the elements of a run the MX pass left to the scalar rule: `out[j]` with a
/// subnormal input (`inp[j]`, or `out[j]` itself in place, where the pass left them
/// unchanged; a result that is subnormal is rounded again to itself) in the block of scale
/// `scale(j)`.
fn mx_fix_run<R: RoundingRule>(
    mx: &Mx,
    inp: Option<&[f32]>,
    out: &mut [f32],
    words: &[u32],
    rule: R,
    scale: impl Fn(usize) -> Option<i32>,
) {
    for j in 0..out.len() {
        let x = inp.map_or(out[j], |inp| inp[j]);
        if is_subnormal(x) {
            out[j] = mx.round(x as f64, scale(j), rule, words[j]) as f32;
        }
    }
}

/// Rounds to an MX format: block scales, then the elements.
pub(crate) fn quantize_mx<T: Element, R: RoundingRule>(
    src: Option<&[T]>,
    dst: &mut [T],
    dims: &[usize],
    mx: &Mx,
    rule: R,
    stream: Option<Stream>,
) -> candle_core::Result<()> {
    let grid = MxGrid::new(MX_BLOCK, mx.dim(), dims, "mx")?;
    if let Some(out) = T::as_f32s_mut(dst) {
        let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
        let plan = MxF32Plan::new(mx);
        if grid.inner() == 1 && grid.len().is_multiple_of(MX_BLOCK) {
            mx_aligned(src, out, mx, &plan, rule, stream);
        } else if grid.inner() >= GROUP && R::KIND != RuleKind::Stochastic {
            mx_strided(src, out, grid, mx, &plan, rule);
        } else {
            mx_walked(src, out, grid, mx, &plan, rule, stream);
        }
        return Ok(());
    }
    let amax = block_amax(src.unwrap_or(dst), &grid);
    let scales: Vec<Option<i32>> = amax.iter().map(|&m| mx.scale_exponent(m)).collect();
    map_elements(src, dst, stream, |i, x, r| {
        mx.round(x, scales[grid.block_of(i)], rule, r)
    });
    Ok(())
}

/// One run of aligned MX blocks: each block's maximum (kept in `amax`), then its elements.
struct MxAlignedRun<'a, R> {
    plan: &'a MxF32Plan,
    inp: Option<&'a [f32]>,
    out: &'a mut [f32],
    words: &'a [u32],
    amax: &'a mut [u32],
    rule: R,
}

/// Rounds one MX block's elements `x` into `o`; 1 if some element needs the scalar rule.
#[inline(always)]
fn mx_round_block<R: RoundingRule, const TINY: bool>(
    plan: &MxF32Plan,
    x: &[f32; MX_BLOCK],
    r: &[u32; MX_BLOCK],
    o: &mut [f32; MX_BLOCK],
    block: MxBlock,
    rule: R,
) -> u32 {
    let mut any_slow = 0u32;
    for j in 0..MX_BLOCK {
        let (v, slow) = plan.round_lane::<R, TINY>(x[j].to_bits(), r[j], block, rule);
        o[j] = f32::from_bits(v);
        any_slow |= slow as u32;
    }
    any_slow
}

impl<R: RoundingRule> MxAlignedRun<'_, R> {
    /// Rounds block `b` of the run; 1 if some element needs the scalar rule.
    #[inline(always)]
    fn round_at<const TINY: bool>(&mut self, b: usize) -> u32 {
        let at = b * MX_BLOCK;
        let o: &mut [f32; MX_BLOCK] = (&mut self.out[at..at + MX_BLOCK])
            .try_into()
            .expect("a whole block");
        let x: [f32; MX_BLOCK] = match self.inp {
            Some(inp) => inp[at..at + MX_BLOCK].try_into().expect("a whole block"),
            None => *o,
        };
        let r: [u32; MX_BLOCK] = if R::KIND == RuleKind::Stochastic {
            self.words[at..at + MX_BLOCK]
                .try_into()
                .expect("a whole block")
        } else {
            [0; MX_BLOCK]
        };
        let block = self.plan.block(self.amax[b]);
        mx_round_block::<R, TINY>(self.plan, &x, &r, o, block, self.rule)
    }
}

impl<R: RoundingRule> SimdPass for MxAlignedRun<'_, R> {
    /// The blocks' maxima and smallest nonzero magnitudes first, sorting the blocks into
    /// those with an element whose step exceeds its value and the others, then each list
    /// with its own loop (a branch per block on that case mispredicts often).
    #[inline(always)]
    fn run(mut self) -> bool {
        const BLOCKS: usize = RUN / MX_BLOCK;
        let n = self.out.len() / MX_BLOCK;
        let mut plain = [0u8; BLOCKS];
        let mut tiny = [0u8; BLOCKS];
        let (mut n_plain, mut n_tiny) = (0, 0);
        for b in 0..n {
            let xs = match self.inp {
                Some(inp) => &inp[b * MX_BLOCK..][..MX_BLOCK],
                None => &self.out[b * MX_BLOCK..][..MX_BLOCK],
            };
            let x: [f32; MX_BLOCK] = xs.try_into().expect("a whole block");
            let m = x.iter().fold(0, |m, x| m.max(mag_bits(x.to_bits())));
            self.amax[b] = m;
            // The smallest nonzero magnitude less one (zeros wrap to the top).
            let low = x.iter().fold(u32::MAX, |m, x| {
                m.min((x.to_bits() & 0x7fff_ffff).wrapping_sub(1))
            });
            let has_tiny = low < MxF32Plan::tiny_below(self.plan.block(m));
            plain[n_plain] = b as u8;
            tiny[n_tiny] = b as u8;
            n_plain += !has_tiny as usize;
            n_tiny += has_tiny as usize;
        }
        let mut any_slow = 0u32;
        for &b in &plain[..n_plain] {
            any_slow |= self.round_at::<false>(b as usize);
        }
        for &b in &tiny[..n_tiny] {
            any_slow |= self.round_at::<true>(b as usize);
        }
        any_slow != 0
    }
}

/// MX on f32 with blocks of 32 aligned consecutive elements (a multiple of 32 along the
/// last axis): maxima and elements in one pass, block by block.
fn mx_aligned<R: RoundingRule>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    mx: &Mx,
    plan: &MxF32Plan,
    rule: R,
    stream: Option<Stream>,
) {
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        let mut words = [0u32; RUN];
        let mut amax = [0u32; RUN / MX_BLOCK];
        let mut start = 0;
        while start < out.len() {
            let len = RUN.min(out.len() - start);
            let first = base + start;
            if let Some(stream) = stream {
                fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
            }
            let inp = src.map(|s| &s[first..first + len]);
            let o = &mut out[start..start + len];
            let amax = &mut amax[..len / MX_BLOCK];
            let words = &words[..len];
            let pass = MxAlignedRun {
                plan,
                inp,
                out: o,
                words,
                amax,
                rule,
            };
            if run_simd(pass) {
                let scale = |j: usize| MxF32Plan::scale_exponent(mx, amax[j / MX_BLOCK]);
                mx_fix_run(mx, inp, &mut out[start..start + len], words, rule, scale);
            }
            start += len;
        }
    };
    for_each_chunk(dst, work);
}

/// One run of MX elements with the parameters of each element's block staged per lane.
struct MxLanesRun<'a, R> {
    plan: &'a MxF32Plan,
    inp: Option<&'a [f32]>,
    out: &'a mut [f32],
    words: &'a [u32],
    k: &'a [u32],
    limit: &'a [u32],
    tiny: &'a [u32],
    rule: R,
}

/// Lanes per group of the staged MX pass (one AVX-512 vector).
const GROUP: usize = 16;

impl<R: RoundingRule> SimdPass for MxLanesRun<'_, R> {
    #[inline(always)]
    fn run(self) -> bool {
        let stochastic = R::KIND == RuleKind::Stochastic;
        let n = self.out.len();
        let full = n - n % GROUP;
        let mut any_slow = 0u32;
        let lane = |x: f32, r: u32, i: usize| {
            let block = MxBlock {
                k: self.k[i] as i32,
                limit: self.limit[i],
                tiny: self.tiny[i],
            };
            self.plan
                .round_lane::<R, true>(x.to_bits(), r, block, self.rule)
        };
        for g in (0..full).step_by(GROUP) {
            let o: &mut [f32; GROUP] = (&mut self.out[g..g + GROUP])
                .try_into()
                .expect("a full group");
            let x: [f32; GROUP] = match self.inp {
                Some(inp) => inp[g..g + GROUP].try_into().expect("a full group"),
                None => *o,
            };
            let r: [u32; GROUP] = if stochastic {
                self.words[g..g + GROUP].try_into().expect("a full group")
            } else {
                [0; GROUP]
            };
            let k: &[u32; GROUP] = self.k[g..g + GROUP].try_into().expect("a full group");
            let limit: &[u32; GROUP] = self.limit[g..g + GROUP].try_into().expect("a full group");
            let tiny: &[u32; GROUP] = self.tiny[g..g + GROUP].try_into().expect("a full group");
            any_slow |=
                mx_round_lanes::<R, true>(self.plan, &x, &r, [k, limit, tiny], o, self.rule);
        }
        for j in full..n {
            let x = self.inp.map_or(self.out[j], |inp| inp[j]);
            let (v, slow) = lane(x, if stochastic { self.words[j] } else { 0 }, j);
            self.out[j] = f32::from_bits(v);
            any_slow |= slow as u32;
        }
        any_slow != 0
    }
}

/// Rounds a group of MX elements `x` into `o`, each with its own block's parameters
/// (`k`, limit, step per lane); 1 if some element needs the scalar rule.
#[inline(always)]
fn mx_round_lanes<R: RoundingRule, const TINY: bool>(
    plan: &MxF32Plan,
    x: &[f32; GROUP],
    r: &[u32; GROUP],
    [k, limit, tiny]: [&[u32; GROUP]; 3],
    o: &mut [f32; GROUP],
    rule: R,
) -> u32 {
    let mut any_slow = 0u32;
    for j in 0..GROUP {
        let block = MxBlock {
            k: k[j] as i32,
            limit: limit[j],
            tiny: tiny[j],
        };
        let (v, slow) = plan.round_lane::<R, TINY>(x[j].to_bits(), r[j], block, rule);
        o[j] = f32::from_bits(v);
        any_slow |= slow as u32;
    }
    any_slow
}

/// MX on f32 with any blocks: the maxima first, then each run with its elements' block
/// parameters staged per lane from the walked block segments.
fn mx_walked<R: RoundingRule>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    grid: MxGrid,
    mx: &Mx,
    plan: &MxF32Plan,
    rule: R,
    stream: Option<Stream>,
) {
    let amax = block_amax_bits(src.unwrap_or(dst), &grid);
    let blocks: Vec<MxBlock> = amax.iter().map(|&m| plan.block(m)).collect();
    let ks: Vec<u32> = blocks.iter().map(|b| b.k as u32).collect();
    let limits: Vec<u32> = blocks.iter().map(|b| b.limit).collect();
    let tinies: Vec<u32> = blocks.iter().map(|b| b.tiny).collect();
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        let mut walker = Walker::at(grid, base);
        let mut words = [0u32; RUN];
        let mut k = [0u32; RUN];
        let mut limit = [0u32; RUN];
        let mut tiny = [0u32; RUN];
        let mut start = 0;
        while start < out.len() {
            let len = RUN.min(out.len() - start);
            let first = base + start;
            if let Some(stream) = stream {
                fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
            }
            walker.segments(len, |s, l, b, step| {
                if step == 0 {
                    k[s..s + l].fill(ks[b]);
                    limit[s..s + l].fill(limits[b]);
                    tiny[s..s + l].fill(tinies[b]);
                } else {
                    k[s..s + l].copy_from_slice(&ks[b..b + l]);
                    limit[s..s + l].copy_from_slice(&limits[b..b + l]);
                    tiny[s..s + l].copy_from_slice(&tinies[b..b + l]);
                }
            });
            let inp = src.map(|s| &s[first..first + len]);
            let words = &words[..len];
            let pass = MxLanesRun {
                plan,
                inp,
                out: &mut out[start..start + len],
                words,
                k: &k[..len],
                limit: &limit[..len],
                tiny: &tiny[..len],
                rule,
            };
            if run_simd(pass) {
                let scale =
                    |j: usize| MxF32Plan::scale_exponent(mx, amax[grid.block_of(first + j)]);
                mx_fix_run(mx, inp, &mut out[start..start + len], words, rule, scale);
            }
            start += len;
        }
    };
    for_each_chunk(dst, work);
}

/// One slab of MX blocks along a non-last axis: the `rows` (at most [`MX_BLOCK`]) rows of
/// one block index, each of `inner` contiguous elements, so that column `c` of the slab is
/// block `c` of the slab's row of blocks.
struct MxSlab<'a, R> {
    plan: &'a MxF32Plan,
    mx: &'a Mx,
    inp: Option<&'a [f32]>,
    out: &'a mut [f32],
    inner: usize,
    rule: R,
}

impl<R: RoundingRule> MxSlab<'_, R> {
    /// The input element at slab index `at` (the output itself in place).
    #[inline(always)]
    fn input(&self, at: usize) -> f32 {
        self.inp.map_or(self.out[at], |inp| inp[at])
    }

    /// Redoes the elements of the tile of columns `c0..c0 + n` that the lane step left to the
    /// scalar rule (subnormal inputs, written unchanged), with the columns' maxima `amax`.
    fn fix_tile(&mut self, c0: usize, n: usize, amax: &[u32]) {
        let rows = self.out.len() / self.inner;
        for r in 0..rows {
            for (j, &m) in amax[..n].iter().enumerate() {
                let at = r * self.inner + c0 + j;
                let x = self.input(at);
                if is_subnormal(x) {
                    let scale = MxF32Plan::scale_exponent(self.mx, m);
                    self.out[at] = self.mx.round(x as f64, scale, self.rule, 0) as f32;
                }
            }
        }
    }
}

impl<R: RoundingRule> SimdPass for MxSlab<'_, R> {
    /// Tiles of [`GROUP`] columns by the slab's rows: the columns' maxima (and smallest
    /// nonzero magnitudes) with lane-wise max (min) over the rows, each lane's block
    /// parameters from the plan's table (the scalar rule's scale, see [`MxF32Plan::block`]),
    /// then every row of the tile rounded with them, leaving out the case of a step above
    /// the value where no element of the tile has one; the last columns (fewer than
    /// [`GROUP`]) lane by lane.
    #[inline(always)]
    fn run(mut self) -> bool {
        let inner = self.inner;
        let rows = self.out.len() / inner;
        let full = inner - inner % GROUP;
        let source = self.inp.unwrap_or(self.out).as_ptr();
        for c0 in (0..full).step_by(GROUP) {
            let mut amax = [0u32; GROUP];
            let mut low = [u32::MAX; GROUP];
            for r in 0..rows {
                let at = r * inner + c0;
                prefetch_ahead(source, at, c0, rows, inner);
                let x: &[f32; GROUP] = match self.inp {
                    Some(inp) => inp[at..at + GROUP].try_into().expect("a full group"),
                    None => self.out[at..at + GROUP].try_into().expect("a full group"),
                };
                for j in 0..GROUP {
                    let bits = x[j].to_bits();
                    amax[j] = amax[j].max(mag_bits(bits));
                    // The smallest nonzero magnitude less one (zeros wrap to the top).
                    low[j] = low[j].min((bits & 0x7fff_ffff).wrapping_sub(1));
                }
            }
            let mut k = [0u32; GROUP];
            let mut limit = [0u32; GROUP];
            let mut tiny = [0u32; GROUP];
            let mut has_tiny = false;
            for j in 0..GROUP {
                let block = self.plan.block(amax[j]);
                k[j] = block.k as u32;
                limit[j] = block.limit;
                tiny[j] = block.tiny;
                has_tiny |= low[j] < MxF32Plan::tiny_below(block);
            }
            let r = [0u32; GROUP];
            let mut any_slow = 0u32;
            for row in 0..rows {
                let at = row * inner + c0;
                let o: &mut [f32; GROUP] = (&mut self.out[at..at + GROUP])
                    .try_into()
                    .expect("a full group");
                let x: [f32; GROUP] = match self.inp {
                    Some(inp) => inp[at..at + GROUP].try_into().expect("a full group"),
                    None => *o,
                };
                let params = [&k, &limit, &tiny];
                any_slow |= if has_tiny {
                    mx_round_lanes::<R, true>(self.plan, &x, &r, params, o, self.rule)
                } else {
                    mx_round_lanes::<R, false>(self.plan, &x, &r, params, o, self.rule)
                };
            }
            if any_slow != 0 {
                self.fix_tile(c0, GROUP, &amax);
            }
        }
        let n = inner - full;
        if n > 0 {
            let mut amax = [0u32; GROUP];
            for r in 0..rows {
                for (j, m) in amax[..n].iter_mut().enumerate() {
                    *m = (*m).max(mag_bits(self.input(r * inner + full + j).to_bits()));
                }
            }
            let mut any_slow = false;
            for r in 0..rows {
                for (j, &m) in amax[..n].iter().enumerate() {
                    let at = r * inner + full + j;
                    let x = self.input(at);
                    let block = self.plan.block(m);
                    let (v, slow) =
                        self.plan
                            .round_lane::<R, true>(x.to_bits(), 0, block, self.rule);
                    self.out[at] = f32::from_bits(v);
                    any_slow |= slow;
                }
            }
            if any_slow {
                self.fix_tile(full, n, &amax);
            }
        }
        false
    }
}

/// How far ahead [`prefetch_ahead`] reads, in elements of a row: four tiles (256 bytes).
const PREFETCH_AHEAD: usize = 4 * GROUP;

/// Asks for the cache line [`PREFETCH_AHEAD`] elements to the right of slab index `at`
/// (row `at / inner`, tile column `c0`) to be loaded, so that the tile `PREFETCH_AHEAD`
/// columns on has its rows in cache when its maxima are taken. Past the slab's last column
/// the line is the same row's in the next slab (which follows in memory), where the next
/// slab's first tiles are. The hardware prefetchers do not follow this walk (32 lines `4 ·
/// inner` bytes apart per tile), and without it the maxima pass waited on memory for most
/// of its time. A prefetch never faults and changes no value, so an address past the data
/// (after the last slab) is harmless; it is formed with wrapping arithmetic and never read.
#[inline(always)]
fn prefetch_ahead(source: *const f32, at: usize, c0: usize, rows: usize, inner: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let ahead = if c0 + PREFETCH_AHEAD >= inner {
            at + PREFETCH_AHEAD + (rows - 1) * inner
        } else {
            at + PREFETCH_AHEAD
        };
        // SAFETY: `prefetcht0` (SSE, part of x86_64) reads no memory the program sees and
        // never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                source.wrapping_add(ahead) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (source, at, c0, rows, inner);
}

/// Deterministic MX on f32 with blocks along a non-last axis (inner stride at least
/// [`GROUP`]): each block index's rows form one contiguous slab, rounded tile by tile in one
/// pass ([`MxSlab`]) while the tile is in cache; slabs run in parallel.
fn mx_strided<R: RoundingRule>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    grid: MxGrid,
    mx: &Mx,
    plan: &MxF32Plan,
    rule: R,
) {
    let inner = grid.inner();
    let per_outer = grid.len() * inner;
    let per_slab = MX_BLOCK * inner;
    let slab = |o: usize, b: usize, out: &mut [f32]| {
        let first = o * per_outer + b * per_slab;
        let inp = src.map(|s| &s[first..first + out.len()]);
        run_simd(MxSlab {
            plan,
            mx,
            inp,
            out,
            inner,
            rule,
        });
    };
    if in_parallel(dst.len()) {
        let slabs: Vec<(usize, usize, &mut [f32])> = dst
            .chunks_mut(per_outer)
            .enumerate()
            .flat_map(|(o, outer)| {
                outer
                    .chunks_mut(per_slab)
                    .enumerate()
                    .map(move |(b, out)| (o, b, out))
            })
            .collect();
        slabs
            .into_par_iter()
            .with_min_len(CHUNK.div_ceil(per_slab))
            .for_each(|(o, b, out)| slab(o, b, out));
    } else {
        for (o, outer) in dst.chunks_mut(per_outer).enumerate() {
            for (b, out) in outer.chunks_mut(per_slab).enumerate() {
                slab(o, b, out);
            }
        }
    }
}

/// Rounds to NVFP4: the tensor scale, the block scales, then the elements.
pub(crate) fn quantize_nvfp4<T: Element, R: RoundingRule>(
    src: Option<&[T]>,
    dst: &mut [T],
    dims: &[usize],
    nv: &Nvfp4,
    rule: R,
    stream: Option<Stream>,
) -> candle_core::Result<()> {
    let grid = MxGrid::new(NVFP4_BLOCK, nv.dim(), dims, "nvfp4")?;
    let data = src.unwrap_or(dst);
    let tensor_max = match T::as_f32s(data) {
        Some(xs) => super::max_abs_f32(xs),
        None => block::block_max(data.iter().map(|x| x.to_f64())),
    };
    let s_t = Nvfp4::tensor_scale(tensor_max);
    if let Some(out) = T::as_f32s_mut(dst) {
        let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
        let aligned = grid.inner() == 1 && grid.len().is_multiple_of(NVFP4_BLOCK);
        match Nvfp4F32Plan::new(s_t, R::KIND) {
            Some(plan) if aligned => nvfp4_aligned(src, out, &plan),
            Some(plan) => nvfp4_walked(src, out, grid, &plan),
            None => nvfp4_stochastic(src, out, grid, s_t, rule, stream),
        }
        return Ok(());
    }
    let scales: Vec<f64> = block_amax(src.unwrap_or(dst), &grid)
        .iter()
        .map(|&m| Nvfp4::block_scale(m, s_t))
        .collect();
    if R::KIND == RuleKind::Stochastic {
        map_elements(src, dst, stream, |i, x, r| {
            Nvfp4::round(x, scales[grid.block_of(i)], s_t, rule, r)
        });
        return Ok(());
    }
    // Deterministic rules: blocks tracked by a walker, the E2M1 choice made on the f64
    // quotient where it decides the exact one (see `nvfp4_fast`).
    let divisors: Vec<f64> = scales.iter().map(|&s_b| s_b * s_t).collect();
    let work = |chunk: usize, out: &mut [T]| {
        let base = chunk * CHUNK;
        let inp = src.map(|s| &s[base..base + out.len()]);
        let mut walker = Walker::at(grid, base);
        walker.segments(out.len(), |start, len, first, step| {
            for j in start..start + len {
                let block = first + (j - start) * step;
                let x = match inp {
                    Some(inp) => inp[j],
                    None => out[j],
                }
                .to_f64();
                let d = divisors[block];
                let y = nvfp4_fast(x, d, rule)
                    .unwrap_or_else(|| Nvfp4::round(x, scales[block], s_t, rule, 0));
                out[j] = T::from_f64(y);
            }
        });
    };
    for_each_chunk(dst, work);
    Ok(())
}

/// One run of aligned NVFP4 blocks: each block's maximum, its row, then its elements.
struct Nvfp4AlignedRun<'a> {
    plan: &'a Nvfp4F32Plan,
    inp: Option<&'a [f32]>,
    out: &'a mut [f32],
    next: NextRun<'a>,
}

impl SimdPass for Nvfp4AlignedRun<'_> {
    #[inline(always)]
    fn run(self) -> bool {
        let mut rows = [0u8; RUN / NVFP4_BLOCK];
        let rows = &mut rows[..self.out.len() / NVFP4_BLOCK];
        nvfp4_block_rows(self.inp.unwrap_or(self.out), &self.plan.scales, rows);
        for (b, o) in self.out.chunks_exact_mut(NVFP4_BLOCK).enumerate() {
            let o: &mut [f32; NVFP4_BLOCK] = o.try_into().expect("a whole block");
            let x: [f32; NVFP4_BLOCK] = match self.inp {
                Some(inp) => inp[b * NVFP4_BLOCK..][..NVFP4_BLOCK]
                    .try_into()
                    .expect("a whole block"),
                None => *o,
            };
            self.next.prefetch(b);
            let row = self.plan.row(rows[b] as usize);
            for j in 0..NVFP4_BLOCK {
                o[j] = f32::from_bits(Nvfp4F32Plan::round_lane(x[j].to_bits(), row));
            }
        }
        false
    }
}

/// The rows (E4M3 codes of the scales, or the NaN row) of the aligned blocks of `xs`, all
/// before any element is rounded: each block's maximum and row depend only on its own
/// elements, so the blocks' scale computations overlap instead of each waiting for the
/// previous block's elements. 16 blocks per step in AVX-512 lanes where the kernels may use
/// it ([`nvfp4_rows`](super::nvfp4_rows)), else block by block; both give the same rows.
#[inline(always)]
fn nvfp4_block_rows(xs: &[f32], scales: &Nvfp4Scales, rows: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() {
        // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL, checked just above.
        return unsafe { super::nvfp4_rows::block_rows_avx512(xs, scales, rows) };
    }
    super::nvfp4_rows::block_rows_scalar(xs, scales, rows)
}

/// Deterministic NVFP4 on f32 with blocks of 16 aligned consecutive elements: maxima,
/// scales and elements in one pass, block by block.
fn nvfp4_aligned(src: Option<&[f32]>, dst: &mut [f32], plan: &Nvfp4F32Plan) {
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        for_each_run(src, base, out, |start, o, next| {
            let inp = src.map(|s| &s[base + start..][..o.len()]);
            run_simd(Nvfp4AlignedRun {
                plan,
                inp,
                out: o,
                next,
            });
        });
    };
    for_each_chunk(dst, work);
}

/// Deterministic NVFP4 on f32 with any blocks: the maxima first, then every element with
/// its block's row.
fn nvfp4_walked(src: Option<&[f32]>, dst: &mut [f32], grid: MxGrid, plan: &Nvfp4F32Plan) {
    let rows: Vec<usize> = block_amax_bits(src.unwrap_or(dst), &grid)
        .iter()
        .map(|&m| plan.scales.row_of(m))
        .collect();
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        let inp = src.map(|s| &s[base..base + out.len()]);
        let mut walker = Walker::at(grid, base);
        walker.segments(out.len(), |start, len, first, step| {
            for j in start..start + len {
                let row = plan.row(rows[first + (j - start) * step]);
                let x = inp.map_or(out[j], |inp| inp[j]);
                out[j] = f32::from_bits(Nvfp4F32Plan::round_lane(x.to_bits(), row));
            }
        });
    };
    for_each_chunk(dst, work);
}

/// Rounds a group of stochastic NVFP4 elements `x` into `o`, each with its block's row,
/// writing the flagged elements unchanged; each lane's flag (1 for the scalar rule) into
/// `flags`, and OR-ed into `any` (lane by lane, so no reduction across lanes per group).
#[inline(always)]
fn nvfp4_sr_group<const N: usize>(
    x: &[f32; N],
    r: &[u32; N],
    row: impl Fn(usize) -> SrRow,
    sr: SrBits,
    o: &mut [f32; N],
    flags: &mut [u8; N],
    any: &mut [u8; N],
) {
    for j in 0..N {
        let bits = x[j].to_bits();
        let (v, flag) = Nvfp4SrPlan::round_lane(bits, r[j], row(j), sr);
        o[j] = f32::from_bits(if flag { bits } else { v });
        flags[j] = flag as u8;
        any[j] |= flag as u8;
    }
}

/// One run of aligned stochastic NVFP4 blocks: the rows of its blocks, then each block's
/// elements; the flag of element `j` in `flags[j]`.
struct Nvfp4SrAlignedRun<'a> {
    plan: &'a Nvfp4SrPlan,
    inp: Option<&'a [f32]>,
    out: &'a mut [f32],
    words: &'a [u32],
    rows: &'a mut [u8],
    flags: &'a mut [u8],
    sr: SrBits,
    next: NextRun<'a>,
}

impl SimdPass for Nvfp4SrAlignedRun<'_> {
    #[inline(always)]
    fn run(self) -> bool {
        let mut any = [0u8; NVFP4_BLOCK];
        nvfp4_block_rows(self.inp.unwrap_or(self.out), &self.plan.scales, self.rows);
        for (b, o) in self.out.chunks_exact_mut(NVFP4_BLOCK).enumerate() {
            let o: &mut [f32; NVFP4_BLOCK] = o.try_into().expect("a whole block");
            let at = b * NVFP4_BLOCK;
            let x: [f32; NVFP4_BLOCK] = match self.inp {
                Some(inp) => inp[at..at + NVFP4_BLOCK].try_into().expect("a whole block"),
                None => *o,
            };
            let r: &[u32; NVFP4_BLOCK] = self.words[at..at + NVFP4_BLOCK]
                .try_into()
                .expect("a whole block");
            let flags: &mut [u8; NVFP4_BLOCK] = (&mut self.flags[at..at + NVFP4_BLOCK])
                .try_into()
                .expect("a whole block");
            self.next.prefetch(b);
            let row = self.plan.row(self.rows[b] as usize);
            nvfp4_sr_group(&x, r, |_| row, self.sr, o, flags, &mut any);
        }
        any.iter().any(|&f| f != 0)
    }
}

/// One run of stochastic NVFP4 elements with the rows of their blocks staged per lane.
struct Nvfp4SrLanesRun<'a> {
    inp: Option<&'a [f32]>,
    out: &'a mut [f32],
    words: &'a [u32],
    /// Each element's row, field by field.
    inv: &'a [f32],
    d_hi: &'a [f32],
    d_lo: &'a [f32],
    nan: &'a [u32],
    /// The flag of element `j` in `flags[j]`.
    flags: &'a mut [u8],
    sr: SrBits,
}

impl SimdPass for Nvfp4SrLanesRun<'_> {
    #[inline(always)]
    fn run(self) -> bool {
        let mut any = [0u8; GROUP];
        for (g, o) in self.out.chunks_mut(GROUP).enumerate() {
            let at = g * GROUP;
            let n = o.len();
            let mut x = [0f32; GROUP];
            let mut r = [0u32; GROUP];
            let mut staged = [0f32; GROUP];
            let mut flags = [0u8; GROUP];
            x[..n].copy_from_slice(self.inp.map_or(&*o, |inp| &inp[at..at + n]));
            r[..n].copy_from_slice(&self.words[at..at + n]);
            let (inv, d_hi, d_lo, nan) = (
                &self.inv[at..at + n],
                &self.d_hi[at..at + n],
                &self.d_lo[at..at + n],
                &self.nan[at..at + n],
            );
            let row = |j: usize| {
                let j = j.min(n - 1);
                SrRow {
                    inv: inv[j],
                    d_hi: d_hi[j],
                    d_lo: d_lo[j],
                    nan: nan[j],
                }
            };
            // Lanes past `n` repeat the last element: their flags are dropped.
            let mut group_any = [0u8; GROUP];
            nvfp4_sr_group(
                &x,
                &r,
                row,
                self.sr,
                &mut staged,
                &mut flags,
                &mut group_any,
            );
            o.copy_from_slice(&staged[..n]);
            self.flags[at..at + n].copy_from_slice(&flags[..n]);
            for j in 0..n {
                any[j] |= flags[j];
            }
        }
        any.iter().any(|&f| f != 0)
    }
}

/// Stochastic NVFP4 on f32, with [`Nvfp4SrPlan::round_lane`]: for aligned blocks maxima,
/// rows and elements in one pass block by block; for other blocks the maxima first, then
/// each run with its elements' rows staged per lane from the walked block segments. The
/// elements the lane step flags are redone by the scalar rule. The random word of element
/// `i` is word `i` of the stream.
fn nvfp4_stochastic<R: RoundingRule>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    grid: MxGrid,
    s_t: f64,
    rule: R,
    stream: Option<Stream>,
) {
    let plan = Nvfp4SrPlan::new(s_t);
    let sr = SrBits::new(rule.random_bits());
    let aligned = grid.inner() == 1 && grid.len().is_multiple_of(NVFP4_BLOCK);
    let rows: Vec<u8> = if aligned {
        Vec::new()
    } else {
        block_amax_bits(src.unwrap_or(dst), &grid)
            .iter()
            .map(|&m| plan.scales.row_of(m) as u8)
            .collect()
    };
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        let mut walker = Walker::at(grid, base);
        let mut words = [0u32; RUN];
        let mut flags = [0u8; RUN];
        let mut run_rows = [0u8; RUN / NVFP4_BLOCK];
        for_each_run(src, base, out, |start, o, next| {
            let len = o.len();
            let first = base + start;
            if let Some(stream) = stream {
                fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
            }
            let inp = src.map(|s| &s[first..first + len]);
            // A flag per element: blocks (aligned) or lane groups.
            let any = if aligned {
                run_simd(Nvfp4SrAlignedRun {
                    plan: &plan,
                    inp,
                    out: o,
                    words: &words[..len],
                    rows: &mut run_rows[..len / NVFP4_BLOCK],
                    flags: &mut flags[..len],
                    sr,
                    next,
                })
            } else {
                let mut inv = [0f32; RUN];
                let mut d_hi = [0f32; RUN];
                let mut d_lo = [0f32; RUN];
                let mut nan = [0u32; RUN];
                walker.segments(len, |s, l, b, step| {
                    for j in 0..l {
                        let row = plan.row(rows[b + j * step] as usize);
                        inv[s + j] = row.inv;
                        d_hi[s + j] = row.d_hi;
                        d_lo[s + j] = row.d_lo;
                        nan[s + j] = row.nan;
                    }
                });
                run_simd(Nvfp4SrLanesRun {
                    inp,
                    out: o,
                    words: &words[..len],
                    inv: &inv[..len],
                    d_hi: &d_hi[..len],
                    d_lo: &d_lo[..len],
                    nan: &nan[..len],
                    flags: &mut flags[..len],
                    sr,
                })
            };
            if any {
                for j in (0..len).filter(|&j| flags[j] != 0) {
                    let row = if aligned {
                        run_rows[j / NVFP4_BLOCK]
                    } else {
                        rows[grid.block_of(first + j)]
                    };
                    let s_b = Nvfp4Scales::block_scale(row as usize);
                    let x = inp.map_or(o[j], |inp| inp[j]) as f64;
                    o[j] = Nvfp4::round(x, s_b, s_t, rule, words[j]) as f32;
                }
            }
        });
    };
    for_each_chunk(dst, work);
}

/// The NVFP4 element `e2m1(x / d) · d` for a deterministic rule from the f64 quotient `q`,
/// or `None` where that quotient cannot decide (`d` zero or NaN, `x` not finite or zero, or
/// `q` exactly on a rounding boundary: a midpoint for the nearest rules, an E2M1 value for
/// toward-zero). Elsewhere the exact quotient lies on the same side of every boundary as `q`
/// (the boundaries are f64 values and rounding to f64 is monotone), so the choice is the
/// exact one ([`crate::format::nvfp4::round_quotient`] decides the boundary cases).
#[inline(always)]
fn nvfp4_fast<R: RoundingRule>(x: f64, d: f64, _rule: R) -> Option<f64> {
    const VALUES: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    const MIDPOINTS: [f64; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    if d.is_nan() || d == 0.0 || !x.is_finite() || x == 0.0 {
        return None;
    }
    let q = x.abs() / d;
    let bounds = if R::KIND == RuleKind::TowardZero {
        &VALUES[1..]
    } else {
        &MIDPOINTS[..]
    };
    let mut below = 0;
    let mut tie = false;
    for &m in bounds {
        below += (m < q) as usize;
        tie |= m == q;
    }
    if tie {
        return None;
    }
    let v = VALUES[below] * d;
    Some(if x < 0.0 { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `for_each_run` visits the chunk in runs of `RUN` elements in order, and each run's
    /// `next` is exactly the run after it in the chunk (empty after the last), read from the
    /// source at the same positions when there is one.
    #[test]
    fn each_run_sees_the_following_run_as_next() {
        for len in [0usize, 1, 15, RUN - 1, RUN, RUN + 1, 3 * RUN + 17] {
            for base in [0usize, 5 * RUN] {
                let src: Vec<f32> = (0..base + len + RUN).map(|i| i as f32).collect();
                for from_src in [false, true] {
                    let mut out: Vec<f32> = (0..len).map(|i| -(i as f32)).collect();
                    let out_ptr = out.as_ptr();
                    let mut seen = Vec::new();
                    let src = from_src.then_some(&src[..]);
                    for_each_run(src, base, &mut out, |start, o, next| {
                        assert_eq!(o.as_ptr(), out_ptr.wrapping_add(start), "len {len}");
                        let rest = len - start - o.len();
                        assert_eq!(next.out.len(), rest.min(RUN), "len {len} start {start}");
                        assert_eq!(
                            next.out.as_ptr(),
                            out_ptr.wrapping_add(start + o.len()),
                            "len {len} start {start}"
                        );
                        let first_next = base + start + o.len();
                        match (src, next.inp) {
                            (Some(_), Some(inp)) => {
                                let want: Vec<f32> = (first_next..first_next + rest.min(RUN))
                                    .map(|i| i as f32)
                                    .collect();
                                assert_eq!(inp, &want[..], "len {len} start {start}");
                            }
                            (None, None) => {}
                            _ => panic!("next.inp present without a source or missing with one"),
                        }
                        seen.push((start, o.len()));
                    });
                    let want: Vec<(usize, usize)> = (0..len)
                        .step_by(RUN)
                        .map(|s| (s, RUN.min(len - s)))
                        .collect();
                    assert_eq!(seen, want, "len {len} base {base}");
                }
            }
        }
    }
}
