//! Invalid inputs to the quire and naive GEMMs are errors, not panics: mismatched or rank-1
//! shapes, integer dtypes, a quire for a float, fixed or block format, a naive GEMM in a
//! block format, posits beyond the quire's range, a conv2d kernel larger than the padded
//! input, and a bias of the wrong length.

mod common;
#[path = "common/exact.rs"]
mod exact;

use exact::{p, t2};

use candle_core::{DType, Device, Tensor};
use qcandle::quire::{conv2d, linear, matmul, naive_matmul, quire_matmul, Accumulation, Quire};
use qcandle::Format;

fn posit_8_0() -> Format {
    Format::posit(8, 0).unwrap()
}

#[test]
fn matmul_with_mismatched_shapes_is_an_error() {
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        assert!(matmul(&t2(2, 3), &t2(4, 5), &posit_8_0(), acc).is_err());
        let a = Tensor::ones((3, 2, 4), DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::ones((2, 4, 5), DType::F32, &Device::Cpu).unwrap();
        assert!(
            matmul(&a, &b, &posit_8_0(), acc).is_err(),
            "batch 3 vs batch 2"
        );
        assert!(linear(&t2(2, 3), &t2(4, 5), None, &posit_8_0(), acc).is_err());
        let x = Tensor::ones((1, 3, 5, 5), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((2, 2, 3, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(
            conv2d(&x, &w, None, 1, 0, &posit_8_0(), acc).is_err(),
            "channels 3 vs 2"
        );
    }
}

#[test]
fn rank_1_inputs_are_an_error() {
    let v = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        assert!(matmul(&v, &t2(4, 2), &posit_8_0(), acc).is_err());
        assert!(matmul(&t2(2, 4), &v, &posit_8_0(), acc).is_err());
        assert!(linear(&v, &t2(2, 4), None, &posit_8_0(), acc).is_err());
        assert!(conv2d(&v, &v, None, 1, 0, &posit_8_0(), acc).is_err());
    }
}

#[test]
fn integer_dtypes_are_an_error() {
    for dt in [DType::U8, DType::U32, DType::I64] {
        let a = Tensor::ones((2, 3), dt, &Device::Cpu).unwrap();
        let b = Tensor::ones((3, 2), dt, &Device::Cpu).unwrap();
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            assert!(matmul(&a, &b, &posit_8_0(), acc).is_err(), "{dt:?}");
            assert!(
                matmul(&t2(2, 3), &b, &posit_8_0(), acc).is_err(),
                "{dt:?} b"
            );
            assert!(
                linear(&a, &t2(2, 3), None, &posit_8_0(), acc).is_err(),
                "{dt:?}"
            );
        }
    }
}

#[test]
fn quire_with_a_float_fixed_or_block_format_is_an_error() {
    for name in ["fp16", "e4m3", "bf16", "fixed<8,4>", "block<8>"] {
        let fmt: Format = name.parse().unwrap();
        assert!(quire_matmul(&t2(2, 3), &t2(3, 2), &fmt).is_err(), "{name}");
        assert!(
            linear(&t2(2, 3), &t2(2, 3), None, &fmt, Accumulation::Quire).is_err(),
            "{name}"
        );
        assert!(Accumulation::Quire.check(&fmt).is_err(), "{name}");
    }
}

#[test]
fn naive_with_a_block_format_is_an_error() {
    for name in ["block<8>", "block<4,dim=0>"] {
        let fmt: Format = name.parse().unwrap();
        assert!(naive_matmul(&t2(2, 3), &t2(3, 2), &fmt).is_err(), "{name}");
        let x = Tensor::ones((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((1, 1, 2, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(
            conv2d(&x, &w, None, 1, 0, &fmt, Accumulation::Naive).is_err(),
            "{name}"
        );
    }
    // The other elementwise formats are accepted.
    for name in ["fp16", "e4m3", "fixed<8,4>", "posit<16,1>"] {
        let fmt: Format = name.parse().unwrap();
        assert!(naive_matmul(&t2(2, 3), &t2(3, 2), &fmt).is_ok(), "{name}");
    }
}

/// posit<32,5> (maxpos = 2^960) and posit<32,4> (2^480) are beyond MAX_SCALE = 448;
/// posit<16,5> (2^448) is the widest accepted.
#[test]
fn posits_beyond_the_quire_range_are_an_error() {
    for (n, es) in [(32, 5), (32, 4), (20, 5)] {
        let fmt = Format::posit(n, es).unwrap();
        assert!(Quire::new(p(n, es)).is_err(), "posit<{n},{es}>");
        for acc in [Accumulation::Quire, Accumulation::Naive] {
            assert!(
                matmul(&t2(2, 3), &t2(3, 2), &fmt, acc).is_err(),
                "posit<{n},{es}> {acc:?}"
            );
        }
    }
    assert!(Quire::new(p(16, 5)).is_ok());
    assert!(quire_matmul(&t2(2, 3), &t2(3, 2), &Format::posit(16, 5).unwrap()).is_ok());
}

#[test]
fn conv2d_kernel_larger_than_the_padded_input_is_an_error() {
    let x = Tensor::ones((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones((1, 1, 7, 7), DType::F32, &Device::Cpu).unwrap();
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        assert!(
            conv2d(&x, &w, None, 1, 1, &posit_8_0(), acc).is_err(),
            "7x7 on 4x4 + 2"
        );
        assert!(
            conv2d(&x, &w, None, 1, 2, &posit_8_0(), acc).is_ok(),
            "7x7 on 4x4 + 4 fits"
        );
        assert!(
            conv2d(&x, &w, None, 0, 2, &posit_8_0(), acc).is_err(),
            "stride 0"
        );
    }
}

#[test]
fn bias_of_the_wrong_length_is_an_error() {
    let b3 = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    let b22 = Tensor::ones((2, 2), DType::F32, &Device::Cpu).unwrap();
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        // linear: 4 outputs.
        assert!(linear(&t2(2, 5), &t2(4, 5), Some(&b3), &posit_8_0(), acc).is_err());
        assert!(linear(&t2(2, 5), &t2(4, 5), Some(&b22), &posit_8_0(), acc).is_err());
        // conv2d: 2 output channels.
        let x = Tensor::ones((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((2, 1, 3, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(conv2d(&x, &w, Some(&b3), 1, 0, &posit_8_0(), acc).is_err());
    }
}
