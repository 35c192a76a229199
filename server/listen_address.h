#ifndef KILN_SERVER_LISTEN_ADDRESS_H_
#define KILN_SERVER_LISTEN_ADDRESS_H_

// Parses kilnd's --listen value and checks, before gRPC is involved, that the address can be used,
// so that a second kilnd on the same address fails with a clear message instead of silently
// sharing the port (gRPC enables SO_REUSEPORT by default) or stealing a unix socket.
//
// Accepted forms: "host:port", "[v6addr]:port", "unix:/abs/path", "unix:///abs/path".

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

struct ListenAddress {
  bool is_unix = false;
  std::string host;       // TCP only
  int port = 0;           // TCP only
  std::string unix_path;  // unix only, absolute
  // The address as gRPC wants it ("127.0.0.1:7878", "[::1]:7878", "unix:/path").
  std::string grpc_uri;
};

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view spec);

// TCP: binds a throwaway socket to the address; FAILED_PRECONDITION "in use" if another process
// listens there. Unix: creates the parent directory (0700) if needed; FAILED_PRECONDITION if a
// server answers on the socket; removes a stale socket file that nobody answers on.
absl::Status PrepareListenAddress(const ListenAddress& address);

}  // namespace kiln

#endif  // KILN_SERVER_LISTEN_ADDRESS_H_
