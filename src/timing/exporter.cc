#include "src/timing/exporter.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <utility>

#include "flare/v1/protocol.h"
#include "src/common/log.h"
#include "src/common/private_dir.h"
#include "src/common/text.h"
#include "src/records/collective_blocks.h"
#include "src/records/spool_format.h"

namespace flare::timing {
namespace {

constexpr char kLog[] = "export";

bool pwriteAll(int fd, const char* data, size_t size, uint64_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool preadAll(int fd, char* data, size_t size, uint64_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, data + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void UnsupportedCommands::handle(const flare::v1::Command& /*command*/,
                                 flare::v1::CommandResult* result) {
  result->set_ok(false);
  result->set_error("not supported yet");
}

// One stream: the transport's stream, its reader thread and what the reader saw. The fields
// other than `t` and `reader` are guarded by the exporter's mu_.
struct GrpcExporter::Stream {
  std::unique_ptr<TransportStream> t;
  std::thread reader;
  bool broken = false;  // the reader returned (stream ended or failed)
  bool acked = false;
  bool accepted = false;
  std::string ack_error;
  uint64_t resume_after_seq = 0;  // HelloAck: the daemon holds batches up to this one
  bool hang_reports = false;      // HelloAck: the daemon reads RankMessage.hang_report
  // A BatchRejected came: the next batch carries every signature and API name again, so that
  // no table entry the daemon refused or lost can make later records unknown to it.
  bool resend_tables = false;
};

GrpcExporter::GrpcExporter(std::unique_ptr<Transport> transport, ExporterOptions options)
    : options_(std::move(options)),
      transport_(std::move(transport)),
      handler_(options_.handler != nullptr ? options_.handler : &default_handler_),
      builder_(options_.identity.rank,
               BatchBuilderOptions{
                   .batch_bytes = options_.batch_bytes,
                   .clock_map = options_.clock_map,
                   .extra_drops =
                       [this](flare::v1::DropCounters* d) {
                         d->set_spool_dropped(spool_dropped_.load(std::memory_order_relaxed));
                         d->set_send_failed(send_failed_.load(std::memory_order_relaxed));
                       },
                   .summary_mode = [this] { return mode() == flare::v1::MODE_SUMMARY; },
                   .summary_window_ns = options_.summary_window_ns},
               [this](flare::v1::RecordBatch&& batch) { enqueue(std::move(batch)); }),
      mode_(static_cast<int>(options_.mode)) {
  if (options_.spool_dir.empty()) options_.spool_dir = common::defaultSpoolRoot();
  spool_path_ = (std::filesystem::path(options_.spool_dir) /
                 common::safePathComponent(options_.identity.job_id) /
                 std::to_string(options_.identity.rank) /
                 ("pending-" + std::to_string(options_.identity.pid) + ".pb"))
                    .string();
  resend_limit_ = options_.resend_bytes;
  start_unix_ns_ = common::realtimeNs();  // before any thread: the hello and the spool's meta
  sender_ = std::thread([this] { run(); });
}

GrpcExporter::~GrpcExporter() {
  if (forked_.load(std::memory_order_acquire)) {
    // A forked child: the threads are the parent's; leak them rather than touch them.
    if (sender_.joinable()) sender_.detach();
    if (sweeper_.joinable()) sweeper_.detach();
    return;
  }
  shutdown(0);
  if (sender_.joinable()) sender_.join();  // bounded: the sender sees stopping_ after a connect
  sweep_cancel_ = true;
  if (sweeper_.joinable()) sweeper_.join();  // bounded: cancelling ends its stream at once
}

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

// The spool's meta (spool_upload.h): this process's hello and every table entry so far, so that
// whatever stays in the spool when the process ends can be uploaded by another. spool_mu_ held.
void GrpcExporter::writeMeta() {
  flare::v1::RecordBatch tables;
  tables.set_rank(options_.identity.rank);
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    for (const auto& [id, sig] : sigs_) *tables.add_signatures() = sig;
    for (const auto& [id, api] : apis_) *tables.add_api_names() = api;
  }
  std::string error;
  if (!writeSpoolMeta(spool_path_, makeHello().hello(), tables, &error)) {
    FLARE_LOG_WARN(kLog, "flare: {}; the spool cannot be uploaded by another process", error);
  }
}

// Uploads the spools that ended processes left under the spool root (spool_upload.h), once per
// process, after the first accepted hello: the daemon is reachable.
void GrpcExporter::sweepOrphans() {
  SpoolUploadOptions o;
  o.ack_timeout_ms = 5000;
  o.drain_timeout_ms = 30000;
  o.cancelled = [this] { return sweep_cancel_.load(std::memory_order_relaxed); };
  const SpoolUploadResult r = uploadOrphanedSpools(options_.spool_dir, *transport_, o);
  if (r.files_uploaded > 0 || r.files_failed > 0) {
    FLARE_LOG_INFO(kLog,
                   "flare: spool sweep of {}: {} ended processes' spools uploaded ({} batches), "
                   "{} kept for later{}",
                   options_.spool_dir, r.files_uploaded, r.batches_sent, r.files_failed,
                   r.errors.empty() ? "" : " (" + r.errors.front() + ")");
  }
}

int64_t GrpcExporter::nowNs() const {
  return common::monotonicNs();
}

// ---- poller thread -------------------------------------------------------------------------

void GrpcExporter::onSignature(uint32_t id, const Signature& sig) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addSignature(id, sig);
}

void GrpcExporter::onOps(std::span<const CompletedOp> ops) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addOps(ops);
}

void GrpcExporter::onApiName(uint32_t id, const std::string& qualified_name) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addApiName(id, qualified_name);
}

