#include "src/dispatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "kernels/common/dtype.h"
#include "kernels/layer_norm/layer_norm_family.h"
#include "profiles/db.h"
#include "tuner/tuner.h"
#if HFNN_WITH_CUDA
#include "kernels/layer_norm/layer_norm.h"
#endif

namespace hfnn::dispatch {
namespace {

std::optional<int> dtype_code(const std::string& name) {
  if (name == "float32") return static_cast<int>(kernels::DType::kFloat32);
  if (name == "float16") return static_cast<int>(kernels::DType::kFloat16);
  if (name == "bfloat16") return static_cast<int>(kernels::DType::kBFloat16);
  return std::nullopt;
}

// The registry index of a variant name for a pass; -1 when this build has no such variant.
int variant_index(bool backward, const std::string& name) {
#if HFNN_WITH_CUDA
  namespace k = kernels::layer_norm;
  if (backward) {
    const auto* v = k::find_bwd(name);
    return v ? static_cast<int>(v - k::bwd_variants().data()) : -1;
  }
  const auto* v = k::find_fwd(name);
  return v ? static_cast<int>(v - k::fwd_variants().data()) : -1;
#else
  (void)backward;
  (void)name;
  return -1;
#endif
}

std::string variant_name(bool backward, int index) {
#if HFNN_WITH_CUDA
  namespace k = kernels::layer_norm;
  if (backward && index < static_cast<int>(k::bwd_variants().size())) return std::string(k::bwd_variants()[index].name);
  if (!backward && index < static_cast<int>(k::fwd_variants().size())) return std::string(k::fwd_variants()[index].name);
#endif
  return fmt::format("variant #{}", index);
}

}  // namespace

std::string Gpu::describe() const { return fmt::format("{} (sm {}, {} SMs)", name, compute_capability, sm_count); }

size_t KeyHash::operator()(const Key& k) const noexcept {
  size_t h = std::hash<int64_t>()(k.rows);
  h = h * 1000003u ^ std::hash<int64_t>()(k.cols);
  return h * 31u + static_cast<size_t>(k.dtype) * 2u + (k.affine ? 1u : 0u);
}

const char* fallback_name(Fallback f) {
  switch (f) {
    case Fallback::kNoTable: return "no table for this GPU and versions";
    case Fallback::kNotTuned: return "shape not tuned";
    case Fallback::kTorchWon: return "torch won the tuning";
    case Fallback::kCpuTensor: return "CPU tensor";
    case Fallback::kUnsupported: return "input no variant takes";
    case Fallback::kVariantRefused: return "winner refused the input";
    case Fallback::kLaunchFailed: return "kernel launch failed";
    case Fallback::kBuiltinTorch: return "built-in choice is torch";
    case Fallback::kCount: break;
  }
  return "?";
}

Table Table::load(const std::string& path, const Versions& versions) {
  Table t;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw LoadError(fmt::format("{}: no such file (HFNN_DISPATCH_DB names the database `hfnn profile` and `hfnn tune` "
                                "wrote)",
                                path));
  try {
    profiles::Database db(path, profiles::Database::ReadOnly{});
    {
      profiles::Statement has(db.handle(), "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'tune_winners'");
      if (!has.step() || has.column_int(0) == 0)
        throw LoadError(fmt::format("{}: has no tuned winners yet; run `hfnn tune --db {}` on this GPU first", path, path));
    }
    profiles::Statement s(db.handle(),
                          "SELECT e.gpu, e.compute_capability, e.sm_count, e.cuda, e.torch, e.hfnn, w.op, w.key, w.dtype,"
                          " w.pass, w.winner FROM tune_winners w JOIN tune_envs e ON e.id = w.env_id ORDER BY e.id");
    std::set<std::string> others, unknown;
    while (s.step()) {
      const std::string cuda = s.column_text(3), torch = s.column_text(4), hfnn = s.column_text(5);
      if (cuda != versions.cuda || torch != versions.torch || hfnn != versions.hfnn) {
        others.insert(fmt::format("torch {}, CUDA {}, hfnn {}", torch, cuda, hfnn));
        continue;
      }
      if (s.column_text(6) != "layer_norm") continue;
      const auto key = kernels::layer_norm::parse_key(s.column_text(7));
      const auto dtype = dtype_code(s.column_text(8));
      const std::string pass = s.column_text(9), winner = s.column_text(10);
      if (!key || !dtype || (pass != "fwd" && pass != "bwd")) continue;
      Gpu gpu{s.column_text(0), s.column_text(1), s.column_int(2)};
      auto it = std::find_if(t.gpus_.begin(), t.gpus_.end(), [&](const auto& g) {
        return g.first.name == gpu.name && g.first.compute_capability == gpu.compute_capability &&
               g.first.sm_count == gpu.sm_count;
      });
      if (it == t.gpus_.end()) it = t.gpus_.insert(t.gpus_.end(), {gpu, WinnerMap{}});
      const bool backward = pass == "bwd";
      Pick pick;
      if (winner == tuner::kTorch) {
        pick.index = Pick::kTorch;
      } else if (const int i = variant_index(backward, winner); i >= 0) {
        pick.index = i;
      } else {
        unknown.insert(winner);
        continue;
      }
      Winners& w = it->second[Key{key->rows, key->cols, *dtype, key->affine}];
      (backward ? w.bwd : w.fwd) = pick;
    }
    t.other_versions.assign(others.begin(), others.end());
    t.unknown_variants.assign(unknown.begin(), unknown.end());
  } catch (const profiles::DbError& e) {
    throw LoadError(e.what());
  }
  return t;
}

const WinnerMap* Table::for_gpu(const Gpu& gpu) const {
  for (const auto& [g, map] : gpus_)
    if (g.name == gpu.name && g.compute_capability == gpu.compute_capability && g.sm_count == gpu.sm_count) return &map;
  return nullptr;
}

size_t Table::key_count() const {
  size_t n = 0;
  for (const auto& g : gpus_) n += g.second.size();
  return n;
}

std::vector<Gpu> Table::gpus() const {
  std::vector<Gpu> out;
  for (const auto& g : gpus_) out.push_back(g.first);
  return out;
}

Runtime& Runtime::get() {
  static Runtime* r = new Runtime();  // never destroyed: calls may come during static teardown
  return *r;
}

void Runtime::configure(std::shared_ptr<const Table> table, std::string path, Policy policy, bool strict) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (table_) retired_.push_back(table_);
  table_ = std::move(table);
  path_ = std::move(path);
  policy_.store(policy, std::memory_order_relaxed);
  strict_.store(strict, std::memory_order_relaxed);
  for (auto& d : device_map_) d.store(nullptr, std::memory_order_relaxed);
  for (auto& d : device_resolved_) d.store(false, std::memory_order_relaxed);
  active_.store(true, std::memory_order_release);
}

