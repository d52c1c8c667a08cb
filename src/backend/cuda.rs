//! Launch wrappers for the CUDA kernels in `cuda/quant.cu` (built to PTX by build.rs with
//! the `cuda` feature), called from the ops' `cuda_fwd`.
//!
//! Every wrapper gives the bits of the CPU path in [`super::cpu`]: the per-element math is
//! `cuda/quant.cuh` (compared with the Rust kernels bit for bit by `tests/cuda_host.rs`),
//! element `i` of the logical row-major order reads random word `i` of the same Philox stream,
//! and block maxima are exact integer maxima. f32 and f64 tensors run on the device; f16 and
//! bf16 tensors are rounded by the CPU kernel on a host copy (exact, but slow).
//!
//! lns<w,f> runs on the device too. Its exact comparisons (`qc_lns_pow_cmp`) stop at 1024
//! bits of precision there, far beyond any case known to need more than 256; a kernel that
//! meets a comparison undecided at that cap says so through a flag, and the host then
//! quantizes the tensor with the CPU kernel (which has no cap), or fails pack and unpack with
//! an error that names the CPU, so a result is never a guess.

mod scaled;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{DType, Layout, Result};

use crate::backend::cpu;
use crate::format::block::BlockGrid;
use crate::format::{BlockScope, Format, Rounding};
use crate::philox::Stream;

/// The PTX of every `cuda/*.cu`, one `&str` constant per file (`QUANT` for `quant.cu`).
#[allow(missing_docs)]
pub mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// The module name the quantize kernels are loaded under (one per device).
const MODULE: &str = "qcandle_quant";

/// Threads per block of every launch (see the launch notes in `cuda/quant.cu`).
const THREADS: u32 = 256;

pub use super::qc::{QcFormat, QcRounding};

// SAFETY: a plain #[repr(C)] struct of four i32, the layout of the C struct.
unsafe impl DeviceRepr for QcFormat {}

// SAFETY: a plain #[repr(C)] struct of two i32, the layout of the C struct.
unsafe impl DeviceRepr for QcRounding {}

/// Blocks for `items` work items of one thread each: enough to cover them, at most 32 per SM
/// (grid-stride loops do the rest).
pub(crate) fn launch_config(dev: &CudaDevice, items: u64) -> LaunchConfig {
    let sms = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(132) as u64;
    let blocks = items.div_ceil(THREADS as u64).clamp(1, sms * 32);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The dims then strides of a non-contiguous layout, on the device (None when contiguous).
fn layout_info(dev: &CudaDevice, layout: &Layout) -> Result<Option<CudaSlice<u64>>> {
    if layout.is_contiguous() {
        return Ok(None);
    }
    let info: Vec<u64> = layout
        .dims()
        .iter()
        .chain(layout.stride())
        .map(|&v| v as u64)
        .collect();
    Ok(Some(dev.clone_htod(&info)?))
}

/// (inner, count) of the block grid: [`BlockGrid`]'s, so the kernels group elements as
/// the CPU does, and both are at least 1 (the kernels divide by them), empty tensors included.
fn block_grid(scope: BlockScope, dims: &[usize]) -> Result<(u64, u64)> {
    let grid = BlockGrid::new(scope, dims)?;
    Ok((grid.inner() as u64, grid.count() as u64))
}

/// A device element type with quantize kernels.
trait DeviceFloat: DeviceRepr {
    const SUFFIX: &'static str;
}
impl DeviceFloat for f32 {
    const SUFFIX: &'static str = "f32";
}
impl DeviceFloat for f64 {
    const SUFFIX: &'static str = "f64";
}

/// Everything one quantize launch needs besides the memory.
struct Plan {
    /// Whether the format is lns (the kernels then report undecided comparisons).
    lns: bool,
    format: QcFormat,
    rounding: QcRounding,
    seed: u64,
    call: u64,
    block: Option<(u64, u64)>,
}

/// A zeroed device flag for the kernels' `undecided` argument when `format` is lns (its
/// exact comparisons stop at the precision cap of `qc_lns_pow_cmp` in `cuda/quant.cuh`),
/// else None (the kernel gets a null pointer and the host skips reading the flag back).
fn undecided_flag(dev: &CudaDevice, format: &Format) -> Result<Option<CudaSlice<u32>>> {
    match format {
        Format::Lns(_) => Ok(Some(dev.alloc_zeros::<u32>(1)?)),
        _ => Ok(None),
    }
}

/// Whether the kernel set the flag.
fn flag_set(dev: &CudaDevice, flag: &Option<CudaSlice<u32>>) -> Result<bool> {
    match flag {
        Some(f) => Ok(dev.clone_dtoh(f)?[0] != 0),
        None => Ok(false),
    }
}

/// The error of pack and unpack when an lns comparison needed more precision than the
/// device code has (the CPU has no such limit).
fn beyond_device_precision(op: &str, format: &Format) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: an exact {format} comparison needs more than the 1024 bits of precision of the \
         CUDA kernel; {op} this tensor on the CPU"
    ))
}

