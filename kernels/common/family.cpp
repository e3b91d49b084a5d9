#include "kernels/common/family.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "kernels/layer_norm/layer_norm_family.h"
#include "kernels/lstm/lstm_family.h"
#include "kernels/multihead_attention/multihead_attention_family.h"

namespace hfnn::families {
namespace {

// The families, one line each.
constexpr std::array<const Family*, 3> kAll = {&kernels::layer_norm::kFamily, &kernels::multihead_attention::kFamily,
                                               &kernels::lstm::kFamily};

}  // namespace

std::span<const Family* const> all() { return kAll; }

const Family* find(std::string_view op) {
  for (const Family* f : kAll)
    if (f->op == op) return f;
  return nullptr;
}

std::string op_names() {
  std::string out;
  for (const Family* f : kAll) out += (out.empty() ? "" : ", ") + std::string(f->op);
  return out;
}

int pass_index(const Family& family, std::string_view pass) {
  const auto it = std::find(family.passes.begin(), family.passes.end(), pass);
  return it == family.passes.end() ? -1 : static_cast<int>(it - family.passes.begin());
}

int variant_index(const Family& family, std::string_view pass, std::string_view name) {
  const auto all = family.variants(pass);
  const auto it = std::find_if(all.begin(), all.end(), [&](const VariantInfo& v) { return v.name == name; });
  return it == all.end() ? -1 : static_cast<int>(it - all.begin());
}

std::optional<std::vector<int64_t>> parse_dims(std::string_view text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  std::vector<int64_t> dims;
  const char* p = text.data() + 1;
  const char* end = text.data() + text.size() - 1;
  while (p < end) {
    int64_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || v < 0) return std::nullopt;
    dims.push_back(v);
    p = next;
    if (p < end) {
      if (*p != ',') return std::nullopt;
      ++p;
    }
  }
  return dims;
}

std::optional<Settings> parse_settings(std::string_view text) {
  Settings out;
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

std::optional<int64_t> setting_number(const Settings& s, std::string_view name) {
  const auto it = s.find(name);
  if (it == s.end()) return std::nullopt;
  const std::string& text = it->second;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || text[0] == '-') return std::nullopt;
  return v;
}

std::optional<bool> setting_flag(const Settings& s, std::string_view name, std::optional<bool> fallback) {
  if (!s.count(name)) return fallback;
  const auto v = setting_number(s, name);
  if (!v || *v > 1) return std::nullopt;
  return *v == 1;
}

std::string settings_suffix(bool batch_first, bool bias, bool dropout) {
  std::string out;
  if (!batch_first) out += " seq-first";
  if (!bias) out += " no-bias";
  if (dropout) out += " dropout";
  return out;
}

double per_dtype(const std::string& dtype, double float32, double float16, double bfloat16) {
  if (dtype == "float16") return float16;
  if (dtype == "bfloat16") return bfloat16;
  return float32;
}

}  // namespace hfnn::families
