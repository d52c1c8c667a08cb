//! Naive posit<8,0> in i16 lanes (`quire::p8_units`, `quire::naive_p8`) against the exact
//! operation tables (`OpTables`, themselves checked against softposit in
//! `tests/quire_naive.rs`):
//!
//! * the sum's integer rounding (`round_sum` and its table) on every sum of two finite
//!   values and on every integer the kernels can meet, the product table on every pair;
//! * the vector kernels' rounding and products on all pairs, through GEMMs built so that
//!   each output is one sum or one product, under every instruction-set cap;
//! * whole GEMMs against the definition run on patterns through the tables (`c = add[c,
//!   mul[a, b]]` from 0, `k` ascending, bias last), under every cap, from f64 and from f32
//!   operands in every layout: odd shapes, partial tiles, `m` or `n` = 1, `k` up to 1000
//!   with sums that saturate at maxpos and come back, bias per row and per column, NaR,
//!   NaN, ±Inf and zeros.
//!
//! The cap is process-wide, so the tests of this file take a lock while they hold one.

mod common;
#[path = "common/isa_cap.rs"]
mod isa_cap;
#[path = "common/layouts.rs"]
mod layouts;

use common::{Mismatches, SplitMix};
use half::f16;
use isa_cap::on_every_isa;
use layouts::Layouts;
use qcandle::format::Rounding;
use qcandle::quire::gemm_cpu::{naive_gemm, Bias, OpTables};
use qcandle::quire::p8_fp16;
use qcandle::quire::p8_lanes::{self, to_codes, to_rows, Kernel};
use qcandle::quire::p8_units::{
    lane_code, magnitude_pattern, round_sum, row_index, P8Units, MAXPOS,
};
use qcandle::quire::{Accumulate, GemmRule};
use qcandle::Format;

const NAR: u8 = 0x80;

fn p8() -> Format {
    Format::posit(8, 0).unwrap()
}

fn tables() -> std::sync::Arc<OpTables> {
    OpTables::get(&p8()).unwrap()
}

/// Runs `f` under each instruction set this CPU has and, under AVX-512 on a CPU with FP16
/// and VBMI, with the i16 kernel and with the binary16 kernel; `f` gets the kernel's name.
fn on_every_kernel(mut f: impl FnMut(String)) {
    on_every_isa(|isa| {
        let mut kernels = vec![true];
        if p8_fp16::supported() && Kernel::best() != Kernel::Portable {
            kernels.push(false);
        }
        for fp16 in kernels {
            p8_lanes::allow_fp16(fp16);
            f(format!("{isa:?} {:?}", Kernel::best()));
        }
        p8_lanes::allow_fp16(true);
    });
}

/// The pattern of an output value (NaN: NaR), checked to be exactly that pattern's value.
fn pattern_of(ops: &OpTables, x: f64) -> Option<u8> {
    if x.is_nan() {
        return Some(NAR);
    }
    let p = ops.encode(x);
    (ops.decode[p as usize] == x).then_some(p)
}

/// The finite patterns (all but NaR).
fn finite() -> impl Iterator<Item = u8> + Clone {
    (0..=255u8).filter(|&p| p != NAR)
}

/// `round_sum` and its table on every sum of two finite values equal the add table.
#[test]
fn sum_rounding_equals_add_table_on_all_finite_pairs() {
    let ops = tables();
    let units = P8Units::get();
    let mut mm = Mismatches::default();
    let mut checked = 0;
    for x in finite() {
        for y in finite() {
            let v = ops.decode[x as usize] + ops.decode[y as usize];
            let vu = (v * 64.0) as i16;
            assert_eq!(f64::from(vu), v * 64.0, "sums are whole units");
            let want = ops.add[(x as usize) << 8 | y as usize];
            let want_units = ops.decode[want as usize] * 64.0;
            for (what, got) in [("round_sum", round_sum(vu)), ("table", units.round(vu))] {
                mm.check(f64::from(got) == want_units, || {
                    format!("{what} {x:#x} + {y:#x} = {vu} units: {got} vs {want_units}")
                });
            }
            checked += 1;
        }
    }
    mm.assert_none_of("round(c + p) vs add table", checked);
    assert_eq!(checked, 255 * 255);
}

