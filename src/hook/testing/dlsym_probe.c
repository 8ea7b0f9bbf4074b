/* dlsym_probe: launches JIT kernels through driver functions taken by dlsym on a
 * dlopen("libcuda.so.1") handle, the way Triton's launcher does, on the simulated stack;
 * tests/python/test_hook_dlsym.py runs it with and without libflare_hook.so preloaded.
 *
 * Written in C, like the launcher Triton compiles. Linked against libcuda (Triton's module is
 * too) for everything but the launches, and against the runtime, which it starts first (as
 * PyTorch does before Triton launches anything). It prints one line per lookup, "<what> <object>"
 * with the file name of the object the pointer lies in (or "null") and whether dlerror() was
 * set, then launches:
 *   4 x cuLaunchKernel    triton_poi_fused_mul_0  grid 3,2,1 block 128,1,1
 *   6 x cuLaunchKernelEx  triton_red_fused_sum_1  grid 5,1,2 block 64,1,1
 *   2 x cuLaunchKernel from the dlsym'd cuGetProcAddress_v2: triton_tem_fused_3 grid 9,1,1
 *   4 threads, each its own dlopen + dlsym("cuLaunchKernelEx"), 3 launches each of
 *     triton_per_fused_2 with grid t+1,7,1 (t = 0..3) block 32,1,1
 * Under the hook it registers FLOPs of 1000 per block for "triton_" kernels (so that a record's
 * FLOPs tell its grid). Exit status 0 when every call succeeded. */
#define _GNU_SOURCE /* dladdr, RTLD_NEXT, RTLD_DEFAULT */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "flare/kernels.h"
#include "src/sim/flare_sim.h"

typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
typedef CUresult (*LaunchExFn)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef int (*RegisterFn)(const char*, int, double, double, double, double);
typedef CUresult (*ProcFn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

static const char* objectOf(const void* p) {
  Dl_info info;
  if (p == NULL) return "null";
  if (dladdr(p, &info) == 0 || info.dli_fname == NULL) return "unknown";
  const char* base = strrchr(info.dli_fname, '/');
  return base ? base + 1 : info.dli_fname;
}

/* dlsym as Triton calls it: clear dlerror(), look up, read dlerror(). */
static void* lookup(void* handle, const char* what, const char* name) {
  dlerror();
  void* p = dlsym(handle, name);
  const char* err = dlerror();
  printf("%s %s error=%s\n", what, objectOf(p), err ? "set" : "none");
  return p;
}

static CUfunction jitKernel(const char* name) {
  CUmodule mod;
  CUfunction f;
  if (cuModuleLoadData(&mod, "jit-image") != CUDA_SUCCESS) return NULL;
  if (cuModuleGetFunction(&f, mod, name) != CUDA_SUCCESS) return NULL;
  flareSimRegisterKernelCost(name, FLARE_SIM_COST_NANOS, 0);
  return f;
}

static int launchEx(LaunchExFn fn, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                    unsigned bx) {
  uint64_t ns = 50000;
  void* params[] = {&ns};
  CUlaunchConfig config;
  memset(&config, 0, sizeof(config));
  config.gridDimX = gx;
  config.gridDimY = gy;
  config.gridDimZ = gz;
  config.blockDimX = bx;
  config.blockDimY = config.blockDimZ = 1;
  return fn(&config, f, params, NULL) == CUDA_SUCCESS ? 0 : 1;
}

static CUfunction g_per_kernel;

static void* threadMain(void* arg) {
  unsigned t = (unsigned)(uintptr_t)arg;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY);
  LaunchExFn fn = h ? (LaunchExFn)dlsym(h, "cuLaunchKernelEx") : NULL;
  int bad = fn == NULL;
  for (int i = 0; i < 3 && fn; ++i) bad |= launchEx(fn, g_per_kernel, t + 1, 7, 1, 32);
  return (void*)(uintptr_t)bad;
}

