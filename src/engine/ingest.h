// Ingest: the transport-agnostic core of flared (conventions.md #6). It owns the per-job and
// per-rank state, validates everything a rank sends, keeps the running per-signature aggregates
// behind the kernel reports, routes commands to ranks and counts every refusal.
//
// Sessions. A transport (grpc_server.h) calls hello() for the first message of a stream, then
// batch()/commandResult() for the rest, and close() when the stream ends. A session is bound to
// the job and rank of its accepted hello: a batch naming another rank is a protocol violation,
// so no stream can write into another rank's or job's state. A second stream of the same
// (job, rank) replaces the first (the rank reconnected); the old stream is told to close.
//
// Exactly once. Each rank process numbers its batches (batch_seq, no gaps). Per (job, rank,
// process) the highest seq applied is kept; a batch at or below it is dropped and counted
// (duplicate_batch for spool replays, out_of_order otherwise), and the HelloAck's
// resume_after_seq tells a reconnecting rank where to resume. persist() writes everything
// applied since the previous call (aggregates, rank rows, raw records, summary windows, open
// windows included) together with those marks as ONE Store::Checkpoint, so after a crash the
// reloaded state and the marks agree: what a rank re-sends is counted exactly once.
//
// Validation. decode() and batch() check every field before anything changes. One bad item
// never costs the rest of its batch: an invalid record, summary, span, step marker, step
// statistic, signature or API name is dropped alone, counted by reason
// (flare_ingest_items_dropped_total{reason=...} and the rank's Refusals) and logged once per
// job, rank and reason, and everything else, the signature and API tables above all, is applied.
// Whole batches are refused only for what concerns the batch itself (oversized, rate limit,
// batch_seq out of order: flare_ingest_rejected_total{reason=...}). Protocol violations (no
// hello, another rank, bytes that do not decode) ask the transport to close the stream. Either
// way the Verdict says what was refused, and the transport tells the rank (BatchRejected).
//
// Files: this class's batch path is split by stage: ingest_session.cc (hello, close, the checks of
// a batch as a whole), ingest_validate.{h,cc} (the items' rules, pure functions), ingest_apply.cc
// (Ingest::batch and applying); ingest.cc has the rest.
//
// Threading: every public method is thread-safe (one mutex; batches are small and applying one
// is a few hundred nanoseconds per record). CommandChannel methods are called with that mutex
// held and must only queue. Owned by flared_main; holds a Store* it does not own.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "flare/v1/service.pb.h"
#include "src/common/clock.h"
#include "src/engine/histogram.h"
#include "src/engine/store.h"

