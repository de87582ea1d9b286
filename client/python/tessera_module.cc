// _tessera: the pybind11 extension behind the `tessera` Python package. A thin
// translator over the C++ SDK (client/tessera_client.h): Python values in,
// core types through the SDK, numpy arrays and plain dicts out. The public
// API, its docstrings and the exception classes live in tessera/__init__.py.
//
// Contracts:
//  * Every network wait runs with the GIL released, so Python threads that
//    share one client fetch in parallel (the C++ Client is thread-safe).
//  * Fetched bytes land in the numpy array's own buffer: get() allocates the
//    array (or validates the caller's `out`) and Client::GetInto writes into
//    it; to_here()/get_shard() hand the SDK's buffer to numpy without a copy.
//  * put() reads straight from the (C-contiguous) numpy buffer.
//  * A failed absl::Status becomes the Python exception registered for its
//    code (see _set_error_classes), carrying the C++ message unchanged.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/safetensors_io.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/labels.h"
#include "core/layout_spec.h"
#include "core/parse.h"
#include "core/placement.h"
#include "core/replica_placement.h"
#include "core/status_macros.h"
#include "core/tensor_metadata.h"
#include "ops/version.h"
#include "rpc/channel.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace py = pybind11;

namespace tessera {
namespace python {
namespace {

// A failed status on its way to Python; translated by the registered
// exception translator (the GIL is held again by then).
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "tessera status error"; }
  absl::Status status;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}

// Runs `fn` (which must not touch Python objects) with the GIL released.
template <typename Fn>
auto WithoutGil(Fn&& fn) -> decltype(fn()) {
  py::gil_scoped_release release;
  return fn();
}

// Status code (int) -> Python exception class; filled by _set_error_classes.
// Leaked on purpose: it must outlive every translation, including at exit.
py::dict* error_classes = nullptr;

void TranslateStatusError(const StatusError& e) {
  const std::string message(e.status.message());
  PyObject* cls = PyExc_RuntimeError;
  if (error_classes != nullptr) {
    py::int_ key(static_cast<int>(e.status.code()));
    if (error_classes->contains(key)) cls = (*error_classes)[key].ptr();
  }
  PyErr_SetString(cls, message.c_str());
}

// numpy's name for the array dtype holding `dtype` (bfloat16 and float8,
// which numpy lacks, travel as their raw 16- and 8-bit words).
const char* NumpyName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "uint16";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kUInt16:
      return "uint16";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return "uint8";
  }
  return "uint8";
}

py::dtype NumpyDType(DType dtype) { return py::dtype(NumpyName(dtype)); }

std::vector<py::ssize_t> ToPyShape(const std::vector<int64_t>& v) {
  return std::vector<py::ssize_t>(v.begin(), v.end());
}

std::string Str(py::handle h) { return py::str(h).cast<std::string>(); }

py::tuple ToTuple(absl::Span<const int64_t> v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
  return t;
}

// A row of list(), import_safetensors() or load(): the fields of the
// Python TensorInfo.
py::dict InfoDict(const TensorInfo& t) {
  py::dict d;
  d["name"] = t.name;
  d["shape"] = ToTuple(t.shape);
  d["dtype"] = std::string(DTypeName(t.dtype));
  d["version"] = t.version;
  d["num_shards"] = t.num_shards;
  d["replicas"] = t.replicas;
  d["mirror"] =
      t.mirror.empty() ? py::object(py::none()) : py::object(py::str(t.mirror));
  return d;
}

// A HostArray handed to numpy without copying: the capsule owns the buffer.
py::array ToNumpy(HostArray array) {
  auto* owner = new HostArray(std::move(array));
  py::capsule capsule(owner,
                      [](void* p) { delete static_cast<HostArray*>(p); });
  return py::array(NumpyDType(owner->dtype), ToPyShape(owner->shape),
                   owner->data(), capsule);
}

std::optional<int64_t> OptionalInt(py::handle h) {
  if (h.is_none()) return std::nullopt;
  return h.cast<int64_t>();
}

// Ranges given as "0:5,:" or as a sequence of (start|None, stop|None).
std::vector<DimRange> ToRanges(py::handle obj) {
  if (py::isinstance<py::str>(obj))
    return Unwrap(ParseRanges(obj.cast<std::string>()));
  std::vector<DimRange> ranges;
  for (py::handle item : obj) {
    py::sequence pair = py::reinterpret_borrow<py::sequence>(item);
    if (pair.size() != 2) {
      throw StatusError(
          absl::InvalidArgumentError("a box dim must be a (start, stop) pair, "
                                     "a slice, or text like '0:5'"));
    }
    ranges.push_back(DimRange{OptionalInt(pair[0]), OptionalInt(pair[1])});
  }
  return ranges;
}

std::vector<Placement> ToPlacements(py::handle obj) {
  if (py::isinstance<py::str>(obj))
    return Unwrap(ParsePlacementList(obj.cast<std::string>()));
  std::vector<Placement> placements;
  for (py::handle item : obj)
    placements.push_back(Unwrap(ParsePlacement(item.cast<std::string>())));
  return placements;
}

// A sharding as the Python layer hands it over, resolved later against a
// shape: ("chunk", dim, placements, R, M), ("shards", [(ranges, placement),
// ...], R, M) or ("text", "BOX@P;BOX@P", R, M); R: replicas per shard (0:
// the default); M: the mirror group's selector ("none" drops it; "": the
// default).
struct SpecArgs {
  int32_t replicas = 0;
  std::string mirror;
  bool chunk = true;
  int64_t chunk_dim = 0;
  std::vector<Placement> placements;
  std::vector<std::vector<DimRange>> ranges;  // enumerable only
};

