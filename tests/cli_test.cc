// End-to-end tests of the `tessera` CLI against a real cluster (one
// coordinator, workers w0..w3 with ranks 0..3), driven exactly as
// shared/CLI.md writes it: exit codes, the single `error: ` line and its
// words, --json shapes, and data compared with NumPy's semantics.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/npy_file.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/npy.h"
#include "core/parse.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- a tiny JSON reader, enough to check the CLI's output
// ---------------------

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string text;  // a string's value, or a number's literal
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json& operator[](const std::string& key) const {
    for (const auto& [k, v] : fields) {
      if (k == key) return v;
    }
    ADD_FAILURE() << "JSON object has no key '" << key << "'";
    static const Json* null = new Json();
    return *null;
  }
  const Json& operator[](size_t i) const { return items.at(i); }
  size_t size() const {
    return type == Type::kArray ? items.size() : fields.size();
  }
  bool IsInt() const {
    return type == Type::kNumber &&
           text.find_first_of(".eE") == std::string::npos;
  }
  int64_t Int() const {
    EXPECT_TRUE(IsInt()) << "not a JSON integer: '" << text << "'";
    int64_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(text, &v)) << text;
    return v;
  }
  double Double() const {
    EXPECT_EQ(type, Type::kNumber);
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(text, &v)) << text;
    return v;
  }
  const std::string& Str() const {
    EXPECT_EQ(type, Type::kString);
    return text;
  }
  bool Bool() const {
    EXPECT_EQ(type, Type::kBool);
    return boolean;
  }
  std::vector<int64_t> IntList() const {
    EXPECT_EQ(type, Type::kArray);
    std::vector<int64_t> out;
    for (const Json& j : items) out.push_back(j.Int());
    return out;
  }
  std::vector<std::string> Keys() const {
    std::vector<std::string> out;
    for (const auto& f : fields) out.push_back(f.first);
    return out;
  }
};

class JsonReader {
 public:
  explicit JsonReader(absl::string_view s) : s_(s) {}

  bool Parse(Json* out) {
    if (!Value(out)) return false;
    Space();
    return pos_ == s_.size();
  }

 private:
  void Space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' ||
                                s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    Space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Word(absl::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (pos_ >= s_.size()) return false;
        char e = s_[pos_++];
        switch (e) {
          case '"':
          case '\\':
          case '/':
            c = e;
            break;
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'r':
            c = '\r';
            break;
          case 'b':
            c = '\b';
            break;
          case 'f':
            c = '\f';
            break;
          case 'u': {
            int v = 0;
            if (pos_ + 4 > s_.size()) return false;
            for (int i = 0; i < 4; ++i) {
              const char h = s_[pos_++];
              v = v * 16 + (isdigit(h) ? h - '0' : (tolower(h) - 'a' + 10));
            }
            if (v >= 0x80) return false;  // ASCII is all the CLI emits
            c = static_cast<char>(v);
            break;
          }
          default:
            return false;
        }
      }
      out->push_back(c);
    }
    return Eat('"');
  }
  bool Value(Json* out) {
    Space();
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '{') {
      out->type = Json::Type::kObject;
      ++pos_;
      if (Eat('}')) return true;
      do {
        std::string key;
        Json value;
        if (!String(&key) || !Eat(':') || !Value(&value)) return false;
        out->fields.emplace_back(std::move(key), std::move(value));
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      out->type = Json::Type::kArray;
      ++pos_;
      if (Eat(']')) return true;
      do {
        Json value;
        if (!Value(&value)) return false;
        out->items.push_back(std::move(value));
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      out->type = Json::Type::kString;
      return String(&out->text);
    }
    if (Word("true")) {
      out->type = Json::Type::kBool;
      out->boolean = true;
      return true;
    }
    if (Word("false")) {
      out->type = Json::Type::kBool;
      return true;
    }
    if (Word("null")) return true;
    const size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() &&
           (isdigit(s_[pos_]) || s_[pos_] == '.' || s_[pos_] == 'e' ||
            s_[pos_] == 'E' || s_[pos_] == '+' || s_[pos_] == '-')) {
      ++pos_;
    }
    if (pos_ == start) return false;
    out->type = Json::Type::kNumber;
    out->text = std::string(s_.substr(start, pos_ - start));
    double unused;
    return absl::SimpleAtod(out->text, &unused);
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

Json ParseJsonOrFail(const std::string& text) {
  Json json;
  EXPECT_TRUE(JsonReader(text).Parse(&json)) << "not JSON: " << text;
  return json;
}

// ---- running the CLI
// ---------------------------------------------------------

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.code << "\nstdout: " << r.out
            << "\nstderr: " << r.err;
}

Result RunTessera(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {TestCluster::BinaryPath("client/tessera")};
  argv.insert(argv.end(), args.begin(), args.end());
  Result r;
  r.code = TestCluster::Run(argv, &r.out, &r.err);
  return r;
}

// Checks a failure: the exit code, and exactly one stderr line "error: ..."
// holding every word.
void ExpectError(const Result& r, int code,
                 const std::vector<std::string>& words) {
  EXPECT_EQ(r.code, code) << r;
  EXPECT_TRUE(absl::StartsWith(r.err, "error: ")) << r;
  EXPECT_TRUE(absl::EndsWith(r.err, "\n")) << r;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
  for (const std::string& w : words) EXPECT_THAT(r.err, HasSubstr(w)) << r;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

bool HaveNumpy() {
  static const bool have =
      std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0;
  return have;
}

// Runs a Python script with NumPy (as np) imported; true on exit 0.
bool RunPython(const std::string& body) {
  const std::string path = TempPath("script.py");
  {
    std::ofstream f(path);
    f << "import numpy as np\n" << body << "\n";
  }
  return std::system(absl::StrCat("/usr/bin/python3 ", path).c_str()) == 0;
}

HostArray ReadOrDie(const std::string& path,
                    std::optional<DType> dtype = std::nullopt) {
  absl::StatusOr<HostArray> a = ReadNpyFile(path, dtype);
  EXPECT_THAT(a, IsOk()) << path;
  if (!a.ok()) return HostArray::Allocate(DType::kInt8, {0});
  return *std::move(a);
}

// An int64 array holding its own flat index, as `--init=arange` with int64.
HostArray ArangeInt64(const Shape& shape) {
  HostArray a = HostArray::Allocate(DType::kInt64, shape);
  for (int64_t i = 0; i < a.NumElements(); ++i) a.As<int64_t>()[i] = i;
  return a;
}

Box ParseBoxOrDie(const std::string& region, const Shape& shape) {
  auto ranges = ParseRanges(region);
  EXPECT_THAT(ranges, IsOk());
  auto box = ResolveRegion(*ranges, shape);
  EXPECT_THAT(box, IsOk()) << region;
  return *box;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start();
    if (cluster.ok()) {
      cluster_ = std::move(cluster).value().release();
    } else {
      *start_error_ = std::string(cluster.status().message());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr) << *start_error_; }

  static std::string Addr() { return cluster_->coordinator_address(); }

  // Runs `tessera --coordinator=ADDR ARGS...`.
  static Result Tessera(const std::vector<std::string>& args) {
    std::vector<std::string> all = {absl::StrCat("--coordinator=", Addr())};
    all.insert(all.end(), args.begin(), args.end());
    return RunTessera(all);
  }
  static Result Ok(const std::vector<std::string>& args) {
    Result r = Tessera(args);
    EXPECT_EQ(r.code, 0) << absl::StrJoin(args, " ") << "\n" << r;
    EXPECT_EQ(r.err, "") << r;
    return r;
  }
  static Json Describe(const std::string& name) {
    return ParseJsonOrFail(Ok({"describe", name, "--json"}).out);
  }
  static std::vector<int64_t> BytesUsed() {
    Json workers = ParseJsonOrFail(Ok({"workers", "--json"}).out);
    std::map<std::string, int64_t> by_name;
    for (const Json& w : workers.items)
      by_name[w["name"].Str()] = w["bytes_used"].Int();
    std::vector<int64_t> out;
    for (const auto& [name, bytes] : by_name) out.push_back(bytes);
    return out;
  }
  // What a failed command must leave unchanged: the tensors and every
  // worker's bytes_used.
  struct State {
    std::vector<std::string> tensors;
    std::vector<int64_t> bytes_used;
    bool operator==(const State& o) const {
      return tensors == o.tensors && bytes_used == o.bytes_used;
    }
  };
  static State Snapshot() {
    State s;
    Json list = ParseJsonOrFail(Ok({"ls", "--json"}).out);
    for (const Json& t : list.items) {
      s.tensors.push_back(absl::StrCat(
          t["name"].Str(), "|", absl::StrJoin(t["shape"].IntList(), ","), "|",
          t["dtype"].Str(), "|", t["version"].Int(), "|",
          t["num_shards"].Int()));
    }
    std::sort(s.tensors.begin(), s.tensors.end());
    s.bytes_used = BytesUsed();
    return s;
  }
  // The state once the frees of versions replaced just before have landed
  // (a version nobody reads is freed at once, but not in the same call):
  // two snapshots that agree taken further apart than the 2 s within which
  // bytes_used is current (a heartbeat sent just before a free can report
  // the bytes for up to one heartbeat after it).
  static State SettledSnapshot() {
    State last = Snapshot();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2100));
      State now = Snapshot();
      if (now == last) return now;
      last = std::move(now);
    }
    return last;
  }
  // bytes_used is current within 2 s: wait that long for it to match.
  static void ExpectState(const State& want) {
    State got;
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    do {
      got = Snapshot();
      if (got == want) return;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    EXPECT_EQ(absl::StrJoin(got.tensors, " "),
              absl::StrJoin(want.tensors, " "));
    EXPECT_EQ(got.bytes_used, want.bytes_used);
  }

  static TestCluster* cluster_;
  static std::string* start_error_;
};

TestCluster* CliTest::cluster_ = nullptr;
std::string* CliTest::start_error_ = new std::string();

// ---- listing
// --------------------------------------------------------------------

TEST_F(CliTest, WorkersJsonListsEveryWorker) {
  Json workers = ParseJsonOrFail(Ok({"workers", "--json"}).out);
  ASSERT_EQ(workers.type, Json::Type::kArray);
  ASSERT_EQ(workers.size(), 4u);
  std::map<std::string, const Json*> by_name;
  for (const Json& w : workers.items) {
    EXPECT_EQ(w.Keys(),
              (std::vector<std::string>{"name", "rank", "address", "device",
                                        "alive", "bytes_used", "zone",
                                        "data_address", "labels", "state"}));
    by_name[w["name"].Str()] = &w;
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(by_name.count(cluster_->worker_name(i)), 1u);
    const Json& w = *by_name[cluster_->worker_name(i)];
    EXPECT_EQ(w["rank"].Int(), i);
    EXPECT_EQ(w["address"].Str(), cluster_->worker_address(i));
    EXPECT_EQ(w["device"].Str(), "cpu");
    EXPECT_TRUE(w["alive"].Bool());
    EXPECT_GE(w["bytes_used"].Int(), 0);
    // No --zone: the host is the failure domain.
    char host[256] = {};
    ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
    EXPECT_EQ(w["zone"].Str(), host);
    EXPECT_EQ(w["state"].Str(), "ready");
  }
  Result table = Ok({"workers"});
  EXPECT_THAT(table.out, HasSubstr("w3"));
  EXPECT_THAT(table.out, HasSubstr(cluster_->worker_address(2)));
  // Each worker's zone and state, as --json says them.
  EXPECT_THAT(table.out, ::testing::StartsWith("NAME"));
  EXPECT_THAT(table.out, HasSubstr("ZONE"));
  EXPECT_THAT(table.out, HasSubstr("STATE"));
  for (const Json& w : workers.items) {
    EXPECT_THAT(table.out,
                ::testing::ContainsRegex(absl::StrCat(
                    w["name"].Str(), " .* ", w["zone"].Str(), " +ready +yes ")))
        << table.out;
  }
}

