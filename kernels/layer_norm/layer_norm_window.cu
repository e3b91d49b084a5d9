// LayerNorm variants for rows that are not 16-byte aligned: odd widths in 16-bit, widths that are no
// multiple of 4 in float32, tensors that start inside their storage.
//
//   fwd_win_tpr{4,8,16,32}, bwd_win_tpr{4,8,16,32}, bwd_win_tpr{4,8,16,32}_smem
//     The row-register variants' layout (kTpr threads a row, the row in registers, 1 to 6 or 8
//     packs a lane (9 or 10 in the float32 forward), a persistent grid, dgamma/dbeta summed in
//     registers over the rows a thread visits; in shared memory in the _smem variants), but every
//     access 16 bytes wide whatever the row's alignment: a row is read through its WINDOW, the
//     16-byte-aligned span that covers it. The window starts `lead` elements before the row (0 to 7
//     in 16-bit, 0 to 3 in float32); window position q is column q - lead. The packs at the
//     window's two ends hold elements of the neighbouring rows (or bytes past the tensor inside the
//     same 16 bytes, which a load cannot fault on: allocations are at least 256-byte aligned); they
//     are zeroed on loading, and written back an element at a time, so no other row's element is
//     ever stored.
//
//     The lead of row r is (the first element's offset in its 16 bytes + r * cols) mod V (V elements a
//     pack), so it repeats every `period` rows (V / gcd(cols mod V, V): 8 for odd widths in 16-bit).
//     Each block takes the rows of one residue class mod period: all its rows have the same lead,
//     so a thread always holds the same columns at the same window positions, gamma (and beta) are
//     staged once per block in shared memory by window position, and the dgamma/dbeta sums stay in
//     registers as in bwd_regs (in shared memory, by thread, in the _smem variants). The fold maps
//     positions back to columns when it writes the block's partial row; reduce_partials
//     (layer_norm_bwd.cu) sums those in a fixed order as for the others.
//
//     The other tensors (y; dy and dx) are read and written through the same window when they start
//     at the same offset in their 16 bytes as x (fresh allocations all do); otherwise an element at
//     a time (a slow but correct path: supports() may not depend on where torch put dx).
//
//     The row-register variants take unaligned rows too, with accesses only as wide as the rows
//     allow (2 bytes for odd widths in 16-bit: 8x the instructions and 1/8 the bytes an access), and
//     up to 256-1,024 columns; past that the block variants (one block a row) take them. These say
//     yes only to rows that are not all 16-byte aligned (aligned rows: the *_regs variants, the same
//     code with lead 0), up to kTpr x 8 packs a row less one pack's lead (x 10 in the float32
//     forward).
#include <algorithm>

#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_param_sums.cuh"
#include "kernels/layer_norm/layer_norm_variants.h"
#include "kernels/layer_norm/layer_norm_window.cuh"

