// Timing of GPU work in the background: the interface the hook calls on the launching thread.
//
// A wrapper in src/hook calls Tracer::begin() before forwarding a launch (start event recorded
// on the op's stream), then Tracer::end() after it (end event recorded, the pending op pushed
// into the calling thread's ring). One background thread (the poller) drains the rings, keeps a
// FIFO per stream (ops on one stream complete in order; a stuck stream never delays another),
// queries end events, converts GPU times to the host monotonic clock through a calibration
// against a reference event, and hands completed ops to a Sink in batches.
//
// Hot path contract (begin/end/hostSpan): no heap allocation in steady state, no contended lock,
// no syscall beyond the two event records, never blocks. When something runs out (event pool,
// ring), the op is dropped and counted, never waited for.
//
// Vendor seam: all CUDA calls go through DeviceTimer, so unit tests replay synthetic times
// (conventions.md #5). Clock: through common::Clock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/clock.h"

namespace flare::timing {

enum class OpKind : uint8_t {
  kKernel = 1,      // any kernel launch (cudaLaunchKernel, cuLaunchKernel, ...)
  kGemm = 2,        // cuBLAS / cuBLASLt matmul
  kAttention = 3,   // attention kernels (registered or recognized by name)
  kCollective = 4,  // NCCL collective (one record per call, or per group)
  kP2P = 5,         // NCCL send/recv (a group of them is one record)
  kMemcpy = 6,
  kMemset = 7,
  kGraph = 8,  // cudaGraphLaunch, timed as one unit
  kSync = 9,   // host span: cudaDeviceSynchronize, cudaStreamSynchronize, ...
};

// What a record is an instance of; interned to a small integer, sent once per stream.
struct Signature {
  std::string name;  // demangled kernel name, "cublasGemmEx", "ncclAllReduce", ...
  OpKind kind = OpKind::kKernel;
  std::string dtype;           // "bf16", "f16", "f32", ... ("" when not applicable)
  std::vector<int64_t> shape;  // GEMM: {m, n, k, batch}; collective: {count}; else empty
  std::string layout;          // GEMM: "tn lda=.. ldb=.. ldc=.."; collective: op/root; else ""
};

// Per-op facts the wrapper knows; fixed size, copied into the ring.
// OpInfo::flags.
// Some intercepted op of the launching thread ran untimed (1-in-N sampling) between its
// previous timed op and this one: this op's start event need not follow that op's end event
// on the stream (the Tracer's event-gap estimate leaves the pair out).
constexpr uint8_t kOpAfterUntimed = 1;
// One of its signature's first calls on its thread (hook: signatureFirstCalls), timed in any
// step: under step sampling (FLARE_SAMPLE_STEPS) it stands for itself, not for the steps sampled
// out before its step (a shape that runs in a few steps only, an evaluation pass's, is counted
// exactly and not as if it ran in every step).
constexpr uint8_t kOpFirstCalls = 2;
// Issued while its step was sampled out (FLARE_SAMPLE_STEPS, the timing budget): the kernels,
// GEMMs, copies and sets around it ran untimed. With kOpAfterUntimed, a collective that has not
// started is waiting for work the hook did not time (the rank watchdog says so: hang_watch.cc).
constexpr uint8_t kOpInSampledOutStep = 4;

struct OpInfo {
  uint32_t signature_id = 0;
  OpKind kind = OpKind::kKernel;
  uint8_t flags = 0;  // kOpAfterUntimed, kOpFirstCalls, kOpInSampledOutStep
  // Launches this op stands for: 1, or with 1-in-N sampling of plain kernel launches
  // (FLARE_SAMPLE_KERNELS, src/hook/launch_sampling.h) the launches of its thread since the
  // previous timed one, itself included. Counts, times, FLOPs and bytes scale by it.
  uint16_t weight = 1;
  uint64_t flops = 0;
  uint64_t bytes = 0;      // collectives: S of the nccl-tests definitions
  uint64_t comm_hash = 0;  // collectives: stable communicator identity
  uint64_t seq = 0;        // collectives: per-communicator sequence number
  uint32_t nranks = 0;     // collectives: communicator size
  int32_t peer = -1;       // p2p: peer rank (-1 for groups with several peers)
};

// What the driver says of a GPU (DeviceTimer::describeDevice): name, UUID and the figures the
// daemon's peak table and history key use.
struct DeviceDescription {
  int index = 0;
  std::string name;  // "NVIDIA H100 80GB HBM3"
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string pci_bus_id;
  uint32_t sm_count = 0;
  uint32_t clock_khz = 0;
  uint32_t cc_major = 0;
  uint32_t cc_minor = 0;
  uint64_t memory_bytes = 0;
};

// A completed op, in host monotonic nanoseconds.
struct CompletedOp {
  OpInfo info;
  uint64_t stream_id = 0;  // stable id of the stream within the process (0 = legacy default)
  int32_t device = 0;
  uint32_t thread_id = 0;       // launching thread (gettid)
  int64_t issue_ns = 0;         // host time of the API call
  int64_t start_ns = 0;         // GPU start, mapped to host time (kSync: host start)
  int64_t end_ns = 0;           // GPU end, mapped to host time (kSync: host end)
  uint64_t parent_span_id = 0;  // innermost traced Python span open on the launching thread
  uint64_t correlation_id = 0;  // unique per process: (thread index << 40) | launch count; 0: none
};

// A completed call of a traced Python API (src/pyprof), in host monotonic nanoseconds. Spans of
// one thread nest: parent_id is the span that was open when this one began (0: none).
struct CompletedSpan {
  uint64_t id = 0;      // per process, from 1
  uint32_t api_id = 0;  // interned API name (see Sink::onApiName)
  uint32_t thread_id = 0;
  uint64_t parent_id = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int32_t gc_generation = -1;  // GC spans: the collected generation; -1 otherwise
  int64_t gc_collected = 0;
  int64_t gc_uncollectable = 0;
};

// One GPU activity of a deep trace (src/hook/deep_trace.h: CUPTI Activity API records), in host
// monotonic nanoseconds like CompletedOp. Cold path: a few steps' worth, names owned.
struct DeepTraceRecord {
  enum class Kind : uint8_t { kKernel = 1, kMemcpy = 2, kMemset = 3 };
  Kind kind = Kind::kKernel;
  std::string name;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint32_t stream = 0;  // CUPTI's stream id
  int32_t device = 0;
  uint32_t correlation_id = 0;  // CUPTI's
  uint64_t bytes = 0;           // memcpy/memset
  uint32_t copy_kind = 0;       // memcpy: CUpti_ActivityMemcpyKind
  uint64_t capture_id = 0;      // the DeepTrace command's id
  uint32_t step_index = 0;      // which captured step (0-based)
};

struct DropCounters {
  uint64_t ring_full = 0;         // a thread's ring had no room
  uint64_t events_exhausted = 0;  // the event pool was empty and at its bound
  uint64_t event_errors = 0;      // an event call failed (that op is lost)
  uint64_t capturing = 0;         // ops skipped because their stream was being captured
  uint64_t unfinished = 0;        // ops still pending when the Tracer was destroyed (stuck stream)
  uint64_t spans_dropped = 0;     // traced Python spans dropped (span ring full)
};

// The vendor seam: everything the timing layer asks of the GPU.
class DeviceTimer {
 public:
  enum class Status { kReady, kNotReady, kError };
  virtual ~DeviceTimer() = default;
  virtual bool createEvent(void** event) = 0;
  virtual void destroyEvent(void* event) = 0;
  virtual bool recordEvent(void* event, void* stream) = 0;
  virtual Status queryEvent(void* event) = 0;
  // GPU time from `from` to `to` in ns (both completed).
  virtual bool elapsedNs(void* from, void* to, int64_t* ns) = 0;
  virtual bool isCapturing(void* stream) = 0;
  virtual uint64_t streamId(void* stream) = 0;
  virtual int currentDevice() = 0;
  // The device's description from the driver (timing thread, once per device, never on the
  // launch path). false: unknown (the default; test timers).
  virtual bool describeDevice(int /*device*/, DeviceDescription* /*out*/) { return false; }
  // Called once on the timing thread before its first call. The real timer puts that thread in
  // relaxed stream-capture mode: its event queries while the application captures a CUDA graph
  // in global mode (torch.cuda.graph's default) would otherwise fail and invalidate that
  // capture. false: the mode could not be set (said once in the log).
  virtual bool enterTimingThread() { return true; }
  // Clock calibration, called on the poller thread: creates an event on `device` and records it
  // at once on a stream of that device with no queued work, so that the GPU timestamps it as
  // soon as it reaches it (its GPU time is then the host time of the call plus launch latency).
  // The real implementation keeps a private non-blocking stream per device and makes `device`
  // current around the two calls. Not the legacy stream: work there waits for everything
  // queued on blocking streams, which would put the reference off by the GPU's queue depth.
  // The event is released with destroyEvent.
  virtual bool recordReference(int device, void** event) = 0;
};

// Where completed ops go (the spool writer, later the gRPC exporter). Called on the poller
// thread only.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void onSignature(uint32_t id, const Signature& sig) = 0;
  virtual void onOps(std::span<const CompletedOp> ops) = 0;
  virtual void onDrops(const DropCounters& totals) = 0;
  virtual void flush() = 0;
  // The last flush, when tracing stops: what waits for a later op (MODE_SUMMARY's last
  // complete step) goes out too.
  virtual void finish() { flush(); }
  // Traced Python APIs: a name is announced once, before the first span that uses its id.
  virtual void onApiName(uint32_t /*id*/, const std::string& /*qualified_name*/) {}
  virtual void onSpans(std::span<const CompletedSpan> /*spans*/) {}
  // The issue times of the CUDA graph launches among the ops taken since the last call, handed
  // over before that pass's spans: training work for the step rule (records::StepBoundaryRule),
  // since a step captured whole in a graph replays with no backward or optimizer call.
  virtual void onGraphLaunches(std::span<const int64_t> /*issue_ns*/) {}
  // The GPU of the first op the tracer completed (once per process).
  virtual void onDevice(const DeviceDescription& /*device*/) {}
  // After every poller pass: every op issued (CLOCK_MONOTONIC) before `issued_before_ns` has
  // completed and been handed to onOps (or dropped), so figures over earlier times are final.
  virtual void onWatermark(int64_t /*issued_before_ns*/) {}
  // Deep-trace records (Tracer::pushDeepTrace), in the order they were pushed.
  virtual void onDeepTrace(std::span<const DeepTraceRecord> /*records*/) {}
};