TEST_F(CliTest, BytesUsedIsExactAfterCreateAndRm) {
  const std::vector<int64_t> before = BytesUsed();
  // 10 x 6 float64 over w0, w1, w1 (chunk dim 1, split 2): 10*2*8 bytes each.
  Ok({"create", "bytes_t", "--shape=10,6", "--dtype=float64", "--chunk_dim=1",
      "--placements=w0,w1,w1"});
  std::vector<int64_t> want = before;
  want[0] += 160;
  want[1] += 320;
  EXPECT_EQ(BytesUsed(), want);
  Ok({"rm", "bytes_t"});
  EXPECT_EQ(BytesUsed(), before);
  ExpectError(Tessera({"describe", "bytes_t"}), 1, {"not found", "bytes_t"});
}

TEST_F(CliTest, LsJsonAndTable) {
  Ok({"create", "ls_t/a.b-c_d", "--shape=3,4", "--dtype=int16", "--chunk_dim=0",
      "--placements=w2,w3"});
  Json list = ParseJsonOrFail(Ok({"ls", "--json"}).out);
  ASSERT_EQ(list.type, Json::Type::kArray);
  bool found = false;
  for (const Json& t : list.items) {
    EXPECT_EQ(t.Keys(),
              (std::vector<std::string>{"name", "shape", "dtype", "version",
                                        "num_shards", "replicas"}));
    if (t["name"].Str() != "ls_t/a.b-c_d") continue;
    found = true;
    EXPECT_EQ(t["shape"].IntList(), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(t["dtype"].Str(), "int16");
    EXPECT_EQ(t["version"].Int(), 1);
    EXPECT_EQ(t["num_shards"].Int(), 2);
  }
  EXPECT_TRUE(found);
  EXPECT_THAT(Ok({"ls"}).out, HasSubstr("ls_t/a.b-c_d"));
  Ok({"rm", "ls_t/a.b-c_d"});
}

// ls PREFIX lists the tensors whose names start with it; rm takes several
// names, deletes every one it can, and names the ones it could not.
TEST_F(CliTest, LsByPrefixAndRmOfSeveralNames) {
  for (const char* name : {"pre_t/a", "pre_t/b", "pre_t/c", "pre_u"}) {
    Ok({"create", name, "--shape=4", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0"});
  }
  Json listed = ParseJsonOrFail(Ok({"ls", "pre_t/", "--json"}).out);
  std::vector<std::string> names;
  for (const Json& t : listed.items) names.push_back(t["name"].Str());
  EXPECT_EQ(names, (std::vector<std::string>{"pre_t/a", "pre_t/b", "pre_t/c"}));
  EXPECT_THAT(Ok({"ls", "pre_u"}).out, HasSubstr("pre_u"));
  EXPECT_THAT(Ok({"ls", "pre_u"}).out, Not(HasSubstr("pre_t")));
  EXPECT_EQ(ParseJsonOrFail(Ok({"ls", "no_such_prefix/", "--json"}).out).size(),
            0u);

  Result two = Ok({"rm", "pre_t/a", "pre_t/b"});
  EXPECT_EQ(two.out, "deleted pre_t/a\ndeleted pre_t/b\n");
  // A bad name among them: nothing is deleted.
  ExpectError(Tessera({"rm", "pre_t/c", "bad name!"}), 2, {"bad name!"});
  // A missing one: the others go, the missing one is named, exit 1.
  Result some = Tessera({"rm", "pre_t/c", "pre_t/missing", "pre_u", "--json"});
  ExpectError(some, 1, {"1 of 3 not deleted", "pre_t/missing"});
  Json deleted = ParseJsonOrFail(some.out);
  ASSERT_EQ(deleted.size(), 2u);
  EXPECT_EQ(deleted.items[0]["name"].Str(), "pre_t/c");
  EXPECT_EQ(deleted.items[1]["name"].Str(), "pre_u");
  EXPECT_EQ(ParseJsonOrFail(Ok({"ls", "pre_", "--json"}).out).size(), 0u);
}

// ---- describe and chunk layouts
// -----------------------------------------------------

// --replicas=2: each shard on two distinct workers, the spec's placement
// first; describe and ls show them, and the bytes are the same from either.
TEST_F(CliTest, ReplicasAreShownAndEachHoldsTheBytes) {
  const std::vector<int64_t> before = BytesUsed();
  Ok({"create", "rep_t", "--shape=8,4", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0,rank:1", "--init=arange", "--replicas=2"});
  Json d = Describe("rep_t");
  ASSERT_EQ(d["shards"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Json& replicas = d["shards"][i]["replicas"];
    ASSERT_EQ(replicas.size(), 2u);
    EXPECT_EQ(replicas[0]["worker"].Str(), absl::StrCat("w", i));
    EXPECT_EQ(d["shards"][i]["worker"].Str(), absl::StrCat("w", i));
    EXPECT_NE(replicas[1]["worker"].Str(), replicas[0]["worker"].Str());
    EXPECT_TRUE(replicas[1]["available"].Bool());
  }
  bool listed = false;
  for (const Json& t : ParseJsonOrFail(Ok({"ls", "--json"}).out).items) {
    if (t["name"].Str() != "rep_t") continue;
    listed = true;
    EXPECT_EQ(t["replicas"].Int(), 2);
  }
  EXPECT_TRUE(listed);
  // Four 16-byte shards' worth in all: every replica holds its shard.
  const std::vector<int64_t> after = BytesUsed();
  int64_t grown = 0;
  for (size_t w = 0; w < after.size(); ++w) grown += after[w] - before[w];
  EXPECT_EQ(grown, 2 * 8 * 4 * 4);
  // Down to one replica in place, and back up to three.
  Ok({"reshard", "rep_t", "--replicas=1"});
  EXPECT_EQ(Describe("rep_t")["shards"][0]["replicas"].size(), 1u);
  Ok({"reshard", "rep_t", "--replicas=3"});
  d = Describe("rep_t");
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(d["shards"][i]["replicas"].size(), 3u);
  }
  // The human form shows every replica, each on its own worker.
  {
    const std::string text = Ok({"describe", "rep_t"}).out;
    EXPECT_THAT(text, HasSubstr("REPLICA"));
    for (size_t i = 0; i < 2; ++i) {
      for (const Json& r : d["shards"][i]["replicas"].items) {
        EXPECT_THAT(text, ::testing::ContainsRegex(absl::StrCat(
                              "\n", i, " +[0-2] +[^ ]+ +", r["placement"].Str(),
                              " +", r["worker"].Str(), " ")))
            << text;
      }
    }
  }
  const std::string out_file =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/rep_t.npy");
  // get --json says which workers served the bytes: one replica of each
  // shard, every byte counted once.
  Json got = ParseJsonOrFail(
      Ok({"get", "rep_t", "--output=" + out_file, "--json"}).out);
  int64_t served = 0;
  for (const auto& [worker, bytes] : got["replicas"].fields) {
    EXPECT_EQ(worker[0], 'w') << worker;
    served += bytes.Int();
  }
  EXPECT_EQ(served, 8 * 4 * 4);
  EXPECT_GE(got["replicas"].size(), 2u);  // each shard from one worker
  // A put with two replicas: each shard's first replica (the one the
  // client wrote) sends its 64 bytes to the second, once. An update with the
  // same bytes: only what changed crosses, nothing.
  for (const std::vector<std::string>& write :
       {std::vector<std::string>{"put", "rep_put", "--input=" + out_file,
                                 "--chunk_dim=0", "--placements=rank:0,rank:1",
                                 "--replicas=2", "--json"},
        std::vector<std::string>{"put", "rep_put", "--input=" + out_file,
                                 "--update", "--json"}}) {
    const Json wrote = ParseJsonOrFail(Ok(write).out);
    const int64_t each = write[3] == "--update" ? 0 : 64;
    EXPECT_EQ(wrote["sent"].Keys(), (std::vector<std::string>{"w0", "w1"}))
        << write[3];
    EXPECT_EQ(wrote["sent"]["w0"].Int(), each) << write[3];
    EXPECT_EQ(wrote["sent"]["w1"].Int(), each) << write[3];
    EXPECT_EQ(wrote["relayed_bytes"].Int(), 2 * each) << write[3];
  }
  Ok({"rm", "rep_put"});
  // Bad counts change nothing.
  ExpectError(Tessera({"create", "rep_bad", "--shape=4", "--dtype=int32",
                       "--chunk_dim=0", "--placements=rank:0", "--replicas=0"}),
              2, {"--replicas=0"});
  ExpectError(Tessera({"create", "rep_bad", "--shape=4", "--dtype=int32",
                       "--chunk_dim=0", "--placements=rank:0", "--replicas=5"}),
              1, {"replicas"});
  ExpectError(Tessera({"describe", "rep_bad"}), 1, {"not found"});
  Ok({"rm", "rep_t"});
}

TEST_F(CliTest, DescribeJsonHasEveryField) {
  Ok({"create", "desc_t", "--shape=10,20", "--dtype=float32", "--chunk_dim=0",
      "--placements=rank:0,rank:1,rank:2,rank:3"});
  Json d = Describe("desc_t");
  EXPECT_EQ(d.Keys(), (std::vector<std::string>{"name", "shape", "dtype",
                                                "version", "owner", "shards"}));
  EXPECT_EQ(d["owner"].type, Json::Type::kNull);  // no tokens: no one
  EXPECT_EQ(d["name"].Str(), "desc_t");
  EXPECT_EQ(d["shape"].IntList(), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(d["dtype"].Str(), "float32");
  EXPECT_EQ(d["version"].Int(), 1);
  ASSERT_EQ(d["shards"].size(), 4u);
  std::vector<std::string> handles;
  for (size_t i = 0; i < 4; ++i) {
    const Json& s = d["shards"][i];
    EXPECT_EQ(s.Keys(), (std::vector<std::string>{
                            "offsets", "sizes", "placement", "worker", "handle",
                            "available", "replicas"}));
    ASSERT_EQ(s["replicas"].size(), 1u);
    EXPECT_EQ(s["replicas"][0].Keys(),
              (std::vector<std::string>{"worker", "placement", "available"}));
    EXPECT_EQ(s["replicas"][0]["worker"].Str(), absl::StrCat("w", i));
    EXPECT_EQ(s["offsets"].IntList(),
              (std::vector<int64_t>{static_cast<int64_t>(3 * i), 0}));
    EXPECT_EQ(s["sizes"].IntList(), (std::vector<int64_t>{i < 3 ? 3 : 1, 20}));
    EXPECT_EQ(s["placement"].Str(), absl::StrCat("rank:", i, "/cpu"));
    EXPECT_EQ(s["worker"].Str(), absl::StrCat("w", i));
    EXPECT_TRUE(absl::StartsWith(s["handle"].Str(), "desc_t@v1#"))
        << s["handle"].Str();
    EXPECT_TRUE(s["available"].Bool());
    handles.push_back(s["handle"].Str());
  }
  // The human form names the same things.
  Result text = Ok({"describe", "desc_t"});
  for (const std::string& h : handles) EXPECT_THAT(text.out, HasSubstr(h));
  EXPECT_THAT(text.out, HasSubstr("rank:3/cpu"));
  EXPECT_THAT(text.out, HasSubstr("9:10,0:20"));
  Ok({"rm", "desc_t"});
}

struct ChunkCase {
  std::string shape;
  std::string dim;
  int num_placements;
  std::vector<std::vector<int64_t>> offsets;
  std::vector<std::vector<int64_t>> sizes;
};

TEST_F(CliTest, ChunkOffsetsFollowTorchChunk) {
  const std::vector<ChunkCase> cases = {
      {"5", "0", 4, {{0}, {2}, {4}, {6}}, {{2}, {2}, {1}, {0}}},
      {"4", "0", 3, {{0}, {2}, {4}}, {{2}, {2}, {0}}},
      {"2", "0", 4, {{0}, {1}, {2}, {3}}, {{1}, {1}, {0}, {0}}},
      {"0", "0", 2, {{0}, {0}}, {{0}, {0}}},
      {"3,10", "-1", 2, {{0, 0}, {0, 5}}, {{3, 5}, {3, 5}}},
      {"3,7", "-1", 3, {{0, 0}, {0, 3}, {0, 6}}, {{3, 3}, {3, 3}, {3, 1}}},
      {"2,3,4", "-2", 2, {{0, 0, 0}, {0, 2, 0}}, {{2, 2, 4}, {2, 1, 4}}},
  };
  int n = 0;
  for (const ChunkCase& c : cases) {
    SCOPED_TRACE(absl::StrCat("shape ", c.shape, " dim ", c.dim));
    const std::string name = absl::StrCat("chunk_t", n++);
    std::vector<std::string> placements;
    for (int i = 0; i < c.num_placements; ++i)
      placements.push_back(absl::StrCat("w", i));
    Ok({"create", name, "--shape=" + c.shape, "--dtype=uint8",
        "--chunk_dim=" + c.dim,
        "--placements=" + absl::StrJoin(placements, ","), "--init=arange"});
    Json d = Describe(name);
    ASSERT_EQ(d["shards"].size(), c.offsets.size());
    for (size_t i = 0; i < c.offsets.size(); ++i) {
      EXPECT_EQ(d["shards"][i]["offsets"].IntList(), c.offsets[i]) << i;
      EXPECT_EQ(d["shards"][i]["sizes"].IntList(), c.sizes[i]) << i;
    }
    // Every shard, empty ones too, can be fetched.
    for (size_t i = 0; i < c.offsets.size(); ++i) {
      const std::string out = TempPath(absl::StrCat(name, "_", i, ".npy"));
      Ok({"get", name, "--output=" + out, absl::StrCat("--shard=", i)});
      EXPECT_EQ(ReadOrDie(out).shape, c.sizes[i]);
    }
    Ok({"rm", name});
  }
}

TEST_F(CliTest, PlacementsInEveryFormAreNormalised) {
  Ok({"create", "place_t", "--shape=8", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0/cpu,w1/cpu,rank:2,w3"});
  Json d = Describe("place_t");
  ASSERT_EQ(d["shards"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(d["shards"][i]["placement"].Str(),
              absl::StrCat("rank:", i, "/cpu"));
    EXPECT_EQ(d["shards"][i]["worker"].Str(), absl::StrCat("w", i));
  }
  Ok({"rm", "place_t"});

  // A placement may repeat: one worker holds several shards.
  Ok({"create", "repeat_t", "--shape=9,2", "--dtype=float32", "--chunk_dim=0",
      "--placements=w1,rank:1,w1/cpu", "--init=arange"});
  d = Describe("repeat_t");
  ASSERT_EQ(d["shards"].size(), 3u);
  std::set<std::string> handles;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d["shards"][i]["placement"].Str(), "rank:1/cpu");
    EXPECT_EQ(d["shards"][i]["worker"].Str(), "w1");
    handles.insert(d["shards"][i]["handle"].Str());
  }
  EXPECT_EQ(handles.size(), 3u);
  const std::string out = TempPath("repeat_t.npy");
  Ok({"get", "repeat_t", "--output=" + out});
  HostArray a = ReadOrDie(out);
  ASSERT_EQ(a.shape, (Shape{9, 2}));
  for (int i = 0; i < 18; ++i) EXPECT_EQ(a.As<float>()[i], i);
  Ok({"rm", "repeat_t"});
}

TEST_F(CliTest, EnumerableShardsAreListedInSpecOrder) {
  Ok({"create", "enum_t", "--shape=4,6", "--dtype=int64",
      "--shards=2:4,:@w3;0:2,3:@rank:1;0:2,0:3@w0/cpu;0:0,0:6@w2",
      "--init=arange"});
  Json d = Describe("enum_t");
  ASSERT_EQ(d["shards"].size(), 4u);
  EXPECT_EQ(d["shards"][0]["offsets"].IntList(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(d["shards"][0]["sizes"].IntList(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(d["shards"][0]["worker"].Str(), "w3");
  EXPECT_EQ(d["shards"][1]["offsets"].IntList(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(d["shards"][1]["sizes"].IntList(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(d["shards"][1]["placement"].Str(), "rank:1/cpu");
  EXPECT_EQ(d["shards"][2]["offsets"].IntList(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(d["shards"][2]["worker"].Str(), "w0");
  EXPECT_EQ(d["shards"][3]["sizes"].IntList(), (std::vector<int64_t>{0, 6}));
  const std::string out = TempPath("enum_t.npy");
  Ok({"get", "enum_t", "--output=" + out});
  HostArray a = ReadOrDie(out);
  EXPECT_TRUE(SameBytes(a, ArangeInt64({4, 6})));
  Ok({"rm", "enum_t"});
}

TEST_F(CliTest, FlagValueFormWorksEverywhere) {
  Result r = RunTessera({"--coordinator", Addr(), "create", "space_t",
                         "--shape", "4,4", "--dtype", "int64", "--chunk_dim",
                         "-1", "--placements", "w0,w1", "--init", "arange"});
  ASSERT_EQ(r.code, 0) << r;
  Json d = ParseJsonOrFail(
      RunTessera({"--coordinator", Addr(), "describe", "space_t", "--json"})
          .out);
  ASSERT_EQ(d["shards"].size(), 2u);
  EXPECT_EQ(d["shards"][1]["offsets"].IntList(), (std::vector<int64_t>{0, 2}));
  const std::string out = TempPath("space_t.npy");
  r = RunTessera({"--coordinator", Addr(), "get", "space_t", "--output", out,
                  "--region", "1:,-1:"});
  ASSERT_EQ(r.code, 0) << r;
  EXPECT_TRUE(SameBytes(ReadOrDie(out),
                        Slice(ArangeInt64({4, 4}), Box{{1, 3}, {3, 1}})));
  r = RunTessera({"--coordinator", Addr(), "get", "space_t", "--output", out,
                  "--shard", "1"});
  ASSERT_EQ(r.code, 0) << r;
  EXPECT_TRUE(SameBytes(ReadOrDie(out),
                        Slice(ArangeInt64({4, 4}), Box{{0, 2}, {4, 2}})));
  Ok({"rm", "space_t"});
}

// ---- init modes
// ------------------------------------------------------------------

// Expected values from NumPy itself, for every dtype NumPy has.
TEST_F(CliTest, InitModesEqualNumPy) {
  if (!HaveNumpy()) GTEST_SKIP() << "Debian's numpy is not installed";
  const std::vector<std::string> dtypes = {"float32", "float64", "float16",
                                           "int8",    "uint8",   "int16",
                                           "int32",   "int64",   "bool"};
  struct Init {
    std::string flag;
    std::string numpy;  // with SHAPE and N substituted
  };
  const std::vector<Init> inits = {
      {"zeros", "np.zeros(SHAPE)"},
      {"ones", "np.ones(SHAPE)"},
      {"arange", "np.arange(N).reshape(SHAPE)"},
      {"full:-3", "np.full(SHAPE, -3)"},
      {"full:2.75", "np.full(SHAPE, 2.75)"},
      {"full:300", "np.full(SHAPE, 300)"},
      {"full:true", "np.full(SHAPE, True)"},
      {"full:-0.5", "np.full(SHAPE, -0.5)"},
  };
  const std::string shape = "(7, 50)";  // 350 elements: arange wraps int8/uint8
  std::string script;
  std::vector<std::pair<std::string, std::string>> pairs;  // got, want
  int n = 0;
  for (const std::string& dtype : dtypes) {
    for (const Init& init : inits) {
      const std::string name = absl::StrCat("init_t", n++);
      const std::string got = TempPath(name + "_got.npy");
      const std::string want = TempPath(name + "_want.npy");
      Result r = Tessera({"create", name, "--shape=7,50", "--dtype=" + dtype,
                          "--chunk_dim=1", "--placements=w0,w1,w2,w3",
                          "--init=" + init.flag});
      ASSERT_EQ(r.code, 0) << dtype << " " << init.flag << "\n" << r;
      Ok({"get", name, "--output=" + got});
      Ok({"rm", name});
      std::string expr =
          absl::StrReplaceAll(init.numpy, {{"SHAPE", shape}, {"N", "350"}});
      absl::StrAppend(&script, "np.save('", want, "', (", expr,
                      ").astype(np.dtype('", dtype, "')))\n");
      pairs.emplace_back(got, want);
    }
  }
  ASSERT_TRUE(
      RunPython("import warnings\nwarnings.simplefilter('ignore')\n" + script));
  for (const auto& [got, want] : pairs) {
    HostArray g = ReadOrDie(got);
    HostArray w = ReadOrDie(want);
    EXPECT_TRUE(SameBytes(g, w)) << got << " vs " << want;
  }
}

TEST_F(CliTest, InitValuesWithoutNumPy) {
  // arange to int8 wraps; full:V exact for int64 beyond 2^53.
  Ok({"create", "init_i8", "--shape=300", "--dtype=int8", "--chunk_dim=0",
      "--placements=w0,w1,w2", "--init=arange"});
  const std::string out = TempPath("init_i8.npy");
  Ok({"get", "init_i8", "--output=" + out});
  HostArray a = ReadOrDie(out);
  ASSERT_EQ(a.shape, (Shape{300}));
  for (int i = 0; i < 300; ++i)
    EXPECT_EQ(a.As<int8_t>()[i], static_cast<int8_t>(i)) << i;
  Ok({"rm", "init_i8"});

  Ok({"create", "init_i64", "--shape=3", "--dtype=int64", "--chunk_dim=0",
      "--placements=w0", "--init=full:9007199254740993"});
  Ok({"get", "init_i64", "--output=" + out});
  a = ReadOrDie(out);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.As<int64_t>()[i], 9007199254740993LL);
  Ok({"rm", "init_i64"});

  // bfloat16 (no NumPy dtype): rounded to nearest even once; get writes <u2.
  Ok({"create", "init_bf16", "--shape=300", "--dtype=bfloat16", "--chunk_dim=0",
      "--placements=w2,w3", "--init=arange"});
  Ok({"get", "init_bf16", "--output=" + out});
  // A <u2 file: uint16 words unless asked for as bfloat16.
  EXPECT_EQ(ReadOrDie(out).dtype, DType::kUInt16);
  a = ReadOrDie(out, DType::kBFloat16);
  for (int i = 0; i < 300; ++i)
    EXPECT_EQ(a.As<uint16_t>()[i], Int64ToBFloat16(i)) << i;
  Ok({"rm", "init_bf16"});
  Ok({"create", "init_bf16", "--shape=4", "--dtype=bfloat16", "--chunk_dim=0",
      "--placements=w2,w3", "--init=full:0.1"});
  Ok({"get", "init_bf16", "--output=" + out});
  a = ReadOrDie(out, DType::kBFloat16);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(a.As<uint16_t>()[i], DoubleToBFloat16(0.1));
  Ok({"rm", "init_bf16"});

  // empty: allocated, shape and dtype right.
  Ok({"create", "init_empty", "--shape=2,3", "--dtype=float16", "--chunk_dim=0",
      "--placements=w0"});
  Ok({"get", "init_empty", "--output=" + out});
  a = ReadOrDie(out);
  EXPECT_EQ(a.dtype, DType::kFloat16);
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  Ok({"rm", "init_empty"});
}

TEST_F(CliTest, RandIsTheSameWhateverTheSharding) {
  for (const std::string dtype :
       {"float32", "int32", "bool", "bfloat16", "float64"}) {
    SCOPED_TRACE(dtype);
    const std::string a_out = TempPath("rand_a.npy"),
                      b_out = TempPath("rand_b.npy"),
                      c_out = TempPath("rand_c.npy");
    Ok({"create", "rand_a", "--shape=16,9", "--dtype=" + dtype, "--chunk_dim=0",
        "--placements=w0,w1,w2,w3,w0", "--init=rand:42"});
    Ok({"create", "rand_b", "--shape=16,9", "--dtype=" + dtype,
        "--shards=:,5:@w3;:,0:5@w1", "--init=rand:42"});
    Ok({"create", "rand_c", "--shape=16,9", "--dtype=" + dtype, "--chunk_dim=1",
        "--placements=w2", "--init=rand:43"});
    Ok({"get", "rand_a", "--output=" + a_out});
    Ok({"get", "rand_b", "--output=" + b_out});
    Ok({"get", "rand_c", "--output=" + c_out});
    std::optional<DType> as;
    if (dtype == "bfloat16") as = DType::kBFloat16;
    HostArray a = ReadOrDie(a_out, as), b = ReadOrDie(b_out, as),
              c = ReadOrDie(c_out, as);
    EXPECT_TRUE(SameBytes(a, b));
    EXPECT_FALSE(SameBytes(a, c));
    for (int64_t i = 0; i < a.NumElements(); ++i) {
      if (dtype == "float32") {
        EXPECT_GE(a.As<float>()[i], 0.0f);
        EXPECT_LT(a.As<float>()[i], 1.0f);
      } else if (dtype == "float64") {
        EXPECT_GE(a.As<double>()[i], 0.0);
        EXPECT_LT(a.As<double>()[i], 1.0);
      } else if (dtype == "int32") {
        EXPECT_GE(a.As<int32_t>()[i], 0);
        EXPECT_LT(a.As<int32_t>()[i], 100);
      } else if (dtype == "bool") {
        EXPECT_LE(a.As<uint8_t>()[i], 1);
      } else {
        const float f = BFloat16ToFloat(a.As<uint16_t>()[i]);
        EXPECT_GE(f, 0.0f);
        EXPECT_LT(f, 1.0f);
      }
    }
    Ok({"rm", "rand_a"});
    Ok({"rm", "rand_b"});
    Ok({"rm", "rand_c"});
  }
}

// ---- put / get
// ---------------------------------------------------------------------

TEST_F(CliTest, PutGetRoundTripsEveryDType) {
  int salt = 1;
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string name = absl::StrCat("rt_", DTypeName(dtype));
    HostArray array = Iota(dtype, {9, 7, 3}, salt++);
    const std::string in = TempPath(name + "_in.npy");
    const std::string out = TempPath(name + "_out.npy");
    ASSERT_THAT(WriteNpyFile(in, array), IsOk());
    std::vector<std::string> args = {"put", name, "--input=" + in,
                                     "--chunk_dim=1",
                                     "--placements=w3,w2,w1,w0"};
    // Raw words (bfloat16 '<u2', float8 '|u1') name their dtype.
    const bool words = NpyFileDType(dtype) != dtype;
    if (words) args.push_back(absl::StrCat("--dtype=", DTypeName(dtype)));
    Ok(args);
    Json d = Describe(name);
    EXPECT_EQ(d["dtype"].Str(), DTypeName(dtype));
    EXPECT_EQ(d["shape"].IntList(), (std::vector<int64_t>{9, 7, 3}));
    Ok({"get", name, "--output=" + out});
    std::optional<DType> as;
    if (words) as = dtype;
    EXPECT_TRUE(SameBytes(ReadOrDie(out, as), array));
    // Each shard as describe lists it.
    for (size_t k = 0; k < 4; ++k) {
      Ok({"get", name, "--output=" + out, absl::StrCat("--shard=", k)});
      const Json& s = d["shards"][k];
      Box box{s["offsets"].IntList(), s["sizes"].IntList()};
      EXPECT_TRUE(SameBytes(ReadOrDie(out, as), Slice(array, box))) << k;
    }
    Ok({"rm", name});
  }
}

TEST_F(CliTest, PutTakesTheFilesDType) {
  HostArray array = Iota(DType::kFloat32, {4, 4}, 3);
  const std::string in = TempPath("dtype_in.npy");
  ASSERT_THAT(WriteNpyFile(in, array), IsOk());
  const State before = SettledSnapshot();
  // A different --dtype than the file's is refused, naming both.
  ExpectError(Tessera({"put", "dtype_t", "--input=" + in, "--dtype=float64",
                       "--chunk_dim=0", "--placements=w0"}),
              1, {"float32", "float64", in});
  // A <u2 file read as another dtype than uint16 or bfloat16 is refused,
  // saying what it may be read as.
  HostArray bf = Iota(DType::kBFloat16, {4}, 4);
  const std::string bf_in = TempPath("dtype_bf.npy");
  ASSERT_THAT(WriteNpyFile(bf_in, bf), IsOk());
  ExpectError(Tessera({"put", "dtype_t", "--input=" + bf_in, "--chunk_dim=0",
                       "--placements=w0", "--dtype=int16"}),
              1, {"uint16", "int16", "bfloat16"});
  ExpectError(Tessera({"put", "dtype_t", "--input=" + TempPath("missing.npy"),
                       "--chunk_dim=0", "--placements=w0"}),
              1, {"missing.npy"});
  ExpectState(before);
  Ok({"put", "dtype_t", "--input=" + in, "--dtype=float32", "--chunk_dim=0",
      "--placements=w0"});
  EXPECT_EQ(Describe("dtype_t")["dtype"].Str(), "float32");
  Ok({"rm", "dtype_t"});
  // Without --dtype a <u2 file is uint16; with it, bfloat16 bits.
  Ok({"put", "dtype_t", "--input=" + bf_in, "--chunk_dim=0",
      "--placements=w0"});
  EXPECT_EQ(Describe("dtype_t")["dtype"].Str(), "uint16");
  Ok({"rm", "dtype_t"});
  Ok({"put", "dtype_t", "--input=" + bf_in, "--dtype=bfloat16", "--chunk_dim=0",
      "--placements=w0"});
  EXPECT_EQ(Describe("dtype_t")["dtype"].Str(), "bfloat16");
  Ok({"rm", "dtype_t"});
}

TEST_F(CliTest, GetRegionFollowsNumPy) {
  const Shape shape = {6, 5, 4};
  HostArray array = ArangeInt64(shape);
  const std::string in = TempPath("region_in.npy");
  ASSERT_THAT(WriteNpyFile(in, array), IsOk());
  Ok({"put", "region_t", "--input=" + in,
      "--shards=0:4,:,:@w0;4:,:3,:@w1;4:,3:,:@w2"});
  struct Case {
    std::string region;
    Box box;
  };
  const std::vector<Case> cases = {
      {":", {{0, 0, 0}, {6, 5, 4}}},
      {"-2:,1:3", {{4, 1, 0}, {2, 2, 4}}},
      {"1:-1,:,-1:", {{1, 0, 3}, {4, 5, 1}}},
      {":2", {{0, 0, 0}, {2, 5, 4}}},
      {"3:5,-4:-1,:2", {{3, 1, 0}, {2, 3, 2}}},
      {"3:3", {{3, 0, 0}, {0, 5, 4}}},
      {"-6:,:,:", {{0, 0, 0}, {6, 5, 4}}},
      {"5:6,4:5,3:4", {{5, 4, 3}, {1, 1, 1}}},
  };
  const std::string out = TempPath("region_out.npy");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.region);
    Result r =
        Ok({"get", "region_t", "--output=" + out, "--region=" + c.region});
    EXPECT_EQ(ParseBoxOrDie(c.region, shape).offsets, c.box.offsets);
    HostArray got = ReadOrDie(out);
    EXPECT_TRUE(SameDims(got.shape, c.box.sizes));
    EXPECT_TRUE(SameBytes(got, Slice(array, c.box)));
  }
  // Out of bounds (no clamping) and too many dims: exit 1, no output file.
  const State before = SettledSnapshot();
  for (const std::string region : {"0:7", "-7:", "3:2", ":,:,0:5", "2:1,:"}) {
    SCOPED_TRACE(region);
    ExpectError(Tessera({"get", "region_t", "--output=" + TempPath("never.npy"),
                         "--region=" + region}),
                1, {"out of bounds"});
  }
  ExpectError(Tessera({"get", "region_t", "--output=" + TempPath("never.npy"),
                       "--region=:,:,:,:"}),
              1, {"dims"});
  EXPECT_NE(access(TempPath("never.npy").c_str(), F_OK), 0);
  ExpectState(before);
  Ok({"rm", "region_t"});
}

TEST_F(CliTest, GetShardOutsideTheListIsOutOfBounds) {
  Ok({"create", "shardk_t", "--shape=6", "--dtype=int32", "--chunk_dim=0",
      "--placements=w0,w1", "--init=arange"});
  const std::string out = TempPath("shardk.npy");
  Ok({"get", "shardk_t", "--output=" + out, "--shard=1"});
  HostArray a = ReadOrDie(out);
  ASSERT_EQ(a.shape, (Shape{3}));
  EXPECT_EQ(a.As<int32_t>()[0], 3);
  for (const std::string k : {"2", "-1", "100"}) {
    ExpectError(Tessera({"get", "shardk_t", "--output=" + out, "--shard=" + k}),
                1, {"out of bounds"});
  }
  ExpectError(Tessera({"get", "shardk_t", "--output=" + out, "--shard=one"}), 2,
              {"--shard"});
  Ok({"rm", "shardk_t"});
}

// .npy files written by Debian's NumPy: C and Fortran order, both byte orders.
// `-` is stdin and stdout in shell pipes, for .npy and safetensors: a get
// into a pipe, a put from one, an export piped into an import. No file
// named "-" appears, nothing is left in $TMPDIR, and stdout carries only the
// data (the report goes to stderr).
TEST_F(CliTest, DashIsStdinAndStdoutInShellPipes) {
  if (!HaveNumpy()) GTEST_SKIP() << "Debian's numpy is not installed";
  const std::string dir = TempPath("dash");
  const std::string spool = TempPath("dash_tmp");
  ASSERT_EQ(std::system(absl::StrCat("rm -rf ", dir, " ", spool, " && mkdir ",
                                     dir, " ", spool)
                            .c_str()),
            0);
  const std::string t = absl::StrCat("TMPDIR=", spool, " ",
                                     TestCluster::BinaryPath("client/tessera"),
                                     " --coordinator=", Addr());
  const std::string py = "/usr/bin/python3 -c";
  const std::string script = absl::StrCat(
      "set -eo pipefail; cd ", dir, "\n",  //
      t, " create dash_a --shape=6,4 --dtype=int32 --chunk_dim=0 ",
      "--placements=w0,w1 --init=arange\n",
      // NumPy's load wants to seek: it reads the pipe through BytesIO.
      t, " get dash_a --output=- 2>get.err | ", py,
      " 'import io,sys,numpy as np; a = np.load(io.BytesIO(",
      "sys.stdin.buffer.read())); assert (a == np.arange(24).reshape(6, 4))",
      ".all(), a'\n", py,
      " 'import io,sys,numpy as np; b = io.BytesIO(); np.save(b, ",
      "np.arange(10, dtype=np.float32) * 0.5); ",
      "sys.stdout.buffer.write(b.getvalue())' | ", t,
      " put dash_p --input=- --chunk_dim=0 --placements=w2,w3\n", t,
      " export - dash_a dash_p | ", t,
      " import - --prefix=dash_copy/ --chunk_dim=0 --placements=w1\n",
      "test ! -e ./-\n");
  {
    std::ofstream f(dir + ".sh");
    f << script;
  }
  ASSERT_EQ(std::system(absl::StrCat("/bin/bash ", dir, ".sh").c_str()), 0)
      << script;
  std::ifstream get_err(dir + "/get.err");
  const std::string report((std::istreambuf_iterator<char>(get_err)),
                           std::istreambuf_iterator<char>());
  EXPECT_THAT(report, HasSubstr("got dash_a into stdout: shape [6, 4]"));

  // What went through the pipes is what the cluster holds.
  const std::string copy = TempPath("dash_copy_p.npy");
  Ok({"get", "dash_copy/dash_p", "--output=" + copy});
  const HostArray p = ReadOrDie(copy, DType::kFloat32);
  ASSERT_EQ(p.shape, (Shape{10}));
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(reinterpret_cast<const float*>(p.data())[i], 0.5f * i);
  }
  Result a = Tessera({"get", "dash_copy/dash_a", "--output=-"});
  EXPECT_EQ(a.code, 0) << a.err;
  EXPECT_THAT(a.err, HasSubstr("got dash_copy/dash_a into stdout"));
  EXPECT_TRUE(absl::StartsWith(a.out, "\x93NUMPY")) << a.out.substr(0, 16);
  // A failed get writes nothing to stdout.
  Result missing = Tessera({"get", "dash_missing", "--output=-"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(missing.out, "");
  // Every spool directory is gone.
  EXPECT_EQ(
      std::system(absl::StrCat("test -z \"$(ls -A ", spool, ")\"").c_str()), 0);
  for (const char* name :
       {"dash_a", "dash_p", "dash_copy/dash_a", "dash_copy/dash_p"}) {
    Ok({"rm", name});
  }
}

TEST_F(CliTest, PutReadsWhatNumPyWrites) {
  if (!HaveNumpy()) GTEST_SKIP() << "Debian's numpy is not installed";
  struct Case {
    std::string name;
    std::string expr;  // the array NumPy saves
  };
  const std::vector<Case> cases = {
      {"np_c_f4", "np.arange(60, dtype='<f4').reshape(3, 4, 5) * 0.5"},
      {"np_f_f8",
       "np.asfortranarray(np.arange(60, dtype='<f8').reshape(3, 4, 5) - 7)"},
      {"np_be_i4", "np.arange(-30, 30, dtype='>i4').reshape(6, 10)"},
      {"np_be_f_f2",
       "np.asfortranarray(np.arange(24, dtype='>f2').reshape(4, 6) / 4)"},
      {"np_be_f_i8",
       "np.asfortranarray(np.arange(24, dtype='>i8').reshape(2, 3, 4) << 40)"},
      {"np_bool", "(np.arange(30) % 3 == 0).reshape(5, 6)"},
      {"np_u1_f",
       "np.asfortranarray(np.arange(35, dtype=np.uint8).reshape(5, 7))"},
      {"np_i2", "np.arange(-10, 10, dtype='>i2')"},
  };
  std::string script;
  for (const Case& c : cases) {
    absl::StrAppend(&script, "np.save('", TempPath(c.name + "_in.npy"), "', ",
                    c.expr, ")\n");
  }
  ASSERT_TRUE(RunPython(script));
  std::string check;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string in = TempPath(c.name + "_in.npy");
    const std::string out = TempPath(c.name + "_out.npy");
    Ok({"put", c.name, "--input=" + in, "--chunk_dim=0",
        "--placements=w0,w1,w2"});
    Ok({"get", c.name, "--output=" + out});
    // Written as format 1.0, C order, little-endian.
    std::ifstream f(out, std::ios::binary);
    std::string head(128, '\0');
    f.read(head.data(), head.size());
    EXPECT_EQ(head[6], '\x01');
    EXPECT_EQ(head[7], '\x00');
    EXPECT_THAT(head, HasSubstr("'fortran_order': False"));
    EXPECT_THAT(head, ::testing::Not(HasSubstr("'>")));
    absl::StrAppend(
        &check, "a = np.load('", in, "'); b = np.load('", out, "')\n",
        "assert b.flags.c_contiguous and b.dtype.byteorder in '<|=', b.dtype\n",
        "assert a.shape == b.shape and a.dtype.newbyteorder('=') == ",
        "b.dtype.newbyteorder('='), (a.dtype, b.dtype)\n",
        "assert np.array_equal(a, b), '", c.name, "'\n");
    Ok({"rm", c.name});
  }
  // NumPy reads back what get wrote, equal to what it saved.
  EXPECT_TRUE(RunPython(check));
}

// ---- reshard
// ---------------------------------------------------------------------

TEST_F(CliTest, ReshardJsonAndDataPreserved) {
  Ok({"create", "reshard_t", "--shape=8,6", "--dtype=int64", "--chunk_dim=0",
      "--placements=w0,w1", "--init=arange"});
  Result r = Tessera({"reshard", "reshard_t", "--chunk_dim=1",
                      "--placements=w1,w2,w3", "--json"});
  if (r.code == 1 && absl::StrContains(r.err, "not implemented")) {
    GTEST_SKIP() << "reshard not implemented yet: " << r.err;
  }
  ASSERT_EQ(r.code, 0) << r;
  Json stats = ParseJsonOrFail(r.out);
  EXPECT_EQ(stats.Keys(),
            (std::vector<std::string>{"version", "pieces_moved", "bytes_moved",
                                      "bytes_copied_locally", "shards_kept",
                                      "seconds", "sent"}));
  EXPECT_EQ(stats["version"].Int(), 2);
  // Old: rows 0:4 on w0, 4:8 on w1. New: cols 0:2 on w1, 2:4 on w2, 4:6 on w3.
  // Pieces: 6, of 4x2 int64 = 64 bytes; only (4:8,0:2) stays on w1.
  EXPECT_EQ(stats["pieces_moved"].Int(), 5);
  EXPECT_EQ(stats["bytes_moved"].Int(), 5 * 64);
  EXPECT_EQ(stats["bytes_copied_locally"].Int(), 64);
  EXPECT_EQ(stats["shards_kept"].Int(), 0);
  EXPECT_GE(stats["seconds"].Double(), 0.0);
  // What each worker sent: w0's rows go to w1, w2 and w3 (3 pieces), w1's
  // to w2 and w3 (its piece for itself is copied in memory).
  EXPECT_EQ(stats["sent"].Keys(), (std::vector<std::string>{"w0", "w1"}));
  EXPECT_EQ(stats["sent"]["w0"].Int(), 3 * 64);
  EXPECT_EQ(stats["sent"]["w1"].Int(), 2 * 64);
  Json d = Describe("reshard_t");
  EXPECT_EQ(d["version"].Int(), 2);
  ASSERT_EQ(d["shards"].size(), 3u);
  EXPECT_EQ(d["shards"][2]["worker"].Str(), "w3");
  const std::string out = TempPath("reshard_t.npy");
  Ok({"get", "reshard_t", "--output=" + out});
  EXPECT_TRUE(SameBytes(ReadOrDie(out), ArangeInt64({8, 6})));

  // Same layout again: every shard kept, nothing moved, version + 1.
  r = Ok(
      {"reshard", "reshard_t", "--shards=:,0:2@w1;:,2:4@w2;:,4:@w3", "--json"});
  stats = ParseJsonOrFail(r.out);
  EXPECT_EQ(stats["version"].Int(), 3);
  EXPECT_EQ(stats["shards_kept"].Int(), 3);
  EXPECT_EQ(stats["pieces_moved"].Int(), 0);
  EXPECT_EQ(stats["bytes_moved"].Int(), 0);
  EXPECT_EQ(stats["sent"].size(), 0u);  // nothing moved, nobody sent

  // The human form says what it cost.
  r = Ok({"reshard", "reshard_t", "--chunk_dim=0", "--placements=w0"});
  EXPECT_THAT(r.out, HasSubstr("version 4"));

  // A failed reshard changes neither version nor handles.
  const Json before = Describe("reshard_t");
  const State state = SettledSnapshot();
  ExpectError(
      Tessera({"reshard", "reshard_t", "--chunk_dim=2", "--placements=w0"}), 1,
      {"invalid sharding dim"});
  ExpectError(
      Tessera({"reshard", "reshard_t", "--chunk_dim=0", "--placements=w9"}), 1,
      {"does not exist"});
  ExpectError(Tessera({"reshard", "reshard_t", "--shards=0:4,:@w0;3:8,:@w1"}),
              1, {"overlap"});
  ExpectError(Tessera({"reshard", "reshard_t", "--shards=0:4,:@w0"}), 1,
              {"cover"});
  ExpectError(Tessera({"reshard", "reshard_t", "--shards=0:9,:@w0"}), 1,
              {"out of bounds"});
  ExpectError(Tessera({"reshard", "reshard_t", "--shards=0:8@w0"}), 1,
              {"dims"});
  ExpectError(
      Tessera({"reshard", "no_such_t", "--chunk_dim=0", "--placements=w0"}), 1,
      {"not found"});
  const Json after = Describe("reshard_t");
  EXPECT_EQ(after["version"].Int(), before["version"].Int());
  EXPECT_EQ(after["shards"][0]["handle"].Str(),
            before["shards"][0]["handle"].Str());
  ExpectState(state);
  Ok({"rm", "reshard_t"});
}

// ---- errors: every row of CLI.md's table
// ---------------------------------------------

TEST_F(CliTest, EveryErrorOfTheTableLeavesNothingBehind) {
  Ok({"create", "taken_t", "--shape=4,4", "--dtype=float32", "--chunk_dim=0",
      "--placements=w0,w1", "--init=ones"});
  const State before = SettledSnapshot();
  const std::vector<std::string> create = {"create", "err_t", "--shape=4,4",
                                           "--dtype=float32"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = create;
    args.insert(args.end(), extra.begin(), extra.end());
    return Tessera(args);
  };
  HostArray array = Iota(DType::kFloat32, {4, 4}, 9);
  const std::string in = TempPath("err_in.npy");
  ASSERT_THAT(WriteNpyFile(in, array), IsOk());
  auto put = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"put", "err_t", "--input=" + in};
    args.insert(args.end(), extra.begin(), extra.end());
    return Tessera(args);
  };

  // invalid sharding dim
  ExpectError(with({"--chunk_dim=2", "--placements=w0"}), 1,
              {"invalid sharding dim"});
  ExpectError(with({"--chunk_dim=-3", "--placements=w0"}), 1,
              {"invalid sharding dim"});
  ExpectError(put({"--chunk_dim=5", "--placements=w0"}), 1,
              {"invalid sharding dim"});
  // does not exist: rank, worker name, device
  ExpectError(with({"--chunk_dim=0", "--placements=w0,rank:9"}), 1,
              {"does not exist"});
  ExpectError(with({"--chunk_dim=0", "--placements=nosuchworker"}), 1,
              {"does not exist"});
  ExpectError(with({"--chunk_dim=0", "--placements=w0/cuda:0"}), 1,
              {"does not exist"});
  ExpectError(with({"--shards=0:2,:@w0;2:4,:@rank:7"}), 1, {"does not exist"});
  ExpectError(put({"--chunk_dim=0", "--placements=w0,ghost"}), 1,
              {"does not exist"});
  // overlap
  ExpectError(with({"--shards=0:3,:@w0;2:4,:@w1"}), 1, {"overlap"});
  ExpectError(put({"--shards=:,:@w0;1:2,1:2@w1"}), 1, {"overlap"});
  // cover
  ExpectError(with({"--shards=0:2,:@w0;3:4,:@w1"}), 1, {"cover"});
  ExpectError(put({"--shards=:,:-1@w0"}), 1, {"cover"});
  // out of bounds
  ExpectError(with({"--shards=0:2,:@w0;2:5,:@w1"}), 1, {"out of bounds"});
  ExpectError(with({"--shards=-5:,:@w0"}), 1, {"out of bounds"});
  ExpectError(Tessera({"get", "taken_t", "--output=" + TempPath("x.npy"),
                       "--region=0:5"}),
              1, {"out of bounds"});
  ExpectError(
      Tessera({"get", "taken_t", "--output=" + TempPath("x.npy"), "--shard=2"}),
      1, {"out of bounds"});
  ExpectError(Tessera({"get", "taken_t", "--output=" + TempPath("x.npy"),
                       "--shard=-1"}),
              1, {"out of bounds"});
  // already exists
  ExpectError(Tessera({"create", "taken_t", "--shape=4,4", "--dtype=float32",
                       "--chunk_dim=0", "--placements=w2"}),
              1, {"already exists", "taken_t"});
  ExpectError(Tessera({"put", "taken_t", "--input=" + in, "--chunk_dim=0",
                       "--placements=w3"}),
              1, {"already exists", "taken_t"});
  // not found
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"describe", "ghost_t"},
           {"describe", "ghost_t", "--json"},
           {"get", "ghost_t", "--output=" + TempPath("x.npy")},
           {"get", "ghost_t", "--output=" + TempPath("x.npy"), "--region=0:1"},
           {"get", "ghost_t", "--output=" + TempPath("x.npy"), "--shard=0"},
           {"rm", "ghost_t"},
           {"reshard", "ghost_t", "--chunk_dim=0", "--placements=w0"},
           {"reshard", "ghost_t", "--shards=0:1@w0"}}) {
    ExpectError(Tessera(args), 1, {"not found", "ghost_t"});
  }
  // dtype (exit 2)
  ExpectError(with({"--dtype=float", "--chunk_dim=0", "--placements=w0"}), 2,
              {"dtype"});
  ExpectError(Tessera({"create", "err_t", "--shape=4", "--dtype=complex64",
                       "--chunk_dim=0", "--placements=w0"}),
              2, {"dtype"});
  ExpectError(put({"--dtype=f4", "--chunk_dim=0", "--placements=w0"}), 2,
              {"dtype"});
  // dims
  ExpectError(with({"--shards=0:4@w0"}), 1, {"dims"});
  ExpectError(with({"--shards=:,:,:@w0"}), 1, {"dims"});
  ExpectError(put({"--shards=0:4@w0"}), 1, {"dims"});
  ExpectError(Tessera({"get", "taken_t", "--output=" + TempPath("x.npy"),
                       "--region=:,:,:"}),
              1, {"dims"});
  EXPECT_NE(access(TempPath("x.npy").c_str(), F_OK), 0);
  ExpectState(before);
  Ok({"rm", "taken_t"});
}

TEST_F(CliTest, ValidationOrderReportsTheFirstFailure) {
  const State before = SettledSnapshot();
  auto create = [](const std::string& spec_flag) {
    return Tessera(
        {"create", "order_t", "--shape=4,4", "--dtype=int8", spec_flag});
  };
  // dims before bounds, overlap and placements.
  ExpectError(create("--shards=0:9@rank:9;0:9@rank:9"), 1, {"dims"});
  // chunk dim before placements.
  ExpectError(Tessera({"create", "order_t", "--shape=4,4", "--dtype=int8",
                       "--chunk_dim=3", "--placements=rank:9"}),
              1, {"invalid sharding dim"});
  // bounds before overlap and cover and placements.
  ExpectError(create("--shards=0:5,:@rank:9;0:5,:@rank:9"), 1,
              {"out of bounds"});
  // overlap before cover and placements.
  ExpectError(create("--shards=0:2,:@rank:9;1:3,:@rank:9"), 1, {"overlap"});
  // cover before placements.
  ExpectError(create("--shards=0:2,:@rank:9"), 1, {"cover"});
  ExpectState(before);
}

TEST_F(CliTest, UsageErrorsExitTwoWithoutACoordinator) {
  // Usage errors are found before the coordinator is contacted: point at a
  // dead address and still get exit 2.
  const std::string dead =
      absl::StrCat("--coordinator=127.0.0.1:", PickFreePort());
  struct Case {
    std::vector<std::string> args;
    std::string word;
  };
  const std::vector<Case> cases = {
      {{"frobnicate"}, "frobnicate"},
      {{"ls", "--bogus"}, "--bogus"},
      {{"--bogus", "ls"}, "--bogus"},
      {{"describe", "t", "--shape=3"}, "--shape"},
      {{"create", "t", "--shape=", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0"},
       "shape"},
      {{"create", "t", "--shape=-1", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0"},
       "shape"},
      {{"create", "t", "--shape=3,x", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0"},
       "shape"},
      {{"create", "t", "--shape=3", "--dtype=float", "--chunk_dim=0",
        "--placements=w0"},
       "dtype"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0", "--init=random"},
       "init"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0", "--init=full:abc"},
       "init"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0", "--init=rand:-1"},
       "init"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=x",
        "--placements=w0"},
       "chunk_dim"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=rank:x"},
       "rank:x"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0/gpu"},
       "gpu"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--shards=0-3@w0"}, "0-3"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--shards=0:3"}, "0:3"},
      {{"create", "t", "--shape=3", "--dtype=int8"}, "--chunk_dim"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0"},
       "--placements"},
      {{"create", "t", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0", "--shards=0:3@w0"},
       "--shards"},
      {{"create", "t", "--dtype=int8", "--chunk_dim=0", "--placements=w0"},
       "--shape"},
      {{"create", "t", "--shape=3", "--chunk_dim=0", "--placements=w0"},
       "--dtype"},
      {{"create", "bad name", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0"},
       "name"},
      {{"create", "--shape=3", "--dtype=int8", "--chunk_dim=0",
        "--placements=w0"},
       "NAME"},
      {{"put", "t", "--chunk_dim=0", "--placements=w0"}, "--input"},
      {{"get", "t"}, "--output"},
      {{"get", "t", "--output=o.npy", "--region=0:1", "--shard=0"}, "--region"},
      {{"get", "t", "--output=o.npy", "--region=0-1"}, "0-1"},
      {{"get", "t", "--output=o.npy", "--shard=x"}, "--shard"},
      {{"get", "t!", "--output=o.npy"}, "t!"},
      {{"rm"}, "NAME"},
      {{"rm", "a", "b!"}, "b!"},
      {{"ls", "a/", "b/"}, "b/"},
      {{"completion", "fish"}, "fish"},
      {{"--timeout=0", "ls"}, "--timeout"},
      {{"describe", "t", "--json=maybe"}, "--json"},
      {{"reshard", "t"}, "--chunk_dim"},
      {{"get", "t", "--output"}, "--output"},
      {{}, "command"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {dead};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(absl::StrJoin(args, " "));
    ExpectError(RunTessera(args), 2, {c.word});
  }
}

TEST_F(CliTest, DeadCoordinatorIsNamed) {
  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  ExpectError(RunTessera({"--coordinator=" + dead, "ls"}), 1,
              {"coordinator", dead});
  ExpectError(RunTessera({"--coordinator", dead, "describe", "x", "--json"}), 1,
              {"coordinator", dead});
}

// UCX's own log lines never reach stdout: a CLI whose UCX cannot start (no
// usable transport here) falls back to the other transports, says so on
// stderr, and `get --json` prints JSON alone.
TEST_F(CliTest, UcxLogLinesStayOffStdout) {
  Ok({"create", "ucx_log", "--shape=8", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0", "--init=arange"});
  ASSERT_EQ(setenv("UCX_TLS", "no_such_transport", 1), 0);
  ASSERT_EQ(setenv("UCX_LOG_LEVEL", "info", 1), 0);
  const std::string out =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/ucx_log.npy");
  Result r = Tessera({"get", "ucx_log", "--output=" + out, "--json"});
  ASSERT_EQ(unsetenv("UCX_TLS"), 0);
  ASSERT_EQ(unsetenv("UCX_LOG_LEVEL"), 0);
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_EQ(r.out.find("UCX"), std::string::npos) << r;
  const Json json = ParseJsonOrFail(r.out);
  EXPECT_EQ(json.type, Json::Type::kObject) << r;
}

TEST_F(CliTest, CoordinatorFromTheEnvironment) {
  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  ASSERT_EQ(setenv("TESSERA_COORDINATOR", Addr().c_str(), 1), 0);
  Result r = RunTessera({"workers", "--json"});
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_EQ(ParseJsonOrFail(r.out).size(), 4u);
  ASSERT_EQ(setenv("TESSERA_COORDINATOR", dead.c_str(), 1), 0);
  ExpectError(RunTessera({"ls"}), 1, {"coordinator", dead});
  // --coordinator wins over the environment.
  r = RunTessera({"--coordinator=" + Addr(), "ls", "--json"});
  EXPECT_EQ(r.code, 0) << r;
  ASSERT_EQ(unsetenv("TESSERA_COORDINATOR"), 0);
}

TEST_F(CliTest, HelpAndVerbose) {
  Result r = RunTessera({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("usage: tessera"));
  EXPECT_THAT(r.out, HasSubstr("reshard"));
  r = RunTessera({"get", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--region"));
  // --verbose adds detail after the error line.
  r = Tessera({"--verbose", "describe", "verbose_t"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(absl::StartsWith(r.err, "error: ")) << r;
  EXPECT_THAT(r.err, HasSubstr("not found"));
  EXPECT_GT(std::count(r.err.begin(), r.err.end(), '\n'), 1);
}

// `tessera completion bash`, sourced by bash: commands, a command's flags,
// the global flags, worker actions and workers, and the cluster's tensor
// names complete; zsh gets the same through bashcompinit.
TEST_F(CliTest, CompletionScriptCompletesCommandsFlagsAndTensorNames) {
  Ok({"create", "compl_t/one", "--shape=2", "--dtype=int8", "--chunk_dim=0",
      "--placements=w0"});
  const std::string script = TempPath("completion.bash");
  {
    std::ofstream f(script);
    f << Ok({"completion", "bash"}).out;
  }
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  // Completes the words after "tessera" and prints COMPREPLY.
  auto complete = [&](const std::string& words) {
    const std::string out = TempPath("completion.out");
    const std::string command = absl::StrCat(
        "/bin/bash -c 'source ", script, "; COMP_WORDS=(", cli, " ", words,
        "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _tessera; ",
        "echo \"${COMPREPLY[*]}\"' > ", out);
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    std::ifstream in(out);
    std::string line;
    std::getline(in, line);
    return line;
  };
  EXPECT_EQ(complete("res"), "reshard");
  EXPECT_EQ(complete("get x --reg"), "--region=");
  EXPECT_EQ(complete("rm --js"), "--json");
  EXPECT_EQ(complete("completion z"), "zsh");
  // The global --timeout; worker actions, then workers (not tensors).
  EXPECT_EQ(complete("--tim"), "--timeout=");
  EXPECT_EQ(complete("worker dr"), "drain");
  EXPECT_EQ(complete("worker un"), "uncordon");
  EXPECT_EQ(complete(absl::StrCat("--coordinator=", Addr(), " worker drain w")),
            "w0 w1 w2 w3");
  EXPECT_EQ(complete(absl::StrCat("--coordinator=", Addr(), " worker drain c")),
            "");  // compl_t/one is a tensor, not a worker
  EXPECT_EQ(
      complete(absl::StrCat("--coordinator=", Addr(), " describe compl_t/")),
      "compl_t/one");
  const std::string zsh = Ok({"completion", "zsh"}).out;
  EXPECT_TRUE(absl::StartsWith(zsh, "autoload -U +X bashcompinit")) << zsh;
  ExpectError(Tessera({"completion", "fish"}), 2, {"bash or zsh"});
  Ok({"rm", "compl_t/one"});
}

// Progress on a terminal counts bytes as they land: a get whose second
// shard's worker is stopped for 2.5 s shows its first half landed (strictly
// between 0 and 100 %), updated several times, then the result line.
TEST_F(CliTest, ProgressOnATerminalCountsBytesAsTheyLand) {
  Ok({"create", "progress_t", "--shape=8192,1024", "--dtype=float32",
      "--chunk_dim=0", "--placements=w2,w3", "--init=ones"});
  const std::string file = TempPath("progress_t.npy");
  const TerminalRun run = RunOnTerminalWithWorkerStopped(
      absl::StrCat(TestCluster::BinaryPath("client/tessera"), " --coordinator=",
                   Addr(), " --transport=grpc get progress_t --output=", file),
      cluster_->worker_pid(3), TempPath("progress.log"));
  ASSERT_EQ(run.code, 0);
  const ProgressLines progress = ProgressOf(run.text, "get progress_t: ");
  EXPECT_GE(progress.lines.size(), 3u) << run.text;
  EXPECT_TRUE(progress.partial) << run.text;
  EXPECT_THAT(run.text, HasSubstr("got progress_t into")) << run.text;
  Ok({"rm", "progress_t"});
}

// A reshard on a terminal shows the bytes landed in the new shards as the
// coordinator counts them: with one source worker stopped for 2.5 s, the
// pieces from the other have landed (strictly between 0 and 100 %) while
// the rest wait, and the line is redrawn several times.
TEST_F(CliTest, ReshardProgressOnATerminalCountsBytesAsTheyLand) {
  Ok({"create", "rprogress_t", "--shape=8192,1024", "--dtype=float32",
      "--chunk_dim=0", "--placements=w2,w3", "--init=arange"});
  const TerminalRun run = RunOnTerminalWithWorkerStopped(
      absl::StrCat(TestCluster::BinaryPath("client/tessera"),
                   " --coordinator=", Addr(),
                   " reshard rprogress_t --chunk_dim=1 --placements=w0,w1"),
      cluster_->worker_pid(3), TempPath("rprogress.log"));
  ASSERT_EQ(run.code, 0);
  const ProgressLines progress = ProgressOf(run.text, "reshard rprogress_t: ");
  EXPECT_GE(progress.lines.size(), 3u) << run.text;
  EXPECT_TRUE(progress.partial) << run.text;
  for (const std::string& line : progress.lines) {
    EXPECT_THAT(line, HasSubstr("of 32.0 MiB"));
  }
  EXPECT_THAT(run.text, HasSubstr("resharded rprogress_t to version 2"))
      << run.text;
  // The bytes are where they were: element i is i.
  const std::string file = TempPath("rprogress_t.npy");
  Ok({"get", "rprogress_t", "--region=8191:8192,1020:1024",
      "--output=" + file});
  const HostArray a = ReadOrDie(file);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a.As<float>()[i], 8191 * 1024 + 1020 + i);
  }
  Ok({"rm", "rprogress_t"});
}

// --timeout=SECONDS bounds the whole command: a get from a hung worker
// (SIGSTOP: alive to its lease) gives up with "timed out" instead of
// waiting for the data timeout, and leaves no file. Bad values are usage
// errors; worker drain keeps its own --timeout.
TEST_F(CliTest, TimeoutBoundsTheWholeCommand) {
  Ok({"create", "timeout_t", "--shape=1024,256", "--dtype=float32",
      "--chunk_dim=0", "--placements=w3", "--init=ones"});
  const std::string file = TempPath("timeout_t.npy");
  kill(cluster_->worker_pid(3), SIGSTOP);
  const absl::Time start = absl::Now();
  Result r = Tessera({"--timeout=1.5", "--transport=grpc", "get", "timeout_t",
                      "--output=" + file});
  const absl::Duration took = absl::Now() - start;
  kill(cluster_->worker_pid(3), SIGCONT);
  ExpectError(r, 1, {"timed out after 1.5 s (--timeout)"});
  EXPECT_LT(took, absl::Seconds(10)) << "the data timeout is 30 minutes";
  EXPECT_NE(access(file.c_str(), F_OK), 0) << "a failed get left its file";
  // Resumed, the same command works within the limit.
  Ok({"--timeout=30", "get", "timeout_t", "--output=" + file});
  ExpectError(Tessera({"--timeout=0", "ls"}), 2, {"--timeout=0"});
  ExpectError(Tessera({"--timeout=soon", "ls"}), 2, {"--timeout=soon"});
  ExpectError(Tessera({"worker", "drain", "w3", "--timeout=-1"}), 2,
              {"--timeout=-1", "0 to 86400"});
  Ok({"rm", "timeout_t"});
}

// A client given TLS settings against this plaintext cluster hears that,
// in words, not "cannot reach".
TEST_F(CliTest, TlsSettingsAgainstAPlaintextClusterSaySo) {
  const std::string dir = TempPath("tls_certs");
  ASSERT_EQ(std::system(absl::StrCat("/bin/bash ", std::getenv("TEST_SRCDIR"),
                                     "/tessera/deploy/make-certs.sh ", dir,
                                     " --workers 0 >/dev/null")
                            .c_str()),
            0);
  ExpectError(
      Tessera({"--tls_ca=" + dir + "/ca.crt", "--tls_cert=" + dir + "/user.crt",
               "--tls_key=" + dir + "/user.key", "ls"}),
      1, {"unauthenticated", "speaks plaintext, not TLS"});
}

// The daemons' --help lists their flags, one line each with its default,
// shared ones (TLS) included; --help=TEXT keeps the matching ones.
TEST_F(CliTest, DaemonHelpListsEveryFlagOnOneLine) {
  for (const auto& [binary, own] :
       {std::pair<std::string, std::string>{"worker/tessera-worker",
                                            "--capacity_bytes=0  "},
        {"coordinator/tessera-coordinator", "--repair=true  "}}) {
    std::string out, err;
    ASSERT_EQ(TestCluster::Run({TestCluster::BinaryPath(binary), "--help"},
                               &out, &err),
              0)
        << binary << ": " << err;
    EXPECT_THAT(out, HasSubstr("usage: tessera-"));
    EXPECT_THAT(out, HasSubstr(own)) << out;
    EXPECT_THAT(out, HasSubstr("--tls_ca=")) << out;
    EXPECT_THAT(out, Not(HasSubstr("No flags matched")));
    int flags = 0;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (!absl::StartsWith(line, "  --")) continue;
      ++flags;
      EXPECT_THAT(line, HasSubstr("=")) << line;
      EXPECT_THAT(line, HasSubstr("  ")) << line;
    }
    EXPECT_GE(flags, 10) << out;
    out.clear();
    ASSERT_EQ(TestCluster::Run({TestCluster::BinaryPath(binary), "--help=tls_"},
                               &out, &err),
              0);
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (absl::StartsWith(line, "  --")) {
        EXPECT_THAT(line, HasSubstr("tls"));
      }
    }
  }
}

// --log_level: a level no one knows stops the daemon before it starts
// (exit 2, naming the flag); --help lists it.
TEST_F(CliTest, DaemonsTakeALogLevel) {
  for (const std::string binary :
       {"worker/tessera-worker", "coordinator/tessera-coordinator"}) {
    std::string out, err;
    EXPECT_EQ(TestCluster::Run({TestCluster::BinaryPath(binary),
                                "--log_level=loud", "--listen=127.0.0.1:0"},
                               &out, &err),
              2)
        << binary;
    EXPECT_THAT(out + err, HasSubstr("--log_level")) << binary;
    out.clear();
    ASSERT_EQ(TestCluster::Run({TestCluster::BinaryPath(binary), "--help=log_"},
                               &out, &err),
              0);
    EXPECT_THAT(out, HasSubstr("--log_level=info")) << out;
  }
}

// Typos get a guess: commands, flags (global and the command's), worker
// actions, and tensor names the cluster lists. No guess where none is near.
TEST_F(CliTest, TyposGetADidYouMean) {
  ExpectError(Tessera({"lst"}), 2,
              {"unknown command 'lst'", "did you mean 'ls'?"});
  ExpectError(Tessera({"get", "t", "--outptu=a.npy"}), 2,
              {"unknown flag '--outptu'", "did you mean '--output'?"});
  ExpectError(RunTessera({"--coordnator=" + Addr(), "ls"}), 2,
              {"did you mean '--coordinator'?"});
  ExpectError(Tessera({"worker", "drian", "w0"}), 2,
              {"unknown worker action 'drian'", "did you mean 'drain'?"});
  Result far = Tessera({"frobnicate"});
  ExpectError(far, 2, {"unknown command 'frobnicate'"});
  EXPECT_THAT(far.err, Not(HasSubstr("did you mean")));
  Ok({"create", "typo_emb", "--shape=4", "--dtype=int8", "--chunk_dim=0",
      "--placements=rank:0"});
  ExpectError(Tessera({"get", "typo_emd", "--output=" + TempPath("typo.npy")}),
              1, {"not found", "did you mean 'typo_emb'?"});
  ExpectError(Tessera({"describe", "typo_xyzzy"}), 1, {"not found"});
  EXPECT_THAT(Tessera({"describe", "typo_xyzzy"}).err,
              Not(HasSubstr("did you mean")));
  Ok({"rm", "typo_emb"});
}

// `--output=-` on a terminal is refused before anything moves (exit 2), as
// curl refuses; through a pipe the bytes flow.
TEST_F(CliTest, BinaryIsNotWrittenToATerminal) {
  Ok({"create", "tty_t", "--shape=4", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0", "--init=arange"});
  // script(1) runs the CLI with a pseudo-terminal as its stdout.
  const std::string command =
      absl::StrCat(TestCluster::BinaryPath("client/tessera"),
                   " --coordinator=", Addr(), " get tty_t --output=-");
  std::string out, err;
  EXPECT_EQ(TestCluster::Run({"/usr/bin/script", "-qec", command, "/dev/null"},
                             &out, &err),
            2)
      << out << err;
  EXPECT_THAT(out + err, HasSubstr("refusing to write binary npy bytes to a "
                                   "terminal"));
  EXPECT_THAT(out + err, Not(HasSubstr("NUMPY")));
  Result piped = Tessera({"get", "tty_t", "--output=-"});
  EXPECT_EQ(piped.code, 0) << piped;
  EXPECT_THAT(piped.out, HasSubstr("NUMPY"));
  Ok({"rm", "tty_t"});
}

// stdin is taken only as far as its header says: zeros or a second file
// piped in by mistake are refused at once instead of filling $TMPDIR, and
// nothing is left there, even by a CLI killed while it reads stdin or
// writes stdout.
TEST_F(CliTest, StdinIsTakenOnlyAsFarAsItsHeaderSays) {
  Ok({"create", "stdin_src", "--shape=1000", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0", "--init=arange"});
  const std::string dir = TempPath("stdin_bounds");
  const std::string spool = dir + "/tmp";
  ASSERT_EQ(
      std::system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", spool).c_str()),
      0);
  const std::string npy = dir + "/src.npy";
  Ok({"get", "stdin_src", "--output=" + npy});
  const std::string t = absl::StrCat("TMPDIR=", spool, " ",
                                     TestCluster::BinaryPath("client/tessera"),
                                     " --coordinator=", Addr());
  const std::string spec = " --chunk_dim=0 --placements=rank:1";
  const auto run = [&](const std::string& pipeline, std::string* err) {
    const std::string err_path = dir + "/err";
    const int rc = std::system(absl::StrCat(pipeline, " 2>", err_path).c_str());
    std::ifstream in(err_path);
    err->assign(std::istreambuf_iterator<char>(in), {});
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  std::string err;
  EXPECT_EQ(
      run(absl::StrCat("cat /dev/zero | ", t, " put stdin_z --input=-", spec),
          &err),
      1);
  EXPECT_THAT(err, HasSubstr("reading stdin: not a .npy file"));
  EXPECT_EQ(run(absl::StrCat("cat ", npy, " ", npy, " | ", t,
                             " put stdin_twice --input=-", spec),
                &err),
            1);
  EXPECT_THAT(err, HasSubstr("more bytes follow than the 4128"));
  EXPECT_EQ(run(absl::StrCat("cat /dev/zero | ", t,
                             " import - --prefix=stdin_z/", spec),
                &err),
            1);
  EXPECT_THAT(err, HasSubstr("reading stdin: safetensors"));
  // Killed halfway through reading: its copy goes with it.
  run(absl::StrCat("(head -c 2000 ", npy, "; sleep 3) | timeout -s KILL 1 ", t,
                   " put stdin_killed --input=-", spec),
      &err);
  EXPECT_EQ(
      run(absl::StrCat("cat ", npy, " | ", t, " put stdin_ok --input=-", spec),
          &err),
      0)
      << err;
  // And a get into a pipe no one reads, killed while it writes (4 MiB: more
  // than the pipe holds).
  Ok({"create", "stdout_big", "--shape=1048576", "--dtype=int32",
      "--chunk_dim=0", "--placements=rank:0", "--init=arange"});
  run(absl::StrCat("timeout -s KILL 1 ", t,
                   " get stdout_big --output=- | sleep 3"),
      &err);
  Ok({"rm", "stdout_big"});
  EXPECT_EQ(
      std::system(absl::StrCat("test -z \"$(ls -A ", spool, ")\"").c_str()), 0)
      << "something was left in $TMPDIR";
  Result listed = Ok({"ls"});
  EXPECT_THAT(listed.out, HasSubstr("stdin_ok"));
  EXPECT_THAT(listed.out, Not(HasSubstr("stdin_z")));
  EXPECT_THAT(listed.out, Not(HasSubstr("stdin_twice")));
  EXPECT_THAT(listed.out, Not(HasSubstr("stdin_killed")));
  Ok({"rm", "stdin_src", "stdin_ok"});
}

// An output that names a device, a pipe or a link is written through, not
// replaced: `--output=/dev/null` once replaced the system's /dev/null with
// a regular file when run as root (the bytes were renamed into place), and
// `--output=/dev/stdout` appended the report to the bytes.
TEST_F(CliTest, DevicesPipesAndLinksAreWrittenThroughNotReplaced) {
  Ok({"create", "dev_t", "--shape=4", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0", "--init=arange"});
  const auto is_device = [](const char* path) {
    struct stat st {};
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
  };
  ASSERT_TRUE(is_device("/dev/null"));

  // /dev/stdout, redirected to a file (as this test runs the CLI) and
  // through a pipe: the bytes only, the report on stderr.
  Result redirected = Tessera({"get", "dev_t", "--output=/dev/stdout"});
  EXPECT_EQ(redirected.code, 0) << redirected;
  EXPECT_TRUE(absl::StartsWith(redirected.out, "\x93NUMPY")) << redirected;
  EXPECT_EQ(redirected.out.size(), 128u + 16u) << redirected;
  EXPECT_THAT(redirected.err, HasSubstr("got dev_t into /dev/stdout"));
  EXPECT_EQ(std::memcmp(redirected.out.data() + 128, "\0\0\0\0\1\0\0\0", 8), 0);
  const std::string piped = TempPath("dev_piped.npy");
  ASSERT_EQ(
      std::system(
          absl::StrCat(TestCluster::BinaryPath("client/tessera"),
                       " --coordinator=", Addr(),
                       " get dev_t --output=/dev/stdout 2>/dev/null | cat > ",
                       piped)
              .c_str()),
      0);
  EXPECT_EQ(ReadOrDie(piped, DType::kInt32).As<int32_t>()[2], 2);

  Result null = Tessera({"get", "dev_t", "--output=/dev/null"});
  EXPECT_EQ(null.code, 0) << null;
  EXPECT_TRUE(is_device("/dev/null")) << "/dev/null was replaced";
  if (is_device("/dev/full")) {
    ExpectError(Tessera({"get", "dev_t", "--output=/dev/full"}), 1,
                {"/dev/full", "No space left on device"});
    EXPECT_TRUE(is_device("/dev/full")) << "/dev/full was replaced";
  }

  // Through a link: the file it points to changes, the link stays.
  const std::string dir = TempPath("dev_links");
  ASSERT_EQ(std::system(absl::StrCat("rm -rf ", dir, " && mkdir ", dir,
                                     " && echo old > ", dir, "/real.npy",
                                     " && ln -s real.npy ", dir, "/link.npy")
                            .c_str()),
            0);
  Ok({"get", "dev_t", "--output=" + dir + "/link.npy"});
  const HostArray got = ReadOrDie(dir + "/real.npy", DType::kInt32);
  ASSERT_EQ(got.shape, (Shape{4}));
  EXPECT_EQ(got.As<int32_t>()[3], 3);
  struct stat st {};
  ASSERT_EQ(lstat((dir + "/link.npy").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";

  // A directory is refused before anything moves.
  ExpectError(Tessera({"get", "dev_t", "--output=" + dir}), 1,
              {dir, "Is a directory"});
  Ok({"rm", "dev_t"});
}

// `tessera wait`: at once when the version is there, at the commit of the
// next one (a reshard from another process), `timeout` and `not found` as
// CLI.md says, usage errors before anything is asked.
TEST_F(CliTest, WaitReturnsAtTheCommitOfTheVersion) {
  Ok({"create", "wait_t", "--shape=8", "--dtype=int32", "--chunk_dim=0",
      "--placements=rank:0", "--init=arange"});
  EXPECT_EQ(Ok({"wait", "wait_t", "--version=1"}).out, "1\n");
  std::thread resharder([] {
    absl::SleepFor(absl::Milliseconds(500));
    Ok({"reshard", "wait_t", "--chunk_dim=0", "--placements=rank:1"});
  });
  const absl::Time start = absl::Now();
  Result next = Tessera({"wait", "wait_t", "--json", "--timeout=60"});
  const absl::Duration waited = absl::Now() - start;
  resharder.join();
  EXPECT_EQ(next.code, 0) << next;
  EXPECT_EQ(next.out, "{\"name\": \"wait_t\", \"version\": 2}\n") << next;
  EXPECT_GE(waited, absl::Milliseconds(400));
  ExpectError(Tessera({"wait", "wait_t", "--timeout=0.3"}), 1,
              {"timeout", "version 2", "not yet 3"});
  ExpectError(Tessera({"wait", "wait_nothing", "--timeout=1"}), 1,
              {"not found", "wait_nothing"});
  ExpectError(Tessera({"wait", "wait_t", "--version=soon"}), 2, {"--version"});
  ExpectError(Tessera({"wait", "wait_t", "--timeout=-1"}), 2, {"--timeout"});
  // Deleted while waited on.
  std::thread remover([] {
    absl::SleepFor(absl::Milliseconds(300));
    Ok({"rm", "wait_t"});
  });
  ExpectError(Tessera({"wait", "wait_t", "--timeout=30"}), 1, {"not found"});
  remover.join();
}

}  // namespace
}  // namespace tessera
