// End-to-end tests of the kilnd daemon: a real kilnd process, real gRPC clients.
// Startup and shutdown behaviour, health, reflection, limits, deadlines and malformed requests.

#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kiln/v1/admin.grpc.pb.h"
#include "kiln/v1/compiler.grpc.pb.h"
#include "tests/testing/kilnd_process.h"

namespace kiln {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::kiln::testing::ExitResult;
using ::kiln::testing::KilndProcess;
using ::kiln::testing::MakeTempDir;
using ::kiln::testing::RunKilndToExit;
using ::testing::HasSubstr;

std::unique_ptr<KilndProcess> StartOrDie(std::vector<std::string> args = {}) {
  auto p = KilndProcess::Start(std::move(args));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string ToString(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  (void)bb.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Sends raw bytes to a unary method and returns the status (and the reply bytes in `reply`).
grpc::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                      const std::string& request, absl::Duration timeout,
                      std::string* reply = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::ByteBuffer req = Bytes(request);
  grpc::ByteBuffer resp;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (reply != nullptr) *reply = ToString(resp);
  return status;
}

kiln::v1::CompileRequest SmallValidRequest() {
  kiln::v1::CompileRequest req;
  req.mutable_target()->set_device(kiln::v1::DEVICE_KIND_CPU);
  req.mutable_target()->set_cpu_isa("x86-64-v2");
  auto* x = req.mutable_graph()->add_nodes();
  x->set_name("x");
  x->set_op(kiln::v1::Node::OP_PLACEHOLDER);
  x->set_target("x");
  auto* meta = x->mutable_meta()->mutable_tensor();
  meta->set_dtype(kiln::v1::DTYPE_FLOAT32);
  meta->add_sizes()->set_constant(4);
  meta->add_strides()->set_constant(1);
  meta->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
  auto* out = req.mutable_graph()->add_nodes();
  out->set_name("output");
  out->set_op(kiln::v1::Node::OP_OUTPUT);
  out->add_args()->mutable_list()->add_items()->set_node("x");
  return req;
}

TEST(KilndTest, HelpExitsZeroAndExplainsTheFlags) {
  auto result = RunKilndToExit({"--help"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_THAT(result->stderr_text, HasSubstr("--listen"));
  EXPECT_THAT(result->stderr_text, HasSubstr("--cache_dir"));
  EXPECT_THAT(result->stderr_text, HasSubstr("--shutdown_grace_period"));
  EXPECT_THAT(result->stderr_text, HasSubstr("SIGTERM"));
  EXPECT_THAT(result->stderr_text, HasSubstr("kilnd: the kiln compile server"));
  EXPECT_THAT(result->stderr_text, Not(HasSubstr("UNKNOWN")));
}

TEST(KilndTest, ReportsServingOverTheHealthServiceOnTcpAndUnix) {
  for (const std::string listen : {"--listen=127.0.0.1:0", ""}) {
    std::vector<std::string> args;
    if (!listen.empty()) args.push_back(listen);
    auto kilnd = StartOrDie(args);
    ASSERT_NE(kilnd, nullptr);
    auto stub = grpc::health::v1::Health::NewStub(kilnd->Channel());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    HealthCheckResponse response;
    grpc::Status s = stub->Check(&context, HealthCheckRequest(), &response);
    ASSERT_TRUE(s.ok()) << kilnd->address() << ": " << s.error_message();
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << kilnd->address();
  }
}

TEST(KilndTest, ServesReflectionListingKilnServices) {
  auto kilnd = StartOrDie();
  ASSERT_NE(kilnd, nullptr);
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(kilnd->Channel());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&cq](int want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(want));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  // ServerReflectionRequest{list_services: "*"}: field 7, length-delimited.
  call->Write(Bytes(std::string("\x3a\x01*", 3)), reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  std::string text = ToString(reply);
  EXPECT_THAT(text, HasSubstr("kiln.v1.Compiler"));
  EXPECT_THAT(text, HasSubstr("kiln.v1.Admin"));
  EXPECT_THAT(text, HasSubstr("grpc.health.v1.Health"));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
}

TEST(KilndTest, MalformedRequestsGetInvalidArgument) {
  auto kilnd = StartOrDie();
  ASSERT_NE(kilnd, nullptr);
  // Bytes that are not a protobuf message at all (a truncated length-delimited field).
  grpc::Status garbage = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
                                  std::string("\x0a\xff\xff\x01garbage", 10), absl::Seconds(5));
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << garbage.error_message();
  EXPECT_THAT(garbage.error_message(), HasSubstr("not a valid kiln.v1.CompileRequest"));

  // A well-formed message with no graph.
  kiln::v1::CompileRequest empty;
  empty.mutable_target()->set_device(kiln::v1::DEVICE_KIND_CPU);
  grpc::Status no_graph = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Lookup",
                                   empty.SerializeAsString(), absl::Seconds(5));
  EXPECT_EQ(no_graph.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_graph.error_message(), HasSubstr("graph.nodes is empty"));

  // No target.
  kiln::v1::CompileRequest no_target = SmallValidRequest();
  no_target.clear_target();
  grpc::Status s = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
                            no_target.SerializeAsString(), absl::Seconds(5));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("target.device"));
}

