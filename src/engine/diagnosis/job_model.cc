#include "src/engine/diagnosis/job_model.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "flare/step.h"
#include "src/common/text.h"

namespace flare::engine {

void ClusterList::release() {
  if (cap_ > kInline) delete[] heap_;
  size_ = 0;
  cap_ = kInline;
}

void ClusterList::steal(ClusterList& o) noexcept {
  size_ = o.size_;
  cap_ = o.cap_;
  if (cap_ > kInline) {
    heap_ = o.heap_;
  } else {
    std::copy(o.inline_, o.inline_ + size_, inline_);
  }
  o.size_ = 0;
  o.cap_ = kInline;
}

void ClusterList::adopt(WindowCluster* block, uint32_t cap, uint32_t size) {
  release();
  heap_ = block;
  cap_ = cap;
  size_ = size;
}

void ClusterList::assign(const WindowCluster* first, const WindowCluster* last) {
  const auto n = static_cast<uint32_t>(last - first);
  if (n <= kInline) {
    WindowCluster tmp[kInline];
    std::copy(first, last, tmp);
    release();
    std::copy(tmp, tmp + n, inline_);
    size_ = n;
    return;
  }
  auto* block = new WindowCluster[n];
  std::copy(first, last, block);
  adopt(block, n, n);
}

void ClusterList::push_back(const WindowCluster& c) {
  if (size_ < cap_) {
    data()[size_++] = c;
    return;
  }
  auto* block = new WindowCluster[2 * cap_];
  std::copy(begin(), end(), block);
  block[size_] = c;  // `c` may be in this list: copied before the old block is freed
  adopt(block, 2 * cap_, size_ + 1);
}

std::string signatureKey(const flare::v1::Signature& sig) {
  std::string key = sig.name();
  key += '\x1f';
  key += std::to_string(sig.kind()) + '\x1f' + std::to_string(sig.dtype()) + '\x1f';
  for (int64_t d : sig.shape()) key += std::to_string(d) + ',';
  key += '\x1f';
  key += sig.layout();
  return key;
}

uint32_t JobModel::internSignature(const flare::v1::Signature& sig) {
  const std::string key = signatureKey(sig);
  auto it = signature_index_.find(key);
  if (it != signature_index_.end()) return it->second;
  const auto id = static_cast<uint32_t>(signatures_.size());
  signatures_.push_back(sig);
  signatures_.back().set_id(id);
  signature_index_.emplace(key, id);
  return id;
}

uint32_t JobModel::internApi(const std::string& name) {
  auto it = api_index_.find(name);
  if (it != api_index_.end()) return it->second;
  const auto id = static_cast<uint32_t>(apis_.size());
  apis_.push_back(name);
  api_kinds_.push_back(records::stepCallKind(name));
  api_index_.emplace(name, id);
  return id;
}

void JobModel::setRankInfo(int rank, const std::string& host, const std::string& device_name,
                           const std::string& device_uuid) {
  RankData& r = ranks_[rank];
  r.rank = rank;
  r.host = host;
  r.device_name = device_name;
  if (!device_uuid.empty()) r.device_uuid = device_uuid;
}

void JobModel::addBatch(int rank, const flare::v1::RecordBatch& batch) {
  RankData& r = ranks_[rank];
  r.rank = rank;
  r.batch_bytes.emplace_back(batch.created_ns(), batch.ByteSizeLong());
  if (batch.has_device()) {
    // The rank's GPU (sent once, after its first op): offline spools carry it too. A name that
    // is empty, overlong or holds control characters is ignored.
    const std::string& name = batch.device().name();
    if (!name.empty() && common::isPlainText(name, 256)) r.device_name = name;
    const std::string& uuid = batch.device().uuid();
    if (!uuid.empty() && common::isPlainText(uuid, 64)) r.device_uuid = uuid;
  }
  for (const auto& s : batch.signatures()) r.sig_ids[s.id()] = internSignature(s);
  for (const auto& a : batch.api_names()) r.api_ids[a.id()] = internApi(a.qualified_name());
  for (const auto& k : batch.kernels()) {
    auto sig = r.sig_ids.find(k.signature_id());
    if (sig == r.sig_ids.end()) {
      ++r.unknown_signature_records;
      continue;
    }
    if (signatures_[sig->second].name() == FLARE_STEP_MARKER_NAME) {
      r.step_starts.push_back(k.start_ns());
      continue;
    }
    Op op;
    op.sig = sig->second;
    op.issue = k.issue_ns();
    op.start = k.start_ns();
    op.end = std::max(k.end_ns(), k.start_ns());
    op.stream = k.stream_id();
    op.device = k.device();
    op.flops = k.flops() ? k.flops() : signatures_[op.sig].flops_per_call();
    op.bytes = k.bytes() ? k.bytes() : signatures_[op.sig].bytes_per_call();
    op.parent_span = k.parent_span_id();
    op.thread = k.thread_id();
    op.weight = std::clamp<uint32_t>(k.weight(), 1, 65535);
    if (k.has_collective()) {
      op.comm = k.collective().comm_hash();
      op.seq = k.collective().seq();
      op.nranks = k.collective().nranks();
    }
    r.ops.push_back(op);
  }
  for (const auto& s : batch.spans()) {
    auto api = r.api_ids.find(s.api_id());
    Span span;
    span.api =
        api == r.api_ids.end() ? internApi("api#" + std::to_string(s.api_id())) : api->second;
    span.id = s.id();
    span.start = s.start_ns();
    span.end = std::max(s.end_ns(), s.start_ns());
    span.thread = s.thread_id();
    if (s.has_gc()) span.gc_generation = s.gc().generation();
    r.spans.push_back(span);
  }
  for (const auto& q : batch.run_queue()) {
    // At most kMaxRunQueueThreads threads a rank (the rank reads only those that launch);
    // the steps of a thread past them are not measured, as if it sent no readings.
    if (r.run_queue.size() >= RankData::kMaxRunQueueThreads &&
        !r.run_queue.contains(q.thread_id())) {
      continue;
    }
    records::RunQueueReadings& readings = r.run_queue[q.thread_id()];
    const std::pair<int64_t, int64_t> reading{q.time_ns(), q.waited_ns()};
    if (readings.empty() || readings.back().first < reading.first) {
      readings.push_back(reading);  // the usual case: in time order
    } else if (auto at = std::lower_bound(readings.begin(), readings.end(), reading);
               at == readings.end() || at->first != reading.first) {
      readings.insert(at, reading);  // a spooled batch replayed late
    }
  }
  if (const size_t want = r.summaries.size() + static_cast<size_t>(batch.summaries_size());
      want > r.summaries.capacity()) {
    r.summaries.reserve(std::max(want, 2 * r.summaries.capacity()));  // one growth per batch
  }
  for (const auto& ks : batch.summaries()) {
    auto sig = r.sig_ids.find(ks.signature_id());
    if (sig == r.sig_ids.end()) {
      ++r.unknown_signature_records;
      continue;
    }
    SummaryWindow w;
    w.sig = sig->second;
    w.stream = ks.stream_id();
    w.start = ks.window_start_ns();
    w.end = std::max(ks.window_end_ns(), ks.window_start_ns());
    for (const auto& c : ks.clusters()) {
      if (c.count() == 0) continue;
      WindowCluster dc;
      dc.count = c.count();
      dc.p50 = static_cast<double>(std::max<int64_t>(0, c.p50_ns()));
      dc.p99 = std::max(dc.p50, static_cast<double>(c.p99_ns()));
      dc.sum = static_cast<double>(std::max<int64_t>(0, c.sum_ns()));
      w.clusters.push_back(dc);
      w.n += dc.count;
      w.sum_ns += dc.sum;
    }
    const auto& sig_row = signatures_[w.sig];
    w.flops = ks.flops() != 0 ? static_cast<double>(ks.flops())
                              : static_cast<double>(w.count()) * sig_row.flops_per_call();
    w.bytes = ks.bytes() != 0 ? static_cast<double>(ks.bytes())
                              : static_cast<double>(w.count()) * sig_row.bytes_per_call();
    if (w.clusters.empty()) continue;
    r.newest_ns = std::max(r.newest_ns, w.end);
    r.summaries.push_back(std::move(w));
  }
  for (const auto& st : batch.step_stats()) {
    ReceivedStep rs;
    std::string error;
    auto latency = stats::LatencySketch::deserialize(
        std::span(reinterpret_cast<const uint8_t*>(st.issue_latency().data()),
                  st.issue_latency().size()),
        &error);
    if (!latency || st.end_ns() <= st.start_ns()) {
      ++r.bad_step_stats;
      continue;
    }
    rs.stats.start_ns = st.start_ns();
    rs.stats.end_ns = st.end_ns();
    rs.stats.gpu_busy_ns = st.gpu_busy_ns();
    rs.stats.inter_ns = st.inter_ns();
    rs.stats.minority_ns = st.minority_ns();
    rs.stats.gpu_ops = st.gpu_ops();
    rs.stats.issue_latency_sum_ns = st.issue_latency_sum_ns();
    rs.stats.issue_offset_sum_ns = st.issue_offset_sum_ns();
    rs.stats.run_queue_wait_ns = st.has_run_queue_wait_ns() ? st.run_queue_wait_ns() : -1;
    rs.stats.sampled_out = st.sampled_out();
    rs.stats.latency = std::move(*latency);
    for (const auto& c : st.causes()) {
      auto sketch = stats::LatencySketch::deserialize(std::span(
          reinterpret_cast<const uint8_t*>(c.issue_latency().data()), c.issue_latency().size()));
      if (sketch) rs.causes.emplace_back(internApi(c.name()), std::move(*sketch));
    }
    // Step sampling: a measured step stands for it and the steps sampled out since the rank's
    // previous measured one (its weight; what the job-level issue-latency distribution compared
    // with healthy history weighs it by: signals::issueLatencies).
    if (rs.stats.sampled_out) {
      ++r.sampled_out_since_measured;
    } else {
      rs.weight = 1 + r.sampled_out_since_measured;
      r.sampled_out_since_measured = 0;
    }
    r.newest_ns = std::max(r.newest_ns, rs.stats.end_ns);
    r.steps.push_back(std::move(rs));
  }
  for (const auto& st : batch.steps()) {
    r.step_starts.push_back(st.start_ns());
    if (st.samples() > 0) r.step_samples = st.samples();
  }
  if (batch.has_drops()) r.drops = batch.drops();
  maybeCompact(r);
}

void JobModel::maybeCompact(RankData& r) {
  if (compact_fine_ns_ <= 0 || r.newest_ns == INT64_MIN) return;
  if (r.next_compaction_ns == INT64_MIN) r.next_compaction_ns = r.newest_ns + compact_fine_ns_;
  if (r.newest_ns >= r.next_compaction_ns) compactRank(r);
}

JobModel JobModel::takeRecords() {
  JobModel out = emptyCopy();
  for (auto& [rank, r] : ranks_) {
    RankData& o = out.ranks_[rank];
    copyRankIdentity(r, &o);
    o.newest_ns = r.newest_ns;
    o.ops = std::exchange(r.ops, {});
    o.spans = std::exchange(r.spans, {});
    o.summaries = std::exchange(r.summaries, {});
    o.steps = std::exchange(r.steps, {});
    o.step_starts = std::exchange(r.step_starts, {});
    o.run_queue = std::exchange(r.run_queue, {});
    o.batch_bytes = std::exchange(r.batch_bytes, {});
    o.unknown_signature_records = std::exchange(r.unknown_signature_records, 0);
    o.bad_step_stats = std::exchange(r.bad_step_stats, 0);
  }
  return out;
}

void JobModel::absorb(JobModel&& newer) {
  signatures_ = std::move(newer.signatures_);
  signature_index_ = std::move(newer.signature_index_);
  apis_ = std::move(newer.apis_);
  api_kinds_ = std::move(newer.api_kinds_);
  api_index_ = std::move(newer.api_index_);
  auto append = [](auto& into, auto& from) {
    if (into.empty()) {
      into = std::move(from);
    } else {
      into.insert(into.end(), std::make_move_iterator(from.begin()),
                  std::make_move_iterator(from.end()));
    }
  };
  for (auto& [rank, n] : newer.ranks_) {
    RankData& r = ranks_[rank];
    copyRankIdentity(n, &r);
    append(r.ops, n.ops);
    append(r.spans, n.spans);
    if (r.summaries.empty()) r.coarse_summaries = 0;
    append(r.summaries, n.summaries);
    append(r.steps, n.steps);
    append(r.step_starts, n.step_starts);
    for (auto& [thread, readings] : n.run_queue) {
      records::RunQueueReadings& mine = r.run_queue[thread];
      const size_t had = mine.size();
      append(mine, readings);
      if (had > 0 && had < mine.size() && mine[had].first <= mine[had - 1].first) {
        std::sort(mine.begin(), mine.end());  // overlapping times: back in order, one per time
        mine.erase(std::unique(mine.begin(), mine.end(),
                               [](const auto& a, const auto& b) { return a.first == b.first; }),
                   mine.end());
      }
    }
    append(r.batch_bytes, n.batch_bytes);
    r.unknown_signature_records += n.unknown_signature_records;
    r.bad_step_stats += n.bad_step_stats;
    r.newest_ns = std::max(r.newest_ns, n.newest_ns);
    maybeCompact(r);
  }
}

void JobModel::setCompaction(int64_t fine_ns, int64_t bucket_ns) {
  compact_fine_ns_ = std::max<int64_t>(0, fine_ns);
  compact_bucket_ns_ = std::max<int64_t>(1, bucket_ns);
}

namespace {

constexpr size_t kMaxFoldedClusters = 8;
constexpr double kFoldedClusterRatio = 1.05;  // clusters whose p50s are this close merge

void mergeCluster(WindowCluster* into, const WindowCluster& c) {
  const double n = static_cast<double>(into->count) + static_cast<double>(c.count);
  if (n > 0) {
    into->p50 =
        (into->p50 * static_cast<double>(into->count) + c.p50 * static_cast<double>(c.count)) / n;
  }
  into->count += c.count;
  into->p99 = std::max(into->p99, c.p99);
  into->sum += c.sum;
}

// Clusters of one signature from several windows, as few: neighbours (by p50) within 5% merge
// (count-weighted p50, p99 the larger, sums added), then the closest pairs until at most 8.
// `out` is scratch space, reused across calls.
void foldClusters(std::vector<WindowCluster>& c, std::vector<WindowCluster>& out) {
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.p50 < b.p50; });
  out.clear();
  for (const auto& x : c) {
    if (!out.empty() && x.p50 <= out.back().p50 * kFoldedClusterRatio)
      mergeCluster(&out.back(), x);
    else
      out.push_back(x);
  }
  while (out.size() > kMaxFoldedClusters) {
    size_t best = 0;
    double best_ratio = INFINITY;
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      const double ratio = out[i + 1].p50 / std::max(out[i].p50, 1.0);
      if (ratio < best_ratio) {
        best_ratio = ratio;
        best = i;
      }
    }
    mergeCluster(&out[best], out[best + 1]);
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

int64_t floorDiv(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0);
}

