#include "src/engine/sqlite_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "src/common/log.h"
#include "src/engine/metrics.h"
#include "src/engine/raw_chunks.h"
#include "src/engine/store_checkpoint.h"

namespace flare::engine {
namespace {

constexpr int64_t kRawFoldWindowNs = 60LL * 1000000000LL;  // raw records fold into 1-min rows

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
INSERT OR IGNORE INTO meta VALUES('schema_version', '2');
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, world_size INTEGER, start_ns INTEGER, last_seen_ns INTEGER);
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT, rank INTEGER, host TEXT, pid INTEGER, local_rank INTEGER, device_name TEXT,
  device_uuid TEXT, last_seen_ns INTEGER, batches INTEGER, records INTEGER,
  lost_batches INTEGER, drops BLOB, steps INTEGER DEFAULT 0, steps_sampled_out INTEGER DEFAULT 0,
  PRIMARY KEY(job_id, rank));
CREATE TABLE IF NOT EXISTS signatures(
  job_id TEXT, sig_id INTEGER, signature BLOB, PRIMARY KEY(job_id, sig_id));
CREATE TABLE IF NOT EXISTS signature_stats(
  job_id TEXT, sig_id INTEGER, count INTEGER, total_ns INTEGER, min_ns INTEGER, max_ns INTEGER,
  flops REAL, bytes REAL, nranks INTEGER, histogram BLOB, PRIMARY KEY(job_id, sig_id));
CREATE TABLE IF NOT EXISTS raw_chunks(
  id INTEGER PRIMARY KEY, job_id TEXT, rank INTEGER, start_ns INTEGER, end_ns INTEGER,
  count INTEGER, records BLOB);
CREATE INDEX IF NOT EXISTS raw_chunks_by_job_time ON raw_chunks(job_id, start_ns);
CREATE TABLE IF NOT EXISTS window_summaries(
  id INTEGER PRIMARY KEY, job_id TEXT, rank INTEGER, sig_id INTEGER, stream INTEGER,
  window_start_ns INTEGER, window_end_ns INTEGER, count INTEGER, sum_ns INTEGER,
  p50_ns INTEGER, p99_ns INTEGER, source TEXT);
CREATE INDEX IF NOT EXISTS windows_by_job_time ON window_summaries(job_id, window_start_ns);
CREATE TABLE IF NOT EXISTS alerts(
  id INTEGER PRIMARY KEY, job_id TEXT, rank INTEGER, kind TEXT, severity TEXT, team TEXT,
  message TEXT, time_ns INTEGER);
CREATE INDEX IF NOT EXISTS alerts_by_time ON alerts(time_ns);
CREATE TABLE IF NOT EXISTS deep_trace(
  id INTEGER PRIMARY KEY, job_id TEXT, rank INTEGER, start_ns INTEGER, record BLOB);
CREATE INDEX IF NOT EXISTS deep_trace_by_job ON deep_trace(job_id, rank, start_ns);
CREATE TABLE IF NOT EXISTS baselines(key TEXT PRIMARY KEY, value BLOB, updated_ns INTEGER);
CREATE TABLE IF NOT EXISTS batch_seqs(
  job_id TEXT, rank INTEGER, pid INTEGER, start_ns INTEGER, seq INTEGER, updated_ns INTEGER,
  PRIMARY KEY(job_id, rank, pid, start_ns));
CREATE TABLE IF NOT EXISTS open_windows(job_id TEXT, rank INTEGER, rows BLOB,
  PRIMARY KEY(job_id, rank));
)sql";

}  // namespace

// open_windows.rows: 8 little-endian 64-bit fields per row (sig_id, stream, window_start_ns,
// window_end_ns, count, sum_ns, p50_ns, p99_ns).
namespace {
constexpr size_t kOpenWindowFields = 8;
}  // namespace

std::string encodeOpenWindows(const std::vector<WindowSummaryRow>& rows) {
  std::string out;
  out.reserve(rows.size() * kOpenWindowFields * 8);
  auto put = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  for (const WindowSummaryRow& r : rows) {
    put(r.sig_id);
    put(r.stream);
    put(static_cast<uint64_t>(r.window_start_ns));
    put(static_cast<uint64_t>(r.window_end_ns));
    put(r.count);
    put(static_cast<uint64_t>(r.sum_ns));
    put(static_cast<uint64_t>(r.p50_ns));
    put(static_cast<uint64_t>(r.p99_ns));
  }
  return out;
}

