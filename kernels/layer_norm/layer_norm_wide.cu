// LayerNorm variants for wide rows.
//
//   fwd_wide_c1, bwd_wide_c1    A row held in registers across a row-group of whole warps (32 to
//                               1024 threads), summed through shared memory: rows too wide for the
//                               *_regs variants (one warp, at most 8 accesses a lane) that still fit
//                               one block's registers. A block holds several row-groups when rows
//                               are narrow enough.
//   fwd_wide_c{2,4,8,16},       The row split over the N blocks of a thread-block cluster (Hopper),
//   bwd_wide_c{2,4,8,16}        each block holding its part in registers; the parts' sums meet
//                               through distributed shared memory, pushed into each block's inbox
//                               by st.async and counted on an mbarrier, no cluster barrier a row
//                               (cluster_push; bench/README.md, "The clusters' exchange by st.async
//                               and mbarriers"). The widest rows fit (registers of up to 16
//                               blocks), and few wide rows still fill every SM: 1,365 rows of
//                               12,288 make 1,365 x N blocks. fwd_wide_c1, c2 and c4 take each
//                               row in one pass, a block (cluster) a row-group
//                               (fwd_once_body; fwd_wide_c1's 16-bit rows at 4 accesses under a
//                               register cap where that fits more blocks, fwd_wide_once_capped).
//   fwd_wide_c{1,...,16}_ps     The forward on a persistent grid (as many clusters as run at once),
//                               each block converting its part of gamma and beta once into shared
//                               memory as floats: faster where a cluster visits many rows, slower
//                               where it visits one or two (bench/README.md, "The staged persistent
//                               forward as variants of its own"); the built-in choice's data decides.
//   bwd_wide_c{1,...,16}_smem   The backward with each thread's dgamma/dbeta sums in shared memory
//                               instead of registers: in 16-bit those float sums took more registers
//                               than the packed x and dy, so a thread may now hold 4 accesses of each
//                               in flight, or 2 at 3 blocks an SM. H200, bf16, 16M elements, with
//                               bwd_clusters' cap: 1.04-1.37x the best variant before from D = 1,536
//                               to 65,536 (bench/README.md, "Backward sums in shared memory").
//   fwd_wide_win_c{1,...,16}    Rows not 16-byte aligned (odd widths in 16-bit, 65,538 columns),
//   bwd_wide_win_c*_cols        in 16-byte accesses through their aligned windows
//   bwd_wide_win_c*_smem        (layer_norm_window.cuh): the staged persistent forward, the
//                               backward's dx alone under the *_cols column sums (kWin below), and
//                               the backward with its sums in shared memory by window position.
//                               H100, 16M elements, bf16, D = 12,289: fwd+bwd 116.8 against 164.6 us
//                               (bench/README.md, "Wide rows not 16-byte aligned through their
//                               windows at cluster scale"); the _smem backward 1.15x the _cols one
//                               there, 1.35-1.38x the best before in float32 at 4,097 and 12,289
//                               ("The window backward's own sums"). fwd_wide_win_c{1,2,4}_direct,
//                               a cluster a row, run the one-pass forward (fwd_once_body's kWin);
//                               c8 and c16 _direct keep fwd_wide_body's loop.
//
// x is read once and y (dx) written once, from registers, in the widest accesses the rows allow:
// 16 bytes, else 8 or 4 (rows and pointers aligned that far). A thread holds as many accesses at
// every width, not as many bytes: each access costs about the same registers (its address and
// predicate) whatever its width, and holding 4x the 4-byte accesses took 128 registers and spilled
// (H200, float32, D = 4,097: 158 against 37 us at 4,096). Rows aligned to only 2 bytes (16-bit, odd
// cols) are left to the window variants (*_win_*) and the block ones.
// Forward: two-pass variance within each part, the parts combined by Chan's formula
// (M2 = sum of M2_r + n_r (mean_r - mean)^2), so no E[x^2] - E[x]^2 cancellation anywhere.
// Backward: a persistent grid; each thread owns the same columns for the whole kernel and sums its
// dgamma and dbeta in registers, folded at the end into one partial row per cluster, which
// reduce_partials sums in a fixed order. Every sum has a fixed order: bit-identical results.
#include <cooperative_groups.h>
#include <cuda/ptx>

#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_param_sums.cuh"
#include "kernels/layer_norm/layer_norm_variants.h"
#include "kernels/layer_norm/layer_norm_window.cuh"

namespace hfnn::kernels::layer_norm {
namespace {

namespace cg = cooperative_groups;

constexpr int kMaxGroupRows = 8;  // row-groups a block holds
// A block holds its rows as loaded (16 bytes a pack) and, for software pipelining, the next rows
// too; at most 512 threads, so each may have up to 128 registers.
constexpr int kMaxThreads = 512;
// The backward with its dgamma/dbeta sums in shared memory (bwd_wide_c*_smem): row-groups of at
// most 256 threads, so the register cap below can ask for 2 or 3 blocks an SM.
constexpr int kSmemSumsMaxThreads = 256;
// ... and an instantiation of its own for blocks of 257 to 288 threads at 8 accesses a thread, in
// clusters of 16 alone: a block's part of 2,049 to 2,304 accesses, which no block of 256 holds at
// 8. A row of 65,538 columns is 2,049 accesses of a block there in float32 (8 bytes) and 16-bit (4
// bytes); the same part comes with float32 rows of about 32,769 to 36,863 columns (4-byte accesses)
// and 16-bit rows of about 131,076 to 147,456 (8-byte accesses). One block an SM
// (its bound below); the 256-thread kernels keep theirs (a bound of one block on them all slowed
// the widths they already took: bench/README.md, "The shared-memory-sums backward in blocks of up
// to 288 threads: not kept").
constexpr int kSmemSumsBigThreads = 288, kSmemSumsBigCluster = 16;

// A launch: blockDim = (threads, rows), `rows` row-groups of `threads` threads, each group on one
// row at a time; the row's accesses of `bytes` split over the cluster's blocks, `part` for each
// block, `nv` for each thread.
struct WideShape {
  int threads = 0;
  int rows = 0;
  int nv = 0;
  int bytes = 16;
  int64_t part = 0;
  int64_t acc = 0;  // accesses a row (window: 16-byte packs that cover it from any lead)
  int slots = 0;     // the backward's sums in shared memory: threads whose slots it holds (the stride)
  bool ok() const { return threads > 0; }
};

int64_t accesses(int64_t cols, DType dtype, int bytes) {
  return cols / static_cast<int64_t>(bytes / static_cast<int>(dtype_size(dtype)));
}

// Accesses per thread: forward 4 (64 bytes in flight, twice that with the next row's in
// fwd_wide_body), fewer only
// where the part has under a warp's worth of 4, 8 where 4 would need over 512 threads; backward 2
// (it also holds float sums of dgamma and dbeta for every element it owns), 4 in float32 where a
// row needs it (8 where 4 would need over 512 threads: max_nv below). Rows of a block: as many as
// keep it near the measured best block size.
// Measured on an H100 (16M elements, float32 and bfloat16, D = 1,024 to 65,536; bench/README.md,
// "wide-row kernel notes"): forward blocks of about 128 threads (one row-group unless rows are
// narrow) beat 256 and 512 by 5 to 17 points of copy bandwidth; backward blocks of about 256;
// 2 accesses a thread in the backward beat 4 in float32 (89% against 83% at D = 2,048: fewer
// registers, more blocks per SM) and 1 in bfloat16 (73% against 69%).
constexpr int kFwdBlockThreads = 128, kBwdBlockThreads = 256;

// window: rows read through their 16-byte windows (the *_win_* variants): window_accesses() packs a
// row, one row-group a block (a block keeps one lead). window_sums: the window backward that holds
// its sums in shared memory (bwd_wide_win_c*_smem), in blocks of up to 256 threads as the others.
WideShape wide_shape(int64_t cols, DType dtype, int bytes, int cluster, bool backward, bool smem_sums = false,
                     bool window = false, bool window_sums = false) {
  // The backward's float32 may widen to 4 where 2 would need over 512 threads (a one-block row up
  // to 8,192 columns: 85% of copy bandwidth there against 63% split over a cluster); 16-bit types
  // would need 64 float sums a thread at 4. With the sums in shared memory (smem_sums) every dtype
  // may widen to 4 where 2 would need over 256 threads: H200, bf16, 16M elements, 2 accesses
  // against 4 where a row-group of 2 fits: 36.0 against 38.7 us at D = 2,048, 51.1 against 55.1 at
  // 10,240 (c8; 4 leaves 24 of 64 lanes idle there), 3% behind at 32,768 (c8).
  // (The window backward's dx alone is shaped with smem_sums for its 4 accesses a thread but holds
  // no sums: blocks of up to 512 threads, so float32 rows of 65,538 split over 16 blocks fit.)
  const int max_threads = smem_sums && (!window || window_sums) ? kSmemSumsMaxThreads : kMaxThreads;
  // Narrower accesses hold fewer bytes: the backward may take 8 of them, so that rows of 65,538
  // 16-bit columns (4-byte accesses) still fit 16 blocks; not 8 of 8 bytes with the sums in
  // registers in 16-bit (ptxas, sm_90: 476 bytes of spill in bf16). float32 takes 8 of 8 bytes
  // (ptxas: 24-64 bytes of spill) where 4 would need over 512 threads a block, at every cluster
  // size: 8-byte rows of 4,098-8,192 columns in one block, to 65,536 in 8 and past 65,536 in 16.
  // Only the last were taken by no wide kernel before (bwd_block ran 65,538 at 8% of copy
  // bandwidth, 0.81x torch, H200; bwd_wide_c16 now 155 us against its 622); below that the next
  // cluster size took them at 4, and the sweep's data keeps choosing between them.
  const int max_nv = !backward ? 8
                     : bytes == 16 ? (smem_sums || dtype_size(dtype) == 4 ? 4 : 2)
                     : (bytes == 4 || smem_sums || dtype_size(dtype) == 4) ? 8
                                                                          : 4;
  const int preferred = backward ? 2 : 4;
  WideShape s;
  s.bytes = bytes;
  const int64_t acc =
      window ? window_accesses(cols, 16 / static_cast<int>(dtype_size(dtype))) : accesses(cols, dtype, bytes);
  s.acc = acc;
  s.part = (acc + cluster - 1) / cluster;
  int nv = preferred;
  while (nv > 1 && s.part < 32 * nv) nv /= 2;
  while (nv < max_nv && (s.part + nv - 1) / nv > max_threads) nv *= 2;
  const int64_t threads = ((s.part + nv - 1) / nv + 31) / 32 * 32;
  // The big blocks: the sums in shared memory, not the window's, 8 accesses a thread, clusters of 16.
  const bool big = threads > max_threads && smem_sums && !window && nv == 8 && cluster == kSmemSumsBigCluster &&
                   threads <= kSmemSumsBigThreads;
  if (threads > max_threads && !big) return {};
  s.nv = nv;
  s.threads = static_cast<int>(threads);
  const int rows = (backward ? kBwdBlockThreads : kFwdBlockThreads) / s.threads;
  s.rows = window || rows < 1 ? 1 : (rows > kMaxGroupRows ? kMaxGroupRows : rows);
  // The window backward's slots in clusters of 16 strided by its own block (one row-group), the
  // others' by the largest block (bwd_wide_kernel's slot_stride).
  s.slots = window_sums && cluster == 16 ? s.threads : big ? kSmemSumsBigThreads : kSmemSumsMaxThreads;
  return s;
}

// Whether the row splits into `cluster` parts of at least a warp's accesses each, every block
// with some of the row.
bool splits(const WideShape& s, int cluster) { return s.ok() && s.part >= 32 && (cluster - 1) * s.part < s.acc; }

// The access width for rows of `cols` at `pointers`: 16, 8 or 4 bytes; 0 where the rows are
// aligned to less than 4 bytes (16-bit, odd cols), which the wide variants do not take.
int wide_access_bytes(int64_t cols, DType dtype, std::initializer_list<const void*> pointers) {
  const int bytes = access_bytes(cols, static_cast<int>(dtype_size(dtype)), pointers);
  return bytes >= 4 ? bytes : 0;
}

// A pack the compiler must treat as changed here (an empty asm): it cannot keep floats unpacked
// from it alive past this point instead of the pack's registers.
template <typename T, int kBytes>
__device__ __forceinline__ void opaque(Pack<T, kBytes>& v) {
  if constexpr (kBytes == 16) asm volatile("" : "+r"(v.raw.x), "+r"(v.raw.y), "+r"(v.raw.z), "+r"(v.raw.w));
  else if constexpr (kBytes == 8) asm volatile("" : "+r"(v.raw.x), "+r"(v.raw.y));
  else asm volatile("" : "+r"(v.raw));
}

// The sum of a thread's packs' elements, pack by pack in order (the forwards' first pass).
template <typename T, int kNv, int kBytes>
__device__ __forceinline__ float packs_sum(const Pack<T, kBytes> (&packs)[kNv]) {
  constexpr int kV = kVec<T, kBytes>;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    float v[kV];
    unpack(packs[i], v);
#pragma unroll
    for (int k = 0; k < kV; ++k) s += v[k];
  }
  return s;
}

// The sum of (v - m)^2 over a thread's packs, pack by pack in order (the forwards' second pass):
// packs at or past the part's end a1 add nothing. kWin: the row's elements alone ([lead, end)),
// tested in its two end packs in 16-bit and in every pack in float32 (measured faster there, H100,
// 2026-11-26, seventh session).
template <typename T, int kNv, int kBytes, bool kWin>
__device__ __forceinline__ float packs_m2(const Pack<T, kBytes> (&packs)[kNv], int64_t a0, int64_t a1, int tpr,
                                          int lane, float m, int lead, int end) {
  constexpr int kV = kVec<T, kBytes>;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    if (a0 + i * tpr + lane < a1) {
      float v[kV];
      unpack(packs[i], v);
      const int pos = static_cast<int>((a0 + i * tpr + lane) * kV);
      if (!kWin || (sizeof(T) == 2 && pos >= lead && pos + kV <= end)) {
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          const float d = v[k] - m;
          q += d * d;
        }
      } else {
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          const float d = v[k] - m;
          if (pos + k >= lead && pos + k < end) q += d * d;
        }
      }
    }
  }
  return q;
}

