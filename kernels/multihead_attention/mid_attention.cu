// hfnn's attention backward for sequences of up to 256 tokens (mid_attention.h): one block per
// (batch, head), one warp per 16 query rows (Lp / 16 warps, Lp = L rounded up to 16, or to 64 in the
// swizzled kernel below; at most 16 warps).
//
// A block:
//   1. copies Q, the log-sum-exp, dO, O (into P's staging) and the first step's K, then its V, then
//      each later step's K and V into shared memory (cp.async, a group each, waited for as needed);
//      each warp sums D_i = sum_d dO_id O_id for its 16 rows from there (O and dO read straight
//      from global memory by the warps cost 865 against 659 us a call, [200, 256, 1024, 16], H100);
//   2. steps over the keys 64 at a time. A warp computes its rows' scores against the step's keys,
//      P = 2^(S c - lse), dP = dO V^T and dS = P (dP - D) scale in registers, adds dS K to its dQ
//      (registers, over every step) and stages P and dS in shared memory. After a barrier the
//      block's warps take the step's dV = P^T dO and dK = dS^T Q in tiles of 16 keys x 32
//      columns (32 keys x 32 columns, a warp a tile, in the non-causal kernel of whole steps and
//      128 query rows or more; on Hopper's swizzled kernels by wgmma, below), contracting over
//      every query, each written through the step's own rows of K's or V's array (read no more)
//      to global memory as 16-byte rows; a second barrier frees the staging for the next step;
//   3. writes dQ through the warp's own rows of Q's array, and where asked its column sums (the
//      input projection's bias gradient's query rows, per block; the op sums over the batch).
//
// Shared memory (16-bit rows padded by 8 elements, as short_attention.cu, except in Hopper's
// swizzled kernels below): Q and dO [Lp, Dh], K and V [Sp, Dh], P and dS of a step [Lp, 64] (O's
// rows there before the first step), the log-sum-exp and D [Lp]: 218 KB at 256 x 256 x 64, so one
// block an SM, 16 warps, at most 128 registers a thread.
// On Hopper the kernels of head size 64 in whole steps (mid_swizzled) keep K and V unpadded, in
// wgmma's 128-byte swizzle, and compute a step's scores and dP with wgmma, a warpgroup's 64 rows
// against the step's 64 keys (Lp then a multiple of 64): K and V read once a warpgroup, not once a
// warp (H100, [200, 256, 1024, 16] bf16: 634 -> 583 us a call; causal, with dQ by wgmma too,
// 491 -> 444). Q, dO, P and dS are there in the same swizzle (195 KB at 256 x 256 x 64), so dQ,
// dV and dK are wgmma's too: dV = P^T dO and dK = dS^T Q with both operands in shared memory as
// they lie, the step's 64 keys x 32 columns a warpgroup (H200, the same shape: 580 -> 562 us;
// causal 443 -> 421; results/mha_mid_wgmma_dvdk-h200.json).
#include "kernels/multihead_attention/mid_attention.h"

#include <cstring>

#include "kernels/common/device.cuh"
#include "kernels/multihead_attention/attention_tiles.cuh"

