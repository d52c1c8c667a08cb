//! The CUDA ops against the CPU path, bit for bit: every op runs on the CPU and on
//! `Device::new_cuda(0)` with the same inputs (and the same seed and call index for stochastic
//! rounding) and must give identical bits, and the stochastic call counters must advance alike.
//!
//! Without a GPU (no device, the link stubs of `cuda-toolchain.sh`, or a build without the
//! `cuda` feature, where `Device::new_cuda` always fails) every test prints
//! "skipped: no CUDA device" and passes.

use anyhow::Context;
use candle_core::{DType, Device, IndexOp, Tensor};
use qcandle::{pack, quantize, quantize_, unpack, Format, Quant, Quantizer};

/// The CUDA device, or None (with the skip message) where there is none.
fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// `#[test] fn $name()` that runs `$body(&gpu)` when there is a CUDA device.
macro_rules! test_device {
    ($name:ident, $body:expr) => {
        #[test]
        fn $name() -> anyhow::Result<()> {
            let Some(gpu) = gpu() else {
                return Ok(());
            };
            let body: fn(&Device) -> anyhow::Result<()> = $body;
            body(&gpu)
        }
    };
}

const FORMATS: &[&str] = &[
    "posit<8,0>",
    "posit<8,2>",
    "posit<16,1>",
    "posit<16,2>",
    "posit32",
    "posit<6,5>",
    "fp16",
    "bf16",
    "tf32",
    "e5m2",
    "e4m3",
    "e3m2",
    "e2m3",
    "e2m1",
    "float<4,3,nosub>",
    "float<5,2,sat>",
    "float<8,23>",
    "fixed<8,4>",
    "fixed<16,8,noclamp>",
    "fixed<8,4,sym>",
    "fixed<32,-3>",
    "block<8>",
    "block<4>",
    "lns<8,3>",
    "lns<16,10>",
    "lns<32,23>",
    "lns<32,30>",
    "block<8,dim=0>",
    "block<6,dim=1>",
    "block<8,dim=-1>",
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxfp6_e3m2",
    "mxfp6_e2m3",
    "mxfp4_e2m1",
    "mxint8",
    "mxfp8_e4m3<dim=0>",
    "mxint8<dim=1>",
    "nvfp4",
    "nvfp4<dim=0>",
];

const ROUNDINGS: &[&str] = &[
    "nearest-even",
    "nearest-away",
    "toward-zero",
    "stochastic",
    "stochastic:4",
];

/// Deterministic test values: every exponent from subnormals to near f32::MAX, ties and
/// near-ties of small formats, zeros, infinities and NaNs with payloads.
fn values(n: usize) -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC1_2345),
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::MAX,
        f32::MIN,
        1.0,
        1.5,
        -2.5,
        448.0,
        464.0,
        65504.0,
        65520.0,
        0.09375,
        1.0625,
    ];
    (0..n)
        .map(|i| {
            if i < specials.len() {
                return specials[i];
            }
            let r = next();
            match r % 4 {
                // Any bit pattern (NaNs and infinities included).
                0 => f32::from_bits(r as u32 >> 1 | ((r >> 40) as u32) << 31),
                // Moderate magnitudes, where most formats have their range.
                1 | 2 => {
                    let e = ((r >> 8) % 40) as i32 - 20;
                    let m = 1.0 + (r >> 32) as f32 / 4294967296.0;
                    let s = if r & 16 != 0 { -1.0 } else { 1.0 };
                    s * m * 2f32.powi(e)
                }
                // Short mantissas: ties of the small formats.
                _ => {
                    let e = ((r >> 8) % 16) as i32 - 8;
                    let m = ((r >> 32) % 64) as f32 / 32.0 + 1.0;
                    m * 2f32.powi(e)
                }
            }
        })
        .collect()
}

fn bits32(t: &Tensor) -> anyhow::Result<Vec<u32>> {
    let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    Ok(v.iter().map(|x| x.to_bits()).collect())
}

