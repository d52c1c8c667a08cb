//! The CUDA posit GEMMs (`cuda/gemm.cu`) against candle's f32 matmul (cuBLAS) on the same
//! device, at 1024 x 1024 x 1024 (and a linear layer's shape).
//!
//! `cargo bench --features cuda --bench gemm_cuda` on a machine with a GPU; without one it
//! prints "skipped: no CUDA device". Times include encoding the f32 operands to patterns;
//! GOP/s counts 2·m·k·n operations.

#[path = "common/device.rs"]
mod device;

use candle_core::Tensor;
use qcandle::quire::{linear, matmul, Accumulation};
use qcandle::Format;

fn main() -> anyhow::Result<()> {
    let Some(dev) = device::cuda_or_skip() else {
        return Ok(());
    };
    let (m, k, n) = (1024, 1024, 1024);
    let ops = 2.0 * (m * k * n) as f64;
    let a = Tensor::randn(0f32, 1f32, (m, k), &dev)?;
    let b = Tensor::randn(0f32, 1f32, (k, n), &dev)?;
    let f32_time = device::time(&dev, 20, || a.matmul(&b).map(drop))?;
    println!(
        "{m}x{k}x{n} f32 matmul (candle): {:8.3} ms {:8.0} GFLOP/s",
        f32_time * 1e3,
        ops / f32_time / 1e9
    );
    for format in ["posit<8,0>", "posit<8,1>", "posit<8,2>"] {
        let f: Format = format.parse()?;
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            // A failing case is printed and the others still run.
            let t = match device::time(&dev, 5, || matmul(&a, &b, &f, acc).map(drop)) {
                Ok(t) => t,
                Err(e) => {
                    println!("{m}x{k}x{n} {format:<11} {acc:?}: error: {e}");
                    continue;
                }
            };
            println!(
                "{m}x{k}x{n} {format:<11} {acc:?}: {:8.3} ms {:8.0} GOP/s ({:.1}x f32)",
                t * 1e3,
                ops / t / 1e9,
                t / f32_time
            );
        }
    }
    // A linear layer: batch 256, 4096 -> 1024, with a bias.
    let x = Tensor::randn(0f32, 1f32, (256, 4096), &dev)?;
    let w = Tensor::randn(0f32, 0.02f32, (1024, 4096), &dev)?;
    let bias = Tensor::randn(0f32, 0.1f32, 1024, &dev)?;
    let f: Format = "posit<8,0>".parse()?;
    let t = device::time(&dev, 5, || {
        linear(&x, &w, Some(&bias), &f, Accumulation::Quire).map(drop)
    })?;
    let lin_ops = 2.0 * (256 * 4096 * 1024) as f64;
    println!(
        "linear 256x4096 -> 1024 posit<8,0> Quire: {:8.3} ms {:8.0} GOP/s",
        t * 1e3,
        lin_ops / t / 1e9
    );
    Ok(())
}
