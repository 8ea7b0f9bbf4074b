// The simulated CUDA runtime (libcudart.so.13).
//
// Like the real runtime, it dlopens libcuda.so.1 and takes every driver entry point it uses
// from cuGetProcAddress into one table, so a tool that wraps cuGetProcAddress sees the
// runtime's own kernel launches (the real runtime behaves the same way). Signatures come from
// the real <cuda_runtime_api.h>.
#include <dlfcn.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace {

// Driver entry points used by the runtime, filled once from cuGetProcAddress.
struct DriverFns {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuStreamCreateWithPriority)(CUstream*, unsigned, int);
  CUresult (*cuStreamGetPriority)(CUstream, int*);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuStreamBeginCapture)(CUstream, CUstreamCaptureMode);
  CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode*);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
  CUresult (*cuLaunchHostFunc)(CUstream, CUhostFn, void*);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetName)(const char**, CUfunction);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuGetProcAddress)(const char*, void**, int, cuuint64_t,
                               CUdriverProcAddressQueryResult*);
};

DriverFns* g_drv = nullptr;
cudaError_t g_init_error = cudaSuccess;

template <typename T>
bool resolve(T& slot, const char* name) {
  void* p = nullptr;
  g_drv->cuGetProcAddress(name, &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
  slot = reinterpret_cast<T>(p);
  return p != nullptr;
}

cudaError_t loadDriver() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return cudaErrorInsufficientDriver;
  auto* gpa =
      reinterpret_cast<decltype(DriverFns::cuGetProcAddress)>(dlsym(h, "cuGetProcAddress_v2"));
  if (!gpa) return cudaErrorInsufficientDriver;
  g_drv = new DriverFns();
  g_drv->cuGetProcAddress = gpa;
  bool ok = true;
#define R(name) ok &= resolve(g_drv->name, #name)
  R(cuInit);
  R(cuDriverGetVersion);
  R(cuDeviceGetCount);
  R(cuDeviceGetName);
  R(cuDeviceGetUuid);
  R(cuDeviceTotalMem);
  R(cuDeviceGetAttribute);
  R(cuDevicePrimaryCtxRetain);
  R(cuCtxSetCurrent);
  R(cuCtxSynchronize);
  R(cuMemGetInfo);
  R(cuMemAlloc);
  R(cuMemFree);
  R(cuMemcpyAsync);
  R(cuMemcpyHtoDAsync);
  R(cuMemcpyDtoHAsync);
  R(cuMemsetD8Async);
  R(cuStreamCreateWithPriority);
  R(cuStreamGetPriority);
  R(cuStreamDestroy);
  R(cuStreamSynchronize);
  R(cuStreamQuery);
  R(cuStreamWaitEvent);
  R(cuStreamBeginCapture);
  R(cuThreadExchangeStreamCaptureMode);
  R(cuStreamEndCapture);
  R(cuStreamIsCapturing);
  R(cuLaunchHostFunc);
  R(cuEventCreate);
  R(cuEventRecord);
  R(cuEventQuery);
  R(cuEventSynchronize);
  R(cuEventElapsedTime);
  R(cuEventDestroy);
  R(cuModuleLoadData);
  R(cuModuleGetFunction);
  R(cuFuncGetName);
  R(cuLaunchKernel);
  R(cuGraphInstantiateWithFlags);
  R(cuGraphLaunch);
  R(cuGraphExecDestroy);
  R(cuGraphDestroy);
#undef R
  if (!ok) return cudaErrorInsufficientDriver;
  return g_drv->cuInit(0) == CUDA_SUCCESS ? cudaSuccess : cudaErrorInitializationError;
}

// Lazily initializes the runtime (as the real one does on the first call).
bool ready() {
  static std::once_flag once;
  std::call_once(once, [] { g_init_error = loadDriver(); });
  return g_init_error == cudaSuccess;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

cudaError_t fromDriver(CUresult r) {
  // The runtime and driver share numeric values for every code the simulator returns.
  return static_cast<cudaError_t>(r);
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}
cudaError_t ret(CUresult r) {
  return ret(fromDriver(r));
}

#define ENSURE_READY() \
  if (!ready()) return ret(g_init_error)

// Kernels registered by __cudaRegisterFunction (nvcc's host stubs, or sim workloads).
struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, CUfunction> functions;  // guarded by mu
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

CUfunction lookupFunction(const void* host_fun) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto it = registry().functions.find(host_fun);
  return it == registry().functions.end() ? nullptr : it->second;
}

// nvcc's call configuration stack for <<<...>>> launches.
struct CallConfig {
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
};
thread_local CallConfig t_call_configs[16];
thread_local int t_call_depth = 0;

}  // namespace

