// Implementation of config.h: the declaration table of every setting, the strict parsers and the
// once-per-(variable, value) warnings.
#include "src/common/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <set>
#include <string>

#include "src/common/log.h"

namespace flare::common {
namespace {

// The one declaration point of every setting (conventions.md #8). Keep each help text to one
// sentence: docs/configuration.md is generated from, or checked against, this table.
// Types: "int", "double", "bool", "string", "duration" (seconds, or a number with a unit
// suffix ns|us|ms|s|m|h), "ranks" (a rank list: 0,2,4-7 or *), "rank-list" (per-rank entries
// RANKS:FIELD[:FIELD...],..., RANKS being N, A-B or '*'); both parsed by src/common/rank_list.h.
constexpr ParamInfo kParams[] = {
    // --- log ---
    {"FLARE_LOG_LEVEL", "string", "info", "log",
     "Minimum level of Flare's own log lines: trace|debug|info|warn|error|off."},
    {"FLARE_LOG_SUBSYSTEMS", "string", "", "log",
     "Comma list of subsystems whose info/debug/trace lines are shown (empty = all, a leading ^ "
     "excludes the listed ones); warnings and errors are always shown."},
    // --- identity ---
    {"FLARE_JOB_ID", "string", "", "identity",
     "Overrides the job id taken from torchrun (TORCHELASTIC_RUN_ID) or Slurm (SLURM_JOB_ID). "
     "A job id is 1 to 128 of A-Z a-z 0-9 . _ - : @ (src/common/job_id.h, the rule of the hook, "
     "flared and `flare run`); other characters become _ with one warning."},
    // --- hook ---
    {"FLARE_DISABLE", "bool", "0", "hook",
     "Turns tracing off in libflare_hook.so: every wrapper forwards untouched."},
    {"FLARE_HOOK_DLSYM", "bool", "1", "hook",
     "The hook's dlsym hands out its wrappers for the driver's launch entry points "
     "(cuLaunchKernel, cuLaunchKernelEx, their _ptsz variants, cuGetProcAddress) looked up on a "
     "handle of libcuda, as Triton's launcher does; 0 (or FLARE_DISABLE) leaves dlsym exactly "
     "glibc's, and such launches unseen. Read once, at the first such lookup; an unreadable "
     "value means the default (x86-64 only)."},
    // --- exporter ---
    {"FLARE_OUTPUT_DIR", "string", "", "exporter",
     "Directory of the local spool (DIR/<job>/<rank>/records-<pid>.pb), used when no daemon is "
     "configured or it is unreachable; /tmp/flare-<uid> when unset. Folders Flare creates "
     "are 0700 and never followed through symlinks; a folder of another user is refused."},
    {"FLARE_DAEMON", "string", "", "exporter",
     "Address of the flared daemon as host:port; empty means write to FLARE_OUTPUT_DIR only."},
    {"FLARE_TOKEN", "string", "", "exporter",
     "Shared secret sent in the hello so that the daemon accepts this job's streams."},
    {"FLARE_EXPORTER_LIB", "string", "", "exporter",
     "Path of libflare_exporter.so (the gRPC transport, loaded only when FLARE_DAEMON is set); "
     "empty means the directory of libflare_hook.so."},
    {"FLARE_EXPORT_BUFFER_BYTES", "int", "8388608", "exporter",
     "Bound of the in-memory queue of batches waiting for the daemon; while it is unreachable, "
     "batches beyond half of it go to the spool, and beyond it their records are dropped "
     "(send_failed)."},
    {"FLARE_SPOOL_MAX_BYTES", "int", "1073741824", "exporter",
     "Bound of the spool of batches not yet sent (DIR/<job>/<rank>/pending-<pid>.pb); batches "
     "that do not fit lose their records (spool_dropped)."},
    {"FLARE_SPOOL_SWEEP", "bool", "1", "exporter",
     "Once streaming to the daemon, upload in the background the spools that ended processes "
     "left under FLARE_OUTPUT_DIR (pending-<pid>.pb with its .meta; each exactly once), as "
     "`flare upload --spool DIR` does by hand."},
    {"FLARE_EXPORT_RESEND_BYTES", "int", "16777216", "exporter",
     "The last batches written to a stream, up to this size, are kept in memory and sent again "
     "after the stream breaks (the daemon drops the duplicates): what a killed or wedged daemon "
     "had received but not processed; 0 turns re-sending off."},
    {"FLARE_MODE", "string", "summary with FLARE_DAEMON, else raw", "exporter",
     "summary: compute kernels (kernels, GEMMs, attention, memcpy/memset, graphs) leave as "
     "per-signature, per-stream KernelSummary clusters once a second and each step as one "
     "StepStats (GPU busy, T_inter, minority time, issue-latency sketch, host causes), while "
     "collectives, p2p, blocking syncs and step markers stay raw: what the detectors need, at "
     "2-3 KB per rank per step; raw: every timed op is sent as a KernelRecord (timelines, "
     "exports). Unset: summary when streaming to flared, raw for a local spool. The daemon's "
     "SetMode overrides it for a stream."},
    {"FLARE_TIMING", "string", "pair", "hook",
     "How a GPU op is timed: pair records a CUDA event before and after it; end records only the "
     "one after it and takes the op's start from the end of the op before it on its stream (its "
     "issue time on an idle stream), half the event cost per launch (docs/benchmarks.md, "
     "\"On a real GPU\"); experimental: work the hook does not see on that stream (Triton "
     "kernels) is then counted in the next op's duration."},
    {"FLARE_EVENT_GAP_CORRECTION", "bool", "1", "hook",
     "Pair timing: take the GPU time between two CUDA events queued back to back off each side "
     "of an op timed by a pair of events (the start event runs that long before the op's first "
     "GPU work, the end event that long after its last: ~1.3 us each on an H200, so a 50 us "
     "kernel read 6% long). Measured per device from the ops themselves (median of 64 "
     "readings, logged once); no correction before that. 0: durations are the raw event "
     "pair's."},
    {"FLARE_SAMPLE_KERNELS", "int", "1", "hook",
     "1-in-N timing of plain kernel launches (cudaLaunchKernel[ExC], __cudaLaunchKernel, "
     "cuLaunchKernel[Ex]) per launching thread, 1 to 1024: 1 times every launch; N > 1 times a "
     "thread's first 32 launches, then one launch in a random gap of 1 to 2N-1 (mean N), and "
     "each timed record carries the launches it stands for (its weight), so counts, GPU time, "
     "FLOPs and bytes are estimates and GPU busy, minority and void figures of a step come from "
     "the samples (docs/metrics.md); an untimed launch costs a thread-local countdown; GEMMs, "
     "copies and sets follow FLARE_SAMPLE_CALLS; collectives, graphs and syncs stay exact; "
     "FLARE_TIMING=end is then refused (pair is used). Off by default: fewer faults named on "
     "the simulated diagnosis matrix at N = 32 (docs/benchmarks.md)."},
    {"FLARE_SAMPLE_CALLS", "int", "1", "hook",
     "1-in-N timing of cuBLAS/cuBLASLt GEMMs, cudaMemcpyAsync and cudaMemsetAsync per (thread, "
     "signature), 1 to 1024: 1 times every call; N > 1 times a signature's first 8 calls on a "
     "thread, then one in a random gap of 1 to 2N-1 (mean N), each timed record weighted by the "
     "calls of its signature it stands for: a GEMM signature's count and FLOPs stay exact up to "
     "its untimed tail (< 2N calls per thread), its GPU time and a copy's bytes are estimates, "
     "TFLOPS and durations come from the timed calls; an untimed call costs its signature "
     "lookup; FLARE_TIMING=end is then refused (pair is used). Off by default (docs/metrics.md, "
     "docs/benchmarks.md)."},
    {"FLARE_SAMPLE_STEPS", "int", "1", "hook",
     "Step sampling in summary mode, 1 to 1024: 1 times every step; K > 1 times every op of the "
     "first 3 steps, then of one step in K on average (pseudo-random in the step index, the "
     "same steps on every rank of the job), and none of the kernels of the steps between (an "
     "untimed launch costs a flag load) and of their GEMMs, copies and sets only each "
     "signature's first 8 calls on a thread (a shape that runs in a few steps only keeps its "
     "exact count; an untimed call costs its signature lookup); collectives, graphs and syncs "
     "stay exact in every step. A measured step's figures "
     "are exact; a sampled-out step is sent with its times only (StepStats.sampled_out) and the "
     "detectors read the measured steps; kernel summaries weight a measured step's ops by the "
     "steps it stands for (counts, GPU time, FLOPs and bytes are estimates). Raw mode times "
     "every step; FLARE_TIMING=end is then refused (pair is used). Steps are DataLoader "
     "`__next__` calls or flare_step() markers: a job with neither is timed throughout."},
    {"FLARE_TIMING_BUDGET_PCT", "double", "0.5", "hook",
     "Step sampling by a budget, summary mode: the share of step time, in percent, that timing "
     "may cost (0 to 100; 0: off, every op of every step timed). Unset, the default applies in "
     "summary mode when the job sets none of FLARE_SAMPLE_STEPS, FLARE_SAMPLE_KERNELS, "
     "FLARE_SAMPLE_CALLS and not FLARE_TIMING=end (each a choice of how to time, kept as "
     "given); otherwise unset is 0. The hook measures what timing every op costs over the "
     "measured steps (the launching threads' own time in each timed op, event records included, "
     "plus the GPU time of the event records: one measured event gap each) and times one step "
     "in K, K the smallest power of 2 (at least FLARE_SAMPLE_STEPS, "
     "at most 1024) that keeps that cost within the budget, adjusted as the job runs; "
     "otherwise as FLARE_SAMPLE_STEPS; FLARE_TIMING=end is then refused (pair is used). Where "
     "timing every op costs less than the budget, every step is timed (K = 1). Set 0 for exact "
     "counts in every step (docs/metrics.md, 'Step sampling')."},
    {"FLARE_EXIT_FLUSH_SECONDS", "duration", "2", "exporter",
     "At process exit, time given to send queued batches to the daemon (a rank not connected "
     "then, e.g. in a backoff after a broken stream, makes one connection attempt at once "
     "within it); the rest is spooled."},
    {"FLARE_BATCH_BYTES", "int", "65536", "exporter",
     "Size bound of a batch: records are sent (or spooled) once a batch's encoded records reach "
     "about this many bytes (1 KiB to 64 MiB)."},
    {"FLARE_BATCH_INTERVAL_MS", "int", "1000", "exporter",
     "Time bound of a batch in milliseconds: what has completed is sent (or spooled) at least "
     "this often (10 to 3600000)."},
    {"FLARE_TLS_CA", "string", "", "exporter",
     "PEM file of the root certificate(s) that the daemon's certificate must verify against: "
     "set it to stream over TLS (the daemon runs with --tls-cert/--tls-key). Unreadable: one "
     "warning and records go to the spool, never in plaintext."},
    {"FLARE_TLS_CERT", "string", "", "exporter",
     "PEM client certificate chain presented to the daemon (with FLARE_TLS_KEY; for a daemon "
     "run with --tls-client-ca)."},
    {"FLARE_TLS_KEY", "string", "", "exporter", "PEM private key of FLARE_TLS_CERT."},
    {"FLARE_TLS_SERVER_NAME", "string", "", "exporter",
     "Name checked in the daemon's certificate instead of the host of FLARE_DAEMON (e.g. when "
     "FLARE_DAEMON is an IP address the certificate does not list)."},
    // --- hang ---
    {"FLARE_HANG_TIMEOUT", "duration", "300", "hang",
     "A rank reports a suspected hang to the daemon when the op at the head of a GPU stream has "
     "not completed within this many seconds (0 turns the rank's watchdog off)."},
    {"FLARE_HANG_TIMEOUT_OPS", "string", "", "hang",
     "Per-op overrides of FLARE_HANG_TIMEOUT as NAME=DURATION[,...], NAME an op name "
     "(ncclAllReduce, a kernel name) or, when no entry names the op, its class (collective, p2p, "
     "kernel, gemm, attention, memcpy, memset, graph), e.g. ncclAllReduce=30m,collective=900; "
     "a bad entry gives one warning naming it and is ignored."},
    {"FLARE_HANG_LEARN_FACTOR", "double", "4", "hang",
     "An op is stuck only after this many times the longest completed duration of its "
     "signature (long barriers learned from earlier instances); 0 learns nothing."},
    {"FLARE_HANG_KILL", "bool", "0", "hang",
     "Rank: accept the daemon's Exit command after a conclusive hang diagnosis (flared "
     "--hang-kill, on by default, sends it only to ranks that set this): the rank logs the "
     "reason, flushes its records (bounded) and exits with code 75. Unset: nothing is killed."},
    {"FLARE_CUDA_GDB_SCRIPT", "string", "", "hang",
     "The daemon's Inspect command runs cuda-gdb on the hung rank with this script "
     "(tools/cuda-gdb-scripts/flare_nccl_steps.py); unset: Inspect is answered only on the "
     "simulated NCCL."},
    // --- deeptrace ---
    {"FLARE_CUPTI_LIB", "string", "", "deeptrace",
     "The libcupti a deep trace dlopens; unset: libcupti.so.13, .so.12, .so, then "
     "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so. Nothing is loaded before the first deep "
     "trace."},
    {"FLARE_DEEP_TRACE", "string", "", "deeptrace",
     "FROM_STEP:N: capture every kernel, memcpy and memset with CUPTI for N steps from the "
     "FROM_STEP-th step marker (0-based), without a daemon (the records go to the spool)."},
    {"FLARE_DEEP_TRACE_BUFFERS", "int", "16", "deeptrace",
     "CUPTI activity buffers in the deep trace's fixed pool (2-4096); when all are in use CUPTI "
     "drops records and they are counted."},
    {"FLARE_DEEP_TRACE_BUFFER_BYTES", "int", "1048576", "deeptrace",
     "Size of each CUPTI activity buffer (4096 bytes to 256 MiB)."},
    {"FLARE_DEEP_TRACE_FLUSH_SECONDS", "duration", "5", "deeptrace",
     "After the last captured step, how long the deep trace keeps flushing CUPTI for records "
     "of work still running before a forced flush."},
    // --- pyprof ---
    {"TRACED_PYTHON_API", "string", "", "pyprof",
     "Extra Python APIs to trace, as a comma list of module.path@function, "
     "module.path.Class@method or module.path@Class.method (resolved when the module is "
     "imported; a bad entry gives one warning naming it)."},
    {"FLARE_PYTHON_DEFAULTS", "bool", "1", "pyprof",
     "Also trace the built-in list of Python APIs (GC, DataLoader __next__, "
     "torch.cuda/Event/Stream synchronize and waits, autograd backward, optimizer step, "
     "empty_cache, torch.save, Megatron forward_step/backward_step); see src/pyprof/README.md."},
    // --- sim (the simulated CUDA/cuBLAS/NCCL stack, src/sim) ---
    {"FLARE_SIM_CLOCK_FACTOR", "rank-list", "", "sim",
     "RANK:FACTOR[:FROM_STEP] entries: that rank's simulated GPU runs at FACTOR of nominal speed "
     "(from step FROM_STEP on: a fail-slow in the middle of the run)."},
    {"FLARE_SIM_LINK_FACTOR", "rank-list", "", "sim",
     "RANK:FACTOR entries: that rank's links run at FACTOR of nominal bandwidth."},
    {"FLARE_SIM_HOST_STALL", "rank-list", "", "sim",
     "RANK:MS[:EVERY_N_STEPS] entries: that rank's host thread stalls MS milliseconds (a GC-like "
     "pause) every N steps (default every step)."},
    {"FLARE_SIM_HANG", "rank-list", "", "sim",
     "RANK:KIND:STEP[:NRANKS] entries with KIND collective|compute|skip: that rank hangs at that "
     "step (collective with NRANKS: only on a communicator of that size)."},
    {"FLARE_SIM_CRASH", "rank-list", "", "sim",
     "RANK:STEP entries: that rank aborts at that step."},
    {"FLARE_SIM_OP_COUNTS", "string", "", "sim",
     "A directory: each simulated process writes its per-step counts of kernels, memcpys and "
     "memsets there at exit (ops-RANK-PID.json; the truth of the deep-trace tests)."},
    {"FLARE_SIM_CUPTI_BUSY", "rank-list", "", "sim",
     "RANKS:subscribe|enable entries (a bare value: every rank): the simulated libcupti of those "
     "ranks refuses cuptiSubscribe (another subscriber) or cuptiActivityEnable, as when "
     "torch.profiler or Nsight holds CUPTI."},
    {"FLARE_SIM_CUPTI_LOADED", "string", "", "sim",
     "A file the simulated libcupti appends its process id to when it is loaded (tests)."},
    {"FLARE_SIM_INJECT_SYNC", "rank-list", "", "sim",
     "RANKS:1 entries (a bare 1: every rank), Python workload (--python): those ranks call "
     "sim_train.injected_sync(), a cudaDeviceSynchronize through ctypes, at the start of each "
     "layer's forward (traced as sim_train@injected_sync)."},
    {"FLARE_SIM_INJECT_SYNC_US", "rank-list", "", "sim",
     "RANKS:US entries (a bare US: every rank), C++ workload: on those ranks each layer's forward "
     "starts with a cudaStreamSynchronize of the compute stream followed by US microseconds of "
     "host time (a sleep) before the next launch (a needless synchronize: the GPU idles while "
     "the host refills its queue); a negative US: off."},
    {"FLARE_SIM_PEAK_TFLOPS", "double", "400", "sim",
     "Dense bf16/fp16 tensor-core TFLOPS the simulated cost model uses."},
    {"FLARE_SIM_MEM_BW_GBPS", "double", "2000", "sim",
     "Device memory bandwidth in GB/s the simulated cost model uses."},
    {"FLARE_SIM_BUSBW_GBPS", "double", "100", "sim",
     "Bus bandwidth in GB/s of simulated collectives within one communicator."},
    {"FLARE_SIM_LAUNCH_LATENCY_US", "double", "4", "sim",
     "Host-side cost in microseconds of one simulated kernel launch."},
    {"FLARE_SIM_COMMAND_GAP_US", "double", "1.3", "sim",
     "GPU time in microseconds between two commands (kernels, copies, event records) queued "
     "back to back on one simulated stream; the default is what a real H200 took "
     "(docs/benchmarks.md), so an event pair reads an op ~2.6 us long, as there. 0: none."},
    {"FLARE_SIM_DEVICES", "int", "8", "sim",
     "Number of simulated GPUs per host (per simulated node: flare-sim-train's GROUP_RANK); "
     "its C++ workload puts rank r on device r % 8 % this, so fewer than 8 makes ranks share "
     "a GPU (one UUID)."},
    {"FLARE_SIM_DEVICE_NAME", "string", "Flare Simulated GPU", "sim",
     "Device name the simulated runtime reports (flared's peak table has an entry for the "
     "default, matching FLARE_SIM_PEAK_TFLOPS' default)."},
    {"FLARE_SIM_TIME_SCALE", "double", "1.0", "sim",
     "Multiplies every simulated duration (use < 1 to make tests faster)."},
    {"FLARE_SIM_FIRST_LAUNCH_MS", "rank-list", "", "sim",
     "RANKS:MS entries (a bare MS: every rank): host milliseconds the first launch of each "
     "kernel function takes inside the launch call, before the kernel is queued (the real "
     "stack's lazy module loading); unset or 0: off."},
    {"FLARE_SIM_COLD_GEMM_MS", "rank-list", "", "sim",
     "RANKS:MS entries (a bare MS: every rank): host milliseconds the first cuBLAS/cuBLASLt call "
     "of each GEMM shape takes before it launches (the real library's heuristics on a cold "
     "call); unset or 0: off."},
    {"FLARE_SIM_NOISE", "bool", "1", "sim",
     "The simulated GPU and host vary like real ones (kernel, step, rank and host jitter and "
     "host hiccups, calibrated on real H200 traces; link and collective jitter, assumed; "
     "src/sim/noise.h); 0: the exact cost model."},
    {"FLARE_SIM_SEED", "int", "1", "sim",
     "Seed of the simulator's noise: the same seed gives the same durations, another seed "
     "another run (every rank draws its own, from the seed and its rank)."},
    {"FLARE_SIM_KERNEL_JITTER", "double", "0.008", "sim",
     "Log-normal sigma (about the coefficient of variation) of each kernel launch's duration."},
    {"FLARE_SIM_STEP_JITTER", "double", "0.009", "sim",
     "Log-normal sigma of the factor every kernel of one rank's step shares."},
    {"FLARE_SIM_RANK_JITTER", "double", "0.005", "sim",
     "Log-normal sigma of each rank's speed for the whole run (GPUs of one model differ)."},
    {"FLARE_SIM_HOST_JITTER", "double", "0.05", "sim",
     "Log-normal sigma of the workloads' per-step host work (their DataLoader wait)."},
    {"FLARE_SIM_HICCUP_RATE", "double", "0.001", "sim",
     "Probability per kernel launch that the launching thread pauses first (a host hiccup)."},
    {"FLARE_SIM_HICCUP_US", "double", "80", "sim",
     "Mean microseconds of a host hiccup (exponentially distributed)."},
    {"FLARE_SIM_LINK_JITTER", "double", "0.01", "sim",
     "Log-normal sigma of each rank's network link bandwidth for the whole run (assumed, not "
     "calibrated: no multi-GPU fabric trace yet)."},
    {"FLARE_SIM_COLLECTIVE_JITTER", "double", "0.02", "sim",
     "Log-normal sigma of each collective call's transfer time, the same on every member "
     "(assumed, not calibrated: no multi-GPU fabric trace yet)."},
    {"FLARE_SIM_KERNEL_LOG", "string", "", "sim",
     "A directory: each simulated process writes every kernel duration the model gave there at "
     "exit (kernels-RANK-PID.tsv: step, name, n-th launch, ns; the truth of the noise tests)."},
    {"FLARE_SIM_RUN_ID", "string", "", "sim",
     "Set by flare-sim-train: names this run's shared-memory communicator segments."},
    {"FLARE_SIM_RDZV_DIR", "string", "/tmp", "sim",
     "Set by flare-sim-train: directory where the sim workload exchanges NCCL unique ids."},
    {"FLARE_SIM_LIB_DIR", "string", "", "sim",
     "Set by flare-sim-train: directory of the simulated libraries (the Python workload loads "
     "them from there)."},
};

// Identity of a warning already given, so that each (variable, value) warns once per process.
// Guarded by warnedMutex(). Both are heap objects that are never destroyed, so that a warning
// from another thread during exit does not touch a destroyed set.
std::mutex& warnedMutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::set<std::string, std::less<>>& warnedKeys() {
  static auto* s = new std::set<std::string, std::less<>>;
  return *s;
}

std::atomic<WarningSink> g_sink{nullptr};

void defaultSink(const std::string& line) {
  // The logger adds its own "[flare ...]" prefix; drop the "flare: " that the line carries for
  // sinks that print it bare.
  std::string_view msg = line;
  if (msg.starts_with("flare: ")) msg.remove_prefix(7);
  logMessage(LogLevel::kWarn, "config", msg);
}

std::string_view trim(std::string_view s) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Warns once per (name, value). The key holds both, separated by a byte no env value contains.
void warnOnce(const char* name, std::string_view value, const std::string& line) {
  std::string key;
  key.reserve(std::char_traits<char>::length(name) + 1 + value.size());
  key.append(name).push_back('\0');
  key.append(value);
  configWarningOnce(key, line);
}

// getenv() without allocation; empty counts as unset. Returns nullptr when unset.
const char* rawEnv(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && v[0] != '\0') ? v : nullptr;
}

}  // namespace

