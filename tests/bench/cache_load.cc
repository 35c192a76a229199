// cache_load: a load generator for kilnd's cache-hit path. Prints a table; asserts nothing.
//
// For each artifact size it makes a small graph, asks kilnd for the graph's key (Lookup), and puts
// an entry of that size under the key through Admin.Import, the same verified path `kilnctl
// import` uses (the server recomputes the key from the stored request). The artifact's payload is
// random bytes of the stated size: this measures serving a cached artifact of that size, not a
// compile. Then, for each concurrency, that many threads send Lookup for the key over one channel
// for --duration, and the tool reports throughput, client-side latency and the server's own
// handling time (the "total" phase of each reply).

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/admin.grpc.pb.h"
#include "kiln/v1/compiler.grpc.pb.h"
#include "server/bundle.h"
#include "server/cache/entry_record.h"
#include "server/cache_entry.h"

ABSL_FLAG(std::string, server, "127.0.0.1:7878", "kilnd address");
ABSL_FLAG(std::string, sizes, "10240,1048576", "artifact sizes in bytes, comma-separated");
ABSL_FLAG(std::string, concurrency, "1,16,64", "concurrent callers, comma-separated");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(3), "how long each cell of the table runs");

namespace kiln {
namespace {

kiln::v1::CompileRequest MakeRequest(int variant) {
  kiln::v1::CompileRequest req;
  req.mutable_target()->set_device(kiln::v1::DEVICE_KIND_CPU);
  req.mutable_target()->set_cpu_isa("x86-64-v2");
  kiln::v1::Graph* g = req.mutable_graph();
  g->set_debug_name(absl::StrCat("cache_load variant ", variant));
  auto* x = g->add_nodes();
  x->set_name("x");
  x->set_op(kiln::v1::Node::OP_PLACEHOLDER);
  x->set_target("x");
  auto* meta = x->mutable_meta()->mutable_tensor();
  meta->set_dtype(kiln::v1::DTYPE_FLOAT32);
  meta->add_sizes()->set_constant(variant + 1);  // a distinct graph (and key) per variant
  meta->add_sizes()->set_constant(64);
  meta->add_strides()->set_constant(64);
  meta->add_strides()->set_constant(1);
  meta->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
  auto* relu = g->add_nodes();
  relu->set_name("relu");
  relu->set_op(kiln::v1::Node::OP_CALL_FUNCTION);
  relu->set_target("aten.relu.default");
  relu->add_args()->set_node("x");
  *relu->mutable_meta() = x->meta();
  auto* out = g->add_nodes();
  out->set_name("output");
  out->set_op(kiln::v1::Node::OP_OUTPUT);
  out->add_args()->mutable_list()->add_items()->set_node("relu");
  return req;
}

bool Check(const grpc::Status& s, const char* what) {
  if (!s.ok()) fprintf(stderr, "cache_load: %s failed: %s\n", what, s.error_message().c_str());
  return s.ok();
}

// Puts an entry whose artifact carries `size` bytes under the request's key. Returns the key.
std::string Prepare(const std::shared_ptr<grpc::Channel>& channel,
                    const kiln::v1::CompileRequest& request, int64_t size) {
  auto compiler = kiln::v1::Compiler::NewStub(channel);
  grpc::ClientContext lookup_context;
  kiln::v1::CompileResponse lookup;
  if (!Check(compiler->Lookup(&lookup_context, request, &lookup), "Lookup")) return "";
  if (lookup.source() != kiln::v1::CACHE_SOURCE_MISS) return lookup.key();  // already there

  kiln::v1::Artifact artifact;
  artifact.set_format_version(kArtifactFormatVersion);
  *artifact.mutable_target() = request.target();
  kiln::v1::Binary* binary = artifact.add_binaries();
  binary->set_kind(kiln::v1::Binary::KIND_SHARED_OBJECT);
  binary->set_compiler("cache_load synthetic payload");
  std::string payload(static_cast<size_t>(size), '\0');
  std::mt19937_64 rng(size);
  for (char& c : payload) c = static_cast<char>(rng());
  binary->set_data(payload);
  artifact.set_checksum(ArtifactChecksum(artifact));
  cache::EntryRecord record;
  record.artifact = artifact.SerializeAsString();
  record.sections.push_back({"request", request.SerializeAsString()});
  kiln::v1::EntrySummary summary;
  summary.set_key(lookup.key());
  *summary.mutable_target() = request.target();
  summary.set_graph_summary(absl::StrCat("synthetic ", size, "-byte artifact (cache_load)"));
  summary.set_debug_name(request.graph().debug_name());
  std::string bundle =
      BundleHeader() + BundleEntry(summary, cache::EncodeEntryRecord(record)) + BundleEnd();

  auto admin = kiln::v1::Admin::NewStub(channel);
  grpc::ClientContext import_context;
  kiln::v1::ImportResponse imported;
  auto writer = admin->Import(&import_context, &imported);
  for (size_t at = 0; at < bundle.size(); at += 1 << 20) {
    kiln::v1::BundleChunk chunk;
    chunk.set_data(bundle.substr(at, 1 << 20));
    writer->Write(chunk);
  }
  writer->WritesDone();
  if (!Check(writer->Finish(), "Import")) return "";
  if (imported.imported() != 1) {
    fprintf(stderr, "cache_load: the server rejected the entry (%lld rejected)\n",
            static_cast<long long>(imported.rejected()));
    return "";
  }
  return lookup.key();
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

struct Cell {
  int64_t requests = 0;
  int64_t errors = 0;
  double seconds = 0;
  std::vector<double> client_us;
  std::vector<double> server_us;
};

Cell RunCell(const std::shared_ptr<grpc::Channel>& channel, const std::string& request_bytes,
             int concurrency, absl::Duration duration) {
  Cell cell;
  absl::Mutex mu;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  absl::Time start = absl::Now();
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      grpc::GenericStub stub(channel);
      std::vector<double> client, server;
      int64_t n = 0, errors = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        grpc::Slice slice(request_bytes);
        grpc::ByteBuffer req(&slice, 1), resp;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        grpc::Status status;
        absl::Notification done;
        absl::Time t0 = absl::Now();
        stub.UnaryCall(&context, "/kiln.v1.Compiler/Lookup", grpc::StubOptions(), &req, &resp,
                       [&](grpc::Status s) {
                         status = std::move(s);
                         done.Notify();
                       });
        done.WaitForNotification();
        client.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
        ++n;
        if (!status.ok()) {
          ++errors;
          continue;
        }
        if (n % 4 == 1) {  // parse a sample of replies for the server's own timing
          kiln::v1::CompileResponse reply;
          if (grpc::SerializationTraits<kiln::v1::CompileResponse>::Deserialize(&resp, &reply).ok()) {
            if (reply.source() == kiln::v1::CACHE_SOURCE_MISS) ++errors;
            for (const auto& t : reply.timings()) {
              if (t.phase() == "total") server.push_back(static_cast<double>(t.micros()));
            }
          }
        }
      }
      absl::MutexLock lock(&mu);
      cell.requests += n;
      cell.errors += errors;
      cell.client_us.insert(cell.client_us.end(), client.begin(), client.end());
      cell.server_us.insert(cell.server_us.end(), server.begin(), server.end());
    });
  }
  absl::SleepFor(duration);
  stop = true;
  for (auto& t : threads) t.join();
  cell.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return cell;
}

