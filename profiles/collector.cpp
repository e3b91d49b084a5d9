#include "profiles/collector.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/library.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "profiles/advice.h"

#define HFNN_GPU_ACTIVITY (HFNN_WITH_CUDA && HFNN_TORCH_CUDA)
#if HFNN_GPU_ACTIVITY
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <cuda_runtime_api.h>

#include "profiles/cupti_activity.h"
#endif

namespace hfnn::profiles {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The ops whose input shapes are recorded: what hfnn accelerates. For LayerNorm that is
// aten::native_layer_norm, which torch.nn.LayerNorm and F.layer_norm reach through
// aten::layer_norm, and which HFNN_DISPATCH_DB replaces: its input is the one the kernel sees.
// (Under CUDA autocast aten::layer_norm runs twice, the outer call with the bfloat16 input and
// the inner one after the cast to float32; native_layer_norm runs once, in float32.) Its
// backward is native_layer_norm_backward. When a recorded op runs inside another record of the
// same op and phase (hfnn::layer_norm under autocast, or around a torch fallback), the innermost
// one is kept: it is what ran.
// nn.LSTM calls aten::lstm (its backward is not linked to it here: forward calls and time only),
// recorded in the dtype it computes in (autocast's under autocast: lstm_compute_dtype).
// nn.MultiheadAttention is no single op: the start-up hook wraps its forward in a record_function
// scope named "hfnn.shape|<op>|<shape>|<dtype>|<settings>" (kScope).
// Two more are recorded for the report's advice only, never tuned (profiles/advice.h,
// kAdviceShapeOps): GEMMs (kGemm: M, N, K, dtype, TF32 allowed) and copies from a CUDA tensor into a
// CPU one (kCopy: the host waits for the GPU).
enum class Tunable { kNone, kLayerNormFwd, kLayerNormBwd, kLstm, kScope, kGemm, kCopy };
constexpr std::string_view kShapeScope = "hfnn.shape|";

// The GEMM ops, and where their first matrix operand is: mm(a, b), bmm(a, b), addmm(c, a, b),
// baddbmm(c, a, b), _addmm_activation(c, a, b). aten::linear and aten::matmul reach one of them.
constexpr std::pair<std::string_view, size_t> kGemmOps[] = {
    {"aten::mm", 0}, {"aten::addmm", 1}, {"aten::bmm", 0}, {"aten::baddbmm", 1}, {"aten::_addmm_activation", 1}};

Tunable tunable(std::string_view name) {
  if (name == "aten::native_layer_norm" || name == "hfnn::layer_norm") return Tunable::kLayerNormFwd;
  if (name == "aten::native_layer_norm_backward" || name == "hfnn::layer_norm_bwd") return Tunable::kLayerNormBwd;
  if (name == "aten::lstm") return Tunable::kLstm;
  if (name.rfind(kShapeScope, 0) == 0) return Tunable::kScope;
  if (name == "aten::copy_") return Tunable::kCopy;
  for (const auto& [gemm, at] : kGemmOps)
    if (name == gemm) return Tunable::kGemm;
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
  std::string flags;  // the op's other settings that pick a kernel, "key=value,..."
  auto tie() const { return std::tie(op, shape, normalized, dtype, phase, affine, flags); }
  bool operator<(const ShapeKey& o) const { return tie() < o.tie(); }
};

// LayerNorm's shape from the op's inputs: native_layer_norm(input, normalized_shape, weight, bias, eps)
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

// The dtype an LSTM call computes in, which is the dtype of its key: under autocast float16 on CUDA
// where cuDNN runs it (whatever the autocast dtype), the autocast dtype elsewhere; else the input's
// own; float64 stays float64. The rule of
// hfnn.nn._lstm_compute_dtype, which HFNN_DISPATCH_DB looks keys up with. aten::lstm itself is not
// cast by autocast (cuDNN's _cudnn_rnn is, on the CPU oneDNN's mkldnn_rnn_layer, further down),
// so its input is still float32 under bfloat16 autocast: recording that dtype made every LSTM of
// an autocast run "shape not tuned". Called in the op's own thread, where autocast's state is the
// caller's; inside an autocast wrapper that already cast (autocast excluded) it reads disabled.
c10::ScalarType lstm_compute_dtype(const at::Tensor& x) {
  const c10::ScalarType own = x.scalar_type();
  if (own == c10::kDouble || !x.is_floating_point()) return own;
  try {
    const auto device = x.device().type();
    if (at::autocast::is_autocast_enabled(device)) {
      // torch's autocast wrapper of cuDNN's _cudnn_rnn casts to half whatever the autocast dtype:
      // under bfloat16 autocast nn.LSTM on CUDA computes, and returns, float16.
      if (device == c10::DeviceType::CUDA && at::globalContext().userEnabledCuDNN() &&
          at::globalContext().hasCuDNN())
        return c10::kHalf;
      return at::autocast::get_autocast_dtype(device);
    }
  } catch (const c10::Error&) {  // a device type autocast does not know (meta, ...): never throw from an observer
  }
  return own;
}

// aten::lstm.input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
// batch_first); the packed-sequence overload (data, batch_sizes, ...) is recorded without flags.
std::optional<ShapeKey> lstm_shape(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.size() < 9 || !inputs[0].isTensor()) return std::nullopt;
  const at::Tensor& x = inputs[0].toTensor();
  ShapeKey key;
  key.op = "lstm";
  key.shape = sizes_string(x.sizes());
  key.dtype = dtype_name(lstm_compute_dtype(x));
  key.phase = "fwd";
  if (inputs[1].isTensorList()) {
    // hx = [h0, c0]: c0's last size is the hidden size, h0's the projection's where proj_size is set.
    const auto hx = inputs[1].toTensorList();
    const int64_t hidden = hx.size() > 1 ? hx.get(1).size(-1) : -1;
    const int64_t h_size = hx.size() > 0 ? hx.get(0).size(-1) : -1;
    const bool dropout = inputs[5].toDouble() > 0.0 && inputs[6].toBool();  // between layers, in training
    key.flags = fmt::format("input={},hidden={},layers={},bidirectional={},batch_first={},bias={},proj={},dropout={}",
                            x.size(-1), hidden, inputs[4].toInt(), int(inputs[7].toBool()), int(inputs[8].toBool()),
                            int(inputs[3].toBool()), h_size != hidden ? h_size : 0, int(dropout));
  } else {
    key.flags = "packed";
  }
  return key;
}

