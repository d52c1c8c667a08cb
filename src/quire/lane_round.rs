//! Nearest-even roundings of f32 values specialised to one format, for the naive GEMM's
//! register kernel ([`super::naive_special`]): fewer operations than the quantize plan's
//! general step ([`crate::backend::f32_plan::F32Plan`]), the same bits.
//!
//! Each rounding here is defined on f32 patterns by [`LaneRound::round`] (the scalar
//! definition, which the tests compare with [`Format::round`] over every f32 pattern class)
//! and computed 16 lanes at a time by [`super::lane_round_avx512`], 8 by
//! [`super::lane_round_avx2`]. All round to nearest, ties to even, and agree with
//! [`Format::round`] on every f32 that is not NaN.
//!
//! # Floats with f32's exponent range ([`LaneRound::Wide`]: bf16, `float<8,m>`)
//!
//! With 8 exponent bits, bias 127, subnormals, IEEE specials and overflow to infinity, the
//! format's values are the f32 patterns whose low `s = 23 - m` bits are zero, in every
//! binade alike (its subnormals are f32's, with the same spacing as its smallest normal
//! binade). Rounding to nearest even is then integer rounding of the pattern at bit `s`:
//! `(x + 2^(s-1) - 1 + bit_s(x)) & !(2^s - 1)`, on the signed pattern (the sign bit is never
//! reached: the magnitude stays below `2^31`). A carry out of the fraction raises the
//! exponent field, which is the next binade's first value; past the largest finite value
//! it gives the pattern of infinity, exactly IEEE's overflow (the threshold `max + ulp/2`
//! ties to the even `2^128`, beyond the range). Inf stays Inf; NaN is passed through (its
//! carry could reach the sign bit).
//!
//! # Floats with a narrower exponent range ([`LaneRound::Narrow`]: fp16, e5m2, e4m3, ...)
//!
//! With subnormals, the format's values in f32 binade `e` are the multiples of
//! `2^(E - m)`, `E = max(e, emin)` (`m` mantissa bits). Adding `c = 2^(E + 23 - m)` to `|x|`
//! in f32 rounds `|x|` to that grid: for `|x| < 2^(E+1)` the sum lies in `[c, 2c]`, where
//! f32's spacing is exactly `2^(E - m)`, and the addition rounds to nearest even; `c` is an
//! even multiple of the spacing, so ties go to even multiples, the format's even
//! significands (also a carry to `2^(E+1)`, an even multiple). Subtracting `c` again is
//! exact (Sterbenz). Binades above the format's largest `emax` use `E = emax + 1`: every
//! such `|x|` rounds to at least `2^(emax+1)`, beyond the largest value, so the overflow
//! rule follows as for any value rounded past it: results above the largest finite value
//! become the overflow value (Inf, NaN where the format has none, or the largest value
//! when it saturates), as [`Format::round`] does after rounding with an unbounded
//! exponent. The sign is put back afterwards (so zeros keep theirs). `c` must be a normal
//! f32 for every `E` from `emin` to `emax + 1`: formats with at most 7 exponent bits.
//!
//! IEEE binary16 (fp16) is also the hardware's half precision: the AVX-512 kernel rounds it
//! with the conversion instructions instead (`vcvtps2ph` with nearest-even, then
//! `vcvtph2ps`), IEEE 754's correctly rounded conversion, with subnormals and overflow to
//! infinity as fp16 is defined here; [`LaneRound::is_binary16`] tells the formats.
//!
//! # Posits with at most 17 bits ([`LaneRound::Posit`], posit<16,1>, ...)
//!
//! The quantize plan's posit step (see [`crate::backend::f32_plan`]) rounds binade `e` at
//! bit `s(e)` of the pattern read with the exponent byte raised by one, `t = |x| + 2^23`,
//! whose exponent field `e + 128` holds the posit's exponent bits as its low bits: binades
//! whose fraction is cut (`s <= 23`) round the fraction, binades whose exponent bits are cut
//! (`s = 23 + c`) round `e` to a multiple of `2^c`, the pattern midpoint there being a power
//! of two. Here:
//!
//! * **Clamps first.** `|x|` outside `[minpos, maxpos]` rounds to the nearer end (posits
//!   never round to zero or overflow), so `t` is clamped to `[minpos + 2^23, maxpos +
//!   2^23]` by an integer minimum and maximum; the ends are posit values and round to
//!   themselves. Zero is put back at the end.
//! * **Per regime.** `s` depends only on the regime `k = floor(e / 2^es)`: the regime's
//!   length fixes the number of fraction bits. The top bits of `t`, `t >> (23 + es) = k +
//!   2^(7 - es)`, index a table per regime by their low 5 bits, distinct for the `2 (n - 2) +
//!   1 <= 32` regimes of posits with `n <= 17`; the AVX-512 kernel looks it up with one
//!   `vpermt2d` (32 entries in two registers) per table. Each entry holds the rounding
//!   increment `h = 2^(s-1) - 1` and the mask `!(2^s - 1)`. AVX2 computes the same entries
//!   from `t` instead ([`RegimeArith`]), kept only where they match the table.
//! * **Parity.** Rounding to nearest even is `(t + h + odd) & mask` with `odd` the last bit
//!   of the kept posit pattern. Where fraction or exponent bits remain it is bit `s` of
//!   `t` (at `s = 23` the low exponent bit, by the raised exponent byte), found as
//!   `t & -mask`. Where the whole exponent is cut (`c = es`) the kept pattern ends in the
//!   regime: its last bit is 0 for `k >= 0` (the terminating zero) and 1 for `k < 0`, while
//!   bit `s` of `t` is the low bit of `k + 2^(7 - es)`, the same for the whole regime; the
//!   entry's increment is corrected by the difference (`h - 1`, `h` or `h + 1`). `odd` only
//!   matters at ties: with an increment of at most `2^(s-1)` nothing else moves.
//! * **maxpos.** The regime `k = n - 2` holds maxpos alone, reached only by the clamp; its
//!   entry is increment 0 and mask all ones (`t`'s bit 0 is 0 there), which keeps it.
//!   Posits whose binades are finer than f32's (`s <= 0`) have no table (none with
//!   `n <= 17`).
//!
//! The entries are built from [`Posit::frac_bits`](crate::format::Posit), the definition
//! the quantize plan uses; the tests compare the result with [`Format::round`].
//!
//! # Plain sums ([`LaneRound::rounds_plain_sums`])
//!
//! The naive GEMM rounds `x + y` to the format `A` (`x`, `y` values of `A`). Rounding the
//! exact sum to odd at f32 precision first is always correct; where the check below holds,
//! the native f32 add (nearest even) serves as well: rounding its result to `A` gives the
//! correctly rounded sum. It holds for floats of at most 11 significand bits (fp16, bf16,
//! e5m2, e4m3, ...; not 12) and for posits whose precision tapers fast enough
//! (posit<16,1>, posit<16,2>, posit<17,0>, every posit of at most 13 bits; not
//! posit<17,1>).
//!
//! Let `sp(e)` be the exponent of `A`'s spacing in binade `e` (`[2^e, 2^(e+1))`): `max(e,
//! emin) - m` for a float with `m` mantissa bits, `e - max(f(e), 0)` for a posit with `f(e)`
//! fraction bits there (binades whose exponent bits are cut count as holding `2^e` alone).
//! It never decreases with `e`, and every value is a multiple of the spacing of every
//! binade at or below its own. Let `|y| <= |x|`, `x` in binade `ex`, `y` in binade `ey`.
//!
//! * **Exact sums.** Both are multiples of `2^sp(ey)` and `|x + y| < 2^(ex+2)`: the sum is
//!   an f32, rounded once, where `sp(ey) >= ex - 22`; a sum below `x = 2^ex` in magnitude
//!   where `sp(ey) >= ex - 24`.
//! * **Otherwise** `|y| <= Y = 2^(ey+1) - 2^sp(ey)`, the largest value of its binade. `A`'s
//!   rounding changes or ties only at decision points, all f32 values: the midpoints of
//!   its grid (a float's extended past the largest value, where overflow is decided after
//!   rounding), and where a posit's exponent is cut, powers of two at least a factor 2
//!   from the values beside them. The decision points nearest `x` lie at least `H(ex) =
//!   2^(sp(ex) - 1)` from it within or above its binade, and, below `x = 2^ex`, at least
//!   `H(ex - 1)` (conservative for posits, where no decision point lies beyond maxpos or
//!   below minpos). f32's half spacing at the sum is at most `2^(ex-23)`, and `2^(ex-25)`
//!   just below `2^ex`. So where `Y + 2^(ex-23) < H(ex)` (unless those sums are exact)
//!   and `Y + 2^(ex-25) < H(ex-1)` (unless the sums below `2^ex` are), the exact sum and
//!   its f32 rounding (monotone, moving it by at most that half spacing) lie strictly
//!   between the same two decision points, and round to the same value of `A`. (Leaving
//!   `x`'s binade downward from `x > 2^ex` needs `|y| > 2 H(ex)`, excluded by the first.)
//!
//! [`LaneRound::rounds_plain_sums`] checks this for every pair of binades (with `ey <= ex`)
//! of the format's range. For a float with `p = m + 1` significand bits the worst pair is
//! `ey = ex - 24 + p`, `Y = 2^(ex-23+p) - 2^(ex-23)`: with `p = 11`, `Y + 2^(ex-23) =
//! 2^(ex-12) < H(ex) = 2^(ex-11)` and `Y + 2^(ex-25) < H(ex-1) = 2^(ex-12)`; with `p = 12`,
//! `Y + 2^(ex-23) = 2^(ex-11)` reaches `H(ex)`, and indeed it fails: in float<5,11>,
//! `(1 + 2^-11) + (2^-12 - 2^-24)` is an f32 tie that rounds up onto a midpoint. A posit's
//! small addends have few bits: in posit<16,1> an `x` near 1 (13 significand bits) meets
//! inexact sums only with `|y| < 2^-19`, against `H = 2^-14`.
//!
//! In `naive:<A>` one addend is a value of the operand format: the same holds where every
//! value of it is a value of `A` ([`LaneRound::contains`]: e4m3 and e5m2 in fp16 or bf16);
//! where not, a plain sum can fail (fp16 products into bf16 sums: `2^-24 + 1028` is the
//! f32 `1028`, a bf16 tie that goes to `1024`; the exact sum goes to `1032`).

