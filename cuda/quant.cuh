// Per-element rounding math of every format and rounding mode, as __host__ __device__
// functions. This is the Rust GENERAL path of src/format/ (grid.rs, rounding.rs, posit.rs,
// float.rs, fixed.rs, block.rs, lns.rs, lns_exact.rs, lns_approx.rs, mod.rs) and
// src/philox.rs written again in integer C++: every function says which Rust function it mirrors, and tests/cuda_host.rs compares the host
// build of this header (cuda/host_shim.cpp) with the Rust code bit for bit.
//
// Integer-only except for lns's log2 estimate: values are taken apart and put together
// through their bits. The lns estimate (qc_lns_log2_significand) is the Rust f64 computation
// written with compat.cuh's single-rounding operations (never contracted into FMAs), so it
// has the Rust bits; besides, every decision it takes part in is exact given its proven error
// bound, so any estimate within that bound would give the same roundings. Nothing depends on the device's
// floating-point modes, so host and device give the same bits.
//
// Formats and rounding modes are passed as plain structs (QcFormat, QcRounding) built on the
// host from a validated Rust `Format`/`Rounding`; the functions assume valid parameters (the
// ranges checked by Posit::new, Float::with_options, Fixed::with_options, Block::new,
// Lns::new and Rounding::stochastic).
#ifndef QCANDLE_QUANT_CUH
#define QCANDLE_QUANT_CUH

#include "compat.cuh"

// ---------------------------------------------------------------------------------------
// The API used by the kernels.

// A format as four ints.
//   family 0 posit: a = n, b = es.
//   family 1 float: a = exp bits, b = man bits; flags bit0 = subnormals, bit1 = saturate on
//                   overflow, bits 2-3 = specials (0 ieee, 1 fn, 2 fin).
//   family 2 fixed: a = wl, b = fl; flags bit0 = clamp, bit1 = sym.
//   family 3 block: a = wl (the block's dim is host-side only).
//   family 4 MX, 5 NVFP4: see "Block-scaled formats" below.
//   family 6 lns:   a = w, b = f (fraction bits of the logarithm).
struct QcFormat {
    int32_t family;
    int32_t a;
    int32_t b;
    int32_t flags;
};

// A rounding mode: 0 nearest-even, 1 nearest-away, 2 toward-zero, 3 stochastic with `bits`
// random bits (1..=23; read from the top of the 32-bit random word).
struct QcRounding {
    int32_t mode;
    int32_t bits;
};

#define QC_POSIT 0
#define QC_FLOAT 1
#define QC_FIXED 2
#define QC_BLOCK 3

#define QC_NEAREST_EVEN 0
#define QC_NEAREST_AWAY 1
#define QC_TOWARD_ZERO 2
#define QC_STOCHASTIC 3

#define QC_FLOAT_SUBNORMALS 1
#define QC_FLOAT_SATURATE 2
#define QC_FLOAT_SPECIALS_SHIFT 2
#define QC_SPECIALS_IEEE 0
#define QC_SPECIALS_FN 1
#define QC_SPECIALS_FIN 2

#define QC_FIXED_CLAMP 1
#define QC_FIXED_SYM 2

// qc_encode's answer where there is no pattern: NaN in a `fin` float format (Float::encode
// returns an error and `pack` refuses the tensor) and the fixed and block families (pack
// refuses them). It is also the valid pattern of -max in the 32-bit float<8,23,fin>, so a
// caller that must tell the two apart checks qc_encode_fails first.
#define QC_NO_PATTERN 0xFFFFFFFFu

// ---------------------------------------------------------------------------------------
// f64 bits (grid.rs).

#define QC_F64_SIGN 0x8000000000000000ull
#define QC_F64_INF 0x7FF0000000000000ull
#define QC_F64_NAN 0x7FF8000000000000ull  // f64::NAN
#define QC_F64_MANT_MASK 0x000FFFFFFFFFFFFFull

// |x|'s bits.
QC_HD uint64_t qc_abs_bits(double x) { return qc_f64_bits(x) & ~QC_F64_SIGN; }

// x.is_nan()
QC_HD bool qc_is_nan(double x) { return qc_abs_bits(x) > QC_F64_INF; }

// x.is_finite()
QC_HD bool qc_is_finite(double x) { return qc_abs_bits(x) < QC_F64_INF; }

// x.is_infinite()
QC_HD bool qc_is_inf(double x) { return qc_abs_bits(x) == QC_F64_INF; }

// x == 0.0 (either sign)
QC_HD bool qc_is_zero(double x) { return qc_abs_bits(x) == 0; }

// The sign bit: x < 0.0 for nonzero non-NaN x, x.is_sign_negative() always.
QC_HD bool qc_sign(double x) { return (qc_f64_bits(x) >> 63) != 0; }

// -x (Rust's `-v`: flips the sign bit, NaN included).
QC_HD double qc_neg(double x) { return qc_f64_from_bits(qc_f64_bits(x) ^ QC_F64_SIGN); }

// -x when `negative`.
QC_HD double qc_with_sign(double v, bool negative) { return negative ? qc_neg(v) : v; }

// Floor division by 2^sh of a signed int (Rust's arithmetic `e >> sh` on i32).
QC_HD int32_t qc_asr(int32_t e, int32_t sh) { return e >= 0 ? (e >> sh) : ~((~e) >> sh); }

// grid.rs Parts: |x| = m * 2^(e - 52), m in [2^52, 2^53).
struct QcParts {
    uint64_t m;
    int32_t e;
};

// grid.rs parts(): splits a finite nonzero x (sign ignored); subnormals are normalised.
QC_HD QcParts qc_parts(double x) {
    uint64_t bits = qc_abs_bits(x);
    int32_t biased = (int32_t)(bits >> 52);
    QcParts p;
    if (biased != 0) {
        p.m = (bits & QC_F64_MANT_MASK) | (1ull << 52);
        p.e = biased - 1023;
    } else {
        int32_t lz = qc_clz64(bits) - 11;
        p.m = bits << lz;
        p.e = -1022 - lz;
    }
    return p;
}

// grid.rs pow2(): 2^q (subnormal, 0 or Inf outside f64's normal range).
QC_HD double qc_pow2(int32_t q) {
    if (q >= -1022 && q <= 1023) return qc_f64_from_bits((uint64_t)(q + 1023) << 52);
    if (q >= -1074 && q <= -1023) return qc_f64_from_bits(1ull << (q + 1074));
    if (q <= -1075) return 0.0;
    return qc_f64_from_bits(QC_F64_INF);
}

// grid.rs magnitude(): m * 2^(e - 52) back as an f64 (exact).
QC_HD double qc_magnitude(QcParts p) {
    if (p.e >= -1022)
        return qc_f64_from_bits(((uint64_t)(p.e + 1023) << 52) | (p.m & QC_F64_MANT_MASK));
    return qc_f64_from_bits(p.m >> (-1022 - p.e));
}

// Rust's `count as f64 * pow2(q)` for count < 2^53 (grid.rs round_to_multiple, posit.rs
// round), built from bits: exact wherever the product is representable, Inf above f64's
// range, 0 for q < -1074 (no format gets there with a nonzero count; a zero count with
// q > 1023, NaN in Rust, cannot happen either).
QC_HD double qc_scale_count(uint64_t count, int32_t q) {
    if (count == 0 || q < -1074) return 0.0;
    int32_t e = 63 - qc_clz64(count);   // floor(log2 count), <= 52
    int32_t E = e + q;                  // binade of the product
    if (E > 1023) return qc_f64_from_bits(QC_F64_INF);
    uint64_t m = count << (52 - e);     // leading one on bit 52
    if (E >= -1022) return qc_f64_from_bits(((uint64_t)(E + 1023) << 52) | (m & QC_F64_MANT_MASK));
    return qc_f64_from_bits(m >> (-1022 - E));  // subnormal; exact since q >= -1074
}

// ---------------------------------------------------------------------------------------
// Rounding decisions (rounding.rs).

// rounding.rs cmp_half(): rem compared with 2^(s-1), as -1, 0, 1 (s >= 1).
QC_HD int32_t qc_cmp_half(uint64_t rem, uint32_t s) {
    if (s > 64) return -1;
    uint64_t half = 1ull << (s - 1);
    return rem < half ? -1 : (rem > half ? 1 : 0);
}

// rounding.rs Stochastic::up(): floor(rem * 2^k / 2^s) compared with the top k random bits.
QC_HD bool qc_up_stochastic(uint64_t rem, uint32_t s, uint32_t k, uint32_t random) {
    uint64_t threshold;
    if (s >= k) {
        uint32_t sh = s - k;
        threshold = sh >= 64 ? 0 : rem >> sh;
    } else {
        threshold = rem << (k - s);
    }
    return (uint64_t)(random >> (32 - k)) < threshold;
}

