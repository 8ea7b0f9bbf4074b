// Run-queue wait of this process's threads: how long a thread was runnable but waited for a CPU
// (Linux schedstat: /proc/self/task/<tid>/schedstat, "<on-CPU ns> <run-queue wait ns>
// <timeslices>", kept by every kernel built with CONFIG_SCHED_INFO). MODE_SUMMARY reads it for the
// threads that issue GPU work, so that a host which falls behind because the machine's CPUs are
// oversubscribed is told apart from training code that keeps the host busy (docs/metrics.md,
// "Run-queue wait").
//
// One pread of an open file per thread and reading (~2 us); a thread's file stays open until the
// thread is gone, at most kMaxOpenFiles at once (further threads open and close per reading).
// Where the files cannot be read (no schedstat, /proc not mounted), the reader turns itself off
// after its first failures and says so once. Not thread-safe: the poller thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace flare::timing {

// The run-queue wait of a schedstat line, or nullopt when the line is not one.
std::optional<int64_t> parseSchedstatWait(std::string_view line);

class RunQueueReader {
 public:
  static constexpr size_t kMaxOpenFiles = 64;
  // Failures in a row, with no reading ever taken, before the reader turns itself off.
  static constexpr int kFailuresBeforeOff = 8;
  RunQueueReader() = default;
  RunQueueReader(const RunQueueReader&) = delete;
  RunQueueReader& operator=(const RunQueueReader&) = delete;
  ~RunQueueReader();

  // Cumulative ns thread `tid` (of this process) has waited for a CPU; nullopt when it cannot be
  // read (the thread is gone, or the reader is off).
  std::optional<int64_t> read(uint32_t tid);
  bool off() const { return off_; }

 private:
  std::optional<int64_t> readFd(int fd) const;
  std::unordered_map<uint32_t, int> files_;  // tid → open schedstat file
  bool ever_read_ = false;
  int failures_ = 0;
  bool off_ = false;
};

}  // namespace flare::timing
