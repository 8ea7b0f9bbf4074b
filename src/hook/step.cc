// flare_step (include/flare/step.h): an explicit step marker, recorded as a zero-length host span
// of the reserved signature "flare_step" (the daemon and the tools read it as a step boundary).
#include "flare/step.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

#include "src/common/clock.h"
#include "src/common/identity.h"
#include "src/common/log.h"
#include "src/hook/deep_trace.h"
#include "src/hook/launch_sampling.h"
#include "src/hook/runtime.h"
#include "src/hook/step_boundary.h"
#include "src/timing/step_sampling.h"

namespace flare::hook {
namespace {

constexpr char kStepName[] = FLARE_STEP_MARKER_NAME;

// Step sampling's state (guarded by mu): one decision per step boundary.
struct StepTurns {
  std::mutex mu;
  uint64_t seen = 0;   // boundaries met
  uint32_t since = 0;  // steps since the previous measured one, this one included
  uint64_t seed = 0;   // of the job id: every rank of the job measures the same steps
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
  uint64_t z = seed ^ (index * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's finalizer
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z % static_cast<uint64_t>(k) == 0;
}

void decideStep(int64_t boundary_ns) {
  const int64_t k = sampleStepsSetting();
  if (k <= 1) return;
  StepTurns& s = turns();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.seen;
  ++s.since;
  // Raw mode (or no summarizing sink yet) times every step: its records must hold every op, and
  // no summarizing builder takes the decision.
  const bool allowed = timing::stepSamplingAllowed();
  const bool measure = s.seen <= kWarmupSteps || !allowed || measuredStep(s.seed, s.seen, k);
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
  if (s.seen == kWarmupSteps + 1) {
    common::logOnce(common::LogLevel::kInfo, "hook", "step-sampling",
                    "flare: FLARE_SAMPLE_STEPS={}: from step {} on, every op of one step in {} "
                    "(the same steps on every rank of the job) is timed, and the kernels, GEMMs, "
                    "copies and sets of the others are not (summary mode only)",
                    k, kWarmupSteps + 1, k);
  }
}

}  // namespace

void onStepBoundary(StepSource source, int64_t boundary_ns) {
  static std::atomic<bool> markers_seen{false};
  if (source == StepSource::kMarker) {
    if (!markers_seen.load(std::memory_order_relaxed)) markers_seen.store(true);
  } else if (markers_seen.load(std::memory_order_relaxed)) {
    return;  // explicit markers define the steps
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
