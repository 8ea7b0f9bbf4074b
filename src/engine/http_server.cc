#include "src/engine/http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <utility>

namespace flare::engine {
namespace {

constexpr size_t kMaxHeaderBytes = 16 << 10;
constexpr size_t kMaxBodyBytes = 1 << 20;

const char* statusText(int s) {
  switch (s) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

using Clock = std::chrono::steady_clock;

// Milliseconds from now to `deadline`, at least 0.
int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

enum class Io { kOk, kClosed, kTimeout, kError };

// Waits until `fd` is ready for `events`, at most `idle_ms` and not past `deadline`.
Io waitFor(int fd, short events, int idle_ms, Clock::time_point deadline) {
  for (;;) {
    const int wait = std::min(idle_ms, msLeft(deadline));
    if (wait <= 0) return Io::kTimeout;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, wait);
    if (r > 0) return Io::kOk;
    if (r == 0) return Io::kTimeout;
    if (errno != EINTR) return Io::kError;
  }
}

// One connection: its socket and, for HTTPS, its TLS session.
struct Conn {
  int fd = -1;
  SSL* ssl = nullptr;
};

// What a TLS call that did not complete waits for; kError when it failed.
Io tlsWait(const Conn& c, int ret, int idle_ms, Clock::time_point deadline) {
  switch (SSL_get_error(c.ssl, ret)) {
    case SSL_ERROR_WANT_READ:
      return waitFor(c.fd, POLLIN, idle_ms, deadline);
    case SSL_ERROR_WANT_WRITE:
      return waitFor(c.fd, POLLOUT, idle_ms, deadline);
    case SSL_ERROR_ZERO_RETURN:
      return Io::kClosed;
    default:
      ERR_clear_error();
      return Io::kError;
  }
}

// Sends all of `s` on the connection before `deadline`.
Io writeAll(const Conn& c, const std::string& s, int idle_ms, Clock::time_point deadline) {
  if (c.ssl != nullptr) {
    size_t off = 0;
    while (off < s.size()) {
      const int n = SSL_write(c.ssl, s.data() + off,
                              static_cast<int>(std::min<size_t>(s.size() - off, 1 << 30)));
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      const Io w = tlsWait(c, n, idle_ms, deadline);
      if (w != Io::kOk) return w == Io::kClosed ? Io::kError : w;
    }
    return Io::kOk;
  }
  const int fd = c.fd;
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const Io w = waitFor(fd, POLLOUT, idle_ms, deadline);
      if (w != Io::kOk) return w;
      continue;
    }
    return Io::kError;
  }
  return Io::kOk;
}

// Appends what arrives on the connection to `buf`: one read, waiting at most `idle_ms` between
// bytes and not past `deadline`.
Io readSome(const Conn& c, std::string* buf, int idle_ms, Clock::time_point deadline) {
  char chunk[4096];
  if (c.ssl != nullptr) {
    for (;;) {
      const int n = SSL_read(c.ssl, chunk, sizeof(chunk));
      if (n > 0) {
        buf->append(chunk, static_cast<size_t>(n));
        return Io::kOk;
      }
      const Io w = tlsWait(c, n, idle_ms, deadline);
      if (w != Io::kOk) return w;
    }
  }
  const int fd = c.fd;
  for (;;) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buf->append(chunk, static_cast<size_t>(n));
      return Io::kOk;
    }
    if (n == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Io::kError;
    const Io w = waitFor(fd, POLLIN, idle_ms, deadline);
    if (w != Io::kOk) return w;
  }
}

std::string answer(int status, const std::string& content_type, const std::string& body) {
  return fmt::format(
             "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
             "Connection: close\r\n\r\n",
             status, statusText(status), content_type, body.size()) +
         body;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return s.substr(a, b - a);
}

}  // namespace

HttpServer::HttpServer(Handler handler, HttpServerOptions options)
    : handler_(std::move(handler)), options_(options) {}

HttpServer::~HttpServer() {
  stop();
  if (tls_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(tls_));
}

size_t HttpServer::connections() const {
  std::lock_guard lock(mu_);
  return open_fds_.size();
}

