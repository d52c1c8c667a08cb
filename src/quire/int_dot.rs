//! Exact GEMM on small integers: the quire of posits whose values are i16 multiples of minpos.
//!
//! For posit(n, es) with `maxpos = 2^s`, every value is `c · 2^-s` with an integer
//! `|c| <= 2^2s`. When `2s <= 12` (posit<8,0>: values are multiples of 2^-6 up to 64, so
//! `|c| <= 4096`), `c` fits an i16 and a product `|c·d| <= 2^24`. The kernels take operands
//! with `|c| <= 4096` (the callers' posit values) and need nothing else:
//!
//! * **i32 partial sums.** Each i32 lane adds at most 64 products before it is widened:
//!   `|lane| <= 64 · 2^24 = 2^30 < 2^31`, so no lane can wrap. The portable loop sums 64
//!   products per i32; a `vpmaddwd` or `vpdpwssd` adds two products to a lane per
//!   instruction, so the vector kernels widen after 32 instructions per lane: 512 elements
//!   of `k` with 256-bit registers (8 lanes), 1024 with 512-bit registers (16 lanes).
//! * **i64 totals.** The widened lanes (each at most `2^30`) are added in i64, and a dot
//!   product of length `k` is at most `k · 2^24` in magnitude: exact for any `k < 2^39`
//!   (the callers keep whole sums, bias included, below `2^53`).
//! * **i32 all the way, where the operands allow** ([`fits_i32`]). If `k · max|a| ·
//!   max|b| < 2^31`, no partial sum of any dot product's terms, in any order, leaves the
//!   i32 range, so the 512-bit kernels sum all of `k` in their lanes and reduce the lanes in
//!   i32 by unpacks and adds, widening only the four totals of a row instead of all
//!   sixteen lanes of each accumulator first. That reduction runs once per 4 x 4 tile, a
//!   real share of the work when `k` is a few hundred (a LeNet-5 layer: about 10% of the
//!   kernel's time). Layer data of a few units (a few hundred minpos) passes; values near
//!   maxpos pass only for `k < 128`.
//!
//! The sums are integers, so every kernel and every order of the additions gives the same
//! result: it does not depend on the tiling, the CPU or the thread count.
//!
//! The kernels ([`Kernel`], chosen at run time, at most the instruction set of
//! [`crate::backend::isa::active`]):
//!
//! * `vpdpwssd` (AVX512-VNNI on 512-bit registers, AVX-VNNI on 256-bit ones): the i16
//!   multiply, the pairwise add and the i32 accumulate in one instruction;
//! * `vpmaddwd` then `vpaddd` (AVX-512BW, AVX2) where the CPU has no VNNI;
//! * a portable loop elsewhere.
//!
//! A tile is four rows of `A` against four rows of `Bᵀ` (sixteen accumulators; eight loads
//! serve sixteen multiply-adds) on 512-bit registers, two 2 x 4 tiles on 256-bit ones (16
//! registers hold no more). The 512-bit kernels load whole registers, then the last
//! `k mod 32` elements with a mask (the lanes masked off read nothing and add zero); the
//! 256-bit ones sum the last `k mod 16` in the portable loop. Callers that can should pad
//! each row with zeros to a multiple of 32 elements and start it on a 64-byte boundary
//! ([`super::quire_i16`] does): no load then straddles two cache lines, which measured up to
//! 1.7x faster at 1024³ on an AVX-512 Xeon. After each chunk the sixteen accumulators are
//! widened to i64 and reduced across their lanes in registers (`vpmovsxdq`, then unpacks
//! and 128-bit lane shuffles: one vector of four sums per row).
//!
//! [`gemm_map`] walks the output in panels of `Bᵀ` rows small enough to stay in the cache
//! while every group of four rows of `A` passes over them (within a block of rows, each
//! four rows of `Bᵀ` meet all the block's rows before the next four), and hands each exact
//! sum to the caller's function as it leaves the tile (the quire GEMM rounds it there, so no
//! matrix of sums is ever stored). [`gemm_clamped`] adds a term per row and per column to
//! each sum and stores it as an f32, clamped and scaled (posit<n,0>'s quire, which rounds
//! the f32s in one vector pass afterwards); the vector kernels do that in registers as the
//! sums leave the tile (on AVX-512 the per-tile hand-back to a closure, scalar i64 to f32
//! per output, took about 15% of a 1024³ product's time).

use crate::backend::isa::{self, Isa};

