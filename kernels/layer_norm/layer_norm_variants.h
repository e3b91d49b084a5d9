// Kernel-internal: the launchers behind the variant table in layer_norm_registry.cu.
#pragma once
#include "kernels/layer_norm/layer_norm.h"

namespace hfnn::kernels::layer_norm {

// Row held in registers, kTpr threads per row (4, 8, 16 or 32), 16-byte accesses.
template <int kTpr> bool fwd_regs_supports(const FwdParams& p);
template <int kTpr> cudaError_t fwd_regs_run(const FwdParams& p, cudaStream_t stream);
// One block per row, the row staged in shared memory: any cols up to the shared-memory limit.
bool fwd_block_supports(const FwdParams& p);
cudaError_t fwd_block_run(const FwdParams& p, cudaStream_t stream);

template <int kTpr> bool bwd_regs_supports(const BwdParams& p);
template <int kTpr> std::size_t bwd_regs_workspace(const BwdParams& p);
template <int kTpr> cudaError_t bwd_regs_run(const BwdParams& p, cudaStream_t stream);
bool bwd_block_supports(const BwdParams& p);
std::size_t bwd_block_workspace(const BwdParams& p);
cudaError_t bwd_block_run(const BwdParams& p, cudaStream_t stream);

// Row-register variants hold at most this many 16-byte accesses per thread per row.
inline constexpr int kMaxAccessesPerThread = 8;

}  // namespace hfnn::kernels::layer_norm
