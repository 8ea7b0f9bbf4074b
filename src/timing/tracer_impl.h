// The Tracer's private parts, shared by its files (the layout and its trade-offs are described at
// the top of tracer.cc):
//   tracer.cc         construction, destruction, the calls of any thread (intern, drain, drops)
//   tracer_launch.cc  the launching thread's hot path: thread states, the event cache, the rings
//   tracer_poller.cc  the poller thread: rings → per-stream queues, completion, drains
//   tracer_clock.cc   the GPU → host clock map (reference events per device)
//   tracer_emit.cc    handing over to the Sink: signatures, API names, spans, ops, drops, flushes
// Private to those files: nothing else includes it.
#pragma once

#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "src/timing/spsc_ring.h"
#include "src/timing/timing.h"

namespace flare::timing {
namespace tracer_internal {

inline constexpr char kLog[] = "timing";
inline constexpr size_t kCacheCapacity = 64;  // free events a thread keeps
inline constexpr size_t kRefillBatch = 32;    // taken from the global pool at once
inline constexpr size_t kCreateChunk = 64;    // events created at once when the pool is empty
inline constexpr size_t kTlsSlots = 4;      // Tracers a thread keeps state for (tests make several)
inline constexpr size_t kEmitBatch = 1024;  // CompletedOps per Sink::onOps call at most
inline constexpr int64_t kDrainPollNs = 1'000'000;  // poll at least this often while drain() waits
inline constexpr int64_t kMinPollNs = 10'000;
inline constexpr int64_t kMaxWaitNs = 100'000'000'000'000'000;  // ~3 years: no overflow in wait_for
inline constexpr int kReferenceAttempts = 3;  // before a device without calibration drops its ops
// A reference whose record call took longer than this to bracket (the poller preempted around
// it) may be off by that much: it is taken again after kLooseRetryNs, and replaces the one in
// use only if it is tighter. The error is a constant offset of every time the rank maps, and
// collectives are timed across ranks (last end − last start), so a few tens of µs matter: at
// 100 µs, a reference 44 µs late on one rank of a TP pair (a loaded 2-core host, the poller
// descheduled after the record) stretched that pair's all-reduce from 176 to 220 µs whenever
// its peer arrived last, and link_slow named the pair. An idle record call takes a few µs.
inline constexpr int64_t kTightReferenceNs = 10'000;
inline constexpr int64_t kLooseRetryNs = 50'000'000;
inline constexpr int kMaxDevices = 1024;           // device ordinals index the pool's free lists
inline constexpr int kReturnTries = 8;             // passes the poller may defer returning events
inline constexpr size_t kMaxIdleQueues = 256;      // stream queues kept while empty
inline constexpr size_t kSpanRingCapacity = 1024;  // closed Python spans per thread between passes
// The event-gap estimate (TracerOptions::correct_event_gap): readings per window, and the
// largest reading taken as two events back to back.
inline constexpr int kGapWindow = kEventGapWindow;
inline constexpr int64_t kMaxGapReadingNs = 100'000;

// A pooled event. Tickets carry pointers to these: the device is known without a lookup.
struct Event {
  void* handle = nullptr;
  int32_t device = 0;
};

// TracerOptions::end_only: the `start` of an op timed with its end event alone. Never pooled,
// never recorded: the poller takes the op's start from the end of the op before it on its
// stream, or from its issue time when the stream was idle by then.
__attribute__((visibility("hidden"))) extern Event g_chained_start;  // tracer_launch.cc

inline bool pooled(const Event* e) {
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
__attribute__((visibility("hidden"))) extern std::atomic<uint32_t> g_next_thread_index;
__attribute__((visibility("hidden"))) extern std::atomic<uint64_t> g_stateless_correlation;

struct ThreadState {
  ThreadState(size_t ring_capacity, uint32_t tid)
      : ring(ring_capacity), spans(kSpanRingCapacity), thread_id(tid) {}

  SpscRing<PendingOp> ring;
  SpscRing<CompletedSpan> spans;  // traced Python spans closed on this thread
  // Free events of `cache_device`. Owner thread only; the poller once `exited` is set.
  Event* cache[kCacheCapacity] = {};
  size_t cache_size = 0;
  int cache_device = -1;
  uint32_t cost_tick = 0;  // TracerOptions::measure_cost: timed ops of this thread, mod kCostEvery
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
  // correct_event_gap: the GPU time between two event commands queued back to back on one
  // stream of this device, the median of the last full window of readings; 0: none yet.
  int64_t event_gap_ns = 0;
  int gap_readings = 0;       // in the current window
  bool gap_measured = false;  // a window of readings was full at least once
  bool gap_logged = false;    // the estimate, or that there was none, has been said
  std::array<int64_t, kGapWindow> gap_window{};
};

}  // namespace tracer_internal

struct Tracer::Impl {
  using Event = tracer_internal::Event;
  using PendingOp = tracer_internal::PendingOp;
  using ThreadState = tracer_internal::ThreadState;
  using StreamKey = tracer_internal::StreamKey;
  using StreamKeyHash = tracer_internal::StreamKeyHash;
  using DeviceCal = tracer_internal::DeviceCal;

