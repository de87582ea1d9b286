// Call against a real gRPC server on 127.0.0.1:0: which failures are tried
// again (transport failures of idempotent calls, decided on codes and
// details), which are not (errors a tessera service raised, non-idempotent
// calls), and how they read.
#include "rpc/call.h"

#include <atomic>
#include <memory>
#include <thread>

#include "core/errors.h"
#include "core/status_macros.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "rpc/status.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Answers FreeShards with a status the test sets, counting calls.
class ScriptedWorker final : public v1::Worker::Service {
 public:
  grpc::Status FreeShards(grpc::ServerContext* context,
                          const v1::FreeShardsRequest*,
                          v1::FreeShardsResponse* response) override {
    ++calls;
    if (hold) {
      // Held until the caller gives up, as an NCCL member waits for peers.
      const absl::Time until = absl::Now() + absl::Seconds(20);
      while (!context->IsCancelled() && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      saw_cancel = context->IsCancelled();
    }
    response->set_bytes_used(42);
    return ToGrpcStatus(reply);
  }
  std::atomic<int> calls{0};
  std::atomic<bool> hold{false};
  std::atomic<bool> saw_cancel{false};
  absl::Status reply;
};

class CallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {&worker_});
    ASSERT_THAT(server.status(), IsOk());
    server_ = std::move(*server);
    stub_ =
        v1::Worker::NewStub(MakeChannel(WithPort("127.0.0.1:0", server_.port)));
  }
  void TearDown() override { server_.Stop(absl::ZeroDuration()); }

  absl::Status Free(v1::Worker::Stub* stub, const CallOptions& options,
                    int* attempts = nullptr) {
    v1::FreeShardsRequest request;
    v1::FreeShardsResponse response;
    return Call(options, [&](grpc::ClientContext* context) {
      if (attempts != nullptr) ++*attempts;
      return stub->FreeShards(context, request, &response);
    });
  }

  ScriptedWorker worker_;
  RunningServer server_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

TEST_F(CallTest, SuccessPassesThrough) {
  EXPECT_THAT(Free(stub_.get(), CallOptions{}), IsOk());
  EXPECT_EQ(worker_.calls, 1);
}

TEST_F(CallTest, ACancellationGivesUpACallInFlightAndTheServerSeesIt) {
  worker_.hold = true;
  Cancellation cancellation;
  CallOptions options;
  options.idempotent = true;  // a cancelled call is not tried again
  options.cancellation = &cancellation;
  std::thread other([&] {
    while (worker_.calls == 0) absl::SleepFor(absl::Milliseconds(1));
    cancellation.Cancel();
  });
  const absl::Time start = absl::Now();
  EXPECT_THAT(Free(stub_.get(), options),
              StatusIs(absl::StatusCode::kCancelled));
  other.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));  // not the 20 s hold
  EXPECT_EQ(worker_.calls, 1);
  // The handler learns it, so it can stop its own work.
  for (int i = 0; i < 1000 && !worker_.saw_cancel; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(worker_.saw_cancel);
}

TEST_F(CallTest, ACallStartedAfterTheCancellationStopsAtOnce) {
  worker_.hold = true;
  Cancellation cancellation;
  cancellation.Cancel();
  CallOptions options;
  options.cancellation = &cancellation;
  EXPECT_THAT(Free(stub_.get(), options),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(CallTest, ServiceErrorKeepsItsCodeAndMessage) {
  worker_.reply = OutOfBoundsError("region 0:5 of shard 3");
  CallOptions options;
  options.idempotent = true;
  options.peer = "worker at here";
  EXPECT_THAT(Free(stub_.get(), options),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("region 0:5 of shard 3")));
  EXPECT_EQ(worker_.calls, 1);
}

TEST_F(CallTest, UnavailableRaisedByAServiceIsNotRetriedNorReworded) {
  // A service saying a worker is unavailable has answered: trying again or
  // calling the service itself unreachable would both be wrong.
  worker_.reply = UnavailableError("worker 'w3'");
  CallOptions options;
  options.idempotent = true;
  options.attempts = 5;
  options.peer = "coordinator at here";
  int attempts = 0;
  EXPECT_THAT(Free(stub_.get(), options, &attempts),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'w3' is unavailable")));
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(worker_.calls, 1);
}

TEST_F(CallTest, ServiceErrorsCarryDetailsTransportFailuresDoNot) {
  worker_.reply = UnavailableError("worker 'w3'");
  v1::FreeShardsRequest request;
  v1::FreeShardsResponse response;
  grpc::ClientContext answered;
  grpc::Status status = stub_->FreeShards(&answered, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(IsTransportFailure(status));

  server_.Stop(absl::ZeroDuration());
  grpc::ClientContext refused;
  SetDeadline(&refused, absl::Seconds(5));
  status = stub_->FreeShards(&refused, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(IsTransportFailure(status));
}

TEST_F(CallTest, TheMarkSurvivesConversionAndAnnotation) {
  worker_.reply = UnavailableError("worker 'w3'");
  v1::FreeShardsRequest request;
  v1::FreeShardsResponse response;
  grpc::ClientContext answered;
  const absl::Status service =
      FromGrpcStatus(stub_->FreeShards(&answered, request, &response));
  EXPECT_FALSE(IsTransportFailure(service));

  server_.Stop(absl::ZeroDuration());
  int attempts = 0;
  const absl::Status refused = RetryTransportFailures([&] {
    ++attempts;
    grpc::ClientContext context;
    return Annotate(
        FromGrpcStatus(stub_->FreeShards(&context, request, &response)),
        "reading shard 3");
  });
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable,
                                HasSubstr("reading shard 3")));
  EXPECT_TRUE(IsTransportFailure(refused));
  EXPECT_EQ(attempts, 3);
}

TEST_F(CallTest, IdempotentCallIsTriedAgainWhileThePeerCannotBeReached) {
  server_.Stop(absl::ZeroDuration());
  CallOptions options;
  options.idempotent = true;
  options.attempts = 3;
  options.backoff = absl::Milliseconds(1);
  options.peer = "worker at 127.0.0.1:1";
  int attempts = 0;
  EXPECT_THAT(Free(stub_.get(), options, &attempts),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker at 127.0.0.1:1 is unavailable")));
  EXPECT_EQ(attempts, 3);
}

TEST_F(CallTest, NonIdempotentCallIsTriedOnce) {
  server_.Stop(absl::ZeroDuration());
  CallOptions options;
  options.attempts = 3;
  int attempts = 0;
  EXPECT_THAT(Free(stub_.get(), options, &attempts),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(attempts, 1);
}

TEST_F(CallTest, UnreachableWordingIsTheCallers) {
  server_.Stop(absl::ZeroDuration());
  CallOptions options;
  options.unreachable = [](const grpc::Status&) {
    return absl::UnavailableError("cannot reach the coordinator at X");
  };
  EXPECT_THAT(Free(stub_.get(), options),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot reach the coordinator at X")));
}

TEST_F(CallTest, ExpiredDeadlineNamesThePeer) {
  // The deadline is gRPC's own: it passes before the call is made.
  CallOptions options;
  options.timeout = absl::Milliseconds(1);
  options.peer = "worker at slow";
  v1::FreeShardsRequest request;
  v1::FreeShardsResponse response;
  absl::Status status = Call(options, [&](grpc::ClientContext* context) {
    absl::SleepFor(absl::Milliseconds(5));
    return stub_->FreeShards(context, request, &response);
  });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("worker at slow is unavailable")));
}

}  // namespace
}  // namespace tessera
