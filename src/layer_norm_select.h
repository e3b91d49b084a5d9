// Which LayerNorm kernel runs when no tuned table names one: the built-in choice. It is data, not
// rules: bench/layer_norm_sweep.py measures torch and every variant over widths, dtypes and sizes
// on each GPU and writes, per measured point, the variants faster than torch there, fastest first
// (within 2% of the fastest, the one that loses less at the neighbouring measured widths first:
// the point's ranking also answers for the widths between; src/layer_norm_defaults.json, compiled
// into the library). A call takes the ranking of the
// nearest measured point on its GPU (same row alignment, width within 4x) and runs the first
// variant that supports it; torch's kernel where torch ranks first, where no variant of the
// ranking takes the input, where nothing near was measured, and on GPUs of an architecture the
// sweep has not measured (`hfnn tune` measures any GPU, per shape).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/layer_norm/layer_norm.h"

namespace hfnn::layer_norm {

// A ranking entry: a variant's index in the registry's list (fwd_variants() or bwd_variants()),
// or kTorch. Names this build lacks are dropped when the data is read.
inline constexpr int kTorch = -1;

// A measured width answers for widths up to this factor away (on either side), no further.
inline constexpr double kMaxWidthRatio = 4.0;

struct Point {
  kernels::DType dtype = kernels::DType::kFloat32;
  bool backward = false;
  int64_t rows = 0, cols = 0;
  std::vector<int> ranking;  // fastest first; ends at kTorch
};

// One GPU's measurements, indexed for the per-call lookup.
class GpuDefaults {
 public:
  std::string name, compute_capability;
  // The measured point nearest to (rows, cols) for this dtype and pass: among points whose rows
  // have the same alignment in bytes (1, 2, 4, 8 or 16: what decides which kernels vectorize), the
  // nearest cols on a log scale, then the nearest rows. Null when no width of that alignment
  // within kMaxWidthRatio of cols was measured.
  const Point* nearest(kernels::DType dtype, bool backward, int64_t rows, int64_t cols) const;
  void add(Point p);  // keeps the index sorted

 private:
  // [dtype][pass][alignment 1, 2, 4, 8, 16 bytes] -> points sorted by (cols, rows).
  std::array<std::vector<Point>, 30> groups_;
};

// The environment variable naming a file of `bench/layer_norm_sweep.py --defaults` to use instead of
// the compiled-in data.
inline constexpr const char* kDefaultsEnv = "HFNN_LAYER_NORM_DEFAULTS";

class Defaults {
 public:
  // Reads the JSON of `bench/layer_norm_sweep.py --defaults`; `fwd_names` and `bwd_names` map
  // variant names to registry indices (position in the list). Throws std::runtime_error when the
  // text is not such a file.
  static Defaults parse(std::string_view json, const std::vector<std::string>& fwd_names,
                        const std::vector<std::string>& bwd_names);
  // parse() of a file's text; a file that cannot be read or parsed is a std::runtime_error naming
  // kDefaultsEnv, the path and the fix.
  static Defaults from_file(const std::string& path, const std::vector<std::string>& fwd_names,
                            const std::vector<std::string>& bwd_names);
  // The compiled-in data, read once (against this build's registry); the file that kDefaultsEnv
  // names instead, where it is set: a GPU the repository's sweeps never measured gets a built-in
  // choice from its own sweep without a rebuild, and a new sweep is checked before it is compiled in.
  static const Defaults& builtin();
  // The measurements of this GPU: the same name, else of the same compute capability the one whose
  // name shares the longest start with it; null: none.
  const GpuDefaults* for_gpu(std::string_view name, std::string_view compute_capability) const;
  const std::vector<GpuDefaults>& gpus() const { return gpus_; }

 private:
  std::vector<GpuDefaults> gpus_;
};

// The first entry of `ranking` that `accepts` (a registry index), up to kTorch; kTorch when none.
int first_accepted(const std::vector<int>& ranking, const std::function<bool(int)>& accepts);

#if HFNN_WITH_CUDA
// The built-in choice for p on a GPU with these measurements (null: unmeasured): a variant, or
// null for torch's kernel.
const kernels::layer_norm::FwdVariant* default_fwd(const kernels::layer_norm::FwdParams& p, const GpuDefaults* gpu);
const kernels::layer_norm::BwdVariant* default_bwd(const kernels::layer_norm::BwdParams& p, const GpuDefaults* gpu);
#endif

}  // namespace hfnn::layer_norm
