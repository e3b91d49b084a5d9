// The LayerNorm forward for narrow rows at any alignment, moved through flat tiles in shared memory.
//
//   fwd_flat_tpr{4,8,16,32,64,128}
//     A block takes a TILE of consecutive rows, which are one span of memory whatever the rows'
//     width: it is copied into shared memory (on Hopper one bulk copy, cp.async.bulk, by one
//     thread; before, cp.async in 16-byte packs), the next tile in flight while this one is
//     computed, the rows are computed there (kTpr threads a row, a lane's elements in registers,
//     as fwd_regs), y is written over x in place and leaves in whole packs (on Hopper one bulk
//     copy), an element at a time only in the tile's first and last packs (shared with the
//     neighbouring tiles). The *_regs and window variants move each row on its own: a row of 33
//     16-bit columns (66 bytes, 8 leads) is 2-byte accesses there (8x the instructions, 1/8 of the
//     bytes an access), or a window of 5-6 packs whose two ends are written an element at a time;
//     here it is 66 of the tile's 16,384 bytes. H100, 16M elements: 33 columns 72% of copy
//     bandwidth against 44% (bf16) and 79% against 70% (float32), 127 bf16 columns 74% against 59%
//     (bench/README.md, "Narrow rows through flat tiles"; 56% at 33 bf16 columns before a lane held
//     exactly its elements: "The flat forward's lanes without empty slots").
//
//     x's tile sits in shared memory at its own pack alignment (element e of the tile at e + off,
//     off its first element's offset in its 16 bytes), so x and y may each start anywhere in their
//     16 bytes: a y at x's offset leaves in whole packs from shared memory, one at another offset
//     is gathered an element at a time there (never in global memory: every global access is a
//     16-byte pack but the tile's two ends).
//
//     A persistent grid (as many blocks as run at once); a lane's columns (lane + j x kTpr) are
//     the same in every row, so gamma and beta are read once into its registers. In 16-bit a
//     lane's slots are tested against the width only where they can pass it (the last one:
//     sure_slots), and a warp's row-groups take rows 1 to 8 apart, as a bank model picks for the
//     width (flat_spacing_log2), so their shared-memory words fall on different banks; means and
//     rstds leave through shared memory with y. H100, 16M elements: 63 bf16 columns 62% -> 74% of
//     copy bandwidth, 127 74% -> 79% (bench/README.md, "Slots inside every row without a column
//     test"). Rows of up to
//     16 x kTpr columns (1 to 16 elements a lane, in 16-bit each count its own instantiation; 512
//     columns at kTpr 32), any dtype, any element-aligned pointers. kTpr 64 and 128: a row-group of
//     2 or 4 warps, their sums met in shared memory, for rows of 5 to 16 elements a lane (257 to
//     1,024 and 513 to 2,048 columns), where the window forward was at 63-71% of copy bandwidth in
//     16-bit (1,023 to 2,041 columns, H100). The same design for the backward (x and dy tiles, dx
//     over dy, dgamma/dbeta in registers) was measured and not kept: the best of it 53-76% of copy
//     bandwidth in 16-bit and 75-88% in float32, below the *_regs and window backward at every
//     width it takes (before the bulk copies: bench/experiments/layer_norm_flat_bwd_bulk.patch).
#include <algorithm>

#include <cuda/ptx>

#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_variants.h"
#include "kernels/layer_norm/layer_norm_window.cuh"

