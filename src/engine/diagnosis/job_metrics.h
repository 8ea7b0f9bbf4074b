// The five metrics of a job (design.md "The metrics"), as the per-job gauges on flared's
// /metrics and the "metrics" object of the kernel report: throughput, achieved TFLOPS, bus
// bandwidth per collective kind, issue-latency W1 against healthy history, void percentages.
// Exact definitions: docs/metrics.md "Per-job gauges".
//
// Threading: pure functions over an immutable model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flare/v1/service.pb.h"
#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_model.h"

namespace flare::engine {

// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", ...
std::string collectiveKindName(flare::v1::CollectiveKind kind);

// Bus bandwidth (GB/s) of every complete instance of each collective signature (job-wide id):
// all `nranks` members present, t from the last member's start to the end, read on that
// member's own clock (the shortest member's kernel).
std::map<uint32_t, std::vector<double>> collectiveBusbw(const JobModel& job);

// The job-level bus bandwidth of each collective signature: the median of its collectiveBusbw
// instances (the figure JobMetrics.busbw gives per kind, per signature), keyed by
// signatureKey() so that the kernel report's rows (other ids) find theirs.
struct SignatureBusbw {
  double gbps = 0;
  uint64_t instances = 0;
};
std::map<std::string, SignatureBusbw> signatureBusbw(const JobModel& job);

// Over several healthy runs (flare-diagnose --baseline, given more than once): per collective
// signature (signatureKey), the lowest job busbw of the runs that measured it in at least
// `min_instances` complete instances, and how many runs did (DiagnoseOptions::
// link_baseline_busbw).
std::map<std::string, std::pair<double, uint32_t>> lowestBaselineBusbw(
    const std::vector<const JobModel*>& runs, uint64_t min_instances);

// `samples_per_step`: the job's batch size when configured (0: the largest `samples` a rank
// reported in its step markers; none: samples_per_second stays 0). `history` may be null.
flare::v1::JobMetrics computeJobMetrics(const JobModel& job, const History* history,
                                        uint64_t samples_per_step);

}  // namespace flare::engine
