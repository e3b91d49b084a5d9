// Warp-level tiles for hfnn's attention kernels (short_attention.cu, mid_attention.cu): 16-bit
// rows in shared memory padded by kPad elements, loaded by cp.async and read by ldmatrix as the
// fragments of mma.sync m16n8k16 (kernels/common/mma.cuh), float accumulators of 16 rows a warp,
// their softmax in base 2, and rows written back as 16-byte vectors. A warp owns 16 rows of a
// product; lane l holds rows l/4 and l/4 + 8 of each 16x8 accumulator tile.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/mma.cuh"

namespace hfnn::kernels::multihead_attention::tiles {

constexpr int kPad = 8;       // elements of padding a 16-bit row
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ constexpr int round16(int64_t n) { return static_cast<int>((n + 15) / 16 * 16); }
__host__ __device__ constexpr std::size_t align128(std::size_t n) { return (n + 127) / 128 * 128; }

// A supports() refusal: the reason into `why` (where asked), and false.
inline bool fail(std::string* why, const char* text) {
  if (why) *why = text;
  return false;
}

// A block's shared memory carved into arrays one after another, each starting on 128 bytes.
struct SmemCarve {
  std::size_t at = 0;  // the total so far
  __host__ __device__ std::size_t take(std::size_t bytes) {
    const std::size_t start = at;
    at = align128(at + bytes);
    return start;
  }
};

// ---- PTX wrappers: asynchronous copies, ldmatrix (mma.sync and pack2: kernels/common/mma.cuh) ----

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 (or 4) bytes global -> shared without registers; `valid` false writes zeros.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 16-bit matrices from shared memory, lane l giving row (l % 8) of matrix l / 8; with
// .trans each is transposed on the way.
__device__ __forceinline__ void ldsm(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldsm_t(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// ---- fragment addressing (lane l of the warp; tiles of 16 rows at r0, 16 columns at c0) ----
// In a float accumulator tile of 16x8, lane l holds rows l/4 and l/4 + 8, columns 2 (l%4) and +1.

// A operand (16x16, row-major in shared memory at [r0, c0]).
template <typename T>
__device__ __forceinline__ const T* a_row(const T* base, int ld, int r0, int c0, int lane) {
  return base + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8;
}
// Two B operands (16x8 each, for columns n0 and n0 + 8 of the product) of X^T where X is [n, k]
// in shared memory: rows n0.., columns k0.. Registers: b0, b1 of n0, then of n0 + 8. at(r, c): the
// address of X's element (r, c), for a layout other than padded rows (bt_row).
template <typename At>
__device__ __forceinline__ auto bt_at(At&& at, int n0, int k0, int lane) {
  return at(n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8);
}
template <typename T>
__device__ __forceinline__ const T* bt_row(const T* base, int ld, int n0, int k0, int lane) {
  return bt_at([&](int r, int c) { return base + r * ld + c; }, n0, k0, lane);
}
// Two B operands of X itself where X is [k, n] (loaded with .trans): rows k0.., columns n0..
template <typename At>
__device__ __forceinline__ auto b_at(At&& at, int k0, int n0, int lane) {
  return at(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8);
}
template <typename T>
__device__ __forceinline__ const T* b_row(const T* base, int ld, int k0, int n0, int lane) {
  return b_at([&](int r, int c) { return base + r * ld + c; }, k0, n0, lane);
}
// A operand of X^T where X is [k, m] row-major (loaded with .trans): rows k0.., columns m0..
template <typename T>
__device__ __forceinline__ const T* at_row(const T* base, int ld, int k0, int m0, int lane) {
  return base + (k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8;
}

// The A operand of the 16 columns [16 kb, 16 kb + 16) of a 16-row accumulator array.
template <typename T, int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[N][4], int kb) {
  a[0] = pack2<T>(acc[2 * kb][0], acc[2 * kb][1]);
  a[1] = pack2<T>(acc[2 * kb][2], acc[2 * kb][3]);
  a[2] = pack2<T>(acc[2 * kb + 1][0], acc[2 * kb + 1][1]);
  a[3] = pack2<T>(acc[2 * kb + 1][2], acc[2 * kb + 1][3]);
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// acc[16 x 8 kN] (+)= A B for the warp's 16 rows: A's 16-column blocks from a_of(kb, a) for kb <
// k_blocks, B's 16-column pairs from ldsm at b_of(kb, np) (transposed when kTransB) for np < n_pairs.
template <typename T, int kK, int kN, bool kTransB, typename AOf, typename BOf>
__device__ __forceinline__ void product(float (&acc)[kN][4], int k_blocks, int n_pairs, AOf&& a_of, BOf&& b_of) {
#pragma unroll
  for (int kb = 0; kb < kK; ++kb) {
    if (kb < k_blocks) {
      uint32_t a[4];
      a_of(kb, a);
#pragma unroll
      for (int np = 0; np < kN / 2; ++np) {
        if (np < n_pairs) {
          uint32_t b[4];
          if constexpr (kTransB) ldsm_t(b, b_of(kb, np));
          else ldsm(b, b_of(kb, np));
          mma<T>(acc[2 * np], a, b[0], b[1]);
          mma<T>(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
  }
}

// Rows [0, n) of a [n, Dh] view (rows `stride` elements apart, 16-byte aligned) into shared memory
// with leading dimension ld; rows [n, padded) zero. A thread keeps one 16-byte column (kD / 8 of
// them a row: a power of two) and steps down the rows by pointer adds: no division in the loop.
template <typename T, int kD>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, int64_t stride, int n, int padded,
                                          int head_dim) {
  constexpr int kVecs = kD / 8;
  const int c = (threadIdx.x % kVecs) * 8;
  if (c >= head_dim) return;
  const int step = blockDim.x / kVecs;
  int r = threadIdx.x / kVecs;
  const T* from = src + r * stride + c;
  T* to = dst + r * ld + c;
  for (; r < padded; r += step, from += step * stride, to += step * ld) copy16(to, r < n ? from : src, r < n);
}

// A 16 x Dh float accumulator array (rows r0.., `rows_left` of them real), scaled a row by s_lo and
// s_hi, through shared memory (`stage`, [16, ld], this warp's alone) to global rows `stride` apart
// as 16-byte vectors.
template <typename T, int kD>
__device__ __forceinline__ void write_rows(const float (&acc)[kD / 8][4], float s_lo, float s_hi, T* stage, int ld,
                                           T* dst, int64_t stride, int rows_left, int head_dim, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    if (n < head_dim / 8) {
      *reinterpret_cast<uint32_t*>(stage + g * ld + n * 8 + 2 * t) = pack2<T>(acc[n][0] * s_lo, acc[n][1] * s_lo);
      *reinterpret_cast<uint32_t*>(stage + (g + 8) * ld + n * 8 + 2 * t) = pack2<T>(acc[n][2] * s_hi, acc[n][3] * s_hi);
    }
  }
  __syncwarp();
  constexpr int kVecs = kD / 8, kRowsPer = 32 / kVecs;  // a lane keeps one 16-byte column
  const int c = (lane % kVecs) * 8;
  if (c < head_dim) {
#pragma unroll
    for (int k = 0; k < 16 / kRowsPer; ++k) {
      const int r = lane / kVecs + k * kRowsPer;
      if (r < rows_left) *reinterpret_cast<uint4*>(dst + r * stride + c) = *reinterpret_cast<const uint4*>(stage + r * ld + c);
    }
  }
  __syncwarp();
}

// The warp's scores of keys it may not see (j >= kv_len, or j > i when causal) set to -inf, for
// rows i_lo (accumulator halves 0, 1) and i_lo + 8 (2, 3), the array's columns being keys j0 on.
// Rows past L are left as they are: their Q rows are zeros, and nothing is written for them.
template <int kS>
__device__ __forceinline__ void mask_scores(float (&acc)[kS / 8][4], int j0, int i_lo, int kv_len, bool causal,
                                            int t) {
#pragma unroll
  for (int n = 0; n < kS / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = j0 + n * 8 + 2 * t + e;
      if (j >= kv_len || (causal && j > i_lo)) acc[n][e] = -INFINITY;
      if (j >= kv_len || (causal && j > i_lo + 8)) acc[n][2 + e] = -INFINITY;
    }
  }
}

// 2^x on the special-function unit (flushing denormal results to zero; -inf gives 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// acc = 2^(acc c - base_lo) in rows i_lo, 2^(acc c - base_hi) in rows i_lo + 8 (one FFMA and one
// EX2 an entry).
template <int kS>
__device__ __forceinline__ void exp2_rows(float (&acc)[kS / 8][4], float c, float base_lo, float base_hi) {
#pragma unroll
  for (int n = 0; n < kS / 8; ++n) {
    acc[n][0] = exp2_approx(fmaf(acc[n][0], c, -base_lo));
    acc[n][1] = exp2_approx(fmaf(acc[n][1], c, -base_lo));
    acc[n][2] = exp2_approx(fmaf(acc[n][2], c, -base_hi));
    acc[n][3] = exp2_approx(fmaf(acc[n][3], c, -base_hi));
  }
}

// Max and sum over the four lanes that hold a row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// dS = P (dP - D) scale in dP's place (D = d_lo for the accumulators' rows i_lo, d_hi for i_hi), and
// P and dS of the first n_tiles 8-column tiles staged as 16-bit pairs at [i, j] of ps and dss (leading
// dimension ld), for the products that contract over the rows. (`scale` by reference: the kernel's
// parameter stays an operand in constant memory, as written inline before this was shared.)
template <typename T, int kS>
__device__ __forceinline__ void ds_and_stage(const float (&pr)[kS / 8][4], float (&ds)[kS / 8][4], float d_lo,
                                             float d_hi, const float& scale, int n_tiles, T* ps, T* dss, int ld,
                                             int i_lo, int i_hi, int t) {
#pragma unroll
  for (int n = 0; n < kS / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      ds[n][e] = pr[n][e] * (ds[n][e] - d_lo) * scale;
      ds[n][2 + e] = pr[n][2 + e] * (ds[n][2 + e] - d_hi) * scale;
    }
    if (n < n_tiles) {
      const int j = n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(ps + i_lo * ld + j) = pack2<T>(pr[n][0], pr[n][1]);
      *reinterpret_cast<uint32_t*>(ps + i_hi * ld + j) = pack2<T>(pr[n][2], pr[n][3]);
      *reinterpret_cast<uint32_t*>(dss + i_lo * ld + j) = pack2<T>(ds[n][0], ds[n][1]);
      *reinterpret_cast<uint32_t*>(dss + i_hi * ld + j) = pack2<T>(ds[n][2], ds[n][3]);
    }
  }
}

}  // namespace hfnn::kernels::multihead_attention::tiles
