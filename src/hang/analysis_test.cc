#include "src/hang/analysis.h"

#include <gtest/gtest.h>

#include <chrono>

#include "src/hang/synthetic.h"

namespace flare::hang {
namespace {

using testing::JobShape;
using testing::kSeq;
using testing::makeJob;
using testing::Scenario;

std::vector<int> suspectRanks(const Diagnosis& d) {
  std::vector<int> out;
  for (const Suspect& s : d.suspects) out.push_back(s.rank);
  return out;
}

TEST(CompactRanges, RunsAndSingles) {
  EXPECT_EQ(compactRanges({0, 1, 2, 3, 5, 7}), "0-3,5,7");
  EXPECT_EQ(compactRanges({7, 5, 3, 2, 1, 0, 5}), "0-3,5,7");
  EXPECT_EQ(compactRanges({}), "");
  EXPECT_EQ(compactRanges({4}), "4");
  EXPECT_EQ(compactRanges({1, 2}), "1-2");
}

TEST(FrameRules, ClassifiesCommunicationAndSkipsWaits) {
  EXPECT_EQ(classifyThread(testing::allReduceStacks().threads(0)), FrameClass::kCommunication);
  EXPECT_EQ(classifyThread(testing::computeStacks().threads(0)), FrameClass::kNone);
  EXPECT_EQ(classifyThread(testing::hostStuckStacks().threads(0)), FrameClass::kNone);

  flare::v1::NativeFrame f;
  f.set_symbol("ncclGroupEnd");
  EXPECT_EQ(classifyNative(f), FrameClass::kCommunication);
  f.set_symbol("cudaStreamSynchronize");
  EXPECT_EQ(classifyNative(f), FrameClass::kNeutral);
  f.set_symbol("");
  f.set_module("/usr/lib/libnccl.so.2");
  EXPECT_EQ(classifyNative(f), FrameClass::kCommunication);
  flare::v1::PythonFrame p;
  p.set_function("barrier");
  p.set_file("/opt/torch/distributed/distributed_c10d.py");
  EXPECT_EQ(classifyPython(p), FrameClass::kCommunication);
  p.set_function("forward");
  p.set_file("/job/model.py");
  EXPECT_EQ(classifyPython(p), FrameClass::kNone);

  // A native-only thread: NCCL below a CUDA synchronization is communication; a custom op
  // below it is not.
  flare::v1::ThreadStack t;
  auto* a = t.add_native_frames();
  a->set_symbol("cudaStreamSynchronize");
  auto* b = t.add_native_frames();
  b->set_symbol("ncclAllReduce");
  EXPECT_EQ(classifyThread(t), FrameClass::kCommunication);
  b->set_symbol("myop::launch()");
  EXPECT_EQ(classifyThread(t), FrameClass::kNone);
}

TEST(Analyze, ComputeHangNamesTheRankOutsideCommunication) {
  auto ranks = makeJob(JobShape{16, 2, 8}, Scenario::kComputeHang, 11);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kNonCommunication) << formatDiagnosis(d);
  ASSERT_EQ(suspectRanks(d), std::vector<int>{11});
  EXPECT_EQ(d.suspects[0].host, "node1");
  EXPECT_EQ(d.suspects[0].gpu_index, 3);
  ASSERT_EQ(d.groups.size(), 2u);
  EXPECT_EQ(d.groups[0].ranges, "0-10,12-15");
  EXPECT_TRUE(d.groups[0].in_communication);
  EXPECT_EQ(d.groups[1].ranges, "11");
  EXPECT_FALSE(d.groups[1].in_communication);
  ASSERT_EQ(d.lagging.size(), 1u);
  EXPECT_EQ(d.lagging[0].seq, kSeq);
  EXPECT_TRUE(d.lagging[0].not_issued.empty());
  EXPECT_EQ(d.lagging[0].op, "ncclAllReduce");
  EXPECT_FALSE(d.needs_inspection);
}

flare::v1::StuckOp stuckOp(const std::string& kind, const std::string& name, double age_s) {
  flare::v1::StuckOp op;
  op.set_kind(kind);
  op.set_name(name);
  op.set_age_ns(static_cast<int64_t>(age_s * 1e9));
  if (kind == "collective") {
    op.set_communicator("tp");
    op.set_seq(kSeq);
  }
  return op;
}

TEST(Analyze, WatchdogSeparatesTheComputeHangFromItsTensorParallelPartner) {
  // TP 2: rank 5's GEMM never finishes; its partner rank 4's GPU waits in their TP all-reduce
  // while rank 4's host, like rank 5's, waits outside communication (a later synchronize). The
  // stacks cannot tell them apart; the watchdogs can: rank 5 is stuck in a kernel, rank 4 only in
  // the collective.
  auto ranks = makeJob(JobShape{8, 2, 8}, Scenario::kComputeHang, 5);
  ranks[4].stacks = testing::computeStacks();
  ranks[4].stacks.mutable_collectives()->CopyFrom(ranks[5].stacks.collectives());
  {
    Diagnosis before = analyze(ranks);  // no watchdog report: both named, as before
    EXPECT_EQ(suspectRanks(before), (std::vector<int>{4, 5})) << formatDiagnosis(before);
    EXPECT_TRUE(before.victims.empty());
  }
  for (auto& e : ranks) e.stuck = {stuckOp("collective", "ncclAllReduce", 3.0)};
  ranks[5].stuck = {stuckOp("gemm", "cublasGemmEx", 3.2),
                    stuckOp("collective", "ncclAllReduce", 3.0)};
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kNonCommunication);
  EXPECT_EQ(suspectRanks(d), std::vector<int>{5}) << formatDiagnosis(d);
  EXPECT_EQ(d.victims, std::vector<int>{4});
  EXPECT_NE(d.suspects[0].reason.find("gemm cublasGemmEx stuck"), std::string::npos)
      << d.suspects[0].reason;
  EXPECT_NE(formatDiagnosis(d).find("victims (wait for the suspects, not at fault): ranks 4"),
            std::string::npos)
      << formatDiagnosis(d);
  // A partner whose watchdog said nothing is not cleared: no evidence, no acquittal.
  ranks[4].stuck.clear();
  EXPECT_EQ(suspectRanks(analyze(ranks)), (std::vector<int>{4, 5}));
  // Both stuck in compute kernels first: both stay suspects.
  ranks[4].stuck = {stuckOp("kernel", "elementwise", 3.1), stuckOp("collective", "ar", 3.0)};
  EXPECT_EQ(suspectRanks(analyze(ranks)), (std::vector<int>{4, 5}));
}

