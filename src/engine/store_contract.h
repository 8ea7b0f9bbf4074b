// What every Store backend must do across a daemon restart, written once and run against each
// (sqlite_store_test.cc, pg_store_test.cc): a test there is one line that hands its backend's
// `open` to one of these. An assertion added here binds SQLite and PostgreSQL alike.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "src/common/clock.h"
#include "src/engine/ingest.h"
#include "src/engine/store.h"
#include "src/engine/test_util.h"
#include "src/records/step_stats_wire.h"

namespace flare::engine::testing {

// Opens the backend's store on the same database each call (a daemon (re)start).
using OpenStore = std::function<std::unique_ptr<Store>()>;

// A daemon after a restart: the store reopened, Ingest's state loaded from it.
struct Restarted {
  std::unique_ptr<Store> store;
  std::unique_ptr<Ingest> ingest;
};
inline Restarted restart(const OpenStore& open, const common::Clock& clock) {
  Restarted r;
  r.store = open();
  EXPECT_TRUE(r.store);
  if (!r.store) return r;
  r.ingest = std::make_unique<Ingest>(IngestConfig{}, r.store.get(), clock);
  r.ingest->loadFromStore();
  return r;
}

// Every table's rows come back after a close and reopen, bytes intact.
inline void everyTableSurvivesReopen(const OpenStore& open) {
  {
    auto s = open();
    ASSERT_TRUE(s);
    s->putJob({"job", 8, 100, 200});
    RankRow r;
    r.job_id = "job";
    r.rank = 3;
    r.host = "h";
    r.pid = 77;
    r.batches = 5;
    r.records = 9;
    v1::DropCounters d;
    d.set_ring_full(4);
    d.SerializeToString(&r.drops);
    s->putRank(r);
    s->putRank(r);  // an upsert, not a second row
    s->putSignature({"job", 1, gemmSig(1, 2, 3, 4).SerializeAsString()});
    s->putSignatureStats({"job", 1, 10, 1000, 50, 200, 1.5e9, 0, 8, std::string("h\0st", 4)});
    s->appendRaw(
        "job", {RawRecord{3, 1, 7, 10, 20, 30, 1, 2, 3}, RawRecord{3, 1, 7, 40, 50, 90, 0, 0, 4}});
    s->putWindowSummary({"job", 3, 1, 7, 1000, 2000, 10, 500, 40, 90, "summary"});
    v1::Alert a;
    a.set_job_id("job");
    a.set_kind("low_tflops");
    a.set_time_unix_ns(kNow);
    EXPECT_EQ(s->putAlert(a), 1u);
    s->putBaseline("w1/megatron/64", "0.25", kNow);
    s->flush();
  }
  auto s = open();
  ASSERT_TRUE(s);
  const auto jobs = s->loadJobs();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].world_size, 8);
  EXPECT_EQ(jobs[0].last_seen_ns, 200);
  const auto ranks = s->loadRanks();
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].pid, 77);
  EXPECT_EQ(ranks[0].batches, 5u);
  EXPECT_EQ(ranks[0].records, 9u);
  v1::DropCounters d;
  ASSERT_TRUE(d.ParseFromString(ranks[0].drops));
  EXPECT_EQ(d.ring_full(), 4u);
  const auto sigs = s->loadSignatures();
  ASSERT_EQ(sigs.size(), 1u);
  v1::Signature sig;
  ASSERT_TRUE(sig.ParseFromString(sigs[0].signature));
  EXPECT_EQ(sig.flops_per_call(), 2u * 2 * 3 * 4);
  const auto stats = s->loadSignatureStats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].count, 10u);
  EXPECT_EQ(stats[0].flops, 1.5e9);
  EXPECT_EQ(stats[0].histogram, std::string("h\0st", 4));  // bytes, NUL included
  const auto raw = s->rawRecords("job", 0, INT64_MAX, 10);
  ASSERT_EQ(raw.size(), 2u);
  EXPECT_EQ(raw[1].end_ns, 90);
  EXPECT_EQ(raw[1].coll_seq, 4u);
  ASSERT_EQ(s->windowSummaries("job", 0, 10).size(), 1u);
  const auto alerts = s->alerts("", 0, 10);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind(), "low_tflops");
  EXPECT_EQ(s->baseline("w1/megatron/64").value_or(""), "0.25");
  EXPECT_EQ(s->putAlert(v1::Alert()), 2u);  // ids keep increasing across the reopen
  // Baselines by key prefix (binary values intact), and removal.
  const std::string blob("a\0b", 3);
  s->putBaseline("healthy/j2", blob, 5);
  s->putBaseline("healthy/j1", "x", 5);
  s->flush();
  auto listed = s->baselines("healthy/");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].first, "healthy/j1");
  EXPECT_EQ(listed[1].second, blob);
  s->removeBaseline("healthy/j1");
  s->flush();
  listed = s->baselines("healthy/");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].first, "healthy/j2");
  EXPECT_EQ(s->baselines("w1/").size(), 1u);
}

