//! The CPU quantize kernel: one pass over contiguous memory, chunked across threads,
//! monomorphised per format family and rounding mode.
//!
//! Element `i` (its position in the tensor's logical row-major order) reads its random bits
//! from the stochastic stream at index `i`, so results do not depend on how the work is split
//! between threads or on the source layout. Strided inputs are first gathered into the
//! output buffer in logical order and then rounded in place, so the op allocates nothing
//! beyond its output.
//!
//! f32 data takes the vectorised passes of [`f32_plan`](super::f32_plan) in runs of 1024
//! elements, compiled for AVX-512 or AVX2 when the CPU has them (integer operations only:
//! every instruction set gives the same bits). Block floating point first finds each
//! block's largest finite magnitude (an integer max over magnitude bits); with per-slice
//! blocks (`dim=d`) the runs are cut where a slice ends, so every piece is rounded with its
//! own block's plan.

mod mx;
mod nvfp4_rows;

use candle_core::Layout;
use half::{bf16, f16};
use rayon::prelude::*;

use super::f32_plan::{BlockF32Plan, F32Plan, RunRounder};
#[cfg(target_arch = "x86_64")]
use super::isa::{self, Isa};
use super::lns_plan::LnsF32Plan;
use crate::format::block::BlockGrid;
use crate::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use crate::format::{BlockScope, Format, Rounding, RoundingRule};
use crate::philox::Stream;

/// Elements per parallel work item; a multiple of 4 so each Philox block stays in one item.
pub const CHUNK: usize = 1 << 14;

/// Elements a pass needs before it is split over rayon's pool. Below it the pass runs on the
/// calling thread: handing work to the pool from a thread outside it and waiting for it is
/// a cross-thread wake-up, which costs more than the rounding it would share out (the
/// tensors of a small model's training step are mostly this small), and with one thread in
/// the pool the work would only move to another thread. Results do not depend on it: every
/// chunk is rounded alike wherever it runs, and the reductions are maxima.
pub const PARALLEL_MIN_LEN: usize = 4 * CHUNK;

/// Whether a pass over `len` elements is split over rayon's pool (see [`PARALLEL_MIN_LEN`]).
pub(crate) fn in_parallel(len: usize) -> bool {
    len > PARALLEL_MIN_LEN && rayon::current_num_threads() > 1
}

/// A floating-point storage type the kernels read and write through f64.
pub trait Element: Copy + Send + Sync + 'static {
    /// Positive zero.
    const ZERO: Self;
    /// Every value of this type is an f32 (so the f32 fast path applies).
    const FITS_F32: bool;
    /// The slice as f32 values, when `Self` is f32 (for the vectorised pass).
    fn as_f32s(s: &[Self]) -> Option<&[f32]> {
        let _ = s;
        None
    }
    /// The mutable slice as f32 values, when `Self` is f32.
    fn as_f32s_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        let _ = s;
        None
    }
    /// Exact widening to f64.
    fn to_f64(self) -> f64;
    /// Conversion from f64 (round to nearest even where the value does not fit).
    fn from_f64(v: f64) -> Self;
}

impl Element for f32 {
    const FITS_F32: bool = true;
    fn as_f32s(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32s_mut(s: &mut [f32]) -> Option<&mut [f32]> {
        Some(s)
    }
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl Element for f64 {
    const FITS_F32: bool = false;
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
}
impl Element for f16 {
    const FITS_F32: bool = true;
    const ZERO: Self = f16::ZERO;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Element for bf16 {
    const FITS_F32: bool = true;
    const ZERO: Self = bf16::ZERO;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// The storage offsets of a (possibly strided) view, in logical row-major order.
fn strided_offsets(layout: &Layout) -> impl Iterator<Item = usize> + '_ {
    let dims = layout.dims();
    let strides = layout.stride();
    let n: usize = dims.iter().product();
    let mut index = vec![0usize; dims.len()];
    let mut offset = layout.start_offset();
    (0..n).map(move |_| {
        let current = offset;
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            offset += strides[d];
            if index[d] < dims[d] {
                break;
            }
            offset -= strides[d] * dims[d];
            index[d] = 0;
        }
        current
    })
}

/// Copies the elements of a (possibly strided) view into a new vector in logical order.
pub fn gather<T: Copy>(data: &[T], layout: &Layout) -> Vec<T> {
    if let Some((start, end)) = layout.contiguous_offsets() {
        return data[start..end].to_vec();
    }
    strided_offsets(layout).map(|o| data[o]).collect()
}

/// Runs `work(chunk_number, chunk)` over `CHUNK`-element chunks of `dst`, in parallel when
/// [`in_parallel`] says so.
fn for_each_chunk<T: Send>(dst: &mut [T], work: impl Fn(usize, &mut [T]) + Sync) {
    if dst.len() <= CHUNK {
        work(0, dst);
    } else if !in_parallel(dst.len()) {
        for (c, out) in dst.chunks_mut(CHUNK).enumerate() {
            work(c, out);
        }
    } else {
        dst.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, out)| work(c, out));
    }
}