use super::es0_lanes::Es0Lanes;
use super::posit_magic::PositMagic;
use crate::backend::isa::Isa;
use crate::format::float::{Overflow, Specials};
use crate::format::grid::parts;
use crate::format::{Float, Format, Posit};

const SIGN: u32 = 0x8000_0000;
const EXP: u32 = 0x7f80_0000;

/// A nearest-even rounding of f32 values to one format, specialised to its kind (see the
/// module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaneRound {
    /// A float with f32's exponent range: integer rounding of the pattern.
    Wide(WideFloat),
    /// A float with at most 7 exponent bits and subnormals: the magic-constant addition.
    Narrow(NarrowFloat),
    /// A posit with at most 17 bits: clamps and per-regime tables.
    Posit(Box<PositTable>),
}

/// The constants of [`LaneRound::Wide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WideFloat {
    /// The rounding bit, `23 - m`.
    pub s: u32,
    /// Whether plain f32 sums round correctly (see "Plain sums" in the module docs).
    pub plain_sums: bool,
}

/// The constants of [`LaneRound::Narrow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NarrowFloat {
    /// The exponent field of `2^emin` and of `2^(emax + 1)`: the clamp of `E`.
    pub e_lo: u32,
    /// See [`NarrowFloat::e_lo`].
    pub e_hi: u32,
    /// `(23 - m) << 23`: added to `E`'s field, it gives the magic constant `c`.
    pub shift: u32,
    /// The pattern of the largest finite value; magnitudes above it overflow.
    pub limit: u32,
    /// The pattern of the overflow value (Inf, NaN or the largest finite value).
    pub over: u32,
    /// The format is IEEE binary16 (fp16), which the hardware converts to.
    pub binary16: bool,
    /// Whether plain f32 sums round correctly (see "Plain sums" in the module docs).
    pub plain_sums: bool,
}

