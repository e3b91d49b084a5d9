// HFNN_DISPATCH_DB as torch ops, for every family: hfnn::dispatch_load (read the table, route
// each family's torch op through it), dispatch_stats (what the calls ran, as JSON) and
// dispatch_reset_counts. The table and the counts live in src/dispatch.h; each family's op file
// adds its router there.
#include <fmt/format.h>
#include <torch/library.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/dispatch.h"

namespace hfnn::dispatch {
namespace {

// Loads the table (once per process; a second call replaces it) and routes every family's torch
// op through it (run_routers). Returns JSON: {"ok", "problem" (one line, or ""), "notes" [...],
// "keys", "gpus"}. A problem leaves the table empty: every call runs torch's kernel and is counted
// as a fall-back.
std::string dispatch_load(c10::string_view path, c10::string_view torch_version, c10::string_view cuda_version,
                          c10::string_view hfnn_version, c10::string_view policy, bool strict) {
  TORCH_CHECK(policy == "torch" || policy == "heuristic", "HFNN_DISPATCH_POLICY=", std::string(policy),
              ": expected torch (keys without a winner run torch's kernel) or heuristic (hfnn's built-in choice)");
  const std::string db(path);
  std::shared_ptr<const Table> table;
  std::string problem;
  std::vector<std::string> notes;
  try {
    auto loaded = Table::load(db, {std::string(torch_version), std::string(cuda_version), std::string(hfnn_version)});
    if (loaded.gpu_count() == 0 && loaded.other_versions.empty()) {
      problem = fmt::format("{}: has no tuned winners yet; run `hfnn tune --db {}` on this GPU first", db, db);
    } else if (loaded.gpu_count() == 0) {
      std::string others;
      for (const auto& o : loaded.other_versions) others += (others.empty() ? "" : "; ") + o;
      problem = fmt::format("{}: tuned with other versions ({}), not with torch {}, CUDA {}, hfnn {}; run `hfnn tune "
                            "--db {}` again",
                            db, others, std::string(torch_version), std::string(cuda_version),
                            std::string(hfnn_version), db);
    }
    for (const auto& v : loaded.unknown_variants)
      notes.push_back(fmt::format("{}: winner '{}' is not in this build of hfnn; those keys run as untuned", db, v));
    table = std::make_shared<const Table>(std::move(loaded));
  } catch (const LoadError& e) {
    problem = e.what();
  }
  Runtime::get().configure(table, db, policy == "torch" ? Policy::kTorch : Policy::kHeuristic, strict);
  run_routers();
  nlohmann::json gpus = nlohmann::json::array();
  if (table)
    for (const auto& g : table->gpus()) gpus.push_back(g.describe());
  return nlohmann::json{{"ok", problem.empty()}, {"problem", problem}, {"notes", notes},
                        {"keys", table ? table->key_count() : 0}, {"gpus", gpus}}
      .dump();
}

std::string dispatch_stats() { return Runtime::get().stats_json(); }

void dispatch_reset_counts() { Runtime::get().reset_counts(); }

}  // namespace
}  // namespace hfnn::dispatch

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def("dispatch_load(str path, str torch_version, str cuda_version, str hfnn_version, str policy, bool strict) -> str",
        TORCH_FN(hfnn::dispatch::dispatch_load));
  m.def("dispatch_stats() -> str", TORCH_FN(hfnn::dispatch::dispatch_stats));
  m.def("dispatch_reset_counts() -> ()", TORCH_FN(hfnn::dispatch::dispatch_reset_counts));
}
