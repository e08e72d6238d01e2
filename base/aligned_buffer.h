// AlignedBuffer: an owning, 64-byte aligned, zero-initialised float array (host memory).
// Not copyable (a resource owner); movable. Not thread-safe beyond what float* access is.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

namespace tf {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t n) : size_(n) {
    if (n > 0) {
      const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      std::memset(data_, 0, bytes);
    }
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  std::span<float> span() { return {data_, static_cast<size_t>(size_)}; }
  std::span<const float> span() const { return {data_, static_cast<size_t>(size_)}; }
  void Zero() {
    if (size_ > 0) std::memset(data_, 0, static_cast<size_t>(size_) * sizeof(float));
  }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace tf
