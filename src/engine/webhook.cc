#include "src/engine/webhook.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "src/common/log.h"
#include "src/engine/metrics.h"

namespace flare::engine {
namespace {

using Clock = std::chrono::steady_clock;

int64_t msLeft(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// Waits for `events` on fd until the deadline; true when ready.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(msLeft(deadline)));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

}  // namespace

std::unique_ptr<Webhook> Webhook::start(const WebhookOptions& options, std::string* error) {
  const std::string scheme = "http://";
  if (options.url.rfind(scheme, 0) != 0) {
    *error = "--webhook-url must start with http:// (got '" + options.url +
             "'; for https put a TLS proxy in front)";
    return nullptr;
  }
  std::unique_ptr<Webhook> w(new Webhook(options));
  std::string rest = options.url.substr(scheme.size());
  const size_t slash = rest.find('/');
  w->path_ = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string authority = rest.substr(0, slash);
  w->port_ = "80";
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) {
      *error = "--webhook-url: unterminated IPv6 address";
      return nullptr;
    }
    w->host_ = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':')
      w->port_ = authority.substr(close + 2);
  } else {
    const size_t colon = authority.rfind(':');
    w->host_ = authority.substr(0, colon);
    if (colon != std::string::npos) w->port_ = authority.substr(colon + 1);
  }
  const bool port_ok =
      !w->port_.empty() && w->port_.size() <= 5 &&
      std::all_of(w->port_.begin(), w->port_.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (w->host_.empty() || !port_ok) {
    *error = "--webhook-url: expected http://HOST[:PORT][/PATH], got '" + options.url + "'";
    return nullptr;
  }
  for (char c : w->path_) {
    if (static_cast<unsigned char>(c) <= 0x20) {
      *error = "--webhook-url: the path may not contain spaces or control characters";
      return nullptr;
    }
  }
  w->worker_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

Webhook::Webhook(const WebhookOptions& options) : options_(options) {
  options_.max_attempts = std::max(1, options_.max_attempts);
  options_.timeout_ms = std::max<int64_t>(1, options_.timeout_ms);
  options_.max_queue = std::max<size_t>(1, options_.max_queue);
}

Webhook::~Webhook() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    dropped_ += queue_.size();
    queue_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Webhook::post(std::string json) {
  {
    std::lock_guard lock(mu_);
    if (stop_ || queue_.size() >= options_.max_queue) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(json));
  }
  cv_.notify_one();
}

bool Webhook::drain(int64_t timeout_ms) {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                           [this] { return queue_.empty() && !busy_; });
}

void Webhook::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    std::string body = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    bool ok = false;
    std::string why;
    int64_t backoff = std::max<int64_t>(1, options_.backoff_ms);
    for (int i = 0; i < options_.max_attempts && !stop_; ++i) {
      if (i > 0) {
        ++retries_;
        // Interruptible by the destructor.
        cv_.wait_for(lock, std::chrono::milliseconds(backoff), [this] { return stop_; });
        if (stop_) break;
        backoff = std::min<int64_t>(backoff * 2, 30'000);
      }
      lock.unlock();
      ok = attempt(body, &why);
      lock.lock();
      if (ok) break;
    }
    if (ok) {
      ++delivered_;
    } else if (stop_) {
      ++dropped_;
    } else {
      ++failures_;
      common::logOnce(common::LogLevel::kWarn, "engine", "webhook:failed",
                      "webhook {}: a diagnosis could not be delivered after {} attempts ({}); "
                      "further failures are only counted (flare_webhook_failures_total)",
                      options_.url, options_.max_attempts, why);
    }
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  busy_ = false;
  idle_cv_.notify_all();
}

bool Webhook::attempt(const std::string& body, std::string* why) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host_.c_str(), port_.c_str(), &hints, &res); rc != 0) {
    *why = std::string("cannot resolve ") + host_ + ": " + gai_strerror(rc);
    return false;
  }
  int fd = -1;
  *why = "cannot connect to " + host_ + ":" + port_;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      int err = errno;
      if (err == EINPROGRESS && waitFor(fd, POLLOUT, deadline)) {
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else if (err == EINPROGRESS) {
        err = ETIMEDOUT;
      }
      if (err != 0) {
        *why = "cannot connect to " + host_ + ":" + port_ + ": " + std::strerror(err);
        ::close(fd);
        fd = -1;
      }
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return false;
  const std::string request =
      "POST " + path_ + " HTTP/1.1\r\nHost: " + host_ + ":" + port_ +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\nUser-Agent: flared\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!waitFor(fd, POLLOUT, deadline)) break;
    } else {
      break;
    }
  }
  if (sent < request.size()) {
    *why = "sending to " + host_ + ":" + port_ + " failed or timed out";
    ::close(fd);
    return false;
  }
  std::string answer;
  char buf[512];
  while (answer.find("\r\n") == std::string::npos && answer.size() < 4096) {
    if (!waitFor(fd, POLLIN, deadline)) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      answer.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      continue;
    } else {
      break;
    }
  }
  ::close(fd);
  // "HTTP/1.1 204 No Content"
  const size_t sp = answer.find(' ');
  if (answer.rfind("HTTP/", 0) != 0 || sp == std::string::npos || answer.size() < sp + 4) {
    *why = "no HTTP answer from " + host_ + ":" + port_ + " within " +
           std::to_string(options_.timeout_ms) + " ms";
    return false;
  }
  const std::string status = answer.substr(sp + 1, 3);
  if (status[0] == '2') return true;
  *why = "HTTP " + status + " from " + host_ + ":" + port_;
  return false;
}

void Webhook::writeMetrics(PromWriter& w) const {
  size_t depth = 0;
  {
    std::lock_guard lock(mu_);
    depth = queue_.size();
  }
  writeMetricsOf(w, delivered_.load(), failures_.load(), retries_.load(), dropped_.load(), depth);
}

void Webhook::writeMetricsOf(PromWriter& w, uint64_t delivered, uint64_t failures, uint64_t retries,
                             uint64_t dropped, size_t depth) {
  w.family("flare_webhook_delivered_total", "counter", "Diagnoses delivered to --webhook-url.");
  w.sample("flare_webhook_delivered_total", delivered, {});
  w.family("flare_webhook_failures_total", "counter",
           "Diagnoses given up after every retry to --webhook-url failed.");
  w.sample("flare_webhook_failures_total", failures, {});
  w.family("flare_webhook_retries_total", "counter", "Webhook attempts that were retries.");
  w.sample("flare_webhook_retries_total", retries, {});
  w.family("flare_webhook_dropped_total", "counter",
           "Diagnoses not posted: the webhook queue was full, or flared stopped first.");
  w.sample("flare_webhook_dropped_total", dropped, {});
  w.family("flare_webhook_queue_depth", "gauge", "Diagnoses waiting for the webhook.");
  w.sample("flare_webhook_queue_depth", static_cast<uint64_t>(depth), {});
}

}  // namespace flare::engine
