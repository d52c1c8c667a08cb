//! Tensor-level tests of `quantize`, `quantize_`, `Quantizer` and `pack`/`unpack` on
//! `Device::Cpu`.
//!
//! Testing policy: the scalar `Format::round` (checked against independent references in
//! `tests/rounding_modes.rs`) is the oracle for every elementwise result, with the random
//! word of element i taken from `Stream::new(seed, call).at(i)`, i being the element's
//! logical row-major index in the view. Block floating point is checked against a per-slice
//! reference written here from the definition. Strided views are compared with their
//! contiguous copies and one thread with two. Wrong dtypes and arguments must be errors,
//! never panics. Every test can fail.

mod common;

use candle_core::{DType, Device, Module, Tensor, Var};
use common::SplitMix;
use half::{bf16, f16};
use qcandle::format::BlockScope;
use qcandle::philox::Stream;
use qcandle::{
    pack, quantize, quantize_, quantize_no_grad, unpack, Format, Quant, Quantizer, Rounding,
};

type Result<T> = anyhow::Result<T>;

const CPU: Device = Device::Cpu;
const NE: Rounding = Rounding::NearestEven;
const NA: Rounding = Rounding::NearestAway;
const TZ: Rounding = Rounding::TowardZero;
const SR: Rounding = Rounding::Stochastic { bits: 23 };
const MODES: [Rounding; 5] = [NE, NA, TZ, SR, Rounding::Stochastic { bits: 4 }];

fn fmt(s: &str) -> Format {
    s.parse()
        .unwrap_or_else(|e| panic!("format {s:?} must parse: {e}"))
}

/// Deterministic test values: [`SplitMix`] drawn magnitudes 2^-14..2^10, both signs, mixed
/// with exact ties and grid points of small formats and short dyadics 2^-40..2^40.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed);
    let mut next = || rng.next_u64();
    const SPECIAL: [f64; 8] = [
        1.0 + 1.0 / 64.0,
        1.0625,
        3.0 / 32.0,
        48.0,
        4.75,
        0.0,
        464.0,
        1.375,
    ];
    (0..n)
        .map(|i| {
            let r = next();
            let sign = if r & 1 == 1 { -1.0 } else { 1.0 };
            if i % 7 == 3 {
                return sign * SPECIAL[(r >> 8) as usize % SPECIAL.len()];
            }
            if i % 7 == 5 {
                // (1 + k/16) 2^e: ties and grid points of every grid with <= 3 fraction
                // bits in binade e, from far below to far above the small formats' ranges.
                let k = (r >> 8) % 16;
                let e = ((r >> 16) % 81) as i32 - 40;
                return sign * (1.0 + k as f64 / 16.0) * 2f64.powi(e);
            }
            let u = (r >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((r >> 1) % 25) as i32 - 14;
            sign * (1.0 + u) * 2f64.powi(e)
        })
        .collect()
}

/// Both NaN, or the same bits.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// A tensor's elements in logical row-major order, widened to f64.
fn flat(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .expect("tensor to vec")
}

/// The random word of element i of the `call`-th stochastic call under `seed`.
fn word(rounding: Rounding, seed: u64, call: u64, i: usize) -> u32 {
    if rounding.is_stochastic() {
        Stream::new(seed, call).at(i as u64)
    } else {
        0
    }
}

/// Scalar reference for an elementwise format, stored in `dtype`.
fn reference(
    f: &Format,
    xs: &[f64],
    rounding: Rounding,
    seed: u64,
    call: u64,
    dtype: DType,
) -> Vec<f64> {
    xs.iter()
        .enumerate()
        .map(|(i, &x)| store(f.round(x, rounding, word(rounding, seed, call, i)), dtype))
        .collect()
}

/// `v` rounded to `dtype` (round to nearest even) and widened back.
fn store(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F64 => v,
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        other => panic!("no float dtype {other:?}"),
    }
}

fn first_mismatch(got: &[f64], want: &[f64]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements, want {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| !same(**g, **w))
        .map(|(i, (g, w))| format!("element {i}: got {g:e}, want {w:e}"))
}

