// Applying a batch (ingest.h): Ingest::batch runs its three stages, the session's checks
// (ingest_session.cc), the items' validation (ingest_validate.h) and, here, applying what passed to
// the job's state: batch_seq marks and lost batches, the signature and API tables, the
// per-signature aggregates behind the kernel report, the stored summary windows, raw and
// deep-trace records waiting for the next checkpoint, drop counters and the rank's device.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "src/common/log.h"
#include "src/engine/ingest.h"
#include "src/engine/ingest_validate.h"

namespace flare::engine {

Verdict Ingest::batch(uint64_t session_id, const v1::RecordBatch& sent) {
  const int64_t now = wall_.nowNs();
  std::string job_id;
  int32_t rank = 0;
  // What was refused goes to the detectors once the lock is released, on every return path.
  struct HandOver {
    Ingest* ingest;
    ~HandOver() { ingest->handOverRefusals(); }
  } hand_over{this};
  // The batch as applied: `sent` itself, or a copy without its invalid items.
  std::optional<v1::RecordBatch> clean;
  const v1::RecordBatch* applied = &sent;
  Verdict verdict;
  {
    std::lock_guard lock(mu_);
    // 1. The session's checks of the batch as a whole (ingest_session.cc).
    Session* s = nullptr;
    RankState::Incarnation* inc = nullptr;
    if (std::optional<Verdict> refused = admitBatch(session_id, sent, now, &s, &inc)) {
      return *std::move(refused);
    }
    JobState& job = *s->job;
    RankState& rs = job.ranks[s->rank];
    rank = s->rank;
    job_id = job.job_id;
    // 2. The items (ingest_validate.h): only the invalid ones go; everything else, the tables
    // above all, is applied.
    const BatchLimits limits{
        {config_.min_timestamp_ns, now + config_.max_future_ns, config_.max_duration_ns},
        config_.max_signatures_per_rank,
        config_.max_ranks_per_job};
    const BatchFilter f = findInvalidItems(sent, limits, s->sig_map, s->api_ids);
    if (f.dropped > 0) {
      clean.emplace(withoutInvalidItems(sent, f));
      applied = &*clean;
      verdict = noteDroppedItems(job, rs, now, f);
    }
    // 3. Everything checked: the session's rate bucket pays for what is applied, then apply.
    const v1::RecordBatch& b = *applied;
    s->tokens -= static_cast<double>(static_cast<size_t>(b.kernels_size()) + b.summaries_size() +
                                     b.spans_size() + b.steps_size());
    applyBatch(*s, *inc, b, now);
  }
  counters_.deep_trace_records.fetch_add(static_cast<uint64_t>(applied->deep_trace_size()),
                                         std::memory_order_relaxed);
  if (config_.on_batch) config_.on_batch(job_id, rank, *applied);
  return verdict;
}

void Ingest::applyBatch(Session& s, RankState::Incarnation& inc, const v1::RecordBatch& b,
                        int64_t now) {
  JobState& job = *s.job;
  RankState& rs = job.ranks[s.rank];
  if (b.batch_seq() != 0) {
    // Gaps are lost batches, but one batch_seq alone is not believed: a jump counts one lost
    // batch and waits for the next batch to confirm the rest (Incarnation::jump_seq).
    const uint64_t seq = b.batch_seq();
    uint64_t lost = 0;
    // The first batch the daemon hears of a rank process sets its mark as before (nothing
    // to count yet).
    if (inc.seq != 0 && seq > inc.seq + 1 && inc.jump_seq != 0 && seq == inc.jump_seq + 1) {
      const uint64_t gap = inc.jump_seq - inc.seq - 1;  // one of them counted at the jump
      if (gap > 1) lost = gap - 1;
      inc.seq = seq;
      inc.jump_seq = 0;
      inc.dirty = true;
    } else if (inc.seq != 0 && seq > inc.seq + 1) {
      lost = 1;
      inc.jump_seq = seq;
    } else {
      inc.seq = seq;
      if (inc.jump_seq != 0 && inc.jump_seq <= inc.seq) inc.jump_seq = 0;
      inc.dirty = true;
    }
    inc.updated_ns = now;
    if (lost > 0) {
      rs.lost_batches += lost;
      counters_.lost_batches.fetch_add(lost, std::memory_order_relaxed);
    }
  }
  for (const v1::Signature& sig : b.signatures()) {
    s.sig_map[sig.id()] = internSignature(job, sig);
  }
  for (const v1::ApiName& a : b.api_names()) s.api_ids.insert(a.id());
  const bool keep_raw =
      config_.store_raw && store_ &&
      pending_raw_count_ + static_cast<size_t>(b.kernels_size()) <= config_.max_pending_raw;
  if (config_.store_raw && store_ && !keep_raw) {
    counters_.raw_dropped.fetch_add(b.kernels_size(), std::memory_order_relaxed);
  }
  std::vector<RawRecord>* raw =
      keep_raw && b.kernels_size() > 0 ? &pending_raw_[job.job_id] : nullptr;
  if (raw != nullptr) pending_raw_count_ += b.kernels_size();
  for (const v1::KernelRecord& k : b.kernels()) {
    const uint32_t id = s.sig_map[k.signature_id()];
    SigState& st = job.sigs[id - 1];
    const int64_t d = k.end_ns() - k.start_ns();
    if (st.count == 0 || d < st.min_ns) st.min_ns = d;
    if (st.count == 0 || d > st.max_ns) st.max_ns = d;
    // A 1-in-N sampled launch stands for `weight` launches: counts and totals are estimates.
    const uint64_t weight = k.weight() > 1 ? k.weight() : 1;
    st.count += weight;
    st.total_ns += d * static_cast<int64_t>(weight);
    st.hist.add(d, weight);
    st.estimated += weight - 1;
    st.flops += static_cast<double>(weight) *
                static_cast<double>(k.flops() != 0 ? k.flops() : st.sig.flops_per_call());
    st.bytes += static_cast<double>(weight) *
                static_cast<double>(k.bytes() != 0 ? k.bytes() : st.sig.bytes_per_call());
    if (k.has_collective() && k.collective().nranks() > 0) st.nranks = k.collective().nranks();
    st.dirty = true;
    if (raw != nullptr) {
      raw->push_back(RawRecord{s.rank, id, k.stream_id(), k.issue_ns(), k.start_ns(), k.end_ns(),
                               k.flops(), k.bytes(),
                               k.has_collective() ? k.collective().seq() : 0});
    }
  }
  uint64_t summarized = 0;
  for (const v1::KernelSummary& sm : b.summaries()) {
    const uint32_t id = s.sig_map[sm.signature_id()];
    SigState& st = job.sigs[id - 1];
    // Stored rows: one per (rank, signature, stream, window of --summary-window-s), the
    // clusters folded (p50: count-weighted mean of the clusters' p50, p99: their max).
    const int64_t win =
        config_.summary_window_ns > 0
            ? sm.window_start_ns() / config_.summary_window_ns * config_.summary_window_ns
            : sm.window_start_ns();
    WindowSummaryRow* w = nullptr;
    if (store_) {
      w = &rs.open_windows.row(id, sm.stream_id());
      rs.windows_dirty = true;
      if (w->count > 0 && w->window_start_ns != win)
        pending_windows_.push_back(OpenWindows::take(*w));
      if (w->count == 0) {
        w->job_id = job.job_id;
        w->rank = s.rank;
        w->sig_id = id;
        w->stream = sm.stream_id();
        w->window_start_ns = win;
        w->source = "summary";
      }
      w->window_end_ns = std::max(w->window_end_ns, sm.window_end_ns());
    }
    st.flops += static_cast<double>(sm.flops());  // totals of the summarised ops
    st.bytes += static_cast<double>(sm.bytes());
    for (const auto& c : sm.clusters()) {
      if (c.count() == 0) continue;
      const int64_t lo = std::min(c.p50_ns(), c.p99_ns());
      if (st.count == 0 || lo < st.min_ns) st.min_ns = lo;
      if (st.count == 0 || c.p99_ns() > st.max_ns) st.max_ns = c.p99_ns();
      st.count += c.count();
      st.total_ns += c.sum_ns();
      // The histogram gets the cluster as mass at p50 with its top 1% at p99.
      const uint64_t tail = c.count() >= 100 ? c.count() / 100 : 0;
      st.hist.add(c.p50_ns(), c.count() - tail);
      if (tail > 0) st.hist.add(c.p99_ns(), tail);
      if (sm.flops() == 0)
        st.flops += static_cast<double>(c.count()) * static_cast<double>(st.sig.flops_per_call());
      if (sm.bytes() == 0)
        st.bytes += static_cast<double>(c.count()) * static_cast<double>(st.sig.bytes_per_call());
      if (w != nullptr) {
        const double n0 = static_cast<double>(w->count);
        const double n1 = static_cast<double>(c.count());
        w->p50_ns = static_cast<int64_t>(
            (static_cast<double>(w->p50_ns) * n0 + static_cast<double>(c.p50_ns()) * n1) /
            (n0 + n1));
        w->count += c.count();
        w->sum_ns += c.sum_ns();
        w->p99_ns = std::max(w->p99_ns, c.p99_ns());
      }
      summarized += c.count();
    }
    if (sm.sampled_ops() > 0) {  // 1-in-N sampled: the clusters' counts beyond the timed ops
      uint64_t counted = 0;
      for (const auto& c : sm.clusters()) counted += c.count();
      if (counted > sm.sampled_ops()) st.estimated += counted - sm.sampled_ops();
    }
    st.dirty = true;
  }
  if (b.deep_trace_size() > 0 && config_.store_raw && store_) {
    // Stored with the next checkpoint, like raw records (exactly once across a crash).
    const auto n = static_cast<size_t>(b.deep_trace_size());
    if (pending_raw_count_ + n <= config_.max_pending_raw) {
      std::vector<DeepTraceRow>& deep = pending_deep_[job.job_id];
      for (const v1::DeepTraceRecord& d : b.deep_trace()) deep.push_back(DeepTraceRow{s.rank, d});
      pending_raw_count_ += n;
    } else {
      counters_.raw_dropped.fetch_add(n, std::memory_order_relaxed);
    }
  }
  if (b.has_drops()) applyDrops(rs, b.drops());
  if (b.has_device()) {
    // The rank's GPU, sent once the timing thread saw its first op (the hello went earlier).
    if (validDeviceInfo(b.device())) {
      rs.device_name = b.device().name();
      rs.device_uuid = b.device().uuid();
    } else {
      counters_.bad_device_info.fetch_add(1, std::memory_order_relaxed);
      common::logOnce(common::LogLevel::kWarn, "engine", "bad-device-info",
                      "ignoring a DeviceInfo with an overlong or non-printable name or UUID "
                      "(flare_ingest_bad_device_info_total)");
    }
  }
  ++rs.batches;
  rs.records += static_cast<uint64_t>(b.kernels_size()) + summarized;
  for (const v1::StepStats& st : b.step_stats()) {
    ++rs.steps;
    if (st.sampled_out()) ++rs.steps_sampled_out;
  }
  rs.last_seen_ns = now;
  rs.dirty = true;
  job.last_seen_ns = now;
  job.dirty = true;
  counters_.batches.fetch_add(1, std::memory_order_relaxed);
  counters_.kernel_records.fetch_add(b.kernels_size(), std::memory_order_relaxed);
  counters_.summaries.fetch_add(b.summaries_size(), std::memory_order_relaxed);
  counters_.summarized_kernels.fetch_add(summarized, std::memory_order_relaxed);
  counters_.spans.fetch_add(b.spans_size(), std::memory_order_relaxed);
  counters_.steps.fetch_add(b.steps_size(), std::memory_order_relaxed);
}

uint32_t Ingest::internSignature(JobState& job, const v1::Signature& sig) {
  v1::Signature canon = sig;
  canon.set_id(0);
  std::string key;
  canon.SerializeToString(&key);  // deterministic enough: no maps in Signature
  const auto it = job.sig_index.find(key);
  if (it != job.sig_index.end()) return it->second;
  const auto id = static_cast<uint32_t>(job.sigs.size() + 1);
  job.sig_index.emplace(std::move(key), id);
  SigState& st = job.sigs.emplace_back();
  st.sig = std::move(canon);
  st.sig.set_id(id);
  counters_.signatures.fetch_add(1, std::memory_order_relaxed);
  if (store_) {
    SignatureRow row{job.job_id, id, {}};
    st.sig.SerializeToString(&row.signature);
    store_->putSignature(row);
  }
  return id;
}

void Ingest::applyDrops(RankState& rs, const v1::DropCounters& d) {
  const auto* refl = d.GetReflection();
  const auto* desc = d.GetDescriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    const int n = f->number();
    if (n < 1 || n > static_cast<int>(counters_.rank_drops.size())) continue;
    const uint64_t now_v = refl->GetUInt64(d, f);
    const uint64_t old_v = refl->GetUInt64(rs.drops, f);
    if (now_v > old_v) {
      counters_.rank_drops[n - 1].fetch_add(now_v - old_v, std::memory_order_relaxed);
    }
  }
  rs.drops = d;
}

}  // namespace flare::engine
