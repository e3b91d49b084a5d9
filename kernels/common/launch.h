// What a launch may use on a device, and whether a kernel's launch fits it: the facts every
// variant's supports() must check so that "supports" means "the launch runs". Host code, torch-free.
//
// A block may use static plus dynamic shared memory up to the device's opt-in limit (227 KB on
// Hopper, 163 KB on A100), but above 48 KB only after cudaFuncSetAttribute raised the kernel's
// dynamic limit; its threads are bounded by the registers the kernel needs. Both come from the
// kernel itself (cudaFuncGetAttributes), read once per kernel and device.
#pragma once
#include <cstddef>
#include <cstdint>

#if HFNN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hfnn::kernels {

// One device's limits. Plain data: it travels inside the kernels' parameter structs.
struct DeviceInfo {
  int device = -1;  // CUDA ordinal; -1: no device (nothing runs)
  int sm_count = 1;
  int cc_major = 0, cc_minor = 0;
  int64_t smem_per_block_optin = 0;  // static + dynamic shared memory a block may use, opted in
  int max_threads_per_block = 0;
  bool cluster_launch = false;  // thread-block clusters (compute capability 9.0 on)
  bool pdl = false;             // programmatic dependent launch (9.0 on)
  int64_t l2_bytes = 0;         // the L2 cache's size
};

// What a kernel needs of a block, as compiled for the device.
struct KernelInfo {
  int static_smem = 0;
  int max_threads = 0;  // 0: the kernel cannot be queried (no device): nothing fits
  int ptx_version = 0;  // of the code the kernel was built from (90: sm_90 PTX; 80 if JIT-compiled from sm_80)
};

#if HFNN_WITH_CUDA
// The device's limits, read once per device (cudaGetDeviceProperties). A device that cannot be
// queried gives device = -1 (and is asked again next time: a failure is not cached).
const DeviceInfo& device_info(int device);
// The current device's.
const DeviceInfo& current_device_info();

// The kernel's static shared memory and the most threads a block may have, for the current device;
// read once (a failed query is not cached, so a transient failure costs one call, not the kernel).
KernelInfo kernel_info(const void* kernel);

// Whether a block of `threads` threads with `dynamic_smem` bytes of dynamic shared memory launches.
bool launch_fits(const void* kernel, int64_t threads, std::size_t dynamic_smem, const DeviceInfo& device);

// Raises the kernel's dynamic shared memory limit where `dynamic_smem` needs it (above 48 KB less
// the static part); once per kernel, device and size.
cudaError_t allow_dynamic_smem(const void* kernel, std::size_t dynamic_smem);

// Lets the kernel run in clusters of more than 8 blocks (16 on H100 and H200); once per kernel.
cudaError_t allow_large_clusters(const void* kernel);

// How many clusters of `cluster` blocks of threads_x x threads_y threads and `dynamic_smem` bytes
// the device runs at once (cluster 1: resident blocks); 0 where such a launch cannot run at all.
// Cached per kernel, device and shape: persistent grids ask on every call.
int64_t resident_clusters(const void* kernel, int threads_x, int threads_y, std::size_t dynamic_smem, int cluster,
                          const DeviceInfo& device);
#endif

}  // namespace hfnn::kernels
