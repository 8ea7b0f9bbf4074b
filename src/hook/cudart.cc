// Interposed CUDA runtime calls: kernel launches, graph launches, async copies/sets (timed on
// the GPU), and the synchronization calls (recorded as host spans: they are what kernel-issue
// stalls are made of).
#include <sys/syscall.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "src/common/clock.h"
#include "src/common/config.h"
#include "src/common/mix.h"
#include "src/hook/cudart_fns.h"
#include "src/hook/deep_trace.h"
#include "src/hook/launch_sampling.h"
#include "src/hook/op_names.h"
#include "src/hook/real.h"
#include "src/hook/runtime.h"
#include "src/hook/sink_setup.h"
#include "src/hook/timed.h"

#define FLARE_EXPORT extern "C" __attribute__((visibility("default")))

namespace flare::hook {

CudartFns g_cudart;

// --- 1-in-N sampling of plain kernel launches (launch_sampling.h) ----------------------------

constinit thread_local LaunchSampler t_sampler FLARE_HOOK_TLS;

int64_t sampleKernelsSetting() {
  static const int64_t n = common::paramInt("FLARE_SAMPLE_KERNELS", 1, kMaxSampleKernels);
  return n;
}

int64_t sampleCallsSetting() {
  static const int64_t n = common::paramInt("FLARE_SAMPLE_CALLS", 1, kMaxSampleKernels);
  return n;
}

int64_t sampleStepsSetting() {
  static const int64_t k = common::paramInt("FLARE_SAMPLE_STEPS", 1, kMaxSampleKernels);
  return k;
}

namespace {

// Whether the job left step sampling to Flare: summary mode, and none of FLARE_SAMPLE_STEPS,
// FLARE_SAMPLE_KERNELS, FLARE_SAMPLE_CALLS or FLARE_TIMING=end set (each is a choice of how to
// time, which the default budget does not override).
bool budgetAppliesByDefault() {
  if (!summaryMode(!common::paramString("FLARE_DAEMON").empty())) return false;
  for (const char* name : {"FLARE_SAMPLE_STEPS", "FLARE_SAMPLE_KERNELS", "FLARE_SAMPLE_CALLS"}) {
    if (common::getEnv(name).has_value()) return false;
  }
  return common::paramString("FLARE_TIMING") != "end";
}

struct Budget {
  double pct = 0;
  bool by_default = false;
};

const Budget& timingBudget() {
  static const Budget b = [] {
    // A bad value warns once (naming the variable) and reads as the declared default.
    const double value = common::paramDouble("FLARE_TIMING_BUDGET_PCT", 0, 100);
    const auto raw = common::getEnv("FLARE_TIMING_BUDGET_PCT");
    const auto parsed = raw ? common::parseDouble(*raw) : std::nullopt;
    if (parsed && *parsed >= 0 && *parsed <= 100) return Budget{value, false};
    if (budgetAppliesByDefault()) return Budget{value, true};
    return Budget{};
  }();
  return b;
}

}  // namespace

double timingBudgetPct() {
  return timingBudget().pct;
}

bool timingBudgetByDefault() {
  return timingBudget().by_default;
}

namespace {

// The next gap of 1-in-N sampling, uniform in 1..2N-1, from the thread's xorshift (seeded on
// first use by splitmix64 of the thread id and the clock: threads draw different gaps).
int32_t drawGap(int64_t n) {
  LaunchSampler& s = t_sampler;
  if (s.rng == 0) {
    s.rng = common::mixBits((static_cast<uint64_t>(::syscall(SYS_gettid)) << 32) ^
                            static_cast<uint64_t>(common::monotonicNs()) ^ common::kGoldenGamma) |
            1;
  }
  s.rng ^= s.rng << 13;  // xorshift64
  s.rng ^= s.rng >> 7;
  s.rng ^= s.rng << 17;
  return static_cast<int32_t>(1 + s.rng % static_cast<uint64_t>(2 * n - 1));
}

// One signature's state on one thread: its countdown (signatureTurn) and first calls
// (signatureFirstCalls).
struct SignatureTurn {
  int32_t countdown = 0;     // calls left up to and including the next timed one; <= 1: time it
  uint16_t next_weight = 1;  // the weight of that next timed call
  uint32_t timed = 0;        // timed calls so far (for the warm-up)
  uint8_t calls = 0;         // calls so far, up to kWarmupSignatureCalls (signatureFirstCalls)
};

// The timed path of either countdown (a thread's launches, a thread's calls of one signature):
// this op's weight, and the gap to the next timed one (1 during the first `warmup` timed ops).
template <typename Countdown>
uint16_t takeTurn(Countdown& s, int64_t n, uint32_t warmup) {
  const uint16_t weight = s.next_weight;
  if (++s.timed <= warmup) {
    s.countdown = 1;
    s.next_weight = 1;
    return weight;
  }
  const int32_t gap = drawGap(n);
  s.countdown = gap;
  s.next_weight = static_cast<uint16_t>(gap);
  return weight;
}

}  // namespace

uint16_t takeLaunchWeight() {
  const int64_t n = sampleKernelsSetting();
  if (n <= 1) return 1;  // countdown stays 0: every launch takes the timed path
  return takeTurn(t_sampler, n, kWarmupLaunches);
}

namespace {

// The calling thread's state of one signature (signatureTurn, signatureFirstCalls), indexed by
// signature id (dense, interned); nullptr above kMaxSampledSignatureId or without the memory.
SignatureTurn* signatureState(uint32_t signature_id) {
  if (signature_id > kMaxSampledSignatureId) return nullptr;
  thread_local std::vector<SignatureTurn> states;
  if (signature_id >= states.size()) {
    try {
      states.resize(signature_id + 1);
    } catch (...) {
      return nullptr;
    }
  }
  return &states[signature_id];
}

}  // namespace

uint16_t signatureTurn(uint32_t signature_id) {
  const int64_t n = sampleCallsSetting();
  if (n <= 1) return 1;
  SignatureTurn* s = signatureState(signature_id);
  if (s == nullptr) return 1;  // timed, as with N = 1
  if (s->countdown > 1) {
    --s->countdown;
    return 0;
  }
  return takeTurn(*s, n, kWarmupSignatureCalls);
}

bool signatureFirstCalls(uint32_t signature_id) {
  SignatureTurn* s = signatureState(signature_id);
  if (s == nullptr || s->calls >= kWarmupSignatureCalls) return false;  // as any untimed call
  ++s->calls;
  return true;
}

namespace {

bool ok(cudaError_t e) {
  return e == cudaSuccess;
}

std::string runtimeKernelName(const void* func) {
  const char* name = nullptr;
  auto fn = g_cudart.funcGetName.get();
  const cudaError_t r = fn ? fn(&name, func) : cudaErrorNotSupported;
  if (r == cudaSuccess && name) return demangle(name);
  return unnamedKernel("the runtime API", "cudaFuncGetName: " + lookupResult(fn, "cudaError_t", r));
}

timing::OpInfo kernelInfo(const void* func, void** args, dim3 grid, dim3 block) {
  return kernelLaunchInfo(kernelSignature(func, runtimeKernelName), args, grid.x, grid.y, grid.z,
                          block.x, block.y, block.z);
}

// The name of a cudaKernel_t (the same object as the driver's CUkernel): cuKernelGetName, else
// cudaFuncGetName, which takes a cudaKernel_t where it takes a function symbol.
RealFn<CUresult (*)(const char**, CUkernel)> g_kernel_get_name{"cuKernelGetName", "libcuda.so"};

std::string kernelHandleName(const void* handle) {
  const char* name = nullptr;
  auto by_kernel = g_kernel_get_name.get();
  const CUresult rk = by_kernel ? by_kernel(&name, static_cast<CUkernel>(const_cast<void*>(handle)))
                                : CUDA_ERROR_NOT_FOUND;
  if (rk == CUDA_SUCCESS && name) return demangle(name);
  name = nullptr;
  auto by_func = g_cudart.funcGetName.get();
  const cudaError_t rf = by_func ? by_func(&name, handle) : cudaErrorNotSupported;
  if (rf == cudaSuccess && name) return demangle(name);
  return unnamedKernel("the runtime API (a cudaKernel_t)",
                       "cuKernelGetName: " + lookupResult(by_kernel, "CUresult", rk) +
                           "; cudaFuncGetName: " + lookupResult(by_func, "cudaError_t", rf));
}

timing::OpInfo kernelHandleInfo(cudaKernel_t kernel, void** args, dim3 grid, dim3 block) {
  return kernelLaunchInfo(kernelSignature(kernel, kernelHandleName), args, grid.x, grid.y, grid.z,
                          block.x, block.y, block.z);
}

timing::OpInfo launchInfo(const void* func, void** args, dim3 grid, dim3 block) {
  return kernelInfo(func, args, grid, block);
}
timing::OpInfo launchInfo(cudaKernel_t kernel, void** args, dim3 grid, dim3 block) {
  return kernelHandleInfo(kernel, args, grid, block);
}

// Every runtime launch of a kernel by function symbol (`const void*`) or by handle
// (`cudaKernel_t`), timed on its stream.
template <typename Key, typename Real>
cudaError_t launch(Real real, Key func, dim3 grid, dim3 block, void** args, size_t shmem,
                   cudaStream_t stream) {
  if (!real) return cudaErrorInsufficientDriver;
  if (untimedLaunch()) {  // 1-in-N sampling: the cheapest exit, before anything else
    Guard guard;
    return real(func, grid, block, args, shmem, stream);
  }
  return timedCall(
      stream, [&] { return sampledLaunch(launchInfo(func, args, grid, block)); }, ok,
      [&] { return real(func, grid, block, args, shmem, stream); });
}

template <typename Real>
cudaError_t launchExC(Real real, const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (!real) return cudaErrorInsufficientDriver;
  if (untimedLaunch()) {
    Guard guard;
    return real(config, func, args);
  }
  return timedCall(
      config ? config->stream : nullptr,
      [&] {
        return sampledLaunch(config ? kernelInfo(func, args, config->gridDim, config->blockDim)
                                    : kernelInfo(func, args, dim3(), dim3()));
      },
      ok, [&] { return real(config, func, args); });
}

// `name` is a string literal: its address identifies it, so the per-call key costs no hashing
// of the text.
timing::OpInfo namedInfo(const char* name, timing::OpKind kind, uint64_t bytes) {
  timing::OpInfo op;
  const uintptr_t key = reinterpret_cast<uintptr_t>(name);
  op.signature_id = signatureFor(hashBytes(&key, sizeof(key)), [&] {
    timing::Signature s;
    s.name = name;
    s.kind = kind;
    return s;
  });
  op.kind = kind;
  op.bytes = bytes;
  return op;
}

const char* copyName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return "Memcpy HtoD";
    case cudaMemcpyDeviceToHost:
      return "Memcpy DtoH";
    case cudaMemcpyDeviceToDevice:
      return "Memcpy DtoD";
    case cudaMemcpyHostToHost:
      return "Memcpy HtoH";
    default:
      return "Memcpy Default";
  }
}

