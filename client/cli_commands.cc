#include "client/cli_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/json_output.h"
#include "client/npy_file.h"
#include "client/safetensors_io.h"
#include "client/stdio_file.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/init_fill.h"
#include "core/json.h"
#include "core/labels.h"
#include "core/layout_spec.h"
#include "core/npy.h"
#include "core/parse.h"
#include "core/placement.h"
#include "core/replica_placement.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "ops/version.h"
#include "rpc/status.h"
#include "transport/transport_chain.h"

namespace tessera {
namespace cli {
namespace {

constexpr char kUsagePayload[] = "tessera.dev/cli-usage";
constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

struct FlagDef {
  const char* name;
  bool is_bool;       // --NAME alone; else --NAME=VALUE
  const char* value;  // the value's placeholder in --help
  const char* help;
};

// The flags every command takes, before or after it: one table for the
// parser, its messages, "did you mean", --help and the completion scripts.
const std::vector<FlagDef>& GlobalFlags() {
  static const auto* flags = new std::vector<FlagDef>{
      {"coordinator", false, "HOST:PORT[,HOST:PORT...]",
       "the coordinators (default $TESSERA_COORDINATOR, then 127.0.0.1:7070)"},
      {"transport", false, "auto|shm|ucx|tcp|grpc",
       "how bytes move between workers and this client (default "
       "$TESSERA_TRANSPORT, then auto)"},
      {"timeout", false, "SECONDS", "give up on the command after this long"},
      {"tls_ca", false, "CA.pem",
       "trust the cluster's CA: TLS (default $TESSERA_TLS_CA)"},
      {"tls_cert", false, "U.pem",
       "this client's certificate (default $TESSERA_TLS_CERT)"},
      {"tls_key", false, "U.key", "its private key (default $TESSERA_TLS_KEY)"},
      {"token_file", false, "U.token",
       "this principal's token (default $TESSERA_TOKEN_FILE)"},
      {"verbose", true, "", "more detail after an error line"},
      {"version", true, "", "print the version and exit"},
      {"help", true, "", "this help, or a command's"}};
  return *flags;
}

// Every command's flags, each once: the parser, its messages, "did you
// mean", `tessera COMMAND --help` and the completion scripts read them
// here (a command lists which it takes: Flags below).
const std::vector<FlagDef>& CommandFlagTable() {
  static const auto* flags = new std::vector<FlagDef>{
      {"json", true, "", "print JSON instead of text"},
      {"shape", false, "D0,D1,..", "the tensor's shape"},
      {"dtype", false, "T",
       "element type: float32 float64 float16 bfloat16 int8 uint8 int16 "
       "int32 int64 bool uint16 uint32 uint64 float8_e4m3fn float8_e5m2"},
      {"init", false, "I",
       "the contents: empty (default), zeros, ones, arange, or a fill"},
      {"chunk_dim", false, "D",
       "SPEC: split dim D into one chunk per placement (torch.chunk)"},
      {"placements", false, "P1,P2,..",
       "SPEC: where each chunk goes (rank:N, NAME, either with /DEVICE)"},
      {"shards", false, "'BOX@P;BOX@P;...'", "SPEC: every shard explicit"},
      {"replicas", false, "R", "keep each shard on R distinct workers"},
      {"mirror", false, "SELECTOR",
       "also a whole copy of each shard on every ready worker whose "
       "--labels match KEY=VALUE[,KEY=VALUE...] (or all); reshard: none "
       "drops them"},
      {"input", false, "FILE.npy", "the array to write (- reads stdin)"},
      {"update", true, "",
       "write into the existing tensor, as its next version"},
      {"region", false, "R", "a region: a range per dim, like 0:64,:"},
      {"output", false, "FILE.npy", "where the array goes (- is stdout)"},
      {"shard", false, "K", "shard K alone"},
      {"rows", false, "IDX.npy",
       "rows of dim 0 by index (a 1-D int32 or int64 .npy)"},
      {"all", true, "", "changes not committed yet too, and what is pending"},
      {"prefix", false, "P",
       "a name prefix: import and load name each tensor P + its entry's "
       "name; save and export take every tensor whose name starts with P"},
      {"overwrite", true, "",
       "replace a checkpoint another principal saved, or one tessera did "
       "not save"},
      {"version", false, "N",
       "the version to wait for (default: one more than now)"},
      {"timeout", false, "SECONDS", "give up after this long (exit 1)"},
      {"metadata", false, "K=V,...", "added to the file's __metadata__"},
      {"hf", true, "",
       "write a Hugging Face sharded directory DIR instead of one file"},
      {"strip_prefix", false, "P",
       "--hf: each entry is its tensor's name less P"},
      {"max_shard_size", false, "SIZE",
       "--hf: most data bytes per file, as 500MB, 5GB (default) or 2GiB"}};
  return *flags;
}

// The table's entries for `names`, in that order (a name the table lacks
// is a mistake in this file: it stops the program at its first use).
std::vector<FlagDef> Flags(std::initializer_list<absl::string_view> names) {
  std::vector<FlagDef> out;
  for (absl::string_view name : names) {
    const std::vector<FlagDef>& table = CommandFlagTable();
    auto it = std::find_if(table.begin(), table.end(),
                           [&](const FlagDef& f) { return name == f.name; });
    if (it == table.end()) {
      std::fprintf(stderr, "tessera: flag --%s is not in the flag table\n",
                   std::string(name).c_str());
      std::abort();
    }
    out.push_back(*it);
  }
  return out;
}

// "  --NAME=VALUE   HELP" for each flag, aligned.
std::string FlagHelp(const std::vector<FlagDef>& flags) {
  std::vector<std::string> heads;
  size_t width = 0;
  for (const FlagDef& f : flags) {
    heads.push_back(f.is_bool ? absl::StrCat("--", f.name)
                              : absl::StrCat("--", f.name, "=", f.value));
    width = std::max(width, heads.back().size());
  }
  std::string out;
  for (size_t i = 0; i < flags.size(); ++i) {
    absl::StrAppend(&out, "  ", heads[i],
                    std::string(width - heads[i].size() + 2, ' '),
                    flags[i].help, "\n");
  }
  return out;
}

// What `tessera worker ACTION NAME` does to a worker.
const std::vector<std::string>& WorkerActions() {
  static const auto* actions =
      new std::vector<std::string>{"drain", "cordon", "uncordon", "rm"};
  return *actions;
}

struct CommandDef {
  const char* name;
  const char* synopsis;  // after "tessera "
  const char* summary;
  int num_positional;
  std::vector<FlagDef> flags;
  absl::Status (*run)(const Invocation&, std::ostream&);
  // What the first positional argument is, for "missing ..." messages.
  const char* positional_name = "NAME";
  // More positional arguments than num_positional are allowed.
  bool more_positional = false;
};

constexpr char kSpecHelp[] =
    "SPEC is --chunk_dim=D --placements=P1,P2,... (torch.chunk split) or\n"
    "--shards='BOX@P;BOX@P;...' (every shard explicit). A placement is\n"
    "rank:N/DEVICE, NAME/DEVICE, rank:N or NAME; DEVICE is cpu or cuda:N.\n"
    "--replicas=R keeps each shard on R distinct workers (default 1); the\n"
    "placements name each shard's first.\n";

// The commands on the cluster and its tensors, in help order.
std::vector<CommandDef> ClusterCommands() {
  return {
      {"workers", "workers [--json]", "list workers", 0, Flags({"json"}),
       &RunWorkers},
      {"coordinators", "coordinators [--json]",
       "list the coordinators: which leads, which stand by", 0, Flags({"json"}),
       &RunCoordinators},
      {"quota", "quota [--json]",
       "what principals hold against their quotas (bytes of every replica, "
       "tensor names): an admin sees every principal, others themselves",
       0, Flags({"json"}), &RunQuota},
      {"create",
       "create NAME --shape=D0,D1,.. --dtype=T SPEC [--init=I] [--replicas=R] "
       "[--mirror=SELECTOR] "
       "[--json]",
       "allocate a sharded tensor on the workers", 1,
       Flags({"shape", "dtype", "init", "chunk_dim", "placements", "shards",
              "replicas", "mirror", "json"}),
       &RunCreate},
      {"put",
       "put NAME --input=FILE.npy (SPEC [--replicas=R] [--mirror=SELECTOR] | "
       "--update "
       "[--region=R]) [--dtype=T] [--json]",
       "scatter a .npy array into a new tensor (--update: into an existing "
       "one, as its next version)",
       1,
       Flags({"input", "dtype", "chunk_dim", "placements", "shards", "replicas",
              "mirror", "update", "region", "json"}),
       &RunPut},
      {"get",
       "get NAME --output=FILE.npy [--region=R | --shard=K | --rows=IDX.npy] "
       "[--json]",
       "gather the tensor, a region, shard K or rows of dim 0 into a .npy", 1,
       Flags({"output", "region", "shard", "rows", "json"}), &RunGet},
      {"describe", "describe NAME [--json]",
       "the tensor's global metadata and its shards", 1, Flags({"json"}),
       &RunDescribe},
      {"ls", "ls [PREFIX] [--all] [--json]",
       "list tensors, or those whose name starts with PREFIX (--all: puts "
       "not committed yet too, and what is pending of each)",
       0, Flags({"json", "all"}), &RunList, "PREFIX",
       /*more_positional=*/true},
      {"reshard",
       "reshard NAME [SPEC] [--replicas=R] [--mirror=SELECTOR|none] [--json]",
       "move the tensor to a new sharding, or (SPEC left out) to R replicas "
       "of each shard (version + 1)",
       1,
       Flags(
           {"chunk_dim", "placements", "shards", "replicas", "mirror", "json"}),
       &RunReshard},
      {"rm", "rm NAME... [--json]", "delete the tensors and free their shards",
       1, Flags({"json"}), &RunRemove, "NAME",
       /*more_positional=*/true},
  };
}

// The commands on files (safetensors, checkpoints) and the rest.
std::vector<CommandDef> FileCommands() {
  return {
      {"import",
       "import FILE.safetensors SPEC [--replicas=R] [--mirror=SELECTOR] "
       "[--prefix=P] [--json]",
       "one tensor per entry of a .safetensors file (all or nothing)", 1,
       Flags({"prefix", "chunk_dim", "placements", "shards", "replicas",
              "mirror", "json"}),
       &RunImport, "FILE.safetensors"},
      {"load",
       "load DIR SPEC [--prefix=P] [--replicas=R] [--mirror=SELECTOR] [--json]",
       "one tensor per entry of a checkpoint or Hugging Face model directory "
       "under the workers' --checkpoint_root, each worker reading only its "
       "shards' bytes (all or nothing)",
       1,
       Flags({"prefix", "chunk_dim", "placements", "shards", "replicas",
              "mirror", "json"}),
       &RunLoad, "DIR"},
      {"save", "save DIR (NAME... | --prefix=P) [--overwrite] [--json]",
       "save tensors at their current versions into a checkpoint directory "
       "under the workers' --checkpoint_root: each worker writes the shards "
       "it holds into its own file, then the index files go in. A "
       "checkpoint in DIR that another principal saved is replaced only "
       "with --overwrite",
       1, Flags({"prefix", "overwrite", "json"}), &RunSave, "DIR",
       /*more_positional=*/true},
      {"wait", "wait NAME [--version=N] [--timeout=SECONDS] [--json]",
       "wait until the tensor's committed version is at least N (default: "
       "one more than now; at once if it already is) and print it; the "
       "coordinator answers at the commit (--timeout: give up, exit 1)",
       1, Flags({"version", "timeout", "json"}), &RunWait},
      {"worker", "worker drain|cordon|uncordon|rm NAME [--timeout=SECONDS]",
       "manage a worker (admin role): drain moves its shards away and waits "
       "until it holds none (--timeout, default 600); cordon/uncordon stop "
       "and resume new shards; rm forgets a dead or drained worker",
       2, Flags({"timeout"}), &RunWorker, "drain|cordon|uncordon|rm"},
      {"completion", "completion bash|zsh",
       "print a shell completion script: commands, flags and tensor names "
       "(source <(tessera completion bash))",
       1, Flags({}), &RunCompletion, "bash|zsh"},
      {"export",
       "export (FILE.safetensors | --hf DIR) (NAME... | --prefix=P) "
       "[--metadata=K=V,...] [--strip_prefix=P] [--max_shard_size=5GB] "
       "[--overwrite] [--json]",
       "write tensors into one .safetensors file; with --hf, into a Hugging "
       "Face sharded directory under the workers' --checkpoint_root "
       "(model-0000K-of-0000N.safetensors of whole tensors, each file at "
       "most --max_shard_size, and model.safetensors.index.json), written by "
       "the workers, names less --strip_prefix; a checkpoint in DIR is "
       "replaced as save's (--overwrite)",
       1,
       Flags({"prefix", "metadata", "hf", "strip_prefix", "max_shard_size",
              "overwrite", "json"}),
       &RunExport, "FILE.safetensors",
       /*more_positional=*/true},
  };
}

const std::vector<CommandDef>& Commands() {
  static const auto* commands = [] {
    auto* all = new std::vector<CommandDef>(ClusterCommands());
    for (CommandDef& c : FileCommands()) all->push_back(std::move(c));
    return all;
  }();
  return *commands;
}

// Every command's name, in the table's order.
std::string CommandNames() {
  std::vector<std::string> names;
  for (const CommandDef& c : Commands()) names.push_back(c.name);
  return absl::StrJoin(names, " ");
}

// "; did you mean 'X'?" when one of `known` is a likely meaning of
// `typed`; empty otherwise.
std::string DidYouMean(absl::string_view typed,
                       const std::vector<std::string>& known) {
  const std::string guess = ClosestName(typed, known);
  return guess.empty() ? "" : absl::StrCat("; did you mean '", guess, "'?");
}

const CommandDef* FindCommand(absl::string_view name) {
  for (const CommandDef& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::string MainUsage() {
  std::string out =
      "usage: tessera [GLOBAL FLAGS] COMMAND [ARGS]\n"
      "       tessera --version\n\n"
      "global flags (before or after the command):\n";
  out += FlagHelp(GlobalFlags());
  out += "\ncommands:\n";
  for (const CommandDef& c : Commands()) {
    // A long synopsis gets its own line; the summary goes under it.
    if (std::strlen(c.synopsis) > 60) {
      absl::StrAppendFormat(&out, "  %s\n  %-60s %s\n", c.synopsis, "",
                            c.summary);
    } else {
      absl::StrAppendFormat(&out, "  %-60s %s\n", c.synopsis, c.summary);
    }
  }
  out += "\n";
  out += kSpecHelp;
  out += "\nRun 'tessera COMMAND --help' for one command.\n";
  return out;
}

std::string CommandUsage(const CommandDef& c) {
  std::string out =
      absl::StrCat("usage: tessera ", c.synopsis, "\n\n", c.summary, "\n");
  if (!c.flags.empty()) {
    out += "\nflags:\n";
    out += FlagHelp(c.flags);
  }
  if (absl::StrContains(c.synopsis, "SPEC")) {
    out += "\n";
    out += kSpecHelp;
  }
  return out;
}

std::string FlagList(const CommandDef& c) {
  if (c.flags.empty()) return "none";
  std::vector<std::string> names;
  for (const FlagDef& f : c.flags) names.push_back(absl::StrCat("--", f.name));
  return absl::StrJoin(names, " ");
}

absl::StatusOr<bool> ParseBool(absl::string_view flag, absl::string_view v) {
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return UsageError(
      absl::StrCat("--", flag, "=", v, ": expected true or false"));
}

// ---- formatting helpers ----------------------------------------------------

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatRate(int64_t bytes, double seconds) {
  return absl::StrFormat(
      "%.3f s, %.2f GB/s", seconds,
      static_cast<double>(bytes) / std::max(seconds, 1e-9) / 1e9);
}

// Prints rows as left-aligned columns separated by three spaces.
void PrintTable(const std::vector<std::vector<std::string>>& rows,
                std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 3, ' ');
    }
    out << line << "\n";
  }
}

// ---- argument checks (all usage errors)
// --------------------------------------

absl::StatusOr<std::string> TensorName(const Invocation& inv) {
  const std::string& name = inv.positional.at(0);
  absl::Status status = CheckTensorName(name);
  if (!status.ok()) return UsageError(status);
  return name;
}

absl::StatusOr<std::string> RequiredFlag(const Invocation& inv,
                                         const std::string& flag,
                                         absl::string_view what) {
  std::optional<std::string> value = inv.Get(flag);
  if (!value.has_value()) {
    return UsageError(absl::StrCat("missing --", flag, "=", what,
                                   " (usage: tessera ",
                                   FindCommand(inv.command)->synopsis, ")"));
  }
  return *value;
}

// A value parsed by a core function; its error becomes a usage error
// prefixed with the flag.
template <typename T>
absl::StatusOr<T> ParseFlag(const std::string& flag, absl::StatusOr<T> parsed) {
  if (!parsed.ok()) {
    return UsageError(Annotate(parsed.status(), absl::StrCat("--", flag)));
  }
  return parsed;
}

absl::StatusOr<DType> DTypeFlag(const Invocation& inv) {
  return ParseFlag("dtype", ParseDType(*inv.Get("dtype")));
}

// A SPEC as parsed, before it is resolved against a shape.
struct SpecArgs {
  int32_t replicas = 0;  // --replicas; 0: not given
  std::string mirror;    // --mirror, as a selector's text; empty: not given
  bool chunk = true;
  int64_t chunk_dim = 0;
  std::vector<Placement> placements;
  std::vector<ShardText> shards;
};

// --replicas=R (0 when not given).
absl::StatusOr<int32_t> ReplicasFlag(const Invocation& inv) {
  if (!inv.Has("replicas")) return 0;
  const std::string text = *inv.Get("replicas");
  absl::StatusOr<int64_t> r = ParseInt64(text);
  if (!r.ok()) return UsageError(Annotate(r.status(), "--replicas"));
  if (absl::Status s = CheckReplicaCount(*r); !s.ok()) return UsageError(s);
  return static_cast<int32_t>(*r);
}

// --mirror=SELECTOR (or none), in its canonical text; empty when not given.
absl::StatusOr<std::string> MirrorFlag(const Invocation& inv) {
  if (!inv.Has("mirror")) return std::string();
  const std::string text = *inv.Get("mirror");
  if (text == "none") return text;
  absl::StatusOr<LabelSelector> selector = ParseLabelSelector(text);
  if (!selector.ok()) {
    return UsageError(Annotate(selector.status(), "--mirror"));
  }
  return selector->ToString();
}

absl::StatusOr<SpecArgs> ParseSpec(const Invocation& inv) {
  const bool chunk = inv.Has("chunk_dim") || inv.Has("placements");
  const bool shards = inv.Has("shards");
  if (chunk && shards) {
    return UsageError(
        "give either --chunk_dim and --placements, or --shards, not both");
  }
  SpecArgs spec;
  TESSERA_ASSIGN_OR_RETURN(spec.replicas, ReplicasFlag(inv));
  TESSERA_ASSIGN_OR_RETURN(spec.mirror, MirrorFlag(inv));
  if (shards) {
    spec.chunk = false;
    TESSERA_ASSIGN_OR_RETURN(
        spec.shards, ParseFlag("shards", ParseShardList(*inv.Get("shards"))));
    return spec;
  }
  if (!chunk) {
    return UsageError(
        "missing the sharding: give --chunk_dim=D --placements=P1,P2,... or "
        "--shards='BOX@P;BOX@P;...'");
  }
  if (!inv.Has("chunk_dim")) {
    return UsageError("--placements needs --chunk_dim=D (the dim to split)");
  }
  if (!inv.Has("placements")) {
    return UsageError(
        "--chunk_dim needs --placements=P1,P2,... (one per shard)");
  }
  TESSERA_ASSIGN_OR_RETURN(
      spec.chunk_dim,
      ParseFlag("chunk_dim", ParseInt64(*inv.Get("chunk_dim"))));
  TESSERA_ASSIGN_OR_RETURN(
      spec.placements,
      ParseFlag("placements", ParsePlacementList(*inv.Get("placements"))));
  return spec;
}

// Resolves the boxes of an enumerable spec against `shape` (errors here are
// about the tensor: exit 1).
absl::StatusOr<LayoutSpec> ResolveSpec(const SpecArgs& spec,
                                       const Shape& shape) {
  LayoutSpec layout;
  if (spec.chunk) {
    layout = LayoutSpec::Chunk(spec.chunk_dim, spec.placements);
  } else {
    std::vector<Box> boxes;
    std::vector<Placement> placements;
    for (const ShardText& shard : spec.shards) {
      TESSERA_ASSIGN_OR_RETURN(Box box, ResolveBox(shard.ranges, shape));
      boxes.push_back(std::move(box));
      placements.push_back(shard.placement);
    }
    layout = LayoutSpec::Enumerable(std::move(boxes), std::move(placements));
  }
  layout.replicas = spec.replicas;
  layout.mirror = spec.mirror;
  return layout;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const Invocation& inv) {
  ClientOptions options;
  options.tls_ca = inv.global.tls_ca;
  options.tls_cert = inv.global.tls_cert;
  options.tls_key = inv.global.tls_key;
  options.transport = inv.global.transport;
  if (inv.global.timeout_s > 0) {
    const absl::Duration limit = absl::Seconds(inv.global.timeout_s);
    options.connect_timeout = std::min(options.connect_timeout, limit);
    options.rpc_timeout = std::min(options.rpc_timeout, limit);
    options.data_timeout = std::min(options.data_timeout, limit);
  }
  if (!inv.global.token_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(options.token,
                             ReadTokenFile(inv.global.token_file));
  }
  return Client::Connect(inv.global.coordinator, options);
}

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

std::string InitText(const Invocation& inv) {
  return inv.Get("init").value_or("empty");
}

// Bytes per transport moved, and fallbacks, since `before`.
DataPlaneStats Since(const DataPlaneStats& before, DataPlaneStats now) {
  for (auto& [transport, bytes] : now.bytes) {
    auto it = before.bytes.find(transport);
    if (it != before.bytes.end()) bytes -= it->second;
  }
  for (auto& [transport, count] : now.fallbacks) {
    auto it = before.fallbacks.find(transport);
    if (it != before.fallbacks.end()) count -= it->second;
  }
  for (auto& [worker, bytes] : now.served) {
    auto it = before.served.find(worker);
    if (it != before.served.end()) bytes -= it->second;
  }
  return now;
}

// Bytes this client has moved so far, counted as they land or leave.
int64_t Moved(const DataPlaneStats& stats) { return stats.landed + stats.sent; }

// A progress line on stderr while a transfer runs, once it has run for a
// second, when stderr is a terminal and the output is not JSON (CLI.md
// "Data plane and output"), redrawn every 0.25 s.
class Progress {
 public:
  // Bytes done and of how many (<= 0: not known: bytes and rate, no
  // percentage); nullopt: nothing to show yet.
  struct Sample {
    int64_t done = 0;
    int64_t total = 0;
  };
  using Sampler = std::function<std::optional<Sample>()>;

