// BufferPool: a fixed set of equally sized, aligned byte buffers handed out and taken back, for
// the CUPTI Activity API's buffer callbacks (src/hook/deep_trace.h). The pool never grows: when
// every buffer is out, acquire() returns nullptr and counts an exhaustion (CUPTI then drops
// records and counts them too). Buffers are recycled: a released buffer is handed out again.
//
//   [buf 0][buf 1] ... [buf N-1]    one allocation of N × buffer_bytes, aligned to kAlignment
//     free list (LIFO) ──acquire──▶ CUPTI fills it ──bufferCompleted──▶ parsed ──release──▶ free
//
// Threading: acquire() and release() are called on CUPTI's threads and the flushing thread; a
// mutex guards the free list (cold path: one call per buffer of thousands of records).
// Ownership: the pool owns the memory; it must outlive every buffer it handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace flare::timing {

class BufferPool {
 public:
  static constexpr size_t kAlignment = 8;  // CUPTI requires 8-byte aligned activity buffers

  // `count` buffers of `buffer_bytes` (rounded up to kAlignment); both at least 1.
  BufferPool(size_t count, size_t buffer_bytes);
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A free buffer of bufferBytes(), or nullptr when all are out (counted in exhausted()).
  uint8_t* acquire();
  // Gives a buffer back. Returns false (and changes nothing) for a pointer that is not a buffer
  // of this pool or that is already free (counted in bad_releases()).
  bool release(uint8_t* buffer);

  size_t bufferBytes() const { return buffer_bytes_; }
  size_t count() const { return count_; }
  size_t inUse() const;
  uint64_t exhausted() const;
  uint64_t acquired() const;
  uint64_t badReleases() const;

 private:
  const size_t count_;
  const size_t buffer_bytes_;
  std::unique_ptr<uint64_t[]> storage_;  // uint64_t: 8-byte alignment
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;  // guarded by mu_: indices of free buffers
  std::vector<bool> out_;       // guarded by mu_: buffer i is handed out
  uint64_t exhausted_ = 0;      // guarded by mu_
  uint64_t acquired_ = 0;       // guarded by mu_
  uint64_t bad_releases_ = 0;   // guarded by mu_
};

}  // namespace flare::timing
