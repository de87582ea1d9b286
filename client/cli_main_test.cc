// The `tessera` binary on files it cannot hold: a header that promises more
// than the file has, and an array larger than the memory the process may
// use. Each must end in one `error: ...` line and exit 1, never a signal.
// Neither needs a cluster: `put` reads its file before it connects.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/dtype.h"
#include "core/npy.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::TempPath;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? absl::StrCat(srcdir, "/tessera/client/tessera")
                           : "bazel-bin/client/tessera";
}

struct Outcome {
  bool exited = false;  // false: killed by a signal
  int code = -1;        // the exit code, or the signal
  std::string err;
};

// Runs the CLI with `args`, its address space limited to `limit_bytes`
// (0: no limit), and collects how it ended and its stderr.
Outcome RunCli(const std::vector<std::string>& args, rlim_t limit_bytes) {
  const std::string err_path = TempPath("cli_err");
  const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err_fd, 2);
    if (limit_bytes > 0) {
      rlimit limit{limit_bytes, limit_bytes};
      setrlimit(RLIMIT_AS, &limit);
    }
    std::vector<std::string> all = {BinaryPath(), "--coordinator=127.0.0.1:1"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(err_fd);
  int status = 0;
  waitpid(pid, &status, 0);
  Outcome outcome;
  outcome.exited = WIFEXITED(status);
  outcome.code = outcome.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  outcome.err = text.str();
  return outcome;
}

TEST(CliMainTest, HeaderDeclaringTwoToThe47ElementsIsAnErrorLine) {
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (140737488355328,), "
      "}";
  dict.append(118 - 10 - dict.size() - 1, ' ');
  dict.push_back('\n');
  const std::string path = TempPath("huge.npy");
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(dict.size())
        << '\0' << dict;
  }
  const Outcome outcome = RunCli(
      {"put", "t", "--input", path, "--chunk_dim=0", "--placements=rank:0"}, 0);
  ASSERT_TRUE(outcome.exited) << "killed by signal " << outcome.code;
  EXPECT_EQ(outcome.code, 1);
  EXPECT_THAT(outcome.err, StartsWith("error: "));
  EXPECT_THAT(outcome.err, HasSubstr("truncated"));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(outcome.err, '\n')).size(),
            2u)
      << outcome.err;
}

TEST(CliMainTest, ArrayLargerThanTheMemoryLimitIsAnOutOfMemoryLine) {
  // A valid 4 GiB file (sparse: it takes no disk) and 1 GiB of address
  // space for the whole process.
  constexpr int64_t kElements = int64_t{1} << 30;
  const std::string header = EncodeNpyHeader(DType::kFloat32, {kElements});
  const std::string path = TempPath("big.npy");
  {
    std::ofstream out(path, std::ios::binary);
    out << header;
  }
  ASSERT_EQ(
      truncate(path.c_str(), static_cast<off_t>(header.size()) + kElements * 4),
      0);
  const Outcome outcome = RunCli(
      {"put", "t", "--input", path, "--chunk_dim=0", "--placements=rank:0"},
      rlim_t{1} << 30);
  unlink(path.c_str());
  ASSERT_TRUE(outcome.exited) << "killed by signal " << outcome.code;
  EXPECT_EQ(outcome.code, 1);
  EXPECT_THAT(outcome.err, StartsWith("error: out of memory"));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(outcome.err, '\n')).size(),
            2u)
      << outcome.err;
}

