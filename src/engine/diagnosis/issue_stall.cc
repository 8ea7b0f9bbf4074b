// Detector issue_stall: a host-side kernel-issue stall. A rank whose host falls behind starves
// its GPU: its issue-latency distribution moves toward zero (pooled W1 against the other ranks',
// Tukey fence), its GPU idles in the steps (median and a sign test over the steps), or its host
// issues each step's work later than its peers (the paired per-step test); the cause is the
// traced API that held the host before the starved kernels, or whose host time per step exceeds
// the other ranks' (docs/metrics.md). A rank already named GPU-slow is not named: its slow GPU
// shifts its own host timing, which these signals can read as a stall. A stall whose cost is
// mostly run-queue wait beyond the other ranks' (the issuing thread runnable but without a CPU;
// both modes measure it: records::runQueueWaitIn) is reported as cpu_contention, for operations.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/stats/paired.h"
#include "src/stats/quantile.h"
#include "src/stats/wasserstein.h"

namespace flare::engine {
namespace {

using namespace signals;

// Up to this many ranks, a rank's issue latencies are compared with the other ranks' exactly;
// beyond, with every rank's pooled, each rank represented by a quantile sample of this size.
constexpr size_t kExactPeerRanks = 128;
constexpr size_t kRankLatencySample = 256;
// Up to kExactPeerRanks ranks, each rank's issue latencies are compared with the other ranks'
// exactly (leave-one-out), from at most this many values a rank (a quantile sample beyond: a
// summary-mode rank of 1,000 ops a step holds ~120,000 in a 120 s window).
constexpr size_t kExactRankSample = 8192;

void detectIssueStall(const JobModel& job, const DiagnoseOptions& opt,
                      const std::map<int, ArrivalStats>& arrivals, std::vector<Diagnosis>* out) {
  // A large job compares each rank with every rank's pooled distribution instead of the other
  // ranks' (a 1/n difference), from a bounded quantile sample of each rank: O(n) instead of
  // O(n² × ops) — 10,000 ranks of 120 steps' sketches in well under a second.
  const bool pooled_reference = job.ranks().size() > kExactPeerRanks;
  const size_t cap = pooled_reference
                         ? std::max<size_t>(kRankLatencySample,
                                            static_cast<size_t>(std::max(opt.min_samples * 10, 1)))
                         : kExactRankSample;
  std::map<int, std::vector<double>> lat;
  for (const auto& [rank, r] : job.ranks()) {
    auto v = issueLatencies(job, r, cap);
    if (static_cast<int>(v.size()) >= opt.min_samples * 10) lat[rank] = std::move(v);
  }
  if (lat.size() < 3) return;
  // Every rank's sample, ascending; each rank's own sorted too. Below kExactPeerRanks a rank is
  // compared with the others' values (the pool without its own: leave-one-out, O(pool) a rank
  // by stats::wasserstein1LeaveOneOut instead of building and sorting the others' values for
  // every rank — at 128 summary-mode ranks of a 120 s window that took ~70 s a pass).
  std::vector<double> pooled;
  for (auto& [rank, v] : lat) {
    std::sort(v.begin(), v.end());
    pooled.insert(pooled.end(), v.begin(), v.end());
  }
  std::sort(pooled.begin(), pooled.end());
  std::map<int, double> score;
  std::map<int, double> others_median;
  for (auto& [rank, v] : lat) {
    if (pooled_reference) {
      // W1 by the midpoint rule: the rank's i-th of m sorted values against the pooled
      // quantile at (i + ½)/m.
      double w1 = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        const double q = (static_cast<double>(i) + 0.5) / static_cast<double>(v.size());
        w1 += std::abs(v[i] - stats::quantileSorted(pooled, q));
      }
      score[rank] = w1 / static_cast<double>(v.size());
      others_median[rank] = stats::quantileSorted(pooled, 0.5);
      continue;
    }
    others_median[rank] = stats::quantileLeaveOneOut(pooled, v, 0.5);
    score[rank] = stats::wasserstein1LeaveOneOut(pooled, v);
  }
  std::vector<double> scores;
  for (const auto& [rank, s] : score) scores.push_back(s);
  const double fence = tukeyUpperFence(scores, opt.tukey_alpha);
  // Second signal: GPU idle time per step. The stalled rank's GPU has nothing to run while its
  // host is stuck; its peers' GPUs are not idle but waiting inside a collective kernel.
  const auto idle = idlePerStep(job);
  double idle_fence = 0, idle_floor = 0, idle_median = 0;
  {
    std::vector<double> values, steps;
    for (const auto& [rank, v] : idle) {
      values.push_back(v.first);
      steps.push_back(v.second);
    }
    idle_fence = values.size() >= 3 ? tukeyUpperFence(values, opt.tukey_alpha) : 0;
    idle_median = values.empty() ? 0 : median(values);
    idle_floor = steps.empty() ? 0 : opt.idle_min_share * median(steps);
  }
  // Third signal, paired by step: a small stall in every step lowers this rank's mean issue
  // latency below its peers' in (nearly) every step, though not enough to move the pooled W1
  // beyond the ranks' spread (docs/metrics.md).
  const StepIssueLatency per_step = stepIssueLatency(job);
  std::map<int, PairedStall> paired;
  std::vector<double> delays;
  const std::vector<PairedStall> tests = pairedStallTests(per_step);
  for (size_t i = 0; i < per_step.ranks.size(); ++i) {
    paired[per_step.ranks[i]] = tests[i];
    delays.push_back(tests[i].median_delay_ns);
  }
  // The idle signal must hold step by step too: a stalled host idles its GPU in (nearly) every
  // step, while on a shared host the scheduler's delays land on one rank in some steps and on
  // another in others, and one rank's median can exceed the others' by chance.
  std::map<int, stats::SignTestResult> idle_steps;
  {
    const auto excess = stats::excessOverPeersAll(per_step.idle, 2);
    for (size_t i = 0; i < per_step.ranks.size(); ++i)
      idle_steps[per_step.ranks[i]] = stats::signTest(excess[i]);
  }
  // The rank's median delay must also stand out from the ranks' (Tukey fence): on a shared host
  // one rank's process may be scheduled a little later in every step, consistently but by no more
  // than the others differ among themselves.
  const double delay_fence =
      delays.size() >= 3 ? tukeyUpperFence(delays, opt.tukey_alpha) : INFINITY;
  std::optional<Starved> all_starved;  // pooled_reference: every rank's, summed
  std::optional<std::map<int, std::map<std::string, double>>> api_time;  // apiTimePerStep
  std::optional<std::map<int, double>> run_queue;                        // runQueueWaitPerStep
  std::map<std::string, int> all_counts;
  for (const auto& [rank, s] : score) {
    const double floor = std::max(opt.issue_w1_floor_ns, 0.2 * std::abs(others_median[rank]));
    const double own_median = median(lat[rank]);
    const bool latency_outlier = s > fence && s > floor && own_median < others_median[rank];
    const PairedStall* pair = paired.count(rank) ? &paired.at(rank) : nullptr;
    const bool paired_outlier =
        pair != nullptr && pair->p_adjusted <= opt.stall_paired_alpha &&
        pair->median_delay_ns >= opt.stall_paired_min_share * per_step.median_step_ns &&
        pair->median_delay_ns > delay_fence;
    double idle_excess = 0;
    bool idle_outlier = false;
    if (auto it = idle.find(rank); it != idle.end() && idle.size() >= 3) {
      double others_idle = idle_median;  // pooled_reference: every rank's
      if (!pooled_reference) {
        std::vector<double> others;
        for (const auto& [o, v] : idle) {
          if (o != rank) others.push_back(v.first);
        }
        others_idle = median(others);
      }
      idle_excess = it->second.first - others_idle;
      const auto steps = idle_steps.find(rank);
      idle_outlier = it->second.first > idle_fence && idle_excess > idle_floor &&
                     steps != idle_steps.end() &&
                     steps->second.p_value * static_cast<double>(per_step.ranks.size()) <=
                         opt.idle_steps_alpha;
    }
    if (!latency_outlier && !idle_outlier && !paired_outlier) continue;
    // The starved kernels: issued when the GPU had nothing queued (issue latency below the
    // other ranks' 5th percentile).
    const double low = pooled_reference ? stats::quantileSorted(pooled, 0.05)
                                        : stats::quantileLeaveOneOut(pooled, lat[rank], 0.05);
    const RankData& r = job.ranks().at(rank);
    const Starved starved = starvedBy(job, r, low);
    Diagnosis d;
    d.kind = "issue_stall";
    d.team = Team::kAlgorithm;
    d.cause = "host stall";
    d.ranks = {rank};
    d.severity = s / std::max(1.0, std::abs(others_median[rank]));
    d.evidence.push_back({"issue_latency_w1",
                          "issue-latency distribution W1 " + fmtMs(s) +
                              " from the other ranks (fence " + fmtMs(fence) + "); median " +
                              fmtMs(own_median) + " vs " + fmtMs(others_median[rank]),
                          s, fence});
    if (pair != nullptr && pair->steps > 0 && (paired_outlier || pair->p_adjusted <= 0.5)) {
      // Shown as supporting evidence also when the paired test alone does not reach its level;
      // then it says so, and its effect does not raise the severity (severity follows the tests
      // that hold: an alert is never more severe than its significant evidence).
      char text[400];
      std::snprintf(
          text, sizeof(text),
          "its host issued each step's work later than the other ranks' median in %zu of "
          "%zu steps, by %.3f ms per step (median; %.1f%% of the step; issue latency %.3f "
          "ms lower); sign test p = %.2g, x%zu ranks = %.2g (%s %.2g)",
          pair->later, pair->steps, pair->median_delay_ns / 1e6,
          per_step.median_step_ns > 0 ? 100 * pair->median_delay_ns / per_step.median_step_ns : 0.0,
          pair->latency_shift_ns / 1e6, pair->p_value, per_step.ranks.size(), pair->p_adjusted,
          paired_outlier ? "significant at" : "supporting only: not significant on its own at",
          opt.stall_paired_alpha);
      d.evidence.push_back({"issue_delay_paired", text, pair->median_delay_ns,
                            opt.stall_paired_min_share * per_step.median_step_ns});
      if (paired_outlier && per_step.median_step_ns > 0)
        d.severity = std::max(d.severity, pair->median_delay_ns / per_step.median_step_ns);
    }
    if (idle_excess > 0) {
      std::string steps_text;
      if (auto t = idle_steps.find(rank); t != idle_steps.end() && t->second.n > 0) {
        char buf[128];
        std::snprintf(buf, sizeof(buf), " (above them in %zu of %zu steps, sign test p = %.2g%s)",
                      t->second.positive, t->second.n, t->second.p_value,
                      idle_outlier ? "" : "; supporting only");
        steps_text = buf;
      }
      d.evidence.push_back({"gpu_idle",
                            "GPU idle " + fmtMs(idle.at(rank).first) + " per step, " +
                                fmtMs(idle_excess) + " more than the other ranks' median" +
                                steps_text,
                            idle.at(rank).first, idle.at(rank).first - idle_excess});
    }
    d.evidence.push_back({"starved_kernels",
                          std::to_string(starved.count) +
                              " kernels issued to an idle GPU (issue "
                              "latency below the other ranks' 5th percentile, " +
                              fmtMs(low) + ")",
                          static_cast<double>(starved.count), 0});
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    // A cause is named when it precedes this rank's starved kernels clearly more often than
    // it precedes the other ranks' low-latency kernels (a per-step loss.item() drains every
    // rank's GPU alike and is not this rank's problem).
    std::map<std::string, int> other_counts;
    size_t other_starved = 0;
    if (pooled_reference) {
      // One `low` for every rank: the job's totals once, this rank's own taken out.
      if (!all_starved) {
        all_starved.emplace();
        for (const auto& [o, ro] : job.ranks()) {
          const Starved low_ops = starvedBy(job, ro, low);
          all_starved->count += low_ops.count;
          for (const auto& [name, n] : low_ops.causes) all_counts[name] += n;
        }
      }
      other_starved = all_starved->count - starved.count;
      other_counts = all_counts;
      for (const auto& [name, n] : starved.causes) other_counts[name] -= n;
    } else {
      for (const auto& [o, ro] : job.ranks()) {
        if (o == rank) continue;
        const Starved low_ops = starvedBy(job, ro, low);
        other_starved += low_ops.count;
        for (const auto& [name, n] : low_ops.causes) other_counts[name] += n;
      }
    }
    std::string named;
    for (const auto& [name, n] : starved.causes) {
      const double share =
          starved.count == 0 ? 0 : static_cast<double>(n) / static_cast<double>(starved.count);
      const double other_share =
          other_starved ? static_cast<double>(other_counts[name]) / other_starved : 0;
      if (share >= 0.25 && share >= 2 * other_share) {
        named = name;
        d.evidence.push_back({"api_before",
                              named + " held the host just before " + std::to_string(n) + " of " +
                                  std::to_string(starved.count) + " starved kernels (" +
                                  fmtPct(other_share) + " on the other ranks)",
                              share, other_share});
        break;
      }
    }
    // What the stall costs a step: the larger of its excess GPU idle and its paired issue delay
    // (a pause a deep GPU queue absorbs idles the GPU little but delays the issue by its length).
    const double stall_cost =
        std::max({idle_excess, pair != nullptr ? pair->median_delay_ns : 0.0, 0.0});
    if (named.empty() && stall_cost > 0) {
      // The most specific traced API (the smallest that qualifies: a GC pause rather than the
      // backward() call around it) whose host time per step exceeds the other ranks' by at
      // least half what the stall costs a step (H200, 2026-11-27: DataLoader.__next__, 0.03 ms
      // longer a step than elsewhere, was named for a 5.5 ms sleep because it was "100% of" an
      // excess GPU idle of 0.001 ms).
      if (!api_time) {
        api_time.emplace();
        for (const auto& [o, ro] : job.ranks()) (*api_time)[o] = apiTimePerStep(job, o);
      }
      const auto& mine = api_time->at(rank);
      double best_excess = INFINITY, best_others = 0;
      for (const auto& [name, ns] : mine) {
        std::vector<double> others;
        for (const auto& [o, times] : *api_time) {
          if (o == rank && !pooled_reference) continue;
          const auto t = times.find(name);
          others.push_back(t == times.end() ? 0.0 : t->second);
        }
        const double others_ns = others.empty() ? 0.0 : median(others);
        const double excess = ns - others_ns;
        if (excess >= 0.5 * stall_cost && excess < best_excess) {
          best_excess = excess;
          best_others = others_ns;
          named = name;
        }
      }
      if (!named.empty()) {
        d.evidence.push_back(
            {"api_time",
             named + " held the host " + fmtMs(mine.at(named)) + " per step on this rank vs " +
                 fmtMs(best_others) + " on the other ranks (median): " +
                 fmtPct(std::min(1.0, best_excess / stall_cost)) + " of the " + fmtMs(stall_cost) +
                 (stall_cost == idle_excess ? " of extra GPU idle" : " of issue delay") +
                 " per step",
             mine.at(named), best_others});
      }
    }
    d.summary = "rank " + std::to_string(rank) +
                ": kernel-issue stall on the host — its GPU runs dry while the host is busy" +
                (named.empty() ? std::string(" (no traced API ran just before; trace GC and "
                                             "suspects with TRACED_PYTHON_API)")
                               : " (likely cause: " + named + ")");
    // CPU contention: the host fell behind because its issuing thread waited for a CPU (run
    // queue), not because the training code kept it busy — at least half of what the stall
    // cost is run-queue wait beyond the other ranks'. The cost is the larger of its excess GPU
    // idle and its paired delay: a 5 ms host pause a deep GPU queue absorbs idles the GPU
    // 0.18 ms a step but delays the issue 3.6 ms, and 0.18 ms of extra wait explains the first
    // only (the matrix's stall-5ms-16 read cpu_contention). The machine's to fix (operations),
    // whatever the code did meanwhile.
    if (!run_queue) run_queue = runQueueWaitPerStep(job);
    const auto mine = run_queue->find(rank);
    if (mine == run_queue->end() && !run_queue->empty()) {
      // Other ranks were measured, this one not (its schedstat unreadable: flare status counts
      // run_queue_unmeasured): say what could not be ruled out.
      d.summary += "; its run-queue wait was not measured, so CPU contention is not ruled out";
    }
    if (mine != run_queue->end() && run_queue->size() >= 2) {
      std::vector<double> others;
      for (const auto& [o, w] : *run_queue)
        if (o != rank) others.push_back(w);
      const double others_wait = median(others);
      const double excess_wait = mine->second - others_wait;
      const double cost = stall_cost;
      if (excess_wait > 0 && cost > 0 && excess_wait >= 0.5 * cost) {
        d.kind = "cpu_contention";
        d.team = Team::kOperations;
        d.cause = "CPU contention";
        d.evidence.insert(
            d.evidence.begin(),
            {"run_queue_wait",
             "its issuing thread waited for a CPU " + fmtMs(mine->second) +
                 " per step (run queue, median) vs " + fmtMs(others_wait) +
                 " on the other ranks: " + fmtPct(std::min(1.0, excess_wait / cost)) + " of the " +
                 fmtMs(cost) + (cost == idle_excess ? " of extra GPU idle" : " of issue delay") +
                 " per step",
             mine->second, others_wait});
        d.summary = "rank " + std::to_string(rank) + ": its host waits for a CPU — " +
                    fmtMs(excess_wait) +
                    " per step more than the other ranks', which starves its GPU; the machine's "
                    "CPUs are oversubscribed for this rank (other processes, too few cores per "
                    "rank, or its CPU affinity)";
      }
    }
    out->push_back(std::move(d));
  }
}

class IssueStallDetector final : public Detector {
 public:
  std::string_view name() const override { return "issue_stall"; }
  std::vector<std::string_view> kinds() const override { return {"issue_stall", "cpu_contention"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kRecent;
    n.cites_window = true;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    // MODE_SUMMARY: GPU idle time and issue latencies come from the per-step statistics the
    // ranks sent (JobModel::stepStats, issueLatencies), the same definitions as from raw ops.
    detectIssueStall(view.job(), view.options(), view.arrivals(), &out);
    // A rank named GPU-slow is not also named host-stalled: its slow GPU shifts its own host
    // timing and GPU idle pattern (the host waits on it at blocking calls, its collectives wait
    // less), which the stall signals can read as a stall; the slow GPU is the cause
    // (docs/metrics.md).
    std::set<int> slow_gpus;
    for (const Diagnosis& d : view.earlier()) {
      if (d.kind == "gpu_slow") slow_gpus.insert(d.ranks.begin(), d.ranks.end());
    }
    std::erase_if(out, [&](const Diagnosis& d) {
      return d.ranks.size() == 1 && slow_gpus.count(d.ranks[0]) > 0;
    });
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeIssueStallDetector() {
  return std::make_unique<IssueStallDetector>();
}

}  // namespace flare::engine
