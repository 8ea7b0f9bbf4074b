#include "src/engine/pg_store.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "src/common/log.h"
#include "src/engine/metrics.h"
#include "src/engine/raw_chunks.h"
#include "src/engine/store_checkpoint.h"

namespace flare::engine {
namespace {

constexpr int64_t kRawFoldWindowNs = 60LL * 1000000000LL;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, world_size BIGINT, start_ns BIGINT, last_seen_ns BIGINT);
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT, rank BIGINT, host TEXT, pid BIGINT, local_rank BIGINT, device_name TEXT,
  device_uuid TEXT, last_seen_ns BIGINT, batches BIGINT, records BIGINT,
  lost_batches BIGINT, drops BYTEA, steps BIGINT DEFAULT 0, steps_sampled_out BIGINT DEFAULT 0,
  PRIMARY KEY(job_id, rank));
ALTER TABLE ranks ADD COLUMN IF NOT EXISTS steps BIGINT DEFAULT 0;
ALTER TABLE ranks ADD COLUMN IF NOT EXISTS steps_sampled_out BIGINT DEFAULT 0;
CREATE TABLE IF NOT EXISTS signatures(
  job_id TEXT, sig_id BIGINT, signature BYTEA, PRIMARY KEY(job_id, sig_id));
CREATE TABLE IF NOT EXISTS signature_stats(
  job_id TEXT, sig_id BIGINT, count BIGINT, total_ns BIGINT, min_ns BIGINT, max_ns BIGINT,
  flops DOUBLE PRECISION, bytes DOUBLE PRECISION, nranks BIGINT, histogram BYTEA,
  PRIMARY KEY(job_id, sig_id));
CREATE TABLE IF NOT EXISTS raw_chunks(
  id BIGSERIAL PRIMARY KEY, job_id TEXT, rank BIGINT, start_ns BIGINT, end_ns BIGINT,
  count BIGINT, records BYTEA);
CREATE INDEX IF NOT EXISTS raw_chunks_by_job_time ON raw_chunks(job_id, start_ns);
CREATE TABLE IF NOT EXISTS window_summaries(
  id BIGSERIAL PRIMARY KEY, job_id TEXT, rank BIGINT, sig_id BIGINT, stream BIGINT,
  window_start_ns BIGINT, window_end_ns BIGINT, count BIGINT, sum_ns BIGINT,
  p50_ns BIGINT, p99_ns BIGINT, source TEXT);
CREATE INDEX IF NOT EXISTS windows_by_job_time ON window_summaries(job_id, window_start_ns);
CREATE TABLE IF NOT EXISTS alerts(
  id BIGINT PRIMARY KEY, job_id TEXT, rank BIGINT, kind TEXT, severity TEXT, team TEXT,
  message TEXT, time_ns BIGINT);
CREATE INDEX IF NOT EXISTS alerts_by_time ON alerts(time_ns);
CREATE TABLE IF NOT EXISTS baselines(key TEXT PRIMARY KEY, value BYTEA, updated_ns BIGINT);
CREATE TABLE IF NOT EXISTS batch_seqs(
  job_id TEXT, rank BIGINT, pid BIGINT, start_ns BIGINT, seq BIGINT, updated_ns BIGINT,
  PRIMARY KEY(job_id, rank, pid, start_ns));
CREATE TABLE IF NOT EXISTS open_windows(job_id TEXT, rank BIGINT, rows BYTEA,
  PRIMARY KEY(job_id, rank));
CREATE TABLE IF NOT EXISTS deep_trace(
  id BIGSERIAL PRIMARY KEY, job_id TEXT, rank BIGINT, start_ns BIGINT, record BYTEA);
CREATE INDEX IF NOT EXISTS deep_trace_by_job ON deep_trace(job_id, rank, start_ns);
)sql";

// Parameters of one statement: text, or binary for BYTEA columns.
class Params {
 public:
  Params& text(std::string v) {
    values_.push_back(std::move(v));
    formats_.push_back(0);
    return *this;
  }
  Params& i64(int64_t v) { return text(std::to_string(v)); }
  Params& u64(uint64_t v) { return text(std::to_string(static_cast<int64_t>(v))); }
  Params& dbl(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return text(buf);
  }
  Params& blob(std::string v) {
    values_.push_back(std::move(v));
    formats_.push_back(1);
    return *this;
  }
  // Runs `sql`; true on success. Rows, when wanted, come back in *out (caller clears).
  bool run(PGconn* c, const char* sql, PGresult** out = nullptr) const {
    std::vector<const char*> v;
    std::vector<int> len;
    for (const std::string& s : values_) {
      v.push_back(s.data());
      len.push_back(static_cast<int>(s.size()));
    }
    PGresult* r = PQexecParams(c, sql, static_cast<int>(v.size()), nullptr, v.data(), len.data(),
                               formats_.data(), 1 /* binary results: BYTEA as bytes */);
    const ExecStatusType st = PQresultStatus(r);
    const bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) {
      // Counted by the callers (flare_store_errors_total); logged once per message text.
      common::logOnce(common::LogLevel::kWarn, "engine", PQresultErrorMessage(r), "postgres: {}",
                      PQresultErrorMessage(r));
    }
    if (ok && out != nullptr) {
      *out = r;
    } else {
      PQclear(r);
    }
    return ok;
  }

 private:
  std::vector<std::string> values_;
  std::vector<int> formats_;
};

