// The backward's dgamma/dbeta sums of one access (kV elements a thread): dgamma += dy * xhat and
// dbeta += dy, held in registers or, in the *_smem variants, in shared memory as vectors of kW
// floats (float4, float2 or float: kW the floats of an access, at most 4). Shared by the wide and
// window backward variants (layer_norm_wide.cu, layer_norm_window.cu).
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

}  // namespace hfnn::kernels::layer_norm
