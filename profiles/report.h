// What a profile run says, read back from the database: as text (what `hfnn profile` prints at
// the end and `hfnn report` prints) and as JSON with the same content, for scripts.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "profiles/advice.h"
#include "profiles/db.h"
#include "profiles/kernel_names.h"

namespace hfnn::profiles {

// Shape records other than LayerNorm's, with their section titles: op name -> title.
inline constexpr std::pair<const char*, const char*> kModuleShapeOps[] = {
    {"multihead_attention", "MultiheadAttention query shapes"}, {"lstm", "LSTM input shapes"}};

// The report of run `run_id` (0: the newest) as JSON: run, steps (per rank, with its plain step and
// GPU busy share), profiler_cost (profiles/plain_step.h), top ops (each with its `category`),
// categories, advice (profiles/advice.h: actions with their evidence and saving) and the ids of
// the rules checked (advice_rules), kernels (each with its demangled `name`, the `short_name` the tables show, the
// `raw_name` the database keeps, its `category` and `library`: profiles/kernel_names.h), shapes.
// `tune_facts`, where given (the CLI gives the tuner's, tuner::tune_facts), adds what `hfnn tune`
// knows of the run to the advice.
nlohmann::json report_json(Database& db, int64_t run_id, int top_ops = 15, const TuneFactsOf& tune_facts = nullptr);
// The same as text for a terminal (with the tune section when the report has one).
std::string report_text(const nlohmann::json& report);
// The same as one CSV table for scripts: a row per op, kernel, shape and rank's steps, the
// `section` column saying which, empty cells where a column does not apply.
std::string report_csv(const nlohmann::json& report);
// The tune section (tuner::tune_summary's JSON, under the report's "tune" key) as text: the seeds'
// table per GPU and versions, with the projected step time.
std::string tune_text(const nlohmann::json& summary);
// The projection's ceiling in words: how much of the step torch spends in the tuned keys, and the
// most that replacing them alone could give (the speed-up if they took no time).
std::string ceiling_text(const nlohmann::json& projection);
// "Projected step time: ..." on the projection's basis (GPU busy time, with the profiled wall time
// beside it, or wall time), and a note when the GPU idled over 15% of the profiled step (empty if not).
std::string projection_text(const nlohmann::json& projection);
// " of the plain step (...)" or " of GPU busy time (wall N ms under the profiler)" by the
// projection's basis, "" on wall time.
std::string basis_text(const nlohmann::json& projection);
// Where the projection is not on the plain step and the run says why it has none: that, and the
// basis taken instead (empty otherwise).
std::string plain_fallback_text(const nlohmann::json& projection);
// A rank's GPU busy time with its share of the step: "14.00 ms (40% of the plain step)".
std::string gpu_busy_text(const nlohmann::json& rank_steps);
// "1.124x", or "no bound" for a null (infinite) speed-up.
std::string speedup_text(const nlohmann::json& speedup);
// A note when the GPU idled over 15% of the step: of the plain step, else of the profiled one.
std::string cpu_bound_note(const nlohmann::json& projection);
// A tuning key as people read it, by its family: "LayerNorm 32768 x 256"; an op without a family
// shows its key as it is.
std::string key_label(const std::string& op, const std::string& key);
// The report's Advice section (its "advice" array, profiles/advice.h) as text, and one advice's
// saving in words ("Saving: up to 3.20 ms a step (upper bound: ...)").
std::string advice_text(const nlohmann::json& report);
std::string saving_text(const nlohmann::json& advice);
// The same as one self-contained HTML page (inline CSS and SVG; no script, no network).
std::string report_html(const nlohmann::json& report);

}  // namespace hfnn::profiles
