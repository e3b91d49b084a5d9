// Device helpers shared by the kernel families: packs of 2 to 16 bytes, float conversions, reductions and
// the dtype switch that turns a run-time DType into a template argument at one boundary.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "kernels/common/dtype.h"
#include "kernels/common/launch.h"

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

// Elements in one access of kBytes (16: the widest load a thread can issue; 8, 4 or 2 where a row
// is only aligned that far).
template <typename T, int kBytes = 16>
inline constexpr int kVec = kBytes / static_cast<int>(sizeof(T));

// The register(s) an access of kBytes loads into.
template <int kBytes>
using PackRaw = std::conditional_t<kBytes == 16, uint4,
                                   std::conditional_t<kBytes == 8, uint2, std::conditional_t<kBytes == 4, uint32_t, uint16_t>>>;

// kBytes of T as loaded: 32-bit words, not a T[] array: copying, zeroing or selecting a pack of
// 16-bit values then costs a move a word, not a byte-permute an element (seen in the bf16
// backward's SASS: about 50 PRMTs an iteration before this).
template <typename T, int kBytes = 16>
struct Pack {
  static_assert(kBytes >= static_cast<int>(sizeof(T)) && kBytes % static_cast<int>(sizeof(T)) == 0);
  PackRaw<kBytes> raw;
};

template <typename T, int kBytes = 16>
__device__ __forceinline__ Pack<T, kBytes> zero_pack() { return Pack<T, kBytes>{}; }
template <typename T, int kBytes = 16>
__device__ __forceinline__ Pack<T, kBytes> load_pack(const T* p) {
  return Pack<T, kBytes>{*reinterpret_cast<const PackRaw<kBytes>*>(p)};
}
// A load of data a kernel reads once: in 16-bit without an L1 line (ld.global.L1::no_allocate),
// other dtypes as load_pack. Taken by the LayerNorm forward's one-pass wide kernel for x (H200,
// 16M elements, same build and call: 16-bit 1.02-1.05x from 1,024 to 8,192 columns; float32 lost
// 2-5%, so it keeps the plain load) and by the persistent wide forward (fwd_wide_c*_ps: median
// 1.05x at 16M, 0.975x at 1M); measured and not taken for the backward's x and dy
// (0.94-1.03x), the row-register forward and the wide forward's other loop forms (bench/README.md,
// "x loaded without an L1 line", "The persistent forward's x without an L1 line").
// Volatile, with a memory clobber: the compiler sees no memory operand in the asm, and the clobber
// keeps it from moving the load above wait_for_previous_grid().
template <typename T, int kBytes = 16>
__device__ __forceinline__ Pack<T, kBytes> load_stream(const T* p) {
  if constexpr (sizeof(T) == 2 && kBytes == 16) {
    uint4 r;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p)
                 : "memory");
    return Pack<T, 16>{r};
  } else if constexpr (sizeof(T) == 2 && kBytes == 8) {
    uint2 r;
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p) : "memory");
    return Pack<T, 8>{r};
  } else if constexpr (sizeof(T) == 2 && kBytes == 4) {
    uint32_t r;
    asm volatile("ld.global.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p) : "memory");
    return Pack<T, 4>{r};
  } else {
    return load_pack<T, kBytes>(p);
  }
}
template <typename T, int kBytes>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, kBytes>& v) {
  *reinterpret_cast<PackRaw<kBytes>*>(p) = v.raw;
}
// One 16-byte global store as one instruction, written in PTX: a plain store of a uint4 (store_pack)
// came out as four 4-byte ones (PTX st.global.u32 x 4, SASS STG.E x 4) in the LayerNorm window
// kernels, and __stwb's st.global.wb as STG.E.128.STRONG.SM. "memory": no load or store of the same
// memory moves across it. p is 16-byte aligned; T* rather than void*: through a void* the window
// kernels' address arithmetic came out differently (104 of 244 of them).
template <typename T>
__device__ __forceinline__ void store_global16(T* p, const uint4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// A pack's 32-bit words (kBytes >= 4).
template <int kBytes>
__device__ __forceinline__ void pack_words(const PackRaw<kBytes>& raw, uint32_t (&w)[kBytes / 4]) {
  if constexpr (kBytes == 16) {
    w[0] = raw.x, w[1] = raw.y, w[2] = raw.z, w[3] = raw.w;
  } else if constexpr (kBytes == 8) {
    w[0] = raw.x, w[1] = raw.y;
  } else {
    w[0] = raw;
  }
}

// A pack to floats and back; bf16 widens with one shift or mask per element and narrows two at a
// time, rounding to nearest even.
template <typename T, int kBytes>
__device__ __forceinline__ void unpack(const Pack<T, kBytes>& p, float (&out)[kVec<T, kBytes>]) {
  if constexpr (kBytes == 2) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) out[0] = __uint_as_float(static_cast<uint32_t>(p.raw) << 16);
    else out[0] = __half2float(__ushort_as_half(p.raw));
  } else {
    uint32_t w[kBytes / 4];
    pack_words<kBytes>(p.raw, w);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) {
      if constexpr (std::is_same_v<T, float>) {
        out[k] = __uint_as_float(w[k]);
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        out[2 * k] = __uint_as_float(w[k] << 16);
        out[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        __half2 h;
        memcpy(&h, &w[k], 4);
        const float2 f = __half22float2(h);
        out[2 * k] = f.x;
        out[2 * k + 1] = f.y;
      }
    }
  }
}

