// hfnn::layer_norm as torch ops. The only file that knows both torch and the LayerNorm kernels:
// it checks inputs, fills the parameter structs, picks a variant and falls back to torch's own
// kernel for whatever no variant supports.
//
//   hfnn::layer_norm_fwd  (out, mean, rstd), the contract of aten::native_layer_norm
//   hfnn::layer_norm_bwd  (dx, dgamma, dbeta), the contract of aten::native_layer_norm_backward
//   hfnn::layer_norm      the differentiable op that hfnn.nn.LayerNorm calls
//   hfnn::layer_norm_supports  whether a named variant can run a given input (for tests and the tuner)
//   HFNN_DISPATCH_DB: the tuned winners for every LayerNorm in the process, through kernels
//       registered over aten::native_layer_norm(_backward) on the CUDA and CPU keys when a table
//       loads (src/dispatch_op.cpp loads it, src/dispatch.h holds it)
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string_view>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ops/native_layer_norm_backward_native.h>
#include <ATen/ops/native_layer_norm_native.h>

#include <mutex>

#include "kernels/layer_norm/layer_norm.h"
#include "kernels/layer_norm/layer_norm_family.h"
#include "profiles/collector.h"
#include "src/dispatch.h"
#include "src/kernel_dtype.h"
#include "src/layer_norm_select.h"

#define HFNN_KERNELS (HFNN_WITH_CUDA && HFNN_TORCH_CUDA)
#if HFNN_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace hfnn::layer_norm {
namespace {

namespace k = kernels::layer_norm;
using at::Tensor;
using Triple = std::tuple<Tensor, Tensor, Tensor>;

// Rows and columns of the problem; the same checks (and words) as torch's layer_norm.
std::pair<int64_t, int64_t> rows_cols(const Tensor& input, at::IntArrayRef normalized_shape) {
  const auto ndim = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(ndim >= 1, "hfnn.layer_norm: normalized_shape must have at least one dimension, got ",
              normalized_shape);
  const auto sizes = input.sizes();
  const int64_t axis = input.dim() - ndim;
  TORCH_CHECK(axis >= 0 && sizes.slice(axis).equals(normalized_shape), "hfnn.layer_norm: given normalized_shape=",
              normalized_shape, ", expected input with shape [*, ",
              c10::Join(", ", normalized_shape), "], but got input of size ", sizes);
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= sizes[d];
  for (int64_t d = axis; d < input.dim(); ++d) cols *= sizes[d];
  return {rows, cols};
}

std::vector<int64_t> stat_shape(const Tensor& input, at::IntArrayRef normalized_shape) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  for (size_t i = shape.size() - normalized_shape.size(); i < shape.size(); ++i) shape[i] = 1;
  return shape;
}

// Why the kernels cannot take this problem, or an empty string when they can.
std::string unsupported_reason(const Tensor& input, const std::optional<Tensor>& weight,
                               const std::optional<Tensor>& bias, int64_t rows, int64_t cols) {
#if !HFNN_KERNELS
  return "this build of hfnn has no CUDA kernels";
#endif
  if (!input.is_cuda()) return "the input is not a CUDA tensor";
  if (!kernel_dtype(input.scalar_type())) return fmt::format("dtype {} is not float32, float16 or bfloat16", std::string(c10::toString(input.scalar_type())));
  if (rows == 0 || cols == 0) return "the input is empty";
  for (const auto* param : {&weight, &bias}) {
    if (!param->has_value() || !(*param)->defined()) continue;
    const Tensor& t = **param;
    if (t.scalar_type() != input.scalar_type()) return "weight or bias has a dtype other than the input's";
    if (t.device() != input.device()) return "weight or bias is on another device";
    if (!t.is_contiguous() || t.numel() != cols) return "weight or bias is not a contiguous tensor of normalized_shape";
  }
  return {};
}

const void* data_or_null(const std::optional<Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr() : nullptr;
}

#if HFNN_KERNELS
// A device guard that switches (and switches back) only when the tensor is not on the current
// device: the common case pays one cudaGetDevice, not a set and a reset per call. Guards nest on
// the HFNN_DISPATCH_DB path (our wrapper, then torch's kernel), so their cost adds up per call.
struct DeviceGuard {
  explicit DeviceGuard(const at::Tensor& t) {
    if (t.get_device() != c10::cuda::current_device()) guard.set_device(t.device());
  }
  c10::cuda::OptionalCUDAGuard guard;
};
#endif

