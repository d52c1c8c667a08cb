//! The fast LNS matrix product: [`lns_matmul`](super::lns_matmul)'s arithmetic, bit for bit,
//! on packed integer codes with many outputs' running sums in flight at once.
//!
//! # Definition
//!
//! `c[i][j] = 0`, then `c = c ⊕ (a[i][p] ⊗ b[p][j])` for `p` ascending, then `c = c ⊕ bias`
//! (when there is one), with `⊗` and `⊕` the multiplication and addition of
//! [`LnsArith`]: exact products brought into the range (saturated to `k_max`, flushed to
//! zero below `k_min`), sums `k_big + sb(z)` or `k_big + db(z)` by the Gaussian logarithms
//! of the arithmetic's implementation, saturated or flushed, opposite values cancelling to
//! zero exactly.
//!
//! # How it is fast
//!
//! * A value is one i64: `k << 1 | sign`, and zero a sentinel far below every `k_min`, so a
//!   product is an integer add and a clamp (a zero operand gives a sum below `k_min`, which
//!   flushes to zero as the definition does), and an addition reads `z` and the signs from
//!   two integers.
//! * sb and db come from exact tables for `f <= 10` and the table implementation's own
//!   integer evaluation, as in [`LnsArith`]; for `f >= 11` (ideal and truncated) from an
//!   f64 evaluation with a proven error bound that falls back on the exact decision near a
//!   rounding boundary ([`super::gauss_f64`]). Both give the exactly rounded values, so the
//!   results equal [`LnsArith`]'s.
//! * Each row of `A` runs against [`LANES`] output columns at a time, `p` ascending in every
//!   lane: the lanes' sums are independent, so their dependent chains overlap in the
//!   processor, while every output keeps its own order of operations. For the exact tables
//!   and the f64 evaluation each step runs for all lanes at once in vector instructions
//!   (table reads as gathers, the f64 Gaussian logarithms in 8 or 4 lanes, the lanes the
//!   estimate leaves undecided redone by the scalar addition), compiled for AVX2 and
//!   AVX-512 and chosen at run time ([`super::lanes_vec`]); the table implementation runs
//!   lane by lane. A zero `a[i][p]` skips
//!   step `p` for the whole tile (every product is zero, and `c ⊕ 0 = c` for every `c` in
//!   the range). Rows run in parallel.
//! * On AVX-512 and AVX2 the exact tables run in 32-bit lanes instead where the format
//!   and the operands allow it (`|k| <= 2^28`: formats up to 30 bits), sixteen or eight
//!   lanes per gather, two rows of `A` per pass ([`super::lanes_i32`], which shows why its
//!   one formula gives every case of the addition). A step whose products all lie in the
//!   range (known from each row of `B`'s smallest and largest exponent) skips bringing
//!   them in.
//! * Operands come from f64 (and go back) through tables for `f <= 10`
//!   (`format::lns_small_f`: the boundaries of nearest rounding, the values of
//!   `2^(r/2^f)`), built from the exact paths.
//! * `B` is packed once ([`PackedRight`]) for any number of bands of rows of `A`
//!   ([`gemm_rows`]), which is how the layers' GEMMs split over threads.
//! * A NaN anywhere in the operands sends the product (of the band) to the scalar
//!   definition (NaN absorbs, and is rare).

use super::arith::LnsArith;
use super::error::LnsError;
use super::gauss::{Sums, SumsRef};
#[cfg(target_arch = "x86_64")]
use super::lanes_i32;
use super::lanes_vec;
use super::value::LnsValue;
use crate::rows::for_rows;

/// Output columns summed together in one pass over a row of `A`.
pub const LANES: usize = 64;

/// The packed zero: far below every `k_min` (`>= -2^30`) even after adding any `k`.
pub(super) const ZERO: i64 = -(1 << 62);

