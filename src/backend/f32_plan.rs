//! The f32 fast path: rounding decided on the f32 bit pattern through a 256-entry table
//! indexed by the input's exponent byte.
//!
//! For every format of this crate, the grid an f32 value is rounded to depends only on its
//! binade `e` (see [`grid`](crate::format::grid)): a multiple of `2^q(e)`. On the f32 pattern that is
//! rounding the magnitude bits at bit `s = q - (e - 23)`: keep the bits above `s`, let the
//! rounding rule decide from the discarded `rem` whether to add `1 << s` (a carry runs into
//! the exponent field exactly as the value's binade changes). One table entry per exponent
//! byte holds `s`, how to read the tie parity, and which case applies:
//!
//! - `Round` (`1 <= s <= 23`); `Exact` (`s <= 0`: the grid is finer than f32's);
//! - `Tiny` (`s >= 24`: the quantum exceeds the value, the result is 0 or one quantum);
//! - `MinPos` / `MaxPos` (posit clamps);
//! - `Cut`: posit binades where exponent bits are cut off, for deterministic rules: the
//!   pattern is read with the exponent byte raised by one, so that rounding at bit `23 + c`
//!   rounds the exponent to a multiple of `2^c` (`F32Plan::round_posit`);
//! - `Slow`: f32 zeros, subnormals, Inf and NaN, and the other cut posit binades (stochastic
//!   rules, results outside f32's normal range): the general f64 path rounds these.
//!
//! Posit plans compute their entry from the exponent byte instead of reading the table (the
//! same values, tested), which vectorises better than a lookup.
//!
//! After rounding, magnitudes above the format's limit become the overflow value (floats:
//! Inf, NaN or max; fixed point: the range end). The result is bit-identical to the f64 path
//! for every f32 input: tests compare them at every rounding position of every exponent byte,
//! and `.ci/run` over all 2^32 patterns for several formats and modes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use crate::format::grid::{parts, pow2};
use crate::format::rounding::{RoundingRule, RuleKind};
use crate::format::{Block, Fixed, Float, Format, Overflow, Posit, Specials};

const SIGN: u32 = 0x8000_0000;

/// What the fast path does for one exponent byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Case {
    /// Already on the grid.
    Exact,
    /// Round at bit `s`.
    Round,
    /// Quantum above the value: 0 or one quantum.
    Tiny,
    /// Posit: below minpos.
    MinPos,
    /// Posit: at or above maxpos.
    MaxPos,
    /// Posit binade with `c` exponent bits cut off, deterministic rules: flagged by the
    /// vectorised pass and rounded by the fix-up to a power of two (see `F32Plan::round_posit`).
    Cut,
    /// Needs the general path.
    Slow,
}

/// One table entry.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Which case applies.
    pub case: Case,
    /// The rounding bit position.
    pub s: u8,
    /// XOR applied to bit `s` to get the parity of the kept encoding (posits whose pattern
    /// ends in an exponent or regime bit).
    pub flip: u8,
}

/// The mask of the `c` low bits (`0 <= c <= 31`).
#[inline(always)]
fn low_bits(c: u32) -> i32 {
    (1u32 << c).wrapping_sub(1) as i32
}

/// A posit table entry as computed by [`F32Plan::posit_entry`]: the rounding bit, the
/// parity correction, the clamps and whether the general path is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PositEntry {
    s: u32,
    flip: u32,
    /// `1 << 23` where the pattern is read with the exponent byte raised by one.
    bias: u32,
    min: bool,
    max: bool,
    slow: bool,
}

/// A limit no magnitude exceeds (magnitudes are below 2^31).
const NO_LIMIT: u32 = 0x7fff_ffff;

const SLOW: Entry = Entry {
    case: Case::Slow,
    s: 0,
    flip: 0,
};

/// The precomputed fast path for one (format, rounding rule) pair on f32 data.
#[derive(Debug, Clone)]
pub struct F32Plan {
    table: [Entry; 256],
    /// The same table packed as `tiny_s << 24 | case << 16 | flip << 8 | s` (`s` is 0
    /// unless the case rounds at a bit, `tiny_s` the bit of `Tiny` entries), for the
    /// vectorised pass.
    packed: [u32; 256],
    /// Magnitude bits above which a positive result overflows.
    limit_pos: u32,
    /// Same for negative results.
    limit_neg: u32,
    /// Magnitude bits of an overflowed positive result.
    over_pos: u32,
    /// Same for negative results.
    over_neg: u32,
    /// Bits of the quantum for `Tiny` entries.
    tiny: u32,
    /// Bits of minpos and maxpos (posits).
    min_pos: u32,
    max_pos: u32,
    /// Zero has no sign in this format (posit, fixed point).
    unsigned_zero: bool,
    /// Which of the selects the plan needs: [`POSIT`], [`SIGNED`] or [`GRID`].
    shape: u8,
    /// Posits: `es` and `26 - n + es` (the rounding bit less the regime length, plus 2),
    /// from which [`F32Plan::posit_entry`] computes the rounding bit.
    es: i32,
    s_offset: i32,
    /// Posits: the exponent bytes of each case, as ranges read off the table: `MinPos` in
    /// `1..min_end`, `MaxPos` in `max_start..255`, rounded (`Exact`, `Round`, `Cut`) in
    /// `fast_lo..=fast_hi` (none: `256..=0`), `Slow` elsewhere.
    min_end: i32,
    max_start: i32,
    fast_lo: i32,
    fast_hi: i32,
    /// Floats: `23 - man`, `emin + 127` and the extra shift below `emin` (`man` without
    /// subnormals, else 0), from which [`F32Plan::float_entry`] computes the rounding bit.
    s_normal: i32,
    emin_byte: i32,
    s_nosub: i32,
}

