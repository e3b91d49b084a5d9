// The LSTM variants' shared parts (lstm_common.cuh) and their table (lstm.h).
#include <array>
#include <string>

#include "kernels/lstm/lstm_common.cuh"
#include "kernels/lstm/lstm_family.h"

namespace hfnn::kernels::lstm {
namespace detail {

thread_local std::string gemm_error;

namespace {

// The GEMM cuBLASLt has no algorithm for: 16 x 16 tiles through shared memory, float sums in a
// fixed order. Rows of D along the grid's x (T*B may pass 65,535 tiles), columns along y.
template <typename TA, typename TD>
__global__ void gemm_fallback_kernel(int64_t m, int64_t n, int64_t k, const TA* a, int64_t lda, bool trans_a,
                                     const TA* b, int64_t ldb, bool trans_b, TD* d, int64_t ldd, float beta) {
  __shared__ float sa[16][17], sb[16][17];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 16 + ty, col = static_cast<int64_t>(blockIdx.y) * 16 + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    sa[ty][tx] = row < m && ka < k ? to_float(trans_a ? a[ka * lda + row] : a[row * lda + ka]) : 0.0f;
    sb[ty][tx] = col < n && kb < k ? to_float(trans_b ? b[col * ldb + kb] : b[kb * ldb + col]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 16; ++j) acc += sa[ty][j] * sb[j][tx];
    __syncthreads();
  }
  if (row < m && col < n) {
    TD* out = d + row * ldd + col;
    *out = from_float<TD>(beta != 0.0f ? acc + beta * to_float(*out) : acc);
  }
}

template <typename TA, typename TD>
cudaError_t gemm_fallback(const gemm::Params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.m + 15) / 16), static_cast<unsigned>((p.n + 15) / 16));
  return launch_plain(gemm_fallback_kernel<TA, TD>, grid, dim3(16, 16), 0, stream, p.m, p.n, p.k,
                      static_cast<const TA*>(p.a), p.lda, p.trans_a, static_cast<const TA*>(p.b), p.ldb, p.trans_b,
                      static_cast<TD*>(p.d), p.ldd, p.beta);
}

