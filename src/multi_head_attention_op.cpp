// hfnn::multi_head_attention: nn.MultiheadAttention's forward and backward (no masks beyond the
// causal hint, no returned weights) as one C++ op, so a training step pays one Python call a module
// instead of F.multi_head_attention_forward's checks, reshapes and copies, and one autograd node
// instead of a graph of a dozen.
//
// Forward:
//   - the input projection is one GEMM with its bias per distinct input (one for self-attention,
//     two where key is value), written into a buffer that is then read in place as Q, K and V:
//     strided [B, H, L, Dh] views, which the fused attention cores take as they are (torch copies Q,
//     K and V into [B*H, L, Dh] first);
//   - the core is a named choice among torch's SDPA kernels, called at the ATen level: "sdpa_flash",
//     "sdpa_efficient", "sdpa_cudnn", "sdpa_math", or "" for torch's own pick (the backend
//     at::_fused_sdp_choice names for these views, as at::scaled_dot_product_attention would),
//     or hfnn's own "hfnn_short" (kernels/multihead_attention/short_attention.h: sequences of up
//     to 128 tokens, one block per batch and head), or "hfnn_mid" (torch's cuDNN forward, then
//     kernels/multihead_attention/mid_attention.h's backward for up to 256 tokens): the tuner picks
//     per shape where torch's order is not the fastest;
//   - the output projection reads the core's output in place where its layout allows.
// Backward (one autograd node, MhaFunction, for the fused cores: flash, efficient, cuDNN, and
// flash's CPU kernel): the output projection's dW, db and d(core output) in the layout the core
// wrote; the core's backward at the ATen level; then per input projection dW and db over the
// packed [N, parts*E] gradient where the core wrote dQ, dK and dV packed, else a GEMM per part
// into its rows of dW (no copy), and dx one GEMM (or a chain of accumulating ones).
// The GEMMs go through hfnn's cuBLASLt wrapper (kernels/common/gemm.h: the algorithm cached per
// shape, so no heuristic query per call), the bias gradients as GEMVs against a vector of ones.
// The math core (and torch's pick where that is math) runs as a composite of ATen ops instead, which
// autograd differentiates op by op.
// Autocast: the op casts its floating inputs to the autocast dtype once (weights through autocast's
// cache, as F.linear would), and computes in that dtype, as torch's module does under autocast.
#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/multihead_attention/multihead_attention_family.h"
#include "src/dispatch.h"
#include "src/kernel_dtype.h"

#if HFNN_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/native/transformers/cuda/sdp_utils.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/common/gemm.h"
#include "kernels/multihead_attention/mid_attention.h"
#include "kernels/multihead_attention/short_attention.h"
#endif

namespace hfnn::attention {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Core : int64_t { kTorch, kFlash, kEfficient, kCudnn, kMath, kShort, kMid };

std::optional<Core> parse_core(std::string_view name) {
  if (name.empty()) return Core::kTorch;
  if (name == "sdpa_flash") return Core::kFlash;
  if (name == "sdpa_efficient") return Core::kEfficient;
  if (name == "sdpa_cudnn") return Core::kCudnn;
  if (name == "sdpa_math") return Core::kMath;
  if (name == "hfnn_short") return Core::kShort;
  if (name == "hfnn_mid") return Core::kMid;
  return std::nullopt;
}

Core core_or_throw(std::string_view name) {
  const auto core = parse_core(name);
  TORCH_CHECK(core.has_value(), "hfnn.multi_head_attention: unknown core '", std::string(name),
              "' (sdpa_flash, sdpa_efficient, sdpa_cudnn, sdpa_math, hfnn_short, hfnn_mid, or '' for torch's choice)");
  return *core;
}

// torch's SDPA backend numbering (at::_fused_sdp_choice, sdp::SDPBackend).
constexpr int64_t kSdpFlash = 1, kSdpEfficient = 2, kSdpCudnn = 3;

// The additive mask a fused core reads, as at::scaled_dot_product_attention hands the efficient
// kernel one (its preprocess_mask): expanded to [B, H, L, S], its rows 16-element aligned (padded
// and sliced back where S is not a multiple of 16), its outer strides multiples of 16.
at::Tensor efficient_bias(const at::Tensor& bias, const at::Tensor& q, const at::Tensor& k) {
  constexpr int64_t kAlign = 16;
  const at::Tensor m = bias.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
  const int64_t s = m.size(3);
  if (s % kAlign != 0) return at::pad(m, {0, kAlign - s % kAlign}).slice(-1, 0, s);
  if (m.stride(0) % kAlign != 0 || m.stride(1) % kAlign != 0 || m.stride(2) % kAlign != 0) return m.contiguous();
  return m;
}

std::optional<at::Tensor> opt(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

#if HFNN_TORCH_CUDA
namespace short_core {
namespace mk = kernels::multihead_attention;

mk::Strides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

mk::ShortShape shape_of(const at::Tensor& q, const at::Tensor& k, bool causal) {
  mk::ShortShape s;
  s.batch = q.size(0), s.heads = q.size(1), s.q_len = q.size(2), s.kv_len = k.size(2), s.head_dim = q.size(3);
  s.dtype = kernel_dtype(q.scalar_type()).value_or(kernels::DType::kFloat32);
  s.causal = causal;
  s.device = kernels::device_info(q.get_device());
  return s;
}

bool view_ok(const at::Tensor& t) { return t.stride(3) == 1 && mk::short_view_ok(t.data_ptr(), strides_of(t)); }

// What hfnn's own cores ask of a call besides their shape limits: CUDA views of one dtype and
// head size, no mask and no dropout, every view moving in 16-byte rows.
bool plain_views(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                 double dropout) {
  if (!q.is_cuda() || bias.defined() || dropout > 0.0) return false;
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type()) return false;
  if (k.size(3) != q.size(3) || v.size(3) != q.size(3) || v.size(2) != k.size(2)) return false;
  return view_ok(q) && view_ok(k) && view_ok(v);
}

// hfnn_short takes such views where short_supports() says the launch runs.
bool takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double dropout,
           bool causal) {
  return plain_views(q, k, v, bias, dropout) && mk::short_supports(shape_of(q, k, causal));
}

// The core's output in the token order of the views (so merge_heads reads it in place) and the
// log-sum-exp its backward reads.
std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  const bool batch_outer = q.stride(0) >= q.stride(2);
  at::Tensor o = batch_outer ? at::empty({B, L, H, Dh}, q.options()).transpose(1, 2)
                             : at::empty({L, B, H, Dh}, q.options()).permute({1, 2, 0, 3});
  at::Tensor lse = at::empty({B, H, L}, q.options().dtype(at::kFloat));
  mk::ShortFwdParams p;
  p.shape = shape_of(q, k, causal);
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.o = o.data_ptr();
  p.sq = strides_of(q), p.sk = strides_of(k), p.sv = strides_of(v), p.so = strides_of(o);
  p.lse = lse.data_ptr<float>();
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t e = mk::short_forward(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == cudaSuccess, "hfnn.multi_head_attention: hfnn_short's forward failed: ", cudaGetErrorString(e));
  return {o, lse};
}

// A gradient for each of q, k and v laid out as they are: views into new buffers the size of
// their storages, so gradients of a packed projection land packed (what project_backward reads
// as one [N, parts*E] matrix).
std::array<at::Tensor, 3> like(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const std::array<const at::Tensor*, 3> in{&q, &k, &v};
  std::array<at::Tensor, 3> bufs, out;
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < i && !bufs[i].defined(); ++j)
      if (in[i]->storage().is_alias_of(in[j]->storage())) bufs[i] = bufs[j];
    if (!bufs[i].defined())
      bufs[i] = at::empty({static_cast<int64_t>(in[i]->storage().nbytes() / in[i]->element_size())}, in[i]->options());
    out[i] = bufs[i].as_strided(in[i]->sizes(), in[i]->strides(), in[i]->storage_offset());
  }
  return out;
}

std::array<at::Tensor, 3> backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& lse, bool causal) {
  auto g = like(q, k, v);
  mk::ShortBwdParams p;
  p.shape = shape_of(q, k, causal);
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.dout = dout.data_ptr();
  p.sq = strides_of(q), p.sk = strides_of(k), p.sv = strides_of(v), p.sdo = strides_of(dout);
  p.lse = lse.data_ptr<float>();
  p.dq = g[0].data_ptr(), p.dk = g[1].data_ptr(), p.dv = g[2].data_ptr();
  p.sdq = strides_of(g[0]), p.sdk = strides_of(g[1]), p.sdv = strides_of(g[2]);
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  TORCH_CHECK(dout.stride(3) == 1 && mk::short_view_ok(p.dout, p.sdo),
              "hfnn.multi_head_attention: hfnn_short's backward got a gradient it cannot read (internal error)");
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t e = mk::short_backward(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == cudaSuccess, "hfnn.multi_head_attention: hfnn_short's backward failed: ", cudaGetErrorString(e));
  return g;
}
}  // namespace short_core

// hfnn_mid: torch's cuDNN forward, then hfnn's one-block-a-head backward (mid_attention.h).
namespace mid_core {
namespace mk = kernels::multihead_attention;

// Views hfnn's cores take (short_core::plain_views) where mid_supports() says the backward runs
// (cuDNN's forward's own conditions are core_takes'); its other tensors (O, dO, the gradients) are
// the op's own, laid out as Q is.
bool takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double dropout,
           bool causal) {
  return short_core::plain_views(q, k, v, bias, dropout) && mk::mid_supports(short_core::shape_of(q, k, causal));
}

// dQ, dK and dV laid out as Q, K and V (packed where they are), from the forward's output `o` and
// log-sum-exp (natural log, [B, H, L] or [B, H, L, 1]); nullopt where a view is one the kernel
// cannot read, for the caller to run cuDNN's backward instead. With `q_sums`, also dQ's column
// sums over the batch and the query rows ([H Dh], float32): the kernel's per-block sums, summed.
std::optional<std::array<at::Tensor, 3>> backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                                                  bool causal, at::Tensor* q_sums) {
  at::Tensor rows = lse.dim() == 4 ? lse.select(3, 0) : lse;
  if (rows.dim() != 3 || rows.scalar_type() != at::kFloat) return std::nullopt;
  if (!short_core::view_ok(o) || !short_core::view_ok(dout)) return std::nullopt;
  if (rows.size(2) > 1 && rows.stride(2) != 1) rows = rows.contiguous();
  auto g = short_core::like(q, k, v);  // laid out as Q, K and V, which takes() checked
  mk::MidBwdParams p;
  p.shape = short_core::shape_of(q, k, causal);
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.o = o.data_ptr(), p.dout = dout.data_ptr();
  p.sq = short_core::strides_of(q), p.sk = short_core::strides_of(k), p.sv = short_core::strides_of(v);
  p.so = short_core::strides_of(o), p.sdo = short_core::strides_of(dout);
  p.lse = rows.data_ptr<float>(), p.lse_b = rows.stride(0), p.lse_h = rows.stride(1);
  p.dq = g[0].data_ptr(), p.dk = g[1].data_ptr(), p.dv = g[2].data_ptr();
  p.sdq = short_core::strides_of(g[0]), p.sdk = short_core::strides_of(g[1]), p.sdv = short_core::strides_of(g[2]);
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (!mk::mid_supports(p)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor per_block;
  if (q_sums) {
    per_block = at::empty({q.size(0), q.size(1) * q.size(3)}, q.options().dtype(at::kFloat));
    p.dq_sums = per_block.data_ptr<float>(), p.dq_sums_b = per_block.stride(0);
  }
  const cudaError_t e = mk::mid_backward(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == cudaSuccess, "hfnn.multi_head_attention: hfnn_mid's backward failed: ", cudaGetErrorString(e));
  if (q_sums) *q_sums = per_block.sum(0);
  return g;
}
}  // namespace mid_core
#endif

