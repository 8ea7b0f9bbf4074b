// Detector gpu_slow: a slow GPU. Every detector compares like with like inside the job: here the
// same GEMM/attention signature across ranks. A slow GPU shows as slower kernels on that rank
// only (and that rank arrives last at collectives), so a rank whose kernels are slower than the
// other ranks' medians (Tukey fence, at least gpu_min_effect) on at least half of the compute
// time is named (docs/metrics.md).
//
// Two detectors of the one kind: from raw ops (gpu_slow), and from kernel summaries
// (gpu_slow_from_summaries, MODE_SUMMARY; gpu_slow.h).

#include "src/engine/diagnosis/gpu_slow.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/own_change.h"
#include "src/stats/outliers.h"
#include "src/stats/quantile.h"

namespace flare::engine {
namespace {

using flare::v1::OpKind;

// Intervals of collectives per rank and stream, to exclude compute that overlapped one on
// another stream (its slowness is contention, not the GPU).
struct CollectiveIntervals {
  std::vector<std::pair<int64_t, int64_t>> spans;  // sorted by start
  std::vector<uint64_t> streams;
  bool overlapsOtherStream(const Op& op) const {
    auto it = std::upper_bound(spans.begin(), spans.end(), std::make_pair(op.end, INT64_MAX));
    for (auto i = it - spans.begin() - 1; i >= 0; --i) {
      const auto& s = spans[static_cast<size_t>(i)];
      if (s.second <= op.start) {
        // Sorted by start only: earlier ones may still be long; scan a bounded window.
        if (it - spans.begin() - i > 64) break;
        continue;
      }
      if (streams[static_cast<size_t>(i)] != op.stream) return true;
    }
    return false;
  }
};

CollectiveIntervals collectiveIntervals(const JobModel& job, const RankData& r) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, uint64_t>> all;
  for (const Op& op : r.ops) {
    const OpKind kind = job.signatures()[op.sig].kind();
    if (kind == flare::v1::OP_KIND_COLLECTIVE || kind == flare::v1::OP_KIND_P2P)
      all.push_back({{op.start, op.end}, op.stream});
  }
  std::sort(all.begin(), all.end());
  CollectiveIntervals out;
  for (const auto& [span, stream] : all) {
    out.spans.push_back(span);
    out.streams.push_back(stream);
  }
  return out;
}

std::string fmtUs(double ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  return buf;
}

std::string fmtPctWhole(double ratio) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f%%", ratio * 100);
  return buf;
}

}  // namespace

using namespace signals;

void detectSlowGpu(const JobModel& job, const DiagnoseOptions& opt,
                   const std::map<int, ArrivalStats>& arrivals, std::vector<Diagnosis>* out) {
  std::map<int, CollectiveIntervals> intervals;
  for (const auto& [rank, r] : job.ranks()) intervals[rank] = collectiveIntervals(job, r);
  // signature -> rank -> durations (compute not overlapping a collective on another stream)
  std::map<uint32_t, std::map<int, std::vector<double>>> durations;
  std::map<uint32_t, double> flops_of;
  for (const auto& [rank, r] : job.ranks()) {
    const int64_t after = warmupEnd(job, rank);
    for (const Op& op : r.ops) {
      if (op.issue < after || !isCompute(job.signatures()[op.sig].kind())) continue;
      if (intervals[rank].overlapsOtherStream(op)) continue;
      durations[op.sig][rank].push_back(static_cast<double>(op.duration()));
      flops_of[op.sig] = static_cast<double>(op.flops);
    }
  }
  struct RankScore {
    double flagged_weight = 0;
    double total_weight = 0;
    double weighted_ratio = 0;
    uint32_t top_sig = 0;
    double top_flops = 0;
    double top_weight = -1;
    double top_median = 0;
    double top_reference = 0;
  };
  std::map<int, RankScore> scores;
  for (const auto& [sig, per_rank] : durations) {
    std::map<int, double> medians;
    double weight = 0;
    for (const auto& [rank, d] : per_rank) {
      if (static_cast<int>(d.size()) < opt.min_samples) continue;
      medians[rank] = median(d);
      weight += std::accumulate(d.begin(), d.end(), 0.0);
    }
    if (medians.size() < 3) continue;  // two ranks cannot say which one is different
    std::vector<double> meds;
    for (const auto& [rank, m] : medians) meds.push_back(m);
    const double reference = median(meds);
    if (reference <= 0) continue;
    std::vector<double> ratios;
    for (double m : meds) ratios.push_back(m / reference);
    const double fence =
        std::max(1.0 + opt.gpu_min_effect, tukeyUpperFence(ratios, opt.tukey_alpha));
    for (const auto& [rank, m] : medians) {
      RankScore& s = scores[rank];
      const double ratio = m / reference;
      s.total_weight += weight;
      s.weighted_ratio += weight * ratio;
      if (ratio > fence) {
        s.flagged_weight += weight;
        if (weight > s.top_weight) {
          s.top_weight = weight;
          s.top_sig = sig;
          s.top_flops = flops_of[sig];
          s.top_median = m;
          s.top_reference = reference;
        }
      }
    }
  }
  for (const auto& [rank, s] : scores) {
    if (s.total_weight <= 0 || s.flagged_weight < 0.5 * s.total_weight) continue;
    const double slowdown = s.weighted_ratio / s.total_weight - 1.0;
    const auto& sig = job.signatures()[s.top_sig];
    Diagnosis d;
    d.kind = "gpu_slow";
    d.team = Team::kOperations;
    d.cause = "GPU";
    d.ranks = {rank};
    d.severity = slowdown;
    const double flops = s.top_flops;
    Evidence e;
    e.metric = "compute_duration";
    e.value = s.top_median;
    e.reference = s.top_reference;
    e.text = sig.name() + " " + shapeText(sig) + ": median " + fmtMs(s.top_median) + " on rank " +
             std::to_string(rank) + " vs " + fmtMs(s.top_reference) + " on the other ranks";
    if (flops > 0) {
      e.text += " (" + fmtNum(flops / s.top_median / 1e3, "TFLOPS") + " vs " +
                fmtNum(flops / s.top_reference / 1e3, "TFLOPS") + ")";
    }
    d.evidence.push_back(e);
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    d.summary = "rank " + std::to_string(rank) + ": GPU slow — its GEMM/attention kernels run " +
                fmtPct(slowdown) + " slower than the same kernels on the other ranks; the " +
                "other ranks only wait for it";
    out->push_back(std::move(d));
  }
}