void mergeSketch(std::vector<std::pair<uint32_t, stats::LatencySketch>>* into, uint32_t api,
                 const stats::LatencySketch& sketch) {
  for (auto& [id, s] : *into) {
    if (id == api) {
      s.merge(sketch);
      return;
    }
  }
  into->emplace_back(api, sketch);
}

}  // namespace

void JobModel::compactRank(RankData& r) {
  r.next_compaction_ns = r.newest_ns + compact_bucket_ns_;
  const int64_t warm = warmupEnd(r.rank);
  if (warm == INT64_MIN) return;  // the warm-up is not known yet: nothing is folded
  const int64_t cutoff = r.newest_ns - compact_fine_ns_;
  // Kernel summaries: [coarse..., fine...] → [coarse + newly folded..., the rest of fine...].
  // The windows to fold are sorted by (bucket, signature, stream, position) and each run of one
  // key merged: no per-window allocation (a hash map's nodes were a fifth of flared's CPU at
  // 10,000 ranks), and the folded windows come in bucket order.
  struct Keyed {
    int64_t bucket;
    uint32_t sig;
    uint64_t stream;
    size_t index;
    auto tie() const { return std::tie(bucket, sig, stream, index); }
  };
  // Scratch reused by every fold on this thread, and the rank's vector kept: a fold allocated
  // ~300 KB a rank (at 10,000 ranks every second a thousand ranks' worth), and the kernel's
  // zeroing of freshly faulted pages was a tenth of flared's CPU.
  thread_local std::vector<Keyed> keyed;
  thread_local std::vector<SummaryWindow> fine, folded;
  thread_local std::vector<WindowCluster> gathered, merged;
  keyed.clear();
  fine.clear();
  folded.clear();
  for (size_t i = 0; i < r.summaries.size(); ++i) {
    SummaryWindow& w = r.summaries[i];
    if (i >= r.coarse_summaries && (w.end >= cutoff || w.start < warm)) {
      fine.push_back(std::move(w));
      continue;
    }
    keyed.push_back({floorDiv(w.start, compact_bucket_ns_), w.sig, w.stream, i});
  }
  std::sort(keyed.begin(), keyed.end(),
            [](const Keyed& a, const Keyed& b) { return a.tie() < b.tie(); });
  for (size_t a = 0; a < keyed.size();) {
    size_t b = a + 1;
    SummaryWindow into = std::move(r.summaries[keyed[a].index]);
    gathered.assign(into.clusters.begin(), into.clusters.end());
    for (; b < keyed.size() && keyed[b].bucket == keyed[a].bucket && keyed[b].sig == keyed[a].sig &&
           keyed[b].stream == keyed[a].stream;
         ++b) {
      const SummaryWindow& w = r.summaries[keyed[b].index];
      into.start = std::min(into.start, w.start);
      into.end = std::max(into.end, w.end);
      into.flops += w.flops;
      into.bytes += w.bytes;
      into.n += w.n;
      into.sum_ns += w.sum_ns;
      gathered.insert(gathered.end(), w.clusters.begin(), w.clusters.end());
    }
    if (b - a > 1) {
      foldClusters(gathered, merged);
      into.clusters.assign(merged.data(), merged.data() + merged.size());
    }
    folded.push_back(std::move(into));
    a = b;
  }
  // Room for the windows still to come before the next fold (one bucket's worth at the rank's
  // recent rate), and no more: a doubling vector held up to twice the window (~100 KB a rank).
  size_t recent = 0;
  for (const SummaryWindow& w : fine) recent += w.end >= r.newest_ns - compact_bucket_ns_;
  const size_t need = folded.size() + fine.size() + recent + recent / 8;
  r.summaries.clear();
  if (r.summaries.capacity() > 2 * need) std::vector<SummaryWindow>().swap(r.summaries);
  r.summaries.reserve(need);
  std::move(folded.begin(), folded.end(), std::back_inserter(r.summaries));
  std::move(fine.begin(), fine.end(), std::back_inserter(r.summaries));
  r.coarse_summaries = folded.size();
  fine.clear();
  folded.clear();
  // Step sketches: merged into the bucket of the step's start; the step keeps its figures.
  for (ReceivedStep& st : r.steps) {
    if (st.stats.end_ns >= cutoff || st.stats.start_ns < warm) continue;
    if (st.stats.latency.count() == 0 && st.causes.empty()) continue;  // folded before
    const int64_t bucket = floorDiv(st.stats.start_ns, compact_bucket_ns_);
    auto it = std::find_if(r.coarse_steps.rbegin(), r.coarse_steps.rend(), [&](const auto& c) {
      return floorDiv(c.start, compact_bucket_ns_) == bucket;
    });
    CoarseSteps* into = nullptr;
    if (it != r.coarse_steps.rend()) {
      into = &*it;
    } else {
      into = &r.coarse_steps.emplace_back();
      into->start = st.stats.start_ns;
      into->end = st.stats.end_ns;
    }
    into->start = std::min(into->start, st.stats.start_ns);
    into->end = std::max(into->end, st.stats.end_ns);
    into->latency.merge(st.stats.latency);
    into->ops += st.stats.latency.count();
    into->weighted_ops += st.stats.latency.count() * st.weight;
    for (const auto& [api, sketch] : st.causes) mergeSketch(&into->causes, api, sketch);
    st.stats.latency = stats::LatencySketch(records::StepStats::kStepSketchAccuracy);
    std::vector<std::pair<uint32_t, stats::LatencySketch>>().swap(st.causes);
  }
}

