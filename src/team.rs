//! A short list of tasks shared by the calling thread and helpers from rayon's pool, for
//! parallel work of a few hundred microseconds.
//!
//! `rayon::join` and the parallel iterators called from a thread outside the pool hand the
//! whole job to the pool and put the caller to sleep until it is done; inside, each split
//! waits for an idle worker to wake and steal its half. Where waking a thread takes tens
//! of microseconds (a parked virtual CPU: on the 2-vCPU machines qcandle is benchmarked
//! on, an empty `rayon::spawn` after 300 µs of idleness starts about 50 µs later, and the
//! caller learns it is done about 100 µs after the spawn), a GEMM of 300 µs split that
//! way runs no faster than on one thread.
//!
//! [`run`] instead keeps the caller working: it asks the pool for helpers, computes the
//! tasks' shared input itself meanwhile (the part every task needs, such as a GEMM's
//! rounded right operand), then claims tasks one at a time from a shared counter, as each
//! helper does once it is awake. With [`run_prepared`] a task comes in two parts: its own
//! (such as rounding a band's rows of the left operand), which a thread runs as soon as it
//! has claimed the task, and the rest, which waits for the shared input; a helper that
//! wakes while the caller still computes the shared input does its own part meanwhile
//! instead of waiting. A helper that wakes late finds fewer tasks left, or none; the
//! caller never sleeps waiting for one to wake, and once no task is left unclaimed it
//! spins (yielding) only until the ones being run are done. Which thread runs a task never
//! changes its result.
//!
//! The caller may also be a thread of the pool, as the `qcandle` tool's main thread is: the
//! helpers then go onto its own queue, from which the pool's other threads take them, and
//! the rest is the same.
//!
//! The tasks should not call into rayon themselves: from a caller outside the pool, such a
//! call would again put the caller to sleep until a worker is free to take it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// How a GEMM of `m x k x n` uses rayon's threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Threading {
    /// All on the calling thread: not `parallel`, one thread, or under [`SERIAL_WORK`]
    /// multiply-adds.
    Serial,
    /// This many bands of output rows run by [`run`], one per thread, each of at least
    /// [`BAND_ROWS`] rows and run serially.
    Bands(usize),
    /// One band (too few rows to cut), threaded inside.
    Inside,
}

/// Multiply-adds below which a GEMM runs on the calling thread.
pub(crate) const SERIAL_WORK: usize = 1 << 16;

/// Rows per band, at least.
pub(crate) const BAND_ROWS: usize = 16;

impl Threading {
    /// The threading of an `m x k x n` GEMM, threaded at all only where `parallel`.
    pub(crate) fn of(parallel: bool, (m, k, n): (usize, usize, usize)) -> Threading {
        let threads = rayon::current_num_threads();
        if !parallel || threads < 2 || m.saturating_mul(k).saturating_mul(n) < SERIAL_WORK {
            Threading::Serial
        } else if m >= 2 * BAND_ROWS {
            Threading::Bands(threads.min(m / BAND_ROWS))
        } else {
            Threading::Inside
        }
    }

    /// How many bands of rows to cut, and whether each band threads inside.
    pub(crate) fn bands(self) -> (usize, bool) {
        match self {
            Threading::Serial => (1, false),
            Threading::Bands(b) => (b, false),
            Threading::Inside => (1, true),
        }
    }
}

/// The tasks of [`run`] for `bands` bands of a GEMM's output (`out`, rows of `n` values):
/// each band's first row and its rows of `out`, bands of a whole multiple of `multiple`
/// rows but the last.
pub(crate) fn row_bands<V>(
    out: &mut [V],
    n: usize,
    bands: usize,
    multiple: usize,
) -> Vec<(usize, &mut [V])> {
    let rows = out.len() / n.max(1);
    let band_rows = rows.div_ceil(bands.max(1)).div_ceil(multiple) * multiple;
    out.chunks_mut((band_rows * n).max(1))
        .enumerate()
        .map(|(t, o)| (t * band_rows, o))
        .collect()
}

/// `work(&shared(), task)` for every task, on the calling thread and up to `helpers`
/// threads of rayon's pool (see the module docs); the results in the tasks' order. `shared`
/// runs once, on the calling thread. With `helpers == 0` or a single task, everything runs
/// on the calling thread. A panic in `shared` or in a task is raised again on the calling
/// thread once no thread is still working.
pub(crate) fn run<S, T, R>(
    helpers: usize,
    shared: impl FnOnce() -> S,
    tasks: Vec<T>,
    work: impl Fn(&S, T) -> R + Sync,
) -> Vec<R>
where
    S: Send + Sync,
    T: Send,
    R: Send,
{
    run_prepared(helpers, shared, tasks, |_| (), |s, t, ()| work(s, t))
}

