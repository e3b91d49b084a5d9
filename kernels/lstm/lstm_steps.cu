// The step-loop LSTM variant, for shapes the persistent one cannot hold (W_hh too large to stay on
// chip, batches whose state does not fit a block): per step one cuBLASLt GEMM h_{t-1} W_hh^T
// accumulated onto the step's projection (beta 1, float32 sums kept) and one fused gate kernel;
// backward per step a gate-gradient kernel and one GEMM dG_t W_hh for dh. The same workspace, the
// same GEMMs after the loop (lstm_common.cu).
//
// h_{t-1} enters the step GEMM in the dtype (the history hd, which cuBLASLt multiplies on tensor
// cores), as cuDNN rounds it; the persistent variant keeps it in float32.
//
// dG_t enters the backward's dh GEMM in 16 bits too, but split: hi = dG rounded to the dtype and
// lo = (dG - hi) rounded, stacked as the GEMM's 2B rows (dgs), so one GEMM on tensor cores gives
// hi W_hh and lo W_hh in float32, and the next gate kernel (or, after the last step, dh0's) adds
// the two: about 16 bits of dG's mantissa in bf16 (up to 22 in fp16, where lo may be subnormal)
// instead of 8 (11). dh = dG_t W_hh sums 4H terms that can cancel, and one rounding of dG was
// amplified by it: H = 1, bf16, dh0 7.4e-2 from float64 where torch's own error was 1.2e-2 (H200,
// test_lstm.py's dense sweep; LstmKernels.SixteenBitDh0SurvivesCancellation reproduces it). One
// GEMM of 2B rows rather than two of B (hi, then lo with beta 1): the same products, and one
// launch a step as before. float32 is unchanged (one GEMM of B rows on float32 dG).
#include "kernels/lstm/lstm_common.cuh"

namespace hfnn::kernels::lstm::detail {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    gate_fwd_kernel(int64_t bh, int hidden, float* gates_t, const float* c_prev, const T* c0, const T* b_ih,
                    const T* b_hh, float* c_t, T* h_slot, T* y_t, T* h_n, T* c_n) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= bh) return;
  const int64_t H = hidden, b = e / H, unit = e - b * H;
  float* g = gates_t + b * 4 * H + unit;  // the projection plus h_{t-1} W_hh^T in, the gates out
  float pre[4];
#pragma unroll
  for (int gate = 0; gate < 4; ++gate)
    pre[gate] = g[gate * H] + load_or_zero(b_ih, gate * H + unit) + load_or_zero(b_hh, gate * H + unit);
  const Cell c = cell_forward(pre[0], pre[1], pre[2], pre[3], c_prev ? c_prev[e] : load_or_zero(c0, e));
  g[0] = c.i, g[H] = c.f, g[2 * H] = c.g, g[3 * H] = c.o;
  c_t[e] = c.c;
  const T h = from_float<T>(c.h);
  h_slot[e] = h;
  y_t[e] = h;
  if (h_n) {
    h_n[e] = h;
    c_n[e] = from_float<T>(c.c);
  }
}

// What of dG its value in the dtype `hi` leaves out: dG - hi (exact in float32) rounded to the
// dtype; zero where that is not finite (dG NaN, or past fp16's range: hi carries it alone, so the
// products are inf as before, not inf - inf).
template <typename T>
__device__ __forceinline__ T low_part(float value, T hi) {
  const float rest = value - to_float(hi);
  return from_float<T>(isfinite(rest) ? rest : 0.0f);
}

// The two products of the 16-bit dh GEMM (header comment) summed, or float32's one.
__device__ __forceinline__ float dh_of(const float* dh, int64_t bh, int64_t e, bool split) {
  return split ? dh[e] + dh[bh + e] : dh[e];
}

