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

std::string_view regs_name(int tpr, bool fwd) {
  switch (tpr) {
    case 4: return fwd ? "fwd_regs_tpr4" : "bwd_regs_tpr4";
    case 8: return fwd ? "fwd_regs_tpr8" : "bwd_regs_tpr8";
    case 16: return fwd ? "fwd_regs_tpr16" : "bwd_regs_tpr16";
    default: return fwd ? "fwd_regs_tpr32" : "bwd_regs_tpr32";
  }
}

template <typename Variant, typename Params>
const Variant* first_supporting(std::initializer_list<const Variant*> candidates, const Params& p) {
  for (const Variant* v : candidates)
    if (v && v->supports(p)) return v;
  return nullptr;
}

}  // namespace

// Targets from bench/results/layer_norm-h200.json (H200, widths 64 to 1024, float32 and bfloat16):
// the fastest forward had 2 accesses per thread per row (with two rows at a time, 4 in flight),
// the fastest backward 1 (it also holds dy and the dgamma/dbeta sums).
const k::FwdVariant* default_fwd(const k::FwdParams& p) {
  const int tpr = pick_tpr<2>(p.cols, p.dtype);
  const k::FwdVariant* regs = tpr ? k::find_fwd(regs_name(tpr, true)) : nullptr;
  return first_supporting({regs, k::find_fwd("fwd_block")}, p);
}

const k::BwdVariant* default_bwd(const k::BwdParams& p) {
  const int tpr = pick_tpr<1>(p.cols, p.dtype);
  const k::BwdVariant* regs = tpr ? k::find_bwd(regs_name(tpr, false)) : nullptr;
  return first_supporting({regs, k::find_bwd("bwd_block")}, p);
}

#endif
}  // namespace hfnn::layer_norm
