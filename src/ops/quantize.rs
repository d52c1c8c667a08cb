//! The quantize op on candle tensors.
//!
//! `quantize(x, q)` is a `CustomOp1`: forward rounds every element of `x` to `q`'s format
//! with `q`'s rounding mode; backward passes the gradient straight through (the
//! straight-through estimator, as in QPyTorch). A [`Quantizer`] additionally rounds the
//! incoming gradient in backward with its own format and rounding, which is how the
//! "error" number category of low-precision training is simulated.
//!
//! Stochastic rounding reads its random bits from a Philox stream keyed by the [`Quant`]'s
//! seed; each stochastic call takes the next call index from the Quant's counter (shared by
//! its clones), so a training run is reproducible from its seeds.
//!
//! A `Quant` can be observed: its [`Tap`] (shared by its clones) holds an optional
//! [`Collector`] that, while switched on, receives the values before and after each of its
//! roundings on the CPU ([`crate::stats`]); a `Quant` may also carry the [`Site`] it rounds
//! at (layer and category), which a config sets. Observing never changes the result.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, InplaceOp1, Layout, Module, Result, Shape, Tensor};

use crate::backend::cpu;
use crate::format::{Format, Rounding};
use crate::philox::Stream;
use crate::stats::{Collector, Site, Tap};

/// A format, a rounding mode and a random stream: everything one quantization needs.
#[derive(Debug, Clone)]
pub struct Quant {
    format: Format,
    rounding: Rounding,
    seed: u64,
    calls: Arc<AtomicU64>,
    tap: Tap,
    site: Option<Arc<Site>>,
}

impl Quant {
    /// Round to `format`, nearest-even.
    pub fn new(format: Format) -> Self {
        Quant {
            format,
            rounding: Rounding::NearestEven,
            seed: 0,
            calls: Arc::new(AtomicU64::new(0)),
            tap: Tap::default(),
            site: None,
        }
    }

    /// Parses a format string and a rounding string (`"posit<8,0>"`, `"stochastic:8"`).
    pub fn parse(format: &str, rounding: &str) -> std::result::Result<Self, crate::FormatError> {
        Ok(Quant::new(format.parse()?).with_rounding(rounding.parse()?))
    }

    /// The same format with another rounding mode.
    pub fn with_rounding(mut self, rounding: Rounding) -> Self {
        self.rounding = rounding;
        self
    }

    /// The same settings with a new seed and a fresh call counter.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self.calls = Arc::new(AtomicU64::new(0));
        self
    }

    /// The target format.
    pub fn format(&self) -> &Format {
        &self.format
    }

    /// The rounding mode.
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// The stochastic-rounding seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many stochastic calls this Quant (and its clones) has made.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Sets the call counter, to resume a run exactly where it stopped.
    pub fn set_calls(&self, calls: u64) {
        self.calls.store(calls, Ordering::Relaxed)
    }

    /// The same quantizer, labelled with the site it rounds at.
    pub fn with_site(mut self, site: Site) -> Self {
        self.site = Some(Arc::new(site));
        self
    }

    /// The site this quantizer rounds at, when labelled.
    pub fn site(&self) -> Option<&Site> {
        self.site.as_deref()
    }

    /// The tap through which a [`Collector`] observes this quantizer's roundings (shared by
    /// its clones).
    pub fn tap(&self) -> &Tap {
        &self.tap
    }

    /// The stream for the next call (None for deterministic rounding, which uses none).
    fn next_stream(&self) -> Option<Stream> {
        self.rounding
            .is_stochastic()
            .then(|| Stream::new(self.seed, self.calls.fetch_add(1, Ordering::Relaxed)))
    }

    pub(crate) fn op(&self) -> QuantizeOp {
        QuantizeOp {
            format: self.format,
            rounding: self.rounding,
            stream: self.next_stream(),
            collector: self.tap.active(),
        }
    }
}

/// The forward kernel of one quantization, with its random stream fixed.
#[derive(Debug, Clone)]
pub(crate) struct QuantizeOp {
    format: Format,
    rounding: Rounding,
    stream: Option<Stream>,
    /// Where the roundings are reported (only on CPU storage).
    collector: Option<Arc<Collector>>,
}

