// The simulated GPU: devices, streams, events, kernels, graphs and the cost model.
//
// Compiled into the simulated libcuda.so.1 only; the driver API in cuda_driver.cc is a thin
// C layer over these types. Every other simulated library reaches them through the driver
// API or flare_sim.h.
//
// Model: each stream is a worker thread that executes queued operations in order. Each
// operation has a simulated GPU start time, start = max(end of the previous operation,
// host issue time + launch latency), and an end time from the cost model; the worker sleeps
// (never spins) until the end time, then marks the operation complete. Events take the time
// the stream reaches them. Because times are computed, not measured, a loaded machine delays
// only when results become visible, not the timestamps themselves.
//
// Threads: API calls come from any application thread; each stream's worker runs the ops.
// All shared state is guarded by the mutexes noted on each member.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/sim/flare_sim.h"
#include "src/sim/noise.h"

namespace flare::sim {

using Ns = int64_t;

// Process-wide settings from FLARE_SIM_* (read once).
struct Settings {
  int rank = 0;
  int devices = 8;
  std::string device_name;
  double peak_tflops = 400;
  double mem_bw_gbps = 2000;
  double busbw_gbps = 100;
  double launch_latency_us = 4;
  double command_gap_us = 0;  // FLARE_SIM_COMMAND_GAP_US: between back-to-back commands
  double time_scale = 1.0;
  double clock_factor = 1.0;    // this rank
  int64_t clock_from_step = 0;  // the step the clock factor starts at (FLARE_SIM_CLOCK_FACTOR)
  double link_factor = 1.0;     // this rank
  int64_t hang_collective_step = -1;
  int hang_collective_nranks = 0;  // FLARE_SIM_HANG RANK:collective:STEP:NRANKS (0: any)
  int64_t hang_compute_step = -1;
  int64_t hang_skip_step = -1;
  // Cold-start costs of the real stack (lazy module loading, cuBLAS heuristics), paid on the
  // launching thread inside the launch call: the first launch of each kernel function
  // (FLARE_SIM_FIRST_LAUNCH_MS) and the first cuBLAS/cuBLASLt call of each GEMM shape
  // (FLARE_SIM_COLD_GEMM_MS, gemm_model.cc).
  double first_launch_ms = 0;
  double cold_gemm_ms = 0;
  // How this GPU and its host vary (FLARE_SIM_NOISE, FLARE_SIM_SEED, FLARE_SIM_*_JITTER,
  // FLARE_SIM_HICCUP_*; noise.h), and where every kernel duration is logged (FLARE_SIM_KERNEL_LOG).
  NoiseParams noise;
  std::string kernel_log;
};
const Settings& settings();
// This rank's noise (settings().noise, settings().rank).
const Noise& noise();

// State of one event, shared with the operations that record or wait on it (an event may be
// destroyed while a record is still queued, as in CUDA).
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // guarded by mu: records issued
  uint64_t completed = 0;  // guarded by mu: records the stream has reached
  Ns timestamp = 0;        // guarded by mu: time of the last completed record
  bool timing = true;
};

// One queued operation.
struct Op {
  enum class Kind { kKernel, kRecord, kWait, kCustom, kHostFn, kCopy };
  Kind kind = Kind::kKernel;
  const char* name = "";  // static or owned by a Function: valid for the process lifetime
  Ns issue_ns = 0;        // host time the API call issued it
  Ns duration_ns = 0;     // kKernel, kCopy
  bool hang = false;      // kKernel: never completes (injected fault)
  std::shared_ptr<EventState> event;  // kRecord, kWait
  uint64_t event_seq = 0;             // kRecord: which record; kWait: the record waited for
  std::shared_ptr<void> ctx;          // kCustom (freed through its deleter)
  FlareSimOpFn custom = nullptr;      // kCustom
  std::function<void()> host;         // kHostFn, kCopy (the copy itself)
  // GPU activity (flareSimSetActivity): what CUPTI would call this op, set by its maker.
  int activity = FLARE_SIM_ACTIVITY_NONE;
  uint64_t bytes = 0;      // memcpy/memset
  uint32_t copy_kind = 0;  // memcpy: CUpti_ActivityMemcpyKind
  // Set by enqueue(): reported when complete (the kind was enabled when it was issued).
  bool report = false;
  uint32_t correlation_id = 0;
  int64_t step = 0;
};

// Activity bookkeeping done by enqueue() and the workers.
void noteIssued(Op& op, int device);
void reportActivity(const Op& op, const CUstream_st* s, Ns start, Ns end);

}  // namespace flare::sim

