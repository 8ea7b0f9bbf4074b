// The Tracer: event pool, per-thread rings, the poller thread and the GPU → host clock map.
// This file: construction, destruction and the calls of any thread; the other parts are listed
// in tracer_impl.h.
//
// Layout (one Tracer; k launching threads; one poller):
//
//   launching thread (hook wrapper)                  │ poller thread (every poll_interval)
//   ┌──────────────────────────────────────────┐     │
//   │ ThreadState, registered on first use     │     │
//   │  cache: ≤ 64 free events of one device ◀─┼─┐   │
//   │  ring:  SpscRing<PendingOp> (112 B)   ┼─┼───┼─▶ drain every ring
//   └──────────────────────────────────────────┘ │   │    ├ host spans: done at once
//                         refill 32 at a time ───┘   │    └ GPU ops: FIFO per (device, stream)
//   ┌──────────────────────────────────────────┐     │        head's end event Ready? map, emit
//   │ global pool (mutex): free events per     │◀────┼─────── events back, once per pass
//   │ device; ≤ max_events created, 64 a chunk │     │      ▼
//   └──────────────────────────────────────────┘     │    Sink: onSignature, onOps, onDrops
//
// Steady state on the launching thread: a thread-local pointer compare, two events from the
// private cache, two event records, one clock read, one ring push. The pool mutex is taken
// once per 16 ops to refill (held for a copy of 32 pointers); the poller returns finished
// events once per pass with try_lock, deferring to its next pass rather than sleeping on the
// mutex, so a launching thread's unlock never has a waiter to wake (no futex syscall). The
// registry mutex is taken once per thread. Trade-offs: events parked in a thread's cache (≤ 64) are
// not available to other threads until that thread exits, and a thread that alternates
// devices refills at every switch (the cache holds one device's events, because an event can
// only be recorded on streams of the context it was created in).
//
// Lifetimes: a ThreadState is shared between the thread's thread_local table and the Tracer's
// registry (shared_ptr). When the thread exits (or evicts it from its table), it sets
// `exited`; the poller drains the ring once more, takes the cached events back and drops its
// reference. A Tracer's id is unique in the process, so a new Tracer at the address of a dead
// one never matches a stale thread_local entry.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include "src/common/log.h"
#include "src/timing/tracer_impl.h"

