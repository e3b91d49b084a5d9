// The persistent LSTM variant: the input projection as one GEMM up front, then ONE cooperative
// launch for the whole recurrence (every block resident; no grid barrier: the forward's blocks wait
// on each other's values, the backward's on one readiness word a block).
//
// Forward. Block b owns hidden units [b*u, b*u + u) and keeps the rows of W_hh for their four
// gates (4u x H) on chip for the whole sequence: in registers as floats where the slice fits
// (geometry_reg, below; hidden up to 1,024 on 132 SMs), else in shared memory in the dtype. A step stages h_{t-1}
// (float32, from the history hs, which every block wrote its units of at the step before) in
// batch chunks in shared memory, computes the 4u x B dot products of length H (float32 sums in a
// fixed order: no atomics), adds the projection and the biases, applies the gates and updates c
// (float32, in shared memory), writes h_t into the history's next slot (first: the other blocks
// wait for it), then y, the gates and c_t. The fused forward (geometry_fused) does the same per
// warp: the cell in the lane that holds its four gates' sums, c in that lane's register.
//
// With 4 or more units a block in 16-bit dtypes (geometry_mma) the products run on tensor cores:
// each warp keeps its share of the slice as mma.sync fragments in the dtype and multiplies h_{t-1}
// rounded to the dtype (as cuDNN's LSTM does), float32 sums; where units are even and H a multiple
// of 8, h_t is exchanged in the dtype too (x16): through the dtype's history hd, whose values the backward's
// GEMMs read anyway, two units a 4-byte store, so a stage moves half the bytes.
//
// Backward. Block b owns the same kind of unit slice and keeps W_hh's COLUMNS for it (all 4H rows,
// transposed: u x 4H; in registers or shared memory as the forward). A step computes, for its units, dh = dy_t + dh_rec and the gate
// gradients from the saved gates and c, writes them (dG_t, every block its units' columns), updates
// dc, and then computes dh_rec for its units = sum over the 4H rows r of W_hh[r, unit] dG_t[b, r]
// (all of dG_t, read from L2 once every block has published it). After the loop dh0 = dh_rec,
// dc0 = dc; dW and dx are GEMMs over all steps (lstm_common.cu).
//
// The forward's exchange: the data carries its own readiness, no flags, no fences, no grid barrier.
// Before a launch the exchanged array (the float32 history hs) is set to an empty mark, the bits
// 0xffffffff (a NaN; cudaMemsetAsync with 0xff, a memset node in a captured graph, so every replay
// starts empty, and the memset happens before the kernel in stream order, so no value of an earlier
// launch can be read: a per-launch epoch tag instead would need 8-byte words, a second copy of the
// history beside the one the backward's GEMMs read, and workspace the layout does not have). A
// producer writes each value ONCE with one st.relaxed.gpu.b32 (a value whose bits are the mark is
// written as the canonical NaN 0x7fffffff instead: the mark never appears as data, so NaN inputs
// cannot hang a consumer); a consumer loads the values it needs with ld.relaxed.gpu.b32, all of a
// thread's loads in flight at once, and re-loads only those still empty (at once the first time,
// then after __nanosleep(32)). PTX ISA, Memory Consistency Model: both accesses are strong, at gpu
// scope, to the same aligned 4 bytes, so they are morally strong ("Morally strong operations"):
// their race is defined and the load returns one of the values written, never a mix ("Axioms",
// Coherence and Atomicity: an aligned access no wider than the access size of the instruction is
// single-copy atomic); by coherence it cannot return a value the memset overwrote. Nothing but the
// value itself is communicated, so no release/acquire pattern is needed: a ready step costs one L2
// round trip (before: store, release, poll flags, fence, load). Every step writes slots of its own
// (hs [T+1, B, Hp]; the backward's dG [T, B, 4H] too), so nothing a slow consumer has still to read
// is overwritten. The non-fused forward's stage (stage_polling<true>; hs's rows are padded to a
// multiple of 4 with zeros, lstm_layout.h) reads by cp.async.cg instead: a weak 16-byte read racing
// with the 4-byte strong stores, a mixed-size race
// the PTX model leaves undefined, so what follows rests on the hardware, not on the model. The read
// is served at L2 (the point of coherence for every SM; .cg never allocates in L1), and each aligned
// 4 bytes of it are the mark or the one value written (tests/python/test_lstm.py's dense sweep and
// the C++ tests pass on it). A mark only sends the 16 bytes round again, so the worst a stale read
// costs is a retry; the consumer's products read nothing but these values.
// x16 (geometry_mma) exchanges the same way through hd ([T+1, B, H] in the dtype, H a multiple of
// 8, units a block even): the empty mark is two 0xffff halves (NaN in bf16 and fp16), a producer
// writes units (2k, 2k+1) of a batch row with one st.relaxed.gpu.b32 (two 0xffff halves become two
// 0x7fff), and the stage copies and re-copies 16-byte pieces as above.
// Every block is resident (a cooperative launch checks it), so a consumer spinning on a value never
// waits for a block that is not running, and no block can run more than a step ahead of the slowest
// (it needs that block's values of the step before).
//
// The backward's exchange: one readiness word a block (the v2 protocol), in the backward scratch
// (BwdLayout::flags, each word in its own 128-byte line, zeroed by a memset on the stream before
// the launch: a memset node in a captured graph, so every replay starts from zero). The values a
// step exchanges are many (a block reads ALL of dG_t, B x 4H values: 15,760 at H = 985, B = 4)
// and their producers few (one a block: 124 there), so per-value readiness made every block poll
// 15,760 addresses a step, re-loading the late ones, where the words are 124 (H200, seed size:
// backward 12.65 us a step with values as readiness, 10.20 with flags). Block b, once every thread
// of it has stored its dG_t slice with plain stores (__syncthreads), publishes the count of steps
// it finished with st.release.gpu (thread 0; cumulative over the block's stores ordered before it
// by the barrier: the pattern of cooperative_groups' grid sync); a block about to read dG_t polls
// all words with one warp (ld.relaxed.gpu, 8 a lane in flight), then fence.acq_rel.gpu (with the
// relaxed reads that observed the releases, the PTX memory model's acquire pattern) and
// __syncthreads; then it copies dG_t into shared memory with cp.async (every copy in flight at once,
// one wait: stage_ready), every value one of this step.
// No memset of dG (T x B x 4H floats: 63 MB at the seed size) before the launch any more. Values as
// readiness again, staged as the forward's by cp.async with re-copies of what is still empty (no
// publish, no wait; 2026-11-26, results/lstm_bwd_values_as_readiness-h100.json): 11-106% slower a
// backward step at hidden >= 128, batch >= 4 (seed float32 6.56 -> 8.16 us), -2 to +22% at hidden
// 8-32, faster only at batch 1, hidden 512-1,024 (7-16%), so the words stay.
//
// A grid of one block whose batch fits one stage (small steps, plan()) keeps the whole recurrence
// on chip: the forward writes h_t straight into the staging buffer its next products read, the
// backward dG_t; the global stores (history, gates, c, y) are not read back in the launch. A grid
// of one block in several batch chunks reads its own dG_t back after a __syncthreads: no words.
//
// The block's products: warps take tiles of 4 weight rows x kBt batch rows (kBt 1, 2 or 4 as the
// batch allows) and, where tiles are fewer than warps, a split of the row length; each lane sums
// every 32nd group of 4 elements, the warp reduces its tile's values in one exchange (16 values
// in 16 shuffles rather than 80), and the splits add in order.
#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "kernels/common/mma.cuh"
#include "kernels/lstm/lstm_common.cuh"

namespace hfnn::kernels::lstm::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRt = 4;        // weight rows a warp's tile covers
constexpr int kMaxParts = 8;  // splits of the row length, where tiles are fewer than warps
// Batch rows staged at once: about this many bytes of h (or dG) rows, at least 4 rows.
constexpr int64_t kStageBytes = 32 * 1024;
// Elements a thread loads before it stores any of them when staging: a stage costs about
// ceil(rows * kp / (kThreads * kStageBatch)) L2 round trips. (The loop before stored each element
// before loading the next, one round trip per element a thread: 16 a step at H = 985, B = 4, and
// 8 chunks x 62 = 496 a step in the backward at B = 32, where it took 90 us a step.)
constexpr int kStageBatch = 16;

// Phase timing, a diagnostic compiled in only with -DHFNN_LSTM_PHASES (the CMake option of that
// name; never in the product): thread 0 of every block adds the clock64() cycles of each phase of
// every step, in shared memory (registers in every thread made the forward spill), and writes its
// totals at the end (forward phases: h_{t-1} staged, products, gates; backward: gates, publish,
// wait for the words, dG_t staged, products, sums). persistent_phases() hands them to the C++
// timing test. With several batch chunks a step (bs < B) a chunk's gates (forward) or sums
// (backward) count in the next chunk's stage. The 56 bytes of static shared memory can refuse a
// launch whose dynamic shared memory plan() put within them of the device's limit.
#ifdef HFNN_LSTM_PHASES
constexpr int kPhases = 6, kPhaseBlocks = 1024;
__device__ long long phase_cycles[2][kPhaseBlocks][kPhases];
#define HFNN_PHASE(i)                   \
  if (threadIdx.x == 0) {               \
    const long long now_ = clock64();   \
    phase_acc[i] += now_ - phase_acc[kPhases]; \
    phase_acc[kPhases] = now_;          \
  }
#define HFNN_PHASES_BEGIN                                      \
  __shared__ long long phase_acc[kPhases + 1]; /* + the last mark */ \
  if (threadIdx.x == 0) {                                      \
    for (int i_ = 0; i_ < kPhases; ++i_) phase_acc[i_] = 0;    \
    phase_acc[kPhases] = clock64();                            \
  }
#define HFNN_PHASES_END(bwd)                         \
  if (threadIdx.x == 0 && blockIdx.x < kPhaseBlocks) \
    for (int i_ = 0; i_ < kPhases; ++i_) phase_cycles[bwd][blockIdx.x][i_] = phase_acc[i_];
#else
#define HFNN_PHASE(i)
#define HFNN_PHASES_BEGIN
#define HFNN_PHASES_END(bwd)
#endif

// The forward's exchanged array's empty mark (header comment): every byte 0xff, a NaN no step writes.
constexpr unsigned kEmpty = 0xffffffffu;
constexpr int kEmptyByte = 0xff;

