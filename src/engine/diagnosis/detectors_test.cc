#include "src/engine/diagnosis/detectors.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "src/engine/diagnosis/job_model.h"

namespace flare::engine {
namespace {

// 8 ranks, 24 steps of 10 ms marked by StepMarkers, 6 GEMMs of 1 ms per step and rank. In
// `slow_steps` rank 3's GEMMs take `factor` ms and every rank's step grows by the difference
// (the others wait for it at the step's end).
JobModel jitteryJob(const std::set<size_t>& slow_steps, double factor, double noise = 0.0) {
  JobModel job;
  const int64_t ms = 1'000'000;
  for (int rank = 0; rank < 8; ++rank) {
    flare::v1::RecordBatch b;
    auto* sig = b.add_signatures();
    sig->set_id(1);
    sig->set_name("cublasGemmEx");
    sig->set_kind(flare::v1::OP_KIND_GEMM);
    sig->set_dtype(flare::v1::DTYPE_BF16);
    sig->add_shape(4096);
    sig->add_shape(4096);
    sig->add_shape(4096);
    sig->set_flops_per_call(2ull * 4096 * 4096 * 4096);
    int64_t t = 0;
    for (size_t step = 0; step < 24; ++step) {
      auto* st = b.add_steps();
      st->set_step(step);
      st->set_start_ns(t);
      const bool slow = slow_steps.count(step) > 0;
      const int64_t gemm = slow && rank == 3 ? static_cast<int64_t>(factor * ms) : ms;
      for (int i = 0; i < 6; ++i) {
        auto* k = b.add_kernels();
        k->set_signature_id(1);
        k->set_stream_id(7);
        k->set_issue_ns(t + i * ms / 4);
        k->set_start_ns(t + ms + i * gemm);
        k->set_end_ns(t + ms + (i + 1) * gemm);
      }
      const double wiggle =
          noise * (static_cast<int>((step * 7919 + 13) % 11) - 5) / 5.0;  // deterministic ±noise
      t += static_cast<int64_t>(10 * ms * (1 + wiggle)) +
           (slow ? static_cast<int64_t>(6 * (factor - 1) * ms) : 0);
    }
    job.addBatch(rank, b);
  }
  return job;
}

TEST(Jitter, IntermittentlySlowGpuIsFoundInItsSpikeSteps) {
  const std::set<size_t> slow = {5, 9, 13, 17, 21};
  const JobModel job = jitteryJob(slow, 1.5);
  const auto j = findJitter(job, DiagnoseOptions{});
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(std::set<size_t>(j->steps.begin(), j->steps.end()), slow);
  EXPECT_NEAR(j->median_ns, 10e6, 1e3);  // 18 of 23 steps at 10 ms
  EXPECT_NEAR(j->spike_ns, 13e6, 1e3);   // + 6 × 0.5 ms
  // Over the whole window rank 3's median GEMM is the healthy 1 ms (5 slow steps of 23): only the
  // spike steps show it.
  const auto found = diagnose(job, DiagnoseOptions{});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "gpu_slow");
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
  ASSERT_FALSE(found[0].evidence.empty());
  EXPECT_EQ(found[0].evidence[0].metric, "step_time_jitter");
  EXPECT_NE(found[0].evidence[0].text.find("5 steps (5,9,13,17,21)"), std::string::npos);
  // The restricted model holds those steps only.
  const JobModel only = job.onlySteps(j->steps);
  EXPECT_EQ(only.ranks().at(3).ops.size(), 5u * 6u);
}

TEST(Jitter, SteadyNoiseAndLevelShiftsAreNotJitter) {
  // ±4% step-time noise and no slow step: nothing.
  EXPECT_FALSE(findJitter(jitteryJob({}, 1.0, 0.04), DiagnoseOptions{}).has_value());
  EXPECT_TRUE(diagnose(jitteryJob({}, 1.0, 0.04), DiagnoseOptions{}).empty());
  // Two spikes: below jitter_min_spikes.
  EXPECT_FALSE(findJitter(jitteryJob({6, 15}, 1.5), DiagnoseOptions{}).has_value());
  // Slow from step 10 on: a level shift (the fail-slow change point's job), not jitter.
  std::set<size_t> tail;
  for (size_t s = 10; s < 24; ++s) tail.insert(s);
  EXPECT_FALSE(findJitter(jitteryJob(tail, 1.5), DiagnoseOptions{}).has_value());
}

}  // namespace
}  // namespace flare::engine