TEST(Analyze, RankThatNeverIssuedTheCollectiveIsTheCulprit) {
  auto ranks = makeJob(JobShape{8, 2, 8}, Scenario::kSkip, 5);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kNonCommunication) << formatDiagnosis(d);
  EXPECT_EQ(suspectRanks(d), std::vector<int>{5});
  ASSERT_EQ(d.lagging.size(), 1u);
  EXPECT_EQ(d.lagging[0].communicator, "dp");
  EXPECT_EQ(d.lagging[0].seq, kSeq);
  EXPECT_EQ(d.lagging[0].not_issued, std::vector<int>{5});
  EXPECT_EQ(compactRanges(d.lagging[0].waiting), "0-4,6-7");
  // Per-rank progress, compacted: the culprit alone one collective behind.
  ASSERT_EQ(d.progress.size(), 2u);
  EXPECT_EQ(d.progress[0].ranges, "5");
  EXPECT_EQ(d.progress[0].last_issued_seq, kSeq - 1);
  EXPECT_EQ(d.progress[0].last_completed_seq, kSeq - 1);
  EXPECT_EQ(d.progress[1].ranges, "0-4,6-7");
  EXPECT_EQ(d.progress[1].last_issued_seq, kSeq);
  EXPECT_EQ(d.progress[1].last_issued_op, "ncclAllReduce");
  EXPECT_NE(formatDiagnosis(d).find("dp: issued #41 (ncclReduceScatter), completed #41: ranks 5"),
            std::string::npos)
      << formatDiagnosis(d);
}

