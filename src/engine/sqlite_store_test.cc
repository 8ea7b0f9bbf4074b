// SqliteStore: the Store contract across a daemon restart (store_contract.h, run against
// PostgreSQL too), and SQLite's own: retention folds and expires, the size cap evicts, older
// files are converted on open.
#include "src/engine/sqlite_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "src/engine/ingest.h"
#include "src/engine/metrics.h"
#include "src/engine/store_contract.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

using testing::addKernel;
using testing::gemmSig;
using testing::kNow;
using testing::makeHello;

class StoreTest : public ::testing::Test {
 protected:
  StoreTest() {
    dir_ = std::filesystem::temp_directory_path() /
           ("flare_store_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~StoreTest() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<SqliteStore> open() {
    std::string err;
    SqliteStore::Options o;
    o.path = (dir_ / "flared.db").string();
    auto s = SqliteStore::open(o, &err);
    EXPECT_TRUE(s) << err;
    return s;
  }
  std::filesystem::path dir_;
};

TEST_F(StoreTest, EveryTableSurvivesReopen) {
  testing::everyTableSurvivesReopen([this] { return open(); });
}

TEST_F(StoreTest, IngestStateRebuiltAfterRestartGivesTheSameReport) {
  testing::ingestStateRebuiltAfterRestartGivesTheSameReport([this] { return open(); });
}

TEST_F(StoreTest, RanksSummariesFoldIntoOneRowPerWindow) {
  const int64_t min = 60LL * 1000000000LL;
  const int64_t t0 = kNow / min * min;
  common::FakeClock clock(t0);
  auto s = open();
  Ingest ingest({}, s.get(), clock);
  auto out = ingest.hello(makeHello("job", 0, 1), nullptr);
  auto batch = [](int64_t start, uint64_t n, int64_t p50, int64_t p99) {
    v1::RecordBatch b;
    b.set_rank(0);
    *b.add_signatures() = gemmSig(4, 512, 512, 512);
    v1::KernelSummary* sm = b.add_summaries();
    sm->set_signature_id(4);
    sm->set_stream_id(3);
    sm->set_window_start_ns(start);
    sm->set_window_end_ns(start + 1000000000);
    auto* c = sm->add_clusters();
    c->set_count(n);
    c->set_p50_ns(p50);
    c->set_p99_ns(p99);
    c->set_sum_ns(static_cast<int64_t>(n) * p50);
    return b;
  };
  // Three one-second summaries in the first minute, one in the next.
  ASSERT_TRUE(ingest.batch(out.session_id, batch(t0, 100, 1000, 1500)).ok());
  ASSERT_TRUE(ingest.batch(out.session_id, batch(t0 + min / 2, 300, 2000, 4000)).ok());
  ASSERT_TRUE(ingest.batch(out.session_id, batch(t0 + min - 1000000000, 100, 1000, 1200)).ok());
  clock.setNs(t0 + min + 1);
  ingest.persist();
  s->flush();
  auto rows = s->windowSummaries("job", 0, 10);
  ASSERT_EQ(rows.size(), 1u);  // the first minute closed; nothing open yet for the second
  EXPECT_EQ(rows[0].window_start_ns, t0);
  EXPECT_EQ(rows[0].count, 500u);
  EXPECT_EQ(rows[0].sum_ns, 100 * 1000 + 300 * 2000 + 100 * 1000);
  EXPECT_EQ(rows[0].p50_ns, (100 * 1000 + 300 * 2000 + 100 * 1000) / 500);
  EXPECT_EQ(rows[0].p99_ns, 4000);
  EXPECT_EQ(rows[0].stream, 3u);
  ASSERT_TRUE(ingest.batch(out.session_id, batch(t0 + min, 10, 500, 600)).ok());
  ingest.persist(/*final=*/true);
  s->flush();
  rows = s->windowSummaries("job", 0, 10);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].window_start_ns, t0 + min);
  EXPECT_EQ(rows[1].count, 10u);
}