  // Bytes this client's transports move, counted as pieces land or leave.
  Progress(const Client& client, std::string what, int64_t total, bool enabled)
      : Progress(std::move(what), enabled,
                 [&client, total, base = Moved(client.TransferStats())] {
                   return std::optional<Sample>(
                       Sample{Moved(client.TransferStats()) - base, total});
                 }) {}
  // What `sample` says (asked from the drawing thread).
  Progress(std::string what, bool enabled, Sampler sample)
      : what_(std::move(what)),
        sample_(std::move(sample)),
        start_(absl::Now()) {
    if (enabled && isatty(STDERR_FILENO) == 1) {
      thread_ = std::thread([this] { Run(); });
    }
  }
  ~Progress() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  void Run() {
    size_t printed = 0;  // length of the line on screen
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&done_),
                                 absl::Milliseconds(250))) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
      if (seconds < 1) continue;
      std::optional<Sample> sample;
      {
        // The sampler may ask the coordinator: not under the lock that the
        // destructor waits on.
        mu_.Unlock();
        sample = sample_();
        mu_.Lock();
      }
      if (!sample.has_value() || done_) continue;
      const int64_t total = sample->total;
      int64_t done = std::max<int64_t>(0, sample->done);
      if (total > 0) done = std::min(total, done);
      std::string line =
          total > 0 ? absl::StrCat(what_, ": ", FormatBytes(done), " of ",
                                   FormatBytes(total), " (", done * 100 / total,
                                   "%), ")
                    : absl::StrCat(what_, ": ", FormatBytes(done), ", ");
      absl::StrAppend(&line,
                      absl::StrFormat("%.2f GB/s", done / seconds / 1e9));
      if (line.size() < printed) line.append(printed - line.size(), ' ');
      std::cerr << "\r" << line << std::flush;
      printed = line.size();
    }
    // Clear the line: the command's own result line follows.
    if (printed > 0) {
      std::cerr << "\r" << std::string(printed, ' ') << "\r" << std::flush;
    }
  }

  const std::string what_;
  const Sampler sample_;
  const absl::Time start_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Reshard, showing the coordinator's count of the bytes landed in the new
