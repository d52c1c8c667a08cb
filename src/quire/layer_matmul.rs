//! The batched matrix product of attention `Y = A·B` whose three GEMMs follow a layer's
//! `accumulate` setting ([`MatMulArith`]), with its own backward pass.
//!
//! With `A (.., m x k)` and `B (.., k x n)` sharing their leading (batch) dimensions, and
//! the incoming gradient `dY (.., m x n)`, each batch element `i` is one GEMM of each kind:
//!
//! | GEMM | `m x k x n` | summation index, ascending | rule |
//! |---|---|---|---|
//! | `Y_i = A_i·B_i` | `m x k x n` | `k` | forward (activation format) |
//! | `dA_i = dY_i·B_iᵀ` | `m x n x k` | output column | gradient (error format) |
//! | `dB_i = A_iᵀ·dY_i` | `k x m x n` | output row | gradient (error format) |
//!
//! Both operands of attention's products are activations, so both gradients are errors:
//! they are computed in the error format (a linear layer computes its weight gradient in
//! the gradient format instead, [`super::layer_linear`]). Each GEMM first rounds its
//! operands to its format, sums with the setting's kernel and rounds each output to the
//! format, exactly as a linear layer's GEMM ([`super::rule`]). A gradient is computed only
//! where its operand needs one. The batch elements run in parallel; the bits do not depend
//! on the order.

