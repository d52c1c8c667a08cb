//! posit<8,0> values as i16 integers in units of minpos, and its two rounded operations on
//! them: the product (by table) and the sum of two values (by a few integer operations).
//!
//! # Values
//!
//! posit<8,0> has no exponent bits: a positive value in `[2^e, 2^(e+1))` has a regime of
//! `e + 2` bits for `e >= 0` (`e + 1` ones and a zero) and of `1 - e` bits for `e < 0`, and
//! the rest of the seven bits after the sign are fraction bits. Below 1 (`e = -1 .. -6`)
//! there are `6 + e` fraction bits, so the spacing is `2^e · 2^-(6+e) = 2^-6`: every multiple
//! of `minpos = 2^-6` in `(0, 1)` is a value. In `[2^e, 2^(e+1))` with `e = 0 .. 5` there are
//! `5 - e` fraction bits, a spacing of `2^(2e-5)`. The largest value is `maxpos = 64`.
//! So every value is `u · 2^-6` with an integer `u`, `|u| <= 4096` ([`MAXPOS`]), and
//! in units of minpos:
//!
//! | `|u|` | binade | spacing (units) | values there |
//! |---|---|---|---|
//! | `0 .. 63` | below 1 | 1 | every integer |
//! | `64 .. 127` | `[1, 2)` | 2 | 32 |
//! | `128 .. 255` | `[2, 4)` | 8 | 16 |
//! | `256 .. 511` | `[4, 8)` | 32 | 8 |
//! | `512 .. 1023` | `[8, 16)` | 128 | 4 |
//! | `1024 .. 2047` | `[16, 32)` | 512 | 2 |
//! | `2048 .. 4095` | `[32, 64)` | 2048 | 1 (32) |
//! | `4096` | maxpos | | |
//!
//! The spacing in binade `e >= 0` is `2^s` units with `s = 2e + 1`.
//!
//! # The rounded sum
//!
//! The sum `v = c + p` of two values is exact in i16 (`|v| <= 8192`). Rounding it to the
//! posit (nearest, ties to the even pattern; no overflow, the posit saturates at maxpos;
//! a non-zero sum is at least one unit, a value, so nothing rounds to zero) is symmetric in
//! the sign (a posit's negation is the two's complement of its pattern, which keeps the
//! pattern's parity), so [`round_sum`] rounds `a = |v|`:
//!
//! * `a` is first capped at 4095: every `a >= 3073` rounds to 4096 (the values next to it
//!   are 2048 and 4096, and above 4096 the posit saturates), and so does 4095.
//! * The binade comes from `a >> 6` (0 .. 63) by two 64-entry tables ([`SHIFT`], [`BIAS`]):
//!   the spacing exponent `s` (0 below 64 units) and a bias.
//! * Nearest with ties to the even multiple: `(a + 2^(s-1) - 1 + odd) & !(2^s - 1)`, `odd`
//!   bit `s` of `a` (the parity of `a >> s`). Exact where `s = 0`: bias 0, the mask all
//!   ones, and `odd` is taken as `(a >> s) & !mask & 1`, which is 0 there.
//! * **Ties to the even pattern are ties to the even multiple** in binades 0 .. 4: a value
//!   `u = 64·2^e + f·2^s` has fraction `f` and pattern `regime | f`, and `u / 2^s =
//!   2^(5-e) + f` has `f`'s parity; the binade's upper end `64·2^(e+1)` (fraction 0, even
//!   pattern) is the even multiple `2^(6-e)` of the spacing. Sums that round up to that end
//!   land on the next binade's first value, as they should.
//! * **The top binade is the exception.** `[32, 64)` has no fraction bits: its only value is
//!   32 (pattern `0x7E`, even) and next comes 64 (`0x7F`, odd). The tie 48 (3072 units) goes
//!   to 32, although 32 is the odd multiple of the spacing 2048. There `a >> 11 = 1`
//!   always, so `odd = 1`, and [`BIAS`] holds `2^10 - 2` instead of `2^10 - 1`: in total
//!   `a + 1023`, which reaches 4096 exactly when `a > 3072`.
//!
//! `tests/naive_p8_lanes.rs` compares [`round_sum`] (and the vector kernels' rounding, and
//! the table [`P8Units::round`] built from it) with the exact operation tables
//! ([`super::gemm_cpu::OpTables`]) on all 65,025 sums of two finite values.
//!
//! # Patterns from units
//!
//! The product look-up is keyed by magnitude patterns: the pattern of a value `|u|` is `u`
//! itself below 64 units (below 1 the pattern is the value times 64), and in binade `e`
//! it counts the values from the binade's first, whose pattern is `128 - 2^(6-e)`:
//! `m = 128 - 2^(6-e) + (|u| - 64·2^e) / 2^s = (|u| >> s) + 128 - 3·2^(5-e)` ([`OFFSET`],
//! by the same index as the rounding's tables). maxpos (4096, capped to the top binade's
//! index) gives `2 + 125 = 127`. [`lane_code`] and [`row_index`] add the sign.
//!
//! # The rounded product
//!
//! `round(a · b)` comes from the exact 256 x 256 product table on the patterns: for each
//! `a` (by [`row_index`]: its magnitude pattern, bit 7 its sign), 128 i16 entries, one per
//! magnitude pattern of `b`; a negative `b` negates the entry (the rounding is symmetric).
//! NaR operands have no entry (their rows and columns are NaR, flagged by the callers).

use std::sync::OnceLock;

