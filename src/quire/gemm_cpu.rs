//! The GEMM kernels behind the quire and naive ops: `C (m x n) = A (m x k) · B (k x n) [+ bias]`
//! on row-major f64 slices whose values already lie on the format's grid.
//!
//! The exact (quire) product picks the cheapest accumulator that is still exact for the
//! format and `k` (the bias counts as one more term). Every term is an integer multiple of
//! `minpos^2 = 2^-2s` of magnitude at most `2^2s` (see [`super::accumulator`]), so in
//! units of `minpos^2` a sum of `T` terms is an integer below `T · 2^4s`:
//!
//! * [`Accumulator::I16`] when also `2s <= 12` (posit<8,0>): i16 operands, exact integer
//!   dot products with `pmaddwd`-style multiply-adds ([`super::quire_i16`]).
//! * [`Accumulator::F64`] when `T · 2^4s <= 2^53`: every partial sum is an f64 integer
//!   multiple of `minpos^2`, so any summation order is exact and the GEMM is an ordinary f64
//!   GEMM (the `gemm` crate's). posit<8,0> (`s = 6`) is exact this way for `k < 2^29`.
//! * [`Accumulator::F64Checked`] otherwise, when `2s <= 900` and `T <= 2^32` (every posit
//!   with a quire, up to 2^32 terms): an ordinary f64 GEMM whose rounding to the posit is
//!   proved by a rigorous bound on its error, the outputs near a rounding boundary summed
//!   exactly ([`super::gemm_checked`], whose docs prove it). posit<8,1> (from 32 terms),
//!   posit<8,2>, posit<16,1> and posit<32,2> take this path.
//! * [`Accumulator::I128`] when `2s <= 62` and `T · 2^4s < 2^126`: operands become i64
//!   multiples of minpos and products are summed in i128.
//! * [`Accumulator::Wide`] otherwise: a [`Quire`] per output. Where `2s <= 62` (only the
//!   number of terms is too large) the products are still summed in i128, in chunks of
//!   `2^(126 - 4s)` terms, and only each chunk's exact sum goes into the quire.
//!
//! The last two are no longer picked for any posit with a quire (the checked path applies
//! first), but stay as exact paths of their own: [`quire_gemm_with`] runs any accumulator
//! that is exact for the format, and the tests compare them all.
//!
//! Each output is then rounded once to the posit format (nearest, ties to the even pattern).
//! A NaR operand (NaN, or ±Inf, which is no posit value) makes its row or column of
//! outputs NaR.
//!
//! The naive product rounds after every multiply and every add, `k` ascending, starting
//! from zero: `c = round(c + round(a_t · b_t))`, then `c = round(c + bias)`. posit<8,0>
//! runs in i16 vector lanes ([`super::naive_p8`]); other posits and floats with a NaN
//! pattern of at most 8 bits use exact 256 x 256 operation tables on the patterns
//! ([`OpTables`]); the others compute each operation in f64 rounded to odd and
//! round that once ([`super::round_odd`]), which is the correctly rounded operation, a whole
//! output row at a time through the format's f32 fast path where that applies
//! ([`super::naive_f32`]), else, for the wider posits (posit<32,2>, ...), with the posit
//! rounding on the f64 pattern and AVX-512 tiles ([`super::naive_posit_f64`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use gemm::Parallelism;
use rayon::prelude::*;

use super::accumulator::Quire;
use super::gemm_checked;
use super::naive_f32::NaiveF32;
use super::naive_posit_f64::{naive_gemm_reference, NaivePositF64};
use super::quire_i16;
use super::round_odd::{add_odd, i128_to_f64_odd, mul_odd};
use crate::format::grid::pow2;
use crate::format::rounding::NearestEven;
use crate::format::{Format, Posit, Specials};

/// How a GEMM's bias is laid out.
#[derive(Debug, Clone, Copy)]
pub enum Bias<'a> {
    /// No bias.
    None,
    /// One value per output row (a convolution's per-channel bias, `m` values).
    PerRow(&'a [f64]),
    /// One value per output column (a linear layer's bias, `n` values).
    PerCol(&'a [f64]),
}

impl Bias<'_> {
    /// The bias term of output `(i, j)`, if any.
    #[inline(always)]
    pub(crate) fn at(&self, i: usize, j: usize) -> Option<f64> {
        match self {
            Bias::None => None,
            Bias::PerRow(b) => Some(b[i]),
            Bias::PerCol(b) => Some(b[j]),
        }
    }

    fn terms(&self) -> usize {
        usize::from(!matches!(self, Bias::None))
    }
}

