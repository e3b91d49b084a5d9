// LayerNorm forward variants.
//
//   fwd_regs_tpr{4,8,16,32}     kTpr threads share a row; the row lives in registers (kNv accesses
//                               per thread, the smallest of 1/2/4/8 that covers cols), so x is read
//                               from memory once and mean and variance come from registers
//                               (two-pass variance, no Welford). Small kTpr gives each thread more
//                               loads in flight; large kTpr spreads a wide row. Accesses of 16 bytes
//                               where rows are 16-byte aligned, else of 8, 4 or 2 (an element):
//                               every alignment, up to kTpr x 8 accesses a row.
//   fwd_regs_tpr{4,8,16,32}_r2  The same with two rows per thread group at once, all loads issued
//                               first (rows of 1 or 2 accesses per thread only).
//   fwd_block                   One block per row, the row staged in shared memory as float (or,
//                               where it does not fit, read from global memory on each pass);
//                               accesses as wide as the rows allow, and rows aligned to an element
//                               only (odd widths) through their 16-byte windows
//                               (layer_norm_window.cuh), so it takes every cols (odd sizes, D = 1,
//                               rows of any width) with wide accesses.
//
// The register variants launch with programmatic dependent launch (device.cuh): on Hopper that hid
// the launch gap and moved the forward from 82% to 85-88% of the copy rate at 8-67 MB (H200).
#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_variants.h"
#include "kernels/layer_norm/layer_norm_window.cuh"

namespace hfnn::kernels::layer_norm {
namespace {

constexpr int kRegsBlock = 128;

// The widest access every row of p allows (16 bytes for rows of a multiple of 16 bytes at 16-byte
// aligned pointers).
int fwd_access_bytes(const FwdParams& p) {
  return access_bytes(p.cols, static_cast<int>(dtype_size(p.dtype)), {p.x, p.y, p.gamma, p.beta});
}

template <typename T, int kTpr, int kNv, int kRows, int kBytes>
__global__ void __launch_bounds__(kRegsBlock) fwd_regs_kernel(const FwdParams p) {
  constexpr int kV = kVec<T, kBytes>;
  constexpr int kGroupsPerBlock = kRegsBlock / kTpr;
  constexpr int kGroupsPerWarp = 32 / kTpr;
  // Accesses i < kSure are inside every row (sure_slots; a power of two of them): no column test.
  // Not at 8 accesses under 16 bytes: without the tests those were 0.87-0.96x as fast (H100, 16M
  // elements, float32 and 16-bit at 34-255 columns), where 16-byte ones gained up to 1.13x and
  // fewer accesses up to 1.22x (bench/README.md, "Slots inside every row without a column test").
  constexpr int kSure = kNv == 8 && kBytes < 16 ? 0 : sure_slots(kNv, false);
  const int lane = threadIdx.x % kTpr;
  const int warp = threadIdx.x / 32;
  const int group_in_warp = (threadIdx.x % 32) / kTpr;
  const int cols = static_cast<int>(p.cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const T* __restrict__ beta = static_cast<const T*>(p.beta);
  wait_for_previous_grid();
  allow_next_grid();  // the next kernel may be scheduled; it waits for this grid to finish

  // The loop bound is the warp's first row, so whole warps iterate together and the shuffles
  // always see all 32 lanes; groups past the last row compute on zeros and store nothing. Each
  // group takes kRows rows at once, all loads issued before any use.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroupsPerBlock * kRows;
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + warp * kGroupsPerWarp) * kRows;
       row0 < p.rows; row0 += stride) {
    float v[kRows][kNv][kV];
    float mean[kRows], rstd[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r * kGroupsPerWarp + group_in_warp;
      const bool valid = row < p.rows;
      const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int col = (i * kTpr + lane) * kV;
        if (valid && (i < kSure || col < cols)) {
          unpack(load_pack<T, kBytes>(x + col), v[r][i]);
        } else {
#pragma unroll
          for (int k = 0; k < kV; ++k) v[r][i][k] = 0.f;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kNv; ++i)
#pragma unroll
        for (int k = 0; k < kV; ++k) sum += v[r][i][k];
      mean[r] = group_sum<kTpr>(sum) * inv_cols;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sq = 0.f;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        if (i < kSure || (i * kTpr + lane) * kV < cols) {
#pragma unroll
          for (int k = 0; k < kV; ++k) {
            const float d = v[r][i][k] - mean[r];
            sq += d * d;
          }
        }
      }
      rstd[r] = rsqrtf(group_sum<kTpr>(sq) * inv_cols + p.eps);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r * kGroupsPerWarp + group_in_warp;
      if (row >= p.rows) continue;
      T* __restrict__ y = static_cast<T*>(p.y) + row * cols;
#pragma unroll
      for (int i = 0; i < kNv; ++i) {
        const int col = (i * kTpr + lane) * kV;
        if (i >= kSure && col >= cols) continue;
        float out[kV];
        // (x - mean) * rstd, not the fma x * rstd - mean * rstd: that cancels where |mean| >> std.
#pragma unroll
        for (int k = 0; k < kV; ++k) out[k] = (v[r][i][k] - mean[r]) * rstd[r];
        if (gamma) {
          float g[kV];
          unpack(load_pack<T, kBytes>(gamma + col), g);
          if (beta) {
            float b[kV];
            unpack(load_pack<T, kBytes>(beta + col), b);
#pragma unroll
            for (int k = 0; k < kV; ++k) out[k] = fmaf(out[k], g[k], b[k]);
          } else {
#pragma unroll
            for (int k = 0; k < kV; ++k) out[k] *= g[k];
          }
        }
        store_pack(y + col, pack<T, kBytes>(out));
      }
      if (lane == 0 && p.mean) {
        p.mean[row] = mean[r];
        p.rstd[row] = rstd[r];
      }
    }
  }
}

