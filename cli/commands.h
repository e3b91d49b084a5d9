// The hfnn subcommands. Each is an options struct, a setup_x(CLI::App&, int& exit_code) that
// declares its options and, when the subcommand is given, stores run_x's result in exit_code, and
// a run_x(const Options&) that does the work; main.cpp only wires them together.
#pragma once
#include <CLI/CLI.hpp>

namespace hfnn::cli {

struct VariantsOptions {
  bool json = false;
};
void setup_variants(CLI::App& app, int& exit_code);
int run_variants(const VariantsOptions& options);

}  // namespace hfnn::cli
