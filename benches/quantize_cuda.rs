//! Throughput of the CUDA quantize kernels against a device-to-device copy of the same tensor
//! (the memory-bound ceiling: both read and write every element once).
//!
//! `cargo bench --features cuda --bench quantize_cuda` on a machine with a GPU; without one it
//! prints "skipped: no CUDA device". GB/s counts the bytes read plus the bytes written.

#[path = "common/device.rs"]
mod device;

use candle_core::{DType, Tensor};
use qcandle::{quantize, quantize_, Quant};

fn main() -> anyhow::Result<()> {
    let Some(dev) = device::cuda_or_skip() else {
        return Ok(());
    };
    let cases = [
        ("posit<8,0>", "nearest-even"),
        ("posit<16,1>", "nearest-even"),
        ("posit32", "nearest-even"),
        ("bf16", "nearest-even"),
        ("e4m3", "nearest-even"),
        ("e4m3", "stochastic"),
        ("posit<16,1>", "stochastic"),
        ("fixed<8,4>", "nearest-even"),
        ("block<8>", "nearest-even"),
        ("block<8,dim=0>", "nearest-even"),
        ("lns<8,3>", "nearest-even"),
        ("lns<16,10>", "nearest-even"),
        ("lns<8,3>", "stochastic"),
        ("mxfp8_e4m3", "nearest-even"),
        ("mxfp4_e2m1", "nearest-even"),
        ("mxint8", "nearest-even"),
        ("mxfp8_e4m3", "stochastic"),
        ("mxfp8_e4m3<dim=0>", "nearest-even"),
        ("nvfp4", "nearest-even"),
        ("nvfp4", "stochastic"),
    ];
    for dtype in [DType::F32, DType::F64] {
        let n = 1usize << 26; // 64 Mi elements: 256 MiB in f32, far beyond L2
        let x = Tensor::randn(0f32, 1f32, (n / 4096, 4096), &dev)?.to_dtype(dtype)?;
        let bytes = 2.0 * (n * dtype.size_in_bytes()) as f64;
        let copy = device::time(&dev, 20, || x.copy().map(drop))?;
        println!(
            "{dtype:?} {n} elements: device copy {:.3} ms, {:.0} GB/s",
            copy * 1e3,
            bytes / copy / 1e9
        );
        for (format, rounding) in cases {
            let q = Quant::parse(format, rounding)?;
            // A failing case is printed and the others still run.
            let t = match device::time(&dev, 20, || quantize(&x, &q).map(drop)) {
                Ok(t) => t,
                Err(e) => {
                    println!("{dtype:?} {format:<16} {rounding:<13} error: {e}");
                    continue;
                }
            };
            println!(
                "{dtype:?} {format:<16} {rounding:<13} {:8.3} ms {:6.0} GB/s ({:.2}x copy)",
                t * 1e3,
                bytes / t / 1e9,
                t / copy
            );
        }
        let y = x.copy()?;
        let q = Quant::parse("posit<16,1>", "nearest-even")?;
        let t = device::time(&dev, 20, || quantize_(&y, &q))?;
        println!(
            "{dtype:?} posit<16,1> in place            {:8.3} ms {:6.0} GB/s",
            t * 1e3,
            bytes / t / 1e9
        );
    }
    Ok(())
}
