#include "profiles/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "kernels/common/family.h"
#include "profiles/advice.h"
#include "profiles/plain_step.h"

namespace hfnn::profiles {

nlohmann::json report_json(Database& db, int64_t run_id, int top_ops, const TuneFactsOf& tune_facts) {
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
  bool has_cuda = false;
  {
    // CUDA time where some was recorded; a CPU-only script on a GPU machine is ranked by CPU time.
    Statement c(db.handle(), "SELECT count(*) FROM op_stats WHERE run_id = ? AND cuda_self_us > 0");
    c.bind(1, run_id);
    c.step();
    has_cuda = c.column_int(0) > 0;
  }
  r["time_basis"] = has_cuda ? "cuda" : "cpu";
  r["cuda_note"] = run.column_is_null(11)
                       ? "no CUDA device in the profiled process: CUDA columns are empty, times are CPU times"
                       : has_cuda ? "CUDA times from CUPTI: a kernel's time counts for the op that launched it (self) "
                                    "and for every op around it (total); ops are ranked by CUDA self time"
                                  : "no CUDA time was recorded (the steps ran on the CPU, or CUPTI was held by another "
                                    "client such as torch.profiler): times are CPU times";

  // Steps, per rank.
  nlohmann::json ranks = nlohmann::json::array();
  Statement steps(db.handle(),
                  "SELECT rank, count(*), avg(wall_ms), min(wall_ms), max(wall_ms), avg(gpu_busy_ms) FROM step_stats"
                  " WHERE run_id = ? GROUP BY rank ORDER BY rank");
  steps.bind(1, run_id);
  while (steps.step())
    ranks.push_back({{"rank", steps.column_int(0)}, {"steps", steps.column_int(1)}, {"mean_ms", steps.column_double(2)},
                     {"min_ms", steps.column_double(3)}, {"max_ms", steps.column_double(4)},
                     {"gpu_busy_ms", steps.column_is_null(5) ? nlohmann::json() : nlohmann::json(steps.column_double(5))}});
  // Each rank's share of its own time in communication (NCCL/gloo collectives), on the same basis
  // as the op table: a slow rank and a waiting rank look different here.
  {
    Statement per_rank(db.handle(), has_cuda ? "SELECT rank, name, sum(cuda_self_us) FROM op_stats WHERE run_id = ?"
                                               " GROUP BY rank, name"
                                             : "SELECT rank, name, sum(cpu_self_us) FROM op_stats WHERE run_id = ?"
                                               " GROUP BY rank, name");
    per_rank.bind(1, run_id);
    std::map<int64_t, std::pair<double, double>> comm;  // rank -> (communication, all)
    while (per_rank.step()) {
      auto& [c, all] = comm[per_rank.column_int(0)];
      const double t = per_rank.column_double(2);
      all += t;
      if (op_category(per_rank.column_text(1)) == "communication") c += t;
    }
    for (auto& s : ranks) {
      const auto it = comm.find(s["rank"].get<int64_t>());
      s["communication_share"] = it != comm.end() && it->second.second > 0 ? it->second.first / it->second.second : 0.0;
    }
  }
  // The plain step (profiles/plain_step.h): what the profiler cost, and the step the GPU's busy share is of.
  const PlainStep plain = read_plain_step(db, run_id);
  for (auto& s : ranks) {
    const auto it = std::find_if(plain.ranks.begin(), plain.ranks.end(),
                                 [&](const RankSteps& p) { return p.rank == s["rank"].get<int64_t>(); });
    if (it == plain.ranks.end()) continue;
    s["median_ms"] = it->profiled_ms;
    s["plain_step_ms"] = it->plain_ms ? nlohmann::json(*it->plain_ms) : nlohmann::json();
    s["plain_steps"] = it->plain_steps;
    // The share of the step the GPU is busy: of the plain step where the rank has one, else of the
    // step under the profiler (its mean, as gpu_busy_ms is).
    if (s["gpu_busy_ms"].is_number()) {
      const double step = it->plain_ms.value_or(s["mean_ms"].get<double>());
      s["gpu_busy_share"] = step > 0 ? s["gpu_busy_ms"].get<double>() / step : 0.0;
      s["gpu_busy_share_of"] = it->plain_ms ? "plain" : "profiled";
    }
  }
  r["steps"] = ranks;
  r["profiler_cost"] = plain_step_json(plain);

  // Ops by self time (CUDA where recorded, else CPU), summed over ranks.
  Statement ops(db.handle(), has_cuda
                                 ? "SELECT name, phase, sum(calls), sum(cpu_self_us), sum(cpu_total_us), sum(cuda_self_us),"
                                   " sum(cuda_total_us), max(forward_op) FROM op_stats WHERE run_id = ? GROUP BY name, phase"
                                   " ORDER BY sum(cuda_self_us) DESC, sum(cpu_self_us) DESC"
                                 : "SELECT name, phase, sum(calls), sum(cpu_self_us), sum(cpu_total_us), NULL, NULL,"
                                   " max(forward_op) FROM op_stats WHERE run_id = ? GROUP BY name, phase"
                                   " ORDER BY sum(cpu_self_us) DESC");
  ops.bind(1, run_id);
  const char* basis = has_cuda ? "cuda_self_us" : "cpu_self_us";
  double total_self = 0;
  std::map<std::string, double> categories;
  nlohmann::json top = nlohmann::json::array();
  while (ops.step()) {
    const std::string name = ops.column_text(0);
    const double self = has_cuda ? ops.column_double(5) : ops.column_double(3);
    total_self += self;
    const std::string category = op_category(name);
    categories[category] += self;
    if (static_cast<int>(top.size()) < top_ops)
      top.push_back({{"name", name}, {"category", category}, {"phase", ops.column_text(1)}, {"calls", ops.column_int(2)},
                     {"cpu_self_us", ops.column_double(3)}, {"cpu_total_us", ops.column_double(4)},
                     {"cuda_self_us", has_cuda ? nlohmann::json(ops.column_double(5)) : nlohmann::json()},
                     {"cuda_total_us", has_cuda ? nlohmann::json(ops.column_double(6)) : nlohmann::json()},
                     {"forward_op", ops.column_text(7)}});
  }
  for (auto& o : top) o["share"] = total_self > 0 ? o[basis].get<double>() / total_self : 0.0;
  r["ops"] = top;
  r["self_total_us"] = total_self;

  // Kernels by CUDA time.
  nlohmann::json kernels = nlohmann::json::array();
  Statement ks(db.handle(),
               "SELECT name, sum(calls), sum(cuda_us) FROM kernel_stats WHERE run_id = ? GROUP BY name"
               " ORDER BY sum(cuda_us) DESC LIMIT ?");
  ks.bind(1, run_id).bind(2, int64_t{top_ops});
  double kernel_total = 0;
  {
    Statement kt(db.handle(), "SELECT coalesce(sum(cuda_us), 0) FROM kernel_stats WHERE run_id = ?");
    kt.bind(1, run_id);
    kt.step();
    kernel_total = kt.column_double(0);
  }
  while (ks.step()) {
    // The database keeps CUPTI's raw (mangled) names, older files too: demangled here, on reading.
    const KernelName k = describe_kernel(ks.column_text(0));
    kernels.push_back({{"name", k.full}, {"short_name", k.short_name}, {"raw_name", k.raw}, {"category", k.category},
                       {"library", k.library}, {"calls", ks.column_int(1)}, {"cuda_us", ks.column_double(2)},
                       {"share", kernel_total > 0 ? ks.column_double(2) / kernel_total : 0.0}});
  }
  r["kernels"] = kernels;
  nlohmann::json cats = nlohmann::json::object();
  for (const auto& [k, v] : categories) cats[k] = total_self > 0 ? v / total_self : 0.0;
  r["categories"] = cats;

  // LayerNorm shapes: calls per shape, Run% as in the seed's table (share of forward calls).
  Statement shapes(db.handle(),
                   "SELECT op, shape, normalized_shape, dtype, affine,"
                   " sum(CASE WHEN phase = 'fwd' THEN calls ELSE 0 END), sum(CASE WHEN phase = 'bwd' THEN calls ELSE 0 END),"
                   " sum(cpu_total_us), sum(cuda_total_us), flags FROM shape_stats WHERE run_id = ?"
                   " GROUP BY op, shape, normalized_shape, dtype, affine, flags"
                   " ORDER BY op DESC, coalesce(sum(cuda_total_us), 0) DESC, sum(cpu_total_us) DESC");
  shapes.bind(1, run_id);
  nlohmann::json shape_rows = nlohmann::json::array();
  std::map<std::string, int64_t> fwd_calls;  // per op: Run% and shares are within an op
  std::map<std::string, double> shape_time;
  while (shapes.step()) {
    const double t = has_cuda ? shapes.column_double(8) : shapes.column_double(7);
    shape_rows.push_back({{"op", shapes.column_text(0)}, {"shape", shapes.column_text(1)},
                          {"normalized_shape", shapes.column_text(2)}, {"dtype", shapes.column_text(3)},
                          {"affine", shapes.column_int(4) != 0}, {"fwd_calls", shapes.column_int(5)},
                          {"bwd_calls", shapes.column_int(6)}, {"cpu_total_us", shapes.column_double(7)},
                          {"cuda_total_us", has_cuda ? nlohmann::json(shapes.column_double(8)) : nlohmann::json()},
                          {"time_us", t}, {"flags", shapes.column_text(9)}});
    fwd_calls[shapes.column_text(0)] += shapes.column_int(5);
    shape_time[shapes.column_text(0)] += t;
  }
  for (auto& s : shape_rows) {
    const std::string op = s["op"].get<std::string>();
    s["run_pct"] = fwd_calls[op] > 0 ? 100.0 * s["fwd_calls"].get<int64_t>() / fwd_calls[op] : 0.0;
    s["time_share"] = shape_time[op] > 0 ? s["time_us"].get<double>() / shape_time[op] : 0.0;
  }
  r["shapes"] = shape_rows;
  // What to do about it: profiles/advice.h's rules on this run's numbers.
  r["advice"] = advice_json(advise(read_run_facts(db, run_id, tune_facts)));
  r["advice_rules"] = advice_rule_ids();
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
    for (const auto& s : r["steps"]) {
      const bool plain = s.value("plain_step_ms", nlohmann::json()).is_number();
      out += fmt::format("  rank {}: {} steps recorded after {} warm-up, {:.2f} ms mean ({:.2f} to {:.2f}){}{}, "
                         "communication {:.1f}%\n",
                         s["rank"].get<int64_t>(), s["steps"].get<int64_t>(), run["warmup"].get<int64_t>(),
                         s["mean_ms"].get<double>(), s["min_ms"].get<double>(), s["max_ms"].get<double>(),
                         plain ? fmt::format(", plain step {:.2f} ms ({} steps)", s["plain_step_ms"].get<double>(),
                                             s["plain_steps"].get<int64_t>())
                               : std::string(),
                         s["gpu_busy_ms"].is_null() ? std::string() : ", GPU busy " + gpu_busy_text(s),
                         100 * s["communication_share"].get<double>());
    }
  }
  if (r.contains("profiler_cost")) out += "  " + r["profiler_cost"]["text"].get<std::string>() + "\n";
  const bool cuda = r["time_basis"] == "cuda";
  const std::string self_key = cuda ? "cuda_self_us" : "cpu_self_us", total_key = cuda ? "cuda_total_us" : "cpu_total_us";
  out += fmt::format("\nTop ops by {} self time\n  {:<48} {:>5} {:>7} {:>11} {:>7} {:>12}{}\n", cuda ? "CUDA" : "CPU", "op",
                     "phase", "calls", "self ms", "share", "total ms", cuda ? "  CPU self ms" : "");
  for (const auto& o : r["ops"]) {
    std::string name = o["name"].get<std::string>();
    // A backward node says which forward op made it: "NativeLayerNormBackward0 <- aten::layer_norm".
    constexpr std::string_view kNode = "autograd::engine::evaluate_function: ";
    if (name.rfind(kNode, 0) == 0) name = name.substr(kNode.size());
    if (const std::string fwd = o.value("forward_op", std::string()); !fwd.empty()) name += " <- " + fwd;
    if (name.size() > 48) name = name.substr(0, 45) + "...";
    out += fmt::format("  {:<48} {:>5} {:>7} {:>11.3f} {:>6.1f}% {:>12.3f}{}\n", name, o["phase"].get<std::string>(),
                       o["calls"].get<int64_t>(), o[self_key].get<double>() / 1e3, 100 * o["share"].get<double>(),
                       o[total_key].get<double>() / 1e3,
                       cuda ? fmt::format(" {:>12.3f}", o["cpu_self_us"].get<double>() / 1e3) : std::string());
  }
  if (!r["kernels"].empty()) {
    // Names as torch.profiler's table shows them (demangled, cut to its 55-wide column); the JSON
    // report has them whole.
    out += fmt::format("\nTop kernels by CUDA time\n  {:<{}} {:<13} {:<13} {:>7} {:>10} {:>7}\n", "kernel",
                       kShortNameWidth, "category", "library", "calls", "CUDA ms", "share");
    for (const auto& k : r["kernels"])
      out += fmt::format("  {:<{}} {:<13} {:<13} {:>7} {:>10.3f} {:>6.1f}%\n", k["short_name"].get<std::string>(),
                         kShortNameWidth, k["category"].get<std::string>(), k["library"].get<std::string>(),
                         k["calls"].get<int64_t>(), k["cuda_us"].get<double>() / 1e3, 100 * k["share"].get<double>());
  }
  out += "\nShare by category:";
  std::vector<std::pair<double, std::string>> cats;
  for (const auto& [k, v] : r["categories"].items()) cats.emplace_back(v.get<double>(), k);
  std::sort(cats.rbegin(), cats.rend());
  for (const auto& [v, k] : cats) out += fmt::format("  {} {:.1f}%", k, 100 * v);
  out += "\n";
  bool any_layer_norm = false;
  for (const auto& s : r["shapes"]) any_layer_norm = any_layer_norm || s["op"] == "layer_norm";
  if (!any_layer_norm) {
    out += "\nNo LayerNorm ran in the recorded steps: nothing for `hfnn tune` to tune.\n";
  } else {
    out += fmt::format("\nLayerNorm input shapes (what `hfnn tune` tunes)\n  {:<22} {:<11} {:<9} {:<6} {:>9} {:>7} {:>9} {:>10} {:>6}\n",
                       "shape", "normalized", "dtype", "affine", "fwd calls", "Run%", "bwd calls",
                       cuda ? "CUDA ms" : "CPU ms", "share");
    for (const auto& s : r["shapes"])
      if (s["op"] == "layer_norm")
        out += fmt::format("  {:<22} {:<11} {:<9} {:<6} {:>9} {:>6.2f}% {:>9} {:>10.3f} {:>5.1f}%\n",
                           s["shape"].get<std::string>(), s["normalized_shape"].get<std::string>(),
                           s["dtype"].get<std::string>(), s["affine"].get<bool>() ? "yes" : "no",
                           s["fwd_calls"].get<int64_t>(), s["run_pct"].get<double>(), s["bwd_calls"].get<int64_t>(),
                           s["time_us"].get<double>() / 1e3, 100 * s["time_share"].get<double>());
  }
  for (const auto& [op, title] : kModuleShapeOps) {
    bool any = false;
    for (const auto& s : r["shapes"]) any = any || s["op"] == op;
    if (!any) continue;
    out += fmt::format("\n{} (forward calls)\n  {:<18} {:<9} {:<62} {:>6} {:>7} {:>10} {:>6}\n", title, "input", "dtype",
                       "settings", "calls", "Run%", cuda ? "CUDA ms" : "CPU ms", "share");
    for (const auto& s : r["shapes"])
      if (s["op"] == op)
        out += fmt::format("  {:<18} {:<9} {:<62} {:>6} {:>6.2f}% {:>10.3f} {:>5.1f}%\n", s["shape"].get<std::string>(),
                           s["dtype"].get<std::string>(), s["flags"].get<std::string>(), s["fwd_calls"].get<int64_t>(),
                           s["run_pct"].get<double>(), s["time_us"].get<double>() / 1e3,
                           100 * s["time_share"].get<double>());
  }
  if (r.contains("advice")) out += advice_text(r);
  if (r.contains("tune")) out += tune_text(r["tune"]);
  return out;
}