TEST(KilndTest, CompilesForCpuAndForCudaWithoutAGpu) {
  auto kilnd = StartOrDie();
  ASSERT_NE(kilnd, nullptr);
  auto stub = kiln::v1::Compiler::NewStub(kilnd->Channel());
  kiln::v1::CompileResponse reply;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::Status s = stub->Compile(&context, SmallValidRequest(), &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.source(), kiln::v1::CACHE_SOURCE_COMPILED);
  EXPECT_EQ(reply.key().size(), 64u);
  EXPECT_EQ(reply.artifact().checksum().size(), 64u);

  // output = relu(x) on cuda, compiled for sm_90.
  kiln::v1::CompileRequest cuda = SmallValidRequest();
  kiln::v1::Graph* g = cuda.mutable_graph();
  g->mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CUDA);
  kiln::v1::Node output = g->nodes(1);
  kiln::v1::Node* relu = g->mutable_nodes(1);
  relu->Clear();
  relu->set_name("relu");
  relu->set_op(kiln::v1::Node::OP_CALL_FUNCTION);
  relu->set_target("aten.relu.default");
  relu->add_args()->set_node("x");
  *relu->mutable_meta() = g->nodes(0).meta();
  output.mutable_args(0)->mutable_list()->mutable_items(0)->set_node("relu");
  *g->add_nodes() = output;
  cuda.mutable_target()->set_device(kiln::v1::DEVICE_KIND_CUDA);
  cuda.mutable_target()->clear_cpu_isa();
  cuda.mutable_target()->set_cuda_arch("sm_90");
  kiln::v1::CompileResponse cuda_reply;
  grpc::ClientContext cuda_context;
  cuda_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::Status u = stub->Compile(&cuda_context, cuda, &cuda_reply);
  const char* nvrtc = getenv("KILN_NVRTC_PATH");
  if (nvrtc != nullptr && *nvrtc != '\0') {
    // kilnd finds the NVRTC worker beside it (Bazel's layout) and compiles for a GPU it lacks.
    ASSERT_TRUE(u.ok()) << u.error_message();
    EXPECT_NE(cuda_reply.key(), reply.key());
    ASSERT_GE(cuda_reply.artifact().binaries_size(), 1);
    EXPECT_EQ(cuda_reply.artifact().binaries(0).kind(), kiln::v1::Binary::KIND_CUBIN);
    EXPECT_THAT(cuda_reply.artifact().binaries(0).compiler(), HasSubstr("sm_90"));
  } else {
    EXPECT_EQ(u.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << u.error_message();
    EXPECT_THAT(u.error_message(), HasSubstr("CUDA"));
  }
}

TEST(KilndTest, OverLimitMessageGetsResourceExhausted) {
  auto kilnd = StartOrDie({"--max_receive_message_bytes=4096"});
  ASSERT_NE(kilnd, nullptr);
  kiln::v1::CompileRequest big = SmallValidRequest();
  big.mutable_graph()->set_debug_name(std::string(10000, 'x'));
  grpc::Status s = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
                            big.SerializeAsString(), absl::Seconds(5));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // The server is still healthy afterwards and answers a small request.
  grpc::Status small = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
                                SmallValidRequest().SerializeAsString(), absl::Seconds(5));
  EXPECT_TRUE(small.ok()) << small.error_message();
}