namespace hfnn::kernels::layer_norm {
namespace {

constexpr int kFwdBlock = 128;
constexpr int kBwdBlock = 256;

// Packs a lane holds a row in, for a row of `cols` that may start up to V - 1 elements into its
// window: the smallest of 1 to 6 and 8; 0 where 8 are not enough. Not only powers of two: a row of
// 1,023 or 1,025 columns in 16-bit spans 129 or 130 packs of its window, 5 a lane at tpr32, where
// the powers of two gave it 8 (forward: 127 registers a thread instead of 88, half the resident
// warps; backward: half its packs and sums idle).
// `wide`: also 9 or 10 (the float32 forward, every tpr: at tpr32 rows of 1,022 to 1,277 columns,
// which 8 packs of 4 do not cover and fwd_block took at 58% of copy bandwidth against
// torch.compile's 71%).
int window_accesses(int64_t cols, int vec, int tpr, bool wide = false) {
  const int64_t per = static_cast<int64_t>(vec) * tpr;
  const int64_t need = (cols + vec - 1 + per - 1) / per;
  if (need <= 6) return static_cast<int>(need);
  if (need <= 8) return 8;
  return wide && need <= 10 ? static_cast<int>(need) : 0;
}
// The fewest packs a lane of the rows window_accesses gives `nv` (7 for 8, which also takes 7).
constexpr int window_fewest(int nv) { return nv == 8 ? 7 : nv; }

// The lead of the rows of residue class `cls` (header comment): row cls's.
template <typename T>
__device__ __forceinline__ int window_lead(const void* x, int64_t cols, int cls) {
  return row_lead<T>(x, static_cast<int64_t>(cls) * cols);
}

// gamma (or 1) and beta (or 0) by window position into shared memory as S (float, or T as loaded:
// exact either way), 0 outside the row. The forward's; the backward stages gamma as floats in
// load_staged's layout (bwd_window_kernel).
template <typename T, typename S>
__device__ __forceinline__ void stage_params(const T* gamma, const T* beta, S* gw, S* bw, int positions, int lead,
                                             int cols) {
  for (int q = threadIdx.x; q < positions; q += blockDim.x) {
    const int c = q - lead;
    const bool in = c >= 0 && c < cols;
    gw[q] = from_float<S>(in ? (gamma ? to_float(gamma[c]) : 1.f) : 0.f);
    if (bw) bw[q] = from_float<S>(in && beta ? to_float(beta[c]) : 0.f);
  }
}

// The residue class of this block's rows and the blocks that share it: the grid is `period` x
// blocks_per_class, class = blockIdx.x mod period.
struct ClassRows {
  int cls;
  int64_t block, blocks, rows;  // this block's index in its class, the class's blocks and rows
};

__device__ __forceinline__ ClassRows class_rows(int64_t rows, int period) {
  ClassRows c;
  c.cls = static_cast<int>(blockIdx.x % period);
  c.block = blockIdx.x / period;
  c.blocks = gridDim.x / period;
  c.rows = rows > c.cls ? (rows - c.cls + period - 1) / period : 0;
  return c;
}

// ---- forward ---------------------------------------------------------------------------------------

// Resident blocks the forward asks the compiler for: up to 32 elements a thread as many as fwd_regs
// gets from its registers for as many elements (the window's masks otherwise take it to 118-128
// registers in 16-bit); 5 at 40 and 48 elements (5 or 6 packs of 16-bit: 88-95 registers, no
// spill), which fwd_regs, in powers of two, never holds.
constexpr int fwd_window_min_blocks(int elements) { return elements <= 32 ? 8 : (elements <= 48 ? 5 : 4); }

// Slots (a lane's packs: slot i of lane l is pack i x kTpr + l of the window) that lie inside the
// row whatever its lead and width: a row takes the fewest slots a lane that cover its window
// (window_accesses; at least window_fewest(kNv)), so the window's end is past slot
// window_fewest(kNv) - 3's packs, and its lead (under a pack) before slot 1's. Those slots skip
// the masks and the end tests: the bf16 kernel at 5 packs a lane (D = 1,023) 1,760 -> 1,488 SASS
// instructions; H100, 16M elements, same machine twice: fwd_win_tpr32 1.03-1.06x at 1,023-2,041
// 16-bit columns, tpr16 1.06-1.10x at 511-767, 0.95-0.99x at 767 for tpr32, not the best there
// (bench/README.md, "The window forward's slots inside every row").
// 16-bit only: float32's kernels at 6 and 8 packs a lane, under their cap of 64 registers, took
// 44-48 bytes of spill without the tests (8 before).
template <typename T, int kNv>
__device__ __forceinline__ constexpr bool sure_window_slot(int i) {
  return sizeof(T) == 2 && i >= 1 && i <= window_fewest(kNv) - 3;
}

template <typename T, int kTpr, int kNv>
__global__ void __launch_bounds__(kFwdBlock, fwd_window_min_blocks(kNv * kVec<T, 16>)) fwd_window_kernel(const FwdParams p, int period, bool vector) {
  extern __shared__ float4 fwd_smem[];
  constexpr int kV = kVec<T, 16>;
  constexpr int kPositions = kNv * kTpr * kV;
  constexpr int kGroupsPerBlock = kFwdBlock / kTpr;
  constexpr int kGroupsPerWarp = 32 / kTpr;
  // gamma and beta as T: a pack of each is one 16-byte load and kV / 2 registers (as float, twice
  // that, and the loads the compiler hoists above the row's reductions held 50 more registers in bf16).
  T* gw = reinterpret_cast<T*>(fwd_smem);
  T* bw = gw + kPositions;
  const int lane = threadIdx.x % kTpr;
  const int warp = threadIdx.x / 32;
  const int group_in_warp = (threadIdx.x % 32) / kTpr;
  const int cols = static_cast<int>(p.cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const ClassRows cr = class_rows(p.rows, period);
  const int lead = window_lead<T>(p.x, cols, cr.cls);
  const int end = lead + cols;
  wait_for_previous_grid();
  allow_next_grid();
  stage_params(static_cast<const T*>(p.gamma), static_cast<const T*>(p.beta), gw, bw, kPositions, lead, cols);
  __syncthreads();

  // Whole warps iterate together (the loop bound is the warp's first row) so every shuffle sees
  // all 32 lanes; groups past the class's last row compute on zeros and store nothing.
  const int64_t stride = cr.blocks * kGroupsPerBlock;
  for (int64_t v0 = cr.block * kGroupsPerBlock + warp * kGroupsPerWarp; v0 < cr.rows; v0 += stride) {
    const int64_t v = v0 + group_in_warp;
    const bool valid = v < cr.rows;
    const int64_t start = (cr.cls + v * period) * cols - lead;  // the window's first element
    const T* __restrict__ x = static_cast<const T*>(p.x) + start;
    // Every load issued before the first mask (load_window_raw).
    Pack<T, 16> raw[kNv];
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int pos = (i * kTpr + lane) * kV;
      raw[i] = valid && (sure_window_slot<T, kNv>(i) || pos < end) ? load_window_raw<T>(x, pos, lead, end, true)
                                                                  : zero_pack<T, 16>();
    }
    float val[kNv][kV];
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      if (!sure_window_slot<T, kNv>(i)) mask_window(raw[i], (i * kTpr + lane) * kV, lead, end);
      unpack(raw[i], val[i]);
    }
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kNv; ++i)
#pragma unroll
      for (int k = 0; k < kV; ++k) sum += val[i][k];
    const float mean = group_sum<kTpr>(sum) * inv_cols;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int pos = (i * kTpr + lane) * kV;
      if (!sure_window_slot<T, kNv>(i) && pos >= end) continue;
      const bool whole = sure_window_slot<T, kNv>(i) || (pos >= lead && pos + kV <= end);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float d = val[i][k] - mean;
        if (whole || (pos + k >= lead && pos + k < end)) sq += d * d;
      }
    }
    const float rstd = rsqrtf(group_sum<kTpr>(sq) * inv_cols + p.eps);
    if (!valid) continue;
    T* __restrict__ y = static_cast<T*>(p.y) + start;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int pos = (i * kTpr + lane) * kV;
      if (!sure_window_slot<T, kNv>(i) && pos >= end) continue;
      float g[kV], b[kV], out[kV];
      unpack(load_pack<T, 16>(gw + pos), g);
      unpack(load_pack<T, 16>(bw + pos), b);
      // (x - mean) * rstd, not the fma x * rstd - mean * rstd: that cancels where |mean| >> std.
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] = fmaf((val[i][k] - mean) * rstd, g[k], b[k]);
      if (sure_window_slot<T, kNv>(i) && vector) store_global16(y + pos, pack<T, 16>(out).raw);
      else store_window<T>(y, pos, lead, end, vector, out);
    }
    if (lane == 0 && p.mean) {
      const int64_t row = cr.cls + v * period;
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

template <typename T, int kTpr, int kNv>
std::size_t fwd_window_smem() {
  return 2 * static_cast<std::size_t>(kNv * kTpr * kVec<T, 16>) * sizeof(T);
}

// Calls f.template operator()<T, kNv>() for the instantiation that fits the row; `none` where none
// does (supports() said no). kFp32Wide: float32 rows may take 9 or 10 packs a lane (the forward).
template <int kTpr, bool kFp32Wide = false, typename R, typename F>
R with_window(DType dtype, int64_t cols, R none, F&& f) {
  return dispatch_dtype(dtype, [&]<typename T>() -> R {
    constexpr bool kWide = kFp32Wide && sizeof(T) == 4;
    if constexpr (kWide) {
      switch (window_accesses(cols, kVec<T, 16>, kTpr, true)) {
        case 9: return f.template operator()<T, 9>();
        case 10: return f.template operator()<T, 10>();
      }
    }
    switch (window_accesses(cols, kVec<T, 16>, kTpr)) {
      case 1: return f.template operator()<T, 1>();
      case 2: return f.template operator()<T, 2>();
      case 3: return f.template operator()<T, 3>();
      case 4: return f.template operator()<T, 4>();
      case 5: return f.template operator()<T, 5>();
      case 6: return f.template operator()<T, 6>();
      case 8: return f.template operator()<T, 8>();
    }
    return none;
  });
}

// Blocks of kKernel resident at once on the device, asked once a thread and device (the query
// costs microseconds of CPU a call otherwise).
template <auto kKernel>
int64_t resident(int threads, std::size_t smem, const DeviceInfo& device) {
  thread_local int cached_device = -2;
  thread_local int64_t cached = 1;
  if (cached_device != device.device) {
    if (allow_smem(kKernel, smem) != cudaSuccess) (void)cudaGetLastError();
    cached = resident_blocks(kKernel, threads, smem, device.sm_count);
    cached_device = device.device;
  }
  return cached;
}

// The persistent grid: `period` classes x the blocks each gets, at most what is resident at once
// (and at most `cap` blocks in all: the backward's workspace). 0 where not even one block a class
// fits the cap.
inline int64_t window_grid(int64_t resident_blocks, int64_t rows, int period, int64_t groups_per_block,
                           int64_t cap) {
  const int64_t class_rows = (rows + period - 1) / period;
  const int64_t needed = (class_rows + groups_per_block - 1) / groups_per_block;
  int64_t per_class = std::min(needed, std::max<int64_t>(1, resident_blocks / period));
  per_class = std::min(per_class, cap / period);
  return per_class < 1 ? 0 : per_class * period;
}

}  // namespace