/// Products summed in i32 before the i64 gathers them (`64 · 2^24 <= 2^30`).
const CHUNK: usize = 64;

/// Whether posits with `maxpos = 2^max_scale` take this path.
pub fn applies(max_scale: i32) -> bool {
    2 * max_scale <= 12
}

/// A compiled tile kernel of the integer dot products (see the module docs). Every kernel
/// gives the same sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable Rust: i32 sums of 64 products, gathered in i64.
    Portable,
    /// AVX2 `vpmaddwd` and `vpaddd`, 2 x 4 tiles.
    Avx2,
    /// AVX-VNNI `vpdpwssd` on 256-bit registers, 2 x 4 tiles.
    Avx2Vnni,
    /// AVX-512BW `vpmaddwd` and `vpaddd`, 4 x 4 tiles.
    Avx512,
    /// AVX512-VNNI `vpdpwssd`, 4 x 4 tiles.
    Avx512Vnni,
}

impl Kernel {
    /// Every kernel, narrowest first.
    pub const ALL: [Kernel; 5] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::Avx2Vnni,
        Kernel::Avx512,
        Kernel::Avx512Vnni,
    ];

    /// Whether this CPU can run the kernel.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 = || has!("avx512f") && has!("avx512bw");
            match self {
                Kernel::Portable => true,
                Kernel::Avx2 => has!("avx2"),
                Kernel::Avx2Vnni => has!("avx2") && has!("avxvnni"),
                Kernel::Avx512 => avx512(),
                Kernel::Avx512Vnni => avx512() && has!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Portable
        }
    }

    /// The kernel of the instruction set in use ([`isa::active`]), with VNNI where the CPU
    /// has it.
    pub fn best() -> Kernel {
        let pick = |vnni: Kernel, plain: Kernel| {
            if vnni.supported() {
                vnni
            } else {
                plain
            }
        };
        match isa::active() {
            Isa::Avx512 => pick(Kernel::Avx512Vnni, Kernel::Avx512),
            Isa::Avx2 => pick(Kernel::Avx2Vnni, Kernel::Avx2),
            Isa::Portable => Kernel::Portable,
        }
    }

    /// Sixteen exact dot products: `a[r]` with `b[c]` at `[r][c]` (all of one length);
    /// `narrow` where the operands' sums fit an i32 ([`fits_i32`]).
    #[inline]
    fn tile(self, a: [&[i16]; 4], b: [&[i16]; 4], narrow: bool) -> [[i64; 4]; 4] {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY (each arm): `gemm_map` runs only kernels whose `supported()` holds, so
            // the CPU has the instructions the arm was compiled for.
            match self {
                Kernel::Portable => {}
                Kernel::Avx2 => {
                    let (lo, hi) =
                        unsafe { (tile2x4_avx2([a[0], a[1]], b), tile2x4_avx2([a[2], a[3]], b)) };
                    return [lo[0], lo[1], hi[0], hi[1]];
                }
                Kernel::Avx2Vnni => {
                    let (lo, hi) = unsafe {
                        (
                            tile2x4_avx2_vnni([a[0], a[1]], b),
                            tile2x4_avx2_vnni([a[2], a[3]], b),
                        )
                    };
                    return [lo[0], lo[1], hi[0], hi[1]];
                }
                Kernel::Avx512 if narrow => return unsafe { tile4x4_avx512::<true>(a, b) },
                Kernel::Avx512 => return unsafe { tile4x4_avx512::<false>(a, b) },
                Kernel::Avx512Vnni if narrow => {
                    return unsafe { tile4x4_avx512_vnni::<true>(a, b) }
                }
                Kernel::Avx512Vnni => return unsafe { tile4x4_avx512_vnni::<false>(a, b) },
            }
        }
        a.map(|row| dot4_body(row, b))
    }
}

/// Four exact dot products of `a` with `b[0..4]` in i32 chunks of [`CHUNK`] products.
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

/// Elements of `k` per i32 partial sum with 256-bit registers: each of the 8 lanes adds 32
/// instructions' two products, at most `64 · 2^24 = 2^30`.
#[cfg(target_arch = "x86_64")]
const AVX2_CHUNK: usize = 512;