int Main() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server),
                                           grpc::InsecureChannelCredentials(), args);
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      fprintf(stderr, "cache_load: bad --sizes entry '%s'\n", std::string(s).c_str());
      return 2;
    }
    sizes.push_back(v);
  }
  std::vector<int> levels;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      fprintf(stderr, "cache_load: bad --concurrency entry '%s'\n", std::string(s).c_str());
      return 2;
    }
    levels.push_back(v);
  }
  printf("%-10s %6s %9s %10s %11s %11s %11s %11s %7s\n", "artifact", "conc", "requests",
         "hits/s", "client p50", "client p99", "server p50", "server p99", "errors");
  for (size_t i = 0; i < sizes.size(); ++i) {
    kiln::v1::CompileRequest request = MakeRequest(static_cast<int>(i) + 1000);
    if (Prepare(channel, request, sizes[i]).empty()) return 1;
    std::string request_bytes = request.SerializeAsString();
    for (int level : levels) {
      Cell c = RunCell(channel, request_bytes, level, absl::GetFlag(FLAGS_duration));
      std::string size_name = sizes[i] >= (1 << 20) ? absl::StrCat(sizes[i] >> 20, " MiB")
                                                    : absl::StrCat(sizes[i] >> 10, " KiB");
      printf("%-10s %6d %9lld %10.0f %8.0f us %8.0f us %8.0f us %8.0f us %7lld\n",
             size_name.c_str(), level, static_cast<long long>(c.requests), c.requests / c.seconds,
             Percentile(c.client_us, 0.5), Percentile(c.client_us, 0.99),
             Percentile(c.server_us, 0.5), Percentile(c.server_us, 0.99),
             static_cast<long long>(c.errors));
      fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kiln::Main();
}
