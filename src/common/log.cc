// Implementation of log.h on spdlog's pattern formatter and one stderr sink.
//
// Every line goes straight to one sink (no spdlog::logger objects, no use of spdlog's global
// registry, which the host application may use for itself): the subsystem travels as the
// "logger name" of the message, so the pattern's %n prints it.
#include "src/common/log.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "src/common/config.h"

namespace flare::common {
namespace {

constexpr size_t kMaxOnceKeys = 4096;
constexpr size_t kMaxLabel = 40;

// Writes all of `data` to stderr, retrying on EINTR and short writes.
bool writeStderr(const char* data, size_t size) noexcept {
  while (size > 0) {
    ssize_t n = ::write(STDERR_FILENO, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

spdlog::level::level_enum toSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      break;
  }
  return spdlog::level::off;
}

char levelLetter(LogLevel level) {
  static constexpr char kLetters[] = {'T', 'D', 'I', 'W', 'E', 'O'};
  auto i = static_cast<size_t>(level);
  return i < sizeof(kLetters) ? kLetters[i] : '?';
}

// The one sink: formats under its mutex and writes each line with a single write(2), so that
// lines of the ranks sharing a terminal or file do not interleave mid-line.
class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void setCapture(LogCapture capture) {
    std::lock_guard<std::mutex> lock(mutex_);
    capture_ = std::move(capture);
  }
  uint64_t writeFailures() const { return write_failures_.load(std::memory_order_relaxed); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    buffer_.clear();
    formatter_->format(msg, buffer_);
    if (capture_) {
      std::string_view line(buffer_.data(), buffer_.size());
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
      capture_(fromSpdlog(msg.level), line);
      return;
    }
    if (!writeStderr(buffer_.data(), buffer_.size())) {
      write_failures_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void flush_() override {}

 private:
  static LogLevel fromSpdlog(spdlog::level::level_enum l) {
    switch (l) {
      case spdlog::level::trace:
        return LogLevel::kTrace;
      case spdlog::level::debug:
        return LogLevel::kDebug;
      case spdlog::level::info:
        return LogLevel::kInfo;
      case spdlog::level::warn:
        return LogLevel::kWarn;
      case spdlog::level::err:
      case spdlog::level::critical:
        return LogLevel::kError;
      default:
        return LogLevel::kOff;
    }
  }

  spdlog::memory_buf_t buffer_;  // guarded by mutex_
  LogCapture capture_;           // guarded by mutex_
  std::atomic<uint64_t> write_failures_{0};
};

// Which subsystems show below warn. Immutable once published.
struct SubsystemFilter {
  bool exclude = false;            // "^a,b": all but these
  std::vector<std::string> names;  // empty and !exclude: all

  bool shows(std::string_view subsystem) const {
    bool listed = std::find(names.begin(), names.end(), subsystem) != names.end();
    return exclude ? !listed : (names.empty() || listed);
  }
};

SubsystemFilter* parseFilter(std::string_view spec) {
  auto* f = new SubsystemFilter;
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
  };
  spec = trim(spec);
  if (!spec.empty() && spec.front() == '^') {
    f->exclude = true;
    spec.remove_prefix(1);
  }
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = std::min(spec.find(',', pos), spec.size());
    std::string_view name = trim(spec.substr(pos, comma - pos));
    if (!name.empty()) f->names.emplace_back(name);
    pos = comma + 1;
  }
  return f;
}

// All logging state. Created on first use and never destroyed, so that threads still logging
// while the process exits find it intact.
struct State {
  State() {
    sink = std::make_shared<StderrSink>();
    label.store(internLabel("rank ?"), std::memory_order_release);
    applyPattern();
    refreshTimezone();
    readEnvironment(&pending_warnings);
  }

  // Reads FLARE_LOG_LEVEL and FLARE_LOG_SUBSYSTEMS. Warnings are returned in `warnings`
  // rather than emitted: the first read happens while State is being built, and emitting
  // would log, which needs State.
  void readEnvironment(std::vector<std::string>* warnings) {
    const char* def = declaredDefault("FLARE_LOG_LEVEL");
    LogLevel lvl = parseLogLevel(def).value_or(LogLevel::kInfo);
    if (auto raw = getEnv("FLARE_LOG_LEVEL")) {
      if (auto parsed = parseLogLevel(*raw)) {
        lvl = *parsed;
      } else {
        warnings->push_back("flare: FLARE_LOG_LEVEL='" + *raw +
                            "' is not a log level (trace|debug|info|warn|error|off); using " + def);
      }
    }
    level.store(static_cast<int>(lvl), std::memory_order_release);
    publishFilter(parseFilter(paramString("FLARE_LOG_SUBSYSTEMS")));
  }

