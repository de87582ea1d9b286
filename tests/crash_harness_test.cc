// Crash harness: a seeded random sequence of create / put / reshard / update
// (whole or regional) / rm, each with one or two replicas per shard (a
// quarter of the tensors mirrored on every worker too), worker
// drains, checkpoint saves (each into a new directory) and loads of saved
// checkpoints, on
// a real durable cluster, with the coordinator killed (SIGKILL) at random
// points — between requests and inside them — and sometimes a worker with
// it; then a restart, and a model that checks after each restart:
//
//   * every acknowledged change is there (tensors, their versions' data);
//   * a change that was not acknowledged is there whole or not at all;
//   * every tensor reads back byte-exact;
//   * every worker's bytes_used equals what the tensors it holds need (no
//     orphan, no missed free), within a few heartbeats.
//
// A worker killed with the coordinator comes back empty: the tensors with a
// shard whose only replica was on it are lost, which the model checks is
// reported, then removes; those with another replica are repaired and must
// read back exactly. With --store_dir (the second test) it comes back with
// every shard it held: nothing may be lost. There each store is a small
// file system, and a put larger than the room left on one must be refused
// (RESOURCE_EXHAUSTED) with nothing kept. Every cycle starts with every
// worker uncordoned; no request places a shard on the worker a drain left
// draining.
//
// Checkpoints: every acknowledged save loads back bit-exact (once, after
// the restart that follows it); an unacknowledged one either loads back
// bit-exact or is refused (never in part); loads are changes as puts are.
// Some loads have one of their checkpoint's files cut short while they
// run: they succeed whole or are refused, and no worker dies of it.
//
// Short by default (CI); the environment sets a longer run:
//   TESSERA_CRASH_CYCLES (default 20), TESSERA_CRASH_SEED (default 1),
//   TESSERA_CRASH_FORWARD (the coordinator's --replica_forward; default its
//   own).
// scripts/crash_harness.sh runs 200+ cycles. The last line printed is the
// summary: cycles, changes acknowledged, lost, leaked bytes.
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/safetensors_io.h"
#include "client/tessera_client.h"
#include "coordinator/etcd_testutil.h"
#include "core/status_macros.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

constexpr int kWorkers = 3;
// Each worker's --store_dir, in the store runs: a file system this small
// (a tmpfs in the test's own mount namespace), which a fill op fills.
constexpr char kStoreSize[] = "size=64m";

// A mount namespace of the test's own, taken before any thread starts
// (unshare refuses a process with threads): the store runs mount their
// small file systems in it, gone with the test. Empty when it worked.
const std::string& OwnMountNamespace() {
  static const std::string* error = [] {
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return new std::string(std::strerror(errno));
    }
    return new std::string();
  }();
  return *error;
}
const bool kMountNamespaceTaken = OwnMountNamespace().empty();

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoll(value) : fallback;
}

// What the model knows of one tensor.
struct Expected {
  std::shared_ptr<const HostArray> data;
  uint64_t version = 1;
};

// A change sent but not acknowledged: after a restart the tensor is in one
// of these states (nullopt: absent).
struct Uncertain {
  std::vector<std::optional<Expected>> allowed;
};

// A save's contents: each tensor's data at the version saved.
using Saved = std::map<std::string, std::shared_ptr<const HostArray>>;

class Harness {
 public:
  // `store`: the workers keep their shards through restarts (--store_dir).
  // `root`: the workers' --checkpoint_root; `stores`: worker i's
  // --store_dir (store runs).
  Harness(TestCluster* cluster, uint32_t seed, bool store, std::string root,
          std::vector<std::string> stores)
      : cluster_(cluster),
        random_(seed),
        store_(store),
        root_(std::move(root)),
        stores_(std::move(stores)) {}

