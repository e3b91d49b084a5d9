#include "src/layer_norm_select.h"

#include <string_view>

namespace hfnn::layer_norm {
#if HFNN_WITH_CUDA
namespace k = kernels::layer_norm;

namespace {

// Threads per row for the register variants: the fewest that keep each thread's row slice at or
// under kTarget 16-byte accesses (more accesses per thread = more loads in flight, fewer shuffles).
template <int kTarget>
int pick_tpr(int64_t cols, kernels::DType dtype) {
  const int64_t vec = 16 / static_cast<int64_t>(kernels::dtype_size(dtype));
  for (int tpr : {4, 8, 16, 32})
    if (cols <= static_cast<int64_t>(tpr) * vec * kTarget) return tpr;
  return 0;
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

const k::FwdVariant* default_fwd(const k::FwdParams& p) {
  const int tpr = pick_tpr<4>(p.cols, p.dtype);
  const k::FwdVariant* regs = tpr ? k::find_fwd(regs_name(tpr, true)) : nullptr;
  return first_supporting({regs, k::find_fwd("fwd_block")}, p);
}

const k::BwdVariant* default_bwd(const k::BwdParams& p) {
  // The backward holds x, dy and the dgamma/dbeta sums per element: fewer accesses per thread.
  const int tpr = pick_tpr<2>(p.cols, p.dtype);
  const k::BwdVariant* regs = tpr ? k::find_bwd(regs_name(tpr, false)) : nullptr;
  return first_supporting({regs, k::find_bwd("bwd_block")}, p);
}

#endif
}  // namespace hfnn::layer_norm
