//! Launches of the posit GEMM kernels in `cuda/gemm.cu` (exact quire GEMM and naive GEMM)
//! for f32 tensors on a CUDA device, called by [`crate::quire::ops`] (`matmul`, `linear`).
//!
//! The kernels give the bits of the CPU kernels in [`crate::quire::gemm_cpu`]:
//!
//! 1. `qc_gemm_encode` turns each f32 operand into its posit pattern (the value the CPU
//!    rounds it to) and flags the rows of `A` and the columns of `B` that hold a NaR.
//! 2. `qc_quire_gemm_*` sums every product exactly as an integer in units of
//!    `minpos^2 = 2^-2s` (`s = max_scale`): i64 for `s <= 6` (posit<8,0>), i64 products
//!    into 128-bit sums for `s <= 12` (posit<8,1>), 128-bit products and sums for
//!    `s <= 24` (posit<8,2>), then rounds once as the CPU does (f64 rounded to odd, then
//!    the posit's nearest-even rounding). Exactness: `k + 1` terms of at most `2^4s` units
//!    each stay below `2^63` resp. `2^127` for every `k` the launcher accepts.
//! 3. `qc_naive_gemm` rounds after every multiply and add with the CPU's 256 x 256
//!    [`OpTables`], `k` ascending from zero, the bias last.
//!
//! Launch (chosen for H100): 64 x 64 output tiles per block of 256 threads, each thread a
//! 4 x 4 micro-tile held in registers, k-tiles of 32 staged in shared memory as decoded
//! integers (quire) or patterns (naive); the grid is `(n/64, m/64, batch)`. See the header
//! of `cuda/gemm.cu`.
//!
//! Formats other than posits of at most 8 bits with `maxpos <= 2^24`, other dtypes, and
//! sizes beyond the grid limits stay on the host path.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, WrapErr};
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::gemm_cpu::OpTables;
use super::ops::Accumulation;
use crate::backend::cuda::{launch_config, ptx};
use crate::format::{Format, Posit};

/// The module name the GEMM kernels are loaded under (one per device).
const MODULE: &str = "qcandle_gemm";

/// Output tile rows and columns of one block (`QC_GEMM_BM`, `QC_GEMM_BN` in gemm.cu).
const TILE: usize = 64;

/// Threads per GEMM block (`QC_GEMM_THREADS`).
const THREADS: u32 = 256;

/// The largest grid y and z dimensions.
const GRID_YZ: usize = 65_535;

/// The posit format when the CUDA GEMMs take it: at most 8 bits, `maxpos <= 2^24` (so
/// posit<8,0>, posit<8,1>, posit<8,2> and the narrower posits with es <= 2).
pub fn supported(format: &Format) -> Option<Posit> {
    match format {
        Format::Posit(p) if p.n() <= 8 && p.max_scale() <= 24 => Some(*p),
        _ => None,
    }
}

/// Whether the sizes fit the kernels: nothing empty (the host path returns empty or zero
/// results; the device would need zero-byte allocations), u32 dims, the grid limits, and
/// `k + 1 < 2^30` terms (the 128-bit accumulator's bound for `maxpos = 2^24`).
fn sizes_fit(batch: usize, m: usize, k: usize, n: usize) -> bool {
    batch * m * k * n != 0
        && batch <= GRID_YZ
        && m.div_ceil(TILE) <= GRID_YZ
        && k < (1 << 30)
        && n < (1 << 31)
}

/// Whether the tensors go to the kernels: on one CUDA device, all f32.
fn on_device(tensors: &[&Tensor]) -> bool {
    let first = tensors[0].device();
    first.is_cuda()
        && tensors
            .iter()
            .all(|t| t.dtype() == DType::F32 && t.device().same_device(first))
}

