// One LSTM layer in one direction, time-major, forward and backward (nn.LSTM's formulation,
// lstm_reference.h):
//
//   gates_t = x_t W_ih^T + b_ih + h_prev W_hh^T + b_hh     [B, 4H], quarters i, f, g, o
//   c_t = sigmoid(f) c_prev + sigmoid(i) tanh(g),  h_t = sigmoid(o) tanh(c_t),  y_t = h_t
//
// where h_prev/c_prev are the previous step's (h0/c0, or zeros, at the first). With `reverse` the
// steps run t = T-1 .. 0 (the backward direction of a bidirectional layer), x and y stay in time
// order. Several layers and both directions are this layer composed by the caller.
//
// Inputs and outputs are in the tensor's dtype (fp32, fp16, bf16); all arithmetic is float32 and
// the cell state float32. The forward leaves in a float32 workspace what the backward reads (the
// gates after their activations, c_t, the h each step read); its layout is hfnn's kernels' own, the
// same for both, so either's backward reads the other's forward workspace. The cuDNN variant keeps
// cuDNN's (Variant::fwd_workspace_bytes): its forward's workspace goes to its own backward.
//
// The kernels see only these parameter structs and a stream; torch lives in src/lstm_op.cpp.
// Every variant has a stable name (the dispatch database stores names: never rename one) and a
// supports() check true exactly where both its forward and its backward launch on `device` (shared
// memory against the opt-in limit, every block of a cooperative grid resident), so run() fails only
// for a reason outside the variant (memory, a sticky error from earlier work, cuBLASLt, cuDNN).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/common/dtype.h"
#include "kernels/common/launch.h"

#if HFNN_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

namespace hfnn::kernels::lstm {

// What sizes the problem and picks a variant: supports() and the workspace sizes read only this.
struct Shape {
  int64_t steps = 0, batch = 0, input = 0, hidden = 0;  // T, B, I, H
  DType dtype = DType::kFloat32;                        // of every tensor argument
  DeviceInfo device;                                    // of the device the kernels run on
};

// cuBLASLt for the GEMMs (kernels/common/gemm.h): the caller's handle and workspace (torch's, in
// the op), on the same stream as the kernels.
struct GemmContext {
#if HFNN_WITH_CUDA
  cublasLtHandle_t handle = nullptr;
#else
  void* handle = nullptr;
#endif
  void* workspace = nullptr;
  std::size_t workspace_size = 0;
  bool tf32 = false;  // float32 GEMMs in TF32 (the op: as torch.backends.cudnn.rnn.fp32_precision)
};

struct FwdParams {
  Shape shape;
  const void* x = nullptr;     // [T, B, I]
  const void* w_ih = nullptr;  // [4H, I]
  const void* w_hh = nullptr;  // [4H, H]
  const void* b_ih = nullptr;  // [4H] or null
  const void* b_hh = nullptr;  // [4H] or null
  const void* h0 = nullptr;    // [B, H] or null: zeros
  const void* c0 = nullptr;    // [B, H] or null: zeros
  void* y = nullptr;           // [T, B, H]
  void* h_n = nullptr;         // [B, H]
  void* c_n = nullptr;         // [B, H]
  bool reverse = false;        // steps t = T-1 .. 0
  void* workspace = nullptr;   // fwd_workspace_bytes(shape), 16-byte aligned; the backward reads it
  GemmContext gemm;
};

struct BwdParams {
  Shape shape;
  const void* dy = nullptr;     // [T, B, H], or null: zeros
  const void* dh_n = nullptr;   // [B, H] or null: zeros
  const void* dc_n = nullptr;   // [B, H] or null: zeros
  const void* x = nullptr;      // [T, B, I]: the forward's
  const void* w_ih = nullptr;   // [4H, I]
  const void* w_hh = nullptr;   // [4H, H]
  const void* c0 = nullptr;     // [B, H] or null: the forward's
  const void* workspace = nullptr;  // the forward's workspace, read only (a second backward reads it again)
  void* scratch = nullptr;      // bwd_scratch_bytes(shape), 16-byte aligned
  void* dx = nullptr;           // [T, B, I]
  void* dw_ih = nullptr;        // [4H, I]
  void* dw_hh = nullptr;        // [4H, H]
  void* db = nullptr;           // [4H]: the gradient of b_ih and of b_hh alike
  void* dh0 = nullptr;          // [B, H]
  void* dc0 = nullptr;          // [B, H]
  bool reverse = false;         // as the forward ran
  GemmContext gemm;
};

// Bytes of the forward's workspace (float32 gates [T, B, 4H], c_t [T, B, H], the h history
// [T+1, B, H rounded up to 4] in float32 and [T+1, B, H] in the dtype where that is another
// buffer: 16-bit, or H not a multiple of 4; lstm_layout.h) and of the backward's scratch
// (the gate gradients [T, B, 4H] in float32 and the dtype, the recurrent state, partial sums).
// The same for hfnn's kernels (Variant::fwd_workspace_bytes gives each variant's); 0 for an empty
// or invalid shape.
std::size_t fwd_workspace_bytes(const Shape& s);
std::size_t bwd_scratch_bytes(const Shape& s);

// The float64 CPU reference over the same structs with host pointers (lstm_reference.h, one layer
// and direction): fills y, h_n, c_n, and dx, dw_ih, dw_hh, db, dh0, dc0 in the params' dtype. The
// workspaces are not used; the backward recomputes the forward (b_ih/b_hh/h0 from `fwd`, which
// must describe the same layer).
void reference_fwd(const FwdParams& p);
void reference_bwd(const FwdParams& fwd, const BwdParams& p);

#if HFNN_WITH_CUDA
struct Variant {
  std::string_view name;
  std::string_view idea;  // one line: what the variant does differently
  bool (*supports)(const Shape&);
  cudaError_t (*forward)(const FwdParams&, cudaStream_t);
  cudaError_t (*backward)(const BwdParams&, cudaStream_t);
  // The variant's workspace and scratch sizes: fwd_workspace_bytes / bwd_scratch_bytes above for
  // hfnn's kernels (whose backward reads any of them's forward workspace); cuDNN's variant has its
  // own (lstm_cudnn.cu), so a forward's workspace goes to the same variant's backward.
  std::size_t (*fwd_workspace_bytes)(const Shape&);
  std::size_t (*bwd_scratch_bytes)(const Shape&);
};

std::span<const Variant> variants();
const Variant* find(std::string_view name);  // null if no variant has that name

// The message of the last cuBLASLt failure on this thread (a run() that returned
// cudaErrorUnknown after a GEMM failed), for the caller's error.
const char* last_gemm_error();
#endif

}  // namespace hfnn::kernels::lstm
