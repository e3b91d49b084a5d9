// The built-in choice (src/layer_norm_select.h): the measured data is read and indexed, the nearest
// measured point is found by width class, width and size, a ranking is walked in order and stops
// at torch, and the compiled-in data names only variants this build has. The lookup needs no GPU;
// the last test, which asks real variants whether they support a problem, does.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/layer_norm_select.h"

namespace ln = hfnn::layer_norm;
using hfnn::kernels::DType;

namespace {

const std::vector<std::string> kFwd = {"fwd_a", "fwd_b", "fwd_c"};
const std::vector<std::string> kBwd = {"bwd_a", "bwd_b"};

const char* kData = R"({"gpus": [
  {"name": "GPU One", "compute_capability": "9.0", "points": [
    {"dtype": "float32", "pass": "fwd", "rows": 1000, "cols": 64, "ranking": ["fwd_b", "fwd_a", "torch"]},
    {"dtype": "float32", "pass": "fwd", "rows": 16, "cols": 64, "ranking": ["torch", "fwd_b"]},
    {"dtype": "float32", "pass": "fwd", "rows": 1000, "cols": 1024, "ranking": ["fwd_c", "fwd_gone", "torch"]},
    {"dtype": "float32", "pass": "fwd", "rows": 1000, "cols": 63, "ranking": ["fwd_a", "torch"]},
    {"dtype": "float32", "pass": "bwd", "rows": 1000, "cols": 64, "ranking": ["bwd_b"]},
    {"dtype": "bfloat16", "pass": "fwd", "rows": 1000, "cols": 64, "ranking": ["torch"]}
  ]},
  {"name": "GPU Two", "compute_capability": "8.0", "points": []},
  {"name": "Other One X", "compute_capability": "9.0", "points": []}
]})";

ln::Defaults data() { return ln::Defaults::parse(kData, kFwd, kBwd); }

}  // namespace

TEST(LayerNormDefaults, FindsTheGpuByNameThenByComputeCapability) {
  const auto d = data();
  ASSERT_EQ(d.gpus().size(), 3u);
  EXPECT_EQ(d.for_gpu("GPU One", "7.5")->name, "GPU One");
  EXPECT_EQ(d.for_gpu("GPU Three", "9.0")->name, "GPU One");  // same architecture, nearest name
  EXPECT_EQ(d.for_gpu("Other One Y", "9.0")->name, "Other One X");
  EXPECT_EQ(d.for_gpu("Unrelated", "9.0")->name, "GPU One");  // no common start: the first measured
  EXPECT_EQ(d.for_gpu("GPU Three", "8.6"), nullptr);          // never measured: torch runs
}

TEST(LayerNormDefaults, NearestPointByWidthThenSize) {
  const auto d = data();
  const auto* g = d.for_gpu("GPU One", "9.0");
  ASSERT_NE(g, nullptr);
  // Exact width, nearest size: 900 rows is nearest 1000, 20 rows nearest 16.
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 900, 64)->rows, 1000);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 20, 64)->rows, 16);
  // Between measured widths: log-scale distance (200 is nearer 64 than 1024; 300 nearer 1024).
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 200)->cols, 64);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 300)->cols, 1024);
  // Past the last measured width: the widest, up to 4x away (4096 is exactly 4x 1024); further,
  // nothing (torch).
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 4096)->cols, 1024);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 4104), nullptr);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 1 << 20), nullptr);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 8), nullptr);  // 8x below 64
  // Widths without 16-byte rows only look at widths aligned like them: 65 takes 63's point, and so
  // does 201 (3.2x); 4097 is 65x away: nothing.
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 65)->cols, 63);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 201)->cols, 63);
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 4097), nullptr);
  // 8-byte rows (cols = 2 mod 4) were not measured: nothing, neither the 4-byte (odd) data nor the
  // 16-byte data answers for them.
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 66), nullptr);
  // Dtype and pass are separate tables; none for float16 here.
  EXPECT_EQ(g->nearest(DType::kFloat16, false, 1000, 64), nullptr);
  EXPECT_EQ(g->nearest(DType::kBFloat16, true, 1000, 64), nullptr);
  // bfloat16 has only a 16-byte point (64): a width with 2-byte rows has nothing to go by (torch).
  EXPECT_EQ(g->nearest(DType::kBFloat16, false, 1000, 63), nullptr);
  EXPECT_EQ(g->nearest(DType::kBFloat16, false, 1000, 72)->cols, 64);
}

TEST(LayerNormDefaults, RankingsResolveNamesAndEndAtTorch) {
  const auto d = data();
  const auto* g = d.for_gpu("GPU One", "9.0");
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 64)->ranking, (std::vector<int>{1, 0, ln::kTorch}));
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 16, 64)->ranking, (std::vector<int>{ln::kTorch}));
  // A name this build lacks is dropped, not an error.
  EXPECT_EQ(g->nearest(DType::kFloat32, false, 1000, 1024)->ranking, (std::vector<int>{2, ln::kTorch}));
  // A ranking without torch at its end gets it.
  EXPECT_EQ(g->nearest(DType::kFloat32, true, 1000, 64)->ranking, (std::vector<int>{1, ln::kTorch}));
}

