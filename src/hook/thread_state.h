// The wrappers' per-thread state: the re-entrancy depth (Guard) and the cache of signature ids by
// a 64-bit key (GEMM shapes, collectives, ...). Called on the launching thread; no locks.
#pragma once

#include <cstdint>

#include "src/timing/timing.h"

namespace flare::hook {

// Initial-exec TLS for the thread_locals every launch reads (this depth, the 1-in-N countdown of
// launch_sampling.h): libflare_hook.so is loaded at start-up (LD_PRELOAD), never dlopened, so
// they live in the static TLS block and are read %fs-relative, without the __tls_get_addr call
// of the default model (a few ns per access on an untimed launch).
#define FLARE_HOOK_TLS __attribute__((tls_model("initial-exec")))

// Re-entrancy depth of the calling thread: a vendor call made while another intercepted call
// is in progress (the runtime launching through the driver, cuBLAS launching its kernels) is
// forwarded untouched, so every op is recorded once, at the outermost API.
extern constinit thread_local int t_depth FLARE_HOOK_TLS;

struct Guard {
  Guard() : outer(t_depth++ == 0) {}
  ~Guard() { --t_depth; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  const bool outer;
};

// Per-thread cache of signature ids by a 64-bit key (GEMM shapes, collectives, ...).
bool cachedSignature(uint64_t key, uint32_t* id);
// Interns `sig` with the Tracer (0 when tracing is off) and caches its id under `key`.
uint32_t internSignature(uint64_t key, const timing::Signature& sig);

// The id for `key`, building the signature with make() only on a miss.
template <typename Make>
uint32_t signatureFor(uint64_t key, Make&& make) {
  uint32_t id = 0;
  if (cachedSignature(key, &id)) return id;
  return internSignature(key, make());
}

}  // namespace flare::hook
