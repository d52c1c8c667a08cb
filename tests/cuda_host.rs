//! The CUDA per-element math, compiled for the host, against the Rust code bit for bit.
//!
//! `cuda/quant.cuh` holds the rounding math the CUDA kernels run, as `__host__ __device__`
//! functions; `build.rs` compiles `cuda/host_shim.cpp` (extern "C" wrappers over it) with
//! the host C++ compiler into a static library, so this file can call it without a GPU.
//! Every result is compared with qcandle's Rust code ([`Format::round`], [`Block::round`],
//! `Posit`/`Float` `encode`/`decode`, [`Stream`]) on the f64 bit pattern: the sign of zero
//! counts, and so do NaN's sign and payload.
//!
//! Inputs: every pattern of every format of at most 16 bits, every rounding boundary between
//! neighbouring values (midpoints, and for posits every pattern of the posits with one and
//! two more bits, which holds the geometric boundaries where exponent bits are cut off) with
//! the f64 values just below and above it, every power of two across each format's range,
//! specials, and random f32 and f64 inputs. Rounding modes: nearest-even, nearest-away,
//! toward-zero and stochastic with 1, 8 and 23 random bits, with random words 0, u32::MAX,
//! 2^31, a pseudo-random word, and the two words on either side of the point where the Rust
//! result flips from rounding up to rounding down (found by bisection on the random word).
//!
//! lns<w,f> (`Lns::round_stored` with f64 and f32 storage, `encode`, `decode`, `value`):
//! every value and its f64 neighbours, the log-domain midpoints and stochastic thresholds
//! (values of the lns with one or two more fraction bits) for small formats; random inputs up
//! to f = 30; near-boundary inputs at f = 23..30, which the log2 estimate cannot decide (a
//! per-thread counter in the shim checks that the exact comparison ran); specials,
//! saturation and underflow. The exact comparison itself is checked against big-integer
//! powers and at every precision up to its cap, where it must answer correctly or report
//! the comparison undecided.

mod common;
use common::{Mismatches, SplitMix};

use qcandle::backend::qc::{QcFormat, QcRounding};
use qcandle::format::mx::ElementFormat;
use qcandle::format::rounding::{NearestAway, NearestEven, Stochastic, TowardZero};
use qcandle::format::{
    Block, BlockScope, Float, Format, Lns, Mx, MxElement, Nvfp4, Overflow, Specials,
};
use qcandle::philox::{philox4x32_10, Stream};
use qcandle::Rounding;

// ---------------------------------------------------------------------------------------
// The shim (cuda/host_shim.cpp)
// ---------------------------------------------------------------------------------------

extern "C" {
    fn qc_host_round(
        x: f64,
        family: i32,
        a: i32,
        b: i32,
        flags: i32,
        mode: i32,
        bits: i32,
        random: u32,
    ) -> f64;
    fn qc_host_round_batch(
        x: *const f64,
        random: *const u32,
        out: *mut f64,
        n: usize,
        family: i32,
        a: i32,
        b: i32,
        flags: i32,
        mode: i32,
        bits: i32,
    );
    fn qc_host_round_block(
        x: f64,
        wl: i32,
        block_max: f64,
        mode: i32,
        bits: i32,
        random: u32,
    ) -> f64;
    fn qc_host_round_block_batch(
        x: *const f64,
        random: *const u32,
        out: *mut f64,
        n: usize,
        wl: i32,
        block_max: f64,
        mode: i32,
        bits: i32,
    );
    fn qc_host_encode(x: f64, family: i32, a: i32, b: i32, flags: i32) -> u32;
    fn qc_host_encode_fails(x: f64, family: i32, a: i32, b: i32, flags: i32) -> i32;
    fn qc_host_encode_batch(
        x: *const f64,
        out: *mut u32,
        n: usize,
        family: i32,
        a: i32,
        b: i32,
        flags: i32,
    );
    fn qc_host_decode(pattern: u32, family: i32, a: i32, b: i32, flags: i32) -> f64;
    fn qc_host_decode_batch(
        patterns: *const u32,
        out: *mut f64,
        n: usize,
        family: i32,
        a: i32,
        b: i32,
        flags: i32,
    );
    fn qc_host_philox4x32_10(ctr: *const u32, key: *const u32, out: *mut u32);
    fn qc_host_random(seed: u64, call: u64, index: u64) -> u32;
    fn qc_host_random_batch(seed: u64, call: u64, first_index: u64, out: *mut u32, n: usize);
}

/// `QC_NO_PATTERN` in quant.cuh.
const NO_PATTERN: u32 = u32::MAX;

/// A format as the four ints of `QcFormat` (the library's own mapping, which the CUDA
/// launches use too).
type Raw = QcFormat;

fn raw(format: &Format) -> Raw {
    QcFormat::new(format)
}

/// `qcandle::Rounding` -> `QcRounding` (mode, bits).
fn raw_rounding(r: Rounding) -> (i32, i32) {
    let q = QcRounding::new(r);
    (q.mode, q.bits)
}

fn shim_round(f: Raw, r: Rounding, xs: &[f64], rand: &[u32]) -> Vec<f64> {
    assert_eq!(xs.len(), rand.len());
    let (mode, bits) = raw_rounding(r);
    let mut out = vec![0.0; xs.len()];
    // SAFETY: the three arrays hold xs.len() elements.
    unsafe {
        qc_host_round_batch(
            xs.as_ptr(),
            rand.as_ptr(),
            out.as_mut_ptr(),
            xs.len(),
            f.family,
            f.a,
            f.b,
            f.flags,
            mode,
            bits,
        )
    };
    out
}

fn shim_round_block(wl: u32, max: f64, r: Rounding, xs: &[f64], rand: &[u32]) -> Vec<f64> {
    assert_eq!(xs.len(), rand.len());
    let (mode, bits) = raw_rounding(r);
    let mut out = vec![0.0; xs.len()];
    // SAFETY: the three arrays hold xs.len() elements.
    unsafe {
        qc_host_round_block_batch(
            xs.as_ptr(),
            rand.as_ptr(),
            out.as_mut_ptr(),
            xs.len(),
            wl as i32,
            max,
            mode,
            bits,
        )
    };
    out
}

fn shim_encode(f: Raw, xs: &[f64]) -> Vec<u32> {
    let mut out = vec![0; xs.len()];
    // SAFETY: both arrays hold xs.len() elements.
    unsafe {
        qc_host_encode_batch(
            xs.as_ptr(),
            out.as_mut_ptr(),
            xs.len(),
            f.family,
            f.a,
            f.b,
            f.flags,
        )
    };
    out
}

fn shim_decode(f: Raw, ps: &[u32]) -> Vec<f64> {
    let mut out = vec![0.0; ps.len()];
    // SAFETY: both arrays hold ps.len() elements.
    unsafe {
        qc_host_decode_batch(
            ps.as_ptr(),
            out.as_mut_ptr(),
            ps.len(),
            f.family,
            f.a,
            f.b,
            f.flags,
        )
    };
    out
}

// ---------------------------------------------------------------------------------------
// What is rounded: a format, or an element of a block with a given maximum
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Subject {
    /// `Format::round` (block formats: the value as a block of its own).
    Format(Format),
    /// `Block::round` with the block's largest finite magnitude.
    Block(Block, f64),
    /// `Mx::round` in a block of the given scale exponent (`None`: a NaN block).
    Mx(Mx, Option<i32>),
    /// `Nvfp4::round` with a block scale and a tensor scale.
    Nvfp4(f64, f64),
}

impl Subject {
    fn name(&self) -> String {
        match self {
            Subject::Format(f) => f.to_string(),
            Subject::Block(b, max) => format!("block<{}> max {max:e}", b.wl()),
            Subject::Mx(m, scale) => format!("{m} scale {scale:?}"),
            Subject::Nvfp4(s_b, s_t) => format!("nvfp4 s_b {s_b:e} s_t {s_t:e}"),
        }
    }

