#include "src/timing/step_sampling.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "src/common/log.h"

namespace flare::timing {

std::atomic<bool> g_steps_untimed{false};

namespace {

std::atomic<bool> g_allowed{false};
std::mutex g_mu;
std::vector<StepDecision> g_pending;  // guarded by g_mu

}  // namespace

void setStepSamplingAllowed(bool allowed) {
  if (g_allowed.load(std::memory_order_relaxed) != allowed)
    g_allowed.store(allowed, std::memory_order_relaxed);
}

bool stepSamplingAllowed() {
  return g_allowed.load(std::memory_order_relaxed);
}

void recordStepDecision(const StepDecision& d) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_pending.size() >= kMaxPendingDecisions) [[unlikely]] {
    // Nobody took them for that many steps (the poller stalled): the steps they covered will
    // read as measured, their GPU figures as idle.
    g_pending.erase(g_pending.begin(), g_pending.begin() + kMaxPendingDecisions / 2);
    common::logOnce(common::LogLevel::kWarn, "timing", "step-decisions-dropped",
                    "flare: step sampling: {} step decisions were not taken by the timing thread "
                    "and the oldest {} were dropped; those steps' GPU figures are not to be "
                    "trusted (logged once)",
                    kMaxPendingDecisions, kMaxPendingDecisions / 2);
  }
  g_pending.push_back(d);
}

std::vector<StepDecision> takeStepDecisions() {
  std::lock_guard<std::mutex> lock(g_mu);
  return std::exchange(g_pending, {});
}

namespace {

// The first decision after `t` (upper bound by boundary).
std::vector<StepDecision>::const_iterator firstAfter(const std::vector<StepDecision>& v,
                                                     int64_t t) {
  return std::upper_bound(v.begin(), v.end(), t,
                          [](int64_t x, const StepDecision& d) { return x < d.boundary_ns; });
}

// The decision in force at `t`: the latest at or before it; nullptr before the first.
const StepDecision* inForce(const std::vector<StepDecision>& v, int64_t t) {
  auto it = firstAfter(v, t);
  return it == v.begin() ? nullptr : &*std::prev(it);
}

}  // namespace

uint32_t stepsForBudget(double cost_fraction, double budget_pct, uint32_t k_min) {
  uint32_t k = 1;
  while (k < k_min && k < kMaxSampleSteps) k *= 2;
  if (!(budget_pct > 0) || !(cost_fraction > 0)) return k;  // NaN too: the floor
  const double want = cost_fraction * 100.0 / budget_pct;
  while (k < want && k < kMaxSampleSteps) k *= 2;
  return k;
}

void TimingCostEstimate::addStep(double host_fraction, double gpu_fraction) {
  host_[steps_ % kHostWindow] = host_fraction;
  ++steps_;
  gpu_ = gpu_ < 0 ? gpu_fraction : 0.7 * gpu_ + 0.3 * gpu_fraction;
}

double TimingCostEstimate::hostFraction() const {
  const size_t n = std::min(steps_, kHostWindow);
  if (n == 0) return 0;
  return *std::min_element(host_, host_ + n);
}

uint32_t nextStepsForBudget(double cost_fraction, double budget_pct, uint32_t k_min,
                            uint32_t current) {
  const uint32_t k = stepsForBudget(cost_fraction, budget_pct, k_min);
  if (current == 0 || k >= current) return k;
  return std::min(current, stepsForBudget(cost_fraction * kBudgetLowerMargin, budget_pct, k_min));
}

void StepDecisions::add(std::vector<StepDecision> decisions) {
  for (const StepDecision& d : decisions) {
    // Boundary order (one step rule meets them in order; an older one is put in its place).
    if (!decisions_.empty() && d.boundary_ns < decisions_.back().boundary_ns) {
      decisions_.insert(firstAfter(decisions_, d.boundary_ns), d);
      continue;
    }
    decisions_.push_back(d);
  }
}

bool StepDecisions::measured(int64_t start_ns, int64_t end_ns) const {
  const StepDecision* at = inForce(decisions_, start_ns);
  if (at != nullptr && !at->measured) return false;
  for (auto it = firstAfter(decisions_, start_ns);
       it != decisions_.end() && it->boundary_ns < end_ns; ++it) {
    if (!it->measured) return false;
  }
  return true;
}

uint32_t StepDecisions::weightAt(int64_t issue_ns) const {
  const StepDecision* at = inForce(decisions_, issue_ns);
  if (at == nullptr || !at->measured) return 1;
  return std::max<uint32_t>(at->weight, 1);
}

void StepDecisions::forgetBefore(int64_t before_ns) {
  auto it = firstAfter(decisions_, before_ns);
  if (it == decisions_.begin()) return;
  decisions_.erase(decisions_.begin(), std::prev(it));  // the one in force at before_ns stays
}

}  // namespace flare::timing
