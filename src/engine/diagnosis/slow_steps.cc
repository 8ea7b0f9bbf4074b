// Detector slow_steps: sparse and intermittent faults (one step in N, bursts): a rank whose host
// pauses every Nth step (a periodic GC, a checkpoint), or whose GPU is slow in some steps only.
// Such a fault moves neither a rank's medians nor the job's step-time level, so the other
// detectors, which compare typical values, do not see it; it shows as a minority of slow steps.
//
// 1. The job's slow steps: the job's step time per step (median over ranks of each rank's step,
//    steps matched across ranks by start time, the warm-up step left out) above both the median
//    + kSigmas robust deviations (1.4826·MAD) and (1 + kMinRelative) × the median; at least
//    kMinSlow of them and at most kMaxShare of the steps (more is a level: issue_stall's or
//    gpu_slow's).
// 2. Each slow step is attributed to at most one rank, from that step's own figures:
//    - host: the rank whose host issued the step's work latest against its peers (mean issue
//      offset from its own step start minus the peers' median, as the paired stall test), or
//      whose GPU idled longest against its peers; it must account for at least kMinShareOfExtra
//      of the step's extra time and be at least twice the next rank's. In a step sampled out by
//      FLARE_SAMPLE_STEPS (no GPU figure but its time) the issue offset is that of the rank's
//      collectives, which are timed in every step, and idle time is not compared;
//    - GPU: else, the rank that arrived last at most of the step's collectives and whose GPU
//      time outside collectives rose against its own normal steps by at least kMinShareOfExtra
//      of the step's extra time.
// 3. A rank is named when, among the slow steps that have a culprit and are alike to its own
//    (extra time at least 1/kAlikeFactor of its median: a recurring cause costs about the same
//    each time, and the machine's smaller slow steps are another population), it caused more
//    than half, at least kMinSlow, holding at least half of all slow steps' extra time, and the
//    binomial test of that count against the chance 1/ranks of being the one gives
//    p × ranks ≤ kAlpha (Bonferroni). The diagnosis is issue_stall (host; algorithm team) or
//    gpu_slow (GPU; operations), with the steps, their period when every Nth step, the extra time
//    per slow step and the share of job time lost. A rank an earlier detector already named for
//    the same kind is not named again (a continuous stall is issue_stall's).
//
// Both modes: the per-step statistics (JobModel::stepStats: the rank's own in MODE_SUMMARY) and
// the collectives (raw in both modes). docs/metrics.md, "Sparse faults".

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/stats/outliers.h"
#include "src/stats/paired.h"