TEST(KilndTest, DeadlinesAreHonored) {
  auto kilnd = StartOrDie({"--debug_rpc_delay=3s"});
  ASSERT_NE(kilnd, nullptr);
  // Already expired when sent.
  grpc::Status expired = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
                                  SmallValidRequest().SerializeAsString(), absl::Milliseconds(-1));
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Expires while the server works on it: the answer comes at the deadline, not after the work.
  absl::Time start = absl::Now();
  grpc::Status late = RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
                               SmallValidRequest().SerializeAsString(), absl::Milliseconds(300));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The server noticed too: it counts the call as deadline_exceeded (asked until it has, up to
  // 3 s: on a loaded machine its cancellation callback may run later than the client's answer).
  auto admin = kiln::v1::Admin::NewStub(kilnd->Channel());
  kiln::v1::Stats stats;
  for (const absl::Time until = absl::Now() + absl::Seconds(3); absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(100));
    grpc::ClientContext context;
    ASSERT_TRUE(admin->GetStats(&context, kiln::v1::GetStatsRequest(), &stats).ok());
    if (stats.requests().count("deadline_exceeded") == 1u) break;
  }
  ASSERT_EQ(stats.requests().count("deadline_exceeded"), 1u);
  EXPECT_GE(stats.requests().at("deadline_exceeded"), 1);
}

TEST(KilndTest, SigtermDrainsASlowCallThenExitsZero) {
  auto kilnd = StartOrDie({"--debug_rpc_delay=1500ms", "--shutdown_grace_period=20s"});
  ASSERT_NE(kilnd, nullptr);
  auto channel = kilnd->Channel();

  // Watch health, to see NOT_SERVING the moment the signal arrives.
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext watch_context;
  auto watch = health->Watch(&watch_context, HealthCheckRequest());
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  grpc::Status slow_status;
  absl::Time slow_done;
  std::thread slow([&] {
    slow_status = RawUnary(channel, "/kiln.v1.Compiler/Compile",
                           SmallValidRequest().SerializeAsString(), absl::Seconds(15));
    slow_done = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));  // the call is in flight
  absl::Time signalled = absl::Now();
  kilnd->Signal(SIGTERM);

  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  absl::Time not_serving = absl::Now();
  EXPECT_LT(not_serving - signalled, absl::Milliseconds(900)) << "NOT_SERVING came late";

  // A new call during the drain is refused.
  grpc::Status refused = RawUnary(channel, "/kiln.v1.Compiler/Compile",
                                  SmallValidRequest().SerializeAsString(), absl::Seconds(5));
  // Refused by kilnd (UNAVAILABLE, draining) or, once gRPC's own shutdown runs, by gRPC
  // (CANCELLED); never processed.
  EXPECT_TRUE(refused.error_code() == grpc::StatusCode::UNAVAILABLE ||
              refused.error_code() == grpc::StatusCode::CANCELLED)
      << "a call after SIGTERM must not be accepted: " << refused.error_code() << " "
      << refused.error_message();

  slow.join();
  // The slow call completed normally (its answer, not a cancellation) after the signal.
  EXPECT_TRUE(slow_status.ok()) << slow_status.error_message();
  EXPECT_GT(slow_done, signalled);
  watch_context.TryCancel();

  auto result = kilnd->Wait(absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << result->stderr_text;
  EXPECT_THAT(result->stderr_text, HasSubstr("NOT_SERVING"));
}

TEST(KilndTest, SecondKilndOnTheSameAddressExitsWithAClearMessage) {
  auto first = StartOrDie({"--listen=127.0.0.1:0"});
  ASSERT_NE(first, nullptr);
  auto tcp = RunKilndToExit({"--listen=" + first->address(),
                             "--cache_dir=" + MakeTempDir("second") + "/cache"});
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_NE(tcp->exit_code, 0);
  EXPECT_EQ(tcp->signal, 0);
  EXPECT_THAT(tcp->stderr_text, HasSubstr("already in use"));

  auto unix_first = StartOrDie();
  ASSERT_NE(unix_first, nullptr);
  auto unix_second = RunKilndToExit({"--listen=" + unix_first->address(),
                                     "--cache_dir=" + MakeTempDir("second") + "/cache"});
  ASSERT_TRUE(unix_second.ok()) << unix_second.status();
  EXPECT_NE(unix_second->exit_code, 0);
  EXPECT_THAT(unix_second->stderr_text, HasSubstr("already in use"));
  // ... and the first one still serves.
  auto stub = grpc::health::v1::Health::NewStub(unix_first->Channel());
  grpc::ClientContext context;
  HealthCheckResponse response;
  EXPECT_TRUE(stub->Check(&context, HealthCheckRequest(), &response).ok());
}

TEST(KilndTest, StartupProblemsGiveOneClearLineAndNonZeroExit) {
  std::string dir = MakeTempDir("bad");
  std::string file = dir + "/a-file";
  ASSERT_EQ(system(("touch '" + file + "'").c_str()), 0);
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{"--cache_dir=" + file + "/cache"}, "cache dir"},
      {{"--cache_dir=/proc/kiln-cache"}, "cache dir"},
      {{"--listen=nonsense"}, "host:port"},
      {{"--log_format=xml"}, "log_format"},
      {{"--no_such_flag=1"}, "no_such_flag"},
      {{"--request_threads=0"}, "request_threads"},
      {{"--compile_timeout=0s"}, "--compile_timeout must be positive"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--listen=unix:" + dir + "/s.sock");
    if (absl::StartsWith(c.args[0], "--listen")) args.pop_back();
    auto result = RunKilndToExit(args);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_NE(result->exit_code, 0) << c.args[0];
    EXPECT_EQ(result->signal, 0) << c.args[0] << " crashed";
    EXPECT_THAT(result->stderr_text, HasSubstr(c.expect)) << c.args[0];
    std::vector<std::string> lines =
        absl::StrSplit(result->stderr_text, '\n', absl::SkipWhitespace());
    EXPECT_EQ(lines.size(), 1u) << c.args[0] << ":\n" << result->stderr_text;
  }
}

