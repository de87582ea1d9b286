// The Worker gRPC service: a thin layer over WorkerNode. Each method
// converts the request to core types (validating it through rpc/convert),
// calls the node, converts the answer back and maps the status.
// Thread-safe (the node is).
//
// Region reads are served raw (grpc::ByteBuffer): a chunk of a sub-box that
// is contiguous in the shard goes out as a slice pointing into the shard's
// memory (kept alive until gRPC releases it), so the worker copies nothing;
// other chunks are gathered once into a fresh slice. One write is in flight
// per stream.
//
// Streams are bounded (WorkerNodeOptions): at most max_streams at once, and
// one whose peer stops reading or sending for stream_idle_timeout is
// cancelled, releasing its thread and the shard memory its chunks pin.
#ifndef TESSERA_WORKER_WORKER_SERVICE_H_
#define TESSERA_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/worker.grpc.pb.h"
#include "worker/worker_node.h"

namespace tessera {

// ReadRegion streams raw ByteBuffers (zero-copy slices over shard memory)
// from a synchronous split-streaming handler put in place of the generated
// one.
//
// Where shards are in host memory, the two small reads run on gRPC's
// callback API instead: ReadSmallRegion and ReadSmallRegions (raw: the
// regions copied once into the reply) and ReadRows. No pool thread then waits
// for a reply to be written: 16 callers of 64 KiB went from 0.81-0.84x
// to 1.03-1.05x of a synchronous echo server's QPS on 2 cores (bench/ figure 2;
// 4 KiB 0.70-0.73x against 0.74-0.75x, one caller's p50 2-5 % lower). The
// price, measured there: once a callback method is registered, a call to a
// synchronous method passes from gRPC's callback thread to a pool thread,
// about 30 us more p50 for one caller (a health check 105 -> 130 us):
// control calls and stream starts. A device store keeps every method
// synchronous: its reads wait on the GPU, which must not hold gRPC's few
// callback threads. It answers ReadSmallRegions with UNIMPLEMENTED (the
// generated default), so clients send it small reads one at a time.
class WorkerService final : public v1::Worker::Service {
 public:
  // `node` is not owned and outlives the service.
  explicit WorkerService(WorkerNode* node);

  // Small reads gRPC holds on the callback API (its gauge; bounded by the
  // node's max_small_reads).
  int small_reads_in_flight() const { return active_small_reads_.load(); }
  // Shard bytes sent to readers over gRPC (region reads, small reads and
  // rows), and staged for readers in shared memory (StageRead).
  int64_t served_grpc_bytes() const { return served_grpc_.load(); }
  int64_t served_shm_bytes() const { return served_shm_.load(); }

