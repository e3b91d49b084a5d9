// HFNN_DISPATCH_DB's table (src/dispatch.h) on the CPU: written the way hfnn tune writes it, read
// back per GPU and versions; the faults that must never stop training; per-device resolution.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kernels/common/dtype.h"
#include "kernels/layer_norm/layer_norm.h"
#include "profiles/db.h"
#include "src/dispatch.h"
#include "tuner/tune_db.h"

namespace hfnn::dispatch {
namespace {

namespace fs = std::filesystem;

const Versions kVersions{"2.11.0+cu130", "13.0", "0.1.0"};
const Gpu kH200{"NVIDIA H200", "9.0", 132};

tuner::PassResult winner(const std::string& pass, const std::string& name) {
  tuner::PassResult p;
  p.pass = pass;
  p.choice.winner = name;
  p.choice.torch_us = 100;
  p.choice.best_us = name == "torch" ? 100 : 50;
  return p;
}

// A database as `hfnn tune` leaves it: one env per (GPU, versions), winners per key and pass.
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
  env.torch = "2.10.0+cu128";  // another torch: never applied here
  tuner::store(db, tuner::env_id(db, env, true), "layer_norm", "rows=8,D=8,affine=0", "float32",
               {winner("fwd", "fwd_block")});
  return path;
}

int fwd_index(std::string_view name) {
#if HFNN_WITH_CUDA
  namespace k = kernels::layer_norm;
  if (const auto* v = k::find_fwd(name)) return static_cast<int>(v - k::fwd_variants().data());
#endif
  return -1;
}

TEST(DispatchTable, ReadsTheWinnersOfThisGpuAndTheseVersions) {
#if !HFNN_WITH_CUDA
  GTEST_SKIP() << "built without CUDA: no kernel registry to resolve variant names";
#endif
  const Table t = Table::load(tuned_db("tuned.db").string(), kVersions);
  ASSERT_EQ(t.gpu_count(), 1u);
  const WinnerMap* map = t.for_gpu(kH200);
  ASSERT_NE(map, nullptr);
  const int f32 = static_cast<int>(kernels::DType::kFloat32), bf16 = static_cast<int>(kernels::DType::kBFloat16);
  const auto a = map->find(Key{32768, 256, f32, true});
  ASSERT_NE(a, map->end());
  EXPECT_EQ(a->second.fwd.index, fwd_index("fwd_regs_tpr8"));
  EXPECT_EQ(a->second.bwd.index, Pick::kTorch);
  const auto b = map->find(Key{65536, 128, bf16, true});
  ASSERT_NE(b, map->end());
  EXPECT_EQ(b->second.fwd.index, Pick::kNotTuned);  // a name this build does not have
  EXPECT_GE(b->second.bwd.index, 0);
  EXPECT_EQ(t.unknown_variants, std::vector<std::string>{"fwd_no_such_variant"});
  EXPECT_EQ(map->count(Key{8, 8, f32, false}), 0u);  // tuned with another torch
  EXPECT_EQ(map->count(Key{32768, 256, f32, false}), 0u);
  EXPECT_EQ(t.other_versions, std::vector<std::string>{"torch 2.10.0+cu128, CUDA 13.0, hfnn 0.1.0"});
  EXPECT_EQ(t.for_gpu(Gpu{"NVIDIA H100 80GB HBM3", "9.0", 132}), nullptr);
  EXPECT_EQ(t.for_gpu(Gpu{"NVIDIA H200", "9.0", 114}), nullptr);  // same name, other SM count: another GPU
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
  rt.configure(std::make_shared<const Table>(Table::load(tuned_db("runtime.db").string(), kVersions)), "runtime.db",
               Policy::kTorch, false);
  rt.reset_counts();
  int asked = 0;
  auto props = [&] {
    ++asked;
    return kH200;
  };
  const WinnerMap* first = rt.for_device(0, props);
  EXPECT_EQ(rt.for_device(0, props), first);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(rt.for_device(1, [] { return Gpu{"Other", "8.0", 108}; }), nullptr);  // warns once, torch there
  rt.count_variant(false, 0);
  rt.count_variant(false, 0);
  rt.count_fallback(true, Fallback::kTorchWon);
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"torch won the tuning\":1"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"torch\":1"), std::string::npos) << stats;
  rt.configure(nullptr, "strict.db", Policy::kTorch, true);
  EXPECT_THROW(rt.warn_once("x", "a problem"), std::runtime_error);  // HFNN_STRICT=1
}

}  // namespace
}  // namespace hfnn::dispatch
