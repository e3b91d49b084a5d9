// The LSTM family on the CPU: the float64 reference (one step by hand; every gradient against
// central finite differences of the forward; absent h0/c0/biases as zeros) and the family
// description (the key of a recorded call and the calls that map to none, the key's text, label
// and packed form).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/lstm/lstm_family.h"
#include "kernels/lstm/lstm_reference.h"

namespace hfnn::kernels::lstm {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

TEST(LstmReference, OneStepByHand) {
  // input 1, hidden 1, batch 1, one step: the gates are plain numbers.
  const double x = 0.7, h0 = -0.3, c0 = 0.4;
  const std::vector<double> w_ih = {0.5, -1.0, 2.0, 0.25}, w_hh = {1.5, 0.5, -0.5, -2.0};
  const std::vector<double> b_ih = {0.1, 0.2, 0.3, 0.4}, b_hh = {-0.2, 0.0, 0.1, 0.05};
  ReferenceLayer l;
  l.steps = l.batch = l.input = l.hidden = 1;
  l.x = &x, l.h0 = &h0, l.c0 = &c0, l.w_ih = w_ih.data(), l.w_hh = w_hh.data(), l.b_ih = b_ih.data(),
  l.b_hh = b_hh.data();
  const auto f = reference_forward(l);
  auto pre = [&](int g) { return w_ih[g] * x + w_hh[g] * h0 + b_ih[g] + b_hh[g]; };
  const double i = sigmoid(pre(0)), fg = sigmoid(pre(1)), g = std::tanh(pre(2)), o = sigmoid(pre(3));
  const double c = fg * c0 + i * g, h = o * std::tanh(c);
  EXPECT_DOUBLE_EQ(f.c_n[0], c);
  EXPECT_DOUBLE_EQ(f.h_n[0], h);
  EXPECT_DOUBLE_EQ(f.y[0], h);
  EXPECT_DOUBLE_EQ(f.gates[2], g);
}

// A random layer with every input present, and the loss sum(y * wy) + sum(h_n * wh) + sum(c_n * wc).
struct Problem {
  int64_t T = 4, B = 3, I = 5, H = 6;
  std::vector<double> x, w_ih, w_hh, b_ih, b_hh, h0, c0, wy, wh, wc;
  explicit Problem(unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> n(0.0, 0.6);
    auto fill = [&](std::vector<double>& v, int64_t size) {
      v.resize(static_cast<size_t>(size));
      for (double& e : v) e = n(gen);
    };
    fill(x, T * B * I), fill(w_ih, 4 * H * I), fill(w_hh, 4 * H * H), fill(b_ih, 4 * H), fill(b_hh, 4 * H);
    fill(h0, B * H), fill(c0, B * H), fill(wy, T * B * H), fill(wh, B * H), fill(wc, B * H);
  }
  ReferenceLayer layer() const {
    ReferenceLayer l;
    l.steps = T, l.batch = B, l.input = I, l.hidden = H;
    l.x = x.data(), l.w_ih = w_ih.data(), l.w_hh = w_hh.data(), l.b_ih = b_ih.data(), l.b_hh = b_hh.data();
    l.h0 = h0.data(), l.c0 = c0.data();
    return l;
  }
  double loss() const {
    const auto f = reference_forward(layer());
    double s = 0.0;
    for (size_t k = 0; k < f.y.size(); ++k) s += f.y[k] * wy[k];
    for (size_t k = 0; k < f.h_n.size(); ++k) s += f.h_n[k] * wh[k] + f.c_n[k] * wc[k];
    return s;
  }
};

// The largest |analytic - numeric| over an input's elements, relative to the largest |numeric|.
double worst(Problem& p, std::vector<double>& input, const std::vector<double>& analytic) {
  double err = 0.0, scale = 1e-12;
  for (size_t k = 0; k < input.size(); ++k) {
    const double keep = input[k], step = 1e-5;
    input[k] = keep + step;
    const double up = p.loss();
    input[k] = keep - step;
    const double down = p.loss();
    input[k] = keep;
    const double numeric = (up - down) / (2 * step);
    err = std::max(err, std::abs(analytic[k] - numeric));
    scale = std::max(scale, std::abs(numeric));
  }
  return err / scale;
}

TEST(LstmReference, EveryGradientMatchesFiniteDifferences) {
  for (unsigned seed : {1u, 2u, 3u}) {
    Problem p(seed);
    const auto l = p.layer();
    const auto f = reference_forward(l);
    const auto d = reference_backward(l, f, p.wy.data(), p.wh.data(), p.wc.data());
    EXPECT_LT(worst(p, p.x, d.dx), 1e-7) << "dx, seed " << seed;
    EXPECT_LT(worst(p, p.w_ih, d.dw_ih), 1e-7) << "dw_ih, seed " << seed;
    EXPECT_LT(worst(p, p.w_hh, d.dw_hh), 1e-7) << "dw_hh, seed " << seed;
    EXPECT_LT(worst(p, p.b_ih, d.db), 1e-7) << "db_ih, seed " << seed;
    EXPECT_LT(worst(p, p.b_hh, d.db), 1e-7) << "db_hh, seed " << seed;
    EXPECT_LT(worst(p, p.h0, d.dh0), 1e-7) << "dh0, seed " << seed;
    EXPECT_LT(worst(p, p.c0, d.dc0), 1e-7) << "dc0, seed " << seed;
  }
}

TEST(LstmReference, AbsentStateAndBiasesAreZeros) {
  Problem p(7);
  std::fill(p.h0.begin(), p.h0.end(), 0.0);
  std::fill(p.c0.begin(), p.c0.end(), 0.0);
  std::fill(p.b_ih.begin(), p.b_ih.end(), 0.0);
  std::fill(p.b_hh.begin(), p.b_hh.end(), 0.0);
  ReferenceLayer with = p.layer(), without = p.layer();
  without.h0 = without.c0 = without.b_ih = without.b_hh = nullptr;
  const auto a = reference_forward(with), b = reference_forward(without);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.c_n, b.c_n);
  const auto da = reference_backward(with, a, p.wy.data(), nullptr, nullptr);
  const auto db = reference_backward(without, b, p.wy.data(), nullptr, nullptr);
  EXPECT_EQ(da.dw_hh, db.dw_hh);
  EXPECT_EQ(da.dh0, db.dh0);
  EXPECT_EQ(da.dc0, db.dc0);
}