// db: column sums of dG [rows, cols] (float). Partial sums of a fixed number of row ranges (the
// split count depends only on the shape), each range summed by 8 row-strided threads a column and
// those 8 in order, then the ranges in order: the same result on every run.
__global__ void column_partials_kernel(const float* g, int64_t rows, int64_t cols, int64_t rows_per_split, float* part) {
  __shared__ float s[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
  float acc = 0.0f;
  if (col < cols)
    for (int64_t r = r0 + ty; r < r1; r += 8) acc += g[r * cols + col];
  s[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < cols) {
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) total += s[j][tx];
    part[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

template <typename T>
__global__ void column_finish_kernel(const float* part, int splits, int64_t cols, T* out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int s = 0; s < splits; ++s) total += part[s * cols + col];
  out[col] = from_float<T>(total);
}

}  // namespace

cudaError_t run_gemm(const GemmContext& ctx, gemm::Params p, cudaStream_t stream) {
  p.tf32 = ctx.tf32 && p.dtype == DType::kFloat32;
  p.workspace = ctx.workspace;
  p.workspace_size = ctx.workspace_size;
  const gemm::Result r = gemm::run(p, ctx.handle, stream);
  if (r.status == gemm::Status::kOk) return cudaSuccess;
  if (r.status == gemm::Status::kError) {
    gemm_error = r.message;
    return cudaErrorUnknown;
  }
  return dispatch_dtype(p.dtype, [&]<typename T>() {
    return p.float32_out ? gemm_fallback<T, float>(p, stream) : gemm_fallback<T, T>(p, stream);
  });
}

cudaError_t input_projection(const FwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  gemm::Params g;
  g.dtype = s.dtype;
  g.float32_out = s.dtype != DType::kFloat32;
  g.m = s.steps * s.batch, g.n = 4 * s.hidden, g.k = s.input;
  g.a = p.x, g.lda = s.input;
  g.b = p.w_ih, g.ldb = s.input, g.trans_b = true;
  g.d = static_cast<unsigned char*>(p.workspace) + fwd_layout(s).gates, g.ldd = 4 * s.hidden;
  return run_gemm(p.gemm, g, stream);
}

// The weight and input gradients take dG in the dtype (dg16, written beside the float32 dg by the
// recurrence) with the forward's x, W_ih and h history in the dtype: cuBLASLt multiplies 16-bit
// operands on tensor cores with float32 sums (float32 operands would run without them, about 15x
// slower for the seed's sizes), and one rounding of each dG element to the dtype (2^-9 relative in
// bf16, 2^-12 in fp16) stays far inside the family's tolerance (5e-2, 1e-2 of the reference's
// scale). The recurrence itself (dh, dc) and db stay float32 throughout. float32 runs all of it in
// float32 (TF32 only where the caller allows it).
cudaError_t backward_gemms(const BwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  const int64_t T = s.steps, B = s.batch, I = s.input, H = s.hidden, rows = T * B;
  const FwdLayout fl = fwd_layout(s);
  const BwdLayout bl = bwd_layout(s);
  const auto* ws = static_cast<const unsigned char*>(p.workspace);
  auto* scratch = static_cast<unsigned char*>(p.scratch);
  const void* dg = scratch + bl.dg16;
  const std::size_t elem = dtype_size(s.dtype);
  const void* h_read = ws + fl.hd + (p.reverse ? static_cast<std::size_t>(B * H) * elem : 0);

  gemm::Params g;
  g.dtype = s.dtype;
  // dW_ih [4H, I] = dG^T [4H, T*B] x [T*B, I]
  g.m = 4 * H, g.n = I, g.k = rows;
  g.a = dg, g.lda = 4 * H, g.trans_a = true;
  g.b = p.x, g.ldb = I;
  g.d = p.dw_ih, g.ldd = I;
  if (const cudaError_t e = run_gemm(p.gemm, g, stream); e != cudaSuccess) return e;
  // dW_hh [4H, H] = dG^T h_read [T*B, H]
  g.n = H, g.b = h_read, g.ldb = H, g.d = p.dw_hh, g.ldd = H;
  if (const cudaError_t e = run_gemm(p.gemm, g, stream); e != cudaSuccess) return e;
  // dx [T*B, I] = dG [T*B, 4H] W_ih [4H, I]
  g = gemm::Params{};
  g.dtype = s.dtype;
  g.m = rows, g.n = I, g.k = 4 * H;
  g.a = dg, g.lda = 4 * H;
  g.b = p.w_ih, g.ldb = I;
  g.d = p.dx, g.ldd = I;
  if (const cudaError_t e = run_gemm(p.gemm, g, stream); e != cudaSuccess) return e;
  // db [4H]: dG's column sums
  const float* dgf = reinterpret_cast<const float*>(scratch + bl.dg);
  float* part = reinterpret_cast<float*>(scratch + bl.dbp);
  const int64_t cols = 4 * H, per_split = (rows + bl.db_splits - 1) / bl.db_splits;
  if (const cudaError_t e = launch_plain(column_partials_kernel,
                                         dim3(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(bl.db_splits)),
                                         dim3(32, 8), 0, stream, dgf, rows, cols, per_split, part);
      e != cudaSuccess)
    return e;
  return dispatch_dtype(s.dtype, [&]<typename T>() {
    return launch_plain(column_finish_kernel<T>, dim3(static_cast<unsigned>((cols + 255) / 256)), dim3(256), 0, stream,
                        static_cast<const float*>(part), bl.db_splits, cols, static_cast<T*>(p.db));
  });
}

}  // namespace detail

namespace {

static_assert(kVariants[0].name == "persistent" && kVariants[1].name == "steps" &&
                  kVariants[2].name == "cudnn_persistent",
              "the registry below follows lstm_family.h's kVariants");

constexpr std::array kTable = {
    Variant{kVariants[0].name, kVariants[0].idea, &detail::persistent_supports, &detail::persistent_forward,
            &detail::persistent_backward, &fwd_workspace_bytes, &bwd_scratch_bytes},
    Variant{kVariants[1].name, kVariants[1].idea, &detail::steps_supports, &detail::steps_forward,
            &detail::steps_backward, &fwd_workspace_bytes, &bwd_scratch_bytes},
    Variant{kVariants[2].name, kVariants[2].idea, &detail::cudnn_supports, &detail::cudnn_forward,
            &detail::cudnn_backward, &detail::cudnn_fwd_workspace_bytes, &detail::cudnn_bwd_scratch_bytes},
};

}  // namespace

std::span<const Variant> variants() { return kTable; }

const Variant* find(std::string_view name) {
  for (const auto& v : kTable)
    if (v.name == name) return &v;
  return nullptr;
}

const char* last_gemm_error() { return detail::gemm_error.c_str(); }

}  // namespace hfnn::kernels::lstm