// ---- registration (nvcc-generated host code calls these at load time) ----

SIM_API void** __cudaRegisterFatBinary(void* fat_cubin) {
  if (!ready()) return nullptr;
  CUmodule module = nullptr;
  g_drv->cuModuleLoadData(&module, fat_cubin);
  auto** handle = new void*[1];
  handle[0] = module;
  return handle;
}

SIM_API void __cudaRegisterFatBinaryEnd(void** handle) {}

SIM_API void __cudaUnregisterFatBinary(void** handle) {}

SIM_API void __cudaRegisterFunction(void** handle, const char* host_fun, char* device_fun,
                                    const char* device_name, int thread_limit, uint3* tid,
                                    uint3* bid, dim3* bdim, dim3* gdim, int* wsize) {
  if (!handle || !handle[0] || !host_fun || !device_name) return;
  CUfunction f = nullptr;
  if (g_drv->cuModuleGetFunction(&f, static_cast<CUmodule>(handle[0]), device_name) !=
      CUDA_SUCCESS) {
    return;
  }
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().functions[host_fun] = f;
}

SIM_API void __cudaRegisterVar(void** handle, char* host_var, char* device_address,
                               const char* device_name, int ext, size_t size, int constant,
                               int global) {}

SIM_API unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                             struct CUstream_st* stream) {
  if (t_call_depth >= 16) return 1;
  t_call_configs[t_call_depth++] = {grid, block, shared, stream};
  return 0;
}

SIM_API cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared,
                                               void* stream) {
  if (t_call_depth == 0) return cudaErrorMissingConfiguration;
  const CallConfig& c = t_call_configs[--t_call_depth];
  *grid = c.grid;
  *block = c.block;
  *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

// ---- errors and versions ----

SIM_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

SIM_API cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}

SIM_API const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorCudartUnloading:
      return "cudaErrorCudartUnloading";
    case cudaErrorMissingConfiguration:
      return "cudaErrorMissingConfiguration";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorSymbolNotFound:
      return "cudaErrorSymbolNotFound";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    default:
      return "cudaErrorUnknown";
  }
}

SIM_API const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorCudartUnloading:
      return "driver shutting down";
    case cudaErrorMissingConfiguration:
      return "__global__ function call is not configured";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalState:
      return "the operation is not permitted in this state";
    case cudaErrorSymbolNotFound:
      return "named symbol not found";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return "unknown error";
  }
}

SIM_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return ret(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return ret(cudaErrorInvalidValue);
  if (!ready()) {
    *version = 0;
    return cudaSuccess;
  }
  return ret(g_drv->cuDriverGetVersion(version));
}

SIM_API cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn,
                                                     unsigned int version, unsigned long long flags,
                                                     cudaDriverEntryPointQueryResult* status) {
  ENSURE_READY();
  CUdriverProcAddressQueryResult s;
  CUresult r = g_drv->cuGetProcAddress(symbol, fn, static_cast<int>(version), flags, &s);
  if (status) {
    *status = s == CU_GET_PROC_ADDRESS_SUCCESS ? cudaDriverEntryPointSuccess
                                               : cudaDriverEntryPointSymbolNotFound;
  }
  return ret(r == CUDA_SUCCESS ? cudaSuccess : cudaErrorSymbolNotFound);
}

SIM_API cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                            cudaDriverEntryPointQueryResult* status) {
  return cudaGetDriverEntryPointByVersion(symbol, fn, CUDART_VERSION, flags, status);
}

// ---- devices ----

SIM_API cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return ret(cudaErrorInvalidValue);
  if (!ready()) {
    *count = 0;
    return ret(cudaErrorNoDevice);
  }
  return ret(g_drv->cuDeviceGetCount(count));
}

SIM_API cudaError_t cudaSetDevice(int device) {
  ENSURE_READY();
  int n = 0;
  g_drv->cuDeviceGetCount(&n);
  if (device < 0 || device >= n) return ret(cudaErrorInvalidDevice);
  CUcontext ctx = nullptr;
  g_drv->cuDevicePrimaryCtxRetain(&ctx, device);
  g_drv->cuCtxSetCurrent(ctx);
  t_device = device;
  return cudaSuccess;
}

SIM_API cudaError_t cudaGetDevice(int* device) {
  if (!device) return ret(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  ENSURE_READY();
  // cudaDeviceAttr and CUdevice_attribute share their numbering.
  return ret(g_drv->cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device));
}

