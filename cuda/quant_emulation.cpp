// Host emulation of the kernels in quant.cu, for machines without a GPU (tests/cuda_emulation.rs
// compiles and runs it with the host C++ compiler).
//
// The CUDA built-ins the kernels use are defined for one sequential host thread (warps of one
// lane, atomics as plain read-modify-writes); each kernel then runs thread by thread over a
// small grid (several blocks, so the grid-stride loops wrap), and its output is compared with
// a straightforward per-element reference written from quant.cuh: qc_round / qc_round_block of
// logical element i with random word qc_random(seed, call, i), block maxima by a plain loop,
// qc_encode / qc_decode for pack and unpack. That checks what the kernels add to quant.cuh
// (the 4-elements-per-thread mapping and its Philox words, vector and scalar paths, tails,
// unaligned starts, strided gathers and in-place scatters, empty tensors, block grouping and
// maxima, pack and unpack errors); quant.cuh itself is compared with the Rust kernels by
// tests/cuda_host.rs.
// Prints "<checks> checks, <failures> failures" and exits nonzero on any failure.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <math.h>
#define QC_WARP_SIZE 1
#define __global__
#define __launch_bounds__(...)
struct Dim { unsigned x, y, z; };
static Dim threadIdx, blockIdx, gridDim, blockDim;
struct float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
static inline double2 make_double2(double a, double b) { double2 r = {a, b}; return r; }
static inline float __double2float_rn(double v) { return (float)v; }
static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) { unsigned long long o = *p; if (v > o) *p = v; return o; }
static inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) { unsigned long long o = *p; if (v < o) *p = v; return o; }
static inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int) { return v; }
template <typename V> static inline V __shfl_down_sync(unsigned, V v, int) { return v; }
template <typename V> static inline V __shfl_up_sync(unsigned, V v, int) { return v; }
#include "quant.cu"

