#include "kernels/lstm/lstm_family.h"

namespace hfnn::kernels::lstm {
namespace {

bool valid(const Key& k) {
  return k.input > 0 && k.hidden > 0 && k.layers > 0 && k.batch > 0 && k.steps > 0 && (!k.dropout || k.layers > 1);
}

std::string bit(bool b) { return b ? "1" : "0"; }

}  // namespace

std::string Key::text() const {
  return "input=" + std::to_string(input) + ",hidden=" + std::to_string(hidden) +
         ",layers=" + std::to_string(layers) + ",bidirectional=" + bit(bidirectional) +
         ",batch=" + std::to_string(batch) + ",steps=" + std::to_string(steps) + ",batch_first=" + bit(batch_first) +
         ",bias=" + bit(bias) + ",dropout=" + bit(dropout);
}

std::optional<Key> key_of(const std::string& shape, const std::string& flags) {
  const auto dims = families::parse_dims(shape);
  const auto s = families::parse_settings(flags);
  if (!dims || !s || dims->size() != 3) return std::nullopt;  // unbatched input, packed sequences
  const auto input = families::setting_number(*s, "input"), hidden = families::setting_number(*s, "hidden");
  const auto layers = families::setting_number(*s, "layers"), proj = families::setting_number(*s, "proj");
  const auto bidirectional = families::setting_flag(*s, "bidirectional");
  const auto batch_first = families::setting_flag(*s, "batch_first"), bias = families::setting_flag(*s, "bias");
  const auto dropout = families::setting_flag(*s, "dropout", false);
  if (!input || !hidden || !layers || !bidirectional || !batch_first || !bias || !dropout) return std::nullopt;
  if (s->count("proj") && (!proj || *proj != 0)) return std::nullopt;  // proj_size runs torch's path
  Key k;
  k.input = *input;
  k.hidden = *hidden;
  k.layers = *layers;
  k.bidirectional = *bidirectional;
  k.batch_first = *batch_first;
  k.bias = *bias;
  k.dropout = *dropout && *layers > 1;  // torch applies dropout between layers only
  k.batch = (*dims)[*batch_first ? 0 : 1];
  k.steps = (*dims)[*batch_first ? 1 : 0];
  if ((*dims)[2] != k.input || !valid(k)) return std::nullopt;
  return k;
}

std::optional<Key> parse_key(const std::string& text) {
  const auto s = families::parse_settings(text);
  if (!s) return std::nullopt;
  const auto input = families::setting_number(*s, "input"), hidden = families::setting_number(*s, "hidden");
  const auto layers = families::setting_number(*s, "layers"), batch = families::setting_number(*s, "batch");
  const auto steps = families::setting_number(*s, "steps");
  const auto bidirectional = families::setting_flag(*s, "bidirectional");
  const auto batch_first = families::setting_flag(*s, "batch_first"), bias = families::setting_flag(*s, "bias");
  const auto dropout = families::setting_flag(*s, "dropout");
  if (!input || !hidden || !layers || !batch || !steps || !bidirectional || !batch_first || !bias || !dropout)
    return std::nullopt;
  Key k;
  k.input = *input, k.hidden = *hidden, k.layers = *layers, k.batch = *batch, k.steps = *steps;
  k.bidirectional = *bidirectional, k.batch_first = *batch_first, k.bias = *bias, k.dropout = *dropout;
  if (!valid(k) || k.text() != text) return std::nullopt;  // the canonical text only: one key, one spelling
  return k;
}

namespace {

static_assert(families::kTrainPasses[kTrain] == "train", "kTrain indexes the passes");

std::string label(const Key& k) {
  std::string out = std::to_string(k.input) + " -> " + std::to_string(k.hidden);
  if (k.layers > 1) out += " x" + std::to_string(k.layers);
  if (k.bidirectional) out += " bi";
  out += ", " + std::to_string(k.batch) + " x " + std::to_string(k.steps);
  return out + families::settings_suffix(k.batch_first, k.bias, k.dropout);
}

double gate_tolerance(const std::string& dtype) {
  // A recurrence compounds rounding over its steps: the outputs and gradients of a few hundred steps
  // in float32 drift to about 1e-4 of their largest magnitude (cuDNN's too), and the weight
  // gradients sum every step. 16-bit inputs with float32 accumulation and cell state: a few ulp.
  return families::per_dtype(dtype, 1e-3, 1e-2, 5e-2);
}

// The variants of this build: none without the CUDA kernels.
std::vector<families::VariantInfo> variant_list(std::string_view pass) {
  std::vector<families::VariantInfo> out;
#if HFNN_WITH_CUDA
  if (pass == families::kTrainPasses[kTrain])
    for (const VariantName& v : kVariants) out.push_back({std::string(v.name), std::string(v.idea)});
#else
  (void)pass;
#endif
  return out;
}

families::PackedKey pack_of(const Key& k, DType dtype) {
  return pack(k.input, k.hidden, k.layers, k.batch, k.steps, dtype, k.bidirectional, k.batch_first, k.bias, k.dropout);
}

}  // namespace

const families::Family kFamily = {
    .op = "lstm", .title = "LSTM", .key_header = "input -> hidden, batch x steps",
    .passes = families::kTrainPasses, .key_of = &families::key_text_of<&key_of>,
    .key_label = &families::label_of<&parse_key, &label>, .tolerance = &gate_tolerance, .variants = &variant_list,
    .pack_key = &families::packed_of<&parse_key, &pack_of>,
};

}  // namespace hfnn::kernels::lstm
