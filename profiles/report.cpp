#include "profiles/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

namespace hfnn::profiles {

std::string op_category(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("layer_norm")) return "layer_norm";
  if (has("attention") || has("softmax")) return "attention";
  if (has("lstm") || has("rnn")) return "lstm";
  if (has("nccl") || has("c10d") || has("all_reduce") || has("allreduce") || has("all_gather") || has("broadcast"))
    return "communication";
  for (const char* g : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::einsum", "aten::_scaled_mm", "gemm"})
    if (name == g || (name.rfind(g, 0) == 0 && name.size() == std::string(g).size())) return "gemm";
  if (name.rfind("aten::", 0) == 0) return "elementwise";  // the remaining aten ops: pointwise, copies, reductions
  return "other";
}

nlohmann::json report_json(Database& db, int64_t run_id, int top_ops) {
  if (run_id == 0) run_id = db.latest_run();
  Statement run(db.handle(),
                "SELECT id, command, started_at, exit_code, world_size, warmup, steps_requested, steps_recorded, torch,"
                " hfnn, cuda, gpu, compute_capability, sm_count FROM runs WHERE id = ?");
  run.bind(1, run_id);
  if (!run.step())
    throw DbError(fmt::format("{}: no run {} (it holds runs 1 to {}); pass --run", db.path(), run_id, db.latest_run()));
  nlohmann::json r;
  r["run"] = {{"id", run.column_int(0)}, {"command", run.column_text(1)}, {"started_at", run.column_text(2)},
              {"exit_code", run.column_int(3)}, {"world_size", run.column_int(4)}, {"warmup", run.column_int(5)},
              {"steps_requested", run.column_int(6)}, {"steps_recorded", run.column_int(7)},
              {"torch", run.column_text(8)}, {"hfnn", run.column_text(9)}, {"cuda", run.column_text(10)},
              {"gpu", run.column_is_null(11) ? nlohmann::json() : nlohmann::json(run.column_text(11))},
              {"compute_capability", run.column_text(12)}, {"sm_count", run.column_int(13)}};
  r["cuda_note"] = run.column_is_null(11)
                       ? "no CUDA device in the profiled process: CUDA columns are empty, times are CPU times"
                       : "CUDA times are not collected yet (CUPTI comes next): times are CPU times";

  // Steps, per rank.
  nlohmann::json ranks = nlohmann::json::array();
  Statement steps(db.handle(),
                  "SELECT rank, count(*), avg(wall_ms), min(wall_ms), max(wall_ms) FROM step_stats WHERE run_id = ?"
                  " GROUP BY rank ORDER BY rank");
  steps.bind(1, run_id);
  while (steps.step())
    ranks.push_back({{"rank", steps.column_int(0)}, {"steps", steps.column_int(1)}, {"mean_ms", steps.column_double(2)},
                     {"min_ms", steps.column_double(3)}, {"max_ms", steps.column_double(4)}});
  r["steps"] = ranks;

  // Ops by CPU self time, summed over ranks.
  Statement ops(db.handle(),
                "SELECT name, phase, sum(calls), sum(cpu_self_us), sum(cpu_total_us) FROM op_stats WHERE run_id = ?"
                " GROUP BY name, phase ORDER BY sum(cpu_self_us) DESC");
  ops.bind(1, run_id);
  double total_self = 0;
  std::map<std::string, double> categories;
  nlohmann::json top = nlohmann::json::array();
  while (ops.step()) {
    const std::string name = ops.column_text(0);
    const double self = ops.column_double(3);
    total_self += self;
    categories[op_category(name)] += self;
    if (static_cast<int>(top.size()) < top_ops)
      top.push_back({{"name", name}, {"phase", ops.column_text(1)}, {"calls", ops.column_int(2)},
                     {"cpu_self_us", self}, {"cpu_total_us", ops.column_double(4)}});
  }
  for (auto& o : top) o["share"] = total_self > 0 ? o["cpu_self_us"].get<double>() / total_self : 0.0;
  r["ops"] = top;
  r["cpu_self_total_us"] = total_self;
  nlohmann::json cats = nlohmann::json::object();
  for (const auto& [k, v] : categories) cats[k] = total_self > 0 ? v / total_self : 0.0;
  r["categories"] = cats;

  // LayerNorm shapes: calls per shape, Run% as in the seed's table (share of forward calls).
  Statement shapes(db.handle(),
                   "SELECT op, shape, normalized_shape, dtype, affine,"
                   " sum(CASE WHEN phase = 'fwd' THEN calls ELSE 0 END), sum(CASE WHEN phase = 'bwd' THEN calls ELSE 0 END),"
                   " sum(cpu_total_us) FROM shape_stats WHERE run_id = ?"
                   " GROUP BY op, shape, normalized_shape, dtype, affine ORDER BY sum(cpu_total_us) DESC");
  shapes.bind(1, run_id);
  nlohmann::json shape_rows = nlohmann::json::array();
  int64_t fwd_calls = 0;
  double shape_time = 0;
  while (shapes.step()) {
    shape_rows.push_back({{"op", shapes.column_text(0)}, {"shape", shapes.column_text(1)},
                          {"normalized_shape", shapes.column_text(2)}, {"dtype", shapes.column_text(3)},
                          {"affine", shapes.column_int(4) != 0}, {"fwd_calls", shapes.column_int(5)},
                          {"bwd_calls", shapes.column_int(6)}, {"cpu_total_us", shapes.column_double(7)}});
    fwd_calls += shapes.column_int(5);
    shape_time += shapes.column_double(7);
  }
  for (auto& s : shape_rows) {
    s["run_pct"] = fwd_calls > 0 ? 100.0 * s["fwd_calls"].get<int64_t>() / fwd_calls : 0.0;
    s["time_share"] = shape_time > 0 ? s["cpu_total_us"].get<double>() / shape_time : 0.0;
  }
  r["shapes"] = shape_rows;
  return r;
}

std::string report_text(const nlohmann::json& r) {
  std::string out;
  const auto& run = r["run"];
  out += fmt::format("hfnn profile, run {}: {}\n", run["id"].get<int64_t>(), run["command"].get<std::string>());
  out += fmt::format("  exit code {}, torch {}, hfnn {}, GPU {}\n", run["exit_code"].get<int64_t>(),
                     run["torch"].get<std::string>(), run["hfnn"].get<std::string>(),
                     run["gpu"].is_null() ? std::string("none")
                                          : fmt::format("{} (sm_{}, {} SMs)", run["gpu"].get<std::string>(),
                                                        run["compute_capability"].get<std::string>(),
                                                        run["sm_count"].get<int64_t>()));
  out += "  " + r["cuda_note"].get<std::string>() + "\n";
  if (r["steps"].empty()) {
    out += "  steps: none seen (no optimizer.step() or hfnn.step()): the numbers cover the whole run\n";
  } else {
    for (const auto& s : r["steps"])
      out += fmt::format("  rank {}: {} steps recorded after {} warm-up, {:.2f} ms mean ({:.2f} to {:.2f})\n",
                         s["rank"].get<int64_t>(), s["steps"].get<int64_t>(), run["warmup"].get<int64_t>(),
                         s["mean_ms"].get<double>(), s["min_ms"].get<double>(), s["max_ms"].get<double>());
  }
  out += fmt::format("\nTop ops by CPU self time\n  {:<48} {:>5} {:>7} {:>11} {:>7} {:>12}\n", "op", "phase", "calls",
                     "self ms", "share", "total ms");
  for (const auto& o : r["ops"]) {
    std::string name = o["name"].get<std::string>();
    if (name.size() > 48) name = name.substr(0, 45) + "...";
    out += fmt::format("  {:<48} {:>5} {:>7} {:>11.3f} {:>6.1f}% {:>12.3f}\n", name, o["phase"].get<std::string>(),
                       o["calls"].get<int64_t>(), o["cpu_self_us"].get<double>() / 1e3, 100 * o["share"].get<double>(),
                       o["cpu_total_us"].get<double>() / 1e3);
  }
  out += "\nShare by category:";
  std::vector<std::pair<double, std::string>> cats;
  for (const auto& [k, v] : r["categories"].items()) cats.emplace_back(v.get<double>(), k);
  std::sort(cats.rbegin(), cats.rend());
  for (const auto& [v, k] : cats) out += fmt::format("  {} {:.1f}%", k, 100 * v);
  out += "\n";
  if (r["shapes"].empty()) {
    out += "\nNo LayerNorm ran in the recorded steps: nothing for `hfnn tune` to tune.\n";
  } else {
    out += fmt::format("\nLayerNorm input shapes (what `hfnn tune` tunes)\n  {:<22} {:<11} {:<9} {:<6} {:>9} {:>7} {:>9} {:>10} {:>6}\n",
                       "shape", "normalized", "dtype", "affine", "fwd calls", "Run%", "bwd calls", "CPU ms", "share");
    for (const auto& s : r["shapes"])
      out += fmt::format("  {:<22} {:<11} {:<9} {:<6} {:>9} {:>6.2f}% {:>9} {:>10.3f} {:>5.1f}%\n",
                         s["shape"].get<std::string>(), s["normalized_shape"].get<std::string>(),
                         s["dtype"].get<std::string>(), s["affine"].get<bool>() ? "yes" : "no",
                         s["fwd_calls"].get<int64_t>(), s["run_pct"].get<double>(), s["bwd_calls"].get<int64_t>(),
                         s["cpu_total_us"].get<double>() / 1e3, 100 * s["time_share"].get<double>());
  }
  return out;
}

}  // namespace hfnn::profiles
