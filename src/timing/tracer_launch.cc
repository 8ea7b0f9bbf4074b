// The Tracer's launching-thread side (tracer_impl.h): what a hook wrapper's begin()/end() cost.
// Steady state: a thread-local pointer compare, the op's events from the thread's private cache,
// the event records, one clock read, one ring push; the pool mutex once per 16 ops to refill.
// Everything here must not block, allocate in steady state or throw (all entry points are
// noexcept); the public Tracer calls are defined here too, so that they inline into one call.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "src/timing/tracer_impl.h"

namespace flare::timing {
using namespace tracer_internal;

namespace tracer_internal {

Event g_chained_start;
std::atomic<uint32_t> g_next_thread_index{1};
std::atomic<uint64_t> g_stateless_correlation{1};

}  // namespace tracer_internal

namespace {

// Per thread: which Tracers it has state for. Only touched off the fast path.
struct TlsSlot {
  uint64_t tracer_uid = 0;
  std::shared_ptr<ThreadState> state;
};
struct TlsTable {
  TlsSlot slots[kTlsSlots];
  ~TlsTable();
};

// The fast path reads only these trivially destructible thread_locals (no TLS guard, and
// still valid while other thread_local destructors run, e.g. a CUDA call from one of them).
thread_local uint64_t t_fast_uid = 0;
thread_local ThreadState* t_fast_state = nullptr;
thread_local bool t_table_destroyed = false;
thread_local TlsTable t_table;

TlsTable::~TlsTable() {
  t_table_destroyed = true;
  t_fast_uid = 0;
  t_fast_state = nullptr;
  for (TlsSlot& slot : slots) {
    if (slot.state) slot.state->exited.store(true, std::memory_order_release);
  }
}

}  // namespace

inline ThreadState* Tracer::Impl::threadState() noexcept {
  if (t_fast_uid == uid_) [[likely]]
    return t_fast_state;
  return threadStateSlow();
}

tracer_internal::ThreadState* Tracer::Impl::threadStateSlow() noexcept {
  if (t_table_destroyed) return nullptr;  // this thread is exiting
  try {
    TlsTable& table = t_table;
    size_t found = kTlsSlots;
    for (size_t i = 0; i < kTlsSlots; ++i) {
      if (table.slots[i].tracer_uid == uid_) {
        found = i;
        break;
      }
    }
    if (found == kTlsSlots) {
      auto state =
          std::make_shared<ThreadState>(opts_.ring_capacity, static_cast<uint32_t>(::gettid()));
      {
        std::lock_guard<std::mutex> lock(reg_mu_);
        threads_.push_back(state);
      }
      reg_version_.fetch_add(1, std::memory_order_release);
      // Evict the least recently used slot: its Tracer's poller drains and releases it.
      found = kTlsSlots - 1;
      TlsSlot& last = table.slots[found];
      if (last.state) last.state->exited.store(true, std::memory_order_release);
      last.state = std::move(state);
      last.tracer_uid = uid_;
    }
    std::rotate(table.slots, table.slots + found, table.slots + found + 1);
    t_fast_uid = uid_;
    t_fast_state = table.slots[0].state.get();
    return t_fast_state;
  } catch (...) {
    return nullptr;
  }
}

inline Tracer::Impl::Take Tracer::Impl::takeEvents(ThreadState* ts, int device, Event** start,
                                                   Event** end) noexcept {
  if (ts->cache_device != device || ts->cache_size < 2) [[unlikely]] {
    const Take taken = refill(ts, device);
    if (taken != Take::kOk) return taken;
  }
  if (start != nullptr) *start = ts->cache[--ts->cache_size];
  *end = ts->cache[--ts->cache_size];
  return Take::kOk;
}

inline Tracer::Impl::Take Tracer::Impl::refill(ThreadState* ts, int device) noexcept {
  try {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (ts->cache_device != device) {
      if (ts->cache_size > 0) {
        std::vector<Event*>& old = freeList(ts->cache_device);
        old.insert(old.end(), ts->cache, ts->cache + ts->cache_size);
        ts->cache_size = 0;
      }
      ts->cache_device = device;
    }
    std::vector<Event*>& list = freeList(device);
    for (size_t moved = 0; moved < kRefillBatch && !list.empty() && ts->cache_size < kCacheCapacity;
         ++moved) {
      ts->cache[ts->cache_size++] = list.back();
      list.pop_back();
    }
    if (ts->cache_size >= 2) return Take::kOk;
    // Grow: created here, on the launching thread, because this thread has `device` current
    // (an event belongs to the context current at its creation).
    const size_t room = opts_.max_events > created_ ? opts_.max_events - created_ : 0;
    const size_t count = std::min(kCreateChunk, room);
    for (size_t i = 0; i < count; ++i) {
      Event& event = events_.emplace_back();
      if (!timer_->createEvent(&event.handle)) {
        events_.pop_back();
        create_failed_.store(true, std::memory_order_relaxed);
        if (ts->cache_size >= 2) return Take::kOk;
        counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
        return Take::kError;
      }
      event.device = device;
      ++created_;
      if (ts->cache_size < kCacheCapacity) {
        ts->cache[ts->cache_size++] = &event;
      } else {
        list.push_back(&event);
      }
    }
    return ts->cache_size >= 2 ? Take::kOk : Take::kExhausted;
  } catch (...) {
    counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
    return Take::kError;
  }
}

std::vector<Event*>& Tracer::Impl::freeList(int device) {
  if (static_cast<size_t>(device) >= free_.size()) free_.resize(static_cast<size_t>(device) + 1);
  return free_[static_cast<size_t>(device)];
}

void Tracer::Impl::giveBack(ThreadState* ts, Event* event) noexcept {
  if (!pooled(event)) return;
  if (ts != nullptr && ts->cache_device == event->device && ts->cache_size < kCacheCapacity) {
    ts->cache[ts->cache_size++] = event;
    return;
  }
  try {
    std::lock_guard<std::mutex> lock(pool_mu_);
    freeList(event->device).push_back(event);
  } catch (...) {
    // Out of memory: the event stays out of circulation (destroyed with the Tracer).
  }
}

void Tracer::Impl::addCost(int64_t since_ns) noexcept {
  const int64_t spent = clock_->nowNs() - since_ns;
  if (spent > 0) {
    host_cost_ns_.fetch_add(static_cast<uint64_t>(spent) * kCostEvery, std::memory_order_relaxed);
  }
}

void Tracer::Impl::push(ThreadState* ts, const PendingOp& op) noexcept {
  if (ts != nullptr && ts->ring.tryPush(op)) [[likely]]
    return;
  counters_.ring_full.fetch_add(1, std::memory_order_relaxed);
  if (ts != nullptr) ts->chain_broken = true;
  // The events may still be pending on the GPU: re-recording a pending event is allowed.
  if (op.start != nullptr) giveBack(ts, op.start);
  if (op.end != nullptr) giveBack(ts, op.end);
}

bool Tracer::Impl::begin(void* stream, Ticket* ticket) noexcept {
  if (disabled_.load(std::memory_order_relaxed)) return false;
  ThreadState* ts = threadState();
  if (ts == nullptr) return false;
  const bool measure = opts_.measure_cost && ++ts->cost_tick % kCostEvery == 0;
  const int64_t entered_ns = measure ? clock_->nowNs() : 0;
  try {
    // Until this op is timed, the chain of end-only ops on this thread is broken.
    const bool chained =
        opts_.end_only && !ts->chain_broken && !(ts->waited_count > 0 && ts->takeWaited(stream));
    ts->chain_broken = true;
    // Events recorded during stream capture would become nodes of the captured graph.
    if (timer_->isCapturing(stream)) {
      counters_.capturing.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    const int device = timer_->currentDevice();
    if (device < 0 || device >= kMaxDevices) {
      counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    // end_only: the start is the chained sentinel, and only the end event is taken.
    Event* start = chained ? &g_chained_start : nullptr;
    Event* end = nullptr;
    switch (takeEvents(ts, device, chained ? nullptr : &start, &end)) {
      case Take::kOk:
        break;
      case Take::kExhausted:
        counters_.events_exhausted.fetch_add(1, std::memory_order_relaxed);
        return false;
      case Take::kError:  // counted by refill()
        return false;
    }
    const int64_t issue_ns = clock_->nowNs();
    ts->in_flight_issue_ns.store(issue_ns, std::memory_order_relaxed);
    if (!chained && !timer_->recordEvent(start->handle, stream)) {
      counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
      ts->in_flight_issue_ns.store(INT64_MAX, std::memory_order_release);
      giveBack(ts, start);
      giveBack(ts, end);
      return false;
    }
    ts->chain_broken = false;
    ticket->start = start;
    ticket->end = end;
    ticket->stream = stream;
    ticket->issue_ns = issue_ns;
    if (measure) {
      addCost(entered_ns);
      ticket->cost_measured = true;
      event_records_.fetch_add((chained ? 1 : 2) * kCostEvery, std::memory_order_relaxed);
    }
    return true;
  } catch (...) {
    counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

void Tracer::Impl::end(Ticket* ticket, const OpInfo& info) noexcept {
  auto* start = static_cast<Event*>(ticket->start);
  auto* end = static_cast<Event*>(ticket->end);
  void* stream = ticket->stream;
  const int64_t issue_ns = ticket->issue_ns;
  const bool measure = ticket->cost_measured;
  *ticket = Ticket{};
  if (start == nullptr || end == nullptr) return;
  if (disabled_.load(std::memory_order_relaxed)) return;  // a forked child: leave them be
  const int64_t entered_ns = measure ? clock_->nowNs() : 0;
  ThreadState* ts = threadState();
  struct InFlightDone {  // after the push (or the op's loss): the poller may pass its issue time
    Impl* impl;
    ThreadState* ts;
    int64_t entered_ns;  // 0: not measured
    ~InFlightDone() {
      if (ts != nullptr) ts->in_flight_issue_ns.store(INT64_MAX, std::memory_order_release);
      if (entered_ns != 0) impl->addCost(entered_ns);
    }
  } in_flight_done{this, ts, entered_ns};
  try {
    if (!timer_->recordEvent(end->handle, stream)) {
      counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
      giveBack(ts, start);
      giveBack(ts, end);
      return;
    }
    PendingOp op;
    op.start = start;
    op.end = end;
    op.stream_id = timer_->streamId(stream);
    op.issue_ns = issue_ns;
    op.host_end_ns = 0;
    op.info = info;
    op.thread_id = ts != nullptr ? ts->thread_id : 0;
    op.device = end->device;  // the start may be the chained sentinel
    op.parent_span_id = currentSpanId();
    op.correlation_id = ts != nullptr
                            ? ts->nextCorrelation()
                            : g_stateless_correlation.fetch_add(1, std::memory_order_relaxed);
    push(ts, op);
  } catch (...) {
    counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void Tracer::Impl::cancel(Ticket* ticket) noexcept {
  auto* start = static_cast<Event*>(ticket->start);
  auto* end = static_cast<Event*>(ticket->end);
  *ticket = Ticket{};
  if (start == nullptr || end == nullptr) return;
  if (disabled_.load(std::memory_order_relaxed)) return;
  ThreadState* ts = threadState();
  if (ts != nullptr) ts->in_flight_issue_ns.store(INT64_MAX, std::memory_order_release);
  giveBack(ts, start);
  giveBack(ts, end);
}

void Tracer::Impl::hostSpan(const OpInfo& info, int64_t start_ns, int64_t end_ns) noexcept {
  if (disabled_.load(std::memory_order_relaxed)) return;
  ThreadState* ts = threadState();
  if (ts == nullptr) return;
  try {
    PendingOp op;
    op.start = nullptr;
    op.end = nullptr;
    op.stream_id = 0;
    op.issue_ns = start_ns;
    op.host_end_ns = end_ns;
    op.info = info;
    op.thread_id = ts->thread_id;
    op.device = std::max(timer_->currentDevice(), 0);
    op.parent_span_id = currentSpanId();
    op.correlation_id = ts->nextCorrelation();
    push(ts, op);
  } catch (...) {
    counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void Tracer::Impl::streamWaits(void* stream) noexcept {
  if (!opts_.end_only || disabled_.load(std::memory_order_relaxed)) return;
  ThreadState* ts = threadState();
  if (ts == nullptr) return;
  for (int i = 0; i < ts->waited_count; ++i) {
    if (ts->waited[i] == stream) return;
  }
  if (ts->waited_count < ThreadState::kMaxWaited) {
    ts->waited[ts->waited_count++] = stream;
  } else {
    ts->chain_broken = true;  // too many to remember: the next op of any stream starts a chain
  }
}

void Tracer::Impl::pushSpan(const CompletedSpan& span) noexcept {
  if (disabled_.load(std::memory_order_relaxed)) return;
  ThreadState* ts = threadState();
  if (ts != nullptr) [[likely]] {
    CompletedSpan copy = span;
    copy.thread_id = ts->thread_id;
    if (ts->spans.tryPush(copy)) [[likely]]
      return;
  }
  counters_.spans_dropped.fetch_add(1, std::memory_order_relaxed);
}

// Public interface: the launching thread's calls.

bool Tracer::begin(void* stream, Ticket* ticket) {
  return impl_->begin(stream, ticket);
}
void Tracer::end(Ticket* ticket, const OpInfo& info) {
  impl_->end(ticket, info);
}
void Tracer::cancel(Ticket* ticket) {
  impl_->cancel(ticket);
}
void Tracer::hostSpan(const OpInfo& info, int64_t start_ns, int64_t end_ns) {
  impl_->hostSpan(info, start_ns, end_ns);
}
void Tracer::streamWaits(void* stream) {
  impl_->streamWaits(stream);
}
void Tracer::pushSpan(const CompletedSpan& span) {
  impl_->pushSpan(span);
}

}  // namespace flare::timing
