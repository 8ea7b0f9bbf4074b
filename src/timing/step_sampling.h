// Step sampling (FLARE_SAMPLE_STEPS=K, MODE_SUMMARY only): every op of one training step in K
// (on average) is timed, and none of the others. The per-step figures of a measured step are
// exact (every op of it timed, no bias from which ops were sampled); the steps in between cost
// the hook the untimed path of every launch (a flag load, no event, no signature lookup).
//
// The decision is made at each step boundary on the thread that meets it (the DataLoader
// `__next__` that starts a step, or flare_step()), by src/hook/step_sampling.cc, which sets the
// process-wide flag the launch wrappers read (stepsUntimed()) and records the decision here.
// The BatchBuilder, on the poller thread, takes the decisions (takeStepDecisions) to tell a
// measured step from one sampled out (StepStats.sampled_out) and to weight the ops of a measured
// step in the kernel summaries (the steps it stands for: counts, GPU time, FLOPs and bytes are
// then estimates, as with FLARE_SAMPLE_KERNELS).
//
// Threading: recordStepDecision on any thread (a mutex, once per step); takeStepDecisions on the
// poller thread; the flag is a relaxed atomic.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "src/timing/timing.h"

namespace flare::timing {

// The decision taken at one step boundary (CLOCK_MONOTONIC ns): whether the step that starts
// there is timed, and if so the steps it stands for (itself and the sampled-out ones since the
// previous measured step).
struct StepDecision {
  int64_t boundary_ns = 0;
  bool measured = true;
  uint32_t weight = 1;  // measured steps: >= 1
};

// The op kinds that step sampling leaves untimed in a sampled-out step: plain kernels (and
// attention kernels, launched as kernels), GEMMs, async copies and sets. Collectives, p2p, graph
// launches and synchronizations are timed in every step (bus bandwidth, hang analysis).
inline bool stepSampledKind(OpKind kind) {
  return kind == OpKind::kKernel || kind == OpKind::kGemm || kind == OpKind::kAttention ||
         kind == OpKind::kMemcpy || kind == OpKind::kMemset;
}

// True while the current step is sampled out: the launch wrappers forward the step-sampled kinds
// untimed. Written by the hook at step boundaries.
extern std::atomic<bool> g_steps_untimed;
inline bool stepsUntimed() {
  return g_steps_untimed.load(std::memory_order_relaxed);
}

// Whether the BatchBuilder summarizes (MODE_SUMMARY) right now: step sampling applies only then
// (raw mode's records must hold every op of a step). Set by the BatchBuilder.
void setStepSamplingAllowed(bool allowed);
bool stepSamplingAllowed();

// Appends a decision (kept in order of the calls; at most kMaxPendingDecisions wait, the oldest
// are dropped beyond that).
void recordStepDecision(const StepDecision& d);
// The decisions recorded since the previous call.
std::vector<StepDecision> takeStepDecisions();
constexpr size_t kMaxPendingDecisions = 1 << 14;

// The largest K of step sampling (FLARE_SAMPLE_STEPS, and the K a timing budget may choose).
constexpr uint32_t kMaxSampleSteps = 1024;

// Step sampling by a timing budget (FLARE_TIMING_BUDGET_PCT): the K that keeps the timing cost
// within `budget_pct` percent of the step time, when timing every op costs `cost_fraction` of a
// measured step's time: the smallest power of 2 at least cost / budget, at least `k_min`
// (rounded up to a power of 2), at most kMaxSampleSteps. Powers of 2 nest: a step that a rank
// at K = 2^j measures, every rank at a smaller K measures too (the selection is a hash of the
// step index modulo K), so ranks that chose different K still share their measured steps.
uint32_t stepsForBudget(double cost_fraction, double budget_pct, uint32_t k_min);

// The next K of a budget in force at `current` (0: none chosen yet): it rises at once to
// stepsForBudget's (a budget is a ceiling) and falls only as far as a cost kBudgetLowerMargin
// times higher would allow, so that a cost near the boundary between two K does not flip
// between them every few steps (gpt-small on an H200, 2026-11-28: 13-17% for a 0.5% budget,
// K 32 and 64 in turn, six choices in 30 s).
constexpr double kBudgetLowerMargin = 1.25;
uint32_t nextStepsForBudget(double cost_fraction, double budget_pct, uint32_t k_min,
                            uint32_t current);

// The timing budget's estimate of what timing every op costs, from the measured steps: the
// launching threads' time in the Tracer and the GPU time of the event records, each as a share
// of the step. The host share is the least of the last kHostWindow steps': the launching
// threads' time is wall time, which a thread preempted inside the Tracer inflates (never
// deflates), so that one step read on a loaded host (2026-11-28, four simulated ranks on two
// cores: 0.30%, 0.32%, 2.19% and 8.98% for the same job, K 1 to 32) does not set K. The GPU
// share is a moving average (weight 0.3 to the newest). ready() after kMinSteps steps.
class TimingCostEstimate {
 public:
  static constexpr size_t kHostWindow = 4;
  static constexpr size_t kMinSteps = 2;
  void addStep(double host_fraction, double gpu_fraction);
  bool ready() const { return steps_ >= kMinSteps; }
  double hostFraction() const;
  double gpuFraction() const { return gpu_ < 0 ? 0 : gpu_; }

