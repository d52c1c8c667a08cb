//! Arithmetic on lns<w,f> codes ([`Lns`](crate::format::lns::Lns)): exact multiplication and
//! division, addition and subtraction by Gaussian logarithms with a choice of
//! implementations, and a naive matrix product.
//!
//! # Values
//!
//! A value ([`LnsValue`]) is zero, NaN or `±B^k` with `B = 2^(2^-f)`: its magnitude is
//! `2^(k / 2^f)`, `k` an integer in `[k_min, k_max] = [-2^(w-2) + 1, 2^(w-2) - 1]`. Patterns
//! convert both ways ([`LnsValue::from_bits`], [`LnsValue::to_bits`]), as do the format's
//! codes ([`LnsCode`](crate::format::lns::LnsCode), with `From`). Conversions from and to f64
//! are the format's own: [`LnsValue::to_f64`] is [`Lns::code_value`](crate::format::lns::Lns::code_value)
//! (correctly rounded), [`LnsValue::nearest`] is [`Lns::round_code`](crate::format::lns::Lns::round_code)
//! with nearest-even.
//!
//! # Results outside the range
//!
//! Every operation computes an exact or rounded `k` and then brings it into the format: a `k`
//! above `k_max` saturates to `k_max` (there is no infinity), a `k` below `k_min` flushes to
//! zero. The flush threshold of the arithmetic is the logarithm's: the rounded `k` must reach
//! `k_min`, so results from `B^(k_min - 1/2)` up round to the smallest magnitude `min`, and
//! smaller ones to zero. This differs from the format's rounding of an f64
//! ([`LnsValue::nearest`]), which decides below `min` in the value (`|x| > min/2` gives
//! `min`): a product or sum between `min/2` and `B^(k_min - 1/2)` flushes to zero here,
//! where rounding its exact value would give `min`.
//!
//! # Multiplication and division
//!
//! `±B^a * ±B^b = ±B^(a+b)` and `±B^a / ±B^b = ±B^(a-b)` are exact integer additions, with
//! the sign the XOR of the signs. `0 * x = 0 / x = 0` for finite `x`; `x / 0` is NaN (zero
//! included), as is every operation with a NaN operand.
//!
//! # Addition by Gaussian logarithms
//!
//! For `|a| >= |b|`, `z = k_b - k_a <= 0`:
//!
//! * same signs: `|a + b| = B^k_a (1 + B^z) = B^(k_a + sb(z))`, `sb(z) = log_B(1 + B^z)`;
//! * opposite signs: `|a + b| = B^(k_a + db(z))`, `db(z) = log_B|1 - B^z|`, with `a`'s sign;
//!   `z = 0` is exact cancellation, `x + (-x) = 0`.
//!
//! sb decreases from `sb(0) = 2^f` (doubling) toward 0 as `z -> -inf`, below half a unit once
//! `z <= -(f+2) 2^f`, where the sum is the larger operand; db is negative, tends to
//! `-inf` at `z -> 0-` (catastrophic cancellation) and to 0 like sb. Zero is the additive
//! identity and NaN absorbs.
//!
//! [`GaussLog`] chooses how sb and db are evaluated on the integer grid of `k`:
//!
//! * [`GaussLog::Ideal`] rounds the exact sb, db to the nearest integer, so `a + b` is the
//!   code nearest to the exact sum in the logarithm: correctly rounded. Decided exactly:
//!   interval bounds on `1 ± 2^(z/2^f)` and `2^((2m ± 1)/2^(f+1))` in 126-bit fixed point,
//!   repeated with big integers at 128, 256, 512, ... bits when they overlap (the module `exact` proves that they
//!   never meet: the sum of two codes is never exactly halfway between two codes in the
//!   logarithm, so there are no ties). Worst error: under 0.5 units of `k`.
//! * [`GaussLog::Truncated`] truncates the exact sb, db toward -inf (a datapath that drops the
//!   bits below the last place). Worst error: under 1 unit, always downward in the logarithm.
//! * [`GaussLog::Table`] interpolates sb linearly in a table on a coarser grid and evaluates
//!   db by cotransformation, as the `xlns` project's `xlnsconf` does (details in the module
//!   `gauss`).
//!
//! Ideal and Truncated evaluate sb and db by interval arithmetic, in 126-bit fixed point
//! first and with big integers when that leaves a decision open (under a microsecond per
//! call); for `f <= 10` [`LnsArith::new`] tabulates them at every `z` where they are not yet
//! at their far value (`(f+2) 2^f` entries each, the same exact evaluation), so an addition
//! is a lookup. The table implementation's evaluation is a few integer operations after its
//! construction.
//!
//! Measured worst error of sb and db, in units of the last place of `k`, against a
//! high-precision reference (series evaluation at 320 bits in `tests/lns_arith.rs`), over
//! every `z` from `-(f+3) 2^f` to 0 for `f` = 8 and 12 and over 20 000 random `z` for `f = 20`:
//!
//! | implementation | f | sb | db |
//! |---|---|---|---|
//! | Ideal | every f | < 0.5 (the exact rounding) | < 0.5 |
//! | Truncated | every f | < 1 (toward -inf) | < 1 |
//! | Table { grid_bits: 1, guard_bits: 0 } | 8 | 1.662 | 1.565 |
//! | Table { grid_bits: 1, guard_bits: 4 } | 8 | 1.797 | 1.450 |
//! | Table { grid_bits: 3, guard_bits: 4 } | 8 | 0.568 | 0.965 |
//! | Table { grid_bits: 3, guard_bits: 0 } | 12 | 1.615 | 1.943 |
//! | Table { grid_bits: 3, guard_bits: 4 } | 12 | 1.878 | 1.961 |
//! | Table { grid_bits: 5, guard_bits: 4 } | 12 | 0.607 | 1.012 |
//! | Table { grid_bits: 7, guard_bits: 0 } | 20 | 1.577 | 1.928 |
//! | Table { grid_bits: 7, guard_bits: 4 } | 20 | 1.856 | 1.602 |
//! | Table { grid_bits: 9, guard_bits: 4 } | 20 | 0.604 | 1.023 |
//!
//! (Figures rounded up at the third decimal; `grid_bits = (f - 5) / 2` is xlns's default.)
//! Ideal and Truncated are checked to equal the reference's rounding at every `z` for
//! `f` = 0 to 6, 8, 10 and 12, and on samples for `f` = 20, 23 and 30. Guard bits alone do
//! not lower the worst error on a coarse grid, where the interpolation error dominates; a
//! finer grid does.
//!
//! # Matrix product
//!
//! [`lns_matmul`] is the naive product of row-major code matrices: products exact, each dot
//! product accumulated from zero through [`LnsArith::add`] in the order of the inner index.
//! [`lns_matmul_f64`] rounds f64 matrices in and the result out. [`lns_gemm_lanes`] computes
//! the same bits (with an optional bias added last) fast: codes packed in integers, many
//! outputs' sums in flight at once in vector instructions, and for `f >= 11` the exactly
//! rounded sb and db from an
//! f64 evaluation with a proven error bound that defers to the exact decision near a
//! rounding boundary (the module `gauss_f64`); it is the kernel of
//! `accumulate = "lns:<impl>"`.
//!
//! Drift from the f64 product, `|c - c_f64| / sum_p |a_ip b_pj|` over the 256 outputs of a
//! 16x64x16 product of uniform [-1, 1] entries in lns<20,12> (`tests/lns_arith.rs`, seeded;
//! every figure is below the a priori bound of recursive summation the test asserts):
//!
//! | implementation | worst | mean |
//! |---|---|---|
//! | Ideal | 1.69e-4 | 3.13e-5 |
//! | Truncated | 1.37e-3 | 4.22e-4 |
//! | Table { grid_bits: 3, guard_bits: 0 } | 5.98e-4 | 1.19e-4 |
//! | Table { grid_bits: 3, guard_bits: 4 } | 5.00e-4 | 1.77e-4 |
//! | Table { grid_bits: 5, guard_bits: 4 } | 2.77e-4 | 3.89e-5 |
//!
//! Truncation is biased (every sum rounds down in magnitude), so its error grows with `k`;
//! the others' errors partly cancel.
//!
//! # Relation to other implementations
//!
//! The `xlns` Python library's default ("ideal") addition rounds an f64 evaluation of sb and
//! db to nearest, which is [`GaussLog::Ideal`] except when the f64 error crosses a rounding
//! boundary; its table and interpolation configurations are the source of
//! [`GaussLog::Table`].

mod arith;
mod error;
mod exact;
mod gauss;
mod gauss_f64;
pub(crate) mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_i32;
mod lanes_vec;
mod matmul;
mod value;

pub use arith::LnsArith;
pub use error::LnsError;
pub use gauss::GaussLog;
pub use lanes::{lns_gemm_lanes, LnsBias, LANES};
pub use matmul::{lns_matmul, lns_matmul_f64};
pub use value::LnsValue;
