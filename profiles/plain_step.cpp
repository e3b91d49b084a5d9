#include "profiles/plain_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace hfnn::profiles {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

namespace {

// The fewest plain steps a median is taken of (fewer where fewer were asked): one step is one
// sample of a noisy wall time, and a median of three is not moved by one outlier (a part file
// written, a collective waiting on a late rank).
constexpr int64_t kMinPlainSteps = 3;

std::string steps_text(int64_t n) { return fmt::format("{} step{}", n, n == 1 ? "" : "s"); }

// Why a run has no plain step, and what would give it one. `timed`: the most plain steps a rank
// timed, too few for a median.
std::string why_none(const PlainStep& p, int64_t warmup, int64_t steps, int64_t boundaries, int64_t timed) {
  if (!p.requested) return "this run was recorded by an hfnn that did not time steps without the profiler";
  if (p.ranks.empty()) return "the script has no steps (no optimizer.step() or hfnn.step() was seen)";
  if (steps == 0)
    return "--steps 0 records every step to the end, so none ran without the profiler; give --steps N to time "
           "--plain-steps after them";
  if (*p.requested == 0) return "--plain-steps 0";
  return fmt::format("the script ended first: it ran {}{}, and timing {} plain steps needs {} (--warmup {} + "
                     "--steps {} + 1 for the profiler's tear-down + --plain-steps {}); run that many, or lower --steps",
                     steps_text(boundaries),
                     timed > 0 ? fmt::format(", {} of them plain (a median takes {})", timed,
                                             std::min(kMinPlainSteps, *p.requested))
                               : "",
                     *p.requested, warmup + steps + 1 + *p.requested, warmup, steps, *p.requested);
}

}  // namespace

std::optional<double> PlainStep::cost() const {
  if (!plain_ms || *plain_ms <= 0) return std::nullopt;
  return profiled_ms / *plain_ms - 1;
}

PlainStep read_plain_step(Database& db, int64_t run_id) {
  PlainStep p;
  const bool has_plain = db.schema_version() >= 5;  // a read-only older file has no plain-step columns
  int64_t warmup = 0, steps = 0;
  {
    Statement run(db.handle(), has_plain ? "SELECT warmup, steps_requested, plain_steps_requested FROM runs WHERE id = ?"
                                         : "SELECT warmup, steps_requested, NULL FROM runs WHERE id = ?");
    run.bind(1, run_id);
    if (run.step()) {
      warmup = run.column_int(0);
      steps = run.column_int(1);
      if (!run.column_is_null(2)) p.requested = run.column_int(2);
    }
  }
  std::map<int64_t, std::vector<double>> walls;
  {
    Statement s(db.handle(), "SELECT rank, wall_ms FROM step_stats WHERE run_id = ? AND wall_ms IS NOT NULL");
    s.bind(1, run_id);
    while (s.step()) walls[s.column_int(0)].push_back(s.column_double(1));
  }
  std::map<int64_t, std::pair<int64_t, double>> plain;  // rank -> (plain steps, their median)
  int64_t boundaries = 0;
  {
    // A rank's process with the most plain steps (a DataLoader worker of that rank has none).
    Statement s(db.handle(), has_plain ? "SELECT rank, plain_steps, plain_step_ms, step_boundaries FROM ranks"
                                         " WHERE run_id = ? ORDER BY plain_steps"
                                       : "SELECT rank, 0, NULL, step_boundaries FROM ranks WHERE run_id = ?");
    s.bind(1, run_id);
    while (s.step()) {
      boundaries = std::max(boundaries, s.column_int(3));
      if (s.column_is_null(2)) continue;
      plain[s.column_int(0)] = {s.column_int(1), s.column_double(2)};
    }
  }
  double plain_sum = 0, profiled_with_plain = 0, profiled_all = 0;
  int64_t with_plain = 0, too_few = 0;
  const int64_t min_steps = std::min(kMinPlainSteps, std::max<int64_t>(1, p.requested.value_or(1)));
  for (const auto& [rank, wall] : walls) {
    RankSteps r;
    r.rank = rank;
    r.steps = static_cast<int64_t>(wall.size());
    r.profiled_ms = median(wall);
    profiled_all += r.profiled_ms;
    if (const auto it = plain.find(rank); it != plain.end() && it->second.first < min_steps) {
      too_few = std::max(too_few, it->second.first);
      r.plain_steps = it->second.first;
    } else if (it != plain.end()) {
      r.plain_steps = it->second.first;
      r.plain_ms = it->second.second;
      plain_sum += *r.plain_ms;
      profiled_with_plain += r.profiled_ms;
      p.plain_steps = with_plain == 0 ? r.plain_steps : std::min(p.plain_steps, r.plain_steps);
      ++with_plain;
    }
    p.ranks.push_back(r);
  }
  if (with_plain > 0) {
    p.plain_ms = plain_sum / with_plain;
    p.profiled_ms = profiled_with_plain / with_plain;
    if (p.requested && p.plain_steps < *p.requested)
      p.note = fmt::format("{} of the {} plain steps asked: the script ended first (it needs {} steps to time them "
                           "all: --warmup {} + --steps {} + 1 + --plain-steps {})",
                           p.plain_steps, *p.requested, warmup + steps + 1 + *p.requested, warmup, steps, *p.requested);
  } else {
    p.profiled_ms = p.ranks.empty() ? 0.0 : profiled_all / static_cast<double>(p.ranks.size());
    p.note = why_none(p, warmup, steps, boundaries, too_few);
  }
  return p;
}

nlohmann::json plain_step_json(const PlainStep& p) {
  const auto cost = p.cost();
  std::string text;
  if (p.plain_ms) {
    // A plain step longer than the profiled one is the host's noise, larger than the profiler's cost.
    const std::string pct = *cost < -0.005 ? "nothing measurable (the steps without it took longer: host noise)"
                            : *cost < 0.005 ? "about 0%"
                                            : fmt::format("{:.0f}%", 100 * *cost);
    text = fmt::format("The profiler cost this run {}: the median step took {:.2f} ms under it and {:.2f} ms without "
                       "it (the plain step: {} timed after the recorded ones with collection off{}). The GPU's busy "
                       "share, the advice and hfnn tune's projection take the plain step",
                       pct, p.profiled_ms, *p.plain_ms, steps_text(p.plain_steps), p.note.empty() ? "" : "; " + p.note);
  } else {
    text = fmt::format("What the profiler cost this run is not known: no plain step ({}). The GPU's busy share, the "
                       "advice and hfnn tune's projection take the step under the profiler{}, which the profiler "
                       "stretches where the step is CPU-bound",
                       p.note, p.ranks.empty() ? "" : fmt::format(" (median {:.2f} ms)", p.profiled_ms));
  }
  auto optional = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  return {{"plain_step_ms", optional(p.plain_ms)}, {"profiled_step_ms", p.profiled_ms},
          {"cost_pct", cost ? nlohmann::json(100 * *cost) : nlohmann::json()}, {"plain_steps", p.plain_steps},
          {"plain_steps_requested", optional(p.requested)}, {"basis", p.plain_ms ? "plain" : "profiled"},
          {"note", p.note}, {"text", text}};
}

}  // namespace hfnn::profiles