    fn rust(&self, x: f64, r: Rounding, random: u32) -> f64 {
        match self {
            Subject::Format(f) => f.round(x, r, random),
            Subject::Block(b, max) => match r {
                Rounding::NearestEven => b.round(x, *max, NearestEven, random),
                Rounding::NearestAway => b.round(x, *max, NearestAway, random),
                Rounding::TowardZero => b.round(x, *max, TowardZero, random),
                Rounding::Stochastic { bits } => b.round(x, *max, Stochastic { bits }, random),
            },
            Subject::Mx(m, scale) => match r {
                Rounding::NearestEven => m.round(x, *scale, NearestEven, random),
                Rounding::NearestAway => m.round(x, *scale, NearestAway, random),
                Rounding::TowardZero => m.round(x, *scale, TowardZero, random),
                Rounding::Stochastic { bits } => m.round(x, *scale, Stochastic { bits }, random),
            },
            Subject::Nvfp4(s_b, s_t) => match r {
                Rounding::NearestEven => Nvfp4::round(x, *s_b, *s_t, NearestEven, random),
                Rounding::NearestAway => Nvfp4::round(x, *s_b, *s_t, NearestAway, random),
                Rounding::TowardZero => Nvfp4::round(x, *s_b, *s_t, TowardZero, random),
                Rounding::Stochastic { bits } => {
                    Nvfp4::round(x, *s_b, *s_t, Stochastic { bits }, random)
                }
            },
        }
    }

    fn shim(&self, r: Rounding, xs: &[f64], rand: &[u32]) -> Vec<f64> {
        match self {
            Subject::Format(f) => shim_round(raw(f), r, xs, rand),
            Subject::Block(b, max) => shim_round_block(b.wl(), *max, r, xs, rand),
            Subject::Mx(m, scale) => shim_mx_round(m, *scale, r, xs, rand),
            Subject::Nvfp4(s_b, s_t) => shim_nvfp4_round(*s_b, *s_t, r, xs, rand),
        }
    }
}

/// A pseudo-random word for input `i`.
fn word(i: usize) -> u32 {
    SplitMix(i as u64 ^ 0x5eed).next_u32()
}

const DETERMINISTIC: [Rounding; 3] = [
    Rounding::NearestEven,
    Rounding::NearestAway,
    Rounding::TowardZero,
];
const STOCHASTIC_BITS: [u32; 3] = [1, 8, 23];

/// The random words on either side of the point where the Rust result for `x` changes as
/// the top `k` bits of the random word grow (stochastic rounding goes up iff
/// `random >> (32 - k)` is below a threshold): the largest top that gives the result of
/// top 0 (with every lower bit set) and the smallest that does not (lower bits clear).
fn flip_words(s: &Subject, x: f64, k: u32) -> Option<[u32; 2]> {
    let r = Rounding::Stochastic { bits: k };
    let at = |top: u32| s.rust(x, r, top << (32 - k)).to_bits();
    let first = at(0);
    let (mut lo, mut hi) = (0u32, (1u32 << k) - 1);
    if at(hi) == first {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if at(mid) == first {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let low_ones = (1u32 << (32 - k)) - 1;
    Some([(lo << (32 - k)) | low_ones, hi << (32 - k)])
}

fn show(x: f64) -> String {
    format!("{x:e} ({:#018x})", x.to_bits())
}

/// Compares the shim with Rust on `xs` with per-element random words; returns the count.
fn compare(s: &Subject, r: Rounding, xs: &[f64], rand: &[u32], m: &mut Mismatches) -> u64 {
    let got = s.shim(r, xs, rand);
    for ((&x, &w), &g) in xs.iter().zip(rand).zip(&got) {
        let want = s.rust(x, r, w);
        m.check(want.to_bits() == g.to_bits(), || {
            format!(
                "{} {r} x = {} random {w:#010x}: rust {} shim {}",
                s.name(),
                show(x),
                show(want),
                show(g)
            )
        });
    }
    xs.len() as u64
}

/// Every rounding mode on `xs`; returns the number of checks.
fn check_all_modes(s: &Subject, xs: &[f64], m: &mut Mismatches) -> u64 {
    let mut checked = 0;
    let words: Vec<u32> = (0..xs.len()).map(word).collect();
    for r in DETERMINISTIC {
        checked += compare(s, r, xs, &words, m);
    }
    for k in STOCHASTIC_BITS {
        let mut xr = Vec::with_capacity(xs.len() * 6);
        let mut wr = Vec::with_capacity(xs.len() * 6);
        for (i, &x) in xs.iter().enumerate() {
            for w in [0, u32::MAX, 0x8000_0000, words[i]] {
                xr.push(x);
                wr.push(w);
            }
            if k > 1 {
                for w in flip_words(s, x, k).into_iter().flatten() {
                    xr.push(x);
                    wr.push(w);
                }
            }
        }
        checked += compare(s, Rounding::Stochastic { bits: k }, &xr, &wr, m);
    }
    checked
}

/// Posit/Float encode of every `x` and decode of every pattern, shim against Rust.
fn check_codec(f: &Format, xs: &[f64], patterns: &[u32], m: &mut Mismatches) -> u64 {
    let r = raw(f);
    let got = shim_encode(r, xs);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = match f {
            Format::Posit(p) => Some(p.encode(x)),
            Format::Float(fl) => fl.encode(x).ok(),
            _ => unreachable!("only posits and floats have patterns"),
        };
        // SAFETY: plain values.
        let fails = unsafe { qc_host_encode_fails(x, r.family, r.a, r.b, r.flags) } != 0;
        m.check(
            want == (!fails).then_some(g) && (want.is_some() || g == NO_PATTERN),
            || {
                format!(
                    "{f} encode {}: rust {want:?} shim {g:#x} (fails {fails})",
                    show(x)
                )
            },
        );
    }
    let got = shim_decode(r, patterns);
    for (&p, &g) in patterns.iter().zip(&got) {
        let want = match f {
            Format::Posit(po) => po.decode(p),
            Format::Float(fl) => fl.decode(p),
            _ => unreachable!("only posits and floats have patterns"),
        };
        m.check(want.to_bits() == g.to_bits(), || {
            format!("{f} decode {p:#x}: rust {} shim {}", show(want), show(g))
        });
    }
    (xs.len() + patterns.len()) as u64
}

// ---------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------

fn fmt(s: &str) -> Format {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Formats of at most 8 bits and fixed/block formats named in the brief.
const SMALL: &[&str] = &[
    "posit<8,0>",
    "posit<8,1>",
    "posit<8,2>",
    "posit<8,3>",
    "posit<5,5>",
    "posit<4,0>",
    "posit<3,0>",
    "posit<3,1>",
    "posit<2,0>",
    "e5m2",
    "e4m3",
    "e3m2",
    "e2m3",
    "e2m1",
    "float<4,3,sat>",
    "float<4,0,fn>",
    "float<3,0,fin>",
    "float<3,1,nosub>",
    "fixed<8,4>",
    "fixed<8,-2>",
    "fixed<8,4,noclamp>",
    "fixed<8,60>",
    "block<8>",
];

const SIXTEEN: &[&str] = &[
    "posit<16,0>",
    "posit<16,1>",
    "posit<16,2>",
    "posit<16,3>",
    "fp16",
    "bf16",
    "float<5,10,nosub>",
    "fixed<16,8,sym>",
];

/// Block maxima for `block<8>` (and `block<16>`): ordinary, binade edges, f64 subnormal,
/// and the top of f64, where the range's top overflows to Inf.
const BLOCK_MAXIMA: &[f64] = &[
    1.0,
    1.5,
    1.999_999_999,
    0.75,
    3.0e-5,
    6.0e4,
    1.0e-310,
    5.0e-324,
    1.0e300,
    f64::MAX,
];

/// Every finite value of a posit or float format of at most 16 bits, or of a fixed format's
/// codes, sorted, with the signs.
fn values(f: &Format) -> Vec<f64> {
    let mut v: Vec<f64> = match f {
        Format::Posit(_) | Format::Float(_) => {
            assert!(f.bits() <= 18);
            (0..1u32 << f.bits()).map(|p| decode(f, p)).collect()
        }
        Format::Fixed(x) => {
            let half = 1i64 << (x.wl() - 1);
            (-half - 2..half + 2)
                .map(|k| k as f64 * qcandle::format::grid::pow2(-x.fl()))
                .collect()
        }
        Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => {
            unreachable!("block values depend on the block's scale")
        }
        Format::Lns(_) => unreachable!("the CUDA header has no lns rounding to compare"),
    };
    v.retain(|x| x.is_finite());
    sorted(v)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v.dedup_by(|a, b| a == b);
    v
}

fn decode(f: &Format, p: u32) -> f64 {
    match f {
        Format::Posit(po) => po.decode(p),
        Format::Float(fl) => fl.decode(p),
        _ => unreachable!(),
    }
}

/// The values of a block element grid (codes two past each end) for a block maximum.
fn block_values(wl: u32, max: f64) -> Vec<f64> {
    let e = qcandle::format::grid::parts(max).e;
    let q = e - (wl as i32 - 2);
    let half = 1i64 << (wl - 1);
    sorted(
        (-half - 2..half + 2)
            .map(|k| k as f64 * qcandle::format::grid::pow2(q))
            .filter(|x| x.is_finite())
            .collect(),
    )
}

/// Midpoints of neighbours (exact: the values have few significant bits) plus points past
/// the largest value, so the overflow boundary is included.
fn boundaries(vals: &[f64]) -> Vec<f64> {
    let mut out: Vec<f64> = vals.windows(2).map(|w| w[0] * 0.5 + w[1] * 0.5).collect();
    if let Some(&top) = vals.last() {
        if top > 0.0 {
            let man = 24; // a gap no format exceeds relative to its top value
            for extra in [
                top * 2.0,
                top * 4.0,
                top * (1.0 + 0.5f64.powi(man)),
                top * 1.5,
                top * 1.25,
                top * 1.125,
                top * 1.0625,
                top * 1.03125,
            ] {
                out.push(extra);
                out.push(-extra);
            }
        }
    }
    out
}

/// `xs` with the f64 just below and above each one.
fn with_neighbours(xs: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(xs.len() * 3);
    for &x in xs {
        out.extend([x, x.next_down(), x.next_up()]);
    }
    out
}

/// Specials and extremes of f64 and f32.
fn specials() -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001), // signalling NaN
        f64::from_bits(0xfff4_0000_dead_beef),
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        f64::from_bits(1),
        f64::from_bits(0x000f_ffff_ffff_ffff),
        f64::from_bits(0x0008_0000_0000_0000),
        f64::from(f32::MAX),
        f64::from(f32::MIN_POSITIVE),
        f64::from(f32::from_bits(1)),
        f64::from(f32::from_bits(0x007f_ffff)),
        f64::from(f32::from_bits(0x0040_0000)),
        1.0e300,
        1.0e-300,
        2.0f64.powi(1023),
        3.0 * 2.0f64.powi(1022),
        1.0,
        1.5,
        0.1,
        65504.0,
        65520.0,
        448.0,
        464.0,
        480.0,
        6.0,
        7.0,
        28.0,
        30.0,
    ];
    let neg: Vec<f64> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// Every power of two in `[-lim, lim]`, with its neighbours, both signs.
