// What the detectors produce and how they are tuned: a Diagnosis (kind, team, culprit ranks,
// evidence), the options every detector reads (DiagnoseOptions), and the diagnoses as text and
// JSON. The detectors themselves: detector.h (the interface), registry.cc (the list),
// detectors.h (diagnose()).
//
// Plain values: thread-compatible, no state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

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
  std::string cause;       // "GPU", "network", "host stall", "input pipeline", ...
  std::vector<int> ranks;  // the culprit(s): the rank(s) at fault
  // Bystanders: ranks the fault slows (they share a slow communicator with the culprit, or wait
  // for it) that the evidence clears; named so that nobody chases them, never among `ranks`.
  std::vector<int> victims;
  std::string summary;  // one line a person can read
  std::vector<Evidence> evidence;
  double severity = 0;  // relative effect (0.25 = 25% slower / lower)
};

struct DiagnoseOptions {
  int min_samples = 3;           // per rank and signature
  double tukey_alpha = 1.5;      // fence Q3 + alpha·IQR
  double gpu_min_effect = 0.05;  // a GPU must be at least this much slower
  // A communicator's busbw more than this much below its peers' (the median of the others), and
  // more than link_spread_sigmas × the robust relative spread of the job's peer groups of at
  // least 4 communicators, is slow (docs/metrics.md).
  double link_min_effect = 0.07;
  double link_spread_sigmas = 3.0;
  // A member of a slow communicator is cleared (a victim, not the culprit) when another
  // communicator it is in runs within this share of its peers' busbw (and within
  // link_clear_sigmas × that spread).
  double link_clear_margin = 0.04;
  double link_clear_sigmas = 2.0;
  // A communicator with no peer (pure data parallelism; a job-wide all-reduce beside TP and DP
  // groups) is compared with healthy history (flared) or the baseline run (flare-diagnose
  // --baseline) instead: slow when its job busbw for a collective signature only it runs is more
  // than this share below that of every healthy run (the baseline's). Larger than
  // link_min_effect: two runs of a job may land on different nodes and links.
  double link_history_min_effect = 0.2;
  // With several baseline runs (flare-diagnose --baseline, given more than once): per collective
  // signature (signatureKey), the lowest job busbw over the runs that measured one, and how many
  // did (lowestBaselineBusbw in job_metrics.h). The reference in place of the first baseline's,
  // as flared takes the slowest of its history runs.
  std::map<std::string, std::pair<double, uint32_t>> link_baseline_busbw;
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
  // ... and a misaligned shape also to aligned GEMMs no easier than it: fewer flops per call
  // (down to 1/this of its) and no more flops per byte.
  double unoptimized_harder_factor = 4.0;
  double unoptimized_misaligned_ratio = 0.9;
  double unoptimized_ratio = 0.5;
  // ... or achieved < peak ratio × the shape's expected TFLOPS on the ranks' device (the peak
  // table's model, stats/perf_model.h), when the device is known. `peaks` null: the built-in
  // table (flared --device-peak adds entries).
  double unoptimized_peak_ratio = 0.3;
  // ... only for a shape whose expected call (flops ÷ its expected TFLOPS) takes at least this
  // long: a pair of CUDA events around a library call on an idle GPU also times the library's
  // host work before its launch, which a short GEMM cannot be told from (torch.compile's tiny
  // GPT on the H200, tests/fixtures/gpu/compile: 1 GFLOP GEMMs timed at 20-25 us, ~1.5 us at
  // the device's expected TFLOPS, every call on an idle GPU).
  double unoptimized_device_min_expected_ns = 20'000;
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
  // ... and it is evidence (and narrows the detectors' window) only when it passes its tests
  // (docs/metrics.md): the steps since are slower than the steps before by a one-sided
  // Mann-Whitney test at level fail_slow_alpha, the shift of the median is at least
  // fail_slow_min_sigmas robust standard deviations (1.4826·MAD) of the steps before, and the
  // new level holds.
  double fail_slow_alpha = 0.01;
  double fail_slow_min_sigmas = 3.0;
  // ... at least this share of the steps since lie above the midpoint of the shift, and there
  // are at least fail_slow_min_after of them (a burst of host hiccups at the end of the window
  // is a few steps).
  double fail_slow_min_held = 0.7;
  size_t fail_slow_min_after = 5;
  // Jitter window (intermittent slowness, no level shift): steps whose time exceeds both the
  // series' far-out Tukey fence (Q3 + 3·IQR) and (1 + jitter_min_relative) × its median; at
  // least jitter_min_spikes of them, at most jitter_max_share of the steps.
  double jitter_min_relative = 0.10;
  size_t jitter_min_spikes = 3;
  double jitter_max_share = 0.4;
  // A spike also passes jitter_min_sigmas robust standard deviations of the series above its
  // median, and counts only when its excess is within jitter_alike_factor of the spikes' median
  // excess (a recurring cause recurs at one size; host noise spikes come in every size).
  double jitter_min_sigmas = 6.0;
  double jitter_alike_factor = 2.0;
  // ... and, where the spike steps have collectives, the rank arriving last in most of them is
  // the same beyond chance: one-sided binomial test against 1/ranks, × ranks, at this level.
  double jitter_alpha = 0.05;
};

// "[operations] rank 3: GPU slow — ..." lines, one per diagnosis (and its evidence indented).
std::string formatDiagnoses(const std::vector<Diagnosis>& diagnoses);
// {"diagnoses":[{"kind","team","cause","severity","ranks","victims","summary","evidence":[...]}]}
std::string diagnosesToJson(const std::vector<Diagnosis>& diagnoses);
// One diagnosis as the JSON object of the list above.
std::string diagnosisToJson(const Diagnosis& d);

}  // namespace flare::engine
