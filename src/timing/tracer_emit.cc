// The Tracer's hand-over to its Sink (tracer_impl.h), on the poller thread: new signatures and
// API names before the records that use them, spans, deep-trace records, completed ops in
// batches of at most kEmitBatch (the first naming the rank's device), drop counters when they
// change, and the periodic flush (finish after a final drain).
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "src/timing/tracer_impl.h"

namespace flare::timing {
using namespace tracer_internal;

namespace {

bool sameCounters(const DropCounters& a, const DropCounters& b) {
  return a.ring_full == b.ring_full && a.events_exhausted == b.events_exhausted &&
         a.event_errors == b.event_errors && a.capturing == b.capturing &&
         a.unfinished == b.unfinished && a.spans_dropped == b.spans_dropped;
}

}  // namespace

void Tracer::Impl::announceSignatures() {
  std::vector<Signature> fresh;
  {
    std::lock_guard<std::mutex> lock(intern_mu_);
    if (sigs_.size() == announced_) return;
    fresh.assign(sigs_.begin() + static_cast<std::ptrdiff_t>(announced_), sigs_.end());
  }
  for (const Signature& sig : fresh) {
    ++announced_;
    sink_->onSignature(static_cast<uint32_t>(announced_), sig);
  }
}

// API names are process-wide (spans.cc); each Tracer announces the new ones to its sink, before
// the spans taken in the same pass (a span's name was interned before the span was opened).
void Tracer::Impl::announceApis() {
  std::vector<std::string> fresh = apiNamesAfter(apis_announced_);
  for (const std::string& name : fresh) sink_->onApiName(++apis_announced_, name);
}

void Tracer::Impl::emitSpans() {
  // A graph launch of a step is taken in the pass of that step's DataLoader call or an earlier
  // one (it is pushed before the next call starts): handed over before the spans, the step rule
  // sees it before the call that ends its step.
  if (!graph_launches_.empty()) {
    struct ClearLaunches {
      std::vector<int64_t>& v;
      ~ClearLaunches() { v.clear(); }
    } clear_launches{graph_launches_};
    sink_->onGraphLaunches(graph_launches_);
  }
  if (span_out_.empty()) return;
  struct Clear {
    std::vector<CompletedSpan>& spans;
    ~Clear() { spans.clear(); }
  } clear{span_out_};
  sink_->onSpans(span_out_);
}

void Tracer::Impl::emitDeepTrace() {
  std::vector<DeepTraceRecord> out;
  {
    std::lock_guard<std::mutex> lock(deep_mu_);
    if (deep_pending_.empty()) return;
    out.swap(deep_pending_);
  }
  sink_->onDeepTrace(out);
}

void Tracer::Impl::emitOps() {
  if (out_.empty()) return;
  struct Clear {
    std::vector<CompletedOp>& ops;
    ~Clear() { ops.clear(); }
  } clear{out_};
  if (!device_described_) {
    // The first GPU op names the rank's device: ask the driver once, on this thread.
    for (const CompletedOp& op : out_) {
      if (op.info.kind == OpKind::kSync) continue;
      device_described_ = true;
      DeviceDescription d;
      if (timer_->describeDevice(op.device, &d)) sink_->onDevice(d);
      break;
    }
  }
  sink_->onOps(out_);
}

void Tracer::Impl::sendDrops() {
  const DropCounters totals = drops();
  if (sameCounters(totals, last_drops_)) return;
  last_drops_ = totals;
  sink_->onDrops(totals);
}

void Tracer::Impl::flushSink() {
  if (final_drain_.load(std::memory_order_relaxed)) {
    sayUnmeasuredGaps();
    sink_->finish();
  } else {
    sink_->flush();
  }
}

}  // namespace flare::timing