// rounding.rs RoundingRule::up() of each rule: whether the kept count goes up, given the
// remainder `rem` of `s >= 1` discarded bits and the kept value's parity.
QC_HD bool qc_up(uint64_t rem, uint32_t s, bool odd, QcRounding r, uint32_t random) {
    switch (r.mode) {
    case QC_NEAREST_AWAY: return qc_cmp_half(rem, s) >= 0;              // NearestAway::up
    case QC_TOWARD_ZERO: return false;                                  // TowardZero::up
    case QC_STOCHASTIC: return qc_up_stochastic(rem, s, (uint32_t)r.bits, random);
    default: {                                                          // NearestEven::up
        int32_t c = qc_cmp_half(rem, s);
        return c > 0 || (c == 0 && odd);
    }
    }
}

// rounding.rs Stochastic::up_ratio(num, den) as posit.rs round_cut calls it: a value
// m * 2^unit between lo = 2^A and hi = 2^B (in units 2^unit, 0 <= A < B), num = m - 2^A,
// den = 2^B - 2^A = 2^A (2^d - 1) with d = B - A. Rust divides in u128; here
// floor(num 2^k / den) = floor(floor(num 2^k / 2^A) / (2^d - 1)) in u64: num < 2^53, and
// in a posit's cut binades A >= 52 - 31 (lo is at most 2^31 below x, the gaps being at most
// useed = 2^32) so num 2^k / 2^A < 2^55 with k <= 23.
QC_HD bool qc_up_ratio_pow2(uint64_t m, int32_t A, int32_t B, uint32_t k, uint32_t random) {
    uint64_t num = m - (1ull << A);
    int32_t shift = (int32_t)k - A;  // <= 2
    uint64_t scaled = shift >= 0 ? (num << shift) : (num >> -shift);
    uint64_t threshold = scaled / ((1ull << (B - A)) - 1);
    return (uint64_t)(random >> (32 - k)) < threshold;
}

// grid.rs round_count(): rounds p to a multiple of 2^q (q > e - 52) and returns the kept
// count. odd_hint: -1 to use the count's parity, 0 or 1 to override it (posits with no
// fraction bits, whose tie goes to the even pattern).
QC_HD uint64_t qc_round_count(QcParts p, int32_t q, QcRounding r, uint32_t random,
                              int32_t odd_hint) {
    uint32_t s = (uint32_t)(q - (p.e - 52));
    uint64_t kept, rem;
    if (s >= 64) {
        kept = 0;
        rem = p.m;
    } else {
        kept = p.m >> s;
        rem = p.m & ((1ull << s) - 1);
    }
    bool odd = odd_hint < 0 ? (kept & 1) != 0 : odd_hint != 0;
    return (rem != 0 && qc_up(rem, s, odd, r, random)) ? kept + 1 : kept;
}

// grid.rs round_to_multiple(): a finite nonzero magnitude rounded to a multiple of 2^q.
QC_HD double qc_round_to_multiple(QcParts p, int32_t q, QcRounding r, uint32_t random) {
    int32_t s = q - (p.e - 52);
    if (s <= 0) return qc_magnitude(p);
    return qc_scale_count(qc_round_count(p, q, r, random, -1), q);
}

// ---------------------------------------------------------------------------------------
// Posit(n, es) (posit.rs).

// Posit::max_scale(): log2(maxpos) = (n - 2) 2^es.
QC_HD int32_t qc_posit_max_scale(int32_t n, int32_t es) { return (n - 2) << es; }

// Posit::nar(): 1 << (n - 1).
QC_HD uint32_t qc_posit_nar(int32_t n) { return 1u << (n - 1); }

// Posit::mask(): the n pattern bits.
QC_HD uint32_t qc_posit_mask(int32_t n) { return n == 32 ? 0xFFFFFFFFu : (1u << n) - 1; }

// Posit::frac_bits(): fraction bits in binade e (negative where exponent bits are cut off).
QC_HD int32_t qc_posit_frac_bits(int32_t n, int32_t es, int32_t e) {
    int32_t k = qc_asr(e, es);
    int32_t regime_len = k >= 0 ? k + 2 : 1 - k;
    return n - 1 - regime_len - es;
}

// Posit::truncated_pattern()'s result: the first n-1 magnitude bits of the exact encoding,
// the next bit and whether any later bit is set.
struct QcTrunc {
    uint32_t t;
    bool guard;
    bool sticky;
};

// Posit::truncated_pattern() for minpos <= p < maxpos.
QC_HD QcTrunc qc_posit_truncated_pattern(int32_t n, int32_t es, QcParts p) {
    int32_t k = qc_asr(p.e, es);
    uint64_t regime;
    uint32_t len;
    if (k >= 0) {
        regime = ((1ull << (k + 1)) - 1) << 1;
        len = (uint32_t)(k + 2);
    } else {
        regime = 1;
        len = (uint32_t)(1 - k);
    }
    uint64_t body = regime << (64 - len);
    uint32_t avail = 64 - len - (uint32_t)es;
    if (es > 0) body |= (uint64_t)((uint32_t)p.e & ((1u << es) - 1)) << avail;
    uint64_t frac = p.m & QC_F64_MANT_MASK;
    bool lost = false;
    if (avail >= 52) {
        body |= frac << (avail - 52);
    } else {
        body |= frac >> (52 - avail);
        lost = (frac & ((1ull << (52 - avail)) - 1)) != 0;
    }
    uint32_t keep = (uint32_t)n - 1;
    QcTrunc r;
    r.t = (uint32_t)(body >> (64 - keep));
    r.guard = ((body >> (63 - keep)) & 1) != 0;
    r.sticky = lost || (body & ((1ull << (63 - keep)) - 1)) != 0;
    return r;
}

// Posit::decode_magnitude(): value of a positive pattern 1 <= mag < 2^(n-1).
QC_HD double qc_posit_decode_magnitude(int32_t n, int32_t es, uint32_t mag) {
    uint64_t b = (uint64_t)mag << (65 - n);
    int32_t k, run;
    if ((b >> 63) == 1) {
        run = qc_clz64(~b);
        k = run - 1;
    } else {
        run = qc_clz64(b);
        k = -run;
    }
    uint64_t rest = b << (run + 1);
    int32_t e = es > 0 ? (int32_t)(rest >> (64 - es)) : 0;
    uint64_t frac = rest << es;
    int32_t scale = k * (1 << es) + e;
    return qc_f64_from_bits(((uint64_t)(scale + 1023) << 52) | (frac >> 12));
}

// Posit::decode(): an n-bit pattern (upper bits ignored); NaR gives NaN.
QC_HD double qc_posit_decode(int32_t n, int32_t es, uint32_t pattern) {
    uint32_t mask = qc_posit_mask(n);
    uint32_t p = pattern & mask;
    if (p == 0) return 0.0;
    uint32_t nar = qc_posit_nar(n);
    if (p == nar) return qc_f64_from_bits(QC_F64_NAN);
    bool negative = (p & nar) != 0;
    uint32_t mag = negative ? ((0u - p) & mask) : p;
    return qc_with_sign(qc_posit_decode_magnitude(n, es, mag), negative);
}

// Posit::encode(): the pattern of x, nearest with ties to the even pattern; NaN, ±Inf: NaR.
QC_HD uint32_t qc_posit_encode(int32_t n, int32_t es, double x) {
    if (!qc_is_finite(x)) return qc_posit_nar(n);
    if (qc_is_zero(x)) return 0;
    QcParts p = qc_parts(x);
    int32_t max_scale = qc_posit_max_scale(n, es);
    uint32_t mag;
    if (p.e >= max_scale) {
        mag = qc_posit_nar(n) - 1;
    } else if (p.e < -max_scale) {
        mag = 1;
    } else {
        QcTrunc t = qc_posit_truncated_pattern(n, es, p);
        mag = t.t + ((t.guard && (t.sticky || (t.t & 1) != 0)) ? 1u : 0u);
    }
    return qc_sign(x) ? ((0u - mag) & qc_posit_mask(n)) : mag;
}

// Posit::round_cut(): rounding on the bit pattern where exponent bits are cut off.
QC_HD double qc_posit_round_cut(int32_t n, int32_t es, QcParts p, QcRounding r,
                                uint32_t random) {
    QcTrunc t = qc_posit_truncated_pattern(n, es, p);
    bool up;
    switch (r.mode) {
    case QC_NEAREST_AWAY: up = t.guard; break;
    case QC_TOWARD_ZERO: up = false; break;
    case QC_STOCHASTIC:
        if (!t.guard && !t.sticky) {
            up = false;
        } else {
            // lo = 2^a <= x < hi = 2^b, in units of 2^(e - 52).
            int32_t a = qc_parts(qc_posit_decode_magnitude(n, es, t.t)).e;
            int32_t b = qc_parts(qc_posit_decode_magnitude(n, es, t.t + 1)).e;
            int32_t unit = p.e - 52;
            up = qc_up_ratio_pow2(p.m, a - unit, b - unit, (uint32_t)r.bits, random);
        }
        break;
    default: up = t.guard && (t.sticky || (t.t & 1) != 0); break;
    }
    return qc_posit_decode_magnitude(n, es, t.t + (up ? 1u : 0u));
}