template <int kTpr>
bool fwd_window_supports(const FwdParams& p) {
  if (!(p.rows > 0 && p.cols > 0)) return false;
  const int elem = static_cast<int>(dtype_size(p.dtype));
  if (!elem_aligned({p.x, p.y, p.gamma, p.beta}, elem)) return false;
  if (access_bytes(p.cols, elem, {p.x, p.y, p.gamma, p.beta}) == 16) return false;  // the *_regs variants
  return with_window<kTpr, true>(p.dtype, p.cols, false, [&]<typename T, int kNv>() -> bool {
    return fits(fwd_window_kernel<T, kTpr, kNv>, kFwdBlock, fwd_window_smem<T, kTpr, kNv>(), p.device);
  });
}

template <int kTpr>
cudaError_t fwd_window_run(const FwdParams& p, cudaStream_t stream) {
  return with_window<kTpr, true>(p.dtype, p.cols, cudaErrorInvalidValue, [&]<typename T, int kNv>() -> cudaError_t {
    constexpr auto kernel = fwd_window_kernel<T, kTpr, kNv>;
    const std::size_t smem = fwd_window_smem<T, kTpr, kNv>();
    if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
    const int period = window_period(p.cols, kVec<T, 16>);
    const int64_t grid = window_grid(resident<kernel>(kFwdBlock, smem, p.device), p.rows, period, kFwdBlock / kTpr,
                                     int64_t{1} << 30);
    if (grid < 1) return cudaErrorInvalidValue;
    return launch_pdl(kernel, static_cast<unsigned>(grid), kFwdBlock, smem, stream, p, period, same_lead(p.x, {p.y}));
  });
}