// shards as they land (the client moves none itself).
absl::StatusOr<ReshardStats> ReshardWithProgress(const Invocation& inv,
                                                 Client* client,
                                                 const std::string& name,
                                                 const LayoutSpec& spec) {
  Progress progress(
      absl::StrCat("reshard ", name), !inv.GetBool("json"),
      [client, &name]() -> std::optional<Progress::Sample> {
        absl::StatusOr<MoveProgress> now = client->ReshardProgress(name);
        if (!now.ok() || !now->running) return std::nullopt;
        return Progress::Sample{now->bytes_done, now->bytes_total};
      });
  return client->Reshard(name, spec);
}

// Most indices a --rows file may hold (what one get may ask for).
constexpr int64_t kMaxRowIndices = int64_t{1} << 28;

// The indices of a --rows file: a 1-D .npy of int32 or int64. Errors say
// "rows" (exit 1: the file parsed as a flag but is wrong).
absl::StatusOr<std::vector<int64_t>> ReadRowsFile(const std::string& path) {
  absl::StatusOr<NpyInput> file = OpenNpyFile(path, std::nullopt);
  if (!file.ok()) {
    return Annotate(file.status(),
                    absl::StrCat("--rows=", path, ": cannot read the rows"));
  }
  if (file->shape.size() != 1 ||
      (file->dtype != DType::kInt32 && file->dtype != DType::kInt64)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rows=", path,
        ": the rows must be a 1-D array of int32 or int64 "
        "indices, but the file holds ",
        DTypeName(file->dtype), " of shape ", ShapeToString(file->shape)));
  }
  const int64_t n = file->shape[0];
  if (n > kMaxRowIndices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rows=", path, ": ", n, " rows are more than one get may ask for (",
        kMaxRowIndices, ")"));
  }
  std::vector<int64_t> rows(static_cast<size_t>(n));
  if (file->dtype == DType::kInt64) {
    if (n > 0) std::memcpy(rows.data(), file->data(), n * sizeof(int64_t));
  } else {
    const char* data = file->data();
    for (int64_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, data + i * sizeof(int32_t), sizeof(v));
      rows[i] = v;
    }
  }
  // Indices read while the file shrank (zeros past its end) are not used.
  if (file->mapped) {
    if (absl::Status s = file->mapping->CheckUnchanged(); !s.ok()) {
      return Annotate(s, absl::StrCat("--rows=", path));
    }
  }
  return rows;
}

// SPEC flags are given.
bool HasSpec(const Invocation& inv) {
  return inv.Has("chunk_dim") || inv.Has("placements") || inv.Has("shards");
}

}  // namespace

// ---- usage errors and Invocation
// ---------------------------------------------

absl::Status UsageError(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kUsagePayload, absl::Cord("1"));
  return status;
}

