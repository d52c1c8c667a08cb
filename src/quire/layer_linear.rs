//! A linear layer `Y = X·Wᵀ + b` whose three GEMMs follow a layer's rules ([`LayerArith`]),
//! with its own backward pass.
//!
//! With `X (N x in)` (leading dimensions flattened into `N`, rows in row-major order),
//! `W (out x in)`, `b (out)` and the incoming gradient `dY (N x out)`:
//!
//! | GEMM | `m x k x n` | summation index `k`, ascending | rule |
//! |---|---|---|---|
//! | `Y = X·Wᵀ + b` | `N x in x out` | input feature | forward (activation format), bias last |
//! | `dX = dY·W` | `N x out x in` | output feature | input gradient (error format) |
//! | `dW = dYᵀ·X` | `out x N x in` | batch row | weight gradient (gradient format) |
//! | `db = dYᵀ·1` | `out x N x 1` | batch row | weight gradient (gradient format) |
//!
//! Each GEMM first rounds its operands to its format (see [`super::accumulate`]). `dX` is
//! computed only when `X` needs a gradient (not for a data batch).

use candle_core::{bail, CpuStorage, Layout, Result, Shape, Tensor};

use super::gemm_cpu::Bias;
use super::layer_io::{
    apply, check_tensor, storage_f32, tensor_f32, to_tensor, transpose, LayerOp,
};
use super::quire_i16::Operand;
use super::rule::LayerArith;

/// `x (..., in) · w (out, in)ᵀ + bias (out)` under `arith`'s rules, forward and backward
/// (see the module docs). f32 CPU tensors; shapes are checked.
pub fn rule_linear(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    arith: &LayerArith,
) -> Result<Tensor> {
    let setting = arith.setting.to_string();
    check_tensor(x, "input", &setting)?;
    check_tensor(w, "weight", &setting)?;
    let (out_f, in_f) = w.dims2()?;
    let dims = x.dims();
    if dims.last() != Some(&in_f) {
        bail!(
            "linear: input of shape {dims:?} for a weight of shape {:?} (expected (..., {in_f}))",
            w.dims()
        );
    }
    if let Some(b) = bias {
        check_tensor(b, "bias", &setting)?;
        if b.dims() != [out_f] {
            bail!("linear: bias of shape {:?}, expected [{out_f}]", b.dims());
        }
    }
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let x2 = x.reshape((rows, in_f))?;
    let op = LinearOp {
        arith: arith.clone(),
    };
    let y = apply(&x2, w, bias, op)?;
    let mut shape = dims[..dims.len() - 1].to_vec();
    shape.push(out_f);
    y.reshape(shape)
}

/// The op on `(x (N, in), w (out, in))` or `(x, w, b)`.
#[derive(Clone)]
struct LinearOp {
    arith: LayerArith,
}

impl LayerOp for LinearOp {
    const NAMES: [&'static str; 2] = ["qcandle-rule-linear", "qcandle-rule-linear-bias"];

    fn forward(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let rule = &self.arith.forward;
        let (rows, in_f) = x.1.shape().dims2()?;
        let (out_f, _) = w.1.shape().dims2()?;
        let bv = match b {
            Some((s, l)) => Some(rule.operands(&storage_f32(s, l, "bias")?)),
            None => None,
        };
        let bias = bv.as_deref().map_or(Bias::None, Bias::PerCol);
        let (xs, ws) = (
            storage_f32(x.0, x.1, "input")?,
            storage_f32(w.0, w.1, "weight")?,
        );
        // The weight (out x in) is Bᵀ as it is stored.
        if let Some(y) = rule.gemm_f32(
            Operand {
                data: &xs,
                transposed: false,
            },
            Operand {
                data: &ws,
                transposed: true,
            },
            (rows, in_f, out_f),
            bias,
            true,
        ) {
            return Ok((CpuStorage::F32(y), Shape::from((rows, out_f))));
        }
        let xv = rule.operands(&storage_f32(x.0, x.1, "input")?);
        let wt = transpose(
            &rule.operands(&storage_f32(w.0, w.1, "weight")?),
            out_f,
            in_f,
        );
        let mut out = vec![0.0; rows * out_f];
        rule.gemm(&xv, &wt, (rows, in_f, out_f), bias, &mut out, true);
        let y = super::layer_io::outputs(&out);
        Ok((CpuStorage::F32(y), Shape::from((rows, out_f))))
    }

    /// `(dX, dW, db)`, each only where its tensor needs it.
    fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (rows, in_f) = x.dims2()?;
        let (out_f, _) = w.dims2()?;
        let dy = tensor_f32(grad)?;
        let device = x.device();
        let dx = if x.track_op() {
            let ws = tensor_f32(w)?;
            let a = Operand::rows(&dy);
            let out = self
                .arith
                .input_grad
                .gemm_any(a, Operand::rows(&ws), (rows, out_f, in_f));
            Some(to_tensor(&out, &[rows, in_f], device)?)
        } else {
            None
        };
        let rule = &self.arith.weight_grad;
        // dYᵀ (out x rows) is the transpose of dY as it is stored.
        let dyt = Operand {
            data: &dy,
            transposed: true,
        };
        let dw = if w.track_op() {
            let xs = tensor_f32(x)?;
            let out = rule.gemm_any(dyt, Operand::rows(&xs), (out_f, rows, in_f));
            Some(to_tensor(&out, &[out_f, in_f], device)?)
        } else {
            None
        };
        let db = if b.is_some_and(|b| b.track_op()) {
            let ones = vec![1.0; rows];
            let out = rule.gemm_any(dyt, Operand::rows(&ones), (out_f, rows, 1));
            Some(to_tensor(&out, &[out_f], device)?)
        } else {
            None
        };
        Ok((dx, dw, db))
    }
}
