//! `qcandle::ops::conv2d` / `max_pool2d` against candle's own ops, in one run, on the LeNet-5
//! layer shapes at batch 128 (f32, CPU).
//!
//! * `conv1`: 1 -> 6 channels, 5x5 kernel, 32x32 input, with bias. The input is a data batch
//!   (no gradient), as for a network's first layer: our op skips the input gradient, candle
//!   computes it anyway.
//! * `conv2`: 6 -> 16 channels, 5x5 kernel, 14x14 input, with bias. The input is a variable,
//!   so both compute all three gradients.
//! * `pool1`: 2x2 max pool of the 6x28x28 conv1 output.
//!
//! Each group times `forward` alone and `fwd+bwd` (forward, the loss `sum(y)`, backward) for
//! `qcandle` and `candle`, and `loss-only`, the loss and its backward on a variable of the
//! output's shape (the part of `fwd+bwd` that is not the layer). candle materialises the
//! loss gradient, so the layer's backward receives a contiguous tensor, as from a following
//! layer; other losses (`sum(y * r)`, a dot product) cost candle several milliseconds more
//! on the conv1 output, the same on both sides. candle's CPU thread settings are tuned first
//! (the tool's, `src/bin/qcandle/threads.rs`), which speeds up candle's ops as well.
//! Run: `cargo bench --bench conv`.

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use std::time::Duration;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Conv2dConfig;
use criterion::{criterion_group, criterion_main, Criterion};
use qcandle::ops::{conv2d, max_pool2d};

const BATCH: usize = 128;

type Op = fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor>;

fn ours(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    conv2d(x, w, Some(b), &Conv2dConfig::default())
}

fn theirs(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    x.conv2d(w, 0, 1, 1, 1)?
        .broadcast_add(&b.reshape((1, b.dim(0)?, 1, 1))?)
}

fn bench_conv(c: &mut Criterion) {
    threads::tune_cpu_threads_on_main();
    let dev = Device::Cpu;
    let layers = [("conv1", 1, 6, 32, false), ("conv2", 6, 16, 14, true)];
    for (name, cin, cout, size, input_grad) in layers {
        let x = Tensor::randn(0f32, 1.0, (BATCH, cin, size, size), &dev).expect("input");
        let x = if input_grad {
            Var::from_tensor(&x).expect("var").as_tensor().clone()
        } else {
            x
        };
        let w = Var::randn(0f32, 0.1, (cout, cin, 5, 5), &dev).expect("weight");
        let b = Var::zeros(cout, DType::F32, &dev).expect("bias");
        let mut g = c.benchmark_group(name);
        // The loss and its backward alone, on a variable of the output's shape.
        let y0 = Var::from_tensor(&ours(&x, &w, &b).expect("forward")).expect("var");
        g.bench_function("loss-only", |bench| {
            bench.iter(|| {
                y0.flatten_all()
                    .and_then(|t| t.sum_all())
                    .and_then(|l| l.backward())
                    .expect("backward")
            })
        });
        for (impl_name, op) in [("qcandle", ours as Op), ("candle", theirs as Op)] {
            g.bench_function(format!("forward/{impl_name}"), |bench| {
                bench.iter(|| op(&x, &w, &b).expect("forward"))
            });
            g.bench_function(format!("fwd+bwd/{impl_name}"), |bench| {
                bench.iter(|| {
                    let y = op(&x, &w, &b).expect("forward");
                    y.flatten_all()
                        .and_then(|t| t.sum_all())
                        .and_then(|l| l.backward())
                        .expect("backward")
                })
            });
        }
        g.finish();
    }

    let x = Var::randn(0f32, 1.0, (BATCH, 6, 28, 28), &dev).expect("input");
    let mut g = c.benchmark_group("pool1");
    type Pool = fn(&Tensor) -> candle_core::Result<Tensor>;
    let pools: [(&str, Pool); 2] = [
        ("qcandle", |x| max_pool2d(x, 2, 2)),
        ("candle", |x| x.max_pool2d(2)),
    ];
    for (impl_name, op) in pools {
        g.bench_function(format!("forward/{impl_name}"), |bench| {
            bench.iter(|| op(x.as_tensor()).expect("forward"))
        });
        g.bench_function(format!("fwd+bwd/{impl_name}"), |bench| {
            bench.iter(|| {
                let y = op(x.as_tensor()).expect("forward");
                y.flatten_all()
                    .and_then(|t| t.sum_all())
                    .and_then(|l| l.backward())
                    .expect("backward")
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_conv
}
criterion_main!(benches);