// Sum over the row-group (blockDim.x threads, whole warps): shuffles, then the group's warps in a
// fixed order through `buf` (one slot per warp of the block). Every thread of the block calls it;
// every thread of a group gets its group's total. Alternate between two buffers from call to call:
// a buffer is written again only after a later barrier, which every reader of it has passed.
// The warps' totals are summed by butterfly across the lanes (lane l reads slot l % 16, zero past
// the group's warps; at most 16 warps: kMaxThreads): one load a thread and four shuffles instead of
// a loop over the slots, the same bits in every lane. H200, 16M elements (bench/README.md, "The
// wide kernels' block sums by butterfly"): the wide forward 1.03-1.09x in 16-bit (fwd_wide_c1,
// fwd_wide_win_c1), up to 1.9x in float32 rows not 16-byte aligned (8 bytes an access), the
// backward 1.02-1.25x there.
// kLoop keeps the loop over the slots: the window backward's dx alone (the base of
// bwd_wide_win_c*_cols) takes it, where the butterfly's fewer registers (98 -> 84 in bf16) put two
// of its blocks on an SM instead of one and left no room for the column kernel that runs beside it
// (programmatic dependent launch, layer_norm_cols.cu): 52 -> 78 us at 4,097 bf16 columns.
template <typename V, bool kLoop = false>
__device__ __forceinline__ V group_total(V v, V* buf) {
  static_assert(sizeof(V) == sizeof(float) || sizeof(V) == sizeof(float2));  // float4: pair_total
  if constexpr (sizeof(V) == sizeof(float)) {
    v = group_sum<32>(v);
  } else {
    v.x = group_sum<32>(v.x);
    v.y = group_sum<32>(v.y);
  }
  const int warps = blockDim.x / 32;
  if (warps == 1) return v;  // uniform over the block
  const int warp = (threadIdx.y * blockDim.x + threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) buf[warp] = v;
  __syncthreads();
  const V* mine = buf + threadIdx.y * warps;
  if constexpr (kLoop) {
    V t = mine[0];
    for (int w = 1; w < warps; ++w) {
      if constexpr (sizeof(V) == sizeof(float)) {
        t += mine[w];
      } else {
        t.x += mine[w].x;
        t.y += mine[w].y;
      }
    }
    return t;
  } else {
    const int slot = threadIdx.x % 16;
    if constexpr (sizeof(V) == sizeof(float)) {
      return group_sum<16>(slot < warps ? mine[slot] : 0.f);
    } else {
      const V t = slot < warps ? mine[slot] : V{0.f, 0.f};
      return V{group_sum<16>(t.x), group_sum<16>(t.y)};
    }
  }
}

// v[0] + v[1] + ... + v[n - 1] in that order, n from 1 to 4 (uniform where it is called).
__device__ __forceinline__ float4 sum_in_order(const float4* v, int n) {
  float4 t = v[0];
#pragma unroll
  for (int k = 1; k < 4; ++k) {
    if (k < n) {
      const float4 o = v[k];
      t = make_float4(t.x + o.x, t.y + o.y, t.z + o.z, t.w + o.w);
    }
  }
  return t;
}

// The two-rows backward's row sums (a float4: each row's two sums) over its row-group, the totals to
// every thread, in fewer instructions than group_total's four butterflies (20 shuffles and 20 adds
// in a warp): within a warp the exchanges at xor 16 and 8 halve what each lane carries (lane l then
// holds component l / 8, summed over 4 lanes), xor 4, 2 and 1 sum it over the warp, and 4 shuffles
// gather the components back (10 shuffles, 6 adds). Across a row-group's warps through buf (a float4
// a warp, double-buffered by the caller as group_total's): summed in warp order by every thread
// where there are at most 4 warps, by group_sum<16> past that. Every lane of the warp takes part
// (full-mask shuffles), as the cluster exchange needs (cluster_push). Bit-identical run to run.
__device__ __forceinline__ float4 pair_total(float4 v, float4* buf) {
  const int lane = threadIdx.x % 32;
  const bool h16 = (lane & 16) != 0, h8 = (lane & 8) != 0;
  float a0 = h16 ? v.z : v.x, a1 = h16 ? v.w : v.y;
  a0 += __shfl_xor_sync(0xffffffffu, h16 ? v.x : v.z, 16);
  a1 += __shfl_xor_sync(0xffffffffu, h16 ? v.y : v.w, 16);
  float b = h8 ? a1 : a0;
  b += __shfl_xor_sync(0xffffffffu, h8 ? a0 : a1, 8);
  b = group_sum<8>(b);
  const int warps = blockDim.x / 32;
  if (warps == 1)  // uniform over the block
    return make_float4(__shfl_sync(0xffffffffu, b, 0), __shfl_sync(0xffffffffu, b, 8),
                       __shfl_sync(0xffffffffu, b, 16), __shfl_sync(0xffffffffu, b, 24));
  const int warp = (threadIdx.y * blockDim.x + threadIdx.x) / 32;
  if ((lane & 7) == 0) reinterpret_cast<float*>(buf + warp)[lane / 8] = b;
  __syncthreads();
  const float4* mine = buf + threadIdx.y * warps;
  if (warps <= 4) return sum_in_order(mine, warps);  // uniform over the block
  const int slot = threadIdx.x % 16;
  const float4 t = slot < warps ? mine[slot] : make_float4(0.f, 0.f, 0.f, 0.f);
  return make_float4(group_sum<16>(t.x), group_sum<16>(t.y), group_sum<16>(t.z), group_sum<16>(t.w));
}

// Elements of the row in cluster rank r's part.
__device__ __forceinline__ float part_elements(int r, int64_t part, int64_t acc, int vec) {
  const int64_t a0 = r * part, a1 = a0 + part < acc ? a0 + part : acc;
  return a1 > a0 ? static_cast<float>((a1 - a0) * vec) : 0.f;
}

// Where a block works: its rank among the C blocks of its cluster (C = 1 without clusters), its
// part of each row ([a0, a1) in 16-byte accesses), and the rows its cluster visits (from
// cid * blockDim.y, every `stride`).
struct WidePlace {
  int C = 1, rank = 0;
  int64_t a0 = 0, a1 = 0, cid = 0, clusters = 0, stride = 0;
};

__device__ __forceinline__ WidePlace wide_place(int64_t part, int64_t acc) {
  WidePlace w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
  w.C = static_cast<int>(cluster.num_blocks());
  w.rank = static_cast<int>(cluster.block_rank());
#endif
  w.a0 = w.rank * part;
  w.a1 = w.a0 + part < acc ? w.a0 + part : acc;
  w.cid = blockIdx.x / w.C;
  w.clusters = gridDim.x / w.C;
  w.stride = w.clusters * blockDim.y;
  return w;
}