/// The constants of [`LaneRound::Posit`]: per regime (index `t >> shift`, low 5 bits) the
/// increment and the mask, and the same steps in arithmetic form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositTable {
    /// `23 + es`.
    pub shift: u32,
    /// `minpos + 2^23` and `maxpos + 2^23` as patterns: the clamp of `t`.
    pub t_lo: u32,
    /// See [`PositTable::t_lo`].
    pub t_hi: u32,
    /// `2^(s-1) - 1`, corrected by the parity where the exponent is cut (0 for maxpos).
    pub half: [u32; 32],
    /// `!(2^s - 1)` (all ones for maxpos).
    pub mask: [u32; 32],
    /// The steps of the table computed from `t` ([`RegimeArith`]), where that form gives
    /// every entry's rounding.
    pub arith: Option<RegimeArith>,
    /// Whether plain f32 sums round correctly (see "Plain sums" in the module docs).
    pub plain_sums: bool,
    /// The magic-constant rounding of doubled values in the binades with a uniform grid
    /// ([`PositMagic`]), for the naive GEMM's AVX2 kernel.
    pub magic: Option<PositMagic>,
    /// The rounding of posit<n,0> (`n <= 8`) by magic constants in every binade
    /// ([`Es0Lanes`]), for the naive GEMM's AVX2 kernel.
    pub es0: Option<Es0Lanes>,
}

