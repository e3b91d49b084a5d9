// CUDA activity through CUPTI, for the collector: kernels, memcpy and memset with their GPU
// start and end, and the external correlation ids the collector pushes around each op, so each
// kernel lands on the op that launched it (nothing else: every kind or API traced costs CPU time
// on launch-bound steps). One class per CUPTI concern (as Kineto does): this one
// owns the activity buffers and turns raw records into plain structs at once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hfnn::profiles {

struct GpuRecord {
  enum class Kind { kKernel, kMemcpy, kMemset };
  Kind kind;
  const char* name;  // kernels: CUPTI's name string, stable for the process; others: a fixed label
  uint64_t start_ns, end_ns;
  uint32_t correlation;
  uint32_t device = 0;  // the CUDA device it ran on
};

struct Correlation {
  uint32_t correlation;
  uint64_t external;
};

class CuptiActivity {
 public:
  // Enables the records; false, with the reason in `why_not`, when CUPTI refuses (no GPU, or
  // another CUPTI client such as torch.profiler or Nsight Systems holds it).
  static bool start(std::string* why_not);
  // Flushes, disables and forgets. Safe to call when start() failed or twice.
  static void stop();
  // Activity off and on again (--sample: the unsampled steps), the traced calls kept; the caller
  // drains the device and the records first.
  static void pause();
  static void resume();
  // Which API calls are traced for their correlation records (the launch, memcpy and memset ones,
  // or every one): a phrase for the part's meta; empty when not started.
  static std::string traced_apis();
  // Traces every runtime and driver API call from now on (where the launch calls alone gave no
  // correlation records); false if it already did or cannot.
  static bool trace_every_api();
  // Around each op: kernels launched in between carry `external` as their correlation.
  static void push(uint64_t external);
  static void pop();
  // Completed records so far (forced: also those of buffers not yet full). Thread-safe; never
  // takes the caller's locks, so callers may hold their own.
  static void drain(std::vector<GpuRecord>* records, std::vector<Correlation>* correlations, bool forced);
};

}  // namespace hfnn::profiles