absl::Status UsageError(const absl::Status& status) {
  absl::Status out = status;
  out.SetPayload(kUsagePayload, absl::Cord("1"));
  return out;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

std::optional<std::string> Invocation::Get(const std::string& flag) const {
  auto it = flags.find(flag);
  if (it == flags.end()) return std::nullopt;
  return it->second;
}

bool Invocation::GetBool(const std::string& flag) const {
  auto it = flags.find(flag);
  return it != flags.end() && it->second == "true";
}

// ---- commands
// -----------------------------------------------------------------

// `-` as an input: stdin, copied into `spool` first (see stdio_file.h).
// Returns the path to read.
absl::StatusOr<std::string> InputPath(const std::string& path,
                                      const StreamBytes& stream_bytes,
                                      std::unique_ptr<SpooledInput>* spool) {
  if (!IsStdio(path)) return path;
  TESSERA_ASSIGN_OR_RETURN(*spool,
                           SpooledInput::Copy(STDIN_FILENO, stream_bytes));
  return (*spool)->path();
}

// `-` (or /dev/stdout) as an output when stdout is a terminal: a usage
// error, since binary bytes there are no use and can leave it in a mess (as
// curl says).
absl::Status RefuseBinaryToTerminal(const std::string& path,
                                    absl::string_view format) {
  if (!IsStdoutOutput(path) || isatty(STDOUT_FILENO) != 1) {
    return absl::OkStatus();
  }
  return UsageError(absl::StrCat(
      "refusing to write binary ", format,
      " bytes to a terminal: redirect stdout (> FILE, | python3 ...) or give "
      "a file name instead of ",
      path));
}

// `-` (or /dev/stdout) as an output: "-", which the file writers take as
// stdout (written whole at their commit, from an unnamed temporary file:
// a failed get writes nothing to stdout, and a killed one leaves nothing
// behind).
absl::StatusOr<std::string> OutputPath(const std::string& path,
                                       absl::string_view format,
                                       std::ostream& out) {
  TESSERA_RETURN_IF_ERROR(RefuseBinaryToTerminal(path, format));
  if (!IsStdoutOutput(path)) return path;
  out.flush();  // anything before the bytes goes first
  return std::string("-");
}

// Where a command's report goes: stderr when stdout carries the data.
std::ostream& ReportTo(const Invocation& inv, const std::string& output,
                       std::ostream& out) {
  return IsStdoutOutput(output) && inv.err != nullptr ? *inv.err : out;
}

absl::Status RunCoordinators(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  TESSERA_ASSIGN_OR_RETURN(std::vector<CoordinatorStatus> list,
                           client->Coordinators());
  if (inv.GetBool("json")) {
    out << CoordinatorsJson(list) << "\n";
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> rows = {{"ADDRESS", "ROLE", "ALIVE"}};
  for (const CoordinatorStatus& c : list) {
    rows.push_back({c.address, c.role, c.alive ? "yes" : "no"});
  }
  PrintTable(rows, out);
  return absl::OkStatus();
}

absl::Status RunQuota(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  TESSERA_ASSIGN_OR_RETURN(std::vector<QuotaInfo> quotas, client->Quotas());
  if (inv.GetBool("json")) {
    out << QuotasJson(quotas) << "\n";
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> rows = {
      {"PRINCIPAL", "BYTES", "BYTES_LIMIT", "NAMES", "NAMES_LIMIT"}};
  for (const QuotaInfo& q : quotas) {
    rows.push_back(
        {q.principal, FormatBytes(q.bytes),
         q.bytes_limit < 0 ? "unlimited" : FormatBytes(q.bytes_limit),
         absl::StrCat(q.names),
         q.names_limit < 0 ? "unlimited" : absl::StrCat(q.names_limit)});
  }
  PrintTable(rows, out);
  return absl::OkStatus();
}

absl::Status RunWorkers(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  TESSERA_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, client->Workers());
  if (inv.GetBool("json")) {
    out << WorkersJson(workers) << "\n";
    return absl::OkStatus();
  }
  // STATE tells a draining or cordoned worker from a ready one; ZONE is
  // its failure domain (replicas of a shard go to different zones).
  std::vector<std::vector<std::string>> rows = {{"NAME", "RANK", "ADDRESS",
                                                 "DEVICE", "ZONE", "STATE",
                                                 "ALIVE", "BYTES_USED"}};
  for (const WorkerInfo& w : workers) {
    rows.push_back({w.name, absl::StrCat(w.rank), w.address,
                    w.device.ToString(), w.zone.empty() ? "-" : w.zone,
                    std::string(WorkerStateName(w.state)),
                    w.alive ? "yes" : "no", FormatBytes(w.bytes_used)});
  }
  PrintTable(rows, out);
  // Shards kept for another cluster (README "Cluster identity"): rare, and
  // an operator must see them.
  for (const WorkerInfo& w : workers) {
    if (w.quarantined_shards == 0) continue;
    out << "worker " << w.name << " keeps " << w.quarantined_shards
        << " shard(s) (" << FormatBytes(w.quarantined_bytes)
        << ") quarantined for another cluster\n";
  }
  // GPU workers: how full their device is (all users of the GPU counted).
  for (const WorkerInfo& w : workers) {
    if (w.device_total_bytes == 0) continue;
    out << "worker " << w.name << " " << w.device.ToString() << ": "
        << FormatBytes(w.device_total_bytes - w.device_free_bytes) << " of "
        << FormatBytes(w.device_total_bytes) << " device memory in use\n";
  }
  return absl::OkStatus();
}

absl::Status RunCreate(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(const std::string name, TensorName(inv));
  TESSERA_ASSIGN_OR_RETURN(const std::string shape_text,
                           RequiredFlag(inv, "shape", "D0,D1,..."));
  TESSERA_ASSIGN_OR_RETURN(const Shape shape,
                           ParseFlag("shape", ParseShape(shape_text)));
  TESSERA_RETURN_IF_ERROR(RequiredFlag(inv, "dtype", "T").status());
  TESSERA_ASSIGN_OR_RETURN(const DType dtype, DTypeFlag(inv));
  TESSERA_ASSIGN_OR_RETURN(const InitSpec init,
                           ParseFlag("init", ParseInit(InitText(inv))));
  absl::Status init_ok = CheckInitValue(init, dtype);
  if (!init_ok.ok()) return UsageError(Annotate(init_ok, "--init"));
  TESSERA_ASSIGN_OR_RETURN(const SpecArgs spec_args, ParseSpec(inv));

  TESSERA_ASSIGN_OR_RETURN(const LayoutSpec spec,
                           ResolveSpec(spec_args, shape));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  const absl::Time start = absl::Now();
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta,
                           client->Create(name, shape, dtype, spec, init));
  const double seconds = SecondsSince(start);
  if (inv.GetBool("json")) {
    out << TensorJson(meta, meta.ByteSize(), seconds,
                      client->TransferStats().workers_sent)
        << "\n";
    return absl::OkStatus();
  }
  out << "created " << meta.name << ": shape " << ShapeToString(meta.shape)
      << " " << DTypeName(meta.dtype) << ", " << FormatBytes(meta.ByteSize())
      << " in " << meta.shards.size() << " shard"
      << (meta.shards.size() == 1 ? "" : "s") << ", init " << init.ToString()
      << ", version " << meta.version << ", "
      << FormatRate(meta.ByteSize(), seconds) << "\n";
  return absl::OkStatus();
}

// put --update: new contents for an existing tensor, as its next version.
absl::Status RunUpdate(const Invocation& inv, const std::string& name,
                       const std::string& input, std::optional<DType> dtype,
                       std::ostream& out) {
  std::optional<std::vector<DimRange>> ranges;
  if (inv.Has("region")) {
    TESSERA_ASSIGN_OR_RETURN(
        ranges, ParseFlag("region", ParseRanges(*inv.Get("region"))));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  TESSERA_ASSIGN_OR_RETURN(const TensorMetadata meta, client->Describe(name));
  std::optional<Box> region;
  if (ranges.has_value()) {
    TESSERA_ASSIGN_OR_RETURN(region, ResolveRegion(*ranges, meta.shape));
  }
  // A bfloat16 or float8 tensor takes a file of its raw words ('<u2',
  // '|u1') as its bits without --dtype; any other file keeps its dtype (and
  // Update names both if they differ).
  TESSERA_ASSIGN_OR_RETURN(const NpyInput file,
                           OpenNpyFile(input, dtype, /*words_of=*/meta.dtype));
  absl::StatusOr<UpdateStats> updated;
  {
    Progress progress(*client, absl::StrCat("update ", name), file.num_bytes,
                      !inv.GetBool("json"));
    updated = client->Update(name, file.shape, file.dtype, file.data(), region);
  }
  TESSERA_ASSIGN_OR_RETURN(UpdateStats stats, std::move(updated));
  if (inv.GetBool("json")) {
    out << UpdateJson(stats, client->TransferStats().workers_sent) << "\n";
    return absl::OkStatus();
  }
  out << "updated " << name;
  if (region.has_value()) out << " region " << region->ToString();
  out << " from " << input << " to version " << stats.version << ": wrote "
      << FormatBytes(stats.bytes_written) << ", kept " << stats.shards_kept
      << " shard" << (stats.shards_kept == 1 ? "" : "s") << ", "
      << FormatRate(stats.bytes_written, stats.seconds) << "\n";
  return absl::OkStatus();
}

absl::Status RunPut(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(const std::string name, TensorName(inv));
  TESSERA_ASSIGN_OR_RETURN(const std::string input_flag,
                           RequiredFlag(inv, "input", "FILE.npy"));
  if (input_flag.empty()) {
    return UsageError("--input needs a file name (or - for stdin)");
  }
  std::unique_ptr<SpooledInput> spool;
  TESSERA_ASSIGN_OR_RETURN(const std::string input,
                           InputPath(input_flag, NpyStreamBytes, &spool));
  std::optional<DType> dtype;
  if (inv.Has("dtype")) {
    TESSERA_ASSIGN_OR_RETURN(dtype, DTypeFlag(inv));
  }
  if (inv.GetBool("update")) {
    if (HasSpec(inv) || inv.Has("replicas") || inv.Has("mirror")) {
      return UsageError(
          "put --update keeps the tensor's layout: leave out --chunk_dim, "
          "--placements, --shards, --replicas and --mirror");
    }
    return RunUpdate(inv, name, input, dtype, out);
  }
  if (inv.Has("region")) {
    return UsageError(
        "--region needs --update (put --update --region=R writes only that "
        "region of an existing tensor)");
  }
  TESSERA_ASSIGN_OR_RETURN(const SpecArgs spec_args, ParseSpec(inv));

  // The file is used where it lies (mapped) when it is C order and
  // little-endian, so a put needs no memory for the array.
  TESSERA_ASSIGN_OR_RETURN(NpyInput array, OpenNpyFile(input, dtype));
  TESSERA_ASSIGN_OR_RETURN(const LayoutSpec spec,
                           ResolveSpec(spec_args, array.shape));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  const absl::Time start = absl::Now();
  absl::StatusOr<TensorMetadata> put;
  {
    Progress progress(*client, absl::StrCat("put ", name), array.num_bytes,
                      !inv.GetBool("json"));
    put = client->Put(name, array.shape, array.dtype, array.data(), spec);
  }
  if (!put.ok()) return put.status();
  const TensorMetadata& meta = *put;
  const double seconds = SecondsSince(start);
  if (inv.GetBool("json")) {
    out << PutJson(meta, array.num_bytes, seconds,
                   client->TransferStats().workers_sent)
        << "\n";
    return absl::OkStatus();
  }
  out << "put " << meta.name << " from " << input_flag << ": shape "
      << ShapeToString(meta.shape) << " " << DTypeName(meta.dtype) << ", "
      << FormatBytes(array.num_bytes) << " in " << meta.shards.size()
      << " shard" << (meta.shards.size() == 1 ? "" : "s") << ", version "
      << meta.version << ", " << FormatRate(array.num_bytes, seconds) << "\n";
  return absl::OkStatus();
}

absl::Status RunGet(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(const std::string name, TensorName(inv));
  TESSERA_ASSIGN_OR_RETURN(const std::string output,
                           RequiredFlag(inv, "output", "FILE.npy"));
  if (output.empty()) {
    return UsageError("--output needs a file name (or - for stdout)");
  }
  TESSERA_RETURN_IF_ERROR(RefuseBinaryToTerminal(output, "npy"));
  if (inv.Has("region") && inv.Has("shard")) {
    return UsageError("--region and --shard cannot be used together");
  }
  if (inv.Has("rows") && (inv.Has("region") || inv.Has("shard"))) {
    return UsageError(
        "--rows cannot be used with --region or --shard (it picks rows of "
        "the whole tensor)");
  }
  std::optional<std::string> region_text = inv.Get("region");
  std::optional<std::vector<DimRange>> ranges;
  if (region_text.has_value()) {
    TESSERA_ASSIGN_OR_RETURN(ranges,
                             ParseFlag("region", ParseRanges(*region_text)));
  }
  std::optional<int64_t> shard;
  if (inv.Has("shard")) {
    TESSERA_ASSIGN_OR_RETURN(shard,
                             ParseFlag("shard", ParseInt64(*inv.Get("shard"))));
  }
  std::optional<std::string> rows_path = inv.Get("rows");
  if (rows_path.has_value() && rows_path->empty()) {
    return UsageError("--rows needs a file name (a 1-D .npy of indices)");
  }
  std::vector<int64_t> rows;
  if (rows_path.has_value()) {
    TESSERA_ASSIGN_OR_RETURN(rows, ReadRowsFile(*rows_path));
  }

  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  const absl::Time start = absl::Now();
  const DataPlaneStats before = client->TransferStats();
  TESSERA_ASSIGN_OR_RETURN(const TensorMetadata meta, client->Describe(name));
  // What is fetched, and so the output's shape, is known before a byte
  // moves: the file is sized and mapped, and the data lands in it.
  Shape shape = meta.shape;
  std::optional<Box> box;
  if (ranges.has_value()) {
    TESSERA_ASSIGN_OR_RETURN(box, ResolveRegion(*ranges, meta.shape));
  } else if (shard.has_value()) {
    if (*shard < 0 || *shard >= static_cast<int64_t>(meta.shards.size())) {
      return OutOfBoundsError(
          absl::StrCat("--shard=", *shard),
          absl::StrCat("tensor '", name, "' has ", meta.shards.size(),
                       meta.shards.size() == 1 ? " shard" : " shards"));
    }
    box = meta.shards[static_cast<size_t>(*shard)].box;
  } else if (rows_path.has_value()) {
    shape[0] = static_cast<int64_t>(rows.size());
  }
  if (box.has_value()) shape.assign(box->sizes.begin(), box->sizes.end());
  TESSERA_ASSIGN_OR_RETURN(const std::string path,
                           OutputPath(output, "npy", out));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<NpyFileWriter> file,
                           NpyFileWriter::Create(path, meta.dtype, shape));
  const int64_t bytes = file->data_bytes();
  absl::Status status;
  // The version whose bytes land in the file: a read that met a newer
  // version (an update committed meanwhile) reads that one whole.
  uint64_t version = meta.version;
  {
    Progress progress(*client, absl::StrCat("get ", name), bytes,
                      !inv.GetBool("json"));
    if (rows_path.has_value()) {
      status =
          client->GatherRowsInto(name, rows, file->data(), bytes, &version);
    } else if (bytes > 0) {
      status = client->GetInto(name, box, file->data(), bytes, &version);
    }
    // else nothing to move: an empty shard (chunk sharding lists trailing
    // empty shards, at offsets past the end) or an empty region.
  }
  if (!status.ok()) return status;  // the file is removed with `file`
  TESSERA_RETURN_IF_ERROR(file->Commit());
  const double seconds = SecondsSince(start);
  std::ostream& report = ReportTo(inv, output, out);
  if (inv.GetBool("json")) {
    report << GetJson(name, shape, meta.dtype, version, bytes, seconds,
                      Since(before, client->TransferStats()))
           << "\n";
    return absl::OkStatus();
  }
  std::string what = name;
  if (shard.has_value()) absl::StrAppend(&what, " shard ", *shard);
  if (region_text.has_value()) absl::StrAppend(&what, " region ", *region_text);
  if (rows_path.has_value()) {
    absl::StrAppend(&what, " rows of ", *rows_path);
  }
  report << "got " << what << " into "
         << (IsStdio(output) ? std::string("stdout") : output) << ": shape "
         << ShapeToString(shape) << " " << DTypeName(meta.dtype) << ", "
         << FormatBytes(bytes) << ", " << FormatRate(bytes, seconds) << "\n";
  return absl::OkStatus();
}

absl::Status RunDescribe(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(const std::string name, TensorName(inv));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, client->Describe(name));
  if (inv.GetBool("json")) {
    out << DescribeJson(meta) << "\n";
    return absl::OkStatus();
  }
  out << "Name:      " << meta.name << "\n"
      << "Shape:     " << ShapeToString(meta.shape) << "\n"
      << "DType:     " << DTypeName(meta.dtype) << "\n"
      << "Version:   " << meta.version << "\n"
      << "Size:      " << FormatBytes(meta.ByteSize()) << "\n"
      << "Shards:    " << meta.shards.size() << "\n";
  if (!meta.pending.empty()) out << "Pending:   " << meta.pending << "\n";
  if (!meta.mirror.empty()) out << "Mirror:    " << meta.mirror << "\n";
  // Every replica of every shard, one row each (REPLICA 0 is the first
  // one placed; a mirror copy is "mN"); without replicas, no REPLICA
  // column.
  bool replicated = false;
  for (const ShardInfo& s : meta.shards) replicated |= s.replicas.size() > 1;
  std::vector<std::vector<std::string>> rows = {
      {"SHARD", "BOX", "PLACEMENT", "WORKER", "BYTES", "AVAILABLE", "HANDLE"}};
  if (replicated) rows[0].insert(rows[0].begin() + 1, "REPLICA");
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardInfo& s = meta.shards[i];
    const std::string bytes = FormatBytes(
        s.box.NumElements() * static_cast<int64_t>(ItemSize(meta.dtype)));
    const Replicas shown = replicated ? s.replicas : Replicas{ShownReplica(s)};
    for (size_t k = 0; k < shown.size(); ++k) {
      const Replica& r = shown[k];
      rows.push_back({absl::StrCat(i), s.box.ToString(), r.PlacementString(),
                      r.worker, bytes, r.available ? "yes" : "no",
                      meta.HandleString(i)});
      if (replicated) {
        rows.back().insert(rows.back().begin() + 1,
                           r.mirror ? absl::StrCat("m", k) : absl::StrCat(k));
      }
    }
  }
  PrintTable(rows, out);
  return absl::OkStatus();
}

