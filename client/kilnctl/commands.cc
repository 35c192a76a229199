#include "client/kilnctl/commands.h"

#include <stdio.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <ostream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/kilnctl/format.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kiln/v1/admin.grpc.pb.h"

namespace kiln::kilnctl {
namespace {

using kiln::v1::Admin;

void SetDeadline(const Context& ctx, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + ctx.timeout);
}

// Prints the failure of an RPC and returns the exit code for it.
int Fail(const Context& ctx, const std::string& what, const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    *ctx.err << "kilnctl: no kilnd answers at " << ctx.server << " (" << status.error_message()
             << "); start one, or point --server / KILN_SERVER at it\n";
    return kExitUnreachable;
  }
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    *ctx.err << "kilnctl: " << what << ": no answer from " << ctx.server << " within "
             << ctx.timeout.count() << " ms (raise --timeout)\n";
    return kExitUnreachable;
  }
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  int code = static_cast<int>(status.error_code());
  *ctx.err << "kilnctl: " << what << " failed: " << status.error_message() << " ("
           << (code >= 0 && code <= 16 ? kNames[code] : "?") << ")\n";
  return kExitServerError;
}

int Usage(const Context& ctx, const std::string& message) {
  *ctx.err << "kilnctl: " << message << "\n";
  return kExitUsage;
}

void PrintJson(const Context& ctx, const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  *ctx.out << json;
  if (json.empty() || json.back() != '\n') *ctx.out << "\n";
}

std::string TargetString(const kiln::v1::Target& t) {
  switch (t.device()) {
    case kiln::v1::DEVICE_KIND_CPU: return absl::StrCat("cpu:", t.cpu_isa());
    case kiln::v1::DEVICE_KIND_CUDA: return absl::StrCat("cuda:", t.cuda_arch());
    default: return "?";
  }
}

