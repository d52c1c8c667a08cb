//! Fast approximations for lns rounding, each with a proven error bound that the exact
//! comparison of `lns_exact.rs` backs up near a decision boundary.
//!
//! # `log2` of a significand
//! [`log2_significand`] estimates `L = log2(m / 2^52)` for `2^52 <= m < 2^53`. With
//! `v = m / 2^52` (halved, and 1 added to the result, when `v > sqrt 2`, so that
//! `v` lies in `[sqrt(1/2), sqrt 2]`), `ln v = 2 atanh(s)` with `s = (v - 1) / (v + 1)`,
//! `|s| <= 0.1716`, summed as `2 s (1 + s^2/3 + ... + s^20/21)`. The series tail is below
//! `2^-56`; `v - 1` is exact (Sterbenz), `v + 1`, the division, `s^2`, the Horner steps and
//! the scaling by `1/ln 2` each add at most half an ulp of a result below 1, so
//! `|estimate - L| < 2^-49`. The callers assume [`LOG2_ERROR`] `= 2^-44`, 32 times that.
//!
//! # `2^(r / 2^f)` in fixed point
//! [`exp2_fraction`] returns a 128-bit lower bound `Y` of `2^127 * 2^(r / 2^f)` for
//! `0 <= r < 2^f`, `f <= 30`: the product over the set bits `i` of `r / 2^f` (bit `i` worth
//! `2^-i`) of the constants `c_i = floor(2^127 * 2^(2^-i))`, each product truncated to 128
//! bits. A step turns an error of `a` units (of `2^-127`) into at most `c a + 3` with
//! `c < 2`, and the product of all the `c_i` is below 2, so the total stays below
//! [`EXP2_ERROR`] `= 256` units: `Y <= 2^127 * 2^(r/2^f) < Y + 256`.
//!
//! [`exp2_fraction_tabled`] reads the same bound from two tables built once per `f` (for
//! `f >= 12`): with `r = r_h 2^l + r_l` (`l = f / 2`), `H = exp2_fraction(r_h 2^l, f)` and
//! `L = exp2_fraction(r_l, f)` are lower bounds of `H*` and `L*` within 256 units, and
//! `Y = floor(H L / 2^127)`. `H* L* / 2^127 = 2^127 2^(r/2^f) < 2^128`, so the product stays
//! below `2^255`, `Y` is a lower bound, and the error is below
//! `(H* (L* - L) + L (H* - H)) / 2^127 + 1 < 512 + 512 + 1` units ([`EXP2_TABLED_ERROR`]
//! `= 1025`, as `H*, L < 2^128`).

use std::sync::OnceLock;

/// Bound assumed on `|log2_significand(m) - log2(m / 2^52)|` (the actual error is below
/// `2^-49`).
pub const LOG2_ERROR: f64 = 1.0 / (1u64 << 44) as f64;

/// Bound on `2^127 * 2^(r/2^f) - exp2_fraction(r, f)`, in units of the last bit.
pub const EXP2_ERROR: u128 = 256;

/// Estimate of `log2(m / 2^52)` for `2^52 <= m < 2^53` (error below [`LOG2_ERROR`]).
#[inline(always)]
pub fn log2_significand(m: u64) -> f64 {
    log2_unit(m as f64 * (1.0 / (1u64 << 52) as f64))
}

/// [`log2_significand`] of the significand as the f64 `v = m / 2^52` in `[1, 2)`: the same
/// operations in the same order, written without branches (the halving is a select) so
/// that many lanes evaluate it at once with the same bits.
#[inline(always)]
pub fn log2_unit(v: f64) -> f64 {
    let halve = v > std::f64::consts::SQRT_2;
    let v = if halve { v * 0.5 } else { v };
    let offset = if halve { 1.0 } else { 0.0 };
    let s = (v - 1.0) / (v + 1.0);
    let z = s * s;
    let mut p = 1.0 / 21.0;
    p = p * z + 1.0 / 19.0;
    p = p * z + 1.0 / 17.0;
    p = p * z + 1.0 / 15.0;
    p = p * z + 1.0 / 13.0;
    p = p * z + 1.0 / 11.0;
    p = p * z + 1.0 / 9.0;
    p = p * z + 1.0 / 7.0;
    p = p * z + 1.0 / 5.0;
    p = p * z + 1.0 / 3.0;
    p = p * z + 1.0;
    (2.0 * s) * p * std::f64::consts::LOG2_E + offset
}

