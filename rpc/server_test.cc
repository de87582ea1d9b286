// StartServer on 127.0.0.1:0: the standard health service follows
// SetServing and Stop, reflection is served, and with a registry every call
// is counted and timed per method and status code.
#include "rpc/server.h"

#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/errors.h"
#include "core/metrics.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/status.h"

namespace tessera {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::tessera::testing::IsOk;
using ::testing::HasSubstr;

class FreeOnly final : public v1::Worker::Service {
 public:
  grpc::Status FreeShards(grpc::ServerContext*,
                          const v1::FreeShardsRequest* request,
                          v1::FreeShardsResponse*) override {
    if (request->shard_ids_size() > 0) {
      return ToGrpcStatus(NotFoundError("shard", "7"));
    }
    return grpc::Status::OK;
  }
};

// What Health.Check answers for `service` ("": the server as a whole).
HealthCheckResponse::ServingStatus Check(grpc::health::v1::Health::Stub* stub,
                                         const std::string& service = "") {
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

// `service` served on 127.0.0.1:0, with a health port of its own beside.
absl::StatusOr<RunningServer> StartWithHealthPort(grpc::Service* service) {
  ServerOptions options;
  options.health_listen = "127.0.0.1:0";
  return StartServer("127.0.0.1:0", {service}, options);
}

TEST(ServerTest, HealthIsNotServingUntilToldAndAfterStop) {
  FreeOnly service;
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {&service});
  ASSERT_THAT(server.status(), IsOk());
  auto channel = MakeChannel(WithPort("127.0.0.1:0", server->port));
  auto health = grpc::health::v1::Health::NewStub(channel);
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::NOT_SERVING);
  server->SetServing(true);
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::SERVING);
  server->SetServing(false);
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::NOT_SERVING);
  server->Stop(absl::ZeroDuration());
}

TEST(ServerTest, HealthWatchStreamsEachChangeAndEndsAtStop) {
  FreeOnly service;
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {&service});
  ASSERT_THAT(server.status(), IsOk());
  auto channel = MakeChannel(WithPort("127.0.0.1:0", server->port));
  auto health = grpc::health::v1::Health::NewStub(channel);
  // Unknown services are not answered for.
  {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service("no.such.Service");
    HealthCheckResponse response;
    EXPECT_EQ(health->Check(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  grpc::ClientContext context;
  auto watch = health->Watch(&context, HealthCheckRequest());
  HealthCheckResponse seen;
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), HealthCheckResponse::NOT_SERVING);
  server->SetServing(true);
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), HealthCheckResponse::SERVING);
  // Stopping ends the watch with NOT_SERVING at once: it does not hold the
  // drain for its whole grace.
  const absl::Time start = absl::Now();
  EXPECT_TRUE(server->Stop(absl::Seconds(30)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(watch->Read(&seen));
}

TEST(ServerTest, HealthPortAnswersAsTheMainPortAndServesNothingElse) {
  FreeOnly service;
  absl::StatusOr<RunningServer> server = StartWithHealthPort(&service);
  ASSERT_THAT(server.status(), IsOk());
  ASSERT_GT(server->health_port, 0);
  ASSERT_NE(server->health_port, server->port);
  auto channel = MakeChannel(WithPort("127.0.0.1:0", server->health_port));
  auto health = grpc::health::v1::Health::NewStub(channel);
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::NOT_SERVING);
  server->SetServing(true);
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::SERVING);
  // The daemon's own services are not reachable on the health port.
  auto worker = v1::Worker::NewStub(channel);
  grpc::ClientContext context;
  v1::FreeShardsRequest request;
  v1::FreeShardsResponse response;
  EXPECT_EQ(worker->FreeShards(&context, request, &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(server->Stop(absl::ZeroDuration()));
  // Stopped: the health port is closed too.
  grpc::ClientContext after;
  after.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(500));
  HealthCheckResponse answer;
  EXPECT_FALSE(health->Check(&after, HealthCheckRequest(), &answer).ok());
}

TEST(ServerTest, LivenessIsServingWhileRunningUntilBroken) {
  FreeOnly service;
  absl::StatusOr<RunningServer> server = StartWithHealthPort(&service);
  ASSERT_THAT(server.status(), IsOk());
  auto health = grpc::health::v1::Health::NewStub(
      MakeChannel(WithPort("127.0.0.1:0", server->health_port)));
  // Alive while not yet ready (a worker waiting for its coordinator).
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(health.get(), kLivenessService),
            HealthCheckResponse::SERVING);
  server->SetServing(true);
  EXPECT_EQ(Check(health.get(), kLivenessService),
            HealthCheckResponse::SERVING);
  // Broken (its port accepts nothing): nothing is served any more.
  server->SetBroken();
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(health.get(), kLivenessService),
            HealthCheckResponse::NOT_SERVING);
  server->SetServing(true);
  EXPECT_EQ(Check(health.get()), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(health.get(), kLivenessService),
            HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(server->Stop(absl::ZeroDuration()));
}