// Torch's own kernels. Called directly, not through the dispatcher: with HFNN_DISPATCH_DB our
// kernels are the ones registered for aten::native_layer_norm, and they fall back to these.
Triple torch_fwd(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                 const std::optional<Tensor>& bias, double eps) {
#if HFNN_KERNELS
  if (input.is_cuda()) {
    const DeviceGuard guard(input);
    return at::native::layer_norm_cuda(input, normalized_shape, weight, bias, eps);
  }
#endif
  if (input.is_cpu()) return at::native::layer_norm_cpu(input, normalized_shape, weight, bias, eps);
  return at::native_layer_norm(input, normalized_shape, weight, bias, eps);
}

Triple torch_bwd(const Tensor& grad_out, const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& mean,
                 const Tensor& rstd, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                 std::array<bool, 3> output_mask) {
#if HFNN_KERNELS
  if (input.is_cuda()) {
    const DeviceGuard guard(input);
    return at::native::layer_norm_backward_cuda(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                                output_mask);
  }
#endif
  if (input.is_cpu())
    return at::native::layer_norm_backward_cpu(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
  return at::native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
}

// LayerNorm in the dispatch runtime: its family's index there (looked up once) and its passes'
// indices; the counters below are what stats_json reports under "layer_norm".
int family_index() {
  static const int family = dispatch::Runtime::get().family_index(k::kFamily.op);
  return family;
}
int pass_index(bool backward) { return backward ? k::kBwd : k::kFwd; }
void count_variant(bool backward, int index) {
  dispatch::Runtime::get().count_variant(family_index(), pass_index(backward), index);
}
void uncount_variant(bool backward, int index) {
  dispatch::Runtime::get().uncount_variant(family_index(), pass_index(backward), index);
}
void count_fallback(bool backward, dispatch::Fallback why) {
  dispatch::Runtime::get().count_fallback(family_index(), pass_index(backward), why);
}

// Who calls: hfnn's own op (hfnn.nn.LayerNorm, to_hfnn: a key the table does not know runs the
// built-in heuristic) or torch's native_layer_norm under HFNN_DISPATCH_DB (it runs the policy).
enum class Caller { kHfnn, kAten };

#if HFNN_KERNELS
template <typename Variant>
std::string known_names(std::span<const Variant> variants) {
  std::string out;
  for (const auto& v : variants) out += (out.empty() ? "" : ", ") + std::string(v.name);
  return out;
}

// The named variant, or the heuristic's choice when the name is empty. Null: nothing supports it.
template <typename Variant, typename Params, typename Find, typename Default>
const Variant* choose(std::string_view name, const Params& p, std::span<const Variant> all, Find find, Default fallback) {
  if (name.empty()) return fallback(p);
  const Variant* v = find(name);
  TORCH_CHECK(v, "hfnn.layer_norm: no variant named '", std::string(name), "'; known: ", known_names(all));
  TORCH_CHECK(v->supports(p), "hfnn.layer_norm: variant '", std::string(name), "' does not support rows=", p.rows,
              " cols=", p.cols, " dtype=", std::string(kernels::dtype_name(p.dtype)),
              " (alignment or size); see hfnn.layer_norm_variants()");
  return v;
}

// Clears the launch error `err` from the thread's last error if it is still the one there (a
// refused launch is not sticky), so it does not surface at the user's next check; anything else
// there is not ours to clear.
void clear_own_error(cudaError_t err) {
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
}

// A variant the caller named (tests, hfnn tune) that failed is the caller's error: it raises, and
// the tuner records the variant as failed for that key. A chosen one falls back (note_launch_failure).
void check_launch(cudaError_t err, std::string_view name, bool named) {
  if (!named) return;
  clear_own_error(err);
  TORCH_CHECK(false, "hfnn.layer_norm: variant ", std::string(name), " failed: ", cudaGetErrorString(err));
}

dispatch::Gpu device_gpu(int device) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device);
  return {props->name, fmt::format("{}.{}", props->major, props->minor), props->multiProcessorCount};
}

// The built-in choice's measurements for the device's GPU (null: this GPU was never swept, and the
// built-in choice is torch's kernel), looked up once per device.
const GpuDefaults* gpu_defaults(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<const GpuDefaults*>, kMaxDevices> found{};
  static std::array<std::atomic<bool>, kMaxDevices> resolved{};
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (resolved[device].load(std::memory_order_acquire)) return found[device].load(std::memory_order_relaxed);
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device);
  const GpuDefaults* g = Defaults::builtin().for_gpu(props->name, fmt::format("{}.{}", props->major, props->minor));
  found[device].store(g, std::memory_order_relaxed);
  resolved[device].store(true, std::memory_order_release);
  return g;
}

// HFNN_STRICT=1 in the environment (also without HFNN_DISPATCH_DB, where the runtime was never
// configured): a kernel that fails is an error, not a warning and torch's kernel.
bool strict_env() {
  static const bool strict = [] {
    const char* v = std::getenv("HFNN_STRICT");
    return v && std::string_view(v) == "1";
  }();
  return strict;
}