TEST_F(StoreTest, RetentionFoldsOldRawRecordsAndExpiresOldRows) {
  auto s = open();
  const int64_t min = 60LL * 1000000000LL;
  std::vector<RawRecord> recs;
  // Old: 3 records in one minute (durations 10, 20, 30), 1 in the next; new: 2 records.
  for (int64_t d : {10, 20, 30})
    recs.push_back({0, 1, 7, 0, 10 * min + d, 10 * min + 2 * d, 0, 0, 0});
  recs.push_back({0, 1, 7, 0, 11 * min, 11 * min + 5, 0, 0, 0});
  for (int i = 0; i < 2; ++i)
    recs.push_back({0, 1, 7, 0, 100 * min + i, 100 * min + i + 1, 0, 0, 0});
  s->appendRaw("job", recs);
  s->putWindowSummary({"job", 0, 1, 7, 1 * min, 2 * min, 5, 50, 10, 10, "summary"});  // very old
  RetentionPolicy p;
  p.raw_window_ns = 50 * min;      // raw before minute 50 is folded
  p.summary_window_ns = 97 * min;  // windows ending before minute 3 expire
  const auto m = s->maintain(100 * min, p);
  EXPECT_EQ(m.raw_summarized, 4u);
  EXPECT_EQ(m.expired, 1u);
  EXPECT_EQ(s->rawRecords("job", 0, INT64_MAX, 100).size(), 2u);
  const auto w = s->windowSummaries("job", 0, 100);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].window_start_ns, 10 * min);
  EXPECT_EQ(w[0].count, 3u);
  EXPECT_EQ(w[0].sum_ns, 60);
  EXPECT_EQ(w[0].p50_ns, 20);  // the mean
  EXPECT_EQ(w[0].p99_ns, 30);  // the max
  EXPECT_EQ(w[0].source, "raw");
  EXPECT_EQ(w[1].count, 1u);
}

// Records packed into one chunk on both sides of the raw window: the old ones fold, the newer
// ones stay queryable, each exactly once.
TEST_F(StoreTest, RetentionSplitsAChunkThatStraddlesTheRawWindow) {
  auto s = open();
  const int64_t sec = 1000000000LL;
  const int64_t cutoff = 1000 * sec;
  std::vector<RawRecord> recs;
  for (int64_t i = -4; i < 4; ++i)  // 8 records, 1 s apart, in one chunk (span < 10 s)
    recs.push_back({2, 1, 7, cutoff + i * sec - 5, cutoff + i * sec, cutoff + i * sec + 100, 0, 0,
                    static_cast<uint64_t>(i + 10)});
  s->appendRaw("job", recs);
  RetentionPolicy p;
  p.raw_window_ns = 100 * sec;
  const auto m = s->maintain(cutoff + 100 * sec, p);
  EXPECT_EQ(m.raw_summarized, 4u);
  const auto left = s->rawRecords("job", 0, INT64_MAX, 100);
  ASSERT_EQ(left.size(), 4u);
  EXPECT_EQ(left[0].start_ns, cutoff);
  EXPECT_EQ(left[0].issue_ns, cutoff - 5);
  EXPECT_EQ(left[0].coll_seq, 10u);
  EXPECT_EQ(left[3].start_ns, cutoff + 3 * sec);
  uint64_t folded = 0;
  for (const auto& w : s->windowSummaries("job", 0, 100)) folded += w.count;
  EXPECT_EQ(folded, 4u);
  // A second pass at the same time folds nothing more.
  EXPECT_EQ(s->maintain(cutoff + 100 * sec, p).raw_summarized, 0u);
  EXPECT_EQ(s->rawRecords("job", 0, INT64_MAX, 100).size(), 4u);
}

