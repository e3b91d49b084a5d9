// The CPU reference and the host dtype conversions: the ground truth every GPU variant is checked
// against, so it is checked itself, against hand-computed values and finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/layer_norm/layer_norm.h"

namespace ln = hfnn::kernels::layer_norm;
using hfnn::kernels::DType;

TEST(HostConversion, HalfAndBFloat16RoundToNearestEven) {
  uint16_t h = 0;
  hfnn::kernels::host_store(&h, DType::kFloat16, 0, 1.0f);
  EXPECT_EQ(h, 0x3c00);
  hfnn::kernels::host_store(&h, DType::kFloat16, 0, 65504.0f);
  EXPECT_EQ(h, 0x7bff);
  hfnn::kernels::host_store(&h, DType::kFloat16, 0, 1e6f);
  EXPECT_EQ(h, 0x7c00);  // overflow to inf
  hfnn::kernels::host_store(&h, DType::kFloat16, 0, 1.0f + 1.0f / 2048);  // halfway: ties to even (1.0)
  EXPECT_EQ(h, 0x3c00);
  hfnn::kernels::host_store(&h, DType::kFloat16, 0, 5.960464477539063e-08f);  // smallest subnormal
  EXPECT_EQ(h, 0x0001);
  EXPECT_FLOAT_EQ(hfnn::kernels::host_load(&h, DType::kFloat16, 0), 5.960464477539063e-08f);

  uint16_t b = 0;
  hfnn::kernels::host_store(&b, DType::kBFloat16, 0, 1.0f);
  EXPECT_EQ(b, 0x3f80);
  hfnn::kernels::host_store(&b, DType::kBFloat16, 0, 1.0f + 1.0f / 256);  // halfway: ties to even
  EXPECT_EQ(b, 0x3f80);
  hfnn::kernels::host_store(&b, DType::kBFloat16, 0, -2.5f);
  EXPECT_FLOAT_EQ(hfnn::kernels::host_load(&b, DType::kBFloat16, 0), -2.5f);
  hfnn::kernels::host_store(&b, DType::kBFloat16, 0, NAN);
  EXPECT_TRUE(std::isnan(hfnn::kernels::host_load(&b, DType::kBFloat16, 0)));
}

TEST(LayerNormReference, ForwardMatchesHandComputedRow) {
  const std::vector<float> x = {1, 2, 3, 4}, gamma = {1, 2, 1, 1}, beta = {0, 0, 0, 1};
  std::vector<float> y(4), mean(1), rstd(1);
  ln::FwdParams p;
  p.x = x.data();
  p.gamma = gamma.data();
  p.beta = beta.data();
  p.y = y.data();
  p.mean = mean.data();
  p.rstd = rstd.data();
  p.rows = 1;
  p.cols = 4;
  p.eps = 0.0f;
  ln::reference_fwd(p);
  const double s = 1.0 / std::sqrt(1.25);  // biased variance of 1..4 is 1.25
  EXPECT_FLOAT_EQ(mean[0], 2.5f);
  EXPECT_FLOAT_EQ(rstd[0], static_cast<float>(s));
  EXPECT_FLOAT_EQ(y[0], static_cast<float>(-1.5 * s));
  EXPECT_FLOAT_EQ(y[1], static_cast<float>(-0.5 * s * 2));
  EXPECT_FLOAT_EQ(y[3], static_cast<float>(1.5 * s + 1));
}

// Loss L = sum(y * w) for fixed random w; its gradient by central differences of reference_fwd
// must match reference_bwd with dy = w, for x, gamma and beta.
TEST(LayerNormReference, BackwardMatchesFiniteDifferences) {
  const int rows = 3, cols = 7;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * cols), gamma(cols), beta(cols), w(rows * cols);
  for (auto& v : x) v = normal(rng);
  for (auto& v : gamma) v = 1.0f + 0.5f * normal(rng);
  for (auto& v : beta) v = normal(rng);
  for (auto& v : w) v = normal(rng);

  auto loss = [&](const std::vector<float>& xs, const std::vector<float>& gs, const std::vector<float>& bs) {
    std::vector<float> y(rows * cols);
    ln::FwdParams p;
    p.x = xs.data();
    p.gamma = gs.data();
    p.beta = bs.data();
    p.y = y.data();
    p.rows = rows;
    p.cols = cols;
    ln::reference_fwd(p);
    double l = 0;
    for (int i = 0; i < rows * cols; ++i) l += static_cast<double>(y[i]) * w[i];
    return l;
  };

  std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols), dgamma(cols), dbeta(cols);
  ln::FwdParams f;
  f.x = x.data();
  f.gamma = gamma.data();
  f.beta = beta.data();
  f.y = y.data();
  f.mean = mean.data();
  f.rstd = rstd.data();
  f.rows = rows;
  f.cols = cols;
  ln::reference_fwd(f);
  ln::BwdParams b;
  b.dy = w.data();
  b.x = x.data();
  b.mean = mean.data();
  b.rstd = rstd.data();
  b.gamma = gamma.data();
  b.dx = dx.data();
  b.dgamma = dgamma.data();
  b.dbeta = dbeta.data();
  b.rows = rows;
  b.cols = cols;
  ln::reference_bwd(b);

  const float h = 1e-2f;
  auto numeric = [&](std::vector<float>& v, int i) {
    const float keep = v[i];
    v[i] = keep + h;
    const double up = loss(x, gamma, beta);
    v[i] = keep - h;
    const double down = loss(x, gamma, beta);
    v[i] = keep;
    return (up - down) / (2 * h);
  };
  for (int i = 0; i < rows * cols; ++i) EXPECT_NEAR(dx[i], numeric(x, i), 2e-2) << "dx[" << i << "]";
  for (int j = 0; j < cols; ++j) {
    EXPECT_NEAR(dgamma[j], numeric(gamma, j), 2e-2) << "dgamma[" << j << "]";
    EXPECT_NEAR(dbeta[j], numeric(beta, j), 2e-2) << "dbeta[" << j << "]";
  }
}

TEST(LayerNormReference, NoAffineMeansGammaOneBetaZero) {
  const std::vector<float> x = {3, -1, 0.5f, 2, 8, -4};
  std::vector<float> y_plain(6), y_affine(6);
  const std::vector<float> ones(3, 1.0f), zeros(3, 0.0f);
  ln::FwdParams p;
  p.x = x.data();
  p.y = y_plain.data();
  p.rows = 2;
  p.cols = 3;
  ln::reference_fwd(p);
  p.gamma = ones.data();
  p.beta = zeros.data();
  p.y = y_affine.data();
  ln::reference_fwd(p);
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y_plain[i], y_affine[i]);
}