const WinnerMap* Runtime::resolve(int device, const std::function<Gpu()>& props) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (device_resolved_[device].load(std::memory_order_acquire)) {  // HFNN_STRICT=1 and no table for this GPU
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (table_) message = fmt::format("{} has no winners for cuda:{}", path_, device);
    }
    if (!message.empty()) warn_once("gpu", message);
    return device_map_[device].load(std::memory_order_relaxed);
  }
  const Gpu gpu = props();  // outside the lock: it may initialize CUDA
  std::string warning;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_resolved_[device].load(std::memory_order_relaxed)) {
      const WinnerMap* map = table_ ? table_->for_gpu(gpu) : nullptr;
      if (table_ && !map) {
        std::string tuned;
        for (const auto& g : table_->gpus()) tuned += (tuned.empty() ? "" : ", ") + g.describe();
        warning = fmt::format("{} has no winners for {} (cuda:{}){}; LayerNorm runs torch's kernels there (run "
                              "`hfnn tune --db {}` on this GPU)",
                              path_, gpu.describe(), device, tuned.empty() ? "" : ", only for " + tuned, path_);
      }
      device_map_[device].store(map, std::memory_order_relaxed);
      device_resolved_[device].store(true, std::memory_order_release);
    }
  }
  if (!warning.empty()) warn_once("gpu:" + gpu.describe(), warning);
  return device_map_[device].load(std::memory_order_relaxed);
}

void Runtime::count_variant(bool backward, int index) {
  if (index >= 0 && index < kMaxVariants) variant_calls_[backward][index].fetch_add(1, std::memory_order_relaxed);
}

void Runtime::uncount_variant(bool backward, int index) {
  if (index >= 0 && index < kMaxVariants) variant_calls_[backward][index].fetch_sub(1, std::memory_order_relaxed);
}

void Runtime::count_fallback(bool backward, Fallback why) {
  fallback_calls_[backward][static_cast<int>(why)].fetch_add(1, std::memory_order_relaxed);
}

void Runtime::warn_once(const std::string& topic, const std::string& message) {
  if (strict()) throw std::runtime_error("hfnn (HFNN_STRICT=1): " + message);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(warned_.begin(), warned_.end(), topic) != warned_.end()) return;
    warned_.push_back(topic);
  }
  std::fprintf(stderr, "hfnn: %s\n", message.c_str());
}

std::string Runtime::stats_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json calls = nlohmann::json::object(), fallbacks = nlohmann::json::object();
  for (int b = 0; b < 2; ++b) {
    const char* pass = b ? "bwd" : "fwd";
    calls[pass] = nlohmann::json::object();
    fallbacks[pass] = nlohmann::json::object();
    for (int i = 0; i < kMaxVariants; ++i)
      if (const int64_t n = variant_calls_[b][i].load(std::memory_order_relaxed)) calls[pass][variant_name(b, i)] = n;
    int64_t torch = 0;
    for (int f = 0; f < static_cast<int>(Fallback::kCount); ++f)
      if (const int64_t n = fallback_calls_[b][f].load(std::memory_order_relaxed)) {
        fallbacks[pass][fallback_name(static_cast<Fallback>(f))] = n;
        torch += n;
      }
    if (torch) calls[pass]["torch"] = torch;
  }
  nlohmann::json gpus = nlohmann::json::array();
  if (table_)
    for (const auto& g : table_->gpus()) gpus.push_back(g.describe());
  return nlohmann::json{{"active", active_.load()},
                        {"db", path_},
                        {"policy", policy() == Policy::kTorch ? "torch" : "heuristic"},
                        {"strict", strict()},
                        {"gpus", gpus},
                        {"keys", table_ ? table_->key_count() : 0},
                        {"calls", calls},
                        {"fallbacks", fallbacks}}
      .dump();
}

void Runtime::reset_counts() {
  for (auto& pass : variant_calls_)
    for (auto& c : pass) c.store(0, std::memory_order_relaxed);
  for (auto& pass : fallback_calls_)
    for (auto& c : pass) c.store(0, std::memory_order_relaxed);
}

}  // namespace hfnn::dispatch