void GrpcExporter::onSpans(std::span<const CompletedSpan> spans) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addSpans(spans);
}

void GrpcExporter::onDeepTrace(std::span<const DeepTraceRecord> records) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.addDeepTrace(records);
}

void GrpcExporter::postCommandResult(const flare::v1::CommandResult& result) {
  if (forked_.load(std::memory_order_relaxed)) return;
  flare::v1::RankMessage reply;
  *reply.mutable_command_result() = result;
  std::string out;
  reply.SerializeToString(&out);
  std::lock_guard<std::mutex> lock(mu_);
  results_.push_back(std::move(out));
  cv_.notify_all();
}

void GrpcExporter::onDrops(const DropCounters& totals) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.setDrops(totals);
}

void GrpcExporter::onDevice(const DeviceDescription& device) {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.setDevice(device);
  std::lock_guard<std::mutex> lock(mu_);
  hello_device_ = toProtoDevice(device);
}

void GrpcExporter::flush() {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.flush();
  checkStall();
}

void GrpcExporter::finish() {
  if (forked_.load(std::memory_order_relaxed)) return;
  builder_.finish();
  checkStall();
}

void GrpcExporter::stripRecords(flare::v1::RecordBatch* batch) {
  batch->clear_kernels();
  batch->clear_step_stats();
  batch->clear_spans();
  batch->clear_summaries();
  batch->clear_collective_blocks();
  batch->clear_steps();
  batch->clear_deep_trace();
}

void GrpcExporter::enqueue(flare::v1::RecordBatch&& batch) {
  if (forked_.load(std::memory_order_relaxed)) return;
  Item item;
  item.bytes = batch.ByteSizeLong();
  item.batch = std::move(batch);
  bool over = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    over = !shutdown_done_ && queue_bytes_ + item.bytes > options_.buffer_bytes;
  }
  if (over) spill(options_.buffer_bytes / 2);  // the sender is not keeping up: to the spool
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_done_) {
    // After shutdown: keep nothing, count.
    stats_.records_dropped += records::recordCount(item.batch);
    stats_.send_failed++;
    send_failed_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  queue_bytes_ += item.bytes;
  queue_.push_back(std::move(item));
  cv_.notify_all();
}

void GrpcExporter::checkStall() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ != nullptr && write_started_ns_ != 0 &&
      nowNs() - write_started_ns_ > options_.stall_timeout_ns) {
    common::logOnce(common::LogLevel::kWarn, kLog, "export-stall",
                    "flare: the daemon has not read from this rank's stream for {:.0f} s; "
                    "reconnecting (records are spooled meanwhile)",
                    static_cast<double>(options_.stall_timeout_ns) / 1e9);
    active_->t->cancel();
    write_started_ns_ = 0;
  }
}

