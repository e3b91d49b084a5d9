#include "kernels/multihead_attention/multihead_attention_family.h"

#include <array>
#include <string_view>
#include <type_traits>

namespace hfnn::kernels::multihead_attention {
namespace {

constexpr std::array<std::string_view, 3> kInputNames = {"self", "kv", "qkv"};

std::string_view input_name(Inputs i) { return kInputNames[static_cast<size_t>(i)]; }

std::optional<Inputs> inputs_from(std::string_view name) {
  for (size_t i = 0; i < kInputNames.size(); ++i)
    if (kInputNames[i] == name) return static_cast<Inputs>(i);
  return std::nullopt;
}

using families::Settings;

std::optional<Settings> settings(std::string_view text) { return families::parse_settings(text); }
std::optional<int64_t> number(const Settings& s, std::string_view name) { return families::setting_number(s, name); }
std::optional<bool> flag(const Settings& s, std::string_view name, std::optional<bool> fallback = std::nullopt) {
  return families::setting_flag(s, name, fallback);
}

// The mask kinds' and weights' names in keys and recorded settings (index: the enum's value; "" for
// none, which a key does not write).
constexpr std::array<std::string_view, 3> kPaddingNames = {"", "bool", "float"};
constexpr std::array<std::string_view, 5> kMaskNames = {"", "bool2d", "float2d", "bool3d", "float3d"};
constexpr std::array<std::string_view, 3> kWeightNames = {"", "mean", "per_head"};

template <typename E, size_t N>
std::optional<E> named(const std::array<std::string_view, N>& names, std::string_view name) {
  for (size_t i = 1; i < N; ++i)
    if (names[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

template <size_t N, typename E>
std::string_view name_of(const std::array<std::string_view, N>& names, E e) {
  return names[static_cast<size_t>(e)];
}

bool valid(const Key& k) {
  return k.batch > 0 && k.q_len > 0 && k.kv_len > 0 && k.heads > 0 && k.embed > 0 && k.embed % k.heads == 0 &&
         k.heads < (int64_t{1} << 23) && (k.inputs != Inputs::kSelf || k.q_len == k.kv_len) &&
         (k.kdim == 0) == (k.vdim == 0) && k.kdim >= 0 && k.kdim <= kMaxKvDim && k.vdim >= 0 &&
         k.vdim <= kMaxKvDim && (k.kdim == 0 || k.inputs != Inputs::kSelf) && !(k.causal && k.mask != AttnMask::kNone);
}

// A recorded mask setting: "0" none, a kind's name, "1" (profiles from before the kinds) or "other"
// (a mask the op does not take): nullopt for those two, and for anything else.
template <typename E, size_t N>
std::optional<E> recorded_mask(const Settings& s, std::string_view name, const std::array<std::string_view, N>& names,
                               bool& unknown) {
  const auto it = s.find(name);
  if (it == s.end()) return std::nullopt;
  if (it->second == "0") return static_cast<E>(0);
  if (const auto kind = named<E>(names, it->second)) return kind;
  unknown = it->second == "1" || it->second == "other";
  return std::nullopt;
}

}  // namespace

std::string Key::text() const {
  std::string out = "B=" + std::to_string(batch) + ",L=" + std::to_string(q_len) + ",S=" + std::to_string(kv_len) +
                    ",E=" + std::to_string(embed) + ",H=" + std::to_string(heads) +
                    ",batch_first=" + (batch_first ? "1" : "0") + ",causal=" + (causal ? "1" : "0") +
                    ",inputs=" + std::string(input_name(inputs)) + ",bias=" + (bias ? "1" : "0") +
                    ",dropout=" + (dropout ? "1" : "0");
  if (padding != PaddingMask::kNone) out += ",key_padding_mask=" + std::string(name_of(kPaddingNames, padding));
  if (mask != AttnMask::kNone) out += ",attn_mask=" + std::string(name_of(kMaskNames, mask));
  if (weights != Weights::kNone) out += ",weights=" + std::string(name_of(kWeightNames, weights));
  if (kdim) out += ",kdim=" + std::to_string(kdim) + ",vdim=" + std::to_string(vdim);
  return out;
}

std::optional<Key> key_of(const std::string& shape, const std::string& flags) {
  const auto dims = families::parse_dims(shape);
  const auto s = settings(flags);
  if (!dims || !s || dims->size() != 3) return std::nullopt;  // unbatched calls run torch's module
  const auto embed = number(*s, "embed"), heads = number(*s, "heads"), kv_len = number(*s, "kv_len");
  const auto batch_first = flag(*s, "batch_first"), need_weights = flag(*s, "need_weights");
  const auto causal = flag(*s, "causal");
  const auto bias = flag(*s, "bias", true), kdim = flag(*s, "kdim", false), bias_kv = flag(*s, "bias_kv", false);
  const auto dropout = flag(*s, "dropout", false), average = flag(*s, "average", true);
  bool unknown_mask = false, unknown_padding = false;
  const auto attn_mask = recorded_mask<AttnMask>(*s, "attn_mask", kMaskNames, unknown_mask);
  const auto padding = recorded_mask<PaddingMask>(*s, "key_padding_mask", kPaddingNames, unknown_padding);
  if (!embed || !heads || !kv_len || !batch_first || !need_weights || (!attn_mask && !unknown_mask) ||
      (!padding && !unknown_padding) || !causal || !bias || !kdim || !bias_kv || !dropout || !average)
    return std::nullopt;
  // What the op does not take: torch's module keeps these calls. The masks resolve as torch's module
  // applies them: a mask with the causal hint and nothing else is dropped for the hint (even one the
  // op would not take: torch's module drops it too).
  const Weights weights = *need_weights ? (*average ? Weights::kMean : Weights::kPerHead) : Weights::kNone;
  if (unknown_padding || *bias_kv) return std::nullopt;
  // The hint without a mask is torch's module's error (and hfnn's module's).
  if (*causal && !unknown_mask && *attn_mask == AttnMask::kNone) return std::nullopt;
  const Masking masking = resolve_masking(*causal, *padding, unknown_mask ? AttnMask::kNone : *attn_mask, weights);
  if (unknown_mask && !masking.causal) return std::nullopt;
  Key k;
  k.padding = *padding;
  k.mask = masking.mask;
  k.weights = weights;
  if (*kdim) {
    const auto kdim_size = number(*s, "kdim_size"), vdim_size = number(*s, "vdim_size");
    if (!kdim_size || !vdim_size || *kdim_size == 0 || *vdim_size == 0) return std::nullopt;
    k.kdim = *kdim_size, k.vdim = *vdim_size;
  }
  k.batch = (*dims)[*batch_first ? 0 : 1];
  k.q_len = (*dims)[*batch_first ? 1 : 0];
  k.kv_len = *kv_len;
  k.embed = *embed;
  k.heads = *heads;
  k.batch_first = *batch_first;
  k.causal = masking.causal;
  k.bias = *bias;
  k.dropout = *dropout;
  if ((*dims)[2] != k.embed) return std::nullopt;
  if (s->count("inputs")) {
    const auto inputs = inputs_from(s->find("inputs")->second);
    if (!inputs) return std::nullopt;
    k.inputs = *inputs;
  } else {
    k.inputs = k.q_len == k.kv_len ? Inputs::kSelf : Inputs::kSharedKv;
  }
  if (!valid(k)) return std::nullopt;
  return k;
}

std::optional<Key> parse_key(const std::string& text) {
  const auto s = settings(text);
  if (!s) return std::nullopt;
  Key k;
  const auto b = number(*s, "B"), l = number(*s, "L"), kv = number(*s, "S"), e = number(*s, "E"), h = number(*s, "H");
  const auto bf = flag(*s, "batch_first"), causal = flag(*s, "causal"), bias = flag(*s, "bias");
  const auto dropout = flag(*s, "dropout");
  const auto it = s->find("inputs");
  const auto inputs = it == s->end() ? std::nullopt : inputs_from(it->second);
  if (!b || !l || !kv || !e || !h || !bf || !causal || !bias || !dropout || !inputs) return std::nullopt;
  k.batch = *b, k.q_len = *l, k.kv_len = *kv, k.embed = *e, k.heads = *h;
  k.batch_first = *bf, k.causal = *causal, k.bias = *bias, k.dropout = *dropout, k.inputs = *inputs;
  // The optional parts: absent is the default; present, a name the key writes (text() == text
  // below rejects a default written out, and every other spelling).
  auto optional = [&](std::string_view name, auto& field, const auto& names) {
    const auto at = s->find(name);
    if (at == s->end()) return true;
    const auto kind = named<std::remove_reference_t<decltype(field)>>(names, at->second);
    if (kind) field = *kind;
    return kind.has_value();
  };
  if (!optional("key_padding_mask", k.padding, kPaddingNames) || !optional("attn_mask", k.mask, kMaskNames) ||
      !optional("weights", k.weights, kWeightNames))
    return std::nullopt;
  if (s->count("kdim") || s->count("vdim")) {
    const auto kd = number(*s, "kdim"), vd = number(*s, "vdim");
    if (!kd || !vd) return std::nullopt;
    k.kdim = *kd, k.vdim = *vd;
  }
  if (!valid(k) || k.text() != text) return std::nullopt;  // the canonical text only: one key, one spelling
  return k;
}

namespace {

static_assert(families::kTrainPasses[kTrain] == "train", "kTrain indexes the passes");

std::string label(const Key& k) {
  std::string out = std::to_string(k.batch) + " x " + std::to_string(k.q_len);
  if (k.kv_len != k.q_len || k.inputs != Inputs::kSelf) out += " (kv " + std::to_string(k.kv_len) + ")";
  out += ", " + std::to_string(k.embed) + "/" + std::to_string(k.heads);
  if (k.inputs == Inputs::kSharedKv) out += " cross";
  if (k.inputs == Inputs::kSeparate) out += " q,k,v";
  if (k.causal) out += " causal";
  if (k.kdim) out += " kdim " + std::to_string(k.kdim) + "/vdim " + std::to_string(k.vdim);
  if (k.padding != PaddingMask::kNone) out += " pad(" + std::string(name_of(kPaddingNames, k.padding)) + ")";
  if (k.mask != AttnMask::kNone) out += " mask(" + std::string(name_of(kMaskNames, k.mask)) + ")";
  if (k.weights != Weights::kNone) out += " weights(" + std::string(name_of(kWeightNames, k.weights)) + ")";
  return out + families::settings_suffix(k.batch_first, k.bias, k.dropout);
}

double gate_tolerance(const std::string& dtype) {
  // Outputs and gradients go through three GEMMs and a softmax in the dtype (fp32 accumulation):
  // a few ulp of the dtype at the largest magnitude, as LayerNorm's gate, with room for the
  // in-projection's weight gradient summing every token. float32 allows TF32 GEMMs where the
  // user's torch.backends.cuda.matmul.allow_tf32 does (10 mantissa bits); the gate also passes
  // anything within twice torch's own error on the same inputs.
  return families::per_dtype(dtype, 2e-3, 5e-3, 3e-2);
}

std::vector<families::VariantInfo> core_variants(std::string_view pass) {
  std::vector<families::VariantInfo> out;
  if (pass != families::kTrainPasses[kTrain]) return out;
  const std::array<std::string_view, kCores.size()> ideas = {
      "torch's flash-attention kernel (fp16/bf16, head size a multiple of 8)",
      "torch's memory-efficient (xFormers) kernel: any dtype, short sequences",
      "torch's cuDNN fused attention (sm80+, fp16/bf16)",
      "torch's math composite: matmuls and a softmax, differentiated op by op; the one core that also "
      "returns the weights (need_weights=True)",
      "hfnn's short-sequence kernel (fp16/bf16, L and S <= 128, head size a multiple of 16 up to 128, no mask "
      "or dropout): one block per batch and head, the whole score matrix on chip, Q, K and V read once",
      "torch's cuDNN forward with hfnn's backward for L and S <= 256 (fp16/bf16, head size 16 to 64, no mask or "
      "dropout): one block per batch and head, no dO.O pass and no float32 dQ to convert",
  };
  for (size_t i = 0; i < kCores.size(); ++i) out.push_back({std::string(kCores[i]), std::string(ideas[i])});
  return out;
}

families::PackedKey pack_of(const Key& k, DType dtype) {
  return pack(k.batch, k.q_len, k.kv_len, k.embed, k.heads, dtype, k.batch_first, k.causal, k.inputs, k.bias,
              k.dropout, k.padding, k.mask, k.weights, k.kdim, k.vdim);
}

}  // namespace

const families::Family kFamily = {
    .op = "multihead_attention", .title = "MultiheadAttention", .key_header = "B x L (kv S), E/heads",
    .passes = families::kTrainPasses, .key_of = &families::key_text_of<&key_of>,
    .key_label = &families::label_of<&parse_key, &label>, .tolerance = &gate_tolerance, .variants = &core_variants,
    .pack_key = &families::packed_of<&parse_key, &pack_of>,
};

}  // namespace hfnn::kernels::multihead_attention