// Posit::round(): never 0 for nonzero x, never NaR for finite x; NaN, ±Inf give NaN; -0 gives +0.
QC_HD double qc_posit_round(int32_t n, int32_t es, double x, QcRounding r, uint32_t random) {
    if (!qc_is_finite(x)) return qc_f64_from_bits(QC_F64_NAN);
    if (qc_is_zero(x)) return 0.0;
    QcParts p = qc_parts(x);
    int32_t max_scale = qc_posit_max_scale(n, es);
    double v;
    if (p.e >= max_scale) {
        v = qc_pow2(max_scale);
    } else if (p.e < -max_scale) {
        v = qc_pow2(-max_scale);
    } else {
        int32_t fb = qc_posit_frac_bits(n, es, p.e);
        if (fb >= 0) {
            int32_t q = p.e - fb;
            // With no fraction bits the pattern ends in an exponent bit (es >= 1) or a regime
            // bit (es = 0), whose parity decides ties.
            int32_t odd_hint = fb != 0 ? -1 : (es > 0 ? (p.e & 1) : (p.e < 0 ? 1 : 0));
            v = qc_scale_count(qc_round_count(p, q, r, random, odd_hint), q);
        } else {
            v = qc_posit_round_cut(n, es, p, r, random);
        }
    }
    return qc_with_sign(v, qc_sign(x));
}

// ---------------------------------------------------------------------------------------
// Float(exp, man) (float.rs).

// Float::bias(): 2^(exp-1) - 1.
QC_HD int32_t qc_float_bias(int32_t exp) { return (1 << (exp - 1)) - 1; }

// Float::emin(): 1 - bias.
QC_HD int32_t qc_float_emin(int32_t exp) { return 1 - qc_float_bias(exp); }

// The specials field of the flags.
QC_HD int32_t qc_float_specials(int32_t flags) { return (flags >> QC_FLOAT_SPECIALS_SHIFT) & 3; }

// Float::with_options()'s max_bits: the bits of the largest finite value.
QC_HD uint64_t qc_float_max_bits(int32_t exp, int32_t man, int32_t specials) {
    int32_t top = (1 << exp) - 1 - qc_float_bias(exp);  // binade of the all-ones exponent
    uint64_t ones = ((1ull << man) - 1) << (52 - man);   // all man bits set
    uint64_t binade, frac;
    if (specials == QC_SPECIALS_IEEE) {
        binade = (uint64_t)(top - 1 + 1023);
        frac = ones;
    } else if (specials == QC_SPECIALS_FIN) {
        binade = (uint64_t)(top + 1023);
        frac = ones;
    } else if (man == 0) {  // fn without mantissa bits: the top binade is NaN
        binade = (uint64_t)(top - 1 + 1023);
        frac = 0;
    } else {                // fn: the top binade without its all-ones mantissa
        binade = (uint64_t)(top + 1023);
        frac = ones - (1ull << (52 - man));
    }
    return (binade << 52) | frac;
}

// Float::overflow_value(): what a finite result beyond max becomes.
QC_HD double qc_float_overflow_value(int32_t exp, int32_t man, int32_t flags, QcRounding r) {
    int32_t specials = qc_float_specials(flags);
    if (r.mode == QC_TOWARD_ZERO || (flags & QC_FLOAT_SATURATE) != 0)
        return qc_f64_from_bits(qc_float_max_bits(exp, man, specials));
    if (specials == QC_SPECIALS_IEEE) return qc_f64_from_bits(QC_F64_INF);
    return qc_f64_from_bits(QC_F64_NAN);
}

// Float::round(): rounds as if the exponent were unbounded, then the overflow rule.
QC_HD double qc_float_round(int32_t exp, int32_t man, int32_t flags, double x, QcRounding r,
                            uint32_t random) {
    if (qc_is_nan(x) || qc_is_zero(x)) return x;
    int32_t specials = qc_float_specials(flags);
    uint64_t max_bits = qc_float_max_bits(exp, man, specials);
    double v;
    if (qc_is_inf(x)) {
        if (specials == QC_SPECIALS_IEEE) return x;
        if ((flags & QC_FLOAT_SATURATE) == 0) return qc_f64_from_bits(QC_F64_NAN);
        v = qc_f64_from_bits(max_bits);
    } else {
        QcParts p = qc_parts(x);
        int32_t emin = qc_float_emin(exp);
        int32_t q;
        if (p.e >= emin) q = p.e - man;
        else if ((flags & QC_FLOAT_SUBNORMALS) != 0) q = emin - man;
        else q = emin;
        v = qc_round_to_multiple(p, q, r, random);
        // v > max_value(): both nonnegative (v may be Inf), so their bits compare as values.
        if (qc_f64_bits(v) > max_bits) v = qc_float_overflow_value(exp, man, flags, r);
    }
    return qc_with_sign(v, qc_sign(x));
}

// Float::encode()'s failure: NaN in a format without NaN (fin).
QC_HD bool qc_float_encode_fails(int32_t flags, double x) {
    return qc_is_nan(x) && qc_float_specials(flags) == QC_SPECIALS_FIN;
}

// Float::encode(): the pattern of x rounded to nearest-even; NaN gives the canonical
// positive NaN (IEEE: quiet NaN with the top mantissa bit; fn: S.1..1.1..1), or
// QC_NO_PATTERN in a fin format (Rust returns an error).
QC_HD uint32_t qc_float_encode(int32_t exp, int32_t man, int32_t flags, double x) {
    QcRounding ne = {QC_NEAREST_EVEN, 0};
    double v = qc_float_round(exp, man, flags, x, ne, 0);
    uint32_t sign_bit = 1u << (exp + man);
    uint32_t all_ones_exp = ((1u << exp) - 1) << man;
    if (qc_is_nan(v)) {
        switch (qc_float_specials(flags)) {
        case QC_SPECIALS_IEEE: return all_ones_exp | (1u << (man - 1));
        case QC_SPECIALS_FN: return all_ones_exp | ((1u << man) - 1);
        default: return QC_NO_PATTERN;
        }
    }
    uint32_t sign = qc_sign(v) ? sign_bit : 0;
    if (qc_is_inf(v)) return sign | all_ones_exp;
    if (qc_is_zero(v)) return sign;
    QcParts p = qc_parts(v);
    int32_t emin = qc_float_emin(exp);
    uint32_t body;
    if (p.e >= emin) {
        uint32_t field = (uint32_t)(p.e + qc_float_bias(exp));
        body = (field << man) | ((uint32_t)(p.m >> (52 - man)) & ((1u << man) - 1));
    } else {
        // Subnormal: the count of 2^(emin - man) quanta.
        int32_t s = (emin - man) - (p.e - 52);
        body = (uint32_t)(p.m >> s);
    }
    return sign | body;
}

// Float::decode(): the value of a (1 + exp + man)-bit pattern (upper bits ignored).
QC_HD double qc_float_decode(int32_t exp, int32_t man, int32_t flags, uint32_t pattern) {
    int32_t nbits = 1 + exp + man;
    uint32_t p = pattern & (uint32_t)((1ull << nbits) - 1);
    bool negative = ((p >> (exp + man)) & 1) != 0;
    uint32_t field = (p >> man) & ((1u << exp) - 1);
    uint32_t m = p & ((1u << man) - 1);
    uint32_t all_ones = (1u << exp) - 1;
    int32_t specials = qc_float_specials(flags);
    double v;
    if (field == all_ones && specials == QC_SPECIALS_IEEE) {
        v = qc_f64_from_bits(m == 0 ? QC_F64_INF : QC_F64_NAN);
    } else if (field == all_ones && specials == QC_SPECIALS_FN && m == (1u << man) - 1) {
        v = qc_f64_from_bits(QC_F64_NAN);
    } else if (field == 0) {
        v = qc_scale_count(m, qc_float_emin(exp) - man);  // m * 2^(emin - man)
    } else {
        int32_t e = (int32_t)field - qc_float_bias(exp);
        v = qc_f64_from_bits(((uint64_t)(e + 1023) << 52) | ((uint64_t)m << (52 - man)));
    }
    return qc_with_sign(v, negative);
}

// ---------------------------------------------------------------------------------------
// Fixed point and block floating point (fixed.rs, block.rs).

// fixed.rs round_fixed(): x rounded to multiples of 2^q in a wl-bit two's complement range.
QC_HD double qc_round_fixed(double x, int32_t q, int32_t wl, bool clamp, bool symmetric,
                            QcRounding r, uint32_t random) {
    if (qc_is_nan(x)) return x;
    // A grid finer than f64's subnormals: every f64 is on it (only block floating point).
    if (q < -1074) return qc_is_zero(x) ? 0.0 : x;
    // top = 2^(wl-1) 2^q and max = top - 2^q, Inf (as in Rust) when top overflows f64; min.
    uint64_t top_count = 1ull << (wl - 1);
    double top = qc_scale_count(top_count, q);
    double max = qc_is_inf(top) ? top : qc_scale_count(top_count - 1, q);
    double min = qc_neg(symmetric ? max : top);
    if (qc_is_inf(x)) {
        if (!clamp) return x;
        return qc_sign(x) ? min : max;
    }
    if (qc_is_zero(x)) return 0.0;
    double v = qc_round_to_multiple(qc_parts(x), q, r, random);
    if (qc_is_zero(v)) return 0.0;
    bool negative = qc_sign(x);
    v = qc_with_sign(v, negative);
    if (clamp) {
        // v.clamp(min, max) on magnitudes: v and the end on its side share a sign.
        double end = negative ? min : max;
        if (qc_abs_bits(v) > qc_abs_bits(end)) v = end;
    }
    return v;
}