std::span<const ParamInfo> allParams() {
  return {kParams, std::size(kParams)};
}

const ParamInfo* findParam(std::string_view name) {
  for (const ParamInfo& p : kParams) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

const char* declaredDefault(std::string_view name) {
  const ParamInfo* p = findParam(name);
  return p == nullptr ? "" : p->default_value;
}

namespace {

// One warning (once per name) for a reader given a name without a usable declaration: a
// programming error that the table test and the callers' tests rule out.
void warnUndeclared(const char* name) {
  try {
    configWarningOnce(std::string(name) + '\0' + "<declared default>",
                      fmt::format("flare: {} has no declared default of its type in "
                                  "src/common/config.cc",
                                  name));
  } catch (...) {
  }
}

// The declared default of `name` parsed by `parse` (nullopt, with the warning, when `name` is
// not declared or its default does not parse).
template <typename Parse>
auto declaredValue(const char* name, Parse parse) {
  const ParamInfo* p = findParam(name);
  auto v = p == nullptr ? decltype(parse(std::string_view()))() : parse(p->default_value);
  if (!v) warnUndeclared(name);
  return v;
}

}  // namespace

int64_t paramInt(const char* name, int64_t min_value, int64_t max_value) {
  return envInt(name, declaredValue(name, parseInt).value_or(0), min_value, max_value);
}

double paramDouble(const char* name, double min_value, double max_value) {
  return envDouble(name, declaredValue(name, parseDouble).value_or(0.0), min_value, max_value);
}

bool paramBool(const char* name) {
  return envBool(name, declaredValue(name, parseBool).value_or(false));
}

std::string paramString(const char* name) {
  if (findParam(name) == nullptr) warnUndeclared(name);
  return envString(name, declaredDefault(name));
}

double paramDurationSeconds(const char* name, double min_value, double max_value) {
  return envDurationSeconds(name, declaredValue(name, parseDurationSeconds).value_or(0.0),
                            min_value, max_value);
}

std::optional<std::string> getEnv(const char* name) {
  const char* v = rawEnv(name);
  if (v == nullptr) return std::nullopt;
  try {
    return std::string(v);
  } catch (...) {
    return std::nullopt;
  }
}

void setWarningSink(WarningSink sink) {
  g_sink.store(sink, std::memory_order_release);
}

void configWarning(const std::string& line) {
  try {
    WarningSink sink = g_sink.load(std::memory_order_acquire);
    if (sink != nullptr) {
      sink(line);
    } else {
      defaultSink(line);
    }
  } catch (...) {
    // A failing sink must not take the caller down; there is nowhere left to report it.
  }
}

bool configWarningOnce(std::string_view key, const std::string& line) {
  try {
    {
      std::lock_guard<std::mutex> lock(warnedMutex());
      auto& keys = warnedKeys();
      if (keys.find(key) != keys.end()) return false;
      keys.emplace(key);
    }
    configWarning(line);
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<int64_t> parseInt(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (!s.empty() && s.front() == '-') return std::nullopt;  // "+-5"
  }
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parseDouble(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (!s.empty() && s.front() == '-') return std::nullopt;
  }
  if (s.empty()) return std::nullopt;
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  // from_chars reports overflow ("1e999") as result_out_of_range and accepts "inf"/"nan";
  // neither is a usable setting.
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parseBool(std::string_view s) {
  s = trim(s);
  for (std::string_view t : {"1", "true", "yes", "on"}) {
    if (equalsIgnoreCase(s, t)) return true;
  }
  for (std::string_view f : {"0", "false", "no", "off"}) {
    if (equalsIgnoreCase(s, f)) return false;
  }
  return std::nullopt;
}

std::optional<double> parseDurationSeconds(std::string_view s) {
  s = trim(s);
  struct Unit {
    std::string_view suffix;
    double seconds;
  };
  // Longer suffixes first so that "ms" is not read as "m" + "s".
  static constexpr Unit kUnits[] = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3},
                                    {"s", 1.0},   {"m", 60.0},  {"h", 3600.0}};
  double scale = 1.0;
  for (const Unit& u : kUnits) {
    if (s.size() > u.suffix.size() && s.ends_with(u.suffix)) {
      s.remove_suffix(u.suffix.size());
      scale = u.seconds;
      break;
    }
  }
  auto v = parseDouble(s);
  if (!v) return std::nullopt;
  double r = *v * scale;
  if (!std::isfinite(r)) return std::nullopt;
  return r;
}

namespace {

// The numeric readers: unset gives `def`; a value `parse` rejects, or one outside
// [min_value, max_value], warns once (naming it `what`, values followed by `unit`) and gives `def`.
template <typename T, typename Parse>
T envNumber(const char* name, T def, T min_value, T max_value, Parse parse, const char* what,
            const char* unit) {
  const char* raw = rawEnv(name);
  if (raw == nullptr) return def;
  auto v = parse(raw);
  try {
    if (!v) {
      warnOnce(name, raw,
               fmt::format("flare: {}='{}' is not {}; using {}{}", name, raw, what, def, unit));
      return def;
    }
    if (*v < min_value || *v > max_value) {
      warnOnce(name, raw,
               fmt::format("flare: {}='{}' is out of range [{}{}, {}{}]; using {}{}", name, raw,
                           min_value, unit, max_value, unit, def, unit));
      return def;
    }
  } catch (...) {
    return def;
  }
  return static_cast<T>(*v);
}

}  // namespace

int64_t envInt(const char* name, int64_t def, int64_t min_value, int64_t max_value) {
  return envNumber(name, def, min_value, max_value, parseInt, "an integer", "");
}

double envDouble(const char* name, double def, double min_value, double max_value) {
  return envNumber(name, def, min_value, max_value, parseDouble, "a number", "");
}

double envDurationSeconds(const char* name, double def, double min_value, double max_value) {
  return envNumber(name, def, min_value, max_value, parseDurationSeconds,
                   "a duration (seconds, or a number with a unit ns|us|ms|s|m|h)", "s");
}

bool envBool(const char* name, bool def) {
  const char* raw = rawEnv(name);
  if (raw == nullptr) return def;
  auto v = parseBool(raw);
  if (!v) {
    try {
      warnOnce(name, raw,
               fmt::format("flare: {}='{}' is not a boolean (1/0, true/false, yes/no, on/off); "
                           "using {}",
                           name, raw, def ? 1 : 0));
    } catch (...) {
    }
    return def;
  }
  return *v;
}

std::string envString(const char* name, const std::string& def) {
  const char* raw = rawEnv(name);
  try {
    return raw == nullptr ? def : std::string(raw);
  } catch (...) {
    return {};
  }
}

}  // namespace flare::common
