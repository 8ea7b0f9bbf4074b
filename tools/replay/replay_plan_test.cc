#include "tools/replay/replay_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tools/replay/fixture_reader.h"
#include "tools/replay/summary_replay.h"

namespace flare::replay {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kT0 = 1'800'000'000'000'000'000;  // epoch ns
constexpr uint64_t kTp = 0xaaaa, kDp = 0xbbbb;

// One recorded rank of a TP=2 x DP=4 job: 4 steps of 10 ms (markers), each a GEMM of 4 ms on
// stream 1, then a TP all-reduce (1 ms) and a DP all-reduce (2 ms) on stream 2.
std::vector<v1::RecordBatch> fixture() {
  std::vector<v1::RecordBatch> out;
  v1::RecordBatch b;
  b.set_batch_seq(1);
  auto* g = b.add_signatures();
  g->set_id(1);
  g->set_name("gemm");
  g->set_kind(v1::OP_KIND_GEMM);
  g->set_dtype(v1::DTYPE_BF16);
  auto* c = b.add_signatures();
  c->set_id(2);
  c->set_name("ncclAllReduce");
  c->set_kind(v1::OP_KIND_COLLECTIVE);
  c->set_collective(v1::COLLECTIVE_KIND_ALL_REDUCE);
  c->add_shape(1024);
  for (int s = 0; s < 4; ++s) {
    const int64_t t = kT0 + s * 10 * kMs;
    auto* m = b.add_steps();
    m->set_step(static_cast<uint64_t>(s));
    m->set_start_ns(t);
    m->set_end_ns(t + 10 * kMs);
    auto add = [&](uint32_t sig, int64_t start, int64_t dur, uint64_t comm, uint64_t seq, int n) {
      auto* k = b.add_kernels();
      k->set_signature_id(sig);
      k->set_stream_id(comm ? 2 : 1);
      k->set_issue_ns(start - kMs / 2);
      k->set_start_ns(start);
      k->set_end_ns(start + dur);
      k->set_issue_latency_ns(kMs / 2);
      if (comm) {
        k->mutable_collective()->set_comm_hash(comm);
        k->mutable_collective()->set_seq(seq);
        k->mutable_collective()->set_nranks(n);
      }
    };
    add(1, t + 1 * kMs, 4 * kMs, 0, 0, 0);
    add(2, t + 5 * kMs, 1 * kMs, kTp, static_cast<uint64_t>(s), 2);
    add(2, t + 6 * kMs, 2 * kMs, kDp, static_cast<uint64_t>(s), 4);
  }
  b.set_created_ns(kT0 + 40 * kMs);
  out.push_back(b);
  return out;
}

Plan plan(int ranks, Perturbation p = {}) {
  Plan out;
  std::string error;
  EXPECT_TRUE(makePlan(fixture(), {ranks, p}, &out, &error)) << error;
  return out;
}

const v1::KernelRecord& kernel(const Plan& p, int rank, int i) {
  return p.ranks[rank].batches.at(0).kernels(i);
}

TEST(ReplayPlan, HealthyRanksAreCopiesWithTheirOwnCommunicators) {
  const Plan p = plan(8);
  ASSERT_EQ(p.ranks.size(), 8u);
  EXPECT_EQ(p.steps, 3u);
  const auto rec = fixture()[0];
  std::map<uint64_t, std::set<int>> members;
  for (int r = 0; r < 8; ++r) {
    const auto& b = p.ranks[r].batches.at(0);
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.batch_seq(), 1u);
    ASSERT_EQ(b.kernels_size(), rec.kernels_size());
    for (int i = 0; i < b.kernels_size(); ++i) {
      EXPECT_EQ(b.kernels(i).start_ns(), rec.kernels(i).start_ns());
      EXPECT_EQ(b.kernels(i).end_ns(), rec.kernels(i).end_ns());
      if (b.kernels(i).has_collective()) {
        members[b.kernels(i).collective().comm_hash()].insert(r);
        EXPECT_EQ(b.kernels(i).collective().nranks(), rec.kernels(i).collective().nranks());
      }
    }
  }
  // TP pairs {0,1},{2,3},...; DP groups {0,2,4,6},{1,3,5,7}.
  std::set<std::set<int>> groups;
  for (const auto& [hash, ranks] : members) groups.insert(ranks);
  EXPECT_EQ(groups,
            (std::set<std::set<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(ReplayPlan, SlowGpuStretchesItsKernelsAndTheOthersWaitAtCollectives) {
  Perturbation slow;
  slow.slow_gpu_rank = 3;
  slow.gpu_factor = 1.5;
  const Plan p = plan(8, slow);
  // Rank 3's GEMMs take 6 ms; rank 2's take 4 ms.
  EXPECT_EQ(kernel(p, 3, 0).end_ns() - kernel(p, 3, 0).start_ns(), 6 * kMs);
  EXPECT_EQ(kernel(p, 2, 0).end_ns() - kernel(p, 2, 0).start_ns(), 4 * kMs);
  // Its TP partner (rank 2) starts the all-reduce on time and waits 2 ms for rank 3.
  EXPECT_EQ(kernel(p, 2, 1).start_ns(), kernel(p, 3, 1).start_ns() - 2 * kMs);
  EXPECT_EQ(kernel(p, 2, 1).end_ns(), kernel(p, 3, 1).end_ns());
  // A rank in no communicator with rank 3 during step 0's TP all-reduce is unaffected there.
  EXPECT_EQ(kernel(p, 0, 1).end_ns(), fixture()[0].kernels(1).end_ns());
}

TEST(ReplayPlan, SlowLinkStretchesTheCollectivesOfItsCommunicatorsOnly) {
  Perturbation slow;
  slow.slow_link_rank = 5;
  slow.link_factor = 2;
  const Plan p = plan(8, slow);
  auto dur = [&](int r, int i) { return kernel(p, r, i).end_ns() - kernel(p, r, i).start_ns(); };
  EXPECT_EQ(dur(4, 1), 2 * kMs);  // TP {4,5}
  EXPECT_EQ(dur(2, 1), 1 * kMs);  // TP {2,3}
  // The DP all-reduces, from the last arrival (rank 4 and 5 come 1 ms late from the TP one):
  // stretched in {1,3,5,7}, not in {0,2,4,6}.
  auto fromLast = [&](std::vector<int> group) {
    int64_t last = 0, end = 0;
    for (int r : group) {
      last = std::max(last, kernel(p, r, 2).start_ns());
      end = std::max(end, kernel(p, r, 2).end_ns());
    }
    return end - last;
  };
  EXPECT_EQ(fromLast({1, 3, 5, 7}), 4 * kMs);
  EXPECT_EQ(fromLast({0, 2, 4, 6}), 2 * kMs);
  EXPECT_EQ(dur(0, 2), 3 * kMs);  // rank 0 waits 1 ms for rank 4
}

TEST(ReplayPlan, StallDelaysTheWorkTheHostIssuesAfterItAndOnlyThePeersGpus) {
  Perturbation stall;
  stall.stall_rank = 6;
  stall.stall_ns = 3 * kMs;
  const Plan p = plan(8, stall);
  const auto fixtures = fixture();
  const auto& rec = fixtures[0];
  // Step 0 issues its three ops at 0.5, 4.5 and 5.5 ms: the host stalls before the middle one.
  // The GEMM is on time; both all-reduces are issued and start 3 ms late.
  EXPECT_EQ(kernel(p, 6, 0).start_ns(), rec.kernels(0).start_ns());
  EXPECT_EQ(kernel(p, 6, 1).issue_ns(), rec.kernels(1).issue_ns() + 3 * kMs);
  EXPECT_EQ(kernel(p, 6, 1).start_ns(), rec.kernels(1).start_ns() + 3 * kMs);
  EXPECT_EQ(kernel(p, 6, 2).start_ns(), rec.kernels(2).start_ns() + 3 * kMs);
  // Its TP peer (rank 7) issues on time and its GPU waits in the all-reduce: a longer issue
  // latency after it, not a later issue.
  EXPECT_EQ(kernel(p, 7, 1).issue_ns(), rec.kernels(1).issue_ns());
  EXPECT_EQ(kernel(p, 7, 1).start_ns(), rec.kernels(1).start_ns());
  EXPECT_EQ(kernel(p, 7, 1).end_ns(), rec.kernels(1).end_ns() + 3 * kMs);
  EXPECT_EQ(kernel(p, 7, 2).issue_ns(), rec.kernels(2).issue_ns());
  EXPECT_EQ(kernel(p, 7, 2).start_ns(), rec.kernels(2).start_ns() + 3 * kMs);
  EXPECT_EQ(kernel(p, 0, 0).start_ns(), rec.kernels(0).start_ns());
}

TEST(ReplayPlan, AStallLongerThanTheQueueDrainsItAndTheLatencyCollapses) {
  // One rank, one stream: kernels of 1 ms issued 0.1 ms apart at step start, so the last ones
  // waited ~0.9 ms each in the queue; a 5 ms stall after the middle one.
  std::vector<v1::RecordBatch> in(1);
  v1::RecordBatch& b = in[0];
  auto* sig = b.add_signatures();
  sig->set_id(1);
  sig->set_name("k");
  sig->set_kind(v1::OP_KIND_KERNEL);
  for (int s = 0; s < 2; ++s) {
    const int64_t t = kT0 + s * 20 * kMs;
    b.add_steps()->set_start_ns(t);
    for (int i = 0; i < 5; ++i) {
      auto* k = b.add_kernels();
      k->set_signature_id(1);
      k->set_issue_ns(t + i * kMs / 10);
      k->set_start_ns(t + kMs / 100 + i * kMs);  // queued behind the previous one
      k->set_end_ns(t + kMs / 100 + (i + 1) * kMs);
      k->set_issue_latency_ns(k->start_ns() - k->issue_ns());
    }
  }
  b.add_steps()->set_start_ns(kT0 + 40 * kMs);
  Perturbation stall;
  stall.stall_rank = 0;
  stall.stall_ns = 5 * kMs;
  Plan p;
  std::string error;
  ASSERT_TRUE(makePlan(in, {1, stall}, &p, &error)) << error;
  const auto& out = p.ranks[0].batches.at(0);
  // Kernel 2 (issued at 0.2 ms, the median issue) and later are issued 5 ms late; kernel 2 had
  // waited 1.8 ms in the queue beyond the quickest launch: it starts 3.2 ms late, with the
  // quickest launch's latency (the GPU ran dry).
  EXPECT_EQ(out.kernels(1).start_ns(), in[0].kernels(1).start_ns());
  EXPECT_EQ(out.kernels(2).issue_ns(), in[0].kernels(2).issue_ns() + 5 * kMs);
  EXPECT_EQ(out.kernels(2).issue_latency_ns(), kMs / 100);
  EXPECT_LT(out.kernels(4).issue_latency_ns(), in[0].kernels(4).issue_latency_ns());
}

TEST(ReplayPlan, HangStopsTheRankMidStepAndItsPeersInTheNextCollective) {
  Perturbation hang;
  hang.hang_rank = 1;
  hang.hang_step = 1;
  const Plan p = plan(8, hang);
  const int64_t stop = kT0 + 14 * kMs + kMs / 2;  // step 1 issues at 10.5, 14.5 and 15.5 ms
  EXPECT_EQ(p.ranks[1].stopped_at_ns, stop);
  EXPECT_EQ(p.ranks[1].waiting_in, "");
  // Its host issued nothing after; its GPU ran what was issued before (the step-1 GEMM).
  for (const auto& k : p.ranks[1].batches.at(0).kernels()) EXPECT_LT(k.issue_ns(), stop);
  EXPECT_EQ(p.ranks[1].batches.at(0).kernels_size(), 4);
  // Rank 0 (TP partner) and rank 3 (DP peer) wait in step 1's all-reduces rank 1 never issued.
  EXPECT_EQ(p.ranks[0].waiting_in, "ncclAllReduce");
  EXPECT_EQ(p.ranks[3].waiting_in, "ncclAllReduce");
  uint64_t issued = 0, completed = 0;
  for (const auto& c : p.ranks[3].progress) {
    issued += c.last_issued_seq();
    completed += c.last_completed_seq();
  }
  EXPECT_GT(issued, completed);
}

TEST(ReplayPlan, ErrorsNameTheProblem) {
  Plan p;
  std::string error;
  Perturbation bad;
  bad.hang_rank = 9;
  EXPECT_FALSE(makePlan(fixture(), {8, bad}, &p, &error));
  EXPECT_NE(error.find("not below --ranks"), std::string::npos);
  bad.hang_rank = 1;
  bad.hang_step = 7;
  EXPECT_FALSE(makePlan(fixture(), {8, bad}, &p, &error));
  EXPECT_NE(error.find("steps"), std::string::npos);
  EXPECT_FALSE(makePlan({}, {8, {}}, &p, &error));
}

TEST(ReplayPlan, ShiftTimesMovesEveryTimestamp) {
  v1::RecordBatch b = fixture()[0];
  shiftTimes(&b, 100);
  EXPECT_EQ(b.kernels(0).start_ns(), fixture()[0].kernels(0).start_ns() + 100);
  EXPECT_EQ(b.steps(0).end_ns(), fixture()[0].steps(0).end_ns() + 100);
  EXPECT_EQ(b.created_ns(), fixture()[0].created_ns() + 100);
}

TEST(SummaryReplay, TheBuilderSummarisesComputeAndKeepsCollectivesAsBlocks) {
  const Plan p = plan(2);
  const SummaryBatches s = toSummary(0, p.ranks[0].batches, p.ranks[0].due_ns, true, 1'000'000'000);
  ASSERT_FALSE(s.batches.empty());
  size_t summaries = 0, blocks = 0, kernels = 0, steps = 0;
  for (const auto& b : s.batches) {
    summaries += static_cast<size_t>(b.summaries_size());
    blocks += static_cast<size_t>(b.collective_blocks_size());
    kernels += static_cast<size_t>(b.kernels_size());
    steps += static_cast<size_t>(b.step_stats_size());
  }
  EXPECT_GT(summaries, 0u);
  EXPECT_GT(blocks, 0u);
  EXPECT_EQ(kernels, 0u);
  EXPECT_EQ(s.due_ns.size(), s.batches.size());
  (void)steps;  // step statistics need step boundaries the builder sees (markers, __next__)
}

TEST(FixtureReader, ParsesFlareExportLinesExactly) {
  std::vector<std::pair<std::string, JsonField>> f;
  ASSERT_TRUE(parseJsonLine(
      R"({"job":"j","rank":0,"kind":"gemm","name":"a\"b\u00e9","shape":[8192,2048,-1],)"
      R"("start_ns":1795722306382276591,"x":1.5,"ok":true,"n":null,)"
      R"("clusters":[{"count":1,"p50_ns":2}],"o":{"a":[1,{"b":2}]}})",
      &f));
  std::map<std::string, JsonField> m(f.begin(), f.end());
  EXPECT_EQ(m["name"].s, "a\"b\xc3\xa9");
  EXPECT_EQ(m["shape"].ints, (std::vector<long long>{8192, 2048, -1}));
  EXPECT_EQ(m["start_ns"].i, 1795722306382276591LL);  // exact: not through a double
  EXPECT_EQ(m["x"].d, 1.5);
  EXPECT_EQ(m["ok"].type, JsonField::kBool);
  EXPECT_EQ(m["clusters"].type, JsonField::kOther);
  EXPECT_EQ(m["o"].type, JsonField::kOther);
  f.clear();
  EXPECT_FALSE(parseJsonLine(R"({"a":)", &f));
  EXPECT_FALSE(parseJsonLine("[1,2]", &f));
}

}  // namespace
}  // namespace flare::replay
