// nn.MultiheadAttention's family description (kernels/multihead_attention/) on the CPU: the key of
// a recorded call and the calls that map to none, the key's text and label, its packed form (which
// the op builds from a call's tensors and dispatch looks winners up by), the one pass and its
// variants, and a table with attention winners read back as the op would look them up.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "kernels/common/family.h"
#include "kernels/multihead_attention/multihead_attention_family.h"
#if HFNN_WITH_CUDA
#include "kernels/multihead_attention/mid_attention.h"
#include "kernels/multihead_attention/short_attention.h"
#endif
#include "profiles/db.h"
#include "src/dispatch.h"
#include "tuner/tune_db.h"

namespace hfnn::kernels::multihead_attention {
namespace {

// The settings the profiler records for a call (python/hfnn/_startup.py), with overrides.
std::string flags(const std::string& extra = "", bool batch_first = true) {
  std::string base = std::string("embed=1024,heads=16,kv_len=256,batch_first=") + (batch_first ? "1" : "0") +
                     ",need_weights=0,attn_mask=0,key_padding_mask=0,causal=0,inputs=self,bias=1,kdim=0,bias_kv=0,"
                     "dropout=0";
  // Replace "name=value" pairs of `extra` in place.
  size_t at = 0;
  while (at < extra.size()) {
    const size_t comma = extra.find(',', at);
    const std::string part = extra.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const std::string name = part.substr(0, part.find('=') + 1);
    const size_t where = base.find(name);
    if (where == std::string::npos || (where > 0 && base[where - 1] != ',')) {
      base += "," + part;
    } else {
      const size_t end = base.find(',', where);
      base.replace(where, (end == std::string::npos ? base.size() : end) - where, part);
    }
    at = comma == std::string::npos ? extra.size() : comma + 1;
  }
  return base;
}

TEST(AttentionKey, ARecordedTrainingCallHasAKey) {
  const auto k = key_of("[200,256,1024]", flags());
  ASSERT_TRUE(k);
  EXPECT_EQ(k->text(), "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0");
  // Sequence-first: the query is [L, B, E].
  const auto s = key_of("[256,200,1024]", flags("", false));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->batch, 200);
  EXPECT_EQ(s->q_len, 256);
  EXPECT_FALSE(s->batch_first);
  // Cross-attention with a longer key, causal hint with its mask, no bias, dropout.
  const auto c = key_of("[8,100,1024]", flags("kv_len=300,inputs=kv,attn_mask=1,causal=1,bias=0,dropout=1"));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->text(), "B=8,L=100,S=300,E=1024,H=16,batch_first=1,causal=1,inputs=kv,bias=0,dropout=1");
}

TEST(AttentionKey, MasksWeightsAndKdimAreKeys) {
  const auto pad = key_of("[8,100,1024]", flags("kv_len=300,inputs=kv,key_padding_mask=bool"));
  ASSERT_TRUE(pad);
  EXPECT_EQ(pad->text(), "B=8,L=100,S=300,E=1024,H=16,batch_first=1,causal=0,inputs=kv,bias=1,dropout=0,"
                         "key_padding_mask=bool");
  const auto all = key_of("[100,8,1024]", flags("kv_len=300,inputs=qkv,key_padding_mask=float,attn_mask=bool3d,"
                                                "need_weights=1,average=0,kdim=1,kdim_size=64,vdim_size=32",
                                                false));
  ASSERT_TRUE(all);
  EXPECT_EQ(all->text(), "B=8,L=100,S=300,E=1024,H=16,batch_first=0,causal=0,inputs=qkv,bias=1,dropout=0,"
                         "key_padding_mask=float,attn_mask=bool3d,weights=per_head,kdim=64,vdim=32");
  const auto weights = key_of("[200,256,1024]", flags("need_weights=1"));
  ASSERT_TRUE(weights);
  EXPECT_EQ(weights->weights, Weights::kMean);
  EXPECT_EQ(key_of("[200,256,1024]", flags("attn_mask=float2d"))->mask, AttnMask::kFloat2d);
}