// Binary-format result readers (network byte order integers, IEEE doubles).
uint64_t be(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
int64_t geti(PGresult* r, int row, int col) {
  if (PQgetisnull(r, row, col)) return 0;
  const int n = PQgetlength(r, row, col);
  return static_cast<int64_t>(be(PQgetvalue(r, row, col), n));
}
double getd(PGresult* r, int row, int col) {
  if (PQgetisnull(r, row, col)) return 0;
  const uint64_t bits = be(PQgetvalue(r, row, col), 8);
  double d;
  static_assert(sizeof(d) == sizeof(bits));
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}
std::string gets(PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col)));
}

bool exec(PGconn* c, const char* sql, std::string* error = nullptr) {
  PGresult* r = PQexec(c, sql);
  const ExecStatusType st = PQresultStatus(r);
  const bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!ok && error != nullptr) *error = PQresultErrorMessage(r);
  PQclear(r);
  return ok;
}

bool writeJob(PGconn* c, const JobRow& r) {
  return Params()
      .text(r.job_id)
      .i64(r.world_size)
      .i64(r.start_ns)
      .i64(r.last_seen_ns)
      .run(c,
           "INSERT INTO jobs VALUES($1,$2,$3,$4) ON CONFLICT(job_id) DO UPDATE SET "
           "world_size=EXCLUDED.world_size, start_ns=EXCLUDED.start_ns, "
           "last_seen_ns=EXCLUDED.last_seen_ns");
}

bool writeRank(PGconn* c, const RankRow& r) {
  return Params()
      .text(r.job_id)
      .i64(r.rank)
      .text(r.host)
      .i64(r.pid)
      .i64(r.local_rank)
      .text(r.device_name)
      .text(r.device_uuid)
      .i64(r.last_seen_ns)
      .u64(r.batches)
      .u64(r.records)
      .u64(r.lost_batches)
      .blob(r.drops)
      .u64(r.steps)
      .u64(r.steps_sampled_out)
      .run(c,
           "INSERT INTO ranks(job_id, rank, host, pid, local_rank, device_name, device_uuid, "
           "last_seen_ns, batches, records, lost_batches, drops, steps, steps_sampled_out) "
           "VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14) "
           "ON CONFLICT(job_id, rank) DO UPDATE SET host=EXCLUDED.host, pid=EXCLUDED.pid, "
           "local_rank=EXCLUDED.local_rank, device_name=EXCLUDED.device_name, "
           "device_uuid=EXCLUDED.device_uuid, last_seen_ns=EXCLUDED.last_seen_ns, "
           "batches=EXCLUDED.batches, records=EXCLUDED.records, "
           "lost_batches=EXCLUDED.lost_batches, drops=EXCLUDED.drops, steps=EXCLUDED.steps, "
           "steps_sampled_out=EXCLUDED.steps_sampled_out");
}

bool writeSignatureStats(PGconn* c, const SignatureStatsRow& r) {
  return Params()
      .text(r.job_id)
      .u64(r.sig_id)
      .u64(r.count)
      .i64(r.total_ns)
      .i64(r.min_ns)
      .i64(r.max_ns)
      .dbl(r.flops)
      .dbl(r.bytes)
      .i64(r.nranks)
      .blob(r.histogram)
      .run(c,
           "INSERT INTO signature_stats VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) "
           "ON CONFLICT(job_id, sig_id) DO UPDATE SET count=EXCLUDED.count, "
           "total_ns=EXCLUDED.total_ns, min_ns=EXCLUDED.min_ns, max_ns=EXCLUDED.max_ns, "
           "flops=EXCLUDED.flops, bytes=EXCLUDED.bytes, nranks=EXCLUDED.nranks, "
           "histogram=EXCLUDED.histogram");
}

// Multi-row INSERTs of up to kChunksPerStatement packed chunks (raw_chunks.h): one round trip
// per statement, not per chunk. Returns the records written.
constexpr size_t kChunksPerStatement = 200;
constexpr int kChunksPerPage = 256;  // chunks read per query page

