#include "src/engine/diagnosis/job_metrics.h"

#include <algorithm>
#include <cctype>
#include <climits>

#include "src/engine/diagnosis/signals.h"
#include "src/records/op_kind.h"
#include "src/stats/quantile.h"

namespace flare::engine {
namespace {

double median(std::vector<double> v) {
  return v.empty() ? 0 : stats::quantileInPlace(v, 0.5);
}

bool isCompute(flare::v1::OpKind kind) {
  return kind == flare::v1::OP_KIND_GEMM || kind == flare::v1::OP_KIND_ATTENTION;
}

int64_t afterWarmup(const JobModel& job, int rank) {
  const auto starts = job.stepStarts(rank);
  return starts.size() >= 2 ? starts[1] : INT64_MIN;
}

}  // namespace

std::string collectiveKindName(flare::v1::CollectiveKind kind) {
  std::string name = flare::v1::CollectiveKind_Name(kind);
  const std::string prefix = "COLLECTIVE_KIND_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  if (name.empty()) name = "unknown";
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::map<uint32_t, std::vector<double>> collectiveBusbw(const JobModel& job) {
  std::map<std::pair<uint64_t, uint64_t>, std::vector<const Op*>> instances;
  for (const auto& [rank, r] : job.ranks()) {
    for (const Op& op : r.ops) {
      if (job.signatures()[op.sig].kind() == flare::v1::OP_KIND_COLLECTIVE && op.comm != 0)
        instances[{op.comm, op.seq}].push_back(&op);
    }
  }
  std::map<uint32_t, std::vector<double>> out;
  for (const auto& [key, members] : instances) {
    const Op* first = members.front();
    if (first->nranks <= 1 || static_cast<int>(members.size()) != first->nranks) continue;
    // From the last arrival to the completion, read on one rank's clock: the shortest member's
    // kernel (every member ends together, so the last to arrive waited for no one). The ranks'
    // clocks differ by up to ~20 µs after the tracer's mapping: max(end) − max(start) mixed two
    // of them and read a 90 µs collective 10-20% slow (link_slow measures it the same way).
    int64_t shortest = INT64_MAX;
    for (const Op* op : members) shortest = std::min(shortest, op->duration());
    const double t = static_cast<double>(shortest);
    if (t <= 0 || first->bytes == 0) continue;
    const auto& sig = job.signatures()[first->sig];
    out[first->sig].push_back(
        static_cast<double>(first->bytes) / t *
        records::busBandwidthFactor(sig.collective(), first->nranks));  // B/ns = GB/s
  }
  return out;
}

std::map<std::string, SignatureBusbw> signatureBusbw(const JobModel& job) {
  std::map<std::string, SignatureBusbw> out;
  for (auto& [sig, values] : collectiveBusbw(job)) {
    SignatureBusbw& b = out[signatureKey(job.signatures()[sig])];
    b.instances = values.size();
    b.gbps = median(std::move(values));
  }
  return out;
}

std::map<std::string, std::pair<double, uint32_t>> lowestBaselineBusbw(
    const std::vector<const JobModel*>& runs, uint64_t min_instances) {
  std::map<std::string, std::pair<double, uint32_t>> out;
  for (const JobModel* run : runs) {
    for (const auto& [key, b] : signatureBusbw(*run)) {
      if (b.instances < min_instances || b.gbps <= 0) continue;
      auto [it, added] = out.try_emplace(key, b.gbps, 1);
      if (!added) it->second = {std::min(it->second.first, b.gbps), it->second.second + 1};
    }
  }
  return out;
}

flare::v1::JobMetrics computeJobMetrics(const JobModel& job, const History* history,
                                        uint64_t samples_per_step) {
  flare::v1::JobMetrics m;
  // Throughput: per rank, step intervals after the warm-up step; the job: median over ranks.
  std::vector<double> rates, counts;
  uint64_t reported_samples = 0;
  for (const auto& [rank, r] : job.ranks()) {
    reported_samples = std::max(reported_samples, r.step_samples);
    const auto starts = job.stepStarts(rank);
    if (starts.size() < 3 || starts.back() <= starts[1]) continue;
    const double n = static_cast<double>(starts.size() - 2);
    rates.push_back(n / (static_cast<double>(starts.back() - starts[1]) / 1e9));
    counts.push_back(n);
  }
  m.set_steps(static_cast<uint32_t>(median(counts)));
  // Volume: each rank's batch bytes in the window over its step boundaries in the window.
  std::vector<double> volume;
  for (const auto& [rank, r] : job.ranks()) {
    const size_t steps = job.stepStarts(rank).size();
    if (steps == 0 || r.batch_bytes.empty()) continue;
    double bytes = 0;
    for (const auto& b : r.batch_bytes) bytes += static_cast<double>(b.second);
    volume.push_back(bytes / static_cast<double>(steps));
  }
  if (!volume.empty()) m.set_bytes_per_rank_step(median(volume));
  m.set_steps_per_second(median(rates));
  const uint64_t samples = samples_per_step > 0 ? samples_per_step : reported_samples;
  m.set_samples_per_second(m.steps_per_second() * static_cast<double>(samples));
  // Achieved TFLOPS: GEMM/attention FLOPs over their kernel time, after the warm-up step.
  double job_flops = 0, job_ns = 0;
  for (const auto& [rank, r] : job.ranks()) {
    const int64_t after = afterWarmup(job, rank);
    double flops = 0, ns = 0;
    for (const Op& op : r.ops) {
      if (op.issue < after || !isCompute(job.signatures()[op.sig].kind()) || op.flops == 0)
        continue;
      flops += static_cast<double>(op.flops);
      ns += static_cast<double>(op.duration());
    }
    for (const SummaryWindow& w : r.summaries) {  // MODE_SUMMARY
      // A window (1 s) may hold the warm-up too: the ones ending after it count.
      if (w.end < after || !isCompute(job.signatures()[w.sig].kind()) || w.flops <= 0) continue;
      flops += w.flops;
      ns += w.sumNs();
    }
    if (ns <= 0) continue;
    auto* rt = m.add_rank_tflops();
    rt->set_rank(rank);
    rt->set_tflops(flops / ns / 1e3);  // flop/ns = GFLOP/s
    job_flops += flops;
    job_ns += ns;
  }
  m.set_tflops(job_ns > 0 ? job_flops / job_ns / 1e3 : 0);
  // CPU wait per step: the figure cpu_contention compares, per rank.
  for (const auto& [rank, wait] : signals::runQueueWaitPerStep(job)) {
    auto* rq = m.add_rank_run_queue_wait();
    rq->set_rank(rank);
    rq->set_wait_ns(wait);
  }
  // Bus bandwidth per collective kind: median over complete instances.
  std::map<std::string, std::vector<double>> by_kind;
  for (auto& [sig, values] : collectiveBusbw(job)) {
    auto& v = by_kind[collectiveKindName(job.signatures()[sig].collective())];
    v.insert(v.end(), values.begin(), values.end());
  }
  for (auto& [kind, values] : by_kind) {
    auto* b = m.add_busbw();
    b->set_kind(kind);
    b->set_instances(values.size());
    b->set_busbw_gbps(median(values));
  }
  // Issue-latency W1 against healthy history.
  if (history != nullptr && history->runs > 0 && history->issue_latency.count() > 0) {
    stats::LatencySketch sketch;
    for (const auto& [rank, r] : job.ranks()) {
      for (double v : rankIssueLatencies(job, rank)) sketch.add(v);
    }
    if (sketch.count() > 0) {
      m.set_has_baseline(true);
      m.set_baseline_runs(static_cast<uint32_t>(history->runs));
      m.set_issue_latency_w1_ns(clippedW1(sketch, history->issue_latency, history->issue_cap_ns));
      m.set_issue_latency_w1_threshold_ns(history->issue_w1_threshold_ns);
    }
  }
  // Void percentages: median over ranks.
  std::vector<double> vi, vm;
  for (const auto& [rank, v] : voidPerRank(job)) {
    vi.push_back(v.v_inter);
    vm.push_back(v.v_minority);
  }
  m.set_v_inter(median(vi));
  m.set_v_minority(median(vm));
  return m;
}

}  // namespace flare::engine