// HFNN_TEST_FAIL_LAUNCH=<variant>: that variant's launches fail as a refused launch would
// (cudaErrorLaunchOutOfResources), without running, so tests can exercise the fall-back below.
cudaError_t run_or_plant(std::string_view name, const std::function<cudaError_t()>& run) {
  static const std::string planted = [] {
    const char* v = std::getenv("HFNN_TEST_FAIL_LAUNCH");
    return std::string(v ? v : "");
  }();
  if (!planted.empty() && name == planted) return cudaErrorLaunchOutOfResources;
  return run();
}

// Problems whose chosen variant failed to launch: later calls like them go straight to torch's
// kernel instead of failing again (a refused launch costs a driver round trip and an error).
class FailedLaunches {
 public:
  bool contains(bool backward, const void* variant, int device, int64_t rows, int64_t cols, kernels::DType dtype) const {
    if (!any_.load(std::memory_order_acquire)) return false;  // the common case: no lock
    std::lock_guard<std::mutex> lock(mutex_);
    return std::find(keys_.begin(), keys_.end(), Key{backward, variant, device, rows, cols, dtype}) != keys_.end();
  }
  void add(bool backward, const void* variant, int device, int64_t rows, int64_t cols, kernels::DType dtype) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{backward, variant, device, rows, cols, dtype};
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(key);
    any_.store(true, std::memory_order_release);
  }
  static FailedLaunches& get() {
    static FailedLaunches failed;
    return failed;
  }

 private:
  using Key = std::tuple<bool, const void*, int, int64_t, int64_t, kernels::DType>;
  std::atomic<bool> any_{false};
  mutable std::mutex mutex_;
  std::vector<Key> keys_;
};

// A chosen variant whose launch failed (the device refused it, or memory ran out): the error is
// cleared, counted and warned about once per variant, the problem remembered (its later calls go
// straight to torch's kernel), and the call runs torch's kernel instead, so a kernel's failure
// never ends training. Under HFNN_STRICT=1 it is an error. `counted`: the choice was counted as
// the variant's call, and becomes a fall-back.
template <typename Variant, typename Params>
void note_launch_failure(bool backward, const Variant* v, std::span<const Variant> all, const Params& p,
                         cudaError_t err, bool counted) {
  clear_own_error(err);
  auto& rt = dispatch::Runtime::get();
  const std::string message =
      fmt::format("LayerNorm {} variant '{}' failed on rows={}, D={}, {} ({}); that call and any like it run "
                  "torch's kernel",
                  backward ? "backward" : "forward", v->name, p.rows, p.cols, kernels::dtype_name(p.dtype),
                  cudaGetErrorString(err));
  TORCH_CHECK(!strict_env(), "hfnn (HFNN_STRICT=1): ", message);
  FailedLaunches::get().add(backward, v, p.device.device, p.rows, p.cols, p.dtype);
  if (counted) uncount_variant(backward, static_cast<int>(v - all.data()));
  count_fallback(backward, dispatch::Fallback::kLaunchFailed);
  rt.warn_once(fmt::format("launch:{}:{}", backward ? "bwd" : "fwd", v->name), message);
}

// Whether the chosen variant already failed on a problem like this one (then torch's kernel runs,
// counted as a failed launch).
template <typename Variant, typename Params>
bool skip_failed(bool backward, const Variant* v, std::span<const Variant> all, const Params& p, bool counted) {
  if (!FailedLaunches::get().contains(backward, v, p.device.device, p.rows, p.cols, p.dtype)) return false;
  if (counted) uncount_variant(backward, static_cast<int>(v - all.data()));
  count_fallback(backward, dispatch::Fallback::kLaunchFailed);
  return true;
}

