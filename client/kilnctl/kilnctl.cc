// kilnctl: inspect and manage a kilnd's cache. See `kilnctl --help`.

#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/kilnctl/args.h"
#include "client/kilnctl/commands.h"
#include "grpcpp/grpcpp.h"

namespace kiln::kilnctl {
namespace {

constexpr char kVersion[] = "0.1.0";

constexpr char kMainHelp[] = R"(kilnctl: inspect and manage a kilnd's artifact cache.

Usage: kilnctl [--server=ADDR] [--json] [--timeout=DURATION] COMMAND [OPTIONS] [ARGS]

Commands:
  health                  is the server up? (SERVING / NOT_SERVING)
  stats                   requests by outcome, cache size and entries, evictions, corruptions
  ls                      list cache entries (sorting and filters: ls --help)
  show KEY                one entry: summary, graph, plan, timings; --source, --log, --key_record
  evict KEY               remove one entry
  purge --older_than=D    remove entries not used for D (e.g. 7d, 12h); or purge --all
  verify                  re-check every entry's checksum; corrupt entries are removed
  export FILE [KEY...]    write entries (all by default) to a bundle file
  import FILE             load a bundle file into the server's cache (prewarm another server)
  explain-miss KEY_A KEY_B  which hashed components of two keys differ

KEY is 64 hex digits, or a unique prefix of at least 6 (as `ls` prints them).

Global options:
  --server=ADDR     kilnd's address: host:port or unix:/path. Default: $KILN_SERVER, else the
                    embedded server's socket ($XDG_CACHE_HOME/kiln/kilnd.sock or
                    ~/.cache/kiln/kilnd.sock) if it exists, else 127.0.0.1:7878.
  --json            print JSON for scripts instead of tables
  --timeout=D       per-call deadline (default 10s)
  --version         print kilnctl's version

Exit codes:
  0  success
  1  the server refused or failed the request (e.g. no such key), or health is not SERVING
  2  bad command line
  3  no server answered at the address (or it did not answer in time)
  4  verify found corrupt entries (they were removed)

`kilnctl COMMAND --help` describes one command.
)";

struct Command {
  std::function<int(const Context&, const Args&)> run;
  const char* help;
  std::vector<std::string> options;  // allowed options (besides --help)
};

const std::map<std::string, Command>& Commands() {
  static const auto* commands = new std::map<std::string, Command>{
      {"health", {CmdHealth, "kilnctl health\n\nAsks grpc.health.v1 whether the server is "
                             "SERVING. Exit 0 if SERVING, 1 if not, 3 if unreachable.\n", {}}},
      {"stats", {CmdStats, "kilnctl stats\n\nThe server's counters: requests by outcome "
                           "(memory_hit, disk_hit, compiled, joined, miss, errors), cache bytes "
                           "and entries against the bound, evictions, corruptions found, compile "
                           "queue.\n", {}}},
      {"ls", {CmdLs,
              "kilnctl ls [--sort=last_hit|created|size|hits] [--asc] [--limit=N] [--prefix=HEX]\n"
              "           [--device=cpu|cuda] [--min_size=BYTES] [--wide]\n\n"
              "Lists cache entries: key (16 digits; --wide for all 64), size, created, last hit,\n"
              "hits, target and a graph summary. Default order: most recently used first.\n",
              {"sort", "asc", "limit", "prefix", "device", "min_size", "wide"}}},
      {"show", {CmdShow,
                "kilnctl show KEY [--graph] [--plan] [--timings] [--source] [--log] "
                "[--key_record]\n\n"
                "One entry. With no option: summary, graph, plan and timings. --source prints the\n"
                "generated source, --log the compiler's log, --key_record every hashed component.\n",
                {"graph", "plan", "timings", "source", "log", "key_record"}}},
      {"evict", {CmdEvict, "kilnctl evict KEY\n\nRemoves one entry from every tier.\n", {}}},
      {"purge", {CmdPurge,
                 "kilnctl purge --older_than=DURATION | --all\n\n"
                 "Removes entries not hit (or created) within DURATION (30m, 12h, 7d), or all.\n",
                 {"older_than", "all"}}},
      {"verify", {CmdVerify, "kilnctl verify\n\nRe-reads every entry and checks its checksum. "
                             "Corrupt entries are removed and listed; exit 4 if any.\n", {}}},
      {"export", {CmdExport,
                  "kilnctl export FILE [KEY...]\n\nWrites the given entries (default: all) to a "
                  "bundle FILE,\natomically. `kilnctl import FILE` loads it into another server.\n",
                  {}}},
      {"import", {CmdImport,
                  "kilnctl import FILE\n\nLoads a bundle written by export. Every entry is "
                  "verified before it is stored;\nentries already present are skipped. Exit 1 if "
                  "any entry was rejected.\n",
                  {}}},
      {"explain-miss", {CmdExplainMiss,
                        "kilnctl explain-miss KEY_A KEY_B\n\nCompares the field-by-field records "
                        "of two cached keys and lists the hashed\ncomponents that differ (shape, "
                        "dtype, target, compiler version, option...).\n",
                        {}}},
  };
  return *commands;
}

