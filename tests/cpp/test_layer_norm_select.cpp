// The built-in heuristic (src/layer_norm_select.cpp): for every width and dtype it names a variant
// that exists and supports the problem, the register variants wherever they fit, and the choices
// the H200 measurements settled on (bench/results/layer_norm-h200.json). supports() reads no
// memory, so this runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "src/layer_norm_select.h"

#if HFNN_WITH_CUDA
namespace ln = hfnn::kernels::layer_norm;
using hfnn::kernels::DType;

namespace {
void* aligned() { return reinterpret_cast<void*>(uintptr_t{4096}); }  // never dereferenced

ln::FwdParams fwd(int64_t rows, int64_t cols, DType dtype) {
  ln::FwdParams p;
  p.x = aligned();
  p.y = aligned();
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  return p;
}

ln::BwdParams bwd(int64_t rows, int64_t cols, DType dtype) {
  ln::BwdParams p;
  p.x = p.dy = p.dx = aligned();
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  p.sm_count = 132;
  return p;
}
}  // namespace

TEST(LayerNormSelect, EveryWidthGetsASupportingVariant) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t cols : {1, 7, 8, 63, 64, 128, 256, 384, 1000, 1024, 2048, 4097, 20480}) {
      const auto f = fwd(1000, cols, dtype);
      const auto b = bwd(1000, cols, dtype);
      const ln::FwdVariant* fv = hfnn::layer_norm::default_fwd(f);
      const ln::BwdVariant* bv = hfnn::layer_norm::default_bwd(b);
      ASSERT_NE(fv, nullptr) << cols;
      ASSERT_NE(bv, nullptr) << cols;
      EXPECT_TRUE(fv->supports(f)) << fv->name;
      EXPECT_TRUE(bv->supports(b)) << bv->name;
      // Widths the register variants take must not fall to the block variants, which are 4 to 8
      // times slower there.
      const bool fits_registers = cols % (16 / static_cast<int64_t>(hfnn::kernels::dtype_size(dtype))) == 0 &&
                                  cols <= 32 * 8 * (16 / static_cast<int64_t>(hfnn::kernels::dtype_size(dtype)));
      if (fits_registers) {
        EXPECT_EQ(std::string(fv->name).find("fwd_regs"), 0u) << fv->name << " for " << cols;
        EXPECT_EQ(std::string(bv->name).find("bwd_regs"), 0u) << bv->name << " for " << cols;
      }
    }
  }
}

TEST(LayerNormSelect, MeasuredChoicesForTheSeedWidths) {
  EXPECT_EQ(hfnn::layer_norm::default_fwd(fwd(65536, 128, DType::kBFloat16))->name, "fwd_regs_tpr8_r2");
  EXPECT_EQ(hfnn::layer_norm::default_fwd(fwd(65536, 128, DType::kFloat32))->name, "fwd_regs_tpr16");
  EXPECT_EQ(hfnn::layer_norm::default_bwd(bwd(65536, 256, DType::kFloat32))->name, "bwd_regs_tpr32");
  EXPECT_EQ(hfnn::layer_norm::default_bwd(bwd(65536, 64, DType::kFloat32))->name, "bwd_regs_tpr8");
  EXPECT_EQ(hfnn::layer_norm::default_fwd(fwd(25600, 1024, DType::kBFloat16))->name, "fwd_regs_tpr32");
  // Odd widths cannot use 16-byte accesses: the block variants take them.
  EXPECT_EQ(hfnn::layer_norm::default_fwd(fwd(10, 63, DType::kFloat32))->name, "fwd_block");
  EXPECT_EQ(hfnn::layer_norm::default_bwd(bwd(10, 63, DType::kFloat32))->name, "bwd_block");
}

TEST(LayerNormSelect, TooWideForEveryVariantMeansTorch) {
  EXPECT_EQ(hfnn::layer_norm::default_bwd(bwd(4, 1 << 16, DType::kFloat32)), nullptr);
}
#else
TEST(LayerNormSelect, Skipped) { GTEST_SKIP() << "built without the CUDA Toolkit: no variants to choose from"; }
#endif
