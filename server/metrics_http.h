#ifndef KILN_SERVER_METRICS_HTTP_H_
#define KILN_SERVER_METRICS_HTTP_H_

// kilnd's HTTP side door for monitoring (--metrics_listen): GET /metrics (Prometheus text) and
// GET /healthz (200 "SERVING" or 503 "NOT_SERVING"). Runs on its own thread; cpp-httplib.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace httplib {
class Server;
}

namespace kiln {

class MetricsHttpServer {
 public:
  MetricsHttpServer(std::function<std::string()> render_metrics,
                    std::function<bool()> is_serving);
  ~MetricsHttpServer();

  // Binds `host:port` (port 0 picks one) and starts serving. FAILED_PRECONDITION if it cannot bind.
  absl::Status Start(const std::string& host_port);
  int port() const { return port_; }
  void Stop();

 private:
  std::function<std::string()> render_metrics_;
  std::function<bool()> is_serving_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace kiln

#endif  // KILN_SERVER_METRICS_HTTP_H_