/// Applies `f(index, x, random)` to every element: `dst[i] = f(i, src[i])`, or in place
/// when `src` is `None`. `random` is the stream's word for `i` (0 without a stream).
fn map_elements<T, F>(src: Option<&[T]>, dst: &mut [T], stream: Option<Stream>, f: F)
where
    T: Element,
    F: Fn(usize, f64, u32) -> f64 + Sync,
{
    let work = |chunk: usize, out: &mut [T]| {
        let base = chunk * CHUNK;
        let inp = src.map(|s| &s[base..base + out.len()]);
        match stream {
            None => match inp {
                Some(inp) => {
                    for (j, (o, &x)) in out.iter_mut().zip(inp).enumerate() {
                        *o = T::from_f64(f(base + j, x.to_f64(), 0));
                    }
                }
                None => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = T::from_f64(f(base + j, o.to_f64(), 0));
                    }
                }
            },
            Some(stream) => {
                for (g, group) in out.chunks_mut(4).enumerate() {
                    let first = base + 4 * g;
                    let words = stream.block((first / 4) as u64);
                    for (j, o) in group.iter_mut().enumerate() {
                        let x = match inp {
                            Some(inp) => inp[4 * g + j],
                            None => *o,
                        };
                        *o = T::from_f64(f(first + j, x.to_f64(), words[j]));
                    }
                }
            }
        }
    };
    for_each_chunk(dst, work);
}

/// Elements per run of the vectorised pass (its random words are staged in a stack buffer
/// of this size).
const RUN: usize = 1024;

/// The f32 kernel: each run of [`RUN`] elements goes through [`RunRounder::round_run`]
/// (or its in-place form; vectorised with AVX2 where the CPU has it), then the few elements
/// it leaves to the general path (`slow`) are redone one by one.
fn map_f32_runs<P, R, S>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    stream: Option<Stream>,
    plan: &P,
    rule: R,
    slow: S,
) where
    P: RunRounder,
    R: RoundingRule,
    S: Fn(f64, u32) -> f64 + Sync,
{
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        let mut words = [0u32; RUN];
        let mut staged = [0f32; RUN];
        let mut start = 0;
        while start < out.len() {
            let len = RUN.min(out.len() - start);
            let first = base + start;
            if let Some(stream) = stream {
                fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
            }
            let o = &mut out[start..start + len];
            let words = &words[..len];
            let inp = src.map(|s| &s[first..first + len]);
            round_run_and_fix(plan, inp, o, rule, words, &mut staged, &slow);
            start += len;
        }
    };
    for_each_chunk(dst, work);
}

/// Rounds one run of `out` through the vectorised pass, from `inp` or in place when `inp` is
/// `None`, then redoes the elements the pass left to the general path (`slow`). In place,
/// those elements kept their input value, so they are found in a staged copy of the run.
#[inline(always)]
fn round_run_and_fix<P: RunRounder, R: RoundingRule>(
    plan: &P,
    inp: Option<&[f32]>,
    out: &mut [f32],
    rule: R,
    words: &[u32],
    staged: &mut [f32; RUN],
    slow: &impl Fn(f64, u32) -> f64,
) {
    if !round_run_dispatch(plan, inp, out, rule, words) {
        return;
    }
    match inp {
        Some(inp) => fix_slow(plan, inp, out, words, slow),
        None => {
            let inp = staged_copy(out, staged);
            fix_slow(plan, inp, out, words, slow);
        }
    }
}

/// A copy of `v` in `buf` (the inputs of an in-place run, to scan while `v` is rewritten).
fn staged_copy<'a>(v: &[f32], buf: &'a mut [f32; RUN]) -> &'a [f32] {
    buf[..v.len()].copy_from_slice(v);
    &buf[..v.len()]
}