// A synchronization call: a host span from entry to return.
template <typename Call>
cudaError_t hostSpan(const char* name, Call&& call) {
  Guard guard;
  timing::Tracer* t = guard.outer ? tracer() : nullptr;
  if (!t) return call();
  const int64_t start = common::monotonicNs();
  cudaError_t r = call();
  const int64_t end = common::monotonicNs();
  timing::OpInfo op = namedInfo(name, timing::OpKind::kSync, 0);
  if (op.signature_id) t->hostSpan(op, start, end);
  return r;
}

}  // namespace
}  // namespace flare::hook

using namespace flare::hook;  // NOLINT: the exported wrappers below

FLARE_EXPORT cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                          size_t shmem, cudaStream_t stream) {
  return launch(g_cudart.launchKernel.get(), func, grid, block, args, shmem, stream);
}

FLARE_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func,
                                             void** args) {
  return launchExC(g_cudart.launchKernelExC.get(), config, func, args);
}

// The per-thread-default-stream variants (code built with --default-stream per-thread).
FLARE_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args,
                                               size_t shmem, cudaStream_t stream) {
  return launch(g_cudart.launchKernelPtsz.get(), func, grid, block, args, shmem, stream);
}

FLARE_EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config,
                                                  const void* func, void** args) {
  return launchExC(g_cudart.launchKernelExCPtsz.get(), config, func, args);
}