impl Plan {
    /// The quantize kernel for element type `T`: `qc_quantize_lns_*` for lns formats (the
    /// others carry none of lns's code), else `qc_quantize_*`.
    fn kernel<T: DeviceFloat>(&self) -> String {
        let lns = if self.lns { "lns_" } else { "" };
        format!("qc_quantize_{lns}{}", T::SUFFIX)
    }

    /// The zeroed `undecided` flag of an lns launch (None otherwise).
    fn undecided(&self, dev: &CudaDevice) -> Result<Option<CudaSlice<u32>>> {
        if self.lns {
            Ok(Some(dev.alloc_zeros::<u32>(1)?))
        } else {
            Ok(None)
        }
    }

    fn new(
        format: &Format,
        rounding: Rounding,
        stream: Option<Stream>,
        dims: &[usize],
    ) -> Result<Self> {
        // As cpu::quantize_slice: stochastic rounding without a stream uses (seed 0, call 0).
        let stream = match rounding {
            Rounding::Stochastic { .. } => Some(stream.unwrap_or_else(|| Stream::new(0, 0))),
            _ => None,
        };
        let block = match format {
            Format::Block(b) => Some(block_grid(b.scope(), dims)?),
            _ => None,
        };
        Ok(Plan {
            lns: matches!(format, Format::Lns(_)),
            format: QcFormat::new(format),
            rounding: QcRounding::new(rounding),
            seed: stream.map_or(0, |s| s.seed()),
            call: stream.map_or(0, |s| s.call()),
            block,
        })
    }
}

/// Block maxima (f64 bits) of the view `src` (layout `layout`, starting at its first element).
fn block_maxima<T: DeviceFloat>(
    dev: &CudaDevice,
    src: &CudaView<'_, T>,
    layout: &Layout,
    info: &Option<CudaSlice<u64>>,
    (inner, count): (u64, u64),
) -> Result<CudaSlice<u64>> {
    let n = layout.shape().elem_count() as u64;
    let mut maxima = dev.alloc_zeros::<u64>(count as usize)?;
    let func =
        dev.get_or_load_custom_func(&format!("qc_block_max_{}", T::SUFFIX), MODULE, ptx::QUANT)?;
    let rank = layout.dims().len() as u32;
    let null = 0u64;
    let mut b = func.builder();
    b.arg(src).arg(&n).arg(&rank);
    match info {
        Some(i) => b.arg(i),
        None => b.arg(&null),
    };
    b.arg(&inner).arg(&count).arg(&mut maxima);
    // SAFETY: the signature of qc_block_max_* in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, n)) }.w()?;
    Ok(maxima)
}

/// Rounds the view (`src`, `layout`) into a new contiguous slice.
fn quantize_typed<T: DeviceFloat>(
    dev: &CudaDevice,
    src: &CudaSlice<T>,
    layout: &Layout,
    plan: &Plan,
) -> Result<(CudaSlice<T>, bool)> {
    let n = layout.shape().elem_count();
    // SAFETY: every element is written by the kernel below (n > 0) or there are none.
    let mut out = unsafe { dev.alloc::<T>(n)? };
    if n == 0 {
        return Ok((out, false));
    }
    let view = src.slice(layout.start_offset()..);
    let info = layout_info(dev, layout)?;
    let maxima = match plan.block {
        Some(grid) => Some(block_maxima::<T>(dev, &view, layout, &info, grid)?),
        None => None,
    };
    let func = dev.get_or_load_custom_func(&plan.kernel::<T>(), MODULE, ptx::QUANT)?;
    let (n64, rank, dst_strided, null) = (n as u64, layout.dims().len() as u32, 0i32, 0u64);
    let (inner, count) = plan.block.unwrap_or((1, 1));
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
        .arg(&plan.call);
    match &maxima {
        Some(m) => b.arg(m),
        None => b.arg(&null),
    };
    b.arg(&inner).arg(&count);
    let mut undecided = plan.undecided(dev)?;
    match &mut undecided {
        Some(u) => b.arg(u),
        None => b.arg(&null),
    };
    // SAFETY: the signature of qc_quantize_* in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, n64.div_ceil(4))) }.w()?;
    let undecided = flag_set(dev, &undecided)?;
    Ok((out, undecided))
}