std::string DefaultServer() {
  if (const char* env = getenv("KILN_SERVER"); env != nullptr && env[0] != '\0') return env;
  std::string cache;
  if (const char* xdg = getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    cache = absl::StrCat(xdg, "/kiln");
  } else if (const char* home = getenv("HOME"); home != nullptr && home[0] == '/') {
    cache = absl::StrCat(home, "/.cache/kiln");
  }
  struct stat st;
  std::string socket = cache + "/kilnd.sock";
  if (!cache.empty() && stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    return "unix:" + socket;
  }
  return "127.0.0.1:7878";
}

int Run(int argc, char** argv) {
  std::vector<std::string> argv_vec(argv + 1, argv + argc);
  absl::StatusOr<Args> args =
      ParseArgs(argv_vec, {"server", "json", "timeout", "version"},
                {"server", "timeout", "sort", "limit", "prefix", "device", "min_size",
                 "older_than"});
  if (!args.ok()) {
    std::cerr << "kilnctl: " << args.status().message() << "\n";
    return kExitUsage;
  }
  if (args->global.count("version")) {
    std::cout << "kilnctl " << kVersion << "\n";
    return kExitOk;
  }
  if (args->command.empty() || args->command == "help") {
    if (args->command.empty() && !args->options.count("help")) {
      std::cerr << kMainHelp;
      return kExitUsage;
    }
    std::cout << kMainHelp;
    return kExitOk;
  }
  auto it = Commands().find(args->command);
  if (it == Commands().end()) {
    std::cerr << "kilnctl: unknown command '" << args->command << "' (see kilnctl --help)\n";
    return kExitUsage;
  }
  const Command& command = it->second;
  if (args->options.count("help")) {
    std::cout << command.help;
    return kExitOk;
  }
  for (const auto& [name, value] : args->options) {
    if (std::find(command.options.begin(), command.options.end(), name) ==
        command.options.end()) {
      std::cerr << "kilnctl: " << args->command << " has no option --" << name << " (see kilnctl "
                << args->command << " --help)\n";
      return kExitUsage;
    }
  }

  Context ctx;
  ctx.server = args->global.count("server") ? args->global.at("server") : DefaultServer();
  ctx.json = args->global.count("json") > 0;
  if (auto t = args->global.find("timeout"); t != args->global.end()) {
    absl::Duration d;
    if (!absl::ParseDuration(t->second, &d) || d <= absl::ZeroDuration()) {
      std::cerr << "kilnctl: --timeout=" << t->second << " is not a positive duration (e.g. 30s)\n";
      return kExitUsage;
    }
    ctx.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  ctx.channel = grpc::CreateCustomChannel(ctx.server, grpc::InsecureChannelCredentials(),
                                          channel_args);
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  return command.run(ctx, *args);
}

}  // namespace
}  // namespace kiln::kilnctl

int main(int argc, char** argv) { return kiln::kilnctl::Run(argc, argv); }
