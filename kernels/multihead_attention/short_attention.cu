// hfnn's short-sequence attention core (short_attention.h), register-resident: one block per
// (batch, head) with one warp per 16 query rows (Lp / 16 warps, Lp = L rounded up to 16), so the
// whole key axis is one tile and the softmax is exact, with no running maxima.
//
// Forward, a warp: its 16 x Sp scores S = Q K^T accumulate in registers (mma.sync m16n8k16, fp16 or
// bf16 in, float out), the softmax runs on them in base 2 (a row's maximum and sum from the four
// lanes that hold it), the unnormalised P goes straight from the accumulators into the next
// product's A operand, O = P V, and O is divided by the row sums and written through this warp's
// own Q rows in shared memory (no longer read) as 16-byte rows.
//
// Backward: a warp recomputes its rows of S and P = exp2(S c - lse), dP = dO V^T, D_i = sum_j P dP
// (flash's rowsum(dO * O), from the block's own P and dP: O is never read) and dS = P (dP - D) scale
// in registers; P and dS go to shared memory once, and after a barrier the warps take 16-key tiles:
// dV = P^T dO and dK = dS^T Q with the transposes done by ldmatrix.trans, each written through the
// warp's own rows of V's array (read no more); after a second barrier, dQ = dS K for the warp's rows,
// written through its rows of Q's array. Every global write is a 16-byte vector.
//
// Shared memory, 16-bit rows padded by 8 elements (16 bytes: ldmatrix's eight row addresses fall
// in different banks): Q [Lp, Dh], K [Sp, Dh], V [Sp, Dh]; backward also dO [Lp, Dh], P and dS
// [Lp, Sp], the log-sum-exp [Lp]. Rows past L or S are zero-filled by the copies; keys past S are
// masked out of the softmax, rows past L add nothing to any product, and nothing is written for
// either.
//
// Register arrays are sized by buckets of the head size and the padded key length (32, 64, 128),
// their loops unrolled and guarded by the real counts.
#include "kernels/multihead_attention/short_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/device.cuh"
#include "kernels/multihead_attention/attention_tiles.cuh"

