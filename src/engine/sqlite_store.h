// SqliteStore: the Store on an embedded SQLite database (WAL mode, synchronous=NORMAL: a crash
// of flared loses nothing committed; a power loss may lose the last transactions).
//
// Threads: the write queue's writer thread (store_write_queue.h) owns the write connection and
// applies queued writes in batched transactions (everything queued at the time, up to
// kMaxOpsPerTransaction). Reads use a second connection under a mutex. Owned by flared_main (or
// a test); the destructor drains the queue and joins the writer.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/engine/store.h"
#include "src/engine/store_write_queue.h"

struct sqlite3;

namespace flare::engine {

class SqliteStore final : public Store {
 public:
  struct Options {
    std::string path;  // file name; ":memory:" is not supported (two connections)
    size_t max_queued_ops = kDefaultMaxQueuedOps;  // writes beyond this are dropped and counted
    size_t max_queued_raw = kDefaultMaxQueuedRaw;  // raw records waiting; beyond: dropped, counted
  };

  // Opens (creating) the database and its schema. Returns null with *error set on failure.
  static std::unique_ptr<SqliteStore> open(const Options& options, std::string* error);
  ~SqliteStore() override;

  void putJob(const JobRow& row) override;
  void putRank(const RankRow& row) override;
  void putSignature(const SignatureRow& row) override;
  void putSignatureStats(const SignatureStatsRow& row) override;
  void appendRaw(const std::string& job_id, std::vector<RawRecord> records) override;
  void appendDeepTrace(const std::string& job_id, std::vector<DeepTraceRow> rows) override;
  std::vector<DeepTraceRow> deepTrace(const std::string& job_id, int32_t rank,
                                      size_t limit) override;
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
  std::optional<std::string> baseline(const std::string& key) override;
  std::vector<std::pair<std::string, std::string>> baselines(const std::string& prefix) override;

  MaintenanceResult maintain(int64_t now_ns, const RetentionPolicy& policy) override;
  void writeMetrics(PromWriter& w) const override;

  // The live size of the database (pages in use times page size), in bytes.
  int64_t liveBytes();

 private:
  struct Writer;  // the write connection and its cached statements (writer thread)
  using Op = std::function<void(Writer&)>;
  explicit SqliteStore(Options options);
  bool init(std::string* error);
  bool migrateRawRecords(std::string* error);
  bool migrateRankSteps(std::string* error);
  void commit(std::vector<Op>& ops);  // the queue's writer thread

  Options options_;
  sqlite3* write_db_ = nullptr;  // writer thread (and maintain(), after a flush, under write_mu_)
  sqlite3* read_db_ = nullptr;   // under read_mu_
  std::mutex read_mu_;
  std::mutex write_mu_;  // held while a transaction runs

  std::unique_ptr<Writer> writer_;  // used by the queue's writer thread only
  StoreWriteQueue<Op> queue_;
  std::atomic<uint64_t> next_alert_id_{1};
  StoreWriteCounters counters_;
  std::atomic<uint64_t> summarized_{0};
  std::atomic<uint64_t> expired_{0};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<int64_t> live_bytes_{0};
};

}  // namespace flare::engine