  void publishFilter(SubsystemFilter* f) {
    std::lock_guard<std::mutex> lock(mu);
    retired_filters.emplace_back(f);  // owned here, never freed while readers may hold it
    filter.store(f, std::memory_order_release);
  }

  // Keeps every label ever set alive: rawLog() may be reading an old one.
  const char* internLabel(std::string_view text) {
    std::lock_guard<std::mutex> lock(mu);
    text = text.substr(0, kMaxLabel);
    labels.push_back(std::make_unique<std::string>(text));
    return labels.back()->c_str();
  }

  void setLabel(std::string_view text) {
    label.store(internLabel(text), std::memory_order_release);
    applyPattern();
  }

  void applyPattern() {
    // %L: one-letter level, %n: the subsystem (carried as the logger name).
    sink->set_pattern(
        fmt::format("[flare {} %H:%M:%S.%e %L %n] %v", label.load(std::memory_order_acquire)));
  }

  // rawLog() cannot call localtime_r (not async-signal-safe); it applies this offset instead.
  void refreshTimezone() {
    time_t now = ::time(nullptr);
    tm local{};
    if (localtime_r(&now, &local) != nullptr) {
      gmt_offset_s.store(local.tm_gmtoff, std::memory_order_relaxed);
    }
  }

  void flushPendingWarnings() {
    if (pending_flushed.load(std::memory_order_acquire)) return;
    if (pending_flushed.exchange(true, std::memory_order_acq_rel)) return;
    for (const std::string& w : pending_warnings) configWarningOnce(w, w);
  }

  std::shared_ptr<StderrSink> sink;
  std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
  std::atomic<const SubsystemFilter*> filter{nullptr};
  std::atomic<const char*> label{nullptr};
  std::atomic<long> gmt_offset_s{0};

