//! A rounding pass is split over rayon's pool only for large tensors and a pool of more than
//! one thread (`backend::cpu::PARALLEL_MIN_LEN`); the split must not change a bit. Each
//! format and rounding here rounds tensors above and below the threshold in a four-thread
//! pool and in a one-thread pool (where every pass runs whole on the calling thread),
//! contiguous and strided, into a new tensor and in place, and the bits must agree: the
//! stochastic streams are keyed by position and the block scales by maxima, so neither may
//! depend on which thread rounds which chunk.

use candle_core::{Device, Tensor};
use qcandle::{quantize_no_grad, Quant};

type R = anyhow::Result<()>;

fn bits(t: &Tensor) -> anyhow::Result<Vec<u32>> {
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    Ok(v.into_iter().map(f32::to_bits).collect())
}

/// Normal samples spread over many binades (scaled by 2^-20 .. 2^20 in turn).
fn data(rows: usize, cols: usize) -> anyhow::Result<Tensor> {
    let n = rows * cols;
    let v: Vec<f32> = qcandle::report::normal_samples(n, 7)
        .into_iter()
        .enumerate()
        .map(|(i, x)| x * (2f32).powi((i % 41) as i32 - 20))
        .collect();
    Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)
}

#[test]
fn rounding_gives_the_same_bits_on_one_thread_and_on_the_pool() -> R {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let four = rayon::ThreadPoolBuilder::new().num_threads(4).build()?;
    let formats = [
        "posit<16,1>",
        "bf16",
        "e4m3",
        "fixed<8,4>",
        "block<8>",
        "block<8,dim=-1>",
        "mxfp8_e4m3",
        "mxint8",
        "nvfp4",
        "lns<8,3>",
    ];
    // 96 x 4096 = 384 K elements: split over the pool; 16 x 4096 = 64 K: whole either way.
    for (rows, cols) in [(96, 4096), (16, 4096), (3, 1000)] {
        let x = data(rows, cols)?;
        let strided = x.t()?;
        for format in formats {
            for rounding in ["nearest-even", "stochastic:8"] {
                let q = Quant::parse(format, rounding)?.with_seed(11);
                for (what, input) in [("contiguous", &x), ("transposed", &strided)] {
                    q.set_calls(0);
                    let pool = four.install(|| quantize_no_grad(input, &q))?;
                    q.set_calls(0);
                    let alone = one.install(|| quantize_no_grad(input, &q))?;
                    assert_eq!(
                        bits(&pool)?,
                        bits(&alone)?,
                        "{format} {rounding}, {what} {rows}x{cols}"
                    );
                    let mut in_place = input.contiguous()?.copy()?;
                    q.set_calls(0);
                    four.install(|| qcandle::quantize_(&in_place, &q))?;
                    assert_eq!(
                        bits(&in_place)?,
                        bits(&pool)?,
                        "{format} {rounding} in place"
                    );
                    in_place = input.contiguous()?.copy()?;
                    q.set_calls(0);
                    one.install(|| qcandle::quantize_(&in_place, &q))?;
                    assert_eq!(bits(&in_place)?, bits(&pool)?, "{format} {rounding} alone");
                }
            }
        }
    }
    Ok(())
}