use super::gemm_cpu::OpTables;
use crate::format::{Format, Posit};

/// maxpos in units of minpos (`64 · 2^6`).
pub const MAXPOS: i16 = 4096;

/// The largest `|v|` that [`round_sum`] rounds as it is (larger sums round as 4095 does).
pub const CAP: i16 = MAXPOS - 1;

/// The spacing exponent `s` of each binade, by `min(|v|, 4095) >> 6` (see the module docs).
pub const SHIFT: [i16; 64] = tables().0;

/// The bias added before the mask, by `min(|v|, 4095) >> 6`: `2^(s-1) - 1`, 0 where `s = 0`,
/// `2^10 - 2` in the top binade (its tie goes down: see the module docs).
pub const BIAS: [i16; 64] = tables().1;

/// The magnitude pattern of `|u|` less `|u| >> s`, by `min(|u|, 4095) >> 6` (see the module
/// docs).
pub const OFFSET: [i16; 64] = tables().2;

const fn tables() -> ([i16; 64], [i16; 64], [i16; 64]) {
    let mut shift = [0i16; 64];
    let mut bias = [0i16; 64];
    let mut offset = [0i16; 64];
    let mut idx = 1;
    while idx < 64 {
        // idx in [2^e, 2^(e+1)): binade e, spacing 2^(2e + 1).
        let e = 15 - (idx as u16).leading_zeros() as i16;
        let s = 2 * e + 1;
        shift[idx] = s;
        bias[idx] = (1 << (s - 1)) - 1;
        if e == 5 {
            bias[idx] -= 1;
        }
        offset[idx] = 128 - 3 * (1 << (5 - e));
        idx += 1;
    }
    (shift, bias, offset)
}

/// `round(v)` for `v = c + p` the exact sum of two values in units (`|v| <= 8192`),
/// by the integer steps of the module docs (the vector kernels run the same steps).
#[inline]
pub fn round_sum(v: i16) -> i16 {
    let a = v.unsigned_abs().min(CAP as u16);
    let idx = (a >> 6) as usize;
    let s = SHIFT[idx] as u32;
    let mask = u16::MAX << s;
    let odd = (a >> s) & !mask & 1;
    let r = (a + BIAS[idx] as u16 + odd) & mask;
    if v < 0 {
        -(r as i16)
    } else {
        r as i16
    }
}

/// The magnitude pattern (0 ..= 127) of a value of `a` units, `0 <= a <= 4096`.
#[inline]
pub fn magnitude_pattern(a: u16) -> u16 {
    let idx = (a.min(CAP as u16) >> 6) as usize;
    (a >> SHIFT[idx]) + OFFSET[idx] as u16
}

/// A column's lane code for the product look-up: the magnitude pattern of the value of `u`
/// units (`|u| <= 4096`), bit 15 set where `u < 0`.
#[inline]
pub fn lane_code(u: i16) -> i16 {
    let m = magnitude_pattern(u.unsigned_abs()) as i16;
    if u < 0 {
        m | i16::MIN
    } else {
        m
    }
}

/// The product table row of the value of `u` units (`|u| <= 4096`): its magnitude pattern,
/// bit 7 set where `u < 0`.
#[inline]
pub fn row_index(u: i16) -> u8 {
    let m = magnitude_pattern(u.unsigned_abs()) as u8;
    if u < 0 {
        m | 0x80
    } else {
        m
    }
}

/// posit<8,0>, the one format of this module.
pub fn posit8_0() -> Posit {
    Posit::new(8, 0).expect("posit<8,0> is valid")
}

/// Whether `format` is posit<8,0>.
pub fn is_posit8_0(format: &Format) -> bool {
    matches!(format, Format::Posit(p) if *p == posit8_0())
}

/// The tables of the i16 arithmetic, built once per process from the exact operation
/// tables ([`OpTables`]).
#[derive(Debug)]
pub struct P8Units {
    /// `prod[row_index(a) · 128 + m]`: `round(a · b)` in units for a `b >= 0` of magnitude
    /// pattern `m`.
    pub prod: Vec<i16>,
    /// `units[p]`: the value of pattern `p` in units (0 for NaR).
    pub units: [i16; 256],
    /// `round[v + 8192]`: [`round_sum`] of every `v` in `-8192 ..= 8192`.
    pub round: Vec<i16>,
}

impl P8Units {
    /// The tables (built on first use).
    pub fn get() -> &'static P8Units {
        static TABLES: OnceLock<P8Units> = OnceLock::new();
        TABLES.get_or_init(P8Units::build)
    }

    fn build() -> P8Units {
        let format = Format::Posit(posit8_0());
        let ops = OpTables::get(&format).expect("posit<8,0> has operation tables");
        let mut units = [0i16; 256];
        for (u, &v) in units.iter_mut().zip(&ops.decode) {
            if v.is_finite() {
                *u = (v * 64.0) as i16;
            }
        }
        let nar = 0x80;
        let mut prod = vec![0i16; 256 * 128];
        for a in (0..256).filter(|&a| a != nar) {
            let row = row_index(units[a]) as usize;
            for m in 0..128 {
                prod[row * 128 + m] = units[ops.mul[a << 8 | m] as usize];
            }
        }
        let round = (-8192..=8192).map(|v| round_sum(v as i16)).collect();
        P8Units { prod, units, round }
    }

    /// [`round_sum`] by table.
    #[inline(always)]
    pub fn round(&self, v: i16) -> i16 {
        self.round[(i32::from(v) + 8192) as usize]
    }
}