// Ingest's state rebuilt from the store answers the same report, and a rank that reconnects
// after the restart adds to the same signature.
inline void ingestStateRebuiltAfterRestartGivesTheSameReport(const OpenStore& open) {
  common::FakeClock clock(kNow);
  v1::GetReportResponse before;
  v1::GetReportRequest req;
  req.set_job_id("job");
  {
    auto s = open();
    ASSERT_TRUE(s);
    Ingest ingest({}, s.get(), clock);
    for (int rank = 0; rank < 2; ++rank) {
      auto out = ingest.hello(makeHello("job", rank, 2), nullptr);
      v1::RecordBatch b;
      b.set_rank(rank);
      b.set_batch_seq(1);
      *b.add_signatures() = gemmSig(1 + rank, 256, 256, 256);
      for (int i = 0; i < 10; ++i) addKernel(&b, 1 + rank, kNow + i * 1000, 100 + 10 * i + rank);
      ASSERT_TRUE(ingest.batch(out.session_id, b).ok());
    }
    ASSERT_EQ(ingest.report(req, &before), Code::kOk);
    ingest.persist();
    s->flush();
  }
  auto [s, restarted] = restart(open, clock);
  ASSERT_TRUE(restarted);
  Ingest& ingest = *restarted;
  v1::GetReportResponse after;
  ASSERT_EQ(ingest.report(req, &after), Code::kOk);
  EXPECT_EQ(before.SerializeAsString(), after.SerializeAsString());
  ASSERT_EQ(after.signatures_size(), 1);
  EXPECT_EQ(after.signatures(0).count(), 20u);
  EXPECT_EQ(s->rawRecords("job", 0, INT64_MAX, 100).size(), 20u);
  auto out = ingest.hello(makeHello("job", 0, 2), nullptr);
  v1::RecordBatch b;
  b.set_rank(0);
  *b.add_signatures() = gemmSig(1, 256, 256, 256);
  addKernel(&b, 1, kNow, 100);
  ASSERT_TRUE(ingest.batch(out.session_id, b).ok());
  v1::GetReportResponse more;
  ingest.report(req, &more);
  ASSERT_EQ(more.signatures_size(), 1);
  EXPECT_EQ(more.signatures(0).count(), 21u);
  v1::ListRanksRequest lr;
  lr.set_job_id("job");
  v1::ListRanksResponse ranks;
  ingest.ranks(lr, &ranks);
  ASSERT_EQ(ranks.ranks_size(), 2);
  EXPECT_EQ(ranks.ranks(1).records(), 10u);
}

// A summary-mode rank's step counts (`flare status`) survive a restart; a refused StepStats is
// not counted.
inline void rankStepCountsSurviveARestart(const OpenStore& open) {
  common::FakeClock clock(kNow);
  v1::ListRanksRequest lr;
  lr.set_job_id("job");
  {
    auto s = open();
    ASSERT_TRUE(s);
    Ingest ingest({}, s.get(), clock);
    auto out = ingest.hello(makeHello("job", 0, 1), nullptr);
    v1::RecordBatch b;
    b.set_rank(0);
    b.set_batch_seq(1);
    for (int i = 0; i < 4; ++i) {
      records::StepResult step;  // as a rank sends it (an empty issue-latency sketch)
      step.stats.start_ns = kNow + i * 1'000'000;
      step.stats.end_ns = kNow + (i + 1) * 1'000'000;
      step.stats.sampled_out = i == 1 || i == 2;
      v1::StepStats* st = b.add_step_stats();
      records::encodeStepStats(
          step, [](int64_t t) { return t; }, st);
      if (i == 3) st->set_inter_ns(41'000'000);  // T_inter 41x its step: refused
    }
    const Verdict v = ingest.batch(out.session_id, b);
    ASSERT_TRUE(v.ok()) << v.error;
    EXPECT_EQ(v.items_dropped, 1u);
    v1::ListRanksResponse ranks;
    ingest.ranks(lr, &ranks);
    ASSERT_EQ(ranks.ranks_size(), 1);
    EXPECT_EQ(ranks.ranks(0).steps(), 3u);
    EXPECT_EQ(ranks.ranks(0).steps_sampled_out(), 2u);
    ingest.persist();
    s->flush();
  }
  auto [s, ingest] = restart(open, clock);
  ASSERT_TRUE(ingest);
  v1::ListRanksResponse ranks;
  ingest->ranks(lr, &ranks);
  ASSERT_EQ(ranks.ranks_size(), 1);
  EXPECT_EQ(ranks.ranks(0).steps(), 3u);
  EXPECT_EQ(ranks.ranks(0).steps_sampled_out(), 2u);
}

