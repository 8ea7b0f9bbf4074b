// Magnitudes against a rank's own steps before a change point (own_change.h) on hand-built
// records: 8 ranks, 30 steps, ten GEMMs and one all-reduce of every rank per step. From step 15
// rank 2's GEMMs take 1.25× as long (its clock at 80%), or the all-reduce takes longer from the
// last arrival (a link at 80% of its bus bandwidth); every rank's step grows with it. Host
// contention can stretch the steps just before the onset.
#include "src/engine/diagnosis/own_change.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "flare/step.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

constexpr int kRanks = 8;
constexpr int kSteps = 30;
constexpr int kOnset = 15;
constexpr int kKernels = 10;
constexpr int64_t kGemmNs = 1'800'000;

struct Fault {
  double gemm_factor = 1;     // rank 2's GEMMs from kOnset
  int64_t link_extra_ns = 0;  // the all-reduce from the last arrival, from kOnset
  // Host contention (a CPU hog beside rank 5): in `host_steps` steps, by default those just
  // before kOnset, else from `host_from`, rank 5's host issues the step's work `host_delay_ns`
  // late; every rank's all-reduce waits for it, so the step's wall time stretches while no GPU
  // runs a kernel longer.
  int64_t host_delay_ns = 0;
  int host_steps = 0;
  int host_from = -1;
};

// A per-(rank, step) wobble in {-0.2, ..., 0.2} ms.
int64_t wobble(int rank, int step) {
  return ((rank * 7 + step * 3) % 5 - 2) * 100'000;
}

flare::v1::RecordBatch rankBatch(int rank, const Fault& f) {
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  *b.add_signatures() = testing::stepMarkerSig(1);
  auto* gemm = b.add_signatures();
  gemm->set_id(2);
  gemm->set_name("gemm");
  gemm->set_kind(flare::v1::OP_KIND_GEMM);
  gemm->set_dtype(flare::v1::DTYPE_BF16);
  for (int64_t d : {1, 4096, 4096, 4096}) gemm->add_shape(d);
  auto* ar = b.add_signatures();
  ar->set_id(3);
  ar->set_name("ncclAllReduce");
  ar->set_kind(flare::v1::OP_KIND_COLLECTIVE);
  ar->set_collective(flare::v1::COLLECTIVE_KIND_ALL_REDUCE);
  int64_t t0 = 1'000'000'000;
  for (int s = 0; s < kSteps; ++s) {
    const bool after = s >= kOnset;
    const int host_from = f.host_from >= 0 ? f.host_from : kOnset - f.host_steps;
    const int64_t hog = s >= host_from && s < host_from + f.host_steps ? f.host_delay_ns : 0;
    auto* m = b.add_kernels();
    m->set_signature_id(1);
    m->set_issue_ns(t0);
    m->set_start_ns(t0);
    m->set_end_ns(t0);
    // The slowest rank's GEMMs end the compute; everyone's all-reduce then runs 9.5 ms (+ the
    // link's extra) from that last arrival, and the step ends 0.5 ms later.
    const double slow = after ? f.gemm_factor : 1.0;
    const auto last_arrival = static_cast<int64_t>(2'000'000 + kKernels * kGemmNs * slow);
    const int64_t ar_end = t0 + hog + last_arrival + 9'500'000 + (after ? f.link_extra_ns : 0);
    const int64_t late = rank == 5 ? hog : 0;
    int64_t gpu = t0 + 2'000'000 + late;
    for (int k = 0; k < kKernels; ++k) {
      const auto dur =
          static_cast<int64_t>(kGemmNs * (rank == 2 ? slow : 1.0)) + wobble(rank, s) / 20;
      auto* op = b.add_kernels();
      op->set_signature_id(2);
      op->set_stream_id(7);
      op->set_issue_ns(t0 + late + 1'000'000 + k * 100'000);
      op->set_start_ns(gpu);
      op->set_end_ns(gpu + dur);
      gpu += dur;
    }
    auto* op = b.add_kernels();
    op->set_signature_id(3);
    op->set_stream_id(7);
    op->set_issue_ns(t0 + late + 1'500'000);
    op->set_start_ns(gpu);
    op->set_end_ns(ar_end);
    op->set_bytes(64 << 20);
    auto* c = op->mutable_collective();
    c->set_comm_hash(0xabc);
    c->set_seq(static_cast<uint64_t>(s));
    c->set_nranks(kRanks);
    c->set_rank_in_comm(rank);
    t0 = ar_end + 500'000 + wobble(0, s);
  }
  return b;
}

JobModel build(const Fault& f) {
  JobModel m;
  for (int r = 0; r < kRanks; ++r) m.addBatch(r, rankBatch(r, f));
  return m;
}

TEST(OwnChange, SlowerClockFromMidRunReadsAsTheKernelsOwnSlowdown) {
  const JobModel m = build({1.25, 0});
  const auto fail = findFailSlow(m, DiagnoseOptions{});
  ASSERT_TRUE(fail.has_value());
  EXPECT_EQ(fail->step, static_cast<size_t>(kOnset));
  EXPECT_EQ(fail->job_step, fail->step);  // the step time and rank 2's GPU time agree
  EXPECT_EQ(fail->rank, 2);
  const auto c = ownComputeChange(m, DiagnoseOptions{}, 2);
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->ratio, 1.25, 0.005);
  EXPECT_EQ(c->change_step, static_cast<size_t>(kOnset));
  // Steps 1..13 against 16..28 (one left out on each side; step 29 has no end marker but its
  // kernels count).
  EXPECT_EQ(c->before_first, 1u);
  EXPECT_EQ(c->before_last, static_cast<size_t>(kOnset - 2));
  EXPECT_EQ(c->after_first, static_cast<size_t>(kOnset + 1));
  // A healthy rank's own kernels did not change.
  const auto healthy = ownComputeChange(m, DiagnoseOptions{}, 5);
  ASSERT_TRUE(healthy.has_value());
  EXPECT_NEAR(healthy->ratio, 1.0, 0.005);
  // The diagnosis carries it: 25%, not the job's step-time rise (~13% here).
  const auto found = diagnose(m, DiagnoseOptions{});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "gpu_slow");
  EXPECT_EQ(found[0].ranks, std::vector<int>{2});
  EXPECT_NEAR(found[0].severity, 0.25, 0.005);
  EXPECT_LT(fail->after_ns / fail->before_ns - 1, 0.2);
  bool own = false;
  for (const Evidence& e : found[0].evidence) own |= e.metric == "own_change";
  EXPECT_TRUE(own);
  EXPECT_NE(found[0].summary.find("25.0% slower than its own kernels before (steps 16-29 against "
                                  "steps 1-13 (change point at step 15))"),
            std::string::npos)
      << found[0].summary;
}