fn bits_of(t: &Tensor) -> anyhow::Result<Vec<u64>> {
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F32 => flat
            .to_vec1::<f32>()?
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::F64 => flat.to_vec1::<f64>()?.iter().map(|x| x.to_bits()).collect(),
        DType::F16 => flat
            .to_vec1::<half::f16>()?
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::BF16 => flat
            .to_vec1::<half::bf16>()?
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::U8 => flat.to_vec1::<u8>()?.iter().map(|&x| x as u64).collect(),
        DType::I16 => flat
            .to_vec1::<i16>()?
            .iter()
            .map(|&x| x as u16 as u64)
            .collect(),
        DType::U32 => flat.to_vec1::<u32>()?.iter().map(|&x| x as u64).collect(),
        other => anyhow::bail!("no bits for {other:?}"),
    })
}

/// Asserts equal bits, naming the first difference.
fn assert_same(cpu: &Tensor, gpu: &Tensor, what: &str) -> anyhow::Result<()> {
    assert_eq!(cpu.dims(), gpu.dims(), "{what}: shapes");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtypes");
    let (a, b) = (bits_of(cpu)?, bits_of(gpu)?);
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        let x = bits32(cpu)?;
        panic!(
            "{what}: element {i} of {}: cpu {:#x}, gpu {:#x} (cpu value {})",
            a.len(),
            a[i],
            b[i],
            f32::from_bits(x[i])
        );
    }
    Ok(())
}

/// A view of a tensor (to test strided and offset inputs).
type View = fn(&Tensor) -> candle_core::Result<Tensor>;

/// The same quantization (format, rounding, seed 7) for each device.
fn quants(format: &str, rounding: &str) -> anyhow::Result<(Quant, Quant)> {
    let q = Quant::parse(format, rounding)?.with_seed(7);
    Ok((q.clone().with_seed(7), q))
}

/// A 3-D input (so per-dim blocks have several slices) of `dtype`.
fn input(dtype: DType) -> anyhow::Result<Tensor> {
    let (a, b, c) = (5, 67, 211); // 70,685 elements: not a multiple of 4
    Ok(Tensor::from_vec(values(a * b * c), (a, b, c), &Device::Cpu)?.to_dtype(dtype)?)
}

fn check_quantize(gpu: &Device, dtype: DType, views: bool) -> anyhow::Result<()> {
    let x = input(dtype)?;
    let xg = x.to_device(gpu)?;
    for format in FORMATS {
        for rounding in ROUNDINGS {
            let (qc, qg) = quants(format, rounding)?;
            let what = format!("{dtype:?} {format} {rounding}");
            // Two calls each: the second stochastic call uses the next call index.
            for call in 0..2 {
                let c = quantize(&x, &qc)?;
                let g = quantize(&xg, &qg)?;
                assert_same(
                    &c,
                    &g.to_device(&Device::Cpu)?,
                    &format!("{what} call {call}"),
                )?;
            }
            if views {
                // Unaligned start (scalar path), transposed (gather), sliced.
                let cases: [(&str, View); 3] = [
                    // 70,000 elements from the second one, as 5 x 56 x 250 (per-dim
                    // blocks need the rank).
                    ("offset", |t| {
                        t.flatten_all()?.narrow(0, 1, 70_000)?.reshape((5, 56, 250))
                    }),
                    ("transposed", |t| t.transpose(1, 2)),
                    ("sliced", |t| t.i((.., 3..60, 1..200))),
                ];
                for (name, view) in cases {
                    let c = quantize(&view(&x)?, &qc)?;
                    let g = quantize(&view(&xg)?, &qg)?;
                    assert_same(&c, &g.to_device(&Device::Cpu)?, &format!("{what} {name}"))?;
                }
            }
            assert_eq!(qc.calls(), qg.calls(), "{what}: call counters");
        }
    }
    Ok(())
}

test_device!(quantize_f32_matches_cpu, |gpu| check_quantize(
    gpu,
    DType::F32,
    true
));

test_device!(quantize_f64_matches_cpu, |gpu| check_quantize(
    gpu,
    DType::F64,
    true
));

