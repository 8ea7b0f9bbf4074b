// flare-diagnose: runs Flare's detectors on a job's records from an offline spool and prints
// the diagnoses (team, culprit ranks, evidence). The daemon runs the same detectors on live data.
//
//   flare-diagnose --input DIR [--job ID] [--baseline DIR]... [--baseline-job ID] [--until-step N]
//                  [--json]
//
// --baseline DIR: a healthy run of the same workload, backend and scale (its spool). Given more
// than once, the issue-latency regression threshold is the largest W1 between those healthy runs
// (design.md) and the first is the reference; given once, a proxy from that run's ranks is used.
// A communicator with no peer (pure data parallelism) is held to the slowest of them (link_slow).
//
// --until-step N diagnoses only what each rank issued before its step N began (steps counted from
// 0 by the rank's step markers): the diagnosis the job's first N steps allow (detection delay).
//
// What was looked at follows: "no anomaly found in 4 ranks, steps 1-8; window: all steps; 6
// detectors ran (...); skipped: issue_latency_regression (needs a baseline or healthy history),
// ..." when nothing is found, a "looked at ..." line after the diagnoses otherwise; with --json,
// a "lookedAt" object after "diagnoses" (lookedAtJson in src/engine/diagnosis/detector.h).
//
// Exit status: 0 nothing found, 3 diagnoses printed, 1 unreadable input, 2 bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_metrics.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/timeline/timeline.h"

namespace {

constexpr char kUsage[] =
    "usage: flare-diagnose --input DIR [--job ID] [--baseline DIR]... [--baseline-job ID]\n"
    "                      [--until-step N] [--json]\n";

bool load(const std::string& dir, const std::string& job, flare::engine::JobModel* model,
          std::string* error) {
  std::vector<flare::timeline::RankSource> sources;
  if (!flare::timeline::spoolSources(dir, job, {}, &sources, error)) return false;
  for (const auto& src : sources) {
    std::string e;
    if (!src.for_each_batch([&](const flare::v1::RecordBatch& b) { model->addBatch(src.rank, b); },
                            &e)) {
      std::fprintf(stderr, "flare-diagnose: warning: rank %d: %s\n", src.rank, e.c_str());
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, job, baseline_job, until;
  std::string baseline_dir;
  std::vector<std::string> baseline_dirs;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* dst) {
      if (i + 1 >= argc) return false;
      *dst = argv[++i];
      return true;
    };
    if ((a == "--input" && value(&input)) || (a == "--job" && value(&job)) ||
        (a == "--baseline" && value(&baseline_dir)) ||
        (a == "--baseline-job" && value(&baseline_job)) || (a == "--until-step" && value(&until))) {
      if (!baseline_dir.empty()) baseline_dirs.push_back(std::move(baseline_dir));
      baseline_dir.clear();
      continue;
    }
    if (a == "--json") {
      json = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "flare-diagnose: unexpected argument '%s'\n%s", a.c_str(), kUsage);
    return 2;
  }
  if (input.empty()) {
    std::fprintf(stderr, "flare-diagnose: --input DIR is required\n%s", kUsage);
    return 2;
  }
  size_t until_step = 0;
  if (!until.empty()) {
    char* end = nullptr;
    const long long v = std::strtoll(until.c_str(), &end, 10);
    if (end == until.c_str() || *end != '\0' || v < 1 || v > 1'000'000'000) {
      std::fprintf(stderr, "flare-diagnose: --until-step must be a step number >= 1, not '%s'\n",
                   until.c_str());
      return 2;
    }
    until_step = static_cast<size_t>(v);
  }
  flare::engine::JobModel model;
  std::vector<flare::engine::JobModel> baselines(baseline_dirs.size());
  std::string error;
  if (!load(input, job, &model, &error)) {
    std::fprintf(stderr, "flare-diagnose: %s\n", error.c_str());
    return 1;
  }
  std::vector<const flare::engine::JobModel*> baseline_ptrs;
  for (size_t i = 0; i < baseline_dirs.size(); ++i) {
    if (!load(baseline_dirs[i], baseline_job, &baselines[i], &error)) {
      std::fprintf(stderr, "flare-diagnose: baseline %s: %s\n", baseline_dirs[i].c_str(),
                   error.c_str());
      return 1;
    }
    baseline_ptrs.push_back(&baselines[i]);
  }
  flare::engine::DiagnoseOptions options;
  if (baselines.size() >= 2) {
    options.regression_healthy_spread_ns = flare::engine::healthyIssueLatencySpread(baseline_ptrs);
    options.link_baseline_busbw = flare::engine::lowestBaselineBusbw(
        baseline_ptrs, static_cast<uint64_t>(options.min_samples));
  }
  if (until_step > 0) model = model.untilStep(until_step);
  std::vector<flare::engine::DetectorRun> runs;
  const auto diagnoses = flare::engine::diagnose(
      model, options, baselines.empty() ? nullptr : &baselines[0], nullptr, &runs);
  const flare::engine::LookedAt looked_at = flare::engine::lookedAt(model, std::move(runs));
  if (json) {
    std::fputs(flare::engine::diagnosesToJson(diagnoses, looked_at).c_str(), stdout);
  } else if (diagnoses.empty()) {
    std::printf("no anomaly found in %s\n", flare::engine::lookedAtText(looked_at).c_str());
  } else {
    std::fputs(flare::engine::formatDiagnoses(diagnoses).c_str(), stdout);
    std::printf("looked at %s\n", flare::engine::lookedAtText(looked_at).c_str());
  }
  return diagnoses.empty() ? 0 : 3;
}
