//! The exact integer GEMM of [`super::int_dot`] with no reduction across lanes: `Bᵀ` packed
//! by pairs of `k`, so that each 32-bit lane of an accumulator is one output.
//!
//! `vpdpwssd` (or `vpmaddwd` then `vpaddd`) adds to each i32 lane the two products of a
//! pair of i16 in each operand. [`super::int_dot`]'s tiles pair `A`'s and `Bᵀ`'s rows
//! element by element, so a lane holds part of one dot product, and every tile ends by
//! adding its accumulators' lanes together. Here, lane `l` of a vector of the packed `B`
//! holds column `j0 + l`'s pair `(B[2t][j], B[2t+1][j])`, and the other operand is row
//! `i`'s pair `(A[i][2t], A[i][2t+1])` broadcast to every lane: each lane adds the two
//! products of output `(i, j0 + l)` for elements `2t` and `2t + 1`, and the accumulator
//! ends holding sixteen whole outputs. Nothing is reduced.
//!
//! **Exactness.** The kernel runs only where [`super::int_dot::fits_i32`] holds
//! (`k · max|a| · max|b| < 2^31`): then no partial sum of a lane can leave the i32 range, in
//! whatever order the pairs are added, and the k-blocks' partial sums added in i32 are the
//! exact totals. The totals are widened to i64 for their terms, clamped, converted and
//! scaled as [`super::int_dot::gemm_clamped`] states, so the two give the same f32 bits.
//!
//! **Blocking.** A tile is 8 rows of `A` against 16, 32 or 48 columns of `B` (24
//! accumulators, three vectors of `B`, one broadcast): per pair of `k`, 24 instructions
//! against 3 loads and 8 broadcast loads. The output runs in blocks of 64 rows
//! (their partial sums in an i32 buffer that stays in L2), each in k-blocks of 128
//! pairs (a 48-column panel of packed `B` then fills 24 KiB and stays in L1 while the
//! block's rows pass), each in panels of 48 columns. On an AVX-512 Xeon, one thread, a
//! throwaway micro-benchmark ran 1024³ in 7.5 ms against the 4 x 4 tiles' 12.2 ms, and
//! 128x416x120 in 46 µs against about 90 µs.

use super::int_dot;
use crate::backend::isa::{self, Isa};

/// Rows of the output per block (the block's i32 partial sums stay in L2).
const ROW_BLOCK: usize = 64;

/// Pairs of `k` per k-block: a 48-column panel of packed `B` is 24 KiB.
const K_PAIRS: usize = 128;

/// Rows of `A` per tile.
const TILE_ROWS: usize = 8;

/// Lanes per vector.
const LANES: usize = 16;

/// One 64-byte line of sixteen i32 lanes (the packed matrix starts on a line).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([i32; LANES]);

/// `B` packed by pairs of `k` for [`gemm_clamped`]: row `t` holds, for each column `j`
/// (`np`, a multiple of 16, columns; zeros past `n`), the pair `(B[2t][j], B[2t+1][j])`
/// as one i32 (the first in the low half), and the largest magnitude of `B`.
pub struct PairPacked {
    lines: Vec<Line>,
    n: usize,
    np: usize,
    pairs: usize,
    max: u16,
}

impl PairPacked {
    /// `Bᵀ` (`n` rows of `kp` i16, `kp` even; the rows' padding zeros) packed. Where the
    /// CPU (or the cap) has no AVX-512 BW, `None`: the kernel does not run.
    pub fn new(bt: &[i16], n: usize, kp: usize) -> Option<PairPacked> {
        kernel()?;
        assert!(kp.is_multiple_of(2) && bt.len() >= n * kp);
        let pairs = kp / 2;
        let np = n.div_ceil(LANES) * LANES;
        let count = pairs * np / LANES;
        let mut lines = Vec::with_capacity(count);
        // SAFETY: `kernel` returned a tile, so the CPU has AVX-512 F (and BW), and this is
        // x86-64 (elsewhere `kernel` is `None`); `pack_avx512` writes every one of the
        // `count` lines, so they are initialised before the length covers them.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            pack_avx512(
                &bt[..n * kp],
                n,
                pairs,
                &mut lines.spare_capacity_mut()[..count],
            );
            lines.set_len(count);
        }
        let max = int_dot::max_magnitude(&bt[..n * kp]);
        Some(PairPacked {
            lines,
            n,
            np,
            pairs,
            max,
        })
    }

    /// Columns of `B`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The largest magnitude of `B`.
    pub fn max_magnitude(&self) -> u16 {
        self.max
    }
}