/// A (rows, cols) tensor of `values` in `dtype`.
fn matrix(rows: usize, cols: usize, seed: u64, dtype: DType) -> Tensor {
    Tensor::from_vec(values(rows * cols, seed), (rows, cols), &CPU)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// A (24, 108) "ladder" of `±(1 + k/16) 2^e` for every k in 0..16 and e in -40..=40: the
/// ties and grid points of every grid with at most 3 fraction bits in binade e, including
/// the binades where posits have no fraction bits left and the overflow and underflow
/// edges of the small formats.
fn ladder(dtype: DType) -> Tensor {
    let xs: Vec<f64> = (0..24 * 108i32)
        .map(|j| {
            let sign = if j % 2 == 1 { -1.0 } else { 1.0 };
            let k = (j / 2) % 16;
            let e = j / 32 - 40;
            sign * (1.0 + k as f64 / 16.0) * 2f64.powi(e)
        })
        .collect();
    Tensor::from_vec(xs, (24, 108), &CPU)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// The test inputs: mixed values and the ladder.
fn bases(seed: u64, dtype: DType) -> [(&'static str, Tensor); 2] {
    [
        ("mixed", matrix(24, 37, seed, dtype)),
        ("ladder", ladder(dtype)),
    ]
}

type View = (&'static str, fn(&Tensor) -> candle_core::Result<Tensor>);

/// Contiguous, transposed, narrowed (contiguous with an offset, and strided) and combined
/// views of a (24, n >= 37) matrix.
const VIEWS: [View; 6] = [
    ("contiguous", |t| Ok(t.clone())),
    ("transposed", |t| t.t()),
    ("rows 3..13 (offset)", |t| t.narrow(0, 3, 10)),
    ("cols 5..25 (strided)", |t| t.narrow(1, 5, 20)),
    ("transposed, narrowed both ways", |t| {
        t.t()?.narrow(0, 2, 30)?.narrow(1, 4, 11)
    }),
    ("3-d permuted", |t| {
        t.reshape((4, 6, ()))?.permute((2, 0, 1))?.narrow(1, 1, 2)
    }),
];

// ---------------------------------------------------------------------------------------
// 5. quantize == scalar round, on every kind of view.
// ---------------------------------------------------------------------------------------

const ELEMENTWISE: [&str; 10] = [
    "posit<8,0>",
    "posit<16,1>",
    "posit8",
    "posit32",
    "fp16",
    "bf16",
    "e4m3",
    "e5m2",
    "e2m1",
    "fixed<8,4>",
];

#[test]
fn quantize_equals_scalar_round_on_contiguous_and_strided_f32_and_f64_views() -> Result<()> {
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        for (base_name, base) in bases(1, dtype) {
            for name in ELEMENTWISE {
                let f = fmt(name);
                for mode in MODES {
                    for (view_name, view) in VIEWS {
                        let v = view(&base)?;
                        let q = Quant::new(f).with_rounding(mode).with_seed(99);
                        q.set_calls(5);
                        let y = quantize(&v, &q)?;
                        assert_eq!(y.dims(), v.dims(), "shape");
                        assert_eq!(y.dtype(), dtype, "dtype");
                        let want = reference(&f, &flat(&v), mode, 99, 5, dtype);
                        if let Some(m) = first_mismatch(&flat(&y), &want) {
                            failures.push(format!(
                                "{dtype:?} {base_name} {name} {mode} {view_name}: {m}"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn quantize_of_f16_and_bf16_is_the_scalar_result_rounded_to_that_dtype() -> Result<()> {
    let mut failures = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (base_name, base) in bases(2, dtype) {
            for name in [
                "posit<8,0>",
                "posit<16,1>",
                "fp16",
                "bf16",
                "e4m3",
                "e2m1",
                "fixed<8,4>",
                "tf32",
            ] {
                let f = fmt(name);
                for mode in MODES {
                    for (view_name, view) in [VIEWS[0], VIEWS[3], VIEWS[4]] {
                        let v = view(&base)?;
                        let q = Quant::new(f).with_rounding(mode).with_seed(7);
                        let y = quantize(&v, &q)?;
                        assert_eq!(y.dtype(), dtype);
                        let want = reference(&f, &flat(&v), mode, 7, 0, dtype);
                        if let Some(m) = first_mismatch(&flat(&y), &want) {
                            failures.push(format!(
                                "{dtype:?} {base_name} {name} {mode} {view_name}: {m}"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn stochastic_results_of_a_strided_view_equal_those_of_its_contiguous_copy() -> Result<()> {
    for (_, base) in bases(3, DType::F32) {
        for name in [
            "posit<8,0>",
            "e4m3",
            "fixed<8,4>",
            "block<8>",
            "block<8,dim=0>",
            "block<8,dim=-1>",
        ] {
            for mode in [SR, Rounding::Stochastic { bits: 3 }] {
                for (view_name, view) in &VIEWS[1..] {
                    let v = view(&base)?;
                    let q1 = Quant::new(fmt(name)).with_rounding(mode).with_seed(11);
                    let q2 = Quant::new(fmt(name)).with_rounding(mode).with_seed(11);
                    let strided = flat(&quantize(&v, &q1)?);
                    let copied = flat(&quantize(&v.contiguous()?, &q2)?);
                    assert!(
                        first_mismatch(&strided, &copied).is_none(),
                        "{name} {mode} {view_name}: {}",
                        first_mismatch(&strided, &copied).unwrap()
                    );
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Block floating point against a per-slice reference.
// ---------------------------------------------------------------------------------------

/// Rounds `t` (exact, a multiple count of the quantum) to an integer with `mode`.
fn round_integer(t: f64, mode: Rounding, r: u32) -> f64 {
    match mode {
        Rounding::NearestEven => t.round_ties_even(),
        Rounding::NearestAway => t.round(),
        Rounding::TowardZero => t.trunc(),
        Rounding::Stochastic { bits } => {
            let a = t.abs();
            let floor = a.floor();
            let threshold = ((a - floor) * 2f64.powi(bits as i32)).floor();
            let up = ((r >> (32 - bits)) as f64) < threshold;
            (floor + up as u32 as f64).copysign(t)
        }
    }
}

/// Block floating point from the definition: the elements of each block (the whole tensor,
/// or each slice along `dim`) share the binade E of their largest finite magnitude and are
/// rounded to `wl`-bit two's complement multiples of 2^(E - (wl - 2)); NaN and ±Inf pass
/// through; zeros come out as +0.
fn block_reference(
    xs: &[f64],
    dims: &[usize],
    wl: u32,
    dim: Option<usize>,
    mode: Rounding,
    seed: u64,
    call: u64,
) -> Vec<f64> {
    let slice_of = |i: usize| match dim {
        None => 0,
        Some(d) => (i / dims[d + 1..].iter().product::<usize>()) % dims[d],
    };
    let count = dim.map_or(1, |d| dims[d]);
    let mut max = vec![0f64; count];
    for (i, &x) in xs.iter().enumerate() {
        if x.is_finite() {
            max[slice_of(i)] = max[slice_of(i)].max(x.abs());
        }
    }
    let top = (1i64 << (wl - 1)) as f64;
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let m = max[slice_of(i)];
            if !x.is_finite() {
                return x;
            }
            if m == 0.0 {
                return 0.0;
            }
            let q = 2f64.powi(m.log2().floor() as i32 - (wl as i32 - 2));
            let k = round_integer(x / q, mode, word(mode, seed, call, i)).clamp(-top, top - 1.0);
            if k == 0.0 {
                0.0
            } else {
                k * q
            }
        })
        .collect()
}

/// Values whose slices along every axis have different binades, with a NaN, an Inf and
/// an all-zero slice.
fn block_input(dims: &[usize]) -> Vec<f64> {
    let n: usize = dims.iter().product();
    let mut xs: Vec<f64> = values(n, 5)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 2f64.powi((i % 7) as i32 * 3 - (i % 5) as i32 * 2))
        .collect();
    xs[1] = f64::NAN;
    xs[n / 2] = f64::NEG_INFINITY;
    let last = *dims.last().unwrap();
    for x in xs.iter_mut().skip(last).take(last) {
        *x = 0.0; // the second innermost row is all zeros
    }
    xs
}

#[test]
fn block_formats_round_each_slice_with_its_own_shared_exponent() -> Result<()> {
    let mut failures = Vec::new();
    for dims in [vec![3usize, 4, 5], vec![6, 7], vec![9]] {
        let rank = dims.len() as i64;
        let xs = block_input(&dims);
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::from_vec(xs.clone(), dims.as_slice(), &CPU)?.to_dtype(dtype)?;
            let xs = flat(&x);
            let mut scopes: Vec<(String, Option<usize>)> = vec![("block<8>".to_string(), None)];
            for d in -rank..rank {
                let resolved = if d < 0 { d + rank } else { d } as usize;
                scopes.push((format!("block<8,dim={d}>"), Some(resolved)));
            }
            for (name, dim) in scopes {
                let f = fmt(&name);
                for mode in MODES {
                    let q = Quant::new(f).with_rounding(mode).with_seed(3);
                    let got = flat(&quantize(&x, &q)?);
                    let want: Vec<f64> = block_reference(&xs, &dims, 8, dim, mode, 3, 0)
                        .into_iter()
                        .map(|v| store(v, dtype))
                        .collect();
                    if let Some(m) = first_mismatch(&got, &want) {
                        failures.push(format!("{dims:?} {dtype:?} {name} {mode}: {m}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn block_ties_and_range_ends_round_per_mode_and_clamp_to_the_twos_complement_range() -> Result<()> {
    // Block max in [1, 2): E = 0, block<8> quantum 2^-6, codes -128..=127. Ties at
    // (k + 1/2) 2^-6 for kept counts k = 1 (the count is the leading bit alone), 2, 3;
    // values below one quantum; 127.5 q (rounds to 128 q, clamped to 127 q) and -127.75 q
    // (rounds to -128 q, which exists).
    let q = 1.0 / 64.0;
    let row = [
        1.0,
        1.5 * q,
        2.5 * q,
        3.5 * q,
        -1.5 * q,
        -2.5 * q,
        0.5 * q,
        0.25 * q,
        -0.75 * q,
        127.5 * q,
        -127.75 * q,
        0.0,
    ];
    let mut xs = row.to_vec();
    xs.extend(row.iter().map(|v| v * 1024.0)); // second row: the same, 2^10 larger
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for (name, dims, dim) in [
            ("block<8>", vec![12usize], None),
            ("block<8,dim=0>", vec![12], Some(0)),
            ("block<8,dim=0>", vec![2, 12], Some(0)),
            ("block<8,dim=-1>", vec![12, 2], Some(1)),
        ] {
            let n: usize = dims.iter().product();
            let x = if dims == [12, 2] {
                Tensor::from_vec(xs.clone(), (2, 12), &CPU)?
                    .t()?
                    .contiguous()?
            } else {
                Tensor::from_vec(xs[..n].to_vec(), dims.as_slice(), &CPU)?
            }
            .to_dtype(dtype)?;
            let input = flat(&x);
            for mode in MODES {
                let got = flat(&quantize(
                    &x,
                    &Quant::new(fmt(name)).with_rounding(mode).with_seed(4),
                )?);
                let want: Vec<f64> = block_reference(&input, &dims, 8, dim, mode, 4, 0)
                    .into_iter()
                    .map(|v| store(v, dtype))
                    .collect();
                if let Some(m) = first_mismatch(&got, &want) {
                    failures.push(format!("{dtype:?} {name} {dims:?} {mode}: {m}"));
                }
            }
        }
    }
    // Spot checks of the reference itself (nearest-even, first row).
    let x = Tensor::new(&row, &CPU)?;
    let got = quantize(&x, &Quant::new(fmt("block<8>")))?.to_vec1::<f64>()?;
    assert_eq!(
        &got[1..4],
        &[2.0 * q, 2.0 * q, 4.0 * q],
        "ties to the even count"
    );
    assert_eq!(
        &got[9..11],
        &[127.0 * q, -128.0 * q],
        "two's complement range ends"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn block_format_parses_its_dim_and_rejects_an_out_of_range_dim() -> Result<()> {
    assert!(matches!(fmt("block<8,dim=-1>"), Format::Block(b) if b.scope() == BlockScope::Dim(-1)));
    let x = matrix(3, 4, 6, DType::F32);
    for name in ["block<8,dim=2>", "block<8,dim=-3>", "block<8,dim=100>"] {
        let q = Quant::new(fmt(name));
        let err = quantize(&x, &q).expect_err(&format!("{name} on a rank-2 tensor must fail"));
        assert!(
            err.to_string().contains("dim"),
            "{name}: error should name the dim: {err}"
        );
        assert!(quantize_(&x, &q).is_err(), "{name}: in place must fail too");
    }
    let scalar = Tensor::new(1.5f32, &CPU)?;
    assert!(
        quantize(&scalar, &Quant::new(fmt("block<8,dim=0>"))).is_err(),
        "rank 0 has no dim 0"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 6. Thread-count independence.
// ---------------------------------------------------------------------------------------

fn on_threads<T: Send>(k: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(k)
        .build()
        .expect("thread pool")
        .install(f)
}

#[test]
fn results_do_not_depend_on_the_thread_count() -> Result<()> {
    // 7 x 11709 = 81963 elements: more than 4 chunks of 16384, not a multiple of 4.
    let dims = [7usize, 11709];
    let xs = block_input(&dims);
    let x = Tensor::from_vec(
        xs.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        &dims[..],
        &CPU,
    )?;
    let xs = flat(&x);
    let cases: [(&str, Rounding); 8] = [
        ("posit<8,0>", SR),
        ("e4m3", Rounding::Stochastic { bits: 8 }),
        ("fixed<8,4>", SR),
        ("block<8>", NE),
        ("block<8>", SR),
        ("block<8,dim=0>", SR),
        ("block<8,dim=-1>", SR),
        ("block<6,dim=1>", TZ),
    ];
    for (name, mode) in cases {
        let f = fmt(name);
        let run = |k: usize, view: fn(&Tensor) -> candle_core::Result<Tensor>| {
            let q = Quant::new(f).with_rounding(mode).with_seed(2024);
            q.set_calls(3);
            on_threads(k, || quantize(&view(&x).unwrap(), &q).map(|y| flat(&y)))
        };
        let one = run(1, |t| Ok(t.clone()))?;
        let two = run(2, |t| Ok(t.clone()))?;
        assert!(
            first_mismatch(&two, &one).is_none(),
            "{name} {mode}: 2 threads vs 1: {}",
            first_mismatch(&two, &one).unwrap()
        );
        // Both also equal the reference (so neither is wrong in the same way).
        let want: Vec<f64> = match f {
            Format::Block(b) => {
                let dim = match b.scope() {
                    BlockScope::Tensor => None,
                    BlockScope::Dim(d) => Some(if d < 0 { d + 2 } else { d } as usize),
                };
                block_reference(&xs, &dims, b.wl(), dim, mode, 2024, 3)
                    .into_iter()
                    .map(|v| store(v, DType::F32))
                    .collect()
            }
            _ => reference(&f, &xs, mode, 2024, 3, DType::F32),
        };
        assert!(
            first_mismatch(&one, &want).is_none(),
            "{name} {mode} vs reference: {}",
            first_mismatch(&one, &want).unwrap()
        );
        // A transposed (strided) view of the large tensor, too.
        let t1 = run(1, |t| t.t())?;
        let t2 = run(2, |t| t.t())?;
        assert!(
            first_mismatch(&t2, &t1).is_none(),
            "{name} {mode} transposed: 2 threads vs 1"
        );
        // In place, on 1 and 2 threads.
        let in_place = |k: usize| -> Result<Vec<f64>> {
            let y = x.copy()?;
            let q = Quant::new(f).with_rounding(mode).with_seed(2024);
            q.set_calls(3);
            on_threads(k, || quantize_(&y, &q))?;
            Ok(flat(&y))
        };
        assert!(
            first_mismatch(&in_place(1)?, &one).is_none(),
            "{name} {mode}: in place, 1 thread"
        );
        assert!(
            first_mismatch(&in_place(2)?, &one).is_none(),
            "{name} {mode}: in place, 2 threads"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 7. Reproducibility of the stochastic stream.
// ---------------------------------------------------------------------------------------

fn sr_quant(seed: u64) -> Quant {
    Quant::new(fmt("posit<8,0>"))
        .with_rounding(SR)
        .with_seed(seed)
}

/// 1000 values at distance 0.5 between posit<8,0> neighbours 1 and 1 + 2^-5, so each
/// stochastic call is 1000 fair coin flips.
fn coin_flips() -> Tensor {
    Tensor::from_vec(vec![1.0f32 + 1.0 / 64.0; 1000], 1000, &CPU).unwrap()
}

#[test]
fn quants_with_the_same_seed_give_the_same_stochastic_sequence() -> Result<()> {
    let x = coin_flips();
    let (a, b) = (sr_quant(5), sr_quant(5));
    for call in 0..4u64 {
        let ya = flat(&quantize(&x, &a)?);
        let yb = flat(&quantize(&x, &b)?);
        assert_eq!(ya, yb, "call {call}");
        assert_eq!(
            ya,
            reference(&fmt("posit<8,0>"), &flat(&x), SR, 5, call, DType::F32),
            "call {call} vs Stream(5, {call})"
        );
    }
    let other = flat(&quantize(&x, &sr_quant(6))?);
    assert_ne!(
        other,
        flat(&quantize(&x, &sr_quant(5))?),
        "another seed must give other results"
    );
    Ok(())
}

#[test]
fn successive_stochastic_calls_draw_fresh_random_bits() -> Result<()> {
    let x = coin_flips();
    let q = sr_quant(5);
    assert_eq!(q.calls(), 0);
    let y0 = flat(&quantize(&x, &q)?);
    assert_eq!(q.calls(), 1);
    let y1 = flat(&quantize_no_grad(&x, &q)?);
    assert_eq!(q.calls(), 2);
    assert_ne!(y0, y1, "successive calls must differ");
    let ups = y0.iter().filter(|&&v| v > 1.0).count();
    assert!(
        (400..=600).contains(&ups),
        "{ups} of 1000 fair flips went up"
    );
    // Deterministic rounding takes no call index.
    let ne = Quant::new(fmt("posit<8,0>")).with_seed(5);
    quantize(&x, &ne)?;
    assert_eq!(ne.calls(), 0);
    Ok(())
}

#[test]
fn set_calls_resumes_a_stream_where_it_stopped() -> Result<()> {
    let x = coin_flips();
    let run = sr_quant(77);
    let results: Vec<Vec<f64>> = (0..4).map(|_| flat(&quantize(&x, &run).unwrap())).collect();
    let resumed = sr_quant(77);
    resumed.set_calls(2);
    assert_eq!(flat(&quantize(&x, &resumed)?), results[2]);
    assert_eq!(flat(&quantize(&x, &resumed)?), results[3]);
    assert_eq!(resumed.calls(), 4);
    Ok(())
}

#[test]
fn clones_share_the_call_counter_and_with_seed_starts_a_new_one() -> Result<()> {
    let x = coin_flips();
    let q = sr_quant(9);
    let clone = q.clone();
    let y0 = flat(&quantize(&x, &clone)?);
    assert_eq!(q.calls(), 1, "a clone's call advances the original");
    let y1 = flat(&quantize(&x, &q)?);
    assert_ne!(y0, y1);
    let fresh = q.clone().with_seed(9);
    assert_eq!(fresh.calls(), 0);
    assert_eq!(flat(&quantize(&x, &fresh)?), y0);
    assert_eq!(q.calls(), 2, "with_seed detaches the counter");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 8. Specials, dtypes, in place.
// ---------------------------------------------------------------------------------------

#[test]
fn specials_and_subnormals_follow_the_scalar_policy_for_every_preset() -> Result<()> {
    let f32_inputs: Vec<f64> = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::MAX,
        -f32::MAX,
    ]
    .iter()
    .map(|&v| v as f64)
    .collect();
    let mut f64_inputs = f32_inputs.clone();
    f64_inputs.extend([1e-310, -5e-324, f64::MAX]);
    // The elementwise presets: a block-scaled preset (MX, NVFP4) rounds this vector as
    // blocks, whose NaN makes every element NaN (tests/mx_oracle.rs checks them).
    let mut formats: Vec<(String, Format)> = Format::presets()
        .into_iter()
        .filter(|(_, _, f)| !matches!(f, Format::Mx(_) | Format::Nvfp4(_)))
        .map(|(name, _, f)| (name.to_string(), f))
        .collect();
    // The posits with es below the standard's 2.
    for spelling in ["posit<8,0>", "posit<16,1>"] {
        formats.push((spelling.to_string(), spelling.parse()?));
    }
    for (name, f) in formats {
        for (dtype, inputs) in [(DType::F32, &f32_inputs), (DType::F64, &f64_inputs)] {
            let x = Tensor::from_vec(inputs.clone(), inputs.len(), &CPU)?.to_dtype(dtype)?;
            for mode in [NE, TZ, SR] {
                let got = flat(&quantize(&x, &Quant::new(f).with_rounding(mode))?);
                let want = reference(&f, inputs, mode, 0, 0, dtype);
                if let Some(m) = first_mismatch(&got, &want) {
                    panic!("{name} {dtype:?} {mode}: {m}");
                }
                // The policy, spelled out.
                let (nan, inf, ninf, zero, nzero, sub) =
                    (got[0], got[1], got[2], got[3], got[4], got[5]);
                assert!(nan.is_nan(), "{name}: NaN stays NaN");
                assert_eq!(zero.to_bits(), 0, "{name}: +0");
                match f {
                    Format::Posit(p) => {
                        assert!(inf.is_nan() && ninf.is_nan(), "{name}: ±Inf is NaR");
                        assert_eq!(nzero.to_bits(), 0, "{name}: the posit zero is unsigned");
                        assert_eq!(
                            sub,
                            store(p.min_pos(), dtype),
                            "{name}: a subnormal input rounds to minpos, not 0"
                        );
                    }
                    Format::Float(fl) => {
                        assert_eq!(
                            nzero.to_bits(),
                            (-0.0f64).to_bits(),
                            "{name}: -0 keeps its sign"
                        );
                        match fl.specials() {
                            qcandle::format::Specials::Ieee => assert!(
                                inf == f64::INFINITY && ninf == f64::NEG_INFINITY,
                                "{name}: Inf stays Inf"
                            ),
                            qcandle::format::Specials::FiniteNan => {
                                assert!(inf.is_nan() && ninf.is_nan(), "{name}: Inf becomes NaN")
                            }
                            qcandle::format::Specials::Finite => assert!(
                                inf == store(fl.max_value(), dtype) && ninf == -inf,
                                "{name}: Inf saturates"
                            ),
                        }
                    }
                    _ => unreachable!("presets are posits and floats"),
                }
            }
        }
    }
    Ok(())
}

#[test]
fn integer_tensors_are_rejected_with_an_error_naming_the_dtype() -> Result<()> {
    let tensors = [
        (Tensor::new(&[1u8, 2, 3], &CPU)?, "u8"),
        (Tensor::new(&[1u32, 2, 3], &CPU)?, "u32"),
        (Tensor::new(&[1i64, -2, 3], &CPU)?, "i64"),
    ];
    let q = Quant::new(fmt("posit<8,0>"));
    let layers = [
        Quantizer::new(Some(q.clone()), None),
        Quantizer::new(None, Some(q.clone())),
        Quantizer::new(None, None),
    ];
    for (x, dtype) in &tensors {
        let mut errors = vec![
            ("quantize", quantize(x, &q).map(|_| ())),
            ("quantize_no_grad", quantize_no_grad(x, &q).map(|_| ())),
            ("quantize_", quantize_(x, &q)),
            ("pack", pack(x, q.format()).map(|_| ())),
        ];
        for (i, layer) in layers.iter().enumerate() {
            errors.push((
                ["Quantizer(fwd)", "Quantizer(bwd)", "Quantizer(none)"][i],
                layer.forward(x).map(|_| ()),
            ));
        }
        for (op, r) in errors {
            let err = r.expect_err(&format!("{op} must reject {dtype}"));
            assert!(
                err.to_string().to_lowercase().contains(dtype),
                "{op} on {dtype}: the error should name the dtype: {err}"
            );
        }
    }
    Ok(())
}

#[test]
fn in_place_quantize_equals_quantize_on_contiguous_and_strided_views() -> Result<()> {
    let (rows, cols) = (24usize, 37usize);
    // Storage positions of a contiguous (24, 37) matrix, viewed like the data.
    let positions = Tensor::arange(0u32, (rows * cols) as u32, &CPU)?.reshape((rows, cols))?;
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for name in ["posit<8,0>", "e4m3", "fixed<8,4>", "block<8,dim=0>"] {
            for mode in MODES {
                for (view_name, view) in VIEWS {
                    let base = matrix(rows, cols, 8, dtype);
                    let before = flat(&base);
                    let v = view(&base)?;
                    let q = Quant::new(fmt(name)).with_rounding(mode).with_seed(31);
                    let want = flat(&quantize(&v, &q)?);
                    q.set_calls(0);
                    quantize_(&v, &q)?;
                    let ctx = format!("{dtype:?} {name} {mode} {view_name}");
                    if let Some(m) = first_mismatch(&flat(&v), &want) {
                        panic!("{ctx}: {m}");
                    }
                    // Elements outside the view are untouched.
                    let inside = view(&positions)?.flatten_all()?.to_vec1::<u32>()?;
                    let after = flat(&base);
                    let mut expected = before.clone();
                    for (k, &p) in inside.iter().enumerate() {
                        expected[p as usize] = want[k];
                    }
                    if let Some(m) = first_mismatch(&after, &expected) {
                        panic!("{ctx}, whole storage: {m}");
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 9. Gradients.
// ---------------------------------------------------------------------------------------

/// Values off every small grid, and coefficients off the posit<8,0> grid.
const XS: [f32; 6] = [0.3, -1.7, 2.2, 300.0, -0.011, 17.3];
const CS: [f32; 6] = [0.3, -1.7, 2.2, 0.011, 100.0, -0.0013];

#[test]
fn quantize_passes_the_gradient_straight_through() -> Result<()> {
    let c = Tensor::new(&CS, &CPU)?;
    for (name, mode) in [
        ("e4m3", NE),
        ("posit<8,0>", SR),
        ("block<4>", TZ),
        ("fixed<8,4>", NA),
    ] {
        let x = Var::new(&XS, &CPU)?;
        let q = Quant::new(fmt(name)).with_rounding(mode);
        let y = quantize(x.as_tensor(), &q)?;
        assert_ne!(
            y.to_vec1::<f32>()?,
            XS,
            "{name}: the forward pass must round"
        );
        let grads = (y * &c)?.sum_all()?.backward()?;
        let g = grads.get(x.as_tensor()).expect("gradient of x");
        assert_eq!(
            g.to_vec1::<f32>()?,
            CS,
            "{name} {mode}: d/dx sum(q(x) c) = c"
        );
    }
    // Through a transposed view: the gradient comes back in x's layout.
    let x = Var::new(&[[0.3f32, -1.7, 2.2], [5.1, 0.01, -9.0]], &CPU)?;
    let c = Tensor::new(&[[1.5f32, -2.0], [0.25, 3.0], [-0.5, 7.0]], &CPU)?;
    let y = quantize(&x.as_tensor().t()?, &Quant::new(fmt("e5m2")))?;
    let g = (y * &c)?.sum_all()?.backward()?;
    assert_eq!(
        g.get(x.as_tensor()).unwrap().to_vec2::<f32>()?,
        c.t()?.to_vec2::<f32>()?
    );
    Ok(())
}

#[test]
fn quantize_no_grad_records_no_backward_step() -> Result<()> {
    let x = Var::new(&XS, &CPU)?;
    let y = quantize_no_grad(x.as_tensor(), &Quant::new(fmt("e4m3")))?;
    let grads = (y * Tensor::new(&CS, &CPU)?)?.sum_all()?.backward()?;
    assert!(grads.get(x.as_tensor()).is_none());
    Ok(())
}

#[test]
fn quantizer_rounds_the_incoming_gradient_with_its_backward_quant() -> Result<()> {
    let e4m3 = Quant::new(fmt("e4m3"));
    let p8 = fmt("posit<8,0>");
    let layer = Quantizer::new(Some(e4m3.clone()), Some(Quant::new(p8)));
    let x = Var::new(&XS, &CPU)?;
    let c = Tensor::new(&CS, &CPU)?;
    let y = layer.forward(x.as_tensor())?;
    assert_eq!(
        y.to_vec1::<f32>()?,
        quantize(x.as_tensor(), &e4m3)?.to_vec1::<f32>()?,
        "forward = quantize"
    );
    let grads = (y * &c)?.sum_all()?.backward()?;
    let g = grads.get(x.as_tensor()).unwrap().to_vec1::<f32>()?;
    let want: Vec<f32> = CS
        .iter()
        .map(|&v| p8.round(v as f64, NE, 0) as f32)
        .collect();
    assert_eq!(g, want, "gradient = posit<8,0>(incoming gradient)");
    assert_ne!(g, CS, "the coefficients are off the posit<8,0> grid");
    Ok(())
}

#[test]
fn quantizer_without_backward_quant_passes_the_gradient_unchanged() -> Result<()> {
    let e4m3 = Quant::new(fmt("e4m3"));
    for layer in [
        Quantizer::new(Some(e4m3.clone()), None),
        Quantizer::new(None, None),
    ] {
        let x = Var::new(&XS, &CPU)?;
        let c = Tensor::new(&CS, &CPU)?;
        let y = layer.forward(x.as_tensor())?;
        let want_y = match layer.forward_quant() {
            Some(q) => quantize(x.as_tensor(), q)?.to_vec1::<f32>()?,
            None => XS.to_vec(),
        };
        assert_eq!(y.to_vec1::<f32>()?, want_y);
        let grads = (y * &c)?.sum_all()?.backward()?;
        assert_eq!(grads.get(x.as_tensor()).unwrap().to_vec1::<f32>()?, CS);
    }
    // The identity layer on a strided view returns the view's values.
    let m = matrix(4, 6, 12, DType::F32);
    let v = m.t()?.narrow(0, 1, 3)?;
    assert_eq!(flat(&Quantizer::new(None, None).forward(&v)?), flat(&v));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 10. pack / unpack.
// ---------------------------------------------------------------------------------------

/// Inputs for packing: values from everywhere, ties, out of range, and specials.
fn pack_inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = values(400, 21).iter().map(|&v| v as f32).collect();
    xs.extend([
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1e30,
        -1e30,
        464.0,
        48.0,
        -48.0,
        1.0 + 1.0 / 64.0,
    ]);
    xs
}

#[test]
fn pack_gives_the_encode_patterns_of_posit8_0_and_e4m3() -> Result<()> {
    let mut xs = pack_inputs();
    xs.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
    let x = Tensor::from_vec(xs.clone(), (xs.len() / 7, 7), &CPU)?;
    for name in ["posit<8,0>", "e4m3"] {
        let f = fmt(name);
        let packed = pack(&x, &f)?;
        assert_eq!(packed.dtype(), DType::U8, "{name}");
        assert_eq!(packed.dims(), x.dims(), "{name}");
        let got = packed.flatten_all()?.to_vec1::<u8>()?;
        for (&v, &p) in xs.iter().zip(&got) {
            let want = match f {
                Format::Posit(posit) => posit.encode(v as f64),
                Format::Float(fl) => fl.encode(v as f64)?,
                _ => unreachable!(),
            };
            assert_eq!(p as u32, want, "{name}: pattern of {v:e}");
        }
    }
    Ok(())
}

#[test]
fn every_8_bit_pattern_survives_unpack_then_pack() -> Result<()> {
    let all = Tensor::arange(0u32, 256, &CPU)?.to_dtype(DType::U8)?;
    for name in ["posit<8,0>", "posit<8,2>", "e4m3", "e5m2"] {
        let f = fmt(name);
        let values = unpack(&all, &f)?;
        assert_eq!(values.dtype(), DType::F32);
        let back = pack(&values, &f)?.to_vec1::<u8>()?;
        let vals = values.to_vec1::<f32>()?;
        for p in 0..256usize {
            if vals[p].is_nan() && name.starts_with('e') {
                continue; // float NaNs have several patterns; pack picks one
            }
            assert_eq!(
                back[p] as usize, p,
                "{name}: pattern {p:#04x} = {} came back as {:#04x}",
                vals[p], back[p]
            );
        }
    }
    Ok(())
}

#[test]
fn posit16_1_packs_to_i16_holding_the_u16_encode_bits() -> Result<()> {
    let xs = pack_inputs();
    let f = fmt("posit<16,1>");
    let Format::Posit(p) = f else { unreachable!() };
    let packed = pack(&Tensor::from_vec(xs.clone(), xs.len(), &CPU)?, &f)?;
    assert_eq!(packed.dtype(), DType::I16);
    let got = packed.to_vec1::<i16>()?;
    assert!(
        got.iter().any(|&v| v < 0),
        "negative values have patterns >= 0x8000"
    );
    for (&v, &g) in xs.iter().zip(&got) {
        assert_eq!(g as u16 as u32, p.encode(v as f64), "pattern of {v:e}");
    }
    Ok(())
}

#[test]
fn unpack_of_pack_equals_nearest_even_quantize() -> Result<()> {
    let mut xs = pack_inputs();
    xs.extend([f32::INFINITY, f32::NEG_INFINITY]);
    let x = Tensor::from_vec(xs.clone(), xs.len(), &CPU)?;
    let strided = matrix(12, 10, 22, DType::F32).t()?;
    for name in [
        "posit<8,0>",
        "posit<8,2>",
        "posit<16,1>",
        "posit<16,2>",
        "posit32",
        "e4m3",
        "e5m2",
        "fp16",
        "bf16",
        "tf32",
        "e2m1",
        "e3m2",
    ] {
        let f = fmt(name);
        for input in [&x, &strided] {
            let round_trip = flat(&unpack(&pack(input, &f)?, &f)?);
            let quantized = flat(&quantize(input, &Quant::new(f))?);
            if let Some(m) = first_mismatch(&round_trip, &quantized) {
                panic!("{name}: unpack(pack(x)) vs quantize(x): {m}");
            }
        }
    }
    Ok(())
}

#[test]
fn pack_refuses_fixed_and_block_formats() -> Result<()> {
    let x = Tensor::new(&[1.0f32, 2.5], &CPU)?;
    for name in ["fixed<8,4>", "block<8>", "block<8,dim=0>"] {
        assert!(pack(&x, &fmt(name)).is_err(), "pack {name}");
        let p = Tensor::new(&[1u8, 2], &CPU)?;
        assert!(unpack(&p, &fmt(name)).is_err(), "unpack {name}");
    }
    Ok(())
}

#[test]
fn unpack_refuses_patterns_wider_than_the_format() -> Result<()> {
    let cases = [
        ("e2m1", Tensor::new(&[0x3u8, 0x10], &CPU)?),
        ("e3m2", Tensor::new(&[0x40u8], &CPU)?),
        ("posit<8,0>", Tensor::new(&[0x7fi16, 0x100], &CPU)?),
        ("fp16", Tensor::new(&[0x3c00u32, 0x1_0000], &CPU)?),
        ("posit<16,1>", Tensor::new(&[0x1_0000u32], &CPU)?),
    ];
    for (name, patterns) in cases {
        assert!(unpack(&patterns, &fmt(name)).is_err(), "{name}: {patterns}");
    }
    // Patterns that fit are accepted, whatever the container.
    assert_eq!(
        unpack(&Tensor::new(&[0x3c00u32], &CPU)?, &fmt("fp16"))?.to_vec1::<f32>()?,
        [1.0]
    );
    assert_eq!(
        unpack(&Tensor::new(&[0x40u8], &CPU)?, &fmt("posit<8,0>"))?.to_vec1::<f32>()?,
        [1.0]
    );
    Ok(())
}

#[test]
fn pack_of_nan_fails_for_a_format_without_nan() -> Result<()> {
    let f = fmt("e2m1");
    let x = Tensor::new(&[1.0f32, f32::NAN], &CPU)?;
    let err = pack(&x, &f).expect_err("e2m1 has no NaN pattern");
    assert!(err.to_string().contains("NaN"), "{err}");
    // Inf saturates to max = 6 = 0_11_1, so it packs.
    let inf = Tensor::new(&[f32::INFINITY, f32::NEG_INFINITY], &CPU)?;
    assert_eq!(pack(&inf, &f)?.to_vec1::<u8>()?, [0x7, 0xf]);
    Ok(())
}
