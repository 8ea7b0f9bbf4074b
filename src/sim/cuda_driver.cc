// The simulated CUDA driver API (libcuda.so.1): a C layer over sim_core.
//
// Signatures come from the real <cuda.h>, so the compiler checks that the ABI matches. Only
// the entry points Flare's hook, the simulated runtime/libraries and the sim workloads use
// are provided; cuGetProcAddress answers CUDA_ERROR_NOT_FOUND for the others, as the real
// driver does for symbols it does not have.
#include <unistd.h>

#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "src/sim/sim_core.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace {
using namespace flare::sim;  // NOLINT: implementation file

std::atomic<bool> g_initialized{false};
constexpr int kDriverVersion = 13000;
constexpr size_t kDeviceMemory = 80ull << 30;

struct MemState {
  std::mutex mu;
  std::unordered_map<uintptr_t, size_t> sizes;  // guarded by mu
  size_t used = 0;                              // guarded by mu
};
MemState& mem() {
  static MemState* m = new MemState();
  return *m;
}

CUctx_st* primaryContext(int device) {
  static CUctx_st* ctx = [] {
    auto* c = new CUctx_st[1024];
    for (int i = 0; i < 1024; ++i) c[i].device = i;
    return c;
  }();
  return &ctx[device];
}

bool validDevice(int d) {
  return d >= 0 && d < settings().devices;
}

// Memory: device allocations are host memory, 256-byte aligned like cudaMalloc's.
CUresult allocate(CUdeviceptr* p, size_t bytes) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  std::lock_guard<std::mutex> lock(mem().mu);
  if (mem().used + rounded > kDeviceMemory) return CUDA_ERROR_OUT_OF_MEMORY;
  void* ptr = std::aligned_alloc(256, rounded);
  if (!ptr) return CUDA_ERROR_OUT_OF_MEMORY;
  mem().sizes[reinterpret_cast<uintptr_t>(ptr)] = rounded;
  mem().used += rounded;
  *p = reinterpret_cast<CUdeviceptr>(ptr);
  return CUDA_SUCCESS;
}

// copy_kind: CUPTI's CUpti_ActivityMemcpyKind (1 HtoD, 2 DtoH, 8 DtoD), for the simulated CUPTI.
CUresult copyAsync(void* dst, const void* src, size_t bytes, CUstream stream, double gbps,
                   uint32_t copy_kind) {
  Op op;
  op.kind = Op::Kind::kCopy;
  op.activity = FLARE_SIM_ACTIVITY_MEMCPY;
  op.bytes = bytes;
  op.copy_kind = copy_kind;
  op.name = "memcpy";
  op.duration_ns = static_cast<Ns>((1e-6 + bytes / (gbps * 1e9)) * 1e9 * settings().time_scale);
  op.host = [dst, src, bytes] {
    if (bytes) std::memmove(dst, src, bytes);
  };
  return enqueue(resolveStream(stream), std::move(op));
}

CUresult setAsync(void* dst, int value, size_t bytes, CUstream stream) {
  Op op;
  op.kind = Op::Kind::kCopy;
  op.activity = FLARE_SIM_ACTIVITY_MEMSET;
  op.bytes = bytes;
  op.name = "memset";
  op.duration_ns = static_cast<Ns>((1e-6 + bytes / (settings().mem_bw_gbps * 1e9)) * 1e9 *
                                   settings().time_scale);
  op.host = [dst, value, bytes] {
    if (bytes) std::memset(dst, value, bytes);
  };
  return enqueue(resolveStream(stream), std::move(op));
}

}  // namespace

SIM_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  g_initialized = true;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

namespace {

// The error codes the simulator returns: the driver's name and text of each.
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation is not permitted in this state"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
};

const ErrorText* findError(CUresult error) {
  for (const ErrorText& e : kErrors) {
    if (e.code == error) return &e;
  }
  return nullptr;
}

}  // namespace