  std::atomic<uint64_t> warnings{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> once_suppressed{0};
  std::atomic<uint64_t> raw_write_failures{0};

  std::vector<std::string> pending_warnings;  // written only by the constructor
  std::atomic<bool> pending_flushed{false};

  std::mutex mu;
  std::vector<std::unique_ptr<SubsystemFilter>> retired_filters;  // guarded by mu
  std::vector<std::unique_ptr<std::string>> labels;               // guarded by mu
  std::set<std::string, std::less<>> once_keys;                   // guarded by mu
  bool once_overflow_reported = false;                            // guarded by mu
};

// The state once built, for rawLog(), which must not build it (that allocates).
std::atomic<State*> g_built_state{nullptr};

// nullptr when the state could not be built (out of memory): logging is then off.
State* state() noexcept {
  static State* s = []() noexcept -> State* {
    try {
      auto* built = new State;
      g_built_state.store(built, std::memory_order_release);
      return built;
    } catch (...) {
      return nullptr;
    }
  }();
  if (s != nullptr) s->flushPendingWarnings();
  return s;
}

// Formats an integer of `width` digits (zero-padded) into `out`; returns the end.
char* putDigits(char* out, long value, int width) {
  for (int i = width - 1; i >= 0; --i) {
    out[i] = static_cast<char>('0' + value % 10);
    value /= 10;
  }
  return out + width;
}

// Appends `text` to [out, end); returns the new end.
char* putText(char* out, char* end, const char* text) {
  while (text != nullptr && *text != '\0' && out < end) *out++ = *text++;
  return out;
}

}  // namespace

namespace detail {
void countOnceSuppressed() noexcept {
  if (State* s = state()) s->once_suppressed.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept {
  std::string lower;
  try {
    for (char c : name) {
      if (!std::isspace(static_cast<unsigned char>(c))) {
        lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
      }
    }
  } catch (...) {
    return std::nullopt;
  }
  if (lower == "trace") return LogLevel::kTrace;
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warn" || lower == "warning") return LogLevel::kWarn;
  if (lower == "error") return LogLevel::kError;
  if (lower == "off") return LogLevel::kOff;
  return std::nullopt;
}

std::string_view logLevelName(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "?";
}

void initLogging(const Identity& id) noexcept {
  State* s = state();
  if (s == nullptr) return;
  try {
    std::vector<std::string> warnings;
    s->readEnvironment(&warnings);
    s->refreshTimezone();
    s->setLabel(fmt::format("rank {}", id.rank));
    for (const std::string& w : warnings) configWarningOnce(w, w);
  } catch (...) {
  }
}

void setLogLabel(std::string_view label) noexcept {
  State* s = state();
  if (s == nullptr) return;
  try {
    s->setLabel(label);
  } catch (...) {
  }
}

void setLogLevel(LogLevel level) noexcept {
  if (State* s = state()) s->level.store(static_cast<int>(level), std::memory_order_release);
}

LogLevel logLevel() noexcept {
  State* s = state();
  return s == nullptr ? LogLevel::kOff
                      : static_cast<LogLevel>(s->level.load(std::memory_order_acquire));
}

void setLogSubsystems(std::string_view spec) noexcept {
  State* s = state();
  if (s == nullptr) return;
  try {
    s->publishFilter(parseFilter(spec));
  } catch (...) {
  }
}

void setLogCapture(LogCapture capture) noexcept {
  State* s = state();
  if (s == nullptr) return;
  try {
    s->sink->setCapture(std::move(capture));
  } catch (...) {
  }
}

bool logEnabled(LogLevel level, std::string_view subsystem) noexcept {
  State* s = state();
  if (s == nullptr || level >= LogLevel::kOff) return false;
  if (static_cast<int>(level) < s->level.load(std::memory_order_acquire)) return false;
  if (level >= LogLevel::kWarn) return true;
  const SubsystemFilter* f = s->filter.load(std::memory_order_acquire);
  try {
    return f == nullptr || f->shows(subsystem);
  } catch (...) {
    return true;
  }
}

void logMessage(LogLevel level, std::string_view subsystem, std::string_view message) noexcept {
  if (!logEnabled(level, subsystem)) return;
  State* s = state();
  try {
    spdlog::details::log_msg msg(spdlog::string_view_t(subsystem.data(), subsystem.size()),
                                 toSpdlog(level),
                                 spdlog::string_view_t(message.data(), message.size()));
    s->sink->log(msg);
    if (level == LogLevel::kWarn) s->warnings.fetch_add(1, std::memory_order_relaxed);
    if (level == LogLevel::kError) s->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    // spdlog failed to format or write; fall back to the raw path, which cannot fail this way.
    rawLog(level, "log", "a log line could not be written through spdlog");
  }
}

bool firstTimeSeen(std::string_view key) noexcept {
  State* s = state();
  if (s == nullptr) return false;
  bool report_overflow = false;
  try {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->once_keys.find(key) != s->once_keys.end()) {
      s->once_suppressed.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (s->once_keys.size() >= kMaxOnceKeys) {
      s->once_suppressed.fetch_add(1, std::memory_order_relaxed);
      report_overflow = !s->once_overflow_reported;
      s->once_overflow_reported = true;
    } else {
      s->once_keys.emplace(key);
      return true;
    }
  } catch (...) {
    return false;
  }
  if (report_overflow) {
    logAt(LogLevel::kWarn, "log",
          "more than {} distinct log-once keys; further once-only messages are only counted",
          kMaxOnceKeys);
  }
  return false;
}

void rawLog(LogLevel level, const char* subsystem, const char* message) noexcept {
  // Reads the state only if some earlier call built it (building allocates); before that,
  // every level but off is written. The subsystem filter is not applied.
  State* s = g_built_state.load(std::memory_order_acquire);
  if (level >= LogLevel::kOff) return;
  if (s != nullptr && static_cast<int>(level) < s->level.load(std::memory_order_relaxed)) return;

  char buf[512];
  char* end = buf + sizeof(buf) - 1;  // room for the newline
  char* p = putText(buf, end, "[flare ");
  p = putText(p, end, s != nullptr ? s->label.load(std::memory_order_acquire) : "rank ?");
  p = putText(p, end, " ");
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  long secs = static_cast<long>(ts.tv_sec) +
              (s != nullptr ? s->gmt_offset_s.load(std::memory_order_relaxed) : 0);
  long of_day = ((secs % 86400) + 86400) % 86400;
  if (end - p > 16) {
    p = putDigits(p, of_day / 3600, 2);
    *p++ = ':';
    p = putDigits(p, (of_day / 60) % 60, 2);
    *p++ = ':';
    p = putDigits(p, of_day % 60, 2);
    *p++ = '.';
    p = putDigits(p, ts.tv_nsec / 1'000'000, 3);
    *p++ = ' ';
    *p++ = levelLetter(level);
    *p++ = ' ';
  }
  p = putText(p, end, subsystem);
  p = putText(p, end, "] ");
  p = putText(p, end, message);
  *p++ = '\n';
  if (!writeStderr(buf, static_cast<size_t>(p - buf)) && s != nullptr) {
    s->raw_write_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

LogCounters logCounters() noexcept {
  LogCounters c;
  State* s = state();
  if (s == nullptr) return c;
  c.warnings = s->warnings.load(std::memory_order_relaxed);
  c.errors = s->errors.load(std::memory_order_relaxed);
  c.once_suppressed = s->once_suppressed.load(std::memory_order_relaxed);
  c.write_failures =
      s->sink->writeFailures() + s->raw_write_failures.load(std::memory_order_relaxed);
  return c;
}

}  // namespace flare::common