SpecArgs ToSpecArgs(py::handle obj) {
  py::tuple t = obj.cast<py::tuple>();
  const std::string kind = t[0].cast<std::string>();
  SpecArgs spec;
  spec.replicas = t[t.size() - 2].cast<int32_t>();
  if (spec.replicas != 0) Check(CheckReplicaCount(spec.replicas));
  spec.mirror = t[t.size() - 1].cast<std::string>();
  if (!spec.mirror.empty() && spec.mirror != "none") {
    absl::StatusOr<LabelSelector> selector = ParseLabelSelector(spec.mirror);
    if (!selector.ok()) Check(Annotate(selector.status(), "mirror"));
    spec.mirror = selector->ToString();
  }
  if (kind == "chunk") {
    spec.chunk_dim = t[1].cast<int64_t>();
    spec.placements = ToPlacements(t[2]);
  } else if (kind == "shards") {
    spec.chunk = false;
    for (py::handle item : t[1]) {
      py::tuple shard = item.cast<py::tuple>();
      spec.ranges.push_back(ToRanges(shard[0]));
      spec.placements.push_back(
          Unwrap(ParsePlacement(shard[1].cast<std::string>())));
    }
  } else if (kind == "text") {
    spec.chunk = false;
    for (ShardText& shard : Unwrap(ParseShardList(t[1].cast<std::string>()))) {
      spec.ranges.push_back(std::move(shard.ranges));
      spec.placements.push_back(std::move(shard.placement));
    }
  } else {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("unknown sharding kind ", kind)));
  }
  return spec;
}

absl::StatusOr<LayoutSpec> ResolveSpec(const SpecArgs& spec,
                                       const Shape& shape) {
  if (spec.chunk) {
    LayoutSpec layout = LayoutSpec::Chunk(spec.chunk_dim, spec.placements);
    layout.replicas = spec.replicas;
    layout.mirror = spec.mirror;
    return layout;
  }
  std::vector<Box> boxes;
  for (const std::vector<DimRange>& ranges : spec.ranges) {
    absl::StatusOr<Box> box = ResolveBox(ranges, shape);
    if (!box.ok()) return box.status();
    boxes.push_back(*std::move(box));
  }
  LayoutSpec layout = LayoutSpec::Enumerable(std::move(boxes), spec.placements);
  layout.replicas = spec.replicas;
  layout.mirror = spec.mirror;
  return layout;
}

// One dim of a numpy-style key, as tessera/__init__.py encodes it:
// (start, stop, is_index) or None for an Ellipsis.
struct KeyItem {
  bool ellipsis = false;
  DimRange range;
  bool is_index = false;
};

// The region of a get() key: ranges to resolve, and the dims to drop from
// the result (integer indices, as numpy drops them).
struct RegionKey {
  std::optional<std::string> text;
  std::vector<KeyItem> items;
  bool whole = true;
};

RegionKey ToRegionKey(py::handle obj) {
  RegionKey key;
  if (obj.is_none()) return key;
  key.whole = false;
  if (py::isinstance<py::str>(obj)) {
    key.text = obj.cast<std::string>();
    return key;
  }
  for (py::handle item : obj) {
    KeyItem k;
    if (item.is_none()) {
      k.ellipsis = true;
    } else {
      py::tuple t = item.cast<py::tuple>();
      k.range = DimRange{OptionalInt(t[0]), OptionalInt(t[1])};
      k.is_index = t[2].cast<bool>();
    }
    key.items.push_back(std::move(k));
  }
  return key;
}

// Resolves `key` against `shape`: the box to fetch and the result's shape.
absl::Status ResolveKey(const RegionKey& key, const Shape& shape, Box* box,
                        std::vector<int64_t>* result_shape) {
  if (key.whole) {
    *box = WholeBox(shape);
    *result_shape = shape;
    return absl::OkStatus();
  }
  std::vector<DimRange> ranges;
  std::vector<bool> drop;
  if (key.text.has_value()) {
    absl::StatusOr<std::vector<DimRange>> parsed = ParseRanges(*key.text);
    if (!parsed.ok()) return parsed.status();
    ranges = *std::move(parsed);
    drop.assign(ranges.size(), false);
  } else {
    int64_t explicit_dims = 0;
    int ellipses = 0;
    for (const KeyItem& k : key.items) {
      if (k.ellipsis) {
        ++ellipses;
      } else {
        ++explicit_dims;
      }
    }
    if (ellipses > 1) {
      return absl::InvalidArgumentError(
          "region: an index can only have a single ellipsis ('...')");
    }
    for (const KeyItem& k : key.items) {
      if (k.ellipsis) {
        const int64_t fill = static_cast<int64_t>(shape.size()) - explicit_dims;
        for (int64_t i = 0; i < fill; ++i) {
          ranges.push_back(DimRange{});
          drop.push_back(false);
        }
        continue;
      }
      ranges.push_back(k.range);
      drop.push_back(k.is_index);
    }
  }
  absl::StatusOr<Box> resolved = ResolveRegion(ranges, shape);
  if (!resolved.ok()) return resolved.status();
  *box = *std::move(resolved);
  result_shape->clear();
  for (size_t d = 0; d < box->sizes.size(); ++d) {
    if (d < drop.size() && drop[d]) continue;
    result_shape->push_back(box->sizes[d]);
  }
  return absl::OkStatus();
}

py::dict ShardDict(const TensorMetadata& meta, size_t i,
                   const ShardHandle* handle) {
  const ShardInfo& s = meta.shards[i];
  const Replica& shown = ShownReplica(s);
  py::dict d;
  d["index"] = i;
  d["offsets"] = ToTuple(s.box.offsets);
  d["sizes"] = ToTuple(s.box.sizes);
  d["rank"] = shown.rank;
  d["device"] = shown.device.ToString();
  d["worker"] = shown.worker;
  d["address"] = shown.address;
  d["shard_id"] = shown.shard_id;
  d["available"] = shown.available;
  d["placement"] = shown.PlacementString();
  d["handle_string"] = meta.HandleString(i);
  if (handle != nullptr) {
    d["handle"] = py::cast(*handle);
  } else {
    d["handle"] = py::none();
  }
  return d;
}

py::dict MetaDict(const TensorMetadata& meta,
                  const std::vector<ShardHandle>* handles) {
  py::dict d;
  d["name"] = meta.name;
  d["shape"] = ToTuple(meta.shape);
  d["dtype"] = std::string(DTypeName(meta.dtype));
  d["version"] = meta.version;
  d["requires_grad"] = meta.requires_grad;
  d["pin_memory"] = meta.pin_memory;
  d["nbytes"] = meta.ByteSize();
  d["owner"] = meta.owner.empty() ? py::object(py::none())
                                  : py::object(py::str(meta.owner));
  d["mirror"] = meta.mirror.empty() ? py::object(py::none())
                                    : py::object(py::str(meta.mirror));
  py::list shards;
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardHandle* h =
        handles != nullptr && i < handles->size() ? &(*handles)[i] : nullptr;
    shards.append(ShardDict(meta, i, h));
  }
  d["shards"] = shards;
  return d;
}