// `<<<>>>` as CUDA 13's nvcc compiles it: the stub looks the kernel up once (__cudaGetKernel)
// and launches its handle here. Without these, no kernel of a CUDA 13 build (PyTorch's
// elementwise, reduction, attention and optimizer kernels) would be recorded.
FLARE_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                            size_t shmem, cudaStream_t stream) {
  return launch(g_cudart.launchKernelHandle.get(), kernel, grid, block, args, shmem, stream);
}

FLARE_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block,
                                                 void** args, size_t shmem, cudaStream_t stream) {
  return launch(g_cudart.launchKernelHandlePtsz.get(), kernel, grid, block, args, shmem, stream);
}

FLARE_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block,
                                                     void** args, size_t shmem,
                                                     cudaStream_t stream) {
  return launch(g_cudart.launchCooperativeKernel.get(), func, grid, block, args, shmem, stream);
}

FLARE_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  auto real = g_cudart.graphLaunch.get();
  if (!real) return cudaErrorInsufficientDriver;
  stepRuleNoteGraphLaunch(flare::common::monotonicNs());
  return timedCall(
      stream, [&] { return namedInfo("cudaGraphLaunch", flare::timing::OpKind::kGraph, 0); }, ok,
      [&] { return real(exec, stream); });
}

FLARE_EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                         cudaMemcpyKind kind, cudaStream_t stream) {
  auto real = g_cudart.memcpyAsync.get();
  if (!real) return cudaErrorInsufficientDriver;
  return sampledCall(
      stream, [&] { return namedInfo(copyName(kind), flare::timing::OpKind::kMemcpy, count); }, ok,
      [&] { return real(dst, src, count, kind, stream); });
}

