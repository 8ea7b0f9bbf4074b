// Detectors on kernel summaries (MODE_SUMMARY): when ranks send their compute kernels as
// KernelSummary clusters instead of raw records, the raw-op detectors (detectors.cc) see no
// compute ops; these compare ranks per signature on the summaries instead.
//
// gpu_slow from summaries: per compute signature (GEMM, attention) the ranks' summaries (all
// windows concatenated, clusters weighted by count) are compared by their mean 1-Wasserstein
// distance to the other ranks' rebuilt mixtures (flare_stats summaryOutliers, Tukey fences); a
// high outlier whose mean duration is also at least gpu_min_effect above the ranks' median mean
// is flagged for that signature. A rank flagged on at least half of the compute time (weighted
// by the signatures' total time) is diagnosed gpu_slow, like the raw detector, with the same
// kind, team and cause. Ranks already diagnosed gpu_slow by the raw path are skipped. The
// W1 comparison reads each rank's newest windows up to 200,000 clusters per signature over the
// job (at least 16 per rank): every window for small jobs, the last seconds at 10,000 ranks.
//
// Threading: pure functions over a JobModel; one caller at a time per model.
#pragma once

#include <map>
#include <vector>

#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/signals.h"

namespace flare::engine {

void detectSlowGpuFromSummaries(const JobModel& job, const DiagnoseOptions& options,
                                const std::map<int, ArrivalStats>& arrivals,
                                std::vector<Diagnosis>* out);

}  // namespace flare::engine