uint64_t writeRaw(PGconn* c, const std::string& job_id, std::vector<RawRecord> recs) {
  const std::vector<RawChunk> chunks = packRawRecords(std::move(recs));
  uint64_t ok = 0;
  for (size_t at = 0; at < chunks.size(); at += kChunksPerStatement) {
    const size_t n = std::min(kChunksPerStatement, chunks.size() - at);
    std::string sql = "INSERT INTO raw_chunks(job_id,rank,start_ns,end_ns,count,records) VALUES";
    Params p;
    p.text(job_id);
    int k = 2;
    uint64_t records = 0;
    for (size_t i = 0; i < n; ++i) {
      const RawChunk& ch = chunks[at + i];
      sql += i == 0 ? "($1" : ",($1";
      for (int f = 0; f < 5; ++f) sql += ",$" + std::to_string(k++);
      sql += ")";
      p.i64(ch.rank).i64(ch.first_start_ns).i64(ch.last_start_ns).i64(ch.count).blob(ch.blob);
      records += ch.count;
    }
    if (p.run(c, sql.c_str())) ok += records;
  }
  return ok;
}

uint64_t writeDeepTrace(PGconn* c, const std::string& job_id,
                        const std::vector<DeepTraceRow>& rows) {
  uint64_t ok = 0;
  std::string blob;
  for (const DeepTraceRow& r : rows) {
    r.record.SerializeToString(&blob);
    ok += Params().text(job_id)
                  .i64(r.rank)
                  .i64(r.record.start_ns())
                  .blob(blob)
                  .run(c, "INSERT INTO deep_trace(job_id,rank,start_ns,record) VALUES($1,$2,$3,$4)")
              ? 1
              : 0;
  }
  return ok;
}

uint64_t writeWindows(PGconn* c, const std::vector<WindowSummaryRow>& rows) {
  uint64_t ok = 0;
  for (const WindowSummaryRow& r : rows) {
    ok += Params().text(r.job_id)
                  .i64(r.rank)
                  .u64(r.sig_id)
                  .u64(r.stream)
                  .i64(r.window_start_ns)
                  .i64(r.window_end_ns)
                  .u64(r.count)
                  .i64(r.sum_ns)
                  .i64(r.p50_ns)
                  .i64(r.p99_ns)
                  .text(r.source)
                  .run(c,
                       "INSERT INTO window_summaries(job_id,rank,sig_id,stream,window_start_ns,"
                       "window_end_ns,count,sum_ns,p50_ns,p99_ns,source) "
                       "VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)")
              ? 1
              : 0;
  }
  return ok;
}

// Schema 1 kept a row per raw record (raw_records); now they are packed (raw_chunks.h). A
// database written by an older flared is converted once, in one transaction, on connect.
bool migrateRawRecords(PGconn* c, std::string* error) {
  auto exists = [c](bool* yes) {
    PGresult* r = nullptr;
    if (!Params().run(c, "SELECT to_regclass('raw_records') IS NOT NULL", &r)) return false;
    *yes = PQntuples(r) == 1 && PQgetlength(r, 0, 0) == 1 && PQgetvalue(r, 0, 0)[0] != 0;
    PQclear(r);
    return true;
  };
  bool old = false;
  if (!exists(&old)) {
    *error = "cannot inspect the schema";
    return false;
  }
  if (!old) return true;
  // Daemons sharing the database may start together: the first to lock the table converts it,
  // the others wait for the lock and then find the table gone.
  if (!exec(c, "BEGIN", error)) return false;
  if (!exec(c, "LOCK TABLE raw_records IN ACCESS EXCLUSIVE MODE", error)) {
    exec(c, "ROLLBACK");
    if (exists(&old) && !old) return true;
    *error = "cannot lock raw_records to convert it: " + *error;
    return false;
  }
  PGresult* r = nullptr;
  uint64_t moved = 0;
  bool ok = true;
  for (int64_t after_id = -1; ok;) {
    ok = Params().i64(after_id).run(
        c,
        "SELECT id, job_id, rank, sig_id, stream, issue_ns, start_ns, end_ns, flops, bytes, "
        "coll_seq FROM raw_records WHERE id>$1 ORDER BY id LIMIT 100000",
        &r);
    if (!ok) break;
    const int rows = PQntuples(r);
    std::map<std::string, std::vector<RawRecord>> by_job;
    for (int i = 0; i < rows; ++i) {
      after_id = geti(r, i, 0);
      by_job[gets(r, i, 1)].push_back(
          RawRecord{static_cast<int32_t>(geti(r, i, 2)), static_cast<uint32_t>(geti(r, i, 3)),
                    static_cast<uint64_t>(geti(r, i, 4)), geti(r, i, 5), geti(r, i, 6),
                    geti(r, i, 7), static_cast<uint64_t>(geti(r, i, 8)),
                    static_cast<uint64_t>(geti(r, i, 9)), static_cast<uint64_t>(geti(r, i, 10))});
    }
    PQclear(r);
    for (auto& [j, recs] : by_job) {
      const size_t n = recs.size();
      const uint64_t written = writeRaw(c, j, std::move(recs));
      ok = ok && written == n;
      moved += written;
    }
    if (rows < 100000) break;
  }
  if (!ok || !exec(c, "DROP TABLE raw_records; COMMIT", error)) {
    exec(c, "ROLLBACK");
    *error = "converting raw_records to raw_chunks failed" + (error->empty() ? "" : ": " + *error);
    return false;
  }
  FLARE_LOG_INFO("engine", "postgres: {} raw records converted to packed chunks", moved);
  return true;
}

}  // namespace

