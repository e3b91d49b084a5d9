// LayerNorm backward variants: dx, dgamma and dbeta from one read of x and dy.
//
//   bwd_regs_tpr{4,8,16,32}     Persistent grid (resident blocks x SMs); kTpr threads share a row held
//                               in registers, as loaded (16-bit values stay packed). Each thread always
//                               owns the same columns, so it sums dy * xhat and dy for them in
//                               registers over every row it visits, and holds gamma once. The next
//                               rows' loads are issued before this row's arithmetic (software
//                               pipelining). At the end the block folds its threads' sums (shuffles
//                               within a warp, then a fixed-order sum over warps in shared memory)
//                               into one partial row in the workspace, and a second small kernel sums
//                               those rows in a fixed order. No float atomics: bit-identical results.
//                               Accesses of 16 bytes where rows are 16-byte aligned, else 8, 4 or 2
//                               (an element): every alignment, up to kTpr x 8 accesses a row.
//   bwd_regs_tpr{4,8,16,32}_r2  The same with two rows per thread group at once instead of the
//                               pipelining (rows of 1 or 2 accesses per thread only).
//   bwd_block                   Persistent grid, one block per row at a time, any cols: a first pass
//                               reads x and dy for the two row sums and the dgamma/dbeta partials
//                               (kept per column in shared memory, each column owned by one thread;
//                               in the workspace where shared memory is too small), a second pass
//                               re-reads them (from L1/L2) to write dx. Same fold.
//   bwd_block_win               bwd_block for rows aligned to an element only (odd widths), which
//                               bwd_block reads an element at a time: x, dy and dx through their
//                               16-byte windows (layer_norm_window.cuh). Faster from about 4K
//                               columns, slower below (H100, bench/README.md): its own name, so the
//                               measurements choose.
//
// What moved the bf16 backward (H200, [65536, 128], bench/README.md): packs held as 32-bit words
// instead of 16-bit arrays (the SASS had ~50 byte permutes an iteration; 20.3 -> 17.3 us), and
// programmatic dependent launch (-> 16.6 us). It stays issue-bound: about 20 instructions an element.
#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_param_sums.cuh"
#include "kernels/layer_norm/layer_norm_variants.h"
#include "kernels/layer_norm/layer_norm_window.cuh"

namespace hfnn::kernels::layer_norm {
namespace {

constexpr int kRegsBlock = 256;
constexpr int kRegsWarps = kRegsBlock / 32;

// Workspace of the persistent variants: [2][grid][cols] floats (dgamma partials, then dbeta).
std::size_t partials_bytes(int grid, int64_t cols) {
  return 2 * static_cast<std::size_t>(grid) * static_cast<std::size_t>(cols) * sizeof(float);
}

// Sums the per-block partial rows into dgamma (blockIdx.y == 0) and dbeta (1), 32 columns a block;
// each of the kSlices thread rows takes every kSlices-th partial row in order, then one fixed-order
// sum over the slices: the same order for a given partial-row count and width on every run. Under
// 32 slices a thread takes its rows 8 loads at a time before their adds where it has 8 or more
// (the old loop at 32: batching there was 1-2% slower at 16M and up to 9% at 1M, H200).
// kDiscard: the lines read are dropped from L2 after (below; the launch takes it only where the
// partial rows are whole 128-byte lines); the kernel then writes the partials' memory, so its loads
// are plain ones, which the memory model orders before the drops.
template <typename T, int kSlices, bool kDiscard>
__global__ void __launch_bounds__(32 * kSlices) reduce_partials_kernel(const float* __restrict__ partials, int grid,
                                                                       int64_t cols, T* dgamma, T* dbeta) {
  __shared__ float acc[kSlices][33];
  wait_for_previous_grid();  // the partials come from the kernel just before
  T* out = blockIdx.y == 0 ? dgamma : dbeta;
  if (out == nullptr) return;  // uniform over the block
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const float* __restrict__ src = partials + static_cast<int64_t>(blockIdx.y) * grid * cols;
  // Without the drops through the read-only path (ld.global.nc): with plain loads the wide
  // backward took 1-3% longer at 1M elements (H100), where no line is dropped. With them, plain
  // loads: .nc is for memory the kernel does not write, and the drops count as writes.
  auto load = [&](int64_t i) {
    if constexpr (kDiscard) return src[i];
    else return __ldg(src + i);
  };
  float s = 0.f;
  if (c < cols) {
    int b = threadIdx.y;
    if constexpr (kSlices < 32) {
      for (; b + 7 * kSlices < grid; b += 8 * kSlices) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = load(static_cast<int64_t>(b + k * kSlices) * cols + c);
#pragma unroll
        for (int k = 0; k < 8; ++k) s += v[k];
      }
    }
    for (; b < grid; b += kSlices) s += load(static_cast<int64_t>(b) * cols + c);
  }
  // The partial rows are read here once and never again: with kDiscard a warp's 32 columns are one
  // whole 128-byte line of a row, and the warp drops the lines it read from L2 once they are
  // summed, so they are not written back to DRAM.
  if constexpr (kDiscard) {
    __syncwarp();  // every lane's loads consumed (s holds them)
    const float* line = src + static_cast<int64_t>(blockIdx.x) * 32;
    for (int b = threadIdx.y + static_cast<int>(threadIdx.x) * kSlices; b < grid; b += 32 * kSlices)
      discard_l2_line(line + static_cast<int64_t>(b) * cols);
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < kSlices; ++k) total += acc[k][threadIdx.x];
    out[c] = from_float<T>(total);
  }
}

