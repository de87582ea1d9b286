#include "transport/grpc_transport.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/convert.h"
#include "rpc/status.h"

namespace tessera {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

absl::Status WithContext(const absl::Status& status, absl::string_view context_text) {
  return context_text.empty() ? status : Annotate(status, context_text);
}

}  // namespace

absl::Status ReadRegion(v1::Worker::StubInterface* stub, uint64_t shard_id, const Box& box,
                        int64_t total_bytes, absl::Duration timeout, const ChunkSink& sink,
                        absl::string_view context_text) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::ReadRegionRequest request;
  request.set_shard_id(shard_id);
  BoxToProto(box, request.mutable_offsets(), request.mutable_sizes());
  std::unique_ptr<grpc::ClientReaderInterface<v1::ReadRegionResponse>> reader =
      stub->ReadRegion(&context, request);
  v1::ReadRegionResponse chunk;
  int64_t received = 0;
  absl::Status sink_status;
  while (reader->Read(&chunk)) {
    const int64_t size = static_cast<int64_t>(chunk.data().size());
    if (chunk.offset() != received || size > total_bytes - received) {
      context.TryCancel();
      sink_status = absl::DataLossError(absl::StrCat(
          "chunk at byte ", chunk.offset(), " of ", size, " bytes does not continue the ",
          total_bytes, "-byte stream at byte ", received));
      break;
    }
    sink_status = sink(chunk.offset(), chunk.data());
    if (!sink_status.ok()) {
      context.TryCancel();
      break;
    }
    received += size;
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!sink_status.ok()) return WithContext(sink_status, context_text);
  if (!status.ok()) return WithContext(status, context_text);
  if (received != total_bytes) {
    return WithContext(absl::DataLossError(absl::StrCat("stream ended after ", received, " of ",
                                                        total_bytes, " bytes")),
                       context_text);
  }
  return absl::OkStatus();
}

absl::Status WriteShard(v1::Worker::StubInterface* stub, uint64_t shard_id, int64_t size,
                        const ChunkSource& source, absl::Duration timeout,
                        absl::string_view context_text) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::WriteShardResponse response;
  std::unique_ptr<grpc::ClientWriterInterface<v1::WriteShardRequest>> writer =
      stub->WriteShard(&context, &response);
  v1::WriteShardRequest chunk;
  chunk.set_shard_id(shard_id);
  int64_t offset = 0;
  // An empty shard still sends one message so the worker sees the shard id.
  do {
    const int64_t n = std::min(kDefaultChunkBytes, size - offset);
    chunk.set_offset(offset);
    std::string* data = chunk.mutable_data();
    data->resize(static_cast<size_t>(n));
    if (n > 0) source(offset, absl::MakeSpan(data->data(), data->size()));
    if (!writer->Write(chunk)) break;  // the server ended the stream: Finish says why
    offset += n;
  } while (offset < size);
  writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (!status.ok()) return WithContext(status, context_text);
  if (response.bytes_written() != size) {
    return WithContext(absl::DataLossError(absl::StrCat(
                           "worker stored ", response.bytes_written(), " of ", size, " bytes")),
                       context_text);
  }
  return absl::OkStatus();
}

}  // namespace tessera