PgStore::PgStore(Options options)
    : options_(std::move(options)), queue_(options_.max_queued_ops, options_.max_queued_raw) {}

std::unique_ptr<PgStore> PgStore::open(const Options& options, std::string* error) {
  std::unique_ptr<PgStore> store(new PgStore(options));
  if (!store->init(error)) return nullptr;
  return store;
}

bool PgStore::init(std::string* error) {
  for (PGconn** c : {&write_, &read_}) {
    *c = PQconnectdb(options_.conninfo.c_str());
    if (*c == nullptr || PQstatus(*c) != CONNECTION_OK) {
      *error = std::string("cannot connect to PostgreSQL: ") +
               (*c != nullptr ? PQerrorMessage(*c) : "out of memory");
      return false;
    }
  }
  exec(write_, "SET client_min_messages TO WARNING");
  if (!exec(write_, kSchema, error)) {
    *error = "PostgreSQL schema: " + *error;
    return false;
  }
  if (!migrateRawRecords(write_, error)) {
    *error = "PostgreSQL schema: " + *error;
    return false;
  }
  PGresult* r = nullptr;
  if (Params().run(read_, "SELECT COALESCE(MAX(id),0) FROM alerts", &r)) {
    next_alert_id_ = static_cast<uint64_t>(geti(r, 0, 0)) + 1;
    PQclear(r);
  }
  queue_.start([this](std::vector<Op>& ops) { commit(ops); });
  return true;
}

PgStore::~PgStore() {
  queue_.stop();
  if (read_ != nullptr) PQfinish(read_);
  if (write_ != nullptr) PQfinish(write_);
}

void PgStore::commit(std::vector<Op>& ops) {
  std::lock_guard wl(write_mu_);
  exec(write_, "BEGIN");
  for (auto& op : ops) op(write_);
  // A failed statement aborts the transaction: COMMIT then rolls it back as a whole.
  PGresult* r = PQexec(write_, "COMMIT");
  const bool committed =
      PQresultStatus(r) == PGRES_COMMAND_OK && std::string(PQcmdStatus(r)) == "COMMIT";
  PQclear(r);
  if (!committed) {
    counters_.errors.fetch_add(ops.size(), std::memory_order_relaxed);
    FLARE_LOG_ERROR("engine", "postgres: a transaction of {} writes was rolled back", ops.size());
  }
  counters_.transactions.fetch_add(1, std::memory_order_relaxed);
}

void PgStore::flush() {
  queue_.flush();
}

bool PgStore::flushWithin(std::chrono::milliseconds timeout) {
  return queue_.flushWithin(timeout);
}

void PgStore::putJob(const JobRow& r) {
  queue_.push(
      [this, r](PGconn* c) { (writeJob(c, r) ? counters_.rows_written : counters_.errors)++; }, 0);
}

void PgStore::putRank(const RankRow& r) {
  queue_.push(
      [this, r](PGconn* c) { (writeRank(c, r) ? counters_.rows_written : counters_.errors)++; }, 0);
}

void PgStore::putSignature(const SignatureRow& r) {
  queue_.push(
      [this, r](PGconn* c) {
        const bool ok = Params()
                            .text(r.job_id)
                            .u64(r.sig_id)
                            .blob(r.signature)
                            .run(c,
                                 "INSERT INTO signatures VALUES($1,$2,$3) ON CONFLICT(job_id, "
                                 "sig_id) DO UPDATE SET signature=EXCLUDED.signature");
        (ok ? counters_.rows_written : counters_.errors)++;
      },
      0);
}

void PgStore::putSignatureStats(const SignatureStatsRow& r) {
  queue_.push(
      [this, r](PGconn* c) {
        (writeSignatureStats(c, r) ? counters_.rows_written : counters_.errors)++;
      },
      0);
}

void PgStore::appendRaw(const std::string& job_id, std::vector<RawRecord> records) {
  if (records.empty()) return;
  const size_t n = records.size();
  queue_.push(
      [this, job_id, recs = std::move(records)](PGconn* c) mutable {
        const size_t total = recs.size();
        const uint64_t ok = writeRaw(c, job_id, std::move(recs));
        counters_.raw_written += ok;
        counters_.errors += total - ok;
      },
      n);
}

void PgStore::appendDeepTrace(const std::string& job_id, std::vector<DeepTraceRow> rows) {
  if (rows.empty()) return;
  const size_t n = rows.size();
  queue_.push(
      [this, job_id, rows = std::move(rows)](PGconn* c) {
        const uint64_t ok = writeDeepTrace(c, job_id, rows);
        counters_.raw_written += ok;
        counters_.errors += rows.size() - ok;
      },
      n);
}

void PgStore::putWindowSummaries(std::vector<WindowSummaryRow> rows) {
  if (rows.empty()) return;
  queue_.push(
      [this, rows = std::move(rows)](PGconn* c) {
        const uint64_t ok = writeWindows(c, rows);
        counters_.rows_written += ok;
        counters_.errors += rows.size() - ok;
      },
      0);
}

