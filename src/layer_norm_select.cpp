#include "src/layer_norm_select.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "kernels/common/dtype.h"

namespace hfnn::layer_norm {

// The compiled-in src/layer_norm_defaults.json (CMake writes it into a generated source).
extern const char kDefaultsJson[];

namespace {

// The row's alignment in bytes, up to 16: what decides which kernels vectorize (ours need 16,
// torch's 16-bit kernels 8), so measurements transfer only between widths of one class.
int alignment_class(kernels::DType dtype, int64_t cols) {
  const int64_t bytes = cols * static_cast<int64_t>(kernels::dtype_size(dtype));
  int a = 1;
  while (a < 16 && bytes % (2 * a) == 0) a *= 2;
  return a;
}

int class_index(int alignment) { return alignment == 16 ? 4 : alignment == 8 ? 3 : alignment == 4 ? 2 : alignment == 2 ? 1 : 0; }

std::size_t group_of(kernels::DType dtype, bool backward, int alignment) {
  return (static_cast<std::size_t>(dtype) * 2 + (backward ? 1 : 0)) * 5 + static_cast<std::size_t>(class_index(alignment));
}

kernels::DType dtype_named(const std::string& name) {
  for (auto d : {kernels::DType::kFloat32, kernels::DType::kFloat16, kernels::DType::kBFloat16})
    if (kernels::dtype_name(d) == name) return d;
  throw std::runtime_error("unknown dtype '" + name + "'");
}

}  // namespace

void GpuDefaults::add(Point p) {
  auto& g = groups_[group_of(p.dtype, p.backward, alignment_class(p.dtype, p.cols))];
  const auto at = std::upper_bound(g.begin(), g.end(), p, [](const Point& a, const Point& b) {
    return a.cols != b.cols ? a.cols < b.cols : a.rows < b.rows;
  });
  g.insert(at, std::move(p));
}

const Point* GpuDefaults::nearest(kernels::DType dtype, bool backward, int64_t rows, int64_t cols) const {
  // Only this width's alignment class: another class runs other kernels (torch's too: its 16-bit
  // kernels vectorize at 8 bytes), so its ranking says nothing here. D = 4,580 in 16-bit took the
  // 8-byte data of D = 500 once, through the next worse class, and ran 4% behind torch.
  const auto& g = groups_[group_of(dtype, backward, alignment_class(dtype, cols))];
  if (g.empty()) return nullptr;
  // The nearest measured width on a log scale (ties to the narrower).
  auto it = std::lower_bound(g.begin(), g.end(), cols, [](const Point& a, int64_t c) { return a.cols < c; });
  int64_t width;
  if (it == g.end()) {
    width = g.back().cols;
  } else if (it == g.begin() || it->cols == cols) {
    width = it->cols;
  } else {
    const int64_t above = it->cols, below = std::prev(it)->cols;
    width = std::log(static_cast<double>(above) / cols) < std::log(static_cast<double>(cols) / below) ? above : below;
  }
  // No measurement within a factor of kMaxWidthRatio: nothing to go by (torch's kernel runs).
  if (std::abs(std::log(static_cast<double>(width) / static_cast<double>(cols))) > std::log(kMaxWidthRatio) + 1e-9)
    return nullptr;
  // Then the nearest row count measured at that width.
  const Point* best = nullptr;
  double best_distance = 0;
  for (auto p = std::lower_bound(g.begin(), g.end(), width, [](const Point& a, int64_t c) { return a.cols < c; });
       p != g.end() && p->cols == width; ++p) {
    const double distance = std::abs(std::log(static_cast<double>(p->rows) / static_cast<double>(rows)));
    if (!best || distance < best_distance) {
      best = &*p;
      best_distance = distance;
    }
  }
  return best;
}

Defaults Defaults::parse(std::string_view json, const std::vector<std::string>& fwd_names,
                         const std::vector<std::string>& bwd_names) {
  Defaults out;
  try {
    const auto doc = nlohmann::json::parse(json);
    for (const auto& gpu : doc.at("gpus")) {
      GpuDefaults g;
      g.name = gpu.at("name").get<std::string>();
      g.compute_capability = gpu.at("compute_capability").get<std::string>();
      for (const auto& pt : gpu.at("points")) {
        Point p;
        p.dtype = dtype_named(pt.at("dtype").get<std::string>());
        const std::string pass = pt.at("pass").get<std::string>();
        if (pass != "fwd" && pass != "bwd") throw std::runtime_error("pass '" + pass + "' is not fwd or bwd");
        p.backward = pass == "bwd";
        p.rows = pt.at("rows").get<int64_t>();
        p.cols = pt.at("cols").get<int64_t>();
        if (p.rows < 1 || p.cols < 1) throw std::runtime_error("a point with rows or cols below 1");
        const auto& names = p.backward ? bwd_names : fwd_names;
        for (const auto& entry : pt.at("ranking")) {
          const std::string name = entry.get<std::string>();
          if (name == "torch") {
            p.ranking.push_back(kTorch);
            break;
          }
          const auto found = std::find(names.begin(), names.end(), name);
          if (found != names.end()) p.ranking.push_back(static_cast<int>(found - names.begin()));
        }
        if (p.ranking.empty() || p.ranking.back() != kTorch) p.ranking.push_back(kTorch);
        g.add(std::move(p));
      }
      out.gpus_.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("layer_norm defaults: ") + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("layer_norm defaults: ") + e.what());
  }
  return out;
}

const GpuDefaults* Defaults::for_gpu(std::string_view name, std::string_view compute_capability) const {
  for (const auto& g : gpus_)
    if (g.name == name) return &g;
  // Same architecture: the model whose name shares the longest start with this one (an "NVIDIA
  // H100 PCIe" takes the H100's data before the H200's), the first measured on a tie.
  const GpuDefaults* best = nullptr;
  std::size_t best_common = 0;
  for (const auto& g : gpus_) {
    if (g.compute_capability != compute_capability) continue;
    const auto common = static_cast<std::size_t>(
        std::mismatch(g.name.begin(), g.name.end(), name.begin(), name.end()).first - g.name.begin());
    if (!best || common > best_common) {
      best = &g;
      best_common = common;
    }
  }
  return best;
}

int first_accepted(const std::vector<int>& ranking, const std::function<bool(int)>& accepts) {
  for (const int index : ranking) {
    if (index == kTorch) return kTorch;
    if (accepts(index)) return index;
  }
  return kTorch;
}

Defaults Defaults::from_file(const std::string& path, const std::vector<std::string>& fwd_names,
                             const std::vector<std::string>& bwd_names) {
  const std::string fix =
      "; point it at a file written by `bench/layer_norm_sweep.py --defaults OUT SWEEP...`, or unset it "
      "for the compiled-in data";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(kDefaultsEnv) + "=" + path + ": cannot read it (" + std::strerror(errno) + ")" + fix);
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return parse(text.str(), fwd_names, bwd_names);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(kDefaultsEnv) + "=" + path + ": " + e.what() + fix);
  }
}

