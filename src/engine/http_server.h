// HttpServer: a small HTTP/1.1 server for /metrics, /healthz and the JSON query API.
//
// One accept thread serves connections one at a time (scrapes and queries are rare and short):
// it reads one request (headers up to 16 KiB, body up to 1 MiB, 5 s socket timeouts), calls the
// handler and closes the connection (`Connection: close`). Anything malformed gets a 400.
// Owned by flared_main; stop() (or the destructor) closes the socket and joins the thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>

namespace flare::engine {

struct HttpRequest {
  std::string method;
  std::string path;                            // decoded, without the query
  std::map<std::string, std::string> query;    // decoded
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  explicit HttpServer(Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds "host:port" (IPv4 literal or "localhost"; port 0 picks one) and starts serving.
  bool start(const std::string& address, std::string* error);
  int port() const { return port_; }
  void stop();

  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  uint64_t badRequests() const { return bad_requests_.load(std::memory_order_relaxed); }

  // Percent-decoding ('+' stays '+'); false on a bad escape. Exposed for tests.
  static bool urlDecode(const std::string& in, std::string* out);

 private:
  void serve();
  void handle(int fd);

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> bad_requests_{0};
};

}  // namespace flare::engine
