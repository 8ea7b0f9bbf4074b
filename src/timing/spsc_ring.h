// A bounded single-producer single-consumer ring of fixed-size records: the queue between one
// launching thread and the poller (see tracer.cc for the layout of the whole pipeline).
//
//   slots_: capacity = 2^n records, allocated once at construction, never resized
//   ┌────┬────┬────┬────┬────┬────┬────┬────┐
//   │    │ r0 │ r1 │ r2 │    │    │    │    │   index = counter & mask_
//   └────┴────┴────┴────┴────┴────┴────┴────┘
//          ▲ head_ (consumer)  ▲ tail_ (producer)
//
// head_ and tail_ are 64-bit counters that only grow (they never wrap in practice), so
// tail_ - head_ is the fill level and "full" needs no spare slot. They sit on separate cache
// lines; the producer keeps a private copy of head_ and re-reads the shared one only when the
// ring looks full, so a push touches no line the consumer writes in the common case.
//
// Trade-offs: fixed capacity (a burst beyond it is dropped and counted by the caller, never
// waited for) in exchange for no allocation, no lock and two atomic operations per push.
//
// Threading: tryPush() from one producer thread at a time, drain() from one consumer thread at
// a time. Nothing throws except the constructor (allocation).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace flare::timing {

template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>, "records are copied with plain stores");

 public:
  // Capacity is `min_capacity` rounded up to a power of two (at least 2).
  explicit SpscRing(size_t min_capacity) {
    size_t capacity = 2;
    while (capacity < min_capacity) capacity <<= 1;
    slots_ = std::make_unique<T[]>(capacity);
    mask_ = capacity - 1;
  }
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  size_t capacity() const noexcept { return mask_ + 1; }

  // Producer. Copies `record` in; false when the ring is full (nothing is written).
  bool tryPush(const T& record) noexcept {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - cached_head_ > mask_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (tail - cached_head_ > mask_) return false;
    }
    slots_[tail & mask_] = record;
    tail_.store(tail + 1, std::memory_order_release);
    // The consumer read the next slot last: fetch it for writing now, so that the next push
    // does not wait for the cache line (a hint only; harmless when the ring is full).
    __builtin_prefetch(&slots_[(tail + 1) & mask_], 1);
    return true;
  }

  // Consumer. Calls fn(const T&) for every record pushed so far, oldest first, then frees
  // their slots. Returns how many it consumed. If fn throws, the records up to and including
  // the one it threw on are consumed (never delivered twice) and the exception propagates.
  template <typename Fn>
  size_t drain(Fn&& fn) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    uint64_t next = head;
    struct Release {
      std::atomic<uint64_t>& head;
      const uint64_t& next;
      ~Release() { head.store(next, std::memory_order_release); }
    } release{head_, next};
    while (next != tail) {
      const T& record = slots_[next & mask_];
      ++next;
      fn(record);  // the slot stays the consumer's until `release` publishes `next`
    }
    return static_cast<size_t>(tail - head);
  }

  // Records pushed and not yet drained (exact on either side's thread, a snapshot elsewhere).
  size_t size() const noexcept {
    return static_cast<size_t>(tail_.load(std::memory_order_acquire) -
                               head_.load(std::memory_order_acquire));
  }

 private:
  static constexpr size_t kCacheLine = 64;

  std::unique_ptr<T[]> slots_;
  size_t mask_ = 0;
  alignas(kCacheLine) std::atomic<uint64_t> tail_{0};  // written by the producer
  uint64_t cached_head_ = 0;                           // producer's copy of head_
  alignas(kCacheLine) std::atomic<uint64_t> head_{0};  // written by the consumer
  // (alignas rounds sizeof up to whole lines: nothing after the ring shares head_'s line.)
};

}  // namespace flare::timing
