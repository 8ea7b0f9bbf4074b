// A full intercepted launch on the simulated stack: cudaLaunchKernel through libflare_hook.so
// (re-entrancy guard, signature cache, two event records, ring push) into the simulated
// runtime. Run twice to get the hook's added cost:
//   FLARE_DISABLE=1 build/bin/hook_benchmark    (the wrapper forwards untouched)
//   build/bin/hook_benchmark                    (traced)
// The executable links libflare_hook.so ahead of the simulated libraries, which interposes it
// exactly as LD_PRELOAD would.
//
// The untimed launch of 1-in-N sampling (FLARE_SAMPLE_KERNELS, src/hook/launch_sampling.h):
//   FLARE_SAMPLE_KERNELS=1024 build/bin/hook_benchmark --benchmark_filter=StubLaunch
// BM_BareStubLaunch calls the simulated runtime's __cudaLaunchKernel directly (dlsym on its
// handle) with a null kernel, which it refuses at once: a "real function" of a few ns, so the
// difference BM_HookedStubLaunch - BM_BareStubLaunch is the hook's own cost per launch (with
// N = 1024, one launch in ~1024 takes the timed path: ~1-2 ns of the figure). The launches
// with a kernel (BM_BareLaunch, BM_InterceptedLaunch) add the simulated enqueue, ~0.5-1 us of
// noise. tools/bench/untimed_launch.py runs the arms interleaved and reports the median
// difference with a bootstrap interval (docs/benchmarks.md).
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "src/sim/testing/sim_kernels.h"

// CUDA 13's launch of a kernel handle (crt/host_runtime.h declares it for nvcc's stubs only).
extern "C" cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);

namespace {

void BM_InterceptedLaunch(benchmark::State& state) {
  static flare::sim::testing::SimKernel k;
  static bool once =
      (flare::sim::testing::registerKernel(k, "_Z5benchy", FLARE_SIM_COST_NANOS), true);
  (void)once;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int64_t n = 0;
  for (auto _ : state) {
    flare::sim::testing::launch(k, 0, s);
    if (++n % 512 == 0) cudaStreamSynchronize(s);  // keep the simulated queue short
  }
  cudaStreamSynchronize(s);
  state.SetItemsProcessed(n);
}
BENCHMARK(BM_InterceptedLaunch)->MinTime(1.0);

using HandleLaunchFn = cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);

// The simulated runtime's own function, not the hook's (which the executable's symbol resolves
// to).
template <typename Fn>
Fn simRuntime(const char* name) {
  void* lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
  return lib ? reinterpret_cast<Fn>(dlsym(lib, name)) : nullptr;
}

void BM_BareStubLaunch(benchmark::State& state) {
  static const HandleLaunchFn real = simRuntime<HandleLaunchFn>("__cudaLaunchKernel");
  if (!real) {
    state.SkipWithError("the simulated runtime's __cudaLaunchKernel not found");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(real(nullptr, dim3(1), dim3(128), nullptr, 0, nullptr));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BareStubLaunch)->MinTime(0.5);

void BM_HookedStubLaunch(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(__cudaLaunchKernel(nullptr, dim3(1), dim3(128), nullptr, 0, nullptr));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HookedStubLaunch)->MinTime(0.5);

// An async memset the simulated runtime refuses at once (a null pointer): the real function of a
// few ns, bare and through the hook. With FLARE_SAMPLE_CALLS=1024 (and FLARE_SAMPLE_STEPS > 1,
// which turns on the per-signature first-calls count) nearly every hooked call takes the
// per-signature untimed path: the signature lookup, the first-calls count and the countdown —
// an upper bound of what a GEMM, copy or set of a step sampled out costs (which skips the
// countdown), for a memset's signature; a GEMM's lookup also hashes its shape.
using MemsetFn = cudaError_t (*)(void*, int, size_t, cudaStream_t);

void BM_BareStubMemset(benchmark::State& state) {
  static const MemsetFn real = simRuntime<MemsetFn>("cudaMemsetAsync");
  if (!real) {
    state.SkipWithError("the simulated runtime's cudaMemsetAsync not found");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(real(nullptr, 0, 256, nullptr));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BareStubMemset)->MinTime(0.5);

void BM_HookedStubMemset(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(cudaMemsetAsync(nullptr, 0, 256, nullptr));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HookedStubMemset)->MinTime(0.5);

// A launch of a kernel straight into the simulated runtime (no hook): BM_InterceptedLaunch's
// baseline in the same process.
void BM_BareLaunch(benchmark::State& state) {
  using LaunchFn = cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
  static const LaunchFn real = simRuntime<LaunchFn>("cudaLaunchKernel");
  static flare::sim::testing::SimKernel k;
  static bool once =
      (flare::sim::testing::registerKernel(k, "_Z4barey", FLARE_SIM_COST_NANOS), true);
  (void)once;
  if (!real) {
    state.SkipWithError("the simulated runtime's cudaLaunchKernel not found");
    return;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int64_t n = 0;
  for (auto _ : state) {
    uint64_t amount = 0;
    void* args[] = {&amount};
    real(k.fn(), dim3(1), dim3(128), args, 0, s);
    if (++n % 512 == 0) cudaStreamSynchronize(s);
  }
  cudaStreamSynchronize(s);
  state.SetItemsProcessed(n);
}
BENCHMARK(BM_BareLaunch)->MinTime(1.0);

// PyTorch's cuBLASLt pattern: layouts created, used once and destroyed around every matmul (the
// hook reads the shape from its shadow of the Create/Set calls, not with attribute queries).
void BM_LtMatmulLayoutsPerCall(benchmark::State& state) {
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t trans_b = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
  const float alpha = 1, beta = 0;
  int64_t n = 0;
  for (auto _ : state) {
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 64, 64, 64);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, 64, 64, 64);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, 64, 64, 64);
    cublasLtMatmul(lt, desc, &alpha, nullptr, a, nullptr, b, &beta, nullptr, c, nullptr, c, nullptr,
                   nullptr, 0, s);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    if (++n % 512 == 0) cudaStreamSynchronize(s);
  }
  cudaStreamSynchronize(s);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  state.SetItemsProcessed(n);
}
BENCHMARK(BM_LtMatmulLayoutsPerCall)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