// Whether cuBLAS may run a float32 GEMM in TF32 now (torch.backends.cuda.matmul.fp32_precision =
// "tf32", or allow_tf32 = True, or float32_matmul_precision "high"/"medium"): what it reads when it
// runs one. torch 2.11's legacy getter throws where a script mixed the two APIs; this one does not.
bool tf32_allowed() {
  try {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
    return !at::NoTF32Guard::should_disable_tf32() &&
           at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
               at::Float32Precision::TF32;
#else
    return !at::NoTF32Guard::should_disable_tf32() && at::globalContext().allowTF32CuBLAS();
#endif
  } catch (const c10::Error&) {  // never throw from an observer
    return false;
  }
}

// A GEMM as "[M,N,K]" (a [M,K] times b [K,N], batched: [B,M,K] times [B,K,N]) in the first
// operand's dtype, phase by where it ran, flags "op=addmm", ",batch=B" where batched and, in
// float32, ",tf32=0|1". Shapes only: no tensor is read.
std::optional<ShapeKey> gemm_shape(const at::RecordFunction& fn, std::string_view name, bool backward) {
  size_t a_at = 0;
  for (const auto& [gemm, at] : kGemmOps)
    if (name == gemm) a_at = at;
  const auto inputs = fn.inputs();
  if (inputs.size() < a_at + 2 || !inputs[a_at].isTensor() || !inputs[a_at + 1].isTensor()) return std::nullopt;
  const at::Tensor& a = inputs[a_at].toTensor();
  const at::Tensor& b = inputs[a_at + 1].toTensor();
  if (!a.defined() || !b.defined() || a.is_nested() || b.is_nested() || a.dim() != b.dim() || a.dim() < 2 ||
      a.dim() > 3)
    return std::nullopt;
  // Symbolic sizes (torch.compile tracing with dynamic shapes) have no numbers to record.
  if (a.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || b.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
    return std::nullopt;
  ShapeKey key;
  key.op = kGemmShapeOp;
  key.shape = fmt::format("[{},{},{}]", a.size(-2), b.size(-1), a.size(-1));
  key.dtype = dtype_name(a.scalar_type());
  key.phase = backward ? "bwd" : "fwd";
  key.flags = fmt::format("op={}{}{}", name.substr(name.find("::") + 2),
                          a.dim() == 3 ? fmt::format(",batch={}", a.size(0)) : std::string(),
                          a.scalar_type() == c10::kFloat ? (tf32_allowed() ? ",tf32=1" : ",tf32=0") : "");
  return key;
}

// aten::copy_(self, src, non_blocking) from a CUDA tensor into a CPU one, which .cpu(), .tolist(),
// .numpy() after .cpu() and printing a CUDA tensor run: "[sizes]" of the source, its dtype, flags
// "non_blocking=0|1" (0: the host waits for the GPU to finish everything queued before the copy).
// Every other copy_ (casts, device-to-device, host-to-device) records nothing.
std::optional<ShapeKey> host_copy_shape(const at::RecordFunction& fn, bool backward) {
  const auto inputs = fn.inputs();
  if (inputs.size() < 2 || !inputs[0].isTensor() || !inputs[1].isTensor()) return std::nullopt;
  const at::Tensor& dst = inputs[0].toTensor();
  const at::Tensor& src = inputs[1].toTensor();
  if (!dst.defined() || !src.defined() || !dst.is_cpu() || !src.is_cuda() || src.is_nested() ||
      src.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
    return std::nullopt;
  ShapeKey key;
  key.op = kHostCopyShapeOp;
  key.shape = sizes_string(src.sizes());
  key.dtype = dtype_name(src.scalar_type());
  key.phase = backward ? "bwd" : "fwd";
  key.flags = fmt::format("non_blocking={}", int(inputs.size() > 2 && inputs[2].isBool() && inputs[2].toBool()));
  return key;
}

// "hfnn.shape|op|shape|dtype|settings" -> the shape record, forward.
std::optional<ShapeKey> scope_shape(std::string_view name) {
  name.remove_prefix(kShapeScope.size());
  std::string_view parts[4];
  for (int i = 0; i < 4; ++i) {
    const size_t bar = i < 3 ? name.find('|') : std::string_view::npos;
    if (i < 3 && bar == std::string_view::npos) return std::nullopt;
    parts[i] = name.substr(0, bar);
    if (i < 3) name.remove_prefix(bar + 1);
  }
  ShapeKey key;
  key.op = std::string(parts[0]);
  key.shape = std::string(parts[1]);
  key.dtype = std::string(parts[2]);
  key.flags = std::string(parts[3]);
  key.phase = "fwd";
  return key;
}

struct OpTotals {
  int64_t calls = 0, total_ns = 0, self_ns = 0;
  int64_t cuda_self_ns = 0, cuda_total_ns = 0;  // kernels launched by the op itself / inside it
  const std::string* forward_op = nullptr;       // backward nodes: the forward op that made them
  const std::string* name = nullptr;             // the op's own name (its key in State::ops), once looked up
};

// The forward op behind an autograd sequence number: the op that created the backward node, or
// the op enclosing it (aten::layer_norm around aten::native_layer_norm). Ops share a number until
// a node takes it, so among ops with one number the enclosing or the latest one is kept.
struct SeqOp {
  const std::string* name = nullptr;
  int64_t start_ns = 0, end_ns = 0;
};

struct Frame {
  int64_t start_ns = 0;
  int64_t child_ns = 0;
  bool backward = false;
  bool pushed = false;  // an external correlation id was pushed for this op
  uint64_t id = 0, parent = 0;
  std::optional<ShapeKey> shape;
};

// One op call, kept (while GPU activity is on) until its kernels are attributed: the kernel's
// time goes to `op` (self) and to it and every enclosing op (total).
struct Invocation {
  OpTotals* op = nullptr;
  OpTotals* shape = nullptr;
  uint64_t parent = 0;
  int step = 0;
};

struct KernelTotals {
  int64_t calls = 0, ns = 0;
};

std::atomic<uint64_t> g_next_id{1};

// What the collector does, step by step: warm-up and the recorded steps (every op observed, CUDA
// activity on), then the plain steps (nothing collected: only step boundaries are seen, to time
// them), then nothing at all: the script runs on untouched.
enum class Phase { kRecording, kPlain, kDone };
constexpr std::string_view kOptimizerStep = "Optimizer.step#";

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
  // This step's forward ops by (thread, sequence number): autograd numbers ops per thread.
  std::unordered_map<uint64_t, SeqOp> seq_ops;
  std::map<ShapeKey, OpTotals> shapes;
  std::map<std::string, KernelTotals> kernels;
  // GPU busy time of each recorded step: the union of its CUDA records' intervals (overlapping
  // kernels on several streams count once). Intervals are kept only for the steps whose records may
  // still arrive (the last two), then folded into step_gpu_ms.
  std::vector<double> step_gpu_ms;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> step_intervals;
  bool gpu = false;  // CUPTI records are being collected
  // What happened to the CUDA records: drained, attributed, or dropped and why (in each part).
  int64_t gpu_records = 0, gpu_correlations = 0, gpu_attributed = 0, gpu_no_correlation = 0, gpu_no_op = 0;
  std::unordered_map<uint64_t, Invocation> invocations;
  std::unordered_map<uint32_t, uint64_t> correlation;  // CUDA API correlation id -> op call id
  std::vector<uint64_t> step_first_id;  // first op call id of each recorded step
  std::atomic<bool> recording{false};
  uint64_t generation = 0;  // bumped whenever `ops` is cleared: per-thread caches of it go stale
  std::optional<at::CallbackHandle> handle;  // the observer of the phase (none once done)
  Phase phase = Phase::kRecording;
  // The plain step: `plain_steps` step times after the recorded ones, with every collection off.
  int plain_steps = 0;
  bool plain_settled = false;  // the first interval after the recorded steps (the tear-down's) is behind
  std::vector<double> plain_ms;
  bool gpu_finished = false;  // CUDA activity stopped and every record of the recorded steps attributed
  bool started = false, stopped = false;
};

State& state() {
  static State* s = new State();  // never destroyed: callbacks may run during static teardown
  return *s;
}

// Milliseconds covered by the union of [start, end) intervals (sorted in place).
double union_ms(std::vector<std::pair<int64_t, int64_t>>& intervals) {
  std::sort(intervals.begin(), intervals.end());
  int64_t covered = 0, open_start = 0, open_end = INT64_MIN;
  for (const auto& [start, end] : intervals) {
    if (start > open_end) {
      if (open_end != INT64_MIN) covered += open_end - open_start;
      open_start = start;
      open_end = end;
    } else {
      open_end = std::max(open_end, end);
    }
  }
  if (open_end != INT64_MIN) covered += open_end - open_start;
  return covered / 1e6;
}

// Folds the intervals of step i into step_gpu_ms[i] and frees them.
void settle_busy(State& s, size_t i) {
  if (i >= s.step_intervals.size() || s.step_intervals[i].empty()) return;
  s.step_gpu_ms[i] = union_ms(s.step_intervals[i]);
  std::vector<std::pair<int64_t, int64_t>>().swap(s.step_intervals[i]);
}

nlohmann::json part_json(const State& s) {
  nlohmann::json ops = nlohmann::json::array(), shapes = nlohmann::json::array();
  for (const auto& [key, t] : s.ops) {
    if (key.first.rfind("hfnn::profiler_", 0) == 0) continue;  // the collector's own ops are not the script's
    nlohmann::json o = {{"name", key.first}, {"phase", key.second}, {"calls", t.calls},
                        {"cpu_total_us", t.total_ns / 1e3}, {"cpu_self_us", t.self_ns / 1e3}};
    if (t.forward_op) o["forward_op"] = *t.forward_op;
    if (s.gpu) {
      o["cuda_total_us"] = t.cuda_total_ns / 1e3;
      o["cuda_self_us"] = t.cuda_self_ns / 1e3;
    }
    ops.push_back(o);
  }
  for (const auto& [key, t] : s.shapes) {
    nlohmann::json o = {{"op", key.op}, {"shape", key.shape}, {"normalized_shape", key.normalized},
                        {"dtype", key.dtype}, {"affine", key.affine}, {"flags", key.flags}, {"phase", key.phase},
                        {"calls", t.calls}, {"cpu_total_us", t.total_ns / 1e3}};
    if (s.gpu) o["cuda_total_us"] = t.cuda_total_ns / 1e3;
    shapes.push_back(o);
  }
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& [name, k] : s.kernels) kernels.push_back({{"name", name}, {"calls", k.calls}, {"cuda_us", k.ns / 1e3}});
  nlohmann::json part = {{"format", "hfnn-profile-part"}, {"version", 1}, {"meta", s.meta},
                         {"warmup", s.warmup}, {"steps_requested", s.steps}, {"step_boundaries", s.boundaries},
                         {"step_ms", s.step_ms}, {"plain_step_ms", s.plain_ms}, {"ops", ops}, {"shapes", shapes},
                         {"kernels", kernels}};
  if (s.gpu) {
    std::vector<double> busy = s.step_gpu_ms;  // with the steps not settled yet
    for (size_t i = 0; i < busy.size() && i < s.step_intervals.size(); ++i)
      if (!s.step_intervals[i].empty()) {
        auto intervals = s.step_intervals[i];
        busy[i] = union_ms(intervals);
      }
    part["step_gpu_ms"] = busy;
    part["gpu_records"] = {{"drained", s.gpu_records}, {"correlations", s.gpu_correlations},
                           {"attributed", s.gpu_attributed}, {"no_correlation", s.gpu_no_correlation},
                           {"no_op", s.gpu_no_op}, {"invocations_kept", s.invocations.size()}};
  }
  return part;
}

