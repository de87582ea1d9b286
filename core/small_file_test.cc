#include "core/small_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempPath;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ReadSmallFileTest, ReadsTheWholeFileAndItsMode) {
  const std::string path = TempPath("small.txt");
  std::ofstream(path) << "secret\n";
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  mode_t mode = 0;
  absl::StatusOr<std::string> text =
      ReadSmallFile(path, 7, "token file", &mode);
  ASSERT_THAT(text.status(), IsOk());
  EXPECT_EQ(*text, "secret\n");
  EXPECT_EQ(mode & 0777, 0600u);
}

TEST(ReadSmallFileTest, MoreThanTheBoundIsAnErrorNotAHang) {
  const std::string path = TempPath("big.txt");
  std::ofstream(path) << "12345678";
  EXPECT_THAT(ReadSmallFile(path, 7, "token file").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token file"), HasSubstr("big.txt"),
                             HasSubstr("more than 7 bytes"))));
  // A device that never ends.
  EXPECT_THAT(ReadSmallFile("/dev/zero", 1 << 20, "CA file").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("CA file /dev/zero holds more than")));
}

TEST(ReadSmallFileTest, AFifoNoOneWritesToReadsAsEmpty) {
  const std::string path = TempPath("quiet.fifo");
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<std::string> text = ReadSmallFile(path, 100, "token file");
  ASSERT_THAT(text.status(), IsOk());
  EXPECT_EQ(*text, "");
}

TEST(ReadSmallFileTest, ErrorsSayWhatAndWhy) {
  EXPECT_THAT(
      ReadSmallFile(TempPath("missing.txt"), 100, "token file").status(),
      StatusIs(absl::StatusCode::kNotFound,
               AllOf(HasSubstr("cannot read token file"),
                     HasSubstr("No such file"))));
  EXPECT_THAT(
      ReadSmallFile(TempPath(""), 100, "quotas file").status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("Is a directory")));
}

}  // namespace
}  // namespace tessera
