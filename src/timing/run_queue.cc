#include "src/timing/run_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <string>

#include "src/common/log.h"

namespace flare::timing {

std::optional<int64_t> parseSchedstatWait(std::string_view line) {
  // "<on-CPU ns> <run-queue wait ns> <timeslices>": the second field.
  const size_t space = line.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view rest = line.substr(space + 1);
  int64_t wait = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), wait);
  if (ec != std::errc() || end == rest.data() || wait < 0) return std::nullopt;
  if (end != rest.data() + rest.size() && *end != ' ' && *end != '\n') return std::nullopt;
  return wait;
}

RunQueueReader::~RunQueueReader() {
  for (auto& [tid, fd] : files_) ::close(fd);
}

std::optional<int64_t> RunQueueReader::readFd(int fd) const {
  char buf[128];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return std::nullopt;
  return parseSchedstatWait(std::string_view(buf, static_cast<size_t>(n)));
}

std::optional<int64_t> RunQueueReader::read(uint32_t tid) {
  if (off_) return std::nullopt;
  std::optional<int64_t> wait;
  if (auto it = files_.find(tid); it != files_.end()) {
    wait = readFd(it->second);
    if (!wait) {  // the thread is gone (its id may come back for another thread: reopen then)
      ::close(it->second);
      files_.erase(it);
    }
  }
  if (!wait && files_.count(tid) == 0) {
    const std::string path = "/proc/self/task/" + std::to_string(tid) + "/schedstat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      wait = readFd(fd);
      if (wait && files_.size() < kMaxOpenFiles) {
        files_.emplace(tid, fd);
      } else {
        ::close(fd);
      }
    }
  }
  if (wait) {
    ever_read_ = true;
    return wait;
  }
  if (!ever_read_ && ++failures_ >= kFailuresBeforeOff) {
    off_ = true;
    common::logOnce(common::LogLevel::kWarn, "timing", "run-queue-off",
                    "flare: run-queue wait not measured (/proc/self/task/<tid>/schedstat "
                    "unreadable; a kernel without CONFIG_SCHED_INFO?): steps carry no "
                    "run_queue_wait_ns, and CPU contention cannot be told apart from host work");
  }
  return std::nullopt;
}

}  // namespace flare::timing
