// GrpcExporter: the Sink that streams a rank's records to flared over one bidirectional stream
// (service flare.v1.Ingest, rpc Stream), spilling to the local spool while the daemon is slow,
// down or refuses the rank, and replaying the spool in order when it comes back.
//
// Flow (files: exporter.cc the Sink calls, shutdown and the connect loop; exporter_stream.cc one
// stream; exporter_spool.cc the pending spool; exporter_resend.cc the re-send window):
//
//   poller thread (Sink calls)            sender thread "flare-export"         reader thread
//   BatchBuilder → closed batch ──▶ memory queue (≤ buffer_bytes) ──▶ stream.write ◀── acks,
//     over the bound: records dropped,  │ disconnected: oldest beyond          commands
//     tables kept (send_failed)         ▼ buffer_bytes/2 spilled               (handler)
//                                     spool DIR/<job>/<rank>/pending-<pid>.pb ─ replayed first
//
// - A stream starts with a RankHello (token, identity, protocol version, mode) and waits for
//   the HelloAck. accepted=false → one log line; the rank stops streaming and everything goes
//   to the spool.
// - The first batch of every stream carries every signature and API name seen so far (the
//   daemon's per-stream tables start empty after a reconnect).
// - Order: batches written but possibly not yet read by the daemon when a stream breaks (the
//   last resend_bytes of them) are re-sent first with from_spool=true, then the spool, then the
//   memory queue. batch_seq is the builder's (per process, without gaps), so the daemon can
//   drop the duplicates of a re-send (at-least-once delivery). A HelloAck with
//   resume_after_seq = N (the daemon holds this process's batches up to N durably) makes the
//   rank skip re-sent and replayed batches up to N (exactly once across a daemon restart).
// - Memory bound: when a batch would take the queue over buffer_bytes, the poller itself moves
//   the oldest queued batches to the spool (a write(2), like SpoolSink) until it is under half.
//   While disconnected the sender does the same at half the bound.
// - Spool cap (spool_max_bytes): a batch that does not fit is dropped, its tables kept
//   (spool_dropped). Every drop is counted and goes out in the next batches' DropCounters.
// - Backoff between attempts: backoff_min_ns doubling to backoff_max_ns, ±20 % jitter.
// - A write that blocks longer than stall_timeout_ns (a daemon that stopped reading) cancels
//   the stream, checked by the poller's Sink calls (every flush, i.e. every second).
//
// Threading: the Sink methods are called on the poller thread only and never block on the
// network (they take one mutex, held by other threads only for queue operations). shutdown()
// and the accessors are safe from any thread; disableAfterFork() is async-signal-safe (a flag).
// The exporter owns its sender thread and, per stream, a reader thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "flare/v1/service.pb.h"
#include "src/common/clock.h"
#include "src/common/identity.h"
#include "src/timing/batch_builder.h"
#include "src/timing/spool_upload.h"
#include "src/timing/timing.h"
#include "src/timing/transport.h"

