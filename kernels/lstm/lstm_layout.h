// The LSTM variants' workspace layouts (lstm.h: fwd_workspace_bytes, bwd_scratch_bytes), host
// code without CUDA so the sizes are known (and CPU-tested) in any build.
#pragma once
#include <cstddef>

#include "kernels/lstm/lstm.h"

namespace hfnn::kernels::lstm::detail {

// The forward's workspace, byte offsets (each 256-aligned):
//   gates  float [T, B, 4H]: the input projection x W_ih^T, overwritten step by step (same
//          elements, same thread) by the gates after their activations
//   cs     float [T, B, H]: c_t
//   hs     float [T+1, B, Hp]: the h history in float32 (the persistent forward's recurrence reads
//          it), rows padded to Hp = H rounded up to 4 (history_ld) with zeros (memset before the
//          launch), so a row is whole 16-byte groups from a 16-byte boundary (the forward's stage
//          copies them by cp.async)
//   hd     dtype [T+1, B, H]: the same history in the dtype, for the backward's GEMMs (for float32
//          with H a multiple of 4 it is hs itself)
// History slots: time t reads slot read_slot(t) and writes write_slot(t); the first step reads the
// initial slot (h0 or zeros). Forward: t reads slot t, writes t+1. Reverse: t reads t+1, writes t.
// So the h that time t read is row t of hd (forward) or row t+1 (reverse): in either direction
// rows [first, first+T) of hd pair with dG's rows in time order, one GEMM for dW_hh.
struct FwdLayout {
  std::size_t gates = 0, cs = 0, hs = 0, hd = 0, bytes = 0;
};
// The backward's scratch:
//   dg    float [T, B, 4H]: the gates' pre-activation gradients, by time
//   dg16  dtype [T, B, 4H]: the same in the dtype for the GEMMs (float32: dg itself)
//   dgs   dtype [2B, 4H], 16-bit only: the steps variant's split of one step's dG for its dh GEMM,
//          rows of dG rounded to the dtype (hi) then rows of the rest (lo = dG - hi, rounded)
//   dh    float [2, B, H]: the recurrent gradient (the steps variant's; the persistent one keeps it
//          on chip), in 16-bit the two products hi W_hh and lo W_hh, summed where read
//   dc    float [B, H]: the recurrent gradient of c (likewise)
//   dbp   float [db_splits, 4H]: partial column sums of dg
//   flags unsigned [H, kFlagWords]: the persistent backward's readiness words, one a block (a grid
//          has at most H blocks), each in its own 128-byte line (lstm_persistent.cu)
struct BwdLayout {
  std::size_t dg = 0, dg16 = 0, dh = 0, dc = 0, dbp = 0, flags = 0, bytes = 0;
  int db_splits = 1;
  std::size_t dgs = 0;
};
constexpr int kFlagWords = 32;  // 4-byte words from one block's readiness word to the next
FwdLayout fwd_layout(const Shape& s);
// hs's row length: H rounded up to a multiple of 4.
constexpr int64_t history_ld(int64_t hidden) { return (hidden + 3) / 4 * 4; }
BwdLayout bwd_layout(const Shape& s);

// Sizes a kernel may index with int (blocks' loops) and the GEMMs take.
bool valid_shape(const Shape& s);

}  // namespace hfnn::kernels::lstm::detail
