// --memory-budget values: binary units, case-insensitive, fractions; bad values are refused
// naming the option and the value. And the machine's own figures are sane.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/memory_budget.h"
#include "error_of.h"

namespace qparity {
namespace {

using test::error_of;
using ::testing::HasSubstr;

TEST(MemoryBudget, ParsesBinaryUnits) {
  EXPECT_EQ(parse_memory_size("123456789", "--memory-budget"), 123456789u);
  EXPECT_EQ(parse_memory_size("512B", "x"), 512u);
  EXPECT_EQ(parse_memory_size("4K", "x"), 4096u);
  EXPECT_EQ(parse_memory_size("512M", "x"), 512ull << 20);
  EXPECT_EQ(parse_memory_size("6G", "x"), 6ull << 30);
  EXPECT_EQ(parse_memory_size("6g", "x"), 6ull << 30);
  EXPECT_EQ(parse_memory_size("6GiB", "x"), 6ull << 30);
  EXPECT_EQ(parse_memory_size("6GB", "x"), 6ull << 30);
  EXPECT_EQ(parse_memory_size("1.5G", "x"), 3ull << 29);
  EXPECT_EQ(parse_memory_size("2T", "x"), 2ull << 40);
}

TEST(MemoryBudget, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "G", "-1G", "0", "0.1B", "6X", "6 G", "1.2.3G", "9000000000T"}) {
    const std::string e = error_of([&] { parse_memory_size(bad, "--memory-budget"); });
    EXPECT_THAT(e, HasSubstr("--memory-budget")) << bad;
    EXPECT_THAT(e, HasSubstr(std::string("'") + bad + "' is not a memory size")) << bad;
  }
}

TEST(MemoryBudget, MachineFiguresAndFormatting) {
  EXPECT_GT(available_memory_bytes(), uint64_t{1} << 20);
  EXPECT_GT(peak_resident_bytes(), 0u);  // Linux: /proc/self/status has VmHWM
  EXPECT_EQ(format_bytes(812), "812 B");
  EXPECT_EQ(format_bytes(64 << 10), "64.0 KiB");
  EXPECT_EQ(format_bytes(3ull << 29), "1.5 GiB");
}

}  // namespace
}  // namespace qparity