std::optional<flare::v1::RecordBatch> JobModel::rankBatch(int rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return std::nullopt;
  const RankData& r = it->second;
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  for (size_t i = 0; i < signatures_.size(); ++i) {
    flare::v1::Signature* s = b.add_signatures();
    *s = signatures_[i];
    s->set_id(static_cast<uint32_t>(i + 1));
  }
  for (size_t i = 0; i < apis_.size(); ++i) {
    flare::v1::ApiName* a = b.add_api_names();
    a->set_id(static_cast<uint32_t>(i + 1));
    a->set_qualified_name(apis_[i]);
  }
  for (const Op& op : r.ops) {
    flare::v1::KernelRecord* k = b.add_kernels();
    k->set_signature_id(op.sig + 1);
    k->set_stream_id(op.stream);
    k->set_device(op.device);
    k->set_issue_ns(op.issue);
    k->set_start_ns(op.start);
    k->set_end_ns(op.end);
    k->set_issue_latency_ns(op.start - op.issue);
    if (op.flops != signatures_[op.sig].flops_per_call()) k->set_flops(op.flops);
    if (op.bytes != signatures_[op.sig].bytes_per_call()) k->set_bytes(op.bytes);
    k->set_parent_span_id(op.parent_span);
    k->set_thread_id(op.thread);
    if (op.weight > 1) k->set_weight(op.weight);
    if (op.comm != 0 || op.nranks != 0) {
      k->mutable_collective()->set_comm_hash(op.comm);
      k->mutable_collective()->set_seq(op.seq);
      k->mutable_collective()->set_nranks(op.nranks);
    }
  }
  for (const Span& s : r.spans) {
    flare::v1::ApiSpan* a = b.add_spans();
    a->set_id(s.id);
    a->set_api_id(s.api + 1);
    a->set_thread_id(s.thread);
    a->set_start_ns(s.start);
    a->set_end_ns(s.end);
    if (s.gc_generation >= 0) a->mutable_gc()->set_generation(s.gc_generation);
  }
  for (const SummaryWindow& w : r.summaries) {
    flare::v1::KernelSummary* ks = b.add_summaries();
    ks->set_signature_id(w.sig + 1);
    ks->set_stream_id(w.stream);
    ks->set_window_start_ns(w.start);
    ks->set_window_end_ns(w.end);
    ks->set_flops(static_cast<uint64_t>(w.flops));
    ks->set_bytes(static_cast<uint64_t>(w.bytes));
    for (const WindowCluster& c : w.clusters) {
      auto* out = ks->add_clusters();
      out->set_count(c.count);
      out->set_p50_ns(static_cast<int64_t>(c.p50));
      out->set_p99_ns(static_cast<int64_t>(c.p99));
      out->set_sum_ns(static_cast<int64_t>(c.sum));
    }
  }
  for (size_t i = 0; i < r.step_starts.size(); ++i) {
    flare::v1::StepMarker* st = b.add_steps();
    st->set_step(i);
    st->set_start_ns(r.step_starts[i]);
  }
  if (!r.device_name.empty()) b.mutable_device()->set_name(r.device_name);
  if (!r.device_uuid.empty()) b.mutable_device()->set_uuid(r.device_uuid);
  *b.mutable_drops() = r.drops;
  return b;
}

