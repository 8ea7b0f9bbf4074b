// The simulator's private C API, exported by the simulated libcuda.so.1 next to the real
// driver API. The other simulated libraries (cudart, cuBLAS, cuBLASLt, NCCL) and the sim
// workloads use it; nothing outside src/sim, the sim workloads and their tests may.
//
// The real libraries have no such symbols, so a program that calls them runs only on the
// simulated stack. Names start with `flareSim` so that the hook never interposes them.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

// How the cost model turns a kernel launch into a duration (see src/sim/README.md).
enum FlareSimCostKind {
  FLARE_SIM_COST_DEFAULT = 0,  // from the launch size: threads x 8 bytes over memory bandwidth
  FLARE_SIM_COST_FLOPS = 1,    // kernel parameter `arg_index` is a uint64 FLOP count (tensor peak)
  FLARE_SIM_COST_BYTES = 2,    // kernel parameter `arg_index` is a uint64 byte count (memory bw)
  FLARE_SIM_COST_NANOS = 3,    // kernel parameter `arg_index` is a uint64 duration in ns
};

// Declares how kernels named `name` (the mangled device name) are costed. Thread-safe;
// applies to launches after the call. Returns 0, or -1 on a bad argument.
int flareSimRegisterKernelCost(const char* name, int kind, int arg_index);

// A custom stream operation, run on the stream's worker thread when the stream reaches it.
// `start_ns` is the simulated GPU start time (CLOCK_MONOTONIC ns). Returns the end time;
// the worker sleeps until then before the next operation. May block (collectives do) but
// must return promptly once flareSimShuttingDown() is true.
typedef int64_t (*FlareSimOpFn)(void* ctx, int64_t start_ns);

// Enqueues a custom operation on `stream` (0 = the legacy default stream). `free_ctx` (may be
// null) is called on `ctx` after the op ran or when it is dropped. Not allowed while the
// stream is capturing (returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
CUresult flareSimEnqueueOp(CUstream stream, const char* name, FlareSimOpFn fn, void* ctx,
                           void (*free_ctx)(void*));

// CLOCK_MONOTONIC in ns: the clock every simulated timestamp is on.
int64_t flareSimNowNs(void);
// This process's rank (RANK, else SLURM_PROCID, else 0).
int flareSimRank(void);
// The training step the workload is in (set by the workload; faults are keyed by it).
void flareSimSetStep(int64_t step);
int64_t flareSimStep(void);
// The duration (ns, before the time scale and the rank's clock factor, as a kernel's
// FLARE_SIM_COST_NANOS) of the next GEMM the calling thread launches through the simulated
// cuBLAS or cuBLASLt, in place of the cost model's (gemm_model.h); <= 0 clears it. For replays
// of recorded traces (src/sim/workload/trace_driver.py): a GEMM runs as long as the real library
// ran it, where the model's tiles-and-alignment figure can be 2x off (the real cuBLAS splits K).
void flareSimSetNextGemmNs(int64_t ns);
// This thread's duration set by flareSimSetNextGemmNs, cleared; 0 when none was set.
int64_t flareSimTakeNextGemmNs(void);
// This rank's fault factors (1.0 when not configured). The link factor includes the noise's
// per-rank link draw (src/sim/noise.h).
double flareSimClockFactor(void);
double flareSimLinkFactor(void);
// The noise's factor on the transfer time of collective `seq` of the communicator keyed `comm`:
// the same on every rank; 1.0 with FLARE_SIM_NOISE=0.
double flareSimCollectiveFactor(uint64_t comm, uint64_t seq);
// A key for `name` that every process computes alike (noise.h's nameHash), e.g. a
// communicator's for flareSimCollectiveFactor.
uint64_t flareSimNameKey(const char* name);
// Cost-model settings: "peak_tflops", "mem_bw_gbps", "busbw_gbps", "time_scale",
// "launch_latency_us", "first_launch_ms", "cold_gemm_ms". Returns 0 for an unknown name.
double flareSimSetting(const char* name);
// The step at which this rank hangs with `kind` ("collective", "compute", "skip"), or -1.
int64_t flareSimHangStep(const char* kind);
// Host noise (src/sim/noise.h): the factor this rank's host work of `step` at `site` (a small
// integer naming the place: 0 the C++ and Python workloads' DataLoader wait, 1 the PyTorch-like
// dataset's per-sample read) is multiplied by; 1.0 with FLARE_SIM_NOISE=0. Deterministic per
// FLARE_SIM_SEED, rank, step and site.
double flareSimHostFactor(int64_t step, int site);
// This rank's entry of the per-rank list in environment variable `var` ("RANKS:F1[:F2...],...",
// RANKS being N, A-B or '*'; src/common/rank_list.h, the one reader), for workloads that cannot
// link it (the Python ones): writes the entry's fields joined by ':' into `buf` (NUL-terminated,
// truncated to `len`) and returns their number, or -1 when no entry names this rank. Entries
// with a field count outside [min_fields, max_fields] are skipped with a warning. With
// `bare_is_every_rank`, a value without ':' is one field for every rank (the older form).
int flareSimRankEntry(const char* var, int min_fields, int max_fields, int bare_is_every_rank,
                      char* buf, size_t len);
