//! What the layer ops of [`super::layer_linear`] and [`super::layer_conv`] share: checks of
//! their input tensors, f32 data out of tensors and storages, transposes, and results back
//! into tensors.

use candle_core::{bail, CpuStorage, DType, Device, Layout, Result, Tensor};
use rayon::prelude::*;

use super::rule::GemmRule;

/// Refuses tensors the rules cannot take: other dtypes than f32, other devices than the CPU.
pub(crate) fn check_tensor(t: &Tensor, what: &str, setting: &str) -> Result<()> {
    if t.dtype() != DType::F32 {
        bail!(
            "accumulate = \"{setting}\": the {what} is {:?}; the simulated GEMMs take f32 tensors",
            t.dtype()
        );
    }
    if !t.device().is_cpu() {
        bail!(
            "accumulate = \"{setting}\": the {what} is on {:?}; the simulated GEMMs run on the CPU (use accumulate = \"f32\" on a GPU)",
            t.device().location()
        );
    }
    Ok(())
}

/// The f32 elements of a storage in logical row-major order.
pub(crate) fn storage_f32<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    what: &str,
) -> Result<std::borrow::Cow<'a, [f32]>> {
    match s {
        CpuStorage::F32(v) => Ok(match l.contiguous_offsets() {
            Some((a, b)) => std::borrow::Cow::Borrowed(&v[a..b]),
            None => std::borrow::Cow::Owned(crate::backend::cpu::gather(v, l)),
        }),
        _ => bail!("accumulate: the {what} must be f32"),
    }
}

/// The f32 elements of a tensor in logical row-major order (on the CPU).
pub(crate) fn tensor_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()
}

/// `v` (`rows x cols`, row-major) transposed.
pub(crate) fn transpose(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; rows * cols];
    if rows == 0 || cols == 0 {
        return t;
    }
    t.par_chunks_mut(rows).enumerate().for_each(|(j, dst)| {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = v[i * cols + j];
        }
    });
    t
}

/// Kernel outputs as the f32 a tensor holds.
pub(crate) fn outputs(v: &[f64]) -> Vec<f32> {
    v.par_iter()
        .with_min_len(4096)
        .map(|&x| GemmRule::output(x))
        .collect()
}

/// Kernel outputs as an f32 tensor of `shape` on `device`.
pub(crate) fn to_tensor(v: &[f64], shape: &[usize], device: &Device) -> Result<Tensor> {
    Tensor::from_vec(outputs(v), shape, &Device::Cpu)?.to_device(device)
}
