// Property: every StepStats a rank's StepAccumulator emits passes flared's validation. The first
// real-GPU run died of one that did not (step 0's T_inter measured from the last set-up op, 41x
// its step), which cost the batch and then the rank. Random jobs shaped like PyTorch's: long
// set-up before the first step, evaluation and checkpoint pauses, long GC pauses, slow DataLoader
// calls, steps with no GPU work, slow first launches, a second launching thread (autograd) and a
// stream that lags several steps. Ops reach the accumulator in the poller's order (when their
// call has returned and they have completed), with or without the Tracer's watermark.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "flare/v1/records.pb.h"
#include "src/engine/ingest.h"
#include "src/engine/ingest_validate.h"
#include "src/records/step_accumulator.h"
#include "src/records/step_stats_wire.h"

namespace flare::engine {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kBase = 1'750'000'000LL * 1'000'000'000LL;  // 2025, epoch ns

struct Job {
  struct Op {
    int64_t issue, start, end, arrives;
    bool kernel;
    uint64_t thread;
  };
  struct Host {
    int64_t start, end;
    uint64_t thread;
    std::string name;
    bool loader;
  };
  std::vector<Op> ops;
  std::vector<Host> host;
  std::vector<int64_t> markers;
  size_t boundaries = 0;  // step boundaries the job has (markers, else DataLoader calls)
};

Job makeJob(std::mt19937_64& rng) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  Job job;
  const bool markers = chance(0.2);
  const bool lagging = chance(0.3);  // GPU work longer than the host's: the stream lags steps
  const bool many_apis = chance(0.2);
  int64_t host = kBase + uni(0, 1000 * kMs);
  int64_t stream_free[2] = {0, 0};
  int next_kernel = 0;
  std::vector<bool> launched(64, false);
  auto launch = [&](uint64_t thread, int stream, int64_t dur, bool kernel) {
    const int kid = next_kernel++ % 64;
    int64_t call = uni(2'000, 20'000);
    if (!launched[kid]) {  // a kernel's first launch: lazy loading, cuBLAS heuristics, JIT
      launched[kid] = true;
      if (chance(0.5)) call = uni(10 * kMs, 500 * kMs);
    }
    const int64_t issue = host;
    // Issue latencies as the clock map gives them: now and then slightly negative.
    const int64_t start = std::max(issue + uni(-20'000, 30'000), stream_free[stream]);
    const int64_t end = start + dur;
    stream_free[stream] = end;
    job.ops.push_back({issue, start, end, std::max(end, issue + call), kernel, thread});
    host += call + uni(1'000, 10'000);
  };
  // Set-up: model to the GPU, warm-up copies; seconds of it, or none.
  if (chance(0.8)) {
    const int n = static_cast<int>(uni(10, 200));
    for (int i = 0; i < n; ++i) {
      launch(1, 0, uni(5'000, 2 * kMs), chance(0.3));
      if (chance(0.05)) host += uni(10 * kMs, 500 * kMs);
    }
    host += uni(500 * kMs, 3000 * kMs);
  }
  const int steps = static_cast<int>(uni(3, 30));
  for (int s = 0; s < steps; ++s) {
    if (markers) job.markers.push_back(host);
    if (!markers || chance(0.7)) {
      const int64_t load = chance(0.15) ? uni(100 * kMs, 2000 * kMs) : uni(20'000, 2 * kMs);
      job.host.push_back({host, host + load, 1, "torch.utils.data@__next__", true});
      host += load;
    }
    launch(1, 0, uni(10'000, 200'000), false);  // the batch's H2D copy
    const bool idle = chance(0.1);              // a step with no GPU work after its input
    const int n = idle ? 0 : static_cast<int>(uni(0, 60));
    for (int i = 0; i < n; ++i) {
      if (chance(0.03)) {  // a long GC pause before a launch
        const int64_t gc = uni(50 * kMs, 800 * kMs);
        job.host.push_back({host, host + gc, 1, "gc@collect", false});
        host += gc;
      }
      if (many_apis) {  // TRACED_PYTHON_API with many (long-named) functions, nested
        const int64_t call = uni(20'000, 200'000);
        const int depth = static_cast<int>(uni(1, 6));
        for (int d = 0; d < depth; ++d) {
          job.host.push_back({host + d, host + call - d, 1,
                              "model.layers." + std::to_string(uni(0, 399)) +
                                  std::string(static_cast<size_t>(uni(0, 1)) * 1200, 'x') +
                                  "@forward",
                              false});
        }
        host += call;
      }
      const int64_t dur = lagging ? uni(200'000, 3 * kMs) : uni(5'000, 300'000);
      launch(i % 3 == 2 ? 2 : 1, i % 5 == 4 ? 1 : 0, dur, chance(0.3));  // thread 2: autograd
    }
    if (chance(0.2)) {  // loss.item(): the host waits for the GPU
      const int64_t until = std::max(host, std::max(stream_free[0], stream_free[1]));
      job.host.push_back({host, until + 1000, 1, "cudaStreamSynchronize", false});
      host = until + 1000;
    }
    if (chance(0.1)) {  // evaluation: host time, a little GPU work
      host += uni(100 * kMs, 2000 * kMs);
      for (int i = 0; i < 5; ++i) launch(1, 0, uni(5'000, 100'000), true);
    }
    if (chance(0.05)) host += uni(1000 * kMs, 5000 * kMs);  // torch.save: no GPU work
  }
  // One more boundary closes the last step.
  if (markers) {
    job.markers.push_back(host);
    job.boundaries = job.markers.size();
  } else {
    job.host.push_back({host, host + 1000, 1, "torch.utils.data@__next__", true});
    job.boundaries = std::count_if(job.host.begin(), job.host.end(),
                                   [](const Job::Host& h) { return h.loader; });
  }
  return job;
}

TEST(StepValidationProperty, EveryStepStatsTheRankEmitsPassesTheDaemonsValidation) {
  const TimeLimits limits{1'577'836'800LL * 1'000'000'000LL, kBase + 86400LL * 1'000'000'000LL * 30,
                          86400LL * 1'000'000'000LL};
  size_t steps_checked = 0, full_causes = 0, negative = 0, waited = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Job job = makeJob(rng);
    const bool watermark = seed % 2 == 0;
    // Arrivals in time order: an op when its call returned and it completed, a host event at its
    // end, a marker at its time. Kind: 0 op, 1 host event, 2 marker.
    struct Arrival {
      int64_t at;
      int kind;
      size_t index;
    };
    std::vector<Arrival> arrivals;
    for (size_t i = 0; i < job.ops.size(); ++i) arrivals.push_back({job.ops[i].arrives, 0, i});
    for (size_t i = 0; i < job.host.size(); ++i) arrivals.push_back({job.host[i].end, 1, i});
    for (size_t i = 0; i < job.markers.size(); ++i) arrivals.push_back({job.markers[i], 2, i});
    std::stable_sort(arrivals.begin(), arrivals.end(),
                     [](const Arrival& a, const Arrival& b) { return a.at < b.at; });
    // The oldest issue among ops arriving at or after each arrival.
    std::vector<int64_t> later_issue(arrivals.size() + 1, INT64_MAX);
    for (size_t a = arrivals.size(); a-- > 0;) {
      later_issue[a] = later_issue[a + 1];
      if (arrivals[a].kind == 0)
        later_issue[a] = std::min(later_issue[a], job.ops[arrivals[a].index].issue);
    }
    records::StepAccumulator acc;
    std::vector<records::StepResult> got;
    // Run-queue readings of the issuing threads, the counter growing by up to twice the time
    // since the thread's previous reading (a counter read across a thread-id reuse, or a
    // kernel's own accounting, may run ahead of the clock): the step's figure is clipped.
    std::map<uint64_t, std::pair<int64_t, int64_t>> counter;  // thread → (t, waited)
    std::uniform_real_distribution<double> share(0.0, 2.0);
    for (size_t a = 0; a < arrivals.size(); ++a) {
      const Arrival& x = arrivals[a];
      if (x.kind == 0) {
        const Job::Op& op = job.ops[x.index];
        acc.addGpuOp(op.issue, op.start, op.end, op.kernel, op.thread);
        auto [c, fresh] = counter.try_emplace(op.thread, x.at, 0);
        if (!fresh && x.at > c->second.first) {
          c->second.second +=
              static_cast<int64_t>(share(rng) * static_cast<double>(x.at - c->second.first));
          c->second.first = x.at;
        }
        acc.addRunQueueWait(op.thread, c->second.first, c->second.second);
      } else if (x.kind == 1) {
        const Job::Host& h = job.host[x.index];
        acc.addHostEvent(h.start, h.end, h.thread, h.name);
        if (h.loader) acc.addLoaderSpan(h.start, h.end);
      } else {
        acc.addStepMarker(job.markers[x.index]);
      }
      if (watermark) {
        // The Tracer's: every op issued before it has arrived (calls still in flight hold it).
        acc.setWatermark(std::min(x.at, later_issue[a + 1]));
      }
      if (a % 7 == 0)
        for (auto& r : acc.take(false)) got.push_back(std::move(r));
    }
    for (auto& r : acc.take(true)) got.push_back(std::move(r));
    // Every step is present, and every one passes.
    ASSERT_EQ(got.size(), job.boundaries - 1);
    for (size_t i = 0; i < got.size(); ++i) {
      v1::StepStats wire;
      records::encodeStepStats(
          got[i], [](int64_t t) { return t; }, &wire);
      Reason reason = Reason::kCount;
      const std::string error = stepStatsError(wire, limits, &reason);
      ASSERT_EQ(error, "") << "step " << i << " of " << got.size() << " [" << wire.start_ns()
                           << ", " << wire.end_ns() << "): inter " << wire.inter_ns() << ", busy "
                           << wire.gpu_busy_ns() << ", minority " << wire.minority_ns();
      ++steps_checked;
      full_causes += wire.causes_size() == records::StepStats::kMaxHostCauses ? 1 : 0;
      negative += wire.issue_latency_sum_ns() < 0 ? 1 : 0;
      waited += wire.has_run_queue_wait_ns() && wire.run_queue_wait_ns() > 0 ? 1 : 0;
    }
  }
  EXPECT_GT(steps_checked, 3000u);
  EXPECT_GT(full_causes, 0u);  // steps with more distinct causes than flared takes were cut
  EXPECT_GT(negative, 0u);     // and steps whose issue latencies came out mostly negative
  EXPECT_GT(waited, steps_checked / 2);  // most steps carry a run-queue wait, all within range
}

}  // namespace
}  // namespace flare::engine
