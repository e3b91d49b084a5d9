#include "kernels/layer_norm/layer_norm_family.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string_view>

#if HFNN_WITH_CUDA
#include "kernels/layer_norm/layer_norm.h"
#endif

namespace hfnn::kernels::layer_norm {

std::string Key::text() const {
  return "rows=" + std::to_string(rows) + ",D=" + std::to_string(cols) + ",affine=" + (affine ? "1" : "0");
}

std::optional<Key> key_of(const std::string& shape, const std::string& normalized, bool affine) {
  const auto dims = families::parse_dims(shape);
  const auto norm = families::parse_dims(normalized);
  if (!dims || !norm || norm->empty() || norm->size() > dims->size()) return std::nullopt;
  if (!std::equal(norm->rbegin(), norm->rend(), dims->rbegin())) return std::nullopt;
  Key key;
  key.affine = affine;
  key.rows = 1;
  key.cols = 1;
  for (size_t i = 0; i < dims->size() - norm->size(); ++i) key.rows *= (*dims)[i];
  for (int64_t d : *norm) key.cols *= d;
  return key;
}

std::optional<Key> parse_key(const std::string& text) {
  Key key;
  int affine = -1;
  long long rows = 0, cols = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "rows=%lld,D=%lld,affine=%d%c", &rows, &cols, &affine, &tail) != 3) return std::nullopt;
  if (rows < 0 || cols < 1 || (affine != 0 && affine != 1)) return std::nullopt;
  key.rows = rows;
  key.cols = cols;
  key.affine = affine == 1;
  if (key.text() != text) return std::nullopt;
  return key;
}

namespace {

constexpr std::array<std::string_view, 2> kPasses = {"fwd", "bwd"};
static_assert(kPasses[kFwd] == "fwd" && kPasses[kBwd] == "bwd", "kFwd and kBwd index kPasses");

std::optional<std::string> family_key(const families::RecordedShape& s) {
  const auto key = key_of(s.shape, s.normalized, s.affine);
  if (!key) return std::nullopt;
  return key->text();
}

std::string label(const Key& key) {
  return std::to_string(key.rows) + " x " + std::to_string(key.cols) + (key.affine ? "" : " no-affine");
}

double tolerance(const std::string& dtype) {
  // Outputs are rounded to the dtype: half an ulp at the largest magnitude is 2^-24 (float32),
  // 2^-11 (float16), 2^-8 (bfloat16) relative; allow a few ulp (float32 also sums up to millions
  // of rows into dgamma and dbeta in float32).
  return families::per_dtype(dtype, 1e-4, 4e-3, 3e-2);
}

std::vector<families::VariantInfo> variants([[maybe_unused]] std::string_view pass) {
  std::vector<families::VariantInfo> out;
#if HFNN_WITH_CUDA
  if (pass == "fwd")
    for (const auto& v : fwd_variants()) out.push_back({std::string(v.name), std::string(v.idea)});
  if (pass == "bwd")
    for (const auto& v : bwd_variants()) out.push_back({std::string(v.name), std::string(v.idea)});
#endif
  return out;
}

families::PackedKey pack_of(const Key& key, DType dtype) { return pack(key.rows, key.cols, dtype, key.affine); }

}  // namespace

const families::Family kFamily = {
    .op = "layer_norm",
    .title = "LayerNorm",
    .key_header = "rows x D",
    .passes = kPasses,
    .key_of = &family_key,
    .key_label = &families::label_of<&parse_key, &label>,
    .tolerance = &tolerance,
    .variants = &variants,
    .pack_key = &families::packed_of<&parse_key, &pack_of>,
};

}  // namespace hfnn::kernels::layer_norm