fn powers_of_two(lim: i32) -> Vec<f64> {
    let mut v = Vec::new();
    for e in -lim..=lim {
        let x = qcandle::format::grid::pow2(e);
        v.extend(with_neighbours(&[x, -x]));
    }
    v
}

/// Random f32 inputs: `n / 2` with uniform bits (every exponent, NaN and Inf included) and
/// `n / 2` with exponents in `[lo, hi]`.
fn random_f32(n: usize, lo: i32, hi: i32, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed);
    let span = (hi - lo + 1) as u64;
    (0..n)
        .map(|i| {
            let r = rng.next_u64();
            let bits = if i % 2 == 0 {
                r as u32
            } else {
                let e = (lo + ((r >> 32) % span) as i32).clamp(-149, 127);
                let sign = ((r >> 31) & 1) as u32;
                if e < -126 {
                    (sign << 31) | ((r as u32 & 0x007f_ffff) >> (-126 - e))
                } else {
                    (sign << 31) | (((e + 127) as u32) << 23) | (r as u32 & 0x007f_ffff)
                }
            };
            f64::from(f32::from_bits(bits))
        })
        .collect()
}

/// Random f64 inputs with full 52-bit fractions and exponents in `[lo, hi]` (sticky bits
/// beyond f32's precision).
fn random_f64(n: usize, lo: i32, hi: i32, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed);
    let span = (hi - lo + 1) as u64;
    (0..n)
        .map(|_| {
            let r = rng.next_u64();
            let e = lo + (rng.next_u64() % span) as i32;
            let m = f64::from_bits(0x3ff0_0000_0000_0000 | (r & 0x000f_ffff_ffff_ffff));
            let v = m * qcandle::format::grid::pow2(e);
            if r >> 63 == 1 {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// The binade range `[lo, hi]` where a format's rounding happens (for random inputs).
fn binade_range(s: &Subject) -> (i32, i32) {
    let f = match s {
        Subject::Format(f) => f,
        Subject::Block(_, max) => {
            let e = qcandle::format::grid::parts(*max).e;
            return ((e - 40).max(-1074), (e + 3).min(1023));
        }
        Subject::Mx(m, scale) => {
            let e = scale.unwrap_or(0) + m.element().emax();
            return ((e - 30).max(-1074), (e + 3).min(1023));
        }
        Subject::Nvfp4(s_b, s_t) => {
            let e = qcandle::format::grid::parts((s_b * s_t).max(f64::MIN_POSITIVE)).e;
            return ((e - 10).max(-1074), (e + 5).min(1023));
        }
    };
    match f {
        Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_) => (-140, 130),
        _ => {
            let max = f.max_finite().expect("not a block");
            let min = f.min_positive().expect("not a block");
            let e_max = qcandle::format::grid::parts(max).e;
            let e_min = qcandle::format::grid::parts(min).e;
            ((e_min - 3).max(-1074), (e_max + 3).min(1023))
        }
    }
}

/// Every boundary input of `s`: values, midpoints, powers of two, with f64 neighbours.
fn boundary_inputs(s: &Subject) -> Vec<f64> {
    let mut xs = match s {
        Subject::Format(f @ Format::Posit(p)) => {
            let mut v = values(f);
            let b = boundaries(&v);
            // The posits with one and two more bits hold every boundary, geometric ones too
            // (two more only for the small formats).
            for extra in 1..=2u32 {
                let n = p.n() + extra;
                if n <= 32 && (extra == 1 || p.n() <= 8) {
                    let wider = Format::posit(n, p.es()).expect("valid posit");
                    v.extend(values(&wider));
                }
            }
            v.extend(b);
            v.extend(powers_of_two(p.max_scale() + 2));
            v
        }
        Subject::Format(f @ (Format::Float(_) | Format::Fixed(_))) => {
            let mut v = values(f);
            let b = boundaries(&v);
            v.extend(b);
            if let Format::Float(fl) = f {
                let (lo, hi) = (
                    fl.emin() - fl.man() as i32 - 3,
                    fl.emin() + 2 * fl.bias() + 3,
                );
                v.extend(powers_of_two(hi.max(-lo)));
            }
            v
        }
        Subject::Format(Format::Lns(_)) => {
            unreachable!("the CUDA header has no lns rounding to compare")
        }
        Subject::Format(Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_)) => {
            // A lone value is its own block: powers of two and their neighbours are the edges.
            powers_of_two(1074)
        }
        Subject::Mx(m, scale) => {
            let s = qcandle::format::grid::pow2(scale.unwrap_or(0));
            let mut v: Vec<f64> = mx_element_values(m.element())
                .iter()
                .map(|v| v * s)
                .collect();
            let bd = boundaries(&v);
            v.extend(bd);
            v
        }
        Subject::Nvfp4(s_b, s_t) => {
            let d = if s_b.is_finite() && *s_b > 0.0 {
                s_b * s_t
            } else {
                1.0
            };
            let mut v: Vec<f64> = mx_element_values(MxElement::Fp4E2m1)
                .iter()
                .map(|v| v * d)
                .collect();
            let bd = boundaries(&v);
            v.extend(bd);
            v
        }
        Subject::Block(b, max) => {
            let mut v = block_values(b.wl(), *max);
            let bd = boundaries(&v);
            v.extend(bd);
            v
        }
    };
    xs = with_neighbours(&xs);
    xs.extend(specials());
    xs
}

fn subjects(names: &[&str]) -> Vec<Subject> {
    let mut out = Vec::new();
    for name in names {
        let f = fmt(name);
        out.push(Subject::Format(f));
        if let Format::Block(_) = f {
            for &max in BLOCK_MAXIMA {
                out.push(Subject::Block(
                    Block::new(f.bits(), BlockScope::Tensor).unwrap(),
                    max,
                ));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Decode and encode of every pattern (and of patterns with junk above the format's bits),
/// and rounding of every value, for the posit and float formats of at most 16 bits.
fn every_pattern(names: &[&str]) {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for name in names {
        let f = fmt(name);
        if !matches!(f, Format::Posit(_) | Format::Float(_)) {
            continue;
        }
        let bits = f.bits();
        let mut patterns: Vec<u32> = (0..1u32 << bits).collect();
        if bits < 32 {
            let junk: Vec<u32> = (0..1u32 << bits)
                .map(|p| p | (word(p as usize) << bits))
                .collect();
            patterns.extend(junk);
        }
        let vals: Vec<f64> = (0..1u32 << bits).map(|p| decode(&f, p)).collect();
        checked += check_codec(&f, &vals, &patterns, &mut m);
        checked += check_all_modes(&Subject::Format(f), &vals, &mut m);
    }
    m.assert_none_of("every pattern", checked);
}

#[test]
fn every_pattern_small() {
    every_pattern(SMALL);
}

#[test]
fn every_pattern_16bit() {
    every_pattern(SIXTEEN);
}

/// Every rounding boundary (with its f64 neighbours) in every mode, and encode of each.
fn every_boundary(names: &[&str]) {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for s in subjects(names) {
        let xs = boundary_inputs(&s);
        checked += check_all_modes(&s, &xs, &mut m);
        if let Subject::Format(f @ (Format::Posit(_) | Format::Float(_))) = s {
            checked += check_codec(&f, &xs, &[], &mut m);
        }
    }
    m.assert_none_of("every boundary", checked);
}

#[test]
fn every_boundary_small() {
    every_boundary(SMALL);
}

#[test]
fn every_boundary_posit16() {
    every_boundary(&SIXTEEN[..4]);
}

#[test]
fn every_boundary_float16_fixed16() {
    every_boundary(&SIXTEEN[4..]);
}

/// 1e5 random f32 inputs (half of them in the format's range) and 2e4 random f64 inputs per
/// format, every mode, and encode.
#[test]
fn random_inputs() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    let mut names: Vec<&str> = SMALL.to_vec();
    names.extend(SIXTEEN);
    names.extend([
        "block<2>",
        "block<16>",
        "block<32>",
        "fixed<32,0>",
        "fixed<2,1,sym>",
    ]);
    for (i, s) in subjects(&names).into_iter().enumerate() {
        let (lo, hi) = binade_range(&s);
        let mut xs = random_f32(100_000, lo, hi, 17 + i as u64);
        xs.extend(random_f64(20_000, lo, hi, 1017 + i as u64));
        checked += check_all_modes(&s, &xs, &mut m);
        if let Subject::Format(f @ (Format::Posit(_) | Format::Float(_))) = s {
            checked += check_codec(&f, &xs, &[], &mut m);
        }
    }
    m.assert_none_of("random inputs", checked);
}

/// The 32-bit posits, float<8,23> and tf32: random f32/f64 inputs, random patterns and the
/// boundaries between random neighbouring patterns, every power of two in range.
#[test]
fn wide_formats() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (i, name) in [
        "posit<32,2>",
        "posit<32,5>",
        "float<8,23>",
        "tf32",
        "posit<24,1>",
    ]
    .iter()
    .enumerate()
    {
        let f = fmt(name);
        let s = Subject::Format(f);
        let (lo, hi) = binade_range(&s);
        let mut rng = SplitMix(99 + i as u64);
        let bits = f.bits();
        let mask = if bits == 32 {
            u32::MAX
        } else {
            (1 << bits) - 1
        };
        // Random patterns, and the patterns next to zero, the largest values, and NaR/Inf.
        let mut patterns: Vec<u32> = (0..50_000).map(|_| rng.next_u32() & mask).collect();
        let sign = 1u32 << (bits - 1);
        for p in 0..4096u32 {
            patterns.extend([
                p,
                sign.wrapping_sub(p) & mask,
                sign | p,
                mask.wrapping_sub(p),
            ]);
        }
        let mut xs = random_f32(100_000, lo, hi, 7 + i as u64);
        xs.extend(random_f64(50_000, lo, hi, 70 + i as u64));
        let mut bounds = Vec::new();
        for &p in &patterns {
            let (a, b) = (decode(&f, p), decode(&f, p.wrapping_add(1) & mask));
            if a.is_finite() && b.is_finite() {
                bounds.extend([a, a * 0.5 + b * 0.5]);
            }
        }
        xs.extend(with_neighbours(&bounds));
        let lim = match f {
            Format::Posit(p) => p.max_scale() + 2,
            _ => 160,
        };
        xs.extend(powers_of_two(lim));
        xs.extend(specials());
        checked += check_all_modes(&s, &xs, &mut m);
        checked += check_codec(&f, &xs, &patterns, &mut m);
    }
    m.assert_none_of("wide formats", checked);
}

/// Specials through the single-value entry points (not only the batch loops).
#[test]
fn single_value_entry_points() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    let mut names: Vec<&str> = SMALL.to_vec();
    names.extend(SIXTEEN);
    names.extend([
        "posit<32,2>",
        "float<8,23>",
        "float<8,23,fin>",
        "float<8,0,fn>",
    ]);
    let modes = [
        Rounding::NearestEven,
        Rounding::NearestAway,
        Rounding::TowardZero,
        Rounding::Stochastic { bits: 1 },
        Rounding::Stochastic { bits: 23 },
    ];
    for name in names {
        let f = fmt(name);
        let r = raw(&f);
        for x in specials() {
            for mode in modes {
                for w in [0u32, 0x7fff_ffff, u32::MAX] {
                    let (md, bits) = raw_rounding(mode);
                    // SAFETY: plain values.
                    let got = unsafe { qc_host_round(x, r.family, r.a, r.b, r.flags, md, bits, w) };
                    let want = f.round(x, mode, w);
                    m.check(want.to_bits() == got.to_bits(), || {
                        format!(
                            "{f} {mode} {}: rust {} shim {}",
                            show(x),
                            show(want),
                            show(got)
                        )
                    });
                    if let Format::Block(b) = f {
                        for max in BLOCK_MAXIMA {
                            // SAFETY: plain values.
                            let got =
                                unsafe { qc_host_round_block(x, b.wl() as i32, *max, md, bits, w) };
                            let want = Subject::Block(b, *max).rust(x, mode, w);
                            m.check(want.to_bits() == got.to_bits(), || {
                                format!(
                                    "{f} max {max:e} {mode} {}: rust {} shim {}",
                                    show(x),
                                    show(want),
                                    show(got)
                                )
                            });
                            checked += 1;
                        }
                    }
                    checked += 1;
                }
            }
            if let Format::Posit(_) | Format::Float(_) = f {
                // SAFETY: plain values.
                let got = unsafe { qc_host_encode(x, r.family, r.a, r.b, r.flags) };
                let want = match f {
                    Format::Posit(p) => p.encode(x),
                    Format::Float(fl) => fl.encode(x).unwrap_or(NO_PATTERN),
                    _ => unreachable!(),
                };
                m.check(want == got, || {
                    format!("{f} encode {}: rust {want:#x} shim {got:#x}", show(x))
                });
                let p = got;
                // SAFETY: plain values.
                let got = unsafe { qc_host_decode(p, r.family, r.a, r.b, r.flags) };
                let want = decode(&f, p);
                m.check(want.to_bits() == got.to_bits(), || {
                    format!("{f} decode {p:#x}: rust {} shim {}", show(want), show(got))
                });
                checked += 2;
            }
        }
    }
    // The canonical NaN patterns pack writes.
    for (name, nan) in [
        ("fp16", 0x7e00u32),
        ("e4m3", 0x7f),
        ("bf16", 0x7fc0),
        ("e5m2", 0x7e),
    ] {
        let r = raw(&fmt(name));
        // SAFETY: plain values.
        let got = unsafe { qc_host_encode(f64::NAN, r.family, r.a, r.b, r.flags) };
        m.check(got == nan, || {
            format!("{name} NaN pattern {got:#x}, want {nan:#x}")
        });
        checked += 1;
    }
    m.assert_none_of("single-value entry points", checked);
}

/// `qc_random` is `Stream::new(seed, call).at(index)`, also where the block index crosses
/// 2^32 (the counter's high word) and near 2^64; `qc_philox4x32_10` is `philox4x32_10`.
#[test]
fn random_stream() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    let seeds = [
        0u64,
        1,
        42,
        0xdead_beef,
        1 << 32,
        0x1234_5678_9abc_def0,
        u64::MAX,
    ];
    let calls = [
        0u64,
        1,
        7,
        (1 << 32) - 1,
        1 << 32,
        0xffff_ffff_0000_0001,
        u64::MAX,
    ];
    let starts = [
        0u64,
        1000,
        (1u64 << 34) - 64, // block index 2^32 - 16 .. crosses into the high word
        (1u64 << 34) + 3,
        (1u64 << 36) - 5,
        u64::MAX - 127,
    ];
    for &seed in &seeds {
        for &call in &calls {
            let stream = Stream::new(seed, call);
            for &start in &starts {
                let n = 128usize;
                let mut got = vec![0u32; n];
                // SAFETY: got holds n words.
                unsafe { qc_host_random_batch(seed, call, start, got.as_mut_ptr(), n) };
                for (j, &g) in got.iter().enumerate() {
                    let index = start.wrapping_add(j as u64);
                    let want = stream.at(index);
                    m.check(want == g, || {
                        format!("seed {seed:#x} call {call:#x} index {index:#x}: rust {want:#010x} shim {g:#010x}")
                    });
                    checked += 1;
                }
                // SAFETY: plain values.
                let one = unsafe { qc_host_random(seed, call, start) };
                m.check(one == stream.at(start), || {
                    format!("qc_host_random {seed} {call} {start}")
                });
                checked += 1;
            }
        }
    }
    let mut rng = SplitMix(3);
    for _ in 0..10_000 {
        let ctr = [
            rng.next_u32(),
            rng.next_u32(),
            rng.next_u32(),
            rng.next_u32(),
        ];
        let key = [rng.next_u32(), rng.next_u32()];
        let mut got = [0u32; 4];
        // SAFETY: four, two and four words.
        unsafe { qc_host_philox4x32_10(ctr.as_ptr(), key.as_ptr(), got.as_mut_ptr()) };
        let want = philox4x32_10(ctr, key);
        m.check(want == got, || {
            format!("philox {ctr:x?} {key:x?}: rust {want:x?} shim {got:x?}")
        });
        checked += 1;
    }
    m.assert_none_of("random stream", checked);
}

/// The float presets and options reach the shim as the ints the header expects.
#[test]
fn raw_format_mapping() {
    let f = |s: &str| {
        let r = raw(&fmt(s));
        (r.family, r.a, r.b, r.flags)
    };
    assert_eq!(f("posit<16,1>"), (0, 16, 1, 0));
    assert_eq!(f("fp16"), (1, 5, 10, 1));
    assert_eq!(f("e4m3"), (1, 4, 3, 1 | 1 << 2));
    assert_eq!(f("e2m1"), (1, 2, 1, 1 | 2 | 2 << 2));
    assert_eq!(f("float<5,10,nosub,sat>"), (1, 5, 10, 2));
    assert_eq!(f("fixed<16,8,sym>"), (2, 16, 8, 3));
    assert_eq!(f("fixed<8,-2,noclamp>"), (2, 8, -2, 0));
    assert_eq!(f("block<8,dim=1>"), (3, 8, 0, 0));
    assert_eq!(f("mxfp8_e4m3"), (4, 0, 0, 0));
    assert_eq!(f("mxint8"), (4, 5, 0, 0));
    assert_eq!(f("nvfp4"), (5, 0, 0, 0));
    assert_eq!(f("lns<8,3>"), (6, 8, 3, 0));
    let e4m3 = Float::with_options(4, 3, true, Overflow::Infinity, Specials::FiniteNan).unwrap();
    assert_eq!(Format::Float(e4m3), fmt("e4m3"));
}

// ---------------------------------------------------------------------------------------
// lns<w,f>: rounding with f64 and f32 storage, encode, decode, the exact comparison
// ---------------------------------------------------------------------------------------

extern "C" {
    fn qc_host_round_stored_batch(
        x: *const f64,
        random: *const u32,
        out: *mut f64,
        undecided: *mut u8,
        n: usize,
        family: i32,
        a: i32,
        b: i32,
        flags: i32,
        mode: i32,
        bits: i32,
        f32_storage: i32,
    );
    fn qc_host_lns_value_batch(k: *const i64, out: *mut f64, undecided: *mut u8, n: usize, f: i32);
    fn qc_host_lns_pow_cmp(m: u64, g: u32, n: i64, max_limbs: i32) -> i32;
    fn qc_host_lns_interval_cmp(m: u64, g: u32, n: i64, limbs: i32) -> i32;
    fn qc_host_lns_log2_significand(m: u64) -> f64;
    fn qc_host_lns_counts(out: *mut u64);
}

/// The calling thread's count of exact interval comparisons per precision (index i: 2^i
/// limbs of 64 bits).
fn lns_counts() -> [u64; 8] {
    let mut c = [0u64; 8];
    // SAFETY: out holds 8 words.
    unsafe { qc_host_lns_counts(c.as_mut_ptr()) };
    c
}

/// The shim's `qc_round_stored` on every x: the results and whether any was undecided.
fn shim_lns_round(l: Lns, r: Rounding, xs: &[f64], rand: &[u32], f32: bool) -> (Vec<f64>, bool) {
    assert_eq!(xs.len(), rand.len());
    let f = raw(&Format::Lns(l));
    let (mode, bits) = raw_rounding(r);
    let mut out = vec![0.0; xs.len()];
    let mut undecided = vec![0u8; xs.len()];
    // SAFETY: the four arrays hold xs.len() elements.
    unsafe {
        qc_host_round_stored_batch(
            xs.as_ptr(),
            rand.as_ptr(),
            out.as_mut_ptr(),
            undecided.as_mut_ptr(),
            xs.len(),
            f.family,
            f.a,
            f.b,
            f.flags,
            mode,
            bits,
            f32 as i32,
        )
    };
    (out, undecided.iter().any(|&u| u != 0))
}

/// The Rust rounding the CPU kernel runs: `round_stored` with the storage type's round trip.
fn rust_lns(l: &Lns, x: f64, r: Rounding, random: u32, f32: bool) -> f64 {
    let stored = |v: f64| if f32 { v as f32 as f64 } else { v };
    match r {
        Rounding::NearestEven => l.round_stored(x, NearestEven, random, stored),
        Rounding::NearestAway => l.round_stored(x, NearestAway, random, stored),
        Rounding::TowardZero => l.round_stored(x, TowardZero, random, stored),
        Rounding::Stochastic { bits } => l.round_stored(x, Stochastic { bits }, random, stored),
    }
}

/// The random words on either side of the point where the Rust result for `x` flips (as
/// [`flip_words`]).
fn lns_flip_words(l: &Lns, x: f64, k: u32, f32: bool) -> Option<[u32; 2]> {
    let r = Rounding::Stochastic { bits: k };
    let at = |top: u32| rust_lns(l, x, r, top << (32 - k), f32).to_bits();
    let first = at(0);
    let (mut lo, mut hi) = (0u32, (1u32 << k) - 1);
    if at(hi) == first {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if at(mid) == first {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let low_ones = (1u32 << (32 - k)) - 1;
    Some([(lo << (32 - k)) | low_ones, hi << (32 - k)])
}

/// Shim against Rust on `xs` in mode `r` with storage f64 or f32; returns the count.
fn lns_compare(
    l: &Lns,
    r: Rounding,
    xs: &[f64],
    rand: &[u32],
    f32: bool,
    m: &mut Mismatches,
) -> u64 {
    let (got, undecided) = shim_lns_round(*l, r, xs, rand, f32);
    m.check(!undecided, || {
        format!("lns<{},{}> {r}: undecided comparison", l.w(), l.f())
    });
    for ((&x, &w), &g) in xs.iter().zip(rand).zip(&got) {
        let want = rust_lns(l, x, r, w, f32);
        m.check(want.to_bits() == g.to_bits(), || {
            format!(
                "lns<{},{}> {r} f32 {f32} x = {} random {w:#010x}: rust {} shim {}",
                l.w(),
                l.f(),
                show(x),
                show(want),
                show(g)
            )
        });
    }
    xs.len() as u64
}

/// Every rounding mode (stochastic with 1, 8 and 23 bits, the flip words included) with f64
/// and f32 storage; f32 storage takes the inputs as f32s (what an f32 tensor holds).
fn lns_all_modes(l: &Lns, xs: &[f64], flips: bool, m: &mut Mismatches) -> u64 {
    let mut checked = 0;
    for f32 in [false, true] {
        let xs: Vec<f64> = if f32 {
            xs.iter().map(|&x| x as f32 as f64).collect()
        } else {
            xs.to_vec()
        };
        let words: Vec<u32> = (0..xs.len()).map(word).collect();
        for r in DETERMINISTIC {
            checked += lns_compare(l, r, &xs, &words, f32, m);
        }
        for k in STOCHASTIC_BITS {
            let mut xr = Vec::with_capacity(xs.len() * 6);
            let mut wr = Vec::with_capacity(xs.len() * 6);
            for (i, &x) in xs.iter().enumerate() {
                for w in [0, u32::MAX, 0x8000_0000, words[i]] {
                    xr.push(x);
                    wr.push(w);
                }
                if flips && k > 1 {
                    for w in lns_flip_words(l, x, k, f32).into_iter().flatten() {
                        xr.push(x);
                        wr.push(w);
                    }
                }
            }
            checked += lns_compare(l, Rounding::Stochastic { bits: k }, &xr, &wr, f32, m);
        }
    }
    checked
}

fn lns(w: u32, f: u32) -> Lns {
    Lns::new(w, f).unwrap()
}

/// `x` and the f64s on either side of it (both signs).
fn lns_with_neighbours(xs: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(xs.len() * 6);
    for &x in xs {
        if !x.is_finite() || x == 0.0 {
            continue;
        }
        let a = x.abs();
        for v in [
            f64::from_bits(a.to_bits() - 1),
            a,
            f64::from_bits(a.to_bits() + 1),
        ] {
            if v.is_finite() && v > 0.0 {
                out.push(v);
                out.push(-v);
            }
        }
    }
    out
}

/// The rounding boundaries of lns<w,f> (`extra` = 1: the log-domain midpoints
/// `2^((k + 1/2)/2^f)`; `extra` = b: the stochastic thresholds `2^((k + j/2^b)/2^f)`) as the
/// values of lns<w + extra, f + extra>, where they lie on the grid (`step` thins the codes).
fn lns_boundaries(l: &Lns, extra: u32, step: i64) -> Vec<f64> {
    let fine = lns(l.w() + extra, l.f() + extra);
    let mut out = Vec::new();
    let mut k = fine.k_min();
    while k <= fine.k_max() {
        out.push(fine.value(k));
        k += step;
    }
    out
}

/// Specials, saturation and underflow inputs of lns<w,f>.
fn lns_specials(l: &Lns) -> Vec<f64> {
    let mut xs = vec![
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        -f64::MAX,
        f64::MIN_POSITIVE,
        f64::from_bits(1),
        -f64::from_bits(1),
        f64::from_bits(0x000F_FFFF_FFFF_FFFF),
        1.0,
        -1.0,
    ];
    let (max, min) = (l.max_value(), l.min_positive());
    for v in [max, min, min / 2.0, min * 0.75, min / 4.0, max * 2.0] {
        xs.push(v);
    }
    let n = lns_with_neighbours(&xs);
    xs.extend(n);
    xs
}

/// Formats whose every pattern and boundary is tested (small w, every f).
const LNS_SMALL: [(u32, u32); 12] = [
    (3, 0),
    (3, 1),
    (4, 0),
    (4, 2),
    (5, 1),
    (6, 3),
    (8, 3),
    (8, 6),
    (10, 4),
    (12, 10),
    (12, 0),
    (16, 3),
];

#[test]
fn lns_every_boundary_and_value_of_small_formats() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    let before = lns_counts();
    for (w, f) in LNS_SMALL {
        let l = lns(w, f);
        let step = if w >= 12 { 7 } else { 1 };
        let mut xs = lns_specials(&l);
        // The values themselves (kept in every mode) and their neighbours (toward-zero's
        // boundaries), the log-domain midpoints (nearest) and 2-bit stochastic thresholds.
        xs.extend(lns_with_neighbours(&lns_boundaries(&l, 0, step)));
        xs.extend(lns_with_neighbours(&lns_boundaries(&l, 1, step)));
        if w <= 10 {
            xs.extend(lns_with_neighbours(&lns_boundaries(&l, 2, step)));
        }
        checked += lns_all_modes(&l, &xs, w <= 8, &mut m);
        checked += lns_codec(&l, &xs, &mut m);
    }
    let after = lns_counts();
    // The boundary inputs lie within the log2 estimate's error bound of a boundary: the exact
    // comparison decides them.
    assert!(after[1] > before[1], "the exact comparison never ran");
    m.assert_none_of("lns boundaries", checked);
}

/// Shim encode and decode against `Lns::encode` / `Lns::decode` on `xs` and on every pattern
/// (w <= 16; else the patterns of the encoded xs and random patterns).
fn lns_codec(l: &Lns, xs: &[f64], m: &mut Mismatches) -> u64 {
    let f = Format::Lns(*l);
    let r = raw(&f);
    let got = shim_encode(r, xs);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = l.encode(x);
        m.check(want == g, || {
            format!("{f} encode {}: rust {want:#x} shim {g:#x}", show(x))
        });
        // SAFETY: plain values.
        let fails = unsafe { qc_host_encode_fails(x, r.family, r.a, r.b, r.flags) };
        m.check(fails == 0, || format!("{f} encode_fails {}", show(x)));
    }
    let mut patterns: Vec<u32> = if l.w() <= 16 {
        (0..1u32 << l.w()).collect()
    } else {
        let mut rng = SplitMix(0x1a5 ^ l.w() as u64);
        (0..100_000).map(|_| rng.next_u32()).collect()
    };
    patterns.extend(&got);
    // Bits above w are ignored.
    patterns.push(u32::MAX);
    let vals = shim_decode(r, &patterns);
    for (&p, &v) in patterns.iter().zip(&vals) {
        let want = l.decode(p);
        m.check(want.to_bits() == v.to_bits(), || {
            format!("{f} decode {p:#x}: rust {} shim {}", show(want), show(v))
        });
    }
    (xs.len() + patterns.len()) as u64
}

/// A random f64 around lns<w,f>'s range (a third below min, a third above max).
fn lns_random_input(l: &Lns, rng: &mut SplitMix) -> f64 {
    let lo = l.min_positive().max(f64::MIN_POSITIVE).log2() as i32;
    let hi = l.max_value().min(f64::MAX).log2() as i32;
    let span = (hi - lo).max(4);
    let (a, b) = match rng.below(3) {
        0 => ((lo - span / 2).max(-1074), lo + 2),
        1 => (lo, hi),
        _ => (hi - 2, (hi + span / 2).min(1023)),
    };
    let x = rng.float_between(a, b.max(a + 1));
    if rng.coin() {
        -x
    } else {
        x
    }
}

#[test]
fn lns_random_inputs_up_to_f_30() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for (i, (w, f, n)) in [
        (8, 3, 20_000),
        (12, 8, 20_000),
        (16, 10, 20_000),
        (24, 16, 20_000),
        (32, 20, 20_000),
        (32, 23, 40_000),
        (31, 23, 20_000),
        (32, 30, 40_000),
        (32, 0, 10_000),
    ]
    .into_iter()
    .enumerate()
    {
        let l = lns(w, f);
        let mut rng = SplitMix(0x7a11 + i as u64);
        let xs: Vec<f64> = (0..n).map(|_| lns_random_input(&l, &mut rng)).collect();
        checked += lns_all_modes(&l, &xs, false, &mut m);
        checked += lns_codec(&l, &xs[..n / 4], &mut m);
    }
    m.assert_none_of("lns random inputs", checked);
}

#[test]
fn lns_near_boundary_inputs_at_large_f_take_the_exact_path() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    let mut rng = SplitMix(0xb0);
    for (w, f) in [(32, 23), (30, 23), (32, 28), (32, 30)] {
        let l = lns(w, f);
        let before = lns_counts();
        // Random codes near 1 and across the range: the value, its f64 neighbours (floor
        // boundaries) and, where a finer lns exists, the nearest and stochastic boundaries
        // beside it.
        let mut xs = Vec::new();
        for i in 0..3000 {
            let k = if i % 2 == 0 {
                rng.below(1 << 20) as i64 - (1 << 19)
            } else {
                rng.below(l.k_max() as u64 * 2) as i64 - l.k_max()
            };
            xs.push(l.value(k));
            for extra in 1..=(30 - f).min(3) {
                let fine = lns(32, f + extra);
                let kf = (k << extra) + rng.below(1 << extra) as i64;
                if kf >= fine.k_min() && kf <= fine.k_max() {
                    xs.push(fine.value(kf));
                }
            }
        }
        let xs = lns_with_neighbours(&xs);
        checked += lns_all_modes(&l, &xs, false, &mut m);
        checked += lns_codec(&l, &xs, &mut m);
        let after = lns_counts();
        assert!(
            after[1] > before[1] + 1000,
            "lns<{w},{f}>: the exact comparison ran {} times",
            after[1] - before[1]
        );
    }
    m.assert_none_of("lns near boundaries", checked);
}

