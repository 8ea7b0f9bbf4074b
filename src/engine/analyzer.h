// The detectors inside flared: a sliding window of every job's records, diagnosed periodically;
// each new diagnosis becomes an alert (stored, logged as one line, counted in /metrics).
//
// Feed: Ingest calls onBatch() for every accepted batch (IngestConfig::on_batch). The window per
// job keeps the last `window_ns` of records and at most `max_ops_per_rank` ops per rank.
// run() diagnoses the jobs that received data since the previous run (src/engine/diagnosis).
//
// Duplicate alerts are merged: a diagnosis with the same (job, kind, ranks) as one already
// raised is not raised again (its repeat count grows); it is raised again once it has been
// absent for `forget_after_runs` consecutive runs.
//
// Threading: onBatch() is called on gRPC threads, run() and the accessors on flared's main
// thread or the HTTP thread; one mutex guards the windows (run() copies nothing: it diagnoses
// under the lock, bounded by the window size).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flare/v1/records.pb.h"
#include "flare/v1/service.pb.h"
#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/series.h"

namespace flare::engine {

class PromWriter;
class Store;

struct AnalyzerOptions {
  int64_t window_ns = 120LL * 1000000000LL;
  size_t max_ops_per_rank = 200000;
  int forget_after_runs = 6;
  DiagnoseOptions diagnose;
};

class Analyzer {
 public:
  // `store` may be null (alerts are then only logged and counted).
  Analyzer(Store* store, AnalyzerOptions options);

  void onBatch(const std::string& job_id, int32_t rank, const v1::RecordBatch& batch);
  // Diagnoses every job with new data; returns the alerts raised by this run.
  std::vector<v1::Alert> run(int64_t now_ns);
  // The current diagnoses of one job (not deduplicated): the on-demand query.
  std::vector<Diagnosis> diagnoseJob(const std::string& job_id);
  // The plot series of one job's window as JSON (diagnosis/series.h); nullopt when the job has
  // no window. `baseline_job` names a job whose window is the issue-latency reference (empty or
  // unknown: no baseline).
  std::optional<std::string> seriesJson(const std::string& job_id, const SeriesOptions& options,
                                        const std::string& baseline_job);
  void writeMetrics(PromWriter& w) const;

 private:
  struct JobWindow {
    JobModel model;
    bool fresh = false;  // data since the last run
    int64_t newest_ns = 0;
    // (kind, ranks) -> runs since it was last seen (0: seen in the last run)
    std::map<std::pair<std::string, std::vector<int>>, int> active;
  };

  Store* store_;
  AnalyzerOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, JobWindow> jobs_;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t>
      alerts_total_;  // job, kind, team
  uint64_t runs_ = 0;
};

// The alert of one diagnosis (rank -1 when it names several ranks or none).
v1::Alert toAlert(const std::string& job_id, const Diagnosis& d, int64_t now_ns);

}  // namespace flare::engine
