#include "client/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::ReadFileToString;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempPath;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(MappedInputFileTest, MapsTheWholeFile) {
  const std::string path = TempPath("in.bin");
  std::ofstream(path, std::ios::binary) << "hello, mapping";
  absl::StatusOr<std::unique_ptr<MappedInputFile>> f =
      MappedInputFile::Open(path, "test file");
  ASSERT_THAT(f.status(), IsOk());
  EXPECT_EQ((*f)->bytes(), "hello, mapping");
  const std::string empty = TempPath("empty.bin");
  std::ofstream(empty, std::ios::binary) << "";
  f = MappedInputFile::Open(empty, "test file");
  ASSERT_THAT(f.status(), IsOk());
  EXPECT_EQ((*f)->size(), 0);
  EXPECT_EQ((*f)->bytes(), "");
}

TEST(MappedInputFileTest, ErrorsNameTheKindAndFile) {
  EXPECT_THAT(
      MappedInputFile::Open(TempPath("absent.bin"), "test file").status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("test file '")));
  EXPECT_THAT(MappedInputFile::Open(TempPath(""), "test file").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a regular file")));
}

// Reads every byte of the mapping (every page is touched); counts 'x'.
int64_t CountX(const MappedInputFile& file) {
  int64_t n = 0;
  for (int64_t i = 0; i < file.size(); ++i) n += file.data()[i] == 'x';
  return n;
}

// Reading pages past the end of a file that shrank after it was mapped
// used to kill the process with SIGBUS (the CLI, or an SDK user's whole
// Python process).
TEST(MappedInputFileTest, AFileThatShrinksWhileReadIsReportedNotAFault) {
  const std::string path = TempPath("shrinks.bin");
  std::ofstream(path, std::ios::binary) << std::string(1 << 16, 'x');
  absl::StatusOr<std::unique_ptr<MappedInputFile>> f =
      MappedInputFile::Open(path, "test file");
  ASSERT_THAT(f.status(), IsOk());
  EXPECT_THAT((*f)->CheckUnchanged(), IsOk());
  ASSERT_EQ(truncate(path.c_str(), 5000), 0);
  // Pages past the new end read as zeros; the rest of the last page too.
  EXPECT_EQ(CountX(**f), 5000);
  EXPECT_THAT((*f)->CheckUnchanged(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("test file '"),
                             HasSubstr("changed while it was read"),
                             HasSubstr("shrank from 65536 to 5000 bytes"))));
  // Found by address too, as Client::Put finds its data.
  EXPECT_THAT(CheckMappedInput((*f)->data() + 100, 1000),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::string other(100, 'y');
  EXPECT_THAT(CheckMappedInput(other.data(), 100), IsOk());
}

TEST(MappedInputFileTest, AFileWrittenToWhileMappedIsReported) {
  const std::string path = TempPath("grows.bin");
  std::ofstream(path, std::ios::binary) << std::string(8192, 'x');
  absl::StatusOr<std::unique_ptr<MappedInputFile>> f =
      MappedInputFile::Open(path, "test file");
  ASSERT_THAT(f.status(), IsOk());
  std::ofstream(path, std::ios::binary | std::ios::app) << "more";
  EXPECT_THAT((*f)->CheckUnchanged(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("grew from 8192 to 8196 bytes")));
}

