// step_stats.h — the per-step statistics of one rank (issue 6), as ONE pure definition meant to
// be shared by the rank (summary mode, where raw compute ops never leave the process) and by
// flared (raw mode, from received ops: JobModel). Every field is measured inside its own step
// [start_ns, end_ns), so every StepStats it emits passes the daemon's validation by construction
// (docs/metrics.md, "Per-step statistics"):
//   - inter_ns: T_inter, the GPU idle gap around the step's first DataLoader `__next__` span:
//     from the latest end of the GPU ops started before the span (but not before the step's
//     start) to the first GPU op starting at/after the span's end (but not after the step's end);
//     0 when the step has no DataLoader call;
//   - minority_ns: union of OP_KIND_KERNEL op intervals clipped to the step;
//   - gpu_busy_ns: union of GPU op intervals clipped to the step;
//   - gpu_ops, issue_latency_sum_ns, issue_offset_sum_ns: the GPU ops *issued* in the step, as
//     stepIssueLatency sums them for the paired stall test;
//   - latency: a LatencySketch of those ops' issue latencies (mergeable across steps/ranks);
//   - run_queue_wait_ns: from the issuing threads' schedstat readings (runQueueWaitIn): the rank
//     fills it in summary mode, flared in raw mode from the readings the rank sent.
// Pure functions: no globals, no I/O; thread-compatible. Inputs are borrowed, output owned.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "src/stats/sketch.h"

namespace flare::records {

// One GPU op as the step computation needs it (rank clock, ns).
struct StepOp {
  int64_t issue = 0;
  int64_t start = 0;
  int64_t end = 0;
  bool kernel = false;  // OP_KIND_KERNEL (the "minority" kernels of V_minority)
};

// A host interval (a DataLoader `__next__` span).
struct StepSpan {
  int64_t start = 0;
  int64_t end = 0;
};

struct StepStats {
  int64_t step = 0;  // index into the step boundaries
  int64_t start_ns = 0, end_ns = 0;
  int64_t gpu_busy_ns = 0;
  int64_t inter_ns = 0;
  int64_t minority_ns = 0;
  uint64_t gpu_ops = 0;
  double issue_latency_sum_ns = 0;
  double issue_offset_sum_ns = 0;
  stats::LatencySketch latency{kStepSketchAccuracy};
  // How long the step's issuing thread waited for a CPU while runnable (the most of any thread
  // that issued its ops; runQueueWaitIn); -1: not measured.
  int64_t run_queue_wait_ns = -1;
  // Step sampling (FLARE_SAMPLE_STEPS): the step ran untimed; only its times and run-queue wait
  // are figures (StepStats.sampled_out in records.proto).
  bool sampled_out = false;

  static constexpr double kStepSketchAccuracy = 0.02;
  // What flared accepts of one step's host causes (StepStats.causes): at most this many, each
  // name at most kMaxCauseNameBytes and not empty. encodeStepStats keeps within both.
  static constexpr size_t kMaxHostCauses = 64;
  static constexpr size_t kMaxCauseNameBytes = 1024;

  // V_inter and V_minority as the diagnosis defines them (src/engine/diagnosis/signals.h
  // voidPerStep) (0 when undefined).
  double vInter() const;
  double vMinority() const;
};

// A DataLoader iterator's `__next__` (a traced API's qualified name): the input wait, and the
// step boundary where a rank sends no step markers (StepBoundaryRule says which of them).
inline bool isStepApiName(std::string_view qualified_name) {
  return qualified_name.ends_with("__next__");
}

// What a traced call means to the step boundaries: a DataLoader `__next__` (kLoader); training
// work (kTraining): a backward pass — a function or method named `backward` or `backward_step`
// (the defaults torch.autograd@backward and Megatron's schedules@backward_step) — or
// torch.optim.Optimizer@step; anything else (kOther).
enum class StepCallKind : uint8_t { kOther, kLoader, kTraining };
StepCallKind stepCallKind(std::string_view qualified_name);

// Which DataLoader `__next__` calls start a step, where a rank sends no step markers. THE rule,
// for the rank (summary mode, deep-trace step counts) and for flared and the offline tools (raw
// mode): every `__next__` starts a step until the rank has run training work; from then on, only
// a `__next__` with training work started since the previous boundary. Training work is a
// kTraining call or a CUDA graph launch (its issue time; the callers feed those as kTraining): a
// step captured whole in a graph (torch.cuda.graph) replays its backward and optimizer on the
// GPU with no such call on the host. An evaluation loop reads
// its validation DataLoader through the same `__next__` with no backward between its batches, so
// its batches and its StopIteration call stay inside the step that its first batch starts; the
// StopIteration call that ends an epoch starts the step of the next epoch's first batch; a step
// that reads several loaders counts once. Calls are compared by start time (ns, any clock), so
// a batch of calls is fed in start order (stepBoundaries sorts).
class StepBoundaryRule {
 public:
  // Returns whether the call starts a step (only ever a kLoader call).
  bool add(StepCallKind kind, int64_t start_ns);

 private:
  bool trained_ = false;
  int64_t last_training_ns_ = INT64_MIN;
  int64_t last_boundary_ns_ = INT64_MIN;
};

// A traced call for stepBoundaries.
struct StepCall {
  int64_t start_ns = 0;
  StepCallKind kind = StepCallKind::kOther;
};
// The step starts of one rank's traced calls (any order), sorted: StepBoundaryRule over them in
// start order.
std::vector<int64_t> stepBoundaries(std::vector<StepCall> calls);

// A thread's cumulative run-queue wait (ns runnable without a CPU, Linux schedstat) as read at
// times t: (t, waited) pairs, oldest first.
using RunQueueReadings = std::vector<std::pair<int64_t, int64_t>>;
// StepStats.run_queue_wait_ns of a step [s0, s1) whose ops `threads` issued: the most any of
// them waited inside it, each thread's counter interpolated linearly between its readings to the
// step's bounds (held past the newest), clamped to [0, s1 - s0]; a thread needs a reading at or
// before s0 and one after it. -1 when no thread is measured. The rank (StepAccumulator, summary
// mode) and flared (JobModel, raw mode: RecordBatch.run_queue) both use it.
int64_t runQueueWaitIn(const std::map<uint64_t, RunQueueReadings>& readings,
                       const std::set<uint64_t>& threads, int64_t s0, int64_t s1);

// Computes one StepStats per complete step [starts[i], starts[i+1]). `ops` must be GPU ops only;
// neither ops nor loader need be sorted. Steps with a non-positive length are skipped.
std::vector<StepStats> computeStepStats(std::span<const StepOp> ops,
                                        std::span<const StepSpan> loader,
                                        std::span<const int64_t> starts);

}  // namespace flare::records
