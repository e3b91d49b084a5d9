#include "profiles/collector.h"

#include <ATen/record_function.h>
#include <torch/library.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace hfnn::profiles {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The ops whose input shapes are recorded: what hfnn accelerates. aten::layer_norm is what
// torch.nn.LayerNorm and F.layer_norm call (native_layer_norm runs inside it and is not counted
// again); its backward is native_layer_norm_backward.
enum class Tunable { kNone, kLayerNormFwd, kLayerNormBwd };

Tunable tunable(std::string_view name) {
  if (name == "aten::layer_norm" || name == "hfnn::layer_norm") return Tunable::kLayerNormFwd;
  if (name == "aten::native_layer_norm_backward" || name == "hfnn::layer_norm_bwd") return Tunable::kLayerNormBwd;
  return Tunable::kNone;
}

std::string sizes_string(c10::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

// torch's Python names ("float32", "bfloat16"), which the tuner and the reports use.
std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kDouble: return "float64";
    default: {
      std::string s(c10::toString(t));
      for (auto& c : s) c = static_cast<char>(std::tolower(c));
      return s;
    }
  }
}

struct ShapeKey {
  std::string op, shape, normalized, dtype, phase;
  bool affine = false;
  auto tie() const { return std::tie(op, shape, normalized, dtype, phase, affine); }
  bool operator<(const ShapeKey& o) const { return tie() < o.tie(); }
};

// LayerNorm's shape from the op's inputs: layer_norm(input, normalized_shape, weight, bias, ...)
// and native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, mask).
std::optional<ShapeKey> layer_norm_shape(const at::RecordFunction& fn, Tunable kind) {
  const auto inputs = fn.inputs();
  const size_t input_at = kind == Tunable::kLayerNormFwd ? 0 : 1;
  const size_t weight_at = kind == Tunable::kLayerNormFwd ? 2 : 5;
  if (inputs.size() <= weight_at || !inputs[input_at].isTensor()) return std::nullopt;
  const at::Tensor& x = inputs[input_at].toTensor();
  ShapeKey key;
  key.op = "layer_norm";
  key.shape = sizes_string(x.sizes());
  const auto& ns = inputs[input_at + 1];
  key.normalized = ns.isIntList() ? sizes_string(ns.toIntVector()) : "?";
  key.dtype = dtype_name(x.scalar_type());
  key.affine = inputs[weight_at].isTensor() && inputs[weight_at].toTensor().defined();
  key.phase = kind == Tunable::kLayerNormFwd ? "fwd" : "bwd";
  return key;
}

struct OpTotals {
  int64_t calls = 0, total_ns = 0, self_ns = 0;
};

struct Frame {
  int64_t start_ns = 0;
  int64_t child_ns = 0;
  bool backward = false;
  std::optional<ShapeKey> shape;
};

thread_local std::vector<Frame> t_stack;
thread_local int t_backward_depth = 0;

struct State {
  std::mutex mutex;
  nlohmann::json meta;
  std::filesystem::path part_path;
  int warmup = 0, steps = 0;  // steps == 0: record until the process ends
  int boundaries = 0, recorded = 0;
  int64_t last_boundary_ns = 0;
  int64_t last_write_ns = 0;
  std::vector<double> step_ms;
  std::map<std::pair<std::string, std::string>, OpTotals> ops;  // (name, phase)
  std::map<ShapeKey, OpTotals> shapes;
  std::atomic<bool> recording{false};
  std::optional<at::CallbackHandle> handle;
  bool stopped = false;
};

State& state() {
  static State* s = new State();  // never destroyed: callbacks may run during static teardown
  return *s;
}

nlohmann::json part_json(const State& s) {
  nlohmann::json ops = nlohmann::json::array(), shapes = nlohmann::json::array();
  for (const auto& [key, t] : s.ops)
    ops.push_back({{"name", key.first}, {"phase", key.second}, {"calls", t.calls},
                   {"cpu_total_us", t.total_ns / 1e3}, {"cpu_self_us", t.self_ns / 1e3}});
  for (const auto& [key, t] : s.shapes)
    shapes.push_back({{"op", key.op}, {"shape", key.shape}, {"normalized_shape", key.normalized},
                      {"dtype", key.dtype}, {"affine", key.affine}, {"phase", key.phase}, {"calls", t.calls},
                      {"cpu_total_us", t.total_ns / 1e3}});
  return {{"format", "hfnn-profile-part"}, {"version", 1}, {"meta", s.meta},
          {"warmup", s.warmup}, {"steps_requested", s.steps}, {"step_boundaries", s.boundaries},
          {"step_ms", s.step_ms}, {"ops", ops}, {"shapes", shapes}};
}