// What a launch's blocks need to know of their work, and where shared memory holds what.
struct Geometry {
  int units = 0;  // hidden units a block owns
  int rows = 0;   // rows of its weight slice: 4 units (forward) or units (backward)
  int kp = 0;     // their length padded to 4: H (forward) or 4H (backward)
  int bs = 0;     // batch rows staged at once
  int parts = 1;  // splits of the row length (with weights in registers: the warps of a team)
  int grid = 0;
  // Weights in registers (reg > 0, below): rows a thread holds, row groups (a power of two <= the
  // warps), and teams of `parts` warps a row group has, each taking every `teams`-th batch tile.
  int reg = 0, groups = 1, teams = 1;
  // The forward with its gate phase in the product warps (geometry_fused; reg 4): a row group is
  // one unit's four gates, a warp holds them over the whole row, and v is two buffers.
  int fuse = 0;
  // The forward's products on tensor cores (geometry_mma, 16-bit dtypes): the slice's rows in `mt`
  // tiles of 16, the row length in `kt` tiles of 16, the staged rows `vld` floats apart.
  int mma = 0, mt = 0, kt = 0, vld = 0;
  int ald = 0;  // acc's rows apart (floats): bs, or geometry_mma's = 8 mod 32 (its stores and the gate phase's loads)
  // geometry_mma's exchange in the dtype (x16): h_t through the dtype's history hd, two units a
  // 4-byte store, staged as 16-bit pairs vld words apart (vld = 4 mod 32); units even, H a multiple of 8.
  int x16 = 0;
  int off_v = 0, off_acc = 0, off_state = 0, off_bias = 0, smem = 0;
};

int64_t align16(int64_t v) { return (v + 15) / 16 * 16; }

// A geometry's shared memory, in order: the weights (w bytes), the staging buffer (v), the partial
// sums (acc), the state, the biases; smem is their total.
void place(Geometry& g, int64_t w, int64_t v, int64_t acc, int64_t state, int64_t bias) {
  g.off_v = static_cast<int>(w);
  g.off_acc = g.off_v + static_cast<int>(v);
  g.off_state = g.off_acc + static_cast<int>(acc);
  g.off_bias = g.off_state + static_cast<int>(state);
  g.smem = g.off_bias + static_cast<int>(bias);
}

int tile_batch(int64_t batch) { return batch == 1 ? 1 : batch == 2 ? 2 : 4; }

// The geometry of `units` units a block; smem is what it needs (above the opt-in limit where it
// cannot run at all).
Geometry geometry(bool backward, const Shape& s, int64_t units, int kbt) {
  Geometry g;
  const int64_t H = s.hidden, B = s.batch, elem = static_cast<int64_t>(dtype_size(s.dtype));
  const int64_t rows = backward ? units : 4 * units;
  const int64_t kp = ((backward ? 4 * H : H) + 3) / 4 * 4;
  const int64_t w_bytes = align16(rows * kp * elem);
  const int64_t state = align16((backward ? 2 : 1) * units * B * 4), bias = backward ? 0 : align16(rows * 4);
  int64_t bs = std::min(B, std::max(std::min<int64_t>(B, 4), kStageBytes / (kp * 4)));
  int64_t parts = 1, smem = 0;
  for (;;) {
    const int64_t tiles = (rows + kRt - 1) / kRt * ((bs + kbt - 1) / kbt);
    parts = std::max<int64_t>(1, std::min<int64_t>({kMaxParts, kWarps / tiles, kp / 4 / 32}));
    smem = w_bytes + align16(bs * kp * 4) + align16(parts * rows * bs * 4) + state + bias;
    if (smem <= s.device.smem_per_block_optin || bs == 1) break;
    bs = (bs + 1) / 2;
  }
  if (smem > s.device.smem_per_block_optin) {
    g.smem = INT32_MAX;
    return g;
  }
  g.units = static_cast<int>(units), g.rows = static_cast<int>(rows), g.kp = static_cast<int>(kp);
  g.bs = static_cast<int>(bs), g.parts = static_cast<int>(parts);
  place(g, w_bytes, align16(bs * kp * 4), align16(parts * rows * bs * 4), state, bias);
  return g;
}

// Weights in registers: a thread keeps kRegFloats of its block's weight slice, kR rows (8, or 4
// where the slice has fewer than 8) x 128 / kR elements of them, as floats, for the whole launch,
// and shared memory holds only what a step stages (h_{t-1} or dG_t), the partial sums and the state.
// The block's 8 warps split into `groups` row groups of kR rows (a power of two, so each warp has
// one); a row group's warps into teams of `parts` warps whose 32 x parts lanes split the row length
// (lane q of a team holds groups of 4 elements q, q + 32 parts, ...: consecutive lanes read
// consecutive 16 bytes of the staged rows), the teams taking every teams-th tile of kBt batch rows.
// A warp's tile is then kR rows x kBt batch rows over its lanes' share of the row: no weight is read
// from shared memory (the shared-memory products read 4 weight rows and kBt staged rows a tile,
// 16 bytes each, for 16 kBt multiply-adds: bound by shared memory's bandwidth, 2.2 us of the seed's
// 5.6 us forward step on an H100). Only where the slice fits (rows x padded length <= 256 x 128)
// and the grid is one block an SM (about 200 registers a thread).
constexpr int kRegFloats = 128;
constexpr int kRegBt = 4;  // batch rows a tile, with weights in registers

int reg_rows(int64_t rows) { return rows >= 8 ? 8 : 4; }

Geometry geometry_reg(bool backward, const Shape& s, int64_t units) {
  Geometry g;
  g.smem = INT32_MAX;
  const int64_t H = s.hidden, B = s.batch;
  const int64_t rows = backward ? units : 4 * units;
  const int64_t kp = ((backward ? 4 * H : H) + 3) / 4 * 4;
  const int kr = reg_rows(rows);
  int64_t groups = 1;
  while (groups * kr < rows) groups *= 2;
  if (groups > kWarps) return g;
  const int64_t warps = kWarps / groups;          // a row group's
  const int64_t reach = 32 * (kRegFloats / kr);   // elements of a row one warp's lanes hold
  int64_t least = 1;                              // warps a team needs to hold a row
  while (least * reach < kp) least *= 2;
  if (least > warps) return g;
  const int64_t state = align16((backward ? 2 : 1) * units * B * 4), bias = backward ? 0 : align16(rows * 4);
  int64_t useful = 1;  // warps a row's groups of 4 keep busy, a group a lane at least
  while (useful * 32 * 4 < kp && useful < warps) useful *= 2;
  for (int64_t bs = B;; bs = (bs + 1) / 2) {
    int64_t teams = 1;  // as many teams as the batch tiles use, their warps holding a row between them
    while (teams * 2 <= warps / least && teams * 2 <= (bs + kRegBt - 1) / kRegBt) teams *= 2;
    // The team's warps, no more than its row keeps busy (the rest of the row group's warps idle:
    // hidden 128, batch 4 split 128 elements over 8 warps, one of them with any, and its step was
    // 1.1-1.25x the shared-memory variant's).
    const int64_t parts = std::min(warps / teams, std::max(least, useful));
    const int64_t smem = align16(bs * kp * 4) + align16(parts * rows * bs * 4) + state + bias;
    if (smem <= s.device.smem_per_block_optin) {
      g.units = static_cast<int>(units), g.rows = static_cast<int>(rows), g.kp = static_cast<int>(kp);
      g.bs = static_cast<int>(bs), g.parts = static_cast<int>(parts);
      g.reg = kr, g.groups = static_cast<int>(groups), g.teams = static_cast<int>(teams);
      place(g, 0, align16(bs * kp * 4), align16(parts * rows * bs * 4), state, bias);
      return g;
    }
    if (bs == 1) return g;
  }
}

// The forward with weights in registers and its gate phase in the product warps: row group j (kR =
// 4 rows) is unit j's four gates (i, f, g, o), one warp's lanes hold them over the whole row (row
// length <= 32 x 32), and each team of one warp takes one tile of 4 batch rows (the batch <= 4 x
// the teams a unit has). After a tile's sums the warp gathers a (batch row, unit)'s four gates in
// one lane by shuffles and runs the cell there: no partial sums through shared memory, no barrier
// between the products and the gates, the cells of the block's units on all its warps at once. The
// staging buffer is two (step s stages into buffer s & 1, so a warp's next stage never overwrites
// what a slower warp still reads: one barrier a step). Only with several blocks (the on-chip path
// writes h_t into the staging buffer).
Geometry geometry_fused(const Shape& s, int64_t units) {
  Geometry g;
  g.smem = INT32_MAX;
  const int64_t H = s.hidden, B = s.batch, rows = 4 * units, kp = (H + 3) / 4 * 4;
  int64_t groups = 1;
  while (groups < units) groups *= 2;
  if (groups > kWarps || kp > 32 * (kRegFloats / 4)) return g;
  const int64_t warps = kWarps / groups, tiles = (B + kRegBt - 1) / kRegBt;
  int64_t teams = 1;
  while (teams < tiles) teams *= 2;
  if (teams > warps) return g;
  const int64_t vbytes = align16(B * kp * 4), state = align16(units * B * 4), bias = align16(rows * 4);
  const int64_t smem = 2 * vbytes + state + bias;
  if (smem > s.device.smem_per_block_optin) return g;
  g.units = static_cast<int>(units), g.rows = static_cast<int>(rows), g.kp = static_cast<int>(kp);
  g.bs = static_cast<int>(B), g.parts = 1, g.reg = 4, g.groups = static_cast<int>(groups);
  g.teams = static_cast<int>(teams), g.fuse = 1;
  place(g, 0, 2 * vbytes, 0, state, bias);
  return g;
}

// The forward with its products on tensor cores (16-bit dtypes): every warp keeps, as mma.sync
// fragments in the dtype, the slice's rows (4u, in mt tiles of 16, zeros past them) over its
// share of the row (k tiles of 16: warp w has tiles w, w + 8, ...; zeros past H) for the whole
// launch, and multiplies them by h_{t-1} (staged as floats, rounded to the dtype as each fragment is
// read: the h cuDNN's LSTM multiplies in these dtypes) with float32 sums. The warps' partial sums
// meet in the gate phase as the other geometries' `parts` (one a warp with k tiles). Rows staged
// vld floats apart (vld = 8 mod 32: a fragment's 8-byte reads hit 32 banks), zeros past kp. At most
// kMmaMt x kMmaKw tiles a warp (hidden up to 1,024 with one block an SM on 132 SMs), several blocks
// (the on-chip path writes h_t into the staging buffer at kp).
constexpr int kMmaMt = 2, kMmaKw = 8, kMmaNt = 4;  // n tiles (8 batch rows) a pass of the products
// Where it runs, measured (H100, bf16, us a forward step against geometry_reg's, C++ timing test;
// bench/README.md, "The forward's products on tensor cores"): with 4 or more units a block and at
// least 128 cells (batch x units) a block: hidden 985-1,024 x batch 16-64 1.1-1.7x faster, 512 x 64
// 1.2x, 512 x 32 equal; 512 x 16 (64 cells) 1.14x slower, 1 or 2 units a block (hidden 32-128,
// batch 64-128) up to 1.35x slower. The exchange in the dtype (x16) wherever units are even and H a
// multiple of 8 in those.
constexpr int64_t kMmaUnits = 4, kMmaCells = 128;