// 32 slices, or as many as keep the launch within about two waves of full SMs (2 x cols x slices
// threads), but not more than the partial rows need. Few partial rows over many columns (wide rows
// split over clusters: 16-32 partial rows of 65,536 columns) took 32 slices of one row each in
// thousands of blocks of 1,024 threads: 15.5 of a 61.8 us backward (H200, bf16, 256 x 65,536;
// HFNN_LN_DIAG=skip on branch ln-diag-reduce).
template <typename T>
cudaError_t launch_reduce_partials(const BwdParams& p, const float* partials, int grid, cudaStream_t stream) {
  if (!p.dgamma && !p.dbeta) return cudaSuccess;
  const int64_t threads = 2 * static_cast<int64_t>(p.device.sm_count) * 2048;
  int slices = 32;
  while (slices > 1 && (2 * p.cols * slices > threads || slices / 2 >= grid)) slices /= 2;
  const dim3 blocks(static_cast<unsigned>((p.cols + 31) / 32), 2);
  // The partial rows dropped from L2 as they are read, not written back, where the pass's own bytes
  // (x and dy in, dx out) are more than L2 holds: there the write-backs take DRAM bandwidth from a
  // pass that is bound by it. H100, bf16, 16M elements: the best backward variant 1.01-1.06x at
  // 1,536 to 12,288 columns (the partials up to 13 MB beside the pass's 96); at 1M elements, where
  // the pass is not bound by DRAM, dropping cost 3-5% (bench/README.md, "The dgamma/dbeta partials
  // dropped from L2").
  const double pass_bytes = 3.0 * static_cast<double>(p.rows) * static_cast<double>(p.cols) * dtype_size(p.dtype);
  // Only where every line of the partials is one row's (rows of whole lines from an aligned base):
  // elsewhere nothing could be dropped and the kernel keeps its read-only loads.
  const bool whole_lines = p.cols % 32 == 0 && reinterpret_cast<std::uintptr_t>(partials) % 128 == 0;
  const bool discard =
      whole_lines && p.device.l2_bytes > 0 && pass_bytes > static_cast<double>(p.device.l2_bytes);
  auto run = [&]<int kSlices>() {
    auto kernel = discard ? reduce_partials_kernel<T, kSlices, true> : reduce_partials_kernel<T, kSlices, false>;
    return launch_pdl(kernel, blocks, dim3(32, kSlices), 0, stream, partials, grid, p.cols,
                      static_cast<T*>(p.dgamma), static_cast<T*>(p.dbeta));
  };
  switch (slices) {
    case 1: return run.template operator()<1>();
    case 2: return run.template operator()<2>();
    case 4: return run.template operator()<4>();
    case 8: return run.template operator()<8>();
    case 16: return run.template operator()<16>();
    default: return run.template operator()<32>();
  }
}

}  // namespace

cudaError_t reduce_partials(const BwdParams& p, const float* partials, int grid, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&]<typename T>() { return launch_reduce_partials<T>(p, partials, grid, stream); });
}

