// The shape every timed wrapper shares: guard → (outermost and tracing on?) begin → real call →
// end or cancel. Header-only so that it inlines into each wrapper.
#pragma once

#include "src/hook/runtime.h"

namespace flare::hook {

// Runs `call` (the forwarded vendor call) timed on `stream`. `info()` builds the OpInfo (it
// may intern a signature on its first use); `ok(result)` says whether the call succeeded.
template <typename Call, typename Info, typename Ok>
auto timedCall(void* stream, Info&& info, Ok&& ok, Call&& call) {
  Guard guard;
  timing::Tracer* t = guard.outer ? tracer() : nullptr;
  if (!t) return call();
  const timing::OpInfo op = info();
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

}  // namespace flare::hook