namespace {

// Removes the windows `drop` selects, keeping RankData::coarse_summaries the count of the folded
// ones still at the front.
template <typename Pred>
void eraseSummaries(RankData* r, Pred drop) {
  size_t kept = 0, kept_coarse = 0;
  for (size_t i = 0; i < r->summaries.size(); ++i) {
    if (drop(r->summaries[i])) continue;
    if (i < r->coarse_summaries) ++kept_coarse;
    if (kept != i) r->summaries[kept] = std::move(r->summaries[i]);
    ++kept;
  }
  r->summaries.resize(kept);
  r->coarse_summaries = kept_coarse;
}

}  // namespace

void JobModel::trim(int64_t before_ns, size_t max_ops_per_rank) {
  for (auto& [rank, r] : ranks_) {
    std::erase_if(r.ops, [before_ns](const Op& op) { return op.end < before_ns; });
    if (r.ops.size() > max_ops_per_rank) {
      std::sort(r.ops.begin(), r.ops.end(),
                [](const Op& a, const Op& b) { return a.issue < b.issue; });
      r.ops.erase(r.ops.begin(), r.ops.end() - static_cast<std::ptrdiff_t>(max_ops_per_rank));
    }
    std::erase_if(r.spans, [before_ns](const Span& s) { return s.end < before_ns; });
    eraseSummaries(&r, [before_ns](const SummaryWindow& w) { return w.end < before_ns; });
    std::erase_if(r.coarse_steps, [before_ns](const CoarseSteps& c) { return c.end < before_ns; });
    std::erase_if(r.steps,
                  [before_ns](const ReceivedStep& st) { return st.stats.end_ns < before_ns; });
    std::erase_if(r.step_starts, [before_ns](int64_t t) { return t < before_ns; });
    std::erase_if(r.batch_bytes, [before_ns](const auto& b) { return b.first < before_ns; });
    for (auto it = r.run_queue.begin(); it != r.run_queue.end();) {
      // The newest reading before the cut stays: a step starting there still needs it.
      records::RunQueueReadings& q = it->second;
      auto cut = std::lower_bound(q.begin(), q.end(), std::make_pair(before_ns, INT64_MIN));
      if (cut != q.begin()) q.erase(q.begin(), std::prev(cut));
      it = q.size() <= 1 && (q.empty() || q.back().first < before_ns) ? r.run_queue.erase(it)
                                                                      : std::next(it);
    }
  }
}

