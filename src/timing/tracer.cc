// The Tracer: event pool, per-thread rings, the poller thread and the GPU → host clock map.
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
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/common/log.h"
#include "src/timing/spsc_ring.h"
#include "src/timing/timing.h"

namespace flare::timing {
namespace {

constexpr char kLog[] = "timing";
constexpr size_t kCacheCapacity = 64;  // free events a thread keeps
constexpr size_t kRefillBatch = 32;    // taken from the global pool at once
constexpr size_t kCreateChunk = 64;    // events created at once when the pool is empty
constexpr size_t kTlsSlots = 4;        // Tracers a thread keeps state for (tests make several)
constexpr size_t kEmitBatch = 1024;    // CompletedOps per Sink::onOps call at most
constexpr int64_t kDrainPollNs = 1'000'000;  // poll at least this often while drain() waits
constexpr int64_t kMinPollNs = 10'000;
constexpr int64_t kMaxWaitNs = 100'000'000'000'000'000;  // ~3 years: no overflow in wait_for
constexpr int kReferenceAttempts = 3;  // before a device without calibration drops its ops
// A reference whose record call took longer than this to bracket (the poller preempted around
// it) may be off by that much: it is taken again after kLooseRetryNs, and replaces the one in
// use only if it is tighter.
constexpr int64_t kTightReferenceNs = 100'000;
constexpr int64_t kLooseRetryNs = 50'000'000;
constexpr int kMaxDevices = 1024;           // device ordinals index the pool's free lists
constexpr int kReturnTries = 8;             // passes the poller may defer returning events
constexpr size_t kMaxIdleQueues = 256;      // stream queues kept while empty
constexpr size_t kSpanRingCapacity = 1024;  // closed Python spans per thread between passes

// A pooled event. Tickets carry pointers to these: the device is known without a lookup.
struct Event {
  void* handle = nullptr;
  int32_t device = 0;
};

// TracerOptions::end_only: the `start` of an op timed with its end event alone. Never pooled,
// never recorded: the poller takes the op's start from the end of the op before it on its
// stream, or from its issue time when the stream was idle by then.
Event g_chained_start;

bool pooled(const Event* e) {
  return e != nullptr && e != &g_chained_start;
}

// One ring slot: what the poller needs to finish an op.
struct PendingOp {
  Event* start;  // nullptr: a host span; &g_chained_start: timed by its end event alone
  Event* end;
  uint64_t stream_id;
  int64_t issue_ns;     // host span: its start
  int64_t host_end_ns;  // host span only
  OpInfo info;
  uint32_t thread_id;
  int32_t device;
  uint64_t parent_span_id;  // innermost traced Python span open on the launching thread
  uint64_t correlation_id;
};
static_assert(sizeof(OpInfo) == 48, "OpInfo is copied into every ring slot: keep it small");
static_assert(sizeof(PendingOp) == 112, "ring slot layout changed: update the diagrams");
static_assert(std::is_trivially_copyable_v<PendingOp>);

// Correlation ids are (thread index << 40) | that thread's launch count: unique per process
// without a shared counter on the launch path. Thread indices come from this counter (cold path,
// once per thread state); index 0 is for ops recorded without a thread state.
std::atomic<uint32_t> g_next_thread_index{1};
std::atomic<uint64_t> g_stateless_correlation{1};

struct ThreadState {
  ThreadState(size_t ring_capacity, uint32_t tid)
      : ring(ring_capacity), spans(kSpanRingCapacity), thread_id(tid) {}