// The guard takes only faults in input mappings: any other SIGBUS still
// ends the process as it would without it.
TEST(MappedInputFileDeathTest, OtherBusErrorsStillEndTheProcess) {
  const std::string guarded = TempPath("guarded.bin");
  std::ofstream(guarded, std::ios::binary) << std::string(8192, 'x');
  const std::string bare = TempPath("bare.bin");
  std::ofstream(bare, std::ios::binary) << std::string(8192, 'x');
  EXPECT_EXIT(
      {
        auto f = MappedInputFile::Open(guarded, "test file");
        const int fd = open(bare.c_str(), O_RDONLY);
        auto* p = static_cast<volatile const char*>(
            mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0));
        if (ftruncate(open(bare.c_str(), O_WRONLY), 0) != 0) _exit(3);
        _exit(p[4096] == 'x' ? 1 : 2);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(MappedOutputFileTest, CommitRenamesIntoPlaceReplacingAnOldFile) {
  const std::string path = TempPath("out.bin");
  std::ofstream(path, std::ios::binary) << "old";
  absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
      MappedOutputFile::Create(path, 5, "test file");
  ASSERT_THAT(f.status(), IsOk());
  std::memcpy((*f)->data(), "fresh", 5);
  EXPECT_EQ(ReadFileToString(path), "old");  // untouched until Commit
  ASSERT_THAT((*f)->Commit(), IsOk());
  EXPECT_EQ(ReadFileToString(path), "fresh");
  EXPECT_THAT((*f)->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(MappedOutputFileTest, WithoutCommitNothingIsLeft) {
  const std::string dir = TempPath("out_dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  {
    absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
        MappedOutputFile::Create(dir + "/x.bin", 1 << 20, "test file");
    ASSERT_THAT(f.status(), IsOk());
    (*f)->data()[(1 << 20) - 1] = 'z';
  }
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "the temporary file was left behind";
}

// A link names where the bytes go; it is not itself replaced (numpy.save
// and a shell's redirection write through it too).
TEST(MappedOutputFileTest, ThroughALinkTheFileItPointsToIsWritten) {
  const std::string dir = TempPath("linked");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string real = dir + "/real.bin";
  std::ofstream(real, std::ios::binary) << "old";
  ASSERT_EQ(symlink("real.bin", (dir + "/relative.bin").c_str()), 0);
  ASSERT_EQ(
      symlink((dir + "/relative.bin").c_str(), (dir + "/chain.bin").c_str()),
      0);
  ASSERT_EQ(symlink("new.bin", (dir + "/dangling.bin").c_str()), 0);
  for (const char* name : {"/chain.bin", "/dangling.bin"}) {
    absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
        MappedOutputFile::Create(dir + name, 5, "test file");
    ASSERT_THAT(f.status(), IsOk()) << name;
    std::memcpy((*f)->data(), "fresh", 5);
    ASSERT_THAT((*f)->Commit(), IsOk()) << name;
  }
  EXPECT_EQ(ReadFileToString(real), "fresh");
  EXPECT_EQ(ReadFileToString(dir + "/new.bin"), "fresh");
  for (const char* name : {"/chain.bin", "/relative.bin", "/dangling.bin"}) {
    struct stat st {};
    ASSERT_EQ(lstat((dir + name).c_str(), &st), 0) << name;
    EXPECT_TRUE(S_ISLNK(st.st_mode)) << name << " was replaced";
  }
  ASSERT_EQ(symlink("loop.bin", (dir + "/loop.bin").c_str()), 0);
  EXPECT_THAT(
      MappedOutputFile::Create(dir + "/loop.bin", 5, "test file").status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("symbolic links")));
}

// A link another user planted in a shared sticky directory (/tmp) is not
// followed, as the kernel's fs.protected_symlinks would not: it would aim
// a root user's output at any file.
TEST(MappedOutputFileTest, ALinkPlantedInASharedDirectoryIsNotFollowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make another's link";
  const std::string shared = TempPath("shared_tmp");
  ASSERT_EQ(mkdir(shared.c_str(), 0777), 0);
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);
  const std::string victim = TempPath("victim.bin");
  std::ofstream(victim, std::ios::binary) << "keep";
  const std::string planted = shared + "/out.bin";
  ASSERT_EQ(symlink(victim.c_str(), planted.c_str()), 0);
  ASSERT_EQ(lchown(planted.c_str(), 10098, 10098), 0);
  EXPECT_THAT(MappedOutputFile::Create(planted, 5, "test file").status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("another user's, in a shared directory")));
  EXPECT_EQ(ReadFileToString(victim), "keep");
  // One's own link there is followed.
  ASSERT_EQ(lchown(planted.c_str(), 0, 0), 0);
  absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
      MappedOutputFile::Create(planted, 5, "test file");
  ASSERT_THAT(f.status(), IsOk());
  std::memcpy((*f)->data(), "fresh", 5);
  ASSERT_THAT((*f)->Commit(), IsOk());
  EXPECT_EQ(ReadFileToString(victim), "fresh");
}

// A FIFO (or /dev/stdout, /dev/null) is written into, never renamed over.
TEST(MappedOutputFileTest, APipeIsWrittenIntoAndStaysAPipe) {
  const std::string fifo = TempPath("out.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  constexpr int64_t kSize = int64_t{3} << 20;  // more than a pipe holds
  std::string got;
  std::thread reader([&] {
    std::ifstream in(fifo, std::ios::binary);
    got.assign(std::istreambuf_iterator<char>(in), {});
  });
  absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
      MappedOutputFile::Create(fifo, kSize, "test file");
  ASSERT_THAT(f.status(), IsOk());
  for (int64_t i = 0; i < kSize; ++i)
    (*f)->data()[i] = static_cast<char>(i % 251);
  EXPECT_THAT((*f)->Commit(), IsOk());
  reader.join();
  ASSERT_EQ(got.size(), static_cast<size_t>(kSize));
  for (int64_t i = 0; i < kSize; i += 4093) {
    ASSERT_EQ(got[i], static_cast<char>(i % 251)) << i;
  }
  struct stat st {};
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// A reader that leaves makes the commit fail with EPIPE, not end the
// process with SIGPIPE (an SDK user's process may not ignore it).
TEST(MappedOutputFileTest, APipeWhoseReaderLeavesIsAnError) {
  const std::string fifo = TempPath("gone.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  struct sigaction previous {};
  struct sigaction fatal {};
  fatal.sa_handler = SIG_DFL;
  ASSERT_EQ(sigaction(SIGPIPE, &fatal, &previous), 0);
  std::thread reader([&] { close(open(fifo.c_str(), O_RDONLY)); });
  absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
      MappedOutputFile::Create(fifo, int64_t{4} << 20, "test file");
  reader.join();
  ASSERT_THAT(f.status(), IsOk());
  EXPECT_THAT((*f)->Commit(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("Broken pipe")));
  sigaction(SIGPIPE, &previous, nullptr);
}

TEST(MappedOutputFileTest, AFullDeviceIsAnErrorAndStaysADevice) {
  struct stat st {};
  if (stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode)) {
    GTEST_SKIP() << "no /dev/full here";
  }
  absl::StatusOr<std::unique_ptr<MappedOutputFile>> f =
      MappedOutputFile::Create("/dev/full", 4096, "test file");
  ASSERT_THAT(f.status(), IsOk());
  EXPECT_THAT((*f)->Commit(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("/dev/full"), HasSubstr("No space"))));
  ASSERT_EQ(stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(MappedOutputFileTest, ADirectoryIsRefusedBeforeAnyByteMoves) {
  const std::string dir = TempPath("a_dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  EXPECT_THAT(MappedOutputFile::Create(dir, 8, "test file").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("a_dir"), HasSubstr("Is a directory"))));
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "something was left in it";
}

TEST(MappedOutputFileTest, Errors) {
  EXPECT_THAT(
      MappedOutputFile::Create(TempPath("no/such/dir/x.bin"), 8, "test file")
          .status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir/x.bin")));
  EXPECT_THAT(
      MappedOutputFile::Create(TempPath("zero.bin"), 0, "test file").status(),
      StatusIs(absl::StatusCode::kInvalidArgument));
  // More than any disk: refused when the blocks are reserved, not later.
  const absl::Status huge =
      MappedOutputFile::Create(TempPath("huge.bin"), int64_t{1} << 60,
                               "test file")
          .status();
  EXPECT_FALSE(huge.ok());
  EXPECT_THAT(std::string(huge.message()), HasSubstr("test file"));
  EXPECT_NE(access(TempPath("huge.bin").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace tessera