TEST(Analyze, CounterAloneNamesTheRankWhenItsStackLooksLikeCommunication) {
  // Rank 2 waits in communication (say another communicator) but never issued dp #42.
  auto ranks = makeJob(JobShape{4, 2, 8}, Scenario::kComputeHang, -1);
  ranks[2].stacks.mutable_collectives(0)->set_last_issued_seq(kSeq - 1);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kNonCommunication);
  EXPECT_EQ(suspectRanks(d), std::vector<int>{2});
}

TEST(Analyze, UnresponsiveRankIsNamed) {
  auto ranks = makeJob(JobShape{8, 2, 4}, Scenario::kUnresponsive, 6);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kUnresponsiveRank);
  ASSERT_EQ(suspectRanks(d), std::vector<int>{6});
  EXPECT_EQ(d.suspects[0].host, "node1");
  EXPECT_NE(d.suspects[0].reason.find("no answer within 30 s"), std::string::npos);
  EXPECT_EQ(d.unresponsive, std::vector<int>{6});
  // The answering ranks are still grouped: one group, all in the all-reduce.
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].ranges, "0-5,7");
}

TEST(Analyze, CrashedRankIsNamedWithItsState) {
  auto ranks = makeJob(JobShape{4, 2, 8}, Scenario::kComputeHang, -1);
  ranks[1].state = Responsiveness::kCrashed;
  ranks[1].why = "exit signal 6";
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kUnresponsiveRank);
  ASSERT_EQ(suspectRanks(d), std::vector<int>{1});
  EXPECT_EQ(d.suspects[0].reason, "crashed: exit signal 6");
}

TEST(Analyze, AllInTheCollectiveWithoutStepsNeedsInspection) {
  auto ranks = makeJob(JobShape{8, 2, 8}, Scenario::kComputeHang, -1);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kCommunication);
  EXPECT_TRUE(d.needs_inspection);
  EXPECT_TRUE(d.suspects.empty());
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].ranges, "0-7");
}

TEST(Analyze, StalledRingLinkNamesItsTwoEnds) {
  for (int stalled : {0, 3, 7}) {
    auto ranks = makeJob(JobShape{8, 4, 4}, Scenario::kStalledLink, stalled);
    Diagnosis d = analyze(ranks);
    EXPECT_EQ(d.kind, HangKind::kCommunication);
    ASSERT_TRUE(d.link.has_value()) << formatDiagnosis(d);
    EXPECT_EQ(d.link->sender, stalled);
    EXPECT_EQ(d.link->receiver, (stalled + 1) % 8);
    EXPECT_EQ(d.link->step, testing::kStalledStep);
    EXPECT_EQ(d.link->channels_agreeing, 4);
    EXPECT_EQ(suspectRanks(d), (std::vector<int>{stalled, (stalled + 1) % 8}));
    EXPECT_EQ(d.suspects[1].gpu_index, ((stalled + 1) % 8) % 4);
    EXPECT_EQ(d.unmatched_connections, 0u);
    EXPECT_EQ(d.inconsistent_connections, 0u);
    EXPECT_FALSE(d.needs_inspection);
  }
}

TEST(Analyze, JoinUsesTheSmallerSideOfAConnection) {
  // Sender 2 claims step 500 on 2->3 but 3 received only 50: the edge's progress is 50.
  auto ranks = makeJob(JobShape{4, 1, 8}, Scenario::kStalledLink, 0);
  for (auto& c : ranks[3].connections) {
    if (!c.send() && c.peer() == 2) c.set_step(50);
  }
  Diagnosis d = analyze(ranks);
  ASSERT_TRUE(d.link.has_value());
  EXPECT_EQ(d.link->sender, 2);
  EXPECT_EQ(d.link->receiver, 3);
  EXPECT_EQ(d.link->step, 50u);
  EXPECT_EQ(d.inconsistent_connections, 0u);
}

