//! The CPU kernels of the block-scaled formats, MX and NVFP4: a reduction pass computes
//! every block's largest magnitude (NaN and ±Inf count as +Inf, which makes the block NaN),
//! then the element pass rounds each element with its block's scale.
//!
//! For f32 data the MX element pass is vectorised: within a run of elements the scale is
//! applied as an exact multiplication by `2^-X` in f32, the scaled values go through the
//! element format's [`F32Plan`] (the same table and the same general-path fix-up as the
//! elementwise formats), and the results are multiplied back by `2^X`. Both
//! multiplications are exact except where `x · 2^-X` falls below f32's normal range, where
//! the value is under 2^-126, far below half the smallest element, and rounds to ±0 under
//! every mode as the exact quotient does (see [`crate::format::mx::round_element`]).

use rayon::prelude::*;

use super::{fill_dispatch, fix_slow, for_each_chunk, map_elements, round_run_dispatch, Element};
use super::{CHUNK, RUN};
use crate::backend::f32_plan::F32Plan;
use crate::format::mx::{ElementFormat, MxGrid, MX_BLOCK};
use crate::format::nvfp4::NVFP4_BLOCK;
use crate::format::rounding::RuleKind;
use crate::format::{block, Format, Mx, Nvfp4, RoundingRule};
use crate::philox::Stream;

/// Magnitude bits of an f32 for the maxima: NaN and ±Inf become +Inf's bits.
#[inline(always)]
fn mag_bits(x: f32) -> u32 {
    let a = x.to_bits() & 0x7fff_ffff;
    a.min(0x7f80_0000)
}

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

/// Largest magnitude of every block of `grid` (NaN and ±Inf count as +Inf).
pub(crate) fn block_amax<T: Element>(data: &[T], grid: &MxGrid) -> Vec<f64> {
    let mut amax = vec![0f64; grid.count()];
    if data.is_empty() {
        return amax;
    }
    let row = grid.len() * grid.inner();
    let row_blocks = grid.along() * grid.inner();
    let rows = (CHUNK / row).max(1);
    let work = |(data, amax): (&[T], &mut [f64])| {
        for (data, amax) in data.chunks(row).zip(amax.chunks_mut(row_blocks)) {
            if grid.inner() == 1 {
                if let Some(xs) = T::as_f32s(data) {
                    for (xs, m) in xs.chunks(grid.size()).zip(amax.iter_mut()) {
                        let bits = xs.iter().fold(0u32, |m, &x| m.max(mag_bits(x)));
                        *m = f32::from_bits(bits) as f64;
                    }
                } else {
                    for (xs, m) in data.chunks(grid.size()).zip(amax.iter_mut()) {
                        *m = xs.iter().fold(0f64, |m, &x| m.max(magnitude(x)));
                    }
                }
            } else {
                let inner = grid.inner();
                for (a, xs) in data.chunks(inner).enumerate() {
                    let blocks = &mut amax[(a / grid.size()) * inner..][..inner];
                    for (m, &x) in blocks.iter_mut().zip(xs) {
                        *m = m.max(magnitude(x));
                    }
                }
            }
        }
    };
    data.par_chunks(row * rows)
        .zip(amax.par_chunks_mut(row_blocks * rows))
        .for_each(work);
    amax
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

/// `2^e` as f32 (`-149 <= e <= 127`), NaN for `None`.
fn pow2_f32(e: Option<i32>) -> f32 {
    match e {
        None => f32::NAN,
        Some(e) => crate::format::grid::pow2(e) as f32,
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
    let amax = block_amax(src.unwrap_or(dst), &grid);
    let scales: Vec<Option<i32>> = amax.iter().map(|&m| mx.scale_exponent(m)).collect();
    let element = mx.element().format();
    let element_format = match element {
        ElementFormat::Float(f) => Format::Float(f),
        ElementFormat::Fixed(f) => Format::Fixed(f),
    };
    if let (Some(out), Some(plan)) = (
        T::as_f32s_mut(dst),
        F32Plan::shared(&element_format, R::KIND),
    ) {
        let src = src.map(|s| T::as_f32s(s).expect("src has dst's type"));
        let down: Vec<f32> = scales.iter().map(|s| pow2_f32(s.map(|e| -e))).collect();
        let up: Vec<f32> = scales.iter().map(|&s| pow2_f32(s)).collect();
        let slow = |v: f64, r: u32| element.round(v, rule, r);
        let work = |chunk: usize, out: &mut [f32]| {
            let base = chunk * CHUNK;
            let mut walker = Walker::at(grid, base);
            let mut words = [0u32; RUN];
            let mut scaled = [0f32; RUN];
            let mut d = [0f32; RUN];
            let mut u = [0f32; RUN];
            let mut start = 0;
            while start < out.len() {
                let len = RUN.min(out.len() - start);
                let first = base + start;
                if let Some(stream) = stream {
                    fill_dispatch(&stream, (first / 4) as u64, &mut words[..len]);
                }
                walker.segments(len, |s, l, b, step| {
                    if step == 0 {
                        d[s..s + l].fill(down[b]);
                        u[s..s + l].fill(up[b]);
                    } else {
                        d[s..s + l].copy_from_slice(&down[b..b + l]);
                        u[s..s + l].copy_from_slice(&up[b..b + l]);
                    }
                });
                let o = &mut out[start..start + len];
                let inp: &[f32] = match src {
                    Some(s) => &s[first..first + len],
                    None => o,
                };
                for ((y, &x), &d) in scaled.iter_mut().zip(inp).zip(&d[..len]) {
                    *y = x * d;
                }
                let scaled = &scaled[..len];
                let words = &words[..len];
                if round_run_dispatch(&*plan, Some(scaled), o, rule, words) {
                    fix_slow(&*plan, scaled, o, words, &slow);
                }
                for (y, &u) in o.iter_mut().zip(&u[..len]) {
                    *y *= u;
                }
                start += len;
            }
        };
        for_each_chunk(out, work);
        return Ok(());
    }
    map_elements(src, dst, stream, |i, x, r| {
        mx.round(x, scales[grid.block_of(i)], rule, r)
    });
    Ok(())
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
    let scales: Vec<f64> = block_amax(data, &grid)
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