namespace hfnn::kernels::multihead_attention {
namespace {

using namespace tiles;

constexpr int kMaxWarps = 8;  // 128 query rows

// Where each array starts in the block's shared memory (bytes), and the total.
struct Layout {
  int lp = 0, sp = 0, ld = 0, ldp = 0;  // padded lengths; leading dimensions of [*, Dh] and [Lp, Sp]
  std::size_t q = 0, k = 0, v = 0, dout = 0, p = 0, ds = 0, lse = 0, total = 0;
};

__host__ __device__ Layout layout_of(int64_t q_len, int64_t kv_len, int64_t head_dim, bool backward) {
  Layout l;
  l.lp = round16(q_len);
  l.sp = round16(kv_len);
  l.ld = static_cast<int>(head_dim) + kPad;
  l.ldp = l.sp + kPad;
  SmemCarve c;
  l.q = c.take(std::size_t(l.lp) * l.ld * 2);
  l.k = c.take(std::size_t(l.sp) * l.ld * 2);
  l.v = c.take(std::size_t(l.sp) * l.ld * 2);
  if (backward) {
    l.dout = c.take(std::size_t(l.lp) * l.ld * 2);
    l.p = c.take(std::size_t(l.lp) * l.ldp * 2);
    l.ds = c.take(std::size_t(l.lp) * l.ldp * 2);
    l.lse = c.take(std::size_t(l.lp) * 4);
  }
  l.total = c.at;
  return l;
}

template <typename T, int kD, int kS>
__global__ void __launch_bounds__(kMaxWarps * 32) short_fwd_kernel(ShortFwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ShortShape& s = p.shape;
  const int q_len = static_cast<int>(s.q_len), kv_len = static_cast<int>(s.kv_len), dh = static_cast<int>(s.head_dim);
  const Layout l = layout_of(q_len, kv_len, dh, false);
  T* qs = reinterpret_cast<T*>(smem + l.q);
  T* ks = reinterpret_cast<T*>(smem + l.k);
  T* vs = reinterpret_cast<T*>(smem + l.v);
  const int heads = static_cast<int>(s.heads);
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;

  // Q and K first, V behind them: the scores start while V is still on its way.
  load_rows<T, kD>(qs, l.ld, static_cast<const T*>(p.q) + b * p.sq.b + h * p.sq.h, p.sq.l, q_len, l.lp, dh);
  load_rows<T, kD>(ks, l.ld, static_cast<const T*>(p.k) + b * p.sk.b + h * p.sk.h, p.sk.l, kv_len, l.sp, dh);
  commit();
  load_rows<T, kD>(vs, l.ld, static_cast<const T*>(p.v) + b * p.sv.b + h * p.sv.h, p.sv.l, kv_len, l.sp, dh);
  commit();
  wait_copies<1>();
  __syncthreads();

  const int lane = threadIdx.x % 32, r0 = (threadIdx.x / 32) * 16;
  const int g = lane >> 2, t = lane & 3;
  const int d_blocks = dh / 16, s_blocks = l.sp / 16;

  float acc[kS / 8][4];  // scores, then the unnormalised P
  zero(acc);
  product<T, kD / 16, kS / 8, false>(
      acc, d_blocks, s_blocks, [&](int kb, uint32_t(&a)[4]) { ldsm(a, a_row(qs, l.ld, r0, kb * 16, lane)); },
      [&](int kb, int np) { return bt_row(ks, l.ld, np * 16, kb * 16, lane); });

  // Softmax in base 2 with c = scale log2(e): m = the row's largest score, P = 2^(S c - m c) (the
  // maximum taken on the raw scores: c > 0), lse = m c + log2(sum P).
  const float c = p.scale * kLog2e;
  const int i_lo = r0 + g, i_hi = r0 + g + 8;
  if (s.causal || kv_len < kS) mask_scores<kS>(acc, 0, i_lo, kv_len, s.causal, t);
  float m_lo = -INFINITY, m_hi = -INFINITY;
#pragma unroll
  for (int n = 0; n < kS / 8; ++n) {
    m_lo = fmaxf(m_lo, fmaxf(acc[n][0], acc[n][1]));
    m_hi = fmaxf(m_hi, fmaxf(acc[n][2], acc[n][3]));
  }
  m_lo = quad_max(m_lo);
  m_hi = quad_max(m_hi);
  // (A row always sees key 0, so m is finite; the guard keeps -inf - -inf out all the same.)
  const float base_lo = m_lo == -INFINITY ? 0.f : m_lo * c, base_hi = m_hi == -INFINITY ? 0.f : m_hi * c;
  exp2_rows<kS>(acc, c, base_lo, base_hi);
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int n = 0; n < kS / 8; ++n) {
    sum_lo += acc[n][0] + acc[n][1];
    sum_hi += acc[n][2] + acc[n][3];
  }
  sum_lo = quad_sum(sum_lo);  // at least 1: the maximum's own entry
  sum_hi = quad_sum(sum_hi);
  float* lse = p.lse + static_cast<int64_t>(blockIdx.x) * q_len;
  if (t == 0) {
    if (i_lo < q_len) lse[i_lo] = base_lo + __log2f(sum_lo);
    if (i_hi < q_len) lse[i_hi] = base_hi + __log2f(sum_hi);
  }

  wait_copies<0>();
  __syncthreads();
  float o[kD / 8][4];
  zero(o);
  product<T, kS / 16, kD / 8, true>(
      o, s_blocks, d_blocks, [&](int kb, uint32_t(&a)[4]) { acc_to_a<T>(a, acc, kb); },
      [&](int kb, int np) { return b_row(vs, l.ld, kb * 16, np * 16, lane); });