// Atomic: a reader (the CLI) sees the previous part or this one, never half of one. A process that
// ran no torch op writes none; one whose steps all fell inside the warm-up writes one without ops
// or steps, so the CLI can say that (step_boundaries) rather than that nothing ran.
void write_part(const State& s) {
  if (s.part_path.empty() || (s.ops.empty() && s.step_ms.empty() && s.boundaries == 0)) return;
  const auto tmp = std::filesystem::path(s.part_path).concat(".tmp");
  {
    std::ofstream out(tmp);
    out << part_json(s).dump();
    if (!out) return;  // the CLI reports a missing part; never throw from an observer
  }
  std::error_code ec;
  std::filesystem::rename(tmp, s.part_path, ec);
}

#if HFNN_GPU_ACTIVITY
// Hands the CUDA records completed so far to the ops that launched them. Called with the lock
// held; CuptiActivity::drain takes only its own lock.
void attribute_locked(State& s, bool forced) {
  if (!s.gpu) return;
  std::vector<GpuRecord> records;
  std::vector<Correlation> correlations;
  CuptiActivity::drain(&records, &correlations, forced);
  s.gpu_records += static_cast<int64_t>(records.size());
  s.gpu_correlations += static_cast<int64_t>(correlations.size());
  for (const auto& c : correlations) s.correlation[c.correlation] = c.external;
  for (const auto& r : records) {
    const auto corr = s.correlation.find(r.correlation);
    if (corr == s.correlation.end()) {  // launched outside any recorded op
      ++s.gpu_no_correlation;
      continue;
    }
    auto inv = s.invocations.find(corr->second);
    if (inv == s.invocations.end()) {  // a warm-up step's, or one already forgotten
      ++s.gpu_no_op;
      continue;
    }
    ++s.gpu_attributed;
    const int64_t ns = static_cast<int64_t>(r.end_ns - r.start_ns);
    KernelTotals& k = s.kernels[r.name];
    ++k.calls;
    k.ns += ns;
    inv->second.op->cuda_self_ns += ns;
    const int step = inv->second.step;
    if (step >= 0 && step < static_cast<int>(s.step_intervals.size()))
      s.step_intervals[step].emplace_back(static_cast<int64_t>(r.start_ns), static_cast<int64_t>(r.end_ns));
    // An op nested in itself counts once; so does a shape record, and every one around the kernel
    // gets it (a GEMM's kernel inside an attention call counts for the GEMM and the attention key).
    std::unordered_set<const OpTotals*> seen;
    for (auto it = inv; it != s.invocations.end(); it = s.invocations.find(it->second.parent)) {
      if (seen.insert(it->second.op).second) it->second.op->cuda_total_ns += ns;
      if (it->second.shape && seen.insert(it->second.shape).second) it->second.shape->cuda_total_ns += ns;
      if (it->second.parent == 0) break;
    }
  }
}

