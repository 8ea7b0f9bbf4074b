// The simulated GPU (see sim_core.h for the model).
#include "src/sim/sim_core.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/common/config.h"
#include "src/common/rank_list.h"

namespace flare::sim {
namespace {

std::atomic<bool> g_shutdown{false};
std::atomic<int64_t> g_step{0};

int rankFromEnv() {
  for (const char* var : {"RANK", "SLURM_PROCID"}) {
    if (auto v = common::getEnv(var)) {
      if (auto r = common::parseInt(*v); r && *r >= 0 && *r < (1 << 24))
        return static_cast<int>(*r);
    }
  }
  return 0;
}

// RANK:FACTOR[:FROM_STEP] (FROM_STEP only where `from_step` is given: the fault starts at that
// step, a fail-slow in the middle of a run).
double factorFor(const char* var, int rank, int64_t* from_step = nullptr) {
  auto raw = common::getEnv(var);
  if (!raw) return 1.0;
  auto list = common::parsePerRankList(var, *raw, 1, from_step ? 2 : 1);
  const auto* e = common::entryForRank(list, rank);
  if (!e) return 1.0;
  if (from_step && e->fields.size() > 1) {
    auto step = common::parseInt(e->fields[1]);
    if (!step || *step < 0) {
      common::configWarning(std::string("flare: ") + var + " entry step '" + e->fields[1] +
                            "' is not a non-negative integer; the fault starts at step 0");
    } else {
      *from_step = *step;
    }
  }
  auto f = common::parseDouble(e->fields[0]);
  if (!f || !(*f > 0.0) || *f > 100.0) {
    common::configWarning(std::string("flare: ") + var + " entry factor '" + e->fields[0] +
                          "' is not a number in (0, 100]; using 1.0");
    return 1.0;
  }
  return *f;
}

// This rank's entry of the per-rank list in `var` (src/common/rank_list.h): its fields, or
// nullopt when no entry names the rank. With `bare_is_every_rank`, a value without ':' is one
// field for every rank (the older form of the variables that took a single value).
std::optional<std::vector<std::string>> rankFields(const char* var, int rank, size_t min_fields,
                                                   size_t max_fields, bool bare_is_every_rank) {
  auto raw = common::getEnv(var);
  if (!raw || raw->empty()) return std::nullopt;
  std::string value = *raw;
  if (bare_is_every_rank && value.find(':') == std::string::npos) value = "*:" + value;
  const auto list = common::parsePerRankList(var, value, min_fields, max_fields);
  const common::RankEntry* e = common::entryForRank(list, rank);
  if (!e) return std::nullopt;
  return e->fields;
}

// RANKS:MS entries (or a bare MS for every rank): this rank's milliseconds, 0 when none.
double rankMs(const char* var, int rank) {
  auto f = rankFields(var, rank, 1, 1, true);
  if (!f) return 0;
  auto ms = common::parseDouble((*f)[0]);
  if (!ms || *ms < 0 || *ms > 60000) {
    common::configWarning(std::string("flare: ") + var + " value '" + (*f)[0] +
                          "' is not a number of milliseconds in [0, 60000]; using 0");
    return 0;
  }
  return *ms;
}

Settings loadSettings() {
  Settings s;
  s.rank = rankFromEnv();
  s.devices = static_cast<int>(common::paramInt("FLARE_SIM_DEVICES", 1, 1024));
  s.device_name = common::paramString("FLARE_SIM_DEVICE_NAME");
  s.peak_tflops = common::paramDouble("FLARE_SIM_PEAK_TFLOPS", 0.001, 1e6);
  s.mem_bw_gbps = common::paramDouble("FLARE_SIM_MEM_BW_GBPS", 0.001, 1e6);
  s.busbw_gbps = common::paramDouble("FLARE_SIM_BUSBW_GBPS", 0.001, 1e6);
  s.launch_latency_us = common::paramDouble("FLARE_SIM_LAUNCH_LATENCY_US", 0, 1e6);
  s.command_gap_us = common::paramDouble("FLARE_SIM_COMMAND_GAP_US", 0, 1e6);
  s.time_scale = common::paramDouble("FLARE_SIM_TIME_SCALE", 1e-6, 1e6);
  s.first_launch_ms = rankMs("FLARE_SIM_FIRST_LAUNCH_MS", s.rank);
  s.cold_gemm_ms = rankMs("FLARE_SIM_COLD_GEMM_MS", s.rank);
  // The noise's defaults are declared once, in src/common/config.cc (calibrated on real traces:
  // docs/testing.md, "The simulator's noise").
  s.noise.enabled = common::paramBool("FLARE_SIM_NOISE");
  s.noise.seed = static_cast<uint64_t>(
      common::paramInt("FLARE_SIM_SEED", 0, std::numeric_limits<int64_t>::max()));
  s.noise.kernel_cv = common::paramDouble("FLARE_SIM_KERNEL_JITTER", 0, 1);
  s.noise.step_cv = common::paramDouble("FLARE_SIM_STEP_JITTER", 0, 1);
  s.noise.rank_cv = common::paramDouble("FLARE_SIM_RANK_JITTER", 0, 1);
  s.noise.host_cv = common::paramDouble("FLARE_SIM_HOST_JITTER", 0, 1);
  s.noise.hiccup_rate = common::paramDouble("FLARE_SIM_HICCUP_RATE", 0, 1);
  s.noise.hiccup_us = common::paramDouble("FLARE_SIM_HICCUP_US", 0, 1e6);
  s.noise.link_cv = common::paramDouble("FLARE_SIM_LINK_JITTER", 0, 1);
  s.noise.collective_cv = common::paramDouble("FLARE_SIM_COLLECTIVE_JITTER", 0, 1);
  s.kernel_log = common::paramString("FLARE_SIM_KERNEL_LOG");
  s.clock_factor = factorFor("FLARE_SIM_CLOCK_FACTOR", s.rank, &s.clock_from_step);
  s.link_factor = factorFor("FLARE_SIM_LINK_FACTOR", s.rank);
  if (auto raw = common::getEnv("FLARE_SIM_HANG")) {
    auto list = common::parsePerRankList("FLARE_SIM_HANG", *raw, 2, 3);
    for (const auto& e : list) {
      if (!e.ranks.contains(s.rank)) continue;
      auto step = common::parseInt(e.fields[1]);
      if (!step || *step < 0) {
        common::configWarning("flare: FLARE_SIM_HANG entry step '" + e.fields[1] +
                              "' is not a non-negative integer; entry ignored");
        continue;
      }
      if (e.fields[0] == "collective") {
        s.hang_collective_step = *step;
        if (e.fields.size() == 3) {  // only a collective on a communicator of this size
          auto n = common::parseInt(e.fields[2]);
          if (!n || *n < 2) {
            common::configWarning("flare: FLARE_SIM_HANG communicator size '" + e.fields[2] +
                                  "' is not an integer >= 2; any communicator hangs");
          } else {
            s.hang_collective_nranks = static_cast<int>(*n);
          }
        }
      } else if (e.fields[0] == "compute") {
        s.hang_compute_step = *step;
      } else if (e.fields[0] == "skip") {
        s.hang_skip_step = *step;
      } else {
        common::configWarning("flare: FLARE_SIM_HANG kind '" + e.fields[0] +
                              "' is not collective|compute|skip; entry ignored");
      }
    }
  }
  return s;
}

// ---- devices, streams ----

struct DeviceState {
  std::mutex mu;
  std::set<CUstream_st*> streams;    // guarded by mu: live streams of every device
  std::vector<CUstream_st*> legacy;  // guarded by mu: per-device legacy stream (lazy)
  std::atomic<uint64_t> next_stream_id{1};
};

DeviceState& devState() {
  static DeviceState* d = new DeviceState();  // never destroyed: worker threads outlive exit
  return *d;
}

thread_local int t_device = 0;
thread_local CUstream_st* t_per_thread_stream = nullptr;
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
// Captures under way that were not begun in relaxed mode: checkUnsafeCall's fast path.
std::atomic<int> g_strict_captures{0};

void completeOp(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mu);
  s->completed++;
  s->done_cv.notify_all();
}

// Activity reporting (flareSimSetActivity) and the per-step op counts.
std::atomic<FlareSimActivityFn> g_activity_fn{nullptr};
std::atomic<uint32_t> g_activity_mask{0};
std::atomic<uint32_t> g_correlation{0};
struct OpCounts {
  std::mutex mu;
  std::map<int64_t, std::array<uint64_t, 4>> by_step;  // guarded by mu
};
OpCounts& opCounts() {
  static OpCounts* c = new OpCounts();  // never destroyed: workers may count during exit
  return *c;
}

void runOp(CUstream_st* s, Op& op) {
  const Settings& cfg = settings();
  // A command queued behind another starts command_gap after it ends (kernels, copies, events).
  const Ns gap = static_cast<Ns>(cfg.command_gap_us * 1000 * cfg.time_scale);
  const Ns ready = s->last_end > 0 ? s->last_end + gap : 0;
  Ns start = std::max(s->last_end, op.issue_ns);
  const Ns last_end_before = s->last_end;
  switch (op.kind) {
    case Op::Kind::kKernel: {
      start = std::max(
          ready, op.issue_ns + static_cast<Ns>(cfg.launch_latency_us * 1000 * cfg.time_scale));
      if (op.hang) {
        // Injected fault: this kernel never finishes. Leave only when the process exits.
        while (!shuttingDown()) flareSimSleepUntil(nowNs() + 100'000'000);
        return;
      }
      Ns end = start + op.duration_ns;
      flareSimSleepUntil(end);
      s->last_end = end;
      break;
    }
    case Op::Kind::kCopy: {
      start = std::max(ready, op.issue_ns);
      if (op.host) op.host();
      Ns end = start + op.duration_ns;
      flareSimSleepUntil(end);
      s->last_end = end;
      break;
    }
    case Op::Kind::kRecord: {
      start = std::max(ready, op.issue_ns);
      std::lock_guard<std::mutex> lock(op.event->mu);
      if (op.event_seq > op.event->completed) {
        op.event->completed = op.event_seq;
        op.event->timestamp = start;
      }
      op.event->cv.notify_all();
      s->last_end = start;
      break;
    }
    case Op::Kind::kWait: {
      std::unique_lock<std::mutex> lock(op.event->mu);
      while (op.event->completed < op.event_seq && !shuttingDown()) {
        op.event->cv.wait_for(lock, std::chrono::milliseconds(100));
      }
      s->last_end = std::max(start, op.event->timestamp);
      break;
    }
    case Op::Kind::kCustom: {
      Ns end = op.custom(op.ctx.get(), start);
      flareSimSleepUntil(end);
      s->last_end = std::max(start, end);
      break;
    }
    case Op::Kind::kHostFn: {
      flareSimSleepUntil(start);
      if (op.host) op.host();
      s->last_end = std::max(start, nowNs());
      break;
    }
  }
  if (op.report) {
    // The op ran from its start to the stream's new end (kernels start after the launch latency).
    const Ns begin = op.kind == Op::Kind::kKernel ? s->last_end - op.duration_ns
                                                  : std::max(last_end_before, op.issue_ns);
    reportActivity(op, s, begin, s->last_end);
  }
}

void workerLoop(CUstream_st* s) {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->work_cv.wait(lock, [s] { return !s->queue.empty() || s->destroyed; });
      if (s->queue.empty()) break;  // destroyed and drained
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    runOp(s, op);
    if (shuttingDown() && op.kind == Op::Kind::kKernel && op.hang) return;
    completeOp(s);
  }
  {
    std::lock_guard<std::mutex> lock(devState().mu);
    devState().streams.erase(s);
  }
  delete s;
}

CUstream_st* newStream(int device, unsigned flags, int priority) {
  auto* s = new CUstream_st();
  s->device = device;
  s->flags = flags;
  s->priority = priority;
  s->id = devState().next_stream_id.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(devState().mu);
    devState().streams.insert(s);
  }
  std::thread(workerLoop, s).detach();
  return s;
}

// ---- cost registry ----

struct CostRegistry {
  std::mutex mu;
  std::unordered_map<std::string, std::pair<int, int>> by_name;  // guarded by mu
};
CostRegistry& costs() {
  static CostRegistry* r = new CostRegistry();
  return *r;
}

Ns scaled(double seconds) {
  return static_cast<Ns>(seconds * 1e9 * settings().time_scale);
}

}  // namespace

const Settings& settings() {
  static const Settings* s = new Settings(loadSettings());
  return *s;
}

const Noise& noise() {
  static const Noise* n = new Noise(settings().noise, settings().rank);
  return *n;
}

namespace {
// FLARE_SIM_KERNEL_LOG=DIR: every kernel duration the model gave, written at exit (the truth of
// the noise tests). Never destroyed: workers may launch during exit.
struct KernelLog {
  struct Row {
    int64_t step;
    const char* name;  // a Function's name: valid for the process lifetime
    uint64_t n;
    Ns duration;
  };
  std::mutex mu;
  std::vector<Row> rows;  // guarded by mu
};
KernelLog& kernelLog() {
  static KernelLog* l = new KernelLog();
  return *l;
}
}  // namespace

Ns nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<Ns>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool shuttingDown() {
  return g_shutdown.load(std::memory_order_relaxed);
}

int currentDevice() {
  return t_device;
}
void setCurrentDevice(int device) {
  t_device = device;
}

CUstream_st* resolveStream(CUstream stream) {
  if (stream == CU_STREAM_PER_THREAD) {
    if (!t_per_thread_stream) t_per_thread_stream = newStream(t_device, 0, 0);
    return t_per_thread_stream;
  }
  if (stream == nullptr || stream == CU_STREAM_LEGACY) {
    auto& d = devState();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.legacy.size() <= static_cast<size_t>(t_device)) d.legacy.resize(t_device + 1, nullptr);
    if (!d.legacy[t_device]) {
      auto* s = new CUstream_st();
      s->device = t_device;
      s->id = 0;
      d.streams.insert(s);
      std::thread(workerLoop, s).detach();
      d.legacy[t_device] = s;
    }
    return d.legacy[t_device];
  }
  return stream;
}

CUstream_st* createStream(unsigned flags, int priority) {
  return newStream(t_device, flags, priority);
}

void destroyStream(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mu);
  s->destroyed = true;
  s->work_cv.notify_all();
}

void noteIssued(Op& op, int /*device*/) {
  if (op.activity == FLARE_SIM_ACTIVITY_NONE) return;
  op.step = g_step.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(opCounts().mu);
    opCounts().by_step[op.step][static_cast<size_t>(op.activity)]++;
  }
  const uint32_t mask = g_activity_mask.load(std::memory_order_acquire);
  op.report = (mask & (1u << op.activity)) != 0;
  op.correlation_id = g_correlation.fetch_add(1, std::memory_order_relaxed) + 1;
}

void reportActivity(const Op& op, const CUstream_st* s, Ns start, Ns end) {
  FlareSimActivityFn fn = g_activity_fn.load(std::memory_order_acquire);
  if (!fn) return;
  FlareSimActivity a{};
  a.kind = op.activity;
  a.name = op.name;
  a.start_ns = start;
  a.end_ns = end;
  a.stream_id = static_cast<uint32_t>(s->id);
  a.device = s->device;
  a.correlation_id = op.correlation_id;
  a.bytes = op.bytes;
  a.copy_kind = op.copy_kind;
  a.step = op.step;
  fn(&a);
}

CUresult enqueue(CUstream_st* s, Op op) {
  if (op.issue_ns == 0) op.issue_ns = nowNs();
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capturing) {
    if (s->capture_invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    s->captured.push_back(std::move(op));
    return CUDA_SUCCESS;
  }
  noteIssued(op, s->device);
  if (op.kind == Op::Kind::kRecord) {
    std::lock_guard<std::mutex> elock(op.event->mu);
    op.event_seq = ++op.event->recorded;
  } else if (op.kind == Op::Kind::kWait) {
    std::lock_guard<std::mutex> elock(op.event->mu);
    op.event_seq = op.event->recorded;
  }
  s->queue.push_back(std::move(op));
  s->enqueued++;
  s->work_cv.notify_one();
  return CUDA_SUCCESS;
}

CUresult checkUnsafeCall() {
  if (g_strict_captures.load(std::memory_order_acquire) == 0 ||
      t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_SUCCESS;
  }
  const auto me = std::this_thread::get_id();
  bool prohibited = false;
  auto& d = devState();
  std::lock_guard<std::mutex> lock(d.mu);
  for (auto* s : d.streams) {
    std::lock_guard<std::mutex> slock(s->mu);
    if (!s->capturing || s->capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
    if (s->capture_thread == me || (t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                    s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      s->capture_invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult exchangeCaptureMode(CUstreamCaptureMode* mode) {
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

CUresult synchronizeStream(CUstream_st* s) {
  if (CUresult r = checkUnsafeCall(); r != CUDA_SUCCESS) return r;
  std::unique_lock<std::mutex> lock(s->mu);
  if (s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  const uint64_t target = s->enqueued;
  while (s->completed < target) {
    if (shuttingDown()) return CUDA_ERROR_DEINITIALIZED;
    s->done_cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return CUDA_SUCCESS;
}

bool streamIdle(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mu);
  return s->completed == s->enqueued;
}

CUresult synchronizeDevice() {
  if (CUresult r = checkUnsafeCall(); r != CUDA_SUCCESS) return r;
  std::vector<CUstream_st*> streams;
  {
    auto& d = devState();
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto* s : d.streams) {
      if (s->device == t_device) streams.push_back(s);
    }
  }
  // A stream may be destroyed (and freed by its worker) while we wait on another; only
  // wait on streams still registered.
  for (auto* s : streams) {
    {
      std::lock_guard<std::mutex> lock(devState().mu);
      if (!devState().streams.count(s)) continue;
    }
    CUresult r = synchronizeStream(s);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

CUresult recordEvent(CUevent_st* e, CUstream_st* s) {
  Op op;
  op.kind = Op::Kind::kRecord;
  op.name = "event_record";
  op.event = e->state;
  return enqueue(s, std::move(op));
}

CUresult waitEvent(CUstream_st* s, CUevent_st* e) {
  Op op;
  op.kind = Op::Kind::kWait;
  op.name = "event_wait";
  op.event = e->state;
  return enqueue(s, std::move(op));
}

CUresult queryEvent(CUevent_st* e) {
  if (CUresult r = checkUnsafeCall(); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(e->state->mu);
  return e->state->completed >= e->state->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult synchronizeEvent(CUevent_st* e) {
  if (CUresult r = checkUnsafeCall(); r != CUDA_SUCCESS) return r;
  std::unique_lock<std::mutex> lock(e->state->mu);
  const uint64_t target = e->state->recorded;
  while (e->state->completed < target) {
    if (shuttingDown()) return CUDA_ERROR_DEINITIALIZED;
    e->state->cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return CUDA_SUCCESS;
}

CUresult elapsedMs(float* ms, CUevent_st* start, CUevent_st* end) {
  if (!ms || !start || !end) return CUDA_ERROR_INVALID_VALUE;
  if (!start->state->timing || !end->state->timing) return CUDA_ERROR_INVALID_HANDLE;
  Ns t0, t1;
  {
    std::lock_guard<std::mutex> lock(start->state->mu);
    if (start->state->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (start->state->completed < start->state->recorded) return CUDA_ERROR_NOT_READY;
    t0 = start->state->timestamp;
  }
  {
    std::lock_guard<std::mutex> lock(end->state->mu);
    if (end->state->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (end->state->completed < end->state->recorded) return CUDA_ERROR_NOT_READY;
    t1 = end->state->timestamp;
  }
  *ms = static_cast<float>(static_cast<double>(t1 - t0) / 1e6);
  return CUDA_SUCCESS;
}

void registerKernelCost(const std::string& name, int kind, int arg_index) {
  std::lock_guard<std::mutex> lock(costs().mu);
  costs().by_name[name] = {kind, arg_index};
}

Ns kernelDuration(CUfunc_st* f, uint64_t threads, void** params) {
  const Settings& cfg = settings();
  int kind = f->cost_kind.load(std::memory_order_acquire);
  if (kind < 0) {
    std::lock_guard<std::mutex> lock(costs().mu);
    auto it = costs().by_name.find(f->name);
    int k = FLARE_SIM_COST_DEFAULT, a = 0;
    if (it != costs().by_name.end()) std::tie(k, a) = it->second;
    f->cost_arg.store(a);
    f->cost_kind.store(k, std::memory_order_release);
    kind = k;
  }
  const int arg = f->cost_arg.load();
  uint64_t amount = 0;
  if (kind != FLARE_SIM_COST_DEFAULT) {
    if (!params || !params[arg]) {
      kind = FLARE_SIM_COST_DEFAULT;
    } else {
      std::memcpy(&amount, params[arg], sizeof(amount));
    }
  }
  double seconds;
  switch (kind) {
    case FLARE_SIM_COST_FLOPS:
      seconds = static_cast<double>(amount) / (cfg.peak_tflops * 1e12);
      break;
    case FLARE_SIM_COST_BYTES:
      seconds = static_cast<double>(amount) / (cfg.mem_bw_gbps * 1e9);
      break;
    case FLARE_SIM_COST_NANOS:
      seconds = static_cast<double>(amount) / 1e9;
      break;
    default:
      seconds = 2e-6 + static_cast<double>(threads) * 8.0 / (cfg.mem_bw_gbps * 1e9);
      break;
  }
  // An underclocked GPU (FLARE_SIM_CLOCK_FACTOR) runs every kernel slower, from its onset step.
  const bool slow = g_step.load(std::memory_order_relaxed) >= cfg.clock_from_step;
  return scaled(seconds / (slow ? cfg.clock_factor : 1.0));
}

CUresult launchKernel(CUfunc_st* f, uint64_t threads, CUstream stream, void** params) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const Settings& cfg = settings();
  // Lazy module loading: the first launch of a function loads its module on the launching
  // thread before anything is queued, so the GPU idles meanwhile (a tool's start event recorded
  // before the call is stamped before the wait).
  if (cfg.first_launch_ms > 0 && !f->launched.exchange(true, std::memory_order_relaxed))
    flareSimSleepUntil(nowNs() + static_cast<Ns>(cfg.first_launch_ms * 1e6));
  // Host noise: now and then the launching thread pauses (a page fault, the allocator, the GIL).
  static std::atomic<uint64_t> launches{0};
  if (const Ns pause = noise().hiccupNs(launches.fetch_add(1, std::memory_order_relaxed)))
    flareSimSleepUntil(nowNs() + pause);
  Op op;
  op.kind = Op::Kind::kKernel;
  op.activity = FLARE_SIM_ACTIVITY_KERNEL;
  op.name = f->name.c_str();
  op.issue_ns = nowNs();
  // GPU noise: this launch's draw (rank, step, function, n-th launch of it).
  const int64_t step = flareSimStep();
  const uint64_t n = f->launches.fetch_add(1, std::memory_order_relaxed);
  op.duration_ns = static_cast<Ns>(static_cast<double>(kernelDuration(f, threads, params)) *
                                   noise().kernelFactor(f->name, n, step));
  if (!cfg.kernel_log.empty()) {
    std::lock_guard<std::mutex> lock(kernelLog().mu);
    kernelLog().rows.push_back({step, op.name, n, op.duration_ns});
  }
  if (cfg.hang_compute_step >= 0 && flareSimStep() >= cfg.hang_compute_step) {
    static std::atomic<bool> fired{false};
    if (!fired.exchange(true)) op.hang = true;
  }
  return enqueue(resolveStream(stream), std::move(op));
}

CUresult beginCapture(CUstream_st* s, CUstreamCaptureMode mode) {
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  if (s->id == 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // legacy stream
  s->capturing = true;
  s->capture_mode = mode;
  s->capture_thread = std::this_thread::get_id();
  s->capture_invalidated = false;
  s->captured.clear();
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) g_strict_captures.fetch_add(1);
  return CUDA_SUCCESS;
}

CUresult endCapture(CUstream_st* s, CUgraph_st** graph) {
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = false;
  if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED) g_strict_captures.fetch_sub(1);
  if (s->capture_invalidated) {
    s->capture_invalidated = false;
    s->captured.clear();
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  auto* g = new CUgraph_st();
  g->ops = std::move(s->captured);
  s->captured.clear();
  *graph = g;
  return CUDA_SUCCESS;
}

bool isCapturing(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mu);
  return s->capturing;
}

CUstreamCaptureStatus captureStatus(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->capturing) return CU_STREAM_CAPTURE_STATUS_NONE;
  return s->capture_invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

CUresult launchGraph(CUgraphExec_st* exec, CUstream_st* s) {
  const Ns issue = nowNs();
  for (const Op& captured : exec->ops) {
    Op op = captured;
    op.issue_ns = issue;
    CUresult r = enqueue(s, std::move(op));
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

}  // namespace flare::sim

using flare::sim::nowNs;

namespace {
// FLARE_SIM_OP_COUNTS=DIR: the per-step op counts, written at exit (flare_sim.h).
void writeOpCounts() {
  auto dir = flare::common::getEnv("FLARE_SIM_OP_COUNTS");
  if (!dir || dir->empty()) return;
  std::string json = "{";
  {
    std::lock_guard<std::mutex> lock(flare::sim::opCounts().mu);
    bool first = true;
    for (const auto& [step, c] : flare::sim::opCounts().by_step) {
      json += (first ? "\"" : ", \"") + std::to_string(step) + "\": [0, " + std::to_string(c[1]) +
              ", " + std::to_string(c[2]) + ", " + std::to_string(c[3]) + "]";
      first = false;
    }
  }
  json += "}\n";
  const std::string path = *dir + "/ops-" + std::to_string(flare::sim::settings().rank) + "-" +
                           std::to_string(getpid()) + ".json";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fwrite(json.data(), 1, json.size(), f);
    std::fclose(f);
  }
}

// FLARE_SIM_KERNEL_LOG=DIR: DIR/kernels-RANK-PID.tsv, one line per kernel launch:
// step, name, n (the function's n-th launch), duration in ns.
void writeKernelLog() {
  const std::string& dir = flare::sim::settings().kernel_log;
  if (dir.empty()) return;
  const std::string path = dir + "/kernels-" + std::to_string(flare::sim::settings().rank) + "-" +
                           std::to_string(getpid()) + ".tsv";
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  std::lock_guard<std::mutex> lock(flare::sim::kernelLog().mu);
  for (const auto& r : flare::sim::kernelLog().rows) {
    std::fprintf(f, "%lld\t%s\t%llu\t%lld\n", static_cast<long long>(r.step), r.name,
                 static_cast<unsigned long long>(r.n), static_cast<long long>(r.duration));
  }
  std::fclose(f);
}

// Blocking operations (hung kernels, collectives) must let the process exit.
struct ShutdownFlag {
  ShutdownFlag() {
    std::atexit([] {
      flare::sim::g_shutdown.store(true);
      writeOpCounts();
      writeKernelLog();
    });
  }
};
ShutdownFlag g_shutdown_flag;
}  // namespace

extern "C" {

__attribute__((visibility("default"))) int flareSimRegisterKernelCost(const char* name, int kind,
                                                                      int arg_index) {
  if (!name || kind < FLARE_SIM_COST_DEFAULT || kind > FLARE_SIM_COST_NANOS || arg_index < 0 ||
      arg_index > 64) {
    return -1;
  }
  flare::sim::registerKernelCost(name, kind, arg_index);
  return 0;
}

__attribute__((visibility("default"))) CUresult flareSimEnqueueOp(CUstream stream, const char* name,
                                                                  FlareSimOpFn fn, void* ctx,
                                                                  void (*free_ctx)(void*)) {
  using flare::sim::Op;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = flare::sim::resolveStream(stream);
  if (flare::sim::isCapturing(s)) {
    if (free_ctx) free_ctx(ctx);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  Op op;
  op.kind = Op::Kind::kCustom;
  op.activity = FLARE_SIM_ACTIVITY_KERNEL;  // NCCL's collectives are kernels to CUPTI
  op.name = name ? name : "custom";
  op.custom = fn;
  op.ctx = std::shared_ptr<void>(ctx, [free_ctx](void* p) {
    if (free_ctx) free_ctx(p);
  });
  return flare::sim::enqueue(s, std::move(op));
}

__attribute__((visibility("default"))) void flareSimSetActivity(FlareSimActivityFn fn,
                                                                uint32_t kinds_mask) {
  flare::sim::g_activity_mask.store(fn ? kinds_mask : 0, std::memory_order_release);
  if (fn) flare::sim::g_activity_fn.store(fn, std::memory_order_release);
}

__attribute__((visibility("default"))) int flareSimOpCounts(int64_t step, uint64_t counts[4]) {
  std::lock_guard<std::mutex> lock(flare::sim::opCounts().mu);
  const auto it = flare::sim::opCounts().by_step.find(step);
  if (it == flare::sim::opCounts().by_step.end()) return -1;
  for (size_t i = 0; i < 4; ++i) counts[i] = it->second[i];
  return 0;
}

__attribute__((visibility("default"))) int64_t flareSimNowNs(void) {
  return nowNs();
}
__attribute__((visibility("default"))) int flareSimRank(void) {
  return flare::sim::settings().rank;
}
__attribute__((visibility("default"))) void flareSimSetStep(int64_t step) {
  flare::sim::g_step.store(step);
}
__attribute__((visibility("default"))) int64_t flareSimStep(void) {
  return flare::sim::g_step.load();
}
namespace {
thread_local int64_t t_next_gemm_ns = 0;
}  // namespace
__attribute__((visibility("default"))) void flareSimSetNextGemmNs(int64_t ns) {
  t_next_gemm_ns = ns > 0 ? ns : 0;
}
__attribute__((visibility("default"))) int64_t flareSimTakeNextGemmNs(void) {
  const int64_t ns = t_next_gemm_ns;
  t_next_gemm_ns = 0;
  return ns;
}
__attribute__((visibility("default"))) double flareSimClockFactor(void) {
  return flare::sim::settings().clock_factor;
}
__attribute__((visibility("default"))) double flareSimLinkFactor(void) {
  return flare::sim::settings().link_factor * flare::sim::noise().linkFactor();
}
__attribute__((visibility("default"))) double flareSimCollectiveFactor(uint64_t comm,
                                                                       uint64_t seq) {
  return flare::sim::noise().collectiveFactor(comm, seq);
}
__attribute__((visibility("default"))) uint64_t flareSimNameKey(const char* name) {
  return flare::sim::nameHash(name ? name : "");
}
__attribute__((visibility("default"))) double flareSimSetting(const char* name) {
  const auto& s = flare::sim::settings();
  if (!name) return 0;
  const std::string_view n(name);
  if (n == "peak_tflops") return s.peak_tflops;
  if (n == "mem_bw_gbps") return s.mem_bw_gbps;
  if (n == "busbw_gbps") return s.busbw_gbps;
  if (n == "time_scale") return s.time_scale;
  if (n == "launch_latency_us") return s.launch_latency_us;
  if (n == "first_launch_ms") return s.first_launch_ms;
  if (n == "cold_gemm_ms") return s.cold_gemm_ms;
  return 0;
}
__attribute__((visibility("default"))) int64_t flareSimHangStep(const char* kind) {
  const auto& s = flare::sim::settings();
  if (!kind) return -1;
  const std::string_view k(kind);
  if (k == "collective") return s.hang_collective_step;
  if (k == "collective_nranks") return s.hang_collective_nranks;
  if (k == "compute") return s.hang_compute_step;
  if (k == "skip") return s.hang_skip_step;
  return -1;
}
__attribute__((visibility("default"))) double flareSimHostFactor(int64_t step, int site) {
  return flare::sim::noise().hostFactor(step, static_cast<uint64_t>(site < 0 ? 0 : site));
}
__attribute__((visibility("default"))) int flareSimRankEntry(const char* var, int min_fields,
                                                             int max_fields, int bare_is_every_rank,
                                                             char* buf, size_t len) {
  if (!var || min_fields < 0 || max_fields < min_fields || (len > 0 && !buf)) return -1;
  auto fields =
      flare::sim::rankFields(var, flare::sim::settings().rank, static_cast<size_t>(min_fields),
                             static_cast<size_t>(max_fields), bare_is_every_rank != 0);
  if (!fields) return -1;
  std::string joined;
  for (size_t i = 0; i < fields->size(); ++i) joined += (i ? ":" : "") + (*fields)[i];
  if (len > 0) {
    const size_t n = std::min(len - 1, joined.size());
    std::memcpy(buf, joined.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(fields->size());
}
__attribute__((visibility("default"))) int flareSimShuttingDown(void) {
  return flare::sim::shuttingDown() ? 1 : 0;
}
__attribute__((visibility("default"))) void flareSimWaitWord(const volatile uint32_t* word,
                                                             uint32_t expected,
                                                             int64_t timeout_ns) {
  if (timeout_ns < 0) timeout_ns = 100'000'000;
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
              static_cast<long>(timeout_ns % 1'000'000'000)};
  syscall(SYS_futex, const_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
__attribute__((visibility("default"))) void flareSimWakeWord(const volatile uint32_t* word) {
  syscall(SYS_futex, const_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}
__attribute__((visibility("default"))) void flareSimSleepUntil(int64_t deadline_ns) {
  // Sleep in slices so that a process exit is noticed; never spin.
  for (;;) {
    if (flare::sim::shuttingDown()) return;
    int64_t now = nowNs();
    if (now >= deadline_ns) return;
    int64_t target = std::min<int64_t>(deadline_ns, now + 100'000'000);
    timespec ts{static_cast<time_t>(target / 1'000'000'000),
                static_cast<long>(target % 1'000'000'000)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
  }
}

}  // extern "C"
