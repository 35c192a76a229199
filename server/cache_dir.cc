#include "server/cache_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<std::string> DefaultCacheDir() {
  const char* xdg = getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return absl::StrCat(xdg, "/kiln");
  const char* home = getenv("HOME");
  if (home != nullptr && home[0] == '/') return absl::StrCat(home, "/.cache/kiln");
  return absl::FailedPreconditionError(
      "neither XDG_CACHE_HOME nor HOME is set to an absolute path; pass --cache_dir");
}

absl::Status EnsureWritableDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cache dir ", dir, " cannot be created: ", ec.message(),
        " (choose a writable directory with --cache_dir)"));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cache dir ", dir, " is not a directory (choose one with --cache_dir)"));
  }
  std::string probe = absl::StrCat(dir, "/.kilnd-write-probe.", getpid());
  int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cache dir ", dir, " is not writable: ",
                                                      strerror(errno),
                                                      " (choose a writable directory with "
                                                      "--cache_dir)"));
  }
  bool ok = write(fd, "k", 1) == 1 && fsync(fd) == 0;
  int err = errno;
  close(fd);
  unlink(probe.c_str());
  if (!ok) {
    return absl::FailedPreconditionError(
        absl::StrCat("cache dir ", dir, " is not writable: ", strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace kiln
