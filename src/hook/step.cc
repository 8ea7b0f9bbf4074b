// flare_step (include/flare/step.h): an explicit step marker, recorded as a zero-length host span
// of the reserved signature "flare_step" (the daemon and the tools read it as a step boundary).
#include "flare/step.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>

#include "src/common/clock.h"
#include "src/common/identity.h"
#include "src/common/log.h"
#include "src/common/mix.h"
#include "src/hook/deep_trace.h"
#include "src/hook/launch_sampling.h"
#include "src/hook/runtime.h"
#include "src/hook/step_boundary.h"
#include "src/timing/step_sampling.h"

namespace flare::hook {

bool stepSamplingAsked() {
  return sampleStepsSetting() > 1 || timingBudgetPct() > 0;
}

namespace {

constexpr char kStepName[] = FLARE_STEP_MARKER_NAME;

// Step sampling's state (guarded by mu): one decision per step boundary.
struct StepTurns {
  std::mutex mu;
  uint64_t seen = 0;   // boundaries met
  uint32_t since = 0;  // steps since the previous measured one, this one included
  uint64_t seed = 0;   // of the job id: every rank of the job measures the same steps
  // FLARE_TIMING_BUDGET_PCT: the step that started at the previous boundary, whether it was
  // measured, the Tracer's timing costs then (the launching threads', the event commands' GPU
  // time), their shares of a measured step (moving averages) and the K they give.
  int64_t prev_boundary_ns = 0;
  bool prev_measured = false;
  uint64_t prev_host_cost_ns = 0;
  uint64_t prev_records = 0;
  timing::TimingCostEstimate cost;
  uint32_t k_budget = 0;      // 0: not chosen yet
  bool allowed_seen = false;  // a boundary met while step sampling could apply (summary mode)
};

StepTurns& turns() {
  static StepTurns* t = [] {
    auto* s = new StepTurns;  // never destroyed: boundaries may come during exit
    s->seed = std::hash<std::string>{}(common::identityFromEnv().job_id);
    return s;
  }();
  return *t;
}

// Whether step `index` (counted from 1 at the first boundary) of the job is measured: one in K
// on average, pseudo-random in the index (no alias with a fault every k steps) and the same on
// every rank (a rank's steps are compared with the other ranks' same steps).
bool measuredStep(uint64_t seed, uint64_t index, int64_t k) {
  return common::mixBits(seed ^ (index * common::kGoldenGamma)) % static_cast<uint64_t>(k) == 0;
}

// FLARE_TIMING_BUDGET_PCT: from the step that ended at `boundary_ns` (when it was measured),
// the share of step time timing costs, and the K that keeps it within the budget. The cost is
// the launching threads' time in the Tracer plus the GPU time its event commands held their
// streams: the first is what a host-bound step pays, the second what a GPU-bound one pays, and
// their sum bounds either.
int64_t budgetSteps(StepTurns& s, int64_t boundary_ns, int64_t k_floor, double budget_pct) {
  timing::Tracer* t = tracer();
  const uint64_t host = t != nullptr ? t->hostCostNs() : 0;
  const uint64_t records = t != nullptr ? t->eventRecords() : 0;
  const int64_t gap = t != nullptr ? t->eventGapNs() : 0;
  // From the step that starts at the 2nd boundary on: the first ones carry one-time costs
  // (signatures interned, the event pool grown). K is chosen once the estimate has
  // TimingCostEstimate::kMinSteps steps (the warm-up's measured steps; until then K = the floor).
  if (s.prev_measured && s.seen >= 2 && boundary_ns > s.prev_boundary_ns) {
    const double step_ns = static_cast<double>(boundary_ns - s.prev_boundary_ns);
    // The step's event records, each one gap as measured by now (the first estimate may come
    // within the step).
    s.cost.addStep(static_cast<double>(host - s.prev_host_cost_ns) / step_ns,
                   static_cast<double>(records - s.prev_records) *
                       static_cast<double>(std::max<int64_t>(gap, 0)) / step_ns);
  }
  if (s.prev_measured && s.cost.ready()) {
    const double host_fraction = s.cost.hostFraction();
    const double gpu_fraction = s.cost.gpuFraction();
    const double cost = host_fraction + gpu_fraction;
    const uint32_t k =
        timing::nextStepsForBudget(cost, budget_pct, static_cast<uint32_t>(k_floor), s.k_budget);
    if (k != s.k_budget) {
      // The first choice where the user looks (info), later adjustments at debug level.
      ::flare::common::logAt(
          s.k_budget == 0 ? common::LogLevel::kInfo : common::LogLevel::kDebug, "hook",
          "flare: FLARE_TIMING_BUDGET_PCT={}{}: timing every op costs {:.2f}% of a step here "
          "({:.2f}% the launching threads' time, {:.2f}% the GPU time of the event records); "
          "timing one step in {} (every op of it){}",
          budget_pct, timingBudgetByDefault() ? " (the default in summary mode)" : "", 100 * cost,
          100 * host_fraction, 100 * gpu_fraction, k,
          gap > 0 ? ""
                  : "; the event gap is not measured (not yet, or FLARE_EVENT_GAP_CORRECTION=0):"
                    " the records' GPU time is not counted");
      s.k_budget = k;
    }
  }
  s.prev_boundary_ns = boundary_ns;
  s.prev_host_cost_ns = host;
  s.prev_records = records;
  return s.k_budget > 0 ? s.k_budget : k_floor;
}

void decideStep(int64_t boundary_ns) {
  if (!stepSamplingAsked()) return;
  const double budget = timingBudgetPct();
  int64_t k = sampleStepsSetting();
  StepTurns& s = turns();
  std::lock_guard<std::mutex> lock(s.mu);
  if (budget > 0) k = budgetSteps(s, boundary_ns, k, budget);
  ++s.seen;
  ++s.since;
  // Raw mode (or no summarizing sink yet) times every step: its records must hold every op, and
  // no summarizing builder takes the decision.
  const bool allowed = timing::stepSamplingAllowed();
  s.allowed_seen = s.allowed_seen || allowed;
  const bool measure =
      s.seen <= kWarmupSteps || !allowed || k <= 1 || measuredStep(s.seed, s.seen, k);
  s.prev_measured = measure;
  timing::StepDecision d;
  d.boundary_ns = boundary_ns;
  d.measured = measure;
  if (measure) {
    d.weight = s.since;
    s.since = 0;
  }
  // Until the next boundary (a loop's last step sampled out leaves what follows it untimed).
  timing::g_steps_untimed.store(!measure, std::memory_order_relaxed);
  if (allowed) timing::recordStepDecision(d);
  if (s.seen == kWarmupSteps + 1 && budget <= 0) {
    common::logOnce(common::LogLevel::kInfo, "hook", "step-sampling",
                    "flare: FLARE_SAMPLE_STEPS={}: from step {} on, every op of one step in {} "
                    "(the same steps on every rank of the job) is timed, and the kernels, GEMMs, "
                    "copies and sets of the others are not (summary mode only)",
                    k, kWarmupSteps + 1, k);
  }
}

}  // namespace

void stepSamplingAtExit() {
  if (!stepSamplingAsked()) return;
  StepTurns& s = turns();
  std::lock_guard<std::mutex> lock(s.mu);
  const char* why = nullptr;
  if (s.seen == 0) {
    why =
        "no step boundary was seen (trace the DataLoader's __next__, which FLARE_PYTHON_DEFAULTS "
        "does, or call flare_step() at each step's start)";
  } else if (!s.allowed_seen) {
    why = "the rank was not in summary mode at its step boundaries (raw mode times every step)";
  }
  if (why == nullptr) return;
  // The job's own setting that did nothing is a warning; the default budget that found no steps
  // to sample is information (the job is timed exactly, as it would be without the default).
  const bool by_default = timingBudgetByDefault();
  common::logOnce(by_default ? common::LogLevel::kInfo : common::LogLevel::kWarn, "hook",
                  "step-sampling-unused",
                  "flare: FLARE_SAMPLE_STEPS={} FLARE_TIMING_BUDGET_PCT={}{} had no effect: {}; "
                  "every op was timed",
                  sampleStepsSetting(), timingBudgetPct(),
                  by_default ? " (the default in summary mode)" : "", why);
}

void onStepBoundary(StepSource source, int64_t boundary_ns) {
  static std::atomic<bool> markers_seen{false};
  static std::atomic<uint64_t> loader_steps{0};  // DataLoader boundaries counted as steps
  if (source == StepSource::kMarker) {
    if (!markers_seen.load(std::memory_order_relaxed)) {
      markers_seen.store(true);
      const uint64_t before = loader_steps.load(std::memory_order_relaxed);
      if (before > 0) {  // the process switches from one source to the other: said once
        common::logOnce(common::LogLevel::kInfo, "hook", "step-source-markers",
                        "flare: flare_step() markers define this process's steps from now on; "
                        "DataLoader __next__ calls ({} counted as steps before) no longer start "
                        "one",
                        before);
      }
    }
  } else if (markers_seen.load(std::memory_order_relaxed)) {
    // Explicit markers define the steps: a DataLoader (an evaluation's, say) between two
    // markers is part of the step it runs in. Said once, where the user looks.
    common::logOnce(common::LogLevel::kInfo, "hook", "step-source-loader-ignored",
                    "flare: a DataLoader __next__ does not start a step in this process: its "
                    "flare_step() markers define the steps (a loader read between two markers "
                    "is part of the step it runs in)");
    return;
  } else {
    loader_steps.fetch_add(1, std::memory_order_relaxed);
  }
  decideStep(boundary_ns);
  deepTraceOnStep();
}

}  // namespace flare::hook

extern "C" __attribute__((visibility("default"))) int flare_step(void) {
  using namespace flare::hook;  // NOLINT
  Guard guard;
  flare::timing::Tracer* t = guard.outer ? tracer() : nullptr;
  if (t == nullptr) return -1;
  const uintptr_t key = reinterpret_cast<uintptr_t>(kStepName);
  flare::timing::OpInfo op;
  op.kind = flare::timing::OpKind::kSync;
  op.signature_id = signatureFor(hashBytes(&key, sizeof(key)), [] {
    flare::timing::Signature s;
    s.name = kStepName;
    s.kind = flare::timing::OpKind::kSync;
    return s;
  });
  if (op.signature_id == 0) return -1;
  const int64_t now = flare::common::monotonicNs();
  t->hostSpan(op, now, now);
  onStepBoundary(StepSource::kMarker, now);  // deep trace, step sampling (step_boundary.h)
  return 0;
}
