#include "tools/replay/summary_replay.h"

#include <algorithm>
#include <limits>
#include <map>
#include <span>
#include <string>

#include "src/common/clock.h"
#include "src/common/text.h"
#include "src/timing/batch_builder.h"

namespace flare::replay {
namespace {

timing::OpKind kindOf(flare::v1::OpKind k) {
  using K = timing::OpKind;
  switch (k) {
    case flare::v1::OP_KIND_GEMM:
      return K::kGemm;
    case flare::v1::OP_KIND_ATTENTION:
      return K::kAttention;
    case flare::v1::OP_KIND_COLLECTIVE:
      return K::kCollective;
    case flare::v1::OP_KIND_P2P:
      return K::kP2P;
    case flare::v1::OP_KIND_MEMCPY:
      return K::kMemcpy;
    case flare::v1::OP_KIND_MEMSET:
      return K::kMemset;
    case flare::v1::OP_KIND_GRAPH:
      return K::kGraph;
    case flare::v1::OP_KIND_SYNC:
      return K::kSync;
    default:
      return K::kKernel;
  }
}

timing::Signature toSignature(const flare::v1::Signature& s) {
  timing::Signature out;
  out.name = s.name();
  out.kind = kindOf(s.kind());
  // "DTYPE_BF16" -> "bf16", which toProtoDType reads back as the same enum.
  out.dtype = s.dtype() == flare::v1::DTYPE_UNSPECIFIED
                  ? std::string()
                  : common::enumLabel(flare::v1::DType_Name(s.dtype()), "DTYPE_");
  out.shape.assign(s.shape().begin(), s.shape().end());
  out.layout = s.layout();
  return out;
}

}  // namespace

SummaryBatches toSummary(int rank, const std::vector<flare::v1::RecordBatch>& raw,
                         const std::vector<int64_t>& due_ns, bool finished,
                         int64_t summary_window_ns) {
  SummaryBatches out;
  int64_t current_due = 0;
  timing::BatchBuilderOptions opt;
  opt.clock_map = [] { return common::ClockMap(0, 0); };  // records are on the epoch clock
  opt.summary_mode = [] { return true; };
  opt.summary_window_ns = summary_window_ns;
  // A recorded trace carries no run-queue wait, and its thread ids are not this process's.
  opt.run_queue_wait = [](uint32_t) -> std::optional<int64_t> { return std::nullopt; };
  timing::BatchBuilder builder(rank, opt, [&](flare::v1::RecordBatch&& b) {
    b.set_created_ns(current_due);  // the builder stamps the wall clock; the plan's is wanted
    out.batches.push_back(std::move(b));
    out.due_ns.push_back(current_due);
  });
  // Watermark after raw batch i: the earliest issue of any later op (every op issued before it
  // has been added), so that steps close as they would on the rank.
  std::vector<int64_t> later_issue(raw.size() + 1, std::numeric_limits<int64_t>::max());
  for (size_t i = raw.size(); i-- > 0;) {
    later_issue[i] = later_issue[i + 1];
    for (const auto& k : raw[i].kernels()) later_issue[i] = std::min(later_issue[i], k.issue_ns());
  }
  // The builder feeds its step accumulator from the first addOps on (a rank's tracer hands it
  // ops before the first spans): an empty call starts it before the first batch's spans.
  builder.addOps({});
  std::map<uint32_t, timing::OpKind> kinds;
  std::map<uint32_t, uint64_t> sig_flops;
  std::vector<timing::CompletedOp> ops;
  std::vector<timing::CompletedSpan> spans;
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto& b = raw[i];
    current_due = due_ns[i];
    for (const auto& s : b.signatures()) {
      kinds[s.id()] = kindOf(s.kind());
      builder.addSignature(s.id(), toSignature(s));
    }
    for (const auto& a : b.api_names()) builder.addApiName(a.id(), a.qualified_name());
    if (b.has_device()) {
      timing::DeviceDescription d;
      d.index = static_cast<int>(b.device().index());
      d.name = b.device().name();
      d.uuid = b.device().uuid();
      d.pci_bus_id = b.device().pci_bus_id();
      d.sm_count = b.device().sm_count();
      d.clock_khz = b.device().clock_khz();
      d.cc_major = b.device().cc_major();
      d.cc_minor = b.device().cc_minor();
      d.memory_bytes = b.device().memory_bytes();
      builder.setDevice(d);
    }
    spans.clear();
    for (const auto& sp : b.spans()) {
      timing::CompletedSpan s;
      s.id = sp.id();
      s.api_id = sp.api_id();
      s.thread_id = static_cast<uint32_t>(sp.thread_id());
      s.parent_id = sp.parent_span_id();
      s.start_ns = sp.start_ns();
      s.end_ns = sp.end_ns();
      if (sp.has_gc()) {
        s.gc_generation = sp.gc().generation();
        s.gc_collected = sp.gc().collected();
        s.gc_uncollectable = sp.gc().uncollectable();
      }
      spans.push_back(s);
    }
    ops.clear();
    for (const auto& k : b.kernels()) {
      timing::CompletedOp op;
      op.info.signature_id = k.signature_id();
      auto kind = kinds.find(k.signature_id());
      op.info.kind = kind == kinds.end() ? timing::OpKind::kKernel : kind->second;
      op.info.flops = k.flops();
      op.info.bytes = k.bytes();
      if (k.has_collective()) {
        op.info.comm_hash = k.collective().comm_hash();
        op.info.seq = k.collective().seq();
        op.info.nranks = static_cast<uint32_t>(k.collective().nranks());
        op.info.peer = k.collective().has_peer() ? k.collective().peer() : -1;
      }
      op.stream_id = k.stream_id();
      op.device = k.device();
      op.thread_id = static_cast<uint32_t>(k.thread_id());
      op.issue_ns = k.issue_ns();
      op.start_ns = k.start_ns();
      op.end_ns = k.end_ns();
      op.parent_span_id = k.parent_span_id();
      op.correlation_id = k.correlation_id();
      ops.push_back(op);
    }
    // A rank's tracer hands ops and spans over as they complete, interleaved (its step
    // boundaries, `__next__` spans, close summary windows between the ops around them): the
    // batch's ops and spans go in by end time, in runs of one kind, as poller passes would.
    std::stable_sort(ops.begin(), ops.end(),
                     [](const auto& x, const auto& y) { return x.end_ns < y.end_ns; });
    std::stable_sort(spans.begin(), spans.end(),
                     [](const auto& x, const auto& y) { return x.end_ns < y.end_ns; });
    // Graph launches reach the builder when taken (at their call, long before they end),
    // ahead of the spans that completed after them (Sink::onGraphLaunches).
    std::vector<int64_t> graphs;
    for (const auto& op : ops) {
      if (op.info.kind == timing::OpKind::kGraph) graphs.push_back(op.issue_ns);
    }
    std::sort(graphs.begin(), graphs.end());
    size_t gi = 0;
    auto graphsUpTo = [&](int64_t t) {
      size_t gj = gi;
      while (gj < graphs.size() && graphs[gj] <= t) ++gj;
      if (gj > gi) builder.addGraphLaunches(std::span<const int64_t>(graphs.data() + gi, gj - gi));
      gi = gj;
    };
    size_t oi = 0, si = 0;
    while (oi < ops.size() || si < spans.size()) {
      if (si >= spans.size() || (oi < ops.size() && ops[oi].end_ns <= spans[si].end_ns)) {
        size_t oj = oi;
        while (oj < ops.size() && (si >= spans.size() || ops[oj].end_ns <= spans[si].end_ns)) ++oj;
        builder.addOps(std::span<const timing::CompletedOp>(ops.data() + oi, oj - oi));
        oi = oj;
      } else {
        size_t sj = si;
        while (sj < spans.size() && (oi >= ops.size() || spans[sj].end_ns < ops[oi].end_ns)) ++sj;
        graphsUpTo(spans[sj - 1].end_ns);
        builder.addSpans(std::span<const timing::CompletedSpan>(spans.data() + si, sj - si));
        si = sj;
      }
    }
    graphsUpTo(std::numeric_limits<int64_t>::max());
    if (b.has_drops()) {
      timing::DropCounters d;
      d.ring_full = b.drops().ring_full();
      d.events_exhausted = b.drops().events_exhausted();
      d.event_errors = b.drops().event_errors();
      d.capturing = b.drops().capturing();
      d.unfinished = b.drops().unfinished();
      d.spans_dropped = b.drops().spans_dropped();
      builder.setDrops(d);
    }
    if (later_issue[i + 1] != std::numeric_limits<int64_t>::max())
      builder.setWatermark(later_issue[i + 1]);
    builder.flush();
  }
  if (finished) builder.finish();
  return out;
}

}  // namespace flare::replay