  T* out = static_cast<T*>(p.o) + b * p.so.b + h * p.so.h + r0 * p.so.l;
  write_rows<T, kD>(o, __frcp_rn(sum_lo), __frcp_rn(sum_hi), qs + r0 * l.ld, l.ld, out,
                p.so.l, q_len - r0, dh, lane);
}

template <typename T, int kD, int kS>
__global__ void __launch_bounds__(kMaxWarps * 32) short_bwd_kernel(ShortBwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ShortShape& s = p.shape;
  const int q_len = static_cast<int>(s.q_len), kv_len = static_cast<int>(s.kv_len), dh = static_cast<int>(s.head_dim);
  const Layout l = layout_of(q_len, kv_len, dh, true);
  T* qs = reinterpret_cast<T*>(smem + l.q);
  T* ks = reinterpret_cast<T*>(smem + l.k);
  T* vs = reinterpret_cast<T*>(smem + l.v);
  T* dos = reinterpret_cast<T*>(smem + l.dout);
  T* ps = reinterpret_cast<T*>(smem + l.p);
  T* dss = reinterpret_cast<T*>(smem + l.ds);
  float* ls = reinterpret_cast<float*>(smem + l.lse);
  const int heads = static_cast<int>(s.heads);
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;

  // Q, K and the log-sum-exp first (P), V and dO behind them (dP).
  load_rows<T, kD>(qs, l.ld, static_cast<const T*>(p.q) + b * p.sq.b + h * p.sq.h, p.sq.l, q_len, l.lp, dh);
  load_rows<T, kD>(ks, l.ld, static_cast<const T*>(p.k) + b * p.sk.b + h * p.sk.h, p.sk.l, kv_len, l.sp, dh);
  const float* lse = p.lse + static_cast<int64_t>(blockIdx.x) * q_len;
  for (int i = threadIdx.x; i < l.lp; i += blockDim.x) copy4(ls + i, i < q_len ? lse + i : lse, i < q_len);
  commit();
  load_rows<T, kD>(vs, l.ld, static_cast<const T*>(p.v) + b * p.sv.b + h * p.sv.h, p.sv.l, kv_len, l.sp, dh);
  load_rows<T, kD>(dos, l.ld, static_cast<const T*>(p.dout) + b * p.sdo.b + h * p.sdo.h, p.sdo.l, q_len, l.lp, dh);
  commit();
  wait_copies<1>();
  __syncthreads();

  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
  const int g = lane >> 2, t = lane & 3;
  const int d_blocks = dh / 16, s_blocks = l.sp / 16;
  const int i_lo = r0 + g, i_hi = r0 + g + 8;

  // The warp's rows of P, from the forward's log-sum-exp.
  float pr[kS / 8][4];
  zero(pr);
  product<T, kD / 16, kS / 8, false>(
      pr, d_blocks, s_blocks, [&](int kb, uint32_t(&a)[4]) { ldsm(a, a_row(qs, l.ld, r0, kb * 16, lane)); },
      [&](int kb, int np) { return bt_row(ks, l.ld, np * 16, kb * 16, lane); });
  const float c = p.scale * kLog2e;
  // (Rows past L: zero Q and dO rows and a log-sum-exp of 0 give P = 1, dP = 0 and dS = 0, which add
  // nothing to dV or dK.)
  if (s.causal || kv_len < kS) mask_scores<kS>(pr, 0, i_lo, kv_len, s.causal, t);
  exp2_rows<kS>(pr, c, ls[i_lo], ls[i_hi]);

  wait_copies<0>();
  __syncthreads();
  // dP = dO V^T, then D = rowsum(P dP) and dS = P (dP - D) scale in its place.
  float ds[kS / 8][4];
  zero(ds);
  product<T, kD / 16, kS / 8, false>(
      ds, d_blocks, s_blocks, [&](int kb, uint32_t(&a)[4]) { ldsm(a, a_row(dos, l.ld, r0, kb * 16, lane)); },
      [&](int kb, int np) { return bt_row(vs, l.ld, np * 16, kb * 16, lane); });
  float d_lo = 0.f, d_hi = 0.f;
#pragma unroll
  for (int n = 0; n < kS / 8; ++n) {
    d_lo += pr[n][0] * ds[n][0] + pr[n][1] * ds[n][1];
    d_hi += pr[n][2] * ds[n][2] + pr[n][3] * ds[n][3];
  }
  d_lo = quad_sum(d_lo);
  d_hi = quad_sum(d_hi);
  ds_and_stage<T, kS>(pr, ds, d_lo, d_hi, p.scale, 2 * s_blocks, ps, dss, l.ldp, i_lo, i_hi, t);

  __syncthreads();

  // dV = P^T dO and dK = dS^T Q, a 16-key tile a warp at a time, each written through the warp's own
  // rows of V's array (V is read no more) as 16-byte rows.
  T* dv_out = static_cast<T*>(p.dv) + b * p.sdv.b + h * p.sdv.h;
  T* dk_out = static_cast<T*>(p.dk) + b * p.sdk.b + h * p.sdk.h;
  const int l_blocks = l.lp / 16;
  for (int j0 = warp * 16; j0 < l.sp; j0 += warps * 16) {
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const T* a_src = which == 0 ? ps : dss;
      const T* b_src = which == 0 ? dos : qs;
      float acc[kD / 8][4];
      zero(acc);
      for (int kb = 0; kb < l_blocks; ++kb) {
        uint32_t a[4];
        ldsm_t(a, at_row(a_src, l.ldp, kb * 16, j0, lane));
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          if (np < d_blocks) {
            uint32_t bb[4];
            ldsm_t(bb, b_row(b_src, l.ld, kb * 16, np * 16, lane));
            mma<T>(acc[2 * np], a, bb[0], bb[1]);
            mma<T>(acc[2 * np + 1], a, bb[2], bb[3]);
          }
        }
      }
      const int64_t stride = which == 0 ? p.sdv.l : p.sdk.l;
      write_rows<T, kD>(acc, 1.f, 1.f, vs + j0 * l.ld, l.ld, (which == 0 ? dv_out : dk_out) + j0 * stride, stride,
                        kv_len - j0, dh, lane);
    }
  }
  __syncthreads();

  // dQ = dS K, the warp's rows (dS back from shared memory), written through its own rows of Q's array.
  float dq[kD / 8][4];
  zero(dq);
  product<T, kS / 16, kD / 8, true>(
      dq, s_blocks, d_blocks, [&](int kb, uint32_t(&a)[4]) { ldsm(a, a_row(dss, l.ldp, r0, kb * 16, lane)); },
      [&](int kb, int np) { return b_row(ks, l.ld, kb * 16, np * 16, lane); });
  write_rows<T, kD>(dq, 1.f, 1.f, qs + r0 * l.ld, l.ld, static_cast<T*>(p.dq) + b * p.sdq.b + h * p.sdq.h + r0 * p.sdq.l,
                    p.sdq.l, q_len - r0, dh, lane);
}