void detectSlowGpuFromSummaries(const JobModel& job, const DiagnoseOptions& opt,
                                const std::map<int, ArrivalStats>& arrivals,
                                std::vector<Diagnosis>* out) {
  std::set<int> already;
  for (const Diagnosis& d : *out) {
    if (d.kind == "gpu_slow") already.insert(d.ranks.begin(), d.ranks.end());
  }
  // signature -> rank -> concatenated clusters: the newest windows up to a budget of
  // kClusterBudget clusters per signature over all ranks (at least kMinClusters per rank): all of
  // them for the usual job (8 ranks × a minute of 1 s windows), the last few seconds per rank for
  // 10,000 ranks, whose distance computations would otherwise dominate the daemon.
  constexpr size_t kClusterBudget = 200000, kMinClusters = 16;
  const size_t per_rank_clusters =
      std::max(kMinClusters, kClusterBudget / std::max<size_t>(job.ranks().size(), 1));
  std::vector<char> compute(job.signatures().size());
  for (size_t i = 0; i < compute.size(); ++i) compute[i] = isCompute(job.signatures()[i].kind());
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
    double top_typical = 0, top_reference = 0, top_score = 0, top_fence = 0;
    double top_ratio_fence = 0;  // > 0: the top signature was flagged by its typical call alone
  };
  std::map<int, RankScore> scores;
  // One signature's members: each rank's clusters, newest windows first up to
  // per_rank_clusters, and its typical call: the count-weighted median of those clusters'
  // medians. Not the mean: a call the host was preempted inside (its start event already
  // stamped on an idle stream, the kernel enqueued milliseconds later) is timed with that delay,
  // and one such 6 ms call among 24 GEMMs of 150 us read as a 2.6x slower signature and moved a
  // loaded run's severity from 0.235 to 0.317. Reused across signatures (no allocation per rank
  // and signature once grown).
  std::vector<std::vector<stats::DurationCluster>> members;
  std::vector<int> ranks;
  std::vector<double> typical;
  std::vector<std::pair<double, uint64_t>> medians;  // one member's (cluster p50, count)
  for (const uint32_t sig : index.sigs) {
    ranks.clear();
    typical.clear();
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
      medians.clear();
      uint64_t calls = 0;
      for (const stats::DurationCluster& c : m) {
        medians.emplace_back(c.p50, c.count);
        calls += c.count;
      }
      ranks.push_back(rw.data->rank);
      typical.push_back(stats::weightedMedian(medians, calls));
      weight += run->sum;
    }
    if (ranks.size() < 3) continue;  // two ranks cannot say which one is different
    const double reference = median(typical);
    if (reference <= 0) continue;
    stats::OutlierOptions oo;
    oo.alpha = opt.tukey_alpha;
    // W1 of two mixtures that differ by a factor (1 + e) is about e × the mean duration: noise
    // below half the minimum effect is no outlier.
    oo.minAbsoluteExcess = 0.5 * opt.gpu_min_effect * reference;
    const stats::OutlierResult res =
        stats::summaryOutliers(std::span(members.data(), ranks.size()), oo);
    std::set<size_t> high(res.high.begin(), res.high.end());
    // Or its typical call alone, as raw mode judges a rank's median (detectSlowGpu): above
    // 1 + gpu_min_effect and the Tukey fence of the ranks' ratios. The mean W1 of mixtures
    // weighs every call, and a healthy rank with a few calls its host was preempted inside
    // (timed with the delay) scores as high as a slow one: with the default timing budget's few
    // measured steps, a GPU at 80% clock among 4 ranks (the H200 healthy-small fixture through
    // the hook) read typical calls 1.25x the others' in every GEMM signature, and the W1 fence
    // flagged it on less than half the compute time in 2 runs of 6.
    std::vector<double> ratios;
    for (double t : typical) ratios.push_back(t / reference);
    const double ratio_fence =
        std::max(1.0 + opt.gpu_min_effect, tukeyUpperFence(ratios, opt.tukey_alpha));
    for (size_t i = 0; i < ranks.size(); ++i) {
      RankScore& s = scores[ranks[i]];
      const double ratio = ratios[i];
      s.total_weight += weight;
      s.weighted_ratio += weight * ratio;
      const bool by_w1 = high.count(i) != 0;
      if ((!by_w1 && ratio <= ratio_fence) || ratio < 1.0 + opt.gpu_min_effect) continue;
      s.flagged_weight += weight;
      if (weight > s.top_weight) {
        s.top_weight = weight;
        s.top_sig = sig;
        s.top_typical = typical[i];
        s.top_reference = reference;
        s.top_score = res.scores[i];
        s.top_fence = res.fences.upper;
        s.top_ratio_fence = by_w1 ? 0 : ratio_fence;
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
                          sig.name() + ": typical call " + fmtUs(s.top_typical) + " on rank " +
                              std::to_string(rank) + " vs " + fmtUs(s.top_reference) +
                              " (median over the ranks; a rank's typical call: the "
                              "count-weighted median of its kernel-summary clusters)",
                          s.top_typical, s.top_reference});
    if (s.top_ratio_fence > 0) {
      char text[200];
      std::snprintf(text, sizeof text,
                    "typical call %.2fx the ranks' median, above the fence %.2fx of the ranks' "
                    "ratios (Tukey)",
                    s.top_typical / s.top_reference, s.top_ratio_fence);
      d.evidence.push_back(
          {"typical_call_ratio", text, s.top_typical / s.top_reference, s.top_ratio_fence});
    } else {
      d.evidence.push_back({"summary_w1",
                            "mean W1 to the other ranks' summaries " + fmtUs(s.top_score) +
                                " above the Tukey fence " + fmtUs(s.top_fence),
                            s.top_score, s.top_fence});
    }
    if (auto arrival = arrivalEvidence(arrivals, rank)) d.evidence.push_back(*arrival);
    d.summary = "rank " + std::to_string(rank) + ": GPU slow — its GEMM/attention kernels run " +
                fmtPctWhole(slowdown) +
                " slower than the same kernels on the other ranks (kernel " +
                "summaries); the other ranks only wait for it";
    out->push_back(std::move(d));
  }
}

