// GrpcExporter's pending spool (exporter.h): DIR/<job>/<rank>/pending-<pid>.pb, the batches the
// daemon has not had yet, appended in batch order (spill), replayed from the front
// (spoolReadNext), compacted and left with its meta for a later upload when the exporter stops
// (finishSpool); and the sweep that uploads the spools ended processes left (spool_upload.h).
// Lock order: spool_mu_, then mu_.
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <system_error>
#include <utility>

#include "src/common/log.h"
#include "src/common/private_dir.h"
#include "src/common/text.h"
#include "src/records/collective_blocks.h"
#include "src/records/spool_format.h"
#include "src/timing/exporter.h"
#include "src/timing/exporter_internal.h"

namespace flare::timing {
namespace {

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
    FLARE_LOG_WARN(kExportLog, "flare: {}; the spool cannot be uploaded by another process", error);
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
    FLARE_LOG_INFO(kExportLog,
                   "flare: spool sweep of {}: {} ended processes' spools uploaded ({} batches), "
                   "{} kept for later{}",
                   options_.spool_dir, r.files_uploaded, r.batches_sent, r.files_failed,
                   r.errors.empty() ? "" : " (" + r.errors.front() + ")");
  }
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
      FLARE_LOG_WARN(kExportLog,
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
      FLARE_LOG_WARN(kExportLog,
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
    FLARE_LOG_WARN(kExportLog,
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

void GrpcExporter::stripRecords(flare::v1::RecordBatch* batch) {
  batch->clear_kernels();
  batch->clear_step_stats();
  batch->clear_spans();
  batch->clear_summaries();
  batch->clear_collective_blocks();
  batch->clear_steps();
  batch->clear_deep_trace();
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
      FLARE_LOG_WARN(kExportLog,
                     "flare: the spool {} is unreadable at offset {}; its rest is dropped",
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
    FLARE_LOG_WARN(kExportLog, "flare: {} bytes of records could not be sent and stay in {}",
                   stats_.spool_bytes, spool_path_);
  }
}

}  // namespace flare::timing
