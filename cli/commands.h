// The hfnn subcommands. Each is an options struct, a setup_x(CLI::App&, int& exit_code) that
// declares its options and, when the subcommand is given, stores run_x's result in exit_code, and
// a run_x(const Options&) that does the work; main.cpp only wires them together.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace hfnn::cli {

// The Python hfnn runs scripts and its tune worker with: `explicit_python` (--python) when given,
// then $HFNN_PYTHON, then the python3 next to this executable (the environment hfnn was installed
// into), then python3 on PATH.
std::string default_python(const std::string& explicit_python);

struct VariantsOptions {
  bool json = false;
};
void setup_variants(CLI::App& app, int& exit_code);
int run_variants(const VariantsOptions& options);

struct ProfileOptions {
  std::string db = "shapes.db";
  int warmup = 2;
  int steps = 10;
  int plain_steps = 10;
  int sample = 1;
  std::string report = "text";
  bool quiet = false;
  std::string python;
  std::vector<std::string> command;
};
// `command_after_dashes`: what followed `--` on the command line (main.cpp cuts it off).
CLI::App* setup_profile(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes);
int run_profile(const ProfileOptions& options);

struct ReportOptions {
  std::string db = "shapes.db";
  int64_t run = 0;
  std::string format = "text";
  std::string output;
};
void setup_report(CLI::App& app, int& exit_code);
int run_report(const ReportOptions& options);

struct TuneOptions {
  std::string db = "shapes.db";
  int64_t run = 0;
  std::vector<std::string> ops;
  int top = 0;
  double min_share = 0;
  double budget = 0;
  double seconds_per_key = 1.5;
  bool force = false;
  bool dry_run = false;
  int device = 0;
  bool quiet = false;
  std::string python;
};
void setup_tune(CLI::App& app, int& exit_code);
int run_tune(const TuneOptions& options);

}  // namespace hfnn::cli