absl::Status RunList(const Invocation& inv, std::ostream& out) {
  if (inv.positional.size() > 1) {
    return UsageError(absl::StrCat("unexpected argument '", inv.positional[1],
                                   "' (usage: tessera ls [PREFIX])"));
  }
  const std::string prefix =
      inv.positional.empty() ? std::string() : inv.positional[0];
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  const bool all = inv.GetBool("all");
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorInfo> tensors, client->List(all));
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [&](const TensorInfo& t) {
                                 return !absl::StartsWith(t.name, prefix);
                               }),
                tensors.end());
  if (inv.GetBool("json")) {
    out << TensorListJson(tensors) << "\n";
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "SHAPE", "DTYPE", "VERSION", "SHARDS"}};
  if (all) rows[0].push_back("PENDING");
  const absl::Time now = absl::Now();
  for (const TensorInfo& t : tensors) {
    rows.push_back({t.name, ShapeToString(t.shape),
                    std::string(DTypeName(t.dtype)), absl::StrCat(t.version),
                    absl::StrCat(t.num_shards)});
    if (!all) continue;
    rows.back().push_back(
        t.pending.empty()
            ? "-"
            : absl::StrCat(t.pending,
                           t.pending == "update"
                               ? absl::StrCat(" to version ", t.pending_version)
                               : "",
                           t.pending_owner.empty()
                               ? ""
                               : absl::StrCat(" by ", t.pending_owner),
                           " since ",
                           absl::FormatDuration(absl::Trunc(
                               now - t.pending_since, absl::Seconds(1))),
                           " ago"));
  }
  PrintTable(rows, out);
  return absl::OkStatus();
}

absl::Status PrintReshard(const Invocation& inv, const std::string& name,
                          const ReshardStats& stats, std::ostream& out);

absl::Status RunReshard(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(const std::string name, TensorName(inv));
  LayoutSpec spec;
  if (!HasSpec(inv) && (inv.Has("replicas") || inv.Has("mirror"))) {
    // The same layout with another count or mirror group: each shard keeps
    // its first replica's placement.
    TESSERA_ASSIGN_OR_RETURN(const int32_t replicas, ReplicasFlag(inv));
    TESSERA_ASSIGN_OR_RETURN(const std::string mirror, MirrorFlag(inv));
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
    TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, client->Describe(name));
    std::vector<Box> boxes;
    std::vector<Placement> placements;
    for (const ShardInfo& shard : meta.shards) {
      boxes.push_back(shard.box);
      Placement first;
      first.worker = shard.replicas.front().worker;
      first.device = shard.replicas.front().device;
      placements.push_back(std::move(first));
    }
    spec = LayoutSpec::Enumerable(std::move(boxes), std::move(placements));
    spec.replicas = replicas;
    spec.mirror = mirror;
    TESSERA_ASSIGN_OR_RETURN(
        ReshardStats stats, ReshardWithProgress(inv, client.get(), name, spec));
    return PrintReshard(inv, name, stats, out);
  }
  TESSERA_ASSIGN_OR_RETURN(const SpecArgs spec_args, ParseSpec(inv));

  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  Shape shape;
  if (!spec_args.chunk) {
    TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, client->Describe(name));
    shape = meta.shape;
  }
  TESSERA_ASSIGN_OR_RETURN(spec, ResolveSpec(spec_args, shape));
  TESSERA_ASSIGN_OR_RETURN(ReshardStats stats,
                           ReshardWithProgress(inv, client.get(), name, spec));
  return PrintReshard(inv, name, stats, out);
}

absl::Status PrintReshard(const Invocation& inv, const std::string& name,
                          const ReshardStats& stats, std::ostream& out) {
  if (inv.GetBool("json")) {
    out << ReshardJson(stats) << "\n";
    return absl::OkStatus();
  }
  out << "resharded " << name << " to version " << stats.version << ": moved "
      << stats.pieces_moved << " piece" << (stats.pieces_moved == 1 ? "" : "s")
      << " (" << FormatBytes(stats.bytes_moved) << "), copied "
      << FormatBytes(stats.bytes_copied_locally) << " locally, kept "
      << stats.shards_kept << " shard" << (stats.shards_kept == 1 ? "" : "s")
      << ", " << absl::StrFormat("%.3f s", stats.seconds) << "\n";
  return absl::OkStatus();
}

