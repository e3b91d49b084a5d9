// hfnn::multi_head_attention: nn.MultiheadAttention's forward (no masks beyond the causal hint, no
// returned weights) as one C++ op, so a training step pays one Python call a module instead of
// F.multi_head_attention_forward's checks, reshapes and copies.
//
// What it does differently from torch's module path:
//   - the input projection is one GEMM with its bias where query, key and value are one tensor
//     (self-attention), and its [.., 3E] output is read in place as Q, K and V: strided [B, H, L, Dh]
//     views, which the fused attention cores take as they are (torch copies Q, K and V into
//     [B*H, L, Dh] first);
//   - the core is a named choice among torch's SDPA kernels, called at the ATen level: "sdpa_flash",
//     "sdpa_efficient", "sdpa_cudnn", "sdpa_math", or "" for torch's own pick
//     (at::scaled_dot_product_attention): the tuner picks per shape where torch's order is not the
//     fastest;
//   - the output projection reads the core's output in place where its layout is [B, L, H, Dh]
//     (flash and efficient write that), instead of permuting it into a contiguous copy.
// It is CompositeImplicitAutograd: autograd differentiates the ATen ops it calls (their backward
// kernels are torch's, in C++), and autocast applies to each of them as in torch's module.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>

#if HFNN_TORCH_CUDA
#include <ATen/native/transformers/cuda/sdp_utils.h>
#endif

namespace hfnn::attention {
namespace {

enum class Core { kTorch, kFlash, kEfficient, kCudnn, kMath };

std::optional<Core> parse_core(std::string_view name) {
  if (name.empty()) return Core::kTorch;
  if (name == "sdpa_flash") return Core::kFlash;
  if (name == "sdpa_efficient") return Core::kEfficient;
  if (name == "sdpa_cudnn") return Core::kCudnn;
  if (name == "sdpa_math") return Core::kMath;
  return std::nullopt;
}

Core core_or_throw(std::string_view name) {
  const auto core = parse_core(name);
  TORCH_CHECK(core.has_value(), "hfnn.multi_head_attention: unknown core '", std::string(name),
              "' (sdpa_flash, sdpa_efficient, sdpa_cudnn, sdpa_math, or '' for torch's choice)");
  return *core;
}

// Whether `core` runs these [B, H, L, Dh] views: torch's own checks for its fused kernels (dtype,
// head size, GPU, strides, the user's torch.backends.cuda.enable_*_sdp switches).
bool core_takes(Core core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                bool causal) {
  if (core == Core::kTorch || core == Core::kMath) return true;
#if HFNN_TORCH_CUDA
  if (!q.is_cuda()) return false;
  const sdp::sdp_params params{q, k, v, std::nullopt, dropout, causal, false};
  switch (core) {
    // can_use_flash_attention passes any head size: torch's SDPA pads it to a multiple of 8 before
    // calling the kernel, which this op (calling the kernel itself) does not.
    case Core::kFlash: return q.size(-1) % 8 == 0 && sdp::can_use_flash_attention(params, false);
    case Core::kEfficient: return sdp::can_use_mem_efficient_attention(params, false);
    case Core::kCudnn: return sdp::can_use_cudnn_attention(params, false);
    default: return false;
  }
#else
  (void)q, (void)k, (void)v, (void)dropout, (void)causal;
  return false;
#endif
}

at::Tensor run_core(Core core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                    bool causal) {
  // The fused kernels save the log-sum-exp only where a backward will need it, as torch's SDPA does.
  const bool lse = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  switch (core) {
    case Core::kFlash: return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, dropout, causal));
    case Core::kEfficient:
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, lse, dropout, causal));
    case Core::kCudnn:
      return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, lse, dropout, causal));
    case Core::kMath: return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, std::nullopt, dropout, causal));
    case Core::kTorch: break;
  }
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, dropout, causal);
}

// [L, B, n*E] (or [B, L, n*E] with batch_first) -> n views [B, H, L, Dh], no copy.
std::vector<at::Tensor> split_heads(const at::Tensor& proj, int64_t parts, int64_t heads, bool batch_first) {
  const int64_t d0 = proj.size(0), d1 = proj.size(1);
  const int64_t head_dim = proj.size(2) / parts / heads;
  // unbind, not one select a part: its backward stacks the parts' gradients into one packed
  // [.., parts, H, Dh] buffer, where each select's would be a zero-filled full-size buffer, summed.
  std::vector<at::Tensor> out = proj.view({d0, d1, parts, heads, head_dim}).unbind(2);  // [d0, d1, H, Dh] each
  for (at::Tensor& t : out) t = batch_first ? t.transpose(1, 2) : t.permute({1, 2, 0, 3});
  return out;
}

struct Heads {
  at::Tensor q, k, v;
};

void check_inputs(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t heads,
                  const at::Tensor& in_w) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "hfnn.multi_head_attention: query, key and value must be 3-D (batched); got ", query.dim(), "-D, ",
              key.dim(), "-D and ", value.dim(), "-D");
  const int64_t embed = query.size(2);
  TORCH_CHECK(heads > 0 && embed % heads == 0, "hfnn.multi_head_attention: embed_dim ", embed,
              " is not divisible by num_heads ", heads);
  TORCH_CHECK(key.size(2) == embed && value.size(2) == embed,
              "hfnn.multi_head_attention: key and value must have embed_dim ", embed,
              " (kdim/vdim run torch's module path)");
  TORCH_CHECK(in_w.dim() == 2 && in_w.size(0) == 3 * embed && in_w.size(1) == embed,
              "hfnn.multi_head_attention: in_proj_weight must be [3 * embed_dim, embed_dim]");
}

