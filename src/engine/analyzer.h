// The detectors inside flared: a sliding window of every job's records, diagnosed periodically;
// each new diagnosis becomes an alert (stored, logged as one line, counted in /metrics, handed to
// `on_alert`: the webhook). Each run also computes the job's five metrics (job_metrics.h): the
// per-job gauges of /metrics and the "metrics" of the kernel report.
//
// Feed: Ingest calls onBatch() for every accepted batch (IngestConfig::on_batch). The window per
// job keeps the last `window_ns` of records and at most `max_ops_per_rank` ops per rank.
// run() diagnoses the jobs that received data since the previous run (src/engine/diagnosis).
//
// Duplicate alerts are merged: a diagnosis with the same (job, kind, ranks) as one already
// raised is not raised again (its repeat count grows); it is raised again once it has been
// absent for `forget_after_runs` consecutive runs.
//
// Healthy history: addBaseline() turns a job's window into a HealthyBaseline (history.h), kept
// in the store under "healthy/<job>" and in memory; the detectors compare every job with the
// baselines of its backend (device name of its ranks) and scale (world size): issue-latency
// regression with the learned W1 threshold, void thresholds learned from history.
//
// Threading: onBatch() is called on gRPC threads, run() on flared's analysis thread, the accessors
// on the main thread or the HTTP thread; one mutex guards the windows and the baselines. run() and
// diagnoseJob() hold it only to trim and copy a job's window (and history): the metrics and the
// detectors run on the copy without it, so ingest never waits for a large job's pairwise
// comparisons (it did: 1,000 summary-mode ranks stalled ingest and /metrics). The copy costs
// memory of one job's window while it is diagnosed. `on_alert` and `rank_meta` are called
// without blocking work: on_alert under the lock, rank_meta outside it.
#pragma once

#include <cstdint>
#include <functional>
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
#include "src/engine/diagnosis/history.h"
#include "src/engine/diagnosis/job_metrics.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/series.h"

namespace flare::engine {

class PromWriter;
class Store;

// What the analyzer learns of a rank from the daemon (its hello).
struct RankMeta {
  std::string host;
  std::string device_name;
  std::string device_uuid;
  int32_t world_size = 0;
};

struct AnalyzerOptions {
  int64_t window_ns = 120LL * 1000000000LL;
  size_t max_ops_per_rank = 200000;
  // MODE_SUMMARY ranks' summaries and step sketches older than this (before the rank's newest)
  // are folded into buckets of `fold_bucket_ns` (JobModel::setCompaction); 0: never.
  int64_t fold_after_ns = 10LL * 1000000000LL;
  int64_t fold_bucket_ns = 10LL * 1000000000LL;
  int forget_after_runs = 6;
  DiagnoseOptions diagnose;
  HistoryOptions history;
  uint64_t samples_per_step = 0;  // job batch size for samples/s (0: from step markers)
  // Looked up once per new (job, rank); empty: device names and world sizes stay unknown.
  std::function<RankMeta(const std::string& job_id, int32_t rank)> rank_meta;
  // Called for every raised (new, deduplicated) alert with its diagnosis; must not block.
  std::function<void(const v1::Alert&, const Diagnosis&)> on_alert;
};

class Analyzer {
 public:
  // `store` may be null (alerts are then only logged and counted; baselines only in memory).
  Analyzer(Store* store, AnalyzerOptions options);

  void onBatch(const std::string& job_id, int32_t rank, const v1::RecordBatch& batch);
  // Ingest refused something of a rank's batch (IngestConfig::on_refused). While a rank's data
  // is being refused (within the window), each run raises a `data_refused` diagnosis routed to
  // the infrastructure team, naming the ranks, the reasons and the last error: what the
  // detectors do not see, they say.
  void onRefused(const std::string& job_id, int32_t rank, const std::string& reason,
                 uint64_t batches, uint64_t items, const std::string& error, int64_t now_ns);
  // Diagnoses every job with new data; returns the alerts raised by this run.
  std::vector<v1::Alert> run(int64_t now_ns);
  // Moves what arrived into each job's analysed window (folding it) without running the
  // detectors. The daemon calls it about once a second between runs, so that records wait in
  // the ingest half for a second rather than a whole run interval (memory per rank).
  void handOver();
  // The current diagnoses of one job (not deduplicated): the on-demand query. `looked_at`, when
  // given, receives what the detectors looked at (ranks 0 and no detectors for an unknown job).
  std::vector<Diagnosis> diagnoseJob(const std::string& job_id, LookedAt* looked_at = nullptr);
  // The records of `ranks` (all when empty) in the job's window, one RecordBatch per rank
  // (JobModel::rankBatch), in rank order; nullopt when the job has no window.
  std::optional<std::vector<v1::RecordBatch>> recordBatches(const std::string& job_id,
                                                            const std::vector<int>& ranks);
  // The plot series of one job's window as JSON (diagnosis/series.h); nullopt when the job has
  // no window. `baseline_job` names a job whose window is the issue-latency reference (empty or
  // unknown: no baseline).
  std::optional<std::string> seriesJson(const std::string& job_id, const SeriesOptions& options,
                                        const std::string& baseline_job);
  void writeMetrics(PromWriter& w) const;

