// The slow_steps detector (slow_steps.cc) on hand-built records: 8 ranks, 30 steps of 30 ms, ten
// GEMMs and one all-reduce of every rank per step, with known times. A sparse fault makes some
// steps 50 ms for every rank (the others wait in the all-reduce for the culprit): a host that
// pauses before half of its kernels, or a GPU whose kernels run slower in those steps only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "flare/step.h"
#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/test_util.h"
#include "src/records/step_stats_wire.h"

namespace flare::engine {

std::unique_ptr<Detector> makeSlowStepsDetector();  // slow_steps.cc

namespace {

constexpr int kRanks = 8;
constexpr int kSteps = 30;
constexpr int kKernels = 10;
constexpr int64_t kStepNs = 30'000'000;
constexpr int64_t kSlowStepNs = 50'000'000;
constexpr int64_t kExtraNs = kSlowStepNs - kStepNs;

enum class Fault { kNone, kHost, kGpu };

struct Scenario {
  Fault fault = Fault::kNone;
  int culprit = -1;
  std::set<int> slow_steps;  // steps where the culprit is slow (and every rank's step is long)
  // Or, per step: the rank whose host stalls and by how much (host faults of several sizes).
  std::map<int, std::pair<int, int64_t>> stalls = {};
};

// A per-(rank, step) wobble in {-0.3, ..., 0.3} ms whose sign varies across steps.
int64_t wobble(int rank, int step) {
  return ((rank * 7 + step * 3) % 5 - 2) * 150'000;
}

flare::v1::RecordBatch rankBatch(int rank, const Scenario& sc) {
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  *b.add_signatures() = testing::stepMarkerSig(1);
  auto* gemm = b.add_signatures();
  gemm->set_id(2);
  gemm->set_name("gemm");
  gemm->set_kind(flare::v1::OP_KIND_GEMM);
  gemm->set_dtype(flare::v1::DTYPE_BF16);
  for (int64_t d : {1, 4096, 4096, 4096}) gemm->add_shape(d);
  gemm->set_flops_per_call(2ull * 4096 * 4096 * 4096);
  auto* ar = b.add_signatures();
  ar->set_id(3);
  ar->set_name("ncclAllReduce");
  ar->set_kind(flare::v1::OP_KIND_COLLECTIVE);
  ar->set_collective(flare::v1::COLLECTIVE_KIND_ALL_REDUCE);
  ar->set_bytes_per_call(64 << 20);
  int64_t t0 = 1'000'000'000 + 100'000 * rank;  // ranks' clocks up to 0.7 ms apart
  for (int s = 0; s < kSteps; ++s) {
    const auto stall = sc.stalls.find(s);
    const bool slow = sc.slow_steps.count(s) > 0 || stall != sc.stalls.end();
    const bool mine =
        stall != sc.stalls.end() ? rank == stall->second.first : slow && rank == sc.culprit;
    const int64_t extra = stall != sc.stalls.end() ? stall->second.second : kExtraNs;
    auto* m = b.add_kernels();
    m->set_signature_id(1);
    m->set_issue_ns(t0);
    m->set_start_ns(t0);
    m->set_end_ns(t0);
    // Ten GEMMs: issued 1 ms + k·0.1 ms into the step, run back to back from 2 ms, 1.8 ms each.
    // A host stall holds the last five back by the step's extra time (the GPU idles meanwhile);
    // a slow GPU runs each in 3.8 ms.
    int64_t gpu = t0 + 2'000'000;
    for (int k = 0; k < kKernels; ++k) {
      const int64_t held = mine && sc.fault == Fault::kHost && k >= 5 ? extra : 0;
      const int64_t issue = t0 + 1'000'000 + k * 100'000 + wobble(rank, s) + held;
      const int64_t start = std::max(gpu, issue + 5'000);
      const int64_t dur = mine && sc.fault == Fault::kGpu ? 3'800'000 : 1'800'000;
      auto* op = b.add_kernels();
      op->set_signature_id(2);
      op->set_stream_id(7);
      op->set_issue_ns(issue);
      op->set_start_ns(start);
      op->set_end_ns(start + dur);
      gpu = start + dur;
    }
    // The all-reduce: every rank's starts when its GEMMs are done and ends together, when the
    // last rank's has started and run 6 ms.
    const int64_t step_ns = slow ? kStepNs + extra : kStepNs;
    // Issued after the GEMMs: behind a host stall too.
    auto* op = b.add_kernels();
    op->set_signature_id(3);
    op->set_stream_id(7);
    op->set_issue_ns(t0 + 2'000'000 + wobble(rank, s) +
                     (mine && sc.fault == Fault::kHost ? extra : 0));
    op->set_start_ns(gpu);
    op->set_end_ns(t0 + step_ns - 500'000);
    op->set_bytes(64 << 20);
    auto* c = op->mutable_collective();
    c->set_comm_hash(0xabc);
    c->set_seq(static_cast<uint64_t>(s));
    c->set_nranks(kRanks);
    c->set_rank_in_comm(rank);
    t0 += step_ns;
  }
  return b;
}

JobModel build(const Scenario& sc) {
  JobModel m;
  for (int r = 0; r < kRanks; ++r) m.addBatch(r, rankBatch(r, sc));
  return m;
}

std::vector<Diagnosis> slowSteps(const JobModel& m) {
  DetectorRegistry registry;
  registry.add(makeSlowStepsDetector());
  return runDetectors(registry, m, DiagnoseOptions{}, nullptr, nullptr);
}

const Evidence* find(const Diagnosis& d, const std::string& metric) {
  for (const Evidence& e : d.evidence) {
    if (e.metric == metric) return &e;
  }
  return nullptr;
}

TEST(SlowSteps, HealthyStepsRaiseNothing) {
  EXPECT_TRUE(slowSteps(build({})).empty());
  EXPECT_TRUE(diagnose(build({}), DiagnoseOptions{}).empty());
}

TEST(SlowSteps, HostPausingEveryFifthStepIsNamedWithItsPeriodAndCost) {
  const Scenario sc{Fault::kHost, 3, {5, 10, 15, 20, 25}};
  const auto found = slowSteps(build(sc));
  ASSERT_EQ(found.size(), 1u);
  const Diagnosis& d = found[0];
  EXPECT_EQ(d.kind, "issue_stall");
  EXPECT_EQ(d.team, Team::kAlgorithm);
  EXPECT_EQ(d.ranks, std::vector<int>{3});
  EXPECT_NE(d.summary.find("every 5 steps (steps 5,10,15,20,25)"), std::string::npos) << d.summary;
  const Evidence* culprit = find(d, "slow_step_culprit");
  ASSERT_NE(culprit, nullptr);
  EXPECT_EQ(culprit->value, 5);
  // Binomial: P(5 of 5 | 1/8) × 8 ranks.
  EXPECT_NEAR(culprit->reference, 8.0 / 32768, 1e-9);
  // 20 ms lost in each of 5 steps of 28 (steps 1..28 are complete after the warm-up): 100 ms of
  // 940 ms; the job ran 100 / 840 = 11.9% slower than without them.
  const Evidence* cost = find(d, "slow_step_cost");
  ASSERT_NE(cost, nullptr);
  EXPECT_NEAR(cost->value, 5 * kExtraNs, 1e3);
  EXPECT_NEAR(cost->value / cost->reference, 100.0 / 940, 1e-6);
  EXPECT_NEAR(d.severity, 100.0 / 840, 1e-6);
  // The whole registry names it once: the continuous detectors see no level to name.
  const auto all = diagnose(build(sc), DiagnoseOptions{});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].ranks, std::vector<int>{3});
  EXPECT_EQ(all[0].kind, "issue_stall");
}

TEST(SlowSteps, BurstOfHostStallsIsNamed) {
  const auto found = slowSteps(build({Fault::kHost, 6, {12, 13, 14, 15}}));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks, std::vector<int>{6});
  EXPECT_NE(found[0].summary.find("burst of 4 consecutive steps"), std::string::npos)
      << found[0].summary;
}

TEST(SlowSteps, GpuSlowInSomeStepsIsTheGpusNotTheHosts) {
  // Rank 2's GPU runs its GEMMs at half speed in every 4th step; its host is on time, it arrives
  // last at the all-reduce, and its GPU time outside collectives rose against its own steps.
  const auto found = slowSteps(build({Fault::kGpu, 2, {4, 8, 12, 16, 20, 24}}));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "gpu_slow");
  EXPECT_EQ(found[0].team, Team::kOperations);
  EXPECT_EQ(found[0].ranks, std::vector<int>{2});
  EXPECT_NE(found[0].summary.find("every 4 steps"), std::string::npos) << found[0].summary;
}