/// The plan's scalar constants, copied out of the plan once per run so that the loop
/// selects between values: between fields read inside the loop, LLVM turns
/// `if c { self.a } else { self.b }` into a load from a selected address, which vectorises
/// to a gather.
#[derive(Debug, Clone, Copy)]
struct Limits {
    limit_pos: u32,
    limit_neg: u32,
    over_pos: u32,
    over_neg: u32,
    tiny: u32,
    min_pos: u32,
    max_pos: u32,
}

/// A float table entry as computed by [`F32Plan::float_entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FloatEntry {
    /// The rounding bit of `Round` and `Exact` entries (0 otherwise).
    s: u32,
    /// The rounding bit of `Tiny` entries (at least 24).
    tiny_s: u32,
    flip: u32,
    tiny: bool,
    slow: bool,
}

/// Plan shape of posits: clamps to minpos/maxpos, never `Tiny`, no overflow limit,
/// unsigned zero.
const POSIT: u8 = 0;
/// Plan shape of floats: `Tiny`, one overflow limit for both signs, signed zero.
const SIGNED: u8 = 1;
/// Plan shape of fixed point: `Tiny`, a limit per sign, unsigned zero.
const GRID: u8 = 2;

fn f32_bits(v: f64) -> u32 {
    (v as f32).to_bits()
}

/// The case for rounding binade `e` to multiples of `2^q`.
fn grid_entry(e: i32, q: i32) -> Entry {
    let s = q - (e - 23);
    let case = match s {
        i32::MIN..=0 => Case::Exact,
        1..=23 => Case::Round,
        _ => Case::Tiny,
    };
    // At s = 23 the kept count is the hidden bit alone (odd), but bit 23 of the pattern is
    // the low bit of the biased exponent: flip it into the count's parity.
    let eb = (e + 127) as u8;
    Entry {
        case,
        s: s.clamp(0, 255) as u8,
        flip: if s == 23 { 1 ^ (eb & 1) } else { 0 },
    }
}

impl F32Plan {
    /// The plan for an elementwise format (posit, float, fixed); `None` for block floating
    /// point, whose grid depends on the block.
    pub fn new(format: &Format, kind: RuleKind) -> Option<Self> {
        let mut plan = match format {
            Format::Posit(p) => Self::posit(p, kind),
            Format::Float(f) => Self::float(f, kind),
            Format::Fixed(f) => Self::fixed(f),
            Format::Block(_) | Format::Lns(_) | Format::Mx(_) | Format::Nvfp4(_) => return None,
        };
        for (packed, entry) in plan.packed.iter_mut().zip(&plan.table) {
            let (s, tiny_s) = match entry.case {
                Case::Exact | Case::Round => (entry.s as u32, 0),
                Case::Tiny => (0, entry.s as u32),
                _ => (0, 0),
            };
            *packed = (tiny_s << 24) | ((entry.case as u32) << 16) | ((entry.flip as u32) << 8) | s;
        }
        Some(plan)
    }

