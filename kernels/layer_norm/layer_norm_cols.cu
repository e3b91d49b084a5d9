// The *_cols backward variants: another variant's dx alone (no dgamma/dbeta: no partial rows and no
// reduction kernel), then dgamma and dbeta summed down the columns by a kernel of their own that reads
// x, dy, mean and rstd again.
//
// Why: the persistent backward grids fold dgamma/dbeta into one partial row of 2 x 4 bytes a column
// per block or cluster, and a second kernel sums them. Where rows are few and wide that costs more
// than the pass itself: at 1M elements in 16 rows of 65,536 (a cluster a row) the partial rows are 8
// MB of float32 written and read again against 6 MB of x, dy and dx in 16-bit, and torch.compile,
// which sums the columns from x and dy again, was ahead (H200, 2026-11-26: fwd+bwd 28.4 against
// 20.0 us at 65,538 columns, 13.9 against 13.8 at 8,192; bench/README.md, "torch.compile at 1M
// elements, and dgamma/dbeta summed down the columns"). x and dy of such a call sit in L2 when read the second time.
//
// The column kernel runs with programmatic dependent launch right after the dx kernel and does not
// wait for it: it reads only the backward's inputs, which the dx kernel's blocks waited for before
// letting it be scheduled (every base variant calls wait_for_previous_grid() before
// allow_next_grid()). That wait returns once the kernel that wrote them has finished and its writes
// are flushed to global memory, so a grid scheduled after it reads them as written. It waits for
// the dx kernel at its end instead, so that it never finishes first: what follows it in the stream
// sees both done. Without dx (an output mask) there is no dx kernel: it is launched plainly, after
// whatever came before. Sums in a fixed order (each slice of rows in row order, then the slices in
// order): bit-identical results run to run. Bases: the wide backward (bwd_wide_c*, and its window
// form for rows not 16-byte aligned, bwd_wide_win_c*'s dx alone) and the block
// backward (bwd_block, bwd_block_win).
#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_variants.h"