/// The binary16 kernel's sum (`p8_fp16`): each value as binary16 (`units · 2^-10`), the sum
/// rounded to binary16 and then by the magic constants (`p8_fp16::round_sum`, the scalar
/// form of the kernel's steps), equals the add table on every sum of two finite values,
/// those that binary16 rounds first included (e.g. 2048 + 63 units).
#[test]
fn binary16_sum_rounding_equals_add_table_on_all_finite_pairs() {
    let ops = tables();
    let units = P8Units::get();
    let half = |u: i16| f16::from_bits(p8_fp16::value(u));
    let mut mm = Mismatches::default();
    let mut inexact = 0;
    for x in finite() {
        for y in finite() {
            let (ux, uy) = (units.units[x as usize], units.units[y as usize]);
            let (hx, hy) = (half(ux), half(uy));
            assert_eq!(
                hx.to_f64() * 1024.0,
                f64::from(ux),
                "values are binary16 numbers"
            );
            let sum = f16::from_f32(hx.to_f32() + hy.to_f32());
            inexact += usize::from(sum.to_f64() * 1024.0 != f64::from(ux + uy));
            let got = p8_fp16::round_sum(sum).to_f64() * 1024.0;
            let want = ops.decode[ops.add[(x as usize) << 8 | y as usize] as usize] * 64.0;
            mm.check(got == want, || {
                format!("{x:#x} + {y:#x} = {} units: {got} vs {want}", ux + uy)
            });
        }
    }
    mm.assert_none_of("binary16 round(c + p) vs add table", 255 * 255);
    assert!(inexact > 0, "some sums are rounded by binary16 first");
}

/// `round_sum` on every integer from -8192 to 8192 (every sum of two values lies there)
/// equals the format's rounding of `v / 64`.
#[test]
fn sum_rounding_equals_format_rounding_on_every_integer() {
    let f = p8();
    let mut mm = Mismatches::default();
    for v in -8192..=8192i16 {
        let want = f.round(f64::from(v) / 64.0, Rounding::NearestEven, 0) * 64.0;
        let got = round_sum(v);
        mm.check(f64::from(got) == want, || format!("{v}: {got} vs {want}"));
    }
    mm.assert_none_of("round_sum vs Format::round", 16385);
}

/// The product table, keyed by `a`'s row and `b`'s magnitude pattern, a negative `b`
/// negating the entry, equals the mul table on every pair of finite values.
#[test]
fn product_table_equals_mul_table_on_all_finite_pairs() {
    let ops = tables();
    let t = P8Units::get();
    let mut mm = Mismatches::default();
    for x in finite() {
        mm.check(
            f64::from(t.units[x as usize]) == ops.decode[x as usize] * 64.0,
            || format!("units of {x:#x}"),
        );
        let row = row_index(t.units[x as usize]) as usize;
        for y in finite() {
            let code = lane_code(t.units[y as usize]);
            let entry = t.prod[row * 128 + (code & 127) as usize];
            let got = if code < 0 { -entry } else { entry };
            let want = ops.decode[ops.mul[(x as usize) << 8 | y as usize] as usize] * 64.0;
            mm.check(f64::from(got) == want, || {
                format!("{x:#x} * {y:#x}: {got} vs {want} units")
            });
        }
    }
    mm.assert_none_of("products vs mul table", 255 * 255);
    assert_eq!(MAXPOS, 4096);
}

/// The keys of every finite value, scalar and by the vector conversions under every cap
/// (lengths that end inside a tile: the masked loads and stores): the magnitude pattern is
/// the pattern of `|x|`, the sign in bit 15 (lane codes) or bit 7 (table rows).
#[test]
fn keys_of_every_value_equal_its_pattern_under_every_cap() {
    let ops = tables();
    let t = P8Units::get();
    let values: Vec<u8> = finite().collect();
    let units: Vec<i16> = values.iter().map(|&p| t.units[p as usize]).collect();
    // The keys from the decode and encode tables alone.
    let want: Vec<(i16, u8)> = values
        .iter()
        .map(|&p| {
            let v = ops.decode[p as usize];
            let m = ops.encode(v.abs());
            let neg = v < 0.0;
            (
                (u16::from(m) | if neg { 0x8000 } else { 0 }) as i16,
                m | if neg { 0x80 } else { 0 },
            )
        })
        .collect();
    let mut mm = Mismatches::default();
    let mut check = |what: &str, codes: &[i16], rows: &[u8]| {
        for (i, (&c, &r)) in codes.iter().zip(rows).enumerate() {
            mm.check((c, r) == want[i], || {
                let (wc, wr) = want[i];
                format!(
                    "{what} {:#x}: code {c:#x} row {r:#x}, want {wc:#x} {wr:#x}",
                    values[i]
                )
            });
        }
    };
    for &u in &units {
        assert_eq!(
            magnitude_pattern(u.unsigned_abs()),
            lane_code(u) as u16 & 0x7f
        );
    }
    let codes: Vec<i16> = units.iter().map(|&u| lane_code(u)).collect();
    let rows: Vec<u8> = units.iter().map(|&u| row_index(u)).collect();
    check("scalar", &codes, &rows);
    on_every_isa(|isa| {
        for len in [1, 31, 32, 33, 64, units.len()] {
            let mut codes = units[..len].to_vec();
            to_codes(&mut codes);
            let mut rows = vec![0u8; len];
            to_rows(&units[..len], &mut rows);
            check(&format!("{isa:?} length {len}"), &codes, &rows);
        }
    });
    mm.assert_none("keys vs patterns");
}

