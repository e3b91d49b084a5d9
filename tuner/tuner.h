// What `hfnn tune` decides, torch-free and GPU-free so every rule is tested on the CPU: the
// statistics of a candidate's timings, the float64 correctness gate, the winner (torch unless a variant is faster by more than the noise), and the
// projected end-to-end gain. The measuring itself runs in the tune worker (python/hfnn/_tune_worker.py)
// on the GPU; this file judges what it measured.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hfnn::tuner {

// The candidate that is torch's own kernel; every other candidate is an hfnn variant name.
inline constexpr const char* kTorch = "torch";

struct Timing {
  double median_us = 0, p20_us = 0, p80_us = 0;
  int samples = 0;
  // (p80 - p20) / median: how much repeated measurements of the same thing disagree.
  double spread() const { return median_us > 0 ? (p80_us - p20_us) / median_us : 0.0; }
};
// Median and 20th/80th percentiles (linear interpolation). Empty input gives samples == 0.
Timing summarize(std::vector<double> samples_us);

struct Verdict {
  bool accepted = false;
  std::string reason;  // why not, in a few words; empty when accepted
};
// A candidate passes when its error (max|out - ref| / max|ref| over each output, against float64) is
// within `tolerance` (the family's, for the dtype), or within twice torch's own error on the same
// inputs (torch is the baseline users already accept). A missing error (NaN, not measured) or a
// failed run never passes.
Verdict gate(double max_error, double torch_error, double tolerance);

struct Candidate {
  std::string name;  // kTorch or a variant name
  Timing timing;
  double max_error = 0;
  bool ran = true;     // false: the worker could not run or time it (error says why)
  std::string error;   // the worker's message when !ran
  Verdict verdict;     // filled by judge()
};

struct Choice {
  std::string winner = kTorch;  // kTorch when no variant is accepted and faster beyond the noise
  double torch_us = 0;          // torch's median; 0 when torch could not be timed
  double best_us = 0;           // the winner's median
  double noise = 0;             // the margin a variant had to beat: max(min_margin, spreads)
};
// Gates every candidate (fills verdict), then picks the fastest accepted variant if its median is
// below torch's by more than the noise: max(min_margin, torch's spread, the variant's spread).
// Without a torch timing the fastest accepted variant wins. Rejected candidates never win.
Choice judge(std::vector<Candidate>& candidates, double tolerance, double min_margin = 0.03);

// One tunable problem as the profile saw it and the tuner judged it, for the projection.
struct KeySaving {
  double calls_per_step = 0;  // of this pass (forward or backward)
  double torch_us = 0;
  double best_us = 0;
};
struct Projection {
  double step_ms = 0;
  double saved_ms = 0;  // per step
  double projected_step_ms = 0;
  double speedup = 1;   // infinite when the savings are the whole step
  double torch_ms = 0;  // per step: torch's time in these keys (calls per step times torch's median)
  double ceiling = 1;   // the speed-up if these keys took no time at all: what no kernel can beat
};
// Amdahl, as the seeds did by hand: the step time less each pass's calls per step times what its
// winner saves per call (a winner slower than torch saves nothing: torch stays then). The ceiling
// says how much of the step the tuned ops are: the most that replacing them alone can give.
Projection project(double step_ms, const std::vector<KeySaving>& savings);

}  // namespace hfnn::tuner