// The tuned table's pick for this problem (HFNN_DISPATCH_DB), else the built-in heuristic or torch.
// Returns the variant to run, or null for torch's kernel; counts what it chose.
template <typename Variant, typename Params, typename Default>
const Variant* table_choice(const Params& p, bool backward, int device, bool affine, Caller caller,
                            std::span<const Variant> all, Default heuristic) {
  auto& rt = dispatch::Runtime::get();
  const dispatch::WinnerMap* map = rt.for_device(family_index(), device, [&] { return device_gpu(device); });
  dispatch::Pick pick;
  if (map) {
    const auto it = map->find(k::pack(p.rows, p.cols, p.dtype, affine));
    if (it != map->end()) pick = it->second[pass_index(backward)];
  }
  if (pick.index == dispatch::Pick::kTorch) {
    count_fallback(backward, dispatch::Fallback::kTorchWon);
    return nullptr;
  }
  if (pick.index >= 0) {
    const Variant* v = static_cast<size_t>(pick.index) < all.size() ? &all[pick.index] : nullptr;
    if (v && v->supports(p)) {
      count_variant(backward, pick.index);
      return v;
    }
    count_fallback(backward, dispatch::Fallback::kVariantRefused);
    rt.warn_once(fmt::format("refused:{}", v ? v->name : "?"),
                 fmt::format("the tuned LayerNorm {} '{}' does not take an input (rows={}, D={}): alignment or "
                             "size; it runs torch's kernel there",
                             backward ? "backward" : "forward", v ? std::string(v->name) : "?", p.rows, p.cols));
    return nullptr;
  }
  // Not tuned: hfnn's modules keep hfnn's heuristic; torch's own calls follow the policy.
  if (caller == Caller::kHfnn || rt.policy() == dispatch::Policy::kHeuristic) {
    const Variant* v = heuristic(p);
    if (v) {
      count_variant(backward, static_cast<int>(v - all.data()));
      return v;
    }
    count_fallback(backward, dispatch::Fallback::kBuiltinTorch);
    return nullptr;
  }
  count_fallback(backward, map ? dispatch::Fallback::kNotTuned : dispatch::Fallback::kNoTable);
  return nullptr;
}
#endif

// An input the tuned kernels do not take under HFNN_DISPATCH_DB: counted, warned about once (an
// error with HFNN_STRICT=1), and run by torch.
void note_unsupported(bool backward, const std::string& reason, bool cpu) {
  auto& rt = dispatch::Runtime::get();
  if (!rt.active()) return;
  count_fallback(backward, cpu ? dispatch::Fallback::kCpuTensor : dispatch::Fallback::kUnsupported);
  rt.warn_once("unsupported:" + reason, "a LayerNorm input runs torch's kernel, not a tuned one: " + reason);
}

// A CPU tensor under HFNN_DISPATCH_DB: counted, and warned about once without building a message
// per call (CPU LayerNorms can be many and small).
void note_cpu(bool backward) {
  static std::atomic<bool> warned{false};
  auto& rt = dispatch::Runtime::get();
  if (rt.strict() || !warned.load(std::memory_order_relaxed)) {
    note_unsupported(backward, "the input is not a CUDA tensor", true);
    warned.store(true, std::memory_order_relaxed);
  } else {
    count_fallback(backward, dispatch::Fallback::kCpuTensor);
  }
}

Triple fwd_impl(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                const std::optional<Tensor>& bias, double eps, c10::string_view variant, Caller caller) {
  const auto [rows, cols] = rows_cols(input, normalized_shape);
  std::string reason = unsupported_reason(input, weight, bias, rows, cols);
  if (!reason.empty()) {
    TORCH_CHECK(variant.empty(), "hfnn.layer_norm: variant '", std::string(variant), "' cannot run: ", reason);
    note_unsupported(false, reason, !input.is_cuda());
    return torch_fwd(input, normalized_shape, weight, bias, eps);
  }
#if HFNN_KERNELS
  const DeviceGuard guard(input);
  const Tensor x = input.contiguous();
  // The variant is chosen before any output is allocated (x stands in for y: both come from
  // torch's allocator), so a call that runs torch's kernel pays for the choice and nothing more.
  k::FwdParams p;
  p.x = x.data_ptr();
  p.gamma = data_or_null(weight);
  p.beta = data_or_null(bias);
  p.y = x.data_ptr();
  p.rows = rows;
  p.cols = cols;
  p.eps = static_cast<float>(eps);
  p.dtype = *kernel_dtype(x.scalar_type());
  p.device = kernels::device_info(input.get_device());
  const bool affine = p.gamma != nullptr;
  const GpuDefaults* measured = gpu_defaults(input.get_device());
  const auto builtin = [measured](const k::FwdParams& q) { return default_fwd(q, measured); };
  const bool counted = variant.empty() && dispatch::Runtime::get().active();
  const k::FwdVariant* v =
      counted ? table_choice<k::FwdVariant>(p, false, input.get_device(), affine, caller, k::fwd_variants(), builtin)
              : choose<k::FwdVariant>(variant, p, k::fwd_variants(), k::find_fwd, builtin);
  if (v && variant.empty() && skip_failed(false, v, k::fwd_variants(), p, counted)) v = nullptr;
  if (!v) return torch_fwd(input, normalized_shape, weight, bias, eps);
  Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  Tensor mean = at::empty({rows}, x.options().dtype(at::kFloat));
  Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  p.y = y.data_ptr();
  p.mean = mean.data_ptr<float>();
  p.rstd = rstd.data_ptr<float>();
  if (const cudaError_t err = run_or_plant(v->name, [&] { return v->run(p, at::cuda::getCurrentCUDAStream()); });
      err != cudaSuccess) {
    check_launch(err, v->name, !variant.empty());
    note_launch_failure(false, v, k::fwd_variants(), p, err, counted);
    return torch_fwd(input, normalized_shape, weight, bias, eps);
  }
  const auto shape = stat_shape(input, normalized_shape);
  return {y, mean.view(shape), rstd.view(shape)};
#else
  return torch_fwd(input, normalized_shape, weight, bias, eps);
#endif
}

