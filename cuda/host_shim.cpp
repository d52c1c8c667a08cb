// extern "C" wrappers over quant.cuh compiled for the host (build.rs, with the cc crate), so
// that tests/cuda_host.rs can compare the CUDA kernels' per-element math with the Rust code
// bit for bit on a machine without a GPU. The batch versions loop over arrays to keep the
// FFI overhead low. Formats and rounding modes are passed as the ints of QcFormat and
// QcRounding (see quant.cuh).
#include <stddef.h>
#include <stdint.h>

// How many interval comparisons qc_lns_pow_cmp ran at each precision on the calling thread
// (index: log2 of the limb count, 1..=4 for 2..=16 limbs).
static __thread uint64_t qc_lns_squarings[8];
#define QC_LNS_COUNT(limbs) (qc_lns_squarings[63 - __builtin_clzll((uint64_t)(limbs))] += 1)

#include "quant.cuh"

static QcFormat qc_host_format(int32_t family, int32_t a, int32_t b, int32_t flags) {
    QcFormat f = {family, a, b, flags};
    return f;
}

static QcRounding qc_host_rounding(int32_t mode, int32_t bits) {
    QcRounding r = {mode, bits};
    return r;
}

extern "C" {

// qc_round on one value.
double qc_host_round(double x, int32_t family, int32_t a, int32_t b, int32_t flags,
                     int32_t mode, int32_t bits, uint32_t random) {
    return qc_round(x, qc_host_format(family, a, b, flags), qc_host_rounding(mode, bits), random);
}

// qc_round on x[0..n) into out; random[i] for element i (all 0 when random is null).
void qc_host_round_batch(const double* x, const uint32_t* random, double* out, size_t n,
                         int32_t family, int32_t a, int32_t b, int32_t flags, int32_t mode,
                         int32_t bits) {
    QcFormat f = qc_host_format(family, a, b, flags);
    QcRounding r = qc_host_rounding(mode, bits);
    for (size_t i = 0; i < n; ++i) out[i] = qc_round(x[i], f, r, random ? random[i] : 0);
}

// qc_round_block on one value.
double qc_host_round_block(double x, int32_t wl, double block_max, int32_t mode, int32_t bits,
                           uint32_t random) {
    return qc_round_block(x, wl, block_max, qc_host_rounding(mode, bits), random);
}

// qc_round_block on x[0..n) (one block, maximum block_max) into out.
void qc_host_round_block_batch(const double* x, const uint32_t* random, double* out, size_t n,
                               int32_t wl, double block_max, int32_t mode, int32_t bits) {
    QcRounding r = qc_host_rounding(mode, bits);
    for (size_t i = 0; i < n; ++i)
        out[i] = qc_round_block(x[i], wl, block_max, r, random ? random[i] : 0);
}

// qc_encode on one value.
uint32_t qc_host_encode(double x, int32_t family, int32_t a, int32_t b, int32_t flags) {
    return qc_encode(x, qc_host_format(family, a, b, flags));
}

// qc_encode_fails on one value (1 when there is no pattern).
int32_t qc_host_encode_fails(double x, int32_t family, int32_t a, int32_t b, int32_t flags) {
    return qc_encode_fails(x, qc_host_format(family, a, b, flags)) ? 1 : 0;
}

// qc_encode on x[0..n) into out.
void qc_host_encode_batch(const double* x, uint32_t* out, size_t n, int32_t family, int32_t a,
                          int32_t b, int32_t flags) {
    QcFormat f = qc_host_format(family, a, b, flags);
    for (size_t i = 0; i < n; ++i) out[i] = qc_encode(x[i], f);
}

// qc_decode on one pattern.
double qc_host_decode(uint32_t pattern, int32_t family, int32_t a, int32_t b, int32_t flags) {
    return qc_decode(pattern, qc_host_format(family, a, b, flags));
}

// qc_decode on patterns[0..n) into out.
void qc_host_decode_batch(const uint32_t* patterns, double* out, size_t n, int32_t family,
                          int32_t a, int32_t b, int32_t flags) {
    QcFormat f = qc_host_format(family, a, b, flags);
    for (size_t i = 0; i < n; ++i) out[i] = qc_decode(patterns[i], f);
}

// qc_philox4x32_10.
void qc_host_philox4x32_10(const uint32_t* ctr, const uint32_t* key, uint32_t* out) {
    qc_philox4x32_10(ctr, key, out);
}

// qc_random for one element.
uint32_t qc_host_random(uint64_t seed, uint64_t call, uint64_t index) {
    return qc_random(seed, call, index);
}

// qc_random for elements first_index .. first_index + n (index wraps around 2^64).
void qc_host_random_batch(uint64_t seed, uint64_t call, uint64_t first_index, uint32_t* out,
                          size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = qc_random(seed, call, first_index + i);
}

// qc_round_stored on x[0..n) into out (f32_storage 0 or 1); random[i] for element i;
// undecided[i] = 1 where the exact comparison hit its precision cap.
void qc_host_round_stored_batch(const double* x, const uint32_t* random, double* out,
                                uint8_t* undecided, size_t n, int32_t family, int32_t a,
                                int32_t b, int32_t flags, int32_t mode, int32_t bits,
                                int32_t f32_storage) {
    QcFormat f = qc_host_format(family, a, b, flags);
    QcRounding r = qc_host_rounding(mode, bits);
    for (size_t i = 0; i < n; ++i) {
        bool u = false;
        out[i] = qc_round_stored(x[i], f, r, random[i], f32_storage != 0, &u);
        undecided[i] = u ? 1 : 0;
    }
}

// qc_lns_value(k, f) for k[0..n) into out; undecided[i] as above.
void qc_host_lns_value_batch(const int64_t* k, double* out, uint8_t* undecided, size_t n,
                             int32_t f) {
    for (size_t i = 0; i < n; ++i) {
        bool u = false;
        out[i] = qc_lns_value(k[i], f, &u);
        undecided[i] = u ? 1 : 0;
    }
}

// qc_lns_pow_cmp_limited: -1, 0, 1, or 2 when undecided at max_limbs limbs.
int32_t qc_host_lns_pow_cmp(uint64_t m, uint32_t g, int64_t n, int32_t max_limbs) {
    bool u = false;
    int32_t c = qc_lns_pow_cmp_limited(m, g, n, max_limbs, &u);
    return u ? 2 : c;
}

// qc_lns_log2_significand.
double qc_host_lns_log2_significand(uint64_t m) { return qc_lns_log2_significand(m); }

// The calling thread's counters of QC_LNS_COUNT: out[i] interval comparisons with 2^i limbs
// (i < 8).
void qc_host_lns_counts(uint64_t* out) {
    for (int i = 0; i < 8; ++i) out[i] = qc_lns_squarings[i];
}

// qc_lns_interval_cmp with `limbs` limbs (1..=QC_LNS_MAX_LIMBS): -1, 1, or 0 when undecided.
int32_t qc_host_lns_interval_cmp(uint64_t m, uint32_t g, int64_t n, int32_t limbs) {
    return qc_lns_interval_cmp(m, g, n, limbs);
}

// qc_mx_scale: the scale exponent of a block of maximum amax (QC_MX_SCALE_NAN: NaN block).
int32_t qc_host_mx_scale(double amax, int32_t code) { return qc_mx_scale(amax, qc_mx_emax(code)); }

// qc_mx_round on x[0..n) (one block of scale exponent `scale`) into out.
void qc_host_mx_round_batch(const double* x, const uint32_t* random, double* out, size_t n,
                            int32_t code, int32_t scale, int32_t mode, int32_t bits) {
    QcRounding r = qc_host_rounding(mode, bits);
    for (size_t i = 0; i < n; ++i)
        out[i] = qc_mx_round(x[i], code, scale, r, random ? random[i] : 0);
}

// qc_nvfp4_tensor_scale.
double qc_host_nvfp4_tensor_scale(double amax) { return qc_nvfp4_tensor_scale(amax); }

// qc_nvfp4_block_scale.
double qc_host_nvfp4_block_scale(double amax, double s_t) { return qc_nvfp4_block_scale(amax, s_t); }

// qc_nvfp4_round on x[0..n) (one block, scales s_b and s_t) into out.
void qc_host_nvfp4_round_batch(const double* x, const uint32_t* random, double* out, size_t n,
                               double s_b, double s_t, int32_t mode, int32_t bits) {
    QcRounding r = qc_host_rounding(mode, bits);
    for (size_t i = 0; i < n; ++i)
        out[i] = qc_nvfp4_round(x[i], s_b, s_t, r, random ? random[i] : 0);
}

}  // extern "C"