test_device!(quantize_f16_bf16_match_cpu, |gpu| {
    check_quantize(gpu, DType::F16, false)?;
    check_quantize(gpu, DType::BF16, false)
});

test_device!(quantize_in_place_matches_cpu, |gpu| {
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for format in [
            "posit<16,1>",
            "e4m3",
            "fixed<8,4>",
            "block<8,dim=1>",
            "mxfp8_e4m3",
            "nvfp4<dim=0>",
        ] {
            for rounding in ["nearest-even", "stochastic"] {
                let (qc, qg) = quants(format, rounding)?;
                let what = format!("in place {dtype:?} {format} {rounding}");
                let c = input(dtype)?;
                let g = c.to_device(gpu)?;
                quantize_(&c, &qc)?;
                quantize_(&g, &qg)?;
                assert_same(&c, &g.to_device(&Device::Cpu)?, &what)?;
                // A strided view: only its elements change.
                let c = input(dtype)?;
                let g = c.to_device(gpu)?;
                quantize_(&c.i((.., 2..40, ..))?, &qc)?;
                quantize_(&g.i((.., 2..40, ..))?, &qg)?;
                assert_same(&c, &g.to_device(&Device::Cpu)?, &format!("{what} view"))?;
                assert_eq!(qc.calls(), qg.calls(), "{what}: call counters");
            }
        }
    }
    Ok(())
});

test_device!(quantizer_matches_cpu, |gpu| {
    use candle_nn::Module;
    let x = input(DType::F32)?.transpose(0, 2)?;
    let xg = x.to_device(gpu)?;
    let copy = Quantizer::new(None, None);
    assert_same(
        &copy.forward(&x)?,
        &copy.forward(&xg)?.to_device(&Device::Cpu)?,
        "quantizer without formats",
    )?;
    let (qc, qg) = quants("e5m2", "stochastic:8")?;
    let (c, g) = (
        Quantizer::new(Some(qc), None),
        Quantizer::new(Some(qg), None),
    );
    assert_same(
        &c.forward(&x)?,
        &g.forward(&xg)?.to_device(&Device::Cpu)?,
        "quantizer e5m2",
    )?;
    Ok(())
});

test_device!(pack_unpack_match_cpu, |gpu| {
    let formats = [
        "posit<8,0>",
        "posit<8,2>",
        "posit<16,1>",
        "posit32",
        "posit<6,1>",
        "fp16",
        "bf16",
        "tf32",
        "e5m2",
        "e4m3",
        "e3m2",
        "e2m1",
        "float<8,23>",
        "lns<8,3>",
        "lns<16,10>",
        "lns<32,23>",
    ];
    for dtype in [DType::F32, DType::F64, DType::F16] {
        // Without NaN: `fin` formats refuse it.
        let x = input(dtype)?;
        let x = x.eq(&x)?.where_cond(&x, &x.zeros_like()?)?;
        let xg = x.to_device(gpu)?;
        for format in formats {
            let f: Format = format.parse()?;
            let what = format!("{dtype:?} {format}");
            let pc = pack(&x, &f)?;
            let pg = pack(&xg, &f).with_context(|| format!("pack {what}"))?;
            assert_same(&pc, &pg.to_device(&Device::Cpu)?, &format!("pack {what}"))?;
            let pt = pack(&x.transpose(0, 1)?, &f)?;
            let ptg = pack(&xg.transpose(0, 1)?, &f)?;
            assert_same(
                &pt,
                &ptg.to_device(&Device::Cpu)?,
                &format!("pack^T {what}"),
            )?;
            for out in [DType::F32, DType::F64, DType::BF16] {
                let uc = qcandle::ops::pack::unpack_as(&pc, &f, out)?;
                let ug = qcandle::ops::pack::unpack_as(&pg, &f, out)
                    .with_context(|| format!("unpack {what} {out:?}"))?;
                assert_same(
                    &uc,
                    &ug.to_device(&Device::Cpu)?,
                    &format!("unpack {what} {out:?}"),
                )?;
            }
            // A strided view (for i16 patterns, a copy candle cannot make on the device).
            let uc = unpack(&pc.i((.., 1..5, ..))?, &f)?;
            let ug = unpack(&pg.i((.., 1..5, ..))?, &f)
                .with_context(|| format!("unpack view {what}"))?;
            assert_same(
                &uc,
                &ug.to_device(&Device::Cpu)?,
                &format!("unpack view {what}"),
            )?;
        }
    }
    // The errors: NaN has no pattern in a `fin` format; a pattern wider than the format.
    let nan = Tensor::new(&[1.0f32, f32::NAN], &Device::Cpu)?;
    let e2m1: Format = "e2m1".parse()?;
    let c = pack(&nan, &e2m1).unwrap_err().to_string();
    let g = pack(&nan.to_device(gpu)?, &e2m1).unwrap_err().to_string();
    assert_eq!(c.lines().next(), g.lines().next());
    let wide = Tensor::new(&[1u8, 0x3F, 0x10], &Device::Cpu)?;
    let c = unpack(&wide, &e2m1).unwrap_err().to_string();
    let g = unpack(&wide.to_device(gpu)?, &e2m1)
        .unwrap_err()
        .to_string();
    assert_eq!(c.lines().next(), g.lines().next());
    Ok(())
});

