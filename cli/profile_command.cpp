// `hfnn profile`: runs a training script (or any command) with hfnn's collector in every Python
// process it starts, merges what they recorded into the SQLite database, prints the report.
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "profiles/db.h"
#include "profiles/report.h"
#include "tuner/tune_db.h"

namespace hfnn::cli {
namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_child = 0;

void forward_signal(int signum) {
  if (g_child > 0) kill(g_child, signum);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string python_for(const ProfileOptions& o) { return default_python(o.python); }

bool on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// Runs argv with the collector switched on; returns its exit code (128 + signal if killed).
int run_child(const std::vector<std::string>& argv, const ProfileOptions& o, const fs::path& parts) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("hfnn profile: cannot start {} (fork failed)", argv[0]));
  if (pid == 0) {
    setenv("HFNN_PROFILE_DIR", parts.c_str(), 1);
    setenv("HFNN_PROFILE_WARMUP", std::to_string(o.warmup).c_str(), 1);
    setenv("HFNN_PROFILE_STEPS", std::to_string(o.steps).c_str(), 1);
    setenv("HFNN_PROFILE_PLAIN_STEPS", std::to_string(o.plain_steps).c_str(), 1);
    setenv("HFNN_PROFILE_SAMPLE", std::to_string(o.sample).c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    fmt::print(stderr, "hfnn profile: cannot run {}: {}\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  // Ctrl-C reaches the child through the terminal; the profile is still merged after it exits.
  g_child = pid;
  struct sigaction ignore = {}, forward = {}, old_int = {}, old_quit = {}, old_term = {}, old_hup = {};
  ignore.sa_handler = SIG_IGN;
  forward.sa_handler = forward_signal;
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGHUP, &forward, &old_hup);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  g_child = 0;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::vector<nlohmann::json> read_parts(const fs::path& dir) {
  std::vector<nlohmann::json> parts;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    try {
      auto j = nlohmann::json::parse(in);
      if (j.value("format", "") == "hfnn-profile-part") parts.push_back(std::move(j));
    } catch (const nlohmann::json::exception&) {
      fmt::print(stderr, "hfnn profile: skipped an unreadable part {}\n", entry.path().filename().string());
    }
  }
  return parts;
}

// What the messages call the command: its first .py file (`train.py` also in `-- torchrun ...
// train.py`), else its program.
std::string script_name(const std::vector<std::string>& command) {
  for (const auto& word : command)
    if (word.size() > 3 && word.compare(word.size() - 3, 3, ".py") == 0) return fs::path(word).filename().string();
  return fs::path(command[0]).filename().string();
}

// The steps a run saw when every one of them fell inside --warmup (no process recorded a step, and
// one saw at least one): the warm-up cleared what they did, and what ran after the last (the loop's
// tail: zero_grad, evaluation, saving) is no step's profile. nullopt otherwise, also for a command
// without steps at all, which is recorded whole.
std::optional<int64_t> all_steps_in_warmup(const std::vector<nlohmann::json>& parts) {
  int64_t seen = 0;
  for (const auto& part : parts) {
    if (!part.value("step_ms", nlohmann::json::array()).empty()) return std::nullopt;
    seen = std::max(seen, part.value("step_boundaries", int64_t{0}));
  }
  if (seen == 0) return std::nullopt;
  return seen;
}

struct TempDir {
  fs::path path;
  TempDir() {
    const fs::path base = fs::temp_directory_path();
    std::string templ = (base / "hfnn-profile-XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("hfnn profile: cannot create a folder under " + base.string());
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

CLI::App* setup_profile(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes) {
  auto o = std::make_shared<ProfileOptions>();
  auto* sub = app.add_subcommand(
      "profile",
      "Run a training script under hfnn's profiler and add what it measured to a database:\n"
      "  hfnn profile train.py --lr 3e-4        a Python script, with its arguments\n"
      "  hfnn profile -- torchrun --nproc_per_node 2 train.py   any command (every Python process in it)\n"
      "Records per-op time, step times and the input shapes of the ops hfnn accelerates; prints a report.");
  sub->add_option("--db", o->db, "Database file to add the run to (created if missing)")->capture_default_str();
  sub->add_option("--warmup", o->warmup,
                  "Steps to skip before recording (first-step costs: lazy init, autotuning). A step ends at each "
                  "optimizer.step() of a torch.optim optimizer, seen without code changes (two optimizers: two steps "
                  "an iteration), or at hfnn.step() in loops without one. A script without steps is recorded whole; "
                  "one with no more steps than --warmup records nothing (an error)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--steps", o->steps,
                  "Steps to record (under --sample N, every N-th of them in full), then the script runs on untouched "
                  "(0: until it ends)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--sample", o->sample,
                  "Of the steps after --warmup, record every N-th in full (the 1st, the N+1-th, the 2N+1-th, ...) "
                  "and only time the others, which run with no op callbacks and no CUDA activity, so the profiler "
                  "costs about 1/N of a full recording: for long runs that keep it on (--steps 0). --steps counts "
                  "every step, recorded or not (--steps 30 --sample 10: 3 recorded). Op, kernel, shape and step "
                  "figures are the recorded steps' only; the reports say how many those were and the median of "
                  "the steps between, which with --steps 0 is the plain step. The device is drained after each "
                  "recorded step, so its kernels are complete (1: every step in full)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--plain-steps", o->plain_steps,
                  "Steps to time after the recorded ones with every collection off (no op callbacks, no CUDA "
                  "activity), after one step left out for the profiler's tear-down: their median is the plain step, "
                  "against which the reports state what the profiler cost this run, and take the GPU's busy share, "
                  "the advice and hfnn tune's projection (0: none; then, or when the script ends first, they use the "
                  "step under the profiler and say so). Needs --steps above 0 and a script that runs --warmup + "
                  "--steps + 1 + --plain-steps steps")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--report", o->report, "Report at the end: printed (text, json), or html: a page next to --db")->capture_default_str()->check(
      CLI::IsMember({"text", "html", "json", "none"}));
  sub->add_flag("--quiet,-q", o->quiet, "Print only where the run was written");
  sub->add_option("--python", o->python, "Python for a .py script (default: the one hfnn is installed in)");
  // No positional is declared: the first one stops hfnn's parsing (prefix_command), so everything
  // from the script on, options included, belongs to the script.
  sub->prefix_command();
  sub->footer(
      "The script and its arguments come last: hfnn's own options go before it.\n"
      "Exit status: the script's, also when it fails or is interrupted (what it recorded is kept); 1 when it "
      "succeeded but nothing was recorded (no Python process with hfnn ran torch ops, or every step fell inside "
      "--warmup; --db is left unchanged) or the database could not be written; 2 when the options, the script or "
      "--db are wrong (the script does not run).");
  sub->callback([o, sub, &command_after_dashes, &exit_code]() {
    o->command = sub->remaining();
    if (o->command.empty()) o->command = command_after_dashes;
    exit_code = run_profile(*o);
  });
  return sub;
}

int run_profile(const ProfileOptions& o) {
  std::vector<std::string> argv = o.command;
  if (argv.empty()) {
    fmt::print(stderr, "hfnn profile: no script or command given (see `hfnn profile --help`)\n");
    return 2;
  }
  const bool is_script = argv[0].size() > 3 && argv[0].substr(argv[0].size() - 3) == ".py";
  if (is_script) {
    if (!fs::is_regular_file(argv[0])) {
      fmt::print(stderr, "hfnn profile: {}: no such script (give the path of your training script)\n", argv[0]);
      return 2;
    }
    argv.insert(argv.begin(), python_for(o));
  }
  if (!on_path(argv[0])) {
    fmt::print(stderr, "hfnn profile: {}: command not found (check the name, or pass --python)\n", argv[0]);
    return 2;
  }
  // A bad --db fails before the script runs, and is left untouched.
  try {
    if (fs::exists(o.db)) profiles::Database check(o.db, false);
  } catch (const profiles::DbError& e) {
    fmt::print(stderr, "hfnn profile: {}\n", e.what());
    return 2;
  }

  TempDir parts;
  profiles::RunInfo info;
  info.command = join(o.command);
  info.started_at = utc_now();
  info.warmup = o.warmup;
  info.steps_requested = o.steps;
  info.plain_steps_requested = o.plain_steps;
  info.sample_every = o.sample;
  info.exit_code = run_child(argv, o, parts.path);
  info.finished_at = utc_now();

  // Nothing recorded is an error of its own (1) when the script succeeded: an empty profile would
  // leave `hfnn tune` nothing to do without saying why. A failed script keeps its own exit code.
  const int nothing_recorded = info.exit_code != 0 ? info.exit_code : 1;
  const auto collected = read_parts(parts.path);
  if (collected.empty()) {
    fmt::print(stderr,
               "hfnn profile: nothing was recorded: the command ran no torch ops in a Python with hfnn installed "
               "({}); {} is unchanged\n",
               is_script ? argv[0] : "check `python3 -c \"import hfnn\"`", o.db);
    return nothing_recorded;
  }
  if (const auto warm = all_steps_in_warmup(collected)) {
    fmt::print(stderr,
               "hfnn profile: {} ran {} step{}, all inside --warmup {}: nothing recorded; run more steps or pass "
               "--warmup 0 ({} is unchanged)\n",
               script_name(o.command), *warm, *warm == 1 ? "" : "s", o.warmup, o.db);
    return nothing_recorded;
  }
  try {
    profiles::Database db(o.db, true);
    const int64_t run = db.add_run(info, collected);
    // The advice names the keys hfnn tune would time, with its projection where this database holds
    // results for them (tuned before, on the same GPU).
    const profiles::TuneFactsOf tune_facts = [](profiles::Database& d, int64_t id) { return tuner::tune_facts(d, id); };
    if (o.quiet || o.report == "none") {
      fmt::print("hfnn profile: run {} added to {}\n", run, o.db);
    } else if (o.report == "html") {
      const auto page = fs::path(o.db).replace_extension("").string() + "-run" + std::to_string(run) + ".html";
      const std::string tmp = page + ".tmp";  // written whole, then renamed: never half a page
      bool written = false;
      {
        std::ofstream out(tmp);
        out << profiles::report_html(profiles::report_json(db, run, 15, tune_facts));
        written = static_cast<bool>(out);
      }
      std::error_code ec;
      if (written) fs::rename(tmp, page, ec);
      if (!written || ec) {
        fs::remove(tmp, ec);
        fmt::print(stderr, "hfnn profile: run {} added to {}, but {} could not be written (check the folder); "
                   "`hfnn report --format html -o FILE` writes it elsewhere\n", run, o.db, page);
      } else {
        fmt::print("\nhfnn profile: run {} added to {}; report: {}\n", run, o.db, page);
      }
    } else {
      const auto report = profiles::report_json(db, run, 15, tune_facts);
      fmt::print("\n{}", o.report == "json" ? report.dump(2) + "\n" : profiles::report_text(report));
      fmt::print("\nRun {} added to {} ({} process{}).\n", run, o.db, collected.size(), collected.size() == 1 ? "" : "es");
    }
  } catch (const profiles::DbError& e) {
    fmt::print(stderr, "hfnn profile: {}\n", e.what());
    return info.exit_code != 0 ? info.exit_code : 1;
  }
  return info.exit_code;
}

}  // namespace hfnn::cli
