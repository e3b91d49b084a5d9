#include "profiles/collector.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/library.h>
#include <torch/version.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "profiles/advice.h"
#include "profiles/gpu_join.h"
#include "profiles/step_times.h"

#define HFNN_GPU_ACTIVITY (HFNN_WITH_CUDA && HFNN_TORCH_CUDA)
#if HFNN_GPU_ACTIVITY
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <cuda_runtime_api.h>

#include "profiles/cuda_step_clock.h"
#include "profiles/cupti_activity.h"
#endif

namespace hfnn::profiles {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Op times are read twice a record: from the CPU's time-stamp counter where the kernel keeps time
// with it (clocksource "tsc": invariant, the same on every core), 15 ns a read against 40 for
// steady_clock (AMD EPYC, tsc clocksource: two reads were a fifth of the collector's cost per op);
// converted to ns when the part is written. Elsewhere, and on other CPUs, steady_clock's ns.
// Step times are always steady_clock's.
struct TickClock {
  bool tsc = false;
  int64_t tsc0 = 0, ns0 = 0;  // a pair read at start
  double ns_per_tick = 1.0;   // from a short calibration at start, refined at every conversion
};
TickClock g_ticks;

int64_t ticks() {
#if defined(__x86_64__)
  if (g_ticks.tsc) return static_cast<int64_t>(__rdtsc());
#endif
  return now_ns();
}

void calibrate_ticks() {
#if defined(__x86_64__)
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  if (!(source >> name) || name != "tsc") return;
  const int64_t t0 = static_cast<int64_t>(__rdtsc()), n0 = now_ns();
  int64_t n1 = n0;
  while (n1 - n0 < 2'000'000) n1 = now_ns();  // 2 ms: two reads' error is 0.004% of it
  const int64_t t1 = static_cast<int64_t>(__rdtsc());
  if (t1 <= t0) return;
  g_ticks = {true, t0, n0, static_cast<double>(n1 - n0) / static_cast<double>(t1 - t0)};
#endif
}

// ns per tick now: over the whole time since start, which only gets more exact.
double ns_per_tick() {
#if defined(__x86_64__)
  if (g_ticks.tsc) {
    const int64_t t = static_cast<int64_t>(__rdtsc()), n = now_ns();
    if (n - g_ticks.ns0 > 100'000'000 && t > g_ticks.tsc0)
      g_ticks.ns_per_tick = static_cast<double>(n - g_ticks.ns0) / static_cast<double>(t - g_ticks.tsc0);
  }
#endif
  return g_ticks.ns_per_tick;
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

// Inputs are boxed (copied into IValues, which torch does for every op of a record whose
// callbacks ask for them) only inside the records that hold the ops whose shapes are read: boxing
// every op was a third of the observer's cost per op (bench/collector_cost.py). torch decides it
// per record before any callback sees the record's name, so it cannot be asked for by op name: the
// collector asks for the records begun inside these (begin_inputs):
// - LayerNorm: aten::layer_norm holds native_layer_norm (F.layer_norm, nn.LayerNorm, custom
//   modules calling either), the autograd node NativeLayerNormBackward0 its backward, hfnn's
//   LayerNorm ops torch's kernels when they fall back to them (their own shapes they tell the
//   collector themselves: note_layer_norm).
// - GEMMs, for the advice: aten::linear (nn.Linear, F.linear), aten::matmul (torch.matmul, @),
//   aten::einsum, aten::bilinear and aten::tensordot hold the mm/addmm/bmm they run; the GEMM
//   backward nodes (MmBackward0, ...) those of the gradients; the MultiheadAttention scope
//   ("hfnn.shape|...") the bmm/baddbmm its need_weights path calls itself.
// - Copies to the host, for the advice, in processes with a CUDA device only (on the CPU there
//   are none): aten::to and aten::_to_copy hold the copy_ of .cpu(), .to("cpu") and .tolist(),
//   when called from Python (no op around them: host_copy_boxes), not the casts autocast and
//   other ops make inside their own records, which are most of them.
// - A user scope "hfnn.inputs..." whatever the start-up hook wraps in it (torch's LSTM, called
//   from Python).
// An op called otherwise (a native_layer_norm, lstm, torch.mm, bmm or addmm called directly from
// Python, a cpu_tensor.copy_(cuda_tensor)) records no shape.
constexpr std::string_view kInputsScope = "hfnn.inputs";
constexpr std::string_view kBoxingRecords[] = {
    "aten::layer_norm", "NativeLayerNormBackward0", "hfnn::layer_norm", "hfnn::layer_norm_bwd",
    "aten::linear", "aten::matmul", "aten::einsum", "aten::bilinear", "aten::tensordot",
    "MmBackward0", "AddmmBackward0", "BmmBackward0", "BaddbmmBackward0", "AddmmActivationBackward0"};
constexpr std::string_view kHostCopyBoxingRecords[] = {"aten::to", "aten::_to_copy"};

bool boxes_inputs(std::string_view name) {
  if (name.rfind(kInputsScope, 0) == 0 || name.rfind(kShapeScope, 0) == 0) return true;
  return std::find(std::begin(kBoxingRecords), std::end(kBoxingRecords), name) != std::end(kBoxingRecords);
}

bool boxes_host_copies(std::string_view name, bool cuda_device) {
  return cuda_device && std::find(std::begin(kHostCopyBoxingRecords), std::end(kHostCopyBoxingRecords), name) !=
                            std::end(kHostCopyBoxingRecords);
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

ShapeKey layer_norm_key(const at::Tensor& x, c10::IntArrayRef normalized, bool affine, bool backward) {
  ShapeKey key;
  key.op = "layer_norm";
  key.shape = sizes_string(x.sizes());
  key.normalized = sizes_string(normalized);
  key.dtype = dtype_name(x.scalar_type());
  key.affine = affine;
  key.phase = backward ? "bwd" : "fwd";
  return key;
}

// LayerNorm's shape from the op's inputs: native_layer_norm(input, normalized_shape, weight, bias, eps)
// and native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, mask).
std::optional<ShapeKey> layer_norm_shape(const at::RecordFunction& fn, Tunable kind) {
  const auto inputs = fn.inputs();
  const size_t input_at = kind == Tunable::kLayerNormFwd ? 0 : 1;
  const size_t weight_at = kind == Tunable::kLayerNormFwd ? 2 : 5;
  if (inputs.size() <= weight_at || !inputs[input_at].isTensor()) return std::nullopt;
  const auto& ns = inputs[input_at + 1];
  const bool affine = inputs[weight_at].isTensor() && inputs[weight_at].toTensor().defined();
  ShapeKey key = layer_norm_key(inputs[input_at].toTensor(), ns.isIntList() ? ns.toIntVector() : std::vector<int64_t>{},
                                affine, kind == Tunable::kLayerNormBwd);
  if (!ns.isIntList()) key.normalized = "?";
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

// What a record is, read from its name once per name (not once per call).
enum NameFlag : uint8_t {
  kEngineRecord = 1 << 0,   // "autograd::engine::evaluate_function: X", recorded as a plain function: backward work
  kStepRecord = 1 << 1,     // torch.optim's "Optimizer.step#...": a step boundary at its end
  kLabel = 1 << 2,          // hfnn's own scopes (shape, inputs): no op row of their own
  kBoxesInputs = 1 << 3,    // the ops inside it have their inputs boxed (boxes_inputs)
  kBoxesHostCopies = 1 << 4,  // likewise where called from Python (boxes_host_copies)
};
constexpr std::string_view kOptimizerStep = "Optimizer.step#";

struct NameInfo {
  const std::string* name = nullptr;  // interned: lives as long as the process
  Tunable tunable = Tunable::kNone;
  uint8_t flags = 0;
};

// Written by one thread (the one that owns the totals) and read by whichever writes the part:
// relaxed atomics, which on x86 are plain loads and stores, no locked instruction per op.
class Counter {
 public:
  void add(int64_t d) { v_.store(v_.load(std::memory_order_relaxed) + d, std::memory_order_relaxed); }
  int64_t get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// One op name and phase, in one thread. Never freed; a warm-up is forgotten by subtracting what
// the totals held at its last boundary (base_*), since other threads may be adding to them then.
struct OpTotals {
  OpTotals(const NameInfo* info, bool backward) : info(info), backward(backward) {}
  const NameInfo* info;
  bool backward;
  Counter calls, total_ticks, self_ticks;  // CPU time in ticks() (ns on the part)
  int64_t base_calls = 0, base_total_ticks = 0, base_self_ticks = 0;  // under the state's mutex
  CudaTime cuda;                                                 // under the state's mutex (the join)
  std::atomic<const std::string*> forward_op{nullptr};           // backward nodes: the forward op that made them
};

struct ShapeTotals {
  int64_t calls = 0, total_ticks = 0;
  CudaTime cuda;
};

// A name, per thread: what it is and this thread's totals for it, forward and backward.
struct NameEntry {
  const NameInfo* info = nullptr;
  OpTotals* ops[2] = {nullptr, nullptr};
};

struct Frame {
  int64_t start = 0, children = 0;  // ticks()
  NameEntry* entry = nullptr;
  OpTotals* op = nullptr;  // null: a label, or a record begun while not recording
  bool backward = false;   // inside backward work
  bool backward_node = false;
  bool user_scope = false;  // a record_function scope (Optimizer.step#, hfnn's labels, the script's own)
  bool inputs = false;     // turned input boxing on for the records inside it
  uint64_t id = 0, parent = 0;  // on a GPU: the external correlation id pushed for it (0: none)
  std::unique_ptr<ShapeKey> shape;
};

// The forward op behind an autograd sequence number: the op that created the backward node, or
// the op enclosing it (aten::layer_norm around aten::native_layer_norm). Ops share a number until
// a node takes it, so among ops with one number the enclosing or the latest one is kept. One table
// per thread (autograd numbers ops per thread), direct-mapped by the number: a forward pass with
// more nodes than slots loses the oldest links, nothing else. Written by its thread, read by the
// backward's (another one on a GPU): relaxed atomics.
struct SeqSlot {
  std::atomic<int64_t> seq{-1};
  std::atomic<const std::string*> name{nullptr};
  std::atomic<int64_t> start{0}, end{0};  // ticks()
};
constexpr size_t kSeqSlots = size_t{1} << 16;

// Everything a thread touches per op, so an op takes no lock: its record stack, its names (by the
// record's name pointer, checked against the text: a dispatcher op's name is its schema's string,
// so nearly every lookup is a hit on the first probe; an autograd node's or a user scope's name
// lives one record, and a later one can get the same address with another name), its totals.
struct ThreadData {
  uint64_t torch_thread = 0;  // at::RecordFunction's id of the thread (autograd's sequence numbers are per thread)
  bool in_use = false;        // false: its thread ended; a new thread takes it over
  std::vector<Frame> stack;
  int backward_depth = 0;
  int inputs_depth = 0;
  at::CallbackHandle inputs_callback = 0;
  struct Slot {
    const char* ptr = nullptr;
    NameEntry* entry = nullptr;
  };
  std::vector<Slot> slots = std::vector<Slot>(1024);
  size_t slots_used = 0;
  std::unordered_map<std::string_view, NameEntry> by_text;  // keys view the interned names
  std::deque<OpTotals> ops;           // appended under the state's mutex, which readers hold
  std::unique_ptr<SeqSlot[]> seq;     // made at the first forward op with a sequence number
  Counter records, records_with_inputs;  // observed while recording; those whose inputs torch boxed
  // On a GPU, the op calls ended since the last step boundary, handed to the join there.
  std::atomic_flag calls_lock = ATOMIC_FLAG_INIT;
  std::vector<GpuJoin::Call> calls, calls_spare;
};

std::atomic<uint64_t> g_next_id{1};

// A diagnostic: which parts of the collection run while recording (HFNN_PROFILE_PARTS), so that
// the profiler's cost on a launch-bound step can be taken apart (bench/profiler_cost.py's
// "--mode 'HFNN_PROFILE_PARTS=...'"). "all" (the default) is the profiler; "observer" registers
// the op observer and its callbacks return at once (torch's own cost of observing every op);
// "no-cupti" records ops and shapes without CUDA activity; "no-correlation" traces CUDA activity
// without pushing the external correlation ids around each op (kernels stay unattributed);
// "kernels-only" traces kernels, memcpy and memset with no API records, no callbacks and no ids
// (unattributed); "attached" starts CUPTI with nothing enabled (what an attached CUPTI costs).
// HFNN_CUPTI_JOIN picks how kernels find their ops: "external" (the default: CUPTI's external
// correlation with API records of the launch calls, as Kineto does) or "callbacks" (a CUPTI
// callback on each launch, memcpy and memset call records its correlation id beside the current op;
// measured on an H100 no cheaper within the noise, so it stays opt-in).
enum class Parts { kAll, kObserver, kObserverFunctions, kNoCupti, kNoCorrelation, kKernelsOnly, kAttached };
Parts g_parts = Parts::kAll;

Parts parts_from_env() {
  const char* v = std::getenv("HFNN_PROFILE_PARTS");
  const std::string_view p = v ? v : "";
  if (p == "observer") return Parts::kObserver;
  if (p == "observer-functions") return Parts::kObserverFunctions;
  if (p == "no-cupti") return Parts::kNoCupti;
  if (p == "no-correlation") return Parts::kNoCorrelation;
  if (p == "kernels-only") return Parts::kKernelsOnly;
  if (p == "attached") return Parts::kAttached;
  return Parts::kAll;
}

const char* parts_name(Parts p) {
  switch (p) {
    case Parts::kObserver: return "observer";
    case Parts::kObserverFunctions: return "observer-functions";
    case Parts::kNoCupti: return "no-cupti";
    case Parts::kNoCorrelation: return "no-correlation";
    case Parts::kKernelsOnly: return "kernels-only";
    case Parts::kAttached: return "attached";
    default: return "all";
  }
}

// What the collector does, step by step: warm-up and the recorded steps (every op observed, CUDA
// activity on), then the plain steps (nothing collected: only step boundaries are seen, to time
// them), then nothing at all: the script runs on untouched. Under --sample N only every N-th step
// of the recorded window is recorded in full; the steps in between are unsampled: like plain
// steps, only timed.
enum class Phase { kRecording, kUnsampled, kPlain, kDone };

struct State {
  std::mutex mutex;
  nlohmann::json meta;
  std::filesystem::path part_path;
  int warmup = 0, steps = 0;  // steps == 0: record until the process ends
  int sample = 1;             // every sample-th step of the window is recorded in full
  int boundaries = 0, recorded = 0, window = 0;  // window: the steps after the warm-up, unsampled ones too
  int64_t last_boundary_ns = 0;
  int64_t last_write_ns = 0;
  std::vector<double> step_ms;
  std::atomic<int> current_step{0};  // the recorded step ops run in now (an index into step_ms)
  std::map<std::string, NameInfo, std::less<>> names;  // every record name seen, interned
  std::vector<std::unique_ptr<ThreadData>> threads;    // never freed: ops point into them
  std::map<ShapeKey, ShapeTotals> shapes;
  // GPU busy time of each recorded step: the union of its CUDA records' intervals (overlapping
  // kernels on several streams count once). Intervals are kept only for the steps whose records may
  // still arrive (the last two), then folded into step_gpu_ms.
  std::vector<double> step_gpu_ms;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> step_intervals;
  size_t settled_steps = 0;  // the steps before it are settled (with --steps 0 a run may have thousands)
  bool cuda_device = false;  // the process has a CUDA device (copies to the host are possible)
  bool gpu = false;          // CUPTI records are being collected
  bool cupti_checked = false;  // the first records came with their correlations
  GpuJoin join;
  std::vector<GpuRecord> drained_records;  // reused between drains
  std::vector<Correlation> drained_correlations;
  std::vector<uint64_t> step_first_id;  // first op call id of each recorded step
  std::atomic<bool> recording{false};
  std::optional<at::CallbackHandle> handle;  // the observer of the phase (none once done)
  Phase phase = Phase::kRecording;
  // The plain step: `plain_steps` step times after the recorded ones, with every collection off.
  int plain_steps = 0;
  bool plain_settled = false;  // the first interval after the recorded steps (the tear-down's) is behind
  std::vector<double> plain_ms;
  // Under --sample: the unsampled steps' times, each from the end of the boundary that began it
  // (after a recorded step, the tear-down: the device drained, CUDA activity paused, the observer
  // swapped; now and then the part written), so none holds the collector's own work.
  std::vector<double> unsampled_ms;
  // On a GPU a step's time (recorded, unsampled or plain) is the longer of its host interval and its
  // GPU interval, from CUDA events at its boundaries (profiles/step_times.h says why events), from
  // the first boundary where the devices the steps run on are known (start_step_clock_locked).
  GpuStepTimes step_times;
#if HFNN_GPU_ACTIVITY
  std::unique_ptr<CudaEventClock> step_clock;
#endif
  bool gpu_finished = false;  // CUDA activity stopped and every record of the recorded steps attributed
  bool started = false, stopped = false;
};

State& state() {
  static State* s = new State();  // never destroyed: callbacks may run during static teardown
  return *s;
}

// ---- The thread's data -------------------------------------------------------------------------

thread_local ThreadData* t_data = nullptr;  // trivial: one TLS read per callback
thread_local bool t_exited = false;

// Hands a thread's data back when the thread ends (its totals stay; a new thread takes it over).
struct ThreadExit {
  void arm() {}
  ~ThreadExit() {
    t_exited = true;
    if (ThreadData* t = t_data) {
      std::lock_guard<std::mutex> lock(state().mutex);
      t->in_use = false;
      t_data = nullptr;
    }
  }
};
thread_local ThreadExit t_exit;

[[gnu::noinline]] ThreadData* register_thread() {
  if (t_exited) return nullptr;  // records during the thread's own teardown: not observed
  State& s = state();
  ThreadData* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto& d : s.threads)
      if (!d->in_use) {
        t = d.get();
        break;
      }
    if (!t) {
      s.threads.push_back(std::make_unique<ThreadData>());
      t = s.threads.back().get();
      t->stack.reserve(64);
    }
    t->in_use = true;
  }
  t->torch_thread = at::RecordFunction::currentThreadId();
  t->stack.clear();
  t->backward_depth = 0;
  t->inputs_depth = 0;
  t->inputs_callback = 0;
  t_exit.arm();  // its destructor runs when this thread ends
  t_data = t;
  return t;
}

ThreadData* thread_data() {
  ThreadData* t = t_data;
  return t ? t : register_thread();
}

[[gnu::noinline]] NameEntry* name_by_text(ThreadData& t, const char* name) {
  const std::string_view text(name);
  if (auto it = t.by_text.find(text); it != t.by_text.end()) return &it->second;
  const NameInfo* info = nullptr;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.names.find(text);
    if (it == s.names.end()) {
      it = s.names.emplace(std::string(text), NameInfo{}).first;
      NameInfo& n = it->second;
      n.name = &it->first;
      n.tunable = tunable(text);
      if (text.rfind("autograd::engine::evaluate_function", 0) == 0) n.flags |= kEngineRecord;
      if (text.rfind(kOptimizerStep, 0) == 0) n.flags |= kStepRecord;
      if (text.rfind(kShapeScope, 0) == 0 || text.rfind(kInputsScope, 0) == 0) n.flags |= kLabel;
      if (boxes_inputs(text)) n.flags |= kBoxesInputs;
      if (boxes_host_copies(text, s.cuda_device)) n.flags |= kBoxesHostCopies;
    }
    info = &it->second;
  }
  NameEntry& entry = t.by_text.try_emplace(std::string_view(*info->name)).first->second;
  entry.info = info;
  return &entry;
}

size_t name_slot(const char* name, size_t mask) {
  return static_cast<size_t>((reinterpret_cast<uintptr_t>(name) >> 3) * 0x9E3779B97F4A7C15ull >> 40) & mask;
}

NameEntry* lookup_name(ThreadData& t, const char* name) {
  size_t mask = t.slots.size() - 1;
  for (size_t i = name_slot(name, mask);; i = (i + 1) & mask) {
    auto& slot = t.slots[i];
    if (slot.ptr == name) {
      if (std::strcmp(name, slot.entry->info->name->c_str()) != 0) slot.entry = name_by_text(t, name);  // address reused
      return slot.entry;
    }
    if (slot.ptr) continue;
    NameEntry* entry = name_by_text(t, name);
    if (2 * (t.slots_used + 1) > t.slots.size()) {
      // Short-lived names leave stale addresses behind: start over rather than grow past 8192 slots.
      const size_t size = t.slots.size() < 8192 ? 2 * t.slots.size() : t.slots.size();
      std::vector<ThreadData::Slot> old;
      old.swap(t.slots);
      t.slots.assign(size, {});
      t.slots_used = 0;
      mask = size - 1;
      if (size != old.size())
        for (const auto& o : old)
          if (o.ptr) {
            size_t j = name_slot(o.ptr, mask);
            while (t.slots[j].ptr) j = (j + 1) & mask;
            t.slots[j] = o;
            ++t.slots_used;
          }
      i = name_slot(name, mask);
      while (t.slots[i].ptr) i = (i + 1) & mask;
    }
    t.slots[i] = {name, entry};
    ++t.slots_used;
    return entry;
  }
}

OpTotals* op_totals(ThreadData& t, NameEntry& entry, bool backward) {
  OpTotals*& op = entry.ops[backward ? 1 : 0];
  if (!op) {
    std::lock_guard<std::mutex> lock(state().mutex);
    op = &t.ops.emplace_back(entry.info, backward);
  }
  return op;
}

// The thread-local callback whose only job is to ask torch for the inputs of the records begun
// while it is there (boxes_inputs): added when the first such record starts, removed when it ends.
std::unique_ptr<at::ObserverContext> on_inputs_start(const at::RecordFunction&) { return nullptr; }
void on_inputs_end(const at::RecordFunction&, at::ObserverContext*) {}

void begin_inputs(ThreadData& t) {
  if (t.inputs_depth++ > 0) return;
  static const at::RecordFunctionCallback kBoxInputs =
      at::RecordFunctionCallback(on_inputs_start, on_inputs_end).needsInputs(true).scopes({at::RecordScope::FUNCTION});
  t.inputs_callback = at::addThreadLocalCallback(kBoxInputs);
}

void end_inputs(ThreadData& t) {
  if (t.inputs_depth == 0 || --t.inputs_depth > 0) return;
  if (t.inputs_callback) at::removeCallback(t.inputs_callback);  // safe inside a callback: records keep theirs
  t.inputs_callback = 0;
}

// Whether the record just begun (the stack's top) was called from Python: no op record around it,
// at most a record_function scope.
bool called_from_python(const ThreadData& t) {
  return t.stack.size() < 2 || t.stack[t.stack.size() - 2].user_scope;
}

void add_call(ThreadData& t, const GpuJoin::Call& call) {
  while (t.calls_lock.test_and_set(std::memory_order_acquire)) {
  }
  t.calls.push_back(call);
  t.calls_lock.clear(std::memory_order_release);
}

// The innermost record of an op and phase is the one that ran: an enclosing one gives its shape up.
void keep_innermost(ThreadData& t, Frame& f) {
  for (auto it = t.stack.rbegin(); it != t.stack.rend(); ++it) {
    if (&*it == &f) continue;
    if (it->shape && it->shape->op == f.shape->op && it->shape->phase == f.shape->phase) {
      it->shape.reset();
      break;
    }
  }
}

// ---- The part ----------------------------------------------------------------------------------

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
  const double us_per_tick = ns_per_tick() / 1e3;
  // Every thread's totals of a name and phase, summed, less what the warm-up left in them.
  struct Row {
    int64_t calls = 0, total_ticks = 0, self_ticks = 0;
    CudaTime cuda;
    const std::string* forward_op = nullptr;
  };
  std::map<std::pair<std::string_view, std::string_view>, Row> rows;  // (name, phase)
  for (const auto& t : s.threads)
    for (const OpTotals& o : t->ops) {
      const int64_t calls = o.calls.get() - o.base_calls;
      if (calls <= 0) continue;  // not called since the warm-up
      Row& r = rows[{*o.info->name, o.backward ? "bwd" : "fwd"}];
      r.calls += calls;
      r.total_ticks += o.total_ticks.get() - o.base_total_ticks;
      r.self_ticks += o.self_ticks.get() - o.base_self_ticks;
      r.cuda.self_ns += o.cuda.self_ns;
      r.cuda.total_ns += o.cuda.total_ns;
      if (const std::string* f = o.forward_op.load(std::memory_order_relaxed)) r.forward_op = f;
    }
  nlohmann::json ops = nlohmann::json::array(), shapes = nlohmann::json::array();
  for (const auto& [key, t] : rows) {
    if (key.first.rfind("hfnn::profiler_", 0) == 0) continue;  // the collector's own ops are not the script's
    nlohmann::json o = {{"name", key.first}, {"phase", key.second}, {"calls", t.calls},
                        {"cpu_total_us", t.total_ticks * us_per_tick}, {"cpu_self_us", t.self_ticks * us_per_tick}};
    if (t.forward_op) o["forward_op"] = *t.forward_op;
    if (s.gpu) {
      o["cuda_total_us"] = t.cuda.total_ns / 1e3;
      o["cuda_self_us"] = t.cuda.self_ns / 1e3;
    }
    ops.push_back(o);
  }
  for (const auto& [key, t] : s.shapes) {
    nlohmann::json o = {{"op", key.op}, {"shape", key.shape}, {"normalized_shape", key.normalized},
                        {"dtype", key.dtype}, {"affine", key.affine}, {"flags", key.flags}, {"phase", key.phase},
                        {"calls", t.calls}, {"cpu_total_us", t.total_ticks * us_per_tick}};
    if (s.gpu) o["cuda_total_us"] = t.cuda.total_ns / 1e3;
    shapes.push_back(o);
  }
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& [name, k] : s.join.kernels())
    kernels.push_back({{"name", name}, {"calls", k.calls}, {"cuda_us", k.ns / 1e3}});
  // What the observer saw since the start, warm-up included: records (ops, autograd nodes, scopes),
  // and those whose inputs torch boxed for it (only inside boxes_inputs' records).
  int64_t records = 0, with_inputs = 0;
  for (const auto& t : s.threads) {
    records += t->records.get();
    with_inputs += t->records_with_inputs.get();
  }
  nlohmann::json part = {{"format", "hfnn-profile-part"}, {"version", 1}, {"meta", s.meta},
                         {"observer", {{"records", records}, {"records_with_inputs", with_inputs}}},
                         {"warmup", s.warmup}, {"steps_requested", s.steps}, {"step_boundaries", s.boundaries},
                         {"step_ms", s.step_ms}, {"plain_step_ms", s.plain_ms}, {"ops", ops}, {"shapes", shapes},
                         {"kernels", kernels}, {"sample", s.sample}, {"window_steps", s.window},
                         {"unsampled_step_ms", s.unsampled_ms}};
  if (s.gpu) {
    std::vector<double> busy = s.step_gpu_ms;  // with the steps not settled yet
    for (size_t i = 0; i < busy.size() && i < s.step_intervals.size(); ++i)
      if (!s.step_intervals[i].empty()) {
        auto intervals = s.step_intervals[i];
        busy[i] = union_ms(intervals);
      }
    part["step_gpu_ms"] = busy;
    part["gpu_records"] = {{"drained", s.join.records}, {"correlations", s.join.correlations},
                           {"attributed", s.join.attributed}, {"no_correlation", s.join.no_correlation},
                           {"no_op", s.join.no_op}, {"invocations_kept", s.join.calls_kept()}};
  }
  return part;
}

