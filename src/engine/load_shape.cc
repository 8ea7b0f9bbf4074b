#include "src/engine/load_shape.h"

#include <cmath>

#include "src/records/step_stats.h"
#include "src/stats/sketch.h"

namespace flare::engine::load {

void addSignatures(v1::RecordBatch* b, int sigs) {
  for (int s = 1; s <= sigs; ++s) {
    v1::Signature* sig = b->add_signatures();
    sig->set_id(static_cast<uint32_t>(s));
    sig->set_name(s % 5 == 0 ? "ncclAllReduce" : "ampere_bf16_s16816gemm_128x128");
    sig->set_kind(s % 5 == 0 ? v1::OP_KIND_COLLECTIVE : v1::OP_KIND_GEMM);
    sig->set_dtype(v1::DTYPE_BF16);
    for (int64_t d : {int64_t{1}, int64_t{4096}, int64_t{128} * s, int64_t{4096}})
      sig->add_shape(d);
    sig->set_flops_per_call(2ull * 4096 * 128 * static_cast<uint64_t>(s) * 4096);
    if (s % 5 == 0) {
      sig->set_collective(v1::COLLECTIVE_KIND_ALL_REDUCE);
      sig->set_bytes_per_call(64ull << 20);
    }
  }
}

int addSummaryInterval(v1::RecordBatch* b, int sigs, int ops_per_step, int64_t now_ns,
                       int64_t interval_ns) {
  for (int s = 1; s <= sigs; ++s) {
    v1::KernelSummary* sm = b->add_summaries();
    sm->set_signature_id(static_cast<uint32_t>(s));
    sm->set_stream_id(7);
    sm->set_window_start_ns(now_ns - interval_ns);
    sm->set_window_end_ns(now_ns);
    for (int c = 0; c < 2; ++c) {
      auto* cl = sm->add_clusters();
      cl->set_count(c == 0 ? 190 : 10);
      cl->set_p50_ns(100000 * (c + 1) + s * 100);
      cl->set_p99_ns(130000 * (c + 1) + s * 100);
      cl->set_sum_ns(static_cast<int64_t>(cl->count()) * cl->p50_ns());
    }
  }
  if (ops_per_step <= 0) return sigs;
  v1::StepStats* st = b->add_step_stats();
  st->set_start_ns(now_ns - interval_ns);
  st->set_end_ns(now_ns);
  st->set_gpu_busy_ns(interval_ns * 9 / 10);
  st->set_inter_ns(interval_ns / 20);
  st->set_minority_ns(interval_ns / 10);
  st->set_gpu_ops(static_cast<uint64_t>(ops_per_step));
  stats::LatencySketch all(records::StepStats::kStepSketchAccuracy);
  stats::LatencySketch cause(records::StepStats::kStepSketchAccuracy);
  double sum = 0;
  for (int i = 0; i < ops_per_step; ++i) {
    const double v = 5e3 * std::pow(1e4, static_cast<double>(i) / ops_per_step);
    all.add(v);
    sum += v;
    if (i % 100 == 0) cause.add(v);
  }
  st->set_issue_latency_sum_ns(sum);
  st->set_issue_offset_sum_ns(0.5 * static_cast<double>(interval_ns) * ops_per_step);
  const auto bytes = all.serialize();
  st->set_issue_latency(bytes.data(), bytes.size());
  const auto cause_bytes = cause.serialize();
  for (const char* name : {"torch.cuda.synchronize", "gc.collect"}) {
    v1::HostCause* c = st->add_causes();
    c->set_name(name);
    c->set_issue_latency(cause_bytes.data(), cause_bytes.size());
  }
  return sigs + 1;
}

void addStepMarker(v1::RecordBatch* b, uint64_t step, int64_t now_ns, int64_t interval_ns) {
  v1::StepMarker* st = b->add_steps();
  st->set_step(step);
  st->set_start_ns(now_ns - interval_ns);
  st->set_end_ns(now_ns);
  st->set_samples(1024);
}

}  // namespace flare::engine::load
