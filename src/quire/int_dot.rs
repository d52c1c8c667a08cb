//! Exact GEMM on small integers: the quire of posits whose values are i16 multiples of minpos.
//!
//! For posit(n, es) with `maxpos = 2^s`, every value is `c · 2^-s` with an integer
//! `|c| <= 2^2s`. When `2s <= 12` (posit<8,0>: values are multiples of 2^-6 up to 64, so
//! `|c| <= 4096`), `c` fits an i16 and a product fits 2^24. Sums of 64 products then fit an
//! i32 (`64 · 2^24 = 2^30`), and an i64 gathers those partial sums: the dot product is exact
//! for any length below 2^39, in units of `minpos^2`.
//!
//! The inner loop is the `i16 x i16 -> i32` multiply-add of x86's `vpmaddwd`: sixteen
//! products per instruction, pairs added into eight i32 lanes, on CPUs with AVX2, 32 into
//! sixteen with AVX-512BW (chosen at run time); elsewhere a portable loop. The kernel computes a 2 x 4 tile (two rows of `A`
//! against four rows of `B^T`: six loads serve eight multiply-adds), a 1 x 4 tile for an odd
//! last row. [`gemm()`] walks the output in panels of `B^T` rows small enough to stay in the
//! cache while every row pair of `A` passes over them.
//!
//! Every tile is the same set of exact integer sums whichever kernel computes it, so the
//! result does not depend on the tiling, the CPU or the thread count.

/// Products summed in i32 before the i64 gathers them (`64 · 2^24 <= 2^30`).
const CHUNK: usize = 64;

/// Whether posits with `maxpos = 2^max_scale` take this path.
pub fn applies(max_scale: i32) -> bool {
    2 * max_scale <= 12
}

#[inline(always)]
fn dot4_body(a: &[i16], b: [&[i16]; 4]) -> [i64; 4] {
    let mut total = [0i64; 4];
    let k = a.len();
    let mut start = 0;
    while start < k {
        let end = (start + CHUNK).min(k);
        let x = &a[start..end];
        let mut s = [0i32; 4];
        for (sj, bj) in s.iter_mut().zip(b) {
            let y = &bj[start..end];
            *sj = x
                .iter()
                .zip(y)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum::<i32>();
        }
        for (t, v) in total.iter_mut().zip(s) {
            *t += v as i64;
        }
        start = end;
    }
    total
}

/// Elements per i32 partial sum on the AVX2 path: each lane adds 32 `vpmaddwd` results of
/// two products each, at most `32 · 2 · 2^24 = 2^30`.
#[cfg(target_arch = "x86_64")]
const AVX2_CHUNK: usize = 512;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot4_avx2(a: &[i16], b: [&[i16]; 4]) -> [i64; 4] {
    use std::arch::x86_64::*;
    let k = a.len();
    let full = k / 16 * 16;
    let mut total = [0i64; 4];
    let mut t = 0;
    while t < full {
        let end = (t + AVX2_CHUNK).min(full);
        let mut acc = [_mm256_setzero_si256(); 4];
        while t < end {
            // SAFETY: t + 16 <= full <= k, the length of `a` and of every `b[r]`.
            let x = _mm256_loadu_si256(a.as_ptr().add(t) as *const __m256i);
            for (r, lane) in acc.iter_mut().enumerate() {
                let y = _mm256_loadu_si256(b[r].as_ptr().add(t) as *const __m256i);
                *lane = _mm256_add_epi32(*lane, _mm256_madd_epi16(x, y));
            }
            t += 16;
        }
        for (tot, lane) in total.iter_mut().zip(acc) {
            let mut parts = [0i32; 8];
            _mm256_storeu_si256(parts.as_mut_ptr() as *mut __m256i, lane);
            *tot += parts.iter().map(|&v| v as i64).sum::<i64>();
        }
    }
    let tail = dot4_body(&a[full..], b.map(|r| &r[full..]));
    for (tot, v) in total.iter_mut().zip(tail) {
        *tot += v;
    }
    total
}

