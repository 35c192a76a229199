#include "server/metrics_http.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace kiln {

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render_metrics,
                                     std::function<bool()> is_serving)
    : render_metrics_(std::move(render_metrics)), is_serving_(std::move(is_serving)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::Status MetricsHttpServer::Start(const std::string& host_port) {
  size_t colon = host_port.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", host_port, ": expected host:port"));
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  server_ = std::make_unique<httplib::Server>();
  // httplib sets SO_REUSEPORT by default, which would let a second kilnd share the port silently.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics_(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    bool serving = is_serving_();
    res.status = serving ? 200 : 503;
    res.set_content(serving ? "SERVING\n" : "NOT_SERVING\n", "text/plain");
  });
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) {
    server_.reset();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot serve metrics on ", host_port,
        ": address in use or not available (choose another with --metrics_listen)"));
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kiln