// ---- backward --------------------------------------------------------------------------------------

namespace {

// As bwd_regs (layer_norm_bwd.cu): slices of up to 8 elements ask for 3 resident blocks, larger ones
// are left unbounded; slices of up to 32 elements load the next row before this one's arithmetic.
constexpr int window_min_blocks(int elements) { return elements <= 8 ? 3 : 1; }
constexpr bool window_prefetch(int elements) { return elements <= 32; }

// bwd_win_tpr*_smem: each thread's dgamma/dbeta sums in shared memory instead of registers, as in
// bwd_wide_c*_smem, in blocks of 128 threads asking for as many resident as their shared memory
// allows, at most 4 (bwd_window_smem_blocks: 128 registers a thread, 3 blocks for 16-bit at 8
// packs). In
// registers the sums are 2 floats an element, and the kernel took 144-178 registers at 16 to 32
// elements a lane and 254 at 64 (8 packs of bf16): one block of 8 warps an SM (Nsight Compute, H200,
// 16,400 x 1,023 bf16 with 8 packs a lane: 12% achieved occupancy, DRAM at 35%). Measured against
// each other (H200, same machine): shared memory 1.1-1.27x faster at 16M elements where a lane holds
// 3 to 5 packs, registers 1.2-1.3x faster at 6 and 8 packs and at 1M elements almost everywhere
// (the larger grid's partial rows). Both are variants; the data picks. The _smem variants take only
// rows of more than 8 elements a lane (below that the sums fit registers and the plain variant runs).
template <typename T, int kNv, bool kSmemSums>
constexpr int bwd_window_block() { return kSmemSums ? 128 : kBwdBlock; }
// The _smem variants ask for as many blocks as their shared memory lets reside, at most 4: at 8
// packs of 16-bit (72 KB a block) 3, so the compiler may use 168 registers instead of spilling at
// 128 for a fourth block that could never be resident (review of 607811b).
template <typename T, int kNv>
constexpr int bwd_window_smem_blocks() {
  constexpr int kV = kVec<T, 16>, kPositionsMax = kNv * 32 * kV;  // tpr32's, the largest
  constexpr int bytes = (kPositionsMax + 2 * kNv * kV * 128) * 4 + 1024;  // + the runtime's reserve
  constexpr int fit = 227 * 1024 / bytes;
  return fit < 1 ? 1 : (fit > 4 ? 4 : fit);
}
template <typename T, int kNv, bool kSmemSums>
constexpr int bwd_window_min_blocks() {
  return kSmemSums ? bwd_window_smem_blocks<T, kNv>() : window_min_blocks(kNv * kVec<T, 16>);
}
template <typename T, int kNv>
constexpr bool bwd_window_smem_takes() { return kNv * kVec<T, 16> > 8; }

template <typename T, int kTpr, int kNv, bool kSmemSums>
__global__ void __launch_bounds__(bwd_window_block<T, kNv, kSmemSums>(), bwd_window_min_blocks<T, kNv, kSmemSums>())
    bwd_window_kernel(const BwdParams p, int period, bool vector) {
  extern __shared__ float4 bwd_smem[];
  constexpr int kV = kVec<T, 16>;
  constexpr int kBlock = bwd_window_block<T, kNv, kSmemSums>();
  constexpr int kWarps = kBlock / 32;
  constexpr int kQ = kV / 4;  // float4s of a pack's dgamma (and of its dbeta)
  constexpr int kPositions = kNv * kTpr * kV;
  constexpr int kGroupsPerBlock = kBlock / kTpr;
  constexpr int kGroupsPerWarp = 32 / kTpr;
  constexpr bool kHoldGamma = kNv * kV <= 16;
  float* gw = reinterpret_cast<float*>(bwd_smem);  // [kPositions]
  // kSmemSums: this thread's float4 j of pack i's sums (dgamma's at j < kQ, dbeta's at kQ + j),
  // [2 kNv kQ][kBlock] (a warp's float4s contiguous: no bank conflicts); otherwise the fold's rows,
  // [kWarps][kPositions].
  float* fold = gw + kPositions;
  float4* const sums = reinterpret_cast<float4*>(fold) + threadIdx.x;
  auto slot = [&](int i, int j) -> float4& { return sums[(i * 2 * kQ + j) * kBlock]; };
  const int lane = threadIdx.x % kTpr;
  const int warp = threadIdx.x / 32;
  const int group_in_warp = (threadIdx.x % 32) / kTpr;
  const int cols = static_cast<int>(p.cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const ClassRows cr = class_rows(p.rows, period);
  const int lead = window_lead<T>(p.x, cols, cr.cls);
  const int end = lead + cols;
  const bool want_params = p.dgamma || p.dbeta;
  wait_for_previous_grid();
  allow_next_grid();  // the partials' reduction may be scheduled; it waits for this grid to finish
  float dg[kSmemSums ? 1 : kNv][kV], db[kSmemSums ? 1 : kNv][kV], held_gamma[kHoldGamma ? kNv : 1][kV];
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    if constexpr (kSmemSums) {
#pragma unroll
      for (int j = 0; j < 2 * kQ; ++j) slot(i, j) = float4{};  // own slots: no barrier
    } else {
#pragma unroll
      for (int k = 0; k < kV; ++k) dg[i][k] = db[i][k] = 0.f;
    }
  }
  // gamma by window position (0 outside the row), staged after the first row's loads are issued
  // (below), in the layout of load_staged: 8 floats a thread side by side were two-way bank
  // conflicts in 16-bit.
  constexpr int kAccesses = kPositions / kV;
  auto stage_gamma_by_position = [&]() {
    const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
    for (int q = threadIdx.x; q < kPositions; q += kBlock) {
      const int c = q - lead;
      const bool in = c >= 0 && c < cols;
      gw[staged_index<kV>(q / kV, q % kV, kAccesses)] = in ? (gamma ? to_float(gamma[c]) : 1.f) : 0.f;
    }
    __syncthreads();
    if constexpr (kHoldGamma) {
#pragma unroll
      for (int i = 0; i < kNv; ++i) load_staged(gw, i * kTpr + lane, kAccesses, held_gamma[i]);
    }
  };
  auto gamma_of = [&](int i, float (&out)[kV]) {
    if constexpr (kHoldGamma) {
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] = held_gamma[i][k];
    } else {
      load_staged(gw, i * kTpr + lane, kAccesses, out);
    }
  };