// Deep-trace (CUPTI) records come back by rank and time after a restart, within the query's
// limit, and expire with the raw records.
inline void deepTraceRecordsSurviveReopenAndExpireWithRawRecords(const OpenStore& open) {
  const int64_t min = 60LL * 1000000000LL;
  auto rec = [](const std::string& name, int64_t start, v1::DeepTraceRecord::Kind kind) {
    v1::DeepTraceRecord r;
    r.set_kind(kind);
    r.set_name(name);
    r.set_start_ns(start);
    r.set_end_ns(start + 1000);
    r.set_bytes(kind == v1::DeepTraceRecord::KIND_MEMCPY ? 4096 : 0);
    r.set_capture_id(7);
    return r;
  };
  {
    auto s = open();
    ASSERT_TRUE(s);
    s->appendDeepTrace("job", {{2, rec("old", 10 * min, v1::DeepTraceRecord::KIND_KERNEL)},
                               {2, rec("gemm", 100 * min + 2, v1::DeepTraceRecord::KIND_KERNEL)},
                               {5, rec("copy", 100 * min + 1, v1::DeepTraceRecord::KIND_MEMCPY)}});
    s->appendDeepTrace("other", {{2, rec("x", 100 * min, v1::DeepTraceRecord::KIND_MEMSET)}});
    s->flush();
  }
  auto s = open();  // a daemon restart
  ASSERT_TRUE(s);
  const auto all = s->deepTrace("job", -1, 100);
  ASSERT_EQ(all.size(), 3u);  // by rank, then time
  EXPECT_EQ(all[0].rank, 2);
  EXPECT_EQ(all[0].record.name(), "old");
  EXPECT_EQ(all[2].rank, 5);
  EXPECT_EQ(all[2].record.bytes(), 4096u);
  EXPECT_EQ(all[2].record.capture_id(), 7u);
  EXPECT_EQ(s->deepTrace("job", 5, 100).size(), 1u);
  EXPECT_EQ(s->deepTrace("job", -1, 1).size(), 1u);  // the limit
  RetentionPolicy p;
  p.raw_window_ns = 50 * min;
  s->maintain(100 * min, p);
  s->flush();
  const auto kept = s->deepTrace("job", -1, 100);
  ASSERT_EQ(kept.size(), 2u);  // the record older than the raw window is gone
  EXPECT_EQ(kept[0].record.name(), "gemm");
  EXPECT_EQ(s->deepTrace("other", -1, 100).size(), 1u);
}