/// f32 inputs below min that equal the f32 of a smaller power `2^(k/2^f)` (k < k_min): the
/// kept-values rule keeps only codes of the format, so toward-zero and stochastic rounding
/// do not return such an input unchanged (lns.rs: `floor_t >= k_min - 1`).
#[test]
fn lns_inputs_below_min_are_not_kept_at_f32_storage() {
    let tz = Rounding::TowardZero;
    // 2^(-1006/8) as f32 lies just below the power: floor(t) = -1007, and k = -1006 is far
    // below lns<5,3>'s k_min = -7.
    let l = lns(5, 3);
    let x = f32::from_bits(0x009837f0) as f64;
    for (r, w) in [
        (tz, 0),
        (Rounding::Stochastic { bits: 23 }, u32::MAX),
        (Rounding::Stochastic { bits: 8 }, u32::MAX),
    ] {
        let (got, undecided) = shim_lns_round(l, r, &[x, -x], &[w, w], true);
        assert!(!undecided);
        assert_eq!(got[0].to_bits(), 0, "{r}: {}", show(got[0]));
        assert_eq!(got[1].to_bits(), 0, "{r}: {}", show(got[1]));
        assert_eq!(rust_lns(&l, x, r, w, true).to_bits(), 0);
    }
    // The f32s of 2^(k/2^f) for k below, at and just above k_min (a wider lns with the same f
    // gives them), in every mode at f32 and f64 storage; count those the old rule kept.
    let mut m = Mismatches::default();
    let mut checked = 0;
    let mut below_power = 0;
    for (w, f) in [
        (5, 3),
        (4, 0),
        (6, 1),
        (8, 3),
        (8, 6),
        (10, 4),
        (12, 7),
        (16, 10),
    ] {
        let l = lns(w, f);
        let wide = lns(32, f);
        let mut ks: Vec<i64> = (l.k_min() - 3 * (1 << f)..=l.k_min() + 2).collect();
        // Far below: subnormal and tiny normal f32s.
        ks.extend(((-149i64 << f)..(-120i64 << f)).step_by(((1 << f) / 3).max(1)));
        let mut xs = Vec::new();
        for k in ks {
            if k < wide.k_min() {
                continue;
            }
            let v = wide.value(k);
            let x = v as f32 as f64;
            if x == 0.0 {
                continue;
            }
            if k < l.k_min() && x < v && f > 0 {
                below_power += 1;
                let got = shim_lns_round(l, tz, &[x], &[0], true).0[0];
                m.check(got != x, || {
                    format!("lns<{w},{f}> toward-zero kept {} (k = {k})", show(x))
                });
            }
            xs.push(x);
        }
        let n = lns_with_neighbours(&xs);
        xs.extend(n);
        checked += lns_all_modes(&l, &xs, w <= 8, &mut m);
    }
    assert!(
        below_power > 100,
        "only {below_power} f32s below their power"
    );
    m.assert_none_of("lns below min", checked);
}