 private:
  double host_[kHostWindow] = {};
  size_t steps_ = 0;
  double gpu_ = -1;
};

// The poller-side view of the decisions: which steps were measured, and the weight of an op.
// Not thread-safe (the BatchBuilder's).
class StepDecisions {
 public:
  void add(std::vector<StepDecision> decisions);
  bool empty() const { return decisions_.empty(); }
  // True when every part of [start_ns, end_ns) was in a measured step (or no decision covers
  // it: before the first decision, everything is timed).
  bool measured(int64_t start_ns, int64_t end_ns) const;
  // The decision in force at `t` (the latest at or before it); nullptr before the first.
  const StepDecision* inForceAt(int64_t t) const;
  // Forgets decisions superseded before `before_ns` (the latest one at or before it is kept).
  void forgetBefore(int64_t before_ns);
  size_t size() const { return decisions_.size(); }

 private:
  std::vector<StepDecision> decisions_;  // boundary order
};

// Which ops stand for the steps sampled out, and for how many. The decision at the last boundary
// a process meets governs what runs after it, which may be no step (after the DataLoader's
// StopIteration, the code after the loop) or the loop's last step (flare_step() at each step's
// start). So a measured step stands for the sampled-out steps before it only once the next
// boundary confirms it a step; until then its ops count once and are kept (at the next boundary
// they are added again for the steps before it). At the last flush the sampled-out steps that no
// confirmed measured step stands for (those before a measured last boundary, or after the last
// measured step; the last boundary's own when lastIsStep()) are stood for by the last confirmed
// measured step: its kept ops, added once more for those steps, moved to the first of them (after
// every window already sent).
//
// A signature's first calls on a thread are timed in a sampled-out step too (the hook:
// signatureFirstCalls) and count once each: they are credited to their signature, and the
// measured step that stands for their steps adds only what the credit does not already hold (its
// calls times the steps, less the credit), so that a shape whose first calls ran into a
// sampled-out step is not counted twice there.
//
// Without it (2026-11-28): a job that ended in sampled-out steps had them missing from the kernel
// summaries (the clean-checkout CI's 6-step job lost half its kernels, so its issue-latency
// regression named cudaStreamWaitEvent, counted in every step, rather than the
// cudaDeviceSynchronize it injected); a measured last boundary multiplied the ops after the loop by
// its weight; the pytorch-like job's GEMMs came out 0.5% over (a shape's 7th and 8th calls, in
// the first sampled-out step, counted twice).
//
// Keeps the ops of the step-sampled kinds (not a signature's first calls, which stand for
// themselves) of two steps, at most kMaxOps each: beyond it, an unconfirmed step's ops are counted
// as if confirmed, and the tail is not added (complete() false; the BatchBuilder says so once).
// Not thread-safe (the BatchBuilder's).
class MeasuredStepOps {
 public:
  static constexpr size_t kMaxOps = size_t{1} << 17;  // ~7 MB at most per step, reused
  // A decision the hook took, as pulled. When it confirms the latest measured step, that step's
  // ops counted once so far go to `add_now`, weighted for the sampled-out steps before it.
  void noteDecision(const StepDecision& d, std::vector<CompletedOp>* add_now);
  // An op of a step-sampled kind (not a first call) with the decision in force at its issue: the
  // weight it is added with now (its own in a sampled-out step or a measured step not confirmed
  // yet; in a confirmed one, the rest too, less the credit of its signature).
  uint64_t offer(const CompletedOp& op, const StepDecision* in_force);
  // A signature's first call (kOpFirstCalls) with the decision in force at its issue: credited
  // when that step was sampled out.
  void credit(const CompletedOp& op, const StepDecision* in_force);
  // An op timed in every step (a collective, p2p, graph launch or synchronization other than the
  // step marker), with the decision in force at its issue: counted per step, to tell whether what
  // follows the last boundary is a step (lastIsStep()).
  void noteEveryStepOp(const StepDecision* in_force);
  // Whether the last boundary, sampled out, started a step (a loop whose flare_step() or
  // next(loader) comes at each step's start) rather than what follows a loop (the DataLoader's
  // StopIteration, a loop that breaks after its last batch): it issued at least half as many of
  // the ops timed in every step as the last confirmed measured step did. Without any such op in
  // that step (one GPU, no synchronization), no.
  bool lastIsStep() const;
  // The last flush: the sampled-out steps no confirmed measured step stands for, and the last
  // confirmed measured step's ops standing for them (less their credit). Call tailOps() once.
  uint32_t tailSteps() const;
  std::vector<CompletedOp> tailOps();
  bool complete() const { return !confirmed_.overflow; }
  size_t keptOps() const { return confirmed_.ops.size() + latest_.ops.size(); }
  void reset() { *this = MeasuredStepOps(); }

