// Turns what a Sink receives (signatures, ops, API names, spans, drop counters) into
// flare.v1.RecordBatch messages: the one encoder of the rank's output, shared by the local spool
// (spool_sink.h) and the stream to flared.
//
// A batch holds the tables first seen since the previous batch (signatures and API names come
// before the records that use them), the kernel records and spans, and the cumulative drop
// counters. Times are converted from CLOCK_MONOTONIC to Unix-epoch nanoseconds with a ClockMap
// sampled when each batch is opened. A batch is closed at about `batch_bytes` of encoded records
// or at flush(), numbered (batch_seq 1, 2, ... without gaps) and handed to the owner's `emit`.
//
// Not thread-safe: called on the Tracer's poller thread only (like the Sink methods).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flare/v1/records.pb.h"
#include "src/common/clock.h"
#include "src/records/collective_blocks.h"
#include "src/records/step_accumulator.h"
#include "src/timing/step_sampling.h"
#include "src/timing/summary_aggregator.h"
#include "src/timing/timing.h"

namespace flare::timing {

struct BatchBuilderOptions {
  size_t batch_bytes = 64 * 1024;  // a batch is closed once its records reach about this size
  // Monotonic → epoch map, taken each time a batch is opened. Default: ClockMap::sample().
  std::function<common::ClockMap()> clock_map;
  // Called when a batch is closed, to add counters only the owner knows (spool or send drops).
  std::function<void(flare::v1::DropCounters*)> extra_drops;
  // MODE_SUMMARY when it returns true (asked at every addOps and addSpans; the exporter follows the
  // daemon's SetMode): compute ops go into a SummaryAggregator and leave as KernelSummary messages
  // at every flush() or once `summary_window_ns` of GPU time has passed; collectives, p2p and
  // blocking synchronizations (names with "Synchronize") and step markers (flare_step) stay raw
  // KernelRecords; other host spans (cudaStreamWaitEvent: one per layer, never blocking) are
  // summarised too. The records that stay raw leave out thread, parent span and correlation id
  // (the host-side join keys of the timeline and issue-stall analysis, which summary mode
  // gives up anyway), and the collectives among them leave as compact CollectiveBlocks
  // (collective_blocks.h: ~10 bytes per instance instead of ~60). Each completed step leaves as
  // one StepStats (step_accumulator.h: GPU busy, T_inter, minority time, issue-latency sums and
  // sketch, host causes), what the void, issue-stall and regression detectors read in place
  // of the raw ops. Unset: raw.
  std::function<bool()> summary_mode;
  int64_t summary_window_ns = 1'000'000'000;
  // MODE_SUMMARY: a thread's cumulative run-queue wait (ns) by its id, nullopt when unknown,
  // and the monotonic clock its readings are taken at. Each thread that issues GPU ops is read
  // at most every run_queue_period_ns (StepStats.run_queue_wait_ns). Default: a RunQueueReader
  // (run_queue.h) and common::monotonicNs.
  std::function<std::optional<int64_t>(uint32_t tid)> run_queue_wait;
  std::function<int64_t()> now_ns;
  static constexpr int64_t kRunQueuePeriodNs = 1'000'000;
  int64_t run_queue_period_ns = kRunQueuePeriodNs;
  // MODE_RAW: the threads that issued GPU ops in the last 10 s are read at most every
  // raw_run_queue_period_ns, each reading sent as a RunQueueReading for flared to place the raw
  // steps' run-queue wait (records::runQueueWaitIn); about 20 bytes per thread per reading.
  static constexpr int64_t kRawRunQueuePeriodNs = 10'000'000;
  int64_t raw_run_queue_period_ns = kRawRunQueuePeriodNs;
  // True once run-queue wait cannot be measured on this machine: the steps sent without it from
  // then on are counted (DropCounters.run_queue_unmeasured). Default: the default reader's off();
  // unset with a run_queue_wait of the caller's (a replay: no run-queue wait was recorded).
  std::function<bool()> run_queue_off;
  // Step sampling's decisions (step_sampling.h) recorded since the last call, taken at every
  // addOps in MODE_SUMMARY. Default: takeStepDecisions (the hook's).
  std::function<std::vector<StepDecision>()> step_decisions;
};

class BatchBuilder {
 public:
  // `emit` receives each closed batch; it may keep it (moved from). It is called from inside
  // the add*/flush calls.
  using Emit = std::function<void(flare::v1::RecordBatch&& batch)>;
  BatchBuilder(int rank, BatchBuilderOptions options, Emit emit);

