// A full intercepted launch on the simulated stack: cudaLaunchKernel through libflare_hook.so
// (re-entrancy guard, signature cache, two event records, ring push) into the simulated
// runtime. Run twice to get the hook's added cost:
//   FLARE_DISABLE=1 build/bin/hook_benchmark    (the wrapper forwards untouched)
//   build/bin/hook_benchmark                    (traced)
// The executable links libflare_hook.so ahead of the simulated libraries, which interposes it
// exactly as LD_PRELOAD would.
#include <benchmark/benchmark.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "src/sim/testing/sim_kernels.h"

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
