#include "profiles/db.h"

#include <fmt/format.h>

#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "profiles/plain_step.h"

namespace hfnn::profiles {
namespace {

constexpr char kSqliteHeader[] = "SQLite format 3";

// Schema, version by version: kMigrations[v] takes a database from version v to v + 1.
constexpr const char* kMigrations[] = {
    // 0 -> 1: the first schema.
    R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs(
  id INTEGER PRIMARY KEY, command TEXT NOT NULL, started_at TEXT, finished_at TEXT, exit_code INTEGER,
  world_size INTEGER, warmup INTEGER, steps_requested INTEGER, steps_recorded INTEGER,
  torch TEXT, hfnn TEXT, cuda TEXT, gpu TEXT, compute_capability TEXT, sm_count INTEGER);
CREATE TABLE ranks(
  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, host TEXT, pid INTEGER,
  steps_recorded INTEGER, step_boundaries INTEGER);
CREATE TABLE op_stats(
  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, name TEXT NOT NULL, phase TEXT NOT NULL,
  calls INTEGER NOT NULL, cpu_total_us REAL, cpu_self_us REAL, cuda_total_us REAL, cuda_self_us REAL);
CREATE TABLE kernel_stats(
  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, name TEXT NOT NULL,
  calls INTEGER NOT NULL, cuda_us REAL);
CREATE TABLE shape_stats(
  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, op TEXT NOT NULL, shape TEXT NOT NULL,
  normalized_shape TEXT, dtype TEXT NOT NULL, affine INTEGER, phase TEXT NOT NULL, calls INTEGER NOT NULL,
  cpu_total_us REAL, cuda_total_us REAL);
CREATE TABLE step_stats(
  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, step INTEGER NOT NULL,
  wall_ms REAL, gpu_busy_ms REAL);
CREATE INDEX op_stats_run ON op_stats(run_id);
CREATE INDEX shape_stats_run ON shape_stats(run_id);
CREATE INDEX step_stats_run ON step_stats(run_id);
)sql",
    // 1 -> 2: the settings of shapes other than LayerNorm's (LSTM: hidden size, layers, ...).
    R"sql(
ALTER TABLE shape_stats ADD COLUMN flags TEXT NOT NULL DEFAULT '';
)sql",
    // 2 -> 3: hfnn tune's measurements and winners, per GPU and software versions (tune_envs).
    R"sql(
CREATE TABLE IF NOT EXISTS tune_envs(
  id INTEGER PRIMARY KEY, gpu TEXT NOT NULL, compute_capability TEXT NOT NULL, sm_count INTEGER NOT NULL,
  cuda TEXT NOT NULL, torch TEXT NOT NULL, hfnn TEXT NOT NULL,
  UNIQUE(gpu, compute_capability, sm_count, cuda, torch, hfnn));
CREATE TABLE IF NOT EXISTS tune_results(
  env_id INTEGER NOT NULL REFERENCES tune_envs(id), op TEXT NOT NULL, key TEXT NOT NULL, dtype TEXT NOT NULL,
  pass TEXT NOT NULL, candidate TEXT NOT NULL, median_us REAL, p20_us REAL, p80_us REAL, max_error REAL,
  accepted INTEGER NOT NULL, reason TEXT NOT NULL DEFAULT '', tuned_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tune_winners(
  env_id INTEGER NOT NULL REFERENCES tune_envs(id), op TEXT NOT NULL, key TEXT NOT NULL, dtype TEXT NOT NULL,
  pass TEXT NOT NULL, winner TEXT NOT NULL, torch_us REAL, best_us REAL, tuned_at TEXT NOT NULL,
  PRIMARY KEY(env_id, op, key, dtype, pass));
CREATE INDEX IF NOT EXISTS tune_results_key ON tune_results(env_id, op, key, dtype);
)sql",
    // 3 -> 4: a backward node's forward op (linked by autograd sequence numbers).
    R"sql(
ALTER TABLE op_stats ADD COLUMN forward_op TEXT NOT NULL DEFAULT '';
)sql",
    // 4 -> 5: the plain step (issue 13): steps timed after the recorded ones with collection off,
    // per process, their median and count; --plain-steps of the run (NULL: recorded before hfnn
    // timed them).
    R"sql(
ALTER TABLE runs ADD COLUMN plain_steps_requested INTEGER;
ALTER TABLE ranks ADD COLUMN plain_steps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ranks ADD COLUMN plain_step_ms REAL;
)sql",
    // 5 -> 6: --sample (issue 13): every N-th of the recorded steps in full (NULL: every one, as
    // before), and per process the steps in between, timed only: how many and their median.
    R"sql(