TEST(AttentionKey, TheCausalHintResolvesAsTorchsModuleAppliesIt) {
  // The hint alone drops its mask: the core runs causal, whatever the mask's kind.
  for (const std::string mask : {"1", "float2d", "bool3d", "other"}) {
    const auto k = key_of("[200,256,1024]", flags("causal=1,attn_mask=" + mask));
    ASSERT_TRUE(k) << mask;
    EXPECT_TRUE(k->causal);
    EXPECT_EQ(k->mask, AttnMask::kNone);
  }
  // With a padding mask or weights the mask is applied and the hint dropped.
  const auto padded = key_of("[200,256,1024]", flags("causal=1,attn_mask=float2d,key_padding_mask=bool"));
  ASSERT_TRUE(padded);
  EXPECT_FALSE(padded->causal);
  EXPECT_EQ(padded->mask, AttnMask::kFloat2d);
  const auto weights = key_of("[200,256,1024]", flags("causal=1,attn_mask=bool2d,need_weights=1"));
  ASSERT_TRUE(weights);
  EXPECT_FALSE(weights->causal);
  EXPECT_EQ(weights->mask, AttnMask::kBool2d);
  EXPECT_FALSE(key_of("[200,256,1024]", flags("causal=1,attn_mask=1,key_padding_mask=bool")));  // kind unknown
  EXPECT_FALSE(key_of("[200,256,1024]", flags("causal=1,key_padding_mask=bool")));  // torch's error
  static_assert(resolve_masking(true, PaddingMask::kNone, AttnMask::kFloat2d, Weights::kNone).causal);
  static_assert(!resolve_masking(true, PaddingMask::kBool, AttnMask::kFloat2d, Weights::kNone).causal);
  static_assert(resolve_masking(false, PaddingMask::kNone, AttnMask::kBool3d, Weights::kNone).mask == AttnMask::kBool3d);
}

TEST(AttentionKey, CallsTheOpDoesNotTakeHaveNone) {
  EXPECT_FALSE(key_of("[200,256,1024]", flags("key_padding_mask=1")));  // profiles from before the kinds
  EXPECT_FALSE(key_of("[200,256,1024]", flags("attn_mask=1")));  // a mask that is not the causal hint
  EXPECT_FALSE(key_of("[200,256,1024]", flags("key_padding_mask=other")));  // another dtype, device, or grad
  EXPECT_FALSE(key_of("[200,256,1024]", flags("attn_mask=other")));
  EXPECT_FALSE(key_of("[200,256,1024]", flags("attn_mask=bool4d")));  // torch's error
  EXPECT_FALSE(key_of("[200,256,1024]", flags("kdim=1")));  // no sizes (profiles from before them)
  EXPECT_FALSE(key_of("[200,256,1024]", flags("kdim=1,kdim_size=64,vdim_size=64")));  // self-attention with kdim
  EXPECT_FALSE(key_of("[200,256,1024]", flags("bias_kv=1")));
  EXPECT_FALSE(key_of("[200,256,1024]", flags("average=2")));
  EXPECT_FALSE(key_of("[256,1024]", flags()));              // unbatched
  EXPECT_FALSE(key_of("[200,256,512]", flags()));           // the query's width is not embed
  EXPECT_FALSE(key_of("[200,256,1024]", flags("heads=5")));  // 1024 heads of 5 do not divide
  EXPECT_FALSE(key_of("[200,256,1024]", flags("heads=0")));
  EXPECT_FALSE(key_of("[200,128,1024]", flags()));          // self-attention with another key length
  EXPECT_FALSE(key_of("[200,256,1024]", flags("inputs=both")));
  EXPECT_FALSE(key_of("[200,256,1024]", flags("causal=2")));
  EXPECT_FALSE(key_of("[200,256,1024]", flags("embed=x")));
  EXPECT_FALSE(key_of("[200,256,1024]", "embed=1024,heads=16"));  // settings missing
  EXPECT_FALSE(key_of("[200,256,1024]", ""));
  EXPECT_FALSE(key_of("[200,256,1024]", flags() + ",embed=1024"));  // a setting twice
  EXPECT_FALSE(key_of("[200,x,1024]", flags()));
}

