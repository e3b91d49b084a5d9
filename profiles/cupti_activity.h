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

// How kernels are tied to the op that launched them.
enum class Join {
  // CUPTI's external correlation: an id pushed around each op, and API activity records of the
  // launch calls, which carry it (Kineto's way).
  kExternalCorrelation,
  // CUPTI callbacks on the launch calls: at each, the correlation id of the kernel it launches and
  // the op running on that thread (no API records, nothing pushed to CUPTI around ops).
  kCallbacks,
  // Diagnostics (HFNN_PROFILE_PARTS): kernels without any join; CUPTI attached with nothing enabled.
  kNone,
  kAttachedOnly,
};

class CuptiActivity {
 public:
  // Enables the records; false, with the reason in `why_not`, when CUPTI refuses (no GPU, or
  // another CUPTI client such as torch.profiler or Nsight Systems holds it).
  static bool start(std::string* why_not, Join join = Join::kExternalCorrelation);
  // The join in force ("external correlation", "callbacks", ...), for the part's meta.
  static const char* join_name();
  // Flushes, disables and forgets. Safe to call when start() failed or twice. With `detach`, CUPTI
  // then leaves the process (cuptiFinalize, at the exit of the next CUDA API call on any thread, as
  // NVIDIA's cupti_finalize sample does): a CUPTI that was attached keeps costing every launch after
  // its activity is disabled (a launch-bound step up to 9% slower, so the plain steps read slow), and
  // only finalizing removes that. Once finalized, start() is not called again in the process.
  static void stop(bool detach = false);
  // At exit, before CUDA and torch tear down: a detach still waiting for its API call is called off
  // (finalizing inside the process's teardown is not worth the risk).
  static void cancel_detach();
  // "none", "requested", "finalized", or why not: for the part's meta (cupti_detach).
  static const char* detach_state();
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
  // Around each op: kernels launched in between carry `external` as their correlation; at its
  // end, `parent` (the enclosing op's id, 0 for none) is the thread's op again.
  static void push(uint64_t external);
  static void pop(uint64_t parent);
  // Completed records so far (forced: also those of buffers not yet full). Thread-safe; never
  // takes the caller's locks, so callers may hold their own.
  static void drain(std::vector<GpuRecord>* records, std::vector<Correlation>* correlations, bool forced);
};

}  // namespace hfnn::profiles