FLARE_EXPORT cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  auto real = g_cudart.memsetAsync.get();
  if (!real) return cudaErrorInsufficientDriver;
  return sampledCall(
      stream, [&] { return namedInfo("Memset", flare::timing::OpKind::kMemset, count); }, ok,
      [&] { return real(ptr, value, count, stream); });
}

FLARE_EXPORT cudaError_t cudaDeviceSynchronize(void) {
  auto real = g_cudart.deviceSynchronize.get();
  if (!real) return cudaErrorInsufficientDriver;
  return hostSpan("cudaDeviceSynchronize", [&] { return real(); });
}

FLARE_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  auto real = g_cudart.streamSynchronize.get();
  if (!real) return cudaErrorInsufficientDriver;
  return hostSpan("cudaStreamSynchronize", [&] { return real(stream); });
}

FLARE_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto real = g_cudart.eventSynchronize.get();
  if (!real) return cudaErrorInsufficientDriver;
  return hostSpan("cudaEventSynchronize", [&] { return real(event); });
}

FLARE_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                             unsigned int flags) {
  auto real = g_cudart.streamWaitEvent.get();
  if (!real) return cudaErrorInsufficientDriver;
  if (flare::timing::Tracer* t = activeTracer()) t->streamWaits(stream);
  t_sampler.skipped = true;  // a command between this thread's timed ops (timing::kOpAfterUntimed)
  return hostSpan("cudaStreamWaitEvent", [&] { return real(stream, event, flags); });
}

// The application's own event records (torch.cuda.Event, the caching allocator's stream
// events, ProcessGroupNCCL's work events) are commands on the stream between this thread's timed
// ops: the next timed op carries timing::kOpAfterUntimed, so that the Tracer's event-gap
// estimate does not read two gaps as one. Forwarded untouched otherwise (the Tracer records its
// own events through the real function).
namespace {

// An application event record: marks the thread's next timed op, then forwards the call.
template <typename Real, typename... Args>
cudaError_t forwardEventRecord(Real real, Args... args) {
  if (!real) return cudaErrorInsufficientDriver;
  t_sampler.skipped = true;
  return real(args...);
}

}  // namespace

FLARE_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return forwardEventRecord(g_cudart.eventRecord.get(), event, stream);
}

FLARE_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  return forwardEventRecord(g_cudart.eventRecordPtsz.get(), event, stream);
}

FLARE_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                  unsigned int flags) {
  return forwardEventRecord(g_cudart.eventRecordWithFlags.get(), event, stream, flags);
}

FLARE_EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                                       unsigned int flags) {
  return forwardEventRecord(g_cudart.eventRecordWithFlagsPtsz.get(), event, stream, flags);
}
