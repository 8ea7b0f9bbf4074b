#include "src/timing/batch_builder.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <string_view>
#include <utility>

#include "flare/step.h"
#include "src/common/log.h"
#include "src/records/op_kind.h"
#include "src/records/step_stats_wire.h"
#include "src/timing/run_queue.h"

namespace flare::timing {
namespace {

constexpr size_t kRecordOverhead = 3;  // tag and length of a repeated message

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool startsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

flare::v1::CollectiveKind collectiveKind(std::string_view name) {
  std::string op = lower(startsWith(name, "nccl") ? name.substr(4) : name);
  using K = flare::v1::CollectiveKind;
  if (op == "allreduce") return K::COLLECTIVE_KIND_ALL_REDUCE;
  if (op == "allgather") return K::COLLECTIVE_KIND_ALL_GATHER;
  if (op == "reducescatter") return K::COLLECTIVE_KIND_REDUCE_SCATTER;
  if (op == "broadcast" || op == "bcast") return K::COLLECTIVE_KIND_BROADCAST;
  if (op == "reduce") return K::COLLECTIVE_KIND_REDUCE;
  if (op == "send") return K::COLLECTIVE_KIND_SEND;
  if (op == "recv") return K::COLLECTIVE_KIND_RECV;
  if (op == "alltoall") return K::COLLECTIVE_KIND_ALL_TO_ALL;
  if (op == "group" || op == "groupend") return K::COLLECTIVE_KIND_GROUP;
  return K::COLLECTIVE_KIND_UNSPECIFIED;
}

// The library an API name belongs to; "" for kernel names.
std::string libraryOf(std::string_view name) {
  if (startsWith(name, "cublasLt")) return "cublasLt";
  if (startsWith(name, "cublas")) return "cublas";
  if (startsWith(name, "nccl")) return "nccl";
  if (startsWith(name, "cuda")) return "cudart";
  if (name.size() > 2 && startsWith(name, "cu") &&
      std::isupper(static_cast<unsigned char>(name[2])))
    return "driver";
  return "";
}

// The shared fact (src/records/op_kind.h) on the hook's own kind.
bool isCollective(OpKind kind) {
  return records::isCollective(toProtoKind(kind));
}

}  // namespace

flare::v1::OpKind toProtoKind(OpKind kind) {
  using P = flare::v1::OpKind;
  switch (kind) {
    case OpKind::kKernel:
      return P::OP_KIND_KERNEL;
    case OpKind::kGemm:
      return P::OP_KIND_GEMM;
    case OpKind::kAttention:
      return P::OP_KIND_ATTENTION;
    case OpKind::kCollective:
      return P::OP_KIND_COLLECTIVE;
    case OpKind::kP2P:
      return P::OP_KIND_P2P;
    case OpKind::kMemcpy:
      return P::OP_KIND_MEMCPY;
    case OpKind::kMemset:
      return P::OP_KIND_MEMSET;
    case OpKind::kGraph:
      return P::OP_KIND_GRAPH;
    case OpKind::kSync:
      return P::OP_KIND_SYNC;
  }
  return P::OP_KIND_UNSPECIFIED;
}

flare::v1::DType toProtoDType(const std::string& dtype) {
  using D = flare::v1::DType;
  const std::string t = lower(dtype);
  if (t == "f32" || t == "fp32" || t == "float32" || t == "float") return D::DTYPE_F32;
  if (t == "f16" || t == "fp16" || t == "float16" || t == "half") return D::DTYPE_F16;
  if (t == "bf16" || t == "bfloat16") return D::DTYPE_BF16;
  if (t == "f8e4m3" || t == "fp8_e4m3" || t == "e4m3" || t == "float8_e4m3fn")
    return D::DTYPE_F8E4M3;
  if (t == "f8e5m2" || t == "fp8_e5m2" || t == "e5m2" || t == "float8_e5m2") return D::DTYPE_F8E5M2;
  if (t == "i8" || t == "int8") return D::DTYPE_I8;
  if (t == "i32" || t == "int32") return D::DTYPE_I32;
  if (t == "f64" || t == "fp64" || t == "float64" || t == "double") return D::DTYPE_F64;
  if (t == "u8" || t == "uint8") return D::DTYPE_U8;
  if (t == "i64" || t == "int64") return D::DTYPE_I64;
  if (t == "u32" || t == "uint32") return D::DTYPE_U32;
  if (t == "u64" || t == "uint64") return D::DTYPE_U64;
  if (t == "f4e2m1" || t == "fp4" || t == "e2m1") return D::DTYPE_F4E2M1;
  if (t == "f8e8m0" || t == "e8m0") return D::DTYPE_F8E8M0;
  if (t == "c32" || t == "complex64") return D::DTYPE_C32;
  if (t == "c64" || t == "complex128") return D::DTYPE_C64;
  return D::DTYPE_UNSPECIFIED;
}

BatchBuilder::BatchBuilder(int rank, BatchBuilderOptions options, Emit emit)
    : rank_(rank),
      options_(std::move(options)),
      emit_(std::move(emit)),
      aggregator_(options_.summary_window_ns) {
  if (!options_.run_queue_wait) {
    auto reader = std::make_shared<RunQueueReader>();
    options_.run_queue_wait = [reader](uint32_t tid) { return reader->read(tid); };
    if (!options_.run_queue_off) options_.run_queue_off = [reader] { return reader->off(); };
  }
  if (!options_.now_ns) options_.now_ns = [] { return common::monotonicNs(); };
  if (!options_.step_decisions) options_.step_decisions = takeStepDecisions;
}

void BatchBuilder::pullStepDecisions() {
  std::vector<StepDecision> d = options_.step_decisions();
  if (d.empty()) return;
  std::vector<CompletedOp> confirmed;  // a measured step's ops, for the steps before it
  for (const StepDecision& one : d) measured_ops_.noteDecision(one, &confirmed);
  for (const CompletedOp& op : confirmed) aggregator_.add(op);
  decisions_.add(std::move(d));
}

uint64_t BatchBuilder::stepSampledWeight(const CompletedOp& op) {
  if (decisions_.empty()) return op.info.weight;
  const StepDecision* at = decisions_.inForceAt(op.issue_ns);
  if (!stepSampledKind(op.info.kind)) {  // a collective, p2p, graph launch or synchronization
    measured_ops_.noteEveryStepOp(at);
    return op.info.weight;
  }
  if (op.info.flags & kOpFirstCalls) {  // stands for itself wherever it falls
    measured_ops_.credit(op, at);
    return op.info.weight;
  }
  // A timed op of a measured step stands for its kind of work in the steps sampled out before
  // it too (the kernel summaries' counts, time, FLOPs, bytes) once the next boundary confirms
  // it a step, and the last such step's for those no measured step stands for (finish()), less
  // what a signature's first calls already hold.
  return measured_ops_.offer(op, at);
}

void BatchBuilder::addTailSteps() {
  pullStepDecisions();
  const uint32_t tail = measured_ops_.tailSteps();
  if (tail == 0) return;
  if (!measured_ops_.complete()) {
    common::logOnce(common::LogLevel::kWarn, "timing", "step-sampling-tail",
                    "flare: the {} step(s) sampled out after the last measured one are not in "
                    "the kernel summaries: that step timed more than {} ops, more than are kept "
                    "to stand for them",
                    tail, MeasuredStepOps::kMaxOps);
    return;
  }
  for (const CompletedOp& op : measured_ops_.tailOps()) aggregator_.add(op);
  measured_ops_.reset();
}

void BatchBuilder::readRunQueue() {
  const int64_t now = options_.now_ns();
  if (run_queue_read_ns_ != INT64_MIN && now - run_queue_read_ns_ < options_.run_queue_period_ns)
    return;
  run_queue_read_ns_ = now;
  for (const auto& [thread, last_issue] : steps_.issuingThreads()) {
    if (auto waited = options_.run_queue_wait(static_cast<uint32_t>(thread)))
      steps_.addRunQueueWait(thread, now, *waited);
  }
}

void BatchBuilder::openBatch() {
  batch_.Clear();
  collectives_.reset();
  batch_size_ = 0;
  clock_map_ = options_.clock_map ? options_.clock_map() : common::ClockMap::sample();
  batch_open_ = true;
}

void BatchBuilder::account(size_t bytes) {
  batch_size_ += bytes + kRecordOverhead;
  if (batch_size_ >= options_.batch_bytes) closeBatch();
}

void BatchBuilder::addSignature(uint32_t id, const Signature& sig) {
  if (!batch_open_) openBatch();
  flare::v1::Signature* out = batch_.add_signatures();
  out->set_id(id);
  out->set_name(sig.name);
  out->set_kind(toProtoKind(sig.kind));
  out->set_dtype(toProtoDType(sig.dtype));
  for (int64_t dim : sig.shape) out->add_shape(dim);
  out->set_layout(sig.layout);
  if (isCollective(sig.kind)) {
    out->set_collective(collectiveKind(sig.name));
    if (!sig.shape.empty()) collective_counts_[id] = static_cast<uint64_t>(sig.shape[0]);
  }
  out->set_library(libraryOf(sig.name));
  if (sig.kind == OpKind::kSync) {
    const bool marker = sig.name == FLARE_STEP_MARKER_NAME;
    syncs_[id] = SyncSignature{sig.name, marker,
                               !marker && sig.name.find("Synchronize") == std::string::npos};
  }
  account(out->ByteSizeLong());
}

bool BatchBuilder::summarizing() {
  const bool summarize = options_.summary_mode && options_.summary_mode();
  setStepSamplingAllowed(summarize);
  if (summarize != accumulating_) {
    steps_.reset();  // a mode change starts the per-step figures afresh
    measured_ops_.reset();
    accumulating_ = summarize;
  }
  return summarize;
}

void BatchBuilder::addOps(std::span<const CompletedOp> ops) {
  const bool summarize = summarizing();
  if (summarize) pullStepDecisions();
  for (const CompletedOp& op : ops) {
    if (summarize) {
      const SyncSignature* sync = nullptr;
      if (op.info.kind != OpKind::kSync) {
        steps_.addGpuOp(op.issue_ns, op.start_ns, op.end_ns, op.info.kind == OpKind::kKernel,
                        op.thread_id, op.info.weight);
        if (const uint64_t weight = stepSampledWeight(op); weight != op.info.weight) {
          CompletedOp weighted = op;
          weighted.info.weight = static_cast<uint16_t>(std::min<uint64_t>(weight, UINT16_MAX));
          aggregator_.add(weighted);
          continue;
        }
      } else if (auto it = syncs_.find(op.info.signature_id); it != syncs_.end()) {
        sync = &it->second;
        if (!sync->marker) stepSampledWeight(op);  // timed in every step: counted per step
        if (sync->marker) {
          steps_.addStepMarker(op.start_ns);
          noteStepBoundary();
        } else {
          steps_.addHostEvent(op.start_ns, op.end_ns, op.thread_id, sync->name);
        }
      }
      if (SummaryAggregator::shouldSummarize(op.info.kind) ||
          (sync != nullptr && sync->summarised)) {
        aggregator_.add(op);
        continue;
      }
    }
    if (!batch_open_) openBatch();
    // MODE_SUMMARY's collectives go into the batch's compact collective blocks.
    const bool compact = summarize && isCollective(op.info.kind);
    flare::v1::KernelRecord* rec = compact ? &scratch_ : batch_.add_kernels();
    if (compact) scratch_.Clear();
    rec->set_signature_id(op.info.signature_id);
    rec->set_stream_id(op.stream_id);
    rec->set_device(op.device);
    rec->set_issue_ns(clock_map_.fromMonotonic(op.issue_ns));
    rec->set_start_ns(clock_map_.fromMonotonic(op.start_ns));
    rec->set_end_ns(clock_map_.fromMonotonic(op.end_ns));
    rec->set_issue_latency_ns(op.start_ns - op.issue_ns);
    rec->set_flops(op.info.flops);
    rec->set_bytes(op.info.bytes);
    if (op.info.weight > 1) rec->set_weight(op.info.weight);
    if (isCollective(op.info.kind)) {
      flare::v1::CollectiveInfo* coll = rec->mutable_collective();
      coll->set_comm_hash(op.info.comm_hash);
      coll->set_seq(op.info.seq);
      coll->set_nranks(static_cast<int32_t>(op.info.nranks));
      if (op.info.peer >= 0) coll->set_peer(op.info.peer);
      auto count = collective_counts_.find(op.info.signature_id);
      if (count != collective_counts_.end()) coll->set_count(count->second);
    }
    if (!summarize) {  // MODE_SUMMARY: what stays raw carries no host-side join keys
      if (op.info.kind != OpKind::kSync) raw_issuers_[op.thread_id] = op.issue_ns;
      rec->set_thread_id(op.thread_id);
      rec->set_parent_span_id(op.parent_span_id);
      rec->set_correlation_id(op.correlation_id);
    }
    account(compact ? collectives_.add(*rec, &batch_) : rec->ByteSizeLong());
  }
  if (aggregator_.due()) addSummaries();
  if (summarize) {
    addStepStats(false);
  } else {
    addRunQueueReadings();
  }
}

void BatchBuilder::addRunQueueReadings() {
  const int64_t now = options_.now_ns();
  if (raw_issuers_.empty() || (run_queue_read_ns_ != INT64_MIN &&
                               now - run_queue_read_ns_ < options_.raw_run_queue_period_ns))
    return;
  run_queue_read_ns_ = now;
  for (auto it = raw_issuers_.begin(); it != raw_issuers_.end();) {
    if (now - it->second > kRawIssuerIdleNs) {  // no launch for a while: no longer read
      it = raw_issuers_.erase(it);
      continue;
    }
    if (auto waited = options_.run_queue_wait(static_cast<uint32_t>(it->first))) {
      if (!batch_open_) openBatch();
      flare::v1::RunQueueReading* out = batch_.add_run_queue();
      out->set_thread_id(it->first);
      out->set_time_ns(clock_map_.fromMonotonic(now));
      out->set_waited_ns(*waited);
      account(out->ByteSizeLong());
    }
    ++it;
  }
}

void BatchBuilder::setWatermark(int64_t issued_before_ns) {
  steps_.setWatermark(issued_before_ns);
  if (accumulating_) addStepStats(false);
}

void BatchBuilder::noteStepBoundary() {
  // The warm-up step gets windows of its own (the detectors leave it out, as in raw mode): the
  // open window closes at the first two step boundaries, then every summary_window_ns.
  if (boundaries_seen_ < 2) {
    ++boundaries_seen_;
    if (!aggregator_.empty()) addSummaries();
  }
}

void BatchBuilder::addStepStats(bool final) {
  readRunQueue();
  pullStepDecisions();
  int64_t last_start = INT64_MIN;
  for (records::StepResult& r : steps_.take(final)) {
    last_start = std::max(last_start, r.stats.start_ns);
    if (!decisions_.empty() && !decisions_.measured(r.stats.start_ns, r.stats.end_ns))
      r.stats.sampled_out = true;
    if (!batch_open_) openBatch();
    flare::v1::StepStats* out = batch_.add_step_stats();
    records::encodeStepStats(
        r, [this](int64_t t) { return clock_map_.fromMonotonic(t); }, out);
    if (r.stats.run_queue_wait_ns < 0 && options_.run_queue_off && options_.run_queue_off())
      ++run_queue_unmeasured_;
    account(out->ByteSizeLong());
  }
  // Ops still to come are of the steps not taken yet (or late ops of the last one taken).
  if (last_start != INT64_MIN) decisions_.forgetBefore(last_start);
}

void BatchBuilder::addSummaries() {
  for (const OpSummary& s : aggregator_.take()) {
    if (!batch_open_) openBatch();
    flare::v1::KernelSummary* out = batch_.add_summaries();
    out->set_signature_id(s.signature_id);
    out->set_stream_id(s.stream_id);
    out->set_device(s.device);
    out->set_window_start_ns(clock_map_.fromMonotonic(s.window_start_ns));
    out->set_window_end_ns(clock_map_.fromMonotonic(s.window_end_ns));
    out->set_flops(s.flops);
    out->set_bytes(s.bytes);
    if (s.sampled_ops != 0) out->set_sampled_ops(s.sampled_ops);
    for (const SummaryCluster& c : s.clusters) {
      flare::v1::KernelSummary::Cluster* cl = out->add_clusters();
      cl->set_count(c.count);
      cl->set_p50_ns(c.p50_ns);
      cl->set_p99_ns(c.p99_ns);
      cl->set_sum_ns(c.sum_ns);
    }
    account(out->ByteSizeLong());
  }
}

void BatchBuilder::addApiName(uint32_t id, const std::string& qualified_name) {
  if (!batch_open_) openBatch();
  flare::v1::ApiName* out = batch_.add_api_names();
  out->set_id(id);
  out->set_qualified_name(qualified_name);
  api_names_[id] = {qualified_name, records::stepCallKind(qualified_name)};
  account(out->ByteSizeLong());
}

void BatchBuilder::summarizeSpans(std::span<const CompletedSpan> spans) {
  // A traced call may hold up launches; `__next__` marks the input wait, and the step rule
  // says which `__next__` starts a step. The rule compares start times, and a pass hands its
  // spans over in completion order, thread by thread: its loader and training calls are fed
  // in start order.
  // A CUDA graph launch is training work: a step captured whole replays its backward and
  // optimizer inside the graph, with no such call on the host.
  step_calls_.clear();
  for (int64_t t : graph_launches_)
    step_calls_.push_back({t, nullptr, records::StepCallKind::kTraining});
  graph_launches_.clear();
  for (const CompletedSpan& span : spans) {
    auto api = api_names_.find(span.api_id);
    if (api == api_names_.end()) continue;
    steps_.addHostEvent(span.start_ns, span.end_ns, span.thread_id, api->second.name);
    if (api->second.kind != records::StepCallKind::kOther)
      step_calls_.push_back({span.start_ns, &span, api->second.kind});
  }
  std::stable_sort(step_calls_.begin(), step_calls_.end(),
                   [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  for (const auto& [start_ns, span, kind] : step_calls_) {
    const bool starts_step = step_rule_.add(kind, start_ns);
    if (kind != records::StepCallKind::kLoader) continue;
    steps_.addLoaderSpan(span->start_ns, span->end_ns, starts_step);
    if (starts_step) noteStepBoundary();
  }
}

void BatchBuilder::addGraphLaunches(std::span<const int64_t> issue_ns) {
  if (!summarizing()) return;
  graph_launches_.insert(graph_launches_.end(), issue_ns.begin(), issue_ns.end());
  // A process that launches graphs and traces no DataLoader hands no spans over: keep the
  // newest launches only (the rule needs the latest training work before each call).
  constexpr size_t kKeep = 4096;
  if (graph_launches_.size() > kKeep)
    graph_launches_.erase(graph_launches_.begin(), graph_launches_.end() - kKeep / 2);
}

void BatchBuilder::addSpans(std::span<const CompletedSpan> spans) {
  // The mode is asked here too: the poller hands a pass's spans over before its ops, and
  // DataLoader calls before the rank's first op are step boundaries all the same.
  if (summarizing()) summarizeSpans(spans);
  for (const CompletedSpan& span : spans) {
    if (!batch_open_) openBatch();
    flare::v1::ApiSpan* out = batch_.add_spans();
    out->set_id(span.id);
    out->set_api_id(span.api_id);
    out->set_thread_id(span.thread_id);
    out->set_start_ns(clock_map_.fromMonotonic(span.start_ns));
    out->set_end_ns(clock_map_.fromMonotonic(span.end_ns));
    out->set_parent_span_id(span.parent_id);
    if (span.gc_generation >= 0) {
      flare::v1::GcInfo* gc = out->mutable_gc();
      gc->set_generation(span.gc_generation);
      gc->set_collected(span.gc_collected);
      gc->set_uncollectable(span.gc_uncollectable);
    }
    account(out->ByteSizeLong());
  }
}

void BatchBuilder::addDeepTrace(std::span<const DeepTraceRecord> records) {
  for (const DeepTraceRecord& r : records) {
    if (!batch_open_) openBatch();
    flare::v1::DeepTraceRecord* out = batch_.add_deep_trace();
    out->set_kind(static_cast<flare::v1::DeepTraceRecord::Kind>(r.kind));
    out->set_name(r.name);
    out->set_start_ns(clock_map_.fromMonotonic(r.start_ns));
    out->set_end_ns(clock_map_.fromMonotonic(r.end_ns));
    out->set_stream(r.stream);
    out->set_device(r.device);
    out->set_correlation_id(r.correlation_id);
    out->set_bytes(r.bytes);
    out->set_copy_kind(r.copy_kind);
    out->set_capture_id(r.capture_id);
    out->set_step_index(r.step_index);
    account(out->ByteSizeLong());
  }
}

void BatchBuilder::setDrops(const DropCounters& totals) {
  drops_ = totals;
  drops_dirty_ = true;
}

flare::v1::DeviceInfo toProtoDevice(const DeviceDescription& d) {
  flare::v1::DeviceInfo out;
  out.set_index(static_cast<uint32_t>(std::max(d.index, 0)));
  out.set_name(d.name);
  out.set_uuid(d.uuid);
  out.set_pci_bus_id(d.pci_bus_id);
  out.set_sm_count(d.sm_count);
  out.set_clock_khz(d.clock_khz);
  out.set_cc_major(d.cc_major);
  out.set_cc_minor(d.cc_minor);
  out.set_memory_bytes(d.memory_bytes);
  return out;
}

void BatchBuilder::setDevice(const DeviceDescription& device) {
  device_ = toProtoDevice(device);
}

void BatchBuilder::finish() {
  if (accumulating_) {
    addTailSteps();
    addStepStats(true);
  }
  flush();
}

void BatchBuilder::flush() {
  if (!aggregator_.empty()) addSummaries();
  const bool has_records =
      batch_open_ &&
      (batch_.signatures_size() > 0 || batch_.kernels_size() > 0 || batch_.summaries_size() > 0 ||
       batch_.step_stats_size() > 0 || batch_.collective_blocks_size() > 0 ||
       batch_.spans_size() > 0 || batch_.api_names_size() > 0 || batch_.deep_trace_size() > 0 ||
       batch_.run_queue_size() > 0);
  if (!has_records && !drops_dirty_ && !device_) return;
  if (!batch_open_) openBatch();
  closeBatch();
}

void BatchBuilder::closeBatch() {
  batch_open_ = false;
  batch_.set_rank(rank_);
  batch_.set_batch_seq(++batch_seq_);
  flare::v1::DropCounters* drops = batch_.mutable_drops();
  drops->set_ring_full(drops_.ring_full);
  drops->set_events_exhausted(drops_.events_exhausted);
  drops->set_event_errors(drops_.event_errors);
  drops->set_capturing(drops_.capturing);
  drops->set_unfinished(drops_.unfinished);
  drops->set_spans_dropped(drops_.spans_dropped);
  drops->set_run_queue_unmeasured(run_queue_unmeasured_);
  drops->set_log_once_suppressed(common::logCounters().once_suppressed);
  if (options_.extra_drops) options_.extra_drops(drops);
  batch_.set_created_ns(common::realtimeNs());
  if (device_) {
    *batch_.mutable_device() = std::move(*device_);
    device_.reset();
  }
  drops_dirty_ = false;
  batch_size_ = 0;
  emit_(std::move(batch_));
  batch_.Clear();
}

}  // namespace flare::timing