/// The four totals of four 8-lane i32 accumulators, widened to i64 first.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn reduce4_avx2(v: [std::arch::x86_64::__m256i; 4]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // Each vector: 4 i64 partial sums (lane l + lane l + 4).
    let s = v.map(|x| {
        _mm256_add_epi64(
            _mm256_cvtepi32_epi64(_mm256_castsi256_si128(x)),
            _mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(x)),
        )
    });
    // Per 128-bit half: (part of s0, part of s1) and (part of s2, part of s3).
    let t01 = _mm256_add_epi64(
        _mm256_unpacklo_epi64(s[0], s[1]),
        _mm256_unpackhi_epi64(s[0], s[1]),
    );
    let t23 = _mm256_add_epi64(
        _mm256_unpacklo_epi64(s[2], s[3]),
        _mm256_unpackhi_epi64(s[2], s[3]),
    );
    // Low halves plus high halves: (s0, s1, s2, s3).
    _mm256_add_epi64(
        _mm256_permute2x128_si256::<0x20>(t01, t23),
        _mm256_permute2x128_si256::<0x31>(t01, t23),
    )
}

/// A 2 x 4 tile on 256-bit registers; `$madd(acc, x, y)` adds the pairwise products of
/// `x` and `y` to the i32 lanes of `acc`. Defines `$name` (the eight sums as i64) and
/// `$clamped` (each row's four totals with their terms, clamped and scaled to f32 in
/// registers: [`ClampedTile`]).
macro_rules! tile2x4_avx2_kernel {
    ($(#[$doc:meta])* $name:ident, $(#[$cdoc:meta])* $clamped:ident, $features:literal, $madd:expr) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(a: [&[i16]; 2], b: [&[i16]; 4]) -> [[i64; 4]; 2] {
            use std::arch::x86_64::*;
            let total = sums2x4_avx2!(a, b, $madd);
            let mut out = [[0i64; 4]; 2];
            for r in 0..2 {
                // SAFETY: `out[r]` holds four i64, 32 bytes.
                unsafe { _mm256_storeu_si256(out[r].as_mut_ptr() as *mut __m256i, total[r]) };
            }
            out
        }

        $(#[$cdoc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $clamped(a: [&[i16]; 2], b: [&[i16]; 4], tile: &ClampedTile<2>) -> [[f32; 4]; 2] {
            let total = sums2x4_avx2!(a, b, $madd);
            tile.finish(total)
        }
    };
}

/// The body of the 2 x 4 tiles: each row's four exact sums in an i64 vector (the last
/// `k mod 16` by the portable loop).
#[cfg(target_arch = "x86_64")]
macro_rules! sums2x4_avx2 {
    ($a:expr, $b:expr, $madd:expr) => {{
        use std::arch::x86_64::*;
        let (a, b): ([&[i16]; 2], [&[i16]; 4]) = ($a, $b);
        let k = a[0].len();
        let full = k / 16 * 16;
        let mut total = [_mm256_setzero_si256(); 2];
        let mut t = 0;
        while t < full {
            let end = (t + AVX2_CHUNK).min(full);
            let mut acc = [[_mm256_setzero_si256(); 4]; 2];
            while t < end {
                // SAFETY: t + 16 <= full <= k, the length of every row of `a` and `b`.
                let load =
                    |p: &[i16]| unsafe { _mm256_loadu_si256(p.as_ptr().add(t) as *const __m256i) };
                let x = [load(a[0]), load(a[1])];
                for c in 0..4 {
                    let y = load(b[c]);
                    for r in 0..2 {
                        acc[r][c] = $madd(acc[r][c], x[r], y);
                    }
                }
                t += 16;
            }
            for r in 0..2 {
                total[r] = _mm256_add_epi64(total[r], reduce4_avx2(acc[r]));
            }
        }
        if full < k {
            for r in 0..2 {
                let tail = dot4_body(&a[r][full..], b.map(|row| &row[full..]));
                total[r] = _mm256_add_epi64(
                    total[r],
                    _mm256_setr_epi64x(tail[0], tail[1], tail[2], tail[3]),
                );
            }
        }
        total
    }};
}

/// The terms and bounds of one `R x 4` tile of [`gemm_clamped`], for the fused kernels.
#[cfg(target_arch = "x86_64")]
struct ClampedTile<const R: usize> {
    /// The rows' terms.
    rows: [i64; R],
    /// The four columns' terms.
    cols: [i64; 4],
    /// Totals are clamped to `±cap`.
    cap: i64,
    /// Then multiplied by this.
    unit: f32,
}