/// The exact accumulator chosen for a quire GEMM (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulator {
    /// i16 operands in units of minpos, i32 partial sums of 64 products, i64 totals
    /// ([`super::int_dot`]).
    I16,
    /// An f64 GEMM, exact because every partial sum fits 53 bits.
    F64,
    /// An f64 GEMM whose rounding is proved by an error bound, the outputs it cannot decide
    /// summed exactly ([`super::gemm_checked`]).
    F64Checked,
    /// i64 operands in units of minpos, i128 sums.
    I128,
    /// A full quire per output.
    Wide,
}

/// The exact accumulator for `posit` and `terms` summed products: the first of
/// [`Accumulator::I16`], [`Accumulator::F64`], [`Accumulator::F64Checked`],
/// [`Accumulator::I128`] and [`Accumulator::Wide`] that applies.
pub fn accumulator_for(posit: Posit, terms: usize) -> Accumulator {
    let bits_needed = bits_needed(posit, terms);
    if super::int_dot::applies(posit.max_scale()) && bits_needed <= 53 {
        Accumulator::I16
    } else if bits_needed <= 53 {
        Accumulator::F64
    } else if gemm_checked::applies(posit, terms) {
        Accumulator::F64Checked
    } else if 2 * posit.max_scale() <= 62 && bits_needed <= 126 {
        Accumulator::I128
    } else {
        Accumulator::Wide
    }
}

/// Bits of the largest exact sum of `terms` products, in units of minpos²: `4s` plus the
/// bit length of `terms` (zero terms count as one).
fn bits_needed(posit: Posit, terms: usize) -> u32 {
    4 * posit.max_scale() as u32 + usize::BITS - terms.max(1).leading_zeros()
}

/// Whether `accumulator` is exact for `posit` and `terms` summed products (the I128 path
/// takes any number of terms, in chunks; the quire any posit it supports).
pub fn accumulator_exact(accumulator: Accumulator, posit: Posit, terms: usize) -> bool {
    let s = posit.max_scale();
    match accumulator {
        Accumulator::I16 => super::int_dot::applies(s) && bits_needed(posit, terms) <= 53,
        Accumulator::F64 => bits_needed(posit, terms) <= 53,
        Accumulator::F64Checked => gemm_checked::applies(posit, terms),
        Accumulator::I128 => 2 * s <= 62,
        Accumulator::Wide => true,
    }
}

/// Matrix sizes `(m, k, n)`.
pub type Dims = (usize, usize, usize);

/// `out (m x n) = round(A · B + bias)` with one exact accumulation per output, by the
/// accumulator [`accumulator_for`] picks. `parallel` spreads rows over the rayon pool
/// (leave it off inside an outer parallel loop).
pub fn quire_gemm(
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    let accumulator = accumulator_for(posit, dims.1 + bias.terms());
    gemm_with(accumulator, posit, a, b, dims, bias, out, parallel);
}

