#include "src/hook/deep_trace.h"

#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/common/clock.h"
#include "src/common/config.h"
#include "src/common/log.h"
#include "src/hook/runtime.h"
#include "src/timing/buffer_pool.h"

namespace flare::hook {
namespace {

constexpr char kLog[] = "deeptrace";

// The CUPTI entry points used, resolved from the dlopened library (conventions.md #4).
struct CuptiFns {
  CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*) = nullptr;
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle) = nullptr;
  CUptiResult (*registerCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*registerTimestamp)(CUpti_TimestampCallbackFunc) = nullptr;  // CUDA 12.6+
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flushAll)(uint32_t) = nullptr;
  CUptiResult (*nextRecord)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*numDropped)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*resultString)(CUptiResult, const char**) = nullptr;
};

enum State : int { kIdle = 0, kArmed = 1, kCapturing = 2, kFlushing = 3 };

struct Capture {
  std::mutex mu;  // state changes (command, onStep transitions, the flusher)
  std::atomic<int> state{kIdle};
  void* lib = nullptr;  // guarded by mu; never closed
  std::string lib_path;
  CuptiFns fns;
  CUpti_SubscriberHandle subscriber = nullptr;  // guarded by mu
  bool realtime_clock = false;                  // timestamp callback refused: CUPTI's default
  std::unique_ptr<timing::BufferPool> pool;     // created at the first command; never freed
  uint64_t command_id = 0;
  uint32_t steps = 0;
  std::atomic<uint32_t> steps_seen{0};  // step markers since the capture started
  // Monotonic ns at which each captured step began (read by the buffer callback without a lock).
  static constexpr size_t kMaxSteps = 1000;
  std::atomic<int64_t> step_starts[kMaxSteps + 1] = {};
  std::atomic<uint64_t> kernels{0}, memcpys{0}, memsets{0}, dropped{0}, records_seen{0};
  std::atomic<int64_t> realtime_offset{0};  // realtime - monotonic, when realtime_clock
};

Capture& cap() {
  static Capture* c = new Capture();  // never destroyed: CUPTI may call back during exit
  return *c;
}

std::string resultText(CUptiResult r) {
  const char* s = nullptr;
  if (cap().fns.resultString && cap().fns.resultString(r, &s) == CUPTI_SUCCESS && s) return s;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

uint64_t CUPTIAPI monotonicTimestamp() {
  return static_cast<uint64_t>(common::monotonicNs());
}

void CUPTIAPI subscriberCallback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  Capture& c = cap();
  *max_records = 0;
  *buffer = c.pool ? c.pool->acquire() : nullptr;  // nullptr: CUPTI drops and counts
  *size = *buffer != nullptr ? c.pool->bufferBytes() : 0;
}

// The captured step a record belongs to, by its GPU start against the step markers' host times.
uint32_t stepIndexOf(Capture& c, int64_t start_ns) {
  uint32_t index = 0;
  const uint32_t n = std::min<uint32_t>(c.steps, Capture::kMaxSteps);
  for (uint32_t i = 1; i < n; ++i) {
    const int64_t t = c.step_starts[i].load(std::memory_order_acquire);
    if (t == 0 || start_ns < t) break;
    index = i;
  }
  return index;
}