  const int64_t stride = cr.blocks * kGroupsPerBlock;
  const int64_t first = cr.block * kGroupsPerBlock + warp * kGroupsPerWarp;
  // x and dy as loaded (packed), the next rows' loaded before this one's arithmetic where it pays.
  Pack<T, 16> next_x[kNv], next_dy[kNv];
  float next_mean = 0.f, next_rstd = 0.f;
  auto load_row = [&](int64_t v0) {
    const int64_t v = v0 + group_in_warp;
    const bool valid = v < cr.rows;
    const int64_t row = cr.cls + v * period;
    const int64_t start = row * cols - lead;
    const T* __restrict__ x = static_cast<const T*>(p.x) + start;
    const T* __restrict__ dy = static_cast<const T*>(p.dy) + start;
    next_mean = valid ? p.mean[row] : 0.f;
    next_rstd = valid ? p.rstd[row] : 0.f;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int pos = (i * kTpr + lane) * kV;
      if (valid && pos < end) {
        next_x[i] = load_window_raw<T>(x, pos, lead, end, true);
        next_dy[i] = load_window_raw<T>(dy, pos, lead, end, vector);
      } else {
        next_x[i] = next_dy[i] = zero_pack<T, 16>();
      }
    }
  };
  // The _smem variants at most 4 packs a lane: float32's 5 to 8 with the next row's too spilled at
  // their 128 registers. The plain ones (no such cap) prefetch up to 32 elements.
  constexpr bool kPrefetch = window_prefetch(kNv * kV) && (!kSmemSums || kNv <= 4);
  if constexpr (kPrefetch) {
    if (first < cr.rows) load_row(first);
  }
  stage_gamma_by_position();  // every thread: the barrier needs them all

  for (int64_t v0 = first; v0 < cr.rows; v0 += stride) {
    if constexpr (!kPrefetch) load_row(v0);
    Pack<T, 16> xs[kNv], ds[kNv];
    const float mean = next_mean, rstd = next_rstd;
    // Masked here, after the row's loads were all issued (load_window_raw).
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int pos = (i * kTpr + lane) * kV;
      xs[i] = next_x[i], ds[i] = next_dy[i];
      mask_window(xs[i], pos, lead, end);
      mask_window(ds[i], pos, lead, end);
    }
    if constexpr (kPrefetch) {
      if (v0 + stride < cr.rows) load_row(v0 + stride);  // uniform over the warp
    }
    // Outside the row x and dy are 0 (and gamma too), so those positions add nothing below.
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      if ((i * kTpr + lane) * kV >= end) continue;
      float xv[kV], dv[kV], gv[kV];
      unpack(xs[i], xv);
      unpack(ds[i], dv);
      gamma_of(i, gv);
      float xhat[kV];
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        xhat[k] = (xv[k] - mean) * rstd;
        const float g = dv[k] * gv[k];
        sum_g += g;
        sum_gx = fmaf(g, xhat[k], sum_gx);
      }
      if constexpr (kSmemSums) {
        add_param_sums<kV, 4>([&](int j) -> float4& { return slot(i, j); }, dv, xhat);
      } else {
        add_param_sums(dg[i], db[i], dv, xhat);
      }
    }
    sum_g = group_sum<kTpr>(sum_g);
    sum_gx = group_sum<kTpr>(sum_gx);
    const int64_t v = v0 + group_in_warp;
    if (!p.dx || v >= cr.rows) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) = a * g + c * xhat + b; in 16-bit c * xhat + b
    // folded into one fma on x, as in bwd_regs.
    const float a = rstd;
    const float b = -a * sum_g * inv_cols;
    const float c = -a * sum_gx * inv_cols;
    const float cx = c * rstd;
    const float bx = b - cx * mean;
    T* __restrict__ dx = static_cast<T*>(p.dx) + (cr.cls + v * period) * cols - lead;