// Whether `core` runs these [B, H, L, Dh] views with this additive mask (undefined: none): torch's
// own checks for its fused kernels (dtype, head size, GPU, strides, the mask, the user's
// torch.backends.cuda.enable_*_sdp switches). On the CPU, flash is torch's CPU flash kernel (which
// takes a mask), taken where torch's CPU selection would take it. `weights`: the call returns the
// attention weights, which only the math composite computes (sdpa_math, or torch's pick).
bool core_takes(Core core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                double dropout, bool causal, bool weights) {
  if (core == Core::kTorch || core == Core::kMath) return true;
  if (weights) return false;
  if (q.device().is_cpu())
    return core == Core::kFlash && at::_fused_sdp_choice(q, k, v, opt(bias), dropout, causal) == kSdpFlash;
#if HFNN_TORCH_CUDA
  if (!q.is_cuda()) return false;
  const sdp::sdp_params params{q, k, v, opt(bias), dropout, causal, false};
  switch (core) {
    // can_use_flash_attention passes any head size: torch's SDPA pads it to a multiple of 8 before
    // calling the kernel, which this op (calling the kernel itself) does not. It takes no mask.
    case Core::kFlash: return q.size(-1) % 8 == 0 && sdp::can_use_flash_attention(params, false);
    case Core::kEfficient: return sdp::can_use_mem_efficient_attention(params, false);
    // Not with a mask: torch's SDPA hands cuDNN bool masks as -65504, not -inf ("cuDNN -inf issue"),
    // and nn.MultiheadAttention's masks are -inf floats; fully masked rows were not checked there.
    case Core::kCudnn: return !bias.defined() && sdp::can_use_cudnn_attention(params, false);
    case Core::kShort: return short_core::takes(q, k, v, bias, dropout, causal);
    case Core::kMid:  // cuDNN's forward, hfnn's backward
      return core_takes(Core::kCudnn, q, k, v, bias, dropout, causal, weights) &&
             mid_core::takes(q, k, v, bias, dropout, causal);
    default: return false;
  }
#else
  return false;
#endif
}

// The core that runs: a named one as it is; torch's pick resolved to the backend torch's SDPA would
// run on these views, kTorch (the composite through at::scaled_dot_product_attention) where that is
// the math path, a flash call torch would pad, or cuDNN with a mask (which this op's kCudnn does not take).
Core resolve(Core core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
             double dropout, bool causal) {
  if (core != Core::kTorch) return core;
  switch (at::_fused_sdp_choice(q, k, v, opt(bias), dropout, causal)) {
    case kSdpFlash: return q.device().is_cpu() || q.size(-1) % 8 == 0 ? Core::kFlash : Core::kTorch;
    case kSdpEfficient: return Core::kEfficient;
    case kSdpCudnn: return bias.defined() ? Core::kTorch : Core::kCudnn;
    default: return Core::kTorch;
  }
}

// Whether a core's forward is differentiated by autograd where the op runs it as a composite (the
// kdim/vdim path, three projections): torch's SDPA ops are; hfnn's own forwards are not (hfnn_short
// writes its output through raw pointers; hfnn_mid's forward would be cuDNN's, timed as hfnn_mid),
// so they do not take such calls.
bool composite_ok(Core core) { return core != Core::kShort && core != Core::kMid; }

bool has_node(Core core) {
  return core == Core::kFlash || core == Core::kEfficient || core == Core::kCudnn || core == Core::kShort ||
         core == Core::kMid;
}

// What a fused core's backward needs besides Q, K, V and dO (bias: the mask as the core read it).
struct CoreOut {
  at::Tensor o, lse, seed, offset, cum_q, cum_k, bias;
  int64_t max_q = 0, max_k = 0;
};

CoreOut core_forward(Core core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                     double dropout, bool causal, bool lse) {
  CoreOut r;
  switch (core) {
    case Core::kFlash:
      if (q.device().is_cpu()) {
        r.bias = bias;
        std::tie(r.o, r.lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, causal, opt(bias));
      } else {
        TORCH_CHECK(!bias.defined(), "hfnn.multi_head_attention: sdpa_flash takes no mask (internal error)");
        auto t = at::_scaled_dot_product_flash_attention(q, k, v, dropout, causal, false);
        r.o = std::get<0>(t), r.lse = std::get<1>(t), r.cum_q = std::get<2>(t), r.cum_k = std::get<3>(t);
        r.max_q = std::get<4>(t).expect_int(), r.max_k = std::get<5>(t).expect_int();
        r.seed = std::get<6>(t), r.offset = std::get<7>(t);
      }
      break;
    case Core::kEfficient: {
      if (bias.defined()) r.bias = efficient_bias(bias, q, k);
      auto t = at::_scaled_dot_product_efficient_attention(q, k, v, opt(r.bias), lse, dropout, causal);
      r.o = std::get<0>(t), r.lse = std::get<1>(t), r.seed = std::get<2>(t), r.offset = std::get<3>(t);
      break;
    }
    case Core::kCudnn:
    case Core::kMid: {  // hfnn_mid: cuDNN's forward (its output and log-sum-exp are the backward's)
      TORCH_CHECK(!bias.defined(),
                  "hfnn.multi_head_attention: sdpa_cudnn and hfnn_mid take no mask here (internal error)");
      auto t = at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, lse, dropout, causal, false);
      r.o = std::get<0>(t), r.lse = std::get<1>(t), r.cum_q = std::get<2>(t), r.cum_k = std::get<3>(t);
      r.max_q = std::get<4>(t).expect_int(), r.max_k = std::get<5>(t).expect_int();
      r.seed = std::get<6>(t), r.offset = std::get<7>(t);
      break;
    }
    case Core::kMath:
      r.o = std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, opt(bias), dropout, causal));
      break;
    case Core::kTorch: r.o = at::scaled_dot_product_attention(q, k, v, opt(bias), dropout, causal); break;
    case Core::kShort:
#if HFNN_TORCH_CUDA
      TORCH_CHECK(!bias.defined() && dropout == 0.0, "hfnn.multi_head_attention: hfnn_short takes no mask or dropout (internal error)");
      std::tie(r.o, r.lse) = short_core::forward(q, k, v, causal);
#else
      TORCH_CHECK(false, "hfnn.multi_head_attention: hfnn_short needs a CUDA build");
#endif
      break;
  }
  return r;
}

// `q_sums` (null: not asked): where the core sums dQ's columns itself (hfnn_mid), those sums
// ([H Dh], float32: the input projection's bias gradient's query rows); left undefined otherwise.
std::array<at::Tensor, 3> core_backward(Core core, const CoreOut& c, const at::Tensor& dout, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v, double dropout, bool causal,
                                        at::Tensor* q_sums = nullptr) {
  std::tuple<at::Tensor, at::Tensor, at::Tensor> g;
  switch (core) {
    case Core::kFlash:
      g = q.device().is_cpu()
              ? at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, c.o, c.lse, dropout, causal,
                                                                         opt(c.bias))
              : at::_scaled_dot_product_flash_attention_backward(dout, q, k, v, c.o, c.lse, c.cum_q, c.cum_k, c.max_q,
                                                                 c.max_k, dropout, causal, c.seed, c.offset);
      break;
    case Core::kEfficient: {
      auto t = at::_scaled_dot_product_efficient_attention_backward(dout, q, k, v, c.bias, c.o, c.lse, c.seed,
                                                                    c.offset, dropout, {true, true, true, false}, causal);
      g = {std::get<0>(t), std::get<1>(t), std::get<2>(t)};
      break;
    }
    case Core::kCudnn:
      g = at::_scaled_dot_product_cudnn_attention_backward(dout, q, k, v, c.o, c.lse, c.seed, c.offset, at::Tensor(),
                                                           c.cum_q, c.cum_k, c.max_q, c.max_k, dropout, causal);
      break;
#if HFNN_TORCH_CUDA
    case Core::kShort: return short_core::backward(dout, q, k, v, c.lse, causal);
    case Core::kMid:
      if (auto d = mid_core::backward(dout, q, k, v, c.o, c.lse, causal, q_sums)) return *d;
      // Views the kernel cannot read (not seen from the op's own layouts): cuDNN's backward, said
      // once, so a measurement of hfnn_mid that is cuDNN's does not pass unnoticed.
      TORCH_WARN_ONCE("hfnn.multi_head_attention: hfnn_mid's backward cannot read these views (O ", c.o.strides(),
                      ", dO ", dout.strides(), ", log-sum-exp ", c.lse.sizes(), "); cuDNN's backward ran instead");
      g = at::_scaled_dot_product_cudnn_attention_backward(dout, q, k, v, c.o, c.lse, c.seed, c.offset, at::Tensor(),
                                                           c.cum_q, c.cum_k, c.max_q, c.max_k, dropout, causal);
      break;
#endif
    default: TORCH_CHECK(false, "hfnn.multi_head_attention: no fused backward for this core (internal error)");
  }
  return {std::get<0>(g), std::get<1>(g), std::get<2>(g)};
}


// ---- GEMMs ------------------------------------------------------------------------------------------
// D = op(A) op(B) (+ bias on every row) (+ beta D) through hfnn's cuBLASLt path (kernels/common/gemm.h:
// the algorithm and descriptors cached per shape) on CUDA tensors of fp32/fp16/bf16 whose rows are
// contiguous; through torch's ops otherwise. D is written in place.

