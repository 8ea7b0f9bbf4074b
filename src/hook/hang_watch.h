// HangWatch: the rank side of hang detection (issue 7). It sits between the Tracer's poller and
// hang::HangWatchdog: the Tracer hands it the head of every stream (timing::HeadObserver), the
// sink chain hands it signature names and completed ops (CollectiveTracker forwards them), and
// when the watchdog suspects a hang it builds one flare.v1.HangReport (the stuck op: name,
// class, communicator, sequence number, age, the bound it passed) and gives it to `report`
// (in libflare_hook.so: GrpcExporter::reportHang, which sends it up the rank's stream ahead of
// the batches). One report per episode: nothing more until the stuck stream progresses.
//
// Settings (optionsFromEnv): FLARE_HANG_TIMEOUT (seconds; 0 turns the rank watchdog off),
// FLARE_HANG_TIMEOUT_OPS (per-op overrides, hang::parseOpTimeouts; a bad entry gives one
// warning naming it and is ignored), FLARE_HANG_LEARN_FACTOR (k x the longest completed
// duration of the op's signature).
//
// Threading: every method runs on the Tracer's poller thread (onHeads from the Tracer,
// onSignature/onOps from the sink chain on the same thread); reports() may be read from any
// thread. Ownership: owns its watchdog; the report callback must outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flare/v1/commands.pb.h"
#include "src/common/clock.h"
#include "src/hang/watchdog.h"
#include "src/timing/timing.h"

namespace flare::hook {

// The communicator's name in CollectiveProgress and StuckOp: 16 hex digits of its hash.
std::string communicatorName(uint64_t hash);
// "collective", "gemm", ... (the class names FLARE_HANG_TIMEOUT_OPS accepts).
const char* opKindName(timing::OpKind kind);

class HangWatch final : public timing::HeadObserver {
 public:
  using ReportFn = std::function<void(const flare::v1::HangReport&)>;

  // `wall` gives HangReport.time_unix_ns (realtime); heads' times are the Tracer's clock.
  HangWatch(hang::WatchdogOptions options, ReportFn report, std::function<int64_t()> wall_ns);

  // FLARE_HANG_TIMEOUT, FLARE_HANG_TIMEOUT_OPS, FLARE_HANG_LEARN_FACTOR. Returns false when the
  // watchdog is off (FLARE_HANG_TIMEOUT=0).
  static bool optionsFromEnv(hang::WatchdogOptions* out);

  void onSignature(uint32_t id, const timing::Signature& sig);
  void onOps(std::span<const timing::CompletedOp> ops);
  void onHeads(int64_t now_ns, std::span<const timing::StreamHead> heads) override;

  uint64_t reports() const { return reports_.load(std::memory_order_relaxed); }
  // The Tracer time of the last onHeads (tests wait for a pass at a given fake time).
  int64_t lastHeadsNs() const { return last_heads_ns_.load(std::memory_order_acquire); }

 private:
  flare::v1::StuckOp stuckOp(const hang::StuckStream& s) const;

  hang::HangWatchdog watchdog_;
  ReportFn report_;
  std::function<int64_t()> wall_ns_;
  std::unordered_map<uint32_t, std::pair<std::string, timing::OpKind>> sigs_;
  std::map<std::pair<int32_t, uint64_t>, uint64_t> stream_ids_;  // (device, stream) -> id
  std::vector<std::pair<int32_t, uint64_t>> streams_;            // id - 1 -> (device, stream)
  std::unordered_map<uint64_t, uint64_t> head_keys_;             // id -> current head's key
  std::atomic<uint64_t> reports_{0};
  std::atomic<int64_t> last_heads_ns_{INT64_MIN};
};

}  // namespace flare::hook
