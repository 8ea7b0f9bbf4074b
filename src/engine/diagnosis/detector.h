// The detector plug-in interface: one Detector per kind of problem (a slow GPU, a slow link, a
// host stall, ...), each in its own file, listed in order in one place (registry.cc), run by one
// orchestrator (runDetectors; diagnose() in detectors.h runs the built-in list).
//
// A detector states what it needs (DetectorNeeds): the window of steps it reads, the healthy
// reference it cannot work without, and whether it reads raw ops or kernel summaries. The
// orchestrator builds that window once for every detector that asks for it, skips a detector
// whose reference or data is missing (and says so in DetectorRun), and hands each detector a
// DetectorView. A detector reads only the view and the shared signals (signals.h); it calls no
// other detector.
//
// Adding a detector: a new file `my_detector.cc` defining
//   std::unique_ptr<Detector> makeMyDetector();   // in namespace flare::engine
// one line `X(My)` in registry.cc's FLARE_DETECTORS, and the file in CMakeLists.txt.
//
// Threading: detectors hold no state between runs; run() is called on the caller's thread, one
// view at a time. A DetectorRegistry is built once and then only read.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/engine/diagnosis/diagnosis.h"
#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/signals.h"

namespace flare::engine {

// Which steps of the job a detector reads.
enum class Window {
  kWhole,  // every step of the analysed window, as given
  // The steps since the job's step time rose (a fail-slow change point, findFailSlow): where the
  // cause of a slow-down lives; the whole window when there is none.
  kRecent,
  // Where a culprit shows: kRecent, or, when the step time jitters without a level shift
  // (findJitter), only the spike steps (JobModel::onlySteps).
  kCulprit,
};
const char* windowName(Window window);

// The healthy reference a detector cannot work without; it is skipped when it is missing.
enum class Reference {
  kNone,               // runs on the job alone (and may use a baseline or history when given)
  kBaseline,           // a healthy run's model (flare-diagnose --baseline)
  kHistory,            // stored healthy history (flared)
  kBaselineOrHistory,  // either
};

// The records a detector reads; it is skipped when the job has none of them.
enum class Data {
  kAny,        // raw ops or summaries alike (step statistics, spans)
  kSummaries,  // kernel summaries (MODE_SUMMARY); skipped when no rank sent any
};

struct DetectorNeeds {
  Window window = Window::kRecent;
  Reference reference = Reference::kNone;
  Data data = Data::kAny;
  // When the window was narrowed (a fail-slow, a jitter), the detector's diagnoses open with the
  // evidence that narrowed it (step_time_change, step_time_jitter): the detector names a culprit
  // of that slow-down.
  bool cites_window = false;
};

// What one detector sees: the job in the window it asked for, the options, the references it
// may use, and the diagnoses of the detectors that ran before it (a detector may defer to them:
// a rank already named GPU-slow is not named again). Owned by the orchestrator; valid during
// run() only.
class DetectorView {
 public:
  DetectorView(const JobModel& job, const JobModel& whole, const DiagnoseOptions& options,
               const JobModel* baseline, const History* history,
               const std::vector<Diagnosis>& earlier,
               std::optional<std::map<int, ArrivalStats>>* arrivals_cache,
               std::string* note = nullptr)
      : job_(job),
        whole_(whole),
        options_(options),
        baseline_(baseline),
        history_(history),
        earlier_(earlier),
        arrivals_(arrivals_cache),
        note_(note) {}

  const JobModel& job() const { return job_; }      // the window asked for
  const JobModel& whole() const { return whole_; }  // the whole analysed window
  const DiagnoseOptions& options() const { return options_; }
  const JobModel* baseline() const { return baseline_; }  // null without one
  const History* history() const { return history_; }     // null without one
  const std::vector<Diagnosis>& earlier() const { return earlier_; }
  // collectiveArrivals(job()), computed once per window and shared by the detectors reading it.
  const std::map<int, ArrivalStats>& arrivals() const;
  // What the detector could not compare, in its own words, for "nothing found" to say so
  // (DetectorRun::note): "1 communicator (ranks 0-7), none with a peer to compare with".
  void note(std::string text) const {
    if (note_ != nullptr) *note_ = std::move(text);
  }