test_device!(stochastic_stream_is_the_cpu_one, |gpu| {
    // Values halfway between bf16 neighbours, for several calls of one Quant whose call
    // index crosses 2^32 (the high word of the Philox counter).
    let x = Tensor::from_vec(
        (0..4099)
            .map(|i| f32::from_bits(0x3F80_8000 + (i as u32 % 128) * 0x1_0000))
            .collect::<Vec<_>>(),
        4099,
        &Device::Cpu,
    )?;
    let xg = x.to_device(gpu)?;
    let (qc, qg) = quants("bf16", "stochastic")?;
    qc.set_calls(u32::MAX as u64 - 2);
    qg.set_calls(u32::MAX as u64 - 2);
    for call in 0..6 {
        let c = quantize(&x, &qc)?;
        let g = quantize(&xg, &qg)?;
        assert_same(&c, &g.to_device(&Device::Cpu)?, &format!("call {call}"))?;
    }
    assert_eq!(qc.calls(), qg.calls());
    Ok(())
});

/// A `rows x cols` f32 matrix of [`values`] starting at element `skip`.
fn matrix(rows: usize, cols: usize, skip: usize) -> anyhow::Result<Tensor> {
    let v = values(skip + rows * cols)[skip..].to_vec();
    Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)
}

/// The posit formats of the CUDA GEMMs (and posit<16,1>, which stays on the host).
const GEMM_FORMATS: &[&str] = &[
    "posit<8,0>",
    "posit<8,1>",
    "posit<8,2>",
    "posit<6,1>",
    "posit<16,1>",
];

test_device!(quire_and_naive_matmul_match_cpu, |gpu| {
    use qcandle::quire::{matmul, Accumulation};
    for format in GEMM_FORMATS {
        let f: Format = format.parse()?;
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            // (m, k, n): ragged tiles, k = 1, long k, one element. The first operand starts
            // with NaN, ±Inf and extremes in its first row; the second skips them.
            for (m, k, n) in [
                (67, 45, 70),
                (5, 1, 130),
                (3, 4000, 5),
                (1, 1, 1),
                (130, 64, 64),
            ] {
                let a = matrix(m, k, 0)?;
                let b = matrix(k, n, 40)?;
                let what = format!("{format} {acc:?} {m}x{k}x{n}");
                let c = matmul(&a, &b, &f, acc)?;
                let g = matmul(&a.to_device(gpu)?, &b.to_device(gpu)?, &f, acc)?;
                assert!(g.device().is_cuda(), "{what}: result device");
                assert_same(&c, &g.to_device(&Device::Cpu)?, &what)?;
                // Transposed views (made contiguous on the device).
                let (at, bt) = (matrix(k, m, 7)?.t()?, matrix(n, k, 11)?.t()?);
                let c = matmul(&at, &bt, &f, acc)?;
                let g = matmul(&at.to_device(gpu)?, &bt.to_device(gpu)?, &f, acc)?;
                assert_same(&c, &g.to_device(&Device::Cpu)?, &format!("{what} views"))?;
            }
            // Batched, with a batched and a shared second operand.
            let a = matrix(6 * 33, 17, 3)?.reshape((2, 3, 33, 17))?;
            let b = matrix(6 * 17, 65, 5)?.reshape((2, 3, 17, 65))?;
            let shared = matrix(17, 65, 9)?;
            for b in [b, shared] {
                let what = format!("{format} {acc:?} batched b {:?}", b.dims());
                let c = matmul(&a, &b, &f, acc)?;
                let g = matmul(&a.to_device(gpu)?, &b.to_device(gpu)?, &f, acc)?;
                assert_same(&c, &g.to_device(&Device::Cpu)?, &what)?;
            }
        }
    }
    Ok(())
});