/// Rounds the view (`data`, `layout`) in place.
fn quantize_in_place_typed<T: DeviceFloat>(
    dev: &CudaDevice,
    data: &mut CudaSlice<T>,
    layout: &Layout,
    plan: &Plan,
) -> Result<bool> {
    let n = layout.shape().elem_count();
    if n == 0 {
        return Ok(false);
    }
    let info = layout_info(dev, layout)?;
    let maxima = match plan.block {
        Some(grid) => {
            let view = data.slice(layout.start_offset()..);
            Some(block_maxima::<T>(dev, &view, layout, &info, grid)?)
        }
        None => None,
    };
    let func = dev.get_or_load_custom_func(&plan.kernel::<T>(), MODULE, ptx::QUANT)?;
    let (n64, rank, null) = (n as u64, layout.dims().len() as u32, 0u64);
    let dst_strided = info.is_some() as i32;
    let (inner, count) = plan.block.unwrap_or((1, 1));
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
        .arg(&plan.call);
    match &maxima {
        Some(m) => b.arg(m),
        None => b.arg(&null),
    };
    b.arg(&inner).arg(&count);
    let mut undecided = plan.undecided(dev)?;
    match &mut undecided {
        Some(u) => b.arg(u),
        None => b.arg(&null),
    };
    // SAFETY: the signature of qc_quantize_* in cuda/quant.cu.
    unsafe { b.launch(launch_config(dev, n64.div_ceil(4))) }.w()?;
    flag_set(dev, &undecided)
}

fn unsupported(op: &str, dtype: DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: unsupported dtype {dtype:?}; quantize takes f32, f64, f16 or bf16 tensors"
    ))
}