namespace flare::engine {
namespace {

using namespace signals;

constexpr double kMinRelative = 0.10;      // a slow step is at least 10% above the median step
constexpr double kSigmas = 5;              // ... and this many robust deviations (1.4826·MAD)
constexpr size_t kMinSlow = 3;             // slow steps, and steps attributed to the culprit
constexpr double kMaxShare = 0.5;          // of the steps slow: more is a level, not sparse
constexpr double kMinShareOfExtra = 0.25;  // the culprit's lateness against the step's extra time
constexpr double kAlpha = 0.05;            // binomial test × ranks
constexpr double kAlikeFactor = 2.0;       // slow steps alike to the culprit's: extra ≥ 1/this

// The per-step figures of every rank on one grid of steps (the lowest rank's steps, the first
// skipped; each rank's step matched to the nearest grid step start within half a step).
struct StepTable {
  std::vector<int> ranks;
  std::vector<size_t> step;                  // [g] the step number (the lowest rank's index)
  std::vector<std::vector<double>> time;     // [rank][g] step duration, NaN: no match
  std::vector<std::vector<double>> offset;   // [rank][g] mean issue offset of its GPU ops
                                             // (of its collectives in a sampled-out step)
  std::vector<std::vector<double>> idle;     // [rank][g] step − GPU busy
  std::vector<std::vector<double>> compute;  // [rank][g] GPU busy − its collectives' time
  std::vector<std::vector<size_t>> last;     // [rank][g] collectives it arrived last at
  std::vector<std::vector<size_t>> member;   // [rank][g] collectives it took part in
};

StepTable buildTable(const JobModel& job) {
  StepTable t;
  RankStepStarts rs = rankStepStarts(job);
  if (rs.starts.empty()) return t;
  const std::map<int, std::vector<int64_t>>& starts = rs.starts;
  const double tolerance = 0.5 * median(std::move(rs.durations));
  const std::vector<int64_t>& ref = starts.begin()->second;
  const size_t n = ref.size() - 2;
  for (size_t g = 0; g < n; ++g) t.step.push_back(g + 1);
  // Per rank: its step index -> grid step (SIZE_MAX: none).
  std::map<int, std::vector<size_t>> grid_of;
  for (const auto& [rank, s] : starts) {
    std::vector<size_t>& to_grid = grid_of[rank];
    to_grid.assign(s.size(), SIZE_MAX);
    for (size_t g = 0; g < n; ++g) {
      // The rank's complete step (not its first) starting nearest the grid's: the boundaries
      // are sorted, so the nearest is one of the two around it (binary search).
      size_t best = 0;
      double best_dist = INFINITY;
      const auto at = std::lower_bound(s.begin(), s.end(), ref[g + 1]);
      const size_t hi = static_cast<size_t>(at - s.begin());
      for (size_t i : {hi == 0 ? size_t{0} : hi - 1, hi}) {
        if (i < 1 || i + 1 >= s.size()) continue;
        const double d = std::abs(static_cast<double>(s[i] - ref[g + 1]));
        if (d < best_dist) {
          best_dist = d;
          best = i;
        }
      }
      if (best != 0 && best_dist <= tolerance) to_grid[best] = g;
    }
  }
  // Collectives: each complete instance's last arrival (its kernel started last), by step;
  // instances with a member without matched steps are left out.
  std::vector<CollectiveInstance> instances = completeCollectives(job);
  std::erase_if(instances, [&starts](const CollectiveInstance& c) {
    return std::any_of(c.members.begin(), c.members.end(),
                       [&starts](const auto& m) { return !starts.count(m.first); });
  });
  std::map<int, size_t> index;
  for (const auto& [rank, s] : starts) {
    index[rank] = t.ranks.size();
    t.ranks.push_back(rank);
  }
  const size_t nr = t.ranks.size();
  auto nan_rows = [&] { return std::vector<std::vector<double>>(nr, std::vector<double>(n, NAN)); };
  t.time = nan_rows();
  t.offset = nan_rows();
  t.idle = nan_rows();
  t.compute = nan_rows();
  t.last.assign(nr, std::vector<size_t>(n, 0));
  t.member.assign(nr, std::vector<size_t>(n, 0));
  // The grid step of a time on a rank's clock (SIZE_MAX: outside its matched steps).
  auto gridAt = [&](int rank, int64_t ts) {
    const auto& s = starts.at(rank);
    auto it = std::upper_bound(s.begin(), s.end(), ts);
    if (it == s.begin() || it == s.end()) return SIZE_MAX;
    return grid_of.at(rank)[static_cast<size_t>(it - s.begin()) - 1];
  };
  std::vector<std::vector<double>> collective_ns(nr, std::vector<double>(n, 0.0));
  for (const CollectiveInstance& c : instances) {
    for (const auto& [rank, op] : c.members) {
      const size_t g = gridAt(rank, op->start);
      if (g == SIZE_MAX) continue;
      const size_t i = index.at(rank);
      ++t.member[i][g];
      if (rank == c.members[c.last].first) ++t.last[i][g];
      // Its time inside the step (a collective may run past the step's end).
      const auto& s = starts.at(rank);
      const auto next = std::upper_bound(s.begin(), s.end(), op->start);
      const int64_t end = next == s.end() ? op->end : std::min(op->end, *next);
      collective_ns[i][g] += static_cast<double>(std::max<int64_t>(0, end - op->start));
    }
  }
  std::vector<char> sampled_out(n, 0);
  for (const auto& [rank, s] : starts) {
    const size_t i = index.at(rank);
    for (const records::StepStats& st : job.stepStats(rank, /*with_sampled_out=*/true)) {
      if (st.step <= 0 || static_cast<size_t>(st.step) >= s.size()) continue;
      const size_t g = grid_of.at(rank)[static_cast<size_t>(st.step)];
      if (g == SIZE_MAX) continue;
      const double dur = static_cast<double>(st.end_ns - st.start_ns);
      t.time[i][g] = dur;
      if (st.sampled_out) {  // FLARE_SAMPLE_STEPS: its time only (idle, compute unknown)
        sampled_out[g] = 1;
        continue;
      }
      t.idle[i][g] = dur - static_cast<double>(st.gpu_busy_ns);
      t.compute[i][g] = static_cast<double>(st.gpu_busy_ns) - collective_ns[i][g];
      if (st.gpu_ops > 0) t.offset[i][g] = st.issue_offset_sum_ns / static_cast<double>(st.gpu_ops);
    }
  }
  // A step sampled out (on any rank) is compared by its collectives' issue offsets on every
  // rank, and by no rank's idle time.
  std::vector<std::vector<size_t>> rank_step(nr, std::vector<size_t>(n, 0));
  for (const auto& [rank, s] : starts) {
    for (size_t k = 1; k < s.size(); ++k) {
      if (const size_t g = grid_of.at(rank)[k]; g != SIZE_MAX) rank_step[index.at(rank)][g] = k;
    }
  }
  offsetsFromCollectivesWhereSampledOut(job, starts, rank_step, sampled_out, &t.offset, {&t.idle});
  return t;
}

// The largest and second-largest finite value of `v` and the index of the largest.
struct Top2 {
  size_t at = SIZE_MAX;
  double first = -INFINITY, second = -INFINITY;
};
Top2 top2(const std::vector<double>& v) {
  Top2 t;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) continue;
    if (v[i] > t.first) {
      t.second = t.first;
      t.first = v[i];
      t.at = i;
    } else if (v[i] > t.second) {
      t.second = v[i];
    }
  }
  return t;
}