// The register buckets: head size and padded key length each 32, 64 or 128.
constexpr int bucket(int64_t n) { return n <= 32 ? 32 : n <= 64 ? 64 : 128; }

template <template <typename, int, int> class K, typename T, typename Params>
cudaError_t launch_bucketed(const Params& p, bool backward, cudaStream_t stream) {
  const ShortShape& s = p.shape;
  const Layout l = layout_of(s.q_len, s.kv_len, s.head_dim, backward);
  const dim3 grid(static_cast<unsigned>(s.batch * s.heads)), block(static_cast<unsigned>(l.lp / 16 * 32));
  auto go = [&](auto kernel) -> cudaError_t {
    const void* k = reinterpret_cast<const void*>(kernel);
    if (const cudaError_t e = allow_dynamic_smem(k, l.total); e != cudaSuccess) return e;
    kernel<<<grid, block, l.total, stream>>>(p);
    return cudaGetLastError();
  };
  const int d = bucket(s.head_dim), sk = bucket(l.sp);
  // Nine instantiations a dtype and direction: every (head size, key length) bucket pair.
  if (d == 32) {
    if (sk == 32) return go(K<T, 32, 32>::kernel);
    if (sk == 64) return go(K<T, 32, 64>::kernel);
    return go(K<T, 32, 128>::kernel);
  }
  if (d == 64) {
    if (sk == 32) return go(K<T, 64, 32>::kernel);
    if (sk == 64) return go(K<T, 64, 64>::kernel);
    return go(K<T, 64, 128>::kernel);
  }
  if (sk == 32) return go(K<T, 128, 32>::kernel);
  if (sk == 64) return go(K<T, 128, 64>::kernel);
  return go(K<T, 128, 128>::kernel);
}