    /// [`F32Plan::new`] through a per-thread cache: a plan is built once per (format, rule)
    /// and thread, then shared. Training rounds with the same few formats hundreds of times
    /// a step (the convolutions round per image, on every thread), and building the 256
    /// entries costs more than rounding a small tensor.
    pub fn shared(format: &Format, kind: RuleKind) -> Option<Arc<Self>> {
        /// Plans kept at most; a sweep over more formats than this starts the cache afresh.
        const CAPACITY: usize = 64;
        thread_local! {
            static CACHE: RefCell<HashMap<(Format, RuleKind), Arc<F32Plan>>> =
                RefCell::new(HashMap::new());
        }
        if matches!(format, Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_)) {
            return None;
        }
        CACHE.with_borrow_mut(|plans| {
            let key = (*format, kind);
            if let Some(plan) = plans.get(&key) {
                return Some(Arc::clone(plan));
            }
            let plan = Arc::new(Self::new(format, kind)?);
            if plans.len() >= CAPACITY {
                plans.clear();
            }
            plans.insert(key, Arc::clone(&plan));
            Some(plan)
        })
    }

    fn empty(unsigned_zero: bool) -> Self {
        F32Plan {
            table: [SLOW; 256],
            packed: [0; 256],
            limit_pos: NO_LIMIT,
            limit_neg: NO_LIMIT,
            over_pos: 0,
            over_neg: 0,
            tiny: 0,
            min_pos: 0,
            max_pos: 0,
            unsigned_zero,
            shape: GRID,
            es: 0,
            s_offset: 0,
            min_end: 1,
            max_start: 255,
            fast_lo: 256,
            fast_hi: 0,
            s_normal: 0,
            emin_byte: 0,
            s_nosub: 0,
        }
    }

    /// The scalar constants of [`Limits`].
    #[inline(always)]
    fn limits(&self) -> Limits {
        Limits {
            limit_pos: self.limit_pos,
            limit_neg: self.limit_neg,
            over_pos: self.over_pos,
            over_neg: self.over_neg,
            tiny: self.tiny,
            min_pos: self.min_pos,
            max_pos: self.max_pos,
        }
    }

    fn posit(p: &Posit, kind: RuleKind) -> Self {
        let mut plan = Self::empty(true);
        plan.shape = POSIT;
        let cut_fast = kind != RuleKind::Stochastic;
        plan.min_pos = f32_bits(p.min_pos());
        plan.max_pos = f32_bits(p.max_pos());
        let max_scale = p.max_scale();
        plan.es = p.es() as i32;
        plan.s_offset = 26 - p.n() as i32 + p.es() as i32;
        for eb in 1..255u32 {
            let e = eb as i32 - 127;
            plan.table[eb as usize] = if e >= max_scale {
                Entry {
                    case: Case::MaxPos,
                    ..SLOW
                }
            } else if e < -max_scale {
                Entry {
                    case: Case::MinPos,
                    ..SLOW
                }
            } else {
                let fb = p.frac_bits(e);
                if fb < 0 {
                    // The result is 2^(e rounded to a multiple of 2^-fb): an f32 power of two
                    // unless that lies outside f32's normal range (the general path then
                    // gives a subnormal or Inf). Stochastic rounding draws against the
                    // non-uniform gap on the general path. The pattern is read with
                    // exponent byte eb + 1 (see `round_posit`), whose bit 23 + c is bit c
                    // of e: the kept pattern's last bit, unless that is the regime's
                    // (c = es), set only below 1.
                    let c = -fb as u32;
                    let e_down = e & !low_bits(c);
                    if cut_fast && e_down >= -126 && e_down + low_bits(c) < 127 {
                        let last = (e >> c) & 1 == 1;
                        let regime_last = c == p.es() && e < 0;
                        Entry {
                            case: Case::Cut,
                            s: 23 + c as u8,
                            flip: if c == p.es() {
                                (last ^ regime_last) as u8
                            } else {
                                0
                            },
                        }
                    } else {
                        SLOW
                    }
                } else {
                    let mut entry = grid_entry(e, e - fb);
                    if fb == 0 {
                        // Bit 23 of the pattern is the low bit of the biased exponent; the
                        // posit pattern's last bit is the low exponent bit (es >= 1) or the
                        // last regime bit (es = 0, set only below 1).
                        let pattern_odd = if p.es() > 0 { e & 1 == 1 } else { e < 0 };
                        entry.flip = (pattern_odd as u8) ^ (eb & 1) as u8;
                    }
                    entry
                }
            };
        }
        plan.case_ranges();
        plan
    }

    /// Sets the posit case ranges from the table (each case occupies one range of exponent
    /// bytes, as the test `posit_entries_match_the_table` checks for every posit).
    fn case_ranges(&mut self) {
        let case = |eb: i32| self.table[eb as usize].case;
        let min_end = (1..255).find(|&eb| case(eb) != Case::MinPos).unwrap_or(255);
        let max_start = (1..255)
            .rev()
            .find(|&eb| case(eb) != Case::MaxPos)
            .map_or(1, |eb| eb + 1);
        let fast = |eb: &i32| matches!(case(*eb), Case::Exact | Case::Round | Case::Cut);
        let (fast_lo, fast_hi) = match ((1..255).find(fast), (1..255).rev().find(fast)) {
            (Some(lo), Some(hi)) => (lo, hi),
            _ => (256, 0),
        };
        self.min_end = min_end;
        self.max_start = max_start;
        self.fast_lo = fast_lo;
        self.fast_hi = fast_hi;
    }

    fn float(f: &Float, kind: RuleKind) -> Self {
        let mut plan = Self::empty(false);
        let man = f.man() as i32;
        let emin = f.emin();
        for eb in 1..255u32 {
            let e = eb as i32 - 127;
            let q = if e >= emin {
                e - man
            } else if f.subnormals() {
                emin - man
            } else {
                emin
            };
            plan.table[eb as usize] = grid_entry(e, q);
        }
        plan.tiny = f32_bits(if f.subnormals() {
            pow2(emin - man)
        } else {
            pow2(emin)
        });
        let max = f32_bits(f.max_value());
        let over = if kind == RuleKind::TowardZero || f.overflow() == Overflow::Saturate {
            max
        } else if f.specials() == Specials::Ieee {
            f32::INFINITY.to_bits()
        } else {
            f32::NAN.to_bits()
        };
        plan.limit_pos = max;
        plan.limit_neg = max;
        plan.over_pos = over;
        plan.over_neg = over;
        plan.shape = SIGNED;
        plan.s_normal = 23 - man;
        plan.emin_byte = emin + 127;
        plan.s_nosub = if f.subnormals() { 0 } else { man };
        plan
    }

    fn fixed(f: &Fixed) -> Self {
        let mut plan = Self::empty(true);
        let q = -f.fl();
        for eb in 1..255u32 {
            plan.table[eb as usize] = grid_entry(eb as i32 - 127, q);
        }
        plan.tiny = f32_bits(pow2(q));
        if f.clamp() {
            plan.limit_pos = f32_bits(f.max_value());
            plan.limit_neg = f32_bits(-f.min_value());
            plan.over_pos = plan.limit_pos;
            plan.over_neg = plan.limit_neg;
        }
        plan
    }
}