// Each rank's excess over its peers' median at grid step g (NaN where it has no value).
std::vector<double> excessAt(const std::vector<std::vector<double>>& rows, size_t g) {
  // One block (this step) of stats::excessOverPeersAll: O(ranks · log ranks), not ranks².
  std::vector<std::vector<double>> column(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) column[i] = {rows[i][g]};
  const auto excess = stats::excessOverPeersAll(column, 2);
  std::vector<double> out(rows.size(), NAN);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!excess[i].empty()) out[i] = excess[i][0];
  }
  return out;
}

enum class Cause { kNone, kHost, kGpu };

struct Attribution {
  size_t rank_index = SIZE_MAX;
  Cause cause = Cause::kNone;
  double lateness_ns = 0;  // the host's excess issue offset or idle, or the GPU's extra time
};

// The period of `steps` (ascending): the common difference when at least two thirds of the
// differences are equal; 0 when none.
size_t periodOf(const std::vector<size_t>& steps) {
  if (steps.size() < 3) return 0;
  std::map<size_t, size_t> diffs;
  for (size_t i = 1; i < steps.size(); ++i) diffs[steps[i] - steps[i - 1]]++;
  const auto best = std::max_element(
      diffs.begin(), diffs.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const size_t n = steps.size() - 1;
  return best->first > 1 && 3 * best->second >= 2 * n ? best->first : 0;
}

void detectSlowSteps(const JobModel& job, const std::vector<Diagnosis>& earlier,
                     const std::map<int, ArrivalStats>& arrivals, std::vector<Diagnosis>* out) {
  const StepTable t = buildTable(job);
  const size_t nr = t.ranks.size(), n = t.step.size();
  if (nr < 3 || n < 2 * kMinSlow + 2) return;
  // 1. The job's step time per step and its slow steps.
  std::vector<double> job_time(n, NAN), series;
  for (size_t g = 0; g < n; ++g) {
    std::vector<double> v;
    for (size_t i = 0; i < nr; ++i) {
      if (std::isfinite(t.time[i][g])) v.push_back(t.time[i][g]);
    }
    if (v.size() * 2 > nr) {
      job_time[g] = median(v);
      series.push_back(job_time[g]);
    }
  }
  if (series.size() < 2 * kMinSlow + 2) return;
  const double typical = median(series);
  // A robust scale (MAD, which up to half the steps being slow does not move; the IQR does,
  // once a fifth of the steps are slow).
  const double sigma = robustSigma(series);
  const double threshold = std::max(typical + kSigmas * sigma, typical * (1.0 + kMinRelative));
  std::vector<size_t> slow;
  std::vector<char> is_slow(n, 0);
  for (size_t g = 0; g < n; ++g) {
    if (std::isfinite(job_time[g]) && job_time[g] > threshold) {
      slow.push_back(g);
      is_slow[g] = 1;
    }
  }
  if (slow.size() < kMinSlow || static_cast<double>(slow.size()) > kMaxShare * series.size())
    return;
  // Each rank's GPU time outside collectives in its normal steps (median): its own reference.
  std::vector<double> normal_compute(nr, NAN);
  for (size_t i = 0; i < nr; ++i) {
    std::vector<double> v;
    for (size_t g = 0; g < n; ++g) {
      if (!is_slow[g] && std::isfinite(t.compute[i][g])) v.push_back(t.compute[i][g]);
    }
    if (!v.empty()) normal_compute[i] = median(v);
  }
  // 2. Attribution, step by step.
  std::vector<Attribution> by_step(n);
  for (size_t g : slow) {
    const double extra = job_time[g] - typical;
    const double floor = kMinShareOfExtra * extra;
    const std::vector<double> off = excessAt(t.offset, g);
    const std::vector<double> idl = excessAt(t.idle, g);
    std::vector<double> host(nr, NAN);
    for (size_t i = 0; i < nr; ++i) {
      const double a = std::isfinite(off[i]) ? off[i] : -INFINITY;
      const double b = std::isfinite(idl[i]) ? idl[i] : -INFINITY;
      if (std::isfinite(a) || std::isfinite(b)) host[i] = std::max(a, b);
    }
    const Top2 h = top2(host);
    if (h.at != SIZE_MAX && h.first >= floor && h.first >= 2 * std::max(0.0, h.second)) {
      by_step[g] = {h.at, Cause::kHost, h.first};
      continue;
    }
    // GPU: the rank last at most of the step's collectives, its own GPU time up.
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < nr; ++i) {
      if (t.member[i][g] > 0 && 2 * t.last[i][g] > t.member[i][g] &&
          (best == SIZE_MAX || t.last[i][g] > t.last[best][g]))
        best = i;
    }
    if (best != SIZE_MAX && std::isfinite(t.compute[best][g]) &&
        std::isfinite(normal_compute[best])) {
      const double rise = t.compute[best][g] - normal_compute[best];
      if (rise >= floor) by_step[g] = {best, Cause::kGpu, rise};
    }
  }
  // 3. The culprit: a clear, significant majority. Under the null (no rank is special) a slow
  // step that has a culprit has each rank as that culprit with the chance 1/ranks, so the count
  // is tested among the attributed steps; slow steps with no clear culprit (a loaded machine's
  // scheduling noise) do not dilute it, but the culprit's steps must also hold at least half of
  // the extra time of every slow step.
  std::map<std::string, std::set<int>> named;  // kind -> ranks named earlier
  for (const Diagnosis& d : earlier) named[d.kind].insert(d.ranks.begin(), d.ranks.end());
  // A slow step without a host figure on most ranks (sampled out by step sampling in a job
  // without collectives) has its time but nothing to attribute it by; the share of extra time is
  // taken among the slow steps that could be attributed (with every step measured: all of them).
  auto attributable = [&](size_t g) {
    size_t with = 0;
    for (size_t i = 0; i < nr; ++i)
      with += std::isfinite(t.idle[i][g]) || std::isfinite(t.offset[i][g]) ? 1 : 0;
    return 2 * with > nr;
  };
  double total = 0, slow_extra = 0;
  size_t attributed = 0;
  for (size_t g = 0; g < n; ++g) {
    if (std::isfinite(job_time[g])) total += job_time[g];
    if (is_slow[g] && attributable(g)) slow_extra += job_time[g] - typical;
    if (is_slow[g] && by_step[g].rank_index != SIZE_MAX) ++attributed;
  }
  for (size_t i = 0; i < nr; ++i) {
    std::vector<size_t> mine;
    size_t host = 0;
    std::vector<double> mine_extras;  // each of its steps' extra time
    for (size_t g : slow) {
      if (by_step[g].rank_index != i) continue;
      mine.push_back(g);
      mine_extras.push_back(job_time[g] - typical);
      if (by_step[g].cause == Cause::kHost) ++host;
    }
    const size_t k = mine.size();
    const double mine_extra = std::accumulate(mine_extras.begin(), mine_extras.end(), 0.0);
    if (k < kMinSlow || 2 * mine_extra < slow_extra) continue;
    // The majority and the test count the attributed slow steps alike to this rank's (extra time at
    // least 1/kAlikeFactor of its median): a recurring cause costs about the same each time, and
    // the machine's smaller slow steps, attributed at random, are another population (a 40 ms pause
    // every 10th step beside +4 ms noise steps was diluted below significance).
    const double alike_floor = median(mine_extras) / kAlikeFactor;
    size_t n_alike = 0, k_alike = 0;
    for (size_t g : slow) {
      if (by_step[g].rank_index == SIZE_MAX || job_time[g] - typical < alike_floor) continue;
      ++n_alike;
      k_alike += by_step[g].rank_index == i;
    }
    if (k_alike < kMinSlow || 2 * k_alike <= n_alike) continue;
    const double p = stats::binomialUpperTail(n_alike, k_alike, 1.0 / static_cast<double>(nr));
    const double p_adj = std::min(1.0, p * static_cast<double>(nr));
    if (p_adj > kAlpha) continue;
    const bool is_host = 2 * host >= k;
    const int rank = t.ranks[i];
    const std::string kind = is_host ? "issue_stall" : "gpu_slow";
    if (named[kind].count(rank)) continue;
    // A host already named as waiting for a CPU: its slow steps are that contention's.
    if (is_host && named["cpu_contention"].count(rank)) continue;
    std::vector<size_t> steps;
    std::vector<double> extras, late;
    double lost = 0;
    for (size_t g : mine) {
      steps.push_back(t.step[g]);
      extras.push_back(job_time[g] - typical);
      late.push_back(by_step[g].lateness_ns);
      lost += job_time[g] - typical;
    }
    const size_t period = periodOf(steps);
    const double extra = median(extras);
    Diagnosis d;
    d.kind = kind;
    d.team = is_host ? Team::kAlgorithm : Team::kOperations;
    d.cause = is_host ? "intermittent host stall" : "intermittent GPU slowdown";
    d.ranks = {rank};
    // How much slower the job ran than without these steps' extra time.
    d.severity = total > lost ? lost / (total - lost) : 0;
    char text[1024];
    std::snprintf(text, sizeof(text),
                  "%zu of %zu steps were slow (%s): %.3f ms (median) against %.3f ms for the "
                  "job's median step (threshold %.3f ms: the median + %.0f robust deviations, at "
                  "least +%.0f%%)",
                  slow.size(), series.size(),
                  stepList([&] {
                    std::vector<size_t> s;
                    for (size_t g : slow) s.push_back(t.step[g]);
                    return s;
                  }())
                      .c_str(),
                  median([&] {
                    std::vector<double> v;
                    for (size_t g : slow) v.push_back(job_time[g]);
                    return v;
                  }()) /
                      1e6,
                  typical / 1e6, threshold / 1e6, kSigmas, kMinRelative * 100);
    d.evidence.push_back({"slow_steps", text, static_cast<double>(slow.size()), threshold});
    std::snprintf(
        text, sizeof(text),
        "rank %d caused %zu of the %zu slow steps that had one culprit (%s%s; %.0f%% of the slow "
        "steps' extra time): %s in each (median %.3f ms; the step's extra time %.3f ms); "
        "binomial test of its %zu of the %zu attributed slow steps alike to its (extra time at "
        "least half its median) against 1/%zu: p = %.2g, x%zu ranks = %.2g",
        rank, k, attributed, stepList(steps).c_str(),
        period ? (", every " + std::to_string(period) + " steps").c_str() : "",
        100 * mine_extra / slow_extra,
        is_host ? "its host issued the step's work late or left its GPU idle against its peers"
                : "it arrived last at most of the step's collectives and its GPU time outside "
                  "collectives rose against its own normal steps",
        median(late) / 1e6, extra / 1e6, k_alike, n_alike, nr, p, nr, p_adj);
    d.evidence.push_back({"slow_step_culprit", text, static_cast<double>(k), p_adj});
    std::snprintf(text, sizeof(text),
                  "%.3f ms extra per slow step (median; %.1f%% of the median step); %.1f%% of the "
                  "job's time over %zu steps lost",
                  extra / 1e6, 100 * extra / typical, total > 0 ? 100 * lost / total : 0.0,
                  series.size());
    d.evidence.push_back({"slow_step_cost", text, lost, total});
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    bool consecutive = true;
    for (size_t j = 1; j < steps.size(); ++j) consecutive &= steps[j] == steps[j - 1] + 1;
    const std::string when = period ? "every " + std::to_string(period) + " steps"
                             : consecutive
                                 ? "in a burst of " + std::to_string(k) + " consecutive steps"
                                 : "in " + std::to_string(k) + " steps";
    d.summary = "rank " + std::to_string(rank) +
                (is_host ? ": intermittent kernel-issue stall on the host — it pauses "
                         : ": intermittent GPU slowdown — its GPU is slow ") +
                when + " (steps " + stepList(steps) + "), " + fmtMs(extra) +
                " extra per slow step, " + fmtPct(total > 0 ? lost / total : 0) +
                " of the job's time; the other ranks only wait for it";
    out->push_back(std::move(d));
  }
}

class SlowStepsDetector final : public Detector {
 public:
  std::string_view name() const override { return "slow_steps"; }
  std::vector<std::string_view> kinds() const override { return {"issue_stall", "gpu_slow"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kWhole;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    detectSlowSteps(view.job(), view.earlier(), view.arrivals(), &out);
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeSlowStepsDetector() {
  return std::make_unique<SlowStepsDetector>();
}

}  // namespace flare::engine
