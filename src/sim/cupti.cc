// The simulated CUPTI (libcupti.so.13 in <build>/lib/sim): the Activity API entry points Flare's
// deep trace uses (src/hook/deep_trace.cc), built from the real cupti_activity.h so that the
// records in the buffers have the real layouts (CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
// CUpti_ActivityMemset4). The simulated driver reports every kernel (GEMMs, NCCL collectives and
// kernels no Flare wrapper times included), memcpy and memset issued while its kind is enabled
// (flareSimSetActivity); this library turns them into records in the client's buffers.
//
// Behaviour, as the real library documents it:
//   - cuptiSubscribe: one subscriber per process; a second one gets
//     CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED.
//   - Buffers come from the client's request callback; a declined request (null) drops the
//     records that needed it, counted by cuptiActivityGetNumDroppedRecords. A full buffer goes
//     back through the completion callback at once; cuptiActivityFlushAll returns the partly
//     filled one (records are written when the op completes, so a buffer never holds an
//     incomplete record).
//   - Timestamps: CLOCK_REALTIME ns by default; the timebase of the callback registered with
//     cuptiActivityRegisterTimestampCallback once there is one.
// Test switch: FLARE_SIM_CUPTI_BUSY=subscribe makes cuptiSubscribe fail as if torch.profiler or
// Nsight held CUPTI; FLARE_SIM_CUPTI_BUSY=enable makes cuptiActivityEnable fail
// (CUPTI_ERROR_NOT_COMPATIBLE). FLARE_SIM_CUPTI_LOADED=FILE appends "pid\n" to FILE when the
// library is loaded (the tests' proof that an untouched process never loads it).
//
// Threads: records arrive on the simulated streams' worker threads; one mutex guards the
// buffers. Callbacks are called without it held.
#include <cupti.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "src/sim/flare_sim.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace {

struct Buffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  size_t valid = 0;
  size_t records = 0;
  size_t max_records = 0;
};

struct State {
  std::mutex mu;
  bool subscribed = false;                               // guarded by mu
  CUpti_BuffersCallbackRequestFunc request = nullptr;    // guarded by mu
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;  // guarded by mu
  CUpti_TimestampCallbackFunc timestamp = nullptr;       // guarded by mu
  std::optional<int64_t> offset;  // guarded by mu: client time − CLOCK_MONOTONIC, see clientOffset
  uint32_t mask = 0;              // guarded by mu: enabled sim kinds
  Buffer current;                 // guarded by mu
  std::vector<Buffer> full;       // guarded by mu: to deliver
  uint64_t dropped = 0;           // guarded by mu: since last query
};

State& state() {
  static State* s = new State();  // never destroyed: stream workers may report during exit
  return *s;
}

int64_t clockNs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The offset from simulated (CLOCK_MONOTONIC) time to the client's timebase, sampled once per
// timebase (the tightest of a few brackets) and kept: every record is converted with the same
// offset, so durations and stream order survive the conversion (per-record samples moved
// records by the sampling noise, up to microseconds when preempted). Mutex held.
int64_t clientOffset(State& s) {
  if (s.offset) return *s.offset;
  int64_t best_width = INT64_MAX, best = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t before = clockNs(CLOCK_MONOTONIC);
    const int64_t client =
        s.timestamp ? static_cast<int64_t>(s.timestamp()) : clockNs(CLOCK_REALTIME);
    const int64_t after = clockNs(CLOCK_MONOTONIC);
    if (after - before < best_width) {
      best_width = after - before;
      best = client - (before + (after - before) / 2);
    }
  }
  s.offset = best;
  return best;
}

size_t recordSize(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return sizeof(CUpti_ActivityMemset4);
    default:
      return 0;
  }
}

