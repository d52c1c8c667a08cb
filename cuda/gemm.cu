// CUDA kernels of the posit GEMMs (src/quire/gemm_cuda.rs launches them):
// `C (m x n) = A (m x k) · B (k x n) [+ bias (n)]`, batched over blockIdx.z, for posit<n,es>
// with n <= 8 and maxpos = 2^s, s = (n-2) 2^es <= 24 (posit<8,0>, <8,1>, <8,2> and the
// narrower ones). The results are the bits of the CPU kernels in src/quire/gemm_cpu.rs.
//
// Three kernels, launched in this order:
//
// 1. qc_gemm_encode: each f32 input element becomes its posit pattern (quant.cuh's
//    qc_posit_encode: nearest, ties to the even pattern; NaN and ±Inf give NaR), the value
//    the CPU path rounds the input to. NaR operands set a flag per row of A / per column of B
//    (plain stores of 1 into zeroed flags: racing writers all write the same value).
//
// 2. qc_quire_gemm_*: the exact GEMM. Every posit is an integer multiple of minpos = 2^-s,
//    |value| <= 2^s, so in units of minpos an operand is an integer c with |c| <= 2^2s and a
//    product is an integer in units of minpos^2 = 2^-2s with |c_a c_b| <= 2^4s. Sums of such
//    integers are exact as long as the accumulator does not overflow:
//      s <= 6  (posit<8,0>):  c in i32, products <= 2^24 summed in i32 over one k-tile
//                             (32 products <= 2^29), tiles summed in i64: exact for k < 2^39.
//      s <= 12 (posit<8,1>):  c in i32, products <= 2^48 in i64 (mul.wide), i64 sums over a
//                             k-tile (<= 2^53), tiles summed in a 128-bit integer.
//      s <= 24 (posit<8,2>):  c in i64, products <= 2^96 and their sums in 128-bit integers:
//                             exact for k < 2^30 (the launcher checks k).
//    The bias is one more term, c_bias << s. The exact sum then becomes an f64 rounded to odd
//    (src/quire/round_odd.rs: 53 leading bits, the last one set if anything below is lost)
//    times 2^-2s, and qc_posit_round rounds that once: the same two steps as the CPU's
//    i128_to_f64_odd / posit.round, so the bits agree whatever accumulator either side used.
//    A NaR operand in row i of A or column j of B, or a NaR bias, makes output (i, j) NaR,
//    written as the f32 NaN 0x7FC00000 (Rust's `f64::NAN as f32`).
//
// 3. qc_naive_gemm: every multiply and every add rounded, k ascending from the pattern of 0,
//    `c = add[c][mul[a_t][b_t]]`, then `c = add[c][bias]`: the CPU's 256 x 256 operation
//    tables (src/quire/gemm_cpu.rs OpTables, built on the host and uploaded), read through the
//    read-only cache (128 KiB: they stay in L1/L2). Padding a k-tile with zero patterns would
//    be harmless (c + 0·x = c, NaR stays NaR) but the loop stops at k anyway.
//
// Tiling (both GEMMs; H100: 132 SMs, 64K registers and up to 228 KB shared memory per SM):
// - a block of 256 threads (16 x 16) computes a 64 x 64 output tile; thread (tx, ty) owns
//   the 4 x 4 outputs (ty + 16r, tx + 16c), so the output writes are coalesced along tx and
//   the shared-memory reads are conflict-free (B) or broadcast (A).
// - the k loop stages 32-wide k-tiles of A (64 x 32) and B (32 x 64) in shared memory: the
//   quire kernels store decoded integers (a 256-entry pattern -> integer table built by the
//   block first), the naive kernel patterns. A is stored transposed with one column of
//   padding so the transposing stores do not conflict.
// - accumulators stay in registers (16 per thread, i64 or 128-bit); the per-tile partial sums
//   of the narrow modes keep the inner loop to one 32-bit IMAD (s <= 6) or one mul.wide + one
//   64-bit add (s <= 12) per product.
// - static shared memory only (at most 2 x 32 x 65 x 8 + 2 KB = 35 KB), so no opt-in is needed
//   and several blocks fit one SM.
// - ptxas 13.0 for sm_90, no spills: qc_quire_gemm_i64 63 registers and 17.5 KB shared memory
//   (4 blocks, 1024 threads per SM), qc_quire_gemm_i64x128 124 registers (2 blocks),
//   qc_quire_gemm_i128 190 registers and 35 KB (1 block), qc_naive_gemm 40 registers and 4 KB.
//   In the i64 kernel's inner loop a k step is 8 shared loads (4 of them broadcasts) for 16
//   IMADs, roughly balanced between the shared-memory and integer pipes on an H100.
// - Not measured yet (no GPU at hand when written): larger tiles (128 x 128 with 8 x 8
//   micro-tiles) and 128-bit shared loads for the quire kernels, and the operation tables in
//   shared memory (128 KB, dynamic shared memory with opt-in) for the naive kernel.
#include "quant.cuh"

