// LayerNorm over the last `cols` elements of a row-major [rows, cols] tensor.
//
//   y     = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)   (biased variance)
//   dx    = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)),  g = dy * gamma, xhat = (x - mean) * rstd
//   dgamma = sum_rows(dy * xhat),  dbeta = sum_rows(dy)
//
// Inputs and outputs are in the tensor's dtype; all arithmetic is float32, mean and rstd are float32
// [rows] arrays, exactly what aten::native_layer_norm returns on CUDA, so our backward pairs with
// torch's forward and the other way round.
//
// The kernels see only these parameter structs and a stream; torch lives in src/. Every variant
// has a stable name (the dispatch database stores names: never rename one) and a supports() check
// the caller must pass before run(): it is true exactly where the launch runs on `device` (shared
// memory, static and dynamic, against the opt-in limit; threads against the kernel's registers;
// clusters where the device has them), so run() fails only for a reason outside the variant (an
// out-of-memory device, a sticky error from earlier work).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/common/dtype.h"
#include "kernels/common/launch.h"

#if HFNN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hfnn::kernels::layer_norm {

struct FwdParams {
  const void* x = nullptr;      // [rows, cols], contiguous
  const void* gamma = nullptr;  // [cols] or null (no affine)
  const void* beta = nullptr;   // [cols] or null (no bias)
  void* y = nullptr;            // [rows, cols]
  float* mean = nullptr;        // [rows] or null (not needed, e.g. inference)
  float* rstd = nullptr;        // [rows] or null
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-5f;
  DType dtype = DType::kFloat32;  // of x, y, gamma and beta alike
  DeviceInfo device;              // of the device the kernels run on: supports() checks its limits
};

struct BwdParams {
  const void* dy = nullptr;     // [rows, cols]
  const void* x = nullptr;      // [rows, cols]
  const float* mean = nullptr;  // [rows]
  const float* rstd = nullptr;  // [rows]
  const void* gamma = nullptr;  // [cols] or null (no affine: gamma taken as 1)
  void* dx = nullptr;           // [rows, cols] or null (not needed)
  void* dgamma = nullptr;       // [cols] or null
  void* dbeta = nullptr;        // [cols] or null
  void* workspace = nullptr;    // workspace_bytes(params) bytes of device memory, or null if that is 0
  // bytes at `workspace`: run() never uses more (a smaller grid instead; an error where even its
  // smallest grid does not fit, e.g. bwd_wide_win_c*_smem's one lead period of partial rows)
  std::size_t workspace_size = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  DeviceInfo device;  // of the device the kernels run on: limits, and the SMs persistent grids fill
};

// The float64 CPU reference. Pointers are host pointers; the same struct layout as the kernels.
void reference_fwd(const FwdParams& p);
void reference_bwd(const BwdParams& p);

#if HFNN_WITH_CUDA
struct FwdVariant {
  std::string_view name;
  std::string_view idea;  // one line: what the variant does differently
  bool (*supports)(const FwdParams&);
  cudaError_t (*run)(const FwdParams&, cudaStream_t);
};

struct BwdVariant {
  std::string_view name;
  std::string_view idea;
  bool (*supports)(const BwdParams&);
  std::size_t (*workspace_bytes)(const BwdParams&);
  cudaError_t (*run)(const BwdParams&, cudaStream_t);
};

std::span<const FwdVariant> fwd_variants();
std::span<const BwdVariant> bwd_variants();
const FwdVariant* find_fwd(std::string_view name);  // null if no variant has that name
const BwdVariant* find_bwd(std::string_view name);
#endif

}  // namespace hfnn::kernels::layer_norm