// Keeps the op calls of the last two steps: kernels finish after the CPU has moved on.
void forget_old_locked(State& s) {
  if (s.step_first_id.size() < 2) return;
  const uint64_t keep_from = s.step_first_id[s.step_first_id.size() - 2];
  for (size_t i = 0; i + 2 < s.step_intervals.size(); ++i) settle_busy(s, i);
  for (auto it = s.invocations.begin(); it != s.invocations.end();)
    it = it->first < keep_from ? s.invocations.erase(it) : std::next(it);
  for (auto it = s.correlation.begin(); it != s.correlation.end();)
    it = it->second < keep_from ? s.correlation.erase(it) : std::next(it);
}
// The recorded steps' CUDA activity, finished: the device drained so their last kernels complete,
// every record attributed, CUPTI's activity disabled (nothing of it runs in the steps after) and
// each step's busy time settled. Once, at the end of the recorded steps or at exit, whichever is first.
void finish_gpu_locked(State& s) {
  if (!s.gpu || s.gpu_finished) return;
  s.gpu_finished = true;
  // Never inside a CUDA graph capture (an optimizer step captured with torch.cuda.graph): a device
  // synchronisation would invalidate it. The records of kernels still running are then incomplete.
  bool capturing = true;
  try {
    capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  } catch (const c10::Error&) {  // never throw from an observer
    (void)cudaGetLastError();
  }
  if (!capturing && cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  attribute_locked(s, true);
  CuptiActivity::stop();
  for (size_t i = 0; i < s.step_intervals.size(); ++i) settle_busy(s, i);
  s.invocations.clear();
  s.correlation.clear();
}
#else
void attribute_locked(State&, bool) {}
void forget_old_locked(State&) {}
void finish_gpu_locked(State&) {}
#endif

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
void on_end(const at::RecordFunction& fn, at::ObserverContext*);
void boundary_locked(State& s);

// The plain steps' observer: user scopes only (torch.optim's "Optimizer.step#..." is one), no
// inputs, nothing recorded. Ops and autograd nodes, which are FUNCTION and BACKWARD_FUNCTION
// records, run no callback of hfnn's at all then (torch checks for callbacks per scope).
std::unique_ptr<at::ObserverContext> on_step_start(const at::RecordFunction&) { return nullptr; }

void on_step_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (std::string_view(fn.name()).rfind(kOptimizerStep, 0) != 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.phase == Phase::kPlain && !s.stopped) boundary_locked(s);
}