// Mutex held. A buffer with room for `bytes`, asking the client for one when needed; false when
// the client declines (the record is dropped). Full buffers are queued in `full`.
bool room(State& s, size_t bytes) {
  Buffer& b = s.current;
  if (b.data != nullptr && b.valid + bytes <= b.size &&
      (b.max_records == 0 || b.records < b.max_records)) {
    return true;
  }
  if (b.data != nullptr) {
    s.full.push_back(b);
    b = Buffer{};
  }
  if (s.request == nullptr) return false;
  uint8_t* data = nullptr;
  size_t size = 0, max_records = 0;
  s.request(&data, &size, &max_records);
  if (data == nullptr || size < bytes || reinterpret_cast<uintptr_t>(data) % 8 != 0) return false;
  b.data = data;
  b.size = size;
  b.max_records = max_records;
  return true;
}

void deliver(std::vector<Buffer>& buffers, CUpti_BuffersCallbackCompleteFunc complete) {
  for (const Buffer& b : buffers) {
    if (complete) complete(nullptr, 0, b.data, b.size, b.valid);
  }
  buffers.clear();
}

void onActivity(const FlareSimActivity* a) {
  State& s = state();
  std::vector<Buffer> to_deliver;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const CUpti_ActivityKind kind =
        a->kind == FLARE_SIM_ACTIVITY_KERNEL   ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
        : a->kind == FLARE_SIM_ACTIVITY_MEMCPY ? CUPTI_ACTIVITY_KIND_MEMCPY
                                               : CUPTI_ACTIVITY_KIND_MEMSET;
    const size_t bytes = recordSize(kind);
    if (!room(s, bytes)) {
      s.dropped++;
    } else {
      uint8_t* at = s.current.data + s.current.valid;
      std::memset(at, 0, bytes);
      const int64_t offset = clientOffset(s);
      const auto start = static_cast<uint64_t>(a->start_ns + offset);
      const auto end = static_cast<uint64_t>(a->end_ns + offset);
      if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
        auto* r = reinterpret_cast<CUpti_ActivityKernel10*>(at);
        r->kind = kind;
        r->start = start;
        r->end = end;
        r->completed = end;
        r->deviceId = static_cast<uint32_t>(a->device);
        r->streamId = a->stream_id;
        r->correlationId = a->correlation_id;
        r->name = a->name;  // valid for the process lifetime, as CUPTI's are
        r->gridX = r->gridY = r->gridZ = 1;
        r->blockX = r->blockY = r->blockZ = 1;
      } else if (kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        auto* r = reinterpret_cast<CUpti_ActivityMemcpy6*>(at);
        r->kind = kind;
        r->copyKind = static_cast<uint8_t>(a->copy_kind);
        r->bytes = a->bytes;
        r->start = start;
        r->end = end;
        r->deviceId = static_cast<uint32_t>(a->device);
        r->streamId = a->stream_id;
        r->correlationId = a->correlation_id;
      } else {
        auto* r = reinterpret_cast<CUpti_ActivityMemset4*>(at);
        r->kind = kind;
        r->bytes = a->bytes;
        r->start = start;
        r->end = end;
        r->deviceId = static_cast<uint32_t>(a->device);
        r->streamId = a->stream_id;
        r->correlationId = a->correlation_id;
      }
      s.current.valid += bytes;
      s.current.records++;
    }
    to_deliver.swap(s.full);
    complete = s.complete;
  }
  deliver(to_deliver, complete);
}

uint32_t simKinds(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return 1u << FLARE_SIM_ACTIVITY_KERNEL;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return 1u << FLARE_SIM_ACTIVITY_MEMCPY;
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return 1u << FLARE_SIM_ACTIVITY_MEMSET;
    default:
      return 0;
  }
}

// FLARE_SIM_CUPTI_BUSY=RANKS:subscribe|enable (a bare value: every rank): this rank's mode.
std::string busyMode() {
  char buf[32];
  return flareSimRankEntry("FLARE_SIM_CUPTI_BUSY", 1, 1, 1, buf, sizeof(buf)) == 1 ? buf : "";
}