/// Rounds `src` into `dst` to nearest even by `plan`: the vectorised pass (compiled for the
/// CPU's vector instructions), then the general path `slow` for the elements it leaves
/// behind.
pub(crate) fn round_nearest_run(
    plan: &F32Plan,
    src: &[f32],
    dst: &mut [f32],
    slow: impl Fn(f64) -> f64,
) {
    if round_run_dispatch(plan, Some(src), dst, NearestEven, &[]) {
        fix_slow(plan, src, dst, &[], &|x, _| slow(x));
    }
}

/// Redoes the elements of `inp` the vectorised pass left behind through the general path
/// (`slow`, given the element's random word, or 0 where `words` is empty), writing them to
/// `out`. Elements are tested 16 at a time without branches, so runs with a few such
/// elements cost little more than a clean run.
#[inline(always)]
fn fix_slow<P: RunRounder>(
    plan: &P,
    inp: &[f32],
    out: &mut [f32],
    words: &[u32],
    slow: &impl Fn(f64, u32) -> f64,
) {
    for (c, block) in inp.chunks(16).enumerate() {
        if !block.iter().fold(false, |any, &x| any | plan.needs_slow(x)) {
            continue;
        }
        for (j, &x) in block.iter().enumerate() {
            if plan.needs_slow(x) {
                let i = c * 16 + j;
                out[i] = slow(x as f64, words.get(i).copied().unwrap_or(0)) as f32;
            }
        }
    }
}

/// [`Stream::fill`], compiled for AVX-512 or AVX2 when the CPU has them.
#[inline(always)]
pub(super) fn fill_dispatch(stream: &Stream, first_block: u64, out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL, checked just above.
            return unsafe { fill_avx512(stream, first_block, out) };
        }
        if has_avx2() {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { fill_avx2(stream, first_block, out) };
        }
    }
    stream.fill(first_block, out)
}

/// Whether the kernels may use the AVX-512 subsets the vectorised passes are compiled for
/// (the CPU has them and no cap forbids them, see [`isa`](super::isa)).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_avx512() -> bool {
    isa::active() == Isa::Avx512
}