namespace {

// A checkpoint's rows, as statements on the writer's connection (writeCheckpoint).
struct CheckpointOut {
  PGconn* c;
  bool job(const JobRow& r) { return writeJob(c, r); }
  bool rank(const RankRow& r) { return writeRank(c, r); }
  bool signatureStats(const SignatureStatsRow& r) { return writeSignatureStats(c, r); }
  uint64_t raw(const std::string& job, std::vector<RawRecord>&& recs) {
    return writeRaw(c, job, std::move(recs));
  }
  uint64_t deepTrace(const std::string& job, const std::vector<DeepTraceRow>& rows) {
    return writeDeepTrace(c, job, rows);
  }
  uint64_t windows(const std::vector<WindowSummaryRow>& rows) { return writeWindows(c, rows); }
  bool openWindows(const OpenWindowsRow& r) {
    return Params()
        .text(r.job_id)
        .i64(r.rank)
        .blob(encodeOpenWindows(r.rows))
        .run(c,
             "INSERT INTO open_windows VALUES($1,$2,$3) ON CONFLICT(job_id, rank) "
             "DO UPDATE SET rows=EXCLUDED.rows");
  }
  bool batchSeq(const BatchSeqRow& r) {
    return Params()
        .text(r.job_id)
        .i64(r.rank)
        .i64(r.pid)
        .i64(r.start_ns)
        .u64(r.seq)
        .i64(r.updated_ns)
        .run(c,
             "INSERT INTO batch_seqs VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT(job_id, "
             "rank, pid, start_ns) DO UPDATE SET seq=EXCLUDED.seq, "
             "updated_ns=EXCLUDED.updated_ns");
  }
};

}  // namespace

void PgStore::putCheckpoint(Checkpoint cp) {
  if (cp.empty()) return;
  const size_t raw = admitCheckpoint(cp, queue_);
  queue_.push(
      [this, cp = std::move(cp)](PGconn* c) mutable {
        CheckpointOut out{c};
        const CheckpointCounts n = writeCheckpoint(cp, out);
        counters_.rows_written += n.rows_ok;
        counters_.raw_written += n.raw_ok;
        counters_.errors += n.rows_failed + n.raw_failed;
      },
      raw, /*never_drop=*/true);
}

uint64_t PgStore::putAlert(v1::Alert a) {
  a.set_id(next_alert_id_.fetch_add(1));
  const uint64_t id = a.id();
  queue_.push(
      [this, a = std::move(a)](PGconn* c) {
        const bool ok = Params()
                            .u64(a.id())
                            .text(a.job_id())
                            .i64(a.rank())
                            .text(a.kind())
                            .text(a.severity())
                            .text(a.team())
                            .text(a.message())
                            .i64(a.time_unix_ns())
                            .run(c,
                                 "INSERT INTO alerts VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON "
                                 "CONFLICT(id) DO NOTHING");
        (ok ? counters_.rows_written : counters_.errors)++;
      },
      0);
  return id;
}

void PgStore::putBaseline(const std::string& key, const std::string& value, int64_t now_ns) {
  queue_.push(
      [this, key, value, now_ns](PGconn* c) {
        const bool ok = Params().text(key).blob(value).i64(now_ns).run(
            c,
            "INSERT INTO baselines VALUES($1,$2,$3) ON CONFLICT(key) DO UPDATE SET "
            "value=EXCLUDED.value, updated_ns=EXCLUDED.updated_ns");
        (ok ? counters_.rows_written : counters_.errors)++;
      },
      0);
}

void PgStore::removeBaseline(const std::string& key) {
  queue_.push(
      [this, key](PGconn* c) {
        const bool ok = Params().text(key).run(c, "DELETE FROM baselines WHERE key=$1");
        (ok ? counters_.rows_written : counters_.errors)++;
      },
      0);
}

