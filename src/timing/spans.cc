// Traced Python spans: the process-wide API-name registry and the per-thread stack of open spans
// (see timing.h). The stack lives here, not in a Tracer, so that spans opened before the first
// CUDA call still nest the ops launched under them once the Tracer is up.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/timing/timing.h"

namespace flare::timing {
namespace {

constexpr int kMaxDepth = 256;  // open spans per thread; deeper ones are counted, not recorded

struct OpenSpan {
  uint64_t id;
  uint32_t api_id;
  const void* key;
  int64_t start_ns;
};

// Trivially destructible: valid while other thread_local destructors run.
struct SpanStack {
  OpenSpan entries[kMaxDepth];
  int depth;
  int overflow;  // opens beyond kMaxDepth not yet closed
};
thread_local SpanStack t_stack;

std::atomic<uint64_t> g_next_span_id{1};
std::atomic<uint64_t> g_stack_drops{0};

// Lending. A traced API can block its thread while other threads launch its GPU work: PyTorch's
// `loss.backward()` waits while the autograd engine's device threads launch the backward
// kernels. Such a launching thread has no open span of its own; its ops nest under the span
// that lends to it: the most recently opened span still open on any thread. Each thread with
// spans publishes its innermost open span in a slot; g_lender caches the newest of them and is
// recomputed from the slots (cold path) when the span it names closes.
constexpr int kMaxLenderSlots = 256;  // threads that publish; beyond, a thread never lends
struct LenderSlot {
  std::atomic<uint64_t> id{0};  // the thread's innermost open span, 0: none
};
LenderSlot g_slots[kMaxLenderSlots];
std::atomic<int> g_slots_used{0};
std::atomic<uint64_t> g_lender{0};
thread_local int t_slot = -1;  // this thread's slot, -2: none left

void publish(uint64_t innermost) noexcept {
  if (t_slot == -1) {
    const int i = g_slots_used.fetch_add(1, std::memory_order_relaxed);
    t_slot = i < kMaxLenderSlots ? i : -2;
  }
  if (t_slot >= 0) g_slots[t_slot].id.store(innermost, std::memory_order_release);
}

// After the spans [first, last] of the calling thread closed (ids grow with opening time): if
// the lender was one of them, the newest span still open anywhere lends.
void closeLender(uint64_t first, uint64_t last) noexcept {
  const uint64_t closed = g_lender.load(std::memory_order_acquire);
  if (closed < first || closed > last) return;
  uint64_t newest = 0;
  const int used = std::min(g_slots_used.load(std::memory_order_relaxed), kMaxLenderSlots);
  for (int i = 0; i < used; ++i)
    newest = std::max(newest, g_slots[i].id.load(std::memory_order_acquire));
  uint64_t expected = closed;
  g_lender.compare_exchange_strong(expected, newest, std::memory_order_acq_rel);
}

struct ApiRegistry {
  std::mutex mu;
  std::unordered_map<std::string, uint32_t> ids;  // guarded by mu
  std::vector<std::string> names;                 // guarded by mu; id = index + 1
};
ApiRegistry& apiRegistry() {
  static auto* r = new ApiRegistry();  // never destroyed: used until the process ends
  return *r;
}

}  // namespace

uint32_t internApi(std::string_view qualified_name) noexcept {
  try {
    ApiRegistry& r = apiRegistry();
    std::string name(qualified_name);
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.ids.find(name);
    if (it != r.ids.end()) return it->second;
    r.names.push_back(name);
    const auto id = static_cast<uint32_t>(r.names.size());
    try {
      r.ids.emplace(std::move(name), id);
    } catch (...) {
      r.names.pop_back();
      return 0;
    }
    return id;
  } catch (...) {
    return 0;
  }
}

std::vector<std::string> apiNamesAfter(uint32_t first) {
  ApiRegistry& r = apiRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (first >= r.names.size()) return {};
  return {r.names.begin() + first, r.names.end()};
}

uint64_t openSpan(uint32_t api_id, const void* key, int64_t start_ns) noexcept {
  SpanStack& s = t_stack;
  if (s.depth >= kMaxDepth) {
    ++s.overflow;
    g_stack_drops.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  const uint64_t id = g_next_span_id.fetch_add(1, std::memory_order_relaxed);
  s.entries[s.depth++] = OpenSpan{id, api_id, key, start_ns};
  publish(id);
  g_lender.store(id, std::memory_order_release);
  return id;
}

bool closeSpan(const void* key, int64_t end_ns, CompletedSpan* out) noexcept {
  SpanStack& s = t_stack;
  if (s.overflow > 0) {  // Python frames nest: this close belongs to the deepest, unrecorded open
    --s.overflow;
    return false;
  }
  int i = s.depth - 1;
  while (i >= 0 && s.entries[i].key != key) --i;
  if (i < 0) return false;  // opened before tracing started (or already closed)
  if (i != s.depth - 1) {
    g_stack_drops.fetch_add(static_cast<uint64_t>(s.depth - 1 - i), std::memory_order_relaxed);
  }
  const OpenSpan& e = s.entries[i];
  *out = CompletedSpan{};
  out->id = e.id;
  out->api_id = e.api_id;
  out->parent_id = i > 0 ? s.entries[i - 1].id : 0;
  out->start_ns = e.start_ns;
  out->end_ns = end_ns;
  const uint64_t last = s.entries[s.depth - 1].id;
  s.depth = i;
  publish(i > 0 ? s.entries[i - 1].id : 0);
  closeLender(out->id, last);
  return true;
}

uint64_t currentSpanId() noexcept {
  const SpanStack& s = t_stack;
  if (s.depth > 0) return s.entries[s.depth - 1].id;
  return g_lender.load(std::memory_order_acquire);
}

uint64_t spanStackDrops() noexcept {
  return g_stack_drops.load(std::memory_order_relaxed);
}

}  // namespace flare::timing