// ---- any thread ----------------------------------------------------------------------------

ExporterStats GrpcExporter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ExporterStats s = stats_;
  s.queue_bytes = queue_bytes_;
  return s;
}

bool GrpcExporter::shutdown(int64_t timeout_ns) {
  if (forked_.load(std::memory_order_acquire)) return false;
  std::unique_lock<std::mutex> lock(mu_);
  if (!shutdown_done_) {
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ns_ = nowNs() + std::max<int64_t>(timeout_ns, 0);
      cv_.notify_all();
    }
    const auto until = [&](int64_t deadline_ns) {
      while (!sender_done_) {
        const int64_t left = deadline_ns - nowNs();
        if (left <= 0) break;
        done_cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 50'000'000)));
      }
    };
    until(stop_deadline_ns_ + 50'000'000);
    if (!sender_done_ && active_ != nullptr) active_->t->cancel();  // stuck in the transport
    until(nowNs() + 200'000'000);
    shutdown_done_ = true;
    const bool joined = sender_done_;
    lock.unlock();
    // The spool sweep stops at once (its current file is kept whole for the next process).
    sweep_cancel_ = true;
    if (sweeper_.joinable()) sweeper_.join();
    if (joined) {
      if (sender_.joinable()) sender_.join();
    } else {
      // Stuck in the transport (e.g. a connect attempt): spool the queue from here and leave
      // the sender to finish on its own (the destructor joins it).
      finishSpool();
    }
    lock.lock();
  }
  return queue_.empty() && stats_.spool_bytes == 0 && stats_.send_failed == 0 &&
         stats_.spool_dropped == 0 && !stats_.refused;
}

// ---- sender thread -------------------------------------------------------------------------

void GrpcExporter::learnTables(const flare::v1::RecordBatch& batch) {
  std::lock_guard<std::mutex> lock(tables_mu_);
  for (const auto& s : batch.signatures()) sigs_[s.id()] = s;
  for (const auto& a : batch.api_names()) apis_[a.id()] = a;
}

