//! Max pooling on CPU f32 tensors, with its own backward pass.
//!
//! Max pooling ([`max_pool2d`]) takes the first maximum of each window in row-major order
//! (as candle's and PyTorch's forward do) and its backward sends each window's gradient to
//! that element, recomputing the position from the input; windows may overlap. This is
//! PyTorch's gradient. candle 0.11.1's own max-pool backward differs: it scales each
//! gradient by `1 / kernel^2` (it multiplies by the window mean of the max mask), misplaces
//! gradients when the input size is not a multiple of the window, and refuses overlapping
//! windows.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::ops::slices::{contiguous, f32s};

/// Max pooling of `x` `(N, C, H, W)` over `kernel x kernel` windows every `stride` pixels
/// (no padding; output `(H - kernel) / stride + 1` per axis).
///
/// On CPU with f32 this is an op whose backward sends each window's gradient to the first
/// maximum of the window (overlapping windows add up); on other devices and dtypes,
/// [`max_pool2d_by_gather`], built from candle ops with the same gradient. Forward values
/// equal candle's `max_pool2d_with_stride`, whose own backward is wrong (module docs).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::arange(0f32, 16.0, &Device::Cpu)?.reshape((1, 1, 4, 4))?;
/// let y = qcandle::ops::max_pool2d(&x, 2, 2)?;
/// assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, [5.0, 7.0, 13.0, 15.0]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    if kernel == 0 || stride == 0 {
        bail!("max_pool2d: kernel ({kernel}) and stride ({stride}) must be positive")
    }
    if h < kernel || w < kernel {
        bail!("max_pool2d: kernel {kernel} is larger than the {h}x{w} input")
    }
    if n * c == 0 {
        return x.max_pool2d_with_stride(kernel, stride);
    }
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return max_pool2d_by_gather(x, kernel, stride);
    }
    x.apply_op1(MaxPool { kernel, stride })
}

/// Max pooling from candle ops that every device has, with PyTorch's gradient: the window
/// elements are gathered with `index_select` (`(N*C, OH*OW, kernel^2)`), the maximum of each
/// window is picked by `argmax` and read back with `gather`. The backward of `gather` puts
/// each window's gradient on the picked element and that of `index_select` adds
/// overlapping windows. The path [`max_pool2d`] takes off CPU f32; public so that it can be
/// checked on any machine. Which maximum `argmax` picks among equal values (and how it
/// treats NaN) is the device's: on CPU the first, as in [`max_pool2d`].
pub fn max_pool2d_by_gather(x: &Tensor, kernel: usize, stride: usize) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    if kernel == 0 || stride == 0 || h < kernel || w < kernel {
        bail!("max_pool2d: kernel {kernel} with stride {stride} does not fit a {h}x{w} input")
    }
    let (oh, ow) = ((h - kernel) / stride + 1, (w - kernel) / stride + 1);
    let mut at = Vec::with_capacity(oh * ow * kernel * kernel);
    for oy in 0..oh {
        for ox in 0..ow {
            for i in 0..kernel {
                for j in 0..kernel {
                    at.push(((oy * stride + i) * w + ox * stride + j) as u32);
                }
            }
        }
    }
    let at = Tensor::from_vec(at, oh * ow * kernel * kernel, x.device())?;
    let windows = x.reshape((n * c, h * w))?.index_select(&at, 1)?.reshape((
        n * c,
        oh * ow,
        kernel * kernel,
    ))?;
    let pick = windows.argmax_keepdim(2)?;
    windows.gather(&pick, 2)?.reshape((n, c, oh, ow))
}

#[derive(Debug, Clone, Copy)]
struct MaxPool {
    kernel: usize,
    stride: usize,
}

impl MaxPool {
    fn out(&self, h: usize, w: usize) -> (usize, usize) {
        (
            (h - self.kernel) / self.stride + 1,
            (w - self.kernel) / self.stride + 1,
        )
    }

    /// For 2x2 windows every 2 pixels along rows of unit stride (LeNet's and CifarNet's
    /// pooling), the offset of `plane` and the row stride, for the branch-free loops that
    /// read each window as two pairs; None otherwise.
    fn pairs(&self, l: &Layout, plane: usize) -> Option<(usize, usize)> {
        let s = l.stride();
        let c = l.dims()[1];
        (self.kernel == 2 && self.stride == 2 && s[3] == 1).then(|| {
            (
                l.start_offset() + (plane / c) * s[0] + (plane % c) * s[1],
                s[2],
            )
        })
    }