TEST(AttentionKey, ProfilesFromBeforeTheNewSettingsStillHaveKeys) {
  const std::string old = "embed=1024,heads=16,kv_len=256,batch_first=1,need_weights=0,attn_mask=0,"
                          "key_padding_mask=0,causal=0";
  const auto self = key_of("[200,256,1024]", old);
  ASSERT_TRUE(self);
  EXPECT_EQ(self->inputs, Inputs::kSelf);
  EXPECT_TRUE(self->bias);
  EXPECT_FALSE(self->dropout);
  const std::string cross = "embed=1024,heads=16,kv_len=77,batch_first=1,need_weights=0,attn_mask=0,"
                            "key_padding_mask=0,causal=0";
  ASSERT_TRUE(key_of("[200,256,1024]", cross));
  EXPECT_EQ(key_of("[200,256,1024]", cross)->inputs, Inputs::kSharedKv);
}

TEST(AttentionKey, TextRoundTripsAndOnlyTheCanonicalSpellingParses) {
  for (const std::string extra : {"", "inputs=kv,kv_len=77", "inputs=qkv,causal=1,attn_mask=1", "bias=0,dropout=1"}) {
    const auto k = key_of("[3,256,1024]", flags(extra));
    ASSERT_TRUE(k) << extra;
    const auto back = parse_key(k->text());
    ASSERT_TRUE(back) << k->text();
    EXPECT_EQ(back->text(), k->text());
  }
  const std::string good = "B=2,L=4,S=4,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0";
  EXPECT_TRUE(parse_key(good));
  EXPECT_FALSE(parse_key("L=4,B=2,S=4,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0"));  // order
  EXPECT_FALSE(parse_key(good + ",x=1"));
  EXPECT_FALSE(parse_key("B=2,L=4,S=4,E=8,H=3,batch_first=1,causal=0,inputs=self,bias=1,dropout=0"));
  EXPECT_FALSE(parse_key("B=02,L=4,S=4,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0"));
  EXPECT_FALSE(parse_key("rows=1024,D=256,affine=1"));  // LayerNorm's
  EXPECT_FALSE(parse_key(""));
  // The optional parts: only what is not the default, in the order text() writes them.
  const std::string full = "B=2,L=4,S=5,E=8,H=2,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0,"
                           "key_padding_mask=bool,attn_mask=float3d,weights=mean,kdim=6,vdim=3";
  ASSERT_TRUE(parse_key(full));
  EXPECT_EQ(parse_key(full)->text(), full);
  EXPECT_EQ(parse_key(full)->kdim, 6);
  const std::string base = "B=2,L=4,S=5,E=8,H=2,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0";
  EXPECT_FALSE(parse_key(base + ",attn_mask=float3d,key_padding_mask=bool"));  // order
  EXPECT_FALSE(parse_key(base + ",key_padding_mask=none"));
  EXPECT_FALSE(parse_key(base + ",attn_mask=float4d"));
  EXPECT_FALSE(parse_key(base + ",weights=0"));
  EXPECT_FALSE(parse_key(base + ",kdim=6"));                                             // vdim missing
  EXPECT_FALSE(parse_key(base + ",kdim=0,vdim=0"));                                      // the default written
  EXPECT_FALSE(parse_key("B=2,L=4,S=4,E=8,H=2,batch_first=1,causal=1,inputs=self,bias=1,dropout=0,"
                         "attn_mask=bool2d"));  // a causal key applies no mask
  EXPECT_FALSE(parse_key("B=2,L=4,S=4,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,"
                         "kdim=6,vdim=6"));  // kdim is never self-attention
}

