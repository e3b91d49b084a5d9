// nn.MultiheadAttention as a family (kernels/common/family.h): its tuning key, its packed form for
// dispatch and the description the tuner, the database, the reports and the dispatch table read.
// The op is src/multi_head_attention_op.cpp; its variants are the attention cores it can run
// (torch's SDPA kernels called by name), so this description needs no CUDA.
//
// One pass, "train": a core's forward and backward are tied (the backward op reads the state its
// own forward saved: flash's and cuDNN's log-sum-exp layout, efficient's philox seed), so a key has
// one winner, timed as forward and backward together, as a training step calls them.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/common/dtype.h"
#include "kernels/common/family.h"

namespace hfnn::kernels::multihead_attention {

// Which of query, key and value are the same tensor: what sets the op's input GEMMs (one packed
// GEMM, two, or three) and the strides of Q, K and V the core reads.
enum class Inputs : int { kSelf = 0, kSharedKv = 1, kSeparate = 2 };

// The tuning key: everything that picks the core and sizes the GEMMs. Text form:
// "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0" (dtype is
// stored beside it). L is the query's length, S the key's and value's.
struct Key {
  int64_t batch = 0, q_len = 0, kv_len = 0, embed = 0, heads = 0;
  bool batch_first = false, causal = false, bias = true, dropout = false;
  Inputs inputs = Inputs::kSelf;
  std::string text() const;
};
// The key of a recorded call: its query shape ("[200,256,1024]") and the settings the profiler
// wrote ("embed=1024,heads=16,kv_len=256,batch_first=1,need_weights=0,attn_mask=0,
// key_padding_mask=0,causal=0,inputs=self,bias=1,kdim=0,bias_kv=0,dropout=0"). nullopt for calls
// the op does not take (need_weights=1, a key padding mask, a mask that is not the causal hint,
// kdim/vdim, add_bias_kv/add_zero_attn, unbatched input) or settings that do not parse. Profiles
// written before inputs/bias/kdim/bias_kv/dropout were recorded read as self-attention where the
// lengths agree (else key-is-value), with bias, no kdim, no bias_kv, no dropout.
std::optional<Key> key_of(const std::string& shape, const std::string& flags);
// The inverse of Key::text(); nullopt for anything else.
std::optional<Key> parse_key(const std::string& text);

// The variants, in the order the database's indices and the op use: each names a core the op
// (hfnn.multi_head_attention's `core` argument) runs. torch's own pick ("") is no variant: torch's
// module path is the baseline the tuner always times as "torch".
inline constexpr std::array<std::string_view, 4> kCores = {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math"};

// The one pass's position in kFamily.passes.
inline constexpr int kTrain = 0;

// The packed key of a call (families::PackedKey): what the op builds from a call's tensors, and
// what kFamily.pack_key makes of a stored key and dtype. One function for both, so they agree.
// The last word holds the dtype and the flags.
constexpr families::PackedKey pack(int64_t batch, int64_t q_len, int64_t kv_len, int64_t embed, int64_t heads,
                                   DType dtype, bool batch_first, bool causal, Inputs inputs, bool bias, bool dropout) {
  const int64_t flags = static_cast<int64_t>(dtype) | (batch_first ? 1 << 4 : 0) | (causal ? 1 << 5 : 0) |
                        (static_cast<int64_t>(inputs) << 6) | (bias ? 1 << 8 : 0) | (dropout ? 1 << 9 : 0);
  return {batch, q_len, kv_len, embed, heads, flags};
}

extern const families::Family kFamily;

}  // namespace hfnn::kernels::multihead_attention
