#include "src/dispatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "profiles/db.h"
#include "tuner/tuner.h"

namespace hfnn::dispatch {
namespace {

bool same_gpu(const Gpu& a, const Gpu& b) {
  return a.name == b.name && a.compute_capability == b.compute_capability && a.sm_count == b.sm_count;
}

// Variant names by family and pass, read from the families once per load rather than per row.
class VariantNames {
 public:
  int index(const families::Family& family, int pass, const std::string& name) {
    auto& names = by_pass_[{&family, pass}];
    if (!names) {
      names.emplace();
      for (auto& v : family.variants(family.passes[pass])) names->push_back(std::move(v.name));
    }
    const auto it = std::find(names->begin(), names->end(), name);
    return it == names->end() ? -1 : static_cast<int>(it - names->begin());
  }

 private:
  std::map<std::pair<const families::Family*, int>, std::optional<std::vector<std::string>>> by_pass_;
};

// Function-local: routers are added from other files' static initializers, in no set order.
// Only static initialization adds and only a load runs them, so no lock.
std::vector<void (*)()>& routers() {
  static std::vector<void (*)()> all;
  return all;
}

}  // namespace

void add_router(void (*route)()) { routers().push_back(route); }

void run_routers() {
  for (const auto route : routers()) route();
}

std::string Gpu::describe() const { return fmt::format("{} (sm {}, {} SMs)", name, compute_capability, sm_count); }

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
    case Fallback::kMask: return "mask the op does not take";
    case Fallback::kModuleSettings: return "module settings the op does not take";
    case Fallback::kMaskGrad: return "mask requires grad";
    case Fallback::kUnbatched: return "unbatched input";
    case Fallback::kNested: return "nested tensor";
    case Fallback::kCount: break;
  }
  return "?";
}

Table Table::load(const std::string& path, const Versions& versions, std::span<const families::Family* const> known) {
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
    VariantNames names;
    while (s.step()) {
      const std::string cuda = s.column_text(3), torch = s.column_text(4), hfnn = s.column_text(5);
      if (cuda != versions.cuda || torch != versions.torch || hfnn != versions.hfnn) {
        others.insert(fmt::format("torch {}, CUDA {}, hfnn {}", torch, cuda, hfnn));
        continue;
      }
      const std::string op = s.column_text(6);
      const auto family = std::find_if(known.begin(), known.end(), [&](const auto* f) { return f->op == op; });
      if (family == known.end()) continue;  // a family this build does not have: its ops run torch's kernels
      const families::Family& f = **family;
      const auto key = f.pack_key(s.column_text(7), s.column_text(8));
      const std::string winner = s.column_text(10);
      const int pass = families::pass_index(f, s.column_text(9));
      if (!key || pass < 0 || pass >= kMaxPasses) continue;
      Gpu gpu{s.column_text(0), s.column_text(1), s.column_int(2)};
      auto it = std::find_if(t.gpus_.begin(), t.gpus_.end(), [&](const auto& g) { return same_gpu(g.gpu, gpu); });
      if (it == t.gpus_.end()) it = t.gpus_.insert(t.gpus_.end(), {gpu, {}});
      Pick pick;
      if (winner == tuner::kTorch) {
        pick.index = Pick::kTorch;
      } else if (const int i = names.index(f, pass, winner); i >= 0 && i < kMaxVariants) {
        pick.index = i;
      } else {
        unknown.insert(winner);
        continue;
      }
      it->ops[op][*key][pass] = pick;
    }
    t.other_versions.assign(others.begin(), others.end());
    t.unknown_variants.assign(unknown.begin(), unknown.end());
  } catch (const profiles::DbError& e) {
    throw LoadError(e.what());
  }
  return t;
}

const WinnerMap* Table::for_gpu(const Gpu& gpu, std::string_view op) const {
  static const WinnerMap kNone;
  for (const auto& g : gpus_) {
    if (!same_gpu(g.gpu, gpu)) continue;
    const auto it = g.ops.find(op);
    return it == g.ops.end() ? &kNone : &it->second;
  }
  return nullptr;
}

size_t Table::key_count() const {
  size_t n = 0;
  for (const auto& g : gpus_)
    for (const auto& [op, map] : g.ops) n += map.size();
  return n;
}

size_t Table::key_count(std::string_view op) const {
  size_t n = 0;
  for (const auto& g : gpus_)
    if (const auto it = g.ops.find(op); it != g.ops.end()) n += it->second.size();
  return n;
}

std::vector<Gpu> Table::gpus() const {
  std::vector<Gpu> out;
  for (const auto& g : gpus_) out.push_back(g.gpu);
  return out;
}

Runtime& Runtime::get() {
  // Never destroyed: calls may come during static teardown.
  static Runtime* r = new Runtime(families::all());
  return *r;
}

Runtime::Runtime(std::span<const families::Family* const> families) : families_(families.begin(), families.end()) {
  if (families_.size() > static_cast<size_t>(kMaxFamilies))
    throw std::invalid_argument(fmt::format("hfnn dispatch: {} kernel families, at most {} fit; raise kMaxFamilies in "
                                            "src/dispatch.h", families_.size(), kMaxFamilies));
  for (const auto* f : families_)
    if (f->passes.size() > static_cast<size_t>(kMaxPasses))
      throw std::invalid_argument(fmt::format("hfnn dispatch: family {} has {} passes, at most {} fit; raise kMaxPasses "
                                              "in src/dispatch.h", f->op, f->passes.size(), kMaxPasses));
}