// The settings the profiler records for an nn.LSTM call (profiles/collector.cpp).
std::string flags(const std::string& rest = "bidirectional=0,batch_first=1,bias=1,proj=0,dropout=0",
                  const std::string& layers = "1") {
  return "input=985,hidden=512,layers=" + layers + "," + rest;
}

TEST(LstmFamily, KeyOfARecordedCall) {
  const auto k = key_of("[4,1000,985]", flags());
  ASSERT_TRUE(k);
  EXPECT_EQ(k->text(),
            "input=985,hidden=512,layers=1,bidirectional=0,batch=4,steps=1000,batch_first=1,bias=1,dropout=0");
  // seq-first: [steps, batch, input]
  const auto s = key_of("[1000,4,985]", flags("bidirectional=1,batch_first=0,bias=0,proj=0,dropout=0"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->batch, 4);
  EXPECT_EQ(s->steps, 1000);
  EXPECT_TRUE(s->bidirectional);
  EXPECT_FALSE(s->bias);
  // dropout is part of the key between layers only (torch applies none after the last)
  EXPECT_FALSE(key_of("[4,1000,985]", flags("bidirectional=0,batch_first=1,bias=1,proj=0,dropout=1"))->dropout);
  EXPECT_TRUE(key_of("[4,1000,985]", flags("bidirectional=0,batch_first=1,bias=1,proj=0,dropout=1", "2"))->dropout);
  // profiles written before proj and dropout were recorded
  EXPECT_EQ(key_of("[4,1000,985]", flags("bidirectional=0,batch_first=1,bias=1"))->text(), k->text());
}

TEST(LstmFamily, CallsTheFamilyDoesNotTake) {
  EXPECT_FALSE(key_of("[4,1000,985]", "packed"));                                           // PackedSequence
  EXPECT_FALSE(key_of("[4,1000,985]", flags("bidirectional=0,batch_first=1,bias=1,proj=128,dropout=0")));  // proj_size
  EXPECT_FALSE(key_of("[1000,985]", flags()));                                              // unbatched
  EXPECT_FALSE(key_of("[4,1000,984]", flags()));                                            // input size disagrees
  EXPECT_FALSE(key_of("[4,0,985]", flags()));                                               // no steps
  EXPECT_FALSE(key_of("[4,1000,985]", flags("bidirectional=2,batch_first=1,bias=1,proj=0,dropout=0")));
  EXPECT_FALSE(key_of("[4,1000,985]", "input=985,layers=1,bidirectional=0,batch_first=1,bias=1"));  // no hidden
}

TEST(LstmFamily, KeyTextLabelAndPackedForm) {
  const std::string text =
      "input=256,hidden=1024,layers=2,bidirectional=1,batch=32,steps=100,batch_first=0,bias=0,dropout=1";
  const auto k = parse_key(text);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->text(), text);
  EXPECT_FALSE(parse_key("input=256,hidden=1024"));
  EXPECT_FALSE(parse_key(text + ",extra=1"));  // the canonical text only
  EXPECT_FALSE(parse_key(
      "input=256,hidden=1024,layers=1,bidirectional=1,batch=32,steps=100,batch_first=0,bias=0,dropout=1"));  // 1 layer
  EXPECT_EQ(kFamily.key_label(text), "256 -> 1024 x2 bi, 32 x 100 seq-first no-bias dropout");
  EXPECT_EQ(kFamily.key_label("junk"), "junk");
  EXPECT_EQ(kFamily.pack_key(text, "bfloat16"),
            pack(256, 1024, 2, 32, 100, DType::kBFloat16, true, false, false, true));
  EXPECT_NE(kFamily.pack_key(text, "bfloat16"), kFamily.pack_key(text, "float16"));
  EXPECT_FALSE(kFamily.pack_key(text, "float64"));
  families::RecordedShape shape{"[4,1000,985]", "", "float32", flags(), true};
  EXPECT_EQ(kFamily.key_of(shape), key_of(shape.shape, shape.flags)->text());
  EXPECT_EQ(kFamily.passes.size(), 1u);
  EXPECT_LT(kFamily.tolerance("float32"), kFamily.tolerance("float16"));
  EXPECT_LT(kFamily.tolerance("float16"), kFamily.tolerance("bfloat16"));
}

}  // namespace
}  // namespace hfnn::kernels::lstm
