// flare_step (include/flare/step.h): an explicit step marker, recorded as a zero-length host span
// of the reserved signature "flare_step" (the daemon and the tools read it as a step boundary).
#include "flare/step.h"

#include "src/common/clock.h"
#include "src/hook/deep_trace.h"
#include "src/hook/runtime.h"

namespace flare::hook {
namespace {

constexpr char kStepName[] = FLARE_STEP_MARKER_NAME;

}  // namespace
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
  deepTraceOnStep();  // a step boundary for an armed or running deep trace (deep_trace.h)
  return 0;
}