namespace {

// Resident blocks the compiler must leave room for, by elements a thread holds per iteration:
// small slices are latency-bound and want occupancy more than registers. With the prefetch, 4
// blocks (64 registers) spilled 24 to 64 bytes at 8 elements and 3 blocks spilled at 16, so 8
// elements get 3 blocks; 24 (a 16-bit row's three 16-byte accesses, or six 8-byte ones) get 2,
// which ptxas meets without spilling (the 16-byte ones took 133-138 registers unbounded, one block
// an SM; the 8-byte ones 124-128 either way); larger slices are left unbounded.
constexpr int regs_min_blocks(int elements) { return elements <= 8 ? 3 : elements == 24 ? 2 : 1; }

// Software pipelining doubles the registers that hold x and dy; at 64 elements (bf16, 8 accesses)
// that spilled 696 bytes, so only slices of up to 32 elements prefetch, and two-row variants,
// which already have two rows of loads in flight, do not.
constexpr bool regs_prefetch(int rows, int elements) { return rows == 1 && elements <= 32; }

template <typename T, int kTpr, int kNv, int kRows, int kBytes>
__global__ void __launch_bounds__(kRegsBlock, regs_min_blocks(kRows * kNv * kVec<T, kBytes>)) bwd_regs_kernel(const BwdParams p) {
  // [kRegsWarps][cols]: the fold at the end; until then, where gamma is not held in registers, its
  // first cols floats hold gamma as floats (1 where there is none) in load_staged's layout.
  extern __shared__ __align__(16) float fold[];
  constexpr int kV = kVec<T, kBytes>;
  constexpr int kGroupsPerBlock = kRegsBlock / kTpr;
  constexpr int kGroupsPerWarp = 32 / kTpr;
  // A group works on kRows rows at once: all their loads are issued before any use.
  // A thread owns the same columns for the whole (persistent) kernel, so where its slice is small
  // gamma is read and converted once, not once per row; where it is not, the block converts it
  // once into shared memory, and a row reads it there as floats: no global load, address, unpack or
  // null test a row (H200 SASS, bf16, 32 elements a thread: 144 of 817 instructions a row).
  constexpr bool kHoldGamma = kNv * kV <= 16;
  // Accesses i < kSure are inside every row (sure_slots): no column test, for accesses of up to 4
  // bytes (1.02-1.16x, H100, 16M elements, 33-127 columns); with 8- or 16-byte ones the tests stay,
  // as measured faster there (without: 0.84-0.94x for two rows a group and 8 accesses of 16 bytes,
  // bench/README.md, "Slots inside every row without a column test").
  constexpr int kSure = kBytes <= 4 ? sure_slots(kNv, regs_exact_accesses(sizeof(T), kBytes)) : 0;
  const int lane = threadIdx.x % kTpr;
  const int warp = threadIdx.x / 32;
  const int group_in_warp = (threadIdx.x % 32) / kTpr;
  const int cols = static_cast<int>(p.cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const bool want_params = p.dgamma || p.dbeta;
  wait_for_previous_grid();
  allow_next_grid();  // the partials' reduction may be scheduled; it waits for this grid to finish

  float dg[kNv][kV], db[kNv][kV], held_gamma[kHoldGamma ? kNv : 1][kV];
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
#pragma unroll
    for (int k = 0; k < kV; ++k) dg[i][k] = db[i][k] = 0.f;
    if constexpr (kHoldGamma) {
      const int col = (i * kTpr + lane) * kV;
      if (gamma && col < cols) unpack(load_pack<T, kBytes>(gamma + col), held_gamma[i]);
      else
#pragma unroll
        for (int k = 0; k < kV; ++k) held_gamma[i][k] = 1.f;
    }
  }
  // gamma for access i, as floats (1 where there is no gamma).
  auto gamma_of = [&](int i, float (&out)[kV]) {
    if constexpr (kHoldGamma) {
#pragma unroll
      for (int k = 0; k < kV; ++k) out[k] = held_gamma[i][k];
    } else {
      load_staged(fold, i * kTpr + lane, cols / kV, out);
    }
  };

  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroupsPerBlock * kRows;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + warp * kGroupsPerWarp) * kRows;

