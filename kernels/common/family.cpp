#include "kernels/common/family.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "kernels/layer_norm/layer_norm_family.h"
#include "kernels/multihead_attention/multihead_attention_family.h"

namespace hfnn::families {
namespace {

// The families, one line each.
constexpr std::array<const Family*, 2> kAll = {&kernels::layer_norm::kFamily, &kernels::multihead_attention::kFamily};

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

}  // namespace hfnn::families