void observe_locked(State& s, Phase phase) {
  if (s.handle) at::removeCallback(*s.handle);  // safe inside a callback: a record keeps the callbacks it began with
  s.handle.reset();
  s.phase = phase;
  if (phase == Phase::kRecording)
    s.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                         .needsInputs(true)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                  at::RecordScope::USER_SCOPE}));
  else if (phase == Phase::kPlain)
    s.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_step_start, on_step_end)
                                         .scopes({at::RecordScope::USER_SCOPE}));
}

// The last recorded step ended: every collection stops (op observer, CUDA activity) and the part
// is written whole; then the plain steps are timed, or with --plain-steps 0 the script runs on
// untouched. (The Python side's labels, hfnn._startup's, go at the next step: it asks
// profiler_recording after each.)
void end_recording_locked(State& s) {
  s.recording = false;
  finish_gpu_locked(s);
  observe_locked(s, s.plain_steps > 0 ? Phase::kPlain : Phase::kDone);
  write_part(s);
}

// A step boundary after the recorded steps. The plain step is the wall time between two of them,
// as a recorded step's is between two boundaries, so the two compare. The first interval is not
// one: it holds the collector's tear-down (the part written, on a GPU the device drained and
// CUPTI's buffers flushed and disabled), on a GPU the last recorded step's kernels still queued
// when its boundary came, and, until its optimizer step, the Python side's labels; so it is left
// out. After `plain_steps` of them nothing is observed any more.
void plain_boundary_locked(State& s, int64_t t) {
  if (!s.plain_settled) {
    s.plain_settled = true;
    return;
  }
  s.plain_ms.push_back((t - s.last_boundary_ns) / 1e6);
  if (static_cast<int>(s.plain_ms.size()) >= s.plain_steps) {
    observe_locked(s, Phase::kDone);
    write_part(s);
  }
}