/// [`quire_gemm`] by the given accumulator (every one gives the same bits where it is
/// exact); an error where it is not exact for the format and the number of terms
/// ([`accumulator_exact`]).
#[allow(clippy::too_many_arguments)]
pub fn quire_gemm_with(
    accumulator: Accumulator,
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) -> Result<(), String> {
    let terms = dims.1 + bias.terms();
    if !accumulator_exact(accumulator, posit, terms) {
        return Err(format!(
            "the {accumulator:?} accumulator is not exact for posit<{},{}> with {terms} terms",
            posit.n(),
            posit.es()
        ));
    }
    gemm_with(accumulator, posit, a, b, dims, bias, out, parallel);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn gemm_with(
    accumulator: Accumulator,
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    let (m, k, n) = dims;
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    let round = |x: f64| posit.round(x, NearestEven, 0);
    match accumulator {
        Accumulator::F64 => {
            for i in 0..m {
                for j in 0..n {
                    out[i * n + j] = bias.at(i, j).unwrap_or(0.0);
                }
            }
            let par = if parallel && m * n * k >= 1 << 15 {
                Parallelism::Rayon(rayon::current_num_threads())
            } else {
                Parallelism::None
            };
            dgemm(dims, a, b, out, par);
            if parallel {
                out[..m * n].par_iter_mut().for_each(|v| *v = round(*v));
            } else {
                out[..m * n].iter_mut().for_each(|v| *v = round(*v));
            }
        }
        Accumulator::I16 => quire_i16::gemm_f64(posit, a, b, dims, bias, out, parallel),
        Accumulator::F64Checked => {
            gemm_checked::gemm_f64(posit, a, b, dims, bias, out, parallel);
        }
        Accumulator::I128 => i128_gemm(posit, a, b, dims, bias, out, parallel),
        Accumulator::Wide if 2 * posit.max_scale() <= 62 => {
            i128_gemm(posit, a, b, dims, bias, out, parallel)
        }
        Accumulator::Wide => {
            let row = |i: usize, dst: &mut [f64]| {
                let mut q = Quire::new(posit).expect("formats are checked by the ops");
                for (j, o) in dst.iter_mut().enumerate() {
                    q.clear();
                    if let Some(v) = bias.at(i, j) {
                        q.add_exact_product(v, 1.0);
                    }
                    for t in 0..k {
                        q.add_exact_product(a[i * k + t], b[t * n + j]);
                    }
                    *o = q.to_posit();
                }
            };
            for_rows(out, m, n, parallel, row);
        }
    }
}

/// The i128 quire GEMM (`2s <= 62`): operands as i64 multiples of minpos, products summed
/// in i128 four outputs at a time. Where the sum may pass 2^126 (more than `2^(126 - 4s)`
/// terms), the products are summed in chunks of that many, each chunk's exact sum (and the
/// bias) gathered in a [`Quire`]: the same exact total, one rounding.
fn i128_gemm(
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    let (m, k, n) = dims;
    let s = posit.max_scale();
    let scale = pow2(s);
    let to_int = |v: f64| (v * scale) as i64;
    let ops = IntOperands::new(a, b, dims, to_int);
    let unit = pow2(-2 * s);
    let chunk = 1usize
        .checked_shl((126 - 4 * s) as u32)
        .unwrap_or(usize::MAX)
        .max(1);
    let one_chunk = k + bias.terms() <= chunk;
    let round = |x: f64| posit.round(x, NearestEven, 0);
    let row = |i: usize, dst: &mut [f64]| {
        let ar = &ops.a[i * k..i * k + k];
        let mut j = 0;
        while j < n {
            // The last one to three columns: pad the tile with the last column.
            let cols = (n - j).min(4);
            let br = [0, 1, 2, 3].map(|c| {
                let col = j + c.min(cols - 1);
                &ops.bt[col * k..col * k + k]
            });
            let totals: [f64; 4] = if one_chunk {
                let sums = dot4_i128(ar, br);
                std::array::from_fn(|c| {
                    let bias_v = bias.at(i, j + c.min(cols - 1));
                    let acc = sums[c] + bias_v.map_or(0, |v| (to_int(v) as i128) << s);
                    round(i128_to_f64_odd(acc) * unit)
                })
            } else {
                let new_quire = || Quire::new(posit).expect("formats are checked by the ops");
                let mut quires: [Quire; 4] = std::array::from_fn(|_| new_quire());
                for (start, end) in (0..k).step_by(chunk).map(|t| (t, (t + chunk).min(k))) {
                    let part = dot4_i128(&ar[start..end], br.map(|r| &r[start..end]));
                    for (q, v) in quires.iter_mut().zip(part) {
                        q.add_units(v);
                    }
                }
                std::array::from_fn(|c| {
                    if let Some(v) = bias.at(i, j + c.min(cols - 1)) {
                        quires[c].add_exact_product(v, 1.0);
                    }
                    quires[c].to_posit()
                })
            };
            for (c, &v) in totals[..cols].iter().enumerate() {
                dst[j + c] = if ops.nar(i, j + c, bias.at(i, j + c)) {
                    f64::NAN
                } else {
                    v
                };
            }
            j += 4;
        }
    };
    for_rows(out, m, n, parallel, row);
}

/// Four exact dot products of `a` with `b[0..4]` in i128 (the caller bounds the length).
fn dot4_i128(a: &[i64], b: [&[i64]; 4]) -> [i128; 4] {
    let mut acc = [0i128; 4];
    for (t, &x) in a.iter().enumerate() {
        let x = x as i128;
        for (s, r) in acc.iter_mut().zip(&b) {
            *s += x * r[t] as i128;
        }
    }
    acc
}

/// GEMM operands as integer multiples of minpos: `a` row-major, `b` transposed so that each
/// output is a contiguous dot product; rows of `a` and columns of `b` holding a NaR (or any
/// non-finite value) are flagged, their outputs being NaR.
struct IntOperands<T> {
    a: Vec<T>,
    bt: Vec<T>,
    row_nar: Vec<bool>,
    col_nar: Vec<bool>,
}

impl<T: Copy + Default> IntOperands<T> {
    fn new(a: &[f64], b: &[f64], (m, k, n): Dims, to_int: impl Fn(f64) -> T) -> Self {
        let mut bt = vec![T::default(); k * n];
        for t in 0..k {
            for j in 0..n {
                bt[j * k + t] = to_int(b[t * n + j]);
            }
        }
        IntOperands {
            a: a[..m * k].iter().map(|&v| to_int(v)).collect(),
            bt,
            row_nar: (0..m).map(|i| not_finite(&a[i * k..i * k + k])).collect(),
            col_nar: (0..n)
                .map(|j| (0..k).any(|t| !b[t * n + j].is_finite()))
                .collect(),
        }
    }

    /// Whether output `(i, j)` with this bias term is NaR.
    fn nar(&self, i: usize, j: usize, bias: Option<f64>) -> bool {
        self.row_nar[i] || self.col_nar[j] || bias.is_some_and(|v| !v.is_finite())
    }
}

fn not_finite(v: &[f64]) -> bool {
    v.iter().any(|x| !x.is_finite())
}

pub(crate) use crate::rows::for_rows;

/// A matrix view on a slice: element `(r, c)` at `data[r * rs + c * cs]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Strided<'a> {
    data: &'a [f64],
    rs: usize,
    cs: usize,
}

