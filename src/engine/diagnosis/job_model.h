// A job's records, joined across ranks for diagnosis: what the detectors (detectors.h) read.
//
// Ranks intern signatures and API names with their own ids; the model maps them to job-wide ids
// so that "the same GEMM shape" or "the same traced API" can be compared across ranks. Signatures
// are equal when name, kind, dtype, shape and layout are equal.
//
// The model keeps every op and span it is given: it is built for a window of a job (the daemon
// feeds it the window it analyses; the offline tool feeds it a whole spool). Not thread-safe:
// one owner.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "flare/v1/records.pb.h"
#include "src/records/step_stats.h"
#include "src/stats/kde.h"

namespace flare::engine {

// Name, kind, dtype, shape and layout: equal across ranks and jobs for the same kernel call.
std::string signatureKey(const flare::v1::Signature& sig);

// One GPU op (or host synchronization span) of one rank, in the rank's epoch nanoseconds.
struct Op {
  uint32_t sig = 0;  // job-wide signature id (index into JobModel::signatures())
  int64_t issue = 0;
  int64_t start = 0;
  int64_t end = 0;
  uint64_t stream = 0;
  uint64_t comm = 0;  // collectives: communicator hash
  uint64_t seq = 0;
  int32_t nranks = 0;
  int32_t device = 0;  // CUDA device ordinal in the rank's process
  uint64_t flops = 0;
  uint64_t bytes = 0;
  uint64_t parent_span = 0;
  uint64_t thread = 0;
  // Launches this op stands for (KernelRecord.weight: 1-in-N sampled plain kernels), >= 1.
  uint32_t weight = 1;
  int64_t duration() const { return end - start; }
  int64_t issueLatency() const { return start - issue; }
};

// One traced Python call.
struct Span {
  uint32_t api = 0;  // job-wide API id (index into JobModel::apis())
  uint64_t id = 0;
  int64_t start = 0;
  int64_t end = 0;
  uint64_t thread = 0;
  int32_t gc_generation = -1;
};

// One duration cluster of a kernel summary as it came on the wire (KernelSummary.Cluster): 32
// bytes, where stats::DurationCluster also carries a min and max that summaries do not have.
struct WindowCluster {
  uint64_t count = 0;
  double p50 = 0;
  double p99 = 0;
  double sum = 0;
  stats::DurationCluster toDuration() const { return {count, p50, p99, sum, 0, 0}; }
};

// A summary window's clusters: up to kInline in place, more in one heap block of exactly their
// number. Most windows carry one or two clusters, so the daemon's window of a 10,000-rank job
// (~1,500 windows a rank) holds no heap block per window; a std::vector per window cost a
// malloc on every window received, and its growth left folded windows with 20 clusters'
// capacity for two kept (~530 KB a rank: docs/benchmarks.md, "Steady state").
class ClusterList {
 public:
  static constexpr uint32_t kInline = 2;