struct LoadMarker {
  LoadMarker() {
    const char* path = std::getenv("FLARE_SIM_CUPTI_LOADED");
    if (path == nullptr || *path == '\0') return;
    if (FILE* f = std::fopen(path, "a")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
  }
};
LoadMarker g_load_marker;

}  // namespace

SIM_API CUptiResult cuptiGetResultString(CUptiResult result, const char** str) {
  if (str == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
    case CUPTI_SUCCESS:
      *str = "CUPTI_SUCCESS";
      break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
      break;
    case CUPTI_ERROR_NOT_COMPATIBLE:
      *str = "CUPTI_ERROR_NOT_COMPATIBLE";
      break;
    case CUPTI_ERROR_INVALID_KIND:
      *str = "CUPTI_ERROR_INVALID_KIND";
      break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED:
      *str = "CUPTI_ERROR_MAX_LIMIT_REACHED";
      break;
    default:
      *str = "CUPTI_ERROR_UNKNOWN";
  }
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc /*cb*/,
                                   void* /*userdata*/) {
  if (subscriber == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.subscribed || busyMode() == "subscribe")
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  s.subscribed = true;
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&s);
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
  State& s = state();
  if (subscriber != reinterpret_cast<CUpti_SubscriberHandle>(&s)) {
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.subscribed = false;
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                   CUpti_BuffersCallbackCompleteFunc complete) {
  if (request == nullptr || complete == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.request = request;
  s.complete = complete;
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc fn) {
  if (fn == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timestamp = fn;
  s.offset.reset();  // a new timebase
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiGetTimestamp(uint64_t* timestamp) {
  if (timestamp == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  *timestamp = s.timestamp ? s.timestamp() : static_cast<uint64_t>(clockNs(CLOCK_REALTIME));
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  const uint32_t bits = simKinds(kind);
  if (bits == 0) return CUPTI_ERROR_INVALID_KIND;
  if (busyMode() == "enable") return CUPTI_ERROR_NOT_COMPATIBLE;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.mask |= bits;
  flareSimSetActivity(onActivity, s.mask);
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  const uint32_t bits = simKinds(kind);
  if (bits == 0) return CUPTI_ERROR_INVALID_KIND;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // KERNEL and CONCURRENT_KERNEL share the sim's kernel bit: disabling either stops both.
  s.mask &= ~bits;
  flareSimSetActivity(onActivity, s.mask);
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityFlushAll(uint32_t /*flag*/) {
  State& s = state();
  std::vector<Buffer> to_deliver;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.complete == nullptr) return CUPTI_ERROR_INVALID_OPERATION;
    to_deliver.swap(s.full);
    if (s.current.data != nullptr && s.current.records > 0) {
      to_deliver.push_back(s.current);
      s.current = Buffer{};
    }
    complete = s.complete;
  }
  deliver(to_deliver, complete);
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid,
                                               CUpti_Activity** record) {
  if (buffer == nullptr || record == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  uint8_t* at = buffer;
  if (*record != nullptr) {
    auto* cur = reinterpret_cast<uint8_t*>(*record);
    const size_t size = recordSize((*record)->kind);
    if (size == 0) return CUPTI_ERROR_INVALID_KIND;
    at = cur + size;
  }
  if (at + sizeof(CUpti_Activity) > buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  auto* next = reinterpret_cast<CUpti_Activity*>(at);
  const size_t size = recordSize(next->kind);
  if (size == 0 || at + size > buffer + valid) return CUPTI_ERROR_INVALID_KIND;
  *record = next;
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext /*ctx*/, uint32_t /*stream*/,
                                                      size_t* dropped) {
  if (dropped == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  *dropped = s.dropped;
  s.dropped = 0;
  return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiFinalize(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.mask = 0;
  flareSimSetActivity(onActivity, 0);
  s.request = nullptr;
  s.complete = nullptr;
  return CUPTI_SUCCESS;
}