impl F32Plan {
    /// The fast-path result for one element: the output pattern and whether the element
    /// needs the general path. `SHAPE` is the plan's [`F32Plan::shape`]; each shape drops
    /// the selects the others need, which keeps the vectorised loop short.
    #[inline(always)]
    fn round_one<R: RoundingRule, const SHAPE: u8>(
        &self,
        x: f32,
        r: u32,
        rule: R,
        lim: Limits,
    ) -> (u32, bool) {
        let bits = x.to_bits();
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        if SHAPE == POSIT {
            return self.round_posit(abs, sign, r, rule, lim);
        }
        let m = (abs & 0x007f_ffff) | 0x0080_0000;
        if SHAPE == SIGNED {
            let entry = self.float_entry(abs >> 23);
            let rounded = rule.round_bits(abs, entry.s, ((abs >> entry.s) ^ entry.flip) & 1, r);
            let slow = entry.slow & (abs != 0);
            let tiny = if rule.up_tiny(m, entry.tiny_s, r) {
                lim.tiny
            } else {
                0
            };
            let mag = if entry.tiny { tiny } else { rounded };
            // Floats write the elements left to the general path (which round at bit 0)
            // unchanged, so their in-place pass needs no select (a masked store).
            let mag = if slow {
                abs
            } else if mag > lim.limit_pos {
                lim.over_pos
            } else {
                mag
            };
            return (mag | sign, slow);
        }
        let e = self.packed[(abs >> 23) as usize];
        let s = e & 0xff;
        let flip = (e >> 8) & 1;
        let case = (e >> 16) & 0xff;
        let rounded = rule.round_bits(abs, s, ((abs >> s) ^ flip) & 1, r);
        let slow = case == Case::Slow as u32 && abs != 0;
        let tiny = if rule.up_tiny(m, e >> 24, r) {
            lim.tiny
        } else {
            0
        };
        let mag = if case == Case::Tiny as u32 {
            tiny
        } else {
            rounded
        };
        let negative = sign != 0;
        let limit = if negative {
            lim.limit_neg
        } else {
            lim.limit_pos
        };
        let over = if negative { lim.over_neg } else { lim.over_pos };
        let mag = if mag > limit { over } else { mag };
        let out = if mag == 0 && self.unsigned_zero {
            0
        } else {
            mag | sign
        };
        (out, slow)
    }

    /// The float table entry of exponent byte `eb`, computed (the same values as the
    /// table, see the test `float_entries_match_the_table`): binade `e >= emin` rounds at
    /// bit `s = 23 - man`; below `emin` the quantum stays that of `emin` (subnormals, `d =
    /// emin - e` more bits) or is `2^emin` (no subnormals: `man` more again). `s <= 0` is
    /// exact (round at bit 0), `s >= 24` tiny; at `s = 23` the kept count is the hidden bit
    /// alone, odd, while the pattern's bit 23 is the exponent byte's low bit (`flip`).
    /// Exponent bytes 0 and 255 take the general path, rounding at bit 0. Computing this is
    /// cheaper than the table lookup, a gather per vector.
    #[inline(always)]
    fn float_entry(&self, eb: u32) -> FloatEntry {
        let b = eb as i32;
        let d = (self.emin_byte - b).max(0);
        let s_raw = self.s_normal + d + if d > 0 { self.s_nosub } else { 0 };
        let slow = (b == 0) | (b == 255);
        let tiny = (s_raw >= 24) & !slow;
        let s = if slow | tiny { 0 } else { s_raw.max(0) as u32 };
        FloatEntry {
            s,
            tiny_s: if tiny { s_raw.min(255) as u32 } else { 0 },
            flip: (s == 23) as u32 & !eb,
            tiny,
            slow,
        }
    }

    /// [`F32Plan::round_one`] for posits, with the table entry computed instead of looked
    /// up (see [`F32Plan::posit_entry`]). Binades from `s = 23` on (the kept pattern ends
    /// in the exponent field or the regime) are read with the exponent byte raised by one,
    /// `e + 128`, whose low bits are those of `e` (the posit's exponent bits): rounding at bit
    /// `23 + c` then rounds `e` to a multiple of `2^c` from the guard bit, the sticky bits
    /// below it and the fraction, as the posit pattern does, and the carry runs into the
    /// exponent byte; the byte is lowered again afterwards.
    #[inline(always)]
    fn round_posit<R: RoundingRule>(
        &self,
        abs: u32,
        sign: u32,
        r: u32,
        rule: R,
        lim: Limits,
    ) -> (u32, bool) {
        let entry = self.posit_entry(abs >> 23);
        let t = abs + entry.bias;
        let rounded = rule
            .round_bits(t, entry.s, ((t >> entry.s) ^ entry.flip) & 1, r)
            .wrapping_sub(entry.bias);
        let mag = if entry.min {
            lim.min_pos
        } else if entry.max {
            lim.max_pos
        } else {
            rounded
        };
        // Posit zero has no sign; every nonzero input rounds to a nonzero posit.
        (
            if mag == 0 { 0 } else { mag | sign },
            (abs != 0) & entry.slow,
        )
    }