std::string advice_text(const nlohmann::json& r) {
  const auto& advice = r["advice"];
  if (advice.empty())
    return fmt::format("\nAdvice: none; this run's numbers trigger none of the rules ({})\n",
                       fmt::join(r.value("advice_rules", std::vector<std::string>()), ", "));
  std::string out = "\nAdvice (most important first)\n";
  int i = 0;
  for (const auto& a : advice) {
    out += fmt::format("  {}. {} [{}]\n", ++i, a["title"].get<std::string>(), a["id"].get<std::string>());
    out += fmt::format("     Do: {}\n", a["action"].get<std::string>());
    out += fmt::format("     Evidence: {}\n", a["evidence"].get<std::string>());
    out += "     " + saving_text(a) + "\n";
  }
  return out;
}

std::string saving_text(const nlohmann::json& a) {
  if (!a["saving_ms"].is_number()) return fmt::format("Saving: {}", a["saving_note"].get<std::string>());
  return fmt::format("Saving: up to {:.2f} ms a step ({})", a["saving_ms"].get<double>(),
                     a["saving_note"].get<std::string>());
}

std::string gpu_busy_text(const nlohmann::json& s) {
  std::string t = fmt::format("{:.2f} ms", s["gpu_busy_ms"].get<double>());
  if (!s.contains("gpu_busy_share")) return t;
  return t + fmt::format(" ({:.0f}% of the {})", 100 * s["gpu_busy_share"].get<double>(),
                         s["gpu_busy_share_of"] == "plain" ? "plain step" : "step under the profiler");
}