// The clusters' inbox (cluster_push), at the end of a kernel's dynamic shared memory where a
// cluster has more than one block, 16-byte aligned: two mbarriers (kInboxBarFloats floats), then
// [2][row-groups][C] float2; float4 for every backward kernel of the shapes bwd_wide_pair_kernel
// may take (bwd_smem_bytes). Host: smem_with_inbox and inbox_at; device: the two pointers below.
constexpr int kInboxBarFloats = 2 * sizeof(uint64_t) / sizeof(float);
__device__ __forceinline__ uint64_t* inbox_bars(float* smem, int inbox) {
  return reinterpret_cast<uint64_t*>(smem + inbox);
}
template <typename V = float2>
__device__ __forceinline__ V* inbox_slots_of(float* smem, int inbox) {
  return reinterpret_cast<V*>(smem + inbox + kInboxBarFloats);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The clusters' exchange, one a row (forward: each block's partial mean and M2 of the row; backward:
// its two sums; the two-rows backward: both rows', a float4). Every block has an inbox of
// [2][row-groups][C] V and an mbarrier for each half, double-buffered by iteration `it`: the
// row-group's first C lanes store its V into slot `rank` of block `lane`'s inbox by st.async, which
// counts its bytes on that block's mbarrier; one thread of each block arrives expecting
// C x groups x sizeof(V) bytes, and every thread waits for the phase of iteration `it` (parity
// it & 1, phase (it >> 1) & 1), then reads its block's slots.
// Why not a cluster barrier a row, as before: its arrive releases the thread's earlier stores, so
// each row waited for the previous row's global stores to complete (Nsight Compute: the "membar"
// stall, 2.0-2.5 warps an issue, the largest); st.async's bytes are ordered by the mbarrier alone.
// The H100 wide backward went from 73-76% to 79-81% of copy bandwidth at 4,096-12,288 16-bit
// columns, the forward's cluster variants 1.03-1.41x (bench/README.md, "The clusters' exchange by
// st.async and mbarriers").
// Reuse of a buffer (written again two iterations on) is safe because of three things the callers
// must keep: (1) the lane that reads slot r of its block's inbox (lane r, after the wait) is the
// lane that pushes to block r, so its next push, and block r's push back, follow its read; (2) the
// row-group's other warps have read their slots before the next group_total's __syncthreads, which
// precedes the next push; (3) lanes >= C cannot fall a phase behind, as the warp's full-mask
// shuffles (group_sum) keep them with lanes < C. bwd_wide_pair_kernel reads its slots by
// inbox_total, not only lane r slot r: there (1) and (3) hold through pair_total, which every thread
// of the row-group reaches only after using what it read (its full-mask shuffles, and with more
// than one warp its __syncthreads, precede the row-group's next push). With one warp a row-group
// and C <= 4 that order rests on the shuffles and on the read's value being used before them, not
// on a memory barrier (shfl.sync orders no memory in PTX's model); a __syncwarp() before the push
// would make it formal (not measured). Every block of the cluster runs every iteration (the
// callers' loop bounds are the cluster's). The mbarriers are initialized (mbarrier_init_inbox)
// before a cluster barrier that precedes any push.
template <typename V>
__device__ __forceinline__ void cluster_push(const cg::cluster_group& cluster, V* box, uint64_t* bar, int64_t it,
                                             int rank, int lane, bool expects, int C, int groups, V v) {
  static_assert(sizeof(V) == sizeof(float2) || sizeof(V) == sizeof(float4));
  if (expects)
    (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_relaxed, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                               bar, static_cast<uint32_t>(groups * C * sizeof(V)));
  if (lane < C) {
    if constexpr (sizeof(V) == sizeof(float2)) {
      cuda::ptx::st_async(cluster.map_shared_rank(box + rank, lane), v, cluster.map_shared_rank(bar, lane));
    } else {  // st.async.v4.b32
      const float w[4] = {v.x, v.y, v.z, v.w};
      cuda::ptx::st_async(reinterpret_cast<float*>(cluster.map_shared_rank(box + rank, lane)), w,
                          cluster.map_shared_rank(bar, lane));
    }
  }
  const uint32_t phase = static_cast<uint32_t>(it >> 1) & 1u;
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, phase)) {
  }
}
// The total of a row-group's C float4 slots in its inbox after cluster_push, in every thread: summed
// in rank order by each thread for C <= 4 (C reads, no shuffles), for 8 and 16 lane l reads slot
// l % C and a butterfly over log2(C) lane bits sums them. (Clusters of 2, 4, 8 or 16 blocks.)
__device__ __forceinline__ float4 inbox_total(const float4* box, int C, int lane) {
  if (C <= 4) return sum_in_order(box, C);  // uniform over the grid
  float4 t = box[lane & (C - 1)];
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) {
    if (o >= C) break;
    t.x += __shfl_xor_sync(0xffffffffu, t.x, o);
    t.y += __shfl_xor_sync(0xffffffffu, t.y, o);
    t.z += __shfl_xor_sync(0xffffffffu, t.z, o);
    t.w += __shfl_xor_sync(0xffffffffu, t.w, o);
  }
  return t;
}
// The forward's row statistics after cluster_push: the mean and M2 of the row from the C parts'
// (sum, M2 about the part's own mean) pairs in a row-group's inbox slots, by Chan's formula
// (M2 = sum of M2_r + n_r (mean_r - mean)^2), n(r) the elements of part r. Butterfly sums over the
// warp's lanes: the same order in every lane and every block, so every block of the cluster gets
// bit-identical statistics.
template <typename N>
__device__ __forceinline__ void cluster_row_stats(const float2* box, int C, int lane, float inv_cols, N n,
                                                  float& mean, float& m2) {
  const int r = lane % 32;
  float2 o = make_float2(0.f, 0.f);
  float n_r = 0.f;
  if (r < C) {
    o = box[r];
    n_r = n(r);
  }
  mean = group_sum<32>(o.x) * inv_cols;
  const float d = n_r > 0.f ? o.x / n_r - mean : 0.f;
  m2 = group_sum<32>(o.y + n_r * d * d);
}
// Before a block of the cluster leaves: every push it issued has landed. st.async's completion is
// seen only at its target's mbarrier, so each block arrives (relaxed: no wait for its own global
// stores) once it has seen its last phase complete, and leaves once all have: then every push into
// every block has landed. (Distributed shared memory accesses must be done before a block exits.)
__device__ __forceinline__ void cluster_leave_arrive() { cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed); }
__device__ __forceinline__ void cluster_leave_wait() { cuda::ptx::barrier_cluster_wait(); }
__device__ __forceinline__ void mbarrier_init_inbox(uint64_t* bars) {
  cuda::ptx::mbarrier_init(bars, 1);
  cuda::ptx::mbarrier_init(bars + 1, 1);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
#endif

// The affine step of a row read through its window (kWin, 16-byte packs): window pack a's gamma and
// beta, two aligned loads each shifted into place (ParamWindow; 1 and 0 outside the row and where
// there is no parameter), out = out * gamma + beta.
template <typename T>
__device__ __forceinline__ void affine_window(const ParamWindow<T>& gamma_w, const ParamWindow<T>& beta_w, int64_t a,
                                              int lead, int64_t cols, float (&out)[kVec<T, 16>]) {
  constexpr int kV = kVec<T, 16>;
  Pack<T, 16> g_lo, g_hi, b_lo, b_hi;
  gamma_w.load(a, true, g_lo, g_hi);
  beta_w.load(a, true, b_lo, b_hi);
  float g[kV], b[kV];
  gamma_w.floats(g_lo, g_hi, a, lead, cols, g);
  beta_w.floats(b_lo, b_hi, a, lead, cols, b);
#pragma unroll
  for (int k = 0; k < kV; ++k) out[k] = fmaf(out[k], g[k], b[k]);
}

// kStaged: a persistent grid's body (a block visits several row-groups): gamma (1 where there is
// none) and beta (0) for the block's part of a row, staged once into shared memory after the first
// row's loads are issued (fwd_smem_bytes), then read on every row: in 16-bit in their dtype
// (stage_param_raw), in float32 and in the window forward as floats in load_staged's layout.
// Otherwise every row reads them from global memory (one row-group a block: staging would be a
// latency chain nothing hides).
//
// The forward's out = xhat * gamma + beta for access a, gamma and beta read from global memory
// (either may be absent).
template <typename T, int kBytes>
__device__ __forceinline__ void affine_from_global(const T* __restrict__ gamma, const T* __restrict__ beta,
                                                   int64_t a, float (&out)[kVec<T, kBytes>]) {
  constexpr int kV = kVec<T, kBytes>;
  if (gamma) {
    float g[kV];
    unpack(load_pack<T, kBytes>(gamma + a * kV), g);
    if (beta) {
      float b[kV];
      unpack(load_pack<T, kBytes>(beta + a * kV), b);
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] = fmaf(out[k], g[k], b[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] *= g[k];
    }
  } else if (beta) {
    float b[kV];
    unpack(load_pack<T, kBytes>(beta + a * kV), b);
#pragma unroll
    for (int k = 0; k < kV; ++k) out[k] += b[k];
  }
}

// The persistent forward's gamma or beta in 16-bit (fwd_wide_c*_ps), staged in its dtype: access a's
// pack (kBytes) at pack index at + a of s (s 16-byte aligned; `missing` where there is no parameter),
// unpacked as each row's output is written. Half the shared memory of the floats load_staged reads:
// more blocks an SM where shared memory limited them, and c1_ps now takes 32,768 columns, c2_ps 65,536.
// H200, same build and call, 16-bit, 16M elements: the best forward 1.01-1.12x from 16,384 to
// 65,536 columns; each variant's median c1_ps 1.10-1.14x, c2_ps and c4_ps 1.04-1.06x, c8_ps and
// c16_ps 0.96-0.99x (bench/README.md, "The persistent forward's gamma and beta in their dtype").
// The window forward keeps its floats (stage_param_window shifts them into place first).
template <typename T, int kBytes>
__device__ __forceinline__ void stage_param_raw(float* s, const T* param, float missing, int64_t a0, int64_t n,
                                                int tid, int threads, int64_t at = 0) {
  constexpr int kV = kVec<T, kBytes>;
  float m[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) m[k] = missing;
  const Pack<T, kBytes> fill = pack<T, kBytes>(m);
  for (int64_t a = tid; a < n; a += threads)
    reinterpret_cast<PackRaw<kBytes>*>(s)[at + a] =
        param ? load_pack<T, kBytes>(param + (a0 + a) * kV).raw : fill.raw;
}

// kWin (fwd_wide_win_c*, 16-byte packs): rows not 16-byte aligned, read through their windows
// (layer_norm_window.cuh): pack a covers window positions [a * kV, a * kV + kV), column position -
// lead. A block has one row-group. With kStaged the grid is a multiple of the rows' lead period
// (window_clusters), so every row a block visits has its first row's lead: gamma and beta are
// staged once, shifted by it. Without (fwd_wide_win_c8 and c16 _direct; c1, c2 and c4 run
// fwd_once_body) a cluster takes one row (more only past the grid's 2^31 - 1 blocks, in a
// multiple of the period) and reads them from global memory as it writes y, two aligned loads a
// pack shifted into place (ParamWindow). y at another lead than x is written an element at a time.
template <typename T, int kNv, int kBytes, bool kStaged, bool kWin, bool kClustered>
__device__ __forceinline__ void fwd_wide_body(const FwdParams& p, const int64_t part, const int inbox) {
  static_assert(!kWin || kBytes == 16);
  constexpr int kV = kVec<T, kBytes>;
  __shared__ float red[2][32];
  // kStaged: gamma then beta, each [part * kV] floats, or in 16-bit without kWin [part] packs of T.
  extern __shared__ __align__(16) float params[];
  const int lane = threadIdx.x, group = threadIdx.y;
  const int tpr = blockDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
#endif
  const int64_t cols = p.cols, acc = kWin ? window_accesses(cols, kV) : cols / kV;
  const auto [C, rank, a0, a1, cid, clusters, stride] = wide_place(part, acc);
  // kWin: the lead of every row the group visits, and the window's end (cols <= kMaxWindowCols).
  const int lead = kWin ? row_lead<T>(p.x, (cid * blockDim.y + group) * cols) : 0;
  const int end = kWin ? lead + static_cast<int>(cols) : 0;
  auto elements = [&](int r) -> float {
    if constexpr (kWin) return window_part_elements(r, part, acc, kV, lead, end);
    else return part_elements(r, part, acc, kV);
  };
  const float n_here = elements(rank);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const T* __restrict__ beta = static_cast<const T*>(p.beta);
  // kWin: whether y is at x's lead (16-byte stores), as it is unless the caller's x is offset.
  const bool y_vector = !kWin || same_lead(p.x, p.y);
  // kWin without kStaged: gamma and beta read for the block's lead (its one row).
  const ParamWindow<T> gamma_w(kWin && !kStaged ? gamma : nullptr, 1.f, lead, cols);
  const ParamWindow<T> beta_w(kWin && !kStaged ? beta : nullptr, 0.f, lead, cols);
  wait_for_previous_grid();
  allow_next_grid();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // In a cluster, the inbox (from float `inbox` of the dynamic shared memory on): two mbarriers, one
  // a parity, then the row-groups' partial statistics the cluster's blocks push, [2][rows][C] float2.
  uint64_t* const bars = inbox_bars(params, inbox);
  float2* const inbox_slots = inbox_slots_of(params, inbox);
  if (kClustered && C > 1 && group == 0 && lane == 0) mbarrier_init_inbox(bars);
  // The first row's push signals the other blocks' mbarriers: only once every block of the cluster
  // has started and initialized them (the wait is before the loop, after the first row's loads).
  if (kClustered && C > 1) cluster.barrier_arrive();
#endif

  // The group's row starting at row0, as loaded (zeros past the last row and the part's end; kWin:
  // the window's ends still hold the neighbouring rows' elements until mask_window). The persistent
  // forward (fwd_wide_c*_ps) loads x without an L1 line in 16-bit (load_stream). H200, same build
  // and call, medians over 6,402-65,538 columns: 1.05x at 16M elements (single widths 1.00-1.16x);
  // c8_ps and c16_ps 0.975x at 1M and 0.99x at 64K, where the built-in choice's data can pick
  // another variant. The loop's other forms keep the plain load: fwd_wide_c8 and c16 1.01x at 16M,
  // 0.97-0.99x at 1M and 64K; the window forward 1.02x at 16M (4,097-65,538 columns, 0.96-1.07x),
  // not measured at 1M. As __ldcg (ld.global.cg): 0.99-1.00x everywhere, the _ps variants' gain gone
  // (bench/README.md, "The persistent forward's x without an L1 line").
  auto load = [&](int64_t row0, Pack<T, kBytes> (&dst)[kNv]) {
    const int64_t row = row0 + group;
    const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols - lead;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      dst[i] = row < p.rows && a < a1 && (!kWin || a * kV < end)
                   ? (kStaged && !kWin ? load_stream<T, kBytes>(x + a * kV) : load_pack<T, kBytes>(x + a * kV))
                   : zero_pack<T, kBytes>();
    }
  };
  // The loop bound is the cluster's first row: every block of the cluster, and every thread of a
  // block, runs the same iterations (the exchanges need them all); groups past the last row compute
  // on zeros and store nothing. The next rows' loads are issued before this row's sums, so they are
  // in flight through the reductions and the cluster's exchange (software pipelining).
  Pack<T, kBytes> next[kNv];
  const int64_t first = cid * blockDim.y;
  if (first < p.rows) load(first, next);
  if constexpr (kStaged) {  // with the first row's loads in flight
    const int tid = group * blockDim.x + lane, threads = blockDim.x * blockDim.y;
    if constexpr (kWin) {
      stage_param_window<T, kNv>(params, gamma, 1.f, a0, a1 - a0, part, tid, threads, lead, cols);
      stage_param_window<T, kNv>(params + part * kV, beta, 0.f, a0, a1 - a0, part, tid, threads, lead, cols);
    } else if constexpr (sizeof(T) == 2) {
      stage_param_raw<T, kBytes>(params, gamma, 1.f, a0, a1 - a0, tid, threads);
      stage_param_raw<T, kBytes>(params, beta, 0.f, a0, a1 - a0, tid, threads, part);
    } else {
      stage_param<T, kBytes>(params, gamma, 1.f, a0, a1 - a0, part, tid, threads);
      stage_param<T, kBytes>(params + part * kV, beta, 0.f, a0, a1 - a0, part, tid, threads);
    }
    __syncthreads();
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster.barrier_wait();
#endif
  // Iteration it uses buffer `parity` (it & 1) and its mbarrier in phase (it >> 1) & 1.
  for (int64_t row0 = first, it = 0; row0 < p.rows; row0 += stride, ++it) {
    const int parity = static_cast<int>(it & 1);
    (void)parity;  // the exchange's buffer (Hopper only)
    Pack<T, kBytes> cur[kNv];
#pragma unroll
    for (int i = 0; i < kNv; ++i) cur[i] = next[i];
    if (row0 + stride < p.rows) load(row0 + stride, next);  // uniform over the cluster
    if constexpr (kWin) {  // after the next row's loads are issued: a mask waits for its load
#pragma unroll
      for (int i = 0; i < kNv; ++i) mask_window(cur[i], static_cast<int>((a0 + i * tpr + lane) * kV), lead, end);
    }
    const int64_t row = row0 + group;
    float s = group_total(packs_sum(cur), red[0]);
    const float m_here = n_here > 0.f ? s / n_here : 0.f;
    const float q = group_total(packs_m2<T, kNv, kBytes, kWin>(cur, a0, a1, tpr, lane, m_here, lead, end), red[1]);
    float mean = m_here, m2 = q;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (!kClustered) {
      // Never taken (C is 1 here): the barrier the loop had at this point before the exchange
      // became cluster_push. ptxas schedules the one-block loop around it as it did then; without
      // it, 83 registers instead of 64 at four 16-byte bf16 accesses (one block an SM, not two;
      // measured on fwd_wide_c1, which fwd_wide_once_kernel runs since: c1_ps and win_c1 here).
      if (C > 1) cluster.sync();
    }
    if (kClustered && C > 1) {  // uniform over the cluster
      // The group's partial statistics go to every block of the cluster (cluster_push), and each
      // block reads its own inbox once its mbarrier has counted them all.
      float2* const box = inbox_slots + (parity * blockDim.y + group) * C;
      cluster_push(cluster, box, bars + parity, it, rank, lane, group == 0 && lane == 0, C,
                   static_cast<int>(blockDim.y), make_float2(s, q));
      cluster_row_stats(box, C, lane, inv_cols, elements, mean, m2);
    }
#endif
    const float rstd = rsqrtf(m2 * inv_cols + p.eps);
    if (row < p.rows) {
      T* __restrict__ y = static_cast<T*>(p.y) + row * cols - lead;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int64_t a = a0 + i * tpr + lane;
        if (a >= a1) continue;
        float v[kV], out[kV];
        unpack(cur[i], v);
#pragma unroll
        for (int k = 0; k < kV; ++k) out[k] = (v[k] - mean) * rstd;
        if constexpr (kStaged) {
          float g[kV], b[kV];
          if constexpr (!kWin && sizeof(T) == 2) {
            unpack(Pack<T, kBytes>{reinterpret_cast<const PackRaw<kBytes>*>(params)[a - a0]}, g);
            unpack(Pack<T, kBytes>{reinterpret_cast<const PackRaw<kBytes>*>(params)[part + a - a0]}, b);
          } else {
            load_staged(params, a - a0, part, g);
            load_staged(params + part * kV, a - a0, part, b);
          }
#pragma unroll
          for (int k = 0; k < kV; ++k) out[k] = fmaf(out[k], g[k], b[k]);
        } else if constexpr (kWin) {
          affine_window<T>(gamma_w, beta_w, a, lead, cols, out);
        } else {
          affine_from_global<T, kBytes>(gamma, beta, a, out);
        }
        if constexpr (kWin) store_window<T>(y, static_cast<int>(a * kV), lead, end, y_vector, out);
        else store_pack(y + a * kV, pack<T, kBytes>(out));
      }
      if (rank == 0 && lane == 0 && p.mean) {
        p.mean[row] = mean;
        p.rstd[row] = rstd;
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster_leave_arrive(), cluster_leave_wait();
#endif
}

// The forward's kernels: the body above under two register caps (measured before fwd_wide_c1, c2
// and c4 took fwd_wide_once_kernel, which needs no such cap: 64 registers at fp16's 4 accesses, and
// fwd_wide_once_capped's 56 where that fits more blocks; the fp16 cap here now serves the persistent
// grids and clusters of 8 and 16). fp16 at 4 accesses of 16 bytes a
// thread asks for two resident blocks of 512 threads (64 registers): left alone, its unpacking took
// 76 where bf16 and float32 took 63-64 (ptxas, sm_90), one block an SM instead of two (H200, 16M
// elements: the fp16 forward 1.07-1.45x faster with the cap, 1.13-1.57x split over a cluster, D =
// 2,560 to 65,536). Everything else keeps the plain bound: the same cap on every dtype and on 1 to 4
// accesses of any width moved register counts by a few either way (up, 40 -> 56, for fp16's 4-byte
// accesses) and cost bf16 2-3% and fp16 4-byte rows (D = 6,402, 25,602) up to 25%.
// The staged body reads a row's gamma and beta ahead as floats (ptxas: 103-115 registers at 4
// accesses of 16 bytes without a cap), so it runs under the cap up to 4 accesses a thread (64
// registers, no spill); at 8 the cap spilled 24-184 bytes, and it keeps the plain bound.
template <typename T, int kNv, int kBytes, bool kStaged, bool kWin, bool kClustered>
__global__ void __launch_bounds__(kMaxThreads) fwd_wide_kernel(const FwdParams p, const int64_t part, const int inbox) {
  fwd_wide_body<T, kNv, kBytes, kStaged, kWin, kClustered>(p, part, inbox);
}
template <typename T, int kNv, int kBytes, bool kStaged, bool kWin, bool kClustered>
__global__ void __launch_bounds__(kMaxThreads, 2) fwd_wide_kernel_two(const FwdParams p, const int64_t part,
                                                                      const int inbox) {
  fwd_wide_body<T, kNv, kBytes, kStaged, kWin, kClustered>(p, part, inbox);
}
// The forward without a persistent grid in blocks or clusters of up to 4 (fwd_wide_c1, c2, c4: gamma
// and beta read from global memory as y is written): a block (a cluster) for every row-group of the
// rows (fwd_wide_run), so each row-group takes one row, once, in one straight line. fwd_wide_body's
// loop, with the next row's loads issued before this row's sums, has nothing to overlap in a grid
// that visits a row once. H200, same build and call, against that loop (bench/README.md, "The wide
// forward's rows in one pass"): fwd_wide_c1 at 16M elements 1.05-1.25x in 16-bit from 256 to 16,384
// columns (79-84% of copy from 2,048 to 8,192), 1.05-2.07x on its 4- and 8-byte rows, float32
// 1.00-1.39x; at 1M 1.02-1.29x (fp16 6,402 columns 1.83x) but float32 at 256 columns (0.92x); c2
// 1.22x and c4 1.07x at the median; c8 and c16 0.99x (single widths to 0.96x), which keep the loop. A
// cluster's blocks meet through cluster_push as fwd_wide_body's (its first phase), then leave together.
// The window forward's direct variants of up to 4 blocks (fwd_wide_win_c1, c2, c4 _direct) too:
// against fwd_wide_body's loop (H200, bench/README.md, "The window forward's direct variants in one
// pass"), fwd_wide_win_c1_direct 1.19-1.39x in 16-bit at 16M elements, 1.26-2.04x in float32,
// 1.07-1.30x in 16-bit at 1M (float32 0.97-1.57x); c2 and c4 1.02-1.85x at 16M, 0.96-1.67x at
// 1M; at 64K elements 0.89-1.32x.
constexpr bool fwd_once(int cluster, bool staged) { return !staged && cluster <= 4; }

// kWin (fwd_wide_win_c1, c2 and c4 _direct; 16-byte packs): rows not 16-byte aligned, through their
// windows as fwd_wide_body's kWin, each row-group at its own row's lead: gamma and beta two aligned
// loads a pack shifted into place (ParamWindow), y at another lead than x an element at a time.
template <typename T, int kNv, int kBytes, bool kClustered, bool kWin = false>
__device__ __forceinline__ void fwd_once_body(const FwdParams& p, const int64_t part, const int inbox) {
  static_assert(!kWin || kBytes == 16);
  constexpr int kV = kVec<T, kBytes>;
  __shared__ float red[2][32];
  const int lane = threadIdx.x, group = threadIdx.y, tpr = blockDim.x;
  const int64_t cols = p.cols, acc = kWin ? window_accesses(cols, kV) : cols / kV;
  // One block a row-group: the whole row, at constants the compiler folds (wide_place's took bf16 at
  // two 16-byte accesses from 40 to 58 registers).
  WidePlace w;
  if constexpr (kClustered) w = wide_place(part, acc);
  else w.a1 = acc, w.cid = blockIdx.x;
  const int C = kClustered ? w.C : 1, rank = kClustered ? w.rank : 0;
  (void)C;  // the cluster's exchange (Hopper only)
  const int64_t a0 = kClustered ? w.a0 : 0, a1 = kClustered ? w.a1 : acc, cid = w.cid;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const int64_t row = cid * blockDim.y + group;
  const bool valid = row < p.rows;
  // kWin: the row's lead and its window's end (cols <= kMaxWindowCols).
  const int lead = kWin ? row_lead<T>(p.x, row * cols) : 0;
  const int end = kWin ? lead + static_cast<int>(cols) : 0;
  auto elements = [&](int r) -> float {
    if constexpr (kWin) return window_part_elements(r, part, acc, kV, lead, end);
    else return part_elements(r, part, acc, kV);
  };
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const T* __restrict__ beta = static_cast<const T*>(p.beta);
  wait_for_previous_grid();
  allow_next_grid();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) float dyn[];  // the clusters' inbox
  const cg::cluster_group cluster = cg::this_cluster();
  uint64_t* const bars = inbox_bars(dyn, inbox);
  float2* const box = inbox_slots_of(dyn, inbox) + group * C;
  if (kClustered && C > 1 && group == 0 && lane == 0) mbarrier_init_inbox(bars);
  if (kClustered && C > 1) cluster.barrier_arrive();  // waited for after the loads are issued
#endif
  const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols - lead;
  // x without an L1 line in 16-bit (load_stream): 1.02-1.05x at 16M elements from 1,024 to 8,192
  // columns, 1.00-1.02x at 1M (H200, same build and call). Not taken: gamma and beta prefetched into
  // L1 as x's loads go out (0.41-0.99x), or all loaded before the output loop (0.55-1.04x).
  Pack<T, kBytes> cur[kNv];
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    const int64_t a = a0 + i * tpr + lane;
    cur[i] = valid && a < a1 && (!kWin || a * kV < end) ? load_stream<T, kBytes>(x + a * kV)
                                                         : zero_pack<T, kBytes>();
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster.barrier_wait();
#endif
  if constexpr (kWin) {  // the window's two end packs hold the neighbouring rows' elements
#pragma unroll
    for (int i = 0; i < kNv; ++i) mask_window(cur[i], static_cast<int>((a0 + i * tpr + lane) * kV), lead, end);
  }
  const float s = group_total(packs_sum(cur), red[0]);
  // The row stays in its packs, unpacked again for each pass, not held as floats: so in the A/Bs
  // of c1 alone (ab 1 and 2); without it (ab 3) the sweep's times were the same (0.94-1.09x, median
  // 1.00x).
#pragma unroll
  for (int i = 0; i < kNv; ++i) opaque(cur[i]);
  // The part's own mean (the row's where C is 1), its M2 about it, and in a cluster the parts'
  // pairs combined by Chan's formula, as fwd_wide_body.
  const float n_here = elements(rank);
  const float m_here = kClustered ? (n_here > 0.f ? s / n_here : 0.f) : s * inv_cols;
  const float q = group_total(packs_m2<T, kNv, kBytes, kWin>(cur, a0, a1, tpr, lane, m_here, lead, end), red[1]);
  float mean = m_here, m2 = q;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) {  // uniform over the cluster
    cluster_push(cluster, box, bars, 0, rank, lane, group == 0 && lane == 0, C, static_cast<int>(blockDim.y),
                 make_float2(s, q));
    cluster_row_stats(box, C, lane, inv_cols, elements, mean, m2);
  }
#endif
  const float rstd = rsqrtf(m2 * inv_cols + p.eps);
#pragma unroll
  for (int i = 0; i < kNv; ++i) opaque(cur[i]);
  if (valid) {
    T* __restrict__ y = static_cast<T*>(p.y) + row * cols - lead;
    // kWin: whether y is at x's lead (16-byte stores), as it is unless the caller's x is offset.
    const bool y_vector = !kWin || same_lead(p.x, p.y);
    const ParamWindow<T> gamma_w(kWin ? gamma : nullptr, 1.f, lead, cols);
    const ParamWindow<T> beta_w(kWin ? beta : nullptr, 0.f, lead, cols);
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      if (a >= a1 || (kWin && a * kV >= end)) continue;
      float v[kV], out[kV];
      unpack(cur[i], v);
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] = (v[k] - mean) * rstd;
      if constexpr (kWin) {
        affine_window<T>(gamma_w, beta_w, a, lead, cols, out);
        store_window<T>(y, static_cast<int>(a * kV), lead, end, y_vector, out);
      } else {
        affine_from_global<T, kBytes>(gamma, beta, a, out);
        store_pack(y + a * kV, pack<T, kBytes>(out));
      }
    }
    if (rank == 0 && lane == 0 && p.mean) {
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster_leave_arrive(), cluster_leave_wait();
#endif
}
template <typename T, int kNv, int kBytes, bool kClustered, bool kWin = false>
__global__ void __launch_bounds__(kMaxThreads) fwd_wide_once_kernel(const FwdParams p, const int64_t part,
                                                                    const int inbox) {
  fwd_once_body<T, kNv, kBytes, kClustered, kWin>(p, part, inbox);
}
// fwd_wide_c1's 16-bit rows at 4 accesses of 16 bytes a thread: the kernel above takes 64 registers
// (ptxas, sm_90a), this one 56 (no spill), and fwd_wide_run takes it where that holds more blocks an
// SM (fwd_wide_pick: 3 blocks of 384 threads instead of 2 at 12,288 columns, 6 of 192 instead
// of 5 at 6,144, 7 of 160 instead of 6 at 5,120). H200, 16M elements, same build and call
// (bench/README.md, "x loaded without an L1 line; fwd_wide_c1's registers capped"): 1.18x at
// 12,288 columns (1.21-1.22x with x loaded without an L1 line), 1.01-1.03x at 5,120 and 6,144; where
// it adds no block, 0.98-1.02x (at 1M 0.98-1.03x).
template <typename T, int kNv, int kBytes>
__global__ void __maxnreg__(56) fwd_wide_once_capped(const FwdParams p, const int64_t part, const int inbox) {
  fwd_once_body<T, kNv, kBytes, false>(p, part, inbox);
}
template <typename T, int kNv, int kBytes, bool kStaged, int kCluster>
constexpr bool fwd_has_capped() {
  return sizeof(T) == 2 && kNv == 4 && kBytes == 16 && kCluster == 1 && fwd_once(kCluster, kStaged);
}
// The window forward keeps the plain bound: its staging holds a thread's gamma (then beta) loads
// in flight at once, kNv x 8 floats in 16-bit. The one-pass window form (fwd_once_body's kWin,
// 96-99 registers at 4 accesses of 16 bytes in 16-bit) too: caps of 64, 72 and 80 spilled 88, 56
// and 24 bytes there and left it 1.1-1.8x the staged one's time (H200, bench/README.md, "Register caps
// for the one-pass window forward: not kept").
// The kernel of a launch whose clusters have kCluster blocks: kClustered (the clusters' exchange
// compiled in) exactly where kCluster > 1. The one-block variants (c1_ps, win_c1; c1 before
// fwd_wide_once_kernel) get instantiations without the exchange: its inbox addresses and iteration count held in registers took bf16 fwd_wide_c1
// from 40 to 57 registers at one 16-byte access a thread, 83 to 93 at four, and up to 1.5x the
// time (H100, 16M elements, 8,192-14,336 columns).
template <typename T, int kNv, int kBytes, bool kStaged, bool kWin, int kCluster>
constexpr auto fwd_wide_entry() {
  constexpr bool kClustered = kCluster > 1;
  if constexpr (fwd_once(kCluster, kStaged))
    return fwd_wide_once_kernel<T, kNv, kBytes, kClustered, kWin>;
  else if constexpr (!kWin && ((kStaged && kNv <= 4) || (std::is_same_v<T, __half> && kNv == 4 && kBytes == 16)))
    return fwd_wide_kernel_two<T, kNv, kBytes, kStaged, kWin, kClustered>;
  else
    return fwd_wide_kernel<T, kNv, kBytes, kStaged, kWin, kClustered>;
}

// Blocks of 512 threads the compiler must fit on an SM at once (a register cap): two where a thread
// holds one 16-byte access of each tensor (64 registers suffice, no spill), one above (a cap of 64
// spilled 80 to 480 bytes there).
constexpr int bwd_min_blocks(int nv) { return nv <= 1 ? 2 : 1; }
// Blocks of up to 256 threads an SM the compiler must leave registers for with the sums in shared
// memory: 3 (80 registers) at 1 or 2 accesses a thread, 2 (128) at 4. One block more (ptxas, sm_90,
// bf16: 64 registers and 24 bytes of spill at 2 accesses, 80 and 120 bytes at 4) was 3-37% slower
// at every width measured on the H200 (D = 1,024 to 65,536, bf16 and fp16).
constexpr int smem_sums_min_blocks(int nv) { return nv <= 2 ? 3 : 2; }

// kKeep: the 16-bit sums-in-shared-memory backward at 2 accesses a thread (not kWin, not kBig) with
// a row's gamma floats held in registers from the sums' pass to dx's (instead of read from shared
// memory twice) and the row in one straight line (kStraight), bound to 2 blocks of 256 threads an SM
// (ptxas, sm_90a: 122-126 registers with 16-byte accesses, 95-96 with 8, 70-72 with 4, no spill)
// where the other is bound to 3 (80 registers, 8 bytes of spill in clusters). Launched where the
// launch sums dgamma/dbeta, bwd_wide_pair_kernel does not run (with_bwd_wide_kernel) and
// keep_gamma_fits(s, its blocks an SM by the occupancy query): they hold
// at least 448 threads, 7/8 of 2 blocks of 256 (with 16-byte accesses: blocks of 256 threads as 32 x 8, 64 x 4,
// 128 x 2 or 256, and of 160 and 224; with 8 and 4, blocks of 192 too), with at most an eighth of a
// row-group's accesses past its part. Measured against the other in one call (H200, bf16 and fp16,
// 16M elements, every bwd_wide_c*_smem, two rounds): 1.00-1.10x there with 16-byte accesses (median
// 1.04x; 4,096 columns, c1: 36.3 -> 34.2 us), 1.05-1.25x with 8- and 4-byte ones (1,022 columns,
// c1: 58-59 -> 47.3-47.4 us), and 1.06-1.29x in the blocks of 192 threads (2 x 96 or 192) that the
// register count adds with 8- and 4-byte accesses (766 columns, c1: 61.4 -> 47.6 us), where the
// first rule, a fixed 128 registers, had left them out. Where it is not launched: 0.97-0.99x in
// blocks of 2 x 96 threads with 16-byte accesses (2 an SM at 128 registers, 384 threads, against
// 4), 0.94-0.98x where a quarter or more of a row-group's accesses are past the part (the other
// kernel's branch skips those warps' work), 0.89-0.92x with both; dx alone (the *_smem_cols
// variants' base) 0.91-1.56x. (bench/README.md, "gamma held across the wide 16-bit backward's
// passes".)
// The shapes kKeep and bwd_wide_pair_kernel are instantiated for (with_bwd_wide_kernel), whose
// clusters' inbox has float4 slots (bwd_smem_bytes): 16-bit sums in shared memory, 2 accesses a
// thread.
constexpr bool pair_shapes(bool smem_sums, std::size_t esize, int nv) { return smem_sums && esize == 2 && nv == 2; }
inline bool keep_gamma_fits(const WideShape& s, int64_t blocks_per_sm) {
  return s.nv == 2 && blocks_per_sm * s.threads * s.rows >= 448 &&
         s.part * 8 >= static_cast<int64_t>(s.threads) * s.nv * 7;
}
std::size_t bwd_smem_bytes(const WideShape& s, DType dtype, bool smem_sums, int cluster);  // below

// kSmemSums: each thread's dgamma/dbeta sums live in shared memory, [2 x kNv x kV / kW][256]
// vectors of kW floats (a warp's vectors contiguous: no bank conflicts), read, added to and written
// back once a row, instead of 2 x kNv x kV registers: in 16-bit, those registers (more than the
// packed x and dy) are what kept the kernel at 2 blocks an SM with 64 bytes a thread in flight.
// kWin (16-byte packs): rows not 16-byte aligned, through their windows as fwd_wide_body's kWin
// (one row-group a block, one lead a block, gamma staged shifted by it); dy or dx at another lead
// than x an element at a time. Without kSmemSums dx alone (the base of bwd_wide_win_c*_cols); with
// it (bwd_wide_win_c*_smem) the sums too, in each thread's slots by window position (a thread's
// positions are the same columns at every row its block visits: one lead), written to the
// partial row by column (position - lead) at the end.
// kClustered: the launch's clusters have more than one block (as the forward's): the one-block
// variants (c1) get instantiations without the exchange, its mbarriers and cluster barriers.
// kBig: blocks of up to kSmemSumsBigThreads (kSmemSums, not kWin, 8 accesses a thread; wide_shape).
template <typename T, int kNv, int kBytes, bool kSmemSums, bool kWin, bool kClustered, bool kBig = false,
          bool kKeep = false>
__global__ void __launch_bounds__(kBig ? kSmemSumsBigThreads : kSmemSums ? kSmemSumsMaxThreads : kMaxThreads,
                                  kBig ? 1 : kKeep ? 2 : kSmemSums ? smem_sums_min_blocks(kNv) : bwd_min_blocks(kNv))
    bwd_wide_kernel(const BwdParams p, const int64_t part, const int inbox) {
  static_assert(!kWin || kBytes == 16);
  static_assert(!kBig || (kSmemSums && !kWin && kNv == 8));
  static_assert(!kKeep || (kSmemSums && !kWin && !kBig && sizeof(T) == 2 && kNv == 2));
  constexpr bool kRegSums = !kSmemSums && !kWin;  // dgamma/dbeta summed in registers
  // [part * kV]: the block's row-groups' dgamma/dbeta, summed in order, where it has more than one
  // (kSmemSums instead: the sums above, [2 x kNv x kV][kStride] floats); then [part * kV]: gamma
  // for the block's columns as floats, in load_staged's layout; in a cluster, from float `inbox` on,
  // two mbarriers and the row-groups' sums the cluster's blocks push (bwd_smem_bytes).
  extern __shared__ __align__(16) float fold[];
  constexpr int kV = kVec<T, kBytes>;
  constexpr int kW = kV < 4 ? kV : 4;    // floats of a sum vector
  constexpr int kQ = kV / kW;            // sum vectors of an access's dgamma (and of its dbeta)
  using Sum = SumVec<kW>;
  // Slots strided by the largest block, a compile-time constant: one address register for them all.
  constexpr int kStride = kBig ? kSmemSumsBigThreads : kSmemSumsMaxThreads;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  Sum* const sums = reinterpret_cast<Sum*>(fold) + tid;
  __shared__ float2 red[2][32];
  const int lane = threadIdx.x, group = threadIdx.y;
  const int tpr = blockDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
#endif
  const int64_t cols = p.cols, acc = kWin ? window_accesses(cols, kV) : cols / kV;
  const auto [C, rank, a0, a1, cid, clusters, stride] = wide_place(part, acc);
  // kWin in clusters of 16: strided by the block's own threads (wide_shape's slots), so its small
  // blocks (160 threads at 65,538 16-bit columns) do not take 256 threads' slots: 3 blocks an SM
  // instead of 2 there, 1.12x (bench/README.md, "Narrow rows through flat tiles; the window
  // backward's sum slots in clusters of 16"). blockDim.x is the whole block only because a window
  // block is one row-group (wide_shape: rows 1 with `window`); more would need x * y here and in
  // the row-groups' fold below.
  const int slot_stride = kWin && C == 16 ? static_cast<int>(blockDim.x) : kStride;
  // This thread's vector j of access i: dgamma's at j < kQ, dbeta's at kQ + j.
  auto slot = [&](int i, int j) -> Sum& { return sums[(i * 2 * kQ + j) * slot_stride]; };
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const int lead = kWin ? row_lead<T>(p.x, (cid * blockDim.y + group) * cols) : 0;
  const int end = kWin ? lead + static_cast<int>(cols) : 0;
  const bool dy_vector = !kWin || same_lead(p.x, p.dy);
  const bool dx_vector = !kWin || same_lead(p.x, p.dx);
  // dx alone (an output mask, or a *_cols variant's base): no sums. Uniform over the grid.
  const bool want_params = p.dgamma || p.dbeta;
  wait_for_previous_grid();
  allow_next_grid();  // the partials' reduction may be scheduled; it waits for this grid to finish
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // In a cluster, the inbox (from float `inbox` on): two mbarriers, one a parity, then the
  // row-groups' sums the cluster's blocks push, [2][rows][C] float2.
  uint64_t* const bars = inbox_bars(fold, inbox);
  float2* const inbox_slots = inbox_slots_of(fold, inbox);
  if (kClustered && C > 1 && tid == 0) mbarrier_init_inbox(bars);
  // The first row's push stores into the other blocks' shared memory (and signals their
  // mbarriers), which is only allowed once every block of the cluster has started and initialized
  // them: a cluster barrier, its wait after the first row's loads and gamma's staging (below).
  if (kClustered && C > 1) cluster.barrier_arrive();
#endif

  // A thread owns the same columns for the whole kernel: dgamma/dbeta summed in registers (in its
  // shared-memory slots with kSmemSums). gamma is converted once, by the block, into shared memory
  // as floats (1 where there is none), and read there twice a row: no global load, unpack or null
  // test a row.
  float* const gamma_s =
      fold + (kSmemSums ? slot_stride * kNv * kV * 2 : (blockDim.y > 1 ? static_cast<int64_t>(part) * kV : 0));
  float dg[kRegSums ? kNv : 1][kV], db[kRegSums ? kNv : 1][kV];
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    if constexpr (kSmemSums) {
      if (!want_params) break;
#pragma unroll
      for (int j = 0; j < 2 * kQ; ++j) slot(i, j) = Sum{};  // own slots: no barrier
    } else if constexpr (kRegSums) {
#pragma unroll
      for (int k = 0; k < kV; ++k) dg[i][k] = db[i][k] = 0.f;
    }
  }
  auto gamma_of = [&](int64_t a, float (&out)[kV]) { load_staged(gamma_s, a - a0, part, out); };
  // Whether a thread's accesses past the block's part (its last ones, where tpr does not divide the
  // part) run the row's arithmetic without a branch: x and dy are zeros there (load), so g = 0 and
  // every sum gains 0, gamma is read at the part's last access (inside the staged range; were it
  // not finite, the row's sums already are not from that access itself), and only the store of dx
  // is skipped. One straight line a row lets ptxas schedule the shared-memory reads of gamma and of
  // the sums across accesses: the register-sum variants 1.03-1.12x and float32's shared-memory ones
  // 1.00-1.08x on the H200 (bench/README.md, "... its accesses without a branch: kept"). Not for
  // 16-bit sums in shared memory (16-72 bytes of spill at their 80- and 128-register bounds:
  // 0.6-0.8x) but kKeep's (128 registers, no spill), nor the window variants (their masks decide a
  // row's ends). (`!kStraight ||` below is spelled out on purpose: a shorter form that is the same
  // in C++ changes ptxas's schedule in 66 instantiations, and these were measured as they are.)
  constexpr bool kStraight = !kWin && (!(kSmemSums && sizeof(T) == 2) || kKeep);
  float gkeep[kKeep ? kNv : 1][kV];  // kKeep: the row's gamma floats, from the sums' pass to dx's

  // The group's row starting at row0, as loaded: x, dy, mean and rstd (zeros past the end).
  Pack<T, kBytes> next_x[kNv], next_dy[kNv];
  float next_mean = 0.f, next_rstd = 0.f;
  auto load = [&](int64_t row0) {
    const int64_t row = row0 + group;
    const bool valid = row < p.rows;
    const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols - lead;
    const T* __restrict__ dy = static_cast<const T*>(p.dy) + row * cols - lead;
    next_mean = valid ? p.mean[row] : 0.f;
    next_rstd = valid ? p.rstd[row] : 0.f;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      if (valid && a < a1 && (!kWin || a * kV < end)) {
        next_x[i] = load_pack<T, kBytes>(x + a * kV);
        if constexpr (kWin) next_dy[i] = load_window_raw<T>(dy, static_cast<int>(a * kV), lead, end, dy_vector);
        else next_dy[i] = load_pack<T, kBytes>(dy + a * kV);
      } else {
        next_x[i] = next_dy[i] = zero_pack<T, kBytes>();
      }
    }
  };
  const int64_t first = cid * blockDim.y;
  if (first < p.rows) load(first);
  if constexpr (kWin)  // loads in flight
    stage_param_window<T, kNv>(gamma_s, gamma, 1.f, a0, a1 - a0, part, tid, blockDim.x * blockDim.y, lead, cols);
  else
    stage_param<T, kBytes>(gamma_s, gamma, 1.f, a0, a1 - a0, part, tid, blockDim.x * blockDim.y);
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster.barrier_wait();  // every block of the cluster has started (above)
#endif
  // Iteration it uses buffer `parity` (it & 1) and its mbarrier in phase (it >> 1) & 1.
  for (int64_t row0 = first, it = 0; row0 < p.rows; row0 += stride, ++it) {
    const int parity = static_cast<int>(it & 1);
    Pack<T, kBytes> xs[kNv], ds[kNv];
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      xs[i] = next_x[i];
      ds[i] = next_dy[i];
    }
    const float mean = next_mean, rstd = next_rstd;
    if (row0 + stride < p.rows) load(row0 + stride);  // in flight through this row's sums and exchange
    if constexpr (kWin) {  // zeros outside the row: dy's make its sums' terms 0 there, x's keep them finite
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int pos = static_cast<int>((a0 + i * tpr + lane) * kV);
        mask_window(xs[i], pos, lead, end);
        mask_window(ds[i], pos, lead, end);
      }
    }
    const int64_t row = row0 + group;
    float2 sums = make_float2(0.f, 0.f);  // sum of g = dy * gamma, and of g * xhat
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      if constexpr (!kStraight) {
        if (a >= a1) continue;
      }
      float xv[kV], dv[kV], gv[kV];
      unpack(xs[i], xv);
      unpack(ds[i], dv);
      gamma_of(!kStraight || a < a1 ? a : a1 - 1, gv);
      if constexpr (kKeep) {
#pragma unroll
        for (int k = 0; k < kV; ++k) gkeep[i][k] = gv[k];
      }
      float xhat[kV];
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        // xhat = (x - mean) * rstd, a subtraction first: the fma form cancels where |mean| >> std.
        xhat[k] = (xv[k] - mean) * rstd;
        const float g = dv[k] * gv[k];
        sums.x += g;
        sums.y = fmaf(g, xhat[k], sums.y);
      }
      // rows past the end add 0 to dgamma and dbeta: dy is 0 there
      if constexpr (kSmemSums) {
        if (want_params) add_param_sums<kV, kW>([&](int j) -> Sum& { return slot(i, j); }, dv, xhat);
      } else if constexpr (kRegSums) {
        add_param_sums(dg[i], db[i], dv, xhat);
      }
    }
    if (!p.dx) continue;  // uniform over the grid
    // Unpack again below rather than keep this loop's floats alive through the reductions: the
    // compiler would hold 4 floats for every packed register (97 to 120 registers in bf16, one
    // block per SM). An empty asm that "changes" the packs forbids reusing the floats.
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      opaque(xs[i]);
      opaque(ds[i]);
    }
    sums = group_total<float2, kWin && !kSmemSums>(sums, red[parity]);  // kLoop: see group_total
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (!kClustered) {
      if (C > 1) cluster.sync();  // never taken: as in the forward (fwd_wide_body)
    }
    if (kClustered && C > 1) {  // the row-group's sums to every block of the cluster (cluster_push)
      float2* const box = inbox_slots + (parity * blockDim.y + group) * C;
      cluster_push(cluster, box, bars + parity, it, rank, lane, tid == 0, C, static_cast<int>(blockDim.y), sums);
      const int r = lane % 32;
      const float2 o = r < C ? box[r] : make_float2(0.f, 0.f);
      sums = make_float2(group_sum<32>(o.x), group_sum<32>(o.y));
    }