int Runtime::family_index(std::string_view op) const {
  const auto it = std::find_if(families_.begin(), families_.end(), [&](const auto* f) { return f->op == op; });
  return it == families_.end() ? -1 : static_cast<int>(it - families_.begin());
}

void Runtime::configure(std::shared_ptr<const Table> table, std::string path, Policy policy, bool strict) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (table_) retired_.push_back(table_);
  table_ = std::move(table);
  path_ = std::move(path);
  policy_.store(policy, std::memory_order_relaxed);
  strict_.store(strict, std::memory_order_relaxed);
  for (auto& device : device_maps_)
    for (auto& map : device) map.store(nullptr, std::memory_order_relaxed);
  for (auto& d : device_resolved_) d.store(false, std::memory_order_relaxed);
  active_.store(true, std::memory_order_release);
}

const WinnerMap* Runtime::resolve(int family, int device, const std::function<Gpu()>& props) {
  if (device < 0 || device >= kMaxDevices || family < 0 || family >= static_cast<int>(families_.size())) return nullptr;
  if (device_resolved_[device].load(std::memory_order_acquire)) {  // HFNN_STRICT=1 and no table for this GPU
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (table_) message = fmt::format("{} has no winners for cuda:{}", path_, device);
    }
    if (!message.empty()) warn_once("gpu", message);
    return device_maps_[device][family].load(std::memory_order_relaxed);
  }
  const Gpu gpu = props();  // outside the lock: it may initialize CUDA
  std::string warning;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_resolved_[device].load(std::memory_order_relaxed)) {
      // Every family's winners at once: one resolution per device, whichever family calls first.
      for (size_t f = 0; f < families_.size(); ++f)
        device_maps_[device][f].store(table_ ? table_->for_gpu(gpu, families_[f]->op) : nullptr,
                                      std::memory_order_relaxed);
      if (table_ && !device_maps_[device][family].load(std::memory_order_relaxed)) {
        std::string tuned;
        for (const auto& g : table_->gpus()) tuned += (tuned.empty() ? "" : ", ") + g.describe();
        warning = fmt::format("{} has no winners for {} (cuda:{}){}; torch's kernels run there (run `hfnn tune --db "
                              "{}` on this GPU)",
                              path_, gpu.describe(), device, tuned.empty() ? "" : ", only for " + tuned, path_);
      }
      device_resolved_[device].store(true, std::memory_order_release);
    }
  }
  if (!warning.empty()) warn_once("gpu:" + gpu.describe(), warning);
  return device_maps_[device][family].load(std::memory_order_relaxed);
}

void Runtime::count_variant(int family, int pass, int index) {
  if (family >= 0 && family < kMaxFamilies && pass >= 0 && pass < kMaxPasses && index >= 0 && index < kMaxVariants)
    variant_calls_[family][pass][index].fetch_add(1, std::memory_order_relaxed);
}

void Runtime::uncount_variant(int family, int pass, int index) {
  if (family >= 0 && family < kMaxFamilies && pass >= 0 && pass < kMaxPasses && index >= 0 && index < kMaxVariants)
    variant_calls_[family][pass][index].fetch_sub(1, std::memory_order_relaxed);
}

void Runtime::count_fallback(int family, int pass, Fallback why) {
  if (family >= 0 && family < kMaxFamilies && pass >= 0 && pass < kMaxPasses)
    fallback_calls_[family][pass][static_cast<int>(why)].fetch_add(1, std::memory_order_relaxed);
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
  nlohmann::json ops = nlohmann::json::object();
  for (size_t f = 0; f < families_.size(); ++f) {
    const families::Family& family = *families_[f];
    nlohmann::json calls = nlohmann::json::object(), fallbacks = nlohmann::json::object();
    for (size_t p = 0; p < family.passes.size(); ++p) {
      const std::string pass(family.passes[p]);
      const auto variants = family.variants(pass);
      calls[pass] = nlohmann::json::object();
      fallbacks[pass] = nlohmann::json::object();
      for (size_t i = 0; i < static_cast<size_t>(kMaxVariants); ++i)
        if (const int64_t n = variant_calls_[f][p][i].load(std::memory_order_relaxed))
          calls[pass][i < variants.size() ? variants[i].name : fmt::format("variant #{}", i)] = n;
      int64_t torch = 0;
      for (int r = 0; r < static_cast<int>(Fallback::kCount); ++r)
        if (const int64_t n = fallback_calls_[f][p][r].load(std::memory_order_relaxed)) {
          fallbacks[pass][fallback_name(static_cast<Fallback>(r))] = n;
          torch += n;
        }
      if (torch) calls[pass]["torch"] = torch;
    }
    ops[std::string(family.op)] = {{"title", family.title},
                                   {"keys", table_ ? table_->key_count(family.op) : 0},
                                   {"calls", calls},
                                   {"fallbacks", fallbacks}};
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
                        {"ops", ops}}
      .dump();
}

void Runtime::reset_counts() {
  for (auto& family : variant_calls_)
    for (auto& pass : family)
      for (auto& c : pass) c.store(0, std::memory_order_relaxed);
  for (auto& family : fallback_calls_)
    for (auto& pass : family)
      for (auto& c : pass) c.store(0, std::memory_order_relaxed);
}

}  // namespace hfnn::dispatch
