// Which LayerNorm variant runs when the caller names none: the built-in heuristic, used until a
// tuned table (hfnn tune) says otherwise for a shape.
#pragma once
#include "kernels/layer_norm/layer_norm.h"

namespace hfnn::layer_norm {

#if HFNN_WITH_CUDA
// Null when no variant supports the problem: the caller falls back to torch.
const kernels::layer_norm::FwdVariant* default_fwd(const kernels::layer_norm::FwdParams& p);
const kernels::layer_norm::BwdVariant* default_bwd(const kernels::layer_norm::BwdParams& p);
#endif

}  // namespace hfnn::layer_norm