Triple bwd_impl(const Tensor& grad_out, const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& mean,
                const Tensor& rstd, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                std::array<bool, 3> output_mask, c10::string_view variant, Caller caller) {
  const auto [rows, cols] = rows_cols(input, normalized_shape);
  std::string reason = unsupported_reason(input, weight, bias, rows, cols);
  if (reason.empty() && (grad_out.scalar_type() != input.scalar_type() || !grad_out.sizes().equals(input.sizes())))
    reason = "grad_out differs from the input in dtype or shape";
  if (reason.empty() && (mean.scalar_type() != at::kFloat || rstd.scalar_type() != at::kFloat ||
                         mean.numel() != rows || rstd.numel() != rows))
    reason = "mean and rstd are not float32 with one value per row (not from a CUDA forward)";
  if (!reason.empty()) {
    TORCH_CHECK(variant.empty(), "hfnn.layer_norm: variant '", std::string(variant), "' cannot run: ", reason);
    note_unsupported(true, reason, !input.is_cuda());
    return torch_bwd(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
  }
#if HFNN_KERNELS
  const DeviceGuard guard(input);
  const Tensor x = input.contiguous();
  const Tensor dy = grad_out.contiguous();
  const Tensor mean_c = mean.contiguous(), rstd_c = rstd.contiguous();
  const bool has_weight = weight.has_value() && weight->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  // Chosen before the outputs exist, as in the forward: stand-ins from torch's allocator.
  k::BwdParams p;
  p.dy = dy.data_ptr();
  p.x = x.data_ptr();
  p.mean = mean_c.data_ptr<float>();
  p.rstd = rstd_c.data_ptr<float>();
  p.gamma = data_or_null(weight);
  p.dx = output_mask[0] ? x.data_ptr() : nullptr;
  p.dgamma = output_mask[1] && has_weight ? weight->data_ptr() : nullptr;
  p.dbeta = output_mask[2] && has_bias ? bias->data_ptr() : nullptr;
  p.rows = rows;
  p.cols = cols;
  p.dtype = *kernel_dtype(x.scalar_type());
  p.device = kernels::device_info(input.get_device());
  const bool affine = p.gamma != nullptr;
  const GpuDefaults* measured = gpu_defaults(input.get_device());
  const auto builtin = [measured](const k::BwdParams& q) { return default_bwd(q, measured); };
  const bool counted = variant.empty() && dispatch::Runtime::get().active();
  const k::BwdVariant* v =
      counted ? table_choice<k::BwdVariant>(p, true, input.get_device(), affine, caller, k::bwd_variants(), builtin)
              : choose<k::BwdVariant>(variant, p, k::bwd_variants(), k::find_bwd, builtin);
  if (v && variant.empty() && skip_failed(true, v, k::bwd_variants(), p, counted)) v = nullptr;
  if (!v) return torch_bwd(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
  Tensor dx = output_mask[0] ? at::empty_like(x, at::MemoryFormat::Contiguous) : Tensor();
  Tensor dgamma = output_mask[1] && has_weight ? at::empty_like(*weight) : Tensor();
  Tensor dbeta = output_mask[2] && has_bias ? at::empty_like(*bias) : Tensor();
  p.dx = dx.defined() ? dx.data_ptr() : nullptr;
  p.dgamma = dgamma.defined() ? dgamma.data_ptr() : nullptr;
  p.dbeta = dbeta.defined() ? dbeta.data_ptr() : nullptr;
  const std::size_t bytes = v->workspace_bytes(p);
  Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_size = bytes;
  }
  if (const cudaError_t err = run_or_plant(v->name, [&] { return v->run(p, at::cuda::getCurrentCUDAStream()); });
      err != cudaSuccess) {
    check_launch(err, v->name, !variant.empty());
    note_launch_failure(true, v, k::bwd_variants(), p, err, counted);
    return torch_bwd(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
  }
  return {dx, dgamma, dbeta};
#else
  return torch_bwd(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
#endif
}

Triple fwd_cuda(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                const std::optional<Tensor>& bias, double eps, c10::string_view variant) {
  return fwd_impl(input, normalized_shape, weight, bias, eps, variant, Caller::kHfnn);
}

Triple bwd_cuda(const Tensor& grad_out, const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& mean,
                const Tensor& rstd, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                std::array<bool, 3> output_mask, c10::string_view variant) {
  profiles::note_layer_norm(input, normalized_shape, weight && weight->defined(), true);  // hfnn profile's shape
  return bwd_impl(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask, variant, Caller::kHfnn);
}

// Registered over aten::native_layer_norm and aten::native_layer_norm_backward (CUDA and CPU keys)
// once HFNN_DISPATCH_DB is loaded: every LayerNorm in the process (nn.LayerNorm, F.layer_norm,
// anything that calls them) comes here, with autograd and autocast still torch's.
Triple aten_fwd(const Tensor& input, c10::SymIntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                const std::optional<Tensor>& bias, double eps) {
  if (input.is_cpu()) {
    note_cpu(false);
    return at::native::layer_norm_cpu(input, C10_AS_INTARRAYREF_SLOW(normalized_shape), weight, bias, eps);
  }
  return fwd_impl(input, C10_AS_INTARRAYREF_SLOW(normalized_shape), weight, bias, eps, "", Caller::kAten);
}

Triple aten_bwd(const Tensor& grad_out, const Tensor& input, c10::SymIntArrayRef normalized_shape, const Tensor& mean,
                const Tensor& rstd, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                std::array<bool, 3> output_mask) {
  if (input.is_cpu()) {
    note_cpu(true);
    return at::native::layer_norm_backward_cpu(grad_out, input, C10_AS_INTARRAYREF_SLOW(normalized_shape), mean, rstd,
                                               weight, bias, output_mask);
  }
  return bwd_impl(grad_out, input, C10_AS_INTARRAYREF_SLOW(normalized_shape), mean, rstd, weight, bias, output_mask, "",
                  Caller::kAten);
}

// CPU tensors: torch's kernels, always.
Triple fwd_cpu(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
               const std::optional<Tensor>& bias, double eps, c10::string_view variant) {
  TORCH_CHECK(variant.empty(), "hfnn.layer_norm: variant '", std::string(variant),
              "' cannot run: the input is not a CUDA tensor");
  return torch_fwd(input, normalized_shape, weight, bias, eps);
}

Triple bwd_cpu(const Tensor& grad_out, const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& mean,
               const Tensor& rstd, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
               std::array<bool, 3> output_mask, c10::string_view variant) {
  profiles::note_layer_norm(input, normalized_shape, weight && weight->defined(), true);  // hfnn profile's shape
  TORCH_CHECK(variant.empty(), "hfnn.layer_norm: variant '", std::string(variant),
              "' cannot run: the input is not a CUDA tensor");
  return torch_bwd(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
}

// Shapes only, for FakeTensor / torch.compile tracing. Statistics are float32 for reduced-precision
// inputs, as on CUDA.
Triple fwd_meta(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                const std::optional<Tensor>& bias, double eps, c10::string_view variant) {
  rows_cols(input, normalized_shape);
  const auto stat_dtype = at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true);
  const auto shape = stat_shape(input, normalized_shape);
  return {at::empty_like(input, at::MemoryFormat::Contiguous), at::empty(shape, input.options().dtype(stat_dtype)),
          at::empty(shape, input.options().dtype(stat_dtype))};
}

Triple bwd_meta(const Tensor& grad_out, const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& mean,
                const Tensor& rstd, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                std::array<bool, 3> output_mask, c10::string_view variant) {
  rows_cols(input, normalized_shape);
  return {output_mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : Tensor(),
          output_mask[1] && weight.has_value() && weight->defined() ? at::empty_like(*weight) : Tensor(),
          output_mask[2] && bias.has_value() && bias->defined() ? at::empty_like(*bias) : Tensor()};
}

const c10::TypedOperatorHandle<Triple(const Tensor&, at::IntArrayRef, const std::optional<Tensor>&,
                                      const std::optional<Tensor>&, double, c10::string_view)>&
fwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("hfnn::layer_norm_fwd", "")
                             .typed<Triple(const Tensor&, at::IntArrayRef, const std::optional<Tensor>&,
                                           const std::optional<Tensor>&, double, c10::string_view)>();
  return op;
}

const c10::TypedOperatorHandle<Triple(const Tensor&, const Tensor&, at::IntArrayRef, const Tensor&, const Tensor&,
                                      const std::optional<Tensor>&, const std::optional<Tensor>&,
                                      std::array<bool, 3>, c10::string_view)>&
bwd_op() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("hfnn::layer_norm_bwd", "")
          .typed<Triple(const Tensor&, const Tensor&, at::IntArrayRef, const Tensor&, const Tensor&,
                        const std::optional<Tensor>&, const std::optional<Tensor>&, std::array<bool, 3>,
                        c10::string_view)>();
  return op;
}

// Autograd sees only the tensor arguments that are present: needs_input_grad(0) is the input, then
// weight if given, then bias if given.
class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& input, at::IntArrayRef normalized_shape,
                        const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = fwd_op().call(input, normalized_shape, weight, bias, eps, "");
    ctx->save_for_backward({input, mean, rstd, weight.value_or(Tensor()), bias.value_or(Tensor())});
    ctx->saved_data["normalized_shape"] = normalized_shape.vec();
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto normalized_shape = ctx->saved_data["normalized_shape"].toIntVector();
    const bool has_weight = saved[3].defined(), has_bias = saved[4].defined();
    const std::optional<Tensor> weight = has_weight ? std::optional<Tensor>(saved[3]) : std::nullopt;
    const std::optional<Tensor> bias = has_bias ? std::optional<Tensor>(saved[4]) : std::nullopt;
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), has_weight && ctx->needs_input_grad(1),
                                      has_bias && ctx->needs_input_grad(has_weight ? 2 : 1)};
    auto [dx, dgamma, dbeta] =
        bwd_op().call(grads[0], saved[0], normalized_shape, saved[1], saved[2], weight, bias, mask, "");
    return {dx, Tensor(), dgamma, dbeta, Tensor()};
  }
};

