// hfnn's short-sequence attention core (short_attention.h): blocks of eight warps, as many as the
// device keeps resident, each taking (batch, head) pairs in turn and copying the next pair's inputs
// in (cp.async) while it computes on this one's where two copies fit. Shared memory, 16-bit arrays padded by 8 elements a row and float ones by 4 (wmma's
// leading dimensions, and rows that do not start on the same bank):
//   forward:  Q [Lp, Dh], K [Sp, Dh], V [Sp, Dh], scores [Lp, Sp] float, P [Lp, Sp], a 16x16 float
//             tile a warp for the output's conversion
//   backward: Q, K, V, dO, then P in float (then P * dP), P (then dS) in 16-bit, the tiles, D [Lp]
// where Lp and Sp are L and S rounded up to 16; the padding rows are zero and the padding columns
// of P are zero, so they add nothing to any product, and nothing is written for them.
#include "kernels/multihead_attention/short_attention.h"

#include <mma.h>

#include <algorithm>
#include <cmath>

#include "kernels/common/device.cuh"

namespace hfnn::kernels::multihead_attention {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 16;
constexpr int kPad16 = 8;  // elements of padding a 16-bit row
constexpr int kPadF = 4;   // a float row
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ constexpr int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }
__host__ __device__ constexpr std::size_t align128(std::size_t n) { return (n + 127) / 128 * 128; }

// Where each array starts in the block's shared memory (bytes), and the total. The inputs (Q, K, V,
// and backward dO and the log-sum-exp) come in `stages` copies: with 2, a block loads the next
// (batch, head)'s while it computes this one's.
struct Layout {
  int lp = 0, sp = 0, ldh = 0, ldf = 0, ldp = 0;
  std::size_t q[2] = {}, k[2] = {}, v[2] = {}, dout[2] = {}, lse[2] = {};
  std::size_t sf = 0, pb = 0, stage = 0, rows = 0, total = 0;
};

__host__ __device__ Layout layout_of(int64_t q_len, int64_t kv_len, int64_t head_dim, bool backward, int stages) {
  Layout l;
  l.lp = static_cast<int>(round16(q_len));
  l.sp = static_cast<int>(round16(kv_len));
  l.ldh = static_cast<int>(head_dim) + kPad16;
  l.ldf = l.sp + kPadF;
  l.ldp = l.sp + kPad16;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t start = at;
    at = align128(at + bytes);
    return start;
  };
  for (int i = 0; i < stages; ++i) {
    l.q[i] = take(std::size_t(l.lp) * l.ldh * 2);
    l.k[i] = take(std::size_t(l.sp) * l.ldh * 2);
    l.v[i] = take(std::size_t(l.sp) * l.ldh * 2);
    if (backward) l.dout[i] = take(std::size_t(l.lp) * l.ldh * 2);
    if (backward) l.lse[i] = take(std::size_t(l.lp) * 4);
  }
  l.sf = take(std::size_t(l.lp) * l.ldf * 4);
  l.pb = take(std::size_t(l.lp) * l.ldp * 2);
  l.stage = take(std::size_t(kWarps) * kTile * kTile * 4);
  if (backward) l.rows = take(std::size_t(l.lp) * 4);
  l.total = at;
  return l;
}

// Asynchronous copies global -> shared (cp.async, sm_80 on): `valid` false writes zeros.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy4(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [0, n) of a [n, Dh] view (rows `stride` elements apart, 16-byte aligned) into shared memory
// with leading dimension ld; rows [n, padded) zero.
template <typename T>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, int64_t stride, int n, int padded,
                                          int head_dim) {
  const int vecs = head_dim / 8;
  for (int i = threadIdx.x; i < padded * vecs; i += kThreads) {
    const int r = i / vecs, c = (i % vecs) * 8;
    copy16(dst + r * ld + c, r < n ? src + r * stride + c : src, r < n);
  }
}