// Handles that belong to exactly `meta`'s version, or none.
std::vector<ShardHandle> MatchingHandles(Client& client,
                                         const TensorMetadata& meta) {
  absl::StatusOr<std::vector<ShardHandle>> handles = client.Handles(meta.name);
  if (!handles.ok() || handles->size() != meta.shards.size() ||
      (!handles->empty() && (*handles)[0].version() != meta.version)) {
    return {};
  }
  return *std::move(handles);
}

// The Python-facing client: shares one thread-safe C++ Client.
// Reads `key` (numpy basic indexing) of tensor `name` into a new array of
// the result's shape (integer indices drop their dims, as NumPy's do). The
// key resolves on the metadata the read uses (cached): one call to the
// workers, no describe first. Touches no Python object.
absl::StatusOr<HostArray> GetByKey(Client& client, const std::string& name,
                                   const RegionKey& key) {
  std::vector<int64_t> result_shape;
  absl::StatusOr<HostArray> array = client.GetResolved(
      name, [&](const TensorMetadata& meta) -> absl::StatusOr<Box> {
        Box box;
        result_shape.clear();
        TESSERA_RETURN_IF_ERROR(
            ResolveKey(key, meta.shape, &box, &result_shape));
        return box;
      });
  if (array.ok()) array->shape.assign(result_shape.begin(), result_shape.end());
  return array;
}

class PyClient {
 public:
  explicit PyClient(std::shared_ptr<Client> client)
      : client_(std::move(client)) {}

  static PyClient Connect(const std::string& address, double rpc_timeout_s,
                          double connect_timeout_s, double data_timeout_s,
                          int max_parallel_streams, const std::string& tls_ca,
                          const std::string& tls_cert,
                          const std::string& tls_key,
                          const std::string& token_file,
                          const std::string& transport) {
    ClientOptions options;
    options.transport = transport;
    options.rpc_timeout = absl::Seconds(rpc_timeout_s);
    options.connect_timeout = absl::Seconds(connect_timeout_s);
    options.data_timeout = absl::Seconds(data_timeout_s);
    options.max_parallel_streams = max_parallel_streams;
    options.tls_ca = tls_ca;
    options.tls_cert = tls_cert;
    options.tls_key = tls_key;
    if (!token_file.empty()) options.token = Unwrap(ReadTokenFile(token_file));
    absl::StatusOr<std::unique_ptr<Client>> client =
        WithoutGil([&] { return Client::Connect(address, options); });
    return PyClient(std::shared_ptr<Client>(Unwrap(std::move(client))));
  }

  std::string address() const { return client_->coordinator_address(); }
  const std::shared_ptr<Client>& shared() const { return client_; }

  // Bytes moved so far (landed in reads, taken by writes), counted as they
  // move: what progress bars show.
  int64_t Moved() const {
    const DataPlaneStats stats = client_->TransferStats();
    return stats.landed + stats.sent;
  }

  // What this client's data plane moved, by transport (`get --json`'s
  // "transport" and "fallbacks"), the bytes read by serving worker (its
  // "replicas"), the bytes landed and sent, and what each worker sent to
  // others for this client's writes and reshards (the writes' "sent").
  py::dict TransferStats() const {
    const DataPlaneStats stats = client_->TransferStats();
    py::dict bytes, fallbacks, served, out;
    for (const auto& [worker, n] : stats.served) {
      if (n > 0) served[py::str(worker)] = n;
    }
    for (const auto& [name, n] : stats.bytes) {
      if (n > 0) bytes[py::str(name)] = n;
    }
    for (const auto& [name, n] : stats.fallbacks) {
      if (n > 0) fallbacks[py::str(name)] = n;
    }
    out["bytes"] = bytes;
    out["fallbacks"] = fallbacks;
    out["served"] = served;
    out["landed"] = stats.landed;
    out["sent"] = stats.sent;
    out["workers_sent"] = stats.workers_sent;
    return out;
  }

  py::list Workers() {
    std::vector<WorkerInfo> workers =
        Unwrap(WithoutGil([&] { return client_->Workers(); }));
    py::list out;
    for (const WorkerInfo& w : workers) {
      py::dict d;
      d["name"] = w.name;
      d["rank"] = w.rank;
      d["address"] = w.address;
      d["device"] = w.device.ToString();
      d["alive"] = w.alive;
      d["bytes_used"] = w.bytes_used;
      d["capacity_bytes"] = w.capacity_bytes;
      d["quarantined_shards"] = w.quarantined_shards;
      d["quarantined_bytes"] = w.quarantined_bytes;
      d["device_total_bytes"] = w.device_total_bytes;
      d["device_free_bytes"] = w.device_free_bytes;
      d["zone"] = w.zone;
      d["state"] = std::string(WorkerStateName(w.state));
      d["data_address"] = w.data_address;
      py::dict labels;
      for (const auto& [key, value] : w.labels) labels[py::str(key)] = value;
      d["labels"] = labels;
      out.append(d);
    }
    return out;
  }

  // The coordinators: which leads, which stand by (CLI `coordinators`).
  py::list Coordinators() {
    std::vector<CoordinatorStatus> list =
        Unwrap(WithoutGil([&] { return client_->Coordinators(); }));
    py::list out;
    for (const CoordinatorStatus& c : list) {
      py::dict d;
      d["address"] = c.address;
      d["role"] = c.role;
      d["alive"] = c.alive;
      out.append(d);
    }
    return out;
  }

  // What principals hold against their quotas (CLI `quota --json`).
  py::list Quotas() {
    std::vector<QuotaInfo> quotas =
        Unwrap(WithoutGil([&] { return client_->Quotas(); }));
    py::list out;
    auto limit = [](int64_t value) {
      return value < 0 ? py::object(py::none()) : py::object(py::int_(value));
    };
    for (const QuotaInfo& q : quotas) {
      py::dict d;
      d["principal"] = q.principal;
      d["bytes"] = q.bytes;
      d["bytes_limit"] = limit(q.bytes_limit);
      d["names"] = q.names;
      d["names_limit"] = limit(q.names_limit);
      out.append(d);
    }
    return out;
  }

