// Detectors: from a job's records (job_model.h) to diagnoses a team can act on — which rank,
// which kernel or API, which metric proved it, and who should fix it.
//
// Every detector compares like with like, inside the job: the same GEMM signature across ranks
// (a slow GPU), communicators doing the same collective of the same size (a slow link), each
// rank's issue-latency distribution against the other ranks' (a host-side stall), the job's
// best GEMM efficiency (an un-optimized shape), and per-step void percentages against
// thresholds. Comparisons with healthy history (baselines) use the same functions with the
// baseline's model as the reference. Definitions and thresholds: docs/metrics.md.
//
// Culprits, not victims: in a synchronous job every rank waits for the slowest, so step time
// alone names no one. A slow GPU shows as slower kernels on that rank only, and that rank
// arrives last at collectives; a slow link shows as low bus bandwidth measured from the last
// arrival (so waiting is not counted) on exactly the communicators that contain it.
//
// Plain functions over an immutable model: thread-compatible, no state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/stats/perf_model.h"

namespace flare::engine {

enum class Team { kOperations, kAlgorithm, kInfrastructure };
const char* teamName(Team team);

struct Evidence {
  std::string metric;  // "gemm_duration", "busbw", "issue_latency_w1", "v_inter", ...
  std::string text;    // readable: what was measured against what
  double value = 0;
  double reference = 0;
};

struct Diagnosis {
  std::string kind;  // gpu_slow, link_slow, issue_stall, void_inter, void_minority,
                     // unoptimized_gemm, issue_latency_regression
  Team team = Team::kInfrastructure;
  std::string cause;  // "GPU", "network", "host stall", "input pipeline", ...
  std::vector<int> ranks;
  std::string summary;  // one line a person can read
  std::vector<Evidence> evidence;
  double severity = 0;  // relative effect (0.25 = 25% slower / lower)
};

struct DiagnoseOptions {
  int min_samples = 3;            // per rank and signature
  double tukey_alpha = 1.5;       // fence Q3 + alpha·IQR
  double gpu_min_effect = 0.05;   // a GPU must be at least this much slower
  double link_min_effect = 0.15;  // a communicator's busbw at least this much lower
  double issue_w1_floor_ns = 20'000;
  double idle_min_share = 0.08;  // a stalled rank's extra GPU idle time, share of the step
  double v_inter_threshold = 0.25;
  double v_minority_threshold = 0.30;
  double unoptimized_ratio = 0.6;  // achieved < ratio × the job's best GEMM efficiency
  // ... or achieved < peak ratio × the shape's expected TFLOPS on the ranks' device (the peak
  // table's model, stats/perf_model.h), when the device is known. `peaks` null: the built-in
  // table (flared --device-peak adds entries).
  double unoptimized_peak_ratio = 0.3;
  const stats::PeakTable* peaks = nullptr;
  uint64_t unoptimized_min_flops = 1'000'000'000;
  // Issue-latency regression against a baseline: alarm above max(floor, the largest W1 between
  // a baseline rank and the baseline's other ranks).
  double regression_w1_floor_ns = 20'000;
  // Fail-slow entry: a step-time change point of at least this relative size, with at least
  // this many steps on each side.
  double fail_slow_min_relative = 0.05;
  size_t fail_slow_min_steps = 3;
};

// Per-rank arrival statistics at collectives (complete instances only).
struct ArrivalStats {
  uint64_t instances = 0;
  uint64_t last = 0;        // instances where this rank's collective kernel started last
  double mean_wait_ns = 0;  // mean (this rank's duration) over its instances
};
std::map<int, ArrivalStats> collectiveArrivals(const JobModel& job);
// "arrives last at X% of its collectives (n of m)" for `rank`; nullopt when it took part in none.
std::optional<Evidence> arrivalEvidence(const std::map<int, ArrivalStats>& arrivals, int rank);

// nccl-tests bus-bandwidth factor of a wire collective kind over n ranks (src/engine/stats).
double busBandwidthFactor(flare::v1::CollectiveKind kind, int n);

// A throughput fail-slow: the job's step time (median over ranks) rose by at least
// `fail_slow_min_relative` at step `step` (a mean-shift change point, flare_stats).
struct FailSlow {
  size_t step = 0;
  double before_ns = 0;
  double after_ns = 0;
};
std::optional<FailSlow> findFailSlow(const JobModel& job, const DiagnoseOptions& options);

// Issue latencies (start − issue, ns) of a rank's GPU ops issued after its warm-up step (the
// first step; every op when the rank has no step boundaries).
std::vector<double> rankIssueLatencies(const JobModel& job, int rank);

// Void percentages of one rank: medians over its steps (the first skipped) of V_inter and
// V_minority (docs/metrics.md). Ranks with fewer than 3 step boundaries are absent.
struct VoidStats {
  double v_inter = 0;
  double v_minority = 0;
  size_t steps = 0;
};
std::map<int, VoidStats> voidPerRank(const JobModel& job);

// Traced Python API calls and host synchronization calls per GPU op, by name.
struct ApiRates {
  std::map<std::string, double> spans;
  std::map<std::string, double> syncs;
};
ApiRates apiRates(const JobModel& job);

// `baseline`: a healthy run's model (flare-diagnose --baseline). `history`: stored healthy runs of
// the job's backend and scale (flared): issue-latency regression with the learned threshold, and
// void thresholds learned from history in place of the configured ones.
std::vector<Diagnosis> diagnose(const JobModel& job, const DiagnoseOptions& options,
                                const JobModel* baseline = nullptr,
                                const History* history = nullptr);

// "[operations] rank 3: GPU slow — ..." lines, one per diagnosis (and its evidence indented).
std::string formatDiagnoses(const std::vector<Diagnosis>& diagnoses);
// {"diagnoses":[{"kind","team","cause","severity","ranks","summary","evidence":[...]}]}
std::string diagnosesToJson(const std::vector<Diagnosis>& diagnoses);
// One diagnosis as the JSON object of the list above.
std::string diagnosisToJson(const Diagnosis& d);

}  // namespace flare::engine
