// Which Python hfnn starts (commands.h).
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli/commands.h"

namespace hfnn::cli {

std::string default_python(const std::string& explicit_python) {
  namespace fs = std::filesystem;
  if (!explicit_python.empty()) return explicit_python;
  if (const char* env = std::getenv("HFNN_PYTHON"); env && *env) return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (const char* name : {"python3", "python"})
      if (fs::exists(self.parent_path() / name, ec)) return (self.parent_path() / name).string();
  return "python3";
}

}  // namespace hfnn::cli