// A daemon killed after a checkpoint (persist) but before the next one: the batches it applied
// in between are gone with it. After the restart the rank is told to resume after the last
// checkpointed batch; what it re-sends (all of it, here, to test the daemon's own check) is
// applied exactly once: raw records, counters, aggregates, deep-trace records and the open
// summary window.
inline void checkpointsResumeEachRankExactlyOnceAfterACrash(const OpenStore& open) {
  const int64_t min = 60LL * 1000000000LL;
  const int64_t t0 = kNow / min * min;
  common::FakeClock clock(t0 + 1000);
  auto batch = [&](uint64_t seq, bool spool) {
    v1::RecordBatch b;
    b.set_rank(0);
    b.set_batch_seq(seq);
    b.set_from_spool(spool);
    *b.add_signatures() = gemmSig(1, 256, 256, 256);  // a stream's first batch carries it
    for (int i = 0; i < 4; ++i) {
      addKernel(&b, 1, t0 + static_cast<int64_t>(seq) * 100000 + i * 1000, 500);
    }
    v1::KernelSummary* sm = b.add_summaries();
    sm->set_signature_id(1);
    sm->set_stream_id(3);
    sm->set_window_start_ns(t0 + static_cast<int64_t>(seq) * 1000000);
    sm->set_window_end_ns(t0 + static_cast<int64_t>(seq) * 1000000 + 1000);
    auto* c = sm->add_clusters();
    c->set_count(10);
    c->set_p50_ns(1000);
    c->set_p99_ns(2000);
    c->set_sum_ns(10000);
    // One CUPTI record of a deep trace per batch: stored with the checkpoint, so once.
    v1::DeepTraceRecord* d = b.add_deep_trace();
    d->set_kind(v1::DeepTraceRecord::KIND_KERNEL);
    d->set_name("k" + std::to_string(seq));
    d->set_start_ns(t0 + static_cast<int64_t>(seq) * 100000);
    d->set_end_ns(t0 + static_cast<int64_t>(seq) * 100000 + 100);
    return b;
  };
  {
    auto s = open();
    ASSERT_TRUE(s);
    Ingest ingest({}, s.get(), clock);
    auto out = ingest.hello(makeHello("job", 0, 1), nullptr);
    EXPECT_EQ(out.ack.resume_after_seq(), 0u);
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      ASSERT_TRUE(ingest.batch(out.session_id, batch(seq, false)).ok());
    }
    ingest.persist();
    for (uint64_t seq = 4; seq <= 5; ++seq) {
      ASSERT_TRUE(ingest.batch(out.session_id, batch(seq, false)).ok());
    }
    // kill -9 here: batches 4 and 5 never reach a checkpoint.
  }
  auto s = open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rawRecords("job", 0, INT64_MAX, 100).size(), 12u);
  EXPECT_EQ(s->deepTrace("job", -1, 100).size(), 3u);  // the checkpointed batches' only
  Ingest ingest({}, s.get(), clock);
  ingest.loadFromStore();
  auto out = ingest.hello(makeHello("job", 0, 1), nullptr);
  EXPECT_EQ(out.ack.resume_after_seq(), 3u);
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    const Verdict v = ingest.batch(out.session_id, batch(seq, true));
    if (seq <= 3) {
      EXPECT_EQ(v.reason, Reason::kDuplicateBatch) << seq;
    } else {
      EXPECT_TRUE(v.ok()) << seq << " " << v.error;
    }
  }
  EXPECT_EQ(ingest.counters().rejected[static_cast<size_t>(Reason::kDuplicateBatch)].load(), 3u);
  ingest.persist(/*final=*/true);
  s->flush();
  // Every record once: 5 batches of 4 kernels, 5 summaries of 10, 5 deep-trace records.
  EXPECT_EQ(s->rawRecords("job", 0, INT64_MAX, 100).size(), 20u);
  const auto deep = s->deepTrace("job", -1, 100);
  ASSERT_EQ(deep.size(), 5u);
  for (size_t i = 0; i < deep.size(); ++i) {
    EXPECT_EQ(deep[i].record.name(), "k" + std::to_string(i + 1));
  }
  EXPECT_EQ(s->deepTrace("job", 0, 2).size(), 2u);
  EXPECT_TRUE(s->deepTrace("job", 3, 100).empty());
  v1::ListRanksRequest lr;
  lr.set_job_id("job");
  v1::ListRanksResponse ranks;
  ingest.ranks(lr, &ranks);
  ASSERT_EQ(ranks.ranks_size(), 1);
  EXPECT_EQ(ranks.ranks(0).records(), 20u + 50u);
  EXPECT_EQ(ranks.ranks(0).batches(), 5u);
  EXPECT_EQ(ranks.ranks(0).lost_batches(), 0u);
  const auto rank_rows = s->loadRanks();
  ASSERT_EQ(rank_rows.size(), 1u);
  EXPECT_EQ(rank_rows[0].records, 70u);
  EXPECT_EQ(rank_rows[0].batches, 5u);
  v1::GetReportRequest req;
  req.set_job_id("job");
  v1::GetReportResponse report;
  ASSERT_EQ(ingest.report(req, &report), Code::kOk);
  ASSERT_EQ(report.signatures_size(), 1);
  EXPECT_EQ(report.signatures(0).count(), 70u);
  // The minute's summary window was open at the crash: it came back and closed whole.
  const auto rows = s->windowSummaries("job", 0, 10);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].window_start_ns, t0);
  EXPECT_EQ(rows[0].count, 50u);
  EXPECT_EQ(rows[0].sum_ns, 50000);
  EXPECT_EQ(rows[0].p99_ns, 2000);
  const auto marks = s->loadBatchSeqs();
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0].seq, 5u);
  // A reconnect now resumes after 5 (the final checkpoint holds it).
  auto again = restart(open, clock);
  ASSERT_TRUE(again.ingest);
  EXPECT_EQ(again.ingest->hello(makeHello("job", 0, 1), nullptr).ack.resume_after_seq(), 5u);
}

}  // namespace flare::engine::testing
