// The plain step (issue 13): a step's wall time with hfnn's collection off, which every profiled
// process times after its recorded steps (profiles/collector.cpp), as the median of
// --plain-steps steps. A profiler's own CPU cost stretches CPU-bound steps (bf16 transformers: a
// 35 ms step took 58 under it), so the share of the step the GPU is busy, the advice's CPU-bound
// rules and hfnn tune's projection are taken against the plain step where the run has one, and
// every report says what the profiler cost the run, or why that is not known. Read once here for
// all of them (the reports, profiles/advice.h, tuner/tune_db.h).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "profiles/db.h"

namespace hfnn::profiles {

// One process's steps: the recorded ones and the plain ones after them.
struct RankSteps {
  int64_t rank = 0;
  int64_t steps = 0;               // recorded
  double profiled_ms = 0;          // median wall time of a recorded step
  int64_t plain_steps = 0;         // timed with collection off (the unsampled ones where no others were)
  std::optional<double> plain_ms;  // their median
  int64_t unsampled_steps = 0;         // --sample: timed between the recorded ones
  std::optional<double> unsampled_ms;  // their median
};

struct PlainStep {
  std::vector<RankSteps> ranks;        // the processes with recorded steps, by rank
  std::optional<int64_t> requested;    // --plain-steps; empty: recorded by an hfnn that did not time them
  std::optional<double> plain_ms;      // the ranks' plain steps, mean over those that have one
  double profiled_ms = 0;              // the same ranks' recorded step (every rank's without a plain step)
  int64_t plain_steps = 0;             // the fewest plain steps behind a rank's plain step
  // --sample N (1: every recorded step in full). The steps between the recorded ones run with
  // collection off, like plain steps: where no plain step was timed after the recorded ones
  // (--steps 0, a profiler left on), their median is the plain step (from_unsampled).
  int64_t sample_every = 1;
  int64_t unsampled_steps = 0;         // the fewest behind a rank's median
  std::optional<double> unsampled_ms;  // the ranks' medians, mean
  bool from_unsampled = false;
  // Without a plain step: why, and what gives one. With fewer plain steps than asked: that.
  std::string note;

  // What the profiler cost: the step under it over the plain step, less 1 (0.65: 65% longer).
  std::optional<double> cost() const;
  // The step the GPU's busy share and the projection are taken against: plain, else profiled.
  double basis_ms() const { return plain_ms.value_or(profiled_ms); }
};

PlainStep read_plain_step(Database& db, int64_t run_id);
// The middle value (the mean of the two middle ones for an even count); 0 for none.
double median(std::vector<double> values);
// The report's "profiler_cost": plain_step_ms (null without one), profiled_step_ms, cost_pct
// (null without one), plain_steps, plain_steps_requested (null: not timed by that hfnn), basis
// ("plain" or "profiled"), plain_from ("after": steps timed after the recorded ones, "between":
// --sample's unsampled steps, null), sample_every, unsampled_steps, unsampled_step_ms (null
// without), note, and text: the sentences every report prints.
nlohmann::json plain_step_json(const PlainStep& plain);

}  // namespace hfnn::profiles
