// The gpu_slow detectors' entry points (gpu_slow.cc), for tests and for views the orchestrator
// does not build.
//
// From raw ops (detectSlowGpu): per compute signature (GEMM, attention), each rank's median
// duration after its warm-up, compute that overlapped a collective on another stream left out,
// against the ranks' median (Tukey fence on the ratios, at least gpu_min_effect); a rank flagged
// on at least half of the compute time is diagnosed gpu_slow.
//
// From kernel summaries (detectSlowGpuFromSummaries, MODE_SUMMARY): when ranks send their compute
// kernels as KernelSummary clusters instead of raw records, the raw path sees no compute ops;
// per compute signature the ranks' summaries (all windows concatenated, clusters weighted by
// count) are compared by their mean 1-Wasserstein distance to the other ranks' rebuilt mixtures
// (flare_stats summaryOutliers, Tukey fences); a high outlier whose mean duration is also at
// least gpu_min_effect above the ranks' median mean is flagged for that signature. A rank
// flagged on at least half of the compute time (weighted by the signatures' total time) is
// diagnosed gpu_slow, like the raw detector, with the same kind, team and cause. Ranks already
// diagnosed gpu_slow in `*out` (by the raw path) are skipped. The W1 comparison reads each
// rank's newest windows up to 200,000 clusters per signature over the job (at least 16 per
// rank): every window for small jobs, the last seconds at 10,000 ranks.
//
// Both append to `*out`; `arrivals` (collectiveArrivals of `job`) give the arrival evidence.
// Threading: pure functions over a JobModel; one caller at a time per model.
#pragma once

#include <map>
#include <vector>

#include "src/engine/diagnosis/diagnosis.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/signals.h"

namespace flare::engine {

void detectSlowGpu(const JobModel& job, const DiagnoseOptions& options,
                   const std::map<int, ArrivalStats>& arrivals, std::vector<Diagnosis>* out);

void detectSlowGpuFromSummaries(const JobModel& job, const DiagnoseOptions& options,
                                const std::map<int, ArrivalStats>& arrivals,
                                std::vector<Diagnosis>* out);

}  // namespace flare::engine