/// How a bias is laid out for [`lns_gemm_lanes`].
#[derive(Debug, Clone, Copy)]
pub enum LnsBias<'a> {
    /// No bias.
    None,
    /// One value per output row (`m` values).
    PerRow(&'a [LnsValue]),
    /// One value per output column (`n` values).
    PerCol(&'a [LnsValue]),
}

/// The range of one format.
#[derive(Clone, Copy)]
pub(super) struct Range {
    k_min: i64,
    k_max: i64,
}

impl Range {
    /// The smallest exponent of the format.
    #[inline(always)]
    pub(super) fn k_min(self) -> i64 {
        self.k_min
    }

    /// The largest exponent of the format.
    #[inline(always)]
    pub(super) fn k_max(self) -> i64 {
        self.k_max
    }

    /// `±B^k` brought into the range, packed.
    #[inline(always)]
    pub(super) fn bring_in(self, k: i64, neg: i64) -> i64 {
        if k < self.k_min {
            ZERO
        } else {
            (k.min(self.k_max) << 1) | neg
        }
    }

    /// The exact product, brought into the range.
    #[inline(always)]
    pub(super) fn mul(self, a: i64, b: i64) -> i64 {
        self.bring_in((a >> 1) + (b >> 1), (a ^ b) & 1)
    }

    /// The sum by the Gaussian logarithms of `s`: zeros by branches (they come in runs),
    /// the order of the operands, the signs and the cancellation by selects.
    #[inline(always)]
    pub(super) fn add<S: Sums>(self, s: &S, a: i64, b: i64) -> i64 {
        if a == ZERO {
            return b;
        }
        if b == ZERO {
            return a;
        }
        let (ka, kb) = (a >> 1, b >> 1);
        let ge = ka >= kb;
        let big = if ge { ka } else { kb };
        let neg = if ge { a & 1 } else { b & 1 };
        let u = (ka - kb).abs();
        let same = (a ^ b) & 1 == 0;
        let r = self.bring_in(big + s.sum(u, same), neg);
        if !same && u == 0 {
            ZERO
        } else {
            r
        }
    }
}

/// The packed NaN: below [`ZERO`] and every packed value; it never enters a kernel (a NaN
/// anywhere sends the product to the scalar definition).
const NAN: i64 = i64::MIN;

/// A value packed: `k << 1 | sign`, [`ZERO`] or [`NAN`].
#[inline]
pub(crate) fn pack(v: LnsValue) -> i64 {
    match v {
        LnsValue::Finite { negative, k } => ((k as i64) << 1) | i64::from(negative),
        LnsValue::Zero => ZERO,
        LnsValue::NaN => NAN,
    }
}

/// The value of a packed code.
#[inline]
pub(super) fn unpack(c: i64) -> LnsValue {
    if c == ZERO {
        LnsValue::Zero
    } else if c == NAN {
        LnsValue::NaN
    } else {
        LnsValue::Finite {
            negative: c & 1 == 1,
            k: (c >> 1) as i32,
        }
    }
}

/// The right operand `B` (`k x n`) of [`gemm_rows`], packed once for the products of any
/// number of bands of rows of `A`.
pub(crate) struct PackedRight {
    /// The packed codes ([`pack`]), row-major.
    codes: Vec<i64>,
    /// The inner dimension.
    k: usize,
    /// The columns.
    n: usize,
    /// Whether a code is NaN.
    nan: bool,
    /// `B` laid out for the 32-bit kernel, where it runs for this format and `B`.
    #[cfg(target_arch = "x86_64")]
    lanes32: Option<lanes_i32::Right>,
}

impl PackedRight {
    /// `B` from its packed codes ([`pack`], row-major `k x n`) in `arith`'s arithmetic.
    pub(crate) fn new(arith: &LnsArith, codes: Vec<i64>, (k, n): (usize, usize)) -> Self {
        assert_eq!(codes.len(), k * n, "B is k x n");
        let nan = codes.contains(&NAN);
        #[cfg(target_arch = "x86_64")]
        let lanes32 = match arith.sums() {
            SumsRef::Exact(_) if !nan => lanes_i32::Right::new(range_of(arith), &codes, k),
            _ => None,
        };
        PackedRight {
            codes,
            k,
            n,
            nan,
            #[cfg(target_arch = "x86_64")]
            lanes32,
        }
    }
}

/// The range of `arith`'s format.
fn range_of(arith: &LnsArith) -> Range {
    let lns = arith.lns();
    Range {
        k_min: lns.k_min(),
        k_max: lns.k_max(),
    }
}

/// `out = A · B [+ bias]` (row-major, `a` m x k, `b` k x n, `out` m x n) in `arith`'s
/// arithmetic, bit for bit [`lns_matmul`](super::lns_matmul) with the bias added last (see
/// the module docs). Operands outside the format's range are read as their exact values
/// like [`LnsArith`] does. `parallel` spreads rows over the rayon pool. Refuses slices
/// shorter than the shapes need.
pub fn lns_gemm_lanes(
    arith: &LnsArith,
    a: &[LnsValue],
    b: &[LnsValue],
    (m, k, n): (usize, usize, usize),
    bias: LnsBias,
    out: &mut [LnsValue],
    parallel: bool,
) -> Result<(), LnsError> {
    let need = |name: &str, len: usize, rows: usize, cols: usize| match rows.checked_mul(cols) {
        Some(x) if len >= x => Ok(()),
        _ => Err(LnsError::Shape {
            reason: format!("{name} has {len} elements, fewer than {rows}x{cols}"),
        }),
    };
    need("a", a.len(), m, k)?;
    need("b", b.len(), k, n)?;
    need("out", out.len(), m, n)?;
    match bias {
        LnsBias::PerRow(v) => need("the bias", v.len(), m, 1)?,
        LnsBias::PerCol(v) => need("the bias", v.len(), 1, n)?,
        LnsBias::None => {}
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Packing is linear in the operands' size, the product cubic: it runs on this thread.
    let ap: Vec<i64> = a[..m * k].iter().map(|&v| pack(v)).collect();
    let right = PackedRight::new(arith, b[..k * n].iter().map(|&v| pack(v)).collect(), (k, n));
    gemm_rows(arith, &ap, &right, m, bias, &mut out[..m * n], parallel);
    Ok(())
}

/// `out = A · B [+ bias]` as [`lns_gemm_lanes`] does, for `A`'s packed codes ([`pack`],
/// `m x k`) and `B` packed once ([`PackedRight`]); `bias` the values of these rows (per
/// row) or of every column. Any part of a product's rows gives the same bits as the whole.
pub(crate) fn gemm_rows(
    arith: &LnsArith,
    ap: &[i64],
    right: &PackedRight,
    m: usize,
    bias: LnsBias,
    out: &mut [LnsValue],
    parallel: bool,
) {
    let (k, n) = (right.k, right.n);
    assert!(ap.len() >= m * k && out.len() >= m * n);
    let (ap, bp, out) = (&ap[..m * k], &right.codes[..], &mut out[..m * n]);
    let bias_slice = match bias {
        LnsBias::PerRow(v) => &v[..m],
        LnsBias::PerCol(v) => &v[..n],
        LnsBias::None => &[],
    };
    if right.nan || ap.contains(&NAN) || bias_slice.iter().any(|x| x.is_nan()) {
        let values = |codes: &[i64]| codes.iter().map(|&c| unpack(c)).collect::<Vec<_>>();
        scalar(
            arith,
            &values(ap),
            &values(bp),
            (m, k, n),
            bias,
            out,
            parallel,
        );
        return;
    }
    let range = range_of(arith);
    // Operands outside the range keep their exact k, as `LnsArith` reads them: packing
    // holds any i32 k, and sums of two stay far from i64's limits.
    let biasp: Vec<i64> = bias_slice.iter().map(|&v| pack(v)).collect();
    let packed = Packed {
        range,
        a: ap,
        b: bp,
        bias: &biasp,
    };
    let dims = (m, k, n);
    match arith.sums() {
        #[cfg(target_arch = "x86_64")]
        SumsRef::Exact(s) if right.lanes32.is_some() && lanes_i32::takes_rows(ap) => {
            let b32 = right.lanes32.as_ref().expect("checked");
            lanes_i32::gemm(s, range, ap, b32, dims, bias, &biasp, out, parallel)
        }
        SumsRef::Exact(s) => tiles(s, lanes_vec::row, &packed, dims, bias, out, parallel),
        SumsRef::F64(s) => tiles(s, lanes_vec::row, &packed, dims, bias, out, parallel),
        SumsRef::Table(s) => tiles(s, row_tiles, &packed, dims, bias, out, parallel),
    }
}

/// The packed operands and the format's range.
struct Packed<'a> {
    range: Range,
    a: &'a [i64],
    b: &'a [i64],
    bias: &'a [i64],
}

/// The product of packed codes with the sums of `sums` (no NaN in the operands).
fn tiles<S: Sums>(
    sums: &S,
    row_kernel: RowKernel<S>,
    packed: &Packed,
    (m, k, n): (usize, usize, usize),
    bias: LnsBias,
    out: &mut [LnsValue],
    parallel: bool,
) {
    let (ap, bp, biasp) = (packed.a, packed.b, packed.bias);
    let row = |i: usize, dst: &mut [LnsValue]| {
        row_kernel(
            sums,
            packed.range,
            &ap[i * k..(i + 1) * k],
            bp,
            n,
            dst,
            &|j| match bias {
                LnsBias::None => None,
                LnsBias::PerRow(_) => Some(biasp[i]),
                LnsBias::PerCol(_) => Some(biasp[j]),
            },
        )
    };
    for_rows(out, m, n, parallel, row);
}

/// One output row of packed codes: `(sums, range, a_row, b, n, dst, bias_at)`.
type RowKernel<S> =
    fn(&S, Range, &[i64], &[i64], usize, &mut [LnsValue], &dyn Fn(usize) -> Option<i64>);

/// One output row: tiles of [`LANES`] columns, `p` ascending, then the bias, one lane at
/// a time ([`lanes_vec`] computes the same steps for all lanes at once).
pub(super) fn row_tiles<S: Sums>(
    sums: &S,
    range: Range,
    a_row: &[i64],
    b: &[i64],
    n: usize,
    dst: &mut [LnsValue],
    bias_at: &dyn Fn(usize) -> Option<i64>,
) {
    let mut j0 = 0;
    while j0 < n {
        let width = LANES.min(n - j0);
        let mut acc = [ZERO; LANES];
        let acc = &mut acc[..width];
        for (p, &x) in a_row.iter().enumerate() {
            if x == ZERO {
                continue;
            }
            let b_row = &b[p * n + j0..p * n + j0 + width];
            for (c, &y) in acc.iter_mut().zip(b_row) {
                *c = range.add(sums, *c, range.mul(x, y));
            }
        }
        for (jj, (d, &c)) in dst[j0..j0 + width].iter_mut().zip(acc.iter()).enumerate() {
            let c = match bias_at(j0 + jj) {
                // `0 + x` brings an operand into the range; otherwise its exact k is used.
                Some(bv) if c == ZERO => bring_operand(range, bv),
                Some(bv) => range.add(sums, c, bv),
                None => c,
            };
            *d = unpack(c);
        }
        j0 += width;
    }
}

/// An operand (possibly outside the range) brought into the range, as `0 + x` does.
#[inline(always)]
pub(super) fn bring_operand(range: Range, v: i64) -> i64 {
    if v == ZERO {
        ZERO
    } else {
        range.bring_in(v >> 1, v & 1)
    }
}

/// The scalar definition, for operands with a NaN.
fn scalar(
    arith: &LnsArith,
    a: &[LnsValue],
    b: &[LnsValue],
    (m, k, n): (usize, usize, usize),
    bias: LnsBias,
    out: &mut [LnsValue],
    parallel: bool,
) {
    let row = |i: usize, dst: &mut [LnsValue]| {
        for (j, o) in dst.iter_mut().enumerate() {
            let mut c = LnsValue::Zero;
            for p in 0..k {
                c = arith.add(c, arith.mul(a[i * k + p], b[p * n + j]));
            }
            *o = match bias {
                LnsBias::None => c,
                LnsBias::PerRow(v) => arith.add(c, v[i]),
                LnsBias::PerCol(v) => arith.add(c, v[j]),
            };
        }
    };
    for_rows(out, m, n, parallel, row);
}