JobModel JobModel::untilStep(size_t step) const {
  JobModel out = *this;
  for (auto& [rank, o] : out.ranks_) {
    const auto starts = stepStarts(rank);
    if (starts.size() <= step) continue;
    const int64_t t1 = starts[step];
    std::erase_if(o.ops, [t1](const Op& op) { return op.issue >= t1; });
    std::erase_if(o.spans, [t1](const Span& sp) { return sp.start > t1; });  // keeps the boundary
    eraseSummaries(&o, [t1](const SummaryWindow& w) { return w.start >= t1; });
    std::erase_if(o.coarse_steps, [t1](const CoarseSteps& c) { return c.start >= t1; });
    std::erase_if(o.steps, [t1](const ReceivedStep& st) { return st.stats.start_ns >= t1; });
    std::erase_if(o.step_starts, [t1](int64_t t) { return t > t1; });
  }
  return out;
}

JobModel JobModel::emptyCopy() const {
  JobModel out;
  out.signatures_ = signatures_;
  out.signature_index_ = signature_index_;
  out.apis_ = apis_;
  out.api_kinds_ = api_kinds_;
  out.api_index_ = api_index_;
  return out;
}

void JobModel::copyRankIdentity(const RankData& r, RankData* o) {
  o->rank = r.rank;
  o->host = r.host;
  o->device_name = r.device_name;
  o->device_uuid = r.device_uuid;
  o->step_samples = r.step_samples;
  o->drops = r.drops;
}