template <int kTpr, int kRows, typename T, int kNv, int kBytes>
cudaError_t launch_fwd_regs(const FwdParams& p, cudaStream_t stream) {
  constexpr int kGroupsPerBlock = kRegsBlock / kTpr * kRows;
  const int64_t blocks = (p.rows + kGroupsPerBlock - 1) / kGroupsPerBlock;
  const unsigned grid = static_cast<unsigned>(blocks < (1 << 30) ? blocks : (1 << 30));
  return launch_pdl(fwd_regs_kernel<T, kTpr, kNv, kRows, kBytes>, grid, kRegsBlock, 0, stream, p);
}

// Calls f.template operator()<T, kNv, kBytes>() for the instantiation that fits p: the widest
// access its rows allow, the fewest accesses a thread that cover a row; cudaErrorInvalidValue where
// none does.
template <int kTpr, int kRows, typename F>
cudaError_t with_fwd_regs(const FwdParams& p, F&& f) {
  const int bytes = fwd_access_bytes(p);
  if (bytes == 0) return cudaErrorInvalidValue;  // pointers not even element-aligned
  return dispatch_dtype(p.dtype, [&]<typename T>() -> cudaError_t {
    return with_access_bytes<T>(bytes, [&]<int kBytes>() -> cudaError_t {
      switch (regs_accesses(p.cols, kVec<T, kBytes>, kTpr)) {
        case 1: return f.template operator()<T, 1, kBytes>();
        case 2: return f.template operator()<T, 2, kBytes>();
        case 4: if constexpr (kRows == 1) return f.template operator()<T, 4, kBytes>(); else break;
        case 8: if constexpr (kRows == 1) return f.template operator()<T, 8, kBytes>(); else break;
      }
      return cudaErrorInvalidValue;
    });
  });
}

// ---- block per row -------------------------------------------------------------------------------


