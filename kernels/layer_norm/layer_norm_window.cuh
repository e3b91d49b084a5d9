// Reading and writing a row through its WINDOW, the 16-byte-aligned span that covers it
// (layer_norm_window.cu's header comment): window position q is column q - lead, lead the row's
// first element's offset in its 16 bytes. Shared by the window variants and the block variants'
// path for rows aligned to an element only (layer_norm_fwd.cu, layer_norm_bwd.cu).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <numeric>

#include "kernels/common/device.cuh"

namespace hfnn::kernels::layer_norm {

// Window positions are int: the widest row read through a window (past it, positions and the
// loops' next positions would overflow; the block variants take such rows an element at a time).
// The margin is the furthest a loop steps past a row's last position: fwd_block's first pass, 4
// packs of 8 elements for each of up to 1,024 threads (32K; review of d3db6b5: with 16K, rows of
// 2^31 - 32K columns or more wrapped to negative positions).
inline constexpr int64_t kMaxWindowCols = 2147483647 - 64 * 1024;

// Host: whether every pointer is aligned to its element.
inline bool elem_aligned(std::initializer_list<const void*> pointers, int elem) {
  for (const void* p : pointers)
    if (p && reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(elem) != 0) return false;
  return true;
}

// Whether b starts at the same offset in its 16 bytes as a (host and device).
__host__ __device__ inline bool same_lead(const void* a, const void* b) {
  return (reinterpret_cast<std::uintptr_t>(b) - reinterpret_cast<std::uintptr_t>(a)) % 16 == 0;
}

// Host: whether every pointer (null ones ignored) starts at the same offset in its 16 bytes as `x`.
inline bool same_lead(const void* x, std::initializer_list<const void*> others) {
  for (const void* p : others)
    if (p && !same_lead(x, p)) return false;
  return true;
}

// Rows between two rows with the same lead: V / gcd(cols mod V, V), V elements a 16-byte pack.
inline int window_period(int64_t cols, int vec) {
  const int r = static_cast<int>(cols % vec);
  return r == 0 ? 1 : vec / std::gcd(r, vec);
}

// Zeroes the elements of a pack at window positions [pos, pos + V) that are outside [lead, end).
template <typename T>
__device__ __forceinline__ void mask_outside(Pack<T, 16>& pk, int pos, int lead, int end) {
  uint32_t w[4];
  pack_words<16>(pk.raw, w);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (sizeof(T) == 4) {
      if (pos + j < lead || pos + j >= end) w[j] = 0;
    } else {
      const int e = pos + 2 * j;
      const uint32_t lo = (e >= lead && e < end) ? 0x0000ffffu : 0u;
      const uint32_t hi = (e + 1 >= lead && e + 1 < end) ? 0xffff0000u : 0u;
      w[j] &= lo | hi;
    }
  }
  pk.raw = make_uint4(w[0], w[1], w[2], w[3]);
}

// Zeroes the elements of the pack at window position pos that are outside [lead, end) (only the
// packs at the row's two ends have any).
template <typename T>
__device__ __forceinline__ void mask_window(Pack<T, 16>& pk, int pos, int lead, int end) {
  if (pos < lead || pos + kVec<T, 16> > end) mask_outside(pk, pos, lead, end);
}

// The pack at window position pos of the window starting at w, as loaded: one 16-byte load where w
// is 16-byte aligned (`vector`), the elements outside [lead, end) those of the neighbouring rows
// until mask_window zeroes them; else the row's elements one at a time, zeros outside. Kernels
// that hold a row in registers issue every pack's load first and mask after: a mask right behind
// its load waits for it, and the next pack's load with it (in SASS: one load in flight at a time).
template <typename T>
__device__ __forceinline__ Pack<T, 16> load_window_raw(const T* w, int pos, int lead, int end, bool vector) {
  constexpr int kV = kVec<T, 16>;
  if (vector) return load_pack<T, 16>(w + pos);
  float v[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) v[k] = (pos + k >= lead && pos + k < end) ? to_float(w[pos + k]) : 0.f;
  return pack<T, 16>(v);  // exact: each value came from a T
}

// load_window_raw, masked: zeros outside [lead, end).
template <typename T>
__device__ __forceinline__ Pack<T, 16> load_window(const T* w, int pos, int lead, int end, bool vector) {
  Pack<T, 16> pk = load_window_raw<T>(w, pos, lead, end, vector);
  if (vector) mask_window(pk, pos, lead, end);
  return pk;
}

// Stores the row's elements of `out` (window positions [pos, pos + V)): one 16-byte store where the
// pack is all the row's and w is aligned, else an element at a time. The 16-byte store is
// store_global16: store_pack's came out as four 4-byte ones in every window kernel (a kernel with
// this function alone kept STG.E.128).
template <typename T>
__device__ __forceinline__ void store_window(T* w, int pos, int lead, int end, bool vector,
                                             const float (&out)[kVec<T, 16>]) {
  constexpr int kV = kVec<T, 16>;
  if (vector && pos >= lead && pos + kV <= end) {
    store_global16(w + pos, pack<T, 16>(out).raw);
    return;
  }
#pragma unroll
  for (int k = 0; k < kV; ++k)
    if (pos + k >= lead && pos + k < end) w[pos + k] = from_float<T>(out[k]);
}

// 16-byte packs that cover a row of `cols` from any lead (up to kV - 1 positions before its first
// element): what a kernel that takes rows of every lead holds for each.
__host__ __device__ inline int64_t window_accesses(int64_t cols, int vec) { return (cols + 2 * vec - 2) / vec; }

// The row's elements among the window positions of packs [r * part, (r + 1) * part) (of `acc`):
// cluster rank r's part of a row at `lead` that ends at window position `end`.
__device__ __forceinline__ float window_part_elements(int r, int64_t part, int64_t acc, int vec, int lead, int end) {
  const int64_t a1 = (r + 1) * part < acc ? (r + 1) * part : acc;
  auto clamp = [&](int64_t q) { return q < lead ? int64_t{lead} : (q > end ? int64_t{end} : q); };
  const int64_t n = clamp(a1 * vec) - clamp(r * part * vec);
  return n > 0 ? static_cast<float>(n) : 0.f;
}

// The 16-byte pack that starts o elements (0 <= o < V) into lo and runs on into hi: elements o to
// V - 1 of lo, then 0 to o - 1 of hi. o is uniform over the caller's block: selects, no branches.
template <typename T>
__device__ __forceinline__ Pack<T, 16> shift_pack(const Pack<T, 16>& lo, const Pack<T, 16>& hi, int o) {
  uint32_t a[4], b[4];
  pack_words<16>(lo.raw, a);
  pack_words<16>(hi.raw, b);
  const uint32_t w[8] = {a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  const int q = o / kPerWord;        // whole words
  const bool half = o % kPerWord;    // then half a word (16-bit types)
  uint32_t s[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    uint32_t v = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (q == c && j + c < 8) v = w[j + c];
    s[j] = v;
  }
  uint32_t r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = half ? __funnelshift_r(s[j], s[j + 1], 16) : s[j];
  return Pack<T, 16>{make_uint4(r[0], r[1], r[2], r[3])};
}

// The lead of the row starting at element `offset` of a tensor whose first element is at x.
template <typename T>
__device__ __forceinline__ int row_lead(const void* x, int64_t offset) {
  constexpr int kV = kVec<T, 16>;
  const int first = static_cast<int>((reinterpret_cast<std::uintptr_t>(x) % 16) / sizeof(T));
  return static_cast<int>((first + offset % kV) % kV);
}

}  // namespace hfnn::kernels::layer_norm