TEST(CliMainTest, MalformedSafetensorsIsAnErrorLineBeforeAnyCluster) {
  // A header length of 2^63: refused from the first 8 bytes.
  const std::string path = TempPath("huge.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("\0\0\0\0\0\0\0\x80{}", 10);
  }
  Outcome outcome =
      RunCli({"import", path, "--chunk_dim=0", "--placements=rank:0"}, 0);
  ASSERT_TRUE(outcome.exited) << "killed by signal " << outcome.code;
  EXPECT_EQ(outcome.code, 1);
  EXPECT_THAT(outcome.err, StartsWith("error: "));
  EXPECT_THAT(outcome.err, HasSubstr("safetensors"));
  EXPECT_THAT(outcome.err, HasSubstr("exceeds the limit"));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(outcome.err, '\n')).size(),
            2u)
      << outcome.err;
  // A 4 GiB file (sparse) whose header promises more than is there, with
  // 1 GiB of address space: refused in one line, whether the mapping or the
  // header check says so first.
  const std::string big = TempPath("big.safetensors");
  {
    std::ofstream out(big, std::ios::binary);
    const std::string json =
        R"({"w":{"dtype":"F32","shape":[1073741824,2],"data_offsets":[0,8589934592]}})";
    std::string length(8, '\0');
    for (int i = 0; i < 8; ++i)
      length[i] = static_cast<char>(json.size() >> (8 * i));
    out << length << json;
  }
  ASSERT_EQ(truncate(big.c_str(), int64_t{1} << 32), 0);
  outcome = RunCli({"import", big, "--chunk_dim=0", "--placements=rank:0"},
                   rlim_t{1} << 30);
  ASSERT_TRUE(outcome.exited) << "killed by signal " << outcome.code;
  EXPECT_EQ(outcome.code, 1);
  EXPECT_THAT(outcome.err, StartsWith("error: "));
  EXPECT_THAT(outcome.err, HasSubstr("safetensors"));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(outcome.err, '\n')).size(),
            2u)
      << outcome.err;
  // Without the limit, the header's own problem is named.
  outcome = RunCli({"import", big, "--chunk_dim=0", "--placements=rank:0"}, 0);
  EXPECT_EQ(outcome.code, 1);
  EXPECT_THAT(outcome.err, HasSubstr("outside the data section"));
  unlink(big.c_str());
}

// What `tessera ARGS` prints on stdout.
std::string Stdout(const std::string& args) {
  std::string out;
  FILE* pipe = popen((BinaryPath() + " " + args + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    out.append(buffer, n);
  pclose(pipe);
  return out;
}

// Each "--NAME" in `text`.
std::set<std::string> FlagsIn(absl::string_view text) {
  std::set<std::string> flags;
  for (size_t at = text.find("--"); at != absl::string_view::npos;
       at = text.find("--", at + 2)) {
    size_t end = at + 2;
    while (end < text.size() &&
           (absl::ascii_islower(text[end]) || text[end] == '_')) {
      ++end;
    }
    if (end > at + 2)
      flags.insert(std::string(text.substr(at + 2, end - at - 2)));
  }
  return flags;
}

// One flag table: every command's --help lists, under "flags:", exactly
// the flags its synopsis names (SPEC standing for --chunk_dim,
// --placements and --shards), each with a line of help, so the synopsis,
// the parser and the help cannot drift apart. The global flags likewise.
TEST(CliMainTest, EveryCommandsHelpListsTheFlagsItsSynopsisNames) {
  const std::string main_help = Stdout("--help");
  const size_t commands_at = main_help.find("\ncommands:\n");
  ASSERT_NE(commands_at, std::string::npos) << main_help;
  const std::string globals = main_help.substr(0, commands_at);
  for (const char* flag : {"coordinator", "transport", "timeout", "tls_ca",
                           "tls_cert", "tls_key", "token_file", "verbose"}) {
    EXPECT_THAT(globals, HasSubstr(absl::StrCat("\n  --", flag)));
  }
  std::vector<std::string> commands;
  for (absl::string_view line :
       absl::StrSplit(main_help.substr(commands_at + 11), '\n')) {
    if (line.empty()) break;
    if (line.size() > 2 && line.substr(0, 2) == "  " &&
        absl::ascii_islower(line[2])) {
      commands.emplace_back(line.substr(2, line.find(' ', 2) - 2));
    }
  }
  EXPECT_GE(commands.size(), 17u) << main_help;
  for (const std::string& command : commands) {
    const std::string help = Stdout(command + " --help");
    ASSERT_THAT(help, StartsWith("usage: tessera " + command)) << command;
    const std::string synopsis = help.substr(0, help.find('\n'));
    std::set<std::string> named = FlagsIn(synopsis);
    if (absl::StrContains(synopsis, "SPEC")) {
      named.insert({"chunk_dim", "placements", "shards"});
    }
    std::set<std::string> listed;
    const size_t flags_at = help.find("\nflags:\n");
    if (flags_at != std::string::npos) {
      for (absl::string_view line :
           absl::StrSplit(help.substr(flags_at + 8), '\n')) {
        if (line.empty()) break;
        ASSERT_THAT(std::string(line), StartsWith("  --")) << command;
        const std::set<std::string> one =
            FlagsIn(line.substr(0, line.find(' ', 2)));
        ASSERT_EQ(one.size(), 1u) << line;
        listed.insert(*one.begin());
        // A line of help after the flag.
        EXPECT_GT(line.size(), line.find_first_not_of(' ', line.find(' ', 2)))
            << line;
      }
    }
    EXPECT_EQ(listed, named) << command << ":\n" << help;
  }
}

}  // namespace
}  // namespace tessera