TEST_F(StoreTest, RankStepCountsSurviveARestartAndAnOlderFileGetsTheColumns) {
  testing::rankStepCountsSurviveARestart([this] { return open(); });
  // An older file: its ranks table without the two columns.
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  const std::string path = (dir_ / "flared.db").string();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE ranks(job_id TEXT, rank INTEGER, host TEXT, pid INTEGER, "
                           "local_rank INTEGER, device_name TEXT, device_uuid TEXT, "
                           "last_seen_ns INTEGER, batches INTEGER, records INTEGER, "
                           "lost_batches INTEGER, drops BLOB, PRIMARY KEY(job_id, rank));"
                           "INSERT INTO ranks VALUES('old',2,'h',7,0,'','',5,11,22,0,x'');",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto s = open();
  auto rows = s->loadRanks();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].records, 22u);
  EXPECT_EQ(rows[0].steps, 0u);
  rows[0].steps = 9;
  rows[0].steps_sampled_out = 4;
  s->putRank(rows[0]);
  s->flush();
  s.reset();
  rows = open()->loadRanks();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].steps, 9u);
  EXPECT_EQ(rows[0].steps_sampled_out, 4u);
}

TEST_F(StoreTest, ARowPerRecordDatabaseIsConvertedOnOpen) {
  const std::string path = (dir_ / "flared.db").string();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
                           "INSERT INTO meta VALUES('schema_version', '1');"
                           "CREATE TABLE raw_records(id INTEGER PRIMARY KEY, job_id TEXT, "
                           "rank INTEGER, sig_id INTEGER, stream INTEGER, issue_ns INTEGER, "
                           "start_ns INTEGER, end_ns INTEGER, flops INTEGER, bytes INTEGER, "
                           "coll_seq INTEGER);"
                           "CREATE INDEX raw_by_job_time ON raw_records(job_id, start_ns);"
                           "INSERT INTO raw_records VALUES(1,'a',0,3,7,90,100,150,11,22,5);"
                           "INSERT INTO raw_records VALUES(2,'a',1,3,7,80,90,95,0,0,0);"
                           "INSERT INTO raw_records VALUES(3,'b',0,4,9,10,20,30,0,64,6);",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto s = open();
  const auto a = s->rawRecords("a", 0, INT64_MAX, 10);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].rank, 1);
  EXPECT_EQ(a[0].start_ns, 90);
  EXPECT_EQ(a[1].flops, 11u);
  EXPECT_EQ(a[1].bytes, 22u);
  EXPECT_EQ(a[1].issue_ns, 90);
  EXPECT_EQ(a[1].end_ns, 150);
  EXPECT_EQ(a[1].coll_seq, 5u);
  ASSERT_EQ(s->rawRecords("b", 0, INT64_MAX, 10).size(), 1u);
  s.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db,
                     "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE name='raw_records'), "
                     "(SELECT value FROM meta WHERE key='schema_version')",
                     -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 1)), "2");
  sqlite3_finalize(st);
  sqlite3_close(db);
  EXPECT_EQ(open()->rawRecords("a", 0, INT64_MAX, 10).size(), 2u);  // reopened: no second pass
}

// What a summary-mode rank's raw collectives cost in the file: 160 a step (a 32-layer TP job),
// ~1 ms apart. A row per record cost ~75 bytes; packed, a small fraction of that.
TEST_F(StoreTest, RawCollectivesCostFewBytesEachInTheFile) {
  auto s = open();
  s->flush();
  const int64_t empty = s->liveBytes();
  constexpr int kRanks = 8, kSteps = 50, kPerStep = 160;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<RawRecord> recs;  // one checkpoint a step, every rank
    for (int rank = 0; rank < kRanks; ++rank) {
      for (int i = 0; i < kPerStep; ++i) {
        const int64_t t = kNow + step * 205'000'000LL + i * 1'200'000LL + rank * 3'000;
        recs.push_back({rank, static_cast<uint32_t>(40 + i % 6), i % 3 ? 0x7f0011ULL : 0x7f0022ULL,
                        t - 30'000, t, t + 60'000 + (i % 9) * 700, 0, 16'777'216,
                        static_cast<uint64_t>(step * kPerStep + i + 1)});
      }
    }
    s->appendRaw("job-with-a-long-name-0123456789", std::move(recs));
  }
  s->flush();
  const double per_record =
      static_cast<double>(s->liveBytes() - empty) / (kRanks * kSteps * kPerStep);
  EXPECT_LT(per_record, 24.0);
  EXPECT_EQ(s->rawRecords("job-with-a-long-name-0123456789", 0, INT64_MAX, 100000).size(),
            static_cast<size_t>(kRanks * kSteps * kPerStep));
}

