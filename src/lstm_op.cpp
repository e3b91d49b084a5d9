// hfnn::lstm_* as torch ops: one LSTM layer in one direction (kernels/lstm/lstm.h), time-major.
// The only file that knows both torch and the LSTM kernels: it checks inputs, fills the parameter
// structs, allocates the outputs and workspaces, and runs a named variant. The Python side
// (python/hfnn) composes layers and directions and wraps forward and backward in one
// autograd.Function; this file registers no autograd.
//
//   hfnn::lstm_layer_fwd  (y, h_n, c_n, workspace): workspace is float32, opaque, for the backward
//   hfnn::lstm_layer_bwd  (dx, dw_ih, dw_hh, db, dh0, dc0): db is the gradient of b_ih and of b_hh
//   hfnn::lstm_supports   whether a variant ('' : any) runs a layer of x's and w_hh's sizes
//   hfnn::lstm_variants   the variants of this build, in the family's (and the table's) order
//   hfnn::lstm_choose     the HFNN_DISPATCH_DB table's winner for a key: a variant, "torch", or ""
//
// Variant '' is `persistent` where it takes the shape, else `steps`.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/lstm/lstm.h"
#include "kernels/lstm/lstm_family.h"
#include "src/dispatch.h"
#include "src/kernel_dtype.h"

