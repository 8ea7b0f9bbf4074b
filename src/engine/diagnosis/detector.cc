#include "src/engine/diagnosis/detector.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace flare::engine {

const char* windowName(Window window) {
  switch (window) {
    case Window::kWhole:
      return "whole";
    case Window::kRecent:
      return "recent";
    case Window::kCulprit:
      return "culprit";
  }
  return "whole";
}

const std::map<int, ArrivalStats>& DetectorView::arrivals() const {
  if (!arrivals_->has_value()) arrivals_->emplace(collectiveArrivals(job_));
  return **arrivals_;
}

bool DetectorRegistry::add(std::unique_ptr<Detector> detector) {
  if (detector == nullptr || find(detector->name()) != nullptr) return false;
  detectors_.push_back(std::move(detector));
  return true;
}

const Detector* DetectorRegistry::find(std::string_view name) const {
  for (const auto& d : detectors_) {
    if (d->name() == name) return d.get();
  }
  return nullptr;
}

namespace {

// Why a detector cannot run with these references and this window's data; empty when it can.
std::string missing(const DetectorNeeds& needs, const JobModel& job, const JobModel* baseline,
                    const History* history) {
  switch (needs.reference) {
    case Reference::kNone:
      break;
    case Reference::kBaseline:
      if (baseline == nullptr) return "needs a baseline";
      break;
    case Reference::kHistory:
      if (history == nullptr) return "needs healthy history";
      break;
    case Reference::kBaselineOrHistory:
      if (baseline == nullptr && history == nullptr) return "needs a baseline or healthy history";
      break;
  }
  if (needs.data == Data::kSummaries && !hasSummaries(job)) return "no kernel summaries";
  return {};
}

Evidence failSlowEvidence(const FailSlow& f) {
  char text[160];
  std::snprintf(text, sizeof(text),
                "fail-slow: the job's step time rose from %.3f ms to %.3f ms (+%.1f%%) at step "
                "%zu (change point); the steps since were analysed",
                f.before_ns / 1e6, f.after_ns / 1e6, (f.after_ns / f.before_ns - 1) * 100, f.step);
  return Evidence{"step_time_change", text, f.after_ns, f.before_ns};
}

Evidence jitterEvidence(const Jitter& j) {
  std::string steps;
  for (size_t i = 0; i < j.steps.size() && i < 12; ++i)
    steps += (i ? "," : "") + std::to_string(j.steps[i]);
  if (j.steps.size() > 12) steps += ",...";
  char text[256];
  std::snprintf(text, sizeof(text),
                "step-time jitter: %zu steps (%s) took %.3f ms (median) against %.3f ms for "
                "the job's median step (threshold %.3f ms); those steps were analysed",
                j.steps.size(), steps.c_str(), j.spike_ns / 1e6, j.median_ns / 1e6,
                j.fence_ns / 1e6);
  return Evidence{"step_time_jitter", text, j.spike_ns, j.fence_ns};
}

}  // namespace

std::vector<Diagnosis> runDetectors(const DetectorRegistry& registry, const JobModel& whole,
                                    const DiagnoseOptions& options, const JobModel* baseline,
                                    const History* history, std::vector<DetectorRun>* runs) {
  const auto& detectors = registry.detectors();
  const bool narrowed = std::any_of(detectors.begin(), detectors.end(), [](const auto& d) {
    return d->needs().window != Window::kWhole;
  });
  // Fail-slow: when the job's step time rose at some step, the detectors of the recent window
  // look at the steps since, where the cause lives (before it, every rank was healthy and would
  // dilute it). Jitter (no level shift, spikes in a minority of steps): the culprit window is
  // the spike steps only.
  std::optional<FailSlow> fail_slow;
  std::optional<Jitter> jitter;
  std::optional<JobModel> recent, spiky;
  if (narrowed) {
    fail_slow = findFailSlow(whole, options);
    if (fail_slow) recent = whole.sinceStep(fail_slow->step);
    if (!fail_slow) jitter = findJitter(whole, options);
    if (jitter) spiky = whole.onlySteps(jitter->steps);
  }
  // Collective arrivals, once per distinct window.
  std::optional<std::map<int, ArrivalStats>> whole_arrivals, recent_arrivals, spiky_arrivals;
  auto window = [&](Window w) -> std::pair<const JobModel*, decltype(&whole_arrivals)> {
    if (w == Window::kCulprit && spiky) return {&*spiky, &spiky_arrivals};
    if (w != Window::kWhole && recent) return {&*recent, &recent_arrivals};
    return {&whole, &whole_arrivals};
  };

  std::vector<Diagnosis> out;
  if (runs != nullptr) runs->clear();
  for (const auto& detector : detectors) {
    const DetectorNeeds needs = detector->needs();
    const auto [job, arrivals] = window(needs.window);
    DetectorRun run{std::string(detector->name()), false, missing(needs, *job, baseline, history),
                    0};
    if (run.skipped.empty()) {
      const DetectorView view(*job, whole, options, baseline, history, out, arrivals);
      std::vector<Diagnosis> found = detector->run(view);
      if (needs.cites_window) {
        // The evidence that narrowed the window opens each diagnosis.
        std::optional<Evidence> cited;
        if (needs.window == Window::kCulprit && jitter) cited = jitterEvidence(*jitter);
        if (needs.window != Window::kWhole && fail_slow) cited = failSlowEvidence(*fail_slow);
        if (cited) {
          for (Diagnosis& d : found) d.evidence.insert(d.evidence.begin(), *cited);
        }
      }
      run.ran = true;
      run.diagnoses = found.size();
      for (Diagnosis& d : found) out.push_back(std::move(d));
    }
    if (runs != nullptr) runs->push_back(std::move(run));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Diagnosis& a, const Diagnosis& b) { return a.severity > b.severity; });
  return out;
}

}  // namespace flare::engine