bool HttpServer::urlDecode(const std::string& in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      *out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

bool HttpServer::start(const std::string& address, std::string* error) {
  if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    auto tls_error = [&](const std::string& what) {
      char buf[256] = {0};
      ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
      *error = "HTTPS: " + what + " (" + buf + ")";
      ERR_clear_error();
      if (ctx != nullptr) SSL_CTX_free(ctx);
      return false;
    };
    if (ctx == nullptr) return tls_error("cannot create a TLS context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(ctx, options_.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, options_.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      return tls_error("cannot use --tls-cert " + options_.tls_cert_file + " and --tls-key " +
                       options_.tls_key_file);
    }
    if (!options_.tls_client_ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx, options_.tls_client_ca_file.c_str(), nullptr) != 1)
        return tls_error("cannot read --tls-client-ca " + options_.tls_client_ca_file);
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    tls_ = ctx;
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = "HTTP address must be host:port, got '" + address + "'";
    return false;
  }
  std::string host = address.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  int port = -1;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (...) {
    port = -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (port < 0 || port > 65535 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    *error = "HTTP address must be an IPv4 host:port, got '" + address + "'";
    return false;
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 512) != 0) {
    *error = "cannot listen on " + address + ": " + std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    return false;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
  return true;
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  thread_.join();
  ::close(listen_fd_);
  listen_fd_ = -1;
  // Wake every connection (its next read or write fails) and wait for their threads.
  std::unique_lock lock(mu_);
  for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  idle_cv_.wait(lock, [&] { return open_fds_.empty(); });
}

void HttpServer::serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors (EMFILE/ENFILE): back off instead of spinning on the ready socket.
      if (errno == EMFILE || errno == ENFILE)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    {
      std::lock_guard lock(mu_);
      if (open_fds_.size() >= options_.max_connections) {
        busy_.fetch_add(1, std::memory_order_relaxed);
        const std::string busy = answer(503, "text/plain", "too many connections\n");
        // Best effort, never waits (HTTPS: just closed; a plain answer would not be read).
        if (tls_ == nullptr) ::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
        ::close(fd);
        continue;
      }
      open_fds_.insert(fd);
    }
    try {
      std::thread([this, fd] {
        serveConnection(fd);
        std::lock_guard lock(mu_);
        ::close(fd);
        open_fds_.erase(fd);
        if (open_fds_.empty()) idle_cv_.notify_all();
      }).detach();
    } catch (const std::system_error&) {  // no thread to be had: refuse like a full server
      busy_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mu_);
      ::close(fd);
      open_fds_.erase(fd);
      if (open_fds_.empty()) idle_cv_.notify_all();
    }
  }
}

int HttpServer::parseHead(const std::string& head, size_t max_body, HttpRequest* out,
                          size_t* content_length, std::string* why) {
  HttpRequest req;
  auto bad = [&](int status, const char* what) {
    *why = what;
    return status;
  };
  const size_t line_end = std::min(head.find("\r\n"), head.size());
  const std::string line = head.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos || sp1 == 0 ||
      line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    return bad(400, "malformed request line");
  }
  req.method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const size_t qpos = target.find('?');
  if (!urlDecode(target.substr(0, qpos), &req.path) || req.path.empty() || req.path[0] != '/') {
    return bad(400, "malformed path");
  }
  if (qpos != std::string::npos) {
    const std::string q = target.substr(qpos + 1);
    size_t start = 0;
    while (start <= q.size()) {
      size_t amp = q.find('&', start);
      if (amp == std::string::npos) amp = q.size();
      const std::string kv = q.substr(start, amp - start);
      if (!kv.empty()) {
        const size_t eq = kv.find('=');
        std::string k, v;
        if (!urlDecode(kv.substr(0, eq), &k) ||
            !urlDecode(eq == std::string::npos ? "" : kv.substr(eq + 1), &v)) {
          return bad(400, "malformed query");
        }
        req.query[k] = v;
      }
      start = amp + 1;
    }
  }
  size_t pos = line_end + 2;
  while (pos < head.size()) {
    const size_t e = std::min(head.find("\r\n", pos), head.size());
    const std::string h = head.substr(pos, e - pos);
    const size_t colon = h.find(':');
    if (colon == std::string::npos) return bad(400, "malformed header");
    req.headers[lower(trim(h.substr(0, colon)))] = trim(h.substr(colon + 1));
    pos = e + 2;
  }
  *content_length = 0;
  if (auto it = req.headers.find("content-length"); it != req.headers.end()) {
    const std::string& v = it->second;
    if (v.empty() || v.size() > 18 ||
        !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return bad(400, "bad content-length");
    }
    *content_length = std::stoull(v);
    if (*content_length > max_body) return bad(413, "body too large");
  }
  if (req.headers.count("transfer-encoding") != 0) return bad(400, "chunked bodies are not served");
  *out = std::move(req);
  return 0;
}