  // One cycle: some requests, a kill inside the last one, a restart, the
  // checks. False on the first failed check (gtest has the details).
  bool Cycle(int cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    auto client = Client::Connect(cluster_->coordinator_address());
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return false;
    for (int i = 0; i < kWorkers; ++i) {
      EXPECT_OK((*client)->SetWorkerState(cluster_->worker_name(i),
                                          WorkerState::kReady));
    }
    draining_ = -1;
    const int requests = 1 + static_cast<int>(random_() % 4);
    for (int i = 0; i + 1 < requests; ++i) RunOne(**client, /*kill=*/false);
    // The last request races the kill.
    const bool kill_worker = random_() % 8 == 0;
    const int victim = static_cast<int>(random_() % kWorkers);
    RunOne(**client, /*kill=*/true, kill_worker ? victim : -1);
    client->reset();
    EXPECT_OK(cluster_->RestartCoordinator());
    if (kill_worker) {
      EXPECT_OK(cluster_->RestartWorker(victim));
    }
    // With --store_dir a killed worker loses nothing.
    return Check(kill_worker && !store_ ? victim : -1) && CheckSaves();
  }

  int64_t acknowledged() const { return acknowledged_; }
  int64_t lost() const { return lost_; }
  int64_t leaked_bytes() const { return leaked_bytes_; }
  int64_t unacknowledged() const { return unacknowledged_; }
  int64_t lost_to_worker_kills() const { return lost_to_worker_kills_; }
  int64_t drains() const { return drains_; }
  int64_t fills() const { return fills_; }
  int64_t shrunk_loads() const { return shrunk_loads_; }
  int64_t saves_checked() const { return saves_checked_; }

 private:
  std::string NewName() { return absl::StrCat("t", next_name_++); }
  // One replica (two thirds of the time) or two; a quarter of them also
  // mirrored on every worker (copies filled and refilled by the relay).
  LayoutSpec RandomSpec() {
    LayoutSpec spec = LayoutSpec::Chunk(static_cast<int64_t>(random_() % 2),
                                        RandomPlacements());
    spec.replicas = random_() % 3 == 0 ? 2 : 1;
    if (random_() % 4 == 0) spec.mirror = "all";
    return spec;
  }
  std::vector<Placement> RandomPlacements() {
    std::vector<int> ranks;
    const int n = 1 + static_cast<int>(random_() % 4);
    for (int i = 0; i < n; ++i) {
      // Not a draining worker: it takes no new shards, placed or not.
      const int r = static_cast<int>(random_() % kWorkers);
      ranks.push_back(r == draining_ ? (r + 1) % kWorkers : r);
    }
    std::vector<Placement> out;
    for (int r : ranks) out.push_back(Ranks({r})[0]);
    return out;
  }
  // Mostly small; one in three large enough (up to ~1 MiB) that the kill
  // often lands inside the request.
  Shape RandomShape() {
    if (random_() % 3 == 0) {
      return {64 + static_cast<int64_t>(random_() % 2000),
              1 + static_cast<int64_t>(random_() % 64)};
    }
    return {4 + static_cast<int64_t>(random_() % 60),
            1 + static_cast<int64_t>(random_() % 9)};
  }
  std::string AnyName() {
    auto it = model_.begin();
    std::advance(it, random_() % model_.size());
    return it->first;
  }

