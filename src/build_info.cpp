// hfnn::build_info(): what this build of the op library holds, as JSON (version, CUDA
// architectures, the kernel variants), so Python and the tests ask the library instead of guessing.
#include <torch/library.h>

#include <nlohmann/json.hpp>
#include <string>

#include "hfnn/version.h"
#include "kernels/layer_norm/layer_norm.h"

namespace hfnn {
namespace {

std::string build_info() {
  nlohmann::json info;
  info["version"] = HFNN_VERSION;
  nlohmann::json fwd = nlohmann::json::array(), bwd = nlohmann::json::array();
#if HFNN_WITH_CUDA && HFNN_TORCH_CUDA
  info["cuda_kernels"] = true;
  info["cuda_architectures"] = HFNN_CUDA_ARCHITECTURES;
  for (const auto& v : kernels::layer_norm::fwd_variants()) fwd.push_back(std::string(v.name));
  for (const auto& v : kernels::layer_norm::bwd_variants()) bwd.push_back(std::string(v.name));
#else
  info["cuda_kernels"] = false;
  info["cuda_architectures"] = "";
#endif
  info["variants"] = {{"layer_norm", {{"fwd", fwd}, {"bwd", bwd}}}};
  return info.dump();
}

}  // namespace
}  // namespace hfnn

TORCH_LIBRARY_FRAGMENT(hfnn, m) {
  m.def("build_info() -> str");
  m.impl("build_info", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(hfnn::build_info));
}
