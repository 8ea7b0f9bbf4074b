// DeepTraceTrigger: when the detectors raise a new alert naming one rank, ask that rank and one
// healthy peer (for contrast) for a CUPTI deep trace of the next N steps (src/hook/deep_trace.h),
// through the daemon's command path (Ingest::sendCommandTrusted).
//
// Rate limit: at most one trigger per job per `min_interval_ns` (a deep trace costs the ranks a
// few steps of CUPTI overhead and the daemon a few MB); alerts naming no single rank (-1) or a
// rank the job does not have are ignored. `steps` = 0 turns it off (flared --deep-trace-steps 0).
//
// Threading: onAlerts() on one thread (flared's analysis thread, after each detector run); the
// counters may be read from any thread. The
// decisions are plain functions of (alerts, ranks, now) so that tests pass an injected time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "flare/v1/service.pb.h"

namespace flare::engine {

struct DeepTraceTriggerOptions {
  uint32_t steps = 3;                              // 0: off
  int64_t min_interval_ns = 600LL * 1000000000LL;  // per job
};

class DeepTraceTrigger {
 public:
  // `ranks_of(job)`: the job's connected ranks. `send(req)`: issues the command.
  DeepTraceTrigger(DeepTraceTriggerOptions options,
                   std::function<std::vector<int32_t>(const std::string& job)> ranks_of,
                   std::function<void(const v1::SendCommandRequest&)> send)
      : options_(options), ranks_of_(std::move(ranks_of)), send_(std::move(send)) {}

  // The requests sent for these newly raised alerts (at most one per job).
  std::vector<v1::SendCommandRequest> onAlerts(const std::vector<v1::Alert>& alerts,
                                               int64_t now_ns);
  // Any thread (the /metrics thread reads them).
  uint64_t triggered() const { return triggered_.load(std::memory_order_relaxed); }
  uint64_t suppressed() const { return suppressed_.load(std::memory_order_relaxed); }

 private:
  DeepTraceTriggerOptions options_;
  std::function<std::vector<int32_t>(const std::string&)> ranks_of_;
  std::function<void(const v1::SendCommandRequest&)> send_;
  std::map<std::string, int64_t> last_ns_;  // job -> last trigger
  std::atomic<uint64_t> triggered_{0};
  std::atomic<uint64_t> suppressed_{0};  // rate-limited
};

// The ranks to trace for culprit `rank`: the rank, then the nearest healthy peer (the next
// higher connected rank, wrapping around), unless the job has no other rank.
std::vector<int32_t> deepTraceRanks(int32_t rank, std::vector<int32_t> connected);

}  // namespace flare::engine