void boundary_locked(State& s) {
  const int64_t t = now_ns();
  ++s.boundaries;
  if (s.phase == Phase::kPlain) {
    plain_boundary_locked(s, t);
    s.last_boundary_ns = t;
    return;
  }
  attribute_locked(s, false);
  s.seq_ops.clear();  // a step's backward follows its forward: the map stays one step small
  if (s.boundaries <= s.warmup) {  // warm-up: forget what was seen so far
    s.ops.clear();
    ++s.generation;
    s.shapes.clear();
    s.kernels.clear();
    s.invocations.clear();
    s.correlation.clear();
    s.step_gpu_ms.assign(1, 0.0);  // the warm-up's kernels drained just now are not step 1's
    s.step_intervals.assign(1, {});
    s.step_first_id.assign(1, g_next_id.load());
  } else if (s.steps == 0 || s.recorded < s.steps) {
    s.step_ms.push_back((t - s.last_boundary_ns) / 1e6);
    ++s.recorded;
    forget_old_locked(s);
    const bool last = s.steps != 0 && s.recorded == s.steps;
    if (!last) {  // the next step's GPU time and first op call
      s.step_gpu_ms.push_back(0.0);
      s.step_intervals.emplace_back();
      s.step_first_id.push_back(g_next_id.load());
    }
    // Rewritten at most once a second (and after the last step): a crash loses at most that much,
    // and short steps do not pay for file writes.
    if (last) {
      end_recording_locked(s);
    } else if (t - s.last_write_ns > 1'000'000'000) {
      write_part(s);
      s.last_write_ns = t;
    }
  }
  s.last_boundary_ns = t;
}

