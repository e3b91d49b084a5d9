// The report's Advice section: the profile turned into actions, each with its evidence from this
// run and, where it can be estimated, the step time it could save.
//
// Two halves, so a rule is one small function and is tested without a database:
// - RunFacts: what the rules need, read from the database once (per-op totals over every rank and
//   recorded step, step and GPU busy times, kernel launches).
// - kRules: one function per rule, RunFacts -> an Advice or nothing. A new rule is one more
//   function and one more entry in the table (profiles/advice.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "profiles/db.h"

namespace hfnn::profiles {

// One op's totals (name over both phases and every rank) in the recorded steps.
struct OpTotals {
  int64_t calls = 0;
  double cpu_self_us = 0, cpu_total_us = 0, cuda_self_us = 0, cuda_total_us = 0;
};

struct RunFacts {
  bool has_cuda = false;      // some op had CUDA time (CUPTI saw the run's kernels)
  int64_t rank_steps = 0;     // recorded steps summed over ranks: per-step numbers divide by this
  double step_ms = 0;         // mean wall time of a recorded step (over ranks)
  // The step timed with collection off after the recorded ones (profiles/plain_step.h), and the
  // recorded one it compares with (medians); empty where the run has none.
  std::optional<double> plain_step_ms;
  double profiled_step_ms = 0;
  std::optional<double> gpu_busy_ms;  // mean GPU busy time of a step, where recorded
  int64_t gpu_activities = 0;  // kernels, memcpys and memsets over the recorded steps (all ranks)
  double cuda_self_total_us = 0;  // every op's CUDA self time: the GPU time ops account for
  std::map<std::string, OpTotals> ops;  // by op name

  // calls / rank_steps (0 without steps).
  double per_step(double total) const { return rank_steps > 0 ? total / rank_steps : 0.0; }
  // The step the GPU's busy share is of: the plain step, else the recorded one (stretched by the
  // profiler where it is CPU-bound).
  double basis_step_ms() const { return plain_step_ms.value_or(step_ms); }
  // That step in words, for the evidence: "a 35.00 ms step without the profiler (58.00 ms under it)".
  std::string step_text() const;
  // The op's totals, zero when it did not run.
  OpTotals op(const std::string& name) const;
};

// One piece of advice. Rules fill every field; `saving_ms` is empty where no estimate is honest.
struct Advice {
  std::string id;        // stable, for scripts and tests: "cpu_bound_launches"
  std::string title;     // what was found, one line
  std::string action;    // what to do
  std::string evidence;  // this run's numbers behind it
  std::optional<double> saving_ms;  // step time it could save, per step
  std::string saving_note;          // how to read the saving ("upper bound: ...")
  int severity = 0;      // order in the report: higher first (kSeverity* in advice.cpp)
};

RunFacts read_run_facts(Database& db, int64_t run_id);
// Every rule on `facts`, most severe first (then by saving).
std::vector<Advice> advise(const RunFacts& facts);
// The ids of every rule, in the table's order (what "no advice" was checked against).
std::vector<std::string> advice_rule_ids();
// The report's "advice" array: one object per Advice (id, title, action, evidence, saving_ms, null
// where there is none, saving_note, severity). report.cpp and report_html.cpp render it.
nlohmann::json advice_json(const std::vector<Advice>& advice);

}  // namespace hfnn::profiles
