//! f32 operands straight to the integers of the i16 quire: `round(x) · 2^s` by one table
//! look-up, for posits with `maxpos = 2^s` and `2s <= 12` ([`super::int_dot::applies`]).
//!
//! Rounding to the posit, `R(x)` (nearest, ties to the even pattern), is a non-decreasing
//! step function of `x`, and for `x >= 0` the f32 bit pattern orders like the value. Keys
//! come from the magnitude's bits `b`, first clamped to `[lo, hi]` with `lo` the bits of
//! `2^(-s-2)` and `hi` those of `2^(s+1)`:
//!
//! * `d = clamp(b) - lo`, its top bits `q = d >> sh` and a sticky bit (any of the `sh` lower
//!   bits set); the key is `2q + sticky`. Two f32s with one key lie in `{lo + q·2^sh}` or in
//!   the open interval `(lo + q·2^sh, lo + (q+1)·2^sh)`, and `R` is constant on the second
//!   exactly when it takes one value at its ends `lo + q·2^sh + 1` and `lo + (q+1)·2^sh - 1`
//!   (`R` is monotone).
//! * The clamps: every magnitude above `hi` shares the key of `hi`, which is right when
//!   `R(hi) = R(f32::MAX)` (the posit saturates at maxpos); every non-zero magnitude below
//!   `lo` shares the key of `lo`, right when `R(lo)` equals `R` of the smallest subnormal
//!   (a posit never rounds a non-zero to zero).
//!
//! The table is built for the fewest key bits `23 - sh` for which all of this holds, checked
//! at every key (two roundings each), so each entry is `R` of every f32 with its key. Zero
//! (either sign) gives 0, NaN and ±Inf give NaR. Negative inputs have a table of their own,
//! so nothing is assumed about symmetry.
//!
//! [`IntOperand::fill`] converts a matrix in either layout. Rows stored contiguously of
//! posit<n,0> (`n <= 8`, posit<8,0> among them) need no table where the CPU has AVX2: the
//! magic-constant rounding of [`super::es0_lanes`] gives sixteen integers a step. Those of
//! other posits, on CPUs with AVX-512, take the clamps and keys sixteen f32s at a time
//! (eight with AVX2); the keys of a block of 256 are then looked up by scalar loads (a
//! vector gather was slower on the AMD EPYC these benches ran on). `tests/quire_i16.rs` compares the look-up and the fill (both paths,
//! both layouts) with the quantize kernel on a dense sample of f32s (every 13-bit
//! significand prefix in each binade around the posit's range, and a stride over all f32s),
//! and on every f32 in an ignored test (posit<8,0>: the magic-constant path under the AVX2
//! cap, the table's keys under the others).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::es0_lanes::Es0Lanes;
use crate::backend::isa::{self, Isa};
use crate::format::grid::pow2;
use crate::format::rounding::NearestEven;
use crate::format::Posit;

/// Keys computed by the vector kernel before they are looked up (a multiple of 16).
#[cfg(target_arch = "x86_64")]
const KEY_BLOCK: usize = 256;

/// The widest key tried (significand bits of the f32 kept in the key).
const MAX_KEY_BITS: u32 = 12;

/// `x ↦ R(x) · 2^s` for a posit with `maxpos = 2^s`, by table (see the module docs).
#[derive(Debug)]
pub struct IntOperand {
    /// Bits of the smallest magnitude with a key of its own.
    lo: u32,
    /// Bits of the largest.
    hi: u32,
    /// Bits of the clamped magnitude below the key.
    shift: u32,
    /// Per sign (positive, negative), one entry per key `2q + sticky`.
    tables: [Vec<i16>; 2],
    /// Both tables, negative after positive, then a 0 (the vector kernel's look-ups).
    joined: Vec<i16>,
    /// The table-free rounding of posit<n,0> in vector lanes, where it applies.
    es0: Option<Es0Lanes>,
}

