//! Reusable f64 scratch buffers for the layers' large operand matrices, kept per thread
//! between calls: a training step builds matrices of the same sizes every time, and a
//! fresh zeroed allocation of megabytes (page faults, then a memset) costs as much as
//! filling it.
//!
//! A buffer's contents on [`take`] are unspecified: whatever a previous use left, NaN where
//! it grew. Callers write every element they read (a gap then shows as a NaN or as another
//! call's values, which the tests compare against fresh results).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps, at most.
const KEEP: usize = 4;

/// Largest buffer kept (in f64): larger ones are freed when dropped (32 MiB).
const KEEP_LEN: usize = 1 << 22;

thread_local! {
    static POOL: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer of `len` f64 (see the module docs), back to the thread's pool when
/// dropped.
pub struct Scratch(Vec<f64>);

/// A buffer of `len` elements from this thread's pool (the largest kept), or a new one.
pub fn take(len: usize) -> Scratch {
    let mut v = POOL
        .with(|p| {
            let mut p = p.borrow_mut();
            let best = (0..p.len()).max_by_key(|&i| p[i].capacity())?;
            Some(p.swap_remove(best))
        })
        .unwrap_or_default();
    v.truncate(len);
    v.resize(len, f64::NAN);
    Scratch(v)
}

impl Deref for Scratch {
    type Target = [f64];
    fn deref(&self) -> &[f64] {
        &self.0
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f64] {
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() == 0 || v.capacity() > KEEP_LEN {
            return;
        }
        // `try_with`: a thread being torn down frees the buffer instead.
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < KEEP {
                p.push(v);
            }
        });
    }
}
