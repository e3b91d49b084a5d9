// The LSTM workspaces' layouts (lstm_layout.h).
#include "kernels/lstm/lstm_layout.h"

#include <algorithm>
#include <climits>

namespace hfnn::kernels::lstm::detail {
namespace {

std::size_t round_up(std::size_t v) { return (v + 255) / 256 * 256; }

std::size_t count(int64_t a, int64_t b, int64_t c) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b) * static_cast<std::size_t>(c);
}

// Rows of dG each partial column sum of db covers: the split count depends only on T*B, so the sums'
// order (and the result) is the same on every run.
constexpr int64_t kDbRowsPerSplit = 256;
constexpr int kDbMaxSplits = 64;

}  // namespace

bool valid_shape(const Shape& s) {
  // Blocks index their shared memory and loop over batch x units with int; the plain GEMM kernel
  // (where cuBLASLt has no algorithm) puts a GEMM's columns (4H, H or I) on the grid's y dimension,
  // 16 a block: at most 65,535 blocks. T*B*4H fits int64 with room.
  constexpr int64_t kMax = INT_MAX / 8, kMaxColumns = 65535 * 16;
  return s.steps > 0 && s.batch > 0 && s.input > 0 && s.hidden > 0 && s.steps <= kMax && s.batch <= kMax &&
         s.input <= kMaxColumns && 4 * s.hidden <= kMaxColumns && s.batch * 4 * s.hidden <= kMax &&
         s.steps <= (int64_t{1} << 40) / (s.batch * 4 * s.hidden);
}

FwdLayout fwd_layout(const Shape& s) {
  FwdLayout l;
  if (!valid_shape(s)) return l;
  const int64_t T = s.steps, B = s.batch, H = s.hidden;
  std::size_t at = 0;
  l.gates = at, at = round_up(at + count(T, B, 4 * H) * sizeof(float));
  l.cs = at, at = round_up(at + count(T, B, H) * sizeof(float));
  l.hs = at, at = round_up(at + count(T + 1, B, history_ld(H)) * sizeof(float));
  if (s.dtype == DType::kFloat32 && history_ld(H) == H) {
    l.hd = l.hs;
  } else {
    l.hd = at, at = round_up(at + count(T + 1, B, H) * dtype_size(s.dtype));
  }
  l.bytes = at;
  return l;
}

BwdLayout bwd_layout(const Shape& s) {
  BwdLayout l;
  if (!valid_shape(s)) return l;
  const int64_t T = s.steps, B = s.batch, H = s.hidden;
  std::size_t at = 0;
  l.dg = at, at = round_up(at + count(T, B, 4 * H) * sizeof(float));
  if (s.dtype == DType::kFloat32) {
    l.dg16 = l.dg;
  } else {
    l.dg16 = at, at = round_up(at + count(T, B, 4 * H) * dtype_size(s.dtype));
    l.dgs = at, at = round_up(at + count(2, B, 4 * H) * dtype_size(s.dtype));
  }
  l.dh = at, at = round_up(at + count(2, B, H) * sizeof(float));
  l.dc = at, at = round_up(at + count(1, B, H) * sizeof(float));
  l.db_splits = static_cast<int>(std::min<int64_t>(kDbMaxSplits, (T * B + kDbRowsPerSplit - 1) / kDbRowsPerSplit));
  l.dbp = at, at = round_up(at + count(l.db_splits, 1, 4 * H) * sizeof(float));
  l.flags = at, at = round_up(at + count(H, 1, kFlagWords) * sizeof(unsigned));
  l.bytes = at;
  return l;
}

}  // namespace hfnn::kernels::lstm::detail

namespace hfnn::kernels::lstm {

std::size_t fwd_workspace_bytes(const Shape& s) { return detail::fwd_layout(s).bytes; }
std::size_t bwd_scratch_bytes(const Shape& s) { return detail::bwd_layout(s).bytes; }

}  // namespace hfnn::kernels::lstm
