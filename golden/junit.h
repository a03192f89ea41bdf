#pragma once
// A JUnit XML file of a report root's rows, for the CI systems that show test results from JUnit
// (GitLab, Jenkins, GitHub Actions' test reporters): one <testcase> per report the index lists
// (a FAIL is a <failure> with the policy's reasons, NOT JUDGED a <skipped>: never a pass) and
// per scheme the run skipped, with the report's path and end-to-end numbers as properties.
#include <filesystem>
#include <string>

namespace qparity::golden {

// The XML for the rows under `report_root`, as one <testsuite> named `suite`.
std::string junit_xml(const std::filesystem::path& report_root, const std::string& suite);

// Before a long run: an error unless `path` is new (its directory existing) or a JUnit file
// qparity wrote, so a run never ends by refusing its own output.
void check_junit_target(const std::filesystem::path& path);

// Writes it to `path` atomically. An existing file is replaced only when qparity wrote it (its
// first line is junit_xml's marker); anything else there is an error, left as it is.
void write_junit(const std::filesystem::path& path, const std::filesystem::path& report_root,
                 const std::string& suite);

}  // namespace qparity::golden