// A matrix inside a tensor's storage: `offset` elements after the tensor's first, rows `row_stride`
// apart, columns `col_stride` apart. The GEMMs' operands (rows of a weight, a slice of a bias, a
// [d0, d1, E] tensor as its [N, E] matrix of tokens) are made by arithmetic, not view ops: each view
// op is a dispatcher round trip through autograd's view tracking, and a backward made about 25 of
// them only to hand pointers to cuBLASLt. A view is made only where torch's ops run the GEMM.
// `t` must outlive the Mat.
struct Mat {
  const at::Tensor* t = nullptr;
  int64_t offset = 0, rows = 0, cols = 0, row_stride = 0, col_stride = 1;

  Mat rows_at(int64_t first, int64_t n) const {
    Mat m = *this;
    m.offset += first * row_stride, m.rows = n;
    return m;
  }
  Mat cols_at(int64_t first, int64_t n) const {
    Mat m = *this;
    m.offset += first * col_stride, m.cols = n;
    return m;
  }
  // For torch's ops: the matrix, and a one-row or one-column matrix as a vector.
  at::Tensor view() const {
    return t->as_strided({rows, cols}, {row_stride, col_stride}, t->storage_offset() + offset);
  }
  at::Tensor vector() const {
    return rows == 1 ? t->as_strided({cols}, {col_stride}, t->storage_offset() + offset)
                     : t->as_strided({rows}, {row_stride}, t->storage_offset() + offset);
  }
  void* data() const { return static_cast<char*>(t->data_ptr()) + offset * static_cast<int64_t>(t->element_size()); }
  // What cuBLASLt takes: rows contiguous, not overlapping.
  bool lt_ok() const { return rows > 0 && cols > 0 && col_stride == 1 && (rows == 1 || row_stride >= cols); }
  int64_t ld() const { return rows == 1 ? cols : row_stride; }
};

Mat matrix(const at::Tensor& t) { return {&t, 0, t.size(0), t.size(1), t.stride(0), t.stride(1)}; }
// A 1-D tensor as a row (a bias added to every row of D) or as a column (a bias gradient, [n, 1]).
Mat row_of(const at::Tensor& t) { return {&t, 0, 1, t.size(0), t.size(0), t.stride(0)}; }
Mat column_of(const at::Tensor& t) { return {&t, 0, t.size(0), 1, t.stride(0), 1}; }

// A [d0, d1, cols] tensor's [d0 * d1, cols] matrix of tokens where its strides allow one (what
// reshape would view), else a contiguous copy (what reshape would make), held by `keep`.
Mat tokens(const at::Tensor& t, at::Tensor& keep) {
  const int64_t cols = t.size(2);
  const std::array<int64_t, 2> shape{t.size(0) * t.size(1), cols};
  if (const auto strides = at::detail::computeStride(t.sizes(), t.strides(), at::IntArrayRef(shape)))
    return {&t, 0, shape[0], cols, (*strides)[0], (*strides)[1]};
  keep = t.reshape({-1, cols});
  return matrix(keep);
}

#if HFNN_TORCH_CUDA
// cuBLASLt splits k (a dW's sum over tokens) only with room for the partial products: with torch's
// 1 MiB Lt workspace (its default, CUBLASLT_WORKSPACE_SIZE) its heuristic picked an unsplit kernel
// for [512 x 320,000] x [320,000 x 512] that took 2.5x as long.
constexpr std::size_t kLtWorkspace = std::size_t{32} << 20;

// Ones for the bias gradients' GEMVs, kept per device, dtype and stream and grown when a call has
// more tokens: one fill kernel a process instead of an allocation and a fill every backward. Per
// stream, because the fill runs on the stream whose GEMVs then read them (so none reads them
// before they are written), and a block freed when they grow goes back to that stream's pool,
// whose next user is ordered after those reads. Returned by value: a thread growing them does not
// free what another is using. Not used under CUDA graph capture (Gemms makes its own there): a
// captured fill runs only at replay, and a cached block baked into a graph would be freed when it
// grows. Leaked at exit on purpose (CUDA may be torn down before static destructors run).
at::Tensor cached_ones(int64_t n, const at::TensorOptions& opt, cudaStream_t stream) {
  using Slot = std::tuple<int, int, cudaStream_t>;
  static std::mutex mutex;
  static auto* cache = new std::map<Slot, at::Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& ones = (*cache)[Slot{opt.device().index(), static_cast<int>(opt.dtype().toScalarType()), stream}];
  if (!ones.defined() || ones.size(0) < n) ones = at::ones({n, 1}, opt);
  return ones;
}
#endif

// The GEMMs of one op call (a forward or a backward): what every GEMM of the call shares is fetched
// once, not once a GEMM: the device guard, torch's cuBLASLt handle (torch sets its stream and
// cuBLAS workspace on every fetch) and stream, the TF32 switch, the workspace, the ones.
class Gemms {
 public:
  explicit Gemms(const at::Tensor& like) {
#if HFNN_TORCH_CUDA
    if (like.is_cuda()) {
      // The tensors' device, where a caller's current device is another (autograd's device threads
      // already set it): the handle, stream and workspace are the current device's.
      device_ = static_cast<int>(like.get_device());
      guard_.set_index(static_cast<c10::DeviceIndex>(device_));
      stream_ = at::cuda::getCurrentCUDAStream();
      tf32_ = like.scalar_type() == at::kFloat && at::globalContext().allowTF32CuBLAS();
    }
#else
    (void)like;
#endif
  }

  void operator()(const Mat& d, const Mat& a, bool trans_a, const Mat& b, bool trans_b, float beta = 0.0f,
                  const Mat* bias = nullptr) {
    TORCH_CHECK(d.rows == (trans_a ? a.cols : a.rows) && d.cols == (trans_b ? b.rows : b.cols) &&
                    (trans_a ? a.rows : a.cols) == (trans_b ? b.cols : b.rows),
                "hfnn.multi_head_attention: GEMM shapes do not match (internal error)");
#if HFNN_TORCH_CUDA
    const at::ScalarType type = d.t->scalar_type();
    const auto dtype = kernel_dtype(type);
    const bool same = a.t->scalar_type() == type && b.t->scalar_type() == type &&
                      (!bias || (bias->t->scalar_type() == type && (bias->cols <= 1 || bias->col_stride == 1)));
    if (device_ >= 0 && d.t->is_cuda() && dtype && same && d.lt_ok() && a.lt_ok() && b.lt_ok() &&
        (beta == 0.0f || !bias)) {
      if (!handle_) handle_ = at::cuda::getCurrentCUDABlasLtHandle();
      kernels::gemm::Params p;
      p.dtype = *dtype;
      p.tf32 = tf32_;
      p.m = d.rows, p.n = d.cols, p.k = trans_a ? a.rows : a.cols;
      p.a = a.data(), p.lda = a.ld(), p.trans_a = trans_a;
      p.b = b.data(), p.ldb = b.ld(), p.trans_b = trans_b;
      p.d = d.data(), p.ldd = d.ld(), p.beta = beta;
      p.bias = bias ? bias->data() : nullptr;
      workspace(p);
      p.device = device_;
      const auto r = kernels::gemm::run(p, handle_, stream_);
      TORCH_CHECK(r.status != kernels::gemm::Status::kError, "hfnn.multi_head_attention: ", r.message);
      if (r.status == kernels::gemm::Status::kOk) return;
    }
#endif
    at::Tensor dv = d.view();
    const at::Tensor av = a.view(), bv = b.view();
    const at::Tensor opa = trans_a ? av.t() : av, opb = trans_b ? bv.t() : bv;
    if (bias)
      at::addmm_out(dv, bias->vector(), opa, opb);
    else if (beta != 0.0f)
      dv.addmm_(opa, opb, beta, 1.0);
    else
      at::mm_out(dv, opa, opb);
  }

  // A linear layer's bias gradient: the column sums of g [tokens, n] into db (a [n, 1] column). On
  // the GPU as a GEMV against a vector of ones, which reads g at cuBLAS's bandwidth; torch's column
  // reduction was 1.3-1.7x slower on these shapes.
  void bias_grad(const Mat& db, const Mat& g) {
#if HFNN_TORCH_CUDA
    if (device_ >= 0 && g.lt_ok()) {
      if (!ones_.defined() || ones_.size(0) < g.rows) {
        ones_ = c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None
                    ? cached_ones(g.rows, g.t->options(), stream_)
                    : at::ones({g.rows, 1}, g.t->options());
      }
      (*this)(db, g, true, Mat{&ones_, 0, g.rows, 1, 1, 1}, false);
      return;
    }
#endif
    at::Tensor out = db.vector();
    at::sum_out(out, g.view(), {0});
  }

  // Gives the workspace back to the caching allocator, for the attention core's own buffers; the
  // next GEMM takes one again.
  void release_workspace() {
#if HFNN_TORCH_CUDA
    workspace_.clear();
#endif
  }

 private:
#if HFNN_TORCH_CUDA
  // Torch's Lt workspace where it is 32 MiB or more, else one block of 32 MiB from torch's caching
  // allocator for the call's GEMMs, which run one after another on one stream (a GEMM took a block
  // of its own before: 14 allocations a training call). Not a block cached per device and stream:
  // a GEMM captured in a CUDA graph keeps its workspace's address, and eager work later on the
  // capture stream (torch reuses its pool streams) could run while the graph replays on another
  // stream (torch clears its own cuBLAS workspaces at capture for that reason); a block per call
  // comes from the graph's private pool under capture, as the call's other buffers do, and costs
  // one allocator call (no tensor, no dispatcher).
  void workspace(kernels::gemm::Params& p) {
    if (!workspace_size_) {
      const std::size_t torch_size = at::cuda::getCUDABlasLtWorkspaceSize();
      workspace_size_ = torch_size >= kLtWorkspace ? torch_size : kLtWorkspace;
      torch_workspace_ = torch_size >= kLtWorkspace;
    }
    if (torch_workspace_) {
      if (!workspace_ptr_) workspace_ptr_ = at::cuda::getCUDABlasLtWorkspace();
    } else {
      if (!workspace_) workspace_ = c10::cuda::CUDACachingAllocator::get()->allocate(kLtWorkspace);
      workspace_ptr_ = workspace_.get();
    }
    p.workspace = workspace_ptr_, p.workspace_size = workspace_size_;
  }

  c10::cuda::OptionalCUDAGuard guard_;
  int device_ = -1;  // -1: not a CUDA call (every GEMM runs torch's op)
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  bool tf32_ = false;
  std::size_t workspace_size_ = 0;
  bool torch_workspace_ = false;
  c10::DataPtr workspace_;
  void* workspace_ptr_ = nullptr;
  at::Tensor ones_;
#endif
};

// ---- the input projection ------------------------------------------------------------------------
// One GEMM per distinct input: rows [row0, row0 + parts * E) of in_proj_weight applied to input
// `input` (0 query, 1 key, 2 value), written to a [d0, d1, parts * E] buffer.
struct Group {
  int input;
  int64_t row0, parts;
};