/// `lines` (row `t` of `np / 16` lines per pair of `k`) from `bt` (`n` rows of `2 pairs`
/// i16): the pair `t` of row `j` of `Bᵀ` is the `t`-th i32 of that row read as i32 (the
/// first i16 in the low half), so the packing is the transpose of an `n x pairs` i32
/// matrix into `pairs x np`, sixteen rows by sixteen pairs at a time, with zeros past `n`.
/// Every line is written (`pairs · np / 16` of them), so `lines` may start uninitialised.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn pack_avx512(bt: &[i16], n: usize, pairs: usize, lines: &mut [std::mem::MaybeUninit<Line>]) {
    use std::arch::x86_64::*;
    let per_row = lines.len() / pairs.max(1);
    let rows32 = bt.as_ptr().cast::<i32>();
    for jb in 0..n.div_ceil(LANES) {
        let live = (n - jb * LANES).min(LANES);
        for t0 in (0..pairs).step_by(LANES) {
            let width = (pairs - t0).min(LANES);
            let mask: __mmask16 = if width == LANES { !0 } else { (1 << width) - 1 };
            let mut r = [_mm512_setzero_si512(); LANES];
            for (i, v) in r.iter_mut().enumerate().take(live) {
                // SAFETY: row `jb·16 + i < n` holds `pairs` i32, of which the lanes of `mask`
                // (`t0 .. t0 + width`) are read.
                *v = unsafe {
                    _mm512_maskz_loadu_epi32(mask, rows32.add((jb * LANES + i) * pairs + t0))
                };
            }
            for (c, column) in transpose(r).iter().enumerate().take(width) {
                let line = &mut lines[(t0 + c) * per_row + jb];
                // SAFETY: a line holds sixteen i32.
                unsafe { _mm512_storeu_si512(line.as_mut_ptr().cast(), *column) };
            }
        }
    }
}

/// The transpose of sixteen vectors of sixteen i32 (`out[c]` lane `i` = `r[i]` lane `c`):
/// 32-bit, then 64-bit interleaves within 128-bit lanes, then two 128-bit shuffles that
/// bring each lane's four rows together.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose(r: [std::arch::x86_64::__m512i; LANES]) -> [std::arch::x86_64::__m512i; LANES] {
    use std::arch::x86_64::*;
    let mut out = [_mm512_setzero_si512(); LANES];
    // Rows `4g .. 4g + 4`: `u[c]` holds, in 128-bit lane `L`, their values of column `4L + c`.
    let mut quads = [[_mm512_setzero_si512(); 4]; 4];
    for (g, u) in quads.iter_mut().enumerate() {
        let [a, b, c, d] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
        let (ab_lo, ab_hi) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (cd_lo, cd_hi) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
        *u = [
            _mm512_unpacklo_epi64(ab_lo, cd_lo),
            _mm512_unpackhi_epi64(ab_lo, cd_lo),
            _mm512_unpacklo_epi64(ab_hi, cd_hi),
            _mm512_unpackhi_epi64(ab_hi, cd_hi),
        ];
    }
    // Column `4L + c` takes lane `L` of `quads[g][c]` into its lane `g`.
    for c in 0..4 {
        let [a, b, cc, d] = [quads[0][c], quads[1][c], quads[2][c], quads[3][c]];
        let p = _mm512_shuffle_i32x4::<0x44>(a, b);
        let q = _mm512_shuffle_i32x4::<0xee>(a, b);
        let r2 = _mm512_shuffle_i32x4::<0x44>(cc, d);
        let s = _mm512_shuffle_i32x4::<0xee>(cc, d);
        out[c] = _mm512_shuffle_i32x4::<0x88>(p, r2);
        out[4 + c] = _mm512_shuffle_i32x4::<0xdd>(p, r2);
        out[8 + c] = _mm512_shuffle_i32x4::<0x88>(q, s);
        out[12 + c] = _mm512_shuffle_i32x4::<0xdd>(q, s);
    }
    out
}

