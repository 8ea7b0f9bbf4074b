// The simulated CUDA runtime's semantics: ordering, event timing, cross-stream waits, capture
// and graphs, errors, driver entry points, and an injected hang.
#include <gtest/gtest.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "src/sim/testing/sim_kernels.h"

namespace flare::sim {
namespace {

using testing::launch;
using testing::SimKernel;

// These tests check the cost model's own durations: no command gap between back-to-back
// commands unless the environment sets one (the simulator's default is the H200's 1.3 us;
// tests/python/test_event_gap.py checks the gap). Set before the first CUDA call loads the
// simulator's settings.
[[maybe_unused]] const bool kNoCommandGap = (setenv("FLARE_SIM_COMMAND_GAP_US", "0", 0), true);

constexpr uint64_t kMs = 1'000'000;

SimKernel& sleepKernel() {
  static SimKernel k;
  static bool once = (testing::registerKernel(k, "_Z12sleep_kernely", FLARE_SIM_COST_NANOS), true);
  (void)once;
  return k;
}

float elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  return ms;
}

TEST(SimRuntime, KernelsRunInStreamOrderWithModelDurations) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t e[3];
  for (auto& ev : e) ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  // Keep the stream busy first, so that everything below is queued before the GPU gets to it
  // and the event times show kernel durations only (no host issue gaps).
  ASSERT_EQ(launch(sleepKernel(), 5 * kMs, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e[0], s), cudaSuccess);
  ASSERT_EQ(launch(sleepKernel(), 20 * kMs, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e[1], s), cudaSuccess);
  ASSERT_EQ(launch(sleepKernel(), 30 * kMs, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e[2], s), cudaSuccess);
  // The stream has not reached the last event yet: the kernels take 50 ms.
  EXPECT_EQ(cudaEventQuery(e[2]), cudaErrorNotReady);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  auto waited = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
  EXPECT_GE(waited.count(), 45.0);
  EXPECT_EQ(cudaEventQuery(e[2]), cudaSuccess);
  // Event times follow the cost model, not the machine's load.
  EXPECT_NEAR(elapsed(e[0], e[1]), 20, 0.001);
  EXPECT_NEAR(elapsed(e[1], e[2]), 30, 0.001);
  for (auto& ev : e) cudaEventDestroy(ev);
  cudaStreamDestroy(s);
}

TEST(SimRuntime, CrossStreamWaitDelaysTheWaitingStream) {
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t a_start, a_done, b_done;
  cudaEventCreate(&a_start);
  cudaEventCreate(&a_done);
  cudaEventCreate(&b_done);
  launch(sleepKernel(), 5 * kMs, a);
  cudaEventRecord(a_start, a);
  launch(sleepKernel(), 30 * kMs, a);
  cudaEventRecord(a_done, a);
  ASSERT_EQ(cudaStreamWaitEvent(b, a_done, 0), cudaSuccess);
  launch(sleepKernel(), 5 * kMs, b);
  cudaEventRecord(b_done, b);
  ASSERT_EQ(cudaEventSynchronize(b_done), cudaSuccess);
  // b's kernel started only after a's finished.
  EXPECT_GE(elapsed(a_start, b_done), 35.0);
  EXPECT_NEAR(elapsed(a_done, b_done), 5, 0.001);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST(SimRuntime, IndependentStreamsOverlap) {
  cudaStream_t a, b;
  cudaStreamCreate(&a);
  cudaStreamCreate(&b);
  auto t0 = std::chrono::steady_clock::now();
  launch(sleepKernel(), 40 * kMs, a);
  launch(sleepKernel(), 40 * kMs, b);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
  EXPECT_GE(ms.count(), 39.0);
  EXPECT_LT(ms.count(), 75.0);  // concurrent, not 80 ms in series
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// CUDA's rule for "potentially unsafe" calls during stream capture (sim_core.h,
// checkUnsafeCall): the capturing thread's own synchronize, and in global mode another thread's
// event query, fail and invalidate the capture; a thread in relaxed mode may query.
TEST(SimRuntime, UnsafeCallsDuringACaptureInvalidateItUnlessTheCallerIsRelaxed) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t done;
  cudaEventCreate(&done);
  cudaEventRecord(done, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  auto queryFromAnotherThread = [&](bool relaxed) {
    cudaError_t r = cudaErrorUnknown;
    std::thread([&] {
      if (relaxed) {
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
        EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);  // every thread starts in global mode
      }
      r = cudaEventQuery(done);
    }).join();
    return r;
  };
  cudaGraph_t graph = nullptr;
  cudaStreamCaptureStatus status;
  // Global capture, another thread in global mode queries: prohibited, and the capture breaks.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(queryFromAnotherThread(false), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(launch(sleepKernel(), kMs, s), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  // The same capture with the querying thread relaxed: the query answers, the capture holds.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(queryFromAnotherThread(true), cudaSuccess);
  ASSERT_EQ(launch(sleepKernel(), kMs, s), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  cudaGraphDestroy(graph);
  // A thread-local capture ignores other threads; its own thread's synchronize still breaks it.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(queryFromAnotherThread(false), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  cudaEventDestroy(done);
  cudaStreamDestroy(s);
}

TEST(SimRuntime, CapturedWorkRunsOnlyWhenTheGraphIsLaunched) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t start, end;
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(launch(sleepKernel(), 2 * kMs, s), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);  // nothing ran during capture
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  launch(sleepKernel(), 5 * kMs, s);
  cudaEventRecord(start, s);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);  // replay
  cudaEventRecord(end, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_NEAR(elapsed(start, end), 12.0, 0.001);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST(SimRuntime, ErrorsAreReportedAndCleared) {
  static char not_a_kernel;
  void* args[] = {nullptr};
  EXPECT_EQ(cudaLaunchKernel(&not_a_kernel, dim3(1), dim3(1), args, 0, nullptr),
            cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_STREQ(cudaGetErrorString(cudaErrorNotReady), "device not ready");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
  cudaEvent_t no_timing, other;
  cudaEventCreateWithFlags(&no_timing, cudaEventDisableTiming);
  cudaEventCreate(&other);
  cudaEventRecord(no_timing, nullptr);
  cudaEventRecord(other, nullptr);
  cudaDeviceSynchronize();
  float ms;
  EXPECT_EQ(cudaEventElapsedTime(&ms, no_timing, other), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaSetDevice(100000), cudaErrorInvalidDevice);
  cudaGetLastError();
}

TEST(SimRuntime, FunctionNamesAndDriverEntryPoints) {
  const char* name = nullptr;
  ASSERT_EQ(cudaFuncGetName(&name, sleepKernel().fn()), cudaSuccess);
  EXPECT_STREQ(name, "_Z12sleep_kernely");
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 13000, cudaEnableDefault, &q),
            cudaSuccess);
  EXPECT_EQ(q, cudaDriverEntryPointSuccess);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuLaunchKernel));
  EXPECT_EQ(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 13000, cudaEnableDefault, &q),
            cudaErrorSymbolNotFound);
  cudaGetLastError();
}