/// [`PositTable`]'s per-regime step computed from `t` instead of looked up, for vector units
/// without a 32-entry table lookup (AVX2, [`super::lane_round_avx2`]).
///
/// A regime `k` of posit<n, es> (below maxpos's) has `rl(k) = max(k + 2, 1 - k)` regime
/// bits, so `fb(k) = n - 1 - es - rl(k)` fraction bits, and its rounding bit in `t` is
/// `s = 23 - fb(k) = (24 - n + es) + rl(k)`. With `top = t >> (23 + es) = k + 2^(7 - es)`
/// that is `s = max(top + up, down - top)`. The increment is `2^(s-1) - 1` and the mask
/// `!(2^s - 1)`.
///
/// maxpos's regime `n - 2` is never rounded in this form: `t` is clamped to `t_hi - 1`
/// instead of `t_hi`, the last `t` of regime `n - 3`, which rounds up to maxpos (`t_hi`'s
/// low `23 + es` bits are zero, the regime rounds at bit `23 + es`, and `t_hi - 1` lies
/// above its midpoint). `+0` (the sums' `t = 0`, not clamped) gives `s >= 32`, whose mask
/// and parity bit are 0: it stays `+0`.
///
/// Parity: bit `s` of `t` is the kept pattern's last bit except where the whole exponent
/// is cut (`s = 23 + es`, regimes `n - 3` and `-(n - 2)`, whose kept patterns end in 0 and
/// 1). There bit `s` of `t` is the low bit of `k` (the raised bias `2^(7 - es)` is even),
/// which is `n - 3` resp. `n - 2`, so it is the wrong one exactly when `n` is even: `flip`
/// is `23 + es` then (the parity bit is inverted where `s` equals it), and past any `s`
/// otherwise. [`PositTable::new`] keeps this form only where it gives every entry of the
/// table and leaves `t`'s upper clamp unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegimeArith {
    /// `s = max(top + up, down - top)`.
    pub up: i32,
    /// See [`RegimeArith::up`].
    pub down: i32,
    /// The `s` whose parity bit is inverted (`23 + es` for even `n`, else never reached).
    pub flip: i32,
}

impl RegimeArith {
    /// The form for posit<n, es> read on `t` shifted right by `shift = 23 + es`.
    fn new(n: i32, es: i32) -> Self {
        let bias = 128 >> es;
        let base = 24 - n + es;
        RegimeArith {
            up: 2 - bias + base,
            down: 1 + bias + base,
            flip: if n % 2 == 0 { 23 + es } else { i32::MAX },
        }
    }

    /// The rounding bit `s` of `t` (the regime's).
    pub fn s(&self, t: u32, shift: u32) -> u32 {
        let top = (t >> shift) as i32;
        (top + self.up).max(self.down - top) as u32
    }

    /// `t` (raised, clamped to `[t_lo, t_hi - 1]`, or 0) rounded to nearest even: the
    /// scalar form of the AVX2 lanes (shifts by 32 or more give 0, as there).
    pub fn round_t(&self, t: u32, shift: u32) -> u32 {
        let s = self.s(t, shift);
        let mask = u32::MAX.checked_shl(s).unwrap_or(0);
        let half = !mask >> 1;
        let bit = t.checked_shr(s).unwrap_or(0);
        let odd = (bit ^ u32::from(s as i32 == self.flip)) & 1;
        (t.wrapping_add(half).wrapping_add(odd)) & mask
    }
}

/// The bias of the raised exponent byte.
const RAISE: u32 = 1 << 23;

impl LaneRound {
    /// The specialised rounding of `format`, where one applies (see the module docs);
    /// `None` for other formats, which keep the quantize plan's step.
    pub fn new(format: &Format) -> Option<Self> {
        match format {
            Format::Float(f) => Self::float(f),
            Format::Posit(p) => PositTable::new(p).map(|t| LaneRound::Posit(Box::new(t))),
            _ => None,
        }
    }