/// [`run`] with each task in two parts (see the module docs): `work(&shared(), task,
/// own(&task))`, where `own(&task)` runs on the thread that claims the task, before the
/// shared input is needed.
pub(crate) fn run_prepared<S, T, U, R>(
    helpers: usize,
    shared: impl FnOnce() -> S,
    tasks: Vec<T>,
    own: impl Fn(&T) -> U + Sync,
    work: impl Fn(&S, T, U) -> R + Sync,
) -> Vec<R>
where
    S: Send + Sync,
    T: Send,
    R: Send,
{
    let len = tasks.len();
    if helpers == 0 || len <= 1 {
        let s = shared();
        return tasks
            .into_iter()
            .map(|t| {
                let u = own(&t);
                work(&s, t, u)
            })
            .collect();
    }
    let board = Board {
        shared: OnceLock::new(),
        abandoned: AtomicBool::new(false),
        tasks: tasks.into_iter().map(|t| Mutex::new(Some(t))).collect(),
        results: (0..len).map(|_| Mutex::new(None)).collect(),
        next: AtomicUsize::new(0),
        settled: AtomicUsize::new(0),
    };
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers.min(len - 1) {
            scope.spawn(|_| board.help(&own, &work));
        }
        // If `shared` panics, the helpers must not wait for it.
        let guard = Abandon(&board.abandoned);
        let _ = board.shared.set(shared());
        std::mem::forget(guard);
        board.help(&own, &work);
        // Every task is claimed: wait for the helpers still running one (a task's length
        // at most), yielding, rather than sleeping until one wakes the caller.
        while board.settled.load(Ordering::Acquire) < len {
            std::thread::yield_now();
        }
    });
    board
        .results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every task ran (a panic would have been raised)")
        })
        .collect()
}

/// What the threads of one [`run`] share.
struct Board<S, T, R> {
    /// The tasks' shared input, once the caller has computed it.
    shared: OnceLock<S>,
    /// Set where computing the shared input panicked: the helpers then stop.
    abandoned: AtomicBool,
    /// The tasks, each taken by the thread that claims it.
    tasks: Vec<Mutex<Option<T>>>,
    /// Each task's result.
    results: Vec<Mutex<Option<R>>>,
    /// The next task to claim.
    next: AtomicUsize,
    /// Tasks finished or abandoned by a panic.
    settled: AtomicUsize,
}