// A warp's 16x16 float tile (in `stage`, leading dimension 16) to rows [r0, r0+16) and columns
// [c0, c0+16) of a [rows, Dh] view in global memory, rows >= n skipped: each lane one half row.
template <typename T>
__device__ __forceinline__ void store_tile(T* dst, int64_t stride, int r0, int c0, int n, const float* stage) {
  const int lane = threadIdx.x % 32;
  const int r = lane / 2, c = (lane % 2) * 8;
  if (r0 + r < n) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = stage[r * kTile + c + e];
    store_pack<T, 16>(dst + (r0 + r) * stride + c0 + c, pack<T, 16>(v));
  }
}

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::row_major>;
template <typename T>
using FragAt = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::col_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::row_major>;
template <typename T>
using FragBt = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

// acc += A B over `steps` 16-wide steps of the shared dimension: A's first tile at a (leading
// dimension lda, the next a_step elements on), B's at b; FA and FB say each operand's layout.
template <typename FA, typename FB, typename T>
__device__ __forceinline__ void product(FragC& acc, const T* a, int lda, int a_step, const T* b, int ldb, int b_step,
                                        int steps) {
  for (int k = 0; k < steps; ++k) {
    FA fa;
    FB fb;
    wmma::load_matrix_sync(fa, a + k * a_step, lda);
    wmma::load_matrix_sync(fb, b + k * b_step, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

__device__ __forceinline__ bool visible(int i, int j, int q_len, int kv_len, bool causal) {
  return i < q_len && j < kv_len && !(causal && j > i);
}

// What both kernels' blocks hold: the layout, the scratch arrays and the sizes.
template <typename T>
struct Block {
  Layout l;
  float* sf;     // [Lp, Sp] float: scores, then P (then P * dP backward)
  T* pb;         // [Lp, Sp] 16-bit: P (then dS backward)
  float* stage;  // this warp's 16x16 float tile
  int warp, lane, head_dim, q_len, kv_len;
  int64_t pairs;
  __device__ Block(unsigned char* smem, const ShortShape& s, bool backward, int stages)
      : l(layout_of(s.q_len, s.kv_len, s.head_dim, backward, stages)),
        sf(reinterpret_cast<float*>(smem + l.sf)),
        pb(reinterpret_cast<T*>(smem + l.pb)),
        stage(reinterpret_cast<float*>(smem + l.stage) + (threadIdx.x / 32) * kTile * kTile),
        warp(threadIdx.x / 32),
        lane(threadIdx.x % 32),
        head_dim(static_cast<int>(s.head_dim)),
        q_len(static_cast<int>(s.q_len)),
        kv_len(static_cast<int>(s.kv_len)),
        pairs(s.batch * s.heads) {}

  // scores = Q K^T (unscaled) into sf: tiles of [Lp, Sp] shared among the warps.
  __device__ void scores(const T* qs, const T* ks) const {
    const int tn = l.sp / kTile;
    for (int t = warp; t < (l.lp / kTile) * tn; t += kWarps) {
      const int i0 = (t / tn) * kTile, j0 = (t % tn) * kTile;
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      product<FragA<T>, FragBt<T>>(acc, qs + i0 * l.ldh, l.ldh, kTile, ks + j0 * l.ldh, l.ldh, kTile,
                                   head_dim / kTile);  // K^T: element (d, j) is K[j][d]
      wmma::store_matrix_sync(sf + i0 * l.ldf + j0, acc, l.ldf, wmma::mem_row_major);
    }
  }

  // The warp's tile to global rows [r0, r0+16) (those < n) and columns [c0, c0+16) of a [rows, Dh] view.
  __device__ void write(const FragC& acc, T* dst, int64_t stride, int r0, int c0, int n) const {
    wmma::store_matrix_sync(stage, acc, kTile, wmma::mem_row_major);
    __syncwarp();
    store_tile(dst, stride, r0, c0, n, stage);
    __syncwarp();
  }
};

// The (batch, head) pairs a block takes: blockIdx.x, then every gridDim.x-th. issue(buf, bh) starts
// copying a pair's inputs into buffer `buf` (and commits them), compute(buf, bh) runs once they have
// landed. With two stages the next pair's inputs are copied in while this one's are computed on.
template <typename Issue, typename Compute>
__device__ __forceinline__ void for_each_pair(int64_t pairs, int stages, Issue&& issue, Compute&& compute) {
  int cur = 0;
  if (blockIdx.x < pairs) issue(0, blockIdx.x);
  for (int64_t bh = blockIdx.x; bh < pairs; bh += gridDim.x) {
    const int64_t next = bh + gridDim.x;
    if (stages == 2) {
      if (next < pairs) issue(cur ^ 1, next);
      else commit();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    compute(cur, bh);
    __syncthreads();  // before this pair's buffers and the scratch arrays are written again
    if (stages == 2) cur ^= 1;
    else if (next < pairs) issue(0, next);
  }
}

// Q, K and V of pair bh into buffer `buf` (not committed).
template <typename T, typename Params>
__device__ __forceinline__ void load_qkv(unsigned char* smem, const Layout& l, int buf, const Params& p, int64_t bh) {
  const ShortShape& s = p.shape;
  const int64_t b = bh / s.heads, h = bh % s.heads;
  const int q_len = static_cast<int>(s.q_len), kv_len = static_cast<int>(s.kv_len), dh = static_cast<int>(s.head_dim);
  load_rows(reinterpret_cast<T*>(smem + l.q[buf]), l.ldh, static_cast<const T*>(p.q) + b * p.sq.b + h * p.sq.h, p.sq.l,
            q_len, l.lp, dh);
  load_rows(reinterpret_cast<T*>(smem + l.k[buf]), l.ldh, static_cast<const T*>(p.k) + b * p.sk.b + h * p.sk.h, p.sk.l,
            kv_len, l.sp, dh);
  load_rows(reinterpret_cast<T*>(smem + l.v[buf]), l.ldh, static_cast<const T*>(p.v) + b * p.sv.b + h * p.sv.h, p.sv.l,
            kv_len, l.sp, dh);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) short_fwd_kernel(ShortFwdParams p, int stages) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ShortShape& s = p.shape;
  const Block<T> k(smem, s, false, stages);
  const Layout& l = k.l;
  const float c = p.scale * kLog2e;
  auto issue = [&](int buf, int64_t bh) {
    load_qkv<T>(smem, l, buf, p, bh);
    commit();
  };
  for_each_pair(k.pairs, stages, issue, [&](int cur, int64_t bh) {
    const T* qs = reinterpret_cast<const T*>(smem + l.q[cur]);
    const T* vs = reinterpret_cast<const T*>(smem + l.v[cur]);
    k.scores(qs, reinterpret_cast<const T*>(smem + l.k[cur]));
    __syncthreads();

    // Softmax a row a warp, in base 2: P = exp2(x - m) / sum, lse = m + log2(sum) of x = score * scale * log2(e).
    float* lse = p.lse + bh * s.q_len;
    for (int i = k.warp; i < l.lp; i += kWarps) {
      float m = -INFINITY;
      for (int j = k.lane; j < l.sp; j += 32)
        if (visible(i, j, k.q_len, k.kv_len, s.causal)) m = fmaxf(m, k.sf[i * l.ldf + j] * c);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      float sum = 0.f;
      for (int j = k.lane; j < l.sp; j += 32) {
        const float e = visible(i, j, k.q_len, k.kv_len, s.causal) ? exp2f(k.sf[i * l.ldf + j] * c - m) : 0.f;
        k.sf[i * l.ldf + j] = e;
        sum += e;
      }
      sum = group_sum<32>(sum);
      const float inv = i < k.q_len ? 1.f / sum : 0.f;
      for (int j = k.lane; j < l.sp; j += 32) k.pb[i * l.ldp + j] = from_float<T>(k.sf[i * l.ldf + j] * inv);
      if (k.lane == 0 && i < k.q_len) lse[i] = m + log2f(sum);
    }
    __syncthreads();

    // O = P V: tiles of [Lp, Dh].
    T* o = static_cast<T*>(p.o) + (bh / s.heads) * p.so.b + (bh % s.heads) * p.so.h;
    const int tn = k.head_dim / kTile;
    for (int t = k.warp; t < (l.lp / kTile) * tn; t += kWarps) {
      const int i0 = (t / tn) * kTile, d0 = (t % tn) * kTile;
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      product<FragA<T>, FragB<T>>(acc, k.pb + i0 * l.ldp, l.ldp, kTile, vs + d0, l.ldh, kTile * l.ldh, l.sp / kTile);
      k.write(acc, o, p.so.l, i0, d0, k.q_len);
    }
  });
}

template <typename T>
__global__ void __launch_bounds__(kThreads) short_bwd_kernel(ShortBwdParams p, int stages) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ShortShape& s = p.shape;
  const Block<T> k(smem, s, true, stages);
  const Layout& l = k.l;
  float* rows = reinterpret_cast<float*>(smem + l.rows);
  const float c = p.scale * kLog2e;
  auto issue = [&](int buf, int64_t bh) {
    load_qkv<T>(smem, l, buf, p, bh);
    load_rows(reinterpret_cast<T*>(smem + l.dout[buf]), l.ldh,
              static_cast<const T*>(p.dout) + (bh / s.heads) * p.sdo.b + (bh % s.heads) * p.sdo.h, p.sdo.l, k.q_len,
              l.lp, k.head_dim);
    float* ls = reinterpret_cast<float*>(smem + l.lse[buf]);
    const float* lse = p.lse + bh * s.q_len;
    for (int i = threadIdx.x; i < l.lp; i += kThreads) copy4(ls + i, i < k.q_len ? lse + i : lse, i < k.q_len);
    commit();
  };
  for_each_pair(k.pairs, stages, issue, [&](int cur, int64_t bh) {
    const T* qs = reinterpret_cast<const T*>(smem + l.q[cur]);
    const T* ks = reinterpret_cast<const T*>(smem + l.k[cur]);
    const T* vs = reinterpret_cast<const T*>(smem + l.v[cur]);
    const T* dos = reinterpret_cast<const T*>(smem + l.dout[cur]);
    const float* ls = reinterpret_cast<const float*>(smem + l.lse[cur]);
    const int64_t b = bh / s.heads, h = bh % s.heads;
    k.scores(qs, ks);
    __syncthreads();

    // P again, from the forward's log-sum-exp: float in sf, 16-bit in pb.
    for (int e = threadIdx.x; e < l.lp * l.sp; e += kThreads) {
      const int i = e / l.sp, j = e % l.sp;
      const float v = visible(i, j, k.q_len, k.kv_len, s.causal) ? exp2f(k.sf[i * l.ldf + j] * c - ls[i]) : 0.f;
      k.sf[i * l.ldf + j] = v;
      k.pb[i * l.ldp + j] = from_float<T>(v);
    }
    __syncthreads();

    // dV = P^T dO: tiles of [Sp, Dh]; then dP = dO V^T a tile at a time, multiplied into P in
    // place (sf = P * dP). Different tiles of sf than any warp's dV reads (those read pb).
    T* dv = static_cast<T*>(p.dv) + b * p.sdv.b + h * p.sdv.h;
    const int tn = k.head_dim / kTile;
    const int v_tiles = (l.sp / kTile) * tn, tj = l.sp / kTile;
    for (int t = k.warp; t < v_tiles + (l.lp / kTile) * tj; t += kWarps) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      if (t < v_tiles) {
        const int j0 = (t / tn) * kTile, d0 = (t % tn) * kTile;
        // P^T: element (j, i) is P[i][j]
        product<FragAt<T>, FragB<T>>(acc, k.pb + j0, l.ldp, kTile * l.ldp, dos + d0, l.ldh, kTile * l.ldh,
                                     l.lp / kTile);
        k.write(acc, dv, p.sdv.l, j0, d0, k.kv_len);
      } else {
        const int u = t - v_tiles;
        const int i0 = (u / tj) * kTile, j0 = (u % tj) * kTile;
        // V^T: element (d, j) is V[j][d]
        product<FragA<T>, FragBt<T>>(acc, dos + i0 * l.ldh, l.ldh, kTile, vs + j0 * l.ldh, l.ldh, kTile,
                                     k.head_dim / kTile);
        wmma::store_matrix_sync(k.stage, acc, kTile, wmma::mem_row_major);
        __syncwarp();
        const int r = k.lane / 2, c0 = (k.lane % 2) * 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) k.sf[(i0 + r) * l.ldf + j0 + c0 + e] *= k.stage[r * kTile + c0 + e];
        __syncwarp();
      }
    }
    __syncthreads();

    // D_i = sum_j P_ij dP_ij, a row a warp in a fixed order.
    for (int i = k.warp; i < l.lp; i += kWarps) {
      float d = 0.f;
      for (int j = k.lane; j < l.sp; j += 32) d += k.sf[i * l.ldf + j];
      d = group_sum<32>(d);
      if (k.lane == 0) rows[i] = d;
    }
    __syncthreads();

    // dS = P (dP - D) * scale = (P dP - P D) * scale, over pb (P is no longer read as such).
    for (int e = threadIdx.x; e < l.lp * l.sp; e += kThreads) {
      const int i = e / l.sp, j = e % l.sp;
      const float pd = k.sf[i * l.ldf + j];
      const float pv = to_float(k.pb[i * l.ldp + j]);
      k.pb[i * l.ldp + j] = from_float<T>((pd - pv * rows[i]) * p.scale);
    }
    __syncthreads();

    // dQ = dS K: tiles of [Lp, Dh]; dK = dS^T Q: tiles of [Sp, Dh].
    T* dq = static_cast<T*>(p.dq) + b * p.sdq.b + h * p.sdq.h;
    T* dk = static_cast<T*>(p.dk) + b * p.sdk.b + h * p.sdk.h;
    const int q_tiles = (l.lp / kTile) * tn;
    for (int t = k.warp; t < q_tiles + (l.sp / kTile) * tn; t += kWarps) {
      const bool is_q = t < q_tiles;
      const int u = is_q ? t : t - q_tiles;
      const int r0 = (u / tn) * kTile, d0 = (u % tn) * kTile;
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      if (is_q) {
        product<FragA<T>, FragB<T>>(acc, k.pb + r0 * l.ldp, l.ldp, kTile, ks + d0, l.ldh, kTile * l.ldh,
                                    l.sp / kTile);
        k.write(acc, dq, p.sdq.l, r0, d0, k.q_len);
      } else {  // dS^T
        product<FragAt<T>, FragB<T>>(acc, k.pb + r0, l.ldp, kTile * l.ldp, qs + d0, l.ldh, kTile * l.ldh,
                                     l.lp / kTile);
        k.write(acc, dk, p.sdk.l, r0, d0, k.kv_len);
      }
    }
  });
}

