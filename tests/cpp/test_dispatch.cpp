// HFNN_DISPATCH_DB's table (src/dispatch.h) on the CPU: written the way hfnn tune writes it, read
// back per GPU, versions and family; the faults that must never stop training; per-device
// resolution; counting per family and pass. A fake family registered only here (three passes,
// variants without CUDA) stands for the families to come beside LayerNorm.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/common/dtype.h"
#include "kernels/common/family.h"
#include "kernels/layer_norm/layer_norm_family.h"
#include "kernels/lstm/lstm_family.h"
#include "profiles/db.h"
#include "src/dispatch.h"
#include "tuner/tune_db.h"
#if HFNN_WITH_CUDA
#include "kernels/layer_norm/layer_norm.h"
#endif

namespace hfnn::dispatch {
namespace {

namespace fs = std::filesystem;
namespace ln = kernels::layer_norm;
using kernels::DType;

const Versions kVersions{"2.11.0+cu130", "13.0", "0.1.0"};
const Gpu kH200{"NVIDIA H200", "9.0", 132};

// The fake family: key "n=<n>" in float16 only, packed as {n, 7}; passes fwd, bwd_a, bwd_b.
namespace fake {
constexpr std::array<std::string_view, 3> kPasses = {"fwd", "bwd_a", "bwd_b"};
PackedKey pack(int64_t n) { return {n, 7, 0, 0, 0, 0}; }
std::optional<PackedKey> pack_key(const std::string& key, const std::string& dtype) {
  int64_t n = 0;
  if (dtype != "float16" || !key.starts_with("n=")) return std::nullopt;
  const auto [end, ec] = std::from_chars(key.data() + 2, key.data() + key.size(), n);
  if (ec != std::errc() || end != key.data() + key.size()) return std::nullopt;
  return pack(n);
}
std::vector<families::VariantInfo> variants(std::string_view pass) {
  return {{std::string(pass) + "_v0", "first"}, {std::string(pass) + "_v1", "second"}};
}
const families::Family kFamily = {
    .op = "fake_attention",
    .title = "FakeAttention",
    .key_header = "n",
    .passes = kPasses,
    .key_of = [](const families::RecordedShape&) -> std::optional<std::string> { return std::nullopt; },
    .key_label = [](const std::string& key) { return key; },
    .tolerance = [](const std::string&) { return 1e-3; },
    .variants = &variants,
    .pack_key = &pack_key,
};
const std::array<const families::Family*, 2> kWithFake = {&ln::kFamily, &kFamily};
}  // namespace fake

tuner::PassResult winner(const std::string& pass, const std::string& name) {
  tuner::PassResult p;
  p.pass = pass;
  p.choice.winner = name;
  p.choice.torch_us = 100;
  p.choice.best_us = name == "torch" ? 100 : 50;
  return p;
}

// A database as `hfnn tune` leaves it: one env per (GPU, versions), winners per op, key and pass.
// Besides LayerNorm's: the fake family's, and an op recorded but with no family in any build.
fs::path tuned_db(const std::string& name) {
  const fs::path path = fs::path(::testing::TempDir()) / name;
  fs::remove(path);
  profiles::Database db(path.string(), true);
  tuner::TuneEnv env;
  env.gpu = kH200.name;
  env.compute_capability = kH200.compute_capability;
  env.sm_count = kH200.sm_count;
  env.cuda = kVersions.cuda;
  env.torch = kVersions.torch;
  env.hfnn = kVersions.hfnn;
  const int64_t id = tuner::env_id(db, env, true);
  tuner::store(db, id, "layer_norm", "rows=32768,D=256,affine=1", "float32",
               {winner("fwd", "fwd_regs_tpr8"), winner("bwd", "torch")});
  tuner::store(db, id, "layer_norm", "rows=65536,D=128,affine=1", "bfloat16",
               {winner("fwd", "fwd_no_such_variant"), winner("bwd", "bwd_block")});
  tuner::store(db, id, "fake_attention", "n=512", "float16",
               {winner("fwd", "torch"), winner("bwd_b", "bwd_b_v1"), winner("bwd_a", "bwd_a_gone")});
  tuner::store(db, id, "gru", "whatever", "float32", {winner("fwd", "gru_variant")});
  env.torch = "2.10.0+cu128";  // another torch: never applied here
  tuner::store(db, tuner::env_id(db, env, true), "layer_norm", "rows=8,D=8,affine=0", "float32",
               {winner("fwd", "fwd_block")});
  return path;
}

int fwd_index(std::string_view name) { return families::variant_index(ln::kFamily, "fwd", name); }

TEST(DispatchTable, ReadsTheWinnersOfThisGpuAndTheseVersions) {
#if !HFNN_WITH_CUDA
  GTEST_SKIP() << "built without CUDA: no kernel registry to resolve LayerNorm's variant names";
#endif
  const Table t = Table::load(tuned_db("tuned.db").string(), kVersions);
  ASSERT_EQ(t.gpu_count(), 1u);
  const WinnerMap* map = t.for_gpu(kH200, "layer_norm");
  ASSERT_NE(map, nullptr);
  const auto a = map->find(ln::pack(32768, 256, DType::kFloat32, true));
  ASSERT_NE(a, map->end());
  EXPECT_EQ(a->second[ln::kFwd].index, fwd_index("fwd_regs_tpr8"));
  EXPECT_GE(a->second[ln::kFwd].index, 0);
  EXPECT_EQ(a->second[ln::kBwd].index, Pick::kTorch);
  const auto b = map->find(ln::pack(65536, 128, DType::kBFloat16, true));
  ASSERT_NE(b, map->end());
  EXPECT_EQ(b->second[ln::kFwd].index, Pick::kNotTuned);  // a name this build does not have
  EXPECT_GE(b->second[ln::kBwd].index, 0);
  // The fake family's and the op without a family are skipped quietly: not unknown variants.
  EXPECT_EQ(t.unknown_variants, std::vector<std::string>{"fwd_no_such_variant"});
  EXPECT_EQ(t.key_count(), 2u);
  EXPECT_EQ(t.key_count("layer_norm"), 2u);
  EXPECT_EQ(map->count(ln::pack(8, 8, DType::kFloat32, false)), 0u);  // tuned with another torch
  EXPECT_EQ(map->count(ln::pack(32768, 256, DType::kFloat32, false)), 0u);
  EXPECT_EQ(t.other_versions, std::vector<std::string>{"torch 2.10.0+cu128, CUDA 13.0, hfnn 0.1.0"});
  EXPECT_EQ(t.for_gpu(Gpu{"NVIDIA H100 80GB HBM3", "9.0", 132}, "layer_norm"), nullptr);
  EXPECT_EQ(t.for_gpu(Gpu{"NVIDIA H200", "9.0", 114}, "layer_norm"), nullptr);  // same name, other SM count
}

TEST(DispatchTable, FindsLstmWinnersByTheKeyTheOpPacks) {
  const fs::path path = tuned_db("lstm.db");
  {
    profiles::Database db(path.string(), true);
    tuner::TuneEnv env;
    env.gpu = kH200.name, env.compute_capability = kH200.compute_capability, env.sm_count = kH200.sm_count;
    env.cuda = kVersions.cuda, env.torch = kVersions.torch, env.hfnn = kVersions.hfnn;
    const int64_t id = tuner::env_id(db, env, true);
    namespace lstm = kernels::lstm;
    lstm::Key seed;
    seed.input = 985, seed.hidden = 985, seed.batch = 4, seed.steps = 1000, seed.batch_first = true;
    tuner::store(db, id, "lstm", seed.text(), "bfloat16", {winner("train", "persistent")});
    lstm::Key big = seed;
    big.hidden = 4096, big.bidirectional = true;
    tuner::store(db, id, "lstm", big.text(), "float32", {winner("train", "torch")});
  }
  const Table t = Table::load(path.string(), kVersions);
  EXPECT_EQ(t.key_count("lstm"), 2u);
  const WinnerMap* map = t.for_gpu(kH200, "lstm");
  ASSERT_NE(map, nullptr);
  namespace lstm = kernels::lstm;
  const auto big = map->find(lstm::pack(985, 4096, 1, 4, 1000, DType::kFloat32, true, true, true, false));
  ASSERT_NE(big, map->end());
  EXPECT_EQ(big->second[lstm::kTrain].index, Pick::kTorch);
  EXPECT_EQ(map->count(lstm::pack(985, 985, 1, 4, 1000, DType::kFloat16, false, true, true, false)), 0u);
#if HFNN_WITH_CUDA
  const auto seed = map->find(lstm::pack(985, 985, 1, 4, 1000, DType::kBFloat16, false, true, true, false));
  ASSERT_NE(seed, map->end());
  EXPECT_EQ(seed->second[lstm::kTrain].index, 0);  // persistent: first in the registry
#endif
}

TEST(DispatchTable, HoldsEachFamilysWinnersApartAndSkipsOpsWithoutAFamily) {
  const Table t = Table::load(tuned_db("two_families.db").string(), kVersions, fake::kWithFake);
  ASSERT_EQ(t.gpu_count(), 1u);
  const WinnerMap* map = t.for_gpu(kH200, "fake_attention");
  ASSERT_NE(map, nullptr);
  ASSERT_EQ(map->size(), 1u);
  const Winners& w = map->at(fake::pack(512));
  EXPECT_EQ(w[0].index, Pick::kTorch);
  EXPECT_EQ(w[1].index, Pick::kNotTuned);  // bwd_a's winner is not among the variants
  EXPECT_EQ(w[2].index, 1);                // bwd_b_v1: second in variants("bwd_b")
  EXPECT_EQ(w[3].index, Pick::kNotTuned);  // beyond the family's passes
  EXPECT_EQ(t.key_count("fake_attention"), 1u);
  EXPECT_EQ(t.key_count("gru"), 0u);
  EXPECT_EQ(t.key_count(), t.key_count("layer_norm") + 1);
  // LayerNorm's keys never collide with the fake family's, though both are packed integers.
  EXPECT_EQ(t.for_gpu(kH200, "layer_norm")->count(fake::pack(512)), 0u);
  // A tuned GPU without winners of an op: an empty map (keys not tuned), not "no table".
  const WinnerMap* none = t.for_gpu(kH200, "gru");
  ASSERT_NE(none, nullptr);
  EXPECT_TRUE(none->empty());
  std::vector<std::string> unknown = t.unknown_variants;
#if HFNN_WITH_CUDA
  EXPECT_EQ(unknown, (std::vector<std::string>{"bwd_a_gone", "fwd_no_such_variant"}));
#else  // no LayerNorm variants at all in this build
  EXPECT_NE(std::find(unknown.begin(), unknown.end(), "bwd_a_gone"), unknown.end());
  EXPECT_EQ(std::find(unknown.begin(), unknown.end(), "mha_variant"), unknown.end());
#endif
}

TEST(DispatchKeys, PackingAStoredKeyEqualsPackingTheSizesOfItsCalls) {
  const families::Family& f = ln::kFamily;
  // What the profiler recorded -> the stored key (tuner) -> packed at load; and the op's sizes.
  const families::RecordedShape shape{.shape = "[8,4096,256]", .normalized = "[256]", .dtype = "bfloat16", .flags = "", .affine = false};
  const auto key = f.key_of(shape);
  ASSERT_TRUE(key);
  EXPECT_EQ(f.pack_key(*key, shape.dtype), ln::pack(8 * 4096, 256, DType::kBFloat16, false));
  EXPECT_EQ(f.pack_key("rows=32768,D=256,affine=1", "float32"), ln::pack(32768, 256, DType::kFloat32, true));
  EXPECT_NE(f.pack_key("rows=32768,D=256,affine=1", "float16"), f.pack_key("rows=32768,D=256,affine=1", "float32"));
  EXPECT_NE(f.pack_key("rows=32768,D=256,affine=0", "float32"), f.pack_key("rows=32768,D=256,affine=1", "float32"));
  EXPECT_NE(f.pack_key("rows=256,D=32768,affine=1", "float32"), f.pack_key("rows=32768,D=256,affine=1", "float32"));
  EXPECT_FALSE(f.pack_key("rows=32768,D=256,affine=1", "float64"));  // no kernel takes it
  EXPECT_FALSE(f.pack_key("n=512", "float32"));
  for (const DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    EXPECT_EQ(kernels::dtype_from_name(kernels::dtype_name(d)), d);
  EXPECT_EQ(families::pass_index(f, "bwd"), ln::kBwd);
  EXPECT_EQ(families::pass_index(f, "fwd"), ln::kFwd);
  EXPECT_EQ(families::pass_index(f, "bwd_a"), -1);
}

TEST(DispatchKeys, EveryFamilyPacksWhatItsVariantsAndPassesFit) {
  for (const families::Family* f : families::all()) {
    EXPECT_LE(f->passes.size(), static_cast<size_t>(kMaxPasses)) << f->op;
    for (const auto pass : f->passes) EXPECT_LE(f->variants(pass).size(), static_cast<size_t>(kMaxVariants)) << f->op;
  }
  EXPECT_LE(families::all().size(), static_cast<size_t>(kMaxFamilies));
#if HFNN_WITH_CUDA
  // The index dispatch stores is the one the op runs by: the registry's order.
  for (size_t i = 0; i < ln::fwd_variants().size(); ++i)
    EXPECT_EQ(families::variant_index(ln::kFamily, "fwd", ln::fwd_variants()[i].name), static_cast<int>(i));
  for (size_t i = 0; i < ln::bwd_variants().size(); ++i)
    EXPECT_EQ(families::variant_index(ln::kFamily, "bwd", ln::bwd_variants()[i].name), static_cast<int>(i));
#endif
}

TEST(DispatchTable, OtherVersionsLoadEmptyAndSaySo) {
  const Table t = Table::load(tuned_db("versions.db").string(), {"2.12.0", "13.0", "0.1.0"});
  EXPECT_EQ(t.gpu_count(), 0u);
  EXPECT_EQ(t.other_versions.size(), 2u);
}

TEST(DispatchTable, FaultsAreOneLineErrors) {
  const fs::path dir = ::testing::TempDir();
  try {
    Table::load((dir / "missing.db").string(), kVersions);
    FAIL() << "a missing file loaded";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
  const fs::path junk = dir / "junk.db";
  std::ofstream(junk) << "not sqlite at all";
  EXPECT_THROW(Table::load(junk.string(), kVersions), LoadError);
  const fs::path corrupt = dir / "corrupt.db";
  fs::copy_file(tuned_db("to_corrupt.db"), corrupt, fs::copy_options::overwrite_existing);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    const std::string garbage(8192, '\x5a');
    f.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  EXPECT_THROW(Table::load(corrupt.string(), kVersions), LoadError);
  const fs::path profile_only = dir / "profile_only.db";
  fs::remove(profile_only);
  { profiles::Database db(profile_only.string(), true); }
  try {
    Table::load(profile_only.string(), kVersions);
  } catch (const LoadError& e) {
    ADD_FAILURE() << "a database with empty tune tables should load empty, got: " << e.what();
  }
}

TEST(DispatchRuntime, ResolvesEachDeviceOnceAndCounts) {
  auto& rt = Runtime::get();
  const int layer_norm = rt.family_index("layer_norm");
  ASSERT_GE(layer_norm, 0);
  EXPECT_GE(rt.family_index("multihead_attention"), 0);
  EXPECT_GE(rt.family_index("lstm"), 0);
  EXPECT_EQ(rt.family_index("gru"), -1);
  rt.configure(std::make_shared<const Table>(Table::load(tuned_db("runtime.db").string(), kVersions)), "runtime.db",
               Policy::kTorch, false);
  rt.reset_counts();
  int asked = 0;
  auto props = [&] {
    ++asked;
    return kH200;
  };
  const WinnerMap* first = rt.for_device(layer_norm, 0, props);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(rt.for_device(layer_norm, 0, props), first);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(rt.for_device(layer_norm, 1, [] { return Gpu{"Other", "8.0", 108}; }), nullptr);  // warns once
  rt.count_variant(layer_norm, ln::kFwd, 0);
  rt.count_variant(layer_norm, ln::kFwd, 0);
  rt.count_fallback(layer_norm, ln::kBwd, Fallback::kTorchWon);
  const auto stats = nlohmann::json::parse(rt.stats_json());
  const auto& calls = stats["ops"]["layer_norm"]["calls"];
  EXPECT_EQ(calls["bwd"], (nlohmann::json{{"torch", 1}})) << stats;
  EXPECT_EQ(stats["ops"]["layer_norm"]["fallbacks"]["bwd"], (nlohmann::json{{"torch won the tuning", 1}})) << stats;
  EXPECT_EQ(calls["fwd"].size(), 1u) << stats;
  EXPECT_EQ(calls["fwd"].begin().value(), 2) << stats;
  EXPECT_EQ(stats["ops"]["layer_norm"]["keys"], stats["keys"]);
  rt.configure(nullptr, "strict.db", Policy::kTorch, true);
  EXPECT_THROW(rt.warn_once("x", "a problem"), std::runtime_error);  // HFNN_STRICT=1
  rt.configure(nullptr, "", Policy::kTorch, false);
  rt.reset_counts();
}

TEST(DispatchRuntime, CountsAndResolvesPerFamily) {
  const auto rt = std::make_unique<Runtime>(fake::kWithFake);
  const int layer_norm = rt->family_index("layer_norm"), attention = rt->family_index("fake_attention");
  ASSERT_EQ(layer_norm, 0);
  ASSERT_EQ(attention, 1);
  rt->configure(std::make_shared<const Table>(Table::load(tuned_db("per_family.db").string(), kVersions, fake::kWithFake)),
                "per_family.db", Policy::kTorch, false);
  int asked = 0;
  auto props = [&] {
    ++asked;
    return kH200;
  };
  const WinnerMap* fake_map = rt->for_device(attention, 3, props);
  ASSERT_NE(fake_map, nullptr);
  EXPECT_EQ(fake_map->count(fake::pack(512)), 1u);
  const WinnerMap* ln_map = rt->for_device(layer_norm, 3, props);  // resolved with the first family's call
  ASSERT_NE(ln_map, nullptr);
  EXPECT_NE(ln_map, fake_map);
  EXPECT_EQ(asked, 1);
  rt->count_variant(attention, 2, 1);
  rt->count_variant(attention, 2, 1);
  rt->count_variant(attention, 2, 0);
  rt->uncount_variant(attention, 2, 0);  // its launch failed: torch ran
  rt->count_fallback(attention, 2, Fallback::kLaunchFailed);
  rt->count_fallback(attention, 0, Fallback::kNotTuned);
  rt->count_fallback(layer_norm, ln::kFwd, Fallback::kCpuTensor);
  rt->count_variant(attention, kMaxPasses, 0);  // out of range: ignored, not a crash
  const auto stats = nlohmann::json::parse(rt->stats_json());
  const auto& fa = stats["ops"]["fake_attention"];
  EXPECT_EQ(fa["title"], "FakeAttention");
  EXPECT_EQ(fa["keys"], 1);
  EXPECT_EQ(fa["calls"], (nlohmann::json{{"fwd", {{"torch", 1}}}, {"bwd_a", nlohmann::json::object()},
                                         {"bwd_b", {{"bwd_b_v1", 2}, {"torch", 1}}}}))
      << stats;
  EXPECT_EQ(fa["fallbacks"]["bwd_b"], (nlohmann::json{{"kernel launch failed", 1}})) << stats;
  EXPECT_EQ(fa["fallbacks"]["fwd"], (nlohmann::json{{"shape not tuned", 1}})) << stats;
  const auto& ln_stats = stats["ops"]["layer_norm"];
  EXPECT_EQ(ln_stats["calls"], (nlohmann::json{{"fwd", {{"torch", 1}}}, {"bwd", nlohmann::json::object()}})) << stats;
  EXPECT_EQ(stats["keys"], stats["ops"]["layer_norm"]["keys"].get<int>() + 1);
  rt->reset_counts();
  const auto reset = nlohmann::json::parse(rt->stats_json());
  EXPECT_TRUE(reset["ops"]["fake_attention"]["calls"]["bwd_b"].empty()) << reset;
}

TEST(DispatchRuntime, RefusesFamiliesBeyondItsArrays) {
  const std::vector<std::string_view> passes(kMaxPasses + 1, "fwd");
  families::Family many = fake::kFamily;
  many.passes = passes;
  const std::array<const families::Family*, 1> one = {&many};
  EXPECT_THROW(Runtime{one}, std::invalid_argument);
  const std::vector<const families::Family*> too_many(kMaxFamilies + 1, &fake::kFamily);
  EXPECT_THROW(Runtime{too_many}, std::invalid_argument);
}

TEST(DispatchRouters, LoadingATableRunsEveryRouterAddedAtEveryLoad) {
  static int runs_a = 0, runs_b = 0;
  add_router([] { ++runs_a; });
  add_router([] { ++runs_b; });
  run_routers();
  run_routers();
  EXPECT_EQ(runs_a, 2);
  EXPECT_EQ(runs_b, 2);
}

}  // namespace
}  // namespace hfnn::dispatch
