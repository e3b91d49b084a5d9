// The collector's CUDA side of a step boundary, apart from its bookkeeping (profiles/step_times.h):
// which devices a process's steps run on, waiting for them, and CUDA events on their streams.
// Compiled into the op library with CUDA (HFNN_WITH_CUDA and a CUDA torch); never throws.
#pragma once
#include <cstdint>
#include <vector>

#include "profiles/step_times.h"

struct CUevent_st;  // cudaEvent_t is a CUevent_st*, without CUDA's headers here

namespace hfnn::profiles {

// The devices the steps' kernels ran on: those CUPTI's records name (GpuJoin::devices); before
// any record has (a GPU-bound step's first kernels may not have completed yet), or without CUPTI,
// every device with a CUDA context in this process: one that ran nothing waits for nothing and its
// events add nothing. Never the thread's current device as such: a torchrun rank that never called
// torch.cuda.set_device runs on cuda:LOCAL_RANK with device 0 current, and no context is made.
std::vector<int> step_devices(const std::vector<uint32_t>& seen);

// Waits until each of `devices` has finished its work, the thread's current device restored after.
// Not inside a CUDA graph capture: a device whose current stream is capturing (an optimizer step
// captured with torch.cuda.graph) is not synchronised, which would invalidate the capture; its
// records of kernels still running are then incomplete.
void synchronize_devices(const std::vector<int>& devices);

// One CUDA event per slot and device, recorded on the device's current stream (where torch queues
// the step's kernels); a step's GPU interval is the longest over the devices. Events are made on
// their device at the first record. Nothing is recorded, waited for or read while that stream is
// capturing a CUDA graph.
class CudaEventClock final : public StepClock {
 public:
  explicit CudaEventClock(std::vector<int> devices, size_t slots = GpuStepTimes::kSlots);
  ~CudaEventClock() override;
  CudaEventClock(const CudaEventClock&) = delete;
  CudaEventClock& operator=(const CudaEventClock&) = delete;

  bool record(size_t slot) override;
  bool completed(size_t slot, bool wait) override;
  std::optional<double> elapsed_ms(size_t from, size_t to) override;

 private:
  std::vector<int> devices_;
  std::vector<std::vector<CUevent_st*>> events_;  // [device][slot], null until made
};

}  // namespace hfnn::profiles