// A pending file at our path that no live process holds is the spool of an ended process that
// had our pid (pid namespaces reuse small pids): moved aside with its meta rather than
// truncated, so that it is still uploaded. spool_mu_ held.
void GrpcExporter::keepOrphan() {
  const int fd = ::open(spool_path_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  const bool orphan =
      ::fstat(fd, &st) == 0 && st.st_size > 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  if (orphan) {
    std::string base = spool_path_.substr(0, spool_path_.size() - 3);
    base += "-" + std::to_string(st.st_mtim.tv_sec) + std::to_string(st.st_mtim.tv_nsec);
    ::rename(spoolMetaPath(spool_path_).c_str(), (base + ".meta").c_str());
    ::rename(spool_path_.c_str(), (base + ".pb").c_str());
  }
  ::close(fd);
}

bool GrpcExporter::spoolAppend(const flare::v1::RecordBatch& batch_in) {
  if (spool_fd_ < 0 && !spool_failed_) {
    // This user's folders only, none through a symlink (private_dir.h).
    std::string folder, why;
    if (!common::makePrivateDirs(options_.spool_dir,
                                 options_.spool_dir == common::defaultSpoolRoot(),
                                 {common::safePathComponent(options_.identity.job_id),
                                  std::to_string(options_.identity.rank)},
                                 &folder, &why)) {
      spool_failed_ = true;
      FLARE_LOG_WARN(kLog,
                     "flare: the spool folder is unsafe: {}; records that cannot be sent "
                     "are dropped (counted)",
                     why);
    } else {
      keepOrphan();
    }
    if (!spool_failed_)
      spool_fd_ =
          ::open(spool_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    // Held for the life of the process: an uploader leaves a locked spool alone.
    if (spool_fd_ >= 0) ::flock(spool_fd_, LOCK_EX | LOCK_NB);
    if (spool_fd_ >= 0) writeMeta();
    if (spool_fd_ < 0 && !spool_failed_) {
      spool_failed_ = true;
      FLARE_LOG_WARN(kLog,
                     "flare: cannot open the spool {}: {}; records that cannot be sent are "
                     "dropped (counted)",
                     spool_path_, std::system_category().message(errno));
    }
  }
  const flare::v1::RecordBatch* batch = &batch_in;
  flare::v1::RecordBatch stripped;
  std::string bytes;
  auto encode = [&](const flare::v1::RecordBatch& b) {
    bytes.clear();
    records::appendVarint(&bytes, b.ByteSizeLong());
    b.AppendToString(&bytes);
  };
  encode(*batch);
  bool dropped = false;
  if (spool_failed_ || spool_write_ - spool_read_ + bytes.size() > options_.spool_max_bytes) {
    dropped = true;
    stripped = batch_in;
    stripRecords(&stripped);
    batch = &stripped;
    encode(*batch);
  }
  bool ok = !spool_failed_ && pwriteAll(spool_fd_, bytes.data(), bytes.size(), spool_write_);
  if (!ok && !spool_failed_) {
    spool_failed_ = true;
    FLARE_LOG_WARN(kLog,
                   "flare: writing the spool {} failed: {}; records that cannot be sent are "
                   "dropped (counted)",
                   spool_path_, std::system_category().message(errno));
  }
  if (ok) spool_write_ += bytes.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (dropped || !ok) {
    stats_.spool_dropped++;
    stats_.records_dropped += records::recordCount(batch_in);
    spool_dropped_.fetch_add(1, std::memory_order_relaxed);
  }
  if (ok) stats_.batches_spooled++;
  stats_.spool_bytes = spool_write_ - spool_read_;
  return ok && !dropped;
}

bool GrpcExporter::spoolReadNext(flare::v1::RecordBatch* batch) {
  while (spool_fd_ >= 0 && spool_read_ < spool_write_) {
    uint64_t length = 0;
    int shift = 0;
    uint64_t offset = spool_read_;
    bool ok = false;
    for (int i = 0; i < 10; ++i) {
      char c = 0;
      if (!preadAll(spool_fd_, &c, 1, offset)) break;
      ++offset;
      length |= static_cast<uint64_t>(static_cast<unsigned char>(c) & 0x7f) << shift;
      shift += 7;
      if ((static_cast<unsigned char>(c) & 0x80) == 0) {
        ok = true;
        break;
      }
    }
    std::string data;
    if (ok && length <= records::kMaxSpoolBatchBytes && offset + length <= spool_write_) {
      data.resize(length);
      ok = preadAll(spool_fd_, data.data(), length, offset) && batch->ParseFromString(data);
    } else {
      ok = false;
    }
    if (!ok) {
      // Cannot happen unless someone else wrote the file: give the rest up, counted.
      FLARE_LOG_WARN(kLog, "flare: the spool {} is unreadable at offset {}; its rest is dropped",
                     spool_path_, spool_read_);
      std::lock_guard<std::mutex> lock(mu_);
      stats_.spool_dropped++;
      spool_dropped_.fetch_add(1, std::memory_order_relaxed);
      spool_read_ = spool_write_;
      break;
    }
    spool_read_ = offset + length;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.spool_bytes = spool_write_ - spool_read_;
    return true;
  }
  if (spool_fd_ >= 0 && spool_read_ == spool_write_ && spool_write_ > 0) {
    // Everything replayed: start the file over.
    if (::ftruncate(spool_fd_, 0) == 0) spool_read_ = spool_write_ = 0;
  }
  return false;
}

bool GrpcExporter::spoolPending() {
  std::lock_guard<std::mutex> lock(spool_mu_);
  return spool_read_ < spool_write_;
}

// Moves the oldest queued batches beyond `keep_bytes` to the end of the spool.
void GrpcExporter::spill(size_t keep_bytes) {
  std::lock_guard<std::mutex> spool_lock(spool_mu_);
  for (;;) {
    Item item;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_bytes_ <= keep_bytes || queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      queue_bytes_ -= item.bytes;
    }
    learnTables(item.batch);
    spoolAppend(item.batch);
  }
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

void GrpcExporter::readLoop(Stream* s) {
  std::string bytes;
  while (s->t->read(&bytes)) {
    flare::v1::DaemonMessage msg;
    if (!msg.ParseFromString(bytes)) {
      common::logOnce(common::LogLevel::kWarn, kLog, "export-bad-message",
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
          common::LogLevel::kWarn, kLog, "export-rejected-" + reason, "{}",
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

bool GrpcExporter::streamOnce() {
  std::string error;
  std::unique_ptr<TransportStream> t = transport_->open(&error);
  if (!t) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.connect_failures++;
    if (stats_.connect_failures == 1 || was_connected_) {
      FLARE_LOG_WARN(kLog, "flare: cannot reach the daemon: {}; spooling to {} and retrying", error,
                     spool_path_);
    }
    was_connected_ = false;
    return false;
  }
  Stream s;
  s.t = std::move(t);

  const flare::v1::RankMessage hello_msg = makeHello();
  const common::Identity& id = options_.identity;
  std::string hello_bytes;
  hello_msg.SerializeToString(&hello_bytes);

  auto end_stream = [&](bool graceful) {
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
  };

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
    const std::string status = end_stream(false);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.connect_failures++;
    if (ok && !s.accepted) {
      stats_.refused = true;
      FLARE_LOG_WARN(kLog, "flare: the daemon refused rank {} of job {}: {}; records go to {}",
                     id.rank, id.job_id, s.ack_error.empty() ? "no reason given" : s.ack_error,
                     spool_path_);
    } else if (stats_.connect_failures == 1 || was_connected_) {
      FLARE_LOG_WARN(kLog,
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
      FLARE_LOG_INFO(kLog, "flare: streaming rank {} of job {} to the daemon", id.rank, id.job_id);
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

  bool first = true;
  bool failed = false;
  // 1. Batches that may not have reached the daemon on the previous stream.
  std::deque<Item> resend = std::move(resend_);
  resend_.clear();
  resend_bytes_ = 0;
  while (!resend.empty() && !failed) {
    Item item = std::move(resend.front());
    resend.pop_front();
    if (item.batch.batch_seq() <= s.resume_after_seq) {  // the daemon has it
      std::lock_guard<std::mutex> lock(mu_);
      stats_.batches_skipped++;
      continue;
    }
    item.batch.set_from_spool(true);
    failed = !sendBatch(s, item.batch, first);
    first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed) stats_.batches_resent++;
    }
    remember(std::move(item));
  }
  while (!resend.empty()) {  // the stream broke again: keep them for the next one
    remember(std::move(resend.front()));
    resend.pop_front();
  }
  // 2. The spool, then 3. the queue; results of commands go out between batches.
  bool graceful = false;
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
        common::logOnce(common::LogLevel::kWarn, kLog, "export-hang-unsupported",
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
        failed = !sendBatch(s, item.batch, first);
        first = false;
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
        graceful = true;
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
    failed = !sendBatch(s, item.batch, first);
    first = false;
    remember(std::move(item));
  }
  const std::string status = end_stream(graceful && !failed);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.connected = false;
  if (graceful && !failed && s.broken) {
    // The daemon ended the stream after our half-close: it has read every batch.
    resend_.clear();
    resend_bytes_ = 0;
  } else if (!stopping_) {
    FLARE_LOG_WARN(kLog,
                   "flare: lost the stream to the daemon ({}); spooling to {} and "
                   "reconnecting",
                   status.empty() ? "ended by the daemon" : status, spool_path_);
  }
  return true;
}

void GrpcExporter::reportHang(const flare::v1::HangReport& report) {
  if (forked_.load(std::memory_order_acquire)) return;
  flare::v1::RankMessage m;
  *m.mutable_hang_report() = report;
  std::string bytes;
  m.SerializeToString(&bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (!hang_pending_.empty()) stats_.hang_reports_unsent++;  // replaced before it went out
  hang_pending_ = std::move(bytes);
  cv_.notify_all();
}

void GrpcExporter::remember(Item&& item) {
  if (resend_limit_ == 0) return;
  resend_bytes_ += item.bytes;
  resend_.push_back(std::move(item));
  while (resend_bytes_ > resend_limit_ && resend_.size() > 1) {
    resend_bytes_ -= resend_.front().bytes;
    resend_.pop_front();
  }
}

// After a broken stream: the re-send window goes to the spool when the spool is empty (it is
// then older than anything else pending); otherwise it stays in memory for the next stream.
void GrpcExporter::parkResend() {
  std::lock_guard<std::mutex> spool_lock(spool_mu_);
  if (resend_.empty() || spool_read_ < spool_write_) return;
  for (Item& item : resend_) {
    item.batch.set_from_spool(true);
    spoolAppend(item.batch);
  }
  resend_.clear();
  resend_bytes_ = 0;
}

void GrpcExporter::run() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);  // gRPC's threads inherit it
  pthread_setname_np(pthread_self(), "flare-export");
  int64_t backoff = options_.backoff_min_ns;
  for (;;) {
    bool refused = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      refused = stats_.refused;
      // Stopping while not connected: spool the rest, unless no attempt was made yet (a short
      // process whose first connection is still to come gets one, within the deadline).
      const bool never_tried = stats_.streams_opened == 0 && stats_.connect_failures == 0;
      if (stopping_ && (!never_tried || nowNs() >= stop_deadline_ns_)) break;
    }
    if (!refused) {
      if (streamOnce()) backoff = options_.backoff_min_ns;
      parkResend();
    }
    if (refused || stats().refused) {
      // Refused: no more attempts, everything goes to the spool.
      spill(0);
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) break;
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) break;
    // Backoff with ±20 % jitter; meanwhile the memory queue is kept under half its bound.
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    const double jitter = 0.8 + 0.4 * static_cast<double>(rng_ % 1000) / 1000.0;
    const int64_t wake = nowNs() + static_cast<int64_t>(static_cast<double>(backoff) * jitter);
    backoff = std::min(backoff * 2, options_.backoff_max_ns);
    while (!stopping_ && nowNs() < wake) {
      if (queue_bytes_ > options_.buffer_bytes / 2) {
        lock.unlock();
        spill(options_.buffer_bytes / 2);
        lock.lock();
      }
      cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(wake - nowNs(), 50'000'000)));
    }
  }
  // Stopping: whatever was not sent goes to the spool, after the re-send window.
  parkResend();
  {
    std::lock_guard<std::mutex> lock(mu_);
    results_.clear();  // command results die with the stream
  }
  finishSpool();
  std::unique_lock<std::mutex> lock(mu_);
  sender_done_ = true;
  done_cv_.notify_all();
}