// Atomic: a reader (the CLI) sees the previous part or this one, never half of one. A process that
// ran no torch op writes none; one whose steps all fell inside the warm-up writes one without ops
// or steps, so the CLI can say that (step_boundaries) rather than that nothing ran.
void write_part(const State& s) {
  const bool any_op = std::any_of(s.threads.begin(), s.threads.end(), [](const auto& t) {
    return std::any_of(t->ops.begin(), t->ops.end(), [](const OpTotals& o) { return o.calls.get() > o.base_calls; });
  });
  if (s.part_path.empty() || (!any_op && s.step_ms.empty() && s.boundaries == 0)) return;
  const auto tmp = std::filesystem::path(s.part_path).concat(".tmp");
  {
    std::ofstream out(tmp);
    out << part_json(s).dump();
    if (!out) return;  // the CLI reports a missing part; never throw from an observer
  }
  std::error_code ec;
  std::filesystem::rename(tmp, s.part_path, ec);
}

// The op calls every thread ended since the last time, to the join.
void gather_calls_locked(State& s) {
  for (auto& t : s.threads) {
    while (t->calls_lock.test_and_set(std::memory_order_acquire)) {
    }
    t->calls.swap(t->calls_spare);
    t->calls_lock.clear(std::memory_order_release);
    for (const auto& call : t->calls_spare) s.join.add_call(call);
    t->calls_spare.clear();
  }
}