absl::Status RunRemove(const Invocation& inv, std::ostream& out) {
  // Every name is checked before any tensor is deleted.
  for (const std::string& name : inv.positional) {
    if (absl::Status s = CheckTensorName(name); !s.ok()) return UsageError(s);
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  // As rm(1): each name is tried; the ones that failed are reported
  // together, in one line, and the exit code says so.
  std::vector<std::string> deleted;
  std::vector<std::string> failed;
  absl::Status first_error;
  for (const std::string& name : inv.positional) {
    absl::Status s = client->Delete(name);
    if (s.ok()) {
      deleted.push_back(name);
      continue;
    }
    if (first_error.ok()) first_error = s;
    failed.push_back(std::string(s.message()));
  }
  if (inv.GetBool("json")) {
    if (inv.positional.size() == 1) {
      if (!deleted.empty()) out << RemoveJson(deleted[0]) << "\n";
    } else {
      std::vector<std::string> objects;
      for (const std::string& name : deleted)
        objects.push_back(RemoveJson(name));
      out << "[" << absl::StrJoin(objects, ", ") << "]\n";
    }
  } else {
    for (const std::string& name : deleted) out << "deleted " << name << "\n";
  }
  if (failed.empty()) return absl::OkStatus();
  if (inv.positional.size() == 1) return first_error;
  return absl::Status(
      first_error.code(),
      absl::StrCat(failed.size(), " of ", inv.positional.size(),
                   " not deleted: ", absl::StrJoin(failed, "; ")));
}

absl::Status RunWorker(const Invocation& inv, std::ostream& out) {
  const std::string& action = inv.positional.at(0);
  const std::string& name = inv.positional.at(1);
  std::optional<WorkerState> state;
  if (action == "drain") state = WorkerState::kDraining;
  if (action == "cordon") state = WorkerState::kCordoned;
  if (action == "uncordon") state = WorkerState::kReady;
  if (!state.has_value() && action != "rm") {
    return UsageError(absl::StrCat("unknown worker action '", action, "'",
                                   DidYouMean(action, WorkerActions()), " (",
                                   absl::StrJoin(WorkerActions(), ", "), ")"));
  }
  if (absl::Status s = CheckWorkerName(name); !s.ok()) return UsageError(s);
  double timeout_s = 600;
  if (std::optional<std::string> t = inv.Get("timeout"); t.has_value()) {
    if (!absl::SimpleAtod(*t, &timeout_s) || !(timeout_s >= 0) ||
        timeout_s > 86400) {
      return UsageError(
          absl::StrCat("--timeout=", *t, ": expected seconds, 0 to 86400"));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  if (!state.has_value()) {
    TESSERA_RETURN_IF_ERROR(client->RemoveWorker(name));
    out << "forgot worker " << name << "\n";
    return absl::OkStatus();
  }
  if (*state == WorkerState::kDraining) {
    TESSERA_RETURN_IF_ERROR(
        client->DrainWorker(name, absl::Seconds(timeout_s)));
    out << "worker " << name << " is drained: it holds no shards\n";
    return absl::OkStatus();
  }
  TESSERA_RETURN_IF_ERROR(client->SetWorkerState(name, *state));
  out << "worker " << name << " is " << WorkerStateName(*state) << "\n";
  return absl::OkStatus();
}

absl::Status RunWait(const Invocation& inv, std::ostream& out) {
  TESSERA_ASSIGN_OR_RETURN(const std::string name, TensorName(inv));
  std::optional<uint64_t> version;
  if (std::optional<std::string> v = inv.Get("version"); v.has_value()) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(*v, &n) || n == 0) {
      return UsageError(
          absl::StrCat("--version=", *v, ": expected a version, 1 or more"));
    }
    version = n;
  }
  double timeout_s = 86400;
  if (std::optional<std::string> t = inv.Get("timeout"); t.has_value()) {
    if (!absl::SimpleAtod(*t, &timeout_s) || !(timeout_s > 0) ||
        timeout_s > 86400) {
      return UsageError(
          absl::StrCat("--timeout=", *t,
                       ": expected seconds, more than 0 and at most 86400"));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  TESSERA_ASSIGN_OR_RETURN(
      const uint64_t reached,
      client->WaitForVersion(name, version, absl::Seconds(timeout_s)));
  if (inv.GetBool("json")) {
    out << "{\"name\": \"" << JsonEscape(name) << "\", \"version\": " << reached
        << "}\n";
  } else {
    out << reached << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunImport(const Invocation& inv, std::ostream& out) {
  const std::string& file = inv.positional.at(0);
  if (file.empty()) return UsageError("import needs a file name (or -)");
  const std::string prefix = inv.Get("prefix").value_or("");
  TESSERA_ASSIGN_OR_RETURN(const SpecArgs spec_args, ParseSpec(inv));

  // The file is checked before the cluster is contacted, as put does.
  std::unique_ptr<SpooledInput> spool;
  TESSERA_ASSIGN_OR_RETURN(const std::string path,
                           InputPath(file, SafetensorsStreamBytes, &spool));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                           SafetensorsReader::Open(path));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  int64_t import_bytes = 0;
  for (const SafetensorsEntry& e : reader->entries())
    import_bytes += e.num_bytes();
  absl::StatusOr<SafetensorsImportResult> imported;
  {
    Progress progress(*client, absl::StrCat("import ", file), import_bytes,
                      !inv.GetBool("json"));
    imported = ImportSafetensors(
        *client, *reader,
        [&spec_args](const SafetensorsEntry& e) {
          return ResolveSpec(spec_args, e.shape);
        },
        prefix);
  }
  TESSERA_ASSIGN_OR_RETURN(SafetensorsImportResult result, std::move(imported));
  if (inv.GetBool("json")) {
    out << ImportJson(file, result, client->TransferStats().workers_sent)
        << "\n";
    return absl::OkStatus();
  }
  out << "imported " << result.tensors.size() << " tensor"
      << (result.tensors.size() == 1 ? "" : "s") << " from "
      << (IsStdio(file) ? std::string("stdin") : file) << ", "
      << FormatBytes(result.bytes) << ", "
      << FormatRate(result.bytes, result.seconds) << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "SHAPE", "DTYPE", "VERSION", "SHARDS"}};
  for (const TensorMetadata& t : result.tensors) {
    rows.push_back({t.name, ShapeToString(t.shape),
                    std::string(DTypeName(t.dtype)), absl::StrCat(t.version),
                    absl::StrCat(t.shards.size())});
  }
  PrintTable(rows, out);
  return absl::OkStatus();
}

absl::Status RunLoad(const Invocation& inv, std::ostream& out) {
  const std::string& dir = inv.positional.at(0);
  if (dir.empty()) return UsageError("load needs a directory");
  const std::string prefix = inv.Get("prefix").value_or("");
  TESSERA_ASSIGN_OR_RETURN(const SpecArgs spec_args, ParseSpec(inv));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  // Progress: the coordinator's count of the bytes the workers landed, asked
  // about one of the tensors once they are known.
  absl::Mutex mu;
  std::string watched;
  absl::StatusOr<Client::LoadStats> loaded;
  {
    Progress progress(
        absl::StrCat("load ", dir), !inv.GetBool("json"),
        [&]() -> std::optional<Progress::Sample> {
          std::string name;
          {
            absl::MutexLock lock(&mu);
            name = watched;
          }
          if (name.empty()) return std::nullopt;
          absl::StatusOr<MoveProgress> now = client->ReshardProgress(name);
          if (!now.ok() || !now->running) return std::nullopt;
          return Progress::Sample{now->bytes_done, now->bytes_total};
        });
    loaded = LoadCheckpoint(
        *client, dir,
        [&spec_args](const Shape& shape) {
          return ResolveSpec(spec_args, shape);
        },
        prefix,
        [&](const std::vector<Client::LoadEntry>& entries) {
          absl::MutexLock lock(&mu);
          if (!entries.empty()) watched = entries.front().tensor;
        });
  }
  TESSERA_ASSIGN_OR_RETURN(const Client::LoadStats stats, std::move(loaded));
  if (inv.GetBool("json")) {
    out << LoadJson(dir, stats, client->TransferStats().workers_sent) << "\n";
    return absl::OkStatus();
  }
  out << "loaded " << stats.tensors.size() << " tensor"
      << (stats.tensors.size() == 1 ? "" : "s") << " from " << dir << ", "
      << FormatBytes(stats.bytes) << " (read " << FormatBytes(stats.bytes_read)
      << "), " << FormatRate(stats.bytes, stats.seconds) << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "SHAPE", "DTYPE", "VERSION", "SHARDS"}};
  for (const TensorInfo& t : stats.tensors) {
    rows.push_back({t.name, ShapeToString(t.shape),
                    std::string(DTypeName(t.dtype)), absl::StrCat(t.version),
                    absl::StrCat(t.num_shards)});
  }
  PrintTable(rows, out);
  return absl::OkStatus();
}

// The tensors a command names after its first word: NAMEs or --prefix=P,
// one or the other (usage errors say which command and how).
struct NamedTensors {
  std::vector<std::string> names;
  std::optional<std::string> prefix;
};
absl::StatusOr<NamedTensors> TensorsNamed(const Invocation& inv,
                                          absl::string_view what,
                                          absl::string_view usage) {
  NamedTensors out;
  out.names.assign(inv.positional.begin() + 1, inv.positional.end());
  out.prefix = inv.Get("prefix");
  if (out.prefix.has_value() && !out.names.empty()) {
    return UsageError("give either tensor NAMEs or --prefix=P, not both");
  }
  if (!out.prefix.has_value() && out.names.empty()) {
    return UsageError(
        absl::StrCat("missing what to ", what,
                     ": give tensor NAMEs or --prefix=P (usage: ", usage, ")"));
  }
  for (const std::string& name : out.names) {
    if (absl::Status s = CheckTensorName(name); !s.ok()) return UsageError(s);
  }
  return out;
}

// A save or an export --hf into `dir`: `write` runs it while a progress
// line follows the coordinator's count of the bytes the workers wrote,
// asked about one of the tensors (the first named; for a prefix, none is
// known before the reply, so none is drawn); then its report.
absl::Status WriteDirectory(
    const Invocation& inv, const std::string& dir, const NamedTensors& named,
    absl::string_view verb, absl::string_view done, Client& client,
    const std::function<absl::StatusOr<Client::SaveStats>()>& write,
    std::ostream& out) {
  const std::string watched = named.names.empty() ? "" : named.names.front();
  absl::StatusOr<Client::SaveStats> written;
  {
    Progress progress(
        absl::StrCat(verb, " ", dir), !inv.GetBool("json"),
        [&]() -> std::optional<Progress::Sample> {
          if (watched.empty()) return std::nullopt;
          absl::StatusOr<MoveProgress> now = client.ReshardProgress(watched);
          if (!now.ok() || !now->running) return std::nullopt;
          return Progress::Sample{now->bytes_done, now->bytes_total};
        });
    written = write();
  }
  TESSERA_ASSIGN_OR_RETURN(const Client::SaveStats stats, std::move(written));
  if (inv.GetBool("json")) {
    out << SaveJson(dir, stats) << "\n";
    return absl::OkStatus();
  }
  out << done << " " << stats.tensors.size() << " tensor"
      << (stats.tensors.size() == 1 ? "" : "s") << " into " << dir << ", "
      << FormatBytes(stats.bytes) << " in " << stats.files << " file"
      << (stats.files == 1 ? "" : "s") << ", "
      << FormatRate(stats.bytes, stats.seconds) << "\n";
  return absl::OkStatus();
}