impl IntOperand {
    /// The table of `posit` (built once per process), or `None` where its values are not
    /// i16 multiples of minpos or no key of at most 12 bits decides the rounding.
    pub fn get(posit: Posit) -> Option<Arc<IntOperand>> {
        type Cache = Mutex<HashMap<Posit, Option<Arc<IntOperand>>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let mut cache = CACHE.get_or_init(Default::default).lock().ok()?;
        cache
            .entry(posit)
            .or_insert_with(|| IntOperand::build(posit).map(Arc::new))
            .clone()
    }

    fn build(posit: Posit) -> Option<IntOperand> {
        let s = posit.max_scale();
        if !super::int_dot::applies(s) || s < 0 {
            return None;
        }
        let scale = pow2(s);
        // R(x) · 2^s as an i16, `None` where it is not one.
        let int = |bits: u32| -> Option<i16> {
            let v = posit.round(f64::from(f32::from_bits(bits)), NearestEven, 0) * scale;
            (v == v.trunc() && v.abs() <= f64::from(i16::MAX)).then_some(v as i16)
        };
        let lo = ((127 - s - 2) as u32) << 23;
        let hi = ((127 + s + 1) as u32) << 23;
        (1..=MAX_KEY_BITS).find_map(|key_bits| {
            let shift = 23 - key_bits;
            let top = (hi - lo) >> shift;
            let mut tables = [Vec::new(), Vec::new()];
            for (side, table) in tables.iter_mut().enumerate() {
                let sign = (side as u32) << 31;
                let r = |mag: u32| int(sign | mag);
                if r(hi)? != r(f32::MAX.to_bits())? || r(lo)? != r(1)? {
                    return None;
                }
                for q in 0..=top {
                    let start = lo + (q << shift);
                    table.push(r(start)?);
                    if q == top {
                        // Only `hi` itself has this `q` (larger magnitudes are clamped).
                        table.push(r(start)?);
                    } else {
                        let inside = r(start + 1)?;
                        if inside != r(start + (1 << shift) - 1)? {
                            return None;
                        }
                        table.push(inside);
                    }
                }
            }
            let mut joined: Vec<i16> = tables.concat();
            joined.push(0);
            Some(IntOperand {
                lo,
                hi,
                shift,
                tables,
                joined,
                es0: Es0Lanes::new(posit),
            })
        })
    }

    /// `R(x) · 2^s`, or `None` for NaN and ±Inf (NaR).
    #[inline]
    pub fn int(&self, x: f32) -> Option<i16> {
        let bits = x.to_bits();
        let mag = bits & 0x7fff_ffff;
        if mag >= 0x7f80_0000 {
            return None;
        }
        let d = mag.clamp(self.lo, self.hi) - self.lo;
        let sticky = u32::from(d & ((1 << self.shift) - 1) != 0);
        let key = ((d >> self.shift) << 1 | sticky) as usize;
        let v = self.tables[(bits >> 31) as usize][key];
        Some(if mag == 0 { 0 } else { v })
    }

