// Magnitudes against a rank's own healthy steps (issue 21, item 3). When the job's step time
// rose at a change point (findFailSlow), a culprit's slow-down is measured as its own figures
// after the change against its own before it: not against the other ranks (whose figures, and
// the share of waiting in them, differ), and not over a window mixing healthy and slow steps.
// A fail-slow to 80% clock then reads 25% (kernels take 1/0.8 as long), not the 12-14% that a
// whole window or the job's step time gives. Definitions: docs/metrics.md ("Magnitudes").
//
// Plain functions over an immutable model: thread-compatible, no state.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "src/engine/diagnosis/diagnosis.h"
#include "src/engine/diagnosis/job_model.h"

namespace flare::engine {

// A rank's figure after a change point against its own before it.
struct OwnChange {
  size_t change_step = 0;                    // the job's fail-slow step (findFailSlow)
  size_t before_first = 0, before_last = 0;  // the steps compared (rank's step numbers)
  size_t after_first = 0, after_last = 0;
  double before = 0, after = 0;  // the figure's weighted value on each side
  double ratio = 1;              // after / before
  size_t signatures = 0;         // kernels or communicators compared
  bool from_summaries = false;   // kernel summaries' windows rather than raw ops
};

// GEMM/attention time of `rank` after the change against before: per signature with at least
// `min_samples` calls on each side, median (raw ops) or mean (kernel summaries, windows wholly
// on one side) duration after ÷ before, weighted by the signature's time after. Raw ops compare
// steps 1..K−2 with K+1..end (one step left out on each side of the change step K: a change
// point found one step early or late mixes nothing); summary windows compare those that end
// before step K with those that start at or after it. K is the job's fail-slow step, else the
// rank's own: the last rise of its GPU compute time per step by at least gpu_min_effect (binary
// segmentation; its GPU time is not moved by the host noise that can hide the job-level change).
// nullopt: no change, or too few calls on both sides.
std::optional<OwnChange> ownComputeChange(const JobModel& whole, const DiagnoseOptions& options,
                                          int rank);

// Bus bandwidth of the communicators `ranks` all belong to, after the change against before
// (complete instances, timed from the last arrival as link_slow does, binned by the first
// rank's step; steps as ownComputeChange's raw side); the communicator with the lowest ratio.
std::optional<OwnChange> ownBusbwChange(const JobModel& whole, const DiagnoseOptions& options,
                                        const std::vector<int>& ranks);

// "steps 1-12 against steps 15-29 of rank 3 (change point at step 14)".
std::string ownChangeSteps(const OwnChange& c);

// gpu_slow and link_slow diagnoses of one culprit: severity and summary from the rank's own
// change when there is one, with the evidence "own_change" saying what was compared. Others
// unchanged.
void measureAgainstOwnSteps(const JobModel& whole, const DiagnoseOptions& options,
                            std::vector<Diagnosis>* diagnoses);

}  // namespace flare::engine