bool fail(std::string* why, const char* text) {
  if (why) *why = text;
  return false;
}

bool strides_ok(const void* ptr, const Strides& st) { return short_view_ok(ptr, st); }

// Two stages where they fit in the device's shared memory, else one; 0 where not even one does.
int stages_for(const ShortShape& s, bool backward) {
  for (int stages = 2; stages >= 1; --stages)
    if (static_cast<int64_t>(layout_of(s.q_len, s.kv_len, s.head_dim, backward, stages).total) <=
        s.device.smem_per_block_optin)
      return stages;
  return 0;
}

template <typename Params>
cudaError_t launch(void (*kernel)(Params, int), const ShortShape& s, bool backward, cudaStream_t stream,
                   const Params& params) {
  const int stages = stages_for(s, backward);
  if (stages == 0) return cudaErrorInvalidConfiguration;
  const std::size_t smem = layout_of(s.q_len, s.kv_len, s.head_dim, backward, stages).total;
  const void* k = reinterpret_cast<const void*>(kernel);
  if (const cudaError_t e = allow_dynamic_smem(k, smem); e != cudaSuccess) return e;
  // As many blocks as the device keeps resident, each looping over (batch, head) pairs.
  const int64_t resident = resident_clusters(k, kThreads, 1, smem, 1, s.device);
  if (resident <= 0) return cudaErrorInvalidConfiguration;
  const int64_t blocks = std::min<int64_t>(s.batch * s.heads, resident);
  kernel<<<dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, stream>>>(params, stages);
  return cudaGetLastError();
}

}  // namespace

