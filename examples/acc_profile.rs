use candle_core::{Device, Tensor};
use qcandle::format::Format;
use qcandle::quire::{rule_linear, Accumulate, LayerArith};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (fmt, set) = (&args[1], &args[2]);
    let iters: usize = args[3].parse().unwrap();
    let (m, k, n) = (128, 400, 120);
    let x = Tensor::from_vec(
        qcandle::report::normal_samples(m * k, 1),
        (m, k),
        &Device::Cpu,
    )
    .unwrap();
    let w = Tensor::from_vec(
        qcandle::report::normal_samples(k * n, 2),
        (n, k),
        &Device::Cpu,
    )
    .unwrap();
    let f: Format = fmt.parse().unwrap();
    let acc: Accumulate = set.parse().unwrap();
    let arith = LayerArith::new(&acc, Some(f), Some(f), Some(f))
        .unwrap()
        .unwrap();
    let t = std::time::Instant::now();
    for _ in 0..iters {
        rule_linear(&x, &w, None, &arith).unwrap();
    }
    eprintln!("{:?} per call", t.elapsed() / iters as u32);
}