namespace flare::engine {

class PromWriter;

// Why something a rank or client sent was refused. Labels of flare_ingest_rejected_total.
enum class Reason : uint8_t {
  kMalformed,          // bytes that are not a RankMessage, or an empty message
  kOversized,          // a batch with more items than --max-batch-items, or a too-large message
  kNoHello,            // a batch or result before an accepted hello
  kDuplicateHello,     // a second hello on one stream
  kBadHello,           // missing or out-of-range hello fields
  kProtocolVersion,    // a protocol version this daemon cannot read
  kUnauthenticated,    // missing or wrong token
  kTooManyJobs,        // --max-jobs reached
  kTooManyRanks,       // --max-ranks-per-job reached
  kRankMismatch,       // a batch naming another rank than the stream's hello
  kSessionReplaced,    // a message on a stream whose rank reconnected on another stream
  kUnknownSignature,   // a record naming a signature (or API) id never sent
  kBadSignature,       // a signature with id 0 or fields out of bounds
  kTooManySignatures,  // more than --max-signatures-per-rank
  kBadTimestamp,       // a time out of the plausible range, or an end before its start
  kBadRecord,          // other out-of-range record fields
  kRateLimited,        // the rank's record rate is over --rank-rate-limit
  kDuplicateBatch,     // a spool replay of a batch already received
  kOutOfOrder,         // a batch_seq not after the stream's previous one
  kCount
};
const char* reasonName(Reason r);

// A status a transport can map onto its own (gRPC codes of the same names).
enum class Code : uint8_t {
  kOk,
  kInvalidArgument,
  kUnauthenticated,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kNotFound
};

struct Verdict {
  Code code = Code::kOk;
  Reason reason = Reason::kCount;  // kCount when ok (with items dropped: the first one's reason)
  std::string error;
  bool close_stream = false;   // protocol violation: the transport ends the stream with `code`
  uint64_t items_dropped = 0;  // ok(): items of the batch refused (the rest was applied)
  bool ok() const { return code == Code::kOk; }
};

// The items' validation of a batch (TimeLimits, stepStatsError, findInvalidItems) is in
// ingest_validate.h.
struct BatchFilter;

// The transport's side of one stream, for messages the daemon sends unprompted.
class CommandChannel {
 public:
  virtual ~CommandChannel() = default;
  // Queues a message for the rank; false when the channel's queue is full (counted).
  virtual bool send(const v1::DaemonMessage& msg) = 0;
  // Asks the transport to end the stream with this status.
  virtual void close(Code code, const std::string& error) = 0;
};

struct IngestConfig {
  size_t max_message_bytes = 8u << 20;
  size_t max_batch_items = 200000;  // records + summaries + spans + steps + table entries
  size_t max_jobs = 4096;
  size_t max_ranks_per_job = 65536;
  size_t max_signatures_per_rank = 65536;
  double rank_rate_limit = 2e6;                   // records/s per rank (token bucket); 0: no limit
  double rank_rate_burst_s = 2.0;                 // bucket depth in seconds of the rate
  int64_t max_future_ns = 3600LL * 1000000000LL;  // timestamps this far ahead of the daemon
  int64_t min_timestamp_ns = 1577836800LL * 1000000000LL;  // 2020-01-01
  int64_t max_duration_ns = 86400LL * 1000000000LL;        // one kernel/step/span at most a day
  bool store_raw = true;                                   // append raw kernel records to the store
  int64_t summary_window_ns = 60LL * 1000000000LL;         // stored rows fold ranks' summaries
  size_t max_pending_commands = 32;                        // per rank, while it is not connected
  // Raw kernel records waiting for the next checkpoint (persist()); beyond: dropped, counted
  // (flare_ingest_raw_dropped_total). ~60 bytes each.
  size_t max_pending_raw = 2000000;
  size_t max_incarnations_per_rank = 4;  // rank processes whose batch_seq marks stay in memory
  // Tokens: job -> token, and a token for every other job ("" = none). With neither, every
  // hello is accepted (the loopback default).
  std::unordered_map<std::string, std::string> job_tokens;
  std::string default_token;
  // Called after every accepted batch, outside the ingest lock, with the batch as the rank sent
  // it (rank-local table ids): the detectors' feed (analyzer.h). Empty: nothing is called.
  std::function<void(const std::string& job_id, int32_t rank, const v1::RecordBatch& batch)>
      on_batch;
  // Called after a batch of which something was refused, outside the ingest lock, once per
  // reason: the rank, the reason's label, whole batches and items refused, the first error. The
  // detectors' feed (Analyzer::onRefused: an alert routed to infrastructure while a rank's data
  // is being refused). Empty: nothing is called.
  std::function<void(const std::string& job_id, int32_t rank, const char* reason, uint64_t batches,
                     uint64_t items, const std::string& error, int64_t now_ns)>
      on_refused;
  // Called after an accepted HangReport, outside the ingest lock (wakes the hang monitor).
  std::function<void()> on_hang_report;
  size_t max_hang_reports = 4096;  // received and not yet taken; beyond: dropped (counted)
};

// A rank's HangReport as the daemon received it (takeHangReports).
struct ReceivedHangReport {
  std::string job_id;
  int32_t rank = 0;
  int64_t received_ns = 0;  // daemon wall clock
  v1::HangReport report;
};

// A DeviceInfo's name and UUID as the daemon keeps them: at most 256 and 64 bytes, printable
// ASCII/UTF-8 without control characters. false: the DeviceInfo is ignored (counted), the batch
// or hello that carried it is not.
bool validDeviceInfo(const v1::DeviceInfo& device);

// Counters of one Ingest; all monotonic.
struct IngestCounters {
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Reason::kCount)> rejected{};  // batches
  // Items dropped from batches that were otherwise applied.
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Reason::kCount)> items_dropped{};
  std::atomic<uint64_t> hellos_accepted{0};
  std::atomic<uint64_t> sessions_replaced{0};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> kernel_records{0};
  std::atomic<uint64_t> deep_trace_records{0};  // CUPTI records of deep traces
  std::atomic<uint64_t> bad_device_info{0};  // DeviceInfo ignored (overlong or control characters)
  std::atomic<uint64_t> summaries{0};
  std::atomic<uint64_t> summarized_kernels{0};
  std::atomic<uint64_t> spans{0};
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> signatures{0};
  std::atomic<uint64_t> lost_batches{0};
  std::atomic<uint64_t> raw_dropped{0};
  std::atomic<uint64_t> commands_sent{0};
  std::atomic<uint64_t> commands_queued{0};
  std::atomic<uint64_t> commands_dropped{0};
  std::atomic<uint64_t> command_results{0};
  std::atomic<uint64_t> hang_reports{0};          // accepted
  std::atomic<uint64_t> hang_reports_dropped{0};  // the queue for the hang monitor was full
  // Sum over ranks of the increases of each DropCounters field (index = field number - 1).
  std::array<std::atomic<uint64_t>, 12> rank_drops{};
};

