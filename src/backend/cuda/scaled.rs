//! Launches of the block-scaled formats' kernels (MX, NVFP4) in `cuda/quant.cu`: the block
//! maxima (`qc_scaled_amax_*`), the scales (`qc_scaled_scales_kernel`), then the elements
//! (`qc_quantize_scaled_*`), all on the device. f16 and bf16 tensors take the host path of
//! the parent module, like every other format.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{Layout, Result};

use super::{launch_config, layout_info, ptx, DeviceFloat, QcFormat, QcRounding, MODULE};
use crate::format::mx::{MxGrid, MX_BLOCK};
use crate::format::nvfp4::NVFP4_BLOCK;
use crate::format::{Format, Rounding};
use crate::philox::Stream;

/// `QcScaledGrid` of `cuda/quant.cu`: an [`MxGrid`] as four u64 (each at least 1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct QcScaledGrid {
    size: u64,
    len: u64,
    inner: u64,
    along: u64,
}

// SAFETY: a plain #[repr(C)] struct of four u64, the layout of the C struct.
unsafe impl DeviceRepr for QcScaledGrid {}

/// Everything a block-scaled launch needs besides the memory.
struct ScaledPlan {
    format: QcFormat,
    rounding: QcRounding,
    seed: u64,
    call: u64,
    grid: QcScaledGrid,
    count: u64,
}

impl ScaledPlan {
    /// The plan of an MX or NVFP4 format (`None` for the other formats).
    fn new(
        format: &Format,
        rounding: Rounding,
        stream: Option<Stream>,
        dims: &[usize],
    ) -> Result<Option<Self>> {
        let grid = match format {
            Format::Mx(m) => MxGrid::new(MX_BLOCK, m.dim(), dims, "mx")?,
            Format::Nvfp4(n) => MxGrid::new(NVFP4_BLOCK, n.dim(), dims, "nvfp4")?,
            _ => return Ok(None),
        };
        // As cpu::quantize_slice: stochastic rounding without a stream uses (seed 0, call 0).
        let stream = match rounding {
            Rounding::Stochastic { .. } => Some(stream.unwrap_or_else(|| Stream::new(0, 0))),
            _ => None,
        };
        Ok(Some(ScaledPlan {
            format: QcFormat::new(format),
            rounding: QcRounding::new(rounding),
            seed: stream.map_or(0, |s| s.seed()),
            call: stream.map_or(0, |s| s.call()),
            grid: QcScaledGrid {
                size: grid.size() as u64,
                len: grid.len() as u64,
                inner: grid.inner() as u64,
                along: grid.along() as u64,
            },
            count: grid.count() as u64,
        }))
    }
}

/// The scales of every block of the view (`view`, `layout`), computed on the device: the
/// maxima pass then the scale pass.
fn scales<T: DeviceFloat>(
    dev: &CudaDevice,
    view: &CudaView<'_, T>,
    layout: &Layout,
    info: &Option<CudaSlice<u64>>,
    plan: &ScaledPlan,
) -> Result<CudaSlice<u64>> {
    let n = layout.shape().elem_count() as u64;
    let mut amax = dev.alloc_zeros::<u64>(plan.count as usize + 1)?;
    let func =
        dev.get_or_load_custom_func(&format!("qc_scaled_amax_{}", T::SUFFIX), MODULE, ptx::QUANT)?;
    let (rank, null) = (layout.dims().len() as u32, 0u64);
    let mut b = func.builder();
    b.arg(view).arg(&n).arg(&rank);
    match info {
        Some(i) => b.arg(i),
        None => b.arg(&null),
    };
    b.arg(&plan.grid).arg(&plan.count).arg(&mut amax);
    // SAFETY: the signature of qc_scaled_amax_* in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, n)) }.w()?;
    let func = dev.get_or_load_custom_func("qc_scaled_scales_kernel", MODULE, ptx::QUANT)?;
    let mut b = func.builder();
    b.arg(&plan.format).arg(&plan.count).arg(&mut amax);
    // SAFETY: the signature of qc_scaled_scales_kernel in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, plan.count)) }.w()?;
    Ok(amax)
}

/// The name of the element kernel of `T`.
fn element_kernel<T: DeviceFloat>() -> String {
    format!("qc_quantize_scaled_{}", T::SUFFIX)
}