#define QC_GEMM_BM 64
#define QC_GEMM_BN 64
#define QC_GEMM_BK 32
#define QC_GEMM_TM 4
#define QC_GEMM_TN 4
#define QC_GEMM_TX (QC_GEMM_BN / QC_GEMM_TN)   // 16 threads along n
#define QC_GEMM_TY (QC_GEMM_BM / QC_GEMM_TM)   // 16 threads along m
#define QC_GEMM_THREADS (QC_GEMM_TX * QC_GEMM_TY)  // 256
static_assert(QC_GEMM_THREADS == 256, "the quire kernels fill the 256-entry table one entry per thread");

// Read-only loads (a host emulation defines __ldg as a plain load).
#ifndef QC_LDG
#define QC_LDG(p) __ldg(p)
#endif

typedef __int128 qc_i128;
typedef unsigned __int128 qc_u128;

// ---------------------------------------------------------------------------------------
// Per-element helpers.

// The integer c with value = c · 2^-s of pattern p (0 for NaR): decode, then shift the f64's
// significand (exact: every posit is a multiple of minpos).
QC_HD int64_t qc_gemm_operand(int32_t n, int32_t es, uint32_t p) {
    double v = qc_posit_decode(n, es, p);
    if (!qc_is_finite(v) || qc_is_zero(v)) return 0;
    QcParts parts = qc_parts(v);
    int32_t sh = parts.e - 52 + qc_posit_max_scale(n, es);
    int64_t c = (int64_t)(sh >= 0 ? parts.m << sh : parts.m >> -sh);
    return qc_sign(v) ? -c : c;
}

// `v as f32` for the values the GEMMs write: posit values (exact in f32 for n <= 8) and NaN
// (f64::NAN as f32 = 0x7FC00000 on x86-64; the device's cvt would give 0x7FFFFFFF).
QC_HD float qc_gemm_f32(double v) {
    if (qc_is_nan(v)) return qc_f32_from_bits(0x7FC00000u);
    return (float)v;
}

// The exact sum (sign, magnitude) in units of 2^-2s, rounded to the posit: round-to-odd f64
// (u128_to_f64_odd), times 2^-2s, then Posit::round (nearest even).
QC_HD float qc_gemm_round(bool negative, qc_u128 mag, int32_t n, int32_t es) {
    int32_t s2 = 2 * qc_posit_max_scale(n, es);
    uint64_t count;
    int32_t q;
    if (mag < ((qc_u128)1 << 53)) {
        count = (uint64_t)mag;
        q = -s2;
    } else {
        uint64_t hi = (uint64_t)(mag >> 64);
        int32_t lz = hi != 0 ? qc_clz64(hi) : 64 + qc_clz64((uint64_t)mag);
        int32_t shift = 75 - lz;  // keeps 53 bits
        bool sticky = (mag & (((qc_u128)1 << shift) - 1)) != 0;
        count = (uint64_t)(mag >> shift) | (sticky ? 1u : 0u);
        q = shift - s2;
    }
    double x = qc_with_sign(qc_scale_count(count, q), negative);
    QcRounding ne = {QC_NEAREST_EVEN, 0};
    return qc_gemm_f32(qc_posit_round(n, es, x, ne, 0));
}

// ---------------------------------------------------------------------------------------
// 1. Patterns and NaR flags.

