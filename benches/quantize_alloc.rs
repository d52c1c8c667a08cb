//! The allocating quantize rows of `benches/quantize.rs` under mimalloc as the global
//! allocator, to be run right after that bench (which uses the system allocator):
//!
//! ```sh
//! QCANDLE_BENCH_SIZES=24 cargo bench --bench quantize --bench quantize_alloc -- 'copy|nearest-even$|stochastic$'
//! ```
//!
//! A quantize call that allocates its output pays for the output's pages: with glibc's
//! allocator a 64 MiB buffer is a fresh `mmap` each call, and every page is faulted in
//! (zeroed by the kernel) on first write. A caching allocator keeps the pages mapped between
//! calls. Group `quantize-mimalloc/2^k`, rows as in `quantize/2^k`: `memcpy` (into a
//! preallocated buffer), `copy` (candle's allocating `Tensor::copy`), and one allocating
//! `quantize` row per case.

use std::time::Duration;

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qcandle::{quantize, Format, Quant, Rounding};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CASES: &[(&str, &str)] = &[
    ("posit<8,0>", "nearest-even"),
    ("e4m3", "nearest-even"),
    ("bf16", "nearest-even"),
    ("fixed<8,4>", "nearest-even"),
    ("block<8>", "nearest-even"),
    ("block<8,dim=0>", "nearest-even"),
    ("posit<8,0>", "stochastic"),
    ("bf16", "stochastic"),
];

fn bench_quantize_mimalloc(c: &mut Criterion) {
    let filter = std::env::var("QCANDLE_BENCH_SIZES").unwrap_or_else(|_| "16,20,24".into());
    for log2 in filter
        .split(',')
        .filter_map(|s| s.trim().parse::<u32>().ok())
    {
        let n = 1usize << log2;
        let data = qcandle::report::normal_samples(n, 7);
        let x = Tensor::from_vec(data.clone(), (n / 256, 256), &Device::Cpu).unwrap();
        let mut buffer = vec![0f32; n];
        let mut group = c.benchmark_group(format!("quantize-mimalloc/2^{log2}"));
        group.throughput(Throughput::Bytes(8 * n as u64));
        if log2 >= 22 {
            group.sample_size(10);
            group.measurement_time(Duration::from_secs(4));
        } else {
            group.measurement_time(Duration::from_secs(2));
        }
        group.warm_up_time(Duration::from_millis(500));
        group.bench_function("memcpy", |b| {
            b.iter(|| std::hint::black_box(buffer.as_mut_slice()).copy_from_slice(&data))
        });
        group.bench_function("copy", |b| b.iter(|| x.copy().unwrap()));
        for (format, rounding) in CASES {
            let format: Format = format.parse().unwrap();
            let rounding: Rounding = rounding.parse().unwrap();
            let q = Quant::new(format).with_rounding(rounding).with_seed(1);
            group.bench_with_input(
                BenchmarkId::new(format.to_string(), rounding),
                &q,
                |b, q| b.iter(|| quantize(&x, q).unwrap()),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench_quantize_mimalloc);
criterion_main!(benches);
