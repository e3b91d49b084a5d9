// `hfnn report`: a profile run from the database, as text or JSON.
#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "profiles/db.h"
#include "profiles/report.h"
#include "tuner/tune_db.h"

namespace hfnn::cli {

void setup_report(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ReportOptions>();
  auto* sub = app.add_subcommand("report", "Show a profile run from the database (by default the newest):\n"
                                           "  hfnn report                          text in the terminal\n"
                                           "  hfnn report --format html -o run.html   one self-contained page for a browser\n"
                                           "  hfnn report --format json|csv           the same for scripts");
  sub->add_option("--db", o->db, "Database written by `hfnn profile`")->capture_default_str();
  sub->add_option("--run", o->run, "Run id (0: the newest)")->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--format", o->format, "Output format")->capture_default_str()->check(CLI::IsMember({"text", "json", "csv", "html"}));
  sub->add_option("-o,--output", o->output, "Write to this file instead of the terminal");
  sub->callback([o, &exit_code]() { exit_code = run_report(*o); });
}

int run_report(const ReportOptions& o) {
  try {
    profiles::Database db(o.db, false);
    if (db.latest_run() == 0) {
      fmt::print(stderr, "hfnn report: {} holds no runs yet (run `hfnn profile` first)\n", o.db);
      return 1;
    }
    // The tune section and the advice's view of hfnn tune come from one read of the tuner's tables.
    nlohmann::json tune;
    auto report = profiles::report_json(db, o.run, 15, [&tune](profiles::Database& d, int64_t run) {
      return tuner::tune_facts(d, run, &tune);
    });
    report["tune"] = tune;
    const std::string text = o.format == "json"   ? report.dump(2) + "\n"
                             : o.format == "csv"  ? profiles::report_csv(report)
                             : o.format == "html" ? profiles::report_html(report)
                                                  : profiles::report_text(report);
    if (o.output.empty()) {
      fmt::print("{}", text);
      return 0;
    }
    const std::string tmp = o.output + ".tmp";
    {
      std::ofstream out(tmp);
      out << text;
      if (!out) {
        fmt::print(stderr, "hfnn report: cannot write {} (check the folder exists and is writable)\n", o.output);
        std::remove(tmp.c_str());
        return 1;
      }
    }
    if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
      fmt::print(stderr, "hfnn report: cannot write {} (check the folder is writable)\n", o.output);
      std::remove(tmp.c_str());
      return 1;
    }
    return 0;
  } catch (const profiles::DbError& e) {
    fmt::print(stderr, "hfnn report: {}\n", e.what());
    return 2;
  }
}

}  // namespace hfnn::cli
