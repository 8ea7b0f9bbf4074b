// Magnitudes against a rank's own steps before a change point (own_change.h) on hand-built
// records: 8 ranks, 30 steps, ten GEMMs and one all-reduce of every rank per step. From step 15
// rank 2's GEMMs take 1.25× as long (its clock at 80%), or the all-reduce takes longer from the
// last arrival (a link at 80% of its bus bandwidth); every rank's step grows with it.
#include "src/engine/diagnosis/own_change.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flare/step.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"

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
};

// A per-(rank, step) wobble in {-0.2, ..., 0.2} ms.
int64_t wobble(int rank, int step) {
  return ((rank * 7 + step * 3) % 5 - 2) * 100'000;
}

flare::v1::RecordBatch rankBatch(int rank, const Fault& f) {
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  auto* marker = b.add_signatures();
  marker->set_id(1);
  marker->set_name(FLARE_STEP_MARKER_NAME);
  marker->set_kind(flare::v1::OP_KIND_SYNC);
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
    auto* m = b.add_kernels();
    m->set_signature_id(1);
    m->set_issue_ns(t0);
    m->set_start_ns(t0);
    m->set_end_ns(t0);
    // The slowest rank's GEMMs end the compute; everyone's all-reduce then runs 9.5 ms (+ the
    // link's extra) from that last arrival, and the step ends 0.5 ms later.
    const double slow = after ? f.gemm_factor : 1.0;
    const auto last_arrival = static_cast<int64_t>(2'000'000 + kKernels * kGemmNs * slow);
    const int64_t ar_end = t0 + last_arrival + 9'500'000 + (after ? f.link_extra_ns : 0);
    int64_t gpu = t0 + 2'000'000;
    for (int k = 0; k < kKernels; ++k) {
      const auto dur =
          static_cast<int64_t>(kGemmNs * (rank == 2 ? slow : 1.0)) + wobble(rank, s) / 20;
      auto* op = b.add_kernels();
      op->set_signature_id(2);
      op->set_stream_id(7);
      op->set_issue_ns(t0 + 1'000'000 + k * 100'000);
      op->set_start_ns(gpu);
      op->set_end_ns(gpu + dur);
      gpu += dur;
    }
    auto* op = b.add_kernels();
    op->set_signature_id(3);
    op->set_stream_id(7);
    op->set_issue_ns(t0 + 1'500'000);
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

TEST(OwnChange, SlowerLinkFromMidRunReadsAsTheBusBandwidthReduction) {
  // 9.5 ms from the last arrival before, 9.5 / 0.8 after: busbw at 80%.
  const JobModel m = build({1.0, 2'375'000});
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
