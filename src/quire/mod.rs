//! Exact and naive posit arithmetic for dot products: the quire, and GEMMs built on it.
//!
//! * [`Quire`]: an exact accumulator of posit products with one rounding at the end.
//! * [`gemm_cpu`]: GEMMs on f64 slices: exact (a quire per output, or a narrower
//!   accumulator where that is provably exact) and naive (rounded after every operation;
//!   256 x 256 operation tables for other 8-bit formats, i16 lanes for posit<8,0>).
//! * [`gemm_checked`]: the exact GEMM of posit<16,1>, posit<32,2> and the other posits past
//!   the exact f64 and i16 paths: an f64 GEMM whose rounding is proved by an error bound,
//!   the outputs near a rounding boundary summed exactly.
//! * [`ops`]: the same on candle tensors: [`quire_matmul`], [`naive_matmul`], [`linear`]
//!   and [`conv2d`] (through im2col).
//! * `gemm_cuda` (feature `cuda`): the launches of the same GEMMs on a CUDA device
//!   (`cuda/gemm.cu`), with the CPU GEMMs' bits.
//! * [`int_dot`], [`int_operand`], [`int_round`] and [`quire_i16`]: the integer quire GEMM
//!   of posit<8,0> (f32 operands to i16 by table, i16 multiply-adds, exact sums rounded by
//!   table), from f64 or straight from f32; [`es0_lanes`]: the same roundings of
//!   posit<n,0> by magic constants in AVX2 lanes, without the tables (also the naive
//!   GEMM's AVX2 kernel of posit<n,0>, `n <= 8`).
//! * [`p8_units`], [`p8_lanes`] and [`naive_p8`]: the naive GEMM of posit<8,0> on i16
//!   values in units of minpos (products by table, sums rounded by integer steps) in
//!   vector lanes; [`p8_fp16`]: the same sums in binary16 lanes (AVX-512 FP16).
//! * [`posit_f64`] and [`naive_posit_f64`]: the posit rounding on f64 patterns and the
//!   naive GEMM of the posits past the f32 kernels (posit<32,2>, ...) with it.
//! * [`posit_magic`]: the posit rounding of doubled f32 values by one magic constant, for
//!   the naive GEMM's AVX2 kernel.
//! * [`round_odd`]: f64 operations rounded to odd, so that one later rounding to the
//!   format is correct.
//! * [`accumulate`]: the `accumulate` setting of a layer (`f32`, `quire`, `naive`,
//!   `naive:<format>`, `fma:<format>`, `lns:<impl>`) and the rule of each; [`rule`] resolves
//!   it for one GEMM's format; [`gemm_acc`] and [`gemm_lns`] are the kernels of the
//!   accumulator-format and LNS rules; [`layer_linear`], [`layer_conv`] and
//!   [`layer_matmul`] (attention's batched products) are the layers' GEMMs with their
//!   backward passes.
//! * [`image_gemm`]: a convolution's per-image GEMMs run several images at a time, on f32
//!   matrices for the register kernel and f64 for the others;
//!   [`conv_input_grad`] and [`conv_weight_grad`]: its gradients in the checked quire
//!   without the transposed or whole-batch column matrices; [`scratch`]: the per-thread
//!   buffers they reuse.

pub mod accumulate;
pub mod accumulator;
pub mod conv_input_grad;
pub mod conv_weight_grad;
pub mod es0_lanes;
pub mod gemm_acc;
pub mod gemm_checked;
pub mod gemm_cpu;
#[cfg(feature = "cuda")]
pub mod gemm_cuda;
pub mod gemm_lns;
pub mod image_gemm;
pub mod int_dot;
pub mod int_operand;
pub mod int_pairs;
pub mod int_round;
pub mod lane_round;
#[cfg(target_arch = "x86_64")]
pub mod lane_round_avx2;
#[cfg(target_arch = "x86_64")]
pub mod lane_round_avx512;
pub mod layer_conv;
mod layer_io;
pub mod layer_linear;
pub mod layer_matmul;
pub mod naive_f32;
pub mod naive_lanes;
pub mod naive_p8;
pub mod naive_posit_f64;
#[cfg(target_arch = "x86_64")]
pub mod naive_special;
#[cfg(target_arch = "x86_64")]
pub mod naive_special_avx2;
pub mod ops;
pub mod p8_fp16;
pub mod p8_lanes;
pub mod p8_units;
pub mod posit_f64;
pub mod posit_magic;
pub mod quire_i16;
pub mod round_odd;
pub mod rule;
pub mod scratch;

pub use accumulate::{Accumulate, AccumulateError, LnsSum};
pub use accumulator::Quire;
pub use layer_conv::rule_conv2d;
pub use layer_linear::rule_linear;
pub use layer_matmul::{rule_matmul, MatMulArith};
pub use ops::{conv2d, linear, matmul, naive_matmul, quire_matmul, Accumulation};
pub use rule::{GemmRule, LayerArith};
