//! Posit GEMMs (`qcandle::quire::{quire_matmul, naive_matmul}`) against candle's f32
//! `Tensor::matmul`, in one run, on two shapes `m x k x n`:
//!
//! * `128x400x120`: a LeNet-5 fully connected layer (400 -> 120) at batch 128.
//! * `1024x1024x1024`: a large square product (10 samples; criterion warns that the slow
//!   entries overrun the 5 s target, and still takes the 10 samples, about 12 s each).
//!
//! Each group's first entry is `f32-matmul` (candle's CPU matmul, the baseline); the others
//! are the exact (`quire`) and naive (rounded after every operation) products for posit<8,0>
//! and posit<16,1>. Every call takes f32 tensors and returns one, so the rounding of the
//! inputs, the f64 conversions and the output conversion are all timed. Inputs are N(0, 1)
//! samples (`qcandle::report::normal_samples`, seeded), which spread over the posit formats'
//! densest binades. Throughput is in multiply-adds (`m * k * n` elements), so the ratio of
//! each entry's elem/s to `f32-matmul`'s is the figure of merit.
//!
//! Exact accumulators (asserted below): posit<8,0> sums i16 integers, posit<16,1> in an f64
//! GEMM checked by an error bound (see `qcandle::quire::gemm_cpu`).
//!
//! Naive posit<16,1> at 1024x1024x1024 is skipped: it would take about 19 s per call on the
//! 2-core development machine (110 ms at 128x400x120, 18 ns per multiply-add, a cost that
//! does not depend on the shape), too long for a criterion sample.
//!
//! A second set of groups, `accumulate/<shape>`, times the forward GEMM of a linear layer under
//! each `accumulate` setting (`qcandle::quire::rule_linear`, `x (m x k) · w (n x k)ᵀ`, no
//! bias: operand rounding, kernel and output included) against the same `f32-matmul`
//! baseline, at 128x400x120 and, for the settings fast enough, 1024³.
//!
//! Run: `cargo bench --bench gemm` (add `-- 128x400x120` to run one shape, `-- accumulate/`
//! for the layer groups only). `QCANDLE_BENCH_ISA=avx2` (or `portable`) caps the instruction
//! set qcandle's kernels use (`qcandle::backend::isa::set_cap`), to time a narrower CPU's
//! compiled paths on a wider one; candle's matmul is not capped, so such ratios understate
//! the narrower CPU's.

/// The tool's CPU thread settings, applied before the first candle op.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use std::time::Duration;

use candle_core::{Device, Tensor};
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use qcandle::format::Format;
use qcandle::quire::gemm_cpu::{accumulator_for, Accumulator};
use qcandle::quire::{naive_matmul, quire_matmul, rule_linear, Accumulate, LayerArith};

const SHAPES: &[(usize, usize, usize)] = &[(128, 400, 120), (1024, 1024, 1024)];

const FORMATS: &[(&str, Accumulator)] = &[
    ("posit<8,0>", Accumulator::I16),
    ("posit<16,1>", Accumulator::F64Checked),
];

type Op = fn(&Tensor, &Tensor, &Format) -> candle_core::Result<Tensor>;

/// Applies `QCANDLE_BENCH_ISA` (module docs), once per process.
fn cap_isa() {
    use qcandle::backend::isa::{set_cap, Isa};
    let Ok(name) = std::env::var("QCANDLE_BENCH_ISA") else {
        return;
    };
    let isa = match name.as_str() {
        "portable" => Isa::Portable,
        "avx2" => Isa::Avx2,
        "avx512" => Isa::Avx512,
        other => panic!("QCANDLE_BENCH_ISA={other}: expected portable, avx2 or avx512"),
    };
    set_cap(Some(isa));
}