  // x and dy stay in registers as loaded (half the registers of floats for 16-bit types). The
  // next iteration's rows are loaded before this one's arithmetic (software pipelining), so loads
  // stay in flight while a thread computes, shuffles and stores.
  Pack<T, kBytes> next_x[kRows][kNv], next_dy[kRows][kNv];
  float next_mean[kRows], next_rstd[kRows];
  auto load_rows = [&](int64_t row0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r * kGroupsPerWarp + group_in_warp;
      const bool valid = row < p.rows;
      const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols;
      const T* __restrict__ dy = static_cast<const T*>(p.dy) + row * cols;
      next_mean[r] = valid ? p.mean[row] : 0.f;
      next_rstd[r] = valid ? p.rstd[row] : 0.f;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int col = (i * kTpr + lane) * kV;
        if (valid && (i < kSure || col < cols)) {
          next_x[r][i] = load_pack<T, kBytes>(x + col);
          next_dy[r][i] = load_pack<T, kBytes>(dy + col);
        } else {
          next_x[r][i] = next_dy[r][i] = zero_pack<T, kBytes>();
        }
      }
    }
  };
  constexpr bool kPrefetch = regs_prefetch(kRows, kRows * kNv * kV);
  if constexpr (kPrefetch) {
    if (first < p.rows) load_rows(first);
  }
  if constexpr (!kHoldGamma) {  // with the first rows' loads in flight
    stage_param<T, kBytes>(fold, gamma, 1.f, 0, cols / kV, cols / kV, threadIdx.x, kRegsBlock);
    __syncthreads();
  }

  for (int64_t row0 = first; row0 < p.rows; row0 += stride) {
    if constexpr (!kPrefetch) load_rows(row0);
    Pack<T, kBytes> xs[kRows][kNv], ds[kRows][kNv];
    // xhat = (x - mean) * rstd, as a subtraction first: the fma form x * rstd - mean * rstd cancels
    // badly where |mean| >> std.
    float mean[kRows], rstd[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      mean[r] = next_mean[r];
      rstd[r] = next_rstd[r];
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        xs[r][i] = next_x[r][i];
        ds[r][i] = next_dy[r][i];
      }
    }
    if constexpr (kPrefetch) {
      if (row0 + stride < p.rows) load_rows(row0 + stride);  // uniform over the warp
    }
    float sum_g[kRows], sum_gx[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      sum_g[r] = sum_gx[r] = 0.f;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        if (i >= kSure && (i * kTpr + lane) * kV >= cols) continue;
        float xv[kV], dv[kV], gv[kV];
        unpack(xs[r][i], xv);
        unpack(ds[r][i], dv);
        gamma_of(i, gv);
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          const float xhat = (xv[k] - mean[r]) * rstd[r];
          const float g = dv[k] * gv[k];
          sum_g[r] += g;
          sum_gx[r] = fmaf(g, xhat, sum_gx[r]);
          dg[i][k] = fmaf(dv[k], xhat, dg[i][k]);  // rows past the end add 0: dy is 0 there
          db[i][k] += dv[k];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      sum_g[r] = group_sum<kTpr>(sum_g[r]);
      sum_gx[r] = group_sum<kTpr>(sum_gx[r]);
    }
    if (!p.dx) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r * kGroupsPerWarp + group_in_warp;
      if (row >= p.rows) continue;
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) = a * g + c * xhat + b. For 16-bit
      // outputs c * xhat + b is folded into one fma on x (c * rstd * x + b - c * rstd * mean): two
      // fewer instructions per element in an issue-bound loop, and a cancellation error (|mean|/std
      // times float32 rounding) that stays far under the output's own rounding.
      const float a = rstd[r];
      const float b = -a * sum_g[r] * inv_cols;
      const float c = -a * sum_gx[r] * inv_cols;
      const float cx = c * rstd[r];
      const float bx = b - cx * mean[r];
      T* __restrict__ dx = static_cast<T*>(p.dx) + row * cols;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int col = (i * kTpr + lane) * kV;
        if (i >= kSure && col >= cols) continue;
        float xv[kV], dv[kV], gv[kV], out[kV];
        unpack(xs[r][i], xv);
        unpack(ds[r][i], dv);
        gamma_of(i, gv);
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          if constexpr (sizeof(T) == 2) {
            out[k] = fmaf(a, dv[k] * gv[k], fmaf(cx, xv[k], bx));
          } else {
            const float xhat = (xv[k] - mean[r]) * rstd[r];
            out[k] = fmaf(a, dv[k] * gv[k], fmaf(c, xhat, b));
          }
        }
        store_pack(dx + col, pack<T, kBytes>(out));
      }
    }
  }
  if (!want_params) return;  // uniform over the grid
  if constexpr (!kHoldGamma) __syncthreads();  // every row has read gamma from fold[0, cols)

  // Fold: lanes l, l + kTpr, ... of a warp own the same columns.
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
  float* partials = static_cast<float*>(p.workspace);
  for (int which = 0; which < 2; ++which) {
    if (group_in_warp == 0) {
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int col = (i * kTpr + lane) * kV;
        if (col < cols)
#pragma unroll
          for (int k = 0; k < kV; ++k) fold[warp * cols + col + k] = which == 0 ? dg[i][k] : db[i][k];
      }
    }
    __syncthreads();
    float* dst = partials + (static_cast<int64_t>(which) * gridDim.x + blockIdx.x) * cols;
    for (int c = threadIdx.x; c < cols; c += kRegsBlock) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kRegsWarps; ++w) s += fold[w * cols + c];
      dst[c] = s;
    }
    __syncthreads();
  }
}

std::size_t regs_fold_bytes(int64_t cols) { return static_cast<std::size_t>(kRegsWarps) * cols * sizeof(float); }

template <int kTpr, int kRows, typename T, int kNv, int kBytes>
int regs_grid(const BwdParams& p) {
  constexpr int kGroupsPerBlock = kRegsBlock / kTpr * kRows;
  auto kernel = bwd_regs_kernel<T, kTpr, kNv, kRows, kBytes>;
  // The fold's shared memory grows with cols; remember the last answer per instantiation.
  thread_local int64_t cached_cols = -1;
  thread_local int cached_device = -2;
  thread_local int cached_resident = 1;
  if (cached_cols != p.cols || cached_device != p.device.device) {
    const std::size_t smem = regs_fold_bytes(p.cols);
    if (allow_smem(kernel, smem) != cudaSuccess) (void)cudaGetLastError();
    cached_resident = resident_blocks(kernel, kRegsBlock, smem, 1);
    cached_cols = p.cols;
    cached_device = p.device.device;
  }
  const int64_t needed = (p.rows + kGroupsPerBlock - 1) / kGroupsPerBlock;
  const int64_t full = static_cast<int64_t>(cached_resident) * p.device.sm_count;
  return static_cast<int>(needed < full ? needed : full);
}

template <int kTpr, int kRows, typename T, int kNv, int kBytes>
cudaError_t launch_bwd_regs(const BwdParams& p, cudaStream_t stream) {
  const int grid = static_cast<int>(grid_within_workspace(regs_grid<kTpr, kRows, T, kNv, kBytes>(p), p));
  if (grid < 1) return cudaErrorInvalidValue;
  auto kernel = bwd_regs_kernel<T, kTpr, kNv, kRows, kBytes>;
  const std::size_t smem = regs_fold_bytes(p.cols);
  if (const cudaError_t err = allow_smem(kernel, smem); err != cudaSuccess) return err;
  if (const cudaError_t err = launch_pdl(kernel, grid, kRegsBlock, smem, stream, p); err != cudaSuccess) return err;
  return launch_reduce_partials<T>(p, static_cast<const float*>(p.workspace), grid, stream);
}