/// `floor(2^127 * 2^(2^-i))` for `i = 1..=30`.
const EXP2_CONSTANTS: [u128; 30] = [
    0xb504f333f9de6484597d89b3754abe9f,
    0x9837f0518db8a96f46ad23182e42f6f6,
    0x8b95c1e3ea8bd6e6fbe4628758a53c90,
    0x85aac367cc487b14c5c95b8c2154c1b2,
    0x82cd8698ac2ba1d73e2a475b46520bff,
    0x8164d1f3bc0307737be56527bd14def4,
    0x80b1ed4fd999ab6c25335719b6e6fd20,
    0x8058d7d2d5e5f6b094d589f608ee4aa2,
    0x802c6436d0e04f50ff8ce94a6797b3ce,
    0x8016302f174676283690dfe44d11d008,
    0x800b179c82028fd0945e54e2ae18f2f0,
    0x80058baf7fee3b5d1c718b38e549cb93,
    0x8002c5d00fdcfcb6b6566a58c048be1f,
    0x800162e61bed4a48e84c2e1a463473d9,
    0x8000b17292f702a3aa22beacca949013,
    0x800058b92abbae02030c5fa5256f41fe,
    0x80002c5c8dade4d71776c0f4dbea67d6,
    0x8000162e44eaf636526be456600bdbe4,
    0x80000b1721fa7c188307016c1cd4e8b6,
    0x8000058b90de7e4cecfc487503488bb1,
    0x800002c5c8678f36cbfce50a6de60b14,
    0x80000162e431db9f80b2347b5d62e516,
    0x800000b1721872d0c7b08cf1e0114152,
    0x80000058b90c1aa8a5c3736cb77e8dff,
    0x8000002c5c8605a4635f2efc2362d978,
    0x800000162e4300e635cf4a109e3939bd,
    0x8000000b17217ff81bef9c551590cf83,
    0x800000058b90bfdd4e39cd52c0cfa27c,
    0x80000002c5c85fe6f72d669e0e76e411,
    0x8000000162e42ff18f9ad35186d0df28,
];

/// The largest `f` [`exp2_fraction`] accepts.
pub const MAX_FRACTION_BITS: u32 = 30;

/// A lower bound `Y` of `2^127 * 2^(r / 2^f)` with error below [`EXP2_ERROR`] units
/// (`r < 2^f`, `f <= 30`).
#[inline]
pub fn exp2_fraction(r: u64, f: u32) -> u128 {
    debug_assert!(f <= MAX_FRACTION_BITS && r < 1 << f);
    let mut y = 1u128 << 127;
    for i in 1..=f {
        if (r >> (f - i)) & 1 == 1 {
            y = mul_shift127(y, EXP2_CONSTANTS[i as usize - 1]);
        }
    }
    y
}

/// Bound on `2^127 * 2^(r/2^f) - exp2_fraction_tabled(r, f)`, in units of the last bit.
pub const EXP2_TABLED_ERROR: u128 = 4 * EXP2_ERROR + 1;

/// The smallest `f` [`exp2_fraction_tabled`] reads from tables (below it, it is
/// [`exp2_fraction`], whose loop is short).
const EXP2_TABLED_MIN_F: u32 = 12;

/// [`exp2_fraction`] of the high and the low bits of `r` for one `f`.
struct Exp2Tables {
    /// Bits of `r` in the low table.
    low_bits: u32,
    /// `exp2_fraction(i << low_bits, f)`.
    high: Vec<u128>,
    /// `exp2_fraction(j, f)` for `j < 2^low_bits`.
    low: Vec<u128>,
}

/// The tables of each `f`, built on first use.
static EXP2_TABLES: [OnceLock<Exp2Tables>; MAX_FRACTION_BITS as usize + 1] =
    [const { OnceLock::new() }; MAX_FRACTION_BITS as usize + 1];