bool short_view_ok(const void* data, const Strides& st) {
  return aligned16(data) && st.b % 8 == 0 && st.h % 8 == 0 && st.l % 8 == 0;
}

std::size_t short_fwd_smem(const ShortShape& s) {
  if (s.q_len < 1 || s.kv_len < 1 || s.q_len > kShortMaxLen || s.kv_len > kShortMaxLen || s.head_dim < 16 ||
      s.head_dim > kShortMaxHeadDim || s.head_dim % 16 != 0)
    return 0;
  return layout_of(s.q_len, s.kv_len, s.head_dim, false, 1).total;
}

std::size_t short_bwd_smem(const ShortShape& s) {
  if (short_fwd_smem(s) == 0) return 0;
  return layout_of(s.q_len, s.kv_len, s.head_dim, true, 1).total;
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
    return fail(why, "the block's shared memory (Q, K, V, dO and the scores) exceeds the device's");
  if (why) why->clear();
  return true;
}

bool short_supports(const ShortFwdParams& p, std::string* why) {
  if (!short_supports(p.shape, why)) return false;
  if (!strides_ok(p.q, p.sq) || !strides_ok(p.k, p.sk) || !strides_ok(p.v, p.sv) || !strides_ok(p.o, p.so) ||
      !aligned16(p.lse))
    return fail(why, "Q, K, V and O 16-byte aligned with strides multiples of 8 elements");
  return true;
}