template <typename T, int kD, int kS>
struct Fwd {
  static constexpr auto kernel = short_fwd_kernel<T, kD, kS>;
};
template <typename T, int kD, int kS>
struct Bwd {
  static constexpr auto kernel = short_bwd_kernel<T, kD, kS>;
};

}  // namespace

bool short_view_ok(const void* data, const Strides& st) {
  return aligned16(data) && st.b % 8 == 0 && st.h % 8 == 0 && st.l % 8 == 0;
}

std::size_t short_fwd_smem(const ShortShape& s) {
  if (s.q_len < 1 || s.kv_len < 1 || s.q_len > kShortMaxLen || s.kv_len > kShortMaxLen || s.head_dim < 16 ||
      s.head_dim > kShortMaxHeadDim || s.head_dim % 16 != 0)
    return 0;
  return layout_of(s.q_len, s.kv_len, s.head_dim, false).total;
}

std::size_t short_bwd_smem(const ShortShape& s) {
  if (short_fwd_smem(s) == 0) return 0;
  return layout_of(s.q_len, s.kv_len, s.head_dim, true).total;
}

bool short_supports(const ShortShape& s, std::string* why) {
  if (s.dtype == DType::kFloat32) return fail(why, "float16 or bfloat16 only (tensor-core products)");
  if (s.head_dim % 16 != 0 || s.head_dim < 16 || s.head_dim > kShortMaxHeadDim)
    return fail(why, "head size a multiple of 16 up to 128");
  if (s.q_len < 1 || s.kv_len < 1 || s.q_len > kShortMaxLen || s.kv_len > kShortMaxLen)
    return fail(why, "sequences of 1 to 128 tokens");
  if (s.batch < 1 || s.heads < 1 || s.batch * s.heads > 0x7fffffffLL) return fail(why, "batch x heads from 1 to 2^31 - 1");
  if (s.device.device < 0 || s.device.cc_major < 8) return fail(why, "a GPU of compute capability 8.0 or later");
  const std::size_t need = short_bwd_smem(s);  // the larger of the two
  if (static_cast<int64_t>(need) > s.device.smem_per_block_optin)
    return fail(why, "the block's shared memory (Q, K, V, dO, P and dS) exceeds the device's");
  if (why) why->clear();
  return true;
}

bool short_supports(const ShortFwdParams& p, std::string* why) {
  if (!short_supports(p.shape, why)) return false;
  if (!short_view_ok(p.q, p.sq) || !short_view_ok(p.k, p.sk) || !short_view_ok(p.v, p.sv) ||
      !short_view_ok(p.o, p.so) || !aligned16(p.lse))
    return fail(why, "Q, K, V and O 16-byte aligned with strides multiples of 8 elements");
  return true;
}

bool short_supports(const ShortBwdParams& p, std::string* why) {
  if (!short_supports(p.shape, why)) return false;
  if (!short_view_ok(p.q, p.sq) || !short_view_ok(p.k, p.sk) || !short_view_ok(p.v, p.sv) ||
      !short_view_ok(p.dout, p.sdo) || !short_view_ok(p.dq, p.sdq) || !short_view_ok(p.dk, p.sdk) ||
      !short_view_ok(p.dv, p.sdv))
    return fail(why, "Q, K, V, dO and the gradients 16-byte aligned with strides multiples of 8 elements");
  return true;
}

cudaError_t short_forward(const ShortFwdParams& p, cudaStream_t stream) {
  if (!short_supports(p)) return cudaErrorInvalidConfiguration;
  return dispatch_dtype(p.shape.dtype, [&]<typename T>() -> cudaError_t {
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidConfiguration;
    else return launch_bucketed<Fwd, T>(p, false, stream);
  });
}

cudaError_t short_backward(const ShortBwdParams& p, cudaStream_t stream) {
  if (!short_supports(p)) return cudaErrorInvalidConfiguration;
  return dispatch_dtype(p.shape.dtype, [&]<typename T>() -> cudaError_t {
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidConfiguration;
    else return launch_bucketed<Bwd, T>(p, true, stream);
  });
}

}  // namespace hfnn::kernels::multihead_attention
