// The detector plug-in contract (detector.h): the built-in registry names every diagnosis kind
// under unique names, and the orchestrator (runDetectors) runs a detector registered into a
// custom registry with the view it asked for: its window of steps, its reference (skipped, and
// saying so, without one), the diagnoses found before it, the evidence that narrowed its window.
#include "src/engine/diagnosis/detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "flare/step.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

// 4 ranks, 16 step markers: steps 0-7 take 30 ms, steps 8-15 45 ms (a fail-slow at step 8); one
// kernel per step.
JobModel failSlowJob() {
  JobModel m;
  for (int r = 0; r < 4; ++r) {
    flare::v1::RecordBatch b;
    b.set_rank(r);
    *b.add_signatures() = testing::stepMarkerSig(1);
    *b.add_signatures() = testing::kernelSig(2, "elementwise_kernel");
    int64_t t = 1'000'000'000 + 100'000 * r;
    for (int s = 0; s < 16; ++s) {
      auto* m0 = b.add_kernels();
      m0->set_signature_id(1);
      m0->set_issue_ns(t);
      m0->set_start_ns(t);
      m0->set_end_ns(t);
      auto* op = b.add_kernels();
      op->set_signature_id(2);
      op->set_stream_id(7);
      op->set_issue_ns(t + 1'000'000);
      op->set_start_ns(t + 2'000'000);
      op->set_end_ns(t + 3'000'000);
      t += s < 8 ? 30'000'000 : 45'000'000;
    }
    m.addBatch(r, b);
  }
  return m;
}

// What a recording detector saw.
struct Seen {
  bool ran = false;
  size_t runs = 0;   // views seen: a narrowed window, then the whole one
  size_t steps = 0;  // step starts of rank 0 in the first view.job()
  const JobModel* baseline = nullptr;
  size_t earlier = 0;
};

// Returns one diagnosis of kind "test" with `severity`, and records its view in `*seen`.
class Recorder final : public Detector {
 public:
  Recorder(std::string name, DetectorNeeds needs, double severity, Seen* seen)
      : name_(std::move(name)), needs_(needs), severity_(severity), seen_(seen) {}
  std::string_view name() const override { return name_; }
  std::vector<std::string_view> kinds() const override { return {"test"}; }
  DetectorNeeds needs() const override { return needs_; }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    if (!seen_->ran) seen_->steps = view.job().stepStarts(0).size();
    seen_->ran = true;
    ++seen_->runs;
    seen_->baseline = view.baseline();
    seen_->earlier = view.earlier().size();
    Diagnosis d;
    d.kind = "test";
    d.summary = name_;
    d.severity = severity_;
    d.evidence.push_back({"test", "measured", 1, 0});
    return {d};
  }

 private:
  std::string name_;
  DetectorNeeds needs_;
  double severity_;
  Seen* seen_;
};

DetectorNeeds needsOf(Window window, Reference reference = Reference::kNone,
                      bool cites_window = false) {
  DetectorNeeds n;
  n.window = window;
  n.reference = reference;
  n.cites_window = cites_window;
  return n;
}

TEST(DetectorRegistry, BuiltinListsEveryKindUnderUniqueNames) {
  const DetectorRegistry& registry = builtinDetectors();
  std::set<std::string> names, kinds;
  std::vector<std::string> order;
  for (const auto& d : registry.detectors()) {
    EXPECT_TRUE(names.insert(std::string(d->name())).second) << d->name();
    EXPECT_FALSE(d->kinds().empty()) << d->name();
    for (std::string_view k : d->kinds()) kinds.insert(std::string(k));
    order.push_back(std::string(d->name()));
    EXPECT_EQ(registry.find(d->name()), d.get());
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"shared_gpu", "gpu_slow", "link_slow", "issue_stall",
                                          "cpu_contention", "issue_latency_regression",
                                          "void_inter", "void_minority", "unoptimized_gemm"}));
  // issue_stall defers to gpu_slow (view.earlier()): both gpu_slow detectors run before it.
  auto at = [&order](const char* n) { return std::find(order.begin(), order.end(), n); };
  EXPECT_LT(at("gpu_slow"), at("issue_stall"));
  EXPECT_LT(at("gpu_slow_from_summaries"), at("issue_stall"));
  EXPECT_EQ(registry.find("no_such_detector"), nullptr);
}

