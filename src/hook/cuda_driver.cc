// Interposed CUDA driver calls: cuLaunchKernel, cuLaunchKernelEx, and cuGetProcAddress and the
// runtime's cudaGetDriverEntryPoint(ByVersion), which hand out these wrappers so that launches
// through entry points resolved at run time (cuBLAS, CUTLASS cluster launches, JIT-compiled
// code) are still seen. Launches made while another intercepted
// call is in progress (cuBLAS inside cublasGemmEx) are forwarded untouched (runtime.h).
#include "src/hook/cuda_driver.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>

#include "src/hook/launch_sampling.h"
#include "src/hook/op_names.h"
#include "src/hook/real.h"
#include "src/hook/runtime.h"
#include "src/hook/timed.h"

#define FLARE_EXPORT extern "C" __attribute__((visibility("default")))

namespace flare::hook {
namespace {

constexpr const char* kLib = "libcuda.so";

using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void**, void**);
using LaunchExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using ProcFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct DriverFns {
  RealFn<LaunchFn> launchKernel{"cuLaunchKernel", kLib};
  RealFn<LaunchFn> launchKernelPtsz{"cuLaunchKernel_ptsz", kLib};
  RealFn<LaunchExFn> launchKernelEx{"cuLaunchKernelEx", kLib};
  RealFn<LaunchExFn> launchKernelExPtsz{"cuLaunchKernelEx_ptsz", kLib};
  RealFn<ProcFn> getProcAddress{"cuGetProcAddress_v2", kLib};
  RealFn<CUresult (*)(const char**, CUfunction)> funcGetName{"cuFuncGetName", kLib};
  RealFn<CUresult (*)(const char**, CUkernel)> kernelGetName{"cuKernelGetName", kLib};
  // The runtime's own door to driver entry points (CUTLASS's cluster launches, FlashAttention on
  // Hopper): the runtime resolves them inside itself, never through cuGetProcAddress above.
  RealFn<cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*)>
      getDriverEntryPoint{"cudaGetDriverEntryPoint", "libcudart.so"};
  RealFn<cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                         cudaDriverEntryPointQueryResult*)>
      getDriverEntryPointByVersion{"cudaGetDriverEntryPointByVersion", "libcudart.so"};
};
DriverFns g_fns;

bool ok(CUresult r) {
  return r == CUDA_SUCCESS;
}

// A launched handle is a CUfunction (a module's: Triton, CUTLASS) or, as CUDA 12+ allows, a
// CUkernel cast to one (a library's, cuLibraryGetKernel: cuDNN's generated kernels), which
// cuFuncGetName need not name and cuKernelGetName does.
std::string driverKernelName(const void* f) {
  const char* name = nullptr;
  auto by_function = g_fns.funcGetName.get();
  const CUresult rf = by_function
                          ? by_function(&name, static_cast<CUfunction>(const_cast<void*>(f)))
                          : CUDA_ERROR_NOT_FOUND;
  if (rf == CUDA_SUCCESS && name) return demangle(name);
  name = nullptr;
  auto by_kernel = g_fns.kernelGetName.get();
  const CUresult rk = by_kernel ? by_kernel(&name, static_cast<CUkernel>(const_cast<void*>(f)))
                                : CUDA_ERROR_NOT_FOUND;
  if (rk == CUDA_SUCCESS && name) return demangle(name);
  return unnamedKernel("the driver API",
                       "cuFuncGetName: " + lookupResult(by_function, "CUresult", rf) +
                           "; cuKernelGetName: " + lookupResult(by_kernel, "CUresult", rk));
}

timing::OpInfo kernelInfo(CUfunction f, void** params, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz) {
  return kernelLaunchInfo(kernelSignature(f, driverKernelName), params, gx, gy, gz, bx, by, bz);
}

CUresult launch(LaunchFn real, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params,
                void** extra) {
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  if (untimedLaunch()) {  // 1-in-N sampling (launch_sampling.h): before anything else
    Guard guard;
    return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
  }
  return timedCall(
      stream, [&] { return sampledLaunch(kernelInfo(f, params, gx, gy, gz, bx, by, bz)); }, ok,
      [&] { return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra); });
}

CUresult launchEx(LaunchExFn real, const CUlaunchConfig* config, CUfunction f, void** params,
                  void** extra) {
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  if (untimedLaunch()) {
    Guard guard;
    return real(config, f, params, extra);
  }
  return timedCall(
      config ? config->hStream : nullptr,
      [&] {
        return sampledLaunch(config ? kernelInfo(f, params, config->gridDimX, config->gridDimY,
                                                 config->gridDimZ, config->blockDimX,
                                                 config->blockDimY, config->blockDimZ)
                                    : kernelInfo(f, params, 0, 0, 0, 0, 0, 0));
      },
      ok, [&] { return real(config, f, params, extra); });
}

// Hands out `wrapper` instead of the driver's entry point `*pfn`, which the wrapper's table
// slot remembers (unless the caller got the wrapper itself, e.g. through our own table).
template <typename Fn>
void substitute(void** pfn, RealFn<Fn>& slot, Fn wrapper) {
  if (*pfn != reinterpret_cast<void*>(wrapper)) slot.set(*pfn);
  *pfn = reinterpret_cast<void*>(wrapper);
}

}  // namespace
}  // namespace flare::hook

using namespace flare::hook;  // NOLINT: the exported wrappers below