// Fixed::round(): multiples of 2^-fl.
QC_HD double qc_fixed_round(int32_t wl, int32_t fl, int32_t flags, double x, QcRounding r,
                            uint32_t random) {
    return qc_round_fixed(x, -fl, wl, (flags & QC_FIXED_CLAMP) != 0,
                          (flags & QC_FIXED_SYM) != 0, r, random);
}

// Block::round(): x in a block whose largest finite magnitude is block_max (0 if none).
QC_HD double qc_round_block(double x, int32_t wl, double block_max, QcRounding r,
                            uint32_t random) {
    // NaN: quiet, sign and payload kept (block.rs Block::round); ±Inf: unchanged.
    if (qc_is_nan(x)) return qc_f64_from_bits(qc_f64_bits(x) | 0x0008000000000000ull);
    if (!qc_is_finite(x)) return x;
    if (qc_is_zero(block_max) || qc_is_zero(x)) return 0.0;
    int32_t e = qc_parts(block_max).e;
    return qc_round_fixed(x, e - (wl - 2), wl, true, false, r, random);
}

// Format::round() (the dispatch below).
QC_HD double qc_round(double x, QcFormat f, QcRounding r, uint32_t random);

// ---------------------------------------------------------------------------------------
// Block-scaled formats: OCP MX (mx.rs) and NVFP4 (nvfp4.rs).
//
// family 4 MX: a = the element (MxElement::code: 0 e4m3, 1 e5m2, 2 e3m2, 3 e2m3, 4 e2m1,
//              5 int8); the block axis is host-side only.
// family 5 NVFP4: no parameters (the block axis is host-side only).
//
// MX scales elements by 2^-X and back with f64 multiplications by powers of two, and NVFP4
// divides by its scales: these are the Rust code's IEEE f64 operations, exact or correctly
// rounded on host and device alike (no sum of products, so no FMA contraction applies).

#define QC_MX 4
#define QC_NVFP4 5

// The scale exponent of a NaN MX block (E8M0's 0xFF).
#define QC_MX_SCALE_NAN 128

// MxElement::emax(): the binade of the element's largest normal.
QC_HD int32_t qc_mx_emax(int32_t code) {
    switch (code) {
    case 0: return 8;
    case 1: return 15;
    case 2: return 4;
    case 3:
    case 4: return 2;
    default: return 0;
    }
}

// MxElement::format(): the element as a saturating float with subnormals, or int8 as
// fixed<8,6,sym>.
QC_HD QcFormat qc_mx_element(int32_t code) {
    const int32_t sat = QC_FLOAT_SUBNORMALS | QC_FLOAT_SATURATE;
    QcFormat f = {QC_FLOAT, 0, 0, 0};
    switch (code) {
    case 0: f.a = 4; f.b = 3; f.flags = sat | (QC_SPECIALS_FN << QC_FLOAT_SPECIALS_SHIFT); break;
    case 1: f.a = 5; f.b = 2; f.flags = sat | (QC_SPECIALS_IEEE << QC_FLOAT_SPECIALS_SHIFT); break;
    case 2: f.a = 3; f.b = 2; f.flags = sat | (QC_SPECIALS_FIN << QC_FLOAT_SPECIALS_SHIFT); break;
    case 3: f.a = 2; f.b = 3; f.flags = sat | (QC_SPECIALS_FIN << QC_FLOAT_SPECIALS_SHIFT); break;
    case 4: f.a = 2; f.b = 1; f.flags = sat | (QC_SPECIALS_FIN << QC_FLOAT_SPECIALS_SHIFT); break;
    default: f.family = QC_FIXED; f.a = 8; f.b = 6; f.flags = QC_FIXED_CLAMP | QC_FIXED_SYM;
    }
    return f;
}

// mx.rs shared_exponent(): floor(log2 amax) - emax clamped below at -127; QC_MX_SCALE_NAN
// above 127 or for a NaN/Inf amax (a block holding NaN or Inf).
QC_HD int32_t qc_mx_scale(double amax, int32_t emax) {
    if (!qc_is_finite(amax)) return QC_MX_SCALE_NAN;
    if (qc_is_zero(amax)) return -127;
    int32_t x = qc_parts(amax).e - emax;
    if (x > 127) return QC_MX_SCALE_NAN;
    return x < -127 ? -127 : x;
}

// mx.rs round_element(): element.round(x / 2^X) * 2^X, NaN for a NaN block.
QC_HD double qc_mx_round(double x, int32_t code, int32_t scale, QcRounding r, uint32_t random) {
    if (scale == QC_MX_SCALE_NAN) return qc_f64_from_bits(QC_F64_NAN);
    return qc_round(x * qc_pow2(-scale), qc_mx_element(code), r, random) * qc_pow2(scale);
}

// nvfp4.rs successor(): the next value of the float format (exp, man) with subnormals above
// its nonnegative value lo.
QC_HD double qc_float_successor(int32_t exp, int32_t man, double lo) {
    int32_t emin = qc_float_emin(exp);
    if (qc_is_zero(lo)) return qc_pow2(emin - man);
    int32_t e = qc_parts(lo).e;
    if (e < emin) e = emin;
    return lo + qc_pow2(e - man);
}

// nvfp4.rs predecessor(): the next value below the positive value hi.
QC_HD double qc_float_predecessor(int32_t exp, int32_t man, double hi) {
    int32_t emin = qc_float_emin(exp);
    int32_t e = qc_parts(hi).e;
    if (e > emin && qc_f64_bits(hi) == qc_f64_bits(qc_pow2(e))) e -= 1;
    else if (e < emin) e = emin;
    return hi - qc_pow2(e - man);
}

// nvfp4.rs round_quotient(): the exact quotient a / d (d positive, finite) rounded to the
// float format f (subnormals, saturating); the f64 quotient's candidate is checked with exact
// products. Stochastic rounding uses the f64 quotient.
QC_HD double qc_round_quotient(double a, double d, QcFormat f, QcRounding r, uint32_t random) {
    if (qc_is_nan(a) || qc_is_zero(a)) return a;
    if (r.mode == QC_STOCHASTIC) return qc_float_round(f.a, f.b, f.flags, a / d, r, random);
    double abs = qc_f64_from_bits(qc_abs_bits(a));
    double max = qc_f64_from_bits(qc_float_max_bits(f.a, f.b, qc_float_specials(f.flags)));
    double q = abs / d;
    QcRounding tz = {QC_TOWARD_ZERO, 0};
    double lo = qc_is_inf(q) ? max : qc_float_round(f.a, f.b, f.flags, q, tz, 0);
    if (!qc_is_zero(lo) && lo * d > abs) lo = qc_float_predecessor(f.a, f.b, lo);
    double v = lo;
    if (r.mode != QC_TOWARD_ZERO) {
        double hi = qc_float_successor(f.a, f.b, lo);
        if (!(hi > max)) {
            double mid = 0.5 * (lo + hi);
            double m = mid * d;
            if (abs > m) v = hi;
            else if (abs < m) v = lo;
            else if (r.mode == QC_NEAREST_AWAY) v = hi;
            else {
                QcRounding ne = {QC_NEAREST_EVEN, 0};
                v = qc_float_round(f.a, f.b, f.flags, mid, ne, 0);
            }
        }
    }
    return qc_with_sign(v, qc_sign(a));
}

// The formats of NVFP4's steps: E2M1 elements, E4M3 block scales (saturating at 448), the
// f32 tensor scale (saturating at f32::MAX).
QC_HD QcFormat qc_nvfp4_e2m1() {
    QcFormat f = {QC_FLOAT, 2, 1,
                  QC_FLOAT_SUBNORMALS | QC_FLOAT_SATURATE |
                      (QC_SPECIALS_FIN << QC_FLOAT_SPECIALS_SHIFT)};
    return f;
}
QC_HD QcFormat qc_nvfp4_e4m3() {
    QcFormat f = {QC_FLOAT, 4, 3,
                  QC_FLOAT_SUBNORMALS | QC_FLOAT_SATURATE |
                      (QC_SPECIALS_FN << QC_FLOAT_SPECIALS_SHIFT)};
    return f;
}
QC_HD QcFormat qc_nvfp4_binary32() {
    QcFormat f = {QC_FLOAT, 8, 23, QC_FLOAT_SUBNORMALS | QC_FLOAT_SATURATE};
    return f;
}

// Nvfp4::tensor_scale(): fl32(amax / 2688) clamped to [2^-149, f32::MAX]; 1 for amax 0.
QC_HD double qc_nvfp4_tensor_scale(double amax) {
    if (qc_is_zero(amax) || !qc_is_finite(amax)) return 1.0;
    QcRounding ne = {QC_NEAREST_EVEN, 0};
    double s = qc_round_quotient(amax, 2688.0, qc_nvfp4_binary32(), ne, 0);
    double min = qc_pow2(-149);
    return s > min ? s : min;
}

