//! Reusable scratch buffers (f64 or f32) for the layers' large operand matrices, kept per
//! thread between calls: a training step builds matrices of the same sizes every time,
//! and a fresh zeroed allocation of megabytes (page faults, then a memset) costs as much as
//! filling it.
//!
//! A buffer's contents on [`take`] are unspecified: whatever a previous use left, NaN where
//! it grew. Callers write every element they read (a gap then shows as a NaN or as another
//! call's values, which the tests compare against fresh results).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

/// Buffers a thread keeps per element type, at most.
const KEEP: usize = 4;

/// Largest buffer kept (32 MiB): larger ones are freed when dropped.
const KEEP_BYTES: usize = 1 << 25;

/// A thread's kept buffers of one element type.
type Pool<T> = RefCell<Vec<Vec<T>>>;

thread_local! {
    static POOL_F64: Pool<f64> = const { RefCell::new(Vec::new()) };
    static POOL_F32: Pool<f32> = const { RefCell::new(Vec::new()) };
}

/// An element type scratch buffers hold.
pub trait Element: Copy + 'static {
    /// What a buffer holds where it grew.
    const FILL: Self;
    /// This thread's pool of buffers of the type.
    fn pool() -> &'static LocalKey<Pool<Self>>;
}

impl Element for f64 {
    const FILL: f64 = f64::NAN;
    fn pool() -> &'static LocalKey<Pool<f64>> {
        &POOL_F64
    }
}

impl Element for f32 {
    const FILL: f32 = f32::NAN;
    fn pool() -> &'static LocalKey<Pool<f32>> {
        &POOL_F32
    }
}

/// A scratch buffer of `len` elements (see the module docs), back to the thread's pool
/// when dropped.
pub struct Scratch<T: Element>(Vec<T>);

/// A buffer of `len` elements from this thread's pool (the smallest kept that holds `len`,
/// else the largest), or a new one.
pub fn take<T: Element>(len: usize) -> Scratch<T> {
    let mut v = T::pool()
        .with(|p| {
            let mut p = p.borrow_mut();
            // The smallest buffer that holds `len` elements, else the largest (to grow):
            // a call that takes buffers of several sizes gets each back the next time.
            let fits = (0..p.len())
                .filter(|&i| p[i].capacity() >= len)
                .min_by_key(|&i| p[i].capacity());
            let best = fits.or_else(|| (0..p.len()).max_by_key(|&i| p[i].capacity()))?;
            Some(p.swap_remove(best))
        })
        .unwrap_or_default();
    v.truncate(len);
    v.resize(len, T::FILL);
    Scratch(v)
}

impl<T: Element> Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Element> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: Element> Drop for Scratch<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        let bytes = v.capacity() * std::mem::size_of::<T>();
        if v.capacity() == 0 || bytes > KEEP_BYTES {
            return;
        }
        // `try_with`: a thread being torn down frees the buffer instead.
        let _ = T::pool().try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < KEEP {
                p.push(v);
            }
        });
    }
}