// out[i] = pattern of x[i] (i < count); a NaR sets flags[(i / (group·inner))·inner + i % inner]
// when flags is not null (A (m x k): group k, inner 1 -> row flags; B (k x n): group k,
// inner n -> per-batch column flags).
extern "C" __global__ void qc_gemm_encode(const float* __restrict__ x, uint8_t* __restrict__ out,
                                          uint64_t count, int32_t n, int32_t es,
                                          uint32_t* __restrict__ flags, uint64_t group,
                                          uint64_t inner) {
    uint32_t nar = qc_posit_nar(n);
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        uint32_t p = qc_posit_encode(n, es, (double)x[i]);
        out[i] = (uint8_t)p;
        if (flags != nullptr && p == nar) flags[(i / (group * inner)) * inner + i % inner] = 1u;
    }
}

// ---------------------------------------------------------------------------------------
// 2. The exact (quire) GEMM.

// The integer types of one accumulation mode: Op (operands in shared memory), Part (sums of
// one k-tile's products) and Acc (the output's total).
template <int MODE> struct QcQuireMode;
template <> struct QcQuireMode<0> { typedef int32_t Op; typedef int32_t Part; typedef int64_t Acc; };
template <> struct QcQuireMode<1> { typedef int32_t Op; typedef int64_t Part; typedef qc_i128 Acc; };
template <> struct QcQuireMode<2> { typedef int64_t Op; typedef qc_i128 Part; typedef qc_i128 Acc; };