TEST(SlowSteps, SlowStepsWithDifferentCulpritsNameNobody) {
  // Five slow steps, each another rank's host stall: no rank causes a majority.
  JobModel m;
  for (int r = 0; r < kRanks; ++r) {
    // Steps 5, 10, ..., 25 are slow for everyone; the culprit of step 5·i is rank i.
    Scenario mine{Fault::kHost, r, {5, 10, 15, 20, 25}};
    flare::v1::RecordBatch b = rankBatch(r, mine);
    // Keep only rank r's stall at step 5·r (other slow steps: rank r on time, waits).
    Scenario waits{Fault::kHost, -1, {5, 10, 15, 20, 25}};
    flare::v1::RecordBatch on_time = rankBatch(r, waits);
    for (int k = 0; k < b.kernels_size(); ++k) {
      const int64_t step_of = k / (kKernels + 2);
      if (step_of != 5 * r) *b.mutable_kernels(k) = on_time.kernels(k);
    }
    m.addBatch(r, b);
  }
  EXPECT_TRUE(slowSteps(m).empty());
}

TEST(SlowSteps, SmallerSlowStepsOfAnotherRankDoNotOutvoteARecurringPause) {
  // Rank 3 pauses 20 ms in steps 6, 14 and 22; rank 1 pauses 4 ms in four other steps (a
  // machine's noise: slow, attributed, but another population). Counted together rank 3 has 3 of
  // 7 attributed steps, no majority; among the slow steps alike to its own (at least half its
  // 20 ms) it has 3 of 3.
  Scenario sc{Fault::kHost, -1, {}};
  for (int step : {6, 14, 22}) sc.stalls[step] = {3, kExtraNs};
  for (int step : {3, 10, 18, 26}) sc.stalls[step] = {1, 4'000'000};
  const auto found = slowSteps(build(sc));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "issue_stall");
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
  const Evidence* culprit = find(found[0], "slow_step_culprit");
  ASSERT_NE(culprit, nullptr);
  EXPECT_NE(culprit->text.find("caused 3 of the 7 slow steps"), std::string::npos) << culprit->text;
  EXPECT_NE(culprit->text.find("its 3 of the 3 attributed slow steps alike"), std::string::npos)
      << culprit->text;
  // Rank 1's four 4 ms steps alone are not half of the slow steps' extra time: not named.
}

