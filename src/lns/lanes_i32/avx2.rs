//! The 32-bit kernel's row pairs in AVX2: eight lanes per vector and per gather, the same
//! step and the same tiles as the AVX-512 kernel of the parent module (whose docs state
//! the formula), with compares and blends for its masks.

use std::arch::x86_64::*;

use super::{code, Pass, FAR_SHIFT, ZK};

/// Vectors of eight lanes per tile.
const VECS: usize = 4;
/// Lanes per vector.
const VL: usize = 8;

/// Rows `a0` and `a1` of the product (the same slice when there is one row), as packed
/// codes into `codes` (`2 n`: the first row, then the second).
#[target_feature(enable = "avx2,fma")]
pub(super) fn row_pair(pass: &Pass, a0: &[i64], a1: &[i64], codes: &mut [i64]) {
    let n = pass.n;
    let mut j0 = 0;
    while j0 < n {
        let width = (VECS * VL).min(n - j0);
        let vecs = width.div_ceil(VL);
        let rem = (width - (vecs - 1) * VL) as i32;
        // Lanes below `rem` of the last vector: their sign bits set.
        let last = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(rem),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let mut k_out = [[0i32; VECS * VL]; 2];
        let mut s_out = [[0i32; VECS * VL]; 2];
        match vecs {
            1 => tile::<1>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
            2 => tile::<2>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
            3 => tile::<3>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
            _ => tile::<4>(pass, a0, a1, j0, last, &mut k_out, &mut s_out),
        }
        for r in 0..2 {
            for jj in 0..width {
                codes[r * n + j0 + jj] = code(k_out[r][jj], s_out[r][jj]);
            }
        }
        j0 += width;
    }
}

/// The table, range and constants of a step, in vectors.
#[derive(Clone, Copy)]
struct Consts {
    k_min: __m256i,
    k_max: __m256i,
    zk: __m256i,
    len: __m256i,
    db_off: __m256i,
    table: *const i32,
}

/// `min(v, k_max)`, or [`ZK`] where `v < k_min`: a value brought into the range.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn bring_in(c: &Consts, v: __m256i) -> __m256i {
    let under = _mm256_cmpgt_epi32(c.k_min, v);
    _mm256_blendv_epi8(_mm256_min_epi32(v, c.k_max), c.zk, under)
}

/// One step of one vector: `(k, s) = (k, s) ⊕ (kx + ky, sx ^ sy)`; `CLAMP` false where
/// every product is known nonzero and within the range.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn step<const CLAMP: bool>(
    c: &Consts,
    kx: __m256i,
    sx: __m256i,
    ky: __m256i,
    sy: __m256i,
    k: &mut __m256i,
    s: &mut __m256i,
) {
    // The product brought into the range (a zero operand flushes).
    let mut kp = _mm256_add_epi32(kx, ky);
    if CLAMP {
        kp = bring_in(c, kp);
    }
    let sp = _mm256_xor_si256(sx, sy);
    // The sum.
    let u = _mm256_abs_epi32(_mm256_sub_epi32(*k, kp));
    let p_bigger = _mm256_cmpgt_epi32(kp, *k);
    let big = _mm256_max_epi32(*k, kp);
    let neg = _mm256_blendv_epi8(*s, sp, p_bigger);
    let off = _mm256_and_si256(_mm256_xor_si256(*s, sp), c.db_off);
    let i = _mm256_add_epi32(
        _mm256_add_epi32(
            _mm256_min_epi32(u, c.len),
            _mm256_srli_epi32::<{ FAR_SHIFT as i32 }>(u),
        ),
        off,
    );
    // SAFETY: every index lies within the table (the parent module's docs).
    let t = unsafe { _mm256_i32gather_epi32::<4>(c.table, i) };
    *k = bring_in(c, _mm256_add_epi32(big, t));
    *s = neg;
}

/// One tile of `V` vectors at columns `j0..` for two rows of `A` (the last vector's lanes
/// those of `last`), into `k_out` and `s_out`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tile<const V: usize>(
    pass: &Pass,
    a0: &[i64],
    a1: &[i64],
    j0: usize,
    last: __m256i,
    k_out: &mut [[i32; VECS * VL]; 2],
    s_out: &mut [[i32; VECS * VL]; 2],
) {
    let c = Consts {
        k_min: _mm256_set1_epi32(pass.range.k_min() as i32),
        k_max: _mm256_set1_epi32(pass.range.k_max() as i32),
        zk: _mm256_set1_epi32(ZK),
        len: _mm256_set1_epi32(pass.len),
        db_off: _mm256_set1_epi32(pass.len + 3),
        table: pass.table.as_ptr(),
    };
    let n = pass.n;
    let mut k0 = [c.zk; V];
    let mut s0 = [_mm256_setzero_si256(); V];
    let mut k1 = [c.zk; V];
    let mut s1 = [_mm256_setzero_si256(); V];
    let split = |x: i64| {
        if x == super::ZERO {
            (c.zk, _mm256_setzero_si256())
        } else {
            (
                _mm256_set1_epi32((x >> 1) as i32),
                _mm256_set1_epi32(-((x & 1) as i32)),
            )
        }
    };
    let all = _mm256_set1_epi32(-1);
    for (p, (&x0, &x1)) in a0.iter().zip(a1).enumerate() {
        let (z0, z1) = (x0 == super::ZERO, x1 == super::ZERO);
        if z0 && z1 {
            continue;
        }
        let (kx0, sx0) = split(x0);
        let (kx1, sx1) = split(x1);
        let (in0, in1) = (pass.in_range(x0, p), pass.in_range(x1, p));
        let at = p * n + j0;
        let bk = &pass.bk[at..];
        let bs = &pass.bs[at..];
        for v in 0..V {
            let mask = if v + 1 == V { last } else { all };
            // SAFETY: the lanes of `mask` lie within row `p` of B (`j0 + 8 v + lane < n`);
            // masked-off lanes are not read.
            let (ky, sy) = unsafe {
                (
                    _mm256_maskload_epi32(bk.as_ptr().add(v * VL), mask),
                    _mm256_maskload_epi32(bs.as_ptr().add(v * VL), mask),
                )
            };
            // A zero a[i][p] skips the step of its row (`c ⊕ 0 = c`).
            match (z0, in0) {
                (true, _) => {}
                (false, true) => step::<false>(&c, kx0, sx0, ky, sy, &mut k0[v], &mut s0[v]),
                (false, false) => step::<true>(&c, kx0, sx0, ky, sy, &mut k0[v], &mut s0[v]),
            }
            match (z1, in1) {
                (true, _) => {}
                (false, true) => step::<false>(&c, kx1, sx1, ky, sy, &mut k1[v], &mut s1[v]),
                (false, false) => step::<true>(&c, kx1, sx1, ky, sy, &mut k1[v], &mut s1[v]),
            }
        }
    }
    for v in 0..V {
        // SAFETY: each output array holds VECS vectors.
        unsafe {
            _mm256_storeu_si256(k_out[0].as_mut_ptr().add(v * VL).cast(), k0[v]);
            _mm256_storeu_si256(s_out[0].as_mut_ptr().add(v * VL).cast(), s0[v]);
            _mm256_storeu_si256(k_out[1].as_mut_ptr().add(v * VL).cast(), k1[v]);
            _mm256_storeu_si256(s_out[1].as_mut_ptr().add(v * VL).cast(), s1[v]);
        }
    }
}
