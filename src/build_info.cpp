// hfnn::build_info(): what this build of the op library holds, as JSON (version, CUDA
// architectures, the kernel variants), so Python and the tests ask the library instead of guessing.
#include <torch/library.h>

#include <nlohmann/json.hpp>
#include <string>

#include "hfnn/version.h"
#include "kernels/common/family.h"

namespace hfnn {
namespace {

std::string build_info() {
  nlohmann::json info;
  info["version"] = HFNN_VERSION;
#if HFNN_WITH_CUDA && HFNN_TORCH_CUDA
  constexpr bool kKernels = true;
  info["cuda_architectures"] = HFNN_CUDA_ARCHITECTURES;
#else
  constexpr bool kKernels = false;
  info["cuda_architectures"] = "";
#endif
  info["cuda_kernels"] = kKernels;
  // {op: {pass: [variant names]}} for every family, empty lists where the kernels are not built.
  info["variants"] = nlohmann::json::object();
  for (const families::Family* f : families::all()) {
    nlohmann::json passes = nlohmann::json::object();
    for (const std::string_view pass : f->passes) {
      nlohmann::json names = nlohmann::json::array();
      if (kKernels)
        for (const auto& v : f->variants(pass)) names.push_back(v.name);
      passes[std::string(pass)] = names;
    }
    info["variants"][std::string(f->op)] = passes;
  }
  return info.dump();
}

}  // namespace
}  // namespace hfnn

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def("build_info() -> str");
  m.impl("build_info", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(hfnn::build_info));
}