// Nvfp4::block_scale(): e4m3(amax / (6 s_t)), NaN for a NaN/Inf amax.
QC_HD double qc_nvfp4_block_scale(double amax, double s_t) {
    if (!qc_is_finite(amax)) return qc_f64_from_bits(QC_F64_NAN);
    QcRounding ne = {QC_NEAREST_EVEN, 0};
    return qc_round_quotient(amax, 6.0 * s_t, qc_nvfp4_e4m3(), ne, 0);
}

// Nvfp4::round() with d = s_b * s_t: NaN for a NaN block, ±0 for a zero scale, else
// e2m1(x / d) * d.
QC_HD double qc_nvfp4_round_scaled(double x, double d, QcRounding r, uint32_t random) {
    if (qc_is_nan(d)) return qc_f64_from_bits(QC_F64_NAN);
    if (qc_is_zero(d)) return qc_sign(x) ? -0.0 : 0.0;
    return qc_round_quotient(x, d, qc_nvfp4_e2m1(), r, random) * d;
}

// Nvfp4::round().
QC_HD double qc_nvfp4_round(double x, double s_b, double s_t, QcRounding r, uint32_t random) {
    return qc_nvfp4_round_scaled(x, s_b * s_t, r, random);
}

// ---------------------------------------------------------------------------------------
// Logarithmic numbers lns<w,f> (lns.rs, lns_exact.rs, lns_approx.rs).
//
// A value is zero, NaN or ±2^(k / 2^f) with k in [k_min, k_max] = [-2^(w-2) + 1, 2^(w-2) - 1]
// (lns.rs has the policy). Every rounding decision is `t >= b / 2^h` for t = log2|x| 2^f: a
// fast f64 estimate of log2 (error below QC_LNS_LOG2_ERROR) decides it away from the boundary,
// and qc_lns_pow_cmp, an exact comparison of m^(2^g) with 2^n by interval squaring, decides it
// near the boundary. The value of a code is a 128-bit fixed-point product of constants, with
// the same exact comparison near a rounding midpoint.
//
// The exact comparison on fixed-size arrays. Squaring an interval [lo, hi] around m^(2^g)
// g times with P-bit bounds (truncated down and up) leaves a relative width below
// 2^(g + 2 - P); it decides the comparison once that is below the relative distance
// 2^(2^g (log2 m - n / 2^g)) - 1 > ln 2 * 2^g * |log2 m - n / 2^g| between m^(2^g) and 2^n,
// so P = 128, 256, 512, 1024 bits decide every case with |log2 m - n / 2^g| above about
// 2^(3 - P). The Rust code doubles P without limit; here P stops at QC_LNS_MAX_LIMBS 64-bit
// limbs (1024 bits, 512 bytes of per-thread scratch). In lns rounding m < 2^54, g <= f + 23
// <= 53, and |log2 m - n / 2^g| is the distance of log2 m from the nearest multiple of
// 2^-g: over the at most 2^54 significands and 54 values of g it is heuristically never
// below about 2^-(54 + 53 + 6) = 2^-113, so 256 bits should always suffice, but no proof
// of a bound of practical size exists (the general lower bounds on linear forms in two
// logarithms allow distances near 2^-(10^6)). So the cap is not a claim: a comparison still
// undecided at the cap sets *undecided instead of guessing: the kernels report it, and the
// host then quantizes the tensor with the CPU kernel, which has no cap (pack and unpack fail
// with an error naming the CPU). tests/cuda_host.rs counts how
// often each precision is reached (QC_LNS_COUNT below).

#define QC_LNS 6

// The largest interval precision of qc_lns_pow_cmp, in 64-bit limbs.
#define QC_LNS_MAX_LIMBS 16

// Hook called with the limb count of every interval squaring qc_lns_pow_cmp runs (the host
// shim counts them; nothing on the device).
#ifndef QC_LNS_COUNT
#define QC_LNS_COUNT(limbs)
#endif

// out[0 .. la + lb) = a[0 .. la) * b[0 .. lb), little-endian 64-bit limbs.
QC_HD void qc_limbs_mul(const uint64_t* a, int32_t la, const uint64_t* b, int32_t lb,
                        uint64_t* out) {
    for (int32_t i = 0; i < la + lb; ++i) out[i] = 0;
    for (int32_t i = 0; i < la; ++i) {
        uint64_t carry = 0;
        for (int32_t j = 0; j < lb; ++j) {
            // t = a_i b_j + out[i+j] + carry < 2^128, as (hi, lo).
            uint64_t lo = a[i] * b[j];
            uint64_t hi = qc_mulhi64(a[i], b[j]);
            lo += out[i + j];
            hi += lo < out[i + j] ? 1 : 0;
            lo += carry;
            hi += lo < carry ? 1 : 0;
            out[i + j] = lo;
            carry = hi;
        }
        out[i + lb] = carry;
    }
}

// lns_exact.rs Bound: a * 2^e with a a normalised l-limb integer (top bit set).
struct QcLnsBound {
    uint64_t a[QC_LNS_MAX_LIMBS];
    int64_t e;
};

// lns_exact.rs Bound::new(): m exactly, on l limbs.
QC_HD void qc_lns_bound_init(QcLnsBound* b, uint64_t m, int32_t l) {
    int32_t lz = qc_clz64(m);
    for (int32_t i = 0; i < l - 1; ++i) b->a[i] = 0;
    b->a[l - 1] = m << lz;
    b->e = -(int64_t)lz - 64 * (int64_t)(l - 1);
}

// lns_exact.rs Bound::square(): the square truncated to l limbs, downward or upward.
QC_HD void qc_lns_bound_square(QcLnsBound* b, int32_t l, bool up, uint64_t* product) {
    qc_limbs_mul(b->a, l, b->a, l, product);
    int64_t e = 2 * b->e;
    if ((product[2 * l - 1] >> 63) == 0) {
        // shl1: the top bit is known to be clear.
        uint64_t carry = 0;
        for (int32_t i = 0; i < 2 * l; ++i) {
            uint64_t next = product[i] >> 63;
            product[i] = (product[i] << 1) | carry;
            carry = next;
        }
        e -= 1;
    }
    bool dropped = false;
    for (int32_t i = 0; i < l; ++i) dropped = dropped || product[i] != 0;
    for (int32_t i = 0; i < l; ++i) b->a[i] = product[l + i];
    b->e = e + 64 * (int64_t)l;
    if (up && dropped) {
        bool carried = true;  // increment
        for (int32_t i = 0; i < l && carried; ++i) {
            b->a[i] += 1;
            carried = b->a[i] == 0;
        }
        if (carried) {
            // 2^(64 l): one bit longer (the lower limbs wrapped to zero).
            b->a[l - 1] = 1ull << 63;
            b->e += 1;
        }
    }
}

// lns_exact.rs interval_cmp(): -1 or 1 once decided with l-limb bounds, 0 while undecided
// (m not a power of two).
QC_HD_CALL int32_t qc_lns_interval_cmp(uint64_t m, uint32_t g, int64_t n, int32_t l) {
    QcLnsBound lo, hi;
    uint64_t product[2 * QC_LNS_MAX_LIMBS];
    QC_LNS_COUNT(l);
    qc_lns_bound_init(&lo, m, l);
    qc_lns_bound_init(&hi, m, l);
    for (uint32_t i = 0; i < g; ++i) {
        qc_lns_bound_square(&lo, l, false, product);
        qc_lns_bound_square(&hi, l, true, product);
    }
    // top_exponent(): floor(log2) of the bound.
    if (lo.e + 64 * (int64_t)l - 1 >= n) return 1;
    int64_t hi_top = hi.e + 64 * (int64_t)l - 1;
    bool hi_pow2 = hi.a[l - 1] == (1ull << 63);
    for (int32_t i = 0; i < l - 1; ++i) hi_pow2 = hi_pow2 && hi.a[i] == 0;
    if (hi_top < n || (hi_top == n && hi_pow2)) return -1;
    return 0;
}

// lns_exact.rs pow_cmp() with at most max_limbs limbs (a power of two, 2..=QC_LNS_MAX_LIMBS):
// m^(2^g) compared with 2^n (m >= 1, g <= 58) as -1, 0, 1; when undecided at max_limbs,
// sets *undecided and returns -1.
QC_HD int32_t qc_lns_pow_cmp_limited(uint64_t m, uint32_t g, int64_t n, int32_t max_limbs,
                                     bool* undecided) {
    int32_t tz = 63 - qc_clz64(m & (0 - m));
    if ((m >> tz) == 1) {
        // m = 2^tz: compare tz 2^g (< 2^64 for g <= 58) with n.
        int64_t lhs = (int64_t)tz << g;
        return lhs < n ? -1 : (lhs > n ? 1 : 0);
    }
    for (int32_t l = 2; l <= max_limbs; l *= 2) {
        int32_t c = qc_lns_interval_cmp(m, g, n, l);
        if (c != 0) return c;
    }
    *undecided = true;
    return -1;
}