absl::Status RunSave(const Invocation& inv, std::ostream& out) {
  const std::string& dir = inv.positional.at(0);
  if (dir.empty()) return UsageError("save needs a directory");
  TESSERA_ASSIGN_OR_RETURN(
      const NamedTensors named,
      TensorsNamed(inv, "save", "tessera save DIR (NAME... | --prefix=P)"));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  return WriteDirectory(
      inv, dir, named, "save", "saved", *client,
      [&] {
        return client->SaveCheckpoint(dir, named.names,
                                      named.prefix.value_or(""),
                                      inv.GetBool("overwrite"));
      },
      out);
}

// export --hf DIR: the workers write a Hugging Face sharded directory.
absl::Status RunExportHf(const Invocation& inv, std::ostream& out) {
  const std::string& dir = inv.positional.at(0);
  if (dir.empty()) return UsageError("export --hf needs a directory");
  if (inv.Get("metadata").has_value()) {
    return UsageError("--metadata is for a one-file export, not --hf");
  }
  TESSERA_ASSIGN_OR_RETURN(
      const NamedTensors named,
      TensorsNamed(inv, "export",
                   "tessera export --hf DIR (NAME... | --prefix=P)"));
  Client::HfExport options;
  options.strip_prefix = inv.Get("strip_prefix").value_or("");
  options.overwrite = inv.GetBool("overwrite");
  if (const std::optional<std::string> size = inv.Get("max_shard_size")) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(*size);
    if (!bytes.ok()) {
      return UsageError(
          absl::StrCat("--max_shard_size: ", bytes.status().message()));
    }
    options.max_file_bytes = *bytes;
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  return WriteDirectory(
      inv, dir, named, "export", "exported", *client,
      [&] {
        return client->ExportHf(dir, named.names, named.prefix.value_or(""),
                                options);
      },
      out);
}

absl::Status RunExport(const Invocation& inv, std::ostream& out) {
  if (inv.GetBool("hf")) return RunExportHf(inv, out);
  for (const char* only_hf : {"strip_prefix", "max_shard_size", "overwrite"}) {
    if (inv.Get(only_hf).has_value()) {
      return UsageError(absl::StrCat("--", only_hf, " is for export --hf DIR"));
    }
  }
  const std::string& file = inv.positional.at(0);
  if (file.empty()) return UsageError("export needs a file name (or -)");
  TESSERA_ASSIGN_OR_RETURN(
      const NamedTensors named,
      TensorsNamed(inv, "export",
                   "tessera export FILE.safetensors (NAME... | --prefix=P)"));
  const std::vector<std::string>& names = named.names;
  const std::optional<std::string>& prefix = named.prefix;
  // --metadata=K=V,...: added to the file's "__metadata__" (a key the
  // tensors' own metadata has takes this value).
  SafetensorsMetadata metadata;
  if (const std::optional<std::string> pairs = inv.Get("metadata")) {
    absl::flat_hash_set<std::string> keys;
    for (absl::string_view pair : absl::StrSplit(*pairs, ',')) {
      const size_t eq = pair.find('=');
      if (eq == absl::string_view::npos || eq == 0) {
        return UsageError(absl::StrCat("--metadata: '", pair,
                                       "' is not KEY=VALUE (pairs are "
                                       "separated by commas)"));
      }
      std::string key(pair.substr(0, eq));
      if (key == kSafetensorsMetadataKey || !keys.insert(key).second) {
        return UsageError(absl::StrCat(
            "--metadata: key '", key, "' ",
            key == kSafetensorsMetadataKey ? "is reserved" : "is given twice"));
      }
      metadata.emplace_back(std::move(key), std::string(pair.substr(eq + 1)));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(const std::string path,
                           OutputPath(file, "safetensors", out));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(inv));
  absl::StatusOr<SafetensorsExportResult> exported;
  {
    // The total is known only once the selection is described: bytes and
    // rate, without a percentage.
    Progress progress(*client, absl::StrCat("export ", file), 0,
                      !inv.GetBool("json"));
    exported = ExportSafetensors(*client, path,
                                 prefix.has_value()
                                     ? SafetensorsSelection::Prefix(*prefix)
                                     : SafetensorsSelection::Names(names),
                                 metadata);
  }
  TESSERA_ASSIGN_OR_RETURN(SafetensorsExportResult result, std::move(exported));
  std::ostream& report = ReportTo(inv, file, out);
  if (inv.GetBool("json")) {
    report << ExportJson(file, result) << "\n";
    return absl::OkStatus();
  }
  report << "exported " << result.entries.size() << " tensor"
         << (result.entries.size() == 1 ? "" : "s") << " into "
         << (IsStdio(file) ? std::string("stdout") : file) << ", "
         << FormatBytes(result.file_bytes) << ", "
         << FormatRate(result.bytes, result.seconds) << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"ENTRY", "TENSOR", "SHAPE", "DTYPE"}};
  for (const SafetensorsExportedEntry& e : result.entries) {
    rows.push_back({e.entry, e.tensor, ShapeToString(e.shape),
                    std::string(DTypeName(e.dtype))});
  }
  PrintTable(rows, report);
  return absl::OkStatus();
}

absl::Status RunCompletion(const Invocation& inv, std::ostream& out) {
  const std::string& shell = inv.positional.at(0);
  if (shell != "bash" && shell != "zsh") {
    return UsageError(
        absl::StrCat("completion for '", shell, "': bash or zsh"));
  }
  std::vector<std::string> names;
  std::string cases;
  std::vector<std::string> globals;
  for (const FlagDef& f : GlobalFlags())
    globals.push_back(absl::StrCat("--", f.name, f.is_bool ? "" : "="));
  for (const CommandDef& c : Commands()) {
    names.push_back(c.name);
    std::vector<std::string> flags;
    for (const FlagDef& f : c.flags)
      flags.push_back(absl::StrCat("--", f.name, f.is_bool ? "" : "="));
    absl::StrAppend(&cases, "    ", c.name, ") flags=\"",
                    absl::StrJoin(flags, " "), "\" ;;\n");
  }
  // Generated from the command table, so it never lists a flag the CLI
  // refuses. Tensor names come from `tessera ls` (2 s at most), given the
  // global flags typed before the command.
  if (shell == "zsh") out << "autoload -U +X bashcompinit && bashcompinit\n";
  out << "_tessera() {\n"
         "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" cmd=\"\" i flags=\"\"\n"
         "  local globals=\""
      << absl::StrJoin(globals, " ")
      << "\"\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
         "    case \"${COMP_WORDS[i]}\" in -*) ;; *) cmd=\"${COMP_WORDS[i]}\"; "
         "break ;; esac\n"
         "  done\n"
         "  if [[ -z \"$cmd\" ]]; then\n"
         "    if [[ \"$cur\" == -* ]]; then\n"
         "      COMPREPLY=($(compgen -W \"$globals\" -- \"$cur\"))\n"
         "    else\n"
         "      COMPREPLY=($(compgen -W \""
      << absl::StrJoin(names, " ")
      << "\" -- \"$cur\"))\n"
         "    fi\n"
         "    return\n"
         "  fi\n"
         "  case \"$cmd\" in\n"
      << cases
      << "  esac\n"
         "  if [[ \"$cur\" == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"$flags $globals\" -- \"$cur\"))\n"
         "    [[ \"${COMPREPLY[0]}\" == *= ]] && compopt -o nospace "
         "2>/dev/null\n"
         "  elif [[ \"$cmd\" == completion ]]; then\n"
         "    COMPREPLY=($(compgen -W \"bash zsh\" -- \"$cur\"))\n"
         // worker ACTION NAME: the actions, then the workers `tessera
         // workers` lists (not tensors).
         "  elif [[ \"$cmd\" == worker ]]; then\n"
         "    local n=0 j\n"
         "    for ((j = i + 1; j < COMP_CWORD; j++)); do\n"
         "      [[ \"${COMP_WORDS[j]}\" == -* ]] || n=$((n + 1))\n"
         "    done\n"
         "    if ((n == 0)); then\n"
         "      COMPREPLY=($(compgen -W \""
      << absl::StrJoin(WorkerActions(), " ")
      << "\" -- \"$cur\"))\n"
         "    else\n"
         "      local workers\n"
         "      workers=$(timeout 2 \"${COMP_WORDS[0]}\" "
         "\"${COMP_WORDS[@]:1:i-1}\" workers 2>/dev/null | tail -n +2 | "
         "cut -d' ' -f1)\n"
         "      COMPREPLY=($(compgen -W \"$workers\" -- \"$cur\"))\n"
         "    fi\n"
         "  else\n"
         "    local tensors\n"
         "    tensors=$(timeout 2 \"${COMP_WORDS[0]}\" "
         "\"${COMP_WORDS[@]:1:i-1}\" "
         "ls 2>/dev/null | "
         "tail -n +2 | cut -d' ' -f1)\n"
         "    COMPREPLY=($(compgen -W \"$tensors\" -- \"$cur\") "
         "$(compgen -f -- \"$cur\"))\n"
         "  fi\n"
         "}\n"
         "complete -F _tessera tessera\n";
  return absl::OkStatus();
}

// ---- the command line
// ------------------------------------------------------------

