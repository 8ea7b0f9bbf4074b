// A DeviceTimer for tests (conventions.md #5): events complete when the test says so, at the
// GPU times the test gives. No GPU, no sleeping.
//
// GPU clock model: a reference event recorded for device d completes at once (unless held) at
// GPU time clock.nowNs() + gpuOffset(d). An op event that the test completes at GPU time G is
// therefore expected at host time G - gpuOffset(d) once mapped. Events remember the device that
// was current (setThreadDevice) when they were created; elapsedNs() between events of two
// devices fails and is counted as misuse, as is any call on a destroyed event.
//
// Thread-safe (one mutex). Test-only: not part of flare_timing.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "src/common/clock.h"
#include "src/timing/timing.h"

namespace flare::timing::testing {

class FakeDeviceTimer : public DeviceTimer {
 public:
  explicit FakeDeviceTimer(const common::Clock* clock) : clock_(clock) {}
  ~FakeDeviceTimer() override = default;

  // The calling thread's current device (default 0).
  static void setThreadDevice(int device) { threadDevice() = device; }

  bool createEvent(void** event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_create_) return false;
    events_.push_back(std::make_unique<Ev>());
    Ev* ev = events_.back().get();
    ev->device = threadDevice();
    ++created_;
    *event = ev;
    return true;
  }
  void destroyEvent(void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    Ev* ev = static_cast<Ev*>(event);
    if (ev->destroyed) ++misuse_;
    ev->destroyed = true;
    ++destroyed_;
    unpend(ev);
  }
  bool recordEvent(void* event, void* stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    Ev* ev = static_cast<Ev*>(event);
    if (ev->destroyed) ++misuse_;
    if (fail_record_) return false;
    if (ev->device != threadDevice()) ++misuse_;  // recorded outside its context
    ++recorded_;
    unpend(ev);
    ev->recorded = true;
    ev->stream = stream;
    if (auto_complete_) {
      ev->status = Status::kReady;
      ev->gpu_ns = clock_->nowNs() + offset(ev->device) + (++tick_);
    } else {
      ev->status = Status::kNotReady;
      pending_[stream].push_back(ev);
    }
    return true;
  }
  Status queryEvent(void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    Ev* ev = static_cast<Ev*>(event);
    if (ev->destroyed) ++misuse_;
    return ev->status;
  }
  bool elapsedNs(void* from, void* to, int64_t* ns) override {
    std::lock_guard<std::mutex> lock(mu_);
    Ev* a = static_cast<Ev*>(from);
    Ev* b = static_cast<Ev*>(to);
    if (a->destroyed || b->destroyed || a->device != b->device || a->status != Status::kReady ||
        b->status != Status::kReady) {
      ++misuse_;
      return false;
    }
    *ns = b->gpu_ns - a->gpu_ns;
    return true;
  }
  bool isCapturing(void* stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    return capturing_.count(stream) > 0;
  }
  uint64_t streamId(void* stream) override { return reinterpret_cast<uintptr_t>(stream); }
  int currentDevice() override { return threadDevice(); }
  bool recordReference(int device, void** event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_reference_) return false;
    events_.push_back(std::make_unique<Ev>());
    Ev* ev = events_.back().get();
    ev->device = device;
    ev->recorded = true;
    ev->reference = true;
    ++references_;
    if (hold_references_) {
      ev->status = Status::kNotReady;
      held_.push_back(ev);
    } else {
      ev->status = Status::kReady;
      ev->gpu_ns = clock_->nowNs() + offset(device);
    }
    *event = ev;
    if (after_reference_) {  // e.g. the caller's thread preempted right after the call
      after_reference_();
      after_reference_ = nullptr;
    }
    return true;
  }

  // --- Test controls -------------------------------------------------------------------------

  // Completes the oldest pending event recorded on `stream` at GPU time `gpu_ns` (or with an
  // error). False when none is pending.
  bool completeNext(void* stream, int64_t gpu_ns, bool error = false) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(stream);
    if (it == pending_.end() || it->second.empty()) return false;
    Ev* ev = it->second.front();
    it->second.pop_front();
    ev->status = error ? Status::kError : Status::kReady;
    ev->gpu_ns = gpu_ns;
    return true;
  }
  // Completes the next op (start, end events) on `stream` over [gpu_start, gpu_end].
  bool completeOp(void* stream, int64_t gpu_start, int64_t gpu_end) {
    return completeNext(stream, gpu_start) && completeNext(stream, gpu_end);
  }
  size_t pendingOn(void* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(stream);
    return it == pending_.end() ? 0 : it->second.size();
  }
  // GPU clock of `device` = host clock + offset (read when a reference is recorded).
  void setGpuOffset(int device, int64_t offset_ns) {
    std::lock_guard<std::mutex> lock(mu_);
    offsets_[device] = offset_ns;
  }
  // Op events complete when recorded, at increasing GPU times.
  void setAutoComplete(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    auto_complete_ = on;
  }
  void setCapturing(void* stream, bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    if (on) {
      capturing_.insert(stream);
    } else {
      capturing_.erase(stream);
    }
  }
  void setFailRecord(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_record_ = on;
  }
  void setFailCreate(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_create_ = on;
  }
  void setFailReference(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_reference_ = on;
  }
  // References stay NotReady until releaseReferences().
  void setHoldReferences(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_references_ = on;
  }
  // Runs `fn` once inside the next recordReference, after the reference is stamped.
  void afterNextReference(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    after_reference_ = std::move(fn);
  }

  void releaseReferences() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Ev* ev : held_) {
      ev->status = Status::kReady;
      ev->gpu_ns = clock_->nowNs() + offset(ev->device);
    }
    held_.clear();
  }

  // Events made by createEvent (references not included).
  int64_t created() { return locked(created_); }
  // Events (references included) not destroyed yet.
  int64_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return created_ + references_ - destroyed_;
  }
  int64_t recorded() { return locked(recorded_); }
  int64_t references() { return locked(references_); }
  int64_t liveReferences() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& ev : events_) n += ev->reference && !ev->destroyed;
    return n;
  }
  int64_t misuse() { return locked(misuse_); }

 private:
  struct Ev {
    int device = 0;
    bool recorded = false;
    bool destroyed = false;
    bool reference = false;
    Status status = Status::kReady;
    int64_t gpu_ns = 0;
    void* stream = nullptr;
  };

  static int& threadDevice() {
    thread_local int device = 0;
    return device;
  }
  int64_t offset(int device) const {
    auto it = offsets_.find(device);
    return it == offsets_.end() ? 0 : it->second;
  }
  void unpend(Ev* ev) {
    if (!ev->recorded || ev->status != Status::kNotReady) return;
    auto it = pending_.find(ev->stream);
    if (it == pending_.end()) return;
    for (auto p = it->second.begin(); p != it->second.end(); ++p) {
      if (*p == ev) {
        it->second.erase(p);
        return;
      }
    }
  }
  int64_t locked(const int64_t& value) {
    std::lock_guard<std::mutex> lock(mu_);
    return value;
  }

  const common::Clock* clock_;
  std::function<void()> after_reference_;  // runs once, inside the next recordReference
  std::mutex mu_;
  std::vector<std::unique_ptr<Ev>> events_;
  std::map<void*, std::deque<Ev*>> pending_;
  std::vector<Ev*> held_;
  std::set<void*> capturing_;
  std::map<int, int64_t> offsets_;
  bool auto_complete_ = false;
  bool fail_record_ = false;
  bool fail_create_ = false;
  bool fail_reference_ = false;
  bool hold_references_ = false;
  int64_t tick_ = 0;
  int64_t created_ = 0;
  int64_t destroyed_ = 0;
  int64_t recorded_ = 0;
  int64_t references_ = 0;
  int64_t misuse_ = 0;
};

}  // namespace flare::timing::testing
