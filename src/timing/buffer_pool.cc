#include "src/timing/buffer_pool.h"

#include <algorithm>

namespace flare::timing {

BufferPool::BufferPool(size_t count, size_t buffer_bytes)
    : count_(std::max<size_t>(count, 1)),
      buffer_bytes_((std::max<size_t>(buffer_bytes, 1) + kAlignment - 1) / kAlignment * kAlignment),
      storage_(new uint64_t[count_ * buffer_bytes_ / sizeof(uint64_t)]()),
      out_(count_, false) {
  free_.reserve(count_);
  for (size_t i = count_; i-- > 0;) free_.push_back(static_cast<uint32_t>(i));
}

uint8_t* BufferPool::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    ++exhausted_;
    return nullptr;
  }
  const uint32_t i = free_.back();
  free_.pop_back();
  out_[i] = true;
  ++acquired_;
  return reinterpret_cast<uint8_t*>(storage_.get()) + size_t{i} * buffer_bytes_;
}

bool BufferPool::release(uint8_t* buffer) {
  auto* base = reinterpret_cast<uint8_t*>(storage_.get());
  std::lock_guard<std::mutex> lock(mu_);
  if (buffer < base || buffer >= base + count_ * buffer_bytes_ ||
      static_cast<size_t>(buffer - base) % buffer_bytes_ != 0) {
    ++bad_releases_;
    return false;
  }
  const size_t i = static_cast<size_t>(buffer - base) / buffer_bytes_;
  if (!out_[i]) {
    ++bad_releases_;
    return false;
  }
  out_[i] = false;
  free_.push_back(static_cast<uint32_t>(i));
  return true;
}

size_t BufferPool::inUse() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_ - free_.size();
}
uint64_t BufferPool::exhausted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exhausted_;
}
uint64_t BufferPool::acquired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return acquired_;
}
uint64_t BufferPool::badReleases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bad_releases_;
}

}  // namespace flare::timing
