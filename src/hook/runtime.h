// The preload library's one runtime accessor (conventions.md #5: no singletons in core
// classes, at most one accessor here): the Tracer, its CUDA-backed DeviceTimer, the spool sink,
// and the per-thread caches the wrappers use.
//
// Initialized lazily by the first intercepted call that needs it (never in a constructor at
// load time), on whatever thread that is. If anything fails, tracing turns off, one line says
// why, and every wrapper just forwards from then on. A forked child (DataLoader worker) turns
// tracing off for itself and stays quiet.
#pragma once

#include <cstdint>
#include <string>

#include "src/timing/timing.h"

namespace flare::v1 {
class CommandResult;
}

namespace flare::hook {

// Re-entrancy depth of the calling thread: a vendor call made while another intercepted call
// is in progress (the runtime launching through the driver, cuBLAS launching its kernels) is
// forwarded untouched, so every op is recorded once, at the outermost API.
extern thread_local int t_depth;

struct Guard {
  Guard() : outer(t_depth++ == 0) {}
  ~Guard() { --t_depth; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  const bool outer;
};

// The tracer, or nullptr when tracing is off (disabled, failed, forked child, exiting).
timing::Tracer* tracer();

// Flare's exit work now (drain the tracer, flush the exporter; once per process, also from the
// exit handler): called by the Python tracing from an atexit callback, before the interpreter is
// finalized (src/pyprof/pyprof_api.h, before_exit).
void finishAtExit();

// The tracer if it is up already, without starting it (the Python span path, src/hook/python.cc:
// spans must not start the Tracer before the CUDA runtime is loaded).
timing::Tracer* activeTracer();

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

// Per-thread cache of signature ids by a 64-bit key (GEMM shapes, collectives, ...).
bool cachedSignature(uint64_t key, uint32_t* id);
uint32_t internSignature(uint64_t key, const timing::Signature& sig);

// The id for `key`, building the signature with make() only on a miss.
template <typename Make>
uint32_t signatureFor(uint64_t key, Make&& make) {
  uint32_t id = 0;
  if (cachedSignature(key, &id)) return id;
  return internSignature(key, make());
}

// Sends a command result produced after the command was answered (a deep trace that finished)
// to the daemon; no-op when not streaming to one. Any thread.
void postCommandResult(const flare::v1::CommandResult& result);

// Demangles a C++ symbol (returns it unchanged when it is not mangled).
std::string demangle(const char* name);

// Mixes values into a 64-bit key (FNV-1a over the bytes).
uint64_t hashBytes(const void* data, size_t n, uint64_t seed = 1469598103934665603ull);

// Short name of a cudaDataType value ("bf16", "f16", "f32", "e4m3", ...; "other").
const char* cudaDataTypeName(int type);

// Attention kernels are recognized by name (flash, fmha, attention, sdpa).
bool looksLikeAttention(const std::string& name);

}  // namespace flare::hook