#[cfg(target_arch = "x86_64")]
impl<const R: usize> ClampedTile<R> {
    /// Each row's totals `sums + rows[r] + cols`, clamped to `±cap`, converted (exact for
    /// `cap < 2^24`) and scaled.
    #[target_feature(enable = "avx2")]
    fn finish(&self, sums: [std::arch::x86_64::__m256i; R]) -> [[f32; 4]; R] {
        use std::arch::x86_64::*;
        let cols = _mm256_setr_epi64x(self.cols[0], self.cols[1], self.cols[2], self.cols[3]);
        let (hi, lo) = (_mm256_set1_epi64x(self.cap), _mm256_set1_epi64x(-self.cap));
        let unit = _mm_set1_ps(self.unit);
        let mut out = [[0f32; 4]; R];
        for r in 0..R {
            let v = _mm256_add_epi64(
                sums[r],
                _mm256_add_epi64(cols, _mm256_set1_epi64x(self.rows[r])),
            );
            let v = _mm256_blendv_epi8(v, hi, _mm256_cmpgt_epi64(v, hi));
            let v = _mm256_blendv_epi8(v, lo, _mm256_cmpgt_epi64(lo, v));
            // The low i32 of each lane (the clamped totals fit).
            let low = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
                v,
                _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6),
            ));
            let x = _mm_mul_ps(_mm_cvtepi32_ps(low), unit);
            // SAFETY: `out[r]` holds four f32, 16 bytes.
            unsafe { _mm_storeu_ps(out[r].as_mut_ptr(), x) };
        }
        out
    }
}

tile2x4_avx2_kernel!(
    /// Eight exact dot products by `vpmaddwd` and `vpaddd` (AVX2).
    tile2x4_avx2,
    /// [`tile2x4_avx2`]'s totals clamped and scaled ([`ClampedTile::finish`]).
    tile2x4_avx2_clamped,
    "avx2",
    |acc, x, y| _mm256_add_epi32(acc, _mm256_madd_epi16(x, y))
);

tile2x4_avx2_kernel!(
    /// Eight exact dot products by `vpdpwssd` (AVX-VNNI).
    tile2x4_avx2_vnni,
    /// [`tile2x4_avx2_vnni`]'s totals clamped and scaled ([`ClampedTile::finish`]).
    tile2x4_avx2_vnni_clamped,
    "avx2,avxvnni",
    |acc, x, y| _mm256_dpwssd_avx_epi32(acc, x, y)
);

/// Elements of `k` per i32 partial sum with 512-bit registers: each of the 16 lanes adds
/// 32 instructions' two products, at most `64 · 2^24 = 2^30`.
#[cfg(target_arch = "x86_64")]
const AVX512_CHUNK: usize = 1024;

/// The four totals of four 16-lane i32 accumulators, widened to i64 first.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn reduce4_avx512(v: [std::arch::x86_64::__m512i; 4]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // Each vector: 8 i64 partial sums (lane l + lane l + 8).
    let s = v.map(|x| {
        _mm512_add_epi64(
            _mm512_cvtepi32_epi64(_mm512_castsi512_si256(x)),
            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(x)),
        )
    });
    // Per 128-bit lane: (part of s0, part of s1), and (part of s2, part of s3).
    let t01 = _mm512_add_epi64(
        _mm512_unpacklo_epi64(s[0], s[1]),
        _mm512_unpackhi_epi64(s[0], s[1]),
    );
    let t23 = _mm512_add_epi64(
        _mm512_unpacklo_epi64(s[2], s[3]),
        _mm512_unpackhi_epi64(s[2], s[3]),
    );
    // Lanes (t01.0 + t01.1, t01.2 + t01.3, t23.0 + t23.1, t23.2 + t23.3).
    let u = _mm512_add_epi64(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(t01, t23),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(t01, t23),
    );
    // Low 256 bits: (u.0 + u.1, u.2 + u.3) = (s0, s1, s2, s3).
    let w = _mm512_add_epi64(
        _mm512_shuffle_i64x2::<0b00_00_10_00>(u, u),
        _mm512_shuffle_i64x2::<0b00_00_11_01>(u, u),
    );
    _mm512_castsi512_si256(w)
}

