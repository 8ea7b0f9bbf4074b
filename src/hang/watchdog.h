// Hang detection on a rank: decides when the rank suspects a hang from the progress of its GPU
// streams. The timing thread (the poller, which keeps a FIFO of pending ops per stream) tells
// the watchdog which op is at the head of each stream and since when; poll() says whether to
// report a suspected hang.
//
// Rule: a stream is stuck when its head op has been the head (issued and not completed, with
// every earlier op on the stream completed) for longer than
//     max(timeout, expected_factor x the op's expected duration)
// so that a long collective (expected duration from its bytes and the bus bandwidth) or a
// chain of long ones — each completion restarts the clock — never raises a false hang. An idle
// stream is never stuck (a silent rank is the daemon's to detect). One episode = one report:
// after a suspicion, poll() reports nothing until the stream that raised it makes progress.
//
// Pure logic with injected time (now_ns arguments); no thread of its own. Not thread-safe: one
// caller (the poller thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace flare::hang {

struct WatchdogOptions {
  int64_t timeout_ns = 300'000'000'000;  // FLARE_HANG_TIMEOUT (default 300 s)
  double expected_factor = 4.0;          // slack over an op's expected duration
};

struct HeadOp {
  uint64_t op_id = 0;
  std::string name;         // e.g. "ncclAllReduce"
  bool collective = false;  // NCCL collective or p2p
  int64_t expected_ns = 0;  // 0: unknown
  int64_t since_ns = 0;     // when it became the head of its stream
};

struct StuckStream {
  uint64_t stream = 0;
  HeadOp op;
  int64_t waited_ns = 0;
};

struct Suspicion {
  int64_t at_ns = 0;
  StuckStream first;               // the stream stuck longest
  std::vector<StuckStream> stuck;  // every stuck stream, longest first
};

class HangWatchdog {
 public:
  explicit HangWatchdog(WatchdogOptions options = {}) : options_(options) {}

  // `op` is now at the head of `stream` (the previous head completed, or the stream was idle).
  void setHead(uint64_t stream, HeadOp op);
  // `stream` has nothing pending.
  void setIdle(uint64_t stream);

  // A suspicion when a stream is stuck and no episode is open; opens the episode.
  std::optional<Suspicion> poll(int64_t now_ns);

  bool inEpisode() const { return episode_open_; }
  uint64_t episodes() const { return episodes_; }

 private:
  int64_t thresholdNs(const HeadOp& op) const;
  void progress(uint64_t stream, uint64_t new_op);

  WatchdogOptions options_;
  std::unordered_map<uint64_t, HeadOp> heads_;
  bool episode_open_ = false;
  uint64_t episode_stream_ = 0;
  uint64_t episode_op_ = 0;
  uint64_t episodes_ = 0;
};

}  // namespace flare::hang
