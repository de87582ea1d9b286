#include "transport/staged_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/fan_out.h"
#include "core/status_macros.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "transport/shared_memory.h"
#include "transport/shared_memory_arena.h"

namespace tessera {
namespace {

constexpr char kStagedPayload[] = "tessera.dev/staged-shard";

absl::Status Inconsistent(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("worker's StageRead reply is inconsistent: ", what));
}

// Maps segment `name` of at least `bytes`, checked with fstat.
absl::StatusOr<std::shared_ptr<const StagingSegment>> MapSegment(
    const std::string& name, int64_t bytes, int* keep_fd) {
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("staging segment ", name, " is too short"));
  }
  void* map =
      mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("mmap of staging: ", std::strerror(errno)));
  }
  if (keep_fd != nullptr) {
    *keep_fd = fd;
  } else {
    close(fd);
  }
  return std::make_shared<const StagingSegment>(static_cast<const char*>(map),
                                                static_cast<size_t>(bytes));
}

// Checks a StageRead's first reply and maps its segment.
absl::StatusOr<std::shared_ptr<const StagingSegment>> OpenSlots(
    const v1::StageReadResponse& reply, int64_t slot_bytes,
    StagingMappings* mappings) {
  if (LocalHostId().empty() || reply.host_id() != LocalHostId()) {
    return absl::FailedPreconditionError("worker is on another host");
  }
  if (!IsShmName(reply.segment()) ||
      (!reply.liveness().empty() && !IsShmName(reply.liveness()))) {
    return Inconsistent("a name is not one shared-memory object");
  }
  // Two slots, in a block of at most twice that and one rounding step.
  if (reply.segment_bytes() < 2 * slot_bytes ||
      reply.segment_bytes() > 4 * slot_bytes + (int64_t{2} << 20)) {
    return Inconsistent(absl::StrCat("a segment of ", reply.segment_bytes(),
                                     " bytes for two slots of ", slot_bytes));
  }
  if (mappings != nullptr) {
    return mappings->Map(reply.segment(), reply.segment_bytes());
  }
  return MapSegment(reply.segment(), reply.segment_bytes(), nullptr);
}

// What a failed stream means for the chain: staging that cannot happen here
// is a FAILED_PRECONDITION (read over gRPC instead).
absl::Status StreamError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnimplemented:
      return absl::FailedPreconditionError("worker does not stage reads");
    case absl::StatusCode::kResourceExhausted:
      return absl::FailedPreconditionError(
          absl::StrCat("worker cannot stage now: ", status.message()));
    default:
      return status;
  }
}

// Elements [first, first + count) of the box through one stream.
absl::Status StagePart(const std::shared_ptr<grpc::Channel>& channel,
                       const RemoteShard& shard, const Box& box, int64_t first,
                       int64_t count, const ReadTarget& target,
                       const StagedReadOptions& options) {
  const int64_t item = shard.item_bytes;
  const int64_t slot_elements =
      std::max<int64_t>(1, std::min(count, options.slot_bytes / item));
  const int64_t slot_bytes = slot_elements * item;
  // Why this side ended the stream, if it did; `cancelled`: it gave the
  // stream up, so the worker's word on it is only that.
  absl::Status local;
  bool cancelled = false;
  const auto run =
      [&](grpc::ClientContext* context,
          grpc::ClientReaderWriterInterface<v1::StageReadRequest,
                                            v1::StageReadResponse>* stream)
      -> absl::Status {
    const auto give_up = [&](absl::Status why) {
      context->TryCancel();
      cancelled = true;
      return why;
    };
    v1::StageReadRequest request;
    request.set_shard_id(shard.location.shard_id);
    for (size_t d = 0; d < box.rank(); ++d) {
      request.add_offsets(box.offsets[d]);
      request.add_sizes(box.sizes[d]);
    }
    request.set_slot_bytes(slot_bytes);
    request.set_item_bytes(item);
    v1::StageReadResponse reply;
    if (!stream->Write(request) || !stream->Read(&reply)) {
      return absl::UnavailableError("staging stream ended early");
    }
    absl::StatusOr<std::shared_ptr<const StagingSegment>> segment =
        OpenSlots(reply, slot_bytes, options.mappings);
    if (!segment.ok()) return give_up(segment.status());
    const char* const slots = (*segment)->data();
    struct Chunk {
      int64_t first;
      int64_t count;
      int slot;
    };
    std::deque<Chunk> in_flight;
    int64_t next = first;
    const int64_t end = first + count;
    // A slot is asked for again only once its chunk has been copied out,
    // and the worker fills chunks in order: the two never race.
    const auto ask = [&](int slot) {
      const Chunk chunk{next, std::min(slot_elements, end - next), slot};
      request.Clear();
      request.set_first(chunk.first);
      request.set_count(chunk.count);
      request.set_slot(slot);
      next += chunk.count;
      in_flight.push_back(chunk);
      return stream->Write(request);
    };
    for (int slot = 0; slot < 2 && next < end; ++slot) {
      if (!ask(slot)) return absl::UnavailableError("staging stopped");
    }
    while (!in_flight.empty()) {
      const Chunk chunk = in_flight.front();
      in_flight.pop_front();
      if (!stream->Read(&reply)) {
        return absl::UnavailableError("staging stream ended early");
      }
      if (reply.slot() != chunk.slot || reply.bytes() != chunk.count * item) {
        return give_up(Inconsistent(absl::StrCat(
            "slot ", reply.slot(), " with ", reply.bytes(), " bytes for slot ",
            chunk.slot, " of ", chunk.count * item)));
      }
      absl::Status delivered = target.Deliver(
          box.sizes, chunk.first, chunk.count, slots + chunk.slot * slot_bytes,
          static_cast<size_t>(item));
      if (!delivered.ok()) return give_up(std::move(delivered));
      if (next < end && !ask(chunk.slot)) {
        return absl::UnavailableError("staging stopped");
      }
    }
    return absl::OkStatus();
  };
  const absl::Status rpc =
      DataCall(options.timeout, shard.location.capability,
               [&](grpc::ClientContext* context) {
                 auto stream = v1::Worker::NewStub(channel)->StageRead(context);
                 local = run(context, stream.get());
                 if (!cancelled) stream->WritesDone();
                 return stream->Finish();
               });
  // The worker's word on the stream when it has one.
  if (cancelled || rpc.ok()) return local;
  return StreamError(rpc);
}

}  // namespace

