//! The stochastic pass of [`LnsF32Plan`] in AVX-512 intrinsics: the same steps as
//! [`LnsF32Plan::round_stochastic`] on sixteen lanes at a time, with the three table
//! lookups (bucket, output offset, correction) as register permutes where the tables hold at
//! most 32 entries (`f <= 4`, lns<8,3> among them) and as gathers otherwise.
//!
//! The decision may differ from the portable code's only in which elements it leaves
//! undecided (a fused multiply-add rounds once where the portable code rounds twice; the
//! bound of the module docs covers both), so the results are the same bits.

use std::arch::x86_64::*;

use super::{LnsF32Plan, EXPM1_TERMS, EXPONENT, GROUP, MANTISSA, SIGN, TWO_23};

/// A table for 32-bit lookups: two registers of 16 entries (`SMALL`) or memory.
#[derive(Clone, Copy)]
struct Table {
    regs: [__m512i; 2],
    ptr: *const u32,
}

impl Table {
    /// The table of `values` (at most 32 entries when it is to be permuted).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new(values: &[u32]) -> Self {
        let mut padded = [0u32; 32];
        let n = values.len().min(32);
        padded[..n].copy_from_slice(&values[..n]);
        // SAFETY: `padded` holds 32 u32, two vectors of 64 bytes; unaligned loads.
        let regs = unsafe {
            [
                _mm512_loadu_si512(padded.as_ptr().cast()),
                _mm512_loadu_si512(padded[16..].as_ptr().cast()),
            ]
        };
        Table {
            regs,
            ptr: values.as_ptr(),
        }
    }

    /// The entries at `idx` (every index within the table).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn get<const SMALL: bool>(&self, idx: __m512i) -> __m512i {
        if SMALL {
            _mm512_permutex2var_epi32(self.regs[0], idx, self.regs[1])
        } else {
            // SAFETY: the caller's indices are within the table `ptr` points to.
            unsafe { _mm512_i32gather_epi32::<4>(idx, self.ptr.cast()) }
        }
    }
}

/// The stochastic pass over one run (see [`LnsF32Plan::pass`] for `src`, `out`, `flags`);
/// `drop` is `32 - b` and `kappa` `ln 2 / 2^f / 2^b`.
///
/// # Safety
///
/// The CPU must support AVX-512 F/BW/DQ/VL; `plan` must be a stochastic plan.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
pub(super) unsafe fn stochastic_pass(
    plan: &LnsF32Plan,
    src: Option<&[f32]>,
    out: &mut [f32],
    random: &[u32],
    flags: &mut [u16],
    drop: u32,
    kappa: f32,
) -> bool {
    match (plan.sr_small, plan.terms) {
        (true, 3) => groups::<true, 3>(plan, src, out, random, flags, drop, kappa),
        (true, 6) => groups::<true, 6>(plan, src, out, random, flags, drop, kappa),
        (true, _) => groups::<true, 10>(plan, src, out, random, flags, drop, kappa),
        (false, 3) => groups::<false, 3>(plan, src, out, random, flags, drop, kappa),
        (false, 6) => groups::<false, 6>(plan, src, out, random, flags, drop, kappa),
        (false, _) => groups::<false, 10>(plan, src, out, random, flags, drop, kappa),
    }
}