// The oldest pending op of one stream: the op the stream waits for (issued, every earlier op of
// the stream completed), for the rank's hang watchdog (src/hook/hang_watch.h).
struct StreamHead {
  int32_t device = 0;
  uint64_t stream_id = 0;
  OpInfo info;
  int64_t issue_ns = 0;
  // When it became the head: its issue time, or the poller's time when it saw the previous head
  // complete, whichever is later (host monotonic ns).
  int64_t since_ns = 0;
  uint64_t key = 0;    // the same while the same op is the head; unique among pending ops
  size_t pending = 0;  // ops queued on the stream, the head included
  // Its start event has completed (queried without blocking at each pass): the op runs on the
  // GPU. false: the stream waits before it (a cudaStreamWaitEvent on another stream's work).
  // An event error counts as started; host spans are started.
  bool started = true;
};

// Sees the heads of the streams (the timing side of hang detection). Called on the poller
// thread only; must not block.
class HeadObserver {
 public:
  virtual ~HeadObserver() = default;
  // Every TracerOptions::head_interval_ns: every stream that has pending ops (streams without
  // any are absent: idle), in no particular order. `now_ns` is the Tracer's clock.
  virtual void onHeads(int64_t now_ns, std::span<const StreamHead> heads) = 0;
};

// Gap readings per window of the event-gap estimate (TracerOptions::correct_event_gap).
inline constexpr int kEventGapWindow = 64;