/// `a (..., m, k) · b (..., k, n)` (or `b (k, n)` shared by the batch) on the device, or
/// `None` when the kernels do not apply (see the module docs). Shapes are checked by the
/// caller.
pub fn matmul(
    a: &Tensor,
    b: &Tensor,
    format: &Format,
    acc: Accumulation,
) -> Result<Option<Tensor>> {
    let Some(posit) = supported(format) else {
        return Ok(None);
    };
    if !on_device(&[a, b]) {
        return Ok(None);
    }
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let n = bd[bd.len() - 1];
    let batch: usize = ad[..ad.len() - 2].iter().product();
    if !sizes_fit(batch, m, k, n) {
        return Ok(None);
    }
    let shared_b = bd.len() == 2;
    let op = GemmOp::new(posit, acc, (batch, m, k, n), shared_b);
    let a3 = a.reshape((batch, m, k))?.contiguous()?;
    let b3 = if shared_b {
        b.contiguous()?
    } else {
        b.reshape((batch, k, n))?.contiguous()?
    };
    let out = a3.apply_op2_no_bwd(&b3, &op)?;
    let mut shape = ad[..ad.len() - 2].to_vec();
    shape.extend([m, n]);
    Ok(Some(out.reshape(shape)?))
}

/// `x (rows, in) · w (out, in)^T + bias (out)` on the device, or `None` when the kernels do
/// not apply. Shapes are checked by the caller.
pub fn linear(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    format: &Format,
    acc: Accumulation,
) -> Result<Option<Tensor>> {
    let Some(posit) = supported(format) else {
        return Ok(None);
    };
    let mut all = vec![x, w];
    all.extend(bias);
    if !on_device(&all) {
        return Ok(None);
    }
    let ((rows, inp), (out_f, _)) = (x.dims2()?, w.dims2()?);
    if !sizes_fit(1, rows, inp, out_f) {
        return Ok(None);
    }
    let op = GemmOp::new(posit, acc, (1, rows, inp, out_f), true);
    let x = x.contiguous()?;
    // B = w^T (in x out), transposed on the device by candle.
    let wt = w.t()?.contiguous()?;
    let out = match bias {
        Some(bias) => x.apply_op3_no_bwd(&wt, &bias.contiguous()?, &op)?,
        None => x.apply_op2_no_bwd(&wt, &op)?,
    };
    Ok(Some(out.reshape((rows, out_f))?))
}

/// One GEMM launch: `A (batch, m, k) · B (batch or 1, k, n) [+ bias (n)]`.
struct GemmOp {
    posit: Posit,
    /// The operation tables (naive GEMMs only).
    tables: Option<Arc<OpTables>>,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    shared_b: bool,
}

impl GemmOp {
    fn new(
        posit: Posit,
        acc: Accumulation,
        dims: (usize, usize, usize, usize),
        shared_b: bool,
    ) -> Self {
        let (batch, m, k, n) = dims;
        let tables = match acc {
            Accumulation::Quire => None,
            Accumulation::Naive => {
                Some(OpTables::get(&Format::Posit(posit)).expect("posits of <= 8 bits have tables"))
            }
        };
        GemmOp {
            posit,
            tables,
            batch,
            m,
            k,
            n,
            shared_b,
        }
    }

