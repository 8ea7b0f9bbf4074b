#include "src/hang/watchdog.h"

#include <algorithm>

namespace flare::hang {

int64_t HangWatchdog::thresholdNs(const HeadOp& op) const {
  const double scaled = options_.expected_factor * double(op.expected_ns);
  return std::max<int64_t>(options_.timeout_ns, scaled > 9e18 ? INT64_MAX : int64_t(scaled));
}

void HangWatchdog::progress(uint64_t stream, uint64_t new_op) {
  if (episode_open_ && stream == episode_stream_ && new_op != episode_op_) episode_open_ = false;
}

void HangWatchdog::setHead(uint64_t stream, HeadOp op) {
  progress(stream, op.op_id);
  heads_[stream] = std::move(op);
}

void HangWatchdog::setIdle(uint64_t stream) {
  progress(stream, ~uint64_t(0));
  heads_.erase(stream);
}

std::optional<Suspicion> HangWatchdog::poll(int64_t now_ns) {
  if (episode_open_) return std::nullopt;
  std::vector<StuckStream> stuck;
  for (const auto& [stream, op] : heads_) {
    const int64_t waited = now_ns - op.since_ns;
    if (waited > thresholdNs(op)) stuck.push_back({stream, op, waited});
  }
  if (stuck.empty()) return std::nullopt;
  std::sort(stuck.begin(), stuck.end(), [](const StuckStream& a, const StuckStream& b) {
    return a.waited_ns != b.waited_ns ? a.waited_ns > b.waited_ns : a.stream < b.stream;
  });
  Suspicion s;
  s.at_ns = now_ns;
  s.first = stuck.front();
  s.stuck = std::move(stuck);
  episode_open_ = true;
  episode_stream_ = s.first.stream;
  episode_op_ = s.first.op.op_id;
  episodes_++;
  return s;
}

}  // namespace flare::hang