SIM_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  ENSURE_READY();
  if (!prop) return ret(cudaErrorInvalidValue);
  std::memset(prop, 0, sizeof(*prop));
  CUresult r = g_drv->cuDeviceGetName(prop->name, sizeof(prop->name), device);
  if (r != CUDA_SUCCESS) return ret(r);
  CUuuid uuid;
  g_drv->cuDeviceGetUuid(&uuid, device);
  std::memcpy(prop->uuid.bytes, uuid.bytes, sizeof(uuid.bytes));
  g_drv->cuDeviceTotalMem(&prop->totalGlobalMem, device);
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    g_drv->cuDeviceGetAttribute(&v, a, device);
    return v;
  };
  prop->major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  prop->minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  prop->multiProcessorCount = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  prop->warpSize = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  prop->maxThreadsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  prop->memoryBusWidth = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  prop->pciBusID = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->sharedMemPerBlock = 48 << 10;
  prop->l2CacheSize = 50 << 20;
  prop->concurrentKernels = 1;
  prop->streamPrioritiesSupported = 1;
  prop->unifiedAddressing = 1;
  prop->cooperativeLaunch = 1;
  prop->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceSynchronize(void) {
  ENSURE_READY();
  return ret(g_drv->cuCtxSynchronize());
}

SIM_API cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  ENSURE_READY();
  return ret(g_drv->cuMemGetInfo(free_bytes, total));
}

// ---- memory ----

SIM_API cudaError_t cudaMalloc(void** p, size_t size) {
  ENSURE_READY();
  if (!p) return ret(cudaErrorInvalidValue);
  CUdeviceptr d = 0;
  CUresult r = g_drv->cuMemAlloc(&d, size);
  *p = reinterpret_cast<void*>(d);
  return ret(r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : fromDriver(r));
}

SIM_API cudaError_t cudaFree(void* p) {
  ENSURE_READY();
  return ret(g_drv->cuMemFree(reinterpret_cast<CUdeviceptr>(p)));
}

SIM_API cudaError_t cudaMallocHost(void** p, size_t size) {
  if (!p) return ret(cudaErrorInvalidValue);
  *p = std::aligned_alloc(4096, (std::max<size_t>(size, 1) + 4095) / 4096 * 4096);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

SIM_API cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

SIM_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                    cudaStream_t stream) {
  ENSURE_READY();
  if (count && (!dst || !src)) return ret(cudaErrorInvalidValue);
  auto d = reinterpret_cast<CUdeviceptr>(dst);
  auto s = reinterpret_cast<CUdeviceptr>(src);
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return ret(g_drv->cuMemcpyHtoDAsync(d, src, count, stream));
    case cudaMemcpyDeviceToHost:
      return ret(g_drv->cuMemcpyDtoHAsync(dst, s, count, stream));
    default:
      return ret(g_drv->cuMemcpyAsync(d, s, count, stream));
  }
}

SIM_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, nullptr);
  if (e != cudaSuccess) return e;
  return ret(g_drv->cuStreamSynchronize(nullptr));
}

SIM_API cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  ENSURE_READY();
  if (count && !p) return ret(cudaErrorInvalidValue);
  return ret(g_drv->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p),
                                    static_cast<unsigned char>(value), count, stream));
}

SIM_API cudaError_t cudaMemset(void* p, int value, size_t count) {
  cudaError_t e = cudaMemsetAsync(p, value, count, nullptr);
  if (e != cudaSuccess) return e;
  return ret(g_drv->cuStreamSynchronize(nullptr));
}

// ---- streams ----

SIM_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags,
                                                 int priority) {
  ENSURE_READY();
  if (!stream) return ret(cudaErrorInvalidValue);
  return ret(g_drv->cuStreamCreateWithPriority(stream, flags, priority));
}

SIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

SIM_API cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0);
}

SIM_API cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  ENSURE_READY();
  return ret(g_drv->cuStreamGetPriority(stream, priority));
}

SIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ENSURE_READY();
  return ret(g_drv->cuStreamDestroy(stream));
}

SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  ENSURE_READY();
  return ret(g_drv->cuStreamSynchronize(stream));
}

SIM_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  ENSURE_READY();
  return ret(g_drv->cuStreamQuery(stream));
}

SIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                        unsigned int flags) {
  ENSURE_READY();
  return ret(g_drv->cuStreamWaitEvent(stream, event, flags));
}

SIM_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  ENSURE_READY();
  return ret(g_drv->cuLaunchHostFunc(stream, fn, user_data));
}

SIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  ENSURE_READY();
  return ret(g_drv->cuStreamBeginCapture(stream, static_cast<CUstreamCaptureMode>(mode)));
}

SIM_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  ENSURE_READY();
  return ret(
      g_drv->cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

SIM_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  ENSURE_READY();
  return ret(g_drv->cuStreamEndCapture(stream, graph));
}