  // Sends one random request; with `kill`, kills the coordinator (and worker
  // `victim`, unless -1) at a random moment while it runs.
  void RunOne(Client& client, bool kill, int victim = -1) {
    int op = static_cast<int>(random_() % 15);
    if (model_.empty()) op = op % 2;  // create or put
    if ((op == 12 || op == 14) && saved_.empty()) op = 11;
    if (op == 13 && !store_) op = 9;
    if (op == 13) {
      RunFill(client, kill, victim);
      return;
    }
    if (op == 14) {
      RunLoad(client, kill, victim, /*shrink=*/true);
      return;
    }
    if (op == 10) {
      RunDrain(client, kill, victim);
      return;
    }
    if (op == 11) {
      RunSave(client, kill, victim);
      return;
    }
    if (op == 12) {
      RunLoad(client, kill, victim);
      return;
    }
    std::string name;
    std::function<absl::Status()> call;
    std::optional<Expected> before, after;
    if (op <= 1 || op == 9) {
      name = NewName();
      const Shape shape = RandomShape();
      const LayoutSpec spec = RandomSpec();
      Expected created;
      if (op == 0) {
        auto zeros = std::make_shared<HostArray>(
            HostArray::Allocate(DType::kInt32, shape));
        std::fill(zeros->data(), zeros->data() + zeros->num_bytes, 0);
        created.data = zeros;
        call = [&client, name, shape, spec] {
          InitSpec init;
          init.kind = InitSpec::Kind::kZeros;
          return client.Create(name, shape, DType::kInt32, spec, init).status();
        };
      } else {
        created.data = std::make_shared<HostArray>(Iota(
            random_() % 2 ? DType::kFloat32 : DType::kInt64, shape, random_()));
        auto data = created.data;
        call = [&client, name, data, spec] {
          return client.Put(name, *data, spec).status();
        };
      }
      after = created;
    } else if (op == 7 || op == 8) {
      // An update: the whole tensor, or a random region of it.
      name = AnyName();
      before = model_.at(name);
      const HostArray& old = *before->data;
      std::optional<Box> region;
      Shape patch_shape = old.shape;
      if (op == 8) {
        std::vector<int64_t> offsets, sizes;
        for (int64_t n : old.shape) {
          const int64_t begin = static_cast<int64_t>(random_() % n);
          offsets.push_back(begin);
          sizes.push_back(1 + static_cast<int64_t>(random_() % (n - begin)));
        }
        region = Box(offsets, sizes);
        patch_shape = sizes;
      }
      auto patch =
          std::make_shared<HostArray>(Iota(old.dtype, patch_shape, random_()));
      after = before;
      after->version += 1;
      if (region.has_value()) {
        after->data =
            std::make_shared<HostArray>(Patched(old, *region, *patch));
      } else {
        after->data = patch;
      }
      call = [&client, name, patch, region] {
        return client.Update(name, *patch, region).status();
      };
    } else if (op <= 5) {
      name = AnyName();
      before = model_.at(name);
      const LayoutSpec spec = RandomSpec();
      call = [&client, name, spec] {
        return client.Reshard(name, spec).status();
      };
      after = before;
      after->version += 1;
    } else {
      name = AnyName();
      before = model_.at(name);
      call = [&client, name] { return client.Delete(name); };
    }

    absl::Status status;
    if (!kill) {
      status = call();
    } else {
      std::thread request([&] { status = call(); });
      absl::SleepFor(absl::Microseconds(random_() % 20000));
      cluster_->StopCoordinator(SIGKILL);
      if (victim >= 0) cluster_->StopWorker(victim, SIGKILL);
      request.join();
    }
    if (status.ok()) {
      ++acknowledged_;
      Set(name, after);
    } else if (kill) {
      ++unacknowledged_;
      uncertain_[name].allowed = {before, after};
      Set(name, std::nullopt);
    } else {
      // Without a crash every request here is valid and must succeed.
      ADD_FAILURE() << "request on '" << name << "' failed: " << status;
    }
  }