const Defaults& Defaults::builtin() {
  static const Defaults d = [] {
    std::vector<std::string> fwd, bwd;
#if HFNN_WITH_CUDA
    for (const auto& v : kernels::layer_norm::fwd_variants()) fwd.emplace_back(v.name);
    for (const auto& v : kernels::layer_norm::bwd_variants()) bwd.emplace_back(v.name);
#endif
    const char* path = std::getenv(kDefaultsEnv);
    if (path && *path) return from_file(path, fwd, bwd);
    return parse(kDefaultsJson, fwd, bwd);
  }();
  return d;
}

#if HFNN_WITH_CUDA
namespace k = kernels::layer_norm;

const k::FwdVariant* default_fwd(const k::FwdParams& p, const GpuDefaults* gpu) {
  const Point* point = gpu ? gpu->nearest(p.dtype, false, p.rows, p.cols) : nullptr;
  if (!point) return nullptr;
  const auto all = k::fwd_variants();
  const int index = first_accepted(point->ranking, [&](int i) { return all[static_cast<std::size_t>(i)].supports(p); });
  return index == kTorch ? nullptr : &all[static_cast<std::size_t>(index)];
}

const k::BwdVariant* default_bwd(const k::BwdParams& p, const GpuDefaults* gpu) {
  const Point* point = gpu ? gpu->nearest(p.dtype, true, p.rows, p.cols) : nullptr;
  if (!point) return nullptr;
  const auto all = k::bwd_variants();
  const int index = first_accepted(point->ranking, [&](int i) { return all[static_cast<std::size_t>(i)].supports(p); });
  return index == kTorch ? nullptr : &all[static_cast<std::size_t>(index)];
}
#endif

}  // namespace hfnn::layer_norm
