// `hfnn variants`: the kernel variants this build holds, with the one-line idea behind each.
#include <fmt/core.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "hfnn/version.h"
#include "kernels/common/family.h"

namespace hfnn::cli {
namespace {

struct Row {
  std::string op, pass, name, idea;
};

std::vector<Row> variant_rows() {
  std::vector<Row> rows;
  for (const families::Family* f : families::all())
    for (const std::string_view pass : f->passes)
      for (const auto& v : f->variants(pass)) rows.push_back({std::string(f->op), std::string(pass), v.name, v.idea});
  return rows;
}

}  // namespace

void setup_variants(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<VariantsOptions>();
  auto* sub = app.add_subcommand("variants", "List the CUDA kernel variants in this build (the candidates `hfnn tune` times)");
  sub->add_flag("--json", options->json, "Print a JSON array instead of a table");
  sub->callback([options, &exit_code]() { exit_code = run_variants(*options); });
}

int run_variants(const VariantsOptions& options) {
  const auto rows = variant_rows();
  if (options.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : rows) out.push_back({{"op", r.op}, {"pass", r.pass}, {"name", r.name}, {"idea", r.idea}});
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  if (rows.empty()) {
    fmt::print("This build of hfnn has no CUDA kernels (it was built without a CUDA Toolkit): every op runs torch's kernel.\n"
               "Rebuild with the CUDA Toolkit installed (nvcc on PATH) to get them.\n");
    return 0;
  }
  fmt::print("{:<11} {:<4} {:<18} {}\n", "op", "pass", "variant", "idea");
  for (const auto& r : rows) fmt::print("{:<11} {:<4} {:<18} {}\n", r.op, r.pass, r.name, r.idea);
  fmt::print("\nBuilt for CUDA architectures {}.\n", HFNN_CUDA_ARCHITECTURES);
  return 0;
}

}  // namespace hfnn::cli
