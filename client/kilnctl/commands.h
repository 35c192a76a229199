#ifndef KILN_CLIENT_KILNCTL_COMMANDS_H_
#define KILN_CLIENT_KILNCTL_COMMANDS_H_

// kilnctl's commands. Each talks to one kilnd over kiln.v1.Admin (or grpc.health.v1), prints a
// table (or JSON with --json) on stdout, errors on stderr, and returns the process exit code.

#include <chrono>
#include <iosfwd>
#include <memory>
#include <string>

#include "client/kilnctl/args.h"
#include "grpcpp/grpcpp.h"

namespace kiln::kilnctl {

// Exit codes, documented in `kilnctl --help`.
inline constexpr int kExitOk = 0;
inline constexpr int kExitServerError = 1;   // the server refused or failed the request
inline constexpr int kExitUsage = 2;         // bad command line
inline constexpr int kExitUnreachable = 3;   // no server answered at the address
inline constexpr int kExitCorruptFound = 4;  // verify found (and removed) corrupt entries

struct Context {
  std::shared_ptr<grpc::Channel> channel;
  std::string server;  // as given, for messages
  bool json = false;
  std::chrono::milliseconds timeout{10000};
  std::ostream* out;
  std::ostream* err;
};

int CmdHealth(const Context& ctx, const Args& args);
int CmdStats(const Context& ctx, const Args& args);
int CmdLs(const Context& ctx, const Args& args);
int CmdShow(const Context& ctx, const Args& args);
int CmdEvict(const Context& ctx, const Args& args);
int CmdPurge(const Context& ctx, const Args& args);
int CmdVerify(const Context& ctx, const Args& args);
int CmdExport(const Context& ctx, const Args& args);
int CmdImport(const Context& ctx, const Args& args);
int CmdExplainMiss(const Context& ctx, const Args& args);

}  // namespace kiln::kilnctl

#endif  // KILN_CLIENT_KILNCTL_COMMANDS_H_