  py::list List() {
    std::vector<TensorInfo> tensors =
        Unwrap(WithoutGil([&] { return client_->List(); }));
    py::list out;
    for (const TensorInfo& t : tensors) out.append(InfoDict(t));
    return out;
  }

  py::dict Describe(const std::string& name) {
    TensorMetadata meta;
    std::vector<ShardHandle> handles;
    absl::Status status = WithoutGil([&]() -> absl::Status {
      // Describe and Handles are two calls; retry if a reshard slipped between.
      for (int attempt = 0; attempt < 5; ++attempt) {
        absl::StatusOr<TensorMetadata> m = client_->Describe(name);
        if (!m.ok()) return m.status();
        meta = *std::move(m);
        handles = MatchingHandles(*client_, meta);
        if (!handles.empty() || meta.shards.empty()) return absl::OkStatus();
      }
      return absl::AbortedError(absl::StrCat(
          "tensor '", name, "' kept changing while it was described; retry"));
    });
    Check(status);
    return MetaDict(meta, &handles);
  }

  void Delete(const std::string& name) {
    Check(WithoutGil([&] { return client_->Delete(name); }));
  }

  // Client::WaitForVersion; no timeout: the longest a wait may last (24 h).
  uint64_t Wait(const std::string& name, std::optional<uint64_t> version,
                std::optional<double> timeout_s) {
    const absl::Duration timeout =
        timeout_s.has_value() ? absl::Seconds(*timeout_s) : absl::Hours(24);
    return Unwrap(WithoutGil(
        [&] { return client_->WaitForVersion(name, version, timeout); }));
  }

  void SetWorkerState(const std::string& worker, const std::string& state) {
    const std::optional<WorkerState> parsed = ParseWorkerState(state);
    if (!parsed.has_value() || *parsed == WorkerState::kDead) {
      Check(absl::InvalidArgumentError(
          "a worker's state can be set to ready, cordoned or draining"));
    }
    Check(WithoutGil([&] { return client_->SetWorkerState(worker, *parsed); }));
  }

  void DrainWorker(const std::string& worker, double timeout_s) {
    if (!(timeout_s >= 0 && timeout_s <= 86400)) {
      Check(absl::InvalidArgumentError(
          "drain timeout: expected seconds, 0 to 86400"));
    }
    Check(WithoutGil([&] {
      return client_->DrainWorker(worker, absl::Seconds(timeout_s));
    }));
  }

  void RemoveWorker(const std::string& worker) {
    Check(WithoutGil([&] { return client_->RemoveWorker(worker); }));
  }

  py::dict Create(const std::string& name, const std::vector<int64_t>& shape,
                  const std::string& dtype_name, py::handle spec_obj,
                  const std::string& init_text) {
    const DType dtype = Unwrap(ParseDType(dtype_name));
    const InitSpec init = Unwrap(ParseInit(init_text));
    Check(CheckInitValue(init, dtype));
    const SpecArgs args = ToSpecArgs(spec_obj);
    const LayoutSpec spec = Unwrap(ResolveSpec(args, shape));
    TensorMetadata meta;
    std::vector<ShardHandle> handles;
    Check(WithoutGil([&]() -> absl::Status {
      absl::StatusOr<TensorMetadata> m =
          client_->Create(name, shape, dtype, spec, init);
      if (!m.ok()) return m.status();
      meta = *std::move(m);
      handles = MatchingHandles(*client_, meta);
      return absl::OkStatus();
    }));
    return MetaDict(meta, &handles);
  }

