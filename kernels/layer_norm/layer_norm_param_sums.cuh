// The backward's dgamma/dbeta sums of one access (kV elements a thread): dgamma += dy * xhat and
// dbeta += dy, held in registers or, in the *_smem variants, in shared memory as vectors of kW
// floats (float4, float2 or float: kW the floats of an access, at most 4). Shared by the wide and
// window backward variants (layer_norm_wide.cu, layer_norm_window.cu); stage_param, staged_index
// and load_staged write and read gamma (and the wide forward's beta) staged as floats.
#pragma once
#include <type_traits>

#include "kernels/common/device.cuh"

namespace hfnn::kernels::layer_norm {

template <int kW>
using SumVec = std::conditional_t<kW == 4, float4, std::conditional_t<kW == 2, float2, float>>;
template <int kW>
__device__ __forceinline__ float& sum_lane(SumVec<kW>& v, int k) {
  return reinterpret_cast<float*>(&v)[k];
}

// In registers: dg[k] += dy[k] * xhat[k], db[k] += dy[k].
template <int kV>
__device__ __forceinline__ void add_param_sums(float (&dg)[kV], float (&db)[kV], const float (&dv)[kV],
                                               const float (&xhat)[kV]) {
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    dg[k] = fmaf(dv[k], xhat[k], dg[k]);
    db[k] += dv[k];
  }
}

// In shared memory: slot(j) is this thread's vector j of the access's sums, dgamma's at j < kV / kW
// and dbeta's after them; each read, added to and written back once.
template <int kV, int kW, typename Slot>
__device__ __forceinline__ void add_param_sums(Slot&& slot, const float (&dv)[kV], const float (&xhat)[kV]) {
  constexpr int kQ = kV / kW;
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    SumVec<kW> g = slot(j), b = slot(kQ + j);
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      sum_lane<kW>(g, k) = fmaf(dv[kW * j + k], xhat[kW * j + k], sum_lane<kW>(g, k));
      sum_lane<kW>(b, k) += dv[kW * j + k];
    }
    slot(j) = g;
    slot(kQ + j) = b;
  }
}

// gamma (and the wide forward's beta) staged as floats in shared memory by the variants that read
// them there (a thread's columns are the same on every row): element k of access a (kV elements an
// access, `accesses` of them) sits in 16-byte chunk k / 4 of the access, and chunk j of every access
// comes before chunk j + 1 of any. A warp reading chunk j of consecutive accesses reads consecutive 16 bytes: no bank
// conflicts, where kV = 8 floats a thread side by side would be two-way. s is 16-byte aligned.
// Where store_staged and load_staged keep element k of access a.
template <int kV>
__device__ __forceinline__ int64_t staged_index(int64_t a, int k, int64_t accesses) {
  if constexpr (kV <= 4) return a * kV + k;
  else return ((k / 4) * accesses + a) * 4 + k % 4;
}

template <int kV>
__device__ __forceinline__ void store_staged(float* s, int64_t a, int64_t accesses, const float (&in)[kV]) {
  if constexpr (kV % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kV / 4; ++j)
      reinterpret_cast<float4*>(s)[j * accesses + a] = make_float4(in[4 * j], in[4 * j + 1], in[4 * j + 2], in[4 * j + 3]);
  } else if constexpr (kV == 2) {
    reinterpret_cast<float2*>(s)[a] = make_float2(in[0], in[1]);
  } else {
    s[a] = in[0];
  }
}

template <int kV>
__device__ __forceinline__ void load_staged(const float* s, int64_t a, int64_t accesses, float (&out)[kV]) {
  if constexpr (kV % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kV / 4; ++j) {
      const float4 f = reinterpret_cast<const float4*>(s)[j * accesses + a];
      out[4 * j] = f.x, out[4 * j + 1] = f.y, out[4 * j + 2] = f.z, out[4 * j + 3] = f.w;
    }
  } else if constexpr (kV == 2) {
    const float2 f = reinterpret_cast<const float2*>(s)[a];
    out[0] = f.x, out[1] = f.y;
  } else {
    out[0] = s[a];
  }
}

// Stages accesses [a0, a0 + n) of a parameter (`missing` everywhere where there is none: 1 for
// gamma, 0 for beta) into s, thread `tid` of `threads` an access at a time. Called after a kernel
// has issued its first row's loads, which stay in flight through it; the caller's barrier follows.
template <typename T, int kBytes>
__device__ __forceinline__ void stage_param(float* s, const T* param, float missing, int64_t a0, int64_t n,
                                            int64_t accesses, int tid, int threads) {
  constexpr int kV = kVec<T, kBytes>;
  for (int64_t a = tid; a < n; a += threads) {
    float g[kV];
    if (param) {
      unpack(load_pack<T, kBytes>(param + (a0 + a) * kV), g);
    } else {
#pragma unroll
      for (int k = 0; k < kV; ++k) g[k] = missing;
    }
    store_staged(s, a, accesses, g);
  }
}

// stage_param for a row read through its window at `lead` (layer_norm_window.cuh): access a's
// element k is column a * kV + k - lead, `missing` outside [0, cols); a parameter at any element
// alignment, read an element at a time, once a block. A thread stages at most kN accesses (n <= kN x
// threads), and issues all their loads before it stores any: one load latency, not kN (where a
// cluster visits one row, as 16 rows of 65,538 columns do, that latency is the kernel's).
template <typename T, int kN>
__device__ __forceinline__ void stage_param_window(float* s, const T* param, float missing, int64_t a0, int64_t n,
                                                   int64_t accesses, int tid, int threads, int lead, int64_t cols) {
  constexpr int kV = kVec<T, 16>;
  float g[kN][kV];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const int64_t a = tid + static_cast<int64_t>(j) * threads;
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const int64_t c = (a0 + a) * kV + k - lead;
      g[j][k] = param && a < n && c >= 0 && c < cols ? to_float(param[c]) : missing;
    }
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const int64_t a = tid + static_cast<int64_t>(j) * threads;
    if (a < n) store_staged(s, a, accesses, g[j]);
  }
}

}  // namespace hfnn::kernels::layer_norm