int main(void) {
  /* The runtime is up before any launch, as in a PyTorch process (the hook times with its
     events). */
  if (cudaFree(NULL) != cudaSuccess) return 2;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY);
  if (h == NULL) {
    fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
    return 2;
  }
  LaunchFn launch = (LaunchFn)lookup(h, "handle:cuLaunchKernel", "cuLaunchKernel");
  LaunchExFn launch_ex = (LaunchExFn)lookup(h, "handle:cuLaunchKernelEx", "cuLaunchKernelEx");
  ProcFn proc = (ProcFn)lookup(h, "handle:cuGetProcAddress_v2", "cuGetProcAddress_v2");
  lookup(h, "handle:cuModuleGetFunction", "cuModuleGetFunction");
  lookup(h, "handle:cuNoSuchFunction", "cuNoSuchFunction");
  /* Resolved relative to this program, whoever interposes dlsym. */
  lookup(RTLD_NEXT, "next:cudaLaunchKernel", "cudaLaunchKernel");
  lookup(RTLD_NEXT, "next:cuLaunchKernel", "cuLaunchKernel");
  lookup(RTLD_DEFAULT, "default:cudaLaunchKernel", "cudaLaunchKernel");
  lookup(RTLD_DEFAULT, "default:cuLaunchKernel", "cuLaunchKernel");
  if (!launch || !launch_ex || !proc) return 3;

  /* Under the hook: FLOPs = 1000 x the blocks of the grid, so that each record shows the grid
     its launch had. Looked up at run time, as a program that also runs without Flare would. */
  RegisterFn reg = (RegisterFn)dlsym(RTLD_DEFAULT, "flare_register_kernel_linear");
  if (reg && reg("triton_", FLARE_KIND_KERNEL, 0, 1000, 0, 0) != 0) return 7;

  CUfunction mul = jitKernel("triton_poi_fused_mul_0");
  CUfunction sum = jitKernel("triton_red_fused_sum_1");
  CUfunction tem = jitKernel("triton_tem_fused_3");
  g_per_kernel = jitKernel("triton_per_fused_2");
  if (!mul || !sum || !tem || !g_per_kernel) return 4;

  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    uint64_t ns = 50000;
    void* params[] = {&ns};
    bad |= launch(mul, 3, 2, 1, 128, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS;
  }
  for (int i = 0; i < 6; ++i) bad |= launchEx(launch_ex, sum, 5, 1, 2, 64);

  void* via_proc = NULL;
  CUdriverProcAddressQueryResult q;
  if (proc("cuLaunchKernel", &via_proc, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS ||
      via_proc == NULL) {
    return 5;
  }
  printf("procaddress:cuLaunchKernel %s\n", objectOf(via_proc));
  /* cuGetProcAddress itself, by the version the caller was built for: 12.0 brought the
     5-argument signature (_v2); a CUDA 11 caller needs the 4-argument one. */
  for (int version = 11030; version <= 12000; version += 970) {
    void* gpa = NULL;
    if (proc("cuGetProcAddress", &gpa, version, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS) {
      return 5;
    }
    Dl_info info;
    printf("procaddress:cuGetProcAddress@%d %s %s\n", version, objectOf(gpa),
           gpa && dladdr(gpa, &info) && info.dli_sname ? info.dli_sname : "unnamed");
  }
  for (int i = 0; i < 2; ++i) {
    uint64_t ns = 50000;
    void* params[] = {&ns};
    bad |= ((LaunchFn)via_proc)(tem, 9, 1, 1, 128, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS;
  }

  pthread_t threads[4];
  for (unsigned t = 0; t < 4; ++t) {
    if (pthread_create(&threads[t], NULL, threadMain, (void*)(uintptr_t)t) != 0) return 6;
  }
  for (unsigned t = 0; t < 4; ++t) {
    void* r = NULL;
    pthread_join(threads[t], &r);
    bad |= r != NULL;
  }
  bad |= cuCtxSynchronize() != CUDA_SUCCESS;
  printf("done bad=%d\n", bad);
  return bad ? 1 : 0;
}
