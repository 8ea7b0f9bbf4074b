// Flare's own log lines, on stderr, prefixed with who wrote them:
//
//   [flare rank 3 12:00:01.234 W hook] cuBLASLt descriptor unknown; GEMM FLOPs not counted
//
// Lines are filtered by level (FLARE_LOG_LEVEL, default info) and, below warn, by subsystem
// (FLARE_LOG_SUBSYSTEMS: "hook,timing" shows only those, "^sim" all but those; warnings and
// errors are always shown). Formatting is spdlog's (header-only, like fmt, so that the preload
// library carries no runtime dependency on them).
//
// Usable before initLogging(): the first call reads the environment and labels lines
// "rank ?" until initLogging() names the rank. All functions are thread-safe and never throw.
// They take a mutex and allocate, so they are not for interposed wrappers or signal handlers:
// those use rawLog(), which does neither.
//
// The project rule "every internal failure turns that part off and says so once" is served by
// logOnce() (keyed) and FLARE_LOG_*_ONCE (once per call site).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>

#include "src/common/identity.h"

namespace flare::common {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// "trace", "debug", "info", "warn" (or "warning"), "error", "off"; case-insensitive.
std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept;
std::string_view logLevelName(LogLevel level) noexcept;

// Labels this process's lines "rank N" and (re)reads FLARE_LOG_LEVEL and FLARE_LOG_SUBSYSTEMS.
// Call once the identity is known; calling again is harmless.
void initLogging(const Identity& id) noexcept;
// Labels lines with `label` instead ("flared", "flare-cli"); at most 40 characters are kept.
void setLogLabel(std::string_view label) noexcept;

// Overrides the level / subsystem filter from the environment (command-line flags, tests).
// `spec` has FLARE_LOG_SUBSYSTEMS's syntax.
void setLogLevel(LogLevel level) noexcept;
LogLevel logLevel() noexcept;
void setLogSubsystems(std::string_view spec) noexcept;

// Tests: receive each formatted line (without the newline) instead of stderr; an empty
// function restores stderr. Called under the sink's lock: it must not log.
using LogCapture = std::function<void(LogLevel level, std::string_view line)>;
void setLogCapture(LogCapture capture) noexcept;

// Whether a line of `level` from `subsystem` would be written.
bool logEnabled(LogLevel level, std::string_view subsystem) noexcept;

// Writes one line (a newline in `message` is written as-is; keep messages to one line).
void logMessage(LogLevel level, std::string_view subsystem, std::string_view message) noexcept;

// Formats with fmt (checked at compile time) and writes, if enabled.
template <typename... Args>
void logAt(LogLevel level, std::string_view subsystem, fmt::format_string<Args...> format,
           Args&&... args) noexcept {
  if (!logEnabled(level, subsystem)) return;
  try {
    logMessage(level, subsystem, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
    logMessage(level, subsystem, "(log message could not be formatted)");
  }
}

// True the first time `key` is seen in this process (the set of keys is bounded; past the
// bound, keys count as seen and the suppression is counted in LogCounters::once_suppressed).
bool firstTimeSeen(std::string_view key) noexcept;

// Writes the line only the first time `key` is seen in this process; returns whether it did.
// Use a key naming the failure and its object ("cublasLt:unknown-attr:17").
template <typename... Args>
bool logOnce(LogLevel level, std::string_view subsystem, std::string_view key,
             fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!firstTimeSeen(key)) return false;
  logAt(level, subsystem, format, std::forward<Args>(args)...);
  return true;
}

// Writes "[flare <label> HH:MM:SS.mmm L subsystem] message\n" to stderr with one write(2):
// no allocation, no lock, async-signal-safe. Lines are cut at 511 bytes. Honours the level
// once any other function here has run (before that, writes every level but off); ignores
// the subsystem filter. Local time uses the UTC offset taken at the last initLogging().
void rawLog(LogLevel level, const char* subsystem, const char* message) noexcept;

// Totals since the process started, for /metrics (conventions.md #10).
struct LogCounters {
  uint64_t warnings = 0;         // lines written at warn level
  uint64_t errors = 0;           // lines written at error level
  uint64_t once_suppressed = 0;  // logOnce()/FLARE_LOG_*_ONCE repeats not written
  uint64_t write_failures = 0;   // lines stderr did not take
};
LogCounters logCounters() noexcept;

}  // namespace flare::common

#define FLARE_LOG_AT(level, subsystem, ...) \
  ::flare::common::logAt(::flare::common::LogLevel::level, subsystem, __VA_ARGS__)
#define FLARE_LOG_TRACE(subsystem, ...) FLARE_LOG_AT(kTrace, subsystem, __VA_ARGS__)
#define FLARE_LOG_DEBUG(subsystem, ...) FLARE_LOG_AT(kDebug, subsystem, __VA_ARGS__)
#define FLARE_LOG_INFO(subsystem, ...) FLARE_LOG_AT(kInfo, subsystem, __VA_ARGS__)
#define FLARE_LOG_WARN(subsystem, ...) FLARE_LOG_AT(kWarn, subsystem, __VA_ARGS__)
#define FLARE_LOG_ERROR(subsystem, ...) FLARE_LOG_AT(kError, subsystem, __VA_ARGS__)

// Once per call site per process, whatever the arguments.
#define FLARE_LOG_ONCE_AT(level, subsystem, ...)                             \
  do {                                                                       \
    static ::std::atomic<bool> flare_log_once_done_{false};                  \
    if (!flare_log_once_done_.exchange(true, ::std::memory_order_relaxed)) { \
      FLARE_LOG_AT(level, subsystem, __VA_ARGS__);                           \
    } else {                                                                 \
      ::flare::common::detail::countOnceSuppressed();                        \
    }                                                                        \
  } while (0)
#define FLARE_LOG_INFO_ONCE(subsystem, ...) FLARE_LOG_ONCE_AT(kInfo, subsystem, __VA_ARGS__)
#define FLARE_LOG_WARN_ONCE(subsystem, ...) FLARE_LOG_ONCE_AT(kWarn, subsystem, __VA_ARGS__)
#define FLARE_LOG_ERROR_ONCE(subsystem, ...) FLARE_LOG_ONCE_AT(kError, subsystem, __VA_ARGS__)

namespace flare::common::detail {
void countOnceSuppressed() noexcept;
}  // namespace flare::common::detail