bool LooksLikeKeyPrefix(const std::string& key) {
  if (key.empty() || key.size() > 64) return false;
  for (char c : key) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

// Resolves a key or a unique key prefix (at least 6 hex digits) to a full key.
absl::StatusOr<std::string> ResolveKey(const Context& ctx, const std::string& key, int* exit_code) {
  *exit_code = kExitUsage;
  if (!LooksLikeKeyPrefix(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' is not a key: keys are 64 lowercase hex digits"));
  }
  if (key.size() == 64) return key;
  if (key.size() < 6) {
    return absl::InvalidArgumentError("give at least 6 hex digits of a key");
  }
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  kiln::v1::ListEntriesRequest request;
  request.set_key_prefix(key);
  request.set_limit(2);
  kiln::v1::ListEntriesResponse response;
  grpc::Status s = stub->ListEntries(&context, request, &response);
  if (!s.ok()) {
    *exit_code = Fail(ctx, "looking up the key prefix", s);
    return absl::UnknownError("reported");
  }
  *exit_code = kExitServerError;
  if (response.entries_size() == 0) {
    return absl::NotFoundError(absl::StrCat("no cached entry has a key starting with ", key));
  }
  if (response.entries_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prefix ", key, " matches several entries; give more digits"));
  }
  return response.entries(0).key();
}

}  // namespace

int CmdHealth(const Context& ctx, const Args&) {
  auto stub = grpc::health::v1::Health::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  if (!s.ok()) return Fail(ctx, "health check", s);
  std::string status = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (ctx.json) {
    *ctx.out << "{\"server\": \"" << ctx.server << "\", \"status\": \"" << status << "\"}\n";
  } else {
    *ctx.out << ctx.server << ": " << status << "\n";
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                              : kExitServerError;
}

int CmdStats(const Context& ctx, const Args&) {
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  kiln::v1::Stats stats;
  grpc::Status s = stub->GetStats(&context, kiln::v1::GetStatsRequest(), &stats);
  if (!s.ok()) return Fail(ctx, "stats", s);
  if (ctx.json) {
    PrintJson(ctx, stats);
    return kExitOk;
  }
  Table table({"FIELD", "VALUE"});
  table.AddRow({"server", absl::StrCat(ctx.server, " (kilnd ", stats.server_version(), ")")});
  table.AddRow({"uptime", absl::FormatDuration(absl::Seconds(stats.uptime_seconds()))});
  table.AddRow({"cache dir", stats.cache_dir()});
  table.AddRow({"entries", absl::StrCat(stats.entries())});
  table.AddRow({"cache bytes", stats.cache_max_bytes() > 0
                                   ? absl::StrCat(HumanBytes(stats.cache_bytes()), " of ",
                                                  HumanBytes(stats.cache_max_bytes()))
                                   : HumanBytes(stats.cache_bytes())});
  table.AddRow({"evictions", absl::StrCat(stats.evictions())});
  table.AddRow({"corruptions found", absl::StrCat(stats.corruptions())});
  table.AddRow({"compiles in flight", absl::StrCat(stats.compiles_in_flight())});
  table.AddRow({"compiles queued", absl::StrCat(stats.compiles_queued())});
  table.AddRow({"workers", absl::StrCat(stats.workers())});
  std::map<std::string, int64_t> requests(stats.requests().begin(), stats.requests().end());
  for (const auto& [outcome, count] : requests) {
    table.AddRow({absl::StrCat("requests: ", outcome), absl::StrCat(count)});
  }
  *ctx.out << table.Render();
  return kExitOk;
}

int CmdLs(const Context& ctx, const Args& args) {
  kiln::v1::ListEntriesRequest request;
  static const std::map<std::string, kiln::v1::ListEntriesRequest::SortBy> kSort = {
      {"last_hit", kiln::v1::ListEntriesRequest::SORT_BY_LAST_HIT},
      {"created", kiln::v1::ListEntriesRequest::SORT_BY_CREATED},
      {"size", kiln::v1::ListEntriesRequest::SORT_BY_SIZE},
      {"hits", kiln::v1::ListEntriesRequest::SORT_BY_HITS}};
  if (auto it = args.options.find("sort"); it != args.options.end()) {
    auto sort = kSort.find(it->second);
    if (sort == kSort.end()) {
      return Usage(ctx, absl::StrCat("--sort=", it->second,
                                     ": sort by last_hit, created, size or hits"));
    }
    request.set_sort_by(sort->second);
  }
  request.set_ascending(args.options.count("asc") > 0);
  if (auto it = args.options.find("limit"); it != args.options.end()) {
    int limit = 0;
    if (!absl::SimpleAtoi(it->second, &limit) || limit <= 0) {
      return Usage(ctx, "--limit takes a positive number");
    }
    request.set_limit(limit);
  }
  if (auto it = args.options.find("prefix"); it != args.options.end()) {
    request.set_key_prefix(it->second);
  }
  if (auto it = args.options.find("device"); it != args.options.end()) {
    if (it->second == "cpu") {
      request.set_device(kiln::v1::DEVICE_KIND_CPU);
    } else if (it->second == "cuda") {
      request.set_device(kiln::v1::DEVICE_KIND_CUDA);
    } else {
      return Usage(ctx, "--device takes cpu or cuda");
    }
  }
  if (auto it = args.options.find("min_size"); it != args.options.end()) {
    int64_t min_size = 0;
    if (!absl::SimpleAtoi(it->second, &min_size) || min_size < 0) {
      return Usage(ctx, "--min_size takes a number of bytes");
    }
    request.set_min_size_bytes(min_size);
  }
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  kiln::v1::ListEntriesResponse response;
  grpc::Status s = stub->ListEntries(&context, request, &response);
  if (!s.ok()) return Fail(ctx, "ls", s);
  if (ctx.json) {
    PrintJson(ctx, response);
    return kExitOk;
  }
  const bool wide = args.options.count("wide") > 0;
  Table table({"KEY", "SIZE", "CREATED", "LAST HIT", "HITS", "TARGET", "GRAPH"});
  for (const kiln::v1::EntrySummary& e : response.entries()) {
    table.AddRow({wide ? e.key() : e.key().substr(0, 16), HumanBytes(e.size_bytes()),
                  HumanTime(e.created_unix_ms()), HumanTime(e.last_hit_unix_ms()),
                  absl::StrCat(e.hits()), TargetString(e.target()),
                  e.debug_name().empty() ? e.graph_summary()
                                         : absl::StrCat(e.debug_name(), ": ", e.graph_summary())});
  }
  *ctx.out << table.Render();
  *ctx.out << response.entries_size() << " of " << response.total() << " entries shown\n";
  return kExitOk;
}

int CmdShow(const Context& ctx, const Args& args) {
  if (args.positional.size() != 1) return Usage(ctx, "show takes one KEY (see show --help)");
  int code = 0;
  absl::StatusOr<std::string> key = ResolveKey(ctx, args.positional[0], &code);
  if (!key.ok()) {
    if (key.status().code() != absl::StatusCode::kUnknown) {
      *ctx.err << "kilnctl: " << key.status().message() << "\n";
    }
    return code;
  }
  kiln::v1::GetEntryRequest request;
  request.set_key(*key);
  const bool all = args.options.empty();
  request.set_include_graph(all || args.options.count("graph"));
  request.set_include_source(args.options.count("source"));
  request.set_include_plan(all || args.options.count("plan"));
  request.set_include_log(args.options.count("log"));
  request.set_include_timings(all || args.options.count("timings"));
  request.set_include_key_record(args.options.count("key_record"));
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  kiln::v1::Entry entry;
  grpc::Status s = stub->GetEntry(&context, request, &entry);
  if (!s.ok()) return Fail(ctx, "show", s);
  if (ctx.json) {
    PrintJson(ctx, entry);
    return kExitOk;
  }
  const kiln::v1::EntrySummary& e = entry.summary();
  Table table({"FIELD", "VALUE"});
  table.AddRow({"key", e.key()});
  table.AddRow({"size", HumanBytes(e.size_bytes())});
  table.AddRow({"created", HumanTime(e.created_unix_ms())});
  table.AddRow({"last hit", HumanTime(e.last_hit_unix_ms())});
  table.AddRow({"hits", absl::StrCat(e.hits())});
  table.AddRow({"target", TargetString(e.target())});
  table.AddRow({"graph", e.graph_summary()});
  if (!e.debug_name().empty()) table.AddRow({"name", e.debug_name()});
  if (entry.package_bytes() > 0) {
    // A package (Compiler.PutPackage): opaque client data, nothing else to show.
    table.AddRow({"package", absl::StrCat(HumanBytes(entry.package_bytes()), " (",
                                          entry.package_bytes(), " bytes) of opaque client data")});
    *ctx.out << table.Render();
    *ctx.out << "\n(a package stored by kiln.compile: it has no graph, plan, sources, log or key "
                "record)\n";
    return kExitOk;
  }
  *ctx.out << table.Render();
  if (request.include_timings() && entry.timings_size() > 0) {
    Table timings({"PHASE", "TIME"});
    for (const auto& t : entry.timings()) timings.AddRow({t.phase(), HumanMicros(t.micros())});
    *ctx.out << "\n" << timings.Render();
  }
  if (request.include_graph()) *ctx.out << "\n--- graph ---\n" << entry.graph_text() << "\n";
  if (request.include_plan()) *ctx.out << "\n--- plan ---\n" << entry.plan().DebugString();
  if (request.include_source()) {
    for (const auto& src : entry.sources()) {
      *ctx.out << "\n--- source: " << src.name() << " ---\n" << src.text() << "\n";
    }
    if (entry.sources_size() == 0) {
      *ctx.out << "\n--- source ---\n(not kept: the client compiled without keep_source)\n";
    }
  }
  if (request.include_log()) *ctx.out << "\n--- compile log ---\n" << entry.compile_log() << "\n";
  if (request.include_key_record()) {
    Table record({"HASHED FIELD", "VALUE"});
    for (const auto& f : entry.key_record()) record.AddRow({f.path(), f.value()});
    *ctx.out << "\n" << record.Render();
  }
  return kExitOk;
}

int CmdEvict(const Context& ctx, const Args& args) {
  if (args.positional.size() != 1) return Usage(ctx, "evict takes one KEY");
  int code = 0;
  absl::StatusOr<std::string> key = ResolveKey(ctx, args.positional[0], &code);
  if (!key.ok()) {
    if (key.status().code() != absl::StatusCode::kUnknown) {
      *ctx.err << "kilnctl: " << key.status().message() << "\n";
    }
    return code;
  }
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  kiln::v1::EvictRequest request;
  request.set_key(*key);
  kiln::v1::EvictResponse response;
  grpc::Status s = stub->Evict(&context, request, &response);
  if (!s.ok()) return Fail(ctx, "evict", s);
  if (ctx.json) {
    PrintJson(ctx, response);
  } else {
    *ctx.out << "evicted " << *key << " (" << HumanBytes(response.freed_bytes()) << " freed)\n";
  }
  return kExitOk;
}

int CmdPurge(const Context& ctx, const Args& args) {
  kiln::v1::PurgeRequest request;
  bool all = args.options.count("all") > 0;
  auto older = args.options.find("older_than");
  if (all == (older != args.options.end())) {
    return Usage(ctx, "purge takes exactly one of --all or --older_than=DURATION");
  }
  request.set_all(all);
  if (!all) {
    absl::StatusOr<absl::Duration> age = ParseAge(older->second);
    if (!age.ok()) return Usage(ctx, std::string(age.status().message()));
    request.set_older_than_seconds(absl::ToInt64Seconds(*age));
  }
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  SetDeadline(ctx, &context);
  kiln::v1::PurgeResponse response;
  grpc::Status s = stub->Purge(&context, request, &response);
  if (!s.ok()) return Fail(ctx, "purge", s);
  if (ctx.json) {
    PrintJson(ctx, response);
  } else {
    *ctx.out << "purged " << response.removed() << " entries (" << HumanBytes(response.freed_bytes())
             << " freed)\n";
  }
  return kExitOk;
}

int CmdVerify(const Context& ctx, const Args&) {
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30 * ctx.timeout);
  kiln::v1::VerifyResponse response;
  grpc::Status s = stub->Verify(&context, kiln::v1::VerifyRequest(), &response);
  if (!s.ok()) return Fail(ctx, "verify", s);
  if (ctx.json) {
    PrintJson(ctx, response);
  } else {
    *ctx.out << "checked " << response.checked() << " entries: " << response.ok() << " ok, "
             << response.corrupt_keys_size() << " corrupt\n";
    for (const std::string& key : response.corrupt_keys()) {
      *ctx.out << "  removed corrupt entry " << key << "\n";
    }
  }
  return response.corrupt_keys_size() > 0 ? kExitCorruptFound : kExitOk;
}

int CmdExport(const Context& ctx, const Args& args) {
  if (args.positional.empty()) return Usage(ctx, "export takes FILE [KEY...]");
  const std::string& path = args.positional[0];
  kiln::v1::ExportRequest request;
  for (size_t i = 1; i < args.positional.size(); ++i) {
    int code = 0;
    absl::StatusOr<std::string> key = ResolveKey(ctx, args.positional[i], &code);
    if (!key.ok()) {
      if (key.status().code() != absl::StatusCode::kUnknown) {
        *ctx.err << "kilnctl: " << key.status().message() << "\n";
      }
      return code;
    }
    request.add_keys(*key);
  }
  std::string tmp = absl::StrCat(path, ".kilnctl-tmp.", getpid());
  std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
  if (!file) return Usage(ctx, absl::StrCat("cannot write ", path));
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 60 * ctx.timeout);
  auto reader = stub->Export(&context, request);
  kiln::v1::BundleChunk chunk;
  int64_t bytes = 0;
  while (reader->Read(&chunk)) {
    file.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    bytes += static_cast<int64_t>(chunk.data().size());
  }
  grpc::Status s = reader->Finish();
  file.close();
  if (!s.ok() || !file) {
    unlink(tmp.c_str());
    if (!s.ok()) return Fail(ctx, "export", s);
    return Usage(ctx, absl::StrCat("writing ", path, " failed"));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return Usage(ctx, absl::StrCat("cannot rename the bundle to ", path));
  }
  if (ctx.json) {
    *ctx.out << "{\"file\": \"" << path << "\", \"bytes\": " << bytes << "}\n";
  } else {
    *ctx.out << "exported " << HumanBytes(bytes) << " to " << path << "\n";
  }
  return kExitOk;
}

