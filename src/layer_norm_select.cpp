#include "src/layer_norm_select.h"

#include <string_view>

namespace hfnn::layer_norm {
#if HFNN_WITH_CUDA
namespace k = kernels::layer_norm;

namespace {

// Threads per row for the register variants: the fewest that keep each thread's row slice at or
// under kTarget 16-byte accesses (more accesses per thread = more loads in flight, fewer shuffles);
// past that, 32 (a warp per row, up to 8 accesses each). 0: the row is too wide for registers.
template <int kTarget>
int pick_tpr(int64_t cols, kernels::DType dtype) {
  const int64_t vec = 16 / static_cast<int64_t>(kernels::dtype_size(dtype));
  for (int tpr : {4, 8, 16, 32})
    if (cols <= static_cast<int64_t>(tpr) * vec * kTarget) return tpr;
  return cols <= 32 * vec * 8 ? 32 : 0;
}

// The registry's names (kernels/layer_norm/layer_norm_registry.cu), by [two rows][threads per row
// 4, 8, 16, 32]: a table, so the per-call path builds no strings.
constexpr std::string_view kFwdRegs[2][4] = {{"fwd_regs_tpr4", "fwd_regs_tpr8", "fwd_regs_tpr16", "fwd_regs_tpr32"},
                                             {"fwd_regs_tpr4_r2", "fwd_regs_tpr8_r2", "fwd_regs_tpr16_r2",
                                              "fwd_regs_tpr32_r2"}};
constexpr std::string_view kBwdRegs[4] = {"bwd_regs_tpr4", "bwd_regs_tpr8", "bwd_regs_tpr16", "bwd_regs_tpr32"};

int tpr_index(int tpr) { return tpr == 4 ? 0 : tpr == 8 ? 1 : tpr == 16 ? 2 : 3; }

template <typename Variant, typename Params>
const Variant* first_supporting(std::initializer_list<const Variant*> candidates, const Params& p) {
  for (const Variant* v : candidates)
    if (v && v->supports(p)) return v;
  return nullptr;
}

}  // namespace

// From bench/results/layer_norm-h200.json (H200, widths 64 to 1024, float32 and bfloat16): the
// fastest variants, or ones within 2% of them, hold 2 16-byte accesses per thread per row; the
// forward in 16-bit types also takes two rows per group at once (13% faster at D = 64, bf16).
const k::FwdVariant* default_fwd(const k::FwdParams& p) {
  const int tpr = pick_tpr<2>(p.cols, p.dtype);
  if (tpr == 0) return first_supporting({k::find_fwd("fwd_block")}, p);
  const bool half = kernels::dtype_size(p.dtype) == 2;
  // Two rows where the variant takes them (it says no past 2 accesses), else one, else the block.
  return first_supporting({half ? k::find_fwd(kFwdRegs[1][tpr_index(tpr)]) : nullptr,
                           k::find_fwd(kFwdRegs[0][tpr_index(tpr)]), k::find_fwd("fwd_block")},
                          p);
}

const k::BwdVariant* default_bwd(const k::BwdParams& p) {
  const int tpr = pick_tpr<2>(p.cols, p.dtype);
  return first_supporting({tpr ? k::find_bwd(kBwdRegs[tpr_index(tpr)]) : nullptr, k::find_bwd("bwd_block")}, p);
}

#endif
}  // namespace hfnn::layer_norm
