// 1-in-N timing: plain kernel launches per thread (FLARE_SAMPLE_KERNELS), the hook's cheapest
// exit; GEMMs, async copies and sets per (thread, signature) (FLARE_SAMPLE_CALLS,
// signatureTurn below).
//
// Why: on a real GPU the hook's per-op timing costs about 3 µs of host time per launch, mostly
// its CUDA event records (docs/benchmarks.md, "On a real GPU"): +43% on a launch-bound job
// whose budget is 2%. With N > 1 a launch that is not sampled costs a thread-local countdown,
// a re-entrancy guard and the call to the real function: no event, no CUDA query, no signature
// lookup.
//
// Which launches: the runtime's and the driver's plain kernel launches (cudaLaunchKernel[ExC],
// __cudaLaunchKernel, cudaLaunchCooperativeKernel and their _ptsz variants, cuLaunchKernel[Ex]
// and _ptsz), the only wrappers that call untimedLaunch(). cuBLAS/cuBLASLt GEMMs and async
// copies and sets are sampled per signature with their own N (FLARE_SAMPLE_CALLS, default 1:
// exact; signatureTurn): their signature is looked up first, so a timed call's weight counts
// calls of its own signature only, and a signature's count and FLOPs (a GEMM's shape is in its
// signature) stay exact up to its untimed tail. NCCL collectives, point-to-point, graph
// launches and synchronizations are timed every time.
//
// How: per launching thread, the first kWarmupLaunches launches are timed (weight 1: cold first
// launches and short-lived threads stay exact); then each timed launch draws the gap to the
// next one uniformly from 1 to 2N-1 (mean N; a per-thread xorshift seeded from the thread id and
// the clock), so a launch pattern with period N is not aliased. A timed launch's weight
// (OpInfo::weight) is the number of its thread's launches since the previous timed one, itself
// included: per thread the weights sum to the launches made (up to the untimed tail), and the
// estimate of a signature's count (sum of its weights) is unbiased. Consumers scale counts,
// durations, FLOPs and bytes by the weight (KernelRecord.weight, KernelSummary.sampled_ops).
//
// A sampled launch that the Tracer cannot time (stream capture, events exhausted, ring full)
// loses its weight, as every such launch is lost with N = 1 (counted in the drop counters, which
// then count sampled launches only).
//
// Threading: launching threads only; thread_local state, no locks, no allocation.
#pragma once

#include <cstdint>

#include "src/hook/thread_state.h"
#include "src/timing/step_sampling.h"
#include "src/timing/timing.h"

namespace flare::hook {

// Timed launches of a thread before sampling starts.
constexpr uint32_t kWarmupLaunches = 32;
// The largest N accepted for FLARE_SAMPLE_KERNELS (gaps stay below 2^16, OpInfo::weight).
constexpr int64_t kMaxSampleKernels = 1024;

// The launching thread's countdown; trivially constructible and destructible (no TLS guard),
// initial-exec TLS (FLARE_HOOK_TLS, thread_state.h).
struct LaunchSampler {
  int32_t countdown = 0;     // launches left up to and including the next timed one; <= 1: time it
  uint16_t next_weight = 1;  // the weight of that next timed launch
  // An op of this thread ran untimed since its last timed one (any sampled kind): the next timed
  // op carries timing::kOpAfterUntimed (timedCall).
  bool skipped = false;
  uint32_t timed = 0;  // timed launches of this thread so far (for the warm-up)
  uint64_t rng = 0;    // xorshift64 state; 0: not seeded
};
extern constinit thread_local LaunchSampler t_sampler FLARE_HOOK_TLS;

// Called first by a plain-kernel launch wrapper: true when this launch is not sampled, and the
// wrapper forwards it under a Guard. A launch made inside another intercepted call (depth > 0)
// never counts: it goes the timed path, which forwards it untouched, as with N = 1.
inline bool untimedLaunch() {
  if (t_depth != 0) return false;
  LaunchSampler& s = t_sampler;
  if (timing::stepsUntimed()) {  // a step sampled out (FLARE_SAMPLE_STEPS; step.cc)
    s.skipped = true;
    return true;
  }
  if (s.countdown <= 1) return false;
  --s.countdown;
  s.skipped = true;
  return true;
}

// The timed path: the weight of this launch, and the countdown to the next timed one
// (FLARE_SAMPLE_KERNELS is read at the first call of the process). Called only when the
// Tracer is up, on the launching thread.
uint16_t takeLaunchWeight();

// `op` with its weight set (the timed path of a plain-kernel launch).
inline timing::OpInfo sampledLaunch(timing::OpInfo op) {
  op.weight = takeLaunchWeight();
  return op;
}

// FLARE_SAMPLE_KERNELS as read (1 when unset or refused; one warning naming it).
int64_t sampleKernelsSetting();
// FLARE_SAMPLE_STEPS as read (1 when unset or refused; one warning naming it): step sampling
// (src/timing/step_sampling.h; the decisions: onStepBoundary, step.cc).
int64_t sampleStepsSetting();
// FLARE_TIMING_BUDGET_PCT as read: step sampling's K chosen per job from the measured timing
// cost (step.cc). Unset (or refused, one warning naming it): the declared default in summary mode
// when the job sets no other sampling and not FLARE_TIMING=end, else 0 (off).
double timingBudgetPct();
// Whether timingBudgetPct() is the default rather than the job's own setting.
bool timingBudgetByDefault();
// FLARE_SAMPLE_CALLS as read (1 when unset or refused; one warning naming it).
int64_t sampleCallsSetting();

// Calls of one signature timed before its sampling starts (a GEMM's cold first calls stay
// exact: unoptimized_gemm leaves them out by their own timing).
constexpr uint32_t kWarmupSignatureCalls = 8;
// Signature ids above this are always timed (the per-thread table stays below ~12 MB).
constexpr uint32_t kMaxSampledSignatureId = 1u << 20;

// Per-signature 1-in-N sampling of a GEMM, async copy or set whose signature is `signature_id`,
// on the calling thread: 0 when this call is not timed (forward it untouched), else its weight
// (the calls of this signature on this thread since its previous timed one, itself included).
// The same scheme as launches, per (thread, signature): the first kWarmupSignatureCalls calls
// timed, then one in a random gap of 1 to 2N-1 (N: FLARE_SAMPLE_CALLS). 1 always with N = 1.
uint16_t signatureTurn(uint32_t signature_id);

// Whether this is one of the first kWarmupSignatureCalls calls of `signature_id` on the calling
// thread (counted in every step; called only where step sampling was asked for, so that an exact
// job pays nothing): step sampling (FLARE_SAMPLE_STEPS) times these in a step it samples out too,
// so that a GEMM shape, copy or set that runs only in such steps is in the kernel summaries (weight
// 1: that step stands for itself). Shapes of every step are past it after the always-measured first
// steps.
bool signatureFirstCalls(uint32_t signature_id);

}  // namespace flare::hook