TEST(AttentionFamily, DescribesOnePassWithACoreAVariant) {
  const families::Family* f = families::find("multihead_attention");
  ASSERT_EQ(f, &kFamily);
  ASSERT_EQ(f->passes.size(), 1u);
  EXPECT_EQ(f->passes[kTrain], "train");
  const auto vs = f->variants("train");
  ASSERT_EQ(vs.size(), kCores.size());
  for (size_t i = 0; i < vs.size(); ++i) {
    EXPECT_EQ(vs[i].name, kCores[i]);
    EXPECT_FALSE(vs[i].idea.empty());
    EXPECT_EQ(families::variant_index(*f, "train", kCores[i]), static_cast<int>(i));
  }
  EXPECT_EQ(families::variant_index(*f, "train", ""), -1);  // torch's pick is the baseline, no variant
  EXPECT_TRUE(f->variants("fwd").empty());
  EXPECT_LT(f->tolerance("float32"), f->tolerance("float16"));
  EXPECT_LT(f->tolerance("float16"), f->tolerance("bfloat16"));
  const families::RecordedShape shape{.shape = "[200,256,1024]", .normalized = "", .dtype = "bfloat16",
                                      .flags = flags("causal=1,attn_mask=1"), .affine = true};
  EXPECT_EQ(f->key_of(shape).value_or(""),
            "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=1,inputs=self,bias=1,dropout=0");
}

TEST(AttentionFamily, LabelsReadAtAGlance) {
  EXPECT_EQ(kFamily.key_label("B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0"),
            "200 x 256, 1024/16");
  EXPECT_EQ(kFamily.key_label("B=8,L=100,S=300,E=512,H=8,batch_first=0,causal=1,inputs=kv,bias=0,dropout=1"),
            "8 x 100 (kv 300), 512/8 cross causal seq-first no-bias dropout");
  EXPECT_EQ(kFamily.key_label("not a key"), "not a key");
  EXPECT_EQ(kFamily.key_label("B=8,L=100,S=300,E=512,H=8,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0,"
                              "key_padding_mask=bool,attn_mask=float2d,weights=per_head,kdim=64,vdim=32"),
            "8 x 100 (kv 300), 512/8 q,k,v kdim 64/vdim 32 pad(bool) mask(float2d) weights(per_head)");
}

TEST(AttentionFamily, PackedKeysAgreeWithTheOpsAndTellEverySettingApart) {
  const std::string text = "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0";
  const auto packed = kFamily.pack_key(text, "bfloat16");
  ASSERT_TRUE(packed);
  // What the op packs for such a call (src/multi_head_attention_op.cpp calls pack() alike).
  EXPECT_EQ(*packed, pack(200, 256, 256, 1024, 16, DType::kBFloat16, true, false, Inputs::kSelf, true, false));
  EXPECT_FALSE(kFamily.pack_key(text, "float64"));
  EXPECT_FALSE(kFamily.pack_key("rows=1,D=2,affine=1", "float32"));
  std::set<families::PackedKey> seen;
  for (const DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int bits = 0; bits < 16; ++bits)
      for (const Inputs in : {Inputs::kSelf, Inputs::kSharedKv, Inputs::kSeparate})
        EXPECT_TRUE(seen.insert(pack(2, 4, 4, 8, 2, d, bits & 1, bits & 2, in, bits & 4, bits & 8)).second);
  EXPECT_NE(pack(2, 4, 6, 8, 2, DType::kFloat32, true, false, Inputs::kSelf, true, false),
            pack(2, 6, 4, 8, 2, DType::kFloat32, true, false, Inputs::kSelf, true, false));
  // Every mask kind, weights and kdim/vdim: apart from each other and from the keys above (whose
  // packing, with none of them, is what it was before they were keys).
  for (int padding = 0; padding < 3; ++padding)
    for (int mask = 0; mask < 5; ++mask)
      for (int weights = 0; weights < 3; ++weights)
        for (const auto& [kdim, vdim] : {std::pair<int64_t, int64_t>{0, 0}, {6, 8}, {8, 6}, {kMaxKvDim, 1}}) {
          if (padding + mask + weights + kdim == 0) continue;
          EXPECT_TRUE(seen.insert(pack(2, 4, 4, 8, 2, DType::kFloat32, true, false, Inputs::kSeparate, true, false,
                                       static_cast<PaddingMask>(padding), static_cast<AttnMask>(mask),
                                       static_cast<Weights>(weights), kdim, vdim))
                          .second);
        }
  const std::string masked = "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,"
                             "key_padding_mask=float,attn_mask=bool2d,weights=mean";
  EXPECT_EQ(kFamily.pack_key(masked, "float16").value(),
            pack(200, 256, 256, 1024, 16, DType::kFloat16, true, false, Inputs::kSelf, true, false,
                 PaddingMask::kFloat, AttnMask::kBool2d, Weights::kMean));
  const std::string kdim = "B=2,L=4,S=5,E=8,H=2,batch_first=0,causal=0,inputs=kv,bias=0,dropout=1,kdim=6,vdim=6";
  EXPECT_EQ(kFamily.pack_key(kdim, "float32").value(),
            pack(2, 4, 5, 8, 2, DType::kFloat32, false, false, Inputs::kSharedKv, false, true, PaddingMask::kNone,
                 AttnMask::kNone, Weights::kNone, 6, 6));
}