    fn float(f: &Float) -> Option<Self> {
        if !f.subnormals() || f.man() > 22 {
            return None;
        }
        if f.exp() == 8 {
            let ieee = f.specials() == Specials::Ieee && f.overflow() == Overflow::Infinity;
            let m = f.man() as i32;
            return ieee.then(|| {
                LaneRound::Wide(WideFloat {
                    s: 23 - f.man(),
                    plain_sums: float_plain_sums(m, -126, 127),
                })
            });
        }
        let man = f.man() as i32;
        let emin = f.emin();
        let emax = parts(f.max_value()).e;
        let field = |e: i32| ((e + 127) as u32) << 23;
        // c = 2^(E + 23 - m) must be a normal f32 for E in emin..=emax + 1.
        if emin + 23 - man < -126 || emax + 1 + 23 - man > 127 {
            return None;
        }
        let limit = (f.max_value() as f32).to_bits();
        let over = if f.overflow() == Overflow::Saturate {
            limit
        } else if f.specials() == Specials::Ieee {
            f32::INFINITY.to_bits()
        } else {
            f32::NAN.to_bits()
        };
        let binary16 = f.exp() == 5
            && f.man() == 10
            && f.specials() == Specials::Ieee
            && f.overflow() == Overflow::Infinity;
        Some(LaneRound::Narrow(NarrowFloat {
            e_lo: field(emin),
            e_hi: field(emax + 1),
            shift: ((23 - man) as u32) << 23,
            limit,
            over,
            binary16,
            plain_sums: float_plain_sums(man, emin, emax),
        }))
    }

    /// The lane constants of a float rounding, shared by the AVX-512 and AVX2 lanes: a
    /// shift count and five values (`Wide`: `s`, then `2^(s-1) - 1` and `!(2^s - 1)`;
    /// `Narrow`: 0, then `e_lo`, `e_hi`, `shift`, `limit`, `over`); `None` for posits.
    pub(crate) fn float_lanes(&self) -> Option<(u32, [u32; 5])> {
        match self {
            LaneRound::Wide(w) => Some((
                w.s,
                [(1u32 << (w.s - 1)) - 1, !((1u32 << w.s) - 1), 0, 0, 0],
            )),
            LaneRound::Narrow(n) => Some((0, [n.e_lo, n.e_hi, n.shift, n.limit, n.over])),
            LaneRound::Posit(_) => None,
        }
    }

    /// Whether the format is IEEE binary16 (the hardware's half precision).
    pub fn is_binary16(&self) -> bool {
        matches!(self, LaneRound::Narrow(n) if n.binary16)
    }

    /// Whether the sum of any two values of the format is an f32 by the bound below, so
    /// that it needs no rounding to odd before this rounding (the naive GEMM's sums in
    /// small formats). The bound is sufficient, not necessary: float<4,10>'s sums are all
    /// f32s (the values near its largest are coarse), but it is not claimed.
    ///
    /// Every value is a multiple of `2^q` and a sum of two is below `2^top` in magnitude,
    /// or equal to it (a power of two): the sum is an integer below `2^(top - q)` times
    /// `2^q`, an f32 where `top - q <= 24` (`2^q` is at least f32's smallest subnormal by
    /// the formats' admission).
    /// * A float with `m` fraction bits and exponents `emin..=emax`: `q = emin - m` (its
    ///   subnormals' spacing), `top = emax + 2`. e4m3: `10 + 9 = 19`, exact; e5m2:
    ///   `17 + 16 = 33`, not.
    /// * posit<n, es> with `maxpos = 2^E`, `minpos = 2^-E`: `q = -E`, `top = E + 1`, exact
    ///   for `E <= 11` (posit<8,0>: `E = 6`). Every posit is a multiple of minpos: a value
    ///   of scale `s` with `f` fraction bits has spacing `2^(s - f)`, and in regime `k < 0`
    ///   (`1 - k` regime bits, so `f = n - 2 - es + k`) with exponent field `e`,
    ///   `s - f = k·(2^es - 1) + e - n + 2 + es >= -(n - 2 - es)·2^es >= -E` as
    ///   `k >= -(n - 2 - es)` there; values whose fraction is cut are powers of two at or
    ///   above minpos, and regimes `k >= 0` have spacing at least `2^-(n - 3)`.
    /// * IEEE-range floats (`Wide`): never.
    pub fn sums_exact(&self) -> bool {
        let exponent = |bits: u32| (bits >> 23) as i32 - 127;
        let (q, top) = match self {
            LaneRound::Wide(_) => return false,
            LaneRound::Narrow(n) => {
                let m = 23 - (n.shift >> 23) as i32;
                (exponent(n.e_lo) - m, exponent(n.e_hi) + 1)
            }
            LaneRound::Posit(t) => (exponent(t.t_lo - RAISE), exponent(t.t_hi - RAISE) + 1),
        };
        top - q <= 24
    }

