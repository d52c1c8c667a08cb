// CUDA kernels of the quantize, block-maximum, pack and unpack ops (src/backend/cuda.rs
// launches them). The per-element math is quant.cuh's (the same header the host tests compare
// with the Rust kernels bit for bit); this file only adds the loops over memory.
//
// Bit-exactness with the CPU path (src/backend/cpu.rs):
// - Element i of the tensor's logical row-major order reads its random word from
//   qc_random(seed, call, i): word i % 4 of Philox block i / 4. Each thread takes 4
//   consecutive elements (one Philox block, computed once) so results do not depend on the
//   launch configuration.
// - f32 inputs are widened to f64 and results narrowed back with the conversions Rust uses on
//   x86-64 (`as f64`, `as f32`: cvtss2sd/cvtsd2ss). For numbers these are exact / round to
//   nearest even, which PTX cvt does too (no FTZ: never build with --use_fast_math). For NaN
//   x86 keeps the sign and the payload (quieting it) while the GPU writes a canonical NaN, so
//   NaNs are converted through their bits here.
// - Block maxima are integer maxima of the magnitude bits of finite elements (the bit order
//   of non-negative finite doubles is their order), so the atomic reduction is exact and its
//   result independent of the order.
//
// Launch configuration (chosen for H100, 132 SMs, up to 2048 resident threads per SM):
// - The ops are memory-bound for the cheap formats (float, fixed: a few dozen integer
//   instructions per element) and close to balanced for posits and stochastic rounding
//   (Philox4x32-10 is ~40 integer multiply-adds per 4 elements). 256 threads per block with no
//   shared memory and a modest register count gives full occupancy (8 blocks / SM), which is
//   what hides the DRAM latency; the wrapper launches at most 32 blocks per SM (a grid-stride
//   loop covers the rest), so the launch stays small for huge tensors while every SM is busy.
// - Registers (ptxas 13.0, sm_90): qc_quantize_* use 72 registers, i.e. 3 blocks of 256 per SM
//   (37.5% occupancy); each thread keeps 64 bytes (f32) in flight, enough to cover DRAM
//   latency in a streaming kernel. __launch_bounds__(256, 4) caps them at 64 (50% occupancy)
//   at the cost of 28 bytes of spills; which wins is to be measured on the H100
//   (benches/quantize_cuda.rs).
// - lns formats have kernels of their own (qc_quantize_lns_*), so the others carry none of
//   its code. Its exact comparison (interval squaring, quant.cuh) is a called function with
//   a 512-byte per-thread scratch array; with it, ptxas 13.0 for sm_90 reports 80 registers
//   and a 688-byte stack frame for qc_quantize_lns_f32, 128 registers for _f64 (to be
//   measured on the H100). Pack and unpack kernels share one entry point per type pair for
//   every family and carry that stack frame too.
// - Contiguous f32 tensors are read and written with 128-bit accesses (float4: one thread's 4
//   elements), f64 with two 128-bit accesses (double2); when a pointer is not 16-byte aligned
//   (a view starting mid-buffer) the same thread mapping runs with scalar accesses.
// - Strided views are gathered in the kernel from a (dims, strides) array, the layout candle
//   passes to its own kernels, so no contiguous copy is made.
#include "quant.cuh"

// Threads per warp in the reductions (a host emulation of these kernels defines it as 1).
#ifndef QC_WARP_SIZE
#define QC_WARP_SIZE 32
#endif

// ---------------------------------------------------------------------------------------
// Conversions that match Rust on x86-64.

// `x as f64` for an f32 (NaN: quieted, payload shifted up, sign kept).
__device__ __forceinline__ double qc_widen(float x) {
    uint32_t u = qc_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        uint64_t sign = (uint64_t)(u >> 31) << 63;
        uint64_t payload = (uint64_t)((u & 0x007FFFFFu) | 0x00400000u) << 29;
        return qc_f64_from_bits(sign | QC_F64_INF | payload);
    }
    return (double)x;
}

__device__ __forceinline__ double qc_widen(double x) { return x; }