// True once the process is exiting: blocking operations must return.
int flareSimShuttingDown(void);
// Blocks until *word != expected, a wake, or the timeout (ns, <0 = 100 ms). Works on words in
// memory shared between processes (a futex without FUTEX_PRIVATE_FLAG).
void flareSimWaitWord(const volatile uint32_t* word, uint32_t expected, int64_t timeout_ns);
// Wakes every waiter on `word` in any process.
void flareSimWakeWord(const volatile uint32_t* word);
// Sleeps until `deadline_ns` on the monotonic clock, or until shutdown.
void flareSimSleepUntil(int64_t deadline_ns);

// GPU activity reporting, for the simulated CUPTI (libcupti.so.13 in lib/sim, src/sim/cupti.cc).
// Kinds: FLARE_SIM_ACTIVITY_KERNEL (kernels, GEMMs, NCCL collectives), _MEMCPY, _MEMSET.
enum FlareSimActivityKind {
  FLARE_SIM_ACTIVITY_NONE = 0,
  FLARE_SIM_ACTIVITY_KERNEL = 1,
  FLARE_SIM_ACTIVITY_MEMCPY = 2,
  FLARE_SIM_ACTIVITY_MEMSET = 3,
};
typedef struct FlareSimActivity {
  int kind;          // FlareSimActivityKind
  const char* name;  // valid for the process lifetime (mangled kernel name, "memcpy")
  int64_t start_ns;  // simulated GPU times, CLOCK_MONOTONIC
  int64_t end_ns;
  uint32_t stream_id;  // the sim's stream id (0: a device's legacy stream)
  int32_t device;
  uint32_t correlation_id;  // per process, from 1, assigned when the op was issued
  uint64_t bytes;           // memcpy/memset
  uint32_t copy_kind;       // memcpy: CUPTI's CUpti_ActivityMemcpyKind value
  int64_t step;             // flareSimStep() when the op was issued
} FlareSimActivity;
typedef void (*FlareSimActivityFn)(const FlareSimActivity* activity);

// Ops issued while bit (1 << kind) of `kinds_mask` is set are passed to `fn` on the stream's
// worker thread once they complete (CUPTI's rule: records exist for work launched while the
// kind was enabled). `fn` = null or mask 0 stops reporting. Thread-safe.
void flareSimSetActivity(FlareSimActivityFn fn, uint32_t kinds_mask);

// The sim's own count of the ops of each kind issued during `step` (counts[kind], kind 1-3;
// counts[0] unused), captured or not, traced or not. Returns 0, or -1 for a step never seen.
// With FLARE_SIM_OP_COUNTS=DIR set, each process also writes them at exit to
// DIR/ops-<rank>-<pid>.json: {"<step>": [0, kernels, memcpys, memsets], ...}.
int flareSimOpCounts(int64_t step, uint64_t counts[4]);

#ifdef __cplusplus
}
#endif