std::vector<WindowSummaryRow> decodeOpenWindows(const std::string& job_id, int32_t rank,
                                                const std::string& blob) {
  std::vector<WindowSummaryRow> out;
  constexpr size_t kRowBytes = kOpenWindowFields * 8;
  for (size_t at = 0; at + kRowBytes <= blob.size(); at += kRowBytes) {
    uint64_t f[kOpenWindowFields];
    for (size_t i = 0; i < kOpenWindowFields; ++i) {
      uint64_t v = 0;
      for (int b = 0; b < 8; ++b) {
        v |= static_cast<uint64_t>(static_cast<unsigned char>(blob[at + i * 8 + b])) << (8 * b);
      }
      f[i] = v;
    }
    WindowSummaryRow r;
    r.job_id = job_id;
    r.rank = rank;
    r.sig_id = static_cast<uint32_t>(f[0]);
    r.stream = f[1];
    r.window_start_ns = static_cast<int64_t>(f[2]);
    r.window_end_ns = static_cast<int64_t>(f[3]);
    r.count = f[4];
    r.sum_ns = static_cast<int64_t>(f[5]);
    r.p50_ns = static_cast<int64_t>(f[6]);
    r.p99_ns = static_cast<int64_t>(f[7]);
    r.source = "summary";
    out.push_back(std::move(r));
  }
  return out;
}

struct SqliteStore::Writer {
  explicit Writer(sqlite3* d) : db(d) {}
  ~Writer() {
    for (auto& [sql, st] : cache) sqlite3_finalize(st);
  }
  // A statement prepared once per writer thread.
  sqlite3_stmt* get(const char* sql) {
    auto& st = cache[sql];
    if (st == nullptr) sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
    return st;
  }
  sqlite3* db;
  std::unordered_map<const char*, sqlite3_stmt*> cache;
};

namespace {

// A prepared statement: owned (finalized on scope exit) or borrowed from the writer's cache
// (reset and unbound on scope exit).
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) {
    ok_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) == SQLITE_OK;
  }
  template <typename W>
  Stmt(W& w, const char* sql) : s_(w.get(sql)), owned_(false) {
    ok_ = s_ != nullptr;
  }
  ~Stmt() {
    if (owned_) {
      sqlite3_finalize(s_);
    } else {
      sqlite3_reset(s_);
      sqlite3_clear_bindings(s_);
    }
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return ok_; }
  Stmt& bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& bindU(int i, uint64_t v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& blob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  int step() { return sqlite3_step(s_); }
  // Runs to completion; true on success. Resets for reuse.
  bool run() {
    const int rc = sqlite3_step(s_);
    sqlite3_reset(s_);
    return rc == SQLITE_DONE || rc == SQLITE_ROW;
  }
  int64_t i64(int c) { return sqlite3_column_int64(s_, c); }
  double dbl(int c) { return sqlite3_column_double(s_, c); }
  std::string str(int c) {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(s_, c));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, c))) : std::string();
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  bool owned_ = true;
  bool ok_ = false;
};

bool exec(sqlite3* db, const char* sql, std::string* error = nullptr) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
    if (error) *error = msg ? msg : "sqlite error";
    sqlite3_free(msg);
    return false;
  }
  return true;
}

int64_t pragmaInt(sqlite3* db, const char* sql) {
  Stmt s(db, sql);
  return s.ok() && s.step() == SQLITE_ROW ? s.i64(0) : 0;
}

}  // namespace

SqliteStore::SqliteStore(Options options)
    : options_(std::move(options)), queue_(options_.max_queued_ops, options_.max_queued_raw) {}

std::unique_ptr<SqliteStore> SqliteStore::open(const Options& options, std::string* error) {
  std::unique_ptr<SqliteStore> store(new SqliteStore(options));
  if (!store->init(error)) return nullptr;
  return store;
}