// kStaged: the row is read once into shared memory (as float) and the three passes run from there.
// Otherwise each pass reads it again from global memory: rows too wide for shared memory (over
// about 56K elements on Hopper) still run, at three reads and a write instead of one and one.
// kBytes: the access width, the widest every row allows (access_bytes(): 16, or 8, 4 or 2 bytes
// for rows only aligned that far).
template <typename T, int kBytes, bool kStaged>
__global__ void __launch_bounds__(1024) fwd_block_kernel(const FwdParams p) {
  extern __shared__ float row_buf[];
  __shared__ float2 scratch[32];
  constexpr int kV = kVec<T, kBytes>;
  const int64_t cols = p.cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const T* __restrict__ beta = static_cast<const T*>(p.beta);
  const int64_t step = static_cast<int64_t>(blockDim.x) * kV;

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* __restrict__ x = static_cast<const T*>(p.x) + row * cols;
    T* __restrict__ y = static_cast<T*>(p.y) + row * cols;
    // The kV values at column c, from shared memory once staged, else from global memory.
    auto values = [&](int64_t c, float (&v)[kV]) {
      if constexpr (kStaged) {
#pragma unroll
        for (int k = 0; k < kV; ++k) v[k] = row_buf[c + k];
      } else {
        unpack(load_pack<T, kBytes>(x + c), v);
      }
    };
    float sum = 0.f;
    // Each thread reads back only the elements it staged itself, so no barrier is needed between
    // the passes other than the ones inside block_sum2.
    for (int64_t c = threadIdx.x * kV; c < cols; c += step) {
      float v[kV];
      unpack(load_pack<T, kBytes>(x + c), v);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        if constexpr (kStaged) row_buf[c + k] = v[k];
        sum += v[k];
      }
    }
    const float mean = block_sum2(sum, 0.f, scratch).x * inv_cols;
    float sq = 0.f;
    for (int64_t c = threadIdx.x * kV; c < cols; c += step) {
      float v[kV];
      values(c, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float d = v[k] - mean;
        sq += d * d;
      }
    }
    const float rstd = rsqrtf(block_sum2(sq, 0.f, scratch).x * inv_cols + p.eps);
    for (int64_t c = threadIdx.x * kV; c < cols; c += step) {
      float v[kV], out[kV], g[kV], b[kV];
      values(c, v);
      if (gamma) unpack(load_pack<T, kBytes>(gamma + c), g);
      if (beta) unpack(load_pack<T, kBytes>(beta + c), b);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        out[k] = (v[k] - mean) * rstd;
        if (gamma) out[k] *= g[k];
        if (beta) out[k] += b[k];
      }
      store_pack(y + c, pack<T, kBytes>(out));
    }
    if (threadIdx.x == 0 && p.mean) {
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

// The block variant for rows aligned to an element only (odd widths in 16-bit, in float32 too):
// each row read through its window (layer_norm_window.cuh) in 16-byte packs, the packs at its ends
// masked, instead of an element at a time; kStaged as above, the row staged by window position.
// gamma and beta are read an element at a time (their columns sit at the row's lead in the pack).
template <typename T, bool kStaged>
__global__ void __launch_bounds__(1024) fwd_block_window_kernel(const FwdParams p, bool y_vector) {
  extern __shared__ float row_buf[];  // [packs x V] window positions (kStaged)
  __shared__ float2 scratch[32];
  constexpr int kV = kVec<T, 16>;
  const int64_t cols = p.cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* __restrict__ gamma = static_cast<const T*>(p.gamma);
  const T* __restrict__ beta = static_cast<const T*>(p.beta);

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int lead = row_lead<T>(p.x, row * cols);
    const int end = lead + static_cast<int>(cols);
    const int positions = (end + kV - 1) / kV * kV;
    const T* __restrict__ xw = static_cast<const T*>(p.x) + row * cols - lead;
    T* __restrict__ yw = static_cast<T*>(p.y) + row * cols - lead;
    // The V values at window position pos, zeros outside the row.
    auto values = [&](int pos, float (&v)[kV]) {
      if constexpr (kStaged) {
#pragma unroll
        for (int k = 0; k < kV; ++k) v[k] = row_buf[pos + k];
      } else {
        unpack(load_window<T>(xw, pos, lead, end, true), v);
      }
    };
    // The first pass kBatch packs a thread at a time, their loads all issued before the first mask
    // (load_window_raw): about all of a thread's packs in flight at once (fwd_block_launch).
    constexpr int kBatch = 4;
    const int step = static_cast<int>(blockDim.x) * kV;
    float sum = 0.f;
    for (int base = threadIdx.x * kV; base < positions; base += kBatch * step) {
      Pack<T, 16> raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int pos = base + u * step;
        raw[u] = pos < positions ? load_window_raw<T>(xw, pos, lead, end, true) : zero_pack<T, 16>();
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int pos = base + u * step;
        if (pos >= positions) break;
        mask_window(raw[u], pos, lead, end);
        float v[kV];
        unpack(raw[u], v);
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          if constexpr (kStaged) row_buf[pos + k] = v[k];
          sum += v[k];
        }
      }
    }
    const float mean = block_sum2(sum, 0.f, scratch).x * inv_cols;
    float sq = 0.f;
    for (int pos = threadIdx.x * kV; pos < positions; pos += blockDim.x * kV) {
      float v[kV];
      values(pos, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float d = (pos + k >= lead && pos + k < end) ? v[k] - mean : 0.f;
        sq += d * d;
      }
    }
    const float rstd = rsqrtf(block_sum2(sq, 0.f, scratch).x * inv_cols + p.eps);
    for (int pos = threadIdx.x * kV; pos < positions; pos += blockDim.x * kV) {
      float v[kV], out[kV];
      values(pos, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const int c = pos + k - lead;
        const bool in = c >= 0 && c < cols;
        out[k] = (v[k] - mean) * rstd;
        if (gamma) out[k] *= in ? to_float(gamma[c]) : 0.f;
        if (beta) out[k] += in ? to_float(beta[c]) : 0.f;
      }
      store_window<T>(yw, pos, lead, end, y_vector, out);
    }
    if (threadIdx.x == 0 && p.mean) {
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

int fwd_block_access_bytes(const FwdParams& p) {
  return access_bytes(p.cols, static_cast<int>(dtype_size(p.dtype)), {p.x, p.y, p.gamma, p.beta});
}

}  // namespace