template <typename F> static void launch(unsigned blocks, unsigned threads, F f) {
    gridDim = {blocks, 1, 1}; blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < blocks; ++b) for (unsigned t = 0; t < threads; ++t) {
        blockIdx = {b, 1, 1}; threadIdx = {t, 0, 0}; f();
    }
}
static uint64_t st = 0x9E3779B97F4A7C15ull;
static uint64_t rnd() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float fbits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bitsf(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint64_t bitsd(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
static int failures = 0;

// Reference: logical element i of a (d0,d1,d2) tensor stored with strides s.
struct L { uint64_t dims[3]; uint64_t strides[3]; uint64_t start; };
static uint64_t off(const L& l, uint64_t i) { uint64_t c2 = i % l.dims[2], c1 = (i / l.dims[2]) % l.dims[1], c0 = i / (l.dims[2] * l.dims[1]); return l.start + c0 * l.strides[0] + c1 * l.strides[1] + c2 * l.strides[2]; }

template <typename T> static double widen_ref(T x) { return qc_widen(x); }

template <typename T>
static void check(const char* what, QcFormat f, QcRounding r, L l, bool contiguous, int block_dim, bool inplace) {
    uint64_t n = l.dims[0] * l.dims[1] * l.dims[2];
    size_t storage = l.start + 4 + (l.dims[0]) * l.dims[1] * l.dims[2] * 2 + 64;
    std::vector<T> buf(storage + 8);
    // 16-byte aligned base
    T* base = (T*)(((uintptr_t)buf.data() + 15) & ~(uintptr_t)15);
    size_t cap = storage;
    std::vector<T> data(cap);
    for (size_t k = 0; k < cap; ++k) {
        uint64_t q = rnd();
        float v;
        if (q % 5 == 0) v = fbits((uint32_t)(q >> 20));
        else { int e = (int)((q >> 8) % 40) - 20; v = (1.0f + (float)(q >> 40) / 16777216.0f) * ldexpf(1.0f, e); if (q & 16) v = -v; }
        if (k % 97 == 3) v = fbits(0x7F800001u); if (k % 89 == 5) v = -0.0f; if (k % 83 == 7) v = fbits(0xFF800000u);
        data[k] = (T)v;
    }
    memcpy(base, data.data(), cap * sizeof(T));
    uint64_t seed = 0x1234567890ull, call = 0x100000003ull;
    uint64_t inner = 1, count = 1;
    if (block_dim >= 0) { count = l.dims[block_dim]; inner = 1; for (int d = block_dim + 1; d < 3; ++d) inner *= l.dims[d]; }
    // As the host passes them (cpu::BlockGrid): at least 1, also for an empty tensor.
    if (inner == 0) inner = 1;
    if (count == 0) count = 1;
    // reference maxima
    std::vector<unsigned long long> maxima_ref(count, 0), maxima(count, 0);
    if (f.family == QC_BLOCK) for (uint64_t i = 0; i < n; ++i) { double x = widen_ref(data[off(l, i)]); if (!qc_is_finite(x)) continue; uint64_t b = (i / inner) % count; uint64_t a = qc_abs_bits(x); if (a > maxima_ref[b]) maxima_ref[b] = a; }
    uint64_t info[6] = {l.dims[0], l.dims[1], l.dims[2], l.strides[0], l.strides[1], l.strides[2]};
    const uint64_t* ip = contiguous ? nullptr : info;
    T* src = base + l.start;
    if (f.family == QC_BLOCK) {
        launch(3, 5, [&] { qc_block_max<T>(src, n, 3, ip, inner, count, maxima.data()); });
        for (uint64_t b = 0; b < count; ++b) if (maxima[b] != maxima_ref[b]) { printf("%s: maxima[%llu] %llx vs %llx\n", what, (unsigned long long)b, maxima[b], maxima_ref[b]); failures++; return; }
    }
    std::vector<T> out(n + 4);
    T* dst = inplace ? src : (T*)(((uintptr_t)out.data() + 15) & ~(uintptr_t)15);
    uint32_t undecided = 0;
    QcQuantArgs a = {f, r, seed, call, maxima.data(), inner, count, &undecided};
    if (f.family == QC_LNS) launch(2, 7, [&] { qc_quantize<T, true>(dst, inplace ? nullptr : src, n, 3, ip, inplace && !contiguous, a); });
    else launch(2, 7, [&] { qc_quantize<T>(dst, inplace ? nullptr : src, n, 3, ip, inplace && !contiguous, a); });
    if (undecided) { printf("%s: undecided lns comparison\n", what); failures++; return; }
    for (uint64_t i = 0; i < n; ++i) {
        double x = widen_ref(data[off(l, i)]);
        uint32_t rw = r.mode == QC_STOCHASTIC ? qc_random(seed, call, i) : 0;
        bool u = false;  // lns: the kept values of the storage type T
        double y = f.family == QC_BLOCK ? qc_round_block(x, f.a, qc_f64_from_bits(maxima_ref[(i / inner) % count]), r, rw) : qc_round_stored(x, f, r, rw, sizeof(T) == 4, &u);
        T want = qc_narrow<T>(y);
        T got = inplace ? base[off(l, i)] : dst[i];
        if (memcmp(&want, &got, sizeof(T)) != 0) { printf("%s: element %llu differs\n", what, (unsigned long long)i); failures++; return; }
    }
    if (inplace) { // untouched elements outside the view
        std::vector<char> touched(cap, 0); for (uint64_t i = 0; i < n; ++i) touched[off(l, i)] = 1;
        for (size_t k = 0; k < cap; ++k) if (!touched[k] && memcmp(&base[k], &data[k], sizeof(T))) { printf("%s: storage %zu changed\n", what, k); failures++; return; }
    }
}

// The block-scaled kernels (MX, NVFP4): qc_scaled_amax, qc_scaled_scales, qc_quantize_scaled
// against a reference that finds each element's block from its coordinates (the axis
// coordinate divided by the block size, the others kept), its maximum by a plain loop and
// its value by quant.cuh's qc_mx_round / qc_nvfp4_round.
template <typename T>
static void check_scaled(const char* what, QcFormat f, QcRounding r, L l, bool contiguous, int axis, uint64_t size, bool inplace) {
    uint64_t n = l.dims[0] * l.dims[1] * l.dims[2];
    size_t cap = l.start + 4 + n * 2 + 64;
    std::vector<T> buf(cap + 8);
    T* base = (T*)(((uintptr_t)buf.data() + 15) & ~(uintptr_t)15);
    std::vector<T> data(cap);
    for (size_t k = 0; k < cap; ++k) {
        uint64_t q = rnd();
        int e = (int)((q >> 8) % 40) - 20;
        float v = (1.0f + (float)(q >> 40) / 16777216.0f) * ldexpf(1.0f, e);
        if (q & 16) v = -v;
        if (k % 97 == 3) v = fbits(0x7F800001u); if (k % 89 == 5) v = -0.0f; if (k % 151 == 7) v = fbits(0xFF800000u);
        data[k] = (T)v;
    }
    memcpy(base, data.data(), cap * sizeof(T));
    uint64_t seed = 0x1234567890ull, call = 0x100000003ull;
    // The grid as the host passes it (mx.rs MxGrid): every field at least 1.
    uint64_t len = l.dims[axis] ? l.dims[axis] : 1, inner = 1, outer = 1;
    for (int d = axis + 1; d < 3; ++d) inner *= l.dims[d];
    for (int d = 0; d < axis; ++d) outer *= l.dims[d];
    if (inner == 0) inner = 1;
    if (outer == 0) outer = 1;
    QcScaledGrid g = {size, len, inner, (len + size - 1) / size};
    uint64_t count = outer * g.along * inner;
    // Reference blocks from coordinates.
    uint64_t rd[3] = {l.dims[0], l.dims[1], l.dims[2]};
    rd[axis] = (rd[axis] + size - 1) / size;
    std::vector<double> amax_ref(rd[0] * rd[1] * rd[2] + 1, 0.0);
    double tensor_max = 0.0;
    auto ref_block = [&](uint64_t i) {
        uint64_t c[3] = {i / (l.dims[1] * l.dims[2]), (i / l.dims[2]) % l.dims[1], i % l.dims[2]};
        c[axis] /= size;
        return (c[0] * rd[1] + c[1]) * rd[2] + c[2];
    };
    for (uint64_t i = 0; i < n; ++i) {
        double x = widen_ref(data[off(l, i)]);
        double m = qc_is_finite(x) ? qc_f64_from_bits(qc_abs_bits(x)) : qc_f64_from_bits(QC_F64_INF);
        uint64_t b = ref_block(i);
        if (m > amax_ref[b]) amax_ref[b] = m;
        if (qc_is_finite(x) && m > tensor_max) tensor_max = m;
    }
    double s_t = qc_nvfp4_tensor_scale(tensor_max);
    uint64_t info[6] = {l.dims[0], l.dims[1], l.dims[2], l.strides[0], l.strides[1], l.strides[2]};
    const uint64_t* ip = contiguous ? nullptr : info;
    T* src = base + l.start;
    std::vector<unsigned long long> scales(count + 1, 0);
    launch(3, 5, [&] { qc_scaled_amax<T>(src, n, 3, ip, g, count, scales.data()); });
    launch(2, 3, [&] { qc_scaled_scales(f, count, scales.data()); });
    std::vector<T> out(n + 4);
    T* dst = inplace ? src : (T*)(((uintptr_t)out.data() + 15) & ~(uintptr_t)15);
    QcQuantArgs a = {f, r, seed, call, scales.data(), 1, 1};
    launch(2, 7, [&] { qc_quantize_scaled<T>(dst, inplace ? nullptr : src, n, 3, ip, inplace && !contiguous, a, g); });
    for (uint64_t i = 0; i < n; ++i) {
        double x = widen_ref(data[off(l, i)]);
        uint32_t rw = r.mode == QC_STOCHASTIC ? qc_random(seed, call, i) : 0;
        double m = amax_ref[ref_block(i)];
        double y = f.family == QC_MX
            ? qc_mx_round(x, f.a, qc_mx_scale(m, qc_mx_emax(f.a)), r, rw)
            : qc_nvfp4_round(x, qc_nvfp4_block_scale(m, s_t), s_t, r, rw);
        T want = qc_narrow<T>(y);
        T got = inplace ? base[off(l, i)] : dst[i];
        if (memcmp(&want, &got, sizeof(T)) != 0) { printf("%s: element %llu differs\n", what, (unsigned long long)i); failures++; return; }
    }
}

int main() {
    QcFormat formats[] = {{0, 8, 0, 0}, {0, 16, 1, 0}, {0, 32, 2, 0}, {1, 4, 3, 1 | (1 << 2)}, {1, 5, 2, 1}, {1, 8, 7, 1}, {1, 2, 1, 1 | 2 | (2 << 2)}, {2, 8, 4, 1}, {2, 16, 8, 0}, {3, 8, 0, 0}, {3, 4, 0, 0}, {6, 8, 3, 0}, {6, 16, 10, 0}, {6, 32, 23, 0}};
    QcRounding roundings[] = {{0, 0}, {1, 0}, {2, 0}, {3, 23}, {3, 4}};
    L layouts[] = {
        {{3, 5, 7}, {35, 7, 1}, 0},    // contiguous, aligned, 105 elements (tail)
        {{3, 5, 7}, {35, 7, 1}, 1},    // contiguous, unaligned start
        {{4, 4, 8}, {32, 8, 1}, 0},    // contiguous multiple of 4
        {{3, 7, 5}, {35, 1, 7}, 0},    // transposed
        {{2, 3, 9}, {60, 12, 1}, 5},   // sliced
        {{2, 0, 3}, {0, 3, 1}, 0},     // empty, contiguous
        {{4, 3, 0}, {0, 0, 1}, 1},     // empty innermost dimension, unaligned start
        {{3, 0, 5}, {1, 15, 3}, 2},    // empty, strided
    };
    const bool contiguous_layout[] = {true, true, true, false, false, true, true, false};
    const int n_layouts = sizeof layouts / sizeof layouts[0];
    int checks = 0;
    for (auto f : formats) for (auto r : roundings) for (int li = 0; li < n_layouts; ++li) for (int inplace = 0; inplace < 2; ++inplace) {
        L l = layouts[li];
        bool contiguous = contiguous_layout[li];
        int dims[] = {-1, 0, 1, 2};
        for (int bd : dims) {
            if (f.family != QC_BLOCK && bd >= 0) continue;
            char what[200];
            snprintf(what, sizeof what, "fam %d a %d b %d fl %d | mode %d bits %d | layout %d inplace %d dim %d", f.family, f.a, f.b, f.flags, r.mode, r.bits, li, inplace, bd);
            check<float>(what, f, r, l, contiguous, bd, inplace); 
            check<double>(what, f, r, l, contiguous, bd, inplace);
            checks += 2;
        }
    }
    // pack / unpack
    for (auto f : formats) {
        if (f.family == QC_FIXED || f.family == QC_BLOCK) continue;
        int nb = f.family == QC_FLOAT ? 1 + f.a + f.b : f.a;
        std::vector<float> x(103); for (auto& v : x) { uint64_t q = rnd(); v = (float)((int64_t)(q % 2000) - 1000) / 37.0f; }
        std::vector<uint32_t> p(103); uint32_t failed = 0;
        launch(2, 5, [&] { qc_pack<float, uint32_t>(p.data(), x.data(), 103, f, &failed); });
        for (int i = 0; i < 103; ++i) if (p[i] != qc_encode(qc_widen(x[i]), f)) { printf("pack differs\n"); failures++; }
        std::vector<uint32_t> pats(100); for (int i = 0; i < 100; ++i) pats[i] = (uint32_t)(rnd() & ((nb == 32) ? 0xFFFFFFFFu : ((1u << nb) - 1)));
        if (nb < 32) pats[57] |= 1u << nb, pats[80] |= 1u << nb;
        std::vector<double> vals(100); unsigned long long bad = ~0ull;
        launch(3, 3, [&] { qc_unpack<uint32_t, double>(vals.data(), pats.data(), 100, f, nb, &bad); });
        for (int i = 0; i < 100; ++i) if (!(nb < 32 && (pats[i] >> nb)) && bitsd(vals[i]) != bitsd(qc_decode(pats[i], f))) { printf("unpack differs\n"); failures++; }
        if (nb < 32 && bad != 57) { printf("first bad %llu\n", bad); failures++; }
        if (nb == 32 && bad != ~0ull) { printf("bad on 32 bits\n"); failures++; }
        checks += 2;
    }
    // fin NaN pack fails
    { QcFormat f = {1, 2, 1, 1 | 2 | (2 << 2)}; float x[3] = {1.0f, fbits(0x7FC00000u), 2.0f}; uint8_t p[3]; uint32_t failed = 0;
      launch(1, 2, [&] { qc_pack<float, uint8_t>(p, x, 3, f, &failed); }); if (!failed) { printf("fin NaN not refused\n"); failures++; } }
    // Block-scaled formats: MX (e4m3, e2m1, int8) and NVFP4, blocks of several sizes along
    // every axis.
    QcFormat scaled_formats[] = {{4, 0, 0, 0}, {4, 4, 0, 0}, {4, 5, 0, 0}, {5, 0, 0, 0}};
    for (auto f : scaled_formats) for (auto r : roundings) for (int li = 0; li < n_layouts; ++li)
        for (int inplace = 0; inplace < 2; ++inplace) for (int axis = 0; axis < 3; ++axis) for (uint64_t size : {2ull, 4ull, 32ull}) {
            char what[200];
            snprintf(what, sizeof what, "scaled fam %d a %d | mode %d bits %d | layout %d inplace %d axis %d size %llu", f.family, f.a, r.mode, r.bits, li, inplace, axis, (unsigned long long)size);
            check_scaled<float>(what, f, r, layouts[li], contiguous_layout[li], axis, size, inplace);
            check_scaled<double>(what, f, r, layouts[li], contiguous_layout[li], axis, size, inplace);
            checks += 2;
        }
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