  py::dict Put(const std::string& name, py::array array,
               const std::string& dtype_name, py::handle spec_obj) {
    const DType dtype = Unwrap(ParseDType(dtype_name));
    if (!(array.flags() & py::array::c_style)) {
      throw StatusError(
          absl::InvalidArgumentError("put: the array must be C-contiguous"));
    }
    if (static_cast<size_t>(array.itemsize()) != ItemSize(dtype)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "put: dtype ", DTypeName(dtype), " has ", ItemSize(dtype),
          "-byte items but the array has ", array.itemsize(), "-byte items")));
    }
    Shape shape(array.shape(), array.shape() + array.ndim());
    if (shape.empty()) {
      throw StatusError(
          absl::InvalidArgumentError("put: a tensor needs at least one dim "
                                     "(got a 0-d array; reshape it to (1,))"));
    }
    const SpecArgs args = ToSpecArgs(spec_obj);
    const LayoutSpec spec = Unwrap(ResolveSpec(args, shape));
    const char* data = static_cast<const char*>(array.data());
    TensorMetadata meta;
    std::vector<ShardHandle> handles;
    // `array` stays referenced by this frame while the GIL is released.
    Check(WithoutGil([&]() -> absl::Status {
      absl::StatusOr<TensorMetadata> m =
          client_->Put(name, shape, dtype, data, spec);
      if (!m.ok()) return m.status();
      meta = *std::move(m);
      handles = MatchingHandles(*client_, meta);
      return absl::OkStatus();
    }));
    return MetaDict(meta, &handles);
  }

  // (array, the version whose bytes it holds).
  py::tuple Get(const std::string& name, py::handle region, py::object out) {
    const RegionKey key = ToRegionKey(region);
    if (out.is_none()) {
      HostArray array =
          Unwrap(WithoutGil([&] { return GetByKey(*client_, name, key); }));
      const uint64_t version = array.version;
      return py::make_tuple(ToNumpy(std::move(array)), version);
    }
    const TensorMetadata meta =
        Unwrap(WithoutGil([&] { return client_->Describe(name); }));
    Box box;
    std::vector<int64_t> result_shape;
    Check(ResolveKey(key, meta.shape, &box, &result_shape));
    const py::dtype dtype = NumpyDType(meta.dtype);
    py::array array;
    if (out.is_none()) {
      array = py::array(dtype, ToPyShape(result_shape));
    } else {
      array = ValidateOut(out, dtype, result_shape, meta, box);
    }
    char* data = static_cast<char*>(array.mutable_data());
    const int64_t nbytes = static_cast<int64_t>(array.nbytes());
    std::optional<Box> fetch;
    if (!key.whole) fetch = box;
    uint64_t version = 0;
    Check(WithoutGil(
        [&] { return client_->GetInto(name, fetch, data, nbytes, &version); }));
    return py::make_tuple(array, version);
  }

  // Rows `indices` (a C-contiguous int64 array, checked by the Python
  // layer) of dim 0. Without `out` the SDK's buffer becomes the array (no
  // copy); with `out`, the rows land in it.
  py::tuple GetRows(const std::string& name,
                    py::array_t<int64_t, py::array::c_style> indices,
                    py::object out) {
    const absl::Span<const int64_t> span(indices.data(),
                                         static_cast<size_t>(indices.size()));
    if (out.is_none()) {
      HostArray rows =
          Unwrap(WithoutGil([&] { return client_->GatherRows(name, span); }));
      const uint64_t version = rows.version;
      return py::make_tuple(ToNumpy(std::move(rows)), version);
    }
    const TensorMetadata meta =
        Unwrap(WithoutGil([&] { return client_->Describe(name); }));
    if (meta.shape.empty()) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' is 0-d: it has no rows")));
    }
    std::vector<int64_t> shape = meta.shape;
    shape[0] = static_cast<int64_t>(span.size());
    Box box = WholeBox(meta.shape);
    box.sizes[0] = shape[0];
    py::array array =
        ValidateOut(out, NumpyDType(meta.dtype), shape, meta, box);
    char* data = static_cast<char*>(array.mutable_data());
    const int64_t nbytes = static_cast<int64_t>(array.nbytes());
    uint64_t version = 0;
    Check(WithoutGil([&] {
      return client_->GatherRowsInto(name, span, data, nbytes, &version);
    }));
    return py::make_tuple(array, version);
  }

  // New contents for `name` (or `region` of it, a numpy-style key) as
  // version N+1. The array's shape must equal the region's, with the dims
  // that integer indices drop left out.
  py::dict Update(const std::string& name, py::array array,
                  const std::string& dtype_name, py::handle region) {
    const DType dtype = Unwrap(ParseDType(dtype_name));
    if (!(array.flags() & py::array::c_style)) {
      throw StatusError(
          absl::InvalidArgumentError("update: the array must be C-contiguous"));
    }
    if (static_cast<size_t>(array.itemsize()) != ItemSize(dtype)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "update: dtype ", DTypeName(dtype), " has ", ItemSize(dtype),
          "-byte items but the array has ", array.itemsize(), "-byte items")));
    }
    const Shape array_shape(array.shape(), array.shape() + array.ndim());
    const RegionKey key = ToRegionKey(region);
    std::optional<Box> box;
    Shape shape = array_shape;
    if (!key.whole) {
      const TensorMetadata meta =
          Unwrap(WithoutGil([&] { return client_->Describe(name); }));
      Box resolved;
      std::vector<int64_t> result_shape;
      Check(ResolveKey(key, meta.shape, &resolved, &result_shape));
      if (array_shape != result_shape) {
        throw StatusError(absl::InvalidArgumentError(absl::StrCat(
            "update: shape mismatch: the array is ", Str(ToTuple(array_shape)),
            " but region ", resolved.ToString(), " of '", name, "' is ",
            Str(ToTuple(result_shape)))));
      }
      // The same bytes, with the dims integer indices dropped as size 1.
      shape.assign(resolved.sizes.begin(), resolved.sizes.end());
      box = std::move(resolved);
    }
    const char* data = static_cast<const char*>(array.data());
    UpdateStats stats = Unwrap(WithoutGil(
        [&] { return client_->Update(name, shape, dtype, data, box); }));
    py::dict d;
    d["version"] = stats.version;
    d["bytes_written"] = stats.bytes_written;
    d["shards_kept"] = stats.shards_kept;
    d["seconds"] = stats.seconds;
    d["relayed_bytes"] = stats.relayed_bytes;
    return d;
  }

  // One tensor per entry of a .safetensors file (all or nothing); the
  // sharding is resolved against each entry's shape.
  py::list ImportSafetensors(const std::string& path, py::handle spec_obj,
                             const std::string& prefix) {
    const SpecArgs args = ToSpecArgs(spec_obj);
    SafetensorsImportResult result = Unwrap(WithoutGil([&] {
      return tessera::ImportSafetensors(
          *client_, path,
          [&args](const SafetensorsEntry& e) {
            return ResolveSpec(args, e.shape);
          },
          prefix);
    }));
    py::list out;
    for (const TensorMetadata& t : result.tensors) {
      TensorInfo info;
      info.name = t.name;
      info.shape = t.shape;
      info.dtype = t.dtype;
      info.version = t.version;
      info.num_shards = static_cast<int64_t>(t.shards.size());
      info.replicas = ReplicaCount(t);
      info.mirror = t.mirror;
      out.append(InfoDict(info));
    }
    return out;
  }

  // One tensor per entry of a checkpoint directory under the workers'
  // --checkpoint_root (all or nothing); the workers read the bytes.
  py::dict Load(const std::string& dir, py::handle spec_obj,
                const std::string& prefix) {
    const SpecArgs args = ToSpecArgs(spec_obj);
    Client::LoadStats stats = Unwrap(WithoutGil([&] {
      return tessera::LoadCheckpoint(
          *client_, dir,
          [&args](const Shape& shape) { return ResolveSpec(args, shape); },
          prefix,
          [this](const std::vector<Client::LoadEntry>& entries) {
            absl::MutexLock lock(&loading_->mu);
            loading_->name = entries.empty() ? "" : entries.front().tensor;
          });
    }));
    {
      absl::MutexLock lock(&loading_->mu);
      loading_->name.clear();
    }
    py::list tensors;
    for (const TensorInfo& t : stats.tensors) tensors.append(InfoDict(t));
    py::dict d;
    d["dir"] = dir;
    d["tensors"] = tensors;
    d["bytes"] = stats.bytes;
    d["bytes_read"] = stats.bytes_read;
    d["seconds"] = stats.seconds;
    return d;
  }

  // The named tensors (or those starting with `prefix`) saved into a
  // checkpoint directory under the workers' --checkpoint_root.
  py::dict Save(const std::string& dir, py::object names, py::object prefix,
                bool overwrite) {
    const std::vector<std::string> list =
        names.is_none() ? std::vector<std::string>{}
                        : names.cast<std::vector<std::string>>();
    const std::string p = prefix.is_none() ? "" : prefix.cast<std::string>();
    return SaveStatsDict(dir, Unwrap(WithoutGil([&] {
                           return client_->SaveCheckpoint(dir, list, p,
                                                          overwrite);
                         })));
  }

  // A save's or an export --hf's reply, as SaveStats' fields.
  static py::dict SaveStatsDict(const std::string& dir,
                                const Client::SaveStats& stats) {
    py::dict d;
    d["dir"] = dir;
    d["tensors"] = stats.tensors;
    d["bytes"] = stats.bytes;
    d["files"] = stats.files;
    d["seconds"] = stats.seconds;
    return d;
  }

  // The named tensors (or those starting with `prefix`) as a Hugging Face
  // sharded directory under the workers' --checkpoint_root (export --hf).
  // `max_shard_size`: None (5 GB), bytes as an int, or a size as Hugging
  // Face writes one ("5GB", "500MiB").
  py::dict ExportHf(const std::string& dir, py::object names, py::object prefix,
                    const std::string& strip_prefix, py::object max_shard_size,
                    bool overwrite) {
    const std::vector<std::string> list =
        names.is_none() ? std::vector<std::string>{}
                        : names.cast<std::vector<std::string>>();
    const std::string p = prefix.is_none() ? "" : prefix.cast<std::string>();
    Client::HfExport options;
    options.strip_prefix = strip_prefix;
    options.overwrite = overwrite;
    if (py::isinstance<py::str>(max_shard_size)) {
      absl::StatusOr<int64_t> bytes =
          ParseByteSize(max_shard_size.cast<std::string>());
      if (!bytes.ok()) {
        Check(absl::InvalidArgumentError(
            absl::StrCat("max_shard_size: ", bytes.status().message())));
      }
      options.max_file_bytes = *bytes;
    } else if (!max_shard_size.is_none()) {
      const int64_t bytes = max_shard_size.cast<int64_t>();
      if (bytes < 1) {
        Check(absl::InvalidArgumentError(absl::StrCat(
            "max_shard_size: ", bytes, " is not a size (at least 1 byte)")));
      }
      options.max_file_bytes = bytes;
    }
    return SaveStatsDict(dir, Unwrap(WithoutGil([&] {
                           return client_->ExportHf(dir, list, p, options);
                         })));
  }

  // The named tensors (or those starting with `prefix`) into one
  // .safetensors file, gathered straight into its mapping.
  py::dict ExportSafetensors(
      const std::string& path, py::object names, py::object prefix,
      const std::vector<std::pair<std::string, std::string>>& metadata) {
    SafetensorsSelection selection =
        prefix.is_none()
            ? SafetensorsSelection::Names(
                  names.cast<std::vector<std::string>>())
            : SafetensorsSelection::Prefix(prefix.cast<std::string>());
    SafetensorsExportResult result = Unwrap(WithoutGil([&] {
      return tessera::ExportSafetensors(*client_, path, selection, metadata);
    }));
    py::list entries;
    for (const SafetensorsExportedEntry& e : result.entries) {
      py::dict d;
      d["entry"] = e.entry;
      d["tensor"] = e.tensor;
      d["shape"] = ToTuple(e.shape);
      d["dtype"] = std::string(DTypeName(e.dtype));
      entries.append(d);
    }
    py::dict d;
    d["path"] = path;
    d["entries"] = entries;
    d["bytes"] = result.bytes;
    d["file_bytes"] = result.file_bytes;
    d["seconds"] = result.seconds;
    return d;
  }

  py::array GetShard(const std::string& name, int64_t index) {
    return ToNumpy(
        Unwrap(WithoutGil([&] { return client_->GetShard(name, index); })));
  }

  py::dict Reshard(const std::string& name, py::handle spec_obj) {
    const SpecArgs args = ToSpecArgs(spec_obj);
    ReshardStats stats =
        Unwrap(WithoutGil([&]() -> absl::StatusOr<ReshardStats> {
          Shape shape;
          if (!args.chunk) {
            absl::StatusOr<TensorMetadata> meta = client_->Describe(name);
            if (!meta.ok()) return meta.status();
            shape = meta->shape;
          }
          absl::StatusOr<LayoutSpec> spec = ResolveSpec(args, shape);
          if (!spec.ok()) return spec.status();
          return client_->Reshard(name, *spec);
        }));
    py::dict d;
    d["version"] = stats.version;
    d["pieces_moved"] = stats.pieces_moved;
    d["bytes_moved"] = stats.bytes_moved;
    d["bytes_copied_locally"] = stats.bytes_copied_locally;
    d["shards_kept"] = stats.shards_kept;
    d["seconds"] = stats.seconds;
    d["sent"] = stats.sent;  // {worker: bytes}
    return d;
  }

  // (bytes done, bytes total) of the move of `name`'s bytes running now (a
  // reshard, a repair); None when none runs.
  // The running load's progress (a tensor it makes, once they are known).
  py::object LoadProgress() {
    std::string name;
    {
      absl::MutexLock lock(&loading_->mu);
      name = loading_->name;
    }
    if (name.empty()) return py::none();
    return ReshardProgress(name);
  }

  py::object ReshardProgress(const std::string& name) {
    MoveProgress progress =
        Unwrap(WithoutGil([&] { return client_->ReshardProgress(name); }));
    if (!progress.running) return py::none();
    return py::make_tuple(progress.bytes_done, progress.bytes_total);
  }

 private:
  // The tensor a running load makes first, for its progress (shared: the
  // client stays movable).
  struct Loading {
    absl::Mutex mu;
    std::string name ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Loading> loading_ = std::make_shared<Loading>();

  // The caller's `out`: a writeable, C-contiguous ndarray of exactly the
  // region's dtype and shape (no casting, no reshaping: those would copy).
  static py::array ValidateOut(py::object out, const py::dtype& dtype,
                               const std::vector<int64_t>& shape,
                               const TensorMetadata& meta, const Box& box) {
    auto fail = [&](const std::string& why) {
      return StatusError(absl::InvalidArgumentError(absl::StrCat(
          "out: ", why, "; region ", box.ToString(), " of '", meta.name,
          "' needs a writeable ", "C-contiguous numpy array of dtype ",
          Str(dtype), " and shape ", Str(ToTuple(shape)))));
    };
    if (!py::isinstance<py::array>(out)) throw fail("not a numpy array");
    py::array array = py::reinterpret_borrow<py::array>(out);
    if (!array.dtype().attr("__eq__")(dtype).cast<bool>()) {
      throw fail(absl::StrCat("has dtype ", Str(array.dtype())));
    }
    if (!(array.dtype().attr("isnative").cast<bool>()))
      throw fail("is not in native byte order");
    std::vector<int64_t> got(array.shape(), array.shape() + array.ndim());
    if (got != shape) throw fail(absl::StrCat("has shape ", Str(ToTuple(got))));
    if (!(array.flags() & py::array::c_style))
      throw fail("is not C-contiguous");
    if (!array.writeable()) throw fail("is read-only");
    return array;
  }

  std::shared_ptr<Client> client_;
};

}  // namespace
}  // namespace python
}  // namespace tessera