// A rank's stored summary rows being filled (MODE_SUMMARY), one per (daemon signature id,
// stream): a flat array found from the previous hit (a rank sends its signatures in the same
// order every batch), else by binary search. A row whose count is 0 is a free slot that keeps its
// key. A hash map of rows cost two cache misses a summary and a node allocation per row per
// stored window: a fifth of flared's ingest CPU at 10,000 ranks.
class OpenWindows {
 public:
  // The row of (sig, stream); a new one with count 0 when there is none.
  WindowSummaryRow& row(uint32_t sig, uint64_t stream);
  // Moves a row out and leaves its slot free (count 0, the same key).
  static WindowSummaryRow take(WindowSummaryRow& row);
  // Every slot, free ones (count 0) included.
  std::vector<WindowSummaryRow>& slots() { return rows_; }
  const std::vector<WindowSummaryRow>& slots() const { return rows_; }
  // Drops the free slots whose window started before `before_ns` (idle for a whole window).
  void dropIdle(int64_t before_ns);

 private:
  std::vector<WindowSummaryRow> rows_;
  std::vector<std::pair<std::pair<uint32_t, uint64_t>, uint32_t>> index_;  // sorted key -> slot
  size_t hint_ = 0;
};

class Ingest {
 public:
  // `wall` gives Unix-epoch nanoseconds (RealtimeClock in flared, FakeClock in tests).
  Ingest(IngestConfig config, Store* store, const common::Clock& wall);
  ~Ingest();
  Ingest(const Ingest&) = delete;
  Ingest& operator=(const Ingest&) = delete;

  // Rebuilds jobs, ranks, signatures and aggregates from the store (daemon restart).
  void loadFromStore();

  // Decodes one RankMessage from the wire, with the size limit. Counts kMalformed/kOversized.
  Verdict decode(const void* data, size_t size, v1::RankMessage* out);

  struct HelloOutcome {
    Verdict verdict;
    uint64_t session_id = 0;           // 0 when refused
    v1::HelloAck ack;                  // always filled: send it, then close if refused
    std::vector<v1::Command> pending;  // commands queued while the rank was away
  };
  HelloOutcome hello(const v1::RankHello& hello, std::shared_ptr<CommandChannel> channel);
  Verdict batch(uint64_t session_id, const v1::RecordBatch& batch);
  Verdict commandResult(uint64_t session_id, const v1::CommandResult& result);
  // A rank's watchdog suspects a hang: validated (a first op with a name, ages >= 0), queued
  // for the hang monitor. Bad content is rejected (kBadRecord) without closing the stream.
  Verdict hangReport(uint64_t session_id, const v1::HangReport& report);
  // The reports received since the last call, oldest first (the hang monitor's thread).
  std::vector<ReceivedHangReport> takeHangReports();
  void close(uint64_t session_id);
  // Counts a refusal the transport decided itself (e.g. a second hello).
  void countRejected(Reason r);

