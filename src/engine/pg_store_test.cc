// PgStore against a real PostgreSQL server that the test starts (initdb + pg_ctl in a temporary
// directory, Unix socket only): the Store contract across a daemon restart (store_contract.h,
// the same assertions as SQLite's), and raw records packed into chunks. Skipped, saying why, when
// no server binary is installed (Debian: postgresql; FLARE_PG_BIN may name its bin directory).
#include "src/engine/pg_store.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "src/engine/ingest.h"
#include "src/engine/store_contract.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

namespace fs = std::filesystem;
using testing::addKernel;
using testing::gemmSig;
using testing::kNow;
using testing::makeHello;

std::string findPgBin() {
  if (const char* env = std::getenv("FLARE_PG_BIN"); env != nullptr && *env != '\0') {
    return fs::exists(fs::path(env) / "initdb") ? env : "";
  }
  std::error_code ec;
  std::string best;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    if (fs::exists(e.path() / "bin" / "initdb") && (e.path() / "bin").string() > best)
      best = (e.path() / "bin").string();
  }
  return best;
}

// One server for the suite.
class PgServer {
 public:
  // False with *why: a reason to skip (no server binary) when *skip, else a failure.
  bool start(std::string* why, bool* skip) {
    bin_ = findPgBin();
    *skip = bin_.empty();
    if (bin_.empty()) {
      *why =
          "no PostgreSQL server binary (initdb) found: install the Debian package postgresql "
          "or set FLARE_PG_BIN";
      return false;
    }
    char tmpl[] = "/tmp/flare_pg_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    // initdb refuses to run as root: run the server as the postgres user then.
    if (geteuid() == 0) {
      const passwd* pw = getpwnam("postgres");
      if (pw == nullptr) {
        *why = "running as root and there is no postgres user to run the server";
        return false;
      }
      if (chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) return false;
      as_ = "runuser -u postgres -- ";
    }
    const std::string data = dir_ + "/data";
    if (!run(as_ + bin_ + "/initdb -D " + data + " -U flare --auth=trust -E UTF8 >" + dir_ +
             "/initdb.log 2>&1")) {
      *why = "initdb failed (" + dir_ + "/initdb.log)";
      return false;
    }
    if (!run(as_ + bin_ + "/pg_ctl -D " + data + " -l " + dir_ + "/server.log -w -o \"-k " + dir_ +
             " -c listen_addresses='' -c fsync=off\" start >/dev/null 2>&1")) {
      *why = "pg_ctl start failed (" + dir_ + "/server.log)";
      return false;
    }
    started_ = true;
    return true;
  }
  void stop() {
    if (started_)
      run(as_ + bin_ + "/pg_ctl -D " + dir_ + "/data -m immediate stop >/dev/null 2>&1");
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // A fresh database for one test.
  std::string database(const std::string& name) {
    PGconn* c = PQconnectdb(conninfo("postgres").c_str());
    PGresult* r = PQexec(c, ("CREATE DATABASE " + name).c_str());  // a fresh server each run
    PQclear(r);
    PQfinish(c);
    return conninfo(name);
  }
  std::string conninfo(const std::string& db) const {
    return "host=" + dir_ + " dbname=" + db + " user=flare";
  }

 private:
  static bool run(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }
  std::string bin_, dir_, as_;
  bool started_ = false;
};

PgServer* g_server = nullptr;
std::string g_skip, g_fail;

class PgStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_server = new PgServer();
    std::string why;
    bool skip = false;
    if (!g_server->start(&why, &skip)) {
      (skip ? g_skip : g_fail) = why.empty() ? "could not start PostgreSQL" : why;
    }
  }
  static void TearDownTestSuite() {
    g_server->stop();
    delete g_server;
    g_server = nullptr;
  }
  void SetUp() override {
    if (!g_skip.empty()) GTEST_SKIP() << g_skip;
    if (!g_fail.empty()) FAIL() << g_fail;
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    conninfo_ = g_server->database("t_" + name);
  }
  std::unique_ptr<PgStore> open() {
    std::string err;
    auto s = PgStore::open({conninfo_}, &err);
    EXPECT_TRUE(s) << err;
    return s;
  }
  std::string conninfo_;
};

TEST_F(PgStoreTest, EveryTableSurvivesReopen) {
  testing::everyTableSurvivesReopen([this] { return open(); });
}

