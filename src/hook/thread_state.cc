// The wrappers' per-thread state (thread_state.h).
#include "src/hook/thread_state.h"

#include <unordered_map>

#include "src/hook/runtime.h"

namespace flare::hook {

constinit thread_local int t_depth FLARE_HOOK_TLS = 0;

namespace {
std::unordered_map<uint64_t, uint32_t>& sigCache() {
  thread_local std::unordered_map<uint64_t, uint32_t> cache;
  return cache;
}
}  // namespace

bool cachedSignature(uint64_t key, uint32_t* id) {
  auto& c = sigCache();
  auto it = c.find(key);
  if (it == c.end()) return false;
  *id = it->second;
  return true;
}

uint32_t internSignature(uint64_t key, const timing::Signature& sig) {
  timing::Tracer* t = tracer();
  if (!t) return 0;
  uint32_t id = t->intern(sig);
  sigCache().emplace(key, id);
  return id;
}

}  // namespace flare::hook
