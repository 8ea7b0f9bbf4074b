// MODE_SUMMARY on the rank: the durations of completed compute ops, grouped per (signature,
// stream, device) over a window, turned into flare.v1.KernelSummary messages whose clusters come
// from flare_stats' clusterDurations (valleys of the KDE of log-durations).
//
// What is summarised: kernels, GEMMs, attention, memcpy, memset and graph launches. What is not
// (shouldSummarize() false, the BatchBuilder sends them raw): collectives and p2p (the detectors
// need each instance's communicator, sequence number, bytes and times for bus bandwidth and
// arrival order across ranks) and host synchronization spans (few, and their times matter).
//
// A window opens with the first op added after the previous take() and is due once an op ends
// `window_ns` after the window's first start; the BatchBuilder also takes it at every flush (the
// Tracer's poller flushes once a second), so a window is at most about a second long.
//
// Threading: not thread-safe; used on the Tracer's poller thread only (inside the Sink), never
// on a launching thread. Allocates (one vector of durations per key, reused across windows).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "src/timing/timing.h"

namespace flare::timing {

struct SummaryCluster {
  uint64_t count = 0;
  int64_t p50_ns = 0;
  int64_t p99_ns = 0;
  int64_t sum_ns = 0;
};

// One (signature, stream, device) over one window; times in host monotonic ns.
struct OpSummary {
  uint32_t signature_id = 0;
  uint64_t stream_id = 0;
  int32_t device = 0;
  int64_t window_start_ns = 0;           // earliest GPU start of the window's ops of this key
  int64_t window_end_ns = 0;             // latest GPU end
  std::vector<SummaryCluster> clusters;  // ascending durations; counts sum to the ops added
  uint64_t flops = 0;                    // totals over the window's ops of this key
  uint64_t bytes = 0;
  // 1-in-N sampled launches (an op of weight > 1, OpInfo::weight): the ops actually timed; the
  // clusters' counts and sums, flops and bytes are then estimates (scaled by the weights; the
  // counts sum to the weights). 0: every op had weight 1, all exact.
  uint64_t sampled_ops = 0;
};

class SummaryAggregator {
 public:
  explicit SummaryAggregator(int64_t window_ns = 1'000'000'000) : window_ns_(window_ns) {}

  static bool shouldSummarize(OpKind kind);

  // Adds one completed op (of a summarised kind). Negative durations (clock-map error) count
  // as 0 ns. An op of weight w stands for w launches (1-in-N sampling): its flops and bytes
  // count w times, and the key's clusters are scaled so that their counts sum to the weights.
  void add(const CompletedOp& op);
  // True once an op ended window_ns after the open window's first start.
  bool due() const { return open_ && last_end_ns_ - first_start_ns_ >= window_ns_; }
  bool empty() const { return !open_; }
  // Closes the window: one summary per key that got ops, in key order. Empty when none.
  std::vector<OpSummary> take();

 private:
  using Key = std::tuple<uint32_t, uint64_t, int32_t>;  // signature, stream, device
  struct Acc {
    std::vector<double> durations;
    int64_t first_start = 0;
    int64_t last_end = 0;
    uint64_t flops = 0;
    uint64_t bytes = 0;
    uint64_t weights = 0;  // sum of the ops' weights (== durations.size() unless sampled)
  };
  int64_t window_ns_;
  bool open_ = false;
  int64_t first_start_ns_ = 0;
  int64_t last_end_ns_ = 0;
  std::map<Key, Acc> accs_;
};

}  // namespace flare::timing