// Backward work: an autograd node's own record, or the engine's record around it
// ("autograd::engine::evaluate_function: XBackward0", recorded as a plain function).
bool is_backward_node(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::BACKWARD_FUNCTION ||
         std::string_view(fn.name()).rfind("autograd::engine::evaluate_function", 0) == 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Frame f;
  f.start_ns = now_ns();
  if (is_backward_node(fn)) ++t_backward_depth;
  f.backward = t_backward_depth > 0;
  State& s = state();
  if (s.recording.load(std::memory_order_relaxed)) {
    const Tunable kind = tunable(fn.name());
    if (kind == Tunable::kLstm) f.shape = lstm_shape(fn);
    else if (kind == Tunable::kScope) f.shape = scope_shape(fn.name());
    else if (kind == Tunable::kGemm) f.shape = gemm_shape(fn, fn.name(), f.backward);
    else if (kind == Tunable::kCopy) f.shape = host_copy_shape(fn, f.backward);
    else if (kind != Tunable::kNone) f.shape = layer_norm_shape(fn, kind);
    if (f.shape) {  // the innermost record of an op and phase is the one that ran
      for (auto it = t_stack.rbegin(); it != t_stack.rend(); ++it) {
        if (it->shape && it->shape->op == f.shape->op && it->shape->phase == f.shape->phase) {
          it->shape.reset();
          break;
        }
      }
    }
#if HFNN_GPU_ACTIVITY
    if (s.gpu) {
      f.id = g_next_id.fetch_add(1, std::memory_order_relaxed);
      f.parent = t_stack.empty() ? 0 : t_stack.back().id;
      CuptiActivity::push(f.id);
      f.pushed = true;
    }
#endif
  }
  t_stack.push_back(std::move(f));
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_stack.empty()) return;
  Frame f = std::move(t_stack.back());
  t_stack.pop_back();
#if HFNN_GPU_ACTIVITY
  if (f.pushed) CuptiActivity::pop();
#endif
  const bool backward_node = is_backward_node(fn);
  if (backward_node && t_backward_depth > 0) --t_backward_depth;
  const int64_t total = now_ns() - f.start_ns;
  if (!t_stack.empty()) t_stack.back().child_ns += total;
  State& s = state();
  const std::string_view name = fn.name();
  const bool is_step = name.rfind(kOptimizerStep, 0) == 0;
  if (!s.recording.load(std::memory_order_relaxed) && !is_step) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.recording) {
    // A shape scope is a label around a module call, not an op: its time shows in its shape row.
    static OpTotals scope_sink;
    OpTotals* totals = nullptr;
    if (name.rfind(kShapeScope, 0) == 0) {
      totals = &scope_sink;
    } else {
      // Looked up by the name's text in a per-thread hash map whose keys view the names stored in
      // `ops` (map nodes never move), so a call builds no string (building one per call was the
      // collector's main cost on CPU-bound steps). Not by the name's address: only a dispatcher
      // op's name lives as long as the process; a backward node's, or the engine's
      // "autograd::engine::evaluate_function: ..." record's, is a string of that one record,
      // and a later record with another name can get the same address.
      thread_local std::unordered_map<std::string_view, OpTotals*> cache[2];  // forward, backward
      thread_local uint64_t cache_generation = ~uint64_t{0};
      if (cache_generation != s.generation) {
        cache[0].clear();
        cache[1].clear();
        cache_generation = s.generation;
      }
      auto& by_name = cache[f.backward ? 1 : 0];
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        auto node = s.ops.try_emplace({std::string(name), f.backward ? "bwd" : "fwd"}).first;
        it = by_name.emplace(std::string_view(node->first.first), &node->second).first;
      }
      totals = it->second;
    }
    OpTotals& t = *totals;
    ++t.calls;
    t.total_ns += total;
    t.self_ns += total - f.child_ns;
    if (const int64_t seq = fn.seqNr(); seq >= 0 && totals != &scope_sink) {
      const auto seq_key = [seq](uint64_t thread) { return (thread << 40) ^ static_cast<uint64_t>(seq); };
      if (backward_node) {
        if (!t.forward_op)
          if (const auto it = s.seq_ops.find(seq_key(fn.forwardThreadId())); it != s.seq_ops.end())
            t.forward_op = it->second.name;
      } else if (fn.scope() == at::RecordScope::FUNCTION && !f.backward) {
        if (s.seq_ops.size() > (1u << 16)) s.seq_ops.clear();  // no step boundary for a long while: stay small
        // std::map keys never move: the name's address is stable while `ops` holds it.
        if (!t.name) t.name = &s.ops.find({std::string(name), "fwd"})->first.first;
        const std::string* op_name = t.name;
        SeqOp& known = s.seq_ops[seq_key(fn.threadId())];
        const int64_t end = f.start_ns + total;
        if (!known.name || f.start_ns <= known.start_ns || f.start_ns >= known.end_ns) known = {op_name, f.start_ns, end};
      }
    }
    OpTotals* shape = nullptr;
    if (f.shape) {
      shape = &s.shapes[*f.shape];
      ++shape->calls;
      shape->total_ns += total;
    }
    // std::map never moves its values: the pointers stay valid until a warm-up clears both maps
    // and the invocations together.
    if (f.id != 0) s.invocations[f.id] = Invocation{&t, shape, f.parent, static_cast<int>(s.step_ms.size())};
  }
  if (is_step && !s.stopped && s.phase == Phase::kRecording) boundary_locked(s);
}

}  // namespace