/// Eight exact dot products: `a[0]` and `a[1]` with each of `b[0..4]` (all of one length).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot2x4_avx2(a: [&[i16]; 2], b: [&[i16]; 4]) -> [[i64; 4]; 2] {
    use std::arch::x86_64::*;
    let k = a[0].len();
    let full = k / 16 * 16;
    let mut total = [[0i64; 4]; 2];
    let mut t = 0;
    while t < full {
        let end = (t + AVX2_CHUNK).min(full);
        let mut acc0 = [_mm256_setzero_si256(); 4];
        let mut acc1 = [_mm256_setzero_si256(); 4];
        while t < end {
            // SAFETY: t + 16 <= full <= k, the length of every row of `a` and `b`.
            let x0 = _mm256_loadu_si256(a[0].as_ptr().add(t) as *const __m256i);
            let x1 = _mm256_loadu_si256(a[1].as_ptr().add(t) as *const __m256i);
            for r in 0..4 {
                let y = _mm256_loadu_si256(b[r].as_ptr().add(t) as *const __m256i);
                acc0[r] = _mm256_add_epi32(acc0[r], _mm256_madd_epi16(x0, y));
                acc1[r] = _mm256_add_epi32(acc1[r], _mm256_madd_epi16(x1, y));
            }
            t += 16;
        }
        for (tot, acc) in total.iter_mut().zip([acc0, acc1]) {
            for (v, lane) in tot.iter_mut().zip(acc) {
                let mut parts = [0i32; 8];
                _mm256_storeu_si256(parts.as_mut_ptr() as *mut __m256i, lane);
                *v += parts.iter().map(|&p| p as i64).sum::<i64>();
            }
        }
    }
    for (tot, row) in total.iter_mut().zip(a) {
        let tail = dot4_body(&row[full..], b.map(|r| &r[full..]));
        for (v, x) in tot.iter_mut().zip(tail) {
            *v += x;
        }
    }
    total
}

/// Elements per i32 partial sum on the AVX-512 path: each lane adds 32 `vpmaddwd` results
/// of two products each, at most `32 · 2 · 2^24 = 2^30`.
#[cfg(target_arch = "x86_64")]
const AVX512_CHUNK: usize = 1024;

/// [`dot2x4_avx2`] with 512-bit registers; the last `k mod 32` elements by masked loads
/// (the lanes masked off load zeros and add nothing).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dot2x4_avx512(a: [&[i16]; 2], b: [&[i16]; 4]) -> [[i64; 4]; 2] {
    use std::arch::x86_64::*;
    let k = a[0].len();
    let mut total = [[0i64; 4]; 2];
    let mut t = 0;
    while t < k {
        let end = (t + AVX512_CHUNK).min(k);
        let mut acc0 = [_mm512_setzero_si512(); 4];
        let mut acc1 = [_mm512_setzero_si512(); 4];
        while t < end {
            let left = end - t;
            let mask: __mmask32 = if left >= 32 { !0 } else { (1u32 << left) - 1 };
            // SAFETY: the mask enables only elements t..t + min(32, left), inside every
            // row (`end <= k`, each row's length); masked-off elements are not read.
            let load = |p: &[i16]| _mm512_maskz_loadu_epi16(mask, p.as_ptr().add(t));
            let (x0, x1) = (load(a[0]), load(a[1]));
            for r in 0..4 {
                let y = load(b[r]);
                acc0[r] = _mm512_add_epi32(acc0[r], _mm512_madd_epi16(x0, y));
                acc1[r] = _mm512_add_epi32(acc1[r], _mm512_madd_epi16(x1, y));
            }
            t += 32.min(left);
        }
        for (tot, acc) in total.iter_mut().zip([acc0, acc1]) {
            for (v, lane) in tot.iter_mut().zip(acc) {
                let mut parts = [0i32; 16];
                _mm512_storeu_si512(parts.as_mut_ptr() as *mut __m512i, lane);
                *v += parts.iter().map(|&p| p as i64).sum::<i64>();
            }
        }
    }
    total
}