// Spools the queue and leaves only the batches not yet replayed in the file, for a later
// upload. Runs once, on the sender or (when the sender is stuck) on shutdown's thread.
void GrpcExporter::finishSpool() {
  spill(0);
  std::lock_guard<std::mutex> spool_lock(spool_mu_);
  if (spool_fd_ >= 0) {
    if (spool_read_ > 0 && spool_read_ < spool_write_) {
      std::string chunk(1u << 20, '\0');
      uint64_t from = spool_read_, to = 0;
      while (from < spool_write_) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), spool_write_ - from));
        if (!preadAll(spool_fd_, chunk.data(), n, from) ||
            !pwriteAll(spool_fd_, chunk.data(), n, to))
          break;
        from += n;
        to += n;
      }
      if (from == spool_write_ && ::ftruncate(spool_fd_, static_cast<off_t>(to)) == 0) {
        spool_write_ = to;
        spool_read_ = 0;
      }
    }
    if (spool_read_ == spool_write_) spool_read_ = spool_write_ = 0;  // all replayed
    if (spool_write_ == 0) {
      ::unlink(spool_path_.c_str());
      ::unlink(spoolMetaPath(spool_path_).c_str());
    } else {
      writeMeta();  // every table, for the upload (spool_upload.h); before the lock goes
    }
    ::close(spool_fd_);
    spool_fd_ = -1;
  }
  spool_failed_ = true;  // nothing more is written
  std::lock_guard<std::mutex> lock(mu_);
  stats_.spool_bytes = spool_write_ - spool_read_;
  if (stats_.spool_bytes > 0 && !spool_reported_) {
    spool_reported_ = true;
    FLARE_LOG_WARN(kLog, "flare: {} bytes of records could not be sent and stay in {}",
                   stats_.spool_bytes, spool_path_);
  }
}

}  // namespace flare::timing