// The widest access every row of p allows (16 bytes for rows of a multiple of 16 bytes at 16-byte
// aligned pointers); dgamma and dbeta are written by reduce_partials, a column at a time.
int bwd_access_bytes(const BwdParams& p) {
  return access_bytes(p.cols, static_cast<int>(dtype_size(p.dtype)), {p.x, p.dy, p.dx, p.gamma});
}

// Calls f.template operator()<T, kNv, kBytes>() for the instantiation that fits p: the widest
// access its rows allow, the fewest accesses a thread that cover a row (a power of two unless
// regs_exact_accesses; supports() passed).
template <int kTpr, int kRows, typename F>
decltype(auto) dispatch_regs(const BwdParams& p, F&& f) {
  return dispatch_dtype(p.dtype, [&]<typename T>() {
    return with_access_bytes<T>(bwd_access_bytes(p), [&]<int kBytes>() {
      constexpr bool kExact = regs_exact_accesses(sizeof(T), kBytes);
      const int nv = regs_accesses(p.cols, kVec<T, kBytes>, kTpr, kExact);
      if constexpr (kRows == 1) {
        if (nv == 4) return f.template operator()<T, 4, kBytes>();
        if (nv == 8) return f.template operator()<T, 8, kBytes>();
        if constexpr (kExact) {
          if (nv == 3) return f.template operator()<T, 3, kBytes>();
          if (nv == 5) return f.template operator()<T, 5, kBytes>();
          if (nv == 6) return f.template operator()<T, 6, kBytes>();
          if (nv == 7) return f.template operator()<T, 7, kBytes>();
        }
      }
      if (nv == 1) return f.template operator()<T, 1, kBytes>();
      return f.template operator()<T, 2, kBytes>();
    });
  });
}

// ---- block per row ------------------------------------------------------------------------------

constexpr int kBlockThreads = 256;

// kSmemAcc: the block's dgamma/dbeta partials are summed in shared memory and written out at the
// end. Otherwise (rows too wide for that: over about 28K columns on Hopper) they are summed in place
// in the block's rows of the workspace, in global memory: slower, but every width runs.
// kBytes: the access width, the widest every row allows (bwd_access_bytes()).
template <typename T, int kBytes, bool kSmemAcc>
__global__ void __launch_bounds__(kBlockThreads) bwd_block_kernel(const BwdParams p) {
  extern __shared__ float acc[];  // [2][cols]: this block's dgamma and dbeta partials (kSmemAcc)
  __shared__ float2 scratch[32];
  // The next kernel may be scheduled now: the partials' reduction waits for this grid;
  // bwd_block_cols's column sums, which read only the inputs, run beside it. The wait first (a no-op
  // on the plain launch this kernel has) keeps what they rely on true under any launch: this grid
  // lets the next one in only after the kernel before it has finished.
  wait_for_previous_grid();
  allow_next_grid();
  constexpr int kV = kVec<T, kBytes>;
  const int64_t cols = p.cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const int64_t step = static_cast<int64_t>(kBlockThreads) * kV;
  float* partials = static_cast<float*>(p.workspace);
  float* acc_dg = acc;
  float* acc_db = acc + cols;
  if constexpr (!kSmemAcc) {
    acc_dg = partials ? partials + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
    acc_db = partials ? partials + (static_cast<int64_t>(gridDim.x) + blockIdx.x) * cols : nullptr;
  }
  // Every column belongs to one thread for the whole kernel: no barrier around acc.
  if (acc_dg)
    for (int64_t c = threadIdx.x * kV; c < cols; c += step)
#pragma unroll
      for (int k = 0; k < kV; ++k) acc_dg[c + k] = acc_db[c + k] = 0.f;

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols;
    const T* __restrict__ dy = static_cast<const T*>(p.dy) + row * cols;
    const float mean = p.mean[row], rstd = p.rstd[row];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t c = threadIdx.x * kV; c < cols; c += step) {
      float xv[kV], dv[kV], gv[kV];
      unpack(load_pack<T, kBytes>(x + c), xv);
      unpack(load_pack<T, kBytes>(dy + c), dv);
      if (gamma) unpack(load_pack<T, kBytes>(gamma + c), gv);
      else
#pragma unroll
        for (int k = 0; k < kV; ++k) gv[k] = 1.f;
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float xhat = (xv[k] - mean) * rstd;
        const float g = dv[k] * gv[k];
        sum_g += g;
        sum_gx += g * xhat;
        if (acc_dg) {
          acc_dg[c + k] += dv[k] * xhat;
          acc_db[c + k] += dv[k];
        }
      }
    }
    const float2 sums = block_sum2(sum_g, sum_gx, scratch);
    if (!p.dx) continue;
    const float mean_g = sums.x * inv_cols, mean_gx = sums.y * inv_cols;
    T* __restrict__ dx = static_cast<T*>(p.dx) + row * cols;
    for (int64_t c = threadIdx.x * kV; c < cols; c += step) {
      float xv[kV], dv[kV], gv[kV], out[kV];
      unpack(load_pack<T, kBytes>(x + c), xv);
      unpack(load_pack<T, kBytes>(dy + c), dv);
      if (gamma) unpack(load_pack<T, kBytes>(gamma + c), gv);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float xhat = (xv[k] - mean) * rstd;
        const float g = gamma ? dv[k] * gv[k] : dv[k];
        out[k] = rstd * (g - mean_g - xhat * mean_gx);
      }
      store_pack(dx + c, pack<T, kBytes>(out));
    }
  }
  if (!kSmemAcc || partials == nullptr) return;
  float* dst_dg = partials + static_cast<int64_t>(blockIdx.x) * cols;
  float* dst_db = partials + (static_cast<int64_t>(gridDim.x) + blockIdx.x) * cols;
  for (int64_t c = threadIdx.x * kV; c < cols; c += step)
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      dst_dg[c + k] = acc_dg[c + k];
      dst_db[c + k] = acc_db[c + k];
    }
}