namespace flare::timing {

// Answers the daemon's commands (DumpStacks, Inspect, DeepTrace, ...). Called on the reader
// thread; must not block for long. SetMode is handled by the exporter itself.
class CommandHandler {
 public:
  virtual ~CommandHandler() = default;
  // Fills `result` (command_id is set by the caller).
  virtual void handle(const flare::v1::Command& command, flare::v1::CommandResult* result) = 0;
};

// The default: every command but SetMode answers ok=false "not supported yet".
class UnsupportedCommands final : public CommandHandler {
 public:
  void handle(const flare::v1::Command& command, flare::v1::CommandResult* result) override;
};

struct ExporterOptions {
  common::Identity identity;
  std::string token;          // FLARE_TOKEN, sent in the hello
  std::string spool_dir;      // FLARE_OUTPUT_DIR
  std::string flare_version;  // Versions.flare in the hello
  bool hang_kill = false;     // RankHello.hang_kill (FLARE_HANG_KILL)
  size_t batch_bytes = 64 * 1024;
  size_t buffer_bytes = 8u << 20;         // memory queue bound
  uint64_t spool_max_bytes = 1ull << 30;  // spool file bound
  // Re-sent after a broken stream; 0: none. It must cover what the transport and the daemon's
  // receive buffers can hold unread (MBs with gRPC's flow-control windows): with no per-batch
  // acknowledgement in the protocol, that is what a killed or wedged daemon loses.
  size_t resend_bytes = 16u << 20;
  int64_t backoff_min_ns = 100'000'000;
  int64_t backoff_max_ns = 30'000'000'000;
  int64_t hello_timeout_ns = 10'000'000'000;
  int64_t stall_timeout_ns = 10'000'000'000;
  // MODE_SUMMARY: compute ops leave as KernelSummary messages (batch_builder.h); changed at
  // run time by the daemon's SetMode (or a non-UNSPECIFIED mode in its HelloAck).
  flare::v1::Mode mode = flare::v1::MODE_RAW;
  int64_t summary_window_ns = 1'000'000'000;
  std::function<common::ClockMap()> clock_map;  // default ClockMap::sample()
  CommandHandler* handler = nullptr;            // not owned; nullptr: UnsupportedCommands
  // After the first accepted hello, upload the spools that ended processes left under
  // spool_dir (spool_upload.h) on a background thread, once (FLARE_SPOOL_SWEEP).
  bool sweep_spool = false;
};

struct ExporterStats {
  uint64_t streams_opened = 0;       // hellos accepted
  uint64_t connect_failures = 0;     // attempts that did not get an accepted hello
  uint64_t batches_sent = 0;         // written to a stream (re-sends included)
  uint64_t batches_resent = 0;       // of which re-sends after a broken stream
  uint64_t batches_spooled = 0;      // written to the spool file
  uint64_t batches_replayed = 0;     // read back from the spool and sent
  uint64_t batches_skipped = 0;      // re-sends and replays the daemon already held (resume point)
  uint64_t send_failed = 0;          // batches whose records were dropped: memory queue full
  uint64_t spool_dropped = 0;        // batches whose records were dropped: spool full or failing
  uint64_t records_dropped = 0;      // kernel records of those batches
  uint64_t commands = 0;             // commands received
  uint64_t hang_reports_sent = 0;    // HangReports written to a stream
  uint64_t hang_reports_unsent = 0;  // replaced by a newer one, or the daemon does not read them
  // BatchRejected from the daemon: batches it refused whole, and items it dropped from batches
  // it otherwise applied. Each reason is logged once; the tables go again with the next batch.
  uint64_t batches_rejected = 0;
  uint64_t items_rejected = 0;
  bool refused = false;  // the daemon refused the hello
  bool connected = false;
  size_t queue_bytes = 0;
  uint64_t spool_bytes = 0;  // not yet replayed
};

class GrpcExporter final : public Sink {
 public:
  // Starts the sender thread. `transport` is owned.
  GrpcExporter(std::unique_ptr<Transport> transport, ExporterOptions options);
  ~GrpcExporter() override;  // shutdown(0) if not done
  GrpcExporter(const GrpcExporter&) = delete;
  GrpcExporter& operator=(const GrpcExporter&) = delete;

  void onSignature(uint32_t id, const Signature& sig) override;
  void onOps(std::span<const CompletedOp> ops) override;
  void onDrops(const DropCounters& totals) override;
  void flush() override;
  void finish() override;
  void onWatermark(int64_t issued_before_ns) override { builder_.setWatermark(issued_before_ns); }
  void onApiName(uint32_t id, const std::string& qualified_name) override;
  void onSpans(std::span<const CompletedSpan> spans) override;
  void onGraphLaunches(std::span<const int64_t> issue_ns) override;
  void onDeepTrace(std::span<const DeepTraceRecord> records) override;
  void onDevice(const DeviceDescription& device) override;

  // Any thread: sends a command result the handler produced later (a DeepTrace that finished
  // after its first answer); it replaces the earlier result of the same command in the daemon.
  // Dropped (with the other pending results) if the stream breaks before it is written.
  void postCommandResult(const flare::v1::CommandResult& result);

  // Sends what is queued (after the Tracer's last flush) for at most `timeout_ns`, spools the
  // rest and stops the threads. Not connected (a backoff after a broken stream, or no attempt
  // yet) with something to send: one connection attempt at once, within the deadline. Returns true
  // when everything went to the daemon. Idempotent. If the sender is stuck in the transport past
  // the deadline, it is cancelled and, 200 ms later, abandoned (detached): the exit is never held
  // up.
  bool shutdown(int64_t timeout_ns);
  // In a forked child: every later call is a no-op; threads and the stream are the parent's.
  void disableAfterFork() { forked_.store(true, std::memory_order_release); }

  // Any thread: sends `report` (a suspected hang, src/hook/hang_watch.h) on the stream ahead of
  // queued batches; while disconnected the latest report waits for the next stream. Never
  // blocks. Dropped (counted in hang_reports_unsent) when the daemon's HelloAck does not say
  // hang_reports.
  void reportHang(const flare::v1::HangReport& report);