namespace hfnn::kernels::multihead_attention {
namespace {

using namespace tiles;

constexpr int kMidWarps = 16;  // 256 query rows
constexpr int kStep = 64;      // keys a step

// Where each array starts in the block's shared memory (bytes), and the total.
struct MidLayout {
  int lp = 0, sp = 0, ld = 0, lds = 0;  // padded lengths; leading dimensions of [*, Dh] and [Lp, kStep]
  std::size_t q = 0, k = 0, v = 0, dout = 0, p = 0, ds = 0, lse = 0, d = 0, total = 0;
};

// Whether a call runs the kernel whose arrays are wgmma's operands (kSwz below): on Hopper (whose
// machine code has wgmma; the same layout read by mma.sync where the code is not sm_90a's), head
// size 64, keys in whole steps; not causal, 128 query rows or more (the mma.sync fallback's dV/dK
// tiles take a warp each; the wgmma kernel itself would take fewer). The one decision: the launch picks the kernel and its layout from it, and the block's
// shared memory that supports() checks comes from the same. Elsewhere (an A100: 163 KB a block) the
// padded layout, whose query rows are padded to 16 and not 64, keeps the shapes that fit there.
bool mid_swizzled(const ShortShape& s) {
  return s.device.cc_major == 9 && s.head_dim == 64 && s.kv_len % kStep == 0 && (s.causal || s.q_len >= 128);
}

// swz: K and V as 64-column rows of 128 bytes in wgmma's 128-byte swizzle, first in the block and
// on 1,024 bytes (the total has 1,024 bytes of slack: the kernel aligns the block's base), and
// the query rows padded to warpgroups of 64.
__host__ __device__ MidLayout mid_layout(int64_t q_len, int64_t kv_len, int64_t head_dim, bool swz) {
  MidLayout l;
  l.lp = swz ? static_cast<int>((q_len + 63) / 64 * 64) : round16(q_len);
  l.sp = round16(kv_len);
  l.ld = static_cast<int>(head_dim) + kPad;
  l.lds = kStep + kPad;
  SmemCarve c;
  if (swz) {
    l.k = c.take(std::size_t(l.sp) * 128);
    l.v = c.take(std::size_t(l.sp) * 128);
  }
  // swz: Q, dO, P and dS in the same swizzle (each a multiple of 1,024 bytes), wgmma's operands of
  // dV and dK.
  const std::size_t x_row = swz ? 128 : std::size_t(l.ld) * 2, p_row = swz ? 128 : std::size_t(l.lds) * 2;
  l.q = c.take(std::size_t(l.lp) * x_row);
  if (!swz) {
    l.k = c.take(std::size_t(l.sp) * l.ld * 2);
    l.v = c.take(std::size_t(l.sp) * l.ld * 2);
  }
  l.dout = c.take(std::size_t(l.lp) * x_row);
  l.p = c.take(std::size_t(l.lp) * p_row);
  l.ds = c.take(std::size_t(l.lp) * p_row);
  l.lse = c.take(std::size_t(l.lp) * 4);
  l.d = c.take(std::size_t(l.lp) * 4);
  l.total = c.at + (swz ? 1024 : 0);
  return l;
}

// Element (r, c) of a 64-column 16-bit array in the 128-byte swizzle: row r's 16-byte chunk j is
// stored at chunk j ^ (r % 8) of its 128 bytes (so 8 rows' same chunk fall in 8 bank groups).
template <typename P>
__device__ __forceinline__ P swz(P base, int r, int c) {
  return base + r * 64 + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}

// wgmma (sm_90a machine code only: the PTX for other GPUs takes mma.sync on the same layout).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool kHaveWgmma = true;
#else
constexpr bool kHaveWgmma = false;
#endif

// A shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: rows of 128
// bytes, 8-row groups 1,024 bytes apart (the stride byte offset), the leading byte offset unused.
// (A template: code without wgmma never instantiates it.)
template <typename T>
__device__ __forceinline__ uint64_t sw128_desc(const T* p) {
  const uint64_t a = smem_addr(p);
  return ((a & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// Writes by this thread's generic proxy (cp.async, stores) ordered before the async proxy's reads
// (wgmma's shared-memory operands), once the barrier after it has passed.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// acc[64 x 64 over the warpgroup; this warp's 16 rows] += A B: A (16 x 16 a warp) from registers in
// mma.sync's A layout, B (16 x 64) through the descriptor, K-major (kTransB false: B^T's rows of
// 128 bytes, a k-block 32 bytes on) or N-major (true: B's own rows, a k-block 16 rows = 2,048 bytes
// on; the 8-row groups 1,024 bytes apart either way); the accumulators in mma.sync's C layout, 8
// column blocks of 8. Fenced, committed and waited for here: the products that follow read the
// accumulators.
template <typename T, int kK, bool kTransB = false>
__device__ __forceinline__ void wgmma_rows(float (&d)[8][4], const uint32_t (&a)[kK][4], uint64_t desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kb = 0; kb < kK; ++kb) {
    // K-major: the 16 columns of B^T at kb start 32 bytes on in each 128-byte row (address + 2);
    // N-major: 16 rows on (address + 128).
    const uint64_t dk = desc + (kTransB ? 128 : 2) * kb;
// scale-d: a predicate, set from operand 37 (1: accumulate; the caller zeroes the accumulators).
#define HFNN_WGMMA_PRED "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
#define HFNN_WGMMA_ARGS                                                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
#define HFNN_WGMMA_OPERANDS                                                                                      \
  : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),    \
    "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
    "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
    "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])                                                  \
  : "r"(a[kb][0]), "r"(a[kb][1]), "r"(a[kb][2]), "r"(a[kb][3]), "l"(dk), "r"(1), "n"(kTransB ? 1 : 0)
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      asm volatile(HFNN_WGMMA_PRED "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HFNN_WGMMA_ARGS
                   HFNN_WGMMA_OPERANDS);
    else
      asm volatile(HFNN_WGMMA_PRED "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " HFNN_WGMMA_ARGS
                   HFNN_WGMMA_OPERANDS);
#undef HFNN_WGMMA_PRED
#undef HFNN_WGMMA_ARGS
#undef HFNN_WGMMA_OPERANDS
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// acc[64 x 32 over the warpgroup; this warp's 16 rows] += A B over kK blocks of 16: A (64 x 16 kK)
// M-major and B (16 kK x 32) N-major, both in shared memory in the 128-byte swizzle (the rows, k,
// of 128 bytes: A^T and B as stored; B's 32 columns may start 64 bytes into its rows), a k-block
// 16 rows = 2,048 bytes on in each. kK a constant: with a run-time count ptxas serialized the
// wgmmas (C7515). Fenced, committed and waited for here.
template <typename T, int kK>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kb = 0; kb < kK; ++kb) {
    const uint64_t da = desc_a + 128 * kb, db = desc_b + 128 * kb;
#define HFNN_WGMMA_SS(TYPE)                                                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 1, 1;\n}\n"  \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),       \
                 "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),       \
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])                                      \
               : "l"(da), "l"(db), "r"(1))
    if constexpr (std::is_same_v<T, __nv_bfloat16>) HFNN_WGMMA_SS("bf16");
    else HFNN_WGMMA_SS("f16");
#undef HFNN_WGMMA_SS
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// The same over k_blocks: 4, 8, 12 or 16 (rows from a multiple of 64 to at most 256), or, where
// kMayBeEmpty (causal), 0: keys past every query row, d left as it is.
template <typename T, bool kMayBeEmpty>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int k_blocks) {
  switch (k_blocks) {
    case 16: wgmma_ss_mn<T, 16>(d, desc_a, desc_b); break;
    case 12: wgmma_ss_mn<T, 12>(d, desc_a, desc_b); break;
    case 8: wgmma_ss_mn<T, 8>(d, desc_a, desc_b); break;
    default:
      if (!kMayBeEmpty || k_blocks == 4) wgmma_ss_mn<T, 4>(d, desc_a, desc_b);
      break;
  }
}

// A warp's 16 rows (i_lo and i_lo + 8) of a [*, 64] float accumulator array (64 columns: a step's
// keys, or Dh) as 16-bit pairs into a 64-column swizzled array.
template <typename T>
__device__ __forceinline__ void stage_swz(const float (&acc)[8][4], T* dst, int i_lo, int t) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    *reinterpret_cast<uint32_t*>(swz(dst, i_lo, n * 8 + 2 * t)) = pack2<T>(acc[n][0], acc[n][1]);
    *reinterpret_cast<uint32_t*>(swz(dst, i_lo + 8, n * 8 + 2 * t)) = pack2<T>(acc[n][2], acc[n][3]);
  }
}

// A warp's 16 x 64 float accumulator array (rows r0.., rows_left of them real) through its own rows
// of a 64-column swizzled array to global rows `stride` apart as 16-byte vectors (write_rows of
// attention_tiles.cuh, for the swizzle).
template <typename T>
__device__ __forceinline__ void write_rows_swz(const float (&acc)[8][4], T* stage, int r0, T* dst, int64_t stride,
                                               int rows_left, int lane) {
  stage_swz<T>(acc, stage, r0 + (lane >> 2), lane & 3);
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = lane / 8 + k * 4, c = (lane % 8) * 8;
    if (r < rows_left) *reinterpret_cast<uint4*>(dst + r * stride + c) = *reinterpret_cast<const uint4*>(swz(stage, r0 + r, c));
  }
  __syncwarp();
}

// A 16 x 32 float accumulator tile (16-column pairs [0, pairs) of it real) through shared memory
// (stage(r, c): element (r, c) of the tile's place, this warp's alone) to global rows `stride`
// apart as 16-byte vectors; rows past rows_left are not written.
template <typename T, typename Stage>
__device__ __forceinline__ void write_tile(const float (&acc)[4][4], int pairs, Stage&& stage, T* dst,
                                           int64_t stride, int rows_left, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    if (n < 2 * pairs) {
      *reinterpret_cast<uint32_t*>(stage(g, n * 8 + 2 * t)) = pack2<T>(acc[n][0], acc[n][1]);
      *reinterpret_cast<uint32_t*>(stage(g + 8, n * 8 + 2 * t)) = pack2<T>(acc[n][2], acc[n][3]);
    }
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int r = lane / 4 + k * 8, c = (lane % 4) * 8;
    if (c < pairs * 16 && r < rows_left)
      *reinterpret_cast<uint4*>(dst + r * stride + c) = *reinterpret_cast<const uint4*>(stage(r, c));
  }
  __syncwarp();
}