/// The compiled tile (VNNI, or AVX-512 BW) the CPU runs, if any.
fn kernel() -> Option<Tile> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if isa::active() == Isa::Avx512 && has!("avx512f") && has!("avx512bw") {
            return Some(if has!("avx512vnni") {
                Tile::Vnni
            } else {
                Tile::Bw
            });
        }
    }
    None
}

/// The two compiled tiles.
#[derive(Clone, Copy)]
enum Tile {
    Vnni,
    Bw,
}

/// [`super::int_dot::gemm_clamped`] on `a` (`m x k` row-major, `k` even) against the
/// packed `b`: `out[i·n + j] = clamp(Σ_t a[i][t] · B[t][j] + row_term[i] + col_term[j],
/// ±cap) · unit`. Returns `false`, writing nothing, where the kernel does not run: no
/// AVX-512 BW, or sums that might leave the i32 range ([`super::int_dot::fits_i32`]'s
/// bound). `parallel` spreads blocks of rows over rayon.
#[allow(clippy::too_many_arguments)]
pub fn gemm_clamped(
    a: &[i16],
    b: &PairPacked,
    (m, k): (usize, usize),
    (row_term, col_term): (&[i64], &[i64]),
    (cap, unit): (i64, f32),
    out: &mut [f32],
    parallel: bool,
) -> bool {
    let n = b.n;
    assert!(k == 2 * b.pairs && a.len() >= m * k && out.len() >= m * n);
    assert!((0..1 << 24).contains(&cap) && row_term.len() >= m && col_term.len() >= n);
    let Some(tile) = kernel() else {
        return false;
    };
    if !int_dot::sums_fit_i32(k, int_dot::max_magnitude(&a[..m * k]), b.max) {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    let mut cols = vec![0i64; b.np];
    cols[..n].copy_from_slice(&col_term[..n]);
    let block = |(blk, dst): (usize, &mut [f32])| {
        let i0 = blk * ROW_BLOCK;
        let rows = dst.len() / n;
        let mut sums = vec![0i32; rows * b.np];
        // SAFETY: `kernel` found the instructions the tile is compiled for; the rows lie
        // in `a` (`i0 + rows <= m`), `sums` holds `rows x np`.
        unsafe { block_sums(tile, &a[i0 * k..(i0 + rows) * k], b, rows, &mut sums) };
        #[cfg(target_arch = "x86_64")]
        for (r, (o, s)) in dst.chunks_mut(n).zip(sums.chunks(b.np)).enumerate() {
            // SAFETY: AVX-512 F (the kernel's); `s` and `cols` hold `np`, `o` holds `n`.
            unsafe { finish_row(s, &cols, row_term[i0 + r], (cap, unit), o) };
        }
    };
    let out = &mut out[..m * n];
    if parallel {
        use rayon::prelude::*;
        out.par_chunks_mut(ROW_BLOCK * n)
            .enumerate()
            .for_each(block);
    } else {
        out.chunks_mut(ROW_BLOCK * n).enumerate().for_each(block);
    }
    true
}

/// The exact sums of `rows` rows of `a` (`k = 2 · pairs` each) against every column of the
/// packed `b`, into `sums` (`rows x np`), by k-blocks and 48-column panels.
///
/// # Safety
/// The CPU runs `tile`'s instructions.
unsafe fn block_sums(tile: Tile, a: &[i16], b: &PairPacked, rows: usize, sums: &mut [i32]) {
    let (np, pairs) = (b.np, b.pairs);
    let a32 = a.as_ptr().cast::<i32>();
    let bp = b.lines.as_ptr().cast::<i32>();
    let mut t0 = 0;
    while t0 < pairs {
        let t1 = (t0 + K_PAIRS).min(pairs);
        let mut j0 = 0;
        while j0 < np {
            let width = (np - j0).min(3 * LANES);
            let mut r = 0;
            while r < rows {
                // The tile's rows past the block repeat its last row (their sums dropped).
                // SAFETY: every row index is below `rows`, each row `k` i16 = `pairs` i32.
                let a_rows: [*const i32; TILE_ROWS] =
                    std::array::from_fn(|rr| unsafe { a32.add((r + rr).min(rows - 1) * pairs) });
                let live = (rows - r).min(TILE_ROWS);
                let at = TileAt {
                    a: a_rows,
                    b: unsafe { bp.add(j0) },
                    np,
                    pairs: (t0, t1),
                    out: unsafe { sums.as_mut_ptr().add(r * np + j0) },
                    live,
                    first: t0 == 0,
                };
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    match (tile, width / LANES) {
                        (Tile::Vnni, 3) => tile_vnni::<3>(&at),
                        (Tile::Vnni, 2) => tile_vnni::<2>(&at),
                        (Tile::Vnni, _) => tile_vnni::<1>(&at),
                        (Tile::Bw, 3) => tile_bw::<3>(&at),
                        (Tile::Bw, 2) => tile_bw::<2>(&at),
                        (Tile::Bw, _) => tile_bw::<1>(&at),
                    }
                }
                r += TILE_ROWS;
            }
            j0 += width;
        }
        t0 = t1;
    }
}