  // Marks the job's current window as healthy history. `backend` empty: the device name of its
  // ranks. Returns the stored record, or nullopt with *error (unknown job, too few ops).
  std::optional<v1::HealthyBaseline> addBaseline(const std::string& job_id,
                                                 const std::string& backend, int64_t now_ns,
                                                 std::string* error);
  // Forgets a job's baseline; false when it had none.
  bool removeBaseline(const std::string& job_id);
  // Every baseline, sketches and signatures left out.
  v1::ListBaselinesResponse listBaselines() const;

  // The five metrics of the job's latest run; nullopt before its first run.
  std::optional<v1::JobMetrics> jobMetrics(const std::string& job_id) const;
  // Adds the metrics, the number of baseline runs and each signature's history comparison to a
  // kernel report the Ingest filled (with backend and scale); unknown job: nothing is added.
  void enrichReport(v1::GetReportResponse* report) const;

 private:
  // A job's window in two halves (JobModel::takeRecords/absorb): ingest adds every batch to
  // `incoming` under mu_; the detectors and the queries read `model`, the analysed window,
  // under analysis_mu_, after moving what arrived into it. Neither waits for the other beyond
  // that O(ranks) hand-over, and the window is never copied.
  struct JobWindow {
    JobModel incoming;      // under mu_
    JobModel model;         // under analysis_mu_
    size_t window_ops = 0;  // model.opCount() after the last run (for /metrics), under mu_
    bool fresh = false;     // data since the last run
    bool pending = false;   // data in `incoming`
    int64_t newest_ns = 0;
    // (kind, ranks) -> runs since it was last seen (0: seen in the last run)
    std::map<std::pair<std::string, std::vector<int>>, int> active;
    std::set<int32_t> known_ranks;  // rank_meta asked
    std::string backend;            // device name of its lowest rank that reported one
    int32_t backend_rank = 0;       // the rank `backend` came from
    int32_t world_size = 0;
    std::optional<v1::JobMetrics> metrics;
    // Job-level busbw per collective signature (signatureKey), from the same run as `metrics`:
    // the kernel report's job_busbw_gbps. Under mu_.
    std::map<std::string, SignatureBusbw> signature_busbw;
    // What Ingest refused of each rank: per reason (batches, items), the last error and time.
    struct Refused {
      std::map<std::string, std::pair<uint64_t, uint64_t>> by_reason;
      std::string last_error;
      int64_t last_ns = 0;
    };
    std::map<int32_t, Refused> refused;  // under mu_
  };
  // The data_refused diagnosis of the ranks refused within the window before `now_ns`, if any;
  // forgets older refusals. Under mu_.
  std::optional<Diagnosis> refusedDiagnosis(JobWindow& w, int64_t now_ns) const;

  // The history of a job's backend and scale (cached; null when there is none). Under mu_.
  const History* historyFor(const JobWindow& w) const;
  // The job's analysed window with everything that arrived moved into it; null for an unknown
  // job. Caller holds analysis_mu_ (not mu_, which this takes).
  JobModel* syncedModel(const std::string& job_id);
  // What arrived in `w.incoming` since the last hand-over (JobModel::takeRecords). Under mu_.
  static JobModel takePending(JobWindow& w);
  static int32_t scaleOf(const JobWindow& w);
  static void noteBackend(JobWindow& w, int32_t rank, const std::string& device_name);
  // A job no longer in memory (flared restarted, or it left the window), rebuilt from the store:
  // its signatures and raw kernel records (no Python spans, no communicator of collectives: the
  // store keeps neither), with host, device name and world size from its job and rank rows.
  struct StoredJob {
    JobModel model;
    std::string backend;
    int32_t scale = 0;
  };
  std::optional<StoredJob> jobFromStore(const std::string& job_id) const;

  Store* store_;
  AnalyzerOptions options_;
  std::mutex analysis_mu_;  // the JobWindows' `model`; taken before mu_, never after
  mutable std::mutex mu_;
  std::map<std::string, JobWindow> jobs_;  // never erased: a JobWindow's address is stable
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t>
      alerts_total_;  // job, kind, team
  uint64_t runs_ = 0;
  std::map<std::string, v1::HealthyBaseline> baselines_;  // by job id
  mutable std::map<std::pair<std::string, int32_t>, History> history_cache_;
};

// The alert of one diagnosis (rank -1 when it names several ranks or none).
v1::Alert toAlert(const std::string& job_id, const Diagnosis& d, int64_t now_ns);

}  // namespace flare::engine
