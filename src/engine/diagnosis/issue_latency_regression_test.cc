// issue_latency_regression against a baseline run, on hand-built records: 4 ranks, 8 step
// markers 30 ms apart, 10 kernels a step whose issue latency (start - issue) is known. Only a
// distribution that moved lower (the GPU starting ops sooner after their issue: it waited for
// its host) is a regression; one that moved higher (the host further ahead) is not.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flare/step.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

constexpr int64_t kStepNs = 30'000'000;

// Kernel k's issue latency in the healthy run: 1 ms + k * 0.8 ms (1 to 8.2 ms), plus `shift`.
flare::v1::RecordBatch rankBatch(int rank, int64_t shift) {
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  *b.add_signatures() = testing::stepMarkerSig(1);
  *b.add_signatures() = testing::kernelSig(2, "elementwise_kernel");
  for (int s = 0; s < 8; ++s) {
    const int64_t t0 = 1'000'000'000 + s * kStepNs;
    auto* m = b.add_kernels();
    m->set_signature_id(1);
    m->set_issue_ns(t0);
    m->set_start_ns(t0);
    m->set_end_ns(t0);
    for (int k = 0; k < 10; ++k) {
      const int64_t start = t0 + 10'000'000 + k * 1'000'000;
      auto* op = b.add_kernels();
      op->set_signature_id(2);
      op->set_stream_id(7);
      op->set_issue_ns(start - (1'000'000 + k * 800'000 + shift));
      op->set_start_ns(start);
      op->set_end_ns(start + 900'000);
    }
  }
  return b;
}

JobModel build(int64_t shift) {
  JobModel m;
  for (int r = 0; r < 4; ++r) m.addBatch(r, rankBatch(r, shift));
  return m;
}

std::vector<Diagnosis> regressions(const JobModel& job, const JobModel& baseline) {
  std::vector<Diagnosis> out;
  for (Diagnosis& d : diagnose(job, DiagnoseOptions{}, &baseline)) {
    if (d.kind == "issue_latency_regression") out.push_back(std::move(d));
  }
  return out;
}

TEST(IssueLatencyRegression, LowerLatenciesAreARegressionHigherOnesAreNot) {
  const JobModel baseline = build(0);
  EXPECT_TRUE(regressions(build(0), baseline).empty());
  // The host 0.9 ms later for every kernel (a synchronization drained the queue): named.
  const auto lower = regressions(build(-900'000), baseline);
  ASSERT_EQ(lower.size(), 1u);
  EXPECT_EQ(lower[0].team, Team::kAlgorithm);
  ASSERT_FALSE(lower[0].evidence.empty());
  EXPECT_NE(lower[0].evidence[0].text.find("below the healthy baseline's by W1"), std::string::npos)
      << lower[0].evidence[0].text;
  // The host 2 ms further ahead (more work queued on the GPU): the lower half of the clipped
  // distribution moved up by as much, which the full W1 counted; not a regression.
  EXPECT_TRUE(regressions(build(2'000'000), baseline).empty());
}

}  // namespace
}  // namespace flare::engine
