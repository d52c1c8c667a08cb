// Per-element rounding math of every format and rounding mode, as __host__ __device__
// functions. This is the Rust GENERAL path of src/format/ (grid.rs, rounding.rs, posit.rs,
// float.rs, fixed.rs, block.rs, mod.rs) and src/philox.rs written again in integer C++: every
// function says which Rust function it mirrors, and tests/cuda_host.rs compares the host
// build of this header (cuda/host_shim.cpp) with the Rust code bit for bit.
//
// Integer-only: values are taken apart and put together through their bits; the only f64
// operations are bit casts. Nothing here depends on FMA contraction or on the device's
// floating-point modes, so host and device give the same bits.
//
// Formats and rounding modes are passed as plain structs (QcFormat, QcRounding) built on the
// host from a validated Rust `Format`/`Rounding`; the functions assume valid parameters (the
// ranges checked by Posit::new, Float::with_options, Fixed::with_options, Block::new and
// Rounding::stochastic).
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
// Dispatch (mod.rs).

// Format::round(): one value; block floating point treats x as a block of its own
// (block_max([x]) = |x| for finite x).
QC_HD double qc_round(double x, QcFormat f, QcRounding r, uint32_t random) {
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

// Whether qc_encode has no pattern for x (pack's error): NaN in a fin float format, and every
// value of the fixed and block families.
QC_HD bool qc_encode_fails(double x, QcFormat f) {
    switch (f.family) {
    case QC_POSIT: return false;
    case QC_FLOAT: return qc_float_encode_fails(f.flags, x);
    default: return true;
    }
}

// ops/pack.rs encode(): Posit::encode / Float::encode (QC_NO_PATTERN where those fail).
QC_HD uint32_t qc_encode(double x, QcFormat f) {
    switch (f.family) {
    case QC_POSIT: return qc_posit_encode(f.a, f.b, x);
    case QC_FLOAT: return qc_float_encode(f.a, f.b, f.flags, x);
    default: return QC_NO_PATTERN;
    }
}

// ops/pack.rs decode(): Posit::decode / Float::decode (NaN for the other families).
QC_HD double qc_decode(uint32_t pattern, QcFormat f) {
    switch (f.family) {
    case QC_POSIT: return qc_posit_decode(f.a, f.b, pattern);
    case QC_FLOAT: return qc_float_decode(f.a, f.b, f.flags, pattern);
    default: return qc_f64_from_bits(QC_F64_NAN);
    }
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