std::string speedup_text(const nlohmann::json& speedup) {
  return speedup.is_number() ? fmt::format("{:.3f}x", speedup.get<double>()) : "no bound";
}

namespace {
std::string basis_of(const nlohmann::json& p) { return p.value("basis", std::string("wall")); }
}  // namespace

std::string basis_text(const nlohmann::json& p) {
  const std::string basis = basis_of(p);
  if (basis == "plain")
    return fmt::format(" of the plain step (timed without the profiler; {:.2f} ms under it)", p["wall_step_ms"].get<double>());
  if (basis == "gpu_busy")
    return fmt::format(" of GPU busy time (wall {:.2f} ms under the profiler)", p["wall_step_ms"].get<double>());
  return "";
}

std::string plain_fallback_text(const nlohmann::json& p) {
  if (basis_of(p) == "plain" || p.value("plain_note", std::string()).empty()) return {};
  return fmt::format("No plain step ({}): projected on the {} of the steps under the profiler", p["plain_note"].get<std::string>(),
                     basis_of(p) == "gpu_busy" ? "GPU busy time" : "wall time");
}

std::string projection_text(const nlohmann::json& p) {
  return fmt::format("Projected step time: {:.2f} ms -> {:.2f} ms ({}){}, {:.2f} ms/step saved on these keys",
                     p["step_ms"].get<double>(), p["projected_step_ms"].get<double>(), speedup_text(p["speedup"]),
                     basis_text(p), p["saved_ms"].get<double>());
}