impl<S: Send + Sync, T: Send, R: Send> Board<S, T, R> {
    /// Claims tasks until none is left: runs each one's own part, waits for the shared
    /// input (once), then runs the rest.
    fn help<U>(&self, own: &(impl Fn(&T) -> U + Sync), work: &(impl Fn(&S, T, U) -> R + Sync)) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.tasks.len() {
                return;
            }
            // Counted as settled even if the task panics or the shared input never comes,
            // so that the caller stops waiting and the scope raises the panic.
            let _settle = Settle(&self.settled);
            let task = lock(&self.tasks[i])
                .take()
                .expect("each task is claimed once");
            let prepared = own(&task);
            let Some(shared) = self.wait_shared() else {
                return;
            };
            let r = work(shared, task, prepared);
            *lock(&self.results[i]) = Some(r);
        }
    }

    /// The shared input, once the caller has computed it; `None` if that panicked.
    fn wait_shared(&self) -> Option<&S> {
        let mut spins = 0u32;
        loop {
            if let Some(s) = self.shared.get() {
                return Some(s);
            }
            if self.abandoned.load(Ordering::Acquire) {
                return None;
            }
            // Yield now and then, in case this thread shares a CPU with the caller.
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// The value under `m`, whether or not another thread panicked holding it.
fn lock<V>(m: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts one task as settled when dropped (also while unwinding).
struct Settle<'a>(&'a AtomicUsize);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Marks the shared input as never coming when dropped (only while unwinding: it is
/// forgotten once the input is set).
struct Abandon<'a>(&'a AtomicBool);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes the GEMM tests run in bands (`tests/quire_checked.rs`,
    /// `tests/naive_p8_lanes.rs`, on pools of 2-4 threads) do run in bands.
    #[test]
    fn threading_of_the_banded_test_shapes_and_of_small_or_flat_gemms() {
        let of = |threads: usize, parallel: bool, dims| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| Threading::of(parallel, dims))
        };
        assert_eq!(of(2, true, (37, 61, 41)), Threading::Bands(2));
        assert_eq!(of(3, true, (37, 61, 41)), Threading::Bands(2));
        assert_eq!(of(3, true, (70, 40, 30)), Threading::Bands(3));
        assert_eq!(of(4, true, (33, 45, 50)), Threading::Bands(2));
        assert_eq!(of(4, false, (70, 40, 30)), Threading::Serial);
        assert_eq!(of(1, true, (70, 40, 30)), Threading::Serial);
        assert_eq!(of(4, true, (9, 70, 13)), Threading::Serial);
        assert_eq!(of(4, true, (16, 4096, 4096)), Threading::Inside);
    }

    #[test]
    fn row_bands_cover_every_row_once_in_whole_multiples() {
        for (rows, n, bands, multiple) in [(37, 3, 2, 2), (70, 1, 3, 1), (5, 4, 4, 2), (0, 3, 2, 1)]
        {
            let mut out = vec![0u8; rows * n];
            let tasks = row_bands(&mut out, n, bands, multiple);
            assert!(tasks.len() <= bands.max(1));
            let mut next = 0;
            for (i, (first, o)) in tasks.iter().enumerate() {
                assert_eq!(*first, next, "{rows} rows, band {i}");
                let len = o.len() / n;
                assert!(i + 1 == tasks.len() || len % multiple == 0);
                next += len;
            }
            assert_eq!(next, rows);
        }
    }

    #[test]
    fn every_task_runs_once_in_order_of_results() {
        for helpers in 0..4 {
            for len in 0..20 {
                let tasks: Vec<usize> = (0..len).collect();
                let runs = AtomicUsize::new(0);
                let out = run(
                    helpers,
                    || 10,
                    tasks,
                    |s, t| {
                        runs.fetch_add(1, Ordering::Relaxed);
                        s * t
                    },
                );
                assert_eq!(out, (0..len).map(|t| 10 * t).collect::<Vec<_>>());
                assert_eq!(runs.into_inner(), len);
            }
        }
    }

    /// Each task's own part runs once, on the thread that claimed it, and a helper may run
    /// it while the caller still computes the shared input.
    #[test]
    fn own_parts_run_once_and_before_the_shared_input_where_a_helper_is_awake() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let owns = AtomicUsize::new(0);
        let (out, early) = pool.install(|| {
            let mut early = false;
            let out = run_prepared(
                1,
                || {
                    // The caller waits (at most two seconds) for the helper's own part.
                    let start = std::time::Instant::now();
                    while owns.load(Ordering::Acquire) == 0 && start.elapsed().as_secs() < 2 {
                        std::thread::yield_now();
                    }
                    early = owns.load(Ordering::Acquire) > 0;
                    100
                },
                (0..6).collect(),
                |&t: &usize| {
                    owns.fetch_add(1, Ordering::AcqRel);
                    t * 2
                },
                |s, _, u| s + u,
            );
            (out, early)
        });
        assert_eq!(out, (0..6).map(|t| 100 + 2 * t).collect::<Vec<_>>());
        assert_eq!(owns.into_inner(), 6);
        assert!(early, "no own part ran while the shared input was computed");
        // Serial: the same results.
        let serial = run_prepared(
            0,
            || 100,
            (0..6).collect(),
            |&t: &usize| t * 2,
            |s, _, u| s + u,
        );
        assert_eq!(serial, out);
    }

    #[test]
    fn tasks_write_disjoint_pieces_of_a_buffer() {
        let mut buf = vec![0u32; 1000];
        let pieces: Vec<(usize, &mut [u32])> = buf.chunks_mut(64).enumerate().collect();
        run(
            2,
            || 7u32,
            pieces,
            |s, (i, piece)| piece.iter_mut().for_each(|x| *x = s + i as u32),
        );
        for (i, x) in buf.iter().enumerate() {
            assert_eq!(*x, 7 + (i / 64) as u32);
        }
    }

    #[test]
    fn a_panicking_task_is_raised_on_the_caller() {
        let r = std::panic::catch_unwind(|| {
            run(
                2,
                || (),
                (0..8).collect(),
                |_, t: i32| assert!(t != 5, "task 5"),
            )
        });
        assert!(r.is_err());
    }

    #[test]
    fn a_panicking_own_part_is_raised_on_the_caller() {
        let r = std::panic::catch_unwind(|| {
            run_prepared(
                2,
                || (),
                (0..8).collect(),
                |&t: &i32| assert!(t != 3, "task 3's own part"),
                |_, t: i32, ()| t,
            )
        });
        assert!(r.is_err());
    }

    #[test]
    fn a_panicking_shared_input_is_raised_and_stops_the_helpers() {
        let r = std::panic::catch_unwind(|| {
            run(
                2,
                || -> u8 { panic!("no input") },
                (0..8).collect(),
                |_, t: i32| t,
            )
        });
        assert!(r.is_err());
    }
}