// dh_rec: float32 (the previous iteration's GEMM: [2, B, H] where split) or, at the first, dh_n in
// the dtype; dc likewise (dc_state is updated in place). dgs_t: the dh GEMM's operand [2B, 4H] (hi
// rows, then lo rows; null for float32).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    gate_bwd_kernel(int64_t bh, int hidden, const float* gates_t, const float* c_t, const float* c_prev, const T* c0,
                    const T* dy_t, const float* dh_rec, const T* dh_n, float* dc_state, const T* dc_n, bool first,
                    float* dg_t, T* dg16_t, T* dgs_t, T* dc0) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= bh) return;
  const int64_t H = hidden, b = e / H, unit = e - b * H, row = b * 4 * H + unit;
  const float* g = gates_t + row;
  const float dh = (first ? load_or_zero(dh_n, e) : dh_of(dh_rec, bh, e, dgs_t != nullptr)) + load_or_zero(dy_t, e);
  const float dc = first ? load_or_zero(dc_n, e) : dc_state[e];
  const CellGrad d =
      cell_backward(g[0], g[H], g[2 * H], g[3 * H], c_t[e], c_prev ? c_prev[e] : load_or_zero(c0, e), dh, dc);
  dc_state[e] = d.dc_prev;
  if (dc0) dc0[e] = from_float<T>(d.dc_prev);
  float* out = dg_t + row;
  out[0] = d.di, out[H] = d.df, out[2 * H] = d.dg, out[3 * H] = d.dout;
  if (dg16_t) {
    const T hi[4] = {from_float<T>(d.di), from_float<T>(d.df), from_float<T>(d.dg), from_float<T>(d.dout)};
    const float value[4] = {d.di, d.df, d.dg, d.dout};
    T* o = dg16_t + row;
    T* s_hi = dgs_t + row;
    T* s_lo = dgs_t + bh * 4 + row;  // row b of the lo half: B rows of 4H further
#pragma unroll
    for (int gate = 0; gate < 4; ++gate) {
      o[gate * H] = hi[gate];
      s_hi[gate * H] = hi[gate];
      s_lo[gate * H] = low_part(value[gate], hi[gate]);
    }
  }
}

// dh0 in the dtype from the last dh GEMM's two float32 products (16-bit only).
template <typename T>
__global__ void __launch_bounds__(kThreads) dh0_kernel(int64_t bh, const float* dh, T* dh0) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e < bh) dh0[e] = from_float<T>(dh_of(dh, bh, e, true));
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

bool steps_supports(const Shape& s) { return valid_shape(s) && s.device.device >= 0; }

cudaError_t steps_forward(const FwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  if (!steps_supports(s)) return cudaErrorInvalidConfiguration;
  if (const cudaError_t e = input_projection(p, stream); e != cudaSuccess) return e;
  return dispatch_dtype(s.dtype, [&]<typename T>() -> cudaError_t {
    const FwdBuffers<T> ws = fwd_buffers<T>(s, p.workspace);
    const int64_t T_ = s.steps, B = s.batch, H = s.hidden, BH = B * H, G = 4 * H;
    T* hd = ws.hd;  // float32 with H a multiple of 4: the same memory as hs
    const int64_t first = initial_slot(T_, p.reverse);
    const std::size_t slot_bytes = static_cast<std::size_t>(BH) * sizeof(T);
    const cudaError_t init = p.h0 ? cudaMemcpyAsync(hd + first * BH, p.h0, slot_bytes, cudaMemcpyDeviceToDevice, stream)
                                  : cudaMemsetAsync(hd + first * BH, 0, slot_bytes, stream);
    if (init != cudaSuccess) return init;
    for (int64_t step = 0; step < T_; ++step) {
      const int64_t t = time_of(step, T_, p.reverse);
      float* gates_t = ws.gates + t * B * G;
      if (step > 0 || p.h0) {  // a zero h_{t-1} adds nothing
        gemm::Params g;
        g.dtype = s.dtype;
        g.float32_out = s.dtype != DType::kFloat32;
        g.m = B, g.n = G, g.k = H;
        g.a = hd + read_slot(t, p.reverse) * BH, g.lda = H;
        g.b = p.w_hh, g.ldb = H, g.trans_b = true;
        g.d = gates_t, g.ldd = G, g.beta = 1.0f;
        if (const cudaError_t e = run_gemm(p.gemm, g, stream); e != cudaSuccess) return e;
      }
      const bool last = step + 1 == T_;
      const float* c_prev = step > 0 ? ws.cs + time_of(step - 1, T_, p.reverse) * BH : nullptr;
      if (const cudaError_t e = launch_plain(
              gate_fwd_kernel<T>, dim3(blocks_for(BH)), dim3(kThreads), 0, stream, BH, static_cast<int>(H), gates_t,
              c_prev, static_cast<const T*>(p.c0), static_cast<const T*>(p.b_ih), static_cast<const T*>(p.b_hh),
              ws.cs + t * BH, hd + write_slot(t, p.reverse) * BH, static_cast<T*>(p.y) + t * BH,
              last ? static_cast<T*>(p.h_n) : nullptr, last ? static_cast<T*>(p.c_n) : nullptr);
          e != cudaSuccess)
        return e;
    }
    return cudaSuccess;
  });
}

