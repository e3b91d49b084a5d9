// hfnn's own attention core for short sequences (issue 11): softmax(Q K^T * scale) V and its
// backward, each (batch, head) computed by one thread block, one warp per 16 query rows, with the
// warp's whole row of scores in registers.
//
// Where torch's fused kernels tile the key axis and keep running maxima (flash) or re-read K and V
// per query tile, a sequence of at most 128 tokens fits in one block whole: Q, K and V are read from
// global memory once, the softmax is exact, and the backward needs neither the forward's output nor
// a second pass: D_i = sum_j P_ij dP_ij (equal to flash's rowsum(dO * O)) comes from the block's
// own P and dP. The products are tensor-core mma.sync tiles (m16n8k16, fp16 or bf16 in, float32
// accumulation); the softmax, its log-sum-exp and the score gradients are float32.
//
// Inputs are [B, H, L, Dh] views given by strides (the last dimension contiguous), as the op's
// input projection leaves them in place; outputs are written through strides too, so the
// gradients of a packed projection land packed. Deterministic: every sum in a fixed order.
//
// Torch-free: the op (src/multi_head_attention_op.cpp) fills these structs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/dtype.h"
#include "kernels/common/launch.h"

#if HFNN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hfnn::kernels::multihead_attention {

struct ShortShape {
  int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, head_dim = 0;  // B, H, L, S, Dh
  DType dtype = DType::kBFloat16;
  bool causal = false;  // top-left causal, as torch's is_causal: key j masked for query i < j
  DeviceInfo device;
};

// Element strides of a [B, H, L, Dh] view (the Dh stride is 1).
struct Strides {
  int64_t b = 0, h = 0, l = 0;
};

struct ShortFwdParams {
  ShortShape shape;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  Strides sq, sk, sv;
  void* o = nullptr;  // [B, H, L, Dh] through so
  Strides so;
  float* lse = nullptr;  // [B, H, L] contiguous: each row's log2-sum-exp2 of its scaled scores (the backward's)
  float scale = 0.f;     // of the scores; 1/sqrt(Dh) as torch's SDPA
};

struct ShortBwdParams {
  ShortShape shape;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  Strides sq, sk, sv, sdo;
  const float* lse = nullptr;  // the forward's
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  Strides sdq, sdk, sdv;
  float scale = 0.f;
};

// The longest sequence and the widest head the core takes.
inline constexpr int64_t kShortMaxLen = 128;
inline constexpr int64_t kShortMaxHeadDim = 128;

// Dynamic shared memory of a block, forward and backward; 0 for a shape outside the limits above.
std::size_t short_fwd_smem(const ShortShape& s);
std::size_t short_bwd_smem(const ShortShape& s);

// Whether both the forward and the backward launch for this shape on s.device: fp16 or bf16, head
// size a multiple of 16 up to 128, L and S from 1 to 128, both blocks' shared memory under the
// device's opt-in limit, compute capability 8.0 or later. Empty `why` where true, else the reason.
bool short_supports(const ShortShape& s, std::string* why = nullptr);
// And for these tensors: the Dh stride 1, every pointer 16-byte aligned and every other stride a
// multiple of 8 elements (rows move as 16-byte vectors).
bool short_supports(const ShortFwdParams& p, std::string* why = nullptr);
// One [B, H, L, Dh] view's part of that: its data 16-byte aligned, its strides multiples of 8.
bool short_view_ok(const void* data, const Strides& s);
bool short_supports(const ShortBwdParams& p, std::string* why = nullptr);

#if HFNN_WITH_CUDA
cudaError_t short_forward(const ShortFwdParams& p, cudaStream_t stream);
cudaError_t short_backward(const ShortBwdParams& p, cudaStream_t stream);
#endif

}  // namespace hfnn::kernels::multihead_attention
