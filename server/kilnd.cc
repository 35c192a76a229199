// kilnd: the kiln compile server. See `kilnd --help`.
//
// Startup: parse flags -> configure logging -> check the cache dir and the listen address -> start
// gRPC (Compiler, Admin, health, reflection) -> wait for SIGTERM/SIGINT. Shutdown: health turns
// NOT_SERVING at once, new calls are refused, in-flight calls get --shutdown_grace_period to finish,
// then kilnd exits 0. A second signal exits at once with status 1. Any startup problem prints one
// line naming it and exits 2 (bad flag value) or 1 (environment).

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/admin_service.h"
#include "server/build_id.h"
#include "server/cache_dir.h"
#include "server/compiler_service.h"
#include "server/listen_address.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/packages.h"
#include "server/cache/local_cache.h"
#include "server/service_env.h"
#include "server/service_metrics.h"
#include "server/cache_entry.h"
#include "kernels/cpu/embedded_headers.h"
#include "kernels/cuda/embedded_headers.h"
#include "server/compiler/by_target.h"
#include "server/compiler/cuda_compiler.h"
#include "server/cache/encoding.h"
#include "server/compiler/cpu_compiler.h"
#include "server/toolchain/compiler.h"
#include "server/request_executor.h"
#include "server/server_stats.h"
#include "server/version.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7878",
          "Where to serve gRPC: host:port, [v6addr]:port, or unix:/absolute/path. A second "
          "kilnd on the same address refuses to start.");
ABSL_FLAG(std::string, cache_dir, "",
          "The on-disk cache directory (created if missing; must be writable). Default: "
          "$XDG_CACHE_HOME/kiln, else ~/.cache/kiln.");
ABSL_FLAG(std::string, log_format, "text",
          "Log format on stderr: 'text' for people, 'json' for one JSON object per line.");
ABSL_FLAG(std::string, log_level, "info", "Log level: trace, debug, info, warn, error or off.");
ABSL_FLAG(int64_t, max_receive_message_bytes, 256 << 20,
          "Largest request kilnd accepts, in bytes (a graph with its tensor constants). Larger "
          "requests get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_send_message_bytes, 256 << 20,
          "Largest reply kilnd sends, in bytes (an artifact with its binaries).");
ABSL_FLAG(int32_t, max_concurrent_streams, 256,
          "HTTP/2 MAX_CONCURRENT_STREAMS: concurrent calls per client connection.");
ABSL_FLAG(int32_t, request_threads, 4,
          "Threads that process Compile/Lookup and package calls (gRPC's own threads only move "
          "bytes).");
ABSL_FLAG(int32_t, max_queued_requests, 1024,
          "Calls waiting for a request thread; past this kilnd answers RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, shutdown_grace_period, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long in-flight calls get to finish before they are cancelled.");
ABSL_FLAG(int64_t, cache_max_bytes, int64_t{10} << 30,
          "Bound on the on-disk cache in bytes; least recently used entries are evicted past it.");
ABSL_FLAG(int64_t, memory_cache_max_bytes, int64_t{256} << 20,
          "Bound on the in-memory cache tier in bytes (0: no memory tier).");
ABSL_FLAG(int32_t, compile_workers, 4, "Compiles running at once.");
ABSL_FLAG(int32_t, max_queued_compiles, 256,
          "Distinct compiles waiting for a worker; past this Compile answers RESOURCE_EXHAUSTED "
          "with a retry hint.");
ABSL_FLAG(absl::Duration, negative_cache_ttl, absl::Seconds(30),
          "How long a failed compile is remembered, so that the same bad graph from many ranks "
          "is compiled once (0: off).");
ABSL_FLAG(int64_t, max_package_bytes, kiln::kDefaultMaxPackageBytes,
          "Largest package (Compiler.PutPackage: an opaque blob kiln.compile stores, a pickled "
          "AOT-compiled function) kilnd stores, in bytes; larger ones get RESOURCE_EXHAUSTED. "
          "Packages live in the cache tiers beside compiled artifacts, within the same bounds. "
          "0: packages are off (PutPackage/GetPackage answer FAILED_PRECONDITION). A package "
          "also travels in one message: --max_receive_message_bytes and "
          "--max_send_message_bytes bound it too.");
