#include "src/engine/diagnosis/detector.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <set>
#include <string>
#include <utility>

#include "src/common/text.h"
#include "src/engine/diagnosis/signals.h"

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
  // Where the onset came from: the job's step time alone, or a rank's GPU compute time per step
  // (findFailSlow), which the host's contention does not stretch.
  char where[192] = "change point";
  if (f.rank >= 0 && f.step == f.job_step) {
    std::snprintf(where, sizeof(where),
                  "change point; rank %d's GPU compute time per step rose there from %.3f ms to "
                  "%.3f ms",
                  f.rank, f.rank_before_ns / 1e6, f.rank_after_ns / 1e6);
  } else if (f.rank >= 0) {
    std::snprintf(where, sizeof(where),
                  "change point of rank %d's GPU compute time per step, from %.3f ms to %.3f ms; "
                  "the job's step time alone placed it at step %zu",
                  f.rank, f.rank_before_ns / 1e6, f.rank_after_ns / 1e6, f.job_step);
  }
  char text[384];
  std::snprintf(text, sizeof(text),
                "fail-slow: the job's step time rose from %.3f ms to %.3f ms (+%.1f%%) at step "
                "%zu (%s); the steps since were analysed",
                f.before_ns / 1e6, f.after_ns / 1e6, (f.after_ns / f.before_ns - 1) * 100, f.step,
                where);
  return Evidence{"step_time_change", text, f.after_ns, f.before_ns};
}

