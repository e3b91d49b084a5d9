// nn.LSTM as a family (kernels/common/family.h): its tuning key, its packed form for dispatch and
// the description the tuner, the database, the reports and the dispatch table read.
//
// One pass, "train", as attention's: a persistent forward saves the activations its own backward
// reads (the gates after their activations and c_t, in its own layout), so a key has one winner,
// timed as forward and backward together, as a training step calls them.
//
// The variants' names and ideas live here, not in the kernels' registry (kernels/lstm/lstm.h), so
// the command line and the tuner list them without linking the kernels (and cuBLASLt); the
// registry takes its names from this list, in this order (the dispatch table stores positions).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/common/dtype.h"
#include "kernels/common/family.h"

namespace hfnn::kernels::lstm {

// The tuning key: everything that sizes the recurrence and picks a variant. Text form:
// "input=985,hidden=985,layers=1,bidirectional=0,batch=4,steps=1000,batch_first=1,bias=1,dropout=0"
// (dtype is stored beside it).
struct Key {
  int64_t input = 0, hidden = 0, layers = 1, batch = 0, steps = 0;
  bool bidirectional = false, batch_first = false, bias = true, dropout = false;
  std::string text() const;
};
// The key of a recorded call: the input's shape ("[4,1000,985]": batch and steps in the order
// batch_first says) and the settings the profiler wrote ("input=985,hidden=985,layers=1,
// bidirectional=0,batch_first=1,bias=1,proj=0,dropout=0"). nullopt for calls the family does not
// take (a PackedSequence: "packed"; proj_size; unbatched input) or settings that do not parse.
// Profiles written before proj and dropout were recorded read as proj=0, dropout=0.
std::optional<Key> key_of(const std::string& shape, const std::string& flags);
// The inverse of Key::text(); nullopt for anything else.
std::optional<Key> parse_key(const std::string& text);

// The kernel variants, in registry order. Names are stable: the database stores them.
struct VariantName {
  std::string_view name, idea;
};
inline constexpr std::array<VariantName, 3> kVariants = {{
    {"persistent",
     "one cooperative launch for the whole sequence: each block keeps its hidden units' rows of W_hh in shared "
     "memory; a step waits only for the h values it reads, each written once into a buffer cleared before the "
     "launch; the backward likewise with W_hh's columns"},
    {"steps", "a cuBLASLt GEMM and a fused gate kernel per step: any size the GEMMs take (W_hh too large to stay on chip)"},
    {"cudnn_persistent",
     "cuDNN's own persistent kernel (CUDNN_RNN_ALGO_PERSIST_STATIC) wherever cuDNN takes the shape, in every dtype: "
     "torch's nn.LSTM asks for it only in float16 at a few shapes"},
}};

// The one pass's position in kFamily.passes.
inline constexpr int kTrain = 0;

// The packed key of a call (families::PackedKey): what the op builds from a call's tensors, and
// what kFamily.pack_key makes of a stored key and dtype. One function for both, so they agree.
// The last word holds the dtype and the flags.
constexpr families::PackedKey pack(int64_t input, int64_t hidden, int64_t layers, int64_t batch, int64_t steps,
                                   DType dtype, bool bidirectional, bool batch_first, bool bias, bool dropout) {
  const int64_t flags = static_cast<int64_t>(dtype) | (bidirectional ? 1 << 4 : 0) | (batch_first ? 1 << 5 : 0) |
                        (bias ? 1 << 6 : 0) | (dropout ? 1 << 7 : 0);
  return {input, hidden, layers, batch, steps, flags};
}

extern const families::Family kFamily;

}  // namespace hfnn::kernels::lstm
