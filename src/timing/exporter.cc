// GrpcExporter (exporter.h): construction, the Sink calls of the poller thread, shutdown and the
// sender thread's connect/backoff loop (run). One stream's life is in exporter_stream.cc, the
// pending spool in exporter_spool.cc, the re-send window in exporter_resend.cc.
#include "src/timing/exporter.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "src/common/log.h"
#include "src/common/private_dir.h"
#include "src/common/text.h"
#include "src/records/collective_blocks.h"
#include "src/timing/exporter_internal.h"

namespace flare::timing {

void UnsupportedCommands::handle(const flare::v1::Command& /*command*/,
                                 flare::v1::CommandResult* result) {
  result->set_ok(false);
  result->set_error("not supported yet");
}

GrpcExporter::GrpcExporter(std::unique_ptr<Transport> transport, ExporterOptions options)
    : options_(std::move(options)),
      transport_(std::move(transport)),
      handler_(options_.handler != nullptr ? options_.handler : &default_handler_),
      builder_(options_.identity.rank,
               BatchBuilderOptions{
                   .batch_bytes = options_.batch_bytes,
                   .clock_map = options_.clock_map,
                   .extra_drops =
                       [this](flare::v1::DropCounters* d) {
                         d->set_spool_dropped(spool_dropped_.load(std::memory_order_relaxed));
                         d->set_send_failed(send_failed_.load(std::memory_order_relaxed));
                       },
                   .summary_mode = [this] { return mode() == flare::v1::MODE_SUMMARY; },
                   .summary_window_ns = options_.summary_window_ns,
                   .run_queue_wait = {},  // the default reader
                   .now_ns = {},
                   .run_queue_period_ns = BatchBuilderOptions::kRunQueuePeriodNs,
                   .raw_run_queue_period_ns = BatchBuilderOptions::kRawRunQueuePeriodNs,
                   .run_queue_off = {},
                   .step_decisions = {}},
               [this](flare::v1::RecordBatch&& batch) { enqueue(std::move(batch)); }),
      mode_(static_cast<int>(options_.mode)) {
  if (options_.spool_dir.empty()) options_.spool_dir = common::defaultSpoolRoot();
  spool_path_ = (std::filesystem::path(options_.spool_dir) /
                 common::safePathComponent(options_.identity.job_id) /
                 std::to_string(options_.identity.rank) /
                 ("pending-" + std::to_string(options_.identity.pid) + ".pb"))
                    .string();
  resend_limit_ = options_.resend_bytes;
  start_unix_ns_ = common::realtimeNs();  // before any thread: the hello and the spool's meta
  sender_ = std::thread([this] { run(); });
}

GrpcExporter::~GrpcExporter() {
  if (forked_.load(std::memory_order_acquire)) {
    // A forked child: the threads are the parent's; leak them rather than touch them.
    if (sender_.joinable()) sender_.detach();
    if (sweeper_.joinable()) sweeper_.detach();
    return;
  }
  shutdown(0);
  if (sender_.joinable()) sender_.join();  // bounded: the sender sees stopping_ after a connect
  sweep_cancel_ = true;
  if (sweeper_.joinable()) sweeper_.join();  // bounded: cancelling ends its stream at once
}

int64_t GrpcExporter::nowNs() const {
  return common::monotonicNs();
}

// ---- poller thread -------------------------------------------------------------------------

void GrpcExporter::onSignature(uint32_t id, const Signature& sig) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addSignature(id, sig);
}

void GrpcExporter::onOps(std::span<const CompletedOp> ops) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addOps(ops);
}

void GrpcExporter::onApiName(uint32_t id, const std::string& qualified_name) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addApiName(id, qualified_name);
}

void GrpcExporter::onSpans(std::span<const CompletedSpan> spans) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addSpans(spans);
}

void GrpcExporter::onGraphLaunches(std::span<const int64_t> issue_ns) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addGraphLaunches(issue_ns);
}

void GrpcExporter::onDeepTrace(std::span<const DeepTraceRecord> records) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addDeepTrace(records);
}

void GrpcExporter::postCommandResult(const flare::v1::CommandResult& result) {
  if (forked_.load(std::memory_order_relaxed)) return;
  flare::v1::RankMessage reply;
  *reply.mutable_command_result() = result;
  std::string out;
  reply.SerializeToString(&out);
  std::lock_guard<std::mutex> lock(mu_);
  results_.push_back(std::move(out));
  cv_.notify_all();
}

void GrpcExporter::onDrops(const DropCounters& totals) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.setDrops(totals);
}

void GrpcExporter::onDevice(const DeviceDescription& device) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.setDevice(device);
  std::lock_guard<std::mutex> lock(mu_);
  hello_device_ = toProtoDevice(device);
}

void GrpcExporter::flush() {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.flush();
  checkStall();
}

void GrpcExporter::finish() {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.finish();
  checkStall();
}