#pragma unroll
    for (int i = 0; i < kNv; ++i) {
      const int pos = (i * kTpr + lane) * kV;
      if (pos >= end) continue;
      float xv[kV], dv[kV], gv[kV], out[kV];
      unpack(xs[i], xv);
      unpack(ds[i], dv);
      gamma_of(i, gv);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        if constexpr (sizeof(T) == 2) {
          out[k] = fmaf(a, dv[k] * gv[k], fmaf(cx, xv[k], bx));
        } else {
          const float xhat = (xv[k] - mean) * rstd;
          out[k] = fmaf(a, dv[k] * gv[k], fmaf(c, xhat, b));
        }
      }
      store_window<T>(dx, pos, lead, end, vector, out);
    }
  }
  if (!want_params) return;  // uniform over the grid
  float* partials = static_cast<float*>(p.workspace);
  if constexpr (kSmemSums) {
    // Column c sits at window position q = c + lead: pack q / (kTpr V) of lane (q / V) mod kTpr,
    // held by the block's threads of that lane, summed in thread order.
    __syncthreads();
    const float* all = reinterpret_cast<const float*>(fold);
    for (int which = 0; which < 2; ++which) {
      float* dst = partials + (static_cast<int64_t>(which) * gridDim.x + blockIdx.x) * cols;
      for (int col = threadIdx.x; col < cols; col += kBlock) {
        const int q = col + lead;
        const int i = q / (kTpr * kV), l = (q / kV) % kTpr, k = q % kV;
        const float* v = all + ((i * 2 * kQ + which * kQ + k / 4) * kBlock) * 4 + k % 4;
        float s = 0.f;
        for (int t = l; t < kBlock; t += kTpr) s += v[t * 4];
        dst[col] = s;
      }
    }
  } else {
    // Fold: lanes l, l + kTpr, ... of a warp hold the same window positions (one lead a block), then
    // the warps' rows in shared memory in a fixed order, written out by column.
#pragma unroll
    for (int offset = kTpr; offset < 32; offset <<= 1) {
#pragma unroll
      for (int i = 0; i < kNv; ++i)
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          dg[i][k] += __shfl_xor_sync(0xffffffffu, dg[i][k], offset);
          db[i][k] += __shfl_xor_sync(0xffffffffu, db[i][k], offset);
        }
    }
    for (int which = 0; which < 2; ++which) {
      if (group_in_warp == 0) {
#pragma unroll
        for (int i = 0; i < kNv; ++i) {
          const int pos = (i * kTpr + lane) * kV;
#pragma unroll
          for (int k = 0; k < kV; ++k) fold[warp * kPositions + pos + k] = which == 0 ? dg[i][k] : db[i][k];
        }
      }
      __syncthreads();
      float* dst = partials + (static_cast<int64_t>(which) * gridDim.x + blockIdx.x) * cols;
      for (int col = threadIdx.x; col < cols; col += kBlock) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += fold[w * kPositions + col + lead];
        dst[col] = s;
      }
      __syncthreads();
    }
  }
}