/// A lower bound `Y` of `2^127 * 2^(r / 2^f)` with error below [`EXP2_TABLED_ERROR`] units
/// (`r < 2^f`, `f <= 30`), from two table entries (see the module docs); the tables of `f`
/// are built on its first use.
#[inline]
pub fn exp2_fraction_tabled(r: u64, f: u32) -> u128 {
    debug_assert!(f <= MAX_FRACTION_BITS && r < 1 << f);
    if f < EXP2_TABLED_MIN_F {
        return exp2_fraction(r, f);
    }
    let t = EXP2_TABLES[f as usize].get_or_init(|| {
        let low_bits = f / 2;
        Exp2Tables {
            low_bits,
            high: (0..1u64 << (f - low_bits))
                .map(|i| exp2_fraction(i << low_bits, f))
                .collect(),
            low: (0..1u64 << low_bits).map(|j| exp2_fraction(j, f)).collect(),
        }
    });
    let h = t.high[(r >> t.low_bits) as usize];
    let l = t.low[(r & ((1 << t.low_bits) - 1)) as usize];
    mul_shift127(h, l)
}

/// `floor(a * b / 2^127)` for `a, b < 2^128` with a product below `2^255`.
#[inline(always)]
fn mul_shift127(a: u128, b: u128) -> u128 {
    let (a1, a0) = (a >> 64, a as u64 as u128);
    let (b1, b0) = (b >> 64, b as u64 as u128);
    let low = a0 * b0;
    let mid1 = a1 * b0;
    let mid2 = a0 * b1;
    let high = a1 * b1;
    // a * b = high * 2^128 + (mid1 + mid2) * 2^64 + low.
    let mid = (low >> 64) + (mid1 as u64 as u128) + (mid2 as u64 as u128);
    let upper = high + (mid1 >> 64) + (mid2 >> 64) + (mid >> 64);
    let lower = (mid << 64) | (low as u64 as u128);
    (upper << 1) | (lower >> 127)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul_shift127_is_the_floor_of_the_scaled_product() {
        assert_eq!(mul_shift127(3 << 100, 5 << 90), 15 << 63);
        assert_eq!(mul_shift127(1 << 127, 12345), 12345);
        assert_eq!(mul_shift127(3, 1 << 126), 1);
        let a = u128::MAX >> 1;
        // (2^127 - 1)^2 / 2^127 = 2^127 - 2 + 2^-127.
        assert_eq!(mul_shift127(a, a), (1 << 127) - 2);
    }

    #[test]
    fn each_constant_squared_is_the_previous_one() {
        // c_1^2 is just below 2^255; c_i^2 is within 3 units below c_(i-1) (both floors of
        // the same value's square root chain).
        let c = EXP2_CONSTANTS;
        assert!(mul_shift127(c[0], c[0]) >= u128::MAX - 3);
        for i in 1..c.len() {
            let sq = mul_shift127(c[i], c[i]);
            assert!(sq <= c[i - 1] && c[i - 1] - sq <= 3, "c_{}", i + 1);
        }
    }

    /// Both are lower bounds of the same power, within 256 and [`EXP2_TABLED_ERROR`] units:
    /// the table product lies in `(exact - 1025, exact + 256)`, and equals the loop's
    /// value below the tabled `f`. Fails when a table entry or the split of `r` is wrong.
    #[test]
    fn the_tabled_power_is_within_its_bound_of_the_loop() {
        for f in [
            0,
            5,
            EXP2_TABLED_MIN_F - 1,
            EXP2_TABLED_MIN_F,
            17,
            23,
            MAX_FRACTION_BITS,
        ] {
            let mut r = 0x9e37_79b9u64 ^ f as u64;
            let mut rs: Vec<u64> = (0..5000)
                .map(|_| {
                    r = r
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (r >> 20) & ((1u64 << f) - 1)
                })
                .collect();
            rs.extend([
                0,
                1,
                (1u64 << f) - 1,
                (1u64 << f) >> 1,
                ((1u64 << f) >> 1).saturating_sub(1),
            ]);
            for r in rs {
                let (fast, slow) = (exp2_fraction_tabled(r, f), exp2_fraction(r, f));
                if f < EXP2_TABLED_MIN_F {
                    assert_eq!(fast, slow, "f = {f}, r = {r}");
                } else {
                    assert!(
                        fast + EXP2_TABLED_ERROR > slow && fast < slow + EXP2_ERROR,
                        "f = {f}, r = {r}: {fast:#x} against {slow:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn log2_estimate_is_exact_at_one_and_monotone_across_the_square_root_of_two() {
        assert_eq!(log2_significand(1 << 52), 0.0);
        let m = (std::f64::consts::SQRT_2 * (1u64 << 52) as f64) as u64;
        for d in 0..4 {
            assert!(log2_significand(m + d) <= log2_significand(m + d + 1));
        }
        assert!((log2_significand((1 << 53) - 1) - 1.0).abs() < 1e-15);
    }
}
