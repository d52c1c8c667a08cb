//! The convolution op ([`ConvOp`]) and its forward pass: one im2col + GEMM per image, with
//! the fused ReLU and output rounding applied while each image's output is in cache. The
//! backward pass is in [`super::backward`].

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::sgemm::{per_image, sgemm, Mat};
use super::ConvOp;
use crate::backend::im2col::im2col;
use crate::ops::slices::{contiguous, f32s};

pub(super) fn image_strides(l: &Layout) -> (usize, [usize; 3]) {
    let s = l.stride();
    (s[0], [s[1], s[2], s[3]])
}

impl ConvOp {
    fn forward(
        &self,
        x: (&[f32], &Layout),
        w: (&[f32], &Layout),
        bias: Option<(&[f32], &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let (n, oc) = (x.1.dims()[0], self.out_channels);
        let (k, p) = (g.rows(), g.cols());
        let wm = contiguous(w.0, w.1);
        let bias = bias.map(|(b, l)| contiguous(b, l));
        let (sn, strides) = image_strides(x.1);
        let x0 = x.1.start_offset();
        let mut out = vec![0f32; n * oc * p];
        // Round each image's output while it is in cache where that gives the same bits.
        let per_image_rounding = self.output.as_ref().filter(|q| q.rounds_parts_alike());
        let failed = Mutex::new(None);
        let image = |i: usize, cols: &mut [f32], y: &mut [f32], par| {
            im2col(x.0, x0 + i * sn, strides, g, 0.0, cols);
            if let Some(b) = &bias {
                for (row, &bv) in y.chunks_exact_mut(p).zip(b.iter()) {
                    row.fill(bv);
                }
            }
            let lhs = Mat {
                data: &wm,
                rs: k,
                cs: 1,
            };
            let rhs = Mat {
                data: cols,
                rs: p,
                cs: 1,
            };
            sgemm((oc, p, k), y, bias.is_some(), lhs, rhs, par);
            if self.relu {
                y.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            if let Some(q) = per_image_rounding {
                if let Err(e) = q.round_f32_in_place(y, &[oc, g.out_h, g.out_w]) {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
        };
        per_image(&mut out, n, k * p, image);
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let dims = [n, oc, g.out_h, g.out_w];
        if let (Some(q), None) = (&self.output, per_image_rounding) {
            q.round_f32_in_place(&mut out, &dims)?;
        }
        Ok((CpuStorage::F32(out), Shape::from(dims.to_vec())))
    }
}

impl CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "qcandle-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.forward((f32s(s1, "input")?, l1), (f32s(s2, "weight")?, l2), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.grads(x, w, None, res, grad)?;
        Ok((dx, dw))
    }
}

impl CustomOp3 for ConvOp {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let b = (f32s(s3, "bias")?, l3);
        self.forward((f32s(s1, "input")?, l1), (f32s(s2, "weight")?, l2), Some(b))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.grads(x, w, Some(b), res, grad)
    }
}