  ExporterStats stats() const;
  flare::v1::Mode mode() const { return static_cast<flare::v1::Mode>(mode_.load()); }
  const std::string& spoolPath() const { return spool_path_; }

 private:
  struct Item {
    flare::v1::RecordBatch batch;
    size_t bytes = 0;
  };
  struct Stream;

  // exporter.cc
  void enqueue(flare::v1::RecordBatch&& batch);  // the builder's emit (poller thread)
  void run();                                    // the sender thread
  void checkStall();
  int64_t nowNs() const;
  // exporter_stream.cc: one stream, on the sender thread (readLoop: its reader thread).
  bool streamOnce();  // one connection; false: attempt failed
  bool connect(Stream& s);
  bool sendPending(Stream& s, bool* first, bool* graceful);
  std::string endStream(Stream& s, bool graceful);
  bool sendBatch(Stream& s, flare::v1::RecordBatch& batch, bool first);
  void readLoop(Stream* s);
  void learnTables(const flare::v1::RecordBatch& batch);
  flare::v1::RankMessage makeHello();
  // exporter_spool.cc: the pending spool.
  void spill(size_t keep_bytes);                          // any thread; takes spool_mu_ then mu_
  bool spoolAppend(const flare::v1::RecordBatch& batch);  // spool_mu_ held
  bool spoolReadNext(flare::v1::RecordBatch* batch);      // spool_mu_ held
  bool spoolPending();
  void finishSpool();
  void writeMeta();   // spool_mu_ held
  void keepOrphan();  // spool_mu_ held
  void sweepOrphans();
  static void stripRecords(flare::v1::RecordBatch* batch);
  // exporter_resend.cc: the re-send window (sender thread).
  bool resendWindow(Stream& s, bool* first);
  void remember(Item&& item);  // into the re-send window
  void parkResend();

  ExporterOptions options_;
  std::unique_ptr<Transport> transport_;
  UnsupportedCommands default_handler_;
  CommandHandler* handler_;
  BatchBuilder builder_;  // poller thread only
  std::atomic<bool> forked_{false};
  std::atomic<int> mode_;

  mutable std::mutex mu_;
  std::optional<flare::v1::DeviceInfo> hello_device_;  // guarded by mu_: later hellos carry it
  std::condition_variable cv_;       // sender waits: queue, results, stream broken, stop
  std::condition_variable done_cv_;  // shutdown waits: sender finished
  std::deque<Item> queue_;           // guarded by mu_
  size_t queue_bytes_ = 0;
  std::deque<std::string> results_;  // serialized RankMessage{command_result}, to write
  std::string hang_pending_;         // serialized RankMessage{hang_report}; empty: none
  bool stopping_ = false;
  int64_t stop_deadline_ns_ = 0;
  bool sender_done_ = false;
  bool shutdown_done_ = false;
  Stream* active_ = nullptr;      // the live stream (for cancel)
  int64_t write_started_ns_ = 0;  // 0: no write in progress
  ExporterStats stats_;

  std::mutex tables_mu_;  // every table entry seen, by id
  std::map<uint32_t, flare::v1::Signature> sigs_;
  std::map<uint32_t, flare::v1::ApiName> apis_;

  // The spool. Lock order: spool_mu_, then mu_. Anything spilled is newer than what is in the
  // spool already and older than what stays queued, so the file stays in batch order.
  std::mutex spool_mu_;
  std::string spool_path_;
  int spool_fd_ = -1;
  bool spool_failed_ = false;
  uint64_t spool_read_ = 0;   // offset of the next batch to replay
  uint64_t spool_write_ = 0;  // end of the file

  // Sender thread only.
  std::deque<Item> resend_;  // last batches written; re-sent after a broken stream
  size_t resend_bytes_ = 0;
  size_t resend_limit_ = 0;
  bool was_connected_ = false;
  bool spool_reported_ =
      false;  // guarded by mu_  // guarded by mu_; for logging state changes only
  int64_t start_unix_ns_ = 0;
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;

  std::atomic<uint64_t> send_failed_{0};
  std::thread sweeper_;  // sweepOrphans(); started by the sender, joined by the destructor
  std::atomic<bool> sweep_cancel_{false};
  std::atomic<uint64_t> spool_dropped_{0};
  std::thread sender_;
};

}  // namespace flare::timing
