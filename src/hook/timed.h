// The shape every timed wrapper shares: guard → (outermost and tracing on?) begin → real call →
// end or cancel. Header-only so that it inlines into each wrapper.
#pragma once

#include <type_traits>
#include <utility>

#include "src/hook/launch_sampling.h"
#include "src/hook/runtime.h"
#include "src/hook/step_boundary.h"

namespace flare::hook {

// Runs `call` (the forwarded vendor call) timed on `stream` (a stream, or a function that
// returns it: looked up only for a call that is timed). `info()` builds the OpInfo (it may
// intern a signature on its first use); `ok(result)` says whether the call succeeded.
// kPerSignature: the call is sampled 1 in N per signature (GEMMs, async copies and sets;
// signatureTurn in launch_sampling.h); an untimed one is forwarded after its signature lookup.
template <bool kPerSignature = false, typename Stream, typename Call, typename Info, typename Ok>
auto timedCall(Stream&& stream, Info&& info, Ok&& ok, Call&& call) {
  Guard guard;
  timing::Tracer* t = guard.outer ? tracer() : nullptr;
  if (!t) return call();
  timing::OpInfo op = info();
  const bool step_untimed = timing::stepsUntimed();  // a step sampled out (FLARE_SAMPLE_STEPS)
  if constexpr (kPerSignature) {
    // A signature's first calls on this thread are timed in any step, so that a shape that runs
    // only in steps sampled out (an evaluation pass's GEMMs) still has a record.
    const bool first_calls =
        op.signature_id != 0 && stepSamplingAsked() && signatureFirstCalls(op.signature_id);
    if (step_untimed && !first_calls) {
      t_sampler.skipped = true;
      return call();
    }
    if (first_calls) op.flags |= timing::kOpFirstCalls;
    if (op.signature_id != 0) {
      op.weight = signatureTurn(op.signature_id);
      if (op.weight == 0) {
        t_sampler.skipped = true;
        return call();
      }
    }
  }
  if (step_untimed) op.flags |= timing::kOpInSampledOutStep;  // a collective, mostly
  if (t_sampler.skipped) {  // its start event need not follow the last timed op's end event
    op.flags |= timing::kOpAfterUntimed;
    t_sampler.skipped = false;
  }
  timing::Tracer::Ticket ticket;
  void* s = nullptr;
  if constexpr (std::is_invocable_v<Stream>) {
    s = op.signature_id != 0 ? static_cast<void*>(stream()) : nullptr;
  } else {
    s = static_cast<void*>(stream);
  }
  const bool timed = op.signature_id != 0 && t->begin(s, &ticket);
  auto result = call();
  if (timed) {
    if (ok(result)) {
      t->end(&ticket, op);
    } else {
      t->cancel(&ticket);
    }
  }
  return result;
}

// timedCall sampled per signature (FLARE_SAMPLE_CALLS): GEMMs, async copies and sets.
template <typename Stream, typename Call, typename Info, typename Ok>
auto sampledCall(Stream&& stream, Info&& info, Ok&& ok, Call&& call) {
  return timedCall<true>(std::forward<Stream>(stream), std::forward<Info>(info),
                         std::forward<Ok>(ok), std::forward<Call>(call));
}

}  // namespace flare::hook