#[test]
fn lns_values_of_large_f_match_value() {
    let mut m = Mismatches::default();
    let mut rng = SplitMix(0xfa1);
    for f in [20u32, 23, 27, 30] {
        let l = lns(32, f);
        // k across the range, subnormal and overflowing values included.
        let ks: Vec<i64> = (0..200_000)
            .map(|i| match i % 3 {
                0 => rng.below(1 << 24) as i64 - (1 << 23),
                1 => rng.below(l.k_max() as u64 * 2 + 1) as i64 - l.k_max(),
                _ => ((-1074i64 + rng.below(60) as i64) << f) + rng.below(1 << f) as i64,
            })
            .collect();
        let mut out = vec![0.0; ks.len()];
        let mut undecided = vec![0u8; ks.len()];
        // SAFETY: the arrays hold ks.len() elements.
        unsafe {
            qc_host_lns_value_batch(
                ks.as_ptr(),
                out.as_mut_ptr(),
                undecided.as_mut_ptr(),
                ks.len(),
                f as i32,
            )
        };
        for ((&k, &v), &u) in ks.iter().zip(&out).zip(&undecided) {
            let want = l.value(k);
            m.check(u == 0 && want.to_bits() == v.to_bits(), || {
                format!(
                    "value({k}) f = {f}: rust {} shim {} undecided {u}",
                    show(want),
                    show(v)
                )
            });
        }
    }
    m.assert_none("lns values");
}