#endif
    if (row >= p.rows) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) = a * g + c * xhat + b; for 16-bit outputs
    // c * xhat + b is one fma on x (see layer_norm_bwd.cu).
    const float ca = rstd;
    const float cb = -ca * sums.x * inv_cols;
    const float cc = -ca * sums.y * inv_cols;
    const float cx = cc * rstd;
    const float bx = cb - cx * mean;
    T* __restrict__ dx = static_cast<T*>(p.dx) + row * cols - lead;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      if constexpr (!kStraight) {
        if (a >= a1) continue;
      }
      float xv[kV], dv[kV], gv[kV], out[kV];
      unpack(xs[i], xv);
      unpack(ds[i], dv);
      if constexpr (kKeep) {
#pragma unroll
        for (int k = 0; k < kV; ++k) gv[k] = gkeep[i][k];
      } else {
        gamma_of(!kStraight || a < a1 ? a : a1 - 1, gv);
      }
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        if constexpr (sizeof(T) == 2) {
          out[k] = fmaf(ca, dv[k] * gv[k], fmaf(cx, xv[k], bx));
        } else {
          const float xhat = (xv[k] - mean) * rstd;
          out[k] = fmaf(ca, dv[k] * gv[k], fmaf(cc, xhat, cb));
        }
      }
      if constexpr (kWin) store_window<T>(dx, static_cast<int>(a * kV), lead, end, dx_vector, out);
      else if (!kStraight || a < a1) store_pack(dx + a * kV, pack<T, kBytes>(out));
    }
  }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster_leave_arrive();  // waited for at the end, after the partial rows