/// Eight exact dot products of `a[0..2]` with `b[0..4]` (all of the same length).
#[inline]
fn dot2x4(a: [&[i16]; 2], b: [&[i16]; 4]) -> [[i64; 4]; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            // SAFETY: the CPU supports AVX-512F and BW, checked just above.
            return unsafe { dot2x4_avx512(a, b) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { dot2x4_avx2(a, b) };
        }
    }
    [dot4_body(a[0], b), dot4_body(a[1], b)]
}

/// Four exact dot products of `a` with `b[0..4]` (all of the same length).
#[inline]
pub fn dot4(a: &[i16], b: [&[i16]; 4]) -> [i64; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { dot4_avx2(a, b) };
        }
    }
    dot4_body(a, b)
}

/// One output row: `out[j] = Σ_t a[t] · bt[j][t]` exactly, for `bt` holding `n` rows of
/// `a.len()` values.
pub fn row(a: &[i16], bt: &[i16], out: &mut [i64]) {
    let k = a.len();
    let n = out.len();
    let b = |j: usize| &bt[j * k..j * k + k];
    let mut j = 0;
    while j + 4 <= n {
        out[j..j + 4].copy_from_slice(&dot4(a, [b(j), b(j + 1), b(j + 2), b(j + 3)]));
        j += 4;
    }
    // The last one to three outputs: pad the tile with the first column.
    if j < n {
        let r = dot4(
            a,
            [b(j), b((j + 1).min(n - 1)), b((j + 2).min(n - 1)), b(n - 1)],
        );
        out[j..].copy_from_slice(&r[..n - j]);
    }
}

/// Bytes of `B^T` rows kept in the cache while the rows of `A` pass over them.
const PANEL_BYTES: usize = 128 << 10;

/// Rows of `A` (and of the output) per parallel task.
const ROW_BLOCK: usize = 16;

/// `out (m x n) = A (m x k) · B` exactly, with `a` row-major and `bt = Bᵀ` (`n x k`,
/// row-major): `out[i·n + j] = Σ_t a[i·k + t] · bt[j·k + t]`. `parallel` spreads blocks of
/// rows over the rayon pool.
pub fn gemm(
    a: &[i16],
    bt: &[i16],
    (m, k, n): (usize, usize, usize),
    out: &mut [i64],
    parallel: bool,
) {
    use rayon::prelude::*;
    assert!(a.len() >= m * k && bt.len() >= n * k && out.len() >= m * n);
    if n == 0 || m == 0 {
        return;
    }
    let panel = (PANEL_BYTES / (2 * k.max(1))).max(4) / 4 * 4;
    let block = |(blk, dst): (usize, &mut [i64])| {
        let i0 = blk * ROW_BLOCK;
        let rows = dst.len() / n;
        let b = |j: usize| &bt[j * k..j * k + k];
        let mut j0 = 0;
        while j0 < n {
            let j1 = (j0 + panel).min(n);
            let mut r = 0;
            while r < rows {
                let pair = r + 1 < rows;
                let a0 = &a[(i0 + r) * k..(i0 + r) * k + k];
                let a1 = if pair {
                    &a[(i0 + r + 1) * k..(i0 + r + 2) * k]
                } else {
                    a0
                };
                let mut j = j0;
                while j < j1 {
                    // The last one to three columns: pad the tile with the last column.
                    let cols = (j1 - j).min(4);
                    let q = [
                        b(j),
                        b((j + 1).min(j1 - 1)),
                        b((j + 2).min(j1 - 1)),
                        b((j + 3).min(j1 - 1)),
                    ];
                    if pair {
                        let s = dot2x4([a0, a1], q);
                        dst[r * n + j..r * n + j + cols].copy_from_slice(&s[0][..cols]);
                        dst[(r + 1) * n + j..(r + 1) * n + j + cols].copy_from_slice(&s[1][..cols]);
                    } else {
                        let s = dot4(a0, q);
                        dst[r * n + j..r * n + j + cols].copy_from_slice(&s[..cols]);
                    }
                    j += 4;
                }
                r += 2;
            }
            j0 = j1;
        }
    };
    let out = &mut out[..m * n];
    if parallel {
        out.par_chunks_mut(ROW_BLOCK * n)
            .enumerate()
            .for_each(block);
    } else {
        out.chunks_mut(ROW_BLOCK * n).enumerate().for_each(block);
    }
}