/// The definition on patterns through the tables: `m x n` output patterns.
fn reference(
    ops: &OpTables,
    a: &[u8],
    b: &[u8],
    (m, k, n): (usize, usize, usize),
    bias: &Option<(bool, Vec<u8>)>,
) -> Vec<u8> {
    let mut out = vec![0u8; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut c = 0u8;
            for t in 0..k {
                let p = ops.mul[(a[i * k + t] as usize) << 8 | b[t * n + j] as usize];
                c = ops.add[(c as usize) << 8 | p as usize];
            }
            if let Some((per_row, v)) = bias {
                let term = if *per_row { v[i] } else { v[j] };
                c = ops.add[(c as usize) << 8 | term as usize];
            }
            out[i * n + j] = c;
        }
    }
    out
}

/// Every output of `got` (values) against the reference patterns.
fn compare(mm: &mut Mismatches, ops: &OpTables, what: &str, got: &[f64], want: &[u8], n: usize) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    for (idx, (&g, &w)) in got.iter().zip(want).enumerate() {
        let p = pattern_of(ops, g);
        mm.check(p == Some(w), || {
            format!("{what} [{}][{}]: {g} ({p:?}) vs {w:#x}", idx / n, idx % n)
        });
    }
}

/// `naive_gemm` (the f64 entry) on these patterns under the active cap.
fn run_f64(
    ops: &OpTables,
    a: &[u8],
    b: &[u8],
    dims: (usize, usize, usize),
    bias: &Option<(bool, Vec<u8>)>,
    parallel: bool,
) -> Vec<f64> {
    let (m, k, n) = dims;
    let val = |p: &u8| ops.decode[*p as usize];
    let (av, bv): (Vec<f64>, Vec<f64>) = (a.iter().map(val).collect(), b.iter().map(val).collect());
    let bias_v: Option<Vec<f64>> = bias.as_ref().map(|(_, v)| v.iter().map(val).collect());
    let bias = match (bias, &bias_v) {
        (Some((true, _)), Some(v)) => Bias::PerRow(v),
        (Some((false, _)), Some(v)) => Bias::PerCol(v),
        _ => Bias::None,
    };
    let mut out = vec![f64::INFINITY; m * n];
    naive_gemm(&p8(), &av, &bv, (m, k, n), bias, &mut out, parallel);
    out
}

/// Output `idx`'s sum of one pair: `A = [1, 1]`, `B`'s rows `x` and `y`, so the output is
/// `round(x + y)`; products likewise with `k = 1`. Every finite pair, under every cap.
#[test]
fn kernel_sums_and_products_equal_tables_on_all_pairs_under_every_cap() {
    let ops = tables();
    let one = ops.encode(1.0);
    let pairs: Vec<(u8, u8)> = finite()
        .flat_map(|x| finite().map(move |y| (x, y)))
        .collect();
    let n = pairs.len();
    let b: Vec<u8> = pairs
        .iter()
        .map(|p| p.0)
        .chain(pairs.iter().map(|p| p.1))
        .collect();
    let sums: Vec<u8> = pairs
        .iter()
        .map(|&(x, y)| ops.add[(x as usize) << 8 | y as usize])
        .collect();
    // Products: every pattern (NaR included) times every pattern.
    let all: Vec<u8> = (0..=255).collect();
    let products = reference(&ops, &all, &all, (256, 1, 256), &None);
    let mut mm = Mismatches::default();
    on_every_kernel(|isa| {
        let got = run_f64(&ops, &[one, one], &b, (1, 2, n), &None, true);
        compare(&mut mm, &ops, &format!("{isa} sums"), &got, &sums, n);
        let got = run_f64(&ops, &all, &all, (256, 1, 256), &None, true);
        compare(
            &mut mm,
            &ops,
            &format!("{isa} products"),
            &got,
            &products,
            256,
        );
    });
    mm.assert_none("kernel sums and products vs tables");
}