Heads project(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t heads,
              const at::Tensor& in_w, const std::optional<at::Tensor>& in_b, bool batch_first) {
  const int64_t embed = query.size(2);
  if (query.is_same(key) && key.is_same(value)) {  // self-attention: one GEMM, read in place
    const auto qkv = split_heads(at::linear(query, in_w, in_b), 3, heads, batch_first);
    return {qkv[0], qkv[1], qkv[2]};
  }
  const auto w = in_w.split(embed);
  std::vector<at::Tensor> b;
  if (in_b) b = in_b->split(embed);
  auto bias = [&](int64_t i) { return in_b ? std::optional<at::Tensor>(b[i]) : std::nullopt; };
  const at::Tensor q = split_heads(at::linear(query, w[0], bias(0)), 1, heads, batch_first)[0];
  if (key.is_same(value)) {  // encoder-decoder attention: K and V from one GEMM
    const at::Tensor w_kv = in_w.narrow(0, embed, 2 * embed);
    const std::optional<at::Tensor> b_kv = in_b ? std::optional<at::Tensor>(in_b->narrow(0, embed, 2 * embed)) : std::nullopt;
    const auto kv = split_heads(at::linear(key, w_kv, b_kv), 2, heads, batch_first);
    return {q, kv[0], kv[1]};
  }
  return {q, split_heads(at::linear(key, w[1], bias(1)), 1, heads, batch_first)[0],
          split_heads(at::linear(value, w[2], bias(2)), 1, heads, batch_first)[0]};
}

at::Tensor multi_head_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                int64_t num_heads, const at::Tensor& in_proj_weight,
                                const std::optional<at::Tensor>& in_proj_bias, const at::Tensor& out_proj_weight,
                                const std::optional<at::Tensor>& out_proj_bias, bool batch_first, bool is_causal,
                                double dropout_p, c10::string_view core_name) {
  const Core core = core_or_throw(std::string_view(core_name.data(), core_name.size()));
  check_inputs(query, key, value, num_heads, in_proj_weight);
  const Heads h = project(query, key, value, num_heads, in_proj_weight, in_proj_bias, batch_first);
  TORCH_CHECK(core_takes(core, h.q, h.k, h.v, dropout_p, is_causal), "hfnn.multi_head_attention: core ",
              std::string(core_name), " does not take this input (dtype ", query.scalar_type(), ", head size ",
              h.q.size(3), ", ", query.device(), "); hfnn.multi_head_attention_supports says which do");
  const at::Tensor o = run_core(core, h.q, h.k, h.v, dropout_p, is_causal);  // [B, H, L, Dh]
  const int64_t embed = query.size(2);
  // Back to the input's layout; a view where the core wrote [B, L, H, Dh] (batch_first).
  const at::Tensor merged = batch_first ? o.transpose(1, 2).reshape({o.size(0), o.size(2), embed})
                                        : o.permute({2, 0, 1, 3}).reshape({o.size(2), o.size(0), embed});
  return at::linear(merged, out_proj_weight, out_proj_bias);
}

bool multi_head_attention_supports(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                   int64_t num_heads, bool batch_first, bool is_causal, double dropout_p,
                                   c10::string_view core_name) {
  const auto core = parse_core(std::string_view(core_name.data(), core_name.size()));
  if (!core || query.dim() != 3 || key.dim() != 3 || value.dim() != 3 || num_heads <= 0) return false;
  const int64_t embed = query.size(2);
  if (embed % num_heads != 0 || key.size(2) != embed || value.size(2) != embed) return false;
  if (*core == Core::kTorch || *core == Core::kMath) return true;
  // The views the op would build: project() on meta tensors (same identities of query, key and
  // value, so the same GEMMs and strides), then each view's geometry (sizes, strides, offset) over
  // device memory of its extent, for torch's checks, which read dtype, sizes, strides, alignment and
  // device. Nothing runs.
  auto meta = [](const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kMeta)); };
  const at::Tensor mq = meta(query);
  const at::Tensor mk = key.is_same(query) ? mq : meta(key);
  const at::Tensor mv = value.is_same(key) ? mk : value.is_same(query) ? mq : meta(value);
  const at::Tensor w = at::empty({3 * embed, embed}, query.options().device(at::kMeta));
  const Heads h = project(mq, mk, mv, num_heads, w, std::nullopt, batch_first);
  auto on_device = [&](const at::Tensor& view, const at::Tensor& like) {
    const int64_t extent = static_cast<int64_t>(view.storage().nbytes()) / view.element_size();
    return at::empty({extent}, like.options()).as_strided(view.sizes(), view.strides(), view.storage_offset());
  };
  return core_takes(*core, on_device(h.q, query), on_device(h.k, key), on_device(h.v, value), dropout_p, is_causal);
}

}  // namespace
}  // namespace hfnn::attention

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def(
      "multi_head_attention(Tensor query, Tensor key, Tensor value, int num_heads, Tensor in_proj_weight, "
      "Tensor? in_proj_bias, Tensor out_proj_weight, Tensor? out_proj_bias, bool batch_first=False, "
      "bool is_causal=False, float dropout_p=0.0, str core='') -> Tensor");
  m.impl("multi_head_attention", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(hfnn::attention::multi_head_attention));
  m.def(
      "multi_head_attention_supports(Tensor query, Tensor key, Tensor value, int num_heads, bool batch_first, "
      "bool is_causal, float dropout_p, str core) -> bool");
  m.impl("multi_head_attention_supports", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(hfnn::attention::multi_head_attention_supports));
}
