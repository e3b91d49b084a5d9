// Device helpers shared by the kernel families: 16-byte packs, float conversions, reductions and
// the dtype switch that turns a run-time DType into a template argument at one boundary.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/dtype.h"

namespace hfnn::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}

// Elements in one 16-byte access: the widest load a thread can issue.
template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
struct alignas(16) Pack {
  T v[kVec<T>];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) { return *reinterpret_cast<const Pack<T>*>(p); }
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) { *reinterpret_cast<Pack<T>*>(p) = v; }

// A pack to floats and back, two elements per conversion instruction for 16-bit types (the
// backward is issue-bound enough in bf16 that conversions show; rounding is to nearest even).
template <typename T>
__device__ __forceinline__ void unpack(const Pack<T>& p, float (&out)[kVec<T>]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) out[k] = p.v[k];
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const T2* two = reinterpret_cast<const T2*>(p.v);
#pragma unroll
    for (int k = 0; k < kVec<T> / 2; ++k) {
      float2 f;
      if constexpr (std::is_same_v<T, __half>) f = __half22float2(two[k]);
      else f = __bfloat1622float2(two[k]);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  }
}

template <typename T>
__device__ __forceinline__ Pack<T> pack(const float (&in)[kVec<T>]) {
  Pack<T> p;
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) p.v[k] = in[k];
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    T2* two = reinterpret_cast<T2*>(p.v);
#pragma unroll
    for (int k = 0; k < kVec<T> / 2; ++k) {
      if constexpr (std::is_same_v<T, __half>) two[k] = __floats2half2_rn(in[2 * k], in[2 * k + 1]);
      else two[k] = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
    }
  }
  return p;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Sum over the `width` consecutive lanes of a group (width a power of two <= 32); every lane of the
// warp must call it. Fixed butterfly order: bit-identical results run to run.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset, kWidth);
  return v;
}

// Sum of a and of b over the whole block; every thread gets both totals. `scratch` holds 32 float2.
// Safe to call repeatedly: the first barrier keeps a new call from overwriting a value still read.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* scratch) {
  a = group_sum<32>(a);
  b = group_sum<32>(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = make_float2(a, b);
  __syncthreads();
  const int warps = blockDim.x / 32;
  float2 v = lane < warps ? scratch[lane] : make_float2(0.f, 0.f);
  return make_float2(group_sum<32>(v.x), group_sum<32>(v.y));
}

// Calls f.template operator()<T>() with T the CUDA type of `dtype`.
template <typename F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f.template operator()<__half>();
    case DType::kBFloat16: return f.template operator()<__nv_bfloat16>();
    case DType::kFloat32: break;
  }
  return f.template operator()<float>();
}

// Resident blocks of `kernel` the device can hold, at `threads` threads and `smem` dynamic bytes.
template <typename K>
int resident_blocks(K kernel, int threads, std::size_t smem, int sm_count) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess || per_sm < 1) {
    (void)cudaGetLastError();  // not sticky: keep it from surfacing at the next launch check
    per_sm = 1;
  }
  return per_sm * sm_count;
}

}  // namespace hfnn::kernels
