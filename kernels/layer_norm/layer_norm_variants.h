// Kernel-internal: the launchers behind the variant table in layer_norm_registry.cu.
#pragma once
#include "kernels/layer_norm/layer_norm.h"

namespace hfnn::kernels::layer_norm {

// Row held in registers, kTpr threads per row (4, 8, 16 or 32), the widest accesses the rows allow
// (16 bytes, else 8, 4 or an element); each group of threads takes kRows rows at once (2 only where
// a thread's slice of a row is 1 or 2 accesses).
template <int kTpr, int kRows> bool fwd_regs_supports(const FwdParams& p);
template <int kTpr, int kRows> cudaError_t fwd_regs_run(const FwdParams& p, cudaStream_t stream);
// One block per row, the row staged in shared memory: any cols up to the shared-memory limit.
bool fwd_block_supports(const FwdParams& p);
cudaError_t fwd_block_run(const FwdParams& p, cudaStream_t stream);

template <int kTpr, int kRows> bool bwd_regs_supports(const BwdParams& p);
template <int kTpr, int kRows> std::size_t bwd_regs_workspace(const BwdParams& p);
template <int kTpr, int kRows> cudaError_t bwd_regs_run(const BwdParams& p, cudaStream_t stream);
// kWindow: only rows aligned to an element, read through their 16-byte windows (bwd_block_win).
template <bool kWindow> bool bwd_block_supports(const BwdParams& p);
template <bool kWindow> std::size_t bwd_block_workspace(const BwdParams& p);
template <bool kWindow> cudaError_t bwd_block_run(const BwdParams& p, cudaStream_t stream);

// Wide rows: a row held in registers across a whole block (kCluster 1), or split over the blocks
// of a thread-block cluster (2 to 16, Hopper), the partial sums exchanged through distributed
// shared memory (layer_norm_wide.cu).
// kStaged: a persistent grid whose blocks stage gamma and beta once as floats (fwd_wide_c*_ps).
template <int kCluster, bool kStaged> bool fwd_wide_supports(const FwdParams& p);
template <int kCluster, bool kStaged> cudaError_t fwd_wide_run(const FwdParams& p, cudaStream_t stream);
// kSmemSums: the backward's dgamma/dbeta sums in shared memory instead of registers (more blocks
// an SM and more bytes a thread in flight where those registers were the limit: 16-bit types).
template <int kCluster, bool kSmemSums> bool bwd_wide_supports(const BwdParams& p);
template <int kCluster, bool kSmemSums> std::size_t bwd_wide_workspace(const BwdParams& p);
template <int kCluster, bool kSmemSums> cudaError_t bwd_wide_run(const BwdParams& p, cudaStream_t stream);

// Wide rows not 16-byte aligned, through their 16-byte windows (layer_norm_window.cuh): the forward,
// staged on a persistent grid (kStaged) or a cluster a row reading gamma and beta as it goes, and
// the backward: dx alone (kSums false: only as bwd_cols_*'s base), or with its dgamma/dbeta sums in
// shared memory by window position (kSums: bwd_wide_win_c*_smem, with a workspace).
template <int kCluster, bool kStaged> bool fwd_wide_win_supports(const FwdParams& p);
template <int kCluster, bool kStaged> cudaError_t fwd_wide_win_run(const FwdParams& p, cudaStream_t stream);
template <int kCluster, bool kSums> bool bwd_wide_win_supports(const BwdParams& p);
template <int kCluster> std::size_t bwd_wide_win_workspace(const BwdParams& p);
template <int kCluster, bool kSums> cudaError_t bwd_wide_win_run(const BwdParams& p, cudaStream_t stream);

// Rows not 16-byte aligned, read and written through their 16-byte-aligned windows: kTpr threads a
// row as in *_regs, blocks taking rows of one lead (layer_norm_window.cu).
template <int kTpr> bool fwd_window_supports(const FwdParams& p);
template <int kTpr> cudaError_t fwd_window_run(const FwdParams& p, cudaStream_t stream);
// kSmemSums: each thread's dgamma/dbeta sums in shared memory (bwd_win_tpr*_smem).
template <int kTpr, bool kSmemSums> bool bwd_window_supports(const BwdParams& p);
template <int kTpr, bool kSmemSums> std::size_t bwd_window_workspace(const BwdParams& p);
template <int kTpr, bool kSmemSums> cudaError_t bwd_window_run(const BwdParams& p, cudaStream_t stream);

// The forward of narrow rows at any alignment through flat tiles of consecutive rows in shared
// memory, moved in 16-byte packs; kTpr threads a row, rows of up to 16 x kTpr columns
// (layer_norm_flat.cu).
template <int kTpr> bool fwd_flat_supports(const FwdParams& p);
template <int kTpr> cudaError_t fwd_flat_run(const FwdParams& p, cudaStream_t stream);

// A backward variant Run's dx alone (dgamma and dbeta dropped: no partials, no reduction kernel),
// then dgamma and dbeta summed down the columns from x, dy, mean and rstd by a kernel of their own
// (layer_norm_cols.cu): few, wide rows. No workspace.
template <bool (*Supports)(const BwdParams&), cudaError_t (*Run)(const BwdParams&, cudaStream_t)>
bool bwd_cols_supports(const BwdParams& p);
template <bool (*Supports)(const BwdParams&), cudaError_t (*Run)(const BwdParams&, cudaStream_t)>
cudaError_t bwd_cols_run(const BwdParams& p, cudaStream_t stream);

// The persistent backward variants' last step: dgamma and dbeta from the [2][grid][cols] float
// partials in the workspace, summed in a fixed order (layer_norm_bwd.cu).
cudaError_t reduce_partials(const BwdParams& p, const float* partials, int grid, cudaStream_t stream);

// The persistent backward grids write 2 x cols floats of partials per block (or cluster) when
// dgamma or dbeta is wanted: the grid run() launches, never more than the workspace holds (it was
// sized by workspace_bytes() from the same query, but a caller's smaller buffer must not be
// overrun). 0: the workspace holds no block.
inline int64_t grid_within_workspace(int64_t grid, const BwdParams& p) {
  if (!p.dgamma && !p.dbeta) return grid;
  const int64_t fit = static_cast<int64_t>(p.workspace_size / (2 * static_cast<std::size_t>(p.cols) * sizeof(float)));
  return grid < fit ? grid : fit;
}

// Row-register variants hold at most this many accesses per thread per row.
inline constexpr int kMaxAccessesPerThread = 8;

// Whether the row-register backward holds exactly the accesses that cover a row (any count to
// kMaxAccessesPerThread) rather than the power of two at or above it: 16-bit rows, in accesses of
// any width. Under 16 bytes an access is 1 to 4 elements and a thread's slots past the row
// (predicated off, still issued) cost the most: H100, bf16, 16M elements, 33 columns at 8 threads
// a row took 8 two-byte accesses a thread for 5, and bwd_regs_tpr8 ran 1.17x faster with 5. In
// 16-byte accesses the empty slots cost registers: 768 columns at 32 threads a row took 4 accesses
// for 3 (165 registers, one block of 256 threads an SM); with 3 (held to 128 registers,
// regs_min_blocks) two blocks fit, and the best backward ran 1.03-1.13x faster at 96, 160, 192,
// 320, 384, 640 and 768 columns (H200, bf16 and fp16, 16M elements: bench/README.md, "The
// row-register backward's 16-byte accesses without empty slots"). The forward did not gain under
// 16 bytes (0.94-1.02x), so it keeps the powers of two; float32 keeps them too (fewer
// instantiations).
inline constexpr bool regs_exact_accesses(int elem_bytes, int access_bytes) {
  return elem_bytes == 2 && access_bytes <= 16;
}

// Accesses per thread the row-register variants instantiate for a row: the fewest that cover it
// (`exact`: the backward's regs_exact_accesses), else the smallest power of two that does; 0 when
// none does.
inline int regs_accesses(int64_t cols, int vec, int tpr, bool exact = false) {
  const int64_t need = (cols + static_cast<int64_t>(vec) * tpr - 1) / (static_cast<int64_t>(vec) * tpr);
  if (exact) return need <= kMaxAccessesPerThread ? static_cast<int>(need) : 0;
  for (int nv = 1; nv <= kMaxAccessesPerThread; nv *= 2)
    if (nv >= need) return nv;
  return 0;
}

// Of n slots a thread holds of a row (accesses, or a lane's elements), those below sure_slots(n)
// lie inside every row the instantiation takes, so they need no column test: the fewest that cover
// a row (`exact`) leave only the last slot partial, the smallest power of two at or above it (the
// rows that need more than n / 2) only the upper half. A tested slot costs a compare and a
// predicated instruction for every element it touches, issued all the same (H100 SASS,
// fwd_flat_kernel<bf16, 4, 9>: 3 compares an element, about a third of the row loop).
inline constexpr int sure_slots(int n, bool exact) { return exact ? n - 1 : n / 2; }

// Two rows at a time only pays (and only is instantiated) where a thread's slice is small.
inline constexpr int kMaxAccessesForTwoRows = 2;

}  // namespace hfnn::kernels::layer_norm