TEST(SimRuntime, DriverLaunchThroughModuleFunction) {
  CUmodule mod;
  ASSERT_EQ(cuModuleLoadData(&mod, "triton-like-image"), CUDA_SUCCESS);
  CUfunction f;
  ASSERT_EQ(cuModuleGetFunction(&f, mod, "triton_poi_fused_add_0"), CUDA_SUCCESS);
  flareSimRegisterKernelCost("triton_poi_fused_add_0", FLARE_SIM_COST_BYTES, 0);
  const char* name;
  ASSERT_EQ(cuFuncGetName(&name, f), CUDA_SUCCESS);
  EXPECT_STREQ(name, "triton_poi_fused_add_0");
  CUevent a, b;
  cuEventCreate(&a, 0);
  cuEventCreate(&b, 0);
  uint64_t bytes = 200'000'000;  // 200 MB at 2000 GB/s = 0.1 ms
  void* params[] = {&bytes};
  launch(sleepKernel(), 5 * kMs, nullptr);
  cuEventRecord(a, nullptr);
  ASSERT_EQ(cuLaunchKernel(f, 1024, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  cuEventRecord(b, nullptr);
  ASSERT_EQ(cuEventSynchronize(b), CUDA_SUCCESS);
  float ms;
  ASSERT_EQ(cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS);
  // BYTES cost: from the parameter, not the grid. The simulated stream sleeps the 0.1 ms, so a
  // loaded machine can only add (0.105 ms was seen under ctest -j2).
  EXPECT_GE(ms, 0.099);
  EXPECT_LT(ms, 0.15);
}

TEST(SimRuntime, DevicePropertiesLookLikeTheConfiguredGpu) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 8);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 3), cudaSuccess);
  EXPECT_STREQ(prop.name, "Flare Simulated GPU");
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.multiProcessorCount, 132);
  cudaDeviceProp prop0;
  cudaGetDeviceProperties(&prop0, 0);
  EXPECT_NE(0, memcmp(prop.uuid.bytes, prop0.uuid.bytes, sizeof(prop.uuid.bytes)));
  int v = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, CUDART_VERSION);
}

TEST(SimRuntime, MemoryCopiesMoveBytes) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  char host[4096], back[4096];
  for (int i = 0; i < 4096; ++i) host[i] = static_cast<char>(i * 7);
  ASSERT_EQ(cudaMemcpy(d, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back, d, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(0, memcmp(host, back, sizeof(host)));
  ASSERT_EQ(cudaMemsetAsync(d, 0x5a, 4096, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back, d, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[100], 0x5a);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// A compute kernel that never finishes (FLARE_SIM_HANG=RANK:compute:STEP): the event behind it
// answers "not ready" for as long as anyone asks, and the process can still exit.
[[noreturn]] void computeHangChild() {
  setenv("FLARE_SIM_HANG", "0:compute:2", 1);
  setenv("RANK", "0", 1);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t before, after;
  cudaEventCreate(&before);
  cudaEventCreate(&after);
  flareSimSetStep(1);
  launch(sleepKernel(), 1 * kMs, s);  // step 1: fine
  cudaEventRecord(before, s);
  flareSimSetStep(2);
  launch(sleepKernel(), 1 * kMs, s);  // step 2: hangs
  cudaEventRecord(after, s);
  cudaEventSynchronize(before);
  for (int i = 0; i < 30; ++i) {
    if (cudaEventQuery(after) != cudaErrorNotReady) std::_Exit(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::exit(cudaEventQuery(before) == cudaSuccess ? 0 : 4);
}

TEST(SimRuntimeDeathTest, InjectedComputeHangNeverCompletes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(computeHangChild(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace flare::sim