TEST(DetectorRegistry, RefusesATakenName) {
  Seen a, b;
  DetectorRegistry registry;
  EXPECT_TRUE(registry.add(std::make_unique<Recorder>("x", DetectorNeeds{}, 0.1, &a)));
  EXPECT_FALSE(registry.add(std::make_unique<Recorder>("x", DetectorNeeds{}, 0.2, &b)));
  EXPECT_FALSE(registry.add(nullptr));
  EXPECT_EQ(registry.detectors().size(), 1u);
}

TEST(RunDetectors, ADetectorThatNeedsABaselineIsSkippedWithoutOneAndSaysSo) {
  const JobModel job = failSlowJob();
  const JobModel base = failSlowJob();
  Seen needs_base, plain;
  DetectorRegistry registry;
  registry.add(std::make_unique<Recorder>(
      "against_baseline", needsOf(Window::kWhole, Reference::kBaseline), 0.5, &needs_base));
  registry.add(std::make_unique<Recorder>("plain", needsOf(Window::kWhole), 0.2, &plain));
  std::vector<DetectorRun> runs;
  auto found = runDetectors(registry, job, DiagnoseOptions{}, nullptr, nullptr, &runs);
  EXPECT_FALSE(needs_base.ran);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "against_baseline");
  EXPECT_FALSE(runs[0].ran);
  EXPECT_EQ(runs[0].skipped, "needs a baseline");
  EXPECT_TRUE(runs[1].ran);
  EXPECT_EQ(runs[1].diagnoses, 1u);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].summary, "plain");
  // Healthy history is not a baseline.
  History history;
  runDetectors(registry, job, DiagnoseOptions{}, nullptr, &history, &runs);
  EXPECT_FALSE(runs[0].ran);

  found = runDetectors(registry, job, DiagnoseOptions{}, &base, nullptr, &runs);
  EXPECT_TRUE(runs[0].ran);
  EXPECT_TRUE(runs[0].skipped.empty());
  EXPECT_EQ(needs_base.baseline, &base);
  EXPECT_EQ(plain.earlier, 1u);  // the baseline detector's diagnosis, found before it
  ASSERT_EQ(found.size(), 2u);   // most severe first
  EXPECT_EQ(found[0].summary, "against_baseline");
  EXPECT_EQ(found[1].summary, "plain");
}

TEST(RunDetectors, EachDetectorSeesTheWindowItAskedForAndCitesWhatNarrowedIt) {
  const JobModel job = failSlowJob();
  const auto fail_slow = findFailSlow(job, DiagnoseOptions{});
  ASSERT_TRUE(fail_slow.has_value());
  Seen whole, recent, culprit;
  DetectorRegistry registry;
  registry.add(std::make_unique<Recorder>("whole", needsOf(Window::kWhole), 0.3, &whole));
  registry.add(std::make_unique<Recorder>("recent", needsOf(Window::kRecent), 0.2, &recent));
  registry.add(std::make_unique<Recorder>(
      "culprit", needsOf(Window::kCulprit, Reference::kNone, true), 0.1, &culprit));
  const auto found = runDetectors(registry, job, DiagnoseOptions{}, nullptr, nullptr);
  EXPECT_EQ(whole.steps, job.stepStarts(0).size());
  EXPECT_EQ(recent.steps, job.sinceStep(fail_slow->step).stepStarts(0).size());
  EXPECT_LT(recent.steps, whole.steps);
  EXPECT_EQ(culprit.steps, recent.steps);  // no jitter: the culprit window is the recent one
  // The narrowed detectors then read the whole window too; what they find there again (same
  // kind, same ranks) is not added twice.
  EXPECT_EQ(whole.runs, 1u);
  EXPECT_EQ(recent.runs, 2u);
  EXPECT_EQ(culprit.runs, 2u);
  ASSERT_EQ(found.size(), 3u);
  // Only the detector that cites its window opens with the fail-slow evidence.
  EXPECT_EQ(found[0].evidence.front().metric, "test");
  EXPECT_EQ(found[1].evidence.front().metric, "test");
  EXPECT_EQ(found[2].summary, "culprit");
  ASSERT_EQ(found[2].evidence.size(), 2u);
  EXPECT_EQ(found[2].evidence[0].metric, "step_time_change");
}