// Atomic: a reader (the CLI) sees the previous part or this one, never half of one.
void write_part(const State& s) {
  if (s.part_path.empty() || (s.ops.empty() && s.step_ms.empty())) return;
  const auto tmp = std::filesystem::path(s.part_path).concat(".tmp");
  {
    std::ofstream out(tmp);
    out << part_json(s).dump();
    if (!out) return;  // the CLI reports a missing part; never throw from an observer
  }
  std::error_code ec;
  std::filesystem::rename(tmp, s.part_path, ec);
}

void boundary_locked(State& s) {
  const int64_t t = now_ns();
  ++s.boundaries;
  if (s.boundaries <= s.warmup) {  // warm-up: forget what was seen so far
    s.ops.clear();
    s.shapes.clear();
  } else if (s.steps == 0 || s.recorded < s.steps) {
    s.step_ms.push_back((t - s.last_boundary_ns) / 1e6);
    ++s.recorded;
    const bool last = s.steps != 0 && s.recorded == s.steps;
    if (last) s.recording = false;  // the script runs on untouched
    // Rewritten at most once a second (and after the last step): a crash loses at most that much,
    // and short steps do not pay for file writes.
    if (last || t - s.last_write_ns > 1'000'000'000) {
      write_part(s);
      s.last_write_ns = t;
    }
  }
  s.last_boundary_ns = t;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Frame f;
  f.start_ns = now_ns();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) ++t_backward_depth;
  f.backward = t_backward_depth > 0;
  if (state().recording.load(std::memory_order_relaxed)) {
    const Tunable kind = tunable(fn.name());
    if (kind != Tunable::kNone) f.shape = layer_norm_shape(fn, kind);
  }
  t_stack.push_back(std::move(f));
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_stack.empty()) return;
  Frame f = std::move(t_stack.back());
  t_stack.pop_back();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION && t_backward_depth > 0) --t_backward_depth;
  const int64_t total = now_ns() - f.start_ns;
  if (!t_stack.empty()) t_stack.back().child_ns += total;
  State& s = state();
  const std::string_view name = fn.name();
  const bool is_step = name.rfind("Optimizer.step#", 0) == 0;
  if (!s.recording.load(std::memory_order_relaxed) && !is_step) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.recording) {
    OpTotals& t = s.ops[{std::string(name), f.backward ? "bwd" : "fwd"}];
    ++t.calls;
    t.total_ns += total;
    t.self_ns += total - f.child_ns;
    if (f.shape) {
      OpTotals& st = s.shapes[*f.shape];
      ++st.calls;
      st.total_ns += total;
    }
  }
  if (is_step && !s.stopped) boundary_locked(s);
}

}  // namespace

void start(const std::string& config_json) {
  const auto config = nlohmann::json::parse(config_json);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TORCH_CHECK(!s.handle, "hfnn profiler: already started in this process");
  s.meta = config.value("meta", nlohmann::json::object());
  s.warmup = config.value("warmup", 0);
  s.steps = config.value("steps", 0);
  const std::string dir = config.value("dir", "");
  if (!dir.empty()) {
    const std::string rank = s.meta.contains("rank") ? s.meta["rank"].dump() : "0";
    s.part_path = std::filesystem::path(dir) / ("part-" + rank + "-" + std::to_string(::getpid()) + ".json");
  }
  s.last_boundary_ns = now_ns();
  s.recording = true;
  s.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                       .needsInputs(true)
                                       .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                at::RecordScope::USER_SCOPE}));
}

void step() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.handle && !s.stopped) boundary_locked(s);
}

void stop() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.handle || s.stopped) return;
  s.stopped = true;
  s.recording = false;
  at::removeCallback(*s.handle);
  write_part(s);
}

std::string snapshot() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return part_json(s).dump();
}

}  // namespace hfnn::profiles

namespace {
void profiler_start(c10::string_view config) { hfnn::profiles::start(std::string(config)); }
void profiler_step() { hfnn::profiles::step(); }
void profiler_stop() { hfnn::profiles::stop(); }
std::string profiler_snapshot() { return hfnn::profiles::snapshot(); }
}  // namespace

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def("profiler_start(str config) -> ()", &profiler_start);
  m.def("profiler_step() -> ()", &profiler_step);
  m.def("profiler_stop() -> ()", &profiler_stop);
  m.def("profiler_snapshot() -> str", &profiler_snapshot);
}