SIM_API CUresult cuGetErrorName(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *str = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *str = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuDeviceGetCount(int* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = settings().devices;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, len, "%s", settings().device_name.c_str());
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // Stable per (host, simulated node, device): "FLARESIM" + hash of the host name and
  // GROUP_RANK (flare-sim-train runs ranks 8-15 as a second node on the same machine: their
  // GPUs are not ranks 0-7's) + device index. Ranks with one UUID share one GPU.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  uint32_t h = 2166136261u;  // FNV-1a
  auto mix = [&h](const char* s) {
    for (const char* c = s; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
  };
  mix(host);
  if (const char* node = std::getenv("GROUP_RANK")) {
    mix("/");
    mix(node);
  }
  std::memcpy(uuid->bytes, "FLARESIM", 8);
  std::memcpy(uuid->bytes + 8, &h, 4);
  int32_t d = dev;
  std::memcpy(uuid->bytes + 12, &d, 4);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kDeviceMemory;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {  // an H100 SXM's values
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = 132;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      *value = static_cast<int>(1980000 * settings().clock_factor);
      break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      *value = 2619000;
      break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      *value = 5120;
      break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *value = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = 0x18 + dev;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      *value = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *value = 0;
      break;
    default:
      *value = 0;
      break;
  }
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = primaryContext(dev);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return validDevice(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

SIM_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = primaryContext(currentDevice());
  return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (ctx) setCurrentDevice(ctx->device);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetDevice(CUdevice* device) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = currentDevice();
  return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSynchronize(void) {
  return synchronizeDevice();
}

SIM_API CUresult cuMemGetInfo(size_t* free_bytes, size_t* total) {
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mem().mu);
  *total = kDeviceMemory;
  *free_bytes = kDeviceMemory - mem().used;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAlloc(CUdeviceptr* p, size_t bytes) {
  return allocate(p, bytes);
}

SIM_API CUresult cuMemFree(CUdeviceptr p) {
  if (!p) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> lock(mem().mu);
  auto it = mem().sizes.find(p);
  if (it == mem().sizes.end()) return CUDA_ERROR_INVALID_VALUE;
  mem().used -= it->second;
  mem().sizes.erase(it);
  std::free(reinterpret_cast<void*>(p));
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, stream,
                   settings().mem_bw_gbps / 2, 8);
}

SIM_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUresult r = cuMemcpyAsync(dst, src, bytes, nullptr);
  return r == CUDA_SUCCESS ? synchronizeStream(resolveStream(nullptr)) : r;
}

SIM_API CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
  return copyAsync(reinterpret_cast<void*>(dst), src, bytes, s, 25, 1);  // PCIe Gen5 x16-ish
}

SIM_API CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream s) {
  return copyAsync(dst, reinterpret_cast<const void*>(src), bytes, s, 25, 2);
}

SIM_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  return setAsync(reinterpret_cast<void*>(dst), v, n, s);
}

SIM_API CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  if (!stream) return CUDA_ERROR_INVALID_VALUE;
  *stream = createStream(flags, 0);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  if (!stream) return CUDA_ERROR_INVALID_VALUE;
  *stream = createStream(flags, std::clamp(priority, -5, 0));
  return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamGetPriority(CUstream stream, int* priority) {
  if (!priority) return CUDA_ERROR_INVALID_VALUE;
  *priority = resolveStream(stream)->priority;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamGetId(CUstream stream, unsigned long long* id) {
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  *id = resolveStream(stream)->id;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamDestroy(CUstream stream) {
  if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  destroyStream(stream);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamSynchronize(CUstream stream) {
  return synchronizeStream(resolveStream(stream));
}

SIM_API CUresult cuStreamQuery(CUstream stream) {
  return streamIdle(resolveStream(stream)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return waitEvent(resolveStream(stream), event);
}

SIM_API CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
  return beginCapture(resolveStream(stream), mode);
}

SIM_API CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  return endCapture(resolveStream(stream), graph);
}

SIM_API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = captureStatus(resolveStream(stream));
  return CUDA_SUCCESS;
}

SIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return exchangeCaptureMode(mode);
}

SIM_API CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user_data) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::Kind::kHostFn;
  op.name = "host_fn";
  op.host = [fn, user_data] { fn(user_data); };
  return enqueue(resolveStream(stream), std::move(op));
}

SIM_API CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  if (!event) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new CUevent_st();
  e->state = std::make_shared<EventState>();
  e->state->timing = (flags & CU_EVENT_DISABLE_TIMING) == 0;
  e->flags = flags;
  *event = e;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuEventRecord(CUevent event, CUstream stream) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return recordEvent(event, resolveStream(stream));
}

SIM_API CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
  return cuEventRecord(event, stream);
}

SIM_API CUresult cuEventQuery(CUevent event) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return queryEvent(event);
}

SIM_API CUresult cuEventSynchronize(CUevent event) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return synchronizeEvent(event);
}

SIM_API CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return elapsedMs(ms, start, end);
}

SIM_API CUresult cuEventDestroy(CUevent event) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  delete event;  // queued records keep the shared state alive
  return CUDA_SUCCESS;
}

// Modules: any image is accepted; functions are created by name on first lookup, the way a
// real module exposes the kernels its image contains.
SIM_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (!module) return CUDA_ERROR_INVALID_VALUE;
  *module = new CUmod_st();
  return CUDA_SUCCESS;
}

SIM_API CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return cuModuleLoadData(module, fname);
}