// Finds rank 3 only in a view of every step (a steady fault that the narrowed window, another
// rank's spike steps, does not show), and rank 1 in any view.
class SteadyOnRank3 final : public Detector {
 public:
  explicit SteadyOnRank3(size_t whole_steps) : whole_steps_(whole_steps) {}
  std::string_view name() const override { return "steady"; }
  std::vector<std::string_view> kinds() const override { return {"test"}; }
  DetectorNeeds needs() const override { return needsOf(Window::kCulprit); }
  std::vector<Diagnosis> run(const DetectorView& view) const override {
    std::vector<Diagnosis> out(1);
    out[0].kind = "test";
    out[0].ranks = {1};
    if (view.job().stepStarts(0).size() == whole_steps_) {
      out.emplace_back();
      out.back().kind = "test";
      out.back().ranks = {3};
    }
    return out;
  }

 private:
  size_t whole_steps_;
};

TEST(RunDetectors, ASteadyFaultOutsideTheNarrowedWindowIsStillFound) {
  const JobModel job = failSlowJob();
  DetectorRegistry registry;
  registry.add(std::make_unique<SteadyOnRank3>(job.stepStarts(0).size()));
  std::vector<DetectorRun> runs;
  const auto found = runDetectors(registry, job, DiagnoseOptions{}, nullptr, nullptr, &runs);
  std::vector<std::vector<int>> ranks;
  for (const Diagnosis& d : found) ranks.push_back(d.ranks);
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<std::vector<int>>{{1}, {3}}));  // rank 1 once
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].diagnoses, 2u);
  EXPECT_NE(runs[0].window.find(", then all steps"), std::string::npos) << runs[0].window;
}

TEST(RunDetectors, ASummaryDetectorIsSkippedOnARawJob) {
  Seen seen;
  DetectorNeeds n = needsOf(Window::kWhole);
  n.data = Data::kSummaries;
  DetectorRegistry registry;
  registry.add(std::make_unique<Recorder>("summaries", n, 0.1, &seen));
  std::vector<DetectorRun> runs;
  EXPECT_TRUE(
      runDetectors(registry, failSlowJob(), DiagnoseOptions{}, nullptr, nullptr, &runs).empty());
  EXPECT_FALSE(seen.ran);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].skipped, "no kernel summaries");
}

TEST(RunDetectors, DiagnoseRunsTheBuiltinRegistry) {
  const JobModel job = failSlowJob();
  std::vector<DetectorRun> runs;
  const auto a = runDetectors(builtinDetectors(), job, DiagnoseOptions{}, nullptr, nullptr, &runs);
  EXPECT_EQ(diagnosesToJson(diagnose(job, DiagnoseOptions{})), diagnosesToJson(a));
  ASSERT_EQ(runs.size(), builtinDetectors().detectors().size());
  for (const DetectorRun& r : runs) {
    if (r.name == "issue_latency_regression") {
      EXPECT_EQ(r.skipped, "needs a baseline or healthy history");
    } else if (r.name == "gpu_slow_from_summaries") {
      EXPECT_EQ(r.skipped, "no kernel summaries");
    } else {
      EXPECT_TRUE(r.ran) << r.name;
    }
  }
}

