// HttpServer: a small HTTP/1.1 server for /metrics, /healthz and the JSON query API.
//
// Slow or many clients cannot stall it: an accept thread hands each connection to a thread of
// its own, up to `max_connections` at once (beyond: an immediate 503, counted). Each
// connection has three clocks: the request line and headers must arrive within
// `header_timeout_ms`, no gap between the client's bytes may exceed `idle_timeout_ms`, and the
// whole exchange (read, handler, write) must end within `request_timeout_ms`; a connection over
// any of them is closed (counted as a timeout). So /healthz and /metrics answer at once while
// hundreds of clients trickle bytes (http_server_test.cc). One request per connection
// (`Connection: close`): headers up to 16 KiB, body up to 1 MiB; anything malformed gets a 400.
// With a certificate and key (HttpServerOptions::tls_*), HTTPS only (OpenSSL).
//
// Why not a library (docs/operations.md "The HTTP server"): Debian's cpp-httplib serves from a
// fixed thread pool, so slow clients that hold every pool thread queue the probes behind them
// (the stall this server exists to avoid); libmicrohttpd would serve, but flared needs a dozen
// GET/POST routes on loopback or behind a proxy, which this file does in a few hundred lines
// with the limits above, fuzzed (http_parse_fuzz.cc).
//
// Threads: handlers run on the connection threads, concurrently; the Handler must be
// thread-safe (QueryApi is). Owned by flared_main; stop() (or the destructor) closes the
// listening socket, wakes every connection and waits for them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
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

struct HttpServerOptions {
  size_t max_connections = 256;        // served at once; beyond: 503 at once
  int64_t header_timeout_ms = 10000;   // request line and headers complete
  int64_t idle_timeout_ms = 5000;      // longest gap between a client's bytes
  int64_t request_timeout_ms = 30000;  // the whole exchange, handler and answer included
  // HTTPS (flared's --tls-cert/--tls-key/--tls-client-ca, the gRPC port's options): both files
  // set, every connection is TLS (1.2 or later; the handshake counts against the header
  // timeout); with a client CA, clients must present a certificate it verifies.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  explicit HttpServer(Handler handler, HttpServerOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds "host:port" (IPv4 literal or "localhost"; port 0 picks one) and starts serving.
  bool start(const std::string& address, std::string* error);
  int port() const { return port_; }
  void stop();

  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  uint64_t badRequests() const { return bad_requests_.load(std::memory_order_relaxed); }
  uint64_t busyRefused() const { return busy_.load(std::memory_order_relaxed); }
  uint64_t timeouts() const { return timeouts_.load(std::memory_order_relaxed); }
  size_t connections() const;

  // Percent-decoding ('+' stays '+'); false on a bad escape. Exposed for tests.
  static bool urlDecode(const std::string& in, std::string* out);

  // Parses a request head (request line and headers, `head` ends before the blank line) into
  // `req` (method, path, query, headers) and the declared body length. 0 when it is good, else
  // the HTTP status to answer (400, 413) with `why`. Pure: the parser the fuzz target drives.
  static int parseHead(const std::string& head, size_t max_body, HttpRequest* req,
                       size_t* content_length, std::string* why);

 private:
  void serve();
  void serveConnection(int fd);

  Handler handler_;
  void* tls_ = nullptr;  // SSL_CTX* when serving HTTPS (OpenSSL stays out of this header)
  HttpServerOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::set<int> open_fds_;  // guarded by mu_: connections being served
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> bad_requests_{0};
  std::atomic<uint64_t> busy_{0};
  std::atomic<uint64_t> timeouts_{0};
};

}  // namespace flare::engine
