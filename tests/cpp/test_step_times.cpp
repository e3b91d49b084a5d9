// profiles/step_times: the plain and --sample's unsampled steps on a GPU take the longer of their
// host and GPU intervals, from events read once they have completed; a scripted clock stands in
// for CUDA's events (the collector's CUDA events are checked on the GPU: tests/python/test_plain_step.py).
#include "profiles/step_times.h"

#include <gtest/gtest.h>

#include <vector>

namespace hfnn::profiles {
namespace {

// Each event is reached by the GPU at `gpu_ms` as it was when recorded; it completes at once, or
// only when waited for or `reach_all` is called.
struct ScriptedClock : StepClock {
  explicit ScriptedClock(size_t slots = GpuStepTimes::kSlots) : at(slots), done(slots) {}
  double gpu_ms = 0;
  bool complete_on_record = true;
  bool capturing = false;  // a CUDA graph capture: no record, no wait
  int records = 0, waits = 0;
  std::vector<double> at;
  std::vector<bool> done;

  bool record(size_t slot) override {
    if (capturing) return false;
    ++records;
    at[slot] = gpu_ms;
    done[slot] = complete_on_record;
    return true;
  }
  bool completed(size_t slot, bool wait) override {
    if (wait && !capturing && !done[slot]) {
      ++waits;
      done[slot] = true;
    }
    return done[slot];
  }
  std::optional<double> elapsed_ms(size_t from, size_t to) override { return at[to] - at[from]; }
  void reach_all() { done.assign(done.size(), true); }
};

TEST(GpuStepTimes, AStepTakesTheLongerOfItsHostAndGpuIntervals) {
  ScriptedClock clock;
  GpuStepTimes times(&clock);
  std::vector<double> ms = {1.0};  // the host launched the step in 1 ms; the GPU ran it in 4
  clock.gpu_ms = 10;
  times.mark();
  clock.gpu_ms = 14;
  times.end_step(&ms, 0);
  times.settle(false);
  EXPECT_DOUBLE_EQ(ms[0], 4.0);
  ms.push_back(5.0);  // a CPU-bound step: the GPU waited for the host, its interval is shorter
  times.mark();
  clock.gpu_ms = 16;
  times.end_step(&ms, 1);
  times.settle(false);
  EXPECT_DOUBLE_EQ(ms[1], 5.0);
  EXPECT_EQ(clock.records, 4);
  EXPECT_EQ(times.pending(), 0u);
}

TEST(GpuStepTimes, AStepWaitsForItsEndEventUntilTheGpuReachesIt) {
  ScriptedClock clock;
  clock.complete_on_record = false;
  GpuStepTimes times(&clock);
  std::vector<double> ms = {0.5, 0.5};
  for (size_t i = 0; i < 2; ++i) {
    times.mark();
    clock.gpu_ms += 3;
    times.end_step(&ms, i);
  }
  times.settle(false);  // not reached yet: host times for now, nothing waited for
  EXPECT_EQ(times.pending(), 2u);
  EXPECT_EQ(ms, (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(clock.waits, 0);
  clock.reach_all();
  times.settle(false);
  EXPECT_EQ(ms, (std::vector<double>{3.0, 3.0}));
  EXPECT_EQ(times.pending(), 0u);

  ms.push_back(0.5);  // at the end of the plain steps: waited for
  times.mark();
  clock.gpu_ms += 7;
  times.end_step(&ms, 2);
  times.settle(true);
  EXPECT_DOUBLE_EQ(ms[2], 7.0);
  EXPECT_EQ(clock.waits, 1);
}

TEST(GpuStepTimes, StepsWithoutBothEventsKeepTheirHostTime) {
  ScriptedClock clock;
  GpuStepTimes times(&clock);
  std::vector<double> ms = {1.0, 1.0, 1.0, 1.0};
  times.end_step(&ms, 0);  // never marked
  clock.capturing = true;  // its start fell in a graph capture
  times.mark();
  clock.capturing = false;
  clock.gpu_ms = 9;
  times.end_step(&ms, 1);
  times.mark();
  clock.capturing = true;  // its end did
  times.end_step(&ms, 2);
  clock.capturing = false;
  EXPECT_EQ(times.pending(), 0u);
  times.mark();  // a wait refused (a capture at the end): dropped, not waited for forever
  clock.complete_on_record = false;
  clock.gpu_ms = 20;
  times.end_step(&ms, 3);
  clock.capturing = true;
  times.settle(true);
  EXPECT_EQ(times.pending(), 0u);
  EXPECT_EQ(ms, (std::vector<double>{1.0, 1.0, 1.0, 1.0}));
}

TEST(GpuStepTimes, AHostARingAheadWaitsForTheOldestStepBeforeReusingItsEvents) {
  ScriptedClock clock(4);
  clock.complete_on_record = false;
  GpuStepTimes times(&clock, 4);
  std::vector<double> ms(3, 0.1);
  for (size_t i = 0; i < 3; ++i) {  // events 0-1, 2-3, then 4 reuses step 0's slot 0
    clock.gpu_ms = 10.0 * static_cast<double>(i);
    times.mark();
    clock.gpu_ms += 2;
    times.end_step(&ms, i);
  }
  EXPECT_EQ(clock.waits, 1);  // for step 0's end, before its start's slot was reused
  EXPECT_DOUBLE_EQ(ms[0], 2.0);
  EXPECT_DOUBLE_EQ(ms[1], 0.1);
  EXPECT_EQ(times.pending(), 2u);
  times.settle(true);
  EXPECT_EQ(clock.waits, 3);
  EXPECT_EQ(ms, (std::vector<double>{2.0, 2.0, 2.0}));
}

TEST(GpuStepTimes, WithoutAClockNothingIsRecorded) {
  GpuStepTimes times;
  std::vector<double> ms = {1.5};
  times.mark();
  times.end_step(&ms, 0);
  times.settle(true);
  EXPECT_FALSE(times.has_clock());
  EXPECT_EQ(times.pending(), 0u);
  EXPECT_DOUBLE_EQ(ms[0], 1.5);
}

}  // namespace
}  // namespace hfnn::profiles