TEST(ServerTest, ReflectionListsTheServices) {
  FreeOnly service;
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {&service});
  ASSERT_THAT(server.status(), IsOk());
  // ServerReflectionInfo is a bidi stream; ask list_services over the raw
  // wire format: ServerReflectionRequest{list_services = 7: ""}.
  auto channel = MakeChannel(WithPort("127.0.0.1:0", server->port));
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  const char request_bytes[] = {0x3a, 0x00};  // field 7, empty string
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string text;
  for (const grpc::Slice& s : slices)
    text.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(text, HasSubstr("tessera.v1.Worker"));
  EXPECT_THAT(text, HasSubstr("grpc.health.v1.Health"));
  context.TryCancel();
  grpc::Status finished;
  call->Finish(&finished, reinterpret_cast<void*>(4));
  while (cq.Next(&tag, &ok)) {
    if (tag == reinterpret_cast<void*>(4)) break;
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  server->Stop(absl::ZeroDuration());
}

TEST(ServerTest, MetricsCountCallsPerMethodAndCode) {
  FreeOnly service;
  MetricsRegistry registry;
  ServerOptions options;
  options.metrics = &registry;
  absl::StatusOr<RunningServer> server =
      StartServer("127.0.0.1:0", {&service}, options);
  ASSERT_THAT(server.status(), IsOk());
  auto stub =
      v1::Worker::NewStub(MakeChannel(WithPort("127.0.0.1:0", server->port)));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::FreeShardsRequest request;
    v1::FreeShardsResponse response;
    if (i == 2) request.add_shard_ids(7);
    stub->FreeShards(&context, request, &response);
  }
  server->Stop(absl::ZeroDuration());
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("tessera_rpc_requests_total{method=\"/tessera.v1."
                              "Worker/FreeShards\",code=\"OK\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tessera_rpc_requests_total{method=\"/tessera.v1."
                              "Worker/FreeShards\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_THAT(text,
              HasSubstr("tessera_rpc_duration_seconds_count{method=\"/"
                        "tessera.v1.Worker/FreeShards\",code=\"OK\"} 2\n"));
}

// Holds FreeShards until released, whatever its cancellation says.
class Stubborn final : public v1::Worker::Service {
 public:
  grpc::Status FreeShards(grpc::ServerContext*, const v1::FreeShardsRequest*,
                          v1::FreeShardsResponse*) override {
    running_.fetch_add(1);
    if (!entered_once_.exchange(true)) entered_.Notify();
    release_.WaitForNotification();
    running_.fetch_sub(1);
    return grpc::Status::OK;
  }
  absl::Notification entered_;
  absl::Notification release_;
  std::atomic<int> running_{0};
  std::atomic<bool> entered_once_{false};
};

TEST(ServerTest, StopReturnsWithinTheGraceWhateverHandlersDo) {
  auto* service = new Stubborn();  // outlives the server left running
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {service});
  ASSERT_THAT(server.status(), IsOk());
  auto stub =
      v1::Worker::NewStub(MakeChannel(WithPort("127.0.0.1:0", server->port)));
  std::thread caller([&] {
    grpc::ClientContext context;
    v1::FreeShardsRequest request;
    v1::FreeShardsResponse response;
    stub->FreeShards(&context, request, &response);
  });
  ASSERT_TRUE(
      service->entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(server->Stop(absl::Milliseconds(100), absl::Milliseconds(200)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(server->server, nullptr);  // left to the process's exit
  service->release_.Notify();
  caller.join();
}

TEST(ServerTest, HandlerThreadsAreBounded) {
  auto* service = new Stubborn();  // outlives the server's threads
  ServerOptions options;
  options.max_threads = 4;
  absl::StatusOr<RunningServer> server =
      StartServer("127.0.0.1:0", {service}, options);
  ASSERT_THAT(server.status(), IsOk());
  auto stub =
      v1::Worker::NewStub(MakeChannel(WithPort("127.0.0.1:0", server->port)));
  constexpr int kCalls = 8;
  std::atomic<int> exhausted{0};
  std::atomic<int> answered{0};
  int most_running = 0;
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&] {
      grpc::ClientContext context;
      v1::FreeShardsRequest request;
      v1::FreeShardsResponse response;
      grpc::Status status = stub->FreeShards(&context, request, &response);
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        exhausted.fetch_add(1);
      answered.fetch_add(1);
    });
  }
  // Wait until every call is either running or refused.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (service->running_.load() + exhausted.load() < kCalls &&
         absl::Now() < deadline) {
    most_running = std::max(most_running, service->running_.load());
    absl::SleepFor(absl::Milliseconds(10));
  }
  most_running = std::max(most_running, service->running_.load());
  EXPECT_GT(exhausted.load(), 0);
  EXPECT_LE(most_running, options.max_threads);
  service->release_.Notify();
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(answered.load(), kCalls);
  EXPECT_TRUE(server->Stop(absl::Seconds(1)));
}

}  // namespace
}  // namespace tessera