#if HFNN_GPU_ACTIVITY
// Hands the CUDA records completed so far to the ops that launched them. Called with the lock
// held; CuptiActivity::drain takes only its own lock.
void attribute_locked(State& s, bool forced) {
  if (!s.gpu) return;
  gather_calls_locked(s);
  CuptiActivity::drain(&s.drained_records, &s.drained_correlations, forced);
  s.join.add(s.drained_records, s.drained_correlations, &s.step_intervals);
  s.drained_records.clear();
  s.drained_correlations.clear();
  // The launch calls alone must give correlation records (cupti_activity.cpp): where the first
  // records came without any, every API call is traced from then on, and the part says so.
  if (!s.cupti_checked && s.join.records > 0) {
    s.cupti_checked = true;
    if (s.join.correlations == 0 && CuptiActivity::trace_every_api())
      s.meta["cupti_api"] = CuptiActivity::traced_apis() + " (the launch calls alone gave no correlation records)";
  }
}

// Keeps the op calls of the last two steps and of every step whose end the GPU has not reached yet
// (its end event pending, step_times.h): kernels finish after the CPU has moved on, and a loop that
// never waits for the GPU runs ahead of it by as many steps as the launch queue holds (up to
// GpuStepTimes::kSlots / 2). Forgetting a step's calls before its kernels' records arrive would
// leave those kernels unattributed and the step's busy time 0.
void forget_old_locked(State& s) {
  s.step_times.settle(false);
  const size_t behind = 2 + s.step_times.pending();
  if (s.step_first_id.size() < behind) return;
  const uint64_t keep_from = s.step_first_id[s.step_first_id.size() - behind];
  for (; s.settled_steps + behind < s.step_intervals.size(); ++s.settled_steps) settle_busy(s, s.settled_steps);
  s.join.forget_before(keep_from);
}
// The recorded steps so far, complete: the devices drained so their last kernels finish, every
// record attributed, each step's busy time settled, their calls forgotten (the kernels' totals stay).
// The devices are those the recorded kernels ran on (step_devices): the thread's current device
// may be another (a torchrun rank that never called torch.cuda.set_device runs its kernels on
// cuda:LOCAL_RANK with device 0 current). Where no record has named one yet, the records completed
// so far are drained first. Never inside a CUDA graph capture (synchronize_devices): the records of
// kernels still running are then incomplete.
void drain_gpu_locked(State& s) {
  if (s.join.devices().empty()) attribute_locked(s, true);
  synchronize_devices(step_devices(s.join.devices()));
  attribute_locked(s, true);
  for (size_t i = 0; i < s.step_intervals.size(); ++i) settle_busy(s, i);
  s.join.forget_before(g_next_id.load());
}

