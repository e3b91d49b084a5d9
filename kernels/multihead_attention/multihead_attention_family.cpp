#include "kernels/multihead_attention/multihead_attention_family.h"

#include <string_view>

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

bool valid(const Key& k) {
  return k.batch > 0 && k.q_len > 0 && k.kv_len > 0 && k.heads > 0 && k.embed > 0 && k.embed % k.heads == 0 &&
         (k.inputs != Inputs::kSelf || k.q_len == k.kv_len);
}

}  // namespace

std::string Key::text() const {
  return "B=" + std::to_string(batch) + ",L=" + std::to_string(q_len) + ",S=" + std::to_string(kv_len) +
         ",E=" + std::to_string(embed) + ",H=" + std::to_string(heads) + ",batch_first=" + (batch_first ? "1" : "0") +
         ",causal=" + (causal ? "1" : "0") + ",inputs=" + std::string(input_name(inputs)) + ",bias=" +
         (bias ? "1" : "0") + ",dropout=" + (dropout ? "1" : "0");
}

std::optional<Key> key_of(const std::string& shape, const std::string& flags) {
  const auto dims = families::parse_dims(shape);
  const auto s = settings(flags);
  if (!dims || !s || dims->size() != 3) return std::nullopt;  // unbatched calls run torch's module
  const auto embed = number(*s, "embed"), heads = number(*s, "heads"), kv_len = number(*s, "kv_len");
  const auto batch_first = flag(*s, "batch_first"), need_weights = flag(*s, "need_weights");
  const auto attn_mask = flag(*s, "attn_mask"), padding = flag(*s, "key_padding_mask"), causal = flag(*s, "causal");
  const auto bias = flag(*s, "bias", true), kdim = flag(*s, "kdim", false), bias_kv = flag(*s, "bias_kv", false);
  const auto dropout = flag(*s, "dropout", false);
  if (!embed || !heads || !kv_len || !batch_first || !need_weights || !attn_mask || !padding || !causal || !bias ||
      !kdim || !bias_kv || !dropout)
    return std::nullopt;
  // What the op does not take: torch's module keeps these calls. A mask with the causal hint is
  // dropped for the hint by torch's module itself (F.multi_head_attention_forward), as by the op.
  if (*need_weights || *padding || (*attn_mask && !*causal) || *kdim || *bias_kv) return std::nullopt;
  Key k;
  k.batch = (*dims)[*batch_first ? 0 : 1];
  k.q_len = (*dims)[*batch_first ? 1 : 0];
  k.kv_len = *kv_len;
  k.embed = *embed;
  k.heads = *heads;
  k.batch_first = *batch_first;
  k.causal = *causal;
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
      "torch's math composite: matmuls and a softmax, differentiated op by op",
  };
  for (size_t i = 0; i < kCores.size(); ++i) out.push_back({std::string(kCores[i]), std::string(ideas[i])});
  return out;
}

families::PackedKey pack_of(const Key& k, DType dtype) {
  return pack(k.batch, k.q_len, k.kv_len, k.embed, k.heads, dtype, k.batch_first, k.causal, k.inputs, k.bias,
              k.dropout);
}

}  // namespace

const families::Family kFamily = {
    .op = "multihead_attention", .title = "MultiheadAttention", .key_header = "B x L (kv S), E/heads",
    .passes = families::kTrainPasses, .key_of = &families::key_text_of<&key_of>,
    .key_label = &families::label_of<&parse_key, &label>, .tolerance = &gate_tolerance, .variants = &core_variants,
    .pack_key = &families::packed_of<&parse_key, &pack_of>,
};

}  // namespace hfnn::kernels::multihead_attention