#[test]
fn lns_log2_estimate_has_the_rust_bits() {
    let mut rng = SplitMix(0x10c2);
    for i in 0..200_000u64 {
        let m = match i {
            0 => 1 << 52,
            1 => (1 << 53) - 1,
            _ => (1 << 52) | (rng.next_u64() >> 12),
        };
        // The Rust estimate through the public rounding is not reachable; compare with the
        // same f64 steps written here (lns_approx.rs log2_significand).
        let want = log2_significand_reference(m);
        // SAFETY: plain values.
        let got = unsafe { qc_host_lns_log2_significand(m) };
        assert_eq!(want.to_bits(), got.to_bits(), "m = {m:#x}");
    }
}

/// lns_approx.rs log2_significand, step for step.
fn log2_significand_reference(m: u64) -> f64 {
    let mut v = m as f64 * (1.0 / (1u64 << 52) as f64);
    let mut offset = 0.0;
    if v > std::f64::consts::SQRT_2 {
        v *= 0.5;
        offset = 1.0;
    }
    let s = (v - 1.0) / (v + 1.0);
    let z = s * s;
    let mut p = 1.0 / 21.0;
    for c in [19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0] {
        p = p * z + 1.0 / c;
    }
    (2.0 * s) * p * std::f64::consts::LOG2_E + offset
}

