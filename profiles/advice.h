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
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "profiles/db.h"

namespace hfnn::profiles {

// Shape records the collector keeps for the advice only, never tuned (profiles/collector.cpp):
// GEMMs (aten::mm, addmm, bmm, baddbmm, _addmm_activation) as "[M,N,K]" in the first operand's
// dtype, flags "op=addmm" with ",batch=B" where batched and ",tf32=0|1" in float32 (whether TF32
// was allowed for the call); copies from a CUDA tensor into a CPU one as the source's "[sizes]",
// flags "non_blocking=0|1".
inline constexpr std::string_view kGemmShapeOp = "gemm";
inline constexpr std::string_view kHostCopyShapeOp = "copy_to_host";
inline constexpr std::string_view kAdviceShapeOps[] = {kGemmShapeOp, kHostCopyShapeOp};

// One op's totals (name over both phases and every rank) in the recorded steps.
struct OpTotals {
  int64_t calls = 0;
  double cpu_self_us = 0, cpu_total_us = 0, cuda_self_us = 0, cuda_total_us = 0;
};

// One recorded shape's totals (op, shape, dtype and flags over both phases and every rank).
struct ShapeTotals {
  std::string op, shape, dtype, flags;
  int64_t calls = 0;
  double cpu_total_us = 0, cuda_total_us = 0;
};

// A kernel's totals over every rank, by its raw name (profiles/kernel_names.h reads it).
struct KernelTotals {
  int64_t calls = 0;
  double cuda_us = 0;
};

// A LayerNorm, attention or LSTM key of the run as `hfnn tune` sees it (tuner/tune_db.h).
struct TuneKey {
  std::string op;     // the family's op (kernels/common/family.h)
  std::string label;  // as the reports show it: "LayerNorm 32768 x 256"
  std::string dtype;
  double share_pct = 0;  // of the step TuneFacts::basis names, as hfnn tune prints it
  double time_ms = 0;    // a step's time in it (CUDA total where recorded)
  // Its winner per pass on this run's GPU (torch's own kernel: "torch"); empty where not tuned there.
  std::vector<std::string> winners;
};

// What `hfnn tune` knows of the run: its keys and, where they were tuned on this run's GPU, the
// projection. Filled by the tuner (tuner::tune_facts), which reads the run as `hfnn tune` does and
// projects with its own code; the reports only pass it on (report_json's `tune_facts`).
struct TuneFacts {
  std::string basis;  // the step the shares are of: "plain", "gpu_busy" or "wall" (tuner::ProfiledRun)
  double basis_ms = 0;
  std::vector<TuneKey> keys;  // largest share first
  nlohmann::json env;         // the tuning environment on this run's GPU (tune_summary's), null: none
  nlohmann::json projection;  // its projection over every tuned key (tune_summary's), null: none
  std::map<std::string, double> saved_ms_by_op;  // per op: what its winners save a step (tuner::project)
};
using TuneFactsOf = std::function<TuneFacts(Database& db, int64_t run_id)>;

struct RunFacts {
  std::string db_path;        // the database, for the commands the advice names
  std::string gpu;            // the GPU's name, "" without one
  double compute_capability = 0;  // 9.0 for sm_90, 0 without a GPU
  bool has_cuda = false;      // some op had CUDA time (CUPTI saw the run's kernels)
  int64_t rank_steps = 0;     // recorded steps summed over ranks: per-step numbers divide by this
  double step_ms = 0;         // mean wall time of a recorded step (over ranks)
  // The step timed with collection off after the recorded ones (profiles/plain_step.h), and the
  // recorded one it compares with (medians); empty where the run has none.
  std::optional<double> plain_step_ms;
  double profiled_step_ms = 0;
  std::optional<double> gpu_busy_ms;  // mean GPU busy time of a step, where recorded and the run launched any
  int64_t gpu_activities = 0;  // kernels, memcpys and memsets over the recorded steps (all ranks)
  double cuda_self_total_us = 0;  // every op's CUDA self time: the GPU time ops account for
  std::map<std::string, OpTotals> ops;  // by op name
  std::vector<ShapeTotals> shapes;      // every recorded shape, GEMMs and host copies among them
  std::map<std::string, KernelTotals> kernels;  // by raw name
  std::optional<TuneFacts> tune;        // where the caller gave the tuner's (report_json's tune_facts)

  // calls / rank_steps (0 without steps).
  double per_step(double total) const { return rank_steps > 0 ? total / rank_steps : 0.0; }
  // The step the GPU's busy share is of: the plain step, else the recorded one (stretched by the
  // profiler where it is CPU-bound).
  double basis_step_ms() const { return plain_step_ms.value_or(step_ms); }
  // That step in words, for the evidence: "a 35.00 ms step without the profiler (58.00 ms under it)".
  std::string step_text() const;
  // The plain step's share of the recorded one (at most 1: a longer plain step is host noise);
  // empty without a plain step. A CPU time measured under the profiler, times it, is that time
  // scaled to the plain step, as the busy share and the launch rate are: the profiler stretches the
  // step's CPU work, and this takes any part of it as stretched as the whole.
  std::optional<double> plain_share() const;
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

// The run's facts; `tune_facts`, where given, adds what `hfnn tune` knows of it.
RunFacts read_run_facts(Database& db, int64_t run_id, const TuneFactsOf& tune_facts = nullptr);
// Every rule on `facts`, most severe first (then by saving).
std::vector<Advice> advise(const RunFacts& facts);
// The ids of every rule, in the table's order (what "no advice" was checked against).
std::vector<std::string> advice_rule_ids();
// The report's "advice" array: one object per Advice (id, title, action, evidence, saving_ms, null
// where there is none, saving_note, severity). report.cpp and report_html.cpp render it.
nlohmann::json advice_json(const std::vector<Advice>& advice);

}  // namespace hfnn::profiles