// lns_exact.rs pow_cmp() (see the section comment for the cap).
QC_HD int32_t qc_lns_pow_cmp(uint64_t m, uint32_t g, int64_t n, bool* undecided) {
    return qc_lns_pow_cmp_limited(m, g, n, QC_LNS_MAX_LIMBS, undecided);
}

// lns_approx.rs LOG2_ERROR = 2^-44: the bound assumed on the log2 estimate's error.
#define QC_LNS_LOG2_ERROR_BITS 0x3D30000000000000ull

// lns_approx.rs EXP2_ERROR: the bound on exp2_fraction's error, in units of 2^-127.
#define QC_LNS_EXP2_ERROR 256

// lns_approx.rs log2_significand(): estimate of log2(m / 2^52) for 2^52 <= m < 2^53, the
// same f64 operations in the same order (constants as bits: 1/21 ... 1/3, sqrt 2, log2 e).
QC_HD double qc_lns_log2_significand(uint64_t m) {
    double v = qc_dmul((double)m, qc_f64_from_bits(0x3CB0000000000000ull));  // exact
    double offset = 0.0;
    if (v > qc_f64_from_bits(0x3FF6A09E667F3BCDull)) {
        v = qc_dmul(v, 0.5);
        offset = 1.0;
    }
    double s = qc_ddiv(qc_dsub(v, 1.0), qc_dadd(v, 1.0));
    double z = qc_dmul(s, s);
    double p = qc_f64_from_bits(0x3FA8618618618618ull);                   // 1/21
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FAAF286BCA1AF28ull));  // 1/19
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FAE1E1E1E1E1E1Eull));  // 1/17
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FB1111111111111ull));  // 1/15
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FB3B13B13B13B14ull));  // 1/13
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FB745D1745D1746ull));  // 1/11
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FBC71C71C71C71Cull));  // 1/9
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FC2492492492492ull));  // 1/7
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FC999999999999Aull));  // 1/5
    p = qc_dadd(qc_dmul(p, z), qc_f64_from_bits(0x3FD5555555555555ull));  // 1/3
    p = qc_dadd(qc_dmul(p, z), 1.0);
    double r = qc_dmul(qc_dmul(qc_dmul(2.0, s), p), qc_f64_from_bits(0x3FF71547652B82FEull));
    return qc_dadd(r, offset);
}

// lns_approx.rs EXP2_CONSTANTS[i - 1] = floor(2^127 * 2^(2^-i)) for i = 1..=30, as (hi, lo).
QC_HD void qc_lns_exp2_constant(int32_t i, uint64_t* hi, uint64_t* lo) {
    switch (i) {
    case 1: *hi = 0xb504f333f9de6484ull; *lo = 0x597d89b3754abe9full; return;
    case 2: *hi = 0x9837f0518db8a96full; *lo = 0x46ad23182e42f6f6ull; return;
    case 3: *hi = 0x8b95c1e3ea8bd6e6ull; *lo = 0xfbe4628758a53c90ull; return;
    case 4: *hi = 0x85aac367cc487b14ull; *lo = 0xc5c95b8c2154c1b2ull; return;
    case 5: *hi = 0x82cd8698ac2ba1d7ull; *lo = 0x3e2a475b46520bffull; return;
    case 6: *hi = 0x8164d1f3bc030773ull; *lo = 0x7be56527bd14def4ull; return;
    case 7: *hi = 0x80b1ed4fd999ab6cull; *lo = 0x25335719b6e6fd20ull; return;
    case 8: *hi = 0x8058d7d2d5e5f6b0ull; *lo = 0x94d589f608ee4aa2ull; return;
    case 9: *hi = 0x802c6436d0e04f50ull; *lo = 0xff8ce94a6797b3ceull; return;
    case 10: *hi = 0x8016302f17467628ull; *lo = 0x3690dfe44d11d008ull; return;
    case 11: *hi = 0x800b179c82028fd0ull; *lo = 0x945e54e2ae18f2f0ull; return;
    case 12: *hi = 0x80058baf7fee3b5dull; *lo = 0x1c718b38e549cb93ull; return;
    case 13: *hi = 0x8002c5d00fdcfcb6ull; *lo = 0xb6566a58c048be1full; return;
    case 14: *hi = 0x800162e61bed4a48ull; *lo = 0xe84c2e1a463473d9ull; return;
    case 15: *hi = 0x8000b17292f702a3ull; *lo = 0xaa22beacca949013ull; return;
    case 16: *hi = 0x800058b92abbae02ull; *lo = 0x030c5fa5256f41feull; return;
    case 17: *hi = 0x80002c5c8dade4d7ull; *lo = 0x1776c0f4dbea67d6ull; return;
    case 18: *hi = 0x8000162e44eaf636ull; *lo = 0x526be456600bdbe4ull; return;
    case 19: *hi = 0x80000b1721fa7c18ull; *lo = 0x8307016c1cd4e8b6ull; return;
    case 20: *hi = 0x8000058b90de7e4cull; *lo = 0xecfc487503488bb1ull; return;
    case 21: *hi = 0x800002c5c8678f36ull; *lo = 0xcbfce50a6de60b14ull; return;
    case 22: *hi = 0x80000162e431db9full; *lo = 0x80b2347b5d62e516ull; return;
    case 23: *hi = 0x800000b1721872d0ull; *lo = 0xc7b08cf1e0114152ull; return;
    case 24: *hi = 0x80000058b90c1aa8ull; *lo = 0xa5c3736cb77e8dffull; return;
    case 25: *hi = 0x8000002c5c8605a4ull; *lo = 0x635f2efc2362d978ull; return;
    case 26: *hi = 0x800000162e4300e6ull; *lo = 0x35cf4a109e3939bdull; return;
    case 27: *hi = 0x8000000b17217ff8ull; *lo = 0x1bef9c551590cf83ull; return;
    case 28: *hi = 0x800000058b90bfddull; *lo = 0x4e39cd52c0cfa27cull; return;
    case 29: *hi = 0x80000002c5c85fe6ull; *lo = 0xf72d669e0e76e411ull; return;
    case 30: *hi = 0x8000000162e42ff1ull; *lo = 0x8f9ad35186d0df28ull; return;

    default: *hi = 1ull << 63; *lo = 0; return;
    }
}

// lns_approx.rs mul_shift127(): floor(a * b / 2^127) for 128-bit a, b (as hi, lo) whose
// product is below 2^255.
QC_HD void qc_lns_mul_shift127(uint64_t* hi, uint64_t* lo, uint64_t bhi, uint64_t blo) {
    uint64_t a[2] = {*lo, *hi};
    uint64_t b[2] = {blo, bhi};
    uint64_t p[4];
    qc_limbs_mul(a, 2, b, 2, p);
    *lo = (p[1] >> 63) | (p[2] << 1);
    *hi = (p[2] >> 63) | (p[3] << 1);
}

// lns_approx.rs exp2_fraction(): a lower bound of 2^127 * 2^(r / 2^f) within
// QC_LNS_EXP2_ERROR units (r < 2^f, f <= 30), as (hi, lo).
QC_HD void qc_lns_exp2_fraction(uint64_t r, int32_t f, uint64_t* hi, uint64_t* lo) {
    *hi = 1ull << 63;
    *lo = 0;
    for (int32_t i = 1; i <= f; ++i) {
        if (((r >> (f - i)) & 1) == 1) {
            uint64_t chi, clo;
            qc_lns_exp2_constant(i, &chi, &clo);
            qc_lns_mul_shift127(hi, lo, chi, clo);
        }
    }
}

// lns.rs value_of(): the f64 nearest to 2^(k / 2^f) (Inf above f64's range, subnormal or
// zero below it).
QC_HD_CALL double qc_lns_value(int64_t k, int32_t f, bool* undecided) {
    int64_t q = k >= 0 ? (k >> f) : ~((~k) >> f);  // floor(k / 2^f)
    uint64_t r = (uint64_t)k & ((1ull << f) - 1);
    if (r == 0) return qc_pow2((int32_t)(q < -2000 ? -2000 : (q > 2000 ? 2000 : q)));
    if (q >= 1024) return qc_f64_from_bits(QC_F64_INF);
    // Significant bits available: 53, fewer for subnormals.
    int64_t p = q >= -1022 ? 53 : q + 1075;
    if (p <= 0) return p == 0 ? qc_pow2(-1074) : 0.0;
    uint64_t yhi, ylo;
    qc_lns_exp2_fraction(r, f, &yhi, &ylo);
    // s = 128 - p >= 75 discarded bits: kept = y >> s, rem = y mod 2^s, half = 2^(s-1),
    // all of whose set bits lie in the high word.
    int32_t sh = 64 - (int32_t)p;  // s - 64, in 11..=63
    uint64_t kept = yhi >> sh;
    uint64_t rem_hi = yhi & ((1ull << sh) - 1);
    uint64_t half_hi = 1ull << (sh - 1);
    bool up;
    if (rem_hi >= half_hi) {
        up = true;
    } else {
        // rem + EXP2_ERROR < half, in (hi, lo).
        uint64_t lo2 = ylo + QC_LNS_EXP2_ERROR;
        uint64_t hi2 = rem_hi + (lo2 < ylo ? 1 : 0);
        if (hi2 < half_hi) {
            up = false;
        } else {
            // Above the midpoint (2 kept + 1) / 2^p exactly when
            // (2 kept + 1)^(2^f) < 2^(r + p 2^f).
            up = qc_lns_pow_cmp(2 * kept + 1, (uint32_t)f, (int64_t)r + (p << f), undecided) < 0;
        }
    }
    uint64_t m = kept + (up ? 1 : 0);
    int32_t lsb = q >= -1022 ? (int32_t)q - 52 : -1074;
    if (m == (1ull << 53)) {
        m >>= 1;
        lsb += 1;
    }
    return qc_scale_count(m, lsb);  // m as f64 * pow2(lsb), Inf above f64's range
}