namespace hfnn::kernels::layer_norm {
namespace {

constexpr int kLanes = 32;   // accesses of a row a block takes, side by side
constexpr int kSlices = 16;  // slices of the rows: slice s takes rows s, s + 16, ...
// Rows whose loads a thread has in flight at once: 4, and 16 at 2-byte accesses (16-bit rows of odd
// width). The grid is one block a 32 accesses of a row, so there 4,097 columns make 129 blocks, one
// an SM, and with 4 rows in flight that launch waited on memory (Nsight Compute, H100: 20-31% of
// DRAM bandwidth, 89-92% of its stalls on loads; 103 us in bf16 and 66 in fp16 against 48 for the
// dx kernel beside it). 16 took the call from 101.5 to 53.9 us in bf16 and from 56.1 to 54.1 in fp16
// (bench/README.md, "The column sums' rows in flight"); 8 at 4-byte accesses was 0.84-0.94x in bf16
// and 1.03-1.13x in fp16 at 4,100 and 6,402 columns, 16M elements, and is not taken.
// Only where a slice has a step of 16 rows (more than 15 x 16 rows) does the 16-row kernel run; below
// that the 4-row kernel runs (32 registers, not 40; the guess, not measured: more of its blocks fit
// beside the dx kernel). At 12,289 columns and 85 rows (1M elements) that took the best backward from
// 9.5 to 8.1 us in bf16 and 9.6 to 7.9 in fp16 (bench/README.md, "The column sums' rows by row count").
template <int kBytes>
constexpr int kRowsAtOnce = kBytes == 2 ? 16 : 4;

template <typename T, int kBytes, int kAtOnce>
__global__ void __launch_bounds__(kLanes * kSlices) param_cols_kernel(const BwdParams p) {
  constexpr int kV = kVec<T, kBytes>;
  __shared__ float fold[kSlices][2][kLanes * kV];
  allow_next_grid();  // the next kernel waits for this grid (and so for the dx kernel) in its own wait
  const int lane = threadIdx.x, slice = threadIdx.y;
  const int64_t cols = p.cols, acc = cols / kV;
  const int64_t a = static_cast<int64_t>(blockIdx.x) * kLanes + lane;
  float dg[kV], db[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) dg[k] = db[k] = 0.f;
  auto add = [&](const Pack<T, kBytes>& xp, const Pack<T, kBytes>& dp, float mean, float rstd) {
    float xv[kV], dv[kV];
    unpack(xp, xv);
    unpack(dp, dv);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float xhat = (xv[k] - mean) * rstd;  // as the other variants: the subtraction first
      dg[k] = fmaf(dv[k], xhat, dg[k]);
      db[k] += dv[k];
    }
  };
  if (a < acc) {
    const T* __restrict__ x = static_cast<const T*>(p.x) + a * kV;
    const T* __restrict__ dy = static_cast<const T*>(p.dy) + a * kV;
    int64_t r = slice;
    // kN rows' loads in flight before their adds (in row order): kAtOnce at a time, then 4 (the rows
    // left under a step of kAtOnce), then the rest one at a time.
    auto rows_at_once = [&]<int kN>() {
      for (; r + (kN - 1) * kSlices < p.rows; r += kN * kSlices) {
        Pack<T, kBytes> xs[kN], ds[kN];
        float m[kN], s[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const int64_t row = r + j * kSlices;
          xs[j] = load_pack<T, kBytes>(x + row * cols);
          ds[j] = load_pack<T, kBytes>(dy + row * cols);
          m[j] = p.mean[row];
          s[j] = p.rstd[row];
        }
#pragma unroll
        for (int j = 0; j < kN; ++j) add(xs[j], ds[j], m[j], s[j]);
      }
    };
    rows_at_once.template operator()<kAtOnce>();
    if constexpr (kAtOnce > 4) rows_at_once.template operator()<4>();
    for (; r < p.rows; r += kSlices)
      add(load_pack<T, kBytes>(x + r * cols), load_pack<T, kBytes>(dy + r * cols), p.mean[r], p.rstd[r]);
  }
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    fold[slice][0][lane * kV + k] = dg[k];
    fold[slice][1][lane * kV + k] = db[k];
  }
  __syncthreads();
  // Output o of the block's 2 x kLanes x kV: dgamma's, then dbeta's; the slices summed in order.
  for (int o = slice * kLanes + lane; o < 2 * kLanes * kV; o += kLanes * kSlices) {
    const int which = o / (kLanes * kV), e = o % (kLanes * kV);
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes * kV + e;
    T* out = static_cast<T*>(which == 0 ? p.dgamma : p.dbeta);
    if (out == nullptr || c >= cols) continue;
    float total = 0.f;
#pragma unroll
    for (int s = 0; s < kSlices; ++s) total += fold[s][which][e];
    out[c] = from_float<T>(total);
  }
  wait_for_previous_grid();  // never finish before the dx kernel
}

// The access width: the widest x and dy allow (dgamma and dbeta are written an element at a time),
// narrowed while the blocks would not cover the SMs (few columns), not below 4 bytes (2-byte
// accesses only where the rows allow no wider: 16-bit odd widths).
int cols_bytes(const BwdParams& p) {
  if (p.rows <= 0 || p.cols <= 0 || p.device.device < 0) return 0;
  const int esize = static_cast<int>(dtype_size(p.dtype));
  int bytes = access_bytes(p.cols, esize, {p.x, p.dy});
  if (bytes < esize) return 0;
  while (bytes > 4 && (p.cols * esize / bytes + kLanes - 1) / kLanes < p.device.sm_count) bytes /= 2;
  return bytes;
}

template <typename F>
cudaError_t with_cols(const BwdParams& p, F&& f) {
  const int bytes = cols_bytes(p);
  if (!bytes) return cudaErrorInvalidValue;
  return dispatch_dtype(p.dtype, [&]<typename T>() -> cudaError_t {
    return with_access_bytes<T>(bytes, [&]<int kBytes>() -> cudaError_t { return f.template operator()<T, kBytes>(); });
  });
}

// p without dgamma and dbeta: what the base variant runs.
BwdParams dx_only(const BwdParams& p) {
  BwdParams q = p;
  q.dgamma = q.dbeta = nullptr;
  q.workspace = nullptr;
  q.workspace_size = 0;
  return q;
}

}  // namespace