// The block variant for rows aligned to an element only (odd widths in 16-bit, in float32 too):
// x, dy and dx through the row's window (layer_norm_window.cuh) in 16-byte packs, the packs at its
// ends masked, instead of an element at a time; gamma an element at a time. The window moves with
// the row's lead, so a column's dgamma/dbeta partial is not always the same thread's: the
// barriers in block_sum2 order one row's updates before the next row's (the order of the sums is
// still fixed: rows in the block's order).
template <typename T, bool kSmemAcc>
__global__ void __launch_bounds__(kBlockThreads) bwd_block_window_kernel(const BwdParams p, bool dy_vector,
                                                                         bool dx_vector) {
  // [2][padded(cols)]: this block's dgamma and dbeta partials (kSmemAcc), column c at padded(c) =
  // c + c / 8: a warp's threads update columns 8 apart, which would share 4 banks unpadded.
  extern __shared__ float acc[];
  __shared__ float2 scratch[32];
  wait_for_previous_grid();  // as bwd_block_kernel
  allow_next_grid();
  constexpr int kV = kVec<T, 16>;
  const int64_t cols = p.cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  float* partials = static_cast<float*>(p.workspace);
  auto at = [](int64_t c) { return kSmemAcc ? c + (c >> 3) : c; };
  float* acc_dg = acc;
  float* acc_db = acc + at(cols);
  if constexpr (!kSmemAcc) {
    acc_dg = partials ? partials + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
    acc_db = partials ? partials + (static_cast<int64_t>(gridDim.x) + blockIdx.x) * cols : nullptr;
  }
  if (acc_dg)
    for (int64_t c = threadIdx.x; c < cols; c += kBlockThreads) acc_dg[at(c)] = acc_db[at(c)] = 0.f;
  __syncthreads();

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int lead = row_lead<T>(p.x, row * cols);
    const int end = lead + static_cast<int>(cols);
    const int positions = (end + kV - 1) / kV * kV;
    const T* __restrict__ xw = static_cast<const T*>(p.x) + row * cols - lead;
    const T* __restrict__ dyw = static_cast<const T*>(p.dy) + row * cols - lead;
    const float mean = p.mean[row], rstd = p.rstd[row];
    // gamma at window position pos + k (1 without gamma, 0 outside the row)
    auto gamma_at = [&](int pos, float (&g)[kV]) {
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const int c = pos + k - lead;
        g[k] = (c >= 0 && c < cols) ? (gamma ? to_float(gamma[c]) : 1.f) : 0.f;
      }
    };
    // The first pass kBatch packs of x and dy a thread at a time, their loads all issued before the
    // first mask (load_window_raw).
    constexpr int kBatch = 2;
    constexpr int kStep = kBlockThreads * kV;
    float sum_g = 0.f, sum_gx = 0.f;
    for (int base = threadIdx.x * kV; base < positions; base += kBatch * kStep) {
      Pack<T, 16> xr[kBatch], dr[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int pos = base + u * kStep;
        const bool in = pos < positions;
        xr[u] = in ? load_window_raw<T>(xw, pos, lead, end, true) : zero_pack<T, 16>();
        dr[u] = in ? load_window_raw<T>(dyw, pos, lead, end, dy_vector) : zero_pack<T, 16>();
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int pos = base + u * kStep;
        if (pos >= positions) break;
        mask_window(xr[u], pos, lead, end);
        mask_window(dr[u], pos, lead, end);  // 0 outside the row
        float xv[kV], dv[kV], gv[kV];
        unpack(xr[u], xv);
        unpack(dr[u], dv);
        gamma_at(pos, gv);
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          const float xhat = (xv[k] - mean) * rstd;
          const float g = dv[k] * gv[k];
          sum_g += g;
          sum_gx += g * xhat;
          const int c = pos + k - lead;
          if (acc_dg && c >= 0 && c < cols) {
            acc_dg[at(c)] += dv[k] * xhat;
            acc_db[at(c)] += dv[k];
          }
        }
      }
    }
    const float2 sums = block_sum2(sum_g, sum_gx, scratch);  // also orders this row's partials before the next's
    if (!p.dx) continue;
    const float mean_g = sums.x * inv_cols, mean_gx = sums.y * inv_cols;
    T* __restrict__ dxw = static_cast<T*>(p.dx) + row * cols - lead;
    for (int pos = threadIdx.x * kV; pos < positions; pos += kBlockThreads * kV) {
      float xv[kV], dv[kV], gv[kV], out[kV];
      unpack(load_window<T>(xw, pos, lead, end, true), xv);
      unpack(load_window<T>(dyw, pos, lead, end, dy_vector), dv);
      gamma_at(pos, gv);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float xhat = (xv[k] - mean) * rstd;
        out[k] = rstd * (dv[k] * gv[k] - mean_g - xhat * mean_gx);
      }
      store_window<T>(dxw, pos, lead, end, dx_vector, out);
    }
  }
  if (!kSmemAcc || partials == nullptr) return;
  __syncthreads();  // every thread's last updates before any thread copies them out
  float* dst_dg = partials + static_cast<int64_t>(blockIdx.x) * cols;
  float* dst_db = partials + (static_cast<int64_t>(gridDim.x) + blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kBlockThreads) {
    dst_dg[c] = acc_dg[at(c)];
    dst_db[c] = acc_db[at(c)];
  }
}

