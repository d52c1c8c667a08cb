//! The rows of the fast LNS matrix product ([`super::lanes`]) with every step of a tile
//! computed for all its lanes at once: written without branches, so that the compiler
//! turns the lanes into vector instructions (table look-ups into gathers), compiled for
//! the portable target, AVX2 and AVX-512 and chosen at run time ([`crate::backend::isa`]).
//!
//! # One step
//!
//! Step `p` of a tile updates every lane's running sum `c` with the product `x ⊗ y`
//! (`x = a[i][p]`, `y = b[p][j]`): the product, the order of the operands, the signs, `z`
//! and the Gaussian logarithm ([`LaneSums::lane`]) and the sum brought into the range are
//! computed in every lane with selects, as are the cases of the scalar addition of
//! [`super::lanes`] (which is [`LnsArith::add`](super::LnsArith::add)'s): a zero operand
//! (`0 ⊕ x = x`) and exact cancellation. The lanes the evaluation leaves undecided (for
//! the f64 Gaussian logarithms: differences next to the singularity and estimates within
//! the error bound of a rounding boundary, which the scalar path decides exactly) are then
//! redone one by one with the scalar addition, when there are any. Every other lane's
//! value is the scalar path's: the same integer operations, and the same f64 operations in
//! the same order (IEEE arithmetic gives the same bits in a vector register; Rust never
//! fuses a multiply and an add), so the results are the scalar product's bit for bit under
//! every instruction set.
//!
//! # Tiles
//!
//! A row runs in tiles of [`LANES`] columns, then, when `n` is not a multiple, one last
//! tile of the same width ending at column `n` (it overlaps the previous one, whose
//! columns it recomputes to the same values). Rows narrower than [`LANES`] use tiles of
//! [`MID`] or [`NARROW`] columns the same way; rows narrower than that take the scalar
//! tiles of [`super::lanes`]. Many lanes keep many independent sums in flight, which hides
//! the latency of each step's table reads. (The compiler vectorises the wide tiles; today
//! it leaves the f64 evaluation of the narrow ones scalar, which gives the same bits.)

use super::gauss::LaneSums;
use super::lanes::{bring_operand, row_tiles, unpack, Range, LANES, ZERO};
use super::value::LnsValue;
use crate::backend::isa::{self, Isa};

/// The tile width of rows narrower than [`LANES`].
const MID: usize = 16;
/// The tile width of rows narrower than [`MID`].
const NARROW: usize = 8;

/// One step of a `W`-lane tile: `acc[j] = acc[j] ⊕ (x ⊗ b[j])` (see the module docs).
#[inline(always)]
fn step<S: LaneSums, const W: usize>(
    sums: &S,
    range: Range,
    x: i64,
    b: &[i64; W],
    acc: &mut [i64; W],
) {
    // Three passes, each a simple loop over the lanes that the compiler vectorises: the
    // products and operands of the sums, the Gaussian logarithms, the sums.
    let mut prod = [0i64; W];
    let mut u = [0i64; W];
    let mut same = [false; W];
    for j in 0..W {
        let (c, y) = (acc[j], range.mul(x, b[j]));
        prod[j] = y;
        u[j] = ((c >> 1) - (y >> 1)).abs();
        same[j] = (c ^ y) & 1 == 0;
    }
    let mut s = [0i64; W];
    let mut decided = [false; W];
    for j in 0..W {
        (s[j], decided[j]) = sums.lane(u[j], same[j]);
    }
    let mut res = [0i64; W];
    let mut redo = [false; W];
    for j in 0..W {
        let (c, y) = (acc[j], prod[j]);
        let ge = c >> 1 >= y >> 1;
        let big = if ge { c >> 1 } else { y >> 1 };
        let neg = if ge { c & 1 } else { y & 1 };
        let cancel = (u[j] == 0) & !same[j];
        // `Range::add`'s cases, in its order.
        res[j] = if c == ZERO {
            y
        } else if y == ZERO {
            c
        } else if cancel {
            ZERO
        } else {
            range.bring_in(big + s[j], neg)
        };
        redo[j] = !decided[j] & (c != ZERO) & (y != ZERO) & !cancel;
    }
    if redo.iter().fold(false, |any, &r| any | r) {
        for j in 0..W {
            if redo[j] {
                res[j] = range.add(sums, acc[j], prod[j]);
            }
        }
    }
    *acc = res;
}

/// The `W` outputs of the tile at columns `j0..j0 + W`: the steps, then the bias.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<S: LaneSums, const W: usize>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    j0: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    let mut acc = [ZERO; W];
    for (p, &x) in a_row.iter().enumerate() {
        if x == ZERO {
            continue;
        }
        let b_row: &[i64; W] = b[p * n + j0..p * n + j0 + W]
            .try_into()
            .expect("a tile is W columns wide");
        step(sums, range, x, b_row, &mut acc);
    }
    for (jj, (d, &c)) in dst[j0..j0 + W].iter_mut().zip(acc.iter()).enumerate() {
        let c = match bias_at(j0 + jj) {
            Some(bv) if c == ZERO => bring_operand(range, bv),
            Some(bv) => range.add(sums, c, bv),
            None => c,
        };
        *d = unpack(c);
    }
}

/// The tiles of one row, `W` columns wide, the last one ending at `n` (`n >= W`).
#[inline(always)]
fn tiles_of<S: LaneSums, const W: usize>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    let mut j0 = 0;
    while j0 + W <= n {
        tile::<S, W>(sums, range, a_row, b, n, j0, dst, bias_at);
        j0 += W;
    }
    if j0 < n {
        tile::<S, W>(sums, range, a_row, b, n, n - W, dst, bias_at);
    }
}

/// One row by tiles of the widest width that fits.
#[inline(always)]
fn row_body<S: LaneSums>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    if n >= LANES {
        tiles_of::<S, LANES>(sums, range, a_row, b, n, dst, bias_at);
    } else if n >= MID {
        tiles_of::<S, MID>(sums, range, a_row, b, n, dst, bias_at);
    } else if n >= NARROW {
        tiles_of::<S, NARROW>(sums, range, a_row, b, n, dst, bias_at);
    } else {
        row_tiles(sums, range, a_row, b, n, dst, bias_at);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2<S: LaneSums>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    row_body(sums, range, a_row, b, n, dst, bias_at)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn row_avx512<S: LaneSums>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    row_body(sums, range, a_row, b, n, dst, bias_at)
}

/// One output row of the product (`a_row` the row of `A`, `b` all of `B`, packed; `dst`
/// the row's `n` outputs), compiled for the active instruction set.
pub(crate) fn row<S: LaneSums>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `active` returns AVX-512 only where the CPU has F, BW, DQ and VL.
        Isa::Avx512 => unsafe { row_avx512(sums, range, a_row, b, n, dst, bias_at) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `active` returns AVX2 only where the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { row_avx2(sums, range, a_row, b, n, dst, bias_at) },
        _ => row_body(sums, range, a_row, b, n, dst, bias_at),
    }
}