TEST(Analyze, UnmatchedAndInvalidConnectionsAreCounted) {
  auto ranks = makeJob(JobShape{4, 1, 8}, Scenario::kStalledLink, 1);
  // Rank 3 does not report its receive side from 2; and one invalid entry (self peer).
  auto& c3 = ranks[3].connections;
  c3.erase(std::remove_if(c3.begin(), c3.end(), [](const auto& c) { return !c.send(); }), c3.end());
  flare::v1::ConnectionStep bad;
  bad.set_channel(0);
  bad.set_peer(3);
  bad.set_send(true);
  c3.push_back(bad);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.unmatched_connections, 1u);
  EXPECT_EQ(d.invalid_connections, 1u);
  ASSERT_TRUE(d.link.has_value());
  EXPECT_EQ(d.link->sender, 1);
}

TEST(Analyze, TiedConnectionsNameNoLink) {
  auto ranks = makeJob(JobShape{4, 2, 8}, Scenario::kStalledLink, 0);
  for (auto& e : ranks) {
    for (auto& c : e.connections) c.set_step(7);
  }
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kCommunication);
  EXPECT_FALSE(d.link.has_value());
  EXPECT_TRUE(d.suspects.empty());
  EXPECT_FALSE(d.needs_inspection);  // inspected, but the steps do not decide
}

TEST(Analyze, MainThreadThatDidNotAnswerIsNeitherInsideNorOutside) {
  auto ranks = makeJob(JobShape{4, 2, 8}, Scenario::kComputeHang, -1);
  auto* main = ranks[3].stacks.mutable_threads(0);
  main->clear_python_frames();
  main->clear_native_frames();
  main->set_timed_out(true);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kCommunication) << formatDiagnosis(d);
  EXPECT_TRUE(d.suspects.empty());
  EXPECT_EQ(d.unknown_stack, std::vector<int>{3});
  // Every rank without a main-thread stack: nothing to go on.
  for (auto& e : ranks) *e.stacks.mutable_threads(0) = *main;
  EXPECT_EQ(analyze(ranks).kind, HangKind::kInconclusive);
}

TEST(Analyze, ContradictingEvidenceIsInconclusive) {
  // The stacks point at rank 1 (compute), the counters at rank 6 (never issued #42).
  auto ranks = makeJob(JobShape{8, 2, 8}, Scenario::kComputeHang, 1);
  ranks[6].stacks.mutable_collectives(0)->set_last_issued_seq(kSeq - 1);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kInconclusive) << formatDiagnosis(d);
  EXPECT_TRUE(d.suspects.empty());
  EXPECT_NE(formatDiagnosis(d).find("contradiction"), std::string::npos);
}

// Every rank's stack is outside communication (NCCL is asynchronous: the ranks wait at the
// step's end), but every rank issued collective kSeq and none completed it.
std::vector<RankEvidence> waitingAtStepEnd(int n) {
  std::vector<RankEvidence> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].rank = r;
    ranks[r].host = "node0";
    ranks[r].gpu_index = r;
    ranks[r].stacks = testing::computeStacks();
    auto* c = ranks[r].stacks.add_collectives();
    c->set_communicator("dp");
    c->set_last_issued_seq(testing::kSeq);
    c->set_last_completed_seq(testing::kSeq - 1);
    c->set_last_issued_op("ncclAllReduce");
  }
  return ranks;
}

TEST(Analyze, CountersShowingEveryRankInTheCollectiveAskForInspectionAndUseTheSteps) {
  auto ranks = waitingAtStepEnd(8);
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kCommunication) << formatDiagnosis(d);
  EXPECT_TRUE(d.needs_inspection);
  EXPECT_TRUE(d.suspects.empty());
  for (auto& e : ranks) {
    e.inspected = true;
    e.connections = testing::ringSteps(e.rank, 8, 2, 5);
  }
  d = analyze(ranks);
  ASSERT_TRUE(d.link.has_value()) << formatDiagnosis(d);
  EXPECT_EQ(suspectRanks(d), (std::vector<int>{5, 6}));
}

