#include "tuner/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace hfnn::tuner {

Timing summarize(std::vector<double> samples_us) {
  Timing t;
  t.samples = static_cast<int>(samples_us.size());
  if (samples_us.empty()) return t;
  std::sort(samples_us.begin(), samples_us.end());
  auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(samples_us.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, samples_us.size() - 1);
    return samples_us[lo] + (pos - static_cast<double>(lo)) * (samples_us[hi] - samples_us[lo]);
  };
  t.median_us = quantile(0.5);
  t.p20_us = quantile(0.2);
  t.p80_us = quantile(0.8);
  return t;
}

Verdict gate(double max_error, double torch_error, double tolerance) {
  if (!std::isfinite(max_error)) return {false, "output not finite or not compared"};
  const double allowed = std::max(tolerance, std::isfinite(torch_error) ? 2.0 * torch_error : 0.0);
  if (max_error <= allowed) return {true, ""};
  return {false, fmt::format("error {:.2e} over the allowed {:.2e}", max_error, allowed)};
}

Choice judge(std::vector<Candidate>& candidates, double tolerance, double min_margin) {
  double torch_error = std::numeric_limits<double>::quiet_NaN();
  const Candidate* torch = nullptr;
  for (const auto& c : candidates)
    if (c.name == kTorch && c.ran) {
      torch = &c;
      torch_error = c.max_error;
    }
  for (auto& c : candidates) {
    if (!c.ran) c.verdict = {false, c.error.empty() ? "did not run" : c.error};
    else if (c.timing.samples == 0) c.verdict = {false, "not timed"};
    else c.verdict = c.name == kTorch ? Verdict{true, ""} : gate(c.max_error, torch_error, tolerance);
  }
  Choice choice;
  if (torch && torch->timing.samples > 0) {
    choice.torch_us = torch->timing.median_us;
    choice.best_us = torch->timing.median_us;
  }
  const Candidate* best = nullptr;
  for (const auto& c : candidates)
    if (c.name != kTorch && c.verdict.accepted && (!best || c.timing.median_us < best->timing.median_us)) best = &c;
  if (!best) return choice;
  if (choice.torch_us <= 0) {  // torch could not be timed: the fastest correct variant
    choice.winner = best->name;
    choice.best_us = best->timing.median_us;
    return choice;
  }
  choice.noise = std::max({min_margin, torch->timing.spread(), best->timing.spread()});
  if (best->timing.median_us < choice.torch_us * (1.0 - choice.noise)) {
    choice.winner = best->name;
    choice.best_us = best->timing.median_us;
  }
  return choice;
}

Projection project(double step_ms, const std::vector<KeySaving>& savings) {
  Projection p;
  p.step_ms = step_ms;
  for (const auto& s : savings) {
    if (s.best_us < s.torch_us) p.saved_ms += s.calls_per_step * (s.torch_us - s.best_us) / 1e3;
    p.torch_ms += s.calls_per_step * s.torch_us / 1e3;
  }
  p.saved_ms = std::min(p.saved_ms, step_ms);
  p.projected_step_ms = step_ms - p.saved_ms;
  p.speedup = p.projected_step_ms > 0 ? step_ms / p.projected_step_ms : std::numeric_limits<double>::infinity();
  p.torch_ms = std::min(p.torch_ms, step_ms);
  p.ceiling = p.torch_ms < step_ms ? step_ms / (step_ms - p.torch_ms) : std::numeric_limits<double>::infinity();
  return p;
}

}  // namespace hfnn::tuner
