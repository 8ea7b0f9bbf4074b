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
//   - run_queue_wait_ns: rank side only (summary mode), from the issuing threads' schedstat.
// Pure functions: no globals, no I/O; thread-compatible. Inputs are borrowed, output owned.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
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
  // that issued its ops; StepAccumulator::addRunQueueWait); -1: not measured (raw mode).
  int64_t run_queue_wait_ns = -1;

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
// step boundary where a rank sends no step markers. The one test, for the rank and flared.
inline bool isStepApiName(std::string_view qualified_name) {
  return qualified_name.ends_with("__next__");
}

// Computes one StepStats per complete step [starts[i], starts[i+1]). `ops` must be GPU ops only;
// neither ops nor loader need be sorted. Steps with a non-positive length are skipped.
std::vector<StepStats> computeStepStats(std::span<const StepOp> ops,
                                        std::span<const StepSpan> loader,
                                        std::span<const int64_t> starts);

}  // namespace flare::records