/// Rounds the view (`src`, `layout`) into a new contiguous slice.
fn quantize_typed<T: DeviceFloat>(
    dev: &CudaDevice,
    src: &CudaSlice<T>,
    layout: &Layout,
    plan: &ScaledPlan,
) -> Result<CudaSlice<T>> {
    let n = layout.shape().elem_count();
    // SAFETY: every element is written by the kernel below (n > 0) or there are none.
    let mut out = unsafe { dev.alloc::<T>(n)? };
    if n == 0 {
        return Ok(out);
    }
    let view = src.slice(layout.start_offset()..);
    let info = layout_info(dev, layout)?;
    let scales = scales(dev, &view, layout, &info, plan)?;
    let func = dev.get_or_load_custom_func(&element_kernel::<T>(), MODULE, ptx::QUANT)?;
    let (n64, rank, dst_strided, null) = (n as u64, layout.dims().len() as u32, 0i32, 0u64);
    let mut b = func.builder();
    b.arg(&mut out).arg(&view).arg(&n64).arg(&rank);
    match &info {
        Some(i) => b.arg(i),
        None => b.arg(&null),
    };
    b.arg(&dst_strided)
        .arg(&plan.format)
        .arg(&plan.rounding)
        .arg(&plan.seed)
        .arg(&plan.call)
        .arg(&scales)
        .arg(&plan.grid);
    // SAFETY: the signature of qc_quantize_scaled_* in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, n64.div_ceil(4))) }.w()?;
    Ok(out)
}

/// Rounds the view (`data`, `layout`) in place.
fn quantize_in_place_typed<T: DeviceFloat>(
    dev: &CudaDevice,
    data: &mut CudaSlice<T>,
    layout: &Layout,
    plan: &ScaledPlan,
) -> Result<()> {
    let n = layout.shape().elem_count();
    if n == 0 {
        return Ok(());
    }
    let info = layout_info(dev, layout)?;
    let scales = scales(
        dev,
        &data.slice(layout.start_offset()..),
        layout,
        &info,
        plan,
    )?;
    let func = dev.get_or_load_custom_func(&element_kernel::<T>(), MODULE, ptx::QUANT)?;
    let (n64, rank, null) = (n as u64, layout.dims().len() as u32, 0u64);
    let dst_strided = info.is_some() as i32;
    let mut view = data.slice_mut(layout.start_offset()..);
    let mut b = func.builder();
    // src null: the kernel reads dst.
    b.arg(&mut view).arg(&null).arg(&n64).arg(&rank);
    match &info {
        Some(i) => b.arg(i),
        None => b.arg(&null),
    };
    b.arg(&dst_strided)
        .arg(&plan.format)
        .arg(&plan.rounding)
        .arg(&plan.seed)
        .arg(&plan.call)
        .arg(&scales)
        .arg(&plan.grid);
    // SAFETY: the signature of qc_quantize_scaled_* in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, n64.div_ceil(4))) }.w()?;
    Ok(())
}

/// The quantize op's forward for MX and NVFP4 on f32/f64 CUDA storage: `Ok(None)` for the
/// other formats and dtypes (the caller's paths).
pub(super) fn quantize(
    storage: &CudaStorage,
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> Result<Option<CudaStorage>> {
    let Some(plan) = ScaledPlan::new(format, rounding, stream, layout.dims())? else {
        return Ok(None);
    };
    let dev = &storage.device;
    let slice = match &storage.slice {
        CudaStorageSlice::F32(s) => CudaStorageSlice::F32(quantize_typed(dev, s, layout, &plan)?),
        CudaStorageSlice::F64(s) => CudaStorageSlice::F64(quantize_typed(dev, s, layout, &plan)?),
        _ => return Ok(None),
    };
    Ok(Some(CudaStorage {
        slice,
        device: dev.clone(),
    }))
}

/// The in-place quantize op for MX and NVFP4 on f32/f64 CUDA storage: false for the other
/// formats and dtypes (the caller's paths).
pub(super) fn quantize_in_place(
    storage: &mut CudaStorage,
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> Result<bool> {
    let Some(plan) = ScaledPlan::new(format, rounding, stream, layout.dims())? else {
        return Ok(false);
    };
    let dev = storage.device.clone();
    match &mut storage.slice {
        CudaStorageSlice::F32(s) => quantize_in_place_typed(&dev, s, layout, &plan)?,
        CudaStorageSlice::F64(s) => quantize_in_place_typed(&dev, s, layout, &plan)?,
        _ => return Ok(false),
    }
    Ok(true)
}
