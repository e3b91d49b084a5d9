#include "tuner/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace hfnn::tuner {
namespace {

// "[1,128,256]" -> {1, 128, 256}; "[]" -> {}; nullopt for anything else.
std::optional<std::vector<int64_t>> parse_dims(const std::string& text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  std::vector<int64_t> dims;
  const char* p = text.data() + 1;
  const char* end = text.data() + text.size() - 1;
  while (p < end) {
    int64_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || v < 0) return std::nullopt;
    dims.push_back(v);
    p = next;
    if (p < end) {
      if (*p != ',') return std::nullopt;
      ++p;
    }
  }
  return dims;
}

}  // namespace

std::string LayerNormKey::text() const { return fmt::format("rows={},D={},affine={}", rows, cols, affine ? 1 : 0); }

std::optional<LayerNormKey> layer_norm_key(const std::string& shape, const std::string& normalized, bool affine) {
  const auto dims = parse_dims(shape);
  const auto norm = parse_dims(normalized);
  if (!dims || !norm || norm->empty() || norm->size() > dims->size()) return std::nullopt;
  if (!std::equal(norm->rbegin(), norm->rend(), dims->rbegin())) return std::nullopt;
  LayerNormKey key;
  key.affine = affine;
  key.rows = 1;
  key.cols = 1;
  for (size_t i = 0; i < dims->size() - norm->size(); ++i) key.rows *= (*dims)[i];
  for (int64_t d : *norm) key.cols *= d;
  return key;
}

std::optional<LayerNormKey> parse_layer_norm_key(const std::string& text) {
  LayerNormKey key;
  int affine = -1;
  long long rows = 0, cols = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "rows=%lld,D=%lld,affine=%d%c", &rows, &cols, &affine, &tail) != 3) return std::nullopt;
  if (rows < 0 || cols < 1 || (affine != 0 && affine != 1)) return std::nullopt;
  key.rows = rows;
  key.cols = cols;
  key.affine = affine == 1;
  if (key.text() != text) return std::nullopt;
  return key;
}

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

double tolerance(const std::string& dtype) {
  // Outputs are rounded to the dtype: half an ulp at the largest magnitude is 2^-24 (float32),
  // 2^-11 (float16), 2^-8 (bfloat16) relative; allow a few ulp (float32 also sums up to millions
  // of rows into dgamma and dbeta in float32).
  if (dtype == "float16") return 4e-3;
  if (dtype == "bfloat16") return 3e-2;
  return 1e-4;
}

Verdict gate(double max_error, double torch_error, const std::string& dtype) {
  if (!std::isfinite(max_error)) return {false, "output not finite or not compared"};
  const double allowed = std::max(tolerance(dtype), std::isfinite(torch_error) ? 2.0 * torch_error : 0.0);
  if (max_error <= allowed) return {true, ""};
  return {false, fmt::format("error {:.2e} over the allowed {:.2e}", max_error, allowed)};
}

Choice judge(std::vector<Candidate>& candidates, const std::string& dtype, double min_margin) {
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
    else c.verdict = c.name == kTorch ? Verdict{true, ""} : gate(c.max_error, torch_error, dtype);
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
