#include "src/engine/diagnosis/summary_detectors.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <utility>

#include "src/stats/outliers.h"
#include "src/stats/quantile.h"

namespace flare::engine {
namespace {

bool isComputeKind(flare::v1::OpKind kind) {
  return kind == flare::v1::OP_KIND_GEMM || kind == flare::v1::OP_KIND_ATTENTION;
}

std::string fmtUs(double ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  return buf;
}

std::string fmtPct(double ratio) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f%%", ratio * 100);
  return buf;
}

double medianOf(std::vector<double> v) {
  return stats::quantileInPlace(v, 0.5);
}

}  // namespace

void detectSlowGpuFromSummaries(const JobModel& job, const DiagnoseOptions& opt,
                                const std::map<int, ArrivalStats>& arrivals,
                                std::vector<Diagnosis>* out) {
  std::set<int> already;
  for (const Diagnosis& d : *out) {
    if (d.kind == "gpu_slow") already.insert(d.ranks.begin(), d.ranks.end());
  }
  // signature -> rank -> concatenated clusters. The means use every window; the distributions
  // compared by W1 use the newest windows up to a budget of kClusterBudget clusters per signature
  // over all ranks (at least kMinClusters per rank): all of them for the usual job (8 ranks × a
  // minute of 1 s windows), the last few seconds per rank for 10,000 ranks, whose distance
  // computations would otherwise dominate the daemon.
  constexpr size_t kClusterBudget = 200000, kMinClusters = 16;
  const size_t per_rank_clusters =
      std::max(kMinClusters, kClusterBudget / std::max<size_t>(job.ranks().size(), 1));
  std::vector<char> compute(job.signatures().size());
  for (size_t i = 0; i < compute.size(); ++i)
    compute[i] = isComputeKind(job.signatures()[i].kind());
  // The warm-up step (first launches, allocator growth) is left out as in raw mode: ranks close
  // a summary window at their first two step boundaries, so windows that start before the
  // second boundary hold the warm-up; skipped when the rank has later windows. In a view of
  // later steps (a fail-slow's, a jitter's), the whole model's warm-up: a window kept there
  // straddles the view's first boundary and is not the warm-up. Members are built one signature
  // at a time (every rank's member of every signature at once held ~320 MB of copied clusters
  // during each pass at 1,024 or 10,000 ranks), reading only the windows they keep.
  const SummaryIndex index = indexSummaries(job, compute, true);
  struct RankScore {
    double flagged_weight = 0;
    double total_weight = 0;
    double weighted_ratio = 0;
    uint32_t top_sig = 0;
    double top_weight = -1;
    double top_mean = 0, top_reference = 0, top_score = 0, top_fence = 0;
  };
  std::map<int, RankScore> scores;
  // One signature's members: each rank's clusters, newest windows first up to
  // per_rank_clusters; mean over every window. Reused across signatures (no allocation per
  // rank and signature once grown).
  std::vector<std::vector<stats::DurationCluster>> members;
  std::vector<int> ranks;
  std::vector<double> means;
  for (const uint32_t sig : index.sigs) {
    ranks.clear();
    means.clear();
    double weight = 0;
    for (const SummaryIndex::Rank& rw : index.ranks) {
      const SummaryIndex::Run* run = rw.find(sig);
      if (run == nullptr) continue;
      if (run->count < static_cast<uint64_t>(std::max(opt.min_samples, 1))) continue;
      if (ranks.size() == members.size()) members.emplace_back();
      std::vector<stats::DurationCluster>& m = members[ranks.size()];
      m.clear();
      for (uint32_t k = run->lo; k < run->hi && m.size() < per_rank_clusters; ++k) {
        for (const WindowCluster& c : rw.window(k).clusters) m.push_back(c.toDuration());
      }
      ranks.push_back(rw.data->rank);
      means.push_back(run->sum / static_cast<double>(run->count));
      weight += run->sum;
    }
    if (ranks.size() < 3) continue;  // two ranks cannot say which one is different
    const double reference = medianOf(means);
    if (reference <= 0) continue;
    stats::OutlierOptions oo;
    oo.alpha = opt.tukey_alpha;
    // W1 of two mixtures that differ by a factor (1 + e) is about e × the mean duration: noise
    // below half the minimum effect is no outlier.
    oo.minAbsoluteExcess = 0.5 * opt.gpu_min_effect * reference;
    const stats::OutlierResult res =
        stats::summaryOutliers(std::span(members.data(), ranks.size()), oo);
    std::set<size_t> high(res.high.begin(), res.high.end());
    for (size_t i = 0; i < ranks.size(); ++i) {
      RankScore& s = scores[ranks[i]];
      const double ratio = means[i] / reference;
      s.total_weight += weight;
      s.weighted_ratio += weight * ratio;
      if (high.count(i) == 0 || ratio < 1.0 + opt.gpu_min_effect) continue;
      s.flagged_weight += weight;
      if (weight > s.top_weight) {
        s.top_weight = weight;
        s.top_sig = sig;
        s.top_mean = means[i];
        s.top_reference = reference;
        s.top_score = res.scores[i];
        s.top_fence = res.fences.upper;
      }
    }
  }
  for (const auto& [rank, s] : scores) {
    if (already.count(rank) || s.total_weight <= 0 || s.flagged_weight < 0.5 * s.total_weight)
      continue;
    const double slowdown = s.weighted_ratio / s.total_weight - 1.0;
    const auto& sig = job.signatures()[s.top_sig];
    Diagnosis d;
    d.kind = "gpu_slow";
    d.team = Team::kOperations;
    d.cause = "GPU";
    d.ranks = {rank};
    d.severity = slowdown;
    d.evidence.push_back({"compute_duration",
                          sig.name() + ": mean " + fmtUs(s.top_mean) + " on rank " +
                              std::to_string(rank) + " vs " + fmtUs(s.top_reference) +
                              " (median of the ranks' means; from kernel summaries)",
                          s.top_mean, s.top_reference});
    d.evidence.push_back({"summary_w1",
                          "mean W1 to the other ranks' summaries " + fmtUs(s.top_score) +
                              " above the Tukey fence " + fmtUs(s.top_fence),
                          s.top_score, s.top_fence});
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    d.summary = "rank " + std::to_string(rank) + ": GPU slow — its GEMM/attention kernels run " +
                fmtPct(slowdown) + " slower than the same kernels on the other ranks (kernel " +
                "summaries); the other ranks only wait for it";
    out->push_back(std::move(d));
  }
}

}  // namespace flare::engine