std::size_t block_smem(int64_t cols) { return 2 * static_cast<std::size_t>(cols) * sizeof(float); }
// The window kernel's partials, padded (bwd_block_window_kernel).
std::size_t block_window_smem(int64_t cols) { return 2 * static_cast<std::size_t>(cols + (cols >> 3)) * sizeof(float); }

// The block variant's launch: partials in shared memory where they fit, else in the workspace.
constexpr std::size_t kMaxGlobalPartials = std::size_t{256} << 20;

// kWindow: bwd_block_win's kernel, which also takes whether dy and dx share x's lead.
template <bool kWindow>
using BlockKernel = std::conditional_t<kWindow, void (*)(const BwdParams, bool, bool), void (*)(const BwdParams)>;

template <bool kWindow>
struct BlockLaunch {
  BlockKernel<kWindow> kernel = nullptr;
  std::size_t smem = 0;
  int grid = 0;
};

// Partials in shared memory where they fit (a grid of the blocks resident at once), else in the
// workspace (one block per SM at most: each block's partial rows, 2 x cols floats, are its own
// memory, and together no more than kMaxGlobalPartials; fewer blocks than 132 only past 254K
// columns).
template <bool kWindow>
BlockLaunch<kWindow> block_shape(BlockKernel<kWindow> in_smem, BlockKernel<kWindow> in_global, const BwdParams& p,
                                 std::size_t smem) {
  BlockLaunch<kWindow> l;
  // dx alone (an output mask, or a *_cols variant's base): no partials anywhere, so no shared
  // memory for them and as many blocks as run at once (where the occupancy query answers).
  const int64_t dx_only_grid =
      !p.dgamma && !p.dbeta && fits(in_global, kBlockThreads, 0, p.device)
          ? resident_clusters(reinterpret_cast<const void*>(in_global), kBlockThreads, 1, 0, 1, p.device)
          : 0;
  if (dx_only_grid > 0) {
    l.kernel = in_global;
    l.grid = static_cast<int>(dx_only_grid);
  } else if (fits(in_smem, kBlockThreads, smem, p.device)) {
    l.kernel = in_smem;
    l.smem = smem;
    l.grid = static_cast<int>(
        resident_clusters(reinterpret_cast<const void*>(in_smem), kBlockThreads, 1, l.smem, 1, p.device));
  } else if (fits(in_global, kBlockThreads, 0, p.device)) {
    const int64_t by_memory = static_cast<int64_t>(kMaxGlobalPartials / (2 * sizeof(float))) / p.cols;
    const int64_t grid = by_memory < p.device.sm_count ? by_memory : p.device.sm_count;
    l.kernel = in_global;
    l.grid = static_cast<int>(grid > 1 ? grid : 1);
  } else {
    return BlockLaunch<kWindow>{};
  }
  l.grid = static_cast<int>(p.rows < l.grid ? p.rows : l.grid);
  return l;
}