    /// The posit table entry of exponent byte `eb`, computed (the same values as the
    /// table, see the test `posit_entries_match_the_table`): for binade `e` the regime
    /// takes `rl = ((e XOR (e >> 31)) >> es) + 2` bits (the XOR turns `e < 0` into
    /// `-e - 1`), leaving `n - 1 - rl - es` fraction bits, so the rounding bit is
    /// `s = rl + 24 - n + es`; `s > 23` means `c = s - 23` exponent bits are cut, `s <= 0`
    /// that the grid is finer than f32's. From `s = 23` on the pattern is read with the
    /// exponent byte raised by one ([`F32Plan::round_posit`]): its bit `s` is then bit `c`
    /// of `e`, the kept pattern's last bit, except where that is the regime's last bit
    /// (`c = es`), set only below 1: `flip` corrects the parity. The case is read from the
    /// plan's ranges of exponent bytes. Elements left to the general path round at bit 0
    /// without bias, so the pass writes them unchanged (the in-place pass needs no select).
    /// Computing all this is cheaper than a table lookup per element, which AVX2 can only do
    /// as eight scalar loads.
    #[inline(always)]
    fn posit_entry(&self, eb: u32) -> PositEntry {
        let e = eb as i32 - 127;
        let s_raw = ((e ^ (e >> 31)) >> self.es) + self.s_offset;
        let b = eb as i32;
        let min = (b >= 1) & (b < self.min_end);
        let max = (b >= self.max_start) & (b <= 254);
        let fast = (b >= self.fast_lo) & (b <= self.fast_hi);
        let at_regime = s_raw - 23 == self.es;
        PositEntry {
            s: if fast { s_raw.max(0) as u32 } else { 0 },
            flip: if at_regime {
                ((e >> self.es) as u32 & 1) ^ (e < 0) as u32
            } else {
                0
            },
            bias: if fast & (s_raw >= 23) { 1 << 23 } else { 0 },
            min,
            max,
            slow: !(fast | min | max),
        }
    }

    #[inline(always)]
    fn run<R: RoundingRule, const SHAPE: u8>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool {
        let lim = self.limits();
        map_groups::<R>(src, dst, random, move |x, r| {
            self.round_one::<R, SHAPE>(x, r, rule, lim)
        })
    }

    #[inline(always)]
    fn run_in_place<R: RoundingRule, const SHAPE: u8>(
        &self,
        buf: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool {
        let lim = self.limits();
        map_groups_in_place::<R>(buf, random, move |x, r| {
            let (out, slow) = self.round_one::<R, SHAPE>(x, r, rule, lim);
            // Posit and float passes write the input of an element they leave behind.
            let out = if SHAPE != GRID || !slow {
                out
            } else {
                x.to_bits()
            };
            (out, slow)
        })
    }
}

/// Nearest-even rounding one element at a time, for kernels that keep their values in
/// registers: the plan's constants copied out once ([`F32Plan::lanes`]), the per-element
/// step of the vectorised pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NearestLanes<'a> {
    plan: &'a F32Plan,
    lim: Limits,
}

/// The shape of a posit plan ([`F32Plan::shape`]).
pub(crate) const SHAPE_POSIT: u8 = POSIT;
/// The shape of a float plan ([`F32Plan::shape`]).
pub(crate) const SHAPE_FLOAT: u8 = SIGNED;

impl F32Plan {
    /// Which selects the plan's rounding needs: [`SHAPE_POSIT`], [`SHAPE_FLOAT`] or fixed
    /// point's.
    pub(crate) fn shape(&self) -> u8 {
        self.shape
    }

    /// The per-element nearest-even step of this plan (built for a nearest-even rule).
    pub(crate) fn lanes(&self) -> NearestLanes<'_> {
        NearestLanes {
            plan: self,
            lim: self.limits(),
        }
    }
}

impl NearestLanes<'_> {
    /// `x` rounded to nearest even: the result's pattern, and whether `x` needs the general
    /// path instead (then the pattern is a placeholder). `SHAPE` must be the plan's
    /// [`F32Plan::shape`].
    #[inline(always)]
    pub(crate) fn round<const SHAPE: u8>(&self, x: f32) -> (u32, bool) {
        use crate::format::rounding::NearestEven;
        self.plan
            .round_one::<NearestEven, SHAPE>(x, 0, NearestEven, self.lim)
    }
}

impl RunRounder for F32Plan {
    /// Branch-free rounding of a run of values (no calls, no data-dependent branches, so the
    /// loop vectorises): writes every element's fast-path result to `dst` and returns whether
    /// any element needs the general path ([`RunRounder::needs_slow`]); those elements hold a
    /// placeholder. `random` holds each element's random word (ignored by deterministic
    /// rules; may be empty for them).
    #[inline(always)]
    fn round_run<R: RoundingRule>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool {
        match self.shape {
            POSIT => self.run::<R, POSIT>(src, dst, rule, random),
            SIGNED => self.run::<R, SIGNED>(src, dst, rule, random),
            _ => self.run::<R, GRID>(src, dst, rule, random),
        }
    }