template <typename T, int kTpr, int kNv, bool kSmemSums>
std::size_t bwd_window_smem() {
  const std::size_t positions = static_cast<std::size_t>(kNv) * kTpr * kVec<T, 16>;
  constexpr std::size_t block = bwd_window_block<T, kNv, kSmemSums>();
  if constexpr (kSmemSums)  // gamma by position, the sums: 2 floats an element a thread
    return (positions + 2 * static_cast<std::size_t>(kNv) * kVec<T, 16> * block) * sizeof(float);
  return (1 + block / 32) * positions * sizeof(float);
}

// The backward's grid, within the workspace where dgamma or dbeta is wanted.
template <typename T, int kTpr, int kNv, bool kSmemSums>
int64_t bwd_window_grid(const BwdParams& p, int64_t cap) {
  constexpr int block = bwd_window_block<T, kNv, kSmemSums>();
  return window_grid(resident<bwd_window_kernel<T, kTpr, kNv, kSmemSums>>(block, bwd_window_smem<T, kTpr, kNv, kSmemSums>(),
                                                                          p.device),
                     p.rows, window_period(p.cols, kVec<T, 16>), block / kTpr, cap);
}

// with_window for the backward: `none` also where the _smem variant refuses the row (a lane holds
// 8 elements or fewer; the plain variant takes those), so those instantiations are never made.
template <int kTpr, bool kSmemSums, typename R, typename F>
R with_bwd_window(DType dtype, int64_t cols, R none, F&& f) {
  return with_window<kTpr>(dtype, cols, none, [&]<typename T, int kNv>() -> R {
    if constexpr (kSmemSums && !bwd_window_smem_takes<T, kNv>()) return none;
    else return f.template operator()<T, kNv>();
  });
}

}  // namespace

