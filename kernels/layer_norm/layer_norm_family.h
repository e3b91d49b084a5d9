// LayerNorm as a family (kernels/common/family.h): its tuning key and the description the tuner,
// the database and the reports read.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

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

extern const families::Family kFamily;

}  // namespace hfnn::kernels::layer_norm
