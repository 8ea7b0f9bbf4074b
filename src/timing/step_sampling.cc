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

const StepDecision* StepDecisions::inForceAt(int64_t t) const {
  return inForce(decisions_, t);
}

bool MeasuredStepOps::Step::keep(const CompletedOp& op) {
  if (ops.size() >= kMaxOps) {
    overflow = true;
    return false;
  }
  Kept k;
  k.flops = op.info.flops;
  k.bytes = op.info.bytes;
  k.stream_id = op.stream_id;
  k.start_ns = op.start_ns - decision.boundary_ns;
  k.end_ns = op.end_ns - decision.boundary_ns;
  k.signature_id = op.info.signature_id;
  k.device = op.device;
  k.weight = op.info.weight;
  k.kind = op.info.kind;
  ops.push_back(k);
  return true;
}

CompletedOp MeasuredStepOps::restore(const Kept& k, int64_t at_ns, uint64_t weight) {
  CompletedOp op;
  op.info.signature_id = k.signature_id;
  op.info.kind = k.kind;
  op.info.flops = k.flops;
  op.info.bytes = k.bytes;
  op.info.weight = static_cast<uint16_t>(std::min<uint64_t>(weight, UINT16_MAX));
  op.stream_id = k.stream_id;
  op.device = k.device;
  op.start_ns = at_ns + k.start_ns;
  op.end_ns = at_ns + k.end_ns;
  op.issue_ns = op.start_ns;
  return op;
}

uint64_t MeasuredStepOps::takeCredit(uint32_t signature, int64_t after_ns, int64_t before_ns,
                                     uint64_t want) {
  uint64_t taken = 0;
  for (auto it = credits_.upper_bound(after_ns);
       it != credits_.end() && it->first < before_ns && taken < want; ++it) {
    auto c = it->second.find(signature);
    if (c == it->second.end()) continue;
    const uint64_t take = std::min(c->second, want - taken);
    c->second -= take;
    taken += take;
  }
  return taken;
}

void MeasuredStepOps::credit(const CompletedOp& op, const StepDecision* in_force) {
  if (in_force == nullptr || in_force->measured) return;
  // Credits of steps older than the confirmed step's gap are of no use any more.
  if (confirmed_.any && in_force->boundary_ns <= confirmed_.previous_measured_ns) return;
  credits_[in_force->boundary_ns][op.info.signature_id] += std::max<uint16_t>(op.info.weight, 1);
}

void MeasuredStepOps::noteDecision(const StepDecision& d, std::vector<CompletedOp>* add_now) {
  if (latest_ns_ != INT64_MIN && d.boundary_ns <= latest_ns_) {
    // Pulled out of order (an older boundary): one more step after the confirmed one, if after it.
    if (confirmed_.any && d.boundary_ns > confirmed_.decision.boundary_ns) {
      first_after_ns_ =
          after_confirmed_++ == 0 ? d.boundary_ns : std::min(first_after_ns_, d.boundary_ns);
    }
    return;
  }
  if (latest_.any) {  // this boundary confirms the latest measured step
    const int64_t at = latest_.decision.boundary_ns;
    const uint64_t more = std::max<uint32_t>(latest_.decision.weight, 1) - 1;
    for (const Kept& k : latest_.ops) {
      const uint64_t want = more * std::max<uint16_t>(k.weight, 1);
      const uint64_t rest =
          want - takeCredit(k.signature_id, latest_.previous_measured_ns, at, want);
      if (rest > 0) add_now->push_back(restore(k, at, rest));
    }
    confirmed_ = std::move(latest_);
    latest_ = Step();
    after_confirmed_ = 0;
    // The credits of the gaps before the confirmed step's are spent.
    credits_.erase(credits_.begin(), credits_.upper_bound(confirmed_.previous_measured_ns));
    every_step_ops_.erase(every_step_ops_.begin(),
                          every_step_ops_.lower_bound(confirmed_.decision.boundary_ns));
  }
  latest_ns_ = d.boundary_ns;
  if (confirmed_.any && after_confirmed_++ == 0) first_after_ns_ = d.boundary_ns;
  if (d.measured) {
    // The measured boundary before it: the confirmed step's (latest_ is empty here).
    latest_.any = true;
    latest_.decision = d;
    latest_.previous_measured_ns = confirmed_.any ? confirmed_.decision.boundary_ns : INT64_MIN;
  }
}

uint64_t MeasuredStepOps::offer(const CompletedOp& op, const StepDecision* in_force) {
  const uint64_t own = std::max<uint16_t>(op.info.weight, 1);
  if (in_force == nullptr || !in_force->measured) return own;
  const uint64_t more = (std::max<uint32_t>(in_force->weight, 1) - 1) * own;
  Step* step = latest_.any && in_force->boundary_ns == latest_.decision.boundary_ns ? &latest_
               : confirmed_.any && in_force->boundary_ns == confirmed_.decision.boundary_ns
                   ? &confirmed_
                   : nullptr;
  if (step == nullptr) return own + more;  // an older step's, late
  // Not confirmed yet: once, the rest at the next boundary. A step too large to keep counts as
  // if confirmed (the usual case: only a process's last boundary is no step).
  if (step->keep(op) && step == &latest_) return own;
  return own + more -
         takeCredit(op.info.signature_id, step->previous_measured_ns, in_force->boundary_ns, more);
}

void MeasuredStepOps::noteEveryStepOp(const StepDecision* in_force) {
  if (in_force == nullptr) return;
  if (confirmed_.any && in_force->boundary_ns < confirmed_.decision.boundary_ns) return;
  ++every_step_ops_[in_force->boundary_ns];
}

bool MeasuredStepOps::lastIsStep() const {
  if (latest_.any || !confirmed_.any) return false;  // measured: itself
  auto in = [this](int64_t boundary) {
    auto it = every_step_ops_.find(boundary);
    return it == every_step_ops_.end() ? uint64_t{0} : it->second;
  };
  const uint64_t step = in(confirmed_.decision.boundary_ns);
  return step > 0 && 2 * in(latest_ns_) >= step;
}

uint32_t MeasuredStepOps::tailSteps() const {
  // The boundaries after the confirmed step, the last one only when it started a step.
  if (!confirmed_.any || after_confirmed_ == 0) return 0;
  return after_confirmed_ - (lastIsStep() ? 0 : 1);
}

std::vector<CompletedOp> MeasuredStepOps::tailOps() {
  std::vector<CompletedOp> out;
  const uint32_t tail = tailSteps();
  if (tail == 0) return out;
  out.reserve(confirmed_.ops.size());
  for (const Kept& k : confirmed_.ops) {
    const uint64_t want = uint64_t{tail} * std::max<uint16_t>(k.weight, 1);
    const uint64_t rest =
        want - takeCredit(k.signature_id, confirmed_.decision.boundary_ns, INT64_MAX, want);
    if (rest > 0) out.push_back(restore(k, first_after_ns_, rest));
  }
  return out;
}

void StepDecisions::forgetBefore(int64_t before_ns) {
  auto it = firstAfter(decisions_, before_ns);
  if (it == decisions_.begin()) return;
  decisions_.erase(decisions_.begin(), std::prev(it));  // the one in force at before_ns stays
}

}  // namespace flare::timing