  grpc::Status AllocateShards(grpc::ServerContext* context,
                              const v1::AllocateShardsRequest* request,
                              v1::AllocateShardsResponse* response) override;
  grpc::Status WriteShard(grpc::ServerContext* context,
                          grpc::ServerReader<v1::WriteShardRequest>* reader,
                          v1::WriteShardResponse* response) override;
  grpc::Status StreamRegion(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<v1::ReadRegionRequest, grpc::ByteBuffer>*
          stream);
  grpc::Status ReadSmallRegion(grpc::ServerContext* context,
                               const v1::ReadRegionRequest* request,
                               v1::ReadRegionResponse* response) override;
  grpc::Status MapShard(grpc::ServerContext* context,
                        const v1::MapShardRequest* request,
                        v1::MapShardResponse* response) override;
  grpc::Status Transfer(grpc::ServerContext* context,
                        const v1::TransferRequest* request,
                        v1::TransferResponse* response) override;
  grpc::Status AwaitRelayFill(grpc::ServerContext* context,
                              const v1::AwaitRelayFillRequest* request,
                              v1::AwaitRelayFillResponse* response) override;
  grpc::Status ReadShardDelta(grpc::ServerContext* context,
                              const v1::ReadShardDeltaRequest* request,
                              v1::ReadShardDeltaResponse* response) override;
  grpc::Status NcclUniqueId(grpc::ServerContext* context,
                            const v1::NcclUniqueIdRequest* request,
                            v1::NcclUniqueIdResponse* response) override;
  grpc::Status NcclExchange(grpc::ServerContext* context,
                            const v1::NcclExchangeRequest* request,
                            v1::NcclExchangeResponse* response) override;
  grpc::Status ReadRows(grpc::ServerContext* context,
                        const v1::ReadRowsRequest* request,
                        v1::ReadRowsResponse* response) override;
  grpc::Status FreeShards(grpc::ServerContext* context,
                          const v1::FreeShardsRequest* request,
                          v1::FreeShardsResponse* response) override;
  grpc::Status SealShards(grpc::ServerContext* context,
                          const v1::SealShardsRequest* request,
                          v1::SealShardsResponse* response) override;
  grpc::Status ListCheckpoint(grpc::ServerContext* context,
                              const v1::ListCheckpointRequest* request,
                              v1::ListCheckpointResponse* response) override;
  grpc::Status LoadShard(grpc::ServerContext* context,
                         const v1::LoadShardRequest* request,
                         v1::LoadShardResponse* response) override;
  grpc::Status WriteShardRuns(grpc::ServerContext* context,
                              const v1::WriteShardRunsRequest* request,
                              v1::WriteShardRunsResponse* response) override;
  grpc::Status PublishCheckpointFiles(
      grpc::ServerContext* context,
      const v1::PublishCheckpointFilesRequest* request,
      v1::PublishCheckpointFilesResponse* response) override;
  grpc::Status SaveShards(grpc::ServerContext* context,
                          const v1::SaveShardsRequest* request,
                          v1::SaveShardsResponse* response) override;
  grpc::Status WriteCheckpointFile(
      grpc::ServerContext* context,
      const v1::WriteCheckpointFileRequest* request,
      v1::WriteCheckpointFileResponse* response) override;
  grpc::Status RemoveCheckpointFiles(
      grpc::ServerContext* context,
      const v1::RemoveCheckpointFilesRequest* request,
      v1::RemoveCheckpointFilesResponse* response) override;
  grpc::Status StageRead(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::StageReadResponse, v1::StageReadRequest>*
          stream) override;
  grpc::Status DataAddress(grpc::ServerContext* context,
                           const v1::DataAddressRequest* request,
                           v1::DataAddressResponse* response) override;
  // What DataAddress answers: the data port's advertised address (set once
  // the port listens), or empty.
  void set_data_address(std::string address) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    data_address_ = std::move(address);
  }

  // What AllocateShards, FreeShards and SealShards do, with the caller's
  // capability
  // given rather than read from call metadata: for in-process callers (the
  // fuzzers drive a worker this way).
  absl::Status Allocate(absl::string_view capability,
                        const v1::AllocateShardsRequest& request,
                        const std::function<bool()>& cancelled,
                        v1::AllocateShardsResponse* response);
  absl::Status Free(absl::string_view capability,
                    const v1::FreeShardsRequest& request,
                    v1::FreeShardsResponse* response);
  absl::Status Seal(absl::string_view capability,
                    const v1::SealShardsRequest& request);

 private:
  // The bodies of ReadSmallRegion and ReadSmallRegions (raw, for the
  // callback API) and ReadRows, for either API.
  absl::Status ReadSmall(const grpc::ServerContextBase& context,
                         const v1::ReadRegionRequest& request,
                         grpc::ByteBuffer* response) const;
  absl::Status ReadSmallBatch(const grpc::ServerContextBase& context,
                              const v1::ReadSmallRegionsRequest& request,
                              grpc::ByteBuffer* response) const;
  absl::Status ReadRowsInto(const grpc::ServerContextBase& context,
                            const v1::ReadRowsRequest& request,
                            v1::ReadRowsResponse* response) const;
  // Serves Worker method `name` on the callback API: `body` (one of the
  // three above) run as SmallRead.
  template <typename Request, typename Response>
  void ServeSmallRead(const char* name, absl::Status (WorkerService::*body)(
                                            const grpc::ServerContextBase&,
                                            const Request&, Response*) const);
  // Runs `body` as a callback-API small read under max_small_reads.
  grpc::ServerUnaryReactor* SmallRead(
      const std::function<absl::Status()>& body);

  WorkerNode* const node_;
  // ReadRegion, WriteShard and StageRead streams being served (node
  // options' max_streams).
  std::atomic<int> active_streams_{0};
  // Callback-API small reads gRPC holds (SmallRead).
  std::atomic<int> active_small_reads_{0};
  mutable std::atomic<int64_t> served_grpc_{0};
  std::atomic<int64_t> served_shm_{0};
  absl::Mutex mu_;
  std::string data_address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_SERVICE_H_