ALTER TABLE runs ADD COLUMN sample_every INTEGER;
ALTER TABLE ranks ADD COLUMN unsampled_steps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ranks ADD COLUMN unsampled_step_ms REAL;
)sql",
};
static_assert(std::size(kMigrations) == kSchemaVersion);

bool looks_like_sqlite(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char header[sizeof(kSqliteHeader)] = {};
  in.read(header, sizeof(header));
  return in.gcount() == static_cast<std::streamsize>(sizeof(header)) &&
         std::memcmp(header, kSqliteHeader, sizeof(header)) == 0;
}

}  // namespace

Database::Database(const std::string& path, bool create) : path_(path) { open(create, false); }

Database::Database(const std::string& path, ReadOnly) : path_(path) { open(false, true); }

void Database::open(bool create, bool read_only) {
  namespace fs = std::filesystem;
  const std::string& path = path_;
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (!exists && !create)
    throw DbError(fmt::format("{}: no such database (run `hfnn profile` first, or pass --db)", path));
  if (exists && fs::file_size(path, ec) > 0 && !looks_like_sqlite(path))
    throw DbError(fmt::format("{}: not an hfnn database (not an SQLite file); choose another --db", path));
  if (exists && fs::is_directory(path, ec)) throw DbError(fmt::format("{}: is a folder; --db takes a file", path));
  const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | (exists ? 0 : SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw DbError(fmt::format("{}: cannot open ({}); check the path and its permissions", path, msg));
  }
  sqlite3_busy_timeout(db_, 10000);  // ranks finishing together wait for each other
  try {
    // A quick structural check first: a damaged file is reported, not half-read.
    {
      Statement quick(db_, "PRAGMA quick_check");
      if (quick.step() && quick.column_text(0) != "ok") {
        std::string what = quick.column_text(0);  // one line: SQLite lists the damaged pages on several
        std::replace(what.begin(), what.end(), '\n', ' ');
        if (what.size() > 120) what = what.substr(0, 117) + "...";
        throw DbError(fmt::format("{}: the database is corrupt ({}); move it aside or use another --db", path, what));
      }
    }
    int tables = 0;
    {
      Statement count(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table'");
      count.step();
      tables = static_cast<int>(count.column_int(0));
    }
    int version = 0;
    if (tables > 0) {
      Statement has_meta(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'");
      has_meta.step();
      if (has_meta.column_int(0) == 0)
        throw DbError(fmt::format("{}: not an hfnn database (an SQLite file of something else); choose another --db",
                                  path));
      Statement app(db_, "SELECT value FROM meta WHERE key = 'app'");
      if (!app.step() || app.column_text(0) != "hfnn")
        throw DbError(fmt::format("{}: not an hfnn database (its meta table is not hfnn's); choose another --db", path));
      Statement v(db_, "SELECT value FROM meta WHERE key = 'schema_version'");
      version = v.step() ? std::stoi(v.column_text(0)) : 0;
    }
    if (version > kSchemaVersion)
      throw DbError(fmt::format("{}: written by a newer hfnn (schema {}, this hfnn reads up to {}); upgrade hfnn", path,
                                version, kSchemaVersion));
    if (version < kSchemaVersion && !read_only) {
      migrate_from(version);
      version = kSchemaVersion;
    }
    version_ = version;
  } catch (const DbError& e) {
    sqlite3_close(db_);
    db_ = nullptr;
    if (!exists) fs::remove(path, ec);
    if (std::string_view(e.what()).rfind(path, 0) == 0) throw;
    // SQLite itself refused (a damaged page, a truncated file): name the file and the way out.
    throw DbError(fmt::format("{}: the database is corrupt or unreadable ({}); move it aside or use another --db",
                              path, e.what()));
  } catch (const std::exception& e) {
    sqlite3_close(db_);
    db_ = nullptr;
    if (!exists) fs::remove(path, ec);
    throw DbError(fmt::format("{}: cannot read the database ({}); move it aside or use another --db", path, e.what()));
  }
}

Database::~Database() {
  if (db_) sqlite3_close(db_);
}

void Database::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw DbError(fmt::format("{}: {}", path_, msg));
  }
}

