// Webhook: posts each new (deduplicated) diagnosis of flared as one JSON document to an HTTP
// endpoint (flared --webhook-url), e.g. a chat or paging bridge.
//
// Never blocks the caller: post() appends to a bounded queue (full: the document is dropped and
// counted) and returns. One worker thread delivers in order: connect and answer each bounded by
// the timeout; a failed attempt (no connection, timeout, non-2xx status) is retried after a
// backoff that doubles from `backoff_ms` (capped at 30 s) up to `max_attempts` attempts; then
// the document is given up and counted (flare_webhook_failures_total) and the first such
// failure is logged (once). Plain HTTP/1.1 only (https: URLs are refused at start-up; put a TLS
// proxy in front).
//
// Threading: post() and writeMetrics() from any thread; the worker thread owns the sockets.
// The destructor stops the worker (waits at most one timeout); undelivered documents are counted
// as dropped.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace flare::engine {

class PromWriter;

struct WebhookOptions {
  std::string url;  // http://HOST[:PORT][/PATH]
  size_t max_queue = 1000;
  int64_t timeout_ms = 3000;  // per attempt: connect, send and the answer's status line
  int max_attempts = 4;
  int64_t backoff_ms = 500;
};

class Webhook {
 public:
  // Parses the URL and starts the worker; null with *error for a URL it cannot post to.
  static std::unique_ptr<Webhook> start(const WebhookOptions& options, std::string* error);
  ~Webhook();
  Webhook(const Webhook&) = delete;
  Webhook& operator=(const Webhook&) = delete;

  // Queues one JSON document; never blocks.
  void post(std::string json);
  // Blocks until the queue is empty and nothing is in flight, or `timeout_ms` passed (tests).
  bool drain(int64_t timeout_ms);
  void writeMetrics(PromWriter& w) const;
  // The same series with the given values (flared without a webhook writes zeros, so that
  // dashboards and rules find the names).
  static void writeMetricsOf(PromWriter& w, uint64_t delivered, uint64_t failures, uint64_t retries,
                             uint64_t dropped, size_t depth);

  uint64_t delivered() const { return delivered_.load(); }
  uint64_t failures() const { return failures_.load(); }

 private:
  explicit Webhook(const WebhookOptions& options);
  void loop();
  // One attempt; true on a 2xx answer. *why: the failure.
  bool attempt(const std::string& body, std::string* why);

  WebhookOptions options_;
  std::string host_;
  std::string port_;
  std::string path_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::string> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;

  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace flare::engine
