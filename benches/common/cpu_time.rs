//! The process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`, every thread), for the benches that
//! measure work rather than waiting: time spent waiting for a core on a shared machine does
//! not count (shared through `#[path]`).

#![allow(dead_code)] // each bench uses part of it

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

/// The process's CPU time so far (all threads), in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Criterion's measurement of the process's CPU time, in nanoseconds (criterion's time
/// formatting applies).
pub struct ProcessCpuTime;

/// The wall-clock measurement, lent for its formatting of nanoseconds.
static WALL: WallTime = WallTime;

impl Measurement for ProcessCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        process_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        process_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}