// Rows [0, n) of a [n, 64] view (rows `stride` elements apart) into a 64-column swizzled array
// (swz); rows [n, padded) zero. A thread keeps one 16-byte column and steps down the rows. dst is
// a multiple of 8 rows into its array (a step's first row), so the swizzle's row % 8 is the same.
template <typename T>
__device__ __forceinline__ void load_rows_swz(T* dst, const T* src, int64_t stride, int n, int padded) {
  const int c = (threadIdx.x % 8) * 8, step = blockDim.x / 8;
  for (int r = threadIdx.x / 8; r < padded; r += step)
    copy16(swz(dst, r, c), r < n ? src + r * stride + c : src, r < n);
}

// Until at most n of this thread's copy groups are in flight (n below 0 counts as 0; at most 4
// steps of 64 keys, so at most 4 groups wait behind).
__device__ __forceinline__ void wait_pending(int n) {
  switch (n) {
    case 4: wait_copies<4>(); break;
    case 3: wait_copies<3>(); break;
    case 2: wait_copies<2>(); break;
    case 1: wait_copies<1>(); break;
    default: wait_copies<0>(); break;
  }
}

// kExact: the head size is kD and the keys fill whole steps (S a multiple of 64): every tile count
// a constant, so the products' loops unroll without guards (the issue's [200, 256, 1024, 16], H100:
// 4,200 instructions a warp against 7,000, 865 against 1,012 us a call). Not causal, the launch
// also asks for 128 query rows or more (its dV/dK tiles below).
// kCausal: the call's causal flag as a constant, so the non-causal kernel carries none of the
// causal skips' branches (with them as run-time tests it took 670 against 660 us a call at
// [200, 256, 1024, 16] bf16 on an H100).
// kSwz (the launch's mid_swizzled: Hopper, head size 64, whole steps; not causal, 128 query rows
// or more): K, V, Q, dO, P and dS in the 128-byte swizzle, so the scores S = Q K^T, dP = dO V^T
// and dQ = dS K are wgmma's, a warpgroup's 64 rows against the step's 64 keys (K and V read once a
// warpgroup instead of once a warp), and dV and dK too, both operands from shared memory (mma.sync
// on the same layout where the machine code is not sm_90a's).
template <typename T, int kD, bool kExact, bool kCausal, bool kSwz = false>
__global__ void __launch_bounds__(kMidWarps * 32, 1) mid_bwd_kernel(MidBwdParams p) {
  // Causal too: a warp skips a step where its rows all come before the step's keys, and with steps
  // of 64 keys and warpgroups of 64 rows the four warps of a warpgroup skip the same steps, so
  // wgmma's warpgroup stays whole.
  static_assert(!kSwz || (kExact && kD == 64), "the swizzled kernel: mid_swizzled's calls");
  constexpr bool kWgmma = kSwz && kHaveWgmma;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw;
  if constexpr (kSwz) smem += (1024 - smem_addr(smem_raw) % 1024) % 1024;  // the swizzle's 1,024 bytes
  const ShortShape& s = p.shape;
  const int q_len = static_cast<int>(s.q_len), kv_len = static_cast<int>(s.kv_len), dh = static_cast<int>(s.head_dim);
  const MidLayout l = mid_layout(q_len, kv_len, dh, kSwz);
  const int ld = kExact ? kD + kPad : l.ld;
  // Element (r, c) of K's or V's array.
  auto kv = [&](auto* base, int r, int c) {
    if constexpr (kSwz) return swz(base, r, c);
    else return base + r * ld + c;
  };
  constexpr int lds = kStep + kPad;
  // Element (r, c) of Q's or dO's array (xa), of P's or dS's (pa; O's rows before the first step).
  auto xa = [&](auto* base, int r, int c) {
    if constexpr (kSwz) return swz(base, r, c);
    else return base + r * ld + c;
  };
  auto pa = [&](auto* base, int r, int c) {
    if constexpr (kSwz) return swz(base, r, c);
    else return base + r * lds + c;
  };
  // Rows [0, n) of a [n, Dh] view into Q's, dO's or P's array, rows to `padded` zero.
  auto load_x = [&](T* dst, int dst_ld, const T* src, int64_t stride, int n, int padded) {
    if constexpr (kSwz) load_rows_swz(dst, src, stride, n, padded);
    else load_rows<T, kD>(dst, dst_ld, src, stride, n, padded, dh);
  };
  T* qs = reinterpret_cast<T*>(smem + l.q);
  T* ks = reinterpret_cast<T*>(smem + l.k);
  T* vs = reinterpret_cast<T*>(smem + l.v);
  T* dos = reinterpret_cast<T*>(smem + l.dout);
  T* ps = reinterpret_cast<T*>(smem + l.p);
  T* dss = reinterpret_cast<T*>(smem + l.ds);
  float* ls = reinterpret_cast<float*>(smem + l.lse);
  float* dsum = reinterpret_cast<float*>(smem + l.d);
  const int heads = static_cast<int>(s.heads);
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;

  // Copies in groups, in the order they are needed: Q, the log-sum-exp, the first step's K, dO and
  // O (P and D), then the first V (dP), then each later step's K and V, which land while the steps
  // before them compute (waited for at the end of the step before). Causal, dO and O go with the
  // first V (below).
  const T* k_src = static_cast<const T*>(p.k) + b * p.sk.b + h * p.sk.h;
  const T* v_src = static_cast<const T*>(p.v) + b * p.sv.b + h * p.sv.h;
  auto load_step = [&](T* dst, const T* src, int64_t stride, int j0) {
    if constexpr (kSwz) load_rows_swz(dst + j0 * 64, src + j0 * stride, stride, kv_len - j0, min(kStep, l.sp - j0));
    else load_rows<T, kD>(dst + j0 * ld, ld, src + j0 * stride, stride, kv_len - j0, min(kStep, l.sp - j0), dh);
  };
  load_x(qs, ld, static_cast<const T*>(p.q) + b * p.sq.b + h * p.sq.h, p.sq.l, q_len, l.lp);
  const float* lse = p.lse + b * p.lse_b + h * p.lse_h;
  for (int i = threadIdx.x; i < l.lp; i += blockDim.x) copy4(ls + i, i < q_len ? lse + i : lse, i < q_len);
  load_step(ks, k_src, p.sk.l, 0);
  // Causal: dO and O go with the first V instead, and the first step's scores are computed while
  // they land (D is then summed at the first step). Measured at 256 x 256 x 64 on an H100: causal
  // 504 -> 491 us; not causal 675 -> 687 (16 bytes of spills there), so it keeps them here.
  if constexpr (kCausal) commit();
  const T* dout = static_cast<const T*>(p.dout) + b * p.sdo.b + h * p.sdo.h;
  load_x(dos, ld, dout, p.sdo.l, q_len, l.lp);
  // O, for D, into the staging of P (free until the first step stages P there).
  load_x(ps, lds, static_cast<const T*>(p.o) + b * p.so.b + h * p.so.h, p.so.l, q_len, l.lp);
  if constexpr (!kCausal) commit();
  load_step(vs, v_src, p.sv.l, 0);
  commit();
  const int steps = (l.sp + kStep - 1) / kStep;  // groups: 2 + (steps - 1)
  for (int j0 = kStep; j0 < l.sp; j0 += kStep) {
    load_step(ks, k_src, p.sk.l, j0);
    load_step(vs, v_src, p.sv.l, j0);
    commit();
  }

  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
  const int g = lane >> 2, t = lane & 3;

  wait_pending(steps);  // Q, the log-sum-exp, the first K (not causal: dO and O too)
  if constexpr (kWgmma) fence_proxy_async();
  __syncthreads();

  const int d_blocks = kExact ? kD / 16 : dh / 16;
  const int i_lo = r0 + g, i_hi = r0 + g + 8;
  const float c = p.scale * kLog2e;
  const float base_lo = ls[i_lo] * p.lse_to_log2, base_hi = ls[i_hi] * p.lse_to_log2;
  T* dv_out = static_cast<T*>(p.dv) + b * p.sdv.b + h * p.sdv.h;
  T* dk_out = static_cast<T*>(p.dk) + b * p.sdk.b + h * p.sdk.h;
  const int l_blocks = l.lp / 16;
  const int halves = kExact ? kD / 32 : (dh + 31) / 32;

  float dq[kD / 8][4];
  zero(dq);
  float dd_lo = 0.f, dd_hi = 0.f;  // D of rows i_lo and i_hi
  auto sum_d = [&] {
    // D_i = sum_d dO_id O_id for the warp's own rows (two lanes a row, 16-byte vectors in turn),
    // from O in P's staging rows, which only this warp writes next; rows past L are 0.
    const int r = r0 + lane / 2;
    float d = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < kD; c0 += 16) {
      const int col = c0 + (lane & 1) * 8;
      if (col < dh) {
        const uint4 ov = *reinterpret_cast<const uint4*>(pa(ps, r, col));
        const uint4 gv = *reinterpret_cast<const uint4*>(xa(dos, r, col));
        T oe[8], ge[8];
        memcpy(oe, &ov, 16);
        memcpy(ge, &gv, 16);
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(to_float(oe[e]), to_float(ge[e]), d);
      }
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    if ((lane & 1) == 0) dsum[r] = d;
    __syncwarp();
    dd_lo = dsum[i_lo];
    dd_hi = dsum[i_hi];
  };
  if constexpr (!kCausal) sum_d();
  for (int k0 = 0; k0 < l.sp; k0 += kStep) {
    const int k_pairs = kExact ? kStep / 16 : min(kStep, l.sp - k0) / 16;  // 16-key blocks in this step

    // Causal: a warp whose rows all come before the step's first key has P = 0 and dS = 0 there and
    // skips the step (its staging rows are then stale, and the tiles below never read them: a
    // tile reads query rows from its own first key on).
    const bool live = !kCausal || k0 <= r0 + 15;

    // The warp's rows of P for the step's keys, from the forward's log-sum-exp. (Rows past L: zero
    // Q and dO rows, a log-sum-exp of 0 and D = 0 give P = 1, dP = 0 and dS = 0, which add nothing.)
    // acc = X Y^T for the warp's rows against the step's keys: X (Q or dO) the warp's rows of its
    // array, Y (K or V) the step's rows of its array.
    auto rows_by_keys = [&](float(&acc)[kStep / 8][4], const T* xs, const T* ys) {
      zero(acc);
      if constexpr (kWgmma) {
        uint32_t a[kD / 16][4];
#pragma unroll
        for (int kb = 0; kb < kD / 16; ++kb) ldsm(a[kb], swz(xs, r0 + (lane & 15), kb * 16 + (lane >> 4) * 8));
        wgmma_rows<T, kD / 16>(acc, a, sw128_desc(ys + k0 * 64));
      } else {
        product<T, kD / 16, kStep / 8, false>(
            acc, d_blocks, k_pairs,
            [&](int kb, uint32_t(&a)[4]) {
              if constexpr (kSwz) ldsm(a, swz(xs, r0 + (lane & 15), kb * 16 + (lane >> 4) * 8));
              else ldsm(a, a_row(xs, ld, r0, kb * 16, lane));
            },
            [&](int kb, int np) {
              return bt_at([&](int r, int c) { return kv(ys, r, c); }, k0 + np * 16, kb * 16, lane);
            });
      }
    };
    float pr[kStep / 8][4];
    if (live) {
      rows_by_keys(pr, qs, ks);
      if (kCausal || kv_len < k0 + kStep) mask_scores<kStep>(pr, k0, i_lo, kv_len, kCausal, t);
      exp2_rows<kStep>(pr, c, base_lo, base_hi);
    }

    if (k0 == 0) {
      wait_pending(steps - 1);  // the first V (causal: dO and O too)
      if constexpr (kWgmma) fence_proxy_async();
      __syncthreads();
      if constexpr (kCausal) sum_d();
    }
    if (live) {
      // dP = dO V^T, then dS = P (dP - D) scale in its place; P and dS staged for dV and dK.
      float ds[kStep / 8][4];
      rows_by_keys(ds, dos, vs);
      if constexpr (kSwz) {  // dS alone there (no tiles staged), then both staged in the swizzle
        ds_and_stage<T, kStep>(pr, ds, dd_lo, dd_hi, p.scale, 0, ps, dss, lds, i_lo, i_hi, t);
        stage_swz<T>(pr, ps, i_lo, t);
        stage_swz<T>(ds, dss, i_lo, t);
      } else {
        ds_and_stage<T, kStep>(pr, ds, dd_lo, dd_hi, p.scale, 2 * k_pairs, ps, dss, lds, i_lo, i_hi, t);
      }
      // dQ += dS K over the step's keys (dS from the accumulators, rounded to the dtype as staged).
      // By wgmma on Hopper. (With dV and dK by mma.sync the non-causal kernel took it by mma.sync:
      // dQ's 32 accumulators pinned for wgmma spilled 28 bytes there and ran slower, H100, config 0:
      // 586-590 against 580-584 us, results/mha_mid_wgmma_causal-h100.json. With dV and dK by
      // wgmma, on an H200: 562 us by wgmma, 632 by mma.sync, 580 before either,
      // results/mha_mid_wgmma_dvdk-h200.json.)
      if constexpr (kWgmma) {
        // K itself is B here (keys x head columns, the columns contiguous): N-major.
        uint32_t a[kStep / 16][4];
#pragma unroll
        for (int kb = 0; kb < kStep / 16; ++kb) acc_to_a<T>(a[kb], ds, kb);
        wgmma_rows<T, kStep / 16, true>(dq, a, sw128_desc(ks + k0 * 64));
      } else {
        product<T, kStep / 16, kD / 8, true>(
            dq, k_pairs, d_blocks, [&](int kb, uint32_t(&a)[4]) { acc_to_a<T>(a, ds, kb); },
            [&](int kb, int np) {
              return b_at([&](int r, int c) { return kv(ks, r, c); }, k0 + kb * 16, np * 16, lane);
            });
      }
    }
    if constexpr (kWgmma) fence_proxy_async();  // P and dS, wgmma's operands below
    __syncthreads();

    // The A operand of X^T (X: P or dS, [query rows, keys]) at rows k0.., keys m0.., and two B
    // operands of X (dO or Q, [query rows, Dh]) at rows k0.., columns n0.., as ldmatrix's rows.
    auto at_of = [&](const T* x, int k0_, int m0) {
      if constexpr (kSwz) return pa(x, k0_ + (lane & 7) + (lane >> 4) * 8, m0 + ((lane >> 3) & 1) * 8);
      else return at_row(x, lds, k0_, m0, lane);
    };
    auto b_of = [&](const T* x, int k0_, int n0) {
      if constexpr (kSwz) return b_at([&](int r, int cc) { return xa(x, r, cc); }, k0_, n0, lane);
      else return b_row(x, ld, k0_, n0, lane);
    };
    // dV = P^T dO and dK = dS^T Q for the step's keys, each tile written through the step's rows of
    // V's or K's array (no longer read).
    if constexpr (kWgmma) {
      // On Hopper: the step's 64 keys x 32 columns of dV or dK a product (4: a warpgroup each at 256
      // query rows), by wgmma on the swizzled arrays as they are (P^T and dS^T M-major, dO and Q
      // N-major), over the query rows from the first that sees the step's keys (causal: row k0; the
      // rows before are skipped warps', their staging stale). Products of 64 columns (32
      // accumulators) spilled 196 bytes in the non-causal kernel.
      // The warpgroup as a warp-uniform value (a shuffle from lane 0), so its descriptors are uniform
      // registers and the wgmmas issue back to back (from warp / 4 each took four R2URs).
      const int wg = __shfl_sync(0xffffffffu, warp / 4, 0), wgs = warps / 4;
      const int kb0 = kCausal ? min(k0 / 16, l_blocks) : 0;
      for (int job = wg; job < 4; job += wgs) {
        const int which = job & 1, d0 = (job >> 1) * 32;
        float acc[4][4];
        zero(acc);
        const T* a_src = which == 0 ? ps : dss;
        const T* b_src = which == 0 ? dos : qs;
        wgmma_ss_mn<T, kCausal>(acc, sw128_desc(a_src + kb0 * 16 * 64), sw128_desc(b_src + kb0 * 16 * 64 + d0),
                                l_blocks - kb0);
        const int j0 = k0 + (warp % 4) * 16;
        const int64_t stride = which == 0 ? p.sdv.l : p.sdk.l;
        T* const stage = which == 0 ? vs : ks;
        write_tile<T>(acc, 2, [&](int r, int cc) { return kv(stage, j0 + r, d0 + cc); },
                      (which == 0 ? dv_out : dk_out) + j0 * stride + d0, stride, kv_len - j0, lane);
      }
    } else if constexpr (kExact && !kCausal) {
      // Whole steps of a head size of kD, not causal: tiles of 32 keys x 32 columns, 8 a step (dV
      // and dK, two key pairs, two column halves), so each ldmatrix of dO or Q feeds two key blocks:
      // 4 loads for 8 products where a 16-key tile makes 3 for 4. At 16 warps (256 query rows) half
      // the block's warps take one and the others wait at the barrier. At 256 x 256 x 64 on an H100
      // the kernel went from 675 to 627 us; causal, whose tiles start at their own first key, it
      // went from 504 to 514, so the causal kernels keep the 16-key tiles below. A block has a
      // warp a tile: the launch takes this kernel at 128 query rows or more (a loop over tiles for
      // fewer warps spilled, and with a run-time test for them the kernel took 640 us, not 627).
      constexpr int kTiles = (kStep / 32) * (kD / 32) * 2;
      static_assert(kTiles <= 128 / 16, "a warp a tile at the 128 query rows the launch asks for");
      if (const int tile = warp; tile < kTiles) {
        const int which = tile & 1, half = (tile >> 1) % (kD / 32), kt = (tile >> 1) / (kD / 32);
        const T* a_src = which == 0 ? ps : dss;
        const T* b_src = which == 0 ? dos : qs;
        const int d0 = half * 32;
        float acc[2][4][4];
        zero(acc[0]);
        zero(acc[1]);
#pragma unroll 2
        for (int kb = 0; kb < l_blocks; ++kb) {
          uint32_t a0[4], a1[4];
          ldsm_t(a0, at_of(a_src, kb * 16, kt * 32));
          ldsm_t(a1, at_of(a_src, kb * 16, kt * 32 + 16));
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t bb[4];
            ldsm_t(bb, b_of(b_src, kb * 16, d0 + np * 16));
            mma<T>(acc[0][2 * np], a0, bb[0], bb[1]);
            mma<T>(acc[0][2 * np + 1], a0, bb[2], bb[3]);
            mma<T>(acc[1][2 * np], a1, bb[0], bb[1]);
            mma<T>(acc[1][2 * np + 1], a1, bb[2], bb[3]);
          }
        }
        const int64_t stride = which == 0 ? p.sdv.l : p.sdk.l;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j0 = k0 + kt * 32 + e * 16;
          T* const stage = which == 0 ? vs : ks;
          write_tile<T>(acc[e], 2, [&](int r, int c) { return kv(stage, j0 + r, d0 + c); },
                        (which == 0 ? dv_out : dk_out) + j0 * stride + d0, stride, kv_len - j0, lane);
        }
      }
    } else {
      // Tiles of 16 keys x 32 columns shared by the block's warps.
      const int tiles_n = k_pairs * halves * 2;
      for (int tile = warp; tile < tiles_n; tile += warps) {
        const int which = tile & 1, half = (tile >> 1) % halves, kt = (tile >> 1) / halves;
        const T* a_src = which == 0 ? ps : dss;
        const T* b_src = which == 0 ? dos : qs;
        const int d0 = half * 32, pairs = kExact ? 2 : min(2, (dh - d0) / 16);
        float acc[4][4];
        zero(acc);
        // Causal: query rows before the tile's first key see none of its keys (P = dS = 0 there).
        const int kb0 = kCausal ? min((k0 + kt * 16) / 16, l_blocks) : 0;
#pragma unroll 4
        for (int kb = kb0; kb < l_blocks; ++kb) {
          uint32_t a[4];
          ldsm_t(a, at_of(a_src, kb * 16, kt * 16));
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            if (np < pairs) {
              uint32_t bb[4];
              ldsm_t(bb, b_of(b_src, kb * 16, d0 + np * 16));
              mma<T>(acc[2 * np], a, bb[0], bb[1]);
              mma<T>(acc[2 * np + 1], a, bb[2], bb[3]);
            }
          }
        }
        const int j0 = k0 + kt * 16;
        const int64_t stride = which == 0 ? p.sdv.l : p.sdk.l;
        T* const stage = which == 0 ? vs : ks;
        write_tile<T>(acc, pairs, [&](int r, int c) { return kv(stage, j0 + r, d0 + c); },
                      (which == 0 ? dv_out : dk_out) + j0 * stride + d0, stride, kv_len - j0, lane);
      }
    }
    wait_pending(steps - 2 - k0 / kStep);  // the next step's K and V (past the last step: none pending)
    if constexpr (kWgmma) fence_proxy_async();
    __syncthreads();
  }

  // The bias's query rows: dQ's column sums, over the warp's 16 rows by shuffles (the lanes of a
  // column differ in g), then over the warps in their order through P's staging, free since the
  // last step's barrier (rows past L and skipped causal steps add zeros).
  if (p.dq_sums != nullptr) {
    float* part = reinterpret_cast<float*>(ps);  // [warps][kD]
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      float s0 = dq[n][0] + dq[n][2], s1 = dq[n][1] + dq[n][3];
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, m);
        s1 += __shfl_xor_sync(0xffffffffu, s1, m);
      }
      if (g == 0) part[warp * kD + n * 8 + 2 * t] = s0, part[warp * kD + n * 8 + 2 * t + 1] = s1;
    }
    __syncthreads();
    for (int col = threadIdx.x; col < dh; col += blockDim.x) {  // a block of one warp has 32 threads
      float sum = 0.f;
      for (int w = 0; w < warps; ++w) sum += part[w * kD + col];
      p.dq_sums[b * p.dq_sums_b + h * dh + col] = sum;
    }
  }

  // dQ, written through the warp's own rows of Q's array (every read of Q done: the barrier above).
  T* dq_out = static_cast<T*>(p.dq) + b * p.sdq.b + h * p.sdq.h + r0 * p.sdq.l;
  if constexpr (kSwz)
    write_rows_swz<T>(dq, qs, r0, dq_out, p.sdq.l, q_len - r0, lane);
  else
    write_rows<T, kD>(dq, 1.f, 1.f, qs + r0 * ld, ld, dq_out, p.sdq.l, q_len - r0, dh, lane);
}