/// Finite patterns of magnitude pattern in `lo ..= hi`, random signs; every `zeros`-th 0.
fn patterns(rng: &mut SplitMix, count: usize, (lo, hi): (u8, u8), zeros: usize) -> Vec<u8> {
    (0..count)
        .map(|i| {
            let r = rng.next_u64();
            if zeros > 0 && i % zeros == zeros - 1 {
                return 0;
            }
            let mag = lo + (r % u64::from(hi - lo + 1)) as u8;
            if r >> 63 == 1 {
                mag.wrapping_neg()
            } else {
                mag
            }
        })
        .collect()
}

/// Where a case puts NaR: `A[i][t]`, `B[t][j]`, the bias term.
type NarSpots = (
    Option<(usize, usize)>,
    Option<(usize, usize)>,
    Option<usize>,
);

/// One GEMM case: shape, operand magnitudes, zeros, bias, NaR spots.
struct Case {
    dims: (usize, usize, usize),
    /// Magnitude patterns of `A` and `B` (posit<8,0>: 0x40 is 1, 0x60 is 2, 0x70 is 4).
    mags: (u8, u8),
    zeros: usize,
    /// `Some(per_row)`.
    bias: Option<bool>,
    /// NaR at `(row of A, t)` and `(t, column of B)`, and in the bias at an index.
    nar: NarSpots,
}

fn cases() -> Vec<Case> {
    let c = |dims, mags, zeros, bias, nar| Case {
        dims,
        mags,
        zeros,
        bias,
        nar,
    };
    vec![
        c((1, 1, 1), (0x01, 0x7f), 0, None, (None, None, None)),
        c(
            (1, 1000, 1),
            (0x50, 0x78),
            0,
            Some(true),
            (None, None, None),
        ),
        c(
            (3, 1, 200),
            (0x01, 0x7f),
            5,
            Some(false),
            (None, None, None),
        ),
        c((1, 37, 33), (0x30, 0x68), 7, None, (None, None, None)),
        c((5, 77, 31), (0x01, 0x7f), 3, Some(true), (None, None, None)),
        c(
            (2, 64, 165),
            (0x38, 0x70),
            0,
            Some(false),
            (None, None, None),
        ),
        // Products of a few units, sums that stay in the exact range below 64 units.
        c((4, 300, 64), (0x08, 0x38), 0, None, (None, None, None)),
        // Large products: the sums saturate at ±maxpos and come back, for k up to 999.
        c(
            (7, 999, 129),
            (0x58, 0x7f),
            11,
            Some(false),
            (None, None, None),
        ),
        c(
            (6, 500, 96),
            (0x60, 0x7c),
            0,
            Some(true),
            (None, None, None),
        ),
        // NaR in A, in B and in the bias.
        c(
            (5, 40, 70),
            (0x20, 0x70),
            4,
            Some(false),
            (Some((2, 7)), Some((39, 65)), Some(3)),
        ),
        c(
            (3, 20, 40),
            (0x20, 0x70),
            0,
            Some(true),
            (None, None, Some(1)),
        ),
        c((9, 0, 50), (0x20, 0x70), 0, Some(false), (None, None, None)),
        // Enough rows and work for the f32 entry to cut the output into bands of rows
        // (`team::Threading`): NaR in a row of the second band, a bias per row and per
        // column.
        c(
            (37, 61, 41),
            (0x20, 0x70),
            3,
            Some(true),
            (Some((25, 7)), Some((39, 20)), Some(30)),
        ),
        c(
            (70, 40, 30),
            (0x01, 0x7f),
            2,
            Some(false),
            (None, None, None),
        ),
    ]
}

/// The case's operands and bias as patterns.
type Patterns = (Vec<u8>, Vec<u8>, Option<(bool, Vec<u8>)>);