template <int kTpr, int kRows>
bool fwd_regs_supports(const FwdParams& p) {
  if (!(p.rows > 0 && p.cols > 0)) return false;
  return with_fwd_regs<kTpr, kRows>(p, [&]<typename T, int kNv, int kBytes>() {
           return fits(fwd_regs_kernel<T, kTpr, kNv, kRows, kBytes>, kRegsBlock, 0, p.device) ? cudaSuccess
                                                                                               : cudaErrorInvalidValue;
         }) == cudaSuccess;
}

template <int kTpr, int kRows>
cudaError_t fwd_regs_run(const FwdParams& p, cudaStream_t stream) {
  return with_fwd_regs<kTpr, kRows>(
      p, [&]<typename T, int kNv, int kBytes>() { return launch_fwd_regs<kTpr, kRows, T, kNv, kBytes>(p, stream); });
}

#define HFNN_FWD_REGS(TPR, ROWS)                                        \
  template bool fwd_regs_supports<TPR, ROWS>(const FwdParams&);         \
  template cudaError_t fwd_regs_run<TPR, ROWS>(const FwdParams&, cudaStream_t);
HFNN_FWD_REGS(4, 1)
HFNN_FWD_REGS(8, 1)
HFNN_FWD_REGS(16, 1)
HFNN_FWD_REGS(32, 1)
HFNN_FWD_REGS(4, 2)
HFNN_FWD_REGS(8, 2)
HFNN_FWD_REGS(16, 2)
HFNN_FWD_REGS(32, 2)
#undef HFNN_FWD_REGS

namespace {

// The block variant's launch: about four accesses per thread, 128 to 1024 threads; the row staged
// in shared memory where it fits, else streamed. Rows aligned to an element only (accesses of one
// element) go through their windows: 16-byte accesses, the row's ends masked.
struct BlockLaunch {
  void (*kernel)(const FwdParams) = nullptr;
  void (*window)(const FwdParams, bool) = nullptr;
  unsigned threads = 0;
  std::size_t smem = 0;
};

BlockLaunch fwd_block_launch(const FwdParams& p) {
  const int bytes = fwd_block_access_bytes(p);
  if (bytes == 0) return BlockLaunch{};
  const int esize = static_cast<int>(dtype_size(p.dtype));
  const bool window = bytes == esize && p.cols <= kMaxWindowCols;
  const int vec = (window ? 16 : bytes) / esize;
  const int64_t accesses = window ? (p.cols + 2 * vec - 2) / vec : p.cols / vec;  // window: at most
  int64_t threads = ((accesses + 3) / 4 + 31) / 32 * 32;
  threads = threads < 128 ? 128 : (threads > 1024 ? 1024 : threads);
  const std::size_t staged_smem = static_cast<std::size_t>(window ? accesses * vec : p.cols) * sizeof(float);
  return dispatch_dtype(p.dtype, [&]<typename T>() {
    if (window) {
      auto staged = fwd_block_window_kernel<T, true>;
      if (fits(staged, threads, staged_smem, p.device))
        return BlockLaunch{nullptr, staged, static_cast<unsigned>(threads), staged_smem};
      auto streamed = fwd_block_window_kernel<T, false>;
      if (fits(streamed, threads, 0, p.device)) return BlockLaunch{nullptr, streamed, static_cast<unsigned>(threads), 0};
      return BlockLaunch{};
    }
    return with_access_bytes<T>(bytes, [&]<int kBytes>() {
      auto staged = fwd_block_kernel<T, kBytes, true>;
      if (fits(staged, threads, staged_smem, p.device))
        return BlockLaunch{staged, nullptr, static_cast<unsigned>(threads), staged_smem};
      auto streamed = fwd_block_kernel<T, kBytes, false>;
      if (fits(streamed, threads, 0, p.device)) return BlockLaunch{streamed, nullptr, static_cast<unsigned>(threads), 0};
      return BlockLaunch{};
    });
  });
}

}  // namespace

bool fwd_block_supports(const FwdParams& p) {
  if (!(p.rows > 0 && p.cols > 0)) return false;
  const BlockLaunch l = fwd_block_launch(p);
  return l.kernel != nullptr || l.window != nullptr;
}

cudaError_t fwd_block_run(const FwdParams& p, cudaStream_t stream) {
  const BlockLaunch l = fwd_block_launch(p);
  const unsigned grid = static_cast<unsigned>(p.rows < (1 << 30) ? p.rows : (1 << 30));
  if (l.window) {
    if (const cudaError_t err = allow_smem(l.window, l.smem); err != cudaSuccess) return err;
    return launch_plain(l.window, grid, l.threads, l.smem, stream, p, same_lead(p.x, {p.y}));
  }
  if (!l.kernel) return cudaErrorInvalidConfiguration;
  if (const cudaError_t err = allow_smem(l.kernel, l.smem); err != cudaSuccess) return err;
  return launch_plain(l.kernel, grid, l.threads, l.smem, stream, p);
}

}  // namespace hfnn::kernels::layer_norm
