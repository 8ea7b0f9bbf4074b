#include "src/engine/diagnosis/history.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <span>

#include "flare/step.h"
#include "src/engine/diagnosis/job_metrics.h"
#include "src/engine/diagnosis/signals.h"
#include "src/stats/quantile.h"
#include "src/stats/wasserstein.h"

namespace flare::engine {
namespace {

double median(std::vector<double> v) {
  return v.empty() ? 0 : stats::quantileInPlace(v, 0.5);
}

std::string opKindName(const flare::v1::Signature& sig) {
  if (sig.kind() == flare::v1::OP_KIND_COLLECTIVE) return collectiveKindName(sig.collective());
  std::string name = flare::v1::OpKind_Name(sig.kind());
  const std::string prefix = "OP_KIND_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::string serialize(const stats::LatencySketch& s) {
  const auto bytes = s.serialize();
  return std::string(bytes.begin(), bytes.end());
}

std::optional<stats::LatencySketch> deserialize(const std::string& bytes) {
  return stats::LatencySketch::deserialize(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

}  // namespace

double clippedW1(const stats::LatencySketch& a, const stats::LatencySketch& b, double cap,
                 bool below) {
  if (a.count() == 0 || b.count() == 0) return 0;
  constexpr int kPoints = 1000;
  double sum = 0;
  for (int i = 0; i < kPoints; ++i) {
    const double u = (i + 0.5) / kPoints;
    const double d = std::min(b.quantile(u), cap) - std::min(a.quantile(u), cap);
    sum += below ? std::max(d, 0.0) : std::abs(d);
  }
  return sum / kPoints;
}

flare::v1::HealthyBaseline makeBaseline(const JobModel& job) {
  flare::v1::HealthyBaseline b;
  // Issue latencies: job-wide, per op kind, and the spread of single ranks around the run.
  stats::LatencySketch all;
  std::map<std::string, stats::LatencySketch> by_kind;
  std::vector<double> pooled;
  std::map<int, std::vector<double>> per_rank;
  uint64_t ops = 0;
  for (const auto& [rank, r] : job.ranks()) {
    const auto starts = job.stepStarts(rank);
    const int64_t after = starts.size() >= 2 ? starts[1] : INT64_MIN;
    for (const Op& op : r.ops) ops += op.weight;  // 1-in-N sampled kernels: estimated
    for (const SummaryWindow& w : r.summaries) ops += w.count();
    // Per op kind: the raw ops (in MODE_SUMMARY the collectives and syncs only).
    for (const Op& op : r.ops) {
      const auto& sig = job.signatures()[op.sig];
      if (op.issue < after || sig.kind() == flare::v1::OP_KIND_SYNC) continue;
      by_kind[opKindName(sig)].add(static_cast<double>(op.issueLatency()));
    }
    // Every GPU op after the warm-up: raw, or rebuilt from MODE_SUMMARY's step sketches.
    for (double v : rankIssueLatencies(job, rank)) {
      all.add(v);
      pooled.push_back(v);
      per_rank[rank].push_back(v);
    }
  }
  b.set_ops(ops);
  b.set_issue_latency(serialize(all));
  for (const auto& [kind, s] : by_kind) (*b.mutable_issue_latency_by_kind())[kind] = serialize(s);
  if (!pooled.empty()) {
    const double cap = median(pooled);
    auto clip = [cap](std::vector<double>* v) {
      for (double& x : *v) x = std::min(x, cap);
    };
    clip(&pooled);
    double spread = 0;
    for (auto& [rank, v] : per_rank) {
      if (v.size() < 30) continue;
      clip(&v);
      spread = std::max(
          spread, stats::wasserstein1(std::span<const double>(v), std::span<const double>(pooled)));
    }
    b.set_rank_spread_w1_ns(spread);
  }
  // Void percentages.
  std::vector<double> vi, vm;
  for (const auto& [rank, v] : voidPerRank(job)) {
    vi.push_back(v.v_inter);
    vm.push_back(v.v_minority);
  }
  b.set_v_inter(median(vi));
  b.set_v_minority(median(vm));
  b.set_v_inter_max(vi.empty() ? 0 : *std::max_element(vi.begin(), vi.end()));
  b.set_v_minority_max(vm.empty() ? 0 : *std::max_element(vm.begin(), vm.end()));
  // Per signature: median duration over every rank (after warm-up), TFLOPS, busbw.
  std::map<uint32_t, std::vector<double>> durations;
  std::map<uint32_t, double> flops;
  for (const auto& [rank, r] : job.ranks()) {
    const auto starts = job.stepStarts(rank);
    const int64_t after = starts.size() >= 2 ? starts[1] : INT64_MIN;
    for (const Op& op : r.ops) {
      const auto& sig = job.signatures()[op.sig];
      if (op.issue < after || sig.kind() == flare::v1::OP_KIND_SYNC ||
          sig.name() == FLARE_STEP_MARKER_NAME)
        continue;
      // A 1-in-N sampled launch stands for `weight` launches (the baseline's count).
      durations[op.sig].insert(durations[op.sig].end(), op.weight,
                               static_cast<double>(op.duration()));
      if (op.flops > 0) flops[op.sig] = static_cast<double>(op.flops);
    }
    // MODE_SUMMARY: each cluster's median for its count; windows that end after the warm-up.
    for (const SummaryWindow& w : r.summaries) {
      const auto& sig = job.signatures()[w.sig];
      if (w.end < after || sig.kind() == flare::v1::OP_KIND_SYNC) continue;
      std::vector<double>& d = durations[w.sig];
      for (const auto& c : w.clusters) d.insert(d.end(), c.count, c.p50);
      if (w.flops > 0 && w.count() > 0) flops[w.sig] = w.flops / static_cast<double>(w.count());
    }
  }
  const auto busbw = collectiveBusbw(job);
  for (auto& [sig_id, d] : durations) {
    auto* s = b.add_signatures();
    *s->mutable_signature() = job.signatures()[sig_id];
    s->mutable_signature()->set_id(0);
    s->set_count(d.size());
    const double p50 = median(d);
    s->set_p50_ns(static_cast<int64_t>(p50));
    const auto kind = job.signatures()[sig_id].kind();
    if ((kind == flare::v1::OP_KIND_GEMM || kind == flare::v1::OP_KIND_ATTENTION) && p50 > 0 &&
        flops.contains(sig_id)) {
      s->set_tflops(flops[sig_id] / p50 / 1e3);
    }
    if (auto it = busbw.find(sig_id); it != busbw.end()) s->set_busbw_gbps(median(it->second));
  }
  const ApiRates rates = apiRates(job);
  for (const auto& [name, r] : rates.spans) (*b.mutable_api_rate())[name] = r;
  for (const auto& [name, r] : rates.syncs) (*b.mutable_sync_rate())[name] = r;
  *b.mutable_metrics() = computeJobMetrics(job, nullptr, 0);
  return b;
}

History buildHistory(const std::vector<const flare::v1::HealthyBaseline*>& runs,
                     const HistoryOptions& options) {
  History h;
  std::vector<stats::LatencySketch> sketches;
  std::vector<const flare::v1::HealthyBaseline*> used;
  for (const auto* run : runs) {
    auto s = deserialize(run->issue_latency());
    if (!s || s->count() == 0) continue;
    if (!sketches.empty() && !h.issue_latency.merge(*s)) continue;
    if (sketches.empty()) h.issue_latency = *s;
    sketches.push_back(std::move(*s));
    used.push_back(run);
  }
  h.runs = used.size();
  if (h.runs == 0) return h;
  h.issue_cap_ns = h.issue_latency.quantile(0.5);
  double spread = 0;
  for (size_t i = 0; i < sketches.size(); ++i) {
    spread = std::max(spread, used[i]->rank_spread_w1_ns());
    for (size_t j = i + 1; j < sketches.size(); ++j)
      spread = std::max(spread, clippedW1(sketches[i], sketches[j], h.issue_cap_ns));
  }
  h.issue_w1_threshold_ns = std::max(options.w1_floor_ns, options.w1_margin * spread);
  double vi = 0, vm = 0;
  bool has_void = false;
  for (const auto* run : used) {
    if (run->metrics().steps() == 0) continue;  // no step boundaries: no void percentages
    has_void = true;
    vi = std::max(vi, run->v_inter_max());
    vm = std::max(vm, run->v_minority_max());
  }
  if (has_void) {
    h.v_inter_threshold = std::max(2 * vi, vi + options.void_margin);
    h.v_minority_threshold = std::max(2 * vm, vm + options.void_margin);
  }
  for (const auto* run : used) {
    for (const auto& [name, r] : run->api_rate()) h.api_rate[name] += r / h.runs;
    for (const auto& [name, r] : run->sync_rate()) h.sync_rate[name] += r / h.runs;
  }
  std::map<std::string, std::vector<const flare::v1::BaselineSignature*>> sigs;
  for (const auto* run : used) {
    for (const auto& s : run->signatures()) sigs[signatureKey(s.signature())].push_back(&s);
  }
  for (const auto& [key, list] : sigs) {
    std::vector<double> p50, tf, bw;  // bw: the runs that measured a job busbw only
    for (const auto* s : list) {
      p50.push_back(static_cast<double>(s->p50_ns()));
      tf.push_back(s->tflops());
      if (s->busbw_gbps() > 0) bw.push_back(s->busbw_gbps());
    }
    HistorySignature& hs = h.signatures[key];
    hs = {static_cast<uint32_t>(list.size()), median(p50), median(tf), median(bw)};
    if (!bw.empty()) {
      hs.busbw_low_gbps = *std::min_element(bw.begin(), bw.end());
      hs.busbw_runs = static_cast<uint32_t>(bw.size());
    }
  }
  return h;
}

}  // namespace flare::engine
