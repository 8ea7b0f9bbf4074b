// One stream of GrpcExporter (exporter.h) on the sender thread: connect and hello, then 1. the
// re-send window (exporter_resend.cc), 2. the spool, 3. the memory queue, with hang reports and
// command results between batches; the reader thread's side (acks, commands, refusals); and
// the tables every new stream's first batch carries.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <utility>

#include "flare/v1/protocol.h"
#include "src/common/log.h"
#include "src/timing/exporter.h"
#include "src/timing/exporter_internal.h"

namespace flare::timing {

flare::v1::RankMessage GrpcExporter::makeHello() {
  flare::v1::RankMessage hello_msg;
  flare::v1::RankHello* hello = hello_msg.mutable_hello();
  const common::Identity& id = options_.identity;
  hello->set_protocol_version(flare::v1::kProtocolVersion);
  hello->set_job_id(id.job_id);
  hello->set_rank(id.rank);
  hello->set_local_rank(id.local_rank);
  hello->set_world_size(id.world_size);
  hello->set_local_world_size(id.local_world_size);
  hello->set_host(id.host);
  hello->set_pid(id.pid);
  hello->set_token(options_.token);
  hello->mutable_versions()->set_flare(options_.flare_version);
  hello->set_start_time_unix_ns(start_unix_ns_);
  hello->set_mode(mode());
  hello->set_identity_source(id.source);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (hello_device_) *hello->mutable_device() = *hello_device_;
  }
  hello->set_hang_kill(options_.hang_kill);
  return hello_msg;
}

// Opens a stream and says hello; true once the daemon accepted it (`s` is then the active
// stream, its reader running). false: the attempt failed or the daemon refused the rank
// (counted, logged on a change, the stream ended).
bool GrpcExporter::connect(Stream& s) {
  std::string error;
  std::unique_ptr<TransportStream> t = transport_->open(&error);
  if (!t) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.connect_failures++;
    if (stats_.connect_failures == 1 || was_connected_) {
      FLARE_LOG_WARN(kExportLog, "flare: cannot reach the daemon: {}; spooling to {} and retrying",
                     error, spool_path_);
    }
    was_connected_ = false;
    return false;
  }
  s.t = std::move(t);

  const flare::v1::RankMessage hello_msg = makeHello();
  const common::Identity& id = options_.identity;
  std::string hello_bytes;
  hello_msg.SerializeToString(&hello_bytes);

  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = &s;
  }
  bool ok = s.t->write(hello_bytes);
  s.reader = std::thread([this, &s] { readLoop(&s); });
  {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t deadline = nowNs() + options_.hello_timeout_ns;
    while (ok && !s.acked && !s.broken && nowNs() < deadline &&
           !(stopping_ && nowNs() >= stop_deadline_ns_)) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
    ok = ok && s.acked;
  }
  if (!ok || !s.accepted) {
    const std::string status = endStream(s, false);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.connect_failures++;
    if (ok && !s.accepted) {
      stats_.refused = true;
      FLARE_LOG_WARN(kExportLog,
                     "flare: the daemon refused rank {} of job {}: {}; records go to {}", id.rank,
                     id.job_id, s.ack_error.empty() ? "no reason given" : s.ack_error, spool_path_);
    } else if (stats_.connect_failures == 1 || was_connected_) {
      FLARE_LOG_WARN(kExportLog,
                     "flare: no hello answer from the daemon ({}); spooling to {} and "
                     "retrying",
                     status.empty() ? "timeout" : status, spool_path_);
    }
    was_connected_ = false;
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.streams_opened++;
    stats_.connected = true;
    if (!was_connected_) {
      FLARE_LOG_INFO(kExportLog, "flare: streaming rank {} of job {} to the daemon", id.rank,
                     id.job_id);
    }
    was_connected_ = true;
    if (options_.sweep_spool && !sweeper_.joinable() && !stopping_) {
      sweeper_ = std::thread([this] {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr);
        pthread_setname_np(pthread_self(), "flare-sweep");
        sweepOrphans();
      });
    }
  }
  return true;
}

