// Detectors: from a job's records (job_model.h) to diagnoses a team can act on — which rank,
// which kernel or API, which metric proved it, and who should fix it.
//
// Every detector compares like with like, inside the job: the same GEMM signature across ranks
// (a slow GPU), communicators doing the same collective of the same size (a slow link), each
// rank's issue-latency distribution against the other ranks' (a host-side stall), the job's
// best GEMM efficiency (an un-optimized shape), and per-step void percentages against
// thresholds. Comparisons with healthy history (baselines) use the same functions with the
// baseline's model as the reference. Definitions and thresholds: docs/metrics.md.
//
// Culprits, not victims: in a synchronous job every rank waits for the slowest, so step time
// alone names no one. A slow GPU shows as slower kernels on that rank only, and that rank
// arrives last at collectives; a slow link shows as low bus bandwidth measured from the last
// arrival (so waiting is not counted) on exactly the communicators that contain it.
//
// The detectors are plug-ins (detector.h), one file per family, listed in registry.cc; what
// they measure is in signals.h. This header is the entry point callers use (flared's analyzer,
// flare-diagnose, tests): diagnose() runs the built-in list.
//
// Plain functions over an immutable model: thread-compatible, no state.
#pragma once

#include <vector>

#include "src/engine/diagnosis/detector.h"
#include "src/engine/diagnosis/diagnosis.h"
#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/signals.h"

namespace flare::engine {

// Runs the built-in detectors (builtinDetectors(), runDetectors in detector.h) on `job`; the
// diagnoses, most severe first. `baseline`: a healthy run's model (flare-diagnose --baseline).
// `history`: stored healthy runs of the job's backend and scale (flared): issue-latency regression
// with the learned threshold, and void thresholds learned from history in place of the configured
// ones. `runs`, when given, receives what became of each detector (ran, or skipped and why, and
// the window it read): for lookedAt() in detector.h.
std::vector<Diagnosis> diagnose(const JobModel& job, const DiagnoseOptions& options,
                                const JobModel* baseline = nullptr,
                                const History* history = nullptr,
                                std::vector<DetectorRun>* runs = nullptr);

}  // namespace flare::engine