// `v as f32` (round to nearest even; NaN: quieted, payload's top bits kept, sign kept).
__device__ __forceinline__ float qc_narrow_f32(double v) {
    uint64_t u = qc_f64_bits(v);
    if ((u & ~QC_F64_SIGN) > QC_F64_INF) {
        uint32_t sign = (uint32_t)(u >> 63) << 31;
        uint32_t payload = (uint32_t)((u & QC_F64_MANT_MASK) >> 29) | 0x00400000u;
        return qc_f32_from_bits(sign | 0x7F800000u | payload);
    }
    return __double2float_rn(v);
}

template <typename T> __device__ __forceinline__ T qc_narrow(double v);
template <> __device__ __forceinline__ float qc_narrow<float>(double v) { return qc_narrow_f32(v); }
template <> __device__ __forceinline__ double qc_narrow<double>(double v) { return v; }

// ---------------------------------------------------------------------------------------
// Layouts.

// Storage offset of logical element i of a strided view: info = dims[0..rank) then
// strides[0..rank) (in elements), as candle's kernels take them.
__device__ __forceinline__ uint64_t qc_strided_offset(uint64_t i, uint32_t rank,
                                                      const uint64_t* info) {
    const uint64_t* dims = info;
    const uint64_t* strides = info + rank;
    uint64_t offset = 0;
    for (int d = (int)rank - 1; d >= 0; --d) {
        uint64_t dim = dims[d];
        offset += (i % dim) * strides[d];
        i /= dim;
    }
    return offset;
}

// The parameters every quantize launch shares.
struct QcQuantArgs {
    QcFormat format;
    QcRounding rounding;
    uint64_t seed;
    uint64_t call;
    // Block floating point: maxima[(i / inner) % count] is the f64 bits of element i's block
    // maximum (null for the other families).
    const unsigned long long* maxima;
    uint64_t inner;
    uint64_t count;
    // Set to 1 when an lns element's exact comparison hit the precision cap of
    // qc_lns_pow_cmp (that element is left as it was; the host then rounds the tensor on the
    // CPU). Null: not reported.
    uint32_t* undecided;
};

// One element of a T tensor: x with logical index i and random word `random`. LNS: the
// kernels for lns formats (the others carry none of its code, so its registers and stack do
// not weigh on them); lns keeps the values stored in T, as the CPU kernel's round_stored does.
template <typename T, bool LNS>
__device__ __forceinline__ double qc_quantize_one(double x, uint64_t i, uint32_t random,
                                                 const QcQuantArgs& a) {
    if (LNS) {
        bool undecided = false;
        double y = qc_lns_round(a.format.a, a.format.b, x, a.rounding, random, sizeof(T) == 4,
                                &undecided);
        if (undecided) {
            if (a.undecided != nullptr) *a.undecided = 1;
            return x;
        }
        return y;
    }
    if (a.format.family == QC_BLOCK) {
        uint64_t b = a.count == 1 ? 0 : (i / a.inner) % a.count;
        double m = qc_f64_from_bits(a.maxima[b]);
        return qc_round_block(x, a.format.a, m, a.rounding, random);
    }
    return qc_round_base(x, a.format, a.rounding, random);
}

// The 4 random words of Philox block g (zeros for deterministic rounding, which reads none).
__device__ __forceinline__ void qc_random_block(uint64_t g, const QcQuantArgs& a,
                                                uint32_t out[4]) {
    if (a.rounding.mode != QC_STOCHASTIC) {
        out[0] = out[1] = out[2] = out[3] = 0;
        return;
    }
    uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)a.call,
                       (uint32_t)(a.call >> 32)};
    uint32_t key[2] = {(uint32_t)a.seed, (uint32_t)(a.seed >> 32)};
    qc_philox4x32_10(ctr, key, out);
}