ABSL_FLAG(bool, no_compile, false,
          "Serve cached artifacts only: Compile answers a miss with UNIMPLEMENTED (the client runs "
          "that graph eagerly) instead of compiling. For cache-serving replicas and for prewarmed "
          "production fleets.");
ABSL_FLAG(std::string, cxx, "g++",
          "The C++ compiler for CPU targets (a name on PATH or a path; g++ or clang++). Each "
          "compile runs in its own process; its identity and version are part of every key.");
ABSL_FLAG(absl::Duration, compile_timeout, absl::Seconds(120),
          "Time limit of one compiler process; past it the compile fails (DEADLINE_EXCEEDED) "
          "and the client runs that graph eagerly.");
ABSL_FLAG(int64_t, compile_memory_limit_bytes, int64_t{4} << 30,
          "Address-space limit of one compiler process (RLIMIT_AS).");
ABSL_FLAG(std::string, nvrtc, "",
          "The NVRTC library for CUDA targets (path or soname). Empty: $KILN_NVRTC_PATH, else "
          "/usr/local/cuda/lib64/libnvrtc.so*, else libnvrtc.so.13 on the loader's path. No GPU is "
          "needed. Without NVRTC, kilnd still serves CPU targets and answers CUDA compiles with "
          "FAILED_PRECONDITION (the client runs those graphs eagerly). Its version is part of "
          "every CUDA key.");
ABSL_FLAG(std::string, nvrtc_worker, "",
          "The kiln_nvrtc_worker executable that runs each NVRTC compile in its own process. "
          "Empty: next to kilnd (as deploy/bundle.sh packs it), else Bazel's "
          "server/toolchain/kiln_nvrtc_worker beside bazel-bin/server/kilnd.");
ABSL_FLAG(int32_t, cpu_parallel_compiles, 0,
          "C++ compiler processes one CPU graph may use at once: its kernels are split into that "
          "many translation units, compiled in parallel and linked into one shared object. 0: the "
          "machine's cores, at most 16; 1: one translation unit per graph.");
ABSL_FLAG(int32_t, cuda_parallel_compiles, 0,
          "NVRTC processes one CUDA graph may use at once (its kernels are split into that many "
          "binaries when it has enough of them). 0: the machine's cores, at most 16.");
ABSL_FLAG(int64_t, max_graph_nodes, 200000, "Largest graph accepted, in nodes.");
ABSL_FLAG(int32_t, max_tensor_rank, 16, "Largest tensor rank accepted.");
ABSL_FLAG(int64_t, max_constant_bytes, int64_t{256} << 20,
          "Largest total size of a graph's tensor constants, in bytes.");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics (GET /metrics) and GET /healthz over HTTP at host:port. "
          "Empty: off.");
ABSL_FLAG(absl::Duration, idle_exit_after, absl::ZeroDuration(),
          "Exit (as on SIGTERM) after this long with no Compiler (Compile, Lookup, packages) or "
          "Admin call. 0: never. The embedded server that the Python client starts uses this.");
ABSL_FLAG(absl::Duration, debug_rpc_delay, absl::ZeroDuration(),
          "Fault injection for tests: every Compile/Lookup waits this long before it is "
          "processed. Leave at 0 in production.");

