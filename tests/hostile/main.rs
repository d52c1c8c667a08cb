//! Hostile input: every case where the tool could hand back a wrong number, lose work or
//! crash, driven as a user would drive it (mostly through the `qcandle` binary), plus seeded
//! mutation passes over every parser. Each case fails on the code before it was fixed.
//!
//! Modules by subject: [`files`] (`.npy` and `.safetensors`, `quantize`), [`data`] (IDX
//! files, data options, empty tensors), [`ptq`] (post-training quantization and model
//! files), [`runs`] (run identity, locks, resume and damaged runs, option checks), [`output`]
//! (closed and full stdout).

#[path = "../common/cli.rs"]
mod cli;
#[path = "../common/mod.rs"]
mod common;
mod data;
mod files;
mod output;
mod ptq;
mod runs;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::SplitMix;

/// The system allocator, recording the largest single request made by each thread, so the
/// mutation passes can check that no parser allocates beyond what its input justifies.
struct LargestRequest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note_request(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only
// touches a const-initialised thread-local cell, which never allocates.
unsafe impl GlobalAlloc for LargestRequest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_request(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_request(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_request(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: LargestRequest = LargestRequest;

/// Runs `f` and returns its result with the largest single allocation (bytes) the calling
/// thread requested meanwhile. Allocations on other threads are not seen.
pub fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = LARGEST.with(|l| l.replace(0));
    let result = f();
    let largest = LARGEST.with(|l| l.replace(before.max(l.get())));
    (result, largest)
}

/// The seeded generator of the mutation passes: the tests' common [`SplitMix`] with the
/// mutations on top.
pub struct Rng(SplitMix);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform integer below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `input` with a few random edits: bytes flipped, set to boundary values, inserted,
    /// deleted, runs duplicated, the tail cut, or ASCII digits replaced by large numbers.
    pub fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut v = input.to_vec();
        for _ in 0..1 + self.below(4) {
            let len = v.len().max(1);
            match self.below(8) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] = [0u8, 0xff, 0x7f, 0x80, b'9', b'-', b',', b')'][self.below(8)];
                }
                2 => {
                    let i = self.below(len);
                    v.insert(i.min(v.len()), self.next_u64() as u8);
                }
                3 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v.remove(i);
                }
                4 if !v.is_empty() => {
                    let i = self.below(v.len());
                    let n = (1 + self.below(16)).min(v.len() - i);
                    let run = v[i..i + n].to_vec();
                    v.splice(i..i, run);
                }
                5 if !v.is_empty() => {
                    let cut = self.below(v.len());
                    v.truncate(cut);
                }
                6 => {
                    if let Some(i) = v.iter().position(|b| b.is_ascii_digit()) {
                        let big = ["18446744073709551617", "4611686018427387905", "-1", "0"];
                        let s = big[self.below(big.len())].as_bytes();
                        v.splice(i..i + 1, s.iter().copied());
                    }
                }
                _ => {
                    let i = self.below(len);
                    let bytes = self.next_u64().to_le_bytes();
                    let end = (i + 8).min(v.len());
                    if i < end {
                        v[i..end].copy_from_slice(&bytes[..end - i]);
                    }
                }
            }
        }
        v
    }
}