  void addSignature(uint32_t id, const Signature& sig);
  void addOps(std::span<const CompletedOp> ops);
  void addApiName(uint32_t id, const std::string& qualified_name);
  void addSpans(std::span<const CompletedSpan> spans);
  // CUDA graph launches (issue times), before the spans of their pass: training work for the
  // step rule in MODE_SUMMARY (Sink::onGraphLaunches).
  void addGraphLaunches(std::span<const int64_t> issue_ns);
  // Deep-trace (CUPTI) records: always raw, whatever the mode.
  void addDeepTrace(std::span<const DeepTraceRecord> records);
  void setDrops(const DropCounters& totals);        // cumulative; goes out with the next batch
  void setDevice(const DeviceDescription& device);  // goes out once, with the next batch
  // Closes the open batch if it holds anything (or the drop counters changed).
  void flush();
  // The last flush (tracing stops): MODE_SUMMARY's last complete step goes out too.
  void finish();
  // Every op issued before `issued_before_ns` (monotonic) has been added: MODE_SUMMARY's steps
  // that ended before it are final (StepAccumulator::setWatermark).
  void setWatermark(int64_t issued_before_ns);

  uint64_t batchesClosed() const { return batch_seq_; }

 private:
  void openBatch();
  void account(size_t bytes);  // closes the batch once it is full
  void closeBatch();
  void addSummaries();            // the aggregator's open window, as KernelSummary messages
  void addStepStats(bool final);  // MODE_SUMMARY: the accumulator's completed steps
  void pullStepDecisions();       // step sampling's new decisions into decisions_
  // MODE_SUMMARY's last flush: the sampled-out steps no measured step stood for, in the kernel
  // summaries (MeasuredStepOps).
  void addTailSteps();
  // Step sampling's bookkeeping of one op in MODE_SUMMARY (MeasuredStepOps): the weight it is
  // added to the kernel summaries with (its own when step sampling is off or does not apply).
  uint64_t stepSampledWeight(const CompletedOp& op);
  void noteStepBoundary();  // MODE_SUMMARY: closes the warm-up's summary windows
  void summarizeSpans(std::span<const CompletedSpan> spans);  // MODE_SUMMARY: host events, steps
  void readRunQueue();         // MODE_SUMMARY: the issuing threads' run-queue wait, when due
  void addRunQueueReadings();  // MODE_RAW: the same, as RunQueueReading records, when due

  const int rank_;
  BatchBuilderOptions options_;
  Emit emit_;
  flare::v1::RecordBatch batch_;
  size_t batch_size_ = 0;  // estimate of batch_'s encoded size
  bool batch_open_ = false;
  uint64_t batch_seq_ = 0;
  common::ClockMap clock_map_;
  DropCounters drops_;
  bool drops_dirty_ = false;
  std::optional<flare::v1::DeviceInfo> device_;  // not sent yet
  SummaryAggregator aggregator_;
  records::CollectiveBlockWriter collectives_;                // the open batch's collective blocks
  flare::v1::KernelRecord scratch_;                           // a collective being added to a block
  std::unordered_map<uint32_t, uint64_t> collective_counts_;  // signature id → count (shape[0])
  records::StepAccumulator steps_;                            // MODE_SUMMARY's per-step statistics
  StepDecisions decisions_;       // step sampling: which steps were timed, and their weights
  MeasuredStepOps measured_ops_;  // step sampling: which ops stand for the sampled-out steps
  bool accumulating_ = false;     // the mode of the last addOps/addSpans
  // Asks summary_mode(); a change of mode resets the step accumulator. True: MODE_SUMMARY.
  bool summarizing();
  int boundaries_seen_ = 0;              // MODE_SUMMARY step boundaries seen, up to 2
  records::StepBoundaryRule step_rule_;  // which DataLoader calls start a step
  // A pass's DataLoader and training calls, put in start order for step_rule_ (reused); a
  // graph launch has no span.
  struct StepCallRef {
    int64_t start_ns;
    const CompletedSpan* span;  // nullptr: a graph launch
    records::StepCallKind kind;
  };
  std::vector<StepCallRef> step_calls_;
  std::vector<int64_t> graph_launches_;    // handed over, not yet fed to step_rule_
  int64_t run_queue_read_ns_ = INT64_MIN;  // when the issuing threads were last read
  static constexpr int64_t kRawIssuerIdleNs = 10'000'000'000;
  std::unordered_map<uint64_t, int64_t> raw_issuers_;  // MODE_RAW: thread → its latest launch
  uint64_t run_queue_unmeasured_ = 0;  // steps sent while run_queue_off() (cumulative)
  // kSync signatures: name, step marker?, summarised in MODE_SUMMARY (not a marker, not a
  // blocking "Synchronize" call)?
  struct SyncSignature {
    std::string name;
    bool marker = false;
    bool summarised = false;
  };
  std::unordered_map<uint32_t, SyncSignature> syncs_;
  struct Api {
    std::string name;                                            // qualified name
    records::StepCallKind kind = records::StepCallKind::kOther;  // records::stepCallKind(name)
  };
  std::unordered_map<uint32_t, Api> api_names_;  // API id → its name and step-rule kind
};

// The wire form of a DeviceDescription.
flare::v1::DeviceInfo toProtoDevice(const DeviceDescription& d);

// The wire enum of an OpKind and of a dtype string ("bf16", "fp16", "float32", ...).
flare::v1::OpKind toProtoKind(OpKind kind);
flare::v1::DType toProtoDType(const std::string& dtype);

}  // namespace flare::timing
