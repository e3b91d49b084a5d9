// hfnn tune's side of the SQLite database (profiles/db.h owns the file, its schema and migrations):
// the tunable problems a profile run recorded, the tuning environment (GPU and versions) results
// are keyed by, every candidate's measurement and the winners, and the summary `hfnn tune` and
// `hfnn report` print.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "profiles/advice.h"
#include "profiles/db.h"
#include "tuner/tuner.h"

namespace hfnn::tuner {

// One tuning key of a profile run, with what the run saw of it (over every rank).
struct ProfiledKey {
  std::string op;     // the family's op, "layer_norm" (kernels/common/family.h)
  std::string key;    // the family's key_of()
  std::string dtype;
  std::vector<std::string> shapes;  // the recorded input shapes that map onto it
  int64_t fwd_calls = 0, bwd_calls = 0;
  double fwd_calls_per_step = 0, bwd_calls_per_step = 0;  // per rank
  double time_us = 0;   // forward + backward, CUDA total (CPU total in a CPU-only profile), all ranks
  double run_pct = 0;   // of the op's forward calls in the run (the seeds' Run%), per op
  double share_pct = 0; // of the run's step time
};

struct ProfiledRun {
  int64_t id = 0;
  std::string command;
  int64_t ranks = 1;
  int64_t steps = 0;       // recorded, per rank
  // Medians over the recorded steps of the lowest rank: one slow step (a part file written, a
  // collective waiting on a late rank) does not move them.
  double step_ms = 0;      // wall time of a recorded step
  double gpu_busy_ms = 0;  // GPU busy time of a recorded step (0 without CUDA activity)
  // The plain step (profiles/plain_step.h): a step's wall time with the profiler's collection off,
  // 0 where the run has none, and then why (plain_note; also set when fewer steps were timed than asked).
  double plain_step_ms = 0;
  std::string plain_note;
  std::string time_basis;  // "cuda" or "cpu"
  // The step time shares and the end-to-end projection are taken against: the plain step when the
  // run has one (the wall time the script's steps take without hfnn); else GPU busy time when the
  // profile has it (the time kernels can shorten, and unlike wall time not stretched by the
  // profiler's own CPU cost, which can be large on CPU-bound steps), else wall time.
  bool on_plain() const { return plain_step_ms > 0; }
  bool on_gpu_busy() const { return !on_plain() && gpu_busy_ms > 0; }
  const char* basis() const { return on_plain() ? "plain" : on_gpu_busy() ? "gpu_busy" : "wall"; }
  double basis_ms() const { return on_plain() ? plain_step_ms : on_gpu_busy() ? gpu_busy_ms : step_ms; }
  std::vector<ProfiledKey> keys;  // by share, largest first
  // Shapes of recorded ops that no family tunes yet: op -> number of distinct shapes.
  std::vector<std::pair<std::string, int64_t>> untunable;
};

// The run's tunable keys (run 0: the newest). Throws profiles::DbError when there is no such run.
ProfiledRun load_profiled_run(profiles::Database& db, int64_t run);

// The GPU and software versions results are keyed by: a table tuned on one never applies to another.
struct TuneEnv {
  std::string gpu, compute_capability, cuda, torch, hfnn;
  int64_t sm_count = 0;
  static TuneEnv from_json(const nlohmann::json& hello);
  std::string describe() const;  // "NVIDIA H200 (sm 9.0, 132 SMs), CUDA 13.0, torch 2.11.0, hfnn 0.1.0"
};
// The env's id, added if new (in its own transaction); 0 with `create` false when it is not there.
int64_t env_id(profiles::Database& db, const TuneEnv& env, bool create);

// Whether every pass of the key already has a winner for the env.
bool is_tuned(profiles::Database& db, int64_t env, const std::string& op, const std::string& key,
              const std::string& dtype, const std::vector<std::string>& passes);

struct PassResult {
  std::string pass;
  std::vector<Candidate> candidates;  // judged
  Choice choice;
};
// Replaces the key's results and winners for the env, in one transaction.
void store(profiles::Database& db, int64_t env, const std::string& op, const std::string& key, const std::string& dtype,
           const std::vector<PassResult>& passes);

// The tune section of the reports: per tunable key of the run, per pass, torch's and the winner's
// time for each env that tuned it, and the projection. JSON {"envs": [{"env", "rows": [...],
// "projection": {...}}]}; {"envs": []} when nothing was tuned.
nlohmann::json tune_summary(profiles::Database& db, const ProfiledRun& run);
// (Its text form is profiles::tune_text, beside the other report renderers.)

// What the reports' advice needs of the tuner (profiles/advice.h's TuneFacts): run `run`'s keys with
// their shares and, where they were tuned on the run's GPU (the newest environment with its name and
// compute capability), their winners and the projection, over every tuned key (tune_summary's) and
// per op (project() over that op's keys). `summary`, where given, receives tune_summary's JSON.
// Throws profiles::DbError as load_profiled_run does.
profiles::TuneFacts tune_facts(profiles::Database& db, int64_t run, nlohmann::json* summary = nullptr);

}  // namespace hfnn::tuner