// 128-bit loads and stores of 4 consecutive elements.
__device__ __forceinline__ void qc_load4(const float* p, double v[4]) {
    float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = qc_widen(q.x);
    v[1] = qc_widen(q.y);
    v[2] = qc_widen(q.z);
    v[3] = qc_widen(q.w);
}
__device__ __forceinline__ void qc_store4(float* p, const double v[4]) {
    float4 q;
    q.x = qc_narrow_f32(v[0]);
    q.y = qc_narrow_f32(v[1]);
    q.z = qc_narrow_f32(v[2]);
    q.w = qc_narrow_f32(v[3]);
    *reinterpret_cast<float4*>(p) = q;
}
__device__ __forceinline__ void qc_load4(const double* p, double v[4]) {
    double2 a = reinterpret_cast<const double2*>(p)[0];
    double2 b = reinterpret_cast<const double2*>(p)[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = b.x;
    v[3] = b.y;
}
__device__ __forceinline__ void qc_store4(double* p, const double v[4]) {
    reinterpret_cast<double2*>(p)[0] = make_double2(v[0], v[1]);
    reinterpret_cast<double2*>(p)[1] = make_double2(v[2], v[3]);
}

// dst[j] = quantize(src[j]) for the n elements of a tensor. src null: in place (src = dst).
// info null: both contiguous. Otherwise src is the strided view described by (rank, info);
// dst is contiguous, or (dst_strided != 0, in place) the same strided view. LNS: the
// format is lns (see qc_quantize_one).
template <typename T, bool LNS = false>
__device__ void qc_quantize(T* dst, const T* src, uint64_t n, uint32_t rank, const uint64_t* info,
                            int32_t dst_strided, QcQuantArgs a) {
    if (src == nullptr) src = dst;
    uint64_t groups = (n + 3) / 4;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    bool vec = info == nullptr &&
               ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
    for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        uint32_t r[4];
        qc_random_block(g, a, r);
        uint64_t i0 = g * 4;
        if (vec && i0 + 4 <= n) {
            double v[4];
            qc_load4(src + i0, v);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = qc_quantize_one<T, LNS>(v[k], i0 + k, r[k], a);
            qc_store4(dst + i0, v);
            continue;
        }
        uint64_t end = i0 + 4 < n ? i0 + 4 : n;
        for (uint64_t i = i0; i < end; ++i) {
            uint64_t so = info ? qc_strided_offset(i, rank, info) : i;
            uint64_t d = dst_strided ? so : i;
            double y = qc_quantize_one<T, LNS>(qc_widen(src[so]), i, r[i & 3], a);
            dst[d] = qc_narrow<T>(y);
        }
    }
}

// slots[key] = max(slots[key], v) for every lane of a warp, with one atomic per run of
// adjacent lanes that share a key (the run's maximum, gathered by a segmented shuffle
// reduction) instead of one per lane: 32 lanes updating one slot would queue 32 atomics on
// one address. Lanes of one key need not be adjacent (each run then sends its own maximum).
// Every lane of the warp calls it; a lane with nothing to add passes v = 0.
__device__ __forceinline__ void qc_warp_max_by_key(unsigned long long* slots, uint64_t key,
                                                   unsigned long long v) {
    uint32_t lane = threadIdx.x % QC_WARP_SIZE;
    // After the step of width `off`, v holds the maximum of this lane's run over the lanes
    // lane .. lane + 2*off - 1 (a run is contiguous, so equal keys at both ends suffice).
    for (int off = 1; off < QC_WARP_SIZE; off <<= 1) {
        unsigned long long other = __shfl_down_sync(0xFFFFFFFFu, v, off);
        uint64_t other_key = __shfl_down_sync(0xFFFFFFFFu, key, off);
        if (lane + off < QC_WARP_SIZE && other_key == key && other > v) v = other;
    }
    uint64_t before = __shfl_up_sync(0xFFFFFFFFu, key, 1);
    if ((lane == 0 || before != key) && v != 0) atomicMax(&slots[key], v);
}

// Block maxima: maxima[(i / inner) % count] = max over the finite elements of |x| as f64 bits
// (the slots start at 0). A whole-tensor block keeps a running maximum per thread and sends
// one atomic per warp; per-slice blocks send one atomic per run of a warp's lanes in one
// block (qc_warp_max_by_key). Whole warps step together through the grid-stride loop (a
// warp's first element moves by the stride), so every lane takes part in the shuffles.
template <typename T>
__device__ void qc_block_max(const T* src, uint64_t n, uint32_t rank, const uint64_t* info,
                             uint64_t inner, uint64_t count, unsigned long long* maxima) {
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t lane = threadIdx.x % QC_WARP_SIZE;
    unsigned long long m = 0;
    for (uint64_t w = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x - lane; w < n;
         w += stride) {
        uint64_t i = w + lane;
        unsigned long long v = 0;
        uint64_t b = ~0ull;
        if (i < n) {
            uint64_t so = info ? qc_strided_offset(i, rank, info) : i;
            uint64_t bits = qc_abs_bits(qc_widen(src[so]));
            if (bits < QC_F64_INF) {  // NaN and Inf do not set the exponent
                v = bits;
                b = count == 1 ? 0 : (i / inner) % count;
            }
        }
        if (count == 1) {
            if (v > m) m = v;
        } else {
            qc_warp_max_by_key(maxima, b, v);
        }
    }
    if (count == 1) {
        // Every thread's maximum is for block 0: reduce in the warp first.
        for (int off = QC_WARP_SIZE / 2; off > 0; off >>= 1) {
            unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
            if (o > m) m = o;
        }
        if (lane == 0 && m != 0) atomicMax(&maxima[0], m);
    }
}