    /// A float rounding's grid: the mantissa bits `m`, the exponent of the subnormals'
    /// spacing `emin - m`, and the largest finite value's pattern; `None` for posits.
    fn float_grid(&self) -> Option<(i32, i32, u32)> {
        let exponent = |bits: u32| (bits >> 23) as i32 - 127;
        match self {
            LaneRound::Wide(w) => {
                let m = 23 - w.s as i32;
                Some((m, -126 - m, 0x7f7f_ffff & !((1u32 << w.s) - 1)))
            }
            LaneRound::Narrow(n) => {
                let m = 23 - (n.shift >> 23) as i32;
                Some((m, exponent(n.e_lo) - m, n.limit))
            }
            LaneRound::Posit(_) => None,
        }
    }

    /// Whether the native f32 sum of two values of the format, rounded by this rounding, is
    /// their correctly rounded sum, so that the naive GEMM needs no rounding to odd first:
    /// the check of "Plain sums" in the module docs, over every pair of binades (floats
    /// with at most 11 significand bits, posits with tapering enough), computed once when
    /// the rounding is built, or sums exact in f32 ([`LaneRound::sums_exact`]).
    pub fn rounds_plain_sums(&self) -> bool {
        let checked = match self {
            LaneRound::Wide(w) => w.plain_sums,
            LaneRound::Narrow(n) => n.plain_sums,
            LaneRound::Posit(t) => t.plain_sums,
        };
        checked || self.sums_exact()
    }

    /// Whether every finite value of `other`'s format is a value of this one: the same
    /// rounding, or floats where `other` has no more mantissa bits, no finer subnormal
    /// spacing and no larger finite value (its spacing is then a multiple of this one's in
    /// every binade, and its values lie within this range). Posits only contain
    /// themselves.
    pub fn contains(&self, other: &LaneRound) -> bool {
        if self == other {
            return true;
        }
        match (self.float_grid(), other.float_grid()) {
            (Some((m, q, max)), Some((mo, qo, maxo))) => mo <= m && qo >= q && maxo <= max,
            _ => false,
        }
    }

    /// Whether every Inf or NaN input, and every finite input beyond the format's overflow
    /// threshold, rounds to Inf or NaN: the formats that overflow to Inf or NaN. Posits and
    /// saturating floats clamp instead.
    pub fn keeps_specials(&self) -> bool {
        match self {
            LaneRound::Wide(_) => true,
            LaneRound::Narrow(n) => n.over != n.limit,
            LaneRound::Posit(_) => false,
        }
    }

    /// `x` rounded to the format, nearest even (the scalar definition of the lanes'
    /// rounding; for NaN inputs the result is NaN or Inf).
    pub fn round(&self, x: f32) -> f32 {
        let bits = x.to_bits();
        let out = match self {
            // A NaN's carry could run into the sign: NaN is kept as it is.
            LaneRound::Wide(_) if x.is_nan() => bits,
            LaneRound::Wide(w) => {
                let s = w.s;
                let half = (1u32 << s >> 1).wrapping_sub(1);
                (bits + half + ((bits >> s) & 1)) & !((1u32 << s) - 1)
            }
            LaneRound::Narrow(n) => {
                let sign = bits & SIGN;
                let abs = f32::from_bits(bits ^ sign);
                let e = (bits & EXP).clamp(n.e_lo, n.e_hi);
                let c = f32::from_bits(e + n.shift);
                let r = ((abs + c) - c).to_bits();
                let r = if r > n.limit { n.over } else { r };
                r | sign
            }
            LaneRound::Posit(p) => {
                let sign = bits & SIGN;
                let abs = bits ^ sign;
                let t = (abs + RAISE).clamp(p.t_lo, p.t_hi);
                let r = p.round_t(t) - RAISE;
                if abs == 0 {
                    0
                } else {
                    r | sign
                }
            }
        };
        f32::from_bits(out)
    }
}