SIM_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  ENSURE_READY();
  if (!status) return ret(cudaErrorInvalidValue);
  CUstreamCaptureStatus s;
  CUresult r = g_drv->cuStreamIsCapturing(stream, &s);
  *status = static_cast<cudaStreamCaptureStatus>(s);
  return ret(r);
}

SIM_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                             unsigned long long* id, cudaGraph_t* graph,
                                             const cudaGraphNode_t** deps,
                                             const cudaGraphEdgeData** edges, size_t* num_deps) {
  cudaError_t e = cudaStreamIsCapturing(stream, status);
  if (id) *id = 0;
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (num_deps) *num_deps = 0;
  return e;
}

// ---- events ----

SIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  ENSURE_READY();
  if (!event) return ret(cudaErrorInvalidValue);
  return ret(g_drv->cuEventCreate(event, flags));
}

SIM_API cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

SIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ENSURE_READY();
  return ret(g_drv->cuEventRecord(event, stream));
}

SIM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                             unsigned int flags) {
  return cudaEventRecord(event, stream);
}

SIM_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  ENSURE_READY();
  return ret(g_drv->cuEventQuery(event));
}

SIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ENSURE_READY();
  return ret(g_drv->cuEventSynchronize(event));
}

SIM_API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  ENSURE_READY();
  return ret(g_drv->cuEventElapsedTime(ms, start, end));
}

SIM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ENSURE_READY();
  return ret(g_drv->cuEventDestroy(event));
}

// ---- kernels ----

SIM_API cudaError_t cudaFuncGetName(const char** name, const void* func) {
  ENSURE_READY();
  if (!name) return ret(cudaErrorInvalidValue);
  CUfunction f = lookupFunction(func);
  if (!f) return ret(cudaErrorInvalidDeviceFunction);
  return ret(g_drv->cuFuncGetName(name, f));
}

SIM_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t* out, const void* symbol) {
  ENSURE_READY();
  if (!out) return ret(cudaErrorInvalidValue);
  CUfunction f = lookupFunction(symbol);
  if (!f) return ret(cudaErrorInvalidDeviceFunction);
  *out = reinterpret_cast<cudaFunction_t>(f);
  return cudaSuccess;
}

SIM_API cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                     size_t shared_mem, cudaStream_t stream) {
  ENSURE_READY();
  CUfunction f = lookupFunction(func);
  if (!f) return ret(cudaErrorInvalidDeviceFunction);
  return ret(g_drv->cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                   static_cast<unsigned>(shared_mem), stream, args, nullptr));
}

// CUDA 13's nvcc stubs (crt/host_runtime.h, unless __NV_LEGACY_LAUNCH): `<<<>>>` looks the
// kernel up once with __cudaGetKernel and launches the handle with __cudaLaunchKernel. The
// handle is the kernel's CUfunction here (cuKernelGetName names it).
SIM_API cudaError_t __cudaGetKernel(cudaKernel_t* out, const void* func) {
  ENSURE_READY();
  if (!out) return ret(cudaErrorInvalidValue);
  CUfunction f = lookupFunction(func);
  if (!f) return ret(cudaErrorInvalidDeviceFunction);
  *out = reinterpret_cast<cudaKernel_t>(f);
  return cudaSuccess;
}

SIM_API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                       size_t shared_mem, cudaStream_t stream) {
  ENSURE_READY();
  if (!kernel) return ret(cudaErrorInvalidDeviceFunction);
  return ret(g_drv->cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), grid.x, grid.y, grid.z,
                                   block.x, block.y, block.z, static_cast<unsigned>(shared_mem),
                                   stream, args, nullptr));
}

SIM_API cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                            size_t shared_mem, cudaStream_t stream) {
  return __cudaLaunchKernel(kernel, grid, block, args, shared_mem, stream);
}

SIM_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func,
                                        void** args) {
  if (!config) return ret(cudaErrorInvalidValue);
  return cudaLaunchKernel(func, config->gridDim, config->blockDim, args, config->dynamicSmemBytes,
                          config->stream);
}

SIM_API cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block,
                                                void** args, size_t shared_mem,
                                                cudaStream_t stream) {
  return cudaLaunchKernel(func, grid, block, args, shared_mem, stream);
}

// ---- graphs ----

SIM_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                                  unsigned long long flags) {
  ENSURE_READY();
  return ret(g_drv->cuGraphInstantiateWithFlags(exec, graph, flags));
}

SIM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                         unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(exec, graph, flags);
}

SIM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  ENSURE_READY();
  return ret(g_drv->cuGraphLaunch(exec, stream));
}

SIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  ENSURE_READY();
  return ret(g_drv->cuGraphExecDestroy(exec));
}

SIM_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  ENSURE_READY();
  return ret(g_drv->cuGraphDestroy(graph));
}