#endif
  if constexpr (kWin && !kSmemSums) {
    // dx alone: no sums
  } else if constexpr (kSmemSums) {
    if (p.dgamma || p.dbeta) {  // uniform over the grid
      // The same fixed order as below: group g adds the running total of groups 0 .. g - 1 (in the
      // slots of its lane's thread in group g - 1) to its own; the last group writes the partial row.
      float* partials = static_cast<float*>(p.workspace);
      const int groups = blockDim.y;
      for (int g = 1; g < groups; ++g) {
        __syncthreads();
        if (group == g) {
#pragma unroll
          for (int i = 0; i < kNv; ++i) {
            if (a0 + i * tpr + lane >= a1) continue;
#pragma unroll
            for (int j = 0; j < 2 * kQ; ++j) {
              Sum mine = slot(i, j);
              // (kStride: the one stride where blocks have several row-groups; slot_stride differs
              // only for window blocks, which have one, so this loop never runs for them.)
              Sum before = sums[(i * 2 * kQ + j) * kStride - tpr];
#pragma unroll
              for (int k = 0; k < kW; ++k) sum_lane<kW>(mine, k) += sum_lane<kW>(before, k);
              slot(i, j) = mine;
            }
          }
        }
      }
      if (group == groups - 1) {
#pragma unroll
        for (int i = 0; i < kNv; ++i) {
          const int64_t a = a0 + i * tpr + lane;
          if (a >= a1) continue;
#pragma unroll
          for (int which = 0; which < 2; ++which) {
            if constexpr (kWin) {
              // by column: the row's positions [lead, end) only, a float at a time (once a kernel)
              float* dst = partials + (which * clusters + cid) * cols;
#pragma unroll
              for (int j = 0; j < kQ; ++j) {
                Sum v = slot(i, which * kQ + j);
#pragma unroll
                for (int k = 0; k < kW; ++k) {
                  const int pos = static_cast<int>(a * kV) + j * kW + k;
                  if (pos >= lead && pos < end) dst[pos - lead] = sum_lane<kW>(v, k);
                }
              }
            } else {
              // cols is a multiple of kV: the row's start, and a * kV, are kW-float aligned
              Sum* dst = reinterpret_cast<Sum*>(partials + (which * clusters + cid) * cols + a * kV);
#pragma unroll
              for (int j = 0; j < kQ; ++j) dst[j] = slot(i, which * kQ + j);
            }
          }
        }
      }
    }
  } else if (p.dgamma || p.dbeta) {  // uniform over the grid
    // The block's row-groups hold sums for the same columns: folded group by group (a fixed
    // order) in shared memory, the last group adding its own and writing the cluster's partial row.
    float* partials = static_cast<float*>(p.workspace);
    const int groups = blockDim.y;
    for (int which = 0; which < 2; ++which) {
      float* dst = partials + (which * clusters + cid) * cols;
      for (int g = 0; g < groups; ++g) {
        if (group == g) {
#pragma unroll
          for (int i = 0; i < kNv; ++i) {
            const int64_t a = a0 + i * tpr + lane;
            if (a >= a1) continue;
            const int64_t local = (a - a0) * kV;
#pragma unroll
            for (int k = 0; k < kV; ++k) {
              const float mine = which == 0 ? dg[i][k] : db[i][k];
              const float total = g == 0 ? mine : fold[local + k] + mine;
              if (g == groups - 1) dst[a * kV + k] = total;
              else fold[local + k] = total;
            }
          }
        }
        __syncthreads();
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster_leave_wait();  // arrived after the loop
#endif
}

// The sums in shared memory (`sums`: this thread's first slot, kSmemSumsMaxThreads apart) folded
// over the block's row-groups in a fixed order (group g adds the running total of groups 0 .. g - 1,
// in the slots of its lane's thread in group g - 1, to its own) and written by the last group as the
// block's partial rows of dgamma and dbeta (aligned rows: not the window variants').
// bwd_wide_pair_kernel's; bwd_wide_kernel keeps its own copy of the fold (its window variants write
// by column): calling this from it changed ptxas's code in 95 of its instantiations (registers and
// instruction order, inside the main loop too; sm_90a, 2026-11-29), which were measured as they are.
template <int kNv, int kV, int kW>
__device__ __forceinline__ void fold_smem_sums(const BwdParams& p, SumVec<kW>* sums, int64_t cols, int64_t clusters,
                                               int64_t cid, int64_t a0, int64_t a1, int tpr, int lane, int group) {
  constexpr int kQ = kV / kW;
  constexpr int kStride = kSmemSumsMaxThreads;
  using Sum = SumVec<kW>;
  float* partials = static_cast<float*>(p.workspace);
  const int groups = blockDim.y;
  for (int g = 1; g < groups; ++g) {
    __syncthreads();
    if (group == g) {
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        if (a0 + i * tpr + lane >= a1) continue;
#pragma unroll
        for (int j = 0; j < 2 * kQ; ++j) {
          Sum mine = sums[(i * 2 * kQ + j) * kStride];
          Sum before = sums[(i * 2 * kQ + j) * kStride - tpr];
#pragma unroll
          for (int k = 0; k < kW; ++k) sum_lane<kW>(mine, k) += sum_lane<kW>(before, k);
          sums[(i * 2 * kQ + j) * kStride] = mine;
        }
      }
    }
  }
  if (group != groups - 1) return;
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    const int64_t a = a0 + i * tpr + lane;
    if (a >= a1) continue;
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      Sum* dst = reinterpret_cast<Sum*>(partials + (which * clusters + cid) * cols + a * kV);
#pragma unroll
      for (int j = 0; j < kQ; ++j) dst[j] = sums[(i * 2 * kQ + which * kQ + j) * kStride];
    }
  }
}

