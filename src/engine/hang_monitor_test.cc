// HangMonitor over a real Ingest with in-process rank channels: silence opens one incident per
// episode, answers become evidence, silence and closed streams are evidence too. A FakeClock
// drives the silence; a responder thread plays the ranks' exporters.
#include "src/engine/hang_monitor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/engine/sqlite_store.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

using testing::addKernel;
using testing::gemmSig;
using testing::kNow;
using testing::makeHello;

constexpr int64_t kSec = 1'000'000'000;

class QueueChannel : public CommandChannel {
 public:
  bool send(const v1::DaemonMessage& m) override {
    std::lock_guard lock(mu);
    if (m.has_command()) commands.push_back(m.command());
    return true;
  }
  void close(Code, const std::string&) override {}
  std::mutex mu;
  std::deque<v1::Command> commands;
};

struct FakeRank {
  int rank = 0;
  uint64_t session = 0;
  uint64_t seq = 0;
  std::shared_ptr<QueueChannel> channel = std::make_shared<QueueChannel>();
  std::atomic<bool> answers{true};
  uint64_t issued = 5;  // per communicator "dp": issued, completed 4
};

class HangMonitorTest : public ::testing::Test {
 protected:
  HangMonitorTest() : clock_(kNow), ingest_(IngestConfig{}, nullptr, clock_) {}
  void SetUp() override { start(true, {}); }
  // `kill`: HangMonitorOptions::kill_after_diagnosis; `opt_in`: ranks whose hello sets
  // hang_kill (FLARE_HANG_KILL=1).
  void start(bool kill, std::set<int> opt_in, Store* store = nullptr) {
    HangMonitorOptions o;
    o.hang_timeout_ns = 2 * kSec;
    o.answer_timeout_ns = 300'000'000;
    o.answer_poll_ns = 2'000'000;
    o.kill_after_diagnosis = kill;
    monitor_ = std::make_unique<HangMonitor>(ingest_, store, clock_, o);
    for (int r = 0; r < 4; ++r) {
      ranks_.push_back(std::make_unique<FakeRank>());
      FakeRank& f = *ranks_.back();
      f.rank = r;
      v1::RankHello hello = makeHello("job", r, 4);
      hello.set_hang_kill(opt_in.contains(r));
      auto out = ingest_.hello(hello, f.channel);
      EXPECT_TRUE(out.ack.accepted());
      f.session = out.session_id;
    }
    responder_ = std::thread([this] {
      while (!stop_) {
        for (auto& f : ranks_) answer(*f);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~HangMonitorTest() override {
    stop_ = true;
    if (responder_.joinable()) responder_.join();
  }
  // Exit commands a rank received (they stay queued: the responder leaves them for the test).
  int exitsTo(FakeRank& f) {
    std::lock_guard lock(f.channel->mu);
    int n = 0;
    for (const v1::Command& c : f.channel->commands) n += c.has_exit();
    return n;
  }

  void answer(FakeRank& f) {
    std::deque<v1::Command> cmds;
    {
      std::lock_guard lock(f.channel->mu);
      if (!f.answers) return;
      cmds.swap(f.channel->commands);
    }
    for (const v1::Command& c : cmds) {
      if (c.has_exit()) {  // kept for exitsTo(); a real rank would answer and exit
        std::lock_guard lock(f.channel->mu);
        f.channel->commands.push_back(c);
        continue;
      }
      v1::CommandResult res;
      res.set_command_id(c.id());
      res.set_ok(true);
      if (c.has_dump_stacks()) {
        v1::ThreadStack* t = res.mutable_stacks()->add_threads();
        t->set_main_thread(true);
        t->add_python_frames()->set_function("train_step");
        v1::CollectiveProgress* p = res.mutable_stacks()->add_collectives();
        p->set_communicator("dp");
        p->set_last_issued_seq(f.issued);
        p->set_last_completed_seq(4);
        p->set_last_issued_op("ncclAllReduce");
      }
      ingest_.commandResult(f.session, res);
    }
  }

  void progress(FakeRank& f) {
    v1::RecordBatch b;
    b.set_rank(f.rank);
    b.set_batch_seq(++f.seq);
    if (f.seq == 1) *b.add_signatures() = gemmSig(1, 64, 64, 64);
    addKernel(&b, 1, clock_.nowNs() - 1000000, 1000);
    ASSERT_TRUE(ingest_.batch(f.session, b).ok());
  }
  void advance(int64_t ns) { clock_.setNs(clock_.nowNs() + ns); }

  common::FakeClock clock_;
  Ingest ingest_;
  std::unique_ptr<HangMonitor> monitor_;
  std::vector<std::unique_ptr<FakeRank>> ranks_;
  std::atomic<bool> stop_{false};
  std::thread responder_;
};

TEST_F(HangMonitorTest, SilenceOpensOneIncidentPerEpisodeAndNamesTheRankThatNeverIssued) {
  ranks_[2]->issued = 4;  // rank 2 never issued collective #5
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(1 * kSec);
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(kSec + kSec / 2);  // 1.5 s of silence: below the timeout
  EXPECT_TRUE(monitor_->check().empty());
  advance(kSec);  // 2.5 s
  auto inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].diagnosis.kind, hang::HangKind::kNonCommunication)
      << hang::formatDiagnosis(inc[0].diagnosis);
  ASSERT_EQ(inc[0].diagnosis.suspects.size(), 1u);
  EXPECT_EQ(inc[0].diagnosis.suspects[0].rank, 2);
  EXPECT_EQ(inc[0].diagnosis.suspects[0].host, "host0");
  EXPECT_EQ(inc[0].answered, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(inc[0].onset_ns, kNow + kSec);
  // Still hung: the same episode, no second incident.
  advance(5 * kSec);
  EXPECT_TRUE(monitor_->check().empty());
  EXPECT_EQ(monitor_->incidents("job").size(), 1u);
  const std::string json = monitor_->incidentsJson("job");
  EXPECT_NE(json.find("\"suspects\":[{\"rank\":2,"), std::string::npos) << json;

  // Progress ends the episode; the next stall opens a second incident. This time rank 3 does
  // not answer (stopped) and rank 1's stream is gone (crashed): both named, nobody else.
  progress(*ranks_[0]);
  EXPECT_TRUE(monitor_->check().empty());
  ranks_[3]->answers = false;
  ingest_.close(ranks_[1]->session);
  advance(3 * kSec);
  inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].diagnosis.kind, hang::HangKind::kUnresponsiveRank);
  EXPECT_EQ(inc[0].no_answer, std::vector<int>{3});
  EXPECT_EQ(inc[0].crashed, std::vector<int>{1});
  EXPECT_EQ(inc[0].answered, (std::vector<int>{0, 2}));
  std::vector<int> suspects;
  for (const auto& s : inc[0].diagnosis.suspects) suspects.push_back(s.rank);
  EXPECT_EQ(suspects, (std::vector<int>{1, 3}));
  EXPECT_EQ(monitor_->incidents("job").size(), 2u);
  PromWriter w;
  monitor_->writeMetrics(w);
  EXPECT_NE(w.text().find("flare_hang_incidents_total 2"), std::string::npos) << w.text();
  EXPECT_NE(w.text().find("flare_hang_unanswered_ranks_total 1"), std::string::npos);
}

TEST_F(HangMonitorTest, JobWhoseRanksAllLeftIsNeverDiagnosed) {
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  for (auto& f : ranks_) ingest_.close(f->session);
  advance(10 * kSec);
  EXPECT_TRUE(monitor_->check().empty());
  EXPECT_TRUE(monitor_->incidents("job").empty());
}

v1::HangReport stuckReport(const std::string& op, uint64_t seq, int64_t age_ns) {
  v1::HangReport r;
  r.set_episode(1);
  v1::StuckOp* f = r.mutable_first();
  f->set_name(op);
  f->set_kind("collective");
  f->set_communicator("dp");
  f->set_seq(seq);
  f->set_age_ns(age_ns);
  f->set_threshold_ns(kSec);
  *r.add_stuck() = *f;
  return r;
}

TEST_F(HangMonitorTest, WatchdogReportOpensTheIncidentAtOnceAndLaterReportsJoinIt) {
  ranks_[2]->issued = 4;  // rank 2 never issued collective #5
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(kSec / 2);  // 0.5 s: far below the 2 s silence timeout
  // Bad reports are refused without closing the stream and open nothing.
  v1::HangReport bad = stuckReport("", 5, kSec);
  Verdict v = ingest_.hangReport(ranks_[1]->session, bad);
  EXPECT_FALSE(v.ok());
  EXPECT_FALSE(v.close_stream);
  bad = stuckReport("ncclAllReduce", 5, -1);
  EXPECT_FALSE(ingest_.hangReport(ranks_[1]->session, bad).ok());
  EXPECT_TRUE(monitor_->check().empty());

  ASSERT_TRUE(
      ingest_.hangReport(ranks_[1]->session, stuckReport("ncclAllReduce", 5, 1200'000'000)).ok());
  auto inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].triggered_by, "watchdog");
  EXPECT_NE(inc[0].trigger.find("rank 1's ncclAllReduce on communicator dp seq 5"),
            std::string::npos)
      << inc[0].trigger;
  // The onset is when the stuck op became its stream's head: received - age.
  EXPECT_EQ(inc[0].onset_ns, kNow + kSec / 2 - 1200'000'000);
  ASSERT_EQ(inc[0].watchdog.size(), 1u);
  EXPECT_EQ(inc[0].watchdog[0].rank, 1);
  ASSERT_EQ(inc[0].diagnosis.suspects.size(), 1u);
  EXPECT_EQ(inc[0].diagnosis.suspects[0].rank, 2);

  // Another rank's report and then the silence: the same episode, the report joins it.
  ASSERT_TRUE(
      ingest_.hangReport(ranks_[3]->session, stuckReport("ncclAllReduce", 5, 1500'000'000)).ok());
  EXPECT_TRUE(monitor_->check().empty());
  advance(5 * kSec);
  EXPECT_TRUE(monitor_->check().empty());
  const auto all = monitor_->incidents("job");
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(all[0].watchdog.size(), 2u);
  EXPECT_EQ(all[0].watchdog[1].rank, 3);
  const std::string json = monitor_->incidentsJson("job");
  EXPECT_NE(json.find("\"triggeredBy\":\"watchdog\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"first\":{\"op\":\"ncclAllReduce\",\"kind\":\"collective\","
                      "\"communicator\":\"dp\",\"seq\":5,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"progress\":[{\"communicator\":\"dp\""), std::string::npos) << json;
  PromWriter w;
  ingest_.writeMetrics(w);
  EXPECT_NE(w.text().find("flare_hang_reports_total 2"), std::string::npos);
}