// The stacks line and the counters line agree: ranks whose hosts are outside communication but
// whose GPUs still wait in a collective are said to be so, not just "outside communication"
// next to "waited on by" the same ranks.
TEST(Analyze, StacksOutsideCommunicationSayTheirCollectivesStillWaitOnTheGpu) {
  auto ranks = waitingAtStepEnd(8);
  ranks[3].stacks.mutable_collectives(0)->set_last_issued_seq(testing::kSeq - 1);  // never issued
  const Diagnosis d = analyze(ranks);
  const std::string text = formatDiagnosis(d);
  EXPECT_NE(text.find("waited on by ranks 0-2,4-7"), std::string::npos) << text;
  EXPECT_NE(text.find("ranks 0-7: main-thread stacks outside communication calls (ranks 0-2,4-7 "
                      "still wait in a collective on their GPUs"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("are outside communication"), std::string::npos) << text;
}

TEST(Analyze, RankWhoseConnectionsAllStayAtZeroNeverReachedTheCollective) {
  constexpr int kN = 8;
  for (int culprit : {0, 4, 7}) {
    auto ranks = waitingAtStepEnd(kN);
    for (auto& e : ranks) {
      e.inspected = true;
      if (e.rank == culprit) continue;  // its stream never reached the collective: no connection
      for (int ch = 0; ch < 2; ++ch) {
        const int next = (e.rank + 1) % kN, prev = (e.rank + kN - 1) % kN;
        flare::v1::ConnectionStep s, r;
        s.set_channel(ch);
        s.set_peer(next);
        s.set_send(true);
        s.set_step(next == culprit ? 0 : 8);  // one buffer moved where both ends arrived
        r.set_channel(ch);
        r.set_peer(prev);
        r.set_send(false);
        r.set_step(prev == culprit ? 0 : 8);
        e.connections.push_back(s);
        e.connections.push_back(r);
      }
    }
    Diagnosis d = analyze(ranks);
    EXPECT_EQ(d.kind, HangKind::kNonCommunication) << formatDiagnosis(d);
    EXPECT_EQ(suspectRanks(d), std::vector<int>{culprit}) << formatDiagnosis(d);
  }
  // Nothing moved anywhere: no rank stands out.
  auto ranks = waitingAtStepEnd(4);
  for (auto& e : ranks) {
    e.inspected = true;
    flare::v1::ConnectionStep s;
    s.set_channel(0);
    s.set_peer((e.rank + 1) % 4);
    s.set_send(true);
    s.set_step(0);
    e.connections.push_back(s);
  }
  Diagnosis d = analyze(ranks);
  EXPECT_TRUE(d.suspects.empty()) << formatDiagnosis(d);
}

TEST(Analyze, RankWaitingInAKernelForTheRankThatNeverArrivedIsAVictim) {
  // Rank 5's GPU is stuck before the collective (no collective kernel running: no connection);
  // rank 4's GPU runs the collective kernel and waits for 5 (its connections reported, at step 0,
  // as are its peers' towards it): both never moved, only 5 is the culprit.
  constexpr int kN = 8, kCulprit = 5, kPartner = 4;
  auto ranks = waitingAtStepEnd(kN);
  auto stuck = [](int r) { return r == kCulprit || r == kPartner; };
  for (auto& e : ranks) {
    e.inspected = true;
    if (e.rank == kCulprit) continue;
    for (int ch = 0; ch < 2; ++ch) {
      const int next = (e.rank + 1) % kN, prev = (e.rank + kN - 1) % kN;
      flare::v1::ConnectionStep s, r;
      s.set_channel(ch);
      s.set_peer(next);
      s.set_send(true);
      s.set_step(stuck(next) || stuck(e.rank) ? 0 : 8);
      r.set_channel(ch);
      r.set_peer(prev);
      r.set_send(false);
      r.set_step(stuck(prev) || stuck(e.rank) ? 0 : 8);
      e.connections.push_back(s);
      e.connections.push_back(r);
    }
  }
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kNonCommunication) << formatDiagnosis(d);
  EXPECT_EQ(suspectRanks(d), std::vector<int>{kCulprit}) << formatDiagnosis(d);
  EXPECT_EQ(d.victims, std::vector<int>{kPartner}) << formatDiagnosis(d);
  // Without the partner's connections (say its inspection failed), nothing clears it.
  ranks[kPartner].connections.clear();
  EXPECT_EQ(suspectRanks(analyze(ranks)), (std::vector<int>{kPartner, kCulprit}));
}