TEST(LayerNormDefaults, WalkTakesTheFirstSupportingVariantAndStopsAtTorch) {
  const std::vector<int> ranking = {1, 0, ln::kTorch, 2};
  EXPECT_EQ(ln::first_accepted(ranking, [](int) { return true; }), 1);
  EXPECT_EQ(ln::first_accepted(ranking, [](int i) { return i != 1; }), 0);
  EXPECT_EQ(ln::first_accepted(ranking, [](int i) { return i == 2; }), ln::kTorch);  // torch ranks above 2
  EXPECT_EQ(ln::first_accepted({}, [](int) { return true; }), ln::kTorch);
}

TEST(LayerNormDefaults, MalformedDataIsAnError) {
  EXPECT_THROW(ln::Defaults::parse("{", kFwd, kBwd), std::runtime_error);
  EXPECT_THROW(ln::Defaults::parse(R"({"gpus": [{"name": "x"}]})", kFwd, kBwd), std::runtime_error);
  EXPECT_THROW(ln::Defaults::parse(R"({"gpus": [{"name": "x", "compute_capability": "9.0", "points": [
      {"dtype": "float64", "pass": "fwd", "rows": 1, "cols": 1, "ranking": []}]}]})",
                                   kFwd, kBwd),
               std::runtime_error);
}

// HFNN_LAYER_NORM_DEFAULTS names a file read instead of the compiled-in data: it is read whole, and
// a file that is missing or not such data is one error naming the variable, the path and the fix.
TEST(LayerNormDefaults, FileInsteadOfTheCompiledInData) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/hfnn_ln_defaults_good.json", bad = dir + "/hfnn_ln_defaults_bad.json";
  {
    std::ofstream(good) << kData;
    std::ofstream(bad) << "{\"gpus\": [{\"name\": \"x\"}]}";
  }
  const auto d = ln::Defaults::from_file(good, kFwd, kBwd);
  ASSERT_EQ(d.gpus().size(), 3u);
  EXPECT_EQ(d.for_gpu("GPU One", "9.0")->nearest(DType::kFloat32, false, 900, 64)->ranking.front(), 1);  // fwd_b
  for (const std::string& path : {bad, dir + "/hfnn_ln_defaults_missing.json"}) {
    try {
      ln::Defaults::from_file(path, kFwd, kBwd);
      ADD_FAILURE() << path << " was taken";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(ln::kDefaultsEnv) + "=" + path + ": "), std::string::npos) << what;
      EXPECT_NE(what.find("layer_norm_sweep.py --defaults"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  std::remove(good.c_str());
  std::remove(bad.c_str());
}

#if HFNN_WITH_CUDA
namespace k = hfnn::kernels::layer_norm;

TEST(LayerNormDefaults, CompiledInDataNamesVariantsOfThisBuild) {
  // Parsing against the registry keeps only known names: every ranking entry is an index or torch.
  const auto& d = ln::Defaults::builtin();
  for (const auto& g : d.gpus()) {
    EXPECT_FALSE(g.compute_capability.empty()) << g.name;
  }
  const auto* h200 = d.for_gpu("NVIDIA H200", "9.0");
  ASSERT_NE(h200, nullptr) << "src/layer_norm_defaults.json has no H200 measurements";
  const ln::Point* p = h200->nearest(DType::kFloat32, false, 65536, 128);
  ASSERT_NE(p, nullptr);
  for (const int i : p->ranking)
    EXPECT_TRUE(i == ln::kTorch || (i >= 0 && static_cast<std::size_t>(i) < k::fwd_variants().size()));
}

TEST(LayerNormDefaults, BuiltinChoiceSupportsWhatItPicks) {
  const auto& device = hfnn::kernels::current_device_info();
  if (device.device < 0) GTEST_SKIP() << "no CUDA device: supports() is true only where a launch runs";
  const auto* gpu = ln::Defaults::builtin().for_gpu("NVIDIA H200", "9.0");
  ASSERT_NE(gpu, nullptr);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t cols : {1, 7, 8, 63, 64, 128, 256, 384, 1000, 1024, 2048, 4097, 12288, 65536}) {
      k::FwdParams f;
      f.x = f.y = reinterpret_cast<void*>(uintptr_t{4096});  // never dereferenced by supports()
      f.rows = 1000;
      f.cols = cols;
      f.dtype = dtype;
      f.device = device;
      k::BwdParams b;
      b.x = b.dy = f.x;
    b.dx = f.y;
      b.rows = 1000;
      b.cols = cols;
      b.dtype = dtype;
      b.device = device;
      if (const auto* v = ln::default_fwd(f, gpu)) EXPECT_TRUE(v->supports(f)) << v->name << " " << cols;
      if (const auto* v = ln::default_bwd(b, gpu)) EXPECT_TRUE(v->supports(b)) << v->name << " " << cols;
    }
  }
}
#endif