int CmdImport(const Context& ctx, const Args& args) {
  if (args.positional.size() != 1) return Usage(ctx, "import takes one FILE");
  std::ifstream file(args.positional[0], std::ios::binary);
  if (!file) return Usage(ctx, absl::StrCat("cannot read ", args.positional[0]));
  auto stub = Admin::NewStub(ctx.channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 60 * ctx.timeout);
  kiln::v1::ImportResponse response;
  auto writer = stub->Import(&context, &response);
  std::string buffer(1 << 20, '\0');
  while (file) {
    file.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    std::streamsize n = file.gcount();
    if (n <= 0) break;
    kiln::v1::BundleChunk chunk;
    chunk.set_data(buffer.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;  // the server ended the call; Finish says why
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) return Fail(ctx, "import", s);
  if (ctx.json) {
    PrintJson(ctx, response);
  } else {
    *ctx.out << "imported " << response.imported() << " entries, skipped " << response.skipped()
             << " already present, rejected " << response.rejected() << "\n";
  }
  return response.rejected() > 0 ? kExitServerError : kExitOk;
}

int CmdExplainMiss(const Context& ctx, const Args& args) {
  if (args.positional.size() != 2) return Usage(ctx, "explain-miss takes KEY_A KEY_B");
  std::map<std::string, std::string> fields[2];
  std::vector<std::string> order;
  std::set<std::string> seen;
  std::string keys[2];
  auto stub = Admin::NewStub(ctx.channel);
  for (int i = 0; i < 2; ++i) {
    int code = 0;
    absl::StatusOr<std::string> key = ResolveKey(ctx, args.positional[i], &code);
    if (!key.ok()) {
      if (key.status().code() != absl::StatusCode::kUnknown) {
        *ctx.err << "kilnctl: " << key.status().message() << "\n";
      }
      return code;
    }
    keys[i] = *key;
    grpc::ClientContext context;
    SetDeadline(ctx, &context);
    kiln::v1::GetEntryRequest request;
    request.set_key(*key);
    request.set_include_key_record(true);
    kiln::v1::Entry entry;
    grpc::Status s = stub->GetEntry(&context, request, &entry);
    if (!s.ok()) return Fail(ctx, absl::StrCat("reading the key record of ", *key), s);
    if (entry.package_bytes() > 0) {
      *ctx.err << "kilnctl: " << *key
               << " is a package (kiln.compile's data): it has no key record to compare\n";
      return kExitUsage;
    }
    for (const auto& f : entry.key_record()) {
      fields[i][f.path()] = f.value();
      if (seen.insert(f.path()).second) order.push_back(f.path());
    }
  }
  std::vector<std::vector<std::string>> diffs;
  for (const std::string& path : order) {
    auto a = fields[0].find(path);
    auto b = fields[1].find(path);
    std::string va = a == fields[0].end() ? "(absent)" : a->second;
    std::string vb = b == fields[1].end() ? "(absent)" : b->second;
    if (va != vb) diffs.push_back({path, va, vb});
  }
  if (ctx.json) {
    *ctx.out << "{\"key_a\": \"" << keys[0] << "\", \"key_b\": \"" << keys[1]
             << "\", \"differences\": [";
    for (size_t i = 0; i < diffs.size(); ++i) {
      kiln::v1::KeyField a, b;
      std::string ja, jb, jp;
      // Reuse the protobuf JSON printer for string escaping.
      a.set_value(diffs[i][1]);
      b.set_value(diffs[i][2]);
      a.set_path(diffs[i][0]);
      (void)google::protobuf::util::MessageToJsonString(a, &ja);
      (void)google::protobuf::util::MessageToJsonString(b, &jb);
      *ctx.out << (i ? ", " : "") << "{\"a\": " << ja << ", \"b\": " << jb << "}";
    }
    *ctx.out << "]}\n";
    return kExitOk;
  }
  if (diffs.empty()) {
    *ctx.out << "the two keys hash the same components with the same values"
             << (keys[0] == keys[1] ? "" : " (different format versions?)") << "\n";
    return kExitOk;
  }
  Table table({"HASHED FIELD", "KEY A " + keys[0].substr(0, 12), "KEY B " + keys[1].substr(0, 12)});
  for (auto& row : diffs) table.AddRow(row);
  *ctx.out << diffs.size() << " hashed components differ:\n" << table.Render();
  return kExitOk;
}

}  // namespace kiln::kilnctl
