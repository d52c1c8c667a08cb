//! The convolution's backward pass: the ReLU mask and the rounding of the incoming gradient
//! ([`ReluMask`]), then the weight, input and bias gradients as ops of their own.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;

use super::forward::image_strides;
use super::sgemm::{per_image, sgemm, Mat};
use super::ConvOp;
use crate::backend::im2col::{col2im, im2col};
use crate::ops::quantize::{Quant, QuantizeOp};
use crate::ops::slices::{contiguous, f32s};

impl ConvOp {
    pub(super) fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let error = self.error.as_ref().map(Quant::op);
        let prepared;
        let grad = match (error, self.relu) {
            // Masked and rounded in one pass, chunk by chunk (rounding a masked zero gives
            // zero, so masking first changes nothing).
            (Some(q), true) if q.rounds_parts_alike() => {
                prepared = grad.apply_op2_no_bwd(res, &ReluMask(Some(q)))?;
                &prepared
            }
            (q, relu) => {
                let rounded = match q {
                    Some(q) => grad.apply_op1_no_bwd(&q)?,
                    None => grad.clone(),
                };
                prepared = if relu {
                    rounded.apply_op2_no_bwd(res, &ReluMask(None))?
                } else {
                    rounded
                };
                &prepared
            }
        };
        let dw = if w.track_op() {
            Some(x.apply_op2_no_bwd(grad, &WeightGrad(self.clone()))?)
        } else {
            None
        };
        let dx = if x.track_op() {
            Some(grad.apply_op2_no_bwd(w, &InputGrad(self.clone()))?)
        } else {
            None
        };
        let db = match b {
            Some(b) if b.track_op() => Some(grad.apply_op1_no_bwd(&BiasGrad)?),
            _ => None,
        };
        Ok((dx, dw, db))
    }
}

/// The ReLU's backward: `dY * (Y > 0)`, applied to `(dY, Y)`, then rounded when given a
/// rounding whose parts round alike ([`QuantizeOp::rounds_parts_alike`]), each chunk while
/// it is in cache.
struct ReluMask(Option<QuantizeOp>);

impl CustomOp2 for ReluMask {
    fn name(&self) -> &'static str {
        "qcandle-relu-mask"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dy = contiguous(f32s(s1, "gradient")?, l1);
        let y = contiguous(f32s(s2, "output")?, l2);
        let mut out = vec![0f32; dy.len()];
        out.par_chunks_mut(1 << 14)
            .zip(dy.par_chunks(1 << 14).zip(y.par_chunks(1 << 14)))
            .try_for_each(|(o, (g, y))| {
                for ((o, &g), &y) in o.iter_mut().zip(g).zip(y) {
                    *o = if y > 0.0 { g } else { 0.0 };
                }
                match &self.0 {
                    Some(q) => q.round_f32_in_place(o, &[o.len()]),
                    None => Ok(()),
                }
            })?;
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// Images per partial weight gradient (see [`WeightGrad`]).
const IMAGES_PER_PARTIAL: usize = 16;

/// `dW = sum_n dY[n] * cols[n]^T`, applied to `(x, dY)`: partial sums over fixed runs of
/// [`IMAGES_PER_PARTIAL`] images, in parallel, then added in order.
struct WeightGrad(ConvOp);

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0.geom;
        let (n, oc) = (l1.dims()[0], self.0.out_channels);
        let (k, p) = (g.rows(), g.cols());
        let x = f32s(s1, "input")?;
        let dy = contiguous(f32s(s2, "gradient")?, l2);
        let (sn, strides) = image_strides(l1);
        let x0 = l1.start_offset();
        // Adds images `range` into `dw`.
        let chunk = |range: std::ops::Range<usize>, dw: &mut [f32], cols: &mut [f32], par| {
            for i in range {
                im2col(x, x0 + i * sn, strides, g, 0.0, cols);
                let lhs = Mat {
                    data: &dy[i * oc * p..(i + 1) * oc * p],
                    rs: p,
                    cs: 1,
                };
                let rhs = Mat {
                    data: cols,
                    rs: 1,
                    cs: p,
                };
                sgemm((oc, k, p), dw, true, lhs, rhs, par);
            }
        };
        // Partial sums over fixed runs of images, added in order: the result does not
        // depend on the thread count or on how rayon schedules the runs. With fewer runs
        // than threads each GEMM is parallel itself (over its output tiles only).
        let runs = n.div_ceil(IMAGES_PER_PARTIAL);
        let threads = rayon::current_num_threads();
        let par = if runs < threads {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        let partials: Vec<Vec<f32>> = (0..runs)
            .into_par_iter()
            .map(|run| {
                let mut dw = vec![0f32; oc * k];
                let mut cols = vec![0f32; k * p];
                let start = run * IMAGES_PER_PARTIAL;
                chunk(
                    start..(start + IMAGES_PER_PARTIAL).min(n),
                    &mut dw,
                    &mut cols,
                    par,
                );
                dw
            })
            .collect();
        let mut dw = vec![0f32; oc * k];
        for partial in &partials {
            dw.iter_mut().zip(partial).for_each(|(a, b)| *a += b);
        }
        let shape = Shape::from((oc, g.channels, g.kernel_h, g.kernel_w));
        Ok((CpuStorage::F32(dw), shape))
    }
}

/// `dX[n] = col2im(W^T * dY[n])`, applied to `(dY, w)`.
struct InputGrad(ConvOp);

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0.geom;
        let (n, oc) = (l1.dims()[0], self.0.out_channels);
        let (k, p) = (g.rows(), g.cols());
        let dy = contiguous(f32s(s1, "gradient")?, l1);
        let wm = contiguous(f32s(s2, "weight")?, l2);
        let img = g.image_len();
        let mut dx = vec![0f32; n * img];
        let image = |i: usize, dcols: &mut [f32], dxi: &mut [f32], par| {
            let lhs = Mat {
                data: &wm,
                rs: 1,
                cs: k,
            };
            let rhs = Mat {
                data: &dy[i * oc * p..(i + 1) * oc * p],
                rs: p,
                cs: 1,
            };
            sgemm((k, p, oc), dcols, false, lhs, rhs, par);
            col2im(dcols, g, dxi);
        };
        per_image(&mut dx, n, k * p, image);
        let shape = Shape::from((n, g.channels, g.height, g.width));
        Ok((CpuStorage::F32(dx), shape))
    }
}

/// `db[o] = sum over n, q of dY[n, o, q]`, applied to `dY`.
struct BiasGrad;

impl CustomOp1 for BiasGrad {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-bias-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, oc, h, w) = l.shape().dims4()?;
        let p = h * w;
        let dy = contiguous(f32s(s, "gradient")?, l);
        let db: Vec<f32> = (0..oc)
            .into_par_iter()
            .map(|o| {
                let mut acc = 0f64;
                for i in 0..n {
                    let row = &dy[(i * oc + o) * p..(i * oc + o + 1) * p];
                    acc += lane_sum(row) as f64;
                }
                acc as f32
            })
            .collect();
        Ok((CpuStorage::F32(db), Shape::from(oc)))
    }
}

/// The sum of `v` in 16 interleaved f32 lanes (element `i` into lane `i % 16`), then the
/// lanes in order: independent additions vectorise where one running sum would wait on
/// every add. The order is fixed, so the result does not depend on threads.
fn lane_sum(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += x;
    }
    lanes.iter().sum()
}