impl QuantizeOp {
    /// Rounds a contiguous f32 buffer (shape `dims`) in place.
    /// Whether rounding parts of a tensor one at a time gives the bits of rounding it whole:
    /// elementwise formats with a deterministic rounding (a stochastic stream is indexed by
    /// the position in the whole tensor, and a block's scale depends on its maximum).
    pub(crate) fn rounds_parts_alike(&self) -> bool {
        !matches!(
            self.format,
            Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_)
        ) && !matches!(self.rounding, Rounding::Stochastic { .. })
    }

    pub(crate) fn round_f32_in_place(&self, data: &mut [f32], dims: &[usize]) -> Result<()> {
        let before = self.collector.as_ref().map(|_| data.to_vec());
        cpu::quantize_slice(None, data, dims, &self.format, self.rounding, self.stream)?;
        if let (Some(c), Some(x)) = (&self.collector, before) {
            c.record(&self.format, &x, data);
        }
        Ok(())
    }
}

fn unsupported(op: &str, dtype: candle_core::DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: unsupported dtype {dtype:?}; quantize takes f32, f64, f16 or bf16 tensors"
    ))
}

/// A map of CPU storage written once for every float element type: the one place that
/// dispatches on the storage's dtype (candle's `Map1` pattern). Other dtypes are an error
/// naming `op`.
trait MapFloats {
    /// The new elements of the tensor `v` laid out as `layout`, in logical row-major order.
    fn apply<T: cpu::Element>(&self, v: &[T], layout: &Layout) -> Result<Vec<T>>;

    /// [`MapFloats::apply`] on the storage's elements, as storage of the same dtype.
    fn map_storage(&self, op: &str, storage: &CpuStorage, layout: &Layout) -> Result<CpuStorage> {
        Ok(match storage {
            CpuStorage::F32(v) => CpuStorage::F32(self.apply(v, layout)?),
            CpuStorage::F64(v) => CpuStorage::F64(self.apply(v, layout)?),
            CpuStorage::F16(v) => CpuStorage::F16(self.apply(v, layout)?),
            CpuStorage::BF16(v) => CpuStorage::BF16(self.apply(v, layout)?),
            other => return Err(unsupported(op, other.dtype())),
        })
    }
}

/// [`MapFloats`] in place.
trait MapFloatsInPlace {
    /// Rewrites the elements of the tensor `v` laid out as `layout`.
    fn apply_in_place<T: cpu::Element>(&self, v: &mut [T], layout: &Layout) -> Result<()>;

    /// [`MapFloatsInPlace::apply_in_place`] on the storage's elements.
    fn map_storage_in_place(
        &self,
        op: &str,
        storage: &mut CpuStorage,
        layout: &Layout,
    ) -> Result<()> {
        match storage {
            CpuStorage::F32(v) => self.apply_in_place(v, layout),
            CpuStorage::F64(v) => self.apply_in_place(v, layout),
            CpuStorage::F16(v) => self.apply_in_place(v, layout),
            CpuStorage::BF16(v) => self.apply_in_place(v, layout),
            other => Err(unsupported(op, other.dtype())),
        }
    }
}

impl MapFloats for QuantizeOp {
    fn apply<T: cpu::Element>(&self, v: &[T], layout: &Layout) -> Result<Vec<T>> {
        let out = cpu::quantize_to_vec(v, layout, &self.format, self.rounding, self.stream)?;
        if let Some(c) = &self.collector {
            match layout.contiguous_offsets() {
                Some((start, end)) => c.record(&self.format, &v[start..end], &out),
                None => c.record(&self.format, &cpu::gather(v, layout), &out),
            }
        }
        Ok(out)
    }
}

impl MapFloatsInPlace for QuantizeOp {
    fn apply_in_place<T: cpu::Element>(&self, v: &mut [T], layout: &Layout) -> Result<()> {
        let before = self.collector.as_ref().map(|_| cpu::gather(v, layout));
        cpu::quantize_in_place(v, layout, &self.format, self.rounding, self.stream)?;
        if let (Some(c), Some(x)) = (&self.collector, before) {
            match layout.contiguous_offsets() {
                Some((start, end)) => c.record(&self.format, &x, &v[start..end]),
                None => c.record(&self.format, &x, &cpu::gather(v, layout)),
            }
        }
        Ok(())
    }
}

/// A contiguous copy in logical order (a quantizer without forward rounding).
struct Gather;

impl MapFloats for Gather {
    fn apply<T: cpu::Element>(&self, v: &[T], layout: &Layout) -> Result<Vec<T>> {
        Ok(cpu::gather(v, layout))
    }
}