TEST(AttentionDispatch, ATablesAttentionWinnersAreFoundByTheOpsPackedKey) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(::testing::TempDir()) / "attention_winners.db";
  fs::remove(path);
  const dispatch::Versions versions{"2.11.0+cu130", "13.0", "0.1.0"};
  const dispatch::Gpu h200{"NVIDIA H200", "9.0", 132};
  {
    profiles::Database db(path.string(), true);
    tuner::TuneEnv env;
    env.gpu = h200.name, env.compute_capability = h200.compute_capability, env.sm_count = h200.sm_count;
    env.cuda = versions.cuda, env.torch = versions.torch, env.hfnn = versions.hfnn;
    const int64_t id = tuner::env_id(db, env, true);
    auto result = [](const std::string& winner) {
      tuner::PassResult p;
      p.pass = "train";
      p.choice.winner = winner;
      return std::vector<tuner::PassResult>{p};
    };
    tuner::store(db, id, "multihead_attention",
                 "B=200,L=256,S=256,E=1024,H=16,batch_first=1,causal=0,inputs=self,bias=1,dropout=0", "bfloat16",
                 result("sdpa_cudnn"));
    tuner::store(db, id, "multihead_attention",
                 "B=32,L=128,S=128,E=768,H=12,batch_first=1,causal=1,inputs=self,bias=1,dropout=0", "bfloat16",
                 result("torch"));
    tuner::store(db, id, "multihead_attention",
                 "B=4,L=8,S=8,E=64,H=4,batch_first=1,causal=0,inputs=self,bias=1,dropout=0", "float32",
                 result("sdpa_gone"));
  }
  const auto t = dispatch::Table::load(path.string(), versions);
  EXPECT_EQ(t.key_count("multihead_attention"), 2u);
  EXPECT_EQ(t.unknown_variants, std::vector<std::string>{"sdpa_gone"});
  const dispatch::WinnerMap* map = t.for_gpu(h200, "multihead_attention");
  ASSERT_NE(map, nullptr);
  const auto won = map->find(pack(200, 256, 256, 1024, 16, DType::kBFloat16, true, false, Inputs::kSelf, true, false));
  ASSERT_NE(won, map->end());
  EXPECT_EQ(won->second[kTrain].index, 2);  // kCores[2]
  EXPECT_EQ(kCores[2], "sdpa_cudnn");
  const auto torch = map->find(pack(32, 128, 128, 768, 12, DType::kBFloat16, true, true, Inputs::kSelf, true, false));
  ASSERT_NE(torch, map->end());
  EXPECT_EQ(torch->second[kTrain].index, dispatch::Pick::kTorch);
  // Another setting of the same sizes is another key: not tuned.
  EXPECT_EQ(map->count(pack(200, 256, 256, 1024, 16, DType::kBFloat16, true, true, Inputs::kSelf, true, false)), 0u);
  EXPECT_EQ(map->count(pack(200, 256, 256, 1024, 16, DType::kFloat16, true, false, Inputs::kSelf, true, false)), 0u);
}