    /// [`IntOperand::int`] of every `src[t]` into `dst[t]` (0 for NaR), one at a time (the
    /// vector rows' last values); whether any is NaR.
    #[cfg(target_arch = "x86_64")]
    fn ints(&self, src: &[f32], dst: &mut [i16]) -> bool {
        let mut bad = false;
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = self.int(x).unwrap_or_else(|| {
                bad = true;
                0
            });
        }
        bad
    }

    /// [`IntOperand::int`] of every `src[t]` into `dst[t]` (0 for NaR): the same clamps and
    /// key computed sixteen at a time, then looked up; whether any is NaR.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn row_avx512(&self, src: &[f32], dst: &mut [i16]) -> bool {
        use std::arch::x86_64::*;
        let len = src.len().min(dst.len());
        let splat = |v: u32| _mm512_set1_epi32(v as i32);
        let (lo, hi, low_bits) = (splat(self.lo), splat(self.hi), splat((1 << self.shift) - 1));
        let (abs, inf, one) = (splat(0x7fff_ffff), splat(0x7f80_0000), splat(1));
        let negative_side = splat(self.tables[0].len() as u32);
        let shift = _mm_cvtsi32_si128(self.shift as i32);
        let zero_key = splat(self.joined.len() as u32 - 1);
        let mut bad: __mmask16 = 0;
        let mut keys = [0u32; KEY_BLOCK];
        for start in (0..len).step_by(KEY_BLOCK) {
            let end = (start + KEY_BLOCK).min(len);
            let mut t = start;
            while t < end {
                let left = end - t;
                let m: __mmask16 = if left >= 16 { !0 } else { (1u16 << left) - 1 };
                // SAFETY: the mask enables elements t..t + min(16, left) of `src`, in bounds.
                let bits =
                    unsafe { _mm512_maskz_loadu_epi32(m, src.as_ptr().add(t) as *const i32) };
                let mag = _mm512_and_si512(bits, abs);
                let nar = _mm512_mask_cmpge_epu32_mask(m, mag, inf);
                bad |= nar;
                let d = _mm512_sub_epi32(_mm512_min_epu32(_mm512_max_epu32(mag, lo), hi), lo);
                let q = _mm512_srl_epi32(d, shift);
                let q2 = _mm512_add_epi32(q, q);
                let key = _mm512_mask_add_epi32(q2, _mm512_test_epi32_mask(d, low_bits), q2, one);
                let neg = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
                let key = _mm512_mask_add_epi32(key, neg, key, negative_side);
                // Zero and NaR read the 0 after both tables.
                let live = !nar & _mm512_test_epi32_mask(mag, mag);
                let key = _mm512_mask_mov_epi32(zero_key, live, key);
                // SAFETY: `t - start + 16 <= KEY_BLOCK` (blocks are multiples of 16).
                unsafe {
                    _mm512_storeu_si512(keys.as_mut_ptr().add(t - start) as *mut __m512i, key)
                };
                t += 16;
            }
            // The look-ups, scalar (a vector gather is slower on some CPUs) and a block
            // after the keys' stores: every key is below the length of `joined`
            // (`d <= hi - lo`, so `2q + 1` is below one sign's table; the negative side is
            // offset by it).
            for (d, &key) in dst[start..end].iter_mut().zip(&keys) {
                *d = self.joined[key as usize];
            }
        }
        bad != 0
    }

    /// [`IntOperand::row_avx512`] eight keys at a time on AVX2 (no masks: compares and
    /// blends, the last `len % 8` by [`IntOperand::int`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn row_avx2(&self, src: &[f32], dst: &mut [i16]) -> bool {
        use std::arch::x86_64::*;
        let len = src.len().min(dst.len());
        let whole = len - len % 8;
        let splat = |v: u32| _mm256_set1_epi32(v as i32);
        let (lo, hi, low_bits) = (splat(self.lo), splat(self.hi), splat((1 << self.shift) - 1));
        let (abs, inf) = (splat(0x7fff_ffff), splat(0x7f80_0000 - 1));
        let negative_side = splat(self.tables[0].len() as u32);
        let shift = _mm_cvtsi32_si128(self.shift as i32);
        let zero_key = splat(self.joined.len() as u32 - 1);
        let zero = _mm256_setzero_si256();
        let mut bad = zero;
        let mut keys = [0u32; KEY_BLOCK];
        for start in (0..whole).step_by(KEY_BLOCK) {
            let end = (start + KEY_BLOCK).min(whole);
            for t in (start..end).step_by(8) {
                // SAFETY: elements t..t + 8 of `src`, in bounds (`t + 8 <= whole`).
                let bits = unsafe { _mm256_loadu_si256(src.as_ptr().add(t).cast()) };
                let mag = _mm256_and_si256(bits, abs);
                // Magnitudes (at most 2^31 - 1) compare as signed integers.
                let nar = _mm256_cmpgt_epi32(mag, inf);
                bad = _mm256_or_si256(bad, nar);
                let d = _mm256_sub_epi32(_mm256_min_epu32(_mm256_max_epu32(mag, lo), hi), lo);
                let q = _mm256_srl_epi32(d, shift);
                // Sticky: `1 + (-1 where none of the low bits is set, else 0)`.
                let none = _mm256_cmpeq_epi32(_mm256_and_si256(d, low_bits), zero);
                let sticky = _mm256_add_epi32(none, splat(1));
                let key = _mm256_add_epi32(_mm256_add_epi32(q, q), sticky);
                let neg = _mm256_cmpgt_epi32(zero, bits);
                let key = _mm256_add_epi32(key, _mm256_and_si256(neg, negative_side));
                // Zero and NaR read the 0 after both tables.
                let dead = _mm256_or_si256(nar, _mm256_cmpeq_epi32(mag, zero));
                let key = _mm256_blendv_epi8(key, zero_key, dead);
                // SAFETY: `t - start + 8 <= KEY_BLOCK` (blocks are multiples of 8).
                unsafe { _mm256_storeu_si256(keys.as_mut_ptr().add(t - start).cast(), key) };
            }
            // The look-ups, scalar, as in the AVX-512 kernel (every key is below the
            // length of `joined`).
            for (d, &key) in dst[start..end].iter_mut().zip(&keys) {
                *d = self.joined[key as usize];
            }
        }
        let tail_bad = self.ints(&src[whole..len], &mut dst[whole..len]);
        _mm256_movemask_epi8(bad) != 0 || tail_bad
    }

    /// [`IntOperand::row_es0_avx2`] in AVX-512 lanes, sixteen at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn row_es0_avx512(&self, es0: &Es0Lanes, src: &[f32], dst: &mut [i16]) -> bool {
        use std::arch::x86_64::*;
        let len = src.len().min(dst.len());
        let whole = len - len % 16;
        let mut bad: __mmask16 = 0;
        for (s, d) in src[..whole].chunks_exact(16).zip(dst.chunks_exact_mut(16)) {
            // SAFETY: 16 f32 read from `s`.
            let bits = unsafe { _mm512_loadu_si512(s.as_ptr().cast()) };
            let (units, nar) = es0.units_avx512(bits);
            bad |= nar;
            // The i32 units (at most 4096 in magnitude) narrowed to i16.
            // SAFETY: `d` holds 16 i16, 32 bytes.
            unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), _mm512_cvtepi32_epi16(units)) };
        }
        let tail_bad = self.ints(&src[whole..len], &mut dst[whole..len]);
        bad != 0 || tail_bad
    }

    /// [`IntOperand::int`] of every `src[t]` into `dst[t]` (0 for NaR) for posit<n,0>,
    /// sixteen at a time by the magic-constant rounding ([`Es0Lanes`]), no look-ups; the
    /// last `len % 16` by [`IntOperand::int`]. Whether any is NaR.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn row_es0_avx2(&self, es0: &Es0Lanes, src: &[f32], dst: &mut [i16]) -> bool {
        use std::arch::x86_64::*;
        let len = src.len().min(dst.len());
        let whole = len - len % 16;
        let mut bad = _mm256_setzero_si256();
        for (s, d) in src[..whole].chunks_exact(16).zip(dst.chunks_exact_mut(16)) {
            // SAFETY: 16 f32 read from `s`, 16 i16 written to `d`.
            let (lo, hi) = unsafe {
                (
                    _mm256_loadu_si256(s.as_ptr().cast()),
                    _mm256_loadu_si256(s.as_ptr().add(8).cast()),
                )
            };
            let (lo, lo_nar) = es0.units_avx2(lo);
            let (hi, hi_nar) = es0.units_avx2(hi);
            bad = _mm256_or_si256(bad, _mm256_or_si256(lo_nar, hi_nar));
            // The i32 units (at most 4096) packed to i16 per 128-bit half, then in order.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
            // SAFETY: `d` holds 16 i16, 32 bytes.
            unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), packed) };
        }
        let tail_bad = self.ints(&src[whole..len], &mut dst[whole..len]);
        _mm256_movemask_epi8(bad) != 0 || tail_bad
    }

    /// `dst (rows x cols, row-major) = R(X) · 2^s` of a matrix `X` that `src` holds row-major
    /// (`rows x cols`), or, where `transposed`, as its transpose (`cols x rows`); `nar[r]` set
    /// where row `r` of `X` holds a NaN or ±Inf (NaR; 0 stored for it). `parallel` spreads
    /// rows over the rayon pool.
    pub fn fill(
        &self,
        src: &[f32],
        transposed: bool,
        (rows, cols): (usize, usize),
        dst: &mut [i16],
        nar: &mut [bool],
        parallel: bool,
    ) {
        self.fill_padded(src, transposed, (rows, cols), (dst, cols), nar, parallel);
    }

    /// [`IntOperand::fill`] into rows of `stride >= cols` values, the last `stride - cols` of
    /// each row set to 0 (so that dot products over whole padded rows are unchanged).
    pub fn fill_padded(
        &self,
        src: &[f32],
        transposed: bool,
        (rows, cols): (usize, usize),
        (dst, stride): (&mut [i16], usize),
        nar: &mut [bool],
        parallel: bool,
    ) {
        use rayon::prelude::*;
        assert!(stride >= cols);
        assert!(src.len() >= rows * cols && dst.len() >= rows * stride && nar.len() >= rows);
        if cols == 0 {
            nar[..rows].fill(false);
            dst[..rows * stride].fill(0);
            return;
        }
        let isa = isa::active();
        let vector = !transposed && isa >= Isa::Avx2;
        let row = |(r, (out, flag)): (usize, (&mut [i16], &mut bool))| {
            let (out, pad) = out.split_at_mut(cols);
            pad.fill(0);
            let mut bad = false;
            let mut put = |d: &mut i16, x: f32| match self.int(x) {
                Some(v) => *d = v,
                None => {
                    *d = 0;
                    bad = true;
                }
            };
            if vector {
                #[cfg(target_arch = "x86_64")]
                {
                    let row = &src[r * cols..r * cols + cols];
                    *flag = if let Some(es0) = &self.es0 {
                        if isa == Isa::Avx512 {
                            // SAFETY: the CPU has AVX-512 F (`isa::active`).
                            unsafe { self.row_es0_avx512(es0, row, out) }
                        } else {
                            // SAFETY: the CPU has AVX2 (`isa::active`).
                            unsafe { self.row_es0_avx2(es0, row, out) }
                        }
                    } else if isa == Isa::Avx512 {
                        // SAFETY: the CPU has AVX-512 F and BW (`isa::active`).
                        unsafe { self.row_avx512(row, out) }
                    } else {
                        // SAFETY: the CPU has AVX2 (`isa::active`).
                        unsafe { self.row_avx2(row, out) }
                    };
                    return;
                }
            }
            if transposed {
                for (c, d) in out.iter_mut().enumerate() {
                    put(d, src[c * rows + r]);
                }
            } else {
                for (d, &x) in out.iter_mut().zip(&src[r * cols..r * cols + cols]) {
                    put(d, x);
                }
            }
            *flag = bad;
        };
        let (dst, nar) = (&mut dst[..rows * stride], &mut nar[..rows]);
        if parallel {
            dst.par_chunks_mut(stride)
                .zip(nar.par_iter_mut())
                .enumerate()
                .with_min_len(16)
                .for_each(row);
        } else {
            dst.chunks_mut(stride)
                .zip(nar.iter_mut())
                .enumerate()
                .for_each(row);
        }
    }
}