void CUPTIAPI bufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t /*size*/, size_t valid) {
  Capture& c = cap();
  std::vector<timing::DeepTraceRecord> out;
  const int64_t offset = c.realtime_clock ? c.realtime_offset.load() : 0;
  try {
    CUpti_Activity* rec = nullptr;
    while (valid > 0 && c.fns.nextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      timing::DeepTraceRecord r;
      uint64_t start = 0, end = 0;
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
          r.kind = timing::DeepTraceRecord::Kind::kKernel;
          r.name = demangle(k->name);
          start = k->start;
          end = k->end;
          r.stream = k->streamId;
          r.device = static_cast<int32_t>(k->deviceId);
          r.correlation_id = k->correlationId;
          c.kernels.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          r.kind = timing::DeepTraceRecord::Kind::kMemcpy;
          static const char* const kNames[] = {"Memcpy",      "Memcpy HtoD", "Memcpy DtoH",
                                               "Memcpy HtoA", "Memcpy AtoH", "Memcpy AtoA",
                                               "Memcpy AtoD", "Memcpy DtoA", "Memcpy DtoD",
                                               "Memcpy HtoH", "Memcpy PtoP"};
          r.name = m->copyKind < std::size(kNames) ? kNames[m->copyKind] : "Memcpy";
          start = m->start;
          end = m->end;
          r.stream = m->streamId;
          r.device = static_cast<int32_t>(m->deviceId);
          r.correlation_id = m->correlationId;
          r.bytes = m->bytes;
          r.copy_kind = m->copyKind;
          c.memcpys.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          r.kind = timing::DeepTraceRecord::Kind::kMemset;
          r.name = "Memset";
          start = m->start;
          end = m->end;
          r.stream = m->streamId;
          r.device = static_cast<int32_t>(m->deviceId);
          r.correlation_id = m->correlationId;
          r.bytes = m->bytes;
          c.memsets.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        default:
          continue;  // a kind not asked for
      }
      if (start == 0 || end == 0) {  // incomplete (forced flush): no times to show
        c.dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      r.start_ns = static_cast<int64_t>(start) - offset;
      r.end_ns = static_cast<int64_t>(end) - offset;
      r.capture_id = c.command_id;
      r.step_index = stepIndexOf(c, r.start_ns);
      out.push_back(std::move(r));
    }
  } catch (...) {
    c.dropped.fetch_add(out.size(), std::memory_order_relaxed);
    out.clear();
  }
  c.pool->release(buffer);
  if (out.empty()) return;
  c.records_seen.fetch_add(out.size(), std::memory_order_relaxed);
  const size_t n = out.size();
  timing::Tracer* t = activeTracer();
  const size_t taken = t ? t->pushDeepTrace(std::move(out)) : 0;
  c.dropped.fetch_add(n - taken, std::memory_order_relaxed);
}

// Loads libcupti and resolves the table; mutex held. Empty string on success, else the reason.
std::string load(Capture& c) {
  if (c.lib != nullptr) return "";
  std::vector<std::string> candidates;
  const std::string env = common::paramString("FLARE_CUPTI_LIB");
  if (!env.empty()) {
    candidates.push_back(env);
  } else {
    candidates = {"libcupti.so.13", "libcupti.so.12", "libcupti.so",
                  "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"};
  }
  std::string tried;
  for (const std::string& path : candidates) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    auto sym = [h](const char* name) { return dlsym(h, name); };
    CuptiFns& f = c.fns;
    f.subscribe = reinterpret_cast<decltype(f.subscribe)>(sym("cuptiSubscribe"));
    f.unsubscribe = reinterpret_cast<decltype(f.unsubscribe)>(sym("cuptiUnsubscribe"));
    f.registerCallbacks =
        reinterpret_cast<decltype(f.registerCallbacks)>(sym("cuptiActivityRegisterCallbacks"));
    f.registerTimestamp = reinterpret_cast<decltype(f.registerTimestamp)>(
        sym("cuptiActivityRegisterTimestampCallback"));
    f.enable = reinterpret_cast<decltype(f.enable)>(sym("cuptiActivityEnable"));
    f.disable = reinterpret_cast<decltype(f.disable)>(sym("cuptiActivityDisable"));
    f.flushAll = reinterpret_cast<decltype(f.flushAll)>(sym("cuptiActivityFlushAll"));
    f.nextRecord = reinterpret_cast<decltype(f.nextRecord)>(sym("cuptiActivityGetNextRecord"));
    f.numDropped =
        reinterpret_cast<decltype(f.numDropped)>(sym("cuptiActivityGetNumDroppedRecords"));
    f.resultString = reinterpret_cast<decltype(f.resultString)>(sym("cuptiGetResultString"));
    if (!f.subscribe || !f.unsubscribe || !f.registerCallbacks || !f.enable || !f.disable ||
        !f.flushAll || !f.nextRecord) {
      c.fns = CuptiFns{};
      tried += (tried.empty() ? "" : ", ") + path + " (missing entry points)";
      continue;
    }
    c.lib = h;
    c.lib_path = path;
    FLARE_LOG_INFO(kLog, "flare: deep trace: loaded {}", path);
    return "";
  }
  return "libcupti not found (tried " + tried + "; set FLARE_CUPTI_LIB)";
}