  SpscRing<PendingOp> ring;
  SpscRing<CompletedSpan> spans;  // traced Python spans closed on this thread
  // Free events of `cache_device`. Owner thread only; the poller once `exited` is set.
  Event* cache[kCacheCapacity] = {};
  size_t cache_size = 0;
  int cache_device = -1;
  const uint32_t thread_id;
  const uint64_t correlation_base =
      uint64_t{g_next_thread_index.fetch_add(1, std::memory_order_relaxed)} << 40;
  uint64_t launches = 0;  // owner thread only
  uint64_t nextCorrelation() { return correlation_base | ++launches; }
  // Set (release) by the owner thread when it stops using this state; after that the ring
  // receives nothing more and the cache is the poller's.
  std::atomic<bool> exited{false};
  // The issue time of the timed call the owner is making (begin() to end()/cancel()), INT64_MAX
  // when none. A first launch can spend 10-500 ms in the vendor call (lazy module loading,
  // cuBLAS heuristics, JIT) before its op reaches the ring; the poller keeps the watermark at or
  // below this, so that no step is taken as final while an op issued in it is still on its way.
  // Cleared (release) after the push; read (acquire) before the ring is drained.
  std::atomic<int64_t> in_flight_issue_ns{INT64_MAX};
  // end_only: an op of this thread ran untimed (capture, no event, ring full): the next timed
  // op records its own start event, so that the untimed one's GPU time is not taken for its.
  // Owner thread only.
  bool chain_broken = true;
  // end_only: streams made to wait for other work (cudaStreamWaitEvent) since their last timed
  // op: their next op may start long after the op before it ended, so it records its start.
  static constexpr int kMaxWaited = 8;
  void* waited[kMaxWaited] = {};
  int waited_count = 0;
  // True (and forgotten) when `stream` waited since its last timed op.
  bool takeWaited(void* stream) {
    for (int i = 0; i < waited_count; ++i) {
      if (waited[i] == stream) {
        waited[i] = waited[--waited_count];
        return true;
      }
    }
    return false;
  }
};

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

std::atomic<uint64_t> g_next_tracer_uid{1};

struct StreamKey {
  int32_t device;
  uint64_t stream_id;
  bool operator==(const StreamKey&) const = default;
};
struct StreamKeyHash {
  size_t operator()(const StreamKey& key) const noexcept {
    return std::hash<uint64_t>()(key.stream_id * 0x9E3779B97F4A7C15ull ^
                                 static_cast<uint32_t>(key.device));
  }
};

// Clock calibration of one device (poller thread only). See Impl::calibrate().
struct DeviceCal {
  void* ref = nullptr;  // completed reference in use
  int64_t ref_host_ns = 0;
  int64_t ref_width_ns = 0;  // host time around its recordReference call
  void* pending = nullptr;   // recorded, not completed yet; replaces `ref` when it completes
  int64_t pending_host_ns = 0;
  int64_t pending_width_ns = 0;
  bool retry_soon = false;  // the last reference was loose (wider than kTightReferenceNs)
  int64_t attempt_ns = 0;   // host time of the last recordReference()
  int failures = 0;         // consecutive failed attempts
  bool broken = false;      // no reference after kReferenceAttempts tries: its ops are dropped
  // end_only: how long after its issue an op on an idle stream starts (launch latency), a
  // moving average over the ops that recorded a start event on an idle stream; -1: none yet.
  int64_t launch_latency_ns = -1;
};

bool sameCounters(const DropCounters& a, const DropCounters& b) {
  return a.ring_full == b.ring_full && a.events_exhausted == b.events_exhausted &&
         a.event_errors == b.event_errors && a.capturing == b.capturing &&
         a.unfinished == b.unfinished && a.spans_dropped == b.spans_dropped;
}

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

struct Tracer::Impl {
  Impl(DeviceTimer* timer, const common::Clock* clock, Sink* sink, TracerOptions opts);
  ~Impl();

  bool begin(void* stream, Ticket* ticket) noexcept;
  void end(Ticket* ticket, const OpInfo& info) noexcept;
  void cancel(Ticket* ticket) noexcept;
  void hostSpan(const OpInfo& info, int64_t start_ns, int64_t end_ns) noexcept;
  void streamWaits(void* stream) noexcept;
  void pushSpan(const CompletedSpan& span) noexcept;
  uint32_t intern(const Signature& sig) noexcept;
  bool drain(int64_t timeout_ns) noexcept;
  DropCounters drops() const noexcept;

  // Launching thread.
  ThreadState* threadState() noexcept {
    if (t_fast_uid == uid_) [[likely]]
      return t_fast_state;
    return threadStateSlow();
  }
  ThreadState* threadStateSlow() noexcept;
  enum class Take { kOk, kExhausted, kError };
  // Pops the op's end event and, unless `start` is null (end-only timing), its start event.
  Take takeEvents(ThreadState* ts, int device, Event** start, Event** end) noexcept;
  Take refill(ThreadState* ts, int device) noexcept;
  std::vector<Event*>& freeList(int device);  // pool_mu_ held; grows free_
  void giveBack(ThreadState* ts, Event* event) noexcept;
  void push(ThreadState* ts, const PendingOp& op) noexcept;

