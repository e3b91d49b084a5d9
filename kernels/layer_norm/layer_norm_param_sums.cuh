// The backward's dgamma/dbeta sums of one access (kV elements a thread): dgamma += dy * xhat and
// dbeta += dy, held in registers or, in the *_smem variants, in shared memory as vectors of kW
// floats (float4, float2 or float: kW the floats of an access, at most 4). Shared by the wide and
// window backward variants (layer_norm_wide.cu, layer_norm_window.cu); stage_param, staged_index
// and load_staged write and read gamma (and the wide forward's beta) staged as floats.
#pragma once
#include <type_traits>

#include "kernels/common/device.cuh"
#include "kernels/layer_norm/layer_norm_window.cuh"

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

// Floats 4q .. 4q + 3 of access a in load_staged's layout (the whole access where kV < 4, q = 0):
// a kernel that takes an access's floats a sum vector at a time.
template <int kV>
__device__ __forceinline__ void load_staged_part(const float* s, int64_t a, int64_t accesses, int q,
                                                 float (&out)[kV < 4 ? kV : 4]) {
  if constexpr (kV % 4 == 0) {
    const float4 f = reinterpret_cast<const float4*>(s)[q * accesses + a];
    out[0] = f.x, out[1] = f.y, out[2] = f.z, out[3] = f.w;
  } else {
    load_staged(s, a, accesses, out);
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

// A parameter (gamma, beta: cols elements at any element alignment) read for rows at `lead`
// through their windows (layer_norm_window.cuh): the row's window pack a (columns a x kV - lead
// onward) is element o onward of the parameter's own window pack a + shift and the next, two
// aligned 16-byte loads shifted into place (shift_pack), where an element at a time took kV loads
// and as many bounds tests (the window forward issued 1.8x the aligned one's instructions at 16
// rows of 65,538 columns, one row a cluster: bench/README.md, "Wide rows not 16-byte aligned
// through their windows at cluster scale"). Null param: `missing` everywhere.
template <typename T>
struct ParamWindow {
  const T* pw = nullptr;  // the parameter's window (16-byte aligned); null: no parameter
  int64_t packs = 0;      // its packs: none past them is read
  int shift = 0, o = 0;
  float missing = 0.f;

  __device__ __forceinline__ ParamWindow(const T* param, float missing_value, int lead, int64_t cols)
      : missing(missing_value) {
    if (!param) return;
    constexpr int kV = kVec<T, 16>;
    const int plead = static_cast<int>((reinterpret_cast<std::uintptr_t>(param) % 16) / sizeof(T));
    pw = param - plead;
    packs = (plead + cols + kV - 1) / kV;
    const int d = plead - lead;  // in (-kV, kV)
    shift = d < 0 ? -1 : 0;
    o = d - shift * kV;
  }

  // The two packs behind the row's window pack a (zeros where there are none or !valid).
  __device__ __forceinline__ void load(int64_t a, bool valid, Pack<T, 16>& lo, Pack<T, 16>& hi) const {
    constexpr int kV = kVec<T, 16>;
    const int64_t b = a + shift;
    lo = pw && valid && b >= 0 && b < packs ? load_pack<T, 16>(pw + b * kV) : zero_pack<T, 16>();
    hi = pw && valid && o > 0 && b + 1 >= 0 && b + 1 < packs ? load_pack<T, 16>(pw + (b + 1) * kV)
                                                             : zero_pack<T, 16>();
  }

  // Window pack a's values as floats from load()'s packs; `missing` at columns outside [0, cols)
  // (the row's two end packs: the parameter's neighbours out) and everywhere without a parameter.
  __device__ __forceinline__ void floats(const Pack<T, 16>& lo, const Pack<T, 16>& hi, int64_t a, int lead,
                                         int64_t cols, float (&g)[kVec<T, 16>]) const {
    constexpr int kV = kVec<T, 16>;
    if (!pw) {
#pragma unroll
      for (int k = 0; k < kV; ++k) g[k] = missing;
      return;
    }
    unpack(shift_pack<T>(lo, hi, o), g);
    const int64_t c0 = a * kV - lead;
    if (c0 < 0 || c0 + kV > cols) {
#pragma unroll
      for (int k = 0; k < kV; ++k)
        if (c0 + k < 0 || c0 + k >= cols) g[k] = missing;
    }
  }
};

// stage_param for a row read through its window at `lead`: access a's element k is column
// a * kV + k - lead, `missing` outside [0, cols), once a block. A thread stages at most kN accesses
// (n <= kN x threads) and issues all their loads before it stores any: one load latency, not kN.
// 16-bit parameters through ParamWindow; float32 an element at a time (kV = 4: ParamWindow's shifts
// made the float32 window forward 2-12% slower on an H100, 2026-11-26, seventh session).
template <typename T, int kN>
__device__ __forceinline__ void stage_param_window(float* s, const T* param, float missing, int64_t a0, int64_t n,
                                                   int64_t accesses, int tid, int threads, int lead, int64_t cols) {
  constexpr int kV = kVec<T, 16>;
  if constexpr (sizeof(T) == 4) {
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
  } else {
    const ParamWindow<T> w(param, missing, lead, cols);
    Pack<T, 16> lo[kN], hi[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int64_t a = tid + static_cast<int64_t>(j) * threads;
      w.load(a0 + a, a < n, lo[j], hi[j]);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int64_t a = tid + static_cast<int64_t>(j) * threads;
      if (a >= n) continue;
      float g[kV];
      w.floats(lo[j], hi[j], a0 + a, lead, cols, g);
      store_staged(s, a, accesses, g);
    }
  }
}

}  // namespace hfnn::kernels::layer_norm