class HangKillTest : public HangMonitorTest {
 protected:
  void SetUp() override {}
};

TEST_F(HangKillTest, ExitGoesOnlyToOptedInRanksAfterTheDiagnosisIsStored) {
  // Ranks 0, 1 and 3 opted in (FLARE_HANG_KILL=1), rank 2 (the culprit) did not; rank 3 does
  // not answer (stopped): it is still sent the Exit, and blocks nobody.
  start(true, {0, 1, 3});
  ranks_[1]->issued = 4;  // rank 1 never issued collective #5
  ranks_[3]->answers = false;
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(3 * kSec);
  auto inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_NE(inc[0].diagnosis.kind, hang::HangKind::kInconclusive);
  EXPECT_EQ(inc[0].exit_sent, 3);
  EXPECT_EQ(exitsTo(*ranks_[0]), 1);
  EXPECT_EQ(exitsTo(*ranks_[1]), 1);
  EXPECT_EQ(exitsTo(*ranks_[2]), 0);  // did not opt in: never sent
  EXPECT_EQ(exitsTo(*ranks_[3]), 1);
  // Stored with it (the incident list, the JSON, the metric).
  ASSERT_EQ(monitor_->incidents("job").size(), 1u);
  EXPECT_EQ(monitor_->incidents("job")[0].exit_sent, 3);
  EXPECT_NE(monitor_->incidentsJson("job").find("\"exitSent\":3"), std::string::npos);
  PromWriter w;
  monitor_->writeMetrics(w);
  EXPECT_NE(w.text().find("flare_hang_exits_sent_total 3"), std::string::npos) << w.text();
}