namespace hfnn::kernels::layer_norm {
namespace {

constexpr int kFlatBlock = 256;
// A tensor's tile: about this many bytes of rows (at least a row per row-group, at most
// kFlatMaxTileRows rows).
constexpr int kFlatTileBytes = 16 * 1024;
constexpr int64_t kFlatMaxTileRows = 1024;
constexpr int kFlatMaxPerLane = 16;
// Row-groups of several warps (kTpr 64 and 128) take rows of more than 4 elements a lane (8 in
// float32, powers of two there) and up to 16: rows the warp-wide groups hold at more elements a
// lane, or not at all (1,024 and 2,048 columns), with fewer instantiations than every count.
constexpr int flat_min_per_lane(int tpr, bool pow2) { return tpr <= 32 ? 1 : (pow2 ? 8 : 5); }

// Elements a lane holds of a row, 0 where more than 16: in 16-bit exactly what covers it (every
// count has its instantiation, kE), in float32 the smallest power of two that does. A lane's slots
// past the row are predicated-off instructions that still take issue slots: with only powers of
// two a 16-bit row of 33 columns at 4 lanes took 16 slots a lane for 9 elements, close to half its
// element-wise instructions spent on nothing, and the exact count made it 1.25-1.29x faster. In
// float32 the exact counts were 0.92-1.03x, 0.98x at 33 columns where this variant is the best
// (bench/README.md, "The flat forward's lanes without empty slots").
int flat_per_lane(int64_t cols, int tpr, int elem) {
  const int64_t need = (cols + tpr - 1) / tpr;
  if (need > kFlatMaxPerLane) return 0;
  int e = static_cast<int>(need);
  if (elem != 2) {
    e = 1;
    while (e < need) e *= 2;
  }
  return e >= flat_min_per_lane(tpr, elem != 2) ? e : 0;
}

struct FlatShape {
  int64_t tile_rows = 0, tiles = 0;
  int buf = 0;  // elements of one tensor's tile buffer: the tile and its offset, whole packs
};

FlatShape flat_shape(int64_t rows, int64_t cols, int elem, int tpr) {
  FlatShape s;
  const int64_t groups = kFlatBlock / tpr;
  int64_t r = kFlatTileBytes / (cols * elem);
  if (r < groups) r = groups;  // cols <= 16 x tpr keeps this within kFlatTileBytes
  if (r > kFlatMaxTileRows) r = kFlatMaxTileRows;
  if (r > rows) r = rows;
  s.tile_rows = r;
  s.tiles = (rows + r - 1) / r;
  const int vec = 16 / elem;
  s.buf = static_cast<int>((r * cols + vec - 1 + vec - 1) / vec * vec);
  return s;
}

// Starts copying elements [e0, e0 + n) of src into buf at their own pack alignment: element e at
// buf[e - e0 + row_lead<T>(src, e0)], whole packs by cp.async. The packs at the two ends hold
// other rows' elements (or bytes past the tensor inside the same 16 bytes, which a load cannot
// fault on: allocations are at least 256-byte aligned); they are never written back.
template <typename T>
__device__ __forceinline__ void issue_tile(T* buf, const T* src, int64_t e0, int n) {
  constexpr int kV = kVec<T, 16>;
  const int off = row_lead<T>(src, e0);
  const T* first = src + e0 - off;
  const int packs = (off + n + kV - 1) / kV;
  for (int k = threadIdx.x; k < packs; k += kFlatBlock) async_copy16(buf + k * kV, first + k * kV);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Hopper: a tile moves in one bulk copy each way (cp.async.bulk, the tensor memory accelerator's
// 1-D form) issued by one thread, where cp.async took a copy instruction a pack from every thread
// and the stores a load and a store a pack: with the per-pack address arithmetic, 35% of the
// kernel's instructions at 1,023 bf16 columns (Nsight Compute's source page, H100).
#define HFNN_FLAT_BULK 1

// issue_tile's bytes as one bulk copy, counted on `bar` (its expected bytes set here): one thread.
template <typename T>
__device__ __forceinline__ void issue_tile_bulk(T* buf, const T* src, int64_t e0, int n, uint64_t* bar) {
  constexpr int kV = kVec<T, 16>;
  const int off = row_lead<T>(src, e0);
  const uint32_t bytes = static_cast<uint32_t>((off + n + kV - 1) / kV) * 16u;
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             bar, bytes);
  // (The .shared::cluster form, PTX ISA 8.0: this block's own address in it; .shared::cta needs 8.6.)
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, buf, src + e0 - off, bytes, bar);
}

// store_tile where out's lead is buf's: the whole packs inside [e0, e0 + n) as one bulk copy
// issued by thread 0 (committed as a bulk group: it waits for it before the buffer is refilled), the
// first and last packs an element at a time by the other threads where they hold elements outside
// the range. Every thread's writes of buf are before a fence.proxy.async and a barrier.
template <typename T>
__device__ __forceinline__ void store_tile_bulk(T* out, int64_t e0, int n, const T* buf, int off) {
  constexpr int kV = kVec<T, 16>;
  T* first = out + e0 - off;
  const int packs = (off + n + kV - 1) / kV;
  const int k0 = off ? 1 : 0;                                  // the first whole pack
  const int k1 = (off + n) % kV ? packs - 1 : packs;           // past the last
  if (threadIdx.x == 0) {
    if (k1 > k0) {
      cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, first + k0 * kV, buf + k0 * kV,
                               static_cast<uint32_t>(k1 - k0) * 16u);
    }
    cuda::ptx::cp_async_bulk_commit_group();
  }
  // The end packs (at most two), an element a thread.
  const int t = static_cast<int>(threadIdx.x) - 32;  // warps 1 on: warp 0 holds the bulk copy's thread
  if (t >= 0 && t < 2 * kV) {
    const int k = t < kV ? 0 : packs - 1;
    const bool partial = t < kV ? off != 0 : (off + n) % kV != 0;
    const int e = k * kV + t % kV - off;  // the element, relative to e0
    if (partial && (t < kV || packs > 1 || off == 0) && e >= 0 && e < n) first[k * kV + t % kV] = buf[k * kV + t % kV];
  }
}
#endif

// Elements [e0, e0 + n) of out from buf (element e at buf[e - e0 + src_off]): whole 16-byte packs,
// the first and last an element at a time where they hold elements outside the range (the
// neighbouring tiles', written by other blocks).
template <typename T>
__device__ __forceinline__ void store_tile(T* out, int64_t e0, int n, const T* buf, int src_off) {
  constexpr int kV = kVec<T, 16>;
  const int off = row_lead<T>(out, e0);
  T* first = out + e0 - off;
  const int packs = (off + n + kV - 1) / kV;
  for (int k = threadIdx.x; k < packs; k += kFlatBlock) {
    const int s0 = k * kV - off;  // the pack's first element, relative to e0
    if (s0 >= 0 && s0 + kV <= n) {
      uint4 v;
      if (off == src_off) {
        v = reinterpret_cast<const uint4*>(buf)[k];
      } else {
        T e[kV];
#pragma unroll
        for (int i = 0; i < kV; ++i) e[i] = buf[src_off + s0 + i];
        memcpy(&v, e, 16);
      }
      store_global16(first + k * kV, v);
    } else {
#pragma unroll
      for (int i = 0; i < kV; ++i)
        if (s0 + i >= 0 && s0 + i < n) first[k * kV + i] = buf[src_off + s0 + i];
    }
  }
}

// A tile's place: its first row, rows, first element and elements.
struct Tile {
  int64_t row0, e0;
  int rows, n;
  __device__ __forceinline__ Tile(int64_t tile, int64_t tile_rows, int64_t rows_total, int cols) {
    row0 = tile * tile_rows;
    rows = static_cast<int>(rows_total - row0 < tile_rows ? rows_total - row0 : tile_rows);
    e0 = row0 * cols;
    n = rows * cols;
  }
};

// ---- forward ---------------------------------------------------------------------------------------

// The spacing (log2, 0 to 3) at which a warp's row-groups take their rows: the groups' elements of
// one slot are one shared-memory load (and store) instruction, served once per distinct 4-byte word
// on its busiest bank, and rows of `cols` elements start at cols x elem bytes from each other. A
// model, not a measurement: for each spacing, summed over the slots and over the tile's eight (four)
// possible leads, the most distinct words on one bank; the smallest sum wins, ties to the smaller
// spacing. bf16, 63 columns at 4 lanes a row: 4.9 words a bank on consecutive rows, 1.0 on rows 8
// apart; 36 columns at 4 lanes: 1.5 consecutive, 4.0 at 8 apart. A miss costs up to about 300K
// integer operations (0.1-0.3 ms), so the last 64 shapes a thread saw are remembered.
int flat_spacing_log2(int64_t cols, int tpr, int elem) {
  const int groups = 32 / tpr;
  // float32 keeps consecutive rows, as measured; a row-group of a warp or more has nothing to space.
  if (groups <= 1 || elem != 2) return 0;
  struct Entry { int64_t cols; int tpr, spacing; };  // 16-bit alone gets here
  thread_local Entry seen[64] = {};
  thread_local int next = 0;
  for (const Entry& e : seen)
    if (e.cols == cols && e.tpr == tpr) return e.spacing;
  const int slots = flat_per_lane(cols, tpr, elem);
  int best = 0;
  int64_t best_cost = -1;
  for (int s = 0; s < 4; ++s) {
    int64_t cost = 0;
    for (int lead = 0; lead < 16 / elem; ++lead) {
      for (int j = 0; j < slots; ++j) {
        int64_t words[32];
        int n = 0;
        for (int g = 0; g < groups; ++g)
          for (int lane = 0; lane < tpr; ++lane) {
            const int64_t c = lane + static_cast<int64_t>(j) * tpr;
            if (c >= cols) continue;
            const int64_t w = ((lead + (static_cast<int64_t>(g) << s) * cols + c) * elem) / 4;
            bool dup = false;
            for (int k = 0; k < n && !dup; ++k) dup = words[k] == w;
            if (!dup) words[n++] = w;
          }
        int per_bank[32] = {};
        int most = 0;
        for (int k = 0; k < n; ++k) most = std::max(most, ++per_bank[words[k] % 32]);
        cost += most;
      }
    }
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  seen[next] = {cols, tpr, best};
  next = (next + 1) % 64;
  return best;
}

// Dynamic shared memory: two tile buffers (the tile being computed and the next one arriving), then
// the tile's means and rstds, then (Hopper's bulk copies) a buffer's mbarrier each.
std::size_t flat_fwd_smem(const FlatShape& s, int elem) {
  return 2 * static_cast<std::size_t>(s.buf) * elem + 2 * static_cast<std::size_t>(s.tile_rows) * sizeof(float) +
         2 * sizeof(uint64_t);
}

// Registers: 4 blocks an SM (64) up to 4 elements a lane, 3 (80) up to 8, 2 above.
constexpr int fwd_flat_min_blocks(int e) { return e <= 4 ? 4 : (e <= 8 ? 3 : 2); }

// The named barrier of a row-group of several warps (1 + its index: 0 is __syncthreads').
__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// spacing_log2: a warp's row-groups take rows 2^s apart (s = 0: consecutive rows), so that their
// rows' shared-memory words fall on different banks (flat_spacing_log2).
// kTpr 64 or 128: a row-group of 2 or 4 warps, their sums met in shared memory behind the group's
// own named barrier (the groups run their rows apart).
template <typename T, int kTpr, int kE>
__global__ void __launch_bounds__(kFlatBlock, fwd_flat_min_blocks(kE))
    fwd_flat_kernel(const FwdParams p, int64_t tile_rows, int64_t tiles, int buf_elems, int spacing_log2) {
  extern __shared__ float4 flat_smem[];
  constexpr int kGroups = kFlatBlock / kTpr;
  constexpr bool kWarps = kTpr > 32;
  constexpr int kGroupsPerWarp = kWarps ? 1 : 32 / kTpr;
  constexpr int kWarpsPerGroup = kWarps ? kTpr / 32 : 1;
  // A lane's slots j < kSure are inside every row (sure_slots): no column test. float32 keeps the
  // tests (and consecutive rows: flat_spacing_log2), as measured faster there (0.98-0.99x without).
  constexpr int kSure = sizeof(T) == 2 ? sure_slots(kE, true) : 0;
  const int cols = static_cast<int>(p.cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  T* const bufs = reinterpret_cast<T*>(flat_smem);
  // The tile's means and rstds: written by row here, leaving with y in consecutive stores (a warp's
  // groups take rows 2^s apart, and their own stores would touch a 32-byte sector each).
  float* const stats = reinterpret_cast<float*>(bufs + 2 * buf_elems);
  const int lane = threadIdx.x % kTpr;
  const int warp = threadIdx.x / 32;
  const int group_in_warp = (threadIdx.x % 32) / kTpr;
  // The warps fall into chunks of 2^s; a chunk takes kGroupsPerWarp x 2^s consecutive rows of each
  // kGroups, its warp w the rows at w mod 2^s, every 2^s: a bijection onto the kGroups rows.
  const int spacing = 1 << spacing_log2;
  const int warp_first = kWarps ? warp / kWarpsPerGroup
                                : (warp >> spacing_log2) * (kGroupsPerWarp << spacing_log2) + (warp & (spacing - 1));
  const int group_offset = group_in_warp << spacing_log2;
  auto inside = [&](int j) { return j < kSure || lane + j * kTpr < cols; };
  // A row's total over its group: shuffles within a warp, then (kWarps) the warps' partials through
  // shared memory, one array for the sums and one for the squares. One barrier a total is enough: a
  // warp writes a sum again only after passing the squares' barrier, which its group's other warps
  // reach once they have read the sums (and the same for the squares, a row later).
  __shared__ float partials[2][kWarps ? kFlatBlock / 32 : 1];
  auto row_total = [&](float v, int which) -> float {
    if constexpr (!kWarps) {
      return group_sum<kTpr>(v);
    } else {
      v = group_sum<32>(v);
      if (threadIdx.x % 32 == 0) partials[which][warp] = v;
      group_barrier(1 + warp_first, kTpr);
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < kWarpsPerGroup; ++w) t += partials[which][warp_first * kWarpsPerGroup + w];
      return t;
    }
  };
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ y = static_cast<T*>(p.y);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const T* __restrict__ beta = static_cast<const T*>(p.beta);
#ifdef HFNN_FLAT_BULK
  // A buffer's mbarrier counts its tile's bytes; the k-th tile into it completes phase k.
  uint64_t* const bars = reinterpret_cast<uint64_t*>(stats + 2 * tile_rows);
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(bars, 1);
    cuda::ptx::mbarrier_init(bars + 1, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
#endif
  wait_for_previous_grid();
  allow_next_grid();
  int64_t tile = blockIdx.x;
#ifdef HFNN_FLAT_BULK
  if (tile < tiles && threadIdx.x == 0) {
    const Tile t(tile, tile_rows, p.rows, cols);
    issue_tile_bulk(bufs, x, t.e0, t.n, bars);
  }
#else
  if (tile < tiles) {
    const Tile t(tile, tile_rows, p.rows, cols);
    issue_tile(bufs, x, t.e0, t.n);
  }
  async_commit();
#endif
  // A lane's columns are the same in every row: gamma and beta in registers, read once.
  float gr[kE], br[kE];
#pragma unroll
  for (int j = 0; j < kE; ++j) {
    const int c = lane + j * kTpr;
    gr[j] = c < cols && gamma ? to_float(gamma[c]) : 1.f;
    br[j] = c < cols && beta ? to_float(beta[c]) : 0.f;
  }
  for (int it = 0; tile < tiles; tile += gridDim.x, ++it) {
    T* const buf = bufs + (it & 1) * buf_elems;
#ifdef HFNN_FLAT_BULK
    // The next tile into the other buffer, whose last tile's bulk store has read it (the rest of
    // its readers were done at the last iteration's final barrier).
    if (threadIdx.x == 0 && tile + gridDim.x < tiles) {
      const Tile t(tile + gridDim.x, tile_rows, p.rows, cols);
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>());
      issue_tile_bulk(bufs + ((it + 1) & 1) * buf_elems, x, t.e0, t.n, bars + ((it + 1) & 1));
    }
    while (!cuda::ptx::mbarrier_try_wait_parity(bars + (it & 1), static_cast<uint32_t>((it >> 1) & 1))) {
    }
#else
    if (tile + gridDim.x < tiles) {  // the next tile into the other buffer, in flight through this one
      const Tile t(tile + gridDim.x, tile_rows, p.rows, cols);
      issue_tile(bufs + ((it + 1) & 1) * buf_elems, x, t.e0, t.n);
    }
    async_commit();
    async_wait<1>();
    __syncthreads();  // the tile in shared memory
#endif
    const Tile t(tile, tile_rows, p.rows, cols);
    const int off = row_lead<T>(x, t.e0);
    // Whole warps iterate together (the bound is the warp's first row-group's row), so every
    // shuffle sees all 32 lanes. A group past the tile's rows computes on its last row (no test an
    // element) and stores nothing: it may read that row while the group that owns it writes y over
    // it, and throws what it read away (a race by the letter, which racecheck would report; harmless).
    for (int r0 = warp_first; r0 < t.rows; r0 += kGroups) {
      const int r = r0 + group_offset;
      const bool valid = r < t.rows;
      T* row = buf + off + (valid ? r : t.rows - 1) * cols;
      float v[kE];
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kE; ++j) {
        v[j] = inside(j) ? to_float(row[lane + j * kTpr]) : 0.f;
        sum += v[j];
      }
      const float mean = row_total(sum, 0) * inv_cols;
      float sq = 0.f;
#pragma unroll
      for (int j = 0; j < kE; ++j) {
        const float d = inside(j) ? v[j] - mean : 0.f;
        sq += d * d;
      }
      const float rstd = rsqrtf(row_total(sq, 1) * inv_cols + p.eps);
      if (!valid) continue;
#pragma unroll
      for (int j = 0; j < kE; ++j) {
        // (x - mean) * rstd, not the fma x * rstd - mean * rstd: that cancels where |mean| >> std.
        if (inside(j)) row[lane + j * kTpr] = from_float<T>(fmaf((v[j] - mean) * rstd, gr[j], br[j]));
      }
      if (lane == 0) {
        stats[r] = mean;
        stats[tile_rows + r] = rstd;
      }
    }
#ifdef HFNN_FLAT_BULK
    const bool bulk = row_lead<T>(y, t.e0) == off;
    if (bulk) cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // this thread's rows, for the bulk store
    __syncthreads();  // every row of the tile written
    if (bulk) store_tile_bulk(y, t.e0, t.n, buf, off);
    else store_tile(y, t.e0, t.n, buf, off);
#else
    __syncthreads();  // every row of the tile written
    store_tile(y, t.e0, t.n, buf, off);
#endif
    if (p.mean) {
      for (int r = threadIdx.x; r < t.rows; r += kFlatBlock) {
        p.mean[t.row0 + r] = stats[r];
        p.rstd[t.row0 + r] = stats[tile_rows + r];
      }
    }
#ifdef HFNN_FLAT_BULK
    // The next bulk copy into this buffer (the async proxy) after this iteration's reads and writes
    // of it (the generic proxy: the rows, the edge and gathered stores).
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
#endif
    __syncthreads();  // the next iteration's copies overwrite what the stores read
  }
#ifdef HFNN_FLAT_BULK
  // The last bulk store done before the block's shared memory goes.
  if (threadIdx.x == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>());
#endif
}

// ---- host ------------------------------------------------------------------------------------------

// Calls f.template operator()<kE>() for e in kE .. kFlatMaxPerLane, or with kPow2 for e a power of
// two (16 for any other e: never reached, the callers check flat_rows_ok first). kPow2 (float32)
// instantiates the powers of two alone.
template <bool kPow2, int kE, typename F>
auto with_per_lane(int e, F&& f) {
  if constexpr (kE < kFlatMaxPerLane) {
    if (e != kE) return with_per_lane<kPow2, kPow2 ? 2 * kE : kE + 1>(e, f);
  }
  return f.template operator()<kE>();
}

// Calls f.template operator()<T, kE>() for the dtype and the elements a lane holds (the caller
// has checked that kTpr's 16 cover the row: flat_rows_ok).
template <int kTpr, typename F>
auto dispatch_flat(DType dtype, int64_t cols, F&& f) {
  const int e = flat_per_lane(cols, kTpr, static_cast<int>(dtype_size(dtype)));
  return dispatch_dtype(dtype, [&]<typename T>() {
    constexpr bool kPow2 = sizeof(T) != 2;
    return with_per_lane<kPow2, flat_min_per_lane(kTpr, kPow2)>(
        e, [&]<int kE>() { return f.template operator()<T, kE>(); });
  });
}

bool flat_rows_ok(int64_t rows, int64_t cols, int tpr, int elem, std::initializer_list<const void*> pointers) {
  return rows > 0 && cols > 0 && flat_per_lane(cols, tpr, elem) > 0 && elem_aligned(pointers, elem);
}

// Blocks of kKernel resident at once over the device at `smem` bytes, remembered per kernel,
// size and device: the occupancy query costs microseconds, and one cache for every kernel would ask
// it again on every call where widths alternate.
template <auto kKernel>
int64_t flat_resident(std::size_t smem, const DeviceInfo& device) {
  thread_local std::size_t cached_smem = 0;
  thread_local int cached_device = -2;
  thread_local int64_t cached = 1;
  if (cached_smem != smem || cached_device != device.device) {
    if (allow_smem(kKernel, smem) != cudaSuccess) (void)cudaGetLastError();
    cached = resident_blocks(kKernel, kFlatBlock, smem, device.sm_count);
    cached_smem = smem;
    cached_device = device.device;
  }
  return cached;
}

}  // namespace