std::string cpu_bound_note(const nlohmann::json& p) {
  // The GPU's busy time over the step: the plain step where the projection is on it, else the
  // step under the profiler (whose busy time is then the projection's step).
  const bool plain = basis_of(p) == "plain";
  if (plain ? !p.value("gpu_busy_ms", nlohmann::json()).is_number() : basis_of(p) != "gpu_busy") return {};
  const double busy = p[plain ? "gpu_busy_ms" : "step_ms"].get<double>();
  const double step = p[plain ? "step_ms" : "wall_step_ms"].get<double>();
  if (step <= 0 || busy >= 0.85 * step) return {};
  return fmt::format("Note: the GPU was busy {:.0f}% of the {}, so the step is CPU-bound {}; faster kernels shorten GPU "
                     "time only, {}and the gain shows where the GPU is the bottleneck",
                     100 * busy / step, plain ? "plain step" : "profiled step",
                     plain ? "without the profiler too" : "under the profiler and may be without it",
                     plain ? "so the projection is the most they could give, " : "");
}

std::string ceiling_text(const nlohmann::json& p) {
  const double step = p["step_ms"].get<double>(), torch_ms = p["torch_ms"].get<double>();
  const std::string head = fmt::format("Ceiling: torch spends {:.2f} ms/step ({:.1f}% of the step) in these keys",
                                       torch_ms, step > 0 ? 100 * torch_ms / step : 0.0);
  if (!p["ceiling"].is_number()) return head + ": all of it, so no bound";
  return fmt::format("{}; even at zero cost they could make the step at most {:.3f}x faster", head,
                     p["ceiling"].get<double>());
}

