// Store: flared's durable state behind one interface (SQLite today: sqlite_store.h; PostgreSQL
// later for daemons that share history).
//
// What is kept: jobs, ranks, interned signatures (per job, daemon ids), per-signature aggregates,
// raw kernel records for a bounded window (timelines), per-window summaries, alerts and healthy
// baselines. Rows are plain structs; protobuf payloads travel as serialized blobs.
//
// Threading: every method is thread-safe. Writes (put*/append*) are queued and applied in order
// by the store's own writer thread in batched transactions, so callers on the ingest path never
// wait on disk; flush() waits until everything queued is committed. When the queue is over its
// cap, writes are dropped and counted (flare_store_dropped_total), never blocking ingest.
// Reads are synchronous and see committed data.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flare/v1/service.pb.h"

namespace flare::engine {

class PromWriter;

struct JobRow {
  std::string job_id;
  int32_t world_size = 0;
  int64_t start_ns = 0;
  int64_t last_seen_ns = 0;
};

struct RankRow {
  std::string job_id;
  int32_t rank = 0;
  std::string host;
  int32_t pid = 0;
  int32_t local_rank = 0;
  std::string device_name;
  std::string device_uuid;
  int64_t last_seen_ns = 0;
  uint64_t batches = 0;
  uint64_t records = 0;
  uint64_t lost_batches = 0;
  std::string drops;   // serialized flare.v1.DropCounters (latest cumulative)
  uint64_t steps = 0;  // StepStats received (summary mode), and of them sampled out
  uint64_t steps_sampled_out = 0;
};

struct SignatureRow {
  std::string job_id;
  uint32_t sig_id = 0;    // the daemon's id, unique within the job
  std::string signature;  // serialized flare.v1.Signature (its id field is sig_id)
};

// The running aggregate of one signature over a whole job.
struct SignatureStatsRow {
  std::string job_id;
  uint32_t sig_id = 0;
  uint64_t count = 0;
  int64_t total_ns = 0;
  int64_t min_ns = 0;
  int64_t max_ns = 0;
  double flops = 0;       // sum over calls
  double bytes = 0;       // sum over calls (collectives: nccl-tests S)
  int32_t nranks = 0;     // communicator size seen in records (busbw factor); 0: unknown
  std::string histogram;  // LogHistogram::serialize()
};

struct RawRecord {
  int32_t rank = 0;
  uint32_t sig_id = 0;  // daemon id
  uint64_t stream = 0;
  int64_t issue_ns = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t flops = 0;
  uint64_t bytes = 0;
  uint64_t coll_seq = 0;
};

// Durations of one signature on one rank and stream over one window. Ranks send them in
// MODE_SUMMARY (one row per KernelSummary, clusters folded); raw records that age out of the
// raw window are folded into rows like these (source "raw": p50 is the mean, p99 the max).
struct WindowSummaryRow {
  std::string job_id;
  int32_t rank = 0;
  uint32_t sig_id = 0;
  uint64_t stream = 0;
  int64_t window_start_ns = 0;
  int64_t window_end_ns = 0;
  uint64_t count = 0;
  int64_t sum_ns = 0;
  int64_t p50_ns = 0;
  int64_t p99_ns = 0;
  std::string source;  // "summary" or "raw"
};

// One deep-trace (CUPTI) record of a rank (flare.v1.DeepTraceRecord, src/hook/deep_trace.h).
struct DeepTraceRow {
  int32_t rank = 0;
  v1::DeepTraceRecord record;
};

// The highest batch_seq of one rank process (an incarnation: pid and start time from its hello)
// whose effects the store holds. Written in the same transaction as those effects
// (Checkpoint), so after a crash the daemon resumes each rank exactly after what it kept.
struct BatchSeqRow {
  std::string job_id;
  int32_t rank = 0;
  int32_t pid = 0;
  int64_t start_ns = 0;  // RankHello.start_time_unix_ns
  uint64_t seq = 0;
  int64_t updated_ns = 0;
};

// The summary windows of one rank that have not closed yet (replaces the rank's previous set).
struct OpenWindowsRow {
  std::string job_id;
  int32_t rank = 0;
  std::vector<WindowSummaryRow> rows;  // job_id, rank and source are implied
};

// The stored form of OpenWindowsRow::rows (both stores; sqlite_store.cc): 64 bytes a row.
std::string encodeOpenWindows(const std::vector<WindowSummaryRow>& rows);
std::vector<WindowSummaryRow> decodeOpenWindows(const std::string& job_id, int32_t rank,
                                                const std::string& blob);

// Everything the daemon applied since its previous checkpoint, committed in ONE transaction:
// a crash keeps all of it or none of it. The batch_seq marks (seqs) say which batches these
// effects include, so a batch a rank re-sends after a crash is counted exactly once.
struct Checkpoint {
  std::vector<JobRow> jobs;
  std::vector<RankRow> ranks;
  std::vector<SignatureStatsRow> signature_stats;
  std::vector<std::pair<std::string, std::vector<RawRecord>>> raw;  // by job
  std::vector<WindowSummaryRow> windows;                            // closed rows
  std::vector<OpenWindowsRow> open_windows;
  std::vector<BatchSeqRow> seqs;
  // Deep-trace (CUPTI) records by job: in the same transaction as the batch_seq marks, so a
  // batch re-sent after a crash stores them once.
  std::vector<std::pair<std::string, std::vector<DeepTraceRow>>> deep_trace;
  bool empty() const {
    return jobs.empty() && ranks.empty() && signature_stats.empty() && raw.empty() &&
           windows.empty() && open_windows.empty() && seqs.empty() && deep_trace.empty();
  }
};

struct RetentionPolicy {
  int64_t raw_window_ns = 3600LL * 1000000000LL;              // raw records older: summarized
  int64_t summary_window_ns = 30LL * 86400LL * 1000000000LL;  // window rows, alerts older: deleted
  int64_t max_bytes = 10LL << 30;  // cap on the live size of the database
};

struct MaintenanceResult {
  uint64_t raw_summarized = 0;  // raw records folded into window rows and deleted
  uint64_t expired = 0;         // window rows and alerts past their retention
  uint64_t evicted = 0;         // rows deleted to get under the size cap
  int64_t live_bytes = 0;       // after maintenance
};

class Store {
 public:
  virtual ~Store() = default;