template <int kTpr>
bool fwd_flat_supports(const FwdParams& p) {
  const int elem = static_cast<int>(dtype_size(p.dtype));
  if (!flat_rows_ok(p.rows, p.cols, kTpr, elem, {p.x, p.y, p.gamma, p.beta})) return false;
  const FlatShape s = flat_shape(p.rows, p.cols, elem, kTpr);
  return dispatch_flat<kTpr>(p.dtype, p.cols, [&]<typename T, int kE>() {
    return fits(fwd_flat_kernel<T, kTpr, kE>, kFlatBlock, flat_fwd_smem(s, elem), p.device);
  });
}

template <int kTpr>
cudaError_t fwd_flat_run(const FwdParams& p, cudaStream_t stream) {
  const int elem = static_cast<int>(dtype_size(p.dtype));
  const FlatShape s = flat_shape(p.rows, p.cols, elem, kTpr);
  const std::size_t smem = flat_fwd_smem(s, elem);
  return dispatch_flat<kTpr>(p.dtype, p.cols, [&]<typename T, int kE>() {
    auto kernel = fwd_flat_kernel<T, kTpr, kE>;
    const int64_t resident = flat_resident<&fwd_flat_kernel<T, kTpr, kE>>(smem, p.device);
    const int grid = static_cast<int>(s.tiles < resident ? s.tiles : resident);
    if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
    return launch_pdl(kernel, grid, kFlatBlock, smem, stream, p, s.tile_rows, s.tiles, s.buf,
                      flat_spacing_log2(p.cols, kTpr, elem));
  });
}

#define HFNN_FLAT(TPR)                                                           \
  template bool fwd_flat_supports<TPR>(const FwdParams&);                        \
  template cudaError_t fwd_flat_run<TPR>(const FwdParams&, cudaStream_t);
HFNN_FLAT(4)
HFNN_FLAT(8)
HFNN_FLAT(16)
HFNN_FLAT(32)
HFNN_FLAT(64)
HFNN_FLAT(128)
#undef HFNN_FLAT

}  // namespace hfnn::kernels::layer_norm