// The body shared by the three modes (see the header): a (batch, m, k) and b (batch or 1,
// k, n) patterns, row-major; a_batch, b_batch the element strides between batch items (0
// for a shared b); row_nar (batch·m) and col_nar (batch or 1, n) the flags of step 1;
// bias: n patterns or null; out (batch, m, n) f32.
template <int MODE>
__device__ __forceinline__ void qc_quire_gemm(const uint8_t* __restrict__ a,
                                              const uint8_t* __restrict__ b,
                                              const uint8_t* __restrict__ bias,
                                              const uint32_t* __restrict__ row_nar,
                                              const uint32_t* __restrict__ col_nar,
                                              float* __restrict__ out, uint32_t m, uint32_t k,
                                              uint32_t n, uint64_t a_batch, uint64_t b_batch,
                                              int32_t pn, int32_t pes) {
    typedef typename QcQuireMode<MODE>::Op Op;
    typedef typename QcQuireMode<MODE>::Part Part;
    typedef typename QcQuireMode<MODE>::Acc Acc;
    __shared__ Op lut[256];
    __shared__ Op as[QC_GEMM_BK][QC_GEMM_BM + 1];
    __shared__ Op bs[QC_GEMM_BK][QC_GEMM_BN];

    const uint32_t tid = threadIdx.x;
    const uint32_t tx = tid % QC_GEMM_TX, ty = tid / QC_GEMM_TX;
    const uint32_t row0 = blockIdx.y * QC_GEMM_BM, col0 = blockIdx.x * QC_GEMM_BN;
    const uint64_t z = blockIdx.z;
    const uint8_t* az = a + z * a_batch;
    const uint8_t* bz = b + z * b_batch;

    // THREADS == 256: one table entry per thread.
    lut[tid] = (Op)qc_gemm_operand(pn, pes, tid);
    __syncthreads();

    Acc acc[QC_GEMM_TM][QC_GEMM_TN];
    #pragma unroll
    for (int r = 0; r < QC_GEMM_TM; ++r)
        #pragma unroll
        for (int c = 0; c < QC_GEMM_TN; ++c) acc[r][c] = 0;

    for (uint32_t kt = 0; kt < k; kt += QC_GEMM_BK) {
        // A tile, read along k (consecutive threads, consecutive bytes), stored transposed.
        for (uint32_t e = tid; e < QC_GEMM_BM * QC_GEMM_BK; e += QC_GEMM_THREADS) {
            uint32_t i = e / QC_GEMM_BK, t = e % QC_GEMM_BK;
            uint32_t gi = row0 + i, gt = kt + t;
            as[t][i] = (gi < m && gt < k) ? lut[az[(uint64_t)gi * k + gt]] : (Op)0;
        }
        // B tile, read along n.
        for (uint32_t e = tid; e < QC_GEMM_BK * QC_GEMM_BN; e += QC_GEMM_THREADS) {
            uint32_t t = e / QC_GEMM_BN, j = e % QC_GEMM_BN;
            uint32_t gt = kt + t, gj = col0 + j;
            bs[t][j] = (gt < k && gj < n) ? lut[bz[(uint64_t)gt * n + gj]] : (Op)0;
        }
        __syncthreads();
        Part part[QC_GEMM_TM][QC_GEMM_TN];
        #pragma unroll
        for (int r = 0; r < QC_GEMM_TM; ++r)
            #pragma unroll
            for (int c = 0; c < QC_GEMM_TN; ++c) part[r][c] = 0;
#pragma unroll 8
        for (int t = 0; t < QC_GEMM_BK; ++t) {
            Part x[QC_GEMM_TM], y[QC_GEMM_TN];
            #pragma unroll
            for (int r = 0; r < QC_GEMM_TM; ++r) x[r] = (Part)as[t][ty + QC_GEMM_TY * r];
            #pragma unroll
            for (int c = 0; c < QC_GEMM_TN; ++c) y[c] = (Part)bs[t][tx + QC_GEMM_TX * c];
            #pragma unroll
            for (int r = 0; r < QC_GEMM_TM; ++r)
                #pragma unroll
                for (int c = 0; c < QC_GEMM_TN; ++c) part[r][c] += x[r] * y[c];
        }
        #pragma unroll
        for (int r = 0; r < QC_GEMM_TM; ++r)
            #pragma unroll
            for (int c = 0; c < QC_GEMM_TN; ++c) acc[r][c] += (Acc)part[r][c];
        __syncthreads();
    }

    const int32_t s = qc_posit_max_scale(pn, pes);
    const uint32_t nar = qc_posit_nar(pn);
    #pragma unroll
    for (int r = 0; r < QC_GEMM_TM; ++r) {
        uint32_t i = row0 + ty + QC_GEMM_TY * r;
        if (i >= m) continue;
        #pragma unroll
        for (int c = 0; c < QC_GEMM_TN; ++c) {
            uint32_t j = col0 + tx + QC_GEMM_TX * c;
            if (j >= n) continue;
            Acc total = acc[r][c];
            bool is_nar = row_nar[z * m + i] != 0 || col_nar[(b_batch != 0 ? z : 0) * n + j] != 0;
            if (bias != nullptr) {
                uint32_t p = bias[j];
                is_nar = is_nar || p == nar;
                total += (Acc)qc_gemm_operand(pn, pes, p) * ((Acc)1 << s);
            }
            float v;
            if (is_nar) {
                v = qc_gemm_f32(qc_f64_from_bits(QC_F64_NAN));
            } else {
                bool negative = total < 0;
                qc_u128 mag = negative ? (qc_u128)0 - (qc_u128)(qc_i128)total : (qc_u128)total;
                v = qc_gemm_round(negative, mag, pn, pes);
            }
            out[(z * m + i) * (uint64_t)n + j] = v;
        }
    }
}

// The three modes' kernels (same arguments as qc_quire_gemm).
#define QC_QUIRE_KERNEL(NAME, MODE)                                                          \
    extern "C" __global__ void __launch_bounds__(QC_GEMM_THREADS)                           \
        NAME(const uint8_t* a, const uint8_t* b, const uint8_t* bias, const uint32_t* row_nar, \
             const uint32_t* col_nar, float* out, uint32_t m, uint32_t k, uint32_t n,       \
             uint64_t a_batch, uint64_t b_batch, int32_t pn, int32_t pes) {                \
        qc_quire_gemm<MODE>(a, b, bias, row_nar, col_nar, out, m, k, n, a_batch, b_batch, pn, \
                            pes);                                                            \
    }
QC_QUIRE_KERNEL(qc_quire_gemm_i64, 0)
QC_QUIRE_KERNEL(qc_quire_gemm_i64x128, 1)
QC_QUIRE_KERNEL(qc_quire_gemm_i128, 2)

// ---------------------------------------------------------------------------------------
// 3. The naive GEMM on operation tables.

