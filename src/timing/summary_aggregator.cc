#include "src/timing/summary_aggregator.h"

#include <algorithm>
#include <cmath>

#include "src/stats/kde.h"

namespace flare::timing {
namespace {

int64_t roundNs(double v) {
  return static_cast<int64_t>(std::llround(v));
}

}  // namespace

bool SummaryAggregator::shouldSummarize(OpKind kind) {
  switch (kind) {
    case OpKind::kKernel:
    case OpKind::kGemm:
    case OpKind::kAttention:
    case OpKind::kMemcpy:
    case OpKind::kMemset:
    case OpKind::kGraph:
      return true;
    case OpKind::kCollective:
    case OpKind::kP2P:
    case OpKind::kSync:
      return false;
  }
  return false;
}

void SummaryAggregator::add(const CompletedOp& op) {
  Acc& acc = accs_[Key{op.info.signature_id, op.stream_id, op.device}];
  if (acc.durations.empty()) {
    acc.first_start = op.start_ns;
    acc.last_end = op.end_ns;
  } else {
    acc.first_start = std::min(acc.first_start, op.start_ns);
    acc.last_end = std::max(acc.last_end, op.end_ns);
  }
  acc.durations.push_back(static_cast<double>(std::max<int64_t>(0, op.end_ns - op.start_ns)));
  const uint64_t w = op.info.weight > 0 ? op.info.weight : 1;
  acc.flops += op.info.flops * w;
  acc.bytes += op.info.bytes * w;
  acc.weights += w;
  if (!open_) {
    open_ = true;
    first_start_ns_ = op.start_ns;
    last_end_ns_ = op.end_ns;
  } else {
    first_start_ns_ = std::min(first_start_ns_, op.start_ns);
    last_end_ns_ = std::max(last_end_ns_, op.end_ns);
  }
}

std::vector<OpSummary> SummaryAggregator::take() {
  std::vector<OpSummary> out;
  if (!open_) return out;
  for (auto it = accs_.begin(); it != accs_.end();) {
    Acc& acc = it->second;
    if (acc.durations.empty()) {  // idle key: forget it (its vector's memory too)
      it = accs_.erase(it);
      continue;
    }
    OpSummary s;
    s.signature_id = std::get<0>(it->first);
    s.stream_id = std::get<1>(it->first);
    s.device = std::get<2>(it->first);
    s.window_start_ns = acc.first_start;
    s.window_end_ns = acc.last_end;
    const stats::Clustering clustering = stats::clusterDurations(acc.durations);
    for (const stats::DurationCluster& c : clustering.clusters) {
      s.clusters.push_back(SummaryCluster{c.count, roundNs(c.p50), roundNs(c.p99), roundNs(c.sum)});
    }
    if (acc.weights != acc.durations.size() && !s.clusters.empty()) {
      // Sampled: each cluster stands for its share of the weights (count and sum scaled by
      // weights / timed ops; the rounding goes to the largest cluster, so the counts sum to the
      // weights); its quantiles are the timed ops'.
      const double scale =
          static_cast<double>(acc.weights) / static_cast<double>(acc.durations.size());
      uint64_t given = 0;
      size_t largest = 0;
      for (size_t i = 1; i < s.clusters.size(); ++i) {
        if (s.clusters[i].count > s.clusters[largest].count) largest = i;
      }
      for (SummaryCluster& c : s.clusters) {
        c.sum_ns = roundNs(static_cast<double>(c.sum_ns) * scale);
        c.count = static_cast<uint64_t>(std::llround(static_cast<double>(c.count) * scale));
        given += c.count;
      }
      SummaryCluster& big = s.clusters[largest];
      big.count = big.count + acc.weights - given;  // unsigned wrap cancels: exact sum
      s.sampled_ops = acc.durations.size();
    }
    s.flops = acc.flops;
    s.bytes = acc.bytes;
    out.push_back(std::move(s));
    acc.durations.clear();  // keeps the capacity for the next window
    acc.flops = acc.bytes = acc.weights = 0;
    ++it;
  }
  open_ = false;
  return out;
}

}  // namespace flare::timing