void Database::migrate_from(int version) {
  exec("BEGIN IMMEDIATE");
  try {
    // Another process (a second rank, a tune beside a profile) may have migrated the file between
    // our first read and this lock: read the version again under it.
    {
      Statement has_meta(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'");
      has_meta.step();
      if (has_meta.column_int(0) > 0) {
        Statement v(db_, "SELECT value FROM meta WHERE key = 'schema_version'");
        if (v.step()) version = std::max(version, std::stoi(v.column_text(0)));
      }
    }
    for (int v = version; v < kSchemaVersion; ++v) exec(kMigrations[v]);
    Statement app(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES ('app', 'hfnn')");
    app.step();
    Statement ver(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)");
    ver.bind(1, std::to_string(kSchemaVersion)).step();
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

int64_t Database::add_run(const RunInfo& run, const std::vector<nlohmann::json>& parts) {
  // The run's description comes from rank 0's part (or the first), like every process's versions.
  const nlohmann::json* lead = nullptr;
  for (const auto& p : parts)
    if (!lead || p["meta"].value("rank", 0) < (*lead)["meta"].value("rank", 0)) lead = &p;
  const nlohmann::json meta = lead ? (*lead)["meta"] : nlohmann::json::object();
  const nlohmann::json gpu = meta.value("gpu", nlohmann::json());
  int64_t steps_recorded = 0;
  if (lead) steps_recorded = static_cast<int64_t>((*lead)["step_ms"].size());

  exec("BEGIN IMMEDIATE");
  try {
    Statement ins(db_,
                  "INSERT INTO runs(command, started_at, finished_at, exit_code, world_size, warmup, steps_requested,"
                  " steps_recorded, torch, hfnn, cuda, gpu, compute_capability, sm_count, plain_steps_requested,"
                  " sample_every) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    ins.bind(1, run.command).bind(2, run.started_at).bind(3, run.finished_at).bind(4, int64_t{run.exit_code});
    ins.bind(5, static_cast<int64_t>(meta.value("world_size", 1)));
    ins.bind(6, int64_t{run.warmup}).bind(7, int64_t{run.steps_requested}).bind(8, steps_recorded);
    auto text_or_null = [&](int i, const nlohmann::json& j, const char* key) {
      if (j.is_object() && j.contains(key) && j[key].is_string()) ins.bind(i, j[key].get<std::string>());
      else ins.bind_null(i);
    };
    text_or_null(9, meta, "torch");
    text_or_null(10, meta, "hfnn");
    text_or_null(11, meta, "cuda");
    text_or_null(12, gpu, "name");
    text_or_null(13, gpu, "cc");
    if (gpu.is_object() && gpu.contains("sm_count")) ins.bind(14, gpu["sm_count"].get<int64_t>());
    else ins.bind_null(14);
    ins.bind(15, int64_t{run.plain_steps_requested});
    ins.bind(16, int64_t{run.sample_every});
    ins.step();
    const int64_t run_id = sqlite3_last_insert_rowid(db_);

    Statement rank_row(db_, "INSERT INTO ranks(run_id, rank, host, pid, steps_recorded, step_boundaries, plain_steps,"
                            " plain_step_ms, unsampled_steps, unsampled_step_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    Statement op_row(db_,
                     "INSERT INTO op_stats(run_id, rank, name, phase, calls, cpu_total_us, cpu_self_us, cuda_total_us,"
                     " cuda_self_us, forward_op) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    Statement shape_row(db_,
                        "INSERT INTO shape_stats(run_id, rank, op, shape, normalized_shape, dtype, affine, phase, calls,"
                        " cpu_total_us, cuda_total_us, flags) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    Statement kernel_row(db_, "INSERT INTO kernel_stats(run_id, rank, name, calls, cuda_us) VALUES (?, ?, ?, ?, ?)");
    Statement step_row(db_, "INSERT INTO step_stats(run_id, rank, step, wall_ms, gpu_busy_ms) VALUES (?, ?, ?, ?, ?)");
    // CUDA columns are NULL where the process had no CUDA activity (no GPU, or CUPTI held elsewhere).
    auto bind_optional = [](Statement& st, int i, const nlohmann::json& j, const char* key) {
      if (j.contains(key) && j[key].is_number()) st.bind(i, j[key].get<double>());
      else st.bind_null(i);
    };
    for (const auto& part : parts) {
      const auto& m = part["meta"];
      const int64_t rank = m.value("rank", 0);
      rank_row.bind(1, run_id).bind(2, rank).bind(3, m.value("host", std::string())).bind(4, m.value("pid", int64_t{0}));
      rank_row.bind(5, static_cast<int64_t>(part["step_ms"].size())).bind(6, part.value("step_boundaries", int64_t{0}));
      // The plain step: the median of the process's steps timed with collection off, NULL without one.
      std::vector<double> plain = part.value("plain_step_ms", std::vector<double>());
      rank_row.bind(7, static_cast<int64_t>(plain.size()));
      if (plain.empty()) rank_row.bind_null(8);
      else rank_row.bind(8, median(std::move(plain)));
      // Under --sample, the steps between the recorded ones, likewise.
      std::vector<double> unsampled = part.value("unsampled_step_ms", std::vector<double>());
      rank_row.bind(9, static_cast<int64_t>(unsampled.size()));
      if (unsampled.empty()) rank_row.bind_null(10);
      else rank_row.bind(10, median(std::move(unsampled)));
      rank_row.step();
      rank_row.reset();
      for (const auto& o : part["ops"]) {
        op_row.bind(1, run_id).bind(2, rank).bind(3, o["name"].get<std::string>()).bind(4, o["phase"].get<std::string>());
        op_row.bind(5, o["calls"].get<int64_t>()).bind(6, o["cpu_total_us"].get<double>()).bind(7, o["cpu_self_us"].get<double>());
        bind_optional(op_row, 8, o, "cuda_total_us");
        bind_optional(op_row, 9, o, "cuda_self_us");
        op_row.bind(10, o.value("forward_op", std::string()));
        op_row.step();
        op_row.reset();
      }
      for (const auto& s : part["shapes"]) {
        shape_row.bind(1, run_id).bind(2, rank).bind(3, s["op"].get<std::string>()).bind(4, s["shape"].get<std::string>());
        shape_row.bind(5, s["normalized_shape"].get<std::string>()).bind(6, s["dtype"].get<std::string>());
        shape_row.bind(7, int64_t{s["affine"].get<bool>()}).bind(8, s["phase"].get<std::string>());
        shape_row.bind(9, s["calls"].get<int64_t>()).bind(10, s["cpu_total_us"].get<double>());
        bind_optional(shape_row, 11, s, "cuda_total_us");
        shape_row.bind(12, s.value("flags", std::string()));
        shape_row.step();
        shape_row.reset();
      }
      // The kernel's raw name, as CUPTI reports it (mangled for C++ kernels), as every schema kept
      // it: the reports demangle it on reading (profiles/kernel_names.h), older files alike.
      for (const auto& k : part.value("kernels", nlohmann::json::array())) {
        kernel_row.bind(1, run_id).bind(2, rank).bind(3, k["name"].get<std::string>()).bind(4, k["calls"].get<int64_t>());
        kernel_row.bind(5, k["cuda_us"].get<double>());
        kernel_row.step();
        kernel_row.reset();
      }
      const auto gpu_ms = part.value("step_gpu_ms", nlohmann::json::array());
      int64_t i = 0;
      for (const auto& ms : part["step_ms"]) {
        step_row.bind(1, run_id).bind(2, rank).bind(3, i + 1).bind(4, ms.get<double>());
        if (i < static_cast<int64_t>(gpu_ms.size())) step_row.bind(5, gpu_ms[i].get<double>());
        else step_row.bind_null(5);
        ++i;
        step_row.step();
        step_row.reset();
      }
    }
    exec("COMMIT");
    return run_id;
  } catch (const nlohmann::json::exception& e) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw DbError(fmt::format("{}: a profile part is malformed ({}); nothing was written", path_, e.what()));
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

int64_t Database::latest_run() {
  Statement s(db_, "SELECT coalesce(max(id), 0) FROM runs");
  s.step();
  return s.column_int(0);
}

Statement::Statement(sqlite3* db, const char* sql) : db_(db) {
  if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK)
    throw DbError(fmt::format("sqlite: {} (in: {})", sqlite3_errmsg(db), sql));
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::bind(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}
Statement& Statement::bind(int index, double value) {
  sqlite3_bind_double(stmt_, index, value);
  return *this;
}
Statement& Statement::bind(int index, const std::string& value) {
  sqlite3_bind_text(stmt_, index, value.c_str(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return *this;
}
Statement& Statement::bind_null(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw DbError(fmt::format("sqlite: {}", sqlite3_errmsg(db_)));
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t Statement::column_int(int index) { return sqlite3_column_int64(stmt_, index); }
double Statement::column_double(int index) { return sqlite3_column_double(stmt_, index); }
std::string Statement::column_text(int index) {
  const auto* t = sqlite3_column_text(stmt_, index);
  return t ? reinterpret_cast<const char*>(t) : "";
}
bool Statement::column_is_null(int index) { return sqlite3_column_type(stmt_, index) == SQLITE_NULL; }

}  // namespace hfnn::profiles
