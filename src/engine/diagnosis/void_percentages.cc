// Detector void (kinds void_inter, void_minority): the share of the step the GPU idles around the
// DataLoader call (V_inter: the input pipeline) or spends in kernels other than GEMM, attention
// and communication (V_minority: work fusion could remove), median over each rank's steps,
// against thresholds learned from a healthy baseline or stored history, else the configured
// ones (docs/metrics.md). Both modes: from the step statistics.

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/stats/outliers.h"

namespace flare::engine {
namespace {

using namespace signals;

// A void threshold learned from a healthy baseline (docs/metrics.md): the largest per-rank median
// of the baseline plus the larger of `min_delta` and 1.5 × the IQR of its per-step values (a rank
// whose median moved by less than the baseline's own step-to-step spread is not a regression).
std::optional<double> learnedVoidThreshold(const std::map<int, VoidSteps>& base,
                                           std::vector<double> VoidSteps::*field,
                                           double min_delta) {
  std::vector<double> pooled;
  double top = -1;
  for (const auto& [rank, v] : base) {
    const std::vector<double>& x = v.*field;
    if (x.empty()) continue;
    top = std::max(top, median(x));
    pooled.insert(pooled.end(), x.begin(), x.end());
  }
  if (top < 0 || pooled.size() < 3) return std::nullopt;
  const auto f = stats::tukeyFences(pooled, 1.5);
  return top + std::max(min_delta, 1.5 * f.iqr);
}

// Thresholds: learned from a healthy baseline run (offline) or from stored healthy history
// (flared), else the configured ones.
void detectVoid(const JobModel& job, const DiagnoseOptions& opt, const JobModel* baseline,
                const History* history, std::vector<Diagnosis>* out) {
  double inter_threshold = opt.v_inter_threshold, minority_threshold = opt.v_minority_threshold;
  std::string inter_source = "fixed", minority_source = "fixed";
  if (history != nullptr && history->v_inter_threshold) {
    inter_threshold = *history->v_inter_threshold;
    inter_source = "learned from healthy history";
  }
  if (history != nullptr && history->v_minority_threshold) {
    minority_threshold = *history->v_minority_threshold;
    minority_source = "learned from healthy history";
  }
  if (baseline != nullptr) {
    const auto base = voidPerStep(*baseline);
    if (auto t = learnedVoidThreshold(base, &VoidSteps::v_inter, opt.void_learned_min_delta)) {
      inter_threshold = *t;
      inter_source = "learned from the healthy baseline";
    }
    if (auto t = learnedVoidThreshold(base, &VoidSteps::v_minority, opt.void_learned_min_delta)) {
      minority_threshold = *t;
      minority_source = "learned from the healthy baseline";
    }
  }
  std::vector<int> inter_ranks, minority_ranks;
  std::vector<double> inter_values, minority_values;
  for (const auto& [rank, v] : voidPerStep(job)) {
    const double vi = median(v.v_inter);
    const double vm = v.v_minority.empty() ? 0 : median(v.v_minority);
    if (vi > inter_threshold) {
      inter_ranks.push_back(rank);
      inter_values.push_back(vi);
    }
    if (vm > minority_threshold) {
      minority_ranks.push_back(rank);
      minority_values.push_back(vm);
    }
  }
  if (!inter_ranks.empty()) {
    Diagnosis d;
    d.kind = "void_inter";
    d.team = Team::kAlgorithm;
    d.cause = "input pipeline";
    d.ranks = inter_ranks;
    const double v = median(inter_values);
    d.severity = v;
    d.evidence.push_back({"v_inter",
                          "V_inter (GPU idle around the DataLoader call) " + fmtPct(v) +
                              " of the step, median over steps and ranks (threshold " +
                              fmtPct(inter_threshold) + ", " + inter_source + ")",
                          v, inter_threshold});
    d.summary = "ranks " + rankList(inter_ranks) + ": the GPU waits for input — " + fmtPct(v) +
                " of each step is spent around the DataLoader's __next__";
    out->push_back(std::move(d));
  }
  if (!minority_ranks.empty()) {
    Diagnosis d;
    d.kind = "void_minority";
    d.team = Team::kAlgorithm;
    d.cause = "minority kernels";
    d.ranks = minority_ranks;
    const double v = median(minority_values);
    d.severity = v;
    d.evidence.push_back({"v_minority",
                          "V_minority (time in kernels other than GEMM, attention and "
                          "communication) " +
                              fmtPct(v) + " of the busy step (threshold " +
                              fmtPct(minority_threshold) + ", " + minority_source + ")",
                          v, minority_threshold});
    d.summary = "ranks " + rankList(minority_ranks) + ": minority kernels take " + fmtPct(v) +
                " of the step (elementwise/normalization work that fusion could remove)";
    out->push_back(std::move(d));
  }
}

class VoidDetector final : public Detector {
 public:
  std::string_view name() const override { return "void"; }
  std::vector<std::string_view> kinds() const override { return {"void_inter", "void_minority"}; }
  DetectorNeeds needs() const override {
    DetectorNeeds n;
    n.window = Window::kRecent;
    return n;
  }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out;
    detectVoid(view.job(), view.options(), view.baseline(), view.history(), &out);
    return out;
  }
};

}  // namespace

std::unique_ptr<Detector> makeVoidDetector() {
  return std::make_unique<VoidDetector>();
}

}  // namespace flare::engine