impl<'a> Strided<'a> {
    /// The view of `data` with row stride `rs` and column stride `cs`.
    pub(crate) fn new(data: &'a [f64], rs: usize, cs: usize) -> Self {
        Strided { data, rs, cs }
    }

    /// Element `(r, c)`.
    #[inline(always)]
    pub(crate) fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.rs + c * self.cs]
    }

    /// Whether every element of a `rows x cols` matrix lies inside the slice.
    fn holds(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `out += A · B` in f64, all row-major and contiguous.
fn dgemm(dims: Dims, a: &[f64], b: &[f64], out: &mut [f64], par: Parallelism) {
    let (_, k, n) = dims;
    dgemm_strided(dims, Strided::new(a, k, 1), Strided::new(b, n, 1), out, par)
}

/// `out += A · B` in f64 (`alpha = beta = 1`): `A` (`m x k`) and `B` (`k x n`) strided
/// views, `out` row-major and contiguous.
pub(crate) fn dgemm_strided(
    (m, k, n): Dims,
    a: Strided,
    b: Strided,
    out: &mut [f64],
    par: Parallelism,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(a.holds(m, k) && b.holds(k, n) && out.len() >= m * n);
    // SAFETY: the assertion puts every index the kernel touches inside the slices, and
    // `out` is borrowed mutably so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            true,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// Exact operation tables of an 8-bit format on its bit patterns.
#[derive(Debug)]
pub struct OpTables {
    format: Format,
    /// `decode[p]`: the value of pattern `p`.
    pub decode: [f64; 256],
    /// `mul[a * 256 + b]`: the pattern of `round(a · b)`.
    pub mul: Vec<u8>,
    /// `add[a * 256 + b]`: the pattern of `round(a + b)`.
    pub add: Vec<u8>,
    /// `by_key[top 16 bits of the f32 of v]`: the pattern of the value `v`, where a value
    /// has that key (checked against `decode` on every use).
    by_key: Vec<u8>,
}

impl OpTables {
    /// The tables of `format` (a posit, or a float with a NaN pattern, of at most 8 bits),
    /// built once per process.
    pub fn get(format: &Format) -> Option<Arc<OpTables>> {
        if !has_tables(format) {
            return None;
        }
        static CACHE: OnceLock<Mutex<HashMap<Format, Arc<OpTables>>>> = OnceLock::new();
        let mut cache = CACHE.get_or_init(Default::default).lock().ok()?;
        Some(
            cache
                .entry(*format)
                .or_insert_with(|| Arc::new(OpTables::build(*format)))
                .clone(),
        )
    }

    fn build(format: Format) -> OpTables {
        let mut decode = [0.0; 256];
        for (p, d) in decode.iter_mut().enumerate() {
            *d = decode_bits(&format, p as u32);
        }
        let table = |op: fn(f64, f64) -> f64| -> Vec<u8> {
            (0..256 * 256)
                .map(|i| encode_bits(&format, op(decode[i >> 8], decode[i & 255])) as u8)
                .collect()
        };
        let mut by_key = vec![0u8; 1 << 16];
        for (p, &v) in decode.iter().enumerate().rev() {
            by_key[key(v)] = p as u8;
        }
        OpTables {
            format,
            decode,
            mul: table(mul_odd),
            add: table(add_odd),
            by_key,
        }
    }

    /// The pattern of `x`, a value of the format (else `x` rounded, as [`OpTables::encode`]):
    /// a look-up by the top bits of its f32, taken only when that pattern decodes to
    /// exactly `x` (never for NaN, which may have several patterns).
    #[inline]
    pub fn pattern(&self, x: f64) -> u8 {
        let p = self.by_key[key(x)];
        if !x.is_nan() && self.decode[p as usize].to_bits() == x.to_bits() {
            p
        } else {
            self.encode(x)
        }
    }

    /// The pattern of `x` rounded to the format (nearest even).
    pub fn encode(&self, x: f64) -> u8 {
        encode_bits(&self.format, x) as u8
    }
}

/// The look-up key of a value: the top 16 bits of its f32 (sign, exponent, 7 significand
/// bits).
#[inline]
fn key(v: f64) -> usize {
    ((v as f32).to_bits() >> 16) as usize
}

/// Tables carry NaN operands as the format's NaN pattern, so they serve posits (NaR) and
/// floats other than `fin` (which keep NaN as NaN but cannot encode it) of at most 8 bits.
fn has_tables(format: &Format) -> bool {
    let has_nan = match format {
        Format::Posit(_) => true,
        Format::Float(f) => f.specials() != Specials::Finite,
        Format::Fixed(_) | Format::Block(_) | Format::Lns(_) | Format::Mx(_) | Format::Nvfp4(_) => {
            false
        }
    };
    has_nan && format.bits() <= 8
}

fn decode_bits(format: &Format, p: u32) -> f64 {
    format
        .decode(p)
        .expect("tables exist for posit and float formats only")
}

/// The nearest-even pattern of `x`; NaN gives the format's NaN pattern.
fn encode_bits(format: &Format, x: f64) -> u32 {
    let r = format.round(x, crate::format::Rounding::NearestEven, 0);
    format.encode(r).expect("table formats have a NaN pattern")
}

/// `out (m x n) = A · B [+ bias]` with every multiply and add rounded to `format` (nearest
/// even), `k` ascending from zero, the bias added last.
pub fn naive_gemm(
    format: &Format,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    let (m, k, n) = dims;
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    if super::p8_units::is_posit8_0(format) {
        super::naive_p8::gemm_f64(a, b, dims, bias, out, parallel);
    } else if let Some(tables) = OpTables::get(format) {
        let patterns = |v: &[f64]| -> Vec<u8> {
            v.par_iter()
                .with_min_len(4096)
                .map(|&x| tables.pattern(x))
                .collect()
        };
        let (ap, bp) = (patterns(&a[..m * k]), patterns(&b[..k * n]));
        let zero = tables.encode(0.0);
        let row = |i: usize, dst: &mut [f64]| {
            let mut acc = vec![zero; n];
            for t in 0..k {
                let products = &tables.mul[(ap[i * k + t] as usize) << 8..][..256];
                let brow = &bp[t * n..t * n + n];
                for (c, &y) in acc.iter_mut().zip(brow) {
                    *c = tables.add[((*c as usize) << 8) | products[y as usize] as usize];
                }
            }
            for (j, (o, c)) in dst.iter_mut().zip(&acc).enumerate() {
                let c = match bias.at(i, j) {
                    Some(v) => tables.add[((*c as usize) << 8) | tables.encode(v) as usize],
                    None => *c,
                };
                *o = tables.decode[c as usize];
            }
        };
        for_rows(out, m, n, parallel, row);
    } else if let Some(fast) = NaiveF32::new(format) {
        fast.gemm(a, b, (m, k, n), bias, out, parallel);
    } else if let Some(fast) = NaivePositF64::new(format) {
        fast.gemm(a, b, dims, bias, out, parallel);
    } else {
        naive_gemm_reference(format, a, b, dims, bias, out, parallel);
    }
}