JobModel JobModel::onlySteps(const std::vector<size_t>& steps) const {
  JobModel out = emptyCopy();
  for (const auto& [rank, r] : ranks_) {
    const auto starts = stepStarts(rank);
    RankData& o = out.ranks_[rank];
    copyRankIdentity(r, &o);
    o.warmup_end_ns = warmupEnd(rank);
    o.run_queue = r.run_queue;
    std::vector<std::pair<int64_t, int64_t>> kept;
    for (size_t k : steps) {
      if (k + 1 < starts.size()) kept.emplace_back(starts[k], starts[k + 1]);
    }
    if (kept.empty()) continue;
    std::sort(kept.begin(), kept.end());
    auto inside = [&](int64_t t) {
      auto it = std::upper_bound(kept.begin(), kept.end(), std::make_pair(t, INT64_MAX));
      return it != kept.begin() && t < std::prev(it)->second;
    };
    for (const Op& op : r.ops) {
      if (inside(op.issue)) o.ops.push_back(op);
    }
    for (const Span& s : r.spans) {
      if (inside(s.start)) o.spans.push_back(s);
    }
    for (size_t i = 0; i < r.summaries.size(); ++i) {  // windows overlapping a kept step
      const SummaryWindow& w = r.summaries[i];
      auto it = std::lower_bound(kept.begin(), kept.end(), std::make_pair(w.end, INT64_MAX));
      bool overlaps = inside(w.start);
      for (auto k = kept.begin(); !overlaps && k != it; ++k) overlaps = k->second > w.start;
      if (!overlaps) continue;
      o.summaries.push_back(w);
      if (i < r.coarse_summaries) o.coarse_summaries = o.summaries.size();
    }
    for (const ReceivedStep& st : r.steps) {
      if (inside(st.stats.start_ns)) o.steps.push_back(st);
    }
    const auto first = std::find(starts.begin(), starts.end(), kept.front().first);
    if (first != starts.begin()) o.step_starts.push_back(*std::prev(first));
    for (const auto& [a, b] : kept) o.step_starts.push_back(a);
  }
  return out;
}