template <typename T, int kD>
cudaError_t launch(const MidBwdParams& p, cudaStream_t stream) {
  const ShortShape& s = p.shape;
  const bool swizzled = mid_swizzled(s);
  const MidLayout l = mid_layout(s.q_len, s.kv_len, s.head_dim, swizzled);
  auto go = [&](auto kernel) -> cudaError_t {
    if (const cudaError_t e = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), l.total); e != cudaSuccess)
      return e;
    kernel<<<static_cast<unsigned>(s.batch * s.heads), l.lp / 16 * 32, l.total, stream>>>(p);
    return cudaGetLastError();
  };
  const bool exact = s.head_dim == kD && s.kv_len % kStep == 0;
  if constexpr (kD == 64) {
    if (swizzled)
      return s.causal ? go(mid_bwd_kernel<T, kD, true, true, true>) : go(mid_bwd_kernel<T, kD, true, false, true>);
  }
  if (s.causal) return exact ? go(mid_bwd_kernel<T, kD, true, true>) : go(mid_bwd_kernel<T, kD, false, true>);
  // Not causal, the exact kernel's dV/dK tiles take a warp each, 8 of them: 128 query rows or more.
  return exact && s.q_len >= 128 ? go(mid_bwd_kernel<T, kD, true, false>) : go(mid_bwd_kernel<T, kD, false, false>);
}

}  // namespace