/// One tile's operands: the rows of `A` (as pairs), the packed `B` at the tile's first
/// column, its row length, the k-block's pairs, and the tile's partial sums (row stride
/// `np`; the first k-block stores them, the others add).
struct TileAt {
    a: [*const i32; TILE_ROWS],
    b: *const i32,
    np: usize,
    pairs: (usize, usize),
    out: *mut i32,
    live: usize,
    first: bool,
}

/// An 8 x `16·C` tile; `$madd(acc, b, a)` adds the pairwise products to the lanes of `acc`.
macro_rules! pair_tile {
    ($(#[$doc:meta])* $name:ident, $features:literal, $madd:expr) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const C: usize>(at: &TileAt) {
            use std::arch::x86_64::*;
            let mut acc = [[_mm512_setzero_si512(); C]; TILE_ROWS];
            for t in at.pairs.0..at.pairs.1 {
                // SAFETY: row `t` of the packed `B` holds `np >= j0 + 16·C` lanes from the
                // tile's column, on whole lines; `a` rows hold `pairs > t` pairs.
                let bp = unsafe { at.b.add(t * at.np) };
                let y: [__m512i; C] =
                    std::array::from_fn(|c| unsafe { _mm512_load_si512(bp.add(LANES * c).cast()) });
                for r in 0..TILE_ROWS {
                    let x = _mm512_set1_epi32(unsafe { at.a[r].add(t).read_unaligned() });
                    for c in 0..C {
                        acc[r][c] = $madd(acc[r][c], y[c], x);
                    }
                }
            }
            for r in 0..at.live {
                for c in 0..C {
                    // SAFETY: the tile's partial sums lie in the block's buffer.
                    let o = unsafe { at.out.add(r * at.np + LANES * c) };
                    let v = if at.first {
                        acc[r][c]
                    } else {
                        _mm512_add_epi32(acc[r][c], unsafe { _mm512_loadu_si512(o.cast()) })
                    };
                    unsafe { _mm512_storeu_si512(o.cast(), v) };
                }
            }
        }
    };
}

pair_tile!(
    /// The tile by `vpdpwssd` (AVX512-VNNI).
    tile_vnni,
    "avx512f,avx512bw,avx512vnni",
    |acc, y, x| _mm512_dpwssd_epi32(acc, y, x)
);

