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

// The masks of a call, as torch's module applies them (F.multi_head_attention_forward): a key padding
// mask [B, S] and an attention mask [L, S] (2-D) or [B * heads, L, S] (3-D), each bool (True: masked
// out) or float (added to the scores) in the query's dtype. Which kind sets the mask the core reads
// (its shape and whether a bool one is converted first), so each kind is its own key.
enum class PaddingMask : int { kNone = 0, kBool = 1, kFloat = 2 };
enum class AttnMask : int { kNone = 0, kBool2d = 1, kFloat2d = 2, kBool3d = 3, kFloat3d = 4 };
// need_weights=True: the weights are returned too, averaged over the heads or per head.
enum class Weights : int { kNone = 0, kMean = 1, kPerHead = 2 };

// What torch's module does with the causal hint (F.multi_head_attention_forward): the hint with no
// padding mask and no weights asked for drops the attention mask and runs the core causal; with
// either, the mask is applied and the hint is dropped. The key records what runs, so a key's causal
// flag and mask are those after this; the op resolves a call the same way (one function for both).
struct Masking {
  bool causal = false;
  AttnMask mask = AttnMask::kNone;
};
constexpr Masking resolve_masking(bool is_causal, PaddingMask padding, AttnMask mask, Weights weights) {
  if (is_causal && padding == PaddingMask::kNone && weights == Weights::kNone) return {true, AttnMask::kNone};
  return {false, mask};
}

// The tuning key: everything that picks the core and sizes the GEMMs. Text form:
// "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0" (dtype is
// stored beside it), then only what is not the default, in this order: ",key_padding_mask=bool"
// (or float), ",attn_mask=float2d" (bool2d, float2d, bool3d, float3d), ",weights=mean" (or
// per_head: need_weights=True), ",kdim=K,vdim=V" (key and value widths where the module has
// kdim/vdim). L is the query's length, S the key's and value's. A key written before masks, weights
// and kdim were keys reads as before: the defaults are not written.
struct Key {
  int64_t batch = 0, q_len = 0, kv_len = 0, embed = 0, heads = 0;
  bool batch_first = false, causal = false, bias = true, dropout = false;
  Inputs inputs = Inputs::kSelf;
  PaddingMask padding = PaddingMask::kNone;
  AttnMask mask = AttnMask::kNone;
  Weights weights = Weights::kNone;
  int64_t kdim = 0, vdim = 0;  // 0: the module's kdim and vdim are embed (in_proj_weight)
  std::string text() const;
};
// The key of a recorded call: its query shape ("[200,256,1024]") and the settings the profiler
// wrote ("embed=1024,heads=16,kv_len=256,batch_first=1,need_weights=0,attn_mask=0,
// key_padding_mask=0,causal=0,inputs=self,bias=1,kdim=0,bias_kv=0,dropout=0", where attn_mask is 0
// or its kind: bool2d, float2d, bool3d, float3d, or other for a mask the op does not take (another
// dtype than the query's, on another device, or one that requires grad); key_padding_mask 0, bool,
// float or other; average=0 where need_weights=1 asks for per-head weights; kdim=1 with
// kdim_size=K,vdim_size=V). The causal hint and the masks resolve as torch's module applies them
// (resolve_masking). nullopt for calls the op does not take (a mask of kind other,
// add_bias_kv/add_zero_attn, unbatched input) or settings that do not parse. Profiles written
// before inputs/bias/kdim/bias_kv/dropout were recorded read as self-attention where the lengths
// agree (else key-is-value), with bias, no kdim, no bias_kv, no dropout; before the mask kinds
// were, a mask recorded as 1 has no key unless the causal hint drops it.
std::optional<Key> key_of(const std::string& shape, const std::string& flags);
// The inverse of Key::text(); nullopt for anything else.
std::optional<Key> parse_key(const std::string& text);

// The variants, in the order the database's indices and the op use: each names a core the op
// (hfnn.multi_head_attention's `core` argument) runs. torch's own pick ("") is no variant: torch's
// module path is the baseline the tuner always times as "torch".
// New cores go at the end: the database stores indices.
inline constexpr std::array<std::string_view, 6> kCores = {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math",
                                                           "hfnn_short", "hfnn_mid"};

// The one pass's position in kFamily.passes.
inline constexpr int kTrain = 0;

// kdim and vdim a key can have (they are packed in 20 bits each).
inline constexpr int64_t kMaxKvDim = (int64_t{1} << 20) - 1;

// The packed key of a call (families::PackedKey): what the op builds from a call's tensors, and
// what kFamily.pack_key makes of a stored key and dtype. One function for both, so they agree.
// The last word holds the dtype, the flags and the mask kinds; the heads' word holds kdim and vdim
// above the heads (zero for in_proj_weight, so keys from before kdim pack as they did).
constexpr families::PackedKey pack(int64_t batch, int64_t q_len, int64_t kv_len, int64_t embed, int64_t heads,
                                   DType dtype, bool batch_first, bool causal, Inputs inputs, bool bias, bool dropout,
                                   PaddingMask padding = PaddingMask::kNone, AttnMask mask = AttnMask::kNone,
                                   Weights weights = Weights::kNone, int64_t kdim = 0, int64_t vdim = 0) {
  const int64_t flags = static_cast<int64_t>(dtype) | (batch_first ? 1 << 4 : 0) | (causal ? 1 << 5 : 0) |
                        (static_cast<int64_t>(inputs) << 6) | (bias ? 1 << 8 : 0) | (dropout ? 1 << 9 : 0) |
                        (static_cast<int64_t>(padding) << 10) | (static_cast<int64_t>(mask) << 12) |
                        (static_cast<int64_t>(weights) << 15);
  return {batch, q_len, kv_len, embed, heads | (kdim << 23) | (vdim << 43), flags};
}

extern const families::Family kFamily;

}  // namespace hfnn::kernels::multihead_attention