TEST_F(HangKillTest, AnIncidentIsPublishedWithItsAlertCommitted) {
  // With a store: once the incident is visible (incidents(), check()), its alert is committed
  // too, so that a client reading both never sees one without the other.
  const auto dir =
      std::filesystem::temp_directory_path() / ("flare_hang_store_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  SqliteStore::Options so;
  so.path = (dir / "flared.db").string();
  std::string err;
  auto store = SqliteStore::open(so, &err);
  ASSERT_TRUE(store) << err;
  start(false, {}, store.get());
  ranks_[1]->issued = 4;
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(3 * kSec);
  const auto inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  const auto alerts = store->alerts("job", 0, 10);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind(), "hang");
  EXPECT_EQ(alerts[0].id(), inc[0].alert_id);
  stop_ = true;
  if (responder_.joinable()) responder_.join();
  monitor_.reset();
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST_F(HangKillTest, NoExitWhenTheDaemonSwitchIsOffOrNoRankOptedIn) {
  start(false, {0, 1, 2, 3});  // flared --hang-kill 0
  ranks_[2]->issued = 4;
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(3 * kSec);
  auto inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].exit_sent, 0);
  for (auto& f : ranks_) EXPECT_EQ(exitsTo(*f), 0);
}

TEST_F(HangKillTest, NoExitWithoutOptIn) {
  start(true, {});
  ranks_[2]->issued = 4;
  for (auto& f : ranks_) progress(*f);
  EXPECT_TRUE(monitor_->check().empty());
  advance(3 * kSec);
  auto inc = monitor_->check();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].diagnosis.kind, hang::HangKind::kNonCommunication);
  EXPECT_EQ(inc[0].exit_sent, 0);
  for (auto& f : ranks_) EXPECT_EQ(exitsTo(*f), 0);
}

}  // namespace
}  // namespace flare::engine
