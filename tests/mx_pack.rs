//! The packed form of MX and NVFP4 (`ops::pack_blocks`): unpacking gives the values of
//! `quantize` with nearest-even bit for bit (f64), codes are laid out LSB first as the docs
//! say (checked on hand-built blocks whose codes are known from the specification's tables),
//! and malformed parts are errors.

mod common;
use common::SplitMix;

use candle_core::{DType, Device, Tensor};
use qcandle::format::mx::MxElement;
use qcandle::ops::{pack_blocks, unpack_blocks};
use qcandle::{quantize, Format, Quant};

fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits())
}

/// Every MX format and NVFP4, several axes and odd shapes, NaN/Inf blocks, zeros and
/// magnitudes across the scale range: unpack(pack(x)) == quantize(x) in f64.
#[test]
fn unpacking_gives_the_quantized_values() {
    let mut rng = SplitMix(21);
    let names = MxElement::ALL
        .map(MxElement::name)
        .into_iter()
        .chain(["nvfp4"]);
    for name in names {
        for (dims, dim) in [
            (vec![3usize, 70], -1i64),
            (vec![37, 3, 2], 0),
            (vec![5], -1),
            (vec![2, 33], 1),
        ] {
            let n: usize = dims.iter().product();
            let mut xs: Vec<f64> = (0..n).map(|_| rng.float_between(-30, 30)).collect();
            xs[n / 2] = 0.0;
            if n > 40 {
                xs[3] = f64::NAN;
                xs[n - 2] = f64::NEG_INFINITY;
                xs[n - 5] = -0.0;
            }
            let spelling = if dim == -1 {
                name.to_string()
            } else {
                format!("{name}<dim={dim}>")
            };
            let format: Format = spelling.parse().unwrap();
            let x = Tensor::from_vec(xs, dims.as_slice(), &Device::Cpu).unwrap();
            let packed = pack_blocks(&x, &format).unwrap();
            let back = unpack_blocks(&packed).unwrap();
            assert_eq!(back.dims(), dims.as_slice());
            let want = quantize(&x, &Quant::new(format)).unwrap();
            assert!(same(&values(&back), &values(&want)), "{spelling} {dims:?}");
        }
    }
}

/// Codes are packed LSB first: mxfp4_e2m1 block [6, 0.5, -1, 0, ...] (scale 2^0, E8M0 127)
/// has codes 0b0111, 0b0001, 0b1010, 0: bytes 0x17, 0x0A; mxfp6_e3m2 [28, 1, ...] has
/// codes 0b011111 and 0b001100: the first byte holds the first code and the low two bits
/// of the second; mxint8 [1.5, -1/64] is 96 and 0xFF; nvfp4's block scale is E4M3.
#[test]
fn codes_are_laid_out_lsb_first() {
    let mut x = vec![0f32; 32];
    x[..3].copy_from_slice(&[6.0, 0.5, -1.0]);
    let t = Tensor::from_slice(&x, 32, &Device::Cpu).unwrap();
    let p = pack_blocks(&t, &"mxfp4_e2m1".parse().unwrap()).unwrap();
    assert_eq!((p.codes.len(), p.scales.as_slice()), (16, &[127u8][..]));
    assert_eq!(&p.codes[..2], &[0x17, 0x0A]);
    x[..3].copy_from_slice(&[28.0, 1.0, 0.0]);
    let t = Tensor::from_slice(&x, 32, &Device::Cpu).unwrap();
    let p = pack_blocks(&t, &"mxfp6_e3m2".parse().unwrap()).unwrap();
    assert_eq!((p.codes.len(), p.scales.as_slice()), (24, &[127u8][..]));
    // 0b011111 | 0b001100 << 6 = 0b0011_0001_1111.
    assert_eq!(&p.codes[..2], &[0x1F, 0x03]);
    x[..3].copy_from_slice(&[1.5, -1.0 / 64.0, 0.0]);
    let t = Tensor::from_slice(&x, 32, &Device::Cpu).unwrap();
    let p = pack_blocks(&t, &"mxint8".parse().unwrap()).unwrap();
    assert_eq!((&p.codes[..2], p.scales[0]), (&[96u8, 0xFF][..], 127));
    // nvfp4: tensor max 2688 gives s_t = 1, block max 6 gives s_b = 1 (E4M3 0x38).
    let mut y = vec![0f32; 32];
    y[0] = 2688.0;
    y[16] = 6.0;
    let t = Tensor::from_slice(&y, 32, &Device::Cpu).unwrap();
    let p = pack_blocks(&t, &"nvfp4".parse().unwrap()).unwrap();
    assert_eq!(
        (p.tensor_scale, p.scales.as_slice()),
        (1.0, &[0x7Eu8, 0x38][..])
    );
    assert_eq!((p.codes[0], p.codes[8]), (0x07, 0x07));
}

/// Formats without blocks, wrong part sizes and bad scales are errors naming the problem.
#[test]
fn malformed_parts_are_errors() {
    let t = Tensor::zeros(40, DType::F32, &Device::Cpu).unwrap();
    assert!(pack_blocks(&t, &"e4m3".parse().unwrap())
        .unwrap_err()
        .to_string()
        .contains("e4m3"));
    let i = Tensor::zeros(4, DType::U8, &Device::Cpu).unwrap();
    assert!(pack_blocks(&i, &"mxint8".parse().unwrap()).is_err());
    let mut p = pack_blocks(&t, &"mxfp4_e2m1".parse().unwrap()).unwrap();
    p.codes.pop();
    assert!(unpack_blocks(&p)
        .unwrap_err()
        .to_string()
        .contains("code bytes"));
    let mut p = pack_blocks(&t, &"nvfp4".parse().unwrap()).unwrap();
    p.tensor_scale = 0.0;
    assert!(unpack_blocks(&p)
        .unwrap_err()
        .to_string()
        .contains("tensor scale"));
    let meta = qcandle::ops::pack_blocks::safetensors_metadata("w", &p);
    assert!(meta.contains(&("w.format".to_string(), "nvfp4".to_string())));
    assert!(meta.contains(&("w.block_size".to_string(), "16".to_string())));
}