namespace {

// The global options the environment gives, before any flag.
GlobalOptions GlobalsFromEnvironment(const char* env_coordinator) {
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  GlobalOptions global;
  global.tls_ca = env("TESSERA_TLS_CA");
  global.tls_cert = env("TESSERA_TLS_CERT");
  global.tls_key = env("TESSERA_TLS_KEY");
  global.token_file = env("TESSERA_TOKEN_FILE");
  if (const std::string t = env("TESSERA_TRANSPORT"); !t.empty()) {
    global.transport = t;
  }
  global.coordinator = env_coordinator != nullptr && *env_coordinator != '\0'
                           ? env_coordinator
                           : kDefaultCoordinator;
  return global;
}

// A global flag at args[*i] (its value may take the next argument); true
// if it was one. After a command with a --timeout of its own (worker
// drain), --timeout is the command's.
absl::StatusOr<bool> ParseGlobalFlag(const std::vector<std::string>& args,
                                     size_t* i, const CommandDef* command,
                                     GlobalOptions* global) {
  const std::string& arg = args[*i];
  const size_t eq = arg.find('=');
  const std::string name = arg.substr(0, eq);
  // The flag's value: after '=', else the next argument.
  auto value_of = [&](absl::string_view needs) -> absl::StatusOr<std::string> {
    if (eq != std::string::npos) return arg.substr(eq + 1);
    if (*i + 1 < args.size()) return args[++*i];
    return UsageError(absl::StrCat(name, " needs ", needs));
  };
  bool command_has_timeout = false;
  if (command != nullptr) {
    for (const FlagDef& f : command->flags)
      command_has_timeout |= std::string(f.name) == "timeout";
  }
  if (name == "--timeout" && !command_has_timeout) {
    TESSERA_ASSIGN_OR_RETURN(const std::string value,
                             value_of("a value (seconds)"));
    double seconds = 0;
    if (!absl::SimpleAtod(value, &seconds) || !(seconds > 0) || seconds > 1e6) {
      return UsageError(
          absl::StrCat("--timeout=", value, ": expected seconds, more than 0"));
    }
    global->timeout_s = seconds;
    return true;
  }
  if (name == "--coordinator") {
    TESSERA_ASSIGN_OR_RETURN(const std::string value,
                             value_of("a value (HOST:PORT)"));
    if (value.empty() || value.find(':') == std::string::npos) {
      return UsageError(
          absl::StrCat("--coordinator='", value, "' is not HOST:PORT"));
    }
    global->coordinator = value;
    return true;
  }
  // Security flags: a file each (flags win over the environment).
  for (auto [flag, field] :
       {std::pair<const char*, std::string*>{"--tls_ca", &global->tls_ca},
        {"--tls_cert", &global->tls_cert},
        {"--tls_key", &global->tls_key},
        {"--token_file", &global->token_file}}) {
    if (name != flag) continue;
    TESSERA_ASSIGN_OR_RETURN(*field, value_of("a file name"));
    return true;
  }
  if (name == "--transport") {
    TESSERA_ASSIGN_OR_RETURN(global->transport,
                             value_of("a value (auto, shm, ucx, grpc)"));
    return true;
  }
  if (name == "--verbose") {
    if (eq == std::string::npos) {
      global->verbose = true;
    } else {
      TESSERA_ASSIGN_OR_RETURN(global->verbose,
                               ParseBool("verbose", arg.substr(eq + 1)));
    }
    return true;
  }
  return false;
}

// A flag of `command` at args[*i] (its value may take the next argument).
absl::Status ParseCommandFlag(const std::vector<std::string>& args, size_t* i,
                              const CommandDef& command, Invocation* inv) {
  const std::string& arg = args[*i];
  const size_t eq = arg.find('=');
  const std::string flag = arg.substr(0, eq);
  const FlagDef* def = nullptr;
  if (absl::StartsWith(flag, "--")) {
    for (const FlagDef& f : command.flags) {
      if (flag.substr(2) == f.name) def = &f;
    }
  }
  if (def == nullptr) {
    std::vector<std::string> known;
    for (const FlagDef& f : command.flags)
      known.push_back(absl::StrCat("--", f.name));
    return UsageError(absl::StrCat("unknown flag '", flag, "' for '",
                                   command.name, "'", DidYouMean(flag, known),
                                   " (its flags: ", FlagList(command), ")"));
  }
  const std::string name = def->name;
  std::string value;
  if (def->is_bool) {
    if (eq == std::string::npos) {
      value = "true";
    } else {
      TESSERA_ASSIGN_OR_RETURN(const bool b,
                               ParseBool(name, arg.substr(eq + 1)));
      value = b ? "true" : "false";
    }
  } else if (eq != std::string::npos) {
    value = arg.substr(eq + 1);
  } else if (*i + 1 < args.size()) {
    value = args[++*i];
  } else {
    return UsageError(absl::StrCat("flag --", name, " needs a value"));
  }
  inv->flags[name] = value;
  return absl::OkStatus();
}

// What a parsed command line must still hold: its positional arguments, a
// known transport.
absl::Status CheckInvocation(const CommandDef& command, const Invocation& inv) {
  const size_t want = static_cast<size_t>(command.num_positional);
  if (inv.positional.size() < want) {
    return UsageError(absl::StrCat("missing ", command.positional_name,
                                   " (usage: tessera ", command.synopsis, ")"));
  }
  if (inv.positional.size() > want && !command.more_positional) {
    return UsageError(absl::StrCat("unexpected argument '",
                                   inv.positional[want], "' (usage: tessera ",
                                   command.synopsis, ")"));
  }
  const std::string& transport = inv.global.transport;
  if (!CheckTransportName(transport).ok()) {
    return UsageError(absl::StrCat(
        "--transport='", transport,
        "' is not a transport (auto, shm, ucx, tcp or grpc; the default comes "
        "from $TESSERA_TRANSPORT)"));
  }
  return absl::OkStatus();
}

// Parses argv into an Invocation. Returns nullopt after printing help.
absl::StatusOr<std::optional<Invocation>> ParseCommandLine(
    const std::vector<std::string>& args, const char* env_coordinator,
    std::ostream& out) {
  Invocation inv;
  inv.global = GlobalsFromEnvironment(env_coordinator);
  size_t i = 0;
  for (; i < args.size() && absl::StartsWith(args[i], "-"); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      out << MainUsage();
      return std::optional<Invocation>();
    }
    if (args[i] == "--version") {
      out << VersionLine("tessera") << "\n";
      return std::optional<Invocation>();
    }
    TESSERA_ASSIGN_OR_RETURN(const bool known,
                             ParseGlobalFlag(args, &i, nullptr, &inv.global));
    if (!known) {
      const std::string flag = args[i].substr(0, args[i].find('='));
      std::vector<std::string> globals;
      for (const FlagDef& f : GlobalFlags())
        globals.push_back(absl::StrCat("--", f.name));
      return UsageError(absl::StrCat(
          "unknown flag '", args[i], "'", DidYouMean(flag, globals),
          " (global flags, before COMMAND: ", absl::StrJoin(globals, ", "),
          ")"));
    }
  }
  if (i == args.size()) {
    return UsageError(absl::StrCat("no command given (commands: ",
                                   CommandNames(), "; see tessera --help)"));
  }
  inv.command = args[i++];
  if (inv.command == "help") {
    const CommandDef* c = i < args.size() ? FindCommand(args[i]) : nullptr;
    out << (c != nullptr ? CommandUsage(*c) : MainUsage());
    return std::optional<Invocation>();
  }
  const CommandDef* command = FindCommand(inv.command);
  if (command == nullptr) {
    std::vector<std::string> names;
    for (const CommandDef& c : Commands()) names.push_back(c.name);
    return UsageError(absl::StrCat("unknown command '", inv.command, "'",
                                   DidYouMean(inv.command, names),
                                   " (commands: ", CommandNames(), ")"));
  }
  bool only_positional = false;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-') {
      inv.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      out << CommandUsage(*command);
      return std::optional<Invocation>();
    }
    // Global flags are also accepted after COMMAND.
    TESSERA_ASSIGN_OR_RETURN(const bool global,
                             ParseGlobalFlag(args, &i, command, &inv.global));
    if (global) continue;
    TESSERA_RETURN_IF_ERROR(ParseCommandFlag(args, &i, *command, &inv));
  }
  TESSERA_RETURN_IF_ERROR(CheckInvocation(*command, inv));
  return std::optional<Invocation>(std::move(inv));
}

// The message on one line.
std::string OneLine(absl::string_view message) {
  std::string text = absl::StrReplaceAll(message, {{"\r\n", " "}, {"\n", " "}});
  return text;
}

// A tensor not found by a command that names one: the nearest name the
// cluster lists, if any is a likely meaning ("get emd" -> emb).
absl::Status SuggestTensor(const CommandDef& command, const Invocation& inv,
                           const absl::Status& status) {
  const absl::string_view name = command.name;
  if ((name != "get" && name != "describe" && name != "reshard" &&
       name != "rm") ||
      inv.positional.empty()) {
    return status;
  }
  const std::string& typed = inv.positional[0];
  if (!absl::StrContains(status.message(), typed)) return status;
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(inv);
  if (!client.ok()) return status;
  absl::StatusOr<std::vector<TensorInfo>> tensors = (*client)->List(false);
  if (!tensors.ok()) return status;
  std::vector<std::string> names;
  for (const TensorInfo& t : *tensors) names.push_back(t.name);
  const std::string hint = DidYouMean(typed, names);
  if (hint.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), hint));
}

}  // namespace

int RunCli(const std::vector<std::string>& args, const char* env_coordinator,
           std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::optional<Invocation>> parsed =
      ParseCommandLine(args, env_coordinator, out);
  absl::Status status;
  bool verbose = false;
  std::string context;
  if (!parsed.ok()) {
    status = UsageError(parsed.status());
    // --verbose may have been given before the error.
    for (const std::string& a : args) verbose |= a == "--verbose";
  } else if (!parsed->has_value()) {
    return kExitOk;  // help was printed
  } else {
    Invocation inv = **std::move(parsed);
    inv.err = &err;
    verbose = inv.global.verbose;
    context = absl::StrCat("command '", inv.command, "', coordinator ",
                           inv.global.coordinator);
    absl::Time deadline = absl::InfiniteFuture();
    if (inv.global.timeout_s > 0) {
      deadline = absl::Now() + absl::Seconds(inv.global.timeout_s);
      SetProcessDeadline(deadline);
    }
    const CommandDef& command = *FindCommand(inv.command);
    status = command.run(inv, out);
    if (absl::IsNotFound(status)) status = SuggestTensor(command, inv, status);
    if (!status.ok() && absl::Now() >= deadline) {
      status = absl::DeadlineExceededError(
          absl::StrCat("timed out after ", inv.global.timeout_s,
                       " s (--timeout): ", status.message()));
    }
  }
  out.flush();
  if (status.ok()) return kExitOk;
  const bool usage = IsUsageError(status);
  err << "error: " << OneLine(status.message()) << "\n";
  if (verbose) {
    err << "  status: " << absl::StatusCodeToString(status.code())
        << (usage ? " (usage error)" : "");
    if (!context.empty()) err << "; " << context;
    err << "\n";
    if (usage) err << MainUsage();
  }
  err.flush();
  return usage ? kExitUsage : kExitError;
}

}  // namespace cli
}  // namespace tessera
