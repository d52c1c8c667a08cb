//! In-place quantize at 2^24 elements in CPU time: the rounding work itself, measured as the
//! process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`, every thread), so time spent waiting for
//! a core on a shared machine does not count.
//!
//! Each row calls the kernel (`backend::cpu::quantize_slice`, in place, on its thread pool)
//! on the whole tensor; `memcpy` (`copy_from_slice` into a preallocated buffer, one thread)
//! is the baseline. CPU time adds the threads' times, so on `n` free cores a kernel that
//! keeps them all busy takes about `1/n` of it in wall-clock time: `n` times the ratio to
//! `memcpy` estimates the wall-clock ratio of `benches/quantize.rs` on an idle machine
//! (idle pool threads spinning count against the kernel, so the estimate errs low). Run:
//! `cargo bench --bench quantize_cpu` (add a filter such as `-- stochastic`).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qcandle::backend::cpu::quantize_slice;
use qcandle::philox::Stream;
use qcandle::{Format, Rounding};

/// The process's CPU time as criterion's measurement.
#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::ProcessCpuTime;

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
    ("mxfp8_e4m3", "nearest-even"),
    ("mxfp4_e2m1", "nearest-even"),
    ("mxint8", "nearest-even"),
    ("nvfp4", "nearest-even"),
    ("mxfp8_e4m3", "stochastic"),
    ("mxfp8_e5m2", "nearest-even"),
    ("mxfp6_e3m2", "nearest-even"),
    ("mxfp6_e2m3", "nearest-even"),
    ("mxfp8_e4m3<dim=0>", "nearest-even"),
    ("mxfp4_e2m1", "stochastic"),
    ("mxint8", "stochastic"),
    ("nvfp4", "stochastic"),
];

fn bench_quantize_cpu(c: &mut Criterion<ProcessCpuTime>) {
    let n = 1usize << 24;
    let data = qcandle::report::normal_samples(n, 7);
    let mut buffer = vec![0f32; n];
    let mut group = c.benchmark_group("quantize-cpu/2^24");
    group.throughput(Throughput::Bytes(8 * n as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));
    group.warm_up_time(Duration::from_millis(500));
    group.bench_function("memcpy", |b| {
        b.iter(|| std::hint::black_box(buffer.as_mut_slice()).copy_from_slice(&data))
    });
    for (format, rounding) in CASES {
        let format: Format = format.parse().unwrap();
        let rounding: Rounding = rounding.parse().unwrap();
        let mut values = data.clone();
        let mut call = 0u64;
        group.bench_function(
            BenchmarkId::new(format.to_string(), format!("{rounding} in-place")),
            |b| {
                b.iter(|| {
                    // A new stream per call, as `quantize_` takes the next call index.
                    call += 1;
                    let stream = Some(Stream::new(1, call));
                    let dims = [n / 256, 256];
                    quantize_slice(None, &mut values, &dims, &format, rounding, stream).unwrap()
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ProcessCpuTime);
    targets = bench_quantize_cpu
}
criterion_main!(benches);
