#include "src/records/step_accumulator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <set>

namespace flare::records {

void StepAccumulator::addGpuOp(int64_t issue, int64_t start, int64_t end, bool kernel,
                               uint64_t thread, uint32_t weight) {
  if (issue < taken_until_) {
    ++late_ops_;
    if (end < taken_until_) return;  // nothing of it falls in a step still open
  }
  if (ops_.size() >= max_ops_) {
    // No boundary for too long (or a giant step): keep the newest half.
    const auto half = static_cast<std::ptrdiff_t>(ops_.size() / 2);
    std::nth_element(
        ops_.begin(), ops_.begin() + half, ops_.end(),
        [](const PendingOp& a, const PendingOp& b) { return a.op.issue < b.op.issue; });
    ops_.erase(ops_.begin(), ops_.begin() + half);
    overflow_ops_ += static_cast<uint64_t>(half);
  }
  ops_.push_back({StepOp{issue, start, std::max(start, end), kernel}, thread, weight});
  auto [seen, inserted] = last_issue_seen_.try_emplace(thread, issue);
  if (!inserted) seen->second = std::max(seen->second, issue);
}

void StepAccumulator::addRunQueueWait(uint64_t thread, int64_t t, int64_t waited_ns) {
  std::vector<std::pair<int64_t, int64_t>>& readings = run_queue_[thread];
  if (!readings.empty() && (t <= readings.back().first || waited_ns < readings.back().second))
    return;  // out of order, or a counter that went back (a reused thread id)
  if (readings.size() >= kMaxRunQueueReadings) {
    // No boundary for long (a job without step markers or DataLoader calls, or a very long
    // step): every other reading goes, so the readings still span the open step, at half the
    // resolution (amortised O(1) per reading).
    size_t kept = 0;
    for (size_t i = 0; i < readings.size(); i += 2) readings[kept++] = readings[i];
    readings.resize(kept);
  }
  readings.emplace_back(t, waited_ns);
}

void StepAccumulator::addHostEvent(int64_t start, int64_t end, uint64_t thread,
                                   const std::string& name) {
  auto [it, inserted] = name_index_.emplace(name, static_cast<uint32_t>(names_.size()));
  if (inserted) names_.push_back(name);
  std::vector<HostEvent>& events = host_[thread];
  if (events.size() >= max_ops_) {
    std::sort(events.begin(), events.end(),
              [](const HostEvent& a, const HostEvent& b) { return a.end < b.end; });
    events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(events.size() / 2));
  }
  events.push_back({start, std::max(start, end), it->second});
}

void StepAccumulator::addLoaderSpan(int64_t start, int64_t end, bool starts_step) {
  if (start < taken_until_) return;
  loader_.push_back({start, std::max(start, end)});
  if (!saw_marker_ && starts_step) loader_starts_.push_back(start);
}

void StepAccumulator::addStepMarker(int64_t t) {
  if (!saw_marker_) {
    saw_marker_ = true;
    loader_starts_.clear();  // explicit markers decide from now on (JobModel::stepStarts)
  }
  if (t < taken_until_) return;
  markers_.push_back(t);
}

void StepAccumulator::reset() {
  const int64_t watermark = watermark_;
  const bool has_watermark = has_watermark_;
  *this = StepAccumulator(max_ops_);
  watermark_ = watermark;
  has_watermark_ = has_watermark;
}

