//! The `gemm` crate's f32 GEMM on strided matrix views ([`sgemm`]), and the split of a batch's
//! images over the rayon pool ([`per_image`]) that the forward and backward passes share.

use gemm::Parallelism;
use rayon::prelude::*;

/// A row-major view of a matrix: element `(i, j)` at `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    pub(super) data: &'a [f32],
    pub(super) rs: usize,
    pub(super) cs: usize,
}

impl Mat<'_> {
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `dst (m x n, row-major, contiguous) = [dst +] lhs (m x k) * rhs (k x n)`.
pub(super) fn sgemm(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
    par: Parallelism,
) {
    assert!(dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    // SAFETY: the assert above keeps every index the kernel touches inside the slices, and
    // `dst` is borrowed mutably so it does not alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// None to spread `n` images over the threads (each GEMM sequential); `Some(threads)` when
/// there are fewer images than threads, to run them one after the other with parallel GEMMs.
fn gemm_threads(n: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (n < threads).then_some(threads)
}

/// Runs `f(i, scratch, out_i, parallelism)` for every image `i` of `n`, `out_i` being the
/// `i`-th of `n` equal parts of `out` and `scratch` a buffer of `scratch` elements. Images
/// are split into one contiguous run per thread, each with its own buffer.
pub(super) fn per_image<F>(out: &mut [f32], n: usize, scratch: usize, f: F)
where
    F: Fn(usize, &mut [f32], &mut [f32], Parallelism) + Sync,
{
    let len = out.len() / n.max(1);
    if len == 0 {
        return;
    }
    match gemm_threads(n) {
        None => {
            let per = n.div_ceil(rayon::current_num_threads());
            out.par_chunks_mut(per * len)
                .enumerate()
                .for_each(|(run, chunk)| {
                    let mut buf = vec![0f32; scratch];
                    for (j, o) in chunk.chunks_mut(len).enumerate() {
                        f(run * per + j, &mut buf, o, Parallelism::None);
                    }
                })
        }
        Some(t) => {
            let mut buf = vec![0f32; scratch];
            for (i, o) in out.chunks_mut(len).enumerate() {
                f(i, &mut buf, o, Parallelism::Rayon(t));
            }
        }
    }
}
