#include "src/timing/spool_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <memory>
#include <string_view>
#include <system_error>
#include <utility>

#include "src/common/log.h"
#include "src/common/private_dir.h"
#include "src/common/text.h"
#include "src/records/collective_blocks.h"
#include "src/records/spool_format.h"

namespace flare::timing {
namespace {

constexpr char kLog[] = "timing";

}  // namespace

SpoolSink::SpoolSink(const std::string& dir, const std::string& job_id, int rank, int pid,
                     SpoolSinkOptions options)
    : builder_(rank,
               BatchBuilderOptions{
                   .batch_bytes = options.batch_bytes,
                   .clock_map = std::move(options.clock_map),
                   .extra_drops = {},
                   .summary_mode = options.summary ? std::function<bool()>([] { return true; })
                                                   : std::function<bool()>(),
                   .summary_window_ns = options.summary_window_ns,
                   .run_queue_wait = {},  // the default reader
                   .now_ns = {},
                   .run_queue_period_ns = BatchBuilderOptions::kRunQueuePeriodNs,
                   .raw_run_queue_period_ns = BatchBuilderOptions::kRawRunQueuePeriodNs,
                   .run_queue_off = {},
                   .step_decisions = {}},
               [this](flare::v1::RecordBatch&& batch) { write(batch); }) {
  try {
    const std::filesystem::path folder =
        std::filesystem::path(dir) / common::safePathComponent(job_id) / std::to_string(rank);
    path_ = (folder / ("records-" + std::to_string(pid) + ".pb")).string();
    // This user's folders only, 0700, none through a symlink (private_dir.h).
    std::string made, why;
    if (!common::makePrivateDirs(dir, dir == common::defaultSpoolRoot(),
                                 {common::safePathComponent(job_id), std::to_string(rank)}, &made,
                                 &why)) {
      disabled_.store(true, std::memory_order_release);
      FLARE_LOG_WARN(kLog, "spool {}: the folder is unsafe: {}; records are not written", path_,
                     why);
      return;
    }
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0) disable("opening", errno);
  } catch (...) {
    disable("setting up", ENOMEM);
  }
}

SpoolSink::~SpoolSink() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

void SpoolSink::disable(const std::string& what, int err) {
  if (disabled_.exchange(true, std::memory_order_acq_rel)) return;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  FLARE_LOG_WARN(kLog, "spool {}: {} failed: {}; records are no longer written to the spool", path_,
                 what, std::system_category().message(err));
}

void SpoolSink::onSignature(uint32_t id, const Signature& sig) {
  if (disabled()) return;
  try {
    builder_.addSignature(id, sig);
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onOps(std::span<const CompletedOp> ops) {
  if (disabled()) {
    dropped_.fetch_add(ops.size(), std::memory_order_relaxed);
    return;
  }
  try {
    builder_.addOps(ops);
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onApiName(uint32_t id, const std::string& qualified_name) {
  if (disabled()) return;
  try {
    builder_.addApiName(id, qualified_name);
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onDeepTrace(std::span<const DeepTraceRecord> records) {
  if (disabled()) return;
  try {
    builder_.addDeepTrace(records);
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onGraphLaunches(std::span<const int64_t> issue_ns) {
  if (disabled()) return;
  try {
    builder_.addGraphLaunches(issue_ns);
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onSpans(std::span<const CompletedSpan> spans) {
  if (disabled()) return;
  try {
    builder_.addSpans(spans);
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::onDevice(const DeviceDescription& device) {
  if (disabled()) return;
  builder_.setDevice(device);
}

void SpoolSink::onDrops(const DropCounters& totals) {
  builder_.setDrops(totals);
}

void SpoolSink::flush() {
  if (disabled()) return;
  try {
    builder_.flush();
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::finish() {
  if (disabled()) return;
  try {
    builder_.finish();
  } catch (...) {
    disable("encoding", ENOMEM);
  }
}

void SpoolSink::write(const flare::v1::RecordBatch& batch) {
  if (disabled()) {
    dropped_.fetch_add(records::recordCount(batch), std::memory_order_relaxed);
    return;
  }
  const uint64_t kernels = records::recordCount(batch);
  std::string bytes;
  const size_t size = batch.ByteSizeLong();
  bytes.reserve(size + 10);
  records::appendVarint(&bytes, size);
  if (!batch.AppendToString(&bytes)) {
    disable("encoding", EINVAL);
    dropped_.fetch_add(kernels, std::memory_order_relaxed);
    return;
  }
  if (!writeAll(bytes)) {
    disable("writing", errno);
    dropped_.fetch_add(kernels, std::memory_order_relaxed);
    return;
  }
  written_.fetch_add(1, std::memory_order_relaxed);
}

bool SpoolSink::writeAll(const std::string& bytes) {
  if (fd_ < 0) {
    errno = EBADF;
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
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

}  // namespace flare::timing
