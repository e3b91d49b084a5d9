// LayerNorm as a family (kernels/common/family.h): its tuning key, its packed form for dispatch and
// the description the tuner, the database, the reports and the dispatch table read.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/common/dtype.h"
#include "kernels/common/family.h"

namespace hfnn::kernels::layer_norm {

// The tuning key: shapes that are the same problem ([8,128,256] and [1024,256] over the last 256)
// share one. Text form: "rows=1024,D=256,affine=1" (dtype is stored beside it).
struct Key {
  int64_t rows = 0;
  int64_t cols = 0;
  bool affine = true;
  std::string text() const;
};
// From a recorded shape ("[1,128,256,256]") and normalized shape ("[256]"); nullopt when the
// normalized shape is not a suffix of the shape or either does not parse.
std::optional<Key> key_of(const std::string& shape, const std::string& normalized, bool affine);
// The inverse of Key::text(); nullopt for anything else.
std::optional<Key> parse_key(const std::string& text);

// The passes' positions in kFamily.passes, which the op counts and looks winners up by.
inline constexpr int kFwd = 0, kBwd = 1;

// The packed key of a problem (families::PackedKey): what the op builds from a call's sizes, and
// what kFamily.pack_key makes of a stored key and dtype. One function for both, so they agree.
constexpr families::PackedKey pack(int64_t rows, int64_t cols, DType dtype, bool affine) {
  return {rows, cols, static_cast<int64_t>(dtype), affine ? 1 : 0, 0, 0};
}

extern const families::Family kFamily;

}  // namespace hfnn::kernels::layer_norm