void start(const std::string& config_json) {
  const auto config = nlohmann::json::parse(config_json);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TORCH_CHECK(!s.started, "hfnn profiler: already started in this process");
  s.started = true;
  s.meta = config.value("meta", nlohmann::json::object());
  s.warmup = config.value("warmup", 0);
  s.steps = config.value("steps", 0);
  s.plain_steps = s.steps > 0 ? config.value("plain_steps", 0) : 0;  // --steps 0 records to the end
  const std::string dir = config.value("dir", "");
  if (!dir.empty()) {
    const std::string rank = s.meta.contains("rank") ? s.meta["rank"].dump() : "0";
    s.part_path = std::filesystem::path(dir) / ("part-" + rank + "-" + std::to_string(::getpid()) + ".json");
  }
  s.last_boundary_ns = now_ns();
#if HFNN_GPU_ACTIVITY
  if (!s.meta.value("gpu", nlohmann::json()).is_null()) {
    std::string why;
    s.gpu = CuptiActivity::start(&why);
    s.meta["cupti"] = s.gpu ? "on" : why;
    if (!s.gpu)
      std::fprintf(stderr, "hfnn profile: CUDA activity is not available (%s: another CUPTI client such as "
                           "torch.profiler or Nsight may hold it); recording CPU times and shapes only\n", why.c_str());
  }
#endif
  s.step_gpu_ms.assign(1, 0.0);
  s.step_intervals.assign(1, {});
  s.step_first_id.assign(1, g_next_id.load());
  s.recording = true;
  observe_locked(s, Phase::kRecording);
}

void step() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.started && !s.stopped && s.phase != Phase::kDone) boundary_locked(s);
}

bool recording() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.started && !s.stopped && s.phase == Phase::kRecording;
}

void stop() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.recording = false;
  observe_locked(s, Phase::kDone);
  finish_gpu_locked(s);  // the last kernels finish (when the script ended while recording)
  // step_gpu_ms has one slot past the last recorded step (the one in progress): drop it.
  if (s.step_gpu_ms.size() > s.step_ms.size()) s.step_gpu_ms.resize(s.step_ms.size());
  write_part(s);
}

std::string snapshot() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  attribute_locked(s, false);
  return part_json(s).dump();
}

}  // namespace hfnn::profiles

namespace {
void profiler_start(c10::string_view config) { hfnn::profiles::start(std::string(config)); }
void profiler_step() { hfnn::profiles::step(); }
bool profiler_recording() { return hfnn::profiles::recording(); }
void profiler_stop() { hfnn::profiles::stop(); }
std::string profiler_snapshot() { return hfnn::profiles::snapshot(); }
}  // namespace

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def("profiler_start(str config) -> ()", &profiler_start);
  m.def("profiler_step() -> ()", &profiler_step);
  m.def("profiler_recording() -> bool", &profiler_recording);
  m.def("profiler_stop() -> ()", &profiler_stop);
  m.def("profiler_snapshot() -> str", &profiler_snapshot);
}