// pack: dst[i] = pattern of src[i] (contiguous). *failed = 1 where there is no pattern (NaN
// in a `fin` float format), 2 where an lns comparison hit the precision cap of
// qc_lns_pow_cmp; the host then reports the error.
template <typename T, typename P>
__device__ void qc_pack(P* dst, const T* src, uint64_t n, QcFormat f, uint32_t* failed) {
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double x = qc_widen(src[i]);
        if (qc_encode_fails(x, f)) {
            *failed = 1;
            dst[i] = 0;
            continue;
        }
        bool undecided = false;
        dst[i] = (P)qc_encode_checked(x, f, &undecided);
        if (undecided) *failed = 2;
    }
}

// unpack: dst[i] = value of pattern src[i] (contiguous; i16 holds 16-bit patterns).
// *first_bad = the smallest index whose pattern has bits above the format's `bits` (starts at
// UINT64_MAX); the host then reports the error. *undecided = 1 (when not null) where an lns
// comparison hit the precision cap of qc_lns_pow_cmp.
template <typename P, typename T>
__device__ void qc_unpack(T* dst, const P* src, uint64_t n, QcFormat f, uint32_t bits,
                          unsigned long long* first_bad, uint32_t* undecided = nullptr) {
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t p = (uint32_t)(sizeof(P) == 2 ? (uint32_t)(uint16_t)src[i] : (uint32_t)src[i]);
        if (bits < 32 && (p >> bits) != 0) {
            atomicMin(first_bad, (unsigned long long)i);
            dst[i] = qc_narrow<T>(0.0);
            continue;
        }
        bool u = false;
        dst[i] = qc_narrow<T>(qc_decode_checked(p, f, &u));
        if (u && undecided != nullptr) *undecided = 1;
    }
}

// ---------------------------------------------------------------------------------------
// Entry points (names used by src/backend/cuda.rs).

#define QC_QUANTIZE(NAME, T, LNS)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(T* dst, const T* src, uint64_t n, \
                                    uint32_t rank,                                             \
                                    const uint64_t* info, int32_t dst_strided, QcFormat format, \
                                    QcRounding rounding, uint64_t seed, uint64_t call,          \
                                    const unsigned long long* maxima, uint64_t inner,          \
                                    uint64_t count, uint32_t* undecided) {                     \
        QcQuantArgs a = {format, rounding, seed, call, maxima, inner, count, undecided};       \
        qc_quantize<T, LNS>(dst, src, n, rank, info, dst_strided, a);                          \
    }
QC_QUANTIZE(qc_quantize_f32, float, false)
QC_QUANTIZE(qc_quantize_f64, double, false)
QC_QUANTIZE(qc_quantize_lns_f32, float, true)
QC_QUANTIZE(qc_quantize_lns_f64, double, true)

#define QC_BLOCK_MAX(NAME, T)                                                                  \
    extern "C" __global__ void NAME(const T* src, uint64_t n, uint32_t rank,                   \
                                    const uint64_t* info, uint64_t inner, uint64_t count,      \
                                    unsigned long long* maxima) {                              \
        qc_block_max<T>(src, n, rank, info, inner, count, maxima);                             \
    }
QC_BLOCK_MAX(qc_block_max_f32, float)
QC_BLOCK_MAX(qc_block_max_f64, double)

#define QC_PACK(NAME, T, P)                                                                    \
    extern "C" __global__ void NAME(P* dst, const T* src, uint64_t n, QcFormat format,         \
                                    uint32_t* failed) {                                        \
        qc_pack<T, P>(dst, src, n, format, failed);                                            \
    }