TEST(KilndTest, JsonLogsAreOneObjectPerLine) {
  auto kilnd = StartOrDie({"--log_format=json"});
  ASSERT_NE(kilnd, nullptr);
  RawUnary(kilnd->Channel(), "/kiln.v1.Compiler/Compile",
           "\x0a\xff\xff\x01 \"quoted\" garbage", absl::Seconds(5));
  kilnd->Signal(SIGTERM);
  auto result = kilnd->Wait(absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<std::string> lines =
      absl::StrSplit(result->stderr_text, '\n', absl::SkipWhitespace());
  ASSERT_GE(lines.size(), 3u);
  for (const std::string& line : lines) {
    EXPECT_TRUE(absl::StartsWith(line, "{\"ts\":\"") && absl::EndsWith(line, "\"}")) << line;
    EXPECT_THAT(line, HasSubstr("\"level\":\""));
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(KilndTest, IdleExitAfterWaitsForTheLastCall) {
  auto kilnd = StartOrDie({"--idle_exit_after=1500ms"});
  ASSERT_NE(kilnd, nullptr);
  // Keep it busy for a while: calls every 500 ms keep it alive past its idle limit.
  absl::Time start = absl::Now();
  for (int i = 0; i < 5; ++i) {
    auto admin = kiln::v1::Admin::NewStub(kilnd->Channel());
    grpc::ClientContext context;
    kiln::v1::Stats stats;
    ASSERT_TRUE(admin->GetStats(&context, kiln::v1::GetStatsRequest(), &stats).ok()) << i;
    absl::SleepFor(absl::Milliseconds(500));
  }
  absl::Time last_call = absl::Now();
  EXPECT_GT(last_call - start, absl::Milliseconds(2400));
  auto result = kilnd->Wait(absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  absl::Duration after_last = absl::Now() - last_call;
  EXPECT_EQ(result->exit_code, 0) << result->stderr_text;
  EXPECT_GE(after_last, absl::Milliseconds(900));  // ~1.5 s after the last call, minus our sleep
  EXPECT_LT(after_last, absl::Seconds(10));
  EXPECT_THAT(result->stderr_text, HasSubstr("--idle_exit_after"));
}

}  // namespace
}  // namespace kiln
