// The steps the collector only times (the plain steps after the recorded ones, and under --sample
// the steps between recorded ones), on a GPU: each one's time is the longer of the host's interval
// between its boundaries and the GPU's, from an event recorded at each of them on the stream the
// step's kernels run on. A training loop that never waits for the GPU runs ahead of it on the host
// (after a drain, by as many steps as the launch queue holds), so its host intervals are the CPU's
// launch time, not the step; the GPU's interval between the two events is the step as the GPU ran
// it, and where the GPU idles for the host (a CPU-bound step) the two agree.
//
// Why events, not a synchronisation at each boundary: a sync costs the step its overlap of host
// and GPU work (the next step's Python and launches run while the GPU finishes this one), so the
// timed step would be longer than the plain run's, and under --sample with --steps 0 every step
// between the recorded ones (most of a long run) would pay it. An event record costs a few
// microseconds and changes nothing in the queue; its time is read once it has completed, at a later
// boundary (or, at the end of the plain steps and at exit, after waiting for the last one).
//
// Apart from torch and CUDA (StepClock is the seam: profiles/cuda_step_clock.h records CUDA
// events, tests/cpp/test_step_times.cpp a scripted clock), so the bookkeeping is tested on any
// machine.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace hfnn::profiles {

// Events in a ring of slots, recorded and read back by slot.
class StepClock {
 public:
  virtual ~StepClock() = default;
  // Records event `slot` now, on the stream(s) the steps' work runs on. False: not recorded (a CUDA
  // graph capture is under way, or CUDA refused); the steps that would start or end at it keep
  // their host time.
  virtual bool record(size_t slot) = 0;
  // Whether event `slot` has completed; with `wait`, after waiting for it (false where waiting is
  // not allowed now: a graph capture).
  virtual bool completed(size_t slot, bool wait) = 0;
  // Milliseconds from event `from` to event `to`, both completed; empty where they cannot tell.
  virtual std::optional<double> elapsed_ms(size_t from, size_t to) = 0;
};

class GpuStepTimes {
 public:
  // `clock` null: no GPU, every step keeps its host time (the calls below do nothing).
  explicit GpuStepTimes(StepClock* clock = nullptr, size_t slots = kSlots) : clock_(clock), slots_(slots) {}
  void set_clock(StepClock* clock) { clock_ = clock; }
  bool has_clock() const { return clock_ != nullptr; }

  // A timed step starts now: an event marks it.
  void mark();
  // The step begun at the last mark ended now; its host time is (*times)[index]. An event marks the
  // end, and once it has completed the step's time becomes the longer of the two. The next timed
  // step needs its own mark.
  void end_step(std::vector<double>* times, size_t index);
  // Steps whose end event has completed get their time; with `wait`, every one (waiting for the
  // last event: only where the caller may block on the GPU).
  void settle(bool wait);
  // Steps still waiting for their events.
  size_t pending() const { return pending_.size(); }

  static constexpr size_t kSlots = 128;  // two a step: a CPU that far ahead of the GPU waits (settle)

 private:
  struct Step {
    std::vector<double>* times;
    size_t index;
    size_t start, end;  // slots
  };
  // Records the next slot, after waiting for the steps whose events it would overwrite.
  std::optional<size_t> record_next();
  // The oldest pending step: its time, if its end event has completed (or after waiting for it).
  bool settle_front(bool wait);

  StepClock* clock_;
  size_t slots_;
  uint64_t recorded_ = 0;            // events recorded so far: the next goes to slot recorded_ % slots_
  std::optional<uint64_t> start_;    // the last mark's event number, if recorded
  std::deque<std::pair<Step, uint64_t>> pending_;  // with the start event's number, oldest first
};

}  // namespace hfnn::profiles