TEST_F(StoreTest, DeepTraceRecordsSurviveReopenAndExpireWithRawRecords) {
  testing::deepTraceRecordsSurviveReopenAndExpireWithRawRecords([this] { return open(); });
}

TEST_F(StoreTest, SizeCapEvictsOldestRawRecordsFirst) {
  auto s = open();
  for (int batch = 0; batch < 20; ++batch) {
    std::vector<RawRecord> recs;
    for (int i = 0; i < 20000; ++i) {
      const int64_t t = kNow + (batch * 20000 + i) * 1000LL;
      recs.push_back({0, 1, 7, t, t, t + 500 + i % 7, 123456789, 987654321, 55});
    }
    s->appendRaw("job", std::move(recs));
  }
  s->putJob({"job", 1, kNow, kNow});
  s->flush();
  const int64_t full = s->liveBytes();
  ASSERT_GT(full, 2 << 20);
  RetentionPolicy p;
  p.raw_window_ns = INT64_MAX / 4;
  p.max_bytes = full / 3;
  const auto m = s->maintain(kNow, p);
  EXPECT_GT(m.evicted, 0u);
  EXPECT_LE(m.live_bytes, p.max_bytes);
  const auto left = s->rawRecords("job", 0, INT64_MAX, 1000000);
  ASSERT_FALSE(left.empty());
  EXPECT_LT(left.size(), 400000u);
  // The newest record survived; the oldest went first.
  EXPECT_EQ(left.back().start_ns, kNow + (400000 - 1) * 1000LL);
  EXPECT_GT(left.front().start_ns, kNow);
  EXPECT_EQ(s->loadJobs().size(), 1u);  // state tables are never evicted
}

TEST_F(StoreTest, CheckpointsResumeEachRankExactlyOnceAfterACrash) {
  testing::checkpointsResumeEachRankExactlyOnceAfterACrash([this] { return open(); });
}

TEST_F(StoreTest, CheckpointOverTheRawCapKeepsStateAndMarksDropsRawCounted) {
  std::string err;
  SqliteStore::Options o;
  o.path = (dir_ / "flared.db").string();
  o.max_queued_raw = 5;
  auto s = SqliteStore::open(o, &err);
  ASSERT_TRUE(s) << err;
  Checkpoint cp;
  cp.jobs.push_back({"job", 1, kNow, kNow});
  std::vector<RawRecord> recs(10, RawRecord{0, 1, 7, kNow, kNow, kNow + 5, 0, 0, 0});
  cp.raw.emplace_back("job", std::move(recs));
  cp.seqs.push_back({"job", 0, 1000, kNow, 42, kNow});
  s->putCheckpoint(std::move(cp));
  s->flush();
  EXPECT_TRUE(s->rawRecords("job", 0, INT64_MAX, 100).empty());
  ASSERT_EQ(s->loadBatchSeqs().size(), 1u);
  EXPECT_EQ(s->loadBatchSeqs()[0].seq, 42u);
  EXPECT_EQ(s->loadJobs().size(), 1u);
  PromWriter w;
  s->writeMetrics(w);
  EXPECT_NE(w.text().find("flare_store_dropped_total 10"), std::string::npos) << w.text();
}

}  // namespace
}  // namespace flare::engine
