//! Row loops over a row-major `m x n` output, on the rayon pool or on the calling thread:
//! the one way the CPU GEMMs (posit, float and LNS) hand out their output rows.

use rayon::prelude::*;

/// Runs `row(i, out_row)` for each of the first `m` rows of `out` (`n` elements each), on the
/// rayon pool when `parallel`. Nothing runs when `n == 0`.
pub(crate) fn for_rows<T, F>(out: &mut [T], m: usize, n: usize, parallel: bool, row: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    if n == 0 {
        return;
    }
    let out = &mut out[..m * n];
    if parallel {
        out.par_chunks_mut(n)
            .enumerate()
            .for_each(|(i, r)| row(i, r));
    } else {
        out.chunks_mut(n).enumerate().for_each(|(i, r)| row(i, r));
    }
}
