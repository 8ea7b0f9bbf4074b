#include "src/engine/ingest.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <utility>

#include "flare/v1/protocol.h"
#include "src/common/job_id.h"
#include "src/common/log.h"
#include "src/common/text.h"
#include "src/engine/auth.h"
#include "src/engine/metrics.h"
#include "src/records/collective_blocks.h"
#include "src/records/op_kind.h"
#include "src/records/step_stats.h"
#include "src/stats/sketch.h"

namespace flare::engine {
namespace {

constexpr size_t kMaxNameBytes = 4096;
constexpr size_t kMaxShapeDims = 16;
constexpr size_t kMaxShortString = 1024;
constexpr size_t kMaxClusters = 64;
constexpr size_t kMaxStepCauses = records::StepStats::kMaxHostCauses;
constexpr size_t kMaxSketchBytes = 16 * 1024;  // a serialized issue-latency sketch

// A serialized LatencySketch from a StepStats: decodes, within size, at most `max_count` values
// (exactly `max_count` when `exact`).
bool validStepSketch(const std::string& bytes, uint64_t max_count, bool exact) {
  if (bytes.size() > kMaxSketchBytes) return false;
  const auto count = stats::LatencySketch::validCount(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  return count && (exact ? *count == max_count : *count <= max_count);
}
constexpr size_t kMaxResultsPerJob = 64;
constexpr size_t kMaxHostBytes = 256;

constexpr const char* kReasonNames[] = {
    "malformed",      "oversized",           "no_hello",         "duplicate_hello",
    "bad_hello",      "protocol_version",    "unauthenticated",  "too_many_jobs",
    "too_many_ranks", "rank_mismatch",       "session_replaced", "unknown_signature",
    "bad_signature",  "too_many_signatures", "bad_timestamp",    "bad_record",
    "rate_limited",   "duplicate_batch",     "out_of_order"};
static_assert(std::size(kReasonNames) == static_cast<size_t>(Reason::kCount),
              "one name per Reason");
static_assert(static_cast<size_t>(Reason::kCount) <= 32, "RankState::logged_reasons: a bit each");

constexpr const char* kDropNames[] = {"ring_full",      "events_exhausted",    "unmatched",
                                      "spans_dropped",  "spool_dropped",       "send_failed",
                                      "disabled_calls", "log_once_suppressed", "event_errors",
                                      "capturing",      "unfinished"};

// The one job-id rule (src/common/job_id.h), the hook's and the CLI's too.
bool jobIdValid(const std::string& id) {
  return common::validJobId(id);
}

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
  auto ok = [](const std::string& text, size_t max) {
    if (text.size() > max) return false;
    for (unsigned char c : text) {
      if (c < 0x20 || c == 0x7f) return false;
    }
    return true;
  };
  return ok(device.name(), 256) && ok(device.uuid(), 64) && ok(device.pci_bus_id(), 64);
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
                         b.signatures_size() + b.api_names_size();
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

Ingest::RankState::Incarnation& Ingest::incarnation(RankState& rs, int32_t pid, int64_t start_ns,
                                                    int64_t now) {
  auto [it, fresh] = rs.incarnations.try_emplace({pid, start_ns});
  if (fresh) {
    it->second.updated_ns = now;
    // Bounded: forget the process heard from least recently (its stored mark stays).
    while (rs.incarnations.size() > std::max<size_t>(config_.max_incarnations_per_rank, 1)) {
      auto oldest = rs.incarnations.end();
      for (auto i = rs.incarnations.begin(); i != rs.incarnations.end(); ++i) {
        if (i != it &&
            (oldest == rs.incarnations.end() || i->second.updated_ns < oldest->second.updated_ns)) {
          oldest = i;
        }
      }
      rs.incarnations.erase(oldest);
    }
  }
  return it->second;
}

Ingest::HelloOutcome Ingest::hello(const v1::RankHello& h,
                                   std::shared_ptr<CommandChannel> channel) {
  HelloOutcome out;
  out.ack.set_protocol_version(v1::kProtocolVersion);
  auto refuse = [&](Reason r, Code code, std::string error) {
    out.verdict = reject(r, code, std::move(error), true);
    out.ack.set_accepted(false);
    out.ack.set_error(out.verdict.error);
    return out;
  };
  if (h.protocol_version() != v1::kProtocolVersion) {
    return refuse(Reason::kProtocolVersion, Code::kFailedPrecondition,
                  "protocol version " + std::to_string(h.protocol_version()) +
                      " is not supported (daemon speaks " + std::to_string(v1::kProtocolVersion) +
                      ")");
  }
  if (!jobIdValid(h.job_id())) {
    return refuse(Reason::kBadHello, Code::kInvalidArgument,
                  "job id '" + common::printable(h.job_id().substr(0, 200)) +
                      "' is not valid: a job id is " + common::kJobIdRule +
                      " (set FLARE_JOB_ID to one)");
  }
  if (h.world_size() <= 0 || h.rank() < 0 || h.rank() >= h.world_size() ||
      h.host().size() > kMaxHostBytes || h.device().name().size() > kMaxShortString ||
      h.device().uuid().size() > kMaxShortString) {
    return refuse(Reason::kBadHello, Code::kInvalidArgument,
                  "rank must be in [0, world_size) and world_size positive; host and device "
                  "strings bounded");
  }
  if (!tokenValid(h.job_id(), h.token())) {
    return refuse(Reason::kUnauthenticated, Code::kUnauthenticated,
                  "missing or wrong token for job " + h.job_id());
  }
  if (static_cast<size_t>(h.world_size()) > config_.max_ranks_per_job) {
    return refuse(Reason::kTooManyRanks, Code::kResourceExhausted,
                  "world_size " + std::to_string(h.world_size()) + " is over --max-ranks-per-job");
  }
  const int64_t now = wall_.nowNs();
  std::shared_ptr<CommandChannel> replaced;
  {
    std::lock_guard lock(mu_);
    JobState* job = findJob(h.job_id());
    if (job == nullptr) {
      if (jobs_.size() >= config_.max_jobs) {
        return refuse(Reason::kTooManyJobs, Code::kResourceExhausted, "too many jobs (--max-jobs)");
      }
      auto fresh = std::make_unique<JobState>();
      fresh->job_id = h.job_id();
      fresh->start_ns = h.start_time_unix_ns() > 0 ? h.start_time_unix_ns() : now;
      job = fresh.get();
      jobs_.emplace(h.job_id(), std::move(fresh));
      // Stored now, ahead of the job's signatures (written as they are interned), so that a
      // restart before the first checkpoint finds their job.
      if (store_) store_->putJob({job->job_id, h.world_size(), job->start_ns, now});
    }
    if (!job->ranks.contains(h.rank()) && job->ranks.size() >= config_.max_ranks_per_job) {
      return refuse(Reason::kTooManyRanks, Code::kResourceExhausted,
                    "job has too many ranks (--max-ranks-per-job)");
    }
    job->world_size = std::max(job->world_size, h.world_size());
    job->last_seen_ns = now;
    job->dirty = true;
    RankState& rs = job->ranks[h.rank()];
    rs.rank = h.rank();
    if (rs.session_id != 0) {
      const auto it = sessions_.find(rs.session_id);
      if (it != sessions_.end()) {
        it->second.replaced = true;
        replaced = std::move(it->second.channel);
        sessions_.erase(it);
        counters_.sessions_replaced.fetch_add(1, std::memory_order_relaxed);
        --job->connected;
      }
    }
    if (rs.pid != h.pid()) rs.drops.Clear();  // a new process: its counters start from zero
    rs.host = h.host();
    rs.pid = h.pid();
    rs.local_rank = h.local_rank();
    if (validDeviceInfo(h.device())) {
      rs.device_name = h.device().name();
      rs.device_uuid = h.device().uuid();
    } else {
      counters_.bad_device_info.fetch_add(1, std::memory_order_relaxed);
      rs.device_name.clear();
      rs.device_uuid.clear();
    }
    rs.mode = h.mode();
    rs.hang_kill = h.hang_kill();
    rs.last_seen_ns = now;
    rs.dirty = true;
    Session s;
    s.id = next_session_id_++;
    s.job = job;
    s.rank = h.rank();
    s.pid = h.pid();
    s.start_ns = h.start_time_unix_ns();
    out.ack.set_resume_after_seq(incarnation(rs, s.pid, s.start_ns, now).seq);
    s.tokens = config_.rank_rate_limit * config_.rank_rate_burst_s;
    s.refill_ns = now;
    s.channel = std::move(channel);
    rs.session_id = s.id;
    ++job->connected;
    out.session_id = s.id;
    out.pending.assign(rs.pending.begin(), rs.pending.end());
    rs.pending.clear();
    sessions_.emplace(s.id, std::move(s));
  }
  if (replaced) {
    replaced->close(Code::kFailedPrecondition, "replaced by a newer stream of the same rank");
  }
  counters_.hellos_accepted.fetch_add(1, std::memory_order_relaxed);
  out.ack.set_accepted(true);
  out.ack.set_session_id(out.session_id);
  out.ack.set_hang_reports(true);
  FLARE_LOG_DEBUG("engine", "session {}: job {} rank {}/{} host {} pid {}", out.session_id,
                  h.job_id(), h.rank(), h.world_size(), h.host(), h.pid());
  return out;
}

void Ingest::close(uint64_t session_id) {
  std::lock_guard lock(mu_);
  const auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  JobState* job = it->second.job;
  auto rit = job->ranks.find(it->second.rank);
  if (rit != job->ranks.end() && rit->second.session_id == session_id) {
    rit->second.session_id = 0;
    rit->second.dirty = true;
    --job->connected;
  }
  sessions_.erase(it);
}

size_t Ingest::activeSessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

// The invalid items of one batch, by repeated field (indices ascending), and what they were.
struct Ingest::BatchFilter {
  std::vector<int> sigs, apis, kernels, summaries, spans, steps, step_stats;
  bool created = false;  // created_ns out of range: ignored
  std::array<uint64_t, static_cast<size_t>(Reason::kCount)> by_reason{};
  std::array<std::string, static_cast<size_t>(Reason::kCount)> first_error;
  Reason first = Reason::kCount;
  uint64_t dropped = 0;

  void drop(std::vector<int>* list, int index, Reason r, std::string error) {
    if (list != nullptr) list->push_back(index);
    const auto i = static_cast<size_t>(r);
    if (by_reason[i]++ == 0) first_error[i] = std::move(error);
    if (first == Reason::kCount) first = r;
    ++dropped;
  }
};

namespace {

// Removes the elements at `bad` (ascending indices) from `field`, keeping the others' order.
template <typename Field>
void eraseIndices(Field* field, const std::vector<int>& bad) {
  if (bad.empty()) return;
  int w = 0;
  size_t j = 0;
  for (int i = 0; i < field->size(); ++i) {
    if (j < bad.size() && bad[j] == i) {
      ++j;
      continue;
    }
    if (w != i) field->SwapElements(w, i);
    ++w;
  }
  field->DeleteSubrange(w, field->size() - w);
}

bool badTime(const TimeLimits& t, int64_t start, int64_t end) {
  return start < t.min_ns || start > t.max_ns || end < start || end - start > t.max_duration_ns;
}

}  // namespace

std::string stepStatsError(const v1::StepStats& st, const TimeLimits& limits, Reason* reason) {
  if (badTime(limits, st.start_ns(), st.end_ns()) || st.end_ns() == st.start_ns()) {
    *reason = Reason::kBadTimestamp;
    return "step statistics: start " + std::to_string(st.start_ns()) + ", end " +
           std::to_string(st.end_ns()) + " out of range";
  }
  *reason = Reason::kBadRecord;
  const int64_t len = st.end_ns() - st.start_ns();
  auto check = [len](const char* field, int64_t v) -> std::string {
    if (v >= 0 && v <= len) return {};
    return std::string("step statistics: ") + field + " " + std::to_string(v) +
           " ns outside its step of " + std::to_string(len) + " ns";
  };
  for (auto [field, v] :
       {std::pair{"gpu_busy_ns", st.gpu_busy_ns()}, std::pair{"inter_ns", st.inter_ns()},
        std::pair{"minority_ns", st.minority_ns()}}) {
    if (std::string e = check(field, v); !e.empty()) return e;
  }
  if (st.gpu_ops() > (1ULL << 40) || !std::isfinite(st.issue_latency_sum_ns()) ||
      !std::isfinite(st.issue_offset_sum_ns())) {
    return "step statistics: gpu_ops or an issue-latency sum out of range";
  }
  if (static_cast<size_t>(st.causes_size()) > kMaxStepCauses) {
    return "step statistics: more than " + std::to_string(kMaxStepCauses) + " host causes";
  }
  if (!validStepSketch(st.issue_latency(), st.gpu_ops(), true)) {
    return "step statistics: an issue-latency sketch that does not decode to the step's " +
           std::to_string(st.gpu_ops()) + " ops";
  }
  for (const v1::HostCause& c : st.causes()) {
    if (c.name().empty() || c.name().size() > records::StepStats::kMaxCauseNameBytes ||
        !validStepSketch(c.issue_latency(), st.gpu_ops(), false)) {
      return "step statistics: a host cause without a name or with a bad sketch";
    }
  }
  return {};
}

void Ingest::validate(const Session& s, const v1::RecordBatch& b, int64_t now,
                      std::unordered_map<uint32_t, uint32_t>* new_sigs, BatchFilter* f) {
  const TimeLimits limits{config_.min_timestamp_ns, now + config_.max_future_ns,
                          config_.max_duration_ns};
  size_t fresh = 0;  // signatures the daemon does not have yet for this stream
  for (int i = 0; i < b.signatures_size(); ++i) {
    const v1::Signature& sig = b.signatures(i);
    if (sig.id() == 0 || sig.name().empty() || sig.name().size() > kMaxNameBytes ||
        sig.shape_size() > static_cast<int>(kMaxShapeDims) ||
        sig.layout().size() > kMaxShortString || sig.library().size() > kMaxShortString) {
      f->drop(&f->sigs, i, Reason::kBadSignature,
              "signature " + std::to_string(sig.id()) +
                  ": id 0, empty or oversized name, or too many shape dims");
      continue;
    }
    if (!s.sig_map.contains(sig.id()) && !new_sigs->contains(sig.id()) &&
        s.sig_map.size() + ++fresh > config_.max_signatures_per_rank) {
      f->drop(&f->sigs, i, Reason::kTooManySignatures,
              "more than --max-signatures-per-rank signatures");
      continue;
    }
    (*new_sigs)[sig.id()] = 0;
  }
  std::unordered_set<uint32_t> new_apis;
  for (int i = 0; i < b.api_names_size(); ++i) {
    const v1::ApiName& a = b.api_names(i);
    if (a.id() == 0 || a.qualified_name().size() > kMaxShortString) {
      f->drop(&f->apis, i, Reason::kBadSignature, "api name with id 0 or too long");
      continue;
    }
    new_apis.insert(a.id());
  }
  auto known = [&](uint32_t id) { return s.sig_map.contains(id) || new_sigs->contains(id); };
  for (int i = 0; i < b.kernels_size(); ++i) {
    const v1::KernelRecord& k = b.kernels(i);
    if (!known(k.signature_id())) {
      f->drop(&f->kernels, i, Reason::kUnknownSignature,
              "kernel record names unknown signature " + std::to_string(k.signature_id()));
    } else if (badTime(limits, k.start_ns(), k.end_ns()) ||
               (k.issue_ns() != 0 &&
                (k.issue_ns() < limits.min_ns || k.issue_ns() > limits.max_ns))) {
      f->drop(&f->kernels, i, Reason::kBadTimestamp,
              "kernel record times out of range (start " + std::to_string(k.start_ns()) + ", end " +
                  std::to_string(k.end_ns()) + ")");
    } else if (k.has_collective() &&
               (k.collective().nranks() < 0 ||
                static_cast<size_t>(k.collective().nranks()) > config_.max_ranks_per_job)) {
      f->drop(&f->kernels, i, Reason::kBadRecord, "collective nranks out of range");
    }
  }
  for (int i = 0; i < b.summaries_size(); ++i) {
    const v1::KernelSummary& sm = b.summaries(i);
    if (!known(sm.signature_id())) {
      f->drop(&f->summaries, i, Reason::kUnknownSignature,
              "summary names unknown signature " + std::to_string(sm.signature_id()));
      continue;
    }
    if (badTime(limits, sm.window_start_ns(), sm.window_end_ns())) {
      f->drop(&f->summaries, i, Reason::kBadTimestamp, "summary window out of range");
      continue;
    }
    if (sm.clusters_size() > static_cast<int>(kMaxClusters)) {
      f->drop(&f->summaries, i, Reason::kBadRecord, "too many clusters in a summary");
      continue;
    }
    for (const auto& c : sm.clusters()) {
      if (c.p50_ns() < 0 || c.p99_ns() < 0 || c.sum_ns() < 0 ||
          c.p50_ns() > config_.max_duration_ns || c.p99_ns() > config_.max_duration_ns ||
          c.count() > (1ULL << 40)) {
        f->drop(&f->summaries, i, Reason::kBadRecord, "summary cluster out of range");
        break;
      }
    }
  }
  for (int i = 0; i < b.spans_size(); ++i) {
    const v1::ApiSpan& sp = b.spans(i);
    if (!s.api_ids.contains(sp.api_id()) && !new_apis.contains(sp.api_id())) {
      f->drop(&f->spans, i, Reason::kUnknownSignature,
              "span names unknown api id " + std::to_string(sp.api_id()));
    } else if (badTime(limits, sp.start_ns(), sp.end_ns())) {
      f->drop(&f->spans, i, Reason::kBadTimestamp, "span times out of range");
    }
  }
  for (int i = 0; i < b.steps_size(); ++i) {
    const v1::StepMarker& st = b.steps(i);
    if (badTime(limits, st.start_ns(), st.end_ns())) {
      f->drop(&f->steps, i, Reason::kBadTimestamp, "step times out of range");
    }
  }
  for (int i = 0; i < b.step_stats_size(); ++i) {
    Reason r = Reason::kCount;
    std::string e = stepStatsError(b.step_stats(i), limits, &r);
    if (!e.empty()) f->drop(&f->step_stats, i, r, std::move(e));
  }
  if (b.created_ns() != 0 && (b.created_ns() < limits.min_ns || b.created_ns() > limits.max_ns)) {
    f->created = true;
    f->drop(nullptr, 0, Reason::kBadTimestamp, "batch created_ns out of range");
  }
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
    const auto sit = sessions_.find(session_id);
    if (sit == sessions_.end()) {
      return reject(Reason::kSessionReplaced, Code::kFailedPrecondition,
                    "stream is no longer the rank's session", true);
    }
    Session& s = sit->second;
    if (sent.rank() != s.rank) {
      return reject(Reason::kRankMismatch, Code::kPermissionDenied,
                    "batch for rank " + std::to_string(sent.rank()) + " on the stream of rank " +
                        std::to_string(s.rank) + " of job " + s.job->job_id,
                    true);
    }
    JobState& job = *s.job;
    RankState& rs = job.ranks[s.rank];
    rank = s.rank;
    // Exactly once: a batch at or below the highest seq applied for this process was applied
    // before (a re-send or spool replay after a reconnect or a daemon restart).
    RankState::Incarnation& inc = incarnation(rs, s.pid, s.start_ns, now);
    if (sent.batch_seq() != 0 &&
        (sent.batch_seq() <= inc.seq || sent.batch_seq() == inc.jump_seq)) {
      if (sent.from_spool())
        return reject(Reason::kDuplicateBatch, Code::kOk, "batch already held");
      return refuseBatch(
          job, rs, now, Reason::kOutOfOrder, Code::kInvalidArgument,
          "batch_seq " + std::to_string(sent.batch_seq()) + " after " + std::to_string(inc.seq));
    }
    const size_t items = static_cast<size_t>(sent.kernels_size()) + sent.summaries_size() +
                         sent.spans_size() + sent.steps_size() + sent.signatures_size() +
                         sent.api_names_size() + sent.step_stats_size();
    if (items > config_.max_batch_items) {
      return refuseBatch(job, rs, now, Reason::kOversized, Code::kResourceExhausted,
                         "batch of " + std::to_string(items) + " items is over --max-batch-items");
    }
    const size_t sent_records = static_cast<size_t>(sent.kernels_size()) + sent.summaries_size() +
                                sent.spans_size() + sent.steps_size();
    if (config_.rank_rate_limit > 0) {
      const double cap = config_.rank_rate_limit * config_.rank_rate_burst_s;
      s.tokens = std::min(
          cap, s.tokens + config_.rank_rate_limit * static_cast<double>(now - s.refill_ns) / 1e9);
      s.refill_ns = now;
      if (static_cast<double>(sent_records) > s.tokens) {
        return refuseBatch(job, rs, now, Reason::kRateLimited, Code::kResourceExhausted,
                           "rank is over --rank-rate-limit records/s");
      }
    }
    std::unordered_map<uint32_t, uint32_t> new_sigs;
    BatchFilter f;
    validate(s, sent, now, &new_sigs, &f);
    if (f.dropped > 0) {
      // Only the invalid items go; everything else, the tables above all, is applied.
      clean.emplace(sent);
      eraseIndices(clean->mutable_signatures(), f.sigs);
      eraseIndices(clean->mutable_api_names(), f.apis);
      eraseIndices(clean->mutable_kernels(), f.kernels);
      eraseIndices(clean->mutable_summaries(), f.summaries);
      eraseIndices(clean->mutable_spans(), f.spans);
      eraseIndices(clean->mutable_steps(), f.steps);
      eraseIndices(clean->mutable_step_stats(), f.step_stats);
      if (f.created) clean->set_created_ns(0);
      applied = &*clean;
      for (size_t i = 0; i < f.by_reason.size(); ++i) {
        if (f.by_reason[i] == 0) continue;
        counters_.items_dropped[i].fetch_add(f.by_reason[i], std::memory_order_relaxed);
        noteRefused(job, rs, now, static_cast<Reason>(i), 0, f.by_reason[i], f.first_error[i]);
      }
      verdict.reason = f.first;
      verdict.error = f.first_error[static_cast<size_t>(f.first)];
      verdict.items_dropped = f.dropped;
    }
    const v1::RecordBatch& b = *applied;
    const size_t records = static_cast<size_t>(b.kernels_size()) + b.summaries_size() +
                           b.spans_size() + b.steps_size();

    // Everything checked: apply.
    s.tokens -= static_cast<double>(records);
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
    job_id = job.job_id;
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
      ++st.count;
      st.total_ns += d;
      st.hist.add(d);
      st.flops += static_cast<double>(k.flops() != 0 ? k.flops() : st.sig.flops_per_call());
      st.bytes += static_cast<double>(k.bytes() != 0 ? k.bytes() : st.sig.bytes_per_call());
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
      st.dirty = true;
    }
    if (b.deep_trace_size() > 0 && config_.store_raw && store_) {
      // Stored with the next checkpoint, like raw records (exactly once across a crash).
      const auto n = static_cast<size_t>(b.deep_trace_size());
      if (pending_raw_count_ + n <= config_.max_pending_raw) {
        std::vector<DeepTraceRow>& deep = pending_deep_[job.job_id];
        for (const v1::DeepTraceRecord& d : b.deep_trace()) deep.push_back(DeepTraceRow{rank, d});
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
  counters_.deep_trace_records.fetch_add(static_cast<uint64_t>(applied->deep_trace_size()),
                                         std::memory_order_relaxed);
  if (config_.on_batch) config_.on_batch(job_id, rank, *applied);
  return verdict;
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