Geometry geometry_mma(const Shape& s, int64_t units) {
  Geometry g;
  g.smem = INT32_MAX;
  if (s.dtype == DType::kFloat32 || s.device.cc_major < 8 || units < kMmaUnits || s.batch * units < kMmaCells)
    return g;
  const int64_t H = s.hidden, B = s.batch, rows = 4 * units, kp = (H + 3) / 4 * 4;
  const int64_t mt = (rows + 15) / 16, kt = (H + 15) / 16;
  // Several blocks: the on-chip path (one block) writes h_t into v at kp, not vld (plan() asks
  // only then; this keeps the geometry from claiming it).
  if (mt > kMmaMt || kt > kWarps * kMmaKw || (H + units - 1) / units < 2) return g;
  // x16: rows of 16-bit pairs, kt * 8 words and up to 4 mod 32; else floats, kt * 16 and up to 8 mod 32.
  const bool x16 = units % 2 == 0 && H % 8 == 0;
  const int64_t row = x16 ? kt * 8 : kt * 16, want = x16 ? 4 : 8;
  const int64_t vld = row + ((want - row) % 32 + 32) % 32, parts = std::min<int64_t>(kWarps, kt);
  const int64_t state = align16(units * B * 4), bias = align16(rows * 4);
  for (int64_t bs = B;; bs = (bs + 1) / 2) {
    const int64_t ald = bs + ((8 - bs) % 32 + 32) % 32;
    const int64_t smem = align16(bs * vld * 4) + align16(parts * rows * ald * 4) + state + bias;
    if (smem <= s.device.smem_per_block_optin) {
      g.units = static_cast<int>(units), g.rows = static_cast<int>(rows), g.kp = static_cast<int>(kp);
      g.bs = static_cast<int>(bs), g.parts = static_cast<int>(parts);
      g.mma = 1, g.mt = static_cast<int>(mt), g.kt = static_cast<int>(kt), g.vld = static_cast<int>(vld);
      g.ald = static_cast<int>(ald), g.x16 = x16 ? 1 : 0;
      place(g, 0, align16(bs * vld * 4), align16(parts * rows * ald * 4), state, bias);
      return g;
    }
    if (bs == 1) return g;
  }
}

// ---- device code ----------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void load4(const T* p, float (&out)[4]) {
  unpack<T, 4 * sizeof(T)>(load_pack<T, 4 * sizeof(T)>(p), out);
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The sums over the warp of N values a lane (N a power of two <= 32), spread over the lanes: each
// halving exchange sends half the values and keeps the other half, then the remaining lanes reduce
// by butterfly. Every lane gets the total of value spread_index(lane); fixed order, so
// bit-identical run to run.
template <int N, int kHalf = N / 2, int kOffset = 16>
__device__ __forceinline__ float warp_sum_spread(float (&v)[N], int lane) {
  if constexpr (kHalf >= 1) {
    const bool upper = (lane & kOffset) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const float send = upper ? v[i] : v[i + kHalf];
      const float keep = upper ? v[i + kHalf] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
    }
    return warp_sum_spread<N, kHalf / 2, kOffset / 2>(v, lane);
  } else {
    float r = v[0];
#pragma unroll
    for (int offset = kOffset; offset >= 1; offset /= 2) r += __shfl_xor_sync(0xffffffffu, r, offset);
    return r;
  }
}

template <int N>
__device__ __forceinline__ int spread_index(int lane) {
  int idx = 0;
#pragma unroll
  for (int half = N / 2, offset = 16; half >= 1; half /= 2, offset /= 2)
    if (lane & offset) idx += half;
  return idx;
}

// acc[part][r][b] = sum over the part's share of k of W[r][k] V[b][k], for r < rows, b < nb.
template <typename T, int kBt>
__device__ __forceinline__ void block_products(const T* __restrict__ w, int rows, const float* __restrict__ v, int nb,
                                               int kp, int parts, float* __restrict__ acc, int bs) {
  constexpr int N = kRt * kBt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int btiles = (nb + kBt - 1) / kBt, tiles = (rows + kRt - 1) / kRt * btiles;
  const int groups = kp / 4, per_part = (groups + parts - 1) / parts;
  for (int task = warp; task < tiles * parts; task += kWarps) {
    const int part = task % parts, tile = task / parts;
    const int r0 = tile / btiles * kRt, b0 = tile % btiles * kBt;
    const T* wr[kRt];
    const float* vr[kBt];
#pragma unroll
    for (int i = 0; i < kRt; ++i) wr[i] = w + static_cast<int64_t>(min(r0 + i, rows - 1)) * kp;
#pragma unroll
    for (int j = 0; j < kBt; ++j) vr[j] = v + static_cast<int64_t>(min(b0 + j, nb - 1)) * kp;
    float s[N];
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = 0.0f;
    const int g_end = min(groups, (part + 1) * per_part);
    for (int g = part * per_part + lane; g < g_end; g += 32) {
      float x[kBt][4];
#pragma unroll
      for (int j = 0; j < kBt; ++j) load4(vr[j] + 4 * g, x[j]);
#pragma unroll
      for (int i = 0; i < kRt; ++i) {
        float wv[4];
        load4(wr[i] + 4 * g, wv);
#pragma unroll
        for (int j = 0; j < kBt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i * kBt + j] = fmaf(wv[e], x[j][e], s[i * kBt + j]);
      }
    }
    const float total = warp_sum_spread<N>(s, lane);
    const int idx = spread_index<N>(lane);
    const int r = r0 + idx / kBt, b = b0 + idx % kBt;
    if ((lane & (32 / N - 1)) == 0 && r < rows && b < nb) acc[(part * rows + r) * bs + b] = total;
  }
}

// The weights in registers (geometry_reg): where thread (warp, lane) of the block sits.
struct RegPlace {
  int rg, team, part, q;  // row group, team, warp within the team, lane within the team
};
__device__ __forceinline__ RegPlace reg_place(const Geometry& geo) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, per_group = kWarps / geo.groups;
  const int wi = warp % per_group;
  return {warp / per_group, wi / geo.parts, wi % geo.parts, (wi % geo.parts) * 32 + lane};
}

// Loads this thread's weights: w[i][4 c + e] = weight(row rg kR + i, element 4 (q + 32 parts c) + e),
// zero past the slice's rows and the row's length (weight() gets only rows < geo.rows, elements < kp).
template <int kR, typename F>
__device__ __forceinline__ void load_reg_weights(float (&w)[kR][kRegFloats / kR], const Geometry& geo, F&& weight) {
  const RegPlace at = reg_place(geo);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int r = at.rg * kR + i;
#pragma unroll
    for (int c = 0; c < kRegFloats / kR / 4; ++c) {
      const int g = at.q + 32 * geo.parts * c;
#pragma unroll
      for (int e = 0; e < 4; ++e) w[i][4 * c + e] = r < geo.rows && 4 * g + e < geo.kp ? weight(r, 4 * g + e) : 0.0f;
    }
  }
}

// One tile of the products with the weights in registers: the sums over this warp's lanes' share of
// the row of its kR rows x batch rows [b0, b0 + kRegBt) (clamped to nb), spread over the lanes
// (warp_sum_spread: lane l holds value spread_index(l) = row x kRegBt + batch row).
template <int kR>
__device__ __forceinline__ float reg_tile(const float (&w)[kR][kRegFloats / kR], const Geometry& geo,
                                          const RegPlace& at, const float* __restrict__ v, int nb, int b0) {
  constexpr int kBt = kRegBt, N = kR * kBt, kC = kRegFloats / kR / 4;
  const int lane = threadIdx.x % 32, kp = geo.kp, groups = kp / 4, stride = 32 * geo.parts;
  const float* vr[kBt];
#pragma unroll
  for (int j = 0; j < kBt; ++j) vr[j] = v + static_cast<int64_t>(min(b0 + j, nb - 1)) * kp;
  float s[N];
#pragma unroll
  for (int i = 0; i < N; ++i) s[i] = 0.0f;
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int g = at.q + stride * c;
    if (g < groups) {
      float x[kBt][4];
#pragma unroll
      for (int j = 0; j < kBt; ++j) {
        const float4 t = *reinterpret_cast<const float4*>(vr[j] + 4 * g);
        x[j][0] = t.x, x[j][1] = t.y, x[j][2] = t.z, x[j][3] = t.w;
      }
#pragma unroll
      for (int i = 0; i < kR; ++i)
#pragma unroll
        for (int j = 0; j < kBt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i * kBt + j] = fmaf(w[i][4 * c + e], x[j][e], s[i * kBt + j]);
    }
  }
  return warp_sum_spread<N>(s, lane);
}

// block_products with the weights in registers: acc[part][r][b] as there, `part` the warp within
// its team (the team's lanes split the row length), rows of every row group, batch rows < nb.
template <int kR>
__device__ __forceinline__ void reg_products(const float (&w)[kR][kRegFloats / kR], const Geometry& geo,
                                             const float* __restrict__ v, int nb, float* __restrict__ acc) {
  constexpr int kBt = kRegBt, N = kR * kBt;
  const RegPlace at = reg_place(geo);
  const int lane = threadIdx.x % 32;
  const int btiles = (nb + kBt - 1) / kBt;
  if (at.team >= geo.teams) return;  // a warp past the row group's teams x parts (geometry_reg)
  for (int bt = at.team; bt < btiles; bt += geo.teams) {
    const int b0 = bt * kBt;
    const float total = reg_tile<kR>(w, geo, at, v, nb, b0);
    const int idx = spread_index<N>(lane);
    const int r = at.rg * kR + idx / kBt, b = b0 + idx % kBt;
    if ((lane & (32 / N - 1)) == 0 && r < geo.rows && b < nb) acc[(at.part * geo.rows + r) * geo.bs + b] = total;
  }
}