TEST(SlowSteps, AContinuousStallIsNotNamedAgain) {
  // A rank that an earlier detector named for the same kind is left to it.
  const Scenario sc{Fault::kHost, 3, {5, 10, 15, 20, 25}};
  const JobModel m = build(sc);
  DetectorRegistry registry;
  class NamesRank3 final : public Detector {
   public:
    std::string_view name() const override { return "names_rank_3"; }
    std::vector<std::string_view> kinds() const override { return {"issue_stall"}; }
    DetectorNeeds needs() const override { return {}; }
    std::vector<Diagnosis> run(const DetectorView&) const override {
      Diagnosis d;
      d.kind = "issue_stall";
      d.ranks = {3};
      return {d};
    }
  };
  registry.add(std::make_unique<NamesRank3>());
  registry.add(makeSlowStepsDetector());
  const auto found = runDetectors(registry, m, DiagnoseOptions{}, nullptr, nullptr);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(find(found[0], "slow_steps"), nullptr);
  // Slow steps on more than half of the steps: a level, for the continuous detectors.
  Scenario most{Fault::kHost, 3, {}};
  for (int s = 1; s < kSteps; s += 2) most.slow_steps.insert(s);
  for (int s = 2; s < kSteps; s += 6) most.slow_steps.insert(s);
  EXPECT_TRUE(slowSteps(build(most)).empty());
}

