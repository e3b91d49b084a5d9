// HFNN_DISPATCH_DB: the winners `hfnn tune` stored, read once into memory, and what each call did.
//
// The table holds, for every GPU tuned with this process's torch, CUDA and hfnn versions and for
// every kernel family (kernels/common/family.h) by its op name, each key's winner per pass: "torch"
// or a variant. Keys are the family's packed keys (families::PackedKey), which its op builds from
// a call's sizes. A device picks its GPU's winners at its first call (name, compute capability, SM
// count), so no CUDA work happens at start-up and each rank of a torchrun job matches its own GPU.
// Per call: a hash lookup and a relaxed atomic counter; nothing touches SQLite or Python, and no
// text is built.
//
// Torch-free and family-free: it knows families only through their descriptions. An op library
// file (src/<family>_op.cpp) adds its router, resolves its family's index once, asks which kernel
// runs and reports what happened; src/dispatch_op.cpp makes loading and the counts torch ops;
// tests/cpp/test_dispatch.cpp tests it without a GPU.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/common/family.h"

namespace hfnn::dispatch {

struct Versions {
  std::string torch, cuda, hfnn;
};

struct Gpu {
  std::string name, compute_capability;
  int64_t sm_count = 0;
  std::string describe() const;  // "NVIDIA H200 (sm 9.0, 132 SMs)"
};

// What runs a pass of one key: not tuned, torch's kernel, or the variant with this index in its
// family's variants(pass) (the op's registry order).
struct Pick {
  static constexpr int kNotTuned = -1, kTorch = -2;
  int index = kNotTuned;
};

// Passes per family (LayerNorm: fwd, bwd), families per runtime, variants per pass: the bounds of
// the fixed arrays the per-call counters and the winners live in.
inline constexpr int kMaxPasses = 4, kMaxFamilies = 8, kMaxVariants = 64;

// A key's winner per pass, by the pass's position in its family's passes.
using Winners = std::array<Pick, kMaxPasses>;

using families::PackedKey;
struct PackedKeyHash {
  size_t operator()(const PackedKey& k) const noexcept {
    size_t h = 0;
    for (const int64_t w : k) h = (h ^ static_cast<size_t>(w)) * 0x9E3779B97F4A7C15ull;  // odd: a bijection per word
    return h;
  }
};
using WinnerMap = std::unordered_map<PackedKey, Winners, PackedKeyHash>;

// One line, naming the file and the fix.
struct LoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Winners per GPU and family for one set of versions, read from an hfnn database.
class Table {
 public:
  // Throws LoadError for a missing, unreadable, corrupt or foreign file, or one with no tune
  // tables. A file tuned only with other versions loads empty: `other_versions` then says which.
  // Rows of ops none of `known` is (a family another build of hfnn has) are skipped.
  static Table load(const std::string& path, const Versions& versions,
                    std::span<const families::Family* const> known = families::all());
  // Family `op`'s winners tuned on this GPU: null when the GPU has none at all, an empty map when
  // it has only other families' (its keys are then not tuned, rather than without a table).
  const WinnerMap* for_gpu(const Gpu& gpu, std::string_view op) const;
  size_t gpu_count() const { return gpus_.size(); }
  size_t key_count() const;                    // over every GPU and family
  size_t key_count(std::string_view op) const;  // one family's, over every GPU
  std::vector<Gpu> gpus() const;
  std::vector<std::string> other_versions;  // "torch X, CUDA Y, hfnn Z" of envs that did not match
  std::vector<std::string> unknown_variants;  // winners this build does not have (treated as not tuned)

