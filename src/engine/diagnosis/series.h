// Series of a job's window for plots (`flare report --html`, GET /api/v1/jobs/{job}/series):
// per rank × step the step time and the void percentages, the issue-latency distribution as
// quantiles (the job's, each rank's, and a baseline job's when one is given), and per signature
// and rank the count, GPU time, median duration and TFLOPS.
//
// Definitions follow the detectors (detectors.h, docs/metrics.md): steps are the intervals
// between a rank's consecutive step starts (explicit markers, else DataLoader `__next__` starts);
// the first interval of the window is the warm-up the detectors skip (it is still reported);
// issue latencies are those of GPU ops issued after the warm-up; V_inter is the GPU gap around
// the step's DataLoader call over the step time; V_minority is the time in OP_KIND_KERNEL ops
// (neither GEMM, attention nor communication) over the rest of the step.
//
// Output is bounded: at most `max_steps` steps (the window's last ones), `max_ranks` ranks
// (`priority_ranks` first, then the lowest ids), `max_signatures` signatures (by GPU time) and
// `quantile_points` quantiles per distribution; what was cut is reported (`truncated`).
//
// Plain functions over an immutable model: thread-compatible, no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/engine/diagnosis/job_model.h"

namespace flare::engine {

struct SeriesOptions {
  size_t max_steps = 256;
  size_t max_ranks = 128;
  size_t max_signatures = 32;
  size_t quantile_points = 101;  // evenly spaced probabilities 0..1, at least 2
  std::vector<int> priority_ranks;
};

// Hard limits a request may not exceed (the HTTP route clamps to them).
inline constexpr size_t kSeriesMaxSteps = 2048;
inline constexpr size_t kSeriesMaxRanks = 512;
inline constexpr size_t kSeriesMaxSignatures = 256;
inline constexpr size_t kSeriesMaxQuantilePoints = 1001;

// One rank's row: values for steps [JobSeries::first_step, first_step + step_count); NaN where
// the rank has no such step (or, for V_minority, no time outside the inter-step gap).
struct RankSteps {
  int rank = 0;
  std::vector<double> step_ns;
  std::vector<double> v_inter;
  std::vector<double> v_minority;
  std::vector<double> run_queue_wait_ns;  // the issuing thread's wait for a CPU (summary mode)
};

struct LatencyQuantiles {
  uint64_t samples = 0;
  std::vector<double> ns;  // at probabilities JobSeries::probabilities; empty without samples
};

struct SignatureRankStat {
  int rank = 0;
  uint64_t count = 0;
  double total_ns = 0;
  double p50_ns = 0;  // raw ops: their median; summaries only: count-weighted median of p50s
  double tflops = 0;  // GEMM/attention with known FLOPs; 0 otherwise
};

struct SignatureSeries {
  uint32_t sig = 0;  // JobModel::signatures() index
  uint64_t count = 0;
  double total_ns = 0;
  double tflops = 0;  // over all included ranks
  std::vector<SignatureRankStat> ranks;
};

struct JobSeries {
  size_t rank_count = 0;  // ranks in the window
  bool ranks_truncated = false;
  size_t total_steps = 0;  // the most steps any rank has in the window
  size_t first_step = 0;   // index (in the window) of the first reported step
  size_t step_count = 0;
  bool steps_truncated = false;
  std::vector<RankSteps> ranks;  // the included ranks, in inclusion order
  std::vector<double> probabilities;
  LatencyQuantiles latency;                                    // all ranks of the window
  std::vector<std::pair<int, LatencyQuantiles>> rank_latency;  // included ranks
  std::optional<LatencyQuantiles> baseline_latency;
  double baseline_w1_ns = 0;  // W1 between the job's and the baseline's issue latencies
  size_t signature_count = 0;
  bool signatures_truncated = false;
  std::vector<SignatureSeries> signatures;  // by total GPU time, largest first
};

JobSeries computeSeries(const JobModel& job, const SeriesOptions& options,
                        const JobModel* baseline = nullptr);

// {"jobId","window":{...},"ranks":[...],"steps":{...},"stepTimeNs":[[...]],"vInter":[[...]],
//  "vMinority":[[...]],"issueLatency":{...},"signatures":[...]} — the layout is documented in
// docs/daemon-protocol.md ("HTTP API"). NaN is written as null.
std::string seriesToJson(const std::string& job_id, const JobModel& job, const JobSeries& series,
                         const std::string& baseline_job = "");

}  // namespace flare::engine