// a, b, bias, a_batch, b_batch as for the quire kernels; mul and add: the 256 x 256 tables
// (`mul[x << 8 | y]` the pattern of round(x·y), `add` likewise); out (batch, m, n) f32.
extern "C" __global__ void __launch_bounds__(QC_GEMM_THREADS)
    qc_naive_gemm(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                  const uint8_t* __restrict__ bias, const uint8_t* __restrict__ mul,
                  const uint8_t* __restrict__ add, float* __restrict__ out, uint32_t m,
                  uint32_t k, uint32_t n, uint64_t a_batch, uint64_t b_batch, int32_t pn,
                  int32_t pes) {
    __shared__ uint8_t as[QC_GEMM_BK][QC_GEMM_BM + 1];
    __shared__ uint8_t bs[QC_GEMM_BK][QC_GEMM_BN];

    const uint32_t tid = threadIdx.x;
    const uint32_t tx = tid % QC_GEMM_TX, ty = tid / QC_GEMM_TX;
    const uint32_t row0 = blockIdx.y * QC_GEMM_BM, col0 = blockIdx.x * QC_GEMM_BN;
    const uint64_t z = blockIdx.z;
    const uint8_t* az = a + z * a_batch;
    const uint8_t* bz = b + z * b_batch;

    // Patterns, starting from the pattern of 0.
    uint32_t acc[QC_GEMM_TM][QC_GEMM_TN];
    #pragma unroll
    for (int r = 0; r < QC_GEMM_TM; ++r)
        #pragma unroll
        for (int c = 0; c < QC_GEMM_TN; ++c) acc[r][c] = 0;

    for (uint32_t kt = 0; kt < k; kt += QC_GEMM_BK) {
        for (uint32_t e = tid; e < QC_GEMM_BM * QC_GEMM_BK; e += QC_GEMM_THREADS) {
            uint32_t i = e / QC_GEMM_BK, t = e % QC_GEMM_BK;
            uint32_t gi = row0 + i, gt = kt + t;
            as[t][i] = (gi < m && gt < k) ? az[(uint64_t)gi * k + gt] : (uint8_t)0;
        }
        for (uint32_t e = tid; e < QC_GEMM_BK * QC_GEMM_BN; e += QC_GEMM_THREADS) {
            uint32_t t = e / QC_GEMM_BN, j = e % QC_GEMM_BN;
            uint32_t gt = kt + t, gj = col0 + j;
            bs[t][j] = (gt < k && gj < n) ? bz[(uint64_t)gt * n + gj] : (uint8_t)0;
        }
        __syncthreads();
        uint32_t steps = k - kt < QC_GEMM_BK ? k - kt : QC_GEMM_BK;
        for (uint32_t t = 0; t < steps; ++t) {
            uint32_t y[QC_GEMM_TN];
            #pragma unroll
            for (int c = 0; c < QC_GEMM_TN; ++c) y[c] = bs[t][tx + QC_GEMM_TX * c];
            #pragma unroll
            for (int r = 0; r < QC_GEMM_TM; ++r) {
                const uint8_t* products = mul + ((uint32_t)as[t][ty + QC_GEMM_TY * r] << 8);
                #pragma unroll
                for (int c = 0; c < QC_GEMM_TN; ++c) {
                    uint32_t p = QC_LDG(products + y[c]);
                    acc[r][c] = QC_LDG(add + ((acc[r][c] << 8) | p));
                }
            }
        }
        __syncthreads();
    }

    #pragma unroll
    for (int r = 0; r < QC_GEMM_TM; ++r) {
        uint32_t i = row0 + ty + QC_GEMM_TY * r;
        if (i >= m) continue;
        #pragma unroll
        for (int c = 0; c < QC_GEMM_TN; ++c) {
            uint32_t j = col0 + tx + QC_GEMM_TX * c;
            if (j >= n) continue;
            uint32_t p = acc[r][c];
            if (bias != nullptr) p = QC_LDG(add + ((p << 8) | bias[j]));
            out[(z * m + i) * (uint64_t)n + j] = qc_gemm_f32(qc_posit_decode(pn, pes, p));
        }
    }
}