 private:
  struct GpuWinners {
    Gpu gpu;
    std::map<std::string, WinnerMap, std::less<>> ops;  // by op name
  };
  std::vector<GpuWinners> gpus_;
};

enum class Policy { kTorch, kHeuristic };  // what a key without a winner runs

// Why a call ran torch's kernel rather than a tuned hfnn one.
enum class Fallback : int {
  kNoTable,        // no table for this GPU and versions (or none loaded)
  kNotTuned,       // the key has no winner for this pass (policy torch)
  kTorchWon,       // tuned: torch was the fastest correct choice
  kCpuTensor,      // not a CUDA tensor
  kUnsupported,    // dtype, layout, weight or bias no variant takes
  kVariantRefused, // the winner's supports() said no (alignment), or it is not in this build
  kLaunchFailed,   // the chosen variant's launch failed (counted and warned about once; torch ran)
  kBuiltinTorch,   // not tuned, and the built-in choice (measured per GPU) is torch's kernel
  kMask,           // a mask the family's op does not take (attention: a float mask of another dtype
                   // than the query's, a mask on another device; or one torch's module rejects)
  kModuleSettings, // the module's settings the family's op does not take (attention: add_bias_kv,
                   // add_zero_attn)
  kMaskGrad,       // a float mask that requires grad (attention's op computes no gradient for a mask)
  kUnbatched,      // unbatched input (attention: a 2-D query)
  kNested,         // a nested tensor
  kCount
};
const char* fallback_name(Fallback f);

// How a family's op file routes torch's own op through the table (LayerNorm's registers its
// kernels over aten::native_layer_norm): each file adds its router at library load, from a static
// initializer, and loading a table (src/dispatch_op.cpp) runs them all, so that loader names no
// family. A router runs at every load: it must do its work once.
void add_router(void (*route)());
void run_routers();

// The dispatch state: the process's (get()), over every family of this build. Loaded once
// (HFNN_DISPATCH_DB, by the start-up hook). Families are named by their index in the runtime's
// list (family_index(), resolved once by each op), passes by their index in the family's passes.
class Runtime {
 public:
  static Runtime& get();
  // A runtime over these families (tests: a fake family beside LayerNorm). Throws
  // std::invalid_argument beyond kMaxFamilies families or kMaxPasses passes in one.
  explicit Runtime(std::span<const families::Family* const> families);
  // The index of family `op` in this runtime's list; -1 for none.
  int family_index(std::string_view op) const;
  // Installs `table` (or none, after a load error), with the policy and strictness.
  void configure(std::shared_ptr<const Table> table, std::string path, Policy policy, bool strict);
  bool active() const { return active_.load(std::memory_order_acquire); }
  Policy policy() const { return policy_.load(std::memory_order_relaxed); }
  bool strict() const { return strict_.load(std::memory_order_relaxed); }
  // A family's winners for the device, resolving its GPU on the first call (props: the device's
  // identity). Inline: after that first call, two atomic loads and nothing built. Null: no table
  // for this GPU (or none loaded).
  template <typename Props>
  const WinnerMap* for_device(int family, int device, Props&& props) {
    if (device >= 0 && device < kMaxDevices && family >= 0 && family < kMaxFamilies &&
        device_resolved_[device].load(std::memory_order_acquire)) {
      const WinnerMap* map = device_maps_[device][family].load(std::memory_order_relaxed);
      if (map || !strict()) return map;
    }
    return resolve(family, device, std::function<Gpu()>(std::forward<Props>(props)));
  }
  // What one call ran: a variant (by family, pass and index), or torch for a reason.
  void count_variant(int family, int pass, int index);
  void count_fallback(int family, int pass, Fallback why);
  // Takes back a count_variant() whose call ran torch's kernel after all (its launch failed).
  void uncount_variant(int family, int pass, int index);
  // Prints `message` once per `topic` (stderr, prefixed "hfnn: "); in strict mode throws it instead.
  void warn_once(const std::string& topic, const std::string& message);
  // {"active", "db", "policy", "strict", "gpus", "keys", "ops": {op: {"title", "keys",
  //  "calls": {pass: {kernel: n}}, "fallbacks": {pass: {reason: n}}}}}: every family of the
  // runtime, every pass of each; "torch" in calls counts the calls torch's kernel ran.
  std::string stats_json() const;
  void reset_counts();

 private:
  static constexpr int kMaxDevices = 64;
  using PassCounts = std::array<std::array<std::atomic<int64_t>, kMaxVariants>, kMaxPasses>;
  using PassFallbacks = std::array<std::array<std::atomic<int64_t>, static_cast<int>(Fallback::kCount)>, kMaxPasses>;
  // The first call per device (and, with HFNN_STRICT=1, every call on a GPU without winners).
  const WinnerMap* resolve(int family, int device, const std::function<Gpu()>& props);
  std::vector<const families::Family*> families_;
  std::atomic<bool> active_{false};
  std::shared_ptr<const Table> table_;
  // Tables replaced by a later configure(): kept, since another thread may still be reading one.
  std::vector<std::shared_ptr<const Table>> retired_;
  std::string path_;
  std::atomic<Policy> policy_{Policy::kTorch};
  std::atomic<bool> strict_{false};
  std::array<std::array<std::atomic<const WinnerMap*>, kMaxFamilies>, kMaxDevices> device_maps_{};
  std::array<std::atomic<bool>, kMaxDevices> device_resolved_{};
  std::array<PassCounts, kMaxFamilies> variant_calls_{};
  std::array<PassFallbacks, kMaxFamilies> fallback_calls_{};
  mutable std::mutex mutex_;  // configure, first call per device, warnings
  std::vector<std::string> warned_;
};

}  // namespace hfnn::dispatch