FLARE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                     unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                     CUstream stream, void** params, void** extra) {
  return launch(g_fns.launchKernel.get(), f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

FLARE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                          CUstream stream, void** params, void** extra) {
  return launch(g_fns.launchKernelPtsz.get(), f, gx, gy, gz, bx, by, bz, shmem, stream, params,
                extra);
}

FLARE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                       void** extra) {
  return launchEx(g_fns.launchKernelEx.get(), config, f, params, extra);
}

FLARE_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                            void** params, void** extra) {
  return launchEx(g_fns.launchKernelExPtsz.get(), config, f, params, extra);
}

namespace flare::hook {
namespace {
// A launch entry point resolved at run time comes back as our wrapper. The real pointer the
// driver returned is remembered per variant (default or per-thread default stream) so that each
// wrapper forwards to exactly what the caller asked for.
void substituteLaunch(const char* symbol, void** pfn, bool ptsz) {
  if (std::strcmp(symbol, "cuLaunchKernel") == 0) {
    substitute(pfn, ptsz ? g_fns.launchKernelPtsz : g_fns.launchKernel,
               ptsz ? &cuLaunchKernel_ptsz : &cuLaunchKernel);
  } else if (std::strcmp(symbol, "cuLaunchKernelEx") == 0) {
    substitute(pfn, ptsz ? g_fns.launchKernelExPtsz : g_fns.launchKernelEx,
               ptsz ? &cuLaunchKernelEx_ptsz : &cuLaunchKernelEx);
  }
}
}  // namespace
}  // namespace flare::hook

#undef cuGetProcAddress
// The pre-12.0 entry point (no status argument), below.
FLARE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                       cuuint64_t flags);

FLARE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                          cuuint64_t flags,
                                          CUdriverProcAddressQueryResult* status) {
  auto real = g_fns.getProcAddress.get();
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r != CUDA_SUCCESS || !symbol || !pfn || !*pfn) return r;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    // Asked for by a CUDA 11 caller (version < 12000), the driver hands out the 4-argument
    // entry point: so do we, or its call would pass garbage as `status`.
    *pfn = version >= 12000 ? reinterpret_cast<void*>(&cuGetProcAddress_v2)
                            : reinterpret_cast<void*>(&cuGetProcAddress);
  } else {
    substituteLaunch(symbol, pfn, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
  }
  return r;
}

// The runtime's entry points to the driver: the same substitution (cudaEnablePerThreadDefault-
// Stream asks for the per-thread variant). A caller asking for cuGetProcAddress this way gets
// the driver's own, as before: what it resolves through it is the driver's, unhooked.
FLARE_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** pfn,
                                                          unsigned int version,
                                                          unsigned long long flags,
                                                          cudaDriverEntryPointQueryResult* status) {
  auto real = g_fns.getDriverEntryPointByVersion.get();
  if (!real) return cudaErrorInsufficientDriver;
  cudaError_t r = real(symbol, pfn, version, flags, status);
  if (r == cudaSuccess && symbol && pfn && *pfn) {
    substituteLaunch(symbol, pfn, (flags & cudaEnablePerThreadDefaultStream) != 0);
  }
  return r;
}

FLARE_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** pfn,
                                                 unsigned long long flags,
                                                 cudaDriverEntryPointQueryResult* status) {
  auto real = g_fns.getDriverEntryPoint.get();
  if (!real) return cudaErrorInsufficientDriver;
  cudaError_t r = real(symbol, pfn, flags, status);
  if (r == cudaSuccess && symbol && pfn && *pfn) {
    substituteLaunch(symbol, pfn, (flags & cudaEnablePerThreadDefaultStream) != 0);
  }
  return r;
}

#undef cuGetProcAddress
// The pre-12.0 entry point (no status argument).
FLARE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                       cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

namespace flare::hook {

// The table of what dlsym hands out (dlsym_interpose.cc): a launcher that takes the driver's
// entry points by dlsym on its own dlopen("libcuda.so.1") handle (Triton's) gets the wrappers,
// which forward to the function it looked up.
bool isWrappedDriverSymbol(const char* name) {
  if (name[0] != 'c' || name[1] != 'u' || (name[2] != 'L' && name[2] != 'G')) return false;
  for (const char* s : {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel_ptsz",
                        "cuLaunchKernelEx_ptsz", "cuGetProcAddress", "cuGetProcAddress_v2"}) {
    if (std::strcmp(name, s) == 0) return true;
  }
  return false;
}

void* wrapDriverSymbol(const char* name, void* real) {
  void* p = real;
  if (std::strcmp(name, "cuLaunchKernel") == 0) {
    substitute(&p, g_fns.launchKernel, &cuLaunchKernel);
  } else if (std::strcmp(name, "cuLaunchKernel_ptsz") == 0) {
    substitute(&p, g_fns.launchKernelPtsz, &cuLaunchKernel_ptsz);
  } else if (std::strcmp(name, "cuLaunchKernelEx") == 0) {
    substitute(&p, g_fns.launchKernelEx, &cuLaunchKernelEx);
  } else if (std::strcmp(name, "cuLaunchKernelEx_ptsz") == 0) {
    substitute(&p, g_fns.launchKernelExPtsz, &cuLaunchKernelEx_ptsz);
  } else if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    substitute(&p, g_fns.getProcAddress, &cuGetProcAddress_v2);
  } else if (std::strcmp(name, "cuGetProcAddress") == 0 &&
             real != reinterpret_cast<void*>(&cuGetProcAddress)) {
    // The pre-12.0 entry point: its wrapper forwards to the driver's cuGetProcAddress_v2.
    p = reinterpret_cast<void*>(&cuGetProcAddress);
  }
  return p;
}

}  // namespace flare::hook