void GrpcExporter::enqueue(flare::v1::RecordBatch&& batch) {
  if (forked_.load(std::memory_order_relaxed)) return;
  Item item;
  item.bytes = batch.ByteSizeLong();
  item.batch = std::move(batch);
  bool over = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    over = !shutdown_done_ && queue_bytes_ + item.bytes > options_.buffer_bytes;
  }
  if (over) spill(options_.buffer_bytes / 2);  // the sender is not keeping up: to the spool
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_done_) {
    // After shutdown: keep nothing, count.
    stats_.records_dropped += records::recordCount(item.batch);
    stats_.send_failed++;
    send_failed_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  queue_bytes_ += item.bytes;
  queue_.push_back(std::move(item));
  cv_.notify_all();
}

void GrpcExporter::checkStall() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ != nullptr && write_started_ns_ != 0 &&
      nowNs() - write_started_ns_ > options_.stall_timeout_ns) {
    common::logOnce(common::LogLevel::kWarn, kExportLog, "export-stall",
                    "flare: the daemon has not read from this rank's stream for {:.0f} s; "
                    "reconnecting (records are spooled meanwhile)",
                    static_cast<double>(options_.stall_timeout_ns) / 1e9);
    active_->t->cancel();
    write_started_ns_ = 0;
  }
}

// ---- any thread ----------------------------------------------------------------------------

ExporterStats GrpcExporter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ExporterStats s = stats_;
  s.queue_bytes = queue_bytes_;
  return s;
}

bool GrpcExporter::shutdown(int64_t timeout_ns) {
  if (forked_.load(std::memory_order_acquire)) return false;
  std::unique_lock<std::mutex> lock(mu_);
  if (!shutdown_done_) {
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ns_ = nowNs() + std::max<int64_t>(timeout_ns, 0);
      cv_.notify_all();
    }
    const auto until = [&](int64_t deadline_ns) {
      while (!sender_done_) {
        const int64_t left = deadline_ns - nowNs();
        if (left <= 0) break;
        done_cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 50'000'000)));
      }
    };
    until(stop_deadline_ns_ + 50'000'000);
    if (!sender_done_ && active_ != nullptr) active_->t->cancel();  // stuck in the transport
    until(nowNs() + 200'000'000);
    shutdown_done_ = true;
    const bool joined = sender_done_;
    lock.unlock();
    // The spool sweep stops at once (its current file is kept whole for the next process).
    sweep_cancel_ = true;
    if (sweeper_.joinable()) sweeper_.join();
    if (joined) {
      if (sender_.joinable()) sender_.join();
    } else {
      // Stuck in the transport (e.g. a connect attempt): spool the queue from here and leave
      // the sender to finish on its own (the destructor joins it).
      finishSpool();
    }
    lock.lock();
  }
  return queue_.empty() && stats_.spool_bytes == 0 && stats_.send_failed == 0 &&
         stats_.spool_dropped == 0 && !stats_.refused;
}

void GrpcExporter::reportHang(const flare::v1::HangReport& report) {
  if (forked_.load(std::memory_order_acquire)) return;
  flare::v1::RankMessage m;
  *m.mutable_hang_report() = report;
  std::string bytes;
  m.SerializeToString(&bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (!hang_pending_.empty()) stats_.hang_reports_unsent++;  // replaced before it went out
  hang_pending_ = std::move(bytes);
  cv_.notify_all();
}

// ---- sender thread -------------------------------------------------------------------------

void GrpcExporter::run() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);  // gRPC's threads inherit it
  pthread_setname_np(pthread_self(), "flare-export");
  int64_t backoff = options_.backoff_min_ns;
  bool final_attempt = false;  // made at stop, while not connected
  for (;;) {
    bool refused = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      refused = stats_.refused;
      // Stopping while not connected, with something left to send: one more attempt within the
      // deadline, made at once (a process that ends in the backoff after a daemon's hiccup
      // still delivers; a daemon that is down costs one connect attempt), then the spool. For a
      // short process whose first connection is still to come, that is its first.
      if (stopping_) {
        const bool pending = !queue_.empty() || stats_.spool_bytes > 0;
        if (nowNs() >= stop_deadline_ns_ || !pending || final_attempt) break;
        final_attempt = true;
      }
    }
    if (!refused) {
      if (streamOnce()) backoff = options_.backoff_min_ns;
      parkResend();
    }
    if (refused || stats().refused) {
      // Refused: no more attempts, everything goes to the spool.
      spill(0);
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) break;
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) continue;  // the loop's top: the final attempt, or the spool
    // Backoff with ±20 % jitter; meanwhile the memory queue is kept under half its bound.
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    const double jitter = 0.8 + 0.4 * static_cast<double>(rng_ % 1000) / 1000.0;
    const int64_t wake = nowNs() + static_cast<int64_t>(static_cast<double>(backoff) * jitter);
    backoff = std::min(backoff * 2, options_.backoff_max_ns);
    while (!stopping_ && nowNs() < wake) {
      if (queue_bytes_ > options_.buffer_bytes / 2) {
        lock.unlock();
        spill(options_.buffer_bytes / 2);
        lock.lock();
      }
      cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(wake - nowNs(), 50'000'000)));
    }
  }
  // Stopping: whatever was not sent goes to the spool, after the re-send window.
  parkResend();
  {
    std::lock_guard<std::mutex> lock(mu_);
    results_.clear();  // command results die with the stream
  }
  finishSpool();
  std::unique_lock<std::mutex> lock(mu_);
  sender_done_ = true;
  done_cv_.notify_all();
}

}  // namespace flare::timing