// The recorded steps' CUDA activity, finished: drained, and CUPTI's activity disabled (nothing of it
// runs in the steps after). Once, at the end of the recorded steps or at exit, whichever is first.
// At the end of the recorded steps CUPTI leaves the process too (`detach`): the script runs on,
// its plain steps timed, and an attached CUPTI slows every launch even with its activity disabled
// (examples/lstm_lm.py on an H100, launch-bound: plain step 45.2 ms against 41.6 in a fresh process).
void finish_gpu_locked(State& s, bool detach) {
  if (!s.gpu || s.gpu_finished) return;
  s.gpu_finished = true;
  drain_gpu_locked(s);
  CuptiActivity::stop(detach);
}

// At exit: a detach still waiting for a CUDA call is called off (no finalizing inside the process's
// teardown), and the part's meta says what became of it.
void settle_detach_locked(State& s) {
  if (!s.gpu) return;
  CuptiActivity::cancel_detach();
  s.meta["cupti_detach"] = CuptiActivity::detach_state();
}

// Under --sample, around the unsampled steps: CUPTI's activity off (no CUPTI work in their
// launches), then on again for the next recorded step.
void pause_gpu_locked(State& s) {
  if (!s.gpu || s.gpu_finished) return;
  drain_gpu_locked(s);
  CuptiActivity::pause();
}