// A cancellation token for SDK calls (the asyncio API): `with token:` makes
// it this thread's ScopedCancellation, so that cancel() from another thread
// gives up the calls the thread makes meanwhile; an AsyncReader's get holds
// it the same way on its own thread.
class PyCancellation {
 public:
  void Cancel() { cancellation_->Cancel(); }
  bool Cancelled() const { return cancellation_->cancelled(); }
  void Enter() {
    scopes().push_back(
        std::make_unique<tessera::ScopedCancellation>(cancellation_.get()));
  }
  void Exit() {
    if (!scopes().empty()) scopes().pop_back();
  }
  // Shared with the calls that run under it: they may outlive the token.
  const std::shared_ptr<tessera::Cancellation>& shared() const {
    return cancellation_;
  }

 private:
  // This thread's scopes, innermost last (a `with` enters and exits on one
  // thread).
  static std::vector<std::unique_ptr<tessera::ScopedCancellation>>& scopes() {
    thread_local std::vector<std::unique_ptr<tessera::ScopedCancellation>>
        stack;
    return stack;
  }
  std::shared_ptr<tessera::Cancellation> cancellation_ =
      std::make_shared<tessera::Cancellation>();
};

namespace tessera {
namespace python {

// tessera.aio's gets without a Python thread per call: C++ threads run the
// reads (no GIL), finished ones wait in a queue, and an eventfd wakes the
// event loop, which collects every finished one at once. The executor
// path's two thread handoffs and GIL round trips per call are what this
// saves.
class AsyncReader {
 public:
  AsyncReader(std::shared_ptr<Client> client, int threads)
      : client_(std::move(client)),
        efd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (efd_ < 0) throw std::runtime_error("eventfd failed");
    for (int i = 0; i < std::max(1, threads); ++i) {
      threads_.emplace_back([this] { Serve(); });
    }
  }
  ~AsyncReader() { Close(); }

