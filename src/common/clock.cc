// Implementation of clock.h.
#include "src/common/clock.h"

#include <time.h>

#include <limits>
#include <new>

namespace flare::common {
namespace {

int64_t readNs(clockid_t id) noexcept {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

int64_t monotonicNs() noexcept {
  return readNs(CLOCK_MONOTONIC);
}

int64_t realtimeNs() noexcept {
  return readNs(CLOCK_REALTIME);
}

const Clock& systemClock() noexcept {
  // Built in static storage on first use and never destroyed: no static constructor, no exit-time
  // destructor, so it stays usable from other threads while the process exits.
  alignas(SystemClock) static unsigned char storage[sizeof(SystemClock)];
  static const SystemClock* clock = new (storage) SystemClock;
  return *clock;
}

ClockMap ClockMap::sample(int tries) noexcept {
  ClockMap best;
  int64_t best_width = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < (tries < 1 ? 1 : tries); ++i) {
    const int64_t before = monotonicNs();
    const int64_t real = realtimeNs();
    const int64_t after = monotonicNs();
    const int64_t width = after - before;
    if (width < best_width) {
      best_width = width;
      best = ClockMap(before + width / 2, real);
      best.uncertainty_ns_ = (width + 1) / 2;
    }
  }
  return best;
}

}  // namespace flare::common
