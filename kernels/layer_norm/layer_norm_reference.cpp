// float64 CPU reference for LayerNorm forward and backward. Slow and obvious on purpose: every GPU
// variant is checked against it (tests/cpp/test_layer_norm_variants.cpp).
#include <cmath>
#include <vector>

#include "kernels/layer_norm/layer_norm.h"

namespace hfnn::kernels::layer_norm {

void reference_fwd(const FwdParams& p) {
  const auto n = static_cast<std::size_t>(p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    const std::size_t base = static_cast<std::size_t>(r) * n;
    double sum = 0.0;
    for (std::size_t j = 0; j < n; ++j) sum += host_load(p.x, p.dtype, base + j);
    const double mean = sum / static_cast<double>(n);
    double sq = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double d = host_load(p.x, p.dtype, base + j) - mean;
      sq += d * d;
    }
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(n) + static_cast<double>(p.eps));
    for (std::size_t j = 0; j < n; ++j) {
      double y = (host_load(p.x, p.dtype, base + j) - mean) * rstd;
      if (p.gamma) y *= host_load(p.gamma, p.dtype, j);
      if (p.beta) y += host_load(p.beta, p.dtype, j);
      host_store(p.y, p.dtype, base + j, static_cast<float>(y));
    }
    if (p.mean) p.mean[r] = static_cast<float>(mean);
    if (p.rstd) p.rstd[r] = static_cast<float>(rstd);
  }
}

void reference_bwd(const BwdParams& p) {
  const auto n = static_cast<std::size_t>(p.cols);
  std::vector<double> dgamma(n, 0.0), dbeta(n, 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const std::size_t base = static_cast<std::size_t>(r) * n;
    const double mean = p.mean[r], rstd = p.rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double dy = host_load(p.dy, p.dtype, base + j);
      const double xhat = (host_load(p.x, p.dtype, base + j) - mean) * rstd;
      const double g = dy * (p.gamma ? host_load(p.gamma, p.dtype, j) : 1.0);
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[j] += dy * xhat;
      dbeta[j] += dy;
    }
    if (!p.dx) continue;
    for (std::size_t j = 0; j < n; ++j) {
      const double dy = host_load(p.dy, p.dtype, base + j);
      const double xhat = (host_load(p.x, p.dtype, base + j) - mean) * rstd;
      const double g = dy * (p.gamma ? host_load(p.gamma, p.dtype, j) : 1.0);
      const double dx = rstd * (g - sum_g / static_cast<double>(n) - xhat * sum_gx / static_cast<double>(n));
      host_store(p.dx, p.dtype, base + j, static_cast<float>(dx));
    }
  }
  for (std::size_t j = 0; j < n; ++j) {
    if (p.dgamma) host_store(p.dgamma, p.dtype, j, static_cast<float>(dgamma[j]));
    if (p.dbeta) host_store(p.dbeta, p.dtype, j, static_cast<float>(dbeta[j]));
  }
}

}  // namespace hfnn::kernels::layer_norm
