// hfnn tune's rules (tuner/tuner.h) and the family registry (kernels/common/family.h) on the CPU:
// keys, statistics, the float64 gate with a planted
// wrong LayerNorm, winner selection under noise, and the projection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/family.h"
#include "kernels/layer_norm/layer_norm.h"
#include "kernels/layer_norm/layer_norm_family.h"
#include "tuner/tuner.h"

namespace hfnn::tuner {
namespace {

// LayerNorm's float64-gate tolerance for a dtype (the family's).
double tol(const std::string& dtype) { return kernels::layer_norm::kFamily.tolerance(dtype); }

TEST(TunerKey, ShapesOfTheSameProblemShareAKey) {
  using kernels::layer_norm::key_of;
  using kernels::layer_norm::parse_key;
  auto a = key_of("[1,128,256,256]", "[256]", true);
  auto b = key_of("[32768,256]", "[256]", true);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->text(), "rows=32768,D=256,affine=1");
  EXPECT_EQ(a->text(), b->text());
  EXPECT_EQ(key_of("[4,6,8]", "[6,8]", false)->text(), "rows=4,D=48,affine=0");
  EXPECT_FALSE(key_of("[4,6,8]", "[6]", true));  // not a suffix
  EXPECT_FALSE(key_of("[4,x]", "[8]", true));
  EXPECT_FALSE(key_of("[8]", "[]", true));
  auto back = parse_key("rows=32768,D=256,affine=1");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rows, 32768);
  EXPECT_EQ(back->cols, 256);
  EXPECT_FALSE(parse_key("rows=1,D=2,affine=1x"));
  EXPECT_FALSE(parse_key("rows=1,D=0,affine=1"));
}

TEST(Families, TheRegistryFindsLayerNormAndOnlyRecordedOpsWithKernels) {
  const families::Family* f = families::find("layer_norm");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f, &kernels::layer_norm::kFamily);
  EXPECT_NE(families::find("multihead_attention"), nullptr);
  EXPECT_NE(families::find("lstm"), nullptr);
  EXPECT_EQ(families::find("gru"), nullptr);  // no family
  EXPECT_EQ(families::all().size(), 3u);
  EXPECT_EQ(families::op_names(), "layer_norm, multihead_attention, lstm");
  ASSERT_EQ(f->passes.size(), 2u);
  EXPECT_EQ(f->passes[0], "fwd");
  EXPECT_EQ(f->passes[1], "bwd");
  families::RecordedShape s{.shape = "[8,128,256]", .normalized = "[256]", .dtype = "bfloat16", .flags = "", .affine = false};
  EXPECT_EQ(f->key_of(s).value_or(""), "rows=1024,D=256,affine=0");
  s.normalized = "[128]";
  EXPECT_FALSE(f->key_of(s));
  EXPECT_EQ(f->key_label("rows=1024,D=256,affine=1"), "1024 x 256");
  EXPECT_EQ(f->key_label("rows=1024,D=256,affine=0"), "1024 x 256 no-affine");
  EXPECT_EQ(f->key_label("not a key"), "not a key");
  EXPECT_LT(f->tolerance("float32"), f->tolerance("float16"));
  EXPECT_LT(f->tolerance("float16"), f->tolerance("bfloat16"));
#if HFNN_WITH_CUDA
  auto named = [](const std::vector<families::VariantInfo>& vs, const std::string& name) {
    return std::any_of(vs.begin(), vs.end(), [&](const auto& v) { return v.name == name && !v.idea.empty(); });
  };
  EXPECT_TRUE(named(f->variants("fwd"), "fwd_regs_tpr32"));
  EXPECT_TRUE(named(f->variants("bwd"), "bwd_block"));
  EXPECT_FALSE(named(f->variants("fwd"), "bwd_block"));
#endif
  EXPECT_TRUE(f->variants("neither").empty());
}

TEST(Families, DimsParse) {
  EXPECT_EQ(families::parse_dims("[1,128,256]"), (std::vector<int64_t>{1, 128, 256}));
  EXPECT_EQ(families::parse_dims("[]"), std::vector<int64_t>{});
  EXPECT_FALSE(families::parse_dims("[1,-2]"));
  EXPECT_FALSE(families::parse_dims("1,2"));
  EXPECT_FALSE(families::parse_dims("[1,,2]"));
}

TEST(TunerStats, MedianAndQuantiles) {
  const Timing t = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(t.samples, 5);
  EXPECT_DOUBLE_EQ(t.median_us, 3);
  EXPECT_DOUBLE_EQ(t.p20_us, 1.8);
  EXPECT_DOUBLE_EQ(t.p80_us, 4.2);
  EXPECT_NEAR(t.spread(), 0.8, 1e-12);
  EXPECT_EQ(summarize({}).samples, 0);
}

// A LayerNorm forward in float32 the way a kernel computes it, optionally wrong in the way a
// buggy variant might be (eps applied outside the square root), against the float64 reference.
double forward_error(bool planted_bug) {
  namespace ln = kernels::layer_norm;
  const int64_t rows = 64, cols = 96;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  std::vector<float> x(rows * cols), g(cols), b(cols), y(rows * cols), y_ref(rows * cols);
  for (auto& v : x) v = normal(rng);
  for (auto& v : g) v = 1.0f + 0.1f * normal(rng);
  for (auto& v : b) v = 0.1f * normal(rng);
  ln::FwdParams p;
  p.x = x.data();
  p.gamma = g.data();
  p.beta = b.data();
  p.y = y_ref.data();
  p.rows = rows;
  p.cols = cols;
  ln::reference_fwd(p);  // float64 inside, float32 out
  for (int64_t r = 0; r < rows; ++r) {
    float mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    var /= cols;
    const float rstd = planted_bug ? 1.0f / (std::sqrt(var) + 1e-5f * 1000) : 1.0f / std::sqrt(var + 1e-5f);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (x[r * cols + c] - mean) * rstd * g[c] + b[c];
  }
  double err = 0, scale = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    err = std::max(err, std::abs(double(y[i]) - y_ref[i]));
    scale = std::max(scale, std::abs(double(y_ref[i])));
  }
  return err / scale;
}