template <bool (*Supports)(const BwdParams&), cudaError_t (*Run)(const BwdParams&, cudaStream_t)>
bool bwd_cols_supports(const BwdParams& p) {
  if (!Supports(dx_only(p))) return false;
  return with_cols(p, [&]<typename T, int kBytes>() {
           return fits(param_cols_kernel<T, kBytes, kRowsAtOnce<kBytes>>, kLanes * kSlices, 0, p.device) &&
                          fits(param_cols_kernel<T, kBytes, 4>, kLanes * kSlices, 0, p.device)
                      ? cudaSuccess
                      : cudaErrorInvalidValue;
         }) == cudaSuccess;
}

template <bool (*Supports)(const BwdParams&), cudaError_t (*Run)(const BwdParams&, cudaStream_t)>
cudaError_t bwd_cols_run(const BwdParams& p, cudaStream_t stream) {
  if (p.dx) {
    if (const cudaError_t err = Run(dx_only(p), stream); err != cudaSuccess) return err;
  }
  if (!p.dgamma && !p.dbeta) return cudaSuccess;
  return with_cols(p, [&]<typename T, int kBytes>() {
    const int64_t acc = p.cols / kVec<T, kBytes>;
    const unsigned blocks = static_cast<unsigned>((acc + kLanes - 1) / kLanes);
    // Beside the dx kernel where there is one; otherwise after everything before it (a plain launch:
    // the kernel does not wait at its start).
    auto launch = [&]<int kAtOnce>() {
      return launch_ex(param_cols_kernel<T, kBytes, kAtOnce>, dim3(blocks), dim3(kLanes, kSlices), 0, stream,
                       /*pdl=*/p.dx != nullptr, 1, p);
    };
    if constexpr (kRowsAtOnce<kBytes> > 4) {
      if (p.rows > (kRowsAtOnce<kBytes> - 1) * kSlices)
        return launch.template operator()<kRowsAtOnce<kBytes>>();
    }
    return launch.template operator()<4>();
  });
}

#define HFNN_COLS(C, SMEM)                                                                          \
  template bool bwd_cols_supports<&bwd_wide_supports<C, SMEM>, &bwd_wide_run<C, SMEM>>(const BwdParams&); \
  template cudaError_t bwd_cols_run<&bwd_wide_supports<C, SMEM>, &bwd_wide_run<C, SMEM>>(const BwdParams&, \
                                                                                          cudaStream_t);
HFNN_COLS(1, false)
HFNN_COLS(2, false)
HFNN_COLS(4, false)
HFNN_COLS(8, false)
HFNN_COLS(16, false)
HFNN_COLS(1, true)
HFNN_COLS(2, true)
HFNN_COLS(4, true)
HFNN_COLS(8, true)
HFNN_COLS(16, true)
#undef HFNN_COLS
#define HFNN_COLS_WIN(C)                                                                              \
  template bool bwd_cols_supports<&bwd_wide_win_supports<C, false>, &bwd_wide_win_run<C, false>>(const BwdParams&); \
  template cudaError_t bwd_cols_run<&bwd_wide_win_supports<C, false>, &bwd_wide_win_run<C, false>>(const BwdParams&, \
                                                                                                  cudaStream_t);
HFNN_COLS_WIN(1)
HFNN_COLS_WIN(2)
HFNN_COLS_WIN(4)
HFNN_COLS_WIN(8)
HFNN_COLS_WIN(16)
#undef HFNN_COLS_WIN
template bool bwd_cols_supports<&bwd_block_supports<false>, &bwd_block_run<false>>(const BwdParams&);
template cudaError_t bwd_cols_run<&bwd_block_supports<false>, &bwd_block_run<false>>(const BwdParams&, cudaStream_t);
template bool bwd_cols_supports<&bwd_block_supports<true>, &bwd_block_run<true>>(const BwdParams&);
template cudaError_t bwd_cols_run<&bwd_block_supports<true>, &bwd_block_run<true>>(const BwdParams&, cudaStream_t);

}  // namespace hfnn::kernels::layer_norm