// The products on tensor cores (geometry_mma): this warp's fragments of the slice, a[m][i] the
// 16 x 16 tile of rows 16 m.. and columns 16 (warp + 8 i).. (lane l: rows l/4 and l/4 + 8, columns
// 2 (l%4), +1 and +8, +9, the PTX ISA's m16n8k16 A layout), from weight(r, k) as the dtype's bits
// (zero past the slice's rows and H).
template <typename F>
__device__ __forceinline__ void load_mma_weights(uint32_t (&a)[kMmaMt][kMmaKw][4], const Geometry& geo, F&& bits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = lane / 4, k0 = 2 * (lane % 4);
#pragma unroll
  for (int m = 0; m < kMmaMt; ++m)
#pragma unroll
    for (int i = 0; i < kMmaKw; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = 16 * m + r0 + (j & 1) * 8, k = 16 * (warp + kWarps * i) + k0 + (j >> 1) * 8;
        a[m][i][j] = static_cast<uint32_t>(bits(r, k)) | static_cast<uint32_t>(bits(r, k + 1)) << 16;
      }
}

// acc[warp][r][b] = this warp's k tiles of sum_k W[r][k] v[b][k], for r < rows, b < nb (v's rows
// vld apart); warps past geo.parts have no k tile and write nothing. Rows of v past nb are never
// read (the last n tile reads row nb - 1 again and drops its columns).
// kX16: v holds 16-bit pairs (geometry_mma's x16), a fragment register each, no rounding.
template <typename T, bool kX16>
__device__ __forceinline__ void mma_products(const uint32_t (&a)[kMmaMt][kMmaKw][4], const Geometry& geo,
                                             const float* __restrict__ v, int nb, float* __restrict__ acc) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = lane / 4, k0 = 2 * (lane % 4);
  if (warp >= geo.parts) return;
  const int rows = geo.rows, vld = geo.vld, mt = geo.mt, kt = geo.kt;
  for (int n0 = 0; n0 < nb; n0 += 8 * kMmaNt) {
    float c[kMmaMt][kMmaNt][4];
#pragma unroll
    for (int m = 0; m < kMmaMt; ++m)
#pragma unroll
      for (int n = 0; n < kMmaNt; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) c[m][n][j] = 0.0f;
    const float* vr[kMmaNt];
#pragma unroll
    for (int n = 0; n < kMmaNt; ++n) vr[n] = v + min(n0 + 8 * n + r0, nb - 1) * vld + (kX16 ? k0 / 2 : k0);
#pragma unroll
    for (int i = 0; i < kMmaKw; ++i) {
      const int kk = warp + kWarps * i;
      if (kk >= kt) break;
#pragma unroll
      for (int n = 0; n < kMmaNt; ++n) {
        if (n0 + 8 * n >= nb) break;
        uint32_t b0, b1;
        if constexpr (kX16) {
          b0 = __float_as_uint(vr[n][8 * kk]), b1 = __float_as_uint(vr[n][8 * kk + 4]);
        } else {
          const float2 lo = *reinterpret_cast<const float2*>(vr[n] + 16 * kk);
          const float2 hi = *reinterpret_cast<const float2*>(vr[n] + 16 * kk + 8);
          b0 = pack2<T>(lo.x, lo.y), b1 = pack2<T>(hi.x, hi.y);
        }
#pragma unroll
        for (int m = 0; m < kMmaMt; ++m)
          if (m < mt) mma<T>(c[m][n], a[m][i], b0, b1);
      }
    }
#pragma unroll
    for (int m = 0; m < kMmaMt; ++m)
#pragma unroll
      for (int n = 0; n < kMmaNt; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = 16 * m + r0 + (j >> 1) * 8, b = n0 + 8 * n + k0 + (j & 1);
          if (m < mt && r < rows && b < nb) acc[(warp * rows + r) * geo.ald + b] = c[m][n][j];
        }
  }
}

// A value another thread of the launch reads while the launch runs (header comment): one strong
// 4-byte store, the empty mark replaced by the canonical NaN.
__device__ __forceinline__ void store_exchange(float* p, float value) {
  unsigned bits = __float_as_uint(value);
  if (bits == kEmpty) bits = 0x7fffffffu;
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(bits) : "memory");
}

// Two adjacent values of the dtype's history as one such store (x16): lo at p, hi at p + 1, the
// empty mark (two 0xffff NaNs) replaced by two canonical NaNs.
template <typename T>
__device__ __forceinline__ void store_exchange_pair(T* p, float lo, float hi) {
  const T v[2] = {from_float<T>(lo), from_float<T>(hi)};
  unsigned bits;
  memcpy(&bits, v, 4);
  if (bits == kEmpty) bits = 0x7fff7fffu;
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(bits) : "memory");
}

__device__ __forceinline__ unsigned load_exchange(const float* p) {
  unsigned bits;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(bits) : "l"(p));
  return bits;
}

// Stages rows [b0, b0 + nb) of `src` ([*, len] float, written by other threads of this launch with
// store_exchange) into v [nb, kp], zero past len, once every value is there. Each thread issues
// kStageBatch loads before it looks at any, then re-loads only the empty ones: one L2 round trip
// where the values are ready.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// kStrided: v's rows vld floats apart (geometry_mma's), else packed (vld unused; a strided store in
// the register loop below made two instances spill 8 bytes).
template <bool kCopy, bool kStrided = false>
__device__ __forceinline__ void stage_polling(float* __restrict__ v, const float* src, int b0, int nb, int len,
                                              int kp, int vld = 0) {
  const int n = nb * kp;
  if (!kStrided) vld = kp;
  const float* base = src + static_cast<int64_t>(b0) * len;
  // kCopy, rows of a multiple of 4 (hs's, padded with zeros since 2026-11-26: (985, 32) float32
  // 30.0 -> 19.8 us a forward step, H100) from a 16-byte aligned source: every 16 bytes of
  // the stage in flight at once by cp.async (at L2, as __ldcg: no stale L1 line), straight into
  // shared memory, then each thread looks at what it copied and copies again only the 16 bytes that
  // still hold an empty mark, all of them in flight again. A value is one 4-byte store, so 16 bytes
  // read mid-step hold some values and some marks, never a torn value. One L2 round trip where the
  // values are ready, whatever the batch; the loop below keeps 16 values a thread in flight, a
  // round trip for every 4,096 values (hidden 512, batch 32: 4 a step; 1,024, 32: 8). H100, C++
  // timing test, us a forward step (bench/results/lstm_fwd_copy_stage-h100.json, medians of two
  // alternated runs): 12.55 -> 8.87 (512, 32, float32), 29.68 -> 20.01 (1,024, 32), 24.85 -> 15.05
  // (1,024, 32, bf16). The fused forward (kCopy false) keeps the loop below: there the copy took
  // hidden 1,024, batch 4 from 3.48 to 5.09 us a step and hidden 128, batch 32 from 2.27 to 3.84
  // (though 128, 1 went from 1.62 to 1.28), not understood yet.
  if (kCopy && len == kp && ((reinterpret_cast<uintptr_t>(base) | reinterpret_cast<uintptr_t>(v)) & 15) == 0) {
    const int n4 = n / 4, row4 = kp / 4, vld4 = vld / 4, tid = static_cast<int>(threadIdx.x);
    const float4* from = reinterpret_cast<const float4*>(base);
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(v));
    // f(i, j) for this thread's 16 bytes i of the rows, j their place in v (rows vld apart): the
    // row and column stepped along (a division a 16 bytes made every polling round cost a few
    // thousand cycles at hidden 512-1,024, batch 32).
    const int dr = kThreads / row4, dc = kThreads - dr * row4;
    auto each = [&](auto&& f) {
      int r = tid / row4, c = tid - r * row4;
#pragma unroll 1
      for (int i = tid; i < n4; i += kThreads) {
        f(i, r * vld4 + c);
        r += dr, c += dc;
        if (c >= row4) c -= row4, ++r;
      }
    };
    each([&](int i, int j) { cp_async16(dst + 16u * j, from + i); });
    for (int round = 0;; ++round) {
      cp_async_wait_all();
      if (round > 1) __nanosleep(32);
      bool again = false;
      each([&](int i, int j) {
        const uint4 x = reinterpret_cast<const uint4*>(v)[j];
        if (x.x == kEmpty || x.y == kEmpty || x.z == kEmpty || x.w == kEmpty) {
          cp_async16(dst + 16u * j, from + i);
          again = true;
        }
      });
      if (!again) return;
    }
  }
  for (int i0 = 0; i0 < n; i0 += kThreads * kStageBatch) {
    unsigned x[kStageBatch];
    auto at = [&](int j, const float*& p) {
      const int idx = i0 + j * kThreads + static_cast<int>(threadIdx.x);
      const int bb = idx / kp, k = idx - bb * kp;
      p = base + static_cast<int64_t>(bb) * len + k;
      return idx < n && k < len;
    };
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      const float* p;
      x[j] = at(j, p) ? load_exchange(p) : 0u;
    }
    for (int round = 0;; ++round) {
      bool empty = false;
#pragma unroll
      for (int j = 0; j < kStageBatch; ++j) empty = empty || x[j] == kEmpty;
      if (!empty) break;
      if (round > 0) __nanosleep(32);
#pragma unroll
      for (int j = 0; j < kStageBatch; ++j) {
        const float* p;
        if (at(j, p) && x[j] == kEmpty) x[j] = load_exchange(p);
      }
    }
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      const int idx = i0 + j * kThreads + static_cast<int>(threadIdx.x);
      if (idx < n) v[kStrided ? idx / kp * vld + idx % kp : idx] = __uint_as_float(x[j]);
    }
  }
}

// The backward's stage of values already known to be there (after wait_all or, one block, a
// __syncthreads): rows of `len` floats, a multiple of 4 (dG_t's 4H), staged unpadded, from a
// 16-byte aligned src, 16 bytes a cp.async straight into shared memory (no registers on the way):
// every copy of the stage in flight at once, then one wait. Through registers (16 loads a thread in
// flight, the loop before) the seed's B x 4H = 15,760 values took 4 L2 round trips a step (H100:
// backward 10.3 -> 7.5 us a step). cp.async.cg reads at L2 (not L1), as __ldcg.
__device__ __forceinline__ void stage_ready(float* __restrict__ v, const float* src, int b0, int nb, int len) {
  const int n4 = nb * len / 4;
  const float4* base = reinterpret_cast<const float4*>(src + static_cast<int64_t>(b0) * len);
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(v));
  for (int i = static_cast<int>(threadIdx.x); i < n4; i += kThreads) cp_async16(dst + 16u * i, base + i);
  cp_async_wait_all();
}