#define HFNN_KERNELS (HFNN_WITH_CUDA && HFNN_TORCH_CUDA)
#if HFNN_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace hfnn::lstm_op {
namespace {

namespace k = kernels::lstm;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

bool given(const OptTensor& t) { return t.has_value() && t->defined(); }
const void* ptr_or_null(const OptTensor& t) { return given(t) ? t->data_ptr() : nullptr; }

std::string sizes_text(const Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

// `t` is a contiguous tensor of `like`'s device and dtype with these sizes. `op`, `name`: for the message.
void check_arg(const char* op, const char* name, const Tensor& t, const Tensor& like, at::IntArrayRef sizes) {
  TORCH_CHECK(t.device() == like.device(), "hfnn.", op, ": ", name, " is on ", t.device(), ", x on ", like.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "hfnn.", op, ": ", name, " is ", t.scalar_type(), ", x is ",
              like.scalar_type(), " (every tensor of a layer has one dtype)");
  TORCH_CHECK(t.sizes() == sizes, "hfnn.", op, ": ", name, " has sizes ", sizes_text(t), ", expected ", sizes);
  TORCH_CHECK(t.is_contiguous(), "hfnn.", op, ": ", name, " must be contiguous (call .contiguous())");
}

// x [T, B, I] and w_hh [4H, H]: a CUDA tensor of a kernel dtype, the sizes the layer has.
struct Sizes {
  int64_t T, B, I, H;
};
Sizes check_layer(const char* op, const Tensor& x, const Tensor& w_ih, const Tensor& w_hh) {
  TORCH_CHECK(x.is_cuda(), "hfnn.", op, ": x must be a CUDA tensor (CPU tensors run torch's nn.LSTM)");
  TORCH_CHECK(kernel_dtype(x.scalar_type()), "hfnn.", op, ": dtype ", x.scalar_type(),
              " is not float32, float16 or bfloat16");
  TORCH_CHECK(x.dim() == 3, "hfnn.", op, ": x must be 3-D [steps, batch, input] (time-major), got ", sizes_text(x));
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(0) == 4 * w_hh.size(1), "hfnn.", op, ": w_hh must be [4 hidden, hidden], got ",
              sizes_text(w_hh));
  const Sizes s{x.size(0), x.size(1), x.size(2), w_hh.size(1)};
  check_arg(op, "x", x, x, {s.T, s.B, s.I});
  check_arg(op, "w_ih", w_ih, x, {4 * s.H, s.I});
  check_arg(op, "w_hh", w_hh, x, {4 * s.H, s.H});
  return s;
}

void check_optional(const char* op, const char* name, const OptTensor& t, const Tensor& x, at::IntArrayRef sizes) {
  if (given(t)) check_arg(op, name, *t, x, sizes);
}

std::vector<std::string> variant_names() {
  std::vector<std::string> out;
#if HFNN_KERNELS
  for (const k::Variant& v : k::variants()) out.emplace_back(v.name);
#endif
  return out;
}

#if HFNN_KERNELS
k::Shape shape_of(const Sizes& s, const Tensor& x) {
  k::Shape shape;
  shape.steps = s.T, shape.batch = s.B, shape.input = s.I, shape.hidden = s.H;
  shape.dtype = *kernel_dtype(x.scalar_type());
  shape.device = kernels::device_info(x.get_device());
  return shape;
}

std::string shape_text(const k::Shape& s) {
  return fmt::format("steps={} batch={} input={} hidden={} dtype={}", s.steps, s.batch, s.input, s.hidden,
                     kernels::dtype_name(s.dtype));
}

// The named variant; '' is persistent where it takes the shape, else steps. Errors name the variant
// and the shape.
const k::Variant& choose(const char* op, std::string_view name, const k::Shape& s) {
  if (name.empty()) {
    for (const std::string_view pick : {"persistent", "steps"})
      if (const k::Variant* v = k::find(pick); v && v->supports(s)) return *v;
    TORCH_CHECK(false, "hfnn.", op, ": no LSTM variant takes ", shape_text(s), " (hfnn.lstm_supports says which do)");
  }
  const k::Variant* v = k::find(name);
  TORCH_CHECK(v, "hfnn.", op, ": no LSTM variant named '", std::string(name), "'; known: ",
              fmt::format("{}", fmt::join(variant_names(), ", ")));
  TORCH_CHECK(v->supports(s), "hfnn.", op, ": LSTM variant '", std::string(name), "' does not take ", shape_text(s),
              " on this GPU (hfnn.lstm_supports says which do)");
  return *v;
}

// The GEMMs' cuBLASLt handle and workspace: torch's, on the current stream. cuBLASLt splits k (the
// weight gradients' sum over all steps and the batch) only with room for the partial products:
// where torch's Lt workspace is smaller than 32 MiB a block from the caching allocator, as the
// attention op does (src/multi_head_attention_op.cpp measured 2.5x on a dW without it).
constexpr std::size_t kLtWorkspace = std::size_t{32} << 20;
k::GemmContext gemm_context(const Tensor& like, Tensor& keep) {
  k::GemmContext g;
  g.handle = at::cuda::getCurrentCUDABlasLtHandle();
  g.workspace = at::cuda::getCUDABlasLtWorkspace();
  g.workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  if (g.workspace_size < kLtWorkspace) {
    keep = at::empty({static_cast<int64_t>(kLtWorkspace)}, like.options().dtype(at::kByte));
    g.workspace = keep.data_ptr(), g.workspace_size = kLtWorkspace;
  }
  // TF32 where torch's own nn.LSTM would use it: cuDNN's RNN takes TF32 in float32 under
  // torch.backends.cudnn.rnn.fp32_precision ("tf32", torch's default; the older
  // torch.backends.cudnn.allow_tf32 sets it too), not under the matmul setting. So hfnn's float32
  // LSTM keeps the precision contract of the op it replaces. The recurrence stays float32 FMA.
  g.tf32 = at::globalContext().allowTF32CuDNN(at::Float32Op::RNN);
  return g;
}

void check_launch(const char* op, cudaError_t err, std::string_view name) {
  if (err == cudaSuccess) return;
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();  // a refused launch is not sticky: not the user's next error
  const std::string gemm = err == cudaErrorUnknown ? k::last_gemm_error() : "";
  TORCH_CHECK(false, "hfnn.", op, ": LSTM variant ", std::string(name), " failed: ", cudaGetErrorString(err),
              gemm.empty() ? "" : " (", gemm, gemm.empty() ? "" : ")");
}

// A float32 tensor of at least `bytes` bytes.
Tensor float_buffer(std::size_t bytes, const Tensor& like) {
  return at::empty({static_cast<int64_t>((bytes + 3) / 4)}, like.options().dtype(at::kFloat));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fwd_cuda(const Tensor& x, const Tensor& w_ih, const Tensor& w_hh,
                                                    const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& h0,
                                                    const OptTensor& c0, bool reverse, c10::string_view variant) {
  constexpr const char* op = "lstm_layer_fwd";
  const Sizes n = check_layer(op, x, w_ih, w_hh);
  check_optional(op, "b_ih", b_ih, x, {4 * n.H});
  check_optional(op, "b_hh", b_hh, x, {4 * n.H});
  check_optional(op, "h0", h0, x, {n.B, n.H});
  check_optional(op, "c0", c0, x, {n.B, n.H});
  const c10::cuda::CUDAGuard guard(x.device());
  const k::Shape shape = shape_of(n, x);
  const k::Variant& v = choose(op, std::string_view(variant.data(), variant.size()), shape);
  Tensor y = at::empty({n.T, n.B, n.H}, x.options());
  Tensor h_n = at::empty({n.B, n.H}, x.options()), c_n = at::empty({n.B, n.H}, x.options());
  Tensor workspace = float_buffer(v.fwd_workspace_bytes(shape), x);
  Tensor lt;
  k::FwdParams p;
  p.shape = shape;
  p.x = x.data_ptr(), p.w_ih = w_ih.data_ptr(), p.w_hh = w_hh.data_ptr();
  p.b_ih = ptr_or_null(b_ih), p.b_hh = ptr_or_null(b_hh), p.h0 = ptr_or_null(h0), p.c0 = ptr_or_null(c0);
  p.y = y.data_ptr(), p.h_n = h_n.data_ptr(), p.c_n = c_n.data_ptr();
  p.reverse = reverse;
  p.workspace = workspace.data_ptr();
  p.gemm = gemm_context(x, lt);
  check_launch(op, v.forward(p, at::cuda::getCurrentCUDAStream()), v.name);
  return {y, h_n, c_n, workspace};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> bwd_cuda(
    const Tensor& dy, const OptTensor& dh_n, const OptTensor& dc_n, const Tensor& x, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& h0, const OptTensor& c0, const Tensor& workspace, bool reverse,
    c10::string_view variant) {
  constexpr const char* op = "lstm_layer_bwd";
  const Sizes n = check_layer(op, x, w_ih, w_hh);
  check_arg(op, "dy", dy, x, {n.T, n.B, n.H});
  check_optional(op, "dh_n", dh_n, x, {n.B, n.H});
  check_optional(op, "dc_n", dc_n, x, {n.B, n.H});
  check_optional(op, "h0", h0, x, {n.B, n.H});  // the forward saved the h it read; h0 only checked
  check_optional(op, "c0", c0, x, {n.B, n.H});
  const c10::cuda::CUDAGuard guard(x.device());
  const k::Shape shape = shape_of(n, x);
  const k::Variant& v = choose(op, std::string_view(variant.data(), variant.size()), shape);
  const std::size_t ws_bytes = v.fwd_workspace_bytes(shape);
  TORCH_CHECK(workspace.device() == x.device() && workspace.scalar_type() == at::kFloat && workspace.is_contiguous() &&
                  static_cast<std::size_t>(workspace.numel()) * 4 >= ws_bytes,
              "hfnn.", op, ": workspace is not the one lstm_layer_fwd returned for this layer with variant ", v.name,
              " (float32, ", ws_bytes, " bytes on ", x.device(), ")");
  Tensor dx = at::empty_like(x), dw_ih = at::empty_like(w_ih), dw_hh = at::empty_like(w_hh);
  Tensor db = at::empty({4 * n.H}, x.options());
  Tensor dh0 = at::empty({n.B, n.H}, x.options()), dc0 = at::empty({n.B, n.H}, x.options());
  Tensor scratch = float_buffer(v.bwd_scratch_bytes(shape), x);
  Tensor lt;
  k::BwdParams p;
  p.shape = shape;
  p.dy = dy.data_ptr(), p.dh_n = ptr_or_null(dh_n), p.dc_n = ptr_or_null(dc_n);
  p.x = x.data_ptr(), p.w_ih = w_ih.data_ptr(), p.w_hh = w_hh.data_ptr(), p.c0 = ptr_or_null(c0);
  p.workspace = workspace.data_ptr(), p.scratch = scratch.data_ptr();
  p.dx = dx.data_ptr(), p.dw_ih = dw_ih.data_ptr(), p.dw_hh = dw_hh.data_ptr(), p.db = db.data_ptr();
  p.dh0 = dh0.data_ptr(), p.dc0 = dc0.data_ptr();
  p.reverse = reverse;
  p.gemm = gemm_context(x, lt);
  check_launch(op, v.backward(p, at::cuda::getCurrentCUDAStream()), v.name);
  return {dx, dw_ih, dw_hh, db, dh0, dc0};
}

dispatch::Gpu device_gpu(int device) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device);
  return {props->name, fmt::format("{}.{}", props->major, props->minor), props->multiProcessorCount};
}
#endif

// CPU tensors: the op's own message, not the dispatcher's (CPU LSTMs run torch's nn.LSTM).
std::tuple<Tensor, Tensor, Tensor, Tensor> fwd_cpu(const Tensor& x, const Tensor&, const Tensor&, const OptTensor&,
                                                   const OptTensor&, const OptTensor&, const OptTensor&, bool,
                                                   c10::string_view) {
  TORCH_CHECK(false, "hfnn.lstm_layer_fwd: x must be a CUDA tensor, got one on ", x.device(),
              " (CPU tensors run torch's nn.LSTM)");
}
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> bwd_cpu(const Tensor&, const OptTensor&, const OptTensor&,
                                                                   const Tensor& x, const Tensor&, const Tensor&,
                                                                   const OptTensor&, const OptTensor&, const Tensor&,
                                                                   bool, c10::string_view) {
  TORCH_CHECK(false, "hfnn.lstm_layer_bwd: x must be a CUDA tensor, got one on ", x.device(),
              " (CPU tensors run torch's nn.LSTM)");
}

// Meta: the outputs' shapes (torch.compile traces through them); the workspace as the kernels size it.
std::tuple<Tensor, Tensor, Tensor, Tensor> fwd_meta(const Tensor& x, const Tensor& w_ih, const Tensor& w_hh,
                                                    const OptTensor&, const OptTensor&, const OptTensor&,
                                                    const OptTensor&, bool, c10::string_view variant) {
  TORCH_CHECK(x.dim() == 3 && w_hh.dim() == 2 && kernel_dtype(x.scalar_type()),
              "hfnn.lstm_layer_fwd: x must be 3-D and w_hh 2-D, float32, float16 or bfloat16");
  (void)w_ih;
  const int64_t T = x.size(0), B = x.size(1), H = w_hh.size(1);
  k::Shape s;
  s.steps = T, s.batch = B, s.input = x.size(2), s.hidden = H, s.dtype = *kernel_dtype(x.scalar_type());
  std::size_t ws_bytes = k::fwd_workspace_bytes(s);  // hfnn's kernels' (the variant '' picks one of them)
#if HFNN_KERNELS
  // A named variant with a workspace of its own (cuDNN's) sizes it on the device the call will run on.
  if (const k::Variant* v = k::find(std::string_view(variant.data(), variant.size()))) {
    s.device = kernels::device_info(c10::cuda::current_device());
    ws_bytes = v->fwd_workspace_bytes(s);
  }
#else
  (void)variant;
#endif
  const auto bytes = static_cast<int64_t>((ws_bytes + 3) / 4);
  return {at::empty({T, B, H}, x.options()), at::empty({B, H}, x.options()), at::empty({B, H}, x.options()),
          at::empty({bytes}, x.options().dtype(at::kFloat))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> bwd_meta(const Tensor&, const OptTensor&, const OptTensor&,
                                                                    const Tensor& x, const Tensor& w_ih,
                                                                    const Tensor& w_hh, const OptTensor&,
                                                                    const OptTensor&, const Tensor&, bool,
                                                                    c10::string_view) {
  const int64_t B = x.size(1), H = w_hh.size(1);
  return {at::empty_like(x), at::empty_like(w_ih), at::empty_like(w_hh), at::empty({4 * H}, x.options()),
          at::empty({B, H}, x.options()), at::empty({B, H}, x.options())};
}

bool supports(const Tensor& x, const Tensor& w_hh, c10::string_view variant) {
#if HFNN_KERNELS
  if (!x.is_cuda() || !kernel_dtype(x.scalar_type()) || x.dim() != 3 || w_hh.dim() != 2 ||
      w_hh.size(0) != 4 * w_hh.size(1))
    return false;
  const c10::cuda::CUDAGuard guard(x.device());  // a variant may ask its device (cuDNN's: a probe run)
  const k::Shape s = shape_of({x.size(0), x.size(1), x.size(2), w_hh.size(1)}, x);
  const std::string_view name(variant.data(), variant.size());
  if (name.empty()) {
    for (const k::Variant& v : k::variants())
      if (v.supports(s)) return true;
    return false;
  }
  const k::Variant* v = k::find(name);
  return v && v->supports(s);
#else
  (void)x, (void)w_hh, (void)variant;
  return false;
#endif
}

std::vector<std::string> variants() { return variant_names(); }

// The HFNN_DISPATCH_DB table's winner for a key on the current CUDA device: a variant's name,
// "torch" where torch won, "" where the key is not tuned or no table is loaded. Counts nothing (the
// caller reports what ran).
std::string choose_winner(int64_t input, int64_t hidden, int64_t layers, int64_t batch, int64_t steps,
                          at::ScalarType dtype, bool bidirectional, bool batch_first, bool bias, bool dropout) {
#if HFNN_KERNELS
  const auto kd = kernel_dtype(dtype);
  if (!kd) return "";
  auto& rt = dispatch::Runtime::get();
  if (!rt.active()) return "";
  static const int family = rt.family_index(k::kFamily.op);
  const int device = c10::cuda::current_device();
  const dispatch::WinnerMap* map = rt.for_device(family, device, [&] { return device_gpu(device); });
  if (!map) return "";
  const auto it =
      map->find(k::pack(input, hidden, layers, batch, steps, *kd, bidirectional, batch_first, bias, dropout));
  if (it == map->end()) return "";
  const dispatch::Pick pick = it->second[k::kTrain];
  if (pick.index == dispatch::Pick::kTorch) return "torch";
  if (pick.index >= 0 && static_cast<std::size_t>(pick.index) < k::kVariants.size())
    return std::string(k::kVariants[static_cast<std::size_t>(pick.index)].name);
  return "";
#else
  (void)input, (void)hidden, (void)layers, (void)batch, (void)steps, (void)dtype, (void)bidirectional,
      (void)batch_first, (void)bias, (void)dropout;
  return "";
#endif
}

}  // namespace
}  // namespace hfnn::lstm_op

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def(
      "lstm_layer_fwd(Tensor x, Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, Tensor? h0, Tensor? c0, "
      "bool reverse, str variant='') -> (Tensor y, Tensor h_n, Tensor c_n, Tensor workspace)");
  m.def(
      "lstm_layer_bwd(Tensor dy, Tensor? dh_n, Tensor? dc_n, Tensor x, Tensor w_ih, Tensor w_hh, Tensor? h0, "
      "Tensor? c0, Tensor workspace, bool reverse, str variant='') -> (Tensor dx, Tensor dw_ih, Tensor dw_hh, "
      "Tensor db, Tensor dh0, Tensor dc0)");
  m.def("lstm_supports(Tensor x, Tensor w_hh, str variant) -> bool");
  m.impl("lstm_supports", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(hfnn::lstm_op::supports));
  m.def("lstm_variants() -> str[]", TORCH_FN(hfnn::lstm_op::variants));
  m.def(
      "lstm_choose(int input, int hidden, int layers, int batch, int steps, ScalarType dtype, bool bidirectional, "
      "bool batch_first, bool bias, bool dropout) -> str",
      TORCH_FN(hfnn::lstm_op::choose_winner));
}

#if HFNN_KERNELS
TORCH_LIBRARY_IMPL(hfnn, CUDA, m) {
  m.impl("lstm_layer_fwd", TORCH_FN(hfnn::lstm_op::fwd_cuda));
  m.impl("lstm_layer_bwd", TORCH_FN(hfnn::lstm_op::bwd_cuda));
}
#endif

TORCH_LIBRARY_IMPL(hfnn, CPU, m) {
  m.impl("lstm_layer_fwd", TORCH_FN(hfnn::lstm_op::fwd_cpu));
  m.impl("lstm_layer_bwd", TORCH_FN(hfnn::lstm_op::bwd_cpu));
}

TORCH_LIBRARY_IMPL(hfnn, Meta, m) {
  m.impl("lstm_layer_fwd", TORCH_FN(hfnn::lstm_op::fwd_meta));
  m.impl("lstm_layer_bwd", TORCH_FN(hfnn::lstm_op::bwd_meta));
}
