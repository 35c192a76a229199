#ifndef KILN_CLIENT_KILNCTL_ARGS_H_
#define KILN_CLIENT_KILNCTL_ARGS_H_

// kilnctl's command line: global options, a command, the command's options and positionals.
//   kilnctl [--server=ADDR] [--json] [--timeout=DURATION] COMMAND [--opt[=value]]... [ARG]...
// Options may be written --name=value or --name value (for options that take a value).

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::kilnctl {

struct Args {
  std::map<std::string, std::string> global;   // name -> value ("" for switches)
  std::string command;
  std::map<std::string, std::string> options;  // the command's options
  std::vector<std::string> positional;
};

// `valued` lists the option names (global or command) that take a value; others are switches.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv,
                               const std::set<std::string>& global_names,
                               const std::set<std::string>& valued);

}  // namespace kiln::kilnctl

#endif  // KILN_CLIENT_KILNCTL_ARGS_H_