#if HFNN_WITH_CUDA
// hfnn's own cores' limits as supports() states them, on the CPU with a described device: an H100
// or H200 (227 KB of shared memory a block), an A100 (163 KB) and a Turing GPU. The block sizes are
// those the kernels launch with (hfnn_mid at 256 x 256 x 64: 199,680 bytes with Q, K, V, dO, P and
// dS unpadded in wgmma's swizzle; 216,064 with K and V alone swizzled, before the thirtieth session;
// padded, 223,232, as Nsight Compute reported on an H100).
DeviceInfo gpu(int cc_major, int64_t optin_kb) {
  DeviceInfo d;
  d.device = 0, d.sm_count = 132, d.cc_major = cc_major, d.smem_per_block_optin = optin_kb * 1024;
  return d;
}

ShortShape shape(int64_t length, int64_t kv_length, int64_t head_dim, DType dtype, const DeviceInfo& d) {
  ShortShape s;
  s.batch = 2, s.heads = 3, s.q_len = length, s.kv_len = kv_length, s.head_dim = head_dim, s.dtype = dtype;
  s.device = d;
  return s;
}

TEST(AttentionCores, MidSupportsIsItsLimits) {
  const DeviceInfo hopper = gpu(9, 227), ampere = gpu(8, 163), turing = gpu(7, 64);
  EXPECT_EQ(mid_bwd_smem(shape(256, 256, 64, DType::kBFloat16, hopper)), 199680u);
  ShortShape causal = shape(256, 256, 64, DType::kBFloat16, hopper);
  causal.causal = true;
  EXPECT_EQ(mid_bwd_smem(causal), 199680u);
  // The swizzled kernels pad the query rows to warpgroups of 64: 129 rows take 192's memory; the
  // others (keys not in whole steps of 64) pad to 16.
  EXPECT_EQ(mid_bwd_smem(shape(129, 128, 64, DType::kBFloat16, hopper)),
            mid_bwd_smem(shape(192, 128, 64, DType::kBFloat16, hopper)));
  EXPECT_LT(mid_bwd_smem(shape(129, 120, 64, DType::kBFloat16, hopper)),
            mid_bwd_smem(shape(192, 120, 64, DType::kBFloat16, hopper)));
  // Only Hopper's code has wgmma: elsewhere the padded layout, so an A100 keeps every shape that
  // fitted it before the swizzle (129 x 256 x 64: 166,400 bytes swizzled, its 192 query rows'
  // arrays unpadded; 178,688 with K and V alone swizzled).
  EXPECT_EQ(mid_bwd_smem(shape(129, 256, 64, DType::kBFloat16, hopper)), 166400u);
  EXPECT_TRUE(mid_supports(shape(129, 256, 64, DType::kBFloat16, ampere)));
  EXPECT_TRUE(mid_supports(shape(200, 128, 64, DType::kBFloat16, ampere)));
  std::string why;
  for (int64_t length : {1, 15, 16, 17, 63, 64, 65, 128, 129, 200, 255, 256})
    for (int64_t head_dim : {16, 32, 48, 64}) {
      EXPECT_TRUE(mid_supports(shape(length, 257 - length, head_dim, DType::kBFloat16, hopper), &why))
          << length << " " << head_dim << ": " << why;
      EXPECT_TRUE(why.empty());
    }
  EXPECT_TRUE(mid_supports(shape(256, 256, 64, DType::kFloat16, hopper)));
  EXPECT_FALSE(mid_supports(shape(257, 256, 64, DType::kBFloat16, hopper), &why));
  EXPECT_EQ(why, "sequences of 1 to 256 tokens");
  EXPECT_FALSE(mid_supports(shape(256, 257, 64, DType::kBFloat16, hopper)));
  EXPECT_FALSE(mid_supports(shape(0, 16, 64, DType::kBFloat16, hopper)));
  for (int64_t head_dim : {8, 24, 80, 128}) {
    EXPECT_FALSE(mid_supports(shape(64, 64, head_dim, DType::kBFloat16, hopper), &why)) << head_dim;
    EXPECT_EQ(why, "head size 16, 32, 48 or 64");
  }
  EXPECT_FALSE(mid_supports(shape(64, 64, 64, DType::kFloat32, hopper), &why));
  EXPECT_EQ(why, "float16 or bfloat16 only (tensor-core products)");
  // 256 x 256 x 64 needs 218 KB padded: more than an A100 gives a block; 128 x 128 x 64 fits it.
  EXPECT_FALSE(mid_supports(shape(256, 256, 64, DType::kBFloat16, ampere), &why));
  EXPECT_NE(why.find("shared memory"), std::string::npos) << why;
  EXPECT_TRUE(mid_supports(shape(128, 128, 64, DType::kBFloat16, ampere)));
  EXPECT_FALSE(mid_supports(shape(64, 64, 64, DType::kBFloat16, turing)));
  EXPECT_FALSE(mid_supports(shape(64, 64, 64, DType::kBFloat16, DeviceInfo{})));
}