  int fd() const { return efd_; }

  // Starts a get of `name` at `region` (numpy basic indexing, as
  // Client.get); Collect returns its result under `id`.
  void Get(uint64_t id, const std::string& name, py::handle region,
           const PyCancellation& cancel) {
    Job job{id, name, ToRegionKey(region), cancel.shared()};
    absl::MutexLock lock(&mu_);
    if (closed_) throw StatusError(absl::FailedPreconditionError("closed"));
    jobs_.push_back(std::move(job));
  }

  // The gets finished since the last call: [(id, array, None) or
  // (id, None, exception)].
  py::list Collect() {
    uint64_t count;
    (void)!read(efd_, &count, sizeof(count));  // re-arms the fd
    std::vector<Done> done;
    {
      absl::MutexLock lock(&mu_);
      done.swap(done_);
    }
    py::list out;
    for (Done& d : done) {
      if (d.result.ok()) {
        out.append(
            py::make_tuple(d.id, ToNumpy(*std::move(d.result)), py::none()));
        continue;
      }
      py::object cls = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
      py::int_ key(static_cast<int>(d.result.status().code()));
      if (error_classes != nullptr && error_classes->contains(key)) {
        cls = (*error_classes)[key];
      }
      out.append(py::make_tuple(d.id, py::none(),
                                cls(std::string(d.result.status().message()))));
    }
    return out;
  }

  // Stops the threads once the gets started have run.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
    }
    {
      py::gil_scoped_release release;
      for (std::thread& t : threads_) t.join();
    }
    close(efd_);
  }

 private:
  struct Job {
    uint64_t id;
    std::string name;
    RegionKey key;
    std::shared_ptr<Cancellation> cancel;
  };
  struct Done {
    uint64_t id;
    absl::StatusOr<HostArray> result;
  };

  void Serve() {
    while (true) {
      Job job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](AsyncReader* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return r->closed_ || !r->jobs_.empty();
            },
            this));
        if (jobs_.empty()) return;  // closed, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Done done{job.id, absl::UnknownError("")};
      {
        ScopedCancellation scope(job.cancel.get());
        done.result = GetByKey(*client_, job.name, job.key);
      }
      bool wake;
      {
        absl::MutexLock lock(&mu_);
        wake = done_.empty();  // else the loop is already told
        done_.push_back(std::move(done));
      }
      if (wake) {
        const uint64_t one = 1;
        (void)!write(efd_, &one, sizeof(one));
      }
    }
  }

  const std::shared_ptr<Client> client_;
  const int efd_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<Done> done_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The ShardHandle class (an RRef-like handle to one shard).
void BindShardHandle(py::module_& m) {
  py::class_<ShardHandle>(
      m, "ShardHandle",
      "RRef-like handle to one shard of one version of a tensor. to_here() "
      "reads the shard straight from its worker into a new numpy array; once "
      "that version is freed (tensor resharded or deleted) it raises "
      "FailedPrecondition instead of returning other data. str(handle) is "
      "'NAME@vVERSION#SHARD_ID', as `describe` prints it.")
      .def_property_readonly("tensor", &ShardHandle::tensor)
      .def_property_readonly("version", &ShardHandle::version)
      .def_property_readonly("index", &ShardHandle::index)
      .def_property_readonly("dtype",
                             [](const ShardHandle& h) {
                               return std::string(DTypeName(h.dtype()));
                             })
      .def_property_readonly(
          "offsets",
          [](const ShardHandle& h) { return ToTuple(h.shard().box.offsets); })
      .def_property_readonly(
          "sizes",
          [](const ShardHandle& h) { return ToTuple(h.shard().box.sizes); })
      .def_property_readonly(
          "worker",
          [](const ShardHandle& h) { return ShownReplica(h.shard()).worker; })
      .def_property_readonly(
          "address",
          [](const ShardHandle& h) { return ShownReplica(h.shard()).address; })
      .def_property_readonly(
          "shard_id",
          [](const ShardHandle& h) { return ShownReplica(h.shard()).shard_id; })
      .def(
          "to_here",
          [](const ShardHandle& h) {
            return ToNumpy(Unwrap(WithoutGil([&] { return h.ToHere(); })));
          },
          "Fetches this shard's data straight from its worker as a numpy "
          "array.")
      .def("__str__", &ShardHandle::ToString)
      .def("__repr__", [](const ShardHandle& h) {
        return absl::StrCat("ShardHandle('", h.ToString(), "')");
      });
}

}  // namespace python
}  // namespace tessera