QC_PACK(qc_pack_f32_u8, float, uint8_t)
QC_PACK(qc_pack_f32_i16, float, int16_t)
QC_PACK(qc_pack_f32_u32, float, uint32_t)
QC_PACK(qc_pack_f64_u8, double, uint8_t)
QC_PACK(qc_pack_f64_i16, double, int16_t)
QC_PACK(qc_pack_f64_u32, double, uint32_t)

#define QC_UNPACK(NAME, P, T)                                                                  \
    extern "C" __global__ void NAME(T* dst, const P* src, uint64_t n, QcFormat format,         \
                                    uint32_t bits, unsigned long long* first_bad,              \
                                    uint32_t* undecided) {                                     \
        qc_unpack<P, T>(dst, src, n, format, bits, first_bad, undecided);                      \
    }
QC_UNPACK(qc_unpack_u8_f32, uint8_t, float)
QC_UNPACK(qc_unpack_i16_f32, int16_t, float)
QC_UNPACK(qc_unpack_u32_f32, uint32_t, float)
QC_UNPACK(qc_unpack_u8_f64, uint8_t, double)
QC_UNPACK(qc_unpack_i16_f64, int16_t, double)
QC_UNPACK(qc_unpack_u32_f64, uint32_t, double)

// ---------------------------------------------------------------------------------------
// Block-scaled formats (MX, NVFP4): a block-maximum pass, a scale pass, then the elements
// (src/backend/cuda/scaled.rs launches them; the CPU path is src/backend/cpu/mx.rs).

// mx.rs MxGrid: element (o, a, k) of the logical order (outer index, index along the block
// axis, inner index) is in block (o * along + a / size) * inner + k. Every field is >= 1.
struct QcScaledGrid {
    uint64_t size;
    uint64_t len;
    uint64_t inner;
    uint64_t along;
};

// MxGrid::block_of().
__device__ __forceinline__ uint64_t qc_scaled_block(uint64_t i, const QcScaledGrid& g) {
    uint64_t k = i % g.inner;
    uint64_t a = (i / g.inner) % g.len;
    uint64_t o = i / (g.inner * g.len);
    return (o * g.along + a / g.size) * g.inner + k;
}

// amax[b] = the largest |x| of block b as f64 bits, NaN and Inf counting as Inf (which makes
// the block NaN); amax[count] = the largest finite |x| of the tensor (NVFP4's tensor scale).
// The slots start at 0; integer maxima of the bits are exact and independent of the order.
// Block maxima go out by qc_warp_max_by_key (one atomic per block a warp touches), the tensor
// maximum as one atomic per warp after the loop: one atomic per element on that single slot
// serialised the whole pass (51 ms for 2^26 elements on an H200, against 0.16 ms for a copy).
// Whole warps step together through the grid-stride loop, as in qc_block_max.
template <typename T>
__device__ void qc_scaled_amax(const T* src, uint64_t n, uint32_t rank, const uint64_t* info,
                               QcScaledGrid g, uint64_t count, unsigned long long* amax) {
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t lane = threadIdx.x % QC_WARP_SIZE;
    unsigned long long tensor_max = 0;
    for (uint64_t w = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x - lane; w < n;
         w += stride) {
        uint64_t i = w + lane;
        unsigned long long v = 0;
        uint64_t b = ~0ull;
        if (i < n) {
            uint64_t so = info ? qc_strided_offset(i, rank, info) : i;
            uint64_t bits = qc_abs_bits(qc_widen(src[so]));
            b = qc_scaled_block(i, g);
            if (bits >= QC_F64_INF) {
                v = QC_F64_INF;
            } else {
                v = bits;
                if (bits > tensor_max) tensor_max = bits;
            }
        }
        qc_warp_max_by_key(amax, b, v);
    }
    for (int off = QC_WARP_SIZE / 2; off > 0; off >>= 1) {
        unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, tensor_max, off);
        if (o > tensor_max) tensor_max = o;
    }
    if (lane == 0 && tensor_max != 0) atomicMax(&amax[count], tensor_max);
}