impl CustomOp1 for QuantizeOp {
    fn name(&self) -> &'static str {
        "qcandle-quantize"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = self.map_storage("quantize", storage, layout)?;
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (f, r, s) = (&self.format, self.rounding, self.stream);
        let out = crate::backend::cuda::quantize(storage, layout, f, r, s)?;
        Ok((out, layout.shape().clone()))
    }

    /// Straight-through: the gradient of the rounding is taken to be the identity.
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.clone()))
    }
}

impl InplaceOp1 for QuantizeOp {
    fn name(&self) -> &'static str {
        "qcandle-quantize-inplace"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        self.map_storage_in_place("quantize_", storage, layout)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &mut candle_core::CudaStorage, layout: &Layout) -> Result<()> {
        let (f, r, s) = (&self.format, self.rounding, self.stream);
        crate::backend::cuda::quantize_in_place(storage, layout, f, r, s)
    }
}

fn check_dtype(x: &Tensor, op: &str) -> Result<()> {
    use candle_core::DType::*;
    match x.dtype() {
        F32 | F64 | F16 | BF16 => Ok(()),
        other => Err(unsupported(op, other)),
    }
}

/// Rounds every element of `x` to `q`'s format; the backward pass is straight-through.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use qcandle::{quantize, Quant};
/// let x = Tensor::new(&[1.0f32, 1.06, 300.0, -1e-9], &Device::Cpu)?;
/// let y = quantize(&x, &Quant::new("e4m3".parse()?))?;
/// assert_eq!(y.to_vec1::<f32>()?, [1.0, 1.0, 288.0, -0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn quantize(x: &Tensor, q: &Quant) -> Result<Tensor> {
    check_dtype(x, "quantize")?;
    x.apply_op1(q.op())
}

/// Like [`quantize`], without recording a backward step (for values that need no gradient).
pub fn quantize_no_grad(x: &Tensor, q: &Quant) -> Result<Tensor> {
    check_dtype(x, "quantize")?;
    x.apply_op1_no_bwd(&q.op())
}

/// Rounds `x` in place (no allocation): for weights after an optimizer step, optimizer
/// state, and post-training conversion.
pub fn quantize_(x: &Tensor, q: &Quant) -> Result<()> {
    check_dtype(x, "quantize_")?;
    let op = q.op();
    if x.elem_count() == 0 {
        // candle refuses in-place ops on layouts with a zero stride, which an empty tensor
        // can have; the kernel on no elements still checks the format against the shape.
        return op.round_f32_in_place(&mut [], x.dims());
    }
    x.inplace_op1(&op)
}

/// A layer that rounds values in forward and their gradients in backward, each with its
/// own format and rounding (either may be absent).
#[derive(Debug, Clone, Default)]
pub struct Quantizer {
    forward: Option<Quant>,
    backward: Option<Quant>,
}

impl Quantizer {
    /// A quantizer with a forward (value) and a backward (gradient) quantization.
    pub fn new(forward: Option<Quant>, backward: Option<Quant>) -> Self {
        Quantizer { forward, backward }
    }

    /// The value quantization.
    pub fn forward_quant(&self) -> Option<&Quant> {
        self.forward.as_ref()
    }

    /// The gradient quantization.
    pub fn backward_quant(&self) -> Option<&Quant> {
        self.backward.as_ref()
    }
}

/// Forward: optional rounding of the value; backward: optional rounding of the gradient.
struct QuantizerOp {
    forward: Option<QuantizeOp>,
    backward: Option<Quant>,
}

impl CustomOp1 for QuantizerOp {
    fn name(&self) -> &'static str {
        "qcandle-quantizer"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        if let Some(op) = &self.forward {
            return CustomOp1::cpu_fwd(op, storage, layout);
        }
        let out = Gather.map_storage("quantizer", storage, layout)?;
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendDevice;
        if let Some(op) = &self.forward {
            return CustomOp1::cuda_fwd(op, storage, layout);
        }
        // No forward rounding: a contiguous copy of the view.
        let mut out = storage.device.zeros_impl(layout.shape(), storage.dtype())?;
        storage.copy_strided_src(&mut out, 0, layout)?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        match &self.backward {
            Some(q) => quantize_no_grad(grad_res, q).map(Some),
            None => Ok(Some(grad_res.clone())),
        }
    }
}

impl Module for Quantizer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_dtype(x, "quantizer")?;
        x.apply_op1(QuantizerOp {
            forward: self.forward.as_ref().map(Quant::op),
            backward: self.backward.clone(),
        })
    }
}
