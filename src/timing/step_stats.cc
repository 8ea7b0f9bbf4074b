#include "src/timing/step_stats.h"

#include <algorithm>
#include <climits>
#include <utility>

namespace flare::timing {
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
  std::vector<Interval> gpu;  // by start
  gpu.reserve(ops.size());
  for (const StepOp& op : ops) gpu.push_back({op.start, op.end});
  std::sort(gpu.begin(), gpu.end());
  std::vector<Interval> loads;
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
    // T_inter, exactly as detectors.cc voidPerStep.
    auto l = std::lower_bound(loads.begin(), loads.end(), Interval{s0, INT64_MIN});
    if (l != loads.end() && l->first < s1) {
      int64_t last_end = INT64_MIN;
      for (const auto& [gs, ge] : gpu) {
        if (gs >= l->first) break;
        last_end = std::max(last_end, ge);
      }
      auto first = std::lower_bound(gpu.begin(), gpu.end(), Interval{l->second, INT64_MIN});
      if (last_end > INT64_MIN && first != gpu.end())
        st.inter_ns = std::max<int64_t>(0, first->first - last_end);
    }
    busy.clear();
    minority.clear();
    for (const StepOp& op : ops) {
      const int64_t a = std::max(op.start, s0), b = std::min(op.end, s1);
      if (b > a) {
        busy.push_back({a, b});
        if (op.kernel) minority.push_back({a, b});
      }
      if (op.issue >= s0 && op.issue < s1) {
        const double lat = static_cast<double>(op.start - op.issue);
        ++st.gpu_ops;
        st.issue_latency_sum_ns += lat;
        st.issue_offset_sum_ns += static_cast<double>(op.issue - s0);
        st.latency.add(lat);
      }
    }
    st.gpu_busy_ns = unionLength(&busy);
    st.minority_ns = unionLength(&minority);
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace flare::timing