StepResult StepAccumulator::computeStep(int64_t s0, int64_t s1) {
  StepResult result;
  std::vector<StepOp> ops;
  ops.reserve(ops_.size());
  for (const PendingOp& p : ops_) ops.push_back(p.op);
  const int64_t bounds[2] = {s0, s1};
  auto stats = computeStepStats(ops, loader_, bounds);
  if (!stats.empty()) result.stats = std::move(stats.front());
  result.stats.start_ns = s0;
  result.stats.end_ns = s1;
  uint64_t weights = 0;
  bool sampled = false;
  std::set<uint64_t> issuers;  // the threads that issued the step's ops
  for (const PendingOp& p : ops_) {
    if (p.op.issue < s0 || p.op.issue >= s1) continue;
    weights += p.weight;
    sampled = sampled || p.weight > 1;
    issuers.insert(p.thread);
  }
  if (sampled) result.gpu_ops_estimated = weights;
  result.stats.run_queue_wait_ns = runQueueWaitIn(run_queue_, issuers, s0, s1);

  // Causes: per thread, the launches in issue order (earlier steps' latest launch first).
  std::map<uint64_t, std::vector<const PendingOp*>> by_thread;
  for (const PendingOp& p : ops_) by_thread[p.thread].push_back(&p);
  std::map<uint32_t, stats::LatencySketch> causes;
  for (auto& [thread, list] : by_thread) {
    std::sort(list.begin(), list.end(),
              [](const PendingOp* a, const PendingOp* b) { return a->op.issue < b->op.issue; });
    auto host_it = host_.find(thread);
    std::vector<HostEvent>* events = host_it == host_.end() ? nullptr : &host_it->second;
    if (events != nullptr) {
      std::sort(events->begin(), events->end(),
                [](const HostEvent& a, const HostEvent& b) { return a.end < b.end; });
    }
    auto last = last_issue_.find(thread);
    int64_t prev = last == last_issue_.end() ? INT64_MIN : last->second;
    int64_t latest = prev;
    for (size_t i = 0; i < list.size(); ++i) {
      const StepOp& op = list[i]->op;
      // The previous launch strictly before this one (ties share their predecessor).
      if (i > 0 && list[i - 1]->op.issue < op.issue) prev = std::max(prev, list[i - 1]->op.issue);
      if (op.issue < s0 || op.issue >= s1) continue;
      latest = std::max(latest, op.issue);
      if (events == nullptr || prev == INT64_MIN || prev >= op.issue) continue;
      const int64_t gap = op.issue - prev;
      auto h = std::lower_bound(events->begin(), events->end(), prev,
                                [](const HostEvent& e, int64_t t) { return e.end < t; });
      std::set<uint32_t> seen;
      for (; h != events->end() && h->end <= op.issue; ++h) {
        if (2 * (h->end - h->start) < gap || !seen.insert(h->name).second) continue;
        auto [c, inserted] =
            causes.try_emplace(h->name, stats::LatencySketch(StepStats::kStepSketchAccuracy));
        c->second.add(static_cast<double>(op.start - op.issue));
      }
    }
    if (latest != INT64_MIN) last_issue_[thread] = latest;
  }
  for (auto& [name, sketch] : causes) result.causes.emplace_back(names_[name], std::move(sketch));
  return result;
}

void StepAccumulator::forgetBefore(int64_t s0, int64_t s1) {
  // Ops wholly before the next step go, except the one ending last: the next step's T_inter
  // measures from the last GPU op before its DataLoader call.
  auto keep_last = ops_.end();
  for (auto it = ops_.begin(); it != ops_.end(); ++it) {
    if (it->op.issue < s1 && it->op.end < s1 &&
        (keep_last == ops_.end() || it->op.end > keep_last->op.end))
      keep_last = it;
  }
  const PendingOp kept = keep_last == ops_.end() ? PendingOp{} : *keep_last;
  const bool has_kept = keep_last != ops_.end();
  std::erase_if(ops_, [s1](const PendingOp& p) { return p.op.issue < s1 && p.op.end < s1; });
  if (has_kept) ops_.push_back(kept);
  for (auto it = host_.begin(); it != host_.end();) {
    std::erase_if(it->second, [s0](const HostEvent& e) { return e.end < s0; });
    it = it->second.empty() ? host_.erase(it) : std::next(it);
  }
  std::erase_if(loader_, [s1](const StepSpan& s) { return s.start < s1; });
  // Run-queue readings: those from the newest one at or before s1 on (the next step's start).
  for (auto it = run_queue_.begin(); it != run_queue_.end();) {
    auto& r = it->second;
    auto first_after = std::upper_bound(
        r.begin(), r.end(), s1,
        [](int64_t v, const std::pair<int64_t, int64_t>& x) { return v < x.first; });
    if (first_after != r.begin()) r.erase(r.begin(), std::prev(first_after));
    const bool issuing = last_issue_seen_.count(it->first) != 0;
    it = r.empty() || (!issuing && r.back().first < s1) ? run_queue_.erase(it) : std::next(it);
  }
  // A thread that issued nothing since the step just taken began is no longer read.
  std::erase_if(last_issue_seen_, [s0](const auto& kv) { return kv.second < s0; });
}

std::vector<StepResult> StepAccumulator::take(bool final) {
  std::vector<StepResult> out;
  std::vector<int64_t>& b = saw_marker_ ? markers_ : loader_starts_;
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  auto ready = [&] {
    if (b.size() < 2) return false;
    if (final) return true;
    if (has_watermark_) {
      return watermark_ >= b[1] ||
             (b.size() >= 2 + kMaxSlackSteps && b.back() - b[1] >= kMaxHoldNs);
    }
    return b.size() >= 2 + kSlackSteps;
  };
  while (ready()) {
    const int64_t s0 = b[0], s1 = b[1];
    out.push_back(computeStep(s0, s1));
    forgetBefore(s0, s1);
    b.erase(b.begin());
    taken_until_ = s1;
  }
  if (!out.empty()) {
    out.front().late_ops = late_ops_;
    late_ops_ = 0;
  }
  return out;
}

}  // namespace flare::records
