//! The rows of aligned NVFP4 blocks (each block's E4M3 scale code, or the NaN row), 16
//! blocks at a time in AVX-512 lanes where the CPU has it, else block by block.
//!
//! A block's row follows from its largest magnitude `amax` (NaN and ±Inf as +Inf's bits) by
//! [`Nvfp4Scales::row_of`]: an estimate `c0` of the E4M3 code from the f64 quotient
//! `amax · fl64(1/(6 s_t))`, within one of the exact count of midpoint thresholds below
//! `amax`, then corrected by one exact threshold compare on each side (see
//! [`nvfp4_plan`](crate::backend::nvfp4_plan)). The vector form computes the same estimate
//! and the same two compares in 16 lanes, one block per lane, so it gives the same rows.
//!
//! # The maxima of 16 blocks in one vector
//! Each 16-element block is one 512-bit vector `v`; a binary tree of two-source shuffles
//! and unsigned maxima folds the 16 vectors into one whose lane `b` holds block `b`'s
//! maximum magnitude bits, with 15 maxima instead of 16 separate horizontal reductions:
//!
//! 1. pairs of blocks: the low and the high 256 bits of both, maxed: two blocks of 8 partial
//!    maxima, one per half (`vshufi64x2`);
//! 2. pairs of those: the 128-bit lanes 0 and 2, and 1 and 3, maxed: four blocks of 4, one
//!    per 128-bit lane (`vshufi64x2`);
//! 3. pairs: the 64-bit halves of each 128-bit lane, maxed: two partials per block
//!    (`vpunpcklqdq`, `vpunpckhqdq`);
//! 4. the last pair: even and odd 32-bit elements of each 128-bit lane, maxed
//!    (`vshufps`).
//!
//! The result holds, in lane `4 L + j`, the block loaded into vector `4 j + L`; loading block
//! `4 L + j` into vector `4 j + L` (a 4 x 4 transpose of the load order) puts block `b` in
//! lane `b`. Magnitude bits are the inputs with the sign cleared; NaN and ±Inf become +Inf's
//! bits by an unsigned minimum after the tree (the minimum and the maxima commute).
//!
//! # The estimate and the compares
//! The lanes are widened to f64 in two halves of 8, multiplied by `fl64(1/(6 s_t))`, and
//! the code estimate is read from the bits as in the scalar form (exponent and top 3
//! mantissa bits rounded, or `y · 2^9 + 2^52` below `2^-6`), clamped to 126 and narrowed to
//! 32 bits. The two thresholds of each lane's estimate are looked up in the plan's tables
//! (held in registers: 128 entries by four two-table permutes and a select), compared
//! unsigned with the lane's maximum, and the code moved up or down by one; lanes
//! whose maximum is +Inf's bits take the NaN row.

use crate::backend::mx_plan::mag_bits;
use crate::backend::nvfp4_plan::Nvfp4Scales;
use crate::format::nvfp4::NVFP4_BLOCK;

/// Blocks whose rows one vector step computes.
#[cfg(target_arch = "x86_64")]
const GROUP_BLOCKS: usize = 16;

/// The rows of the aligned blocks of `xs` (one per element of `rows`), block by block.
#[inline(always)]
pub(super) fn block_rows_scalar(xs: &[f32], scales: &Nvfp4Scales, rows: &mut [u8]) {
    for (x, row) in xs.chunks_exact(NVFP4_BLOCK).zip(rows.iter_mut()) {
        let m = x.iter().fold(0, |m, x| m.max(mag_bits(x.to_bits())));
        *row = scales.row_of(m) as u8;
    }
}

/// [`block_rows_scalar`] with 16 blocks per AVX-512 step (the blocks after the last whole
/// group of 16 block by block).
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW, DQ and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
pub(super) unsafe fn block_rows_avx512(xs: &[f32], scales: &Nvfp4Scales, rows: &mut [u8]) {
    let groups = rows.len().min(xs.len() / NVFP4_BLOCK) / GROUP_BLOCKS;
    const GROUP: usize = GROUP_BLOCKS * NVFP4_BLOCK;
    for g in 0..groups {
        let x: &[f32; GROUP] = xs[g * GROUP..][..GROUP].try_into().expect("16 blocks");
        let r: &mut [u8; GROUP_BLOCKS] = (&mut rows[g * GROUP_BLOCKS..][..GROUP_BLOCKS])
            .try_into()
            .expect("16 rows");
        // SAFETY: the caller guarantees AVX-512 F/BW/DQ/VL.
        unsafe { rows16(x, scales, r) };
    }
    let done = groups * GROUP_BLOCKS;
    block_rows_scalar(&xs[done * NVFP4_BLOCK..], scales, &mut rows[done..]);
}