/// `cpu::quantize_to_vec` on a host copy of the storage (f16, bf16).
fn quantize_on_host<T>(
    dev: &CudaDevice,
    src: &CudaSlice<T>,
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> Result<CudaSlice<T>>
where
    T: cpu::Element + DeviceRepr,
{
    let host = dev.clone_dtoh(src)?;
    let out = cpu::quantize_to_vec(&host, layout, format, rounding, stream)?;
    dev.clone_htod(&out)
}

/// The quantize op's forward on a CUDA tensor: the view (`storage`, `layout`) rounded into a
/// new contiguous storage.
pub fn quantize(
    storage: &CudaStorage,
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> Result<CudaStorage> {
    if let Some(out) = scaled::quantize(storage, layout, format, rounding, stream)? {
        return Ok(out);
    }
    let dev = &storage.device;
    let slice = match &storage.slice {
        // An lns element undecided at the device's precision cap: the CPU kernel rounds the
        // whole view instead (same bits; it has no cap).
        CudaStorageSlice::F32(s) => {
            let plan = Plan::new(format, rounding, stream, layout.dims())?;
            CudaStorageSlice::F32(match quantize_typed(dev, s, layout, &plan)? {
                (_, true) => quantize_on_host(dev, s, layout, format, rounding, stream)?,
                (out, false) => out,
            })
        }
        CudaStorageSlice::F64(s) => {
            let plan = Plan::new(format, rounding, stream, layout.dims())?;
            CudaStorageSlice::F64(match quantize_typed(dev, s, layout, &plan)? {
                (_, true) => quantize_on_host(dev, s, layout, format, rounding, stream)?,
                (out, false) => out,
            })
        }
        CudaStorageSlice::F16(s) => {
            CudaStorageSlice::F16(quantize_on_host(dev, s, layout, format, rounding, stream)?)
        }
        CudaStorageSlice::BF16(s) => {
            CudaStorageSlice::BF16(quantize_on_host(dev, s, layout, format, rounding, stream)?)
        }
        _ => return Err(unsupported("quantize", storage.dtype())),
    };
    Ok(CudaStorage {
        slice,
        device: dev.clone(),
    })
}

/// `cpu::quantize_in_place` on a host copy, copied back (f16, bf16).
fn quantize_in_place_on_host<T>(
    dev: &CudaDevice,
    data: &mut CudaSlice<T>,
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> Result<()>
where
    T: cpu::Element + DeviceRepr,
{
    let mut host = dev.clone_dtoh(&*data)?;
    cpu::quantize_in_place(&mut host, layout, format, rounding, stream)?;
    dev.memcpy_htod(&host, data)
}

/// The in-place quantize op on a CUDA tensor.
pub fn quantize_in_place(
    storage: &mut CudaStorage,
    layout: &Layout,
    format: &Format,
    rounding: Rounding,
    stream: Option<Stream>,
) -> Result<()> {
    if scaled::quantize_in_place(storage, layout, format, rounding, stream)? {
        return Ok(());
    }
    let dev = storage.device.clone();
    let dtype = storage.dtype();
    match &mut storage.slice {
        // An lns element undecided at the device's precision cap is left as it was and the
        // CPU kernel rounds the view again: in the nearest and toward-zero modes rounding a
        // rounded value changes nothing (lns.rs), so every element gets the CPU's bits; in
        // stochastic mode a rounded value above 2^(k/2^f) can still move up with its tiny
        // log-domain probability (lns.rs module docs).
        CudaStorageSlice::F32(s) => {
            let plan = Plan::new(format, rounding, stream, layout.dims())?;
            if quantize_in_place_typed(&dev, s, layout, &plan)? {
                quantize_in_place_on_host(&dev, s, layout, format, rounding, stream)?;
            }
            Ok(())
        }
        CudaStorageSlice::F64(s) => {
            let plan = Plan::new(format, rounding, stream, layout.dims())?;
            if quantize_in_place_typed(&dev, s, layout, &plan)? {
                quantize_in_place_on_host(&dev, s, layout, format, rounding, stream)?;
            }
            Ok(())
        }
        CudaStorageSlice::F16(s) => {
            quantize_in_place_on_host(&dev, s, layout, format, rounding, stream)
        }
        CudaStorageSlice::BF16(s) => {
            quantize_in_place_on_host(&dev, s, layout, format, rounding, stream)
        }
        _ => Err(unsupported("quantize_", dtype)),
    }
}

/// The bit patterns of a contiguous f32/f64 view in the pattern dtype `pattern` (U8, I16,
/// U32); `Ok(None)` when some element has no pattern (NaN in a `fin` float format: the caller
/// reports pack's error).
pub fn pack(
    storage: &CudaStorage,
    layout: &Layout,
    format: &Format,
    pattern: DType,
) -> Result<Option<CudaStorage>> {
    let dev = &storage.device;
    let n = layout.shape().elem_count();
    let start = layout.start_offset();
    let f = QcFormat::new(format);
    let mut failed = dev.alloc_zeros::<u32>(1)?;
    let (src_suffix, dst_suffix) = (
        match storage.dtype() {
            DType::F32 => "f32",
            DType::F64 => "f64",
            other => candle_core::bail!("pack on CUDA takes f32 or f64 storage, got {other:?}"),
        },
        match pattern {
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U32 => "u32",
            other => candle_core::bail!("pack: no {other:?} patterns"),
        },
    );
    let func = dev.get_or_load_custom_func(
        &format!("qc_pack_{src_suffix}_{dst_suffix}"),
        MODULE,
        ptx::QUANT,
    )?;
    let n64 = n as u64;
    let cfg = launch_config(dev, n64);
    macro_rules! launch {
        ($src:expr, $ty:ty, $variant:ident) => {{
            // SAFETY: every element is written by the kernel (or there are none).
            let mut out = unsafe { dev.alloc::<$ty>(n)? };
            if n > 0 {
                let view = $src.slice(start..);
                let mut b = func.builder();
                b.arg(&mut out)
                    .arg(&view)
                    .arg(&n64)
                    .arg(&f)
                    .arg(&mut failed);
                // SAFETY: the signature of qc_pack_* in cuda/quant.cu.
                unsafe { b.launch(cfg) }.w()?;
            }
            CudaStorageSlice::$variant(out)
        }};
    }
    macro_rules! by_pattern {
        ($src:expr) => {
            match pattern {
                DType::U8 => launch!($src, u8, U8),
                DType::I16 => launch!($src, i16, I16),
                _ => launch!($src, u32, U32),
            }
        };
    }
    let slice = match &storage.slice {
        CudaStorageSlice::F32(s) => by_pattern!(s),
        CudaStorageSlice::F64(s) => by_pattern!(s),
        _ => unreachable!("checked above"),
    };
    match dev.clone_dtoh(&failed)?[0] {
        0 => {}
        // An lns comparison beyond the device's precision (lns never lacks a pattern).
        2 => return Err(beyond_device_precision("pack", format)),
        _ => return Ok(None),
    }
    Ok(Some(CudaStorage {
        slice,
        device: dev.clone(),
    }))
}

/// The values (f32 or f64 `dtype`) of the contiguous pattern view (U8, I16 or U32 storage);
/// `Err(Some(pattern))` with the first pattern that has bits above the format's (the caller
/// reports unpack's error).
pub fn unpack(
    storage: &CudaStorage,
    layout: &Layout,
    format: &Format,
    dtype: DType,
) -> Result<std::result::Result<CudaStorage, u32>> {
    let dev = &storage.device;
    let n = layout.shape().elem_count();
    let start = layout.start_offset();
    let f = QcFormat::new(format);
    let bits = format.bits();
    let mut first_bad = dev.clone_htod(&[u64::MAX])?;
    let mut undecided = undecided_flag(dev, format)?;
    let null = 0u64;
    let src_suffix = match storage.dtype() {
        DType::U8 => "u8",
        DType::I16 => "i16",
        DType::U32 => "u32",
        other => candle_core::bail!("unpack: patterns must be u8, i16 or u32, got {other:?}"),
    };
    let dst_suffix = match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        other => candle_core::bail!("unpack on CUDA writes f32 or f64, not {other:?}"),
    };
    let func = dev.get_or_load_custom_func(
        &format!("qc_unpack_{src_suffix}_{dst_suffix}"),
        MODULE,
        ptx::QUANT,
    )?;
    let n64 = n as u64;
    let cfg = launch_config(dev, n64);
    macro_rules! launch {
        ($src:expr, $ty:ty, $variant:ident) => {{
            // SAFETY: every element is written by the kernel (or there are none).
            let mut out = unsafe { dev.alloc::<$ty>(n)? };
            if n > 0 {
                let view = $src.slice(start..);
                let mut b = func.builder();
                b.arg(&mut out)
                    .arg(&view)
                    .arg(&n64)
                    .arg(&f)
                    .arg(&bits)
                    .arg(&mut first_bad);
                match &mut undecided {
                    Some(u) => b.arg(u),
                    None => b.arg(&null),
                };
                // SAFETY: the signature of qc_unpack_* in cuda/quant.cu.
                unsafe { b.launch(cfg) }.w()?;
            }
            CudaStorageSlice::$variant(out)
        }};
    }
    macro_rules! by_dtype {
        ($src:expr) => {
            match dtype {
                DType::F32 => launch!($src, f32, F32),
                _ => launch!($src, f64, F64),
            }
        };
    }
    let slice = match &storage.slice {
        CudaStorageSlice::U8(s) => by_dtype!(s),
        CudaStorageSlice::I16(s) => by_dtype!(s),
        CudaStorageSlice::U32(s) => by_dtype!(s),
        _ => unreachable!("checked above"),
    };
    let bad = dev.clone_dtoh(&first_bad)?[0];
    if bad != u64::MAX {
        let at = start + bad as usize;
        let p = match &storage.slice {
            CudaStorageSlice::U8(s) => dev.clone_dtoh(&s.slice(at..at + 1))?[0] as u32,
            CudaStorageSlice::I16(s) => dev.clone_dtoh(&s.slice(at..at + 1))?[0] as u16 as u32,
            CudaStorageSlice::U32(s) => dev.clone_dtoh(&s.slice(at..at + 1))?[0],
            _ => unreachable!("checked above"),
        };
        return Ok(Err(p));
    }
    if flag_set(dev, &undecided)? {
        return Err(beyond_device_precision("unpack", format));
    }
    Ok(Ok(CudaStorage {
        slice,
        device: dev.clone(),
    }))
}