/// Whether the kernels may use AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_avx2() -> bool {
    isa::active() >= Isa::Avx2
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn fill_avx512(stream: &Stream, first_block: u64, out: &mut [u32]) {
    // SAFETY: this function is only called where the CPU supports AVX-512.
    unsafe { stream.fill_avx512(first_block, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2(stream: &Stream, first_block: u64, out: &mut [u32]) {
    stream.fill(first_block, out)
}

/// [`RunRounder::round_run`] from `src`, or [`RunRounder::round_run_in_place`] when `src`
/// is `None`, compiled for AVX-512 or AVX2 when the CPU has them (integer operations only,
/// so every instruction set gives the same bits).
#[inline(always)]
fn round_run_dispatch<P: RunRounder, R: RoundingRule>(
    plan: &P,
    src: Option<&[f32]>,
    dst: &mut [f32],
    rule: R,
    random: &[u32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL, checked just above.
            return unsafe { round_run_avx512(plan, src, dst, rule, random) };
        }
        if has_avx2() {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { round_run_avx2(plan, src, dst, rule, random) };
        }
    }
    round_run(plan, src, dst, rule, random)
}

#[inline(always)]
fn round_run<P: RunRounder, R: RoundingRule>(
    plan: &P,
    src: Option<&[f32]>,
    dst: &mut [f32],
    rule: R,
    random: &[u32],
) -> bool {
    match src {
        Some(src) => plan.round_run(src, dst, rule, random),
        None => plan.round_run_in_place(dst, rule, random),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn round_run_avx512<P: RunRounder, R: RoundingRule>(
    plan: &P,
    src: Option<&[f32]>,
    dst: &mut [f32],
    rule: R,
    random: &[u32],
) -> bool {
    round_run(plan, src, dst, rule, random)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn round_run_avx2<P: RunRounder, R: RoundingRule>(
    plan: &P,
    src: Option<&[f32]>,
    dst: &mut [f32],
    rule: R,
    random: &[u32],
) -> bool {
    round_run(plan, src, dst, rule, random)
}

/// Like [`map_elements`], but `f` receives the element's block number (tracked with
/// counters instead of a division per element).
fn map_blocks<T, F>(src: Option<&[T]>, dst: &mut [T], stream: Option<Stream>, grid: BlockGrid, f: F)
where
    T: Element,
    F: Fn(usize, f64, u32) -> f64 + Sync,
{
    let work = |chunk: usize, out: &mut [T]| {
        let base = chunk * CHUNK;
        let inp = src.map(|s| &s[base..base + out.len()]);
        let mut block = grid.block_of(base);
        let mut within = base % grid.inner();
        let mut words = [0u32; 4];
        for j in 0..out.len() {
            let i = base + j;
            if let Some(stream) = stream {
                if i.is_multiple_of(4) || j == 0 {
                    words = stream.block((i / 4) as u64);
                }
            }
            let x = match inp {
                Some(inp) => inp[j],
                None => out[j],
            };
            out[j] = T::from_f64(f(block, x.to_f64(), words[i % 4]));
            within += 1;
            if within == grid.inner() {
                within = 0;
                block += 1;
                if block == grid.count() {
                    block = 0;
                }
            }
        }
    };
    for_each_chunk(dst, work);
}

/// Largest finite magnitude of an f32 slice (0 when there is none), as an integer max over
/// magnitude bits (a vectorisable reduction; the bit order of finite floats is their order).
fn max_abs_f32(xs: &[f32]) -> f64 {
    let bits = if in_parallel(xs.len()) {
        xs.par_chunks(CHUNK).map(max_abs_bits).max().unwrap_or(0)
    } else {
        xs.chunks(CHUNK).map(max_abs_bits).max().unwrap_or(0)
    };
    f32::from_bits(bits) as f64
}

/// Largest finite magnitude of an f32 run as its bit pattern (0 when there is none): an
/// integer max over magnitude bits, which vectorises (the bit order of finite floats is
/// their order).
/// Compiled for AVX-512 or AVX2 when the CPU has them (SSE2 has no 32-bit integer max).
#[inline(always)]
fn max_abs_bits(xs: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL, checked just above.
            return unsafe { max_abs_bits_avx512(xs) };
        }
        if has_avx2() {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { max_abs_bits_avx2(xs) };
        }
    }
    max_abs_bits_lanes(xs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn max_abs_bits_avx512(xs: &[f32]) -> u32 {
    max_abs_bits_lanes(xs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_abs_bits_avx2(xs: &[f32]) -> u32 {
    max_abs_bits_lanes(xs)
}

/// [`max_abs_bits`] in 16 independent lanes (non-finite magnitudes count as 0), which the
/// compiler keeps in vector registers; a single running maximum compiled to a chain of
/// compares and conditional moves.
#[inline(always)]
fn max_abs_bits_lanes(xs: &[f32]) -> u32 {
    const LANES: usize = 16;
    let finite = |x: &f32| {
        let a = x.to_bits() & 0x7fff_ffff;
        a & 0u32.wrapping_sub((a < 0x7f80_0000) as u32)
    };
    let mut lanes = [0u32; LANES];
    let mut groups = xs.chunks_exact(LANES);
    for group in &mut groups {
        for (m, x) in lanes.iter_mut().zip(group) {
            *m = (*m).max(finite(x));
        }
    }
    let tail = groups.remainder().iter().map(finite).max().unwrap_or(0);
    lanes.into_iter().fold(tail, u32::max)
}

/// Largest finite magnitude of each block of an f32 tensor with per-slice blocks: the
/// maximum of every slice run of `grid.inner()` consecutive elements (in parallel, a few
/// runs per task), then of the runs of each block.
fn slice_maxima_f32(data: &[f32], grid: BlockGrid) -> Vec<f64> {
    let inner = grid.inner();
    let mut runs = vec![0u32; data.len() / inner];
    let per_task = (CHUNK / inner).max(1);
    let task = |(maxima, xs): (&mut [u32], &[f32])| {
        for (m, run) in maxima.iter_mut().zip(xs.chunks(inner)) {
            *m = max_abs_bits(run);
        }
    };
    if in_parallel(data.len()) {
        runs.par_chunks_mut(per_task)
            .zip(data.par_chunks(per_task * inner))
            .for_each(task);
    } else {
        runs.chunks_mut(per_task)
            .zip(data.chunks(per_task * inner))
            .for_each(task);
    }
    let mut blocks = vec![0u32; grid.count()];
    for slice in runs.chunks(grid.count()) {
        for (b, &m) in blocks.iter_mut().zip(slice) {
            *b = (*b).max(m);
        }
    }
    blocks.iter().map(|&m| f32::from_bits(m) as f64).collect()
}

/// Block floating point with per-slice blocks on f32 data: the vectorised pass of
/// [`map_f32_runs`], with each run cut where a slice run (`grid.inner()` consecutive
/// elements, one block) ends, so every piece is rounded with its own block's
/// [`BlockF32Plan`]. Random words are drawn per run of [`RUN`] elements, as in
/// [`map_f32_runs`], so element `i` still reads word `i` of the stream.
fn map_f32_slices<R: RoundingRule>(
    src: Option<&[f32]>,
    dst: &mut [f32],
    stream: Option<Stream>,
    block: &crate::format::Block,
    grid: BlockGrid,
    rule: R,
) {
    let maxima = slice_maxima_f32(src.unwrap_or(dst), grid);
    let plans: Vec<BlockF32Plan> = maxima
        .iter()
        .map(|&m| BlockF32Plan::new(block, m))
        .collect();
    let inner = grid.inner();
    let work = |chunk: usize, out: &mut [f32]| {
        let base = chunk * CHUNK;
        let mut words = [0u32; RUN];
        let mut staged = [0f32; RUN];
        let mut start = 0;
        while start < out.len() {
            let len = RUN.min(out.len() - start);
            let first = base + start;
            if let Some(stream) = stream {
                fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
            }
            let mut at = 0;
            while at < len {
                let i = first + at;
                let piece = (inner - i % inner).min(len - at);
                let b = grid.block_of(i);
                let (plan, max) = (&plans[b], maxima[b]);
                let slow = |v, r| block.round(v, max, rule, r);
                let o = &mut out[start + at..start + at + piece];
                let words = &words[at..at + piece];
                let inp = src.map(|s| &s[i..i + piece]);
                round_run_and_fix(plan, inp, o, rule, words, &mut staged, &slow);
                at += piece;
            }
            start += len;
        }
    };
    for_each_chunk(dst, work);
}

/// Largest finite magnitude of each block.
fn block_maxima<T: Element>(data: &[T], grid: BlockGrid) -> Vec<f64> {
    let fold = |chunk: usize, xs: &[T]| {
        let mut m = vec![0f64; grid.count()];
        for (j, &x) in xs.iter().enumerate() {
            let v = x.to_f64();
            if v.is_finite() {
                let b = grid.block_of(chunk * CHUNK + j);
                m[b] = m[b].max(v.abs());
            }
        }
        m
    };
    let merge = |mut a: Vec<f64>, b: Vec<f64>| {
        for (x, y) in a.iter_mut().zip(b) {
            *x = x.max(y);
        }
        a
    };
    if in_parallel(data.len()) {
        data.par_chunks(CHUNK)
            .enumerate()
            .map(|(c, xs)| fold(c, xs))
            .reduce(|| vec![0f64; grid.count()], merge)
    } else {
        data.chunks(CHUNK)
            .enumerate()
            .map(|(c, xs)| fold(c, xs))
            .fold(vec![0f64; grid.count()], merge)
    }
}

fn run_rule<T: Element, R: RoundingRule>(
    src: Option<&[T]>,
    dst: &mut [T],
    dims: &[usize],
    format: &Format,
    rule: R,
    stream: Option<Stream>,
) -> candle_core::Result<()> {
    if let (Some(out), Format::Lns(l)) = (T::as_f32s_mut(&mut *dst), format) {
        if let Some(plan) = LnsF32Plan::shared(l, R::KIND) {
            let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
            plan.quantize(src, out, stream, rule);
            return Ok(());
        }
    }
    if let (Some(out), Format::Fixed(f)) = (T::as_f32s_mut(&mut *dst), format) {
        let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
        let plan = BlockF32Plan::from_fixed(f);
        map_f32_runs(src, out, stream, &plan, rule, |v, r| f.round(v, rule, r));
        return Ok(());
    }
    if let Some(out) = T::as_f32s_mut(dst) {
        if let Some(plan) = F32Plan::shared(format, R::KIND) {
            let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
            map_f32_runs(src, out, stream, &*plan, rule, |v, r| {
                format.round_rule(v, rule, r)
            });
            return Ok(());
        }
    }
    if T::FITS_F32 {
        if let Some(plan) = F32Plan::shared(format, R::KIND) {
            let fast = |_, x: f64, r| {
                plan.round(x as f32, rule, r, |v, r| format.round_rule(v, rule, r)) as f64
            };
            map_elements(src, dst, stream, fast);
            return Ok(());
        }
    }
    if let (Some(out), Format::Block(b)) = (T::as_f32s_mut(dst), format) {
        if b.scope() == BlockScope::Tensor {
            let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
            let max = max_abs_f32(src.unwrap_or(out));
            let plan = BlockF32Plan::new(b, max);
            map_f32_runs(src, out, stream, &plan, rule, |v, r| {
                b.round(v, max, rule, r)
            });
            return Ok(());
        }
        let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
        let grid = BlockGrid::new(b.scope(), dims)?;
        map_f32_slices(src, out, stream, b, grid, rule);
        return Ok(());
    }
    match format {
        Format::Posit(p) => map_elements(src, dst, stream, |_, x, r| p.round(x, rule, r)),
        Format::Float(f) => map_elements(src, dst, stream, |_, x, r| f.round(x, rule, r)),
        Format::Fixed(f) => map_elements(src, dst, stream, |_, x, r| f.round(x, rule, r)),
        Format::Lns(l) => map_elements(src, dst, stream, |_, x, r| {
            l.round_stored(x, rule, r, |v| T::from_f64(v).to_f64())
        }),
        Format::Mx(m) => mx::quantize_mx(src, dst, dims, m, rule, stream)?,
        Format::Nvfp4(n) => mx::quantize_nvfp4(src, dst, dims, n, rule, stream)?,
        Format::Block(b) if T::FITS_F32 => {
            let grid = BlockGrid::new(b.scope(), dims)?;
            let maxima = block_maxima(src.unwrap_or(dst), grid);
            let plans: Vec<BlockF32Plan> =
                maxima.iter().map(|&m| BlockF32Plan::new(b, m)).collect();
            map_blocks(src, dst, stream, grid, |block, x, r| {
                let m = maxima[block];
                plans[block].round(x as f32, rule, r, |v, r| b.round(v, m, rule, r)) as f64
            })
        }
        Format::Block(b) => {
            let grid = BlockGrid::new(b.scope(), dims)?;
            let maxima = block_maxima(src.unwrap_or(dst), grid);
            if grid.count() == 1 {
                let m = maxima[0];
                map_elements(src, dst, stream, |_, x, r| b.round(x, m, rule, r))
            } else {
                map_elements(src, dst, stream, |i, x, r| {
                    b.round(x, maxima[grid.block_of(i)], rule, r)
                })
            }
        }
    }
    Ok(())
}

/// Rounds `src` (contiguous, logical order, shape `dims`) into `dst`, or `dst` in place
/// when `src` is `None`.
pub fn quantize_slice<T: Element>(
    src: Option<&[T]>,
    dst: &mut [T],
    dims: &[usize],
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> candle_core::Result<()> {
    match rounding {
        Rounding::NearestEven => run_rule(src, dst, dims, format, NearestEven, None),
        Rounding::NearestAway => run_rule(src, dst, dims, format, NearestAway, None),
        Rounding::TowardZero => run_rule(src, dst, dims, format, TowardZero, None),
        Rounding::Stochastic { bits } => {
            let stream = stream.unwrap_or_else(|| Stream::new(0, 0));
            run_rule(src, dst, dims, format, Stochastic { bits }, Some(stream))
        }
    }
}

/// Rounds a tensor's storage into a new contiguous vector (logical order).
pub fn quantize_to_vec<T: Element>(
    data: &[T],
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> candle_core::Result<Vec<T>> {
    let dims = layout.dims();
    if let Some((start, end)) = layout.contiguous_offsets() {
        let src = &data[start..end];
        // Zero-filled f32/f64 vectors come from calloc (fresh zero pages, no pass over
        // memory), so the kernel's single read-and-write pass is the only traffic.
        let mut out = vec![T::ZERO; src.len()];
        quantize_slice(Some(src), &mut out, dims, format, rounding, stream)?;
        Ok(out)
    } else {
        let mut out = gather(data, layout);
        quantize_slice(None, &mut out, dims, format, rounding, stream)?;
        Ok(out)
    }
}

/// Rounds the elements addressed by `layout` in place.
pub fn quantize_in_place<T: Element>(
    data: &mut [T],
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> candle_core::Result<()> {
    let dims = layout.dims().to_vec();
    if let Some((start, end)) = layout.contiguous_offsets() {
        return quantize_slice(None, &mut data[start..end], &dims, format, rounding, stream);
    }
    // Strided view: round a gathered copy, then scatter it back.
    let mut vals = gather(data, layout);
    quantize_slice(None, &mut vals, &dims, format, rounding, stream)?;
    for (offset, v) in strided_offsets(layout).zip(vals) {
        data[offset] = v;
    }
    Ok(())
}