void resume_gpu_locked(State& s) {
  if (s.gpu && !s.gpu_finished) CuptiActivity::resume();
}

// CUDA events for the steps' GPU intervals, on the devices the steps' kernels run on
// (step_devices), from the first boundary where some device has a CUDA context.
void start_step_clock_locked(State& s) {
  if (s.step_clock || !s.cuda_device) return;
  std::vector<int> devices = step_devices(s.join.devices());
  if (devices.empty()) return;
  s.step_clock = std::make_unique<CudaEventClock>(std::move(devices));
  s.step_times.set_clock(s.step_clock.get());
}
#else
void attribute_locked(State&, bool) {}
void forget_old_locked(State&) {}
void finish_gpu_locked(State&, bool) {}
void settle_detach_locked(State&) {}
void pause_gpu_locked(State&) {}
void resume_gpu_locked(State&) {}
void start_step_clock_locked(State&) {}
#endif

// ---- Phases and step boundaries ------------------------------------------------------------------

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
  if ((s.phase == Phase::kPlain || s.phase == Phase::kUnsampled) && !s.stopped) boundary_locked(s);
}

void observe_locked(State& s, Phase phase) {
  if (s.handle) at::removeCallback(*s.handle);  // safe inside a callback: a record keeps the callbacks it began with
  s.handle.reset();
  s.phase = phase;
  // No inputs asked for: torch boxes them only inside the records that hold the ops whose shapes
  // are read (begin_inputs). Ids (needsIds) are not needed either: calls are told apart by the
  // collector's own ids.
  if (phase == Phase::kRecording && g_parts == Parts::kObserverFunctions)
    s.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                         .needsInputs(false)
                                         .needsIds(false)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  else if (phase == Phase::kRecording)
    s.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                         .needsInputs(false)
                                         .needsIds(false)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                  at::RecordScope::USER_SCOPE}));
  else if (phase == Phase::kPlain || phase == Phase::kUnsampled)
    s.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_step_start, on_step_end)
                                         .scopes({at::RecordScope::USER_SCOPE}));
}

