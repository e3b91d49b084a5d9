#include "kernels/common/launch.h"

#if HFNN_WITH_CUDA
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace hfnn::kernels {
namespace {

constexpr int kMaxDevices = 64;
constexpr std::size_t kDefaultSmem = 48 * 1024;

struct PerKernel {
  KernelInfo info;
  bool known = false;  // info was read (failures are asked again)
  std::size_t dynamic_allowed = 0;  // the dynamic limit we raised it to (0: the default)
  bool large_clusters = false;
};

std::mutex& cache_mutex() {
  static auto* m = new std::mutex();
  return *m;
}

// (kernel, device) -> what we know; never shrinks (a few dozen kernels).
std::map<std::pair<const void*, int>, PerKernel>& kernel_cache() {
  static auto* cache = new std::map<std::pair<const void*, int>, PerKernel>();
  return *cache;
}

int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}

// The entry for the kernel on the current device, queried on first use. Lock held by the caller.
PerKernel& entry(const void* kernel, int device) {
  PerKernel& e = kernel_cache()[{kernel, device}];
  if (!e.known && device >= 0) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
      e.info = {static_cast<int>(attr.sharedSizeBytes), attr.maxThreadsPerBlock, attr.ptxVersion};
      e.known = true;
    } else {
      (void)cudaGetLastError();  // this query's own error (cudaFuncGetAttributes sets no sticky state)
    }
  }
  return e;
}

// Per-thread copies of recent lookups: the per-call path takes no lock.
struct RecentLookups {
  struct Slot {
    const void* kernel = nullptr;
    int device = -2;
    KernelInfo info;
  };
  std::array<Slot, 32> slots;
  unsigned next = 0;
};

}  // namespace

const DeviceInfo& device_info(int device) {
  static std::array<DeviceInfo, kMaxDevices> infos;
  static std::array<std::atomic<bool>, kMaxDevices> ready{};
  static const DeviceInfo none;
  if (device < 0 || device >= kMaxDevices) return none;
  if (ready[device].load(std::memory_order_acquire)) return infos[device];
  std::lock_guard<std::mutex> lock(cache_mutex());
  if (!ready[device].load(std::memory_order_relaxed)) {
    cudaDeviceProp props{};
    DeviceInfo d;
    if (cudaGetDeviceProperties(&props, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return none;  // asked again next time
    }
    {
      d.device = device;
      d.sm_count = props.multiProcessorCount;
      d.cc_major = props.major;
      d.cc_minor = props.minor;
      d.smem_per_block_optin = static_cast<int64_t>(props.sharedMemPerBlockOptin);
      d.max_threads_per_block = props.maxThreadsPerBlock;
      d.cluster_launch = props.clusterLaunch != 0;
      d.pdl = props.major >= 9;
      d.l2_bytes = props.l2CacheSize;
    }
    infos[device] = d;
    ready[device].store(true, std::memory_order_release);
  }
  return infos[device];
}

const DeviceInfo& current_device_info() { return device_info(current_device()); }

KernelInfo kernel_info(const void* kernel) {
  thread_local RecentLookups recent;
  const int device = current_device();
  for (const auto& s : recent.slots)
    if (s.kernel == kernel && s.device == device) return s.info;
  KernelInfo info;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    info = entry(kernel, device).info;
  }
  if (info.max_threads > 0) recent.slots[recent.next++ % recent.slots.size()] = {kernel, device, info};
  return info;
}

bool launch_fits(const void* kernel, int64_t threads, std::size_t dynamic_smem, const DeviceInfo& device) {
  if (device.device < 0 || threads < 1) return false;
  const KernelInfo k = kernel_info(kernel);
  return threads <= k.max_threads &&
         static_cast<int64_t>(k.static_smem) + static_cast<int64_t>(dynamic_smem) <= device.smem_per_block_optin;
}

cudaError_t allow_dynamic_smem(const void* kernel, std::size_t dynamic_smem) {
  if (dynamic_smem == 0) return cudaSuccess;
  if (const KernelInfo k = kernel_info(kernel);  // per-thread cache: no lock on the common path
      k.max_threads > 0 && dynamic_smem + static_cast<std::size_t>(k.static_smem) <= kDefaultSmem)
    return cudaSuccess;
  const int device = current_device();
  std::lock_guard<std::mutex> lock(cache_mutex());
  PerKernel& e = entry(kernel, device);
  if (dynamic_smem + static_cast<std::size_t>(e.info.static_smem) <= kDefaultSmem || dynamic_smem <= e.dynamic_allowed)
    return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_smem));
  if (err == cudaSuccess) e.dynamic_allowed = dynamic_smem;
  else (void)cudaGetLastError();  // returned, not left behind for the next launch check
  return err;
}

cudaError_t allow_large_clusters(const void* kernel) {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(cache_mutex());
  PerKernel& e = entry(kernel, device);
  if (e.large_clusters) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess) e.large_clusters = true;
  else (void)cudaGetLastError();
  return err;
}

int64_t resident_clusters(const void* kernel, int threads_x, int threads_y, std::size_t dynamic_smem, int cluster,
                          const DeviceInfo& device) {
  struct Key {
    const void* kernel;
    int device, x, y, cluster;
    std::size_t smem;
    bool operator==(const Key&) const = default;
  };
  struct Recent {
    std::array<std::pair<Key, int64_t>, 32> slots{};
    unsigned next = 0;
  };
  thread_local Recent recent;
  const Key key{kernel, device.device, threads_x, threads_y, cluster, dynamic_smem};
  for (const auto& [k, n] : recent.slots)
    if (k == key && k.kernel) return n;
  int64_t result = 0;
  if (device.device >= 0 && launch_fits(kernel, static_cast<int64_t>(threads_x) * threads_y, dynamic_smem, device) &&
      allow_dynamic_smem(kernel, dynamic_smem) == cudaSuccess) {
    if (cluster <= 1) {
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads_x * threads_y, dynamic_smem) ==
          cudaSuccess)
        result = static_cast<int64_t>(per_sm) * device.sm_count;
      else
        (void)cudaGetLastError();  // a refused query is an answer (0), not an error for the next launch
    } else if (device.cluster_launch && (cluster <= 8 || allow_large_clusters(kernel) == cudaSuccess)) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(cluster));
      config.blockDim = dim3(static_cast<unsigned>(threads_x), static_cast<unsigned>(threads_y));
      config.dynamicSmemBytes = dynamic_smem;
      cudaLaunchAttribute attribute[1];
      attribute[0].id = cudaLaunchAttributeClusterDimension;
      attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
      attribute[0].val.clusterDim.y = 1;
      attribute[0].val.clusterDim.z = 1;
      config.attrs = attribute;
      config.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) == cudaSuccess) result = n;
      else (void)cudaGetLastError();
    }
  }
  if (result > 0) recent.slots[recent.next++ % recent.slots.size()] = {key, result};  // failures asked again
  return result;
}

}  // namespace hfnn::kernels
#endif