#[test]
fn lns_exact_comparison_is_exact_or_says_undecided_at_every_precision() {
    use num_bigint::BigUint;
    let mut rng = SplitMix(0xc0de);
    let mut undecided_at_64 = 0u32;
    let mut checked = 0;
    for i in 0..2000u64 {
        let m = match i % 5 {
            // Just above a power of two: m^(2^g) is within about 2^(g - 63) of 2^n
            // (relative), too close for 64-bit bounds.
            0 => (1u64 << 63) + 1 + rng.below(4),
            // Just below one: m^(2^g) just below 2^n.
            1 => u64::MAX - rng.below(4),
            2 => (1u64 << 52) | (rng.next_u64() >> 12),
            3 => (1u64 << 53) | (rng.next_u64() >> 11) | 1,
            _ => 1 + rng.below(1000),
        };
        let g = rng.below(11) as u32;
        let mut p = BigUint::from(m);
        for _ in 0..g {
            p = &p * &p;
        }
        // floor(log2(m^(2^g))) and its neighbours, against the exact power.
        let top = p.bits() as i64 - 1;
        for n in [top - 1, top, top + 1] {
            let want = match p.cmp(&(BigUint::from(1u32) << n as usize)) {
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
            };
            // SAFETY: plain values.
            let full = unsafe { qc_host_lns_pow_cmp(m, g, n, 16) };
            assert_eq!(full, want, "{m}^(2^{g}) vs 2^{n}");
            checked += 1;
            if m.is_power_of_two() {
                continue;
            }
            for limbs in [1, 2, 4, 8, 16] {
                // SAFETY: plain values.
                let c = unsafe { qc_host_lns_interval_cmp(m, g, n, limbs) };
                if c == 0 {
                    assert!(
                        limbs == 1,
                        "{m}^(2^{g}) vs 2^{n} undecided with {limbs} limbs"
                    );
                } else {
                    assert_eq!(c, want, "{m}^(2^{g}) vs 2^{n} with {limbs} limbs");
                }
            }
        }
    }
    assert!(checked > 5000);
    // Large g: 64-bit m whose power lies just above or below 2^n (n = floor(2^g log2 m) and
    // the next integer), where 64-bit bounds, about 2^(g - 62) wide in relative terms, often
    // cannot decide. Every answer must agree with the 1024-bit one or say undecided.
    let cmp16 = |m: u64, g: u32, n: i64| unsafe { qc_host_lns_pow_cmp(m, g, n, 16) };
    for _ in 0..8000 {
        let m = rng.next_u64() | (1 << 63) | 1;
        let g = 52 + rng.below(4) as u32;
        let est = ((m as f64).log2() * (1u64 << g) as f64) as i64;
        let (mut lo, mut hi) = (est - (1 << 14), est + (1 << 14));
        assert!(cmp16(m, g, lo) > 0 && cmp16(m, g, hi) < 0);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if cmp16(m, g, mid) > 0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        for n in [lo, hi] {
            let want = cmp16(m, g, n);
            for limbs in [1, 2, 4, 8, 16] {
                // SAFETY: plain values.
                let c = unsafe { qc_host_lns_interval_cmp(m, g, n, limbs) };
                if c == 0 {
                    undecided_at_64 += (limbs == 1) as u32;
                    assert!(
                        limbs <= 2,
                        "{m}^(2^{g}) vs 2^{n} undecided with {limbs} limbs"
                    );
                } else {
                    assert_eq!(c, want, "{m}^(2^{g}) vs 2^{n} with {limbs} limbs");
                }
            }
        }
    }
    // Bounds too narrow say so instead of guessing, and so does the capped comparison.
    assert!(
        undecided_at_64 > 5,
        "only {undecided_at_64} undecided with 64-bit bounds"
    );
    // SAFETY: plain values.
    let capped = unsafe { qc_host_lns_pow_cmp((1u64 << 63) + 1, 5, 63 << 5, 1) };
    assert_eq!(capped, 2, "a comparison undecided at the cap must say so");
}

