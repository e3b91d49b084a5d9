#include "tuner/tune_db.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>
#include <set>
#include <tuple>

#include "kernels/common/family.h"
#include "profiles/plain_step.h"
#include "profiles/report.h"

namespace hfnn::tuner {
namespace {

using profiles::DbError;
using profiles::Statement;

// JSON has no infinity: an unbounded speed-up is null.
nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string now_utc() {
  const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool has_table(profiles::Database& db, const char* name) {
  Statement s(db.handle(), "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?");
  s.bind(1, std::string(name));
  return s.step() && s.column_int(0) > 0;
}

bool tunable(const std::string& op) { return families::find(op) != nullptr; }

// Shapes the collector records for the report's advice only: no family will tune them.
bool advice_only(const std::string& op) {
  return std::find(std::begin(profiles::kAdviceShapeOps), std::end(profiles::kAdviceShapeOps), op) !=
         std::end(profiles::kAdviceShapeOps);
}

}  // namespace

ProfiledRun load_profiled_run(profiles::Database& db, int64_t run) {
  ProfiledRun r;
  if (db.schema_version() < 2)  // opened read-only: an older file is read as it is, and shape flags came in 2
    throw DbError(fmt::format("{}: written by an older hfnn (schema {}); run `hfnn report --db {}` once to upgrade "
                              "it, then tune",
                              db.path(), db.schema_version(), db.path()));
  r.id = run > 0 ? run : db.latest_run();
  if (r.id == 0) throw DbError(fmt::format("{}: has no profile runs yet; run `hfnn profile train.py` first", db.path()));
  {
    Statement s(db.handle(), "SELECT command FROM runs WHERE id = ?");
    s.bind(1, r.id);
    if (!s.step())
      throw DbError(fmt::format("{}: has no run {} (newest is {}); see `hfnn report --db {}`", db.path(), r.id,
                                db.latest_run(), db.path()));
    r.command = s.column_text(0);
  }
  int64_t step_rows = 0;
  double wall_total_ms = 0, busy_total_ms = 0;
  {
    Statement s(db.handle(), "SELECT count(DISTINCT rank), count(*), coalesce(sum(wall_ms), 0),"
                             " coalesce(sum(gpu_busy_ms), 0) FROM step_stats WHERE run_id = ?");
    s.bind(1, r.id);
    s.step();
    r.ranks = std::max<int64_t>(1, s.column_int(0));
    step_rows = s.column_int(1);
    wall_total_ms = s.column_double(2);
    busy_total_ms = s.column_double(3);
    r.steps = step_rows / r.ranks;
  }
  {
    Statement s(db.handle(), "SELECT wall_ms, gpu_busy_ms FROM step_stats WHERE run_id = ?"
                             " AND rank = (SELECT min(rank) FROM step_stats WHERE run_id = ?)");
    s.bind(1, r.id).bind(2, r.id);
    std::vector<double> wall, busy;
    while (s.step()) {
      if (!s.column_is_null(0)) wall.push_back(s.column_double(0));
      if (!s.column_is_null(1)) busy.push_back(s.column_double(1));
    }
    r.step_ms = summarize(wall).median_us;  // (summarize is unit-free: these are ms)
    r.gpu_busy_ms = summarize(busy).median_us;
  }
  {
    const profiles::PlainStep plain = profiles::read_plain_step(db, r.id);
    r.plain_step_ms = plain.plain_ms.value_or(0.0);
    r.plain_note = plain.note;
  }
  {
    Statement s(db.handle(), "SELECT count(*) FROM op_stats WHERE run_id = ? AND cuda_self_us > 0");
    s.bind(1, r.id);
    s.step();
    r.time_basis = s.column_int(0) > 0 ? "cuda" : "cpu";
  }
  const char* time_col = r.time_basis == "cuda" ? "cuda_total_us" : "cpu_total_us";
  // (op, key, dtype): a key is its family's, so two families' keys never meet.
  using Id = std::tuple<std::string, std::string, std::string>;
  std::map<Id, ProfiledKey> keys;
  std::map<Id, std::set<std::string>> shapes;
  std::map<std::string, int64_t> fwd_calls_of_op;
  {
    Statement s(db.handle(),
                fmt::format("SELECT op, shape, coalesce(normalized_shape, ''), dtype, coalesce(affine, 1),"
                            " coalesce(flags, ''), phase, sum(calls), coalesce(sum({}), 0) FROM shape_stats"
                            " WHERE run_id = ? GROUP BY op, shape, normalized_shape, dtype, affine, flags, phase",
                            time_col)
                    .c_str());
    s.bind(1, r.id);
    while (s.step()) {
      const std::string op = s.column_text(0);
      const families::Family* family = families::find(op);
      if (!family) continue;
      const families::RecordedShape shape{.shape = s.column_text(1), .normalized = s.column_text(2),
                                          .dtype = s.column_text(3), .flags = s.column_text(5),
                                          .affine = s.column_int(4) != 0};
      const auto key = family->key_of(shape);
      if (!key) continue;
      const std::string phase = s.column_text(6);
      const Id id{op, *key, shape.dtype};
      ProfiledKey& k = keys[id];
      k.op = op;
      k.key = *key;
      k.dtype = shape.dtype;
      shapes[id].insert(shape.shape);
      const int64_t calls = s.column_int(7);
      (phase == "bwd" ? k.bwd_calls : k.fwd_calls) += calls;
      if (phase != "bwd") fwd_calls_of_op[op] += calls;
      k.time_us += s.column_double(8);
    }
  }
  for (auto& [id, k] : keys) {
    k.shapes.assign(shapes[id].begin(), shapes[id].end());
    const double per = step_rows > 0 ? static_cast<double>(step_rows) : 1.0;
    k.fwd_calls_per_step = k.fwd_calls / per;
    k.bwd_calls_per_step = k.bwd_calls / per;
    const int64_t op_fwd_calls = fwd_calls_of_op[k.op];
    k.run_pct = op_fwd_calls > 0 ? 100.0 * k.fwd_calls / op_fwd_calls : 0.0;
    // The basis of basis_ms(), over every recorded step: the plain step stands for each of them.
    // CPU times (no CUDA activity) were measured under the profiler, which stretches them as it
    // stretches the step: their share is of the recorded steps' wall time, not of the plain step's.
    const double basis_total_ms = r.time_basis == "cpu" ? wall_total_ms
                                  : r.on_plain()       ? r.plain_step_ms * static_cast<double>(step_rows)
                                  : r.on_gpu_busy()    ? busy_total_ms
                                                       : wall_total_ms;
    k.share_pct = basis_total_ms > 0 ? 100.0 * k.time_us / 1e3 / basis_total_ms : 0.0;
    r.keys.push_back(k);
  }
  std::stable_sort(r.keys.begin(), r.keys.end(),
                   [](const ProfiledKey& a, const ProfiledKey& b) { return a.time_us > b.time_us; });
  {
    Statement s(db.handle(), "SELECT op, count(DISTINCT shape || '|' || dtype || '|' || coalesce(flags, '')) FROM shape_stats"
                             " WHERE run_id = ? GROUP BY op ORDER BY op");
    s.bind(1, r.id);
    while (s.step())
      if (!tunable(s.column_text(0)) && !advice_only(s.column_text(0)))
        r.untunable.emplace_back(s.column_text(0), s.column_int(1));
  }
  return r;
}

TuneEnv TuneEnv::from_json(const nlohmann::json& h) {
  TuneEnv e;
  e.gpu = h.value("gpu", "");
  e.compute_capability = h.value("compute_capability", "");
  e.sm_count = h.value("sm_count", int64_t{0});
  e.cuda = h.value("cuda", "");
  e.torch = h.value("torch", "");
  e.hfnn = h.value("hfnn", "");
  return e;
}

std::string TuneEnv::describe() const {
  return fmt::format("{} (sm {}, {} SMs), CUDA {}, torch {}, hfnn {}", gpu, compute_capability, sm_count, cuda, torch,
                     hfnn);
}

int64_t env_id(profiles::Database& db, const TuneEnv& e, bool create) {
  if (!has_table(db, "tune_envs")) return 0;
  auto find = [&]() -> int64_t {
    Statement s(db.handle(), "SELECT id FROM tune_envs WHERE gpu = ? AND compute_capability = ? AND sm_count = ?"
                             " AND cuda = ? AND torch = ? AND hfnn = ?");
    s.bind(1, e.gpu).bind(2, e.compute_capability).bind(3, e.sm_count).bind(4, e.cuda).bind(5, e.torch).bind(6, e.hfnn);
    return s.step() ? s.column_int(0) : 0;
  };
  if (const int64_t id = find(); id || !create) return id;
  db.exec("BEGIN IMMEDIATE");
  try {
    Statement s(db.handle(), "INSERT OR IGNORE INTO tune_envs(gpu, compute_capability, sm_count, cuda, torch, hfnn)"
                             " VALUES (?, ?, ?, ?, ?, ?)");
    s.bind(1, e.gpu).bind(2, e.compute_capability).bind(3, e.sm_count).bind(4, e.cuda).bind(5, e.torch).bind(6, e.hfnn);
    s.step();
    db.exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  return find();
}

bool is_tuned(profiles::Database& db, int64_t env, const std::string& op, const std::string& key,
              const std::string& dtype, const std::vector<std::string>& passes) {
  if (env == 0) return false;
  for (const auto& pass : passes) {
    Statement s(db.handle(), "SELECT count(*) FROM tune_winners WHERE env_id = ? AND op = ? AND key = ? AND dtype = ?"
                             " AND pass = ?");
    s.bind(1, env).bind(2, op).bind(3, key).bind(4, dtype).bind(5, pass);
    if (!s.step() || s.column_int(0) == 0) return false;
  }
  return true;
}

void store(profiles::Database& db, int64_t env, const std::string& op, const std::string& key, const std::string& dtype,
           const std::vector<PassResult>& passes) {
  const std::string at = now_utc();
  db.exec("BEGIN IMMEDIATE");
  try {
    for (const auto& p : passes) {
      for (const char* table : {"tune_results", "tune_winners"}) {
        Statement del(db.handle(), fmt::format("DELETE FROM {} WHERE env_id = ? AND op = ? AND key = ? AND dtype = ?"
                                               " AND pass = ?",
                                               table)
                                       .c_str());
        del.bind(1, env).bind(2, op).bind(3, key).bind(4, dtype).bind(5, p.pass).step();
      }
      Statement ins(db.handle(),
                    "INSERT INTO tune_results(env_id, op, key, dtype, pass, candidate, median_us, p20_us, p80_us,"
                    " max_error, accepted, reason, tuned_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
      for (const auto& c : p.candidates) {
        ins.reset();
        ins.bind(1, env).bind(2, op).bind(3, key).bind(4, dtype).bind(5, p.pass).bind(6, c.name);
        if (c.timing.samples > 0) ins.bind(7, c.timing.median_us).bind(8, c.timing.p20_us).bind(9, c.timing.p80_us);
        else ins.bind_null(7).bind_null(8).bind_null(9);
        if (c.ran && std::isfinite(c.max_error)) ins.bind(10, c.max_error);
        else ins.bind_null(10);
        ins.bind(11, int64_t{c.verdict.accepted}).bind(12, c.verdict.reason).bind(13, at);
        ins.step();
      }
      Statement win(db.handle(), "INSERT INTO tune_winners(env_id, op, key, dtype, pass, winner, torch_us, best_us, tuned_at)"
                                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
      win.bind(1, env).bind(2, op).bind(3, key).bind(4, dtype).bind(5, p.pass).bind(6, p.choice.winner);
      if (p.choice.torch_us > 0) win.bind(7, p.choice.torch_us);
      else win.bind_null(7);
      win.bind(8, p.choice.best_us).bind(9, at);
      win.step();
    }
    db.exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

nlohmann::json tune_summary(profiles::Database& db, const ProfiledRun& run) {
  nlohmann::json out = {{"run", run.id}, {"envs", nlohmann::json::array()}};
  if (!has_table(db, "tune_winners")) return out;
  std::vector<std::pair<int64_t, TuneEnv>> envs;
  {
    Statement s(db.handle(), "SELECT id, gpu, compute_capability, sm_count, cuda, torch, hfnn FROM tune_envs ORDER BY id");
    while (s.step()) {
      TuneEnv e;
      e.gpu = s.column_text(1);
      e.compute_capability = s.column_text(2);
      e.sm_count = s.column_int(3);
      e.cuda = s.column_text(4);
      e.torch = s.column_text(5);
      e.hfnn = s.column_text(6);
      envs.emplace_back(s.column_int(0), e);
    }
  }
  Statement s(db.handle(), "SELECT winner, torch_us, best_us FROM tune_winners WHERE env_id = ? AND op = ?"
                           " AND key = ? AND dtype = ? AND pass = ?");
  for (const auto& [id, env] : envs) {
    nlohmann::json rows = nlohmann::json::array();
    std::vector<KeySaving> savings;
    int tuned = 0;
    for (const auto& k : run.keys) {
      bool any = false;
      const families::Family* family = families::find(k.op);
      if (!family) continue;
      for (const std::string_view pass_name : family->passes) {
        const std::string pass(pass_name);
        const bool backward = pass == "bwd";
        const double cps = backward ? k.bwd_calls_per_step : k.fwd_calls_per_step;
        if ((backward ? k.bwd_calls : k.fwd_calls) == 0) continue;
        s.reset();
        s.bind(1, id).bind(2, k.op).bind(3, k.key).bind(4, k.dtype).bind(5, pass);
        if (!s.step()) continue;
        any = true;
        const double torch_us = s.column_is_null(1) ? 0.0 : s.column_double(1);
        const double best_us = s.column_double(2);
        rows.push_back({{"op", k.op}, {"key", k.key}, {"dtype", k.dtype}, {"shapes", k.shapes},
                        {"run_pct", k.run_pct}, {"share_pct", k.share_pct}, {"pass", pass},
                        {"calls_per_step", cps}, {"winner", s.column_text(0)}, {"torch_us", torch_us},
                        {"best_us", best_us}, {"speedup", best_us > 0 && torch_us > 0 ? torch_us / best_us : 1.0}});
        savings.push_back({cps, torch_us, best_us});
      }
      tuned += any;
    }
    if (rows.empty()) continue;
    nlohmann::json e = {{"env", {{"gpu", env.gpu}, {"compute_capability", env.compute_capability},
                                 {"sm_count", env.sm_count}, {"cuda", env.cuda}, {"torch", env.torch},
                                 {"hfnn", env.hfnn}}},
                        {"keys_tuned", tuned}, {"keys_in_run", run.keys.size()}, {"rows", rows}};
    if (run.basis_ms() > 0) {
      const Projection p = project(run.basis_ms(), savings);
      e["projection"] = {{"basis", run.basis()}, {"wall_step_ms", run.step_ms},
                         {"gpu_busy_ms", run.gpu_busy_ms > 0 ? nlohmann::json(run.gpu_busy_ms) : nlohmann::json()},
                         {"plain_step_ms", run.on_plain() ? nlohmann::json(run.plain_step_ms) : nlohmann::json()},
                         {"plain_note", run.plain_note},
                         {"step_ms", p.step_ms}, {"saved_ms", p.saved_ms}, {"projected_step_ms", p.projected_step_ms},
                         {"speedup", finite_or_null(p.speedup)}, {"torch_ms", p.torch_ms},
                         {"ceiling", finite_or_null(p.ceiling)}};
    }
    out["envs"].push_back(e);
  }
  return out;
}

profiles::TuneFacts tune_facts(profiles::Database& db, int64_t run_id, nlohmann::json* summary_out) {
  const ProfiledRun run = load_profiled_run(db, run_id);
  const nlohmann::json summary = tune_summary(db, run);
  profiles::TuneFacts t;
  t.basis = run.basis();
  t.basis_ms = run.basis_ms();
  std::string gpu, capability;
  {
    Statement s(db.handle(), "SELECT coalesce(gpu, ''), coalesce(compute_capability, '') FROM runs WHERE id = ?");
    s.bind(1, run.id);
    if (s.step()) {
      gpu = s.column_text(0);
      capability = s.column_text(1);
    }
  }
  // Winners apply on the GPU they were measured on: the newest environment of the run's GPU.
  const nlohmann::json* env = nullptr;
  for (const auto& e : summary["envs"])
    if (!gpu.empty() && e["env"].value("gpu", "") == gpu && e["env"].value("compute_capability", "") == capability)
      env = &e;
  if (env) {
    t.env = (*env)["env"];
    t.projection = env->value("projection", nlohmann::json());
  }
  std::map<std::string, std::vector<KeySaving>> savings;  // per op
  for (const auto& k : run.keys) {
    profiles::TuneKey key{k.op, profiles::key_label(k.op, k.key), k.dtype, k.share_pct, k.share_pct / 100 * t.basis_ms, {}};
    if (env)
      for (const auto& row : (*env)["rows"])
        if (row["op"] == k.op && row["key"] == k.key && row["dtype"] == k.dtype) {
          key.winners.push_back(row["winner"].get<std::string>());
          savings[k.op].push_back({row["calls_per_step"].get<double>(), row["torch_us"].get<double>(),
                                   row["best_us"].get<double>()});
        }
    t.keys.push_back(std::move(key));
  }
  if (t.basis_ms > 0)
    for (const auto& [op, s] : savings) t.saved_ms_by_op[op] = project(t.basis_ms, s).saved_ms;
  if (summary_out) *summary_out = summary;
  return t;
}

}  // namespace hfnn::tuner
