// Ingest (ingest.h): construction, decoding, refusals and counters, commands and hang reports,
// queries, checkpoints and reload, metrics. A batch's path is split by stage: the session's
// checks in ingest_session.cc (with hello/close), the items' validation in ingest_validate.cc,
// applying in ingest_apply.cc.
#include "src/engine/ingest.h"

#include <algorithm>
#include <utility>

#include "src/common/log.h"
#include "src/common/text.h"
#include "src/engine/auth.h"
#include "src/engine/ingest_validate.h"
#include "src/engine/metrics.h"
#include "src/records/collective_blocks.h"
#include "src/records/op_kind.h"

namespace flare::engine {
namespace {

constexpr size_t kMaxResultsPerJob = 64;

constexpr const char* kReasonNames[] = {
    "malformed",      "oversized",           "no_hello",         "duplicate_hello",
    "bad_hello",      "protocol_version",    "unauthenticated",  "too_many_jobs",
    "too_many_ranks", "rank_mismatch",       "session_replaced", "unknown_signature",
    "bad_signature",  "too_many_signatures", "bad_timestamp",    "bad_record",
    "rate_limited",   "duplicate_batch",     "out_of_order"};
static_assert(std::size(kReasonNames) == static_cast<size_t>(Reason::kCount),
              "one name per Reason");
static_assert(static_cast<size_t>(Reason::kCount) <= 32, "RankState::logged_reasons: a bit each");

constexpr const char* kDropNames[] = {
    "ring_full",     "events_exhausted", "unmatched",      "spans_dropped",
    "spool_dropped", "send_failed",      "disabled_calls", "log_once_suppressed",
    "event_errors",  "capturing",        "unfinished",     "run_queue_unmeasured"};
static_assert(std::size(kDropNames) == std::tuple_size_v<decltype(IngestCounters::rank_drops)>,
              "one name per DropCounters field");

}  // namespace

WindowSummaryRow& OpenWindows::row(uint32_t sig, uint64_t stream) {
  size_t i = hint_;
  if (i >= rows_.size() || rows_[i].sig_id != sig || rows_[i].stream != stream) {
    const std::pair<uint32_t, uint64_t> key{sig, stream};
    auto it = std::lower_bound(index_.begin(), index_.end(), key,
                               [](const auto& e, const auto& k) { return e.first < k; });
    if (it != index_.end() && it->first == key) {
      i = it->second;
    } else {
      i = rows_.size();
      WindowSummaryRow& r = rows_.emplace_back();
      r.sig_id = sig;
      r.stream = stream;
      index_.insert(it, {key, static_cast<uint32_t>(i)});
    }
  }
  hint_ = i + 1;
  return rows_[i];
}

WindowSummaryRow OpenWindows::take(WindowSummaryRow& row) {
  WindowSummaryRow out = std::move(row);
  row = WindowSummaryRow();
  row.sig_id = out.sig_id;
  row.stream = out.stream;
  row.window_start_ns = out.window_start_ns;
  return out;
}

void OpenWindows::dropIdle(int64_t before_ns) {
  const size_t n = rows_.size();
  std::erase_if(rows_, [before_ns](const WindowSummaryRow& r) {
    return r.count == 0 && r.window_start_ns < before_ns;
  });
  if (rows_.size() == n) return;
  index_.clear();
  for (size_t i = 0; i < rows_.size(); ++i)
    index_.push_back({{rows_[i].sig_id, rows_[i].stream}, static_cast<uint32_t>(i)});
  std::sort(index_.begin(), index_.end());
  hint_ = 0;
}

bool validDeviceInfo(const v1::DeviceInfo& device) {
  return common::isPlainText(device.name(), 256) && common::isPlainText(device.uuid(), 64) &&
         common::isPlainText(device.pci_bus_id(), 64);
}

const char* reasonName(Reason r) {
  const auto i = static_cast<size_t>(r);
  return i < std::size(kReasonNames) ? kReasonNames[i] : "unknown";
}

Ingest::Ingest(IngestConfig config, Store* store, const common::Clock& wall)
    : config_(std::move(config)), store_(store), wall_(wall) {}

Ingest::~Ingest() = default;

Verdict Ingest::reject(Reason r, Code code, std::string error, bool close) {
  counters_.rejected[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  return Verdict{code, r, std::move(error), close};
}

void Ingest::countRejected(Reason r) {
  counters_.rejected[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
}

Verdict Ingest::decode(const void* data, size_t size, v1::RankMessage* out) {
  if (size > config_.max_message_bytes) {
    return reject(Reason::kOversized, Code::kResourceExhausted,
                  "message of " + std::to_string(size) + " bytes is over the limit", true);
  }
  out->Clear();
  if (size > static_cast<size_t>(INT32_MAX) || !out->ParseFromArray(data, static_cast<int>(size))) {
    return reject(Reason::kMalformed, Code::kInvalidArgument, "message does not decode", true);
  }
  if (out->msg_case() == v1::RankMessage::MSG_NOT_SET) {
    return reject(Reason::kMalformed, Code::kInvalidArgument, "empty RankMessage", true);
  }
  if (out->has_batch() && out->batch().collective_blocks_size() > 0) {
    // Summary mode's compact collectives become plain records before anything looks at them.
    const v1::RecordBatch& b = out->batch();
    const size_t other = static_cast<size_t>(b.summaries_size()) + b.spans_size() + b.steps_size() +
                         b.signatures_size() + b.api_names_size() + b.step_stats_size() +
                         b.run_queue_size();
    const size_t room = config_.max_batch_items > other ? config_.max_batch_items - other : 0;
    std::string why;
    switch (records::expandCollectiveBlocks(out->mutable_batch(), room, &why)) {
      case records::Expand::kOk:
        break;
      case records::Expand::kTooMany:
        return reject(Reason::kOversized, Code::kResourceExhausted, why + " (--max-batch-items)");
      case records::Expand::kMalformed:
        return reject(Reason::kMalformed, Code::kInvalidArgument, why, true);
    }
  }
  return {};
}

bool Ingest::tokenValid(const std::string& job_id, const std::string& token) const {
  if (config_.job_tokens.empty() && config_.default_token.empty()) return true;
  const auto it = config_.job_tokens.find(job_id);
  const std::string& want = it != config_.job_tokens.end() ? it->second : config_.default_token;
  if (want.empty()) return false;
  return constantTimeEquals(want, token);
}

Ingest::JobState* Ingest::findJob(const std::string& job_id) {
  const auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void Ingest::handOverRefusals() {
  if (!has_refusal_notes_.load(std::memory_order_relaxed)) return;
  std::vector<RefusalNote> notes;
  {
    std::lock_guard lock(mu_);
    notes.swap(refusal_notes_);
    has_refusal_notes_.store(false, std::memory_order_relaxed);
  }
  for (const RefusalNote& n : notes) {
    config_.on_refused(n.job_id, n.rank, reasonName(n.reason), n.batches, n.items, n.error,
                       n.now_ns);
  }
}

Verdict Ingest::refuseBatch(const JobState& job, RankState& rs, int64_t now, Reason r, Code code,
                            std::string error) {
  noteRefused(job, rs, now, r, 1, 0, error);
  return reject(r, code, std::move(error));
}

Verdict Ingest::noteDroppedItems(const JobState& job, RankState& rs, int64_t now,
                                 const BatchFilter& f) {
  for (size_t i = 0; i < f.by_reason.size(); ++i) {
    if (f.by_reason[i] == 0) continue;
    counters_.items_dropped[i].fetch_add(f.by_reason[i], std::memory_order_relaxed);
    noteRefused(job, rs, now, static_cast<Reason>(i), 0, f.by_reason[i], f.first_error[i]);
  }
  Verdict verdict;
  verdict.reason = f.first;
  verdict.error = f.first_error[static_cast<size_t>(f.first)];
  verdict.items_dropped = f.dropped;
  return verdict;
}

void Ingest::noteRefused(const JobState& job, RankState& rs, int64_t now, Reason r,
                         uint64_t batches, uint64_t items, const std::string& error) {
  RankState::Refused& ref = rs.refused[r];
  ref.batches += batches;
  ref.items += items;
  ref.last_error = error;
  ref.last_ns = now;
  rs.dirty = true;
  if (config_.on_refused) {
    refusal_notes_.push_back({job.job_id, rs.rank, r, batches, items, error, now});
    has_refusal_notes_.store(true, std::memory_order_relaxed);
  }
  const uint32_t bit = 1u << static_cast<unsigned>(r);
  if ((rs.logged_reasons & bit) != 0) return;
  rs.logged_reasons |= bit;
  FLARE_LOG_WARN("engine",
                 "job {} rank {}: refused {} ({}): {} (logged once per job, rank and reason; "
                 "counted in flare_ingest_{}_total and `flare status`)",
                 job.job_id, rs.rank, batches > 0 ? "a batch" : "items of a batch", reasonName(r),
                 error, batches > 0 ? "rejected" : "items_dropped");
}

Verdict Ingest::commandResult(uint64_t session_id, const v1::CommandResult& result) {
  std::lock_guard lock(mu_);
  const auto sit = sessions_.find(session_id);
  if (sit == sessions_.end()) {
    return reject(Reason::kSessionReplaced, Code::kFailedPrecondition,
                  "stream is no longer the rank's session", true);
  }
  JobState& job = *sit->second.job;
  if (result.command_id() == 0 || result.command_id() >= next_command_id_) {
    return reject(Reason::kBadRecord, Code::kInvalidArgument, "result for an unknown command");
  }
  job.results[result.command_id()][sit->second.rank] = result;
  while (job.results.size() > kMaxResultsPerJob) job.results.erase(job.results.begin());
  counters_.command_results.fetch_add(1, std::memory_order_relaxed);
  return {};
}

Verdict Ingest::hangReport(uint64_t session_id, const v1::HangReport& report) {
  {
    std::lock_guard lock(mu_);
    const auto sit = sessions_.find(session_id);
    if (sit == sessions_.end()) {
      return reject(Reason::kSessionReplaced, Code::kFailedPrecondition,
                    "stream is no longer the rank's session", true);
    }
    bool valid = report.has_first() && !report.first().name().empty() &&
                 report.first().age_ns() >= 0 && report.stuck_size() <= 1024;
    for (const v1::StuckOp& op : report.stuck()) valid = valid && op.age_ns() >= 0;
    if (!valid) {
      return reject(Reason::kBadRecord, Code::kInvalidArgument,
                    "hang report without a named first op, with a negative age or too many ops");
    }
    if (hang_reports_.size() >= config_.max_hang_reports) {
      counters_.hang_reports_dropped.fetch_add(1, std::memory_order_relaxed);
      return {};
    }
    ReceivedHangReport r;
    r.job_id = sit->second.job->job_id;
    r.rank = sit->second.rank;
    r.received_ns = wall_.nowNs();
    r.report = report;
    hang_reports_.push_back(std::move(r));
    counters_.hang_reports.fetch_add(1, std::memory_order_relaxed);
  }
  if (config_.on_hang_report) config_.on_hang_report();
  return {};
}

std::vector<ReceivedHangReport> Ingest::takeHangReports() {
  std::lock_guard lock(mu_);
  std::vector<ReceivedHangReport> out;
  out.swap(hang_reports_);
  return out;
}

v1::ListJobsResponse Ingest::listJobs(const v1::ListJobsRequest& req) {
  v1::ListJobsResponse out;
  std::lock_guard lock(mu_);
  std::vector<const JobState*> sorted;
  for (const auto& [id, job] : jobs_) sorted.push_back(job.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const JobState* a, const JobState* b) { return a->job_id < b->job_id; });
  for (const JobState* job : sorted) {
    const bool finished = job->connected == 0;
    if (finished && !req.include_finished()) continue;
    v1::JobInfo* j = out.add_jobs();
    j->set_job_id(job->job_id);
    j->set_world_size(job->world_size);
    j->set_ranks_connected(static_cast<int32_t>(job->connected));
    j->set_start_time_unix_ns(job->start_ns);
    j->set_last_seen_unix_ns(job->last_seen_ns);
    j->set_finished(finished);
  }
  return out;
}

void Ingest::fillReport(const JobState& job, v1::GetReportResponse* out) const {
  out->set_job_id(job.job_id);
  // History's key (analyzer.h): the device name of the lowest rank that reported one, and scale.
  out->set_scale(job.world_size);
  for (const auto& [rank, rs] : job.ranks) {
    if (!rs.device_name.empty()) {
      out->set_backend(rs.device_name);
      break;
    }
  }
  // GPU-busy time: host-side synchronizations (OP_KIND_SYNC: the time a host thread waited)
  // are reported with their own totals but are not GPU work, so they take no share of it.
  auto onGpu = [](const SigState& st) { return st.sig.kind() != v1::OP_KIND_SYNC; };
  int64_t busy = 0;
  for (const SigState& st : job.sigs) busy += onGpu(st) ? st.total_ns : 0;
  std::vector<const SigState*> order;
  for (const SigState& st : job.sigs) {
    if (st.count > 0) order.push_back(&st);
  }
  std::sort(order.begin(), order.end(), [](const SigState* a, const SigState* b) {
    return a->total_ns != b->total_ns ? a->total_ns > b->total_ns : a->sig.id() < b->sig.id();
  });
  for (const SigState* st : order) {
    v1::SignatureReport* r = out->add_signatures();
    *r->mutable_signature() = st->sig;
    r->set_count(st->count);
    r->set_total_ns(st->total_ns);
    r->set_time_share(
        busy > 0 && onGpu(*st) ? static_cast<double>(st->total_ns) / static_cast<double>(busy) : 0);
    if (st->total_ns > 0 && records::computesFlops(st->sig.kind())) {
      r->set_tflops(st->flops / static_cast<double>(st->total_ns) / 1e3);  // flop/ns = GFLOP/s
    }
    if (st->total_ns > 0 && records::isCollective(st->sig.kind())) {
      const int32_t n = st->nranks > 0 ? st->nranks : job.world_size;
      r->set_busbw_gbps(st->bytes / static_cast<double>(st->total_ns) *
                        records::busBandwidthFactor(st->sig.collective(), n));  // bytes/ns = GB/s
    }
    r->set_p50_ns(st->hist.quantile(0.5));
    r->set_p99_ns(st->hist.quantile(0.99));
    if (st->estimated > 0) r->set_estimated(st->estimated);
  }
}

Code Ingest::report(const v1::GetReportRequest& req, v1::GetReportResponse* out) {
  std::lock_guard lock(mu_);
  const JobState* job = findJob(req.job_id());
  if (job == nullptr) return Code::kNotFound;
  fillReport(*job, out);
  return Code::kOk;
}

Code Ingest::ranks(const v1::ListRanksRequest& req, v1::ListRanksResponse* out) {
  std::lock_guard lock(mu_);
  const JobState* job = findJob(req.job_id());
  if (job == nullptr) return Code::kNotFound;
  out->set_job_id(job->job_id);
  auto first = job->ranks.begin(), last = job->ranks.end();
  if (req.has_rank()) {  // one rank
    first = job->ranks.lower_bound(req.rank());
    last = job->ranks.upper_bound(req.rank());
  }
  for (auto it = first; it != last; ++it) {
    const auto& [rank, rs] = *it;
    v1::RankInfo* r = out->add_ranks();
    r->set_rank(rank);
    r->set_host(rs.host);
    r->set_pid(rs.pid);
    r->set_local_rank(rs.local_rank);
    r->set_connected(rs.session_id != 0);
    r->set_last_seen_unix_ns(rs.last_seen_ns);
    r->set_batches(rs.batches);
    r->set_records(rs.records);
    r->set_lost_batches(rs.lost_batches);
    r->set_steps(rs.steps);
    r->set_steps_sampled_out(rs.steps_sampled_out);
    *r->mutable_drops() = rs.drops;
    r->set_mode(rs.mode);
    r->set_device_name(rs.device_name);
    r->set_device_uuid(rs.device_uuid);
    r->set_hang_kill(rs.hang_kill);
    for (const auto& [reason, ref] : rs.refused) {
      v1::Refusals* x = r->add_refusals();
      x->set_reason(reasonName(reason));
      x->set_batches(ref.batches);
      x->set_items(ref.items);
      x->set_last_error(ref.last_error);
      x->set_last_unix_ns(ref.last_ns);
    }
  }
  return Code::kOk;
}

Code Ingest::sendCommand(const v1::SendCommandRequest& req, const std::string& token,
                         v1::SendCommandResponse* out, std::string* error) {
  if (!tokenValid(req.job_id(), token)) {
    *error = "missing or wrong token for job " + req.job_id();
    countRejected(Reason::kUnauthenticated);
    return Code::kUnauthenticated;
  }
  if (req.command().has_exit()) {
    // Only flared's hang monitor ends ranks (FLARE_HANG_KILL, after a stored diagnosis).
    *error = "exit is sent only by flared after a hang diagnosis (FLARE_HANG_KILL)";
    return Code::kPermissionDenied;
  }
  return sendCommandTrusted(req, out, error);
}

Code Ingest::sendCommandTrusted(const v1::SendCommandRequest& req, v1::SendCommandResponse* out,
                                std::string* error) {
  if (req.command().kind_case() == v1::Command::KIND_NOT_SET) {
    *error = "command has no kind";
    return Code::kInvalidArgument;
  }
  std::lock_guard lock(mu_);
  JobState* job = findJob(req.job_id());
  if (job == nullptr) {
    *error = "unknown job " + req.job_id();
    return Code::kNotFound;
  }
  v1::DaemonMessage msg;
  v1::Command* cmd = msg.mutable_command();
  *cmd = req.command();
  cmd->set_id(next_command_id_++);
  out->set_command_id(cmd->id());
  std::vector<int32_t> targets(req.ranks().begin(), req.ranks().end());
  if (targets.empty()) {
    for (const auto& [rank, rs] : job->ranks) targets.push_back(rank);
  }
  for (int32_t rank : targets) {
    const auto rit = job->ranks.find(rank);
    if (rit == job->ranks.end()) {
      out->set_dropped(out->dropped() + 1);
      counters_.commands_dropped.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    RankState& rs = rit->second;
    const auto sit = rs.session_id != 0 ? sessions_.find(rs.session_id) : sessions_.end();
    if (sit != sessions_.end() && sit->second.channel && sit->second.channel->send(msg)) {
      out->set_delivered(out->delivered() + 1);
      counters_.commands_sent.fetch_add(1, std::memory_order_relaxed);
    } else if (rs.pending.size() < config_.max_pending_commands) {
      rs.pending.push_back(*cmd);
      out->set_queued(out->queued() + 1);
      counters_.commands_queued.fetch_add(1, std::memory_order_relaxed);
    } else {
      out->set_dropped(out->dropped() + 1);
      counters_.commands_dropped.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return Code::kOk;
}

Code Ingest::commandResults(const v1::GetCommandResultsRequest& req,
                            v1::GetCommandResultsResponse* out) {
  std::lock_guard lock(mu_);
  const JobState* job = findJob(req.job_id());
  if (job == nullptr) return Code::kNotFound;
  const auto it = job->results.find(req.command_id());
  if (it == job->results.end()) return Code::kOk;
  for (const auto& [rank, result] : it->second) {
    v1::RankCommandResult* r = out->add_results();
    r->set_rank(rank);
    *r->mutable_result() = result;
  }
  return Code::kOk;
}

void Ingest::persist(bool final) {
  if (store_ == nullptr) return;
  const int64_t now = wall_.nowNs();
  const int64_t current = config_.summary_window_ns > 0
                              ? now / config_.summary_window_ns * config_.summary_window_ns
                              : now;
  Checkpoint cp;
  std::lock_guard lock(mu_);
  cp.windows = std::move(pending_windows_);
  pending_windows_.clear();
  cp.raw.reserve(pending_raw_.size());
  for (auto& [job_id, recs] : pending_raw_) {
    if (!recs.empty()) cp.raw.emplace_back(job_id, std::move(recs));
  }
  pending_raw_.clear();
  for (auto& [job_id, rows] : pending_deep_) {
    if (!rows.empty()) cp.deep_trace.emplace_back(job_id, std::move(rows));
  }
  pending_deep_.clear();
  pending_raw_count_ = 0;
  // Rows close when the clock enters a new window: scan the open ones only then.
  const bool close_windows = final || current != last_window_flush_;
  last_window_flush_ = current;
  for (auto& [id, job] : jobs_) {
    for (auto& [rank, rs] : job->ranks) {
      if (!close_windows) break;
      for (WindowSummaryRow& w : rs.open_windows.slots()) {
        // A window is closed once the clock has left it (a rank's late summary for it
        // then starts a new row of the same window).
        if (w.count > 0 && (final || w.window_start_ns + config_.summary_window_ns <= current)) {
          cp.windows.push_back(OpenWindows::take(w));
          rs.windows_dirty = true;
        }
      }
      // A slot free for a whole window is forgotten (a signature the rank no longer runs).
      rs.open_windows.dropIdle(current - config_.summary_window_ns);
    }
    if (job->dirty) {
      cp.jobs.push_back({job->job_id, job->world_size, job->start_ns, job->last_seen_ns});
      job->dirty = false;
    }
    for (auto& [rank, rs] : job->ranks) {
      if (rs.windows_dirty) {
        OpenWindowsRow& o = cp.open_windows.emplace_back();
        o.job_id = job->job_id;
        o.rank = rank;
        for (const WindowSummaryRow& row : rs.open_windows.slots()) {
          if (row.count > 0) o.rows.push_back(row);
        }
        rs.windows_dirty = false;
      }
      for (auto& [inc_key, inc] : rs.incarnations) {
        if (!inc.dirty) continue;
        cp.seqs.push_back(
            {job->job_id, rank, inc_key.first, inc_key.second, inc.seq, inc.updated_ns});
        inc.dirty = false;
      }
      if (!rs.dirty) continue;
      RankRow& r = cp.ranks.emplace_back();
      r.job_id = job->job_id;
      r.rank = rank;
      r.host = rs.host;
      r.pid = rs.pid;
      r.local_rank = rs.local_rank;
      r.device_name = rs.device_name;
      r.device_uuid = rs.device_uuid;
      r.last_seen_ns = rs.last_seen_ns;
      r.batches = rs.batches;
      r.records = rs.records;
      r.lost_batches = rs.lost_batches;
      r.steps = rs.steps;
      r.steps_sampled_out = rs.steps_sampled_out;
      rs.drops.SerializeToString(&r.drops);
      rs.dirty = false;
    }
    for (SigState& st : job->sigs) {
      if (!st.dirty) continue;
      cp.signature_stats.push_back({job->job_id, st.sig.id(), st.count, st.total_ns, st.min_ns,
                                    st.max_ns, st.flops, st.bytes, st.nranks, st.hist.serialize()});
      st.dirty = false;
    }
  }
  // Queued under mu_: no batch applied after this snapshot can reach the store before it.
  store_->putCheckpoint(std::move(cp));
}

void Ingest::loadFromStore() {
  if (store_ == nullptr) return;
  std::lock_guard lock(mu_);
  for (const JobRow& row : store_->loadJobs()) {
    auto job = std::make_unique<JobState>();
    job->job_id = row.job_id;
    job->world_size = row.world_size;
    job->start_ns = row.start_ns;
    job->last_seen_ns = row.last_seen_ns;
    jobs_[row.job_id] = std::move(job);
  }
  for (const RankRow& row : store_->loadRanks()) {
    JobState* job = findJob(row.job_id);
    if (job == nullptr) continue;
    RankState& rs = job->ranks[row.rank];
    rs.rank = row.rank;
    rs.host = row.host;
    rs.pid = row.pid;
    rs.local_rank = row.local_rank;
    rs.device_name = row.device_name;
    rs.device_uuid = row.device_uuid;
    rs.last_seen_ns = row.last_seen_ns;
    rs.batches = row.batches;
    rs.records = row.records;
    rs.lost_batches = row.lost_batches;
    rs.steps = row.steps;
    rs.steps_sampled_out = row.steps_sampled_out;
    rs.drops.ParseFromString(row.drops);
  }
  size_t marks = 0;
  for (const BatchSeqRow& row : store_->loadBatchSeqs()) {
    JobState* job = findJob(row.job_id);
    if (job == nullptr) continue;
    RankState& rs = job->ranks[row.rank];
    rs.rank = row.rank;
    RankState::Incarnation& inc = incarnation(rs, row.pid, row.start_ns, row.updated_ns);
    inc.seq = row.seq;
    inc.updated_ns = row.updated_ns;
    ++marks;
  }
  for (OpenWindowsRow& row : store_->loadOpenWindows()) {
    JobState* job = findJob(row.job_id);
    if (job == nullptr) continue;
    RankState& rs = job->ranks[row.rank];
    for (WindowSummaryRow& w : row.rows) {
      w.job_id = row.job_id;
      w.rank = row.rank;
      rs.open_windows.row(w.sig_id, w.stream) = std::move(w);
    }
  }
  for (const SignatureRow& row : store_->loadSignatures()) {
    JobState* job = findJob(row.job_id);
    v1::Signature sig;
    if (job == nullptr || !sig.ParseFromString(row.signature) ||
        row.sig_id != job->sigs.size() + 1) {
      FLARE_LOG_WARN("engine", "store: skipping signature {} of job {}", row.sig_id, row.job_id);
      continue;
    }
    v1::Signature canon = sig;
    canon.set_id(0);
    std::string key;
    canon.SerializeToString(&key);
    job->sig_index.emplace(std::move(key), row.sig_id);
    job->sigs.emplace_back().sig = std::move(sig);
  }
  for (const SignatureStatsRow& row : store_->loadSignatureStats()) {
    JobState* job = findJob(row.job_id);
    if (job == nullptr || row.sig_id == 0 || row.sig_id > job->sigs.size()) continue;
    SigState& st = job->sigs[row.sig_id - 1];
    st.count = row.count;
    st.total_ns = row.total_ns;
    st.min_ns = row.min_ns;
    st.max_ns = row.max_ns;
    st.flops = row.flops;
    st.bytes = row.bytes;
    st.nranks = row.nranks;
    st.hist.deserialize(row.histogram);
  }
  FLARE_LOG_INFO("engine", "store: loaded {} jobs, {} rank processes' batch marks", jobs_.size(),
                 marks);
}

void Ingest::writeMetrics(PromWriter& w) const {
  auto c = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  w.family("flare_ingest_rejected_total", "counter",
           "Messages, batches or hellos refused, by reason (src/engine/ingest.h).");
  for (size_t i = 0; i < counters_.rejected.size(); ++i) {
    w.sample("flare_ingest_rejected_total", c(counters_.rejected[i]),
             {{"reason", reasonName(static_cast<Reason>(i))}});
  }
  w.family("flare_ingest_items_dropped_total", "counter",
           "Items (records, summaries, spans, step statistics, table entries) dropped from "
           "batches whose other items were applied, by reason (src/engine/ingest.h).");
  for (size_t i = 0; i < counters_.items_dropped.size(); ++i) {
    w.sample("flare_ingest_items_dropped_total", c(counters_.items_dropped[i]),
             {{"reason", reasonName(static_cast<Reason>(i))}});
  }
  w.family("flare_ingest_hellos_accepted_total", "counter", "Rank streams accepted.");
  w.sample("flare_ingest_hellos_accepted_total", c(counters_.hellos_accepted));
  w.family("flare_ingest_sessions_replaced_total", "counter",
           "Streams replaced by a newer stream of the same rank (reconnects).");
  w.sample("flare_ingest_sessions_replaced_total", c(counters_.sessions_replaced));
  w.family("flare_ingest_batches_total", "counter", "Record batches accepted.");
  w.sample("flare_ingest_batches_total", c(counters_.batches));
  w.family("flare_ingest_records_total", "counter", "Items of accepted batches, by type.");
  w.sample("flare_ingest_records_total", c(counters_.kernel_records), {{"type", "kernel"}});
  w.sample("flare_ingest_records_total", c(counters_.deep_trace_records), {{"type", "deep_trace"}});
  w.sample("flare_ingest_records_total", c(counters_.summaries), {{"type", "summary"}});
  w.sample("flare_ingest_records_total", c(counters_.spans), {{"type", "span"}});
  w.sample("flare_ingest_records_total", c(counters_.steps), {{"type", "step"}});
  w.family("flare_ingest_bad_device_info_total", "counter",
           "DeviceInfo (hello or batch) ignored: overlong or non-printable name or UUID.");
  w.sample("flare_ingest_bad_device_info_total", c(counters_.bad_device_info));
  w.family("flare_ingest_summarized_kernels_total", "counter",
           "Kernel executions carried by accepted summaries.");
  w.sample("flare_ingest_summarized_kernels_total", c(counters_.summarized_kernels));
  w.family("flare_ingest_signatures_total", "counter", "Distinct signatures interned (per job).");
  w.sample("flare_ingest_signatures_total", c(counters_.signatures));
  w.family("flare_ingest_lost_batches_total", "counter", "Gaps in ranks' batch_seq: batches lost.");
  w.sample("flare_ingest_lost_batches_total", c(counters_.lost_batches));
  w.family("flare_ingest_raw_dropped_total", "counter",
           "Raw kernel records accepted but not stored: too many waiting for the next "
           "checkpoint.");
  w.sample("flare_ingest_raw_dropped_total", c(counters_.raw_dropped));
  w.family("flare_rank_drops_total", "counter",
           "Increases of the ranks' DropCounters, summed over ranks, by counter.");
  for (size_t i = 0; i < counters_.rank_drops.size(); ++i) {
    w.sample("flare_rank_drops_total", c(counters_.rank_drops[i]), {{"kind", kDropNames[i]}});
  }
  w.family("flare_commands_total", "counter", "Commands to ranks, by outcome.");
  w.sample("flare_commands_total", c(counters_.commands_sent), {{"outcome", "delivered"}});
  w.sample("flare_commands_total", c(counters_.commands_queued), {{"outcome", "queued"}});
  w.sample("flare_commands_total", c(counters_.commands_dropped), {{"outcome", "dropped"}});
  w.family("flare_command_results_total", "counter", "Command results received from ranks.");
  w.sample("flare_command_results_total", c(counters_.command_results));
  w.family("flare_hang_reports_total", "counter",
           "Suspected-hang reports received from ranks' watchdogs.");
  w.sample("flare_hang_reports_total", c(counters_.hang_reports));
  w.family("flare_hang_reports_dropped_total", "counter",
           "Hang reports dropped: the hang monitor's queue was full.");
  w.sample("flare_hang_reports_dropped_total", c(counters_.hang_reports_dropped));
  size_t jobs = 0, ranks = 0, sessions = 0;
  {
    std::lock_guard lock(mu_);
    jobs = jobs_.size();
    for (const auto& [id, job] : jobs_) ranks += job->ranks.size();
    sessions = sessions_.size();
  }
  w.family("flare_jobs", "gauge", "Jobs known to the daemon.");
  w.sample("flare_jobs", static_cast<uint64_t>(jobs));
  w.family("flare_ranks", "gauge", "Ranks known to the daemon, over all jobs.");
  w.sample("flare_ranks", static_cast<uint64_t>(ranks));
  w.family("flare_sessions_active", "gauge", "Rank streams open now.");
  w.sample("flare_sessions_active", static_cast<uint64_t>(sessions));
}

}  // namespace flare::engine
