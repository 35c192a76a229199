#include "client/kilnctl/args.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln::kilnctl {

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv,
                               const std::set<std::string>& global_names,
                               const std::set<std::string>& valued) {
  Args args;
  bool options_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (!options_done && a == "--") {
      options_done = true;
      continue;
    }
    if (!options_done && absl::StartsWith(a, "-") && a != "-") {
      std::string body = a.substr(absl::StartsWith(a, "--") ? 2 : 1);
      std::string name = body, value;
      bool has_value = false;
      if (size_t eq = body.find('='); eq != std::string::npos) {
        name = body.substr(0, eq);
        value = body.substr(eq + 1);
        has_value = true;
      }
      if (name == "h") name = "help";
      bool takes_value = valued.count(name) > 0;
      if (takes_value && !has_value) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        }
        value = argv[++i];
      } else if (!takes_value && has_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      bool is_global = args.command.empty() && global_names.count(name) > 0;
      if (args.command.empty() && !is_global && name != "help") {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown option --", name, " before the command (see kilnctl --help)"));
      }
      (is_global ? args.global : args.options)[name] = value;
      continue;
    }
    if (args.command.empty()) {
      args.command = a;
    } else {
      args.positional.push_back(a);
    }
  }
  return args;
}

}  // namespace kiln::kilnctl