TEST(OwnChange, WithoutAJobChangePointTheRanksOwnIsUsed) {
  // Host noise can hide the job's change point (or the fail-slow tests reject it); the rank's
  // GPU time per step, which that noise does not move, still shows where it slowed down.
  DiagnoseOptions strict;
  strict.fail_slow_min_relative = 10;  // no job-level fail-slow
  const JobModel m = build({1.25, 0});
  ASSERT_FALSE(findFailSlow(m, strict).has_value());
  const auto c = ownComputeChange(m, strict, 2);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->change_step, static_cast<size_t>(kOnset));
  EXPECT_NEAR(c->ratio, 1.25, 0.005);
  // A healthy rank's GPU time did not change: no change point of its own.
  EXPECT_FALSE(ownComputeChange(m, strict, 5).has_value());
}

TEST(OwnChange, HostStretchedStepsBeforeTheOnsetDoNotMoveIt) {
  // A CPU hog delays rank 5's host by 3.5 ms in the 4 steps before rank 2's clock drops: those
  // steps' wall time sits nearer the new level (+4.5 ms) than the old, and the job's step time
  // alone splits before them (at step 11, 4 early). Rank 2's GPU compute time per step did not
  // move until step 15, and places the onset there.
  const JobModel m = build({1.25, 0, 3'500'000, 4});
  const auto fail = findFailSlow(m, DiagnoseOptions{});
  ASSERT_TRUE(fail.has_value());
  EXPECT_EQ(fail->step, static_cast<size_t>(kOnset));
  EXPECT_EQ(fail->job_step, static_cast<size_t>(kOnset - 4));
  EXPECT_EQ(fail->rank, 2);
  EXPECT_NEAR(fail->rank_after_ns / fail->rank_before_ns, 1.25, 0.01);
  // The magnitude compares the rank's own steps on either side of that onset.
  const auto c = ownComputeChange(m, DiagnoseOptions{}, 2);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->change_step, static_cast<size_t>(kOnset));
  EXPECT_NEAR(c->ratio, 1.25, 0.005);
  // The cited evidence says where the onset came from.
  const auto found = diagnose(m, DiagnoseOptions{});
  const auto gpu = std::find_if(found.begin(), found.end(),
                                [](const Diagnosis& d) { return d.kind == "gpu_slow"; });
  ASSERT_NE(gpu, found.end());
  EXPECT_EQ(gpu->ranks, std::vector<int>{2});
  ASSERT_FALSE(gpu->evidence.empty());
  EXPECT_EQ(gpu->evidence[0].metric, "step_time_change");
  const std::string& text = gpu->evidence[0].text;
  EXPECT_NE(text.find("at step 15 (change point of rank 2's GPU compute time per step, from "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("; the job's step time alone placed it at step 11)"), std::string::npos)
      << text;
  // From one stretched step to five (a longer burst is a level of its own), by 3 ms (two thirds
  // of the way to the new level) to 7 ms (past it): the step time alone placed the onset 1 to 5
  // steps early, the GPU time at the onset.
  for (int steps = 1; steps <= 5; ++steps) {
    for (int64_t delay : {3'000'000, 5'000'000, 7'000'000}) {
      const auto f = findFailSlow(build({1.25, 0, delay, steps}), DiagnoseOptions{});
      ASSERT_TRUE(f.has_value()) << steps << " " << delay;
      EXPECT_EQ(f->step, static_cast<size_t>(kOnset)) << steps << " " << delay;
      EXPECT_LT(f->job_step, static_cast<size_t>(kOnset)) << steps << " " << delay;
      EXPECT_EQ(f->rank, 2) << steps << " " << delay;
    }
  }
  // Bursts elsewhere: four steps 6-3 before the onset stretched by 5 ms, where the step time
  // alone placed it at the burst (6 early); two steps 5-4 before it by 20 ms, or three just after
  // it, where it placed it one late (no split fits between the burst and the onset, or the burst
  // takes the split after it). The GPU time places it at step 15.
  for (const auto& [from, steps, delay, job_step] :
       {std::tuple{9, 4, 5'000'000, 9}, std::tuple{10, 2, 20'000'000, 16},
        std::tuple{16, 3, 20'000'000, 16}}) {
    const auto f = findFailSlow(build({1.25, 0, delay, steps, from}), DiagnoseOptions{});
    ASSERT_TRUE(f.has_value()) << from;
    EXPECT_EQ(f->job_step, static_cast<size_t>(job_step)) << from;
    EXPECT_EQ(f->step, static_cast<size_t>(kOnset)) << from;
    EXPECT_EQ(f->rank, 2) << from;
  }
}

TEST(OwnChange, SlowerLinkFromMidRunReadsAsTheBusBandwidthReduction) {
  // 9.5 ms from the last arrival before, 9.5 / 0.8 after: busbw at 80%.
  const JobModel m = build({1.0, 2'375'000});
  // No GPU's compute time moved: the onset is the step time's own change point.
  const auto fail = findFailSlow(m, DiagnoseOptions{});
  ASSERT_TRUE(fail.has_value());
  EXPECT_EQ(fail->step, static_cast<size_t>(kOnset));
  EXPECT_EQ(fail->rank, -1);
  const auto c = ownBusbwChange(m, DiagnoseOptions{}, {2});
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->ratio, 0.8, 0.002);
  EXPECT_NEAR(1 - c->ratio, 0.20, 0.002);
}

TEST(OwnChange, NoChangePointNoOwnMagnitude) {
  const JobModel m = build({});
  EXPECT_FALSE(ownComputeChange(m, DiagnoseOptions{}, 2).has_value());
  EXPECT_FALSE(ownBusbwChange(m, DiagnoseOptions{}, {2}).has_value());
}

}  // namespace
}  // namespace flare::engine
