// The join of CUDA records to the op calls that launched them, for the collector
// (profiles/collector.cpp): each op call the collector saw (its id, the totals its kernels add to,
// the enclosing call) and CUPTI's records (profiles/cupti_activity.h) go in; CUDA time per op
// (self: kernels the op launched itself; total: kernels launched inside it), per kernel name and
// per step come out. Apart from torch and CUPTI, so it is tested and timed on any machine
// (tests/cpp/test_gpu_join.cpp). It runs at every step boundary on the thread that ends the step,
// inside the step's time, so nothing in it allocates per record once warm: calls sit in a deque
// indexed by id, correlations in a sorted vector, kernel names are looked up by CUPTI's name
// pointer (checked against the text) before the text.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "profiles/cupti_activity.h"

namespace hfnn::profiles {

// CUDA time an op (or a shape row) has gathered.
struct CudaTime {
  int64_t self_ns = 0, total_ns = 0;
};

class GpuJoin {
 public:
  // One op call, with the id the collector pushed as its external correlation id: the totals its
  // kernels add to (null: a label such as a shape scope, not an op row), the shape row it records
  // (null: none), the enclosing call's id (0: none) and the recorded step it ran in.
  // A kernel's launches and CUDA time (ns) in the recorded steps.
  struct Kernel {
    int64_t calls = 0, ns = 0;
  };

  struct Call {
    uint64_t id = 0;
    CudaTime* op = nullptr;
    CudaTime* shape = nullptr;
    uint64_t parent = 0;
    int step = 0;
  };

  // Forgets every call, correlation and kernel; calls from `first_id` on are kept from now.
  void reset(uint64_t first_id);
  // Calls older than `first_id` are forgotten (kernels finish after the CPU has moved on, so the
  // collector keeps the last two steps' calls), with the correlations that point at them.
  void forget_before(uint64_t first_id);
  void add_call(const Call& call);
  // Hands CUDA records to the calls that launched them: self time to the call's op, total time to
  // it and every enclosing op (an op nested in itself counts once), to every shape row on the way
  // (once each: the collector keeps only the innermost row of an op and phase, so rows around a
  // kernel are of different ops, a GEMM's inside an attention key's), and the record's interval to
  // its step's busy time (step_intervals[step], when there).
  void add(const std::vector<GpuRecord>& records, const std::vector<Correlation>& correlations,
           std::vector<std::vector<std::pair<int64_t, int64_t>>>* step_intervals);

  const std::map<std::string, Kernel>& kernels() const { return kernels_; }
  // The CUDA devices of every record handed in so far, in the order first seen (reset keeps them:
  // the warm-up's ran where the recorded steps' run), attributed or not.
  const std::vector<uint32_t>& devices() const { return devices_; }
  size_t calls_kept() const;
  // What happened to the records: drained, correlations, attributed, launched outside any recorded
  // op (no correlation), or by a call no longer (or never) kept (no op).
  int64_t records = 0, correlations = 0, attributed = 0, no_correlation = 0, no_op = 0;

 private:
  const Call* find(uint64_t id) const;

  std::deque<Call> calls_;  // calls_[i] is the call with id base_ + i (id 0: not seen)
  uint64_t base_ = 1;
  std::vector<std::pair<uint32_t, uint64_t>> correlation_;  // CUDA correlation id -> call id, sorted
  std::map<std::string, Kernel> kernels_;
  // CUPTI's name strings live as long as the process: by their address first, then by text.
  std::unordered_map<const char*, std::pair<const std::string*, Kernel*>> kernel_by_name_ptr_;
  std::vector<uint32_t> devices_;
  std::vector<const CudaTime*> seen_;  // the ops and shape rows one record's total went to (reused)
};

}  // namespace hfnn::profiles