std::string key_label(const std::string& op, const std::string& key) {
  const families::Family* family = families::find(op);
  return family ? fmt::format("{} {}", family->title, family->key_label(key)) : fmt::format("{} {}", op, key);
}

std::string tune_text(const nlohmann::json& summary) {
  const int64_t run_id = summary.value("run", int64_t{0});
  std::string t;
  for (const auto& e : summary["envs"]) {
    const auto& env = e["env"];
    t += fmt::format("\nTuned on {} (sm {}), CUDA {}, torch {}, hfnn {}: {} of {} keys of run {}\n",
                     env["gpu"].get<std::string>(), env["compute_capability"].get<std::string>(),
                     env["cuda"].get<std::string>(), env["torch"].get<std::string>(), env["hfnn"].get<std::string>(),
                     e["keys_tuned"].get<int>(), e["keys_in_run"].get<size_t>(), run_id);
    // Columns as wide as their longest entry (attention's labels and its "train" pass are longer than
    // LayerNorm's).
    size_t kw = 36, pw = 4;
    for (const auto& r : e["rows"]) {
      kw = std::max(kw, key_label(r["op"].get<std::string>(), r["key"].get<std::string>()).size());
      pw = std::max(pw, r["pass"].get<std::string>().size());
    }
    t += fmt::format("  {:<{}} {:<9} {:>7} {:>7}  {:<{}} {:>10} {:>10}  {:<20} {:>8}\n", "key", kw, "dtype", "Run%",
                     "share", "pass", pw, "torch µs", "best µs", "winner", "speed-up");
    std::string last;
    for (const auto& r : e["rows"]) {
      const std::string id = r["op"].get<std::string>() + r["key"].get<std::string>() + r["dtype"].get<std::string>();
      const bool first = id != last;
      last = id;
      const std::string key = key_label(r["op"].get<std::string>(), r["key"].get<std::string>());
      t += fmt::format("  {:<{}} {:<9} {:>7} {:>7}  {:<{}} {:>10.2f} {:>10.2f}  {:<20} {:>7.2f}x\n", first ? key : "",
                       kw, first ? r["dtype"].get<std::string>() : "",
                       first ? fmt::format("{:.2f}%", r["run_pct"].get<double>()) : "",
                       first ? fmt::format("{:.1f}%", r["share_pct"].get<double>()) : "", r["pass"].get<std::string>(), pw,
                       r["torch_us"].get<double>(), r["best_us"].get<double>(), r["winner"].get<std::string>(),
                       r["speedup"].get<double>());
    }
    if (e.contains("projection")) {
      const auto& p = e["projection"];
      t += "  " + projection_text(p) + "\n";
      if (p.contains("torch_ms")) t += "  " + ceiling_text(p) + "\n";
      if (const std::string note = cpu_bound_note(p); !note.empty()) t += "  " + note + "\n";
      if (const std::string note = plain_fallback_text(p); !note.empty()) t += "  " + note + "\n";
    }
  }
  return t;
}