struct Plan {
  std::vector<Group> groups;
  std::vector<at::Tensor> bufs;  // per group, [d0, d1, parts * E]
  at::Tensor q, k, v;            // [B, H, L, Dh] views into bufs
};

// [d0, d1, n*E] -> n views [B, H, L, Dh], no copy.
std::vector<at::Tensor> split_heads(const at::Tensor& proj, int64_t parts, int64_t heads, bool batch_first) {
  const int64_t d0 = proj.size(0), d1 = proj.size(1);
  const int64_t head_dim = proj.size(2) / parts / heads;
  std::vector<at::Tensor> out = proj.view({d0, d1, parts, heads, head_dim}).unbind(2);  // [d0, d1, H, Dh] each
  for (at::Tensor& t : out) t = batch_first ? t.transpose(1, 2) : t.permute({1, 2, 0, 3});
  return out;
}

// `separate`: the module's q_proj_weight, k_proj_weight and v_proj_weight (kdim/vdim), one GEMM each.
std::vector<Group> groups_of(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed,
                             bool separate = false) {
  if (!separate && query.is_same(key) && key.is_same(value)) return {{0, 0, 3}};  // self-attention
  if (!separate && key.is_same(value)) return {{0, 0, 1}, {1, embed, 2}};         // encoder-decoder: K and V
  return {{0, 0, 1}, {1, embed, 1}, {2, 2 * embed, 1}};
}

// The buffers (uninitialized) and their views: the real geometry, for choosing a core before any
// GEMM runs.
Plan plan(const std::array<const at::Tensor*, 3>& in, int64_t heads, bool batch_first, const at::TensorOptions& opt,
          bool separate = false) {
  Plan p;
  const int64_t embed = in[0]->size(2);
  p.groups = groups_of(*in[0], *in[1], *in[2], embed, separate);
  std::vector<at::Tensor> views;
  for (const Group& g : p.groups) {
    const at::Tensor& x = *in[g.input];
    p.bufs.push_back(at::empty({x.size(0), x.size(1), g.parts * embed}, opt));
    for (at::Tensor& t : split_heads(p.bufs.back(), g.parts, heads, batch_first)) views.push_back(std::move(t));
  }
  p.q = views[0], p.k = views[1], p.v = views[2];
  return p;
}

void project(Gemms& gemm, const Plan& p, const std::array<const at::Tensor*, 3>& in, const at::Tensor& w,
             const at::Tensor& b) {
  const int64_t embed = w.size(1);
  for (std::size_t i = 0; i < p.groups.size(); ++i) {
    const Group& g = p.groups[i];
    const int64_t rows = g.parts * embed;
    at::Tensor keep_x, keep_out;
    const Mat x = tokens(*in[g.input], keep_x);
    const Mat out = tokens(p.bufs[i], keep_out);  // the buffer is contiguous: in place
    const Mat bias = b.defined() ? row_of(b).cols_at(g.row0, rows) : Mat{};
    gemm(out, x, false, matrix(w).rows_at(g.row0, rows), true, 0.0f, b.defined() ? &bias : nullptr);
  }
}

// The core's [B, H, L, Dh] output as the output projection's [d0, d1, E] input (token order of the
// op's input): a view where the core wrote [B, L, H, Dh] (batch_first) or [L, B, H, Dh], else a copy.
at::Tensor merge_heads(const at::Tensor& o, bool batch_first) {
  const int64_t embed = o.size(1) * o.size(3);
  return batch_first ? o.transpose(1, 2).reshape({o.size(0), o.size(2), embed})
                     : o.permute({2, 0, 1, 3}).reshape({o.size(2), o.size(0), embed});
}

// A [B, H, L, Dh] gradient as the [N, E] matrix of its tokens in the input's order, where its
// strides allow one (the view transpose or permute, then reshape, would make).
std::optional<Mat> token_matrix(const at::Tensor& t, bool batch_first) {
  // [d0, d1, H, Dh]: t.transpose(1, 2) (batch_first) or t.permute({2, 0, 1, 3}).
  const std::array<int64_t, 4> order = batch_first ? std::array<int64_t, 4>{0, 2, 1, 3} : std::array<int64_t, 4>{2, 0, 1, 3};
  std::array<int64_t, 4> sizes{}, strides{};
  for (std::size_t i = 0; i < 4; ++i) sizes[i] = t.size(order[i]), strides[i] = t.stride(order[i]);
  const std::array<int64_t, 2> shape{sizes[0] * sizes[1], sizes[2] * sizes[3]};
  const auto merged = at::detail::computeStride(at::IntArrayRef(sizes), at::IntArrayRef(strides), at::IntArrayRef(shape));
  if (!merged) return std::nullopt;
  return Mat{&t, 0, shape[0], shape[1], (*merged)[0], (*merged)[1]};
}

// The in-projection bias's key and value rows, from what the backward has without summing dK and
// dV over the tokens (2/3 of the in-projection's bias-gradient reads: [200, 256, 1024, 16] reads
// 315 MB of dQKV in bf16 for it). softmax's rows sum to 1, so with S = scale Q K^T and P = softmax(S):
//   sum_t dK_t = scale sum_s Q_s sum_t dS_st = 0, as sum_t dS_st = sum_t P_st (dP_st - sum_u P_su dP_su) = 0
//   (dropout or not: the softmax's backward sees P before dropout);
//   sum_t dV_t = sum_s dO_s sum_t P_st = sum_s dO_s = W_out^T db_out (dO = dY W_out, db_out = sum_s dY_s),
//   where the core applies no dropout (P_drop's rows do not sum to 1).
// Exact wherever every query row attends a key: without a mask (a causal row attends its first key).
// The sums the GEMV would make differ from these only by their rounding: the float64 gate sees
// this error at most (the key rows are exactly the 0 that float64's sum comes near).
struct KnownBiasGrads {
  bool key_zero = false;           // the key rows are 0
  const at::Tensor* value = nullptr;  // the value rows are W_out^T (this [E] db_out); null: summed
  const at::Tensor* out_w = nullptr;
  const at::Tensor* query = nullptr;  // the query rows, summed by the core (core_backward's q_sums)
};

// One input projection's backward, from the core's gradients of its parts: rows of dW and db, and
// the input's gradient (added into dx where it is defined already).
void project_backward(Gemms& gemm, const Group& g, const std::vector<at::Tensor>& parts, bool batch_first,
                      const at::Tensor& x, const at::Tensor& w, at::Tensor* dx, at::Tensor* dw, at::Tensor* db,
                      const KnownBiasGrads& known = {}) {
  const int64_t embed = w.size(1), rows = g.parts * embed;
  std::vector<Mat> m;
  for (const at::Tensor& t : parts) {
    auto tm = token_matrix(t, batch_first);
    if (!tm) break;
    m.push_back(*tm);
  }
  const bool views = m.size() == parts.size();
  bool packed = views;
  // Each part's matrix starts at its tensor's first element (token_matrix's offset is 0).
  for (std::size_t i = 1; packed && i < m.size(); ++i)
    packed = parts[i].storage().is_alias_of(parts[0].storage()) && m[i].row_stride == m[0].row_stride &&
             m[i].col_stride == 1 &&
             parts[i].storage_offset() == parts[0].storage_offset() + static_cast<int64_t>(i) * embed;
  if (packed && m.size() > 1 && (m[0].col_stride != 1 || m[0].row_stride < rows)) packed = false;
  at::Tensor buf;
  if (!views) {  // not expressible as token matrices (seq-first cores that wrote [B, L, H, Dh]): one packed copy
    const at::Tensor& t0 = parts[0];
    const int64_t d0 = batch_first ? t0.size(0) : t0.size(2), d1 = batch_first ? t0.size(2) : t0.size(0);
    buf = at::empty({d0, d1, g.parts, t0.size(1), t0.size(3)}, t0.options());
    for (std::size_t i = 0; i < parts.size(); ++i)
      buf.select(2, static_cast<int64_t>(i)).copy_(batch_first ? parts[i].transpose(1, 2) : parts[i].permute({2, 0, 1, 3}));
    m = {Mat{&buf, 0, d0 * d1, rows, rows, 1}};
  } else if (packed && m.size() > 1) {
    m = {Mat{m[0].t, 0, m[0].rows, rows, m[0].row_stride, 1}};
  }
  at::Tensor keep_x;
  const Mat x2 = tokens(x, keep_x);
  // m: one [N, rows] matrix (packed) or one [N, E] matrix per part.
  const int64_t step = static_cast<int64_t>(rows / static_cast<int64_t>(m.size()));
  for (std::size_t i = 0; i < m.size(); ++i) {
    const int64_t r0 = g.row0 + static_cast<int64_t>(i) * step;
    if (dw) gemm(matrix(*dw).rows_at(r0, step), m[i], true, x2, false);
    if (db && !known.key_zero && !known.value && !known.query) {
      gemm.bias_grad(column_of(*db).rows_at(r0, step), m[i]);
    } else if (db) {  // part by part: 0 = query, 1 = key, 2 = value rows of the bias
      for (int64_t j = 0; j < step; j += embed) {
        const int64_t row = r0 + j;
        const Mat rows_db = column_of(*db).rows_at(row, embed);
        if (row / embed == 0 && known.query)
          db->narrow(0, row, embed).copy_(*known.query);
        else if (row / embed == 1 && known.key_zero)
          db->narrow(0, row, embed).zero_();
        else if (row / embed == 2 && known.value)
          gemm(rows_db, matrix(*known.out_w), true, column_of(*known.value), false);
        else
          gemm.bias_grad(rows_db, m[i].cols_at(j, embed));
      }
    }
    if (dx) {
      // Allocated in the input's shape (contiguous, so its [N, E] matrix is itself).
      const bool first = !dx->defined();
      if (first) *dx = at::empty(x.sizes(), m[i].t->options());
      at::Tensor keep_dx;
      gemm(tokens(*dx, keep_dx), m[i], false, matrix(w).rows_at(r0, step), false, first ? 0.0f : 1.0f);
    }
  }
}

// ---- the op ---------------------------------------------------------------------------------------

struct Forward {
  at::Tensor y, merged;
  CoreOut core;
};

