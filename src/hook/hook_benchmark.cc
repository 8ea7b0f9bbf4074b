// A full intercepted launch on the simulated stack: cudaLaunchKernel through libflare_hook.so
// (re-entrancy guard, signature cache, two event records, ring push) into the simulated
// runtime. Run twice to get the hook's added cost:
//   FLARE_DISABLE=1 build/bin/hook_benchmark    (the wrapper forwards untouched)
//   build/bin/hook_benchmark                    (traced)
// The executable links libflare_hook.so ahead of the simulated libraries, which interposes it
// exactly as LD_PRELOAD would.
#include <benchmark/benchmark.h>

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

}  // namespace

BENCHMARK_MAIN();