SIM_API CUresult cuModuleUnload(CUmodule module) {
  if (!module) return CUDA_ERROR_INVALID_HANDLE;
  // Functions may still be referenced by queued launches and by cached handles: keep them.
  return CUDA_SUCCESS;
}

namespace {
// The function of `name` in a module's or library's table (guarded by `mu`), created on first
// lookup.
CUfunc_st* functionByName(std::mutex& mu, std::map<std::string, std::unique_ptr<CUfunc_st>>& table,
                          const char* name, CUmod_st* module, bool library_kernel) {
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = table[name];
  if (!slot) {
    slot = std::make_unique<CUfunc_st>();
    slot->name = name;
    slot->module = module;
    slot->library_kernel = library_kernel;
  }
  return slot.get();
}
}  // namespace

SIM_API CUresult cuModuleGetFunction(CUfunction* func, CUmodule module, const char* name) {
  if (!func || !module || !name) return CUDA_ERROR_INVALID_VALUE;
  *func = functionByName(module->mu, module->functions, name, module, false);
  return CUDA_SUCCESS;
}

// Libraries (CUDA 12+): what cuDNN's runtime-compiled kernels come from. Any image is accepted.
SIM_API CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                   unsigned int, CUlibraryOption*, void**, unsigned int) {
  if (!library || !code) return CUDA_ERROR_INVALID_VALUE;
  *library = new CUlib_st();
  return CUDA_SUCCESS;
}

SIM_API CUresult cuLibraryUnload(CUlibrary library) {
  if (!library) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;  // kernels may still be referenced by queued launches: kept
}

SIM_API CUresult cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  if (!kernel || !library || !name) return CUDA_ERROR_INVALID_VALUE;
  *kernel = reinterpret_cast<CUkernel>(
      functionByName(library->mu, library->kernels, name, nullptr, true));
  return CUDA_SUCCESS;
}

namespace {
// FLARE_SIM_NAMELESS_KERNELS=1: no kernel has a name (a driver that cannot name one).
bool namelessKernels() {
  static const bool on = [] {
    const char* v = std::getenv("FLARE_SIM_NAMELESS_KERNELS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}
}  // namespace

SIM_API CUresult cuFuncGetName(const char** name, CUfunction func) {
  if (!name || !func) return CUDA_ERROR_INVALID_VALUE;
  if (namelessKernels()) return CUDA_ERROR_NOT_SUPPORTED;
  if (func->library_kernel) return CUDA_ERROR_INVALID_HANDLE;  // a CUkernel, not a CUfunction
  *name = func->name.c_str();
  return CUDA_SUCCESS;
}

// A CUkernel (a runtime cudaKernel_t, a library's kernel) is its CUfunction here: the simulator
// has one context.
SIM_API CUresult cuKernelGetName(const char** name, CUkernel kernel) {
  if (!name || !kernel) return CUDA_ERROR_INVALID_VALUE;
  if (namelessKernels()) return CUDA_ERROR_NOT_SUPPORTED;
  *name = reinterpret_cast<CUfunction>(kernel)->name.c_str();
  return CUDA_SUCCESS;
}

namespace {
// Both launch entry points share this; cuLaunchKernelEx must not call the exported
// cuLaunchKernel, which a preloaded library interposes (the real driver never calls back out
// through its own exported symbols, so a launch that bypasses the interposed one stays unseen).
CUresult launchGrid(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                    unsigned bz, CUstream stream, void** params) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
  uint64_t threads = uint64_t{gx} * gy * gz * bx * by * bz;
  return launchKernel(f, threads, stream, params);
}
}  // namespace

SIM_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz,
                                unsigned int shared_mem, CUstream stream, void** params,
                                void** extra) {
  return launchGrid(f, gx, gy, gz, bx, by, bz, stream, params);
}

SIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                  void** extra) {
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launchGrid(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                    config->blockDimY, config->blockDimZ, config->hStream, params);
}

SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                             unsigned long long flags) {
  if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new CUgraphExec_st();
  e->ops = graph->ops;
  *exec = e;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  return launchGraph(exec, resolveStream(stream));
}

