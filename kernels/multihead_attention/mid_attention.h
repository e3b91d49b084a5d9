// hfnn's attention backward for sequences of up to 256 tokens (issue 11): dQ, dK and dV of
// softmax(Q K^T * scale) V from a forward that saved its output O and its rows' log-sum-exp
// (torch's cuDNN, flash and memory-efficient kernels do), each (batch, head) computed by one thread
// block, one warp per 16 query rows.
//
// Where torch's fused backward kernels split a head over blocks along the keys, they need two more
// passes over memory: D_i = rowsum(dO * O) before, and dQ accumulated in float32 across blocks by
// atomics, then converted to the dtype after (cuDNN's at [200, 256, 1024, 16] on an H100: 159 and
// 122 of its 845 us). A sequence of up to 256 tokens fits in one block: Q, K, V, dO and O are read
// once into shared memory, D_i is summed from O's rows there, and dQ accumulates in
// each warp's registers over the keys, 64 keys a step: the warp's scores, P (from the forward's
// log-sum-exp), dP, dS and its part of dQ in registers, P and dS of the step staged in shared
// memory for dV = P^T dO and dK = dS^T Q, which the block's warps then share in 16 x 32 tiles (32
// x 32, a warp each, where not causal with whole steps and 128 rows or more). The products are
// mma.sync m16n8k16 (on Hopper, at head size 64, the scores and dP are wgmma's, and causal dQ), fp16 or
// bf16 in, float32 accumulation; softmax and gradients in float32; every sum in a fixed order
// (deterministic).
//
// Inputs and outputs are [B, H, L, Dh] views given by strides (short_attention.h's Strides), so
// the gradients of a packed projection land packed. Torch-free: the op fills the struct.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/multihead_attention/short_attention.h"

namespace hfnn::kernels::multihead_attention {

struct MidBwdParams {
  ShortShape shape;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  Strides sq, sk, sv, so, sdo;
  // The forward's log-sum-exp of each row's scaled scores, [B, H, L] with L contiguous (the caller
  // makes it so): row i of (b, h) at lse[b lse_b + h lse_h + i]. lse_to_log2 turns a stored value
  // into base 2: log2(e) for the natural-log ones torch's kernels keep.
  const float* lse = nullptr;
  int64_t lse_b = 0, lse_h = 0;
  float lse_to_log2 = 1.4426950408889634f;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  Strides sdq, sdk, sdv;
  float scale = 0.f;  // of the scores; 1/sqrt(Dh) as torch's SDPA
  // Optional (null: not made): each block's column sums of its dQ over the query rows, float32, at
  // dq_sums[b dq_sums_b + h Dh + d] ([B, H Dh] with dq_sums_b = H Dh): summed over the batch, the
  // query rows of the input projection's bias gradient, which the op's GEMV over dQ (105 MB in
  // bf16 at [200, 256, 1024, 16]) would otherwise read back from memory.
  float* dq_sums = nullptr;
  int64_t dq_sums_b = 0;
};

// The longest sequence (queries and keys) and the widest head the backward takes.
inline constexpr int64_t kMidMaxLen = 256;
inline constexpr int64_t kMidMaxHeadDim = 64;

// Dynamic shared memory of a block; 0 for a shape outside the limits above.
std::size_t mid_bwd_smem(const ShortShape& s);

// Whether the backward launches for this shape on s.device: fp16 or bf16, head size 16, 32, 48 or
// 64, L and S from 1 to 256, the block's shared memory (Q, K, V, dO, a step's P and dS: 218 KB at
// 256 x 256 x 64, 195 KB with every array unpadded in Hopper's swizzled kernel) under the device's
// opt-in limit, compute capability 8.0 or later. Empty `why`
// where true, else the reason.
bool mid_supports(const ShortShape& s, std::string* why = nullptr);
// And for these tensors: every [B, H, L, Dh] view 16-byte aligned with strides multiples of 8
// elements (short_view_ok), the log-sum-exp's rows contiguous.
bool mid_supports(const MidBwdParams& p, std::string* why = nullptr);

#if HFNN_WITH_CUDA
cudaError_t mid_backward(const MidBwdParams& p, cudaStream_t stream);
#endif

}  // namespace hfnn::kernels::multihead_attention