// The driver's opaque handle types are defined here: the sim owns their layout.
struct CUstream_st {
  int device = 0;
  unsigned flags = 0;
  int priority = 0;
  uint64_t id = 0;
  std::mutex mu;
  std::condition_variable work_cv;   // worker waits for ops
  std::condition_variable done_cv;   // synchronize waits for completions
  std::deque<flare::sim::Op> queue;  // guarded by mu
  uint64_t enqueued = 0;             // guarded by mu
  uint64_t completed = 0;            // guarded by mu
  bool destroyed = false;            // guarded by mu
  bool capturing = false;            // guarded by mu
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id capture_thread;        // guarded by mu: the thread that began the capture
  bool capture_invalidated = false;      // guarded by mu: a prohibited call broke the capture
  std::vector<flare::sim::Op> captured;  // guarded by mu
  flare::sim::Ns last_end = 0;           // worker thread only
};

struct CUevent_st {
  std::shared_ptr<flare::sim::EventState> state;
  unsigned flags = 0;
};

struct CUfunc_st {
  std::string name;
  CUmod_st* module = nullptr;
  std::atomic<int> cost_kind{-1};  // resolved on first launch from the cost registry
  std::atomic<int> cost_arg{0};
  std::atomic<bool> launched{false};  // FLARE_SIM_FIRST_LAUNCH_MS: the first launch was paid
  std::atomic<uint64_t> launches{0};  // launches so far: which draw of the noise each one takes
  // A CUkernel of a library (cuLibraryGetKernel), launched as a CUfunction the way CUDA 12+
  // allows: cuKernelGetName names it, cuFuncGetName refuses it (CUDA_ERROR_INVALID_HANDLE).
  bool library_kernel = false;
};

struct CUmod_st {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<CUfunc_st>> functions;  // guarded by mu
};

// A library (cuLibraryLoadData): its kernels are created by name on first lookup, as a module's.
struct CUlib_st {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<CUfunc_st>> kernels;  // guarded by mu
};

struct CUgraph_st {
  std::vector<flare::sim::Op> ops;
};

struct CUgraphExec_st {
  std::vector<flare::sim::Op> ops;
};

struct CUctx_st {
  int device = 0;
};

namespace flare::sim {

Ns nowNs();
bool shuttingDown();

// Streams. `nullptr`/CU_STREAM_LEGACY map to the device's legacy stream and
// CU_STREAM_PER_THREAD to the calling thread's stream. Never returns null.
CUstream_st* resolveStream(CUstream stream);
CUstream_st* createStream(unsigned flags, int priority);
void destroyStream(CUstream_st* s);
// Enqueues `op` (or appends it to the capture). Returns CUDA_SUCCESS.
CUresult enqueue(CUstream_st* s, Op op);
// Blocks until every op enqueued before the call completed.
CUresult synchronizeStream(CUstream_st* s);
bool streamIdle(CUstream_st* s);
CUresult synchronizeDevice();

// Events.
CUresult recordEvent(CUevent_st* e, CUstream_st* s);
CUresult waitEvent(CUstream_st* s, CUevent_st* e);
CUresult queryEvent(CUevent_st* e);
CUresult synchronizeEvent(CUevent_st* e);
CUresult elapsedMs(float* ms, CUevent_st* start, CUevent_st* end);

// Kernels: duration from the cost model for `f` launched with this geometry and params.
Ns kernelDuration(CUfunc_st* f, uint64_t threads, void** params);
CUresult launchKernel(CUfunc_st* f, uint64_t threads, CUstream stream, void** params);
void registerKernelCost(const std::string& name, int kind, int arg_index);

// Current device of the calling thread.
int currentDevice();
void setCurrentDevice(int device);

// Capture and graphs.
CUresult beginCapture(CUstream_st* s, CUstreamCaptureMode mode);
// An invalidated capture ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph.
CUresult endCapture(CUstream_st* s, CUgraph_st** graph);
bool isCapturing(CUstream_st* s);
CUstreamCaptureStatus captureStatus(CUstream_st* s);
// The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode): swaps
// *mode with it. Every thread starts in global mode.
CUresult exchangeCaptureMode(CUstreamCaptureMode* mode);
// The rule for "potentially unsafe" calls (event query and synchronize, stream and device
// synchronize), as CUDA applies it: a thread that is not in relaxed mode may not make one while
// it has a capture of its own that was not begun in relaxed mode, nor, in global mode, while
// another thread has a capture begun in global mode. Such a call returns
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures it conflicts with (a
// background thread's event query broke PyTorch's torch.cuda.graph capture under the hook on an
// H200, 2026-11-27, until the hook's timing thread went relaxed).
CUresult checkUnsafeCall();
CUresult launchGraph(CUgraphExec_st* exec, CUstream_st* s);

// The sticky per-thread last error is a runtime concept (cudart); the driver has none.

}  // namespace flare::sim