std::size_t mid_bwd_smem(const ShortShape& s) {
  if (s.q_len < 1 || s.kv_len < 1 || s.q_len > kMidMaxLen || s.kv_len > kMidMaxLen || s.head_dim < 16 ||
      s.head_dim > kMidMaxHeadDim || s.head_dim % 16 != 0)
    return 0;
  return mid_layout(s.q_len, s.kv_len, s.head_dim, mid_swizzled(s)).total;
}

bool mid_supports(const ShortShape& s, std::string* why) {
  if (s.dtype == DType::kFloat32) return fail(why, "float16 or bfloat16 only (tensor-core products)");
  if (s.head_dim % 16 != 0 || s.head_dim < 16 || s.head_dim > kMidMaxHeadDim)
    return fail(why, "head size 16, 32, 48 or 64");
  if (s.q_len < 1 || s.kv_len < 1 || s.q_len > kMidMaxLen || s.kv_len > kMidMaxLen)
    return fail(why, "sequences of 1 to 256 tokens");
  if (s.batch < 1 || s.heads < 1 || s.batch * s.heads > 0x7fffffffLL)
    return fail(why, "batch x heads from 1 to 2^31 - 1");
  if (s.device.device < 0 || s.device.cc_major < 8) return fail(why, "a GPU of compute capability 8.0 or later");
  if (static_cast<int64_t>(mid_bwd_smem(s)) > s.device.smem_per_block_optin)
    return fail(why, "the block's shared memory (Q, K, V, dO, a step's P and dS) exceeds the device's");
  if (why) why->clear();
  return true;
}

