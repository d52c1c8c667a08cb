// Host/device compatibility for the shared per-element math in quant.cuh.
//
// quant.cuh is compiled twice: by nvcc for the device (cuda/*.cu, only with the `cuda`
// feature) and by the host C++ compiler through cuda/host_shim.cpp (always; the tests in
// tests/cuda_host.rs compare it bit for bit with the Rust code). Only bit casts and
// count-leading-zeros differ between the two, and the few f64 operations of the lns log2
// estimate (quant.cuh), which go through the helpers below: single IEEE operations rounded to
// nearest, never contracted into fused multiply-adds (build.rs also builds the host side with
// -ffp-contract=off), so both sides give the bits of Rust's f64 arithmetic.
//
// The device branch tests __CUDA_ARCH__, not __CUDACC__: nvcc's host pass defines
// __CUDACC__ without __CUDA_ARCH__, and there the host implementations are the right ones.
#ifndef QCANDLE_COMPAT_CUH
#define QCANDLE_COMPAT_CUH

#include <stdint.h>

#ifndef __CUDACC__
// A plain C++ compiler: the CUDA qualifiers mean nothing.
#define __host__
#define __device__
#define __forceinline__ inline
#endif

#ifndef __CUDA_ARCH__
#include <string.h>
#endif

// Every shared function is inlined into its caller on both sides, except QC_HD_CALL ones:
// rarely taken or register-hungry paths (lns rounding and its exact comparison) that the
// device calls as functions, so that they add no registers or spills to the kernels' hot
// loops for the other formats.
#define QC_HD __host__ __device__ __forceinline__
#ifdef __CUDACC__
#define QC_HD_CALL __host__ __device__ __noinline__
#else
#define QC_HD_CALL inline
#endif

// The bits of an f64.
QC_HD uint64_t qc_f64_bits(double x) {
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

// The f64 with bits `u`.
QC_HD double qc_f64_from_bits(uint64_t u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// The bits of an f32.
QC_HD uint32_t qc_f32_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

// The f32 with bits `u`.
QC_HD float qc_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// Leading zeros of a 64-bit word; 64 for 0 (Rust's u64::leading_zeros).
QC_HD int32_t qc_clz64(uint64_t u) {
#ifdef __CUDA_ARCH__
    return __clzll((long long)u);
#else
    return u == 0 ? 64 : __builtin_clzll(u);
#endif
}

// Leading zeros of a 32-bit word; 32 for 0 (Rust's u32::leading_zeros).
QC_HD int32_t qc_clz32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __clz((int)u);
#else
    return u == 0 ? 32 : __builtin_clz(u);
#endif
}

// The high 64 bits of the 128-bit product a * b.
QC_HD uint64_t qc_mulhi64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
    return __umul64hi(a, b);
#else
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#endif
}

// a + b, a - b, a * b, a / b on f64, each rounded once to nearest even (Rust's f64 operators).
QC_HD double qc_dadd(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
QC_HD double qc_dsub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}
QC_HD double qc_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
QC_HD double qc_ddiv(double a, double b) {
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

// Rust's `v as f32 as f64`: v rounded to the nearest f32 (ties to even), widened back.
QC_HD double qc_f32_round_trip(double v) {
#ifdef __CUDA_ARCH__
    return (double)__double2float_rn(v);
#else
    return (double)(float)v;
#endif
}

#endif // QCANDLE_COMPAT_CUH