TEST(Analyze, NobodyInCommunicationIsInconclusive) {
  auto ranks = makeJob(JobShape{4, 2, 8}, Scenario::kComputeHang, -1);
  for (auto& e : ranks) e.stacks = testing::computeStacks();
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kInconclusive);
  EXPECT_TRUE(d.suspects.empty());
}

TEST(Analyze, NoRankAnsweringIsInconclusiveAndDuplicatesAreCounted) {
  std::vector<RankEvidence> ranks(3);
  for (int i = 0; i < 3; ++i) {
    ranks[i].rank = i == 2 ? 0 : i;
    ranks[i].state = Responsiveness::kNoAnswer;
  }
  Diagnosis d = analyze(ranks);
  EXPECT_EQ(d.kind, HangKind::kInconclusive);
  EXPECT_EQ(d.duplicate_ranks, 1u);
  EXPECT_EQ(analyze({}).kind, HangKind::kInconclusive);
}

TEST(Analyze, FormatIsCompact) {
  auto ranks = makeJob(JobShape{64, 2, 8}, Scenario::kComputeHang, 9);
  std::string text = formatDiagnosis(analyze(ranks), 3);
  if (getenv("FLARE_HANG_TEST_VERBOSE")) std::printf("%s", text.c_str());
  EXPECT_NE(text.find("non-communication hang: suspects rank 9 on node1 GPU 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("ranks 0-8,10-63 [communication]:"), std::string::npos) << text;
  EXPECT_NE(text.find("more"), std::string::npos);
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 20);
  EXPECT_NE(text.find("dp: issued #42 (ncclAllReduce), completed #41: ranks 0-63"),
            std::string::npos)
      << text;
}

// Scale: the diagnosis at 8,192 ranks is the injected truth, for every scenario.
TEST(AnalyzeScale, EightThousandRanks) {
  const JobShape shape{8192, 8, 8};
  struct Case {
    Scenario s;
    int culprit;
    HangKind kind;
    std::vector<int> suspects;
  };
  const Case cases[] = {
      {Scenario::kComputeHang, 5000, HangKind::kNonCommunication, {5000}},
      {Scenario::kSkip, 8191, HangKind::kNonCommunication, {8191}},
      {Scenario::kUnresponsive, 17, HangKind::kUnresponsiveRank, {17}},
      {Scenario::kStalledLink, 8191, HangKind::kCommunication, {8191, 0}},
  };
  for (const Case& c : cases) {
    auto ranks = makeJob(shape, c.s, c.culprit);
    auto t0 = std::chrono::steady_clock::now();
    Diagnosis d = analyze(ranks);
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
    EXPECT_EQ(d.kind, c.kind);
    EXPECT_EQ(suspectRanks(d), c.suspects);
    EXPECT_LE(d.groups.size(), 2u);
    std::printf("scenario %d: %.1f ms\n", int(c.s), ms.count());
  }
}

// 8 ranks, tensor parallel 2 x data parallel 4: tp groups {2g, 2g+1}, dp groups {0,2,4,6}
// ("dpA") and {1,3,5,7} ("dpB"). dpA hangs on its ring link comm rank 1 -> 2 (global 2 -> 4);
// dpB finished; the odd ranks then wait in the next tp all-reduce, which their even partners
// (stuck in dpA) never issue. Peers come as communicator ranks and must be translated.
std::vector<RankEvidence> tpDpJob(bool inspected) {
  std::vector<RankEvidence> job;
  for (int r = 0; r < 8; ++r) {
    RankEvidence e;
    e.rank = r;
    e.host = "node" + std::to_string(r / 4);
    e.gpu_index = r % 4;
    e.stacks = testing::allReduceStacks();
    const bool even = r % 2 == 0;
    auto* dp = e.stacks.add_collectives();
    dp->set_communicator(even ? "dpA" : "dpB");
    dp->set_comm_rank(r / 2);
    dp->set_nranks(4);
    dp->set_last_issued_seq(10);
    dp->set_last_completed_seq(even ? 9 : 10);
    dp->set_last_issued_op("ncclAllReduce");
    auto* tp = e.stacks.add_collectives();
    tp->set_communicator("tp" + std::to_string(r / 2));
    tp->set_comm_rank(r % 2);
    tp->set_nranks(2);
    tp->set_last_issued_seq(even ? 30 : 31);
    tp->set_last_completed_seq(30);
    tp->set_last_issued_op("ncclAllReduce");
    e.inspected = inspected;
    if (inspected && even) {
      for (auto c : testing::ringSteps(r / 2, 4, 2, /*stalled comm rank*/ 1)) {
        c.set_communicator("dpA");
        c.set_comm_rank(r / 2);
        e.connections.push_back(c);
      }
    }
    if (inspected && !even) {  // the tp all-reduce whose partner never arrived: all at 0
      for (int ch = 0; ch < 2; ++ch) {
        for (bool send : {true, false}) {
          flare::v1::ConnectionStep c;
          c.set_channel(ch);
          c.set_peer(0);
          c.set_step(0);
          c.set_send(send);
          c.set_communicator("tp" + std::to_string(r / 2));
          c.set_comm_rank(1);
          e.connections.push_back(c);
        }
      }
    }
    job.push_back(std::move(e));
  }
  return job;
}

TEST(Analyze, BlockedRanksThatNeverIssuedAreNotCulprits) {
  const Diagnosis d = analyze(tpDpJob(false));
  EXPECT_EQ(d.kind, HangKind::kCommunication) << formatDiagnosis(d);
  EXPECT_TRUE(d.needs_inspection);
  EXPECT_TRUE(d.suspects.empty()) << formatDiagnosis(d);
  bool blocked_line = false;
  for (const auto& e : d.evidence) blocked_line |= e.find("ranks 0,2,4,6 never issued") == 0;
  EXPECT_TRUE(blocked_line) << formatDiagnosis(d);
}

TEST(Analyze, SubCommunicatorLinkIsJoinedPerCommunicatorAndTranslated) {
  std::vector<RankEvidence> job = tpDpJob(true);
  flare::v1::ConnectionStep ghost;  // a communicator nobody reported a rank in
  ghost.set_channel(0);
  ghost.set_peer(3);
  ghost.set_step(1);
  ghost.set_send(true);
  ghost.set_communicator("ghost");
  ghost.set_comm_rank(0);
  job[1].connections.push_back(ghost);
  const Diagnosis d = analyze(job);
  EXPECT_EQ(d.kind, HangKind::kCommunication) << formatDiagnosis(d);
  ASSERT_TRUE(d.link) << formatDiagnosis(d);
  EXPECT_EQ(d.link->sender, 2);
  EXPECT_EQ(d.link->receiver, 4);
  EXPECT_EQ(d.link->communicator, "dpA");
  EXPECT_EQ(d.link->step, testing::kStalledStep);
  EXPECT_EQ(d.link->channels_agreeing, 2);
  EXPECT_EQ(suspectRanks(d), (std::vector<int>{2, 4}));
  EXPECT_EQ(d.untranslated_connections, 1u);
  // The odd ranks' one-sided tp connections (4 ranks x 2 channels x send and receive): their
  // even peers were inspected too.
  EXPECT_EQ(d.unmatched_connections, 16u);
}

}  // namespace
}  // namespace flare::hang