void HttpServer::serveConnection(int fd) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  const auto start = Clock::now();
  const auto request_deadline = start + std::chrono::milliseconds(options_.request_timeout_ms);
  const auto header_deadline =
      std::min(request_deadline, start + std::chrono::milliseconds(options_.header_timeout_ms));
  const int idle_ms = static_cast<int>(std::clamp<int64_t>(options_.idle_timeout_ms, 1, 1 << 30));
  Conn conn{fd, nullptr};
  struct TlsSession {
    SSL* ssl = nullptr;
    ~TlsSession() {
      if (ssl == nullptr) return;
      SSL_shutdown(ssl);  // one close_notify, not waited for
      SSL_free(ssl);
    }
  } session;
  if (tls_ != nullptr) {
    session.ssl = SSL_new(static_cast<SSL_CTX*>(tls_));
    if (session.ssl == nullptr || SSL_set_fd(session.ssl, fd) != 1) return;
    conn.ssl = session.ssl;
    // The handshake, under the header timeout (a client that never finishes it is a slow one).
    for (;;) {
      const int r = SSL_accept(session.ssl);
      if (r == 1) break;
      const Io w = tlsWait(conn, r, idle_ms, header_deadline);
      if (w == Io::kTimeout) timeouts_.fetch_add(1, std::memory_order_relaxed);
      if (w != Io::kOk) {
        if (w == Io::kError) bad_requests_.fetch_add(1, std::memory_order_relaxed);
        SSL_free(session.ssl);  // no shutdown after a failed handshake
        session.ssl = nullptr;
        return;
      }
    }
  }
  const auto& fd_or_tls = conn;
  auto fail = [&](int status, const std::string& why) {
    bad_requests_.fetch_add(1, std::memory_order_relaxed);
    writeAll(fd_or_tls, answer(status, "text/plain", why + "\n"), idle_ms, request_deadline);
  };
  auto lost = [&](Io io) {  // the client went quiet or away before a whole request
    if (io == Io::kTimeout) timeouts_.fetch_add(1, std::memory_order_relaxed);
  };
  std::string buf;
  size_t header_end = std::string::npos;
  size_t searched = 0;
  while ((header_end = buf.find("\r\n\r\n", searched)) == std::string::npos) {
    if (buf.size() > kMaxHeaderBytes) return fail(413, "headers too large");
    searched = buf.size() < 3 ? 0 : buf.size() - 3;
    const Io io = readSome(fd_or_tls, &buf, idle_ms, header_deadline);
    if (io != Io::kOk) return lost(io);
    if (stop_) return;
  }
  if (header_end > kMaxHeaderBytes) return fail(413, "headers too large");
  HttpRequest req;
  size_t content_length = 0;
  std::string why;
  if (const int status =
          parseHead(buf.substr(0, header_end), kMaxBodyBytes, &req, &content_length, &why);
      status != 0) {
    return fail(status, why);
  }
  req.body = buf.substr(header_end + 4);
  while (req.body.size() < content_length) {
    const Io io = readSome(fd_or_tls, &req.body, idle_ms, request_deadline);
    if (io == Io::kTimeout) return lost(io);
    if (io != Io::kOk) return fail(400, "body shorter than content-length");
  }
  req.body.resize(content_length);
  HttpResponse resp;
  try {
    resp = handler_(req);
  } catch (const std::exception& e) {
    resp =
        HttpResponse{500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what()};
  }
  if (writeAll(fd_or_tls, answer(resp.status, resp.content_type, resp.body), idle_ms,
               request_deadline) == Io::kTimeout) {
    timeouts_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace flare::engine