    /// The f32 view of a contiguous operand.
    fn view<'a>(storage: &'a CudaStorage, layout: &Layout) -> Result<CudaView<'a, f32>> {
        if !layout.is_contiguous() {
            bail!("qcandle-posit-gemm: operands must be contiguous");
        }
        let len = layout.shape().elem_count();
        let start = layout.start_offset();
        Ok(storage.as_cuda_slice::<f32>()?.slice(start..start + len))
    }

    /// Patterns of `x` (`count` values); a NaR sets `flags[(i / (group·inner))·inner + i % inner]`.
    fn encode(
        &self,
        dev: &CudaDevice,
        x: &CudaView<'_, f32>,
        count: usize,
        flags: Option<&mut CudaSlice<u32>>,
        (group, inner): (u64, u64),
    ) -> Result<CudaSlice<u8>> {
        // SAFETY: the kernel writes every one of the `count` patterns.
        let mut out = unsafe { dev.alloc::<u8>(count)? };
        let func = dev.get_or_load_custom_func("qc_gemm_encode", MODULE, ptx::GEMM)?;
        let (count64, pn, pes, null) = (
            count as u64,
            self.posit.n() as i32,
            self.posit.es() as i32,
            0u64,
        );
        let mut b = func.builder();
        b.arg(x).arg(&mut out).arg(&count64).arg(&pn).arg(&pes);
        match flags {
            Some(f) => b.arg(f),
            None => b.arg(&null),
        };
        b.arg(&group).arg(&inner);
        // SAFETY: the signature of qc_gemm_encode in cuda/gemm.cu.
        unsafe { b.launch(launch_config(dev, count64)) }.w()?;
        Ok(out)
    }

    /// Encodes the operands and runs the GEMM kernel.
    fn run(
        &self,
        a: (&CudaStorage, &Layout),
        b: (&CudaStorage, &Layout),
        bias: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = &a.0.device;
        let (batch, m, k, n) = (self.batch, self.m, self.k, self.n);
        let b_items = if self.shared_b { 1 } else { batch };
        let (a_len, b_len) = (batch * m * k, b_items * k * n);
        let av = Self::view(a.0, a.1)?;
        let bv = Self::view(b.0, b.1)?;
        if av.len() != a_len || bv.len() != b_len {
            bail!("qcandle-posit-gemm: operand sizes do not match the launch");
        }
        let mut row_nar = dev.alloc_zeros::<u32>(batch * m)?;
        let mut col_nar = dev.alloc_zeros::<u32>(b_items * n)?;
        let ap = self.encode(dev, &av, a_len, Some(&mut row_nar), (k as u64, 1))?;
        let bp = self.encode(dev, &bv, b_len, Some(&mut col_nar), (k as u64, n as u64))?;
        let biasp = match bias {
            Some((s, l)) => {
                let v = Self::view(s, l)?;
                if v.len() != n {
                    bail!(
                        "qcandle-posit-gemm: the bias has {} values, expected {n}",
                        v.len()
                    );
                }
                Some(self.encode(dev, &v, n, None, (1, 1))?)
            }
            None => None,
        };
        let len = batch * m * n;
        // SAFETY: the kernel writes every output.
        let mut out = unsafe { dev.alloc::<f32>(len)? };
        // A scope: the launch arguments borrow `out`.
        {
            let s = self.posit.max_scale();
            let name = match (&self.tables, s) {
                (Some(_), _) => "qc_naive_gemm",
                (None, ..=6) => "qc_quire_gemm_i64",
                (None, ..=12) => "qc_quire_gemm_i64x128",
                (None, _) => "qc_quire_gemm_i128",
            };
            let func = dev.get_or_load_custom_func(name, MODULE, ptx::GEMM)?;
            let tables = match &self.tables {
                Some(t) => Some((dev.clone_htod(&t.mul)?, dev.clone_htod(&t.add)?)),
                None => None,
            };
            let (m32, k32, n32) = (m as u32, k as u32, n as u32);
            let a_batch = (m * k) as u64;
            let b_batch = if self.shared_b { 0 } else { (k * n) as u64 };
            let (pn, pes, null) = (self.posit.n() as i32, self.posit.es() as i32, 0u64);
            let mut lb = func.builder();
            lb.arg(&ap).arg(&bp);
            match &biasp {
                Some(p) => lb.arg(p),
                None => lb.arg(&null),
            };
            match &tables {
                Some((mul, add)) => lb.arg(mul).arg(add),
                None => lb.arg(&row_nar).arg(&col_nar),
            };
            lb.arg(&mut out)
                .arg(&m32)
                .arg(&k32)
                .arg(&n32)
                .arg(&a_batch)
                .arg(&b_batch)
                .arg(&pn)
                .arg(&pes);
            let cfg = LaunchConfig {
                grid_dim: (
                    n.div_ceil(TILE) as u32,
                    m.div_ceil(TILE) as u32,
                    batch as u32,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the signatures of qc_quire_gemm_* and qc_naive_gemm in
            // cuda/gemm.cu; every pointer covers the extent the kernel reads or writes.
            unsafe { lb.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((batch, m, n)),
        ))
    }
}

fn cpu_input() -> candle_core::Error {
    candle_core::Error::Msg("qcandle-posit-gemm: the CUDA op was given a CPU tensor".into())
}

impl CustomOp2 for GemmOp {
    fn name(&self) -> &'static str {
        "qcandle-posit-gemm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_input())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run((s1, l1), (s2, l2), None)
    }
}

impl CustomOp3 for GemmOp {
    fn name(&self) -> &'static str {
        "qcandle-posit-gemm-bias"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_input())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run((s1, l1), (s2, l2), Some((s3, l3)))
    }
}