namespace flare::timing {
using namespace tracer_internal;

namespace {

std::atomic<uint64_t> g_next_tracer_uid{1};

// Length-prefixed fields: no two different signatures share a key.
std::string canonicalKey(const Signature& sig) {
  std::string key;
  key.reserve(sig.name.size() + sig.dtype.size() + sig.layout.size() + 16 * sig.shape.size() + 32);
  auto put = [&key](std::string_view text) {
    key += std::to_string(text.size());
    key += ':';
    key += text;
  };
  put(sig.name);
  key += std::to_string(static_cast<int>(sig.kind));
  key += '|';
  put(sig.dtype);
  key += std::to_string(sig.shape.size());
  for (int64_t dim : sig.shape) {
    key += ',';
    key += std::to_string(dim);
  }
  key += '|';
  put(sig.layout);
  return key;
}

}  // namespace

Tracer::Impl::Impl(DeviceTimer* timer, const common::Clock* clock, Sink* sink, TracerOptions opts)
    : timer_(timer),
      clock_(clock),
      sink_(sink),
      opts_(opts),
      uid_(g_next_tracer_uid.fetch_add(1, std::memory_order_relaxed)) {
  poll_ns_ = std::max(opts_.poll_interval_ns, kMinPollNs);
  if (timer_ == nullptr || clock_ == nullptr || sink_ == nullptr) {
    disabled_.store(true);
    FLARE_LOG_WARN(kLog, "tracer created without a device timer, clock or sink; timing is off");
    return;
  }
  last_flush_ns_ = clock_->nowNs();
  out_.reserve(kEmitBatch);
  // The poller blocks every signal: the application's handlers never run on it.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  const bool masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
  try {
    poller_ = std::make_unique<std::thread>([this] { pollerMain(); });
  } catch (...) {
    disabled_.store(true);
    FLARE_LOG_WARN(kLog, "could not start the timing thread; timing is off");
  }
  if (masked) pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Tracer::Impl::~Impl() {
  if (poller_) {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      stop_ = true;
    }
    wake_cv_.notify_all();
    poller_->join();
  }
  if (timer_ == nullptr) return;
  // Every event ever created, wherever it is now (pool, caches, stuck ops). Destroying a
  // recorded event that has not completed is allowed: the driver frees it when it completes.
  for (Event& event : events_) timer_->destroyEvent(event.handle);
  for (auto& [device, cal] : cals_) {
    if (cal.ref != nullptr) timer_->destroyEvent(cal.ref);
    if (cal.pending != nullptr) timer_->destroyEvent(cal.pending);
  }
}

Tracer::Tracer(DeviceTimer* timer, const common::Clock* clock, Sink* sink, TracerOptions opts)
    : impl_(std::make_unique<Impl>(timer, clock, sink, opts)) {}

Tracer::~Tracer() {
  if (impl_ && impl_->forked_.load()) {
    // A forked child: the poller thread does not exist here (joining it is undefined), the
    // events belong to the parent's GPU context and other threads' locks may be held forever.
    // Leak everything.
    Impl* leaked = impl_.release();
    (void)leaked;
  }
}

uint32_t Tracer::Impl::intern(const Signature& sig) noexcept {
  if (forked_.load(std::memory_order_relaxed)) return 0;  // intern_mu_ may be held forever
  try {
    std::string key = canonicalKey(sig);
    std::lock_guard<std::mutex> lock(intern_mu_);
    auto it = sig_ids_.find(key);
    if (it != sig_ids_.end()) return it->second;
    sigs_.push_back(sig);
    const auto id = static_cast<uint32_t>(sigs_.size());
    try {
      sig_ids_.emplace(std::move(key), id);
    } catch (...) {
      sigs_.pop_back();
      throw;
    }
    return id;
  } catch (...) {
    return 0;
  }
}

bool Tracer::Impl::drain(int64_t timeout_ns) noexcept {
  if (forked_.load() || !poller_) return false;
  try {
    std::unique_lock<std::mutex> lock(wake_mu_);
    if (poller_exited_) return false;
    const uint64_t generation = ++drain_requested_;
    wake_cv_.notify_all();
    const auto wait = std::chrono::nanoseconds(std::clamp<int64_t>(timeout_ns, 0, kMaxWaitNs));
    done_cv_.wait_for(lock, wait, [&] { return drain_done_ >= generation || poller_exited_; });
    if (drain_done_ >= generation) return true;
    // Timed out (a stuck stream): have the poller flush what it has, without waiting for it.
    flush_requested_ = true;
    wake_cv_.notify_all();
    return false;
  } catch (...) {
    return false;
  }
}

DropCounters Tracer::Impl::drops() const noexcept {
  DropCounters totals;
  totals.ring_full = counters_.ring_full.load(std::memory_order_relaxed);
  totals.events_exhausted = counters_.events_exhausted.load(std::memory_order_relaxed);
  totals.event_errors = counters_.event_errors.load(std::memory_order_relaxed);
  totals.capturing = counters_.capturing.load(std::memory_order_relaxed);
  totals.unfinished = counters_.unfinished.load(std::memory_order_relaxed);
  totals.spans_dropped = counters_.spans_dropped.load(std::memory_order_relaxed) + spanStackDrops();
  return totals;
}

// Public interface (the launching thread's calls are in tracer_launch.cc).

uint32_t Tracer::intern(const Signature& sig) {
  return impl_->intern(sig);
}
bool Tracer::drain(int64_t timeout_ns, bool final) {
  if (final) impl_->final_drain_.store(true, std::memory_order_relaxed);
  return impl_->drain(timeout_ns);
}
DropCounters Tracer::drops() const {
  return impl_->drops();
}
uint64_t Tracer::hostCostNs() const {
  return impl_->host_cost_ns_.load(std::memory_order_relaxed);
}

uint64_t Tracer::eventRecords() const {
  return impl_->event_records_.load(std::memory_order_relaxed);
}

int64_t Tracer::eventGapNs() const {
  return impl_->event_gap_ns_.load(std::memory_order_relaxed);
}
size_t Tracer::pushDeepTrace(std::vector<DeepTraceRecord>&& records) {
  if (impl_->disabled_.load(std::memory_order_relaxed)) return 0;
  size_t taken = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->deep_mu_);
    const size_t room = kMaxPendingDeepTrace > impl_->deep_pending_.size()
                            ? kMaxPendingDeepTrace - impl_->deep_pending_.size()
                            : 0;
    taken = std::min(room, records.size());
    for (size_t i = 0; i < taken; ++i) impl_->deep_pending_.push_back(std::move(records[i]));
  }
  if (taken > 0) {
    std::lock_guard<std::mutex> lock(impl_->wake_mu_);
    impl_->flush_requested_ = true;
    impl_->wake_cv_.notify_one();
  }
  return taken;
}
void Tracer::disableAfterFork() {
  impl_->forked_.store(true);
  impl_->disabled_.store(true);
}

}  // namespace flare::timing
