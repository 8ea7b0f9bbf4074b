// StepAccumulator: the rank side of MODE_SUMMARY's per-step statistics (issue 6). The
// BatchBuilder feeds it what the poller thread sees — GPU ops, host events (traced Python spans
// and host synchronization calls), DataLoader `__next__` spans and step markers — and takes the
// steps that are complete, each as the StepStats flared would compute from the raw records
// (computeStepStats, step_stats.h: one definition for both sides) plus the host causes the
// issue-stall detector names:
//
//   for every GPU op issued in the step, the host gap since the previous launch on its thread;
//   each host event on that thread that ended inside the gap and lasted at least half of it is
//   a cause of that op (src/engine/diagnosis/signals.cc causesBefore, the raw-mode definition); per
//   cause name, a LatencySketch of the issue latencies of the ops it held up.
//
// Step boundaries: step markers when the rank has sent any, else the starts of the DataLoader
// `__next__` spans that StepBoundaryRule says start a step (JobModel::stepStarts). Step k = [b_k,
// b_k+1) is taken once the boundary b_k+3 exists — two steps of slack for ops issued in step k that
// complete late — or at finish(). An op of a step already taken is counted in `late_ops` and left
// out of that step's figures. Memory: the ops of about two steps; at most `max_ops` ops are held (a
// job without boundaries, or a step larger than that, loses its oldest ops, counted in
// `overflow_ops`).
//
// Times are CLOCK_MONOTONIC ns (the caller converts boundaries to epoch ns on the wire).
// Not thread-safe: the poller thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/records/step_stats.h"
#include "src/stats/sketch.h"

namespace flare::records {

struct StepResult {
  StepStats stats;
  // Cause name → issue latencies of the step's GPU ops it held up (2% sketches).
  std::vector<std::pair<std::string, stats::LatencySketch>> causes;
  uint64_t late_ops = 0;  // ops of earlier, already taken steps seen since the previous result
  // With 1-in-N sampled plain kernels (an op of weight > 1 issued in the step): the launches
  // the step's ops stand for (sum of their weights); 0 when every op of the step had weight 1.
  uint64_t gpu_ops_estimated = 0;
};

class StepAccumulator {
 public:
  static constexpr size_t kDefaultMaxOps = size_t{1} << 18;
  // Steps of slack: step k leaves once boundary k+1+kSlackSteps exists. The host runs ahead of
  // the GPU by up to a step where it synchronizes on the previous step's event (the sim, and
  // double-buffered loops): one step of slack lost the late ops of such steps (their GPU time
  // and issue latencies), which raised GPU-idle stalls and hid minority kernels.
  static constexpr size_t kSlackSteps = 2;
  // With a watermark, a step waits for it unless kMaxSlackSteps later steps exist AND its end
  // is kMaxHoldNs older than the newest boundary: a stuck stream (a hang) cannot hold steps
  // back for ever, and a slow first launch (10-500 ms in the vendor call, its op on its way
  // the whole time) does not lose its op in a loop of short steps.
  static constexpr size_t kMaxSlackSteps = 8;
  static constexpr int64_t kMaxHoldNs = 2'000'000'000;
  // Run-queue readings held per thread; beyond, every other one is dropped (addRunQueueWait).
  static constexpr size_t kMaxRunQueueReadings = 4096;
  explicit StepAccumulator(size_t max_ops = kDefaultMaxOps) : max_ops_(max_ops) {}

  // A GPU op (any op that is not a host synchronization): kernel = OP_KIND_KERNEL. `weight`:
  // the launches it stands for (1-in-N sampling, timing::OpInfo::weight).
  void addGpuOp(int64_t issue, int64_t start, int64_t end, bool kernel, uint64_t thread,
                uint32_t weight = 1);
  // A host event that may hold up launches: a traced Python call or a synchronization call.
  void addHostEvent(int64_t start, int64_t end, uint64_t thread, const std::string& name);
  // A DataLoader `__next__` span (also a host event: add it there too): input wait, and a step
  // boundary when `starts_step` (StepBoundaryRule, step_stats.h, decides; the caller keeps it).
  void addLoaderSpan(int64_t start, int64_t end, bool starts_step = true);
  void addStepMarker(int64_t t);
  // A reading of a thread's cumulative run-queue wait (ns runnable but not running, Linux
  // schedstat) at monotonic time t; a thread's readings come in time order. A step's
  // run_queue_wait_ns is the most any thread that issued its ops waited inside the step, the
  // counter interpolated linearly between readings to the step's bounds (held past the newest);
  // -1 when no such thread has a reading at or before the step's start and one after it.
  void addRunQueueWait(uint64_t thread, int64_t t, int64_t waited_ns);
  // The threads that issued GPU ops recently (whose run-queue wait the owner reads).
  const std::map<uint64_t, int64_t>& issuingThreads() const { return last_issue_seen_; }

  // Every op issued before `issued_before_ns` has been added (the Tracer's watermark): a step
  // that ends at or before it is final. Without a watermark, steps leave with kSlackSteps of
  // slack; with one, at most kMaxSlackSteps and kMaxHoldNs late (a stuck stream holds the
  // watermark back).
  void setWatermark(int64_t issued_before_ns) {
    watermark_ = std::max(watermark_, issued_before_ns);
    has_watermark_ = true;
  }
  // The steps that are final (all complete ones when `final`), oldest first.
  std::vector<StepResult> take(bool final);
  // Forgets everything (the mode changed).
  void reset();

  uint64_t overflowOps() const { return overflow_ops_; }
  bool idle() const { return ops_.empty() && markers_.empty() && loader_.empty(); }

 private:
  struct PendingOp {
    StepOp op;
    uint64_t thread = 0;
    uint32_t weight = 1;
  };
  struct HostEvent {
    int64_t start = 0, end = 0;
    uint32_t name = 0;  // index into names_
  };
  const std::vector<int64_t>& boundaries() const {
    return markers_.empty() && !saw_marker_ ? loader_starts_ : markers_;
  }
  StepResult computeStep(int64_t s0, int64_t s1);
  void forgetBefore(int64_t s0, int64_t s1);

  size_t max_ops_;
  std::vector<PendingOp> ops_;
  std::map<uint64_t, std::vector<HostEvent>> host_;  // thread → events (unsorted)
  std::vector<StepSpan> loader_;
  std::vector<int64_t> loader_starts_;           // sorted, not taken yet
  std::vector<int64_t> markers_;                 // sorted, not taken yet
  bool saw_marker_ = false;                      // markers decide the boundaries from the first on
  int64_t taken_until_ = INT64_MIN;              // end of the last step taken
  std::map<uint64_t, int64_t> last_issue_;       // thread → latest launch of a taken step
  std::map<uint64_t, int64_t> last_issue_seen_;  // thread → latest launch added (any step)
  // thread → (t, cumulative run-queue wait) readings, oldest first
  std::map<uint64_t, RunQueueReadings> run_queue_;
  std::vector<std::string> names_;
  std::map<std::string, uint32_t> name_index_;
  uint64_t late_ops_ = 0;
  int64_t watermark_ = INT64_MIN;
  bool has_watermark_ = false;
  uint64_t overflow_ops_ = 0;
};

}  // namespace flare::records
