#include "profiles/cuda_step_clock.h"

#if HFNN_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

namespace hfnn::profiles {
namespace {

// Whether the current stream of the guarded (current) device is capturing a CUDA graph; true where
// it cannot tell, so that nothing is done that could invalidate a capture.
bool capturing() {
  try {
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  } catch (const c10::Error&) {
    (void)cudaGetLastError();
    return true;
  }
}

}  // namespace

std::vector<int> step_devices(const std::vector<uint32_t>& seen) {
  if (!seen.empty()) return std::vector<int>(seen.begin(), seen.end());
  std::vector<int> with_context;
  try {
    for (c10::DeviceIndex d = 0; d < c10::cuda::device_count(); ++d)
      if (c10::cuda::hasPrimaryContext(d)) with_context.push_back(static_cast<int>(d));
  } catch (const c10::Error&) {
    (void)cudaGetLastError();
  }
  return with_context;
}

void synchronize_devices(const std::vector<int>& devices) {
  for (const int device : devices) {
    try {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));  // restores the current device
      if (!capturing() && cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    } catch (const c10::Error&) {  // never throw from an observer
      (void)cudaGetLastError();
    }
  }
}

CudaEventClock::CudaEventClock(std::vector<int> devices, size_t slots)
    : devices_(std::move(devices)), events_(devices_.size(), std::vector<CUevent_st*>(slots, nullptr)) {}

CudaEventClock::~CudaEventClock() {
  // The collector's state is never destroyed (callbacks may run during static teardown), nor is
  // this clock with it; a clock dropped earlier gives its events back.
  for (size_t d = 0; d < devices_.size(); ++d)
    for (cudaEvent_t event : events_[d])
      if (event) (void)cudaEventDestroy(event);
}

bool CudaEventClock::record(size_t slot) {
  bool all = true;
  for (size_t d = 0; d < devices_.size(); ++d) {
    try {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices_[d]));
      if (capturing()) return false;
      cudaEvent_t& event = events_[d][slot];
      if (!event && cudaEventCreate(&event) != cudaSuccess) {
        (void)cudaGetLastError();
        event = nullptr;
        return false;
      }
      if (cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(devices_[d])).stream()) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        all = false;
      }
    } catch (const c10::Error&) {
      (void)cudaGetLastError();
      return false;
    }
  }
  return all && !devices_.empty();
}

bool CudaEventClock::completed(size_t slot, bool wait) {
  for (size_t d = 0; d < devices_.size(); ++d) {
    const cudaEvent_t event = events_[d][slot];
    if (!event) return false;
    try {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices_[d]));
      if (wait && capturing()) return false;
      const cudaError_t e = wait ? cudaEventSynchronize(event) : cudaEventQuery(event);
      if (e == cudaErrorNotReady) return false;
      if (e != cudaSuccess) (void)cudaGetLastError();  // elapsed_ms tells: no time
    } catch (const c10::Error&) {
      (void)cudaGetLastError();
      return false;
    }
  }
  return true;
}

std::optional<double> CudaEventClock::elapsed_ms(size_t from, size_t to) {
  std::optional<double> longest;
  for (size_t d = 0; d < devices_.size(); ++d) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, events_[d][from], events_[d][to]) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    longest = std::max(longest.value_or(0.0), static_cast<double>(ms));
  }
  return longest;
}

}  // namespace hfnn::profiles
#endif  // HFNN_TORCH_CUDA