 private:
  const JobModel& job_;
  const JobModel& whole_;
  const DiagnoseOptions& options_;
  const JobModel* baseline_;
  const History* history_;
  const std::vector<Diagnosis>& earlier_;
  std::optional<std::map<int, ArrivalStats>>* arrivals_;
  std::string* note_;
};

class Detector {
 public:
  virtual ~Detector() = default;
  // Unique among the registered detectors: "gpu_slow", "link_slow", ... (a detector of one
  // diagnosis kind is named after it).
  virtual std::string_view name() const = 0;
  // The Diagnosis::kind values it may produce ("void" produces void_inter and void_minority).
  virtual std::vector<std::string_view> kinds() const = 0;
  virtual DetectorNeeds needs() const = 0;
  // The diagnoses found in `view` (none: nothing wrong, or too little data to say).
  virtual std::vector<Diagnosis> run(const DetectorView& view) const = 0;
};

// The ordered list of detectors. Order matters: it is the order of diagnoses of equal severity
// and of what view.earlier() holds.
class DetectorRegistry {
 public:
  // Appends `detector`; false (and the registry unchanged) when its name is taken.
  bool add(std::unique_ptr<Detector> detector);
  const std::vector<std::unique_ptr<Detector>>& detectors() const { return detectors_; }
  const Detector* find(std::string_view name) const;

 private:
  std::vector<std::unique_ptr<Detector>> detectors_;
};

// The built-in detectors (registry.cc), in the order diagnose() runs them.
const DetectorRegistry& builtinDetectors();

// What the orchestrator did with one detector.
struct DetectorRun {
  std::string name;
  bool ran = false;
  std::string skipped;  // why not, when !ran: "needs a baseline", "no kernel summaries", ...
  size_t diagnoses = 0;
  // The steps it read (empty when skipped): "all steps", "since the change point at step K"
  // (Window::kRecent after a fail-slow), "the jitter steps a,b,c" (Window::kCulprit on jitter).
  std::string window;
  // Set by the detector when part of what it is for could not be compared (DetectorView::note).
  std::string note;
};

// What a diagnosis looked at, for "nothing found" to say so (flare-diagnose, flared's
// /api/v1/jobs/{job}/diagnoses): the ranks, the steps analysed and every detector's run.
struct LookedAt {
  size_t ranks = 0;
  // The steps analysed, numbered as JobModel::stepStats numbers them (from the window's first
  // step boundary; step 0, the warm-up, is skipped): the smallest and largest over the ranks.
  // has_steps false when no rank has a complete step after its warm-up.
  bool has_steps = false;
  size_t first_step = 0, last_step = 0;
  // Rank-steps after the warm-up, summed over the ranks: measured, and sampled out by step
  // sampling (FLARE_SAMPLE_STEPS; their GPU figures were not measured).
  size_t steps_measured = 0, steps_sampled_out = 0;
  std::vector<DetectorRun> detectors;
};
LookedAt lookedAt(const JobModel& job, std::vector<DetectorRun> runs);
// "4 ranks, steps 1-8; window: all steps; 6 detectors ran (gpu_slow, ...); skipped:
// issue_latency_regression (needs a baseline or healthy history), ...; not compared: link_slow
// (...)" (one line, no newline).
std::string lookedAtText(const LookedAt& looked_at);
// {"ranks":4,"steps":[1,8],"stepsMeasured":32,"stepsSampledOut":0,"detectors":[{"name":..,"ran":true,"skipped":"","diagnoses":0,
// "window":"all steps","note":""},...]}; "steps":[] when has_steps is false.
std::string lookedAtJson(const LookedAt& looked_at);
// diagnosesToJson with a "lookedAt" key (lookedAtJson) after "diagnoses".
std::string diagnosesToJson(const std::vector<Diagnosis>& diagnoses, const LookedAt& looked_at);

// Runs every detector of `registry` in order on the view it needs, then orders the diagnoses by
// severity (stable: equal severities keep the registry's order). `runs`, when given, receives
// one entry per detector.
std::vector<Diagnosis> runDetectors(const DetectorRegistry& registry, const JobModel& job,
                                    const DiagnoseOptions& options, const JobModel* baseline,
                                    const History* history,
                                    std::vector<DetectorRun>* runs = nullptr);

}  // namespace flare::engine
