// Signals: what the detectors measure on a job (job_model.h), shared by every detector and by
// the modules that summarise a job without diagnosing it (history.cc's makeBaseline,
// job_metrics.cc, series.cc). One home for the step statistics read per rank (GPU idle, void
// percentages, issue latencies and their per-step pairing), collective arrival order, the
// job's step-time change points and jitter, host API rates and times, the kernel-summary index,
// and the text formats of the evidence.
//
// This module calls no detector: detectors (detector.h, one file per family) call it, never the
// other way round. Definitions: docs/metrics.md.
//
// Plain functions over an immutable model: thread-compatible, no state.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flare/v1/records.pb.h"
#include "src/engine/diagnosis/diagnosis.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/records/step_stats.h"
#include "src/stats/sketch.h"

namespace flare::engine {

// A collective instance that every member of its communicator took part in (`nranks` ops, at
// least 2): its members' ops, and which of them started last (the first such, in rank order).
struct CollectiveInstance {
  std::vector<std::pair<int, const Op*>> members;  // rank, op; ascending rank
  size_t last = 0;                                 // index into members
};
// The job's complete collective instances, by (communicator, sequence number).
std::vector<CollectiveInstance> completeCollectives(const JobModel& job);

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
// `fail_slow_min_relative` at step `step` (a mean-shift change point, flare_stats, that passed
// the tests of docs/metrics.md). The step time is wall time, which host contention stretches
// around the onset, moving the step time's own change point (`job_step`); a rank's GPU compute
// time is not stretched by it. When one rank's rose by at least half the job's rise, at most
// fail_slow_min_after steps before `job_step` or after it, `step` is where it rose (`rank` ≥ 0;
// docs/metrics.md, "Where it began").
struct FailSlow {
  size_t step = 0;
  double before_ns = 0;  // the job's mean step time before `step` (since the previous change)
  double after_ns = 0;   // and from `step` (to the next change, else the end)
  size_t job_step = 0;   // where the step time alone placed the change
  int rank = -1;         // the rank whose GPU compute time placed `step`; -1: none
  double rank_before_ns = 0, rank_after_ns = 0;  // its mean compute time per step either side
};
std::optional<FailSlow> findFailSlow(const JobModel& job, const DiagnoseOptions& options);

// A rank's GPU compute time per step (index s − 1 for step s ≥ 1; its step boundaries), to find
// where it changed: from raw ops the GEMM/attention time issued in the step; in MODE_SUMMARY its
// GPU busy time minus its collectives' time in the step (an estimate that waiting in collectives
// overlapping compute biases, so it only locates a change, never measures it). Host contention
// delays when the work is issued, not how long the GPU runs it. Steps without figures are 0;
// empty with fewer than three step boundaries, and in MODE_SUMMARY when step sampling left any
// of its steps out (no GPU figure there: the series is not known per step, and the change is
// placed by the job's step time alone).
std::vector<double> rankComputePerStep(const JobModel& job, int rank);

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
// boundaries). A step sampled out (FLARE_SAMPLE_STEPS) on any rank has every rank's offset from
// its collectives (collectiveIssueOffsets) and no issue latency or idle time.
struct StepIssueLatency {
  std::vector<int> ranks;                    // ascending
  std::vector<std::vector<double>> offsets;  // [rank index][step]
  std::vector<std::vector<double>> means;    // [rank index][step] issue latency
  std::vector<std::vector<double>> idle;     // [rank index][step] GPU idle (step − GPU busy)
  double median_step_ns = 0;
};
StepIssueLatency stepIssueLatency(const JobModel& job);

// The mean issue offset of a rank's collectives from its own step start, by the rank's step index
// (the index into `step_starts`, the step each was issued in; NaN: none issued): a host figure of
// every step, measured or sampled out by step sampling, as collectives are timed in every
// step and a host that pauses issues them late too. What the per-step stall tests compare in a
// step sampled out.
std::vector<double> collectiveIssueOffsets(const JobModel& job, int rank,
                                           const std::vector<int64_t>& step_starts);
// Per-step tables aligned on a grid of steps ([rank index][grid step], ranks in the order of
// `starts`; `rank_step[i][g]`: rank i's step index at grid step g, 0 for none): at every grid step
// sampled out on some rank (`sampled_out[g]`: the same steps on every rank of a job) each rank's
// `offsets` become its collectives' issue offsets (collectiveIssueOffsets), one figure for all,
// and `blanked` (GPU idle, issue latency) NaN.
void offsetsFromCollectivesWhereSampledOut(
    const JobModel& job, const std::map<int, std::vector<int64_t>>& starts,
    const std::vector<std::vector<size_t>>& rank_step, const std::vector<char>& sampled_out,
    std::vector<std::vector<double>>* offsets,
    std::initializer_list<std::vector<std::vector<double>>*> blanked);

// Each rank's step start times, for the ranks with at least three (two complete steps), and the
// durations of their steps without the first (warm-up) and the last, pooled over those ranks:
// what the per-step detectors align ranks by. `starts` is empty when fewer than three ranks have
// them.
struct RankStepStarts {
  std::map<int, std::vector<int64_t>> starts;
  std::vector<double> durations;
};
RankStepStarts rankStepStarts(const JobModel& job);

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
// first step; every op when the rank has no step boundaries), weighted by the steps each
// measured step stands for (issueLatencies' `weighted`): what a run is compared with history by.
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

// ---- kernel summaries (MODE_SUMMARY) ------------------------------------------------------------

// True when any rank of the job sent kernel summaries (MODE_SUMMARY): the detectors that need
// every op's times (issue stall, GPU idle / void, regression) are skipped for such a job.
bool hasSummaries(const JobModel& job);

// Each rank's summary windows grouped by signature, newest first within one, with each
// signature's count and duration over its windows: lets a detector go one signature at a time
// over every rank without holding every signature's values at once (at 10,000 ranks that was
// ~0.5 GB per pass, freed and faulted in again every pass).
struct SummaryIndex {
  struct Run {
    uint32_t sig;
    uint32_t lo, hi;  // [lo, hi) in `order`
    uint64_t count;
    double sum;
  };
  struct Rank {
    const RankData* data = nullptr;
    std::vector<std::pair<uint32_t, uint32_t>> order;  // (signature, window index), by signature
    std::vector<Run> runs;                             // by signature
    const Run* find(uint32_t sig) const;
    const SummaryWindow& window(uint32_t k) const { return data->summaries[order[k].second]; }
  };
  std::vector<Rank> ranks;     // in rank order
  std::vector<uint32_t> sigs;  // every signature indexed, ascending
};
// The windows whose signature `keep` selects (indexed by job-wide id); with `skip_warmup`, a
// rank's windows that start before its warm-up end are left out when it has later ones.
SummaryIndex indexSummaries(const JobModel& job, const std::vector<char>& keep, bool skip_warmup);

// ---- the building blocks the detectors share --------------------------------------------------
namespace signals {

double median(std::vector<double> v);  // stats::quantileInPlace(v, 0.5)
// 1.4826 · MAD: the noise's robust standard deviation (spikes and a shift in a minority of the
// values do not inflate it); 0 when empty.
double robustSigma(const std::vector<double>& v);
double wasserstein1(const std::vector<double>& a, const std::vector<double>& b);
// Q3 + alpha·IQR of `values` (stats::tukeyFences).
double tukeyUpperFence(const std::vector<double>& values, double alpha);
bool isCompute(flare::v1::OpKind kind);  // GEMM or attention
bool isGpuOp(flare::v1::OpKind kind);    // anything but a host synchronization call

// Evidence text: "1.234 ms", "12.3%", "45.6 TFLOPS", "[m,n,k] BF16", "0,1,2".
std::string fmtMs(double ns);
std::string fmtPct(double ratio);
std::string fmtNum(double v, const char* unit);
std::string shapeText(const flare::v1::Signature& sig);
std::string rankList(const std::vector<int>& ranks);
std::string stepList(const std::vector<size_t>& steps);  // "5,9,13": at most 12, then ",..."

// The end of a rank's warm-up: the start of its second step (first sightings, communicator
// set-up and pool growth make the first step unlike the others); INT64_MIN without step
// boundaries.
int64_t warmupEnd(const JobModel& job, int rank);

// The issue latencies of a rank's GPU ops issued after its warm-up step: from its raw ops, or
// in MODE_SUMMARY rebuilt from the per-step sketches it sent. At most `max_values` of them:
// beyond, an evenly spaced quantile sample (the values of rank ⌊(k + ½)·n / max_values⌋,
// ascending), which keeps the distribution a W1 or a median reads at a bounded size.
// `weighted` (step sampling): each measured step's latencies count as many times as the steps
// it stands for (ReceivedStep::weight; a folded bucket by its steps' mean weight), the job's
// distribution over all its steps, which what is compared with another run needs (the
// regression against a baseline or healthy history, the history's own sketch): unweighted, the
// steps measured before the timing budget chose K (every one) were a third of a 45-step job's
// sample. Unweighted, ranks measured at the same steps compare like with like (issue_stall).
std::vector<double> issueLatencies(const JobModel& job, const RankData& r,
                                   size_t max_values = SIZE_MAX, bool weighted = false);

// Per rank: median over steps (the first skipped) of the time no GPU op ran, and the median step
// time, from the per-step statistics (the rank's own in MODE_SUMMARY). Ranks without a complete
// step after the warm-up are absent.
std::map<int, std::pair<double, double>> idlePerStep(const JobModel& job);

// Per rank: median over steps (the first skipped) of the run-queue wait of its issuing thread
// (StepStats.run_queue_wait_ns: time runnable but without a CPU), from the steps that carry it
// (MODE_SUMMARY, sampled-out steps included; raw mode: placed from the rank's readings). Ranks
// with fewer than 3 such steps are absent.
std::map<int, double> runQueueWaitPerStep(const JobModel& job);

// Per traced API: the median over the rank's steps (the first skipped) of the host time its
// spans took inside the step (both modes send spans). The second way a stall's cause is named:
// on a real GPU the first kernel after a long host pause is not among the fastest-issued (it
// pays the GPU's wake-up), so the starved-kernel rule can miss a GC pause that the step's own
// time shows plainly.
std::map<std::string, double> apiTimePerStep(const JobModel& job, int rank);

// The kernels a stall starved (issue latency below `low`) and what held the host just before
// them: from the raw ops (for each starved kernel, the host gap since the previous launch on its
// thread; a traced Python span or host synchronization call that ended inside that gap and
// covers at least half of it is named) or, in MODE_SUMMARY, from the host causes the rank sent
// per step (the same rule, applied on the rank; counts by sketch bucket). An untraced stall — a
// sleep, an untraced API — names nothing, rather than a bystander.
struct Starved {
  size_t count = 0;
  std::vector<std::pair<std::string, int>> causes;  // most frequent first
};
Starved starvedBy(const JobModel& job, const RankData& r, double low);

// Per rank: V_inter and V_minority per step (the first skipped); ranks without a step after the
// warm-up are absent.
struct VoidSteps {
  std::vector<double> v_inter, v_minority;
};
std::map<int, VoidSteps> voidPerStep(const JobModel& job);

// Ranks that run on one GPU: those whose DeviceInfo.uuid (RankData::device_uuid) is the same,
// at least two per GPU, ranks ascending, GPUs by their first rank. Their GPU times hold each
// other's work (time-slicing), so GPU-time comparisons say nothing about them.
struct SharedGpu {
  std::string uuid;
  std::vector<int> ranks;
};
std::vector<SharedGpu> sharedGpus(const JobModel& job);

}  // namespace signals
}  // namespace flare::engine