 private:
  struct Kept {
    uint64_t flops = 0, bytes = 0, stream_id = 0;
    int64_t start_ns = 0, end_ns = 0;  // from the step's boundary
    uint32_t signature_id = 0;
    int32_t device = 0;
    uint16_t weight = 1;
    OpKind kind = OpKind::kKernel;
  };
  struct Step {
    bool any = false;
    StepDecision decision;
    int64_t previous_measured_ns = INT64_MIN;  // the measured boundary before it
    std::vector<Kept> ops;
    bool overflow = false;
    bool keep(const CompletedOp& op);  // false when full
  };
  // Takes up to `want` of `signature`'s credit from the sampled-out steps in (after_ns, before_ns).
  uint64_t takeCredit(uint32_t signature, int64_t after_ns, int64_t before_ns, uint64_t want);
  static CompletedOp restore(const Kept& k, int64_t at_ns, uint64_t weight);
  Step confirmed_;                 // the last measured step a later boundary confirmed
  Step latest_;                    // the measured step at the latest boundary, not confirmed yet
  int64_t latest_ns_ = INT64_MIN;  // the latest boundary pulled (INT64_MIN: none yet)
  uint32_t after_confirmed_ = 0;   // boundaries pulled after confirmed_'s
  int64_t first_after_ns_ = 0;     // the first of them
  // Sampled-out step's boundary → signature → first calls timed in it (few: first calls end).
  std::map<int64_t, std::unordered_map<uint32_t, uint64_t>> credits_;
  // Step's boundary → ops timed in every step issued in it (from the confirmed step on).
  std::map<int64_t, uint64_t> every_step_ops_;
};

}  // namespace flare::timing