// Ends `s`: with `graceful`, half-closes and waits (bounded by the stop deadline, at least
// 100 ms) for the daemon to end it, which means it read everything; then cancels it, joins its
// reader and returns the transport's final status.
std::string GrpcExporter::endStream(Stream& s, bool graceful) {
  if (graceful) {
    // Half-close and let the daemon end the stream (it has then read everything), bounded.
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t deadline = std::max(stop_deadline_ns_, nowNs() + 100'000'000);
    lock.unlock();
    s.t->writesDone();
    lock.lock();
    while (!s.broken && nowNs() < deadline) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  s.t->cancel();
  if (s.reader.joinable()) s.reader.join();
  const std::string status = s.t->finish();
  std::lock_guard<std::mutex> lock(mu_);
  active_ = nullptr;
  return status;
}

bool GrpcExporter::streamOnce() {
  Stream s;
  if (!connect(s)) return false;
  bool first = true;  // the first batch of a stream carries every table entry
  bool graceful = false;
  // 1. Batches that may not have reached the daemon on the previous stream (exporter_resend.cc).
  bool failed = !resendWindow(s, &first);
  // 2. The spool, then 3. the queue; results of commands go out between batches.
  if (!failed) failed = !sendPending(s, &first, &graceful);
  const std::string status = endStream(s, graceful && !failed);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.connected = false;
  if (graceful && !failed && s.broken) {
    // The daemon ended the stream after our half-close: it has read every batch.
    resend_.clear();
    resend_bytes_ = 0;
  } else if (!stopping_) {
    FLARE_LOG_WARN(kExportLog,
                   "flare: lost the stream to the daemon ({}); spooling to {} and "
                   "reconnecting",
                   status.empty() ? "ended by the daemon" : status, spool_path_);
  }
  return true;
}

// 2. and 3. of a stream: the spool, then the memory queue, in batch order; a suspected hang and
// the results of commands go out between batches. Returns when the stream breaks (false), the
// stop deadline passes, or, stopping, the queue is empty (`graceful`).
bool GrpcExporter::sendPending(Stream& s, bool* first, bool* graceful) {
  bool failed = false;
  while (!failed) {
    const bool spool_pending = spoolPending();
    if (spool_pending) spill(options_.buffer_bytes / 2);  // newer batches wait behind the spool
    std::unique_lock<std::mutex> lock(mu_);
    if (!hang_pending_.empty()) {  // a suspected hang goes out before anything else
      std::string r = std::move(hang_pending_);
      hang_pending_.clear();
      if (!s.hang_reports) {
        stats_.hang_reports_unsent++;
        lock.unlock();
        common::logOnce(common::LogLevel::kWarn, kExportLog, "export-hang-unsupported",
                        "flare: the daemon does not read hang reports (older flared); this "
                        "rank's suspected hangs are only logged");
        continue;
      }
      lock.unlock();
      failed = !s.t->write(r);
      lock.lock();
      if (!failed) stats_.hang_reports_sent++;
      continue;
    }
    if (!results_.empty()) {
      std::string r = std::move(results_.front());
      results_.pop_front();
      lock.unlock();
      failed = !s.t->write(r);
      continue;
    }
    if (s.broken) break;
    if (stopping_ && nowNs() >= stop_deadline_ns_) break;
    if (spool_pending) {
      lock.unlock();
      Item item;
      bool got = false;
      {
        std::lock_guard<std::mutex> spool_lock(spool_mu_);
        got = spoolReadNext(&item.batch);
      }
      if (got && item.batch.batch_seq() <= s.resume_after_seq) {
        std::lock_guard<std::mutex> l(mu_);
        stats_.batches_skipped++;  // the daemon has it: dropped from the spool
      } else if (got) {
        item.batch.set_from_spool(true);
        item.bytes = item.batch.ByteSizeLong();
        failed = !sendBatch(s, item.batch, *first);
        *first = false;
        if (!failed) {
          std::lock_guard<std::mutex> l(mu_);
          stats_.batches_replayed++;
        }
        remember(std::move(item));
      }
      continue;
    }
    if (queue_.empty()) {
      if (stopping_) {
        *graceful = true;
        break;
      }
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      continue;
    }
    // Pop under spool_mu_ too: a spill (poller) between the spool check above and this pop
    // would put older batches in the spool behind this one, and the daemon drops a batch that
    // arrives after a newer one of the same process (at or below its resume point).
    lock.unlock();
    std::unique_lock<std::mutex> spool_lock(spool_mu_);
    lock.lock();
    if (spool_read_ < spool_write_ || queue_.empty()) continue;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    queue_bytes_ -= item.bytes;
    lock.unlock();
    spool_lock.unlock();
    learnTables(item.batch);
    failed = !sendBatch(s, item.batch, *first);
    *first = false;
    remember(std::move(item));
  }
  return !failed;
}

bool GrpcExporter::sendBatch(Stream& s, flare::v1::RecordBatch& batch, bool first) {
  bool all_tables = first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all_tables = all_tables || s.resend_tables;
    s.resend_tables = false;
  }
  if (all_tables) {
    std::lock_guard<std::mutex> tables_lock(tables_mu_);
    // A new stream (the daemon's tables for it are empty), or the daemon refused something of
    // an earlier batch (an entry may be lost): send every entry known so far.
    std::map<uint32_t, bool> have;
    for (const auto& sig : batch.signatures()) have[sig.id()] = true;
    for (const auto& [id, sig] : sigs_) {
      if (!have.count(id)) *batch.add_signatures() = sig;
    }
    std::map<uint32_t, bool> have_api;
    for (const auto& a : batch.api_names()) have_api[a.id()] = true;
    for (const auto& [id, a] : apis_) {
      if (!have_api.count(id)) *batch.add_api_names() = a;
    }
  }
  flare::v1::RankMessage msg;
  msg.unsafe_arena_set_allocated_batch(&batch);
  std::string bytes;
  const bool encoded = msg.SerializeToString(&bytes);
  msg.unsafe_arena_release_batch();
  if (!encoded) return true;  // cannot happen for a well-formed batch; skip it
  {
    std::lock_guard<std::mutex> lock(mu_);
    write_started_ns_ = nowNs();
  }
  const bool ok = s.t->write(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  write_started_ns_ = 0;
  if (ok) stats_.batches_sent++;
  return ok;
}

void GrpcExporter::learnTables(const flare::v1::RecordBatch& batch) {
  std::lock_guard<std::mutex> lock(tables_mu_);
  for (const auto& s : batch.signatures()) sigs_[s.id()] = s;
  for (const auto& a : batch.api_names()) apis_[a.id()] = a;
}

void GrpcExporter::readLoop(Stream* s) {
  std::string bytes;
  while (s->t->read(&bytes)) {
    flare::v1::DaemonMessage msg;
    if (!msg.ParseFromString(bytes)) {
      common::logOnce(common::LogLevel::kWarn, kExportLog, "export-bad-message",
                      "flare: ignoring a message from the daemon that does not decode");
      continue;
    }
    if (msg.has_ack()) {
      std::lock_guard<std::mutex> lock(mu_);
      s->acked = true;
      s->accepted = msg.ack().accepted();
      s->ack_error = msg.ack().error();
      s->resume_after_seq = msg.ack().resume_after_seq();
      s->hang_reports = msg.ack().hang_reports();
      if (msg.ack().accepted() && msg.ack().mode() != flare::v1::MODE_UNSPECIFIED) {
        mode_.store(static_cast<int>(msg.ack().mode()));
      }
      cv_.notify_all();
    } else if (msg.has_command()) {
      const flare::v1::Command& cmd = msg.command();
      flare::v1::RankMessage reply;
      flare::v1::CommandResult* result = reply.mutable_command_result();
      result->set_command_id(cmd.id());
      if (cmd.has_set_mode()) {
        mode_.store(static_cast<int>(cmd.set_mode().mode()));
        result->set_ok(true);
      } else {
        try {
          handler_->handle(cmd, result);
        } catch (...) {
          result->set_ok(false);
          result->set_error("command handler failed");
        }
      }
      result->set_command_id(cmd.id());
      std::string out;
      reply.SerializeToString(&out);
      std::lock_guard<std::mutex> lock(mu_);
      stats_.commands++;
      results_.push_back(std::move(out));
      cv_.notify_all();
    } else if (msg.has_rejected()) {
      const flare::v1::BatchRejected& r = msg.rejected();
      {
        std::lock_guard<std::mutex> lock(mu_);
        s->resend_tables = true;
        if (r.batch_kept()) {
          stats_.items_rejected += r.items_dropped();
        } else {
          stats_.batches_rejected++;
        }
        cv_.notify_all();
      }
      // One line per reason for the life of the process, where the user looks (stderr).
      const std::string reason = r.reason().empty() ? "unknown" : r.reason().substr(0, 64);
      common::logOnce(
          common::LogLevel::kWarn, kExportLog, "export-rejected-" + reason, "{}",
          r.batch_kept()
              ? fmt::format("flare: the daemon dropped {} item(s) of batch {} ({}: {}) and kept "
                            "the rest; sending the signature tables again and going on (logged "
                            "once per reason; `flare status` shows the rank's refusals)",
                            r.items_dropped(), r.batch_seq(), reason, r.error())
              : fmt::format("flare: the daemon refused batch {} ({}: {}); sending the signature "
                            "tables again and going on (logged once per reason; `flare status` "
                            "shows the rank's refusals)",
                            r.batch_seq(), reason, r.error()));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  s->broken = true;
  cv_.notify_all();
}

}  // namespace flare::timing