void fillResult(Capture& c, flare::v1::DeepTraceResult::State state, const std::string& reason,
                flare::v1::CommandResult* result) {
  result->set_ok(state != flare::v1::DeepTraceResult::STATE_SKIPPED);
  if (!result->ok()) result->set_error(reason);
  flare::v1::DeepTraceResult* d = result->mutable_deep_trace();
  d->set_state(state);
  d->set_steps_requested(c.steps);
  d->set_steps_captured(
      state == flare::v1::DeepTraceResult::STATE_DONE ? std::min(c.steps_seen.load(), c.steps) : 0);
  d->set_kernels(c.kernels.load());
  d->set_memcpys(c.memcpys.load());
  d->set_memsets(c.memsets.load());
  d->set_dropped(c.dropped.load());
  d->set_reason(reason);
  d->set_library(c.lib_path);
}

void post(Capture& c, flare::v1::DeepTraceResult::State state, const std::string& reason) {
  flare::v1::CommandResult result;
  result.set_command_id(c.command_id);
  fillResult(c, state, reason, &result);
  postCommandResult(result);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                     CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

// Mutex held: back to idle, CUPTI released.
void release(Capture& c) {
  if (c.subscriber != nullptr) c.fns.unsubscribe(c.subscriber);
  c.subscriber = nullptr;
  c.state.store(kIdle, std::memory_order_release);
}

// The "flare-deeptrace" thread: flush until the records stop coming, answer DONE.
void flushAndFinish() {
  pthread_setname_np(pthread_self(), "flare-deeptrace");
  Capture& c = cap();
  const auto t0 = std::chrono::steady_clock::now();
  const double timeout_s =
      common::paramDurationSeconds("FLARE_DEEP_TRACE_FLUSH_SECONDS", 0.1, 600.0);
  uint64_t last = ~uint64_t{0};
  int quiet = 0;
  for (;;) {
    c.fns.flushAll(0);
    const uint64_t seen = c.records_seen.load() + c.dropped.load();
    quiet = seen == last ? quiet + 1 : 0;
    last = seen;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if ((quiet >= 3 && elapsed >= 0.1) || elapsed >= timeout_s) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c.fns.flushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (c.fns.numDropped != nullptr) {
    size_t n = 0;
    if (c.fns.numDropped(nullptr, 0, &n) == CUPTI_SUCCESS) c.dropped.fetch_add(n);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  FLARE_LOG_INFO(kLog,
                 "flare: deep trace {} done: {} steps, {} kernels, {} memcpys, {} memsets, {} "
                 "records dropped",
                 c.command_id, c.steps, c.kernels.load(), c.memcpys.load(), c.memsets.load(),
                 c.dropped.load());
  post(c, flare::v1::DeepTraceResult::STATE_DONE, "");
  release(c);
}

}  // namespace

namespace {

// Arms a capture of `steps` steps from the next step marker; mutex held. Fills `result`.
void arm(Capture& c, uint64_t command_id, uint32_t steps, flare::v1::CommandResult* result) {
  auto skip = [&](const std::string& reason) {
    flare::v1::DeepTraceResult::State st = flare::v1::DeepTraceResult::STATE_SKIPPED;
    result->set_ok(false);
    result->set_error(reason);
    flare::v1::DeepTraceResult* d = result->mutable_deep_trace();
    d->set_state(st);
    d->set_steps_requested(steps);
    d->set_reason(reason);
    d->set_library(c.lib_path);
  };
  if (steps == 0 || steps > Capture::kMaxSteps) return skip("steps must be in [1, 1000]");
  if (c.state.load() == kArmed) {
    // Still waiting for its first step (a process that marks no steps): the new one replaces it.
    post(c, flare::v1::DeepTraceResult::STATE_SKIPPED,
         "replaced by command " + std::to_string(command_id) + " before a step began");
    release(c);
  }
  if (c.state.load() != kIdle) {
    return skip("a deep trace is already running (command " + std::to_string(c.command_id) + ")");
  }
  if (activeTracer() == nullptr) return skip("tracing is off in this process");
  std::string error = load(c);
  if (!error.empty()) {
    common::logOnce(common::LogLevel::kWarn, kLog, "no-cupti", "flare: deep trace skipped: {}",
                    error);
    return skip(error);
  }
  const CUptiResult sr = c.fns.subscribe(&c.subscriber, subscriberCallback, nullptr);
  if (sr != CUPTI_SUCCESS) {
    c.subscriber = nullptr;
    const std::string reason =
        sr == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
            ? "CUPTI is in use by another tool (torch.profiler, Nsight Systems/Compute, ...): " +
                  resultText(sr) + "; deep trace skipped"
            : "cuptiSubscribe failed: " + resultText(sr);
    common::logOnce(common::LogLevel::kWarn, kLog, "cupti-busy", "flare: {}", reason);
    return skip(reason);
  }
  if (!c.pool) {
    const auto count = static_cast<size_t>(common::paramInt("FLARE_DEEP_TRACE_BUFFERS", 2, 4096));
    const auto bytes = static_cast<size_t>(
        common::paramInt("FLARE_DEEP_TRACE_BUFFER_BYTES", 4096, int64_t{256} << 20));
    c.pool = std::make_unique<timing::BufferPool>(count, bytes);
  }
  const CUptiResult rr = c.fns.registerCallbacks(bufferRequested, bufferCompleted);
  if (rr != CUPTI_SUCCESS) {
    release(c);
    return skip("cuptiActivityRegisterCallbacks failed: " + resultText(rr));
  }
  c.realtime_clock = c.fns.registerTimestamp == nullptr ||
                     c.fns.registerTimestamp(monotonicTimestamp) != CUPTI_SUCCESS;
  if (c.realtime_clock) {
    c.realtime_offset.store(common::realtimeNs() - common::monotonicNs());
  }
  c.command_id = command_id;
  c.steps = steps;
  c.steps_seen.store(0);
  for (auto& t : c.step_starts) t.store(0);
  c.kernels = 0;
  c.memcpys = 0;
  c.memsets = 0;
  c.dropped = 0;
  c.records_seen = 0;
  c.state.store(kArmed, std::memory_order_release);
  fillResult(c, flare::v1::DeepTraceResult::STATE_ARMED, "", result);
}

// FLARE_DEEP_TRACE=FROM_STEP:N: capture N steps from the FROM_STEP-th step marker (0-based)
// without a daemon (spool runs); -1: not configured (or malformed: one warning).
struct EnvTrigger {
  int64_t from = -1;
  uint32_t steps = 0;
};
EnvTrigger envTrigger() {
  EnvTrigger t;
  const std::string v = common::paramString("FLARE_DEEP_TRACE");
  if (v.empty()) return t;
  const size_t colon = v.find(':');
  const auto from =
      colon == std::string::npos ? std::nullopt : common::parseInt(v.substr(0, colon));
  const auto steps =
      colon == std::string::npos ? std::nullopt : common::parseInt(v.substr(colon + 1));
  if (!from || !steps || *from < 0 || *steps < 1 || *steps > int64_t{Capture::kMaxSteps}) {
    common::configWarning("FLARE_DEEP_TRACE=" + v + " is not FROM_STEP:N (N in 1-1000); ignored");
    return t;
  }
  t.from = *from;
  t.steps = static_cast<uint32_t>(*steps);
  return t;
}

}  // namespace

void deepTraceCommand(const flare::v1::Command& command, flare::v1::CommandResult* result) {
  Capture& c = cap();
  std::lock_guard<std::mutex> lock(c.mu);
  arm(c, command.id(), command.deep_trace().steps(), result);
}

void deepTraceOnStep() {
  Capture& c = cap();
  static const EnvTrigger env = envTrigger();
  if (env.from >= 0) [[unlikely]] {
    static std::atomic<int64_t> markers{0};
    if (markers.fetch_add(1, std::memory_order_relaxed) == env.from) {
      std::lock_guard<std::mutex> lock(c.mu);
      flare::v1::CommandResult result;
      arm(c, 0, env.steps, &result);
      if (!result.ok()) {
        FLARE_LOG_WARN(kLog, "flare: FLARE_DEEP_TRACE: not captured: {}", result.error());
      }
    }
  }
  const int state = c.state.load(std::memory_order_relaxed);
  if (state != kArmed && state != kCapturing) [[likely]]
    return;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.state.load() == kArmed) {
    for (size_t i = 0; i < std::size(kKinds); ++i) {
      const CUptiResult r = c.fns.enable(kKinds[i]);
      if (r == CUPTI_SUCCESS) continue;
      for (size_t j = 0; j < i; ++j) c.fns.disable(kKinds[j]);
      const std::string reason =
          "CUPTI activity recording is in use by another tool (cuptiActivityEnable: " +
          resultText(r) + "); deep trace skipped";
      common::logOnce(common::LogLevel::kWarn, kLog, "cupti-enable", "flare: {}", reason);
      post(c, flare::v1::DeepTraceResult::STATE_SKIPPED, reason);
      release(c);
      return;
    }
    c.step_starts[0].store(common::monotonicNs(), std::memory_order_release);
    c.state.store(kCapturing, std::memory_order_release);
    return;
  }
  // Capturing: this marker ends captured step steps_seen.
  const uint32_t seen = c.steps_seen.fetch_add(1) + 1;
  if (seen < c.steps) {
    c.step_starts[seen].store(common::monotonicNs(), std::memory_order_release);
    return;
  }
  for (CUpti_ActivityKind k : kKinds) c.fns.disable(k);
  c.state.store(kFlushing, std::memory_order_release);
  try {
    std::thread(flushAndFinish).detach();
  } catch (...) {
    post(c, flare::v1::DeepTraceResult::STATE_SKIPPED, "could not start the flush thread");
    release(c);
  }
}

void deepTraceAtExit() {
  Capture& c = cap();
  int state = c.state.load();
  if (state == kIdle) return;
  if (state == kArmed || state == kCapturing) {
    {
      std::lock_guard<std::mutex> lock(c.mu);
      state = c.state.load();
      if (state == kArmed) {
        release(c);
        return;
      }
      if (state == kCapturing) {
        for (CUpti_ActivityKind k : kKinds) c.fns.disable(k);
        c.state.store(kFlushing, std::memory_order_release);
      }
    }
    if (state == kCapturing) {
      FLARE_LOG_INFO(kLog, "flare: deep trace {}: the process is exiting after {} of {} steps",
                     c.command_id, c.steps_seen.load(), c.steps);
      flushAndFinish();
      return;
    }
  }
  // The flush thread is at work: give it its time.
  const double limit = common::paramDurationSeconds("FLARE_DEEP_TRACE_FLUSH_SECONDS", 0.1, 600.0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit + 1);
  while (c.state.load() != kIdle && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace flare::hook
