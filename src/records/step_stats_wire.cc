#include "src/records/step_stats_wire.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "src/common/log.h"

namespace flare::records {

void encodeStepStats(const StepResult& r, const std::function<int64_t(int64_t)>& to_epoch,
                     flare::v1::StepStats* out) {
  const StepStats& st = r.stats;
  out->set_start_ns(to_epoch(st.start_ns));
  out->set_end_ns(to_epoch(st.end_ns));
  if (st.run_queue_wait_ns >= 0) out->set_run_queue_wait_ns(st.run_queue_wait_ns);
  out->set_late_ops(r.late_ops);
  if (st.sampled_out) {  // its times only: what was timed in it stands for nothing of the step
    out->set_sampled_out(true);
    static const std::vector<uint8_t> empty =
        stats::LatencySketch(StepStats::kStepSketchAccuracy).serialize();
    out->set_issue_latency(empty.data(), empty.size());
    return;
  }
  out->set_gpu_busy_ns(st.gpu_busy_ns);
  out->set_inter_ns(st.inter_ns);
  out->set_minority_ns(st.minority_ns);
  out->set_gpu_ops(st.gpu_ops);
  out->set_issue_latency_sum_ns(st.issue_latency_sum_ns);
  out->set_issue_offset_sum_ns(st.issue_offset_sum_ns);
  const std::vector<uint8_t> sketch = st.latency.serialize();
  out->set_issue_latency(sketch.data(), sketch.size());
  // Valid by construction (flared drops a StepStats with more causes or a bad name): the
  // causes that held up the most ops, names cut to the limit.
  std::vector<const std::pair<std::string, stats::LatencySketch>*> causes;
  for (const auto& c : r.causes)
    if (!c.first.empty()) causes.push_back(&c);
  if (causes.size() > StepStats::kMaxHostCauses) {
    common::logOnce(common::LogLevel::kInfo, "timing", "step-causes-cut",
                    "flare: a step had {} distinct host causes; the {} that held up the most GPU "
                    "ops are sent (flared takes no more), the rest left out (logged once)",
                    causes.size(), StepStats::kMaxHostCauses);
    std::stable_sort(causes.begin(), causes.end(), [](const auto* a, const auto* b) {
      return a->second.count() > b->second.count();
    });
    causes.resize(StepStats::kMaxHostCauses);
  }
  for (const auto* c : causes) {
    flare::v1::HostCause* cause = out->add_causes();
    cause->set_name(c->first.substr(0, StepStats::kMaxCauseNameBytes));
    const std::vector<uint8_t> bytes = c->second.serialize();
    cause->set_issue_latency(bytes.data(), bytes.size());
  }
  out->set_gpu_ops_estimated(r.gpu_ops_estimated);
}

}  // namespace flare::records
