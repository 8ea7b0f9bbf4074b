// Test helpers: register named kernels with the simulated runtime the way nvcc-generated host
// code does (__cudaRegisterFatBinary + __cudaRegisterFunction), with a cost-model rule.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>

#include "src/sim/cuda_registration.h"
#include "src/sim/flare_sim.h"

namespace flare::sim::testing {

// The programs that include this header test the cost model and the hook against it: they run
// the exact model, without the simulator's noise (src/sim/noise.h), unless their environment
// already says otherwise. Set before main, so before the simulator reads its settings.
inline const int kExactModel = setenv("FLARE_SIM_NOISE", "0", /*overwrite=*/0);

// A kernel handle: its address is the "host stub" the runtime keys launches by.
struct SimKernel {
  char stub = 0;
  const void* fn() const { return &stub; }
};

// Registers `k` under `name` with the given cost rule (FLARE_SIM_COST_*, parameter index 0).
inline void registerKernel(SimKernel& k, const char* name, int cost_kind) {
  static void** handle = [] {
    static char image[] = "flare-sim-test-image";
    void** h = __cudaRegisterFatBinary(image);
    __cudaRegisterFatBinaryEnd(h);
    return h;
  }();
  __cudaRegisterFunction(handle, static_cast<const char*>(k.fn()), nullptr, name, -1, nullptr,
                         nullptr, nullptr, nullptr, nullptr);
  flareSimRegisterKernelCost(name, cost_kind, 0);
}

// Launches a kernel whose first parameter is a uint64 amount (ns, bytes or FLOPs).
inline cudaError_t launch(const SimKernel& k, uint64_t amount, cudaStream_t s) {
  void* args[] = {&amount};
  return cudaLaunchKernel(k.fn(), dim3(1), dim3(128), args, 0, s);
}

}  // namespace flare::sim::testing