test_device!(posit_linear_matches_cpu, |gpu| {
    use qcandle::quire::{linear, Accumulation};
    for format in GEMM_FORMATS {
        let f: Format = format.parse()?;
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            let x = matrix(33, 70, 0)?;
            let w = matrix(66, 70, 30)?;
            let bias = matrix(1, 66, 2)?.flatten_all()?; // holds NaN and ±Inf
            for bias in [None, Some(&bias)] {
                let what = format!("{format} {acc:?} linear bias {}", bias.is_some());
                let c = linear(&x, &w, bias, &f, acc)?;
                let bg = bias.map(|b| b.to_device(gpu)).transpose()?;
                let g = linear(&x.to_device(gpu)?, &w.to_device(gpu)?, bg.as_ref(), &f, acc)?;
                assert_same(&c, &g.to_device(&Device::Cpu)?, &what)?;
            }
        }
    }
    Ok(())
});

test_device!(posit_gemm_f64_inputs_stay_on_the_host_path, |gpu| {
    use qcandle::quire::quire_matmul;
    let f: Format = "posit<8,0>".parse()?;
    let a = matrix(9, 13, 0)?.to_dtype(DType::F64)?;
    let b = matrix(13, 7, 3)?.to_dtype(DType::F64)?;
    let c = quire_matmul(&a, &b, &f)?;
    let g = quire_matmul(&a.to_device(gpu)?, &b.to_device(gpu)?, &f)?;
    assert!(g.device().is_cuda());
    assert_same(&c, &g.to_device(&Device::Cpu)?, "f64 posit<8,0>")
});

/// The GEMM kernels' parameter widths in the PTX are the ones `src/quire/gemm_cuda.rs`
/// pushes (device pointers and u64: 64 bits, u32 and i32: 32 bits), so a launcher that
/// drifts from a kernel signature fails here, GPU or not.
#[cfg(feature = "cuda")]
#[test]
fn gemm_kernel_parameters_match_the_launcher() {
    let ptx = qcandle::backend::cuda::ptx::GEMM;
    let widths = |name: &str| -> Vec<u32> {
        let start = ptx
            .find(&format!(".entry {name}("))
            .unwrap_or_else(|| panic!("{name} is not in gemm.ptx"));
        let body = &ptx[start..];
        body[..body.find(')').unwrap()]
            .lines()
            .filter_map(|l| l.trim().strip_prefix(".param ."))
            .map(|l| l[1..].split(|c: char| !c.is_ascii_digit()).next().unwrap())
            .map(|w| w.parse().unwrap())
            .collect()
    };
    // x, out, count, n, es, flags, group, inner
    assert_eq!(widths("qc_gemm_encode"), [64, 64, 64, 32, 32, 64, 64, 64]);
    // a, b, bias, row_nar|mul, col_nar|add, out, m, k, n, a_batch, b_batch, n, es
    let gemm = [64, 64, 64, 64, 64, 64, 32, 32, 32, 64, 64, 32, 32];
    for name in [
        "qc_quire_gemm_i64",
        "qc_quire_gemm_i64x128",
        "qc_quire_gemm_i128",
        "qc_naive_gemm",
    ] {
        assert_eq!(widths(name), gemm, "{name}");
    }
}
