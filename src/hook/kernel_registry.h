// Kernel signatures of launches by kernel handle (host stub, CUfunction, cudaKernel_t), with the
// FLOP and byte formulas custom kernels register through the public API
// (include/flare/kernels.h: flare_register_kernel, flare_register_kernel_linear, defined here).
// The launch path looks a kernel up in a per-thread cache (one hash lookup and a generation check
// per launch); a miss, or a registration made since, names and interns it (cold path).
#pragma once

#include <cstdint>
#include <string>

#include "src/timing/timing.h"

namespace flare::hook {

// The signature of a kernel identified by `key` (host stub or CUfunction), named by
// `name_fn(key)` the first time (cold path); cached per thread afterwards.
struct KernelSig {
  uint32_t id = 0;
  timing::OpKind kind = timing::OpKind::kKernel;
  // From flare_register_kernel (include/flare/kernels.h), or null.
  uint64_t (*flops)(void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned) = nullptr;
  uint64_t (*bytes)(void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned) = nullptr;
  // From flare_register_kernel_linear: amount = per_launch + per_block * blocks in the grid.
  double flops_per_launch = 0, flops_per_block = 0;
  double bytes_per_launch = 0, bytes_per_block = 0;
  uint64_t generation = 0;  // of the registry when resolved
};
KernelSig kernelSignature(const void* key, std::string (*name_fn)(const void* key));

// The OpInfo of one launch of `ks` with these launch parameters (runs registered callbacks).
timing::OpInfo kernelLaunchInfo(const KernelSig& ks, void** args, unsigned gx, unsigned gy,
                                unsigned gz, unsigned bx, unsigned by, unsigned bz);

}  // namespace flare::hook