namespace kiln {
namespace {

constexpr int kExitEnvironment = 1;
constexpr int kExitUsage = 2;

[[noreturn]] void Die(int code, const std::string& message) {
  // One line, on stderr, whatever the log format: the operator reads it in a terminal or journal.
  fprintf(stderr, "kilnd: %s\n", message.c_str());
  fflush(stderr);
  _exit(code);
}

bool IsKilnFlagFile(absl::string_view file) { return absl::StrContains(file, "server/"); }

// --nvrtc_worker, else kiln_nvrtc_worker next to this executable (bundles), else Bazel's layout
// (bazel-bin/server/kilnd, bazel-bin/server/toolchain/kiln_nvrtc_worker).
std::string NvrtcWorkerPath(const std::string& flag) {
  if (!flag.empty()) return flag;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string dir(self, n);
  dir = dir.substr(0, dir.rfind('/'));
  for (const std::string& candidate : {dir + "/kiln_nvrtc_worker", dir + "/toolchain/kiln_nvrtc_worker"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return dir + "/kiln_nvrtc_worker";
}

std::string VersionString() {
  const std::string build = ProgramBuildId();
  return absl::StrCat("kilnd ", kKilnVersion, " (build ", build.empty() ? "unknown" : build, ")\n");
}

absl::Status CheckFlagValues() {
  if (absl::GetFlag(FLAGS_max_receive_message_bytes) <= 0 ||
      absl::GetFlag(FLAGS_max_receive_message_bytes) > INT32_MAX) {
    return absl::InvalidArgumentError("--max_receive_message_bytes must be in 1..2147483647");
  }
  if (absl::GetFlag(FLAGS_max_send_message_bytes) <= 0 ||
      absl::GetFlag(FLAGS_max_send_message_bytes) > INT32_MAX) {
    return absl::InvalidArgumentError("--max_send_message_bytes must be in 1..2147483647");
  }
  if (absl::GetFlag(FLAGS_max_concurrent_streams) < 1) {
    return absl::InvalidArgumentError("--max_concurrent_streams must be at least 1");
  }
  if (absl::GetFlag(FLAGS_request_threads) < 1 || absl::GetFlag(FLAGS_request_threads) > 1024) {
    return absl::InvalidArgumentError("--request_threads must be in 1..1024");
  }
  if (absl::GetFlag(FLAGS_cache_max_bytes) < (1 << 20)) {
    return absl::InvalidArgumentError("--cache_max_bytes must be at least 1 MiB");
  }
  if (absl::GetFlag(FLAGS_memory_cache_max_bytes) < 0) {
    return absl::InvalidArgumentError("--memory_cache_max_bytes must not be negative");
  }
  if (absl::GetFlag(FLAGS_compile_workers) < 1 || absl::GetFlag(FLAGS_compile_workers) > 256) {
    return absl::InvalidArgumentError("--compile_workers must be in 1..256");
  }
  if (absl::GetFlag(FLAGS_max_queued_compiles) < 1) {
    return absl::InvalidArgumentError("--max_queued_compiles must be at least 1");
  }
  if (absl::GetFlag(FLAGS_max_graph_nodes) < 1 || absl::GetFlag(FLAGS_max_tensor_rank) < 1 ||
      absl::GetFlag(FLAGS_max_constant_bytes) < 0) {
    return absl::InvalidArgumentError(
        "--max_graph_nodes and --max_tensor_rank must be positive, --max_constant_bytes not "
        "negative");
  }
  if (absl::GetFlag(FLAGS_max_queued_requests) < 1) {
    return absl::InvalidArgumentError("--max_queued_requests must be at least 1");
  }
  if (absl::GetFlag(FLAGS_compile_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--compile_timeout must be positive (the time one compiler process may take, e.g. 2m)");
  }
  if (absl::GetFlag(FLAGS_idle_exit_after) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--idle_exit_after must not be negative");
  }
  if (absl::GetFlag(FLAGS_max_package_bytes) < 0) {
    return absl::InvalidArgumentError(
        "--max_package_bytes must not be negative (0 turns packages off)");
  }
  if (absl::GetFlag(FLAGS_shutdown_grace_period) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown_grace_period must not be negative");
  }
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the kiln compile server.\n\n"
      "Serves kiln.v1.Compiler (Compile, Lookup, PutPackage, GetPackage) and kiln.v1.Admin over\n"
      "gRPC, with the standard grpc.health.v1 health service and server reflection. PyTorch\n"
      "clients use it through torch.compile(model, backend=\"kiln\") and kiln.compile;\n"
      "operators inspect it with kilnctl.\n\n"
      "Usage: kilnd [--listen=127.0.0.1:7878 | --listen=unix:/path] [--cache_dir=DIR] [flags]\n\n"
      "Stop it with SIGTERM or SIGINT: it turns NOT_SERVING, lets in-flight calls finish within\n"
      "--shutdown_grace_period and exits 0.");
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = IsKilnFlagFile;
  usage_config.contains_helpshort_flags = IsKilnFlagFile;
  usage_config.version_string = VersionString;
  absl::SetFlagsUsageConfig(usage_config);
  // Help opens with the program's name, which ParseCommandLine would set only later.
  absl::flags_internal::SetProgramInvocationName(argc > 0 ? argv[0] : "kilnd");
  // Abseil 20220623 exits 1 after --help; kilnd answers help itself, on stdout, and exits 0.
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull") {
      absl::flags_internal::FlagsHelp(std::cout, arg == "--helpfull" ? "" : "server/",
                                      absl::flags_internal::HelpFormat::kHumanReadable,
                                      absl::ProgramUsageMessage());
      std::cout << "\nMore: --helpfull lists every flag, including Abseil's own; --version.\n";
      return 0;
    }
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    Die(kExitUsage, absl::StrCat("unexpected argument '", positional[1],
                                 "'; kilnd takes only flags (see --help)"));
  }
  if (absl::Status s = CheckFlagValues(); !s.ok()) Die(kExitUsage, std::string(s.message()));
  if (absl::Status s = ConfigureLogging(absl::GetFlag(FLAGS_log_format),
                                        absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    Die(kExitUsage, std::string(s.message()));
  }

  absl::StatusOr<ListenAddress> address = ParseListenAddress(absl::GetFlag(FLAGS_listen));
  if (!address.ok()) Die(kExitUsage, std::string(address.status().message()));

  std::string cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (cache_dir.empty()) {
    absl::StatusOr<std::string> dir = DefaultCacheDir();
    if (!dir.ok()) Die(kExitEnvironment, std::string(dir.status().message()));
    cache_dir = *dir;
  }
  if (absl::Status s = EnsureWritableDir(cache_dir); !s.ok()) {
    Die(kExitEnvironment, std::string(s.message()));
  }

  if (absl::Status s = PrepareListenAddress(*address); !s.ok()) {
    Die(kExitEnvironment, std::string(s.message()));
  }

  // Signals are blocked in every thread and taken synchronously below with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  cache::LocalCacheOptions cache_options;
  cache_options.dir = cache_dir + "/artifacts";
  cache_options.disk_max_bytes = absl::GetFlag(FLAGS_cache_max_bytes);
  cache_options.memory_max_bytes = absl::GetFlag(FLAGS_memory_cache_max_bytes);
  absl::StatusOr<std::unique_ptr<cache::TieredCache>> tiers = cache::OpenLocalCache(cache_options);
  if (!tiers.ok()) Die(kExitEnvironment, std::string(tiers.status().message()));

  ServerStats stats;
  const int request_threads = absl::GetFlag(FLAGS_request_threads);
  RequestExecutor executor(request_threads, absl::GetFlag(FLAGS_max_queued_requests));
  cache::CompileSchedulerOptions scheduler_options;
  scheduler_options.workers = absl::GetFlag(FLAGS_compile_workers);
  scheduler_options.max_queued = absl::GetFlag(FLAGS_max_queued_compiles);
  scheduler_options.negative_ttl = absl::GetFlag(FLAGS_negative_cache_ttl);
  cache::CompileScheduler scheduler(scheduler_options);
  LatencyHistogram compile_latency;

  ServiceEnv env;
  env.stats = &stats;
  env.executor = &executor;
  env.cache = tiers->get();
  env.scheduler = &scheduler;
  env.compile_latency = &compile_latency;
  env.limits.max_nodes = absl::GetFlag(FLAGS_max_graph_nodes);
  env.limits.max_rank = absl::GetFlag(FLAGS_max_tensor_rank);
  env.limits.max_constant_bytes = absl::GetFlag(FLAGS_max_constant_bytes);
  env.identity.components["kiln"] = kKilnVersion;
  // Artifacts of another format must never hit: the format is part of every key.
  env.identity.components["artifact_format"] = std::to_string(kArtifactFormatVersion);
  // kilnd's code generates what it caches: a rebuilt kilnd must not hit another build's entries.
  env.identity.components["kilnd_build"] = ProgramBuildId();
  if (env.identity.components["kilnd_build"].empty()) {
    env.identity.components["kilnd_build"] = "unknown";
    spdlog::warn("this kilnd has no GNU build-id and cannot read /proc/self/exe: cache keys do not "
                 "change when kilnd is rebuilt (clear the cache dir after upgrading kilnd)");
  }
  env.cache_dir = cache_dir;
  env.cache_max_bytes = cache_options.disk_max_bytes;
  env.max_entry_bytes = absl::GetFlag(FLAGS_max_send_message_bytes);

  // The CPU compiler, and everything about it that changes generated code, for the key.
  compiler::CpuCompilerOptions cpu_options;
  cpu_options.toolchain.compiler = absl::GetFlag(FLAGS_cxx);
  cpu_options.toolchain.timeout = absl::GetFlag(FLAGS_compile_timeout);
  cpu_options.toolchain.memory_limit_bytes = absl::GetFlag(FLAGS_compile_memory_limit_bytes);
  toolchain::CompilePool compile_pool(absl::GetFlag(FLAGS_compile_workers));
  cpu_options.pool = &compile_pool;
  cpu_options.parallel_compiles = std::max(0, absl::GetFlag(FLAGS_cpu_parallel_compiles));
  absl::StatusOr<std::map<std::string, std::string>> cpu_identity =
      compiler::CpuGraphCompiler::IdentityComponents(cpu_options);
  if (!cpu_identity.ok()) {
    Die(kExitEnvironment, absl::StrCat("the C++ compiler --cxx=", absl::GetFlag(FLAGS_cxx),
                                       " is not usable: ", cpu_identity.status().message()));
  }
  // Keys of each device kind hold only the toolchain that compiles for it (plus kiln's version and
  // the artifact format, which are common).
  env.cuda_identity = env.identity;
  for (const auto& [name, value] : *cpu_identity) env.identity.components[name] = value;
  env.identity.components["cpu_prelude"] = cache::Sha256Hex(kernels::CpuPrelude());
  compiler::CpuGraphCompiler cpu_compiler(cpu_options);

  // The CUDA compiler: NVRTC in worker processes. Missing NVRTC is not fatal (CPU still works).
  compiler::CudaCompilerOptions cuda_options;
  cuda_options.nvrtc.library = toolchain::FindNvrtcLibrary(absl::GetFlag(FLAGS_nvrtc));
  cuda_options.nvrtc.worker = NvrtcWorkerPath(absl::GetFlag(FLAGS_nvrtc_worker));
  cuda_options.nvrtc.timeout = absl::GetFlag(FLAGS_compile_timeout);
  cuda_options.nvrtc.memory_limit_bytes = std::max<int64_t>(absl::GetFlag(FLAGS_compile_memory_limit_bytes),
                                                            int64_t{8} << 30);
  cuda_options.parallel_compiles = std::max(0, absl::GetFlag(FLAGS_cuda_parallel_compiles));
  absl::StatusOr<std::map<std::string, std::string>> cuda_identity =
      compiler::CudaGraphCompiler::IdentityComponents(cuda_options);
  compiler::CudaGraphCompiler cuda_compiler(cuda_options);
  std::string nvrtc_state;
  absl::Status cuda_unavailable;
  if (cuda_identity.ok()) {
    for (const auto& [name, value] : *cuda_identity) env.cuda_identity.components[name] = value;
    nvrtc_state = absl::StrCat("NVRTC ", cuda_identity->at("nvrtc"));
  } else {
    env.cuda_identity.components["nvrtc"] = "unavailable";
    cuda_unavailable = absl::FailedPreconditionError(absl::StrCat(
        "this kilnd cannot compile for CUDA: ", cuda_identity.status().message()));
    nvrtc_state = "no NVRTC: CUDA targets are not compiled";
    spdlog::warn("{} (CPU targets are served; set --nvrtc or KILN_NVRTC_PATH)", std::string(cuda_unavailable.message()));
  }
  env.cuda_identity.components["cuda_prelude"] = cache::Sha256Hex(kernels::CudaPrelude());

  compiler::ByTargetCompiler by_target;
  by_target.Set(kiln::v1::DEVICE_KIND_CPU, &cpu_compiler);
  by_target.Set(kiln::v1::DEVICE_KIND_CUDA, cuda_identity.ok() ? &cuda_compiler : nullptr, cuda_unavailable);
  env.compiler = absl::GetFlag(FLAGS_no_compile) ? nullptr : &by_target;

  CompilerServiceOptions compiler_options;
  compiler_options.debug_delay = absl::GetFlag(FLAGS_debug_rpc_delay);
  compiler_options.max_package_bytes = absl::GetFlag(FLAGS_max_package_bytes);
  if (const int64_t message_limit = std::min(absl::GetFlag(FLAGS_max_receive_message_bytes),
                                             absl::GetFlag(FLAGS_max_send_message_bytes));
      compiler_options.max_package_bytes > message_limit) {
    spdlog::warn("--max_package_bytes={} is above the message limits: packages over about {} bytes "
                 "(--max_receive_message_bytes, --max_send_message_bytes) cannot travel",
                 compiler_options.max_package_bytes, message_limit);
  }
  CompilerService compiler_service(compiler_options, &env);
  AdminService admin_service(&env);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(address->grpc_uri, grpc::InsecureServerCredentials(),
                           address->is_unix ? nullptr : &selected_port);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(absl::GetFlag(FLAGS_max_receive_message_bytes)));
  builder.SetMaxSendMessageSize(static_cast<int>(absl::GetFlag(FLAGS_max_send_message_bytes)));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_max_concurrent_streams));
  // Never share a port with another process: a second kilnd must fail, not split the traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&compiler_service);
  builder.RegisterService(&admin_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!address->is_unix && selected_port == 0)) {
    Die(kExitEnvironment, absl::StrCat("cannot listen on ", address->grpc_uri,
                                       " (address in use or not available; choose another with "
                                       "--listen)"));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  std::atomic<bool> serving{true};

  MetricsHttpServer metrics_http([&env] { return RenderServiceMetrics(env); },
                                 [&serving] { return serving.load(); });
  if (std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen); !metrics_listen.empty()) {
    if (absl::Status s = metrics_http.Start(metrics_listen); !s.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      Die(kExitEnvironment, std::string(s.message()));
    }
    std::string metrics_host = metrics_listen.substr(0, metrics_listen.rfind(':'));
    spdlog::info("metrics on http://{}:{}/metrics", metrics_host, metrics_http.port());
  }
  std::string where = address->is_unix ? address->grpc_uri
                                       : absl::StrCat(address->host, ":", selected_port);
  spdlog::info("kilnd {} (build {}) serving on {} (cache dir {}, {} entries, {} request threads, {}, {}, pid {})",
               kKilnVersion, env.identity.components["kilnd_build"], where, cache_dir,
               env.cache->store(cache::Tier::kDisk)->Stats().entries, request_threads,
               env.identity.components["cxx"], nvrtc_state, getpid());
  // A machine-readable line for scripts and tests that start kilnd on port 0.
  spdlog::info("listening on {}", where);

  // --idle_exit_after: a watcher that signals this process, so idle exit takes the drain path.
  const absl::Duration idle_limit = absl::GetFlag(FLAGS_idle_exit_after);
  absl::Notification stop_idle_watch;
  std::thread idle_watch([&] {
    if (idle_limit <= absl::ZeroDuration()) return;
    while (!stop_idle_watch.WaitForNotificationWithTimeout(
        std::min(idle_limit / 4, absl::Seconds(5)))) {
      if (stats.IdleFor() >= idle_limit) {
        spdlog::info("idle for {}; exiting (--idle_exit_after)", absl::FormatDuration(idle_limit));
        kill(getpid(), SIGTERM);
        return;
      }
    }
  });

  int sig = 0;
  sigwait(&signals, &sig);
  stop_idle_watch.Notify();
  idle_watch.join();
  const absl::Duration grace = absl::GetFlag(FLAGS_shutdown_grace_period);
  spdlog::info("received {}; NOT_SERVING now, draining in-flight calls for up to {}",
               strsignal(sig), absl::FormatDuration(grace));
  stats.StartDraining();  // before NOT_SERVING: whoever sees NOT_SERVING finds calls refused
  health->SetServingStatus(false);
  serving = false;

  // A second signal during the drain exits at once.
  std::thread second_signal([signals] {
    int again = 0;
    sigset_t set = signals;
    sigwait(&set, &again);
    fprintf(stderr, "kilnd: received %s again; exiting without waiting for calls\n",
            strsignal(again));
    _exit(1);
  });
  second_signal.detach();

  absl::Time start = absl::Now();
  server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(grace));
  executor.Stop();
  server->Wait();
  metrics_http.Stop();
  spdlog::info("drained in {}; exiting", absl::FormatDuration(absl::Now() - start));
  spdlog::default_logger()->flush();
  if (address->is_unix) unlink(address->unix_path.c_str());
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Run(argc, argv); }