  // Queries (the gRPC Query service and the HTTP JSON API).
  v1::ListJobsResponse listJobs(const v1::ListJobsRequest& req);
  // Code::kNotFound for an unknown job.
  Code report(const v1::GetReportRequest& req, v1::GetReportResponse* out);
  Code ranks(const v1::ListRanksRequest& req, v1::ListRanksResponse* out);
  // `token`: the client's token, checked against the job's when tokens are configured. Exit
  // (FLARE_HANG_KILL) is refused (kPermissionDenied): only the hang monitor sends it.
  Code sendCommand(const v1::SendCommandRequest& req, const std::string& token,
                   v1::SendCommandResponse* out, std::string* error);
  // The same without the token check: for the daemon's own commands (hang_monitor.h).
  Code sendCommandTrusted(const v1::SendCommandRequest& req, v1::SendCommandResponse* out,
                          std::string* error);
  Code commandResults(const v1::GetCommandResultsRequest& req, v1::GetCommandResultsResponse* out);

  // Writes dirty job, rank and aggregate state and the closed summary windows to the store
  // (flared calls it every second; `final` at shutdown also writes the open windows).
  void persist(bool final = false);
  void writeMetrics(PromWriter& w) const;
  const IngestCounters& counters() const { return counters_; }
  size_t activeSessions() const;
  // True when `token` may act for `job_id` (constant-time compare).
  bool tokenValid(const std::string& job_id, const std::string& token) const;

 private:
  struct SigState {
    v1::Signature sig;  // id = daemon id
    uint64_t count = 0;
    int64_t total_ns = 0;
    int64_t min_ns = 0;
    int64_t max_ns = 0;
    double flops = 0;
    double bytes = 0;
    int32_t nranks = 0;
    LogHistogram hist;
    bool dirty = false;
    // Of count, launches estimated from 1-in-N samples (KernelRecord.weight - 1 summed, and a
    // sampled KernelSummary's counts beyond its sampled_ops): SignatureReport.estimated.
    uint64_t estimated = 0;
  };
  struct RankState {
    int32_t rank = 0;
    std::string host;
    int32_t pid = 0;
    int32_t local_rank = 0;
    std::string device_name;
    std::string device_uuid;
    v1::Mode mode = v1::MODE_UNSPECIFIED;
    bool hang_kill = false;  // RankHello.hang_kill of the live process
    int64_t last_seen_ns = 0;
    uint64_t batches = 0;
    uint64_t records = 0;
    uint64_t lost_batches = 0;
    uint64_t steps = 0, steps_sampled_out = 0;  // StepStats applied (ListRanks' steps)
    // What was refused of this rank, by reason (ListRanks' Refusals); `logged_reasons`: a bit
    // per reason already logged (once per job, rank and reason).
    struct Refused {
      uint64_t batches = 0, items = 0;
      std::string last_error;
      int64_t last_ns = 0;
    };
    std::map<Reason, Refused> refused;
    uint32_t logged_reasons = 0;
    v1::DropCounters drops;
    uint64_t session_id = 0;  // the live session, 0: none
    std::deque<v1::Command> pending;
    // The highest batch_seq applied, per rank process (pid, hello start time): batches at or
    // below it are duplicates (dropped, counted); HelloAck.resume_after_seq tells the rank.
    // Written with the state it covers in each checkpoint, reloaded after a restart.
    struct Incarnation {
      uint64_t seq = 0;
      // A batch_seq that jumped ahead of seq + 1, applied but not yet believed: the next batch
      // (jump_seq + 1) confirms it and moves seq past it; until then garbage (a bit-flipped
      // batch_seq) moves lost_batches by one batch at most and cannot push seq out of reach of
      // the rank's real batches. A batch of this seq again is a duplicate. 0: none.
      uint64_t jump_seq = 0;
      int64_t updated_ns = 0;
      bool dirty = false;
    };
    std::map<std::pair<int32_t, int64_t>, Incarnation> incarnations;
    // Summaries being folded into the current stored window, by (signature, stream).
    OpenWindows open_windows;
    bool windows_dirty = false;  // open_windows changed since the last checkpoint
    bool dirty = false;
  };
  struct JobState {
    std::string job_id;
    int32_t world_size = 0;
    int64_t start_ns = 0;
    int64_t last_seen_ns = 0;
    std::map<int32_t, RankState> ranks;
    std::vector<SigState> sigs;                           // index = daemon id - 1
    std::unordered_map<std::string, uint32_t> sig_index;  // canonical signature -> daemon id
    std::map<uint64_t, std::map<int32_t, v1::CommandResult>> results;  // bounded, by command
    size_t connected = 0;
    bool dirty = false;
  };
  struct Session {
    uint64_t id = 0;
    JobState* job = nullptr;
    int32_t rank = 0;
    int32_t pid = 0;
    int64_t start_ns = 0;  // the hello's start_time_unix_ns (with pid: the incarnation)
    std::unordered_map<uint32_t, uint32_t> sig_map;  // rank signature id -> daemon id
    std::unordered_set<uint32_t> api_ids;
    double tokens = 0;  // rate-limit bucket, records
    int64_t refill_ns = 0;
    bool replaced = false;
    std::shared_ptr<CommandChannel> channel;
  };