// lns.rs LnsCode as (kind, negative, k).
#define QC_LNS_ZERO 0
#define QC_LNS_NAN 1
#define QC_LNS_VALUE 2

// lns.rs LnsCode.
struct QcLnsCode {
    int32_t kind;
    bool negative;
    int64_t k;
};

// A QcLnsCode.
QC_HD QcLnsCode qc_lns_code(int32_t kind, bool negative, int64_t k) {
    QcLnsCode c;
    c.kind = kind;
    c.negative = negative;
    c.k = k;
    return c;
}

// Lns::k_max(): 2^(w-2) - 1 (k_min is its negative, the reserved field k_min - 1).
QC_HD int64_t qc_lns_k_max(int32_t w) { return ((int64_t)1 << (w - 2)) - 1; }

// lns.rs log_at_least(): whether log2(m / 2^52) >= b / 2^g, exactly (g <= 53).
QC_HD bool qc_lns_log_at_least(uint64_t m, uint32_t g, int64_t b, bool* undecided) {
    return qc_lns_pow_cmp(m, g, ((int64_t)52 << g) + b, undecided) >= 0;
}

// lns.rs floor_log(): j = floor(log2(m / 2^52) 2^f), exact, and an estimate phi of the
// fraction (within LOG2_ERROR 2^f).
QC_HD void qc_lns_floor_log(uint64_t m, int32_t f, int64_t* j_out, double* phi_out,
                            bool* undecided) {
    double scale = qc_pow2(f);
    double t = qc_dmul(qc_lns_log2_significand(m), scale);
    // t >= 0 (the estimate of log2 v is exactly 0 at v = 1 and positive above), so
    // truncation is floor, and t - floor(t) is exact.
    int64_t j = (int64_t)t;
    double phi = qc_dsub(t, (double)j);
    double eta = qc_dmul(qc_f64_from_bits(QC_LNS_LOG2_ERROR_BITS), scale);
    if (phi < eta && !qc_lns_log_at_least(m, (uint32_t)f, j, undecided)) {
        j -= 1;
        phi = qc_dadd(phi, 1.0);
    } else if (phi > qc_dsub(1.0, eta) && qc_lns_log_at_least(m, (uint32_t)f, j + 1, undecided)) {
        j += 1;
        phi = qc_dsub(phi, 1.0);
    }
    *j_out = j;
    *phi_out = phi;
}

// lns.rs above_threshold(): whether frac(t) >= num / 2^h (c its f64 value), j the exact
// floor of log2(m / 2^52) 2^f and phi its estimated fraction within eta.
QC_HD bool qc_lns_above_threshold(uint64_t m, int32_t f, int64_t j, int32_t h, uint64_t num,
                                  double phi, double c, double eta, bool* undecided) {
    double d = qc_dsub(phi, c);
    if (qc_f64_from_bits(qc_abs_bits(d)) > eta) return phi > c;
    return qc_lns_log_at_least(m, (uint32_t)(f + h), (j << h) + (int64_t)num, undecided);
}

// rounding.rs Stochastic::up_ratio(num, den) as Lns::stochastic_underflow calls it, for
// |x| / min = a_m / b_m * 2^shift (a_m, b_m in [2^52, 2^53), shift <= 1): up when
// R < floor(num 2^bits / den), R the top `bits` random bits, i.e. when
// (R + 1) den <= num 2^bits, compared in 128 bits.
QC_HD bool qc_lns_up_ratio(uint64_t a_m, uint64_t b_m, int32_t shift, uint32_t bits,
                           uint32_t random) {
    uint64_t r1 = (uint64_t)(random >> (32 - bits)) + 1;  // <= 2^23
    // Left (R + 1) b_m 2^ls against right a_m 2^rs.
    int32_t ls, rs;
    if (shift >= 0) {
        ls = 0;
        rs = (int32_t)bits + shift;
    } else {
        // (R + 1) b_m 2^-shift >= 2^(52 - shift) > a_m 2^bits when -shift > bits.
        if (-shift > (int32_t)bits) return false;
        ls = -shift;
        rs = (int32_t)bits;
    }
    // Both sides are below 2^100: left (R + 1) b_m < 2^76 shifted by at most 23, right
    // a_m < 2^53 shifted by at most 24.
    uint64_t lhi = qc_mulhi64(r1, b_m), llo = r1 * b_m;
    if (ls > 0) {
        lhi = (lhi << ls) | (llo >> (64 - ls));
        llo <<= ls;
    }
    uint64_t rhi = rs > 0 ? a_m >> (64 - rs) : 0, rlo = a_m << rs;
    return lhi < rhi || (lhi == rhi && llo <= rlo);
}

// Lns::round_code_stored(): the code of x rounded with r, for a result stored as f64
// (f32_storage false) or as f32 (the kept-values rule compares x with the stored value of
// the code above floor(t)). Sets *undecided if an exact comparison hit the precision cap.
QC_HD QcLnsCode qc_lns_round_code(int32_t w, int32_t f, double x, QcRounding r,
                                  uint32_t random, bool f32_storage, bool* undecided) {
    if (qc_is_nan(x)) return qc_lns_code(QC_LNS_NAN, false, 0);
    if (qc_is_zero(x)) return qc_lns_code(QC_LNS_ZERO, false, 0);
    bool negative = qc_sign(x);
    int64_t k_max = qc_lns_k_max(w), k_min = -k_max;
    if (qc_is_inf(x)) return qc_lns_code(QC_LNS_VALUE, negative, k_max);
    QcParts p = qc_parts(x);
    int64_t j;
    double phi;
    qc_lns_floor_log(p.m, f, &j, &phi, undecided);
    // floor(t) = e 2^f + j; phi estimates frac(t) within LOG2_ERROR 2^f.
    int64_t floor_t = (int64_t)p.e * ((int64_t)1 << f) + j;
    double eta = qc_dmul(qc_f64_from_bits(QC_LNS_LOG2_ERROR_BITS), qc_pow2(f));
    bool exact_integer = p.m == (1ull << 52);
    if (floor_t > k_max) return qc_lns_code(QC_LNS_VALUE, negative, k_max);
    // Kept values: an input equal to the stored value of floor(t) + 1 keeps that code. Only
    // codes of the format are kept: below k_min the input is not a value of it (the f32 of a
    // smaller power).
    if ((r.mode == QC_TOWARD_ZERO || r.mode == QC_STOCHASTIC) && phi > 0.5 && floor_t < k_max &&
        floor_t >= k_min - 1) {
        double v = qc_lns_value(floor_t + 1, f, undecided);
        if (f32_storage) v = qc_f32_round_trip(v);
        // Both nonnegative and not NaN: equal values have equal bits.
        if (qc_f64_bits(v) == qc_abs_bits(x)) return qc_lns_code(QC_LNS_VALUE, negative, floor_t + 1);
    }
    int64_t k;
    switch (r.mode) {
    case QC_TOWARD_ZERO: k = floor_t; break;
    case QC_STOCHASTIC: {
        if (floor_t < k_min) {
            // Lns::stochastic_underflow(): ±min with probability |x| / min64, else zero.
            double min = qc_lns_value(k_min, f, undecided);
            QcParts b = qc_parts(min);
            bool up = qc_lns_up_ratio(p.m, b.m, p.e - b.e, (uint32_t)r.bits, random);
            return up ? qc_lns_code(QC_LNS_VALUE, negative, k_min)
                      : qc_lns_code(QC_LNS_ZERO, false, 0);
        }
        uint32_t bits = (uint32_t)r.bits;
        uint64_t rr = (uint64_t)(random >> (32 - bits));
        double c = qc_scale_count(rr + 1, -(int32_t)bits);  // (r + 1) 2^-bits, exact
        bool up = !exact_integer &&
                  qc_lns_above_threshold(p.m, f, j, (int32_t)bits, rr + 1, phi, c, eta, undecided);
        k = floor_t + (up ? 1 : 0);
        break;
    }
    default: {  // nearest-even, nearest-away: no ties (see lns.rs)
        bool up = !exact_integer && qc_lns_above_threshold(p.m, f, j, 1, 1, phi, 0.5, eta, undecided);
        k = floor_t + (up ? 1 : 0);
        break;
    }
    }
    if (k > k_max) return qc_lns_code(QC_LNS_VALUE, negative, k_max);
    if (k >= k_min) return qc_lns_code(QC_LNS_VALUE, negative, k);
    // Underflow of a deterministic rule: the linear midpoint min / 2, log floor half_min.
    int64_t half_min = k_min - ((int64_t)1 << f);
    bool to_min;
    if (r.mode == QC_TOWARD_ZERO) to_min = false;
    else if (floor_t > half_min) to_min = true;
    else if (floor_t < half_min) to_min = false;
    else if (r.mode == QC_NEAREST_AWAY) to_min = true;  // the tie, when t is an integer
    else to_min = !exact_integer;
    return to_min ? qc_lns_code(QC_LNS_VALUE, negative, k_min) : qc_lns_code(QC_LNS_ZERO, false, 0);
}