Tensor layer_norm_autograd(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                           const std::optional<Tensor>& bias, double eps) {
  profiles::note_layer_norm(input, normalized_shape, weight && weight->defined(), false);  // hfnn profile's shape
  return LayerNormFunction::apply(input, normalized_shape, weight, bias, eps);
}

const c10::TypedOperatorHandle<Tensor(const Tensor&, at::IntArrayRef, const std::optional<Tensor>&,
                                      const std::optional<Tensor>&, double)>&
layer_norm_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("hfnn::layer_norm", "")
                             .typed<Tensor(const Tensor&, at::IntArrayRef, const std::optional<Tensor>&,
                                           const std::optional<Tensor>&, double)>();
  return op;
}

// Under CUDA autocast torch runs layer_norm in float32 (its policy lists it as fp32): so do we,
// casting exactly as torch's own autocast kernel does, then running our kernels in float32. (CPU
// autocast leaves layer_norm alone, and so does our op: it falls through to torch's CPU kernel.)
template <c10::DispatchKey kKey, c10::DeviceType kDevice>
Tensor layer_norm_autocast(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                           const std::optional<Tensor>& bias, double eps) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  return layer_norm_op().call(at::autocast::cached_cast(at::kFloat, input, kDevice), normalized_shape,
                              at::autocast::cached_cast(at::kFloat, weight, kDevice),
                              at::autocast::cached_cast(at::kFloat, bias, kDevice), eps);
}

