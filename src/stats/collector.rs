//! Observing quantizers: a [`Tap`] on a [`crate::Quant`] (shared by its clones) holds the
//! [`Collector`] that its roundings report to, and the collector keeps what it is told while
//! it is switched on.
//!
//! With no collector attached, or the collector switched off, a rounding costs one atomic
//! read of the tap; nothing else changes. Switched on, each rounding hands the values before
//! and after it to [`Collector::record`], which computes a [`RoundingStats`] part (one pass)
//! and queues it. The roundings of one tensor may arrive as several parts from several threads
//! (the convolution rounds each image's output on its own thread); [`Collector::take`] merges
//! the queued parts sorted by their contents, so the result does not depend on the order the
//! threads finished in.
//!
//! Observing never changes a rounding: the collector reads the values, and the values before
//! an in-place rounding are copied first (only while switched on).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rayon::prelude::*;

use crate::backend::cpu::Element;
use crate::format::Format;

use super::rounding::{Limits, RoundingStats};

/// Elements per part of [`Collector::record`].
pub const CHUNK: usize = 1 << 16;

/// Where in a model a quantizer rounds: a layer name and a number category key (`weight`,
/// `activation`, `error`, `gradient`, `momentum`, `accumulator`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Site {
    /// The layer (`conv1`, `fc3`, or `input` for the model's input).
    pub layer: String,
    /// The number category's config key.
    pub category: String,
}

impl Site {
    /// The site of `category` in `layer`.
    pub fn new(layer: impl Into<String>, category: impl Into<String>) -> Self {
        Site {
            layer: layer.into(),
            category: category.into(),
        }
    }
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.layer, self.category)
    }
}

/// Receives the roundings of the quantizers it is attached to while switched on (see the
/// [module docs](self)).
#[derive(Debug, Default)]
pub struct Collector {
    on: AtomicBool,
    parts: Mutex<Vec<RoundingStats>>,
}

impl Collector {
    /// A collector, switched off.
    pub fn new() -> Self {
        Self::default()
    }

    /// Switches recording on or off.
    pub fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst)
    }

    /// Whether roundings are being recorded.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Records one rounding to `format` of the values `x` into `q` (a whole tensor or a part
    /// of one, element by element).
    ///
    /// Values are taken in fixed runs of [`CHUNK`] elements, counted in parallel, so the
    /// parts (and with [`Collector::take`]'s canonical order, the merged sums) do not depend
    /// on the number of threads.
    pub fn record<T: Element>(&self, format: &Format, x: &[T], q: &[T]) {
        let limits = Limits::of::<T>(format);
        let n = x.len().min(q.len());
        let parts: Vec<RoundingStats> = if n <= CHUNK {
            vec![RoundingStats::of(x, q, limits)]
        } else {
            x[..n]
                .par_chunks(CHUNK)
                .zip(q[..n].par_chunks(CHUNK))
                .map(|(x, q)| RoundingStats::of(x, q, limits))
                .collect()
        };
        self.parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(parts);
    }

    /// Everything recorded since the last call, merged (in the canonical order of the parts);
    /// `None` when nothing was recorded.
    pub fn take(&self) -> Option<RoundingStats> {
        let mut parts = std::mem::take(&mut *self.parts.lock().unwrap_or_else(|p| p.into_inner()));
        parts.sort_by_key(RoundingStats::canonical_key);
        let mut parts = parts.into_iter();
        let mut total = parts.next()?;
        for p in parts {
            total.merge(&p);
        }
        Some(total)
    }
}

/// The slot on a quantizer (shared by its clones) where a [`Collector`] is attached.
#[derive(Debug, Clone, Default)]
pub struct Tap(Arc<RwLock<Option<Arc<Collector>>>>);

impl Tap {
    /// Attaches `collector` (replacing any other), or detaches with `None`.
    pub fn attach(&self, collector: Option<Arc<Collector>>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = collector;
    }

    /// The attached collector if it is switched on.
    pub fn active(&self) -> Option<Arc<Collector>> {
        let slot = self.0.read().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().filter(|c| c.is_on()).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_merge_to_the_same_bits_in_any_arrival_order() {
        let format: Format = "bf16".parse().unwrap();
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.731).sin() * 1e3).collect();
        let q: Vec<f32> = x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        let chunks: Vec<(usize, usize)> = (0..10).map(|i| (i * 100, i * 100 + 100)).collect();
        let forward = Collector::new();
        for &(a, b) in &chunks {
            forward.record(&format, &x[a..b], &q[a..b]);
        }
        let backward = Collector::new();
        for &(a, b) in chunks.iter().rev() {
            backward.record(&format, &x[a..b], &q[a..b]);
        }
        let (f, b) = (forward.take().unwrap(), backward.take().unwrap());
        assert_eq!(f.canonical_key(), b.canonical_key());
        assert_eq!(f.histogram, b.histogram);
        assert_eq!(f.count, 1000);
        assert!(forward.take().is_none(), "take empties the collector");
    }

    #[test]
    fn a_tap_reports_its_collector_only_while_it_is_on() {
        let tap = Tap::default();
        assert!(tap.active().is_none());
        let c = Arc::new(Collector::new());
        tap.clone().attach(Some(c.clone()));
        assert!(tap.active().is_none());
        c.set_on(true);
        assert!(Arc::ptr_eq(&tap.active().unwrap(), &c));
        tap.attach(None);
        assert!(tap.active().is_none());
    }
}