// Lns::code_value(): zero, NaN or ±2^(k / 2^f).
QC_HD double qc_lns_code_value(int32_t f, QcLnsCode c, bool* undecided) {
    if (c.kind == QC_LNS_ZERO) return 0.0;
    if (c.kind == QC_LNS_NAN) return qc_f64_from_bits(QC_F64_NAN);
    return qc_with_sign(qc_lns_value(c.k, f, undecided), c.negative);
}

// Lns::code_pattern(): sign in bit w-1, k in the low w-1 bits (two's complement); zero is
// the reserved field with sign 0, NaN with sign 1.
QC_HD uint32_t qc_lns_code_pattern(int32_t w, QcLnsCode c) {
    uint32_t sign = 1u << (w - 1);
    uint32_t reserved = (uint32_t)(-qc_lns_k_max(w) - 1);
    if (c.kind == QC_LNS_ZERO) return reserved & (sign - 1);
    if (c.kind == QC_LNS_NAN) return sign | (1u << (w - 2));
    return (c.negative ? sign : 0) | ((uint32_t)c.k & (sign - 1));
}

// Lns::pattern_code(): the code of a w-bit pattern (upper bits ignored).
QC_HD QcLnsCode qc_lns_pattern_code(int32_t w, uint32_t pattern) {
    uint32_t mask = 0xFFFFFFFFu >> (32 - w);
    uint32_t p = pattern & mask;
    bool negative = (p >> (w - 1)) == 1;
    // Sign-extend the (w-1)-bit field: bit w-2 is its sign.
    uint32_t field = p & ((1u << (w - 1)) - 1);
    uint32_t top = 1u << (w - 2);
    int64_t k = (int64_t)(field ^ top) - (int64_t)top;
    if (k == -qc_lns_k_max(w) - 1)
        return negative ? qc_lns_code(QC_LNS_NAN, false, 0) : qc_lns_code(QC_LNS_ZERO, false, 0);
    return qc_lns_code(QC_LNS_VALUE, negative, k);
}

// Lns::round_stored() (f32_storage: the f32 tensors' kept values).
QC_HD_CALL double qc_lns_round(int32_t w, int32_t f, double x, QcRounding r, uint32_t random,
                          bool f32_storage, bool* undecided) {
    QcLnsCode c = qc_lns_round_code(w, f, x, r, random, f32_storage, undecided);
    return qc_lns_code_value(f, c, undecided);
}

// Lns::encode(): the pattern of x rounded to nearest.
QC_HD_CALL uint32_t qc_lns_encode(int32_t w, int32_t f, double x, bool* undecided) {
    QcRounding ne = {QC_NEAREST_EVEN, 0};
    return qc_lns_code_pattern(w, qc_lns_round_code(w, f, x, ne, 0, false, undecided));
}

// Lns::decode(): the value of a w-bit pattern (upper bits ignored); NaN for the NaN pattern.
QC_HD_CALL double qc_lns_decode(int32_t w, int32_t f, uint32_t pattern, bool* undecided) {
    return qc_lns_code_value(f, qc_lns_pattern_code(w, pattern), undecided);
}

// ---------------------------------------------------------------------------------------
// Dispatch (mod.rs).

// Format::round() for every family but lns: one value; block floating point treats x as a
// block of its own (block_max([x]) = |x| for finite x).
QC_HD double qc_round_base(double x, QcFormat f, QcRounding r, uint32_t random) {
    switch (f.family) {
    case QC_POSIT: return qc_posit_round(f.a, f.b, x, r, random);
    case QC_FLOAT: return qc_float_round(f.a, f.b, f.flags, x, r, random);
    case QC_FIXED: return qc_fixed_round(f.a, f.b, f.flags, x, r, random);
    case QC_MX: {
        double amax = qc_f64_from_bits(qc_abs_bits(x));
        return qc_mx_round(x, f.a, qc_mx_scale(amax, qc_mx_emax(f.a)), r, random);
    }
    case QC_NVFP4: {
        double amax = qc_f64_from_bits(qc_abs_bits(x));
        double s_t = qc_nvfp4_tensor_scale(qc_is_finite(x) ? amax : 0.0);
        return qc_nvfp4_round(x, qc_nvfp4_block_scale(amax, s_t), s_t, r, random);
    }
    default: {
        double block_max = qc_is_finite(x) ? qc_f64_from_bits(qc_abs_bits(x)) : 0.0;
        return qc_round_block(x, f.a, block_max, r, random);
    }
    }
}

// Format::round() for a result stored as f32 (f32_storage) or f64. The storage type matters
// only to lns (its kept-values rule: lns.rs round_stored with the CPU kernel's
// `T::from_f64(v).to_f64()`). Sets *undecided where an lns comparison hit the precision cap
// of qc_lns_pow_cmp (the result is then not to be used).
QC_HD double qc_round_stored(double x, QcFormat f, QcRounding r, uint32_t random,
                             bool f32_storage, bool* undecided) {
    if (f.family == QC_LNS) return qc_lns_round(f.a, f.b, x, r, random, f32_storage, undecided);
    return qc_round_base(x, f, r, random);
}

// Format::round(): qc_round_stored for an f64 result, ignoring *undecided.
QC_HD double qc_round(double x, QcFormat f, QcRounding r, uint32_t random) {
    bool undecided = false;
    return qc_round_stored(x, f, r, random, false, &undecided);
}

// Whether qc_encode has no pattern for x (pack's error): NaN in a fin float format, and every
// value of the fixed and block families.
QC_HD bool qc_encode_fails(double x, QcFormat f) {
    switch (f.family) {
    case QC_POSIT: return false;
    case QC_FLOAT: return qc_float_encode_fails(f.flags, x);
    case QC_LNS: return false;
    default: return true;
    }
}

// ops/pack.rs encode(): Posit::encode / Float::encode / Lns::encode (QC_NO_PATTERN where
// those fail); sets *undecided as qc_round_stored does.
QC_HD uint32_t qc_encode_checked(double x, QcFormat f, bool* undecided) {
    switch (f.family) {
    case QC_POSIT: return qc_posit_encode(f.a, f.b, x);
    case QC_FLOAT: return qc_float_encode(f.a, f.b, f.flags, x);
    case QC_LNS: return qc_lns_encode(f.a, f.b, x, undecided);
    default: return QC_NO_PATTERN;
    }
}

// qc_encode_checked, ignoring *undecided.
QC_HD uint32_t qc_encode(double x, QcFormat f) {
    bool undecided = false;
    return qc_encode_checked(x, f, &undecided);
}

// ops/pack.rs decode(): Posit::decode / Float::decode / Lns::decode (NaN for the other
// families); sets *undecided as qc_round_stored does.
QC_HD double qc_decode_checked(uint32_t pattern, QcFormat f, bool* undecided) {
    switch (f.family) {
    case QC_POSIT: return qc_posit_decode(f.a, f.b, pattern);
    case QC_FLOAT: return qc_float_decode(f.a, f.b, f.flags, pattern);
    case QC_LNS: return qc_lns_decode(f.a, f.b, pattern, undecided);
    default: return qc_f64_from_bits(QC_F64_NAN);
    }
}

// qc_decode_checked, ignoring *undecided.
QC_HD double qc_decode(uint32_t pattern, QcFormat f) {
    bool undecided = false;
    return qc_decode_checked(pattern, f, &undecided);
}

// ---------------------------------------------------------------------------------------
// Random bits (philox.rs).

// philox.rs philox4x32_10(): Philox4x32 with 10 rounds.
QC_HD void qc_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += W0;
            k1 += W1;
        }
        uint64_t p0 = (uint64_t)M0 * c0;
        uint64_t p1 = (uint64_t)M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// philox.rs Stream::new(seed, call).at(index): word index % 4 of
// philox([index / 4 lo, hi, call lo, hi], [seed lo, hi]).
QC_HD uint32_t qc_random(uint64_t seed, uint64_t call, uint64_t index) {
    uint64_t block = index >> 2;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)call,
                       (uint32_t)(call >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    qc_philox4x32_10(ctr, key, out);
    return out[index & 3];
}

#endif // QCANDLE_QUANT_CUH
