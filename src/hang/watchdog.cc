#include "src/hang/watchdog.h"

#include <algorithm>
#include <climits>

#include "src/common/config.h"

namespace flare::hang {
namespace {

int64_t scaledNs(double factor, int64_t ns) {
  const double scaled = factor * static_cast<double>(ns);
  if (!(scaled > 0)) return 0;
  return scaled > 9e18 ? INT64_MAX : static_cast<int64_t>(scaled);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool parseOpTimeouts(std::string_view text, std::vector<OpTimeout>* out,
                     std::vector<std::string>* errors) {
  bool ok = true;
  auto bad = [&](std::string_view entry, const char* why) {
    ok = false;
    if (errors) errors->push_back("entry '" + std::string(entry) + "': " + why);
  };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view entry = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) {
      bad(entry, "expected NAME=DURATION");
      continue;
    }
    const std::string_view name = trim(entry.substr(0, eq));
    if (name.empty()) {
      bad(entry, "empty op name");
      continue;
    }
    const auto seconds = common::parseDurationSeconds(entry.substr(eq + 1));
    if (!seconds || !(*seconds > 0) || *seconds > 9e9) {
      bad(entry, "duration must be a positive number of seconds or have a unit ns|us|ms|s|m|h");
      continue;
    }
    std::erase_if(*out, [&](const OpTimeout& t) { return t.op == name; });
    out->push_back({std::string(name), static_cast<int64_t>(*seconds * 1e9)});
  }
  return ok;
}

HangWatchdog::HangWatchdog(WatchdogOptions options) : options_(std::move(options)) {
  for (const OpTimeout& t : options_.op_timeouts) op_timeouts_[t.op] = t.timeout_ns;
}

int64_t HangWatchdog::thresholdNs(const HeadOp& op) const {
  int64_t base = options_.timeout_ns;
  if (auto it = op_timeouts_.find(op.name); it != op_timeouts_.end()) {
    base = it->second;
  } else if (auto k = op_timeouts_.find(op.kind); !op.kind.empty() && k != op_timeouts_.end()) {
    base = k->second;
  }
  int64_t learned = 0;
  if (op.signature != 0) {
    if (auto it = longest_.find(op.signature); it != longest_.end()) {
      learned = scaledNs(options_.learn_factor, it->second);
    }
  }
  return std::max({base, scaledNs(options_.expected_factor, op.expected_ns), learned});
}

void HangWatchdog::learn(uint32_t signature, int64_t duration_ns) {
  if (signature == 0 || duration_ns <= 0 || options_.learn_factor <= 0) return;
  int64_t& longest = longest_[signature];
  longest = std::max(longest, duration_ns);
}

void HangWatchdog::progress(uint64_t stream, uint64_t new_op) {
  if (episode_open_ && stream == episode_stream_ && new_op != episode_op_) episode_open_ = false;
  auto it = heads_.find(stream);
  if (it != heads_.end() && it->second.collective && it->second.op_id != new_op) {
    collective_completed_ = true;
  }
}

void HangWatchdog::setHead(uint64_t stream, HeadOp op) {
  progress(stream, op.op_id);
  heads_[stream] = std::move(op);
}

void HangWatchdog::setStarted(uint64_t stream, bool started, int64_t now_ns) {
  auto it = heads_.find(stream);
  if (it == heads_.end()) return;
  HeadOp& op = it->second;
  if (started && !op.started) op.since_ns = std::max(op.since_ns, now_ns);
  op.started = started;
}

void HangWatchdog::setIdle(uint64_t stream) {
  progress(stream, ~uint64_t(0));
  heads_.erase(stream);
}

std::optional<Suspicion> HangWatchdog::poll(int64_t now_ns) {
  // A collective completed since the last poll: a head that has not started may have waited
  // for it. Its start event completes after the collective's end event (once its stream sees
  // that end), so a head pass can find the collective gone and the head not started yet. It is
  // timed from this poll, not charged with the wait that the collective's bound covered; one
  // that never starts is stuck one bound later.
  if (collective_completed_) {
    collective_completed_ = false;
    for (auto& [stream, op] : heads_) {
      if (!op.collective && !op.started) op.since_ns = std::max(op.since_ns, now_ns);
    }
  }
  if (episode_open_) return std::nullopt;
  std::vector<StuckStream> stuck;
  // A collective running on the GPU (started) and within its bound: other heads may wait for it
  // through a cross-stream dependency (cudaStreamWaitEvent on its end), so its bound, not
  // theirs, decides. A collective that has not started waits itself (possibly for the kernel).
  bool collective_running = false;
  for (const auto& [stream, op] : heads_) {
    const int64_t waited = now_ns - op.since_ns;
    const int64_t threshold = thresholdNs(op);
    if (waited > threshold) {
      stuck.push_back({stream, op, waited, threshold});
    } else if (op.collective && op.started) {
      collective_running = true;
    }
  }
  if (collective_running) {
    std::erase_if(stuck, [](const StuckStream& s) { return !s.op.collective; });
  }
  if (stuck.empty()) return std::nullopt;
  // Heads that run on the GPU first: a head that has not started waits for other work (the
  // optimizer kernel behind the all-reduce it depends on), so it names a symptom, not the op the
  // rank is stuck in, although it may have been a head for longer (it became head first).
  std::sort(stuck.begin(), stuck.end(), [](const StuckStream& a, const StuckStream& b) {
    if (a.op.started != b.op.started) return a.op.started;
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
