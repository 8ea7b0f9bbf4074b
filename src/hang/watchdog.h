// Hang detection on a rank: decides when the rank suspects a hang from the progress of its GPU
// streams. The timing thread (the poller, which keeps a FIFO of pending ops per stream) tells
// the watchdog which op is at the head of each stream and since when; poll() says whether to
// report a suspected hang.
//
// Rule: a stream is stuck when its head op has been the head (issued and not completed, with
// every earlier op on the stream completed) for longer than
//     max(timeout_for(op), expected_factor x the op's expected duration,
//         learn_factor x the longest completed duration of the op's signature)
// where timeout_for(op) is the per-operation override (FLARE_HANG_TIMEOUT_OPS: by op name, else
// by op class such as "collective") or the timeout (FLARE_HANG_TIMEOUT). So a long collective
// (a checkpoint barrier: configured, or learned from its earlier instances) or a chain of long
// ones — each completion restarts the clock — never raises a false hang. An idle
// stream is never stuck (a silent rank is the daemon's to detect). A non-collective head is not
// stuck either while a collective head of the rank has started on the GPU (its start event
// completed) and is still within its bound: the kernel may wait for that collective through a
// cross-stream dependency (the optimizer kernel after the gradient all-reduce, whichever became
// head first), so a long collective under its override does not raise through the kernels
// queued behind it. While no collective has started (the collective waits for the kernel: a
// compute kernel that never finishes), a kernel is judged by its own bound. When a collective
// head completes, a head that has not started is timed from the next poll(): it may have
// waited for that collective and start a pass later (the collective's end and the kernel's
// start are two events). One episode = one report: after a suspicion, poll() reports nothing
// until the stream that raised it makes progress.
//
// Pure logic with injected time (now_ns arguments); no thread of its own. Not thread-safe: one
// caller (the poller thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace flare::hang {

// One entry of FLARE_HANG_TIMEOUT_OPS: ops named `op` (exact, e.g. "ncclAllReduce"), or of that
// class ("collective", "p2p", "kernel", "gemm", "attention", "memcpy", "memset", "graph") when
// no entry names the op itself, are stuck only after `timeout_ns`.
struct OpTimeout {
  std::string op;
  int64_t timeout_ns = 0;
};

struct WatchdogOptions {
  int64_t timeout_ns = 300'000'000'000;  // FLARE_HANG_TIMEOUT (default 300 s)
  double expected_factor = 4.0;          // slack over an op's expected duration
  std::vector<OpTimeout> op_timeouts;    // FLARE_HANG_TIMEOUT_OPS
  double learn_factor = 4.0;             // FLARE_HANG_LEARN_FACTOR; 0: learn nothing
};

// Parses FLARE_HANG_TIMEOUT_OPS: "NAME=DURATION[,NAME=DURATION...]", DURATION in seconds or
// with a unit (ns|us|ms|s|m|h), e.g. "ncclAllReduce=30m,collective=900". Valid entries go to
// `out` (a later entry for the same name replaces an earlier one); each bad entry (no '=',
// empty name, a bad or non-positive duration) adds one message to `errors` naming it and is
// skipped. Returns true when every entry was valid.
bool parseOpTimeouts(std::string_view text, std::vector<OpTimeout>* out,
                     std::vector<std::string>* errors);

struct HeadOp {
  uint64_t op_id = 0;
  std::string name;         // e.g. "ncclAllReduce"
  bool collective = false;  // NCCL collective or p2p
  int64_t expected_ns = 0;  // 0: unknown
  int64_t since_ns = 0;     // when it became the head of its stream
  // Its start event completed: it runs on the GPU (false: its stream waits before it, e.g. on
  // another stream's work through cudaStreamWaitEvent; also: not known). Updated with
  // setStarted().
  bool started = false;
  std::string kind;        // the op class for FLARE_HANG_TIMEOUT_OPS ("collective", "gemm", ...)
  uint32_t signature = 0;  // what learn() keys on (0: nothing learned)
  // Evidence only (collectives): communicator identity, per-communicator sequence number, size.
  uint64_t comm_hash = 0;
  uint64_t seq = 0;
  uint32_t nranks = 0;
  int32_t device = 0;
  // Issued in a step that step sampling left out, after work the hook did not time (kernels,
  // GEMMs, copies, sets): while it has not started, that work is what its stream runs or waits
  // for (the rank's report names it: hook/hang_watch.cc). Evidence only.
  bool behind_untimed = false;
};

struct StuckStream {
  uint64_t stream = 0;
  HeadOp op;
  int64_t waited_ns = 0;
  int64_t threshold_ns = 0;  // the bound it passed
};

struct Suspicion {
  int64_t at_ns = 0;
  // The stuck heads that started on the GPU (they run: what the rank is stuck in), longest
  // first, then those that have not (they wait for other work), longest first.
  StuckStream first;               // stuck.front()
  std::vector<StuckStream> stuck;  // every stuck stream, in that order
};

class HangWatchdog {
 public:
  explicit HangWatchdog(WatchdogOptions options = {});

  // `op` is now at the head of `stream` (the previous head completed, or the stream was idle).
  // A collective that was the head completed: the next poll() times every head that has not
  // started from then.
  void setHead(uint64_t stream, HeadOp op);
  // The head of `stream` started (or not) on the GPU at about `now_ns`; no progress (the same
  // head). A head that starts after waiting (for another stream's work: the optimizer kernel
  // after the gradient all-reduce) is timed from its start: the wait was the other stream's.
  void setStarted(uint64_t stream, bool started, int64_t now_ns);
  // `stream` has nothing pending (a collective head completed: as in setHead).
  void setIdle(uint64_t stream);
  // An op of `signature` completed after `duration_ns` (its GPU time): ops of that signature
  // are stuck only after learn_factor x the longest such duration.
  void learn(uint32_t signature, int64_t duration_ns);

  // The bound `op` must pass to be stuck (the rule above).
  int64_t thresholdNs(const HeadOp& op) const;

  // A suspicion when a stream is stuck and no episode is open; opens the episode.
  std::optional<Suspicion> poll(int64_t now_ns);

  bool inEpisode() const { return episode_open_; }
  uint64_t episodes() const { return episodes_; }

 private:
  void progress(uint64_t stream, uint64_t new_op);

  WatchdogOptions options_;
  std::unordered_map<std::string, int64_t> op_timeouts_;  // by name or class
  std::unordered_map<uint32_t, int64_t> longest_;         // by signature
  std::unordered_map<uint64_t, HeadOp> heads_;
  bool episode_open_ = false;
  uint64_t episode_stream_ = 0;
  uint64_t episode_op_ = 0;
  uint64_t episodes_ = 0;
  bool collective_completed_ = false;  // a collective head completed since the last poll
};

}  // namespace flare::hang
