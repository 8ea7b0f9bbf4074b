#include "src/hook/hang_watch.h"

#include <climits>
#include <cstdio>

#include "src/common/config.h"
#include "src/common/log.h"

namespace flare::hook {

std::string communicatorName(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

const char* opKindName(timing::OpKind kind) {
  switch (kind) {
    case timing::OpKind::kKernel:
      return "kernel";
    case timing::OpKind::kGemm:
      return "gemm";
    case timing::OpKind::kAttention:
      return "attention";
    case timing::OpKind::kCollective:
      return "collective";
    case timing::OpKind::kP2P:
      return "p2p";
    case timing::OpKind::kMemcpy:
      return "memcpy";
    case timing::OpKind::kMemset:
      return "memset";
    case timing::OpKind::kGraph:
      return "graph";
    case timing::OpKind::kSync:
      return "sync";
  }
  return "kernel";
}

HangWatch::HangWatch(hang::WatchdogOptions options, ReportFn report,
                     std::function<int64_t()> wall_ns)
    : watchdog_(std::move(options)), report_(std::move(report)), wall_ns_(std::move(wall_ns)) {}

bool HangWatch::optionsFromEnv(hang::WatchdogOptions* out) {
  const double timeout_s = common::paramDurationSeconds("FLARE_HANG_TIMEOUT", 0.0, 1e8);
  if (!(timeout_s > 0)) return false;
  out->timeout_ns = static_cast<int64_t>(timeout_s * 1e9);
  out->learn_factor = common::paramDouble("FLARE_HANG_LEARN_FACTOR", 0.0, 1e6);
  const std::string ops = common::paramString("FLARE_HANG_TIMEOUT_OPS");
  std::vector<std::string> errors;
  hang::parseOpTimeouts(ops, &out->op_timeouts, &errors);
  for (const std::string& e : errors) {
    common::configWarning("flare: FLARE_HANG_TIMEOUT_OPS " + e +
                          "; that entry is ignored (format: NAME=DURATION[,...], e.g. "
                          "ncclAllReduce=30m,collective=900)");
  }
  return true;
}

void HangWatch::onSignature(uint32_t id, const timing::Signature& sig) {
  sigs_[id] = {sig.name, sig.kind};
}

void HangWatch::onOps(std::span<const timing::CompletedOp> ops) {
  for (const timing::CompletedOp& op : ops) {
    if (op.info.kind == timing::OpKind::kSync) continue;  // host spans are never stream heads
    watchdog_.learn(op.info.signature_id, op.end_ns - op.start_ns);
  }
}

void HangWatch::onHeads(int64_t now_ns, std::span<const timing::StreamHead> heads) {
  std::unordered_map<uint64_t, uint64_t> seen;
  for (const timing::StreamHead& h : heads) {
    auto [it, fresh] = stream_ids_.try_emplace({h.device, h.stream_id}, streams_.size() + 1);
    if (fresh) streams_.push_back({h.device, h.stream_id});
    const uint64_t id = it->second;
    seen[id] = h.key;
    auto k = head_keys_.find(id);
    if (k != head_keys_.end() && k->second == h.key) {  // same head as before
      watchdog_.setStarted(id, h.started, now_ns);
      continue;
    }
    hang::HeadOp op;
    op.op_id = h.key;
    auto sig = sigs_.find(h.info.signature_id);
    op.name = sig != sigs_.end() ? sig->second.first
                                 : std::string("signature ") + std::to_string(h.info.signature_id);
    op.kind = opKindName(h.info.kind);
    op.collective =
        h.info.kind == timing::OpKind::kCollective || h.info.kind == timing::OpKind::kP2P;
    op.since_ns = h.since_ns;
    op.started = h.started;
    op.signature = h.info.signature_id;
    op.comm_hash = h.info.comm_hash;
    op.seq = h.info.seq;
    op.nranks = h.info.nranks;
    op.device = h.device;
    constexpr uint8_t kBehindUntimed = timing::kOpAfterUntimed | timing::kOpInSampledOutStep;
    op.behind_untimed = (h.info.flags & kBehindUntimed) == kBehindUntimed;
    watchdog_.setHead(id, std::move(op));
  }
  for (auto it = head_keys_.begin(); it != head_keys_.end();) {
    if (!seen.contains(it->first)) {
      watchdog_.setIdle(it->first);
      it = head_keys_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, key] : seen) head_keys_[id] = key;

  if (auto s = watchdog_.poll(now_ns)) {
    flare::v1::HangReport r;
    r.set_time_unix_ns(wall_ns_ ? wall_ns_() : 0);
    r.set_episode(watchdog_.episodes());
    *r.mutable_first() = stuckOp(s->first);
    for (const hang::StuckStream& st : s->stuck) *r.add_stuck() = stuckOp(st);
    const flare::v1::StuckOp& f = r.first();
    FLARE_LOG_WARN("hang",
                   "flare: suspected hang: {} ({}{}{}) on device {} has not completed for {:.1f} s "
                   "(bound {:.1f} s); {} stream(s) stuck",
                   f.name(), f.kind(), f.communicator().empty() ? "" : " comm ",
                   f.communicator().empty() ? std::string()
                                            : f.communicator() + " seq " + std::to_string(f.seq()),
                   f.device(), static_cast<double>(f.age_ns()) / 1e9,
                   static_cast<double>(f.threshold_ns()) / 1e9, r.stuck_size());
    reports_.fetch_add(1, std::memory_order_relaxed);
    if (report_) report_(r);
  }
  last_heads_ns_.store(now_ns, std::memory_order_release);
}

flare::v1::StuckOp HangWatch::stuckOp(const hang::StuckStream& s) const {
  flare::v1::StuckOp o;
  o.set_name(s.op.name);
  o.set_kind(s.op.kind);
  if (s.op.collective && !s.op.started && s.op.behind_untimed) {
    // A compute hang in a step sampled out: the stuck kernel ran untimed, so it heads no stream;
    // the collective queued after it has not started. What is stuck is that compute (kind
    // "kernel", as the daemon's culprit rule reads it), not the collective (whose identity
    // stays as evidence).
    o.set_kind("kernel");
    o.set_name("compute not timed (its step sampled out) ahead of " + s.op.name);
  }
  if (s.op.collective && s.op.comm_hash != 0) {
    o.set_communicator(communicatorName(s.op.comm_hash));
    o.set_seq(s.op.seq);
    o.set_nranks(s.op.nranks);
  }
  o.set_device(s.op.device);
  if (s.stream >= 1 && s.stream <= streams_.size()) o.set_stream(streams_[s.stream - 1].second);
  o.set_age_ns(s.waited_ns);
  o.set_threshold_ns(s.threshold_ns);
  return o;
}

}  // namespace flare::hook