  ClusterList() noexcept {}
  ClusterList(const ClusterList& o) { assign(o.begin(), o.end()); }
  ClusterList(ClusterList&& o) noexcept { steal(o); }
  ClusterList& operator=(const ClusterList& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  ClusterList& operator=(ClusterList&& o) noexcept {
    if (this != &o) {
      release();
      steal(o);
    }
    return *this;
  }
  ~ClusterList() { release(); }

  const WindowCluster* begin() const { return data(); }
  const WindowCluster* end() const { return data() + size_; }
  WindowCluster* begin() { return data(); }
  WindowCluster* end() { return data() + size_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const WindowCluster& operator[](size_t i) const { return data()[i]; }
  // Bytes held outside the object (0 when the clusters are in place).
  size_t heapBytes() const { return cap_ > kInline ? cap_ * sizeof(WindowCluster) : 0; }

  void push_back(const WindowCluster& c);
  // Replaces the clusters with [first, last), in a block of exactly their number when they do
  // not fit in place. `first` may point into this list.
  void assign(const WindowCluster* first, const WindowCluster* last);

 private:
  WindowCluster* data() { return cap_ > kInline ? heap_ : inline_; }
  const WindowCluster* data() const { return cap_ > kInline ? heap_ : inline_; }
  void release();
  void steal(ClusterList& o) noexcept;
  // Frees what the list held and takes `block` (of `cap`, `size` of them set).
  void adopt(WindowCluster* block, uint32_t cap, uint32_t size);

  uint32_t size_ = 0;
  uint32_t cap_ = kInline;
  union {
    WindowCluster* heap_ = nullptr;
    WindowCluster inline_[kInline];
  };
};

// One KernelSummary of a rank (MODE_SUMMARY): the durations of one signature on one stream
// over one window, as clusters (count, p50, p99, sum).
struct SummaryWindow {
  uint32_t sig = 0;  // job-wide signature id
  uint64_t stream = 0;
  int64_t start = 0;  // window, rank's epoch ns
  int64_t end = 0;
  ClusterList clusters;
  double flops = 0;  // totals over the window's ops (the signature's per-call figures × count
  double bytes = 0;  // when the rank sent none)
  // The clusters' total count and duration, kept by JobModel with `clusters` (read for every
  // window by the detectors: without following the clusters' heap block).
  uint64_t n = 0;
  double sum_ns = 0;
  uint64_t count() const { return n; }
  double sumNs() const { return sum_ns; }
};

// One step's statistics as the rank computed them (MODE_SUMMARY, RecordBatch.step_stats): the
// detectors read these in place of the raw compute ops (stepStats()).
struct ReceivedStep {
  records::StepStats stats;  // step = 0; JobModel::stepStats numbers it
  // Step sampling: a measured step stands for itself and the steps sampled out since the
  // rank's previous measured one (addBatch); 1 without sampling.
  uint64_t weight = 1;
  // Job-wide API id (apis()) of a host cause → issue latencies of the ops it held up.
  std::vector<std::pair<uint32_t, stats::LatencySketch>> causes;
};

// Steps folded by JobModel::setCompaction: the issue-latency sketches (and host causes) of a
// rank's steps that started in one bucket of time, merged; the steps keep their figures.
struct CoarseSteps {
  int64_t start = 0, end = 0;  // of the steps folded in, rank's epoch ns
  stats::LatencySketch latency{records::StepStats::kStepSketchAccuracy};
  // The ops of `latency`, and the same weighted by their steps' ReceivedStep::weight: a weighted
  // reading scales the bucket by their ratio (its steps' weights are not kept one by one).
  uint64_t ops = 0, weighted_ops = 0;
  std::vector<std::pair<uint32_t, stats::LatencySketch>> causes;  // as ReceivedStep::causes
};

struct RankData {
  int rank = 0;
  std::string host;
  std::string device_name;
  std::string device_uuid;  // "GPU-..." (DeviceInfo.uuid); ranks sharing one share it
  std::vector<Op> ops;
  std::vector<Span> spans;
  std::vector<SummaryWindow> summaries;  // MODE_SUMMARY: compute ops arrive only as these
  std::vector<ReceivedStep> steps;       // MODE_SUMMARY: the rank's own per-step figures
  // Step sampling: the steps sampled out since the rank's last measured step, which the next
  // measured step stands for (its ReceivedStep::weight).
  uint64_t sampled_out_since_measured = 0;
  // setCompaction: the first `coarse_summaries` entries of `summaries` are folded windows; the
  // steps folded into `coarse_steps` keep their figures but not their sketches.
  size_t coarse_summaries = 0;
  std::vector<CoarseSteps> coarse_steps;
  int64_t newest_ns = INT64_MIN;  // the latest summary window or step end seen
  int64_t next_compaction_ns = INT64_MIN;
  uint64_t bad_step_stats = 0;       // step statistics that did not decode (ignored)
  std::vector<int64_t> step_starts;  // explicit step markers, if the rank sent any
  // MODE_RAW: each issuing thread's run-queue readings (RecordBatch.run_queue), time order;
  // stepStats() places each step's run_queue_wait_ns from them (records::runQueueWaitIn).
  std::map<uint64_t, records::RunQueueReadings> run_queue;
  static constexpr size_t kMaxRunQueueThreads = 256;
  uint64_t step_samples = 0;  // batch size of its latest step marker (0: ?)
  // A view of some steps (sinceStep, onlySteps): the end of the rank's warm-up in the whole
  // model (its second step boundary), which the view's own first steps are not. INT64_MIN: the
  // model's own (stepStarts()[1]).
  int64_t warmup_end_ns = INT64_MIN;
  flare::v1::DropCounters drops;  // the latest cumulative counters
  // Encoded size of each batch (its created_ns, bytes): what the rank sends per step.
  std::vector<std::pair<int64_t, uint64_t>> batch_bytes;
  std::unordered_map<uint32_t, uint32_t> sig_ids;  // rank's signature id -> job id
  std::unordered_map<uint32_t, uint32_t> api_ids;  // rank's API id -> job id
  uint64_t unknown_signature_records = 0;          // records whose table entry never came
};

class JobModel {
 public:
  // Adds one batch of `rank` (tables first, then records, as the batch orders them).
  void addBatch(int rank, const flare::v1::RecordBatch& batch);
  // The rank's host and GPU; an empty `device_uuid` keeps the one known.
  void setRankInfo(int rank, const std::string& host, const std::string& device_name,
                   const std::string& device_uuid = {});
  // The daemon's memory bound for MODE_SUMMARY ranks: kernel summaries and step sketches that
  // ended more than `fine_ns` before the rank's newest are folded as they age (each rank once
  // per `bucket_ns`, as its batches arrive): windows into one per signature, stream and
  // `bucket_ns` of time (clusters within 5% merged, at most 8), steps' issue-latency sketches
  // and host causes into one CoarseSteps per bucket. The warm-up (before the rank's second step
  // boundary) is never folded, nor is anything of a rank without two boundaries yet. Aggregates
  // over the window (means, distributions, counts, FLOPS) are unchanged; what a view of a few
  // steps (sinceStep, onlySteps) reads of a folded bucket is its windows whole, and no folded
  // step sketch. Off by default (0): offline tools keep full resolution.
  void setCompaction(int64_t fine_ns, int64_t bucket_ns);
  // The daemon's two halves of a job's window. takeRecords() moves every rank's records (ops,
  // spans, summaries, steps, step boundaries, batch sizes, bad-record counts) into a new model
  // with this one's tables and rank identities, and leaves this one its tables (the ids its
  // ranks' batches refer to) and ranks, empty of records: O(ranks). absorb() appends such a
  // model, taken from the model that feeds this one, after this one's records: its tables and
  // rank identities (host, device, latest counters) replace this one's, and aged records are
  // folded (setCompaction). Ingest adds batches to the feeding model; the detectors read this
  // one, which nothing else writes, so that neither waits for the other nor copies the window.
  JobModel takeRecords();
  void absorb(JobModel&& newer);
  // Forgets ops, spans and step markers that ended before `before_ns`, and the oldest ops of a
  // rank beyond `max_ops_per_rank` (the daemon keeps a sliding window per job).
  void trim(int64_t before_ns, size_t max_ops_per_rank);
  size_t opCount() const;
  // A copy holding only what each rank recorded from its step `step` on (ranks with fewer steps
  // keep nothing): the detectors' view after a fail-slow's onset.
  JobModel sinceStep(size_t step) const;
  // A copy holding only what each rank recorded inside the given steps (each rank's step k runs
  // from its k-th step boundary to the next; a rank without a boundary keeps nothing). The
  // copy's step boundaries are the kept steps' and, first, the boundary before the first kept
  // step (so that the detectors' warm-up skip drops nothing kept). For jitter windows.
  JobModel onlySteps(const std::vector<size_t>& steps) const;
  // A copy holding only what each rank issued before its step `step` began (a rank with fewer
  // step boundaries keeps everything): the job as the detectors would have seen it then.
  JobModel untilStep(size_t step) const;

  const std::map<int, RankData>& ranks() const { return ranks_; }
  const std::vector<flare::v1::Signature>& signatures() const { return signatures_; }
  const std::vector<std::string>& apis() const { return apis_; }

  // What the model holds of `rank` as one RecordBatch (job-wide signature and API ids + 1 as the
  // batch's ids; every signature and API name of the job in its tables; ops as KernelRecords,
  // spans, step boundaries as StepMarkers, kernel summaries): the records flared exports for a
  // timeline (GET /api/v1/jobs/{job}/records). Correlation ids and span parents are not kept by
  // the model and stay 0. nullopt when the rank is unknown.
  std::optional<flare::v1::RecordBatch> rankBatch(int rank) const;

  // Step boundaries of a rank: explicit markers, else the starts of the DataLoader `__next__`
  // spans that start a step (records::StepBoundaryRule). Empty when neither was recorded.
  std::vector<int64_t> stepStarts(int rank) const;
  // The end of a rank's warm-up: its second step boundary, or in a view of some steps
  // (sinceStep, onlySteps) the whole model's (RankData::warmup_end_ns). INT64_MIN when unknown.
  int64_t warmupEnd(int rank) const;

  // Per-step statistics of a rank: the ones it sent (MODE_SUMMARY), else computed from its ops
  // and spans with the same definition (src/records/step_stats.h): one entry per complete step,
  // oldest first, step = the index of its start among stepStarts(rank) (0: the window's first,
  // the warm-up the detectors skip). Empty when the rank sent none and has fewer than two step
  // starts. A step the rank sent comes without its issue-latency sketch (`latency` empty: copying
  // a sketch per step per call would dominate at 10,000 ranks); receivedSteps() has them.
  // Steps sampled out (FLARE_SAMPLE_STEPS: StepStats.sampled_out, their GPU figures not
  // measured) are left out unless `with_sampled_out` (for their times: the step is present).
  std::vector<records::StepStats> stepStats(int rank, bool with_sampled_out = false) const;
  // The measured steps a rank sent (MODE_SUMMARY) from its second step boundary on (the warm-up
  // skipped; sampled-out steps left out unless `with_sampled_out`: their times and run-queue
  // wait are measured), oldest first; empty in raw mode.
  std::vector<const ReceivedStep*> receivedSteps(int rank, bool with_sampled_out = false) const;

 private:
  // The tables (signatures, API names) without any rank: the start of a filtered copy.
  JobModel emptyCopy() const;
  // What a filtered copy keeps of a rank whatever the filter: identity, device, counters.
  static void copyRankIdentity(const RankData& r, RankData* o);
  void compactRank(RankData& r);
  // Folds the rank when due (setCompaction); RankData::newest_ns is kept where records arrive.
  void maybeCompact(RankData& r);
  uint32_t internSignature(const flare::v1::Signature& sig);
  uint32_t internApi(const std::string& name);

  std::map<int, RankData> ranks_;
  int64_t compact_fine_ns_ = 0;  // setCompaction; 0: off
  int64_t compact_bucket_ns_ = 0;
  std::vector<flare::v1::Signature> signatures_;
  std::unordered_map<std::string, uint32_t> signature_index_;
  std::vector<std::string> apis_;
  std::vector<records::StepCallKind> api_kinds_;  // records::stepCallKind of each of apis_
  std::unordered_map<std::string, uint32_t> api_index_;
};

}  // namespace flare::engine