TEST(AttentionCores, MidSupportsReadsTheViews) {
  alignas(16) static unsigned char buffer[64];
  MidBwdParams p;
  p.shape = shape(64, 64, 64, DType::kBFloat16, gpu(9, 227));
  const Strides st{3 * 64 * 64, 64 * 64, 64};
  p.q = p.k = p.v = p.o = p.dout = buffer;
  p.dq = p.dk = p.dv = buffer;
  p.sq = p.sk = p.sv = p.so = p.sdo = p.sdq = p.sdk = p.sdv = st;
  p.lse = reinterpret_cast<const float*>(buffer);
  std::string why;
  EXPECT_TRUE(mid_supports(p, &why)) << why;
  p.o = buffer + 2;  // not 16-byte aligned
  EXPECT_FALSE(mid_supports(p, &why));
  p.o = buffer;
  p.sdo.l = 68;  // a row stride not a multiple of 8 elements
  EXPECT_FALSE(mid_supports(p));
  p.sdo = st;
  p.lse = nullptr;
  EXPECT_FALSE(mid_supports(p, &why));
  EXPECT_EQ(why, "a float log-sum-exp");
}

TEST(AttentionCores, ShortSupportsIsItsLimits) {
  const DeviceInfo hopper = gpu(9, 227);
  for (int64_t length : {1, 16, 17, 64, 127, 128})
    for (int64_t head_dim : {16, 64, 128})
      EXPECT_TRUE(short_supports(shape(length, length, head_dim, DType::kBFloat16, hopper)))
          << length << " " << head_dim;
  EXPECT_FALSE(short_supports(shape(129, 128, 64, DType::kBFloat16, hopper)));
  EXPECT_FALSE(short_supports(shape(64, 64, 144, DType::kBFloat16, hopper)));
  EXPECT_FALSE(short_supports(shape(64, 64, 64, DType::kFloat32, hopper)));
  // Its backward block grows with L and S: under hfnn_mid's at the length both take.
  EXPECT_LT(mid_bwd_smem(shape(128, 128, 64, DType::kBFloat16, hopper)),
            short_bwd_smem(shape(128, 128, 64, DType::kBFloat16, hopper)));
}
#endif

}  // namespace
}  // namespace hfnn::kernels::multihead_attention