    /// [`RunRounder::round_run`] with `buf` as both input and output.
    #[inline(always)]
    fn round_run_in_place<R: RoundingRule>(
        &self,
        buf: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool {
        match self.shape {
            POSIT => self.run_in_place::<R, POSIT>(buf, rule, random),
            SIGNED => self.run_in_place::<R, SIGNED>(buf, rule, random),
            _ => self.run_in_place::<R, GRID>(buf, rule, random),
        }
    }

    /// Whether `round_run` leaves `x` to the general path (computed for posits, so that a
    /// scan for such elements vectorises).
    #[inline(always)]
    fn needs_slow(&self, x: f32) -> bool {
        let abs = x.to_bits() & !SIGN;
        if self.shape == POSIT {
            let entry = self.posit_entry(abs >> 23);
            return (abs != 0) & entry.slow;
        }
        abs != 0 && self.table[(abs >> 23) as usize].case == Case::Slow
    }
}

impl BlockF32Plan {
    /// The fast-path result for one element and whether it needs the general path.
    /// Written with masks instead of branches or lookups (the sign picks the limit by a
    /// mask, not an index), so that the loop over a run vectorises.
    #[inline(always)]
    fn round_one<R: RoundingRule>(&self, x: f32, r: u32, rule: R) -> (u32, bool) {
        let bits = x.to_bits();
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        let byte = abs >> 23;
        let slow = ((byte == 0) & (abs != 0)) | (byte == 255);
        // Elements left to the general path round at bit 0 with no limit, which writes
        // them unchanged: the in-place pass then stores every lane without a select (which
        // compiles to a masked store, slow on AMD processors).
        let keep = 0u32.wrapping_sub(slow as u32);
        let shift = (self.q150 - byte as i32) & !(keep as i32);
        let s = shift.clamp(0, 23) as u32;
        // At s = 23 the kept count is the hidden bit alone (odd).
        let odd = ((abs >> s) & 1) | (s == 23) as u32;
        let rounded = rule.round_bits(abs, s, odd, r);
        let m = (abs & 0x007f_ffff) | 0x0080_0000;
        let tiny_s = shift.clamp(24, 255) as u32;
        let tiny = self.tiny & 0u32.wrapping_sub(rule.up_tiny(m, tiny_s, r) as u32);
        let mag = if shift >= 24 { tiny } else { rounded };
        let negative = 0u32.wrapping_sub(sign >> 31);
        let limit = (self.limit_pos ^ ((self.limit_pos ^ self.limit_neg) & negative)) | keep;
        let mag = mag.min(limit) & 0u32.wrapping_sub((abs != 0) as u32);
        let out = mag | (sign & 0u32.wrapping_sub((mag != 0) as u32));
        (out, slow)
    }
}

impl RunRounder for BlockF32Plan {
    /// Branch-free rounding of a run of values of this block (vectorises); returns whether
    /// any element needs the general path ([`RunRounder::needs_slow`]).
    #[inline(always)]
    fn round_run<R: RoundingRule>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool {
        if !self.fast {
            return true;
        }
        map_groups::<R>(src, dst, random, |x, r| self.round_one(x, r, rule))
    }