bool SqliteStore::init(std::string* error) {
  if (options_.path.empty() || options_.path == ":memory:") {
    *error = "the store needs a file path";
    return false;
  }
  for (sqlite3** db : {&write_db_, &read_db_}) {
    if (sqlite3_open_v2(options_.path.c_str(), db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      *error = "cannot open " + options_.path + ": " + sqlite3_errmsg(*db);
      return false;
    }
    sqlite3_busy_timeout(*db, 5000);
  }
  // 16 KiB pages (a new file only; an existing one keeps its size): a raw chunk of a few KB
  // shares its page with others instead of leaving most of a 4 KiB page empty.
  if (!exec(write_db_,
            "PRAGMA page_size=16384; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", error) ||
      !exec(write_db_, kSchema, error) || !exec(read_db_, "PRAGMA query_only=1;", error)) {
    *error = options_.path + ": " + *error;
    return false;
  }
  if (!migrateRawRecords(error) || !migrateRankSteps(error)) {
    *error = options_.path + ": " + *error;
    return false;
  }
  next_alert_id_ = static_cast<uint64_t>(pragmaInt(write_db_, "SELECT MAX(id) FROM alerts")) + 1;
  live_bytes_ = liveBytes();
  writer_ = std::make_unique<Writer>(write_db_);
  queue_.start([this](std::vector<Op>& ops) { commit(ops); });
  return true;
}

SqliteStore::~SqliteStore() {
  queue_.stop();
  writer_.reset();  // finalizes the cached statements before the connection closes
  sqlite3_close_v2(read_db_);
  sqlite3_close_v2(write_db_);
}

void SqliteStore::commit(std::vector<Op>& ops) {
  std::lock_guard wl(write_mu_);
  exec(write_db_, "BEGIN");
  for (auto& op : ops) op(*writer_);
  std::string err;
  if (!exec(write_db_, "COMMIT", &err)) {
    counters_.errors.fetch_add(ops.size(), std::memory_order_relaxed);
    FLARE_LOG_ERROR("engine", "store: commit failed: {}", err);
    exec(write_db_, "ROLLBACK");
  }
  counters_.transactions.fetch_add(1, std::memory_order_relaxed);
}

void SqliteStore::flush() {
  queue_.flush();
}

bool SqliteStore::flushWithin(std::chrono::milliseconds timeout) {
  return queue_.flushWithin(timeout);
}

namespace {
void countResult(bool ok, std::atomic<uint64_t>& rows, std::atomic<uint64_t>& errors,
                 uint64_t n = 1) {
  (ok ? rows : errors).fetch_add(n, std::memory_order_relaxed);
}

// The row writers, shared by the single-row ops and the checkpoint (templates: Writer is private).
template <typename W>
bool writeJob(W& w, const JobRow& r) {
  Stmt s(w, "INSERT OR REPLACE INTO jobs VALUES(?,?,?,?)");
  s.bind(1, r.job_id).bind(2, int64_t{r.world_size}).bind(3, r.start_ns).bind(4, r.last_seen_ns);
  return s.run();
}

template <typename W>
bool writeRank(W& w, const RankRow& r) {
  Stmt s(w,
         "INSERT OR REPLACE INTO ranks(job_id, rank, host, pid, local_rank, device_name, "
         "device_uuid, last_seen_ns, batches, records, lost_batches, drops, steps, "
         "steps_sampled_out) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  s.bind(1, r.job_id).bind(2, int64_t{r.rank}).bind(3, r.host).bind(4, int64_t{r.pid});
  s.bind(5, int64_t{r.local_rank}).bind(6, r.device_name).bind(7, r.device_uuid);
  s.bind(8, r.last_seen_ns).bindU(9, r.batches).bindU(10, r.records);
  s.bindU(11, r.lost_batches).blob(12, r.drops).bindU(13, r.steps).bindU(14, r.steps_sampled_out);
  return s.run();
}

template <typename W>
bool writeSignatureStats(W& w, const SignatureStatsRow& r) {
  Stmt s(w, "INSERT OR REPLACE INTO signature_stats VALUES(?,?,?,?,?,?,?,?,?,?)");
  s.bind(1, r.job_id).bindU(2, r.sig_id).bindU(3, r.count).bind(4, r.total_ns);
  s.bind(5, r.min_ns).bind(6, r.max_ns).bind(7, r.flops).bind(8, r.bytes);
  s.bind(9, int64_t{r.nranks}).blob(10, r.histogram);
  return s.run();
}

// Returns the records written (raw_chunks.h: packed per rank).
template <typename W>
uint64_t writeRaw(W& w, const std::string& job_id, std::vector<RawRecord> recs) {
  Stmt s(w,
         "INSERT INTO raw_chunks(job_id,rank,start_ns,end_ns,count,records) "
         "VALUES(?,?,?,?,?,?)");
  s.bind(1, job_id);
  uint64_t ok = 0;
  for (const RawChunk& c : packRawRecords(std::move(recs))) {
    s.bind(2, int64_t{c.rank}).bind(3, c.first_start_ns).bind(4, c.last_start_ns);
    s.bind(5, int64_t{c.count}).blob(6, c.blob);
    ok += s.run() ? c.count : 0;
  }
  return ok;
}

template <typename W>
uint64_t writeDeepTrace(W& w, const std::string& job_id, const std::vector<DeepTraceRow>& rows) {
  Stmt s(w, "INSERT INTO deep_trace(job_id,rank,start_ns,record) VALUES(?,?,?,?)");
  s.bind(1, job_id);
  uint64_t ok = 0;
  std::string blob;
  for (const DeepTraceRow& r : rows) {
    r.record.SerializeToString(&blob);
    s.bind(2, int64_t{r.rank}).bind(3, r.record.start_ns()).blob(4, blob);
    ok += s.run() ? 1 : 0;
  }
  return ok;
}

template <typename W>
uint64_t writeWindows(W& w, const std::vector<WindowSummaryRow>& rows) {
  Stmt s(w,
         "INSERT INTO window_summaries(job_id,rank,sig_id,stream,window_start_ns,"
         "window_end_ns,count,sum_ns,p50_ns,p99_ns,source) VALUES(?,?,?,?,?,?,?,?,?,?,?)");
  uint64_t ok = 0;
  for (const WindowSummaryRow& r : rows) {
    s.bind(1, r.job_id).bind(2, int64_t{r.rank}).bindU(3, r.sig_id).bindU(4, r.stream);
    s.bind(5, r.window_start_ns).bind(6, r.window_end_ns).bindU(7, r.count).bind(8, r.sum_ns);
    s.bind(9, r.p50_ns).bind(10, r.p99_ns).bind(11, r.source);
    ok += s.run() ? 1 : 0;
  }
  return ok;
}

}  // namespace

// Schema 1 kept a row per raw record (raw_records); schema 2 packs them (raw_chunks.h). A file
// written by an older flared is converted once, in one transaction, on open.
bool SqliteStore::migrateRawRecords(std::string* error) {
  if (pragmaInt(write_db_,
                "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='raw_records'") ==
      0) {
    return true;
  }
  if (!exec(write_db_, "BEGIN", error)) return false;
  uint64_t moved = 0;
  {
    Writer w(write_db_);
    Stmt s(write_db_,
           "SELECT job_id, rank, sig_id, stream, issue_ns, start_ns, end_ns, flops, bytes, "
           "coll_seq FROM raw_records ORDER BY job_id");
    std::string job;
    std::vector<RawRecord> recs;
    auto put = [&] {
      moved += writeRaw(w, job, std::move(recs));
      recs.clear();
    };
    while (s.step() == SQLITE_ROW) {
      if (s.str(0) != job || recs.size() >= 100000) {
        if (!recs.empty()) put();
        job = s.str(0);
      }
      recs.push_back(RawRecord{static_cast<int32_t>(s.i64(1)), static_cast<uint32_t>(s.i64(2)),
                               static_cast<uint64_t>(s.i64(3)), s.i64(4), s.i64(5), s.i64(6),
                               static_cast<uint64_t>(s.i64(7)), static_cast<uint64_t>(s.i64(8)),
                               static_cast<uint64_t>(s.i64(9))});
    }
    if (!recs.empty()) put();
  }
  if (!exec(write_db_,
            "DROP TABLE raw_records; "
            "INSERT OR REPLACE INTO meta VALUES('schema_version', '2'); COMMIT",
            error)) {
    exec(write_db_, "ROLLBACK");
    *error = "converting raw_records to raw_chunks: " + *error;
    return false;
  }
  FLARE_LOG_INFO("engine", "store: {} raw records converted to packed chunks (schema 2)", moved);
  return true;
}

// The ranks' step counts (steps, steps_sampled_out) came after schema 2: a file written by an
// older flared gets the two columns, 0 for its ranks.
bool SqliteStore::migrateRankSteps(std::string* error) {
  for (const char* column : {"steps", "steps_sampled_out"}) {
    const std::string has =
        std::string("SELECT COUNT(*) FROM pragma_table_info('ranks') WHERE name='") + column + "'";
    if (pragmaInt(write_db_, has.c_str()) > 0) continue;
    const std::string add =
        std::string("ALTER TABLE ranks ADD COLUMN ") + column + " INTEGER DEFAULT 0";
    if (!exec(write_db_, add.c_str(), error)) {
      *error = "adding ranks." + std::string(column) + ": " + *error;
      return false;
    }
  }
  return true;
}

void SqliteStore::putJob(const JobRow& r) {
  queue_.push(
      [this, r](Writer& w) {
        countResult(writeJob(w, r), counters_.rows_written, counters_.errors);
      },
      0);
}

void SqliteStore::putRank(const RankRow& r) {
  queue_.push(
      [this, r](Writer& w) {
        countResult(writeRank(w, r), counters_.rows_written, counters_.errors);
      },
      0);
}

void SqliteStore::putSignature(const SignatureRow& r) {
  queue_.push(
      [this, r](Writer& w) {
        Stmt s(w, "INSERT OR REPLACE INTO signatures VALUES(?,?,?)");
        s.bind(1, r.job_id).bindU(2, r.sig_id).blob(3, r.signature);
        countResult(s.run(), counters_.rows_written, counters_.errors);
      },
      0);
}

void SqliteStore::putSignatureStats(const SignatureStatsRow& r) {
  queue_.push(
      [this, r](Writer& w) {
        countResult(writeSignatureStats(w, r), counters_.rows_written, counters_.errors);
      },
      0);
}

void SqliteStore::appendRaw(const std::string& job_id, std::vector<RawRecord> records) {
  if (records.empty()) return;
  const size_t n = records.size();
  queue_.push(
      [this, job_id, recs = std::move(records)](Writer& w) mutable {
        const size_t total = recs.size();
        const uint64_t ok = writeRaw(w, job_id, std::move(recs));
        counters_.raw_written.fetch_add(ok, std::memory_order_relaxed);
        counters_.errors.fetch_add(total - ok, std::memory_order_relaxed);
      },
      n);
}

void SqliteStore::appendDeepTrace(const std::string& job_id, std::vector<DeepTraceRow> rows) {
  if (rows.empty()) return;
  const size_t n = rows.size();
  queue_.push(
      [this, job_id, rows = std::move(rows)](Writer& w) {
        const uint64_t ok = writeDeepTrace(w, job_id, rows);
        counters_.raw_written.fetch_add(ok, std::memory_order_relaxed);
        counters_.errors.fetch_add(rows.size() - ok, std::memory_order_relaxed);
      },
      n);
}

std::vector<DeepTraceRow> SqliteStore::deepTrace(const std::string& job_id, int32_t rank,
                                                 size_t limit) {
  std::lock_guard lock(read_mu_);
  std::vector<DeepTraceRow> out;
  Stmt s(read_db_,
         "SELECT rank, record FROM deep_trace WHERE job_id=? AND (?<0 OR rank=?) "
         "ORDER BY rank, start_ns LIMIT ?");
  s.bind(1, job_id).bind(2, int64_t{rank}).bind(3, int64_t{rank}).bindU(4, limit);
  while (s.step() == SQLITE_ROW) {
    DeepTraceRow r;
    r.rank = static_cast<int32_t>(s.i64(0));
    if (!r.record.ParseFromString(s.str(1))) continue;
    out.push_back(std::move(r));
  }
  return out;
}

void SqliteStore::putWindowSummaries(std::vector<WindowSummaryRow> rows) {
  if (rows.empty()) return;
  queue_.push(
      [this, rows = std::move(rows)](Writer& w) {
        const uint64_t ok = writeWindows(w, rows);
        counters_.rows_written.fetch_add(ok, std::memory_order_relaxed);
        counters_.errors.fetch_add(rows.size() - ok, std::memory_order_relaxed);
      },
      0);
}

namespace {

// A checkpoint's rows, as SQLite statements on the writer's connection (writeCheckpoint).
template <typename W>
struct CheckpointOut {
  W& w;
  bool job(const JobRow& r) { return writeJob(w, r); }
  bool rank(const RankRow& r) { return writeRank(w, r); }
  bool signatureStats(const SignatureStatsRow& r) { return writeSignatureStats(w, r); }
  uint64_t raw(const std::string& job, std::vector<RawRecord>&& recs) {
    return writeRaw(w, job, std::move(recs));
  }
  uint64_t deepTrace(const std::string& job, const std::vector<DeepTraceRow>& rows) {
    return writeDeepTrace(w, job, rows);
  }
  uint64_t windows(const std::vector<WindowSummaryRow>& rows) { return writeWindows(w, rows); }
  bool openWindows(const OpenWindowsRow& r) {
    Stmt s(w, "INSERT OR REPLACE INTO open_windows VALUES(?,?,?)");
    s.bind(1, r.job_id).bind(2, int64_t{r.rank}).blob(3, encodeOpenWindows(r.rows));
    return s.run();
  }
  bool batchSeq(const BatchSeqRow& r) {
    Stmt s(w, "INSERT OR REPLACE INTO batch_seqs VALUES(?,?,?,?,?,?)");
    s.bind(1, r.job_id).bind(2, int64_t{r.rank}).bind(3, int64_t{r.pid}).bind(4, r.start_ns);
    s.bindU(5, r.seq).bind(6, r.updated_ns);
    return s.run();
  }
};

}  // namespace

void SqliteStore::putCheckpoint(Checkpoint cp) {
  if (cp.empty()) return;
  const size_t raw = admitCheckpoint(cp, queue_);
  auto op = [this, cp = std::move(cp)](Writer& w) mutable {
    // The whole checkpoint is one op, hence inside one transaction (commit).
    CheckpointOut<Writer> out{w};
    const CheckpointCounts n = writeCheckpoint(cp, out);
    counters_.rows_written.fetch_add(n.rows_ok, std::memory_order_relaxed);
    counters_.raw_written.fetch_add(n.raw_ok, std::memory_order_relaxed);
    counters_.errors.fetch_add(n.rows_failed + n.raw_failed, std::memory_order_relaxed);
  };
  queue_.push(std::move(op), raw, /*never_drop=*/true);
}

uint64_t SqliteStore::putAlert(v1::Alert a) {
  a.set_id(next_alert_id_.fetch_add(1));
  const uint64_t id = a.id();
  queue_.push(
      [this, a = std::move(a)](Writer& w) {
        Stmt s(w, "INSERT OR REPLACE INTO alerts VALUES(?,?,?,?,?,?,?,?)");
        s.bindU(1, a.id()).bind(2, a.job_id()).bind(3, int64_t{a.rank()}).bind(4, a.kind());
        s.bind(5, a.severity()).bind(6, a.team()).bind(7, a.message()).bind(8, a.time_unix_ns());
        countResult(s.run(), counters_.rows_written, counters_.errors);
      },
      0);
  return id;
}

void SqliteStore::putBaseline(const std::string& key, const std::string& value, int64_t now_ns) {
  queue_.push(
      [this, key, value, now_ns](Writer& w) {
        Stmt s(w, "INSERT OR REPLACE INTO baselines VALUES(?,?,?)");
        s.bind(1, key).blob(2, value).bind(3, now_ns);
        countResult(s.run(), counters_.rows_written, counters_.errors);
      },
      0);
}

void SqliteStore::removeBaseline(const std::string& key) {
  queue_.push(
      [this, key](Writer& w) {
        Stmt s(w, "DELETE FROM baselines WHERE key=?");
        s.bind(1, key);
        countResult(s.run(), counters_.rows_written, counters_.errors);
      },
      0);
}

std::vector<JobRow> SqliteStore::loadJobs() {
  std::lock_guard lock(read_mu_);
  std::vector<JobRow> out;
  Stmt s(read_db_, "SELECT job_id, world_size, start_ns, last_seen_ns FROM jobs");
  while (s.step() == SQLITE_ROW) {
    out.push_back({s.str(0), static_cast<int32_t>(s.i64(1)), s.i64(2), s.i64(3)});
  }
  return out;
}

std::vector<RankRow> SqliteStore::loadRanks() {
  std::lock_guard lock(read_mu_);
  std::vector<RankRow> out;
  Stmt s(read_db_,
         "SELECT job_id, rank, host, pid, local_rank, device_name, device_uuid, last_seen_ns, "
         "batches, records, lost_batches, drops, steps, steps_sampled_out FROM ranks");
  while (s.step() == SQLITE_ROW) {
    RankRow r;
    r.job_id = s.str(0);
    r.rank = static_cast<int32_t>(s.i64(1));
    r.host = s.str(2);
    r.pid = static_cast<int32_t>(s.i64(3));
    r.local_rank = static_cast<int32_t>(s.i64(4));
    r.device_name = s.str(5);
    r.device_uuid = s.str(6);
    r.last_seen_ns = s.i64(7);
    r.batches = static_cast<uint64_t>(s.i64(8));
    r.records = static_cast<uint64_t>(s.i64(9));
    r.lost_batches = static_cast<uint64_t>(s.i64(10));
    r.drops = s.str(11);
    r.steps = static_cast<uint64_t>(s.i64(12));
    r.steps_sampled_out = static_cast<uint64_t>(s.i64(13));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<SignatureRow> SqliteStore::loadSignatures() {
  std::lock_guard lock(read_mu_);
  std::vector<SignatureRow> out;
  Stmt s(read_db_, "SELECT job_id, sig_id, signature FROM signatures ORDER BY job_id, sig_id");
  while (s.step() == SQLITE_ROW) {
    out.push_back({s.str(0), static_cast<uint32_t>(s.i64(1)), s.str(2)});
  }
  return out;
}

std::vector<SignatureStatsRow> SqliteStore::loadSignatureStats() {
  std::lock_guard lock(read_mu_);
  std::vector<SignatureStatsRow> out;
  Stmt s(read_db_,
         "SELECT job_id, sig_id, count, total_ns, min_ns, max_ns, flops, bytes, nranks, histogram "
         "FROM signature_stats");
  while (s.step() == SQLITE_ROW) {
    SignatureStatsRow r;
    r.job_id = s.str(0);
    r.sig_id = static_cast<uint32_t>(s.i64(1));
    r.count = static_cast<uint64_t>(s.i64(2));
    r.total_ns = s.i64(3);
    r.min_ns = s.i64(4);
    r.max_ns = s.i64(5);
    r.flops = s.dbl(6);
    r.bytes = s.dbl(7);
    r.nranks = static_cast<int32_t>(s.i64(8));
    r.histogram = s.str(9);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<BatchSeqRow> SqliteStore::loadBatchSeqs() {
  std::lock_guard lock(read_mu_);
  std::vector<BatchSeqRow> out;
  Stmt s(read_db_, "SELECT job_id, rank, pid, start_ns, seq, updated_ns FROM batch_seqs");
  while (s.step() == SQLITE_ROW) {
    out.push_back({s.str(0), static_cast<int32_t>(s.i64(1)), static_cast<int32_t>(s.i64(2)),
                   s.i64(3), static_cast<uint64_t>(s.i64(4)), s.i64(5)});
  }
  return out;
}

std::vector<OpenWindowsRow> SqliteStore::loadOpenWindows() {
  std::lock_guard lock(read_mu_);
  std::vector<OpenWindowsRow> out;
  Stmt s(read_db_, "SELECT job_id, rank, rows FROM open_windows");
  while (s.step() == SQLITE_ROW) {
    OpenWindowsRow r;
    r.job_id = s.str(0);
    r.rank = static_cast<int32_t>(s.i64(1));
    r.rows = decodeOpenWindows(r.job_id, r.rank, s.str(2));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RawRecord> SqliteStore::rawRecords(const std::string& job_id, int64_t since_ns,
                                               int64_t until_ns, size_t limit) {
  std::lock_guard lock(read_mu_);
  RawSelection sel(since_ns, until_ns, limit);
  Stmt s(read_db_,
         "SELECT rank, start_ns, records FROM raw_chunks WHERE job_id=? AND start_ns>=? AND "
         "start_ns<? AND end_ns>=? ORDER BY start_ns, id");
  s.bind(1, job_id).bind(2, rawChunkLowerBound(since_ns)).bind(3, until_ns).bind(4, since_ns);
  while (s.step() == SQLITE_ROW && sel.wants(s.i64(1))) {
    if (!sel.add(static_cast<int32_t>(s.i64(0)), s.str(2))) noteCorruptRawChunk(&counters_.errors);
  }
  return sel.take();
}

std::vector<WindowSummaryRow> SqliteStore::windowSummaries(const std::string& job_id,
                                                           int64_t since_ns, size_t limit) {
  std::lock_guard lock(read_mu_);
  std::vector<WindowSummaryRow> out;
  Stmt s(read_db_,
         "SELECT rank, sig_id, stream, window_start_ns, window_end_ns, count, sum_ns, p50_ns, "
         "p99_ns, source FROM window_summaries WHERE job_id=? AND window_start_ns>=? ORDER BY "
         "window_start_ns, id LIMIT ?");
  s.bind(1, job_id).bind(2, since_ns).bindU(3, limit);
  while (s.step() == SQLITE_ROW) {
    WindowSummaryRow r;
    r.job_id = job_id;
    r.rank = static_cast<int32_t>(s.i64(0));
    r.sig_id = static_cast<uint32_t>(s.i64(1));
    r.stream = static_cast<uint64_t>(s.i64(2));
    r.window_start_ns = s.i64(3);
    r.window_end_ns = s.i64(4);
    r.count = static_cast<uint64_t>(s.i64(5));
    r.sum_ns = s.i64(6);
    r.p50_ns = s.i64(7);
    r.p99_ns = s.i64(8);
    r.source = s.str(9);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<v1::Alert> SqliteStore::alerts(const std::string& job_id, int64_t since_ns,
                                           size_t limit) {
  std::lock_guard lock(read_mu_);
  std::vector<v1::Alert> out;
  Stmt s(read_db_,
         "SELECT id, job_id, rank, kind, severity, team, message, time_ns FROM alerts WHERE "
         "(?='' OR job_id=?) AND time_ns>=? ORDER BY time_ns DESC, id DESC LIMIT ?");
  s.bind(1, job_id).bind(2, job_id).bind(3, since_ns).bindU(4, limit);
  while (s.step() == SQLITE_ROW) {
    v1::Alert a;
    a.set_id(static_cast<uint64_t>(s.i64(0)));
    a.set_job_id(s.str(1));
    a.set_rank(static_cast<int32_t>(s.i64(2)));
    a.set_kind(s.str(3));
    a.set_severity(s.str(4));
    a.set_team(s.str(5));
    a.set_message(s.str(6));
    a.set_time_unix_ns(s.i64(7));
    out.push_back(std::move(a));
  }
  return out;
}

std::optional<std::string> SqliteStore::baseline(const std::string& key) {
  std::lock_guard lock(read_mu_);
  Stmt s(read_db_, "SELECT value FROM baselines WHERE key=?");
  s.bind(1, key);
  if (s.step() == SQLITE_ROW) return s.str(0);
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> SqliteStore::baselines(const std::string& prefix) {
  std::lock_guard lock(read_mu_);
  Stmt s(read_db_, "SELECT key, value FROM baselines WHERE substr(key, 1, ?)=? ORDER BY key");
  s.bind(1, static_cast<int64_t>(prefix.size())).bind(2, prefix);
  std::vector<std::pair<std::string, std::string>> out;
  while (s.step() == SQLITE_ROW) out.emplace_back(s.str(0), s.str(1));
  return out;
}

int64_t SqliteStore::liveBytes() {
  std::lock_guard lock(read_mu_);
  const int64_t pages = pragmaInt(read_db_, "PRAGMA page_count");
  const int64_t free_pages = pragmaInt(read_db_, "PRAGMA freelist_count");
  return (pages - free_pages) * pragmaInt(read_db_, "PRAGMA page_size");
}

MaintenanceResult SqliteStore::maintain(int64_t now_ns, const RetentionPolicy& policy) {
  flush();
  MaintenanceResult result;
  std::lock_guard wl(write_mu_);
  sqlite3* db = write_db_;
  // 1. Raw records past the raw window: fold into one-minute window rows, then delete.
  const int64_t raw_cutoff = now_ns - policy.raw_window_ns;
  exec(db, "BEGIN");
  {
    // Chunks holding a record past the window: their old records fold, the rest are packed
    // again (raw_chunks.h).
    RawFold fold(kRawFoldWindowNs);
    std::vector<int64_t> folded_ids;
    std::map<std::string, std::vector<RawRecord>> kept;
    {
      Stmt q(db, "SELECT id, job_id, rank, records FROM raw_chunks WHERE start_ns<?");
      q.bind(1, raw_cutoff);
      while (q.step() == SQLITE_ROW) {
        folded_ids.push_back(q.i64(0));  // a chunk that does not decode goes with the others
        if (!splitRawChunk(q.str(1), static_cast<int32_t>(q.i64(2)), q.str(3), raw_cutoff, &fold,
                           &kept)) {
          noteCorruptRawChunk(&counters_.errors);
        }
      }
    }
    Writer w(db);
    const std::vector<WindowSummaryRow> rows = fold.rows();
    bool ok = writeWindows(w, rows) == rows.size();
    Stmt del(db, "DELETE FROM raw_chunks WHERE id=?");
    for (int64_t id : folded_ids) ok = del.bind(1, id).run() && ok;
    for (auto& [job, recs] : kept) {
      const size_t n = recs.size();
      ok = writeRaw(w, job, std::move(recs)) == n && ok;
    }
    Stmt del_deep(db, "DELETE FROM deep_trace WHERE start_ns<?");  // same window as raw records
    del_deep.bind(1, raw_cutoff);
    del_deep.run();
    if (ok) {
      result.raw_summarized = fold.records();
    } else {
      counters_.errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // 2. Window rows and alerts past their retention.
  const int64_t cutoff = now_ns - policy.summary_window_ns;
  {
    Stmt w(db, "DELETE FROM window_summaries WHERE window_end_ns<?");
    w.bind(1, cutoff);
    if (w.run()) result.expired += static_cast<uint64_t>(sqlite3_changes(db));
    Stmt a(db, "DELETE FROM alerts WHERE time_ns<?");
    a.bind(1, cutoff);
    if (a.run()) result.expired += static_cast<uint64_t>(sqlite3_changes(db));
    // Marks of rank processes not heard from within the retention (they will not resume).
    Stmt m(db, "DELETE FROM batch_seqs WHERE updated_ns<?");
    m.bind(1, cutoff);
    if (m.run()) result.expired += static_cast<uint64_t>(sqlite3_changes(db));
  }
  exec(db, "COMMIT");
  // 3. The size cap: oldest raw records first, then the oldest window rows, a tenth at a time.
  auto live = [&] {
    return (pragmaInt(db, "PRAGMA page_count") - pragmaInt(db, "PRAGMA freelist_count")) *
           pragmaInt(db, "PRAGMA page_size");
  };
  for (int round = 0; round < 64 && live() > policy.max_bytes; ++round) {
    const int64_t raw_rows = pragmaInt(db, "SELECT COUNT(*) FROM raw_chunks");
    const char* table = raw_rows > 0 ? "raw_chunks" : "window_summaries";
    const int64_t rows =
        raw_rows > 0 ? raw_rows : pragmaInt(db, "SELECT COUNT(*) FROM window_summaries");
    if (rows == 0) break;
    const int64_t n = std::max<int64_t>(1, rows / 10);
    // Raw evictions count records, as the other retention counters do.
    int64_t raw_evicted = 0;
    if (raw_rows > 0) {
      Stmt records(db,
                   "SELECT COALESCE(SUM(count), 0) FROM (SELECT count FROM raw_chunks "
                   "ORDER BY id LIMIT ?)");
      records.bind(1, n);
      if (records.step() == SQLITE_ROW) raw_evicted = records.i64(0);
    }
    const std::string sql = std::string("DELETE FROM ") + table + " WHERE id IN (SELECT id FROM " +
                            table + " ORDER BY id LIMIT ?)";
    Stmt d(db, sql.c_str());
    d.bind(1, n);
    if (!d.run()) break;
    result.evicted += raw_rows > 0 ? static_cast<uint64_t>(raw_evicted)
                                   : static_cast<uint64_t>(sqlite3_changes(db));
  }
  if (result.evicted > 0) exec(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  result.live_bytes = live();
  summarized_.fetch_add(result.raw_summarized, std::memory_order_relaxed);
  expired_.fetch_add(result.expired, std::memory_order_relaxed);
  evicted_.fetch_add(result.evicted, std::memory_order_relaxed);
  live_bytes_.store(result.live_bytes, std::memory_order_relaxed);
  return result;
}

void SqliteStore::writeMetrics(PromWriter& w) const {
  auto c = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  queue_.writeMetrics(w, counters_);
  w.family("flare_store_retired_rows_total", "counter",
           "Rows removed by the retention policy (summarized raw records, expired rows) and "
           "by the size cap (evicted).");
  w.sample("flare_store_retired_rows_total", c(summarized_), {{"why", "summarized"}});
  w.sample("flare_store_retired_rows_total", c(expired_), {{"why", "expired"}});
  w.sample("flare_store_retired_rows_total", c(evicted_), {{"why", "evicted"}});
  w.family("flare_store_live_bytes", "gauge",
           "Pages in use times page size, at the last maintenance.");
  w.sample("flare_store_live_bytes", live_bytes_.load(std::memory_order_relaxed));
}

}  // namespace flare::engine