// bwd_wide_pair_kernel: the 16-bit shared-memory-sum backward at 2 accesses a thread, two rows of
// each row-group at a time (rows r and r + stride): both rows' dgamma/dbeta terms go into the
// thread's sums in shared memory on one read and one write of them (the same order of additions as
// a row at a time), gamma is read from shared memory once a pass for the two, their row sums take
// one block reduction (pair_total: a float4, one barrier) and in a cluster (kClustered) one push
// to its blocks (cluster_push of a float4, inbox_total), and the next two rows are in flight
// through them. pair_total and inbox_total took the kernel's instructions 4-8.5% down (bf16 12,288
// columns in c4: 16.6 -> 15.2 million); the best bf16 backward at 16M elements 1.02-1.04x at 4,096,
// 6,144, 8,192, 16,384, 32,768 and 65,536 columns, 0.98-1.00x at the others, fp16 0.98-1.02x
// (bench/README.md, "... in fewer instructions"). Sum vectors of at most 4 floats (kW): kQ of
// them an access. ptxas, sm_90a, no spill anywhere:
// - 4- and 8-byte accesses: bound to 2 blocks of 256 threads an SM as kKeep (119-121 registers with
//   8-byte accesses, 90-94 with 4; 121-128 and 96 before pair_total); launched where kKeep would be
//   (keep_gamma_fits). Against kKeep in one-block rows (H200, bf16 and fp16, base/new twice):
//   1.07-1.15x at 16M elements (254, 382, 500, 766, 1,022 and 2,044 columns), 1.03-1.24x at 1M.
//   In clusters measured by the sweep alone (against the last one, another call): 6,402 columns
//   (4-byte) in c8 1.03x at 16M and 1.17-1.18x at 1M, the other 4- and 8-byte widths 0.97-1.02x.
// - 16-byte accesses, early (!kLate: the next rows issued at the top of the round): 167-168
//   registers, bound to 1 block of 256 an SM (at 2, ptxas spilled 64-92 bytes). Blocks of 96 x 2 and
//   192 threads still fit two an SM: in one-block rows it runs there, 1.01-1.13x the kernel it
//   replaced at 16M elements (1,280 to 1,536 columns, 2,816, 3,072), 1.11-1.14x at 1M (1,280, 1,288).
// - 16-byte accesses, kLate (the next rows issued after the sums' pass, in flight through dx's):
//   126-128 registers, 2 blocks of 256 an SM. In one-block rows where more of its blocks fit than
//   of the early form's (blocks of 160, 224 and 256 threads): 1.02-1.10x the kernels before at 16M
//   (768 to 4,096 columns; 0.98-1.00x at 512), 1.03-1.05x at 1M (2,560); the early form where as
//   many fit is 1.00-1.04x it at 16M (0.95-0.96x at 1M, 1,280-1,288 columns). In clusters alone:
//   1.04-1.26x the kernel it replaced (16M, 5,120 to 65,536 columns), the best backward 1.05-1.14x
//   from 4,096 to 65,536 columns.
// Each row-group of the grid takes at least kPairRowsPerGroup rows. (bench/README.md, "Two rows a
// round in the wide 16-bit backward", "... with 16-byte accesses" and "... in clusters".)
template <typename T, int kNv, int kBytes, bool kClustered, bool kLate>
__global__ void __launch_bounds__(kSmemSumsMaxThreads, kLate || kBytes < 16 ? 2 : 1)
    bwd_wide_pair_kernel(const BwdParams p, const int64_t part, const int inbox) {
  static_assert(sizeof(T) == 2 && (!kLate || kBytes == 16));
  extern __shared__ __align__(16) float fold[];
  constexpr int kV = kVec<T, kBytes>;
  constexpr int kW = kV < 4 ? kV : 4;  // dgamma's kQ sum vectors an access in slots 0 .. kQ - 1, dbeta's after
  constexpr int kQ = kV / kW;
  using Sum = SumVec<kW>;
  constexpr int kStride = kSmemSumsMaxThreads;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  Sum* const sums = reinterpret_cast<Sum*>(fold) + tid;
  __shared__ float4 red[2][32];
  const int lane = threadIdx.x, group = threadIdx.y;
  const int tpr = blockDim.x;
  const int64_t cols = p.cols, acc = cols / kV;
  const auto [C, rank, a0, a1, cid, clusters, stride] = wide_place(part, acc);
  auto slot = [&](int i, int j) -> Sum& { return sums[(i * 2 * kQ + j) * kStride]; };
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  // (Launched only where p sums dgamma or dbeta: with_bwd_wide_kernel.)
  wait_for_previous_grid();
  allow_next_grid();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // In a cluster the inbox as bwd_wide_kernel's, its slots float4: both rows' sums in one push.
  const cg::cluster_group cluster = cg::this_cluster();
  uint64_t* const bars = inbox_bars(fold, inbox);
  float4* const inbox_slots = inbox_slots_of<float4>(fold, inbox);
  if (kClustered && C > 1 && tid == 0) mbarrier_init_inbox(bars);
  if (kClustered && C > 1) cluster.barrier_arrive();
#endif
  float* const gamma_s = fold + kStride * kNv * kV * 2;
#pragma unroll
  for (int i = 0; i < kNv; ++i)
#pragma unroll
    for (int j = 0; j < 2 * kQ; ++j) slot(i, j) = Sum{};
  auto gamma_of = [&](int64_t a, float (&out)[kV]) { load_staged(gamma_s, a - a0, part, out); };
  // The group's two rows from row0 (row0 + group and row0 + stride + group), as loaded: zeros past
  // the end (they add nothing to the sums and store nothing).
  Pack<T, kBytes> next_x[2][kNv], next_dy[2][kNv];
  float next_mean[2] = {0.f, 0.f}, next_rstd[2] = {0.f, 0.f};
  auto load = [&](int64_t row0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = row0 + r * stride + group;
      const bool valid = row < p.rows;
      const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols;
      const T* __restrict__ dy = static_cast<const T*>(p.dy) + row * cols;
      next_mean[r] = valid ? p.mean[row] : 0.f;
      next_rstd[r] = valid ? p.rstd[row] : 0.f;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int64_t a = a0 + i * tpr + lane;
        if (valid && a < a1) {
          next_x[r][i] = load_pack<T, kBytes>(x + a * kV);
          next_dy[r][i] = load_pack<T, kBytes>(dy + a * kV);
        } else {
          next_x[r][i] = next_dy[r][i] = zero_pack<T, kBytes>();
        }
      }
    }
  };
  const int64_t first = cid * blockDim.y;
  if (first < p.rows) load(first);
  stage_param<T, kBytes>(gamma_s, gamma, 1.f, a0, a1 - a0, part, tid, blockDim.x * blockDim.y);
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster.barrier_wait();
#endif
  for (int64_t row0 = first, it = 0; row0 < p.rows; row0 += 2 * stride, ++it) {
    const int parity = static_cast<int>(it & 1);
    Pack<T, kBytes> xs[2][kNv], ds[2][kNv];
    float mean[2], rstd[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mean[r] = next_mean[r];
      rstd[r] = next_rstd[r];
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        xs[r][i] = next_x[r][i];
        ds[r][i] = next_dy[r][i];
      }
    }
    if constexpr (!kLate)
      if (row0 + 2 * stride < p.rows) load(row0 + 2 * stride);  // in flight through these two rows
    float4 rs = make_float4(0.f, 0.f, 0.f, 0.f);  // row 0's sum of g and of g * xhat, then row 1's
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      const int64_t ga = (a < a1 ? a : a1 - 1) - a0;
      // A sum vector (kW floats) at a time: its gamma, both rows' terms, one read and one write of
      // the thread's dgamma and dbeta vectors for the two rows.
#pragma unroll
      for (int j = 0; j < kQ; ++j) {
        float gq[kW];
        load_staged_part<kV>(gamma_s, ga, part, j, gq);
        Sum sg = slot(i, j), sb = slot(i, kQ + j);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float xv[kV], dv[kV];
          unpack(xs[r][i], xv);
          unpack(ds[r][i], dv);
#pragma unroll
          for (int k = 0; k < kW; ++k) {
            const int e = j * kW + k;
            // xhat = (x - mean) * rstd, a subtraction first: the fma form cancels where |mean| >> std.
            const float xhat = (xv[e] - mean[r]) * rstd[r];
            const float g = dv[e] * gq[k];
            if (r == 0) {
              rs.x += g;
              rs.y = fmaf(g, xhat, rs.y);
            } else {
              rs.z += g;
              rs.w = fmaf(g, xhat, rs.w);
            }
            sum_lane<kW>(sg, k) = fmaf(dv[e], xhat, sum_lane<kW>(sg, k));
            sum_lane<kW>(sb, k) += dv[e];
          }
        }
        slot(i, j) = sg;
        slot(i, kQ + j) = sb;
      }
    }
    // kLate: the next two rows issued here, in flight through dx's pass (128 registers hold them)
    if constexpr (kLate)
      if (row0 + 2 * stride < p.rows) load(row0 + 2 * stride);
    if (!p.dx) continue;  // uniform over the grid
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        opaque(xs[r][i]);
        opaque(ds[r][i]);
      }
    rs = pair_total(rs, red[parity]);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (kClustered && C > 1) {  // both rows' sums to every block of the cluster (cluster_push)
      float4* const box = inbox_slots + (parity * blockDim.y + group) * C;
      cluster_push(cluster, box, bars + parity, it, rank, lane, tid == 0, C, static_cast<int>(blockDim.y), rs);
      rs = inbox_total(box, C, lane);
    }
#endif
    float ca[2], cx[2], bx[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ca[r] = rstd[r];
      const float cb = -ca[r] * (r == 0 ? rs.x : rs.z) * inv_cols;
      const float cc = -ca[r] * (r == 0 ? rs.y : rs.w) * inv_cols;
      cx[r] = cc * rstd[r];
      bx[r] = cb - cx[r] * mean[r];
    }
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int64_t a = a0 + i * tpr + lane;
      float gv[kV];
      gamma_of(a < a1 ? a : a1 - 1, gv);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row0 + r * stride + group;
        float xv[kV], dv[kV], out[kV];
        unpack(xs[r][i], xv);
        unpack(ds[r][i], dv);
#pragma unroll
        for (int k = 0; k < kV; ++k) out[k] = fmaf(ca[r], dv[k] * gv[k], fmaf(cx[r], xv[k], bx[r]));
        if (a < a1 && row < p.rows) store_pack(static_cast<T*>(p.dx) + row * cols + a * kV, pack<T, kBytes>(out));
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster_leave_arrive();
#endif
  fold_smem_sums<kNv, kV, kW>(p, sums, cols, clusters, cid, a0, a1, tpr, lane, group);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kClustered && C > 1) cluster_leave_wait();
#endif
}

// The backward's kernel of a launch whose clusters have kCluster blocks (as fwd_wide_entry).
template <typename T, int kNv, int kBytes, bool kSmemSums, bool kWin, int kCluster, bool kBig = false,
          bool kKeep = false>
constexpr auto bwd_wide_entry() {
  return bwd_wide_kernel<T, kNv, kBytes, kSmemSums, kWin, (kCluster > 1), kBig, kKeep>;
}

template <typename K>
int64_t bwd_clusters(K kernel, const BwdParams& p, const WideShape& s, int cluster, bool smem_sums);  // below
// bwd_wide_pair_kernel's launches: at least this many rows for each row-group of the grid (H200, 1M
// elements, 16-bit: 2 rows, 500 columns, 0.94-0.95x the kept-gamma kernel; 3.5 to 4 rows, 766 and
// 1,022 columns, 1.14-1.22x).
constexpr int64_t kPairRowsPerGroup = 3;