    /// [`RunRounder::round_run`] with `buf` as both input and output.
    #[inline(always)]
    fn round_run_in_place<R: RoundingRule>(
        &self,
        buf: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool {
        if !self.fast {
            return true;
        }
        // Elements left to the general path come out unchanged.
        map_groups_in_place::<R>(buf, random, |x, r| self.round_one(x, r, rule))
    }

    /// Whether `round_run` leaves `x` to the general path.
    #[inline(always)]
    fn needs_slow(&self, x: f32) -> bool {
        let abs = x.to_bits() & !SIGN;
        let byte = abs >> 23;
        !self.fast || (byte == 0 && abs != 0) || byte == 255
    }
}

/// Elements per group of the vectorised loops: one AVX-512 vector of f32.
const GROUP: usize = 16;

/// `dst[j] = f(src[j], random[j])` (the word is 0 for deterministic rules, whose `random`
/// may be empty); true if `f` flagged any element. The loop runs over fixed-size groups of
/// [`GROUP`] elements copied into arrays, so the compiler vectorises each group in full
/// with no bounds or overlap checks (over plain slices it kept a scalar copy of the loop,
/// which ran for a large share of the elements); the last partial group is rounded one by
/// one.
#[inline(always)]
fn map_groups<R: RoundingRule>(
    src: &[f32],
    dst: &mut [f32],
    random: &[u32],
    f: impl Fn(f32, u32) -> (u32, bool),
) -> bool {
    let stochastic = R::KIND == RuleKind::Stochastic;
    let n = src.len().min(dst.len());
    let full = n - n % GROUP;
    // One flag per lane, reduced once after the loop (a single flag was reduced across the
    // lanes in every group).
    let mut lanes = [0u32; GROUP];
    for g in (0..full).step_by(GROUP) {
        let x: [f32; GROUP] = src[g..g + GROUP].try_into().expect("a full group");
        let r: [u32; GROUP] = if stochastic {
            random[g..g + GROUP].try_into().expect("a full group")
        } else {
            [0; GROUP]
        };
        let o: &mut [f32; GROUP] = (&mut dst[g..g + GROUP]).try_into().expect("a full group");
        for j in 0..GROUP {
            let (out, slow) = f(x[j], r[j]);
            o[j] = f32::from_bits(out);
            lanes[j] |= slow as u32;
        }
    }
    let mut any_slow = lanes.iter().fold(0, |a, &l| a | l);
    for j in full..n {
        let (out, slow) = f(src[j], if stochastic { random[j] } else { 0 });
        dst[j] = f32::from_bits(out);
        any_slow |= slow as u32;
    }
    any_slow != 0
}

/// [`map_groups`] with `buf` as both input and output.
#[inline(always)]
fn map_groups_in_place<R: RoundingRule>(
    buf: &mut [f32],
    random: &[u32],
    f: impl Fn(f32, u32) -> (u32, bool),
) -> bool {
    let stochastic = R::KIND == RuleKind::Stochastic;
    let n = buf.len();
    let full = n - n % GROUP;
    let mut lanes = [0u32; GROUP];
    for g in (0..full).step_by(GROUP) {
        let o: &mut [f32; GROUP] = (&mut buf[g..g + GROUP]).try_into().expect("a full group");
        let x = *o;
        let r: [u32; GROUP] = if stochastic {
            random[g..g + GROUP].try_into().expect("a full group")
        } else {
            [0; GROUP]
        };
        for j in 0..GROUP {
            let (out, slow) = f(x[j], r[j]);
            o[j] = f32::from_bits(out);
            lanes[j] |= slow as u32;
        }
    }
    let mut any_slow = lanes.iter().fold(0, |a, &l| a | l);
    for j in full..n {
        let (out, slow) = f(buf[j], if stochastic { random[j] } else { 0 });
        buf[j] = f32::from_bits(out);
        any_slow |= slow as u32;
    }
    any_slow != 0
}

/// A rounding of f32 runs with a vectorisable pass and the general path for the elements it
/// leaves behind: the elementwise [`F32Plan`] and one block's [`BlockF32Plan`].
pub trait RunRounder: Sync {
    /// Rounds `src` into `dst`; true if some element needs the general path.
    fn round_run<R: RoundingRule>(
        &self,
        src: &[f32],
        dst: &mut [f32],
        rule: R,
        random: &[u32],
    ) -> bool;
    /// [`RunRounder::round_run`] with `buf` as both input and output; elements that need the
    /// general path keep their input value. (Rounded elements may also answer
    /// [`RunRounder::needs_slow`], e.g. an overflow to Inf; rounding them again returns them
    /// unchanged, since every format value rounds to itself.)
    fn round_run_in_place<R: RoundingRule>(&self, buf: &mut [f32], rule: R, random: &[u32])
        -> bool;
    /// Whether `x` needs the general path.
    fn needs_slow(&self, x: f32) -> bool;

    /// Rounds one value: the vectorised step on a run of one, or `slow` (the general f64
    /// path) where the fast path does not apply.
    #[inline(always)]
    fn round<R: RoundingRule>(
        &self,
        x: f32,
        rule: R,
        random: u32,
        slow: impl Fn(f64, u32) -> f64,
    ) -> f32 {
        let mut out = [0f32];
        if self.round_run(&[x], &mut out, rule, &[random]) {
            return slow(x as f64, random) as f32;
        }
        out[0]
    }
}

/// The f32 fast path for one block of block floating point, whose grid (multiples of
/// `2^q`, `q = E - (wl - 2)`) and clamp range are fixed by the block's largest magnitude.
/// The bit position follows from the exponent byte arithmetically, `s = q + 150 - byte`.
#[derive(Debug, Clone, Copy)]
pub struct BlockF32Plan {
    q150: i32,
    limit_pos: u32,
    limit_neg: u32,
    tiny: u32,
    /// False when the block has no finite nonzero element or its grid is finer than f32's
    /// normal range: every element takes the general path.
    fast: bool,
}

impl BlockF32Plan {
    /// The plan for a block of `block` whose largest finite magnitude is `block_max`.
    pub fn new(block: &Block, block_max: f64) -> Self {
        if block_max == 0.0 {
            return BlockF32Plan {
                q150: 0,
                limit_pos: 0,
                limit_neg: 0,
                tiny: 0,
                fast: false,
            };
        }
        let e = parts(block_max).e;
        let q = e - (block.wl() as i32 - 2);
        let top = (1u64 << (block.wl() - 1)) as f64 * pow2(q);
        BlockF32Plan {
            q150: q + 150,
            limit_pos: f32_bits(top - pow2(q)),
            limit_neg: f32_bits(top),
            tiny: f32_bits(pow2(q)),
            fast: q >= -126,
        }
    }