// The scales from the maxima, in place: slot b < count becomes the scale exponent X of an MX
// block as a signed integer (QC_MX_SCALE_NAN for a NaN block), or NVFP4's s_b * s_t as f64
// bits (0 for a zero scale, NaN for a NaN block).
__device__ void qc_scaled_scales(QcFormat f, uint64_t count, unsigned long long* amax) {
    double s_t = 1.0;
    if (f.family == QC_NVFP4) s_t = qc_nvfp4_tensor_scale(qc_f64_from_bits(amax[count]));
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; b < count; b += stride) {
        double m = qc_f64_from_bits(amax[b]);
        if (f.family == QC_MX) {
            int32_t x = qc_mx_scale(m, qc_mx_emax(f.a));
            amax[b] = (unsigned long long)(int64_t)x;
        } else {
            amax[b] = qc_f64_bits(qc_nvfp4_block_scale(m, s_t) * s_t);
        }
    }
}

// One element of a block-scaled format: x with logical index i and random word `random`.
__device__ __forceinline__ double qc_scaled_one(double x, uint64_t i, uint32_t random,
                                                const QcQuantArgs& a, const QcScaledGrid& g) {
    unsigned long long s = a.maxima[qc_scaled_block(i, g)];
    if (a.format.family == QC_MX)
        return qc_mx_round(x, a.format.a, (int32_t)(int64_t)s, a.rounding, random);
    return qc_nvfp4_round_scaled(x, qc_f64_from_bits(s), a.rounding, random);
}

// qc_quantize's loop (same thread mapping and random words) over a block-scaled format;
// a.maxima holds the scales of qc_scaled_scales.
template <typename T>
__device__ void qc_quantize_scaled(T* dst, const T* src, uint64_t n, uint32_t rank,
                                   const uint64_t* info, int32_t dst_strided, QcQuantArgs a,
                                   QcScaledGrid g) {
    if (src == nullptr) src = dst;
    uint64_t groups = (n + 3) / 4;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    bool vec = info == nullptr &&
               ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
    for (uint64_t gi = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < groups;
         gi += stride) {
        uint32_t r[4];
        qc_random_block(gi, a, r);
        uint64_t i0 = gi * 4;
        if (vec && i0 + 4 <= n) {
            double v[4];
            qc_load4(src + i0, v);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = qc_scaled_one(v[k], i0 + k, r[k], a, g);
            qc_store4(dst + i0, v);
            continue;
        }
        uint64_t end = i0 + 4 < n ? i0 + 4 : n;
        for (uint64_t i = i0; i < end; ++i) {
            uint64_t so = info ? qc_strided_offset(i, rank, info) : i;
            uint64_t d = dst_strided ? so : i;
            double y = qc_scaled_one(qc_widen(src[so]), i, r[i & 3], a, g);
            dst[d] = qc_narrow<T>(y);
        }
    }
}

#define QC_SCALED_AMAX(NAME, T)                                                                \
    extern "C" __global__ void NAME(const T* src, uint64_t n, uint32_t rank,                   \
                                    const uint64_t* info, QcScaledGrid grid, uint64_t count,   \
                                    unsigned long long* amax) {                                \
        qc_scaled_amax<T>(src, n, rank, info, grid, count, amax);                              \
    }
QC_SCALED_AMAX(qc_scaled_amax_f32, float)
QC_SCALED_AMAX(qc_scaled_amax_f64, double)

extern "C" __global__ void qc_scaled_scales_kernel(QcFormat format, uint64_t count,
                                                   unsigned long long* amax) {
    qc_scaled_scales(format, count, amax);
}

#define QC_QUANTIZE_SCALED(NAME, T)                                                            \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                    \
        T* dst, const T* src, uint64_t n, uint32_t rank, const uint64_t* info,                 \
        int32_t dst_strided, QcFormat format, QcRounding rounding, uint64_t seed,             \
        uint64_t call, const unsigned long long* scales, QcScaledGrid grid) {                 \
        QcQuantArgs a = {format, rounding, seed, call, scales, 1, 1};                          \
        qc_quantize_scaled<T>(dst, src, n, rank, info, dst_strided, a, grid);                  \
    }
QC_QUANTIZE_SCALED(qc_quantize_scaled_f32, float)
QC_QUANTIZE_SCALED(qc_quantize_scaled_f64, double)