cudaError_t steps_backward(const BwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  if (!steps_supports(s)) return cudaErrorInvalidConfiguration;
  const cudaError_t err = dispatch_dtype(s.dtype, [&]<typename T>() -> cudaError_t {
    const FwdBuffers<T> ws = fwd_buffers<T>(s, const_cast<void*>(p.workspace));
    const BwdBuffers<T> sc = bwd_buffers<T>(s, p.scratch);
    const int64_t T_ = s.steps, B = s.batch, H = s.hidden, BH = B * H, G = 4 * H;
    const bool wide = s.dtype != DType::kFloat32;  // 16-bit: dG split for the dh GEMM (header comment)
    T* dgs = wide ? reinterpret_cast<T*>(static_cast<unsigned char*>(p.scratch) + bwd_layout(s).dgs) : nullptr;
    const T* dy = static_cast<const T*>(p.dy);
    for (int64_t step = T_ - 1; step >= 0; --step) {
      const int64_t t = time_of(step, T_, p.reverse);
      const float* c_prev = step > 0 ? ws.cs + time_of(step - 1, T_, p.reverse) * BH : nullptr;
      if (const cudaError_t e = launch_plain(
              gate_bwd_kernel<T>, dim3(blocks_for(BH)), dim3(kThreads), 0, stream, BH, static_cast<int>(H),
              static_cast<const float*>(ws.gates + t * B * G), static_cast<const float*>(ws.cs + t * BH), c_prev,
              static_cast<const T*>(p.c0), dy ? dy + t * BH : nullptr, static_cast<const float*>(sc.dh),
              static_cast<const T*>(p.dh_n), sc.dc, static_cast<const T*>(p.dc_n), step + 1 == T_, sc.dg + t * B * G,
              wide ? sc.dg16 + t * B * G : nullptr, dgs, step == 0 ? static_cast<T*>(p.dc0) : nullptr);
          e != cudaSuccess)
        return e;
      // dh into h_{t-1} = dG_t W_hh: float32 for the next step, the dtype's dh0 at the last. 16-bit:
      // [hi; lo] W_hh, 2B rows of float32 (dh0 from their sums after the last).
      gemm::Params g;
      g.dtype = s.dtype;
      g.m = wide ? 2 * B : B, g.n = H, g.k = G;
      g.a = wide ? dgs : sc.dg16 + t * B * G, g.lda = G;
      g.b = p.w_hh, g.ldb = H;
      if (step > 0 || wide) {
        g.d = sc.dh, g.float32_out = wide;
      } else {
        g.d = p.dh0;
      }
      g.ldd = H;
      if (const cudaError_t e = run_gemm(p.gemm, g, stream); e != cudaSuccess) return e;
    }
    if (wide)
      if (const cudaError_t e = launch_plain(dh0_kernel<T>, dim3(blocks_for(BH)), dim3(kThreads), 0, stream, BH,
                                             static_cast<const float*>(sc.dh), static_cast<T*>(p.dh0));
          e != cudaSuccess)
        return e;
    return cudaSuccess;
  });
  if (err != cudaSuccess) return err;
  return backward_gemms(p, stream);
}

}  // namespace hfnn::kernels::lstm::detail
