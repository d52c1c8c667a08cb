//! Timing on a CUDA device for the `*_cuda` benches (shared through `#[path]`).

use std::time::Instant;

use candle_core::Device;

/// CUDA device 0, or `None` after printing "skipped: no CUDA device".
pub fn cuda_or_skip() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// Seconds per call of `f`: the median of 5 timed batches of `reps` calls after a warm-up,
/// each batch ended by a device synchronisation.
pub fn time(
    dev: &Device,
    reps: usize,
    mut f: impl FnMut() -> candle_core::Result<()>,
) -> candle_core::Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        dev.synchronize()?;
        samples.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok(samples[2])
}