// Calls g(kernel) with the (not window) backward's kernel for shape s: the big blocks' own
// instantiation where s has more than kSmemSumsMaxThreads threads (wide_shape allows it only with
// the sums in shared memory, 8 accesses and clusters of 16), bwd_wide_pair_kernel or kKeep's where
// p sums dgamma or dbeta (16-bit sums in shared memory, 2 accesses: the rules above each);
// cudaErrorInvalidValue where no instantiation takes s.
template <typename T, int kNv, int kBytes, bool kSmemSums, int kCluster, typename G>
cudaError_t with_bwd_wide_kernel(const WideShape& s, const BwdParams& p, G&& g) {
  if constexpr (pair_shapes(kSmemSums, sizeof(T), kNv)) {
    if ((p.dgamma || p.dbeta) && s.threads <= kSmemSumsMaxThreads) {
      // A kernel's blocks an SM (resident_clusters with clusters of 1: the cached occupancy query,
      // which bwd_clusters asks too).
      auto per_sm = [&](auto kernel) {
        return resident_clusters(reinterpret_cast<const void*>(kernel), s.threads, s.rows,
                                 bwd_smem_bytes(s, p.dtype, kSmemSums, kCluster), 1, p.device) /
               p.device.sm_count;
      };
      const auto keep = bwd_wide_entry<T, kNv, kBytes, kSmemSums, false, kCluster, false, true>();
      const bool keep_fits = keep_gamma_fits(s, per_sm(keep));
      // The two-rows kernel where each row-group of the grid gets kPairRowsPerGroup rows.
      auto rows_allow = [&](auto pair) {
        return p.rows >= kPairRowsPerGroup * bwd_clusters(pair, p, s, kCluster, kSmemSums) * s.rows;
      };
      if constexpr (kBytes == 16) {
        // In one-block rows its early form where as many of its blocks fit an SM as of the late
        // one's (2: blocks of 96 x 2 and 192 threads), the late one where more fit (blocks of 160,
        // 224 and 256 threads); in clusters the late one.
        const auto late = bwd_wide_pair_kernel<T, kNv, kBytes, (kCluster > 1), true>;
        const int64_t n_late = per_sm(late);
        bool early_fits = false;
        if constexpr (kCluster == 1) {
          const auto early = bwd_wide_pair_kernel<T, kNv, kBytes, false, false>;
          const int64_t n_early = per_sm(early);
          early_fits = n_early >= 2 && n_early >= n_late;
          if (early_fits && rows_allow(early)) return g(early);
        }
        if (!early_fits && n_late >= 2 && rows_allow(late)) return g(late);
      } else {
        const auto pair = bwd_wide_pair_kernel<T, kNv, kBytes, (kCluster > 1), false>;
        if (keep_gamma_fits(s, per_sm(pair)) && rows_allow(pair)) return g(pair);
      }
      if (keep_fits) return g(keep);
    }
  }
  if (s.threads <= kSmemSumsMaxThreads || !kSmemSums) return g(bwd_wide_entry<T, kNv, kBytes, kSmemSums, false, kCluster>());
  if constexpr (kSmemSums && kNv == 8 && kCluster == kSmemSumsBigCluster)
    return g(bwd_wide_entry<T, kNv, kBytes, kSmemSums, false, kCluster, true>());
  return cudaErrorInvalidValue;
}

// Calls f.template operator()<T, kNv, kBytes>() for the instantiation of shape s;
// cudaErrorInvalidValue for an nv a direction does not instantiate or an access under 4 bytes.
template <bool kBackward, bool kSmemSums = false, typename F>
cudaError_t with_wide(DType dtype, const WideShape& s, F&& f) {
  return dispatch_dtype(dtype, [&]<typename T>() -> cudaError_t {
    return with_access_bytes<T>(s.bytes, [&]<int kBytes>() -> cudaError_t {
      if constexpr (kBytes >= 4) {
        switch (s.nv) {
          case 1: return f.template operator()<T, 1, kBytes>();
          case 2: return f.template operator()<T, 2, kBytes>();
          case 4:
            if constexpr (!kBackward || sizeof(T) == 4 || kSmemSums || kBytes < 16)
              return f.template operator()<T, 4, kBytes>();
            break;
          case 8:
            if constexpr (!kBackward || kBytes == 4 || (kBytes == 8 && (kSmemSums || sizeof(T) == 4)))
              return f.template operator()<T, 8, kBytes>();
            break;
        }
      }
      return cudaErrorInvalidValue;
    });
  });
}

template <typename K>
bool shape_fits(K kernel, const WideShape& s, std::size_t smem, int cluster, const DeviceInfo& device) {
  if (!fits(kernel, static_cast<int64_t>(s.threads) * s.rows, smem, device)) return false;  // registers too
  if (cluster == 1) return true;
  // Clusters need the device's support and code built for it (sm_90 PTX or later).
  return device.cluster_launch && kernel_info(reinterpret_cast<const void*>(kernel)).ptx_version >= 90 &&
         resident_clusters(reinterpret_cast<const void*>(kernel), s.threads, s.rows, smem, cluster, device) > 0;
}

// The access width the wide variants use for p (16, 8 or 4 bytes); 0: they do not take p.
int fwd_bytes(const FwdParams& p) {
  if (p.rows <= 0 || p.cols <= 0 || p.device.device < 0) return 0;
  return wide_access_bytes(p.cols, p.dtype, {p.x, p.y, p.gamma, p.beta});
}

int bwd_bytes(const BwdParams& p) {
  if (p.rows <= 0 || p.cols <= 0 || p.device.device < 0) return 0;
  return wide_access_bytes(p.cols, p.dtype, {p.x, p.dy, p.dx, p.gamma});
}

// The staged forward's shared memory: gamma and beta for the block's columns, as floats or in their
// dtype (in_dtype: the persistent forward, fwd_wide_c*_ps; stage_param_raw).
std::size_t fwd_smem_bytes(const WideShape& s, DType dtype, bool in_dtype) {
  const std::size_t elements =
      2 * static_cast<std::size_t>(s.part) * (static_cast<std::size_t>(s.bytes) / dtype_size(dtype));
  return elements * (in_dtype ? dtype_size(dtype) : sizeof(float));
}

// A kernel's dynamic shared memory: its own `own` bytes, then in a cluster the inbox (kInboxBarFloats).
std::size_t inbox_start(std::size_t own) { return (own + 15) / 16 * 16; }
// slot: the bytes of a row-group's push (float2; the two-rows backward's float4).
std::size_t smem_with_inbox(std::size_t own, const WideShape& s, int cluster, std::size_t slot = sizeof(float2)) {
  if (cluster < 2) return own;
  return inbox_start(own) + kInboxBarFloats * sizeof(float) + 2 * static_cast<std::size_t>(s.rows) * cluster * slot;
}
// Where the inbox starts, in floats (the kernels' last argument; unused without a cluster).
int inbox_at(std::size_t own, int cluster) {
  return cluster < 2 ? 0 : static_cast<int>(inbox_start(own) / sizeof(float));
}

// The forward's dynamic shared memory: gamma and beta staged (kStaged), then the inbox.
std::size_t fwd_own_bytes(const WideShape& s, DType dtype, bool staged, bool win) {
  return staged ? fwd_smem_bytes(s, dtype, !win) : 0;
}
// win: the window forward (gamma and beta staged as floats).
std::size_t fwd_wide_smem(const WideShape& s, DType dtype, bool staged, int cluster, bool win) {
  return smem_with_inbox(fwd_own_bytes(s, dtype, staged, win), s, cluster);
}
int fwd_inbox_at(const WideShape& s, DType dtype, bool staged, int cluster, bool win) {
  return inbox_at(fwd_own_bytes(s, dtype, staged, win), cluster);
}

// The backward's shared memory: its sums or fold, then gamma as floats for the block's columns;
// then the inbox.
std::size_t bwd_own_bytes(const WideShape& s, DType dtype, bool smem_sums) {
  const std::size_t vec = static_cast<std::size_t>(s.bytes) / dtype_size(dtype);  // elements an access
  const std::size_t gamma = static_cast<std::size_t>(s.part) * vec * sizeof(float);
  if (smem_sums)  // 2 x nv x vec float sums for each of s.slots threads (the slots' stride)
    return static_cast<std::size_t>(s.slots) * s.nv * vec * 2 * sizeof(float) + gamma;
  return (s.rows > 1 ? gamma : 0) + gamma;  // the fold is the size of the block's columns too
}
// Shapes bwd_wide_pair_kernel may take (pair_shapes) have an inbox of float4 slots, its pushes
// carrying two rows' sums. The other kernels of those shapes (kKeep, the plain one, the window
// ones) get the same inbox on purpose, using its first half: every candidate's occupancy query asks
// with one size (at most 2 x rows x C x 8 bytes more).
std::size_t bwd_smem_bytes(const WideShape& s, DType dtype, bool smem_sums, int cluster) {
  const bool pair = pair_shapes(smem_sums, dtype_size(dtype), s.nv);
  return smem_with_inbox(bwd_own_bytes(s, dtype, smem_sums), s, cluster, pair ? sizeof(float4) : sizeof(float2));
}
int bwd_inbox_at(const WideShape& s, DType dtype, bool smem_sums, int cluster) {
  return inbox_at(bwd_own_bytes(s, dtype, smem_sums), cluster);
}

// Clusters of the backward's persistent grid: enough for every row-group, no more than fit at once,
// and few enough that the partial rows (2 x 4 bytes a column each, written and read again, mostly
// from L2) stay within a third of the traffic of x, dy and dx (3 x rows x esize a column), though at
// least one block per SM. A twelfth, the first choice, held 16-bit rows of 3K to 64K columns at 16M
// elements to one block an SM; a third, H200, bf16: bwd_wide_c1 at D = 3,072 52.6 -> 42.7 us, c8 at
// 10,240 69.6 -> 62.1, c16 at 24,576 76.8 -> 71.2; float32 within 0.5% (more allowed: no faster).
// Kept for dx alone too (the *_cols bases), though it then has no partial rows: there the grid
// leaves SMs to the column sums that run beside it; every resident cluster instead cost up to 1.5x
// (H100, 1M elements, bwd_wide_c1_cols and c2_cols in bf16 at 1,024-4,096 columns: 0.66-0.85x).
template <typename K>
int64_t bwd_clusters(K kernel, const BwdParams& p, const WideShape& s, int cluster, bool smem_sums) {
  const int64_t needed = (p.rows + s.rows - 1) / s.rows;
  const int64_t resident =
      resident_clusters(reinterpret_cast<const void*>(kernel), s.threads, s.rows,
                        bwd_smem_bytes(s, p.dtype, smem_sums, cluster), cluster, p.device);
  const int64_t traffic_cap = p.rows * static_cast<int64_t>(dtype_size(p.dtype)) / 16;
  const int64_t fill = (p.device.sm_count + cluster - 1) / cluster;
  const int64_t cap = traffic_cap > fill ? traffic_cap : fill;
  int64_t n = needed < resident ? needed : resident;
  n = n < cap ? n : cap;
  return n > 0 ? n : 1;
}

// The window variants (fwd_wide_win_c*, bwd_wide_win_c*_cols and _smem) take rows that are not 16-byte
// aligned (16-byte rows are the other wide variants'), every tensor aligned to its element, rows
// whose window positions fit an int.
bool window_rows(int64_t rows, int64_t cols, DType dtype, int device, std::initializer_list<const void*> pointers) {
  if (rows <= 0 || cols <= 0 || cols > kMaxWindowCols || device < 0) return false;
  const int esize = static_cast<int>(dtype_size(dtype));
  return elem_aligned(pointers, esize) && access_bytes(cols, esize, pointers) < 16;
}

// A window grid's clusters, from the `most` that run at once: every row its own (one row-group a
// block), or a multiple of the period of the rows' leads, so that every row a block visits has the
// lead of its first (row r + n starts n x cols elements after row r). Where fewer than a period run
// at once, a period of them anyway: nothing waits across the grid (only within a cluster), so the
// rest start as others finish. 0: none runs at all.
int64_t window_clusters(int64_t most, int64_t rows, int64_t cols, DType dtype) {
  if (most < 1) return 0;
  if (most >= rows) return rows;
  const int64_t period = window_period(cols, 16 / static_cast<int>(dtype_size(dtype)));
  if (most < period) return period < rows ? period : rows;
  return most - most % period;
}

// The forward's kernel for shape s: fwd_wide_entry's, or fwd_wide_once_capped where the occupancy
// query (resident_clusters: cached per kernel, device, shape and shared memory) fits more of its
// blocks on the device.
template <typename T, int kNv, int kBytes, bool kStaged, int kCluster>
auto fwd_wide_pick(const WideShape& s, std::size_t smem, const DeviceInfo& device) {
  auto kernel = fwd_wide_entry<T, kNv, kBytes, kStaged, false, kCluster>();
  if constexpr (fwd_has_capped<T, kNv, kBytes, kStaged, kCluster>()) {
    auto capped = fwd_wide_once_capped<T, kNv, kBytes>;
    if (resident_clusters(reinterpret_cast<const void*>(capped), s.threads, s.rows, smem, 1, device) >
        resident_clusters(reinterpret_cast<const void*>(kernel), s.threads, s.rows, smem, 1, device))
      return capped;
  }
  return kernel;
}

}  // namespace

// The forward without a persistent grid has a cluster for each of its row-groups
// (fwd_once_body): at most 2^31 - 1 blocks.
template <int kCluster, bool kStaged>
bool fwd_wide_rows_fit(const FwdParams& p, const WideShape& s) {
  return !fwd_once(kCluster, kStaged) || (p.rows + s.rows - 1) / s.rows <= int64_t{0x7fffffff} / kCluster;
}

template <int kCluster, bool kStaged>
bool fwd_wide_supports(const FwdParams& p) {
  const int bytes = fwd_bytes(p);
  if (!bytes) return false;
  const WideShape s = wide_shape(p.cols, p.dtype, bytes, kCluster, false);
  if (!splits(s, kCluster) || !fwd_wide_rows_fit<kCluster, kStaged>(p, s)) return false;
  const std::size_t smem = fwd_wide_smem(s, p.dtype, kStaged, kCluster, false);
  return with_wide<false>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() {
           return shape_fits(fwd_wide_pick<T, kNv, kBytes, kStaged, kCluster>(s, smem, p.device), s, smem, kCluster,
                             p.device)
                      ? cudaSuccess
                      : cudaErrorInvalidValue;
         }) == cudaSuccess;
}

// kStaged (fwd_wide_c*_ps): a persistent grid of as many clusters as run at once (fewer where the
// rows need fewer), each converting its part of gamma and beta once into shared memory for all the
// row-groups it visits. Otherwise one cluster a row-group, each reading them from global memory as
// it goes. Which wins depends on the rows a cluster visits and on the registers the staged body
// takes: measured per shape (H200, 16M elements: the staged grid 1.07-1.3x from 12,288 columns and
// 1.3-1.9x on 8-byte rows, 0.89-0.92x at 4,096-5,120 in one block and in float32 to 4,096, and
// 0.7-0.8x on 8-byte rows of 1M elements), so both are variants and the sweep's data chooses.
template <int kCluster, bool kStaged>
cudaError_t fwd_wide_run(const FwdParams& p, cudaStream_t stream) {
  const int bytes = fwd_bytes(p);
  if (!bytes) return cudaErrorInvalidValue;
  const WideShape s = wide_shape(p.cols, p.dtype, bytes, kCluster, false);
  if (!splits(s, kCluster) || !fwd_wide_rows_fit<kCluster, kStaged>(p, s)) return cudaErrorInvalidValue;
  return with_wide<false>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() -> cudaError_t {
    const std::size_t smem = fwd_wide_smem(s, p.dtype, kStaged, kCluster, false);
    auto kernel = fwd_wide_pick<T, kNv, kBytes, kStaged, kCluster>(s, smem, p.device);
    if constexpr (kCluster > 8) {
      if (const cudaError_t err = allow_large_clusters(reinterpret_cast<const void*>(kernel)); err != cudaSuccess)
        return err;
    }
    const int64_t groups = (p.rows + s.rows - 1) / s.rows;
    if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
    // Clusters a launch takes: fwd_once_body's one a row-group (fwd_wide_rows_fit).
    int64_t most = fwd_once(kCluster, kStaged) ? groups : int64_t{1} << 26;
    if constexpr (kStaged) {
      most = resident_clusters(reinterpret_cast<const void*>(kernel), s.threads, s.rows, smem, kCluster, p.device);
      if (most < 1) return cudaErrorInvalidValue;
    }
    const int64_t clusters = groups < most ? groups : most;
    return launch(kernel, dim3(static_cast<unsigned>(clusters * kCluster)), dim3(s.threads, s.rows), smem, stream,
                  kCluster, p, s.part, fwd_inbox_at(s, p.dtype, kStaged, kCluster, false));
  });
}

