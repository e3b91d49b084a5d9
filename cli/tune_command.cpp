// `hfnn tune`: for every tunable shape a profile run recorded, measure torch and every hfnn variant
// on this GPU, gate them against float64, store every result and the winners, print the table
// and the projected gain. The measuring runs in a Python worker (python/hfnn/_tune_worker.py, the
// only part that needs torch and the GPU); judging and storing happen here (tuner/).
#include <errno.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "kernels/common/family.h"
#include "profiles/db.h"
#include "profiles/report.h"
#include "tuner/tune_db.h"
#include "tuner/tuner.h"

namespace hfnn::cli {
namespace {

volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

// The tune worker as a child process speaking JSON lines over two pipes.
class Worker {
 public:
  // argv: the command; env HFNN_TUNE_DEVICE is set for it.
  explicit Worker(const std::vector<std::string>& argv, int device) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0) throw std::runtime_error("cannot create a pipe to the tune worker");
    if (pipe(from_child) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      throw std::runtime_error("cannot create a pipe from the tune worker");
    }
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("cannot fork");
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[0]);
      close(to_child[1]);
      close(from_child[0]);
      close(from_child[1]);
      setenv("HFNN_TUNE_DEVICE", std::to_string(device).c_str(), 1);
      unsetenv("HFNN_PROFILE_DIR");  // never profile the tuner
      unsetenv("HFNN_DISPATCH_DB");  // torch's kernel must be torch's while it is measured
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "hfnn tune: cannot run %s (pass --python, or set HFNN_PYTHON)\n", args[0]);
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
  }
  // Closing its stdin ends the worker's loop; one that does not end (stuck in a CUDA call) is
  // stopped, never left running on the GPU.
  ~Worker() {
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
    if (pid_ <= 0) return;
    const auto reap_within = [&](int ms) {
      for (int waited = 0; waited <= ms; waited += 20) {
        int status = 0;
        const pid_t r = waitpid(pid_, &status, WNOHANG);
        if (r == pid_ || (r < 0 && errno != EINTR)) return true;
        usleep(20'000);
      }
      return false;
    };
    if (reap_within(10'000)) return;
    kill(pid_, SIGTERM);
    if (reap_within(3'000)) return;
    kill(pid_, SIGKILL);
    reap_within(3'000);
  }
  bool send(const nlohmann::json& j) {
    const std::string line = j.dump() + "\n";
    return std::fwrite(line.data(), 1, line.size(), in_) == line.size() && std::fflush(in_) == 0;
  }
  // The next JSON line; nullopt when the worker has gone.
  std::optional<nlohmann::json> receive() {
    std::string line;
    char buf[65536];
    while (std::fgets(buf, sizeof buf, out_)) {
      line += buf;
      if (!line.empty() && line.back() == '\n') break;
    }
    if (line.empty()) return std::nullopt;
    try {
      return nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      return nlohmann::json{{"error", "the tune worker wrote something that is not JSON: " + line.substr(0, 120)}};
    }
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

std::vector<std::string> worker_command(const TuneOptions& o) {
  // HFNN_TUNE_WORKER: a stand-in worker script (the tests use one to drive this command on a CPU).
  if (const char* w = std::getenv("HFNN_TUNE_WORKER"); w && *w) return {default_python(o.python), w};
  return {default_python(o.python), "-m", "hfnn._tune_worker"};
}

std::string seconds_text(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  return fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
}

// The passes of its family the profile saw for a key: forward always, backward when it ran.
std::vector<std::string> passes_of(const tuner::ProfiledKey& k) {
  std::vector<std::string> p;
  const families::Family* family = families::find(k.op);
  if (!family) return p;
  for (const std::string_view pass : family->passes)
    if (pass == "bwd" ? k.bwd_calls > 0 : k.fwd_calls > 0) p.emplace_back(pass);
  return p;
}

// "3 LayerNorm key(s)", per family with keys, joined: what the run has to tune.
std::string keys_text(const std::vector<tuner::ProfiledKey>& keys) {
  std::string out;
  for (const families::Family* f : families::all()) {
    const auto n = std::count_if(keys.begin(), keys.end(), [&](const tuner::ProfiledKey& k) { return k.op == f->op; });
    if (n > 0) out += fmt::format("{}{} {} key(s)", out.empty() ? "" : ", ", n, f->title);
  }
  return out.empty() ? "no tunable key" : out;
}

std::vector<tuner::PassResult> judge_response(const nlohmann::json& r, const families::Family& family,
                                              const std::string& dtype, const std::vector<std::string>& passes) {
  std::vector<tuner::PassResult> out;
  for (const auto& pass : passes) {
    tuner::PassResult p;
    p.pass = pass;
    for (const auto& c : r.value("candidates", nlohmann::json::array())) {
      if (c.value("pass", "") != pass) continue;
      tuner::Candidate cand;
      cand.name = c.value("name", "");
      cand.ran = c.value("ran", true);
      cand.error = c.value("error", "");
      if (cand.ran) {
        cand.timing = tuner::summarize(c.value("samples_us", std::vector<double>{}));
        cand.max_error = c.contains("max_error") && c["max_error"].is_number() ? c["max_error"].get<double>() : NAN;
      }
      p.candidates.push_back(cand);
    }
    if (p.candidates.empty()) continue;
    p.choice = tuner::judge(p.candidates, family.tolerance(dtype));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

void setup_tune(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<TuneOptions>();
  auto* sub = app.add_subcommand(
      "tune",
      "Measure torch and every hfnn kernel variant on the shapes a profile recorded, on this GPU, and store the\n"
      "winners (used by HFNN_DISPATCH_DB=shapes.db python train.py):\n"
      "  hfnn tune                      tune the newest profile run in shapes.db\n"
      "  hfnn tune --dry-run            list what would be tuned, and how long it would take\n"
      "  hfnn tune --top 5 --budget 60  the five largest shapes, at most a minute\n"
      "Each candidate's outputs and gradients are checked against a float64 reference; a wrong one never wins.\n"
      "A variant must beat torch by more than the measured noise (at least 3%), or torch stays the choice.\n"
      "Results are keyed by GPU, CUDA, torch and hfnn versions; a second run skips what is tuned (--force redoes it).");
  sub->add_option("--db", o->db, "Database written by `hfnn profile` (the results go into it too)")->capture_default_str();
  sub->add_option("--run", o->run, "Profile run whose shapes to tune (0: the newest)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--ops", o->ops,
                  fmt::format("Ops to tune, as `hfnn report` names them (default: every op hfnn has variants for: {})",
                              families::op_names()));
  sub->add_option("--top", o->top, "Tune only the N keys with the largest share of time (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--min-share", o->min_share, "Skip keys under this share of the step, in percent: of the plain step (timed without the profiler) where the run has one, else of its GPU busy time (wall time in a profile without CUDA activity)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--budget", o->budget, "Stop starting new keys after this many seconds (0: no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seconds-per-key", o->seconds_per_key, "Measuring time one key may take")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  sub->add_flag("--force", o->force, "Tune again keys already tuned for this GPU and these versions");
  sub->add_flag("--dry-run", o->dry_run, "List the keys that would be tuned and the time it would take; no GPU needed");
  sub->add_option("--device", o->device, "CUDA device index to tune on")->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_flag("-q,--quiet", o->quiet, "No progress lines, only the table");
  sub->add_option("--python", o->python, "Python with torch and hfnn for the measuring worker (default: hfnn's own)");
  sub->callback([o, &exit_code]() { exit_code = run_tune(*o); });
}

int run_tune(const TuneOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  for (const auto& op : o.ops)
    if (!families::find(op)) {
      fmt::print(stderr, "hfnn tune: --ops {}: hfnn has no kernel variants for {} yet (tunable: {})\n", op, op,
                 families::op_names());
      return 2;
    }
  // Read everything first, read-only: a failure below (no GPU, no worker) leaves the file as it was.
  tuner::ProfiledRun run;
  try {
    profiles::Database db(o.db, profiles::Database::ReadOnly{});
    run = tuner::load_profiled_run(db, o.run);
  } catch (const profiles::DbError& e) {
    fmt::print(stderr, "hfnn tune: {}\n", e.what());
    return 2;
  }
  std::vector<tuner::ProfiledKey> todo;
  for (const auto& k : run.keys) {
    if (!o.ops.empty() && std::find(o.ops.begin(), o.ops.end(), k.op) == o.ops.end()) continue;
    if (k.share_pct < o.min_share) continue;
    if (o.top > 0 && static_cast<int>(todo.size()) >= o.top) break;
    todo.push_back(k);
  }
  if (!o.quiet) {
    fmt::print("Run {} ({}): {} from {} step(s) x {} rank(s), times on {}; tuning {}\n", run.id, run.command,
               keys_text(run.keys), run.steps, run.ranks, run.time_basis == "cuda" ? "the GPU" : "the CPU",
               todo.size());
    for (const auto& [op, n] : run.untunable)
      fmt::print("  {}: {} shape(s) recorded; hfnn has no variants for {} yet, so torch keeps them\n", op, n, op);
  }
  if (run.keys.empty()) {
    fmt::print("Nothing to tune: run {} recorded no calls of an op hfnn has variants for ({}; see `hfnn report --db "
               "{}`)\n",
               run.id, families::op_names(), o.db);
    return 0;
  }
  if (o.dry_run) {
    auto label = [](const tuner::ProfiledKey& k) {
      const families::Family* family = families::find(k.op);
      return fmt::format("{} {} ({})", family->title, family->key_label(k.key), family->key_header);
    };
    size_t kw = 36;  // as wide as the longest label
    for (const auto& k : todo) kw = std::max(kw, label(k).size());
    fmt::print("  {:<4} {:<{}} {:<9} {:>8} {:>7}  {:<8} {}\n", "#", "key", kw, "dtype", "Run%", "share", "passes",
               "shapes");
    int i = 0;
    for (const auto& k : todo) {
      std::string passes;
      for (const auto& p : passes_of(k)) passes += (passes.empty() ? "" : "+") + p;
      std::string shapes;
      for (const auto& s : k.shapes) shapes += (shapes.empty() ? "" : " ") + s;
      fmt::print("  {:<4} {:<{}} {:<9} {:>7.2f}% {:>6.1f}%  {:<8} {}\n", ++i, label(k), kw, k.dtype, k.run_pct,
                 k.share_pct, passes, shapes);
    }
    double total = todo.size() * (o.seconds_per_key + 0.5);
    if (o.budget > 0) total = std::min(total, o.budget);
    fmt::print("Would tune {} key(s) in about {} ({}s of measuring per key, plus start-up); keys already tuned for the\n"
               "GPU and versions found at run time are skipped unless --force.\n",
               todo.size(), seconds_text(total + 5), o.seconds_per_key);
    return 0;
  }

  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: a read from the worker returns on Ctrl-C
  signal(SIGPIPE, SIG_IGN);          // a worker that died is seen at the next read
  std::optional<Worker> spawned;
  try {
    spawned.emplace(worker_command(o), o.device);
  } catch (const std::exception& e) {
    fmt::print(stderr, "hfnn tune: {}; {} is unchanged\n", e.what(), o.db);
    return 1;
  }
  Worker& worker = *spawned;
  auto hello = worker.receive();
  if (!hello || !hello->is_object() || !hello->contains("hello") || !(*hello)["hello"].is_object()) {
    const std::string why = hello && hello->is_object() && hello->contains("error") && (*hello)["error"].is_string()
                                ? (*hello)["error"].get<std::string>()
                                                               : "the tune worker exited before saying hello";
    fmt::print(stderr, "hfnn tune: {}; {} is unchanged\n", why, o.db);
    return g_interrupted ? 130 : 1;
  }
  const tuner::TuneEnv tune_env = tuner::TuneEnv::from_json((*hello)["hello"]);
  int tuned = 0, skipped = 0, failed = 0;
  bool worker_died = false;
  int64_t env = 0;
  try {
    profiles::Database db(o.db, false);  // migrates to the schema with the tune tables
    env = tuner::env_id(db, tune_env, true);
    if (!o.quiet) fmt::print("Tuning on {}\n", tune_env.describe());
    for (size_t i = 0; i < todo.size() && !g_interrupted; ++i) {
      const auto& k = todo[i];
      const auto passes = passes_of(k);
      if (!o.force && tuner::is_tuned(db, env, k.op, k.key, k.dtype, passes)) {
        ++skipped;
        continue;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      if (o.budget > 0 && elapsed + o.seconds_per_key > o.budget) {
        if (!o.quiet) fmt::print("  --budget {}s reached: {} key(s) left untuned\n", o.budget, todo.size() - i);
        break;
      }
      const auto t0 = Clock::now();
      const bool sent =
          worker.send({{"op", k.op}, {"key", k.key}, {"dtype", k.dtype}, {"passes", passes}, {"seconds", o.seconds_per_key}});
      const auto r = sent ? worker.receive() : std::nullopt;
      if (!r) {  // the worker is gone: Ctrl-C reaches it too; otherwise it died. What is stored stays.
        if (!g_interrupted) {
          fmt::print(stderr, "hfnn tune: the tune worker exited while measuring {} {}; {} key(s) left untuned (what "
                             "finished is kept; run hfnn tune again to go on)\n",
                     k.key, k.dtype, todo.size() - i);
          worker_died = true;
        }
        break;
      }
      if (!r->is_object() || r->value("key", std::string()) != k.key || r->value("dtype", std::string()) != k.dtype) {
        fmt::print(stderr, "hfnn tune: the tune worker answered out of turn for {} {}; stopping (what finished is kept)\n",
                   k.key, k.dtype);
        worker_died = true;
        break;
      }
      const double took = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r->contains("error")) {
        ++failed;
        const auto& why = (*r)["error"];
        fmt::print(stderr, "  {} {}: not tuned: {}\n", k.key, k.dtype, why.is_string() ? why.get<std::string>() : why.dump());
        continue;
      }
      const auto results = judge_response(*r, *families::find(k.op), k.dtype, passes);
      tuner::store(db, env, k.op, k.key, k.dtype, results);
      ++tuned;
      if (!o.quiet) {
        std::string line;
        for (const auto& p : results) {
          int rejected = 0;
          for (const auto& c : p.candidates) rejected += !c.verdict.accepted;
          line += fmt::format("  {} {} ({:.1f} -> {:.1f} µs{})", p.pass, p.choice.winner, p.choice.torch_us,
                              p.choice.best_us, rejected ? fmt::format(", {} rejected", rejected) : "");
        }
        const double per_key = std::chrono::duration<double>(Clock::now() - started).count() / (i + 1);
        fmt::print("[{}/{}] {} {} {:.2f}s{}  ETA {}\n", i + 1, todo.size(), k.key, k.dtype, took, line,
                   seconds_text(per_key * (todo.size() - i - 1)));
        std::fflush(stdout);
      }
    }
    const auto summary = tuner::tune_summary(db, run);
    nlohmann::json mine = {{"envs", nlohmann::json::array()}};
    for (const auto& e : summary["envs"])
      if (tuner::TuneEnv::from_json(e["env"]).describe() == tune_env.describe()) mine["envs"].push_back(e);
    mine["run"] = run.id;
    fmt::print("{}", profiles::tune_text(mine));
  } catch (const profiles::DbError& e) {
    fmt::print(stderr, "hfnn tune: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // the worker's output not as agreed, a pipe or fork failing
    fmt::print(stderr, "hfnn tune: {}; what finished is kept in {}\n", e.what(), o.db);
    return 1;
  }
  const double total = std::chrono::duration<double>(Clock::now() - started).count();
  fmt::print("Tuned {} key(s) in {}{}{}; winners in {} (HFNN_DISPATCH_DB={} python train.py uses them)\n", tuned,
             seconds_text(total), skipped ? fmt::format(", {} already tuned (--force redoes them)", skipped) : "",
             failed ? fmt::format(", {} failed", failed) : "", o.db, o.db);
  if (g_interrupted) {
    fmt::print(stderr, "hfnn tune: interrupted; the {} key(s) finished are kept in {}\n", tuned, o.db);
    return 130;
  }
  return failed || worker_died ? 1 : 0;
}

}  // namespace hfnn::cli
