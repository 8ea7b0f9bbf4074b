// hook_probe: small programs that exercise one behaviour of libflare_hook.so on the simulated
// stack; tests/python/test_hook.py runs them under LD_PRELOAD and checks the spooled records.
//
//   hook_probe alltoall N      N forked ranks, one grouped send/recv all-to-all each, twice
//   hook_probe procaddress     launches through a cuLaunchKernel pointer from cuGetProcAddress
//   hook_probe entrypoint      cluster-style launches through a cuLaunchKernelEx pointer from the
//                              runtime's cudaGetDriverEntryPoint (CUTLASS, FlashAttention on
//                              Hopper)
//   hook_probe library         a library's kernel (cuLibraryLoadData, cuLibraryGetKernel: a
//                              CUkernel, as cuDNN's generated SDPA kernels come) launched through
//                              cuLaunchKernel and cuLaunchKernelEx as a CUfunction
//   hook_probe stub13          launches as CUDA 13's nvcc stubs do (__cudaGetKernel, then
//                              __cudaLaunchKernel with the handle), the way PyTorch's kernels come
//   hook_probe capture         kernels captured into a graph, the graph launched twice
//   hook_probe hung            a kernel that never finishes on one stream, work on another
//   hook_probe fork            a child forked between launches (a DataLoader worker)
//   hook_probe custom          a kernel declared through flare_register_kernel
//   hook_probe launches N      N kernel launches on one stream (instruction counts, make bench)
//   hook_probe events N        N kernels of 50 us on one stream, the application's own event
//                              recorded after three in four of them (an event-pair gap test)
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "flare/kernels.h"
#include "src/sim/testing/sim_kernels.h"

namespace {

using flare::sim::testing::launch;
using flare::sim::testing::SimKernel;

SimKernel& kernel() {
  static SimKernel k;
  static bool once =
      (flare::sim::testing::registerKernel(k, "_Z12probe_kernely", FLARE_SIM_COST_NANOS), true);
  (void)once;
  return k;
}

int allToAll(int n) {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ncclComm_t comm;
      if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) _exit(3);
      cudaStream_t s;
      cudaStreamCreate(&s);
      for (int iter = 0; iter < 2; ++iter) {
        ncclGroupStart();
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          ncclSend(nullptr, 1 << 20, ncclFloat32, p, comm, s);
          ncclRecv(nullptr, 1 << 20, ncclFloat32, p, comm, s);
        }
        if (ncclGroupEnd() != ncclSuccess) _exit(4);
      }
      cudaStreamSynchronize(s);
      std::exit(0);
    }
    kids.push_back(pid);
  }
  int bad = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return bad ? 1 : 0;
}

// A JIT-loaded kernel (what Triton and CUTLASS launch through the driver), with a cost rule
// of `FLARE_SIM_COST_NANOS` on its first parameter.
CUfunction jitKernel(const char* name) {
  CUmodule mod;
  cuModuleLoadData(&mod, "jit-image");
  CUfunction f;
  cuModuleGetFunction(&f, mod, name);
  flareSimRegisterKernelCost(name, FLARE_SIM_COST_NANOS, 0);
  return f;
}

// cuLaunchKernelEx's configuration of one block of 128 threads on the default stream.
CUlaunchConfig oneBlock() {
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = config.blockDimZ = 1;
  return config;
}

int procAddress() {
  void* p = nullptr;
  if (cuGetProcAddress("cuLaunchKernel", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) !=
      CUDA_SUCCESS) {
    return 2;
  }
  auto launch_fn = reinterpret_cast<decltype(&cuLaunchKernel)>(p);
  CUfunction f = jitKernel("triton_poi_fused_add_0");
  for (int i = 0; i < 5; ++i) {
    uint64_t ns = 100'000;
    void* params[] = {&ns};
    if (launch_fn(f, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) return 3;
  }
  cuCtxSynchronize();
  return 0;
}

int entryPoint() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &p, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      !p) {
    return 2;
  }
  auto launch_ex = reinterpret_cast<decltype(&cuLaunchKernelEx)>(p);
  CUfunction f = jitKernel("cutlass_sm90_cluster_kernel");
  for (int i = 0; i < 3; ++i) {
    uint64_t ns = 100'000;
    void* params[] = {&ns};
    CUlaunchConfig config = oneBlock();
    if (launch_ex(&config, f, params, nullptr) != CUDA_SUCCESS) return 3;
  }
  cuCtxSynchronize();
  return 0;
}

int library() {
  const char* name = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_kernel0_0";
  CUlibrary lib;
  CUkernel k;
  if (cuLibraryLoadData(&lib, "library-image", nullptr, nullptr, 0, nullptr, nullptr, 0) !=
          CUDA_SUCCESS ||
      cuLibraryGetKernel(&k, lib, name) != CUDA_SUCCESS) {
    return 2;
  }
  flareSimRegisterKernelCost(name, FLARE_SIM_COST_NANOS, 0);
  auto f = reinterpret_cast<CUfunction>(k);  // CUDA 12+: a CUkernel launches as a CUfunction
  for (int i = 0; i < 2; ++i) {
    uint64_t ns = 100'000;
    void* params[] = {&ns};
    if (cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) {
      return 3;
    }
    CUlaunchConfig config = oneBlock();
    if (cuLaunchKernelEx(&config, f, params, nullptr) != CUDA_SUCCESS) return 3;
  }
  cuCtxSynchronize();
  return 0;
}

// What `probe_kernel<<<1, 128>>>(ns)` compiles to with CUDA 13's nvcc (crt/host_runtime.h).
extern "C" cudaError_t __cudaGetKernel(cudaKernel_t*, const void*);
extern "C" cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);