    /// The same fast path for fixed point, whose grid (multiples of `2^-fl`) and clamp
    /// range are those of every element: the limits and the quantum are the ones
    /// [`F32Plan`] uses for the format, so both paths give the same bits. Computing the
    /// rounding bit from the exponent byte avoids the table lookup, which AVX2 and AVX-512
    /// can only do as a gather.
    pub fn from_fixed(fixed: &Fixed) -> Self {
        let q = -fixed.fl();
        let (limit_pos, limit_neg) = if fixed.clamp() {
            (f32_bits(fixed.max_value()), f32_bits(-fixed.min_value()))
        } else {
            (NO_LIMIT, NO_LIMIT)
        };
        BlockF32Plan {
            q150: q + 150,
            limit_pos,
            limit_neg,
            tiny: f32_bits(pow2(q)),
            fast: q >= -126,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The computed posit entries equal the table built from `Posit::frac_bits` for every
    /// exponent byte of every posit format and both kinds of table (deterministic rules
    /// round cut binades, stochastic ones leave them to the general path): the same case,
    /// and where the case rounds, the same bit and tie parity for every pattern.
    #[test]
    fn posit_entries_match_the_table() {
        let mut formats = 0;
        let mut cut = 0;
        for n in 2..=32 {
            for es in 0..=5 {
                let format: Format = format!("posit<{n},{es}>").parse().expect("a posit");
                for kind in [RuleKind::NearestEven, RuleKind::Stochastic] {
                    let plan = F32Plan::new(&format, kind).expect("a posit plan");
                    formats += 1;
                    for eb in 0..256u32 {
                        let t = plan.table[eb as usize];
                        let got = plan.posit_entry(eb);
                        let at = format!("{format} {kind:?}, exponent byte {eb}");
                        assert_eq!(got.min, t.case == Case::MinPos, "{at}");
                        assert_eq!(got.max, t.case == Case::MaxPos, "{at}");
                        assert_eq!(got.slow, t.case == Case::Slow, "{at}");
                        if got.min || got.max || got.slow {
                            continue;
                        }
                        assert_eq!(got.s, t.s as u32, "{at}");
                        if t.case == Case::Cut {
                            cut += 1;
                            assert!(got.bias == 1 << 23 && got.flip == t.flip as u32, "{at}");
                            continue;
                        }
                        assert!(matches!(t.case, Case::Exact | Case::Round), "{at}");
                        // The parity the rounding reads from a pattern of this binade.
                        for low in [0, 0x0040_0000, 0x007f_ffff] {
                            let abs = (eb << 23) | low;
                            let s = got.s.min(31);
                            let want = ((abs >> t.s) ^ t.flip as u32) & 1;
                            let read = (((abs + got.bias) >> s) ^ got.flip) & 1;
                            assert_eq!(read, want, "{at}, pattern {abs:#x}");
                        }
                    }
                }
            }
        }
        assert_eq!(formats, 31 * 6 * 2, "posit plans built");
        assert!(cut > 1000, "only {cut} cut binades seen");
    }

    /// The computed float entries equal the table built from the format's grid for every
    /// exponent byte of every float format (each exponent and mantissa width, with and
    /// without subnormals): the same case, and where it rounds, the same bit and tie parity
    /// for every pattern.
    #[test]
    fn float_entries_match_the_table() {
        let mut formats = 0;
        let mut tiny = 0;
        for exp in 2..=8 {
            for man in 1..=23 {
                for options in ["", ",nosub"] {
                    let format: Format = format!("float<{exp},{man}{options}>")
                        .parse()
                        .expect("a float");
                    let plan = F32Plan::new(&format, RuleKind::NearestEven).expect("a plan");
                    formats += 1;
                    for eb in 0..256u32 {
                        let t = plan.table[eb as usize];
                        let got = plan.float_entry(eb);
                        let at = format!("{format}, exponent byte {eb}");
                        assert_eq!(got.slow, t.case == Case::Slow, "{at}");
                        assert_eq!(got.tiny, t.case == Case::Tiny, "{at}");
                        if got.tiny {
                            tiny += 1;
                            assert_eq!((got.s, got.tiny_s), (0, t.s as u32), "{at}");
                            continue;
                        }
                        if got.slow {
                            assert_eq!(got.s, 0, "{at}");
                            continue;
                        }
                        assert!(matches!(t.case, Case::Exact | Case::Round), "{at}");
                        assert_eq!(got.s, t.s as u32, "{at}");
                        for low in [0, 0x0040_0000, 0x007f_ffff] {
                            let abs = (eb << 23) | low;
                            let want = ((abs >> t.s) ^ t.flip as u32) & 1;
                            let read = ((abs >> got.s) ^ got.flip) & 1;
                            assert_eq!(read, want, "{at}, pattern {abs:#x}");
                        }
                    }
                }
            }
        }
        assert_eq!(formats, 7 * 23 * 2, "float plans built");
        assert!(tiny > 1000, "only {tiny} tiny binades seen");
    }

    /// The cached plan of every (format, rule) key is the plan built for that key, also
    /// after the cache has been started afresh; block formats have none.
    #[test]
    fn shared_plans_are_the_plans_built_for_their_key() {
        let kinds = [
            RuleKind::NearestEven,
            RuleKind::NearestAway,
            RuleKind::TowardZero,
            RuleKind::Stochastic,
        ];
        let mut names: Vec<String> = ["bf16", "e4m3", "e5m2", "fixed<8,4>", "fixed<16,12>"]
            .map(String::from)
            .to_vec();
        names.extend((2..=24).map(|n| format!("posit<{n},1>")));
        // Twice over more keys than the cache holds: later lookups follow a fresh start.
        for _ in 0..2 {
            for name in &names {
                let format: Format = name.parse().expect("a format");
                for kind in kinds {
                    let shared = F32Plan::shared(&format, kind).expect("a plan");
                    let built = F32Plan::new(&format, kind).expect("a plan");
                    assert_eq!(
                        format!("{shared:?}"),
                        format!("{built:?}"),
                        "{name} {kind:?}"
                    );
                }
            }
        }
        let block: Format = "block<8>".parse().expect("a format");
        assert!(F32Plan::shared(&block, RuleKind::NearestEven).is_none());
    }
}
