#include "src/records/step_stats.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <utility>

namespace flare::records {
namespace {

using Interval = std::pair<int64_t, int64_t>;

// Length of the union of intervals (sorted in place).
int64_t unionLength(std::vector<Interval>* v) {
  std::sort(v->begin(), v->end());
  int64_t total = 0, cur_s = 0, cur_e = INT64_MIN;
  for (const auto& [s, e] : *v) {
    if (e <= s) continue;
    if (cur_e == INT64_MIN || s > cur_e) {
      if (cur_e != INT64_MIN) total += cur_e - cur_s;
      cur_s = s;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e != INT64_MIN) total += cur_e - cur_s;
  return total;
}

}  // namespace

double StepStats::vInter() const {
  const double t = static_cast<double>(end_ns - start_ns);
  return t > 0 ? std::min(1.0, static_cast<double>(inter_ns) / t) : 0.0;
}

double StepStats::vMinority() const {
  const double rest = static_cast<double>(end_ns - start_ns - inter_ns);
  return rest > 0 ? std::min(1.0, static_cast<double>(minority_ns) / rest) : 0.0;
}

std::vector<StepStats> computeStepStats(std::span<const StepOp> ops,
                                        std::span<const StepSpan> loader,
                                        std::span<const int64_t> starts) {
  std::vector<StepStats> out;
  if (starts.size() < 2) return out;
  // Ops by start (interval side) and by issue (issue side); O((ops + steps) log ops) overall,
  // plus the ops overlapping each step.
  std::vector<const StepOp*> by_start, by_issue;
  by_start.reserve(ops.size());
  int64_t max_len = 0;
  for (const StepOp& op : ops) {
    by_start.push_back(&op);
    max_len = std::max(max_len, op.end - op.start);
  }
  by_issue = by_start;
  std::sort(by_start.begin(), by_start.end(), [](const StepOp* a, const StepOp* b) {
    return a->start != b->start ? a->start < b->start : a->end < b->end;
  });
  std::sort(by_issue.begin(), by_issue.end(),
            [](const StepOp* a, const StepOp* b) { return a->issue < b->issue; });
  std::vector<int64_t> end_prefix_max(by_start.size());  // max end of by_start[0..i]
  int64_t m = INT64_MIN;
  for (size_t i = 0; i < by_start.size(); ++i)
    end_prefix_max[i] = m = std::max(m, by_start[i]->end);
  auto firstStartAtOrAfter = [&](int64_t t) {
    return static_cast<size_t>(
        std::lower_bound(by_start.begin(), by_start.end(), t,
                         [](const StepOp* op, int64_t v) { return op->start < v; }) -
        by_start.begin());
  };
  std::vector<Interval> loads;
  loads.reserve(loader.size());
  for (const StepSpan& s : loader) loads.push_back({s.start, s.end});
  std::sort(loads.begin(), loads.end());

  std::vector<Interval> busy, minority;
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const int64_t s0 = starts[i], s1 = starts[i + 1];
    if (s1 <= s0) continue;
    StepStats st;
    st.step = static_cast<int64_t>(i);
    st.start_ns = s0;
    st.end_ns = s1;
    // T_inter: the GPU idle gap around the step's first DataLoader call, inside the step. It
    // opens when the GPU ops started before the call have all ended (the latest end among
    // them), never before the step's start: set-up, evaluation or a checkpoint before the step
    // is not this step's input time. It closes at the first GPU op starting at or after the
    // call's end, never after the step's end (a step with no GPU work after its input call is
    // idle to its end). So 0 <= T_inter <= T_step by construction.
    auto l = std::lower_bound(loads.begin(), loads.end(), Interval{s0, INT64_MIN});
    if (l != loads.end() && l->first < s1) {
      const size_t before = firstStartAtOrAfter(l->first);
      const size_t first = firstStartAtOrAfter(l->second);
      const int64_t opens = before > 0 ? std::max(s0, end_prefix_max[before - 1]) : s0;
      const int64_t closes = first < by_start.size() ? std::min(s1, by_start[first]->start) : s1;
      st.inter_ns = std::max<int64_t>(0, closes - std::min(opens, s1));
    }
    busy.clear();
    minority.clear();
    const int64_t from = max_len > INT64_MAX / 2 ? INT64_MIN : s0 - max_len;
    for (size_t k = firstStartAtOrAfter(from); k < by_start.size() && by_start[k]->start < s1;
         ++k) {
      const StepOp& op = *by_start[k];
      const int64_t a = std::max(op.start, s0), b = std::min(op.end, s1);
      if (b <= a) continue;
      busy.push_back({a, b});
      if (op.kernel) minority.push_back({a, b});
    }
    auto it = std::lower_bound(by_issue.begin(), by_issue.end(), s0,
                               [](const StepOp* op, int64_t v) { return op->issue < v; });
    for (; it != by_issue.end() && (*it)->issue < s1; ++it) {
      const StepOp& op = **it;
      const double lat = static_cast<double>(op.start - op.issue);
      ++st.gpu_ops;
      st.issue_latency_sum_ns += lat;
      st.issue_offset_sum_ns += static_cast<double>(op.issue - s0);
      st.latency.add(lat);
    }
    st.gpu_busy_ns = unionLength(&busy);
    st.minority_ns = unionLength(&minority);
    out.push_back(std::move(st));
  }
  return out;
}

StepCallKind stepCallKind(std::string_view qualified_name) {
  if (isStepApiName(qualified_name)) return StepCallKind::kLoader;
  if (qualified_name == "torch.optim.Optimizer@step") return StepCallKind::kTraining;
  // The function's own name: after '@', and after the last '.' of a Class.method there.
  std::string_view fn = qualified_name.substr(qualified_name.rfind('@') + 1);
  fn = fn.substr(fn.rfind('.') + 1);
  return fn == "backward" || fn == "backward_step" ? StepCallKind::kTraining : StepCallKind::kOther;
}

bool StepBoundaryRule::add(StepCallKind kind, int64_t start_ns) {
  if (kind == StepCallKind::kTraining) {
    trained_ = true;
    last_training_ns_ = std::max(last_training_ns_, start_ns);
    return false;
  }
  if (kind != StepCallKind::kLoader) return false;
  if (trained_ && (last_training_ns_ <= last_boundary_ns_ || start_ns < last_boundary_ns_)) {
    return false;
  }
  last_boundary_ns_ = start_ns;
  return true;
}

std::vector<int64_t> stepBoundaries(std::vector<StepCall> calls) {
  std::stable_sort(calls.begin(), calls.end(),
                   [](const StepCall& a, const StepCall& b) { return a.start_ns < b.start_ns; });
  StepBoundaryRule rule;
  std::vector<int64_t> starts;
  for (const StepCall& c : calls) {
    if (rule.add(c.kind, c.start_ns)) starts.push_back(c.start_ns);
  }
  return starts;
}

int64_t runQueueWaitIn(const std::map<uint64_t, RunQueueReadings>& readings,
                       const std::set<uint64_t>& threads, int64_t s0, int64_t s1) {
  // The counter at time t, linear between readings (held flat outside them).
  auto at = [](const RunQueueReadings& r, int64_t t) -> double {
    auto hi = std::lower_bound(
        r.begin(), r.end(), t,
        [](const std::pair<int64_t, int64_t>& x, int64_t v) { return x.first < v; });
    if (hi == r.begin()) return static_cast<double>(r.front().second);
    if (hi == r.end()) return static_cast<double>(r.back().second);
    const auto& lo = *std::prev(hi);
    const double f = static_cast<double>(t - lo.first) / static_cast<double>(hi->first - lo.first);
    return static_cast<double>(lo.second) + f * static_cast<double>(hi->second - lo.second);
  };
  int64_t most = -1;
  for (uint64_t thread : threads) {
    auto it = readings.find(thread);
    if (it == readings.end() || it->second.empty()) continue;
    const auto& r = it->second;
    // A reading at or before the step's start, and one after it: a thread first read inside
    // the step is not measured there. Past the newest reading the counter is held (a step
    // taken within the reading period of its end may miss that part of the wait).
    if (r.front().first > s0 || r.back().first <= s0) continue;
    const double waited = at(r, s1) - at(r, s0);
    most =
        std::max(most, std::clamp(static_cast<int64_t>(std::llround(waited)), int64_t{0}, s1 - s0));
  }
  return most;
}

}  // namespace flare::records