SIM_API CUresult cuGraphExecDestroy(CUgraphExec exec) {
  delete exec;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphDestroy(CUgraph graph) {
  delete graph;
  return CUDA_SUCCESS;
}

// ---- cuGetProcAddress: every entry point above, by its base name ----

namespace {
const std::unordered_map<std::string_view, void*>& procTable() {
  static const auto* table = new std::unordered_map<std::string_view, void*>{
#define SIM_PROC(name, fn) {name, reinterpret_cast<void*>(&fn)}
      SIM_PROC("cuInit", cuInit),
      SIM_PROC("cuDriverGetVersion", cuDriverGetVersion),
      SIM_PROC("cuGetErrorName", cuGetErrorName),
      SIM_PROC("cuGetErrorString", cuGetErrorString),
      SIM_PROC("cuDeviceGetCount", cuDeviceGetCount),
      SIM_PROC("cuDeviceGet", cuDeviceGet),
      SIM_PROC("cuDeviceGetName", cuDeviceGetName),
      SIM_PROC("cuDeviceGetUuid", cuDeviceGetUuid),
      SIM_PROC("cuDeviceTotalMem", cuDeviceTotalMem),
      SIM_PROC("cuDeviceGetAttribute", cuDeviceGetAttribute),
      SIM_PROC("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
      SIM_PROC("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease),
      SIM_PROC("cuCtxGetCurrent", cuCtxGetCurrent),
      SIM_PROC("cuCtxSetCurrent", cuCtxSetCurrent),
      SIM_PROC("cuCtxGetDevice", cuCtxGetDevice),
      SIM_PROC("cuCtxSynchronize", cuCtxSynchronize),
      SIM_PROC("cuMemGetInfo", cuMemGetInfo),
      SIM_PROC("cuMemAlloc", cuMemAlloc),
      SIM_PROC("cuMemFree", cuMemFree),
      SIM_PROC("cuMemcpy", cuMemcpy),
      SIM_PROC("cuMemcpyAsync", cuMemcpyAsync),
      SIM_PROC("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync),
      SIM_PROC("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync),
      SIM_PROC("cuMemsetD8Async", cuMemsetD8Async),
      SIM_PROC("cuStreamCreate", cuStreamCreate),
      SIM_PROC("cuStreamCreateWithPriority", cuStreamCreateWithPriority),
      SIM_PROC("cuStreamGetPriority", cuStreamGetPriority),
      SIM_PROC("cuStreamGetId", cuStreamGetId),
      SIM_PROC("cuStreamDestroy", cuStreamDestroy),
      SIM_PROC("cuStreamSynchronize", cuStreamSynchronize),
      SIM_PROC("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode),
      SIM_PROC("cuStreamQuery", cuStreamQuery),
      SIM_PROC("cuStreamWaitEvent", cuStreamWaitEvent),
      SIM_PROC("cuStreamBeginCapture", cuStreamBeginCapture),
      SIM_PROC("cuStreamEndCapture", cuStreamEndCapture),
      SIM_PROC("cuStreamIsCapturing", cuStreamIsCapturing),
      SIM_PROC("cuLaunchHostFunc", cuLaunchHostFunc),
      SIM_PROC("cuEventCreate", cuEventCreate),
      SIM_PROC("cuEventRecord", cuEventRecord),
      SIM_PROC("cuEventRecordWithFlags", cuEventRecordWithFlags),
      SIM_PROC("cuEventQuery", cuEventQuery),
      SIM_PROC("cuEventSynchronize", cuEventSynchronize),
      SIM_PROC("cuEventElapsedTime", cuEventElapsedTime),
      SIM_PROC("cuEventDestroy", cuEventDestroy),
      SIM_PROC("cuModuleLoadData", cuModuleLoadData),
      SIM_PROC("cuModuleLoad", cuModuleLoad),
      SIM_PROC("cuModuleUnload", cuModuleUnload),
      SIM_PROC("cuModuleGetFunction", cuModuleGetFunction),
      SIM_PROC("cuFuncGetName", cuFuncGetName),
      SIM_PROC("cuKernelGetName", cuKernelGetName),
      SIM_PROC("cuLibraryLoadData", cuLibraryLoadData),
      SIM_PROC("cuLibraryUnload", cuLibraryUnload),
      SIM_PROC("cuLibraryGetKernel", cuLibraryGetKernel),
      SIM_PROC("cuLaunchKernel", cuLaunchKernel),
      SIM_PROC("cuLaunchKernelEx", cuLaunchKernelEx),
      SIM_PROC("cuGraphInstantiate", cuGraphInstantiateWithFlags),
      SIM_PROC("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags),
      SIM_PROC("cuGraphLaunch", cuGraphLaunch),
      SIM_PROC("cuGraphExecDestroy", cuGraphExecDestroy),
      SIM_PROC("cuGraphDestroy", cuGraphDestroy),
      SIM_PROC("cuGetProcAddress", cuGetProcAddress),
#undef SIM_PROC
  };
  return *table;
}
}  // namespace

SIM_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                  cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  const auto& t = procTable();
  auto it = t.find(symbol);
  if (it == t.end()) {
    *pfn = nullptr;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = it->second;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

// The pre-12.0 entry point (no status argument), still exported by the real driver.
#undef cuGetProcAddress
SIM_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                  cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, nullptr);
}
