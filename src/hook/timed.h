// The shape every timed wrapper shares: guard → (outermost and tracing on?) begin → real call →
// end or cancel. Header-only so that it inlines into each wrapper.
#pragma once

#include <utility>

#include "src/hook/launch_sampling.h"
#include "src/hook/runtime.h"

namespace flare::hook {

// Runs `call` (the forwarded vendor call) timed on `stream`. `info()` builds the OpInfo (it
// may intern a signature on its first use); `ok(result)` says whether the call succeeded.
// kPerSignature: the call is sampled 1 in N per signature (GEMMs, async copies and sets;
// signatureTurn in launch_sampling.h); an untimed one is forwarded after its signature lookup.
template <bool kPerSignature = false, typename Call, typename Info, typename Ok>
auto timedCall(void* stream, Info&& info, Ok&& ok, Call&& call) {
  Guard guard;
  timing::Tracer* t = guard.outer ? tracer() : nullptr;
  if (!t) return call();
  timing::OpInfo op = info();
  if constexpr (kPerSignature) {
    if (op.signature_id != 0) {
      op.weight = signatureTurn(op.signature_id);
      if (op.weight == 0) return call();
    }
  }
  timing::Tracer::Ticket ticket;
  const bool timed = op.signature_id != 0 && t->begin(stream, &ticket);
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
template <typename Call, typename Info, typename Ok>
auto sampledCall(void* stream, Info&& info, Ok&& ok, Call&& call) {
  return timedCall<true>(stream, std::forward<Info>(info), std::forward<Ok>(ok),
                         std::forward<Call>(call));
}

}  // namespace flare::hook
