// What the LSTM variants share: the workspace layouts, step and slot arithmetic, the gate
// functions, the GEMMs (cuBLASLt, with a plain kernel where it has no algorithm) and the parts of
// the backward every variant runs after its recurrence (dW_ih, dW_hh, db, dx). Device code and
// host helpers; kernels/lstm/ only.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/device.cuh"
#include "kernels/common/gemm.h"
#include "kernels/lstm/lstm.h"
#include "kernels/lstm/lstm_layout.h"

namespace hfnn::kernels::lstm::detail {

__host__ __device__ inline int64_t time_of(int64_t step, int64_t steps, bool reverse) {
  return reverse ? steps - 1 - step : step;
}
__host__ __device__ inline int64_t read_slot(int64_t t, bool reverse) { return reverse ? t + 1 : t; }
__host__ __device__ inline int64_t write_slot(int64_t t, bool reverse) { return reverse ? t : t + 1; }
__host__ __device__ inline int64_t initial_slot(int64_t steps, bool reverse) { return reverse ? steps : 0; }

// The activations on the recurrence's critical path, a few instructions each (ex2.approx and
// rcp.approx, MUFU) where expf, tanhf and an IEEE division are longer sequences: the forward's gate
// phase is one warp's serial chain while the other warps wait (384 instructions a step at the seed
// size, H100, 2026-11-25; the step-loop variant's gate kernels use them too). __expf's error is a few ulp where the gates are not saturated,
// __fdividef's 2 ulp; the limits come out right (an infinite __expf gives 0 through __fdividef, 0
// gives 1). tanh as 1 - 2 / (1 + e^2x): absolute error about 1e-7 near 0 (1 - (1 - x) cancels),
// a few ulp elsewhere; the tests' float64 gates bound both.
__device__ __forceinline__ float sigmoid(float v) { return __fdividef(1.0f, 1.0f + __expf(-v)); }
__device__ __forceinline__ float fast_tanh(float v) { return 1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * v)); }

// Element i of an optional array of T as float; 0 where the array is absent.
template <typename T>
__device__ __forceinline__ float load_or_zero(const T* p, int64_t i) {
  return p ? to_float(p[i]) : 0.0f;
}

// One step of the cell for one (batch, unit): pre-activations in, gates after their activations
// and c_t out. `c` is c_{t-1} on entry.
struct Cell {
  float i, f, g, o, c, h;
};
__device__ __forceinline__ Cell cell_forward(float pi, float pf, float pg, float po, float c_prev) {
  Cell r;
  r.i = sigmoid(pi), r.f = sigmoid(pf), r.g = fast_tanh(pg), r.o = sigmoid(po);
  r.c = r.f * c_prev + r.i * r.g;
  r.h = r.o * fast_tanh(r.c);
  return r;
}

// The cell's backward for one (batch, unit): dh (into h_t, dy included) and dc (into c_t from
// later steps) in; the four pre-activation gradients and dc into c_{t-1} out.
struct CellGrad {
  float di, df, dg, dout, dc_prev;
};
__device__ __forceinline__ CellGrad cell_backward(float i, float f, float g, float o, float c, float c_prev, float dh,
                                                  float dc) {
  const float tc = fast_tanh(c);
  const float dct = dc + dh * o * (1.0f - tc * tc);
  CellGrad r;
  r.di = dct * g * i * (1.0f - i);
  r.df = dct * c_prev * f * (1.0f - f);
  r.dg = dct * i * (1.0f - g * g);
  r.dout = dh * tc * o * (1.0f - o);
  r.dc_prev = dct * f;
  return r;
}

// D = op(A) op(B) (+ beta D) through cuBLASLt (kernels/common/gemm.h) with the context's handle and
// workspace; where cuBLASLt has no algorithm for the shape (odd leading dimensions of 16-bit
// matrices), a plain tiled kernel with float sums. A cuBLASLt failure returns cudaErrorUnknown and
// leaves its message for last_gemm_error().
cudaError_t run_gemm(const GemmContext& ctx, gemm::Params p, cudaStream_t stream);
// The message of this thread's last library failure (cuBLASLt, cuDNN): last_gemm_error().
extern thread_local std::string gemm_error;

// The input projection: ws.gates [T*B, 4H] (float) = x [T*B, I] W_ih^T, sums in float32.
cudaError_t input_projection(const FwdParams& p, cudaStream_t stream);

// After the recurrence, with dg/dg16 filled for every step: dW_ih = dG^T x, dW_hh = dG^T h_read,
// dx = dG W_ih (GEMMs with float32 sums on dG in the dtype: see lstm_common.cu) and db = dG's
// column sums (float32, fixed order).
cudaError_t backward_gemms(const BwdParams& p, cudaStream_t stream);

// The variants (lstm_persistent.cu, lstm_steps.cu, lstm_cudnn.cu).
bool persistent_supports(const Shape& s);
cudaError_t persistent_forward(const FwdParams& p, cudaStream_t stream);
cudaError_t persistent_backward(const BwdParams& p, cudaStream_t stream);
bool steps_supports(const Shape& s);
cudaError_t steps_forward(const FwdParams& p, cudaStream_t stream);
cudaError_t steps_backward(const BwdParams& p, cudaStream_t stream);
bool cudnn_supports(const Shape& s);
cudaError_t cudnn_forward(const FwdParams& p, cudaStream_t stream);
cudaError_t cudnn_backward(const BwdParams& p, cudaStream_t stream);
std::size_t cudnn_fwd_workspace_bytes(const Shape& s);
std::size_t cudnn_bwd_scratch_bytes(const Shape& s);

// Typed views of the workspaces.
template <typename T>
struct FwdBuffers {
  float *gates, *cs, *hs;
  T* hd;
};
template <typename T>
FwdBuffers<T> fwd_buffers(const Shape& s, void* workspace) {
  const FwdLayout l = fwd_layout(s);
  auto* base = static_cast<unsigned char*>(workspace);
  return {reinterpret_cast<float*>(base + l.gates), reinterpret_cast<float*>(base + l.cs),
          reinterpret_cast<float*>(base + l.hs), reinterpret_cast<T*>(base + l.hd)};
}
template <typename T>
struct BwdBuffers {
  float* dg;
  T* dg16;
  float *dh, *dc, *dbp;
  unsigned* flags;
};
template <typename T>
BwdBuffers<T> bwd_buffers(const Shape& s, void* scratch) {
  const BwdLayout l = bwd_layout(s);
  auto* base = static_cast<unsigned char*>(scratch);
  return {reinterpret_cast<float*>(base + l.dg), reinterpret_cast<T*>(base + l.dg16),
          reinterpret_cast<float*>(base + l.dh), reinterpret_cast<float*>(base + l.dc),
          reinterpret_cast<float*>(base + l.dbp), reinterpret_cast<unsigned*>(base + l.flags)};
}

}  // namespace hfnn::kernels::lstm::detail
