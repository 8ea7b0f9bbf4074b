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

namespace flare::engine {

// True when any rank of the job sent kernel summaries (MODE_SUMMARY): the detectors that need
// every op's times (issue stall, GPU idle / void, regression) are skipped for such a job.
bool hasSummaries(const JobModel& job);

// Each rank's summary windows grouped by signature, newest first within one, with each
// signature's count and duration over its windows: lets a detector go one signature at a time
// over every rank without holding every signature's values at once (at 10,000 ranks that was
// ~0.5 GB per pass, freed and faulted in again every pass).
struct SummaryIndex {
  struct Run {
    uint32_t sig;
    uint32_t lo, hi;  // [lo, hi) in `order`
    uint64_t count;
    double sum;
  };
  struct Rank {
    const RankData* data = nullptr;
    std::vector<std::pair<uint32_t, uint32_t>> order;  // (signature, window index), by signature
    std::vector<Run> runs;                             // by signature
    const Run* find(uint32_t sig) const;
    const SummaryWindow& window(uint32_t k) const { return data->summaries[order[k].second]; }
  };
  std::vector<Rank> ranks;     // in rank order
  std::vector<uint32_t> sigs;  // every signature indexed, ascending
};
// The windows whose signature `keep` selects (indexed by job-wide id); with `skip_warmup`, a
// rank's windows that start before its warm-up end are left out when it has later ones.
SummaryIndex indexSummaries(const JobModel& job, const std::vector<char>& keep, bool skip_warmup);

void detectSlowGpuFromSummaries(const JobModel& job, const DiagnoseOptions& options,
                                const std::map<int, ArrivalStats>& arrivals,
                                std::vector<Diagnosis>* out);

}  // namespace flare::engine