/// [`stochastic_pass`] with the table kind and the number of Taylor terms fixed.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn groups<const SMALL: bool, const N: usize>(
    plan: &LnsF32Plan,
    src: Option<&[f32]>,
    out: &mut [f32],
    random: &[u32],
    flags: &mut [u16],
    drop: u32,
    kappa: f32,
) -> bool {
    let buckets = Table::new(&plan.sr_buckets);
    let offsets = Table::new(&plan.sr_off);
    let corrections = Table::new(&plan.sr_corr);
    let sign_mask = _mm512_set1_epi32(SIGN as i32);
    let exponent = _mm512_set1_epi32(EXPONENT as i32);
    let mantissa = _mm512_set1_epi32(MANTISSA as i32);
    let low_mask = _mm512_set1_epi32(((1u32 << plan.shift) - 1) as i32);
    let toff_mask = _mm512_set1_epi32(((2u32 << plan.shift) - 1) as i32);
    let shift = _mm_cvtsi32_si128(plan.shift as i32);
    let code_shift = _mm_cvtsi32_si128(plan.shift as i32 + 1);
    let f = _mm_cvtsi32_si128(plan.f as i32);
    let drop_v = _mm_cvtsi32_si128(drop as i32);
    let one = _mm512_set1_epi32(1);
    let two_23 = _mm512_set1_epi32(TWO_23 as i32);
    let bias = _mm512_set1_epi32(plan.bias);
    let k_min = _mm512_set1_epi32(plan.k_min);
    let k_max = _mm512_set1_epi32(plan.k_max);
    let max_bits = _mm512_set1_epi32(plan.max_bits as i32);
    let kappa_v = _mm512_set1_ps(kappa);
    let margin = _mm512_set1_ps(plan.margin);
    let neg_margin = _mm512_set1_ps(-plan.margin);
    let n = out.len();
    let full = n - n % GROUP;
    let mut any = 0u16;
    for (g, flag) in (0..full).step_by(GROUP).zip(flags.iter_mut()) {
        // SAFETY: `g + 16 <= full <= len` for `src`, `out` and `random`; unaligned loads.
        let (bits, r) = unsafe {
            let x = match src {
                Some(s) => s[g..g + GROUP].as_ptr(),
                None => out[g..g + GROUP].as_ptr(),
            };
            (
                _mm512_loadu_si512(x.cast()),
                _mm512_loadu_si512(random[g..g + GROUP].as_ptr().cast()),
            )
        };
        let sign = _mm512_and_si512(bits, sign_mask);
        let abs = _mm512_andnot_si512(sign_mask, bits);
        let byte = _mm512_srli_epi32::<23>(abs);
        let nonzero = _mm512_test_epi32_mask(abs, abs);
        let m = _mm512_and_si512(abs, mantissa);
        // j from the toward-zero bucket: its first code, one more from its threshold on.
        let e = buckets.get::<SMALL>(_mm512_srl_epi32(m, shift));
        let step = _mm512_cmpge_epu32_mask(
            _mm512_and_si512(m, low_mask),
            _mm512_and_si512(e, toff_mask),
        );
        let j0 = _mm512_srl_epi32(e, code_shift);
        let j = _mm512_mask_add_epi32(j0, step, j0, one);
        let k = _mm512_sub_epi32(_mm512_add_epi32(_mm512_sll_epi32(byte, f), j), bias);
        // Exponent bytes 1..=253, and no underflow.
        let odd_byte = _mm512_cmpgt_epu32_mask(_mm512_sub_epi32(byte, one), _mm512_set1_epi32(252));
        let mut slow = (odd_byte | _mm512_cmplt_epi32_mask(k, k_min)) & nonzero;
        // D = X - A_j against G' = A_j P + corr'_j.
        let off = offsets.get::<SMALL>(j);
        let corr = _mm512_castsi512_ps(corrections.get::<SMALL>(j));
        let x = _mm512_castsi512_ps(_mm512_or_si512(two_23, m));
        let a_j = _mm512_castsi512_ps(_mm512_add_epi32(two_23, off));
        let rb = _mm512_add_epi32(_mm512_srl_epi32(r, drop_v), one);
        let a = _mm512_mul_ps(_mm512_cvtepi32_ps(rb), kappa_v);
        let mut s = _mm512_set1_ps(EXPM1_TERMS[N - 1]);
        for &q in EXPM1_TERMS[..N - 1].iter().rev() {
            s = _mm512_fmadd_ps(s, a, _mm512_set1_ps(q));
        }
        let g_est = _mm512_fmadd_ps(a_j, _mm512_mul_ps(a, s), corr);
        let diff = _mm512_sub_ps(_mm512_sub_ps(x, a_j), g_est);
        let up = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(diff, margin);
        let down = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(diff, neg_margin);
        slow |= !(up | down) & nonzero;
        let j_out = _mm512_mask_add_epi32(j, up, j, one);
        let k_out = _mm512_mask_add_epi32(k, up, k, one);
        let value = _mm512_or_si512(
            _mm512_add_epi32(_mm512_and_si512(abs, exponent), offsets.get::<SMALL>(j_out)),
            sign,
        );
        let over = _mm512_cmpgt_epi32_mask(k_out, k_max);
        let value = _mm512_mask_blend_epi32(over, value, _mm512_or_si512(max_bits, sign));
        // Zeros give +0; elements left to the scalar path keep their input.
        let value = _mm512_maskz_mov_epi32(nonzero, value);
        let result = _mm512_mask_blend_epi32(slow, value, bits);
        // SAFETY: `g + 16 <= len`; unaligned store.
        unsafe { _mm512_storeu_si512(out[g..g + GROUP].as_mut_ptr().cast(), result) };
        *flag = slow;
        any |= slow;
    }
    if full < n {
        let mut mask = 0u16;
        for j in full..n {
            let x = src.map_or(out[j], |s| s[j]).to_bits();
            let (bits, slow) = plan.round_stochastic::<N>(x, random[j], drop, kappa);
            out[j] = f32::from_bits(bits);
            mask |= (slow as u16) << (j - full);
        }
        flags[full / GROUP] = mask;
        any |= mask;
    }
    any != 0
}