use candle_core::{bail, CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::accumulate::Accumulate;
use super::gemm_cpu::{Bias, Dims};
use super::layer_io::{apply, check_tensor, storage_f32, tensor_f32, LayerOp};
use super::quire_i16::Operand;
use super::rule::{category_rule, GemmRule};
use crate::format::Format;

/// The rules of a batched product's GEMMs: forward (activation format) and both operand
/// gradients (error format).
#[derive(Debug, Clone)]
pub struct MatMulArith {
    /// The setting they come from.
    pub setting: Accumulate,
    /// `Y = A·B`, in the activation format.
    pub forward: GemmRule,
    /// `dA = dY·Bᵀ` and `dB = Aᵀ·dY`, in the error format.
    pub grad: GemmRule,
}

impl MatMulArith {
    /// The rules of `setting` for a product whose activation and error formats are given;
    /// `None` for `f32`; an error naming the category at fault.
    pub fn new(
        setting: &Accumulate,
        activation: Option<Format>,
        error: Option<Format>,
    ) -> std::result::Result<Option<MatMulArith>, String> {
        if setting.is_f32() {
            return Ok(None);
        }
        let rule = |f, category, gemm| category_rule(setting, f, category, gemm);
        Ok(Some(MatMulArith {
            setting: *setting,
            forward: rule(activation, "activation", "forward product")?,
            grad: rule(error, "error", "gradient products")?,
        }))
    }
}

/// Whether `a` of shape `da` and `b` of shape `db` are `(.., m, k)` and `(.., k, n)` with
/// equal leading dimensions.
pub(crate) fn matmul_shapes_agree(da: &[usize], db: &[usize]) -> bool {
    da.len() >= 2
        && da.len() == db.len()
        && da[..da.len() - 2] == db[..db.len() - 2]
        && da[da.len() - 1] == db[db.len() - 2]
}

/// `a (.., m, k) · b (.., k, n)` under `arith`'s rules, forward and backward (see the module
/// docs). f32 CPU tensors with equal leading dimensions; shapes are checked.
pub fn rule_matmul(a: &Tensor, b: &Tensor, arith: &MatMulArith) -> Result<Tensor> {
    let setting = arith.setting.to_string();
    check_tensor(a, "left operand", &setting)?;
    check_tensor(b, "right operand", &setting)?;
    let (da, db) = (a.dims(), b.dims());
    if !matmul_shapes_agree(da, db) {
        bail!(
            "matmul: needs (.., m, k) and (.., k, n) with equal leading dimensions, got {da:?} and {db:?}"
        );
    }
    let lead = &da[..da.len() - 2];
    let batch: usize = lead.iter().product();
    let (m, k, n) = (da[da.len() - 2], da[da.len() - 1], db[db.len() - 1]);
    let op = MatMulOp {
        arith: arith.clone(),
    };
    let y = apply(
        &a.reshape((batch, m, k))?,
        &b.reshape((batch, k, n))?,
        None,
        op,
    )?;
    let mut shape = lead.to_vec();
    shape.extend([m, n]);
    y.reshape(shape)
}

/// `A_i (m x k) · B_i (k x n)` for every batch element `i` under `rule`, each operand stored
/// row-major or transposed per batch element, as the f32 outputs (`batch x m x n`).
fn batched(rule: &GemmRule, a: Operand, b: Operand, batch: usize, dims: Dims) -> Vec<f32> {
    let (m, k, n) = dims;
    let mut out = vec![0f32; batch * m * n];
    if m * n == 0 {
        return out;
    }
    out.par_chunks_mut(m * n).enumerate().for_each(|(i, o)| {
        let ai = Operand {
            data: &a.data[i * m * k..(i + 1) * m * k],
            transposed: a.transposed,
        };
        let bi = Operand {
            data: &b.data[i * k * n..(i + 1) * k * n],
            transposed: b.transposed,
        };
        if let Some(v) = rule.gemm_f32(ai, bi, dims, Bias::None, false) {
            o.copy_from_slice(&v);
            return;
        }
        let av = rule.operands(&ai.row_major(m, k));
        let bv = rule.operands(&bi.row_major(k, n));
        let mut sums = vec![0.0; m * n];
        rule.gemm(&av, &bv, dims, Bias::None, &mut sums, false);
        for (d, &v) in o.iter_mut().zip(&sums) {
            *d = GemmRule::output(v);
        }
    });
    out
}

/// The op on `(a (B, m, k), b (B, k, n))`.
#[derive(Clone)]
struct MatMulOp {
    arith: MatMulArith,
}

impl LayerOp for MatMulOp {
    const NAMES: [&'static str; 2] = ["qcandle-rule-matmul", "qcandle-rule-matmul-bias"];

    fn forward(
        &self,
        a: (&CpuStorage, &Layout),
        b: (&CpuStorage, &Layout),
        bias: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        if bias.is_some() {
            bail!("matmul: the product takes no bias");
        }
        let (batch, m, k) = a.1.shape().dims3()?;
        let (_, _, n) = b.1.shape().dims3()?;
        let (av, bv) = (
            storage_f32(a.0, a.1, "left operand")?,
            storage_f32(b.0, b.1, "right operand")?,
        );
        let y = batched(
            &self.arith.forward,
            Operand::rows(&av),
            Operand::rows(&bv),
            batch,
            (m, k, n),
        );
        Ok((CpuStorage::F32(y), Shape::from((batch, m, n))))
    }

    /// `(dA, dB, None)`, each only where its operand needs it.
    fn grads(
        &self,
        a: &Tensor,
        b: &Tensor,
        _bias: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (batch, m, k) = a.dims3()?;
        let (_, _, n) = b.dims3()?;
        let dy = tensor_f32(grad)?;
        let device = a.device();
        let rule = &self.arith.grad;
        let to_tensor = |v: Vec<f32>, shape: (usize, usize, usize)| {
            Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?.to_device(device)
        };
        // Bᵢᵀ (n x k) and Aᵢᵀ (k x m) are the transposes of the operands as they are stored.
        let da = if a.track_op() {
            let bv = tensor_f32(b)?;
            let bt = Operand {
                data: &bv,
                transposed: true,
            };
            let v = batched(rule, Operand::rows(&dy), bt, batch, (m, n, k));
            Some(to_tensor(v, (batch, m, k))?)
        } else {
            None
        };
        let db = if b.track_op() {
            let av = tensor_f32(a)?;
            let at = Operand {
                data: &av,
                transposed: true,
            };
            let v = batched(rule, at, Operand::rows(&dy), batch, (k, m, n));
            Some(to_tensor(v, (batch, k, n))?)
        } else {
            None
        };
        Ok((da, db, None))
    }
}