Evidence jitterEvidence(const Jitter& j) {
  const std::string steps = signals::stepList(j.steps);
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

  // Ranks that share a GPU (shared_gpu.cc): GPU-time findings whose ranks all share one are
  // left out (each run's note says how many); with no ranks named, when every rank shares.
  std::set<int> sharing;
  for (const signals::SharedGpu& g : signals::sharedGpus(whole)) {
    sharing.insert(g.ranks.begin(), g.ranks.end());
  }
  const bool all_share = !sharing.empty() && sharing.size() == whole.ranks().size();
  auto onSharedGpu = [&](const Diagnosis& d) {
    if (sharing.empty()) return false;
    if (d.kind != "gpu_slow" && d.kind != "unoptimized_gemm" && d.kind != "void_minority") {
      return false;
    }
    if (d.ranks.empty()) return all_share;
    return std::all_of(d.ranks.begin(), d.ranks.end(), [&](int r) { return sharing.count(r); });
  };

  std::vector<Diagnosis> out;
  if (runs != nullptr) runs->clear();
  for (const auto& detector : detectors) {
    const DetectorNeeds needs = detector->needs();
    const auto [job, arrivals] = window(needs.window);
    DetectorRun run{
        std::string(detector->name()), false, missing(needs, *job, baseline, history), 0, {}, {}};
    if (run.skipped.empty()) {
      if (spiky && job == &*spiky) {
        run.window = "the jitter steps " + signals::stepList(jitter->steps);
      } else if (recent && job == &*recent) {
        run.window = "since the change point at step " + std::to_string(fail_slow->step);
      } else {
        run.window = "all steps";
      }
      const DetectorView view(*job, whole, options, baseline, history, out, arrivals, &run.note);
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
      // A narrowed window shows the fault that narrowed it; a steady fault elsewhere (a slow GPU
      // beside another rank's host jitter) may not be in it: in one rank's spike steps that rank
      // arrives last, not the slow GPU. The whole window adds what the narrowed one missed: a
      // diagnosis of a kind and ranks not already found there.
      if (job != &whole && missing(needs, whole, baseline, history).empty()) {
        const DetectorView all(whole, whole, options, baseline, history, out, &whole_arrivals);
        for (Diagnosis& d : detector->run(all)) {
          const bool known = std::any_of(found.begin(), found.end(), [&d](const Diagnosis& f) {
            const bool shared = std::any_of(d.ranks.begin(), d.ranks.end(), [&f](int r) {
              return std::find(f.ranks.begin(), f.ranks.end(), r) != f.ranks.end();
            });
            return f.kind == d.kind && (shared || (d.ranks.empty() && f.ranks.empty()));
          });
          if (!known) found.push_back(std::move(d));
        }
        run.window += ", then all steps";
      }
      const auto shared_end = std::remove_if(found.begin(), found.end(), onSharedGpu);
      if (const auto left_out = std::distance(shared_end, found.end()); left_out > 0) {
        found.erase(shared_end, found.end());
        run.note += std::string(run.note.empty() ? "" : "; ") + "left out " +
                    std::to_string(left_out) + " finding" + (left_out == 1 ? "" : "s") +
                    " on ranks that share a GPU";
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

LookedAt lookedAt(const JobModel& job, std::vector<DetectorRun> runs) {
  LookedAt out;
  out.ranks = job.ranks().size();
  for (const auto& [rank, data] : job.ranks()) {
    for (const records::StepStats& st : job.stepStats(rank, /*with_sampled_out=*/true)) {
      if (st.step <= 0) continue;  // the warm-up, skipped by the detectors
      ++(st.sampled_out ? out.steps_sampled_out : out.steps_measured);
      const size_t step = static_cast<size_t>(st.step);
      out.first_step = out.has_steps ? std::min(out.first_step, step) : step;
      out.last_step = out.has_steps ? std::max(out.last_step, step) : step;
      out.has_steps = true;
    }
  }
  out.detectors = std::move(runs);
  return out;
}

std::string lookedAtText(const LookedAt& l) {
  std::string out = std::to_string(l.ranks) + (l.ranks == 1 ? " rank" : " ranks");
  if (l.has_steps) {
    out += l.first_step == l.last_step
               ? ", step " + std::to_string(l.first_step)
               : ", steps " + std::to_string(l.first_step) + "-" + std::to_string(l.last_step);
  } else {
    out += ", no complete step after the warm-up";
  }
  if (l.steps_sampled_out > 0) {
    out += " (GPU figures from " + std::to_string(l.steps_measured) + " measured rank-steps; " +
           std::to_string(l.steps_sampled_out) + " sampled out by step sampling)";
  }
  // The windows the detectors that ran read, in order of first use, with their detectors when
  // there is more than one.
  std::vector<std::pair<std::string, std::vector<std::string>>> windows;
  std::vector<std::string> ran;
  std::string skipped, notes;
  for (const DetectorRun& r : l.detectors) {
    if (r.ran && !r.note.empty())
      notes += (notes.empty() ? "" : ", ") + r.name + " (" + r.note + ")";
    if (!r.ran) {
      skipped += (skipped.empty() ? "" : ", ") + r.name + " (" + r.skipped + ")";
      continue;
    }
    ran.push_back(r.name);
    auto it = std::find_if(windows.begin(), windows.end(),
                           [&](const auto& w) { return w.first == r.window; });
    if (it == windows.end()) it = windows.insert(windows.end(), {r.window, {}});
    it->second.push_back(r.name);
  }
  auto join = [](const std::vector<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  if (windows.size() == 1) {
    out += "; window: " + windows[0].first;
  } else if (windows.size() > 1) {
    out += "; windows:";
    for (size_t i = 0; i < windows.size(); ++i)
      out += (i ? "; " : " ") + windows[i].first + " (" + join(windows[i].second) + ")";
  }
  out += "; " + std::to_string(ran.size()) + (ran.size() == 1 ? " detector ran" : " detectors ran");
  if (!ran.empty()) out += " (" + join(ran) + ")";
  if (!skipped.empty()) out += "; skipped: " + skipped;
  if (!notes.empty()) out += "; not compared: " + notes;
  return out;
}

std::string lookedAtJson(const LookedAt& l) {
  std::string out = "{\"ranks\":" + std::to_string(l.ranks) + ",\"steps\":[";
  if (l.has_steps) out += std::to_string(l.first_step) + "," + std::to_string(l.last_step);
  out += "],\"stepsMeasured\":" + std::to_string(l.steps_measured) +
         ",\"stepsSampledOut\":" + std::to_string(l.steps_sampled_out) + ",\"detectors\":[";
  for (size_t i = 0; i < l.detectors.size(); ++i) {
    const DetectorRun& r = l.detectors[i];
    out += (i ? "," : "") + std::string("{\"name\":") + common::jsonQuote(r.name) +
           ",\"ran\":" + (r.ran ? "true" : "false") +
           ",\"skipped\":" + common::jsonQuote(r.skipped) +
           ",\"diagnoses\":" + std::to_string(r.diagnoses) +
           ",\"window\":" + common::jsonQuote(r.window) + ",\"note\":" + common::jsonQuote(r.note) +
           "}";
  }
  // The same in words, so that clients print it as flare-diagnose does.
  return out + "],\"text\":" + common::jsonQuote(lookedAtText(l)) + "}";
}

std::string diagnosesToJson(const std::vector<Diagnosis>& diagnoses, const LookedAt& looked_at) {
  std::string out = diagnosesToJson(diagnoses);  // {"diagnoses":[...]}\n
  out.resize(out.size() - 2);
  return out + ",\"lookedAt\":" + lookedAtJson(looked_at) + "}\n";
}

}  // namespace flare::engine
