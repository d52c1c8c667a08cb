// Host emulation of the GEMM kernels in gemm.cu, for machines without a GPU
// (tests/cuda_emulation.rs compiles it with `c++ -std=c++20` and compares its outputs bit for
// bit with qcandle's CPU quire_matmul / naive_matmul / linear).
//
// A CUDA block is emulated faithfully: one std::thread per CUDA thread (threadIdx is
// thread_local), __shared__ variables are function-local statics (one instance, shared by the
// threads of the block; blocks run one after the other), and __syncthreads() is a
// std::barrier over the block's threads. So a missing or misplaced __syncthreads, a wrong
// tile index or a race on shared memory shows up here as it would on the device (up to
// scheduling luck). The launch sequence is the one of src/quire/gemm_cuda.rs: encode A
// (row NaR flags), B (column NaR flags) and the bias, then the quire kernel of the format's
// mode or the naive kernel, over a (ceil(n/64), ceil(m/64), batch) grid of 256 threads.
//
// Usage: gemm_emulation IN OUT. IN holds cases, each (little-endian)
//   u32 naive, i32 n, i32 es, u32 batch, m, k, cols, shared_b, has_bias,
//   f32 A[batch·m·k], f32 B[(shared_b ? 1 : batch)·k·cols], f32 bias[cols] if has_bias,
//   u8 mul[65536], u8 add[65536] if naive;
// OUT receives each case's f32 C[batch·m·cols].
#include <barrier>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <vector>

#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define QC_LDG(p) (*(p))
struct Dim { unsigned x, y, z; };
static thread_local Dim threadIdx;
static Dim blockIdx, gridDim, blockDim;
static std::barrier<>* qc_block_barrier = nullptr;
static inline void __syncthreads() { qc_block_barrier->arrive_and_wait(); }
#include "gemm.cu"

// Runs f() as every thread of every block of the grid, a block at a time.
template <typename F> static void launch(Dim grid, unsigned threads, F f) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                std::barrier<> bar((ptrdiff_t)threads);
                qc_block_barrier = &bar;
                std::vector<std::thread> pool;
                pool.reserve(threads);
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([t, &f] {
                        threadIdx = {t, 0, 0};
                        f();
                    });
                for (auto& th : pool) th.join();
                qc_block_barrier = nullptr;
            }
}

template <typename T> static bool read(FILE* f, T* dst, size_t count) {
    return count == 0 || fread(dst, sizeof(T), count, f) == count;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gemm_emulation IN OUT\n");
        return 2;
    }
    FILE* in = fopen(argv[1], "rb");
    FILE* out = fopen(argv[2], "wb");
    if (!in || !out) {
        fprintf(stderr, "cannot open the files\n");
        return 2;
    }
    int cases = 0;
    uint32_t h[9];
    while (fread(h, 4, 9, in) == 9) {
        bool naive = h[0] != 0, shared_b = h[7] != 0, has_bias = h[8] != 0;
        int32_t pn = (int32_t)h[1], pes = (int32_t)h[2];
        uint32_t batch = h[3], m = h[4], k = h[5], n = h[6];
        uint32_t b_items = shared_b ? 1 : batch;
        std::vector<float> a((size_t)batch * m * k), b((size_t)b_items * k * n), bias(has_bias ? n : 0);
        std::vector<uint8_t> mul, add;
        bool ok = read(in, a.data(), a.size()) && read(in, b.data(), b.size()) &&
                  read(in, bias.data(), bias.size());
        if (naive) {
            mul.resize(65536);
            add.resize(65536);
            ok = ok && read(in, mul.data(), 65536) && read(in, add.data(), 65536);
        }
        if (!ok) {
            fprintf(stderr, "case %d: truncated input\n", cases);
            return 2;
        }
        // Step 1: patterns and flags (a small grid: the grid-stride loops wrap).
        std::vector<uint8_t> ap(a.size() + 1), bp(b.size() + 1), biasp(n + 1);
        std::vector<uint32_t> row_nar((size_t)batch * m + 1, 0), col_nar((size_t)b_items * n + 1, 0);
        Dim small = {3, 1, 1};
        launch(small, 32, [&] { qc_gemm_encode(a.data(), ap.data(), a.size(), pn, pes, row_nar.data(), k, 1); });
        launch(small, 32, [&] { qc_gemm_encode(b.data(), bp.data(), b.size(), pn, pes, col_nar.data(), k, n); });
        if (has_bias) launch(small, 32, [&] { qc_gemm_encode(bias.data(), biasp.data(), n, pn, pes, nullptr, 1, 1); });
        // Step 2: the GEMM.
        std::vector<float> c((size_t)batch * m * n);
        uint64_t a_batch = (uint64_t)m * k, b_batch = shared_b ? 0 : (uint64_t)k * n;
        const uint8_t* bias_arg = has_bias ? biasp.data() : nullptr;
        if (m > 0 && n > 0 && batch > 0) {
            Dim grid = {(n + QC_GEMM_BN - 1) / QC_GEMM_BN, (m + QC_GEMM_BM - 1) / QC_GEMM_BM, batch};
            int32_t s = qc_posit_max_scale(pn, pes);
            if (naive) {
                launch(grid, QC_GEMM_THREADS, [&] {
                    qc_naive_gemm(ap.data(), bp.data(), bias_arg, mul.data(), add.data(), c.data(), m, k, n, a_batch, b_batch, pn, pes);
                });
            } else if (s <= 6) {
                launch(grid, QC_GEMM_THREADS, [&] {
                    qc_quire_gemm_i64(ap.data(), bp.data(), bias_arg, row_nar.data(), col_nar.data(), c.data(), m, k, n, a_batch, b_batch, pn, pes);
                });
            } else if (s <= 12) {
                launch(grid, QC_GEMM_THREADS, [&] {
                    qc_quire_gemm_i64x128(ap.data(), bp.data(), bias_arg, row_nar.data(), col_nar.data(), c.data(), m, k, n, a_batch, b_batch, pn, pes);
                });
            } else {
                launch(grid, QC_GEMM_THREADS, [&] {
                    qc_quire_gemm_i128(ap.data(), bp.data(), bias_arg, row_nar.data(), col_nar.data(), c.data(), m, k, n, a_batch, b_batch, pn, pes);
                });
            }
        }
        if (!c.empty() && fwrite(c.data(), 4, c.size(), out) != c.size()) {
            fprintf(stderr, "cannot write the output\n");
            return 2;
        }
        ++cases;
    }
    fclose(out);
    printf("%d cases\n", cases);
    return 0;
}
