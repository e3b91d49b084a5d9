// profiles/report: the CSV report's cells. A float is the shortest text that reads back as the
// same double (what Python's repr and json.dumps write, and what scripts compare against), a field
// with a comma or quote is quoted, a value that is not a number (NaN) or missing is an empty cell.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "profiles/report.h"

namespace hfnn::profiles {
namespace {

// The CSV's first row of `section`.
std::string row_of(const std::string& csv, const std::string& section) {
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(section + ",", 0) == 0) return line;
  return {};
}

nlohmann::json report_with_op(const nlohmann::json& op) {
  return {{"ops", nlohmann::json::array({op})},
          {"kernels", nlohmann::json::array()},
          {"shapes", nlohmann::json::array()},
          {"steps", nlohmann::json::array()}};
}

TEST(ReportCsv, FloatsAreTheShortestTextOfTheSameDouble) {
  // nlohmann's dump writes 0.328236 as 0.32823600000000003 (the same double, not the shortest).
  for (double v : {0.328236, 0.1, 1e-05, 123456.789, 2.5, 1.0 / 3.0, 6.02e23}) {
    const std::string row = row_of(report_csv(report_with_op({{"name", "op"}, {"cpu_self_us", v}})), "op");
    std::vector<std::string> fields;
    std::istringstream in(row);
    for (std::string f; std::getline(in, f, ',');) fields.push_back(f);
    ASSERT_GE(fields.size(), 5u) << row;
    const std::string& cell = fields[4];  // cpu_self_us: the fifth column
    EXPECT_EQ(std::stod(cell), v) << cell;
    char shortest[64] = {};
    for (int digits = 1; digits <= 17; ++digits) {  // the fewest significant digits that read back
      std::snprintf(shortest, sizeof shortest, "%.*g", digits, v);
      if (std::stod(shortest) == v) break;
    }
    EXPECT_LE(cell.size(), std::string(shortest).size() + 2) << cell << " against " << shortest;
  }
  // As Python writes them: 0.328236, and a whole number with its ".0".
  const std::string row = row_of(report_csv(report_with_op({{"name", "op"}, {"cpu_self_us", 0.328236},
                                                             {"cpu_total_us", 2.0}})), "op");
  EXPECT_NE(row.find(",0.328236,2.0,"), std::string::npos) << row;
}

TEST(ReportCsv, QuotesCommasAndLeavesNonNumbersEmpty) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string row =
      row_of(report_csv(report_with_op({{"name", "a, \"b\""}, {"calls", 3}, {"cpu_self_us", nan}})), "op");
  EXPECT_EQ(row.rfind("op,\"a, \"\"b\"\"\",,3,", 0), 0u) << row;  // section, name, phase (none), calls
  EXPECT_NE(row.find(",3,,"), std::string::npos) << row;  // cpu_self_us: NaN is an empty cell
}

}  // namespace
}  // namespace hfnn::profiles