// The last recorded step ended: every collection stops (op observer, CUDA activity) and the part
// is written whole; then the plain steps are timed, or with --plain-steps 0 the script runs on
// untouched. (The Python side's labels, hfnn._startup's, go at the next step: it asks
// profiler_recording after each.)
void end_recording_locked(State& s) {
  s.recording = false;
  finish_gpu_locked(s, true);
  s.step_times.settle(false);  // the devices drained: the recorded steps' events have completed
  observe_locked(s, s.plain_steps > 0 ? Phase::kPlain : Phase::kDone);
  write_part(s);
}

// A step boundary after the recorded steps. The plain step is the wall time between two of them,
// as a recorded step's is between two boundaries, so the two compare. The first interval is not
// one: it holds the collector's tear-down (the part written, on a GPU the device drained and
// CUPTI's buffers flushed and disabled), on a GPU the last recorded step's kernels still queued
// when its boundary came, and, until its optimizer step, the Python side's labels; so it is left
// out. After `plain_steps` of them nothing is observed any more.
// On a GPU each plain step also has its GPU interval (step_times.h): read once its events have
// completed, and at the end of the plain steps after waiting for the last one.
void plain_boundary_locked(State& s, int64_t t) {
  if (!s.plain_settled) {
    s.plain_settled = true;
    start_step_clock_locked(s);
    s.step_times.mark();
    return;
  }
  s.plain_ms.push_back((t - s.last_boundary_ns) / 1e6);
  s.step_times.end_step(&s.plain_ms, s.plain_ms.size() - 1);
  if (static_cast<int>(s.plain_ms.size()) >= s.plain_steps) {
    s.step_times.settle(true);
    observe_locked(s, Phase::kDone);
    write_part(s);
  } else {
    s.step_times.settle(false);
    s.step_times.mark();
  }
}

// A warm-up step ended: what was seen so far is forgotten. Every thread's totals keep counting
// (their threads add to them without a lock), so the warm-up is subtracted when the part is written.
void forget_warmup_locked(State& s) {
  for (auto& t : s.threads) {
    for (OpTotals& o : t->ops) {
      o.base_calls = o.calls.get();
      o.base_total_ticks = o.total_ticks.get();
      o.base_self_ticks = o.self_ticks.get();
      o.cuda = {};
    }
    while (t->calls_lock.test_and_set(std::memory_order_acquire)) {
    }
    t->calls.clear();
    t->calls_lock.clear(std::memory_order_release);
  }
  s.shapes.clear();
  s.join.reset(g_next_id.load());
  s.current_step = 0;
  s.step_gpu_ms.assign(1, 0.0);  // the warm-up's kernels drained just now are not step 1's
  s.step_intervals.assign(1, {});
  s.settled_steps = 0;
  s.step_first_id.assign(1, g_next_id.load());
}