struct TracerOptions {
  size_t ring_capacity = 4096;  // pending ops per launching thread
  size_t max_events = 65536;    // bound of the event pool (2 per in-flight op)
  int64_t poll_interval_ns = 1'000'000;
  int64_t flush_interval_ns = 1'000'000'000;  // the sink's flush(): a batch's time bound
  // A new clock reference this often. cudaEventElapsedTime returns float milliseconds, so a
  // time mapped through a reference T ms old is quantized to T * 2^-23 ms (about 1 us at 8 s,
  // 0.06 us under 1 s): durations of microsecond kernels and the event-gap readings need
  // young references.
  int64_t recalibrate_ns = 1'000'000'000;
  HeadObserver* head_observer = nullptr;  // not owned; outlives the Tracer
  int64_t head_interval_ns = 200'000'000;
  // One event per op (FLARE_TIMING=end): the end event only; the op's start is the end of the op
  // before it on its stream, or its issue time when the stream was idle. Half the event records
  // and queries of the default (a start and an end event per op). An op that runs untimed on
  // the thread makes the next one record its start event again.
  bool end_only = false;
  // Pair timing (not end_only): take the GPU time between two event commands queued back to
  // back off each side of an op timed by a pair of events. A start event runs that long before
  // the op's first GPU work, and the end event that long after its last, so a pair reads about
  // twice that more than the op itself (~2.6-3 us per op on an H200, docs/benchmarks.md): a
  // 50 us kernel read 6% long. The gap is measured per device from the ops themselves (the end
  // event of one op and the start event of the next op its thread queued on that stream before
  // that op started), the median of each window of kGapWindow readings; no correction until the
  // first window is full. FLARE_EVENT_GAP_CORRECTION (default on).
  bool correct_event_gap = false;
  // Add up the launching threads' time in begin() and end() of the timed ops (hostCostNs;
  // measured on one op in 8 per thread, three more clock reads there) and count their event
  // records (eventRecords). For step sampling's timing budget (FLARE_TIMING_BUDGET_PCT,
  // src/timing/step_sampling.h).
  bool measure_cost = false;
};

