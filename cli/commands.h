// The hfnn subcommands. Each is an options struct, a setup_x(CLI::App&) that declares its options
// and a run_x(const Options&) that does the work; main.cpp only wires them together.
#pragma once
#include <CLI/CLI.hpp>

namespace hfnn::cli {

struct VariantsOptions {
  bool json = false;
};
void setup_variants(CLI::App& app);
int run_variants(const VariantsOptions& options);

}  // namespace hfnn::cli
