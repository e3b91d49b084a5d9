// The SQLite database `hfnn profile` writes and `hfnn report` (and later `hfnn tune`) read.
//
// A file is ours when its `meta` table says app = hfnn; its schema_version says how to read it.
// Opening migrates an older schema forward inside a transaction; a file that is not SQLite, not
// ours, newer than this hfnn, or corrupt raises DbError and is left exactly as it was. Every
// write of a run is one transaction with bound parameters.
#pragma once
#include <sqlite3.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace hfnn::profiles {

inline constexpr int kSchemaVersion = 6;

// One line, naming the file and what would fix it.
struct DbError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the CLI knows about a profiled command; the rest comes from the parts.
struct RunInfo {
  std::string command;
  std::string started_at;   // ISO 8601, UTC
  std::string finished_at;
  int exit_code = 0;
  int warmup = 0;
  int steps_requested = 0;
  int plain_steps_requested = 0;  // --plain-steps
  int sample_every = 1;           // --sample: every N-th of the recorded steps in full, the others timed only
};

class Database {
 public:
  // Opens `path`, creating an empty database if the file does not exist and `create` is set.
  Database(const std::string& path, bool create);
  // Opens an existing file to read only: checked as above but never migrated or written (an older
  // schema is read as it is), so a command that fails later leaves the file exactly as it was.
  struct ReadOnly {};
  Database(const std::string& path, ReadOnly);
  // The file's schema version (kSchemaVersion once migrated; older when opened read-only).
  int schema_version() const { return version_; }
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Adds one run from the processes' parts (profiles/collector.h's JSON); returns its id.
  int64_t add_run(const RunInfo& run, const std::vector<nlohmann::json>& parts);
  // The newest run's id, or 0 when there is none.
  int64_t latest_run();
  // BEGIN IMMEDIATE / COMMIT / ROLLBACK for writers outside this class (hfnn tune).
  void exec(const char* sql);
  sqlite3* handle() { return db_; }
  const std::string& path() const { return path_; }

 private:
  void open(bool create, bool read_only);
  void migrate_from(int version);

  std::string path_;
  int version_ = 0;
  sqlite3* db_ = nullptr;
};

// A prepared statement with bound parameters; steps and finalizes.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& bind(int index, int64_t value);
  Statement& bind(int index, double value);
  Statement& bind(int index, const std::string& value);
  Statement& bind_null(int index);
  bool step();  // true while a row is available
  void reset();
  int64_t column_int(int index);
  double column_double(int index);
  std::string column_text(int index);
  bool column_is_null(int index);

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

}  // namespace hfnn::profiles
