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
#include "src/stats/perf_model.h"

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
  // ... and it must be above the other ranks' median in so many steps that the one-sided sign
  // test's p-value times the number of ranks is at most this (docs/metrics.md).
  double idle_steps_alpha = 0.05;
  // Paired per-step stall test: a rank whose host issued each step's work later than the other
  // ranks' median for that step in so many steps that the one-sided sign test's p-value times
  // the number of ranks (Bonferroni) is at most `stall_paired_alpha`, by a median of at least
  // `stall_paired_min_share` of the step time and above the Tukey fence of the ranks' median
  // delays (docs/metrics.md).
  double stall_paired_alpha = 0.01;
  double stall_paired_min_share = 0.025;
  double v_inter_threshold = 0.25;
  // Fixed V_minority threshold, used without a baseline or healthy history: above what eager
  // PyTorch transformers reach when healthy (46-48% on the H200 fixtures; docs/metrics.md).
  double v_minority_threshold = 0.60;
  // With a healthy baseline, the void thresholds are learned from it instead: the baseline's
  // largest per-rank median plus max(this, 1.5 × IQR of its per-step values).
  double void_learned_min_delta = 0.05;
  // un-optimized GEMM (docs/metrics.md): a shape is held to the best of the job's alike aligned
  // GEMMs (same dtype, flops per call and arithmetic intensity within this factor), after the
  // ranks' warm-up. A misaligned shape's median call below misaligned_ratio × theirs; an aligned
  // shape's fast calls (10th percentile) below ratio × theirs.
  double unoptimized_alike_factor = 2.0;
  double unoptimized_misaligned_ratio = 0.9;
  double unoptimized_ratio = 0.5;
  // ... or achieved < peak ratio × the shape's expected TFLOPS on the ranks' device (the peak
  // table's model, stats/perf_model.h), when the device is known. `peaks` null: the built-in
  // table (flared --device-peak adds entries).
  double unoptimized_peak_ratio = 0.3;
  const stats::PeakTable* peaks = nullptr;
  uint64_t unoptimized_min_flops = 1'000'000'000;
  // Issue-latency regression against a baseline: alarm above max(floor, the largest W1 between
  // a baseline rank and the baseline's other ranks).
  double regression_w1_floor_ns = 20'000;
  // When > 0: the healthy spread measured between several healthy baseline runs
  // (healthyIssueLatencySpread, design.md's "largest W1 between healthy runs"); the threshold is
  // then regression_spread_factor × it instead of the one-baseline proxy above (still floored by
  // regression_w1_floor_ns). Factor 2: a new healthy run within W1 r of the healthy runs lies
  // within 2r of the reference run (triangle inequality), and the largest W1 among a few
  // baselines estimates r, not 2r (docs/metrics.md).
  double regression_healthy_spread_ns = 0;
  double regression_spread_factor = 2.0;
  // And never below this share of the baseline's median issue latency (the clipping cap): healthy
  // reruns on a loaded host moved the clipped W1 by up to 5% of it (docs/metrics.md).
  double regression_relative_floor = 0.08;
  // Fail-slow entry: a step-time change point of at least this relative size, with at least
  // this many steps on each side.
  double fail_slow_min_relative = 0.05;
  size_t fail_slow_min_steps = 3;
  // Jitter window (intermittent slowness, no level shift): steps whose time exceeds both the
  // series' far-out Tukey fence (Q3 + 3·IQR) and (1 + jitter_min_relative) × its median; at
  // least jitter_min_spikes of them, at most jitter_max_share of the steps.
  double jitter_min_relative = 0.10;
  size_t jitter_min_spikes = 3;
  double jitter_max_share = 0.4;
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

// A throughput fail-slow: the job's step time (median over ranks) rose by at least
// `fail_slow_min_relative` at step `step` (a mean-shift change point, flare_stats).
struct FailSlow {
  size_t step = 0;
  double before_ns = 0;
  double after_ns = 0;
};
std::optional<FailSlow> findFailSlow(const JobModel& job, const DiagnoseOptions& options);

// A jitter window: the job's step time (same series) spikes in a minority of steps while its
// level does not move (a flapping link, a GPU that throttles now and then). `steps` are the
// spike steps (job step numbering, warm-up step 0); the GPU and network culprit detectors then
// look at those steps only (JobModel::onlySteps), where the cause lives.
struct Jitter {
  std::vector<size_t> steps;
  double median_ns = 0;  // of every step
  double spike_ns = 0;   // median of the spike steps
  double fence_ns = 0;   // the threshold a spike passed
};
std::optional<Jitter> findJitter(const JobModel& job, const DiagnoseOptions& options);

// Per rank, per step (the first skipped), over the GPU ops the rank issued in that step: the mean
// host issue offset (issue time − the rank's own step start: how late its host issued the step's
// work) and the mean issue latency, in ns; aligned across ranks by step start time (each rank's
// step is matched to the nearest step start of the lowest rank within half a step; NaN where a
// rank has no match). Also the median step time over ranks and steps (0 when fewer than three
// boundaries).
struct StepIssueLatency {
  std::vector<int> ranks;                    // ascending
  std::vector<std::vector<double>> offsets;  // [rank index][step]
  std::vector<std::vector<double>> means;    // [rank index][step] issue latency
  std::vector<std::vector<double>> idle;     // [rank index][step] GPU idle (step − GPU busy)
  double median_step_ns = 0;
};
StepIssueLatency stepIssueLatency(const JobModel& job);

// The paired per-step stall test of one rank (index into `s.ranks`): a one-sided sign test over
// the steps of (own mean issue offset − the peers' median): a host that stalls issues the same
// work later than its peers in every step. `p_adjusted` = p × number of ranks (Bonferroni).
// `latency_shift_ns` is the median over steps of (peers' median − own mean issue latency),
// reported as evidence: its sign depends on whether the GPU's queue absorbed the stall.
struct PairedStall {
  size_t steps = 0;
  size_t later = 0;             // steps where the rank issued later than its peers
  double p_value = 1;           // one-sided sign test
  double p_adjusted = 1;        // × ranks (Bonferroni), capped at 1
  double median_delay_ns = 0;   // median over steps of (own offset − peers' median)
  double latency_shift_ns = 0;  // median over steps of (peers' median − own issue latency)
};
PairedStall pairedStallTest(const StepIssueLatency& s, size_t rank_index);
// The same test for every rank (index into `s.ranks`), the same results, in O(steps · n log n)
// (stats::excessOverPeersAll) instead of O(steps · n²): what the detector runs.
std::vector<PairedStall> pairedStallTests(const StepIssueLatency& s);

// The largest W1 between the pooled issue-latency samples (each rank's first step left out) of
// any two of `baselines`, every sample clipped at the median of the first baseline's — the
// regression detector's clipping. 0 with fewer than two baselines with 30 or more samples.
double healthyIssueLatencySpread(const std::vector<const JobModel*>& baselines);

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
