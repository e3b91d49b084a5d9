// HFNN_DISPATCH_DB: the winners `hfnn tune` stored, read once into memory, and what each call did.
//
// The table holds, for every GPU tuned with this process's torch, CUDA and hfnn versions, the
// forward and backward winner of each LayerNorm key (rows, D, dtype, affine): "torch" or a variant.
// A device picks its GPU's table at its first call (name, compute capability, SM count), so no CUDA
// work happens at start-up and each rank of a torchrun job matches its own GPU. Per call: a hash
// lookup and a relaxed atomic counter; nothing touches SQLite or Python.
//
// Torch-free (SQLite, the kernel registry): the op library (src/layer_norm_op.cpp) asks it which
// kernel runs and reports what happened; tests/cpp/test_dispatch.cpp tests it without a GPU.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hfnn::dispatch {

struct Versions {
  std::string torch, cuda, hfnn;
};

struct Gpu {
  std::string name, compute_capability;
  int64_t sm_count = 0;
  std::string describe() const;  // "NVIDIA H200 (sm 9.0, 132 SMs)"
};

// What runs a pass of one key: not tuned, torch's kernel, or the variant with this index in the
// kernel registry's list (fwd_variants() / bwd_variants()).
struct Pick {
  static constexpr int kNotTuned = -1, kTorch = -2;
  int index = kNotTuned;
};

struct Key {
  int64_t rows = 0, cols = 0;
  int dtype = 0;  // kernels::DType
  bool affine = true;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const noexcept;
};

struct Winners {
  Pick fwd, bwd;
};
using WinnerMap = std::unordered_map<Key, Winners, KeyHash>;

// One line, naming the file and the fix.
struct LoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Winners per GPU for one set of versions, read from an hfnn database.
class Table {
 public:
  // Throws LoadError for a missing, unreadable, corrupt or foreign file, or one with no tune
  // tables. A file tuned only with other versions loads empty: `other_versions` then says which.
  static Table load(const std::string& path, const Versions& versions);
  // The winners tuned on this GPU, or null.
  const WinnerMap* for_gpu(const Gpu& gpu) const;
  size_t gpu_count() const { return gpus_.size(); }
  size_t key_count() const;
  std::vector<Gpu> gpus() const;
  std::vector<std::string> other_versions;  // "torch X, CUDA Y, hfnn Z" of envs that did not match
  std::vector<std::string> unknown_variants;  // winners this build does not have (treated as not tuned)

 private:
  std::vector<std::pair<Gpu, WinnerMap>> gpus_;
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
  kCount
};
const char* fallback_name(Fallback f);

// The process-wide dispatch state. Loaded once (HFNN_DISPATCH_DB, by the start-up hook).
class Runtime {
 public:
  static Runtime& get();
  // Installs `table` (or none, after a load error), with the policy and strictness.
  void configure(std::shared_ptr<const Table> table, std::string path, Policy policy, bool strict);
  bool active() const { return active_.load(std::memory_order_acquire); }
  Policy policy() const { return policy_.load(std::memory_order_relaxed); }
  bool strict() const { return strict_.load(std::memory_order_relaxed); }
  // The winners for the device, resolving its GPU on the first call (props: the device's identity).
  // Inline: after that first call, two atomic loads and nothing built.
  template <typename Props>
  const WinnerMap* for_device(int device, Props&& props) {
    if (device >= 0 && device < kMaxDevices && device_resolved_[device].load(std::memory_order_acquire)) {
      const WinnerMap* map = device_map_[device].load(std::memory_order_relaxed);
      if (map || !strict()) return map;
    }
    return resolve(device, std::function<Gpu()>(std::forward<Props>(props)));
  }
  // What one call ran: a variant (by pass and index), or torch for a reason.
  void count_variant(bool backward, int index);
  void count_fallback(bool backward, Fallback why);
  // Takes back a count_variant() whose call ran torch's kernel after all (its launch failed).
  void uncount_variant(bool backward, int index);
  // Prints `message` once per `topic` (stderr, prefixed "hfnn: "); in strict mode throws it instead.
  void warn_once(const std::string& topic, const std::string& message);
  // {"active", "db", "policy", "strict", "gpus", "keys", "calls": {pass: {kernel: n}}, "fallbacks": {pass: {reason: n}}}
  std::string stats_json() const;
  void reset_counts();

 private:
  static constexpr int kMaxVariants = 64, kMaxDevices = 64;
  const WinnerMap* resolve(int device, const std::function<Gpu()>& props);  // the first call per device
  std::atomic<bool> active_{false};
  std::shared_ptr<const Table> table_;
  // Tables replaced by a later configure(): kept, since another thread may still be reading one.
  std::vector<std::shared_ptr<const Table>> retired_;
  std::string path_;
  std::atomic<Policy> policy_{Policy::kTorch};
  std::atomic<bool> strict_{false};
  std::array<std::atomic<const WinnerMap*>, kMaxDevices> device_map_{};
  std::array<std::atomic<bool>, kMaxDevices> device_resolved_{};
  std::array<std::array<std::atomic<int64_t>, kMaxVariants>, 2> variant_calls_{};
  std::array<std::array<std::atomic<int64_t>, static_cast<int>(Fallback::kCount)>, 2> fallback_calls_{};
  mutable std::mutex mutex_;  // configure, first call per device, warnings
  std::vector<std::string> warned_;
};

}  // namespace hfnn::dispatch