std::vector<JobRow> PgStore::loadJobs() {
  std::lock_guard lock(read_mu_);
  std::vector<JobRow> out;
  PGresult* r = nullptr;
  if (!Params().run(read_, "SELECT job_id, world_size, start_ns, last_seen_ns FROM jobs", &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    out.push_back(
        {gets(r, i, 0), static_cast<int32_t>(geti(r, i, 1)), geti(r, i, 2), geti(r, i, 3)});
  }
  PQclear(r);
  return out;
}

std::vector<RankRow> PgStore::loadRanks() {
  std::lock_guard lock(read_mu_);
  std::vector<RankRow> out;
  PGresult* r = nullptr;
  if (!Params().run(read_,
                    "SELECT job_id, rank, host, pid, local_rank, device_name, device_uuid, "
                    "last_seen_ns, batches, records, lost_batches, drops, steps, "
                    "steps_sampled_out FROM ranks",
                    &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    RankRow row;
    row.job_id = gets(r, i, 0);
    row.rank = static_cast<int32_t>(geti(r, i, 1));
    row.host = gets(r, i, 2);
    row.pid = static_cast<int32_t>(geti(r, i, 3));
    row.local_rank = static_cast<int32_t>(geti(r, i, 4));
    row.device_name = gets(r, i, 5);
    row.device_uuid = gets(r, i, 6);
    row.last_seen_ns = geti(r, i, 7);
    row.batches = static_cast<uint64_t>(geti(r, i, 8));
    row.records = static_cast<uint64_t>(geti(r, i, 9));
    row.lost_batches = static_cast<uint64_t>(geti(r, i, 10));
    row.drops = gets(r, i, 11);
    row.steps = static_cast<uint64_t>(geti(r, i, 12));
    row.steps_sampled_out = static_cast<uint64_t>(geti(r, i, 13));
    out.push_back(std::move(row));
  }
  PQclear(r);
  return out;
}

std::vector<SignatureRow> PgStore::loadSignatures() {
  std::lock_guard lock(read_mu_);
  std::vector<SignatureRow> out;
  PGresult* r = nullptr;
  if (!Params().run(read_,
                    "SELECT job_id, sig_id, signature FROM signatures ORDER BY job_id, sig_id", &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    out.push_back({gets(r, i, 0), static_cast<uint32_t>(geti(r, i, 1)), gets(r, i, 2)});
  }
  PQclear(r);
  return out;
}

std::vector<SignatureStatsRow> PgStore::loadSignatureStats() {
  std::lock_guard lock(read_mu_);
  std::vector<SignatureStatsRow> out;
  PGresult* r = nullptr;
  if (!Params().run(read_,
                    "SELECT job_id, sig_id, count, total_ns, min_ns, max_ns, flops, bytes, "
                    "nranks, histogram FROM signature_stats",
                    &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    SignatureStatsRow row;
    row.job_id = gets(r, i, 0);
    row.sig_id = static_cast<uint32_t>(geti(r, i, 1));
    row.count = static_cast<uint64_t>(geti(r, i, 2));
    row.total_ns = geti(r, i, 3);
    row.min_ns = geti(r, i, 4);
    row.max_ns = geti(r, i, 5);
    row.flops = getd(r, i, 6);
    row.bytes = getd(r, i, 7);
    row.nranks = static_cast<int32_t>(geti(r, i, 8));
    row.histogram = gets(r, i, 9);
    out.push_back(std::move(row));
  }
  PQclear(r);
  return out;
}

std::vector<BatchSeqRow> PgStore::loadBatchSeqs() {
  std::lock_guard lock(read_mu_);
  std::vector<BatchSeqRow> out;
  PGresult* r = nullptr;
  if (!Params().run(read_, "SELECT job_id, rank, pid, start_ns, seq, updated_ns FROM batch_seqs",
                    &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    out.push_back({gets(r, i, 0), static_cast<int32_t>(geti(r, i, 1)),
                   static_cast<int32_t>(geti(r, i, 2)), geti(r, i, 3),
                   static_cast<uint64_t>(geti(r, i, 4)), geti(r, i, 5)});
  }
  PQclear(r);
  return out;
}

std::vector<OpenWindowsRow> PgStore::loadOpenWindows() {
  std::lock_guard lock(read_mu_);
  std::vector<OpenWindowsRow> out;
  PGresult* r = nullptr;
  if (!Params().run(read_, "SELECT job_id, rank, rows FROM open_windows", &r)) return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    OpenWindowsRow row;
    row.job_id = gets(r, i, 0);
    row.rank = static_cast<int32_t>(geti(r, i, 1));
    row.rows = decodeOpenWindows(row.job_id, row.rank, gets(r, i, 2));
    out.push_back(std::move(row));
  }
  PQclear(r);
  return out;
}

std::vector<RawRecord> PgStore::rawRecords(const std::string& job_id, int64_t since_ns,
                                           int64_t until_ns, size_t limit) {
  std::lock_guard lock(read_mu_);
  RawSelection sel(since_ns, until_ns, limit);
  // Pages of chunks in order of first start (keyset: start_ns, id), until the selection is
  // complete.
  int64_t after_start = rawChunkLowerBound(since_ns), after_id = -1;
  for (bool more = true; more;) {
    PGresult* r = nullptr;
    if (!Params()
             .text(job_id)
             .i64(after_start)
             .i64(after_id)
             .i64(until_ns)
             .i64(since_ns)
             .i64(kChunksPerPage)
             .run(read_,
                  "SELECT rank, start_ns, records, id FROM raw_chunks WHERE job_id=$1 AND "
                  "(start_ns, id) > ($2, $3) AND start_ns<$4 AND end_ns>=$5 "
                  "ORDER BY start_ns, id LIMIT $6",
                  &r))
      break;
    const int rows = PQntuples(r);
    more = rows == kChunksPerPage;
    for (int i = 0; i < rows; ++i) {
      after_start = geti(r, i, 1);
      after_id = geti(r, i, 3);
      if (!sel.wants(after_start)) {
        more = false;
        break;
      }
      if (!sel.add(static_cast<int32_t>(geti(r, i, 0)), gets(r, i, 2))) {
        noteCorruptRawChunk(&counters_.errors);
      }
    }
    PQclear(r);
  }
  return sel.take();
}

std::vector<WindowSummaryRow> PgStore::windowSummaries(const std::string& job_id, int64_t since_ns,
                                                       size_t limit) {
  std::lock_guard lock(read_mu_);
  std::vector<WindowSummaryRow> out;
  PGresult* r = nullptr;
  if (!Params().text(job_id).i64(since_ns).u64(limit).run(
          read_,
          "SELECT rank, sig_id, stream, window_start_ns, window_end_ns, count, sum_ns, "
          "p50_ns, p99_ns, source FROM window_summaries WHERE job_id=$1 AND "
          "window_start_ns>=$2 ORDER BY window_start_ns, id LIMIT $3",
          &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    WindowSummaryRow w;
    w.job_id = job_id;
    w.rank = static_cast<int32_t>(geti(r, i, 0));
    w.sig_id = static_cast<uint32_t>(geti(r, i, 1));
    w.stream = static_cast<uint64_t>(geti(r, i, 2));
    w.window_start_ns = geti(r, i, 3);
    w.window_end_ns = geti(r, i, 4);
    w.count = static_cast<uint64_t>(geti(r, i, 5));
    w.sum_ns = geti(r, i, 6);
    w.p50_ns = geti(r, i, 7);
    w.p99_ns = geti(r, i, 8);
    w.source = gets(r, i, 9);
    out.push_back(std::move(w));
  }
  PQclear(r);
  return out;
}

std::vector<v1::Alert> PgStore::alerts(const std::string& job_id, int64_t since_ns, size_t limit) {
  std::lock_guard lock(read_mu_);
  std::vector<v1::Alert> out;
  PGresult* r = nullptr;
  if (!Params().text(job_id).i64(since_ns).u64(limit).run(
          read_,
          "SELECT id, job_id, rank, kind, severity, team, message, time_ns FROM alerts "
          "WHERE ($1='' OR job_id=$1) AND time_ns>=$2 ORDER BY time_ns DESC, id DESC "
          "LIMIT $3",
          &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    v1::Alert a;
    a.set_id(static_cast<uint64_t>(geti(r, i, 0)));
    a.set_job_id(gets(r, i, 1));
    a.set_rank(static_cast<int32_t>(geti(r, i, 2)));
    a.set_kind(gets(r, i, 3));
    a.set_severity(gets(r, i, 4));
    a.set_team(gets(r, i, 5));
    a.set_message(gets(r, i, 6));
    a.set_time_unix_ns(geti(r, i, 7));
    out.push_back(std::move(a));
  }
  PQclear(r);
  return out;
}

std::vector<DeepTraceRow> PgStore::deepTrace(const std::string& job_id, int32_t rank,
                                             size_t limit) {
  std::lock_guard lock(read_mu_);
  std::vector<DeepTraceRow> out;
  PGresult* r = nullptr;
  if (!Params().text(job_id).i64(rank).u64(limit).run(
          read_,
          "SELECT rank, record FROM deep_trace WHERE job_id=$1 AND ($2::bigint<0 OR "
          "rank=$2::bigint) "
          "ORDER BY rank, start_ns, id LIMIT $3",
          &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) {
    DeepTraceRow row;
    row.rank = static_cast<int32_t>(geti(r, i, 0));
    if (!row.record.ParseFromString(gets(r, i, 1))) continue;
    out.push_back(std::move(row));
  }
  PQclear(r);
  return out;
}

std::optional<std::string> PgStore::baseline(const std::string& key) {
  std::lock_guard lock(read_mu_);
  PGresult* r = nullptr;
  if (!Params().text(key).run(read_, "SELECT value FROM baselines WHERE key=$1", &r))
    return std::nullopt;
  std::optional<std::string> out;
  if (PQntuples(r) > 0) out = gets(r, 0, 0);
  PQclear(r);
  return out;
}

std::vector<std::pair<std::string, std::string>> PgStore::baselines(const std::string& prefix) {
  std::lock_guard lock(read_mu_);
  std::vector<std::pair<std::string, std::string>> out;
  PGresult* r = nullptr;
  if (!Params().text(prefix).run(
          read_, "SELECT key, value FROM baselines WHERE starts_with(key, $1) ORDER BY key", &r))
    return out;
  for (int i = 0; i < PQntuples(r); ++i) out.emplace_back(gets(r, i, 0), gets(r, i, 1));
  PQclear(r);
  return out;
}

MaintenanceResult PgStore::maintain(int64_t now_ns, const RetentionPolicy& policy) {
  flush();
  MaintenanceResult result;
  std::lock_guard wl(write_mu_);
  auto changed = [](PGresult* r) { return static_cast<uint64_t>(std::atoll(PQcmdTuples(r))); };
  const int64_t raw_cutoff = now_ns - policy.raw_window_ns;
  exec(write_, "BEGIN");
  PGresult* r = nullptr;
  {
    // Chunks holding a record past the window: their old records fold into window rows, the
    // rest are packed again (raw_chunks.h, as in SqliteStore).
    RawFold fold(kRawFoldWindowNs);
    std::string ids = "{";
    std::map<std::string, std::vector<RawRecord>> kept;
    bool ok = true;
    for (int64_t after_id = -1;;) {
      if (!Params()
               .i64(raw_cutoff)
               .i64(after_id)
               .i64(kChunksPerPage)
               .run(write_,
                    "SELECT id, job_id, rank, records FROM raw_chunks WHERE start_ns<$1 AND id>$2 "
                    "ORDER BY id LIMIT $3",
                    &r)) {
        ok = false;
        break;
      }
      const int rows = PQntuples(r);
      for (int i = 0; i < rows; ++i) {
        after_id = geti(r, i, 0);
        ids += (ids.size() > 1 ? "," : "") + std::to_string(after_id);
        // A chunk that does not decode goes with the others.
        if (!splitRawChunk(gets(r, i, 1), static_cast<int32_t>(geti(r, i, 2)), gets(r, i, 3),
                           raw_cutoff, &fold, &kept)) {
          noteCorruptRawChunk(&counters_.errors);
        }
      }
      PQclear(r);
      if (rows < kChunksPerPage) break;
    }
    ids += "}";
    const std::vector<WindowSummaryRow> rows = fold.rows();
    ok = ok && writeWindows(write_, rows) == rows.size();
    ok =
        ok && Params().text(ids).run(write_, "DELETE FROM raw_chunks WHERE id = ANY($1::BIGINT[])");
    for (auto& [job, part] : kept) {
      const size_t n = part.size();
      ok = ok && writeRaw(write_, job, std::move(part)) == n;
    }
    if (ok) {
      result.raw_summarized = fold.records();
    } else {
      counters_.errors++;
    }
    // Deep-trace records live as long as raw records (as in SqliteStore).
    Params().i64(raw_cutoff).run(write_, "DELETE FROM deep_trace WHERE start_ns<$1");
  }
  const int64_t cutoff = now_ns - policy.summary_window_ns;
  for (const char* sql :
       {"DELETE FROM window_summaries WHERE window_end_ns<$1",
        "DELETE FROM alerts WHERE time_ns<$1", "DELETE FROM batch_seqs WHERE updated_ns<$1"}) {
    if (Params().i64(cutoff).run(write_, sql, &r)) {
      result.expired += changed(r);
      PQclear(r);
    }
  }
  exec(write_, "COMMIT");
  auto live = [&]() -> int64_t {
    PGresult* s = nullptr;
    int64_t n = 0;
    if (Params().run(write_,
                     "SELECT CAST(COALESCE(SUM(pg_total_relation_size(c.oid)),0) AS BIGINT) FROM "
                     "pg_class c WHERE c.relname IN ('jobs','ranks','signatures',"
                     "'signature_stats','raw_chunks','window_summaries','alerts','baselines',"
                     "'batch_seqs','open_windows')",
                     &s)) {
      n = geti(s, 0, 0);
      PQclear(s);
    }
    return n;
  };
  // The size cap: oldest raw records first, then the oldest window rows, a tenth at a time.
  // (PostgreSQL reuses the space after autovacuum; the figure drops after VACUUM.)
  for (int round = 0; round < 8 && live() > policy.max_bytes; ++round) {
    bool any = false;
    for (const char* table : {"raw_chunks", "window_summaries"}) {
      const bool raw = std::strcmp(table, "raw_chunks") == 0;
      // Raw evictions count records (the chunks' counts), as the other counters do.
      const std::string sql = std::string("WITH gone AS (DELETE FROM ") + table +
                              " WHERE id IN (SELECT id FROM " + table +
                              " ORDER BY id LIMIT GREATEST(1, (SELECT COUNT(*) FROM " + table +
                              ")/10)) RETURNING " + (raw ? "count" : "1") +
                              " AS n) SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM gone";
      if (Params().run(write_, sql.c_str(), &r)) {
        const auto n = static_cast<uint64_t>(geti(r, 0, 0));
        PQclear(r);
        result.evicted += n;
        if (n > 0) {
          any = true;
          break;
        }
      }
    }
    if (!any) break;
    exec(write_, "VACUUM raw_chunks");
    exec(write_, "VACUUM window_summaries");
  }
  result.live_bytes = live();
  retired_ += result.raw_summarized + result.expired + result.evicted;
  return result;
}

void PgStore::writeMetrics(PromWriter& w) const {
  auto c = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  queue_.writeMetrics(w, counters_);
  w.family("flare_store_retired_rows_total", "counter",
           "Rows removed by the retention policy and the size cap.");
  w.sample("flare_store_retired_rows_total", c(retired_), {{"why", "all"}});
}

}  // namespace flare::engine