    /// Calls `f(q, y, x, value)` for every window `q` of `plane` (an index into `N * C`) with
    /// the coordinates and value of the window's first maximum in row-major order.
    fn for_each_argmax(
        &self,
        x: &[f32],
        l: &Layout,
        plane: usize,
        mut f: impl FnMut(usize, usize, usize, f32),
    ) {
        let (c, h, w) = (l.dims()[1], l.dims()[2], l.dims()[3]);
        let s = l.stride();
        let (oh, ow) = self.out(h, w);
        let base = l.start_offset() + (plane / c) * s[0] + (plane % c) * s[1];
        for oy in 0..oh {
            for ox in 0..ow {
                let (y0, x0) = (oy * self.stride, ox * self.stride);
                let (mut by, mut bx) = (y0, x0);
                let mut best = x[base + y0 * s[2] + x0 * s[3]];
                for yy in y0..y0 + self.kernel {
                    let row = base + yy * s[2];
                    for xx in x0..x0 + self.kernel {
                        let v = x[row + xx * s[3]];
                        if best < v {
                            (best, by, bx) = (v, yy, xx);
                        }
                    }
                }
                f(oy * ow + ox, by, bx, best);
            }
        }
    }
}

/// The first maximum of a window's values in row-major order and its position: a later
/// value replaces the best only when strictly greater, so ties keep the first and a NaN
/// never replaces (a NaN in first place stays), as in [`MaxPool::for_each_argmax`].
#[inline(always)]
fn first_max(v: [f32; 4]) -> (usize, f32) {
    let (mut at, mut best) = (0, v[0]);
    for (i, &x) in v.iter().enumerate().skip(1) {
        let greater = best < x;
        at = if greater { i } else { at };
        best = if greater { x } else { best };
    }
    (at, best)
}

impl CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "qcandle-max-pool2d"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = l.shape().dims4()?;
        let x = f32s(s, "input")?;
        let (oh, ow) = self.out(h, w);
        let mut y = vec![0f32; n * c * oh * ow];
        y.par_chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(plane, yp)| match self.pairs(l, plane) {
                Some((base, row)) => {
                    for (oy, out) in yp.chunks_exact_mut(ow).enumerate() {
                        let top = &x[base + 2 * oy * row..][..2 * ow];
                        let bottom = &x[base + (2 * oy + 1) * row..][..2 * ow];
                        for (o, (t, b)) in out
                            .iter_mut()
                            .zip(top.chunks_exact(2).zip(bottom.chunks_exact(2)))
                        {
                            *o = first_max([t[0], t[1], b[0], b[1]]).1;
                        }
                    }
                }
                None => self.for_each_argmax(x, l, plane, |q, _, _, v| yp[q] = v),
            });
        Ok((CpuStorage::F32(y), Shape::from((n, c, oh, ow))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(grad, &MaxPoolGrad(*self))?))
    }
}

/// Scatters the output gradient to the window maxima, applied to `(x, dY)`.
struct MaxPoolGrad(MaxPool);

impl CustomOp2 for MaxPoolGrad {
    fn name(&self) -> &'static str {
        "qcandle-max-pool2d-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = l1.shape().dims4()?;
        let x = f32s(s1, "input")?;
        let dy = contiguous(f32s(s2, "gradient")?, l2);
        let (oh, ow) = self.0.out(h, w);
        let mut dx = vec![0f32; n * c * h * w];
        dx.par_chunks_mut(h * w)
            .enumerate()
            .for_each(|(plane, dxp)| {
                let g = &dy[plane * oh * ow..(plane + 1) * oh * ow];
                match self.0.pairs(l1, plane) {
                    Some((base, row)) => {
                        // Windows do not overlap: each writes its four pixels once.
                        for (oy, gr) in g.chunks_exact(ow).enumerate() {
                            let top = &x[base + 2 * oy * row..][..2 * ow];
                            let bottom = &x[base + (2 * oy + 1) * row..][..2 * ow];
                            let (d0, rest) = dxp[2 * oy * w..].split_at_mut(w);
                            let d1 = &mut rest[..w];
                            for (ox, &gv) in gr.iter().enumerate() {
                                let (t, b) =
                                    (&top[2 * ox..2 * ox + 2], &bottom[2 * ox..2 * ox + 2]);
                                let at = first_max([t[0], t[1], b[0], b[1]]).0;
                                let pick = |i: usize| if at == i { gv } else { 0.0 };
                                d0[2 * ox] = pick(0);
                                d0[2 * ox + 1] = pick(1);
                                d1[2 * ox] = pick(2);
                                d1[2 * ox + 1] = pick(3);
                            }
                        }
                    }
                    None => self
                        .0
                        .for_each_argmax(x, l1, plane, |q, yy, xx, _| dxp[yy * w + xx] += g[q]),
                }
            });
        Ok((CpuStorage::F32(dx), Shape::from((n, c, h, w))))
    }
}