// ---------------------------------------------------------------------------------------
// Block-scaled formats: MX and NVFP4
// ---------------------------------------------------------------------------------------

extern "C" {
    fn qc_host_mx_scale(amax: f64, code: i32) -> i32;
    fn qc_host_mx_round_batch(
        x: *const f64,
        random: *const u32,
        out: *mut f64,
        n: usize,
        code: i32,
        scale: i32,
        mode: i32,
        bits: i32,
    );
    fn qc_host_nvfp4_tensor_scale(amax: f64) -> f64;
    fn qc_host_nvfp4_block_scale(amax: f64, s_t: f64) -> f64;
    fn qc_host_nvfp4_round_batch(
        x: *const f64,
        random: *const u32,
        out: *mut f64,
        n: usize,
        s_b: f64,
        s_t: f64,
        mode: i32,
        bits: i32,
    );
}

/// The scale exponent the header uses for a NaN MX block.
const MX_SCALE_NAN: i32 = 128;

fn shim_mx_round(m: &Mx, scale: Option<i32>, r: Rounding, xs: &[f64], rand: &[u32]) -> Vec<f64> {
    assert_eq!(xs.len(), rand.len());
    let (mode, bits) = raw_rounding(r);
    let mut out = vec![0.0; xs.len()];
    // SAFETY: the three arrays hold xs.len() elements.
    unsafe {
        qc_host_mx_round_batch(
            xs.as_ptr(),
            rand.as_ptr(),
            out.as_mut_ptr(),
            xs.len(),
            m.element().code(),
            scale.unwrap_or(MX_SCALE_NAN),
            mode,
            bits,
        )
    };
    out
}

fn shim_nvfp4_round(s_b: f64, s_t: f64, r: Rounding, xs: &[f64], rand: &[u32]) -> Vec<f64> {
    assert_eq!(xs.len(), rand.len());
    let (mode, bits) = raw_rounding(r);
    let mut out = vec![0.0; xs.len()];
    // SAFETY: the three arrays hold xs.len() elements.
    unsafe {
        qc_host_nvfp4_round_batch(
            xs.as_ptr(),
            rand.as_ptr(),
            out.as_mut_ptr(),
            xs.len(),
            s_b,
            s_t,
            mode,
            bits,
        )
    };
    out
}

/// Every nonnegative value of an MX element type, ascending.
fn mx_element_values(e: MxElement) -> Vec<f64> {
    match e.format() {
        ElementFormat::Float(f) => {
            let mut v: Vec<f64> = (0..1u32 << (f.bits() - 1))
                .map(|p| f.decode(p))
                .filter(|v| v.is_finite())
                .collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v
        }
        ElementFormat::Fixed(f) => (0..128).map(|k| k as f64 * f.quantum()).collect(),
    }
}

/// Block maxima around every scale: powers of two with their neighbours, specials.
fn amax_inputs() -> Vec<f64> {
    let mut v = powers_of_two(1074);
    v.extend(specials());
    v.extend(random_f64(20_000, -1074, 1023, 99));
    v.into_iter().map(f64::abs).collect()
}

/// MX: the scale exponent of every kind of block maximum, and every element value, tie and
/// neighbour at scales from -127 to 127 and in a NaN block, in every rounding mode.
#[test]
fn mx_scales_and_elements() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    for e in MxElement::ALL {
        let mx = Mx::new(e, -1);
        for amax in amax_inputs() {
            let want = mx.scale_exponent(amax).unwrap_or(MX_SCALE_NAN);
            // SAFETY: plain values.
            let got = unsafe { qc_host_mx_scale(amax, e.code()) };
            m.check(got == want, || {
                format!("{mx} scale of {}: {got} vs {want}", show(amax))
            });
            checked += 1;
        }
        for scale in [
            Some(-127),
            Some(-126),
            Some(-60),
            Some(-3),
            Some(0),
            Some(5),
            Some(100),
            Some(127),
            None,
        ] {
            let s = Subject::Mx(mx, scale);
            let mut xs = boundary_inputs(&s);
            let (lo, hi) = binade_range(&s);
            xs.extend(random_f32(4_000, lo, hi, 7 + checked));
            checked += check_all_modes(&s, &xs, &mut m);
        }
        // Format::round: a value as a block of its own (family 4 through qc_round).
        let s = Subject::Format(Format::Mx(mx));
        checked += check_all_modes(&s, &boundary_inputs(&s), &mut m);
    }
    m.assert_none_of("MX", checked);
}

/// NVFP4: tensor and block scales of every kind of maximum, and the elements of blocks of
/// many scales (zero and NaN included) in every rounding mode.
#[test]
fn nvfp4_scales_and_elements() {
    let mut m = Mismatches::default();
    let mut checked = 0;
    let amaxes = amax_inputs();
    let tensor_scales: Vec<f64> = [1.0, 2688.0, 3.0e-40, 1.0e-45, 3.0e38, 1e300, 0.1]
        .iter()
        .map(|&a| Nvfp4::tensor_scale(a))
        .collect();
    for &amax in &amaxes {
        // SAFETY: plain values.
        let got = unsafe { qc_host_nvfp4_tensor_scale(amax) };
        let want = Nvfp4::tensor_scale(amax);
        m.check(got.to_bits() == want.to_bits(), || {
            format!("tensor scale of {}", show(amax))
        });
        for &s_t in &tensor_scales {
            // SAFETY: plain values.
            let got = unsafe { qc_host_nvfp4_block_scale(amax, s_t) };
            let want = Nvfp4::block_scale(amax, s_t);
            m.check(same_bits(got, want), || {
                format!(
                    "block scale of {} under {s_t:e}: {} vs {}",
                    show(amax),
                    show(got),
                    show(want)
                )
            });
            checked += 1;
        }
    }
    for &s_t in &tensor_scales {
        for s_b in [448.0, 13.0, 1.0, 0.5, 2f64.powi(-9), 0.0, f64::NAN] {
            let s = Subject::Nvfp4(s_b, s_t);
            let mut xs = boundary_inputs(&s);
            let (lo, hi) = binade_range(&s);
            xs.extend(random_f32(4_000, lo, hi, 3 + checked));
            checked += check_all_modes(&s, &xs, &mut m);
        }
    }
    let s = Subject::Format(Format::Nvfp4(Nvfp4::new(-1)));
    let mut xs = boundary_inputs(&s);
    xs.extend(random_f64(20_000, -1074, 1023, 5));
    checked += check_all_modes(&s, &xs, &mut m);
    m.assert_none_of("NVFP4", checked);
}

/// NaN results match as NaN (the header writes the canonical NaN, as Rust does here).
fn same_bits(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits()
}
