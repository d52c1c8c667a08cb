//! Exact comparison of `m^(2^g)` with `2^n`: the decision every lns rounding reduces to.
//!
//! lns<w,f> rounds by comparing a logarithm with a dyadic boundary `b / 2^g`:
//! `log2(m) >= b / 2^g` exactly when `m^(2^g) >= 2^b`. The power has `bits(m) * 2^g` bits, far
//! too many to form for the `g` up to 53 that lns rounding needs, so [`pow_cmp`] squares an
//! interval instead: `[lo, hi]` starts at `m` (exact) and is squared `g` times, each time
//! truncating `lo` down and `hi` up to `P` bits, so `lo <= m^(2^g) <= hi` throughout. When
//! `lo >= 2^n` or `hi <= 2^n` the answer is known; otherwise `P` doubles (128, 256, 512, ...
//! bits) and the squaring starts again.
//!
//! The loop ends: when `m` is a power of two the comparison is made on the exponents
//! directly, and otherwise `m^(2^g)` has an odd factor above one, is never a power of two,
//! and differs from `2^n` by a positive amount that a precise enough interval resolves (the
//! relative width after `g` squarings is below `2^(g + 2 - P)`, so `P` a few bits above
//! `-log2 |log2(m) - n / 2^g|` suffices; 128 bits decide all but a vanishing fraction of the
//! inputs lns rounding meets).

use std::cmp::Ordering;

/// Compares `m^(2^g)` with `2^n` exactly (`m >= 1`).
pub fn pow_cmp(m: u64, g: u32, n: i64) -> Ordering {
    debug_assert!(m > 0);
    let tz = m.trailing_zeros();
    if m >> tz == 1 {
        // m = 2^tz: compare the exponents tz * 2^g and n.
        return ((tz as i128) << g).cmp(&(n as i128));
    }
    let mut limbs = 2;
    loop {
        if let Some(order) = interval_cmp(m, g, n, limbs) {
            return order;
        }
        limbs *= 2;
    }
}

/// A bound `a * 2^e` with `a` a normalised `limbs`-limb integer (top bit set), little-endian.
struct Bound {
    a: Vec<u64>,
    e: i64,
}

impl Bound {
    fn new(m: u64, limbs: usize) -> Self {
        let lz = m.leading_zeros();
        let mut a = vec![0u64; limbs];
        a[limbs - 1] = m << lz;
        Bound {
            a,
            e: -(lz as i64) - 64 * (limbs as i64 - 1),
        }
    }

    /// Squares the bound, truncating the product to `limbs` limbs downward (`up = false`)
    /// or upward (`up = true`).
    fn square(&mut self, up: bool, product: &mut [u64]) {
        let l = self.a.len();
        square_into(&self.a, product);
        let mut e = 2 * self.e;
        if product[2 * l - 1] >> 63 == 0 {
            shl1(product);
            e -= 1;
        }
        let dropped = product[..l].iter().any(|&x| x != 0);
        self.a.copy_from_slice(&product[l..]);
        self.e = e + 64 * l as i64;
        if up && dropped && increment(&mut self.a) {
            // Carried out of the top limb: the bound is 2^(64 l), one bit longer.
            self.a[l - 1] = 1 << 63;
            self.e += 1;
        }
    }

    /// `floor(log2)` of the bound's value.
    fn top_exponent(&self) -> i64 {
        self.e + 64 * self.a.len() as i64 - 1
    }

    fn is_power_of_two(&self) -> bool {
        let l = self.a.len();
        self.a[l - 1] == 1 << 63 && self.a[..l - 1].iter().all(|&x| x == 0)
    }
}

/// The comparison with `limbs * 64`-bit interval bounds, or `None` if still undecided.
fn interval_cmp(m: u64, g: u32, n: i64, limbs: usize) -> Option<Ordering> {
    let mut lo = Bound::new(m, limbs);
    let mut hi = Bound::new(m, limbs);
    let mut product = vec![0u64; 2 * limbs];
    for _ in 0..g {
        lo.square(false, &mut product);
        hi.square(true, &mut product);
    }
    // m is not a power of two, so m^(2^g) != 2^n and lo < m^(2^g) unless exact.
    if lo.top_exponent() >= n {
        return Some(Ordering::Greater);
    }
    let hi_top = hi.top_exponent();
    if hi_top < n || (hi_top == n && hi.is_power_of_two()) {
        return Some(Ordering::Less);
    }
    None
}

/// `out = a * a` (`out` has twice `a`'s limbs).
fn square_into(a: &[u64], out: &mut [u64]) {
    out.iter_mut().for_each(|x| *x = 0);
    for (i, &x) in a.iter().enumerate() {
        let mut carry = 0u128;
        for (j, &y) in a.iter().enumerate() {
            let t = x as u128 * y as u128 + out[i + j] as u128 + carry;
            out[i + j] = t as u64;
            carry = t >> 64;
        }
        out[i + a.len()] = carry as u64;
    }
}

/// Shifts a little-endian integer left by one bit (the top bit is known to be clear).
fn shl1(x: &mut [u64]) {
    let mut carry = 0;
    for limb in x.iter_mut() {
        let next = *limb >> 63;
        *limb = (*limb << 1) | carry;
        carry = next;
    }
}

/// Adds one; returns whether it carried out of the top limb.
fn increment(x: &mut [u64]) -> bool {
    for limb in x.iter_mut() {
        let (v, c) = limb.overflowing_add(1);
        *limb = v;
        if !c {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// m^(2^g) against 2^n with exact u128 arithmetic, while the power fits.
    fn small(m: u64, g: u32, n: i64) -> Ordering {
        let p = (m as u128).pow(1 << g);
        if n >= 128 {
            Ordering::Less
        } else if n < 0 {
            Ordering::Greater
        } else {
            p.cmp(&(1u128 << n))
        }
    }

    #[test]
    fn matches_exact_powers_that_fit_in_128_bits() {
        for m in 1u64..200 {
            for g in 0..4u32 {
                let bits = (64 - m.leading_zeros()) << g;
                if bits > 127 {
                    continue;
                }
                for n in -2..bits as i64 + 2 {
                    assert_eq!(pow_cmp(m, g, n), small(m, g, n), "{m}^(2^{g}) vs 2^{n}");
                }
            }
        }
    }

    #[test]
    fn powers_of_two_compare_their_exponents() {
        assert_eq!(pow_cmp(8, 40, 3 << 40), Ordering::Equal);
        assert_eq!(pow_cmp(8, 40, (3 << 40) + 1), Ordering::Less);
        assert_eq!(pow_cmp(1, 53, 0), Ordering::Equal);
    }
}
