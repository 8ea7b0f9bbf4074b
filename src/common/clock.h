// Clocks: the two system clocks Flare uses, an injectable Clock seam, and the map between them.
//
// Flare measures on CLOCK_MONOTONIC (immune to NTP steps, and the clock GPU timestamps are
// mapped onto) and reports on CLOCK_REALTIME (Unix-epoch nanoseconds, comparable across hosts
// up to NTP/PTP accuracy). ClockMap carries a sampled (monotonic, realtime) pair and converts
// between the two. Core classes take a `const Clock&` so that tests drive time with a
// FakeClock instead of sleeping (conventions.md #5, #13).
//
// Everything here is thread-safe and allocation-free; nothing throws.
#pragma once

#include <atomic>
#include <cstdint>

namespace flare::common {

// CLOCK_MONOTONIC in nanoseconds.
int64_t monotonicNs() noexcept;
// CLOCK_REALTIME in nanoseconds since the Unix epoch.
int64_t realtimeNs() noexcept;

// A source of monotonic time in nanoseconds. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t nowNs() const noexcept = 0;
};

// CLOCK_MONOTONIC. Stateless; use systemClock() rather than making new ones.
class SystemClock final : public Clock {
 public:
  int64_t nowNs() const noexcept override { return monotonicNs(); }
};

// The process's SystemClock (built on first use, never destroyed).
const Clock& systemClock() noexcept;

// A clock that moves only when told to; for tests. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 0) noexcept : now_ns_(start_ns) {}
  int64_t nowNs() const noexcept override { return now_ns_.load(std::memory_order_acquire); }
  void setNs(int64_t ns) noexcept { now_ns_.store(ns, std::memory_order_release); }
  void advanceNs(int64_t delta_ns) noexcept {
    now_ns_.fetch_add(delta_ns, std::memory_order_acq_rel);
  }

 private:
  std::atomic<int64_t> now_ns_;
};

// Converts CLOCK_MONOTONIC times to CLOCK_REALTIME and back, from one sampled pair of readings.
// The two clocks run at the same rate but NTP may step or slew the realtime clock, so owners
// (the timing thread) resample periodically and swap in the new map. A value type: copy it
// freely; a default-constructed map is the identity.
class ClockMap {
 public:
  ClockMap() = default;
  // A map that says monotonic `monotonic_ns` happened at realtime `realtime_ns`.
  ClockMap(int64_t monotonic_ns, int64_t realtime_ns) noexcept
      : monotonic_ns_(monotonic_ns), realtime_ns_(realtime_ns) {}

  // Samples the system clocks: reads realtime between two monotonic reads, `tries` times, and
  // keeps the tightest bracket (its midpoint pairs with the realtime read). uncertaintyNs()
  // is half that bracket.
  static ClockMap sample(int tries = 5) noexcept;

  int64_t fromMonotonic(int64_t monotonic_ns) const noexcept {
    return monotonic_ns - monotonic_ns_ + realtime_ns_;
  }
  int64_t toMonotonic(int64_t realtime_ns) const noexcept {
    return realtime_ns - realtime_ns_ + monotonic_ns_;
  }
  // realtime - monotonic.
  int64_t offsetNs() const noexcept { return realtime_ns_ - monotonic_ns_; }
  int64_t monotonicAnchorNs() const noexcept { return monotonic_ns_; }
  int64_t realtimeAnchorNs() const noexcept { return realtime_ns_; }
  int64_t uncertaintyNs() const noexcept { return uncertainty_ns_; }

 private:
  int64_t monotonic_ns_ = 0;
  int64_t realtime_ns_ = 0;
  int64_t uncertainty_ns_ = 0;
};

}  // namespace flare::common
