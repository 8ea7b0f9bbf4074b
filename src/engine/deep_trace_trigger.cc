#include "src/engine/deep_trace_trigger.h"

#include <algorithm>

#include "src/common/log.h"

namespace flare::engine {

std::vector<int32_t> deepTraceRanks(int32_t rank, std::vector<int32_t> connected) {
  std::sort(connected.begin(), connected.end());
  connected.erase(std::unique(connected.begin(), connected.end()), connected.end());
  if (!std::binary_search(connected.begin(), connected.end(), rank)) return {};
  std::vector<int32_t> out{rank};
  if (connected.size() < 2) return out;
  auto it = std::upper_bound(connected.begin(), connected.end(), rank);
  out.push_back(it == connected.end() ? connected.front() : *it);
  return out;
}

std::vector<v1::SendCommandRequest> DeepTraceTrigger::onAlerts(const std::vector<v1::Alert>& alerts,
                                                               int64_t now_ns) {
  std::vector<v1::SendCommandRequest> sent;
  if (options_.steps == 0) return sent;
  for (const v1::Alert& a : alerts) {
    if (a.rank() < 0 || a.kind() == "hang") continue;  // a hung rank runs no more steps
    auto last = last_ns_.find(a.job_id());
    if (last != last_ns_.end() && now_ns - last->second < options_.min_interval_ns) {
      ++suppressed_;
      continue;
    }
    const std::vector<int32_t> ranks = deepTraceRanks(a.rank(), ranks_of_(a.job_id()));
    if (ranks.empty()) continue;
    v1::SendCommandRequest req;
    req.set_job_id(a.job_id());
    for (int32_t r : ranks) req.add_ranks(r);
    req.mutable_command()->mutable_deep_trace()->set_steps(options_.steps);
    last_ns_[a.job_id()] = now_ns;
    ++triggered_;
    FLARE_LOG_INFO("engine", "deep trace of {} steps on job {} ranks {}{} (alert {})",
                   options_.steps, a.job_id(), ranks[0],
                   ranks.size() > 1 ? " and peer " + std::to_string(ranks[1]) : std::string(),
                   a.kind());
    if (send_) send_(req);
    sent.push_back(std::move(req));
  }
  return sent;
}

}  // namespace flare::engine