StagingSegment::~StagingSegment() { munmap(const_cast<char*>(data_), bytes_); }

StagingMappings::~StagingMappings() {
  for (const auto& [name, entry] : entries_) close(entry.fd);
}

absl::StatusOr<std::shared_ptr<const StagingSegment>> StagingMappings::Map(
    const std::string& name, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  // Segments their workers dropped go first.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (Unlinked(it->second.fd)) {
      close(it->second.fd);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.segment->bytes() == bytes) {
    return it->second.segment;
  }
  if (it != entries_.end()) {
    close(it->second.fd);
    entries_.erase(it);
  }
  int fd = -1;
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const StagingSegment> segment,
                           MapSegment(name, bytes, &fd));
  if (entries_.size() >= kMaxSegments) {
    close(entries_.begin()->second.fd);
    entries_.erase(entries_.begin());
  }
  entries_[name] = Entry{fd, segment};
  return segment;
}

absl::Status StagedShardError(absl::string_view where) {
  absl::Status status = absl::FailedPreconditionError(
      where == "host"
          ? std::string("the shard is in the worker's private memory")
          : absl::StrCat("the shard is in GPU memory (", where, ")"));
  status.SetPayload(kStagedPayload, absl::Cord(where));
  return status;
}

std::string StagedShardWhere(const absl::Status& status) {
  const auto where = status.GetPayload(kStagedPayload);
  return where.has_value() ? std::string(*where) : std::string();
}

bool IsStagedShard(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         status.GetPayload(kStagedPayload).has_value();
}

absl::Status StagedRead(const std::shared_ptr<grpc::Channel>& channel,
                        const RemoteShard& shard, const Box& box,
                        const ReadTarget& target,
                        const StagedReadOptions& options) {
  const int64_t total = box.NumElements();
  if (total == 0 || shard.item_bytes <= 0) {
    return absl::FailedPreconditionError("nothing to stage");
  }
  const int64_t bytes = total * shard.item_bytes;
  const int64_t streams = std::clamp<int64_t>(
      bytes / std::max<int64_t>(1, options.min_stream_bytes), 1,
      std::max(1, options.max_streams));
  const int64_t per_stream = (total + streams - 1) / streams;
  return FanOut(static_cast<size_t>(streams), static_cast<size_t>(streams),
                [&](size_t k) {
                  const int64_t first = static_cast<int64_t>(k) * per_stream;
                  const int64_t count = std::min(per_stream, total - first);
                  return count > 0 ? StagePart(channel, shard, box, first,
                                               count, target, options)
                                   : absl::OkStatus();
                });
}

}  // namespace tessera
