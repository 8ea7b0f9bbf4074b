// The Tracer's GPU → host clock map (tracer_impl.h), on the poller thread.
#include "src/common/log.h"
#include "src/timing/tracer_impl.h"

namespace flare::timing {
using namespace tracer_internal;

// The GPU → host clock map, one reference event per device (events of different devices
// cannot be compared). A reference is recorded through DeviceTimer::recordReference (an idle
// stream of that device) and the host clock is read right after the call returns; once it has
// completed, an event X of that device maps to
//
//     host(X) = ref_host_ns + elapsedNs(ref, X)
//
// Error bound, for one mapped time:
//   - launch latency of the reference: the GPU timestamps it when it reaches it, after the host
//     read (a few µs on an idle stream; more if recordReference's stream was busy), so mapped
//     times are early by up to that latency (a constant offset within one calibration);
//   - drift between recalibrations: the GPU clock against CLOCK_MONOTONIC, times the age of
//     the reference (e.g. 10 ppm × 1 s = 10 µs at worst with the default recalibrate_ns;
//     durations on the GPU, end - start, carry only drift × duration);
//   - the resolution of elapsedNs: cudaEventElapsedTime's float milliseconds, a 24-bit
//     mantissa, so a time T ms after its reference is quantized to about T * 2^-23 ms (0.06 µs
//     under 1 s, 1 µs at 8 s: why the default recalibrate_ns is 1 s, not 10);
//   - a preemption of the poller between the record call and the host read puts every mapped
//     time late by its length: the host clock is read around the call, and a reference whose
//     bracket is wider than kTightReferenceNs is recorded again kLooseRetryNs later (and again,
//     while loose), the tighter one kept (one such 0.67 ms offset on one rank of a loaded 2-core
//     machine made a healthy communicator look 25% slow, docs/benchmarks.md; a 44 µs one,
//     under the old 100 µs bound, made a 2-rank all-reduce 25% slow when its peer arrived last).
//     The first reference of a device is usually loose: its bracket holds the private stream's
//     creation.
// A new reference is recorded every
// recalibrate_ns; the old one stays in use until the new one completes, so ops are never held
// back by a recalibration. Ops of a device wait (in their queue) only until its first
// reference completes.
void Tracer::Impl::calibrate() {
  const int64_t now_ns = clock_->nowNs();
  for (auto& [device, cal] : cals_) {
    if (cal.pending == nullptr) {
      const bool due = (cal.ref == nullptr && !cal.broken) ||
                       now_ns - cal.attempt_ns >= opts_.recalibrate_ns ||
                       (cal.retry_soon && now_ns - cal.attempt_ns >= kLooseRetryNs);
      if (due) {
        void* event = nullptr;
        const int64_t before = clock_->nowNs();
        if (timer_->recordReference(device, &event) && event != nullptr) {
          cal.pending = event;
          cal.pending_host_ns = clock_->nowNs();
          cal.pending_width_ns = cal.pending_host_ns - before;
          cal.attempt_ns = cal.pending_host_ns;
        } else {
          referenceFailed(device, cal, now_ns);
        }
      }
    }
    if (cal.pending != nullptr) {
      switch (timer_->queryEvent(cal.pending)) {
        case DeviceTimer::Status::kReady: {
          const bool loose = cal.pending_width_ns > kTightReferenceNs;
          cal.retry_soon = loose;
          cal.failures = 0;
          if (cal.ref != nullptr && loose && cal.pending_width_ns > cal.ref_width_ns) {
            timer_->destroyEvent(cal.pending);  // the one in use is tighter
            cal.pending = nullptr;
            break;
          }
          if (cal.ref != nullptr) timer_->destroyEvent(cal.ref);
          cal.ref = cal.pending;
          cal.ref_host_ns = cal.pending_host_ns;
          cal.ref_width_ns = cal.pending_width_ns;
          cal.pending = nullptr;
          cal.broken = false;
          break;
        }
        case DeviceTimer::Status::kNotReady:
          break;
        case DeviceTimer::Status::kError:
          timer_->destroyEvent(cal.pending);
          cal.pending = nullptr;
          referenceFailed(device, cal, now_ns);
          break;
      }
    }
  }
}

void Tracer::Impl::referenceFailed(int device, DeviceCal& cal, int64_t now_ns) {
  cal.attempt_ns = now_ns;
  ++cal.failures;
  if (cal.ref == nullptr && !cal.broken && cal.failures >= kReferenceAttempts) {
    cal.broken = true;
    FLARE_LOG_WARN(kLog,
                   "GPU clock calibration failed {} times on device {}; its ops are dropped "
                   "(event_errors) until a calibration succeeds",
                   cal.failures, device);
  }
}

}  // namespace flare::timing