pair_tile!(
    /// The tile by `vpmaddwd` and `vpaddd` (AVX-512BW).
    tile_bw,
    "avx512f,avx512bw",
    |acc, y, x| _mm512_add_epi32(acc, _mm512_madd_epi16(y, x))
);

/// One output row: `clamp(sums[j] + row + cols[j], ±cap) · unit` into `out` (`n` values),
/// sixteen at a time in i64.
///
/// # Safety
/// The CPU has AVX-512 F; `sums` and `cols` hold `out.len()` rounded up to 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn finish_row(
    sums: &[i32],
    cols: &[i64],
    row: i64,
    (cap, unit): (i64, f32),
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = out.len();
    let whole = n.div_ceil(LANES) * LANES;
    assert!(sums.len() >= whole && cols.len() >= whole);
    let (hi, lo) = (_mm512_set1_epi64(cap), _mm512_set1_epi64(-cap));
    let (row, unit) = (_mm512_set1_epi64(row), _mm512_set1_ps(unit));
    let mut j = 0;
    while j < n {
        // SAFETY: `sums` and `cols` hold whole vectors past `n`.
        let s = unsafe { _mm512_loadu_si512(sums.as_ptr().add(j).cast()) };
        let half = |v: __m256i, c: usize| {
            let c = unsafe { _mm512_loadu_si512(cols.as_ptr().add(j + c).cast()) };
            let t = _mm512_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(v), c), row);
            // Clamped below 2^24: the low i32 of each lane.
            _mm512_cvtepi64_epi32(_mm512_max_epi64(_mm512_min_epi64(t, hi), lo))
        };
        let low = half(_mm512_castsi512_si256(s), 0);
        let high = half(_mm512_extracti64x4_epi64::<1>(s), 8);
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
        let x = _mm512_mul_ps(_mm512_cvtepi32_ps(v), unit);
        let live = (n - j).min(LANES);
        let mask: __mmask16 = if live == LANES { !0 } else { (1 << live) - 1 };
        // SAFETY: the mask writes `live` values within `out`.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), mask, x) };
        j += LANES;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing by its definition: line `t · np/16 + j/16`, lane `j % 16`, holds
    /// `(Bᵀ[j][2t], Bᵀ[j][2t + 1])`, zero past `n`.
    fn packed_by_definition(bt: &[i16], n: usize, kp: usize) -> Vec<i32> {
        let (pairs, np) = (kp / 2, n.div_ceil(LANES) * LANES);
        let mut flat = vec![0i32; pairs * np];
        for t in 0..pairs {
            for j in 0..n {
                let (lo, hi) = (bt[j * kp + 2 * t] as u16, bt[j * kp + 2 * t + 1] as u16);
                flat[t * np + j] = (u32::from(lo) | (u32::from(hi) << 16)) as i32;
            }
        }
        flat
    }

    #[test]
    fn packing_is_the_pairs_transposed_for_every_edge_of_the_blocks() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as i16
        };
        // Columns and pairs below, at and past one and two blocks of sixteen.
        for n in [1, 2, 15, 16, 17, 31, 32, 33, 48, 50] {
            for pairs in [0, 1, 2, 15, 16, 17, 33, 40] {
                let kp = 2 * pairs;
                // One extra value past the end: the packing must not read it.
                let bt: Vec<i16> = (0..n * kp + 1).map(|_| next()).collect();
                let Some(p) = PairPacked::new(&bt, n, kp) else {
                    return; // No AVX-512 BW here: the kernel does not run.
                };
                let lanes: Vec<i32> = p.lines.iter().flat_map(|l| l.0).collect();
                assert_eq!(
                    lanes,
                    packed_by_definition(&bt, n, kp),
                    "n {n}, pairs {pairs}"
                );
                assert_eq!(p.np, n.div_ceil(LANES) * LANES);
            }
        }
    }
}