/// The rows of 16 consecutive blocks (see the module docs).
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW, DQ and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn rows16(
    xs: &[f32; GROUP_BLOCKS * NVFP4_BLOCK],
    scales: &Nvfp4Scales,
    rows: &mut [u8; GROUP_BLOCKS],
) {
    use std::arch::x86_64::*;
    let abs = _mm512_set1_epi32(0x7fff_ffff);
    // Vector `s` holds block 4 (s mod 4) + s / 4 (the transposed load order).
    let mut v = [_mm512_setzero_si512(); GROUP_BLOCKS];
    for (s, v) in v.iter_mut().enumerate() {
        let b = 4 * (s % 4) + s / 4;
        let block = &xs[b * NVFP4_BLOCK..][..NVFP4_BLOCK];
        // SAFETY: `block` holds 16 f32 (64 bytes); unaligned load.
        let x = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
        *v = _mm512_and_si512(x, abs);
    }
    // 1: two blocks of 8 partials per vector.
    let mut m = [_mm512_setzero_si512(); 8];
    for (i, m) in m.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(a, b);
        let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(a, b);
        *m = _mm512_max_epu32(lo, hi);
    }
    // 2: four blocks of 4.
    let mut n = [_mm512_setzero_si512(); 4];
    for (j, n) in n.iter_mut().enumerate() {
        let (a, b) = (m[2 * j], m[2 * j + 1]);
        let lo = _mm512_shuffle_i64x2::<0b10_00_10_00>(a, b);
        let hi = _mm512_shuffle_i64x2::<0b11_01_11_01>(a, b);
        *n = _mm512_max_epu32(lo, hi);
    }
    // 3: eight blocks of 2.
    let mut o = [_mm512_setzero_si512(); 2];
    for (k, o) in o.iter_mut().enumerate() {
        let (a, b) = (n[2 * k], n[2 * k + 1]);
        *o = _mm512_max_epu32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    }
    // 4: sixteen blocks of 1, block b in lane b.
    let (a, b) = (_mm512_castsi512_ps(o[0]), _mm512_castsi512_ps(o[1]));
    let lo = _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(a, b));
    let hi = _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(a, b));
    let inf = _mm512_set1_epi32(0x7f80_0000);
    let amax = _mm512_min_epu32(_mm512_max_epu32(lo, hi), inf);

    // The code estimate of each half in f64 (as `Nvfp4Scales::code_estimate`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    fn estimate(half: __m256, inv_c: __m512d) -> __m256i {
        let y = _mm512_mul_pd(_mm512_cvtps_pd(half), inv_c);
        let bits = _mm512_castpd_si512(y);
        let normal = _mm512_sub_epi64(
            _mm512_srli_epi64::<49>(_mm512_add_epi64(bits, _mm512_set1_epi64(1 << 48))),
            _mm512_set1_epi64(Nvfp4Scales::NORMAL_CODE_OFFSET),
        );
        let magic = _mm512_set1_pd(Nvfp4Scales::SUBNORMAL_MAGIC);
        let scaled = _mm512_add_pd(_mm512_mul_pd(y, _mm512_set1_pd(512.0)), magic);
        let subnormal = _mm512_sub_epi64(_mm512_castpd_si512(scaled), _mm512_castpd_si512(magic));
        let is_normal = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(y, _mm512_set1_pd(1.0 / 64.0));
        let code = _mm512_mask_blend_epi64(is_normal, subnormal, normal);
        _mm512_cvtepi64_epi32(_mm512_min_epi64(code, _mm512_set1_epi64(126)))
    }
    let (inv_c, thresholds, lower) = scales.tables();
    let inv_c = _mm512_set1_pd(inv_c);
    let amax_ps = _mm512_castsi512_ps(amax);
    let c_lo = estimate(_mm512_castps512_ps256(amax_ps), inv_c);
    let c_hi = estimate(_mm512_extractf32x8_ps::<1>(amax_ps), inv_c);
    let c0 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(c_lo), c_hi);
    // Both tables in registers, each looked up by four two-table permutes (32 entries
    // each, by the index's low 5 bits) and a select by its bits 5 and 6 (a gather is slower).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    fn lookup(table: &[u32; 128], idx: __m512i) -> __m512i {
        let mut t = [_mm512_setzero_si512(); 8];
        for (i, t) in t.iter_mut().enumerate() {
            // SAFETY: `table[16 i..]` holds 16 u32 (64 bytes); unaligned load.
            *t = unsafe { _mm512_loadu_si512(table[16 * i..].as_ptr().cast()) };
        }
        let quarter = |a: __m512i, b: __m512i| _mm512_permutex2var_epi32(a, idx, b);
        let bit5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
        let bit6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
        let low = _mm512_mask_blend_epi32(bit5, quarter(t[0], t[1]), quarter(t[2], t[3]));
        let high = _mm512_mask_blend_epi32(bit5, quarter(t[4], t[5]), quarter(t[6], t[7]));
        _mm512_mask_blend_epi32(bit6, low, high)
    }
    let (t, l) = (lookup(thresholds, c0), lookup(lower, c0));
    let one = _mm512_set1_epi32(1);
    let up = _mm512_cmplt_epu32_mask(t, amax);
    let down = _mm512_cmplt_epu32_mask(amax, l);
    let code = _mm512_mask_add_epi32(c0, up, c0, one);
    let code = _mm512_mask_sub_epi32(code, down, code, one);
    let nan = _mm512_cmpeq_epi32_mask(amax, inf);
    let code = _mm512_mask_blend_epi32(
        nan,
        code,
        _mm512_set1_epi32(crate::backend::nvfp4_plan::NAN_ROW as i32),
    );
    // SAFETY: `rows` holds 16 bytes; unaligned store.
    unsafe { _mm_storeu_si128(rows.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(code)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector rows equal the scalar rows block by block on maxima at, and one f32 unit
    /// around, every E4M3 scale threshold and scale value, on zero, NaN and ±Inf blocks,
    /// and on random blocks of mixed signs, under several tensor scales (one subnormal);
    /// maxima placed at every position of their block, blocks at every lane.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_rows_equal_the_scalar_rows() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl"))
        {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        use crate::backend::nvfp4_plan::scale_boundary_maxima;
        let mut checked = 0;
        for amax_t in [(2688.0 * 1.3) as f32, 1e-42, 3.0e-39, 1.0e30, 1.0] {
            let s_t = crate::format::Nvfp4::tensor_scale(amax_t as f64);
            let scales = Nvfp4Scales::new(s_t);
            let mut maxima: Vec<u32> = vec![0, 1, 0x7f80_0000, 0x7fc0_0000, 0x7f7f_ffff];
            maxima.extend(scale_boundary_maxima(s_t));
            let mut h = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..2000 {
                h = h
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                maxima.push((h >> 33) as u32 & 0x7fff_ffff);
            }
            maxima.retain(|m| f32::from_bits(*m).is_nan() || *m <= 0x7f80_0000);
            // Blocks: the maximum (signed as it comes) at position `p`, smaller elements of
            // both signs elsewhere; infinite maxima give NaN and Inf blocks.
            let mut xs = Vec::new();
            for (i, &m) in maxima.iter().enumerate() {
                let p = i % NVFP4_BLOCK;
                let x = f32::from_bits(m | (((i / 3) % 2) as u32) << 31);
                for j in 0..NVFP4_BLOCK {
                    let e = if j == p {
                        x
                    } else {
                        let frac = ((i * 7 + j * 13) % 97) as f32 / 97.0;
                        let y = if x.is_finite() { x * frac } else { frac };
                        if j % 3 == 0 {
                            -y
                        } else {
                            y
                        }
                    };
                    xs.push(e);
                }
            }
            let blocks = xs.len() / NVFP4_BLOCK;
            let mut want = vec![0u8; blocks];
            let mut got = vec![0u8; blocks];
            block_rows_scalar(&xs, &scales, &mut want);
            // SAFETY: the CPU supports AVX-512 F/BW/DQ/VL, checked above.
            unsafe { block_rows_avx512(&xs, &scales, &mut got) };
            for b in 0..blocks {
                assert_eq!(
                    got[b], want[b],
                    "s_t {s_t:e} block {b} max {:#x}",
                    maxima[b]
                );
            }
            // Every block at every lane: the same blocks shifted by one block at a time.
            for shift in 1..GROUP_BLOCKS {
                let xs = &xs[shift * NVFP4_BLOCK..];
                let n = xs.len() / NVFP4_BLOCK;
                // SAFETY: as above.
                unsafe { block_rows_avx512(xs, &scales, &mut got[..n]) };
                assert_eq!(got[..n], want[shift..], "s_t {s_t:e} shift {shift}");
            }
            checked += blocks;
        }
        assert!(checked > 4 * 2000);
    }
}
