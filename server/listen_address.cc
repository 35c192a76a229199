#include "server/listen_address.h"

#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

constexpr size_t kMaxUnixPath = sizeof(sockaddr_un{}.sun_path) - 1;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status PrepareTcp(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  std::string port = std::to_string(address.port);
  int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve listen host '", address.host,
                                                   "': ", gai_strerror(rc)));
  }
  absl::Status status = absl::OkStatus();
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) continue;
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      int err = errno;
      if (err == EADDRINUSE) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "cannot listen on ", address.grpc_uri,
            ": address already in use (is another kilnd running there? choose another with "
            "--listen)"));
      } else {
        status = absl::FailedPreconditionError(
            absl::StrCat("cannot listen on ", address.grpc_uri, ": ", strerror(err)));
      }
      break;
    }
  }
  freeaddrinfo(result);
  return status;
}

absl::Status PrepareUnix(const ListenAddress& address) {
  std::filesystem::path path(address.unix_path);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the directory of ",
                                                      address.grpc_uri, ": ", ec.message()));
  }
  struct stat st;
  if (lstat(address.unix_path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on ", address.grpc_uri, ": the path exists and is not a socket"));
  }
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket(): ", strerror(errno)));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, address.unix_path.data(), address.unix_path.size());
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on ", address.grpc_uri,
        ": address already in use (another server answers on this socket; is another kilnd "
        "running there? choose another with --listen)"));
  }
  // Nobody answers: a stale socket file left by a process that died. Remove it.
  if (unlink(address.unix_path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot remove the stale socket ", address.unix_path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view spec) {
  ListenAddress out;
  if (absl::ConsumePrefix(&spec, "unix:")) {
    if (absl::StartsWith(spec, "//")) spec.remove_prefix(2);
    if (!absl::StartsWith(spec, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen=unix:", spec, ": the socket path must be absolute"));
    }
    if (spec.size() > kMaxUnixPath) {
      return absl::InvalidArgumentError(absl::StrCat("--listen=unix:", spec, ": the path is ",
                                                     spec.size(), " bytes; unix sockets allow ",
                                                     kMaxUnixPath));
    }
    out.is_unix = true;
    out.unix_path = std::string(spec);
    out.grpc_uri = absl::StrCat("unix:", spec);
    return out;
  }
  size_t colon = spec.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", spec, ": expected host:port, [v6addr]:port or unix:/path"));
  }
  absl::string_view host = spec.substr(0, colon);
  absl::string_view port = spec.substr(colon + 1);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  } else if (absl::StrContains(host, ':')) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", spec, ": write IPv6 addresses in brackets, e.g. [::1]:7878"));
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", spec, ": '", port, "' is not a port number (0-65535)"));
  }
  out.host = std::string(host);
  out.port = port_number;
  out.grpc_uri = absl::StrContains(out.host, ':') ? absl::StrCat("[", out.host, "]:", port)
                                                  : absl::StrCat(out.host, ":", port);
  return out;
}

absl::Status PrepareListenAddress(const ListenAddress& address) {
  return address.is_unix ? PrepareUnix(address) : PrepareTcp(address);
}

}  // namespace kiln
