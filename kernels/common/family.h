// A kernel family as the parts of hfnn that run no kernel see it: the profile's op name, how a
// recorded shape becomes a tuning key and how that key reads in a report, the passes, the float64
// gate's tolerance and the variant names. The tuner, the database, `hfnn tune` and the reports
// iterate families(); a family adds its description under kernels/<family>/ and one line to the
// list in family.cpp, never a branch on its name elsewhere. Torch-free and GPU-free: CPU-tested.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hfnn::families {

// One shape_stats row of a profile: what the profiler recorded of a call (profiles/db.cpp).
struct RecordedShape {
  std::string shape;       // "[8,128,256]"
  std::string normalized;  // LayerNorm's normalized_shape, "" for other ops
  std::string dtype;       // "float32"
  std::string flags;       // the module's settings, "k=v,k=v" ("" where the op has none)
  bool affine = true;
};

// A kernel variant of a pass: its stable name (the database stores it) and the idea behind it.
struct VariantInfo {
  std::string name;
  std::string idea;
};

struct Family {
  std::string_view op;          // as the profiler records it: "layer_norm"
  std::string_view title;       // for people: "LayerNorm"
  std::string_view key_header;  // what a key's label shows: "rows x D"
  std::span<const std::string_view> passes;  // "fwd", "bwd": each timed and won apart
  // The tuning key of a recorded shape: shapes that are the same problem share one. nullopt: the
  // shape does not map onto a key (the call runs torch's kernel).
  std::optional<std::string> (*key_of)(const RecordedShape& shape);
  // A key as a report shows it ("1024 x 256"); the key itself where it does not parse.
  std::string (*key_label)(const std::string& key);
  // The largest error against the float64 reference a candidate may have, as max|out - ref| /
  // max|ref| over each output of a pass, for outputs of this dtype.
  double (*tolerance)(const std::string& dtype);
  // The variants of a pass, in registry order (none in a build without CUDA kernels).
  std::vector<VariantInfo> (*variants)(std::string_view pass);
};

// Every family hfnn tunes, in the order reports list them.
std::span<const Family* const> all();
// The family of a recorded op; null for ops hfnn records but has no kernels for (yet).
const Family* find(std::string_view op);
// The ops of all(), comma-separated: for messages.
std::string op_names();

// "[1,128,256]" -> {1, 128, 256}; "[]" -> {}; nullopt for anything else (negative sizes too).
std::optional<std::vector<int64_t>> parse_dims(std::string_view text);

}  // namespace hfnn::families