/// Regime `k` of posit `p` rounded on a float pattern with `fraction_field` fraction bits
/// and the exponent field raised by one (see the module docs): the rounding bit `s =
/// fraction_field - fb(k)` of `t`, and the correction of the increment `2^(s-1) - 1` by the
/// parity. Where the whole exponent is cut (`fb(k) = -es`) the kept pattern ends in the
/// regime, whose last bit is 0 for `k >= 0` and 1 for `k < 0`, while the bit added as
/// parity is bit `s` of `t`, the low bit of `k` plus the raised bias over `2^es` (even for
/// f32 patterns with `es <= 6` and f64 ones with `es <= 9`): the correction is their
/// difference. Shared by the f32 tables here and the f64 ones of [`super::posit_f64`].
pub(crate) fn regime_step(p: &Posit, k: i32, fraction_field: i32) -> (i32, i64) {
    // Every binade of the regime has the same fraction bits.
    let fb = p.frac_bits(k << p.es());
    let correction = if fb == -(p.es() as i32) {
        i64::from(k < 0) - i64::from(k & 1)
    } else {
        0
    };
    (fraction_field - fb, correction)
}

/// [`plain_sums_by_binades`] for a float with `m` mantissa bits, exponents `emin..=emax`
/// and subnormals.
fn float_plain_sums(m: i32, emin: i32, emax: i32) -> bool {
    plain_sums_by_binades(emin - m, emax, |e| e.max(emin) - m)
}

/// The check of "Plain sums" in the module docs for a format whose values lie in binades
/// `e_lo..=e_hi` with spacing `2^spacing(e)` in binade `e`: for every pair of binades
/// `ey <= ex`, within or above `x`'s binade and below `x = 2^ex`, the sum is exact in f32
/// or the largest `|y|` plus f32's half spacing stays below the distance from `x` to the
/// nearest decision point (checked at the highest `ey` whose sums can be inexact, where
/// `|y|` is largest).
fn plain_sums_by_binades(e_lo: i32, e_hi: i32, spacing: impl Fn(i32) -> i32) -> bool {
    let pow2 = |e: i32| 2f64.powi(e);
    let half = |e: i32| pow2(spacing(e) - 1);
    (e_lo..=e_hi).all(|ex| {
        // The largest |y| of binade ey grows with ey: the binding binade is the highest one
        // whose sums with x can be inexact (spacing below `limit`), if any.
        let worst_y = |limit: i32| {
            (e_lo..=ex)
                .rev()
                .find(|&ey| spacing(ey) < limit)
                .map(|ey| pow2(ey + 1) - pow2(spacing(ey)))
        };
        let within = worst_y(ex - 22).is_none_or(|y| y + pow2(ex - 23) < half(ex));
        let below = worst_y(ex - 24).is_none_or(|y| y + pow2(ex - 25) < half(ex - 1));
        within && below
    })
}

impl PositTable {
    /// The tables of `p`: posits with `n <= 17` whose binades all round in f32's normal
    /// range (`maxpos² <= 2^125`).
    pub fn new(p: &Posit) -> Option<Self> {
        let (n, es) = (p.n() as i32, p.es() as i32);
        let k_max = n - 2;
        if n > 17 || 2 * p.max_scale() > 125 || es > 6 {
            return None;
        }
        let shift = 23 + es as u32;
        let mut table = PositTable {
            shift,
            t_lo: (p.min_pos() as f32).to_bits() + RAISE,
            t_hi: (p.max_pos() as f32).to_bits() + RAISE,
            half: [0; 32],
            mask: [u32::MAX; 32],
            arith: None,
            plain_sums: plain_sums_by_binades(-p.max_scale(), p.max_scale(), |e| {
                e - p.frac_bits(e).max(0)
            }),
            magic: PositMagic::new(p),
            es0: Es0Lanes::new(*p),
        };
        for k in -k_max..=k_max {
            // The top bits of t in regime k.
            let top = k + (128 >> es);
            let i = (top & 31) as usize;
            // Regime n - 2 holds maxpos alone (reached only by the clamp), which must stay:
            // increment 0, mask all ones (its parity bit, bit 0 of t, is 0).
            if k == k_max {
                continue;
            }
            let (s, correction) = regime_step(p, k, 23);
            if s <= 0 {
                return None;
            }
            let s = s as u32;
            table.half[i] = ((1i64 << (s - 1)) - 1 + correction) as u32;
            table.mask[i] = !((1u32 << s) - 1);
        }
        let arith = RegimeArith::new(n, es);
        table.arith = table.agrees_with(&arith).then_some(arith);
        Some(table)
    }