  // Poller thread.
  void pollerMain() noexcept;
  void pollOnce(uint64_t pass);
  void refreshThreads();
  void accept(const PendingOp& op, uint64_t pass);
  void releaseThread(size_t index);
  void announceSignatures();
  void announceApis();
  void emitSpans();
  void emitDeepTrace();
  void calibrate();
  void referenceFailed(int device, DeviceCal& cal, int64_t now_ns);
  void processQueues();
  void observeHeads();
  void finish(const PendingOp& op, uint64_t pass);
  void returnEvents();
  void emitOps();
  void sendDrops();
  void finishDrains();
  void flushSink();  // Sink::flush, or Sink::finish after a final drain
  void shutdownPass();

  DeviceTimer* const timer_;
  const common::Clock* const clock_;
  Sink* const sink_;
  const TracerOptions opts_;
  const uint64_t uid_;
  int64_t poll_ns_ = 0;

  std::atomic<bool> disabled_{false};
  std::atomic<bool> forked_{false};
  std::atomic<bool> create_failed_{false};  // createEvent failed; the poller says so once

  struct Counters {
    std::atomic<uint64_t> ring_full{0};
    std::atomic<uint64_t> events_exhausted{0};
    std::atomic<uint64_t> event_errors{0};
    std::atomic<uint64_t> capturing{0};
    std::atomic<uint64_t> unfinished{0};
    std::atomic<uint64_t> spans_dropped{0};
  };
  alignas(64) Counters counters_;

  // Event pool. Events live in a deque (stable addresses) until the Tracer is destroyed.
  alignas(64) std::mutex pool_mu_;
  std::deque<Event> events_;               // guarded by pool_mu_
  std::vector<std::vector<Event*>> free_;  // guarded by pool_mu_; by device
  size_t created_ = 0;                     // guarded by pool_mu_

  // Registry of the threads' states.
  std::mutex reg_mu_;
  std::vector<std::shared_ptr<ThreadState>> threads_;  // guarded by reg_mu_
  std::atomic<uint64_t> reg_version_{0};

  // Interning.
  std::mutex intern_mu_;
  std::unordered_map<std::string, uint32_t> sig_ids_;  // guarded by intern_mu_
  std::vector<Signature> sigs_;                        // guarded by intern_mu_; id = index + 1

  // Poller coordination.
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;       // the poller waits here
  std::condition_variable done_cv_;       // drain() waits here
  bool stop_ = false;                     // guarded by wake_mu_
  bool flush_requested_ = false;          // guarded by wake_mu_
  bool poller_exited_ = false;            // guarded by wake_mu_
  uint64_t drain_requested_ = 0;          // guarded by wake_mu_
  std::atomic<bool> final_drain_{false};  // drain(.., final): flushes finish the sink
  uint64_t drain_done_ = 0;               // guarded by wake_mu_
  std::unique_ptr<std::thread> poller_;

  // Deep-trace records waiting for the poller (pushDeepTrace, any thread).
  std::mutex deep_mu_;
  std::vector<DeepTraceRecord> deep_pending_;  // guarded by deep_mu_

  // Poller thread only.
  struct Queued {
    PendingOp op;
    uint64_t pass;  // poller pass that took it from its ring
  };
  // The FIFO of one stream: a vector consumed from `head` (no allocation per op, unlike
  // std::deque's small nodes), compacted when the consumed prefix is large.
  struct OpQueue {
    std::vector<Queued> items;
    size_t head = 0;
    int64_t last_done_ns = 0;         // when the poller last saw a head of this stream complete
    int64_t last_end_ns = INT64_MIN;  // host time of the last emitted op's GPU end (end_only)