namespace {

class GpuSlowDetector final : public Detector {
 public:
  std::string_view name() const override { return "gpu_slow"; }
  std::vector<std::string_view> kinds() const override { return {"gpu_slow"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kCulprit;
    n.cites_window = true;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    detectSlowGpu(view.job(), view.options(), view.arrivals(), &out);
    measureAgainstOwnSteps(view.whole(), view.options(), &out);  // after a fail-slow
    return out;
  }
};

class GpuSlowFromSummariesDetector final : public Detector {
 public:
  std::string_view name() const override { return "gpu_slow_from_summaries"; }
  std::vector<std::string_view> kinds() const override { return {"gpu_slow"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kCulprit;
    n.data = Data::kSummaries;
    n.cites_window = true;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    // Ranks already named by the raw path (view.earlier()) are skipped.
    std::vector<Diagnosis> out = view.earlier();
    const size_t before = out.size();
    detectSlowGpuFromSummaries(view.job(), view.options(), view.arrivals(), &out);
    out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(before));
    measureAgainstOwnSteps(view.whole(), view.options(), &out);  // after a fail-slow
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeGpuSlowDetector() {
  return std::make_unique<GpuSlowDetector>();
}

std::unique_ptr<Detector> makeGpuSlowFromSummariesDetector() {
  return std::make_unique<GpuSlowFromSummariesDetector>();
}

}  // namespace flare::engine
