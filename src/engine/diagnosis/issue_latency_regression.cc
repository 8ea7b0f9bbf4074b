// Detector issue_latency_regression: the job's issue-latency distribution against healthy
// history. Against a healthy baseline run (flare-diagnose --baseline): the part of W1 where the
// job's distribution lies below the baseline's, both clipped at the baseline's median, above the
// healthy spread (measured between several healthy runs, or the one-baseline proxy); else
// against stored healthy history (flared): the runs' merged sketch and the learned threshold.
// Only lower latencies count: ops that start sooner after their issue are a GPU waiting for its
// host (a synchronization, a stall); a host further ahead of a busier GPU (more work queued) is
// not a regression. The likely cause is what the job calls clearly more often than the healthy
// runs (docs/metrics.md).

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/stats/sketch.h"
#include "src/stats/wasserstein.h"

namespace flare::engine {
namespace {

using namespace signals;

// Names what this job calls clearly more often than the baseline: the traced Python API first
// (what the algorithm team changes), then the host synchronization call it makes.
void nameRegressionCause(const ApiRates& now_rates, const ApiRates& base_rates, Diagnosis* d) {
  auto grown = [d](const std::map<std::string, double>& now,
                   const std::map<std::string, double>& before) {
    std::string best_name;
    double best = 0;
    for (const auto& [name, rate] : now) {
      auto it = before.find(name);
      const double was = it == before.end() ? 0 : it->second;
      if (rate - was > best && rate - was > 0.2 * rate) {
        best = rate - was;
        best_name = name;
      }
    }
    if (!best_name.empty()) {
      auto it = before.find(best_name);
      d->evidence.push_back({"api_rate",
                             best_name + " runs " + fmtNum(now.at(best_name) * 1000, "") +
                                 "times per 1000 GPU ops vs " +
                                 fmtNum(it == before.end() ? 0 : it->second * 1000, "") +
                                 "in the baseline",
                             now.at(best_name), it == before.end() ? 0 : it->second});
    }
    return best_name;
  };
  const std::string api = grown(now_rates.spans, base_rates.spans);
  const std::string sync = grown(now_rates.syncs, base_rates.syncs);
  std::string named = api;
  if (!sync.empty()) named += named.empty() ? sync : " (which calls " + sync + ")";
  d->summary = "job: issue-latency regression against healthy history" +
               (named.empty() ? std::string() : " (likely cause: " + named + ")");
}

// What a run that named nothing compared, for lookedAt ("nothing found" says what was looked at).
std::string comparedNote(double w1, double threshold, const std::string& against,
                         const char* kind) {
  return "issue latencies compared with " + against + ": W1 below them " + fmtMs(w1) +
         ", within the " + kind + "threshold " + fmtMs(threshold);
}

void detectRegression(const JobModel& job, const JobModel& baseline, const DiagnoseOptions& opt,
                      std::vector<Diagnosis>* out, std::string* note) {
  std::vector<double> all, base_all;
  std::map<int, std::vector<double>> base_ranks;
  for (const auto& [rank, r] : job.ranks()) {
    auto v = issueLatencies(job, r, SIZE_MAX, /*weighted=*/true);
    all.insert(all.end(), v.begin(), v.end());
  }
  for (const auto& [rank, r] : baseline.ranks()) {
    base_ranks[rank] = issueLatencies(baseline, r, SIZE_MAX, /*weighted=*/true);
    base_all.insert(base_all.end(), base_ranks[rank].begin(), base_ranks[rank].end());
  }
  if (all.size() < 30 || base_all.size() < 30) {
    *note = "too few issue latencies to compare (" + std::to_string(all.size()) + " in the job, " +
            std::to_string(base_all.size()) + " in the baseline; 30 needed)";
    return;
  }
  const double job_median = median(all), base_median = median(base_all);
  // Kernel-issue stalls move the lower half of the distribution toward zero; the upper tail
  // (how far the host runs ahead) varies from run to run and rank to rank and would drown the
  // signal. Both distributions are clipped at the baseline's median before W1 (docs/metrics.md).
  const double cap = median(base_all);
  auto clip = [cap](std::vector<double>* v) {
    for (double& x : *v) x = std::min(x, cap);
  };
  clip(&all);
  clip(&base_all);
  for (auto& [rank, v] : base_ranks) clip(&v);
  // Healthy spread: measured between healthy runs when several were given; else the largest W1
  // of a baseline rank to the baseline as a whole (the one-baseline proxy).
  double threshold = std::max(opt.regression_w1_floor_ns, opt.regression_relative_floor * cap);
  const bool measured = opt.regression_healthy_spread_ns > 0;
  if (measured) {
    threshold =
        std::max(threshold, opt.regression_spread_factor * opt.regression_healthy_spread_ns);
  } else {
    for (const auto& [rank, v] : base_ranks) {
      if (v.size() >= 30) threshold = std::max(threshold, wasserstein1(v, base_all));
    }
  }
  const double w1 = stats::wasserstein1Below(all, base_all);
  if (!(w1 > threshold)) {
    *note = comparedNote(w1, threshold, "the baseline's", "");
    return;
  }
  Diagnosis d;
  d.kind = "issue_latency_regression";
  d.team = Team::kAlgorithm;
  d.cause = "issue latency";
  d.severity = w1 / threshold - 1.0;
  d.evidence.push_back(
      {"issue_latency_w1",
       "job issue-latency distribution (clipped at the baseline median) below the healthy "
       "baseline's by W1 " +
           fmtMs(w1) + " (threshold " + fmtMs(threshold) +
           (measured ? ", twice the largest W1 between healthy runs"
                     : ", the largest W1 of a baseline rank to its run") +
           ", at least " + fmtPct(opt.regression_relative_floor) + " of the baseline median" +
           "); median " + fmtMs(job_median) + " vs " + fmtMs(base_median),
       w1, threshold});
  nameRegressionCause(apiRates(job), apiRates(baseline), &d);
  out->push_back(std::move(d));
}

// The same detector against stored healthy history (history.h): the job's distribution against
// the baseline runs' merged sketch, both clipped at its median, with the learned threshold.
void detectRegressionFromHistory(const JobModel& job, const History& history,
                                 std::vector<Diagnosis>* out, std::string* note) {
  if (history.runs == 0 || history.issue_latency.count() < 30) {
    *note = "the healthy history holds no issue latencies to compare with";
    return;
  }
  stats::LatencySketch sketch;
  for (const auto& [rank, r] : job.ranks()) {
    for (double v : issueLatencies(job, r, SIZE_MAX, /*weighted=*/true)) sketch.add(v);
  }
  if (sketch.count() < 30) {
    *note = "too few issue latencies in the job to compare (" + std::to_string(sketch.count()) +
            "; 30 needed)";
    return;
  }
  const double w1 = clippedW1(sketch, history.issue_latency, history.issue_cap_ns, /*below=*/true);
  const double threshold = history.issue_w1_threshold_ns;
  if (!(w1 > threshold) || threshold <= 0) {
    *note = comparedNote(
        w1, threshold,
        std::to_string(history.runs) + " healthy history run" + (history.runs == 1 ? "'s" : "s'"),
        "learned ");
    return;
  }
  Diagnosis d;
  d.kind = "issue_latency_regression";
  d.team = Team::kAlgorithm;
  d.cause = "issue latency";
  d.severity = w1 / threshold - 1.0;
  d.evidence.push_back(
      {"issue_latency_w1",
       "job issue-latency distribution (clipped at the history median) below that of " +
           std::to_string(history.runs) + " healthy baseline run" + (history.runs > 1 ? "s" : "") +
           " by W1 " + fmtMs(w1) + " (learned threshold " + fmtMs(threshold) + "); median " +
           fmtMs(sketch.quantile(0.5)) + " vs " + fmtMs(history.issue_latency.quantile(0.5)),
       w1, threshold});
  nameRegressionCause(apiRates(job), {history.api_rate, history.sync_rate}, &d);
  out->push_back(std::move(d));
}

class IssueLatencyRegressionDetector final : public Detector {
 public:
  std::string_view name() const override { return "issue_latency_regression"; }
  std::vector<std::string_view> kinds() const override { return {"issue_latency_regression"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kRecent;
    n.reference = Reference::kBaselineOrHistory;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    std::string note;
    if (view.baseline() != nullptr) {
      detectRegression(view.job(), *view.baseline(), view.options(), &out, &note);
    } else if (view.history() != nullptr) {
      detectRegressionFromHistory(view.job(), *view.history(), &out, &note);
    }
    if (!note.empty()) view.note(std::move(note));
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeIssueLatencyRegressionDetector() {
  return std::make_unique<IssueLatencyRegressionDetector>();
}

}  // namespace flare::engine