// The forward of every core, on inputs already in the compute dtype; `p` planned for them.
Forward run_forward(const Plan& p, const std::array<const at::Tensor*, 3>& in, const at::Tensor& in_w,
                const at::Tensor& in_b, const at::Tensor& out_w, const at::Tensor& out_b, Core core, bool batch_first,
                bool causal, double dropout, const at::Tensor& mask, bool lse) {
  Forward f;
  Gemms gemm(*in[0]);
  project(gemm, p, in, in_w, in_b);
  gemm.release_workspace();
  f.core = core_forward(core, p.q, p.k, p.v, mask, dropout, causal, lse);
  f.merged = merge_heads(f.core.o, batch_first);
  const int64_t embed = out_w.size(0);
  // Allocated in the output's shape (not a view of a 2-D one: autograd forbids in-place ops on a
  // custom function's view outputs, and torch's module's output allows them).
  f.y = at::empty({f.merged.size(0), f.merged.size(1), embed}, f.merged.options());
  at::Tensor keep_y, keep_merged;
  const Mat bias = out_b.defined() ? row_of(out_b) : Mat{};
  gemm(tokens(f.y, keep_y), tokens(f.merged, keep_merged), false, matrix(out_w), true, 0.0f,
       out_b.defined() ? &bias : nullptr);
  return f;
}

// Autograd's one node for a call with a fused core. Inputs 0-6: query, key, value, in_proj_weight,
// in_proj_bias, out_proj_weight, out_proj_bias (biases may be undefined); then settings, and last
// the additive mask (undefined: none; it never requires grad: the op refuses a mask that does).
class MhaFunction : public torch::autograd::Function<MhaFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, const at::Tensor& in_w, const std::optional<at::Tensor>& in_b,
                            const at::Tensor& out_w, const std::optional<at::Tensor>& out_b, const Plan& p, Core core,
                            bool batch_first, bool causal, double dropout, const std::optional<at::Tensor>& mask) {
    const std::array<const at::Tensor*, 3> in{&query, &key, &value};
    Forward f = run_forward(p, in, in_w, in_b.value_or(at::Tensor()), out_w, out_b.value_or(at::Tensor()), core,
                            batch_first, causal, dropout, mask.value_or(at::Tensor()), true);
    const CoreOut& c = f.core;
    ctx->save_for_backward({query, key, value, in_w, out_w, p.q, p.k, p.v, c.o, c.lse, c.seed, c.offset, c.cum_q,
                            c.cum_k, f.merged, c.bias});
    ctx->saved_data["core"] = static_cast<int64_t>(core);
    ctx->saved_data["batch_first"] = batch_first;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["max_q"] = c.max_q;
    ctx->saved_data["max_k"] = c.max_k;
    ctx->saved_data["has_in_b"] = in_b.has_value() && in_b->defined();
    ctx->saved_data["has_out_b"] = out_b.has_value() && out_b->defined();
    return f.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &in_w = s[3], &out_w = s[4], &q = s[5], &k = s[6], &v = s[7];
    CoreOut c{s[8], s[9], s[10], s[11], s[12], s[13], s[15], ctx->saved_data["max_q"].toInt(),
              ctx->saved_data["max_k"].toInt()};
    const at::Tensor& merged = s[14];
    const auto core = static_cast<Core>(ctx->saved_data["core"].toInt());
    const bool batch_first = ctx->saved_data["batch_first"].toBool(), causal = ctx->saved_data["causal"].toBool();
    const double dropout = ctx->saved_data["dropout"].toDouble();
    const int64_t embed = out_w.size(0);
    // needs_input_grad counts the tensor inputs given (an absent bias is no input), the list
    // returned counts every argument.
    const bool has_in_b = ctx->saved_data["has_in_b"].toBool(), has_out_b = ctx->saved_data["has_out_b"].toBool();
    auto need = [&](int arg) {
      if ((arg == 4 && !has_in_b) || (arg == 6 && !has_out_b)) return false;
      const int edge = arg - (arg > 4 && !has_in_b ? 1 : 0);
      return ctx->needs_input_grad(static_cast<std::size_t>(edge));
    };

    // Not twice differentiable: the GEMMs write through raw pointers and out= ops.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "hfnn.multi_head_attention: double backward (create_graph=True) is not supported; "
                "use torch.nn.MultiheadAttention for it (hfnn.to_torch)");
    const std::array<const at::Tensor*, 3> in{&s[0], &s[1], &s[2]};
    const at::TensorOptions options = grads[0].options();
    Gemms gemm(grads[0]);
    at::Tensor keep_gy, keep_merged;
    const Mat gy = tokens(grads[0], keep_gy);  // [N, E]
    variable_list out(13);
    if (need(5)) {
      out[5] = at::empty({embed, embed}, options);
      gemm(matrix(out[5]), gy, true, tokens(merged, keep_merged), false);
    }
    if (need(6)) {
      out[6] = at::empty({embed}, options);
      gemm.bias_grad(column_of(out[6]), gy);
    }
    if (!(need(0) || need(1) || need(2) || need(3) || need(4)))
      return out;
    // d(core output) in the token order of the input, as the [B, H, L, Dh] view the core takes.
    const int64_t heads = q.size(1), head_dim = q.size(3);
    const at::Tensor dm = batch_first ? at::empty({q.size(0), q.size(2), heads, head_dim}, options)
                                      : at::empty({q.size(2), q.size(0), heads, head_dim}, options);
    gemm(Mat{&dm, 0, gy.rows, embed, embed, 1}, gy, false, matrix(out_w), false);
    const at::Tensor dout = batch_first ? dm.transpose(1, 2) : dm.permute({1, 2, 0, 3});
    gemm.release_workspace();
    at::Tensor q_sums;
    const auto d = core_backward(core, c, dout, q, k, v, dropout, causal, need(4) ? &q_sums : nullptr);

    at::Tensor dw = need(3) ? at::empty_like(in_w) : at::Tensor();
    at::Tensor db = need(4) ? at::empty({in_w.size(0)}, in_w.options()) : at::Tensor();
    KnownBiasGrads known;
    if (q_sums.defined()) known.query = &q_sums;
    // No mask: every query row attends a key (causal ones their first, top-left as torch's cores
    // align it; a core aligned bottom-right would leave rows past the keys' count without one).
    if (!c.bias.defined() && (!causal || q.size(2) <= k.size(2))) {
      known.key_zero = true;
      if (dropout == 0.0 && out[6].defined()) known.value = &out[6], known.out_w = &out_w;
    }
    std::size_t part = 0;
    for (const Group& g : groups_of(s[0], s[1], s[2], embed)) {
      const std::vector<at::Tensor> parts(d.begin() + static_cast<std::ptrdiff_t>(part),
                                          d.begin() + static_cast<std::ptrdiff_t>(part + g.parts));
      part += static_cast<std::size_t>(g.parts);
      at::Tensor dx;
      project_backward(gemm, g, parts, batch_first, *in[g.input], in_w, need(g.input) ? &dx : nullptr,
                       dw.defined() ? &dw : nullptr, db.defined() ? &db : nullptr, known);
      if (dx.defined()) out[g.input] = std::move(dx);
    }
    out[3] = dw, out[4] = db;
    return out;
  }
};

// ---- the call: shapes, projection weights, masks --------------------------------------------------

namespace mha = kernels::multihead_attention;

// The input projection's weights: in_proj_weight [3E, E], or (the module's kdim/vdim)
// q_proj_weight [E, E], k_proj_weight [E, kdim] and v_proj_weight [E, vdim]; in_proj_bias [3E]
// either way (undefined: none).
struct Proj {
  at::Tensor in_w, q_w, k_w, v_w, in_b;
  bool separate() const { return !in_w.defined(); }
  // The weight that projects input i (0 query, 1 key, 2 value) where they are separate.
  const at::Tensor& part(int i) const { return i == 0 ? q_w : i == 1 ? k_w : v_w; }
};

Proj proj_of(const std::optional<at::Tensor>& in_w, const std::optional<at::Tensor>& in_b,
             const std::optional<at::Tensor>& q_w, const std::optional<at::Tensor>& k_w,
             const std::optional<at::Tensor>& v_w) {
  auto get = [](const std::optional<at::Tensor>& t) { return t.value_or(at::Tensor()); };
  return {get(in_w), get(q_w), get(k_w), get(v_w), get(in_b)};
}

int64_t batch_of(const at::Tensor& t, bool batch_first) { return t.size(batch_first ? 0 : 1); }
int64_t length_of(const at::Tensor& t, bool batch_first) { return t.size(batch_first ? 1 : 0); }

// Empty where the op takes these shapes; else what is wrong, in one line.
std::string shape_problem(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t heads,
                          const Proj& w, bool batch_first) {
  if (query.dim() != 3 || key.dim() != 3 || value.dim() != 3)
    return fmt::format("query, key and value must be 3-D (batched); got {}-D, {}-D and {}-D", query.dim(), key.dim(),
                       value.dim());
  const int64_t embed = query.size(2);
  if (heads <= 0 || embed % heads != 0)
    return fmt::format("embed_dim {} is not divisible by num_heads {}", embed, heads);
  if (key.size(0) != value.size(0) || key.size(1) != value.size(1))
    return "key and value must have the same batch and length";
  if (batch_of(key, batch_first) != batch_of(query, batch_first))
    return fmt::format("query has batch {}, key and value {}: they must agree", batch_of(query, batch_first),
                       batch_of(key, batch_first));
  if (!w.separate()) {
    if (w.q_w.defined() || w.k_w.defined() || w.v_w.defined())
      return "give in_proj_weight, or q_proj_weight, k_proj_weight and v_proj_weight, not both";
    if (w.in_w.dim() != 2 || w.in_w.size(0) != 3 * embed || w.in_w.size(1) != embed)
      return "in_proj_weight must be [3 * embed_dim, embed_dim]";
    if (key.size(2) != embed || value.size(2) != embed)
      return fmt::format("key and value must have embed_dim {} with in_proj_weight (kdim/vdim: give q_proj_weight, "
                         "k_proj_weight and v_proj_weight instead)", embed);
  } else {
    if (!w.q_w.defined() || !w.k_w.defined() || !w.v_w.defined())
      return "give in_proj_weight, or q_proj_weight, k_proj_weight and v_proj_weight";
    for (int i = 0; i < 3; ++i) {
      const at::Tensor& x = i == 0 ? query : i == 1 ? key : value;
      if (w.part(i).dim() != 2 || w.part(i).size(0) != embed || w.part(i).size(1) != x.size(2))
        return fmt::format("{} must be [embed_dim, {}] = [{}, {}] for a {} of width {}",
                           i == 0 ? "q_proj_weight" : i == 1 ? "k_proj_weight" : "v_proj_weight",
                           i == 0 ? "embed_dim" : i == 1 ? "kdim" : "vdim", embed, x.size(2),
                           i == 0 ? "query" : i == 1 ? "key" : "value", x.size(2));
    }
  }
  if (w.in_b.defined() && (w.in_b.dim() != 1 || w.in_b.size(0) != 3 * embed))
    return "in_proj_bias must be [3 * embed_dim]";
  return "";
}