PYBIND11_MODULE(_tessera, m) {
  using namespace tessera;          // NOLINT
  using namespace tessera::python;  // NOLINT
  // The libraries' log lines (UCX's among them) go to stderr: a program's
  // stdout is its own.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "tessera", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  m.doc() =
      "tessera's C++ SDK bound for Python; use the `tessera` package, not this "
      "module.";
  // The release and wire protocol of the SDK this module was built from
  // (the CLI's and the daemons' --version say the same).
  m.attr("version") = kVersion;
  m.attr("wire_protocol") = kWireProtocol;

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      TranslateStatusError(e);
    }
  });

  m.def(
      "_set_error_classes",
      [](py::dict classes) {
        if (error_classes == nullptr) error_classes = new py::dict();
        error_classes->clear();
        for (auto item : classes) (*error_classes)[item.first] = item.second;
      },
      "Registers {absl status code: exception class}.");

  m.def(
      "dtype_names",
      [] {
        std::vector<std::string> names;
        for (DType d : AllDTypes()) names.emplace_back(DTypeName(d));
        return names;
      },
      "Every tessera dtype name, in enum order.");

  BindShardHandle(m);

  py::class_<PyCancellation>(m, "Cancellation")
      .def(py::init<>())
      .def("cancel", &PyCancellation::Cancel)
      .def_property_readonly("cancelled", &PyCancellation::Cancelled)
      .def(
          "__enter__",
          [](PyCancellation& self) -> PyCancellation& {
            self.Enter();
            return self;
          },
          py::return_value_policy::reference)
      .def("__exit__", [](PyCancellation& self, py::args) {
        self.Exit();
        return false;
      });

  py::class_<AsyncReader>(m, "AsyncReader")
      .def("fd", &AsyncReader::fd)
      .def("get", &AsyncReader::Get, py::arg("id"), py::arg("name"),
           py::arg("region"), py::arg("cancel"))
      .def("collect", &AsyncReader::Collect)
      .def("close", &AsyncReader::Close);

  py::class_<PyClient>(m, "Client")
      .def_static("connect", &PyClient::Connect, py::arg("address"),
                  py::arg("rpc_timeout_s"), py::arg("connect_timeout_s"),
                  py::arg("data_timeout_s"), py::arg("max_parallel_streams"),
                  py::arg("tls_ca"), py::arg("tls_cert"), py::arg("tls_key"),
                  py::arg("token_file"), py::arg("transport"))
      .def_property_readonly("address", &PyClient::address)
      .def("workers", &PyClient::Workers)
      .def("coordinators", &PyClient::Coordinators,
           "The coordinators as dicts {address, role ('leader' or "
           "'standby'), alive}, the leader first.")
      .def("quotas", &PyClient::Quotas,
           "What principals hold against their quotas, as dicts {principal, "
           "bytes, bytes_limit, names, names_limit} (a limit None: "
           "unlimited).")
      .def("moved", &PyClient::Moved)
      .def("transfer_stats", &PyClient::TransferStats)
      .def("reshard_progress", &PyClient::ReshardProgress, py::arg("name"))
      .def("wait", &PyClient::Wait, py::arg("name"),
           py::arg("version") = py::none(), py::arg("timeout") = py::none())
      .def("load_progress", &PyClient::LoadProgress)
      .def(
          "async_reader",
          [](PyClient& self, int threads) {
            return std::make_unique<AsyncReader>(self.shared(), threads);
          },
          py::arg("threads"))
      .def("list", &PyClient::List)
      .def("describe", &PyClient::Describe, py::arg("name"))
      .def("delete", &PyClient::Delete, py::arg("name"))
      .def("set_worker_state", &PyClient::SetWorkerState, py::arg("worker"),
           py::arg("state"))
      .def("drain_worker", &PyClient::DrainWorker, py::arg("worker"),
           py::arg("timeout_s"))
      .def("remove_worker", &PyClient::RemoveWorker, py::arg("worker"))
      .def("create", &PyClient::Create, py::arg("name"), py::arg("shape"),
           py::arg("dtype"), py::arg("spec"), py::arg("init"))
      .def("put", &PyClient::Put, py::arg("name"), py::arg("array"),
           py::arg("dtype"), py::arg("spec"))
      .def("get", &PyClient::Get, py::arg("name"), py::arg("region"),
           py::arg("out"))
      .def("get_shard", &PyClient::GetShard, py::arg("name"), py::arg("index"))
      .def("get_rows", &PyClient::GetRows, py::arg("name"), py::arg("indices"),
           py::arg("out"))
      .def("update", &PyClient::Update, py::arg("name"), py::arg("array"),
           py::arg("dtype"), py::arg("region"))
      .def("import_safetensors", &PyClient::ImportSafetensors, py::arg("path"),
           py::arg("spec"), py::arg("prefix"))
      .def("load", &PyClient::Load, py::arg("dir"), py::arg("spec"),
           py::arg("prefix"))
      .def("save", &PyClient::Save, py::arg("dir"), py::arg("names"),
           py::arg("prefix"), py::arg("overwrite") = false)
      .def("export_safetensors", &PyClient::ExportSafetensors, py::arg("path"),
           py::arg("names"), py::arg("prefix"), py::arg("metadata"))
      .def("export_hf", &PyClient::ExportHf, py::arg("dir"), py::arg("names"),
           py::arg("prefix"), py::arg("strip_prefix"),
           py::arg("max_shard_size"), py::arg("overwrite"))
      .def("reshard", &PyClient::Reshard, py::arg("name"), py::arg("spec"));
}
