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

// The ranks with a median of steps timed with collection off (plain, or --sample's between the
// recorded ones): the run's is the mean of theirs, against the mean of the same ranks' recorded step.
struct TimedOff {
  double sum = 0, profiled = 0;
  int64_t ranks = 0, fewest = 0;  // fewest: the steps behind a rank's median, the fewest of any rank
  void add(int64_t steps, double ms, double profiled_ms) {
    sum += ms;
    profiled += profiled_ms;
    fewest = ranks++ == 0 ? steps : std::min(fewest, steps);
  }
  double mean() const { return sum / static_cast<double>(ranks); }
  double profiled_mean() const { return profiled / static_cast<double>(ranks); }
};

}  // namespace

std::optional<double> PlainStep::cost() const {
  if (!plain_ms || *plain_ms <= 0) return std::nullopt;
  return profiled_ms / *plain_ms - 1;
}

PlainStep read_plain_step(Database& db, int64_t run_id) {
  PlainStep p;
  const bool has_plain = db.schema_version() >= 5;  // a read-only older file has no plain-step columns
  const bool has_sample = db.schema_version() >= 6;
  int64_t warmup = 0, steps = 0;
  {
    Statement run(db.handle(), has_sample  ? "SELECT warmup, steps_requested, plain_steps_requested, sample_every"
                                             " FROM runs WHERE id = ?"
                               : has_plain ? "SELECT warmup, steps_requested, plain_steps_requested, NULL FROM runs"
                                             " WHERE id = ?"
                                           : "SELECT warmup, steps_requested, NULL, NULL FROM runs WHERE id = ?");
    run.bind(1, run_id);
    if (run.step()) {
      warmup = run.column_int(0);
      steps = run.column_int(1);
      if (!run.column_is_null(2)) p.requested = run.column_int(2);
      if (!run.column_is_null(3)) p.sample_every = std::max<int64_t>(1, run.column_int(3));
    }
  }
  std::map<int64_t, std::vector<double>> walls;
  {
    Statement s(db.handle(), "SELECT rank, wall_ms FROM step_stats WHERE run_id = ? AND wall_ms IS NOT NULL");
    s.bind(1, run_id);
    while (s.step()) walls[s.column_int(0)].push_back(s.column_double(1));
  }
  std::map<int64_t, std::pair<int64_t, double>> plain, unsampled;  // rank -> (steps, their median)
  int64_t boundaries = 0;
  {
    // A rank's process with the most plain steps (a DataLoader worker of that rank has none).
    Statement s(db.handle(), has_sample ? "SELECT rank, plain_steps, plain_step_ms, step_boundaries, unsampled_steps,"
                                          " unsampled_step_ms FROM ranks WHERE run_id = ? ORDER BY plain_steps,"
                                          " unsampled_steps"
                             : has_plain ? "SELECT rank, plain_steps, plain_step_ms, step_boundaries, 0, NULL FROM ranks"
                                           " WHERE run_id = ? ORDER BY plain_steps"
                                         : "SELECT rank, 0, NULL, step_boundaries, 0, NULL FROM ranks WHERE run_id = ?");
    s.bind(1, run_id);
    while (s.step()) {
      boundaries = std::max(boundaries, s.column_int(3));
      if (!s.column_is_null(5)) unsampled[s.column_int(0)] = {s.column_int(4), s.column_double(5)};
      if (s.column_is_null(2)) continue;
      plain[s.column_int(0)] = {s.column_int(1), s.column_double(2)};
    }
  }
  TimedOff after, between;  // the plain steps; --sample's steps between the recorded ones
  double profiled_all = 0;
  int64_t too_few = 0;
  const int64_t min_steps = std::min(kMinPlainSteps, std::max<int64_t>(1, p.requested.value_or(1)));
  for (const auto& [rank, wall] : walls) {
    RankSteps r;
    r.rank = rank;
    r.steps = static_cast<int64_t>(wall.size());
    r.profiled_ms = median(wall);
    profiled_all += r.profiled_ms;
    if (const auto it = unsampled.find(rank); it != unsampled.end() && it->second.first >= kMinPlainSteps) {
      r.unsampled_steps = it->second.first;
      r.unsampled_ms = it->second.second;
      between.add(r.unsampled_steps, *r.unsampled_ms, r.profiled_ms);
    }
    if (const auto it = plain.find(rank); it != plain.end()) {
      r.plain_steps = it->second.first;
      if (r.plain_steps < min_steps) {
        too_few = std::max(too_few, r.plain_steps);
      } else {
        r.plain_ms = it->second.second;
        after.add(r.plain_steps, *r.plain_ms, r.profiled_ms);
      }
    }
    p.ranks.push_back(r);
  }
  if (between.ranks > 0) {
    p.unsampled_ms = between.mean();
    p.unsampled_steps = between.fewest;
  }
  if (after.ranks == 0 && between.ranks > 0) {
    // No plain step after the recorded ones (--steps 0 under --sample): the steps between them
    // ran with collection off too, and are each rank's plain step as well as the run's.
    for (RankSteps& r : p.ranks)
      if (r.unsampled_ms) {
        r.plain_ms = r.unsampled_ms;
        r.plain_steps = r.unsampled_steps;
      }
    p.plain_ms = p.unsampled_ms;
    p.plain_steps = p.unsampled_steps;
    p.profiled_ms = between.profiled_mean();
    p.from_unsampled = true;
  } else if (after.ranks > 0) {
    p.plain_ms = after.mean();
    p.plain_steps = after.fewest;
    p.profiled_ms = after.profiled_mean();
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
    const std::string timed =
        p.from_unsampled ? fmt::format("{} between the recorded ones under --sample {}, timed with collection off",
                                       steps_text(p.plain_steps), p.sample_every)
                         : fmt::format("{} timed after the recorded ones with collection off", steps_text(p.plain_steps));
    text = fmt::format("The profiler cost this run {}: the median step took {:.2f} ms {} and {:.2f} ms without "
                       "it (the plain step: {}{}). The GPU's busy share, the advice and hfnn tune's projection take "
                       "the plain step",
                       pct, p.profiled_ms, p.sample_every > 1 ? "recorded in full" : "under it", *p.plain_ms, timed,
                       p.note.empty() ? "" : "; " + p.note);
  } else {
    text = fmt::format("What the profiler cost this run is not known: no plain step ({}). The GPU's busy share, the "
                       "advice and hfnn tune's projection take the step under the profiler{}, which the profiler "
                       "stretches where the step is CPU-bound",
                       p.note, p.ranks.empty() ? "" : fmt::format(" (median {:.2f} ms)", p.profiled_ms));
  }
  if (p.sample_every > 1) {
    // Only one step in N paid for the collection: over all the window's steps it cost about 1/N.
    const int64_t recorded = p.ranks.empty() ? 0 : p.ranks.front().steps;
    text += fmt::format(". Under --sample {} one step in {} was recorded in full ({}); the figures are theirs{}",
                        p.sample_every, p.sample_every, steps_text(recorded),
                        p.unsampled_ms ? fmt::format(", and the {} timed between them took {:.2f} ms (median){}",
                                                     steps_text(p.unsampled_steps), *p.unsampled_ms,
                                                     cost && *cost > 0.005
                                                         ? fmt::format(": over every step the profiler cost about {:.0f}%",
                                                                       100 * *cost / static_cast<double>(p.sample_every))
                                                         : "")
                                       : "");
  }
  auto optional = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  return {{"plain_step_ms", optional(p.plain_ms)}, {"profiled_step_ms", p.profiled_ms},
          {"cost_pct", cost ? nlohmann::json(100 * *cost) : nlohmann::json()}, {"plain_steps", p.plain_steps},
          {"plain_steps_requested", optional(p.requested)}, {"basis", p.plain_ms ? "plain" : "profiled"},
          {"plain_from", p.plain_ms ? nlohmann::json(p.from_unsampled ? "between" : "after") : nlohmann::json()},
          {"sample_every", p.sample_every}, {"unsampled_steps", p.unsampled_steps},
          {"unsampled_step_ms", optional(p.unsampled_ms)}, {"note", p.note}, {"text", text}};
}

}  // namespace hfnn::profiles