// Why the op does not run a call's masks as given.
enum class MaskIssue {
  kNone,
  kInvalid,   // torch's module raises (its checks, its message)
  kNotTaken,  // torch's module computes it, the op does not: a float mask of another dtype than the
              // query's, or a mask on another device
  kGrad,      // a float mask that requires grad (the op computes no gradient for a mask)
};

// A call's masks, checked: their kinds as given, and as torch's module applies them.
struct MaskSpec {
  mha::PaddingMask padding = mha::PaddingMask::kNone;
  mha::AttnMask mask = mha::AttnMask::kNone;
  mha::Masking masking;
  std::string message;  // the issue, in a line
};

// torch's spelling of sizes in its messages: torch.Size([3, 4]) for a tensor's, (3, 3) for a tuple.
std::string torch_size(at::IntArrayRef sizes) { return fmt::format("torch.Size([{}])", fmt::join(sizes, ", ")); }
std::string tuple_text(std::initializer_list<int64_t> sizes) { return fmt::format("({})", fmt::join(sizes, ", ")); }

// The checks torch.nn.MultiheadAttention.forward and F.multi_head_attention_forward make of the
// masks of a batched call, in their order and with their messages (kInvalid), then what the op does
// not take. `module`: the causal hint needs attn_mask, as torch's module says; the op alone reads
// the hint without a mask as causal where no padding mask or weights need the mask. (torch's
// deprecation warning for a key_padding_mask whose type is not attn_mask's is Python's to give:
// hfnn/_families/multihead_attention.py, warn_mismatched_masks; a warning from an op called through
// torch.ops would reach stderr, not Python's warnings.)
MaskIssue check_masks(const at::Tensor& query, int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads,
                      const at::Tensor& kpm, const at::Tensor& am, bool is_causal, mha::Weights weights, bool module,
                      MaskSpec& spec) {
  auto invalid = [&](std::string message) {
    spec.message = std::move(message);
    return MaskIssue::kInvalid;
  };
  auto is_bool = [](const at::Tensor& t) { return t.scalar_type() == at::kBool; };
  const bool has_kpm = kpm.defined(), has_am = am.defined();
  if (has_kpm && !is_bool(kpm) && !at::isFloatingType(kpm.scalar_type()))
    return invalid("only bool and floating types of key_padding_mask are supported");
  if (has_am && !is_bool(am) && !at::isFloatingType(am.scalar_type()))
    return invalid("only bool and floating types of attn_mask are supported");
  if (has_kpm && kpm.dim() != 2)
    return invalid(fmt::format("For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D but found "
                               "{}-D tensor instead", kpm.dim()));
  if (has_am && am.dim() != 2 && am.dim() != 3)
    return invalid(fmt::format("For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found "
                               "{}-D tensor instead", am.dim()));
  if (is_causal && !has_am && (module || has_kpm || weights != mha::Weights::kNone))
    return invalid("Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
                   "`generate_square_subsequent_mask` to create this mask.");
  spec.padding = !has_kpm ? mha::PaddingMask::kNone : is_bool(kpm) ? mha::PaddingMask::kBool : mha::PaddingMask::kFloat;
  if (has_am) {
    const bool three = am.dim() == 3;
    spec.mask = is_bool(am) ? (three ? mha::AttnMask::kBool3d : mha::AttnMask::kBool2d)
                            : (three ? mha::AttnMask::kFloat3d : mha::AttnMask::kFloat2d);
  }
  spec.masking = mha::resolve_masking(is_causal, spec.padding, spec.mask, weights);
  const bool applied = spec.masking.mask != mha::AttnMask::kNone;
  if (applied && am.dim() == 2 && (am.size(0) != q_len || am.size(1) != kv_len))
    return invalid(fmt::format("The shape of the 2D attn_mask is {}, but should be {}.", torch_size(am.sizes()),
                               tuple_text({q_len, kv_len})));
  if (applied && am.dim() == 3 && (am.size(0) != batch * heads || am.size(1) != q_len || am.size(2) != kv_len))
    return invalid(fmt::format("The shape of the 3D attn_mask is {}, but should be {}.", torch_size(am.sizes()),
                               tuple_text({batch * heads, q_len, kv_len})));
  if (has_kpm && kpm.size(0) != batch)
    return invalid(fmt::format("Expected key_padded_mask.shape[0] to be {}, but got {}", batch, kpm.size(0)));
  if (has_kpm && kpm.size(1) != kv_len)
    return invalid(fmt::format("Expected key_padded_mask.shape[1] to be {}, but got {}", kv_len, kpm.size(1)));
  for (const auto& [t, name] : {std::pair{&kpm, "key_padding_mask"}, std::pair{&am, "attn_mask"}}) {
    if (!t->defined() || (t == &am && !applied)) continue;
    if (t->device() != query.device()) {
      spec.message = fmt::format("{} is on {}, the query on {}: give it on the query's device", name,
                                 t->device().str(), query.device().str());
      return MaskIssue::kNotTaken;
    }
    if (!is_bool(*t) && t->scalar_type() != query.scalar_type()) {
      spec.message = fmt::format("{} has dtype {}, the query {}: give a bool mask or one of the query's dtype", name,
                                 c10::toString(t->scalar_type()), c10::toString(query.scalar_type()));
      return MaskIssue::kNotTaken;
    }
    if (!is_bool(*t) && t->requires_grad() && at::GradMode::is_enabled()) {
      spec.message = fmt::format("{} requires grad: the op computes no gradient for a mask (detach it, or run "
                                 "torch.nn.MultiheadAttention)", name);
      return MaskIssue::kGrad;
    }
  }
  return MaskIssue::kNone;
}

// The additive mask the core reads, as torch's module builds it: a bool mask becomes 0 / -inf in the
// query's dtype (True: masked out), the attention mask [1, 1, L, S] or [B, H, L, S] and the padding
// mask [B, 1, 1, S] are added (broadcast: [B, 1, L, S] for a 2-D mask and padding, where torch's
// module repeats it per head), then cast to the dtype the call computes in (autocast's, as torch's
// SDPA casts it). Undefined where no mask applies.
at::Tensor build_mask(const MaskSpec& spec, const at::Tensor& kpm, const at::Tensor& am, at::ScalarType query_dtype,
                      at::ScalarType dtype, int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len) {
  auto canonical = [&](const at::Tensor& m) {
    return m.scalar_type() == at::kBool
               ? at::zeros_like(m, m.options().dtype(query_dtype)).masked_fill_(m, -std::numeric_limits<double>::infinity())
               : m;
  };
  at::Tensor mask;
  if (spec.masking.mask != mha::AttnMask::kNone) {
    const at::Tensor m = canonical(am);
    mask = m.dim() == 2 ? m.reshape({1, 1, q_len, kv_len}) : m.reshape({batch, heads, q_len, kv_len});
  }
  if (kpm.defined()) {
    const at::Tensor padding = canonical(kpm).reshape({batch, 1, 1, kv_len});
    mask = mask.defined() ? mask + padding : padding;
  }
  if (mask.defined() && mask.scalar_type() != dtype) mask = mask.to(dtype);
  return mask;
}

mha::Weights weights_of(bool need_weights, bool average) {
  return !need_weights ? mha::Weights::kNone : average ? mha::Weights::kMean : mha::Weights::kPerHead;
}

bool autocast_on(c10::DeviceType device) {
  return at::autocast::is_autocast_available(device) && at::autocast::is_autocast_enabled(device);
}

// The dtype the op computes a call in: autocast's where it is on for the query's device and casts
// the query (autocast casts floating tensors other than float64, as its cached_cast does), else the
// query's own.
at::ScalarType compute_dtype(const at::Tensor& query) {
  const c10::DeviceType device = query.device().type();
  const bool cast = autocast_on(device) && at::isFloatingType(query.scalar_type()) &&
                    query.scalar_type() != at::kDouble;
  return cast ? at::autocast::get_autocast_dtype(device) : query.scalar_type();
}

// ---- the composite paths: ATen ops that autograd differentiates one by one, and autocast casts one by one

// Q, K and V as [B, H, L, Dh] views of the input projection's outputs.
std::array<at::Tensor, 3> projected(const std::array<const at::Tensor*, 3>& in, int64_t heads, const Proj& w,
                                    bool batch_first) {
  const int64_t embed = in[0]->size(2);
  std::vector<at::Tensor> views;
  for (const Group& g : groups_of(*in[0], *in[1], *in[2], embed, w.separate())) {
    const at::Tensor weight = w.separate() ? w.part(g.input) : w.in_w.narrow(0, g.row0, g.parts * embed);
    const std::optional<at::Tensor> b = opt(w.in_b.defined() ? w.in_b.narrow(0, g.row0, g.parts * embed) : at::Tensor());
    // unbind (in split_heads), not a select a part: its backward stacks the parts' gradients into
    // one packed buffer, where each select's would be a zero-filled full-size buffer, summed.
    for (at::Tensor& t : split_heads(at::linear(*in[g.input], weight, b), g.parts, heads, batch_first))
      views.push_back(t);
  }
  return {views[0], views[1], views[2]};
}

// The math core, torch's pick where that is math, and any core with separate projection weights
// (kdim/vdim): the core through its ATen op (a fused one's own autograd formula; `lse` where a
// backward will need it).
at::Tensor composite(const std::array<const at::Tensor*, 3>& in, int64_t heads, const Proj& w, const at::Tensor& out_w,
                     const at::Tensor& out_b, Core core, bool batch_first, bool causal, double dropout,
                     const at::Tensor& mask, bool lse) {
  const auto [q, k, v] = projected(in, heads, w, batch_first);
  const at::Tensor o = core_forward(core, q, k, v, mask, dropout, causal, lse).o;
  return at::linear(merge_heads(o, batch_first), out_w, opt(out_b));
}

// need_weights=True, as F.multi_head_attention_forward computes it: scores of the query scaled by
// 1/sqrt(head size) plus the mask, softmax (a fully masked row is NaN there, as in torch), dropout
// on the weights, the weights times V; the weights [B, H, L, S] returned after dropout, averaged
// over the heads or per head. The same ops in the same order (one 4-D matmul where torch runs bmm
// over B * H), so dropout draws the same mask from the same seed.
std::tuple<at::Tensor, at::Tensor> with_weights(const std::array<const at::Tensor*, 3>& in, int64_t heads,
                                                const Proj& w, const at::Tensor& out_w, const at::Tensor& out_b,
                                                bool batch_first, double dropout, const at::Tensor& mask,
                                                bool average) {
  const auto [q, k, v] = projected(in, heads, w, batch_first);
  at::Tensor scores = at::matmul(q * std::sqrt(1.0 / static_cast<double>(q.size(3))), k.transpose(-2, -1));
  if (mask.defined()) scores = scores + mask;
  at::Tensor weights = at::softmax(scores, -1);
  if (dropout > 0.0) weights = at::dropout(weights, dropout, true);
  const at::Tensor y = at::linear(merge_heads(at::matmul(weights, v), batch_first), out_w, opt(out_b));
  return {y, average ? weights.mean(1) : weights};
}