JobModel JobModel::sinceStep(size_t step) const {
  JobModel out = emptyCopy();
  for (const auto& [rank, r] : ranks_) {
    const auto starts = stepStarts(rank);
    RankData& o = out.ranks_[rank];
    copyRankIdentity(r, &o);
    o.warmup_end_ns = warmupEnd(rank);
    o.run_queue = r.run_queue;
    if (starts.size() <= step) continue;
    const int64_t t0 = starts[step];
    for (const Op& op : r.ops) {
      if (op.issue >= t0) o.ops.push_back(op);
    }
    for (const Span& s : r.spans) {
      if (s.start >= t0) o.spans.push_back(s);
    }
    // A summary window (1 s) may straddle the step: kept when it ends after it (a short job's
    // only window holds the steps since the onset too, diluted by the ones before).
    for (size_t i = 0; i < r.summaries.size(); ++i) {
      if (r.summaries[i].end < t0) continue;
      o.summaries.push_back(r.summaries[i]);
      if (i < r.coarse_summaries) o.coarse_summaries = o.summaries.size();
    }
    for (const ReceivedStep& st : r.steps) {
      if (st.stats.start_ns >= t0) o.steps.push_back(st);
    }
    for (int64_t t : r.step_starts) {
      if (t >= t0) o.step_starts.push_back(t);
    }
    for (const auto& b : r.batch_bytes) {
      if (b.first >= t0) o.batch_bytes.push_back(b);
    }
  }
  return out;
}

size_t JobModel::opCount() const {
  size_t n = 0;
  for (const auto& [rank, r] : ranks_) n += r.ops.size();
  return n;
}

std::vector<int64_t> JobModel::stepStarts(int rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return {};
  std::vector<int64_t> starts = it->second.step_starts;
  if (!starts.empty()) {
    std::sort(starts.begin(), starts.end());
    return starts;
  }
  std::vector<records::StepCall> calls;
  for (const Span& s : it->second.spans) {
    const records::StepCallKind kind = api_kinds_[s.api];
    if (kind != records::StepCallKind::kOther) calls.push_back({s.start, kind});
  }
  // A CUDA graph launch is training work (records::StepBoundaryRule).
  for (const Op& op : it->second.ops) {
    if (signatures_[op.sig].kind() == flare::v1::OP_KIND_GRAPH)
      calls.push_back({op.issue, records::StepCallKind::kTraining});
  }
  std::vector<int64_t> from_spans = records::stepBoundaries(std::move(calls));
  // Summary mode sends no ops, only the steps the rank closed by the same rule with its graph
  // launches in view: where those are more, their bounds are the steps (a step captured whole
  // in a CUDA graph leaves no training call among the spans).
  const auto& steps = it->second.steps;
  if (steps.size() + 1 > from_spans.size()) {
    std::vector<int64_t> from_stats;
    int64_t last_end = INT64_MIN;
    for (const ReceivedStep& s : steps) {
      from_stats.push_back(s.stats.start_ns);
      last_end = std::max(last_end, s.stats.end_ns);
    }
    from_stats.push_back(last_end);
    std::sort(from_stats.begin(), from_stats.end());
    from_stats.erase(std::unique(from_stats.begin(), from_stats.end()), from_stats.end());
    if (from_stats.size() > from_spans.size()) return from_stats;
  }
  return from_spans;
}

int64_t JobModel::warmupEnd(int rank) const {
  auto it = ranks_.find(rank);
  if (it != ranks_.end() && it->second.warmup_end_ns != INT64_MIN) return it->second.warmup_end_ns;
  const std::vector<int64_t> starts = stepStarts(rank);
  return starts.size() >= 2 ? starts[1] : INT64_MIN;
}

