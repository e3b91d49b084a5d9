#include "kernels/multihead_attention/multihead_attention_family.h"

#include <charconv>
#include <map>
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

// "a=1,b=x" -> {a: "1", b: "x"}; nullopt for a part without '=' or a name given twice.
std::optional<std::map<std::string, std::string, std::less<>>> settings(std::string_view text) {
  std::map<std::string, std::string, std::less<>> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view part = text.substr(0, comma);
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos || eq == 0) return std::nullopt;
    if (!out.emplace(std::string(part.substr(0, eq)), std::string(part.substr(eq + 1))).second) return std::nullopt;
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  return out;
}

// A non-negative integer setting; nullopt where it is absent or not a plain number.
std::optional<int64_t> number(const std::map<std::string, std::string, std::less<>>& s, std::string_view name) {
  const auto it = s.find(name);
  if (it == s.end()) return std::nullopt;
  const std::string& text = it->second;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || text[0] == '-') return std::nullopt;
  return v;
}

// A 0/1 setting: `fallback` where absent (older profiles), nullopt where it is anything else.
std::optional<bool> flag(const std::map<std::string, std::string, std::less<>>& s, std::string_view name,
                         std::optional<bool> fallback = std::nullopt) {
  if (!s.count(name)) return fallback;
  const auto v = number(s, name);
  if (!v || *v > 1) return std::nullopt;
  return *v == 1;
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

constexpr std::array<std::string_view, 1> kPasses = {"train"};
static_assert(kPasses[kTrain] == "train", "kTrain indexes kPasses");

std::optional<std::string> recorded_key(const families::RecordedShape& s) {
  const auto key = key_of(s.shape, s.flags);
  if (!key) return std::nullopt;
  return key->text();
}

std::string key_label(const std::string& text) {
  const auto k = parse_key(text);
  if (!k) return text;
  std::string out = std::to_string(k->batch) + " x " + std::to_string(k->q_len);
  if (k->kv_len != k->q_len || k->inputs != Inputs::kSelf) out += " (kv " + std::to_string(k->kv_len) + ")";
  out += ", " + std::to_string(k->embed) + "/" + std::to_string(k->heads);
  if (k->inputs == Inputs::kSharedKv) out += " cross";
  if (k->inputs == Inputs::kSeparate) out += " q,k,v";
  if (k->causal) out += " causal";
  if (!k->batch_first) out += " seq-first";
  if (!k->bias) out += " no-bias";
  if (k->dropout) out += " dropout";
  return out;
}

double gate_tolerance(const std::string& dtype) {
  // Outputs and gradients go through three GEMMs and a softmax in the dtype (fp32 accumulation):
  // a few ulp of the dtype at the largest magnitude, as LayerNorm's gate, with room for the
  // in-projection's weight gradient summing every token. float32 allows TF32 GEMMs where the
  // user's torch.backends.cuda.matmul.allow_tf32 does (10 mantissa bits); the gate also passes
  // anything within twice torch's own error on the same inputs.
  if (dtype == "float16") return 5e-3;
  if (dtype == "bfloat16") return 3e-2;
  return 2e-3;
}

std::vector<families::VariantInfo> core_variants(std::string_view pass) {
  std::vector<families::VariantInfo> out;
  if (pass != kPasses[kTrain]) return out;
  const std::array<std::string_view, kCores.size()> ideas = {
      "torch's flash-attention kernel (fp16/bf16, head size a multiple of 8)",
      "torch's memory-efficient (xFormers) kernel: any dtype, short sequences",
      "torch's cuDNN fused attention (sm80+, fp16/bf16)",
      "torch's math composite: matmuls and a softmax, differentiated op by op",
  };
  for (size_t i = 0; i < kCores.size(); ++i) out.push_back({std::string(kCores[i]), std::string(ideas[i])});
  return out;
}

std::optional<families::PackedKey> pack_stored(const std::string& text, const std::string& dtype_name) {
  const auto k = parse_key(text);
  const auto dtype = dtype_from_name(dtype_name);
  if (!k || !dtype) return std::nullopt;
  return pack(k->batch, k->q_len, k->kv_len, k->embed, k->heads, *dtype, k->batch_first, k->causal, k->inputs, k->bias,
              k->dropout);
}

}  // namespace

const families::Family kFamily = {
    .op = "multihead_attention", .title = "MultiheadAttention", .key_header = "B x L (kv S), E/heads",
    .passes = kPasses, .key_of = &recorded_key, .key_label = &key_label, .tolerance = &gate_tolerance,
    .variants = &core_variants, .pack_key = &pack_stored,
};

}  // namespace hfnn::kernels::multihead_attention