// Under --sample, after a recorded step whose next one is not: the device drained, CUDA activity
// paused, and only step boundaries observed until the next recorded step.
void pause_locked(State& s) {
  s.recording = false;
  pause_gpu_locked(s);
  observe_locked(s, Phase::kUnsampled);
}

void resume_locked(State& s) {
  resume_gpu_locked(s);
  s.recording = true;
  observe_locked(s, Phase::kRecording);
}

void boundary_locked(State& s) {
  const int64_t t = now_ns();
  ++s.boundaries;
  if (s.phase == Phase::kPlain) {
    plain_boundary_locked(s, t);
    s.last_boundary_ns = t;
    return;
  }
  const bool recorded = s.phase == Phase::kRecording;  // the step that ended now was recorded in full
  if (recorded) attribute_locked(s, false);
  bool next_in_window = false;  // the next step is recorded or unsampled: timed from this boundary
  if (s.boundaries <= s.warmup) {
    forget_warmup_locked(s);
    next_in_window = s.boundaries == s.warmup;
  } else if (s.steps == 0 || s.window < s.steps) {
    // Its time: the host's interval, on a GPU the GPU's where longer (step_times.h).
    std::vector<double>& times = recorded ? s.step_ms : s.unsampled_ms;
    times.push_back((t - s.last_boundary_ns) / 1e6);
    s.step_times.end_step(&times, times.size() - 1);
    if (recorded) {
      ++s.recorded;
      forget_old_locked(s);
    }
    ++s.window;
    const bool last = s.steps != 0 && s.window == s.steps;
    const bool next_recorded = !last && s.window % s.sample == 0;
    next_in_window = !last;
    if (next_recorded) {  // the next step's GPU time and first op call
      if (!recorded) resume_locked(s);
      s.step_gpu_ms.push_back(0.0);
      s.step_intervals.emplace_back();
      s.step_first_id.push_back(g_next_id.load());
      s.current_step = static_cast<int>(s.step_ms.size());
    }
    // Rewritten at most once a second (and after the last step): a crash loses at most that much,
    // and short steps do not pay for file writes.
    if (last) {
      end_recording_locked(s);
    } else {
      if (recorded && !next_recorded) pause_locked(s);
      if (t - s.last_write_ns > 1'000'000'000) {
        write_part(s);
        s.last_write_ns = t;
      }
    }
  }
  s.step_times.settle(false);
  if (next_in_window) {
    start_step_clock_locked(s);
    s.step_times.mark();
  }
  // An unsampled step stands for a step without the profiler: its host clock starts once the
  // boundary's own work is done, as its events do. (A recorded step's holds it, as it is part of
  // what the profiler costs.)
  s.last_boundary_ns = s.phase == Phase::kUnsampled ? now_ns() : t;
}

// ---- The observer ------------------------------------------------------------------------------

// Per op: one TLS read, the name looked up by its pointer, two clock reads; a lock only for a
// thread's or a name's first record, a shape, a backward node's first link to its forward op, and
// the step boundary.
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (g_parts == Parts::kObserver || g_parts == Parts::kObserverFunctions) return nullptr;
  ThreadData* tp = thread_data();
  if (!tp) return nullptr;
  ThreadData& t = *tp;
  NameEntry* entry = lookup_name(t, fn.name());
  const NameInfo& info = *entry->info;
  Frame& f = t.stack.emplace_back();
  f.entry = entry;
  f.backward_node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION || (info.flags & kEngineRecord);
  if (f.backward_node) ++t.backward_depth;
  f.backward = t.backward_depth > 0;
  f.user_scope = fn.scope() == at::RecordScope::USER_SCOPE;
  State& s = state();
  if (s.recording.load(std::memory_order_relaxed)) {
    t.records.add(1);
    if (!fn.inputs().empty()) t.records_with_inputs.add(1);
    if (!(info.flags & kLabel)) f.op = op_totals(t, *entry, f.backward);
    if (info.tunable != Tunable::kNone) {
      std::optional<ShapeKey> shape;
      if (info.tunable == Tunable::kLstm) shape = lstm_shape(fn);
      else if (info.tunable == Tunable::kScope) shape = scope_shape(*info.name);
      else if (info.tunable == Tunable::kGemm) shape = gemm_shape(fn, *info.name, f.backward);
      else if (info.tunable == Tunable::kCopy) shape = host_copy_shape(fn, f.backward);
      else shape = layer_norm_shape(fn, info.tunable);  // hfnn's own ops: note_layer_norm
      if (shape) {
        f.shape = std::make_unique<ShapeKey>(std::move(*shape));
        keep_innermost(t, f);
      }
    }
    if ((info.flags & kBoxesInputs) || ((info.flags & kBoxesHostCopies) && called_from_python(t))) {
      f.inputs = true;
      begin_inputs(t);
    }
#if HFNN_GPU_ACTIVITY
    if (s.gpu) {
      f.id = g_next_id.fetch_add(1, std::memory_order_relaxed);
      f.parent = t.stack.size() > 1 ? t.stack[t.stack.size() - 2].id : 0;
      if (g_parts != Parts::kNoCorrelation) CuptiActivity::push(f.id);
    }
#endif
  }
  f.start = ticks();  // last: the op's time holds none of the above
  return nullptr;
}

// A backward node's first call finds the forward op that made it in the forward thread's table.
void link_forward(OpTotals& op, uint64_t forward_thread, int64_t seq) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const auto& t : s.threads) {
    if (t->torch_thread != forward_thread || !t->seq) continue;
    const SeqSlot& slot = t->seq[static_cast<uint64_t>(seq) & (kSeqSlots - 1)];
    if (slot.seq.load(std::memory_order_relaxed) == seq)
      op.forward_op.store(slot.name.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return;
  }
}