// ---- the op ----------------------------------------------------------------------------------------

// The output, and the weights where the call asks for them.
struct Result {
  at::Tensor y, weights;
};

// The op with core `named`: the masks checked and applied as torch's module does (`module`: the
// causal hint without a mask is torch's error, as for the module; else the op's causal call).
// `refusable`: where that core does not take the input, undefined tensors instead of an error
// (dispatch then runs something else).
Result run_op(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t num_heads,
              const Proj& given, const at::Tensor& out_proj_weight, const at::Tensor& out_proj_bias, bool batch_first,
              bool is_causal, double dropout_p, const at::Tensor& kpm, const at::Tensor& am, mha::Weights weights,
              bool module, Core named, std::string_view core_name, bool refusable) {
  const std::string problem = shape_problem(query, key, value, num_heads, given, batch_first);
  TORCH_CHECK(problem.empty(), "hfnn.multi_head_attention: ", problem);
  const int64_t batch = batch_of(query, batch_first), heads = num_heads;
  const int64_t q_len = length_of(query, batch_first), kv_len = length_of(key, batch_first);
  MaskSpec spec;
  const MaskIssue issue = check_masks(query, batch, q_len, kv_len, heads, kpm, am, is_causal, weights, module, spec);
  TORCH_CHECK(issue == MaskIssue::kNone, issue == MaskIssue::kInvalid ? "" : "hfnn.multi_head_attention: ",
              spec.message);
  // Autocast: cast once, keeping which of query, key and value are the same tensor.
  const c10::DeviceType device = query.device().type();
  const bool autocast = autocast_on(device);
  const at::ScalarType dtype = compute_dtype(query);
  auto cast = [&](const at::Tensor& t) { return autocast && t.defined() ? at::autocast::cached_cast(dtype, t, device) : t; };
  const at::Tensor cq = cast(query);
  const at::Tensor ck = key.is_same(query) ? cq : cast(key);
  const at::Tensor cv = value.is_same(key) ? ck : value.is_same(query) ? cq : cast(value);
  const Proj w{cast(given.in_w), cast(given.q_w), cast(given.k_w), cast(given.v_w), cast(given.in_b)};
  const at::Tensor out_w = cast(out_proj_weight), out_b = cast(out_proj_bias);
  const std::array<const at::Tensor*, 3> in{&cq, &ck, &cv};

  bool grad = false;
  if (at::GradMode::is_enabled())
    for (const at::Tensor* t : {&cq, &ck, &cv, &w.in_w, &w.q_w, &w.k_w, &w.v_w, &w.in_b, &out_w, &out_b})
      grad = grad || (t->defined() && t->requires_grad());
  const at::Tensor mask = build_mask(spec, kpm, am, query.scalar_type(), dtype, batch, heads, q_len, kv_len);
  const bool causal = spec.masking.causal;
  const at::Tensor& w0 = w.separate() ? w.q_w : w.in_w;
  const Plan p = plan(in, num_heads, batch_first, cq.options().dtype(w0.scalar_type()), w.separate());
  // torch's checks read requires_grad (some kernels have no backward for some head sizes on some
  // GPUs): the buffers' views do not carry it, aliases that do are asked instead.
  std::array<at::Tensor, 3> views{p.q, p.k, p.v};
  if (grad)
    for (at::Tensor& t : views) t = t.detach().requires_grad_();
  const bool takes_weights = weights != mha::Weights::kNone;
  const bool takes = (!w.separate() || composite_ok(named)) &&
                     core_takes(named, views[0], views[1], views[2], mask, dropout_p, causal, takes_weights);
  if (!takes && refusable) return {};
  TORCH_CHECK(takes, "hfnn.multi_head_attention: core ", std::string(core_name), " does not take this input (dtype ",
              p.q.scalar_type(), ", head size ", p.q.size(3), ", ", query.device(), mask.defined() ? ", a mask" : "",
              takes_weights ? ", need_weights" : "", "); hfnn.multi_head_attention_supports says which do");
  if (takes_weights) {
    auto [y, attn] = with_weights(in, num_heads, w, out_w, out_b, batch_first, dropout_p, mask,
                                  weights == mha::Weights::kMean);
    return {y, attn};
  }
  const Core core = resolve(named, views[0], views[1], views[2], mask, dropout_p, causal);
  if (!has_node(core) || w.separate())
    return {composite(in, num_heads, w, out_w, out_b, core, batch_first, causal, dropout_p, mask, grad)};
  if (!grad)
    return {run_forward(p, in, w.in_w, w.in_b, out_w, out_b, core, batch_first, causal, dropout_p, mask, false).y};
  return {MhaFunction::apply(cq, ck, cv, w.in_w, opt(w.in_b), out_w, opt(out_b), p, core, batch_first, causal,
                             dropout_p, opt(mask))};
}

std::string_view view_of(c10::string_view s) { return {s.data(), s.size()}; }

at::Tensor multi_head_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                int64_t num_heads, const std::optional<at::Tensor>& in_proj_weight,
                                const std::optional<at::Tensor>& in_proj_bias, const at::Tensor& out_proj_weight,
                                const std::optional<at::Tensor>& out_proj_bias, bool batch_first, bool is_causal,
                                double dropout_p, c10::string_view core_name,
                                const std::optional<at::Tensor>& key_padding_mask,
                                const std::optional<at::Tensor>& attn_mask,
                                const std::optional<at::Tensor>& q_proj_weight,
                                const std::optional<at::Tensor>& k_proj_weight,
                                const std::optional<at::Tensor>& v_proj_weight) {
  const std::string_view name = view_of(core_name);
  return run_op(query, key, value, num_heads,
                proj_of(in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight), out_proj_weight,
                out_proj_bias.value_or(at::Tensor()), batch_first, is_causal, dropout_p,
                key_padding_mask.value_or(at::Tensor()), attn_mask.value_or(at::Tensor()), mha::Weights::kNone, false,
                core_or_throw(name), name, false)
      .y;
}

std::tuple<at::Tensor, at::Tensor> multi_head_attention_with_weights(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t num_heads,
    const std::optional<at::Tensor>& in_proj_weight, const std::optional<at::Tensor>& in_proj_bias,
    const at::Tensor& out_proj_weight, const std::optional<at::Tensor>& out_proj_bias, bool batch_first,
    bool is_causal, double dropout_p, c10::string_view core_name, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& q_proj_weight,
    const std::optional<at::Tensor>& k_proj_weight, const std::optional<at::Tensor>& v_proj_weight,
    bool average_attn_weights) {
  const std::string_view name = view_of(core_name);
  Result r = run_op(query, key, value, num_heads,
                    proj_of(in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight),
                    out_proj_weight, out_proj_bias.value_or(at::Tensor()), batch_first, is_causal, dropout_p,
                    key_padding_mask.value_or(at::Tensor()), attn_mask.value_or(at::Tensor()),
                    weights_of(true, average_attn_weights), false, core_or_throw(name), name, false);
  return {r.y, r.weights};
}

bool multi_head_attention_supports(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                   int64_t num_heads, bool batch_first, bool is_causal, double dropout_p,
                                   c10::string_view core_name, const std::optional<at::Tensor>& key_padding_mask,
                                   const std::optional<at::Tensor>& attn_mask, bool need_weights,
                                   bool separate_proj) {
  const auto core = parse_core(view_of(core_name));
  if (!core || query.dim() != 3 || key.dim() != 3 || value.dim() != 3 || num_heads <= 0) return false;
  const int64_t embed = query.size(2);
  if (embed % num_heads != 0 || key.size(0) != value.size(0) || key.size(1) != value.size(1) ||
      batch_of(key, batch_first) != batch_of(query, batch_first))
    return false;
  if (!separate_proj && (key.size(2) != embed || value.size(2) != embed)) return false;
  const at::Tensor kpm = key_padding_mask.value_or(at::Tensor()), am = attn_mask.value_or(at::Tensor());
  const int64_t batch = batch_of(query, batch_first), q_len = length_of(query, batch_first);
  const int64_t kv_len = length_of(key, batch_first);
  MaskSpec spec;
  const mha::Weights weights = weights_of(need_weights, true);
  if (check_masks(query, batch, q_len, kv_len, num_heads, kpm, am, is_causal, weights, false, spec) !=
      MaskIssue::kNone)
    return false;
  if (*core == Core::kTorch || *core == Core::kMath) return true;
  if (need_weights || (separate_proj && !composite_ok(*core))) return false;
  // The views the op would build: plan() on meta tensors (same identities of query, key and value,
  // so the same GEMMs and strides), then each view's geometry (sizes, strides, offset) over device
  // memory of its extent, for torch's checks, which read dtype, sizes, strides, alignment and
  // device; and the mask the op would build. No attention runs.
  auto meta = [](const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kMeta)); };
  const at::Tensor mq = meta(query);
  const at::Tensor mk = key.is_same(query) ? mq : meta(key);
  const at::Tensor mv = value.is_same(key) ? mk : value.is_same(query) ? mq : meta(value);
  const Plan p = plan({&mq, &mk, &mv}, num_heads, batch_first, mq.options(), separate_proj);
  // A training call's views require grad (torch's checks read it): assumed wherever grad mode is on.
  auto on_device = [&](const at::Tensor& view, const at::Tensor& like) {
    const int64_t extent = static_cast<int64_t>(view.storage().nbytes()) / view.element_size();
    at::Tensor t = at::empty({extent}, like.options()).as_strided(view.sizes(), view.strides(), view.storage_offset());
    return at::GradMode::is_enabled() && t.is_floating_point() ? t.detach().requires_grad_() : t;
  };
  const at::Tensor mask =
      build_mask(spec, kpm, am, query.scalar_type(), query.scalar_type(), batch, num_heads, q_len, kv_len);
  return core_takes(*core, on_device(p.q, query), on_device(p.k, query), on_device(p.v, query), mask, dropout_p,
                    spec.masking.causal, false);
}

// ---- HFNN_DISPATCH_DB ------------------------------------------------------------------------------
// Every nn.MultiheadAttention call under HFNN_DISPATCH_DB (python/hfnn/_families/multihead_attention.py
// wraps its forward) and every hfnn.nn.MultiheadAttention call while a table is loaded comes here
// first: one op call that checks what the op takes, packs the call's key, looks its winner up in
// the table (a hash lookup; the GPU resolved once per device) and counts, then runs the winner's
// core, or returns an undefined tensor (None in Python): the caller runs torch's module path. No
// text is built and nothing but the counters is written on the way.