// Below autograd (inference mode, no_grad inside a traced graph): the forward alone.
Tensor layer_norm_plain(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                        const std::optional<Tensor>& bias, double eps) {
  profiles::note_layer_norm(input, normalized_shape, weight && weight->defined(), false);  // hfnn profile's shape
  return std::get<0>(fwd_op().call(input, normalized_shape, weight, bias, eps, ""));
}

#if HFNN_KERNELS
// Parameters for asking variants about an input before any output exists: x stands in for every
// output (all come from torch's allocator, >= 256-byte aligned, as x's contiguous copy does).
k::FwdParams fwd_stand_in(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                          int64_t rows, int64_t cols) {
  k::FwdParams p;
  p.x = p.y = x.data_ptr();
  p.gamma = data_or_null(weight);
  p.beta = data_or_null(bias);
  p.rows = rows;
  p.cols = cols;
  p.dtype = *kernel_dtype(x.scalar_type());
  p.device = kernels::device_info(x.get_device());
  return p;
}

k::BwdParams bwd_stand_in(const Tensor& x, const std::optional<Tensor>& weight, int64_t rows, int64_t cols) {
  k::BwdParams p;
  p.x = p.dy = p.dx = x.data_ptr();
  p.gamma = data_or_null(weight);
  p.rows = rows;
  p.cols = cols;
  p.dtype = *kernel_dtype(x.scalar_type());
  p.device = kernels::device_info(x.get_device());
  return p;
}
#endif