int stub13() {
  static cudaKernel_t handle = nullptr;
  if (__cudaGetKernel(&handle, kernel().fn()) != cudaSuccess || !handle) return 2;
  for (int i = 0; i < 4; ++i) {
    uint64_t ns = 100'000;
    void* args[] = {&ns};
    if (__cudaLaunchKernel(handle, dim3(1), dim3(128), args, 0, nullptr) != cudaSuccess) return 3;
  }
  cudaDeviceSynchronize();
  return 0;
}

int capture() {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < 3; ++i) launch(kernel(), 200'000, s);
  cudaGraph_t g;
  if (cudaStreamEndCapture(s, &g) != cudaSuccess) return 2;
  cudaGraphExec_t e;
  cudaGraphInstantiate(&e, g, 0);
  cudaGraphLaunch(e, s);
  cudaGraphLaunch(e, s);
  launch(kernel(), 100'000, s);  // one ordinary kernel after the graphs
  cudaStreamSynchronize(s);
  return 0;
}

// PyTorch's torch.cuda.graph: a capture in global mode (the default) on the main thread while
// earlier work is still running on another stream, so the hook's timing thread queries its
// events during the capture. In global mode such a query from another thread is prohibited and
// breaks the capture (as on the H200, 2026-11-27), unless that thread is in relaxed mode.
int captureGlobal() {
  cudaStream_t busy, s;
  cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 4; ++i) launch(kernel(), 50'000'000, busy);  // 200 ms of queued work
  std::this_thread::sleep_for(std::chrono::milliseconds(20));      // the timing thread takes them
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) return 2;
  for (int i = 0; i < 3; ++i) launch(kernel(), 200'000, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // timing-thread passes
  cudaGraph_t g = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &g);
  if (end != cudaSuccess) {
    std::fprintf(stderr, "capture failed: %s\n", cudaGetErrorString(end));
    return 3;
  }
  cudaGraphExec_t e;
  cudaGraphInstantiate(&e, g, 0);
  cudaGraphLaunch(e, s);
  cudaStreamSynchronize(s);
  cudaStreamSynchronize(busy);
  return 0;
}

int hung() {
  // FLARE_SIM_HANG=0:compute:0 makes the first compute kernel of this process never finish.
  cudaStream_t stuck, healthy;
  cudaStreamCreateWithFlags(&stuck, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&healthy, cudaStreamNonBlocking);
  flareSimSetStep(0);
  launch(kernel(), 100'000, stuck);
  for (int i = 0; i < 5; ++i) launch(kernel(), 100'000, healthy);
  cudaEvent_t done;
  cudaEventCreate(&done);
  cudaEventRecord(done, healthy);
  cudaEventSynchronize(done);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 0;  // exits with the stuck kernel still in flight
}

int forked() {
  cudaStream_t s;
  cudaStreamCreate(&s);
  for (int i = 0; i < 3; ++i) launch(kernel(), 100'000, s);
  pid_t pid = fork();
  if (pid == 0) {
    // A DataLoader worker: Python/CPU work only, then a normal exit (atexit handlers run).
    std::printf("child ok\n");
    std::exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  for (int i = 0; i < 3; ++i) launch(kernel(), 100'000, s);
  cudaStreamSynchronize(s);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 5;
}

// FLOPs of one probe_kernel launch: its first parameter (ns) times 1000, times the grid.
uint64_t probeFlops(void** args, unsigned gx, unsigned, unsigned, unsigned, unsigned, unsigned) {
  uint64_t ns = 0;
  std::memcpy(&ns, args[0], sizeof(ns));
  return ns * 1000 * gx;
}

int custom() {
  // Looked up at run time, as a program that must also run without Flare would.
  auto reg = reinterpret_cast<decltype(&flare_register_kernel)>(
      dlsym(RTLD_DEFAULT, "flare_register_kernel"));
  if (!reg) return 6;
  if (reg("", FLARE_KIND_GEMM, probeFlops, nullptr) != -1) return 7;
  if (reg("probe_kernel", 99, probeFlops, nullptr) != -1) return 8;
  if (reg("probe_kernel", FLARE_KIND_ATTENTION, probeFlops, nullptr) != 0) return 9;
  cudaStream_t s;
  cudaStreamCreate(&s);
  for (int i = 0; i < 3; ++i) launch(kernel(), 100'000, s);
  cudaStreamSynchronize(s);
  return 0;
}

int launches(long n) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (long i = 0; i < n; ++i) {
    launch(kernel(), 1'000, s);
    if ((i + 1) % 512 == 0) cudaStreamSynchronize(s);  // keep the simulated queue short
  }
  cudaStreamSynchronize(s);
  return 0;
}

// Three kernels in four are followed by an event of the application's own on the same stream:
// only one pair of consecutive kernels in four is queued back to back.
int events(long n) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t ev;
  cudaEventCreate(&ev);
  for (long i = 0; i < n; ++i) {
    launch(kernel(), 50'000, s);
    if (i % 4 != 0) cudaEventRecord(ev, s);
    if ((i + 1) % 64 == 0) cudaStreamSynchronize(s);
  }
  cudaStreamSynchronize(s);
  cudaEventDestroy(ev);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  if (mode == "alltoall") return allToAll(argc > 2 ? std::atoi(argv[2]) : 4);
  if (mode == "procaddress") return procAddress();
  if (mode == "stub13") return stub13();
  if (mode == "library") return library();
  if (mode == "entrypoint") return entryPoint();
  if (mode == "capture") return capture();
  if (mode == "capture-global") return captureGlobal();
  if (mode == "hung") return hung();
  if (mode == "fork") return forked();
  if (mode == "custom") return custom();
  if (mode == "launches") return launches(argc > 2 ? std::atol(argv[2]) : 1000);
  if (mode == "events") return events(argc > 2 ? std::atol(argv[2]) : 1000);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