    /// `t` (clamped, raised) rounded by the table: the steps of [`LaneRound::round`].
    pub fn round_t(&self, t: u32) -> u32 {
        let i = ((t >> self.shift) & 31) as usize;
        // Bit s of t: the lowest bit the mask keeps.
        let odd = (t & self.mask[i].wrapping_neg() != 0) as u32;
        (t + self.half[i] + odd) & self.mask[i]
    }

    /// Whether `arith` rounds as the table: for every regime below maxpos, at the regime's
    /// first `t` (no bit below `23 + es`), its last, and the midpoints and their neighbours
    /// of its first binade (both parities of the kept pattern's last bit where fraction or
    /// exponent bits remain); `t_hi - 1` to maxpos, and `0` to itself.
    fn agrees_with(&self, arith: &RegimeArith) -> bool {
        let regimes = (self.t_lo >> self.shift)..(self.t_hi >> self.shift);
        let same = |t: u32| arith.round_t(t, self.shift) == self.round_t(t);
        regimes.into_iter().all(|top| {
            let t0 = (top << self.shift).max(self.t_lo);
            let end = ((top + 1) << self.shift) - 1;
            let s = arith.s(t0, self.shift);
            let mut ts = vec![t0, end];
            for step in [0u32, 1, 2, 3] {
                let base = t0 + (step << s);
                if s > 0 {
                    let mid = base + (1 << (s - 1));
                    ts.extend([base, mid - 1, mid, mid + 1]);
                }
            }
            ts.into_iter().filter(|&t| t <= end).all(same)
        }) && arith.round_t(self.t_hi - 1, self.shift) == self.t_hi
            && arith.round_t(0, self.shift) == 0
    }
}

/// Rounds `src` into `dst` with the vector lanes of the active instruction set
/// ([`crate::backend::isa::active`]: AVX-512 in [`super::lane_round_avx512`], AVX2 in
/// [`super::lane_round_avx2`]), `hardware_half` choosing the conversion for binary16; the
/// instruction set that ran, `None` where none did (portable, or no AVX2 form of `r`).
/// For the tests, which compare the lanes with the scalar definition under each cap.
pub fn round_run(r: &LaneRound, hardware_half: bool, src: &[f32], dst: &mut [f32]) -> Option<Isa> {
    round_run_kind(r, None, hardware_half, src, dst)
}

/// [`round_run`] with the posit kinds on doubled values (`sums` false: products,
/// `POSIT_RAISED`; true: sums of two values, `POSIT_SUM`), the results halved: `round(x)`
/// where the kinds apply (`2x` a normal f32; for sums, `x` zero or at least minpos in
/// magnitude); `None` where `r` is no posit or no lanes ran. For the tests.
pub fn round_raised_run(r: &LaneRound, sums: bool, src: &[f32], dst: &mut [f32]) -> Option<Isa> {
    if !matches!(r, LaneRound::Posit(_)) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    let kind = Some(if sums {
        super::lane_round_avx512::POSIT_SUM
    } else {
        super::lane_round_avx512::POSIT_RAISED
    });
    #[cfg(not(target_arch = "x86_64"))]
    let kind = None;
    let doubled: Vec<f32> = src.iter().map(|x| 2.0 * x).collect();
    let isa = round_run_kind(r, kind, false, &doubled, dst)?;
    for d in dst.iter_mut() {
        *d *= 0.5;
    }
    Some(isa)
}

#[allow(unused_variables)]
fn round_run_kind(
    r: &LaneRound,
    kind: Option<u8>,
    hardware_half: bool,
    src: &[f32],
    dst: &mut [f32],
) -> Option<Isa> {
    assert!(dst.len() >= src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use super::{lane_round_avx2, lane_round_avx512};
        if lane_round_avx512::round_run_kind(r, kind, hardware_half, src, dst) {
            return Some(Isa::Avx512);
        }
        if lane_round_avx2::round_run_kind(r, kind, hardware_half, src, dst) {
            return Some(Isa::Avx2);
        }
    }
    None
}