bool mid_supports(const MidBwdParams& p, std::string* why) {
  if (!mid_supports(p.shape, why)) return false;
  if (!short_view_ok(p.q, p.sq) || !short_view_ok(p.k, p.sk) || !short_view_ok(p.v, p.sv) ||
      !short_view_ok(p.o, p.so) || !short_view_ok(p.dout, p.sdo) || !short_view_ok(p.dq, p.sdq) ||
      !short_view_ok(p.dk, p.sdk) || !short_view_ok(p.dv, p.sdv))
    return fail(why, "Q, K, V, O, dO and the gradients 16-byte aligned with strides multiples of 8 elements");
  if (p.lse == nullptr || reinterpret_cast<std::uintptr_t>(p.lse) % 4 != 0) return fail(why, "a float log-sum-exp");
  return true;
}

cudaError_t mid_backward(const MidBwdParams& p, cudaStream_t stream) {
  if (!mid_supports(p)) return cudaErrorInvalidConfiguration;
  return dispatch_dtype(p.shape.dtype, [&]<typename T>() -> cudaError_t {
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidConfiguration;
    else if (p.shape.head_dim <= 32) return launch<T, 32>(p, stream);
    else return launch<T, 64>(p, stream);
  });
}

}  // namespace hfnn::kernels::multihead_attention
