// StoreWriteQueue: the write path both history stores share (SqliteStore, PgStore). Store calls
// queue their writes here and return at once; one writer thread takes everything queued (up to
// kMaxOpsPerTransaction ops) and hands it, in order, to the store's commit function, which
// applies it in one transaction. The queue is bounded: a write that would exceed the op or the
// raw-record limit is dropped and counted (flare_store_dropped_total), never waited for, so
// ingest never blocks on the database.
//
// Threads: push(), admitRaw(), flush() and the counters from any thread; the commit function
// runs on the writer thread only. Owned by its store, which calls stop() before it closes the
// connections the commit function uses.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "src/engine/metrics.h"

namespace flare::engine {

// Ops per transaction: large enough that a burst commits in few transactions, small enough that
// one transaction does not hold the write lock (and maintain()) for long.
inline constexpr size_t kMaxOpsPerTransaction = 20000;
// The stores' default limits (SqliteStore::Options, PgStore::Options): writes waiting, and raw
// records waiting (~200 MB).
inline constexpr size_t kDefaultMaxQueuedOps = 200000;
inline constexpr size_t kDefaultMaxQueuedRaw = 2000000;

// What a store's writes did: the counters behind the flare_store_* write metrics, updated by the
// ops and the commit function (writer thread), read by /metrics (any thread).
struct StoreWriteCounters {
  std::atomic<uint64_t> transactions{0};  // transactions committed (or rolled back)
  std::atomic<uint64_t> rows_written{0};  // state rows: jobs, ranks, signatures, windows, marks
  std::atomic<uint64_t> raw_written{0};   // raw records and deep-trace rows
  std::atomic<uint64_t> errors{0};        // rows or whole transactions the database refused
};

// `Op` is the store's write operation (a std::function taking its write connection).
template <typename Op>
class StoreWriteQueue {
 public:
  // Applies `ops` (never empty, in queue order) in one transaction; on the writer thread.
  using Commit = std::function<void(std::vector<Op>& ops)>;

  // `max_ops`: ops waiting; `max_raw`: raw records waiting (each op says how many it carries).
  StoreWriteQueue(size_t max_ops, size_t max_raw,
                  size_t max_ops_per_transaction = kMaxOpsPerTransaction)
      : max_ops_(max_ops), max_raw_(max_raw), per_transaction_(max_ops_per_transaction) {}
  ~StoreWriteQueue() { stop(); }
  StoreWriteQueue(const StoreWriteQueue&) = delete;
  StoreWriteQueue& operator=(const StoreWriteQueue&) = delete;

  // Starts the writer thread. Called once.
  void start(Commit commit) {
    commit_ = std::move(commit);
    writer_ = std::thread([this] { writerLoop(); });
  }

  // Commits everything queued, then joins the writer thread. Idempotent; push() after stop()
  // queues ops nobody applies.
  void stop() {
    if (!writer_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    queue_cv_.notify_all();
    writer_.join();
  }

  // Queues `op`, which carries `raw_records` raw records. Unless `never_drop`, an op that finds
  // max_ops ops waiting, or would bring the raw records waiting above max_raw, is dropped and
  // counted (its raw records, or 1 for an op without). Returns whether it was queued.
  bool push(Op op, size_t raw_records, bool never_drop = false) {
    {
      std::lock_guard lock(mu_);
      if (!never_drop && (queue_.size() >= max_ops_ || queued_raw_ + raw_records > max_raw_)) {
        dropped_.fetch_add(raw_records > 0 ? raw_records : 1, std::memory_order_relaxed);
        return false;
      }
      queue_.emplace_back(std::move(op), raw_records);
      queued_raw_ += raw_records;
      ++enqueued_seq_;
      depth_.store(queue_.size(), std::memory_order_relaxed);
    }
    queue_cv_.notify_one();
    return true;
  }

  // Whether `raw_records` more raw records fit under max_raw now; when not, counts them as
  // dropped (a checkpoint then sheds its raw records and queues the rest with never_drop).
  bool admitRaw(size_t raw_records) {
    std::lock_guard lock(mu_);
    if (queued_raw_ + raw_records <= max_raw_) return true;
    dropped_.fetch_add(raw_records, std::memory_order_relaxed);
    return false;
  }

  // Returns once every op queued before the call has been committed (or failed).
  void flush() {
    std::unique_lock lock(mu_);
    const uint64_t target = enqueued_seq_;
    drained_cv_.wait(lock, [&] { return applied_seq_ >= target; });
  }

  // The same, waiting at most `timeout`: whether it was committed (or failed) by then.
  bool flushWithin(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    const uint64_t target = enqueued_seq_;
    return drained_cv_.wait_for(lock, timeout, [&] { return applied_seq_ >= target; });
  }

  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t depth() const { return depth_.load(std::memory_order_relaxed); }

  // The write metrics both stores export: transactions, rows written, drops, errors and the
  // queue depth (each store adds its own retention and size families).
  void writeMetrics(PromWriter& w, const StoreWriteCounters& n) const {
    auto c = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    w.family("flare_store_transactions_total", "counter", "Write transactions committed.");
    w.sample("flare_store_transactions_total", c(n.transactions));
    w.family("flare_store_rows_written_total", "counter",
             "Rows written to the store, by table group.");
    w.sample("flare_store_rows_written_total", c(n.raw_written), {{"table", "raw_records"}});
    w.sample("flare_store_rows_written_total", c(n.rows_written), {{"table", "state"}});
    w.family("flare_store_dropped_total", "counter",
             "Writes (raw records counted singly) dropped because the write queue was full.");
    w.sample("flare_store_dropped_total", dropped());
    w.family("flare_store_errors_total", "counter", "Rows or transactions the database refused.");
    w.sample("flare_store_errors_total", c(n.errors));
    w.family("flare_store_queue_depth", "gauge", "Writes waiting for the writer thread.");
    w.sample("flare_store_queue_depth", static_cast<uint64_t>(depth()));
  }

 private:
  void writerLoop() {
    std::vector<Op> ops;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty() && stop_) return;
        while (!queue_.empty() && ops.size() < per_transaction_) {
          ops.push_back(std::move(queue_.front().first));
          queued_raw_ -= queue_.front().second;
          queue_.pop_front();
        }
        depth_.store(queue_.size(), std::memory_order_relaxed);
      }
      commit_(ops);
      const size_t n = ops.size();
      ops.clear();
      {
        std::lock_guard lock(mu_);
        applied_seq_ += n;
      }
      drained_cv_.notify_all();
    }
  }

  const size_t max_ops_;
  const size_t max_raw_;
  const size_t per_transaction_;
  Commit commit_;  // set before the writer thread starts; called on it only

  std::mutex mu_;
  std::condition_variable queue_cv_;
  std::condition_variable drained_cv_;
  std::deque<std::pair<Op, size_t>> queue_;  // GUARDED_BY(mu_): op, raw records in it
  size_t queued_raw_ = 0;                    // GUARDED_BY(mu_)
  uint64_t enqueued_seq_ = 0;                // GUARDED_BY(mu_)
  uint64_t applied_seq_ = 0;                 // GUARDED_BY(mu_)
  bool stop_ = false;                        // GUARDED_BY(mu_)
  std::thread writer_;

  std::atomic<uint64_t> dropped_{0};
  std::atomic<size_t> depth_{0};
};

}  // namespace flare::engine
