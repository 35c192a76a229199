#include "server/listen_address.h"

#include <netinet/in.h>
#include <sys/un.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(ParseListenAddressTest, AcceptsTheDocumentedForms) {
  auto tcp = ParseListenAddress("127.0.0.1:7878");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_FALSE(tcp->is_unix);
  EXPECT_EQ(tcp->host, "127.0.0.1");
  EXPECT_EQ(tcp->port, 7878);
  EXPECT_EQ(tcp->grpc_uri, "127.0.0.1:7878");

  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->grpc_uri, "[::1]:0");

  for (const char* spec : {"unix:/tmp/kiln.sock", "unix:///tmp/kiln.sock"}) {
    auto unix_addr = ParseListenAddress(spec);
    ASSERT_TRUE(unix_addr.ok()) << spec << ": " << unix_addr.status();
    EXPECT_TRUE(unix_addr->is_unix);
    EXPECT_EQ(unix_addr->unix_path, "/tmp/kiln.sock");
    EXPECT_EQ(unix_addr->grpc_uri, "unix:/tmp/kiln.sock");
  }
}

TEST(ParseListenAddressTest, RejectsBadFormsWithAReason) {
  EXPECT_NE(ParseListenAddress("7878").status().message().find("host:port"), std::string::npos);
  EXPECT_NE(ParseListenAddress("localhost:http").status().message().find("not a port"),
            std::string::npos);
  EXPECT_NE(ParseListenAddress("localhost:70000").status().message().find("not a port"),
            std::string::npos);
  EXPECT_NE(ParseListenAddress("::1:80").status().message().find("brackets"), std::string::npos);
  EXPECT_NE(ParseListenAddress("unix:relative.sock").status().message().find("absolute"),
            std::string::npos);
  EXPECT_NE(ParseListenAddress("unix:/" + std::string(200, 'a')).status().message().find("bytes"),
            std::string::npos);
}

TEST(PrepareListenAddressTest, RefusesAPortInUse) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  int port = ntohs(sa.sin_port);

  auto addr = ParseListenAddress("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(addr.ok());
  absl::Status s = PrepareListenAddress(*addr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("already in use"), std::string::npos) << s;
  close(fd);
  EXPECT_TRUE(PrepareListenAddress(*addr).ok());
}

TEST(PrepareListenAddressTest, RemovesAStaleUnixSocketAndRefusesALiveOne) {
  char tmpl[] = "/tmp/kiln-sock-test.XXXXXX";  // short: unix socket paths have 108 bytes
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = std::string(tmpl) + "/sub";
  std::string path = dir + "/kilnd.sock";
  auto addr = ParseListenAddress("unix:" + path);
  ASSERT_TRUE(addr.ok());
  ASSERT_TRUE(PrepareListenAddress(*addr).ok());  // creates the directory

  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  path.copy(sa.sun_path, path.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  absl::Status live = PrepareListenAddress(*addr);
  EXPECT_EQ(live.code(), absl::StatusCode::kFailedPrecondition) << live;
  close(fd);  // the socket file stays behind, as after a crash
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
  EXPECT_TRUE(PrepareListenAddress(*addr).ok());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "stale socket should have been removed";
}

}  // namespace
}  // namespace kiln
