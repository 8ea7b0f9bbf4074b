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

namespace flare::timing {
namespace {

constexpr char kLog[] = "timing";
constexpr uint64_t kMaxBatchBytes = 64ull << 20;   // the reader's plausibility bound
constexpr size_t kMaxExpandedRecords = 16u << 20;  // records a batch may stand for, likewise

}  // namespace

void appendVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    *out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *out += static_cast<char>(value);
}

SpoolSink::SpoolSink(const std::string& dir, const std::string& job_id, int rank, int pid,
                     SpoolSinkOptions options)
    : builder_(rank,
               BatchBuilderOptions{.batch_bytes = options.batch_bytes,
                                   .clock_map = std::move(options.clock_map),
                                   .extra_drops = {},
                                   .summary_mode = options.summary
                                                       ? std::function<bool()>([] { return true; })
                                                       : std::function<bool()>(),
                                   .summary_window_ns = options.summary_window_ns},
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
  appendVarint(&bytes, size);
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

bool readSpoolFile(const std::string& path, std::vector<flare::v1::RecordBatch>* out,
                   std::string* error) {
  auto fail = [error](std::string message) {
    if (error != nullptr) *error = std::move(message);
    return false;
  };
  try {
    std::unique_ptr<FILE, int (*)(FILE*)> file(fopen(path.c_str(), "rbe"), &fclose);
    if (!file) {
      return fail(fmt::format("{}: {}", path, std::system_category().message(errno)));
    }
    std::string buffer;
    uint64_t offset = 0;
    for (;;) {
      int c = fgetc(file.get());
      if (c == EOF) {
        if (ferror(file.get()))
          return fail(fmt::format("{}: read error at offset {}", path, offset));
        return true;
      }
      uint64_t length = 0;
      int prefix_bytes = 0;
      for (int shift = 0;; shift += 7) {
        ++prefix_bytes;
        length |= static_cast<uint64_t>(c & 0x7f) << shift;
        if ((c & 0x80) == 0) break;
        if (prefix_bytes == 10) {
          return fail(fmt::format("{}: malformed length prefix at offset {}", path, offset));
        }
        c = fgetc(file.get());
        if (c == EOF) {
          return fail(fmt::format("{}: truncated length prefix at offset {}", path, offset));
        }
      }
      if (length > kMaxBatchBytes) {
        return fail(fmt::format("{}: implausible batch length {} at offset {} (garbage?)", path,
                                length, offset));
      }
      buffer.resize(length);
      const size_t got = length == 0 ? 0 : fread(buffer.data(), 1, length, file.get());
      if (got != length) {
        return fail(fmt::format("{}: truncated batch at offset {}: {} of {} bytes", path, offset,
                                got, length));
      }
      flare::v1::RecordBatch batch;
      if (!batch.ParseFromString(buffer)) {
        return fail(fmt::format("{}: malformed batch at offset {}", path, offset));
      }
      std::string why;
      if (records::expandCollectiveBlocks(&batch, kMaxExpandedRecords, &why) !=
          records::Expand::kOk) {
        return fail(fmt::format("{}: batch at offset {}: {}", path, offset, why));
      }
      out->push_back(std::move(batch));
      offset += static_cast<uint64_t>(prefix_bytes) + length;
    }
  } catch (...) {
    return fail(fmt::format("{}: out of memory while reading", path));
  }
}

}  // namespace flare::timing