// kWindow: bwd_block_win, which takes only rows aligned to an element (the window kernel);
// otherwise bwd_block, every row with the widest access it allows.
template <bool kWindow>
BlockLaunch<kWindow> block_launch(const BwdParams& p) {
  const int bytes = bwd_access_bytes(p);
  if (bytes == 0) return BlockLaunch<kWindow>{};
  return dispatch_dtype(p.dtype, [&]<typename T>() {
    if constexpr (kWindow) {
      if (bytes != static_cast<int>(sizeof(T)) || p.cols > kMaxWindowCols) return BlockLaunch<kWindow>{};
      return block_shape<kWindow>(bwd_block_window_kernel<T, true>, bwd_block_window_kernel<T, false>, p,
                                  block_window_smem(p.cols));
    } else {
      return with_access_bytes<T>(bytes, [&]<int kBytes>() {
        return block_shape<kWindow>(bwd_block_kernel<T, kBytes, true>, bwd_block_kernel<T, kBytes, false>, p,
                                    block_smem(p.cols));
      });
    }
  });
}

}  // namespace

template <int kTpr, int kRows>
bool bwd_regs_supports(const BwdParams& p) {
  const int bytes = bwd_access_bytes(p);
  if (!(p.rows > 0 && p.cols > 0 && bytes > 0)) return false;
  const int elem = static_cast<int>(dtype_size(p.dtype));
  const int nv = regs_accesses(p.cols, bytes / elem, kTpr, regs_exact_accesses(elem, bytes));
  if (!(nv > 0 && (kRows == 1 || nv <= kMaxAccessesForTwoRows))) return false;
  return dispatch_regs<kTpr, kRows>(p, [&]<typename T, int kNv, int kBytes>() {
    return fits(bwd_regs_kernel<T, kTpr, kNv, kRows, kBytes>, kRegsBlock, regs_fold_bytes(p.cols), p.device);
  });
}

template <int kTpr, int kRows>
std::size_t bwd_regs_workspace(const BwdParams& p) {
  if (!p.dgamma && !p.dbeta) return 0;
  return dispatch_regs<kTpr, kRows>(p, [&]<typename T, int kNv, int kBytes>() {
    return partials_bytes(regs_grid<kTpr, kRows, T, kNv, kBytes>(p), p.cols);
  });
}

template <int kTpr, int kRows>
cudaError_t bwd_regs_run(const BwdParams& p, cudaStream_t stream) {
  return dispatch_regs<kTpr, kRows>(
      p, [&]<typename T, int kNv, int kBytes>() { return launch_bwd_regs<kTpr, kRows, T, kNv, kBytes>(p, stream); });
}

#define HFNN_BWD_REGS(TPR, ROWS)                                                  \
  template bool bwd_regs_supports<TPR, ROWS>(const BwdParams&);                   \
  template std::size_t bwd_regs_workspace<TPR, ROWS>(const BwdParams&);           \
  template cudaError_t bwd_regs_run<TPR, ROWS>(const BwdParams&, cudaStream_t);
HFNN_BWD_REGS(4, 1)
HFNN_BWD_REGS(8, 1)
HFNN_BWD_REGS(16, 1)
HFNN_BWD_REGS(32, 1)
HFNN_BWD_REGS(4, 2)
HFNN_BWD_REGS(8, 2)
HFNN_BWD_REGS(16, 2)
HFNN_BWD_REGS(32, 2)
#undef HFNN_BWD_REGS

template <bool kWindow>
bool bwd_block_supports(const BwdParams& p) {
  return p.rows > 0 && p.cols > 0 && block_launch<kWindow>(p).kernel != nullptr;
}

template <bool kWindow>
std::size_t bwd_block_workspace(const BwdParams& p) {
  if (!p.dgamma && !p.dbeta) return 0;
  return partials_bytes(block_launch<kWindow>(p).grid, p.cols);
}

template <bool kWindow>
cudaError_t bwd_block_run(const BwdParams& p, cudaStream_t stream) {
  const BlockLaunch<kWindow> l = block_launch<kWindow>(p);
  if (!l.kernel) return cudaErrorInvalidConfiguration;
  const int grid = static_cast<int>(grid_within_workspace(l.grid, p));
  if (grid < 1) return cudaErrorInvalidValue;
  if (const cudaError_t err = allow_smem(l.kernel, l.smem); err != cudaSuccess) return err;
  BwdParams q = p;
  if (!p.dgamma && !p.dbeta) q.workspace = nullptr;
  cudaError_t err;
  if constexpr (kWindow)
    err = launch_plain(l.kernel, grid, kBlockThreads, l.smem, stream, q, same_lead(p.x, {p.dy}), same_lead(p.x, {p.dx}));
  else
    err = launch_plain(l.kernel, grid, kBlockThreads, l.smem, stream, q);
  if (err != cudaSuccess) return err;
  return reduce_partials(p, static_cast<const float*>(p.workspace), grid, stream);
}

template bool bwd_block_supports<false>(const BwdParams&);
template std::size_t bwd_block_workspace<false>(const BwdParams&);
template cudaError_t bwd_block_run<false>(const BwdParams&, cudaStream_t);
template bool bwd_block_supports<true>(const BwdParams&);
template std::size_t bwd_block_workspace<true>(const BwdParams&);
template cudaError_t bwd_block_run<true>(const BwdParams&, cudaStream_t);

}  // namespace hfnn::kernels::layer_norm