void remember_forward(ThreadData& t, int64_t seq, const std::string* name, int64_t start, int64_t end) {
  if (!t.seq) t.seq = std::make_unique<SeqSlot[]>(kSeqSlots);
  SeqSlot& slot = t.seq[static_cast<uint64_t>(seq) & (kSeqSlots - 1)];
  if (slot.seq.load(std::memory_order_relaxed) == seq && start > slot.start.load(std::memory_order_relaxed) &&
      start < slot.end.load(std::memory_order_relaxed))
    return;  // nested in the op already kept for this number
  slot.seq.store(seq, std::memory_order_relaxed);
  slot.name.store(name, std::memory_order_relaxed);
  slot.start.store(start, std::memory_order_relaxed);
  slot.end.store(end, std::memory_order_relaxed);
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (g_parts == Parts::kObserver || g_parts == Parts::kObserverFunctions) {
    if (fn.scope() == at::RecordScope::USER_SCOPE && std::string_view(fn.name()).rfind(kOptimizerStep, 0) == 0) {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mutex);
      if (!s.stopped && s.phase == Phase::kRecording) boundary_locked(s);
    }
    return;
  }
  const int64_t end = ticks();
  ThreadData* tp = t_data;
  if (!tp || tp->stack.empty()) return;
  ThreadData& t = *tp;
  Frame& f = t.stack.back();
#if HFNN_GPU_ACTIVITY
  if (f.id && g_parts != Parts::kNoCorrelation) CuptiActivity::pop(f.parent);
#endif
  if (f.inputs) end_inputs(t);
  if (f.backward_node && t.backward_depth > 0) --t.backward_depth;
  const int64_t total = end - f.start;
  if (t.stack.size() > 1) t.stack[t.stack.size() - 2].children += total;
  const NameInfo& info = *f.entry->info;
  State& s = state();
  if (s.recording.load(std::memory_order_relaxed)) {
    if (OpTotals* op = f.op) {
      op->calls.add(1);
      op->total_ticks.add(total);
      op->self_ticks.add(total - f.children);
      if (const int64_t seq = fn.seqNr(); seq >= 0) {
        if (f.backward_node) {
          if (!op->forward_op.load(std::memory_order_relaxed)) link_forward(*op, fn.forwardThreadId(), seq);
        } else if (fn.scope() == at::RecordScope::FUNCTION && !f.backward) {
          remember_forward(t, seq, info.name, f.start, end);
        }
      }
    }
    const GpuJoin::Call call{f.id, f.op ? &f.op->cuda : nullptr, nullptr, f.parent, s.current_step.load()};
    if (f.shape) {
      // Under the lock, with its call: a warm-up boundary forgets shapes and calls together.
      std::lock_guard<std::mutex> lock(s.mutex);
      ShapeTotals& shape = s.shapes[*f.shape];
      ++shape.calls;
      shape.total_ticks += total;
      if (f.id) {
        GpuJoin::Call with_shape = call;
        with_shape.shape = &shape.cuda;
        add_call(t, with_shape);
      }
    } else if (f.id) {
      add_call(t, call);
    }
  }
  const bool is_step = info.flags & kStepRecord;
  t.stack.pop_back();
  if (is_step) {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.stopped && s.phase == Phase::kRecording) boundary_locked(s);
  }
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
  s.sample = std::max(1, config.value("sample", 1));
  s.plain_steps = s.steps > 0 ? config.value("plain_steps", 0) : 0;  // --steps 0 records to the end
  const std::string dir = config.value("dir", "");
  if (!dir.empty()) {
    const std::string rank = s.meta.contains("rank") ? s.meta["rank"].dump() : "0";
    s.part_path = std::filesystem::path(dir) / ("part-" + rank + "-" + std::to_string(::getpid()) + ".json");
  }
  s.last_boundary_ns = now_ns();
  calibrate_ticks();
  s.cuda_device = !s.meta.value("gpu", nlohmann::json()).is_null();
#if HFNN_GPU_ACTIVITY
  g_parts = parts_from_env();
  s.meta["parts"] = parts_name(g_parts);
  const bool cupti = g_parts == Parts::kAll || g_parts == Parts::kNoCorrelation || g_parts == Parts::kKernelsOnly ||
                     g_parts == Parts::kAttached;
  if (s.cuda_device && !cupti) s.meta["cupti"] = std::string("off (HFNN_PROFILE_PARTS=") + parts_name(g_parts) + ")";
  if (s.cuda_device && cupti) {
    std::string why;
    Join join = Join::kExternalCorrelation;
    if (const char* j = std::getenv("HFNN_CUPTI_JOIN"); j && std::string_view(j) == "callbacks")
      join = Join::kCallbacks;
    if (g_parts == Parts::kKernelsOnly) join = Join::kNone;
    if (g_parts == Parts::kAttached) join = Join::kAttachedOnly;
    s.gpu = CuptiActivity::start(&why, join);
    s.meta["cupti"] = s.gpu ? "on" : why;
    if (s.gpu) s.meta["cupti_api"] = CuptiActivity::traced_apis();
    if (s.gpu) s.meta["cupti_join"] = CuptiActivity::join_name();
    if (!s.gpu)
      std::fprintf(stderr, "hfnn profile: CUDA activity is not available (%s: another CUPTI client such as "
                           "torch.profiler or Nsight may hold it); recording CPU times and shapes only\n", why.c_str());
  }
#endif
  s.step_gpu_ms.assign(1, 0.0);
  s.step_intervals.assign(1, {});
  s.step_first_id.assign(1, g_next_id.load());
  s.join.reset(g_next_id.load());
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
  return s.started && !s.stopped && (s.phase == Phase::kRecording || s.phase == Phase::kUnsampled);
}

void stop() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.recording = false;
  observe_locked(s, Phase::kDone);
  finish_gpu_locked(s, false);  // the last kernels finish (when the script ended while recording)
  settle_detach_locked(s);
  s.step_times.settle(true);  // the plain or unsampled steps still waiting for their GPU interval
  // step_gpu_ms has one slot past the last recorded step (the one in progress): drop it.
  if (s.step_gpu_ms.size() > s.step_ms.size()) s.step_gpu_ms.resize(s.step_ms.size());
  write_part(s);
}

std::string snapshot() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  attribute_locked(s, true);  // every CUDA record so far (the caller synchronises the device first)
  return part_json(s).dump();
}

void note_layer_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape, bool affine, bool backward) {
  if (!state().recording.load(std::memory_order_relaxed)) return;
  ThreadData* t = t_data;
  if (!t || t->stack.empty()) return;
  Frame& f = t->stack.back();
  if (!f.op || f.op->info->tunable != (backward ? Tunable::kLayerNormBwd : Tunable::kLayerNormFwd)) return;
  f.shape = std::make_unique<ShapeKey>(layer_norm_key(input, normalized_shape, affine, backward));
  keep_innermost(*t, f);
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