  // Writes (queued; see the header comment).
  virtual void putJob(const JobRow& row) = 0;
  virtual void putRank(const RankRow& row) = 0;
  virtual void putSignature(const SignatureRow& row) = 0;
  virtual void putSignatureStats(const SignatureStatsRow& row) = 0;
  virtual void appendRaw(const std::string& job_id, std::vector<RawRecord> records) = 0;
  virtual void putWindowSummaries(std::vector<WindowSummaryRow> rows) = 0;
  // Deep-trace records; kept as long as raw records (RetentionPolicy::raw_window_ns). Stores
  // that do not keep them drop them (the default).
  virtual void appendDeepTrace(const std::string& /*job_id*/, std::vector<DeepTraceRow> /*rows*/) {}
  void putWindowSummary(const WindowSummaryRow& row) { putWindowSummaries({row}); }
  // Queued like the others, applied as one transaction (never split, never dropped whole: when
  // the raw-record queue is over its cap, only the raw records are dropped, counted).
  virtual void putCheckpoint(Checkpoint checkpoint) = 0;
  // Assigns alert.id (unique, increasing across restarts) and returns it.
  virtual uint64_t putAlert(v1::Alert alert) = 0;
  virtual void putBaseline(const std::string& key, const std::string& value, int64_t now_ns) = 0;
  virtual void removeBaseline(const std::string& key) = 0;
  // Blocks until every write queued before the call is committed (or failed and counted).
  virtual void flush() = 0;
  // The same, for at most `timeout` (a disk that stalls must not stall the caller for long):
  // whether everything queued before the call was committed (or failed) by then.
  virtual bool flushWithin(std::chrono::milliseconds timeout) = 0;

  // Reads.
  virtual std::vector<JobRow> loadJobs() = 0;
  virtual std::vector<RankRow> loadRanks() = 0;
  virtual std::vector<SignatureRow> loadSignatures() = 0;
  virtual std::vector<SignatureStatsRow> loadSignatureStats() = 0;
  virtual std::vector<BatchSeqRow> loadBatchSeqs() = 0;
  virtual std::vector<OpenWindowsRow> loadOpenWindows() = 0;
  // Oldest first, start_ns in [since_ns, until_ns).
  virtual std::vector<RawRecord> rawRecords(const std::string& job_id, int64_t since_ns,
                                            int64_t until_ns, size_t limit) = 0;
  // Oldest first; rank < 0: every rank.
  virtual std::vector<DeepTraceRow> deepTrace(const std::string& /*job_id*/, int32_t /*rank*/,
                                              size_t /*limit*/) {
    return {};
  }
  virtual std::vector<WindowSummaryRow> windowSummaries(const std::string& job_id, int64_t since_ns,
                                                        size_t limit) = 0;
  // Newest first; empty job_id: every job.
  virtual std::vector<v1::Alert> alerts(const std::string& job_id, int64_t since_ns,
                                        size_t limit) = 0;
  virtual std::optional<std::string> baseline(const std::string& key) = 0;
  // (key, value) of every baseline whose key starts with `prefix`, by key.
  virtual std::vector<std::pair<std::string, std::string>> baselines(const std::string& prefix) = 0;

  // Retention and the size cap; runs on the caller's thread after flushing the queue.
  virtual MaintenanceResult maintain(int64_t now_ns, const RetentionPolicy& policy) = 0;

  virtual void writeMetrics(PromWriter& w) const = 0;
};

}  // namespace flare::engine