// The backward's readiness words (header comment): word b (kFlagWords apart) holds the count of
// steps block b finished; zero at the launch's start. publish() after a __syncthreads that follows
// every thread's stores of the step.
__device__ __forceinline__ void publish(unsigned* flags, unsigned done) {
  if (threadIdx.x == 0) {
    unsigned* word = flags + static_cast<int64_t>(blockIdx.x) * kFlagWords;
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(word), "r"(done) : "memory");
  }
}

__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Returns once every block of the grid published at least `done`; what those blocks stored before
// publishing is then visible to every thread of this one.
__device__ __forceinline__ void wait_all(const unsigned* flags, unsigned done) {
  if (threadIdx.x < 32) {
    const int grid = static_cast<int>(gridDim.x), lane = static_cast<int>(threadIdx.x);
    constexpr int kPerRound = 8;  // words a lane loads before comparing any
    for (int b0 = lane; b0 < grid; b0 += 32 * kPerRound) {
      for (;;) {
        unsigned seen[kPerRound];
#pragma unroll
        for (int j = 0; j < kPerRound; ++j) {
          const int b = b0 + 32 * j;
          seen[j] = b < grid ? load_relaxed(flags + static_cast<int64_t>(b) * kFlagWords) : done;
        }
        bool ready = true;
#pragma unroll
        for (int j = 0; j < kPerRound; ++j) ready = ready && seen[j] >= done;
        if (ready) break;
      }
    }
    __syncwarp();
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
}

template <typename T>
struct FwdArgs {
  int64_t steps;
  int batch, hidden;
  bool reverse;
  Geometry geo;
  const T *w_hh, *b_ih, *b_hh, *h0, *c0;
  T *y, *h_n, *c_n;
  float *gates, *cs, *hs;  // hs [T+1, B, history_ld(H)], the pads zero (lstm_layout.h)
  T* hd;  // null where hs is the dtype's history (float32, H a multiple of 4)
};

// Whether a launch keeps its recurrence on chip (header comment): one block, one stage a step.
__host__ __device__ inline bool on_chip(int grid, int bs, int64_t batch) { return grid == 1 && bs >= batch; }

// kR > 0: the weights in registers (geometry_reg), kR rows a thread, one block an SM; 0: in shared
// memory, at most 128 registers a thread (2 blocks an SM, as plan()'s last geometries take).
// kFuse: geometry_fused's (kR 4), an instance of its own (in one with the other paths it spilled).
// kMma: geometry_mma's (16-bit dtypes; kR 0, one block an SM).
template <typename T, int kBt, int kR, bool kFuse = false, bool kMma = false>
__global__ void __launch_bounds__(kThreads, kR > 0 || kMma ? 1 : 2) persistent_fwd_kernel(const FwdArgs<T> a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Geometry& geo = a.geo;
  const int u = geo.units, rows = geo.rows, kp = geo.kp, bs = geo.bs, parts = geo.parts;
  const int ald = kMma ? geo.ald : bs;  // acc's rows apart
  const int H = a.hidden, B = a.batch, tid = threadIdx.x;
  const int unit0 = static_cast<int>(blockIdx.x) * u;
  const int64_t BH = static_cast<int64_t>(B) * H, G = 4 * static_cast<int64_t>(H);
  // hs's rows (kp: H rounded up to 4), and a history slot of them.
  const int64_t BHp = static_cast<int64_t>(B) * kp;
  T* w = reinterpret_cast<T*>(smem);
  float* v = reinterpret_cast<float*>(smem + geo.off_v);
  float* acc = reinterpret_cast<float*>(smem + geo.off_acc);
  float* c_state = reinterpret_cast<float*>(smem + geo.off_state);  // [B][u]
  float* bias = reinterpret_cast<float*>(smem + geo.off_bias);       // [4u]
  const bool chip = on_chip(static_cast<int>(gridDim.x), bs, B);

  // Row r = gate * u + j of the slice is W_hh's row gate * H + unit0 + j (zeros past H).
  float wr[kR > 0 ? kR : 1][kR > 0 ? kRegFloats / kR : 1];
  uint32_t wa[kMma ? kMmaMt : 1][kMma ? kMmaKw : 1][4];
  if constexpr (kMma) {
    load_mma_weights(wa, geo, [&](int r, int k) -> uint16_t {
      const int gate = r / u, unit = unit0 + r - gate * u;
      if (r >= rows || unit >= H || k >= H) return 0;
      const T w = a.w_hh[static_cast<int64_t>(gate * H + unit) * H + k];
      uint16_t bits;
      memcpy(&bits, &w, 2);
      return bits;
    });
    // The staged rows' columns past H (kp floats or H / 2 pairs; to the k tiles' end and the pad)
    // are never staged: zeros.
    const int staged = geo.x16 ? H / 2 : kp;
    for (int idx = tid; idx < bs * geo.vld; idx += kThreads)
      if (idx % geo.vld >= staged) v[idx] = 0.0f;
  } else if constexpr (kR > 0) {
    load_reg_weights<kR>(wr, geo, [&](int r, int k) {  // fused: row r is unit r / 4's gate r % 4
      const int gate = kFuse ? r % 4 : r / u, unit = unit0 + (kFuse ? r / 4 : r - gate * u);
      return unit < H && k < H ? to_float(a.w_hh[static_cast<int64_t>(gate * H + unit) * H + k]) : 0.0f;
    });
  } else {
    for (int idx = tid; idx < rows * kp; idx += kThreads) {
      const int r = idx / kp, k = idx - r * kp, gate = r / u, unit = unit0 + r - gate * u;
      w[idx] = unit < H && k < H ? a.w_hh[static_cast<int64_t>(gate * H + unit) * H + k] : from_float<T>(0.0f);
    }
  }
  for (int r = tid; r < rows; r += kThreads) {
    const int gate = r / u, unit = unit0 + r - gate * u;
    bias[r] = unit < H ? load_or_zero(a.b_ih, gate * H + unit) + load_or_zero(a.b_hh, gate * H + unit) : 0.0f;
  }
  const int64_t first = initial_slot(a.steps, a.reverse);
  // A history value into hs: one store the other blocks wait for, or a plain one on chip. (The
  // rows' pads are zeros from before the launch: mark_empty.)
  const bool x16 = kMma && geo.x16;  // h through hd, in pairs (below), not hs
  auto put_history = [&](int64_t slot, int b, int unit, float h) {
    if (x16) return;
    float* p = a.hs + slot * BHp + static_cast<int64_t>(b) * kp + unit;
    if (chip)
      *p = h;
    else
      store_exchange(p, h);
  };
  for (int idx = tid; idx < B * u; idx += kThreads) {
    const int b = idx / u, unit = unit0 + idx - b * u;
    if (unit >= H) continue;
    const int64_t e = static_cast<int64_t>(b) * H + unit;
    const float h0 = load_or_zero(a.h0, e);
    c_state[idx] = load_or_zero(a.c0, e);
    put_history(first, b, unit, h0);  // the other blocks' first stage waits for it
    if (x16) {  // unit and unit + 1 in one store the other blocks wait for (units even, H too)
      if ((unit & 1) == 0) store_exchange_pair(a.hd + first * BH + e, h0, load_or_zero(a.h0, e + 1));
    } else if (a.hd) {
      a.hd[first * BH + e] = a.h0 ? a.h0[e] : from_float<T>(0.0f);
    }
  }
  if (chip)  // h0 into the staging buffer, zeros past H (never written again)
    for (int idx = tid; idx < B * kp; idx += kThreads) {
      const int b = idx / kp, k = idx - b * kp;
      v[idx] = k < H ? load_or_zero(a.h0, static_cast<int64_t>(b) * H + k) : 0.0f;
    }
  // Where every (batch row, unit) of the block is one thread's (one batch chunk, B u <= threads),
  // the thread loads the projection of step s + 1 right after its gate phase of step s: the wait and
  // the products of step s + 1 hide that load's round trip (the same thread overwrites those
  // elements only in its gate phase of step s + 1, after reading them).
  const bool own_one = bs >= B && B * u <= kThreads;
  const int my_b = tid / u, my_j = tid - my_b * u;
  const bool mine = own_one && tid < B * u && unit0 + my_j < H;
  // A thread that owns one (batch row, unit) has its offsets computed once (the phase is one warp's
  // serial chain at the seed size).
  const int64_t my_e = static_cast<int64_t>(my_b) * H + unit0 + my_j;
  const int64_t my_row = static_cast<int64_t>(my_b) * G + unit0 + my_j;
  float proj[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // The projection of step s for the (batch row b, unit) at row = b G + unit.
  auto load_proj = [&](int64_t s, int64_t row, float (&out)[4]) {
    const float* g = a.gates + time_of(s, a.steps, a.reverse) * B * G + row;
#pragma unroll
    for (int gate = 0; gate < 4; ++gate) out[gate] = g[gate * H];
  };
  if (!kFuse && mine) load_proj(0, my_row, proj);
  __syncthreads();  // the weights, biases (and on chip h0) in shared memory before the first products
  // A cell's outputs: h_t first, into the history's next slot (the other blocks' next stage waits
  // for it; on chip into the staging buffer as well), then what nothing in this launch reads back:
  // the gates at g (over the projection), c_t, y, the dtype's history and, at the last step, h_n, c_n.
  auto put_cell = [&](const Cell& c, int b, int unit, int64_t e, float* g, int64_t t, int64_t out_slot, bool last) {
    if (chip) v[b * kp + unit] = c.h;
    put_history(out_slot, b, unit, c.h);
    g[0] = c.i, g[H] = c.f, g[2 * H] = c.g, g[3 * H] = c.o;
    const T h = from_float<T>(c.h);
    a.cs[t * BH + e] = c.c;
    if (a.hd && !x16) a.hd[out_slot * BH + e] = h;  // x16: in pairs, after the cell
    a.y[t * BH + e] = h;
    if (last) {
      a.h_n[e] = h;
      a.c_n[e] = from_float<T>(c.c);
    }
  };

  // x16: h of the cell at e (unit j of the block, a cell only where `cell`) and the next lane's, the
  // next unit (units even), as one store, before the cell's other stores (after them, the wait grew
  // by 1-2 us a step at hidden 512, batch 16). Every lane of the warp calls it (the shuffle).
  auto put_pair = [&](int64_t slot, float h, bool cell, int j, int64_t e) {
    if (!x16) return;
    const float next_h = __shfl_down_sync(0xffffffffu, h, 1);
    if (cell && (j & 1) == 0) store_exchange_pair(a.hd + slot * BH + e, h, next_h);
  };

  if constexpr (kFuse) {  // geometry_fused: the gate phase in the product warps (chip is false)
    const RegPlace at = reg_place(geo);
    const int lane = tid % 32, j = at.rg, unit = unit0 + j, b = at.team * kRegBt + lane / 2;
    // The cell lanes: 0, 2, 4, 6 hold gate i of the tile's batch rows 0-3 (spread_index<16>(l) =
    // l / 2 = gate x 4 + batch row); f, g and o are 8, 16 and 24 lanes on.
    const bool cell = at.team < geo.teams && lane < 2 * kRegBt && (lane & 1) == 0 && j < u && unit < H && b < B;
    const int64_t e = static_cast<int64_t>(b) * H + unit, row = static_cast<int64_t>(b) * G + unit;
    float fproj[4] = {0.0f, 0.0f, 0.0f, 0.0f}, fbias[4] = {0.0f, 0.0f, 0.0f, 0.0f}, fc = 0.0f;
    if (cell) {
#pragma unroll
      for (int gate = 0; gate < 4; ++gate) fbias[gate] = bias[gate * u + j];
      fc = c_state[b * u + j];
      load_proj(0, row, fproj);
    }
    const int vstride = B * kp;  // the second buffer
    HFNN_PHASES_BEGIN
    for (int64_t s = 0; s < a.steps; ++s) {
      const int64_t t = time_of(s, a.steps, a.reverse), out_slot = write_slot(t, a.reverse);
      float* const vs = v + (s & 1) * vstride;
      stage_polling<false>(vs, a.hs + read_slot(t, a.reverse) * BHp, 0, B, kp, kp);
      __syncthreads();  // vs filled; every warp past its products of step s - 1 (the other buffer)
      HFNN_PHASE(0)
      if (at.team < geo.teams) {
        const float total = reg_tile<4>(wr, geo, at, vs, B, at.team * kRegBt);
        const float pf = __shfl_sync(0xffffffffu, total, lane + 8);
        const float pg = __shfl_sync(0xffffffffu, total, lane + 16);
        const float po = __shfl_sync(0xffffffffu, total, lane + 24);
        HFNN_PHASE(1)
        if (cell) {
          const Cell c = cell_forward(total + fproj[0] + fbias[0], pf + fproj[1] + fbias[1],
                                      pg + fproj[2] + fbias[2], po + fproj[3] + fbias[3], fc);
          fc = c.c;
          put_cell(c, b, unit, e, a.gates + t * B * G + row, t, out_slot, s + 1 == a.steps);
          if (s + 1 < a.steps) load_proj(s + 1, row, fproj);
        }
      }
      HFNN_PHASE(2)
    }
    HFNN_PHASES_END(0)
  } else {  // every other geometry
    HFNN_PHASES_BEGIN
    for (int64_t s = 0; s < a.steps; ++s) {
      const int64_t t = time_of(s, a.steps, a.reverse), out_slot = write_slot(t, a.reverse);
      // x16: rows of H / 2 pairs of the dtype's history (geometry_mma); else hs's floats.
      const float* h_prev = x16 ? reinterpret_cast<const float*>(a.hd + read_slot(t, a.reverse) * BH)
                                : a.hs + read_slot(t, a.reverse) * BHp;
      const int hlen = x16 ? H / 2 : kp;
      for (int b0 = 0; b0 < B; b0 += bs) {
        const int nb = min(bs, B - b0);
        if (!chip) {
          // (v's last readers, the products of the chunk before, finished before the barrier after
          // them; acc's, the gate phase before, finish before the barrier below.)
          // waits for every block's h_{t-1} of the chunk
          if constexpr (kMma)
            stage_polling<true, true>(v, h_prev, b0, nb, hlen, hlen, geo.vld);
          else
            stage_polling<true>(v, h_prev, b0, nb, hlen, hlen);
          __syncthreads();                          // v filled by every thread before any warp's products
        }
        HFNN_PHASE(0)
        if constexpr (kMma) {
          if (x16)
            mma_products<T, true>(wa, geo, v, nb, acc);
          else
            mma_products<T, false>(wa, geo, v, nb, acc);
        } else if constexpr (kR > 0)
          reg_products<kR>(wr, geo, v, nb, acc);
        else
          block_products<T, kBt>(w, rows, v, nb, kp, parts, acc, bs);
        __syncthreads();  // every warp's acc before the gate phase sums it; v read (on chip: free for h_t)
        HFNN_PHASE(1)
        if ((kR > 0 || kMma) && own_one) {  // one chunk, this thread's (batch row, unit) alone (kR 0: 128 registers)
          Cell c{};
          if (mine) {
            float pre[4];
#pragma unroll
            for (int gate = 0; gate < 4; ++gate) {
              float sum = 0.0f;
              for (int p = 0; p < parts; ++p) sum += acc[(p * rows + gate * u + my_j) * ald + my_b];
              pre[gate] = sum + proj[gate] + bias[gate * u + my_j];
            }
            c = cell_forward(pre[0], pre[1], pre[2], pre[3], c_state[tid]);
            c_state[tid] = c.c;
          }
          put_pair(out_slot, c.h, mine, my_j, my_e);
          if (mine) put_cell(c, my_b, unit0 + my_j, my_e, a.gates + t * B * G + my_row, t, out_slot, s + 1 == a.steps);
        } else {
          // Every thread through the same rounds (x16's shuffle pairs lanes idx and idx + 1).
          for (int base = 0; base < nb * u; base += kThreads) {
            const int idx = base + tid, bb = idx / u, j = idx - bb * u, unit = unit0 + j, b = b0 + bb;
            const bool cell = idx < nb * u && unit < H;
            float* g = a.gates + (t * B + b) * G + unit;  // the projection in, the gates out
            Cell c{};
            if (cell) {
              float pre[4];
#pragma unroll
              for (int gate = 0; gate < 4; ++gate) {
                float sum = 0.0f;
                for (int p = 0; p < parts; ++p) sum += acc[(p * rows + gate * u + j) * ald + bb];
                pre[gate] = sum + (own_one ? proj[gate] : g[gate * H]) + bias[gate * u + j];
              }
              const int si = b * u + j;
              c = cell_forward(pre[0], pre[1], pre[2], pre[3], c_state[si]);
              c_state[si] = c.c;
            }
            put_pair(out_slot, c.h, cell, j, static_cast<int64_t>(b) * H + unit);
            if (!cell) continue;
            put_cell(c, b, unit, static_cast<int64_t>(b) * H + unit, g, t, out_slot, s + 1 == a.steps);
            if (s + 1 < a.steps && !own_one) {  // the next step's projection, from HBM into L2 while this step finishes
              const float* next = a.gates + (time_of(s + 1, a.steps, a.reverse) * B + b) * G + unit;
#pragma unroll
              for (int gate = 0; gate < 4; ++gate) prefetch_l2(next + gate * H);
            }
          }
        }
      }
      if (mine && s + 1 < a.steps) load_proj(s + 1, my_row, proj);
      // On chip: every thread's h_t in v before the next products read it. Otherwise the next
      // stage's own waiting orders it: no barrier.
      if (chip) __syncthreads();
      HFNN_PHASE(2)
    }
    HFNN_PHASES_END(0)
  }
}

template <typename T>
struct BwdArgs {
  int64_t steps;
  int batch, hidden;
  bool reverse;
  Geometry geo;
  const T *w_hh, *dy, *dh_n, *dc_n, *c0;
  const float *gates, *cs;
  float* dg;
  T* dg16;  // null for float32 (dg is the dtype's)
  T *dh0, *dc0;
  unsigned* flags;  // the readiness words, zero at the start (grids of several blocks)
};

// At least 2 blocks an SM: up to 128 registers a thread. Without the bound ptxas (CUDA 13.0,
// sm_90) chose 64 or 80 registers for 7 of the 9 instances and spilled 20-80 bytes (v3: 3 of them,
// 56 bytes); with it none spills (95-128 registers). The plan is one block an SM wherever that
// fits (plan()).
// kR as the forward's (with weights in registers one block an SM: up to 255 registers).
template <typename T, int kBt, int kR>
__global__ void __launch_bounds__(kThreads, kR > 0 ? 1 : 2) persistent_bwd_kernel(const BwdArgs<T> a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Geometry& geo = a.geo;
  const int u = geo.units, kp = geo.kp, bs = geo.bs, parts = geo.parts;
  const int H = a.hidden, B = a.batch, tid = threadIdx.x;
  const int unit0 = static_cast<int>(blockIdx.x) * u;
  const int64_t BH = static_cast<int64_t>(B) * H, G = 4 * static_cast<int64_t>(H);
  T* w = reinterpret_cast<T*>(smem);
  float* v = reinterpret_cast<float*>(smem + geo.off_v);
  float* acc = reinterpret_cast<float*>(smem + geo.off_acc);
  float* dh_rec = reinterpret_cast<float*>(smem + geo.off_state);  // [B][u]
  float* dc = dh_rec + B * u;                                        // [B][u]

  // Row j of the slice is W_hh's column unit0 + j over all 4H rows (zeros past them); consecutive
  // threads read consecutive columns of a row.
  float wr[kR > 0 ? kR : 1][kR > 0 ? kRegFloats / kR : 1];
  if constexpr (kR > 0) {
    load_reg_weights<kR>(wr, geo, [&](int j, int r) {
      const int unit = unit0 + j;
      return unit < H && r < G ? to_float(a.w_hh[static_cast<int64_t>(r) * H + unit]) : 0.0f;
    });
  } else {
    for (int idx = tid; idx < u * kp; idx += kThreads) {
      const int r = idx / u, j = idx - r * u, unit = unit0 + j;
      w[j * kp + r] = unit < H && r < G ? a.w_hh[static_cast<int64_t>(r) * H + unit] : from_float<T>(0.0f);
    }
  }
  for (int idx = tid; idx < B * u; idx += kThreads) {
    const int b = idx / u, unit = unit0 + idx - b * u;
    const int64_t e = static_cast<int64_t>(b) * H + unit;
    dh_rec[idx] = unit < H ? load_or_zero(a.dh_n, e) : 0.0f;
    dc[idx] = unit < H ? load_or_zero(a.dc_n, e) : 0.0f;
  }
  const bool chip = on_chip(static_cast<int>(gridDim.x), bs, B);
  if (chip)  // the staging buffer's padding past 4H stays zero; the gate phase writes the rest
    for (int idx = tid; idx < B * kp; idx += kThreads) v[idx] = 0.0f;
  __syncthreads();  // the weights and state in shared memory before the first gate phase

  const bool lone = gridDim.x == 1;  // its own dG_t back after a __syncthreads: no words
  // Where every (batch row, unit) of the block is one thread's, the thread loads the cell's inputs
  // of its next step (saved gates, c_t, c_{t-1}, dy_t) right after publishing this step's dG: their
  // L2 round trip overlaps the wait and the products instead of starting the next step.
  const bool own_one = B * u <= kThreads;
  const int my_b = tid / u, my_j = tid - my_b * u;
  const bool mine = own_one && tid < B * u && unit0 + my_j < H;
  float in_g[4] = {0.0f, 0.0f, 0.0f, 0.0f}, in_c = 0.0f, in_cp = 0.0f, in_dy = 0.0f;
  const int64_t my_e = static_cast<int64_t>(my_b) * H + unit0 + my_j;
  const int64_t my_row = static_cast<int64_t>(my_b) * G + unit0 + my_j;
  auto load_cell = [&](int64_t s) {
    const int64_t t = time_of(s, a.steps, a.reverse), t_prev = s > 0 ? time_of(s - 1, a.steps, a.reverse) : -1;
    const float* g = a.gates + t * B * G + my_row;
#pragma unroll
    for (int gate = 0; gate < 4; ++gate) in_g[gate] = g[gate * H];
    in_c = a.cs[t * BH + my_e];
    in_cp = t_prev >= 0 ? a.cs[t_prev * BH + my_e] : load_or_zero(a.c0, my_e);
    in_dy = load_or_zero(a.dy, t * BH + my_e);
  };
  if (mine) load_cell(a.steps - 1);
  // With one batch chunk as well, the thread's dh_rec and dc stay in registers, and its gate phase
  // and sums take no index arithmetic (the gate phase is one warp's serial chain at the seed size).
  const bool one = own_one && bs >= B;
  float my_dh = 0.0f, my_dc = 0.0f;
  if (mine) my_dh = dh_rec[tid], my_dc = dc[tid];
  // A cell's gate gradients out: into the staging buffer first on chip (the products' chain), then
  // dG (and its 16-bit copy) at `row`, column `unit`.
  auto put_dg = [&](const CellGrad& d, int b, int unit, int64_t row) {
    if (chip) {
      float* o = v + b * kp + unit;
      o[0] = d.di, o[H] = d.df, o[2 * H] = d.dg, o[3 * H] = d.dout;
    }
    float* out = a.dg + row;
    out[0] = d.di, out[H] = d.df, out[2 * H] = d.dg, out[3 * H] = d.dout;
    if (a.dg16) {
      T* o16 = a.dg16 + row;
      o16[0] = from_float<T>(d.di), o16[H] = from_float<T>(d.df), o16[2 * H] = from_float<T>(d.dg);
      o16[3 * H] = from_float<T>(d.dout);
    }
  };

  HFNN_PHASES_BEGIN
  for (int64_t s = a.steps - 1; s >= 0; --s) {
    const int64_t t = time_of(s, a.steps, a.reverse);
    const int64_t t_prev = s > 0 ? time_of(s - 1, a.steps, a.reverse) : -1;
    if (one) {
      if (mine) {
        const CellGrad d = cell_backward(in_g[0], in_g[1], in_g[2], in_g[3], in_c, in_cp, my_dh + in_dy, my_dc);
        my_dc = d.dc_prev;
        put_dg(d, my_b, unit0 + my_j, t * B * G + my_row);
        if (s == 0) a.dc0[my_e] = from_float<T>(d.dc_prev);
      }
    } else {
    for (int idx = tid; idx < B * u; idx += kThreads) {
      const int b = idx / u, unit = unit0 + idx - b * u;
      if (unit >= H) continue;
      const int64_t e = static_cast<int64_t>(b) * H + unit, row = (t * B + b) * G + unit;
      CellGrad d;
      if (own_one) {
        d = cell_backward(in_g[0], in_g[1], in_g[2], in_g[3], in_c, in_cp, dh_rec[idx] + in_dy, dc[idx]);
      } else {
        const float* g = a.gates + row;
        const float c_prev = t_prev >= 0 ? a.cs[t_prev * BH + e] : load_or_zero(a.c0, e);
        const float dh = dh_rec[idx] + load_or_zero(a.dy, t * BH + e);
        d = cell_backward(g[0], g[H], g[2 * H], g[3 * H], a.cs[t * BH + e], c_prev, dh, dc[idx]);
      }
      dc[idx] = d.dc_prev;
      put_dg(d, b, unit, row);
      if (s == 0) {
        a.dc0[e] = from_float<T>(d.dc_prev);
      } else if (!own_one) {  // the next step's saved gates and c, from HBM into L2 while this step finishes
        const float* next = a.gates + (t_prev * B + b) * G + unit;
#pragma unroll
        for (int gate = 0; gate < 4; ++gate) prefetch_l2(next + gate * H);
        prefetch_l2(a.cs + t_prev * BH + e);
        if (s > 1) prefetch_l2(a.cs + time_of(s - 2, a.steps, a.reverse) * BH + e);
        if (a.dy) prefetch_l2(a.dy + t_prev * BH + e);
      }
    }
    }
    HFNN_PHASE(0)
    const auto done = static_cast<unsigned>(a.steps - s);
    if (!chip) {
      __syncthreads();  // every thread's dG_t stores before the release (one block: before the stage)
      if (!lone) publish(a.flags, done);
    }
    if (mine && s > 0) load_cell(s - 1);
    HFNN_PHASE(1)
    if (!chip && !lone) wait_all(a.flags, done);  // every block's dG_t
    HFNN_PHASE(2)
    const float* dg_t = a.dg + t * B * G;
    for (int b0 = 0; b0 < B; b0 += bs) {
      const int nb = min(bs, B - b0);
      // (v's last readers, the products of the chunk before, finished before the barrier after
      // them; acc's, the sums below, before the barrier after this stage.)
      if (!chip) stage_ready(v, dg_t, b0, nb, static_cast<int>(G));  // kp == 4H: rows unpadded
      __syncthreads();  // v filled (staged, or on chip by the gate phase) before any warp's products
      HFNN_PHASE(3)
      if constexpr (kR > 0)
        reg_products<kR>(wr, geo, v, nb, acc);
      else
        block_products<T, kBt>(w, u, v, nb, kp, parts, acc, bs);
      __syncthreads();  // every warp's acc before the sums
      HFNN_PHASE(4)
      if (one) {
        if (mine) {
          float sum = 0.0f;
          for (int p = 0; p < parts; ++p) sum += acc[(p * u + my_j) * bs + my_b];
          my_dh = sum;
          if (s == 0) a.dh0[my_e] = from_float<T>(sum);
        }
      } else {
        for (int idx = tid; idx < nb * u; idx += kThreads) {
          const int bb = idx / u, j = idx - bb * u, unit = unit0 + j;
          float sum = 0.0f;
          for (int p = 0; p < parts; ++p) sum += acc[(p * u + j) * bs + bb];
          dh_rec[(b0 + bb) * u + j] = sum;
          if (s == 0 && unit < H) a.dh0[static_cast<int64_t>(b0 + bb) * H + unit] = from_float<T>(sum);
        }
      }
    }
    // With one chunk, the thread that wrote dh_rec[idx] and dc[idx] is the one that reads them in
    // the next gate phase (idx over B u both times) and v's readers finished before the barrier
    // above: no barrier. With several, dh_rec's entries cross threads.
    if (bs < B) __syncthreads();
    HFNN_PHASE(5)
  }
  HFNN_PHASES_END(1)
}

// ---- host side ----------------------------------------------------------------------------------

template <typename F>
decltype(auto) with_tile_batch(int kbt, F&& f) {
  if (kbt == 1) return f.template operator()<1>();
  if (kbt == 2) return f.template operator()<2>();
  return f.template operator()<4>();
}

// kr: Geometry::reg (0, 4 or 8); with weights in registers the tile is kRegBt batch rows whatever
// the batch (fewer instances: a smaller batch leaves some of a tile's rows empty).
template <typename F>
decltype(auto) with_reg_rows(int kr, F&& f) {
  if (kr == 8) return f.template operator()<8>();
  if (kr == 4) return f.template operator()<4>();
  return f.template operator()<0>();
}

template <bool kBackward, typename T, int kBt, int kR, bool kFuse = false, bool kMma = false>
constexpr auto kernel_fn() {
  if constexpr (kBackward)
    return persistent_bwd_kernel<T, kBt, kR>;
  else
    return persistent_fwd_kernel<T, kBt, kR, kFuse, kMma>;
}

// f(kernel) for the kernel of geometry reg kr (0, 4 or 8), tile batch kbt (kr 0 only), fuse
// (the forward's geometry_fused) and mma (the forward's geometry_mma, 16-bit dtypes).
template <bool kBackward, typename T, typename F>
decltype(auto) with_kernel(int kr, int kbt, bool fuse, F&& f, bool mma = false) {
  if constexpr (!kBackward) {
    if (fuse) return f(kernel_fn<false, T, kRegBt, 4, true>());
    if constexpr (!std::is_same_v<T, float>)
      if (mma) return f(kernel_fn<false, T, kRegBt, 0, false, true>());
  }
  return with_reg_rows(kr, [&]<int kR>() {
    if constexpr (kR > 0)
      return f(kernel_fn<kBackward, T, kRegBt, kR>());
    else
      return with_tile_batch(kbt, [&]<int kBt>() { return f(kernel_fn<kBackward, T, kBt, 0>()); });
  });
}

const void* kernel_of(bool backward, DType dtype, int kbt, int kr, bool fuse = false, bool mma = false) {
  return dispatch_dtype(dtype, [&]<typename T>() {
    auto as_void = [](auto kernel) { return reinterpret_cast<const void*>(kernel); };
    return backward ? with_kernel<true, T>(kr, kbt, false, as_void)
                    : with_kernel<false, T>(kr, kbt, fuse, as_void, mma);
  });
}

// A whole step in one block where it is at most this many multiply-adds (4H x H x B; 256 a thread):
// no cross-block round trips (on chip where the batch fits one stage), and about 0.5 us of products. An estimate from the
// instruction counts, not a measurement: tune it on the device.
constexpr int64_t kLoneWork = 64 * 1024;

// The launch for a shape, the first of these that fits shared memory with every block resident:
// one block (small steps: kLoneWork); one block an SM with the weights in registers (the forward
// first with its gates in the product warps, geometry_fused, then geometry_reg, where the slice
// fits); one block an SM (the fewest units that keep the grid within
// the SM count: fewer blocks to wait on, and 2 blocks an SM add nothing to the products an SM does);
// the fewest units a block such that the grid is resident (several blocks an SM, as before: this
// keeps every shape the variant took). nullopt where none fits. Depends on neither T nor the
// pointers; the answers of the last few shapes are kept (supports() runs on every call of the op).
std::optional<Geometry> plan(bool backward, const Shape& s) {
  if (!valid_shape(s) || s.device.device < 0 || s.device.cc_major < 7 || s.device.sm_count < 1) return std::nullopt;
  struct Entry {
    bool backward;
    int64_t batch, hidden;
    DType dtype;
    int device;
    std::optional<Geometry> geo;
  };
  thread_local std::array<Entry, 16> recent{};
  thread_local unsigned next = 0;
  thread_local bool any = false;
  if (any)
    for (const Entry& e : recent)
      if (e.device == s.device.device && e.backward == backward && e.batch == s.batch && e.hidden == s.hidden &&
          e.dtype == s.dtype)
        return e.geo;
  const int kbt = tile_batch(s.batch);
  const void* kernel = kernel_of(backward, s.dtype, kbt, 0);
  const int64_t H = s.hidden;
  // -1: the slice does not fit shared memory (nor does any with more units); 0: not resident.
  auto attempt = [&](int64_t units, Geometry& out) {
    const int64_t grid = (H + units - 1) / units;
    Geometry g = geometry(backward, s, units, kbt);
    if (g.smem > s.device.smem_per_block_optin) return -1;
    if (grid > resident_clusters(kernel, kThreads, 1, static_cast<std::size_t>(g.smem), 1, s.device))
      return 0;
    g.grid = static_cast<int>(grid);
    out = g;
    return 1;
  };
  std::optional<Geometry> found;
  Geometry g;
  if (H <= kLoneWork && s.batch <= kLoneWork && 4 * H * H * s.batch <= kLoneWork && attempt(H, g) == 1) found = g;
  // One block an SM with the weights in registers (r from geometry_fused or geometry_reg) where it
  // fits with every block resident.
  const int64_t sm_units = (H + s.device.sm_count - 1) / s.device.sm_count, sm_grid = (H + sm_units - 1) / sm_units;
  auto resident_reg = [&](Geometry r) {
    if (r.smem > s.device.smem_per_block_optin ||
        sm_grid > resident_clusters(kernel_of(backward, s.dtype, kbt, r.reg, r.fuse != 0, r.mma != 0), kThreads, 1,
                                    static_cast<std::size_t>(r.smem), 1, s.device))
      return;
    r.grid = static_cast<int>(sm_grid);
    found = r;
  };
  if (!found && !backward && sm_grid > 1) resident_reg(geometry_fused(s, sm_units));
  if (!found && !backward && sm_grid > 1) resident_reg(geometry_mma(s, sm_units));
  if (!found) resident_reg(geometry_reg(backward, s, sm_units));
  if (!found && attempt(sm_units, g) == 1) found = g;
  // At most 2048 threads an SM: a lower bound on the units a block needs.
  const int64_t most_blocks = static_cast<int64_t>(s.device.sm_count) * (2048 / kThreads);
  const int64_t fewest = std::max<int64_t>(1, (H + most_blocks - 1) / most_blocks);
  for (int64_t units = fewest; !found && units <= H; ++units) {
    const int64_t grid = (H + units - 1) / units;
    if (units > fewest && (H + units - 2) / (units - 1) == grid) continue;  // that grid with less shared memory was refused
    const int r = attempt(units, g);
    if (r < 0) break;  // more units only need more
    if (r > 0) found = g;
  }
  recent[next++ % recent.size()] = {backward, s.batch, s.hidden, s.dtype, s.device.device, found};
  any = true;
  return found;
}

// Nothing where the launch keeps its recurrence on chip and reads none of hs back; else
// hs [rows, ld] (rows = (T+1) B, ld = history_ld(hidden)) set to the empty mark on the stream
// (header comment), but the pads past `hidden` in each row: zeros, which the stage copies with the
// row (two memset nodes in a captured graph; the second only where hidden is not a multiple of 4).
cudaError_t mark_empty(const Geometry& g, int64_t batch, float* p, int64_t rows, int64_t hidden, int64_t ld,
                       cudaStream_t stream) {
  if (on_chip(g.grid, g.bs, batch)) return cudaSuccess;
  const std::size_t f = sizeof(float);
  if (const cudaError_t e = cudaMemsetAsync(p, kEmptyByte, static_cast<std::size_t>(rows * ld) * f, stream);
      e != cudaSuccess || ld == hidden)
    return e;
  return cudaMemset2DAsync(p + hidden, static_cast<std::size_t>(ld) * f, 0, static_cast<std::size_t>(ld - hidden) * f,
                           static_cast<std::size_t>(rows), stream);
}

// A cooperative launch (every block resident: a block waiting on another's values never waits on
// one that is not running) through cudaLaunchKernelEx, which
// returns this launch's own error.
template <typename Args>
cudaError_t launch_cooperative(void (*kernel)(Args), const Geometry& g, cudaStream_t stream, const Args& args) {
  if (const cudaError_t e = allow_smem(kernel, static_cast<std::size_t>(g.smem)); e != cudaSuccess) return e;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(g.grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<std::size_t>(g.smem);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args);
}

}  // namespace

// The phase totals of the last forward (backward) launch, [block][phase] cycles, for the blocks of
// its grid; false where the build has no phase timing (HFNN_LSTM_PHASES).
bool persistent_phases(bool backward, const Shape& s, std::vector<long long>* out, int* grid) {
#ifdef HFNN_LSTM_PHASES
  const auto geo = plan(backward, s);
  if (!geo) return false;
  *grid = std::min(geo->grid, kPhaseBlocks);
  out->assign(static_cast<std::size_t>(*grid) * kPhases, 0);
  const std::size_t row = sizeof(long long) * kPhases;
  for (int b = 0; b < *grid; ++b)
    if (cudaMemcpyFromSymbol(out->data() + static_cast<std::size_t>(b) * kPhases, phase_cycles, row,
                             (static_cast<std::size_t>(backward ? 1 : 0) * kPhaseBlocks + b) * row) != cudaSuccess)
      return false;
  return true;
#else
  (void)backward, (void)s, (void)out, (void)grid;
  return false;
#endif
}

bool persistent_supports(const Shape& s) { return plan(false, s).has_value() && plan(true, s).has_value(); }

cudaError_t persistent_forward(const FwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  const auto geo = plan(false, s);
  if (!geo || !plan(true, s)) return cudaErrorInvalidConfiguration;
  // The forward strides hs by its rows' padded length, the layout allocates history_ld's.
  if (geo->kp != history_ld(s.hidden)) return cudaErrorInvalidConfiguration;
  if (const cudaError_t e = input_projection(p, stream); e != cudaSuccess) return e;
  return dispatch_dtype(s.dtype, [&]<typename T>() {
    const FwdBuffers<T> ws = fwd_buffers<T>(s, p.workspace);
    FwdArgs<T> a{};
    a.steps = s.steps, a.batch = static_cast<int>(s.batch), a.hidden = static_cast<int>(s.hidden);
    a.reverse = p.reverse, a.geo = *geo;
    a.w_hh = static_cast<const T*>(p.w_hh), a.b_ih = static_cast<const T*>(p.b_ih);
    a.b_hh = static_cast<const T*>(p.b_hh), a.h0 = static_cast<const T*>(p.h0), a.c0 = static_cast<const T*>(p.c0);
    a.y = static_cast<T*>(p.y), a.h_n = static_cast<T*>(p.h_n), a.c_n = static_cast<T*>(p.c_n);
    a.gates = ws.gates, a.cs = ws.cs, a.hs = ws.hs;
    a.hd = reinterpret_cast<void*>(ws.hd) == reinterpret_cast<void*>(ws.hs) ? nullptr : ws.hd;
    if (geo->x16) {  // the exchange is hd (geometry_mma's x16): every value of it empty, no pads
      const std::size_t bytes = static_cast<std::size_t>((s.steps + 1) * s.batch * s.hidden) * sizeof(T);
      if (const cudaError_t e = cudaMemsetAsync(ws.hd, kEmptyByte, bytes, stream); e != cudaSuccess) return e;
    } else if (const cudaError_t e = mark_empty(*geo, s.batch, ws.hs, (s.steps + 1) * s.batch, s.hidden,
                                                history_ld(s.hidden), stream);
               e != cudaSuccess) {
      return e;
    }
    return with_kernel<false, T>(
        geo->reg, tile_batch(s.batch), geo->fuse != 0,
        [&](auto kernel) { return launch_cooperative(kernel, *geo, stream, a); }, geo->mma != 0);
  });
}

cudaError_t persistent_backward(const BwdParams& p, cudaStream_t stream) {
  const Shape& s = p.shape;
  const auto geo = plan(true, s);
  if (!geo || !plan(false, s)) return cudaErrorInvalidConfiguration;
  const cudaError_t err = dispatch_dtype(s.dtype, [&]<typename T>() {
    const FwdBuffers<T> ws = fwd_buffers<T>(s, const_cast<void*>(p.workspace));
    const BwdBuffers<T> sc = bwd_buffers<T>(s, p.scratch);
    BwdArgs<T> a{};
    a.steps = s.steps, a.batch = static_cast<int>(s.batch), a.hidden = static_cast<int>(s.hidden);
    a.reverse = p.reverse, a.geo = *geo;
    a.w_hh = static_cast<const T*>(p.w_hh), a.dy = static_cast<const T*>(p.dy);
    a.dh_n = static_cast<const T*>(p.dh_n), a.dc_n = static_cast<const T*>(p.dc_n), a.c0 = static_cast<const T*>(p.c0);
    a.gates = ws.gates, a.cs = ws.cs, a.dg = sc.dg, a.dg16 = s.dtype == DType::kFloat32 ? nullptr : sc.dg16;
    a.dh0 = static_cast<T*>(p.dh0), a.dc0 = static_cast<T*>(p.dc0), a.flags = sc.flags;
    if (geo->grid > 1) {  // the readiness words of the launch's blocks to zero (header comment)
      const std::size_t bytes = static_cast<std::size_t>(geo->grid) * kFlagWords * sizeof(unsigned);
      if (const cudaError_t e = cudaMemsetAsync(sc.flags, 0, bytes, stream); e != cudaSuccess) return e;
    }
    return with_kernel<true, T>(geo->reg, tile_batch(s.batch), false,
                                [&](auto kernel) { return launch_cooperative(kernel, *geo, stream, a); });
  });
  if (err != cudaSuccess) return err;
  return backward_gemms(p, stream);
}

}  // namespace hfnn::kernels::lstm::detail