// Owns the event pool, the rings, the poller thread. Thread-safe as documented per method.
class Tracer {
 public:
  Tracer(DeviceTimer* timer, const common::Clock* clock, Sink* sink, TracerOptions opts);
  ~Tracer();  // stops the poller, flushes
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Launching thread. Returns false (and counts why) when the op cannot be timed: the
  // wrapper then just forwards. `ticket` is opaque storage owned by the caller.
  // start/end are the Tracer's own event handles (not CUDA events): pass the ticket back
  // untouched, to end() or cancel() on the thread that called begin().
  struct Ticket {
    void* start = nullptr;
    void* end = nullptr;
    void* stream = nullptr;
    int64_t issue_ns = 0;
    bool cost_measured = false;  // TracerOptions::measure_cost: this op's end() is measured too
  };
  bool begin(void* stream, Ticket* ticket);
  void end(Ticket* ticket, const OpInfo& info);
  // Called instead of end() when the forwarded call failed: returns the events, records nothing.
  void cancel(Ticket* ticket);
  // A host-side span (synchronization calls).
  void hostSpan(const OpInfo& info, int64_t start_ns, int64_t end_ns);
  // Launching thread: `stream` was made to wait for other work (cudaStreamWaitEvent). With
  // TracerOptions::end_only its next op records its start event (it may start long after the
  // op before it on the stream ended). No-op otherwise.
  void streamWaits(void* stream);

  // Any thread, cold path (locks, allocates): returns the signature's id, assigning one the
  // first time. Identical signatures get the same id.
  uint32_t intern(const Signature& sig);

  // Any thread: waits until every op pushed before the call is completed or dropped (or
  // `timeout_ns` passes), then flushes the sink. Returns true when everything was drained.
  // `final` (at process exit): the sink finishes instead (Sink::finish: what waits for a later
  // op, such as MODE_SUMMARY's last complete step, goes out too); later flushes finish too.
  bool drain(int64_t timeout_ns, bool final = false);
  DropCounters drops() const;
  // Any thread: the launching threads' time in begin() and end() of the ops timed so far, ns
  // (0 unless TracerOptions::measure_cost): what timing cost them, event records included.
  uint64_t hostCostNs() const;
  // Any thread: the event records of the ops timed so far (0 unless TracerOptions::measure_cost;
  // counted like hostCostNs, on one op in 8 per thread), and the GPU time between two event
  // commands queued back to back, the latest estimate of any device (0 until measured:
  // correct_event_gap with pair timing). Each record holds its stream for about one such gap:
  // a stream busy behind its queue runs that much longer, one that waits for its host absorbs it.
  uint64_t eventRecords() const;
  int64_t eventGapNs() const;
  // Called in a forked child: the poller thread does not exist there; disables tracing.
  void disableAfterFork();

  // Launching thread: hands a span closed by closeSpan() to the poller (fills thread_id). Hot
  // path: no allocation in steady state, no lock; a full span ring drops it (spans_dropped).
  void pushSpan(const CompletedSpan& span);

  // Any thread, cold path (a mutex, allocation): queues deep-trace records for the sink; the
  // poller hands them over at its next pass. At most `kMaxPendingDeepTrace` wait; the rest are
  // refused. Returns how many were accepted (the caller counts the others as dropped).
  static constexpr size_t kMaxPendingDeepTrace = 1 << 20;
  size_t pushDeepTrace(std::vector<DeepTraceRecord>&& records);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Traced Python spans (src/pyprof). Process-wide, independent of any Tracer, so that spans can
// open before the first CUDA call brings the Tracer up.

// Any thread, cold path (lock, allocation): the id of a traced API's name
// ("torch.cuda@synchronize", "gc@collect"), from 1, the same id for the same name. 0 when it cannot
// be stored. A Tracer's poller announces new names to its Sink (Sink::onApiName) before the spans
// that use them.
uint32_t internApi(std::string_view qualified_name) noexcept;
// Names with ids first+1, first+2, ... (the poller's view of what is new).
std::vector<std::string> apiNamesAfter(uint32_t first);

// The calling thread's stack of open spans (thread_local, fixed depth; no lock, no allocation).
// openSpan pushes a span of `api_id` keyed by `key` (what identifies the traced function, e.g.
// its code object) and returns its id (per process, from 1), or 0 when the stack is full (the
// span is not recorded; counted). closeSpan closes the innermost open span if its key is `key`
// and fills `out` (id, api_id, parent_id, start, end; gc fields -1/0). A key found deeper in
// the stack closes it and drops the spans above it (counted); a key not on the stack (a call
// that began before tracing did) returns false and changes nothing.
uint64_t openSpan(uint32_t api_id, const void* key, int64_t start_ns) noexcept;
bool closeSpan(const void* key, int64_t end_ns, CompletedSpan* out) noexcept;
// The innermost open span of the calling thread (0: none): the parent of the ops it launches.
uint64_t currentSpanId() noexcept;
// Spans lost by the stacks of all threads (full stack, unbalanced closes), process total.
uint64_t spanStackDrops() noexcept;

}  // namespace flare::timing