TEST(TunerGate, PassesAFloat32KernelAndRejectsAPlantedWrongOne) {
  const double good = forward_error(false), bad = forward_error(true);
  EXPECT_TRUE(gate(good, good, tol("float32")).accepted) << good;
  const Verdict v = gate(bad, good, tol("float32"));
  EXPECT_FALSE(v.accepted) << bad;
  EXPECT_NE(v.reason.find("over the allowed"), std::string::npos);
  EXPECT_FALSE(gate(NAN, good, tol("float32")).accepted);
  EXPECT_FALSE(gate(INFINITY, good, tol("bfloat16")).accepted);
  // Within twice torch's own error passes even over the dtype's tolerance (torch is the baseline).
  EXPECT_TRUE(gate(0.05, 0.03, tol("bfloat16")).accepted);
  EXPECT_FALSE(gate(0.07, 0.03, tol("bfloat16")).accepted);
}

Candidate timed(const std::string& name, std::vector<double> samples, double err) {
  Candidate c;
  c.name = name;
  c.timing = summarize(std::move(samples));
  c.max_error = err;
  return c;
}

TEST(TunerJudge, TheFastestCorrectVariantWinsAndAWrongOneNever) {
  std::vector<Candidate> cs = {timed("torch", {100, 101, 99, 100, 102}, 1e-7),
                               timed("fast_but_wrong", {10, 10, 10, 10, 10}, 0.2),
                               timed("good", {50, 51, 49, 50, 50}, 2e-7), timed("slower", {70, 70, 71, 69, 70}, 1e-7)};
  const Choice c = judge(cs, tol("float32"));
  EXPECT_EQ(c.winner, "good");
  EXPECT_DOUBLE_EQ(c.torch_us, 100);
  EXPECT_DOUBLE_EQ(c.best_us, 50);
  EXPECT_FALSE(cs[1].verdict.accepted);
  EXPECT_TRUE(cs[2].verdict.accepted);
}

TEST(TunerJudge, TorchStaysWhenTheGainIsWithinTheNoise) {
  std::vector<Candidate> quiet = {timed("torch", {100, 100, 100, 100, 100}, 0), timed("v", {98, 98, 98, 98, 98}, 0)};
  EXPECT_EQ(judge(quiet, tol("float32")).winner, "torch");  // 2% < the 3% floor
  std::vector<Candidate> noisy = {timed("torch", {80, 90, 100, 110, 120}, 0), timed("v", {90, 90, 90, 90, 90}, 0)};
  EXPECT_EQ(judge(noisy, tol("float32")).winner, "torch");  // 10% < torch's spread
  std::vector<Candidate> clear = {timed("torch", {100, 100, 100, 100, 100}, 0), timed("v", {90, 90, 90, 90, 90}, 0)};
  EXPECT_EQ(judge(clear, tol("float32")).winner, "v");
}

TEST(TunerJudge, FailedCandidatesAreRejectedWithTheirReason) {
  std::vector<Candidate> cs = {timed("torch", {100, 100, 100}, 0)};
  Candidate broken;
  broken.name = "v";
  broken.ran = false;
  broken.error = "invalid configuration argument";
  cs.push_back(broken);
  EXPECT_EQ(judge(cs, tol("float32")).winner, "torch");
  EXPECT_FALSE(cs[1].verdict.accepted);
  EXPECT_EQ(cs[1].verdict.reason, "invalid configuration argument");
}

TEST(TunerProjection, AmdahlOverThePassesThatGain) {
  // 100 ms step; 24 calls/step saving 200 µs each (4.8 ms) and one slower winner that saves nothing.
  const Projection p = project(100.0, {{24, 300, 100}, {10, 50, 60}});
  EXPECT_NEAR(p.saved_ms, 4.8, 1e-9);
  EXPECT_NEAR(p.projected_step_ms, 95.2, 1e-9);
  EXPECT_NEAR(p.speedup, 100.0 / 95.2, 1e-12);
  const Projection all = project(10.0, {{1000, 100, 0}});
  EXPECT_DOUBLE_EQ(all.projected_step_ms, 0.0);  // never below zero
  EXPECT_TRUE(std::isinf(all.speedup));           // and then no bound, not 1x
}

TEST(TunerProjection, CeilingIsTheStepWithoutTorchsTimeInTheKeys) {
  // torch spends 24 * 300 + 10 * 50 µs = 7.7 ms of a 100 ms step in the keys: at most 100/92.3.
  const Projection p = project(100.0, {{24, 300, 100}, {10, 50, 60}});
  EXPECT_NEAR(p.torch_ms, 7.7, 1e-9);
  EXPECT_NEAR(p.ceiling, 100.0 / 92.3, 1e-12);
  EXPECT_TRUE(std::isinf(project(10.0, {{1000, 100, 0}}).ceiling));  // the keys are the whole step
}

}  // namespace
}  // namespace hfnn::tuner