/// The four totals of four 16-lane i32 accumulators, summed in i32 and widened at the end:
/// exact where every partial sum of their lanes fits an i32 (the narrow tiles' bound).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn reduce4_avx512_i32(v: [std::arch::x86_64::__m512i; 4]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // Per 128-bit lane: (v0, v1, v0, v1) and (v2, v3, v2, v3), each a sum of two lanes.
    let t01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[0], v[1]),
        _mm512_unpackhi_epi32(v[0], v[1]),
    );
    let t23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[2], v[3]),
        _mm512_unpackhi_epi32(v[2], v[3]),
    );
    // Per 128-bit lane: (v0, v1, v2, v3).
    let u = _mm512_add_epi32(
        _mm512_unpacklo_epi64(t01, t23),
        _mm512_unpackhi_epi64(t01, t23),
    );
    // The four 128-bit lanes summed.
    let h = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64::<1>(u));
    let q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    _mm256_cvtepi32_epi64(q)
}

/// A 4 x 4 tile on 512-bit registers; `$madd(acc, x, y)` adds the pairwise products of
/// `x` and `y` to the i32 lanes of `acc`. `NARROW` tiles sum all of `k` in the i32 lanes
/// and across them before widening, for operands whose sums provably fit
/// ([`fits_i32`]); the others widen every [`AVX512_CHUNK`] elements. Defines `$name` (the
/// sixteen sums as i64) and `$clamped` (each row's four totals with their terms, clamped
/// and scaled to f32 in registers: [`ClampedTile`]).
macro_rules! tile4x4_avx512_kernel {
    (
        $(#[$doc:meta])* $name:ident,
        $(#[$cdoc:meta])* $clamped:ident,
        $features:literal,
        $madd:expr
    ) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const NARROW: bool>(a: [&[i16]; 4], b: [&[i16]; 4]) -> [[i64; 4]; 4] {
            use std::arch::x86_64::*;
            let total = sums4x4_avx512!(a, b, NARROW, $madd);
            let mut out = [[0i64; 4]; 4];
            for r in 0..4 {
                // SAFETY: `out[r]` holds four i64, 32 bytes.
                unsafe { _mm256_storeu_si256(out[r].as_mut_ptr() as *mut __m256i, total[r]) };
            }
            out
        }

        $(#[$cdoc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $clamped<const NARROW: bool>(
            a: [&[i16]; 4],
            b: [&[i16]; 4],
            tile: &ClampedTile<4>,
        ) -> [[f32; 4]; 4] {
            let total = sums4x4_avx512!(a, b, NARROW, $madd);
            tile.finish(total)
        }
    };
}

/// The body of the 4 x 4 tiles: each row's four exact sums in an i64 vector (the last
/// `k mod 32` elements under a mask).
#[cfg(target_arch = "x86_64")]
macro_rules! sums4x4_avx512 {
    ($a:expr, $b:expr, $narrow:expr, $madd:expr) => {{
        use std::arch::x86_64::*;
        let (a, b): ([&[i16]; 4], [&[i16]; 4]) = ($a, $b);
        let k = a[0].len();
        let chunk = if $narrow { k } else { AVX512_CHUNK };
        let mut total = [_mm256_setzero_si256(); 4];
        let mut t = 0;
        while t < k {
            let end = (t + chunk).min(k);
            let mut acc = [[_mm512_setzero_si512(); 4]; 4];
            // Whole vectors, then the last `end - t < 32` elements under a mask.
            while t + 32 <= end {
                // SAFETY: elements t..t + 32, inside every row (`end <= k`, each row's
                // length).
                let load = |p: &[i16]| unsafe { _mm512_loadu_si512(p.as_ptr().add(t).cast()) };
                let x = [load(a[0]), load(a[1]), load(a[2]), load(a[3])];
                for c in 0..4 {
                    let y = load(b[c]);
                    for r in 0..4 {
                        acc[r][c] = $madd(acc[r][c], x[r], y);
                    }
                }
                t += 32;
            }
            if t < end {
                let mask: __mmask32 = (1u32 << (end - t)) - 1;
                // SAFETY: the mask enables only elements t..end, inside every row;
                // masked-off elements are not read.
                let load = |p: &[i16]| unsafe { _mm512_maskz_loadu_epi16(mask, p.as_ptr().add(t)) };
                let x = [load(a[0]), load(a[1]), load(a[2]), load(a[3])];
                for c in 0..4 {
                    let y = load(b[c]);
                    for r in 0..4 {
                        acc[r][c] = $madd(acc[r][c], x[r], y);
                    }
                }
                t = end;
            }
            for r in 0..4 {
                let sums = if $narrow {
                    reduce4_avx512_i32(acc[r])
                } else {
                    reduce4_avx512(acc[r])
                };
                total[r] = _mm256_add_epi64(total[r], sums);
            }
        }
        total
    }};
}

tile4x4_avx512_kernel!(
    /// Sixteen exact dot products by `vpmaddwd` and `vpaddd` (AVX-512BW).
    tile4x4_avx512,
    /// [`tile4x4_avx512`]'s totals clamped and scaled ([`ClampedTile::finish`]).
    tile4x4_avx512_clamped,
    "avx512f,avx512bw,avx2",
    |acc, x, y| _mm512_add_epi32(acc, _mm512_madd_epi16(x, y))
);

tile4x4_avx512_kernel!(
    /// Sixteen exact dot products by `vpdpwssd` (AVX512-VNNI).
    tile4x4_avx512_vnni,
    /// [`tile4x4_avx512_vnni`]'s totals clamped and scaled ([`ClampedTile::finish`]).
    tile4x4_avx512_vnni_clamped,
    "avx512f,avx512bw,avx512vnni,avx2",
    |acc, x, y| _mm512_dpwssd_epi32(acc, x, y)
);

/// Bytes of `Bᵀ` rows kept in the cache while the rows of `A` pass over them.
const PANEL_BYTES: usize = 128 << 10;

/// Rows of `A` (and of the output) per parallel task.
const ROW_BLOCK: usize = 16;

/// `out (m x n) = A (m x k) · B` exactly, with `a` row-major and `bt = Bᵀ` (`n x k`,
/// row-major): `out[i·n + j] = Σ_t a[i·k + t] · bt[j·k + t]`; every value at most 4096 in
/// magnitude (see the module docs). `parallel` spreads blocks of rows over the rayon pool.
pub fn gemm(a: &[i16], bt: &[i16], dims: (usize, usize, usize), out: &mut [i64], parallel: bool) {
    gemm_map(
        Kernel::best(),
        a,
        bt,
        dims,
        out,
        parallel,
        |_, _, s, dst| dst.copy_from_slice(&s[..dst.len()]),
    );
}

/// [`gemm()`] by the given kernel (the portable one where the CPU cannot run it), the outputs
/// stored by `finish(i, j, sums, dst)`: `sums[c]` is the exact sum of output `(i, j + c)`,
/// for `c < dst.len()` (one to four), and `dst` those outputs (`j` is a multiple of 4; the
/// sums past `dst.len()` are to be ignored).
pub fn gemm_map<T: Send>(
    kernel: Kernel,
    a: &[i16],
    bt: &[i16],
    (m, k, n): (usize, usize, usize),
    out: &mut [T],
    parallel: bool,
    finish: impl Fn(usize, usize, [i64; 4], &mut [T]) + Sync,
) {
    assert!(a.len() >= m * k && bt.len() >= n * k && out.len() >= m * n);
    let kernel = if kernel.supported() {
        kernel
    } else {
        Kernel::Portable
    };
    let narrow = fits_i32(&a[..m * k], &bt[..n * k], k);
    walk_tiles((m, k, n), out, parallel, 4, |at, dst| {
        let p = [0, 1, 2, 3].map(|r| at.a_row(a, k, r));
        let q = [0, 1, 2, 3].map(|c| at.bt_row(bt, k, n, c));
        let s = kernel.tile(p, q, narrow);
        for (rr, &sums) in s.iter().enumerate().take(at.live_rows) {
            let row = (at.r + rr) * n + at.j;
            finish(at.i0 + at.r + rr, at.j, sums, &mut dst[row..row + at.cols]);
        }
    });
}

/// Whether every partial sum of products of `a`'s and `bt`'s values, `k` at most per dot
/// product, fits an i32: `k · max|a| · max|bt| < 2^31` bounds the sum of the magnitudes of
/// any dot product's terms, so no subset of them, summed in any order, can wrap. Typical
/// layer data (values of a few units, hundreds of minpos) passes; operands near maxpos
/// (`4096² = 2^24`) pass only for `k < 128`.
pub fn fits_i32(a: &[i16], bt: &[i16], k: usize) -> bool {
    sums_fit_i32(k, max_magnitude(a), max_magnitude(bt))
}

/// [`fits_i32`]'s bound from the operands' largest magnitudes: `k · max_a · max_b < 2^31`.
pub(crate) fn sums_fit_i32(k: usize, max_a: u16, max_b: u16) -> bool {
    (k as u128) * u128::from(max_a) * u128::from(max_b) < 1 << 31
}

/// The largest `|x|` of `v` (0 when empty), compiled for the instruction set in use
/// ([`isa::active`]): the baseline x86-64 has neither `pabsw` nor `pmaxuw`, and its scan
/// measured 17 values a nanosecond, about 8% of a band's time at the LeNet-5 shape.
pub(crate) fn max_magnitude(v: &[i16]) -> u16 {
    #[cfg(target_arch = "x86_64")]
    match isa::active() {
        // SAFETY: `isa::active` reports only instruction sets the CPU has.
        Isa::Avx512 => return unsafe { max_magnitude_avx512(v) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { max_magnitude_avx2(v) },
        Isa::Portable => {}
    }
    max_magnitude_lanes(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn max_magnitude_avx512(v: &[i16]) -> u16 {
    max_magnitude_lanes(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_magnitude_avx2(v: &[i16]) -> u16 {
    max_magnitude_lanes(v)
}

/// [`max_magnitude`] in 32 independent lanes, which the compiler keeps in vector registers.
#[inline(always)]
fn max_magnitude_lanes(v: &[i16]) -> u16 {
    const LANES: usize = 32;
    let mut lanes = [0u16; LANES];
    let mut groups = v.chunks_exact(LANES);
    for group in &mut groups {
        for (m, x) in lanes.iter_mut().zip(group) {
            *m = (*m).max(x.unsigned_abs());
        }
    }
    let tail = groups.remainder().iter().map(|x| x.unsigned_abs());
    tail.chain(lanes).max().unwrap_or(0)
}

/// One tile of [`walk_tiles`]: rows `r..` of the block of rows that starts at `i0` (`rows`
/// in the block; `live_rows` of the tile's rows are in it, the rest repeat the block's last
/// row), columns `j..j + cols` (the tile's other columns repeat the matrix's last). The
/// padding's outputs are computed and dropped.
struct TileAt {
    i0: usize,
    rows: usize,
    r: usize,
    live_rows: usize,
    j: usize,
    cols: usize,
}

impl TileAt {
    /// The tile's row `rr` of `A` (`k` long rows), padded.
    fn a_row<'a>(&self, a: &'a [i16], k: usize, rr: usize) -> &'a [i16] {
        let i = self.a_index(rr);
        &a[i * k..i * k + k]
    }

    /// The index in `A` of the tile's row `rr`, padded.
    fn a_index(&self, rr: usize) -> usize {
        self.i0 + (self.r + rr).min(self.rows - 1)
    }

    /// The index in `Bᵀ` of the tile's column `c`, padded (`n` columns).
    fn bt_index(&self, n: usize, c: usize) -> usize {
        (self.j + c).min(n - 1)
    }

    /// The tile's row `c` of `Bᵀ` (`k` long rows), padded.
    fn bt_row<'a>(&self, bt: &'a [i16], k: usize, n: usize, c: usize) -> &'a [i16] {
        let j = self.bt_index(n, c);
        &bt[j * k..j * k + k]
    }
}

/// The walk of the integer GEMMs over an `m x n` output: blocks of [`ROW_BLOCK`] rows (one
/// task of the pool each where `parallel`), each in panels of `Bᵀ` rows small enough to stay
/// in the cache while every group of `tile_rows` rows of the block passes over them, in
/// tiles of `tile_rows x 4` (columns outer, so each tile's rows of `Bᵀ` stay in the
/// innermost cache while the block's rows pass); `visit` gets each tile and its block of the
/// output. A panel is a multiple of 4 columns, so only the matrix's last tile is partial.
fn walk_tiles<T: Send>(
    (m, k, n): (usize, usize, usize),
    out: &mut [T],
    parallel: bool,
    tile_rows: usize,
    visit: impl Fn(&TileAt, &mut [T]) + Sync,
) {
    use rayon::prelude::*;
    if n == 0 || m == 0 {
        return;
    }
    let panel = (PANEL_BYTES / (2 * k.max(1))).max(4) / 4 * 4;
    let block = |(blk, dst): (usize, &mut [T])| {
        let rows = dst.len() / n;
        let mut j0 = 0;
        while j0 < n {
            let j1 = (j0 + panel).min(n);
            let mut j = j0;
            while j < j1 {
                let mut r = 0;
                while r < rows {
                    let at = TileAt {
                        i0: blk * ROW_BLOCK,
                        rows,
                        r,
                        live_rows: (rows - r).min(tile_rows),
                        j,
                        cols: (j1 - j).min(4),
                    };
                    visit(&at, dst);
                    r += tile_rows;
                }
                j += 4;
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

/// `out[i·n + j] = clamp(Σ_t a[i·k + t] · bt[j·k + t] + row_term[i] + col_term[j], ±cap) · unit`
/// for every output: the exact totals of [`gemm()`] with a term per row and per column,
/// clamped and scaled. `cap < 2^24`, so each clamped total is an f32, and `unit` a power of
/// two, so the scaled one is exact where it stays normal. The vector kernels do it in
/// registers as the totals leave the tile; the portable one through [`gemm_map`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_clamped(
    kernel: Kernel,
    a: &[i16],
    bt: &[i16],
    (m, k, n): (usize, usize, usize),
    (row_term, col_term): (&[i64], &[i64]),
    (cap, unit): (i64, f32),
    out: &mut [f32],
    parallel: bool,
) {
    assert!((0..1 << 24).contains(&cap) && row_term.len() >= m && col_term.len() >= n);
    #[cfg(target_arch = "x86_64")]
    if kernel.supported() {
        let args = (a, bt, (m, k, n), (row_term, col_term), (cap, unit));
        let narrow = || fits_i32(&a[..m * k], &bt[..n * k], k);
        match kernel {
            Kernel::Portable => {}
            Kernel::Avx2 => return gemm_fused(tile2x4_avx2_clamped, args, out, parallel),
            Kernel::Avx2Vnni => return gemm_fused(tile2x4_avx2_vnni_clamped, args, out, parallel),
            Kernel::Avx512 if narrow() => {
                return gemm_fused(tile4x4_avx512_clamped::<true>, args, out, parallel)
            }
            Kernel::Avx512 => {
                return gemm_fused(tile4x4_avx512_clamped::<false>, args, out, parallel)
            }
            Kernel::Avx512Vnni if narrow() => {
                return gemm_fused(tile4x4_avx512_vnni_clamped::<true>, args, out, parallel)
            }
            Kernel::Avx512Vnni => {
                return gemm_fused(tile4x4_avx512_vnni_clamped::<false>, args, out, parallel)
            }
        }
    }
    gemm_map(kernel, a, bt, (m, k, n), out, parallel, |i, j, s, dst| {
        for (c, d) in dst.iter_mut().enumerate() {
            *d = (s[c] + row_term[i] + col_term[j + c]).clamp(-cap, cap) as f32 * unit;
        }
    });
}

/// A fused `R x 4` tile of [`gemm_clamped`]: `R` rows of `A`, four of `Bᵀ`, the terms.
#[cfg(target_arch = "x86_64")]
type ClampedKernel<const R: usize> =
    unsafe fn([&[i16]; R], [&[i16]; 4], &ClampedTile<R>) -> [[f32; 4]; R];

/// The operands of [`gemm_clamped`]: `A`, `Bᵀ`, the dimensions, the terms per row and per
/// column, the cap and the unit.
#[cfg(target_arch = "x86_64")]
type ClampedArgs<'a> = (
    &'a [i16],
    &'a [i16],
    (usize, usize, usize),
    (&'a [i64], &'a [i64]),
    (i64, f32),
);

/// [`gemm_clamped`] by a fused `R x 4` tile (`tile_fn`, which the CPU runs), on the walk
/// of [`gemm_map`] ([`walk_tiles`]) `R` rows of `A` at a time.
#[cfg(target_arch = "x86_64")]
fn gemm_fused<const R: usize>(
    tile_fn: ClampedKernel<R>,
    (a, bt, (m, k, n), (row_term, col_term), (cap, unit)): ClampedArgs,
    out: &mut [f32],
    parallel: bool,
) {
    assert!(a.len() >= m * k && bt.len() >= n * k && out.len() >= m * n);
    walk_tiles((m, k, n), out, parallel, R, |at, dst| {
        let p = std::array::from_fn(|r| at.a_row(a, k, r));
        let q = [0, 1, 2, 3].map(|c| at.bt_row(bt, k, n, c));
        let tile = ClampedTile {
            rows: std::array::from_fn(|r| row_term[at.a_index(r)]),
            cols: [0, 1, 2, 3].map(|c| col_term[at.bt_index(n, c)]),
            cap,
            unit,
        };
        // SAFETY: `gemm_clamped` passes only kernels the CPU runs.
        let v = unsafe { tile_fn(p, q, &tile) };
        for (rr, vals) in v.iter().enumerate().take(at.live_rows) {
            let row = (at.r + rr) * n + at.j;
            dst[row..row + at.cols].copy_from_slice(&vals[..at.cols]);
        }
    });
}