namespace {

// The index among a rank's step starts of a step it sent, [t, end): the nearest start within
// a quarter of the step (the step and its marker may have been converted to epoch time with
// different clock samples), else the number of starts before it (0: before them all).
int64_t stepIndex(const std::vector<int64_t>& starts, int64_t t, int64_t end) {
  const auto it = std::lower_bound(starts.begin(), starts.end(), t);
  const int64_t tolerance = (end - t) / 4;
  if (it != starts.end() && *it - t <= tolerance) return it - starts.begin();
  if (it != starts.begin() && t - *std::prev(it) <= tolerance) return it - starts.begin() - 1;
  return it - starts.begin();
}

}  // namespace

std::vector<const ReceivedStep*> JobModel::receivedSteps(int rank, bool with_sampled_out) const {
  const auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.steps.empty()) return {};
  const std::vector<int64_t> starts = stepStarts(rank);
  std::vector<const ReceivedStep*> out;
  for (const ReceivedStep& st : it->second.steps) {
    if (st.stats.sampled_out && !with_sampled_out) continue;
    if (stepIndex(starts, st.stats.start_ns, st.stats.end_ns) >= 1) out.push_back(&st);
  }
  std::sort(out.begin(), out.end(), [](const ReceivedStep* a, const ReceivedStep* b) {
    return a->stats.start_ns < b->stats.start_ns;
  });
  return out;
}

std::vector<records::StepStats> JobModel::stepStats(int rank, bool with_sampled_out) const {
  const auto it = ranks_.find(rank);
  if (it == ranks_.end()) return {};
  const std::vector<int64_t> starts = stepStarts(rank);
  const RankData& r = it->second;
  if (!r.steps.empty()) {  // MODE_SUMMARY: the rank's own figures
    std::vector<records::StepStats> out;
    out.reserve(r.steps.size());
    for (const ReceivedStep& st : r.steps) {
      if (st.stats.sampled_out && !with_sampled_out) continue;
      records::StepStats& o = out.emplace_back();  // the figures, not the sketch (see the header)
      o.start_ns = st.stats.start_ns;
      o.end_ns = st.stats.end_ns;
      o.gpu_busy_ns = st.stats.gpu_busy_ns;
      o.inter_ns = st.stats.inter_ns;
      o.minority_ns = st.stats.minority_ns;
      o.gpu_ops = st.stats.gpu_ops;
      o.issue_latency_sum_ns = st.stats.issue_latency_sum_ns;
      o.issue_offset_sum_ns = st.stats.issue_offset_sum_ns;
      o.run_queue_wait_ns = st.stats.run_queue_wait_ns;
      o.sampled_out = st.stats.sampled_out;
      o.step = stepIndex(starts, st.stats.start_ns, st.stats.end_ns);
    }
    std::sort(out.begin(), out.end(), [](const records::StepStats& a, const records::StepStats& b) {
      return a.start_ns < b.start_ns;
    });
    return out;
  }
  if (starts.size() < 2) return {};
  std::vector<records::StepOp> ops;
  ops.reserve(r.ops.size());
  std::vector<std::pair<int64_t, uint64_t>> issues;  // (issue, thread): run-queue wait's issuers
  for (const Op& op : r.ops) {
    const auto kind = signatures_[op.sig].kind();
    if (kind == flare::v1::OP_KIND_SYNC) continue;  // host-side, not GPU work
    ops.push_back({op.issue, op.start, op.end, kind == flare::v1::OP_KIND_KERNEL});
    if (!r.run_queue.empty()) issues.emplace_back(op.issue, op.thread);
  }
  std::vector<records::StepSpan> loader;
  for (const Span& s : r.spans) {
    if (api_kinds_[s.api] == records::StepCallKind::kLoader) loader.push_back({s.start, s.end});
  }
  std::vector<records::StepStats> out = records::computeStepStats(ops, loader, starts);
  if (!r.run_queue.empty()) {
    // MODE_RAW's run-queue wait, as the rank computes it in summary mode: the most any thread
    // that issued the step's GPU ops waited for a CPU inside it.
    std::sort(issues.begin(), issues.end());
    std::set<uint64_t> threads;
    for (records::StepStats& st : out) {
      threads.clear();
      for (auto issue = std::lower_bound(issues.begin(), issues.end(),
                                         std::make_pair(st.start_ns, uint64_t{0}));
           issue != issues.end() && issue->first < st.end_ns; ++issue) {
        threads.insert(issue->second);
      }
      st.run_queue_wait_ns = records::runQueueWaitIn(r.run_queue, threads, st.start_ns, st.end_ns);
    }
  }
  return out;
}

}  // namespace flare::engine