fn bench_gemm(c: &mut Criterion) {
    threads::tune_cpu_threads_on_main();
    cap_isa();
    for &(m, k, n) in SHAPES {
        let big = m * k * n >= 1 << 28;
        let a = Tensor::from_vec(
            qcandle::report::normal_samples(m * k, 1),
            (m, k),
            &Device::Cpu,
        )
        .expect("a");
        let b = Tensor::from_vec(
            qcandle::report::normal_samples(k * n, 2),
            (k, n),
            &Device::Cpu,
        )
        .expect("b");
        let mut g = c.benchmark_group(format!("gemm/{m}x{k}x{n}"));
        g.throughput(Throughput::Elements((m * k * n) as u64));
        // Flat sampling: the slow entries run a few iterations per sample, not 1..=N.
        g.sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_secs(1));
        if big {
            g.sample_size(10).measurement_time(Duration::from_secs(5));
        } else {
            g.sample_size(20).measurement_time(Duration::from_secs(3));
        }
        g.bench_function("f32-matmul", |bench| {
            bench.iter(|| a.matmul(&b).expect("matmul"))
        });
        for &(name, acc) in FORMATS {
            let format: Format = name.parse().expect("format");
            let Format::Posit(posit) = format else {
                unreachable!("posit formats only")
            };
            assert_eq!(accumulator_for(posit, k), acc, "{name} at k = {k}");
            let ops: [(&str, Op); 2] = [("quire", quire_matmul), ("naive", naive_matmul)];
            for (op_name, op) in ops {
                if op_name == "naive" && name == "posit<16,1>" && big {
                    continue; // ~19 s per call: see the module docs.
                }
                g.bench_with_input(BenchmarkId::new(op_name, name), &format, |bench, f| {
                    bench.iter(|| op(&a, &b, f).expect(op_name))
                });
            }
        }
        g.finish();
    }
}

/// `(format, setting, runs at 1024³)` of the `accumulate/` groups.
const SETTINGS: &[(&str, &str, bool)] = &[
    ("posit<8,0>", "quire", true),
    ("posit<8,0>", "naive", false),
    ("posit<16,1>", "quire", true),
    ("posit<16,1>", "naive", false),
    ("posit<32,2>", "quire", true),
    ("posit<32,2>", "naive", false),
    ("e4m3", "naive", false),
    ("e5m2", "naive", false),
    ("posit<8,2>", "quire", false),
    ("e4m3", "naive:fp16", false),
    ("e4m3", "naive:fp32", false),
    ("e4m3", "naive:bf16", false),
    ("e4m3", "fma:fp32", false),
    ("e4m3", "fma:bf16", false),
    ("lns<16,8>", "lns:ideal", false),
    ("lns<16,8>", "lns:truncated", false),
    ("lns<16,8>", "lns:table", false),
    ("lns<32,23>", "lns:ideal", false),
];

fn bench_accumulate(c: &mut Criterion) {
    threads::tune_cpu_threads_on_main();
    cap_isa();
    for &(m, k, n) in SHAPES {
        let big = m * k * n >= 1 << 28;
        let x = Tensor::from_vec(
            qcandle::report::normal_samples(m * k, 1),
            (m, k),
            &Device::Cpu,
        )
        .expect("x");
        let w = Tensor::from_vec(
            qcandle::report::normal_samples(k * n, 2),
            (n, k),
            &Device::Cpu,
        )
        .expect("w");
        let wt = w.t().expect("wt").contiguous().expect("contiguous");
        let mut g = c.benchmark_group(format!("accumulate/{m}x{k}x{n}"));
        g.throughput(Throughput::Elements((m * k * n) as u64));
        g.sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_secs(1));
        if big {
            g.sample_size(10).measurement_time(Duration::from_secs(5));
        } else {
            g.sample_size(20).measurement_time(Duration::from_secs(3));
        }
        g.bench_function("f32-matmul", |bench| {
            bench.iter(|| x.matmul(&wt).expect("matmul"))
        });
        for &(format, setting, at_big) in SETTINGS {
            if big && !at_big {
                continue;
            }
            let f: Format = format.parse().expect("format");
            let acc: Accumulate = setting.parse().expect("setting");
            let arith = LayerArith::new(&acc, Some(f), Some(f), Some(f))
                .expect("rules")
                .expect("not f32");
            let id = BenchmarkId::new(setting, format);
            g.bench_with_input(id, &arith, |bench, arith| {
                bench.iter(|| rule_linear(&x, &w, None, arith).expect("linear"))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench_gemm, bench_accumulate);
criterion_main!(benches);