TEST_F(PgStoreTest, CheckpointsResumeEachRankExactlyOnceAfterACrash) {
  testing::checkpointsResumeEachRankExactlyOnceAfterACrash([this] { return open(); });
}

TEST_F(PgStoreTest, IngestStateRebuiltAfterRestartGivesTheSameReport) {
  testing::ingestStateRebuiltAfterRestartGivesTheSameReport([this] { return open(); });
}

TEST_F(PgStoreTest, RankStepCountsSurviveARestart) {
  testing::rankStepCountsSurviveARestart([this] { return open(); });
}

TEST_F(PgStoreTest, DeepTraceRecordsSurviveReopenAndExpireWithRawRecords) {
  testing::deepTraceRecordsSurviveReopenAndExpireWithRawRecords([this] { return open(); });
}

// Raw records packed into chunks (raw_chunks.h) in PostgreSQL: a database of the row-per-record
// schema is converted on connect, queries page through many chunks in start order, and
// retention folds the part of a chunk past the raw window and keeps the rest.
TEST_F(PgStoreTest, RawRecordsAreConvertedPagedAndFoldedInChunks) {
  const int64_t sec = 1000000000LL;
  {
    PGconn* c = PQconnectdb(conninfo_.c_str());
    ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    PGresult* r = PQexec(
        c,
        "CREATE TABLE raw_records(id BIGSERIAL PRIMARY KEY, job_id TEXT, rank BIGINT, "
        "sig_id BIGINT, stream BIGINT, issue_ns BIGINT, start_ns BIGINT, end_ns BIGINT, "
        "flops BIGINT, bytes BIGINT, coll_seq BIGINT);"
        "INSERT INTO raw_records(job_id,rank,sig_id,stream,issue_ns,start_ns,end_ns,flops,bytes,"
        "coll_seq) VALUES('old',0,3,7,90,100,150,11,22,5),('old',1,3,7,80,90,95,0,0,0)");
    ASSERT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQresultErrorMessage(r);
    PQclear(r);
    PQfinish(c);
  }
  auto s = open();
  ASSERT_TRUE(s);
  const auto old = s->rawRecords("old", 0, INT64_MAX, 10);
  ASSERT_EQ(old.size(), 2u);
  EXPECT_EQ(old[0].rank, 1);
  EXPECT_EQ(old[1].flops, 11u);
  EXPECT_EQ(old[1].coll_seq, 5u);
  // 600 records 11 s apart: one chunk each (the span is 10 s), over two query pages.
  std::vector<RawRecord> recs;
  for (int64_t i = 0; i < 600; ++i) {
    recs.push_back({2, 1, 7, kNow + i * 11 * sec - 5, kNow + i * 11 * sec,
                    kNow + i * 11 * sec + 100, 0, 0, static_cast<uint64_t>(i + 1)});
  }
  s->appendRaw("job", recs);
  s->flush();
  const auto all = s->rawRecords("job", 0, INT64_MAX, 1000);
  ASSERT_EQ(all.size(), 600u);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i].coll_seq, i + 1);
  const auto some = s->rawRecords("job", kNow + 300 * 11 * sec, INT64_MAX, 5);
  ASSERT_EQ(some.size(), 5u);
  EXPECT_EQ(some[0].coll_seq, 301u);
  // A chunk straddling the raw window (8 records 1 s apart): 4 fold, 4 stay.
  const int64_t cutoff = kNow + 10000 * sec;
  std::vector<RawRecord> straddle;
  for (int64_t i = -4; i < 4; ++i)
    straddle.push_back(
        {3, 1, 7, cutoff + i * sec, cutoff + i * sec, cutoff + i * sec + 10, 0, 0, 0});
  s->appendRaw("split", straddle);
  RetentionPolicy p;
  p.raw_window_ns = 100 * sec;
  const auto m = s->maintain(cutoff + 100 * sec, p);
  EXPECT_EQ(m.raw_summarized, 600u + 2u + 4u);
  EXPECT_TRUE(s->rawRecords("job", 0, INT64_MAX, 1000).empty());
  const auto left = s->rawRecords("split", 0, INT64_MAX, 100);
  ASSERT_EQ(left.size(), 4u);
  EXPECT_EQ(left[0].start_ns, cutoff);
  uint64_t folded = 0;
  for (const auto& w : s->windowSummaries("split", 0, 100)) folded += w.count;
  EXPECT_EQ(folded, 4u);
}

}  // namespace
}  // namespace flare::engine
