// PgStore: the Store (store.h) on a PostgreSQL server, for daemons that share history. Same
// tables and semantics as SqliteStore (sqlite_store.h): queued writes applied in order by one
// writer thread in batched transactions (a Checkpoint is one op, so one transaction), reads
// synchronous on a second connection.
//
// Threads: the write queue's writer thread (store_write_queue.h) owns the write connection;
// reads hold read_mu_. Owned by its creator; the destructor drains the queue and joins the
// writer. flared uses it for --db postgresql://...; tested against a real server
// (pg_store_test.cc).
#pragma once

#include <libpq-fe.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/engine/store.h"
#include "src/engine/store_write_queue.h"

namespace flare::engine {

class PgStore final : public Store {
 public:
  struct Options {
    std::string conninfo;  // libpq connection string ("host=/tmp/pg dbname=flare user=flare")
    size_t max_queued_ops = kDefaultMaxQueuedOps;  // as SqliteStore::Options
    size_t max_queued_raw = kDefaultMaxQueuedRaw;
  };

  // Connects twice and creates the schema. Null with *error set on failure.
  static std::unique_ptr<PgStore> open(const Options& options, std::string* error);
  ~PgStore() override;

  void putJob(const JobRow& row) override;
  void putRank(const RankRow& row) override;
  void putSignature(const SignatureRow& row) override;
  void putSignatureStats(const SignatureStatsRow& row) override;
  void appendRaw(const std::string& job_id, std::vector<RawRecord> records) override;
  void appendDeepTrace(const std::string& job_id, std::vector<DeepTraceRow> rows) override;
  void putWindowSummaries(std::vector<WindowSummaryRow> rows) override;
  void putCheckpoint(Checkpoint checkpoint) override;
  uint64_t putAlert(v1::Alert alert) override;
  void putBaseline(const std::string& key, const std::string& value, int64_t now_ns) override;
  void removeBaseline(const std::string& key) override;
  void flush() override;
  bool flushWithin(std::chrono::milliseconds timeout) override;

  std::vector<JobRow> loadJobs() override;
  std::vector<RankRow> loadRanks() override;
  std::vector<SignatureRow> loadSignatures() override;
  std::vector<SignatureStatsRow> loadSignatureStats() override;
  std::vector<BatchSeqRow> loadBatchSeqs() override;
  std::vector<OpenWindowsRow> loadOpenWindows() override;
  std::vector<RawRecord> rawRecords(const std::string& job_id, int64_t since_ns, int64_t until_ns,
                                    size_t limit) override;
  std::vector<WindowSummaryRow> windowSummaries(const std::string& job_id, int64_t since_ns,
                                                size_t limit) override;
  std::vector<v1::Alert> alerts(const std::string& job_id, int64_t since_ns, size_t limit) override;
  std::vector<DeepTraceRow> deepTrace(const std::string& job_id, int32_t rank,
                                      size_t limit) override;
  std::optional<std::string> baseline(const std::string& key) override;
  std::vector<std::pair<std::string, std::string>> baselines(const std::string& prefix) override;

  MaintenanceResult maintain(int64_t now_ns, const RetentionPolicy& policy) override;
  void writeMetrics(PromWriter& w) const override;

 private:
  using Op = std::function<void(PGconn*)>;
  explicit PgStore(Options options);
  bool init(std::string* error);
  void commit(std::vector<Op>& ops);  // the queue's writer thread

  Options options_;
  PGconn* write_ = nullptr;  // writer thread (and maintain(), after a flush, under write_mu_)
  PGconn* read_ = nullptr;   // under read_mu_
  std::mutex read_mu_;
  std::mutex write_mu_;

  StoreWriteQueue<Op> queue_;
  std::atomic<uint64_t> next_alert_id_{1};
  StoreWriteCounters counters_;
  std::atomic<uint64_t> retired_{0};
};

}  // namespace flare::engine
