// profiles/report: the CSV report's cells. A float is written as Python's repr and json.dumps write
// it (what scripts compare against), a field with a comma or quote is quoted, a value that is not a
// number (NaN) or missing is an empty cell.
#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <string>
#include <utility>

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

TEST(ReportCsv, FloatsAreWrittenAsPythonWritesThem) {
  // Each value and its text by Python's repr (json.dumps): the shortest that reads back as the same
  // double, a whole number with ".0". nlohmann's dump writes 0.328236 as 0.32823600000000003.
  const std::pair<double, const char*> cases[] = {
      {0.328236, "0.328236"}, {0.1, "0.1"},         {1e-05, "1e-05"},
      {123456.789, "123456.789"}, {1.0 / 3.0, "0.3333333333333333"}, {6.02e23, "6.02e+23"},
      {2.0, "2.0"},           {1e16, "1e+16"}};
  for (const auto& [value, text] : cases) {
    const std::string row = row_of(report_csv(report_with_op({{"name", "op"}, {"cpu_self_us", value}})), "op");
    EXPECT_EQ(row.rfind(std::string("op,op,,,") + text + ",", 0), 0u) << row;  // section, name, phase, calls
  }
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
