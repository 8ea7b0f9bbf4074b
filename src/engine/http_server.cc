#include "src/engine/http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

bool writeAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
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

HttpServer::HttpServer(Handler handler) : handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  stop();
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
      ::listen(listen_fd_, 64) != 0) {
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
}

void HttpServer::serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    handle(fd);
    ::close(fd);
  }
}

void HttpServer::handle(int fd) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  auto fail = [&](int status, const std::string& why) {
    bad_requests_.fetch_add(1, std::memory_order_relaxed);
    writeAll(fd, fmt::format("HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n"
                             "Connection: close\r\n\r\n{}",
                             status, statusText(status), why.size() + 1, why + "\n"));
  };
  std::string buf;
  size_t header_end = std::string::npos;
  char chunk[4096];
  while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > kMaxHeaderBytes) return fail(413, "headers too large");
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // closed or timed out before a full request: nothing to answer
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
  HttpRequest req;
  const size_t line_end = buf.find("\r\n");
  const std::string line = buf.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos ||
      line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    return fail(400, "malformed request line");
  }
  req.method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const size_t qpos = target.find('?');
  if (!urlDecode(target.substr(0, qpos), &req.path) || req.path.empty() || req.path[0] != '/') {
    return fail(400, "malformed path");
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
          return fail(400, "malformed query");
        }
        req.query[k] = v;
      }
      start = amp + 1;
    }
  }
  size_t pos = line_end + 2;
  while (pos < header_end) {
    const size_t e = buf.find("\r\n", pos);
    const std::string h = buf.substr(pos, e - pos);
    const size_t colon = h.find(':');
    if (colon == std::string::npos) return fail(400, "malformed header");
    req.headers[lower(trim(h.substr(0, colon)))] = trim(h.substr(colon + 1));
    pos = e + 2;
  }
  size_t content_length = 0;
  if (auto it = req.headers.find("content-length"); it != req.headers.end()) {
    try {
      content_length = std::stoul(it->second);
    } catch (...) {
      return fail(400, "bad content-length");
    }
    if (content_length > kMaxBodyBytes) return fail(413, "body too large");
  }
  req.body = buf.substr(header_end + 4);
  while (req.body.size() < content_length) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return fail(400, "body shorter than content-length");
    }
    req.body.append(chunk, static_cast<size_t>(n));
  }
  req.body.resize(content_length);
  HttpResponse resp;
  try {
    resp = handler_(req);
  } catch (const std::exception& e) {
    resp =
        HttpResponse{500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what()};
  }
  writeAll(fd,
           fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
                       "Connection: close\r\n\r\n",
                       resp.status, statusText(resp.status), resp.content_type, resp.body.size()) +
               resp.body);
}

}  // namespace flare::engine