int family_index() {
  static const int family = dispatch::Runtime::get().family_index(mha::kFamily.op);
  return family;
}

// The core of each variant, by the index the table stores (mha::kCores is kFamily's variant order).
const std::array<Core, mha::kCores.size()>& variant_cores() {
  static const std::array<Core, mha::kCores.size()> cores = [] {
    std::array<Core, mha::kCores.size()> out{};
    for (size_t i = 0; i < out.size(); ++i) out[i] = core_or_throw(mha::kCores[i]);
    return out;
  }();
  return cores;
}

#if HFNN_TORCH_CUDA
dispatch::Gpu device_gpu(int device) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device);
  return {props->name, fmt::format("{}.{}", props->major, props->minor), props->multiProcessorCount};
}
#endif

// Which of query, key and value are one tensor, as the key records it.
mha::Inputs inputs_of(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  if (query.is_same(key) && key.is_same(value)) return mha::Inputs::kSelf;
  return key.is_same(value) ? mha::Inputs::kSharedKv : mha::Inputs::kSeparate;
}

// What a call ran: (output, weights, "") where hfnn's op ran it, else (None, None, why): the caller
// runs torch's module path. `untuned_runs_op`: hfnn.nn.MultiheadAttention's calls (to_hfnn), whose
// keys without a winner keep running the op with torch's pick of core, as without a table, and
// whose invalid masks raise torch's message here; nn.MultiheadAttention's (the wrapper) run torch's
// module there, exactly as without hfnn (torch then raises its own errors). `count`: the call is
// counted in hfnn.dispatch_stats() and asks the table (HFNN_DISPATCH_DB); without it (hfnn's module,
// no table) it runs the op with torch's pick, or says why not.
std::tuple<at::Tensor, at::Tensor, std::string> multi_head_attention_dispatch(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t num_heads,
    const std::optional<at::Tensor>& in_proj_weight, const std::optional<at::Tensor>& in_proj_bias,
    const at::Tensor& out_proj_weight, const std::optional<at::Tensor>& out_proj_bias, bool batch_first,
    bool is_causal, double dropout_p, bool need_weights, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& attn_mask, bool extra_kv, bool untuned_runs_op, bool average_attn_weights,
    const std::optional<at::Tensor>& q_proj_weight, const std::optional<at::Tensor>& k_proj_weight,
    const std::optional<at::Tensor>& v_proj_weight, bool count) {
  auto& rt = dispatch::Runtime::get();
  const int family = family_index();
  using Out = std::tuple<at::Tensor, at::Tensor, std::string>;
  auto torch_module = [&](dispatch::Fallback why) {
    if (count) rt.count_fallback(family, mha::kTrain, why);
    return Out{at::Tensor(), at::Tensor(), dispatch::fallback_name(why)};
  };
  // What the op does not compute as torch's module would.
  if (extra_kv) return torch_module(dispatch::Fallback::kModuleSettings);
  if (query.dim() != 3 || key.dim() != 3 || value.dim() != 3) return torch_module(dispatch::Fallback::kUnbatched);
  if (query.is_nested() || key.is_nested() || value.is_nested()) return torch_module(dispatch::Fallback::kNested);
  const Proj w = proj_of(in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight);
  if (!shape_problem(query, key, value, num_heads, w, batch_first).empty())
    return torch_module(dispatch::Fallback::kUnsupported);
  const int64_t batch = batch_of(query, batch_first), q_len = length_of(query, batch_first);
  const int64_t kv_len = length_of(key, batch_first);
  const at::Tensor kpm = key_padding_mask.value_or(at::Tensor()), am = attn_mask.value_or(at::Tensor());
  const mha::Weights weights = weights_of(need_weights, average_attn_weights);
  MaskSpec spec;
  switch (check_masks(query, batch, q_len, kv_len, num_heads, kpm, am, is_causal, weights, true, spec)) {
    case MaskIssue::kNone: break;
    case MaskIssue::kInvalid:
      // torch's module raises its own error (some are AssertionErrors, which an op cannot raise): it
      // runs, for hfnn's module too, and the call is not counted.
      return Out{at::Tensor(), at::Tensor(), dispatch::fallback_name(dispatch::Fallback::kMask)};
    case MaskIssue::kNotTaken: return torch_module(dispatch::Fallback::kMask);
    case MaskIssue::kGrad: return torch_module(dispatch::Fallback::kMaskGrad);
  }
  auto run = [&](Core core, std::string_view name, bool refusable) {
    Result r = run_op(query, key, value, num_heads, w, out_proj_weight, out_proj_bias.value_or(at::Tensor()),
                      batch_first, is_causal, dropout_p, kpm, am, weights, true, core, name, refusable);
    return Out{r.y, r.weights, ""};
  };
  if (!count) return run(Core::kTorch, "", false);
  // Not tuned here: torch's module, or for hfnn's module the op with torch's pick.
  auto untuned = [&](dispatch::Fallback why) {
    rt.count_fallback(family, mha::kTrain, why);
    return untuned_runs_op ? run(Core::kTorch, "", false) : Out{at::Tensor(), at::Tensor(), dispatch::fallback_name(why)};
  };
  if (!query.is_cuda()) return untuned(dispatch::Fallback::kCpuTensor);
  const auto dtype = kernel_dtype(compute_dtype(query));
  if (!dtype) return untuned(dispatch::Fallback::kUnsupported);
#if HFNN_TORCH_CUDA
  const families::PackedKey packed =
      mha::pack(batch, q_len, kv_len, query.size(2), num_heads, *dtype, batch_first, spec.masking.causal,
                inputs_of(query, key, value), w.in_b.defined(), dropout_p > 0, spec.padding, spec.masking.mask,
                weights, w.separate() ? key.size(2) : 0, w.separate() ? value.size(2) : 0);
  const int device = query.get_device();
  const dispatch::WinnerMap* map = rt.for_device(family, device, [&] { return device_gpu(device); });
  dispatch::Pick pick;
  if (map) {
    const auto it = map->find(packed);
    if (it != map->end()) pick = it->second[mha::kTrain];
  }
  if (pick.index == dispatch::Pick::kTorch) return torch_module(dispatch::Fallback::kTorchWon);
  if (pick.index >= 0) {
    const auto& cores = variant_cores();
    const std::string_view name = static_cast<size_t>(pick.index) < cores.size() ? mha::kCores[pick.index] : "?";
    Out out;
    if (static_cast<size_t>(pick.index) < cores.size()) {
      try {
        out = run(cores[pick.index], name, true);
      } catch (const c10::Error& e) {
        // The core failed where torch's checks said it runs (a launch refused, memory): torch's
        // module runs the call, as for LayerNorm's failed launches; HFNN_STRICT=1 makes it an error.
        if (rt.strict()) throw;
        rt.warn_once(fmt::format("mha:failed:{}", name),
                     fmt::format("the tuned attention core {} failed ({}); that call ran torch's module",
                                 name, e.what_without_backtrace()));
        return torch_module(dispatch::Fallback::kLaunchFailed);
      }
    }
    if (std::get<0>(out).defined()) {
      rt.count_variant(family, mha::kTrain, pick.index);
      return out;
    }
    rt.warn_once(fmt::format("mha:refused:{}", name),
                 fmt::format("the tuned attention core {} does not take a call of its key (dtype, strides or the "
                             "torch.backends.cuda switches); those calls run torch's module",
                             name));
    return torch_module(dispatch::Fallback::kVariantRefused);
  }
  return untuned(map ? dispatch::Fallback::kNotTuned : dispatch::Fallback::kNoTable);
#else
  return untuned(dispatch::Fallback::kNoTable);
#endif
}

// For tests: cuBLASLt heuristic queries and descriptor sets made so far in this process (both stay
// put while calls repeat their shapes); zeros in a build without CUDA.
std::vector<int64_t> gemm_cache_stats() {
#if HFNN_TORCH_CUDA
  return {kernels::gemm::heuristic_queries(), kernels::gemm::descriptor_sets()};
#else
  return {0, 0};
#endif
}

}  // namespace
}  // namespace hfnn::attention

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  // (None, None, why) where torch's module path is to run the call; (output, weights or None, "").
  m.def(
      "multi_head_attention_dispatch(Tensor query, Tensor key, Tensor value, int num_heads, Tensor? in_proj_weight, "
      "Tensor? in_proj_bias, Tensor out_proj_weight, Tensor? out_proj_bias, bool batch_first, bool is_causal, "
      "float dropout_p, bool need_weights, Tensor? key_padding_mask, Tensor? attn_mask, bool extra_kv, "
      "bool untuned_runs_op, bool average_attn_weights=True, Tensor? q_proj_weight=None, "
      "Tensor? k_proj_weight=None, Tensor? v_proj_weight=None, bool count=True) -> (Tensor, Tensor, str)");
  m.impl("multi_head_attention_dispatch", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(hfnn::attention::multi_head_attention_dispatch));
  m.def(
      "multi_head_attention(Tensor query, Tensor key, Tensor value, int num_heads, Tensor? in_proj_weight, "
      "Tensor? in_proj_bias, Tensor out_proj_weight, Tensor? out_proj_bias, bool batch_first=False, "
      "bool is_causal=False, float dropout_p=0.0, str core='', Tensor? key_padding_mask=None, "
      "Tensor? attn_mask=None, Tensor? q_proj_weight=None, Tensor? k_proj_weight=None, "
      "Tensor? v_proj_weight=None) -> Tensor");
  m.impl("multi_head_attention", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(hfnn::attention::multi_head_attention));
  m.def(
      "multi_head_attention_with_weights(Tensor query, Tensor key, Tensor value, int num_heads, "
      "Tensor? in_proj_weight, Tensor? in_proj_bias, Tensor out_proj_weight, Tensor? out_proj_bias, "
      "bool batch_first=False, bool is_causal=False, float dropout_p=0.0, str core='', "
      "Tensor? key_padding_mask=None, Tensor? attn_mask=None, Tensor? q_proj_weight=None, "
      "Tensor? k_proj_weight=None, Tensor? v_proj_weight=None, bool average_attn_weights=True) -> (Tensor, Tensor)");
  m.impl("multi_head_attention_with_weights", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(hfnn::attention::multi_head_attention_with_weights));
  m.def(
      "multi_head_attention_supports(Tensor query, Tensor key, Tensor value, int num_heads, bool batch_first, "
      "bool is_causal, float dropout_p, str core, Tensor? key_padding_mask=None, Tensor? attn_mask=None, "
      "bool need_weights=False, bool separate_proj=False) -> bool");
  m.impl("multi_head_attention_supports", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(hfnn::attention::multi_head_attention_supports));
  m.def("_gemm_cache_stats() -> int[]", TORCH_FN(hfnn::attention::gemm_cache_stats));
}