// The same job as summary-mode ranks with step sampling (FLARE_SAMPLE_STEPS): every rank sends
// its steps' statistics, and the steps sampled out (the same on every rank) carry their times
// only. A host pausing every 4th step is named from the pauses that fell in measured steps (3 of
// 7); the share of extra time is taken among the slow steps that could be attributed, not all 7
// (4 of them sampled out: the culprit's 3 would hold less than half).
JobModel sampledJob(const Scenario& sc, const std::set<int>& sampled_out) {
  const JobModel raw = build(sc);
  JobModel m;
  for (int r = 0; r < kRanks; ++r) {
    flare::v1::RecordBatch b = rankBatch(r, sc);
    // Summary mode: no compute op leaves the rank; markers and collectives stay raw.
    auto* kernels = b.mutable_kernels();
    kernels->erase(
        std::remove_if(kernels->begin(), kernels->end(),
                       [](const flare::v1::KernelRecord& k) { return k.signature_id() == 2; }),
        kernels->end());
    for (const records::StepStats& st : raw.stepStats(r)) {  // as the rank would send them
      records::StepResult result;
      result.stats = st;
      result.stats.sampled_out = sampled_out.count(static_cast<int>(st.step)) > 0;
      records::encodeStepStats(
          result, [](int64_t t) { return t; }, b.add_step_stats());
    }
    m.addBatch(r, b);
  }
  EXPECT_EQ(m.stepStats(3, /*with_sampled_out=*/true).size(), raw.stepStats(3).size());
  return m;
}

TEST(SlowSteps, AHostPauseIsNamedUnderStepSamplingFromMeasuredAndSampledOutSteps) {
  const Scenario sc{Fault::kHost, 3, {4, 8, 12, 16, 20, 24, 28}};
  const JobModel m = sampledJob(sc, {6, 10, 16, 18, 20, 24, 28});
  const auto found = slowSteps(m);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "issue_stall");
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
  // All seven pauses: four of them in sampled-out steps, told by the all-reduce issued late.
  EXPECT_NE(found[0].summary.find("steps 4,8,12,16,20,24,28"), std::string::npos)
      << found[0].summary;
}

// Every pause in a sampled-out step (K = 4 can sample out all of a sparse fault's steps): the
// collectives' issue offsets, the one host figure of such a step, still name the rank. A GPU
// slow in the same steps is not named from them: it issues its collectives on time, and a
// sampled-out step has no GPU figure to attribute it by.
TEST(SlowSteps, AHostPauseOnlyInSampledOutStepsIsNamedByItsLateCollectives) {
  const Scenario sc{Fault::kHost, 3, {4, 8, 12, 16, 20, 24, 28}};
  std::set<int> sampled_out;
  for (int s = 4; s < kSteps; s += 2) sampled_out.insert(s);  // every slow step among them
  const auto found = slowSteps(sampledJob(sc, sampled_out));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "issue_stall");
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
  EXPECT_NE(found[0].summary.find("every 4 steps"), std::string::npos) << found[0].summary;
  // Nothing is guessed from the arrival order alone.
  const Scenario gpu{Fault::kGpu, 3, {4, 8, 12, 16, 20, 24, 28}};
  EXPECT_TRUE(slowSteps(sampledJob(gpu, sampled_out)).empty());
}

}  // namespace
}  // namespace flare::engine