TEST(RunDetectors, LookedAtNamesTheRanksStepsWindowsAndTheSkippedDetectorsWithTheirReasons) {
  const JobModel job = failSlowJob();
  const auto fail_slow = findFailSlow(job, DiagnoseOptions{});
  ASSERT_TRUE(fail_slow.has_value());
  std::vector<DetectorRun> runs;
  const auto found = diagnose(job, DiagnoseOptions{}, nullptr, nullptr, &runs);
  const LookedAt l = lookedAt(job, runs);
  EXPECT_EQ(l.ranks, job.ranks().size());
  ASSERT_TRUE(l.has_steps);
  EXPECT_EQ(l.first_step, 1u);  // step 0 is the warm-up
  EXPECT_EQ(l.last_step, job.stepStarts(0).size() - 2);
  ASSERT_EQ(l.detectors.size(), builtinDetectors().detectors().size());
  const std::string since = "since the change point at step " + std::to_string(fail_slow->step);
  for (const DetectorRun& r : l.detectors) {
    if (!r.ran) {
      EXPECT_TRUE(r.window.empty()) << r.name;
      continue;
    }
    const Window w = builtinDetectors().find(r.name)->needs().window;
    EXPECT_EQ(r.window, w == Window::kWhole ? "all steps" : since + ", then all steps") << r.name;
  }
  const std::string text = lookedAtText(l);
  EXPECT_EQ(text.rfind(std::to_string(l.ranks) + " ranks, steps 1-" + std::to_string(l.last_step) +
                           "; windows: all steps (shared_gpu, slow_steps); " + since +
                           ", then all steps (gpu_slow, ",
                       0),
            0u)
      << text;
  EXPECT_NE(text.find(", unoptimized_gemm); 7 detectors ran (shared_gpu, gpu_slow, "),
            std::string::npos)
      << text;
  // The synthetic job's ranks sent no GPU UUID: shared_gpu says that it could not check.
  EXPECT_NE(text.find("not compared: shared_gpu (no rank reported its GPU's UUID)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("; skipped: gpu_slow_from_summaries (no kernel summaries), "
                      "issue_latency_regression (needs a baseline or healthy history)"),
            std::string::npos)
      << text;
  const std::string json = diagnosesToJson(found, l);
  const std::string plain = diagnosesToJson(found);
  EXPECT_EQ(json.rfind(plain.substr(0, plain.size() - 2) + ",\"lookedAt\":{\"ranks\":", 0), 0u)
      << json;
  EXPECT_NE(json.find("{\"name\":\"issue_latency_regression\",\"ran\":false,\"skipped\":"
                      "\"needs a baseline or healthy history\",\"diagnoses\":0,\"window\":\"\","
                      "\"note\":\"\"}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"steps\":[1," + std::to_string(l.last_step) + "]"), std::string::npos);
}

TEST(RunDetectors, LookedAtOnAHealthyJobSaysAllStepsOnce) {
  LookedAt l;
  l.ranks = 2;
  l.detectors = {{"a", true, "", 0, "all steps", ""}, {"b", false, "needs a baseline", 0, "", ""}};
  EXPECT_EQ(lookedAtText(l),
            "2 ranks, no complete step after the warm-up; window: all steps; 1 detector ran (a); "
            "skipped: b (needs a baseline)");
  EXPECT_EQ(lookedAtJson(l),
            "{\"ranks\":2,\"steps\":[],\"stepsMeasured\":0,\"stepsSampledOut\":0,"
            "\"detectors\":[{\"name\":\"a\",\"ran\":true,"
            "\"skipped\":\"\",\"diagnoses\":0,\"window\":\"all steps\",\"note\":\"\"},"
            "{\"name\":\"b\",\"ran\":false,\"skipped\":\"needs a baseline\",\"diagnoses\":0,"
            "\"window\":\"\",\"note\":\"\"}],"
            "\"text\":\"2 ranks, no complete step after the warm-up; window: all steps; 1 detector "
            "ran (a); skipped: b (needs a baseline)\"}");
  // A detector that ran but could not compare what it is for says so (DetectorView::note).
  l.detectors[0].note = "no peer";
  EXPECT_EQ(lookedAtText(l),
            "2 ranks, no complete step after the warm-up; window: all steps; 1 detector ran (a); "
            "skipped: b (needs a baseline); not compared: a (no peer)");
  EXPECT_NE(lookedAtJson(l).find("\"note\":\"no peer\""), std::string::npos);
}

}  // namespace
}  // namespace flare::engine
