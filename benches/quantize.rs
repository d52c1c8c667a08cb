//! Quantize throughput against plain copies of the same size, in one run.
//!
//! Each group is one tensor size. Its two baselines:
//!
//! - `memcpy`: `copy_from_slice` into a preallocated buffer, one read and one write per
//!   element with no allocation: the memory-bandwidth limit, the baseline of the in-place
//!   rows;
//! - `copy`: candle's `Tensor::copy` (allocates its output, then copies), the baseline of
//!   the allocating rows.
//!
//! Every case has an allocating row (`quantize`, id `format/rounding`) and an in-place row
//! (`quantize_` on a tensor of the same values, id `format/rounding in-place`; after the
//! first call the values are on the grid already, which the branch-free kernels do not
//! notice). Each is one read and one write per element, plus a reduction pass for block
//! floating point. Throughput is in bytes moved (8 per f32 element), so the GB/s ratio to
//! the baseline is the figure of merit. Run: `cargo bench --bench quantize` (sizes 2^16,
//! 2^20, 2^24; `QCANDLE_BENCH_SIZES=24` for one; add `-- in-place` to filter rows).

use std::time::Duration;

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qcandle::{quantize, quantize_, Format, Quant, Rounding};

const CASES: &[(&str, &str)] = &[
    ("posit<8,0>", "nearest-even"),
    ("posit<8,2>", "nearest-even"),
    ("posit<16,1>", "nearest-even"),
    ("e4m3", "nearest-even"),
    ("e5m2", "nearest-even"),
    ("bf16", "nearest-even"),
    ("fixed<8,4>", "nearest-even"),
    ("block<8>", "nearest-even"),
    ("block<8,dim=0>", "nearest-even"),
    ("posit<8,0>", "nearest-away"),
    ("posit<8,0>", "toward-zero"),
    ("posit<8,0>", "stochastic"),
    ("posit<16,1>", "stochastic"),
    ("e4m3", "stochastic"),
    ("bf16", "stochastic"),
    ("fixed<8,4>", "stochastic"),
    ("block<8>", "stochastic"),
    ("lns<8,3>", "nearest-even"),
    ("lns<16,10>", "nearest-even"),
    ("lns<8,3>", "stochastic"),
    ("lns<16,10>", "stochastic"),
    ("mxfp8_e4m3", "nearest-even"),
    ("mxfp4_e2m1", "nearest-even"),
    ("mxint8", "nearest-even"),
    ("nvfp4", "nearest-even"),
    ("mxfp8_e4m3", "stochastic"),
];

fn bench_quantize(c: &mut Criterion) {
    let filter = std::env::var("QCANDLE_BENCH_SIZES").unwrap_or_else(|_| "16,20,24".into());
    for log2 in filter
        .split(',')
        .filter_map(|s| s.trim().parse::<u32>().ok())
    {
        let n = 1usize << log2;
        let data = qcandle::report::normal_samples(n, 7);
        let x = Tensor::from_vec(data.clone(), (n / 256, 256), &Device::Cpu).unwrap();
        let mut buffer = vec![0f32; n];
        let mut group = c.benchmark_group(format!("quantize/2^{log2}"));
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
            let y = x.copy().unwrap();
            group.bench_with_input(
                BenchmarkId::new(format.to_string(), format!("{rounding} in-place")),
                &q,
                |b, q| b.iter(|| quantize_(&y, q).unwrap()),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench_quantize);
criterion_main!(benches);