template <typename T, int kBytes = 16>
__device__ __forceinline__ Pack<T, kBytes> pack(const float (&in)[kVec<T, kBytes>]) {
  if constexpr (kBytes == 2) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return Pack<T, 2>{__bfloat16_as_ushort(__float2bfloat16_rn(in[0]))};
    else return Pack<T, 2>{__half_as_ushort(__float2half_rn(in[0]))};
  } else {
    uint32_t w[kBytes / 4];
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) {
      if constexpr (std::is_same_v<T, float>) {
        w[k] = __float_as_uint(in[k]);
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
        memcpy(&w[k], &b, 4);
      } else {
        const __half2 h = __floats2half2_rn(in[2 * k], in[2 * k + 1]);
        memcpy(&w[k], &h, 4);
      }
    }
    if constexpr (kBytes == 16) return Pack<T, 16>{make_uint4(w[0], w[1], w[2], w[3])};
    else if constexpr (kBytes == 8) return Pack<T, 8>{make_uint2(w[0], w[1])};
    else return Pack<T, 4>{w[0]};
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// The widest access, 16, 8, 4 or 2 bytes but at least an element of `elem` bytes, at which rows of
// `cols` elements starting at each of `pointers` (null ones ignored) stay aligned; 0 when not even
// an element is.
inline int access_bytes(int64_t cols, int elem, std::initializer_list<const void*> pointers) {
  for (int bytes = 16; bytes >= elem; bytes /= 2) {
    bool ok = (cols * elem) % bytes == 0;
    for (const void* p : pointers)
      if (p && (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes)) != 0) ok = false;
    if (ok) return bytes;
  }
  return 0;
}

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

// Asynchronous copies global -> shared memory (compute capability 8.0 and later), no registers in
// between, 16 bytes (.cg: not kept in L1); async_commit() closes this thread's group of
// copies so far, async_wait<N>() returns once at most N of its groups are still in flight (its own
// copies only: a barrier follows before other threads read them).
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
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

// Calls f.template operator()<kBytes>() with the access width `bytes` (access_bytes()) as a
// template argument: 16, 8, 4, or 2 for 16-bit T. The caller has checked bytes >= sizeof(T).
template <typename T, typename F>
decltype(auto) with_access_bytes(int bytes, F&& f) {
  if constexpr (sizeof(T) == 2) {
    if (bytes == 2) return f.template operator()<2>();
  }
  if (bytes == 4) return f.template operator()<4>();
  if (bytes == 8) return f.template operator()<8>();
  return f.template operator()<16>();
}

// Drops the 128-byte line at p (128-byte aligned) from L2 without writing it back: its contents
// become undefined. For scratch read for the last time (LayerNorm's dgamma/dbeta partial rows),
// which would otherwise go back to DRAM as dirty lines some time after, taking write bandwidth from
// whatever runs then. A no-op before sm_80.
__device__ __forceinline__ void discard_l2_line(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
#endif
}

// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl() may be scheduled
// while the kernel before it in the stream drains, hiding the launch gap (about a microsecond, up
// to a tenth of a 10 to 20 us LayerNorm). Every such kernel calls wait_for_previous_grid() before
// its first global memory access, which returns once the previous grid has finished and its
// writes are visible: the stream order is unchanged. On older GPUs both are no-ops. (One
// exception, by design: LayerNorm's column sums, layer_norm_cols.cu, read only what the kernel
// before them waited for before allowing them, and wait at their end instead: the kernels they follow
// all call wait_for_previous_grid() before allow_next_grid().)
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream be scheduled now (it still waits for this grid to finish in
// its own wait_for_previous_grid()).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Launches `kernel` through cudaLaunchKernelEx, which returns this launch's own error (a
// `<<<>>>` launch leaves it to cudaGetLastError, which also reports an earlier call's): with
// programmatic dependent launch where `pdl` is set and the device has it (so the kernel must call
// wait_for_previous_grid() before touching global memory) and, with cluster > 1, in thread-block
// clusters of that many consecutive blocks along x.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_ex(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                      bool pdl, int cluster, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned n = 0;
  if (pdl && current_device_info().pdl) {
    attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attribute[n].id = cudaLaunchAttributeClusterDimension;
    attribute[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute[n].val.clusterDim.y = 1;
    attribute[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attribute;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// With programmatic dependent launch (where the device has it), in clusters of `cluster` blocks.
template <typename... KernelArgs, typename... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                   int cluster, Args&&... args) {
  return launch_ex(kernel, grid, block, smem, stream, true, cluster, std::forward<Args>(args)...);
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                       Args&&... args) {
  return launch_ex(kernel, grid, block, smem, stream, true, 1, std::forward<Args>(args)...);
}

// A plain launch, for kernels that do not wait for the previous grid.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_plain(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                         Args&&... args) {
  return launch_ex(kernel, grid, block, smem, stream, false, 1, std::forward<Args>(args)...);
}

// Typed front ends of kernels/common/launch.h.
template <typename K>
cudaError_t allow_smem(K kernel, std::size_t smem) {
  return allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
}
template <typename K>
bool fits(K kernel, int64_t threads, std::size_t smem, const DeviceInfo& device) {
  return launch_fits(reinterpret_cast<const void*>(kernel), threads, smem, device);
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