fn case_patterns(case: &Case, seed: u64) -> Patterns {
    let (m, k, n) = case.dims;
    let mut rng = SplitMix(seed);
    let mut a = patterns(&mut rng, m * k, (case.mags.0, case.mags.1), case.zeros);
    let mut b = patterns(&mut rng, k * n, (0x30, 0x50), case.zeros);
    if let Some((i, t)) = case.nar.0 {
        a[i * k + t] = NAR;
    }
    if let Some((t, j)) = case.nar.1 {
        b[t * n + j] = NAR;
    }
    let bias = case.bias.map(|per_row| {
        let len = if per_row { m } else { n };
        let mut v = patterns(&mut rng, len, (0x01, 0x7f), 0);
        if let Some(at) = case.nar.2 {
            v[at] = NAR;
        }
        (per_row, v)
    });
    (a, b, bias)
}

/// The f64 entry (`naive_gemm`) against the definition, every case, under every cap,
/// serial and parallel.
#[test]
fn f64_gemm_equals_definition_under_every_cap() {
    let ops = tables();
    let mut mm = Mismatches::default();
    let mut checked = 0;
    for (c, case) in cases().iter().enumerate() {
        let (a, b, bias) = case_patterns(case, 700 + c as u64);
        let want = reference(&ops, &a, &b, case.dims, &bias);
        let (m, k, n) = case.dims;
        on_every_kernel(|isa| {
            for parallel in [false, true] {
                let got = run_f64(&ops, &a, &b, case.dims, &bias, parallel);
                let what = format!("{isa} {m}x{k}x{n} par {parallel}");
                compare(&mut mm, &ops, &what, &got, &want, n);
                checked += got.len() as u64;
            }
        });
    }
    mm.assert_none_of("naive posit<8,0> f64 GEMM vs definition", checked);
}

/// An f32 near each pattern's value: the value itself, or a point off the grid that rounds
/// to it; NaR as NaN or ±Inf.
fn f32_for(ops: &OpTables, p: u8, r: u64) -> f32 {
    if p == NAR {
        return [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][(r % 3) as usize];
    }
    let v = ops.decode[p as usize] as f32;
    let nudged = v * (1.0 + 1e-3 * ((r >> 8) % 5) as f32 - 2e-3);
    let x = if r.is_multiple_of(4) || v == 0.0 {
        v
    } else {
        nudged
    };
    // Only where it still rounds to the pattern (checked, not assumed).
    if ops.encode(f64::from(x)) == p {
        x
    } else {
        v
    }
}

/// The f32 entry (`GemmRule::gemm_f32` of `naive` in posit<8,0>), operands off the grid in
/// every layout, NaN and ±Inf as NaR, against the definition under every cap.
#[test]
fn f32_gemm_equals_definition_in_every_layout_under_every_cap() {
    let ops = tables();
    let rule = GemmRule::new(&Accumulate::Naive, &p8()).unwrap().unwrap();
    let mut mm = Mismatches::default();
    let mut checked = 0;
    // Three threads, so that the cases with enough rows run in bands on any machine.
    let pool = layouts::pool(3);
    for (c, case) in cases().iter().enumerate() {
        let (a, b, bias) = case_patterns(case, 900 + c as u64);
        let want = reference(&ops, &a, &b, case.dims, &bias);
        let (m, k, n) = case.dims;
        let mut rng = SplitMix(31 + c as u64);
        let af: Vec<f32> = a
            .iter()
            .map(|&p| f32_for(&ops, p, rng.next_u64()))
            .collect();
        let bf: Vec<f32> = b
            .iter()
            .map(|&p| f32_for(&ops, p, rng.next_u64()))
            .collect();
        let layouts = Layouts::new(&af, &bf, case.dims);
        let bias_v: Option<Vec<f64>> = bias
            .as_ref()
            .map(|(_, v)| v.iter().map(|&p| ops.decode[p as usize]).collect());
        let bias_arg = match (&bias, &bias_v) {
            (Some((true, _)), Some(v)) => Bias::PerRow(v),
            (Some((false, _)), Some(v)) => Bias::PerCol(v),
            _ => Bias::None,
        };
        on_every_kernel(|isa| {
            for ((a_t, b_t), ao, bo) in layouts.each() {
                let got = pool
                    .install(|| rule.gemm_f32(ao, bo, case.dims, bias_arg, true))
                    .expect("naive posit<8,0> has an f32 path");
                let got: Vec<f64> = got.into_iter().map(f64::from).collect();
                let what = format!("{isa} {m}x{k}x{n} layout ({a_t}, {b_t})");
                compare(&mut mm, &ops, &what, &got, &want, n);
                checked += got.len() as u64;
            }
        });
    }
    mm.assert_none_of("naive posit<8,0> f32 GEMM vs definition", checked);
}