  Impl(DeviceTimer* timer, const common::Clock* clock, Sink* sink, TracerOptions opts);
  ~Impl();

  // Launching thread (tracer_launch.cc).
  bool begin(void* stream, Ticket* ticket) noexcept;
  void end(Ticket* ticket, const OpInfo& info) noexcept;
  void cancel(Ticket* ticket) noexcept;
  void hostSpan(const OpInfo& info, int64_t start_ns, int64_t end_ns) noexcept;
  void streamWaits(void* stream) noexcept;
  void pushSpan(const CompletedSpan& span) noexcept;
  // Any thread (tracer.cc).
  uint32_t intern(const Signature& sig) noexcept;
  bool drain(int64_t timeout_ns) noexcept;
  DropCounters drops() const noexcept;

  // The calling thread's state for this Tracer (two thread_local reads in steady state); defined
  // in tracer_launch.cc, the only file that calls it.
  inline ThreadState* threadState() noexcept;
  ThreadState* threadStateSlow() noexcept;
  enum class Take { kOk, kExhausted, kError };
  // takeEvents() and refill() are inlined into begin(), as GCC did when the Tracer was one file
  // (local functions called once): the launch path keeps the code it was measured with.
  // Pops the op's end event and, unless `start` is null (end-only timing), its start event.
  [[gnu::always_inline]] inline Take takeEvents(ThreadState* ts, int device, Event** start,
                                                Event** end) noexcept;
  [[gnu::always_inline]] inline Take refill(ThreadState* ts, int device) noexcept;
  std::vector<Event*>& freeList(int device);  // pool_mu_ held; grows free_ (also the poller)
  void giveBack(ThreadState* ts, Event* event) noexcept;
  void push(ThreadState* ts, const PendingOp& op) noexcept;
  void addCost(int64_t since_ns) noexcept;  // measure_cost: now - since_ns into host_cost_ns_

  // Poller thread: polling and event timing (tracer_poller.cc), the GPU → host clock map
  // (tracer_clock.cc), handing over to the sink (tracer_emit.cc).
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
  // correct_event_gap, when timing ends: a device whose gap was never measured says so once
  // (its durations went uncorrected).
  void sayUnmeasuredGaps();
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
  // TracerOptions::measure_cost: the launching threads' time in begin() and end() of timed ops,
  // measured on one op in kCostEvery per thread and scaled by it (the clock reads cost ~30 ns
  // each on a VM: measuring every op would add ~100 ns to each).
  static constexpr uint32_t kCostEvery = 8;
  alignas(64) std::atomic<uint64_t> host_cost_ns_{0};
  // TracerOptions::measure_cost: the timed ops' event records, counted on the same measured ops
  // as host_cost_ns_ and scaled the same way; and the poller's latest event-gap estimate of any
  // device (DeviceCal::event_gap_ns; 0 until one is measured, and never with end_only or without
  // correct_event_gap).
  std::atomic<uint64_t> event_records_{0};
  std::atomic<int64_t> event_gap_ns_{0};

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
    // correct_event_gap: the last emitted op's uncorrected GPU start and end and its thread;
    // prev_pair_end_ns INT64_MIN when it was not timed by a pair of events.
    int64_t prev_pair_start_ns = INT64_MIN;
    int64_t prev_pair_end_ns = INT64_MIN;
    uint32_t prev_pair_thread = 0;
    const void* prev_pair_ref = nullptr;  // the clock reference its times were mapped through

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
  // correct_event_gap: takes a gap reading from `op` (timed by a pair of events, uncorrected
  // GPU times *start and *end) and the op before it on `queue`, then corrects *start and *end.
  void correctEventGap(int device, const PendingOp& op, OpQueue& queue, DeviceCal& cal,
                       int64_t* start, int64_t* end);
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
  bool entered_timing_thread_ = false;      // poller thread: DeviceTimer::enterTimingThread
  std::vector<int64_t> graph_launches_;     // poller thread: graph launches taken, not emitted
  int64_t in_flight_min_ns_ = INT64_MAX;    // poller thread: this pass's oldest call in flight
  std::vector<StreamHead> heads_out_;
  int64_t last_heads_ns_ = INT64_MIN;
};

}  // namespace flare::timing