namespace {

// RFC 4180: a field with a comma, quote or newline is quoted, quotes doubled. Floats are written
// as the shortest text that reads back as the same double (fmt's {}, with ".0" on a whole number),
// as Python's repr and json.dumps write them: nlohmann's dump does not always find the shortest
// (0.328236 comes out as 0.32823600000000003, the same double).
std::string csv_field(const nlohmann::json& v) {
  std::string s;
  if (v.is_null()) return s;
  if (v.is_string()) s = v.get<std::string>();
  else if (v.is_boolean()) s = v.get<bool>() ? "1" : "0";
  else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return s;
    s = fmt::format("{}", d);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";  // 2.0 as Python writes it, not 2
  } else s = v.dump();
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string report_csv(const nlohmann::json& r) {
  static const char* kColumns[] = {"section", "name",     "phase",      "calls",           "cpu_self_us",
                                   "cpu_total_us", "cuda_self_us", "cuda_total_us", "share", "shape",
                                   "normalized_shape", "dtype", "affine", "flags", "run_pct",
                                   "rank", "steps", "mean_ms", "gpu_busy_ms", "forward_op", "key", "gpu", "winner",
                                   "torch_us", "best_us", "speedup", "category", "library", "plain_step_ms",
                                   "plain_steps"};
  std::string out;
  for (const char* c : kColumns) out += std::string(out.empty() ? "" : ",") + c;
  out += "\n";
  auto row = [&](const char* section, const nlohmann::json& values) {
    std::string line = section;
    for (size_t i = 1; i < std::size(kColumns); ++i)
      line += "," + (values.contains(kColumns[i]) ? csv_field(values[kColumns[i]]) : std::string());
    out += line + "\n";
  };
  for (const auto& o : r["ops"]) row("op", o);
  for (const auto& k : r["kernels"]) {
    nlohmann::json v = k;
    v["cuda_self_us"] = k["cuda_us"];
    row("kernel", v);
  }
  for (const auto& s : r["shapes"]) {
    nlohmann::json v = s;
    v["name"] = s["op"];
    v["calls"] = s["fwd_calls"];
    v["share"] = s["time_share"];
    row("shape", v);
  }
  for (const auto& s : r["steps"]) {
    nlohmann::json v = s;
    v["share"] = s["communication_share"];  // the rank's share of time in collectives
    row("steps", v);
  }
  if (r.contains("tune"))
    for (const auto& e : r["tune"]["envs"])
      for (const auto& t : e["rows"]) {  // a row per tuned key and pass, per GPU and versions
        nlohmann::json v = t;
        v["name"] = t["op"];
        v["phase"] = t["pass"];
        v["share"] = t["share_pct"].get<double>() / 100;
        v["calls"] = t["calls_per_step"];
        v["gpu"] = e["env"]["gpu"];
        row("tune", v);
      }
  return out;
}

}  // namespace hfnn::profiles