  // Drains a random worker and waits until it holds nothing (the next
  // cycle uncordons it); with `kill`, the coordinator dies meanwhile. A
  // drain changes no tensor: the checks find every one as it was.
  void RunDrain(Client& client, bool kill, int victim) {
    draining_ = static_cast<int>(random_() % kWorkers);
    const std::string worker = cluster_->worker_name(draining_);
    // One drain at a time: with 3 workers, two draining would leave one
    // ready worker, too few for a shard of two replicas to move.
    std::vector<std::string> others;
    for (int i = 0; i < kWorkers; ++i) {
      if (cluster_->worker_name(i) != worker)
        others.push_back(cluster_->worker_name(i));
    }
    auto drain = [&client, worker, others]() -> absl::Status {
      for (const std::string& other : others) {
        TESSERA_RETURN_IF_ERROR(
            client.SetWorkerState(other, WorkerState::kReady));
      }
      TESSERA_RETURN_IF_ERROR(
          client.SetWorkerState(worker, WorkerState::kDraining));
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (absl::Now() < deadline) {
        TESSERA_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers,
                                 client.Workers());
        for (const WorkerInfo& w : workers) {
          if (w.name == worker && w.bytes_used == 0) return absl::OkStatus();
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
      return absl::DeadlineExceededError("drain of " + worker);
    };
    absl::Status status;
    if (!kill) {
      status = drain();
      if (!status.ok()) ADD_FAILURE() << "drain failed: " << status;
    } else {
      std::thread request([&] { status = drain(); });
      absl::SleepFor(absl::Microseconds(random_() % 200000));
      cluster_->StopCoordinator(SIGKILL);
      if (victim >= 0) cluster_->StopWorker(victim, SIGKILL);
      request.join();
    }
    if (status.ok()) ++drains_;
  }

  // Runs `call`; with `kill`, kills the coordinator (and `victim`) at a
  // random moment while it runs.
  absl::Status Race(const std::function<absl::Status()>& call, bool kill,
                    int victim) {
    if (!kill) return call();
    absl::Status status;
    std::thread request([&] { status = call(); });
    absl::SleepFor(absl::Microseconds(random_() % 20000));
    cluster_->StopCoordinator(SIGKILL);
    if (victim >= 0) cluster_->StopWorker(victim, SIGKILL);
    request.join();
    return status;
  }

  // Saves one or two tensors into a new directory.
  void RunSave(Client& client, bool kill, int victim) {
    const std::string dir = absl::StrCat("ckpt", next_save_++);
    Saved contents;
    std::vector<std::string> names;
    for (int i = 0; i < 1 + static_cast<int>(random_() % 2); ++i) {
      const std::string name = AnyName();
      if (contents.count(name) != 0) continue;
      names.push_back(name);
      contents[name] = model_.at(name).data;
    }
    const absl::Status status =
        Race([&] { return client.SaveCheckpoint(dir, names).status(); }, kill,
             victim);
    if (status.ok()) {
      ++acknowledged_;
      saved_.emplace_back(dir, contents);
      to_check_.emplace_back(dir, contents);
    } else if (kill) {
      ++unacknowledged_;
      unsure_saves_.emplace_back(dir, contents);
    } else {
      ADD_FAILURE() << "save into '" << dir << "' failed: " << status;
    }
  }

  // Loads an acknowledged checkpoint as new tensors (PREFIX/ + names).
  // With `shrink`, one of its files is cut short at a random moment of the
  // load (a training job saving over it): the load succeeds whole (every
  // read was done before) or is refused, the workers live on, and the
  // checkpoint is no longer one to load.
  void RunLoad(Client& client, bool kill, int victim, bool shrink = false) {
    const size_t pick = random_() % saved_.size();
    const std::string dir = saved_[pick].first;
    const Saved contents = saved_[pick].second;
    const std::string prefix = NewName() + "/";
    const LayoutSpec spec = RandomSpec();
    std::vector<std::string> files;
    if (shrink) {
      saved_.erase(saved_.begin() + pick);
      to_check_.erase(
          std::remove_if(to_check_.begin(), to_check_.end(),
                         [&](const auto& s) { return s.first == dir; }),
          to_check_.end());
      for (const auto& e :
           std::filesystem::directory_iterator(root_ + "/" + dir)) {
        if (e.path().extension() == ".safetensors")
          files.push_back(e.path().string());
      }
    }
    const std::string cut =
        files.empty() ? std::string() : files[random_() % files.size()];
    const absl::Duration cut_after = absl::Microseconds(random_() % 20000);
    const double cut_to = static_cast<double>(random_() % 1000) / 1000;
    std::thread cutter([&] {
      if (cut.empty()) return;
      absl::SleepFor(cut_after);
      std::error_code error;
      const auto bytes = std::filesystem::file_size(cut, error);
      if (!error) {
        EXPECT_EQ(truncate(cut.c_str(), static_cast<off_t>(bytes * cut_to)), 0)
            << cut;
      }
    });
    const absl::Status status = Race(
        [&] {
          return LoadCheckpoint(
                     client, dir,
                     [&](const Shape&) -> absl::StatusOr<LayoutSpec> {
                       return spec;
                     },
                     prefix)
              .status();
        },
        kill, victim);
    cutter.join();
    for (const auto& [name, data] : contents) {
      Expected loaded;
      loaded.data = data;
      if (status.ok()) {
        Set(prefix + name, loaded);
      } else if (kill) {
        uncertain_[prefix + name].allowed = {std::nullopt, loaded};
      }
    }
    if (shrink) ++shrunk_loads_;
    if (status.ok()) {
      ++acknowledged_;
    } else if (kill) {
      ++unacknowledged_;
    } else if (!shrink) {
      ADD_FAILURE() << "load of '" << dir << "' failed: " << status;
    }
  }

  // A put on one worker larger than the room left on its --store_dir: it
  // is refused (RESOURCE_EXHAUSTED) with nothing kept, and the worker, and
  // every shard it holds, lives on.
  void RunFill(Client& client, bool kill, int victim) {
    int worker = static_cast<int>(random_() % kWorkers);
    if (worker == draining_) worker = (worker + 1) % kWorkers;
    struct statvfs room {};
    ASSERT_EQ(statvfs(stores_[worker].c_str(), &room), 0);
    const int64_t free_bytes = static_cast<int64_t>(room.f_bavail) *
                               static_cast<int64_t>(room.f_frsize);
    const std::string name = NewName();
    const HostArray data =
        Iota(DType::kInt32, {free_bytes / 4096 + 256, 1024}, random_());
    const absl::Status status = Race(
        [&] {
          return client.Put(name, data, LayoutSpec::Chunk(0, Ranks({worker})))
              .status();
        },
        kill, victim);
    ++fills_;
    if (kill) {
      ++unacknowledged_;
      uncertain_[name].allowed = {std::nullopt};
    } else if (!absl::IsResourceExhausted(status)) {
      ADD_FAILURE() << "a put larger than w" << worker
                    << "'s store was not refused as RESOURCE_EXHAUSTED: "
                    << status;
    }
  }

  // Each acknowledged save not checked yet loads back bit-exact; an
  // unacknowledged one loads back bit-exact or not at all.
  bool CheckSaves() {
    auto client_or = Client::Connect(cluster_->coordinator_address());
    EXPECT_TRUE(client_or.ok()) << client_or.status();
    if (!client_or.ok()) return false;
    Client& client = **client_or;
    // The checks load onto every worker: none left draining.
    for (int i = 0; i < kWorkers; ++i) {
      EXPECT_OK(
          client.SetWorkerState(cluster_->worker_name(i), WorkerState::kReady));
    }
    draining_ = -1;
    bool ok = true;
    auto check = [&](const std::string& dir, const Saved& contents,
                     bool acknowledged) {
      const std::string prefix = absl::StrCat("check", next_check_++, "/");
      absl::StatusOr<Client::LoadStats> loaded = LoadCheckpoint(
          client, dir,
          [](const Shape&) -> absl::StatusOr<LayoutSpec> {
            return LayoutSpec::Chunk(0, Ranks({0, 1, 2}));
          },
          prefix);
      if (!loaded.ok()) {
        if (acknowledged) {
          ADD_FAILURE() << "saved checkpoint '" << dir
                        << "' does not load: " << loaded.status();
          ++lost_;
          ok = false;
        }
        return;
      }
      EXPECT_EQ(loaded->tensors.size(), contents.size()) << dir;
      for (const auto& [name, data] : contents) {
        absl::StatusOr<HostArray> got = client.Get(prefix + name);
        if (!got.ok() || !SameBytes(*got, *data)) {
          ADD_FAILURE() << "'" << name << "' of checkpoint '" << dir
                        << "' does not load back exactly: " << got.status();
          ++lost_;
          ok = false;
        }
        EXPECT_OK(client.Delete(prefix + name));
      }
      ++saves_checked_;
    };
    for (const auto& [dir, contents] : to_check_) check(dir, contents, true);
    for (const auto& [dir, contents] : unsure_saves_)
      check(dir, contents, false);
    to_check_.clear();
    unsure_saves_.clear();
    return ok;
  }

  void Set(const std::string& name, const std::optional<Expected>& state) {
    if (state.has_value()) {
      model_[name] = *state;
    } else {
      model_.erase(name);
    }
  }

  bool Check(int lost_worker) {
    auto client_or = Client::Connect(cluster_->coordinator_address());
    EXPECT_TRUE(client_or.ok()) << client_or.status();
    if (!client_or.ok()) return false;
    Client& client = **client_or;
    auto list = client.List();
    EXPECT_TRUE(list.ok()) << list.status();
    if (!list.ok()) return false;
    std::map<std::string, uint64_t> listed;
    for (const TensorInfo& t : *list) listed[t.name] = t.version;

    // Tensors with a shard on a worker that came back empty are lost: their
    // reads fail; they are removed (and leave the model).
    if (lost_worker >= 0) {
      const std::string worker = cluster_->worker_name(lost_worker);
      for (const auto& [name, version] : listed) {
        auto meta = client.Describe(name);
        EXPECT_TRUE(meta.ok()) << name << ": " << meta.status();
        if (!meta.ok()) return false;
        // Lost: a shard whose every replica was on it (others repair).
        auto only_on_it = [&](const ShardInfo& s) {
          for (const Replica& r : s.replicas) {
            if (r.worker != worker) return false;
          }
          return true;
        };
        bool on_it = false;
        for (const ShardInfo& s : meta->shards) on_it |= only_on_it(s);
        if (!on_it) continue;
        // Reads of a lost shard must fail, never return wrong bytes.
        if (meta->shards.size() > 0) {
          auto got = client.Get(name);
          const bool nonempty_lost = [&] {
            for (const ShardInfo& s : meta->shards) {
              if (only_on_it(s) && s.box.NumElements() > 0) return true;
            }
            return false;
          }();
          if (nonempty_lost) {
            EXPECT_FALSE(got.ok()) << name << " read despite a lost shard";
          }
        }
        EXPECT_OK(client.Delete(name));
        model_.erase(name);
        uncertain_.erase(name);
        ++lost_to_worker_kills_;
      }
      list = client.List();
      EXPECT_TRUE(list.ok()) << list.status();
      if (!list.ok()) return false;
      listed.clear();
      for (const TensorInfo& t : *list) listed[t.name] = t.version;
    }

    bool ok = true;
    // Every acknowledged tensor, exact.
    for (const auto& [name, want] : model_) {
      auto it = listed.find(name);
      if (it == listed.end()) {
        ADD_FAILURE() << "acknowledged tensor '" << name << "' is gone";
        ++lost_;
        ok = false;
        continue;
      }
      if (it->second != want.version) {
        ADD_FAILURE() << "'" << name << "' is at version " << it->second
                      << ", acknowledged " << want.version;
        ++lost_;
        ok = false;
      }
      auto got = client.Get(name);
      if (!got.ok() || !SameBytes(*got, *want.data)) {
        ADD_FAILURE() << "'" << name
                      << "' does not read back exactly: " << got.status();
        ++lost_;
        ok = false;
      }
    }
    // Every other tensor: an unacknowledged change, whole.
    for (const auto& [name, version] : listed) {
      if (model_.count(name) != 0) continue;
      auto it = uncertain_.find(name);
      if (it == uncertain_.end()) {
        ADD_FAILURE() << "'" << name << "' exists but was never created";
        ok = false;
        continue;
      }
      bool matched = false;
      auto got = client.Get(name);
      for (const std::optional<Expected>& allowed : it->second.allowed) {
        if (!allowed.has_value() || allowed->version != version) continue;
        if (got.ok() && SameBytes(*got, *allowed->data)) {
          model_[name] = *allowed;
          matched = true;
        }
      }
      if (!matched) {
        ADD_FAILURE() << "'" << name << "' version " << version
                      << " is half there: " << got.status();
        ok = false;
      }
    }
    // Uncertain changes whose tensor is absent: allowed only if absence is.
    for (const auto& [name, uncertain] : uncertain_) {
      if (listed.count(name) != 0) continue;
      bool absent_allowed = false;
      for (const auto& allowed : uncertain.allowed)
        absent_allowed |= !allowed.has_value();
      if (!absent_allowed) {
        ADD_FAILURE() << "'" << name << "' vanished on an unacknowledged "
                      << "reshard";
        ++lost_;
        ok = false;
      }
    }
    uncertain_.clear();
    if (!ok) return false;
    return CheckBytes(client);
  }

  // Every worker's bytes_used equals the bytes of the replicas it should
  // hold, every shard has its R replicas, all available (repairs and drains
  // done), within a lease and a few heartbeats (frees of retired versions
  // and orphans, repairs after a restart).
  bool CheckBytes(Client& client) {
    std::map<std::string, int64_t> want;
    std::map<std::string, int64_t> got;
    bool settled = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (true) {
      want.clear();
      for (int i = 0; i < kWorkers; ++i) want[cluster_->worker_name(i)] = 0;
      settled = true;
      for (const auto& [name, expected] : model_) {
        auto meta = client.Describe(name);
        EXPECT_TRUE(meta.ok()) << meta.status();
        if (!meta.ok()) return false;
        for (const ShardInfo& s : meta->shards) {
          for (const Replica& r : s.replicas) {
            settled = settled && r.available;
            want[r.worker] += s.box.NumElements() *
                              static_cast<int64_t>(ItemSize(meta->dtype));
          }
        }
        // Each tensor reads back exactly whichever replicas serve it.
        auto got_data = client.Get(name);
        if (!got_data.ok() || !SameBytes(*got_data, *expected.data)) {
          ADD_FAILURE() << "'" << name << "' does not read back exactly "
                        << "after repairs: " << got_data.status();
          ++lost_;
          return false;
        }
      }
      got.clear();
      auto workers = client.Workers();
      if (workers.ok()) {
        for (const WorkerInfo& w : *workers) got[w.name] = w.bytes_used;
      }
      if ((settled && got == want) || absl::Now() > deadline) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (settled && got == want) return true;
    if (!settled) ADD_FAILURE() << "a shard is still short of replicas";
    for (const auto& [name, bytes] : want) {
      leaked_bytes_ += got[name] - bytes;
      ADD_FAILURE() << "worker " << name << " uses " << got[name]
                    << " bytes; its shards need " << bytes;
    }
    return false;
  }

  TestCluster* const cluster_;
  std::mt19937 random_;
  int next_name_ = 0;
  std::map<std::string, Expected> model_;
  std::map<std::string, Uncertain> uncertain_;
  int64_t acknowledged_ = 0;
  int64_t unacknowledged_ = 0;
  int64_t lost_ = 0;
  int64_t leaked_bytes_ = 0;
  int64_t lost_to_worker_kills_ = 0;
  int64_t drains_ = 0;
  int64_t fills_ = 0;
  int64_t shrunk_loads_ = 0;
  int draining_ = -1;  // the worker the last drain left draining
  const bool store_;
  const std::string root_;
  const std::vector<std::string> stores_;
  int next_save_ = 0;
  int next_check_ = 0;
  int64_t saves_checked_ = 0;
  // Acknowledged saves (loads pick from them), those not checked yet, and
  // unacknowledged ones.
  std::vector<std::pair<std::string, Saved>> saved_, to_check_, unsure_saves_;
};

// Runs the harness; `store`: workers with --store_dir; `etcd`: the
// coordinator keeps its metadata in etcd (three members) instead of a
// --data_dir, and a restarted one waits for the killed one's lease.
void RunHarness(bool store, bool etcd = false) {
  const int cycles = static_cast<int>(EnvInt("TESSERA_CRASH_CYCLES", 20));
  const uint32_t seed = static_cast<uint32_t>(EnvInt("TESSERA_CRASH_SEED", 1));
  std::mt19937 pick(seed);
  TestClusterOptions options;
  options.num_workers = kWorkers;
  options.durable = !etcd;
  options.coordinator_flags = {
      "--heartbeat_ms=200", "--lease_ms=3000", "--retire_grace_ms=100",
      absl::StrCat("--snapshot_every=", 1 + pick() % 6)};
  if (const char* forward = std::getenv("TESSERA_CRASH_FORWARD")) {
    options.coordinator_flags.push_back(
        absl::StrCat("--replica_forward=", forward));
  }
  std::unique_ptr<testing::EtcdCluster> members;
  if (etcd) {
    members = std::make_unique<testing::EtcdCluster>(3, "crash-etcd");
    ASSERT_TRUE(members->ready());
    options.coordinator_flags.push_back("--metadata=" + members->url("crash"));
    options.coordinator_flags.push_back("--leader_lease=1s");
  }
  const std::string tmp = std::getenv("TEST_TMPDIR");
  // A root of each run's own: the runs share a temp dir, and their
  // checkpoints' names.
  const std::string root = absl::StrCat(
      tmp, store ? "/ckpt-store" : (etcd ? "/ckpt-etcd" : "/ckpt"));
  mkdir(root.c_str(), 0755);
  std::vector<std::string> stores;
  for (int i = 0; store && i < kWorkers; ++i) {
    stores.push_back(absl::StrCat(tmp, "/store-w", i));
    ASSERT_TRUE(kMountNamespaceTaken)
        << "a mount namespace for the stores: " << OwnMountNamespace();
    ASSERT_EQ(mkdir(stores.back().c_str(), 0755), 0);
    ASSERT_EQ(
        mount("tessera-store", stores.back().c_str(), "tmpfs", 0, kStoreSize),
        0)
        << std::strerror(errno);
  }
  options.per_worker_flags = [root, stores](int i) {
    std::vector<std::string> flags = {"--checkpoint_root=" + root};
    if (!stores.empty()) flags.push_back("--store_dir=" + stores[i]);
    return flags;
  };
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Harness harness(cluster->get(), seed, store, root, stores);
  int done = 0;
  const absl::Time start = absl::Now();
  for (int cycle = 0; cycle < cycles; ++cycle) {
    const bool ok = harness.Cycle(cycle);
    ++done;
    if (!ok) break;
  }
  std::printf(
      "crash harness%s%s: seed %u, %d crash/restart cycles in %.0f s, %lld "
      "changes acknowledged, %lld drains, %lld puts past a full store, %lld "
      "loads of files cut short, %lld unacknowledged, %lld tensors "
      "lost with killed workers (expected%s), %lld checkpoints loaded back, "
      "%lld acknowledged changes lost, %lld bytes leaked\n",
      store ? " (--store_dir)" : "", etcd ? " (metadata in etcd)" : "", seed,
      done, absl::ToDoubleSeconds(absl::Now() - start),
      static_cast<long long>(harness.acknowledged()),
      static_cast<long long>(harness.drains()),
      static_cast<long long>(harness.fills()),
      static_cast<long long>(harness.shrunk_loads()),
      static_cast<long long>(harness.unacknowledged()),
      static_cast<long long>(harness.lost_to_worker_kills()),
      store ? ": none" : "", static_cast<long long>(harness.saves_checked()),
      static_cast<long long>(harness.lost()),
      static_cast<long long>(harness.leaked_bytes()));
  EXPECT_EQ(done, cycles);
  EXPECT_EQ(harness.lost(), 0);
  EXPECT_EQ(harness.leaked_bytes(), 0);
  if (store) {
    EXPECT_EQ(harness.lost_to_worker_kills(), 0);
  }
}

TEST(CrashHarnessTest, KillsAndRestartsLoseNothingAcknowledgedAndLeakNothing) {
  RunHarness(/*store=*/false);
}

// The same with the metadata in etcd: every acknowledged change was
// committed there first, and a coordinator started again loads it back.
TEST(CrashHarnessTest, MetadataInEtcdLosesNothingAcknowledged) {
  RunHarness(/*store=*/false, /*etcd=*/true);
}

// The same with every worker on a --store_dir: a killed worker comes back
// with what it held, so no tensor is lost with it.
TEST(CrashHarnessTest, WorkersWithAStoreDirLoseNothingWhenKilled) {
  RunHarness(/*store=*/true);
}

}  // namespace
}  // namespace tessera
