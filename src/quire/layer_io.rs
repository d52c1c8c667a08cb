//! What the layer ops of [`super::layer_linear`], [`super::layer_conv`] and
//! [`super::layer_matmul`] share: checks of their input tensors, f32 data out of tensors and
//! storages, transposes, results back into tensors, and the candle op glue ([`LayerOp`],
//! [`apply`]).

use candle_core::{
    bail, CpuStorage, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Tensor,
};
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
pub(crate) fn transpose<T: Copy + Default + Send + Sync>(
    v: &[T],
    rows: usize,
    cols: usize,
) -> Vec<T> {
    let mut t = vec![T::default(); rows * cols];
    transpose_into(v, rows, cols, &mut t, rows, true);
    t
}

/// Elements of the transpose one task of [`transpose_into`] writes, at least.
const TRANSPOSE_TASK: usize = 1 << 14;

/// `src` (`rows x cols`, row-major) transposed into the first `rows` elements of each of
/// `cols` rows of `dst`, `dst_stride` apart (the rest of each row is left as it is), on the
/// rayon pool when `parallel`. A task writes a band of whole rows of `dst` (at least
/// [`TRANSPOSE_TASK`] elements, however short the rows), reading `src` in tiles of 16 x 16
/// so that both sides use whole cache lines.
pub(crate) fn transpose_into<T: Copy + Send + Sync>(
    src: &[T],
    rows: usize,
    cols: usize,
    dst: &mut [T],
    dst_stride: usize,
    parallel: bool,
) {
    const TILE: usize = 16;
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(dst_stride >= rows && dst.len() >= (cols - 1) * dst_stride + rows);
    let band = TRANSPOSE_TASK.div_ceil(rows).next_multiple_of(TILE);
    let task = |(bi, out): (usize, &mut [T])| {
        let j0 = bi * band;
        let width = band.min(cols - j0);
        for i0 in (0..rows).step_by(TILE) {
            for jt in (0..width).step_by(TILE) {
                for i in i0..(i0 + TILE).min(rows) {
                    let line = &src[i * cols + j0..][..width];
                    for j in jt..(jt + TILE).min(width) {
                        out[j * dst_stride + i] = line[j];
                    }
                }
            }
        }
    };
    let bands = cols.div_ceil(band);
    if parallel {
        dst.par_chunks_mut(band * dst_stride)
            .take(bands)
            .enumerate()
            .for_each(task);
    } else {
        dst.chunks_mut(band * dst_stride)
            .take(bands)
            .enumerate()
            .for_each(task);
    }
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

/// A layer op of an input `x`, a weight `w` and an optional bias, with its backward pass.
pub(crate) trait LayerOp: Send + Sync + 'static {
    /// The op's name without a bias, and with one.
    const NAMES: [&'static str; 2];

    /// The output of `x`, `w` and the bias.
    fn forward(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)>;

    /// `(dX, dW, db)` from the output's gradient, each only where its tensor needs it.
    fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)>;
}

/// `op` on `x`, `w` and `bias` as one candle op (a two-input op without a bias, a
/// three-input op with one).
pub(crate) fn apply<T: LayerOp>(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    op: T,
) -> Result<Tensor> {
    match bias {
        Some(b) => x.apply_op3(w, b, Op(op)),
        None => x.apply_op2(w, Op(op)),
    }
}

/// The candle op of a [`LayerOp`].
struct Op<T>(T);

impl<T: LayerOp> CustomOp2 for Op<T> {
    fn name(&self) -> &'static str {
        T::NAMES[0]
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.0.forward((s1, l1), (s2, l2), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.0.grads(x, w, None, grad)?;
        Ok((dx, dw))
    }
}

impl<T: LayerOp> CustomOp3 for Op<T> {
    fn name(&self) -> &'static str {
        T::NAMES[1]
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
        self.0.forward((s1, l1), (s2, l2), Some((s3, l3)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.0.grads(x, w, Some(b), grad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element lands at its transposed place, for shapes around the 16 x 16 tiles and
    /// the task bands (rows longer and shorter than a band, one row, one column), into rows
    /// wider than the transpose's, whose extra elements are left alone; an empty matrix
    /// writes nothing.
    #[test]
    fn transpose_into_places_every_element_and_leaves_the_rest() {
        for (rows, cols) in [
            (1, 1),
            (1, 40),
            (40, 1),
            (15, 17),
            (16, 16),
            (26, 3000),
            (151, 700),
            (3, 20000),
        ] {
            let src: Vec<u32> = (0..rows * cols).map(|i| i as u32).collect();
            let t = transpose(&src, rows, cols);
            assert!((0..rows * cols).all(|e| t[(e % cols) * rows + e / cols] == src[e]));
            for stride in [rows, rows + 5] {
                let mut dst = vec![u32::MAX; cols * stride];
                transpose_into(&src, rows, cols, &mut dst, stride, stride > rows);
                for j in 0..cols {
                    for i in 0..rows {
                        assert_eq!(
                            dst[j * stride + i],
                            src[i * cols + j],
                            "{rows}x{cols} ({i}, {j})"
                        );
                    }
                    assert!(dst[j * stride + rows..(j + 1) * stride]
                        .iter()
                        .all(|&v| v == u32::MAX));
                }
            }
        }
        let mut none: Vec<u32> = Vec::new();
        transpose_into(&[], 0, 5, &mut none, 0, true);
        transpose_into(&[], 5, 0, &mut none, 5, false);
    }
}
