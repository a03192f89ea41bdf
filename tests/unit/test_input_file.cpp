// The one input-file reader (core/input_file.h): a FIFO, a device or a directory is refused
// before it is opened (main blocked forever on `mkfifo f.txt; qparity tokenize --text f.txt`,
// and read /dev/zero until memory ran out), and sizes are bounded with a named error.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/input_file.h"
#include "core/json_util.h"
#include "error_of.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;

TEST(InputFile, NonRegularFilesAreRefusedBeforeTheyAreOpened) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_input_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path fifo = dir / "f.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO for reading would block this test forever: the check comes first.
  EXPECT_THAT(error_of([&] { read_input_file(fifo, "text file"); }),
              HasSubstr("f.txt: is not a regular file"));
  EXPECT_THAT(error_of([&] { read_json_file(fifo); }), HasSubstr("is not a regular file"));
  EXPECT_THAT(error_of([&] { read_input_file("/dev/zero", "text file"); }),
              HasSubstr("/dev/zero: is not a regular file"));
  EXPECT_EQ(error_of([&] { read_input_file(dir, "token file"); }),
            dir.string() + ": is a directory, not a token file");
  EXPECT_EQ(error_of([&] { read_input_file(dir / "missing", "token file"); }),
            (dir / "missing").string() + ": no such token file");
  const fs::path big = dir / "big.txt";
  std::ofstream(big) << std::string(4096, 'a');
  EXPECT_EQ(read_input_file(big, "text file").size(), 4096u);
  EXPECT_THAT(error_of([&] { read_input_file(big, "text file", 1000); }),
              HasSubstr("big.txt: text file of 4.0 KiB is larger than"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity
