#include "src/hook/runtime.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <library_types.h>
#include <pthread.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "flare/kernels.h"
#include "src/common/clock.h"
#include "src/common/config.h"
#include "src/common/identity.h"
#include "src/common/log.h"
#include "src/common/private_dir.h"
#include "src/hook/cudart_fns.h"
#include "src/hook/deep_trace.h"
#include "src/hook/rank_commands.h"
#include "src/hook/real.h"
#include "src/timing/exporter.h"
#include "src/timing/spool_sink.h"

namespace flare::hook {

thread_local int t_depth = 0;

namespace {

// Driver calls that describe a device (they create no context). Resolved lazily, on the timing
// thread, the first time an op completes.
struct DeviceQueryFns {
  RealFn<CUresult (*)(CUdevice*, int)> get{"cuDeviceGet", "libcuda.so"};
  RealFn<CUresult (*)(char*, int, CUdevice)> name{"cuDeviceGetName", "libcuda.so"};
  RealFn<CUresult (*)(CUuuid*, CUdevice)> uuid{"cuDeviceGetUuid_v2", "libcuda.so"};
  RealFn<CUresult (*)(size_t*, CUdevice)> totalMem{"cuDeviceTotalMem_v2", "libcuda.so"};
  RealFn<CUresult (*)(int*, CUdevice_attribute, CUdevice)> attribute{"cuDeviceGetAttribute",
                                                                     "libcuda.so"};
};
DeviceQueryFns g_device_query;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string uuidText(const CUuuid& u) {
  static const char* hex = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

// DeviceTimer on the real CUDA runtime.
class CudaDeviceTimer final : public timing::DeviceTimer {
 public:
  bool ready() {
    return g_cudart.eventCreateWithFlags.get() && g_cudart.eventDestroy.get() &&
           g_cudart.eventRecord.get() && g_cudart.eventQuery.get() && g_cudart.eventElapsed.get() &&
           g_cudart.isCapturing.get() && g_cudart.getDevice.get();
  }
  bool createEvent(void** event) override {
    cudaEvent_t e = nullptr;
    if (g_cudart.eventCreateWithFlags.get()(&e, cudaEventDefault) != cudaSuccess) return false;
    *event = e;
    return true;
  }
  void destroyEvent(void* event) override {
    g_cudart.eventDestroy.get()(static_cast<cudaEvent_t>(event));
  }
  bool recordEvent(void* event, void* stream) override {
    return g_cudart.eventRecord.get()(static_cast<cudaEvent_t>(event),
                                      static_cast<cudaStream_t>(stream)) == cudaSuccess;
  }
  Status queryEvent(void* event) override {
    cudaError_t e = g_cudart.eventQuery.get()(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return Status::kReady;
    if (e == cudaErrorNotReady) return Status::kNotReady;
    return Status::kError;
  }
  bool elapsedNs(void* from, void* to, int64_t* ns) override {
    float ms = 0;
    if (g_cudart.eventElapsed.get()(&ms, static_cast<cudaEvent_t>(from),
                                    static_cast<cudaEvent_t>(to)) != cudaSuccess) {
      return false;
    }
    *ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    return true;
  }
  bool isCapturing(void* stream) override {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    if (g_cudart.isCapturing.get()(static_cast<cudaStream_t>(stream), &s) != cudaSuccess) {
      // Querying a legacy-stream capture state while another stream captures in global mode
      // is itself an error: treat as capturing, record nothing.
      return true;
    }
    return s != cudaStreamCaptureStatusNone;
  }
  uint64_t streamId(void* stream) override {
    auto v = reinterpret_cast<uintptr_t>(stream);
    return v == reinterpret_cast<uintptr_t>(cudaStreamLegacy) ? 0 : v;
  }
  int currentDevice() override {
    int d = 0;
    g_cudart.getDevice.get()(&d);
    return d;
  }
  // Timing thread, once: the driver's name, UUID and figures of `device`.
  bool describeDevice(int device, timing::DeviceDescription* out) override {
    auto get = g_device_query.get.get();
    auto name = g_device_query.name.get();
    CUdevice dev = 0;
    char text[256] = {};
    if (!get || !name || get(&dev, device) != CUDA_SUCCESS ||
        name(text, sizeof(text) - 1, dev) != CUDA_SUCCESS) {
      return false;
    }
    out->index = device;
    out->name = text;
    CUuuid u{};
    if (auto f = g_device_query.uuid.get(); f && f(&u, dev) == CUDA_SUCCESS)
      out->uuid = uuidText(u);
    size_t bytes = 0;
    if (auto f = g_device_query.totalMem.get(); f && f(&bytes, dev) == CUDA_SUCCESS)
      out->memory_bytes = bytes;
    auto attr = [&](CUdevice_attribute a) {
      int v = 0;
      auto f = g_device_query.attribute.get();
      return f && f(&v, a, dev) == CUDA_SUCCESS && v > 0 ? static_cast<uint32_t>(v) : 0u;
    };
    out->sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    out->clock_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    out->cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    out->cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    char bus[32];
    std::snprintf(bus, sizeof(bus), "%08x:%02x:%02x.0", attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                  attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
    out->pci_bus_id = bus;
    return true;
  }
  // Poller thread only: a private non-blocking stream per device carries the reference.
  bool recordReference(int device, void** event) override {
    auto set = g_cudart.setDevice.get();
    auto create = g_cudart.streamCreateWithFlags.get();
    if (!set || !create || device < 0 || device >= kMaxDevices) return false;
    int previous = currentDevice();
    if (previous != device && set(device) != cudaSuccess) return false;
    bool ok = true;
    if (!ref_streams_[device]) {
      ok = create(&ref_streams_[device], cudaStreamNonBlocking) == cudaSuccess;
    }
    ok = ok && createEvent(event);
    if (ok && !recordEvent(*event, ref_streams_[device])) {
      destroyEvent(*event);
      ok = false;
    }
    if (previous != device) set(previous);
    return ok;
  }

 private:
  static constexpr int kMaxDevices = 64;
  cudaStream_t ref_streams_[kMaxDevices] = {};
};

struct State {
  std::unique_ptr<CudaDeviceTimer> timer;
  std::unique_ptr<timing::Sink> sink;
  timing::GrpcExporter* exporter = nullptr;    // == sink when streaming to flared
  std::unique_ptr<RankCommands> commands;      // daemon commands (rank_commands.h)
  std::unique_ptr<HangWatch> watch;            // rank watchdog (FLARE_HANG_TIMEOUT)
  std::unique_ptr<CollectiveTracker> tracker;  // wraps sink: completed collectives
  std::unique_ptr<timing::Tracer> tracer;
};

std::atomic<timing::GrpcExporter*> g_exporter{nullptr};

// The directory of libflare_hook.so, where libflare_exporter.so is built and installed.
std::string hookDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&hookDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// FLARE_MODE: summary sends compute kernels as per-window KernelSummary messages and each step as
// StepStats (collectives, p2p and sync spans stay raw); raw sends every op. Unset: summary when
// streaming to flared (always-on monitoring), raw for a local spool (offline tracing is for
// timelines, which need every op). Anything else: one warning, the default.
bool summaryMode(bool streaming) {
  const char* fallback = streaming ? "summary" : "raw";
  const std::string mode = common::envString("FLARE_MODE", fallback);
  if (mode == "summary") return true;
  if (mode != "raw") {
    common::logOnce(common::LogLevel::kWarn, "hook", "bad-mode",
                    "flare: FLARE_MODE={} is not raw|summary; using {}", mode, fallback);
    return streaming;
  }
  return false;
}

// FLARE_TIMING: pair (a start and an end event per op) or end (the end event only;
// TracerOptions::end_only). Anything else: one warning, pair.
bool endOnlyTiming() {
  const std::string timing = common::envString("FLARE_TIMING", "pair");
  if (timing == "end") return true;
  if (timing != "pair") {
    common::logOnce(common::LogLevel::kWarn, "hook", "bad-timing",
                    "flare: FLARE_TIMING={} is not pair|end; using pair", timing);
  }
  return false;
}

// Reads a whole (PEM) file; false with the reason in *error.
bool readPemFile(const char* setting, const std::string& path, std::string* out,
                 std::string* error) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  if (in) buf << in.rdbuf();
  if (!in || buf.str().empty()) {
    *error = std::string(setting) + "=" + path + " cannot be read (" +
             (in ? "empty file" : std::strerror(errno)) + ")";
    return false;
  }
  *out = buf.str();
  return true;
}

// The batch bounds (FLARE_BATCH_BYTES, FLARE_BATCH_INTERVAL_MS), for the exporter and the spool.
size_t batchBytes() {
  return static_cast<size_t>(common::envInt("FLARE_BATCH_BYTES", 64 << 10, 1 << 10, 64 << 20));
}
int64_t batchIntervalNs() {
  return common::envInt("FLARE_BATCH_INTERVAL_MS", 1000, 10, 3'600'000) * 1'000'000;
}

// FLARE_DAEMON set: the exporter over libflare_exporter.so (dlopened RTLD_LOCAL, see
// src/timing/transport.h); nullptr (one warning) when it cannot be loaded or its TLS settings
// cannot be used: the spool is used (never plaintext when TLS was asked for).
std::unique_ptr<timing::GrpcExporter> makeExporter(const common::Identity& id,
                                                   const std::string& daemon,
                                                   const std::string& dir,
                                                   timing::CommandHandler* handler) {
  std::string lib = common::envString("FLARE_EXPORTER_LIB", "");
  if (lib.empty()) lib = hookDirectory() + "/libflare_exporter.so";
  std::string error;
  timing::TransportOptions topts;
  const std::string ca_path = common::envString("FLARE_TLS_CA", "");
  const std::string cert_path = common::envString("FLARE_TLS_CERT", "");
  const std::string key_path = common::envString("FLARE_TLS_KEY", "");
  const std::string server_name = common::envString("FLARE_TLS_SERVER_NAME", "");
  std::string ca, cert, key;
  bool tls_ok = true;
  if (!ca_path.empty() || !cert_path.empty() || !key_path.empty() || !server_name.empty()) {
    if (ca_path.empty()) {
      error = "FLARE_TLS_CERT/KEY/SERVER_NAME are set but FLARE_TLS_CA is not";
      tls_ok = false;
    } else if (cert_path.empty() != key_path.empty()) {
      error = "FLARE_TLS_CERT and FLARE_TLS_KEY go together";
      tls_ok = false;
    } else {
      tls_ok = readPemFile("FLARE_TLS_CA", ca_path, &ca, &error) &&
               (cert_path.empty() || (readPemFile("FLARE_TLS_CERT", cert_path, &cert, &error) &&
                                      readPemFile("FLARE_TLS_KEY", key_path, &key, &error)));
    }
    if (!tls_ok) {
      FLARE_LOG_WARN("hook",
                     "flare: TLS to the daemon {} is misconfigured: {}; writing to the spool",
                     daemon, error);
      return nullptr;
    }
    topts.tls = true;
    topts.tls_root_pem = ca.c_str();
    topts.tls_cert_pem = cert.empty() ? nullptr : cert.c_str();
    topts.tls_key_pem = key.empty() ? nullptr : key.c_str();
    topts.tls_server_name = server_name.empty() ? nullptr : server_name.c_str();
  }
  auto transport = timing::loadTransport(lib, daemon, topts, &error);
  if (!transport) {
    FLARE_LOG_WARN("hook", "flare: cannot stream to the daemon {} ({}); writing to the spool",
                   daemon, error);
    return nullptr;
  }
  timing::ExporterOptions o;
  o.identity = id;
  o.mode = summaryMode(true) ? flare::v1::MODE_SUMMARY : flare::v1::MODE_RAW;
  o.token = common::envString("FLARE_TOKEN", "");
  o.flare_version = FLARE_VERSION_STRING;
  o.hang_kill = common::envBool("FLARE_HANG_KILL", false);
  o.sweep_spool = common::envBool("FLARE_SPOOL_SWEEP", true);
  o.spool_dir = dir;
  o.handler = handler;
  o.buffer_bytes = static_cast<size_t>(
      common::envInt("FLARE_EXPORT_BUFFER_BYTES", 8 << 20, 256 << 10, int64_t{1} << 34));
  o.spool_max_bytes = static_cast<uint64_t>(
      common::envInt("FLARE_SPOOL_MAX_BYTES", int64_t{1} << 30, 0, int64_t{1} << 50));
  o.resend_bytes = static_cast<size_t>(
      common::envInt("FLARE_EXPORT_RESEND_BYTES", 16 << 20, 0, int64_t{1} << 30));
  o.batch_bytes = batchBytes();
  return std::make_unique<timing::GrpcExporter>(std::move(transport), std::move(o));
}

std::atomic<timing::Tracer*> g_tracer{nullptr};
std::atomic<bool> g_off{false};
std::once_flag g_init_once;
pid_t g_init_pid = 0;

void turnOff(const char* why) {
  g_off.store(true);
  common::logOnce(common::LogLevel::kWarn, "hook", "hook-off",
                  "flare: tracing turned off: {}; the job continues untraced", why);
}

void atForkChild() {
  // The poller thread does not exist in the child: stop tracing there, quietly.
  g_off.store(true);
  if (timing::Tracer* t = g_tracer.load()) t->disableAfterFork();
  if (timing::GrpcExporter* e = g_exporter.load()) e->disableAfterFork();
}

std::atomic<bool> g_exit_done{false};

void atExit() {
  timing::Tracer* t = g_tracer.load();
  if (!t || getpid() != g_init_pid) return;
  if (g_exit_done.exchange(true)) return;  // once: Python's atexit (finishAtExit) or exit()
  deepTraceAtExit();                       // its last records reach the Tracer before the drain
  // Write out what completed; never hold the exit up for long (a hung stream stays hung).
  if (!t->drain(1'000'000'000, /*final=*/true)) {
    common::logOnce(common::LogLevel::kInfo, "hook", "exit-undrained",
                    "flare: exiting with GPU work still in flight; unfinished ops not recorded");
  }
  if (timing::GrpcExporter* e = g_exporter.load()) {
    // Send what is queued, bounded; the rest goes to the spool.
    const double s = common::envDurationSeconds("FLARE_EXIT_FLUSH_SECONDS", 2.0, 0.0, 60.0);
    e->shutdown(static_cast<int64_t>(s * 1e9));
  }
  g_tracer.store(nullptr);
}

void init() {
  if (common::envBool("FLARE_DISABLE", false)) {
    g_off.store(true);
    return;
  }
  auto* state = new State();  // lives until exit; never destroyed (threads may still run)
  state->timer = std::make_unique<CudaDeviceTimer>();
  if (!state->timer->ready()) {
    turnOff("the CUDA runtime's event functions were not found");
    return;
  }
  const common::Identity id = common::identityFromEnv();
  common::initLogging(id);
  std::string dir = common::envString("FLARE_OUTPUT_DIR", "");
  if (dir.empty()) dir = common::defaultSpoolRoot();  // per user, 0700 (private_dir.h)
  const std::string daemon = common::envString("FLARE_DAEMON", "");
  if (!daemon.empty()) {
    state->commands = std::make_unique<RankCommands>(id.rank, id.world_size);
    auto exporter = makeExporter(id, daemon, dir, state->commands.get());
    state->exporter = exporter.get();
    state->sink = std::move(exporter);
  }
  if (!state->sink) {
    timing::SpoolSinkOptions spool;
    spool.summary = summaryMode(false);
    spool.batch_bytes = batchBytes();
    state->sink =
        std::make_unique<timing::SpoolSink>(dir, id.job_id, id.rank, id.pid, std::move(spool));
  }
  timing::TracerOptions opts;
  opts.flush_interval_ns = batchIntervalNs();
  opts.end_only = endOnlyTiming();
  hang::WatchdogOptions watch_opts;
  if (HangWatch::optionsFromEnv(&watch_opts)) {
    timing::GrpcExporter* exporter = state->exporter;
    state->watch = std::make_unique<HangWatch>(
        std::move(watch_opts),
        [exporter](const flare::v1::HangReport& r) {
          if (exporter != nullptr) exporter->reportHang(r);
        },
        [] { return common::realtimeNs(); });
    opts.head_observer = state->watch.get();
  }
  state->tracker = std::make_unique<CollectiveTracker>(state->sink.get(), state->watch.get());
  state->tracer = std::make_unique<timing::Tracer>(state->timer.get(), &common::systemClock(),
                                                   state->tracker.get(), opts);
  g_init_pid = getpid();
  pthread_atfork(nullptr, nullptr, atForkChild);
  std::atexit(atExit);
  g_exporter.store(state->exporter);
  g_tracer.store(state->tracer.get());
  if (state->exporter != nullptr) {
    FLARE_LOG_INFO("hook", "flare: tracing rank {} of job {} to the daemon {}", id.rank, id.job_id,
                   daemon);
  } else {
    FLARE_LOG_INFO("hook", "flare: tracing rank {} of job {} into {}/{}/{}", id.rank, id.job_id,
                   dir, id.job_id, id.rank);
  }
}

}  // namespace

timing::Tracer* tracer() {
  if (g_off.load(std::memory_order_relaxed)) return nullptr;
  if (timing::Tracer* t = g_tracer.load(std::memory_order_acquire)) return t;
  std::call_once(g_init_once, [] {
    try {
      init();
    } catch (const std::exception& e) {
      turnOff(e.what());
    } catch (...) {
      turnOff("initialization failed");
    }
  });
  return g_off.load() ? nullptr : g_tracer.load(std::memory_order_acquire);
}

void postCommandResult(const flare::v1::CommandResult& result) {
  if (timing::GrpcExporter* e = g_exporter.load()) e->postCommandResult(result);
}

void finishAtExit() {
  atExit();
}

timing::Tracer* activeTracer() {
  if (g_off.load(std::memory_order_relaxed)) return nullptr;
  return g_tracer.load(std::memory_order_acquire);
}

namespace {

// Custom kernels declared through flare_register_kernel (include/flare/kernels.h).
struct Registration {
  std::string prefix;
  timing::OpKind kind = timing::OpKind::kKernel;
  flare_amount_fn flops = nullptr;
  flare_amount_fn bytes = nullptr;
  double flops_per_launch = 0, flops_per_block = 0;  // flare_register_kernel_linear
  double bytes_per_launch = 0, bytes_per_block = 0;
};
struct Registry {
  std::mutex mu;
  std::vector<Registration> entries;  // guarded by mu
  std::atomic<uint64_t> generation{1};
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// Applies the longest matching registration to `ks` (cold path).
void applyRegistration(const std::string& name, timing::Signature* sig, KernelSig* ks) {
  std::lock_guard<std::mutex> lock(registry().mu);
  const Registration* best = nullptr;
  for (const auto& r : registry().entries) {
    if (name.compare(0, r.prefix.size(), r.prefix) == 0 &&
        (!best || r.prefix.size() > best->prefix.size())) {
      best = &r;
    }
  }
  if (!best) return;
  sig->kind = best->kind;
  ks->kind = best->kind;
  ks->flops = best->flops;
  ks->bytes = best->bytes;
  ks->flops_per_launch = best->flops_per_launch;
  ks->flops_per_block = best->flops_per_block;
  ks->bytes_per_launch = best->bytes_per_launch;
  ks->bytes_per_block = best->bytes_per_block;
}

// per_launch + per_block * blocks, rounded; 0 when both are 0.
uint64_t linearAmount(double per_launch, double per_block, unsigned gx, unsigned gy, unsigned gz) {
  const double v = per_launch + per_block * (static_cast<double>(gx) * gy * gz);
  return v > 0 ? static_cast<uint64_t>(v + 0.5) : 0;
}

}  // namespace

KernelSig kernelSignature(const void* key, std::string (*name_fn)(const void* key)) {
  thread_local std::unordered_map<const void*, KernelSig> cache;
  const uint64_t gen = registry().generation.load(std::memory_order_acquire);
  auto it = cache.find(key);
  if (it != cache.end() && it->second.generation == gen) return it->second;
  timing::Tracer* t = tracer();
  if (!t) return {};
  timing::Signature sig;
  sig.name = name_fn(key);
  sig.kind = looksLikeAttention(sig.name) ? timing::OpKind::kAttention : timing::OpKind::kKernel;
  KernelSig ks;
  ks.kind = sig.kind;
  applyRegistration(sig.name, &sig, &ks);
  ks.id = t->intern(sig);
  ks.generation = gen;
  cache[key] = ks;
  return ks;
}

timing::OpInfo kernelLaunchInfo(const KernelSig& ks, void** args, unsigned gx, unsigned gy,
                                unsigned gz, unsigned bx, unsigned by, unsigned bz) {
  timing::OpInfo op;
  op.signature_id = ks.id;
  op.kind = ks.kind;
  if (ks.flops) {
    op.flops = ks.flops(args, gx, gy, gz, bx, by, bz);
  } else if (ks.flops_per_launch > 0 || ks.flops_per_block > 0) {
    op.flops = linearAmount(ks.flops_per_launch, ks.flops_per_block, gx, gy, gz);
  }
  if (ks.bytes) {
    op.bytes = ks.bytes(args, gx, gy, gz, bx, by, bz);
  } else if (ks.bytes_per_launch > 0 || ks.bytes_per_block > 0) {
    op.bytes = linearAmount(ks.bytes_per_launch, ks.bytes_per_block, gx, gy, gz);
  }
  return op;
}

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

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || !d) return name;
  std::string out(d);
  std::free(d);
  return out;
}

uint64_t hashBytes(const void* data, size_t n, uint64_t seed) {
  auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

const char* cudaDataTypeName(int type) {
  switch (static_cast<cudaDataType>(type)) {
    case CUDA_R_64F:
      return "f64";
    case CUDA_R_32F:
      return "f32";
    case CUDA_R_16F:
      return "f16";
    case CUDA_R_16BF:
      return "bf16";
    case CUDA_R_8F_E4M3:
      return "e4m3";
    case CUDA_R_8F_E5M2:
      return "e5m2";
    case CUDA_R_8I:
      return "i8";
    case CUDA_R_32I:
      return "i32";
    default:
      return "other";
  }
}

bool looksLikeAttention(const std::string& name) {
  for (const char* s : {"flash", "fmha", "attention", "sdpa", "Attention"}) {
    if (name.find(s) != std::string::npos) return true;
  }
  return false;
}

}  // namespace flare::hook

namespace flare::hook {
namespace {

// Adds or replaces the registration of `r.prefix`; returns flare_register_kernel's codes.
int addRegistration(const char* name_prefix, int kind, Registration r) {
  using timing::OpKind;
  if (!name_prefix || !*name_prefix) return -1;
  switch (kind) {
    case FLARE_KIND_KERNEL:
      r.kind = OpKind::kKernel;
      break;
    case FLARE_KIND_GEMM:
      r.kind = OpKind::kGemm;
      break;
    case FLARE_KIND_ATTENTION:
      r.kind = OpKind::kAttention;
      break;
    default:
      return -1;
  }
  r.prefix = name_prefix;
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& e : reg.entries) {
    if (e.prefix == r.prefix) {
      e = std::move(r);
      reg.generation.fetch_add(1, std::memory_order_acq_rel);
      return 0;
    }
  }
  if (reg.entries.size() >= 256) return -2;
  reg.entries.push_back(std::move(r));
  reg.generation.fetch_add(1, std::memory_order_acq_rel);
  return 0;
}

bool validAmount(double v) {
  return v >= 0 && v < 1e30;
}  // also false for NaN

}  // namespace
}  // namespace flare::hook

extern "C" __attribute__((visibility("default"))) int flare_register_kernel(const char* name_prefix,
                                                                            int kind,
                                                                            flare_amount_fn flops,
                                                                            flare_amount_fn bytes) {
  flare::hook::Registration r;
  r.flops = flops;
  r.bytes = bytes;
  return flare::hook::addRegistration(name_prefix, kind, std::move(r));
}

extern "C" __attribute__((visibility("default"))) int flare_register_kernel_linear(
    const char* name_prefix, int kind, double flops_per_launch, double flops_per_block,
    double bytes_per_launch, double bytes_per_block) {
  using flare::hook::validAmount;
  if (!validAmount(flops_per_launch) || !validAmount(flops_per_block) ||
      !validAmount(bytes_per_launch) || !validAmount(bytes_per_block)) {
    return -1;
  }
  flare::hook::Registration r;
  r.flops_per_launch = flops_per_launch;
  r.flops_per_block = flops_per_block;
  r.bytes_per_launch = bytes_per_launch;
  r.bytes_per_block = bytes_per_block;
  return flare::hook::addRegistration(name_prefix, kind, std::move(r));
}
