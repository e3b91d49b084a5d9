// A kernel family as the parts of hfnn that run no kernel see it: the profile's op name, how a
// recorded shape becomes a tuning key and how that key reads in a report, the passes, the float64
// gate's tolerance, the variant names and the packed key dispatch looks winners up by. The tuner,
// the database, `hfnn tune`, the reports and the HFNN_DISPATCH_DB table (src/dispatch.h) iterate
// all(); a family adds its description under kernels/<family>/ and one line to the list in
// family.cpp, never a branch on its name elsewhere. Torch-free and GPU-free: CPU-tested.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/common/dtype.h"

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

// A tuning key as a few integers, which HFNN_DISPATCH_DB's table is keyed by: the op builds it from
// its tensor sizes on every call, so a lookup hashes a few words and builds no text. A family fills
// the words it needs (the dtype among them) and leaves the rest zero; six fit LayerNorm's four and
// leave room for attention's (batch, heads, lengths, head size, dtype, flags).
using PackedKey = std::array<int64_t, 6>;

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
  // The variants of a pass, in registry order (none in a build without CUDA kernels): a variant's
  // position here is the index dispatch stores and the family's op runs it by.
  std::vector<VariantInfo> (*variants)(std::string_view pass);
  // A stored key and its dtype ("rows=1024,D=256,affine=1", "float32") packed as the family's op
  // packs the sizes of a call with that key, so the table's winners are found per call. nullopt:
  // not a key of this family, or a dtype its kernels do not take.
  std::optional<PackedKey> (*pack_key)(const std::string& key, const std::string& dtype);
};

// The passes of a family whose forward and backward are tied (a variant's backward reads the state
// its own forward saved: attention's cores, LSTM's persistent kernels): one winner per key, timed
// as a training step calls them.
inline constexpr std::array<std::string_view, 1> kTrainPasses = {"train"};

// A Family::key_of made of a family's own key_of(shape, flags), whose key has text().
template <auto kKeyOf>
std::optional<std::string> key_text_of(const RecordedShape& s) {
  const auto key = kKeyOf(s.shape, s.flags);
  if (!key) return std::nullopt;
  return key->text();
}

// A Family::key_label from a family's parse_key(text) and its label of a parsed key; the text
// itself where it does not parse.
template <auto kParse, auto kLabel>
std::string label_of(const std::string& text) {
  const auto key = kParse(text);
  return key ? kLabel(*key) : text;
}

// A Family::pack_key from a family's parse_key(text) and its packing of a parsed key and dtype.
template <auto kParse, auto kPack>
std::optional<PackedKey> packed_of(const std::string& text, const std::string& dtype_name) {
  const auto key = kParse(text);
  const auto dtype = kernels::dtype_from_name(dtype_name);
  if (!key || !dtype) return std::nullopt;
  return kPack(*key, *dtype);
}

// What a key's label shows of the common settings where they are not the usual ones:
// " seq-first no-bias dropout" (empty for batch-first, biased, no dropout).
std::string settings_suffix(bool batch_first, bool bias, bool dropout);
// A value per dtype name: float16's, bfloat16's, and float32's for the rest (Family::tolerance).
double per_dtype(const std::string& dtype, double float32, double float16, double bfloat16);

// The position of `pass` in family.passes (dispatch counts and looks up winners by it); -1 for none.
int pass_index(const Family& family, std::string_view pass);
// The position of variant `name` in family.variants(pass); -1 where this build has no such variant.
int variant_index(const Family& family, std::string_view pass, std::string_view name);

// Every family hfnn tunes, in the order reports list them.
std::span<const Family* const> all();
// The family of a recorded op; null for ops hfnn records but has no kernels for (yet).
const Family* find(std::string_view op);
// The ops of all(), comma-separated: for messages.
std::string op_names();

// "[1,128,256]" -> {1, 128, 256}; "[]" -> {}; nullopt for anything else (negative sizes too).
std::optional<std::vector<int64_t>> parse_dims(std::string_view text);

// A recorded call's settings or a key's text, "a=1,b=x" -> {a: "1", b: "x"}; nullopt for a part
// without '=' or a name given twice.
using Settings = std::map<std::string, std::string, std::less<>>;
std::optional<Settings> parse_settings(std::string_view text);
// A non-negative integer setting; nullopt where it is absent or not a plain number.
std::optional<int64_t> setting_number(const Settings& s, std::string_view name);
// A 0/1 setting: `fallback` where absent (older profiles), nullopt where it is anything else.
std::optional<bool> setting_flag(const Settings& s, std::string_view name, std::optional<bool> fallback = std::nullopt);

}  // namespace hfnn::families