bool short_supports(const ShortBwdParams& p, std::string* why) {
  if (!short_supports(p.shape, why)) return false;
  if (!strides_ok(p.q, p.sq) || !strides_ok(p.k, p.sk) || !strides_ok(p.v, p.sv) || !strides_ok(p.dout, p.sdo) ||
      !strides_ok(p.dq, p.sdq) || !strides_ok(p.dk, p.sdk) || !strides_ok(p.dv, p.sdv))
    return fail(why, "Q, K, V, dO and the gradients 16-byte aligned with strides multiples of 8 elements");
  return true;
}

cudaError_t short_forward(const ShortFwdParams& p, cudaStream_t stream) {
  if (!short_supports(p)) return cudaErrorInvalidConfiguration;
  return dispatch_dtype(p.shape.dtype, [&]<typename T>() -> cudaError_t {
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidConfiguration;
    else return launch(short_fwd_kernel<T>, p.shape, false, stream, p);
  });
}

cudaError_t short_backward(const ShortBwdParams& p, cudaStream_t stream) {
  if (!short_supports(p)) return cudaErrorInvalidConfiguration;
  return dispatch_dtype(p.shape.dtype, [&]<typename T>() -> cudaError_t {
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidConfiguration;
    else return launch(short_bwd_kernel<T>, p.shape, true, stream, p);
  });
}

}  // namespace hfnn::kernels::multihead_attention