template <int kTpr, bool kSmemSums>
bool bwd_window_supports(const BwdParams& p) {
  if (!(p.rows > 0 && p.cols > 0)) return false;
  const int elem = static_cast<int>(dtype_size(p.dtype));
  if (!elem_aligned({p.x, p.dy, p.dx, p.gamma}, elem)) return false;
  if (access_bytes(p.cols, elem, {p.x, p.dy, p.dx, p.gamma}) == 16) return false;  // the *_regs variants
  return with_bwd_window<kTpr, kSmemSums>(p.dtype, p.cols, false, [&]<typename T, int kNv>() -> bool {
    return fits(bwd_window_kernel<T, kTpr, kNv, kSmemSums>, bwd_window_block<T, kNv, kSmemSums>(),
                bwd_window_smem<T, kTpr, kNv, kSmemSums>(), p.device);
  });
}

template <int kTpr, bool kSmemSums>
std::size_t bwd_window_workspace(const BwdParams& p) {
  if (!p.dgamma && !p.dbeta) return 0;
  return with_bwd_window<kTpr, kSmemSums>(p.dtype, p.cols, std::size_t{0}, [&]<typename T, int kNv>() -> std::size_t {
    return 2 * static_cast<std::size_t>(bwd_window_grid<T, kTpr, kNv, kSmemSums>(p, int64_t{1} << 30)) *
           static_cast<std::size_t>(p.cols) * sizeof(float);
  });
}

template <int kTpr, bool kSmemSums>
cudaError_t bwd_window_run(const BwdParams& p, cudaStream_t stream) {
  return with_bwd_window<kTpr, kSmemSums>(
      p.dtype, p.cols, cudaErrorInvalidValue, [&]<typename T, int kNv>() -> cudaError_t {
        constexpr auto kernel = bwd_window_kernel<T, kTpr, kNv, kSmemSums>;
        const std::size_t smem = bwd_window_smem<T, kTpr, kNv, kSmemSums>();
        if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
        const int64_t grid = bwd_window_grid<T, kTpr, kNv, kSmemSums>(p, grid_within_workspace(int64_t{1} << 30, p));
        if (grid < 1) return cudaErrorInvalidValue;
        const int period = window_period(p.cols, kVec<T, 16>);
        const bool vector = same_lead(p.x, {p.dy, p.dx});
        if (const cudaError_t err = launch_pdl(kernel, static_cast<unsigned>(grid),
                                               bwd_window_block<T, kNv, kSmemSums>(), smem, stream, p, period, vector);
            err != cudaSuccess)
          return err;
        return reduce_partials(p, static_cast<const float*>(p.workspace), static_cast<int>(grid), stream);
      });
}

#define HFNN_WINDOW(TPR)                                                              \
  template bool fwd_window_supports<TPR>(const FwdParams&);                           \
  template cudaError_t fwd_window_run<TPR>(const FwdParams&, cudaStream_t);           \
  template bool bwd_window_supports<TPR, false>(const BwdParams&);                    \
  template std::size_t bwd_window_workspace<TPR, false>(const BwdParams&);            \
  template cudaError_t bwd_window_run<TPR, false>(const BwdParams&, cudaStream_t);    \
  template bool bwd_window_supports<TPR, true>(const BwdParams&);                     \
  template std::size_t bwd_window_workspace<TPR, true>(const BwdParams&);             \
  template cudaError_t bwd_window_run<TPR, true>(const BwdParams&, cudaStream_t);
HFNN_WINDOW(4)
HFNN_WINDOW(8)
HFNN_WINDOW(16)
HFNN_WINDOW(32)
#undef HFNN_WINDOW

}  // namespace hfnn::kernels::layer_norm
