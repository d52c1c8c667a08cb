//! Process-wide settings of candle's CPU threads, applied once by the tool at start-up.
//!
//! These are settings of the process environment, so they belong to the program, not to the
//! library: a program that links qcandle keeps its environment as it set it. The tool
//! applies them first thing in `main`; the benches and the tests that train or convolve
//! include this file (`#[path]`) and apply them the same way, so that they run under the
//! tool's settings.
//!
//! - **Thread count lookup.** candle looks up its thread count on every CPU matmul, reading
//!   the CPU topology from `/proc` each time unless `RAYON_NUM_THREADS` is set (about 9% of
//!   a LeNet-5 training step when the conv layers called matmul per image). We set it once
//!   to the value candle would have computed, after starting rayon's global pool so that
//!   the pool keeps its size.
//! - **Elementwise pool spinning.** candle's elementwise ops run on its own barrier pool,
//!   whose idle workers spin 25,000 times between ops before parking. Beside rayon's pool on
//!   few cores, that spinning takes cycles from the threads doing the work (about a third
//!   more CPU time in a 2-core training epoch). We set `CANDLE_BARRIER_POOL_SPIN_LIMIT` to
//!   [`SPIN_LIMIT`], which still covers the gap between consecutive elementwise ops.
//!
//! - **The main thread in rayon's pool** ([`tune_cpu_threads_on_main`] only). A thread
//!   outside rayon's pool that starts a parallel op (candle's matmul, for one) hands the job
//!   to the pool and sleeps until the pool's threads have finished it: on a 2-vCPU machine
//!   that is three threads for two CPUs, a worker to wake and then the caller to wake again,
//!   each tens of microseconds on a virtual machine. The main thread of the tool and of the
//!   benches therefore joins the global pool as its first thread
//!   (`ThreadPoolBuilder::use_current_thread`): it runs its own parallel ops and shares them
//!   with the pool's other threads, one fewer than before. On two vCPUs candle's f32 matmul
//!   at 128x400x120 took 33-36 µs instead of 39-44 µs, and a LeNet-5 float32 epoch 15-37%
//!   less time (BENCHMARKS.md). The tests leave this alone: a test's thread ends with its
//!   test, and a pool thread must live as long as the pool.
//!
//! Variables the user has set are left alone. Child processes inherit the settings.

use std::sync::Once;

/// The spin count of candle's idle elementwise workers before they park.
pub const SPIN_LIMIT: u32 = 1000;

static TUNE: Once = Once::new();

/// Makes the calling thread the first thread of rayon's global pool (module docs), where
/// the pool has at least two threads and has not started yet, then applies
/// [`tune_cpu_threads`]. Call it first thing in `main`, from the main thread: a pool thread
/// must live as long as the process.
#[allow(dead_code)] // The tool and the benches call it; the tests that include this file do not.
pub fn tune_cpu_threads_on_main() {
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads >= 2 {
        // An error means the pool has started already: it then keeps its own threads.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .use_current_thread()
            .build_global();
    }
    tune_cpu_threads();
}

/// Applies the settings above once per process: sets `RAYON_NUM_THREADS` when neither it
/// nor `CANDLE_NUM_THREADS` is set, and `CANDLE_BARRIER_POOL_SPIN_LIMIT` when unset. Call
/// it early (before candle's first elementwise op, which reads the spin limit, and before
/// other threads read the environment).
pub fn tune_cpu_threads() {
    TUNE.call_once(|| {
        let set = |k| std::env::var_os(k).is_some();
        if !set("RAYON_NUM_THREADS") && !set("CANDLE_NUM_THREADS") {
            let _ = rayon::current_num_threads();
            let n = candle_core::utils::get_num_threads();
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        }
        if !set("CANDLE_BARRIER_POOL_SPIN_LIMIT") {
            std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", SPIN_LIMIT.to_string());
        }
    });
}