    bool empty() const { return head == items.size(); }
    size_t size() const { return items.size() - head; }
    const Queued& front() const { return items[head]; }
    void popFront() {
      if (++head == items.size()) {
        items.clear();
        head = 0;
      } else if (head >= 1024 && 2 * head >= items.size()) {
        items.erase(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(head));
        head = 0;
      }
    }
    // In issue order: ops of one thread arrive in order; ops of several threads on one stream
    // are put back in launch order (nearly always an append).
    void insert(const Queued& queued) {
      auto it = items.end();
      const auto first = items.begin() + static_cast<std::ptrdiff_t>(head);
      while (it != first && std::prev(it)->op.issue_ns > queued.op.issue_ns) --it;
      items.insert(it, queued);
    }
  };
  struct DrainWait {
    uint64_t generation;
    uint64_t pass;  // done once every op taken in passes ≤ this one is finished
  };
  std::vector<std::shared_ptr<ThreadState>> local_threads_;
  uint64_t local_version_ = 0;
  std::unordered_map<StreamKey, OpQueue, StreamKeyHash> queues_;
  std::map<int, DeviceCal> cals_;
  std::map<uint64_t, uint64_t> outstanding_;  // pass → ops of that pass still queued
  uint64_t taken_this_pass_ = 0;
  StreamKey last_key_{0, 0};  // accept()'s cache of the last queue used
  OpQueue* last_queue_ = nullptr;
  int return_deferred_ = 0;  // passes returnEvents() found the pool busy
  std::deque<DrainWait> drain_waits_;
  std::vector<Event*> to_free_;
  std::vector<CompletedOp> out_;
  std::vector<CompletedSpan> span_out_;
  size_t announced_ = 0;
  uint32_t apis_announced_ = 0;
  DropCounters last_drops_;
  bool device_described_ = false;  // onDevice sent (or the driver could not say)
  int64_t last_flush_ns_ = 0;
  int64_t prev_pass_start_ns_ = INT64_MIN;  // poller thread
  int64_t in_flight_min_ns_ = INT64_MAX;    // poller thread: this pass's oldest call in flight
  std::vector<StreamHead> heads_out_;
  int64_t last_heads_ns_ = INT64_MIN;
};

// ---------------------------------------------------------------------------------------------
// Construction and destruction.

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

// ---------------------------------------------------------------------------------------------
// Launching thread.

ThreadState* Tracer::Impl::threadStateSlow() noexcept {
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

Tracer::Impl::Take Tracer::Impl::takeEvents(ThreadState* ts, int device, Event** start,
                                            Event** end) noexcept {
  if (ts->cache_device != device || ts->cache_size < 2) [[unlikely]] {
    const Take taken = refill(ts, device);
    if (taken != Take::kOk) return taken;
  }
  if (start != nullptr) *start = ts->cache[--ts->cache_size];
  *end = ts->cache[--ts->cache_size];
  return Take::kOk;
}

Tracer::Impl::Take Tracer::Impl::refill(ThreadState* ts, int device) noexcept {
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
  *ticket = Ticket{};
  if (start == nullptr || end == nullptr) return;
  if (disabled_.load(std::memory_order_relaxed)) return;  // a forked child: leave them be
  ThreadState* ts = threadState();
  struct InFlightDone {  // after the push (or the op's loss): the poller may pass its issue time
    ThreadState* ts;
    ~InFlightDone() {
      if (ts != nullptr) ts->in_flight_issue_ns.store(INT64_MAX, std::memory_order_release);
    }
  } in_flight_done{ts};
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

// ---------------------------------------------------------------------------------------------
// Any thread.

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

// ---------------------------------------------------------------------------------------------
// Poller thread.

void Tracer::Impl::pollerMain() noexcept {
  pthread_setname_np(pthread_self(), "flare-timing");
  uint64_t pass = 0;
  uint64_t seen_generation = 0;
  for (;;) {
    bool stopping = false;
    bool flush = false;
    uint64_t requested = 0;
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      const int64_t wait_ns = drain_waits_.empty() ? poll_ns_ : std::min(poll_ns_, kDrainPollNs);
      wake_cv_.wait_for(lock, std::chrono::nanoseconds(wait_ns), [&] {
        return stop_ || flush_requested_ || drain_requested_ > seen_generation;
      });
      stopping = stop_;
      flush = flush_requested_;
      flush_requested_ = false;
      requested = drain_requested_;
    }
    ++pass;
    try {
      // Every op pushed before a drain() call is in a ring now: this pass takes it.
      pollOnce(pass);
      if (requested > seen_generation) {
        drain_waits_.push_back(DrainWait{requested, pass});
        seen_generation = requested;
      }
      if (stopping) {
        shutdownPass();
      } else {
        finishDrains();
        const int64_t now_ns = clock_->nowNs();
        if (flush || now_ns - last_flush_ns_ >= opts_.flush_interval_ns) {
          flushSink();
          last_flush_ns_ = now_ns;
        }
      }
      if (create_failed_.load(std::memory_order_relaxed)) {
        FLARE_LOG_WARN_ONCE(kLog,
                            "creating a GPU event failed; ops that needed one are dropped "
                            "and counted in event_errors");
      }
    } catch (...) {
      FLARE_LOG_ERROR_ONCE(kLog, "timing thread: unexpected exception; records may be lost");
    }
    if (stopping) break;
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    poller_exited_ = true;
  }
  done_cv_.notify_all();
}

void Tracer::Impl::pollOnce(uint64_t pass) {
  const int64_t pass_start_ns = clock_->nowNs();
  refreshThreads();
  last_queue_ = nullptr;  // queues may have been erased since the last pass
  taken_this_pass_ = 0;
  in_flight_min_ns_ = INT64_MAX;
  for (size_t i = 0; i < local_threads_.size();) {
    ThreadState* ts = local_threads_[i].get();
    // Read before draining: an op whose call was in flight reaches a later drain, so the
    // watermark stays at or below its issue time; a call that ended has pushed its op (release),
    // and this drain takes it.
    in_flight_min_ns_ =
        std::min(in_flight_min_ns_, ts->in_flight_issue_ns.load(std::memory_order_acquire));
    // Read before draining: once set, the owner pushes nothing more, so this drain is the last.
    const bool exited = ts->exited.load(std::memory_order_acquire);
    ts->ring.drain([&](const PendingOp& op) { accept(op, pass); });
    ts->spans.drain([&](const CompletedSpan& span) {
      try {
        span_out_.push_back(span);
      } catch (...) {
        counters_.spans_dropped.fetch_add(1, std::memory_order_relaxed);
      }
    });
    if (exited) {
      releaseThread(i);
    } else {
      ++i;
    }
  }
  if (taken_this_pass_ > 0) outstanding_[pass] += taken_this_pass_;
  last_queue_ = nullptr;
  // After the rings: every op taken refers to a signature interned before it was pushed.
  announceSignatures();
  announceApis();
  emitSpans();
  emitDeepTrace();
  calibrate();
  processQueues();
  observeHeads();
  returnEvents();
  emitOps();
  sendDrops();
  // The watermark: every op issued before it has completed and been handed to the sink — the
  // oldest pending op of each stream bounds it, and the previous pass's start bounds the ops a
  // launching thread may still be pushing into its ring.
  // A timed call still in its vendor call (a slow first launch) holds it back too.
  int64_t watermark = std::min(prev_pass_start_ns_, in_flight_min_ns_);
  for (const auto& [key, queue] : queues_) {
    if (!queue.empty()) watermark = std::min(watermark, queue.front().op.issue_ns);
  }
  sink_->onWatermark(watermark);
  prev_pass_start_ns_ = pass_start_ns;
}

void Tracer::Impl::refreshThreads() {
  const uint64_t version = reg_version_.load(std::memory_order_acquire);
  if (version == local_version_) return;
  std::lock_guard<std::mutex> lock(reg_mu_);
  local_threads_ = threads_;
  local_version_ = version;
}

void Tracer::Impl::accept(const PendingOp& op, uint64_t pass) {
  try {
    if (op.start == nullptr) {  // host span: complete already
      out_.push_back(CompletedOp{.info = op.info,
                                 .stream_id = 0,
                                 .device = op.device,
                                 .thread_id = op.thread_id,
                                 .issue_ns = op.issue_ns,
                                 .start_ns = op.issue_ns,
                                 .end_ns = op.host_end_ns,
                                 .parent_span_id = op.parent_span_id,
                                 .correlation_id = op.correlation_id});
      return;
    }
    const StreamKey key{op.device, op.stream_id};
    if (last_queue_ == nullptr || !(last_key_ == key)) {  // consecutive ops: mostly one stream
      last_queue_ = nullptr;
      cals_.try_emplace(op.device);
      last_queue_ = &queues_[key];
      last_key_ = key;
    }
    last_queue_->insert(Queued{op, pass});  // the last step that can throw
    ++taken_this_pass_;
  } catch (...) {
    // Out of memory: the op is lost (counted) and its events go back.
    counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
    if (pooled(op.start)) to_free_.push_back(op.start);
    if (pooled(op.end)) to_free_.push_back(op.end);
  }
}

void Tracer::Impl::releaseThread(size_t index) {
  std::shared_ptr<ThreadState> state = std::move(local_threads_[index]);
  local_threads_.erase(local_threads_.begin() + static_cast<std::ptrdiff_t>(index));
  to_free_.insert(to_free_.end(), state->cache, state->cache + state->cache_size);
  state->cache_size = 0;
  std::lock_guard<std::mutex> lock(reg_mu_);
  threads_.erase(std::remove(threads_.begin(), threads_.end(), state), threads_.end());
}

void Tracer::Impl::announceSignatures() {
  std::vector<Signature> fresh;
  {
    std::lock_guard<std::mutex> lock(intern_mu_);
    if (sigs_.size() == announced_) return;
    fresh.assign(sigs_.begin() + static_cast<std::ptrdiff_t>(announced_), sigs_.end());
  }
  for (const Signature& sig : fresh) {
    ++announced_;
    sink_->onSignature(static_cast<uint32_t>(announced_), sig);
  }
}

// API names are process-wide (spans.cc); each Tracer announces the new ones to its sink, before
// the spans taken in the same pass (a span's name was interned before the span was opened).
void Tracer::Impl::announceApis() {
  std::vector<std::string> fresh = apiNamesAfter(apis_announced_);
  for (const std::string& name : fresh) sink_->onApiName(++apis_announced_, name);
}

void Tracer::Impl::emitSpans() {
  if (span_out_.empty()) return;
  struct Clear {
    std::vector<CompletedSpan>& spans;
    ~Clear() { spans.clear(); }
  } clear{span_out_};
  sink_->onSpans(span_out_);
}

void Tracer::Impl::emitDeepTrace() {
  std::vector<DeepTraceRecord> out;
  {
    std::lock_guard<std::mutex> lock(deep_mu_);
    if (deep_pending_.empty()) return;
    out.swap(deep_pending_);
  }
  sink_->onDeepTrace(out);
}

// The GPU → host clock map, one reference event per device (events of different devices
// cannot be compared). A reference is recorded through DeviceTimer::recordReference (an idle
// stream of that device) and the host clock is read right after the call returns; once it has
// completed, an event X of that device maps to
//
//     host(X) = ref_host_ns + elapsedNs(ref, X)
//
// Error bound, for one mapped time:
//   - launch latency of the reference: the GPU timestamps it when it reaches it, after the host
//     read (a few µs on an idle stream; more if recordReference's stream was busy), so mapped
//     times are early by up to that latency (a constant offset within one calibration);
//   - drift between recalibrations: the GPU clock against CLOCK_MONOTONIC, times the age of
//     the reference (e.g. 10 ppm × 10 s = 100 µs at worst with the default recalibrate_ns;
//     durations on the GPU, end - start, carry only drift × duration);
//   - the resolution of elapsedNs (cudaEventElapsedTime: about 0.5 µs);
//   - a preemption of the poller between the record call and the host read puts every mapped
//     time late by its length: the host clock is read around the call, and a reference whose
//     bracket is wider than kTightReferenceNs is recorded again kLooseRetryNs later, the
//     tighter one kept (one such 0.67 ms offset on one rank of a loaded 2-core machine made a
//     healthy communicator look 25% slow, docs/benchmarks.md).
// A new reference is recorded every
// recalibrate_ns; the old one stays in use until the new one completes, so ops are never held
// back by a recalibration. Ops of a device wait (in their queue) only until its first
// reference completes.
void Tracer::Impl::calibrate() {
  const int64_t now_ns = clock_->nowNs();
  for (auto& [device, cal] : cals_) {
    if (cal.pending == nullptr) {
      const bool due = (cal.ref == nullptr && !cal.broken) ||
                       now_ns - cal.attempt_ns >= opts_.recalibrate_ns ||
                       (cal.retry_soon && now_ns - cal.attempt_ns >= kLooseRetryNs);
      if (due) {
        void* event = nullptr;
        const int64_t before = clock_->nowNs();
        if (timer_->recordReference(device, &event) && event != nullptr) {
          cal.pending = event;
          cal.pending_host_ns = clock_->nowNs();
          cal.pending_width_ns = cal.pending_host_ns - before;
          cal.attempt_ns = cal.pending_host_ns;
        } else {
          referenceFailed(device, cal, now_ns);
        }
      }
    }
    if (cal.pending != nullptr) {
      switch (timer_->queryEvent(cal.pending)) {
        case DeviceTimer::Status::kReady: {
          const bool loose = cal.pending_width_ns > kTightReferenceNs;
          cal.retry_soon = loose;
          cal.failures = 0;
          if (cal.ref != nullptr && loose && cal.pending_width_ns > cal.ref_width_ns) {
            timer_->destroyEvent(cal.pending);  // the one in use is tighter
            cal.pending = nullptr;
            break;
          }
          if (cal.ref != nullptr) timer_->destroyEvent(cal.ref);
          cal.ref = cal.pending;
          cal.ref_host_ns = cal.pending_host_ns;
          cal.ref_width_ns = cal.pending_width_ns;
          cal.pending = nullptr;
          cal.broken = false;
          break;
        }
        case DeviceTimer::Status::kNotReady:
          break;
        case DeviceTimer::Status::kError:
          timer_->destroyEvent(cal.pending);
          cal.pending = nullptr;
          referenceFailed(device, cal, now_ns);
          break;
      }
    }
  }
}

void Tracer::Impl::referenceFailed(int device, DeviceCal& cal, int64_t now_ns) {
  cal.attempt_ns = now_ns;
  ++cal.failures;
  if (cal.ref == nullptr && !cal.broken && cal.failures >= kReferenceAttempts) {
    cal.broken = true;
    FLARE_LOG_WARN(kLog,
                   "GPU clock calibration failed {} times on device {}; its ops are dropped "
                   "(event_errors) until a calibration succeeds",
                   cal.failures, device);
  }
}

void Tracer::Impl::processQueues() {
  const int64_t pass_ns = opts_.head_observer != nullptr ? clock_->nowNs() : 0;
  for (auto it = queues_.begin(); it != queues_.end();) {
    OpQueue& queue = it->second;
    DeviceCal& cal = cals_[it->first.device];
    while (!queue.empty()) {
      const Queued& head = queue.front();
      const DeviceTimer::Status status = timer_->queryEvent(head.op.end->handle);
      if (status == DeviceTimer::Status::kNotReady) break;  // next stream: no head-of-line
      if (status == DeviceTimer::Status::kReady && cal.ref == nullptr && !cal.broken) {
        break;  // waiting for this device's first reference
      }
      bool emitted = false;
      if (status == DeviceTimer::Status::kReady && cal.ref != nullptr) {
        int64_t start_ns = 0;
        int64_t end_ns = 0;
        const bool chained = head.op.start == &g_chained_start;
        if (timer_->elapsedNs(cal.ref, head.op.end->handle, &end_ns) &&
            (chained || timer_->elapsedNs(cal.ref, head.op.start->handle, &start_ns))) {
          const int64_t end_host = cal.ref_host_ns + end_ns;
          // An end-only op started when the op before it on the stream ended, or, if the stream
          // was idle by then, when it was issued (its launch latency counts in its duration).
          int64_t start_host = cal.ref_host_ns + start_ns;
          if (chained) {
            const int64_t latency = std::max<int64_t>(cal.launch_latency_ns, 0);
            start_host =
                std::min(std::max(queue.last_end_ns, head.op.issue_ns + latency), end_host);
          } else if (opts_.end_only && queue.last_end_ns < head.op.issue_ns &&
                     start_host >= head.op.issue_ns) {
            // Issued on an idle stream and timed by its own start event: a latency sample. A
            // floor-like estimate (down fast, up slowly): a sample may also hold a wait for
            // another stream's work.
            const int64_t sample = std::min<int64_t>(start_host - head.op.issue_ns, 1'000'000);
            int64_t& est = cal.launch_latency_ns;
            est = est < 0 ? sample : est + (sample - est) / (sample < est ? 4 : 64);
          }
          out_.push_back(CompletedOp{.info = head.op.info,
                                     .stream_id = head.op.stream_id,
                                     .device = head.op.device,
                                     .thread_id = head.op.thread_id,
                                     .issue_ns = head.op.issue_ns,
                                     .start_ns = start_host,
                                     .end_ns = end_host,
                                     .parent_span_id = head.op.parent_span_id,
                                     .correlation_id = head.op.correlation_id});
          queue.last_end_ns = end_host;
          emitted = true;
        }
      }
      if (!emitted) {
        counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
        queue.last_end_ns = INT64_MIN;  // the next end-only op starts from its issue time
      }
      finish(head.op, head.pass);
      queue.popFront();
      queue.last_done_ns = pass_ns;
      if (out_.size() >= kEmitBatch) emitOps();
    }
    // Empty queues are kept (with their storage) unless streams come and go by the hundred.
    if (queue.empty() && queues_.size() > kMaxIdleQueues) {
      it = queues_.erase(it);
    } else {
      ++it;
    }
  }
}

// The hang watchdog's view: the head of every stream with pending ops, every head_interval_ns.
void Tracer::Impl::observeHeads() {
  if (opts_.head_observer == nullptr) return;
  const int64_t now_ns = clock_->nowNs();
  if (last_heads_ns_ != INT64_MIN && now_ns - last_heads_ns_ < opts_.head_interval_ns) return;
  last_heads_ns_ = now_ns;
  heads_out_.clear();
  for (const auto& [key, queue] : queues_) {
    if (queue.empty()) continue;
    const PendingOp& op = queue.front().op;
    // Non-blocking; one query per stream with pending work, every head_interval_ns.
    const bool started =
        !pooled(op.start) || timer_->queryEvent(op.start->handle) != DeviceTimer::Status::kNotReady;
    heads_out_.push_back(StreamHead{.device = key.device,
                                    .stream_id = key.stream_id,
                                    .info = op.info,
                                    .issue_ns = op.issue_ns,
                                    .since_ns = std::max(op.issue_ns, queue.last_done_ns),
                                    .key = reinterpret_cast<uintptr_t>(op.end),
                                    .pending = queue.size(),
                                    .started = started});
  }
  opts_.head_observer->onHeads(now_ns, heads_out_);
}

void Tracer::Impl::finish(const PendingOp& op, uint64_t pass) {
  if (pooled(op.start)) to_free_.push_back(op.start);
  if (pooled(op.end)) to_free_.push_back(op.end);
  auto it = outstanding_.find(pass);
  if (it != outstanding_.end() && --it->second == 0) outstanding_.erase(it);
}

// The pool mutex is held only for appends of runs of pointers. try_lock first: if a launching
// thread holds it, the events wait for the next pass rather than the poller sleeping on the
// mutex (which would make that thread's unlock a futex wake).
void Tracer::Impl::returnEvents() {
  if (to_free_.empty()) return;
  std::unique_lock<std::mutex> lock(pool_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (++return_deferred_ < kReturnTries) return;
    lock.lock();
  }
  return_deferred_ = 0;
  for (size_t begin = 0; begin < to_free_.size();) {
    const int device = to_free_[begin]->device;
    size_t end = begin + 1;
    while (end < to_free_.size() && to_free_[end]->device == device) ++end;
    std::vector<Event*>& list = freeList(device);
    list.insert(list.end(), to_free_.begin() + static_cast<std::ptrdiff_t>(begin),
                to_free_.begin() + static_cast<std::ptrdiff_t>(end));
    begin = end;
  }
  lock.unlock();
  to_free_.clear();
}

void Tracer::Impl::emitOps() {
  if (out_.empty()) return;
  struct Clear {
    std::vector<CompletedOp>& ops;
    ~Clear() { ops.clear(); }
  } clear{out_};
  if (!device_described_) {
    // The first GPU op names the rank's device: ask the driver once, on this thread.
    for (const CompletedOp& op : out_) {
      if (op.info.kind == OpKind::kSync) continue;
      device_described_ = true;
      DeviceDescription d;
      if (timer_->describeDevice(op.device, &d)) sink_->onDevice(d);
      break;
    }
  }
  sink_->onOps(out_);
}

void Tracer::Impl::sendDrops() {
  const DropCounters totals = drops();
  if (sameCounters(totals, last_drops_)) return;
  last_drops_ = totals;
  sink_->onDrops(totals);
}

void Tracer::Impl::flushSink() {
  if (final_drain_.load(std::memory_order_relaxed)) {
    sink_->finish();
  } else {
    sink_->flush();
  }
}

void Tracer::Impl::finishDrains() {
  const uint64_t oldest =
      outstanding_.empty() ? std::numeric_limits<uint64_t>::max() : outstanding_.begin()->first;
  uint64_t satisfied = 0;
  while (!drain_waits_.empty() && drain_waits_.front().pass < oldest) {
    satisfied = drain_waits_.front().generation;
    drain_waits_.pop_front();
  }
  if (satisfied == 0) return;
  flushSink();
  last_flush_ns_ = clock_->nowNs();
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    drain_done_ = std::max(drain_done_, satisfied);
  }
  done_cv_.notify_all();
}

// Last pass, from the destructor: what is still queued is not waited for. Drains that the
// pass completed are answered; the others see poller_exited_.
void Tracer::Impl::shutdownPass() {
  finishDrains();
  uint64_t stuck = 0;
  for (auto& [key, queue] : queues_) stuck += queue.size();
  queues_.clear();
  outstanding_.clear();
  if (stuck > 0) {
    counters_.unfinished.fetch_add(stuck, std::memory_order_relaxed);
    FLARE_LOG_WARN(kLog, "{} ops had not completed when timing stopped; counted as unfinished",
                   stuck);
  }
  emitOps();
  sendDrops();
  sink_->finish();
}

// ---------------------------------------------------------------------------------------------
// Public interface.

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
void Tracer::pushSpan(const CompletedSpan& span) {
  impl_->pushSpan(span);
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