  Verdict reject(Reason r, Code code, std::string error, bool close = false);
  // Whole-batch refusal of a rank's batch: counted for the rank too and logged once.
  Verdict refuseBatch(const JobState& job, RankState& rs, int64_t now, Reason r, Code code,
                      std::string error);
  // Notes a refusal for the rank (its Refusals, one log line per job, rank and reason).
  void noteRefused(const JobState& job, RankState& rs, int64_t now, Reason r, uint64_t batches,
                   uint64_t items, const std::string& error);
  // Counts and notes the items `f` found invalid (they are not applied); the batch's Verdict.
  Verdict noteDroppedItems(const JobState& job, RankState& rs, int64_t now, const BatchFilter& f);
  // A batch's stages, under mu_. admitBatch (ingest_session.cc): the checks of the batch as a
  // whole (the stream's session and rank, batch_seq, size, rate bucket); nullopt when it may be
  // applied, with `session` and `incarnation` set, else the refusal to return. applyBatch
  // (ingest_apply.cc): applies a batch whose items all passed findInvalidItems.
  std::optional<Verdict> admitBatch(uint64_t session_id, const v1::RecordBatch& b, int64_t now,
                                    Session** session, RankState::Incarnation** incarnation);
  void applyBatch(Session& s, RankState::Incarnation& inc, const v1::RecordBatch& b, int64_t now);
  uint32_t internSignature(JobState& job, const v1::Signature& sig);
  void applyDrops(RankState& rs, const v1::DropCounters& d);
  void fillReport(const JobState& job, v1::GetReportResponse* out) const;
  JobState* findJob(const std::string& job_id);
  RankState::Incarnation& incarnation(RankState& rs, int32_t pid, int64_t start_ns, int64_t now);

  IngestConfig config_;
  Store* store_;
  const common::Clock& wall_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<JobState>> jobs_;
  std::unordered_map<uint64_t, Session> sessions_;
  uint64_t next_session_id_ = 1;
  uint64_t next_command_id_ = 1;
  int64_t last_window_flush_ = 0;  // the window persist() last closed rows for
  // Applied since the last checkpoint, written with it (persist()).
  std::unordered_map<std::string, std::vector<RawRecord>> pending_raw_;  // by job
  size_t pending_raw_count_ = 0;
  // Deep-trace records accepted since the last checkpoint (counted in pending_raw_count_).
  std::unordered_map<std::string, std::vector<DeepTraceRow>> pending_deep_;
  std::vector<WindowSummaryRow> pending_windows_;  // closed by a batch of a later window
  std::vector<ReceivedHangReport> hang_reports_;   // guarded by mu_
  // Refusals noted under mu_ for on_refused, handed over after it is released.
  struct RefusalNote {
    std::string job_id;
    int32_t rank = 0;
    Reason reason = Reason::kCount;
    uint64_t batches = 0, items = 0;
    std::string error;
    int64_t now_ns = 0;
  };
  std::vector<RefusalNote> refusal_notes_;  // guarded by mu_
  std::atomic<bool> has_refusal_notes_{false};
  void handOverRefusals();
  IngestCounters counters_;
};

// CLOCK_REALTIME as a Clock (Unix-epoch nanoseconds).
class RealtimeClock final : public common::Clock {
 public:
  int64_t nowNs() const noexcept override { return common::realtimeNs(); }
};

}  // namespace flare::engine
