//! lns<w,f> through the tensor ops: CPU quantize of f32, f64, f16 and bf16 tensors equals the
//! scalar rounding stored in the dtype (the kept-value rule read through the dtype), rounding
//! twice changes nothing, pack/unpack round-trip the patterns, and odd shapes and empty
//! tensors work.

use candle_core::{DType, Device, Tensor};
use qcandle::format::lns::Lns;
use qcandle::format::rounding::{NearestEven, Stochastic, TowardZero};
use qcandle::{pack, quantize, unpack, Format, Quant, Rounding};

fn inputs() -> Vec<f64> {
    let mut v: Vec<f64> = (0..997)
        .map(|i| ((i as f64 - 498.0) * 0.0137).powi(3))
        .collect();
    v.extend([
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-30,
        -3e30,
        1.0,
    ]);
    v
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn quantize_every_dtype_equals_the_scalar_rounding() -> anyhow::Result<()> {
    let lns = Lns::new(10, 4)?;
    let format = Format::Lns(lns);
    let x = Tensor::from_vec(inputs(), (1005,), &Device::Cpu)?;
    for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let xt = x.to_dtype(dtype)?;
        let stored = |v: f64| {
            Tensor::new(&[v], &Device::Cpu)
                .and_then(|t| t.to_dtype(dtype))
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .map(|v| v[0])
                .unwrap()
        };
        let inp = xt.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        for (rounding, name) in [
            (Rounding::NearestEven, "nearest"),
            (Rounding::TowardZero, "toward-zero"),
        ] {
            let y = quantize(&xt, &Quant::new(format).with_rounding(rounding))?;
            assert_eq!(y.dtype(), dtype);
            let got = y.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            for (i, (&a, &g)) in inp.iter().zip(&got).enumerate() {
                let want = match rounding {
                    Rounding::NearestEven => lns.round_stored(a, NearestEven, 0, stored),
                    _ => lns.round_stored(a, TowardZero, 0, stored),
                };
                assert!(
                    same(g, stored(want)),
                    "{dtype:?} {name} [{i}] {a}: {g} vs {want}"
                );
            }
            // Rounding the rounded tensor again changes nothing.
            let again = quantize(&y, &Quant::new(format).with_rounding(rounding))?;
            let again = again.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            for (&a, &b) in got.iter().zip(&again) {
                assert!(same(a, b), "{dtype:?} {name}: {a} rounds again to {b}");
            }
        }
        // Stochastic: every result is one of the two log-domain neighbours.
        let q = Quant::new(format)
            .with_rounding(Rounding::Stochastic { bits: 23 })
            .with_seed(3);
        let got = quantize(&xt, &q)?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        for (&a, &g) in inp.iter().zip(&got) {
            let down = lns.round_stored(a, Stochastic { bits: 23 }, u32::MAX, stored);
            let up = lns.round_stored(a, Stochastic { bits: 23 }, 0, stored);
            assert!(
                same(g, stored(down)) || same(g, stored(up)),
                "{dtype:?} {a}: {g}"
            );
        }
    }
    Ok(())
}

#[test]
fn f32_tensors_keep_lns_values_whose_f32_lies_below_the_exact_power() -> anyhow::Result<()> {
    // Every value of lns<12,7> as an f32, rounded toward zero and stochastically, is kept,
    // also where f32(value) < 2^(k/128) (where the log-domain floor alone goes down a code).
    let lns = Lns::new(12, 7)?;
    let values: Vec<f32> = (lns.k_min()..=lns.k_max())
        .map(|k| lns.value(k) as f32)
        .collect();
    let t = Tensor::from_vec(values.clone(), values.len(), &Device::Cpu)?;
    for rounding in [Rounding::TowardZero, Rounding::Stochastic { bits: 23 }] {
        let q = Quant::new(Format::Lns(lns))
            .with_rounding(rounding)
            .with_seed(9);
        assert_eq!(quantize(&t, &q)?.to_vec1::<f32>()?, values, "{rounding}");
    }
    Ok(())
}

#[test]
fn pack_and_unpack_round_trip_the_patterns() -> anyhow::Result<()> {
    for (spelling, dtype) in [
        ("lns<8,3>", DType::U8),
        ("lns<16,10>", DType::I16),
        ("lns<20,12>", DType::U32),
    ] {
        let format: Format = spelling.parse()?;
        let x = Tensor::from_vec(inputs(), (5, 201), &Device::Cpu)?;
        let p = pack(&x, &format)?;
        assert_eq!(p.dtype(), dtype, "{spelling}");
        assert_eq!(p.dims(), &[5, 201]);
        let back = qcandle::ops::pack::unpack_as(&p, &format, DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        let want = quantize(&x, &Quant::new(format))?
            .flatten_all()?
            .to_vec1::<f64>()?;
        for (a, b) in back.iter().zip(&want) {
            assert!(same(*a, *b), "{spelling}: unpack {a} vs quantize {b}");
        }
        let f32s = unpack(&p, &format)?;
        assert_eq!(f32s.dtype(), DType::F32);
    }
    // Empty and odd-shaped tensors.
    let format: Format = "lns<8,3>".parse()?;
    let empty = Tensor::zeros((0, 3), DType::F32, &Device::Cpu)?;
    assert_eq!(quantize(&empty, &Quant::new(format))?.dims(), &[0, 3]);
    assert_eq!(pack(&empty, &format)?.dims(), &[0, 3]);
    let odd = Tensor::ones((3, 1, 7), DType::F32, &Device::Cpu)?;
    assert_eq!(
        quantize(&odd, &Quant::new(format))?
            .flatten_all()?
            .to_vec1::<f32>()?,
        vec![1.0; 21]
    );
    Ok(())
}

#[cfg(feature = "cli")]
#[test]
fn the_quantized_model_file_stores_lns_patterns() -> anyhow::Result<()> {
    use qcandle::ptq::model_file::stored_dtype;
    assert_eq!(stored_dtype(&"lns<8,3>".parse()?)?, DType::U8);
    assert_eq!(stored_dtype(&"lns<16,10>".parse()?)?, DType::I16);
    assert_eq!(stored_dtype(&"lns<32,20>".parse()?)?, DType::U32);
    Ok(())
}