template <int kCluster, bool kSmemSums>
bool bwd_wide_supports(const BwdParams& p) {
  const int bytes = bwd_bytes(p);
  if (!bytes) return false;
  const WideShape s = wide_shape(p.cols, p.dtype, bytes, kCluster, true, kSmemSums);
  if (!splits(s, kCluster)) return false;
  const std::size_t smem = bwd_smem_bytes(s, p.dtype, kSmemSums, kCluster);
  return with_wide<true, kSmemSums>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() {
           return with_bwd_wide_kernel<T, kNv, kBytes, kSmemSums, kCluster>(s, p, [&](auto kernel) {
             return shape_fits(kernel, s, smem, kCluster, p.device) ? cudaSuccess : cudaErrorInvalidValue;
           });
         }) == cudaSuccess;
}

template <int kCluster, bool kSmemSums>
std::size_t bwd_wide_workspace(const BwdParams& p) {
  const int access = bwd_bytes(p);
  if ((!p.dgamma && !p.dbeta) || !access) return 0;
  const WideShape s = wide_shape(p.cols, p.dtype, access, kCluster, true, kSmemSums);
  std::size_t bytes = 0;
  with_wide<true, kSmemSums>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() {
    return with_bwd_wide_kernel<T, kNv, kBytes, kSmemSums, kCluster>(s, p, [&](auto kernel) {
      bytes = 2 * static_cast<std::size_t>(bwd_clusters(kernel, p, s, kCluster, kSmemSums)) *
              static_cast<std::size_t>(p.cols) * sizeof(float);
      return cudaSuccess;
    });
  });
  return bytes;
}

template <int kCluster, bool kSmemSums>
cudaError_t bwd_wide_run(const BwdParams& p, cudaStream_t stream) {
  const int bytes = bwd_bytes(p);
  if (!bytes) return cudaErrorInvalidValue;
  const WideShape s = wide_shape(p.cols, p.dtype, bytes, kCluster, true, kSmemSums);
  if (!splits(s, kCluster)) return cudaErrorInvalidValue;
  return with_wide<true, kSmemSums>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() -> cudaError_t {
    return with_bwd_wide_kernel<T, kNv, kBytes, kSmemSums, kCluster>(s, p, [&](auto kernel) -> cudaError_t {
      if constexpr (kCluster > 8) {
        if (const cudaError_t err = allow_large_clusters(reinterpret_cast<const void*>(kernel)); err != cudaSuccess)
          return err;
      }
      const std::size_t smem = bwd_smem_bytes(s, p.dtype, kSmemSums, kCluster);
      if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
      const int64_t clusters = grid_within_workspace(bwd_clusters(kernel, p, s, kCluster, kSmemSums), p);
      if (clusters < 1) return cudaErrorInvalidValue;
      if (const cudaError_t err =
              launch(kernel, dim3(static_cast<unsigned>(clusters * kCluster)), dim3(s.threads, s.rows), smem, stream,
                     kCluster, p, s.part, bwd_inbox_at(s, p.dtype, kSmemSums, kCluster));
          err != cudaSuccess)
        return err;
      return reduce_partials(p, static_cast<const float*>(p.workspace), static_cast<int>(clusters), stream);
    });
  });
}

// The window forward: the staged persistent forward (fwd_wide_c*_ps) for rows not 16-byte aligned,
// through their windows. Where the rows allow 4- or 8-byte accesses the other wide variants take
// them too, and the sweep's data chooses.
// kStaged (fwd_wide_win_c*): a persistent grid of as many clusters as run at once, a multiple of
// the rows' lead period (window_clusters). Otherwise (fwd_wide_win_c*_direct) a cluster a row:
// fwd_once_body's one-pass kernel for clusters of up to 4 (supports() says no where the rows need
// more than the grid's 2^31 - 1 blocks), fwd_wide_body's loop for 8 and 16.
template <int kCluster, bool kStaged>
int64_t fwd_win_clusters(const void* kernel, const FwdParams& p, const WideShape& s, std::size_t smem) {
  if constexpr (!kStaged) {
    // A cluster a row (one row-group a block): fwd_once_body takes exactly one (c1, c2, c4: 0, so
    // supports() says no, where fwd_wide_rows_fit does not hold); fwd_wide_body loops over the rows
    // past the grid's 2^31 - 1 blocks, its grid a multiple of the rows' lead period
    // (window_clusters) so that each cluster keeps one lead.
    if constexpr (fwd_once(kCluster, kStaged)) return fwd_wide_rows_fit<kCluster, kStaged>(p, s) ? p.rows : 0;
    return window_clusters(int64_t{0x7fffffff} / kCluster, p.rows, p.cols, p.dtype);
  }
  return window_clusters(resident_clusters(kernel, s.threads, s.rows, smem, kCluster, p.device), p.rows, p.cols,
                         p.dtype);
}

template <int kCluster, bool kStaged>
bool fwd_wide_win_supports(const FwdParams& p) {
  if (!window_rows(p.rows, p.cols, p.dtype, p.device.device, {p.x, p.y, p.gamma, p.beta})) return false;
  const WideShape s = wide_shape(p.cols, p.dtype, 16, kCluster, false, false, true);
  if (!splits(s, kCluster)) return false;
  const std::size_t smem = fwd_wide_smem(s, p.dtype, kStaged, kCluster, true);
  return with_wide<false>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() {
           if constexpr (kBytes == 16) {
             auto kernel = fwd_wide_entry<T, kNv, kBytes, kStaged, true, kCluster>();
             if (shape_fits(kernel, s, smem, kCluster, p.device) &&
                 fwd_win_clusters<kCluster, kStaged>(reinterpret_cast<const void*>(kernel), p, s, smem) > 0)
               return cudaSuccess;
           }
           return cudaErrorInvalidValue;
         }) == cudaSuccess;
}

template <int kCluster, bool kStaged>
cudaError_t fwd_wide_win_run(const FwdParams& p, cudaStream_t stream) {
  if (!window_rows(p.rows, p.cols, p.dtype, p.device.device, {p.x, p.y, p.gamma, p.beta}))
    return cudaErrorInvalidValue;
  const WideShape s = wide_shape(p.cols, p.dtype, 16, kCluster, false, false, true);
  if (!splits(s, kCluster)) return cudaErrorInvalidValue;
  return with_wide<false>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() -> cudaError_t {
    if constexpr (kBytes != 16) {
      return cudaErrorInvalidValue;
    } else {
      auto kernel = fwd_wide_entry<T, kNv, kBytes, kStaged, true, kCluster>();
      if constexpr (kCluster > 8) {
        if (const cudaError_t err = allow_large_clusters(reinterpret_cast<const void*>(kernel)); err != cudaSuccess)
          return err;
      }
      const std::size_t smem = fwd_wide_smem(s, p.dtype, kStaged, kCluster, true);
      if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
      const int64_t clusters = fwd_win_clusters<kCluster, kStaged>(reinterpret_cast<const void*>(kernel), p, s, smem);
      if (clusters < 1) return cudaErrorInvalidValue;
      return launch(kernel, dim3(static_cast<unsigned>(clusters * kCluster)), dim3(s.threads, s.rows), smem, stream,
                    kCluster, p, s.part, fwd_inbox_at(s, p.dtype, kStaged, kCluster, true));
    }
  });
}

// The window backward: dx alone (kSums false: the base of bwd_wide_win_c*_cols, which sums dgamma
// and dbeta down the columns; it says no where they are asked of it), shaped as the backward with
// its sums in shared memory (up to 4 packs a thread) in blocks of up to 512 threads, since it holds
// none; or with the sums (kSums: bwd_wide_win_c*_smem) in shared memory by window position, blocks
// of up to 256 threads, one partial row a cluster as bwd_wide_c*_smem.
template <int kCluster, bool kSums>
WideShape bwd_win_shape(const BwdParams& p) {
  return wide_shape(p.cols, p.dtype, 16, kCluster, true, true, true, kSums);
}

// The window backward's clusters: the backward's (bwd_clusters), within the workspace, then a
// multiple of the rows' lead period (window_clusters), which may round a count under one period up
// to one: run() checks that the workspace still holds their partial rows.
template <bool kSums, typename K>
int64_t bwd_win_clusters(K kernel, const BwdParams& p, const WideShape& s, int cluster, int64_t cap) {
  int64_t n = bwd_clusters(kernel, p, s, cluster, kSums);
  n = n < cap ? n : cap;
  return window_clusters(n, p.rows, p.cols, p.dtype);
}

template <int kCluster, bool kSums>
bool bwd_wide_win_supports(const BwdParams& p) {
  if (!kSums && (p.dgamma || p.dbeta)) return false;
  if (!window_rows(p.rows, p.cols, p.dtype, p.device.device, {p.x, p.dy, p.dx, p.gamma})) return false;
  const WideShape s = bwd_win_shape<kCluster, kSums>(p);
  if (!splits(s, kCluster)) return false;
  const std::size_t smem = bwd_smem_bytes(s, p.dtype, kSums, kCluster);
  return with_wide<true, true>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() {
           if constexpr (kBytes == 16) {
             auto kernel = bwd_wide_entry<T, kNv, kBytes, kSums, true, kCluster>();
             if (shape_fits(kernel, s, smem, kCluster, p.device) &&
                 bwd_win_clusters<kSums>(kernel, p, s, kCluster, int64_t{1} << 30) > 0)
               return cudaSuccess;
           }
           return cudaErrorInvalidValue;
         }) == cudaSuccess;
}

template <int kCluster>
std::size_t bwd_wide_win_workspace(const BwdParams& p) {
  if ((!p.dgamma && !p.dbeta) ||
      !window_rows(p.rows, p.cols, p.dtype, p.device.device, {p.x, p.dy, p.dx, p.gamma}))
    return 0;
  const WideShape s = bwd_win_shape<kCluster, true>(p);
  std::size_t bytes = 0;
  with_wide<true, true>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() {
    if constexpr (kBytes == 16) {
      bytes = 2 *
              static_cast<std::size_t>(bwd_win_clusters<true>(bwd_wide_entry<T, kNv, kBytes, true, true, kCluster>(),
                                                              p, s, kCluster, int64_t{1} << 30)) *
              static_cast<std::size_t>(p.cols) * sizeof(float);
    }
    return cudaSuccess;
  });
  return bytes;
}

template <int kCluster, bool kSums>
cudaError_t bwd_wide_win_run(const BwdParams& p, cudaStream_t stream) {
  if (!kSums && (p.dgamma || p.dbeta)) return cudaErrorInvalidValue;
  if (!window_rows(p.rows, p.cols, p.dtype, p.device.device, {p.x, p.dy, p.dx, p.gamma}))
    return cudaErrorInvalidValue;
  const bool want_params = p.dgamma || p.dbeta;
  if (!p.dx && !want_params) return cudaSuccess;
  const WideShape s = bwd_win_shape<kCluster, kSums>(p);
  if (!splits(s, kCluster)) return cudaErrorInvalidValue;
  return with_wide<true, true>(p.dtype, s, [&]<typename T, int kNv, int kBytes>() -> cudaError_t {
    if constexpr (kBytes != 16) {
      return cudaErrorInvalidValue;
    } else {
      auto kernel = bwd_wide_entry<T, kNv, kBytes, kSums, true, kCluster>();
      if constexpr (kCluster > 8) {
        if (const cudaError_t err = allow_large_clusters(reinterpret_cast<const void*>(kernel)); err != cudaSuccess)
          return err;
      }
      const std::size_t smem = bwd_smem_bytes(s, p.dtype, kSums, kCluster);
      if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
      const int64_t clusters =
          bwd_win_clusters<kSums>(kernel, p, s, kCluster, grid_within_workspace(int64_t{1} << 30, p));
      if (clusters < 1) return cudaErrorInvalidValue;
      if (grid_within_workspace(clusters, p) < clusters) return cudaErrorInvalidValue;  // one period rounded up
      if (const cudaError_t err =
              launch(kernel, dim3(static_cast<unsigned>(clusters * kCluster)), dim3(s.threads, s.rows), smem, stream,
                     kCluster, p, s.part, bwd_inbox_at(s, p.dtype, kSums, kCluster));
          err != cudaSuccess)
        return err;
      if (!want_params) return cudaSuccess;
      return reduce_partials(p, static_cast<const float*>(p.workspace), static_cast<int>(clusters), stream);
    }
  });
}

#define HFNN_WIDE(C)                                                           \
  template bool fwd_wide_supports<C, false>(const FwdParams&);                 \
  template cudaError_t fwd_wide_run<C, false>(const FwdParams&, cudaStream_t); \
  template bool fwd_wide_supports<C, true>(const FwdParams&);                  \
  template cudaError_t fwd_wide_run<C, true>(const FwdParams&, cudaStream_t);  \
  template bool bwd_wide_supports<C, false>(const BwdParams&);                 \
  template std::size_t bwd_wide_workspace<C, false>(const BwdParams&);         \
  template cudaError_t bwd_wide_run<C, false>(const BwdParams&, cudaStream_t); \
  template bool bwd_wide_supports<C, true>(const BwdParams&);                  \
  template std::size_t bwd_wide_workspace<C, true>(const BwdParams&);          \
  template cudaError_t bwd_wide_run<C, true>(const BwdParams&, cudaStream_t);  \
  template bool fwd_wide_win_supports<C, true>(const FwdParams&);              \
  template cudaError_t fwd_wide_win_run<C, true>(const FwdParams&, cudaStream_t); \
  template bool fwd_wide_win_supports<C, false>(const FwdParams&);             \
  template cudaError_t fwd_wide_win_run<C, false>(const FwdParams&, cudaStream_t); \
  template bool bwd_wide_win_supports<C, false>(const BwdParams&);             \
  template cudaError_t bwd_wide_win_run<C, false>(const BwdParams&, cudaStream_t); \
  template bool bwd_wide_win_supports<C, true>(const BwdParams&);              \
  template std::size_t bwd_wide_win_workspace<C>(const BwdParams&);            \
  template cudaError_t bwd_wide_win_run<C, true>(const BwdParams&, cudaStream_t);
HFNN_WIDE(1)
HFNN_WIDE(2)
HFNN_WIDE(4)
HFNN_WIDE(8)
HFNN_WIDE(16)
#undef HFNN_WIDE

}  // namespace hfnn::kernels::layer_norm
