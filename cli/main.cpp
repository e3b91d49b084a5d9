// The hfnn executable: wires the subcommands (one file each) into one CLI11 app.
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "hfnn/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "hfnn: profile a PyTorch training script, tune kernels for the shapes it really uses, and train with the winners.\n"
      "\n"
      "  hfnn profile train.py ...  run a training script under the profiler; writes shapes.db and a report\n"
      "  hfnn tune                  measure torch and hfnn's kernels on the recorded shapes; store the winners\n"
      "  HFNN_DISPATCH_DB=shapes.db python train.py   train with the winners (also under torchrun)\n"
      "  hfnn report                show a profile run again, with what tune found (text, HTML, JSON, CSV)\n"
      "  hfnn variants              list the CUDA kernel variants in this build\n"
      "\n"
      "In Python, hfnn.to_hfnn(model) swaps every nn.LayerNorm for hfnn's kernels and hfnn.to_torch(model)\n"
      "swaps back. Run `hfnn <command> --help` for a command's options.",
      "hfnn"};
  app.set_version_flag("--version", fmt::format("hfnn {}", HFNN_VERSION));
  // Bad input: one line naming what was wrong and where to look, then a non-zero exit.
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    return fmt::format("{}: {} (see `{} --help`)\n", failed->get_name(), e.what(), failed->get_name());
  });
  app.require_subcommand(0, 1);
  int exit_code = 0;
  std::vector<std::string> command_after_dashes;
  CLI::App* profile = hfnn::cli::setup_profile(app, exit_code, command_after_dashes);
  hfnn::cli::setup_tune(app, exit_code);
  hfnn::cli::setup_report(app, exit_code);
  hfnn::cli::setup_variants(app, exit_code);

  // `hfnn profile [options] -- <command>`: CLI11 would hand what follows -- to the top-level app,
  // so it is cut off here, but only when -- comes before the script (after it, -- is the script's).
  std::vector<std::string> args(argv + 1, argv + argc);
  if (auto it = std::find(args.begin(), args.end(), "profile"); it != args.end()) {
    for (++it; it != args.end(); ++it) {
      if (*it == "--") {
        command_after_dashes.assign(it + 1, args.end());
        args.erase(it, args.end());
        break;
      }
      if (it->empty() || (*it)[0] != '-') break;  // the script: the rest is its own
      const CLI::Option* opt = profile->get_option_no_throw(it->substr(0, it->find('=')));
      if (opt && opt->get_expected_max() > 0 && it->find('=') == std::string::npos && it + 1 != args.end()) ++it;
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments as a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too, with 0; a usage error exits 2, as command-line tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (app.get_subcommands().empty()) fmt::print("{}", app.help());
  return exit_code;
}