bool supports(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
              const std::optional<Tensor>& bias, c10::string_view variant) {
  const auto [rows, cols] = rows_cols(input, normalized_shape);
  if (!unsupported_reason(input, weight, bias, rows, cols).empty()) return false;
#if HFNN_KERNELS
  const DeviceGuard guard(input);  // the kernels' limits are queried on the current device
  const Tensor x = input.contiguous();
  if (const auto* v = k::find_fwd(variant)) return v->supports(fwd_stand_in(x, weight, bias, rows, cols));
  if (const auto* v = k::find_bwd(variant)) return v->supports(bwd_stand_in(x, weight, rows, cols));
  TORCH_CHECK(false, "hfnn.layer_norm: no variant named '", std::string(variant), "'; known: ",
              known_names(k::fwd_variants()), ", ", known_names(k::bwd_variants()));
#endif
  return false;
}

// The built-in choice for this input (no tuned table): a variant's name, or "torch".
std::string default_choice(const Tensor& input, at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                           const std::optional<Tensor>& bias, bool backward) {
  const auto [rows, cols] = rows_cols(input, normalized_shape);
  if (!unsupported_reason(input, weight, bias, rows, cols).empty()) return "torch";
#if HFNN_KERNELS
  const DeviceGuard guard(input);
  const Tensor x = input.contiguous();
  const GpuDefaults* measured = gpu_defaults(x.get_device());
  if (!backward) {
    const auto* v = default_fwd(fwd_stand_in(x, weight, bias, rows, cols), measured);
    return v ? std::string(v->name) : "torch";
  }
  const auto* v = default_bwd(bwd_stand_in(x, weight, rows, cols), measured);
  return v ? std::string(v->name) : "torch";
#else
  return "torch";
#endif
}

// Puts our kernels over torch's for aten::native_layer_norm and its backward, CUDA and CPU, once.
// torch warns when a kernel replaces another; that one warning is expected here, so it is kept quiet.
void register_over_aten() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct Quiet : c10::WarningHandler {
      void process(const c10::Warning&) override {}
    } quiet;
    const c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    // Without hfnn's CUDA kernels (a build without nvcc) torch keeps its CUDA kernel untouched: our
    // fall-back would have no direct way to it and would come back here through the dispatcher.
#if HFNN_KERNELS
    const auto keys = {c10::DispatchKey::CUDA, c10::DispatchKey::CPU};
#else
    const auto keys = {c10::DispatchKey::CPU};
#endif
    for (const auto key : keys) {
      auto* lib = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);  // lives forever
      lib->impl("native_layer_norm", TORCH_FN(aten_fwd));
      lib->impl("native_layer_norm_backward", TORCH_FN(aten_bwd));
    }
  });
}

// Under HFNN_DISPATCH_DB every LayerNorm in the process comes here: loading the table
// (src/dispatch_op.cpp) runs this file's router.
[[maybe_unused]] const bool kRouted = (dispatch::add_router(&register_over_aten), true);

}  // namespace
}  // namespace hfnn::layer_norm

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor");
  m.def("layer_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str variant='') -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask, str variant='') -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_supports(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, str variant) -> bool");
  m.impl("layer_norm_supports", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(hfnn::layer_norm::supports));
  m.def("layer_norm_default(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, bool backward) -> str");
  m.impl("layer_norm_default", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(hfnn::layer_norm::default_choice));
}

TORCH_LIBRARY_IMPL(hfnn, CUDA, m) {
  m.impl("layer_norm_fwd", TORCH_FN(hfnn::layer_norm::fwd_cuda));
  m.impl("layer_norm_bwd", TORCH_FN(hfnn::layer_norm::bwd_cuda));
}

TORCH_LIBRARY_IMPL(hfnn, CPU, m) {
  m.impl("layer_norm_fwd", TORCH_FN(hfnn::layer_norm::fwd_cpu));
  m.impl("layer_norm_bwd", TORCH_FN(hfnn::layer_norm::bwd_cpu));
}

TORCH_LIBRARY_IMPL(hfnn, Meta, m) {
  m.impl("layer_norm_fwd", TORCH_FN(hfnn::layer_norm::fwd_meta));
  m.impl("layer_norm_bwd", TORCH_FN(hfnn::layer_norm::bwd_meta));
}

TORCH_LIBRARY_IMPL(hfnn, Autograd, m) { m.impl("layer_norm", TORCH_FN(hfnn::layer_norm::layer_norm_autograd)); }

TORCH_LIBRARY_IMPL(hfnn, AutocastCUDA, m) {
  m.impl("layer_norm", TORCH_FN((hfnn::layer_norm::layer_norm_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>)));
}

TORCH_LIBRARY_IMPL(hfnn, CompositeExplicitAutograd, m) {
  m.impl("layer_norm", TORCH_FN(hfnn::layer_norm::layer_norm_plain));
}
